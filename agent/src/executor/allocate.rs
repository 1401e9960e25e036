//! The demand-and-allocation room: from the journal's queued jobs to new attempts. It owns
//! what allocation remembers between passes ([`Allocator`]: fences, back-offs, unknown
//! completions) and turns it, with the journal's queue, into each policy's inputs to the plan
//! ([`Allocator::inputs`]: demand routed per policy by [`demand::route`], less the jobs before
//! its fence and the completions the journal has not named); [`super::plan`] decides from them,
//! with the ceilings' one input builder ([`allocation_input`]). The attempt row
//! ([`create_attempt`]) is a runner's first effect, and its launch task does the rest.
//!
//! What it remembers (in memory; a restart forgets it, at the cost of one more attempt at most):
//! - a **fence** per policy: a runner of the policy that gave up (idle exit, registration
//!   timeout) is not replaced for the jobs that were already queued when it gave up;
//! - a **launch back-off** per policy after failed launches, so a 403 or a broken package does
//!   not become a loop of attempts;
//! - the jobs already reported as overlapping or unresolvable, so each is logged once.
//!
//! The fences, back-offs and launches in flight are published, in the shape of [`published`],
//! for `status` and `explain`, which judge them with this module's rules ([`backing_off`],
//! [`counts_after_fence`]).

pub(crate) mod published;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::Context as _;
use rm_journal::{
    AttemptId, AttemptRecord, AttemptState, IsolationKind, NewAttempt, Scope, WorkspaceKind,
};
use rm_vocab::{JobId, UnixMs};

use self::published::{AllocationMemory, Backoff, PolicyMemory};
use super::context::Context;
use super::plan::PolicyInputs;
use crate::allocation::{self, AllocationInput};
use crate::config::Policy;
use crate::config::Workspace;
use crate::demand::{self, QueuedJob};
use crate::lifecycle::{Conclusion, FailureReason};
use crate::notify::{Notifier, OperatorEvent};
use rm_runner::slot;

/// The first wait after a failed launch; doubles per consecutive failure.
pub(crate) const LAUNCH_BACKOFF: Duration = Duration::from_secs(5);

/// The longest launch back-off, and the wait after a terminal refusal (a 403 needs a person).
pub(crate) const LAUNCH_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);

/// After this many failed launches in a row, the operator is notified.
pub(crate) const NOTIFY_AFTER_FAILURES: u32 = 3;

/// Demand that waits this long at full host capacity is worth a notification.
pub(crate) const NOTIFY_WAITING_AFTER: Duration = Duration::from_secs(15 * 60);

/// What allocation remembers between passes; owned by the control loop.
#[derive(Debug)]
pub(super) struct Allocator {
    fences: HashMap<String, UnixMs>,
    backoff: HashMap<String, Backoff>,
    reported: HashSet<JobId>,
    /// Per policy: since when its demand has been held back by the host's ceiling.
    waiting_since: HashMap<String, UnixMs>,
    /// Per policy: runners that completed a job the journal had not named when they concluded.
    unknown_completions: HashMap<String, Vec<UnknownCompletion>>,
    /// Per policy: runners that finished a job, known or not, within [`UNKNOWN_COMPLETION_TTL`]:
    /// a scale set's statistics count their jobs until the `JobCompleted` comes.
    finished: HashMap<String, Vec<UnknownCompletion>>,
    /// When the journal was last brought up to date with GitHub (a poll pass began).
    refreshed_at: UnixMs,
    /// Whether the runner uid pool was found exhausted (and said so) since a runner last got
    /// a uid: the warning is given once per exhaustion, not every pass.
    uid_pool_exhausted: bool,
}

/// Remembers nothing yet; the journal counts as refreshed at the epoch, before any conclusion.
impl Default for Allocator {
    fn default() -> Self {
        Self {
            fences: HashMap::new(),
            backoff: HashMap::new(),
            reported: HashSet::new(),
            waiting_since: HashMap::new(),
            unknown_completions: HashMap::new(),
            finished: HashMap::new(),
            refreshed_at: UnixMs::EPOCH,
            uid_pool_exhausted: false,
        }
    }
}

/// How long a completion of an unnamed job keeps one queued job from counting, at most: the
/// next poll corrects the journal well before.
pub(crate) const UNKNOWN_COMPLETION_TTL: Duration = Duration::from_secs(15 * 60);

/// A runner that completed a job the journal had not named when it concluded (its
/// `in_progress` delivery was late, or lost): one of the queued jobs is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnknownCompletion {
    pub concluded_at_ms: UnixMs,
    pub runner_name: String,
}

