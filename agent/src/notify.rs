//! Operator notifications for the few things an operator should hear about without watching
//! logs: webhooks stopped, GitHub refusing the credentials, runners failing to start, demand
//! waiting at full capacity, the host unfit. Owns which events go out and when; two sinks carry
//! them: the desktop (`[notifications] desktop = true`) and webhooks
//! (`[[notifications.webhook]]`, [`webhook`], with the body in [`body`] and the retry rules in
//! [`retry`]). Off unless one is configured.
//!
//! At most one notification per kind of event per [`MIN_INTERVAL`], whichever the sink, so a
//! flapping state floods neither the desktop nor a chat channel behind a webhook.
//! [`Notifier::notify`] never blocks and never fails: the desktop's is sent on a thread of its
//! own, through the desktop's notification server over the D-Bus session bus (notify-rust with
//! zbus: no C library); a webhook's is queued for the webhook thread. On a host without a
//! desktop session (a server, a systemd service) a desktop notification is a logged no-op.

mod body;
mod retry;
mod webhook;

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;

pub use crate::config::notifications::EventKind;
pub use webhook::SinkCounts;

use crate::config::Config;
use crate::exit::Exit;

/// The least time between two notifications of the same kind. A state that flaps every minute
/// is worth one notification per quarter hour, not one per flap.
pub const MIN_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// The application name the notification server shows.
pub const APP_NAME: &str = "rm-agent";

/// The session bus's address; without it there is no desktop session to notify.
pub const SESSION_BUS_ENV: &str = "DBUS_SESSION_BUS_ADDRESS";

/// Something the operator should hear about. Each variant is one [`EventKind`]; a webhook body
/// carries its fields ([`body`], CONTRACT §10). A new event (a job re-run, a runner's attributed
/// failure such as `oom_killed`) is a variant here with its own fields, a kind beside it, its
/// message and its body fields; the compiler names each `match` to extend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorEvent {
    /// No webhook arrived for long while GitHub had work: polling took over finding jobs.
    WebhooksStopped,
    /// GitHub refused the App's JWT or an installation token (401).
    CredentialsRejected,
    /// Runners of a policy failed to start this many times in a row.
    RunnersFailingToStart { policy: String, failures: u32 },
    /// Jobs of a policy have waited long while every runner slot was busy.
    DemandWaitingAtCapacity { policy: String, waiting: u32 },
    /// The fitness gate found the host unfit: no new runner is registered ([`crate::fitness`]).
    HostUnfit { problems: Vec<String> },
    /// rm asked GitHub to re-run a job the infrastructure killed (`policy.rerun_on`), and what
    /// came of it: `result` is `sent`, `refused` or `unknown` (`crate::rerun`).
    JobRerun {
        policy: String,
        job_id: i64,
        reason: String,
        result: String,
        /// GitHub's refusal or why the outcome is unknown; empty when sent.
        detail: String,
    },
    /// A runner ended for a cause the infrastructure, not the job's code, names: the kernel
    /// killed it for memory, the disk was full, it crashed mid-job, it was a ghost, or the host
    /// was lost under it (`crate::lifecycle::FailureReason`'s attributed kinds).
    RunnerFailed {
        policy: String,
        runner_name: String,
        /// The job it had, when the journal knows it.
        job_id: Option<i64>,
        reason: String,
        /// The journal's evidence sentence.
        detail: String,
    },
    /// A scale set's listener backs off: after an answer of the Actions service it does not
    /// know, or after failures in a row (`crate::scaleset::listen`). Its jobs wait meanwhile.
    ScaleSetBackingOff {
        scale_set: String,
        /// The last failure's error.
        reason: String,
    },
}

impl OperatorEvent {
    pub fn kind(&self) -> EventKind {
        match self {
            OperatorEvent::WebhooksStopped => EventKind::WebhooksStopped,
            OperatorEvent::CredentialsRejected => EventKind::CredentialsRejected,
            OperatorEvent::RunnersFailingToStart { .. } => EventKind::RunnersFailingToStart,
            OperatorEvent::DemandWaitingAtCapacity { .. } => EventKind::DemandWaitingAtCapacity,
            OperatorEvent::HostUnfit { .. } => EventKind::HostUnfit,
            OperatorEvent::JobRerun { .. } => EventKind::JobRerun,
            OperatorEvent::RunnerFailed { .. } => EventKind::RunnerFailed,
            OperatorEvent::ScaleSetBackingOff { .. } => EventKind::ScaleSetBackingOff,
        }
    }

