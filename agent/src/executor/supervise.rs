//! The supervision room: one observation and one [`recovery_decision`] per journalled
//! attempt, and the decision carried out: an attempt marked idle or busy and a stop intent or a
//! conclusion journalled here, in the pass; the slow effects (stopping a runner, cleaning a
//! concluded attempt: its runtime removed and its uid released, then its registration) handed
//! back to the control loop in the [`PassReport`], which runs each as a task
//! ([`super::effects`]) so that no allocation ever waits for one. It owns what supervision remembers between passes
//! ([`Supervisor`]: the runner listings it holds, the cleanup retries, the effects in flight).
//! Startup recovery runs the same pass with the startup timers; the only difference is that
//! GitHub is always asked afresh. What it concluded goes back to the control loop in its
//! [`PassReport`], for allocation's fences.
//!
//! GitHub is asked as little as the decision allows: one conditional runner listing per target
//! per need (an unchanged list is a free `304`), fetched afresh only where the decision depends
//! on it (a dead process, a timer that ran out, a conclusion to deregister), otherwise reused
//! while young enough.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rm_github::Target;
use rm_journal::{AttemptError, AttemptId, AttemptRecord, AttemptState};
use rm_vocab::{JobId, UnixMs};
use tracing::Instrument as _;

use super::allocate::{Concluded, LaunchFailure};
use super::context::Context;
use super::disk_watch::{DiskWatch, Watched};
use super::effects::{Cleanup, Effect, Effected, Outcome};
use super::registry::{self, Listing};
use super::{evidence, findings, targets_by_policy};
use crate::fault;
use crate::lifecycle::{
    AttemptFacts, Conclusion, Decision, ExitSeen, FailureReason, Findings, GithubObservation,
    Observation, ProcessObservation, StopIntent, Timeouts, recovery_decision,
};
use rm_runner::discover;
use rm_runner::process::{self, ProcessIdentity, ProcessState};

/// How old a listing may be for a runner that is still starting: registration is noticed
/// within this, and a target with runners starting costs at most one request per interval.
pub(super) const REGISTRATION_CHECK: Duration = Duration::from_secs(5);

/// How old a listing may be while a runner is idle: a ghost (alive, no longer listed online) is
/// noticed within this, and a target with idle runners costs at most one conditional request
/// per interval.
pub(super) const GHOST_CHECK: Duration = Duration::from_secs(30);

/// The detail of a scale set's idle runner stopped because the scale set wanted fewer runners.
const SCALED_DOWN: &str = "the runner's scale set wanted fewer runners than it had (jobs cancelled, or taken by other runners): removed from the scale set while idle, then stopped; not replaced";

/// How long a failed runtime removal waits before it is tried again (doubling per failure).
pub(super) const CLEAN_RETRY: Duration = Duration::from_secs(30);

/// The longest wait between two tries of a failing runtime removal.
pub(super) const CLEAN_RETRY_MAX: Duration = Duration::from_secs(30 * 60);

/// How fresh a listing must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Freshness {
    /// Fetched after this time.
    After(UnixMs),
    /// Any listing will do; fetch one if there is none.
    Any,
}

/// What one pass knows beside the attempt.
#[derive(Debug, Clone, Copy)]
struct Pass {
    timeouts: Timeouts,
    /// Startup recovery: listings fetched afresh, deferrals keep recovery incomplete.
    startup: bool,
    /// The journal has the attempt's job completed.
    job_completed: bool,
    /// The attempt's policy serves a scale set: its runner is watched on this host alone
    /// ([`scale_set_observation`]), never through GitHub's REST listing.
    scale_set: bool,
}

/// What supervision saw of one attempt this pass: what the decision reads, and what carrying
/// it out needs.
struct Looked {
    observation: Observation,
    /// The process the journal (or the runtime's residents) names, if any.
    identity: Option<ProcessIdentity>,
    /// The target's listing, when the attempt's policy is configured.
    listing: Option<Listing>,
    /// The kernel's memory counters of an ended runner, for its conclusion's detail.
    memory: findings::Memory,
    /// The policy's `disk_max`, for the stop's warning.
    disk_max: Option<u64>,
}

/// What supervision remembers between passes; owned by the control loop.
#[derive(Default)]
pub(super) struct Supervisor {
    /// The last listing of each target, with when it was fetched.
    listings: HashMap<Target, (UnixMs, Listing)>,
    /// Failed runtime removals: (next try, the last wait).
    clean_retry: HashMap<AttemptId, (UnixMs, Duration)>,
    /// Cleanups waiting for GitHub to let go of a busy runner: (first `422`, next try).
    deregister_busy: HashMap<AttemptId, (UnixMs, UnixMs)>,
    /// Live runtimes measured against their policy's `disk_max`, off the loop.
    disk: DiskWatch,
    /// How the runner processes this agent reaped ended, until their attempts are concluded.
    exits: HashMap<AttemptId, ExitSeen>,
    /// The runners whose process this agent started and its launch task still waits on: one
    /// seen dead is not concluded before its exit status arrives (the reaper's event is
    /// imminent), so the end is judged with it.
    reaping: HashSet<AttemptId>,
    /// Since when each idle runner seen alive has not been listed online by GitHub.
    unlisted_since: HashMap<AttemptId, UnixMs>,
    /// The attempts with an effect in flight (a stop or a cleanup): left alone until it
    /// reports ([`Supervisor::note_effected`]), so two effects of one attempt never overlap.
    in_flight: HashSet<AttemptId>,
    /// The scale-set runners being scaled down, with their policy: from the pick until the
    /// runner is concluded, or, when its removal was refused, until the time given (one
    /// [`crate::scaleset::SCALE_DOWN_GRACE`] later). No more of a policy's runners are picked
    /// meanwhile: the plan's surplus still counts these until a plan made after their end, and
    /// a service that refuses is not asked again at every pass.
    scaling_down: HashMap<AttemptId, (String, Option<UnixMs>)>,
    /// Launches that failed, with why: concluded so at the next pass (supervision is the one
    /// owner of conclusions; a launch only says how it ended).
    launch_failed: HashMap<AttemptId, (FailureReason, String)>,
}

