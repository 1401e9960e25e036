//! One test per verdict of [`super::explain`], with the facts that produce it, plus the chain's
//! order where two conditions hold at once.

use std::path::PathBuf;

use rm_journal::{AttemptId, AttemptRecord, AttemptState, IsolationKind, JobRow, WorkspaceKind};

use super::*;
use crate::config::{Policy, Workspace};
use crate::executor::allocate::published::{AllocationMemory, Backoff, PolicyMemory};
use crate::fitness::{Fitness, FitnessProblem};
use crate::status_file::{Github, Held, Host, Offline, Polling, Requests, Snapshot, Webhooks};

const NOW: i64 = 1_700_000_100_000;

fn policy(name: &str, labels: &[&str], max_runners: u32) -> Policy {
    Policy {
        name: name.to_owned(),
        target: "acme".parse().expect("a valid target"),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        runner_group_id: 1,
        max_runners,
        min_runners: 0,
        fleet_max_runners: None,
        workspace: Workspace::Ephemeral,
        docker: None,
        limits: Default::default(),
        memory_required: None,
        disk_max: None,
        disk_required: None,
        shapes: Default::default(),
        env_file: None,
        network_allow: None,
        egress: None,
        cache: false,
        scale_set: None,
        image: None,
    }
}

fn job(id: i64, state: &str, labels: &[&str], first_seen: i64) -> JobRow {
    JobRow {
        job_id: JobId::new(id),
        run_id: 1,
        run_attempt: 1,
        repository: "acme/widgets".to_owned(),
        installation_id: Some(1),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        state: rm_vocab::JobState::parse(state).expect("a job state"),
        conclusion: None,
        runner_name: None,
        runner_id: None,
        workflow_name: None,
        job_name: None,
        source: "webhook".to_owned(),
        first_seen_at_ms: rm_vocab::UnixMs::new(first_seen),
        updated_at_ms: rm_vocab::UnixMs::new(first_seen),
    }
}

fn attempt(policy: &str, state: AttemptState, job_id: Option<i64>, created: i64) -> AttemptRecord {
    let id = AttemptId::generate();
    AttemptRecord {
        runner_name: id.runner_name("h"),
        attempt_id: id,
        policy: policy.to_owned(),
        workspace: WorkspaceKind::Ephemeral,
        runtime_dir: PathBuf::from("/r"),
        state,
        state_changed_at_ms: rm_vocab::UnixMs::new(created),
        outcome: None,
        reason: None,
        detail: None,
        runner_id: None,
        job_id: job_id.map(JobId::new),
        pid: None,
        pid_start_time: None,
        stop_intent: None,
        stop_intent_at_ms: None,
        created_at_ms: rm_vocab::UnixMs::new(created),
        updated_at_ms: rm_vocab::UnixMs::new(created),
        pid_boot_id: None,
        isolation: IsolationKind::None,
        uid: None,
        cgroup: None,
        released_at_ms: None,
        image: None,
        shape: None,
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        version: 1,
        written_at_ms: UnixMs::new(NOW - 1_000),
        pid: 42,
        polling: Polling {
            pace: "idle".to_owned(),
            throttled: false,
            next_poll_at_ms: Some(UnixMs::new(NOW + 10_000)),
            requests_last_hour: Requests {
                charged: 0,
                uncharged: 0,
            },
            rate_limit: None,
            offline: None,
            webhooks: Webhooks {
                intake: true,
                trusted: true,
                reason: "deliveries_trusted".to_owned(),
                evidence_at_ms: None,
            },
            last_failure: None,
            unannounced_jobs: 0,
            unreadable_targets: Vec::new(),
        },
        github: Github {
            reachable: true,
            last_contact_at_ms: Some(UnixMs::new(NOW - 500)),
            held: None,
            content: Vec::new(),
            apps: Vec::new(),
        },
        host: Host { max_runners: 4 },
        relay: None,
        fitness: None,
        allocation: Some(AllocationMemory::default()),
        cache: None,
    }
}

/// The world of one test: policies, journal and snapshot.
struct World {
    policies: Vec<Policy>,
    queued: Vec<JobRow>,
    attempts: Vec<AttemptRecord>,
    snapshot: Option<Snapshot>,
    agent: Liveness,
    host_max: u32,
    /// `host.runner_uids`' size under `isolation = "user"`.
    uid_pool: Option<usize>,
    /// In a fleet: the view, this host being `h`.
    fleet: Option<rm_journal::FleetView>,
    /// The journal's scale-set records.
    scale_sets: Vec<rm_journal::ScaleSetRecord>,
    /// `[host] capacity` and `[[host.device]]`.
    capacity: crate::config::HostCapacity,
    devices: Vec<crate::config::Device>,
}

