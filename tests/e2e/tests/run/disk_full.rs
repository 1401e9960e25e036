//! `rm-agent run` with its data directory on a full filesystem (a small tmpfs the test mounts):
//! deliveries are refused with 503, the runner already running is not disturbed and finishes
//! its job, the agent keeps running, and once space returns it takes deliveries and concludes
//! and cleans the runner by itself.

use std::time::Duration;

use rm_e2e::delivery;
use rm_e2e::disk::{Tmpfs, fill};
use rm_e2e::fleet::{Fleet, FleetOptions, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::AttemptState;

const LABELS: &[&str] = &["self-hosted", "linux"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_deliveries_and_leaves_the_busy_runner_alone() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    let data = fleet.setup.dir.path().join("data");
    let _tmpfs = Tmpfs::mount(&data, "16m");
    // The data directory's 16 MiB are below the fitness gate's default threshold; the runner
    // is to start on it (the gate's own test is fitness.rs).
    let config = std::fs::read_to_string(fleet.setup.config()).unwrap();
    assert!(
        config.contains("data_dir_min_free_space = \"16MiB\"\n"),
        "{config}"
    );
    std::fs::write(
        fleet.setup.config(),
        config.replacen(
            "data_dir_min_free_space = \"16MiB\"\n",
            "data_dir_min_free_space = \"1MiB\"\n",
            1,
        ),
    )
    .unwrap();
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 6_000,
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

    let filler = fill(&data);
    let mut refused = 0;
    for _ in 0..2_000 {
        match agent.deliver(&delivery("ping.none.0", None)).await.unwrap() {
            202 => {}
            503 => {
                refused += 1;
                if refused == 10 {
                    break;
                }
            }
            other => panic!("a delivery into a full disk was answered {other}"),
        }
    }
    assert_eq!(refused, 10, "a full disk never refused a delivery");
    wait_until(
        Duration::from_secs(60),
        "the runner finished its job",
        || fleet.completed(job),
    )
    .await;
    assert!(!agent.exited(), "the agent exited on a full disk");

    std::fs::remove_file(&filler).unwrap();
    assert_eq!(
        agent.deliver(&delivery("ping.none.0", None)).await,
        Ok(202),
        "{}",
        fleet.setup.logs()
    );
    wait_until(Duration::from_secs(60), "every attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
    let attempts = fleet.attempts();
    assert_eq!(
        attempts.iter().filter(|a| a.pid.is_some()).count(),
        1,
        "{attempts:?}"
    );
    assert!(attempts.iter().all(|a| a.state == AttemptState::Cleaned));
    assert!(!agent.exited(), "the agent exited on a full disk");
}
