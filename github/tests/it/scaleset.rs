//! The scale-set client (`rm_github::scaleset`) against the fake's broker: the RemoteAuth
//! exchange and the admin token's renewal, sessions and their typed errors, the long poll
//! (202, redelivery, 401 then refresh, empty 200, a byte-order mark), acknowledgement,
//! acquisition and JIT configurations; and the listener (`rm_github::scaleset::listener`)
//! driving them through eviction, an empty 200, a stale session of ours or another holder's,
//! and a restart without an acknowledgement.

use std::sync::Arc;
use std::time::Duration;

use rm_fake_github::runner_client::RunnerSession;
use rm_fake_github::{FakeJitConfig, RequestKind};
use rm_github::scaleset::listener::{
    Activity, BACKOFF_BASE, BACKOFF_CAP, Listener, STANDBY_BASE, backoff_delay, standby_delay,
};
use rm_github::scaleset::{
    ADMIN_RENEW_BEFORE, Credential, MessageBody, ScaleSetClient, ScaleSetError, ScaleSetRunner,
    Session, Statistics,
};
use secrecy::ExposeSecret;
use serde_json::json;

use crate::common::{Harness, harness, harness_with, org};

/// How long the fake holds a poll with nothing to deliver.
const HOLD: Duration = Duration::from_millis(50);

async fn set_up() -> (Harness, ScaleSetClient, u64) {
    let h = harness().await;
    h.fake.set_poll_hold(HOLD);
    let client = ScaleSetClient::new(h.client.clone(), org(), "https://github.com/acme")
        .unwrap_or_else(|e| panic!("client: {e:#}"));
    let set = client
        .create_scale_set(1, "linux-x64", &[])
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));
    (h, client, set.id)
}

async fn session(client: &ScaleSetClient, set: u64) -> Session {
    client
        .create_session(set, "rm-test")
        .await
        .unwrap_or_else(|e| panic!("session: {e}"))
}

#[tokio::test]
async fn a_scale_set_is_found_by_name_in_its_group_after_it_is_created() {
    let (_h, client, id) = set_up().await;
    let found = client.get_scale_set(1, "linux-x64").await.expect("find");
    assert_eq!(found.map(|s| s.id), Some(id));
    assert!(
        client
            .get_scale_set(2, "linux-x64")
            .await
            .expect("find")
            .is_none()
    );
    assert!(
        client
            .get_scale_set(1, "other")
            .await
            .expect("find")
            .is_none()
    );
}

#[tokio::test]
async fn every_service_call_carries_the_api_version_and_remote_auth_is_done_once() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
    let calls = h.fake.requests();
    let service: Vec<_> = calls
        .iter()
        .filter(|r| r.path.starts_with("/rest/") || r.path.starts_with("/scalesets/"))
        .collect();
    assert_eq!(service.len(), 3, "create, session, poll");
    // The fake refuses a call without it (400): every one was answered.
    assert!(service.iter().all(|r| r.status != 400), "{service:?}");
    assert!(
        service
            .iter()
            .filter(|r| r.path.starts_with("/rest/"))
            .all(|r| r.query.contains("api-version=6.0-preview"))
    );
    let poll = service
        .iter()
        .find(|r| r.path == "/scalesets/message")
        .expect("the poll");
    assert_eq!(poll.header("x-scalesetmaxcapacity"), Some("5"));
    assert!(
        poll.header("accept")
            .is_some_and(|a| a.contains("api-version=6.0-preview"))
    );
    assert!(
        poll.query.contains("scaleSetId="),
        "the queue URL's query is kept"
    );
    let exchange = calls
        .iter()
        .find(|r| r.path == "/actions/runner-registration")
        .expect("the exchange");
    assert_eq!(
        exchange.header("authorization"),
        Some("RemoteAuth <redacted>")
    );
    assert_eq!(
        h.fake.broker_calls("POST", "/actions/runner-registration"),
        1
    );
    assert_eq!(h.fake.broker_calls("POST", "/registration-token"), 1);
}

#[tokio::test]
async fn the_admin_token_is_renewed_near_its_exp() {
    let (h, client, _) = set_up().await;
    // The fake's admin tokens live an hour: within ADMIN_RENEW_BEFORE of it, a new exchange.
    h.advance(Duration::from_secs(3600) - ADMIN_RENEW_BEFORE + Duration::from_secs(1));
    client.get_scale_set(1, "linux-x64").await.expect("find");
    assert_eq!(
        h.fake.broker_calls("POST", "/actions/runner-registration"),
        2
    );
}

#[tokio::test]
async fn a_second_session_is_a_conflict() {
    let (_h, client, id) = set_up().await;
    let _first = session(&client, id).await;
    let second = client.create_session(id, "another").await;
    assert!(
        matches!(second, Err(ScaleSetError::SessionConflict { .. })),
        "{second:?}"
    );
}

#[tokio::test]
async fn a_deleted_session_deleted_again_is_ok_and_frees_the_set() {
    let (_h, client, id) = set_up().await;
    let s = session(&client, id).await;
    client.delete_session(&s).await.expect("delete");
    client
        .delete_session(&s)
        .await
        .expect("already gone is fine");
    session(&client, id).await;
}

#[tokio::test]
async fn an_expired_queue_token_is_refreshed_once_and_the_poll_succeeds() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    let before = s.message_queue_access_token.expose_secret().to_owned();
    h.fake.queue_scale_set_job(id, "build").expect("set");
    h.fake.expire_queue_tokens();
    let message = client.get_message(&mut s, 0, 5).await.expect("poll");
    assert!(message.is_some());
    assert_eq!(h.fake.broker_calls("PATCH", "/sessions/"), 1);
    assert_ne!(s.message_queue_access_token.expose_secret(), before);
}

#[tokio::test]
async fn a_refresh_after_eviction_is_session_gone() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake.evict_sessions();
    let refreshed = client.refresh_session(&mut s).await;
    assert!(
        matches!(refreshed, Err(ScaleSetError::SessionGone { .. })),
        "{refreshed:?}"
    );
    // And a poll on the evicted session's token: 401, refresh, gone.
    let polled = client.get_message(&mut s, 0, 5).await;
    assert!(
        matches!(polled, Err(ScaleSetError::SessionGone { .. })),
        "{polled:?}"
    );
}

