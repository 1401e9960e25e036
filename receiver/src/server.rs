//! The HTTP server: accepts connections, routes requests, and turns each webhook request into
//! either a refusal (nothing journalled) or a committed delivery.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming as Body;
use rm_http_serve::Limits;
use rm_journal::{Journal, JournalError, Recorded};
use rm_vocab::Source;
use tokio::net::TcpListener;
use tracing::Instrument as _;

use crate::WebhookSecrets;
use crate::journal::ReceiverJournal;
use crate::judge;
use crate::metrics::Metrics;
use crate::verify::{self, Refusal};
use rm_http_serve::budget::{self, BUSY_RETRY_AFTER_SECS, BodyBudget, BodyLimits, Hold, Refused};
use rm_vocab::UnixMs;

/// A client that has not sent its headers by then is cut off.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// GitHub gives up on a delivery after 10 s; a body that takes longer is not GitHub's.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; further ones wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 1024;
/// How long a shutdown waits for requests in flight to be answered.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `/healthz` answers 503 when the journal cannot take its write lock this fast.
const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How the receiver is set up.
pub struct ReceiverConfig {
    /// The webhook path, e.g. `/webhook`.
    pub path: String,
    pub secrets: WebhookSecrets,
    /// Bodies over this are refused with 413 while they stream in.
    pub max_body_bytes: usize,
}

/// The receiver: configuration, the journal it writes and its metrics. The journal is the
/// embedded SQLite one unless the receiver is built on another [`ReceiverJournal`] (the
/// PostgreSQL journal a fleet's receivers share).
pub struct Receiver<J = Journal> {
    config: ReceiverConfig,
    journal: J,
    metrics: Metrics,
    bodies: Arc<BodyBudget>,
}

/// Why a body was not read whole.
enum BodyError {
    Refused(Refused),
    Read,
    Timeout,
}

type Reply = Response<Full<Bytes>>;

impl<J: ReceiverJournal> Receiver<J> {
    pub fn new(config: ReceiverConfig, journal: J) -> Arc<Self> {
        // The shared defaults (`rm_http_serve::budget`): [`MAX_CONNECTIONS`] allowances of
        // 64 KiB and a 192 MiB pool, 256 MiB of bodies at most.
        Self::with_body_limits(config, journal, BodyLimits::default())
    }

    /// A receiver whose body buffers are bounded by `limits` instead of the defaults
    /// ([`crate::BODY_ALLOWANCE_BYTES`] and [`crate::BODY_POOL_BYTES`]).
    pub fn with_body_limits(config: ReceiverConfig, journal: J, limits: BodyLimits) -> Arc<Self> {
        let bodies = Arc::new(BodyBudget::new(limits));
        let metrics = Metrics::new(journal.metrics(), Arc::clone(&bodies));
        Arc::new(Receiver {
            config,
            journal,
            metrics,
            bodies,
        })
    }

