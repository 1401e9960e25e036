//! Interop with the unmodified npm `smee-client` on the smee form of a channel's stream, and
//! with `@octokit/webhooks` verifying the signatures of what smee-client forwards.

use std::io::BufRead;
use std::time::Duration;

use crate::support::*;

/// The smee-client version the interop test installs (the current release when written).
const SMEE_CLIENT_VERSION: &str = "5.0.0";
/// The `@octokit/webhooks` version that verifies behind smee-client: the one
/// bench/node/package-lock.json pins for the receiver benchmark.
const OCTOKIT_WEBHOOKS_VERSION: &str = "14.2.0";

/// Whether node and npm are installed; `false` after a loud line.
fn node_available(what: &str) -> bool {
    match crate::npm::node_and_npm() {
        Ok(()) => true,
        Err(why) => {
            crate::skip::cannot_run(what, "node", &why);
            false
        }
    }
}

/// `package@version` installed once under the target directory (`tests/support/npm.rs`).
fn npm_package(package: &str, version: &str) -> std::path::PathBuf {
    crate::npm::npm_package(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        package,
        version,
    )
}

/// `bin/smee.js` of the pinned smee-client; `None` (after a loud line) without node or npm.
fn smee_client() -> Option<std::path::PathBuf> {
    if !node_available("smee-client interop") {
        return None;
    }
    Some(
        npm_package("smee-client", SMEE_CLIENT_VERSION)
            .join("node_modules/smee-client/bin/smee.js"),
    )
}

/// smee-client forwarding `smee_url` to `target`, once it has logged that it is connected;
/// killed when dropped.
struct SmeeClient(std::process::Child);

impl SmeeClient {
    fn start(smee_js: &std::path::Path, smee_url: &str, target: &str) -> SmeeClient {
        let mut child = std::process::Command::new("node")
            .arg(smee_js)
            .args(["--url", smee_url, "--target", target])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let client = SmeeClient(child);
        let (connected_tx, connected) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("[smee-client] {line}");
                if line.contains("Connected to") {
                    let _ = connected_tx.send(());
                }
            }
        });
        assert!(
            connected.recv_timeout(Duration::from_secs(20)).is_ok(),
            "smee-client did not connect to {smee_url}"
        );
        client
    }
}

impl Drop for SmeeClient {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A local HTTP server that records every request it gets: smee-client's `--target`.
async fn recording_target() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(http::HeaderMap, bytes::Bytes)>,
) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let tx = tx.clone();
            let service =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await?.to_bytes();
                        let _ = tx.send((parts.headers, body));
                        Ok::<_, hyper::Error>(http::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from_static(b"ok"),
                        )))
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service),
            );
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_unmodified_smee_client_forwards_deliveries() {
    let Some(smee_js) = smee_client() else {
        return;
    };
    let s = setup();
    // Sent before smee-client connects: like smee.io, a stream without Last-Event-ID starts
    // with new deliveries only.
    ingest(&s.ch.ingest_url, "ping", &guid(), b"{\"old\":true}").await;
    let (target, mut forwarded) = recording_target().await;
    let client = SmeeClient::start(&smee_js, &s.ch.smee_url, &format!("http://{target}/hook"));

    let (event, body) = fixtures()
        .into_iter()
        .find(|(e, _)| e == "workflow_job")
        .unwrap();
    let g = guid();
    assert_eq!(ingest(&s.ch.ingest_url, &event, &g, &body).await.0, 202);
    let got = tokio::time::timeout(PATIENCE, forwarded.recv()).await;
    drop(client);
    let (headers, got_body) = got.expect("smee-client forwarded nothing").unwrap();
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        header("x-github-delivery"),
        Some(g),
        "the old delivery must not be replayed"
    );
    assert_eq!(header("x-github-event"), Some(event));
    assert_eq!(header("x-hub-signature-256"), Some(sign(&body)));
    assert_eq!(
        header("x-github-hook-installation-target-type").as_deref(),
        Some("integration")
    );
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    // A compact JSON body, as GitHub sends, arrives as the bytes that were signed.
    assert_eq!(
        String::from_utf8_lossy(&got_body),
        String::from_utf8_lossy(&body)
    );
    assert!(
        forwarded.try_recv().is_err(),
        "one delivery, forwarded once"
    );
}

