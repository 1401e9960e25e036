//! Webhook notifications (`[[notifications.webhook]]`): each event a POST of its JSON body
//! (`super::body`) to every endpoint that wants its kind, signed when the endpoint has a secret.
//!
//! Owns the delivery of a notification and nothing before it: the notifier decides whether an
//! event goes out at all (its per-kind rate limit), this module gets it there. Enqueueing is a
//! lock and a push, so [`super::Notifier::notify`] stays synchronous and instant wherever it is
//! called (the executor's loop, launch tasks, the fitness checker, a test without a runtime).
//! Each endpoint has its own bounded queue ([`QUEUE_CAPACITY`]), served in order by its own
//! task, so an endpoint that hangs delays only its own notifications. The tasks run on a thread
//! of their own with a single-threaded tokio runtime: the notifier is built before any caller
//! is known to be in a runtime, and a slow receiver never takes a worker of the agent's.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http_body_util::Full;
use rm_receiver::prometheus_client::collector::Collector;
use rm_receiver::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use rm_receiver::prometheus_client::metrics::MetricType;
use rm_receiver::prometheus_client::metrics::counter::ConstCounter;
use secrecy::{ExposeSecret as _, SecretString};
use tokio::sync::Notify;

use super::OperatorEvent;
use super::retry::{Attempt, RetryPolicy, Step, retry_after, step};
use crate::config::notifications::{EventKind, WebhookUrl};
use rm_runner::https::HttpsClient;

/// Notifications waiting per endpoint. With the notifier's rate limit at most one event per
/// kind enters per quarter hour, and an endpoint that is down gives each up within minutes
/// (`super::retry`), so the queue only fills if an endpoint hangs for hours; then the oldest
/// waiting notification is dropped (and counted) for the new one: after an outage the
/// operator wants the state now, not the one of hours ago.
pub(crate) const QUEUE_CAPACITY: usize = 32;

/// `X-Rm-Signature-256`: `sha256=` + hex HMAC-SHA256 of the body, when the endpoint has a secret.
pub(crate) const SIGNATURE_HEADER: &str = "x-rm-signature-256";
/// `X-Rm-Event`: the kind's name, as the body's `"event"`.
pub(crate) const EVENT_HEADER: &str = "x-rm-event";
/// `X-Rm-Delivery`: a UUID per notification and endpoint, the same on every retry of it.
pub(crate) const DELIVERY_HEADER: &str = "x-rm-delivery";
/// `User-Agent`.
const AGENT: &str = concat!("rm-agent/", env!("CARGO_PKG_VERSION"));

/// One configured endpoint, its secret read.
pub(crate) struct Endpoint {
    /// `notifications.webhook[N]`: how logs and metrics name it.
    pub(crate) key: String,
    pub(crate) url: WebhookUrl,
    pub(crate) secret: Option<SecretString>,
    /// The kinds it wants.
    pub(crate) events: Vec<EventKind>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("key", &self.key)
            .field("url", &self.url)
            .field("signed", &self.secret.is_some())
            .field("events", &self.events)
            .finish()
    }
}

/// One notification on its way to one endpoint: built once, sent as is on every attempt.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) kind: EventKind,
    pub(crate) id: String,
    pub(crate) body: Bytes,
    pub(crate) signature: Option<String>,
}

/// A bounded first-in first-out queue that drops its oldest item when full.
#[derive(Debug)]
pub(crate) struct Bounded<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Bounded<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Bounded {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds `item` at the back; returns the oldest item when it had to go to make room.
    pub(crate) fn push(&mut self, item: T) -> Option<T> {
        let dropped = if self.items.len() >= self.capacity {
            self.items.pop_front()
        } else {
            None
        };
        self.items.push_back(item);
        dropped
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// What an endpoint's queue holds, and whether the notifier is gone.
#[derive(Debug)]
struct QueueState {
    waiting: Bounded<Delivery>,
    closed: bool,
}

/// Notifications counted per endpoint, for `/metrics`.
#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
}

/// A snapshot of one endpoint's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkCounts {
    /// `notifications.webhook[N]`.
    pub key: String,
    /// The URL's host.
    pub host: String,
    /// Delivered (answered 2xx).
    pub sent: u64,
    /// Given up: a final answer, or every attempt failed.
    pub failed: u64,
    /// Never attempted: dropped from a full queue.
    pub dropped: u64,
}

