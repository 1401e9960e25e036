//! The re-run rule (issue 28) through the harness: a job killed by the infrastructure under a
//! policy with `rerun_on` is re-run once, through one request, and runs again; none without
//! the policy, none for a job that failed on its own; and a re-run an agent died sending is
//! never sent again.

use std::collections::BTreeMap;

use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptState, NewRerun, Reader, RerunState};
use rm_vocab::{JobId, JobState, UnixMs};

use crate::config::rerun::RerunPolicy;

use super::*;

const LABELS: &[&str] = &["self-hosted"];

/// Steps run to show that nothing more happens: several scan intervals and poll intervals.
const QUIET_STEPS: usize = 90;

fn rerun_on(reasons: &[&str]) -> BTreeMap<String, RerunPolicy> {
    BTreeMap::from([(
        "linux".to_owned(),
        RerunPolicy {
            rerun_on: reasons.iter().map(|r| (*r).to_owned()).collect(),
            max_reruns: 1,
        },
    )])
}

/// The re-run requests the fake received.
fn rerun_requests(h: &Harness) -> usize {
    h.fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/rerun"))
        .count()
}

fn journal_job(h: &Harness, job: u64) -> Option<rm_journal::JobRow> {
    let reader = Reader::open(h.journal_path()).expect("a reader");
    reader
        .job(JobId::try_from(job).expect("a job id"))
        .expect("the job")
}

fn rerun_row(h: &Harness, job: u64) -> Option<rm_journal::RerunRecord> {
    let reader = Reader::open(h.journal_path()).expect("a reader");
    reader
        .rerun_for_job(JobId::try_from(job).expect("a job id"))
        .expect("the re-run")
}

