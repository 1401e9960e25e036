//! The cache's HTTP face: the accept loop, attribution of every request to a [`Caller`], and
//! the three protocols `@actions/cache` speaks, checked against its 6.3.0 release and the Azure
//! Blob SDK (12.31) it uploads with:
//!
//! - Cache v2, Twirp JSON: `POST /twirp/github.actions.results.api.v1.CacheService/<Method>` for
//!   `CreateCacheEntry`, `FinalizeCacheEntryUpload` and `GetCacheEntryDownloadURL` (the only
//!   methods that client calls). Requests use the proto field names (`restore_keys`,
//!   `size_bytes` as an int64 string); answers too (`signed_upload_url`, `entry_id`, ...). Errors
//!   are Twirp errors, `{"code", "msg"}`: a second `CreateCacheEntry` for a key and version
//!   already in the caller's write scope is `409 already_exists`, which the client reports as
//!   "another job may be creating this cache". Other methods of the cache service are answered
//!   `404 bad_route` here, never forwarded: cache traffic does not leave the host.
//! - Signed URLs, `<public_base>blob/<token>`: the token is 32 random bytes bound here to the
//!   caller's attempt and to one upload or entry, and a URL presented by another attempt is
//!   refused (403). An upload URL takes Azure's Put Blob (`PUT`, the whole body), Put Block
//!   (`PUT ?comp=block&blockid=`) and Put Block List (`PUT ?comp=blocklist`, XML), each answered
//!   201 with the headers the SDK reads. A download URL answers `GET` and `HEAD`, with one byte
//!   range (`Range` or `x-ms-range`) answered 206.
//! - Cache v1, REST under `/_apis/artifactcache/`: `GET cache?keys=&version=` (204 on a miss, 200
//!   with `archiveLocation`, a signed URL), `GET caches?key=` (the listing the client prints in
//!   debug), `POST caches` (reserve, `{cacheId}`, 409 when it exists), `PATCH caches/{id}` with
//!   `Content-Range: bytes a-b/*` chunks in any order, `POST caches/{id}` (`{size}`: commit once
//!   the chunks cover exactly `0..size`).
//!
//! Anything else goes upstream unchanged ([`crate::proxy`]) or, without an upstream, is 404.
//! Bodies stream to disk as they arrive; nothing is buffered whole but the small JSON and XML
//! bodies, each under a bound.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Empty, Full, Limited};
use hyper::body::{Frame, Incoming};
use serde::{Deserialize, Deserializer};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::evict::{Bounds, EVICTION_INTERVAL};
use crate::proxy::Upstream;
use crate::store::{self, Begin, Slot, Store};
use crate::{CacheError, Caller, Callers, Counters, Settings};

/// The largest entry: GitHub's own limit per entry (the client refuses more in v1).
pub const MAX_ENTRY_SIZE: u64 = 10 * 1024 * 1024 * 1024;

/// Uploads reserved and not finalized at once by one attempt; more are refused (429) until one
/// finalizes or goes stale. A job saves a handful of caches; this bounds what one can stage.
pub const MAX_UPLOADS_PER_ATTEMPT: usize = 16;

/// A reservation older than this, not finalized, is given up: another job may take its key.
pub const RESERVATION_TTL: Duration = Duration::from_secs(2 * 3600);

/// A signed upload URL works this long (as long as its reservation).
pub const UPLOAD_URL_TTL: Duration = RESERVATION_TTL;

/// A signed download URL works this long after the lookup that issued it.
pub const DOWNLOAD_URL_TTL: Duration = Duration::from_secs(3600);

/// A client that has not sent its request headers by then is cut off.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// An upload body that sends nothing for this long is abandoned (the request fails).
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Connections served at once (the runners of one host, each with a few parallel transfers).
pub const MAX_CONNECTIONS: usize = 1024;

/// How long a shutdown waits for requests in flight: within the 5 s `rm-agent run` gives its
/// tasks after the drain (a longer wait would be cut short there and named as hung).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(4);

/// The largest Twirp or v1 JSON request body.
const MAX_JSON_BODY: usize = 64 * 1024;

/// The largest Put Block List body: Azure's 50,000 block ids of up to 64 bytes, base64, in XML.
const MAX_BLOCK_LIST_BODY: usize = 8 * 1024 * 1024;

/// Blocks staged per upload at most (Azure's own limit).
const MAX_BLOCKS: usize = 50_000;

/// A block id's length at most, decoded from the query (Azure: 64 bytes before base64).
const MAX_BLOCK_ID: usize = 100;

/// Keys longer than this are refused (the client's own limit).
const MAX_KEY: usize = 512;

/// The chunk size of download bodies.
const DOWNLOAD_CHUNK: usize = 256 * 1024;

/// The Twirp path prefix of the cache service.
const TWIRP_CACHE: &str = "/twirp/github.actions.results.api.v1.CacheService/";

/// The v1 REST prefix.
const V1_PREFIX: &str = "/_apis/artifactcache/";