impl World {
    fn new() -> World {
        World {
            policies: vec![policy("linux", &["self-hosted", "linux"], 2)],
            queued: Vec::new(),
            attempts: Vec::new(),
            snapshot: Some(snapshot()),
            agent: Liveness::Running { pid: 42 },
            host_max: 4,
            uid_pool: None,
            fleet: None,
            scale_sets: Vec::new(),
            capacity: Default::default(),
            devices: Vec::new(),
        }
    }

    fn queue(&mut self, id: i64, labels: &[&str]) -> JobRow {
        let row = job(id, "queued", labels, NOW - 60_000 + id);
        self.queued.push(row.clone());
        row
    }

    fn memory(&mut self) -> &mut PolicyMemory {
        self.snapshot
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .policies
            .entry("linux".to_owned())
            .or_default()
    }

    fn explain(&self, job: &JobRow) -> Explanation {
        explain(job.job_id, Some(job), &self.facts())
    }

    fn facts(&self) -> Facts<'_> {
        Facts {
            now_ms: rm_vocab::UnixMs::new(NOW),
            policies: &self.policies,
            host_max: self.host_max,
            queued: &self.queued,
            attempts: &self.attempts,
            agent: self.agent,
            snapshot: self.snapshot.as_ref(),
            uid_pool: self.uid_pool,
            capacity: self.capacity,
            devices: &self.devices,
            fleet: self
                .fleet
                .as_ref()
                .map(|view| fleet::FleetFacts { host: "h", view }),
            ran: &[],
            rerun: None,
            scale_sets: &self.scale_sets,
        }
    }
}

fn codes(e: &Explanation) -> Vec<&'static str> {
    e.reasons.iter().map(|r| r.code).collect()
}

const LINUX: &[&str] = &["self-hosted", "linux"];

#[test]
fn no_matching_policy_names_the_closest_policy_and_the_labels_that_differ() {
    let mut w = World::new();
    w.policies
        .push(policy("windows", &["self-hosted", "windows"], 2));
    let j = w.queue(1, &["self-hosted", "linux", "gpu"]);
    let e = w.explain(&j);
    assert_eq!(e.verdict, Verdict::NoMatchingPolicy);
    assert_eq!(codes(&e), ["no_policy_matches"]);
    let message = &e.reasons[0].message;
    assert!(message.contains("`linux`"), "{message}");
    assert!(message.contains("lacks [gpu]"), "{message}");
    assert_eq!(e.summary, "no policy matches [gpu, linux, self-hosted]");
    assert_eq!(e.policy, None);

    // Another target: named as what differs.
    let mut other = job(2, "queued", LINUX, NOW);
    other.repository = "other/widgets".to_owned();
    let e = explain(JobId::new(2), Some(&other), &w.facts());
    assert_eq!(e.verdict, Verdict::NoMatchingPolicy);
    assert!(
        e.reasons[0]
            .message
            .contains("serves acme, not other/widgets"),
        "{:?}",
        e.reasons
    );
}

#[test]
fn unresolvable_labels_and_overlapping_policies_match_no_single_policy() {
    let mut w = World::new();
    w.policies
        .push(policy("also-linux", &["self-hosted", "linux", "x64"], 2));
    let both = w.queue(1, LINUX);
    let expr = w.queue(2, &["self-hosted", "${{ matrix.os }}"]);
    let e = w.explain(&both);
    assert_eq!(
        (e.verdict, codes(&e)[0]),
        (Verdict::NoMatchingPolicy, "overlapping_policies")
    );
    let e = w.explain(&expr);
    assert_eq!(
        (e.verdict, codes(&e)[0]),
        (Verdict::NoMatchingPolicy, "unresolvable_label")
    );
}

