//! The notifier: the rate limit and messages; the webhook body, its signature, the retry rules
//! and the queues as pure tables; deliveries to in-process receivers on 127.0.0.1.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rm_receiver::prometheus_client::encoding::text::encode;
use rm_receiver::prometheus_client::registry::Registry;
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use super::*;

#[test]
fn one_notification_per_kind_per_interval() {
    let t0 = Instant::now();
    assert!(may_send(None, t0));
    assert!(!may_send(Some(t0), t0));
    assert!(!may_send(
        Some(t0),
        t0 + MIN_INTERVAL - Duration::from_secs(1)
    ));
    assert!(may_send(Some(t0), t0 + MIN_INTERVAL));
    // A clock that went backwards (it cannot, with Instant) would not open the gate early.
    assert!(!may_send(Some(t0 + Duration::from_secs(5)), t0));

    let mut limit = RateLimit::default();
    assert!(limit.admit(EventKind::WebhooksStopped, t0));
    assert!(!limit.admit(EventKind::WebhooksStopped, t0 + Duration::from_secs(60)));
    assert!(
        limit.admit(EventKind::CredentialsRejected, t0 + Duration::from_secs(60)),
        "kinds are counted apart"
    );
    assert!(limit.admit(EventKind::WebhooksStopped, t0 + MIN_INTERVAL));
    assert!(!limit.admit(EventKind::WebhooksStopped, t0 + MIN_INTERVAL));
}

#[test]
fn events_of_one_kind_share_the_limit_whatever_their_policy() {
    let a = OperatorEvent::RunnersFailingToStart {
        policy: "a".into(),
        failures: 3,
    };
    let b = OperatorEvent::RunnersFailingToStart {
        policy: "b".into(),
        failures: 1,
    };
    assert_eq!(a.kind(), b.kind());
}

#[test]
fn messages_say_what_happened_and_what_to_do() {
    let (summary, body) = OperatorEvent::DemandWaitingAtCapacity {
        policy: "linux".into(),
        waiting: 7,
    }
    .message();
    assert!(summary.contains("linux"), "{summary}");
    assert!(
        body.contains("7 jobs") && body.contains("max_runners"),
        "{body}"
    );
    let (_, body) = OperatorEvent::CredentialsRejected.message();
    assert!(body.contains("rm-agent check"), "{body}");
}

#[test]
fn a_disabled_notifier_sends_nothing() {
    let notifier = Notifier::new(false);
    for _ in 0..3 {
        assert!(matches!(
            notifier.dispatch(OperatorEvent::WebhooksStopped),
            Dispatch::Disabled
        ));
    }
}

#[test]
fn a_notifier_with_webhooks_and_no_desktop_still_rate_limits() {
    let notifier = Notifier::with_webhooks(false, unstarted(&[all_kinds()]));
    assert!(matches!(
        notifier.dispatch(OperatorEvent::WebhooksStopped),
        Dispatch::Disabled
    ));
    assert!(matches!(
        notifier.dispatch(OperatorEvent::WebhooksStopped),
        Dispatch::RateLimited
    ));
    notifier.notify(OperatorEvent::CredentialsRejected);
    let queued = notifier.webhooks.as_ref().unwrap().take(0);
    let kinds: Vec<EventKind> = queued.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::WebhooksStopped, EventKind::CredentialsRejected],
        "the repeated kind went to no sink"
    );
}

// ---- The webhook body and its signature (pure) ----

/// 2023-11-14T22:13:20Z.
fn at() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