/// The signed URL path prefix.
const BLOB_PREFIX: &str = "/blob/";

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A refused or failed request: its status and a short reason, rendered as a Twirp error
/// (`code`, `msg`) that also carries the v1 client's `message`.
#[derive(Debug)]
pub(crate) struct Fail {
    status: StatusCode,
    code: &'static str,
    msg: String,
}

impl Fail {
    pub(crate) fn new(status: StatusCode, code: &'static str, msg: impl Into<String>) -> Fail {
        Fail {
            status,
            code,
            msg: msg.into(),
        }
    }

    fn internal(err: &dyn std::fmt::Display) -> Fail {
        tracing::error!(error = %err, "cache request failed");
        Fail::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    }

    fn into_response(self) -> Response<BoxBody> {
        json_response(
            self.status,
            &json!({"code": self.code, "msg": self.msg, "message": self.msg}),
        )
    }
}

impl From<CacheError> for Fail {
    fn from(err: CacheError) -> Fail {
        Fail::internal(&err)
    }
}

fn full(bytes: impl Into<Bytes>) -> BoxBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn empty() -> BoxBody {
    Empty::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<BoxBody> {
    let mut answer = Response::new(full(value.to_string()));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    answer
}

fn status_only(status: StatusCode) -> Response<BoxBody> {
    let mut answer = Response::new(empty());
    *answer.status_mut() = status;
    answer
}

/// An upload staged on disk, as far as it got (the store's row says what it reserves).
#[derive(Debug)]
struct Staging {
    /// The attempt that reserved it.
    attempt: String,
    /// When it was reserved.
    reserved: Instant,
    /// Bytes received so far (blocks and chunks), against [`MAX_ENTRY_SIZE`].
    received: u64,
    /// Blocks staged.
    blocks: usize,
    /// The complete bytes in `uploads/<id>/data`: their digest and size.
    complete: Option<(String, u64)>,
    /// v1: the byte ranges written, `[start, end)`.
    ranges: Vec<(u64, u64)>,
}

/// What a signed URL gives access to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Upload(i64),
    Download(i64),
}

#[derive(Debug, Clone)]
struct Grant {
    attempt: String,
    target: Target,
    expires: Instant,
}

/// The service's state shared by every connection.
pub(crate) struct Inner {
    pub(crate) settings: Settings,
    pub(crate) store: Store,
    upstream: Option<Upstream>,
    grants: Mutex<HashMap<String, Grant>>,
    staging: Mutex<HashMap<i64, Staging>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// 32 random bytes, hex: a signed URL's token.
fn random_token() -> Result<String, Fail> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|err| Fail::internal(&err))?;
    Ok(hex::encode(bytes))
}

impl Inner {
    pub(crate) fn open(settings: Settings) -> Result<Inner, CacheError> {
        let store = Store::open(&settings.dir)?;
        let upstream = settings.upstream.clone().map(Upstream::new).transpose()?;
        Ok(Inner {
            settings,
            store,
            upstream,
            grants: Mutex::new(HashMap::new()),
            staging: Mutex::new(HashMap::new()),
        })
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            max_size: self.settings.max_size,
            max_age: self.settings.max_age,
            repo_quota: self.settings.repo_quota,
        }
    }

    pub(crate) fn evict(&self) -> Result<usize, CacheError> {
        self.store.evict(self.bounds(), store::now_ms())
    }

    /// A new signed URL for `target`, bound to `caller`'s attempt, on the base it reaches the
    /// service at.
    fn sign(&self, caller: &Caller, target: Target, ttl: Duration) -> Result<String, Fail> {
        let attempt = caller.attempt.as_str();
        let token = random_token()?;
        let now = Instant::now();
        let mut grants = lock(&self.grants);
        grants.retain(|_, grant| grant.expires > now);
        grants.insert(
            token.clone(),
            Grant {
                attempt: attempt.to_owned(),
                target,
                expires: now + ttl,
            },
        );
        let base = caller.base.as_ref().unwrap_or(&self.settings.public_base);
        let slash = if base.ends_with('/') { "" } else { "/" };
        Ok(format!("{base}{slash}blob/{token}"))
    }

    /// The target of `token` for `caller`: 404 when unknown or expired, 403 for another attempt.
    fn redeem(&self, token: &str, caller: &Caller) -> Result<Target, Fail> {
        let grants = lock(&self.grants);
        let grant = grants
            .get(token)
            .filter(|g| g.expires > Instant::now())
            .ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, "not_found", "no such blob"))?;
        if grant.attempt != caller.attempt {
            return Err(Fail::new(
                StatusCode::FORBIDDEN,
                "permission_denied",
                "this URL was issued to another runner",
            ));
        }
        Ok(grant.target)
    }

    fn revoke(&self, target: Target) {
        lock(&self.grants).retain(|_, grant| grant.target != target);
    }

    /// Adds to the counters; a failure to count is logged, never fails the request.
    async fn count(self: &Arc<Self>, job: i64, delta: Counters) {
        let inner = Arc::clone(self);
        let counted =
            tokio::task::spawn_blocking(move || inner.store.count(job, delta, store::now_ms()))
                .await;
        match counted {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(error = %err, "could not count cache use"),
            Err(err) => tracing::warn!(error = %err, "could not count cache use"),
        }
    }
}