#[tokio::test]
async fn an_empty_200_is_a_transient_error() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake.empty_next_poll();
    let polled = client.get_message(&mut s, 0, 5).await;
    assert!(
        matches!(polled, Err(ScaleSetError::UnreadableMessage { .. })),
        "{polled:?}"
    );
    // The next poll is answered as usual.
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
}

#[tokio::test]
async fn a_body_after_a_byte_order_mark_is_read() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake.queue_scale_set_job(id, "build").expect("set");
    h.fake.bom_next_answer();
    let message = client.get_message(&mut s, 0, 5).await.expect("poll");
    let Some(message) = message else {
        panic!("no message")
    };
    let MessageBody::Jobs(jobs) = message.body else {
        panic!("not jobs: {message:?}")
    };
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].message_type, "JobAssigned");
    assert_eq!(jobs[0].job_display_name, "build");
    assert_eq!(message.statistics.map(|s| s.total_assigned_jobs), Some(1));
}

#[tokio::test]
async fn no_message_within_the_hold_is_none() {
    let (_h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    let started = std::time::Instant::now();
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
    assert!(started.elapsed() >= HOLD, "the poll was held");
}

#[tokio::test]
async fn a_message_is_redelivered_until_deleted_and_last_message_id_skips_it() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake.queue_scale_set_job(id, "one").expect("set");
    h.fake.queue_scale_set_job(id, "two").expect("set");
    let first = client.get_message(&mut s, 0, 5).await.expect("poll");
    let again = client.get_message(&mut s, 0, 5).await.expect("poll");
    let first_id = first.as_ref().map(|m| m.id).expect("a message");
    assert_eq!(again.map(|m| m.id), Some(first_id), "redelivered");
    let next = client.get_message(&mut s, first_id, 5).await.expect("poll");
    let next_id = next.map(|m| m.id).expect("the second");
    assert!(next_id > first_id, "ids increase");
    client.delete_message(&mut s, first_id).await.expect("ack");
    client
        .delete_message(&mut s, first_id)
        .await
        .expect("ack twice is fine");
    let after = client.get_message(&mut s, 0, 5).await.expect("poll");
    assert_eq!(after.map(|m| m.id), Some(next_id), "not the deleted one");
    client.delete_message(&mut s, next_id).await.expect("ack");
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
    assert_eq!(h.fake.broker_calls("DELETE", "/scalesets/message/"), 3);
}

#[tokio::test]
async fn a_message_of_an_unknown_type_is_kept_not_an_error() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake
        .queue_scale_set_message(id, "RunnerScaleSetFutureThing")
        .expect("set");
    let message = client.get_message(&mut s, 0, 5).await.expect("poll");
    let body = message.map(|m| m.body);
    assert!(
        matches!(&body, Some(MessageBody::Unknown { message_type, .. }) if message_type == "RunnerScaleSetFutureThing"),
        "{body:?}"
    );
}

#[tokio::test]
async fn jobs_are_acquired_with_the_queue_token() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    let request = h.fake.queue_scale_set_job(id, "build").expect("set");
    let request = i64::try_from(request).expect("small");
    let acquired = client
        .acquire_jobs(&mut s, &[request])
        .await
        .expect("acquire");
    assert_eq!(acquired, [request]);
    let again = client
        .acquire_jobs(&mut s, &[request])
        .await
        .expect("acquire");
    assert!(again.is_empty(), "acquired once");
}

#[tokio::test]
async fn a_jit_name_taken_is_agent_exists() {
    let (_h, client, id) = set_up().await;
    client
        .generate_jit_config(id, "rm-runner-1", "_work")
        .await
        .expect("jit");
    let again = client.generate_jit_config(id, "rm-runner-1", "_work").await;
    assert!(
        matches!(again, Err(ScaleSetError::AgentExists { .. })),
        "{again:?}"
    );
}

#[tokio::test]
async fn the_jit_config_never_shows_in_debug() {
    let (_h, client, id) = set_up().await;
    let jit = client
        .generate_jit_config(id, "rm-runner-2", "_work")
        .await
        .expect("jit");
    let blob = jit.encoded_jit_config.expose_secret().to_owned();
    assert!(blob.len() > 16);
    let shown = format!("{jit:?}");
    assert!(!shown.contains(&blob), "{shown}");
    assert!(shown.contains("rm-runner-2"));
}

#[tokio::test]
async fn an_admin_token_refused_before_its_exp_is_replaced_once() {
    let (h, client, _) = set_up().await;
    h.fake.expire_admin_tokens();
    client.get_scale_set(1, "linux-x64").await.expect("find");
    assert_eq!(
        h.fake.broker_calls("POST", "/actions/runner-registration"),
        2
    );
}

#[tokio::test]
async fn an_ack_with_an_expired_queue_token_refreshes_the_session() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake.queue_scale_set_job(id, "build").expect("set");
    let message = client.get_message(&mut s, 0, 5).await.expect("poll");
    let message_id = message.map(|m| m.id).expect("a message");
    h.fake.expire_queue_tokens();
    client
        .delete_message(&mut s, message_id)
        .await
        .expect("ack");
    assert_eq!(h.fake.broker_calls("PATCH", "/sessions/"), 1);
    assert_eq!(
        h.fake
            .broker_calls("DELETE", &format!("/scalesets/message/{message_id}")),
        2,
        "refused, then acknowledged"
    );
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
}

#[tokio::test]
async fn a_session_of_an_unknown_scale_set_is_scale_set_not_found() {
    let (_h, client, id) = set_up().await;
    let missing = client.create_session(id + 1000, "rm-test").await;
    assert!(
        matches!(missing, Err(ScaleSetError::ScaleSetNotFound { .. })),
        "{missing:?}"
    );
}

