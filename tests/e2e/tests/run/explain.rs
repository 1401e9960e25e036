//! `rm-agent explain` end to end (CONTRACT §8), through the real binary and the fake GitHub: one
//! fleet, one agent, and a job per verdict it can be driven into there (no matching policy, at
//! capacity, waiting for GitHub, running, done, launch back-off after a failing package, GitHub
//! unreachable, rate limited, not seen), each explained with `--json` checked against the
//! contract's fields; then the agent is stopped and the jobs are explained again from the journal
//! and its last status. (`host_unfit` is the unit test
//! `explain::tests::host_unfit_names_the_fitness_gates_problems` until the fitness gate can be
//! driven here.)

use std::time::{Duration, Instant};

use rm_e2e::fleet::{Fleet, FleetOptions, LINUX, PolicySpec, REPO, wait_until};
use rm_fake_github::{FaultAction, RunnerBehavior};
use rm_journal::AttemptState;
use serde_json::Value;

const LABELS: &[&str] = &["self-hosted", "linux"];
/// A policy whose runner gets a job GitHub never gives it (the fake's vanishing job).
const WARM: PolicySpec = PolicySpec {
    name: "warm",
    target: REPO,
    labels: &["self-hosted", "warm"],
    max_runners: 1,
    workspace: "ephemeral",
    extra: "",
};
/// How long the running job runs: long enough to explain it, start the idle runner and explain
/// the job behind both.
const LONG_JOB_MS: u64 = 40_000;
/// How long each phase may take to show its verdict: generous on two busy cores.
const PHASE: Duration = Duration::from_secs(90);