/// Runs a blocking store call off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CacheError> + Send + 'static,
) -> Result<T, Fail> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(Fail::from),
        Err(err) => Err(Fail::internal(&err)),
    }
}

/// Serves `listener` (see [`crate::Service::serve`]) through the accept loop the workspace's
/// servers share (`rm_http_serve`: bounded connections, per peer too, header timeout, graceful
/// drain), with eviction every [`EVICTION_INTERVAL`] beside it.
pub(crate) async fn serve(
    inner: Arc<Inner>,
    listener: TcpListener,
    callers: Arc<dyn Callers>,
    shutdown: impl Future<Output = ()>,
) {
    let evicting = {
        let inner = Arc::clone(&inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVICTION_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let inner = Arc::clone(&inner);
                let evicted = tokio::task::spawn_blocking(move || inner.evict()).await;
                if let Ok(Err(err)) = evicted {
                    tracing::warn!(error = %err, "cache eviction failed");
                }
            }
        })
    };
    let limits = rm_http_serve::Limits {
        max_connections: MAX_CONNECTIONS,
        header_read_timeout: HEADER_READ_TIMEOUT,
        drain_timeout: DRAIN_TIMEOUT,
    };
    let answer = move |req: Request<Incoming>| {
        let inner = Arc::clone(&inner);
        let callers = Arc::clone(&callers);
        async move {
            match req.extensions().get::<rm_http_serve::Peer>().copied() {
                Some(rm_http_serve::Peer(peer)) => handle(inner, callers.as_ref(), peer, req).await,
                // The shared loop always says; without it nobody is known.
                None => Fail::new(
                    StatusCode::FORBIDDEN,
                    "permission_denied",
                    "the connection's address is not known",
                )
                .into_response(),
            }
        }
    };
    rm_http_serve::serve(listener, limits, answer, shutdown, || {}).await;
    evicting.abort();
}

async fn handle(
    inner: Arc<Inner>,
    callers: &dyn Callers,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<BoxBody> {
    let caller = match callers.identify(peer.ip().to_canonical()).await {
        Ok(caller) => caller,
        Err(refusal) => {
            return Fail::new(
                StatusCode::FORBIDDEN,
                "permission_denied",
                refusal.to_string(),
            )
            .into_response();
        }
    };
    let path = req.uri().path().to_owned();
    let answer = if let Some(method) = path.strip_prefix(TWIRP_CACHE) {
        let method = method.to_owned();
        twirp(&inner, &caller, &method, req).await
    } else if let Some(token) = path.strip_prefix(BLOB_PREFIX) {
        let token = token.to_owned();
        blob(&inner, &caller, &token, req).await
    } else if let Some(rest) = path.strip_prefix(V1_PREFIX) {
        let rest = rest.to_owned();
        v1(&inner, &caller, &rest, req).await
    } else if let Some(upstream) = &inner.upstream {
        upstream.forward(req).await
    } else {
        Err(Fail::new(
            StatusCode::NOT_FOUND,
            "bad_route",
            "not served here",
        ))
    };
    answer.unwrap_or_else(Fail::into_response)
}

/// Reads a small body whole, under `limit`.
async fn small_body(body: Incoming, limit: usize) -> Result<Bytes, Fail> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(_) => Err(Fail::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_argument",
            "request body too large or broken",
        )),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Fail> {
    serde_json::from_slice(bytes).map_err(|err| {
        Fail::new(
            StatusCode::BAD_REQUEST,
            "malformed",
            format!("malformed request: {err}"),
        )
    })
}

/// An int64 as protobuf's JSON mapping writes it: a string, or a number.
fn int64<'de, D: Deserializer<'de>>(de: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Number(u64),
        Text(String),
    }
    match Int::deserialize(de)? {
        Int::Number(n) => Ok(n),
        Int::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

#[derive(Deserialize)]
struct CreateRequest {
    #[serde(default)]
    key: String,
    #[serde(default)]
    version: String,
}

#[derive(Deserialize)]
struct FinalizeRequest {
    #[serde(default)]
    key: String,
    #[serde(default)]
    version: String,
    #[serde(default, alias = "sizeBytes", deserialize_with = "int64")]
    size_bytes: u64,
}

#[derive(Deserialize)]
struct DownloadRequest {
    #[serde(default)]
    key: String,
    #[serde(default, alias = "restoreKeys")]
    restore_keys: Vec<String>,
    #[serde(default)]
    version: String,
}

fn check_key(key: &str, version: &str) -> Result<(), Fail> {
    if key.is_empty() || key.len() > MAX_KEY || key.contains(',') || version.is_empty() {
        return Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "a key (at most 512 characters, no comma) and a version are required",
        ));
    }
    Ok(())
}

fn write_slot<'a>(caller: &'a Caller, key: &'a str, version: &'a str) -> Slot<'a> {
    Slot {
        repository: &caller.scope.repository,
        scope: &caller.scope.write,
        key,
        version,
    }
}

