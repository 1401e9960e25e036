//! The relay subscription (`[relay]`): for a host behind NAT, deliveries come from an `rm-relay`
//! channel's event stream instead of a local receiver. Each delivery is held to the receiver's
//! rules (headers, then this host's own webhook secrets over the exact body bytes), journalled
//! with source `relay`, and only then acknowledged, so a crash between the two costs a repeat
//! (the journal answers "already journalled"), never a loss. Within a run the stream resumes
//! from the last journalled id (`Last-Event-ID`); after a restart the relay resumes after the
//! last acknowledged one. The protocol is in docs/relay.md.

mod event;
mod sse;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use rm_journal::{Journal, JournalError};
use rm_receiver::WebhookSecrets;
use rm_vocab::Source;
use secrecy::{ExposeSecret as _, SecretString};
use tokio::sync::watch;

pub(crate) use event::Backoff;

/// How long connecting and getting the stream's response headers may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// rm-relay sends a keepalive comment every 15 s; a stream silent for this long is dead (a NAT
/// box dropped it without a reset) and is reopened.
pub(crate) const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(45);
/// How long one acknowledgement may take before it is tried again.
pub(crate) const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause before an acknowledgement that failed is sent again.
pub(crate) const ACK_RETRY: Duration = Duration::from_secs(2);

type HttpClient = rm_runner::https::HttpsClient<Full<Bytes>>;

/// What the subscription reports, for `status`, `/metrics` and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RelayState {
    /// The stream is open now.
    pub connected: bool,
    /// The last delivery id journalled (or refused for good) in this run.
    pub last_event_id: Option<u64>,
    /// Deliveries journalled in this run (new or already journalled).
    pub journalled: u64,
    /// Deliveries refused: signature, headers or body not acceptable.
    pub refused: u64,
    /// Why the last connection failed or ended, in words; `None` while connected.
    pub problem: Option<String>,
}

/// Whether the relay at `url` takes `token`: opens the stream and closes it at once (nothing is
/// acknowledged, so what the relay keeps for this host does not change). For `rm-agent check`.
pub(crate) async fn probe(url: &str, token: &SecretString) -> anyhow::Result<()> {
    let client = http_client()?;
    open(&client, url.trim_end_matches('/'), token, None)
        .await
        .map(drop)
}

fn http_client() -> anyhow::Result<HttpClient> {
    rm_runner::https::client()
        .context("cannot load this host's TLS root certificates for the relay")
}

/// Opens the event stream, after `resume_after` when given; the response once the relay said 200.
async fn open(
    client: &HttpClient,
    url: &str,
    token: &SecretString,
    resume_after: Option<u64>,
) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
    let mut request = Request::get(url)
        .header(header::ACCEPT, "text/event-stream")
        .header(
            header::AUTHORIZATION,
            format!("Bearer {}", token.expose_secret()),
        );
    if let Some(id) = resume_after {
        request = request.header("last-event-id", id.to_string());
    }
    let request = request
        .body(Full::new(Bytes::new()))
        .context("relay.url is not a valid URL")?;
    let response = tokio::time::timeout(CONNECT_TIMEOUT, client.request(request))
        .await
        .context("the relay did not answer in time")?
        .context("cannot reach the relay")?;
    match response.status() {
        StatusCode::OK => Ok(response),
        StatusCode::UNAUTHORIZED => anyhow::bail!(
            "the relay refused this host's token (401): issue a new one with `rm-relay channel token CHANNEL HOST` and put it in relay.token_file"
        ),
        StatusCode::NOT_FOUND => {
            anyhow::bail!("the relay has no such subscribe URL (404): check relay.url")
        }
        status => anyhow::bail!("the relay answered {status}"),
    }
}

/// A subscription to one rm-relay channel.
pub(crate) struct Subscription {
    url: String,
    ack_url: String,
    token: SecretString,
    secrets: Arc<WebhookSecrets>,
    journal: Journal,
    client: HttpClient,
    state: watch::Sender<RelayState>,
}

impl Subscription {
    /// `url` is the subscribe URL `rm-relay channel add` printed.
    pub(crate) fn new(
        url: &str,
        token: SecretString,
        secrets: Arc<WebhookSecrets>,
        journal: Journal,
    ) -> anyhow::Result<Self> {
        let url = url.trim_end_matches('/').to_owned();
        Ok(Self {
            ack_url: format!("{url}/ack"),
            url,
            token,
            secrets,
            journal,
            client: http_client()?,
            state: watch::Sender::new(RelayState::default()),
        })
    }

    /// The subscribe URL (it names the channel; the token travels in a header).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The subscription's state, updated as it changes.
    pub(crate) fn state(&self) -> watch::Receiver<RelayState> {
        self.state.subscribe()
    }

    /// Streams deliveries into the journal until `stop` turns true, reconnecting with
    /// [`Backoff`]. Acknowledgements run beside it and are flushed before it returns.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let (acked_tx, acked_rx) = watch::channel(None::<u64>);
        let acks = tokio::spawn(Arc::clone(&this).acknowledge(acked_rx, stop.clone()));
        let mut backoff = Backoff::default();
        let mut resume_after = None;
        while !*stop.borrow() {
            let opened = Instant::now();
            let ended = tokio::select! {
                ended = this.stream(&mut resume_after, &acked_tx) => ended,
                _ = stop.wait_for(|s| *s) => break,
            };
            let problem = match ended {
                Ok(()) => "the relay closed the stream".to_owned(),
                Err(err) => format!("{err:#}"),
            };
            let wait = backoff.after(opened.elapsed());
            tracing::warn!(problem = %problem, retry_in = ?wait, "relay subscription interrupted");
            this.state.send_modify(|s| {
                s.connected = false;
                s.problem = Some(problem);
            });
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        this.state.send_modify(|s| s.connected = false);
        drop(acked_tx);
        let _ = acks.await;
    }