#[tokio::test]
async fn the_queue_token_never_shows_in_debug() {
    let (_h, client, id) = set_up().await;
    let s = session(&client, id).await;
    let token = s.message_queue_access_token.expose_secret().to_owned();
    assert!(!format!("{s:?}").contains(&token));
    assert!(!format!("{client:?}").contains(&token));
}

/// On GHES the REST API sits below `/api/v3`: the exchange goes there, while the service's
/// absolute URLs (at the server's root here) are used as they are.
#[tokio::test]
async fn under_an_api_base_path_the_exchange_uses_it_and_service_urls_stay_absolute() {
    let h = harness_with("/api/v3", Duration::from_secs(10)).await;
    h.fake.set_poll_hold(HOLD);
    let client = ScaleSetClient::new(h.client.clone(), org(), "https://ghes.example/acme")
        .unwrap_or_else(|e| panic!("client: {e:#}"));
    let set = client
        .create_scale_set(1, "linux-x64", &[])
        .await
        .expect("create");
    let mut s = session(&client, set.id).await;
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
    assert_eq!(
        h.fake
            .broker_calls("POST", "/api/v3/actions/runner-registration"),
        1
    );
    assert_eq!(h.fake.broker_calls("GET", "/scalesets/message"), 1);
}

/// How long (in tokio's time, paused in the listener's tests) a listener step may take
/// before the test fails: well under any back-off that is not the first, so a listener that
/// waits where it should not, or spins, is caught.
const STEP_LIMIT: Duration = Duration::from_secs(10);

/// A listener of `set` on `client` with `stale` as the journalled session id.
fn listener(client: &Arc<ScaleSetClient>, set: u64, stale: Option<String>) -> Listener {
    Listener::new(Arc::clone(client), set, "rm-test", stale)
}

/// `listener.next(0, 5)` within [`STEP_LIMIT`].
async fn next_within_limit(listener: &mut Listener) -> Option<rm_github::scaleset::Message> {
    tokio::time::timeout(STEP_LIMIT, listener.next(0, 5))
        .await
        .unwrap_or_else(|_| panic!("no answer within {STEP_LIMIT:?}: {listener:?}"))
        .unwrap_or_else(|e| panic!("next: {e}"))
}

#[tokio::test(start_paused = true)]
async fn listener_replaces_an_evicted_session_and_delivers_the_message_queued_before() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    let mut l = listener(&client, id, None);
    assert!(next_within_limit(&mut l).await.is_none(), "202");
    let first = l.session_id().map(str::to_owned).expect("a session");
    h.fake.queue_scale_set_job(id, "build").expect("set");
    h.fake.evict_sessions();
    let message = next_within_limit(&mut l).await.expect("the message");
    assert!(matches!(message.body, MessageBody::Jobs(ref jobs) if jobs.len() == 1));
    let second = l.session_id().map(str::to_owned).expect("a session");
    assert_ne!(second, first, "a new session");
    assert_eq!(h.fake.broker_calls("POST", "/sessions"), 2);
    assert_eq!(h.fake.broker_calls("PATCH", "/sessions/"), 1, "refresh 404");
}

#[tokio::test(start_paused = true)]
async fn listener_backs_off_once_on_an_empty_200_then_delivers() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    let mut l = listener(&client, id, None);
    h.fake.queue_scale_set_job(id, "build").expect("set");
    h.fake.empty_next_poll();
    let started = tokio::time::Instant::now();
    let message = next_within_limit(&mut l).await;
    assert!(message.is_some(), "delivered, not an exit");
    let waited = started.elapsed();
    assert!(
        waited >= BACKOFF_BASE && waited < BACKOFF_BASE * 2,
        "one back-off: {waited:?}"
    );
    assert_eq!(h.fake.broker_calls("GET", "/scalesets/message"), 2);
    assert_eq!(l.state().failures, 0, "reset by the answered poll");
}

#[tokio::test(start_paused = true)]
async fn listener_deletes_our_stale_session_by_its_journalled_id_and_proceeds() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    // The session a crashed process left open, its id in the journal.
    let old = session(&client, id).await;
    h.fake.queue_scale_set_job(id, "build").expect("set");
    let mut l = listener(&client, id, Some(old.session_id.clone()));
    assert!(next_within_limit(&mut l).await.is_some());
    assert_ne!(l.session_id(), Some(old.session_id.as_str()));
    assert_eq!(
        h.fake
            .broker_calls("DELETE", &format!("/sessions/{}", old.session_id)),
        1
    );
    assert_eq!(
        h.fake.broker_calls("POST", "/sessions"),
        3,
        "old, 409, ours"
    );
}

#[tokio::test(start_paused = true)]
async fn listener_without_the_stale_id_stands_by_without_spinning_then_recovers() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    let holder = session(&client, id).await;
    let mut l = listener(&client, id, None);
    const WINDOW: Duration = Duration::from_secs(600);
    let stood_by = tokio::time::timeout(WINDOW, l.next(0, 5)).await;
    assert!(stood_by.is_err(), "still on standby: {stood_by:?}");
    // Attempts at 0 s and after each standby delay that ends within the window.
    let mut expected = 1;
    let mut at = Duration::ZERO;
    loop {
        at += standby_delay(expected);
        if at >= WINDOW {
            break;
        }
        expected += 1;
    }
    assert!(expected >= 2 && u64::from(expected) < WINDOW.as_secs() / STANDBY_BASE.as_secs());
    assert_eq!(
        h.fake.broker_calls("POST", "/sessions"),
        1 + usize::try_from(expected).expect("small"),
        "the holder's, then ours on the standby schedule"
    );
    assert!(matches!(l.activity(), Activity::Standby { .. }), "{l:?}");
    assert_eq!(l.session_id(), None);
    // The holder lets go: the listener takes over at its next attempt.
    client.delete_session(&holder).await.expect("delete");
    h.fake.queue_scale_set_job(id, "build").expect("set");
    let message = tokio::time::timeout(WINDOW, l.next(0, 5))
        .await
        .expect("within a standby delay")
        .expect("next");
    assert!(message.is_some());
    assert!(l.session_id().is_some());
}

