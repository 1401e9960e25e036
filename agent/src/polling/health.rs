//! Webhook health, pure: whether the agent trusts deliveries to tell it about jobs, and so
//! whether polling is only a slow reconciliation pass or runs at the full schedule.
//!
//! The rule (also in `docs/operating.md` terms, shown by `status`):
//!
//! - with no receiver and no relay configured, deliveries are never trusted (`no_intake`);
//! - otherwise they are trusted until there is evidence that one was lost: a poll found a queued
//!   job that no delivery announced within [`ANNOUNCE_GRACE`] (`unannounced_job`), or GitHub's
//!   hook log shows a delivery that never succeeded (`failed_delivery`: GitHub was sending while
//!   nothing arrived);
//! - after evidence, they are trusted again once a delivery has been journalled after the latest
//!   evidence *and* [`TRUST_RESTORE_AFTER`] has passed since it with no new evidence.
//!
//! While trusted, demand is polled at most every [`RECONCILE_INTERVAL`] (conditional requests,
//! so an unchanged repository costs nothing); while not, at the full schedule.

use std::time::{Duration, SystemTime};

/// While deliveries are trusted, a demand poll runs at most this often: a slow, conditional
/// pass that catches what a lost delivery would hide.
pub(crate) const RECONCILE_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// After the last evidence of a lost delivery, how long deliveries must keep arriving before
/// they are trusted again.
pub(crate) const TRUST_RESTORE_AFTER: Duration = Duration::from_secs(10 * 60);
/// How long a delivery may trail GitHub's creation of a job before the job counts as one no
/// delivery announced (GitHub usually delivers within seconds).
pub(crate) const ANNOUNCE_GRACE: Duration = Duration::from_secs(2 * 60);

/// Evidence that a delivery was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Evidence {
    /// A poll found a queued job no delivery announced.
    UnannouncedJob,
    /// GitHub's hook log holds a delivery that never succeeded.
    FailedDelivery,
}

impl Evidence {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Evidence::UnannouncedJob => "unannounced_job",
            Evidence::FailedDelivery => "failed_delivery",
        }
    }
}

/// The verdict at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trust {
    pub trusted: bool,
    /// `deliveries_trusted`, `no_intake`, `unannounced_job`, `failed_delivery`.
    pub reason: &'static str,
    /// The latest evidence of a lost delivery that still counts.
    pub evidence_at: Option<SystemTime>,
}

/// What the agent knows about its deliveries.
#[derive(Debug, Clone)]
pub(crate) struct WebhookHealth {
    intake: bool,
    evidence: Option<(Evidence, SystemTime)>,
}

impl WebhookHealth {
    /// `intake`: a receiver or a relay subscription is configured.
    pub(crate) fn new(intake: bool) -> Self {
        Self {
            intake,
            evidence: None,
        }
    }

    pub(crate) fn intake(&self) -> bool {
        self.intake
    }

    /// Records evidence of a lost delivery seen at `at`.
    pub(crate) fn distrust(&mut self, evidence: Evidence, at: SystemTime) {
        if self.evidence.is_none_or(|(_, t)| at >= t) {
            self.evidence = Some((evidence, at));
        }
    }

    /// The verdict at `now`, given when the newest delivery was journalled; forgets evidence
    /// that trust has outlived.
    pub(crate) fn assess(
        &mut self,
        last_delivery_at: Option<SystemTime>,
        now: SystemTime,
    ) -> Trust {
        if !self.intake {
            return Trust {
                trusted: false,
                reason: "no_intake",
                evidence_at: None,
            };
        }
        if let Some((evidence, at)) = self.evidence {
            let delivered_since = last_delivery_at.is_some_and(|d| d > at);
            let quiet_long_enough =
                now.duration_since(at).unwrap_or(Duration::ZERO) >= TRUST_RESTORE_AFTER;
            if !(delivered_since && quiet_long_enough) {
                return Trust {
                    trusted: false,
                    reason: evidence.as_str(),
                    evidence_at: Some(at),
                };
            }
            self.evidence = None;
        }
        Trust {
            trusted: true,
            reason: "deliveries_trusted",
            evidence_at: None,
        }
    }
}

/// Whether a polled queued job that no delivery has announced is evidence yet: only once the
/// grace for its delivery has passed since GitHub created it (or, when its creation time is
/// unknown, since the poll first saw it).
pub(crate) fn is_unannounced(created_or_seen_at: SystemTime, now: SystemTime) -> bool {
    now.duration_since(created_or_seen_at)
        .is_ok_and(|age| age >= ANNOUNCE_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn without_a_receiver_or_relay_deliveries_are_never_trusted() {
        let mut h = WebhookHealth::new(false);
        let trust = h.assess(Some(t(100)), t(100));
        assert_eq!((trust.trusted, trust.reason), (false, "no_intake"));
    }

    #[test]
    fn deliveries_are_trusted_until_evidence_of_a_loss() {
        let mut h = WebhookHealth::new(true);
        assert!(h.assess(None, t(0)).trusted, "an idle org sends nothing");
        h.distrust(Evidence::UnannouncedJob, t(10));
        let trust = h.assess(Some(t(5)), t(11));
        assert_eq!(
            trust,
            Trust {
                trusted: false,
                reason: "unannounced_job",
                evidence_at: Some(t(10))
            }
        );
    }

    #[test]
    fn trust_returns_after_a_new_delivery_and_ten_quiet_minutes() {
        let mut h = WebhookHealth::new(true);
        h.distrust(Evidence::FailedDelivery, t(0));
        let restore = TRUST_RESTORE_AFTER.as_secs();
        // Time alone is not enough: nothing has arrived since.
        assert!(!h.assess(Some(t(0)), t(restore)).trusted);
        // A delivery alone is not enough: not quiet long enough.
        assert!(!h.assess(Some(t(30)), t(restore - 1)).trusted);
        // New evidence restarts the wait.
        h.distrust(Evidence::UnannouncedJob, t(60));
        assert!(!h.assess(Some(t(70)), t(restore + 30)).trusted);
        let back = h.assess(Some(t(70)), t(60 + restore));
        assert_eq!((back.trusted, back.reason), (true, "deliveries_trusted"));
        // The evidence is forgotten once trust is back.
        assert!(h.assess(Some(t(70)), t(60 + restore + 1)).trusted);
    }

    #[test]
    fn older_evidence_never_replaces_newer() {
        let mut h = WebhookHealth::new(true);
        h.distrust(Evidence::UnannouncedJob, t(100));
        h.distrust(Evidence::FailedDelivery, t(50));
        assert_eq!(h.assess(None, t(101)).evidence_at, Some(t(100)));
    }

    #[test]
    fn a_job_is_unannounced_only_after_the_grace() {
        let grace = ANNOUNCE_GRACE.as_secs();
        assert!(!is_unannounced(t(0), t(grace - 1)));
        assert!(is_unannounced(t(0), t(grace)));
        assert!(
            !is_unannounced(t(10), t(0)),
            "a clock behind is not evidence"
        );
    }
}
