//! Why a job is where it is (CONTRACT §8: `rm-agent explain`, and `status`'s waiting jobs): one
//! pure decision from a journalled job and the facts around it to a verdict, its reasons and
//! the runner it concerns. It owns no rule of its own: routing is [`demand::route`]'s and
//! [`demand::matches`]'s, a job's fence [`allocate::counts_after_fence`]'s, and what held a
//! policy's demand back (the host unfit, a launch back-off, a ceiling, no free uid) is the
//! allocation plan's ([`plan`]): the running agent's last published plan, else one made here by
//! the same [`plan::plan`] from the journal and the snapshot. `explain` renders it.
//!
//! The chain for a queued job, in order: the job's labels are routed to one policy (else
//! `no_matching_policy`); a runner of that policy gave up on jobs this old (`waiting_for_github`,
//! fenced); a live runner of the policy stands for it (idle: `waiting_for_github`; starting:
//! `launching`; not registered yet: `github_unreachable`, `rate_limited` or `launching`);
//! otherwise no runner stands for it yet and the first condition that holds of GitHub
//! unreachable, the host unfit (the gate stops the whole allocation pass), the policy's launch
//! back-off, the policy's or the host's ceiling (or the runner uid pool), a held rate limit, is
//! the verdict, else the next allocation pass starts a runner (`launching`). GitHub unreachable
//! comes before the back-off because it causes it: every launch fails while it holds. Every
//! other condition that also holds follows as a further reason.
//!
//! Demand is advisory (a runner takes any job its labels match), so which runner "stands for"
//! which job is a convention: a policy's queued jobs, oldest sighting first, are paired with its
//! live runners that are not busy, the most advanced first (idle, then starting, registered,
//! allocated). The executor starts runners by count, and this pairing is the same count.
//!
//! Facts only the running agent has (back-off, fences, launches in flight, rate limit,
//! reachability, fitness) come from its last status snapshot; from a stopped agent they are as
//! of then, and the explanation says so.
//!
//! In a fleet (CONTRACT §9) the job's claim comes first ([`fleet`]): a job another live host
//! claimed is that host's; otherwise this host's chain follows, saying whether it claimed the
//! job or nobody has.

pub(crate) mod cache;
pub(crate) mod egress;
pub(crate) mod ended;
pub(crate) mod fleet;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rm_journal::{AttemptRecord, AttemptState, JobRow};
use rm_vocab::{JobId, UnixMs};
use serde::Serialize;

use crate::config::{Policy, Target};
use crate::demand::{self, QueuedJob};
use crate::executor::allocate;
use crate::executor::allocate::published::PolicyMemory;
use crate::executor::plan::pack::{Resource, Wait};
use crate::executor::plan::{self, CeilingKind, Held, Plan};
use crate::executor::sizing;
use crate::status_file::{Liveness, Snapshot};

/// How many runners an `at_capacity` reason names before it says "and N more".
const HOLDERS_NAMED: usize = 8;

/// The verdicts of CONTRACT §8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    NoMatchingPolicy,
    AtCapacity,
    Launching,
    LaunchBackoff,
    RateLimited,
    GithubUnreachable,
    HostUnfit,
    NotSeen,
    WaitingForGithub,
    Running,
    Done,
    /// The job is a scale set's: GitHub assigns it to one of the scale set's runners.
    ScaleSet,
    /// Its shape (`rm-` labels) is refused or larger than the host: it never starts here.
    ShapeRefused,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::NoMatchingPolicy => "no_matching_policy",
            Verdict::AtCapacity => "at_capacity",
            Verdict::Launching => "launching",
            Verdict::LaunchBackoff => "launch_backoff",
            Verdict::RateLimited => "rate_limited",
            Verdict::GithubUnreachable => "github_unreachable",
            Verdict::HostUnfit => "host_unfit",
            Verdict::NotSeen => "not_seen",
            Verdict::WaitingForGithub => "waiting_for_github",
            Verdict::Running => "running",
            Verdict::Done => "done",
            Verdict::ScaleSet => "scale_set",
            Verdict::ShapeRefused => "shape_refused",
        }
    }
}

/// One reason: a stable code for scripts and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Reason {
    pub code: &'static str,
    pub message: String,
}

fn reason(code: &'static str, message: impl Into<String>) -> Reason {
    Reason {
        code,
        message: message.into(),
    }
}

/// The answer. `reasons[0]` is the verdict's own reason; the others are further conditions that
/// hold too (and what the answer cannot know).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Explanation {
    pub job_id: JobId,
    /// The journal's state of the job; `None` when the journal has no such job.
    pub state: Option<String>,
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
    /// The runner the verdict concerns (the one running it, the idle one GitHub has not given
    /// it, the one starting for it), when there is one.
    pub runner_name: Option<String>,
    /// The policy that serves the job, when one does.
    pub policy: Option<String>,
    /// A short phrase without ids, for grouping waiting jobs in `status`.
    pub summary: String,
    /// How the runner that took the job ended (a job running or done), from this host's
    /// journal and kept logs.
    pub runner_end: Option<ended::RunnerEnd>,
}

