//! `rm-agent run` when things go wrong, through the real binary and the fake GitHub: a refused
//! JIT registration is final and names the permission; nothing a job started outlives its
//! runner; registrations under our prefix that no attempt owns are removed at start while other
//! runners are left alone; no runner starts before recovery could ask GitHub.

use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, HOST, LINUX, PolicySpec, REPO, wait_until};
use rm_fake_github::{FaultAction, RunnerBehavior};
use rm_journal::{AttemptOutcome, AttemptState};

const LABELS: &[&str] = &["self-hosted", "linux"];
/// The labels of a control policy, routed apart from [`LABELS`].
const CONTROL_LABELS: &[&str] = &["self-hosted", "control"];
/// How many JIT tries one launch makes before it fails (rm-agent's `MAX_JIT_TRIES`).
const CONTROL_JIT_TRIES: usize = 5;
/// How many failed recoveries prove the recovery gate holds: the first, then two retries
/// (rm-agent's `RECOVERY_RETRY`, 10 s, apart), so the wait is longer than a retry.
const RECOVERY_TRIES: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_final_and_names_the_missing_permission() {
    // A second policy on the repository is the control: its first launch fails the ordinary
    // way (GitHub answers 502 to each of the launch's JIT tries), so its next launch proves an
    // ordinary launch back-off (rm-agent's LAUNCH_BACKOFF) has run out since the refusal and
    // allocation has passed over the refused policy's still-queued job since: no fixed window.
    let control = PolicySpec {
        name: "control",
        target: REPO,
        labels: CONTROL_LABELS,
        ..LINUX
    };
    let fleet = Fleet::start(FleetOptions {
        policies: vec![LINUX, control],
        ..FleetOptions::default()
    })
    .await;
    let installation = fleet.fake.add_org("acme");
    // Organization runners refused (read only); repository runners allowed.
    fleet.fake.set_permissions(
        installation,
        &[
            ("organization_self_hosted_runners", "read"),
            ("administration", "write"),
            ("actions", "read"),
        ],
    );
    let _agent = fleet.start_agent(&[]).await;
    fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(30), "the launch concluded", || {
        fleet
            .attempts()
            .iter()
            .any(|a| a.policy == "linux" && a.state == AttemptState::Cleaned)
    })
    .await;
    fleet.fake.inject_fault(
        Some("POST"),
        "/repos/acme/widgets/actions/runners/generate-jitconfig",
        FaultAction::Status(502),
        CONTROL_JIT_TRIES,
    );
    let control_job = fleet
        .fake
        .queue_job(REPO, "control", CONTROL_LABELS)
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the control job served after its launch back-off",
        || fleet.completed(control_job) && fleet.all_cleaned(),
    )
    .await;
    let control_jit = fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.path == "/repos/acme/widgets/actions/runners/generate-jitconfig")
        .map(|r| r.status)
        .collect::<Vec<_>>();
    let mut expected = vec![502; CONTROL_JIT_TRIES];
    expected.push(201);
    assert_eq!(
        control_jit, expected,
        "the control's launch failed, the next served"
    );
    let control_attempts: Vec<_> = fleet
        .attempts()
        .into_iter()
        .filter(|a| a.policy == "control")
        .map(|a| a.outcome)
        .collect();
    assert_eq!(
        control_attempts,
        [
            Some(AttemptOutcome::CompletedJob),
            Some(AttemptOutcome::Failed)
        ],
        "newest first: one ordinary failed launch, then one served"
    );
    // The refused policy's job is still queued, and allocation has run past an ordinary
    // back-off: a 403 is not retried.
    let attempts: Vec<_> = fleet
        .attempts()
        .into_iter()
        .filter(|a| a.policy == "linux")
        .collect();
    assert_eq!(attempts.len(), 1, "a 403 is not retried");
    let org_jit = "/orgs/acme/actions/runners/generate-jitconfig";
    let org_jit = fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.path == org_jit)
        .count();
    assert_eq!(org_jit, 1);
    let attempt = &attempts[0];
    assert_eq!(attempt.outcome, Some(AttemptOutcome::Failed));
    assert_eq!(attempt.reason.as_deref(), Some("jit_request_failed"));
    let detail = attempt.detail.clone().unwrap_or_default();
    assert!(
        detail.contains("Self-hosted runners: Read and write"),
        "the detail names the permission: {detail}"
    );
    assert!(fleet.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_job_started_outlives_its_runner() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        fork_background: true,
        job_duration_ms: 1_500,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    let mut background: Option<u32> = None;
    wait_until(Duration::from_secs(30), "the background process", || {
        background = fleet.runtimes().iter().find_map(|rt| {
            std::fs::read_to_string(rt.join("_diag").join("background.pid"))
                .ok()?
                .trim()
                .parse()
                .ok()
        });
        background.is_some()
    })
    .await;
    // Its pid is the one the job saw, inside the runner's PID namespace: the host knows the
    // process by the runner's uid.
    assert!(background.is_some());
    let uid = fleet.attempts()[0]
        .uid
        .expect("an isolated runner has a uid");
    wait_until(Duration::from_secs(30), "the job done and cleaned", || {
        fleet.completed(job) && fleet.all_cleaned()
    })
    .await;
    // The background `sleep 300` died with the runner's namespace (or its process group).
    wait_until(
        Duration::from_secs(10),
        "the background process gone",
        || live_processes_of(uid) == 0,
    )
    .await;
    assert!(fleet.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_no_attempt_owns_are_removed_at_start_and_others_left_alone() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    let ours = format!("rm-{HOST}-0123456789ab");
    fleet
        .fake
        .generate_jitconfig("acme", &ours, LABELS)
        .unwrap();
    fleet
        .fake
        .generate_jitconfig("acme", "someone-elses-runner", LABELS)
        .unwrap();
    // Host `e2e-2`'s runner shares our `rm-e2e-` prefix: it is not ours (issue 12).
    let neighbours = format!("rm-{HOST}-2-0123456789ab");
    fleet
        .fake
        .generate_jitconfig("acme", &neighbours, LABELS)
        .unwrap();
    let _agent = fleet.start_agent(&[]).await;
    let names = || -> Vec<String> {
        let mut names: Vec<String> = fleet.fake.runners().into_iter().map(|r| r.name).collect();
        names.sort();
        names
    };
    wait_until(
        Duration::from_secs(20),
        "our stale registration removed",
        || !names().contains(&ours),
    )
    .await;
    assert_eq!(names(), [neighbours, "someone-elses-runner".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_runner_starts_before_recovery_could_ask_github() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    // GitHub's runner list fails: recovery cannot reconcile the inventory.
    fleet.fake.inject_fault(
        Some("GET"),
        "/actions/runners",
        FaultAction::Status(502),
        1_000,
    );
    let _agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    // No fixed window: wait until the poller has asked GitHub for queued runs (the agent's
    // first poll is done, so STARTUP_SYNC_WAIT holds nothing back) and recovery has failed
    // RECOVERY_TRIES times, RECOVERY_RETRY apart: the gate has held across two of its own
    // retries, with the job queued and the control loop free to run a pass at any time.
    let polled = || {
        fleet
            .fake
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path.ends_with("/actions/runs") && r.status == 200)
    };
    // One line per failed recovery ("... no runner is started until it completes").
    let recovery_failures = || fleet.setup.logs().matches("recovery is incomplete").count();
    wait_until(
        Duration::from_secs(90),
        "the first poll done and recovery failed RECOVERY_TRIES times",
        // A launch ends the wait too, for the assertion below to say so.
        || polled() && recovery_failures() >= RECOVERY_TRIES || fleet.jit_requests() > 0,
    )
    .await;
    assert_eq!(
        fleet.jit_requests(),
        0,
        "a runner was launched before recovery completed"
    );
    assert!(fleet.attempts().is_empty());
    assert!(
        fleet.setup.logs().contains("recovery is incomplete"),
        "the log says why nothing starts"
    );
    fleet.fake.clear_faults();
    wait_until(
        Duration::from_secs(40),
        "the job served after recovery",
        || fleet.completed(job),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_jit_answer_leads_to_a_409_that_removes_the_stale_registration() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    // GitHub registers the runner, but its answer never arrives.
    fleet.fake.inject_fault(
        Some("POST"),
        "/generate-jitconfig",
        FaultAction::DropAfter,
        1,
    );
    let _agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(40), "the job served", || {
        fleet.completed(job) && fleet.all_cleaned()
    })
    .await;
    let requests = fleet.fake.requests();
    let jit: Vec<u16> = requests
        .iter()
        .filter(|r| r.path.ends_with("/generate-jitconfig"))
        .map(|r| r.status)
        .collect();
    // Lost (recorded without a status), refused as a duplicate name, then issued.
    assert_eq!(jit, [0, 409, 201], "JIT answers");
    let deleted = requests
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/actions/runners/"))
        .count();
    assert!(deleted >= 1, "the stale registration was removed");
    let attempts = fleet.attempts();
    assert_eq!(attempts.len(), 1, "one attempt, retried under its own name");
    assert_eq!(attempts[0].outcome, Some(AttemptOutcome::CompletedJob));
    assert!(fleet.our_registrations().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_of_a_policy_removed_while_the_agent_was_down_does_not_block_recovery() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 4_000,
        ..RunnerBehavior::default()
    });
    let first = fleet.start_agent(&[]).await;
    let old_job = fleet.fake.queue_job(REPO, "old", LABELS).unwrap();
    wait_until(Duration::from_secs(30), "the runner busy", || {
        fleet.any_busy()
    })
    .await;
    first.kill();
    // The operator renames the policy while the agent is down.
    let mut options = FleetOptions::default();
    options.policies[0].name = "renamed";
    fleet.configure(&options);
    let _second = fleet.start_agent(&[]).await;
    let new_job = fleet.fake.queue_job(REPO, "new", LABELS).unwrap();
    wait_until(Duration::from_secs(40), "both jobs served", || {
        [old_job, new_job].iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned()
    })
    .await;
    let attempts = fleet.attempts();
    assert_eq!(attempts.len(), 2, "one runner per job");
    assert!(
        attempts
            .iter()
            .all(|a| a.outcome == Some(AttemptOutcome::CompletedJob)),
        "{attempts:?}"
    );
    assert!(fleet.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_that_keep_failing_to_start_are_told_to_the_operator() {
    use std::os::unix::fs::PermissionsExt as _;
    let fleet = Fleet::start(FleetOptions {
        desktop_notifications: true,
        ..FleetOptions::default()
    })
    .await;
    // A package whose runner cannot be executed: every launch fails at the spawn.
    let listener = fleet.package.join("bin").join("Runner.Listener");
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o644)).unwrap();
    // No desktop session: the notification is a logged no-op, never an error.
    let _agent = fleet.start_agent(&[("DBUS_SESSION_BUS_ADDRESS", "")]).await;
    fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    let failed = || {
        fleet
            .attempts()
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::Failed))
            .count()
    };
    // Back-off between launches: 5 s, then 10 s.
    wait_until(Duration::from_secs(40), "three failed launches", || {
        failed() >= 3
    })
    .await;
    wait_until(Duration::from_secs(10), "the operator told", || {
        fleet
            .setup
            .logs()
            .lines()
            .any(|l| l.contains("RunnersFailingToStart") && l.contains("not shown"))
    })
    .await;
    let logs = fleet.setup.logs();
    let told = logs
        .lines()
        .filter(|l| l.contains("RunnersFailingToStart"))
        .count();
    assert_eq!(told, 1, "one notification, then the rate limit: {logs}");
    // An attempt is counted failed when its outcome is journalled, before its registration is
    // removed; the rule is about what is left once every attempt is cleaned. The next launch
    // waits 20 s, long after the third attempt's cleanup.
    wait_until(
        Duration::from_secs(10),
        "every failed attempt cleaned",
        || fleet.all_cleaned(),
    )
    .await;
    assert!(
        fleet.our_registrations().is_empty(),
        "a failed launch left its registration"
    );
}

/// Processes running as `uid` that are not zombies (a zombie waiting for init to reap it is
/// dead too).
fn live_processes_of(uid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .filter(|status| {
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
            };
            field("Uid:").as_deref() == Some(uid.to_string().as_str())
                && field("State:").as_deref() != Some("Z")
        })
        .count()
}