#[tokio::test(start_paused = true)]
async fn listener_a_message_not_acked_comes_again_after_a_restart() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    h.fake.queue_scale_set_job(id, "build").expect("set");
    let mut l = listener(&client, id, None);
    let first = next_within_limit(&mut l).await.expect("the message");
    // A crash before the ack: the journalled session is deleted by the next process.
    let journalled = l.session_id().map(str::to_owned).expect("a session");
    drop(l);
    client
        .delete_session_by_id(id, &journalled)
        .await
        .expect("delete");
    let mut l = listener(&client, id, None);
    let again = next_within_limit(&mut l).await.expect("redelivered");
    assert_eq!(again.id, first.id);
    // Acknowledged, it is gone.
    l.ack(again.id).await.expect("ack");
    assert!(next_within_limit(&mut l).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn listener_of_a_deleted_scale_set_returns_scale_set_not_found_at_once() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    let mut l = listener(&client, id + 1000, None);
    let gone = tokio::time::timeout(STEP_LIMIT, l.next(0, 5))
        .await
        .expect("at once, not backed off");
    assert!(
        matches!(gone, Err(ScaleSetError::ScaleSetNotFound { .. })),
        "{gone:?}"
    );
    assert_eq!(h.fake.broker_calls("POST", "/sessions"), 1, "no retry");
}

#[tokio::test(start_paused = true)]
async fn listener_debug_shows_the_session_id_not_the_queue_token() {
    let (_h, client, id) = set_up().await;
    let client = Arc::new(client);
    let mut l = listener(&client, id, None);
    assert!(next_within_limit(&mut l).await.is_none());
    let token = l
        .session()
        .map(|s| s.message_queue_access_token.expose_secret().to_owned())
        .expect("a session");
    let shown = format!("{l:?}");
    assert!(!shown.contains(&token), "{shown}");
    assert!(
        shown.contains(l.session_id().expect("a session")),
        "{shown}"
    );
}

#[tokio::test(start_paused = true)]
async fn listener_backs_off_a_5xx_burst_boundedly_and_resets_after_an_answered_poll() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    let mut l = listener(&client, id, None);
    assert!(next_within_limit(&mut l).await.is_none(), "a session, 202");
    h.fake.queue_scale_set_job(id, "build").expect("set");
    h.fake.fail_next_polls(3, 503);
    let started = tokio::time::Instant::now();
    let message = tokio::time::timeout(BACKOFF_CAP, l.next(0, 5))
        .await
        .expect("within the cap")
        .expect("next");
    assert!(message.is_some(), "delivered after the burst");
    let waited = started.elapsed();
    let expected = backoff_delay(1) + backoff_delay(2) + backoff_delay(3);
    assert!(
        waited >= expected && waited < expected + BACKOFF_BASE,
        "doubling back-off: {waited:?}, expected {expected:?}"
    );
    assert_eq!(l.state().failures, 0, "reset by the answered poll");
    // The next failure waits the base again, not the burst's last delay doubled.
    h.fake.fail_next_polls(1, 503);
    let started = tokio::time::Instant::now();
    assert!(
        next_within_limit(&mut l).await.is_some(),
        "not acked: again"
    );
    let waited = started.elapsed();
    assert!(
        waited >= BACKOFF_BASE && waited < BACKOFF_BASE * 2,
        "{waited:?}"
    );
    assert_eq!(h.fake.broker_calls("POST", "/sessions"), 1, "one session");
}

#[tokio::test(start_paused = true)]
async fn listener_gives_up_on_a_403_at_once_and_keeps_its_session() {
    let (h, client, id) = set_up().await;
    let client = Arc::new(client);
    let mut l = listener(&client, id, None);
    assert!(next_within_limit(&mut l).await.is_none(), "a session, 202");
    h.fake.fail_next_polls(1, 403);
    let refused = tokio::time::timeout(STEP_LIMIT, l.next(0, 5))
        .await
        .expect("at once, not backed off");
    assert!(
        matches!(refused, Err(ScaleSetError::Service { status: 403, .. })),
        "{refused:?}"
    );
    // Called again (the caller's choice), it polls the session it holds: no conflicting
    // second create.
    assert!(next_within_limit(&mut l).await.is_none());
    assert_eq!(h.fake.broker_calls("POST", "/sessions"), 1);
    assert_eq!(h.fake.broker_calls("GET", "/scalesets/message"), 3);
}

/// A scale set deleted out of band: the poll of its live session, the session's refresh and a
/// new session are each `ScaleSetNotFound`, not a 401 or a held 202.
#[tokio::test]
async fn a_scale_set_deleted_out_of_band_is_not_found_on_the_next_call() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    assert!(h.fake.delete_scale_set(id), "it existed");
    let poll = client.get_message(&mut s, 0, 5).await;
    assert!(
        matches!(poll, Err(ScaleSetError::ScaleSetNotFound { .. })),
        "{poll:?}"
    );
    let again = client.create_session(id, "rm-test").await;
    assert!(
        matches!(again, Err(ScaleSetError::ScaleSetNotFound { .. })),
        "{again:?}"
    );
    assert!(!h.fake.delete_scale_set(id), "gone once");
}

/// The job messages of the message polled after `last` with capacity `capacity` (`None` when
/// the poll is held to 202), and the message's id and statistics.
async fn poll_jobs(
    client: &ScaleSetClient,
    s: &mut Session,
    last: u64,
    capacity: u32,
) -> Option<(
    u64,
    Vec<rm_github::scaleset::JobMessage>,
    Option<Statistics>,
)> {
    let message = client
        .get_message(s, last, capacity)
        .await
        .unwrap_or_else(|e| panic!("poll: {e}"))?;
    let MessageBody::Jobs(jobs) = message.body else {
        panic!("not jobs: {message:?}")
    };
    Some((message.id, jobs, message.statistics))
}

