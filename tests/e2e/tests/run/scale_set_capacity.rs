//! A scale set's capacity end to end (issue 29, `github-scale-sets.md` §6.6 scenarios 14 and
//! 2), through the real binary against the fake broker and the fake runner: each poll's
//! `X-ScaleSetMaxCapacity` is what this host can take now (`rm_agent::scaleset::capacity`).
//! A host whose slots another policy's busy runners hold sends 0, so the scale set's jobs are
//! not assigned to it and get no runner until those runners end; a burst on a small host,
//! its messages truncated, gets exactly one runner per job and never more assigned jobs or
//! live runners than the host's ceiling.

use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, LINUX, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_fake_github::broker::JobState;
use rm_journal::AttemptState;

use super::scale_set::{SCALE_SET, assert_served_once, jobs_done, scale_set_id};

/// The policy whose runners serve the scale set: its own ceiling above the host's, so the
/// host is what bounds it.
const BIG: PolicySpec = PolicySpec {
    name: "big",
    target: "acme",
    labels: &["acme-big"],
    max_runners: 40,
    workspace: "ephemeral",
    extra: "",
};

fn options(host_max: u32, policies: Vec<PolicySpec>) -> FleetOptions {
    FleetOptions {
        host_max,
        policies,
        tail: format!("\n[[scale_set]]\nname = \"{SCALE_SET}\"\npolicy = \"big\"\n"),
        ..FleetOptions::default()
    }
}

/// Waits until the fake broker's last poll of set `id` said `capacity`.
async fn polled_capacity(fleet: &Fleet, id: u64, capacity: u64) {
    wait_until(
        Duration::from_secs(30),
        &format!("a poll with capacity {capacity}"),
        || fleet.fake.scale_set_capacity(id) == Some(capacity),
    )
    .await;
}

/// Waits until set `id` was polled twice more: the listener has sent the capacity the
/// allocation pass published before this call.
async fn polled_again(fleet: &Fleet) {
    let polls = fleet.fake.broker_calls("GET", "/scalesets/message");
    wait_until(Duration::from_secs(30), "two more polls", || {
        fleet.fake.broker_calls("GET", "/scalesets/message") >= polls + 2
    })
    .await;
}

/// The scale set's jobs assigned and not finished, as the fake broker holds them.
fn unfinished(fleet: &Fleet, id: u64) -> usize {
    fleet
        .fake
        .scale_set_jobs(id)
        .iter()
        .filter(|(_, j)| matches!(j.state, JobState::Assigned | JobState::Running))
        .count()
}

/// The journal's live attempts (those that count against the host's ceiling).
fn live(fleet: &Fleet) -> usize {
    fleet
        .attempts()
        .iter()
        .filter(|a| AttemptState::LIVE.contains(&a.state))
        .count()
}

