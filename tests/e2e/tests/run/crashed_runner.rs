//! `rm-agent run` when a runner dies in the middle of its job, as GitHub handles it: the job is
//! given up once the runner stops renewing its lock (conclusion `failure`, a `completed`
//! webhook) and the runner is listed offline; until then GitHub holds it busy (a DELETE answers
//! `422`). rm concludes the attempt, removes the registration once GitHub lets it, and cleans.

use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, LINUX, PolicySpec, REPO, reason_codes, wait_until};
use rm_fake_github::{CrashPoint, RunnerBehavior};

const LABELS: &[&str] = &["self-hosted", "linux"];
/// GitHub gives a job up after about ten minutes without a lock renewal
/// (`rm_fake_github::state::JOB_LOCK_TIMEOUT`); seconds here, so the test sees it happen.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_crashes_mid_job_has_its_job_failed_and_its_registration_removed() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_job_lock_timeout(LOCK_TIMEOUT);
    fleet.fake.set_runner_behavior(RunnerBehavior {
        crash: Some(CrashPoint::DuringJob),
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();

    wait_until(Duration::from_secs(60), "GitHub gave the job up", || {
        fleet.fake.abandoned_jobs().contains(&job)
    })
    .await;
    let given_up = fleet.fake.job(job).unwrap();
    assert_eq!(given_up.conclusion.as_deref(), Some("failure"));
    wait_until(Duration::from_secs(60), "the attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
    assert!(
        fleet.our_registrations().is_empty(),
        "registration left: {:?}",
        fleet.our_registrations()
    );
    // The deletion waited for GitHub: refused while the dead runner was still held busy, done
    // once GitHub had given its job up.
    let deletions: Vec<u16> = fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/actions/runners/"))
        .map(|r| r.status)
        .collect();
    assert_eq!(deletions.last(), Some(&204), "{deletions:?}");
    assert!(
        deletions[..deletions.len() - 1].iter().all(|s| *s == 422),
        "{deletions:?}"
    );
    // The journal has the job as GitHub ended it, and no other runner was started for it.
    wait_until(
        Duration::from_secs(30),
        "the job completed in the journal",
        || {
            let out = fleet.setup.run(&["jobs", "--json"]);
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|jobs| {
                    jobs.as_array()?
                        .iter()
                        .find(|j| j["job_id"] == job)
                        .map(|j| j["state"] == "completed")
                })
                .unwrap_or(false)
        },
    )
    .await;
    assert_eq!(
        fleet.attempts().len(),
        1,
        "a runner was started for a finished job"
    );
    // The end says what happened (issue 28): a crash mid-job, with the exit status the fake
    // runner exits with, not a completed job.
    let attempt = &fleet.attempts()[0];
    assert_eq!(
        attempt.reason.as_deref(),
        Some("runner_crashed"),
        "{attempt:?}"
    );
    assert!(
        attempt
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("exit status 3")),
        "{attempt:?}"
    );
    let explained = |when: &str| {
        let answer = fleet.explain(job);
        let codes = reason_codes(&answer);
        assert_eq!(answer["verdict"], "done", "{when}: {answer}");
        assert!(
            codes.iter().any(|c| c == "runner_crashed") && codes.iter().any(|c| c == "logs_kept"),
            "{when}: {answer}"
        );
        assert_eq!(answer["runner_end"]["reason"], "runner_crashed", "{when}");
        answer["runner_end"]["logs"].as_str().unwrap().to_owned()
    };
    let kept = explained("live");
    assert!(std::path::Path::new(&kept).is_dir(), "{kept}");
    // The kept logs hold the runner's own words about its crash.
    let logs = fleet.setup.run(&["logs", &job.to_string()]);
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("crashing on purpose during the job"),
        "{logs:?}"
    );
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
    assert_eq!(explained("with the agent stopped"), kept);
    // Without `rerun_on`, no re-run is asked for.
    assert!(rerun_requests(&fleet).is_empty());
}

/// The other side of the same rule: a live runner renews its lock, so a job that runs longer
/// than the lock timeout is its own to finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_longer_than_the_lock_timeout_is_kept_by_its_live_runner() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_job_lock_timeout(LOCK_TIMEOUT);
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: u64::try_from((LOCK_TIMEOUT * 2).as_millis()).unwrap(),
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "the job completed", || {
        fleet.completed(job)
    })
    .await;
    assert_eq!(
        fleet.fake.job(job).unwrap().conclusion.as_deref(),
        Some("success")
    );
    assert!(fleet.fake.abandoned_jobs().is_empty());
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
}

