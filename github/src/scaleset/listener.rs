//! The scale-set listener's rules (`github-scale-sets.md` §1.7–1.10, §2.2–2.3): what to do
//! after each step of the session/poll cycle, as a pure function ([`decide`]), and a thin
//! driver ([`Listener`]) that applies it over a [`ScaleSetClient`].
//!
//! Every failure mode other listeners died of has a row here: an evicted session (a 404 on
//! its refresh, poll, acknowledgement or acquisition) gets a new session at once; an empty or
//! unreadable `200` is backed off and polled again, never an exit; 5xx bursts are backed off
//! with a bounded delay reset by the next answered poll; a `409` at start is our own stale
//! session (deleted by its journalled id) or another holder (standby, backed off, not an
//! error); a deleted scale set is handed back to the caller; an answer the rules do not know
//! (another 4xx) is backed off like a 5xx and said in the wait's reason, never a silent stall.
//!
//! The rules key on the status of an answer, the type name only refines it (the client's
//! mapping of answers to [`ScaleSetError`]): a service version, a GHES or a proxy in between
//! that names an answer otherwise, or not at all, is read the same way. GitHub's own listener
//! decides on the status too.
//!
//! Delivery contract: [`Listener::next`] hands out a message and never acknowledges it. The
//! caller journals the message durably first, then calls [`Listener::ack`]; a crash in between
//! gets the message again (redelivery until acknowledged, §1.10), which the journal dedups.
//! The caller also journals [`Listener::session_id`] whenever it changes (after each `next`),
//! and hands it back to [`Listener::new`] after a crash: a `409` on our own stale session is
//! then a delete and a create, not a standby until the service expires it. A create whose
//! answer was lost (a cancel mid-call, a dropped connection) leaves a session the listener
//! cannot know; that one is waited out on standby.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Message, ScaleSetClient, ScaleSetError, Session};
use crate::error::GithubError;

/// The first back-off after a transient failure (5xx, no answer, an unreadable `200`).
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest back-off: a broker down for minutes is tried at least this often, and never
/// in a hot loop.
pub const BACKOFF_CAP: Duration = Duration::from_secs(60);
/// The first wait on standby when another holder has the session (old ARC retried every
/// 30 s; the holder's session expires on the service's own schedule, undocumented).
pub const STANDBY_BASE: Duration = Duration::from_secs(30);
/// The longest wait on standby: a crashed holder's session is noticed gone within this.
pub const STANDBY_CAP: Duration = Duration::from_secs(300);

/// What the last step of the cycle returned, as far as the rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The poll delivered a message.
    Message,
    /// The poll was held and answered `202`: nothing to deliver.
    NoMessage,
    /// A session was created.
    SessionCreated,
    /// The journalled stale session was deleted (or the service no longer had it).
    StaleDeleted,
    /// An empty or unparseable `200` ([`ScaleSetError::UnreadableMessage`]).
    Unreadable,
    /// The session no longer exists ([`ScaleSetError::SessionGone`], refresh 404).
    SessionGone,
    /// Creating a session was refused: the set has one ([`ScaleSetError::SessionConflict`]).
    SessionConflict,
    /// A failure that passes: 5xx, 408, 429, no answer, a malformed answer.
    Transient,
    /// An answer the rules do not know: a 4xx other than 401, 403, 404, 408, 409 and 429, or
    /// a 404 or 409 where it means nothing known. It may be a proxy's or a new service
    /// version's, and may pass: backed off like a transient failure (at most [`BACKOFF_CAP`]),
    /// its error said in the wait's reason, never an exit.
    Unrecognised,
    /// The scale set does not exist ([`ScaleSetError::ScaleSetNotFound`]).
    ScaleSetNotFound,
    /// A refusal that will not pass by waiting (403, 401 after re-authentication).
    Permanent,
}

