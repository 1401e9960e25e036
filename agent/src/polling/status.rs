//! What `status` and `/metrics` show about polling: the [`PollerStatus`] snapshot, the rolling
//! hour of charged and uncharged requests ([`RequestWindow`]) and the rate limit that binds
//! (the lowest `core` quota left among the scopes the agent has used).

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use rm_github::{BudgetSnapshot, Scope};

use super::health::Trust;
use super::schedule::{OfflineState, Pace, Quota};

/// The window the request counts cover.
pub(crate) const REQUEST_WINDOW: Duration = Duration::from_secs(3600);
/// Samples closer together than this replace each other (bounds memory to ~360 samples).
const SAMPLE_SPACING: Duration = Duration::from_secs(10);
/// The rate-limit resource polling spends.
const CORE: &str = "core";

/// Requests GitHub counted against the quota, and `304`s (and `/rate_limit`) it did not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RequestCounts {
    pub charged: u64,
    pub uncharged: u64,
}

/// The client's running totals, sampled so the last hour can be told apart.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestWindow {
    samples: VecDeque<(SystemTime, RequestCounts)>,
}

impl RequestWindow {
    /// Records the totals at `now`.
    pub(crate) fn record(&mut self, now: SystemTime, totals: RequestCounts) {
        // The newest sample is replaced while it is too close to the one before it, so kept
        // samples stand at least `SAMPLE_SPACING` apart.
        let len = self.samples.len();
        if len >= 2
            && let (Some((before, _)), Some((last, _))) =
                (self.samples.get(len - 2), self.samples.get(len - 1))
            && last.duration_since(*before).unwrap_or(Duration::ZERO) < SAMPLE_SPACING
        {
            self.samples.pop_back();
        }
        self.samples.push_back((now, totals));
        // Keep one sample at or before the window's start as the baseline.
        while self.samples.len() > 2
            && self.samples.get(1).is_some_and(|(t, _)| {
                now.duration_since(*t).unwrap_or(Duration::ZERO) >= REQUEST_WINDOW
            })
        {
            self.samples.pop_front();
        }
    }

    /// Requests in the hour before `now` (since the first sample, when younger).
    pub(crate) fn last_hour(&self) -> RequestCounts {
        match (self.samples.front(), self.samples.back()) {
            (Some((_, first)), Some((_, last))) => RequestCounts {
                charged: last.charged.saturating_sub(first.charged),
                uncharged: last.uncharged.saturating_sub(first.uncharged),
            },
            _ => RequestCounts::default(),
        }
    }
}

/// The client's totals over every scope and resource.
pub(crate) fn totals(budget: &[BudgetSnapshot]) -> RequestCounts {
    budget
        .iter()
        .fold(RequestCounts::default(), |acc, b| RequestCounts {
            charged: acc.charged + b.charged,
            uncharged: acc.uncharged + b.uncharged,
        })
}

/// A quota as `status --json` shows it (`github.rate_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimitStatus {
    pub remaining: u64,
    pub limit: u64,
    pub reset_at: Option<SystemTime>,
}

impl RateLimitStatus {
    /// The quota as the schedule weighs it.
    pub(crate) fn quota(&self, now: SystemTime) -> Quota {
        Quota {
            remaining: self.remaining,
            limit: self.limit,
            reset_in: self.reset_at.and_then(|r| r.duration_since(now).ok()),
        }
    }
}

/// The binding `core` quota: the installation scope with the least left (the App's own
/// only when no installation has answered yet).
pub(crate) fn binding_rate_limit(budget: &[BudgetSnapshot]) -> Option<RateLimitStatus> {
    let known =
        |b: &&BudgetSnapshot| b.resource == CORE && b.limit.is_some() && b.remaining.is_some();
    let pick = |installations: bool| {
        budget
            .iter()
            .filter(known)
            .filter(|b| matches!(b.scope, Scope::Installation(_)) == installations)
            .min_by_key(|b| b.remaining)
            .map(|b| RateLimitStatus {
                remaining: b.remaining.unwrap_or_default(),
                limit: b.limit.unwrap_or_default(),
                reset_at: b.reset_at,
            })
    };
    pick(true).or_else(|| pick(false))
}

/// Webhook health as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WebhookStatus {
    /// A receiver or relay is configured.
    pub intake: bool,
    pub trusted: bool,
    /// `deliveries_trusted`, `no_intake`, `unannounced_job` or `failed_delivery`.
    pub reason: &'static str,
    pub evidence_at: Option<SystemTime>,
    /// When the newest delivery was journalled.
    pub last_delivery_at: Option<SystemTime>,
}

impl WebhookStatus {
    pub(crate) fn new(intake: bool, trust: Trust, last_delivery_at: Option<SystemTime>) -> Self {
        Self {
            intake,
            trusted: trust.trusted,
            reason: trust.reason,
            evidence_at: trust.evidence_at,
            last_delivery_at,
        }
    }
}

