//! What unauthenticated ingest may cost the relay (docs/relay.md, "Limits"): a channel flooded
//! past its storage quota or its ingest rate is refused with `Retry-After` and counted, only
//! acknowledged deliveries are dropped to make room; `/healthz` writes nothing; a second
//! `serve` on the same data directory exits 3.

use std::time::Duration;

use http_body_util::BodyExt;

use crate::support::*;

/// Ingests a delivery; its status, `Retry-After` and body.
async fn ingest_raw(url: &str, guid: &str, body: &[u8]) -> (u16, Option<String>, String) {
    let res = client()
        .request(delivery(url, "workflow_job", guid, body))
        .await
        .unwrap();
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

/// The value of one sample line of `/metrics` (0 when absent).
async fn metric(relay: &Relay, sample: &str) -> u64 {
    let (_, body) = send(get(&relay.url("/metrics"), None, None)).await;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

fn serve_args<'a>(data: &'a std::path::Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir_arg(data),
    ];
    args.extend(extra);
    args
}

#[tokio::test(flavor = "multi_thread")]
async fn a_channel_flooded_past_its_quota_drops_only_acknowledged_deliveries_and_refuses_the_rest()
{
    let (_tmp, data) = data_dir();
    let relay = Relay::start_with(&serve_args(&data, &["--channel-quota", "26MiB"]));
    let ch = add_channel(&data, "ci");
    let token = issue_token(&data, "ci", "h1");
    let body = vec![b'5'; 5 * 1024 * 1024];
    // Five fit in 26 MiB; the sixth does not, and nothing is acknowledged yet.
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (code, id) = ingest(&ch.ingest_url, "workflow_job", &guid(), &body).await;
        assert_eq!(code, 202);
        ids.push(id);
    }
    let sixth = guid();
    let (code, retry, text) = ingest_raw(&ch.ingest_url, &sixth, &body).await;
    assert_eq!((code, retry.as_deref()), (503, Some("60")), "{text}");
    assert!(text.contains("quota"), "{text}");
    assert_eq!(
        metric(&relay, "rm_relay_ingest_limited_total{reason=\"quota\"}").await,
        1
    );
    assert_eq!(
        metric(&relay, "rm_relay_ingest_refused_total{status=\"503\"}").await,
        1
    );
    // Nothing unacknowledged was dropped: the host reads all five.
    let mut stream = Sse::open(get(&ch.subscribe_url, Some(&token), None)).await;
    for id in &ids {
        let (got, _, got_body) = stream.event().await.delivery();
        assert_eq!((got, got_body.len()), (*id, body.len()));
    }
    stream.assert_quiet(Duration::from_millis(200)).await;
    // Once the host acknowledges, GitHub's redelivery (the same GUID) is stored and streamed,
    // and only the oldest acknowledged delivery made room for it.
    assert_eq!(
        ack(
            &ch.subscribe_url,
            &token,
            &format!(r#"{{"id": {}}}"#, ids[1])
        )
        .await,
        204
    );
    let (code, new_id) = ingest(&ch.ingest_url, "workflow_job", &sixth, &body).await;
    assert_eq!(code, 202);
    assert_eq!(stream.event().await.delivery().0, new_id);
    assert_eq!(metric(&relay, "rm_relay_deliveries_dropped_total").await, 1);
    drop(stream);
    let mut replay = Sse::open(get(&ch.subscribe_url, Some(&token), Some(0))).await;
    for id in ids[1..].iter().chain([&new_id]) {
        assert_eq!(replay.event().await.delivery().0, *id);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_channel_over_its_ingest_rate_gets_429_with_retry_after_and_comes_back() {
    let (_tmp, data) = data_dir();
    let relay = Relay::start_with(&serve_args(&data, &["--ingest-rate", "1"]));
    let ch = add_channel(&data, "ci");
    let other = add_channel(&data, "other");
    // A rate of 1/s allows a burst of 10.
    for _ in 0..10 {
        assert_eq!(ingest_raw(&ch.ingest_url, &guid(), b"{}").await.0, 202);
    }
    let (code, retry, text) = ingest_raw(&ch.ingest_url, &guid(), b"{}").await;
    assert_eq!((code, retry.as_deref()), (429, Some("1")), "{text}");
    assert_eq!(
        metric(&relay, "rm_relay_ingest_limited_total{reason=\"rate\"}").await,
        1
    );
    // Another channel has its own rate.
    assert_eq!(ingest_raw(&other.ingest_url, &guid(), b"{}").await.0, 202);
    // After Retry-After, the channel is taken again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (code, ..) = ingest_raw(&ch.ingest_url, &guid(), b"{}").await;
        if code == 202 {
            break;
        }
        assert_eq!(code, 429);
        assert!(std::time::Instant::now() < deadline, "still refused");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_writes_nothing_and_answers_while_another_process_holds_the_write_lock() {
    let s = setup();
    ingest(&s.ch.ingest_url, "ping", &guid(), b"{}").await;
    let files = ["relay.db", "relay.db-wal"].map(|f| s.data.join(f));
    let stamp = || {
        files
            .iter()
            .map(|f| {
                let meta = std::fs::metadata(f).unwrap();
                (meta.len(), meta.modified().unwrap())
            })
            .collect::<Vec<_>>()
    };
    let before = stamp();
    for _ in 0..20 {
        let (code, body) = send(get(&s.relay.url("/healthz"), None, None)).await;
        assert_eq!((code, &body[..]), (200, &b"ok\n"[..]));
    }
    assert_eq!(stamp(), before, "/healthz wrote to the database");
    // A `channel` command (or anything else) holding SQLite's write lock does not make the
    // relay look dead: the check needs no write.
    let conn = rusqlite::Connection::open(&files[0]).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The outcome says it, not a stopwatch: a check that queued behind the lock would run
    // into the relay's own HEALTH_CHECK_TIMEOUT and answer 503.
    let (code, body) = send(get(&s.relay.url("/healthz"), None, None)).await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    conn.execute_batch("ROLLBACK").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_serve_on_the_same_data_directory_exits_3_naming_it() {
    let s = setup();
    let mut second = std::process::Command::new(BIN)
        .args(serve_args(&s.data, &[]))
        .env_remove("RM_RELAY_DATA_DIR")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second rm-relay serve on the same data directory kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.starts_with("rm-relay: ") && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert!(stderr.contains(dir_arg(&s.data)), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", s.relay.child.id())),
        "{stderr}"
    );
    // The first one is unaffected; once it is gone, the directory is free again.
    assert_eq!(status_of(&s.relay.url("/healthz")).await, 200);
    let data = s.data.clone();
    drop(s.relay);
    let again = Relay::start(&data);
    assert_eq!(status_of(&again.url("/healthz")).await, 200);
}

async fn status_of(url: &str) -> u16 {
    status(get(url, None, None)).await
}

/// The relay's resident memory (`/proc/PID/statm`), in bytes.
fn rss_bytes(pid: u32) -> usize {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// One upload held open on the ingest URL: GitHub's headers, a Content-Length of 25 MiB,
/// `burst` bytes at once and then a byte every 100 ms, until the relay answers (its status is
/// returned) or closes, or `stop` fires.
async fn held_upload(
    relay: std::net::SocketAddr,
    path: String,
    n: usize,
    burst: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(relay).await.ok()?;
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-github-event: workflow_job\r\nx-github-delivery: held-{n}\r\n\
         x-hub-signature-256: sha256={}\r\ncontent-length: {}\r\n\r\n",
        "0".repeat(64),
        rm_relay::MAX_BODY_BYTES
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
            tokio::time::sleep(Duration::from_millis(100)).await;
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

/// 100 uploads held open on a channel's ingest URL (each declaring 25 MiB, 2 MiB sent at once,
/// then trickled) do not make the relay hold their bytes: ingest bodies are under the receiver's
/// budget (an allowance per request, one shared pool, here 16 MiB), and the uploads that find the
/// pool spent are answered 503 with `Retry-After` and closed. Deliveries of GitHub's usual size
/// keep being stored all the while (each fits its allowance). Without the budget the relay held
/// every byte it had read (200 MiB here), and its resident memory showed it.
#[tokio::test(flavor = "multi_thread")]
async fn uploads_held_open_stay_within_the_body_budget_while_deliveries_are_stored() {
    use rm_http_serve::budget::BODY_ALLOWANCE_BYTES;
    const UPLOADS: usize = 100;
    const BURST: usize = 2 << 20;
    const POOL: usize = 16 << 20;
    // Bodies' share: every held upload's allowance plus the pool (and the valid deliveries'
    // allowances, a few at a time).
    let bound = (UPLOADS + 8) * BODY_ALLOWANCE_BYTES + POOL;
    let (_tmp, data) = data_dir();
    let relay = Relay::start_with(&serve_args(
        &data,
        &["--body-pool", "16MiB", "--ingest-rate", "0"],
    ));
    let ch = add_channel(&data, "ci");
    let path = ch.ingest_url[ch.ingest_url.find("/hooks/").unwrap()..].to_owned();
    let body = std::fs::read(format!("{FIXTURES}/workflow_job.queued.5.json")).unwrap();
    // Warm the path (store, writer) before the baseline.
    assert_eq!(
        ingest(&ch.ingest_url, "workflow_job", &guid(), &body)
            .await
            .0,
        202
    );
    let pid = relay.child.id();
    let baseline = rss_bytes(pid);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut uploads = tokio::task::JoinSet::new();
    for n in 0..UPLOADS {
        uploads.spawn(held_upload(
            relay.addr,
            path.clone(),
            n,
            BURST,
            stop_rx.clone(),
        ));
    }
    let mut peak = baseline;
    for _ in 0..30 {
        let stored = tokio::time::timeout(
            Duration::from_secs(10),
            ingest(&ch.ingest_url, "workflow_job", &guid(), &body),
        )
        .await;
        assert_eq!(stored.expect("a delivery waited 10 s").0, 202);
        peak = peak.max(rss_bytes(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let high_water = metric(&relay, "rm_relay_ingest_body_bytes_high_water").await;
    let refused_for_memory =
        metric(&relay, "rm_relay_ingest_limited_total{reason=\"memory\"}").await;
    stop_tx.send_replace(true);
    let mut busy = 0;
    while let Some(status) = uploads.join_next().await {
        let status = status.unwrap();
        assert_ne!(status, Some(202), "a held upload was stored");
        busy += usize::from(status == Some(503));
    }

    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "held uploads: resident memory grew {} KiB, {busy} refused busy, bodies held at most {high_water} bytes",
        grown >> 10
    );
    assert!(
        grown < 96 << 20,
        "resident memory grew by {} MiB under {UPLOADS} held uploads of {} MiB each",
        grown >> 20,
        BURST >> 20
    );
    assert!(busy > 0, "no held upload was refused for want of memory");
    assert!(refused_for_memory > 0, "no refusal counted as `memory`");
    assert!(
        high_water > 0,
        "rm_relay_ingest_body_bytes_high_water missing"
    );
    assert!(
        high_water <= bound as u64,
        "bodies held {high_water} bytes at once, over {bound}"
    );
}