/// What a supervision pass found, and the slow effects it decided.
#[derive(Debug, Default)]
pub(super) struct PassReport {
    /// Attempts nothing could be decided for (GitHub unreachable, or an unknown policy).
    pub(super) deferred: usize,
    /// The attempts it concluded, for allocation's memory.
    pub(super) concluded: Vec<Concluded>,
    /// The runners the journal now says took a job (learnt this pass), for a fleet's claims.
    pub(super) took: Vec<Took>,
    /// The stops and cleanups decided (their intents journalled), for the loop to run as tasks;
    /// their attempts are left alone until each reports.
    pub(super) effects: Vec<Effect>,
}

/// One of this host's runners took a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Took {
    pub(super) policy: String,
    pub(super) runner_name: String,
    pub(super) job_id: JobId,
}

impl Supervisor {
    /// A runner process this agent started runs, and its launch task waits on it.
    pub(super) fn note_started(&mut self, attempt: AttemptId) {
        self.reaping.insert(attempt);
    }

    /// A runner process this agent started exited so (the launch task reaped it; `None`: its
    /// status could not be read).
    pub(super) fn note_exit(&mut self, attempt: AttemptId, exit: Option<ExitSeen>) {
        self.reaping.remove(&attempt);
        if let Some(exit) = exit {
            self.exits.insert(attempt, exit);
        }
    }

    /// A launch ended without a runner, so: the attempt is concluded failed at the next pass.
    pub(super) fn note_launch_failed(&mut self, attempt: AttemptId, failure: &LaunchFailure) {
        self.launch_failed
            .insert(attempt, (failure.reason, failure.detail.clone()));
    }

    /// An effect this supervisor decided has ended (`now`: when its report arrived).
    pub(super) fn note_effected(&mut self, effected: Effected, now: UnixMs) {
        let Effected { attempt, outcome } = effected;
        self.in_flight.remove(&attempt);
        match outcome {
            Outcome::Stopped | Outcome::Lost => {}
            Outcome::ScaleDownKept => {
                if let Some((_, kept_until)) = self.scaling_down.get_mut(&attempt) {
                    *kept_until = Some(now + crate::scaleset::SCALE_DOWN_GRACE);
                }
            }
            Outcome::Cleaned { deregistered } => {
                self.clean_retry.remove(&attempt);
                self.deregister_busy.remove(&attempt);
                if let Some((target, name)) = deregistered
                    && let Some((_, Ok(runners))) = self.listings.get_mut(&target)
                {
                    runners.remove(&name);
                }
            }
            Outcome::DeregisterBusy { first, next } => {
                self.deregister_busy.insert(attempt, (first, next));
            }
            Outcome::CleanFailed => self.clean_failed(&attempt, now),
        }
    }

    /// Supervises every attempt that is not being launched (`launching`) and has no effect in
    /// flight. `startup`: every listing is fetched afresh and deferrals make recovery
    /// incomplete.
    pub(super) async fn pass(
        &mut self,
        ctx: &Context,
        launching: &HashSet<AttemptId>,
        timeouts: Timeouts,
        startup: bool,
        surplus: &HashMap<String, u32>,
    ) -> Result<PassReport, AttemptError> {
        let pass_started = ctx.now();
        let records: Vec<AttemptRecord> = ctx
            .journal
            .write(|attempts| attempts.list(rm_journal::Scope::Uncleaned, None))
            .await?
            .into_iter()
            .filter(|r| {
                !launching.contains(&r.attempt_id) && !self.in_flight.contains(&r.attempt_id)
            })
            .collect();
        let (records, took, completed) = note_jobs_taken(ctx, records).await?;
        // Walks that finished since the last pass count in this one; the next one starts after.
        self.disk.collect();
        let watched = watched(ctx, &records);
        let targets = targets_by_policy(&ctx.settings.policies);
        let mut report = PassReport {
            took,
            ..PassReport::default()
        };
        let now = ctx.now();
        let records: Vec<AttemptRecord> = records
            .into_iter()
            .filter(|r| !r.state.is_terminal() || self.clean_due(&r.attempt_id, now))
            .collect();
        let scale_set: Vec<bool> = records
            .iter()
            .map(|r| ctx.settings.scale_sets.of_policy(&r.policy).is_some())
            .collect();
        let sights = sight_all(ctx, &records, &scale_set, startup).await;
        let launch_failed = &self.launch_failed;
        let needs: Vec<(&Target, Freshness)> = records
            .iter()
            .zip(&sights)
            .zip(&scale_set)
            .filter_map(|((record, sight), scale_set)| {
                // A scale set's runners are watched on this host and removed through the
                // Actions service: no REST listing is ever needed for them.
                if *scale_set {
                    return None;
                }
                let freshness = if startup {
                    Freshness::After(pass_started)
                } else if launch_failed.contains_key(&record.attempt_id) {
                    // A failed launch may have registered a runner (its id journalled, or a JIT
                    // configuration issued whose answer came too late: found by its name): its
                    // cleanup deregisters it by a listing made now.
                    Freshness::After(now.saturating_add_ms(-1))
                } else {
                    freshness_for(record, sight.process, timeouts, now)
                };
                Some((targets.get(&record.policy)?, freshness))
            })
            .collect();
        self.refresh_listings(ctx, needs.into_iter()).await;
        self.scale_down(&records, &sights, surplus, now, &mut report);
        for ((record, sight), scale_set) in records.into_iter().zip(sights).zip(scale_set) {
            // Being scaled down (just decided): looked at again once that reports.
            if self.in_flight.contains(&record.attempt_id) {
                continue;
            }
            let target = targets.get(&record.policy);
            let span = super::attempt_span(&record);
            let job_completed = completed.contains(&record.runner_name);
            let pass = Pass {
                timeouts,
                startup,
                job_completed,
                scale_set,
            };
            let deferred = self
                .supervise_one(ctx, &record, target, sight, pass, &mut report)
                .instrument(span)
                .await?;
            if deferred {
                report.deferred += 1;
            }
        }
        self.disk.schedule(watched, ctx.now());
        Ok(report)
    }