async fn twirp(
    inner: &Arc<Inner>,
    caller: &Caller,
    method: &str,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Fail> {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if req.method() != Method::POST || !json {
        return Err(Fail::new(
            StatusCode::NOT_FOUND,
            "bad_route",
            "only JSON POSTs are served",
        ));
    }
    let body = small_body(req.into_body(), MAX_JSON_BODY).await?;
    match method {
        "CreateCacheEntry" => {
            let request: CreateRequest = parse_json(&body)?;
            let id = reserve(inner, caller, &request.key, &request.version).await?;
            let url = inner.sign(caller, Target::Upload(id), UPLOAD_URL_TTL)?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"ok": true, "signed_upload_url": url}),
            ))
        }
        "FinalizeCacheEntryUpload" => {
            let request: FinalizeRequest = parse_json(&body)?;
            check_key(&request.key, &request.version)?;
            let slot = write_slot(caller, &request.key, &request.version);
            let upload = inner
                .store
                .find_upload(slot)?
                .filter(|u| u.attempt == caller.attempt)
                .ok_or_else(|| {
                    Fail::new(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        "no upload of this key and version by this job",
                    )
                })?;
            let entry = commit(inner, caller, upload.id, Some(request.size_bytes)).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"ok": true, "entry_id": entry.to_string()}),
            ))
        }
        "GetCacheEntryDownloadURL" => {
            let request: DownloadRequest = parse_json(&body)?;
            check_key(&request.key, &request.version)?;
            match lookup(
                inner,
                caller,
                request.key,
                request.restore_keys,
                request.version,
            )
            .await?
            {
                Some((entry, url)) => Ok(json_response(
                    StatusCode::OK,
                    &json!({"ok": true, "signed_download_url": url, "matched_key": entry.key}),
                )),
                None => Ok(json_response(
                    StatusCode::OK,
                    &json!({"ok": false, "signed_download_url": "", "matched_key": ""}),
                )),
            }
        }
        _ => Err(Fail::new(
            StatusCode::NOT_FOUND,
            "bad_route",
            "no such cache method",
        )),
    }
}

/// Reserves `key`/`version` in the caller's write scope: the upload's id.
async fn reserve(
    inner: &Arc<Inner>,
    caller: &Caller,
    key: &str,
    version: &str,
) -> Result<i64, Fail> {
    check_key(key, version)?;
    {
        let mut staging = lock(&inner.staging);
        // A reservation past its TTL is given up (the store lets another take its slot).
        staging.retain(|_, s| s.reserved.elapsed() < RESERVATION_TTL);
        let mine = staging
            .values()
            .filter(|s| s.attempt == caller.attempt)
            .count();
        if mine >= MAX_UPLOADS_PER_ATTEMPT {
            return Err(Fail::new(
                StatusCode::TOO_MANY_REQUESTS,
                "resource_exhausted",
                "too many uploads in progress for this job",
            ));
        }
    }
    let now = store::now_ms();
    let ttl_ms = i64::try_from(RESERVATION_TTL.as_millis()).unwrap_or(i64::MAX);
    let begun = inner.store.begin_upload(
        write_slot(caller, key, version),
        &caller.attempt,
        caller.job,
        now,
        now.saturating_sub(ttl_ms),
    )?;
    match begun {
        Begin::Started(id) => {
            lock(&inner.staging).insert(
                id,
                Staging {
                    attempt: caller.attempt.clone(),
                    reserved: Instant::now(),
                    received: 0,
                    blocks: 0,
                    complete: None,
                    ranges: Vec::new(),
                },
            );
            Ok(id)
        }
        Begin::Exists => Err(Fail::new(
            StatusCode::CONFLICT,
            "already_exists",
            "cache entry with the same key, version, and scope already exists",
        )),
        Begin::Busy => Err(Fail::new(
            StatusCode::CONFLICT,
            "already_exists",
            "another job is uploading a cache entry with the same key, version, and scope",
        )),
    }
}

/// Finalizes upload `id` once its bytes are complete (and `size` matches, when given): the entry
/// becomes visible. Its id.
async fn commit(
    inner: &Arc<Inner>,
    caller: &Caller,
    id: i64,
    size: Option<u64>,
) -> Result<i64, Fail> {
    let complete = lock(&inner.staging)
        .get(&id)
        .and_then(|s| s.complete.clone());
    let Some((digest, actual)) = complete else {
        return Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "failed_precondition",
            "the upload is not complete",
        ));
    };
    if size.is_some_and(|size| size != actual) {
        return Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            format!(
                "size {} does not match the {actual} bytes uploaded",
                size.unwrap_or(0)
            ),
        ));
    }
    let staged = inner.store.upload_dir(id).join("data");
    let worker = Arc::clone(inner);
    let entry = blocking(move || {
        worker
            .store
            .finalize(id, &staged, &digest, actual, store::now_ms())
    })
    .await?;
    lock(&inner.staging).remove(&id);
    inner.revoke(Target::Upload(id));
    inner
        .count(
            caller.job,
            Counters {
                bytes_up: actual,
                ..Counters::default()
            },
        )
        .await;
    let worker = Arc::clone(inner);
    tokio::task::spawn_blocking(move || {
        if let Err(err) = worker.evict() {
            tracing::warn!(error = %err, "cache eviction failed");
        }
    });
    Ok(entry)
}