/// One event of every kind, in [`EventKind::ALL`]'s order.
fn one_of_each() -> Vec<OperatorEvent> {
    vec![
        OperatorEvent::WebhooksStopped,
        OperatorEvent::CredentialsRejected,
        OperatorEvent::RunnersFailingToStart {
            policy: "linux".to_owned(),
            failures: 3,
        },
        OperatorEvent::DemandWaitingAtCapacity {
            policy: "gpu".to_owned(),
            waiting: 7,
        },
        OperatorEvent::HostUnfit {
            problems: vec![
                "the runner root /r has 1.0 MiB free".to_owned(),
                "`git` is not on the runners' PATH".to_owned(),
            ],
        },
        OperatorEvent::JobRerun {
            policy: "linux".to_owned(),
            job_id: 4_242,
            reason: "oom_killed".to_owned(),
            result: "refused".to_owned(),
            detail: "the App lacks actions: write".to_owned(),
        },
        OperatorEvent::RunnerFailed {
            policy: "linux".to_owned(),
            runner_name: "rm-builder-01-0123456789ab".to_owned(),
            job_id: Some(4_243),
            reason: "oom_killed".to_owned(),
            detail: "the kernel killed 1 process(es) of the runner's cgroup for memory".to_owned(),
        },
        OperatorEvent::ScaleSetBackingOff {
            scale_set: "acme-big".to_owned(),
            reason: "the Actions service answered 418 on poll:  I'm a teapot".to_owned(),
        },
    ]
}

#[test]
fn each_kind_has_one_name_and_one_event() {
    let events = one_of_each();
    let kinds: Vec<EventKind> = events.iter().map(OperatorEvent::kind).collect();
    assert_eq!(kinds, EventKind::ALL, "one event of each kind, in order");
    for kind in EventKind::ALL {
        assert_eq!(EventKind::from_name(kind.name()), Some(kind));
        assert!(
            kind.name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{kind}"
        );
    }
    assert_eq!(EventKind::from_name("WebhooksStopped"), None);
}

/// A scale set's back-off names the scale set and the answer, and where to look.
#[test]
fn a_scale_set_backing_off_says_which_and_why() {
    let event = OperatorEvent::ScaleSetBackingOff {
        scale_set: "acme-big".to_owned(),
        reason: "the Actions service answered 418 on poll:  I'm a teapot".to_owned(),
    };
    assert_eq!(event.kind(), EventKind::ScaleSetBackingOff);
    assert_eq!(event.kind().name(), "scale_set_backing_off");
    let (summary, detail) = event.message();
    assert_eq!(summary, "rm: scale set acme-big's listener backs off");
    assert!(
        detail.starts_with("the Actions service answered 418"),
        "{detail}"
    );
    assert!(detail.contains("rm-agent status"), "{detail}");
}

#[test]
fn the_body_of_each_kind_is_the_contracts() {
    let common = |event: &OperatorEvent| {
        let (summary, detail) = event.message();
        json!({
            "event": event.kind().name(),
            "host": "builder-01",
            "at": "2023-11-14T22:13:20.000Z",
            "summary": summary,
            "detail": detail,
        })
    };
    let own_fields = [
        json!({}),
        json!({}),
        json!({"policy": "linux", "failures": 3}),
        json!({"policy": "gpu", "waiting": 7}),
        json!({"problems": [
            "the runner root /r has 1.0 MiB free",
            "`git` is not on the runners' PATH",
        ]}),
        json!({"policy": "linux", "job_id": 4242, "reason": "oom_killed", "result": "refused"}),
        json!({"policy": "linux", "runner_name": "rm-builder-01-0123456789ab", "job_id": 4243, "reason": "oom_killed"}),
        json!({"scale_set": "acme-big", "reason": "the Actions service answered 418 on poll:  I'm a teapot"}),
    ];
    assert_eq!(own_fields.len(), EventKind::ALL.len());
    for (event, own) in one_of_each().iter().zip(own_fields) {
        let bytes = body::body(event, "builder-01", at());
        let parsed: Value = serde_json::from_slice(&bytes).unwrap();
        let mut expected = common(event);
        for (key, value) in own.as_object().unwrap() {
            let previous = expected
                .as_object_mut()
                .unwrap()
                .insert(key.clone(), value.clone());
            assert!(previous.is_none(), "{key} shadows a common key");
        }
        assert_eq!(parsed, expected, "{:?}", event.kind());
        // One line, no trailing newline: the signed bytes are exactly the object.
        assert!(!bytes.contains(&b'\n'));
    }
}

