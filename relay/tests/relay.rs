//! rm-relay through its real binary on loopback (CONTRACT §6, docs/relay.md): the channel
//! commands beside a running relay, byte-exact delivery with signatures intact, durability
//! across SIGKILL, ack and replay, authentication and revocation, ingest refusals and
//! duplicates, the unmodified npm smee-client, and the container's CMD with health, metrics and
//! a graceful SIGTERM; the data directory's modes; limits (relay/limits.rs) and a full disk
//! (relay/disk_full.rs).

#![allow(
    clippy::unwrap_used,
    reason = "tests: a failed step should fail the test loudly"
)]

#[path = "relay/container.rs"]
mod container;
#[path = "relay/disk_full.rs"]
mod disk_full;
#[path = "relay/limits.rs"]
mod limits;
#[path = "../../tests/support/npm.rs"]
mod npm;
#[path = "../../tests/support/skip.rs"]
mod skip;
#[path = "relay/smee.rs"]
mod smee;
mod support;

use std::time::Duration;

use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn channel_commands_work_while_the_relay_serves() {
    let (_tmp, data) = data_dir();
    // Before any `serve`, no public URL is known: a usage error naming the remedy.
    let out = cli(&["channel", "add", "ci", "--data-dir", dir_arg(&data)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--public-url"));

    let relay = Relay::start(&data);
    let base = relay.url("");
    let ch = add_channel(&data, "ci");
    let ingest_id = ch
        .ingest_url
        .strip_prefix(&format!("{base}/hooks/"))
        .unwrap();
    let smee_id = ch.smee_url.strip_prefix(&format!("{base}/smee/")).unwrap();
    assert_eq!(ch.subscribe_url, format!("{base}/subscribe/ci"));
    for id in [ingest_id, smee_id] {
        assert_eq!(id.len(), 32);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
    assert_ne!(ingest_id, smee_id, "two independent secrets");

    // Text output, and an explicit public URL.
    let text = cli_ok(&[
        "channel",
        "add",
        "other",
        "--data-dir",
        dir_arg(&data),
        "--public-url",
        "https://relay.example.net/",
    ]);
    assert!(
        text.contains("ingest_url:    https://relay.example.net/hooks/"),
        "{text}"
    );
    assert!(
        text.contains("subscribe_url: https://relay.example.net/subscribe/other"),
        "{text}"
    );
    assert!(
        text.contains("smee_url:      https://relay.example.net/smee/"),
        "{text}"
    );

    // Usage errors: a taken name, a bad name, an unknown channel, nothing to revoke.
    for args in [
        &["channel", "add", "ci"][..],
        &["channel", "add", "no/slash"],
        &["channel", "token", "nope", "h1"],
        &["channel", "token", "ci", "bad host"],
        &["channel", "revoke", "ci", "never-issued"],
    ] {
        let mut args = args.to_vec();
        args.extend(["--data-dir", dir_arg(&data)]);
        let out = cli(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("rm-relay: ") && stderr.lines().count() == 1,
            "{stderr}"
        );
    }
    let (_other_tmp, missing) = data_dir();
    let out = cli(&[
        "channel",
        "token",
        "ci",
        "h1",
        "--data-dir",
        dir_arg(&missing),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!missing.exists(), "token must not create a relay database");

    // A reader that closed the pipe (`rm-relay channel add x | head -0`) ends the output, not
    // the command: no panic, exit 0, and the channel exists.
    for args in [
        &["channel", "add", "piped"][..],
        &["channel", "token", "piped", "h9"],
        &["channel", "token", "piped", "h9", "--json"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(BIN)
            .args(args)
            .args(["--data-dir", dir_arg(&data)])
            .env_remove("RM_RELAY_DATA_DIR")
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }

    // A token works at once on the running relay; issuing again replaces it.
    let first = issue_token(&data, "ci", "h1");
    assert!(first.starts_with("rmr_") && first.len() == 68, "{first}");
    let text_token = cli_ok(&["channel", "token", "ci", "h2", "--data-dir", dir_arg(&data)]);
    assert!(text_token.trim().starts_with("rmr_"));
    assert_eq!(
        status(get(&ch.subscribe_url, Some(&first), None)).await,
        200
    );
    let second = issue_token(&data, "ci", "h1");
    assert_ne!(first, second);
    assert_eq!(ack(&ch.subscribe_url, &first, r#"{"id": 0}"#).await, 401);
    assert_eq!(ack(&ch.subscribe_url, &second, r#"{"id": 0}"#).await, 204);
    assert_eq!(
        ack(&ch.subscribe_url, text_token.trim(), r#"{"id": 0}"#).await,
        204
    );

    cli_ok(&[
        "channel",
        "revoke",
        "ci",
        "h1",
        "--data-dir",
        dir_arg(&data),
    ]);
    assert_eq!(ack(&ch.subscribe_url, &second, r#"{"id": 0}"#).await, 401);
    assert_eq!(
        ack(&ch.subscribe_url, text_token.trim(), r#"{"id": 0}"#).await,
        204
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fixtures_reach_a_subscriber_byte_exact_with_signatures_intact() {
    let s = setup();
    let fixtures = fixtures();
    assert!(fixtures.len() >= 20, "the fixtures are missing");
    // Half before the subscriber connects (catch-up), half after (live).
    let (before, after) = fixtures.split_at(fixtures.len() / 2);
    // The smee form of the same channel, open from the start, shows that live deliveries are
    // pushed on commit by order rather than by speed: its only other wake-up is the keepalive
    // (a `ping` event, KEEPALIVE_INTERVAL after the last thing sent), so a delivery that
    // waited for a timer comes after a ping.
    let mut smee = Sse::open(get(&s.ch.smee_url, None, None)).await;
    let mut smee_next = async || match smee.next(Duration::from_secs(60)).await {
        Next::Event(event) => event,
        Next::End => panic!("the smee stream ended"),
        Next::Timeout => panic!("nothing on the smee stream in 60 s"),
    };
    assert_eq!(smee_next().await.event.as_deref(), Some("ready"));
    let mut sent = Vec::new();
    for (event, body) in before {
        let g = guid();
        let (code, id) = ingest(&s.ch.ingest_url, event, &g, body).await;
        assert_eq!(code, 202);
        sent.push((id, event.clone(), g, body.clone()));
    }
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), None)).await;
    let check = |got: &Event, (id, event, g, body): &(i64, String, String, Vec<u8>)| {
        let (got_id, headers, got_body) = got.delivery();
        assert_eq!(got_id, *id);
        assert_eq!(&got_body, body, "body bytes of {event}");
        let header = |name: &str| headers[name].as_str().unwrap().to_owned();
        assert_eq!(header("x-github-event"), *event);
        assert_eq!(header("x-github-delivery"), *g);
        assert_eq!(header("x-github-hook-id"), "292430182");
        assert_eq!(
            header("x-github-hook-installation-target-type"),
            "integration"
        );
        assert_eq!(header("x-github-hook-installation-target-id"), "79929171");
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(header("user-agent"), "GitHub-Hookshot/044aadd");
        // The subscriber verifies with the secret the relay never had.
        assert_eq!(header("x-hub-signature-256"), sign(&got_body));
        assert!(!headers.contains_key("x-forwarded-for") && !headers.contains_key("host"));
    };
    for expected in &sent {
        check(&stream.event().await, expected);
        let on_smee = smee_next().await;
        assert_eq!(
            on_smee.id,
            Some(expected.0.to_string()),
            "not pushed on commit: {on_smee:?}"
        );
    }
    for (event, body) in after {
        let g = guid();
        let (code, id) = ingest(&s.ch.ingest_url, event, &g, body).await;
        assert_eq!(code, 202);
        let expected = (id, event.clone(), g, body.clone());
        check(&stream.event().await, &expected);
        // Pushed on commit, not on a timer: the next thing on the smee stream is this
        // delivery, not a keepalive ping.
        let on_smee = smee_next().await;
        assert_eq!(
            (on_smee.event.as_deref(), on_smee.id.as_deref()),
            (None, Some(id.to_string().as_str())),
            "not pushed on commit: {on_smee:?}"
        );
        sent.push(expected);
    }
    let ids: Vec<i64> = sent.iter().map(|d| d.0).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    stream.assert_quiet(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_answered_202_survives_sigkill() {
    let mut s = setup();
    let (_, body) = &fixtures()[0];
    let (code, id) = ingest(&s.ch.ingest_url, "workflow_job", &guid(), body).await;
    assert_eq!(code, 202);
    // No grace: the commit happened before the answer, or it did not.
    s.relay.child.kill().unwrap();
    s.relay.child.wait().unwrap();
    let relay = Relay::start(&s.data);
    let url = relay.url("/subscribe/ci");
    let mut stream = Sse::open(get(&url, Some(&s.token), None)).await;
    let (got_id, _, got_body) = stream.event().await.delivery();
    assert_eq!((got_id, &got_body), (id, body));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_resumes_after_its_ack_or_after_its_last_event_id() {
    let s = setup();
    let mut ids = Vec::new();
    for n in 0..5 {
        if n == 3 {
            // Reconnected later: 0..3 first.
            let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), None)).await;
            for id in &ids {
                assert_eq!(stream.event().await.delivery().0, *id);
            }
            assert_eq!(
                ack(
                    &s.ch.subscribe_url,
                    &s.token,
                    &format!(r#"{{"id": {}}}"#, ids[1])
                )
                .await,
                204
            );
            // An older ack never moves the position back.
            assert_eq!(
                ack(
                    &s.ch.subscribe_url,
                    &s.token,
                    &format!(r#"{{"id": {}}}"#, ids[0])
                )
                .await,
                204
            );
        }
        let body = format!(r#"{{"n": {n}}}"#);
        ids.push(
            ingest(&s.ch.ingest_url, "ping", &guid(), body.as_bytes())
                .await
                .1,
        );
    }
    // No Last-Event-ID: everything after the ack, in order, then live.
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), None)).await;
    for id in &ids[2..] {
        assert_eq!(stream.event().await.delivery().0, *id);
    }
    stream.assert_quiet(Duration::from_millis(200)).await;
    let live = ingest(&s.ch.ingest_url, "ping", &guid(), b"{}").await.1;
    assert_eq!(stream.event().await.delivery().0, live);
    drop(stream);

    // Last-Event-ID wins over the ack.
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), Some(ids[3]))).await;
    assert_eq!(stream.event().await.delivery().0, ids[4]);
    assert_eq!(stream.event().await.delivery().0, live);
    stream.assert_quiet(Duration::from_millis(200)).await;
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), Some(0))).await;
    assert_eq!(stream.event().await.delivery().0, ids[0]);

    // Another host on the channel has its own position.
    let other = issue_token(&s.data, "ci", "h2");
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&other), None)).await;
    assert_eq!(stream.event().await.delivery().0, ids[0]);

    // Bad Last-Event-ID and bad ack bodies are 400.
    let bad = http::Request::get(&s.ch.subscribe_url)
        .header("authorization", format!("Bearer {}", s.token))
        .header("last-event-id", "-3")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(status(bad).await, 400);
    for body in ["", "{}", r#"{"id": -1}"#, r#"{"id": "7"}"#, "[1]"] {
        assert_eq!(
            ack(&s.ch.subscribe_url, &s.token, body).await,
            400,
            "{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_hosts_token_reads_the_channel_and_revoke_closes_its_stream() {
    let s = setup();
    ingest(&s.ch.ingest_url, "ping", &guid(), b"{}").await;
    cli_ok(&["channel", "add", "other", "--data-dir", dir_arg(&s.data)]);
    let foreign = issue_token(&s.data, "other", "h1");
    let ingest_id = s.ch.ingest_url.rsplit('/').next().unwrap().to_owned();
    let well_formed_wrong = format!("rmr_{}", "0".repeat(64));
    let unknown_channel = s.relay.url("/subscribe/nope");
    let mut refusals = Vec::new();
    for (url, token) in [
        (&s.ch.subscribe_url, None),
        (&s.ch.subscribe_url, Some(well_formed_wrong.as_str())),
        (&s.ch.subscribe_url, Some("garbage")),
        (&s.ch.subscribe_url, Some(foreign.as_str())),
        (&s.ch.subscribe_url, Some(ingest_id.as_str())),
        (&unknown_channel, Some(s.token.as_str())),
    ] {
        let (code, body) = send(get(url, token, None)).await;
        assert_eq!(code, 401, "{url} {token:?}");
        refusals.push(body);
    }
    assert!(
        refusals.windows(2).all(|w| w[0] == w[1]),
        "every 401 must look the same"
    );
    assert_eq!(
        ack(&s.ch.subscribe_url, &foreign, r#"{"id": 1}"#).await,
        401
    );

    // The ingest URL and id read nothing.
    let (code, body) = send(get(&s.ch.ingest_url, Some(&s.token), None)).await;
    assert_eq!(code, 405, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        status(get(&s.relay.url(&format!("/smee/{ingest_id}")), None, None)).await,
        404
    );

    // Revocation (by another process) closes an open stream.
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), None)).await;
    stream.event().await;
    cli_ok(&[
        "channel",
        "revoke",
        "ci",
        "h1",
        "--data-dir",
        dir_arg(&s.data),
    ]);
    // The stream ends (at its next token recheck, TOKEN_RECHECK_INTERVAL), and nothing comes
    // before the end; the bound is generous, the outcome is what is asserted.
    match stream.next(Duration::from_secs(60)).await {
        Next::End => {}
        Next::Event(event) => panic!("event after revoke: {event:?}"),
        Next::Timeout => panic!("the stream stayed open after revoke"),
    }
    assert_eq!(
        status(get(&s.ch.subscribe_url, Some(&s.token), None)).await,
        401
    );
}

/// Writes a raw HTTP/1.1 request head (and, for `chunks`, a chunked body of that many MiB,
/// ignoring write errors once the relay has answered and closed) and reads the status.
async fn raw_status(addr: std::net::SocketAddr, head: &str, chunks: usize) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 1024 * 1024];
    for _ in 0..chunks {
        let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
        if conn.write_all(&framed).await.is_err() {
            break;
        }
    }
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(PATIENCE, conn.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let line = String::from_utf8_lossy(&answer[..n]).into_owned();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn ingest_refuses_what_is_not_a_delivery_and_stores_a_guid_once() {
    let s = setup();
    let url = &s.ch.ingest_url;
    let strip = |name: &str| {
        let mut req = delivery(url, "ping", &guid(), b"{}");
        req.headers_mut().remove(name);
        req
    };
    assert_eq!(send(strip("x-github-event")).await.0, 400);
    assert_eq!(send(strip("x-github-delivery")).await.0, 400);
    assert_eq!(
        send(delivery(url, "not an event", &guid(), b"{}")).await.0,
        400
    );
    let unknown = s.relay.url(&format!("/hooks/{}", "ab".repeat(16)));
    assert_eq!(
        send(delivery(&unknown, "ping", &guid(), b"{}")).await.0,
        404
    );
    assert_eq!(
        send(delivery(&s.relay.url("/hooks/x"), "ping", &guid(), b"{}"))
            .await
            .0,
        404
    );

    // Over 25 MiB, declared or streamed.
    let path = url.strip_prefix(&s.relay.url("")).unwrap();
    let head = |framing: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-github-event: ping\r\nx-github-delivery: {}\r\n{framing}\r\n\r\n",
            guid()
        )
    };
    let over = 25 * 1024 * 1024 + 1;
    assert_eq!(
        raw_status(s.relay.addr, &head(&format!("content-length: {over}")), 0).await,
        413
    );
    assert_eq!(
        raw_status(s.relay.addr, &head("transfer-encoding: chunked"), 26).await,
        413
    );

    // A redelivery (same GUID) is stored once and answered with the same id.
    let g = guid();
    let (code, id) = ingest(url, "ping", &g, b"{\"a\":1}").await;
    assert_eq!(code, 202);
    assert_eq!(ingest(url, "ping", &g, b"{\"a\":1}").await, (200, id));
    // Exactly 25 MiB is a delivery, and nothing refused above was stored.
    let big = vec![b'7'; 25 * 1024 * 1024];
    let (code, big_id) = ingest(url, "ping", &guid(), &big).await;
    assert_eq!(code, 202);
    let mut stream = Sse::open(get(&s.ch.subscribe_url, Some(&s.token), None)).await;
    assert_eq!(stream.event().await.delivery().0, id);
    let (got, _, body) = stream.event().await.delivery();
    assert_eq!((got, body.len()), (big_id, big.len()));
    stream.assert_quiet(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_directory_others_can_read_is_repaired_at_start_and_said_so() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, data) = data_dir();
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mode = |name: &str| {
        std::fs::metadata(data.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    // Under umask 022, as a package's post-install script or an operator's shell has it.
    let out = std::process::Command::new("sh")
        .args(["-c", "umask 022 && exec \"$0\" \"$@\"", BIN])
        .args(["channel", "add", "ci", "--public-url", "http://127.0.0.1:1"])
        .args(["--data-dir", dir_arg(&data)])
        .env_remove("RM_RELAY_DATA_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("repaired the mode")
            && stderr.contains("was=0755")
            && stderr.contains(dir_arg(&data)),
        "{stderr}"
    );
    assert_eq!((mode(""), mode("relay.db")), (0o700, 0o600));
    // `serve` (under the tests' own umask): SQLite's files and the lock are private too.
    let relay = Relay::start(&data);
    let probe = delivery(&relay.url("/hooks/x"), "ping", &guid(), b"{}");
    assert_eq!(send(probe).await.0, 404);
    for name in ["relay.db", "relay.db-wal", "relay.db-shm", "serve.lock"] {
        assert_eq!(mode(name), 0o600, "{name}");
    }
}