/// Looks `key` (then its prefixes and `restore_keys`) up in the caller's read scopes; counts a
/// hit or a miss. A hit comes with a signed download URL.
async fn lookup(
    inner: &Arc<Inner>,
    caller: &Caller,
    key: String,
    restore_keys: Vec<String>,
    version: String,
) -> Result<Option<(store::Entry, String)>, Fail> {
    let worker = Arc::clone(inner);
    let scope = caller.scope.clone();
    let found = blocking(move || {
        worker.store.lookup(
            &scope.repository,
            &scope.read,
            &key,
            &restore_keys,
            &version,
            store::now_ms(),
        )
    })
    .await?;
    let delta = Counters {
        hits: u64::from(found.is_some()),
        misses: u64::from(found.is_none()),
        ..Counters::default()
    };
    inner.count(caller.job, delta).await;
    match found {
        Some(entry) => {
            let url = inner.sign(caller, Target::Download(entry.id), DOWNLOAD_URL_TTL)?;
            Ok(Some((entry, url)))
        }
        None => Ok(None),
    }
}

/// A query's parameters, percent-decoded (`+` is a space, as forms write it).
fn query_params(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes `body` to `file` as it arrives, at most `budget` bytes (413 past it), updating
/// `hasher` when given. The bytes written.
async fn write_body(
    mut body: Incoming,
    file: &mut tokio::fs::File,
    mut hasher: Option<&mut Sha256>,
    budget: u64,
) -> Result<u64, Fail> {
    let mut written = 0u64;
    loop {
        let frame = match tokio::time::timeout(BODY_IDLE_TIMEOUT, body.frame()).await {
            Err(_) => {
                return Err(Fail::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "deadline_exceeded",
                    "the body stalled",
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(err))) => {
                return Err(Fail::new(
                    StatusCode::BAD_REQUEST,
                    "malformed",
                    format!("reading the body: {err}"),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        written += data.len() as u64;
        if written > budget {
            return Err(Fail::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "resource_exhausted",
                "the entry is larger than the cache accepts",
            ));
        }
        if let Some(hasher) = hasher.as_deref_mut() {
            hasher.update(&data);
        }
        file.write_all(&data)
            .await
            .map_err(|err| Fail::internal(&err))?;
    }
    file.flush().await.map_err(|err| Fail::internal(&err))?;
    Ok(written)
}

/// The headers Azure's Blob service sends on a write, which the SDK reads.
fn azure_created(digest_hint: &str) -> Result<Response<BoxBody>, Fail> {
    let mut answer = status_only(StatusCode::CREATED);
    let headers = answer.headers_mut();
    let etag = format!("\"0x{}\"", &digest_hint[..digest_hint.len().min(16)]);
    let request_id = random_token()?;
    for (name, value) in [
        ("etag", etag),
        ("x-ms-request-id", request_id),
        ("x-ms-version", "2026-02-06".to_owned()),
        ("x-ms-request-server-encrypted", "false".to_owned()),
        ("content-length", "0".to_owned()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    Ok(answer)
}

/// A block's staged file, from its decoded id.
fn block_path(dir: &std::path::Path, block_id: &str) -> PathBuf {
    dir.join("blocks").join(hex::encode(block_id.as_bytes()))
}

/// The block ids of a Put Block List body, in order: the text of every `<Latest>`,
/// `<Uncommitted>` and `<Committed>` element (the SDK sends `<Latest>`). Nothing else of the
/// XML is read.
fn block_list(xml: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        rest = &rest[open + 1..];
        let Some(close) = rest.find('>') else { break };
        let tag = &rest[..close];
        rest = &rest[close + 1..];
        if matches!(tag, "Latest" | "Uncommitted" | "Committed") {
            let end = format!("</{tag}>");
            let Some(stop) = rest.find(&end) else { break };
            ids.push(rest[..stop].trim().to_owned());
            rest = &rest[stop + end.len()..];
        }
    }
    ids
}

async fn blob(
    inner: &Arc<Inner>,
    caller: &Caller,
    token: &str,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Fail> {
    let token = token.split('/').next().unwrap_or("");
    match inner.redeem(token, caller)? {
        Target::Upload(id) if req.method() == Method::PUT => upload(inner, id, req).await,
        Target::Download(id) if matches!(*req.method(), Method::GET | Method::HEAD) => {
            download(inner, caller, id, &req).await
        }
        _ => Err(Fail::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "bad_route",
            "method not allowed on this URL",
        )),
    }
}

/// Put Blob, Put Block or Put Block List on upload `id`.
async fn upload(
    inner: &Arc<Inner>,
    id: i64,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Fail> {
    let params = query_params(req.uri().query());
    let dir = inner.store.upload_dir(id);
    let received = lock(&inner.staging)
        .get(&id)
        .map(|s| s.received)
        .ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, "not_found", "no such upload"))?;
    let budget = MAX_ENTRY_SIZE.saturating_sub(received);
    match params.get("comp").map(String::as_str) {
        None => {
            let path = dir.join("data");
            let mut file = tokio::fs::File::create(&path)
                .await
                .map_err(|err| Fail::internal(&err))?;
            let mut hasher = Sha256::new();
            // Put Blob replaces whatever was sent before: its budget is the whole entry.
            let size = write_body(
                req.into_body(),
                &mut file,
                Some(&mut hasher),
                MAX_ENTRY_SIZE,
            )
            .await?;
            let digest = hex::encode(hasher.finalize());
            let answer = azure_created(&digest)?;
            if let Some(staging) = lock(&inner.staging).get_mut(&id) {
                staging.received = size;
                staging.complete = Some((digest, size));
            }
            Ok(answer)
        }
        Some("block") => {
            let block_id = params.get("blockid").cloned().unwrap_or_default();
            if block_id.is_empty() || block_id.len() > MAX_BLOCK_ID {
                return Err(Fail::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "a block id is required",
                ));
            }
            {
                let mut staging = lock(&inner.staging);
                let Some(staging) = staging.get_mut(&id) else {
                    return Err(Fail::new(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        "no such upload",
                    ));
                };
                if staging.blocks >= MAX_BLOCKS {
                    return Err(Fail::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "resource_exhausted",
                        "too many blocks",
                    ));
                }
                staging.blocks += 1;
            }
            let path = block_path(&dir, &block_id);
            let mut file = tokio::fs::File::create(&path)
                .await
                .map_err(|err| Fail::internal(&err))?;
            let size = write_body(req.into_body(), &mut file, None, budget).await?;
            if let Some(staging) = lock(&inner.staging).get_mut(&id) {
                staging.received += size;
            }
            azure_created(&block_id)
        }
        Some("blocklist") => {
            let body = small_body(req.into_body(), MAX_BLOCK_LIST_BODY).await?;
            let ids = block_list(&String::from_utf8_lossy(&body));
            let parts: Vec<PathBuf> = ids.iter().map(|b| block_path(&dir, b)).collect();
            if ids.is_empty() || parts.iter().any(|p| !p.exists()) {
                return Err(Fail::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "the block list names a block not uploaded",
                ));
            }
            let out = dir.join("data");
            let blocks = dir.join("blocks");
            let (digest, size) = blocking(move || {
                let done = store::concat_files(&parts, &out)?;
                // The blocks are in `data` now; drop them so the bytes are on disk once.
                std::fs::remove_dir_all(&blocks)
                    .and_then(|()| std::fs::create_dir(&blocks))
                    .map_err(|source| CacheError::Io {
                        what: format!("clearing {}", blocks.display()),
                        source,
                    })?;
                Ok(done)
            })
            .await?;
            if size > MAX_ENTRY_SIZE {
                return Err(Fail::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "resource_exhausted",
                    "the entry is larger than the cache accepts",
                ));
            }
            let answer = azure_created(&digest)?;
            if let Some(staging) = lock(&inner.staging).get_mut(&id) {
                staging.blocks = 0;
                staging.complete = Some((digest, size));
            }
            Ok(answer)
        }
        Some(_) => Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "unsupported blob operation",
        )),
    }
}

