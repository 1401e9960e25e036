//! The running relay's shared state (its store, metrics, limits and the signals its streams wait
//! on) and the answers every handler builds. The HTTP side is split around it: `server.rs` accepts
//! and routes, `ingest.rs` takes deliveries, `subscribe.rs` and `stream.rs` serve hosts; each of
//! them depends on this module and none on another's internals, so the graph has no cycle.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use rm_http_serve::budget::BodyBudget;
use tokio::sync::watch;

use crate::limits::{Bucket, IngestLimits};
use crate::metrics::Metrics;
use crate::store::Store;
use rm_vocab::UnixMs;

/// A channel refusing deliveries for its full quota is logged at most this often.
const QUOTA_WARN_INTERVAL: Duration = Duration::from_secs(60);

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
    /// What ingest bodies hold, across every request (`limits.bodies`).
    pub(crate) bodies: Arc<BodyBudget>,
    /// Each channel's ingest rate (in memory: a restart forgives, which only ever lets more in).
    buckets: Mutex<HashMap<String, Bucket>>,
    /// When a full quota was last logged (ms since the epoch), so a flood logs once a minute.
    quota_warned_at_ms: AtomicI64,
}

impl Relay {
    pub fn new(store: Store, limits: IngestLimits) -> Arc<Relay> {
        let bodies = Arc::new(BodyBudget::new(limits.bodies));
        Arc::new(Relay {
            store,
            metrics: Metrics::new(Arc::clone(&bodies)),
            bodies,
            notify: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            limits,
            buckets: Mutex::new(HashMap::new()),
            quota_warned_at_ms: AtomicI64::new(i64::MIN),
        })
    }

    /// Whether a full quota should be logged now (at most once per [`QUOTA_WARN_INTERVAL`];
    /// `/metrics` counts every refusal).
    pub(crate) fn quota_warning_due(&self, now: UnixMs) -> bool {
        // The last warning's time lives in an atomic, so in plain milliseconds.
        let now_ms = now.get();
        let last = self.quota_warned_at_ms.load(Ordering::Relaxed);
        let interval = rm_vocab::millis(QUOTA_WARN_INTERVAL);
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