/// How many queued jobs of a policy are already done by runners that completed a job the
/// journal had not named: those concluded after the last refresh, within the TTL, whose runner
/// no journalled job names yet. Once a late delivery names the runner, its job is no longer
/// queued in the journal, and counting the completion too would hide another queued job.
pub(crate) fn unknown_completions(
    concluded: &[UnknownCompletion],
    named: &HashSet<String>,
    refreshed_at: UnixMs,
    now: UnixMs,
) -> u32 {
    let ttl = rm_vocab::millis(UNKNOWN_COMPLETION_TTL);
    let n = concluded
        .iter()
        .filter(|c| {
            c.concluded_at_ms >= refreshed_at
                && now.saturating_sub(c.concluded_at_ms) < ttl
                && !named.contains(&c.runner_name)
        })
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The wait before a policy may launch again after `failures` consecutive failed launches.
pub(crate) fn launch_backoff(failures: u32, terminal: bool) -> Duration {
    if terminal {
        return LAUNCH_BACKOFF_MAX;
    }
    LAUNCH_BACKOFF
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(LAUNCH_BACKOFF_MAX)
}

/// Whether a policy backing off until `until_ms` may launch at `now_ms` (shared with
/// `rm-agent explain`, which decides from the published back-off).
pub(crate) fn backing_off(now_ms: UnixMs, until_ms: UnixMs) -> bool {
    now_ms < until_ms
}

/// Whether a job first seen at `first_seen_ms` is still demand for a policy fenced at
/// `fence_ms` ([`fences_demand`]): only jobs seen after its runner gave up are.
pub(crate) fn counts_after_fence(first_seen_ms: UnixMs, fence_ms: UnixMs) -> bool {
    first_seen_ms > fence_ms
}

/// Tracks, per policy in `waiting_since`, since when its demand has been held back by the
/// host's ceiling (not by its own `max_runners`: that is the operator's choice); whether it has
/// now waited [`NOTIFY_WAITING_AFTER`]. Demand that stops waiting starts the clock over.
pub(crate) fn waiting_too_long(
    waiting_since: &mut HashMap<String, UnixMs>,
    policy: &str,
    demand: u32,
    limit: allocation::Limit,
    now_ms: UnixMs,
) -> bool {
    if limit != allocation::Limit::HostCapacity || demand == 0 {
        waiting_since.remove(policy);
        return false;
    }
    let since = *waiting_since.entry(policy.to_owned()).or_insert(now_ms);
    now_ms.saturating_sub(since) >= rm_vocab::millis(NOTIFY_WAITING_AFTER)
}

/// Whether a conclusion fences the policy's older demand: its runner had the chance to take
/// those jobs and did not. `job_known`: the journal knows a job the runner took. A runner
/// stopped for its disk before it took a job fences too: its runtime was past `disk_max` with
/// no job in it (a persistent slot whose `_work` outgrew the bound, a `disk_max` below the
/// package), so the next runner for the same jobs would be stopped the same way, one JIT
/// registration each, until GitHub confirms the jobs again.
pub(crate) fn fences_demand(conclusion: Conclusion, job_known: bool) -> bool {
    match conclusion {
        Conclusion::IdleExit
        | Conclusion::Failed(FailureReason::TerminatedAfterRegistrationTimeout) => true,
        Conclusion::Failed(FailureReason::DiskExceeded) => !job_known,
        _ => false,
    }
}

/// Demand less the busy runners whose job the journal does not know yet: such a runner took
/// one of the jobs the journal still holds as queued (its `in_progress` sighting has not
/// arrived; without webhooks it arrives with the next poll), so that job is not demand.
pub(crate) fn demand_after_unknown_busy(demand: u32, busy_unknown: usize) -> u32 {
    demand.saturating_sub(u32::try_from(busy_unknown).unwrap_or(u32::MAX))
}

/// What the ceilings are computed from for `policy`: its demand less its busy runners whose job
/// is unknown, its own `min_runners` and `max_runners`, the journal's live counts and the
/// host's `host_max`. The one place a policy's settings meet the journal's counts, so a
/// setting left out here is a ceiling the executor does not keep (`.ci/mutants`,
/// `policy-max-unread`).
pub(super) fn allocation_input(
    policy: &Policy,
    demand: u32,
    live: &LiveView,
    host_max: u32,
) -> AllocationInput {
    let counts = live.counts.policy(&policy.name);
    AllocationInput {
        demand: demand_after_unknown_busy(demand, live.busy_unknown),
        min_runners: policy.min_runners,
        max_runners: policy.max_runners,
        unassigned_in_flight: counts.unassigned(),
        policy_live: counts.live,
        host_live: live.counts.host_live(),
        host_max,
    }
}

impl Allocator {
    /// The runners of unknown completions, whose names the journal may meanwhile know (a late
    /// delivery said which job they ran): the caller looks them up for [`Allocator::wanted`].
    pub(super) fn unknown_runner_names(&self) -> Vec<String> {
        self.unknown_completions
            .values()
            .flatten()
            .map(|c| c.runner_name.clone())
            .collect()
    }

    /// Each policy's inputs to the plan ([`super::plan::plan`]), from the journal's queued
    /// `jobs`: its routed demand less the jobs queued before its fence and the completions the
    /// journal has not named (`named`: those a journalled job now names), its back-off and its
    /// busy runners whose job is unknown (`live.busy_unknown`, by policy). A scale set's policy
    /// gets the count its statistics ask for instead ([`crate::scaleset::runners_wanted`]).
    /// Overlapping and unresolvable jobs are logged once.
    #[allow(
        clippy::too_many_arguments,
        reason = "the plan's inputs, each read once per pass"
    )]
    pub(super) fn inputs<'p>(
        &mut self,
        policies: &'p [Policy],
        jobs: &[rm_journal::JobRow],
        named: &HashSet<String>,
        live: &LiveRead,
        scale_sets: &crate::scaleset::Board,
        host: super::sizing::Host<'_>,
        now: UnixMs,
    ) -> Vec<PolicyInputs<'p>> {
        let busy_unknown = &live.busy_unknown;
        let first_seen: HashMap<JobId, UnixMs> = jobs
            .iter()
            .map(|j| (j.job_id, j.first_seen_at_ms))
            .collect();
        let queued: Vec<QueuedJob> = jobs.iter().map(QueuedJob::from).collect();
        let by_id: HashMap<JobId, &rm_journal::JobRow> =
            jobs.iter().map(|j| (j.job_id, j)).collect();
        let demand = demand::route(policies, &queued);
        self.report_unroutable(&demand);
        let mut inputs = Vec::with_capacity(policies.len());
        for policy in policies {
            // A scale set's policy: a count from its statistics, no journalled jobs (they are
            // not its demand: `demand::route` gives it none), no fence, and its busy runners
            // already counted in it.
            // A runner of the scale set's that finished its job is counted as assigned by the
            // statistics until its `JobCompleted` comes: not a job to start a runner for.
            let ttl = rm_vocab::millis(UNKNOWN_COMPLETION_TTL);
            let finished: Vec<&str> = self
                .finished
                .get(&policy.name)
                .map(|c| {
                    c.iter()
                        .filter(|c| now.saturating_sub(c.concluded_at_ms) < ttl)
                        .map(|c| c.runner_name.as_str())
                        .collect()
                })
                .unwrap_or_default();
            if let Some(assigned) = scale_sets.assigned(&policy.name, &finished) {
                let busy = live.counts.policy(&policy.name).busy;
                inputs.push(PolicyInputs {
                    policy,
                    backing_off_until: self.backoff.get(&policy.name).map(|b| b.until_ms),
                    jobs: Vec::new(),
                    fenced: 0,
                    count: crate::scaleset::runners_wanted(
                        policy.min_runners,
                        policy.max_runners,
                        assigned,
                        busy,
                    ),
                    busy_unknown: 0,
                    shaped: Default::default(),
                });
                continue;
            }
            let fence = self
                .fences
                .get(&policy.name)
                .copied()
                .unwrap_or(UnixMs::new(i64::MIN));
            let routed = demand
                .per_policy
                .get(&policy.name)
                .map_or(&[][..], Vec::as_slice);
            let (counted, fenced): (Vec<JobId>, Vec<JobId>) =
                routed.iter().copied().partition(|id| {
                    first_seen
                        .get(id)
                        .is_some_and(|seen| counts_after_fence(*seen, fence))
                });
            // Jobs whose shape its policy refuses are no demand: said once, never guessed.
            let rows: Vec<&rm_journal::JobRow> = counted
                .iter()
                .filter_map(|id| by_id.get(id).copied())
                .collect();
            let (shaped, refused) = super::sizing::shaped(host, policy, &rows, &live.attempts);
            self.report_refused(&policy.name, &refused);
            let counted: Vec<JobId> = counted
                .into_iter()
                .filter(|id| !refused.iter().any(|(r, _)| r == id))
                .collect();
            let done_meanwhile = self
                .unknown_completions
                .get(&policy.name)
                .map_or(0, |c| unknown_completions(c, named, self.refreshed_at, now));
            let count = u32::try_from(counted.len())
                .unwrap_or(u32::MAX)
                .saturating_sub(done_meanwhile);
            inputs.push(PolicyInputs {
                policy,
                backing_off_until: self.backoff.get(&policy.name).map(|b| b.until_ms),
                jobs: counted,
                fenced: u32::try_from(fenced.len()).unwrap_or(u32::MAX),
                count,
                busy_unknown: busy_unknown.get(&policy.name).copied().unwrap_or(0),
                shaped,
            });
        }
        inputs
    }

    /// Tells the operator when a policy's demand has waited at the host's ceiling for long
    /// (`limit`: which rule bounded its last plan).
    pub(super) fn note_waiting(
        &mut self,
        policy: &str,
        demand: u32,
        limit: allocation::Limit,
        now: UnixMs,
        notifier: &Notifier,
    ) {
        if waiting_too_long(&mut self.waiting_since, policy, demand, limit, now) {
            notifier.notify(OperatorEvent::DemandWaitingAtCapacity {
                policy: policy.to_owned(),
                waiting: demand,
            });
        }
    }

    /// Says once per exhaustion that the uid pool has no free uid (`exhausted`), and when it
    /// has again (`None`).
    pub(super) fn note_uid_pool(&mut self, exhausted: Option<&NoFreeUid>) {
        match exhausted {
            Some(e) if !self.uid_pool_exhausted => {
                self.uid_pool_exhausted = true;
                tracing::warn!(error = %e, "no runner starts until a uid is free");
            }
            Some(_) => {}
            None if self.uid_pool_exhausted => {
                self.uid_pool_exhausted = false;
                tracing::info!("a runner uid is free again");
            }
            None => {}
        }
    }

    /// Logs each overlapping or unresolvable job once.
    /// Logs each job whose shape its policy refuses, once.
    fn report_refused(&mut self, policy: &str, refused: &[(JobId, crate::shape::Refusal)]) {
        for (job_id, refusal) in refused {
            if self.reported.insert(*job_id) {
                tracing::warn!(job_id = job_id.get(), policy, "{refusal}");
            }
        }
    }

    fn report_unroutable(&mut self, demand: &demand::Demand) {
        for (job_id, policies) in &demand.overlapping {
            if self.reported.insert(*job_id) {
                tracing::warn!(job_id = job_id.get(), policies = ?policies, "job matches more than one policy of this host; starting nothing for it: make the policies' labels disjoint");
            }
        }
        for job_id in &demand.unresolvable {
            if self.reported.insert(*job_id) {
                tracing::warn!(
                    job_id = job_id.get(),
                    "job's runs-on holds an unevaluated expression (${{ }}); it is not counted as demand"
                );
            }
        }
    }

    /// The journal was brought up to date with GitHub by a poll pass that began at `at_ms`:
    /// completions before it are reflected in the journal now.
    pub(super) fn journal_refreshed(&mut self, at_ms: UnixMs) {
        self.refreshed_at = self.refreshed_at.max(at_ms);
        let refreshed = self.refreshed_at;
        for concluded in self.unknown_completions.values_mut() {
            concluded.retain(|c| c.concluded_at_ms >= refreshed);
        }
    }

    /// A runner concluded: an idle exit or a registration timeout fences the policy's older
    /// demand; a job the runner took (completed, or ended by a crash, the kernel or a lost
    /// host) that the journal has not named is one queued job less until a delivery names the
    /// runner or the next poll says which.
    pub(super) fn remember_conclusion(&mut self, concluded: &Concluded) {
        if concluded.ran_job {
            let ttl = rm_vocab::millis(UNKNOWN_COMPLETION_TTL);
            let finished = self.finished.entry(concluded.policy.clone()).or_default();
            finished.retain(|c| concluded.at_ms.saturating_sub(c.concluded_at_ms) < ttl);
            finished.push(UnknownCompletion {
                concluded_at_ms: concluded.at_ms,
                runner_name: concluded.runner_name.clone(),
            });
        }
        if concluded.ran_job && !concluded.job_known {
            self.unknown_completions
                .entry(concluded.policy.clone())
                .or_default()
                .push(UnknownCompletion {
                    concluded_at_ms: concluded.at_ms,
                    runner_name: concluded.runner_name.clone(),
                });
        }
        if fences_demand(concluded.conclusion, concluded.job_known) {
            self.fences
                .insert(concluded.policy.clone(), concluded.at_ms);
        }
    }

    /// A launch ended: a failure (terminal or not, and the sentence it is journalled with)
    /// backs the policy off, a runner resets it.
    pub(super) fn remember_launch(
        &mut self,
        policy: &str,
        failed: Option<&LaunchFailure>,
        now: UnixMs,
        notifier: &Notifier,
    ) {
        let Some(failed) = failed else {
            self.backoff.remove(policy);
            return;
        };
        let failures = self.backoff.get(policy).map_or(0, |b| b.failures) + 1;
        let wait = launch_backoff(failures, failed.terminal);
        let until = now + wait;
        self.backoff.insert(
            policy.to_owned(),
            Backoff {
                until_ms: until,
                failures,
                last_failure: Some(failed.why()),
            },
        );
        if failures >= NOTIFY_AFTER_FAILURES {
            notifier.notify(OperatorEvent::RunnersFailingToStart {
                policy: policy.to_owned(),
                failures,
            });
        }
        tracing::warn!(
            policy,
            failures,
            wait_s = wait.as_secs(),
            "launch failed; this policy waits before the next one"
        );
    }

    /// Until when `policy` backs off, if it has failed launches behind it.
    pub(super) fn backoff_until(&self, policy: &str) -> Option<UnixMs> {
        self.backoff.get(policy).map(|b| b.until_ms)
    }

    /// Whether `policy` is in its launch back-off at `now`.
    pub(super) fn backing_off(&self, policy: &str, now: UnixMs) -> bool {
        self.backoff
            .get(policy)
            .is_some_and(|b| backing_off(now, b.until_ms))
    }

    /// What allocation remembers (fences, back-offs), with the launches in flight and whether
    /// the agent drains, for the status snapshot: `explain` and `status` decide with the same
    /// facts.
    pub(super) fn published(
        &self,
        launching: &HashSet<AttemptId>,
        draining: bool,
        plan: super::plan::Published,
    ) -> AllocationMemory {
        let mut launching: Vec<String> =
            launching.iter().map(|id| id.as_str().to_owned()).collect();
        launching.sort();
        let mut policies: std::collections::BTreeMap<String, PolicyMemory> = Default::default();
        for (policy, fence) in &self.fences {
            policies.entry(policy.clone()).or_default().fence_ms = Some(*fence);
        }
        for (policy, backoff) in &self.backoff {
            policies.entry(policy.clone()).or_default().backoff = Some(backoff.clone());
        }
        AllocationMemory {
            policies,
            launching,
            draining,
            // The control loop adds them from the scale sets' board.
            scale_set_capacity: Default::default(),
            plan: (plan.at_ms > UnixMs::EPOCH).then_some(plan),
        }
    }
}

