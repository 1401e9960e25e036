//! The fake's webhooks as a receiver sees them: signed like GitHub's, shaped like the real
//! payloads in `tests/fixtures/webhooks/`, sent as jobs move but (as GitHub) in no promised
//! order and at least once, logged with outcomes.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rm_fake_github::{AppKeyPair, Chaos, FakeGithub, FakeOptions, WebhookOrder, signature};
use secrecy::SecretString;
use serde_json::Value;

const SECRET: &str = "It's a Secret to Everybody";

type Seen = Arc<Mutex<Vec<(http::HeaderMap, Bytes)>>>;

/// A receiver on loopback that records every delivery and answers `status`.
async fn receiver(status: u16) -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!(
        "http://{}/webhook",
        listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let record = record.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            record
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((parts.headers, body));
                            let mut resp =
                                http::Response::new(Full::new(Bytes::from_static(b"ok")));
                            *resp.status_mut() =
                                http::StatusCode::from_u16(status).unwrap_or_default();
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (url, seen)
}

async fn fake() -> FakeGithub {
    fake_with(None).await
}

/// A fake whose webhooks go out as `order` says (the default's chaos when `None`).
async fn fake_with(order: Option<WebhookOrder>) -> FakeGithub {
    // The webhook side needs no JWT checks, so any public key will do; make a real one anyway.
    let key = AppKeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let mut options = FakeOptions::new(77, key.public_pem);
    if let Some(order) = order {
        options.webhook_order = order;
    }
    let fake = FakeGithub::start(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fake.add_repo("acme/widgets");
    fake
}

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/../fixtures/webhooks/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The action of each delivery the receiver saw, in arrival order, with its GUID.
fn arrivals(seen: &Seen) -> Vec<(String, String)> {
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(h, b)| {
            let v: Value = serde_json::from_slice(b).unwrap_or_default();
            let action = v["action"].as_str().unwrap_or("").to_owned();
            (action, header(h, "x-github-delivery").to_owned())
        })
        .collect()
}

#[tokio::test]
async fn jobs_moving_send_signed_deliveries() {
    // In order only here, where the test reads each of the three events by position.
    let fake = fake_with(Some(WebhookOrder::InOrder)).await;
    let (url, seen) = receiver(202).await;
    fake.set_webhook(&url, SecretString::from(SECRET));
    let job = fake
        .queue_job("acme/widgets", "build", &["self-hosted", "linux"])
        .unwrap_or_else(|e| panic!("{e}"));
    let jit = fake
        .generate_jitconfig("acme", "rm-h-1", &["self-hosted", "linux", "x64"])
        .unwrap_or_else(|e| panic!("{e}"));
    let config = rm_fake_github::FakeJitConfig::decode(&jit).unwrap_or_else(|e| panic!("{e}"));
    let session = rm_fake_github::runner_client::RunnerSession::new(config);
    session.register().await.unwrap_or_else(|e| panic!("{e}"));
    let assigned = session.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(assigned.map(|a| a.job_id), Some(job));
    session
        .complete(job, "success")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fake.settle().await.unwrap_or_else(|e| panic!("{e}"));

    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let actions: Vec<String> = seen
        .iter()
        .map(|(_, b)| {
            let v: Value = serde_json::from_slice(b).unwrap_or_default();
            v["action"].as_str().unwrap_or("").to_owned()
        })
        .collect();
    assert_eq!(actions, ["queued", "in_progress", "completed"]);
    let mut guids = BTreeSet::new();
    for (h, body) in &seen {
        assert_eq!(
            header(h, "x-hub-signature-256"),
            signature(SECRET.as_bytes(), body)
        );
        assert_eq!(header(h, "x-github-event"), "workflow_job");
        assert_eq!(header(h, "content-type"), "application/json");
        assert!(header(h, "user-agent").starts_with("GitHub-Hookshot/"));
        assert_eq!(
            header(h, "x-github-hook-installation-target-type"),
            "integration"
        );
        assert_eq!(header(h, "x-github-hook-installation-target-id"), "77");
        assert!(!header(h, "x-github-hook-id").is_empty());
        let guid = header(h, "x-github-delivery");
        assert!(uuid::Uuid::parse_str(guid).is_ok(), "{guid}");
        guids.insert(guid.to_owned());
    }
    assert_eq!(guids.len(), 3, "each delivery has its own GUID");
    let done: Value = serde_json::from_slice(&seen[2].1).unwrap_or_default();
    assert_eq!(done["workflow_job"]["runner_name"], "rm-h-1");
    assert_eq!(done["workflow_job"]["conclusion"], "success");
    assert!(done["installation"]["id"].is_u64());
    assert!(
        fake.deliveries()
            .iter()
            .all(|d| d.status == "OK" && d.status_code == 202)
    );
    let listed = fake.runners();
    assert!(
        listed.len() == 1 && listed[0].busy,
        "right after its job the ephemeral runner is still listed busy, as on GitHub"
    );
}