    /// Hands the loop the scale-down of the idle runners of each scale set's policy that has
    /// `surplus` runners beyond its count (the last plan's, [`super::plan::PolicyPlan::surplus`]):
    /// which go is [`crate::scaleset::scale_down`]'s, among the runners seen idle, alive, with
    /// no job in their logs, no stop intent but a scale-down's and a journalled id (the service
    /// removes by id).
    fn scale_down(
        &mut self,
        records: &[AttemptRecord],
        sights: &[Sight],
        surplus: &HashMap<String, u32>,
        now: UnixMs,
        report: &mut PassReport,
    ) {
        // Still being scaled down: its effect in flight, or stopped with the intent journalled
        // and not concluded yet.
        let in_flight = &self.in_flight;
        self.scaling_down
            .retain(|id, (_, kept_until)| match kept_until {
                Some(until) => now < *until,
                None => {
                    in_flight.contains(id)
                        || records.iter().any(|r| {
                            &r.attempt_id == id
                                && !r.state.is_terminal()
                                && r.stop_intent == Some(StopIntent::ScaleDown)
                        })
                }
            });
        for (policy, &surplus) in surplus.iter().filter(|(_, s)| **s > 0) {
            if self.scaling_down.values().any(|(p, _)| p == policy) {
                continue;
            }
            let idle: Vec<(&AttemptRecord, ProcessIdentity)> = records
                .iter()
                .zip(sights)
                .filter(|(r, sight)| {
                    &r.policy == policy
                        && r.state == AttemptState::Idle
                        && matches!(r.stop_intent, None | Some(StopIntent::ScaleDown))
                        && r.runner_id.is_some()
                        && sight.process == ProcessObservation::Running
                        && sight.evidence == crate::lifecycle::JobEvidence::NoJob
                })
                .filter_map(|(r, sight)| Some((r, sight.identity?)))
                .collect();
            // One whose scale-down was decided before (the agent died in it) goes first.
            let since: Vec<UnixMs> = idle
                .iter()
                .map(|(r, _)| match r.stop_intent {
                    Some(StopIntent::ScaleDown) => UnixMs::EPOCH,
                    _ => r.state_changed_at_ms,
                })
                .collect();
            for pick in crate::scaleset::scale_down(surplus, &since, now) {
                let (record, identity) = idle[pick];
                self.in_flight.insert(record.attempt_id.clone());
                self.scaling_down
                    .insert(record.attempt_id.clone(), (record.policy.clone(), None));
                report.effects.push(Effect::ScaleDown {
                    record: record.clone(),
                    identity,
                });
            }
        }
    }

    /// Brings the listing held of each target up to the freshest `needs` asks of it; the
    /// targets whose listing is too old are fetched concurrently.
    async fn refresh_listings<'t>(
        &mut self,
        ctx: &Context,
        needs: impl Iterator<Item = (&'t Target, Freshness)>,
    ) {
        let mut strongest: HashMap<&Target, Freshness> = HashMap::new();
        for (target, freshness) in needs {
            let entry = strongest.entry(target).or_insert(freshness);
            *entry = stronger(*entry, freshness);
        }
        let stale: Vec<&Target> = strongest
            .into_iter()
            .filter(|(target, freshness)| !self.fresh_enough(target, *freshness))
            .map(|(target, _)| target)
            .collect();
        let fetched = futures_util::future::join_all(stale.into_iter().map(|target| async move {
            let fetched_at = ctx.now();
            let listing = ctx.registry.list(target).await;
            if let Err(e) = &listing {
                tracing::warn!(target = %target, error = %e, "cannot list the target's runners");
            }
            (target.clone(), fetched_at, listing)
        }))
        .await;
        for (target, fetched_at, listing) in fetched {
            self.listings.insert(target, (fetched_at, listing));
        }
    }

    /// Whether the listing held of `target` is as fresh as `freshness` asks.
    fn fresh_enough(&self, target: &Target, freshness: Freshness) -> bool {
        match (self.listings.get(target), freshness) {
            (Some((fetched, _)), Freshness::After(ms)) => *fetched >= ms,
            (Some(_), Freshness::Any) => true,
            (None, _) => false,
        }
    }

    /// Observes, decides and acts for one attempt; returns whether it was deferred.
    async fn supervise_one(
        &mut self,
        ctx: &Context,
        record: &AttemptRecord,
        target: Option<&Target>,
        sight: Sight,
        pass: Pass,
        report: &mut PassReport,
    ) -> Result<bool, AttemptError> {
        let now = ctx.now();
        let launch_failed = self
            .launch_failed
            .remove(&record.attempt_id)
            .filter(|_| !record.state.is_terminal());
        let Some(looked) = self.look(ctx, record, target, sight, pass, now) else {
            return Ok(false);
        };
        let (decision, told) = match launch_failed {
            Some((reason, detail)) => {
                (Decision::Conclude(Conclusion::Failed(reason)), Some(detail))
            }
            None => (
                recovery_decision(
                    &AttemptFacts::from(record),
                    &looked.observation,
                    &pass.timeouts,
                    now,
                ),
                None,
            ),
        };
        tracing::debug!(
            state = record.state.as_str(),
            observation = ?looked.observation,
            ?decision,
            "supervised"
        );
        self.act(ctx, record, target, looked, (decision, told), report)
            .await
    }