/// An endpoint, its queue and its counts; shared by the notifier and its task.
#[derive(Debug)]
struct Sink {
    endpoint: Endpoint,
    state: Mutex<QueueState>,
    ready: Notify,
    counts: Counts,
}

impl Sink {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next notification to send, waiting for one; `None` once the notifier is gone and
    /// the queue is empty.
    async fn next(&self) -> Option<Delivery> {
        loop {
            // A push between the look below and the wait leaves a permit (`notify_one` stores
            // one when no task waits), so the wait ends at once and the loop looks again.
            let ready = self.ready.notified();
            {
                let mut state = self.lock();
                if let Some(delivery) = state.waiting.pop() {
                    return Some(delivery);
                }
                if state.closed {
                    return None;
                }
            }
            ready.await;
        }
    }
}

/// Every configured endpoint: what [`super::Notifier`] hands events to.
#[derive(Debug)]
pub(crate) struct Webhooks {
    /// The body's `host`.
    host: String,
    sinks: Vec<Arc<Sink>>,
}

impl Webhooks {
    /// The endpoints with empty queues of `capacity`; nothing is sent until [`Webhooks::start`].
    pub(crate) fn new(host: String, endpoints: Vec<Endpoint>, capacity: usize) -> Self {
        let sinks = endpoints
            .into_iter()
            .map(|endpoint| {
                Arc::new(Sink {
                    endpoint,
                    state: Mutex::new(QueueState {
                        waiting: Bounded::new(capacity),
                        closed: false,
                    }),
                    ready: Notify::new(),
                    counts: Counts::default(),
                })
            })
            .collect();
        Webhooks { host, sinks }
    }