/// A burst of 120 jobs arrives as 50 + 50 + 20 job messages (the README's batch limit), each
/// message redelivered until it is acked and the next only then; every job once.
#[tokio::test]
async fn a_burst_of_120_jobs_arrives_in_batches_of_at_most_50() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    let names: Vec<String> = (0..120).map(|n| format!("job-{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    h.fake.queue_scale_set_jobs(id, &names).expect("set");
    let mut sizes = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    while let Some((message_id, jobs, _)) = poll_jobs(&client, &mut s, 0, 1000).await {
        let (again, _, _) = poll_jobs(&client, &mut s, 0, 1000).await.expect("again");
        assert_eq!(again, message_id, "redelivered until acked");
        sizes.push(jobs.len());
        seen.extend(jobs.iter().map(|j| j.runner_request_id));
        client
            .delete_message(&mut s, message_id)
            .await
            .expect("ack");
    }
    assert_eq!(sizes, [50, 50, 20]);
    assert_eq!(seen.len(), 120, "every job once");
}

/// Jobs are assigned only while assigned-but-unfinished jobs are below the last polled
/// `X-ScaleSetMaxCapacity`: capacity 2 assigns two of five, a completion frees a place for
/// the next, and capacity 0 assigns nothing however many wait.
#[tokio::test]
async fn assignment_honours_the_polled_capacity_and_zero_assigns_nothing() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    assert!(poll_jobs(&client, &mut s, 0, 2).await.is_none());
    let jobs = h
        .fake
        .queue_scale_set_jobs(id, &["a", "b", "c", "d", "e"])
        .expect("set");
    let (first, assigned, stats) = poll_jobs(&client, &mut s, 0, 2).await.expect("message");
    let kinds: Vec<_> = assigned.iter().map(|j| j.message_type.as_str()).collect();
    assert_eq!(kinds, ["JobAssigned", "JobAssigned"], "two of five");
    assert_eq!(stats.map(|s| s.total_assigned_jobs), Some(2));
    client.delete_message(&mut s, first).await.expect("ack");
    assert!(
        poll_jobs(&client, &mut s, first, 2).await.is_none(),
        "the rest wait"
    );

    assert!(h.fake.complete_scale_set_job(jobs[0], "succeeded"));
    let (second, messages, _) = poll_jobs(&client, &mut s, first, 2).await.expect("message");
    let kinds: Vec<_> = messages
        .iter()
        .map(|j| (j.message_type.as_str(), j.runner_request_id))
        .collect();
    let (done, next) = (
        i64::try_from(jobs[0]).expect("small"),
        i64::try_from(jobs[2]).expect("small"),
    );
    assert_eq!(kinds, [("JobCompleted", done), ("JobAssigned", next)]);
    client.delete_message(&mut s, second).await.expect("ack");

    assert!(poll_jobs(&client, &mut s, second, 0).await.is_none());
    assert!(h.fake.complete_scale_set_job(jobs[1], "succeeded"));
    let (third, messages, stats) = poll_jobs(&client, &mut s, second, 0)
        .await
        .expect("message");
    let kinds: Vec<_> = messages.iter().map(|j| j.message_type.as_str()).collect();
    assert_eq!(kinds, ["JobCompleted"], "capacity 0 assigns nothing");
    assert_eq!(stats.map(|s| s.total_assigned_jobs), Some(1));
    client.delete_message(&mut s, third).await.expect("ack");
    assert!(poll_jobs(&client, &mut s, third, 0).await.is_none());
}

/// GHES mode: a job appears as `JobAvailable` with its runner request id and, not acquired,
/// stays available over polls (scaleset #75); acquired, it is assigned.
#[tokio::test]
async fn in_ghes_mode_a_job_is_assigned_only_once_acquired() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake.set_scale_set_ghes(true);
    let request = h.fake.queue_scale_set_job(id, "build").expect("set");
    let request = i64::try_from(request).expect("small");
    let (first, jobs, stats) = poll_jobs(&client, &mut s, 0, 5).await.expect("message");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].message_type, "JobAvailable");
    assert_eq!(jobs[0].runner_request_id, request);
    let stats = stats.expect("statistics");
    assert_eq!(
        (stats.total_available_jobs, stats.total_assigned_jobs),
        (1, 0)
    );
    client.delete_message(&mut s, first).await.expect("ack");
    for _ in 0..3 {
        assert!(
            poll_jobs(&client, &mut s, first, 5).await.is_none(),
            "not acquired: never assigned"
        );
    }
    let acquired = client
        .acquire_jobs(&mut s, &[request])
        .await
        .expect("acquire");
    assert_eq!(acquired, [request]);
    let (_, jobs, stats) = poll_jobs(&client, &mut s, first, 5).await.expect("message");
    let kinds: Vec<_> = jobs
        .iter()
        .map(|j| (j.message_type.as_str(), j.runner_request_id))
        .collect();
    assert_eq!(kinds, [("JobAssigned", request)]);
    let stats = stats.expect("statistics");
    assert_eq!(
        (stats.total_available_jobs, stats.total_assigned_jobs),
        (0, 1)
    );
}