/// One byte range of `size` bytes as `[start, end]` inclusive; `Ok(None)` for the whole, `Err`
/// when unsatisfiable. Only `bytes=a-b`, `bytes=a-` and `bytes=-n`; several ranges are answered
/// whole, as RFC 9110 allows.
fn byte_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.split_once('-') else {
        return Ok(None);
    };
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        let n: u64 = last.parse().map_err(|_| ())?;
        if n == 0 || size == 0 {
            return Err(());
        }
        (size.saturating_sub(n), size - 1)
    } else {
        let start: u64 = first.parse().map_err(|_| ())?;
        let end = if last.is_empty() {
            size.saturating_sub(1)
        } else {
            last.parse::<u64>()
                .map_err(|_| ())?
                .min(size.saturating_sub(1))
        };
        if start >= size || end < start {
            return Err(());
        }
        (start, end)
    };
    Ok(Some(range))
}

/// A body read from a file by a task, chunk by chunk.
struct FileBody {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
}

impl hyper::body::Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

async fn download(
    inner: &Arc<Inner>,
    caller: &Caller,
    id: i64,
    req: &Request<Incoming>,
) -> Result<Response<BoxBody>, Fail> {
    let entry = inner
        .store
        .entry(id)?
        .ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, "not_found", "the entry is gone"))?;
    let path = inner.store.blob_path(&entry.digest);
    let mut file = tokio::fs::File::open(&path)
        .await
        .map_err(|err| Fail::internal(&err))?;
    let size = entry.size;
    let range_header = req
        .headers()
        .get("x-ms-range")
        .or_else(|| req.headers().get(header::RANGE))
        .and_then(|v| v.to_str().ok());
    let range = byte_range(range_header, size);
    let mut answer = status_only(StatusCode::OK);
    let headers = answer.headers_mut();
    let etag = format!("\"0x{}\"", &entry.digest[..16]);
    for (name, value) in [
        ("accept-ranges", "bytes".to_owned()),
        ("content-type", "application/octet-stream".to_owned()),
        ("etag", etag),
        ("x-ms-blob-type", "BlockBlob".to_owned()),
        ("x-ms-version", "2026-02-06".to_owned()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    let (start, end) = match range {
        Err(()) => {
            *answer.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                answer.headers_mut().insert(header::CONTENT_RANGE, value);
            }
            return Ok(answer);
        }
        Ok(Some((start, end))) => {
            *answer.status_mut() = StatusCode::PARTIAL_CONTENT;
            if let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{end}/{size}")) {
                answer.headers_mut().insert(header::CONTENT_RANGE, value);
            }
            (start, end + 1)
        }
        Ok(None) => (0, size),
    };
    let length = end - start;
    answer
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if req.method() == Method::HEAD || length == 0 {
        return Ok(answer);
    }
    file.seek(std::io::SeekFrom::Start(start))
        .await
        .map_err(|err| Fail::internal(&err))?;
    let (tx, rx) = mpsc::channel(4);
    let counter = Arc::clone(inner);
    let job = caller.job;
    tokio::spawn(async move {
        let mut left = length;
        let mut sent = 0u64;
        while left > 0 {
            let want = usize::try_from(left.min(DOWNLOAD_CHUNK as u64)).unwrap_or(DOWNLOAD_CHUNK);
            let mut buf = vec![0; want];
            match file.read(&mut buf).await {
                Ok(0) => {
                    let _ = tx
                        .send(Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "blob shorter than its entry",
                        )))
                        .await;
                    break;
                }
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send(Ok(Bytes::from(buf))).await.is_err() {
                        break;
                    }
                    left -= n as u64;
                    sent += n as u64;
                }
                Err(err) => {
                    let _ = tx.send(Err(err)).await;
                    break;
                }
            }
        }
        counter
            .count(
                job,
                Counters {
                    bytes_down: sent,
                    ..Counters::default()
                },
            )
            .await;
    });
    let (parts, _) = answer.into_parts();
    Ok(Response::from_parts(parts, FileBody { rx }.boxed_unsync()))
}