/// Everything the decision looks at, read before it runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    pub now_ms: UnixMs,
    pub policies: &'a [Policy],
    /// `host.max_runners` of the running agent (its snapshot), else of the configuration.
    pub host_max: u32,
    /// Every queued job of the journal, oldest sighting first (`Reader::queued_jobs`).
    pub queued: &'a [JobRow],
    /// Every attempt not yet cleaned.
    pub attempts: &'a [AttemptRecord],
    pub agent: Liveness,
    /// The agent's last snapshot, current or not.
    pub snapshot: Option<&'a Snapshot>,
    /// The runner uid pool's size under `isolation = "user"`; `None` under `none`.
    pub uid_pool: Option<usize>,
    /// In a fleet: this host and the fleet's claims ([`fleet`]); `queued` is then the fleet's.
    pub fleet: Option<fleet::FleetFacts<'a>>,
    /// This host's attempts that ran the job explained, oldest first ([`ended`]); empty for
    /// `status`'s waiting jobs.
    pub ran: &'a [ended::RanAttempt],
    /// The re-run this host journalled for the job explained, if any.
    pub rerun: Option<&'a rm_journal::RerunRecord>,
    /// This host's journalled scale sets: their notes say why a listener is not serving.
    pub scale_sets: &'a [rm_journal::ScaleSetRecord],
    /// `[host] capacity` and `[[host.device]]` (issue 42): what packing fits runners into.
    pub capacity: crate::config::HostCapacity,
    pub devices: &'a [crate::config::Device],
}

/// A blocking condition with the verdict it gives when it is the first that holds.
struct Condition {
    verdict: Verdict,
    reason: Reason,
    summary: String,
}

fn condition(verdict: Verdict, reason: Reason, summary: impl Into<String>) -> Condition {
    Condition {
        verdict,
        reason,
        summary: summary.into(),
    }
}

/// The queue as allocation sees it, computed once for any number of explanations: the jobs
/// routed to the policies, and for each routed job that its policy's fence leaves as demand,
/// its place among them and how many they are.
struct Queue {
    routed: demand::Demand,
    places: HashMap<JobId, (usize, usize)>,
    /// Per policy, the allocation plan the chain renders ([`PolicyView`]).
    plans: HashMap<String, PolicyView>,
}

/// One policy's part of the allocation plan, as a waiting job's chain reads it: the running
/// agent's last published plan ([`plan::Published`]) when there is one, else a plan made here
/// by the executor's own [`plan::plan`] from the facts (the agent is stopped, or has not
/// allocated yet). Either way `explain` renders what the plan held back; it decides nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PolicyView {
    /// Runners the plan started that now stand for the oldest jobs (a published plan's: they
    /// are live attempts since, counted before this view): the waiting jobs come after them.
    started: u32,
    /// Runners the plan starts now (a made plan's).
    start: u32,
    /// Runners the ceilings left room for ([`plan::PolicyPlan::room`]).
    room: u32,
    held: Vec<Held>,
    /// The jobs packing left waiting, and why (issue 42).
    waits: HashMap<JobId, Wait>,
}

impl PolicyView {
    fn published(p: &plan::PublishedPolicy) -> PolicyView {
        PolicyView {
            started: p.start,
            start: p.start,
            room: p.room,
            held: p.held.clone(),
            waits: p.waits.iter().map(|w| (w.job_id, w.wait.clone())).collect(),
        }
    }

    fn made(p: &plan::PolicyPlan) -> PolicyView {
        PolicyView {
            started: 0,
            start: p.start,
            room: p.room,
            held: p.held.clone(),
            waits: p.waits.iter().cloned().collect(),
        }
    }

    fn backing_off(&self) -> Option<UnixMs> {
        self.held.iter().find_map(|h| match h {
            Held::BackingOff { until_ms } => Some(*until_ms),
            _ => None,
        })
    }

    fn ceiling(&self) -> Option<(CeilingKind, u32)> {
        self.held.iter().find_map(|h| match h {
            Held::AtCapacity { limit, ceiling } => Some((*limit, *ceiling)),
            _ => None,
        })
    }
}

/// The fence of `policy` in the snapshot's allocation memory (the earliest instant: none).
fn fence_of(facts: &Facts<'_>, policy: &str) -> UnixMs {
    memory_of(facts, policy)
        .and_then(|m| m.fence_ms)
        .unwrap_or(UnixMs::new(i64::MIN))
}

/// What the snapshot's allocation memory holds of `policy` (its fence and back-off), if any.
fn memory_of<'a>(facts: &Facts<'a>, policy: &str) -> Option<&'a PolicyMemory> {
    facts
        .snapshot
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.policies.get(policy))
}

impl Queue {
    /// The queue of `facts`, with `extra` in it if the journal's queue lacked it.
    /// In a fleet it is this host's queue: the jobs other live hosts claimed leave it.
    fn of(facts: &Facts<'_>, extra: Option<&JobRow>) -> Queue {
        let elsewhere: HashSet<JobId> = facts
            .fleet
            .map(fleet::claimed_elsewhere)
            .unwrap_or_default();
        let mine = || {
            facts
                .queued
                .iter()
                .filter(|j| !elsewhere.contains(&j.job_id))
        };
        let mut jobs: Vec<QueuedJob> = mine().map(QueuedJob::from).collect();
        let mut first_seen: HashMap<JobId, UnixMs> =
            mine().map(|j| (j.job_id, j.first_seen_at_ms)).collect();
        if let Some(job) = extra.filter(|j| j.state == rm_vocab::JobState::Queued)
            && !first_seen.contains_key(&job.job_id)
        {
            jobs.push(QueuedJob::from(job));
            first_seen.insert(job.job_id, job.first_seen_at_ms);
        }
        let routed = demand::route(facts.policies, &jobs);
        let mut places = HashMap::new();
        let mut counted: HashMap<&str, Vec<JobId>> = HashMap::new();
        for (policy, ids) in &routed.per_policy {
            let fence = fence_of(facts, policy);
            let of = facts.policies.iter().find(|p| &p.name == policy);
            // A job whose shape its policy refuses is no demand (the allocator's rule): it
            // has no place, and says why ([`shape_refused`]).
            let refused = |id: &JobId| {
                of.zip(jobs.iter().find(|j| j.job_id == *id))
                    .is_some_and(|(p, j)| crate::shape::resolve(p, &j.labels).is_err())
            };
            let demand: Vec<JobId> = ids
                .iter()
                .copied()
                .filter(|id| {
                    first_seen
                        .get(id)
                        .is_some_and(|seen| allocate::counts_after_fence(*seen, fence))
                        && !refused(id)
                })
                .collect();
            for (place, id) in demand.iter().enumerate() {
                places.insert(*id, (place, demand.len()));
            }
            counted.insert(policy.as_str(), demand);
        }
        let made = made_plan(facts, &counted);
        let published = facts
            .snapshot
            .filter(|_| facts.agent.is_running())
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.plan.as_ref());
        let plans = made
            .policies
            .iter()
            .map(|p| {
                let view = published
                    .and_then(|published| published.policies.get(&p.policy))
                    .map_or_else(|| PolicyView::made(p), PolicyView::published);
                (p.policy.clone(), view)
            })
            .collect();
        Queue {
            routed,
            places,
            plans,
        }
    }
}