/// A job moved along by the controls: `JobStarted` names the runner, `JobCompleted` carries
/// the result, and the statistics on every message and on a new session follow the job
/// (assigned, running, busy and idle runners).
#[tokio::test]
async fn started_and_completed_jobs_are_announced_and_counted() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    client
        .generate_jit_config(id, "runner-1", "_work")
        .await
        .expect("jit");
    let request = h.fake.queue_scale_set_job(id, "build").expect("set");
    let (first, _, _) = poll_jobs(&client, &mut s, 0, 5).await.expect("assigned");
    client.delete_message(&mut s, first).await.expect("ack");
    assert!(h.fake.start_scale_set_job(request, "runner-1"));
    assert!(!h.fake.start_scale_set_job(request, "runner-1"), "once");
    let (second, jobs, stats) = poll_jobs(&client, &mut s, first, 5).await.expect("started");
    assert_eq!(jobs[0].message_type, "JobStarted");
    assert_eq!(jobs[0].runner_name.as_deref(), Some("runner-1"));
    let stats = stats.expect("statistics");
    assert_eq!(
        (
            stats.total_assigned_jobs,
            stats.total_running_jobs,
            stats.total_registered_runners,
            stats.total_busy_runners,
            stats.total_idle_runners
        ),
        (1, 1, 1, 1, 0)
    );
    client.delete_message(&mut s, second).await.expect("ack");
    client.delete_session(&s).await.expect("delete");
    let mut s = session(&client, id).await;
    let fresh = s.statistics.clone().expect("session statistics");
    assert_eq!((fresh.total_running_jobs, fresh.total_busy_runners), (1, 1));

    assert!(h.fake.complete_scale_set_job(request, "failed"));
    assert!(!h.fake.complete_scale_set_job(request, "failed"), "once");
    let (_, jobs, stats) = poll_jobs(&client, &mut s, second, 5)
        .await
        .expect("completed");
    assert_eq!(jobs[0].message_type, "JobCompleted");
    assert_eq!(jobs[0].result.as_deref(), Some("failed"));
    assert_eq!(jobs[0].runner_name.as_deref(), Some("runner-1"));
    let stats = stats.expect("statistics");
    assert_eq!(
        (
            stats.total_assigned_jobs,
            stats.total_running_jobs,
            stats.total_busy_runners,
            stats.total_idle_runners
        ),
        (0, 0, 0, 1)
    );
}

/// A registered fake runner of scale set `set`, from a JIT configuration of the client: what
/// the agent starts with `ACTIONS_RUNNER_INPUT_JITCONFIG`.
async fn scale_set_runner(client: &ScaleSetClient, set: u64, name: &str) -> (u64, RunnerSession) {
    let jit = client
        .generate_jit_config(set, name, "_work")
        .await
        .unwrap_or_else(|e| panic!("jit: {e}"));
    let config = FakeJitConfig::decode(jit.encoded_jit_config.expose_secret())
        .unwrap_or_else(|e| panic!("the fake runner reads it: {e}"));
    assert_eq!(config.runner_id, jit.runner_id);
    let session = RunnerSession::new(config);
    session
        .register()
        .await
        .unwrap_or_else(|e| panic!("register: {e}"));
    (jit.runner_id, session)
}

/// The next job messages after `last`, acknowledged: the id to poll after, and the messages.
async fn next_jobs(
    client: &ScaleSetClient,
    s: &mut Session,
    last: u64,
) -> (u64, Vec<rm_github::scaleset::JobMessage>) {
    let (id, jobs, _) = poll_jobs(client, s, last, 5).await.expect("a message");
    client.delete_message(s, id).await.expect("ack");
    (id, jobs)
}

/// A scale-set runner's life through the client and the runner protocol: the job assigned
/// with its repository, run and workflow ref; the runner takes it (`JobStarted` naming it);
/// removal while it runs is `JobStillRunning` whether the service answers 400 or 409; done,
/// `JobCompleted` carries its result; removal is still refused while GitHub lists it busy,
/// then done, and done again once gone. Every service call says who calls in a JSON
/// `User-Agent`, and after set-up nothing but the service, tokens and the runner protocol is
/// asked.
#[tokio::test]
async fn a_scale_set_runner_takes_its_job_and_is_removed_only_once_idle() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    let since = h.fake.now();
    h.fake
        .set_ephemeral_lag(Duration::from_secs(2), Duration::from_secs(60));
    let (runner_id, runner) = scale_set_runner(&client, id, "ss-1").await;
    let found = client.find_runner("ss-1").await.expect("find");
    assert_eq!(
        found,
        Some(ScaleSetRunner {
            id: runner_id,
            name: "ss-1".into(),
            scale_set_id: id
        })
    );
    assert_eq!(client.find_runner("ss-2").await.expect("find"), None);
    let got = client.get_runner(runner_id).await.expect("get");
    assert_eq!(got.map(|r| r.scale_set_id), Some(id));

    let request = h
        .fake
        .queue_scale_set_job_in(id, "build", "acme/widgets")
        .expect("set");
    let (last, jobs) = next_jobs(&client, &mut s, 0).await;
    let assigned = &jobs[0];
    assert_eq!(assigned.message_type, "JobAssigned");
    assert_eq!(
        (
            assigned.owner_name.as_str(),
            assigned.repository_name.as_str()
        ),
        ("acme", "widgets")
    );
    assert!(assigned.workflow_run_id.is_some());
    assert!(
        assigned
            .job_workflow_ref
            .starts_with("acme/widgets/.github/workflows/")
    );
    assert_eq!(assigned.request_labels, ["linux-x64"]);
    let job = runner.acquire().await.expect("acquire").expect("its job");
    assert_eq!(job.job_id, request);
    assert_eq!(job.repository, "acme/widgets");
    let (last, jobs) = next_jobs(&client, &mut s, last).await;
    assert_eq!(jobs[0].message_type, "JobStarted");
    assert_eq!(jobs[0].runner_id, i64::try_from(runner_id).ok());
    assert_eq!(jobs[0].runner_name.as_deref(), Some("ss-1"));

    let busy = client.remove_runner(runner_id).await;
    assert!(
        matches!(busy, Err(ScaleSetError::JobStillRunning { .. })),
        "{busy:?}"
    );
    h.fake.set_job_still_running_status(409);
    let busy = client.remove_runner(runner_id).await;
    assert!(
        matches!(busy, Err(ScaleSetError::JobStillRunning { .. })),
        "{busy:?}"
    );
    runner.complete(job.job_id, "failure").await.expect("done");
    let (_, jobs) = next_jobs(&client, &mut s, last).await;
    assert_eq!(jobs[0].message_type, "JobCompleted");
    assert_eq!(jobs[0].result.as_deref(), Some("failed"));
    assert_eq!(jobs[0].runner_name.as_deref(), Some("ss-1"));
    assert_eq!(jobs[0].runner_id, i64::try_from(runner_id).ok());
    let lingering = client.remove_runner(runner_id).await;
    assert!(
        matches!(lingering, Err(ScaleSetError::JobStillRunning { .. })),
        "busy for its lag: {lingering:?}"
    );
    h.advance(Duration::from_secs(2));
    client
        .remove_runner(runner_id)
        .await
        .expect("idle: removed");
    client
        .remove_runner(runner_id)
        .await
        .expect("gone: removed");
    assert_eq!(client.get_runner(runner_id).await.expect("get"), None);

    let counts = h.fake.request_counts_since(since);
    let rest: Vec<_> = counts
        .keys()
        .filter(|(kind, _)| *kind == RequestKind::Rest)
        .collect();
    assert!(rest.is_empty(), "no REST request after set-up: {rest:?}");
    assert_eq!(
        counts.get(&(
            RequestKind::Broker,
            "DELETE /rest/_apis/distributedtask/pools/{id}/agents/{id}".into()
        )),
        Some(&5)
    );
    for r in h.fake.requests_since(since) {
        if r.kind() != RequestKind::Broker {
            continue;
        }
        // Exactly one: a second (an HTTP library's own) would make the header a list.
        let agents = r
            .headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("user-agent"))
            .count();
        assert_eq!(agents, 1, "User-Agent headers on {} {}", r.method, r.path);
        let agent: serde_json::Value = r
            .header("user-agent")
            .and_then(|a| serde_json::from_str(a).ok())
            .unwrap_or_else(|| panic!("a JSON User-Agent on {} {}", r.method, r.path));
        assert_eq!(
            (&agent["system"], &agent["kind"]),
            (&json!("rm-agent"), &json!("scaleset"))
        );
        let subsystem = if r.path.starts_with("/scalesets/") {
            "listener"
        } else {
            "agent"
        };
        assert_eq!(agent["subsystem"], subsystem, "{} {}", r.method, r.path);
    }
}

