//! A `[[scale_set]]` end to end (issue 29), through the real binary against the fake broker and
//! the fake runner: the scale set created by the agent, jobs queued while it was down served at
//! its next start from the session's statistics (a cold start), each job by exactly one runner
//! registered through the scale set's JIT endpoint, the job's webhook twin served by nobody,
//! every runner removed through the service, nothing left on disk; no message lost or handled
//! twice when the agent is SIGKILLed on either side of a message's journal write; a
//! `JobCompleted` that comes early never stops the runner still running the job.

use std::time::{Duration, SystemTime};

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_fake_github::broker::JobState;
use rm_fake_github::{RequestKind, RunnerBehavior};
use rm_journal::AttemptOutcome;

pub(crate) const SCALE_SET: &str = "acme-big";

/// The policy whose runners serve the scale set. Its `target` is required by the file's
/// format; an enterprise scale set does not live there.
pub(crate) const BIG: PolicySpec = PolicySpec {
    name: "big",
    target: "acme",
    labels: &["acme-big"],
    max_runners: 4,
    workspace: "ephemeral",
    extra: "",
};

fn options() -> FleetOptions {
    FleetOptions {
        policies: vec![BIG],
        tail: format!("\n[[scale_set]]\nname = \"{SCALE_SET}\"\npolicy = \"big\"\n"),
        ..FleetOptions::default()
    }
}

/// The scale set's id, once the agent journalled it.
pub(crate) async fn scale_set_id(fleet: &Fleet) -> u64 {
    let mut id = None;
    wait_until(
        Duration::from_secs(60),
        "the scale set found or created",
        || {
            id = rm_journal::ScaleSets::open(&fleet.setup.journal())
                .ok()
                .and_then(|j| j.get(SCALE_SET).ok().flatten())
                .and_then(|r| r.scale_set_id);
            id.is_some()
        },
    )
    .await;
    u64::try_from(id.unwrap()).unwrap()
}

/// A REST endpoint called for credentials alone (the installation and its token, the
/// registration token the Actions service is reached with), or the App's webhook deliveries
/// (the webhook source's recovery of failed deliveries, which asks about the App, not about a
/// target's runners).
fn credentials(endpoint: &str) -> bool {
    [
        "/installation",
        "access_tokens",
        "registration-token",
        "runner-registration",
        "/app/hook/deliveries",
    ]
    .iter()
    .any(|c| endpoint.contains(c))
}

pub(crate) fn jobs_done(fleet: &Fleet, jobs: &[u64]) -> bool {
    jobs.iter().all(|j| {
        fleet
            .fake
            .scale_set_job(*j)
            .is_some_and(|job| job.state == JobState::Completed)
    })
}

/// Every job ran on a runner of its own, each an attempt of this agent that completed it;
/// every attempt is cleaned, no scale-set runner is left registered and no runtime on disk.
async fn assert_one_runner_each_and_nothing_left(fleet: &Fleet, id: u64, jobs: &[u64]) {
    assert_served_once(fleet, id, jobs, false, 0).await;
}

