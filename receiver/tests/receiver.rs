//! The receiver over real HTTP on loopback, with a real journal file: every status code of
//! CONTRACT §4, duplicates, rotation, the body cap while streaming, health and metrics.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a failed step should fail the test loudly"
)]

#[path = "../../tests/support/log_capture.rs"]
mod log_capture;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rm_journal::{JOURNAL_FILE, Journal, Outcome, Reader, Retention};
use rm_receiver::{
    BODY_ALLOWANCE_BYTES, BodyLimits, INLINE_JUDGE_BYTES, MAX_BODY_BYTES, Receiver, ReceiverConfig,
    WebhookSecrets, sign,
};
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "It's a Secret to Everybody";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");

struct TestReceiver {
    addr: SocketAddr,
    journal_path: PathBuf,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
    client: Client<HttpConnector, Full<Bytes>>,
}

async fn start(secrets: &[&str]) -> TestReceiver {
    start_with(secrets, None).await
}

async fn start_with(secrets: &[&str], body_limits: Option<BodyLimits>) -> TestReceiver {
    let dir = tempfile::tempdir().unwrap();
    let journal_path = dir.path().join(JOURNAL_FILE);
    let journal = Journal::open(&journal_path, Retention::default()).unwrap();
    let secrets =
        WebhookSecrets::new(secrets.iter().map(|s| SecretString::from(*s)).collect()).unwrap();
    let config = ReceiverConfig {
        path: "/webhook".to_owned(),
        secrets,
        max_body_bytes: MAX_BODY_BYTES,
    };
    let receiver = match body_limits {
        Some(limits) => Receiver::with_body_limits(config, journal, limits),
        None => Receiver::new(config, journal),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(receiver.serve(listener, async move {
        let _ = stopped.await;
    }));
    TestReceiver {
        addr,
        journal_path,
        _dir: dir,
        _stop: stop,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

fn fixture(name: &str) -> Vec<u8> {
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/{name}.json")).unwrap())
            .unwrap();
    value["installation"] = serde_json::json!({"id": 99});
    // Dated now, as GitHub would send it today: a body older than a day is journalled as stale.
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    if let Some(job) = value["workflow_job"].as_object_mut() {
        for key in ["created_at", "started_at", "completed_at"] {
            if job.get(key).is_some_and(serde_json::Value::is_string) {
                job.insert(key.to_owned(), serde_json::json!(now));
            }
        }
    }
    serde_json::to_vec(&value).unwrap()
}

struct Delivery {
    event: Option<&'static str>,
    guid: Option<String>,
    signature: Option<String>,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Delivery {
    fn signed(event: &'static str, body: Vec<u8>) -> Self {
        Delivery {
            event: Some(event),
            guid: Some(uuid::Uuid::new_v4().to_string()),
            signature: Some(sign(SECRET.as_bytes(), &body)),
            content_type: "application/json",
            body,
        }
    }
}

impl TestReceiver {
    async fn send(&self, d: &Delivery) -> (u16, String) {
        let mut req = http::Request::post(format!("http://{}/webhook", self.addr))
            .header("content-type", d.content_type)
            .header("user-agent", "GitHub-Hookshot/test");
        if let Some(event) = d.event {
            req = req.header("x-github-event", event);
        }
        if let Some(guid) = &d.guid {
            req = req.header("x-github-delivery", guid);
        }
        if let Some(sig) = &d.signature {
            req = req.header("x-hub-signature-256", sig);
        }
        self.request(req.body(Full::new(Bytes::from(d.body.clone()))).unwrap())
            .await
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let req = http::Request::get(format!("http://{}{path}", self.addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.request(req).await
    }

    async fn request(&self, req: http::Request<Full<Bytes>>) -> (u16, String) {
        let res = self.client.request(req).await.unwrap();
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn delivery_count(&self) -> i64 {
        Reader::open(&self.journal_path)
            .unwrap()
            .delivery_count()
            .unwrap()
    }
}

#[tokio::test]
async fn a_signed_delivery_is_committed_before_202_and_its_guid_answered_200_after() {
    let rx = start(&[SECRET]).await;
    let delivery = Delivery::signed("workflow_job", fixture("workflow_job.queued.5"));
    let (status, _) = rx.send(&delivery).await;
    assert_eq!(status, 202);
    // Committed before the answer: a fresh reader sees it now.
    let reader = Reader::open(&rx.journal_path).unwrap();
    let stored = reader
        .delivery(delivery.guid.as_deref().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(stored.row.outcome, Outcome::Applied);
    assert_eq!(stored.body.as_deref(), Some(delivery.body.as_slice()));
    assert!(
        stored
            .headers
            .iter()
            .any(|(k, v)| k == "x-hub-signature-256" && v.starts_with("sha256="))
    );
    assert_eq!(
        reader
            .job(rm_vocab::JobId::new(289_782_451))
            .unwrap()
            .unwrap()
            .state,
        rm_vocab::JobState::Queued
    );

    let (status, _) = rx.send(&delivery).await;
    assert_eq!(status, 200, "GitHub's redelivery reuses the GUID");
    assert_eq!(rx.delivery_count(), 1);
}

#[tokio::test]
async fn refusals_journal_nothing() {
    let rx = start(&[SECRET]).await;
    let body = fixture("workflow_job.queued.5");
    let cases: Vec<(Delivery, u16)> = vec![
        (
            Delivery {
                signature: None,
                ..Delivery::signed("workflow_job", body.clone())
            },
            401,
        ),
        (
            Delivery {
                signature: Some(sign(b"wrong secret", &body)),
                ..Delivery::signed("workflow_job", body.clone())
            },
            401,
        ),
        (
            Delivery {
                signature: Some("sha256=zz".to_owned()),
                ..Delivery::signed("workflow_job", body.clone())
            },
            401,
        ),
        (
            Delivery {
                event: None,
                ..Delivery::signed("workflow_job", body.clone())
            },
            400,
        ),
        (
            Delivery {
                guid: None,
                ..Delivery::signed("workflow_job", body.clone())
            },
            400,
        ),
        (
            Delivery {
                event: Some("bad event"),
                ..Delivery::signed("workflow_job", body.clone())
            },
            400,
        ),
        (
            Delivery::signed("workflow_job", b"payload=%7B%7D".to_vec()),
            400,
        ),
        (
            Delivery {
                content_type: "application/x-www-form-urlencoded",
                ..Delivery::signed("workflow_job", body.clone())
            },
            415,
        ),
    ];
    for (delivery, expected) in &cases {
        let (status, text) = rx.send(delivery).await;
        assert_eq!(status, *expected, "{text}");
    }
    assert_eq!(rx.delivery_count(), 0);
}

/// Every log line about a delivery carries its GUID and event from one span, the refusal's
/// reason included (it named neither before the span).
#[tokio::test]
async fn every_log_line_about_a_delivery_carries_its_guid_from_the_span() {
    // A current-thread runtime: the server's tasks run on this thread, under this subscriber.
    let capture = log_capture::LogCapture::start(tracing::Level::DEBUG);
    let rx = start(&[SECRET]).await;
    let body = fixture("workflow_job.queued.5");
    let refused = Delivery {
        signature: Some(sign(b"wrong secret", &body)),
        ..Delivery::signed("workflow_job", body.clone())
    };
    assert_eq!(rx.send(&refused).await.0, 401);
    let accepted = Delivery::signed("workflow_job", body);
    assert_eq!(rx.send(&accepted).await.0, 202);

    let log = capture.text();
    let context = |d: &Delivery| {
        format!(
            "delivery{{guid={} event=workflow_job}}",
            d.guid.as_deref().unwrap()
        )
    };
    let lines_of =
        |d: &Delivery| -> Vec<&str> { log.lines().filter(|l| l.contains(&context(d))).collect() };
    let refused_lines = lines_of(&refused);
    assert!(
        refused_lines
            .iter()
            .any(|l| l.contains("refused a delivery whose signature")),
        "{log}"
    );
    assert!(
        refused_lines
            .iter()
            .any(|l| l.contains("request refused") && l.contains("401")),
        "{log}"
    );
    assert!(
        lines_of(&accepted)
            .iter()
            .any(|l| l.contains("delivery journalled")),
        "{log}"
    );
}

/// A body above [`INLINE_JUDGE_BYTES`] is judged on a thread other than the async worker that
/// received it (the blocking pool), and journalled as any other; a small body, the control, on
/// the worker itself. The thread is measured by the receiver, not taken from its rule: on this
/// current-thread runtime, "off the worker" is only true of a judgement that ran elsewhere.
#[tokio::test]
async fn a_large_body_is_judged_off_the_async_worker_and_a_small_one_on_it() {
    let capture = log_capture::LogCapture::start(tracing::Level::DEBUG);
    let rx = start(&[SECRET]).await;
    let small = Delivery::signed("workflow_job", fixture("workflow_job.queued.5"));
    let mut padded: serde_json::Value =
        serde_json::from_slice(&fixture("workflow_job.queued.5")).unwrap();
    padded["workflow_job"]["id"] = serde_json::json!(77_000_001);
    // A field no handler reads, taking the body past the allowance.
    padded["padding"] = serde_json::json!("x".repeat(INLINE_JUDGE_BYTES));
    let large = Delivery::signed("workflow_job", serde_json::to_vec(&padded).unwrap());
    assert!(large.body.len() > INLINE_JUDGE_BYTES);

    assert_eq!(rx.send(&small).await.0, 202);
    assert_eq!(rx.send(&large).await.0, 202);

    let log = capture.text();
    let journalled = |d: &Delivery| -> String {
        let guid = d.guid.as_deref().unwrap();
        log.lines()
            .find(|l| l.contains(guid) && l.contains("delivery journalled"))
            .unwrap_or_else(|| panic!("no journalled line for {guid}:\n{log}"))
            .to_owned()
    };
    assert!(
        journalled(&small).contains("judged_off_worker=false"),
        "{log}"
    );
    assert!(
        journalled(&large).contains("judged_off_worker=true"),
        "{log}"
    );
    let job = Reader::open(&rx.journal_path)
        .unwrap()
        .job(rm_vocab::JobId::new(77_000_001))
        .unwrap()
        .expect("the large delivery's job");
    assert_eq!(job.state.as_str(), "queued");
}

#[tokio::test]
async fn every_configured_secret_is_accepted() {
    let rx = start(&["old-secret", SECRET]).await;
    let body = fixture("ping.none.0");
    let old = Delivery {
        signature: Some(sign(b"old-secret", &body)),
        ..Delivery::signed("ping", body.clone())
    };
    assert_eq!(rx.send(&old).await.0, 202);
    assert_eq!(rx.send(&Delivery::signed("ping", body)).await.0, 202);
    assert_eq!(rx.delivery_count(), 2);
}

#[tokio::test]
async fn unused_events_are_ignored_and_unreadable_ones_rejected_but_both_kept() {
    let rx = start(&[SECRET]).await;
    let ignored = Delivery::signed("workflow_run", fixture("workflow_run.completed.0"));
    let rejected = Delivery::signed("workflow_job", br#"{"action":"queued"}"#.to_vec());
    assert_eq!(rx.send(&ignored).await.0, 202);
    assert_eq!(
        rx.send(&rejected).await.0,
        202,
        "GitHub cannot fix it by retrying"
    );
    let reader = Reader::open(&rx.journal_path).unwrap();
    let row = |d: &Delivery| {
        reader
            .delivery(d.guid.as_deref().unwrap())
            .unwrap()
            .unwrap()
    };
    assert_eq!(row(&ignored).row.outcome, Outcome::Ignored);
    let stored = row(&rejected);
    assert_eq!(stored.row.outcome, Outcome::Rejected);
    assert!(stored.row.reason.unwrap().contains("workflow_job"));
    assert_eq!(stored.body.as_deref(), Some(rejected.body.as_slice()));
}

#[tokio::test]
async fn a_declared_oversize_body_is_refused_before_it_is_read() {
    let rx = start(&[SECRET]).await;
    let mut stream = TcpStream::connect(rx.addr).await.unwrap();
    let head = format!(
        "POST /webhook HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-github-event: workflow_job\r\nx-github-delivery: big-1\r\n\
         x-hub-signature-256: sha256={}\r\ncontent-length: {}\r\n\r\n",
        "0".repeat(64),
        2u64 << 30
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 1024];
    let n = stream.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 413"));
    assert_eq!(rx.delivery_count(), 0);
}

/// A 2 GiB chunked upload (no Content-Length) is cut off once it passes the cap: the receiver
/// answers 413 and closes, long before the client could send it all.
#[tokio::test]
async fn a_streamed_oversize_body_is_cut_off_at_the_cap() {
    let rx = start(&[SECRET]).await;
    let stream = TcpStream::connect(rx.addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let sender = tokio::spawn(async move {
        let head = format!(
            "POST /webhook HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             x-github-event: workflow_job\r\nx-github-delivery: big-2\r\n\
             x-hub-signature-256: sha256={}\r\ntransfer-encoding: chunked\r\n\r\n",
            "0".repeat(64)
        );
        write.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 1 << 20];
        let framed = [
            format!("{:x}\r\n", chunk.len()).into_bytes(),
            chunk,
            b"\r\n".to_vec(),
        ]
        .concat();
        let mut sent: u64 = 0;
        while sent < (2u64 << 30) {
            write.write_all(&framed).await?;
            sent += 1 << 20;
        }
        Ok::<u64, std::io::Error>(sent)
    });
    let mut answer = Vec::new();
    let _ = read.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let sent = sender.await.unwrap();
    assert!(sent.is_err(), "the receiver read the whole 2 GiB: {sent:?}");
    assert_eq!(rx.delivery_count(), 0);
}

#[tokio::test]
async fn health_metrics_and_unknown_routes() {
    let rx = start(&[SECRET]).await;
    assert_eq!(rx.get("/healthz").await, (200, "ok\n".to_owned()));
    rx.send(&Delivery::signed(
        "workflow_job",
        fixture("workflow_job.queued.5"),
    ))
    .await;
    rx.send(&Delivery {
        signature: None,
        ..Delivery::signed("ping", b"{}".to_vec())
    })
    .await;
    let (status, metrics) = rx.get("/metrics").await;
    assert_eq!(status, 200);
    for expected in [
        r#"rm_deliveries_total{event="workflow_job",outcome="applied"} 1"#,
        r#"rm_receiver_refused_total{status="401",reason="signature_missing"} 1"#,
        r#"rm_jobs{state="queued"} 1"#,
        "rm_journal_commit_seconds_count",
        "# TYPE rm_runners gauge",
    ] {
        assert!(metrics.contains(expected), "{expected} not in\n{metrics}");
    }
    assert_eq!(rx.get("/nothing").await.0, 404);
    assert_eq!(rx.get("/webhook").await.0, 405);
}

#[tokio::test]
async fn concurrent_deliveries_are_all_committed() {
    let rx = Arc::new(start(&[SECRET]).await);
    let body = fixture("workflow_job.queued.5");
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let rx = rx.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            rx.send(&Delivery::signed("workflow_job", body)).await.0
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 202);
    }
    assert_eq!(rx.delivery_count(), 64);
}

/// With the journal's write lock held elsewhere (a slow disk), no answer leaves before the
/// commit: the request waits, then gets its 202 once the delivery is on disk.
#[tokio::test]
async fn no_answer_before_the_commit() {
    let rx = Arc::new(start(&[SECRET]).await);
    let blocker = rusqlite::Connection::open(&rx.journal_path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let delivery = Delivery::signed("workflow_job", fixture("workflow_job.queued.5"));
    let guid = delivery.guid.clone().unwrap();
    let pending = tokio::spawn({
        let rx = rx.clone();
        async move { rx.send(&delivery).await.0 }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !pending.is_finished(),
        "answered before the delivery could be committed"
    );
    blocker.execute_batch("COMMIT").unwrap();
    assert_eq!(pending.await.unwrap(), 202);
    let reader = Reader::open(&rx.journal_path).unwrap();
    assert!(reader.delivery(&guid).unwrap().is_some());
}

/// This process's resident memory, in bytes (Linux).
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// One junk upload: GitHub's headers with a signature that matches nothing, a Content-Length of
/// 25 MiB, `burst` bytes at once and then a byte every 100 ms, until the receiver answers (its
/// status is returned) or closes, or `stop` fires.
async fn junk(
    addr: SocketAddr,
    n: usize,
    burst: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Option<u16> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST /webhook HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-github-event: workflow_job\r\nx-github-delivery: junk-{n}\r\n\
         x-hub-signature-256: sha256={}\r\ncontent-length: {}\r\n\r\n",
        "0".repeat(64),
        MAX_BODY_BYTES
    );
    let send = async move {
        write.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 64 * 1024];
        let mut sent = 0;
        while sent < burst {
            write.write_all(&chunk).await?;
            sent += chunk.len();
        }
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            write.write_all(b" ").await?;
        }
        #[allow(unreachable_code, reason = "the loop ends only on an error")]
        Ok::<(), std::io::Error>(())
    };
    let answer = async move {
        let mut buf = vec![0; 256];
        let n = read.read(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        text.strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
    };
    tokio::select! {
        status = answer => status,
        _ = send => None,
        _ = stop.wait_for(|stop| *stop) => None,
    }
}

/// 200 uploads of junk (unsigned, declaring 25 MiB, 1 MiB sent at once and then trickled) do not
/// make the receiver hold their bytes: past the per-body allowances, one shared pool bounds what
/// bodies hold, and the uploads that find it full are answered 503 and closed. Valid deliveries
/// keep being answered 202 all the while, since a body of GitHub's usual size fits its allowance.
/// Without the budget, the receiver holds every junk byte it has read (200 MiB here) and the
/// process's resident memory shows it.
#[tokio::test]
async fn junk_bodies_in_flight_are_bounded_while_valid_deliveries_are_answered() {
    const JUNK: usize = 200;
    const BURST: usize = 1 << 20;
    const POOL: usize = 16 << 20;
    // Bodies' share: every junk upload's allowance plus the pool (and the valid deliveries'
    // allowances, a few at a time).
    let bound = (JUNK + 8) * BODY_ALLOWANCE_BYTES + POOL;
    let rx = Arc::new(
        start_with(
            &[SECRET],
            Some(BodyLimits {
                allowance: BODY_ALLOWANCE_BYTES,
                pool: POOL,
            }),
        )
        .await,
    );
    let valid = fixture("workflow_job.queued.5");
    // Warm the path (journal, client pool) before the baseline.
    assert_eq!(
        rx.send(&Delivery::signed("workflow_job", valid.clone()))
            .await
            .0,
        202
    );
    let baseline = rss_bytes();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut uploads = tokio::task::JoinSet::new();
    for n in 0..JUNK {
        uploads.spawn(junk(rx.addr, n, BURST, stop_rx.clone()));
    }
    let mut peak = baseline;
    for _ in 0..40 {
        let delivery = Delivery::signed("workflow_job", valid.clone());
        let answered =
            tokio::time::timeout(std::time::Duration::from_secs(10), rx.send(&delivery)).await;
        assert_eq!(answered.expect("a valid delivery waited 10 s").0, 202);
        peak = peak.max(rss_bytes());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, metrics) = rx.get("/metrics").await;
    stop_tx.send_replace(true);
    let mut busy = 0;
    while let Some(status) = uploads.join_next().await {
        let status = status.unwrap();
        assert_ne!(status, Some(202), "junk was accepted");
        busy += usize::from(status == Some(503));
    }

    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "junk: resident memory grew {} KiB, {busy} uploads refused busy",
        grown >> 10
    );
    assert!(
        grown < 128 << 20,
        "resident memory grew by {} MiB under {JUNK} junk uploads of {} MiB each",
        grown >> 20,
        BURST >> 20
    );
    assert!(busy > 0, "no junk upload was refused for want of memory");
    let high_water: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("rm_receiver_body_bytes_high_water "))
        .expect("rm_receiver_body_bytes_high_water in /metrics")
        .parse()
        .unwrap();
    assert!(
        high_water <= bound,
        "bodies held {high_water} bytes at once, over {bound}"
    );
    assert!(
        metrics.contains(r#"rm_receiver_refused_total{status="503",reason="busy"}"#),
        "{metrics}"
    );
    assert_eq!(rx.delivery_count(), 41);
}
