//! `policy.min_runners` through `rm-agent run`, the fake GitHub and the fake runner package:
//! what docs/configuration.md promises of it ("runners kept warm": a job starts on a runner
//! that is already registered and waiting, each replaced after its job) and what
//! `runner.idle_timeout` does to them ("a registered runner that got no job by then is
//! stopped": the warm ones too, and the policy starts others). The plan's arithmetic is tested
//! in `agent/src/allocation.rs` and `agent/src/executor/plan/tests.rs`; these show it from the
//! outside, by what GitHub (the fake) lists.

use std::collections::BTreeSet;
use std::time::Duration;

use rm_e2e::fleet::{CONTROL, Fleet, FleetOptions, HOST, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState, StopIntent};

/// The warm policy's labels; [`CONTROL`]'s have `control` instead of `linux`, so a runner's
/// labels tell the two apart at the fake.
const LABELS: &[&str] = &["self-hosted", "linux"];

/// How many runners the policy keeps warm.
const MIN: usize = 2;

/// A policy keeping [`MIN`] runners warm, with room for more (a job's runner beside them).
const WARM: PolicySpec = PolicySpec {
    name: "warm",
    target: REPO,
    labels: LABELS,
    max_runners: 4,
    workspace: "ephemeral",
    extra: "min_runners = 2\n",
};

/// How long the warm runners take to come up (package copy, registration, first poll).
const COME_UP: Duration = Duration::from_secs(20);

/// The names of the warm policy's runners GitHub (the fake) lists online and not busy: the
/// runners a queued job can start on at once.
fn waiting(fleet: &Fleet) -> BTreeSet<String> {
    let prefix = format!("rm-{HOST}-");
    fleet
        .fake
        .runners()
        .into_iter()
        .filter(|r| {
            r.name.starts_with(&prefix)
                && r.labels.iter().any(|l| l == "linux")
                && r.online
                && !r.busy
                && r.job_done_at.is_none()
        })
        .map(|r| r.name)
        .collect()
}

/// The JIT registrations the agent asked for the warm policy (by their labels), with when the
/// fake answered each.
fn warm_registrations(fleet: &Fleet) -> Vec<(String, std::time::SystemTime)> {
    fleet
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .filter_map(|r| {
            let body = r.body?;
            let linux = body["labels"]
                .as_array()?
                .iter()
                .any(|l| l.as_str() == Some("linux"));
            linux.then(|| (body["name"].as_str().unwrap_or_default().to_owned(), r.at))
        })
        .collect()
}

