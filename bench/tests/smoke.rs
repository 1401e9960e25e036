//! Smoke test of the load generator end to end: a bounded number of requests against an in-process
//! receiver that checks each signature and records each GUID. No timing is asserted.

use std::collections::HashSet;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use rm_bench::delivery::{Templates, build_pool};
use rm_bench::load::{Plan, Target, run};
use sha2::Sha256;
use tokio::net::TcpListener;

const SECRET: &[u8] = b"smoke-secret";

/// 202 for a delivery whose signature matches its body, 401 otherwise; remembers the GUIDs.
async fn receive(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<String>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (signature, guid) = (header("x-hub-signature-256"), header("x-github-delivery"));
    let body = req.into_body().collect().await.expect("body").to_bytes();
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).expect("key");
    mac.update(&body);
    let good = signature
        .strip_prefix("sha256=")
        .and_then(|hex_sig| hex::decode(hex_sig).ok())
        .is_some_and(|sig| mac.verify_slice(&sig).is_ok());
    let status = if good {
        seen.lock().expect("lock").push(guid);
        StatusCode::ACCEPTED
    } else {
        StatusCode::UNAUTHORIZED
    };
    Ok(Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .expect("response"))
}

#[tokio::test]
async fn every_request_is_signed_unique_and_counted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server_seen = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = server_seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| receive(req, seen.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/webhooks");
    let templates = Templates::load(&fixtures).expect("fixtures");
    // Fewer bodies than requests, so the wrap-around path runs too.
    let pool = Arc::new(build_pool(&templates, SECRET, 10, 1_000).expect("pool"));
    let target = Target::parse(&format!("http://{addr}/webhook")).expect("target");
    // Bounded by count; the duration is only a safety net.
    let plan = Plan {
        connections: 4,
        warmup: Duration::ZERO,
        duration: Duration::from_secs(60),
        max_requests: Some(64),
    };
    let outcome = run(&target, &plan, pool.clone()).await.expect("load runs");

    assert_eq!(outcome.errors, 0);
    assert_eq!(outcome.requests, 64);
    assert_eq!(outcome.sent, 64);
    assert_eq!(
        outcome
            .statuses
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect::<Vec<_>>(),
        vec![(202, 64)]
    );
    let answered: HashSet<String> = outcome.ok_guids.iter().map(|g| g.to_string()).collect();
    assert_eq!(answered.len(), 64, "every delivery GUID is fresh");
    let received: HashSet<String> = seen.lock().expect("lock").iter().cloned().collect();
    assert_eq!(
        answered, received,
        "the GUIDs reported 2xx are the ones the server accepted"
    );
    let summary = outcome.summary(&target, &plan, pool.len());
    assert_eq!(summary["pool_wrapped"], true);
    assert_eq!(summary["statuses"]["202"], 64);
}

#[test]
fn refuses_targets_off_this_machine() {
    assert!(Target::parse("http://127.0.0.1:8080/webhook").is_ok());
    assert!(Target::parse("http://[::1]:8080/webhook").is_ok());
    assert!(Target::parse("http://10.0.0.1:8080/webhook").is_err());
    assert!(Target::parse("https://127.0.0.1:8080/webhook").is_err());
}