/// The plan the executor would make for the policies' counted jobs from the facts: the
/// journal's live attempts and held uids, the snapshot's fitness and back-offs.
fn made_plan(facts: &Facts<'_>, counted: &HashMap<&str, Vec<JobId>>) -> Plan {
    let host = sizing::Host {
        capacity: &facts.capacity,
        devices: facts.devices,
        max_runners: facts.host_max,
    };
    let mut counts = rm_journal::LiveCounts::default();
    let mut busy_unknown: HashMap<&str, usize> = HashMap::new();
    for attempt in facts
        .attempts
        .iter()
        .filter(|a| a.state.counts_against_capacity())
    {
        let of_policy = counts.per_policy.entry(attempt.policy.clone()).or_default();
        of_policy.live += 1;
        if attempt.state == AttemptState::Busy {
            of_policy.busy += 1;
            if attempt.job_id.is_none() {
                *busy_unknown.entry(attempt.policy.as_str()).or_default() += 1;
            }
        }
    }
    let by_id: HashMap<JobId, &JobRow> = facts.queued.iter().map(|j| (j.job_id, j)).collect();
    let policies = facts
        .policies
        .iter()
        .map(|policy| {
            let jobs = counted
                .get(policy.name.as_str())
                .cloned()
                .unwrap_or_default();
            let rows: Vec<&JobRow> = jobs
                .iter()
                .filter_map(|id| by_id.get(id).copied())
                .collect();
            let (shaped, _) = sizing::shaped(host, policy, &rows, facts.attempts);
            plan::PolicyInputs {
                policy,
                backing_off_until: backoff_of(facts, &policy.name),
                // The fence is the job's own reason ([`served`]), not a count of the plan's.
                fenced: 0,
                count: count(jobs.len()),
                jobs,
                busy_unknown: busy_unknown.get(policy.name.as_str()).copied().unwrap_or(0),
                shaped,
            }
        })
        .collect();
    let held_uids = facts.attempts.iter().filter(|a| a.uid.is_some()).count();
    plan::plan(&plan::Inputs {
        now_ms: facts.now_ms,
        fit: unfit(facts).is_none(),
        host_max: facts.host_max,
        counts: &counts,
        policies,
        standing: None,
        free_uids: facts
            .uid_pool
            .map(|pool| count(pool.saturating_sub(held_uids))),
        packing: sizing::packing(host, facts.policies, facts.attempts),
    })
}

/// The launch back-off of `policy` in the snapshot's allocation memory, if any.
fn backoff_of(facts: &Facts<'_>, policy: &str) -> Option<UnixMs> {
    memory_of(facts, policy)
        .and_then(|m| m.backoff.as_ref())
        .map(|b| b.until_ms)
}

/// Explains every queued job of `facts`, oldest first (`status`'s waiting jobs): the queue is
/// routed once, not once per job.
pub(crate) fn explain_queued(facts: &Facts<'_>) -> Vec<Explanation> {
    let queue = Queue::of(facts, None);
    facts
        .queued
        .iter()
        .map(|job| queued(job, facts, &queue))
        .collect()
}

/// Explains `job_id`, which the journal holds as `job` (or not at all).
pub(crate) fn explain(job_id: JobId, job: Option<&JobRow>, facts: &Facts<'_>) -> Explanation {
    let Some(job) = job else {
        let mut reasons = vec![not_seen(job_id, facts)];
        reasons.extend(agent_context(facts));
        return Explanation {
            job_id,
            state: None,
            verdict: Verdict::NotSeen,
            reasons,
            runner_name: None,
            policy: None,
            summary: "not seen yet".to_owned(),
            runner_end: None,
        };
    };
    // A job that ran says how its runner ended, and where its logs are.
    let (mut end_reasons, runner_end) = ended::reasons(job_id, facts.ran);
    end_reasons.extend(ended::rerun(facts.rerun));
    let answer = |verdict, mut reasons: Vec<Reason>, summary: &str| {
        reasons.extend(end_reasons.iter().cloned());
        Explanation {
            job_id,
            state: Some(job.state.as_str().to_owned()),
            verdict,
            reasons,
            runner_name: job.runner_name.clone(),
            policy: None,
            summary: summary.to_owned(),
            runner_end: runner_end.clone(),
        }
    };
    match job.state.as_str() {
        "completed" => answer(
            Verdict::Done,
            vec![reason(
                "completed",
                format!(
                    "The job completed ({}){}.",
                    job.conclusion.as_deref().unwrap_or("no conclusion given"),
                    on_runner(job)
                ),
            )],
            "done",
        ),
        "in_progress" => answer(
            Verdict::Running,
            vec![reason(
                "in_progress",
                format!("GitHub says the job is running{}.", on_runner(job)),
            )],
            "running",
        ),
        "waiting" => answer(
            Verdict::WaitingForGithub,
            vec![reason(
                "environment_approval",
                "GitHub holds the job for an environment's protection rules (a review or a \
                 wait timer): it is queued for a runner once they are met. Approve it in the \
                 workflow run's page.",
            )],
            "held for an environment's approval",
        ),
        _ => queued(job, facts, &Queue::of(facts, Some(job))),
    }
}

