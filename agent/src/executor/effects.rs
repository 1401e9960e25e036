//! Supervision's slow effects, each carried out by a task of its own so that the control loop
//! never waits for one: stopping a runner (SIGTERM, up to [`super::STOP_GRACE`], SIGKILL), and
//! cleaning a concluded attempt in [`super::cleanup`]'s order (its leftovers stopped, its logs
//! kept, its runtime removed and its release journalled, which frees its uid; then its
//! registration removed, retried while GitHub holds the runner busy; then `cleaned`
//! journalled). Removing a checkout of a few hundred thousand files takes seconds; a job queued
//! meanwhile is allocated in the very next pass.
//!
//! Supervision decides and journals the intent first (the stop intent, the conclusion), then
//! hands the effect to the loop ([`Effect`]); the loop runs it as a task it owns and joins, and
//! gives supervision the task's [`Effected`] back. An attempt with an effect in flight is not
//! supervised again until it reports, so no two effects of one attempt ever overlap. Every
//! effect is idempotent: an agent killed in the middle of one finds the same decision again at
//! its next start.
//!
//! This is the one place our attempts' registrations are removed
//! ([`deregister_if_listed`]); the inventory reconciliation ([`super::recovery`]) removes only
//! registrations no attempt owns.

use std::sync::Arc;

use rm_github::Target;
use rm_journal::{AttemptId, AttemptRecord, StopIntent};
use rm_vocab::UnixMs;

use super::cleanup::{self, Registration, Step};
use super::context::Context;
use super::deregister::{self, Deregistration, Seen, Why};
use super::registry::Listing;
use crate::fault;
use rm_runner::Removal;
use rm_runner::process::ProcessIdentity;

/// A slow effect supervision decided, its intent already journalled.
#[derive(Debug)]
pub(super) enum Effect {
    /// Stop the runner's process group (its stop intent is journalled).
    Stop {
        record: AttemptRecord,
        identity: ProcessIdentity,
    },
    /// Clean a concluded attempt.
    Clean(Cleanup),
    /// Scale down an idle runner of a scale set that wants fewer ([`scale_down`]).
    ScaleDown {
        record: AttemptRecord,
        identity: ProcessIdentity,
    },
}

/// What cleaning one concluded attempt needs to know.
#[derive(Debug)]
pub(super) struct Cleanup {
    /// The attempt as concluded.
    pub(super) record: AttemptRecord,
    /// Its policy's target; `None`: the policy is no longer configured, so GitHub cannot be
    /// asked (its registration, if any, is GitHub's to expire).
    pub(super) target: Option<Target>,
    /// The target's listing, fetched after the conclusion; `None`: leave the registration be.
    pub(super) listing: Option<Listing>,
    /// Since when GitHub has answered that the runner is still busy, if it has.
    pub(super) busy_since: Option<UnixMs>,
}

impl Effect {
    /// The attempt the effect is for.
    pub(super) fn attempt(&self) -> &AttemptRecord {
        match self {
            Effect::Stop { record, .. }
            | Effect::Clean(Cleanup { record, .. })
            | Effect::ScaleDown { record, .. } => record,
        }
    }
}

/// How an effect ended, for supervision's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Effected {
    pub(super) attempt: AttemptId,
    pub(super) outcome: Outcome,
}

/// The end of one effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The stop ended (the runner is gone, or it was not ours to signal any more).
    Stopped,
    /// A scale-down left the runner running (the service refused its removal, or it could not
    /// be asked): another may be picked.
    ScaleDownKept,
    /// The attempt is cleaned; `deregistered`: the runner name whose registration this cleanup
    /// removed from the target, so a listing held no longer shows it.
    Cleaned {
        deregistered: Option<(Target, String)>,
    },
    /// GitHub still holds the runner busy (a `422`): cleanup waits and deregisters again at
    /// `next`, counting the wait from `first`.
    DeregisterBusy { first: UnixMs, next: UnixMs },
    /// The runtime could not be removed or the release journalled, a scale set's runner could
    /// not be removed from it, or the cleanup task failed: tried again later.
    CleanFailed,
    /// The effect's task ended without reporting (it panicked or was aborted): supervision
    /// looks at the attempt afresh.
    Lost,
}