    /// Adds metrics that `/metrics` shows after the receiver's own, read at every scrape: how
    /// the agent around the receiver exports what only it knows (polling, GitHub requests).
    pub fn add_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.metrics.add_collector(collector);
    }

    /// Serves connections from `listener` until `shutdown` completes, then stops accepting and
    /// waits (up to a bound) for the requests in flight to be answered.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let limits = Limits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            drain_timeout: DRAIN_TIMEOUT,
        };
        let handle = move |req| {
            let this = Arc::clone(&self);
            async move { this.route(req).await }
        };
        rm_http_serve::serve(listener, limits, handle, shutdown, || {}).await;
        Ok(())
    }

    async fn route(&self, req: Request<Body>) -> Reply {
        let path = req.uri().path();
        match (req.method(), path) {
            (&Method::POST, p) if p == self.config.path => self.webhook(req).await,
            (&Method::GET, "/healthz") => self.healthz().await,
            (&Method::GET, "/metrics") => self.render_metrics().await,
            (_, p) if p == self.config.path || p == "/healthz" || p == "/metrics" => {
                text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n")
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    async fn webhook(&self, req: Request<Body>) -> Reply {
        let received_at_ms = rm_vocab::now();
        let headers = req.headers();
        let envelope = match verify::envelope(headers) {
            Ok(envelope) => envelope,
            Err(refusal) => return self.refuse(refusal),
        };
        // Every event about this delivery carries its GUID and event once, from the span.
        let span = tracing::info_span!("delivery", guid = %envelope.guid, event = %envelope.event);
        self.accept(envelope, req, received_at_ms)
            .instrument(span)
            .await
    }

    /// Reads, verifies and journals one delivery whose headers are valid.
    async fn accept(
        &self,
        envelope: verify::Envelope,
        req: Request<Body>,
        received_at_ms: UnixMs,
    ) -> Reply {
        let headers = req.headers();
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.config.max_body_bytes as u64) {
            return self.too_large();
        }
        let declared = declared.and_then(|len| usize::try_from(len).ok());

        let (body, _hold) = match tokio::time::timeout(
            BODY_READ_TIMEOUT,
            self.read_body(req.into_body(), declared),
        )
        .await
        .unwrap_or(Err(BodyError::Timeout))
        {
            Ok(read) => read,
            Err(BodyError::Timeout) => {
                return self.refuse(Refusal {
                    status: StatusCode::REQUEST_TIMEOUT,
                    reason: "body_timeout",
                    detail: "the body took too long to arrive",
                });
            }
            Err(BodyError::Refused(Refused::TooLarge)) => return self.too_large(),
            Err(BodyError::Refused(Refused::Busy)) => return self.busy(),
            Err(BodyError::Read) => {
                return self.refuse(Refusal {
                    status: StatusCode::BAD_REQUEST,
                    reason: "body_read",
                    detail: "the body could not be read",
                });
            }
        };
        // `_hold` keeps the body's share of the budget until the delivery is answered: the body
        // itself lives on in the journal's queue until the commit.
        let event = envelope.event.clone();
        let incoming =
            match envelope.verify(&self.config.secrets, body, received_at_ms, Source::Webhook) {
                Ok(incoming) => incoming,
                Err(refusal) => {
                    tracing::warn!(
                        "refused a delivery whose signature matches no configured secret"
                    );
                    return self.refuse(refusal);
                }
            };
        let judgement = judge::judge_measured(incoming).await;
        let off_worker = judgement.off_worker;
        let recorded = match judgement.judged {
            Ok(judged) => self.journal.record_judged(judged).await,
            Err(refused) => Err(refused),
        };
        match recorded {
            Ok(Recorded::New(outcome)) => {
                self.metrics.delivery(&event, outcome.as_str());
                tracing::debug!(
                    outcome = outcome.as_str(),
                    judged_off_worker = off_worker,
                    "delivery journalled"
                );
                text(StatusCode::ACCEPTED, "accepted\n")
            }
            Ok(Recorded::AlreadyJournalled) => {
                self.metrics.delivery(&event, "already_journalled");
                tracing::debug!("delivery already journalled");
                text(StatusCode::OK, "already journalled\n")
            }
            Err(JournalError::NotJson) => self.refuse(Refusal {
                status: StatusCode::BAD_REQUEST,
                reason: "not_json",
                detail: "the body is not JSON",
            }),
            Err(err) => {
                // GitHub counts this delivery as failed; the agent's redelivery recovers it.
                tracing::error!(error = %err, "delivery not journalled");
                self.refuse(Refusal {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    reason: "journal",
                    detail: "the journal cannot take deliveries now",
                })
            }
        }
    }

    /// Reads the body into one buffer as it streams in (the only copy the receiver makes), each
    /// chunk within the body budget and the per-body cap.
    async fn read_body(
        &self,
        body: Body,
        declared: Option<usize>,
    ) -> Result<(Vec<u8>, Hold), BodyError> {
        budget::read_body(&self.bodies, body, declared, self.config.max_body_bytes)
            .await
            .map_err(|e| match e {
                budget::BodyError::Refused(refused) => BodyError::Refused(refused),
                budget::BodyError::Read => BodyError::Read,
            })
    }

    fn busy(&self) -> Reply {
        let mut reply = self.refuse(Refusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            reason: "busy",
            detail: "too many bodies in flight; retry later",
        });
        reply.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(BUSY_RETRY_AFTER_SECS),
        );
        // The rest of the body is not read: close instead of draining it.
        reply.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        reply
    }

    fn too_large(&self) -> Reply {
        let mut reply = self.refuse(Refusal {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            reason: "too_large",
            detail: "body over 25 MiB",
        });
        // The rest of the body is never read: close instead of draining it.
        reply.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        reply
    }

    fn refuse(&self, refusal: Refusal) -> Reply {
        let Refusal {
            status,
            reason,
            detail,
        } = refusal;
        self.metrics.refused(status.as_u16(), reason);
        tracing::debug!(status = status.as_u16(), reason, "request refused");
        text(status, &format!("{detail}\n"))
    }

    async fn healthz(&self) -> Reply {
        match tokio::time::timeout(HEALTH_PROBE_TIMEOUT, self.journal.probe()).await {
            Ok(Ok(())) => text(StatusCode::OK, "ok\n"),
            Ok(Err(err)) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("journal not writable: {err}\n"),
            ),
            Err(_) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "journal not writable: probe timed out\n",
            ),
        }
    }

    async fn render_metrics(&self) -> Reply {
        let counts = self.journal.counts().await;
        let body = self.metrics.render(counts);
        let mut reply = Response::new(Full::new(Bytes::from(body)));
        reply.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
        );
        reply
    }
}

fn text(status: StatusCode, body: &str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from(body.to_owned())));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    reply
}
