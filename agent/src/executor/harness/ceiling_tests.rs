//! The ceilings as the executor keeps them, through the harness: a policy's `max_runners`
//! counts its busy runners, whatever the host's room. The arithmetic is table-tested in
//! `allocation.rs`; these tests catch a ceiling the executor does not hand to it
//! (`.ci/mutants`: `policy-ceiling`, `policy-max-unread`).

use rm_fake_github::RunnerBehavior;

use super::*;

const LABELS: &[&str] = &["gpu"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_never_runs_past_its_max_runners_while_they_are_busy() {
    // Two GPUs on a host of 4: five long jobs run two at a time, and once both runners are
    // busy (no longer offsetting demand) the host's room must not start a third.
    let mut h = Harness::new(Options {
        max_runners: 4,
        policies: vec![policy("gpu", LABELS, 2)],
        ..Options::default()
    })
    .await;
    h.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 20_000,
        ..RunnerBehavior::default()
    });
    let jobs: Vec<u64> = (0..5)
        .map(|i| h.queue(&format!("gpu ({i})"), LABELS))
        .collect();
    let mut most = 0;
    h.until(
        "every job completed",
        |h| {
            let live = h.live();
            assert!(live <= 2, "{live} live runners for a policy of 2");
            most = most.max(live);
        },
        |h| jobs.iter().all(|j| h.completed(*j)),
    )
    .await;
    assert_eq!(most, 2, "the policy's 2 runners were used at once");
    h.until("every attempt cleaned", |_| {}, Harness::all_cleaned)
        .await;
    assert_eq!(h.attempts().len(), 5, "one runner per job");
}