/// `rm-agent explain JOB --json`: its exit code and document, checked against CONTRACT §8.
fn explain(fleet: &Fleet, job: u64) -> (i32, Value) {
    let out = fleet.setup.run(&["explain", &job.to_string(), "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "explain {job} --json printed no JSON ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(doc["job_id"], job, "{doc}");
    assert!(doc["state"].is_string() || doc["state"].is_null(), "{doc}");
    assert!(doc["verdict"].is_string(), "{doc}");
    assert!(
        doc["runner_name"].is_string() || doc["runner_name"].is_null(),
        "{doc}"
    );
    let reasons = doc["reasons"].as_array().expect("reasons");
    assert!(!reasons.is_empty(), "{doc}");
    for r in reasons {
        assert!(r["code"].is_string() && r["message"].is_string(), "{doc}");
    }
    (out.status.code().expect("an exit code"), doc)
}

/// Explains `job` until its verdict is `verdict` (bounded by [`PHASE`]); the document.
async fn explain_until(fleet: &Fleet, job: u64, verdict: &str) -> Value {
    let deadline = Instant::now() + PHASE;
    loop {
        let (code, doc) = explain(fleet, job);
        if doc["verdict"] == verdict {
            assert_eq!(code, 0, "{doc}");
            return doc;
        }
        assert!(
            Instant::now() < deadline,
            "job {job} never explained as {verdict}; last: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn codes(doc: &Value) -> Vec<String> {
    doc["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap().to_owned())
        .collect()
}

fn journalled(fleet: &Fleet, job: u64) -> bool {
    rm_journal::Reader::open(&fleet.setup.journal())
        .ok()
        .and_then(|r| {
            r.job(rm_vocab::JobId::try_from(job).unwrap())
                .ok()
                .flatten()
        })
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verdict_the_fake_can_produce_is_explained_live_and_after_a_stop() {
    let fleet = Fleet::start(FleetOptions {
        // The running job's runner and the idle one fill the host.
        host_max: 2,
        policies: vec![
            PolicySpec {
                max_runners: 1,
                ..LINUX
            },
            WARM,
        ],
        // The runner of the vanishing job idles out, so nothing runs on after the stop.
        idle_timeout: "30s",
        // The runtime is a copy of the package: a broken package fails the next launch.
        isolation: Some("none"),
        ..FleetOptions::default()
    })
    .await;
    let installation = fleet.fake.add_org("acme");
    let agent = fleet.start_agent(&[]).await;

    // Not seen: the journal has no such job (exit 1, the answer still printed).
    let (code, doc) = explain(&fleet, 987_654_321);
    assert_eq!(
        (code, doc["verdict"].as_str()),
        (1, Some("not_seen")),
        "{doc}"
    );
    assert_eq!(doc["state"], Value::Null);

    // Running; waiting for GitHub (a runner registered and idle, the job never given to it);
    // then the host is full (two runners) and the next job waits at its ceiling.
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: LONG_JOB_MS,
        ..RunnerBehavior::default()
    });
    let long = fleet.fake.queue_job(REPO, "long", LABELS).unwrap();
    let running = explain_until(&fleet, long, "running").await;
    let runner = running["runner_name"]
        .as_str()
        .expect("the runner")
        .to_owned();
    assert!(runner.starts_with("rm-e2e-"), "{running}");
    fleet.fake.set_runner_behavior(RunnerBehavior::default());
    let vanishing = fleet
        .fake
        .queue_vanishing_job(REPO, "vanishing", WARM.labels)
        .unwrap();
    let waiting = explain_until(&fleet, vanishing, "waiting_for_github").await;
    let idle_runner = waiting["runner_name"]
        .as_str()
        .expect("the idle runner")
        .to_owned();
    assert_eq!(codes(&waiting)[0], "runner_idle", "{waiting}");
    assert!(
        fleet
            .attempts()
            .iter()
            .any(|a| a.runner_name == idle_runner && a.state == AttemptState::Idle),
        "the runner named is idle: {waiting}"
    );
    let behind = fleet.fake.queue_job(REPO, "behind", LABELS).unwrap();
    let capacity = explain_until(&fleet, behind, "at_capacity").await;
    assert_eq!(codes(&capacity)[0], "host_capacity", "{capacity}");
    let message = capacity["reasons"][0]["message"].as_str().unwrap();
    assert!(
        message.contains(&runner) && message.contains(&idle_runner),
        "names the runners holding the ceiling: {capacity}"
    );
    assert_eq!(capacity["policy"], "linux");

    // No matching policy: the closest policy and the label it lacks are named.
    let gpu = fleet
        .fake
        .queue_job(REPO, "gpu", &["self-hosted", "linux", "gpu"])
        .unwrap();
    wait_until(PHASE, "the gpu job journalled", || journalled(&fleet, gpu)).await;
    let unmatched = explain_until(&fleet, gpu, "no_matching_policy").await;
    let message = unmatched["reasons"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("`linux`") && message.contains("lacks [gpu]"),
        "{unmatched}"
    );

    // `status` lists every queued job's verdict, and says the unmatched one in words.
    let status = rm_e2e::json_stdout(&fleet.setup.run(&["status", "--json"]));
    let listed = status["waiting"].as_array().expect("status --json waiting");
    assert!(
        listed
            .iter()
            .any(|w| w["job_id"] == gpu && w["verdict"] == "no_matching_policy"),
        "{status}"
    );
    let human = String::from_utf8(fleet.setup.run(&["status"]).stdout).unwrap();
    assert!(
        human.contains("waiting: no policy matches [gpu, linux, self-hosted]"),
        "{human}"
    );

    // Done: the long job completes, and the one behind it is served after it.
    let done = explain_until(&fleet, long, "done").await;
    assert_eq!(
        done["runner_name"].as_str(),
        Some(runner.as_str()),
        "{done}"
    );
    wait_until(PHASE, "the job behind served", || fleet.completed(behind)).await;

    // Launch back-off after a failing package: a top-level `_work` is refused at every launch.
    let broken = fleet.package.join("_work");
    std::fs::create_dir(&broken).unwrap();
    let after_broken = fleet.fake.queue_job(REPO, "broken", LABELS).unwrap();
    let backoff = explain_until(&fleet, after_broken, "launch_backoff").await;
    assert!(
        backoff["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("_work"),
        "names the last failure: {backoff}"
    );
    std::fs::remove_dir(&broken).unwrap();
    wait_until(PHASE, "the job served once the package is whole", || {
        fleet.completed(after_broken)
    })
    .await;

    // GitHub unreachable: every API request is dropped without an answer.
    fleet
        .fake
        .inject_fault(None, "", FaultAction::Drop, usize::MAX);
    let offline = fleet.fake.queue_job(REPO, "offline", LABELS).unwrap();
    let unreachable = explain_until(&fleet, offline, "github_unreachable").await;
    assert_eq!(
        codes(&unreachable)[0],
        "github_unreachable",
        "{unreachable}"
    );
    fleet.fake.clear_faults();
    wait_until(PHASE, "the job served once GitHub answers", || {
        fleet.completed(offline)
    })
    .await;

    // Rate limited: GitHub answers a secondary limit to every request for a while. First every
    // runner of the earlier phases must be gone: a surplus one still registered and idle (the
    // outage's retried launches can leave one) would take the job without a request, and the
    // job would never wait on the limit.
    wait_until(PHASE, "no runner left from the earlier phases", || {
        fleet.all_cleaned()
    })
    .await;
    fleet
        .fake
        .secondary_limit(Duration::from_secs(20), 403, true);
    let limited = fleet.fake.queue_job(REPO, "limited", LABELS).unwrap();
    let rate = explain_until(&fleet, limited, "rate_limited").await;
    assert!(
        rate["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("secondary"),
        "{rate}"
    );
    wait_until(PHASE, "the job served after the limit", || {
        fleet.completed(limited)
    })
    .await;

    // A refusal (403) backs the policy off for minutes: still so when the agent has stopped.
    fleet.fake.set_permissions(
        installation,
        &[
            ("organization_self_hosted_runners", "read"),
            ("administration", "write"),
            ("actions", "read"),
        ],
    );
    let refused = fleet.fake.queue_job(REPO, "refused", LABELS).unwrap();
    explain_until(&fleet, refused, "launch_backoff").await;
    // Nothing live is left to adopt: the vanishing job's runner has idled out.
    wait_until(PHASE, "no live runner", || {
        fleet
            .attempts()
            .iter()
            .all(|a| !a.state.counts_against_capacity())
    })
    .await;
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");

    // From the stopped agent: the journal's verdicts stand, the snapshot's are as of then, and
    // each queued job says no agent runs.
    let (code, doc) = explain(&fleet, long);
    assert_eq!((code, doc["verdict"].as_str()), (0, Some("done")), "{doc}");
    assert_eq!(doc["agent"]["running"], false, "{doc}");
    for (job, verdict) in [
        (gpu, "no_matching_policy"),
        (vanishing, "waiting_for_github"),
        (refused, "launch_backoff"),
    ] {
        let (code, doc) = explain(&fleet, job);
        assert_eq!((code, doc["verdict"].as_str()), (0, Some(verdict)), "{doc}");
        assert!(
            codes(&doc).iter().any(|c| c == "agent_stopped"),
            "says no agent runs: {doc}"
        );
    }
    let (code, doc) = explain(&fleet, 987_654_321);
    assert_eq!(
        (code, doc["verdict"].as_str()),
        (1, Some("not_seen")),
        "{doc}"
    );
    let human = fleet.setup.run(&["explain", &refused.to_string()]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("launch_backoff") && text.contains("No rm-agent is running"),
        "{text}"
    );
}