    /// What the decision reads of one attempt: what was seen of it on this host (`sight`),
    /// GitHub's listing (refreshed for this pass only as far as the decisions need) and the
    /// findings of an ended runner. `None`: a runner this agent started has exited and its
    /// launch task has not reaped it yet; its status comes with `Exited`, and the attempt is
    /// looked at then.
    fn look(
        &mut self,
        ctx: &Context,
        record: &AttemptRecord,
        target: Option<&Target>,
        sight: Sight,
        pass: Pass,
        now: UnixMs,
    ) -> Option<Looked> {
        let Sight {
            process,
            identity,
            evidence,
            listening,
            ended,
        } = sight;
        if process != ProcessObservation::Running
            && !record.state.is_terminal()
            && self.reaping.contains(&record.attempt_id)
        {
            return None;
        }
        let listing = target
            .filter(|_| !pass.scale_set)
            .and_then(|target| self.listings.get(target))
            .map(|(_, listing)| listing.clone());
        let github = match &listing {
            _ if pass.scale_set => scale_set_observation(record.state, listening),
            Some(listing) => registry::observation(listing, &record.runner_name),
            // Every configured target's listing was refreshed for this pass; none held is
            // GitHub not answered.
            None if target.is_some() => GithubObservation::Unreachable,
            // A policy no longer configured: its target is unknown, so GitHub cannot be asked.
            // Deciding as if unregistered keeps a removed policy from blocking recovery: a busy
            // runner is still left alone, an idle one still times out, a dead one is concluded
            // from its own evidence; only its deregistration is skipped.
            None => GithubObservation::NotRegistered,
        };
        let disk_max = ctx.disk_max(record);
        let (findings, memory) = self.findings(
            record,
            process,
            github,
            ended,
            (pass.startup, pass.job_completed),
            now,
        );
        Some(Looked {
            observation: Observation {
                process,
                github,
                evidence,
                disk: self.disk.judge(&record.attempt_id, disk_max),
                findings,
            },
            identity,
            listing,
            memory,
            disk_max,
        })
    }

    /// Carries out one decision: the journal's marks here, the slow effects handed to the loop
    /// in `report`. Returns whether the attempt was deferred.
    async fn act(
        &mut self,
        ctx: &Context,
        record: &AttemptRecord,
        target: Option<&Target>,
        looked: Looked,
        (decision, told): (Decision, Option<String>),
        report: &mut PassReport,
    ) -> Result<bool, AttemptError> {
        let (id, now) = (record.attempt_id.clone(), ctx.now());
        match decision {
            Decision::Nothing | Decision::Wait => {}
            Decision::Defer => {
                if target.is_none() && record.state.is_terminal() {
                    // A policy removed from the configuration: its runner is gone; clean up
                    // locally (its registration, if any, is GitHub's to expire).
                    self.start_cleanup(record.clone(), None, None, report);
                    return Ok(false);
                }
                return Ok(true);
            }
            Decision::Adopt => {
                if record.state == AttemptState::JitReceived
                    && let Some(identity) = looked.identity
                    && ctx.journal.started(&id, identity, now).await?
                {
                    tracing::info!(
                        pid = identity.pid,
                        "adopted a runner started just before a crash"
                    );
                }
            }
            Decision::Observe(AttemptState::Idle) => {
                let from = record.state;
                ctx.journal
                    .write(move |attempts| attempts.mark_idle(&id, from, now))
                    .await?;
            }
            Decision::Observe(AttemptState::Busy) => {
                if ctx
                    .journal
                    .write(move |attempts| attempts.mark_busy(&id, None, now))
                    .await?
                {
                    fault::crash_point("runner_busy");
                }
            }
            Decision::Observe(_) => {}
            Decision::Terminate(intent) => {
                self.terminate(ctx, record, intent, &looked, report).await?
            }
            Decision::Conclude(conclusion) => {
                self.conclude(ctx, record, target, looked, (conclusion, told), report)
                    .await?;
            }
            Decision::Clean => {
                self.start_cleanup(record.clone(), target.cloned(), looked.listing, report);
            }
        }
        Ok(false)
    }

    /// Journals the stop intent, then hands the stop to the loop (the first time only: an
    /// intent already journalled had its stop).
    async fn terminate(
        &mut self,
        ctx: &Context,
        record: &AttemptRecord,
        intent: StopIntent,
        looked: &Looked,
        report: &mut PassReport,
    ) -> Result<(), AttemptError> {
        let (id, now) = (record.attempt_id.clone(), ctx.now());
        let recorded = ctx
            .journal
            .write(move |attempts| attempts.record_stop_intent(&id, intent, now))
            .await?;
        if recorded && intent == StopIntent::DiskExceeded {
            tracing::warn!(
                disk_max = looked.disk_max,
                measured = self
                    .disk
                    .last(&record.attempt_id)
                    .map(|m| m.describe())
                    .unwrap_or_default(),
                "the runner's runtime holds more than its policy's disk_max; stopping it"
            );
        }
        if recorded && let Some(identity) = looked.identity {
            tracing::info!(
                intent = intent.as_str(),
                pid = identity.pid,
                "stopping a runner"
            );
            self.in_flight.insert(record.attempt_id.clone());
            report.effects.push(Effect::Stop {
                record: record.clone(),
                identity,
            });
        }
        Ok(())
    }

