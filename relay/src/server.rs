//! The HTTP server: accepts connections, routes each request to its handler (ingest in
//! `ingest.rs`, streams and acks in `subscribe.rs`), answers `/healthz` and `/metrics`, and shuts
//! down gracefully: stop accepting, let ingests in flight commit and answer, close the streams.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rm_http_serve::Limits;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::limits::{Bucket, IngestLimits};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::{ingest, subscribe};

/// A client that has not sent its headers by then is cut off.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (streams included); further ones wait in the accept queue.
const MAX_CONNECTIONS: usize = 1024;
/// A channel refusing deliveries for its full quota is logged at most this often.
const QUOTA_WARN_INTERVAL: Duration = Duration::from_secs(60);
/// How long a shutdown waits for requests in flight to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `/healthz` answers 503 when the file cannot be read, or the writer taken, this fast.
const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// The running relay: its store, metrics, limits, and the two signals its streams wait on.
pub struct Relay {
    pub(crate) store: Store,
    pub(crate) metrics: Metrics,
    /// The id of the newest committed delivery: every stream wakes when it changes.
    pub(crate) notify: watch::Sender<i64>,
    /// Set once at shutdown; every stream ends when it is.
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) limits: IngestLimits,
    /// Each channel's ingest rate (in memory: a restart forgives, which only ever lets more in).
    buckets: Mutex<HashMap<String, Bucket>>,
    /// When a full quota was last logged (ms since the epoch), so a flood logs once a minute.
    quota_warned_at_ms: AtomicI64,
}

impl Relay {
    pub fn new(store: Store, limits: IngestLimits) -> Arc<Relay> {
        Arc::new(Relay {
            store,
            metrics: Metrics::default(),
            notify: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            limits,
            buckets: Mutex::new(HashMap::new()),
            quota_warned_at_ms: AtomicI64::new(i64::MIN),
        })
    }

    /// Whether a full quota should be logged now (at most once per [`QUOTA_WARN_INTERVAL`];
    /// `/metrics` counts every refusal).
    pub(crate) fn quota_warning_due(&self, now_ms: i64) -> bool {
        let last = self.quota_warned_at_ms.load(Ordering::Relaxed);
        let interval = i64::try_from(QUOTA_WARN_INTERVAL.as_millis()).unwrap_or(i64::MAX);
        now_ms.saturating_sub(last) >= interval
            && self
                .quota_warned_at_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Takes one delivery from `channel`'s ingest rate now, or says how long until it may
    /// send again.
    pub(crate) fn take_ingest_token(&self, channel: &str) -> Result<(), Duration> {
        let rate = self.limits.ingest_rate;
        let now = std::time::Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        // Channels are few (an operator makes each), so one bucket per channel ever seen.
        buckets
            .entry(channel.to_owned())
            .or_insert_with(|| Bucket::new(rate, now))
            .take(rate, now)
    }

    /// Serves connections from `listener` until `shutdown` completes, then stops accepting,
    /// closes every stream and waits (up to a bound) for the requests in flight.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let limits = Limits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            drain_timeout: DRAIN_TIMEOUT,
        };
        let this = Arc::clone(&self);
        let handle = move |req| Arc::clone(&this).route(req);
        rm_http_serve::serve(listener, limits, handle, shutdown, || {
            tracing::info!("shutting down: closing streams, finishing requests in flight");
            self.shutdown.send_replace(true);
        })
        .await;
    }

    async fn route(self: Arc<Self>, req: Request<Incoming>) -> Reply {
        let path = req.uri().path().to_owned();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let method = req.method().clone();
        match (&method, segments.as_slice()) {
            (&Method::POST, ["hooks", id]) => ingest::ingest(&self, id, req).await,
            // The ingest URL never reads anything.
            (_, ["hooks", _]) => method_not_allowed("POST"),
            (&Method::GET, ["subscribe", name]) => subscribe::subscribe(self, name, req).await,
            (_, ["subscribe", _]) => method_not_allowed("GET"),
            (&Method::POST, ["subscribe", name, "ack"]) => subscribe::ack(&self, name, req).await,
            (_, ["subscribe", _, "ack"]) => method_not_allowed("POST"),
            (&Method::GET, ["smee", id]) => subscribe::smee(self, id, req).await,
            (_, ["smee", _]) => method_not_allowed("GET"),
            (&Method::GET, ["healthz"]) => self.healthz().await,
            (&Method::GET, ["metrics"]) => metrics_reply(self.metrics.render()),
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// Writes nothing: a read of the file and a look at the writer ([`Store::check_health`]),
    /// so probes cost no fsync and never queue a write behind ingest.
    async fn healthz(&self) -> Reply {
        match tokio::time::timeout(HEALTH_CHECK_TIMEOUT, self.store.check_health()).await {
            Ok(Ok(())) => text(StatusCode::OK, "ok\n"),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "health check failed");
                text(StatusCode::SERVICE_UNAVAILABLE, "database not usable\n")
            }
            Err(_) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "database not usable: the check timed out\n",
            ),
        }
    }
}

fn metrics_reply(body: String) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    reply
}

fn method_not_allowed(allow: &'static str) -> Reply {
    let mut reply = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    reply
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    reply
}

/// A plain-text answer.
pub(crate) fn text(status: StatusCode, body: &str) -> Reply {
    with_body(
        status,
        "text/plain; charset=utf-8",
        Bytes::from(body.to_owned()),
    )
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Reply {
    with_body(status, "application/json", Bytes::from(value.to_string()))
}

fn with_body(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut reply = Response::new(Full::new(body).boxed_unsync());
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    reply
}