    /// Starts the thread that serves every endpoint's queue with `client`, timed by `retry`
    /// (once: it takes the webhooks and gives them back). It ends when the webhooks are dropped
    /// and the queues are empty.
    pub(crate) fn start(
        self,
        client: HttpsClient<Full<Bytes>>,
        retry: RetryPolicy,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let sinks = self.sinks.clone();
        std::thread::Builder::new()
            .name("rm-notify-webhook".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let tasks: Vec<_> = sinks
                        .into_iter()
                        .map(|sink| tokio::spawn(serve(sink, client.clone(), retry)))
                        .collect();
                    for task in tasks {
                        let _ = task.await;
                    }
                });
            })?;
        Ok(self)
    }

    /// Queues `event`, which happened at `at`, for every endpoint that wants its kind. Never
    /// blocks: a full queue drops its oldest notification.
    pub(crate) fn enqueue(&self, event: &OperatorEvent, at: SystemTime) {
        let kind = event.kind();
        let wanting: Vec<&Arc<Sink>> = self
            .sinks
            .iter()
            .filter(|s| s.endpoint.events.contains(&kind))
            .collect();
        if wanting.is_empty() {
            return;
        }
        let body = Bytes::from(super::body::body(event, &self.host, at));
        for sink in wanting {
            let delivery = Delivery {
                kind,
                id: uuid::Uuid::new_v4().to_string(),
                signature: sink
                    .endpoint
                    .secret
                    .as_ref()
                    .map(|s| super::body::signature(s.expose_secret().as_bytes(), &body)),
                body: body.clone(),
            };
            let dropped = sink.lock().waiting.push(delivery);
            sink.ready.notify_one();
            if let Some(dropped) = dropped {
                sink.counts.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    sink = %sink.endpoint.key,
                    url = %sink.endpoint.url,
                    dropped = %dropped.kind,
                    "webhook notification queue full ({} waiting): the oldest was dropped",
                    QUEUE_CAPACITY
                );
            }
        }
    }

    /// Takes what waits for endpoint `index` (for tests that start no thread).
    #[cfg(test)]
    pub(crate) fn take(&self, index: usize) -> Vec<Delivery> {
        let mut state = self.sinks[index].lock();
        std::iter::from_fn(|| state.waiting.pop()).collect()
    }

    /// Each endpoint's counts, in configuration order.
    pub(crate) fn counts(&self) -> Vec<SinkCounts> {
        self.sinks
            .iter()
            .map(|s| SinkCounts {
                key: s.endpoint.key.clone(),
                host: s.endpoint.url.host().to_owned(),
                sent: s.counts.sent.load(Ordering::Relaxed),
                failed: s.counts.failed.load(Ordering::Relaxed),
                dropped: s.counts.dropped.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The counts as `/metrics` families, read at each scrape.
    pub(crate) fn metrics(&self) -> WebhookMetrics {
        WebhookMetrics {
            sinks: self.sinks.clone(),
        }
    }
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        for sink in &self.sinks {
            sink.lock().closed = true;
            sink.ready.notify_one();
        }
    }
}

/// Serves one endpoint's queue until it is closed and empty.
async fn serve(sink: Arc<Sink>, client: HttpsClient<Full<Bytes>>, retry: RetryPolicy) {
    while let Some(delivery) = sink.next().await {
        deliver(&sink, &client, &retry, &delivery).await;
    }
}

/// Sends one notification until it is delivered or given up, counting which.
async fn deliver(
    sink: &Sink,
    client: &HttpsClient<Full<Bytes>>,
    retry: &RetryPolicy,
    delivery: &Delivery,
) {
    let endpoint = &sink.endpoint;
    let mut attempt = 1;
    loop {
        let outcome = send(client, retry, endpoint, delivery).await;
        match step(retry, attempt, &outcome) {
            Step::Delivered => {
                sink.counts.sent.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(sink = %endpoint.key, event = %delivery.kind, attempt, "webhook notification delivered");
                return;
            }
            Step::GiveUp(why) => {
                sink.counts.failed.fetch_add(1, Ordering::Relaxed);
                // Scheme and host only: a token may be in the URL's path or query.
                tracing::warn!(
                    sink = %endpoint.key,
                    url = %endpoint.url,
                    event = %delivery.kind,
                    delivery = %delivery.id,
                    "webhook notification not delivered: {why}"
                );
                return;
            }
            Step::Retry(wait) => {
                tracing::debug!(sink = %endpoint.key, event = %delivery.kind, attempt, ?outcome, ?wait, "webhook notification to be retried");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
        }
    }
}

/// One attempt: the request, up to its status, within the policy's timeout.
async fn send(
    client: &HttpsClient<Full<Bytes>>,
    retry: &RetryPolicy,
    endpoint: &Endpoint,
    delivery: &Delivery,
) -> Attempt {
    let mut request = http::Request::post(endpoint.url.uri().clone())
        .header(CONTENT_TYPE, "application/json")
        .header(USER_AGENT, AGENT)
        .header(EVENT_HEADER, delivery.kind.name())
        .header(DELIVERY_HEADER, &delivery.id);
    if let Some(signature) = &delivery.signature {
        request = request.header(SIGNATURE_HEADER, signature);
    }
    let request = match request.body(Full::new(delivery.body.clone())) {
        Ok(request) => request,
        Err(err) => return Attempt::Failed(format!("cannot build the request ({err})")),
    };
    match tokio::time::timeout(retry.timeout, client.request(request)).await {
        Err(_) => Attempt::TimedOut,
        Ok(Err(err)) => Attempt::Failed(failure(&err)),
        Ok(Ok(response)) => Attempt::Answered {
            status: response.status(),
            retry_after: retry_after(response.headers().get(http::header::RETRY_AFTER)),
        },
    }
}

/// Why a request got no answer, its causes included. hyper's errors name no URL.
fn failure(err: &hyper_util::client::legacy::Error) -> String {
    let mut why = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        why.push_str(": ");
        why.push_str(&cause.to_string());
        source = cause.source();
    }
    why
}

/// Which of an endpoint's [`Counts`] a metric family reads.
type Field = fn(&Counts) -> &AtomicU64;

/// `rm_notifications_{sent,failed,dropped}_total{sink,host}` (CONTRACT §10).
pub(crate) struct WebhookMetrics {
    sinks: Vec<Arc<Sink>>,
}

impl fmt::Debug for WebhookMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookMetrics").finish_non_exhaustive()
    }
}

impl Collector for WebhookMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let families: [(&str, &str, Field); 3] = [
            (
                "rm_notifications_sent",
                "Webhook notifications delivered (answered 2xx), by endpoint",
                |c| &c.sent,
            ),
            (
                "rm_notifications_failed",
                "Webhook notifications given up (a final answer, or every attempt failed), by endpoint",
                |c| &c.failed,
            ),
            (
                "rm_notifications_dropped",
                "Webhook notifications dropped unsent from a full queue, by endpoint",
                |c| &c.dropped,
            ),
        ];
        for (name, help, field) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for sink in &self.sinks {
                let labels = [
                    ("sink", sink.endpoint.key.as_str()),
                    ("host", sink.endpoint.url.host()),
                ];
                let value = field(&sink.counts).load(Ordering::Relaxed);
                ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
