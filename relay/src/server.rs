//! The HTTP server: accepts connections, routes each request to its handler (ingest in
//! `ingest.rs`, streams and acks in `subscribe.rs`), answers `/healthz` and `/metrics`, and shuts
//! down gracefully: stop accepting, let ingests in flight commit and answer, close the streams.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rm_http_serve::Limits;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::store::{self, Store};
use crate::{ingest, subscribe};

/// A client that has not sent its headers by then is cut off.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (streams included); further ones wait in the accept queue.
const MAX_CONNECTIONS: usize = 1024;
/// How long a shutdown waits for requests in flight to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `/healthz` answers 503 when a write cannot be committed this fast.
const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) type Reply = Response<UnsyncBoxBody<Bytes, Infallible>>;

/// The running relay: its store, metrics, and the two signals its streams wait on.
pub struct Relay {
    pub(crate) store: Store,
    pub(crate) metrics: Metrics,
    /// The id of the newest committed delivery: every stream wakes when it changes.
    pub(crate) notify: watch::Sender<i64>,
    /// Set once at shutdown; every stream ends when it is.
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) max_body_bytes: usize,
}

impl Relay {
    pub fn new(store: Store, max_body_bytes: usize) -> Arc<Relay> {
        Arc::new(Relay {
            store,
            metrics: Metrics::default(),
            notify: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            max_body_bytes,
        })
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

    async fn healthz(&self) -> Reply {
        let probe = self.store.write(|conn| store::probe(conn, crate::now_ms()));
        match tokio::time::timeout(HEALTH_PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => text(StatusCode::OK, "ok\n"),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "health probe failed");
                text(StatusCode::SERVICE_UNAVAILABLE, "database not writable\n")
            }
            Err(_) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "database not writable: probe timed out\n",
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