#[test]
fn at_capacity_names_the_policy_ceiling_and_its_holders() {
    // `max_runners` caps the policy's live runners, busy ones included: one is starting for the
    // oldest job and one is busy, so the second job waits at the policy's ceiling of two.
    let mut w = World::new();
    w.policies[0].max_runners = 2;
    let starting = attempt("linux", AttemptState::Starting, None, NOW - 5_000);
    let busy = attempt("linux", AttemptState::Busy, Some(10), NOW - 9_000);
    w.attempts.extend([starting.clone(), busy]);
    let first = w.queue(1, LINUX);
    let second = w.queue(2, LINUX);
    assert_eq!(w.explain(&first).verdict, Verdict::Launching);
    let e = w.explain(&second);
    assert_eq!(e.verdict, Verdict::AtCapacity);
    assert_eq!(codes(&e), ["policy_capacity"]);
    assert_eq!(e.policy.as_deref(), Some("linux"));
    assert!(
        e.reasons[0].message.contains(&starting.runner_name),
        "{e:?}"
    );
    assert!(e.reasons[0].message.contains("job 10"), "{e:?}");
    // A busy runner alone holds a ceiling of one: two GPUs mean two runners, whatever they do.
    let mut w = World::new();
    w.policies[0].max_runners = 1;
    w.attempts
        .push(attempt("linux", AttemptState::Busy, Some(10), NOW - 9_000));
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::AtCapacity, vec!["policy_capacity"])
    );
}

#[test]
fn at_capacity_names_the_host_ceiling_when_other_policies_hold_it() {
    let mut w = World::new();
    w.policies[0].max_runners = 8;
    w.host_max = 1;
    let other = attempt("gpu", AttemptState::Busy, Some(10), NOW - 5_000);
    w.attempts.push(other.clone());
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::AtCapacity, vec!["host_capacity"])
    );
    assert!(e.reasons[0].message.contains(&other.runner_name), "{e:?}");
    assert_eq!(e.summary, "at the host's max_runners (1)");
}

#[test]
fn the_oldest_jobs_are_paired_with_the_runners_and_the_rest_wait_at_the_ceiling() {
    // Two runners of a two-runner policy, one idle, one starting; three queued jobs.
    let mut w = World::new();
    let idle = attempt("linux", AttemptState::Idle, None, NOW - 9_000);
    let starting = attempt("linux", AttemptState::Starting, None, NOW - 8_000);
    w.attempts.extend([starting.clone(), idle.clone()]);
    let first = w.queue(1, LINUX);
    let second = w.queue(2, LINUX);
    let third = w.queue(3, LINUX);
    let e = w.explain(&first);
    assert_eq!(e.verdict, Verdict::WaitingForGithub);
    assert_eq!(codes(&e), ["runner_idle"]);
    assert_eq!(e.runner_name, Some(idle.runner_name));
    let e = w.explain(&second);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::Launching, vec!["runner_starting"])
    );
    assert_eq!(e.runner_name, Some(starting.runner_name));
    assert_eq!(w.explain(&third).verdict, Verdict::AtCapacity);
}

#[test]
fn launching_when_nothing_holds_the_job_back() {
    let mut w = World::new();
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::Launching, vec!["allocating"])
    );
    let allocated = attempt("linux", AttemptState::Allocated, None, NOW - 100);
    w.attempts.push(allocated.clone());
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::Launching, vec!["registering"])
    );
    assert_eq!(e.runner_name, Some(allocated.runner_name));
}

#[test]
fn no_free_uid_when_every_uid_of_the_pool_is_held_and_the_ceilings_come_first() {
    // Two uids, both held by attempts not cleaned yet (one still cleaning up).
    let mut w = World::new();
    w.policies[0].max_runners = 8;
    w.uid_pool = Some(2);
    let mut busy = attempt("gpu", AttemptState::Busy, Some(10), NOW - 9_000);
    busy.uid = Some(2_000_000);
    let mut ended = attempt("gpu", AttemptState::Finished, Some(11), NOW - 9_000);
    ended.uid = Some(2_000_001);
    w.attempts.extend([busy, ended]);
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::AtCapacity, vec!["uid_pool"])
    );
    assert!(e.reasons[0].message.contains("(2)"), "{e:?}");
    // A third uid: nothing holds it back.
    w.uid_pool = Some(3);
    assert_eq!(
        (w.explain(&j).verdict, codes(&w.explain(&j))),
        (Verdict::Launching, vec!["allocating"])
    );
    // A job beyond the policy's ceiling waits for the ceiling, not for a uid.
    w.uid_pool = Some(2);
    w.policies[0].max_runners = 1;
    w.attempts
        .push(attempt("linux", AttemptState::Busy, Some(12), NOW - 9_000));
    assert_eq!(codes(&w.explain(&j)), ["policy_capacity"]);
}