#[tokio::test]
async fn by_default_deliveries_arrive_reordered_and_duplicated_under_a_replayable_seed() {
    // The default chaos, but a duplicate for every delivery and delays wide enough that the
    // three quick events of one job cross on the way.
    let chaos = Chaos {
        duplicate_one_in: 1,
        max_delay: std::time::Duration::from_millis(800),
        ..Chaos::with_seed(1)
    };
    let default = FakeOptions::new(1, String::new()).webhook_order;
    assert!(
        matches!(default, WebhookOrder::Chaotic(_)),
        "the default is GitHub's disorder, not the easy case"
    );
    // Seeds are tried in turn until one reorders: which does depends on timing, not on luck
    // alone; each is printed by the fake, so a failure names what it ran.
    for seed in 1..=20 {
        let fake = fake_with(Some(WebhookOrder::Chaotic(Chaos { seed, ..chaos }))).await;
        let (url, seen) = receiver(202).await;
        fake.set_webhook(&url, SecretString::from(SECRET));
        let mut jobs = Vec::new();
        for i in 0..3 {
            let job = fake
                .queue_job("acme/widgets", &format!("j{i}"), &["self-hosted"])
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(fake.complete_job(job, "success"));
            jobs.push(job);
        }
        fake.settle().await.unwrap_or_else(|e| panic!("{e}"));
        let arrived = arrivals(&seen);
        let log = fake.deliveries();
        assert_eq!(log.len(), 12, "6 events, each sent twice");
        assert_eq!(arrived.len(), 12);
        // A duplicate is the same delivery again: same GUID, same body.
        for d in log.iter().filter(|d| d.duplicate_of.is_some()) {
            let original = log.iter().find(|o| Some(o.id) == d.duplicate_of);
            let original = original.unwrap_or_else(|| panic!("no original"));
            assert_eq!((&d.guid, &d.body), (&original.guid, &original.body));
        }
        let distinct: BTreeSet<&String> = arrived.iter().map(|(_, g)| g).collect();
        assert_eq!(distinct.len(), 6);
        // Reordered: for some job, its `completed` arrived before its first `queued`.
        let recorded: Vec<(String, String)> = log
            .iter()
            .filter(|d| d.duplicate_of.is_none())
            .map(|d| (d.action.clone().unwrap_or_default(), d.guid.clone()))
            .collect();
        let first_arrival = |guid: &str| arrived.iter().position(|(_, g)| g == guid);
        let crossed = recorded.chunks(2).any(|pair| match pair {
            [(_, queued), (_, completed)] => first_arrival(completed) < first_arrival(queued),
            _ => false,
        });
        if crossed {
            return;
        }
    }
    panic!("20 seeds and no delivery ever overtook an earlier one");
}

#[tokio::test]
async fn payloads_have_every_field_of_githubs_examples() {
    let fake = fake().await;
    fake.queue_job("acme/widgets", "build", &["self-hosted"])
        .unwrap_or_else(|e| panic!("{e}"));
    let ours: Value = serde_json::from_slice(&fake.deliveries()[0].body).unwrap_or_default();
    for name in [
        "workflow_job.queued.5.json",
        "workflow_job.queued.6.json",
        "workflow_job.completed.1.json",
    ] {
        let example = fixture(name);
        // `deployment` only comes with environment jobs, `enterprise` with enterprise accounts.
        let wanted: BTreeSet<String> = keys(&example)
            .into_iter()
            .filter(|k| k != "deployment" && k != "enterprise")
            .collect();
        let missing: Vec<_> = wanted.difference(&keys(&ours)).cloned().collect();
        assert!(missing.is_empty(), "{name}: top level lacks {missing:?}");
        let missing: Vec<_> = keys(&example["workflow_job"])
            .difference(&keys(&ours["workflow_job"]))
            .cloned()
            .collect();
        assert!(missing.is_empty(), "{name}: workflow_job lacks {missing:?}");
        let missing: Vec<_> = keys(&example["repository"])
            .difference(&keys(&ours["repository"]))
            .cloned()
            .collect();
        assert!(missing.is_empty(), "{name}: repository lacks {missing:?}");
    }
    assert!(
        ours["workflow_job"]["runner_id"].is_null(),
        "runner fields are null while queued"
    );
}

#[tokio::test]
async fn failed_and_refused_deliveries_are_logged_not_retried() {
    // In order and once: the test counts one attempt per event, and GitHub's own duplicates (a
    // second attempt with the same GUID, which the chaotic default sends for one in four) would
    // count as retries. Duplicates have a test of their own (by_default_deliveries_arrive_...).
    let fake = fake_with(Some(WebhookOrder::InOrder)).await;
    let (url, seen) = receiver(500).await;
    fake.set_webhook(&url, SecretString::from(SECRET));
    fake.fail_next_deliveries(1);
    fake.queue_job("acme/widgets", "a", &["self-hosted"])
        .unwrap_or_else(|e| panic!("{e}"));
    fake.queue_job("acme/widgets", "b", &["self-hosted"])
        .unwrap_or_else(|e| panic!("{e}"));
    fake.settle().await.unwrap_or_else(|e| panic!("{e}"));
    let log = fake.deliveries();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].status_code, log[0].status.as_str()),
        (0, "Failed to connect to host")
    );
    assert_eq!(
        (log[1].status_code, log[1].status.as_str()),
        (500, "Invalid HTTP Response: 500")
    );
    assert_eq!(seen.lock().unwrap_or_else(|e| e.into_inner()).len(), 1);
}