/// [`assert_one_runner_each_and_nothing_left`]; with `reassigned`, a job's `JobAssigned` and
/// a `JobCompleted` `canceled` may come again (the service cancelled and assigned it again),
/// but it starts and completes (any other result) once. `crashed` more attempts than jobs
/// are expected: launches the agent died in, concluded at its next start without a job.
pub(crate) async fn assert_served_once(
    fleet: &Fleet,
    id: u64,
    jobs: &[u64],
    reassigned: bool,
    crashed: usize,
) {
    wait_until(
        Duration::from_secs(120),
        "every runner cleaned and removed",
        || fleet.all_cleaned() && fleet.fake.scale_set_runners(id).is_empty(),
    )
    .await;
    // The scale set's policy's attempts (a webhook policy beside it has its own).
    let attempts: Vec<_> = fleet
        .attempts()
        .into_iter()
        .filter(|a| a.policy == BIG.name)
        .collect();
    let summary: Vec<String> = attempts
        .iter()
        .map(|a| format!("{} {:?} {:?}", a.runner_name, a.outcome, a.reason))
        .collect();
    assert_eq!(
        attempts.len(),
        jobs.len() + crashed,
        "one runner per job: {summary:?}"
    );
    assert_eq!(
        attempts
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::CompletedJob))
            .count(),
        jobs.len(),
        "one runner per job: {summary:?}"
    );
    // A job of a scale set deleted since is known by the journal alone.
    let journalled_jobs = rm_journal::ScaleSets::open(&fleet.setup.journal())
        .unwrap()
        .jobs(Some(SCALE_SET), 10_000)
        .unwrap();
    let mut runners: Vec<String> = jobs
        .iter()
        .map(|j| match fleet.fake.scale_set_job(*j) {
            Some(job) => job.runner_name.unwrap(),
            None => journalled_jobs
                .iter()
                .find(|r| r.runner_request_id == i64::try_from(*j).unwrap())
                .and_then(|r| r.runner_name.clone())
                .unwrap_or_else(|| panic!("job {j}: no runner")),
        })
        .collect();
    runners.sort();
    runners.dedup();
    assert_eq!(runners.len(), jobs.len(), "each job on its own runner");
    for runner in &runners {
        let attempt = attempts.iter().find(|a| &a.runner_name == runner);
        assert!(
            attempt.is_some_and(|a| a.outcome == Some(AttemptOutcome::CompletedJob)),
            "{runner}: {summary:?}"
        );
    }
    assert!(
        fleet.our_registrations().is_empty(),
        "{:?}",
        fleet.our_registrations()
    );
    assert!(fleet.runtimes().is_empty(), "{:?}", fleet.runtimes());
    // No message lost: the journal holds each job's assignment, start and completion, each
    // handled once (a message redelivered after a crash is recognised, not journalled again).
    let conn = rusqlite::Connection::open(fleet.setup.journal()).unwrap();
    let mut events: Vec<(String, String, String)> = Vec::new();
    let mut statement = conn
        .prepare("SELECT events FROM scale_set_messages WHERE scale_set = ?1")
        .unwrap();
    let rows = statement
        .query_map([SCALE_SET], |row| row.get::<_, String>(0))
        .unwrap();
    for row in rows {
        let list: Vec<serde_json::Value> = serde_json::from_str(&row.unwrap()).unwrap();
        events.extend(list.iter().map(|e| {
            (
                e["kind"].as_str().unwrap_or_default().to_owned(),
                e["job_id"].as_str().unwrap_or_default().to_owned(),
                e["result"].as_str().unwrap_or_default().to_owned(),
            )
        }));
    }
    for job in jobs {
        for kind in ["JobAssigned", "JobStarted", "JobCompleted"] {
            let seen = events
                .iter()
                .filter(|(k, id, result)| {
                    k == kind
                        && *id == format!("job-{job}")
                        && !(reassigned && result == "canceled")
                })
                .count();
            if reassigned && kind == "JobAssigned" {
                assert!(seen >= 1, "job {job}: never assigned: {events:?}");
                continue;
            }
            assert_eq!(
                seen, 1,
                "job {job}: {kind} journalled {seen} times: {events:?}"
            );
        }
    }
    let journalled = rm_journal::ScaleSets::open(&fleet.setup.journal())
        .unwrap()
        .jobs(Some(SCALE_SET), 10_000)
        .unwrap();
    for job in jobs {
        let row = journalled
            .iter()
            .find(|r| r.runner_request_id == i64::try_from(*job).unwrap());
        assert!(
            row.is_some_and(
                |r| r.state == rm_journal::ScaleSetJobState::Completed && r.runner_name.is_some()
            ),
            "job {job} not journalled completed: {row:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_set_serves_each_job_with_one_runner_from_a_cold_start_and_leaves_nothing() {
    let fleet = Fleet::start(options()).await;
    // The first start creates the scale set; a stop closes its session.
    let first = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    assert!(first.terminate().success());

    // Queued while the agent is down: the next session's statistics say 3 assigned.
    let before = fleet
        .fake
        .queue_scale_set_jobs(id, &["cold 1", "cold 2", "cold 3"])
        .unwrap();
    let started = SystemTime::now();
    let _agent = fleet.start_agent(&[]).await;
    // GitHub also sends the job's webhook; nothing but the scale set may serve it. Queued once
    // the receiver listens: a delivery before that is lost, and polling (webhooks trusted)
    // would find the job only at its next pass, after the wait below.
    let twin = fleet
        .fake
        .queue_job(REPO, "webhook twin", &[SCALE_SET])
        .unwrap();
    wait_until(
        Duration::from_secs(120),
        "the cold start's jobs done",
        || jobs_done(&fleet, &before),
    )
    .await;
    let after = fleet
        .fake
        .queue_scale_set_jobs(id, &["warm 1", "warm 2"])
        .unwrap();
    wait_until(Duration::from_secs(120), "the later jobs done", || {
        jobs_done(&fleet, &after)
    })
    .await;
    let all: Vec<u64> = before.iter().chain(&after).copied().collect();
    assert_one_runner_each_and_nothing_left(&fleet, id, &all).await;

    // No REST request but the credentials' (the installation token, the registration token
    // the Actions service is reached with): no runner registered, listed or removed through the
    // REST API. The webhook twin is still queued, and `explain` names the scale set.
    assert_eq!(fleet.jit_requests(), 0);
    let rest: Vec<_> = fleet
        .fake
        .request_counts_since(started)
        .into_iter()
        .filter(|((kind, endpoint), _)| *kind == RequestKind::Rest && !credentials(endpoint))
        .collect();
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(
        fleet.fake.job(twin).unwrap().status,
        rm_fake_github::JobStatus::Queued
    );
    // Its webhook comes late (the fake delays deliveries up to 400 ms).
    wait_until(
        Duration::from_secs(30),
        "the twin's webhook journalled",
        || {
            fleet
                .setup
                .run(&["explain", &twin.to_string(), "--json"])
                .status
                .success()
        },
    )
    .await;
    let answer = fleet.explain(twin);
    assert_eq!(answer["verdict"], "scale_set", "{answer}");
    assert!(
        answer["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains(SCALE_SET),
        "{answer}"
    );
    // `status` shows the scale set with its session and its last message.
    let out = fleet.setup.run(&["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let set = &status["scale_sets"][0];
    assert_eq!(set["name"], SCALE_SET, "{status}");
    assert_eq!(set["scale_set_id"], id, "{status}");
    assert!(set["session_id"].is_string(), "{status}");
    assert!(set["last_message_id"].as_i64().unwrap() > 0, "{status}");
}

/// SIGKILL right after a message is received (before its journal write) and right after it is
/// journalled (before its acknowledgement): either way the message comes again, is handled
/// once, and the job gets one runner. The killed agent's session is deleted by its journalled
/// id at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_survives_a_crash_on_either_side_of_its_journal_write() {
    let fleet = Fleet::start(options()).await;
    let first = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    assert!(first.terminate().success());
    let mut jobs = Vec::new();
    let mut serving = None;
    for point in ["scale_set_message_received", "scale_set_message_journalled"] {
        if let Some(agent) = serving.take() {
            let agent: rm_e2e::Agent = agent;
            // Its last job's messages all journalled and its runner cleaned: nothing left in
            // the queue for the crashing agent but the message of the job queued for it (a
            // leftover would crash it before it is healthy, or before the job is queued).
            let last = *jobs.last().unwrap();
            wait_until(
                Duration::from_secs(60),
                "the last job journalled done",
                || journalled_completed(&fleet, last) && fleet.all_cleaned(),
            )
            .await;
            assert!(agent.terminate().success());
        }
        let mut crashing = fleet.start_agent(&[("RM_FAULT_CRASH_AT", point)]).await;
        let job = fleet.fake.queue_scale_set_job(id, point).unwrap();
        wait_until(Duration::from_secs(60), "the agent to kill itself", || {
            crashing.exited()
        })
        .await;
        assert!(
            fleet
                .setup
                .logs()
                .contains(&format!("RM_FAULT_CRASH_AT={point}")),
            "the agent did not reach {point}"
        );
        let deletes_before = fleet.fake.broker_calls("DELETE", "sessions");
        let agent = fleet.start_agent(&[]).await;
        wait_until(
            Duration::from_secs(120),
            "the job done after the crash",
            || jobs_done(&fleet, &[job]),
        )
        .await;
        assert!(
            fleet.fake.broker_calls("DELETE", "sessions") > deletes_before,
            "{point}: the stale session was not deleted by its journalled id"
        );
        serving = Some(agent);
        jobs.push(job);
    }
    assert_one_runner_each_and_nothing_left(&fleet, id, &jobs).await;
}

/// Scenario 16: GitHub says `JobCompleted` while the runner still runs the job. rm never stops
/// a runner for that: the runner finishes the job and exits by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_job_completed_never_stops_the_runner_running_the_job() {
    let fleet = Fleet::start(options()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 4_000,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let job = fleet.fake.queue_scale_set_job(id, "long").unwrap();
    wait_until(Duration::from_secs(60), "the job running", || {
        fleet
            .fake
            .scale_set_job(job)
            .is_some_and(|j| j.state == JobState::Running)
    })
    .await;
    assert!(fleet.fake.complete_scale_set_job_early(job));
    assert_one_runner_each_and_nothing_left(&fleet, id, &[job]).await;
}

/// Whether the journal has job `job`'s `JobCompleted`.
fn journalled_completed(fleet: &Fleet, job: u64) -> bool {
    rm_journal::ScaleSets::open(&fleet.setup.journal())
        .ok()
        .and_then(|j| j.jobs(Some(SCALE_SET), 10_000).ok())
        .is_some_and(|rows| {
            rows.iter().any(|r| {
                r.runner_request_id == i64::try_from(job).unwrap()
                    && r.state == rm_journal::ScaleSetJobState::Completed
            })
        })
}

/// The journal's record of the scale set.
fn journalled(fleet: &Fleet) -> Option<rm_journal::ScaleSetRecord> {
    rm_journal::ScaleSets::open(&fleet.setup.journal())
        .ok()
        .and_then(|j| j.get(SCALE_SET).ok().flatten())
}

/// The note `status --json` shows for the (only) scale set, once it starts with `prefix`.
pub(crate) async fn status_note(fleet: &Fleet, prefix: &str) -> String {
    let mut note = String::new();
    wait_until(
        Duration::from_secs(60),
        &format!("\"{prefix}…\" in status"),
        || {
            let out = fleet.setup.run(&["status", "--json"]);
            let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            note = status["scale_sets"][0]["note"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            note.starts_with(prefix)
        },
    )
    .await;
    note
}

/// Queues one job on scale set `id` and waits until it is done.
async fn serve_one(fleet: &Fleet, id: u64, name: &str) -> u64 {
    let job = fleet.fake.queue_scale_set_job(id, name).unwrap();
    wait_until(Duration::from_secs(60), name, || jobs_done(fleet, &[job])).await;
    job
}

/// The queue polls (`GET` of the queue) answered so far.
fn polls(fleet: &Fleet) -> usize {
    fleet.fake.broker_calls("GET", "/scalesets/message")
}

/// Scenarios 6, 7 and 8 while one agent runs, a job served after each fault: messages it
/// cannot handle (journalled as such, acknowledged, never blocking the queue), the queue token
/// expires (401 → the session refreshed → the poll retried), the admin token expires (the
/// JIT request re-authenticates), the session is evicted (its refresh 404 → a new session, the
/// cursor kept), an empty `200` (backed off, polled again), and a 5xx outage (backed off,
/// doubling: a handful of polls in seconds, not a hot loop; recovered once it ends), then the
/// whole service down with the tokens and the session lost behind it (a few requests, then a
/// new session and the job queued meanwhile served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_rides_out_expired_tokens_an_eviction_an_empty_answer_and_an_outage() {
    let fleet = Fleet::start(options()).await;
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let mut jobs = vec![serve_one(&fleet, id, "before").await];

    // Messages the agent cannot handle (a top-level type it does not know, a job event of a
    // kind it does not know) are journalled as such and acknowledged: the job behind them is
    // served.
    let odd_at = fleet.fake.now();
    let odd = [
        fleet
            .fake
            .queue_scale_set_message(id, "RunnerScaleSetFutureThing")
            .unwrap(),
        fleet
            .fake
            .queue_scale_set_message(id, "JobTeleported")
            .unwrap(),
    ];
    jobs.push(serve_one(&fleet, id, "behind messages it cannot handle").await);
    let conn = rusqlite::Connection::open(fleet.setup.journal()).unwrap();
    for (message, column) in odd.iter().zip(["unknown_type", "unhandled"]) {
        let kept: String = conn
            .query_row(
                &format!(
                    "SELECT COALESCE(CAST({column} AS TEXT), '') FROM scale_set_messages \
                     WHERE message_id = ?1"
                ),
                [*message as i64],
                |r| r.get(0),
            )
            .unwrap_or_else(|e| panic!("message {message} not journalled: {e}"));
        assert!(
            !kept.is_empty() && kept != "0",
            "message {message}: {column} {kept:?}"
        );
        let acknowledged = fleet
            .fake
            .requests_since(odd_at)
            .iter()
            .filter(|r| {
                r.method == "DELETE" && r.path.ends_with(&format!("/scalesets/message/{message}"))
            })
            .count();
        assert_eq!(acknowledged, 1, "message {message} acknowledged once");
    }
    drop(conn);

    // Queue token: the poll's 401 refreshes the session and polls again.
    let refreshes = fleet.fake.broker_calls("PATCH", "sessions");
    let sessions = fleet.fake.broker_calls("POST", "sessions");
    fleet.fake.expire_queue_tokens();
    jobs.push(serve_one(&fleet, id, "queue token expired").await);
    assert!(
        fleet.fake.broker_calls("PATCH", "sessions") > refreshes,
        "the session was not refreshed"
    );
    assert_eq!(
        fleet.fake.broker_calls("POST", "sessions"),
        sessions,
        "a refresh, not a new session"
    );

    // Admin token: the next service call (the JIT request) exchanges the credentials again.
    let exchanges = fleet.fake.broker_calls("POST", "runner-registration");
    fleet.fake.expire_admin_tokens();
    jobs.push(serve_one(&fleet, id, "admin token expired").await);
    assert!(
        fleet.fake.broker_calls("POST", "runner-registration") > exchanges,
        "no re-authentication"
    );

    // Eviction: the refresh is 404, a new session is made, and its polls keep the cursor.
    let cursor = journalled(&fleet).unwrap().last_message_id;
    assert!(cursor > 0);
    let evicted_at = fleet.fake.now();
    fleet.fake.evict_sessions();
    jobs.push(serve_one(&fleet, id, "session evicted").await);
    assert!(
        fleet.fake.broker_calls("POST", "sessions") > sessions,
        "no new session after the eviction"
    );
    let cursors: Vec<i64> = fleet
        .fake
        .requests_since(evicted_at)
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/scalesets/message"))
        .map(|r| {
            r.query
                .split('&')
                .find_map(|p| p.strip_prefix("lastMessageId="))
                .map_or(0, |v| v.parse().unwrap())
        })
        .collect();
    assert!(
        !cursors.is_empty() && cursors.iter().all(|c| *c >= cursor),
        "the cursor {cursor} was not kept: {cursors:?}"
    );

    // An empty 200: backed off and polled again, not an exit.
    fleet.fake.empty_next_poll();
    jobs.push(serve_one(&fleet, id, "empty answer").await);

    // A 5xx outage of the polls: they back off 1 s doubling, so a few in 4 s (a hot loop:
    // hundreds).
    let before = polls(&fleet);
    fleet.fake.fail_next_polls(u32::MAX, 503);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = polls(&fleet) - before;
    fleet.fake.fail_next_polls(0, 503);
    assert!(
        (1..=5).contains(&during),
        "{during} polls in 4 s of outage: not a doubling back-off"
    );
    jobs.push(serve_one(&fleet, id, "after the outage").await);

    // The whole service down, and what an outage of minutes leaves behind: both tokens expired
    // and the session gone when it comes back, a job queued meanwhile. A few requests in 8 s
    // of it, then the session made again and the job served. (It begins with every runner
    // removed: a removal it refused is tried again 30 s later, by when GitHub would have
    // removed the finished runner itself, and this test counts the agent's removals.)
    wait_until(
        Duration::from_secs(60),
        "every runner removed before the outage",
        || fleet.all_cleaned() && fleet.fake.scale_set_runners(id).is_empty(),
    )
    .await;
    let down_at = fleet.fake.now();
    let sessions = fleet.fake.broker_calls("POST", "sessions");
    fleet.fake.set_broker_down(true);
    let queued = fleet
        .fake
        .queue_scale_set_job(id, "queued while the service was down")
        .unwrap();
    fleet.fake.expire_queue_tokens();
    fleet.fake.expire_admin_tokens();
    fleet.fake.evict_sessions();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let during = fleet
        .fake
        .requests_since(down_at)
        .iter()
        .filter(|r| r.path.starts_with("/rest/") || r.path.starts_with("/scalesets/"))
        .count();
    fleet.fake.set_broker_down(false);
    assert!(
        (1..=7).contains(&during),
        "{during} requests to the service in 8 s of its outage: not a doubling back-off"
    );
    wait_until(
        Duration::from_secs(90),
        "the job queued in the outage",
        || jobs_done(&fleet, &[queued]),
    )
    .await;
    assert!(
        fleet.fake.broker_calls("POST", "sessions") > sessions,
        "no new session after the outage"
    );
    jobs.push(queued);

    assert_one_runner_each_and_nothing_left(&fleet, id, &jobs).await;
}

/// Scenarios 13 and 9: in GHES mode jobs come as `JobAvailable` and are assigned only once
/// acquired (scaleset #75): the agent acquires them and they are served. Then the scale set is
/// deleted out of band: the agent creates it again (a new id, the journal's cursor reset), and
/// a job queued on the new set is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ghes_jobs_are_acquired_and_a_scale_set_deleted_at_github_is_made_again() {
    let fleet = Fleet::start(options()).await;
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    fleet.fake.set_scale_set_ghes(true);
    let ghes = fleet
        .fake
        .queue_scale_set_jobs(id, &["ghes 1", "ghes 2"])
        .unwrap();
    wait_until(Duration::from_secs(60), "the GHES jobs done", || {
        jobs_done(&fleet, &ghes)
    })
    .await;
    assert!(fleet.fake.broker_calls("POST", "acquirejobs") > 0);
    fleet.fake.set_scale_set_ghes(false);
    assert_one_runner_each_and_nothing_left(&fleet, id, &ghes).await;

    let before = journalled(&fleet).unwrap();
    assert!(before.last_message_id > 0);
    assert!(fleet.fake.delete_scale_set(id));
    let mut again = None;
    wait_until(Duration::from_secs(60), "the scale set made again", || {
        again = journalled(&fleet).filter(|r| r.scale_set_id.is_some_and(|n| n != id as i64));
        again.is_some()
    })
    .await;
    let again = again.unwrap();
    assert!(
        again.generation > before.generation,
        "{before:?} → {again:?}"
    );
    let new_id = u64::try_from(again.scale_set_id.unwrap()).unwrap();
    let job = serve_one(&fleet, new_id, "on the new set").await;
    let after = journalled(&fleet).unwrap();
    assert!(after.scale_set_id == Some(new_id as i64), "{after:?}");
    let all: Vec<u64> = ghes.iter().copied().chain([job]).collect();
    assert!(fleet.fake.scale_set_runners(id).is_empty());
    assert_one_runner_each_and_nothing_left(&fleet, new_id, &all).await;
}

/// Scenarios 11 and 10. The agent dies with a JIT configuration in hand before its runner id
/// is journalled: the next start concludes that launch and removes the registration, found by
/// its name through the service. It dies right after a JIT configuration is journalled, its
/// runner registered and never started: the next start concludes that launch, removes its
/// registration, and serves the job with a runner of another name. Then the answer to a JIT
/// request is lost after the service registered the runner; asked again, the name is taken
/// (`409 AgentExistsException`): the agent removes the stale registration and asks again.
/// Removing a finished runner the service still holds busy is refused
/// (`JobStillRunningException`, here with status 409, not 400) and tried again later, until it
/// succeeds: nothing is left registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_jit_a_lost_jit_answer_and_a_busy_removal_leave_one_runner_per_job() {
    let fleet = Fleet::start(options()).await;
    fleet.fake.set_job_still_running_status(409);
    // Busy for a while after its job, as GitHub holds a finished runner.
    fleet
        .fake
        .set_ephemeral_lag(Duration::from_secs(4), Duration::from_secs(30));
    // Killed with the JIT answer in hand, before its runner id is journalled: the next start
    // concludes the launch and its cleanup finds the registration by name through the service
    // (no REST listing covers a scale set's runners).
    let mut crashing = fleet
        .start_agent(&[("RM_FAULT_CRASH_AT", "jit_issued")])
        .await;
    let id = scale_set_id(&fleet).await;
    let unjournalled = fleet
        .fake
        .queue_scale_set_job(id, "crash before the id is journalled")
        .unwrap();
    wait_until(Duration::from_secs(60), "the agent to kill itself", || {
        crashing.exited()
    })
    .await;
    assert!(
        fleet.setup.logs().contains("RM_FAULT_CRASH_AT=jit_issued"),
        "the agent did not reach jit_issued"
    );
    assert_eq!(fleet.fake.scale_set_runners(id).len(), 1, "registered");
    {
        let _agent = fleet.start_agent(&[]).await;
        wait_until(
            Duration::from_secs(60),
            "the job served after the crash and the unjournalled registration removed",
            || {
                jobs_done(&fleet, &[unjournalled])
                    && fleet.all_cleaned()
                    && fleet.fake.scale_set_runners(id).is_empty()
            },
        )
        .await;
    }
    let mut crashing = fleet
        .start_agent(&[("RM_FAULT_CRASH_AT", "jit_received")])
        .await;
    let crashed = fleet
        .fake
        .queue_scale_set_job(id, "crash after jit")
        .unwrap();
    wait_until(Duration::from_secs(60), "the agent to kill itself", || {
        crashing.exited()
    })
    .await;
    assert!(
        fleet
            .setup
            .logs()
            .contains("RM_FAULT_CRASH_AT=jit_received"),
        "the agent did not reach jit_received"
    );
    assert_eq!(
        fleet.fake.scale_set_runners(id).len(),
        1,
        "registered, never started"
    );
    let _agent = fleet.start_agent(&[]).await;
    wait_until(
        Duration::from_secs(60),
        "the job done after the crash",
        || jobs_done(&fleet, &[crashed]),
    )
    .await;

    // Its runner removed (after a busy refusal or two) before the next fault.
    wait_until(Duration::from_secs(60), "the first runner removed", || {
        fleet.all_cleaned() && fleet.fake.scale_set_runners(id).is_empty()
    })
    .await;
    let lost_at = fleet.fake.now();
    fleet.fake.lose_next_jit_answers(1);
    let job = serve_one(&fleet, id, "lost answer").await;
    assert_served_once(&fleet, id, &[unjournalled, crashed, job], false, 2).await;
    let requests = fleet.fake.requests_since(lost_at);
    let jit: Vec<u16> = requests
        .iter()
        .filter(|r| r.path.contains("generatejitconfig"))
        .map(|r| r.status)
        .collect();
    assert_eq!(jit, [503, 409, 200], "lost, taken, issued");
    let removals: Vec<u16> = requests
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/agents/"))
        .map(|r| r.status)
        .collect();
    assert!(
        removals.first() == Some(&204) && removals.contains(&409) && removals.last() == Some(&204),
        "the stale one removed, the busy one refused, then removed: {removals:?}"
    );
}

/// Scenario 12: the service cancels and assigns again the jobs no runner started in time
/// (`JobCompleted` `canceled`, then `JobAssigned`), while the runners are slow to come: every
/// job is served once, by a runner of its own, and no runner is started for a reassignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reassigned_jobs_are_served_once_each() {
    let fleet = Fleet::start(options()).await;
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    fleet
        .fake
        .set_scale_set_reassign_after(Duration::from_millis(300));
    fleet.fake.pause_scale_set_runners(true);
    let jobs = fleet
        .fake
        .queue_scale_set_jobs(id, &["slow 1", "slow 2", "slow 3"])
        .unwrap();
    wait_until(
        Duration::from_secs(30),
        "every job reassigned twice",
        || {
            jobs.iter()
                .all(|j| fleet.fake.scale_set_job(*j).unwrap().reassignments >= 2)
        },
    )
    .await;
    fleet.fake.pause_scale_set_runners(false);
    wait_until(Duration::from_secs(60), "the jobs done", || {
        jobs_done(&fleet, &jobs)
    })
    .await;
    for job in &jobs {
        assert_eq!(
            fleet.fake.scale_set_job(*job).unwrap().result.as_deref(),
            Some("succeeded")
        );
    }
    assert_served_once(&fleet, id, &jobs, true, 0).await;
}