/// A ghost (issue 28): the runner's process lives on while its registration is gone (deleted
/// in GitHub's settings, or lost by GitHub): it can never take a job. It is stopped after
/// `runner.ghost_timeout` rather than at the idle timeout, and concluded `failed`/`ghost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_registration_vanished_is_stopped_as_a_ghost() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    let config = std::fs::read_to_string(fleet.setup.config()).unwrap();
    std::fs::write(
        fleet.setup.config(),
        config.replacen("[runner]\n", "[runner]\nghost_timeout = \"3s\"\n", 1),
    )
    .unwrap();
    assert!(
        std::fs::read_to_string(fleet.setup.config())
            .unwrap()
            .contains("ghost_timeout"),
        "the fleet's configuration has no [runner] section to extend"
    );
    // A runner that registers and then waits forever without asking for a job (so the fake's
    // job never reaches it).
    fleet.fake.set_runner_behavior(RunnerBehavior {
        hang: true,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "a runner idle", || {
        fleet
            .attempts()
            .iter()
            .any(|a| a.state == rm_journal::AttemptState::Idle)
    })
    .await;
    let name = fleet.attempts()[0].runner_name.clone();
    assert!(fleet.fake.delete_registration(&name));
    wait_until(Duration::from_secs(90), "the ghost concluded", || {
        fleet
            .attempts()
            .iter()
            .any(|a| a.runner_name == name && a.reason.as_deref() == Some("ghost"))
    })
    .await;
    let ghost = fleet
        .attempts()
        .into_iter()
        .find(|a| a.runner_name == name)
        .unwrap();
    assert_eq!(ghost.outcome, Some(rm_journal::AttemptOutcome::Failed));
    assert_eq!(
        ghost.stop_intent,
        Some(rm_journal::StopIntent::Ghost),
        "stopped as a ghost, intent first"
    );
    let _ = job;
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
}

/// The re-run requests the fake got: `POST .../actions/jobs/{id}/rerun`, with their statuses.
fn rerun_requests(fleet: &Fleet) -> Vec<(String, u16)> {
    fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/rerun"))
        .map(|r| (r.path.clone(), r.status))
        .collect()
}

/// A policy that re-runs jobs whose runner crashed (issue 28, `policy.rerun_on`).
const RERUNS: PolicySpec = PolicySpec {
    extra: "rerun_on = [\"runner_crashed\"]\n",
    ..LINUX
};

/// A fleet whose policy re-runs jobs whose runner crashed, its App allowed to re-run (`actions:
/// write`), GitHub giving a job up soon after its runner stops, and every runner crashing
/// mid-job.
async fn rerun_fleet() -> Fleet {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![RERUNS],
        ..FleetOptions::default()
    })
    .await;
    let installation = fleet.fake.add_org("acme");
    fleet.fake.set_actions_write(installation, true);
    fleet.fake.set_job_lock_timeout(LOCK_TIMEOUT);
    fleet.fake.set_runner_behavior(RunnerBehavior {
        crash: Some(CrashPoint::DuringJob),
        ..RunnerBehavior::default()
    });
    fleet
}

/// A bounded re-run through the real binary: the runner crashes mid-job, GitHub fails the job,
/// and the agent asks GitHub once to re-run it; the re-run's runner crashes too, and the bound
/// (`max_reruns` 1) asks no more. Exactly one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_runner_crashed_is_re_run_once_and_no_more() {
    let fleet = rerun_fleet().await;
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(90), "the job re-run", || {
        !fleet.fake.reruns().is_empty()
    })
    .await;
    let (rerun_of, second) = fleet.fake.reruns()[0];
    assert_eq!(rerun_of, job);
    // The re-run's runner crashes as well, and GitHub fails that job too.
    wait_until(Duration::from_secs(90), "the re-run job given up", || {
        fleet.fake.abandoned_jobs().contains(&second)
    })
    .await;
    wait_until(Duration::from_secs(60), "every attempt cleaned", || {
        fleet.all_cleaned() && fleet.attempts().len() == 2
    })
    .await;
    // Two scans of the re-run rule (every 5 s) after the second crash: still one request.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        rerun_requests(&fleet).len(),
        1,
        "{:?}",
        rerun_requests(&fleet)
    );
    let answer = fleet.explain(job);
    assert_eq!(answer["rerun"]["state"], "sent", "{answer}");
    let status = fleet.setup.run(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["reruns"]["sent"], 1, "{status}");
    let exit = agent.terminate();
    assert!(exit.success(), "drain exit status {exit}");
}

/// The crash point between journalling a re-run as being sent and sending it: the agent
/// SIGKILLs itself there; the agent started again never sends it (GitHub may or may not have
/// it: at most once), records it `unknown`, and `explain` says so. Never two requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_sending_a_re_run_never_sends_it_twice() {
    rm_e2e::agent_with("fault-injection");
    let fleet = rerun_fleet().await;
    let mut first = fleet
        .start_agent(&[("RM_FAULT_CRASH_AT", "rerun_sending")])
        .await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(90), "the agent to kill itself", || {
        first.exited()
    })
    .await;
    assert!(
        fleet
            .setup
            .logs()
            .contains("RM_FAULT_CRASH_AT=rerun_sending")
    );
    let second = fleet.start_agent(&[]).await;
    let journal = fleet.setup.journal();
    wait_until(
        Duration::from_secs(60),
        "the re-run recorded unknown",
        || {
            rm_journal::Reader::open(&journal)
                .ok()
                .and_then(|r| r.rerun_for_job(rm_vocab::JobId::new(job as i64)).ok())
                .flatten()
                .is_some_and(|r| r.state == rm_journal::RerunState::Unknown)
        },
    )
    .await;
    // Two scans of the re-run rule (every 5 s) later: nothing was sent.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(
        rerun_requests(&fleet).is_empty(),
        "{:?}",
        rerun_requests(&fleet)
    );
    let answer = fleet.explain(job);
    assert!(
        reason_codes(&answer).iter().any(|c| c == "rerun_unknown"),
        "{answer}"
    );
    let exit = second.terminate();
    assert!(exit.success(), "drain exit status {exit}");
}