/// A running agent's published plan is what a waiting job is told, even where the journal
/// alone would say otherwise (a runner ended after the pass): `explain` renders the plan, it
/// does not decide again. Stopped, the same agent's plan is not current, and the chain comes
/// from a plan made from the journal (the control).
#[test]
fn a_running_agent_s_published_plan_is_rendered_not_decided_again() {
    let mut w = World::new();
    w.policies[0].max_runners = 2;
    let j = w.queue(1, LINUX);
    let published = |held: Vec<plan::Held>, start: u32, room: u32| plan::Published {
        at_ms: rm_vocab::UnixMs::new(NOW - 2_000),
        policies: [(
            "linux".to_owned(),
            plan::PublishedPolicy {
                demand: 1,
                start,
                room,
                held,
                waits: Vec::new(),
            },
        )]
        .into(),
    };
    let at_max = plan::Held::AtCapacity {
        limit: CeilingKind::MaxRunners,
        ceiling: 2,
    };
    w.snapshot
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .plan = Some(published(vec![at_max], 0, 0));
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::AtCapacity, vec!["policy_capacity"])
    );
    // The control: the agent stopped; its plan is not current, the journal's is made.
    w.agent = Liveness::Stopped { last_seen: None };
    assert_eq!(codes(&w.explain(&j))[0], "allocating");
    w.agent = Liveness::Running { pid: 42 };
    // The plan found the uid pool empty while starting one of two: the job it did not start
    // waits for a uid; a plan that held nothing back starts it at its next pass.
    w.snapshot
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .plan = Some(published(vec![plan::Held::NoFreeUid], 0, 1));
    assert_eq!(codes(&w.explain(&j)), ["uid_pool"]);
    w.snapshot
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .plan = Some(published(Vec::new(), 0, 1));
    assert_eq!(codes(&w.explain(&j)), ["allocating"]);
    // The host unfit in the plan is said even when the snapshot's fitness has no detail.
    w.snapshot
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .plan = Some(published(vec![plan::Held::Unfit], 0, 1));
    assert_eq!(w.explain(&j).verdict, Verdict::HostUnfit);
}

#[test]
fn launch_backoff_says_until_when_and_the_last_failure() {
    let mut w = World::new();
    *w.memory() = PolicyMemory {
        fence_ms: None,
        backoff: Some(Backoff {
            until_ms: rm_vocab::UnixMs::new(NOW + 20_000),
            failures: 3,
            last_failure: Some("process_exited_unexpectedly: exit status 1".to_owned()),
        }),
    };
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::LaunchBackoff, vec!["launch_backoff"])
    );
    let message = &e.reasons[0].message;
    assert!(message.contains("3 failed launch"), "{message}");
    assert!(message.contains("another 20s"), "{message}");
    assert!(message.contains("process_exited_unexpectedly"), "{message}");
    // A back-off that ran out holds nothing (the allocator's `backing_off`).
    w.memory().backoff.as_mut().unwrap().until_ms = rm_vocab::UnixMs::new(NOW);
    assert_eq!(w.explain(&j).verdict, Verdict::Launching);
}

#[test]
fn rate_limited_while_the_budget_holds_a_registration() {
    let mut w = World::new();
    let limit = "rm's pacing (installation 1): the content limit (80 a minute, 500 an hour), \
                 learned from GitHub's secondary limit at 2024-01-01T00:00:00Z";
    w.snapshot.as_mut().unwrap().github.held = Some(Held {
        kind: "secondary".to_owned(),
        until_ms: UnixMs::new(NOW + 8_000),
        limit: Some(limit.to_owned()),
    });
    w.attempts
        .push(attempt("linux", AttemptState::Allocated, None, NOW - 100));
    let covered = w.queue(1, LINUX);
    let uncovered = w.queue(2, LINUX);
    for j in [&covered, &uncovered] {
        let e = w.explain(j);
        assert_eq!(
            (e.verdict, codes(&e)[0]),
            (Verdict::RateLimited, "rate_limited")
        );
        assert!(e.reasons[0].message.contains("secondary"), "{e:?}");
        // Which limit holds, as the budget said it.
        assert!(e.reasons[0].message.contains(limit), "{e:?}");
    }
    // A limit that has lifted holds nothing.
    w.snapshot
        .as_mut()
        .unwrap()
        .github
        .held
        .as_mut()
        .unwrap()
        .until_ms = UnixMs::new(NOW - 1);
    assert_eq!(w.explain(&covered).verdict, Verdict::Launching);
}