/// Carries out `effect`; the task the control loop runs.
pub(super) async fn carry_out(ctx: Arc<Context>, effect: Effect) -> Effected {
    match effect {
        Effect::Stop { record, identity } => {
            tracing::info!(pid = identity.pid, "stopping a runner");
            ctx.stop(record.isolation, identity).await;
            Effected {
                attempt: record.attempt_id,
                outcome: Outcome::Stopped,
            }
        }
        Effect::Clean(cleanup) => {
            let attempt = cleanup.record.attempt_id.clone();
            let outcome = clean(&ctx, cleanup).await;
            Effected { attempt, outcome }
        }
        Effect::ScaleDown { record, identity } => {
            let stopped = scale_down(&ctx, &record, identity).await;
            Effected {
                attempt: record.attempt_id,
                outcome: if stopped {
                    Outcome::Stopped
                } else {
                    Outcome::ScaleDownKept
                },
            }
        }
    }
}

/// Scales down an idle scale-set runner; returns whether it was stopped. Its stop intent is
/// journalled first (a compare-and-set on `idle`: one that took a job since is left alone), so
/// a crash at any step leaves the decision behind for the next start, which resumes it. Then
/// the runner is removed from the scale set: the service refuses one it just handed a job
/// (`JobStillRunningException`), and such a runner is not stopped (its intent, inert, is
/// dropped by its next state). Only once removed is its process stopped.
async fn scale_down(ctx: &Context, record: &AttemptRecord, identity: ProcessIdentity) -> bool {
    let (Some(source), Some(runner_id)) = (
        ctx.settings.scale_sets.of_policy(&record.policy),
        record.runner_id,
    ) else {
        return false;
    };
    let (attempt, now) = (record.attempt_id.clone(), ctx.now());
    match ctx
        .journal
        .write(move |attempts| attempts.record_stop_intent(&attempt, StopIntent::ScaleDown, now))
        .await
    {
        Ok(true) => {}
        Ok(false) => return false,
        Err(e) => {
            tracing::warn!(error = %e, "cannot journal the scale-down; the runner stays for now");
            return false;
        }
    }
    fault::crash_point("scale_down_intended");
    let id = u64::try_from(runner_id.get()).unwrap_or_default();
    let removal = source.client.remove_runner(id).await;
    match deregister::scale_set_deregistration(&removal) {
        Deregistration::Settled => {}
        Deregistration::Busy => {
            tracing::info!("the scale set's surplus runner took a job meanwhile; it stays");
            return false;
        }
        Deregistration::Failed => {
            if let Err(e) = removal {
                tracing::warn!(error = %e, "cannot remove the scale set's surplus runner; it stays for now");
            }
            return false;
        }
    }
    fault::crash_point("scale_down_removed");
    tracing::info!(
        pid = identity.pid,
        "scaling down: the scale set wants fewer runners; removed from it, stopping the runner"
    );
    ctx.stop(record.isolation, identity).await;
    true
}