/// The target behind smee-client: `@octokit/webhooks`' own Node middleware with the tests'
/// secret, which answers 200 only for a body whose signature verifies (400 otherwise). Each
/// request's delivery id and answer go to stdout as one JSON line; the port as `listening N`.
const OCTOKIT_TARGET: &str = r#"
import http from "node:http";
import { Webhooks, createNodeMiddleware } from "@octokit/webhooks";
const webhooks = new Webhooks({ secret: process.env.SECRET });
const quiet = { debug() {}, info() {}, warn() {}, error() {} };
const middleware = createNodeMiddleware(webhooks, { path: "/hook", log: quiet });
const server = http.createServer(async (req, res) => {
  await middleware(req, res);
  console.log(JSON.stringify({ delivery: req.headers["x-github-delivery"], status: res.statusCode }));
});
server.listen(0, "127.0.0.1", () => console.log(`listening ${server.address().port}`));
"#;

/// `@octokit/webhooks` verifying, behind the unmodified smee-client, the signature of every
/// fixture and of a payload whose keys are out of alphabetical order with raw UTF-8 in it
/// (compact, as GitHub sends): smee-client re-serialises the body it is given, so the relay
/// must give it the body in its own key order.
#[tokio::test(flavor = "multi_thread")]
async fn octokit_webhooks_verifies_what_the_unmodified_smee_client_forwards() {
    let Some(smee_js) = smee_client() else {
        return;
    };
    let prefix = npm_package("@octokit/webhooks", OCTOKIT_WEBHOOKS_VERSION);
    let script = prefix.join("verify-target.mjs");
    std::fs::write(&script, OCTOKIT_TARGET).unwrap();
    let mut target = std::process::Command::new("node")
        .arg(&script)
        .env("SECRET", std::str::from_utf8(SECRET).unwrap())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = target.stdout.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("[octokit] {line}");
            let _ = lines_tx.send(line);
        }
    });
    let port = lines
        .recv_timeout(Duration::from_secs(20))
        .ok()
        .and_then(|l| l.strip_prefix("listening ").map(str::to_owned))
        .expect("the @octokit/webhooks target did not start");

    let s = setup();
    let client = SmeeClient::start(
        &smee_js,
        &s.ch.smee_url,
        &format!("http://127.0.0.1:{port}/hook"),
    );
    let mut payloads = vec![(
        "workflow_job".to_owned(),
        r#"{"action":"queued","workflow_job":{"id":29679449,"name":"Bau ✓ für 東京","labels":["self-hosted","linux"],"steps":[]},"repository":{"name":"widgets","full_name":"acme/widgets","owner":{"login":"acme"}},"installation":{"id":79929171}}"#
            .as_bytes()
            .to_vec(),
    )];
    payloads.extend(fixtures());
    let mut expected = Vec::new();
    for (event, body) in &payloads {
        let g = guid();
        assert_eq!(ingest(&s.ch.ingest_url, event, &g, body).await.0, 202);
        expected.push(g);
    }
    let mut answers = std::collections::HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while answers.len() < expected.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = lines.recv_timeout(left) else {
            break;
        };
        let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
        answers.insert(
            answer["delivery"].as_str().unwrap().to_owned(),
            answer["status"].as_u64().unwrap(),
        );
    }
    drop(client);
    let _ = target.kill();
    let _ = target.wait();
    for ((event, body), g) in payloads.iter().zip(&expected) {
        assert_eq!(
            answers.get(g),
            Some(&200),
            "@octokit/webhooks must verify {event} {g} behind smee-client: {}",
            String::from_utf8_lossy(&body[..body.len().min(120)])
        );
    }
}