    /// Journals the conclusion (with its evidence), tells allocation and the operator, and
    /// hands the attempt's cleanup to the loop.
    async fn conclude(
        &mut self,
        ctx: &Context,
        record: &AttemptRecord,
        target: Option<&Target>,
        looked: Looked,
        (conclusion, told): (Conclusion, Option<String>),
        report: &mut PassReport,
    ) -> Result<(), AttemptError> {
        // A launch's own sentence, or the one the findings give.
        let detail = told.unwrap_or_else(|| {
            if conclusion == Conclusion::IdleExit
                && record.stop_intent == Some(StopIntent::ScaleDown)
            {
                SCALED_DOWN.to_owned()
            } else {
                detail(conclusion, &looked.observation.findings, looked.memory)
            }
        });
        let told = detail.clone();
        self.exits.remove(&record.attempt_id);
        self.unlisted_since.remove(&record.attempt_id);
        let (id, from, at) = (record.attempt_id.clone(), record.state, ctx.now());
        let concluded = ctx
            .journal
            .write(move |attempts| {
                let concluded = attempts.conclude(
                    &id,
                    from,
                    conclusion.outcome(),
                    conclusion.reason(),
                    Some(&detail),
                    at,
                )?;
                // The record as concluded, for its cleanup.
                Ok(if concluded { attempts.get(&id)? } else { None })
            })
            .await?;
        let Some(concluded) = concluded else {
            return Ok(());
        };
        tracing::info!(
            outcome = conclusion.outcome().as_str(),
            reason = conclusion.reason().unwrap_or(""),
            "runner concluded"
        );
        announce(ctx, record, &concluded, conclusion, told);
        let observation = &looked.observation;
        report.concluded.push(Concluded {
            policy: record.policy.clone(),
            runner_name: record.runner_name.clone(),
            conclusion,
            job_known: record.job_id.is_some(),
            ran_job: observation.evidence == crate::lifecycle::JobEvidence::RanAJob
                || record.state == AttemptState::Busy
                || observation.github == (GithubObservation::Registered { busy: true }),
            at_ms: at,
        });
        self.start_cleanup(concluded, target.cloned(), looked.listing, report);
        Ok(())
    }

    /// Hands the cleanup of a concluded attempt to the loop, with how long GitHub has held its
    /// runner busy so far.
    fn start_cleanup(
        &mut self,
        record: AttemptRecord,
        target: Option<Target>,
        listing: Option<Listing>,
        report: &mut PassReport,
    ) {
        let busy_since = self
            .deregister_busy
            .get(&record.attempt_id)
            .map(|(first, _)| *first);
        self.in_flight.insert(record.attempt_id.clone());
        report.effects.push(Effect::Clean(Cleanup {
            record,
            target,
            listing,
            busy_since,
        }));
    }

    /// What names why the runner ended (or that it is a ghost), beside the observation. The
    /// kernel's and the logs' word is read only for a live attempt whose process is gone:
    /// nothing else is decided from it.
    fn findings(
        &mut self,
        record: &AttemptRecord,
        process: ProcessObservation,
        github: GithubObservation,
        ended: Option<Ended>,
        (startup, job_completed): (bool, bool),
        now: UnixMs,
    ) -> (Findings, findings::Memory) {
        use AttemptState::*;
        let id = &record.attempt_id;
        // A ghost is an idle runner alive and unlisted; any other sighting ends the count.
        let unlisted_for = match (record.state, process, github) {
            (Idle, ProcessObservation::Running, GithubObservation::NotRegistered) => {
                let since = *self.unlisted_since.entry(id.clone()).or_insert(now);
                Some(Duration::from_millis(
                    u64::try_from(now.saturating_sub(since)).unwrap_or(0),
                ))
            }
            // GitHub could not be asked: the count neither grows nor ends.
            (Idle, ProcessObservation::Running, GithubObservation::Unreachable) => None,
            _ => {
                self.unlisted_since.remove(id);
                None
            }
        };
        let ended = ended.unwrap_or_default();
        (
            Findings {
                exit: self.exits.get(id).copied(),
                oom_kills: ended.memory.oom_kills,
                disk_full: ended.disk_full,
                unlisted_for,
                recovering: startup,
                // The journal's word (a `completed` delivery), or the runner's own console.
                job_completed: job_completed || ended.job_ended,
            },
            ended.memory,
        )
    }

    fn clean_due(&self, id: &AttemptId, now: UnixMs) -> bool {
        self.clean_retry
            .get(id)
            .is_none_or(|(next, _)| now >= *next)
            && self
                .deregister_busy
                .get(id)
                .is_none_or(|(_, next)| now >= *next)
    }

    fn clean_failed(&mut self, id: &AttemptId, now: UnixMs) {
        let wait = self
            .clean_retry
            .get(id)
            .map_or(CLEAN_RETRY, |(_, last)| (*last * 2).min(CLEAN_RETRY_MAX));
        let next = now + wait;
        self.clean_retry.insert(id.clone(), (next, wait));
    }
}

/// A concluded runner's end told to `/metrics` and, for an attributed failure, the operator.
fn announce(
    ctx: &Context,
    record: &AttemptRecord,
    concluded: &AttemptRecord,
    conclusion: Conclusion,
    detail: String,
) {
    super::tally::runner_ended(
        &record.policy,
        conclusion.outcome().as_str(),
        conclusion.reason().unwrap_or(""),
    );
    if let Conclusion::Failed(reason) = conclusion
        && reason.is_attributed()
    {
        ctx.notifier
            .notify(crate::notify::OperatorEvent::RunnerFailed {
                policy: record.policy.clone(),
                runner_name: record.runner_name.clone(),
                job_id: concluded.job_id.map(|j| j.get()),
                reason: reason.as_str().to_owned(),
                detail,
            });
    }
}