fn on_runner(job: &JobRow) -> String {
    job.runner_name
        .as_deref()
        .map_or_else(String::new, |r| format!(" on runner {r}"))
}

/// The chain for a queued job (in a fleet, the claim first: [`fleet`]).
fn queued(job: &JobRow, facts: &Facts<'_>, queue: &Queue) -> Explanation {
    if let Some(held) = facts
        .fleet
        .and_then(|f| fleet::held_elsewhere(job, f, facts.now_ms))
    {
        return Explanation {
            job_id: job.job_id,
            state: Some(job.state.as_str().to_owned()),
            verdict: held.condition.verdict,
            reasons: vec![held.condition.reason],
            runner_name: held.runner,
            policy: Some(held.policy),
            summary: held.condition.summary,
            runner_end: None,
        };
    }
    let routed = &queue.routed;
    let policy = routed
        .per_policy
        .iter()
        .find(|(_, ids)| ids.contains(&job.job_id))
        .and_then(|(name, _)| facts.policies.iter().find(|p| &p.name == name));
    let (chain, runner, policy_name) = match policy {
        Some(policy) => {
            let (chain, runner) = served(job, policy, queue, facts);
            (chain, runner, Some(policy.name.clone()))
        }
        None => {
            let mut chain = vec![unrouted(job, routed, facts.policies)];
            chain.extend(scale_set_listener(job, facts));
            (chain, None, None)
        }
    };
    let mut chain = chain.into_iter();
    let first = chain.next().unwrap_or_else(|| {
        condition(
            Verdict::Launching,
            reason("allocating", "A runner is about to be allocated."),
            "a runner is being allocated",
        )
    });
    let mut reasons = vec![first.reason];
    reasons.extend(chain.map(|c| c.reason));
    reasons.extend(fleet::own_chain_context(job, facts));
    reasons.extend(agent_context(facts));
    Explanation {
        job_id: job.job_id,
        state: Some(job.state.as_str().to_owned()),
        verdict: first.verdict,
        reasons,
        runner_name: runner,
        policy: policy_name,
        summary: first.summary,
        runner_end: None,
    }
}

fn label_list(labels: &[String]) -> String {
    let mut sorted: Vec<String> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
    sorted.sort();
    format!("[{}]", sorted.join(", "))
}

/// Why a scale set's job is not being served, when its listener says so: the note `status`
/// shows (backing off, refused, on standby, cannot find the scale set), cleared by the next
/// answered poll. A further reason after the `scale_set` verdict's own.
fn scale_set_listener(job: &JobRow, facts: &Facts<'_>) -> Option<Condition> {
    let set = facts
        .policies
        .iter()
        .find_map(|p| p.scale_set.as_ref().filter(|s| s.takes(&job.labels)))?;
    let record = facts.scale_sets.iter().find(|r| r.name == set.name)?;
    let note = record.note.as_deref().filter(|n| !n.is_empty())?;
    let since = record
        .note_at
        .map_or_else(String::new, |at| format!(" (since {})", at.to_rfc3339()));
    Some(condition(
        Verdict::ScaleSet,
        reason(
            "scale_set_listener",
            format!(
                "The listener of scale set `{}` is not being answered: {note}{since}. Until it \
                 polls again, GitHub assigns the job to no runner of this host.",
                set.name
            ),
        ),
        format!("served by scale set {}", set.name),
    ))
}