/// A runner's conclusion, as supervision reports it to the loop (and the loop to allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Concluded {
    pub(super) policy: String,
    pub(super) runner_name: String,
    pub(super) conclusion: Conclusion,
    /// The journal knew which job the runner ran.
    pub(super) job_known: bool,
    /// The runner took a job (its `_diag` shows a worker, or the journal or GitHub had it
    /// busy), whatever its end: a crash or a kill mid-job took a queued job as a completion
    /// does.
    pub(super) ran_job: bool,
    pub(super) at_ms: UnixMs,
}

/// Why a launch ended without a runner, as allocation's back-off takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LaunchFailure {
    /// Retrying cannot help (credentials, permissions): the longest back-off.
    pub(super) terminal: bool,
    /// Why, as the attempt is concluded (by supervision, the one owner of conclusions).
    pub(super) reason: FailureReason,
    /// One sentence for the operator; never the JIT configuration or a token.
    pub(super) detail: String,
}

impl LaunchFailure {
    /// The sentence the back-off remembers (`reason: detail`), for `explain`.
    pub(super) fn why(&self) -> String {
        format!("{}: {}", self.reason.as_str(), self.detail)
    }
}

/// The journal's live attempts as allocation counts them.
#[derive(Debug)]
pub(super) struct LiveView {
    pub(super) counts: rm_journal::LiveCounts,
    /// The policy's busy runners whose job the journal does not know yet.
    pub(super) busy_unknown: usize,
}

