//! The harness for the relay's integration tests: the real `rm-relay` binary started on a free
//! loopback port, its `channel` commands, signed deliveries from the webhook fixtures, and a
//! small Server-Sent Events reader over a real HTTP connection.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_rm-relay");
pub(crate) const FIXTURES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");
/// The webhook secret the tests sign with; the relay never sees it.
pub(crate) const SECRET: &[u8] = b"It's a Secret to Everybody";
/// How long a test waits for something that should take milliseconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

/// A running `rm-relay serve`; killed when dropped.
pub(crate) struct Relay {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Relay {
    /// `rm-relay serve --listen 127.0.0.1:0 --data-dir DIR`.
    pub(crate) fn start(data_dir: &Path) -> Relay {
        let dir = data_dir.to_str().unwrap();
        Relay::start_with(&["serve", "--listen", "127.0.0.1:0", "--data-dir", dir])
    }

    /// Starts the binary with `args` and waits for its `listening addr=...` log line; the rest
    /// of its log is copied to the test's stderr.
    pub(crate) fn start_with(args: &[&str]) -> Relay {
        let mut child = Command::new(BIN)
            .args(args)
            .env("RM_LOG", "info,rm_relay=debug")
            .env_remove("RM_RELAY_DATA_DIR")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("[rm-relay] {line}");
                if line.contains("listening")
                    && let Some(addr) = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("addr="))
                {
                    let _ = tx.send(addr.parse::<SocketAddr>().unwrap());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("rm-relay did not log its listening address");
        Relay { child, addr }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends SIGTERM (the graceful stop).
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "rm-relay did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs an `rm-relay` command to completion.
pub(crate) fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RM_RELAY_DATA_DIR")
        .output()
        .unwrap()
}

/// Runs an `rm-relay` command that must succeed; its stdout.
pub(crate) fn cli_ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "rm-relay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A channel's URLs, as `channel add --json` printed them.
#[derive(serde::Deserialize, Debug)]
pub(crate) struct Channel {
    pub ingest_url: String,
    pub subscribe_url: String,
    pub smee_url: String,
}

pub(crate) fn add_channel(data_dir: &Path, name: &str) -> Channel {
    let out = cli_ok(&[
        "channel",
        "add",
        name,
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--json",
    ]);
    serde_json::from_str(&out).unwrap()
}

pub(crate) fn issue_token(data_dir: &Path, name: &str, host: &str) -> String {
    let out = cli_ok(&[
        "channel",
        "token",
        name,
        host,
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--json",
    ]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    doc["token"].as_str().unwrap().to_owned()
}

pub(crate) fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `sha256=` + hex HMAC-SHA256 of the body, as GitHub signs.
pub(crate) fn sign(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Every fixture: (event name, exact bytes).
pub(crate) fn fixtures() -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            (
                name.split('.').next().unwrap().to_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    all.sort();
    all
}

/// A GitHub-shaped delivery request to an ingest URL.
pub(crate) fn delivery(
    url: &str,
    event: &str,
    guid: &str,
    body: &[u8],
) -> http::Request<Full<Bytes>> {
    http::Request::post(url)
        .header("content-type", "application/json")
        .header("user-agent", "GitHub-Hookshot/044aadd")
        .header("x-github-event", event)
        .header("x-github-delivery", guid)
        .header("x-github-hook-id", "292430182")
        .header("x-github-hook-installation-target-type", "integration")
        .header("x-github-hook-installation-target-id", "79929171")
        .header("x-hub-signature-256", sign(body))
        .header("x-forwarded-for", "10.1.2.3")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap()
}

/// Sends a request; the status and the whole body.
pub(crate) async fn send(req: http::Request<Full<Bytes>>) -> (u16, Bytes) {
    let res = client().request(req).await.unwrap();
    let status = res.status().as_u16();
    (status, res.into_body().collect().await.unwrap().to_bytes())
}

/// Sends a request and reads only the status (a stream's body never ends).
pub(crate) async fn status(req: http::Request<Full<Bytes>>) -> u16 {
    client().request(req).await.unwrap().status().as_u16()
}

/// Ingests a delivery; its status and the id the relay answered with.
pub(crate) async fn ingest(url: &str, event: &str, guid: &str, body: &[u8]) -> (u16, i64) {
    let (status, answer) = send(delivery(url, event, guid, body)).await;
    let answer: serde_json::Value = serde_json::from_slice(&answer)
        .unwrap_or_else(|_| panic!("{status}: {}", String::from_utf8_lossy(&answer)));
    (status, answer["id"].as_i64().unwrap())
}

pub(crate) fn get(
    url: &str,
    token: Option<&str>,
    last_event_id: Option<i64>,
) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::get(url).header("accept", "text/event-stream");
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id.to_string());
    }
    req.body(Full::new(Bytes::new())).unwrap()
}

pub(crate) async fn ack(subscribe_url: &str, token: &str, body: &str) -> u16 {
    let req = http::Request::post(format!("{subscribe_url}/ack"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(req).await.0
}

/// One Server-Sent Event.
#[derive(Debug, Default, Clone)]
pub(crate) struct Event {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

impl Event {
    /// A relay-form delivery: (id, headers, exact body bytes).
    pub(crate) fn delivery(&self) -> (i64, serde_json::Map<String, serde_json::Value>, Vec<u8>) {
        assert_eq!(self.event.as_deref(), Some("delivery"), "{self:?}");
        let data: serde_json::Value = serde_json::from_str(&self.data).unwrap();
        let body = base64::engine::general_purpose::STANDARD
            .decode(data["body"].as_str().unwrap())
            .unwrap();
        let id = self.id.as_deref().unwrap().parse().unwrap();
        (id, data["headers"].as_object().unwrap().clone(), body)
    }
}

pub(crate) enum Next {
    Event(Event),
    End,
    Timeout,
}

/// Reads events from an SSE response, skipping comment-only blocks (keepalives).
pub(crate) struct Sse {
    body: Incoming,
    buf: Vec<u8>,
    /// Where to resume looking for the blank line that ends an event (a 25 MiB delivery
    /// arrives in thousands of frames; rescanning from the start would be quadratic).
    scanned: usize,
}

impl Sse {
    /// Opens a stream; panics unless the answer is 200 `text/event-stream`.
    pub(crate) async fn open(req: http::Request<Full<Bytes>>) -> Sse {
        let res = client().request(req).await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        Sse {
            body: res.into_body(),
            buf: Vec::new(),
            scanned: 0,
        }
    }

    pub(crate) async fn next(&mut self, within: Duration) -> Next {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let found = self.buf[self.scanned..]
                .windows(2)
                .position(|w| w == b"\n\n");
            let Some(at) = found.map(|at| self.scanned + at) else {
                self.scanned = self.buf.len().saturating_sub(1);
                match tokio::time::timeout_at(deadline, self.body.frame()).await {
                    Err(_) => return Next::Timeout,
                    Ok(None) | Ok(Some(Err(_))) => return Next::End,
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            self.buf.extend_from_slice(&data);
                        }
                    }
                }
                continue;
            };
            let block: Vec<u8> = self.buf.drain(..at + 2).collect();
            self.scanned = 0;
            let mut event = Event::default();
            let mut fields = 0;
            for line in std::str::from_utf8(&block).unwrap().lines() {
                let (name, value) = line.split_once(": ").unwrap_or((line, ""));
                match name {
                    "id" => event.id = Some(value.to_owned()),
                    "event" => event.event = Some(value.to_owned()),
                    "data" => event.data.push_str(value),
                    _ => continue,
                }
                fields += 1;
            }
            if fields > 0 {
                return Next::Event(event);
            }
        }
    }

    /// The next event, which must come within [`PATIENCE`].
    pub(crate) async fn event(&mut self) -> Event {
        match self.next(PATIENCE).await {
            Next::Event(event) => event,
            Next::End => panic!("the stream ended"),
            Next::Timeout => panic!("no event within {PATIENCE:?}"),
        }
    }

    /// Asserts that nothing (but keepalives) arrives for `quiet`.
    pub(crate) async fn assert_quiet(&mut self, quiet: Duration) {
        match self.next(quiet).await {
            Next::Timeout => {}
            Next::Event(event) => panic!("unexpected event {event:?}"),
            Next::End => panic!("the stream ended"),
        }
    }
}

/// A temporary data directory.
pub(crate) fn data_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    (dir, path)
}

/// A path argument.
pub(crate) fn dir_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A relay with one channel `ci` and a token for host `h1`.
pub(crate) struct Setup {
    pub _tmp: tempfile::TempDir,
    pub data: std::path::PathBuf,
    pub relay: Relay,
    pub ch: Channel,
    pub token: String,
}

pub(crate) fn setup() -> Setup {
    let (tmp, data) = data_dir();
    let relay = Relay::start(&data);
    let ch = add_channel(&data, "ci");
    let token = issue_token(&data, "ci", "h1");
    Setup {
        _tmp: tmp,
        data,
        relay,
        ch,
        token,
    }
}

pub(crate) fn guid() -> String {
    uuid::Uuid::new_v4().to_string()
}