impl Outcome {
    /// The outcome `error` is.
    pub fn of(error: &ScaleSetError) -> Self {
        match error {
            ScaleSetError::SessionConflict { .. } => Self::SessionConflict,
            ScaleSetError::SessionGone { .. } => Self::SessionGone,
            ScaleSetError::ScaleSetNotFound { .. } => Self::ScaleSetNotFound,
            ScaleSetError::UnreadableMessage { .. } => Self::Unreadable,
            // An answer out of protocol (e.g. a session without a queue URL, §2.3) is broker
            // degradation: it passes.
            ScaleSetError::Unreachable { .. } | ScaleSetError::Unexpected { .. } => Self::Transient,
            // Not the listener's (runner removal), but it passes once the runner is idle.
            ScaleSetError::JobStillRunning { .. } => Self::Transient,
            ScaleSetError::Service { status, .. } => match *status {
                408 | 429 | 500.. => Self::Transient,
                401 | 403 => Self::Permanent,
                _ => Self::Unrecognised,
            },
            // The client already re-authenticated (admin) or refreshed (queue) once.
            ScaleSetError::Unauthorized { .. }
            | ScaleSetError::AgentExists { .. }
            | ScaleSetError::TokenRefused { .. } => Self::Permanent,
            ScaleSetError::Github(e) => match e {
                GithubError::RateLimited { .. }
                | GithubError::Server { .. }
                | GithubError::Unreachable { .. } => Self::Transient,
                _ => Self::Permanent,
            },
        }
    }
}

/// What the listener knows between steps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Transient failures since the last answered poll.
    pub failures: u32,
    /// Conflicts in a row while on standby (not failures: another holder is legitimate).
    pub standby_waits: u32,
    /// Whether the listener holds a session.
    pub has_session: bool,
    /// The id of a session of ours a previous process left open, read from the journal.
    pub stale_session: Option<String>,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Poll the queue with the session held.
    Poll,
    /// Create a session.
    CreateSession,
    /// Delete our stale session by its id, then create one.
    DeleteStaleSession { session_id: String },
    /// Another holder has the session: wait this long, then try to create one again.
    Standby { delay: Duration },
    /// Wait this long after a transient failure, then poll (with a session) or create one.
    BackOff { delay: Duration },
    /// The scale set is gone: the caller finds or re-creates it and resets its cursor.
    ScaleSetGone,
    /// Stop: the error will not pass by waiting.
    GiveUp,
}

/// The decision: the action and the state it leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub state: State,
}

/// The back-off after the `failures`-th failure in a row: [`BACKOFF_BASE`] doubled each
/// time, at most [`BACKOFF_CAP`]; deterministic, so tests can count on it.
pub fn backoff_delay(failures: u32) -> Duration {
    doubled(BACKOFF_BASE, BACKOFF_CAP, failures)
}

/// The wait on standby after the `waits`-th conflict in a row: from [`STANDBY_BASE`] doubled
/// each time, at most [`STANDBY_CAP`].
pub fn standby_delay(waits: u32) -> Duration {
    doubled(STANDBY_BASE, STANDBY_CAP, waits)
}

/// `base` doubled `n - 1` times (no wait for `n == 0`), at most `cap`.
fn doubled(base: Duration, cap: Duration, n: u32) -> Duration {
    let Some(exponent) = n.checked_sub(1) else {
        return Duration::ZERO;
    };
    // Past 2^16 the cap has long been reached; this keeps the shift in range.
    let factor = 1u32 << exponent.min(16);
    base.saturating_mul(factor).min(cap)
}

/// What to do after `outcome`, given `state`. Pure: the driver and the table test share it.
pub fn decide(state: &State, outcome: Outcome) -> Decision {
    let mut next = state.clone();
    let action = match outcome {
        Outcome::Message | Outcome::NoMessage => {
            // An answered poll is the success that resets the back-off.
            next.failures = 0;
            next.standby_waits = 0;
            Action::Poll
        }
        Outcome::SessionCreated => {
            next.has_session = true;
            next.standby_waits = 0;
            next.stale_session = None;
            Action::Poll
        }
        Outcome::StaleDeleted => {
            next.stale_session = None;
            Action::CreateSession
        }
        Outcome::Unreadable | Outcome::Transient | Outcome::Unrecognised => {
            next.failures = state.failures.saturating_add(1);
            Action::BackOff {
                delay: backoff_delay(next.failures),
            }
        }
        Outcome::SessionGone => {
            next.has_session = false;
            // The first eviction is re-created at once. Failures are reset only by an answered
            // poll, so a broker that evicts every new session is backed off, not hot-looped.
            next.failures = state.failures.saturating_add(1);
            if next.failures == 1 {
                Action::CreateSession
            } else {
                Action::BackOff {
                    delay: backoff_delay(next.failures - 1),
                }
            }
        }
        Outcome::SessionConflict => {
            next.has_session = false;
            match state.stale_session.clone() {
                Some(session_id) => Action::DeleteStaleSession { session_id },
                None => {
                    next.standby_waits = state.standby_waits.saturating_add(1);
                    Action::Standby {
                        delay: standby_delay(next.standby_waits),
                    }
                }
            }
        }
        Outcome::ScaleSetNotFound => {
            next.has_session = false;
            Action::ScaleSetGone
        }
        Outcome::Permanent => Action::GiveUp,
    };
    Decision {
        action,
        state: next,
    }
}