/// A restart after a runner finished its job while the agent was down, the job's (early)
/// `JobCompleted` journalled and acknowledged by the previous process: the runner, recovered as
/// finished, is not taken for one whose job the statistics still count, so a job queued
/// meanwhile gets its runner at once (not after the finished runner is forgotten).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_finished_while_the_agent_was_down_hides_no_job_queued_meanwhile() {
    let fleet = Fleet::start(options()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 3_000,
        ..RunnerBehavior::default()
    });
    let first = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let job = fleet
        .fake
        .queue_scale_set_job(id, "finished while down")
        .unwrap();
    wait_until(Duration::from_secs(60), "the job running", || {
        fleet
            .fake
            .scale_set_job(job)
            .is_some_and(|j| j.state == JobState::Running)
    })
    .await;
    assert!(fleet.fake.complete_scale_set_job_early(job));
    wait_until(
        Duration::from_secs(30),
        "its JobCompleted journalled",
        || journalled_completed(&fleet, job),
    )
    .await;
    // Stopped while the runner still runs the job; it finishes meanwhile.
    assert!(first.terminate().success());
    wait_until(
        Duration::from_secs(30),
        "the runner done with its job",
        || {
            fleet
                .fake
                .scale_set_runners(id)
                .iter()
                .all(|r| r.job_done_at.is_some())
        },
    )
    .await;
    let meanwhile = fleet
        .fake
        .queue_scale_set_job(id, "queued meanwhile")
        .unwrap();
    let _agent = fleet.start_agent(&[]).await;
    wait_until(
        Duration::from_secs(30),
        "the job queued meanwhile done",
        || jobs_done(&fleet, &[meanwhile]),
    )
    .await;
    assert_one_runner_each_and_nothing_left(&fleet, id, &[job, meanwhile]).await;
}