/// The example in CONTRACT §10 is what the agent sends, byte for byte.
#[test]
fn the_contracts_example_body_is_the_agents() {
    let contract =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/contract.md"))
            .unwrap();
    let example = contract
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("{\"event\":\"runners_failing_to_start\""))
        .expect("CONTRACT §10 shows a body");
    let at = humantime::parse_rfc3339("2026-12-03T15:36:05.123Z").unwrap();
    let event = OperatorEvent::RunnersFailingToStart {
        policy: "linux".to_owned(),
        failures: 3,
    };
    assert_eq!(
        String::from_utf8(body::body(&event, "builder-01", at)).unwrap(),
        example
    );
}

#[test]
fn the_signature_is_githubs() {
    // GitHub's documented example for X-Hub-Signature-256 ("Validating webhook deliveries").
    assert_eq!(
        body::signature(b"It's a Secret to Everybody", b"Hello, World!"),
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    );
    // rm's own receiver's verifier (what a receiver reuses) takes it, and only for these bytes.
    let body = body::body(&OperatorEvent::WebhooksStopped, "h", at());
    let header = body::signature(b"k3y", &body);
    let secrets = rm_receiver::WebhookSecrets::new(vec!["k3y".into()]).unwrap();
    assert!(secrets.verify(header.as_bytes(), &body));
    let mut tampered = body.clone();
    tampered[2] ^= 1;
    assert!(!secrets.verify(header.as_bytes(), &tampered));
    let other = rm_receiver::WebhookSecrets::new(vec!["other".into()]).unwrap();
    assert!(!other.verify(header.as_bytes(), &body));
}

#[test]
fn a_body_never_holds_the_secret() {
    const SECRET: &str = "s3cret-hmac-key-7f1c";
    let webhooks = webhook::Webhooks::new(
        "builder-01".to_owned(),
        vec![endpoint(
            "http://127.0.0.1:9/hook",
            Some(SECRET),
            EventKind::ALL.to_vec(),
        )],
        webhook::QUEUE_CAPACITY,
    );
    for event in one_of_each() {
        webhooks.enqueue(&event, at());
    }
    let queued = webhooks.take(0);
    assert_eq!(queued.len(), EventKind::ALL.len());
    for delivery in queued {
        let text = String::from_utf8(delivery.body.to_vec()).unwrap();
        assert!(!text.contains(SECRET), "{text}");
        let signature = delivery.signature.expect("signed");
        assert!(!signature.contains(SECRET));
        assert_eq!(
            signature,
            body::signature(SECRET.as_bytes(), &delivery.body)
        );
    }
    // Nor does the endpoint's debug form.
    let shown = format!("{webhooks:?}");
    assert!(!shown.contains(SECRET), "{shown}");
}

// ---- Delivery decisions (pure) ----