/// Why no single policy serves the job: an unevaluated label, two policies, or none, with the
/// closest policy and what differs.
fn unrouted(job: &JobRow, routed: &demand::Demand, policies: &[Policy]) -> Condition {
    let labels = label_list(&job.labels);
    if routed.unresolvable.contains(&job.job_id) {
        return condition(
            Verdict::NoMatchingPolicy,
            reason(
                "unresolvable_label",
                format!(
                    "The job's labels {labels} hold an unevaluated expression (`${{{{ ... }}}}`): \
                     GitHub sent `runs-on` verbatim, and no policy can match it. Check the \
                     workflow's `runs-on`."
                ),
            ),
            format!("unevaluated label in {labels}"),
        );
    }
    if let Some((_, both)) = routed.overlapping.iter().find(|(id, _)| *id == job.job_id) {
        return condition(
            Verdict::NoMatchingPolicy,
            reason(
                "overlapping_policies",
                format!(
                    "The policies {} all match {labels}: none starts a runner for it (whichever \
                     came up first would take it and the others would idle). Make their labels \
                     distinct.",
                    both.join(" and ")
                ),
            ),
            format!("{labels} matches {} policies", both.len()),
        );
    }
    if let Some((set, policy)) = policies.iter().find_map(|p| {
        p.scale_set
            .as_ref()
            .filter(|s| s.takes(&job.labels))
            .map(|s| (s, p))
    }) {
        return condition(
            Verdict::ScaleSet,
            reason(
                "scale_set",
                format!(
                    "The job's labels {labels} are scale set `{}`'s: GitHub assigns it to the \
                     scale set, whose runners (policy `{}`) rm starts as the scale set's \
                     statistics ask, and one of them takes it. Webhooks and polling do not start \
                     runners for it. `rm-agent status` shows the scale set's session and \
                     statistics.",
                    set.name, policy.name
                ),
            ),
            format!("served by scale set {}", set.name),
        );
    }
    let job_q = QueuedJob::from(job);
    let closest = policies
        .iter()
        .map(|p| {
            let missing: Vec<String> = job
                .labels
                .iter()
                .filter(|l| !p.labels.iter().any(|c| c.eq_ignore_ascii_case(l)))
                .map(|l| l.to_ascii_lowercase())
                .collect();
            let in_target = demand::matches(
                p,
                &QueuedJob {
                    labels: Vec::new(),
                    ..job_q.clone()
                },
            );
            (p, missing, in_target)
        })
        .min_by_key(|(_, missing, in_target)| (!in_target, missing.len()));
    let message = match closest {
        None => format!(
            "No policy is configured: nothing serves {labels}. Add a [[policy]] whose labels \
             carry every label of the job."
        ),
        Some((p, missing, in_target)) => {
            let mut differs = Vec::new();
            if !missing.is_empty() {
                differs.push(format!("lacks {}", label_list(&missing)));
            }
            if !in_target {
                differs.push(format!(
                    "serves {}, not {}",
                    target_name(&p.target),
                    job.repository
                ));
            }
            format!(
                "No policy of this host matches {labels} in {}. The closest, `{}` (labels {}), \
                 {}. Add the labels to a policy, or route the job elsewhere.",
                job.repository,
                p.name,
                label_list(&p.labels),
                differs.join(" and ")
            )
        }
    };
    condition(
        Verdict::NoMatchingPolicy,
        reason("no_policy_matches", message),
        format!("no policy matches {labels}"),
    )
}

fn target_name(target: &Target) -> String {
    target.to_string()
}

/// How far along a live, not busy runner is: the most advanced stands for the oldest job.
fn rank(state: AttemptState) -> u8 {
    match state {
        AttemptState::Idle => 0,
        AttemptState::Starting => 1,
        AttemptState::JitReceived => 2,
        _ => 3,
    }
}

/// The chain for a job `policy` serves: what stands between it and a runner, in order.
fn served(
    job: &JobRow,
    policy: &Policy,
    queue: &Queue,
    facts: &Facts<'_>,
) -> (Vec<Condition>, Option<String>) {
    if let Err(refusal) = crate::shape::resolve(policy, &job.labels) {
        return (
            vec![condition(
                Verdict::ShapeRefused,
                reason("shape_refused", refusal.to_string()),
                format!("its shape is refused by {}", policy.name),
            )],
            None,
        );
    }
    let memory = memory_of(facts, &policy.name);
    let fence = fence_of(facts, &policy.name);
    let Some(&(position, _)) = queue
        .places
        .get(&job.job_id)
        .filter(|_| allocate::counts_after_fence(job.first_seen_at_ms, fence))
    else {
        return (
            vec![condition(
                Verdict::WaitingForGithub,
                reason(
                    "fenced",
                    format!(
                        "A runner of `{}` gave up while this job was queued ({}; an idle exit \
                         or a registration timeout): the agent starts no other runner for jobs \
                         queued before then. GitHub is likely not offering this job \
                         (the next poll corrects a stale state); re-run it if it stays queued. \
                         A restart of the agent forgets this.",
                        policy.name,
                        ago_phrase(facts.now_ms, fence)
                    ),
                ),
                format!("a runner of {} gave up on it", policy.name),
            )],
            None,
        );
    };
    let live: Vec<&AttemptRecord> = facts
        .attempts
        .iter()
        .filter(|a| a.state.counts_against_capacity())
        .collect();
    let of_policy: Vec<&AttemptRecord> = live
        .iter()
        .copied()
        .filter(|a| a.policy == policy.name)
        .collect();
    let busy_unknown: Vec<&AttemptRecord> = of_policy
        .iter()
        .copied()
        .filter(|a| a.state == AttemptState::Busy && a.job_id.is_none())
        .collect();
    let mut unassigned: Vec<&AttemptRecord> = of_policy
        .iter()
        .copied()
        .filter(|a| a.state != AttemptState::Busy)
        .collect();
    unassigned.sort_by_key(|a| (rank(a.state), a.created_at_ms));
    let github = github_conditions(facts);
    if let Some(runner) = busy_unknown.get(position) {
        return (
            vec![condition(
                Verdict::WaitingForGithub,
                reason(
                    "unnamed_busy_runner",
                    format!(
                        "Runner {} of `{}` took a job GitHub has not named yet (no in_progress \
                         delivery or poll so far); it may be this one, and the agent counts it \
                         as such.",
                        runner.runner_name, policy.name
                    ),
                ),
                format!("a runner of {} took a job not yet named", policy.name),
            )],
            Some(runner.runner_name.clone()),
        );
    }
    let position = position - busy_unknown.len();
    if let Some(runner) = unassigned.get(position) {
        return (
            covered(runner, policy, github, facts),
            Some(runner.runner_name.clone()),
        );
    }
    let view = queue.plans.get(&policy.name).cloned().unwrap_or_default();
    // The job's place in the plan: after the live runners that stand for older jobs, and after
    // those a published plan started since.
    let slot = count(position - unassigned.len()).saturating_add(view.started);
    let mut chain = Vec::new();
    let (unreachable, held) = github;
    chain.extend(unreachable);
    // The plan's own reasons, in the chain's order: the fitness gate stops the whole
    // allocation pass before any policy's back-off is read; then the ceilings or the uid pool.
    if view.held.contains(&Held::Unfit) {
        chain.push(unfit(facts).unwrap_or_else(|| {
            condition(
                Verdict::HostUnfit,
                reason(
                    "host_unfit",
                    "The host is unfit, so no new runner is registered until it is fit again \
                     (`rm-agent status` says why).",
                ),
                "the host is unfit",
            )
        }));
    }
    if let Some(until_ms) = view
        .backing_off()
        .filter(|until| allocate::backing_off(facts.now_ms, *until))
    {
        chain.push(backing_off(policy, until_ms, memory, facts));
    }
    if slot >= view.room {
        if let Some((limit, ceiling)) = view.ceiling() {
            chain.push(at_capacity(policy, limit, ceiling, &of_policy, &live));
        }
    } else if slot >= view.start && view.held.contains(&Held::NoFreeUid) {
        chain.push(condition(
            Verdict::AtCapacity,
            reason(
                "uid_pool",
                format!(
                    "Every runner uid of host.runner_uids{} is held by an attempt not yet \
                     cleaned (or runs another process): no runner starts until cleanup \
                     releases one (`rm-agent runners` lists attempts stuck before `cleaned`).",
                    facts
                        .uid_pool
                        .map_or_else(String::new, |pool| format!(" ({pool})"))
                ),
            ),
            "no free runner uid",
        ));
    }
    if let Some(wait) = view.waits.get(&job.job_id) {
        chain.push(packing_wait(policy, wait));
    }
    chain.extend(held);
    if !chain.is_empty() {
        return (chain, None);
    }
    chain.push(condition(
        Verdict::Launching,
        reason(
            "allocating",
            if facts.agent.is_running() {
                format!(
                    "Nothing holds it back: the agent's next allocation pass starts a runner of \
                     `{}` for it (passes run at least every {}s).",
                    policy.name,
                    crate::executor::PASS_INTERVAL.as_secs()
                )
            } else {
                format!(
                    "Nothing else holds it back: a runner of `{}` is started for it once an \
                     agent runs.",
                    policy.name
                )
            },
        ),
        format!("a runner of {} is being allocated", policy.name),
    ));
    (chain, None)
}