/// What the journal's attempts say to a pass's plan, read in one transaction.
#[derive(Debug)]
pub(super) struct LiveRead {
    pub(super) counts: rm_journal::LiveCounts,
    /// Per policy, its busy runners whose job the journal does not know yet.
    pub(super) busy_unknown: HashMap<String, usize>,
    /// The uids attempts not yet cleaned hold.
    pub(super) held_uids: Vec<u32>,
    /// The live attempts (their shapes are what packing counts).
    pub(super) attempts: Vec<AttemptRecord>,
}

impl LiveRead {
    /// The uids of `pool` no attempt holds (`None` without a pool).
    pub(super) fn free_uids(&self, pool: Option<&rm_runner::isolate::Pool>) -> Option<u32> {
        pool.map(|pool| {
            let free = pool
                .accounts()
                .iter()
                .filter(|a| !self.held_uids.contains(&a.uid))
                .count();
            u32::try_from(free).unwrap_or(u32::MAX)
        })
    }
}

/// Reads the live counts, per policy its busy runners with an unknown job, and the uids
/// attempts hold: once per pass.
pub(super) async fn live_counts(ctx: &Context) -> anyhow::Result<LiveRead> {
    Ok(ctx
        .journal
        .write(move |attempts| {
            let mut busy_unknown: HashMap<String, usize> = HashMap::new();
            let live = attempts.list(Scope::Live, None)?;
            for attempt in &live {
                if attempt.state == AttemptState::Busy && attempt.job_id.is_none() {
                    *busy_unknown.entry(attempt.policy.clone()).or_default() += 1;
                }
            }
            Ok(LiveRead {
                counts: attempts.live_counts()?,
                busy_unknown,
                held_uids: attempts.held_uids()?,
                attempts: live,
            })
        })
        .await?)
}

