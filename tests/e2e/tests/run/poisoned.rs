//! A poisoned journal ends `rm-agent run` the way a SIGTERM does (no new runner, the busy one
//! left running), but with exit 1, so systemd's `Restart=on-failure` restarts it; the next agent
//! adopts the runner, which finishes its job.
//!
//! The fault is real: the WAL is removed under the writer, so the next flush fails.

use std::time::{Duration, Instant};

use rm_e2e::delivery;
use rm_e2e::fleet::{Fleet, FleetOptions, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::AttemptState;

const LABELS: &[&str] = &["self-hosted", "linux"];
/// The drain waits for launches in flight (bounded by the agent); well above that.
const EXIT_TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_journal_drains_exits_1_and_leaves_the_busy_runner() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 20_000,
        ..RunnerBehavior::default()
    });
    let mut agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(
        Duration::from_secs(60),
        "a runner busy with the job",
        || fleet.any_busy(),
    )
    .await;
    let pid = fleet
        .attempts()
        .iter()
        .find(|a| a.state == AttemptState::Busy)
        .and_then(|a| a.pid)
        .unwrap();

    let mut wal = fleet.setup.journal().into_os_string();
    wal.push("-wal");
    std::fs::remove_file(&wal).unwrap();
    assert_eq!(agent.deliver(&delivery("ping.none.0", None)).await, Ok(503));

    let deadline = Instant::now() + EXIT_TIMEOUT;
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "rm-agent run still runs with a poisoned journal"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let logs = fleet.setup.logs();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(logs.contains("was poisoned"), "{logs}");
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists() && !fleet.completed(job),
        "the busy runner did not outlive the agent"
    );

    let _again = fleet.start_agent(&[]).await;
    wait_until(
        Duration::from_secs(90),
        "the adopted runner completed",
        || fleet.completed(job),
    )
    .await;
    // Nothing more is asserted of the journal: what the first agent wrote after the WAL was
    // removed went into the removed file (that is the fault), so the second agent may find the
    // attempt a step behind, or not at all.
}
