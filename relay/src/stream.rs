//! One open stream, in either form: a task that catches up from the store, then waits for the
//! ingest path's notification (no polling delay), writes each delivery once and in id order,
//! keeps the connection alive, re-checks a relay stream's token, and ends on shutdown, on
//! revocation or when the client goes away. The response body is the task's channel.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior, interval_at};

use crate::metrics::{RELAY_FORM, SMEE_FORM, StreamLabels};
use crate::sse::{self, StoredDelivery};
use crate::state::Relay;
use crate::store;

/// A comment line (or smee's ping) is written after this long without anything else: below
/// the idle timeouts of common proxies (nginx's 60 s) and NAT mappings.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// How often an open relay stream checks that its token is still valid, so `channel revoke`
/// (another process, writing the same file) closes it within this long.
pub const TOKEN_RECHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Frames queued between the stream's task and the connection; a slow client holds the task
/// back here instead of growing memory.
const STREAM_BUFFER_FRAMES: usize = 4;

/// Which form a stream has and, for the relay form, whose token opened it.
pub enum Form {
    /// `/subscribe/NAME` for a host: base64 bodies, `event: delivery`.
    Relay {
        host: String,
        /// The digest of the token that opened the stream (the token itself is not kept).
        digest: String,
    },
    /// `/smee/ID`: what smee.io sends.
    Smee,
}

impl Form {
    fn labels(&self) -> StreamLabels {
        match self {
            Form::Relay { .. } => RELAY_FORM,
            Form::Smee => SMEE_FORM,
        }
    }

    fn event(&self, delivery: &StoredDelivery) -> Bytes {
        match self {
            Form::Relay { .. } => sse::delivery_event(delivery),
            Form::Smee => sse::smee_event(delivery),
        }
    }

    fn keepalive(&self) -> Bytes {
        match self {
            Form::Relay { .. } => Bytes::from_static(sse::KEEPALIVE),
            Form::Smee => Bytes::from_static(sse::SMEE_PING),
        }
    }
}

/// A response body fed by a stream's task; it ends when the task does.
pub struct FrameBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for FrameBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|frame| frame.map(|b| Ok(Frame::data(b))))
    }
}

/// Starts a stream of `channel`'s deliveries with ids above `after`.
pub fn open(relay: Arc<Relay>, channel: String, after: i64, form: Form) -> FrameBody {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER_FRAMES);
    tokio::spawn(run(relay, tx, channel, after, form));
    FrameBody { rx }
}

/// Why a stream ended, for the log.
#[derive(Debug)]
enum End {
    ClientGone,
    Shutdown,
    Revoked,
    StoreFailed,
}

async fn run(relay: Arc<Relay>, tx: mpsc::Sender<Bytes>, channel: String, after: i64, form: Form) {
    let labels = form.labels();
    let _counted = relay.metrics.subscriber(labels);
    tracing::debug!(%channel, form = labels.form, after, "stream opened");
    let end = pump(&relay, &tx, &channel, after, &form).await;
    tracing::debug!(%channel, form = labels.form, ?end, "stream closed");
}

async fn pump(
    relay: &Relay,
    tx: &mpsc::Sender<Bytes>,
    channel: &str,
    mut cursor: i64,
    form: &Form,
) -> End {
    let mut notify = relay.notify.subscribe();
    let mut shutdown = relay.shutdown.subscribe();
    if matches!(form, Form::Smee) && tx.send(Bytes::from_static(sse::SMEE_READY)).await.is_err() {
        return End::ClientGone;
    }
    let mut keepalive = interval_at(Instant::now() + KEEPALIVE_INTERVAL, KEEPALIVE_INTERVAL);
    keepalive.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let relay_form = matches!(form, Form::Relay { .. });
    let mut next_recheck = Instant::now() + TOKEN_RECHECK_INTERVAL;
    loop {
        // Mark the current notification seen before reading, so a delivery committed after
        // the read below wakes the wait instead of being missed.
        notify.borrow_and_update();
        loop {
            let owned = channel.to_owned();
            let batch = match relay
                .store
                .read(move |conn| store::deliveries_after(conn, &owned, cursor))
                .await
            {
                Ok(batch) => batch,
                Err(err) => {
                    // The client reconnects with its Last-Event-ID and misses nothing.
                    tracing::warn!(%channel, error = %err, "cannot read deliveries; closing the stream");
                    return End::StoreFailed;
                }
            };
            if batch.is_empty() {
                break;
            }
            for delivery in &batch {
                tokio::select! {
                    sent = tx.send(form.event(delivery)) => if sent.is_err() {
                        return End::ClientGone;
                    },
                    () = stopped(&mut shutdown) => return End::Shutdown,
                }
                cursor = delivery.id;
                relay.metrics.event_sent(form.labels());
            }
            keepalive.reset();
            // A long catch-up still honours a revocation.
            if relay_form && Instant::now() >= next_recheck {
                if !token_still_valid(relay, channel, form).await {
                    return End::Revoked;
                }
                next_recheck = Instant::now() + TOKEN_RECHECK_INTERVAL;
            }
        }
        tokio::select! {
            biased;
            () = stopped(&mut shutdown) => return End::Shutdown,
            () = tx.closed() => return End::ClientGone,
            () = tokio::time::sleep_until(next_recheck), if relay_form => {
                if !token_still_valid(relay, channel, form).await {
                    return End::Revoked;
                }
                next_recheck = Instant::now() + TOKEN_RECHECK_INTERVAL;
            }
            changed = notify.changed() => if changed.is_err() {
                return End::Shutdown;
            },
            _ = keepalive.tick() => if tx.send(form.keepalive()).await.is_err() {
                return End::ClientGone;
            },
        }
    }
}

/// Resolves once the relay is shutting down.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stopping| *stopping).await;
}

/// Whether the token that opened a relay stream is still the host's token on the channel. A
/// failed read keeps the stream: a busy database is not a revocation.
async fn token_still_valid(relay: &Relay, channel: &str, form: &Form) -> bool {
    let Form::Relay { host, digest } = form else {
        return true;
    };
    let (owned_channel, owned_digest) = (channel.to_owned(), digest.clone());
    match relay
        .store
        .read(move |conn| store::host_for_token(conn, &owned_channel, &owned_digest))
        .await
    {
        Ok(found) => found.as_deref() == Some(host.as_str()),
        Err(err) => {
            tracing::warn!(%channel, error = %err, "cannot re-check a stream's token");
            true
        }
    }
}