/// Scale-down, idle runners only (issue 29). Three jobs are assigned while the runners get
/// none; two of them are cancelled. The scale set then wants one runner, has three idle: two
/// are removed from the scale set and stopped (stop intent `scale_down`, concluded an idle exit)
/// long before `runner.idle_timeout`, and the one left serves the remaining job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_runners_beyond_what_the_scale_set_wants_are_scaled_down() {
    scale_down(ScaleDownFault::None).await;
}

/// Scenario 10 in a scale-down: the service refuses the removal of an idle runner
/// (`JobStillRunningException`, as when it hands that runner a job at that instant): the runner
/// is not stopped then; it is removed and stopped only once the service lets it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_down_the_service_refuses_leaves_the_runner_running() {
    scale_down(ScaleDownFault::Refused).await;
}

/// The same, the agent SIGKILLed after a surplus runner's scale-down was journalled and the
/// runner removed from the scale set, before it was stopped; then (another fleet) after the
/// scale-down was journalled, before the removal. The next start resumes that scale-down
/// rather than choosing another runner, and nothing else changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_the_middle_of_a_scale_down_scales_down_once_more() {
    scale_down(ScaleDownFault::Crash("scale_down_removed")).await;
    scale_down(ScaleDownFault::Crash("scale_down_intended")).await;
}

