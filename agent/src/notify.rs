//! Desktop notifications for the few things an operator at the desk should hear about without
//! watching logs: webhooks stopped, GitHub refusing the credentials, runners failing to start,
//! demand waiting at full capacity. Off unless `[notifications] desktop = true`.
//!
//! Sent through the desktop's notification server over the D-Bus session bus (notify-rust with
//! zbus: no C library), on a thread of its own so that the async runtime never waits for it. At
//! most one notification per kind of event per [`MIN_INTERVAL`], so a flapping state does not
//! flood the desktop. On a host without a desktop session (a server, a systemd service) every
//! notification is a logged no-op: never an error, never a panic.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The least time between two notifications of the same kind. A state that flaps every minute
/// is worth one notification per quarter hour, not one per flap.
pub const MIN_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// The application name the notification server shows.
pub const APP_NAME: &str = "rm-agent";

/// The session bus's address; without it there is no desktop session to notify.
pub const SESSION_BUS_ENV: &str = "DBUS_SESSION_BUS_ADDRESS";

/// Something the operator should hear about.
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
}

/// The kind of an event: the unit the rate limit counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    WebhooksStopped,
    CredentialsRejected,
    RunnersFailingToStart,
    DemandWaitingAtCapacity,
    HostUnfit,
}

impl OperatorEvent {
    pub fn kind(&self) -> EventKind {
        match self {
            OperatorEvent::WebhooksStopped => EventKind::WebhooksStopped,
            OperatorEvent::CredentialsRejected => EventKind::CredentialsRejected,
            OperatorEvent::RunnersFailingToStart { .. } => EventKind::RunnersFailingToStart,
            OperatorEvent::DemandWaitingAtCapacity { .. } => EventKind::DemandWaitingAtCapacity,
            OperatorEvent::HostUnfit { .. } => EventKind::HostUnfit,
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

/// What became of one event.
#[derive(Debug)]
pub enum Dispatch {
    /// Notifications are off.
    Disabled,
    /// One of the same kind went out less than [`MIN_INTERVAL`] ago.
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

/// Sends [`OperatorEvent`]s to the desktop, rate-limited per kind.
#[derive(Debug)]
pub struct Notifier {
    enabled: bool,
    limit: Mutex<RateLimit>,
}

impl Notifier {
    /// A notifier; `enabled` is `[notifications] desktop`.
    pub fn new(enabled: bool) -> Self {
        Notifier {
            enabled,
            limit: Mutex::new(RateLimit::default()),
        }
    }

    /// Tells the operator, if enabled and not rate-limited. Never blocks, never fails.
    pub fn notify(&self, event: OperatorEvent) {
        let _ = self.dispatch(event);
    }

    /// As [`Notifier::notify`], and says what became of the event.
    pub fn dispatch(&self, event: OperatorEvent) -> Dispatch {
        if !self.enabled {
            return Dispatch::Disabled;
        }
        let admitted = self
            .limit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(event.kind(), Instant::now());
        if !admitted {
            tracing::debug!(kind = ?event.kind(), "desktop notification rate-limited");
            return Dispatch::RateLimited;
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
mod tests {
    use super::*;

    #[test]
    fn one_notification_per_kind_per_interval() {
        let t0 = Instant::now();
        assert!(may_send(None, t0));
        assert!(!may_send(Some(t0), t0));
        assert!(!may_send(
            Some(t0),
            t0 + MIN_INTERVAL - Duration::from_secs(1)
        ));
        assert!(may_send(Some(t0), t0 + MIN_INTERVAL));
        // A clock that went backwards (it cannot, with Instant) would not open the gate early.
        assert!(!may_send(Some(t0 + Duration::from_secs(5)), t0));

        let mut limit = RateLimit::default();
        assert!(limit.admit(EventKind::WebhooksStopped, t0));
        assert!(!limit.admit(EventKind::WebhooksStopped, t0 + Duration::from_secs(60)));
        assert!(
            limit.admit(EventKind::CredentialsRejected, t0 + Duration::from_secs(60)),
            "kinds are counted apart"
        );
        assert!(limit.admit(EventKind::WebhooksStopped, t0 + MIN_INTERVAL));
        assert!(!limit.admit(EventKind::WebhooksStopped, t0 + MIN_INTERVAL));
    }

    #[test]
    fn events_of_one_kind_share_the_limit_whatever_their_policy() {
        let a = OperatorEvent::RunnersFailingToStart {
            policy: "a".into(),
            failures: 3,
        };
        let b = OperatorEvent::RunnersFailingToStart {
            policy: "b".into(),
            failures: 1,
        };
        assert_eq!(a.kind(), b.kind());
    }

    #[test]
    fn messages_say_what_happened_and_what_to_do() {
        let (summary, body) = OperatorEvent::DemandWaitingAtCapacity {
            policy: "linux".into(),
            waiting: 7,
        }
        .message();
        assert!(summary.contains("linux"), "{summary}");
        assert!(
            body.contains("7 jobs") && body.contains("max_runners"),
            "{body}"
        );
        let (_, body) = OperatorEvent::CredentialsRejected.message();
        assert!(body.contains("rm-agent check"), "{body}");
    }

    #[test]
    fn a_disabled_notifier_sends_nothing() {
        let notifier = Notifier::new(false);
        for _ in 0..3 {
            assert!(matches!(
                notifier.dispatch(OperatorEvent::WebhooksStopped),
                Dispatch::Disabled
            ));
        }
    }
}