/// What the listener is doing now, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Activity {
    /// Not started, or between calls to [`Listener::next`].
    Idle,
    /// Creating a session (or deleting our stale one first).
    Opening,
    /// Long-polling the queue since then.
    Polling { since: SystemTime },
    /// Another holder has the session: waiting on standby since then, until `until`.
    Standby {
        since: SystemTime,
        until: SystemTime,
    },
    /// Backing off after a failure until then; `reason` is the last one's error, and
    /// `unrecognised` whether it was an answer the listener does not know ([`Outcome::Unrecognised`]).
    BackingOff {
        until: SystemTime,
        failures: u32,
        reason: String,
        unrecognised: bool,
    },
}

/// A caller's short synchronous write, told a value by the listener.
type Hook<T> = Box<dyn Fn(&T) + Send + Sync>;

/// The listener of one scale set: [`Listener::next`] hides the session's creation, refresh
/// and re-creation, and the back-off, applying [`decide`].
pub struct Listener {
    client: Arc<ScaleSetClient>,
    scale_set_id: u64,
    owner_name: String,
    session: Option<Session>,
    state: State,
    /// The action [`Listener::next`] takes first.
    pending: Action,
    /// The error of the last step that failed: what a back-off is said to be about.
    last_error: String,
    /// Whether the last failure was an answer the listener does not know.
    last_unrecognised: bool,
    activity: Activity,
    /// Told each new session's id as soon as the service answers, before it is polled: the
    /// caller journals it, so that its successor after a crash can delete it by id.
    on_session: Option<Hook<str>>,
    /// Told when the listener starts to wait (on standby or backing off), for `status`.
    on_wait: Option<Hook<Activity>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The session's queue token is a secret: only its id is shown.
        f.debug_struct("Listener")
            .field("scale_set_id", &self.scale_set_id)
            .field("owner_name", &self.owner_name)
            .field("session_id", &self.session_id())
            .field("state", &self.state)
            .field("activity", &self.activity)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener of scale set `scale_set_id` whose session is created as `owner_name`.
    /// `stale_session` is the session id the caller journalled before a crash, if any: it is
    /// deleted if creating a session conflicts.
    pub fn new(
        client: Arc<ScaleSetClient>,
        scale_set_id: u64,
        owner_name: impl Into<String>,
        stale_session: Option<String>,
    ) -> Self {
        Self {
            client,
            scale_set_id,
            owner_name: owner_name.into(),
            session: None,
            state: State {
                stale_session,
                ..State::default()
            },
            pending: Action::CreateSession,
            last_error: String::new(),
            last_unrecognised: false,
            activity: Activity::Idle,
            on_session: None,
            on_wait: None,
        }
    }

    /// Has `record` told each wait (standby, back-off) as it begins (a short synchronous write:
    /// the caller journals it for `status`).
    pub fn on_wait(mut self, record: impl Fn(&Activity) + Send + Sync + 'static) -> Self {
        self.on_wait = Some(Box::new(record));
        self
    }

    fn waiting(&mut self, activity: Activity) {
        if let Some(record) = &self.on_wait {
            record(&activity);
        }
        self.activity = activity;
    }

    /// Has `record` told each new session's id, before the session is first polled (a short
    /// synchronous write: the caller journals it there).
    pub fn on_session(mut self, record: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_session = Some(Box::new(record));
        self
    }