/// The journal's queued jobs, and which of the runners in `names` a journalled job names,
/// read from one snapshot ([`rm_journal::Reader::demand`]): read apart, a delivery committed
/// between the two reads (a job moved out of `queued` and its runner named in one commit)
/// would leave the job counted as demand and its runner's completion not counted against it,
/// and a surplus runner would start.
pub(super) async fn demand_view(
    ctx: &Context,
    names: Vec<String>,
) -> anyhow::Result<(Vec<rm_journal::JobRow>, HashSet<String>)> {
    let view = ctx.journal.demand(names).await?;
    let named = view
        .naming
        .into_iter()
        .filter_map(|job| job.runner_name)
        .collect();
    Ok((view.queued, named))
}

/// Journals a new attempt: the first write of a runner, before any other effect. A persistent
/// policy's attempt takes the lowest slot no uncleaned attempt of it holds (only the control
/// loop creates attempts, so no other attempt takes it meanwhile; the journal's workspace fence
/// backs that). Under `isolation = "user"` it also takes the lowest pool uid no uncleaned
/// attempt holds and no process in `running_uids` (scanned on first use) runs as.
pub(super) async fn create_attempt(
    ctx: &Context,
    policy: &Policy,
    shape: &crate::shape::Shape,
    running_uids: &mut Option<HashSet<u32>>,
) -> anyhow::Result<Created> {
    let id = AttemptId::generate();
    let runner_name = id.runner_name(&ctx.settings.host);
    let (workspace, runtime_dir) = workspace_of(ctx, policy, &id).await?;
    let isolation = ctx.settings.backends.isolation;
    let (uid, cgroup) = match (isolation, &ctx.settings.backends.user) {
        (IsolationKind::User, Some(user)) => {
            let uid = match free_uid(ctx, user, running_uids).await? {
                Ok(uid) => uid,
                Err(none) => return Ok(Created::NoFreeUid(none)),
            };
            let cgroup = match &user.cgroups {
                Some(root) => Some(root.runner_path(&format!("rm-{}", id.short()))?),
                None => None,
            };
            (Some(uid), cgroup)
        }
        (IsolationKind::User, None) => {
            anyhow::bail!("isolation is `user` but this agent cannot switch users")
        }
        (IsolationKind::None, _) => (None, None),
    };
    // The image the runner will run in, journalled with it: a runner is started from its
    // attempt's image, whatever the policy names by then. A policy with an image and none
    // installed gets no runner (never one on the host's root in its place).
    let image = match &policy.image {
        None => None,
        Some(_) => Some(
            ctx.settings
                .images
                .as_ref()
                .and_then(|images| images.current(&policy.name))
                .map(|current| current.id.to_string())
                .ok_or_else(|| {
                    anyhow::anyhow!("policy `{}` has no image installed", policy.name)
                })?,
        ),
    };
    // The shape it journals, with the devices it takes: the lowest free of each group it asks
    // for. The journal's holds fence them (one holder each, written with the attempt's row): a
    // device another attempt took meanwhile refuses this one and writes nothing of it.
    let host = ctx.settings.sizing_host();
    let need = host.need(policy, shape);
    // Most shapes ask no device: no read of the holds for them.
    let held: Vec<String> = if shape.devices.is_empty() {
        Vec::new()
    } else {
        ctx.journal
            .write(|attempts| attempts.held_devices())
            .await?
            .into_iter()
            .map(|(device, _)| device)
            .collect()
    };
    let devices = match super::sizing::pick_devices(&shape.devices, host.devices, &held) {
        Ok(devices) => devices,
        Err(group) => return Ok(Created::NoFreeDevice(group)),
    };
    let attempt_shape = super::sizing::attempt_shape(shape, &need, devices);
    let (policy_name, created_at_ms) = (policy.name.clone(), ctx.now());
    let created = ctx
        .journal
        .write(move |attempts| {
            attempts.create(&NewAttempt {
                attempt_id: &id,
                policy: &policy_name,
                runner_name: &runner_name,
                workspace,
                runtime_dir: &runtime_dir,
                created_at_ms,
                isolation,
                uid,
                cgroup: cgroup.as_deref(),
                image: image.as_deref(),
                shape: Some(&attempt_shape),
            })
        })
        .await;
    match created {
        Ok(record) => Ok(Created::Attempt(Box::new(record))),
        Err(rm_journal::AttemptError::DeviceHeld { device, .. }) => Ok(Created::NoFreeDevice(
            host.devices
                .iter()
                .find(|d| d.id().as_os_str() == device.as_str())
                .map_or(device, |d| d.group.clone()),
        )),
        Err(e) => Err(e.into()),
    }
}