/// Marks busy the runners the journal says took a job (an `in_progress` or `completed`
/// delivery naming them); returns the records as they are now, which runners it learnt a job
/// of, and the runners whose job the journal has completed.
async fn note_jobs_taken(
    ctx: &Context,
    records: Vec<AttemptRecord>,
) -> Result<(Vec<AttemptRecord>, Vec<Took>, HashSet<String>), AttemptError> {
    let names: Vec<String> = records
        .iter()
        .filter(|r| {
            matches!(
                r.state,
                AttemptState::Starting | AttemptState::Idle | AttemptState::Busy
            )
        })
        .map(|r| r.runner_name.clone())
        .collect();
    if names.is_empty() {
        return Ok((records, Vec::new(), HashSet::new()));
    }
    let jobs = match ctx.journal.jobs_for_runners(names).await {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read which jobs our runners took");
            return Ok((records, Vec::new(), HashSet::new()));
        }
    };
    let completed: HashSet<String> = jobs
        .iter()
        .filter(|j| j.state == rm_vocab::JobState::Completed)
        .filter_map(|j| j.runner_name.clone())
        .collect();
    let taken: HashMap<String, JobId> = jobs
        .into_iter()
        .filter(|j| j.state >= rm_vocab::JobState::InProgress)
        .filter_map(|j| Some((j.runner_name?, j.job_id)))
        .collect();
    if !records.iter().any(|r| taken.contains_key(&r.runner_name)) {
        return Ok((records, Vec::new(), completed));
    }
    let now = ctx.now();
    ctx.journal
        .write(move |attempts| {
            let mut updated = Vec::with_capacity(records.len());
            let mut took = Vec::new();
            for record in records {
                let Some(&job_id) = taken.get(&record.runner_name) else {
                    updated.push(record);
                    continue;
                };
                let waiting = matches!(record.state, AttemptState::Starting | AttemptState::Idle);
                let learnt = if waiting && attempts.mark_busy(&record.attempt_id, Some(job_id), now)? {
                    tracing::info!(attempt = %record.attempt_id, runner = %record.runner_name, job_id = job_id.get(), "runner took a job");
                    fault::crash_point("runner_busy");
                    true
                } else if record.state == AttemptState::Busy && record.job_id.is_none() {
                    attempts.record_job(&record.attempt_id, job_id, now)?
                } else {
                    false
                };
                if learnt {
                    took.push(Took {
                        policy: record.policy.clone(),
                        runner_name: record.runner_name.clone(),
                        job_id,
                    });
                }
                updated.push(attempts.get(&record.attempt_id)?.unwrap_or(record));
            }
            Ok((updated, took))
        })
        .await
        .map(|(updated, took)| (updated, took, completed))
}

/// The live runners the disk watch measures: started (a process may write), with a policy that
/// bounds their disk.
fn watched(ctx: &Context, records: &[AttemptRecord]) -> Vec<Watched> {
    records
        .iter()
        .filter(|r| {
            matches!(
                r.state,
                AttemptState::Starting | AttemptState::Idle | AttemptState::Busy
            )
        })
        .filter_map(|r| {
            Some(Watched {
                attempt: r.attempt_id.clone(),
                runtime_dir: r.runtime_dir.clone(),
                disk_max: ctx.disk_max(r)?,
            })
        })
        .collect()
}

/// What supervision sees of one attempt on this host: its process and the evidence in its
/// runtime, and for a live runner whose process is gone, why it ended.
struct Sight {
    process: ProcessObservation,
    identity: Option<ProcessIdentity>,
    evidence: crate::lifecycle::JobEvidence,
    /// A scale set's starting runner says its listener is connected ([`rm_runner::listening`]);
    /// read for nothing else.
    listening: bool,
    /// Read only for a live attempt whose process is gone: nothing else is decided from it.
    ended: Option<Ended>,
}

/// What the kernel and the logs say of an ended runner.
#[derive(Debug, Clone, Copy, Default)]
struct Ended {
    memory: findings::Memory,
    disk_full: bool,
    /// Its console says its job ended (read at startup recovery only: while the agent runs,
    /// the journal's completion is the word).
    job_ended: bool,
}

/// What supervision sees of each attempt on this host (`/proc`, the runtime's `_diag`, the
/// cgroup's memory report), read on one blocking-pool thread: a slow filesystem holds back no
/// async worker.
async fn sight_all(
    ctx: &Context,
    records: &[AttemptRecord],
    scale_set: &[bool],
    startup: bool,
) -> Vec<Sight> {
    let execution = Arc::clone(&ctx.execution);
    let records = records.to_vec();
    let scale_set = scale_set.to_vec();
    let count = records.len();
    let read = tokio::task::spawn_blocking(move || {
        records
            .iter()
            .zip(scale_set)
            .map(|(record, scale_set)| sight(&*execution, record, scale_set, startup))
            .collect::<Vec<_>>()
    })
    .await;
    read.unwrap_or_else(|e| {
        // The read panicked: nothing is decided from a sight not taken.
        tracing::warn!(error = %e, "cannot look at the runners on this host");
        (0..count)
            .map(|_| Sight {
                process: ProcessObservation::Gone,
                identity: None,
                evidence: crate::lifecycle::JobEvidence::Unknown,
                listening: false,
                ended: None,
            })
            .collect()
    })
}

/// What is seen of one attempt on this host.
fn sight(
    execution: &dyn super::seams::Execution,
    record: &AttemptRecord,
    scale_set: bool,
    startup: bool,
) -> Sight {
    use AttemptState::*;
    let (process, identity) = observe_process(execution, record);
    let live = matches!(record.state, Starting | Idle | Busy);
    let ended = (live && process != ProcessObservation::Running).then(|| Ended {
        memory: findings::memory(record.cgroup.as_deref()),
        disk_full: findings::disk_full(&record.runtime_dir),
        job_ended: startup && findings::job_ended(&record.runtime_dir),
    });
    Sight {
        process,
        identity,
        evidence: evidence::read(&record.runtime_dir),
        listening: scale_set
            && record.state == Starting
            && rm_runner::listening::listening(&record.runtime_dir.join(evidence::DIAG_DIR)),
        ended,
    }
}

/// The fresher of two needs: a listing fetched after the later time satisfies both.
fn stronger(a: Freshness, b: Freshness) -> Freshness {
    match (a, b) {
        (Freshness::After(x), Freshness::After(y)) => Freshness::After(x.max(y)),
        (Freshness::After(x), Freshness::Any) | (Freshness::Any, Freshness::After(x)) => {
            Freshness::After(x)
        }
        (Freshness::Any, Freshness::Any) => Freshness::Any,
    }
}