    /// The notification's summary and body: what happened and what to do.
    pub fn message(&self) -> (String, String) {
        match self {
            OperatorEvent::WebhooksStopped => (
                "rm: webhooks stopped".to_owned(),
                "No webhook delivery arrived for a while; polling GitHub took over. Check the App's webhook URL and the receiver (rm-agent status).".to_owned(),
            ),
            OperatorEvent::CredentialsRejected => (
                "rm: GitHub rejected the App's credentials".to_owned(),
                "No runner can be registered. Run `rm-agent check` to see what to fix.".to_owned(),
            ),
            OperatorEvent::RunnersFailingToStart { policy, failures } => (
                format!("rm: runners of policy {policy} fail to start"),
                format!(
                    "{failures} attempts in a row failed. `rm-agent runners` shows their reasons."
                ),
            ),
            OperatorEvent::DemandWaitingAtCapacity { policy, waiting } => (
                format!("rm: jobs of policy {policy} wait at full capacity"),
                format!(
                    "{waiting} jobs wait while every runner slot is busy. Raise max_runners or add a host."
                ),
            ),
            OperatorEvent::HostUnfit { problems } => (
                "rm: host unfit, no new runners".to_owned(),
                format!(
                    "{}. `rm-agent status` says more; allocation resumes by itself once fixed.",
                    problems.join("; ")
                ),
            ),
            OperatorEvent::JobRerun {
                policy,
                job_id,
                reason,
                result,
                detail,
            } => (
                format!("rm: job {job_id} of policy {policy} re-run ({result})"),
                match result.as_str() {
                    "sent" => format!(
                        "Its runner ended with {reason}; GitHub queued the job again. `rm-agent explain {job_id}` says more."
                    ),
                    _ => format!(
                        "Its runner ended with {reason}; the re-run is {result}: {detail}. `rm-agent explain {job_id}` says more."
                    ),
                },
            ),
            OperatorEvent::RunnerFailed {
                policy,
                runner_name,
                job_id,
                reason,
                detail,
            } => (
                format!("rm: a runner of policy {policy} ended {reason}"),
                match job_id {
                    Some(job) => format!(
                        "{runner_name} (job {job}): {detail}. `rm-agent explain {job}` and `rm-agent logs {job}` say more."
                    ),
                    None => format!(
                        "{runner_name}: {detail}. `rm-agent logs {runner_name}` shows its logs."
                    ),
                },
            ),
            OperatorEvent::ScaleSetBackingOff { scale_set, reason } => (
                format!("rm: scale set {scale_set}'s listener backs off"),
                format!(
                    "{reason}. Its jobs wait until the Actions service answers again; `rm-agent status` shows the listener's note."
                ),
            ),
        }
    }
}

/// Whether a notification whose kind was last sent at `last` may be sent at `now`.
pub fn may_send(last: Option<Instant>, now: Instant) -> bool {
    last.is_none_or(|last| now.saturating_duration_since(last) >= MIN_INTERVAL)
}

/// The time each kind was last let through.
#[derive(Debug, Default)]
struct RateLimit {
    last: HashMap<EventKind, Instant>,
}

impl RateLimit {
    /// Lets `kind` through at `now` if [`may_send`] says so, and remembers it.
    fn admit(&mut self, kind: EventKind, now: Instant) -> bool {
        if may_send(self.last.get(&kind).copied(), now) {
            self.last.insert(kind, now);
            true
        } else {
            false
        }
    }
}

/// What became of one event, on the desktop; a webhook endpoint that wants it has it queued
/// unless it was [`Dispatch::RateLimited`].
#[derive(Debug)]
pub enum Dispatch {
    /// Desktop notifications are off.
    Disabled,
    /// One of the same kind went out less than [`MIN_INTERVAL`] ago: on no sink.
    RateLimited,
    /// No desktop session on this host (no session bus address).
    NoSession,
    /// The sending thread could not be started.
    Failed,
    /// On its way, on its own thread.
    Sending(Sending),
}

/// A notification being sent.
#[derive(Debug)]
pub struct Sending(JoinHandle<bool>);

impl Sending {
    /// Waits for the notification server's answer: `true` when it took the notification.
    pub fn wait(self) -> bool {
        self.0.join().unwrap_or(false)
    }
}

/// Sends [`OperatorEvent`]s to the desktop and the webhooks, rate-limited per kind.
#[derive(Debug)]
pub struct Notifier {
    /// `[notifications] desktop`.
    desktop: bool,
    limit: Mutex<RateLimit>,
    /// `[[notifications.webhook]]`, started; `None` without any.
    webhooks: Option<webhook::Webhooks>,
}

impl Notifier {
    /// A notifier to the desktop alone; `desktop` is `[notifications] desktop`.
    pub fn new(desktop: bool) -> Self {
        Notifier {
            desktop,
            limit: Mutex::new(RateLimit::default()),
            webhooks: None,
        }
    }