#[test]
fn github_unreachable_comes_before_the_back_off_it_causes() {
    let mut w = World::new();
    w.snapshot.as_mut().unwrap().github.reachable = false;
    w.memory().backoff = Some(Backoff {
        until_ms: rm_vocab::UnixMs::new(NOW + 5_000),
        failures: 1,
        last_failure: Some("jit_request_failed: GitHub unreachable".to_owned()),
    });
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(e.verdict, Verdict::GithubUnreachable);
    assert_eq!(codes(&e), ["github_unreachable", "launch_backoff"]);
    // The poller's offline state says it too.
    let mut w = World::new();
    w.snapshot.as_mut().unwrap().polling.offline = Some(Offline {
        description: "GitHub has been unreachable for 2m".to_owned(),
        since_ms: UnixMs::new(NOW - 120_000),
        outlasted_the_queue: false,
    });
    let j = w.queue(1, LINUX);
    assert_eq!(w.explain(&j).verdict, Verdict::GithubUnreachable);
}

#[test]
fn host_unfit_names_the_fitness_gates_problems() {
    let mut w = World::new();
    w.snapshot.as_mut().unwrap().fitness = Some(Fitness {
        checked_at_ms: NOW - 2_000,
        problems: vec![FitnessProblem {
            code: "disk_space".to_owned(),
            message: "The runner root has 1 GiB free, under 10 GiB.".to_owned(),
        }],
    });
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::HostUnfit, vec!["host_unfit"])
    );
    assert!(e.reasons[0].message.contains("1 GiB free"), "{e:?}");
    assert_eq!(e.summary, "the host is unfit (disk_space)");
    // The gate stops the allocation pass before any back-off is looked at.
    w.memory().backoff = Some(Backoff {
        until_ms: rm_vocab::UnixMs::new(NOW + 5_000),
        failures: 1,
        last_failure: None,
    });
    assert_eq!(codes(&w.explain(&j)), ["host_unfit", "launch_backoff"]);
    w.memory().backoff = None;
    // A fit host (no problems) holds nothing.
    w.snapshot
        .as_mut()
        .unwrap()
        .fitness
        .as_mut()
        .unwrap()
        .problems
        .clear();
    assert_eq!(w.explain(&j).verdict, Verdict::Launching);
}

#[test]
fn not_seen_when_the_journal_has_no_such_job() {
    let w = World::new();
    let e = explain(JobId::new(77), None, &w.facts());
    assert_eq!((e.verdict, e.state.clone()), (Verdict::NotSeen, None));
    assert_eq!(codes(&e), ["not_seen"]);
    assert!(e.reasons[0].message.contains("next poll"), "{e:?}");
}

#[test]
fn waiting_for_github_when_fenced_held_for_approval_or_a_runner_took_an_unnamed_job() {
    let mut w = World::new();
    let old = w.queue(1, LINUX);
    w.memory().fence_ms = Some(old.first_seen_at_ms.saturating_add_ms(1));
    let e = w.explain(&old);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::WaitingForGithub, vec!["fenced"])
    );
    let e = w.explain(&job(2, "waiting", LINUX, NOW));
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::WaitingForGithub, vec!["environment_approval"])
    );
    let mut w = World::new();
    let unnamed = attempt("linux", AttemptState::Busy, None, NOW - 100);
    w.attempts.push(unnamed.clone());
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::WaitingForGithub, vec!["unnamed_busy_runner"])
    );
    assert_eq!(e.runner_name, Some(unnamed.runner_name));
}

#[test]
fn running_and_done_name_the_runner() {
    let w = World::new();
    let mut running = job(1, "in_progress", LINUX, NOW);
    running.runner_name = Some("rm-h-0123456789ab".to_owned());
    let e = w.explain(&running);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::Running, vec!["in_progress"])
    );
    assert_eq!(e.runner_name.as_deref(), Some("rm-h-0123456789ab"));
    let mut done = running.clone();
    done.state = rm_vocab::JobState::Completed;
    done.conclusion = Some("success".to_owned());
    let e = w.explain(&done);
    assert_eq!((e.verdict, codes(&e)), (Verdict::Done, vec!["completed"]));
    assert!(e.reasons[0].message.contains("success"), "{e:?}");
}

