//! Crash recovery of `rm-agent run`: the agent SIGKILLs itself (`RM_FAULT_CRASH_AT`) right
//! after each step of a runner's lifecycle, then a fresh agent starts on the same data
//! directory. Whatever the step, the job is served once, by one runner process, and nothing is
//! left: no registration at the fake, no runtime directory, no process, no attempt uncleaned.

use std::time::Duration;

use rm_e2e::fleet::{CONTROL, Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptState};

const LABELS: &[&str] = &["self-hosted", "linux"];
async fn crash_at(point: &str) {
    crash_with(point, FleetOptions::default()).await;
}

async fn crash_with(point: &str, mut options: FleetOptions) {
    // The crash points exist only in an agent built with them.
    rm_e2e::agent_with("fault-injection");
    let persistent = options.policies.iter().any(|p| p.workspace == "persistent");
    options.policies.push(CONTROL);
    let fleet = Fleet::start(options).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_500,
        ..RunnerBehavior::default()
    });
    let mut first = fleet.start_agent(&[("RM_FAULT_CRASH_AT", point)]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(30), "the agent to kill itself", || {
        first.exited()
    })
    .await;
    let logs = fleet.setup.logs();
    assert!(
        logs.contains(&format!("RM_FAULT_CRASH_AT={point}")),
        "the agent did not reach {point}"
    );

    let _second = fleet.start_agent(&[]).await;
    wait_until(Duration::from_secs(60), "the job completed", || {
        fleet.completed(job)
    })
    .await;
    wait_until(Duration::from_secs(60), "every attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
    // A wrongly counted demand would start a second runner at the next allocation pass. No
    // fixed window: a control job, queued now on a policy of its own, gets a runner only from
    // an allocation pass that began after it, and that pass weighed the crashed policy's
    // demand too. Once the control is served, the crashed policy's attempts are final.
    let attempts = fleet.serve_control_job(Duration::from_secs(60)).await;
    let processes = attempts.iter().filter(|a| a.pid.is_some()).count();
    let completed = attempts
        .iter()
        .filter(|a| a.outcome == Some(AttemptOutcome::CompletedJob))
        .count();
    let summary: Vec<String> = attempts
        .iter()
        .map(|a| format!("{} {:?} {:?}", a.state.as_str(), a.outcome, a.reason))
        .collect();
    eprintln!("{point}: {summary:?}");
    assert!(
        processes <= 1,
        "{processes} runner processes for one job: {summary:?}"
    );
    assert_eq!(completed, 1, "one runner completed the job: {summary:?}");
    assert!(
        attempts.iter().all(|a| a.state == AttemptState::Cleaned),
        "{summary:?}"
    );
    assert!(fleet.our_registrations().is_empty(), "registration left");
    if persistent {
        // The slot is kept, scrubbed down to the job's checkout.
        let slot = fleet.runner_root.join("widgets").join("s0");
        let left: Vec<_> = std::fs::read_dir(&slot)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["_work"], "slot not scrubbed");
    } else {
        assert!(fleet.runtimes().is_empty(), "runtime left");
    }
    // Nothing of any attempt's network is left in the kernel: no namespace, no veth (its
    // table lived inside the namespace).
    for a in &attempts {
        let short = a.attempt_id.short();
        assert!(
            !std::path::Path::new(&format!("/run/netns/rm-{short}")).exists(),
            "the network namespace of {short} is left"
        );
        assert!(
            !std::path::Path::new(&format!("/sys/class/net/rmv{short}")).exists(),
            "the veth of {short} is left"
        );
    }
    // The runner GitHub gave the job to is the attempt that completed it.
    let served_by = fleet.fake.job(job).unwrap().runner_name;
    let completer = attempts
        .iter()
        .find(|a| a.outcome == Some(AttemptOutcome::CompletedJob))
        .map(|a| a.runner_name.clone());
    assert_eq!(served_by, completer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_while_a_persistent_slot_runs_its_job() {
    crash_with(
        "runner_busy",
        FleetOptions {
            policies: vec![PolicySpec {
                name: "widgets",
                target: REPO,
                labels: LABELS,
                max_runners: 2,
                workspace: "persistent",
                extra: "",
            }],
            ..FleetOptions::default()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_attempt_is_journalled() {
    crash_at("attempt_journalled").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_jit_is_received() {
    crash_at("jit_received").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_process_is_spawned_before_it_is_journalled() {
    crash_at("process_spawned").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_runner_started() {
    crash_at("runner_started").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_when_the_runner_is_busy() {
    crash_at("runner_busy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_cleanup() {
    crash_at("cleanup").await;
}

/// Killed once the runtime is removed and the uid's release journalled, before the
/// registration is removed: the next agent removes the registration alone (the uid may be
/// another runner's by then) and cleans the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_the_runner_is_released() {
    crash_at("released").await;
}

/// The host lost under a busy runner (issue 28): the agent SIGKILLed and the runner's whole
/// cgroup killed with it, as a power loss or a kernel panic would, mid-job. The agent starting
/// again finds the runner gone, its job not completed (no `completed` delivery, no "completed
/// with result" on its console), and concludes it `failed`/`host_lost`; `explain` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_lost_with_its_host_mid_job_ends_host_lost() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 600_000,
        ..RunnerBehavior::default()
    });
    let first = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(
        Duration::from_secs(60),
        "a runner busy with the job",
        || fleet.any_busy(),
    )
    .await;
    let busy = fleet
        .attempts()
        .into_iter()
        .find(|a| a.state == AttemptState::Busy)
        .unwrap();
    first.kill();
    let cgroup = busy
        .cgroup
        .clone()
        .expect("an isolated runner has a cgroup");
    rm_runner::cgroup::kill_and_remove(&cgroup, Duration::from_secs(10)).unwrap();

    let second = fleet.start_agent(&[]).await;
    wait_until(Duration::from_secs(60), "the lost runner concluded", || {
        fleet
            .attempts()
            .iter()
            .any(|a| a.attempt_id == busy.attempt_id && a.outcome.is_some())
    })
    .await;
    let lost = fleet
        .attempts()
        .into_iter()
        .find(|a| a.attempt_id == busy.attempt_id)
        .unwrap();
    assert_eq!(lost.outcome, Some(AttemptOutcome::Failed), "{lost:?}");
    assert_eq!(lost.reason.as_deref(), Some("host_lost"), "{lost:?}");
    // Which runner took the job is journalled from GitHub's word (the job's `in_progress`
    // delivery, which the fake may delay and reorder, or a poll), which may come after the
    // attempt is concluded: explain names the runner's end once it has come.
    wait_until(
        Duration::from_secs(60),
        "explain names the lost runner's end",
        || fleet.explain(job)["runner_end"]["reason"] == "host_lost",
    )
    .await;
    let answer = fleet.explain(job);
    assert_eq!(answer["runner_end"]["reason"], "host_lost", "{answer}");
    let status = second.terminate();
    assert!(status.success(), "drain exit status {status}");
}
