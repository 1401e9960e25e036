//! The polling fallback: the safety net under webhooks (ARCHITECTURE guarantee 5). It owns
//! the poll schedule ([`schedule`]), webhook health ([`health`]), polled demand
//! ([`targets`]: what GitHub's REST API shows enters the journal with source `poll`, through the
//! same forward-only merge as a delivery, each job read by the one conversion in `sighting`),
//! stale queued jobs ([`stale`]), failed-delivery
//! recovery ([`redeliver`]) and what `status` shows about all of it ([`status`]). It decides
//! nothing about runners: the allocation reads the journal it writes.
//!
//! [`Poller`] is the loop: [`Poller::run`] until a shutdown future completes, or
//! [`Poller::poll_once`] for one step; [`Poller::status`] watches its [`PollerStatus`] and
//! [`Poller::changes`] ticks whenever a pass moved a job in the journal. It writes through any
//! `rm_journal::PollStore` (the SQLite file, or a fleet's PostgreSQL database), every call on the
//! blocking pool (`blocking`). In a fleet ([`Poller::with_fleet`]) each target is polled by one
//! host at a time, elected per target ([`election`]): one REST budget for the fleet.

mod blocking;
pub(crate) mod election;
pub(crate) mod health;
mod poller;
pub(crate) mod redeliver;
pub(crate) mod schedule;
mod sighting;
pub(crate) mod stale;
pub(crate) mod status;
pub(crate) mod targets;

use std::time::Duration;

pub(crate) use poller::Poller;
pub(crate) use status::{PollerStatus, UnreadableTarget};

use crate::config::Config;

/// The poller's slow cadences. Production uses [`Pacing::default`] (the documented consts);
/// `rm-agent demo` shortens them so a lost webhook is recovered within its half minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pacing {
    /// How often demand is reconciled while webhooks are trusted.
    pub reconcile_interval: Duration,
    /// How often the App's hook deliveries are scanned for failures.
    pub scan_interval: Duration,
    /// How old a failed delivery attempt must be before it is judged (GitHub may still retry).
    pub delivery_settle: Duration,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            reconcile_interval: health::RECONCILE_INTERVAL,
            scan_interval: redeliver::SCAN_INTERVAL,
            delivery_settle: redeliver::DELIVERY_SETTLE,
        }
    }
}

/// What the poller needs from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PollerConfig {
    /// Distinct policy targets, each polled once per pass.
    pub targets: Vec<rm_github::Target>,
    /// `[polling] interval` (active).
    pub interval: Duration,
    /// `[polling] idle_interval`.
    pub idle_interval: Duration,
    /// A receiver or a relay subscription is configured (deliveries can arrive at all).
    pub intake: bool,
}

impl PollerConfig {
    /// The targets of every webhook policy, each once (GitHub's names are case-insensitive). A
    /// scale set's policy is not polled: its demand is the scale set's, whose messages GitHub
    /// redelivers until they are acknowledged, so polling would only spend REST budget.
    pub(crate) fn from_config(config: &Config) -> PollerConfig {
        let mut targets: Vec<rm_github::Target> = Vec::new();
        for policy in config.policies.iter().filter(|p| p.scale_set.is_none()) {
            let target = policy.target.clone();
            let key = target.to_string().to_ascii_lowercase();
            if !targets
                .iter()
                .any(|t| t.to_string().to_ascii_lowercase() == key)
            {
                targets.push(target);
            }
        }
        PollerConfig {
            targets,
            interval: config.polling.interval,
            idle_interval: config.polling.idle_interval,
            // In a fleet, the webhooks reach the shared journal through `rm-agent receive`.
            intake: config.receiver.is_some()
                || config.relay.is_some()
                || config.pg_journal.is_some(),
        }
    }
}

#[cfg(test)]
mod tests;