    /// The id of the session held, for the caller to journal (so that a restart after a crash
    /// can delete it).
    pub fn session_id(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.session_id.as_str())
    }

    /// The session held (its statistics are the starting state to scale on, §1.7).
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// What the listener is doing now.
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// The rules' state (failures in a row, standby waits).
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The next message after `last_message_id` (the last one the caller journalled; 0 for
    /// the first still queued), telling the service the caller can run `capacity` runners.
    /// `None` when the poll was held without one: a moment to reconcile (§1.8).
    ///
    /// Transient failures, evictions and conflicts are waited out inside (with
    /// `tokio::time::sleep`). The errors are [`ScaleSetError::ScaleSetNotFound`] (the caller
    /// re-finds or re-creates the set and resets its cursor to 0) and those that do not pass.
    /// The message is not acknowledged: see the module's delivery contract.
    ///
    /// Cancel-safe in the sense that matters: dropped mid-step (e.g. under a
    /// `tokio::time::timeout` or a shutdown `select!`), the step it was in is taken again, a
    /// wait in full, by the next call.
    pub async fn next(
        &mut self,
        last_message_id: u64,
        capacity: u32,
    ) -> Result<Option<Message>, ScaleSetError> {
        loop {
            let action = self.pending.clone();
            let (outcome, error, delivered) = match action {
                Action::Poll => match self.poll(last_message_id, capacity).await {
                    Ok(Some(message)) => (Outcome::Message, None, Some(Some(message))),
                    Ok(None) => (Outcome::NoMessage, None, Some(None)),
                    Err(e) => (Outcome::of(&e), Some(e), None),
                },
                // `ScaleSetGone` and `GiveUp` return from `next` and leave `CreateSession`
                // pending; they are never pending themselves.
                Action::CreateSession | Action::ScaleSetGone | Action::GiveUp => {
                    self.activity = Activity::Opening;
                    match self
                        .client
                        .create_session(self.scale_set_id, &self.owner_name)
                        .await
                    {
                        Ok(session) => {
                            tracing::info!(
                                scale_set_id = self.scale_set_id,
                                session_id = session.session_id,
                                "scale-set session created"
                            );
                            if let Some(record) = &self.on_session {
                                record(&session.session_id);
                            }
                            self.session = Some(session);
                            (Outcome::SessionCreated, None, None)
                        }
                        Err(e) => (Outcome::of(&e), Some(e), None),
                    }
                }
                Action::DeleteStaleSession { session_id } => {
                    self.activity = Activity::Opening;
                    match self
                        .client
                        .delete_session_by_id(self.scale_set_id, &session_id)
                        .await
                    {
                        Ok(()) => (Outcome::StaleDeleted, None, None),
                        Err(e) => match Outcome::of(&e) {
                            // The delete is tried again after the back-off (the id is kept).
                            Outcome::Transient => (Outcome::Transient, Some(e), None),
                            // Whatever else: it is not ours to free; a conflict now is
                            // another holder's, waited out on standby.
                            _ => {
                                tracing::warn!(
                                    scale_set_id = self.scale_set_id,
                                    session_id,
                                    error = %e,
                                    "cannot delete the stale scale-set session"
                                );
                                (Outcome::StaleDeleted, None, None)
                            }
                        },
                    }
                }
                Action::Standby { delay } => {
                    let since = SystemTime::now();
                    tracing::info!(
                        scale_set_id = self.scale_set_id,
                        delay_secs = delay.as_secs(),
                        "the scale set has another session: on standby"
                    );
                    self.waiting(Activity::Standby {
                        since,
                        until: since + delay,
                    });
                    tokio::time::sleep(delay).await;
                    self.pending = Action::CreateSession;
                    continue;
                }
                Action::BackOff { delay } => {
                    self.waiting(Activity::BackingOff {
                        until: SystemTime::now() + delay,
                        failures: self.state.failures,
                        reason: self.last_error.clone(),
                        unrecognised: self.last_unrecognised,
                    });
                    tokio::time::sleep(delay).await;
                    self.pending = if self.session.is_some() {
                        Action::Poll
                    } else {
                        Action::CreateSession
                    };
                    continue;
                }
            };
            if let Some(e) = &error {
                self.last_error = e.to_string();
                self.last_unrecognised = outcome == Outcome::Unrecognised;
            }
            self.apply(decide(&self.state, outcome), outcome);
            match self.pending.clone() {
                Action::ScaleSetGone => {
                    self.activity = Activity::Idle;
                    self.pending = Action::CreateSession;
                    return Err(error.unwrap_or(ScaleSetError::ScaleSetNotFound {
                        message: String::new(),
                    }));
                }
                Action::GiveUp => {
                    self.activity = Activity::Idle;
                    // A session still held is polled next time, not created again: a second
                    // create would conflict with our own session.
                    self.pending = if self.session.is_some() {
                        Action::Poll
                    } else {
                        Action::CreateSession
                    };
                    return Err(error.unwrap_or(ScaleSetError::Unexpected {
                        endpoint: "listener",
                        message: "gave up".into(),
                    }));
                }
                action => {
                    if outcome == Outcome::Unrecognised {
                        tracing::warn!(
                            scale_set_id = self.scale_set_id,
                            error = self.last_error,
                            next = ?action,
                            "the Actions service gave an answer the listener does not know; backing off"
                        );
                    } else if let Some(e) = &error {
                        tracing::warn!(
                            scale_set_id = self.scale_set_id,
                            error = %e,
                            next = ?action,
                            "scale-set listener step failed"
                        );
                    }
                }
            }
            if let Some(delivered) = delivered {
                self.activity = Activity::Idle;
                return Ok(delivered);
            }
        }
    }

    /// Takes `decision`, made after `outcome`. A session dropped because the service said it
    /// is gone keeps its id as stale: were it alive after all (a 404 meaning something else),
    /// the next create's `409` deletes it by that id rather than standing by on our own.
    fn apply(&mut self, decision: Decision, outcome: Outcome) {
        self.state = decision.state;
        if !self.state.has_session
            && let Some(dropped) = self.session.take()
            && outcome == Outcome::SessionGone
        {
            self.state.stale_session = Some(dropped.session_id);
        }
        self.pending = decision.action;
    }

    /// After a failed acknowledgement or acquisition: a session gone is dropped, and the
    /// next call to [`Listener::next`] makes a new one (by the rules: at once, or backed off
    /// if the last one was evicted too).
    fn after_session_call<T>(
        &mut self,
        answer: Result<T, ScaleSetError>,
    ) -> Result<T, ScaleSetError> {
        if let Err(e) = &answer
            && Outcome::of(e) == Outcome::SessionGone
        {
            self.last_error = e.to_string();
            self.last_unrecognised = false;
            self.apply(
                decide(&self.state, Outcome::SessionGone),
                Outcome::SessionGone,
            );
        }
        answer
    }

    /// One poll with the session held.
    async fn poll(
        &mut self,
        last_message_id: u64,
        capacity: u32,
    ) -> Result<Option<Message>, ScaleSetError> {
        self.activity = Activity::Polling {
            since: SystemTime::now(),
        };
        let Some(session) = self.session.as_mut() else {
            return Err(ScaleSetError::SessionGone {
                message: "no session held".into(),
            });
        };
        self.client
            .get_message(session, last_message_id, capacity)
            .await
    }

    /// Acknowledges message `message_id`, once the caller has journalled it. Without a
    /// session (it was evicted) this is [`ScaleSetError::SessionGone`]: the message comes
    /// again after the next session is made, and the journal recognises it.
    pub async fn ack(&mut self, message_id: u64) -> Result<(), ScaleSetError> {
        let Some(session) = self.session.as_mut() else {
            return Err(ScaleSetError::SessionGone {
                message: "no session held".into(),
            });
        };
        let acked = self.client.delete_message(session, message_id).await;
        // A gone session: `next` makes a new one rather than poll it.
        self.after_session_call(acked)
    }

    /// Acquires the jobs of `runner_request_ids` with the session held (the `JobAvailable`
    /// jobs of a message, where the service still wants them acquired: GHES, §1.11); the ids
    /// acquired. A session gone is dropped, as by [`Listener::ack`].
    pub async fn acquire(&mut self, runner_request_ids: &[i64]) -> Result<Vec<i64>, ScaleSetError> {
        let Some(session) = self.session.as_mut() else {
            return Err(ScaleSetError::SessionGone {
                message: "no session held".into(),
            });
        };
        let acquired = self.client.acquire_jobs(session, runner_request_ids).await;
        self.after_session_call(acquired)
    }

    /// Closes the session held, on shutdown, so that the next process is not refused.
    pub async fn close(mut self) -> Result<(), ScaleSetError> {
        match self.session.take() {
            Some(session) => self.client.delete_session(&session).await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(failures: u32, has_session: bool, stale: Option<&str>) -> State {
        State {
            failures,
            standby_waits: 0,
            has_session,
            stale_session: stale.map(str::to_owned),
        }
    }

    #[test]
    fn the_delays_double_from_their_base_up_to_their_cap() {
        assert_eq!(backoff_delay(0), Duration::ZERO);
        assert_eq!(backoff_delay(1), BACKOFF_BASE);
        assert_eq!(backoff_delay(2), BACKOFF_BASE * 2);
        assert_eq!(backoff_delay(3), BACKOFF_BASE * 4);
        assert_eq!(backoff_delay(40), BACKOFF_CAP);
        assert_eq!(backoff_delay(u32::MAX), BACKOFF_CAP);
        assert_eq!(standby_delay(1), STANDBY_BASE);
        assert_eq!(standby_delay(2), STANDBY_BASE * 2);
        assert_eq!(standby_delay(u32::MAX), STANDBY_CAP);
        // Never a hot loop: every wait is at least its base.
        assert!((1..100).all(|n| backoff_delay(n) >= BACKOFF_BASE));
    }

    /// One row per failure mode of `github-scale-sets.md` §2.3: (what the state was, what the
    /// step returned, what to do, failures after).
    #[test]
    fn each_failure_mode_has_its_action() {
        let rows: Vec<(&str, State, Outcome, Action, u32)> = vec![
            (
                "a message: poll again",
                state(0, true, None),
                Outcome::Message,
                Action::Poll,
                0,
            ),
            (
                "202: poll again",
                state(0, true, None),
                Outcome::NoMessage,
                Action::Poll,
                0,
            ),
            (
                "an answered poll resets a 5xx burst",
                state(5, true, None),
                Outcome::NoMessage,
                Action::Poll,
                0,
            ),
            (
                "a session created: poll",
                state(0, false, None),
                Outcome::SessionCreated,
                Action::Poll,
                0,
            ),
            (
                "evicted session (refresh 404): a new session at once",
                state(0, true, None),
                Outcome::SessionGone,
                Action::CreateSession,
                1,
            ),
            (
                "evicted again before any answered poll: backed off, not a hot loop",
                state(1, true, None),
                Outcome::SessionGone,
                Action::BackOff {
                    delay: BACKOFF_BASE,
                },
                2,
            ),
            (
                "empty 200: back off, then poll (never exit)",
                state(0, true, None),
                Outcome::Unreadable,
                Action::BackOff {
                    delay: BACKOFF_BASE,
                },
                1,
            ),
            (
                "a 5xx: back off",
                state(0, true, None),
                Outcome::Transient,
                Action::BackOff {
                    delay: BACKOFF_BASE,
                },
                1,
            ),
            (
                "a 5xx burst: the back-off doubles",
                state(3, true, None),
                Outcome::Transient,
                Action::BackOff {
                    delay: BACKOFF_BASE * 8,
                },
                4,
            ),
            (
                "a long outage: the back-off stays at its cap",
                state(1000, true, None),
                Outcome::Transient,
                Action::BackOff { delay: BACKOFF_CAP },
                1001,
            ),
            (
                "409 at start with our stale session journalled: delete it",
                state(0, false, Some("s-1")),
                Outcome::SessionConflict,
                Action::DeleteStaleSession {
                    session_id: "s-1".into(),
                },
                0,
            ),
            (
                "the stale session deleted: create",
                state(0, false, Some("s-1")),
                Outcome::StaleDeleted,
                Action::CreateSession,
                0,
            ),
            (
                "409 without a stale session: standby, not a failure",
                state(0, false, None),
                Outcome::SessionConflict,
                Action::Standby {
                    delay: STANDBY_BASE,
                },
                0,
            ),
            (
                "scale set deleted: the caller re-creates it",
                state(0, true, None),
                Outcome::ScaleSetNotFound,
                Action::ScaleSetGone,
                0,
            ),
            (
                "a 403: give up",
                state(0, true, None),
                Outcome::Permanent,
                Action::GiveUp,
                0,
            ),
            (
                "an answer not known: back off, never give up",
                state(0, true, None),
                Outcome::Unrecognised,
                Action::BackOff {
                    delay: BACKOFF_BASE,
                },
                1,
            ),
            (
                "an answer not known, again and again: the back-off stays at its cap",
                state(1000, false, None),
                Outcome::Unrecognised,
                Action::BackOff { delay: BACKOFF_CAP },
                1001,
            ),
        ];
        for (row, before, outcome, action, failures) in rows {
            let decision = decide(&before, outcome);
            assert_eq!(decision.action, action, "{row}");
            assert_eq!(decision.state.failures, failures, "{row}");
        }
    }

    /// From the service's answer to the decision, status first (the client's `service_error`, then
    /// [`Outcome::of`], then [`decide`]).
    #[test]
    fn each_answer_has_its_decision_whatever_its_type_name() {
        use crate::scaleset::{
            ACQUIRE, MESSAGE_DELETE, MESSAGE_GET, SCALE_SET_FIND, SESSION_CREATE, service_error,
        };
        let named = |name: &str| format!(r#"{{"typeName":"{name}","message":"m"}}"#);
        let conflict = named("GitHub.Actions.RunnerScaleSetSessionConflictException");
        let other = named("GitHub.Actions.SessionBusyException");
        let set_gone = named("GitHub.Actions.RunnerScaleSetNotFoundException");
        let delete_s1 = Action::DeleteStaleSession {
            session_id: "s-1".into(),
        };
        let standby = Action::Standby {
            delay: STANDBY_BASE,
        };
        let backoff = Action::BackOff {
            delay: BACKOFF_BASE,
        };
        /// (what happened, the endpoint, the status, the body, the state before, what to do)
        type Row<'a> = (&'a str, &'static str, u16, &'a [u8], State, Action);
        let rows: Vec<Row> = vec![
            (
                "409 named as rm knows it, our stale session journalled",
                SESSION_CREATE,
                409,
                conflict.as_bytes(),
                state(0, false, Some("s-1")),
                delete_s1.clone(),
            ),
            (
                "409 with another type name, our stale session journalled",
                SESSION_CREATE,
                409,
                other.as_bytes(),
                state(0, false, Some("s-1")),
                delete_s1.clone(),
            ),
            (
                "409 without a type name, our stale session journalled",
                SESSION_CREATE,
                409,
                b"",
                state(0, false, Some("s-1")),
                delete_s1.clone(),
            ),
            (
                "409 with another type name, nothing journalled: another holder",
                SESSION_CREATE,
                409,
                other.as_bytes(),
                state(0, false, None),
                standby.clone(),
            ),
            (
                "409 without a type name, nothing journalled: another holder",
                SESSION_CREATE,
                409,
                b"",
                state(0, false, None),
                standby.clone(),
            ),
            (
                "404 on the poll, no type name: a new session at once",
                MESSAGE_GET,
                404,
                b"",
                state(0, true, None),
                Action::CreateSession,
            ),
            (
                "404 on the poll with another type name: a new session at once",
                MESSAGE_GET,
                404,
                other.as_bytes(),
                state(0, true, None),
                Action::CreateSession,
            ),
            (
                "404 on the acknowledgement, no type name: a new session at once",
                MESSAGE_DELETE,
                404,
                b"",
                state(0, true, None),
                Action::CreateSession,
            ),
            (
                "404 on acquisition, no type name: a new session at once",
                ACQUIRE,
                404,
                b"",
                state(0, true, None),
                Action::CreateSession,
            ),
            (
                "404 on the poll naming the scale set: the set is gone",
                MESSAGE_GET,
                404,
                set_gone.as_bytes(),
                state(0, true, None),
                Action::ScaleSetGone,
            ),
            (
                "a bare 404 on the session's creation: the set is gone",
                SESSION_CREATE,
                404,
                b"",
                state(0, false, None),
                Action::ScaleSetGone,
            ),
            (
                "a 404 of an unknown name on the session's creation: the set is gone",
                SESSION_CREATE,
                404,
                other.as_bytes(),
                state(0, false, None),
                Action::ScaleSetGone,
            ),
            (
                "a bare 404 on the set's find: the set is gone",
                SCALE_SET_FIND,
                404,
                b"",
                state(0, false, None),
                Action::ScaleSetGone,
            ),
            (
                "a 400 on the poll: backed off, not given up",
                MESSAGE_GET,
                400,
                other.as_bytes(),
                state(0, true, None),
                backoff.clone(),
            ),
            (
                "a 422 on the session's creation: backed off",
                SESSION_CREATE,
                422,
                b"",
                state(0, false, None),
                backoff.clone(),
            ),
            (
                "a 410 on the acknowledgement: backed off",
                MESSAGE_DELETE,
                410,
                b"",
                state(0, true, None),
                backoff.clone(),
            ),
            (
                "a 409 on the poll (no meaning there): backed off",
                MESSAGE_GET,
                409,
                b"",
                state(0, true, None),
                backoff.clone(),
            ),
            (
                "an unknown 4xx in a long run: at most the cap",
                MESSAGE_GET,
                400,
                b"",
                state(1000, true, None),
                Action::BackOff { delay: BACKOFF_CAP },
            ),
            (
                "a 403: give up (a refusal; the agent says so and tries again later)",
                MESSAGE_GET,
                403,
                b"",
                state(0, true, None),
                Action::GiveUp,
            ),
            (
                "a 429: back off",
                MESSAGE_GET,
                429,
                b"",
                state(0, true, None),
                backoff.clone(),
            ),
        ];
        for (row, endpoint, status, body, before, action) in rows {
            let status = http::StatusCode::from_u16(status).expect("a status");
            let outcome = Outcome::of(&service_error(endpoint, status, body));
            assert_eq!(decide(&before, outcome).action, action, "{row}");
        }
    }

    #[test]
    fn the_state_follows_the_session() {
        let gone = decide(&state(0, true, None), Outcome::SessionGone);
        assert!(!gone.state.has_session);
        let created = decide(&state(0, false, Some("s-1")), Outcome::SessionCreated);
        assert!(created.state.has_session);
        assert_eq!(created.state.stale_session, None, "tried once, not again");
        let deleted = decide(&state(0, false, Some("s-1")), Outcome::StaleDeleted);
        assert_eq!(deleted.state.stale_session, None);
        // Conflicts in a row on standby wait longer each time.
        let first = decide(&state(0, false, None), Outcome::SessionConflict);
        let second = decide(&first.state, Outcome::SessionConflict);
        assert_eq!(
            second.action,
            Action::Standby {
                delay: STANDBY_BASE * 2
            }
        );
        // ... and an answered poll ends the standby count.
        let polled = decide(&second.state, Outcome::Message);
        assert_eq!(polled.state.standby_waits, 0);
    }

    #[test]
    fn errors_are_classified_by_whether_they_pass() {
        let service = |status| ScaleSetError::Service {
            endpoint: "e",
            status,
            type_name: String::new(),
            message: String::new(),
        };
        assert_eq!(Outcome::of(&service(503)), Outcome::Transient);
        assert_eq!(Outcome::of(&service(429)), Outcome::Transient);
        assert_eq!(Outcome::of(&service(408)), Outcome::Transient);
        assert_eq!(Outcome::of(&service(403)), Outcome::Permanent);
        // An answer the rules do not know passes as far as they can tell: never a give-up.
        for status in [400, 404, 405, 409, 410, 412, 415, 422, 451, 302] {
            assert_eq!(
                Outcome::of(&service(status)),
                Outcome::Unrecognised,
                "{status}"
            );
        }
        assert_eq!(
            Outcome::of(&ScaleSetError::Unreachable {
                endpoint: "e",
                reason: String::new()
            }),
            Outcome::Transient
        );
        assert_eq!(
            Outcome::of(&ScaleSetError::UnreadableMessage {
                reason: String::new()
            }),
            Outcome::Unreadable
        );
        // An enterprise's PAT refused: only a new token fixes it.
        assert_eq!(
            Outcome::of(&ScaleSetError::TokenRefused {
                endpoint: "e",
                status: 401,
                message: String::new()
            }),
            Outcome::Permanent
        );
        assert_eq!(
            Outcome::of(&ScaleSetError::Github(GithubError::Forbidden {
                endpoint: "e",
                message: String::new(),
                remedy: ""
            })),
            Outcome::Permanent
        );
    }
}
