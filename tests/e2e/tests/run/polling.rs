//! `rm-agent run` when webhooks do not arrive, through the real binary and the fake GitHub:
//! jobs queued while the agent (and its receiver) was down are served after it returns, and an
//! agent with no receiver at all serves jobs by polling alone. Exactly one runner per job.

use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, REPO, wait_until};
use rm_journal::AttemptOutcome;

const LABELS: &[&str] = &["self-hosted", "linux"];

fn all_done(fleet: &Fleet, jobs: &[u64]) -> bool {
    jobs.iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned()
}

/// One completed attempt per job, no other runner, nothing left.
fn assert_one_runner_each(fleet: &Fleet, jobs: &[u64]) {
    let attempts = fleet.attempts();
    let summary: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "{} {:?} {:?} job={:?}",
                a.state.as_str(),
                a.outcome,
                a.reason,
                a.job_id
            )
        })
        .collect();
    assert_eq!(attempts.len(), jobs.len(), "{summary:?}");
    assert!(
        attempts
            .iter()
            .all(|a| a.outcome == Some(AttemptOutcome::CompletedJob)),
        "{summary:?}"
    );
    assert!(fleet.our_registrations().is_empty());
    assert!(fleet.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_queued_while_the_agent_was_down_are_served_when_it_returns() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    let first = fleet.start_agent(&[]).await;
    assert!(first.terminate().success());
    let jobs: Vec<u64> = (0..3)
        .map(|i| {
            fleet
                .fake
                .queue_job(REPO, &format!("missed {i}"), LABELS)
                .unwrap()
        })
        .collect();
    fleet.fake.settle().await.unwrap();
    let failed = fleet
        .fake
        .deliveries()
        .iter()
        .filter(|d| d.status != "delivered")
        .count();
    assert!(failed >= 3, "the queued webhooks could not be delivered");

    let _agent = fleet.start_agent(&[]).await;
    wait_until(Duration::from_secs(60), "every missed job served", || {
        all_done(&fleet, &jobs)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_one_runner_each(&fleet, &jobs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_receiver_jobs_are_served_by_polling_alone() {
    let fleet = Fleet::start(FleetOptions {
        receiver: false,
        polling_idle_interval: "5s",
        ..FleetOptions::default()
    })
    .await;
    let _agent = fleet.start_agent(&[]).await;
    // Let the agent start and its first (quiet) poll pass.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let jobs: Vec<u64> = (0..2)
        .map(|i| {
            fleet
                .fake
                .queue_job(REPO, &format!("polled {i}"), LABELS)
                .unwrap()
        })
        .collect();
    wait_until(
        Duration::from_secs(60),
        "every job served by polling",
        || all_done(&fleet, &jobs),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_one_runner_each(&fleet, &jobs);
}