#[test]
fn the_retry_decision_per_answer() {
    use retry::{Attempt, Step};
    let policy = retry::RetryPolicy::DEFAULT;
    let answered = |code: u16| Attempt::Answered {
        status: http::StatusCode::from_u16(code).unwrap(),
        retry_after: None,
    };
    enum Expect {
        Delivered,
        Retry,
        Final,
    }
    let cases = [
        (answered(200), Expect::Delivered),
        (answered(202), Expect::Delivered),
        (answered(204), Expect::Delivered),
        (answered(400), Expect::Final),
        (answered(401), Expect::Final),
        (answered(403), Expect::Final),
        (answered(404), Expect::Final),
        (answered(410), Expect::Final),
        (answered(422), Expect::Final),
        (answered(301), Expect::Final),
        (answered(308), Expect::Final),
        (answered(408), Expect::Retry),
        (answered(429), Expect::Retry),
        (answered(500), Expect::Retry),
        (answered(502), Expect::Retry),
        (answered(503), Expect::Retry),
        (Attempt::TimedOut, Expect::Retry),
        (
            Attempt::Failed("tcp connect error: Connection refused".to_owned()),
            Expect::Retry,
        ),
    ];
    for (outcome, expect) in cases {
        let first = retry::step(&policy, 1, &outcome);
        let last = retry::step(&policy, policy.max_attempts, &outcome);
        match expect {
            Expect::Delivered => {
                assert_eq!(first, Step::Delivered, "{outcome:?}");
                assert_eq!(last, Step::Delivered, "{outcome:?}");
            }
            Expect::Final => {
                assert!(
                    matches!(&first, Step::GiveUp(why) if why.contains("final")),
                    "{outcome:?}: {first:?}"
                );
            }
            Expect::Retry => {
                assert_eq!(first, Step::Retry(retry::BACKOFF_BASE), "{outcome:?}");
                assert!(
                    matches!(&last, Step::GiveUp(why) if why.contains("after 6 attempts")),
                    "{outcome:?}: {last:?}"
                );
            }
        }
    }
}

#[test]
fn the_backoff_doubles_up_to_its_cap_and_gives_up_after_the_last_attempt() {
    use retry::{Attempt, Step};
    let policy = retry::RetryPolicy::DEFAULT;
    let failed = Attempt::Failed("connection reset".to_owned());
    let waits: Vec<Step> = (1..=policy.max_attempts)
        .map(|attempt| retry::step(&policy, attempt, &failed))
        .collect();
    let secs = |s| Step::Retry(Duration::from_secs(s));
    assert_eq!(
        waits[..5],
        [secs(5), secs(10), secs(20), secs(40), secs(80)]
    );
    assert!(matches!(waits[5], Step::GiveUp(_)), "{waits:?}");

    let capped = retry::RetryPolicy {
        cap: Duration::from_secs(12),
        max_attempts: 40,
        ..policy
    };
    let backoffs: Vec<Duration> = [1, 2, 3, 4, 39].map(|a| capped.backoff(a)).to_vec();
    assert_eq!(backoffs, [5, 10, 12, 12, 12].map(Duration::from_secs));
}

