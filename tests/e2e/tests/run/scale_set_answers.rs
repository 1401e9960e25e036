//! A scale set against a service that answers otherwise than `actions/scaleset` expects
//! (issue 43), through the real binary against the fake broker in its other answer modes: an
//! admin token with `"alg": "none"`; a session conflict (`409`) under another type name or
//! none, from another holder and from the agent's own session left by a SIGKILL; a `404` on the
//! poll for a session the service dropped; a deleted scale set answered with a bare `404`.
//! Each is decided on its status: the job is served (well before the 5-minute wait a refusal
//! would have cost), by one runner, and nothing is left.

use std::time::{Duration, SystemTime};

use rm_e2e::fleet::{Fleet, FleetOptions, wait_until};
use rm_fake_github::broker::JobState;
use rm_fake_github::model::RequestRecord;

use super::scale_set::{BIG, SCALE_SET, assert_served_once, jobs_done, scale_set_id, status_note};

/// A bound on "served within seconds" that a 5-minute wait can never meet: it says the wait did
/// not happen, it does not time the recovery.
const RECOVERED: Duration = Duration::from_secs(60);

fn options() -> FleetOptions {
    FleetOptions {
        policies: vec![BIG],
        tail: format!("\n[[scale_set]]\nname = \"{SCALE_SET}\"\npolicy = \"big\"\n"),
        ..FleetOptions::default()
    }
}

/// Queues one job on scale set `id` and waits (at most [`RECOVERED`]) until it is done.
async fn serve_one(fleet: &Fleet, id: u64, name: &str) -> u64 {
    let job = fleet.fake.queue_scale_set_job(id, name).unwrap();
    wait_until(RECOVERED, name, || jobs_done(fleet, &[job])).await;
    job
}

/// The broker's answers since `since` to `method` on a path containing `part`.
fn answers(fleet: &Fleet, since: SystemTime, method: &str, part: &str) -> Vec<RequestRecord> {
    fleet
        .fake
        .requests_since(since)
        .into_iter()
        .filter(|r| r.method == method && r.path.contains(part))
        .collect()
}

/// Whether `record` was answered `status` with no exception type name.
fn untyped(record: &RequestRecord, status: u16) -> bool {
    record.status == status
        && record
            .response_body
            .as_ref()
            .is_none_or(|b| b.get("typeName").is_none())
}

/// The scale set's id in the journal, once it is another than `old`.
async fn scale_set_id_other_than(fleet: &Fleet, old: u64) -> u64 {
    let mut id = None;
    wait_until(RECOVERED, "the scale set made again", || {
        id = rm_journal::ScaleSets::open(&fleet.setup.journal())
            .ok()
            .and_then(|j| j.get(SCALE_SET).ok().flatten())
            .and_then(|r| r.scale_set_id)
            .filter(|n| *n != i64::try_from(old).unwrap());
        id.is_some()
    })
    .await;
    u64::try_from(id.unwrap()).unwrap()
}

/// The service's admin tokens are unsecured JWTs (`"alg": "none"`, no signature), as an
/// emulator others wrote issues them: the agent reads their `exp` from the payload, creates the
/// scale set and serves its job; once they are refused (expired early), the next exchange's
/// token, unsecured too, serves the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_tokens_with_alg_none_serve_the_scale_set() {
    let fleet = Fleet::start(options()).await;
    fleet.fake.set_alg_none_tokens(true);
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let mut jobs = vec![serve_one(&fleet, id, "alg none").await];
    let issued = answers(
        &fleet,
        SystemTime::UNIX_EPOCH,
        "POST",
        "runner-registration",
    );
    assert!(
        !issued.is_empty()
            && issued.iter().all(|r| {
                let token = r.response_body.as_ref().and_then(|b| b["token"].as_str());
                token.is_some_and(|t| t.ends_with('.'))
            }),
        "every admin token unsecured: {issued:?}"
    );
    let exchanges = issued.len();
    fleet.fake.expire_admin_tokens();
    jobs.push(serve_one(&fleet, id, "alg none, renewed").await);
    assert!(
        fleet.fake.broker_calls("POST", "runner-registration") > exchanges,
        "the refused token was not renewed"
    );
    assert_served_once(&fleet, id, &jobs, false, 0).await;
}

/// Another holder has the session and the `409` names another exception type, or none: it is
/// a conflict all the same (GitHub's listener decides on 409 alone), waited out on standby and
/// said in `status`, not a refusal; once the holder lets go, the job queued meanwhile is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_under_another_type_name_or_none_is_waited_out_on_standby() {
    for type_name in [Some("GitHub.Actions.SessionConflictException"), None] {
        let fleet = Fleet::start(options()).await;
        let id = {
            let _first = fleet.start_agent(&[]).await;
            scale_set_id(&fleet).await
        };
        fleet.fake.evict_sessions();
        fleet.fake.set_session_conflict_type(type_name);
        assert!(fleet.fake.hold_session_elsewhere(id, "another-listener"));
        let held_at = fleet.fake.now();
        let job = fleet.fake.queue_scale_set_job(id, "while held").unwrap();
        let _agent = fleet.start_agent(&[]).await;
        let note = status_note(&fleet, "on standby").await;
        let conflicts = answers(&fleet, held_at, "POST", "sessions");
        assert!(
            conflicts.iter().any(|r| r.status == 409
                && r.response_body.as_ref().and_then(|b| b.get("typeName"))
                    == type_name.map(serde_json::Value::from).as_ref()),
            "{type_name:?}: no 409 so named: {conflicts:?}"
        );
        assert!(
            fleet.attempts().is_empty(),
            "{type_name:?}: no runner while held"
        );
        let state = fleet.fake.scale_set_job(job).map(|j| j.state);
        assert!(
            matches!(state, Some(JobState::Queued | JobState::Assigned)),
            "{type_name:?}: {state:?} {note}"
        );
        fleet.fake.evict_sessions();
        // The standby's first wait is 30 s (listener::STANDBY_BASE); a refusal waited 5 min.
        wait_until(
            Duration::from_secs(90),
            "the job served after the standby",
            || jobs_done(&fleet, &[job]),
        )
        .await;
        assert_served_once(&fleet, id, &[job], false, 0).await;
    }
}

