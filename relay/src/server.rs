//! The HTTP server: accepts connections, routes each request to its handler (ingest in
//! `ingest.rs`, streams and acks in `subscribe.rs`), answers `/healthz` and `/metrics`, and shuts
//! down gracefully: stop accepting, let ingests in flight commit and answer, close the streams.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rm_http_serve::Limits;
use tokio::net::TcpListener;

use crate::state::{Relay, Reply, text};
use crate::{ingest, subscribe};

/// A client that has not sent its headers by then is cut off.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (streams included); further ones wait in the accept queue.
const MAX_CONNECTIONS: usize = 1024;
/// How long a shutdown waits for requests in flight to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `/healthz` answers 503 when the file cannot be read, or the writer taken, this fast.
const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

impl Relay {
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
