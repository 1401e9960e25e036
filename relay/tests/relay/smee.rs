//! Interop with the unmodified npm `smee-client` on the smee form of a channel's stream.

use std::time::Duration;

use crate::support::*;

/// The smee-client version the interop test installs (the current release when written).
const SMEE_CLIENT_VERSION: &str = "5.0.0";

/// `bin/smee.js` of the pinned smee-client, installed with npm under the target directory once
/// and reused; `None` (after a loud line) when node or npm is not installed.
fn smee_client() -> Option<std::path::PathBuf> {
    for tool in ["node", "npm"] {
        let found = std::process::Command::new(tool).arg("--version").output();
        if !found.is_ok_and(|out| out.status.success()) {
            eprintln!("SKIPPED: smee-client interop: `{tool}` is not installed");
            return None;
        }
    }
    let prefix = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("smee-client-{SMEE_CLIENT_VERSION}"));
    let package = prefix.join("node_modules/smee-client");
    let installed = std::fs::read_to_string(package.join("package.json"))
        .is_ok_and(|p| p.contains(&format!("\"version\": \"{SMEE_CLIENT_VERSION}\"")));
    if !installed {
        let out = std::process::Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&prefix)
            .arg(format!("smee-client@{SMEE_CLIENT_VERSION}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "npm install smee-client@{SMEE_CLIENT_VERSION}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(package.join("bin/smee.js"))
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
    let mut child = std::process::Command::new("node")
        .arg(&smee_js)
        .args([
            "--url",
            &s.ch.smee_url,
            "--target",
            &format!("http://{target}/hook"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (connected_tx, connected) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
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
    let ready = connected.recv_timeout(Duration::from_secs(20));
    if ready.is_err() {
        let _ = child.kill();
        panic!("smee-client did not connect to {}", s.ch.smee_url);
    }

    let (event, body) = fixtures()
        .into_iter()
        .find(|(e, _)| e == "workflow_job")
        .unwrap();
    let g = guid();
    assert_eq!(ingest(&s.ch.ingest_url, &event, &g, &body).await.0, 202);
    let got = tokio::time::timeout(PATIENCE, forwarded.recv()).await;
    let _ = child.kill();
    let _ = child.wait();
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
    // smee-client re-serialises the JSON body: the same document, not necessarily the bytes.
    let sent: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let received: serde_json::Value = serde_json::from_slice(&got_body).unwrap();
    assert_eq!(received, sent);
    assert!(
        forwarded.try_recv().is_err(),
        "one delivery, forwarded once"
    );
}
