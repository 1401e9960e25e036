//! Failed-delivery recovery and webhook health against the fake GitHub and the real receiver:
//! failed deliveries are redelivered once and arrive through the normal intake; trust in the
//! webhooks is lost on evidence and comes back as the rule says.

use std::time::Duration;

use rm_receiver::{MAX_BODY_BYTES, Receiver, ReceiverConfig, WebhookSecrets};
use rm_vocab::Clock as _;
use secrecy::SecretString;

use super::*;
use crate::polling::health::{RECONCILE_INTERVAL, TRUST_RESTORE_AFTER};
use crate::polling::redeliver::{DELIVERY_SETTLE, SCAN_INTERVAL};

const SECRET: &str = "polling-test-secret";

/// Starts the real receiver on loopback, journalling into the harness's journal, and points
/// the fake's webhook at it.
pub(super) async fn receive(h: &Harness) {
    serve(h, h.journal.clone()).await;
}

/// Points the fake's webhook at a receiver with a journal of its own (the App's webhook goes
/// to another host): deliveries succeed, and this agent never sees them.
async fn elsewhere(h: &Harness) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let other = Journal::open(&dir.path().join(JOURNAL_FILE), Retention::default()).unwrap();
    serve(h, other).await;
    dir
}

async fn serve(h: &Harness, journal: Journal) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhook", listener.local_addr().unwrap());
    let secrets = WebhookSecrets::new(vec![SecretString::from(SECRET)]).unwrap();
    let receiver = Receiver::new(
        ReceiverConfig {
            path: "/webhook".into(),
            secrets,
            max_body_bytes: MAX_BODY_BYTES,
        },
        journal,
    );
    tokio::spawn(receiver.serve(listener, std::future::pending()));
    h.fake.set_webhook(&url, SecretString::from(SECRET));
}

fn redelivery_requests(h: &Harness) -> usize {
    h.fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/attempts"))
        .count()
}