/// The process's state from the journalled identity. An attempt with no identity that may have
/// a process (`jit_received`: the agent died between spawn and journal) is looked for by its
/// working directory.
fn observe_process(
    execution: &dyn super::seams::Execution,
    record: &AttemptRecord,
) -> (ProcessObservation, Option<ProcessIdentity>) {
    let journalled = journalled_identity(record);
    let identity = journalled.or_else(|| {
        (record.state == AttemptState::JitReceived)
            .then(|| discover::residents(&record.runtime_dir).ok())
            .flatten()
            .and_then(|residents| discover::listener(&residents))
    });
    let Some(identity) = identity else {
        return (ProcessObservation::Gone, None);
    };
    let inspected = process::inspect(execution.processes_of(record.isolation), identity);
    let state = match inspected {
        Ok(ProcessState::Running) => ProcessObservation::Running,
        Ok(ProcessState::Exited) => ProcessObservation::Exited,
        Ok(ProcessState::Gone) => ProcessObservation::Gone,
        Err(e) => {
            // Unreadable /proc: claim nothing is running, so nothing is signalled.
            tracing::warn!(error = %e, "cannot look at a runner process");
            ProcessObservation::Gone
        }
    };
    (state, Some(identity))
}

/// The journalled identity of the attempt's process, if it can name a process in this boot.
pub(super) fn journalled_identity(record: &AttemptRecord) -> Option<ProcessIdentity> {
    process::journalled(
        record.pid,
        record.pid_start_time,
        record.pid_boot_id.as_deref(),
    )
}

/// How fresh GitHub's view must be for this attempt's decision (not asked for a scale set's
/// attempts: they need no listing, [`scale_set_observation`]).
fn freshness_for(
    record: &AttemptRecord,
    process: ProcessObservation,
    timeouts: Timeouts,
    now: UnixMs,
) -> Freshness {
    use AttemptState::*;
    let in_state = Duration::from_millis(
        u64::try_from(now.saturating_sub(record.state_changed_at_ms)).unwrap_or(0),
    );
    let running = process == ProcessObservation::Running;
    let fresh = Freshness::After(record.state_changed_at_ms.max(now.saturating_add_ms(-1)));
    match record.state {
        // A conclusion and a timer that ran out both act on GitHub's word: ask now.
        Starting | Idle | Busy if !running => fresh,
        Allocated | JitReceived if in_state >= timeouts.launch => fresh,
        Starting if in_state >= timeouts.registration => fresh,
        Idle if in_state >= timeouts.idle => fresh,
        // A ghost is found by asking: an idle runner's listing is at most this old (a `304`
        // while nothing changed).
        Idle => Freshness::After(now - GHOST_CHECK),
        Starting => Freshness::After(now - REGISTRATION_CHECK),
        // A registration made before the conclusion shows in a listing made after it: one
        // with a journalled runner id, or a launch that gave up after GitHub issued its JIT
        // configuration but before the id was journalled (found by its name).
        Finished | Failed | Orphaned
            if record.runner_id.is_some()
                || record.reason.as_deref() == Some(FailureReason::JitExpired.as_str()) =>
        {
            Freshness::After(record.state_changed_at_ms)
        }
        _ => Freshness::Any,
    }
}

/// What stands for GitHub's listing of a scale set's runner, from this host alone: a starting
/// runner is registered once its listener says it is connected (`listening`), an idle one stays
/// so (it was seen connected), a busy one is busy (it ran a job: its `Worker_*.log`); nothing
/// else is. GitHub's REST listing is never asked for these runners (issue 29: no REST request
/// after the token), so a ghost is not looked for: a scale set's runner whose registration the
/// service dropped exits by itself, and an idle one still meets `runner.idle_timeout`.
fn scale_set_observation(state: AttemptState, listening: bool) -> GithubObservation {
    match state {
        AttemptState::Busy => GithubObservation::Registered { busy: true },
        AttemptState::Idle => GithubObservation::Registered { busy: false },
        AttemptState::Starting if listening => GithubObservation::Registered { busy: false },
        _ => GithubObservation::NotRegistered,
    }
}

/// The operator's sentence for a conclusion (the journal's `detail`), with the evidence of the
/// attributed failures (how the process ended, the kernel's OOM count and the peak). Never the
/// runner's own words: those are the job's.
fn detail(conclusion: Conclusion, findings: &Findings, memory: findings::Memory) -> String {
    let exit = findings
        .exit
        .map_or_else(|| "not seen".to_owned(), ExitSeen::describe);
    match conclusion {
        Conclusion::Failed(FailureReason::OomKilled) => {
            let peak = memory.peak.map_or_else(String::new, |peak| {
                format!("; memory peak {} MiB", peak / (1024 * 1024))
            });
            return format!(
                "the kernel killed {} process(es) of the runner's cgroup for memory (memory.events oom_kill){peak}; the job needs more than its policy's memory_max",
                memory.oom_kills
            );
        }
        Conclusion::Failed(FailureReason::RunnerCrashed) => {
            return format!(
                "the runner process ended with {exit} in the middle of its job, and the agent had not stopped it; see its kept logs (rm-agent logs)"
            );
        }
        _ => {}
    }
    static_detail(conclusion).to_owned()
}

