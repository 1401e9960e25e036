//! `rm-agent run` against GitHub's secondary rate limits: a limit GitHub answers in the middle
//! of a burst of registrations holds every request of the installation for as long as GitHub
//! said, nothing is retried into the wait, and every job of the burst is served after it.

use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, LINUX, PolicySpec, REPO, wait_until};
use rm_fake_github::auth::Caller;
use rm_fake_github::{RequestRecord, RunnerBehavior};

use crate::skip;

const LABELS: &[&str] = &["self-hosted", "linux"];
/// How long the fake's limit holds (its `retry-after`): well past the agent's first JIT retry
/// (1 s) and its polling and supervision rounds, so a request that ignored the wait would land
/// inside it, and past two of the status publisher's rounds (`status_file::PUBLISH_EVERY`,
/// 5 s), so `status` must have said it.
const LIMIT: Duration = Duration::from_secs(12);
/// Requests already on their way when the first limit answer was given arrive a little after
/// it and get the limit too; they were sent before the agent could know. Generous on two busy
/// cores, and far shorter than [`LIMIT`].
const IN_FLIGHT: Duration = Duration::from_secs(1);
/// Registrations GitHub serves before the limit falls.
const SERVED_BEFORE: u32 = 3;

fn jit(r: &RequestRecord) -> Option<String> {
    (r.method == "POST" && r.path.ends_with("/generate-jitconfig")).then(|| {
        r.body
            .as_ref()
            .and_then(|b| b["name"].as_str())
            .unwrap_or("")
            .to_owned()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_limit_in_the_middle_of_a_burst_is_waited_out_and_every_job_served() {
    let fleet = Fleet::start(FleetOptions {
        host_max: 8,
        policies: vec![PolicySpec {
            max_runners: 8,
            ..LINUX
        }],
        // Demand is advisory: a runner started for a job another runner took is a surplus,
        // stopped at its idle timeout (short here, so the test can see everything cleaned).
        idle_timeout: "5s",
        ..FleetOptions::default()
    })
    .await;
    let installation = fleet.fake.add_org("acme");
    let agent = fleet.start_agent(&[]).await;
    fleet
        .fake
        .secondary_limit_after("generate-jitconfig", SERVED_BEFORE, LIMIT, 403);
    let variants = ["1", "2", "3", "4", "5", "6", "7", "8"];
    let jobs = fleet
        .fake
        .queue_matrix(REPO, "test", LABELS, &variants)
        .unwrap();

    // While the limit holds, `status --json` says so (`github.rate_limited`), and `explain`
    // of a job still queued names it (CONTRACT §8 `rate_limited`).
    let mut said = None;
    let mut explained = None;
    let looking = std::time::Instant::now();
    while (said.is_none() || explained.is_none())
        && looking.elapsed() < LIMIT + Duration::from_secs(30)
    {
        let status = rm_e2e::json_stdout(&fleet.setup.run(&["status", "--json"]));
        if status["github"]["rate_limited"]["kind"] == "secondary" {
            said = Some(status["github"]["rate_limited"].clone());
        }
        for job in &jobs {
            let still_queued = fleet
                .fake
                .job(*job)
                .is_some_and(|j| j.status == rm_fake_github::JobStatus::Queued);
            if explained.is_some() || !still_queued {
                continue;
            }
            let out = fleet.setup.run(&["explain", &job.to_string(), "--json"]);
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if doc["verdict"] == "rate_limited" {
                assert_eq!(doc["reasons"][0]["code"], "rate_limited", "{doc}");
                explained = Some(doc);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let said = said.expect("status --json never said the installation was rate limited");
    explained.expect("explain never named the rate limit for a job still queued");
    assert!(
        said["until"].as_str().is_some_and(|u| u.ends_with('Z')),
        "{said}"
    );

    wait_until(Duration::from_secs(120), "every job completed", || {
        jobs.iter().all(|j| fleet.completed(*j))
    })
    .await;

    let ours: Vec<RequestRecord> = fleet
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.caller == Some(Caller::Installation(installation)))
        .collect();
    let first = ours
        .iter()
        .find(|r| r.secondary_limited())
        .expect("GitHub answered the limit")
        .clone();
    let retry_after: u64 = first
        .response_header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("with retry-after");
    let lifted = first.at + Duration::from_secs(retry_after);
    let sent_into_the_wait: Vec<String> = ours
        .iter()
        .filter(|r| r.at > first.at + IN_FLIGHT && r.at < lifted)
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    assert!(
        sent_into_the_wait.is_empty(),
        "requests sent while GitHub's limit held: {sent_into_the_wait:?}"
    );
    // What got the limit was on its way already: each registration once, none retried into it.
    let limited: Vec<&RequestRecord> = ours.iter().filter(|r| r.secondary_limited()).collect();
    let mut limited_names: Vec<String> = limited.iter().filter_map(|r| jit(r)).collect();
    let count = limited_names.len();
    limited_names.sort();
    limited_names.dedup();
    assert_eq!(
        count,
        limited_names.len(),
        "a registration was retried into the limit"
    );
    assert!(
        limited.iter().all(|r| r.at <= first.at + IN_FLIGHT),
        "a limited request left after the first limit answer"
    );
    // Every job was served: by registrations before the limit and after it, none lost.
    let served_after = ours
        .iter()
        .filter(|r| jit(r).is_some() && r.status == 201 && r.at >= lifted)
        .count();
    assert!(served_after >= 1, "no registration after the wait");
    let served = ours
        .iter()
        .filter(|r| jit(r).is_some() && r.status == 201)
        .count();
    assert!(
        served >= jobs.len(),
        "{served} registrations for {} jobs",
        jobs.len()
    );
    wait_until(Duration::from_secs(60), "every attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
}

/// A job past its policy's `memory_max` (issue 28): the kernel kills it in the runner's
/// cgroup, and the attempt ends `failed`/`oom_killed` from the cgroup's own count, with the
/// peak in its detail; `explain` says so. Needs the memory controller in the runner cgroups'
/// cgroup v2 (skipped by `RM_TEST_ALLOW_SKIP=memory-controller` where the host has none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_memory_max_ends_oom_killed() {
    let test = "limits::a_job_past_its_memory_max_ends_oom_killed";
    let controllers = rm_runner::cgroup::CgroupRoot::resolve(None)
        .map(|root| root.available())
        .ok();
    if !controllers.is_some_and(|c| c.memory) {
        skip::cannot_run(
            test,
            "memory-controller",
            "the runner cgroups' cgroup v2 offers no memory controller here",
        );
        return;
    }
    let fleet = Fleet::start(FleetOptions {
        policies: vec![PolicySpec {
            extra: "memory_max = \"64M\"\n",
            ..LINUX
        }],
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        exhaust_memory: true,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "eats memory", LABELS).unwrap();
    wait_until(
        Duration::from_secs(90),
        "an attempt ended oom_killed",
        || {
            fleet
                .attempts()
                .iter()
                .any(|a| a.reason.as_deref() == Some("oom_killed"))
        },
    )
    .await;
    let answer = fleet.explain(job);
    assert_eq!(answer["runner_end"]["reason"], "oom_killed", "{answer}");
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
}