/// The agent is SIGKILLed holding its session; at its restart the service still holds that
/// session and refuses a new one with a `409` under another type name, or none. The session is
/// the agent's own (journalled by its id): deleted, a new one made, and the job queued while
/// the agent was down served within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_our_own_session_is_deleted_whatever_the_409_names() {
    for type_name in [None, Some("GitHub.Actions.SessionConflictException")] {
        let fleet = Fleet::start(options()).await;
        let agent = fleet.start_agent(&[]).await;
        let id = scale_set_id(&fleet).await;
        let first = serve_one(&fleet, id, "before the kill").await;
        wait_until(RECOVERED, "the first runner cleaned", || {
            fleet.all_cleaned() && fleet.fake.scale_set_runners(id).is_empty()
        })
        .await;
        agent.kill();
        fleet.fake.set_session_conflict_type(type_name);
        let restarted_at = fleet.fake.now();
        let job = fleet
            .fake
            .queue_scale_set_job(id, "after the kill")
            .unwrap();
        let _agent = fleet.start_agent(&[]).await;
        wait_until(RECOVERED, "the job served after the restart", || {
            jobs_done(&fleet, &[job])
        })
        .await;
        let creates = answers(&fleet, restarted_at, "POST", "sessions");
        assert!(
            creates.first().is_some_and(|r| r.status == 409
                && r.response_body.as_ref().and_then(|b| b.get("typeName"))
                    == type_name.map(serde_json::Value::from).as_ref())
                && creates.last().is_some_and(|r| r.status == 200),
            "{type_name:?}: a 409 so named, then a session: {creates:?}"
        );
        let deletes = answers(&fleet, restarted_at, "DELETE", "sessions");
        assert!(
            deletes.iter().any(|r| r.status == 204),
            "{type_name:?}: the stale session was not deleted by its journalled id: {deletes:?}"
        );
        assert_served_once(&fleet, id, &[first, job], false, 0).await;
    }
}

/// The service drops the agent's session; its next poll is a `404` with no type name (a gone
/// session, not an unknown token). The agent makes a new session at once and the job queued
/// meanwhile is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_on_the_poll_of_a_dropped_session_makes_a_new_session() {
    let fleet = Fleet::start(options()).await;
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let mut jobs = vec![serve_one(&fleet, id, "before the drop").await];
    // Its runner gone, its messages long acknowledged: the next queue call is a poll.
    wait_until(RECOVERED, "the first runner cleaned", || {
        fleet.all_cleaned() && fleet.fake.scale_set_runners(id).is_empty()
    })
    .await;
    let sessions = fleet.fake.broker_calls("POST", "sessions");
    let dropped_at = fleet.fake.now();
    fleet.fake.drop_sessions();
    jobs.push(serve_one(&fleet, id, "after the drop").await);
    let polls = answers(&fleet, dropped_at, "GET", "/scalesets/message");
    assert!(
        polls.iter().any(|r| untyped(r, 404)),
        "no poll met the dropped session's 404: {polls:?}"
    );
    assert!(
        fleet.fake.broker_calls("POST", "sessions") > sessions,
        "no new session after the drop"
    );
    assert_served_once(&fleet, id, &jobs, false, 0).await;
}

/// The scale set is deleted at GitHub and every answer naming it is a bare `404` (no
/// `RunnerScaleSetNotFoundException`): the agent creates it again (a new id) and serves a job
/// queued on the new set; nothing is left on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_set_deleted_behind_a_bare_404_is_made_again() {
    let fleet = Fleet::start(options()).await;
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let first = serve_one(&fleet, id, "before the deletion").await;
    wait_until(RECOVERED, "the first runner cleaned", || {
        fleet.all_cleaned() && fleet.fake.scale_set_runners(id).is_empty()
    })
    .await;
    fleet.fake.set_bare_not_found(true);
    let deleted_at = fleet.fake.now();
    assert!(fleet.fake.delete_scale_set(id));
    let new_id = scale_set_id_other_than(&fleet, id).await;
    let job = serve_one(&fleet, new_id, "on the new set").await;
    let bare: Vec<RequestRecord> = fleet
        .fake
        .requests_since(deleted_at)
        .into_iter()
        .filter(|r| untyped(r, 404))
        .collect();
    assert!(!bare.is_empty(), "no bare 404 was met");
    assert!(fleet.fake.scale_set_runners(id).is_empty());
    assert_served_once(&fleet, new_id, &[first, job], false, 0).await;
}