/// A concluded attempt, in [`cleanup::next`]'s order: everything it started stopped, its
/// runtime removed without following links and its release journalled (its uid free), then its
/// registration removed (or waited for while GitHub holds the runner busy), and then `cleaned`.
async fn clean(ctx: &Context, cleanup: Cleanup) -> Outcome {
    let Cleanup {
        record,
        target,
        listing,
        busy_since,
    } = cleanup;
    let mut released = record.released_at_ms.is_some();
    let mut registration = Registration::Untried;
    let mut deregistered = None;
    loop {
        match cleanup::next(released, registration, ctx.now()) {
            Step::Release => {
                if !release(ctx, &record).await {
                    return Outcome::CleanFailed;
                }
                released = true;
                fault::crash_point("released");
            }
            Step::Deregister => {
                let (settled, removed) =
                    deregister_ended(ctx, &record, target.as_ref(), listing.as_ref()).await;
                registration = match settled {
                    Deregistration::Settled => Registration::Settled,
                    Deregistration::Busy => Registration::Busy {
                        first: busy_since.unwrap_or_else(|| ctx.now()),
                    },
                    Deregistration::Failed => Registration::Failed {
                        retried_here: ctx.settings.scale_sets.of_policy(&record.policy).is_some(),
                    },
                };
                deregistered = removed;
            }
            Step::DeregisterAt { first, next } => return Outcome::DeregisterBusy { first, next },
            Step::RetryLater => return Outcome::CleanFailed,
            Step::Finish => break,
        }
    }
    if let Registration::Busy { .. } = registration {
        tracing::warn!(
            waited_s = deregister::DEREGISTER_BUSY_LIMIT.as_secs(),
            "GitHub still holds the runner busy; leaving its registration to the inventory reconciliation"
        );
    }
    let (id, at) = (record.attempt_id.clone(), ctx.now());
    match ctx
        .journal
        .write(move |attempts| attempts.mark_cleaned(&id, at))
        .await
    {
        Ok(true) => tracing::info!("cleaned"),
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot journal the cleanup; it is done again");
            return Outcome::CleanFailed;
        }
    }
    Outcome::Cleaned { deregistered }
}

/// The host's part of a cleanup: what the runner started stopped, its logs kept, its runtime
/// removed by its backend (which kills its cgroup and every process of its uid first), and only
/// then the release journalled, which frees the uid. Returns whether the attempt is released.
async fn release(ctx: &Context, record: &AttemptRecord) -> bool {
    if let Some(identity) = super::supervise::journalled_identity(record) {
        ctx.stop(record.isolation, identity).await;
    }
    fault::crash_point("cleanup");
    record_usage(ctx, record).await;
    if !remove_runtime(ctx, record).await {
        return false;
    }
    let (id, at) = (record.attempt_id.clone(), ctx.now());
    match ctx
        .journal
        .write(move |attempts| attempts.mark_released(&id, at))
        .await
    {
        Ok(true) => {
            tracing::info!(uid = record.uid, "runtime removed and runner uid released");
            true
        }
        // Released before (a cleanup run again after a crash) or cleaned meanwhile.
        Ok(false) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot journal the release; the cleanup is done again");
            false
        }
    }
}

/// What the runner used (issue 42: `memory.peak`, `cpu.stat`), read from its cgroup once its
/// processes are stopped and before its backend removes the cgroup, and journalled once for
/// `rm-agent shapes`. Nothing is recorded where nothing could be read (no cgroup, or one a
/// cleanup before a crash already removed).
async fn record_usage(ctx: &Context, record: &AttemptRecord) {
    let Some(cgroup) = record.cgroup.clone() else {
        return;
    };
    let usage = match tokio::task::spawn_blocking(move || rm_runner::read_usage(&cgroup)).await {
        Ok(usage) => usage,
        Err(_) => return,
    };
    if usage.peak_memory.is_none() && usage.cpu_usec.is_none() {
        return;
    }
    let (id, at) = (record.attempt_id.clone(), ctx.now());
    if let Err(e) = ctx
        .journal
        .write(move |attempts| attempts.record_usage(&id, usage.peak_memory, usage.cpu_usec, at))
        .await
    {
        tracing::warn!(error = %e, "cannot journal what the runner used");
    }
}

/// GitHub's part of a cleanup: the ended runner's registration removed, through its scale set's
/// Actions service or the REST API, and the name removed from the target for the listing held.
async fn deregister_ended(
    ctx: &Context,
    record: &AttemptRecord,
    target: Option<&Target>,
    listing: Option<&Listing>,
) -> (Deregistration, Option<(Target, String)>) {
    let scale_set = ctx.settings.scale_sets.of_policy(&record.policy);
    match (scale_set, target, listing) {
        // A scale set's runner is removed through the scale set's Actions service (no REST
        // request), which refuses a busy one by the name of its exception. Nothing else can
        // remove it (no REST inventory reconciliation covers a scale set), so a removal that
        // failed is tried again with the cleanup.
        (Some(source), Some(_), _) => {
            let removal = deregister::remove_ended_from_scale_set(
                source,
                &record.runner_name,
                record.runner_id,
            )
            .await;
            (removal, None)
        }
        (None, Some(target), Some(listing)) => {
            deregister_if_listed(ctx, record, target, listing).await
        }
        _ => (Deregistration::Settled, None),
    }
}

