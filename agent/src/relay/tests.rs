//! The subscription against a hostile in-process relay: plain TCP, so the test controls every
//! byte the agent reads.

use std::sync::Arc;
use std::time::Duration;

use rm_journal::{JOURNAL_FILE, Journal, Retention};
use rm_receiver::WebhookSecrets;
use secrecy::SecretString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::Subscription;
use super::sse::MAX_EVENT_BYTES;

/// How much the hostile relay writes before it concludes the agent buffers without end: the
/// cap plus far more than any socket buffers could hold.
const GIVE_UP_AFTER: usize = 3 * MAX_EVENT_BYTES;
/// Bytes the kernel and hyper may hold between the relay's writes and the parser: loopback
/// socket buffers and hyper's read buffer are a few MiB at most.
const IN_FLIGHT_SLACK: usize = 16 * 1024 * 1024;

/// One connection as the hostile relay saw it: bytes written, and whether the agent hung up.
#[derive(Debug)]
struct Served {
    written: usize,
    dropped_by_agent: bool,
}

/// A relay that answers every subscription with one event that never ends.
async fn endless_relay() -> (String, mpsc::UnboundedReceiver<Served>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!(
        "http://{}/subscribe/ch",
        listener.local_addr().expect("addr")
    );
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let start = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\nevent: delivery\nid: 1\ndata: ";
                if socket.write_all(start).await.is_err() {
                    return;
                }
                let chunk = vec![b'a'; 256 * 1024];
                let mut written = 0;
                let dropped_by_agent = loop {
                    if written >= GIVE_UP_AFTER {
                        break false;
                    }
                    if socket.write_all(&chunk).await.is_err() {
                        break true;
                    }
                    written += chunk.len();
                };
                let _ = tx.send(Served {
                    written,
                    dropped_by_agent,
                });
            });
        }
    });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_event_drops_the_connection_within_the_cap_and_reconnects() {
    let (url, mut served) = endless_relay().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let journal =
        Journal::open(&dir.path().join(JOURNAL_FILE), Retention::default()).expect("journal");
    let secrets = WebhookSecrets::new(vec![SecretString::from("s3cret")]).expect("one secret");
    let subscription = Subscription::new(
        &url,
        SecretString::from("token"),
        Arc::new(secrets),
        journal,
    )
    .expect("subscription");
    let mut state = subscription.state();
    let (stop_tx, stop) = watch::channel(false);
    let running = tokio::spawn(subscription.run(stop));

    let first = tokio::time::timeout(Duration::from_secs(300), served.recv())
        .await
        .expect("the relay saw the connection end in time")
        .expect("a connection");
    assert!(
        first.dropped_by_agent,
        "the agent kept reading {} bytes of one event without giving up",
        first.written
    );
    assert!(
        first.written <= MAX_EVENT_BYTES + IN_FLIGHT_SLACK,
        "the agent read {} bytes of one event (cap {MAX_EVENT_BYTES})",
        first.written
    );
    let problem = tokio::time::timeout(
        Duration::from_secs(60),
        state.wait_for(|s| s.problem.is_some()),
    )
    .await
    .expect("the problem is reported")
    .expect("state")
    .problem
    .clone()
    .expect("a problem");
    assert!(problem.contains("longer than"), "{problem}");
    // And it tries again, after its back-off, rather than giving up on the relay.
    let second = tokio::time::timeout(Duration::from_secs(300), served.recv())
        .await
        .expect("the agent reconnected in time")
        .expect("a second connection");
    assert!(second.dropped_by_agent);

    stop_tx.send_replace(true);
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the subscription stops")
        .expect("no panic");
}