/// What the latest pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PassReport {
    /// When it ran.
    pub at: Option<SystemTime>,
    /// Whether it polled demand (else only stale checks or the delivery scan were due).
    pub polled_demand: bool,
    /// Targets read in full.
    pub targets_read: usize,
    /// In a fleet: targets another host leads, whose requests this host did not send.
    pub targets_led_elsewhere: usize,
    /// Repositories whose runs were listed.
    pub repositories: usize,
    /// Jobs GitHub reported.
    pub jobs_seen: usize,
    /// Journal rows the pass inserted or moved forward.
    pub jobs_changed: usize,
    /// Queued jobs no delivery announced (evidence against the webhooks).
    pub unannounced: usize,
    /// Stale queued jobs asked about, and of them how many were no longer queued.
    pub stale_checked: usize,
    pub stale_resolved: usize,
    /// Hook deliveries examined, failed GUIDs found, and redeliveries asked for.
    pub deliveries_examined: usize,
    pub failed_deliveries: usize,
    pub redelivered: usize,
    /// Requests the pass sent.
    pub requests: u32,
    /// The most severe failure, by name (`offline`, `rate_limited`, ...).
    pub failure: Option<&'static str>,
}

/// A polling target the latest demand poll could not read, and why (GitHub's error in words).
/// Such a target is tried again at the next poll, at the active interval (the schedule's
/// `Failure::Failed`): it is neither skipped for good nor counted as empty.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct UnreadableTarget {
    /// The policy target as configured: `acme` or `acme/widgets`.
    pub target: String,
    pub reason: String,
}

/// The poller at a glance, for `status` and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PollerStatus {
    pub pace: Pace,
    /// When the next demand poll is due.
    pub next_poll_at: Option<SystemTime>,
    pub webhooks: WebhookStatus,
    pub requests_last_hour: RequestCounts,
    pub rate_limit: Option<RateLimitStatus>,
    /// Set while GitHub is unreachable.
    pub offline: Option<OfflineState>,
    /// Jobs a poll found that no delivery has announced.
    pub unannounced_jobs: i64,
    pub last_pass: PassReport,
    /// The targets the latest demand poll could not read (kept until the next demand poll).
    pub unreadable_targets: Vec<UnreadableTarget>,
}

impl PollerStatus {
    /// How long until the next poll (the tests' view; `status` computes it from the snapshot).
    #[cfg(test)]
    pub(crate) fn next_poll_in_ms(&self, now: SystemTime) -> u64 {
        self.next_poll_at
            .and_then(|at| at.duration_since(now).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn counts(charged: u64, uncharged: u64) -> RequestCounts {
        RequestCounts { charged, uncharged }
    }

    #[test]
    fn the_window_counts_the_last_hour_only() {
        let mut w = RequestWindow::default();
        assert_eq!(w.last_hour(), RequestCounts::default());
        w.record(t(0), counts(0, 0));
        w.record(t(60), counts(10, 5));
        assert_eq!(w.last_hour(), counts(10, 5));
        w.record(t(1800), counts(30, 20));
        w.record(t(3660), counts(40, 30));
        // The baseline is now the sample of t=60.
        assert_eq!(w.last_hour(), counts(30, 25));
        w.record(t(7300), counts(41, 30));
        assert_eq!(w.last_hour(), counts(1, 0));
    }

    #[test]
    fn close_samples_replace_each_other() {
        let mut w = RequestWindow::default();
        w.record(t(0), counts(0, 0));
        for i in 1..100 {
            w.record(t(i), counts(i, 0));
        }
        assert!(w.samples.len() <= 12, "{}", w.samples.len());
        assert_eq!(w.last_hour(), counts(99, 0));
    }

    fn snapshot(scope: Scope, resource: &str, remaining: u64) -> BudgetSnapshot {
        BudgetSnapshot {
            scope,
            resource: resource.to_owned(),
            limit: Some(5000),
            remaining: Some(remaining),
            used: None,
            reset_at: Some(t(600)),
            blocked: None,
            charged: 3,
            uncharged: 4,
        }
    }

    #[test]
    fn the_binding_quota_is_the_installation_with_least_left() {
        let budget = [
            snapshot(Scope::App(1), CORE, 10),
            snapshot(Scope::Installation(1), CORE, 4000),
            snapshot(Scope::Installation(2), CORE, 3000),
            snapshot(Scope::Installation(2), "search", 1),
        ];
        let binding = binding_rate_limit(&budget).unwrap();
        assert_eq!((binding.remaining, binding.limit), (3000, 5000));
        assert_eq!(binding.quota(t(0)).reset_in, Some(Duration::from_secs(600)));
        assert_eq!(
            binding_rate_limit(&budget[..1]).map(|b| b.remaining),
            Some(10)
        );
        assert_eq!(totals(&budget), counts(12, 16));
    }
}