/// A ping journalled at the manual clock's time: a delivery arriving now.
async fn delivery_now(h: &Harness, guid: &str) {
    h.journal
        .record(rm_journal::Incoming {
            guid: guid.into(),
            event: "ping".into(),
            headers: Vec::new(),
            body: br#"{"zen":"Keep it logically awesome.","hook_id":1}"#.to_vec(),
            received_at_ms: h.clock.now(),
            source: rm_vocab::Source::Webhook,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn failed_deliveries_are_redelivered_once_through_the_normal_intake() {
    let h = Harness::new().await;
    receive(&h).await;
    h.fake.fail_next_deliveries(2);
    let jobs = [
        h.queue("acme/widgets"),
        h.queue("acme/widgets"),
        h.queue("acme/gadgets"),
    ];
    h.fake.settle().await.unwrap();
    let reader = Reader::open(&h.path).unwrap();
    assert_eq!(
        reader.delivery_count().unwrap(),
        1,
        "two deliveries were lost"
    );

    // Deliveries younger than the settle time are left for a later scan.
    let mut poller = h.poller(&["acme"], true);
    let early = poller.poll_once().await.unwrap();
    assert_eq!((early.failed_deliveries, early.redelivered), (0, 0));

    h.advance(SCAN_INTERVAL.max(DELIVERY_SETTLE));
    let report = poller.poll_once().await.unwrap();
    assert_eq!((report.failed_deliveries, report.redelivered), (2, 2));
    h.fake.settle().await.unwrap();
    assert_eq!(redelivery_requests(&h), 2);
    // They came in through the receiver, same GUIDs, and the journal has every job announced.
    assert_eq!(reader.delivery_count().unwrap(), 3);
    for id in jobs {
        let row = h.job(id);
        assert_eq!(row.state, rm_vocab::JobState::Queued);
    }
    // Evidence of lost deliveries (the failures in the hook log, and perhaps the jobs the
    // first pass polled if their redeliveries are still on their way).
    let status = poller.status().borrow().clone();
    assert!(!status.webhooks.trusted, "{:?}", status.webhooks);
    assert_ne!(
        status.pace,
        Pace::Reconciling,
        "full schedule while untrusted"
    );

    // Later scans ask for nothing again.
    for _ in 0..3 {
        h.advance(SCAN_INTERVAL);
        let later = poller.poll_once().await.unwrap();
        assert_eq!(later.redelivered, 0);
    }
    assert_eq!(redelivery_requests(&h), 2, "each GUID redelivered once");
}

#[tokio::test]
async fn a_redelivery_that_fails_again_is_not_asked_for_twice() {
    let h = Harness::new().await;
    receive(&h).await;
    // The original and its redelivery both fail: polling, not a loop of redeliveries, covers it.
    h.fake.fail_next_deliveries(2);
    let job = h.queue("acme/widgets");
    h.fake.settle().await.unwrap();
    // (GitHub's timestamps are whole seconds: a little past the settle time.)
    h.advance(DELIVERY_SETTLE + Duration::from_secs(2));
    let mut poller = h.poller(&["acme"], true);
    let first = poller.poll_once().await.unwrap();
    assert_eq!(first.redelivered, 1);
    h.fake.settle().await.unwrap();
    h.advance(SCAN_INTERVAL);
    let second = poller.poll_once().await.unwrap();
    assert_eq!((second.failed_deliveries, second.redelivered), (1, 0));
    assert_eq!(redelivery_requests(&h), 1);
    assert_eq!(h.job(job).source, "poll", "polling journalled the job");
}

#[tokio::test]
async fn trusted_webhooks_reduce_polling_to_a_slow_reconciliation_pass() {
    let h = Harness::new().await;
    receive(&h).await;
    let job = h.queue("acme/widgets");
    h.fake.settle().await.unwrap();
    assert_eq!(h.job(job).source, "webhook");

    let mut poller = h.poller(&["acme"], true);
    let report = poller.poll_once().await.unwrap();
    assert!(report.polled_demand, "the start-up pass reconciles");
    assert_eq!(report.unannounced, 0, "the delivery announced the job");
    let status = poller.status().borrow().clone();
    assert!(status.webhooks.trusted);
    assert_eq!(status.pace, Pace::Reconciling);
    assert_eq!(
        status.next_poll_in_ms(h.clock.now().to_system_time()),
        u64::try_from(RECONCILE_INTERVAL.as_millis()).unwrap()
    );
    // Waking for the delivery scan does not poll demand early.
    h.advance(SCAN_INTERVAL);
    assert!(!poller.poll_once().await.unwrap().polled_demand);
    h.advance(RECONCILE_INTERVAL - SCAN_INTERVAL);
    assert!(poller.poll_once().await.unwrap().polled_demand);
}

#[tokio::test]
async fn an_unannounced_job_distrusts_the_webhooks_until_deliveries_resume() {
    let h = Harness::new().await;
    // A receiver is configured, but the App's webhook goes elsewhere: nothing arrives here, and
    // GitHub's hook log shows every delivery succeeded.
    let _other = elsewhere(&h).await;
    let job = h.queue("acme/widgets");
    h.fake.settle().await.unwrap();
    let mut poller = h.poller(&["acme"], true);
    let first = poller.poll_once().await.unwrap();
    assert_eq!(
        first.unannounced, 0,
        "inside the grace: the delivery may be on its way"
    );
    assert!(poller.status().borrow().webhooks.trusted);

    // (GitHub's timestamps are whole seconds: a little past the grace.)
    h.advance(health::ANNOUNCE_GRACE + Duration::from_secs(2));
    let later = poller.poll_once().await.unwrap();
    assert_eq!(later.unannounced, 1);
    let status = poller.status().borrow().clone();
    assert_eq!(
        (status.webhooks.trusted, status.webhooks.reason),
        (false, "unannounced_job")
    );
    assert_eq!(status.unannounced_jobs, 1);
    assert_eq!(h.job(job).source, "poll");
    assert!(status.pace != Pace::Reconciling);

    // Trust needs a delivery after the evidence, and ten quiet minutes.
    h.advance(TRUST_RESTORE_AFTER);
    poller.poll_once().await.unwrap();
    assert!(
        !poller.status().borrow().webhooks.trusted,
        "nothing arrived"
    );
    delivery_now(&h, "ping-1").await;
    poller.poll_once().await.unwrap();
    let status = poller.status().borrow().clone();
    assert_eq!(
        (status.webhooks.trusted, status.pace),
        (true, Pace::Reconciling)
    );
}
