//! `rm-agent status` and the agent's `/metrics` series, through the real binary and the fake
//! GitHub: while an agent runs, `status --json` has CONTRACT §3's shape with the live values the
//! agent published (pace, next poll, GitHub contact, rate limit) beside the journal's counts;
//! `/metrics` carries the GitHub, polling and webhook series; once the agent stops, `status`
//! says that no agent is running instead of showing the last snapshot as current.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, REPO, wait_until};
use rm_e2e::{SECRET, json_stdout};
use rm_fake_github::JobStatus;
use secrecy::ExposeSecret as _;
use serde_json::Value;

const LABELS: &[&str] = &["self-hosted", "linux"];
/// No policy of the fleet serves these: the job stays queued.
const WINDOWS: &[&str] = &["self-hosted", "windows"];

fn status(fleet: &Fleet) -> Value {
    json_stdout(&fleet.setup.run(&["status", "--json"]))
}

fn human(fleet: &Fleet) -> String {
    let output = fleet.setup.run(&["status"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// An RFC 3339 UTC time as the CLI prints them (`2025-01-02T03:04:05.678Z`).
fn is_time(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|s| s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_running_agent_and_says_when_it_is_gone() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    let agent = fleet.start_agent(&[]).await;
    let pid = agent.child.id();
    let served = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    let unserved = fleet.fake.queue_job(REPO, "on windows", WINDOWS).unwrap();
    wait_until(Duration::from_secs(60), "the linux job completed", || {
        fleet
            .fake
            .job(served)
            .is_some_and(|j| j.status == JobStatus::Completed)
    })
    .await;
    let mut s = Value::Null;
    wait_until(
        Duration::from_secs(30),
        "status shows the deliveries, the queued job, the served one done and a GitHub contact",
        || {
            s = status(&fleet);
            // The served job's `completed` delivery comes a little after the job ends (the
            // fake delays and reorders deliveries, as GitHub may).
            s["agent"]["running"] == true
                && s["jobs"]["queued"] == 1
                && s["jobs"]["in_progress"] == 0
                && s["webhooks"]["deliveries"].as_i64() >= Some(2)
                && s["runners"]["active"] == 0
                && !s["github"]["last_contact_at"].is_null()
        },
    )
    .await;
    assert!(fleet.fake.job(unserved).is_some());

    // CONTRACT §3's shape, with the values this fleet has.
    let webhooks = &s["webhooks"];
    assert!(is_time(&webhooks["last_delivery_at"]), "{s}");
    assert_eq!(webhooks["rejected"], 0, "{s}");
    assert_eq!(webhooks["healthy"], true, "{s}");
    let polling = &s["polling"];
    assert!(polling["pace"].is_string(), "{s}");
    assert!(polling["next_poll_in_ms"].is_u64(), "{s}");
    assert!(
        polling["requests_last_hour"]["charged"].as_u64() > Some(0),
        "{s}"
    );
    let github = &s["github"];
    assert_eq!(github["reachable"], true, "{s}");
    assert!(is_time(&github["last_contact_at"]), "{s}");
    let rate = &github["rate_limit"];
    assert_eq!(rate["limit"], 5000, "{s}");
    assert!(rate["remaining"].as_u64().is_some_and(|r| r < 5000), "{s}");
    assert!(
        rate["reset_at"].is_null() || is_time(&rate["reset_at"]),
        "{s}"
    );
    assert_eq!(s["jobs"]["in_progress"], 0, "{s}");
    assert_eq!(s["runners"]["capacity"], 4, "{s}");
    // The extras: who runs, and where the queue goes.
    assert_eq!(s["agent"]["pid"], pid, "{s}");
    assert_eq!(
        s["jobs"]["queued_per_policy"],
        serde_json::json!({"linux": 0})
    );
    assert_eq!(s["jobs"]["queued_unmatched"], 1, "{s}");
    assert_eq!(s["degraded"], serde_json::json!([]), "{s}");

    let text = human(&fleet);
    assert!(
        text.contains(&format!("agent     running (pid {pid})")),
        "{text}"
    );
    assert!(text.contains("1 queued match no policy here"), "{text}");
    assert!(text.contains("All is well."), "{text}");

    // The snapshot the agent publishes: the agent's alone (it names every job), no secret in it.
    let file = fleet.setup.dir.path().join("data").join("status.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let published = std::fs::read_to_string(&file).unwrap();
    assert!(!published.contains(SECRET));
    assert!(!published.contains("PRIVATE KEY"));
    assert!(!published.contains(fleet.key.private_pem.expose_secret().trim()));

    // `/metrics`: the agent's series beside the receiver's own.
    let (code, metrics) = agent.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    for series in [
        "rm_github_requests_total{endpoint=\"",
        "rm_github_rate_limit_remaining ",
        "rm_polling_next_poll_seconds ",
        "rm_polling_pace{pace=\"",
        "rm_github_requests_last_hour{charged=\"true\"} ",
        "rm_github_requests_last_hour{charged=\"false\"} ",
        "rm_webhooks_trusted 1",
        "rm_deliveries_total{event=\"workflow_job\",outcome=\"applied\"} ",
        "rm_jobs{state=\"queued\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(series)),
            "{series:?} missing in\n{metrics}"
        );
    }
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "rm_github_requests_total{endpoint=\"orgs.runners.jit\",status=\"201\"} 1"
        )),
        "the JIT registration is counted:\n{metrics}"
    );

    // Stopped: the snapshot stays, but nothing in it is shown as current.
    assert!(agent.terminate().success());
    let s = status(&fleet);
    assert_eq!(s["agent"]["running"], false, "{s}");
    assert_eq!(s["agent"]["pid"], Value::Null, "{s}");
    assert_eq!(s["webhooks"]["healthy"], false, "{s}");
    assert_eq!(s["polling"]["pace"], Value::Null, "{s}");
    assert_eq!(s["polling"]["next_poll_in_ms"], Value::Null, "{s}");
    assert_eq!(s["github"]["reachable"], Value::Null, "{s}");
    assert!(is_time(&s["github"]["last_contact_at"]), "{s}");
    assert_eq!(s["jobs"]["queued"], 1, "{s}");
    let degraded = s["degraded"][0].as_str().unwrap();
    assert!(
        degraded.starts_with("No rm-agent is running for "),
        "{degraded}"
    );
    assert!(degraded.contains("`rm-agent run`"), "{degraded}");
    let text = human(&fleet);
    assert!(text.contains("agent     not running\n"), "{text}");
    assert!(text.contains("Needs attention:"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_when_only_the_receiver_runs() {
    let setup = rm_e2e::Setup::new();
    let receiver = setup.start_receiver().await;
    let s = json_stdout(&setup.run(&["status", "--json"]));
    assert_eq!(s["agent"]["running"], false, "{s}");
    assert_eq!(s["agent"]["pid"], receiver.child.id(), "{s}");
    assert_eq!(s["polling"]["pace"], Value::Null, "{s}");
    let degraded = s["degraded"][0].as_str().unwrap();
    assert!(degraded.contains("`rm-agent receive`"), "{degraded}");
    assert!(
        degraded.contains("Stop it and start `rm-agent run`"),
        "{degraded}"
    );
}