#[derive(Deserialize)]
struct ReserveRequest {
    #[serde(default)]
    key: String,
    #[serde(default)]
    version: String,
    #[serde(default, rename = "cacheSize")]
    cache_size: Option<u64>,
}

#[derive(Deserialize)]
struct CommitRequest {
    size: u64,
}

/// `bytes a-b/*` (or `/total`): `[a, b]`.
fn content_range(header: Option<&str>) -> Option<(u64, u64)> {
    let spec = header?.trim().strip_prefix("bytes ")?;
    let (range, _) = spec.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let (start, end): (u64, u64) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    (end >= start).then_some((start, end))
}

/// Whether `ranges` (`[start, end)`) cover exactly `0..size`, without overlap.
fn covers(ranges: &[(u64, u64)], size: u64) -> bool {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut next = 0;
    for (start, end) in sorted {
        if start != next {
            return false;
        }
        next = end;
    }
    next == size
}

async fn v1(
    inner: &Arc<Inner>,
    caller: &Caller,
    rest: &str,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Fail> {
    let method = req.method().clone();
    match (&method, rest) {
        (&Method::GET, "cache") => {
            let params = query_params(req.uri().query());
            let keys: Vec<String> = params
                .get("keys")
                .map(|k| k.split(',').map(str::to_owned).collect())
                .unwrap_or_default();
            let version = params.get("version").cloned().unwrap_or_default();
            let Some((key, restore)) = keys.split_first() else {
                return Err(Fail::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "keys are required",
                ));
            };
            check_key(key, &version)?;
            match lookup(inner, caller, key.clone(), restore.to_vec(), version).await? {
                Some((entry, url)) => Ok(json_response(
                    StatusCode::OK,
                    &json!({
                        "cacheKey": entry.key,
                        "scope": entry.scope,
                        "cacheVersion": entry.version,
                        "creationTime": rm_vocab::UnixMs::new(entry.created_ms).to_rfc3339(),
                        "archiveLocation": url,
                    }),
                )),
                None => Ok(status_only(StatusCode::NO_CONTENT)),
            }
        }
        (&Method::GET, "caches") => {
            let params = query_params(req.uri().query());
            let key = params.get("key").cloned().unwrap_or_default();
            let scope = &caller.scope;
            let entries = inner.store.list(&scope.repository, &scope.read, &key)?;
            let listed: Vec<serde_json::Value> = entries
                .iter()
                .map(|e| {
                    json!({
                        "cacheKey": e.key,
                        "cacheVersion": e.version,
                        "scope": e.scope,
                        "creationTime": rm_vocab::UnixMs::new(e.created_ms).to_rfc3339(),
                    })
                })
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"totalCount": listed.len(), "artifactCaches": listed}),
            ))
        }
        (&Method::POST, "caches") => {
            let body = small_body(req.into_body(), MAX_JSON_BODY).await?;
            let request: ReserveRequest = parse_json(&body)?;
            if request.cache_size.is_some_and(|s| s > MAX_ENTRY_SIZE) {
                return Err(Fail::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    format!(
                        "Cache size of {} bytes is over the {MAX_ENTRY_SIZE} bytes limit, not saving cache.",
                        request.cache_size.unwrap_or(0)
                    ),
                ));
            }
            let id = reserve(inner, caller, &request.key, &request.version).await?;
            Ok(json_response(StatusCode::CREATED, &json!({"cacheId": id})))
        }
        (&Method::PATCH | &Method::POST, _) if rest.starts_with("caches/") => {
            let id: i64 = rest["caches/".len()..]
                .parse()
                .map_err(|_| Fail::new(StatusCode::NOT_FOUND, "not_found", "no such cache"))?;
            // Another job's reservation is answered as if it did not exist.
            let _upload = inner
                .store
                .upload(id)?
                .filter(|u| u.attempt == caller.attempt)
                .ok_or_else(|| Fail::new(StatusCode::NOT_FOUND, "not_found", "no such cache"))?;
            if method == Method::PATCH {
                v1_chunk(inner, id, req).await
            } else {
                let body = small_body(req.into_body(), MAX_JSON_BODY).await?;
                let request: CommitRequest = parse_json(&body)?;
                let ranges = lock(&inner.staging)
                    .get(&id)
                    .map(|s| s.ranges.clone())
                    .unwrap_or_default();
                if !covers(&ranges, request.size) {
                    return Err(Fail::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_argument",
                        "the uploaded chunks do not cover the size given",
                    ));
                }
                let staged = inner.store.upload_dir(id).join("data");
                let (digest, size) = blocking(move || store::hash_file(&staged)).await?;
                if let Some(staging) = lock(&inner.staging).get_mut(&id) {
                    staging.complete = Some((digest, size));
                }
                commit(inner, caller, id, Some(request.size)).await?;
                Ok(status_only(StatusCode::NO_CONTENT))
            }
        }
        _ => Err(Fail::new(
            StatusCode::NOT_FOUND,
            "bad_route",
            "not served here",
        )),
    }
}

