//! What `explain` adds in a fleet (CONTRACT §9, `journal.url`): the job's claim. A job claimed
//! by another live host is that host's to serve: its runner is on its way there, and this
//! host's own chain (its runners, ceilings, back-off) does not apply. A job this host claimed,
//! or no host has claimed yet, gets this host's chain, and a reason that says which. Claims
//! count only under a live lease (the fleet's rule, `rm_journal::FleetView`), so a job claimed
//! by a host that died reads as unclaimed: the other hosts take it.

use std::collections::HashSet;

use rm_journal::{ClaimView, FleetView, HostView, JobRow};
use rm_vocab::{JobId, UnixMs};

use super::{Condition, Facts, Reason, Verdict, ago_phrase, condition, reason};

/// In a fleet: this host's name and the fleet as the journal holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FleetFacts<'a> {
    pub host: &'a str,
    pub view: &'a FleetView,
}

/// The live host holding a claim on `job`, and the claim.
fn claim_of(view: &FleetView, job: JobId) -> Option<(&HostView, &ClaimView)> {
    view.hosts.iter().filter(|h| h.live).find_map(|host| {
        host.claims
            .iter()
            .find(|c| c.job_id == job)
            .map(|claim| (host, claim))
    })
}

/// The jobs other live hosts hold claims on: not this host's queue.
pub(super) fn claimed_elsewhere(fleet: FleetFacts<'_>) -> HashSet<JobId> {
    fleet
        .view
        .hosts
        .iter()
        .filter(|h| h.live && h.host != fleet.host)
        .flat_map(|h| h.claims.iter().map(|c| c.job_id))
        .collect()
}

/// A queued job another live host claimed: the verdict, the runner that host started for it
/// (when it has said) and the policy it claimed it under.
pub(super) struct HeldElsewhere {
    pub condition: Condition,
    pub runner: Option<String>,
    pub policy: String,
}

/// The verdict for a queued job another live host claimed; `None` when no other host holds it.
pub(super) fn held_elsewhere(
    job: &JobRow,
    fleet: FleetFacts<'_>,
    now_ms: UnixMs,
) -> Option<HeldElsewhere> {
    let (holder, claim) = claim_of(fleet.view, job.job_id)?;
    if holder.host == fleet.host {
        return None;
    }
    let runner = match &claim.runner_name {
        Some(runner) => format!("started runner {runner} for it"),
        None => "is allocating a runner for it".to_owned(),
    };
    Some(HeldElsewhere {
        condition: condition(
            Verdict::Launching,
            reason(
                "claimed_by_host",
                format!(
                    "Host {} claimed the job {} for its policy {} and {runner} (its lease was \
                     renewed {}); no other host starts one while that lease holds. \
                     `rm-agent explain {}` on {} says more.",
                    holder.host,
                    ago_phrase(now_ms, claim.claimed_at_ms),
                    claim.policy,
                    ago_phrase(now_ms, holder.renewed_at_ms),
                    job.job_id,
                    holder.host,
                ),
            ),
            "claimed by another host",
        ),
        runner: claim.runner_name.clone(),
        policy: claim.policy.clone(),
    })
}

/// The further reason for a queued job this host serves by its own chain: claimed here, or
/// claimed by no host yet (then every live host may take it).
pub(super) fn own_chain_context(job: &JobRow, facts: &Facts<'_>) -> Option<Reason> {
    let fleet = facts.fleet?;
    if let Some((_, claim)) = claim_of(fleet.view, job.job_id) {
        return Some(reason(
            "claimed_here",
            format!(
                "This host ({}) claimed the job {} for its policy {}: no other host starts a \
                 runner for it while this host's lease holds.",
                fleet.host,
                ago_phrase(facts.now_ms, claim.claimed_at_ms),
                claim.policy
            ),
        ));
    }
    let live: Vec<&str> = fleet
        .view
        .hosts
        .iter()
        .filter(|h| h.live)
        .map(|h| h.host.as_str())
        .collect();
    let hosts = if live.is_empty() {
        "no host holds a live lease: no host runs `rm-agent run` on this journal".to_owned()
    } else {
        format!("live hosts: {}", live.join(", "))
    };
    Some(reason(
        "unclaimed",
        format!(
            "No host has claimed the job yet ({hosts}): each claims the queued jobs its \
             policies match as it has room, at its next allocation pass. This answer is this \
             host's ({}) view.",
            fleet.host
        ),
    ))
}