/// Why packing left the job waiting (issue 42): the room running runners hold, a device, an
/// older job that reserved the room, or a shape larger than the host.
fn packing_wait(policy: &Policy, wait: &Wait) -> Condition {
    match wait {
        Wait::Room {
            resource: resource @ Resource::Device(group),
        } => condition(
            Verdict::AtCapacity,
            reason(
                "waiting_for_device",
                format!(
                    "Every {resource} of this host is held by a running runner: the job starts \
                     when one returns to the pool at its runner's cleanup (`rm-agent status` \
                     lists the devices and their holders)."
                ),
            ),
            format!("waiting for a {group} device"),
        ),
        Wait::Room { resource } => condition(
            Verdict::AtCapacity,
            reason(
                "waiting_for_capacity",
                format!(
                    "What the running runners hold leaves too little {resource} for this job's \
                     shape on this host: it starts when enough is freed (`rm-agent status` shows \
                     the capacity used and free)."
                ),
            ),
            format!("waiting for {resource}"),
        ),
        Wait::Behind { job_id } => condition(
            Verdict::AtCapacity,
            reason(
                "waiting_behind",
                format!(
                    "Job {job_id} has waited {} minutes for room and now reserves it: no job \
                     queued after it starts before it does.",
                    plan::pack::RESERVE_AFTER.as_secs() / 60
                ),
            ),
            format!("waiting behind job {job_id}"),
        ),
        Wait::ExceedsHost { resource } => condition(
            Verdict::ShapeRefused,
            reason(
                "shape_exceeds_host",
                format!(
                    "The job asks for more {} than this host has at all (host.capacity, \
                     [[host.device]]): no runner of `{}` on this host can take it. Ask for \
                     less in its rm- labels, or serve it from a larger host.",
                    match resource {
                        Resource::Device(group) => format!("`{group}` devices"),
                        other => other.to_string(),
                    },
                    policy.name
                ),
            ),
            "its shape exceeds this host",
        ),
    }
}