/// One v1 chunk, written at its offset.
async fn v1_chunk(
    inner: &Arc<Inner>,
    id: i64,
    req: Request<Incoming>,
) -> Result<Response<BoxBody>, Fail> {
    let range = content_range(
        req.headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or_else(|| {
        Fail::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "a Content-Range is required",
        )
    })?;
    let (start, end) = range;
    if end >= MAX_ENTRY_SIZE {
        return Err(Fail::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "resource_exhausted",
            "the entry is larger than the cache accepts",
        ));
    }
    let length = end - start + 1;
    let path = inner.store.upload_dir(id).join("data");
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .await
        .map_err(|err| Fail::internal(&err))?;
    file.seek(std::io::SeekFrom::Start(start))
        .await
        .map_err(|err| Fail::internal(&err))?;
    let written = write_body(req.into_body(), &mut file, None, length).await?;
    if written != length {
        return Err(Fail::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "the body does not match its Content-Range",
        ));
    }
    let mut staging = lock(&inner.staging);
    let Some(staging) = staging.get_mut(&id) else {
        return Err(Fail::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such cache",
        ));
    };
    // A retried chunk replaces its earlier copy rather than counting twice.
    staging.ranges.retain(|r| *r != (start, end + 1));
    staging.ranges.push((start, end + 1));
    staging.received += written;
    Ok(status_only(StatusCode::NO_CONTENT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges() {
        type Expected = Result<Option<(u64, u64)>, ()>;
        let table: &[(Option<&str>, u64, Expected)] = &[
            (None, 10, Ok(None)),
            (Some("bytes=0-4"), 10, Ok(Some((0, 4)))),
            (Some("bytes=5-"), 10, Ok(Some((5, 9)))),
            (Some("bytes=-3"), 10, Ok(Some((7, 9)))),
            (Some("bytes=8-100"), 10, Ok(Some((8, 9)))),
            (Some("bytes=10-"), 10, Err(())),
            (Some("bytes=4-2"), 10, Err(())),
            (Some("bytes=0-1,4-5"), 10, Ok(None)),
            (Some("items=0-1"), 10, Ok(None)),
            (Some("bytes=-0"), 10, Err(())),
        ];
        for (header, size, expected) in table {
            assert_eq!(&byte_range(*header, *size), expected, "{header:?}");
        }
    }

    #[test]
    fn content_ranges_and_coverage() {
        assert_eq!(content_range(Some("bytes 0-9/*")), Some((0, 9)));
        assert_eq!(content_range(Some("bytes 10-19/20")), Some((10, 19)));
        assert_eq!(content_range(Some("bytes 9-0/*")), None);
        assert_eq!(content_range(None), None);
        assert!(covers(&[(10, 20), (0, 10)], 20));
        assert!(!covers(&[(0, 10)], 20));
        assert!(!covers(&[(0, 12), (10, 20)], 20));
        assert!(covers(&[], 0));
    }

    #[test]
    fn block_lists_and_query_decoding() {
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\
                   <BlockList><Latest>QUFB</Latest><Uncommitted>QkJC</Uncommitted></BlockList>";
        assert_eq!(block_list(xml), vec!["QUFB", "QkJC"]);
        let params = query_params(Some("comp=block&blockid=YWJj%2B%2F%3D%3D&x"));
        assert_eq!(params["blockid"], "YWJj+/==");
        assert_eq!(params["x"], "");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
