//! `rm-agent run` when webhooks do not arrive, through the real binary and the fake GitHub:
//! jobs queued while the agent (and its receiver) was down are served after it returns, and an
//! agent with no receiver at all serves jobs by polling alone. Exactly one runner per job.

use std::time::Duration;

use rm_e2e::fleet::{CONTROL, Fleet, FleetOptions, LINUX, REPO, wait_until};
use rm_journal::AttemptOutcome;

const LABELS: &[&str] = &["self-hosted", "linux"];
fn all_done(fleet: &Fleet, jobs: &[u64]) -> bool {
    jobs.iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned()
}

/// Whether a delivery attempt reached a receiver, as GitHub's delivery log says it: `status`
/// "OK" and a 2xx `status_code` (a failed one says why, e.g. "Failed to connect to host", with
/// the receiver's code or 0 when nothing answered).
fn reached(status: &str, status_code: u16) -> bool {
    status == "OK" && (200..300).contains(&status_code)
}

/// Every attempt to deliver the `queued` webhook of one of `jobs`: `(job, status, status_code)`.
fn queued_deliveries(fleet: &Fleet, jobs: &[u64]) -> Vec<(u64, String, u16)> {
    fleet
        .fake
        .deliveries()
        .into_iter()
        .filter(|d| d.event == "workflow_job" && d.action.as_deref() == Some("queued"))
        .filter_map(|d| {
            let body: serde_json::Value = serde_json::from_slice(&d.body).ok()?;
            let job = body["workflow_job"]["id"].as_u64()?;
            jobs.contains(&job)
                .then_some((job, d.status, d.status_code))
        })
        .collect()
}

/// After `jobs` are served: a wrongly counted demand would start another runner at the next
/// allocation pass. No fixed window: a control job, queued now on a policy of its own, gets a
/// runner only from an allocation pass that began after it, and that pass weighed the policy
/// under test too. Then one completed attempt per job, no other runner, nothing left.
async fn assert_no_later_runner(fleet: &Fleet, jobs: &[u64]) {
    // Polling alone finds a job within an active interval (30 s) of its queueing; generous on
    // two busy cores.
    let attempts = fleet.serve_control_job(Duration::from_secs(120)).await;
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
    let fleet = Fleet::start(FleetOptions {
        policies: vec![LINUX, CONTROL],
        ..FleetOptions::default()
    })
    .await;
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
    // The premise, in the words of GitHub's delivery log: each job's `queued` webhook was
    // attempted and none of its attempts reached a receiver (status "OK", a 2xx status_code).
    let queued = queued_deliveries(&fleet, &jobs);
    for job in &jobs {
        let attempts: Vec<_> = queued.iter().filter(|(j, ..)| j == job).collect();
        assert!(!attempts.is_empty(), "job {job}: no queued webhook sent");
        assert!(
            attempts
                .iter()
                .all(|(_, status, code)| !reached(status, *code)),
            "job {job}: its queued webhook was delivered, not missed: {attempts:?}"
        );
    }

    let _agent = fleet.start_agent(&[]).await;
    wait_until(Duration::from_secs(120), "every missed job served", || {
        all_done(&fleet, &jobs)
    })
    .await;
    assert_no_later_runner(&fleet, &jobs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_receiver_jobs_are_served_by_polling_alone() {
    let fleet = Fleet::start(FleetOptions {
        receiver: false,
        polling_idle_interval: "5s",
        policies: vec![LINUX, CONTROL],
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
        Duration::from_secs(120),
        "every job served by polling",
        || all_done(&fleet, &jobs),
    )
    .await;
    assert_no_later_runner(&fleet, &jobs).await;
}