/// Runs a job on our runner, then ends its attempt as the infrastructure would (journalled
/// `failed` with `reason`: the lead's supervision attributes these) and has GitHub fail the job;
/// waits until the journal knows the job completed. Returns the job.
async fn killed_by(h: &mut Harness, reason: &str) -> u64 {
    h.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 3_600_000,
        ..RunnerBehavior::default()
    });
    let job = h.queue("build", LABELS);
    let job_id = JobId::try_from(job).expect("a job id");
    h.until(
        "the runner is busy with the job",
        |_| {},
        |h| {
            h.attempts()
                .iter()
                .any(|a| a.state == AttemptState::Busy && a.job_id == Some(job_id))
        },
    )
    .await;
    let attempt = h
        .attempts()
        .into_iter()
        .find(|a| a.job_id == Some(job_id))
        .expect("the attempt");
    let concluded = Attempts::open(h.journal_path())
        .expect("the journal")
        .conclude(
            &attempt.attempt_id,
            AttemptState::Busy,
            AttemptOutcome::Failed,
            Some(reason),
            Some("seeded by the test"),
            h.clock.now(),
        )
        .expect("the conclusion");
    assert!(concluded);
    assert!(h.fake.complete_job(job, "failure"));
    h.deliver_completed(job).await;
    h.until(
        "the journal knows the job failed",
        |_| {},
        |h| journal_job(h, job).is_some_and(|j| j.state == JobState::Completed),
    )
    .await;
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_the_infrastructure_killed_is_rerun_once_and_runs_again() {
    let mut h = Harness::new(Options {
        reruns: rerun_on(&["oom_killed", "runner_crashed"]),
        ..Options::default()
    })
    .await;
    h.fake.set_actions_write(h.installation, true);
    let job = killed_by(&mut h, "oom_killed").await;
    h.until(
        "GitHub re-ran the job",
        |_| {},
        |h| !h.fake.reruns().is_empty(),
    )
    .await;
    let (rerun_of, new_job) = h.fake.reruns()[0];
    assert_eq!(rerun_of, job);
    // The new job (run attempt 2) runs on one of our runners like any other.
    h.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 5_000,
        ..RunnerBehavior::default()
    });
    h.until("the re-run job completed", |_| {}, |h| h.completed(new_job))
        .await;
    steps(&mut h, QUIET_STEPS).await;
    assert_eq!(rerun_requests(&h), 1, "exactly one re-run request");
    assert_eq!(h.fake.reruns().len(), 1);
    let row = rerun_row(&h, job).expect("the journalled re-run");
    assert_eq!(row.state, RerunState::Sent);
    assert_eq!(row.reason, "oom_killed");
    assert_eq!(row.run_attempt, 1);
    assert_eq!(h.fake.job(new_job).map(|j| j.run_attempt), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rerun_without_the_policy_nor_for_a_reason_it_does_not_list() {
    // No `rerun_on`: the killed job stays failed.
    let mut h = Harness::new(Options::default()).await;
    h.fake.set_actions_write(h.installation, true);
    let job = killed_by(&mut h, "oom_killed").await;
    steps(&mut h, QUIET_STEPS).await;
    assert_eq!(rerun_requests(&h), 0);
    assert_eq!(rerun_row(&h, job), None);

    // A policy re-running OOM kills, and a job whose runner exited on its own.
    let mut h = Harness::new(Options {
        reruns: rerun_on(&["oom_killed"]),
        ..Options::default()
    })
    .await;
    h.fake.set_actions_write(h.installation, true);
    let job = killed_by(&mut h, "process_exited_unexpectedly").await;
    steps(&mut h, QUIET_STEPS).await;
    assert_eq!(rerun_requests(&h), 0);
    assert_eq!(rerun_row(&h, job), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_failed_on_its_own_is_not_rerun() {
    let mut h = Harness::new(Options {
        reruns: rerun_on(&["oom_killed", "runner_crashed", "host_lost"]),
        ..Options::default()
    })
    .await;
    h.fake.set_actions_write(h.installation, true);
    h.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 3_000,
        conclusion: "failure".into(),
        ..RunnerBehavior::default()
    });
    let job = h.queue("build", LABELS);
    h.until(
        "every attempt cleaned after the job",
        |_| {},
        |h| h.completed(job) && !h.attempts().is_empty() && h.all_cleaned(),
    )
    .await;
    steps(&mut h, QUIET_STEPS).await;
    assert_eq!(
        h.attempts()[0].outcome,
        Some(AttemptOutcome::CompletedJob),
        "the runner completed its job"
    );
    assert_eq!(
        h.fake.job(job).and_then(|j| j.conclusion).as_deref(),
        Some("failure")
    );
    assert_eq!(rerun_requests(&h), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_actions_write_the_rerun_is_refused_and_explained_once() {
    let mut h = Harness::new(Options {
        reruns: rerun_on(&["oom_killed"]),
        ..Options::default()
    })
    .await;
    // The fake's default installation has "Actions: Read" only, as rm needed before.
    let job = killed_by(&mut h, "oom_killed").await;
    h.until(
        "the re-run was refused",
        |_| {},
        |h| rerun_row(h, job).is_some_and(|r| r.state == RerunState::Refused),
    )
    .await;
    steps(&mut h, QUIET_STEPS).await;
    assert_eq!(rerun_requests(&h), 1, "asked once, never again");
    assert!(h.fake.reruns().is_empty());
    let detail = rerun_row(&h, job)
        .and_then(|r| r.detail)
        .unwrap_or_default();
    assert!(detail.contains("actions: write"), "{detail}");
}

/// The crash point `rerun_sending` (`executor/rerun.rs`) leaves the job's re-run journalled
/// `sending`, its request maybe sent. An agent started on that journal never sends it again;
/// the same journal left at `intended` (the crash one step earlier) sends it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_the_agent_died_sending_is_never_sent_again() {
    for (left_at, requests) in [(RerunState::Sending, 0), (RerunState::Intended, 1)] {
        // The first agent has no `rerun_on`: the test writes what it would have journalled.
        let mut h = Harness::new(Options::default()).await;
        h.fake.set_actions_write(h.installation, true);
        let job = killed_by(&mut h, "oom_killed").await;
        let journalled = journal_job(&h, job).expect("the job");
        let attempt = h
            .attempts()
            .into_iter()
            .find(|a| a.job_id == Some(journalled.job_id))
            .expect("the attempt");
        let attempts = Attempts::open(h.journal_path()).expect("the journal");
        let now = h.clock.now().get();
        assert!(
            attempts
                .intend_rerun(
                    &NewRerun {
                        job_id: journalled.job_id,
                        attempt_id: &attempt.attempt_id,
                        policy: "linux",
                        reason: "oom_killed",
                        repository: &journalled.repository,
                        run_id: journalled.run_id,
                        run_attempt: journalled.run_attempt,
                    },
                    UnixMs::new(now),
                )
                .expect("intended")
        );
        if left_at == RerunState::Sending {
            assert!(
                attempts
                    .advance_rerun(
                        journalled.job_id,
                        RerunState::Intended,
                        RerunState::Sending,
                        None,
                        UnixMs::new(now),
                    )
                    .expect("sending")
            );
        }
        drop(attempts);

        // The agent starts again, now with the policy: recovery first, then passes.
        h.set_reruns(rerun_on(&["oom_killed"]));
        h.restart();
        h.recover().await.expect("recovery");
        steps(&mut h, QUIET_STEPS).await;
        h.executor.settle_reruns().await;
        assert_eq!(rerun_requests(&h), requests, "left at {left_at:?}");
        let row = rerun_row(&h, job).expect("the re-run");
        let want = match left_at {
            RerunState::Sending => RerunState::Unknown,
            _ => RerunState::Sent,
        };
        assert_eq!(row.state, want, "left at {left_at:?}");
    }
}

async fn steps(h: &mut Harness, n: usize) {
    for _ in 0..n {
        h.step().await;
    }
}