/// The runner's logs kept, then its runtime removed by its backend, off the async workers;
/// returns whether the runtime is gone.
async fn remove_runtime(ctx: &Context, record: &AttemptRecord) -> bool {
    // What the runner asked for and reached, read from its table before its network goes.
    if let Some(egress) = ctx.settings.egress.as_ref().filter(|e| e.covers(record)) {
        let id = record.attempt_id.clone();
        let kept = ctx
            .journal
            .write(move |attempts| attempts.egress(&id))
            .await
            .ok()
            .flatten();
        if let Some((json, _flushing)) = egress.last_record(record, kept).await {
            let (id, at) = (record.attempt_id.clone(), ctx.now());
            if let Err(e) = ctx
                .journal
                .write(move |attempts| attempts.write_egress(&id, &json, at))
                .await
            {
                tracing::warn!(error = %e, "cannot journal what the runner reached");
            }
        }
    }
    let backends = Arc::clone(&ctx.execution);
    let (kind, plan) = (record.isolation, ctx.plan(record));
    // The runner's logs, before the runtime goes (the runner's group is stopped; a process that
    // escaped it is the job's, whose writes are evidence anyway). Idempotent, and it never
    // fails the cleanup (`rm_runner::logs`).
    let keep = ctx
        .settings
        .logs
        .clone()
        // The log store's manifests count in plain milliseconds (its own edge).
        .map(|store| (store, rm_runner::logs::Attempt::of(record), ctx.now().get()));
    let removal = tokio::task::spawn_blocking(move || {
        if let Some((store, attempt, now)) = keep {
            store.keep_and_prune(&attempt, now);
        }
        match backends.of(kind) {
            Some(backend) => backend.clean(&plan).map_err(|e| e.to_string()),
            None => Err(super::context::unavailable(kind)),
        }
    })
    .await;
    match removal {
        Ok(Ok(cleaned)) => {
            if cleaned.killed > 0 {
                tracing::warn!(
                    killed = cleaned.killed,
                    "stopped processes that had left the runner's process group"
                );
            }
            if cleaned.runtime == Removal::Removed {
                tracing::debug!("runtime removed (or slot scrubbed down to _work)");
            }
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot clean up after the runner; will try again");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "the cleanup task failed; will try again");
            false
        }
    }
}

/// Removes the runner's registration if GitHub (still) lists it ([`deregister::decide`]), and
/// returns how that went with the name removed from the target. A `422` (GitHub still holds
/// the runner busy with the job it just finished) is [`Deregistration::Busy`], retried by a
/// later cleanup; any other failure is left to the inventory reconciliation.
async fn deregister_if_listed(
    ctx: &Context,
    record: &AttemptRecord,
    target: &Target,
    listing: &Listing,
) -> (Deregistration, Option<(Target, String)>) {
    let seen = match listing {
        Ok(runners) => runners
            .get(&record.runner_name)
            .map_or(Seen::NotListed, |listed| Seen::Listed(*listed)),
        Err(_) => Seen::Unknown,
    };
    let why = Why::Ended {
        journalled: record.runner_id,
    };
    let deregister::Decision::Remove(runner_id) = deregister::decide(why, seen) else {
        return (Deregistration::Settled, None);
    };
    match deregister::remove(&ctx.registry, target, runner_id, why).await {
        Deregistration::Settled => (
            Deregistration::Settled,
            Some((target.clone(), record.runner_name.clone())),
        ),
        other => (other, None),
    }
}
