//! The runner package behind `[runner] version`: resolving a version to an unpacked
//! actions/runner package in the cache, downloading it first when it is not there. The release
//! metadata comes from `{github.api_url}/repos/actions/runner/releases/tags/v{version}`; the
//! asset for this host is downloaded while its SHA-256 is computed, checked against the
//! published one ([`release`]), unpacked safely ([`unpack`]) and moved into the cache in one
//! step ([`cache`]). A package that cannot be verified is never run.

pub mod cache;
pub mod current;
pub(crate) mod fetch;
pub mod latest;
pub mod progress;
pub mod release;
pub mod report;
pub(crate) mod unpack;
pub(crate) mod version;
pub mod window;

use std::path::{Path, PathBuf};

use crate::WorkspaceError;
use crate::process::LISTENER;
use crate::workspace::check_package;
use cache::{Cache, Cached};
use fetch::{FetchError, Http};
use progress::Progress;
use release::{Chosen, Platform, Release, SelectError};

/// The largest package downloaded (actions/runner's are about 200 MiB).
pub(crate) const MAX_PACKAGE_BYTES: u64 = 500 * 1024 * 1024;

/// Which package, and where to look for it.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// `github.api_url`.
    pub api_url: String,
    pub data_dir: PathBuf,
    /// `2.330.0` (validated with the configuration: digits and dots).
    pub version: String,
    pub platform: Platform,
}

impl Wanted {
    /// `actions-runner-linux-x64-2.330.0`.
    pub fn name(&self) -> String {
        release::package_name(self.platform, &self.version)
    }

    /// The release's metadata endpoint.
    pub(crate) fn metadata_url(&self) -> String {
        format!(
            "{}/repos/{}/releases/tags/v{}",
            self.api_url.trim_end_matches('/'),
            release::RUNNER_REPOSITORY,
            self.version
        )
    }
}

/// Why the package cannot be had. [`PackageError::is_configuration`] tells the ones the
/// configuration must change for.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(
        "this host ({}/{}) has no actions/runner package",
        std::env::consts::OS,
        std::env::consts::ARCH
    )]
    Platform,
    #[error("there is no actions/runner release v{version}: {source}")]
    VersionNotFound { version: String, source: FetchError },
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error("cannot read the actions/runner release v{version}: {source}")]
    Metadata { version: String, source: FetchError },
    #[error("cannot download {name}: {source}")]
    Download { name: String, source: FetchError },
    #[error(
        "the download of {name} does not match its published SHA-256 (expected {expected} from {published_in}, got {actual}); it was discarded and nothing was cached"
    )]
    ChecksumMismatch {
        name: String,
        expected: String,
        actual: String,
        published_in: &'static str,
    },
    #[error("the download of {name} is {actual} bytes, not the {expected} the release lists")]
    SizeMismatch {
        name: String,
        expected: u64,
        actual: u64,
    },
    #[error("cannot unpack {name}: {source}")]
    Unpack {
        name: String,
        source: unpack::UnpackError,
    },
    #[error(transparent)]
    Package(#[from] WorkspaceError),
    #[error("the package {name} has no {LISTENER}")]
    NoListener { name: String },
    #[error("cannot use the runner package cache {}: {source}", .path.display())]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PackageError {
    /// Whether the remedy is to change `runner.version` (or use `runner.package_dir`), rather
    /// than to retry: the version does not exist, or has nothing verifiable for this host.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            PackageError::Platform | PackageError::VersionNotFound { .. } | PackageError::Select(_)
        )
    }
}

/// What the cache and GitHub say about a wanted package, for `rm-agent check`.
#[derive(Debug)]
pub enum Inspection {
    Cached(Cached),
    /// Not cached; `rm-agent run` downloads this asset and checks this checksum.
    WouldDownload(Chosen),
}

/// The package's directory: from the cache, or downloaded, verified, unpacked and cached.
/// The caller holds the data directory's lock.
pub async fn resolve(
    wanted: &Wanted,
    progress: &mut dyn Progress,
) -> Result<PathBuf, PackageError> {
    let cache = Cache::new(&wanted.data_dir);
    let name = wanted.name();
    if let Some(cached) = cache.complete(&name) {
        tracing::info!(package = %cached.dir.display(), "runner package found in the cache");
        return Ok(cached.dir);
    }
    let cache_error = |source| PackageError::Cache {
        path: cache.root().to_path_buf(),
        source,
    };
    cache.prepare(&name).map_err(cache_error)?;
    let http = Http::new().map_err(|source| PackageError::Metadata {
        version: wanted.version.clone(),
        source,
    })?;
    let chosen = choose(&http, wanted).await?;
    tracing::info!(
        asset = %chosen.asset.name,
        bytes = chosen.asset.size,
        checksum_from = chosen.source.describe(),
        "runner package not cached; downloading it"
    );
    let result = fetch_and_commit(&http, &cache, &name, &chosen, progress).await;
    if result.is_err() {
        cache.discard(&name);
    }
    result
}