#[test]
fn a_stopped_agent_is_said_with_the_age_of_what_is_known() {
    let mut w = World::new();
    w.agent = Liveness::Stopped {
        last_seen: Some(std::time::Duration::from_secs(1)),
    };
    w.snapshot.as_mut().unwrap().written_at_ms = UnixMs::new(NOW - 90_000);
    let j = w.queue(1, LINUX);
    let e = w.explain(&j);
    assert_eq!(e.verdict, Verdict::Launching);
    assert_eq!(codes(&e), ["allocating", "agent_stopped"]);
    assert!(e.reasons[1].message.contains("1m 30s ago"), "{e:?}");
    w.snapshot = None;
    let e = w.explain(&j);
    assert!(e.reasons[1].message.contains("not known"), "{e:?}");
}

#[test]
fn the_json_has_the_contract_fields() {
    let mut w = World::new();
    let j = w.queue(1, LINUX);
    let facts = w.facts();
    let value = to_json(&explain(JobId::new(1), Some(&j), &facts), &facts);
    for key in ["job_id", "state", "verdict", "reasons", "runner_name"] {
        assert!(value.get(key).is_some(), "{key} in {value}");
    }
    assert_eq!(value["verdict"], "launching");
    assert_eq!(value["reasons"][0]["code"], "allocating");
    assert!(value["reasons"][0]["message"].is_string());
}

#[test]
fn status_groups_the_waiting_jobs_by_summary() {
    let mut w = World::new();
    let a = w.queue(1, &["gpu", "linux"]);
    let b = w.queue(2, &["linux", "gpu"]);
    let c = w.queue(3, LINUX);
    let all: Vec<Explanation> = [a, b, c].iter().map(|j| w.explain(j)).collect();
    assert_eq!(
        waiting_summary(&all).unwrap(),
        "2 jobs waiting: no policy matches [gpu, linux]; 1 job waiting: a runner of linux is \
         being allocated"
    );
    assert_eq!(waiting_summary(&[]), None);
    // status explains them all at once, with the same answers.
    assert_eq!(explain_queued(&w.facts()), all);
}

/// A fleet host in a [`rm_journal::FleetView`], renewed 2 s ago, with its claims (by job id,
/// with the runner it started for each).
fn fleet_host(name: &str, live: bool, claims: &[(i64, Option<&str>)]) -> rm_journal::HostView {
    rm_journal::HostView {
        host: name.to_owned(),
        labels: Vec::new(),
        policies: vec!["linux".to_owned()],
        registered_at_ms: rm_vocab::UnixMs::new(NOW - 600_000),
        renewed_at_ms: rm_vocab::UnixMs::new(NOW - 2_000),
        expires_at_ms: rm_vocab::UnixMs::new(if live { NOW + 28_000 } else { NOW - 1 }),
        live,
        claims: claims
            .iter()
            .map(|(job, runner)| rm_journal::ClaimView {
                job_id: JobId::new(*job),
                policy: "linux".to_owned(),
                runner_name: runner.map(str::to_owned),
                claimed_at_ms: rm_vocab::UnixMs::new(NOW - 5_000),
                job_state: rm_vocab::JobState::Queued,
            })
            .collect(),
    }
}

fn fleet_of(hosts: Vec<rm_journal::HostView>) -> rm_journal::FleetView {
    rm_journal::FleetView {
        now_ms: rm_vocab::UnixMs::new(NOW),
        hosts,
        leaders: Vec::new(),
    }
}

#[test]
fn in_a_fleet_a_job_another_live_host_claimed_is_that_host_s_and_names_its_runner() {
    let mut w = World::new();
    let job = w.queue(7, LINUX);
    w.fleet = Some(fleet_of(vec![
        fleet_host("h", true, &[]),
        fleet_host("b", true, &[(7, Some("rm-b-0123456789ab"))]),
    ]));
    let e = w.explain(&job);
    assert_eq!(e.verdict, Verdict::Launching);
    assert_eq!(codes(&e), vec!["claimed_by_host"]);
    assert_eq!(e.runner_name.as_deref(), Some("rm-b-0123456789ab"));
    assert_eq!(e.policy.as_deref(), Some("linux"));
    assert!(e.reasons[0].message.contains("Host b claimed"), "{e:?}");
    assert!(e.reasons[0].message.contains("rm-agent explain 7"), "{e:?}");
    // Not yet said which runner: still that host's, on its way.
    w.fleet = Some(fleet_of(vec![fleet_host("b", true, &[(7, None)])]));
    let e = w.explain(&job);
    assert_eq!(
        (e.verdict, e.runner_name.as_deref()),
        (Verdict::Launching, None)
    );
    assert!(e.reasons[0].message.contains("allocating"), "{e:?}");
}