/// What goes wrong in [`scale_down`].
#[derive(PartialEq)]
enum ScaleDownFault {
    None,
    /// The agent is SIGKILLed at this point: after the intent and before the removal, or after
    /// the removal and before the runner is stopped.
    Crash(&'static str),
    /// The service refuses the first removal.
    Refused,
}

async fn scale_down(fault: ScaleDownFault) {
    let crash_at = match fault {
        ScaleDownFault::Crash(point) => Some(point),
        _ => None,
    };
    let fleet = Fleet::start(options()).await;
    let env: Vec<(&str, &str)> = crash_at
        .map(|point| ("RM_FAULT_CRASH_AT", point))
        .into_iter()
        .collect();
    let mut agent = fleet.start_agent(&env).await;
    let id = scale_set_id(&fleet).await;
    fleet.fake.pause_scale_set_runners(true);
    let jobs = fleet
        .fake
        .queue_scale_set_jobs(id, &["kept", "cancelled 1", "cancelled 2"])
        .unwrap();
    wait_until(Duration::from_secs(60), "three idle runners", || {
        fleet
            .attempts()
            .iter()
            .filter(|a| a.state == rm_journal::AttemptState::Idle)
            .count()
            == 3
    })
    .await;
    let cancelled_at = fleet.fake.now();
    if fault == ScaleDownFault::Refused {
        fleet.fake.refuse_next_removals(1);
    }
    for cancelled in &jobs[1..] {
        assert!(fleet.fake.complete_scale_set_job(*cancelled, "canceled"));
    }
    if let Some(point) = crash_at {
        wait_until(Duration::from_secs(60), "the agent to kill itself", || {
            agent.exited()
        })
        .await;
        assert!(
            fleet
                .setup
                .logs()
                .contains(&format!("RM_FAULT_CRASH_AT={point}"))
        );
        agent = fleet.start_agent(&[]).await;
    }
    wait_until(Duration::from_secs(90), "two runners scaled down", || {
        fleet
            .attempts()
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::IdleExit))
            .count()
            >= 2
    })
    .await;
    let attempts = fleet.attempts();
    let scaled: Vec<_> = attempts
        .iter()
        .filter(|a| a.outcome == Some(AttemptOutcome::IdleExit))
        .collect();
    assert_eq!(scaled.len(), 2, "no more than the surplus: {attempts:?}");
    for scaled in scaled {
        assert_eq!(
            scaled.stop_intent,
            Some(rm_journal::StopIntent::ScaleDown),
            "{scaled:?}"
        );
    }
    // Not one more: the runner the remaining job wants stays.
    assert_eq!(
        attempts.iter().filter(|a| a.outcome.is_none()).count(),
        1,
        "{attempts:?}"
    );
    // Each runner stopped was removed from the scale set first; a refused removal stopped
    // nothing, and was tried again.
    let removals: Vec<u16> = fleet
        .fake
        .requests_since(cancelled_at)
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/agents/"))
        .map(|r| r.status)
        .collect();
    let refused = removals.iter().filter(|s| **s != 204).count();
    let expected_refusals = usize::from(fault == ScaleDownFault::Refused);
    assert_eq!(refused, expected_refusals, "{removals:?}");
    fleet.fake.pause_scale_set_runners(false);
    wait_until(Duration::from_secs(60), "the job kept served", || {
        jobs_done(&fleet, &jobs[..1])
    })
    .await;
    assert_served_once(&fleet, id, &jobs[..1], false, 2).await;
    drop(agent);
}

