//! Allocation: from the journal's queued jobs to new attempts. Demand is routed per policy
//! ([`demand::route`]); each runner is created under the host-wide allocation lock with the live
//! attempts re-read under it ([`allocation::allocate`]), so no interleaving of passes or
//! policies can exceed `host.max_runners`. The attempt row is the first effect of a runner;
//! its launch task does the rest.
//!
//! What the pass remembers between passes (in memory; a restart forgets it, at the cost of one
//! more attempt at most):
//! - a **fence** per policy: a runner of the policy that gave up (idle exit, registration
//!   timeout) is not replaced for the jobs that were already queued when it gave up;
//! - a **launch back-off** per policy after failed launches, so a 403 or a broken package does
//!   not become a loop of attempts;
//! - the jobs already reported as overlapping or unresolvable, so each is logged once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use rm_journal::{
    AttemptId, AttemptRecord, AttemptState, IsolationKind, NewAttempt, Scope, WorkspaceKind,
};
use tracing::Instrument as _;

use super::{Executor, fault};
use crate::allocation::{self, AllocationInput};
use crate::config::Policy;
use crate::config::Workspace;
use crate::demand::{self, QueuedJob};
use crate::explain::published::{AllocationMemory, Backoff, PolicyMemory};
use crate::lifecycle::{Conclusion, FailureReason};
use crate::notify::OperatorEvent;
use crate::runner::slot;
use anyhow::Context as _;

/// The first wait after a failed launch; doubles per consecutive failure.
pub const LAUNCH_BACKOFF: Duration = Duration::from_secs(5);

/// The longest launch back-off, and the wait after a terminal refusal (a 403 needs a person).
pub const LAUNCH_BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);

/// After this many failed launches in a row, the operator is notified.
pub const NOTIFY_AFTER_FAILURES: u32 = 3;

/// Demand that waits this long at full host capacity is worth a notification.
pub const NOTIFY_WAITING_AFTER: Duration = Duration::from_secs(15 * 60);

/// What allocation remembers between passes.
#[derive(Debug, Default)]
pub(super) struct Memory {
    fences: HashMap<String, i64>,
    backoff: HashMap<String, Backoff>,
    reported: HashSet<i64>,
    /// Per policy: since when its demand has been held back by the host's ceiling.
    waiting_since: HashMap<String, i64>,
    /// Per policy: runners that completed a job the journal had not named when they concluded.
    unknown_completions: HashMap<String, Vec<UnknownCompletion>>,
    /// When the journal was last brought up to date with GitHub (a poll pass began).
    refreshed_at: i64,
    /// Whether the runner uid pool was found exhausted (and said so) since a runner last got
    /// a uid: the warning is given once per exhaustion, not every pass.
    uid_pool_exhausted: bool,
}

/// How long a completion of an unnamed job keeps one queued job from counting, at most: the
/// next poll corrects the journal well before.
pub const UNKNOWN_COMPLETION_TTL: Duration = Duration::from_secs(15 * 60);

/// A runner that completed a job the journal had not named when it concluded (its
/// `in_progress` delivery was late, or lost): one of the queued jobs is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCompletion {
    pub concluded_at_ms: i64,
    pub runner_name: String,
}