#[test]
fn in_a_fleet_a_job_claimed_here_or_by_nobody_gets_this_host_s_chain_and_says_which() {
    let mut w = World::new();
    let job = w.queue(7, LINUX);
    w.attempts
        .push(attempt("linux", AttemptState::Idle, None, NOW - 10_000));
    w.fleet = Some(fleet_of(vec![fleet_host("h", true, &[(7, None)])]));
    let e = w.explain(&job);
    assert_eq!(e.verdict, Verdict::WaitingForGithub);
    assert_eq!(codes(&e), vec!["runner_idle", "claimed_here"]);
    // A claim under a lapsed lease counts for nobody: the job is unclaimed, any live host
    // may take it.
    w.fleet = Some(fleet_of(vec![
        fleet_host("h", true, &[]),
        fleet_host("b", false, &[(7, Some("rm-b-0123456789ab"))]),
        fleet_host("c", true, &[]),
    ]));
    let e = w.explain(&job);
    assert_eq!(codes(&e), vec!["runner_idle", "unclaimed"]);
    assert!(e.reasons[1].message.contains("live hosts: h, c"), "{e:?}");
    // Without a fleet, neither.
    w.fleet = None;
    assert_eq!(codes(&w.explain(&job)), vec!["runner_idle"]);
}

#[test]
fn in_a_fleet_the_jobs_other_hosts_claimed_leave_this_host_s_queue() {
    let view = fleet_of(vec![
        fleet_host("h", true, &[(1, None)]),
        fleet_host("b", true, &[(2, None), (3, None)]),
        fleet_host("c", false, &[(4, None)]),
    ]);
    let elsewhere = fleet::claimed_elsewhere(fleet::FleetFacts {
        host: "h",
        view: &view,
    });
    assert_eq!(
        elsewhere,
        [JobId::new(2), JobId::new(3)].into_iter().collect()
    );
    // The queue places count this host's jobs only: job 5, behind 2 and 3 in the fleet's
    // queue, is first in this host's; the others' jobs are still explained (theirs).
    let mut w = World::new();
    for id in [2, 3, 5] {
        w.queue(id, LINUX);
    }
    w.fleet = Some(view);
    let facts = w.facts();
    let queue = Queue::of(&facts, None);
    assert_eq!(queue.places.get(&JobId::new(5)), Some(&(0, 1)));
    let waiting = explain_queued(&facts);
    assert_eq!(
        waiting.iter().map(|e| e.verdict).collect::<Vec<_>>(),
        vec![Verdict::Launching, Verdict::Launching, Verdict::Launching]
    );
    assert_eq!(codes(&waiting[0]), vec!["claimed_by_host"]);
}

#[test]
fn a_scale_set_s_job_names_its_scale_set_and_policy() {
    let mut w = World::new();
    let mut big = policy("big", &["whatever"], 4);
    big.scale_set = Some(crate::config::scale_sets::ScaleSet {
        name: "acme-big".to_owned(),
        policy: "big".to_owned(),
        labels: vec!["acme-big".to_owned(), "gpu".to_owned()],
        runner_group_id: 1,
        enterprise: None,
    });
    w.policies.push(big);
    let j = w.queue(1, &["ACME-BIG", "gpu"]);
    let e = w.explain(&j);
    assert_eq!(e.verdict, Verdict::ScaleSet);
    assert_eq!(e.verdict.as_str(), "scale_set");
    assert_eq!(codes(&e)[0], "scale_set");
    assert!(
        e.reasons[0].message.contains("scale set `acme-big`"),
        "{:?}",
        e.reasons
    );
    assert!(
        e.reasons[0].message.contains("policy `big`"),
        "{:?}",
        e.reasons
    );
    assert_eq!(e.summary, "served by scale set acme-big");
    // A label the scale set lacks: not its job, and no policy matches.
    let other = w.queue(2, &["acme-big", "windows"]);
    assert_eq!(w.explain(&other).verdict, Verdict::NoMatchingPolicy);
}