/// Scenario 5, the other holder: another listener (another rm, an ARC) holds the scale set's
/// session when the agent starts. Its session is not ours (none is journalled by that id), so
/// it is waited out on standby, said in `status`, and no runner starts; once the other holder
/// lets go, the agent's next try opens its own session and the job queued meanwhile is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_another_listener_holds_is_waited_out_on_standby() {
    let fleet = Fleet::start(options()).await;
    let id = {
        let _first = fleet.start_agent(&[]).await;
        scale_set_id(&fleet).await
    };
    fleet.fake.evict_sessions();
    assert!(fleet.fake.hold_session_elsewhere(id, "another-listener"));
    let job = fleet.fake.queue_scale_set_job(id, "while held").unwrap();
    let _agent = fleet.start_agent(&[]).await;
    let note = status_note(&fleet, "on standby").await;
    assert!(
        fleet.attempts().is_empty(),
        "no runner while another holds the session"
    );
    let state = fleet.fake.scale_set_job(job).map(|j| j.state);
    assert!(
        matches!(state, Some(JobState::Queued | JobState::Assigned)),
        "{state:?} {note}"
    );
    fleet.fake.evict_sessions();
    wait_until(
        Duration::from_secs(90),
        "the job served after the standby",
        || jobs_done(&fleet, &[job]),
    )
    .await;
    assert_served_once(&fleet, id, &[job], false, 0).await;
}

/// Scenario 15 through the binary: a webhook policy carrying one of the scale set's labels
/// would serve its jobs a second time (through their webhooks), so `check` and `run` both
/// refuse the file with exit 2, naming the label and the policy, and start nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_refuse_a_webhook_policy_carrying_a_scale_set_s_label() {
    const TWIN: PolicySpec = PolicySpec {
        name: "twin",
        target: "acme",
        labels: &["self-hosted", "ACME-BIG"],
        max_runners: 2,
        workspace: "ephemeral",
        extra: "",
    };
    let fleet = Fleet::start(FleetOptions {
        policies: vec![BIG, TWIN],
        ..options()
    })
    .await;
    for command in ["check", "run"] {
        let out = fleet.setup.run(&[command]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("label `ACME-BIG` is also carried by policy `twin`"),
            "{command}: {stderr}"
        );
    }
    assert!(fleet.attempts().is_empty());
    assert!(
        fleet
            .fake
            .requests_since(SystemTime::UNIX_EPOCH)
            .iter()
            .all(|r| !r.path.contains("scaleset"))
    );
}