/// A job assigned and not started in time is cancelled (`JobCompleted` `canceled`) and
/// assigned again, three times at most; the one a runner then takes runs to completion.
#[tokio::test]
async fn an_unstarted_job_is_reassigned_at_most_three_times() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake
        .set_scale_set_reassign_after(Duration::from_millis(30));
    let request = h.fake.queue_scale_set_job(id, "build").expect("set");
    let mut kinds = Vec::new();
    let mut last = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while kinds.len() < 7 && tokio::time::Instant::now() < deadline {
        if let Some((message, jobs, _)) = poll_jobs(&client, &mut s, last, 5).await {
            client.delete_message(&mut s, message).await.expect("ack");
            last = message;
            for j in jobs {
                assert_eq!(j.runner_request_id, i64::try_from(request).expect("small"));
                kinds.push(format!(
                    "{} {}",
                    j.message_type,
                    j.result.unwrap_or_default()
                ));
            }
        }
    }
    let again = ["JobCompleted canceled", "JobAssigned "];
    assert_eq!(
        kinds,
        [
            "JobAssigned ",
            again[0],
            again[1],
            again[0],
            again[1],
            again[0],
            again[1]
        ]
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        poll_jobs(&client, &mut s, last, 5).await.is_none(),
        "no fourth time"
    );
    let jobs = h.fake.scale_set_jobs(id);
    assert_eq!(jobs[0].1.reassignments, 3);
    let (_, runner) = scale_set_runner(&client, id, "late").await;
    let job = runner
        .acquire()
        .await
        .expect("acquire")
        .expect("still assigned");
    assert_eq!(job.job_id, request);
    runner.complete(job.job_id, "success").await.expect("done");
    let done = h.fake.scale_set_job(request).expect("job");
    assert_eq!(
        (done.result.as_deref(), done.runner_name.as_deref()),
        (Some("succeeded"), Some("late"))
    );
}

/// `JobCompleted` while the runner still runs its job (early completion, §6.6 scenario 16):
/// the runner stays busy, its removal refused; its own report later is accepted and announces
/// nothing more.
#[tokio::test]
async fn a_job_completed_early_keeps_its_runner_busy_until_it_reports_done() {
    let (h, client, id) = set_up().await;
    let mut s = session(&client, id).await;
    h.fake
        .set_ephemeral_lag(Duration::from_secs(2), Duration::from_secs(60));
    let (runner_id, runner) = scale_set_runner(&client, id, "ss-1").await;
    let request = h.fake.queue_scale_set_job(id, "build").expect("set");
    let job = runner.acquire().await.expect("acquire").expect("its job");
    let (last, _) = next_jobs(&client, &mut s, 0).await;
    let (last, jobs) = next_jobs(&client, &mut s, last).await;
    assert_eq!(jobs[0].message_type, "JobStarted");
    assert!(h.fake.complete_scale_set_job_early(request));
    let (last, jobs) = next_jobs(&client, &mut s, last).await;
    let kinds: Vec<_> = jobs.iter().map(|j| j.message_type.as_str()).collect();
    assert_eq!(kinds, ["JobCompleted"]);
    assert_eq!(
        jobs.last().and_then(|j| j.result.as_deref()),
        Some("succeeded")
    );
    // Longer than a finished runner lingers busy: this one has not finished.
    h.advance(Duration::from_secs(3));
    let runners = h.fake.scale_set_runners(id);
    assert!(runners.iter().all(|r| r.busy), "still running it");
    let busy = client.remove_runner(runner_id).await;
    assert!(
        matches!(busy, Err(ScaleSetError::JobStillRunning { .. })),
        "{busy:?}"
    );
    runner
        .complete(job.job_id, "success")
        .await
        .expect("done later");
    assert!(
        poll_jobs(&client, &mut s, last, 5).await.is_none(),
        "no second JobCompleted"
    );
    h.advance(Duration::from_secs(2));
    client
        .remove_runner(runner_id)
        .await
        .expect("idle: removed");
}

