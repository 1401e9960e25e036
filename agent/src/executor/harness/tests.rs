//! The lifecycle rules the executor owns, each through the harness: the real executor, poller
//! and journal against the fake GitHub, with fake processes and a manual clock.

use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptState};

use rm_runner::process::StopSignal;

use super::*;

const LABELS: &[&str] = &["self-hosted"];

/// Passes run after a fence to show that it holds: two poll intervals' worth.
const PASSES_AFTER_FENCE: usize = 2 * 30 + 5;

async fn steps(h: &mut Harness, n: usize) {
    for _ in 0..n {
        h.step().await;
    }
}

/// Jobs that take `secs` of manual time.
fn jobs_take(h: &Harness, secs: u64) {
    h.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: secs * 1_000,
        ..RunnerBehavior::default()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_job_matrix_on_a_4_runner_host_runs_4_then_4() {
    let mut h = Harness::new(Options::default()).await;
    jobs_take(&h, 20);
    let jobs: Vec<u64> = (0..8)
        .map(|i| h.queue(&format!("matrix ({i})"), LABELS))
        .collect();
    let mut most = 0;
    h.until(
        "every job completed",
        |h| {
            let live = h.live();
            assert!(live <= 4, "{live} live runners on a host of 4");
            most = most.max(live);
        },
        |h| jobs.iter().all(|j| h.completed(*j)),
    )
    .await;
    assert_eq!(most, 4, "the host's 4 runners were used at once");
    h.until("every attempt cleaned", |_| {}, Harness::all_cleaned)
        .await;
    let attempts = h.attempts();
    assert_eq!(attempts.len(), 8, "one runner per job");
    // GitHub's side: each job ran on a different one of our runners.
    let mut ran_on: Vec<String> = jobs
        .iter()
        .filter_map(|j| h.fake.job(*j)?.runner_name)
        .collect();
    ran_on.sort_unstable();
    ran_on.dedup();
    assert_eq!(ran_on.len(), 8, "each runner took a different job");
    assert!(
        ran_on
            .iter()
            .all(|name| attempts.iter().any(|a| &a.runner_name == name)),
        "{ran_on:?}"
    );
    assert!(
        attempts
            .iter()
            .all(|a| a.outcome == Some(AttemptOutcome::CompletedJob)),
        "{attempts:#?}"
    );
    assert!(h.runtimes().is_empty(), "{:?}", h.runtimes());
    assert!(h.our_registrations().is_empty());
    assert!(h.processes.alive().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_policies_share_the_host_ceiling() {
    let mut h = Harness::new(Options {
        max_runners: 3,
        policies: vec![
            policy_on("acme", "org-a", &["self-hosted", "a"], 3),
            policy_on(REPO, "repo-b", &["self-hosted", "b"], 3),
        ],
        ..Options::default()
    })
    .await;
    jobs_take(&h, 20);
    let mut jobs = Vec::new();
    for i in 0..4 {
        jobs.push(h.queue(&format!("a{i}"), &["self-hosted", "a"]));
        jobs.push(h.queue(&format!("b{i}"), &["self-hosted", "b"]));
    }
    let mut most = 0;
    h.until(
        "every job completed",
        |h| {
            let live = h.live();
            assert!(live <= 3, "{live} live runners on a host of 3");
            most = most.max(live);
        },
        |h| jobs.iter().all(|j| h.completed(*j)),
    )
    .await;
    assert_eq!(most, 3, "the host's 3 runners were used at once");
    let attempts = h.attempts();
    for policy in ["org-a", "repo-b"] {
        assert_eq!(
            attempts.iter().filter(|a| a.policy == policy).count(),
            4,
            "{policy} ran its 4 jobs"
        );
    }
    let jit_at = |path: &str| h.fake.requests().iter().filter(|r| r.path == path).count();
    assert_eq!(
        jit_at("/repos/acme/widgets/actions/runners/generate-jitconfig"),
        4,
        "the repository policy registers at the repository"
    );
    assert_eq!(
        jit_at("/orgs/acme/actions/runners/generate-jitconfig"),
        4,
        "the organization policy registers at the organization"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_gets_no_job_is_stopped_at_its_idle_timeout_and_not_replaced() {
    let mut h = Harness::new(Options::default()).await;
    // Demand for a job GitHub never hands out (the fake does not know it): the runner
    // registers and waits, as a real JIT runner does, until the idle timeout stops it.
    h.deliver_queued(777_001, LABELS).await;
    h.until(
        "the idle runner concluded",
        |_| {},
        |h| {
            h.attempts().iter().any(|a| {
                a.outcome == Some(AttemptOutcome::IdleExit) && a.state == AttemptState::Cleaned
            })
        },
    )
    .await;
    let idle = h
        .attempts()
        .into_iter()
        .find(|a| a.outcome == Some(AttemptOutcome::IdleExit))
        .expect("the idle attempt");
    assert_eq!(idle.stop_intent.map(|i| i.as_str()), Some("idle_timeout"));
    let pid = h.backend.pid_of(&idle.runner_name).expect("its process");
    assert_eq!(
        h.processes.signals(pid),
        [StopSignal::Term],
        "stopped, gently"
    );
    // The job it could not get is not demand again: passes that each allocate (two poll
    // intervals of them) start nothing for it, and a control job queued after the conclusion
    // still gets a runner.
    steps(&mut h, PASSES_AFTER_FENCE).await;
    assert_eq!(h.attempts().len(), 1, "replaced: {:#?}", h.attempts());
    let control = h.queue("control", LABELS);
    h.until(
        "the control job served",
        |_| {},
        |h| h.completed(control) && h.all_cleaned(),
    )
    .await;
    steps(&mut h, 10).await;
    let outcomes: Vec<_> = h.attempts().iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Some(AttemptOutcome::CompletedJob),
            Some(AttemptOutcome::IdleExit)
        ],
        "newest first: the control's runner, then the idle one, and no replacement"
    );
    assert!(h.our_registrations().is_empty(), "registration left");
    assert!(h.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_never_registers_is_stopped_deregistered_and_not_replaced() {
    let mut h = Harness::new(Options::default()).await;
    // A package whose listener never connects to GitHub.
    h.backend.set_program(Program::Silent);
    let _job = h.queue("build", LABELS);
    let timed_out = |a: &AttemptRecord| {
        a.reason.as_deref() == Some("terminated_after_registration_timeout")
            && a.state == AttemptState::Cleaned
    };
    h.until(
        "the unregistered runner concluded",
        |_| {},
        |h| h.attempts().iter().any(timed_out),
    )
    .await;
    let first = h
        .attempts()
        .into_iter()
        .find(timed_out)
        .expect("the timed-out attempt");
    assert_eq!(
        first.stop_intent.map(|i| i.as_str()),
        Some("registration_timeout")
    );
    let pid = h.backend.pid_of(&first.runner_name).expect("its process");
    assert_eq!(h.processes.signals(pid), [StopSignal::Term]);
    assert!(
        h.our_registrations().is_empty(),
        "its JIT registration was removed"
    );
    steps(&mut h, PASSES_AFTER_FENCE).await;
    assert_eq!(h.attempts().len(), 1, "replaced: {:#?}", h.attempts());
    // Not replaced for the job it could not register for: a control job queued after the
    // conclusion gets a runner (which times out the same way: its launch proves an allocation
    // pass ran since the fence and passed over the first job).
    let _control = h.queue("control", LABELS);
    h.until(
        "the control job's runner concluded",
        |_| {},
        |h| h.attempts().iter().filter(|a| timed_out(a)).count() >= 2 && h.all_cleaned(),
    )
    .await;
    steps(&mut h, 10).await;
    let attempts = h.attempts();
    assert_eq!(
        attempts.len(),
        2,
        "the runner was replaced: {:?}",
        attempts.iter().map(|a| &a.reason).collect::<Vec<_>>()
    );
    assert!(h.our_registrations().is_empty(), "registration left");
    assert!(h.runtimes().is_empty());
    assert!(
        h.processes.alive().is_empty(),
        "a process outlived its runner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_launch_backs_its_policy_off_doubling_and_a_runner_resets_it() {
    let mut h = Harness::new(Options::default()).await;
    h.backend.refuse_start(true);
    let job = h.queue("build", LABELS);
    let failed = |h: &Harness| {
        h.attempts()
            .iter()
            .filter(|a| a.reason.as_deref() == Some("process_start_failed"))
            .count()
    };
    let mut at = Vec::new();
    for n in 1..=3 {
        h.until("one more failed launch", |_| {}, |h| failed(h) >= n)
            .await;
        at.push(h.clock.now());
        assert_eq!(h.attempts().len(), n, "one attempt at a time");
    }
    let waits: Vec<u64> = at
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs())
        .collect();
    let backoff = super::super::allocate::LAUNCH_BACKOFF.as_secs();
    assert!(waits[0] >= backoff, "waited {waits:?}");
    assert!(waits[1] >= 2 * backoff, "the back-off doubles: {waits:?}");
    // Each failed start's JIT registration is removed by its cleanup (supervision, the one
    // place our registrations are removed), within passes of its conclusion: long before the
    // inventory reconciliation could. Cleanup is an effect beside the loop, so on a loaded
    // machine it may land a few steps later (3 seen in CI); the bound is the inventory's
    // interval, what the rule is about, not a count of passes.
    let steps = h
        .until(
            "each failed start's JIT registration removed",
            |_| {},
            |h| h.our_registrations().is_empty(),
        )
        .await;
    let inventory_steps = super::super::INVENTORY_INTERVAL.as_secs() / TICK.as_secs();
    assert!(
        (steps as u64) < inventory_steps / 10,
        "removed {steps} steps after the conclusion"
    );
    // The package is fixed: the next launch (after the back-off) runs the job.
    h.backend.refuse_start(false);
    h.until(
        "the job served",
        |_| {},
        |h| h.completed(job) && h.all_cleaned(),
    )
    .await;
    assert_eq!(h.attempts()[0].outcome, Some(AttemptOutcome::CompletedJob));
    assert!(h.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_recovery_adopts_a_live_runner_and_concludes_a_dead_one() {
    let mut h = Harness::new(Options::default()).await;
    jobs_take(&h, 120);
    let jobs = [h.queue("live", LABELS), h.queue("dies", LABELS)];
    h.until(
        "both runners busy",
        |_| {},
        |h| {
            let attempts = h.attempts();
            attempts.len() == 2 && attempts.iter().all(|a| a.state == AttemptState::Busy)
        },
    )
    .await;
    // The agent stops (its executor is no longer driven), and while it is down one runner
    // dies in its job.
    let attempts = h.attempts();
    let (live, dead) = (&attempts[0], &attempts[1]);
    let live_pid = h.backend.pid_of(&live.runner_name).expect("a process");
    let dead_pid = h.backend.pid_of(&dead.runner_name).expect("a process");
    h.processes.exit(dead_pid, 137);
    h.restart();
    h.recover().await.expect("recovery completes");
    let now: HashMap<String, AttemptRecord> = h
        .attempts()
        .into_iter()
        .map(|a| (a.runner_name.clone(), a))
        .collect();
    assert_eq!(now[&live.runner_name].state, AttemptState::Busy, "adopted");
    assert!(
        h.processes.signals(live_pid).is_empty(),
        "a busy runner is never stopped"
    );
    assert!(now[&dead.runner_name].state.is_terminal(), "concluded");
    assert!(now[&dead.runner_name].outcome.is_some(), "with an outcome");
    // The adopted runner finishes its job under the new executor; the dead one's registration
    // goes once GitHub lets go of it.
    h.advance(Duration::from_secs(120));
    h.until(
        "the adopted runner's job done, everything cleaned",
        |_| {},
        |h| h.completed(jobs[0]) && h.all_cleaned(),
    )
    .await;
    assert!(h.runtimes().is_empty());
    // GitHub held the dead runner busy with the job it was running until it gave that job up;
    // its registration is the inventory reconciliation's, at its next interval.
    h.advance(super::super::INVENTORY_INTERVAL);
    h.until(
        "every registration of ours removed",
        |_| {},
        |h| h.our_registrations().is_empty(),
    )
    .await;
    let adopted = h
        .attempts()
        .into_iter()
        .find(|a| a.runner_name == live.runner_name)
        .expect("the adopted attempt");
    assert_eq!(adopted.outcome, Some(AttemptOutcome::CompletedJob));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_dead_between_registration_and_process_is_recovered_and_its_job_served() {
    let mut h = Harness::new(Options::default()).await;
    // The launch gets its JIT registration journalled, then the agent dies before the process
    // exists: the next agent finds the attempt `jit_received`, no process, and a registration.
    h.backend.hold_start(true);
    let job = h.queue("build", LABELS);
    h.until(
        "the registration journalled",
        |_| {},
        |h| {
            h.attempts()
                .first()
                .is_some_and(|a| a.state == AttemptState::JitReceived)
        },
    )
    .await;
    let crashed = h.attempts().remove(0);
    assert_eq!(
        h.our_registrations(),
        std::slice::from_ref(&crashed.runner_name)
    );
    // The dead agent's launch never gets further (its start fails once it is let go).
    let dead_agent = Arc::clone(&h.backend);
    dead_agent.refuse_start(true);
    h.restart();
    h.recover().await.expect("recovery completes");
    // Recovery concluded it and handed its cleanup to a task (allocation never waits for one).
    h.settle().await;
    let recovered = h
        .attempts()
        .into_iter()
        .find(|a| a.attempt_id == crashed.attempt_id)
        .expect("the attempt");
    assert_eq!(recovered.state, AttemptState::Cleaned, "{recovered:#?}");
    assert_eq!(recovered.outcome, Some(AttemptOutcome::Failed));
    assert!(
        !h.our_registrations().contains(&crashed.runner_name),
        "its registration was removed"
    );
    assert!(h.runtimes().is_empty(), "its runtime was removed");
    // The job is still queued: the new agent serves it.
    h.until(
        "the job served",
        |_| {},
        |h| h.completed(job) && h.all_cleaned(),
    )
    .await;
    dead_agent.hold_start(false);
    assert_eq!(h.attempts().len(), 2);
    assert_eq!(h.attempts()[0].outcome, Some(AttemptOutcome::CompletedJob));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_github_refuses_is_not_retried_and_waits_the_longest_back_off() {
    let mut h = Harness::new(Options::default()).await;
    let permissions = rm_fake_github::model::default_permissions();
    let granted: Vec<(&str, &str)> = permissions
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let without_runners: Vec<(&str, &str)> = granted
        .iter()
        .copied()
        .filter(|(k, _)| *k != "administration")
        .collect();
    h.fake.set_permissions(h.installation, &without_runners);
    let job = h.queue("build", LABELS);
    // Concluded, not yet cleaned: the back-off began when the launch failed, a pass or two
    // ago, and every step until the cleanup ends (a task of its own, which a loaded machine
    // may run many steps later) would eat into it at a second of manual time each.
    h.until(
        "the refused launch concluded",
        |_| {},
        |h| {
            h.attempts()
                .iter()
                .any(|a| a.reason.as_deref() == Some("jit_request_failed"))
        },
    )
    .await;
    let jit_requests = || {
        h.fake
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/generate-jitconfig"))
            .count()
    };
    assert_eq!(jit_requests(), 1, "a 403 is not retried");
    // The permission is granted again, but a refusal needs a person: the policy waits the
    // longest back-off, not the first one.
    h.fake.set_permissions(h.installation, &granted);
    let max = super::super::allocate::LAUNCH_BACKOFF_MAX;
    h.advance(max - Duration::from_secs(15));
    steps(&mut h, 10).await;
    assert_eq!(
        h.attempts().len(),
        1,
        "launched again before the back-off ended"
    );
    h.until(
        "the job served",
        |_| {},
        |h| h.completed(job) && h.all_cleaned(),
    )
    .await;
    assert_eq!(h.attempts().len(), 2);
}

/// A fleet host reserves every JIT registration in the installation's window the fleet
/// shares: with room for two (another host's request already in it), the first job gets its
/// runner, the second's registration is refused before it reaches GitHub, with the wait the
/// window names, and the launch ends there (the wait is longer than a launch waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_host_registers_only_inside_the_fleet_s_shared_window() {
    use rm_journal::Fleet as _;
    let window = rm_journal::SpendWindow {
        limit: 2,
        span: Duration::from_secs(3600),
    };
    let mut h = Harness::new(Options {
        fleet: Some(HashMap::new()),
        registrations: Some(vec![window]),
        ..Options::default()
    })
    .await;
    h.executor.renew_lease().await;
    // Another host of the fleet registered a runner for the same installation a moment ago.
    let scope = crate::executor::claims::registration_scope(APP_ID, h.installation);
    let mut other = rm_journal::LocalFleet::open(&h.journal_path).unwrap();
    assert_eq!(
        other.reserve(&scope, "other-host", &[window]).unwrap(),
        None
    );
    jobs_take(&h, 3600);
    let first = h.queue("build (1)", LABELS);
    h.until(
        "the first job's runner took it",
        |_| {},
        |h| {
            h.fake
                .job(first)
                .is_some_and(|j| j.status == rm_fake_github::JobStatus::InProgress)
        },
    )
    .await;
    h.queue("build (2)", LABELS);
    h.until(
        "the second registration refused by the shared window",
        |_| {},
        |h| {
            h.attempts()
                .iter()
                .any(|a| a.reason.as_deref() == Some("jit_request_failed"))
        },
    )
    .await;
    let jit_requests = h
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/generate-jitconfig"))
        .count();
    assert_eq!(jit_requests, 1, "only the reserved registration was sent");
    let refused = h
        .attempts()
        .into_iter()
        .find(|a| a.reason.as_deref() == Some("jit_request_failed"))
        .unwrap();
    let detail = refused.detail.unwrap_or_default();
    assert!(detail.contains("shared registration window"), "{detail}");
    // Nothing more was reserved: the window holds the other host's and the first job's.
    let wait = other.reserve(&scope, "other-host", &[window]).unwrap();
    assert!(
        wait.is_some_and(|w| w > Duration::from_secs(3500)),
        "{wait:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_host_starts_runners_only_for_its_claims_under_the_fleet_ceiling() {
    // A fleet-wide ceiling of 2 on a host that could run 4: the claims hold it to 2.
    let mut h = Harness::new(Options {
        fleet: Some([("linux".to_owned(), 2)].into()),
        ..Options::default()
    })
    .await;
    h.executor.renew_lease().await;
    jobs_take(&h, 10);
    let jobs: Vec<u64> = (0..5)
        .map(|i| h.queue(&format!("matrix ({i})"), LABELS))
        .collect();
    let mut most = 0;
    h.until(
        "every job completed",
        |h| {
            let live = h.live();
            let view = h.fleet_view();
            let claims: usize = view.hosts.iter().map(|host| host.claims.len()).sum();
            assert!(live <= 2, "{live} live runners under a fleet ceiling of 2");
            assert!(claims <= 2, "{claims} claims under a fleet ceiling of 2");
            // Every runner this host starts is for a claim it holds (a runner whose job is done
            // may outlive its claim until it is concluded).
            let attempts = h.attempts();
            let waiting = attempts
                .iter()
                .filter(|a| a.state.counts_against_capacity() && a.state != AttemptState::Busy)
                .count();
            assert!(
                waiting <= claims,
                "{waiting} runners waiting for {claims} claims: {:#?} {view:#?}",
                attempts
                    .iter()
                    .map(|a| (a.state, a.job_id))
                    .collect::<Vec<_>>()
            );
            most = most.max(live);
        },
        |h| jobs.iter().all(|j| h.completed(*j)),
    )
    .await;
    assert_eq!(most, 2, "the fleet ceiling was used");
    h.until("every attempt cleaned", |_| {}, Harness::all_cleaned)
        .await;
    assert_eq!(h.attempts().len(), 5, "one runner per job");
    // A job whose runner concluded before a delivery named it (the fake delays and reorders
    // them) keeps its claim until the journal learns it ran: a few steps more, never forever.
    h.until(
        "every claim ended",
        |_| {},
        |h| h.fleet_view().hosts[0].claims.is_empty(),
    )
    .await;
    let view = h.fleet_view();
    assert_eq!(view.hosts.len(), 1);
    assert_eq!(view.hosts[0].host, HOST);
    assert!(view.hosts[0].live);
    assert!(
        view.hosts[0].claims.is_empty(),
        "a completed job's claim has ended: {:?}",
        view.hosts[0].claims
    );
}

/// A runner whose runtime grows past its policy's `disk_max` is stopped, busy as it is (the one
/// stop a busy runner gets), fails with `disk_exceeded` rather than completing its job, and is
/// cleaned; within its bound the same busy runner is left alone. The walk runs off the loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runner_past_its_disk_max_is_stopped_and_fails_for_it() {
    const MIB: u64 = 1 << 20;
    let mut linux = policy("linux", LABELS, 10);
    linux.disk_max = Some(4 * MIB);
    let mut h = Harness::new(Options {
        policies: vec![linux],
        ..Options::default()
    })
    .await;
    // Longer than the harness runs: only a stop ends it.
    jobs_take(&h, 3_600);
    let job = h.queue("fills the disk", LABELS);
    h.until(
        "the runner is busy",
        |_| {},
        |h| {
            h.attempts()
                .first()
                .is_some_and(|a| a.state == AttemptState::Busy)
        },
    )
    .await;
    // Measured (more than once) within its bound: nothing happens.
    let interval = rm_runner::disk::DISK_CHECK_INTERVAL.as_secs() as usize;
    steps(&mut h, 3 * interval).await;
    let attempt = h.attempts().remove(0);
    assert_eq!(attempt.state, AttemptState::Busy, "{attempt:#?}");
    let pid = attempt.pid.unwrap();
    assert!(h.processes.signals(pid).is_empty());

    // The job writes past the bound.
    std::fs::write(
        attempt.runtime_dir.join("filler"),
        vec![7u8; (8 * MIB) as usize],
    )
    .unwrap();
    h.until(
        "the runner is concluded",
        |_| {},
        |h| h.attempts()[0].state.is_terminal(),
    )
    .await;
    let concluded = h.attempts().remove(0);
    assert_eq!(
        concluded.outcome,
        Some(AttemptOutcome::Failed),
        "{concluded:#?}"
    );
    assert_eq!(concluded.reason.as_deref(), Some("disk_exceeded"));
    assert!(!h.processes.signals(pid).is_empty(), "it was signalled");
    assert!(!h.completed(job), "its job did not complete on it");
    h.until("the attempt is cleaned", |_| {}, Harness::all_cleaned)
        .await;
    assert!(h.runtimes().is_empty(), "{:?}", h.runtimes());
}

/// A runner stopped for its disk while GitHub still holds it busy (its job not given up yet)
/// is released at once: its runtime removed and its release journalled (the uid fence lets
/// go of it: `rm_journal`'s `a_released_attempt_frees_its_uid_before_it_is_cleaned`) while its
/// registration waits, busy, and the attempt stays uncleaned for it. An agent started again in
/// between (as after a crash between the release and the deregistration) keeps waiting, and
/// once GitHub lets go of the runner this agent removes the registration (GitHub did not expire
/// it) and only then is the attempt `cleaned`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_stopped_for_its_disk_is_released_before_github_lets_go_of_it() {
    const MIB: u64 = 1 << 20;
    // How long GitHub holds the killed runner's job before giving it up: many busy retries
    // long, and well within the cleanup's own limit.
    const HELD: Duration = Duration::from_secs(90);
    const _: () =
        assert!(HELD.as_secs() < super::super::deregister::DEREGISTER_BUSY_LIMIT.as_secs());
    let mut linux = policy("linux", LABELS, 10);
    linux.disk_max = Some(4 * MIB);
    let mut h = Harness::new(Options {
        policies: vec![linux],
        ..Options::default()
    })
    .await;
    h.fake.set_job_lock_timeout(HELD);
    jobs_take(&h, 3_600);
    let job = h.queue("fills the disk", LABELS);
    h.until(
        "the runner is busy",
        |_| {},
        |h| {
            h.attempts()
                .first()
                .is_some_and(|a| a.state == AttemptState::Busy)
        },
    )
    .await;
    let attempt = h.attempts().remove(0);
    std::fs::write(
        attempt.runtime_dir.join("filler"),
        vec![7u8; (8 * MIB) as usize],
    )
    .unwrap();
    h.until(
        "the runner is released",
        |_| {},
        |h| h.attempts()[0].released_at_ms.is_some(),
    )
    .await;
    let busy_at_github = |h: &Harness| {
        h.fake
            .runners()
            .into_iter()
            .find(|r| r.name == attempt.runner_name)
            .is_some_and(|r| r.busy)
    };
    let released = h.attempts().remove(0);
    assert_eq!(released.state, AttemptState::Failed, "{released:#?}");
    assert_eq!(released.reason.as_deref(), Some("disk_exceeded"));
    assert!(!attempt.runtime_dir.exists(), "its runtime is gone");
    assert!(h.runtimes().is_empty(), "{:?}", h.runtimes());
    assert!(busy_at_github(&h), "GitHub still holds it busy");
    assert!(!h.fake.abandoned_jobs().contains(&job));

    // Busy retries: the registration waits, the attempt with it, released.
    steps(&mut h, 15).await;
    assert!(busy_at_github(&h));
    let waiting = h.attempts().remove(0);
    assert_eq!(waiting.state, AttemptState::Failed, "{waiting:#?}");
    assert_eq!(waiting.released_at_ms, released.released_at_ms);
    // A restart between the release and the deregistration: the registration only.
    h.restart();
    h.recover().await.expect("recovery completes");
    h.until("the attempt is cleaned", |_| {}, Harness::all_cleaned)
        .await;
    assert!(
        h.fake.abandoned_jobs().contains(&job),
        "cleaned only after GitHub let go of the runner"
    );
    assert!(h.our_registrations().is_empty(), "registration left");
    assert!(
        !h.fake.expired_runners().contains(&attempt.runner_name),
        "the agent removed the registration, GitHub did not expire it"
    );
    assert!(h.runtimes().is_empty(), "{:?}", h.runtimes());
}

/// A runner stopped for its disk before it took any job (its runtime past `disk_max` with no
/// job in it: a persistent slot's `_work` that outgrew the bound, here a bound below the
/// package) fences the demand it was started for, as an idle exit does: without the fence each
/// replacement would be stopped the same way, one JIT registration each, for as long as the job
/// waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_stopped_for_its_disk_before_any_job_is_not_replaced() {
    let mut linux = policy("linux", LABELS, 10);
    // Every runtime holds more than a byte.
    linux.disk_max = Some(1);
    let mut h = Harness::new(Options {
        policies: vec![linux],
        ..Options::default()
    })
    .await;
    // A job the fake never hands out: the runner registers and waits, jobless.
    h.deliver_queued(777_002, LABELS).await;
    h.until(
        "the runner failed for its disk",
        |_| {},
        |h| {
            h.attempts().iter().any(|a| {
                a.reason.as_deref() == Some("disk_exceeded") && a.state == AttemptState::Cleaned
            })
        },
    )
    .await;
    steps(&mut h, PASSES_AFTER_FENCE).await;
    assert_eq!(h.attempts().len(), 1, "replaced: {:#?}", h.attempts());
    assert_eq!(h.attempts()[0].job_id, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleaned_attempts_diag_is_kept_scrubbed_once_and_printed_by_logs() {
    let mut h = Harness::new(Options::default()).await;
    let job = h.queue("build", LABELS);
    h.until("the job completed", |_| {}, |h| h.completed(job))
        .await;
    h.until("every attempt cleaned", |_| {}, Harness::all_cleaned)
        .await;
    assert!(h.runtimes().is_empty(), "{:?}", h.runtimes());
    let record = h.attempts().into_iter().next().expect("an attempt");
    let store = h.kept_logs();
    let manifest = rm_runner::logs::read_manifest(&store.entry(record.attempt_id.as_str()))
        .expect("the attempt's logs were kept before its runtime was removed");
    // The job, when the journal knew it by cleanup (else the journal names it later).
    assert!(
        manifest
            .job_id
            .is_none_or(|j| j == i64::try_from(job).unwrap())
    );
    assert_eq!(manifest.runner_name, record.runner_name);
    let names: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("Worker_"))
            && names.iter().any(|n| n.starts_with("Runner_")),
        "{names:?}"
    );
    // The runner wrote the JIT configuration it got into its logs; none of it is kept.
    let jit = h
        .backend
        .jits
        .lock()
        .unwrap()
        .get(&record.runner_name)
        .cloned()
        .expect("the JIT configuration the runner got");
    let printed = crate::commands::logs::kept_text(&store, record.attempt_id.as_str());
    assert!(
        printed.contains(&format!("fake runner {}", record.runner_name)),
        "{printed}"
    );
    assert!(printed.contains("--- Worker_"), "{printed}");
    assert!(!printed.contains(&jit), "{printed}");
    assert!(printed.contains("[redacted base64]"), "{printed}");
    // `logs <runner>` names this attempt, through the journal and through the copy alike (a
    // job id through the job's row: `commands::logs`'s own tests).
    let found = crate::commands::logs::resolve(&record.runner_name, None, &h.attempts(), []);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].attempt_id, record.attempt_id.as_str());
    let found = crate::commands::logs::resolve(&record.runner_name, None, &[], [manifest.clone()]);
    assert_eq!(found.len(), 1);
    // A cleanup run again (an agent that crashed before journalling `cleaned`) keeps nothing
    // again: the whole copy stays as it was.
    let again = store
        .keep(&rm_runner::logs::Attempt::of(&record), h.clock.now().get())
        .unwrap();
    assert_eq!(again, rm_runner::logs::Kept::Already);
}

/// Three Apps installed on the target and a fourth installed nowhere: a burst of
/// registrations is spread over the three installations (each gets some, as the fake counts
/// them), the fourth App is left out, and every runner, whichever App registered it, serves
/// its job and is removed through the primary's installation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_registrations_is_spread_over_every_app_s_installation() {
    let mut h = Harness::new(Options {
        max_runners: 9,
        policies: vec![policy("linux", &["self-hosted"], 9)],
        more_apps: vec![(5001, true), (5002, true), (5003, false)],
        ..Options::default()
    })
    .await;
    jobs_take(&h, 5);
    run_matrix(&mut h, 9).await;
    let counts = h.fake.registrations_by_installation();
    let mut expected = vec![h.installation];
    expected.extend(&h.more_installations);
    let used: Vec<u64> = counts.keys().copied().collect();
    let mut sorted = expected.clone();
    sorted.sort_unstable();
    assert_eq!(
        used, sorted,
        "every installed App's installation registered runners, no other: {counts:?}"
    );
    assert!(counts.values().all(|n| *n >= 1), "{counts:?}");
    assert_eq!(
        counts.values().sum::<usize>(),
        9,
        "one registration per job"
    );
    assert_eq!(h.attempts().len(), 9);
    assert!(
        h.our_registrations().is_empty(),
        "every registration removed"
    );
    // The client counted them per App, as `/metrics` shows them.
    let per_app: Vec<u64> = h
        .client
        .registration_counts()
        .iter()
        .map(|(app, _, _)| *app)
        .collect();
    assert_eq!(per_app, [APP_ID, 5001, 5002]);
}

/// A further App installed without the registration permission refuses its first
/// registration (403): its installation is set aside and that registration, like the rest,
/// goes through the other Apps; no launch fails for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_without_the_permission_is_set_aside_and_no_launch_fails() {
    let mut h = Harness::new(Options {
        max_runners: 6,
        policies: vec![policy("linux", &["self-hosted"], 6)],
        more_apps: vec![(5001, true), (5002, true)],
        ..Options::default()
    })
    .await;
    let weak = h.more_installations[1];
    h.fake.set_permissions(weak, &[("actions", "read")]);
    jobs_take(&h, 5);
    run_matrix(&mut h, 6).await;
    let counts = h.fake.registrations_by_installation();
    assert!(!counts.contains_key(&weak), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 6, "{counts:?}");
    let refused = h
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/generate-jitconfig") && r.status == 403)
        .count();
    // The burst's six launches choose at once, a third of them the weak App's installation,
    // before the first refusal sets it aside: at most those two ask it, never a later one.
    assert!((1..=2).contains(&refused), "{refused} refusals");
    assert!(
        h.attempts()
            .iter()
            .all(|a| a.outcome == Some(AttemptOutcome::CompletedJob)),
        "{:#?}",
        h.attempts()
    );
}

/// Queues a matrix of `n` jobs and steps until every one completed and every attempt is cleaned.
async fn run_matrix(h: &mut Harness, n: usize) {
    let jobs: Vec<u64> = (0..n)
        .map(|i| h.queue(&format!("matrix ({i})"), LABELS))
        .collect();
    h.until(
        "every job completed and cleaned",
        |_| {},
        |h| jobs.iter().all(|j| h.completed(*j)) && h.all_cleaned(),
    )
    .await;
}

/// How long one [`Harness::step`] may take in real time in the tests of a loop that never waits
/// for an effect: far beyond a pass's few milliseconds, far below [`HOLD_LIMIT`].
const STEP_LIMIT: Duration = Duration::from_secs(5);

/// Steps until `done` holds; fails the test if a step takes longer than [`STEP_LIMIT`] (a pass
/// that waited for a held effect) or after [`MAX_STEPS`].
async fn until_unblocked(h: &mut Harness, what: &str, mut done: impl FnMut(&Harness) -> bool) {
    for _ in 0..MAX_STEPS {
        if done(h) {
            return;
        }
        if tokio::time::timeout(STEP_LIMIT, h.step()).await.is_err() {
            panic!(
                "{what}: a pass took longer than {STEP_LIMIT:?}: it waited for a runner's cleanup; attempts: {:#?}",
                h.attempts()
            );
        }
    }
    panic!(
        "{what}: not reached in {MAX_STEPS} steps; attempts: {:#?}",
        h.attempts()
    );
}

/// A runner being cleaned never holds back the next job's runner: the runtime's removal is held
/// (a checkout of a few hundred thousand files, for as long as the test likes), a job is queued
/// meanwhile, and its runner is allocated, runs its job and is concluded while the first
/// removal still runs. Before cleanups ran as tasks, the pass that concluded the first runner
/// waited in its cleanup, and nothing was allocated until the removal ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_being_cleaned_never_holds_back_the_next_start() {
    let mut h = Harness::new(Options::default()).await;
    jobs_take(&h, 3);
    h.backend.hold_clean(true);
    let first = h.queue("first", LABELS);
    until_unblocked(&mut h, "the first runner's removal is under way", |h| {
        h.backend.cleans_held() == 1
    })
    .await;
    assert!(h.completed(first));
    let second = h.queue("second", LABELS);
    until_unblocked(&mut h, "the second job ran", |h| h.completed(second)).await;
    let attempts = h.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let first_runner = h.fake.job(first).and_then(|j| j.runner_name);
    let first_attempt = attempts
        .iter()
        .find(|a| Some(&a.runner_name) == first_runner.as_ref())
        .expect("the first job's runner");
    assert_ne!(
        first_attempt.state,
        AttemptState::Cleaned,
        "the first runner's removal was still held while the second ran"
    );
    assert!(h.backend.cleans_held() >= 1);
    h.backend.hold_clean(false);
    h.until("every attempt cleaned", |_| {}, Harness::all_cleaned)
        .await;
    assert!(h.runtimes().is_empty(), "{:?}", h.runtimes());
    assert!(h.our_registrations().is_empty());
    assert!(h.processes.alive().is_empty());
}