/// The scale set's capacity in `status --json` (`null` when not published).
fn status_capacity(fleet: &Fleet) -> serde_json::Value {
    let out = fleet.setup.run(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    status["scale_sets"][0]["capacity"].clone()
}

/// Scenario 14: both of the host's slots are held by a webhook policy's busy runners, so the
/// scale set's polls say capacity 0: its jobs queued meanwhile are not assigned by the broker
/// and no runner starts for them. Once a webhook runner ends, the capacity comes back (a slot
/// at a time) and every scale-set job is served once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_full_of_other_runners_sends_capacity_0_until_they_end() {
    let fleet = Fleet::start(options(2, vec![LINUX, BIG])).await;
    // The webhook runners take long; the scale set's, registered after them, do not.
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 10_000,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    // An idle host: the scale set may have both slots.
    polled_capacity(&fleet, id, 2).await;

    let webhook: Vec<u64> = ["long 1", "long 2"]
        .iter()
        .map(|name| {
            fleet
                .fake
                .queue_job(REPO, name, &["self-hosted", "linux"])
                .unwrap()
        })
        .collect();
    wait_until(Duration::from_secs(60), "both webhook runners busy", || {
        fleet
            .attempts()
            .iter()
            .filter(|a| a.policy == LINUX.name && a.state == AttemptState::Busy)
            .count()
            == 2
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior::default());
    // Their attempts were journalled (and counted by the pass that started them) before they
    // were busy.
    polled_again(&fleet).await;

    let jobs = fleet
        .fake
        .queue_scale_set_jobs(id, &["full 1", "full 2", "full 3"])
        .unwrap();
    // While the webhook runners run, the broker assigns none of them and no runner starts.
    // Each sample is read before asking whether a webhook job is done: if none is, the host
    // was still full when it was read.
    let mut samples = 0;
    loop {
        let states: Vec<JobState> = jobs
            .iter()
            .map(|j| fleet.fake.scale_set_job(*j).unwrap().state)
            .collect();
        let started = fleet.attempts().iter().any(|a| a.policy == BIG.name);
        let capacity = fleet.fake.scale_set_capacity(id);
        if webhook.iter().any(|j| fleet.completed(*j)) {
            break;
        }
        assert_eq!(capacity, Some(0), "the capacity polled on a full host");
        assert!(
            states.iter().all(|s| *s == JobState::Queued),
            "assigned with no room on the host: {states:?}"
        );
        assert!(
            !started,
            "a runner of the scale set's policy started on a full host"
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(samples > 10, "the host was full too briefly to tell");

    wait_until(
        Duration::from_secs(120),
        "the scale set's jobs done once the host had room",
        || jobs_done(&fleet, &jobs),
    )
    .await;
    assert_served_once(&fleet, id, &jobs, false, 0).await;
    // An idle host again: the capacity is the host's, in the broker and in `status`.
    polled_capacity(&fleet, id, 2).await;
    let mut shown = serde_json::Value::Null;
    wait_until(Duration::from_secs(30), "status shows capacity 2", || {
        shown = status_capacity(&fleet);
        shown == 2
    })
    .await;
}

/// Scenario 2: a burst of 40 jobs on a host of 4 slots (the policy's own ceiling 40), the
/// broker's messages truncated at 3 jobs: the broker never has more than 4 of them assigned
/// and unfinished at once, the host never more than 4 live runners, every job gets exactly
/// one runner, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_small_host_gets_one_runner_per_job_and_no_more_than_the_host_allows() {
    let fleet = Fleet::start(options(4, vec![BIG])).await;
    fleet.fake.set_scale_set_jobs_per_message(3);
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    // Polled after the first allocation pass (before it: 0).
    wait_until(Duration::from_secs(30), "a poll with room", || {
        fleet.fake.scale_set_capacity(id).is_some_and(|c| c > 0)
    })
    .await;

    let names: Vec<String> = (1..=40).map(|n| format!("burst {n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let jobs = fleet.fake.queue_scale_set_jobs(id, &names).unwrap();
    let (mut most_assigned, mut most_live) = (0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !jobs_done(&fleet, &jobs) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the burst not done: {} of 40",
            jobs.iter()
                .filter(|j| fleet.fake.scale_set_job(**j).unwrap().state == JobState::Completed)
                .count()
        );
        most_assigned = most_assigned.max(unfinished(&fleet, id));
        most_live = most_live.max(live(&fleet));
        assert!(
            most_assigned <= 4,
            "{most_assigned} jobs assigned at once on a host of 4"
        );
        assert!(most_live <= 4, "{most_live} live runners on a host of 4");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The host was used, not trickled: several runners at once.
    assert!(most_live >= 2, "at most {most_live} live runners at once");
    // No surplus runner (one would wait for its idle timeout): as many as jobs.
    let runners = fleet
        .attempts()
        .iter()
        .filter(|a| a.policy == BIG.name)
        .count();
    assert_eq!(runners, jobs.len(), "runners for 40 jobs");
    assert_served_once(&fleet, id, &jobs, false, 0).await;
    // The messages came truncated: none carried more than 3 job messages, and the assignments
    // alone took more than one.
    let conn = rusqlite::Connection::open(fleet.setup.journal()).unwrap();
    let sizes: Vec<usize> = conn
        .prepare("SELECT events FROM scale_set_messages WHERE scale_set = ?1")
        .unwrap()
        .query_map([SCALE_SET], |row| row.get::<_, String>(0))
        .unwrap()
        .map(|row| {
            serde_json::from_str::<Vec<serde_json::Value>>(&row.unwrap())
                .unwrap()
                .len()
        })
        .collect();
    assert!(sizes.iter().all(|n| *n <= 3), "{sizes:?}");
    assert!(sizes.len() >= 40, "{} messages for 120 events", sizes.len());
}

/// The host takes no new runner while it is unfit (here: a required tool is missing), so the
/// scale set's polls say capacity 0 and its jobs wait unassigned, with no runner; once the tool
/// is installed the same agent finds the host fit, the capacity comes back and every job is
/// served once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfit_host_sends_capacity_0_until_it_is_fit_again() {
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("required-tool");
    let fleet = Fleet::start(FleetOptions {
        host_extra: format!("required_tools = [\"{}\"]\n", tool.display()),
        ..options(4, vec![BIG])
    })
    .await;
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    wait_until(Duration::from_secs(60), "status says unfit", || {
        let out = fleet.setup.run(&["status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        status["host"]["fit"] == false
    })
    .await;
    polled_again(&fleet).await;
    assert_eq!(
        fleet.fake.scale_set_capacity(id),
        Some(0),
        "the capacity polled on an unfit host"
    );
    let jobs = fleet
        .fake
        .queue_scale_set_jobs(id, &["unfit 1", "unfit 2"])
        .unwrap();
    // A few passes and polls: nothing assigned, no runner.
    for _ in 0..20 {
        assert_eq!(fleet.fake.scale_set_capacity(id), Some(0));
        for job in &jobs {
            assert_eq!(
                fleet.fake.scale_set_job(*job).unwrap().state,
                JobState::Queued
            );
        }
        assert!(fleet.attempts().is_empty(), "a runner on an unfit host");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(Duration::from_secs(30), "status shows capacity 0", || {
        status_capacity(&fleet) == 0
    })
    .await;

    std::fs::write(&tool, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    wait_until(
        Duration::from_secs(120),
        "the jobs done once the host is fit",
        || jobs_done(&fleet, &jobs),
    )
    .await;
    assert_served_once(&fleet, id, &jobs, false, 0).await;
    polled_capacity(&fleet, id, 4).await;
}

/// A poll held while the capacity changes is cut short and sent again with the new one: with
/// the broker holding polls 30 s, a slot a webhook runner takes reaches the broker as a lower
/// capacity within seconds, not at the end of the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_change_reaches_the_broker_while_it_holds_the_poll() {
    let fleet = Fleet::start(options(2, vec![LINUX, BIG])).await;
    fleet.fake.set_poll_hold(Duration::from_secs(30));
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 5_000,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    // The first poll may have gone out before the first allocation pass (capacity 0).
    wait_until(
        Duration::from_secs(10),
        "capacity 2 while polls are held 30 s",
        || fleet.fake.scale_set_capacity(id) == Some(2),
    )
    .await;
    let webhook = fleet
        .fake
        .queue_job(REPO, "takes a slot", &["self-hosted", "linux"])
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "capacity 1 while polls are held 30 s",
        || fleet.fake.scale_set_capacity(id) == Some(1),
    )
    .await;
    wait_until(Duration::from_secs(60), "the webhook job done", || {
        fleet.completed(webhook)
    })
    .await;
}