/// A scale-set runner never takes a REST job its labels fit, and a REST runner never takes
/// a scale-set job.
#[tokio::test]
async fn a_scale_set_runner_never_takes_a_rest_job_nor_a_rest_runner_a_scale_set_job() {
    let (h, client, id) = set_up().await;
    let (_, scale_set) = scale_set_runner(&client, id, "ss-1").await;
    let rest_job = h
        .fake
        .queue_job("acme/widgets", "rest", &["linux-x64"])
        .expect("queue");
    assert_eq!(scale_set.acquire().await.expect("acquire"), None);
    let request = h.fake.queue_scale_set_job(id, "build").expect("set");
    let encoded = h
        .fake
        .generate_jitconfig("acme", "rest-1", &["linux-x64"])
        .expect("jit");
    let rest = RunnerSession::new(FakeJitConfig::decode(&encoded).expect("config"));
    rest.register().await.expect("register");
    let taken = rest.acquire().await.expect("acquire").map(|j| j.job_id);
    assert_eq!(taken, Some(rest_job), "the REST job");
    let encoded = h
        .fake
        .generate_jitconfig("acme", "rest-2", &["linux-x64"])
        .expect("jit");
    let idle = RunnerSession::new(FakeJitConfig::decode(&encoded).expect("config"));
    idle.register().await.expect("register");
    assert_eq!(
        idle.acquire().await.expect("acquire"),
        None,
        "not the scale-set job"
    );
    let taken = scale_set
        .acquire()
        .await
        .expect("acquire")
        .map(|j| j.job_id);
    assert_eq!(taken, Some(request));
}

/// A client of enterprise `octo` presenting `pat`, its config URL `url`.
fn enterprise_client(h: &Harness, pat: impl Into<String>, url: &str) -> ScaleSetClient {
    ScaleSetClient::with_credential(
        h.client.clone(),
        Credential::EnterprisePat {
            slug: "octo".into(),
            token: secrecy::SecretString::from(pat.into()),
        },
        url,
    )
    .unwrap_or_else(|e| panic!("client: {e:#}"))
}

/// An enterprise client asks the registration token with its PAT (GitHub's media type, the
/// PAT as bearer) and exchanges it for the enterprise's config URL; the protocol after that is
/// the organization's. No App JWT or installation token is ever asked for.
#[tokio::test]
async fn an_enterprise_client_uses_its_pat_and_never_the_app() {
    let h = harness().await;
    h.fake.set_poll_hold(HOLD);
    h.fake.set_enterprise_pat("octo", "ghp_enterprise_pat");
    let client = enterprise_client(
        &h,
        "ghp_enterprise_pat",
        "https://github.com/enterprises/octo",
    );
    let before = h.fake.requests().len();
    let set = client
        .create_scale_set(1, "ent-x64", &[])
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));
    let mut s = session(&client, set.id).await;
    assert!(
        client
            .get_message(&mut s, 0, 5)
            .await
            .expect("poll")
            .is_none()
    );
    let jit = client
        .generate_jit_config(set.id, "ent-1", "_work")
        .await
        .unwrap_or_else(|e| panic!("jit: {e}"));
    let runners = h.fake.scale_set_runners(set.id);
    assert_eq!(runners.len(), 1);
    assert_eq!(runners[0].id, jit.runner_id);
    assert_eq!(
        runners[0].scope,
        rm_fake_github::RunnerScope::Enterprise("octo".into())
    );
    let requests: Vec<_> = h.fake.requests().into_iter().skip(before).collect();
    let tokens: Vec<_> = requests
        .iter()
        .filter(|r| r.path.ends_with("/registration-token"))
        .collect();
    assert_eq!(tokens.len(), 1, "one registration token");
    assert_eq!(
        tokens[0].path,
        "/enterprises/octo/actions/runners/registration-token"
    );
    let header = |name: &str| {
        tokens[0]
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("authorization").as_deref(),
        Some("Bearer <redacted>")
    );
    assert_eq!(
        header("accept").as_deref(),
        Some("application/vnd.github+json")
    );
    let app: Vec<_> = requests
        .iter()
        .filter(|r| r.path.contains("/app") || r.path.ends_with("/installation"))
        .map(|r| r.path.clone())
        .collect();
    assert!(app.is_empty(), "App requests for an enterprise: {app:?}");
    assert!(!format!("{client:?}").contains("ghp_"), "{client:?}");
}

/// A wrong PAT, or an App's installation token where the PAT belongs, is
/// [`ScaleSetError::TokenRefused`] (401, 403): a refusal waiting does not fix, whose words
/// never carry the token.
#[tokio::test]
async fn a_refused_enterprise_pat_is_token_refused_and_permanent() {
    let h = harness().await;
    h.fake.set_enterprise_pat("octo", "ghp_enterprise_pat");
    let installation = h
        .client
        .create_installation_token(h.org_installation)
        .await
        .unwrap_or_else(|e| panic!("installation token: {e}"));
    for (presented, status) in [
        ("ghp_wrong_pat".to_owned(), 401),
        (installation.token.expose_secret().to_owned(), 403),
    ] {
        let client =
            enterprise_client(&h, presented.clone(), "https://github.com/enterprises/octo");
        let refused = client.get_scale_set(1, "ent-x64").await;
        match &refused {
            Err(e @ ScaleSetError::TokenRefused { status: s, .. }) if *s == status => {
                let words = e.to_string();
                assert!(!words.contains(&presented), "{words}");
                assert!(words.contains("manage_runners:enterprise"), "{words}");
                assert_eq!(
                    rm_github::scaleset::listener::Outcome::of(e),
                    rm_github::scaleset::listener::Outcome::Permanent
                );
            }
            other => panic!("{status}: {other:?}"),
        }
    }
}

/// On GHES (an API base path) the enterprise's registration token is asked below it, as the
/// RemoteAuth exchange is.
#[tokio::test]
async fn under_an_api_base_path_the_enterprise_token_is_asked_below_it() {
    let h = harness_with("/api/v3", Duration::from_secs(10)).await;
    h.fake.set_enterprise_pat("octo", "ghp_enterprise_pat");
    let client = enterprise_client(
        &h,
        "ghp_enterprise_pat",
        "https://ghes.example/enterprises/octo",
    );
    client.verify_credential().await.expect("issued");
    assert_eq!(
        h.fake.broker_calls(
            "POST",
            "/api/v3/enterprises/octo/actions/runners/registration-token"
        ),
        1
    );
}