/// A scale set whose listener backs off says so after its verdict: why the job waits.
#[test]
fn a_scale_set_s_job_says_its_listener_backs_off() {
    let mut w = World::new();
    let mut big = policy("big", &["whatever"], 4);
    big.scale_set = Some(crate::config::scale_sets::ScaleSet {
        name: "acme-big".to_owned(),
        policy: "big".to_owned(),
        labels: vec!["acme-big".to_owned()],
        runner_group_id: 1,
        enterprise: None,
    });
    w.policies.push(big);
    let j = w.queue(1, &["acme-big"]);
    let record = |note: Option<&str>| rm_journal::ScaleSetRecord {
        name: "acme-big".to_owned(),
        scale_set_id: Some(7),
        session_id: None,
        last_message_id: 0,
        last_message_at: None,
        statistics: None,
        statistics_at: None,
        messages: 0,
        generation: 0,
        note: note.map(str::to_owned),
        note_at: note.map(|_| UnixMs::new(NOW - 5_000)),
    };
    // Polling: nothing to add.
    w.scale_sets = vec![record(None)];
    assert_eq!(codes(&w.explain(&j))[..1], ["scale_set"]);
    assert!(!codes(&w.explain(&j)).contains(&"scale_set_listener"));
    let note = "backing off after 1 failure(s): the Actions service answered 418 on poll:  \
                teapot (next try at 2023-11-14T22:15:00.000Z)";
    w.scale_sets = vec![record(Some(note))];
    let e = w.explain(&j);
    assert_eq!(e.verdict, Verdict::ScaleSet);
    assert_eq!(codes(&e)[..2], ["scale_set", "scale_set_listener"]);
    assert!(
        e.reasons[1].message.contains("scale set `acme-big`"),
        "{:?}",
        e.reasons
    );
    assert!(e.reasons[1].message.contains(note), "{:?}", e.reasons);
    // Another scale set's note is not this one's.
    w.scale_sets = vec![rm_journal::ScaleSetRecord {
        name: "acme-small".to_owned(),
        ..record(Some(note))
    }];
    assert!(!codes(&w.explain(&j)).contains(&"scale_set_listener"));
}

/// Shapes (issue 42): a job whose shape its policy refuses says why and takes no place; a job
/// packing holds back says what it waits for, from a running agent's plan or one made here.
#[test]
fn a_shaped_job_says_why_its_shape_is_refused_or_what_it_waits_for() {
    use crate::config::{Device, HostCapacity, PolicyShapes, ShapeBounds};
    use crate::executor::plan::pack::{Resource, Wait};
    let mut w = World::new();
    w.policies[0].shapes = PolicyShapes {
        cpu_millis: None,
        max: Some(ShapeBounds {
            cpu_millis: Some(4000),
            ..ShapeBounds::default()
        }),
        named: Vec::new(),
    };
    w.capacity = HostCapacity {
        cpu_millis: Some(4000),
        memory: None,
        disk: None,
    };
    // Over shape_max, and an unreadable label: refused, with the policy's bound in the text.
    let over = w.queue(1, &["self-hosted", "linux", "rm-cpu=8"]);
    let e = w.explain(&over);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::ShapeRefused, vec!["shape_refused"])
    );
    assert!(
        e.reasons[0].message.contains("shape_max"),
        "{:?}",
        e.reasons
    );
    let odd = w.queue(2, &["self-hosted", "linux", "rm-colour=red"]);
    assert_eq!(codes(&w.explain(&odd)), ["shape_refused"]);
    // A device group this host lacks: the plan made here says it exceeds the host.
    w.agent = Liveness::Stopped { last_seen: None };
    w.queued.clear();
    let gpu = w.queue(3, &["self-hosted", "linux", "rm-gpu=1"]);
    let e = w.explain(&gpu);
    assert_eq!(
        (e.verdict, codes(&e)[0]),
        (Verdict::ShapeRefused, "shape_exceeds_host")
    );
    // With one GPU on the host, held by a running runner: the running agent's plan says the
    // job waits for a device.
    w.devices = vec![Device {
        group: "gpu".to_owned(),
        nodes: vec!["/dev/nvidia0".into()],
        shared_nodes: Vec::new(),
    }];
    w.agent = Liveness::Running { pid: 42 };
    w.snapshot
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .plan = Some(plan::Published {
        at_ms: rm_vocab::UnixMs::new(NOW - 2_000),
        policies: [(
            "linux".to_owned(),
            plan::PublishedPolicy {
                demand: 1,
                start: 0,
                room: 1,
                held: vec![plan::Held::WaitingForRoom {
                    resource: Resource::Device("gpu".to_owned()),
                }],
                waits: vec![plan::JobWait {
                    job_id: gpu.job_id,
                    wait: Wait::Room {
                        resource: Resource::Device("gpu".to_owned()),
                    },
                }],
            },
        )]
        .into(),
    });
    let e = w.explain(&gpu);
    assert_eq!(
        (e.verdict, codes(&e)),
        (Verdict::AtCapacity, vec!["waiting_for_device"])
    );
}