/// The new attempt's workspace: its own runtime directory (ephemeral), or the lowest slot no
/// uncleaned attempt of the policy holds (persistent).
async fn workspace_of(
    ctx: &Context,
    policy: &Policy,
    id: &AttemptId,
) -> anyhow::Result<(WorkspaceKind, std::path::PathBuf)> {
    Ok(match policy.workspace {
        Workspace::Ephemeral => (
            WorkspaceKind::Ephemeral,
            ctx.root.ephemeral_path(id.as_str())?,
        ),
        Workspace::Persistent => {
            let name = policy.name.clone();
            let held: Vec<u32> = ctx
                .journal
                .write(move |attempts| attempts.list(Scope::Uncleaned, Some(&name)))
                .await?
                .iter()
                .filter(|a| a.workspace == WorkspaceKind::Persistent)
                .filter_map(|a| {
                    a.runtime_dir
                        .file_name()?
                        .to_str()
                        .and_then(slot::slot_number)
                })
                .collect();
            (
                WorkspaceKind::Persistent,
                ctx.root.slot_path(&policy.name, slot::free_slot(&held))?,
            )
        }
    })
}

/// The lowest uid of the pool no uncleaned attempt holds and no process in `running_uids`
/// (scanned on first use) runs as, or what holds them all.
async fn free_uid(
    ctx: &Context,
    user: &rm_runner::backend::UserIsolation,
    running_uids: &mut Option<HashSet<u32>>,
) -> anyhow::Result<Result<u32, NoFreeUid>> {
    let held = ctx.journal.write(|attempts| attempts.held_uids()).await?;
    let running = match running_uids {
        Some(running) => running,
        None => {
            // A `/proc` scan: tens of ms on a busy host, off the async workers.
            let scanned = tokio::task::spawn_blocking(rm_runner::uid::running_uids)
                .await
                .context("the scan of running uids did not finish")?
                .context("cannot read which uids are in use")?;
            running_uids.insert(scanned)
        }
    };
    Ok(rm_runner::isolate::pick_uid(&user.pool, &held, running)
        .map(|account| account.uid)
        .ok_or(NoFreeUid {
            pool: user.pool.accounts().len(),
            held: held.len(),
        }))
}