    /// One connection: open the stream and journal what it brings until it ends.
    async fn stream(
        &self,
        resume_after: &mut Option<u64>,
        acked: &watch::Sender<Option<u64>>,
    ) -> anyhow::Result<()> {
        let response = open(&self.client, &self.url, &self.token, *resume_after).await?;
        tracing::info!(resume_after = ?resume_after, "relay subscription open");
        self.state.send_modify(|s| {
            s.connected = true;
            s.problem = None;
        });
        // The idle bound is on bytes, not events: keepalive comments never become events.
        let mut body = response.into_body().into_data_stream();
        // Bounded per event (sse::MAX_EVENT_BYTES): an event that never ends drops the
        // connection and `run` reconnects with back-off, instead of buffering without end.
        let mut parser = sse::Parser::default();
        loop {
            let chunk = match tokio::time::timeout(STREAM_IDLE_TIMEOUT, body.next()).await {
                Ok(None) => break,
                Ok(Some(chunk)) => chunk.context("the relay stream broke")?,
                Err(_) => anyhow::bail!("the relay stream went silent (no keepalive)"),
            };
            let events = parser
                .push(&chunk)
                .context("the relay stream is unreadable")?;
            for event in events {
                if event.event != event::DELIVERY_EVENT {
                    continue;
                }
                let Some(id) = event::event_id(&event.id) else {
                    tracing::warn!(id = %event.id, "relay event without a numeric id; ignored");
                    continue;
                };
                self.deliver(id, &event.data).await?;
                *resume_after = Some(id);
                acked.send_replace(Some(id));
                self.state.send_modify(|s| s.last_event_id = Some(id));
            }
        }
        Ok(())
    }

    /// Journals one delivery. `Err` only when the journal cannot take it: the stream is then
    /// reopened later from the last journalled id, and this one is not acknowledged.
    async fn deliver(&self, id: u64, data: &str) -> anyhow::Result<()> {
        let relayed = match event::decode(data) {
            Ok(relayed) => relayed,
            Err(err) => {
                tracing::warn!(id, error = %err, "relayed delivery refused");
                self.state.send_modify(|s| s.refused += 1);
                return Ok(());
            }
        };
        let incoming = rm_receiver::envelope(&relayed.headers).and_then(|envelope| {
            envelope.verify(&self.secrets, relayed.body, rm_vocab::now(), Source::Relay)
        });
        let incoming = match incoming {
            Ok(incoming) => incoming,
            Err(refusal) => {
                // Never acceptable, so it is acknowledged like a journalled one: holding it
                // back would only replay it forever.
                tracing::warn!(
                    id,
                    reason = refusal.reason,
                    "relayed delivery refused: {}",
                    refusal.detail
                );
                self.state.send_modify(|s| s.refused += 1);
                return Ok(());
            }
        };
        let guid = incoming.guid.clone();
        // Judged as the receiver judges: off the async workers when the body is large.
        let recorded = match rm_receiver::judge(incoming).await {
            Ok(judged) => self.journal.record_judged(judged).await,
            Err(refused) => Err(refused),
        };
        match recorded {
            Ok(recorded) => {
                tracing::debug!(id, %guid, ?recorded, "relayed delivery journalled");
                self.state.send_modify(|s| s.journalled += 1);
                Ok(())
            }
            Err(JournalError::NotJson) => {
                tracing::warn!(id, %guid, "relayed delivery refused: the body is not JSON");
                self.state.send_modify(|s| s.refused += 1);
                Ok(())
            }
            Err(err) => Err(err).context("the journal cannot take relayed deliveries now"),
        }
    }

    /// Tells the relay the latest journalled id, coalescing: only the newest id is sent.
    async fn acknowledge(
        self: Arc<Self>,
        mut journalled: watch::Receiver<Option<u64>>,
        stop: watch::Receiver<bool>,
    ) {
        let mut sent = None;
        loop {
            let target = *journalled.borrow_and_update();
            if let Some(id) = target.filter(|id| Some(*id) != sent) {
                match self.send_ack(id).await {
                    Ok(()) => sent = Some(id),
                    Err(err) => {
                        tracing::warn!(id, error = %format!("{err:#}"), "relay acknowledgement failed; retrying");
                        if *stop.borrow() {
                            // Shutting down: the relay replays from its last ack and the journal
                            // answers "already journalled".
                            return;
                        }
                        tokio::time::sleep(ACK_RETRY).await;
                        continue;
                    }
                }
            }
            if journalled.changed().await.is_err() {
                // The stream side ended; one last look so the final id is not left unsent.
                let last = *journalled.borrow();
                if let Some(id) = last.filter(|id| Some(*id) != sent)
                    && let Err(err) = self.send_ack(id).await
                {
                    tracing::warn!(id, error = %format!("{err:#}"), "final relay acknowledgement failed");
                }
                return;
            }
        }
    }

    async fn send_ack(&self, id: u64) -> anyhow::Result<()> {
        let body = serde_json::json!({ "id": id }).to_string();
        let request = Request::post(&self.ack_url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::AUTHORIZATION,
                format!("Bearer {}", self.token.expose_secret()),
            )
            .body(Full::new(Bytes::from(body)))
            .context("the relay ack URL is not a valid request URI")?;
        let response = tokio::time::timeout(ACK_TIMEOUT, self.client.request(request))
            .await
            .context("the relay did not answer the acknowledgement in time")?
            .context("cannot reach the relay")?;
        let status = response.status();
        anyhow::ensure!(
            status.is_success(),
            "the relay answered {status} to an acknowledgement"
        );
        Ok(())
    }
}
