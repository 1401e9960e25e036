//! rm-cache: the host-local cache service `rm-agent run` starts for runners whose policy has
//! `cache = true`. It serves `actions/cache` (the `@actions/cache` npm client) on the runner's
//! host: cache service v2 (Twirp JSON at `/twirp/github.actions.results.api.v1.CacheService/`,
//! with the Azure-Blob-style upload and ranged download of the signed URLs it hands out) and v1
//! (REST under `/_apis/artifactcache/`), and passes every other results-service call (artifacts,
//! ...) through to GitHub unchanged.
//!
//! Who a caller is comes from where its connection comes from, never from what it sends: the
//! agent's [`Callers`] maps a runner's address to its job, attempt and [`scope::Scope`] (from
//! GitHub's facts about the run, [`scope::scope_of`]); the bearer token a job sends is the job's
//! to forge and is ignored (only forwarded, untouched, on proxied calls).
//!
//! Modules: [`scope`] (who reads and writes what, pure), `evict` (which entries go, pure),
//! `store` (disk layout, index, crash recovery, counters), `server` (HTTP: routing, Twirp, v1,
//! blobs, signed URLs), `proxy` (the upstream pass-through), [`actions`] (action archives).

pub mod actions;
mod evict;
mod proxy;
pub mod scope;
mod server;
mod store;

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use evict::EVICTION_INTERVAL;
pub use server::{
    BODY_IDLE_TIMEOUT, DOWNLOAD_URL_TTL, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_ENTRY_SIZE,
    MAX_UPLOADS_PER_ATTEMPT, RESERVATION_TTL, UPLOAD_URL_TTL,
};
pub use store::{JOB_COUNTERS_KEEP, disk_report, job_counters};

/// How the service is configured (`[cache]` in the agent's configuration).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where blobs, the index and staged uploads live (module doc of the store).
    pub dir: PathBuf,
    /// Entries are evicted, least recently used first, until their total is at most this.
    pub max_size: u64,
    /// Entries not used (saved or restored) for this long are evicted.
    pub max_age: Duration,
    /// At most this many bytes of entries per repository; its least recently used go first.
    pub repo_quota: Option<u64>,
    /// Results-service calls not served here go to this base URL, e.g.
    /// `https://results-receiver.actions.githubusercontent.com/`; `None` answers them 404.
    pub upstream: Option<http::Uri>,
    /// The base URL runners reach this service at, e.g. `http://127.0.0.1:8736/`: signed URLs
    /// are built on it.
    pub public_base: String,
}

/// Who made a request: the runner's job and attempt, and where it may read and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The job's id (counters are kept per job).
    pub job: i64,
    /// The runner attempt: signed URLs and uploads are bound to it.
    pub attempt: String,
    /// Where the job may read and write.
    pub scope: scope::Scope,
    /// The base URL this caller reaches the service at (e.g. the host end of its runner's
    /// network, which its containers reach too), for the signed URLs handed to it; `None`:
    /// [`Settings::public_base`].
    pub base: Option<String>,
}

/// Why a request is refused before anything is read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The connection does not come from a live runner.
    #[error("not a runner of this host")]
    NotARunner,
    /// A runner whose scope is not known (the run's facts could not be read); says why.
    #[error("no cache scope for this runner: {0}")]
    Unscoped(String),
}

/// Attributes a connection's peer address to a [`Caller`] (the agent implements it from its
/// runners' addresses and the journal).
pub trait Callers: Send + Sync + 'static {
    /// The caller at `peer` (IPv4-mapped addresses come canonical, as IPv4).
    fn identify(
        &self,
        peer: IpAddr,
    ) -> Pin<Box<dyn Future<Output = Result<Caller, Refusal>> + Send + '_>>;
}

/// Cache use: lookups that found an entry, lookups that did not, and bytes saved and restored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// The service's totals, for `status` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Since the cache directory was created.
    pub counters: Counters,
    /// Entries visible now.
    pub entries: u64,
    /// Their bytes (entries with equal bytes share a blob, so the disk may hold less).
    pub bytes_stored: u64,
}

/// What is on disk ([`disk_report`]): after a crash and a reopen, `staged_files` and
/// `orphaned_blobs` are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskReport {
    /// Rows in the index.
    pub entries: u64,
    /// Files in `blobs/`.
    pub blob_files: u64,
    /// Files in `blobs/` no row names.
    pub orphaned_blobs: u64,
    /// Files under `uploads/`.
    pub staged_files: u64,
}

/// What can go wrong opening or running the cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cache index: {0}")]
    Index(#[from] rusqlite::Error),
    #[error("upload {0} is not reserved")]
    NoUpload(i64),
    #[error("loading the root certificates for the upstream: {0}")]
    Tls(#[source] std::io::Error),
}

/// The cache service: open it (recovering from any crash), then serve.
#[derive(Clone)]
pub struct Service {
    inner: Arc<server::Inner>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("dir", &self.inner.settings.dir)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Opens the cache at `settings.dir` (created if absent) and recovers it: staged uploads and
    /// blobs without an entry are removed, so a crash leaves no visible half entry and no
    /// orphaned bytes. Blocking (disk and SQLite).
    pub fn open(settings: Settings) -> Result<Service, CacheError> {
        Ok(Service {
            inner: Arc::new(server::Inner::open(settings)?),
        })
    }

    /// Serves HTTP on `listener` until `shutdown` completes, attributing every request with
    /// `callers`, and evicts every [`EVICTION_INTERVAL`]. Then stops accepting and waits a
    /// bounded time for requests in flight.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        callers: Arc<dyn Callers>,
        shutdown: impl Future<Output = ()>,
    ) {
        server::serve(Arc::clone(&self.inner), listener, callers, shutdown).await;
    }

    /// Counters since the directory was created, entries and bytes stored. Blocking (SQLite).
    pub fn totals(&self) -> Result<Totals, CacheError> {
        self.inner.store.totals()
    }

    /// Evicts now by the settings' bounds; returns how many entries went. Blocking.
    pub fn evict(&self) -> Result<usize, CacheError> {
        self.inner.evict()
    }
}

#[cfg(test)]
mod tests;

/// A unit test that cannot run here fails unless `RM_TEST_ALLOW_SKIP` names what it lacks.
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
mod test_skip;

/// npm packages for the test that runs the real `@actions/cache` client.
#[cfg(test)]
#[path = "../../tests/support/npm.rs"]
mod test_npm;
