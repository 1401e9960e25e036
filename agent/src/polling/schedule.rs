//! The poll schedule, pure: when the next demand poll runs and under which pace name, from how
//! the last pass went (a failure, or the quota and quietness of a success). The rules are the
//! prior art's `PollSchedule` (`prior-art-reconcile.md` §2), kept exactly:
//!
//! - success: stretched when the quota runs low (under 20 %: twice the active interval, under
//!   5 %: four times, but never past the reset when that is sooner, nor under the active
//!   interval), else idle (`max(idle, requests × 200 ms)`) when the pass was quiet, else nominal;
//! - offline: the active interval doubling per consecutive failure up to 15 minutes, with up to
//!   50 % additive jitter, never under 30 s;
//! - rate limited: `max(retry-after, active)` plus up to 10 % jitter: the `retry-after` is a
//!   floor, never added;
//! - refused (401, 403, other failures): the active interval, pace `blocked`, so a
//!   fix is noticed. Any answer from GitHub ends an offline run.

use std::time::{Duration, SystemTime};

use rm_github::{GithubError, LimitKind};

/// The poller's loop wakes at least this often (to refresh what `status` shows); the fleet's
/// leader leases are sized by it (`election::LEAD_TTL`).
pub(crate) const STATUS_REFRESH: Duration = Duration::from_secs(30);
/// The active interval's floor: faster polling spends the shared quota.
pub(crate) const ACTIVE_FLOOR: Duration = Duration::from_secs(30);
/// The idle interval's floor.
pub(crate) const IDLE_FLOOR: Duration = Duration::from_secs(5);
/// The longest offline back-off (before jitter).
pub(crate) const OFFLINE_CAP: Duration = Duration::from_secs(15 * 60);
/// The most doublings of the offline back-off.
const OFFLINE_MAX_DOUBLINGS: u32 = 5;
/// No poll comes sooner than this unless the pace is idle.
pub(crate) const MIN_DELAY: Duration = Duration::from_secs(30);
/// One target's idle polling stays under 300 requests a minute: 200 ms per request of a pass.
const IDLE_TIME_PER_REQUEST: Duration = Duration::from_millis(200);
/// Under this share of the quota left, the pace is stretched ×2 (percent).
const LOW_BUDGET_PERCENT: u64 = 20;
/// Under this share, ×4 (percent).
const CRITICAL_BUDGET_PERCENT: u64 = 5;
/// GitHub cancels a job that stayed queued this long: an outage that lasted it lost the queue.
pub(crate) const QUEUE_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The pace the schedule is in, by its stable name (`status --json` `polling.pace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Pace {
    Nominal,
    Idle,
    StretchedLowBudget,
    StretchedCriticalBudget,
    RateLimitedPrimary,
    RateLimitedSecondary,
    Offline,
    Blocked,
    /// Webhooks are trusted: polling is only the slow reconciliation pass (see `health`).
    Reconciling,
}

impl Pace {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Pace::Nominal => "nominal",
            Pace::Idle => "idle",
            Pace::StretchedLowBudget => "stretched_low_budget",
            Pace::StretchedCriticalBudget => "stretched_critical_budget",
            Pace::RateLimitedPrimary => "rate_limited_primary",
            Pace::RateLimitedSecondary => "rate_limited_secondary",
            Pace::Offline => "offline",
            Pace::Blocked => "blocked",
            Pace::Reconciling => "reconciling",
        }
    }

    /// Every pace but nominal, idle and reconciling is slowed by something the operator
    /// should see: shown, never hidden.
    pub(crate) fn is_throttled(self) -> bool {
        !matches!(self, Pace::Nominal | Pace::Idle | Pace::Reconciling)
    }
}

/// Why a pass failed, most severe first in [`Failure::severity`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// GitHub did not answer (or answered 5xx: it is not serving).
    Offline,
    /// A rate limit holds; `retry_after` is how long until it lifts.
    RateLimited {
        kind: LimitKind,
        retry_after: Duration,
    },
    Unauthorized,
    Forbidden,
    /// Any other refusal or unreadable answer.
    Failed,
}

impl Failure {
    /// Classifies a client error at `now`.
    pub(crate) fn from_error(error: &GithubError, now: SystemTime) -> Failure {
        match error {
            GithubError::Unreachable { .. } | GithubError::Server { .. } => Failure::Offline,
            GithubError::RateLimited { kind, retry_at, .. } => Failure::RateLimited {
                kind: *kind,
                retry_after: retry_at.duration_since(now).unwrap_or(Duration::ZERO),
            },
            GithubError::Unauthorized { .. } => Failure::Unauthorized,
            GithubError::Forbidden { .. } => Failure::Forbidden,
            GithubError::NotFound { .. }
            | GithubError::Conflict { .. }
            | GithubError::Unprocessable { .. }
            | GithubError::Unexpected { .. } => Failure::Failed,
        }
    }

    /// Offline 5 > rate limited 4 > unauthorized 2 > forbidden / failed 1.
    pub(crate) fn severity(self) -> u8 {
        match self {
            Failure::Offline => 5,
            Failure::RateLimited { .. } => 4,
            Failure::Unauthorized => 2,
            Failure::Forbidden | Failure::Failed => 1,
        }
    }

    /// The more severe of two failures (the first when equal).
    pub(crate) fn worst(a: Option<Failure>, b: Failure) -> Failure {
        match a {
            Some(a) if a.severity() >= b.severity() => a,
            _ => b,
        }
    }

    /// The name a report or log uses.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::Offline => "offline",
            Failure::RateLimited { .. } => "rate_limited",
            Failure::Unauthorized => "unauthorized",
            Failure::Forbidden => "forbidden",
            Failure::Failed => "failed",
        }
    }
}

/// The newest quota reading: what is left, of what, and how long until it refills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub remaining: u64,
    pub limit: u64,
    /// `None` or zero once the reset has passed (the pressure is then normal).
    pub reset_in: Option<Duration>,
}

/// How a successful pass went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Conditions {
    /// Nothing to do anywhere: every listing unchanged and empty.
    pub quiet: bool,
    pub quota: Option<Quota>,
    /// Requests one pass makes.
    pub requests_per_pass: u32,
}

/// When the next poll runs, and why at that pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NextPoll {
    pub delay: Duration,
    pub pace: Pace,
}

/// An outage as measured: since the first failure of the run, never estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OfflineState {
    pub consecutive: u32,
    pub since: SystemTime,
    pub offline_for: Duration,
    pub retry_in: Duration,
}

impl OfflineState {
    /// GitHub cancels jobs queued for 24 hours: an outage this long lost what was queued.
    pub(crate) fn has_outlasted_the_queue(&self) -> bool {
        self.offline_for >= QUEUE_LIFETIME
    }

    /// One sentence for `status`.
    pub(crate) fn describe(&self) -> String {
        let lost = if self.has_outlasted_the_queue() {
            "jobs queued before it began have been cancelled by GitHub (24 hours)"
        } else {
            "jobs queued on GitHub will be cancelled if it lasts 24 hours"
        };
        format!(
            "GitHub has been unreachable for {} ({} failed polls): no new runners are started, \
             running ones are left alone; next try in {}; {lost}",
            humantime::format_duration(round_secs(self.offline_for)),
            self.consecutive,
            humantime::format_duration(round_secs(self.retry_in)),
        )
    }
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScheduleError {
    #[error("the active polling interval {0:?} is under the 30 s floor")]
    ActiveTooShort(Duration),
}

/// The schedule and the offline run it is in.
#[derive(Debug, Clone)]
pub(crate) struct PollSchedule {
    active: Duration,
    idle: Duration,
    consecutive_offline: u32,
    offline_since: Option<SystemTime>,
}

impl PollSchedule {
    /// `active` must be at least 30 s; `idle` is clamped to `[5 s, active]`; without an idle
    /// interval it equals the active one (no idle pace).
    pub(crate) fn new(active: Duration, idle: Option<Duration>) -> Result<Self, ScheduleError> {
        if active < ACTIVE_FLOOR {
            return Err(ScheduleError::ActiveTooShort(active));
        }
        let idle = idle.unwrap_or(active).clamp(IDLE_FLOOR, active);
        Ok(Self {
            active,
            idle,
            consecutive_offline: 0,
            offline_since: None,
        })
    }

    pub(crate) fn active(&self) -> Duration {
        self.active
    }

    #[cfg(test)]
    pub(crate) fn idle(&self) -> Duration {
        self.idle
    }

    /// The next poll after a pass that ended in `failure` (or succeeded under `conditions`).
    /// `jitter` is in `[0, 1]`.
    pub(crate) fn next_poll(
        &mut self,
        failure: Option<Failure>,
        conditions: Conditions,
        jitter: f64,
        now: SystemTime,
    ) -> NextPoll {
        let jitter = jitter.clamp(0.0, 1.0);
        if failure != Some(Failure::Offline) {
            self.consecutive_offline = 0;
            self.offline_since = None;
        }
        let next = match failure {
            None => self.on_success(conditions),
            Some(Failure::Offline) => {
                self.consecutive_offline = self.consecutive_offline.saturating_add(1);
                self.offline_since.get_or_insert(now);
                let doublings = (self.consecutive_offline - 1).min(OFFLINE_MAX_DOUBLINGS);
                let capped = (self.active * (1u32 << doublings)).min(OFFLINE_CAP);
                NextPoll {
                    delay: capped.mul_f64(1.0 + 0.5 * jitter).max(MIN_DELAY),
                    pace: Pace::Offline,
                }
            }
            Some(Failure::RateLimited { kind, retry_after }) => {
                let wait = retry_after.max(self.active);
                NextPoll {
                    delay: wait + wait.mul_f64(0.1 * jitter),
                    pace: match kind {
                        LimitKind::Primary => Pace::RateLimitedPrimary,
                        LimitKind::Secondary => Pace::RateLimitedSecondary,
                    },
                }
            }
            Some(Failure::Unauthorized | Failure::Forbidden | Failure::Failed) => NextPoll {
                delay: self.active,
                pace: Pace::Blocked,
            },
        };
        debug_assert!(next.delay >= IDLE_FLOOR);
        debug_assert!(next.pace == Pace::Idle || next.delay >= MIN_DELAY);
        next
    }

    fn on_success(&self, conditions: Conditions) -> NextPoll {
        let pressure = conditions.quota.and_then(|q| {
            let reset_in = q.reset_in.filter(|r| !r.is_zero())?;
            let percent_left = |p: u64| q.remaining.saturating_mul(100) < q.limit.saturating_mul(p);
            if percent_left(CRITICAL_BUDGET_PERCENT) {
                Some((4, Pace::StretchedCriticalBudget, reset_in))
            } else if percent_left(LOW_BUDGET_PERCENT) {
                Some((2, Pace::StretchedLowBudget, reset_in))
            } else {
                None
            }
        });
        if let Some((factor, pace, reset_in)) = pressure {
            return NextPoll {
                delay: (self.active * factor).min(reset_in.max(self.active)),
                pace,
            };
        }
        if conditions.quiet && self.idle < self.active {
            return NextPoll {
                delay: self
                    .idle
                    .max(IDLE_TIME_PER_REQUEST * conditions.requests_per_pass),
                pace: Pace::Idle,
            };
        }
        NextPoll {
            delay: self.active,
            pace: Pace::Nominal,
        }
    }

    /// The outage in progress, if the last pass was offline.
    pub(crate) fn offline(&self, now: SystemTime, retry_in: Duration) -> Option<OfflineState> {
        let since = self.offline_since?;
        Some(OfflineState {
            consecutive: self.consecutive_offline,
            since,
            offline_for: now.duration_since(since).unwrap_or(Duration::ZERO),
            retry_in,
        })
    }
}

#[cfg(test)]
mod tests;