/// The policy's launch back-off, with what the snapshot remembers of its failures.
fn backing_off(
    policy: &Policy,
    until_ms: UnixMs,
    memory: Option<&PolicyMemory>,
    facts: &Facts<'_>,
) -> Condition {
    let backoff = memory.and_then(|m| m.backoff.as_ref());
    condition(
        Verdict::LaunchBackoff,
        reason(
            "launch_backoff",
            format!(
                "`{}` backs off after {} failed launch(es) in a row: no runner of it starts \
                 for {}. Last failure: {}. `rm-agent runners` shows the failed attempts; \
                 `rm-agent check` verifies the package, the App's permission and the runner \
                 group.",
                policy.name,
                backoff.map_or(1, |b| b.failures),
                in_phrase(facts.now_ms, until_ms),
                backoff
                    .and_then(|b| b.last_failure.as_deref())
                    .unwrap_or("not recorded")
            ),
        ),
        format!("{} backs off after failed launches", policy.name),
    )
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The chain when a live runner stands for the job.
fn covered(
    runner: &AttemptRecord,
    policy: &Policy,
    github: (Option<Condition>, Option<Condition>),
    facts: &Facts<'_>,
) -> Vec<Condition> {
    let name = &runner.runner_name;
    let since = ago_phrase(facts.now_ms, runner.state_changed_at_ms);
    match runner.state {
        AttemptState::Idle => vec![condition(
            Verdict::WaitingForGithub,
            reason(
                "runner_idle",
                format!(
                    "Runner {name} of `{}` is registered and idle ({since}); GitHub has not given \
                     it this job yet. GitHub assigns jobs itself; a runner that gets none exits \
                     at its idle timeout.",
                    policy.name
                ),
            ),
            format!(
                "a runner of {} is idle, GitHub has not assigned it",
                policy.name
            ),
        )],
        AttemptState::Starting | AttemptState::JitReceived => vec![condition(
            Verdict::Launching,
            reason(
                "runner_starting",
                format!(
                    "Runner {name} of `{}` is {} ({since}); it takes a job once it is online.",
                    policy.name,
                    if runner.state == AttemptState::Starting {
                        "started and registering with GitHub"
                    } else {
                        "registered; its process is being started"
                    }
                ),
            ),
            format!("a runner of {} is starting", policy.name),
        )],
        _ => {
            let (unreachable, held) = github;
            let launch = facts
                .snapshot
                .and_then(|s| s.allocation.as_ref())
                .is_some_and(|a| {
                    a.launching
                        .iter()
                        .any(|id| id == runner.attempt_id.as_str())
                });
            let mut chain: Vec<Condition> = unreachable.into_iter().chain(held).collect();
            chain.push(condition(
                Verdict::Launching,
                reason(
                    "registering",
                    format!(
                        "Runner {name} of `{}` was allocated for it ({since}) and {}.",
                        policy.name,
                        if launch || !facts.agent.is_running() {
                            "is being registered with GitHub"
                        } else {
                            "its launch is about to begin"
                        }
                    ),
                ),
                format!("a runner of {} is being registered", policy.name),
            ));
            chain
        }
    }
}

/// GitHub unreachable and a held rate limit, as the snapshot says (each `None` if not).
fn github_conditions(facts: &Facts<'_>) -> (Option<Condition>, Option<Condition>) {
    let Some(snapshot) = facts.snapshot else {
        return (None, None);
    };
    let unreachable = match &snapshot.polling.offline {
        Some(offline) => Some(offline.description.clone()),
        None if !snapshot.github.reachable => Some(format!(
            "GitHub did not answer the agent's last request (its last answer was {})",
            snapshot
                .github
                .last_contact_at_ms
                .map_or_else(|| "never".to_owned(), |at| ago_phrase(facts.now_ms, at),)
        )),
        None => None,
    }
    .map(|what| {
        condition(
            Verdict::GithubUnreachable,
            reason(
                "github_unreachable",
                format!(
                    "{what}: no runner can be registered until it answers; the agent retries \
                     with back-off. Check this host's network, DNS and proxy settings."
                ),
            ),
            "GitHub is unreachable",
        )
    });
    let held = snapshot
        .github
        .held
        .as_ref()
        .filter(|h| h.until_ms > facts.now_ms)
        .map(|h| {
            condition(
                Verdict::RateLimited,
                reason(
                    "rate_limited",
                    format!(
                        "GitHub's {} rate limit holds every request of the installation for {} \
                         (until {}){}: no runner is registered until then, and the job is served \
                         after it. Other tools using the same App installation add to it.",
                        h.kind,
                        in_phrase(facts.now_ms, h.until_ms),
                        h.until_ms.to_rfc3339(),
                        h.limit
                            .as_ref()
                            .map_or_else(String::new, |l| format!("; the limit: {l}"))
                    ),
                ),
                format!("GitHub's {} rate limit holds registrations", h.kind),
            )
        });
    (unreachable, held)
}

/// The fitness gate's problems, as the snapshot says: one condition naming them all.
fn unfit(facts: &Facts<'_>) -> Option<Condition> {
    let fitness = facts.snapshot?.fitness.as_ref()?;
    if fitness.problems.is_empty() {
        return None;
    }
    let codes: Vec<&str> = fitness.problems.iter().map(|p| p.code.as_str()).collect();
    let messages: Vec<&str> = fitness
        .problems
        .iter()
        .map(|p| p.message.as_str())
        .collect();
    Some(condition(
        Verdict::HostUnfit,
        reason(
            "host_unfit",
            format!(
                "The host is unfit (checked {}), so no new runner is registered until it is \
                 fit again: {}.",
                ago_phrase(facts.now_ms, UnixMs::new(fitness.checked_at_ms)),
                messages.join("; ")
            ),
        ),
        format!("the host is unfit ({})", codes.join(", ")),
    ))
}

/// The ceiling allocation stopped at, and who holds it.
fn at_capacity(
    policy: &Policy,
    limit: CeilingKind,
    ceiling: u32,
    of_policy: &[&AttemptRecord],
    live: &[&AttemptRecord],
) -> Condition {
    let holders = |attempts: &[&AttemptRecord]| {
        let mut named: Vec<String> = attempts
            .iter()
            .take(HOLDERS_NAMED)
            .map(|a| {
                let job = a.job_id.map_or_else(String::new, |j| format!(", job {j}"));
                format!("{} ({}{job})", a.runner_name, a.state.as_str())
            })
            .collect();
        if attempts.len() > HOLDERS_NAMED {
            named.push(format!("and {} more", attempts.len() - HOLDERS_NAMED));
        }
        if named.is_empty() {
            "none".to_owned()
        } else {
            named.join(", ")
        }
    };
    if limit == CeilingKind::HostCapacity {
        condition(
            Verdict::AtCapacity,
            reason(
                "host_capacity",
                format!(
                    "The host is at its ceiling, host.max_runners = {ceiling} ({} live): the job \
                     gets a runner when one of them ends. Held by: {}.",
                    live.len(),
                    holders(live)
                ),
            ),
            format!("at the host's max_runners ({ceiling})"),
        )
    } else {
        condition(
            Verdict::AtCapacity,
            reason(
                "policy_capacity",
                format!(
                    "`{}` is at its ceiling, max_runners = {ceiling} ({} live): the job gets a \
                     runner when one of them ends. Held by: {}.",
                    policy.name,
                    of_policy.len(),
                    holders(of_policy)
                ),
            ),
            format!("at {}'s max_runners ({ceiling})", policy.name),
        )
    }
}

/// Why a job the journal does not hold may not be seen yet.
fn not_seen(job_id: JobId, facts: &Facts<'_>) -> Reason {
    let next_poll = facts
        .snapshot
        .filter(|_| facts.agent.is_running())
        .and_then(|s| s.polling.next_poll_at_ms)
        .map_or_else(String::new, |at| {
            format!(" The next poll is {}.", in_phrase(facts.now_ms, at))
        });
    reason(
        "not_seen",
        format!(
            "The journal has no job {job_id}: no webhook delivery named it and no poll has \
             found it yet (or it is not in a target of this host's policies, or retention \
             removed it).{next_poll} `rm-agent deliveries` lists what arrived."
        ),
    )
}

/// What the answer cannot know about the agent right now.
fn agent_context(facts: &Facts<'_>) -> Vec<Reason> {
    let as_of = facts.snapshot.map_or_else(
        || {
            "There is no status snapshot: launch back-off, fences, rate limit, GitHub's \
             reachability and the host's fitness are not known."
                .to_owned()
        },
        |s| {
            format!(
                "Launch back-off, fences, rate limit, GitHub's reachability and the host's \
                 fitness are as of its last status, written {}; a restart forgets back-off and \
                 fences.",
                ago_phrase(facts.now_ms, s.written_at_ms)
            )
        },
    );
    let mut context = Vec::new();
    match facts.agent {
        Liveness::Running { .. } => {}
        Liveness::Silent { pid, .. } => context.push(reason(
            "agent_silent",
            format!("rm-agent (pid {pid}) has stopped publishing its status. {as_of}"),
        )),
        Liveness::ReceiverOnly { pid } => context.push(reason(
            "agent_receiver_only",
            format!(
                "Only an rm-agent that runs no runners holds the data directory (pid {pid}): no \
                 job gets a runner until `rm-agent run` does. {as_of}"
            ),
        )),
        Liveness::Stopped { .. } => context.push(reason(
            "agent_stopped",
            format!("No rm-agent is running: no runner starts until `rm-agent run` does. {as_of}"),
        )),
    }
    if facts.agent.is_running()
        && facts
            .snapshot
            .and_then(|s| s.allocation.as_ref())
            .is_some_and(|a| a.draining)
    {
        context.push(reason(
            "agent_draining",
            "The agent is draining (it was told to stop): it starts no new runner.",
        ));
    }
    context
}

fn ago_phrase(now_ms: UnixMs, at_ms: UnixMs) -> String {
    let d = Duration::from_millis(u64::try_from(now_ms.saturating_sub(at_ms)).unwrap_or(0));
    format!(
        "{} ago",
        humantime::format_duration(Duration::from_secs(d.as_secs()))
    )
}

fn in_phrase(now_ms: UnixMs, at_ms: UnixMs) -> String {
    let d = Duration::from_millis(u64::try_from(at_ms.saturating_sub(now_ms)).unwrap_or(0));
    format!(
        "another {}",
        humantime::format_duration(Duration::from_secs(d.as_secs().max(1)))
    )
}

/// CONTRACT §8's `explain --json`, with `policy`, `summary` and `agent` beside the contract's
/// fields.
pub(crate) fn to_json(explanation: &Explanation, facts: &Facts<'_>) -> serde_json::Value {
    serde_json::json!({
        "job_id": explanation.job_id,
        "state": explanation.state,
        "verdict": explanation.verdict.as_str(),
        "reasons": explanation.reasons,
        "runner_name": explanation.runner_name,
        "policy": explanation.policy,
        "summary": explanation.summary,
        "runner_end": explanation.runner_end,
        "rerun": facts.rerun.map(|r| serde_json::json!({
            "state": r.state.as_str(),
            "reason": r.reason,
            "policy": r.policy,
            "detail": r.detail,
        })),
        "agent": {
            "running": facts.agent.is_running(),
            "status_written_at": facts.snapshot.map(|s| s.written_at_ms.to_rfc3339()),
        },
    })
}

/// The report for people.
pub(crate) fn render(explanation: &Explanation) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "job {}: {} ({})\n",
        explanation.job_id,
        explanation.verdict.as_str(),
        explanation.state.as_deref().unwrap_or("not in the journal")
    );
    if let Some(policy) = &explanation.policy {
        let _ = writeln!(out, "policy: {policy}");
    }
    if let Some(runner) = &explanation.runner_name {
        let _ = writeln!(out, "runner: {runner}");
    }
    for r in &explanation.reasons {
        let _ = writeln!(out, "  - [{}] {}", r.code, r.message);
    }
    out
}

/// `status`'s one-line summary of the waiting jobs: identical summaries grouped, in the order
/// they first appear ("2 jobs waiting: no policy matches [gpu, linux]").
pub(crate) fn waiting_summary(waiting: &[Explanation]) -> Option<String> {
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for e in waiting {
        match groups.iter_mut().find(|(s, _)| *s == e.summary) {
            Some((_, n)) => *n += 1,
            None => groups.push((&e.summary, 1)),
        }
    }
    if groups.is_empty() {
        return None;
    }
    Some(
        groups
            .iter()
            .map(|(summary, n)| {
                format!(
                    "{n} job{} waiting: {summary}",
                    if *n == 1 { "" } else { "s" }
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}