/// The fixed sentence of a conclusion.
fn static_detail(conclusion: Conclusion) -> &'static str {
    match conclusion {
        Conclusion::CompletedJob => "the runner ran its job and exited",
        Conclusion::IdleExit => {
            "the runner got no job within runner.idle_timeout and exited; replaced only to keep the policy's min_runners"
        }
        Conclusion::Orphaned => {
            "the runner died while GitHub had it on a job; the job's result is GitHub's"
        }
        Conclusion::Failed(reason) => match reason {
            FailureReason::JitExpired => {
                "a JIT configuration was issued but no runner was seen starting with it"
            }
            FailureReason::LaunchInterrupted => {
                "the agent stopped before the runner was registered"
            }
            FailureReason::ProcessExitedUnexpectedly => {
                "the runner process exited before it took a job; see its _diag logs"
            }
            FailureReason::TerminatedAfterRegistrationTimeout => {
                "the runner did not register within runner.registration_timeout and was stopped; not replaced"
            }
            FailureReason::JitRequestFailed => "GitHub did not issue a JIT configuration",
            FailureReason::ProcessStartFailed => "the runner could not be prepared or started",
            FailureReason::RunnerPackageUnverified => "the runner package did not verify",
            FailureReason::RunnerVersionRejected => {
                "GitHub refused the runner's version (its log: \"is deprecated and cannot receive messages\"); set runner.version = \"latest\" or a newer release"
            }
            FailureReason::DiskExceeded => {
                "the runner's runtime held more than its policy's disk_max and the runner was stopped, busy or not; raise disk_max or make the job write less"
            }
            FailureReason::OomKilled => "the kernel killed a process of the runner for memory",
            FailureReason::DiskFull => {
                "a write failed for want of space (\"No space left on device\" in the runner's logs, or its filesystem full); free space under host.runner_root or the runner's tmpfs sizes"
            }
            FailureReason::RunnerCrashed => "the runner process ended abnormally mid-job",
            FailureReason::Ghost => {
                "the runner's process lived on while GitHub no longer listed it online (its registration removed, or the runner disconnected) for runner.ghost_timeout; it could never take a job, and was stopped"
            }
            FailureReason::HostLost => {
                "the agent, starting again after its own stop or the host's reboot, found the runner gone in the middle of its job; GitHub fails the job once the runner stops answering"
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::Timeouts;
    use rm_journal::WorkspaceKind;

    fn record(state: AttemptState, changed: i64) -> AttemptRecord {
        let id = AttemptId::generate();
        AttemptRecord {
            runner_name: id.runner_name("h"),
            attempt_id: id,
            policy: "p".into(),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: "/r/x".into(),
            state,
            state_changed_at_ms: UnixMs::new(changed),
            outcome: None,
            reason: None,
            detail: None,
            runner_id: Some(rm_vocab::RunnerId::new(1)),
            job_id: None,
            pid: Some(5),
            pid_start_time: Some(6),
            stop_intent: None,
            stop_intent_at_ms: None,
            created_at_ms: UnixMs::EPOCH,
            updated_at_ms: UnixMs::EPOCH,
            pid_boot_id: None,
            isolation: rm_journal::IsolationKind::None,
            uid: None,
            cgroup: None,
            released_at_ms: None,
            image: None,
            shape: None,
        }
    }

    #[test]
    fn a_pid_journalled_in_another_boot_is_never_taken_for_a_process() {
        let mut r = record(AttemptState::Busy, 0);
        assert_eq!(
            journalled_identity(&r),
            Some(ProcessIdentity {
                pid: 5,
                start_time: 6
            })
        );
        r.pid_boot_id = process::boot_id().map(str::to_owned);
        assert!(journalled_identity(&r).is_some());
        r.pid_boot_id = Some("00000000-0000-0000-0000-000000000000".into());
        assert_eq!(journalled_identity(&r), None);
    }

    #[test]
    fn github_is_asked_afresh_only_where_the_decision_depends_on_it() {
        let t = Timeouts::supervision(Duration::from_secs(60), Duration::from_secs(120));
        let now = 1_000_000;
        let at = UnixMs::new;
        let running = ProcessObservation::Running;
        let gone = ProcessObservation::Gone;
        // An idle runner under its timers reuses a listing younger than the ghost check.
        assert_eq!(
            freshness_for(
                &record(AttemptState::Idle, now - 1_000),
                running,
                t,
                at(now)
            ),
            Freshness::After(at(now) - GHOST_CHECK)
        );
        assert_eq!(
            freshness_for(
                &record(AttemptState::Busy, now - 1_000),
                running,
                t,
                at(now)
            ),
            Freshness::Any
        );
        // A starting runner: a listing at most REGISTRATION_CHECK old.
        assert_eq!(
            freshness_for(
                &record(AttemptState::Starting, now - 1_000),
                running,
                t,
                at(now)
            ),
            Freshness::After(at(now - 5_000))
        );
        // A dead one, or a timer that ran out: fetched now.
        assert_eq!(
            freshness_for(&record(AttemptState::Busy, now - 1_000), gone, t, at(now)),
            Freshness::After(at(now - 1))
        );
        assert_eq!(
            freshness_for(
                &record(AttemptState::Idle, now - 120_000),
                running,
                t,
                at(now)
            ),
            Freshness::After(at(now - 1))
        );
        assert_eq!(
            freshness_for(
                &record(AttemptState::Starting, now - 60_000),
                running,
                t,
                at(now)
            ),
            Freshness::After(at(now - 1))
        );
        // A concluded runner with a journalled id: a fresh listing to deregister it by.
        let mut concluded = record(AttemptState::Finished, now - 1_000);
        concluded.runner_id = Some(rm_vocab::RunnerId::new(9));
        assert_eq!(
            freshness_for(&concluded, gone, t, at(now)),
            Freshness::After(at(now - 1_000))
        );
    }

    #[test]
    fn a_scale_set_s_runner_is_registered_once_its_listener_says_so() {
        use AttemptState::*;
        use GithubObservation::*;
        for (state, listening, seen) in [
            (Allocated, true, NotRegistered),
            (JitReceived, true, NotRegistered),
            // Spawned: not registered until its listener says it is connected (the
            // registration timeout runs meanwhile).
            (Starting, false, NotRegistered),
            (Starting, true, Registered { busy: false }),
            // Seen connected: stays so whatever its log says now (it is not read again).
            (Idle, false, Registered { busy: false }),
            (Busy, false, Registered { busy: true }),
            (Finished, true, NotRegistered),
            (Failed, true, NotRegistered),
        ] {
            assert_eq!(
                scale_set_observation(state, listening),
                seen,
                "{state:?} listening={listening}"
            );
        }
    }
}
