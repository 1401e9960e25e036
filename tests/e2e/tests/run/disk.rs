//! The disk bound (`policy.disk_max`, issue 25) through `rm-agent run`: a job that writes past
//! its policy's bound is stopped while busy, its attempt ends `failed` with reason
//! `disk_exceeded`, its runtime and uid are given back while GitHub still holds the runner busy
//! (issue 38), and nothing of it is left: no runtime, no registration, no attempt waiting for
//! cleanup. The rules themselves are tested in the executor harness; this is the whole path,
//! with the real walk of a real runtime under the default isolation.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, LINUX, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::AttemptOutcome;

const LABELS: &[&str] = &["self-hosted", "linux"];
/// GitHub gives a job up after about ten minutes without a lock renewal; seconds here, so the
/// stopped runner's registration can be removed within the test, yet long enough for its
/// runtime and uid to be seen given back while GitHub still holds it busy.
const LOCK_TIMEOUT: Duration = Duration::from_secs(20);

/// The job: once its listener runs, it writes 32 MiB of real data into its runtime (past the
/// policy's 16 MiB), then waits; the listener takes the job and would run it for ten minutes.
const SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." && pwd -P)
( sleep 2; head -c 33554432 /dev/zero >"$HERE/filler"; sleep 600 ) &
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_writes_past_disk_max_is_stopped_as_disk_exceeded_and_leaves_nothing() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![PolicySpec {
            extra: "disk_max = \"16M\"\n",
            ..LINUX
        }],
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.set_job_lock_timeout(LOCK_TIMEOUT);
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 600_000,
        ..RunnerBehavior::default()
    });
    let bin = fleet.package.join("bin");
    std::fs::rename(
        bin.join("Runner.Listener"),
        bin.join("Runner.Listener.real"),
    )
    .unwrap();
    std::fs::write(bin.join("Runner.Listener"), SCRIPT).unwrap();
    std::fs::set_permissions(
        bin.join("Runner.Listener"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let agent = fleet.start_agent(&[]).await;
    let job = fleet
        .fake
        .queue_job(REPO, "fills the disk", LABELS)
        .unwrap();

    // Measured every 15 s: well inside the bound below on an idle host.
    wait_until(Duration::from_secs(120), "the runner concluded", || {
        fleet
            .attempts()
            .first()
            .is_some_and(|a| a.outcome.is_some())
    })
    .await;
    let attempt = fleet.attempts().remove(0);
    assert_eq!(
        attempt.outcome,
        Some(AttemptOutcome::Failed),
        "{attempt:#?}"
    );
    assert_eq!(
        attempt.reason.as_deref(),
        Some("disk_exceeded"),
        "{attempt:#?}"
    );
    // It was stopped busy: it had taken the job, which it did not finish.
    assert_eq!(
        attempt.job_id.map(|j| j.get()),
        Some(job as i64),
        "{attempt:#?}"
    );
    assert!(!fleet.completed(job) || fleet.fake.abandoned_jobs().contains(&job));

    // Released (its processes killed, its runtime removed, its uid free) while GitHub still
    // holds the runner busy with the job it was stopped in.
    wait_until(Duration::from_secs(60), "the attempt released", || {
        fleet
            .attempts()
            .first()
            .is_some_and(|a| a.released_at_ms.is_some())
    })
    .await;
    let released = fleet.attempts().remove(0);
    let busy_at_github = fleet
        .fake
        .runners()
        .into_iter()
        .any(|r| r.name == released.runner_name && r.busy);
    assert!(busy_at_github, "GitHub let go first: {released:#?}");
    assert_ne!(
        released.state,
        rm_journal::AttemptState::Cleaned,
        "{released:#?}"
    );
    assert!(fleet.runtimes().is_empty(), "{:?}", fleet.runtimes());
    // The default isolation (`user`): the runner ran as a uid of the pool.
    let uid = released.uid.expect("a runner uid");
    assert!(
        rm_e2e::pg_fleet::processes_of_uids((uid, uid)).is_empty(),
        "a process still runs as the released uid {uid}"
    );
    let held = rm_journal::Reader::open(&fleet.setup.journal())
        .unwrap()
        .uncleaned_attempts()
        .unwrap()
        .into_iter()
        .any(|a| a.uid == Some(uid) && a.released_at_ms.is_none());
    assert!(!held, "uid {uid} still held in the journal");

    wait_until(Duration::from_secs(120), "the attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
    assert!(fleet.runtimes().is_empty(), "{:?}", fleet.runtimes());
    assert!(
        fleet.our_registrations().is_empty(),
        "registration left: {:?}",
        fleet.our_registrations()
    );
    assert_eq!(fleet.attempts().len(), 1, "{:#?}", fleet.attempts());
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
}

/// A job that fills its filesystem (issue 28): the runner's private `/tmp`, sized from the
/// policy's `memory_max` (16 MiB of 32 MiB here), fills; the step's `No space left on device`
/// is in the runner's kept console, so the attempt ends `failed`/`disk_full` (not a completed
/// job), and `explain` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_fills_its_filesystem_ends_disk_full() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![PolicySpec {
            extra: "memory_max = \"32M\"\n",
            ..LINUX
        }],
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        fill_tmp: true,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "fills /tmp", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "the attempt cleaned", || {
        fleet.completed(job) && fleet.all_cleaned()
    })
    .await;
    let attempts = fleet.attempts();
    let filled = attempts
        .iter()
        .find(|a| a.reason.as_deref() == Some("disk_full"))
        .unwrap_or_else(|| panic!("no attempt ended disk_full: {attempts:?}"));
    assert_eq!(filled.outcome, Some(AttemptOutcome::Failed));
    let answer = fleet.explain(job);
    assert_eq!(answer["runner_end"]["reason"], "disk_full", "{answer}");
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
}