fn warm_attempts(fleet: &Fleet) -> Vec<AttemptRecord> {
    fleet
        .attempts()
        .into_iter()
        .filter(|a| a.policy == WARM.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_runners_are_registered_and_waiting_a_job_starts_on_one_and_it_is_replaced() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![WARM, CONTROL],
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_500,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    // The most warm runners GitHub listed waiting at once, over every sample of the test.
    let mut most_waiting = 0;
    let mut sample = |fleet: &Fleet| {
        let now = waiting(fleet);
        most_waiting = most_waiting.max(now.len());
        now
    };

    // No job queued: two runners come up registered and waiting.
    let mut warm = BTreeSet::new();
    wait_until(COME_UP, "two warm runners listed online and idle", || {
        warm = sample(&fleet);
        warm.len() == MIN
    })
    .await;

    // And stay two: a job of another policy, queued now, is served by a pass that weighed the
    // warm policy too (a positive event in place of a quiet window); no third warm runner.
    let control = fleet
        .fake
        .queue_job(REPO, "control", CONTROL.labels)
        .unwrap();
    wait_until(Duration::from_secs(20), "the control job completed", || {
        sample(&fleet);
        fleet.completed(control)
    })
    .await;
    assert_eq!(sample(&fleet), warm, "the warm runners changed with no job");
    assert_eq!(warm_registrations(&fleet).len(), MIN, "warm registrations");
    // The journal follows the fake: a runner the fake lists online is `idle` in the journal
    // once supervision has seen its registration (a pass later, at most).
    wait_until(
        Duration::from_secs(20),
        "both warm attempts idle in the journal",
        || {
            warm_attempts(&fleet)
                .iter()
                .all(|a| a.state == AttemptState::Idle)
        },
    )
    .await;

    // A queued job starts on one of them: no registration made for it before it ran.
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(20), "the job completed", || {
        sample(&fleet);
        fleet.completed(job)
    })
    .await;
    let ran = fleet.fake.job(job).unwrap();
    let taker = ran.runner_name.clone().unwrap();
    assert!(
        warm.contains(&taker),
        "the job ran on {taker}, not on a warm runner ({warm:?})"
    );
    let started_at = ran.started_at.unwrap();
    let before_start: Vec<String> = warm_registrations(&fleet)
        .into_iter()
        .filter(|(_, at)| *at <= started_at)
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        before_start.into_iter().collect::<BTreeSet<_>>(),
        warm,
        "registrations made before the job started"
    );

    // Then the policy is back at two waiting: the one left and a new one, the taker gone
    // (concluded, cleaned, its registration deleted).
    let mut now_waiting = BTreeSet::new();
    wait_until(
        Duration::from_secs(20),
        "two warm runners waiting again, the job's runner cleaned",
        || {
            now_waiting = sample(&fleet);
            now_waiting.len() == MIN
                && !now_waiting.contains(&taker)
                && warm_attempts(&fleet)
                    .iter()
                    .any(|a| a.runner_name == taker && a.state == AttemptState::Cleaned)
        },
    )
    .await;
    let kept: BTreeSet<String> = warm.iter().filter(|n| **n != taker).cloned().collect();
    assert!(
        kept.is_subset(&now_waiting),
        "the warm runner that got no job was replaced: {now_waiting:?} against {warm:?}"
    );
    let registrations = warm_registrations(&fleet);
    assert_eq!(
        registrations.len(),
        MIN + 1,
        "one registration replaces the job's runner: {registrations:?}"
    );
    let attempts = warm_attempts(&fleet);
    let took = attempts.iter().find(|a| a.runner_name == taker).unwrap();
    assert_eq!(took.outcome, Some(AttemptOutcome::CompletedJob));
    assert_eq!(took.job_id, rm_vocab::JobId::try_from(job).ok());
    assert!(
        !fleet.fake.runners().iter().any(|r| r.name == taker),
        "the job's runner is still registered"
    );
    assert!(
        most_waiting <= MIN,
        "{most_waiting} warm runners waiting at once, above min_runners"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_runners_that_get_no_job_are_stopped_at_the_idle_timeout_and_replaced() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![WARM],
        idle_timeout: "4s",
        ..FleetOptions::default()
    })
    .await;
    let _agent = fleet.start_agent(&[]).await;
    let mut first = BTreeSet::new();
    wait_until(COME_UP, "two warm runners listed online and idle", || {
        first = waiting(&fleet);
        first.len() == MIN
    })
    .await;

    // `runner.idle_timeout` holds for them too: each is stopped when its idle time is up, an
    // idle exit, and the policy starts another, so two are waiting again, both new.
    let mut second = BTreeSet::new();
    wait_until(
        Duration::from_secs(25),
        "the first two stopped at the idle timeout and two new ones waiting",
        || {
            second = waiting(&fleet);
            second.len() == MIN
                && second.is_disjoint(&first)
                && warm_attempts(&fleet)
                    .iter()
                    .filter(|a| first.contains(&a.runner_name))
                    .all(|a| a.state == AttemptState::Cleaned)
        },
    )
    .await;
    for attempt in warm_attempts(&fleet)
        .iter()
        .filter(|a| first.contains(&a.runner_name))
    {
        assert_eq!(attempt.stop_intent, Some(StopIntent::IdleTimeout));
        assert_eq!(attempt.outcome, Some(AttemptOutcome::IdleExit));
        assert!(
            !fleet
                .fake
                .runners()
                .iter()
                .any(|r| r.name == attempt.runner_name),
            "{} is still registered",
            attempt.runner_name
        );
    }
    // One registration for each runner stopped, and no more.
    let names: BTreeSet<String> = warm_registrations(&fleet)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names, first.union(&second).cloned().collect());
}