    /// A notifier to the desktop (if `desktop`) and to `webhooks`, whose thread is started.
    fn with_webhooks(desktop: bool, webhooks: webhook::Webhooks) -> Self {
        Notifier {
            webhooks: Some(webhooks),
            ..Notifier::new(desktop)
        }
    }

    /// Each webhook endpoint's counts, in configuration order (none without webhooks).
    pub fn webhook_counts(&self) -> Vec<SinkCounts> {
        self.webhooks
            .as_ref()
            .map_or_else(Vec::new, webhook::Webhooks::counts)
    }

    /// The webhook endpoints' counts for `/metrics`; `None` without webhooks.
    pub(crate) fn metrics(&self) -> Option<webhook::WebhookMetrics> {
        self.webhooks.as_ref().map(webhook::Webhooks::metrics)
    }

    /// Tells the operator, if a sink is configured and the kind is not rate-limited. Never
    /// blocks, never fails.
    pub fn notify(&self, event: OperatorEvent) {
        let _ = self.dispatch(event);
    }

    /// As [`Notifier::notify`], and says what became of the event on the desktop.
    pub fn dispatch(&self, event: OperatorEvent) -> Dispatch {
        if !self.desktop && self.webhooks.is_none() {
            return Dispatch::Disabled;
        }
        let admitted = self
            .limit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(event.kind(), Instant::now());
        if !admitted {
            tracing::debug!(kind = ?event.kind(), "notification rate-limited");
            return Dispatch::RateLimited;
        }
        if let Some(webhooks) = &self.webhooks {
            webhooks.enqueue(&event, SystemTime::now());
        }
        if !self.desktop {
            return Dispatch::Disabled;
        }
        if !has_session() {
            tracing::info!(
                kind = ?event.kind(),
                "no desktop session (${SESSION_BUS_ENV} is not set): desktop notification not shown"
            );
            return Dispatch::NoSession;
        }
        let (summary, body) = event.message();
        let kind = event.kind();
        match std::thread::Builder::new()
            .name("rm-notify".to_owned())
            .spawn(move || send(kind, &summary, &body))
        {
            Ok(handle) => Dispatch::Sending(Sending(handle)),
            Err(err) => {
                tracing::info!(?kind, "desktop notification not shown: no thread ({err})");
                Dispatch::Failed
            }
        }
    }
}

/// The notifier `[notifications]` asks for: the desktop's, and each webhook endpoint with its
/// secret read now (once: a changed secret needs a restart) and its thread started. A secret
/// file that cannot be read or that others can read is a usage error, as for every secret.
pub(crate) fn from_config(config: &Config) -> Result<Notifier, Exit> {
    if config.webhook_notifications.is_empty() {
        return Ok(Notifier::new(config.desktop_notifications));
    }
    let mut endpoints = Vec::with_capacity(config.webhook_notifications.len());
    for (index, webhook) in config.webhook_notifications.iter().enumerate() {
        let key = format!("notifications.webhook[{index}]");
        let secret = match &webhook.secret_file {
            Some(path) => Some(crate::secrets::notification_secret(
                path,
                &format!("{key}.secret_file"),
            )?),
            None => None,
        };
        endpoints.push(webhook::Endpoint {
            key,
            url: webhook.url.clone(),
            secret,
            events: webhook.events.clone(),
        });
    }
    let webhooks =
        webhook::Webhooks::new(config.host.name.clone(), endpoints, webhook::QUEUE_CAPACITY);
    let client = rm_runner::https::client()
        .context("cannot load this host's TLS root certificates for webhook notifications")
        .map_err(Exit::runtime)?;
    let webhooks = webhooks
        .start(client, retry::RetryPolicy::DEFAULT)
        .context("cannot start the webhook notification thread")
        .map_err(Exit::runtime)?;
    Ok(Notifier::with_webhooks(
        config.desktop_notifications,
        webhooks,
    ))
}

/// Whether there is a session bus to send to. macOS notifies through its own service.
fn has_session() -> bool {
    cfg!(target_os = "macos") || std::env::var_os(SESSION_BUS_ENV).is_some_and(|v| !v.is_empty())
}

/// Shows one notification; blocks its (own) thread until the server answers.
fn send(kind: EventKind, summary: &str, body: &str) -> bool {
    let result = notify_rust::Notification::new()
        .appname(APP_NAME)
        .summary(summary)
        .body(body)
        .show();
    match result {
        Ok(_) => {
            tracing::debug!(?kind, "desktop notification shown");
            true
        }
        Err(err) => {
            tracing::info!(?kind, "desktop notification not shown: {err}");
            false
        }
    }
}

#[cfg(test)]
mod tests;