/// How many queued jobs of a policy are already done by runners that completed a job the
/// journal had not named: those concluded after the last refresh, within the TTL, whose runner
/// no journalled job names yet. Once a late delivery names the runner, its job is no longer
/// queued in the journal, and counting the completion too would hide another queued job.
pub fn unknown_completions(
    concluded: &[UnknownCompletion],
    named: &HashSet<String>,
    refreshed_at: i64,
    now: i64,
) -> u32 {
    let ttl = rm_base::clock::ms(UNKNOWN_COMPLETION_TTL);
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
pub fn launch_backoff(failures: u32, terminal: bool) -> Duration {
    if terminal {
        return LAUNCH_BACKOFF_MAX;
    }
    LAUNCH_BACKOFF
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(LAUNCH_BACKOFF_MAX)
}

/// Whether a policy backing off until `until_ms` may launch at `now_ms` (shared with
/// `rm-agent explain`, which decides from the published back-off).
pub fn backing_off(now_ms: i64, until_ms: i64) -> bool {
    now_ms < until_ms
}

/// Whether a job first seen at `first_seen_ms` is still demand for a policy fenced at
/// `fence_ms` ([`fences_demand`]): only jobs seen after its runner gave up are.
pub fn counts_after_fence(first_seen_ms: i64, fence_ms: i64) -> bool {
    first_seen_ms > fence_ms
}

/// Tracks, per policy in `waiting_since`, since when its demand has been held back by the
/// host's ceiling (not by its own `max_runners`: that is the operator's choice); whether it has
/// now waited [`NOTIFY_WAITING_AFTER`]. Demand that stops waiting starts the clock over.
pub fn waiting_too_long(
    waiting_since: &mut HashMap<String, i64>,
    policy: &str,
    demand: u32,
    limit: allocation::Limit,
    now_ms: i64,
) -> bool {
    if limit != allocation::Limit::HostCapacity || demand == 0 {
        waiting_since.remove(policy);
        return false;
    }
    let since = *waiting_since.entry(policy.to_owned()).or_insert(now_ms);
    now_ms.saturating_sub(since) >= rm_base::clock::ms(NOTIFY_WAITING_AFTER)
}

/// Whether a conclusion fences the policy's older demand: its runner had the chance to take
/// those jobs and did not.
pub fn fences_demand(conclusion: Conclusion) -> bool {
    matches!(
        conclusion,
        Conclusion::IdleExit
            | Conclusion::Failed(FailureReason::TerminatedAfterRegistrationTimeout)
    )
}

/// Demand less the busy runners whose job the journal does not know yet: such a runner took
/// one of the jobs the journal still holds as queued (its `in_progress` sighting has not
/// arrived; without webhooks it arrives with the next poll), so that job is not demand.
pub fn demand_after_unknown_busy(demand: u32, busy_unknown: usize) -> u32 {
    demand.saturating_sub(u32::try_from(busy_unknown).unwrap_or(u32::MAX))
}

impl Executor {
    /// Allocates runners for every policy's queued jobs.
    pub(super) async fn allocate(self: &Arc<Self>) -> anyhow::Result<()> {
        // An unfit host registers nothing (crate::fitness): a runner would fail its job. The
        // gate wakes the loop when the host is fit again.
        if !self.settings.fitness.is_fit() {
            return Ok(());
        }
        let jobs = self.lock_reader().queued_jobs()?;
        let first_seen: HashMap<i64, i64> = jobs
            .iter()
            .map(|j| (j.job_id, j.first_seen_at_ms))
            .collect();
        let queued: Vec<QueuedJob> = jobs.iter().map(QueuedJob::from).collect();
        let demand = demand::route(&self.settings.policies, &queued);
        self.report_unroutable(&demand);
        let named = self.named_unknown_runners()?;
        let now = self.now_ms();
        for policy in &self.settings.policies {
            let (fence, backoff_until) = {
                let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
                (
                    memory.fences.get(&policy.name).copied().unwrap_or(i64::MIN),
                    memory
                        .backoff
                        .get(&policy.name)
                        .map_or(i64::MIN, |b| b.until_ms),
                )
            };
            if backing_off(now, backoff_until) {
                continue;
            }
            let wanted = demand.per_policy.get(&policy.name).map_or(0, |ids| {
                ids.iter()
                    .filter(|id| {
                        first_seen
                            .get(id)
                            .is_some_and(|seen| counts_after_fence(*seen, fence))
                    })
                    .count()
            });
            let done_meanwhile = {
                let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
                memory.unknown_completions.get(&policy.name).map_or(0, |c| {
                    unknown_completions(c, &named, memory.refreshed_at, now)
                })
            };
            let wanted = u32::try_from(wanted)
                .unwrap_or(u32::MAX)
                .saturating_sub(done_meanwhile);
            self.start_runners(policy, wanted).await?;
        }
        Ok(())
    }

    /// Creates this policy's runners one at a time under the allocation lock.
    async fn start_runners(self: &Arc<Self>, policy: &Policy, demand: u32) -> anyhow::Result<()> {
        // Which uids other processes run as, read once per call (a `/proc` scan, tens of ms on
        // a busy host) and only if a runner is to start: the uids this loop hands out are
        // fenced by the journal, and a process that takes a pool uid after the scan is caught
        // when the runner starts.
        let mut running_uids = None;
        loop {
            let guard = self.allocation.lock().await;
            // A launch started by this loop may already have failed (a broken package fails
            // in milliseconds): its back-off holds the rest of the loop too, or the loop would
            // replace each failed attempt at once.
            if self.backing_off_now(&policy.name) {
                return Ok(());
            }
            let (live, busy_unknown) = {
                let attempts = self.lock_attempts();
                let busy_unknown = attempts
                    .list(Scope::Live, Some(&policy.name))?
                    .iter()
                    .filter(|a| a.state == AttemptState::Busy && a.job_id.is_none())
                    .count();
                (attempts.live_counts()?, busy_unknown)
            };
            let decided = allocation::allocate(AllocationInput {
                demand: demand_after_unknown_busy(demand, busy_unknown),
                min_runners: policy.min_runners,
                max_runners: policy.max_runners,
                unassigned_in_flight: live.policy(&policy.name).unassigned(),
                policy_live: live.policy(&policy.name).live,
                host_live: live.host_live(),
                host_max: self.settings.max_runners,
            });
            self.note_waiting(policy, demand, decided.limit);
            if decided.to_start == 0 {
                if demand > 0 {
                    tracing::debug!(policy = %policy.name, demand, limit = ?decided.limit, "no runner to start");
                }
                return Ok(());
            }
            let record = match self.create_attempt(policy, &mut running_uids) {
                Ok(record) => record,
                // Like a ceiling: nothing starts until cleanup releases a uid.
                Err(e) if e.downcast_ref::<NoFreeUid>().is_some() => {
                    self.note_uid_pool(Some(&e));
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            self.note_uid_pool(None);
            drop(guard);
            let span = super::attempt_span(&record);
            span.in_scope(|| tracing::info!(demand, "runner allocated"));
            fault::crash_point("attempt_journalled");
            self.lock_launching().insert(record.attempt_id.clone());
            let executor = Arc::clone(self);
            tokio::spawn(async move { executor.launch(record).await }.instrument(span));
        }
    }

    /// Journals a new attempt: the first write of a runner, before any other effect. A
    /// persistent policy's attempt takes the lowest slot no uncleaned attempt of it holds (the
    /// caller holds the allocation lock, so no other attempt takes it meanwhile). Under
    /// `isolation = "user"` it also takes the lowest pool uid no uncleaned attempt holds and no
    /// process in `running_uids` (scanned on first use) runs as.
    fn create_attempt(
        &self,
        policy: &Policy,
        running_uids: &mut Option<HashSet<u32>>,
    ) -> anyhow::Result<AttemptRecord> {
        let id = AttemptId::generate();
        let runner_name = id.runner_name(&self.settings.host);
        let attempts = self.lock_attempts();
        let (workspace, runtime_dir) = match policy.workspace {
            Workspace::Ephemeral => (
                WorkspaceKind::Ephemeral,
                self.root.ephemeral_path(id.as_str())?,
            ),
            Workspace::Persistent => {
                let held: Vec<u32> = attempts
                    .list(Scope::Uncleaned, Some(&policy.name))?
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
                    self.root.slot_path(&policy.name, slot::free_slot(&held))?,
                )
            }
        };
        let isolation = self.settings.backends.isolation;
        let (uid, cgroup) = match (isolation, &self.settings.backends.user) {
            (IsolationKind::User, Some(user)) => {
                let held = attempts.held_uids()?;
                let running = match running_uids {
                    Some(running) => running,
                    None => running_uids.insert(
                        crate::runner::uid::running_uids()
                            .context("cannot read which uids are in use")?,
                    ),
                };
                let Some(account) = crate::runner::isolate::pick_uid(&user.pool, &held, running)
                else {
                    return Err(anyhow::Error::new(NoFreeUid {
                        pool: user.pool.accounts().len(),
                        held: held.len(),
                    }));
                };
                let cgroup = match &user.cgroups {
                    Some(root) => Some(root.runner_path(&format!("rm-{}", id.short()))?),
                    None => None,
                };
                (Some(account.uid), cgroup)
            }
            (IsolationKind::User, None) => {
                anyhow::bail!("isolation is `user` but this agent cannot switch users")
            }
            (IsolationKind::None, _) => (None, None),
        };
        Ok(attempts.create(&NewAttempt {
            attempt_id: &id,
            policy: &policy.name,
            runner_name: &runner_name,
            workspace,
            runtime_dir: &runtime_dir,
            created_at_ms: self.now_ms(),
            isolation,
            uid,
            cgroup: cgroup.as_deref(),
        })?)
    }

    /// Says once per exhaustion that the uid pool has no free uid (`exhausted`), and when it
    /// has again (`None`).
    fn note_uid_pool(&self, exhausted: Option<&anyhow::Error>) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        match exhausted {
            Some(e) if !memory.uid_pool_exhausted => {
                memory.uid_pool_exhausted = true;
                tracing::warn!(error = %e, "no runner starts until a uid is free");
            }
            Some(_) => {}
            None if memory.uid_pool_exhausted => {
                memory.uid_pool_exhausted = false;
                tracing::info!("a runner uid is free again");
            }
            None => {}
        }
    }

    /// Logs each overlapping or unresolvable job once.
    fn report_unroutable(&self, demand: &demand::Demand) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        for (job_id, policies) in &demand.overlapping {
            if memory.reported.insert(*job_id) {
                tracing::warn!(job_id, policies = ?policies, "job matches more than one policy of this host; starting nothing for it: make the policies' labels disjoint");
            }
        }
        for job_id in &demand.unresolvable {
            if memory.reported.insert(*job_id) {
                tracing::warn!(
                    job_id,
                    "job's runs-on holds an unevaluated expression (${{ }}); it is not counted as demand"
                );
            }
        }
    }

    /// The journal was brought up to date with GitHub by a poll pass that began at `at_ms`:
    /// completions before it are reflected in the journal now.
    pub fn journal_refreshed(&self, at_ms: i64) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        memory.refreshed_at = memory.refreshed_at.max(at_ms);
        let refreshed = memory.refreshed_at;
        for concluded in memory.unknown_completions.values_mut() {
            concluded.retain(|c| c.concluded_at_ms >= refreshed);
        }
    }

    /// The runners of unknown completions that a journalled job now names (a late delivery
    /// said which job they ran); the others are still one queued job less each.
    fn named_unknown_runners(&self) -> anyhow::Result<HashSet<String>> {
        let names: Vec<String> = {
            let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
            memory
                .unknown_completions
                .values()
                .flatten()
                .map(|c| c.runner_name.clone())
                .collect()
        };
        if names.is_empty() {
            return Ok(HashSet::new());
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(self
            .lock_reader()
            .jobs_for_runners(&names)?
            .into_iter()
            .filter_map(|job| job.runner_name)
            .collect())
    }

    /// Called when a runner concludes: an idle exit or a registration timeout fences the
    /// policy's older demand; a completed job the journal has not named is one queued job less
    /// until a delivery names the runner or the next poll says which.
    pub(super) fn remember_conclusion(
        &self,
        policy: &str,
        runner_name: &str,
        conclusion: Conclusion,
        job_known: bool,
    ) {
        if conclusion == Conclusion::CompletedJob && !job_known {
            self.memory
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .unknown_completions
                .entry(policy.to_owned())
                .or_default()
                .push(UnknownCompletion {
                    concluded_at_ms: self.now_ms(),
                    runner_name: runner_name.to_owned(),
                });
        }
        if fences_demand(conclusion) {
            self.memory
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .fences
                .insert(policy.to_owned(), self.now_ms());
        }
    }

    /// Called when a launch ends: a failure (terminal or not, and the sentence it is
    /// journalled with) backs the policy off, a runner resets it.
    pub(super) fn remember_launch(&self, policy: &str, failed: Option<(bool, String)>) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        match failed {
            None => {
                memory.backoff.remove(policy);
            }
            Some((terminal, why)) => {
                let failures = memory.backoff.get(policy).map_or(0, |b| b.failures) + 1;
                let wait = launch_backoff(failures, terminal);
                let until = self.now_ms().saturating_add(rm_base::clock::ms(wait));
                memory.backoff.insert(
                    policy.to_owned(),
                    Backoff {
                        until_ms: until,
                        failures,
                        last_failure: Some(why),
                    },
                );
                if failures >= NOTIFY_AFTER_FAILURES {
                    self.notifier.notify(OperatorEvent::RunnersFailingToStart {
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
        }
    }

    /// Whether `policy` is in its launch back-off now.
    fn backing_off_now(&self, policy: &str) -> bool {
        let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        memory
            .backoff
            .get(policy)
            .is_some_and(|b| backing_off(self.now_ms(), b.until_ms))
    }

    /// What allocation remembers (fences, back-offs, launches in flight), for the status
    /// snapshot: `explain` and `status` decide with the same facts.
    pub fn published_memory(&self) -> AllocationMemory {
        let mut launching: Vec<String> = self
            .lock_launching()
            .iter()
            .map(|id| id.as_str().to_owned())
            .collect();
        launching.sort();
        let memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let mut policies: std::collections::BTreeMap<String, PolicyMemory> = Default::default();
        for (policy, fence) in &memory.fences {
            policies.entry(policy.clone()).or_default().fence_ms = Some(*fence);
        }
        for (policy, backoff) in &memory.backoff {
            policies.entry(policy.clone()).or_default().backoff = Some(backoff.clone());
        }
        AllocationMemory {
            policies,
            launching,
            draining: self.draining.load(std::sync::atomic::Ordering::SeqCst),
        }
    }

    /// Tracks demand held back by the host's ceiling; tells the operator when it lasts.
    fn note_waiting(&self, policy: &Policy, demand: u32, limit: allocation::Limit) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting_too_long(
            &mut memory.waiting_since,
            &policy.name,
            demand,
            limit,
            self.now_ms(),
        ) {
            self.notifier
                .notify(OperatorEvent::DemandWaitingAtCapacity {
                    policy: policy.name.clone(),
                    waiting: demand,
                });
        }
    }

    /// Whether `policy` still has queued jobs (a JIT retry stops when the demand is gone).
    pub(super) fn still_wanted(&self, policy: &Policy) -> bool {
        let Ok(jobs) = self.lock_reader().queued_jobs() else {
            return true;
        };
        let queued: Vec<QueuedJob> = jobs.iter().map(QueuedJob::from).collect();
        demand::route(&self.settings.policies, &queued).of(&policy.name) > 0
            || policy.min_runners > 0
    }
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
        let mut since = HashMap::new();
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            3,
            Limit::HostCapacity,
            0
        ));
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            3,
            Limit::HostCapacity,
            after - 1
        ));
        assert!(waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            after
        ));
        // A slot freed (or the demand was met): the clock starts over.
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            0,
            Limit::HostCapacity,
            after + 1
        ));
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            after + 2
        ));
        assert!(!waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            2 * after
        ));
        assert!(waiting_too_long(
            &mut since,
            "linux",
            2,
            Limit::HostCapacity,
            2 * after + 2
        ));
        // The policy's own ceiling is the operator's choice, not a shortage.
        let mut since = HashMap::new();
        for at in [0, after, 2 * after] {
            assert!(!waiting_too_long(
                &mut since,
                "gpu",
                5,
                Limit::MaxRunners,
                at
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
        let done = |at: i64, runner: &str| UnknownCompletion {
            concluded_at_ms: at,
            runner_name: runner.to_owned(),
        };
        let both = [
            done(100, "rm-h-aaaaaaaaaaaa"),
            done(200, "rm-h-bbbbbbbbbbbb"),
        ];
        let none = HashSet::new();
        assert_eq!(unknown_completions(&both, &none, 0, 300), 2);
        // A poll that began after the first completion has corrected the journal for it.
        assert_eq!(unknown_completions(&both, &none, 150, 300), 1);
        assert_eq!(unknown_completions(&both[..1], &none, 0, 100 + ttl), 0);
        // A late delivery named the second runner: its job is no longer queued in the journal,
        // so it no longer stands for one of the queued ones.
        let named: HashSet<String> = ["rm-h-bbbbbbbbbbbb".to_owned()].into();
        assert_eq!(unknown_completions(&both, &named, 0, 300), 1);
    }

    #[test]
    fn only_giving_up_fences_demand() {
        assert!(fences_demand(Conclusion::IdleExit));
        assert!(fences_demand(Conclusion::Failed(
            FailureReason::TerminatedAfterRegistrationTimeout
        )));
        assert!(!fences_demand(Conclusion::CompletedJob));
        assert!(!fences_demand(Conclusion::Orphaned));
        assert!(!fences_demand(Conclusion::Failed(
            FailureReason::ProcessExitedUnexpectedly
        )));
    }
}

/// Every uid of the pool is held by an attempt not yet cleaned (or used by another process):
/// no runner starts until cleanup releases one.
#[derive(Debug, thiserror::Error)]
#[error(
    "no runner uid is free: {held} of the pool's {pool} are held by attempts not yet cleaned (or run other processes); runners start again when cleanup releases one — see `rm-agent runners` for attempts stuck before `cleaned`"
)]
pub struct NoFreeUid {
    pool: usize,
    held: usize,
}