#[test]
fn retry_after_is_honoured_within_the_cap() {
    use retry::{Attempt, Step};
    let policy = retry::RetryPolicy::DEFAULT;
    let asked = |seconds: u64| Attempt::Answered {
        status: http::StatusCode::TOO_MANY_REQUESTS,
        retry_after: Some(Duration::from_secs(seconds)),
    };
    let secs = |s| Step::Retry(Duration::from_secs(s));
    // Longer than the back-off: as asked; shorter: the back-off; beyond the cap: the cap.
    assert_eq!(retry::step(&policy, 1, &asked(30)), secs(30));
    assert_eq!(retry::step(&policy, 3, &asked(1)), secs(20));
    assert_eq!(retry::step(&policy, 1, &asked(3600)), secs(120));
    assert!(matches!(
        retry::step(&policy, 6, &asked(1)),
        Step::GiveUp(_)
    ));

    let header = |v: &str| http::HeaderValue::from_str(v).unwrap();
    for (value, expected) in [
        ("7", Some(7)),
        (" 120 ", Some(120)),
        ("0", Some(0)),
        ("-1", None),
        ("1.5", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
    ] {
        assert_eq!(
            retry::retry_after(Some(&header(value))),
            expected.map(Duration::from_secs),
            "{value}"
        );
    }
    assert_eq!(retry::retry_after(None), None);
}

// ---- Queues and filters (no thread started) ----

#[test]
fn a_bounded_queue_drops_its_oldest() {
    let mut queue = webhook::Bounded::new(3);
    for item in 1..=3 {
        assert_eq!(queue.push(item), None);
    }
    assert_eq!(queue.push(4), Some(1));
    assert_eq!(queue.push(5), Some(2));
    assert_eq!(queue.len(), 3);
    assert_eq!(
        std::iter::from_fn(|| queue.pop()).collect::<Vec<_>>(),
        [3, 4, 5]
    );
}

#[test]
fn a_full_queue_drops_the_oldest_and_counts_it_on_metrics() {
    let webhooks = unstarted(&[all_kinds()]);
    let extra = 3;
    for failures in 0..(webhook::QUEUE_CAPACITY + extra) {
        let event = OperatorEvent::RunnersFailingToStart {
            policy: "linux".to_owned(),
            failures: u32::try_from(failures).unwrap(),
        };
        webhooks.enqueue(&event, at());
    }
    let counts = &webhooks.counts()[0];
    assert_eq!(counts.dropped, extra as u64);
    assert_eq!((counts.sent, counts.failed), (0, 0));

    let mut registry = Registry::default();
    registry.register_collector(Box::new(webhooks.metrics()));
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    for line in [
        "rm_notifications_dropped_total{sink=\"notifications.webhook[0]\",host=\"127.0.0.1\"} 3",
        "rm_notifications_sent_total{sink=\"notifications.webhook[0]\",host=\"127.0.0.1\"} 0",
        "rm_notifications_failed_total{sink=\"notifications.webhook[0]\",host=\"127.0.0.1\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }

    let kept = webhooks.take(0);
    assert_eq!(kept.len(), webhook::QUEUE_CAPACITY);
    let failures: Vec<u64> = kept
        .iter()
        .map(|d| {
            serde_json::from_slice::<Value>(&d.body).unwrap()["failures"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(failures[0], extra as u64, "the oldest went first");
    assert_eq!(
        *failures.last().unwrap(),
        (webhook::QUEUE_CAPACITY + extra - 1) as u64,
        "the newest is kept"
    );
}

#[test]
fn each_endpoint_gets_the_kinds_it_wants() {
    let webhooks = unstarted(&[
        all_kinds(),
        vec![EventKind::HostUnfit],
        vec![
            EventKind::RunnersFailingToStart,
            EventKind::CredentialsRejected,
        ],
    ]);
    for event in one_of_each() {
        webhooks.enqueue(&event, at());
    }
    let kinds = |index| -> Vec<EventKind> { webhooks.take(index).iter().map(|d| d.kind).collect() };
    assert_eq!(kinds(0), EventKind::ALL);
    assert_eq!(kinds(1), [EventKind::HostUnfit]);
    assert_eq!(
        kinds(2),
        [
            EventKind::CredentialsRejected,
            EventKind::RunnersFailingToStart
        ]
    );
}

#[test]
fn the_secret_file_is_read_like_every_secret_file() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hook-secret");
    let key = "notifications.webhook[0].secret_file";
    std::fs::write(&path, "  k3y\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let secret = crate::secrets::notification_secret(&path, key).unwrap();
    assert_eq!(secrecy::ExposeSecret::expose_secret(&secret), "k3y");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = crate::secrets::notification_secret(&path, key).unwrap_err();
    let message = format!("{refused:?}");
    assert!(
        message.contains(key) && message.contains("chmod 600"),
        "{message}"
    );
    assert!(!message.contains("k3y"), "{message}");

    std::fs::write(&path, "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let refused = crate::secrets::notification_secret(&path, key).unwrap_err();
    assert!(format!("{refused:?}").contains("is empty"), "{refused:?}");

    let missing = crate::secrets::notification_secret(&dir.path().join("none"), key).unwrap_err();
    assert!(format!("{missing:?}").contains(key), "{missing:?}");
}

// ---- Deliveries to in-process receivers ----

/// Every kind.
fn all_kinds() -> Vec<EventKind> {
    EventKind::ALL.to_vec()
}

/// An endpoint at `url`, as the configuration would give it.
fn endpoint(url: &str, secret: Option<&str>, events: Vec<EventKind>) -> webhook::Endpoint {
    let checked =
        crate::config::notifications::webhook(crate::config::notifications::WebhookSection {
            url: url.to_owned(),
            secret_file: None,
            events: None,
        })
        .unwrap();
    webhook::Endpoint {
        key: "notifications.webhook[0]".to_owned(),
        url: checked.url,
        secret: secret.map(|s| SecretString::from(s.to_owned())),
        events,
    }
}

/// Endpoints wanting these kinds, at a URL nothing is sent to (no thread is started).
fn unstarted(wants: &[Vec<EventKind>]) -> webhook::Webhooks {
    let endpoints = wants
        .iter()
        .map(|events| endpoint("http://127.0.0.1:9/hook", None, events.clone()))
        .collect();
    webhook::Webhooks::new("builder-01".to_owned(), endpoints, webhook::QUEUE_CAPACITY)
}

/// Retries in milliseconds, so a test's three attempts take no time to speak of.
const FAST: retry::RetryPolicy = retry::RetryPolicy {
    timeout: Duration::from_secs(60),
    base: Duration::from_millis(1),
    cap: Duration::from_millis(4),
    max_attempts: 4,
};

/// Started endpoints at these URLs (with these secrets), every kind each.
fn started(endpoints: &[(&str, Option<&str>)], retry: retry::RetryPolicy) -> webhook::Webhooks {
    let endpoints = endpoints
        .iter()
        .enumerate()
        .map(|(index, (url, secret))| webhook::Endpoint {
            key: format!("notifications.webhook[{index}]"),
            ..endpoint(url, *secret, all_kinds())
        })
        .collect();
    webhook::Webhooks::new("builder-01".to_owned(), endpoints, webhook::QUEUE_CAPACITY)
        .start(rm_runner::https::client().unwrap(), retry)
        .unwrap()
}

/// What a test receiver answers to one request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Status(u16),
    /// 429 with `Retry-After: 0`.
    TooManyNow,
    /// Nothing, ever (the connection stays open).
    Hang,
}

/// One request as the receiver got it.
#[derive(Debug)]
struct Seen {
    headers: http::HeaderMap,
    body: Bytes,
}

/// A receiver on 127.0.0.1: answers its requests with `script` in order, then 200; every
/// request is sent on the channel before it is answered. Runs on the test's runtime.
async fn receiver(script: Vec<Answer>) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/hooks/rm?token=t0k3n",
        listener.local_addr().unwrap()
    );
    let script = Arc::new(StdMutex::new(VecDeque::from(script)));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (script, tx) = (script.clone(), tx.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (script, tx) = (script.clone(), tx.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await?.to_bytes();
                        let _ = tx.send(Seen {
                            headers: parts.headers,
                            body,
                        });
                        let answer = script
                            .lock()
                            .unwrap()
                            .pop_front()
                            .unwrap_or(Answer::Status(200));
                        let response = match answer {
                            Answer::Status(code) => http::Response::builder().status(code),
                            Answer::TooManyNow => http::Response::builder()
                                .status(429)
                                .header("retry-after", "0"),
                            Answer::Hang => std::future::pending().await,
                        };
                        Ok::<_, hyper::Error>(response.body(Full::new(Bytes::new())).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, rx)
}

/// A generous bound for what must happen; never a measure of how fast it did.
const PATIENCE: Duration = Duration::from_secs(120);

/// The next request the receiver gets.
async fn next(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(PATIENCE, seen.recv())
        .await
        .expect("a request in time")
        .expect("the receiver runs")
}

/// Waits until `done` holds of the endpoints' counts.
async fn until(what: &str, webhooks: &webhook::Webhooks, done: impl Fn(&[SinkCounts]) -> bool) {
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        let counts = webhooks.counts();
        if done(&counts) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what}: still {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn every_kind_reaches_a_receiver_once_signed() {
    const SECRET: &str = "receiver-shared-key";
    let (url, mut seen) = receiver(Vec::new()).await;
    let notifier = Notifier::with_webhooks(false, started(&[(&url, Some(SECRET))], FAST));
    for event in one_of_each() {
        notifier.notify(event.clone());
        // The rate limit holds for webhooks too: the repeat goes nowhere.
        notifier.notify(event);
    }
    let verifier = rm_receiver::WebhookSecrets::new(vec![SECRET.into()]).unwrap();
    let mut ids = HashSet::new();
    for kind in EventKind::ALL {
        let request = next(&mut seen).await;
        let header = |name: &str| {
            request
                .headers
                .get(name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .to_str()
                .unwrap()
                .to_owned()
        };
        let signature = header("x-rm-signature-256");
        assert!(
            verifier.verify(signature.as_bytes(), &request.body),
            "{kind}: the signature does not verify"
        );
        assert_eq!(signature, body::signature(SECRET.as_bytes(), &request.body));
        let parsed: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(parsed["event"], kind.name());
        assert_eq!(parsed["host"], "builder-01");
        assert_eq!(header("x-rm-event"), kind.name());
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(
            header("user-agent"),
            concat!("rm-agent/", env!("CARGO_PKG_VERSION"))
        );
        assert!(ids.insert(header("x-rm-delivery")), "a delivery id repeats");
        assert!(!String::from_utf8_lossy(&request.body).contains(SECRET));
    }
    let webhooks = notifier.webhooks.as_ref().unwrap();
    let kinds = u64::try_from(EventKind::ALL.len()).unwrap();
    until("all sent", webhooks, |c| c[0].sent == kinds).await;
    assert_eq!(
        (webhooks.counts()[0].failed, webhooks.counts()[0].dropped),
        (0, 0)
    );
    assert!(seen.try_recv().is_err(), "one request per event");
}

#[tokio::test]
async fn a_delivery_is_retried_until_a_final_answer_and_no_further() {
    use Answer::{Status, TooManyNow};
    // (what the receiver answers, requests it gets, delivered)
    let cases = [
        (vec![Status(500), Status(500)], 3, true),
        (vec![TooManyNow, Status(408)], 3, true),
        (vec![Status(404)], 1, false),
        (vec![Status(401)], 1, false),
        (vec![Status(503); 4], 4, false),
    ];
    for (script, requests, delivered) in cases {
        let what = format!("{script:?}");
        let (url, mut seen) = receiver(script).await;
        let webhooks = started(&[(&url, None)], FAST);
        webhooks.enqueue(&OperatorEvent::CredentialsRejected, at());
        until(&what, &webhooks, |c| c[0].sent + c[0].failed == 1).await;
        let counts = &webhooks.counts()[0];
        assert_eq!(counts.sent == 1, delivered, "{what}: {counts:?}");
        let mut got = Vec::new();
        while let Ok(request) = seen.try_recv() {
            got.push(request);
        }
        assert_eq!(got.len(), requests, "{what}");
        // Every attempt is the same delivery, byte for byte.
        for request in &got {
            assert_eq!(request.body, got[0].body, "{what}");
            assert_eq!(
                request.headers["x-rm-delivery"], got[0].headers["x-rm-delivery"],
                "{what}"
            );
            assert!(
                !request.headers.contains_key("x-rm-signature-256"),
                "unsigned"
            );
        }
    }
}

#[tokio::test]
async fn a_receiver_that_is_down_is_given_up_counted_and_delays_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    drop(listener);
    let notifier = Arc::new(Notifier::with_webhooks(
        false,
        started(&[(&url, None)], FAST),
    ));
    notify_returns(&notifier, OperatorEvent::WebhooksStopped).await;
    let webhooks = notifier.webhooks.as_ref().unwrap();
    until("given up", webhooks, |c| c[0].failed == 1).await;
    assert_eq!(webhooks.counts()[0].sent, 0);
}

/// Calls `notify` on a thread of its own and waits, generously, for it to return: a `notify`
/// that waited for a delivery fails the test rather than hanging it.
async fn notify_returns(notifier: &Arc<Notifier>, event: OperatorEvent) {
    let (returned, on_return) = oneshot::channel();
    let notifier = Arc::clone(notifier);
    std::thread::spawn(move || {
        notifier.notify(event);
        let _ = returned.send(());
    });
    tokio::time::timeout(PATIENCE, on_return)
        .await
        .expect("notify returned")
        .expect("the notifying thread ran");
}

#[tokio::test]
async fn a_hanging_receiver_holds_up_neither_the_caller_nor_another_endpoint() {
    let (hanging_url, mut hanging) = receiver(vec![Answer::Hang]).await;
    let (url, mut working) = receiver(Vec::new()).await;
    let patient = retry::RetryPolicy {
        timeout: Duration::from_secs(3600),
        ..FAST
    };
    let notifier = Arc::new(Notifier::with_webhooks(
        false,
        started(&[(&hanging_url, None), (&url, None)], patient),
    ));
    notify_returns(&notifier, OperatorEvent::WebhooksStopped).await;
    let held = next(&mut hanging).await;
    assert_eq!(held.headers["x-rm-event"], "webhooks_stopped");
    assert_eq!(
        next(&mut working).await.headers["x-rm-event"],
        "webhooks_stopped"
    );
    // The first endpoint holds its request and will never answer: the caller still returns at
    // once, and the other endpoint gets the next event.
    notify_returns(&notifier, OperatorEvent::CredentialsRejected).await;
    assert_eq!(
        next(&mut working).await.headers["x-rm-event"],
        "credentials_rejected"
    );
    let webhooks = notifier.webhooks.as_ref().unwrap();
    until("the working endpoint sent both", webhooks, |c| {
        c[1].sent == 2
    })
    .await;
    let hung = &webhooks.counts()[0];
    assert_eq!(
        (hung.sent, hung.failed, hung.dropped),
        (0, 0, 0),
        "{hung:?}"
    );
    assert!(
        hanging.try_recv().is_err(),
        "the second waits behind the first"
    );
}

#[tokio::test]
async fn the_configuration_builds_the_notifier_that_posts_signed_bodies() {
    use std::os::unix::fs::PermissionsExt as _;
    let (url, mut seen) = receiver(Vec::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("notify-secret");
    std::fs::write(&secret, "from-the-file\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = crate::config::from_text(&format!(
        "[host]\nname = \"ci-07\"\n[[notifications.webhook]]\nurl = \"{url}\"\nsecret_file = \"{}\"\nevents = [\"host_unfit\"]\n",
        secret.display()
    ))
    .unwrap();
    let notifier = from_config(&config).unwrap();
    notifier.notify(OperatorEvent::WebhooksStopped);
    notifier.notify(OperatorEvent::HostUnfit {
        problems: vec!["no git".to_owned()],
    });
    let request = next(&mut seen).await;
    let parsed: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(
        parsed["event"], "host_unfit",
        "the filter let only its kind through"
    );
    assert_eq!(parsed["host"], "ci-07");
    assert_eq!(parsed["problems"], json!(["no git"]));
    let verifier = rm_receiver::WebhookSecrets::new(vec!["from-the-file".into()]).unwrap();
    assert!(verifier.verify(
        request.headers["x-rm-signature-256"].as_bytes(),
        &request.body
    ));
    let counts = notifier.webhook_counts();
    assert_eq!(counts[0].key, "notifications.webhook[0]");
    assert_eq!(counts[0].host, "127.0.0.1");

    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o604)).unwrap();
    let refused = from_config(&config).unwrap_err();
    assert_eq!(refused.code, crate::exit::USAGE, "{refused:?}");
}