/// For `rm-agent check`: the package in the cache, or what would be downloaded. Writes nothing.
pub async fn inspect(wanted: &Wanted) -> Result<Inspection, PackageError> {
    if let Some(cached) = Cache::new(&wanted.data_dir).complete(&wanted.name()) {
        return Ok(Inspection::Cached(cached));
    }
    let http = Http::new().map_err(|source| PackageError::Metadata {
        version: wanted.version.clone(),
        source,
    })?;
    Ok(Inspection::WouldDownload(choose(&http, wanted).await?))
}

/// The release's metadata, and this host's asset in it with its checksum.
async fn choose(http: &Http, wanted: &Wanted) -> Result<Chosen, PackageError> {
    let release: Release = http
        .get_json(&wanted.metadata_url())
        .await
        .map_err(|source| match source {
            FetchError::NotFound { .. } => PackageError::VersionNotFound {
                version: wanted.version.clone(),
                source,
            },
            source => PackageError::Metadata {
                version: wanted.version.clone(),
                source,
            },
        })?;
    Ok(release::select(&release, wanted.platform, &wanted.version)?)
}

async fn fetch_and_commit(
    http: &Http,
    cache: &Cache,
    name: &str,
    chosen: &Chosen,
    progress: &mut dyn Progress,
) -> Result<PathBuf, PackageError> {
    let cache_error = |source| PackageError::Cache {
        path: cache.root().to_path_buf(),
        source,
    };
    let partial = cache.partial_file(name);
    let mut file = tokio::fs::File::create(&partial)
        .await
        .map_err(cache_error)?;
    let downloaded = http
        .download(
            &chosen.asset.browser_download_url,
            Some(chosen.asset.size),
            MAX_PACKAGE_BYTES,
            &mut file,
            progress,
        )
        .await
        .map_err(|source| PackageError::Download {
            name: chosen.asset.name.clone(),
            source,
        })?;
    drop(file);
    if downloaded.sha256 != chosen.sha256 {
        return Err(PackageError::ChecksumMismatch {
            name: chosen.asset.name.clone(),
            expected: chosen.sha256.clone(),
            actual: downloaded.sha256,
            published_in: chosen.source.describe(),
        });
    }
    // Checked after the checksum: a wrong size with the right checksum would mean the
    // release's listing is off, worth saying as such.
    if downloaded.bytes != chosen.asset.size {
        return Err(PackageError::SizeMismatch {
            name: chosen.asset.name.clone(),
            expected: chosen.asset.size,
            actual: downloaded.bytes,
        });
    }
    tracing::info!(asset = %chosen.asset.name, sha256 = %chosen.sha256, "runner package verified; unpacking");
    let (cache_owned, name_owned, sha) = (cache.clone(), name.to_owned(), chosen.sha256.clone());
    let dir =
        tokio::task::spawn_blocking(move || unpack_and_commit(&cache_owned, &name_owned, &sha))
            .await
            .map_err(|e| PackageError::Cache {
                path: cache.root().to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            })??;
    tracing::info!(package = %dir.display(), "runner package cached");
    Ok(dir)
}

/// Unpacks the verified archive of `name`, checks the result and moves it into the cache.
/// Blocking: thousands of files.
fn unpack_and_commit(cache: &Cache, name: &str, sha256: &str) -> Result<PathBuf, PackageError> {
    let into = cache.unpack_dir(name);
    let cache_error = |source| PackageError::Cache {
        path: cache.root().to_path_buf(),
        source,
    };
    std::fs::create_dir(&into).map_err(cache_error)?;
    unpack::unpack(&cache.partial_file(name), &into).map_err(|source| PackageError::Unpack {
        name: name.to_owned(),
        source,
    })?;
    check_unpacked(&into, name)?;
    cache.commit(name, sha256).map_err(cache_error)
}

/// What `runner.package_dir` must satisfy holds for a downloaded package too: no top-level
/// `_work` (CONTRACT §5) and a runner to start.
fn check_unpacked(dir: &Path, name: &str) -> Result<(), PackageError> {
    check_package(dir)?;
    if !std::fs::metadata(dir.join(LISTENER)).is_ok_and(|m| m.is_file()) {
        return Err(PackageError::NoListener {
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