/// What [`create_attempt`] came to, short of a failure.
#[derive(Debug)]
pub(super) enum Created {
    Attempt(Box<AttemptRecord>),
    /// Every uid of the pool is taken (by attempts, or by processes outside rm): like a
    /// ceiling, nothing starts until cleanup releases one.
    NoFreeUid(NoFreeUid),
    /// Too few devices of this group are free for the shape (issue 42).
    NoFreeDevice(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_backoff_doubles_to_its_cap_and_a_refusal_waits_the_longest() {
        let waits: Vec<u64> = (1..=8)
            .map(|n| launch_backoff(n, false).as_secs())
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(launch_backoff(1, true), LAUNCH_BACKOFF_MAX);
    }

    #[test]
    fn only_demand_held_back_by_the_host_for_long_is_worth_telling() {
        use allocation::Limit;
        let after = i64::try_from(NOTIFY_WAITING_AFTER.as_millis()).unwrap();
        let at = UnixMs::new;
        let mut since = HashMap::new();
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            3,
            Limit::HostCapacity,
            at(0)
        ));
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            3,
            Limit::HostCapacity,
            at(after - 1)
        ));
        assert!(waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            at(after)
        ));
        // A slot freed (or the demand was met): the clock starts over.
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            0,
            Limit::HostCapacity,
            at(after + 1)
        ));
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            at(after + 2)
        ));
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            at(2 * after)
        ));
        assert!(waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            at(2 * after + 2)
        ));
        // The policy's own ceiling is the operator's choice, not a shortage.
        let mut since = HashMap::new();
        for ms in [0, after, 2 * after] {
            assert!(!waiting_too_long(
                &mut since,
                "gpu",
                5,
                Limit::MaxRunners,
                at(ms)
            ));
        }
    }

    #[test]
    fn a_busy_runner_with_an_unknown_job_took_one_of_the_queued_ones() {
        assert_eq!(demand_after_unknown_busy(3, 1), 2);
        assert_eq!(demand_after_unknown_busy(1, 2), 0);
        assert_eq!(demand_after_unknown_busy(2, 0), 2);
    }

    #[test]
    fn a_completion_of_an_unnamed_job_counts_until_named_the_next_poll_or_its_ttl() {
        let ttl = i64::try_from(UNKNOWN_COMPLETION_TTL.as_millis()).unwrap();
        let at = UnixMs::new;
        let done = |ms: i64, runner: &str| UnknownCompletion {
            concluded_at_ms: at(ms),
            runner_name: runner.to_owned(),
        };
        let both = [
            done(100, "rm-h-aaaaaaaaaaaa"),
            done(200, "rm-h-bbbbbbbbbbbb"),
        ];
        let none = HashSet::new();
        assert_eq!(unknown_completions(&both, &none, at(0), at(300)), 2);
        // A poll that began after the first completion has corrected the journal for it.
        assert_eq!(unknown_completions(&both, &none, at(150), at(300)), 1);
        assert_eq!(
            unknown_completions(&both[..1], &none, at(0), at(100 + ttl)),
            0
        );
        // A late delivery named the second runner: its job is no longer queued in the journal,
        // so it no longer stands for one of the queued ones.
        let named: HashSet<String> = ["rm-h-bbbbbbbbbbbb".to_owned()].into();
        assert_eq!(unknown_completions(&both, &named, at(0), at(300)), 1);
    }

    #[test]
    fn a_fence_holds_back_only_the_jobs_seen_before_it() {
        // (first seen, fence, still demand): a job seen when (or before) the runner gave up
        // was one it could have taken; a later one is new demand.
        for (seen, fence, counts) in [
            (100, 200, false),
            (200, 200, false),
            (201, 200, true),
            (i64::MIN, i64::MIN, false),
            // No fence (`i64::MIN`): every job counts.
            (0, i64::MIN, true),
        ] {
            assert_eq!(
                counts_after_fence(UnixMs::new(seen), UnixMs::new(fence)),
                counts,
                "seen {seen}, fence {fence}"
            );
        }
    }

    #[test]
    fn the_allocation_reads_the_policy_s_own_ceilings_and_the_journal_s_counts() {
        let mut policy = crate::executor::harness::policy("gpu", &["gpu"], 2);
        policy.min_runners = 1;
        let mut counts = rm_journal::LiveCounts::default();
        counts.per_policy.insert(
            "gpu".to_owned(),
            rm_journal::PolicyLive { live: 2, busy: 1 },
        );
        counts.per_policy.insert(
            "linux".to_owned(),
            rm_journal::PolicyLive { live: 3, busy: 3 },
        );
        let live = LiveView {
            counts,
            busy_unknown: 1,
        };
        assert_eq!(
            allocation_input(&policy, 4, &live, 8),
            AllocationInput {
                demand: 3,
                min_runners: 1,
                max_runners: 2,
                unassigned_in_flight: 1,
                policy_live: 2,
                host_live: 5,
                host_max: 8,
            }
        );
    }

    #[test]
    fn only_giving_up_fences_demand() {
        use FailureReason::*;
        for (conclusion, job_known, fences) in [
            (Conclusion::IdleExit, false, true),
            (
                Conclusion::Failed(TerminatedAfterRegistrationTimeout),
                false,
                true,
            ),
            (Conclusion::CompletedJob, true, false),
            (Conclusion::Orphaned, true, false),
            (Conclusion::Failed(ProcessExitedUnexpectedly), false, false),
            // Stopped for its disk with no job: the next runner would be too.
            (Conclusion::Failed(DiskExceeded), false, true),
            // Stopped for its disk while on a job: the job filled it, other jobs still wait.
            (Conclusion::Failed(DiskExceeded), true, false),
        ] {
            assert_eq!(
                fences_demand(conclusion, job_known),
                fences,
                "{conclusion:?} job known: {job_known}"
            );
        }
    }
}

/// Every uid of the pool is held by an attempt not yet cleaned (or used by another process):
/// no runner starts until cleanup releases one.
#[derive(Debug, thiserror::Error)]
#[error(
    "no runner uid is free: {held} of the pool's {pool} are held by attempts not yet cleaned (or run other processes); runners start again when cleanup releases one — see `rm-agent runners` for attempts stuck before `cleaned`"
)]
pub(crate) struct NoFreeUid {
    pool: usize,
    held: usize,
}
