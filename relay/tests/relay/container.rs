//! The container image's command line (deploy/relay/Dockerfile's ENTRYPOINT and CMD) run as
//! is: health, metrics, and a graceful SIGTERM that ends the streams and exits 0.

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_container_cmd_serves_health_and_metrics_and_sigterm_ends_streams_and_exits_0() {
    let dockerfile = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/relay/Dockerfile"
    ))
    .unwrap();
    let instruction = |name: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in the Dockerfile"));
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{name} is not a JSON array: {e}"))
    };
    assert_eq!(instruction("ENTRYPOINT"), ["rm-relay"]);
    // The image's own command line, with a free port and a temporary data directory.
    let (_tmp, data) = data_dir();
    let mut cmd = instruction("CMD");
    for (flag, value) in [("--listen", "127.0.0.1:0"), ("--data-dir", dir_arg(&data))] {
        let at = cmd
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("CMD has no {flag}"));
        cmd[at + 1] = value.to_owned();
    }
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let mut relay = Relay::start_with(&args);

    let (code, body) = send(get(&relay.url("/healthz"), None, None)).await;
    assert_eq!((code, &body[..]), (200, &b"ok\n"[..]));
    let ch = add_channel(&data, "ci");
    let token = issue_token(&data, "ci", "h1");
    let (_, id) = ingest(&ch.ingest_url, "ping", &guid(), b"{}").await;
    ingest(&ch.ingest_url, "ping", &guid(), b"{}").await;
    let mut stream = Sse::open(get(&ch.subscribe_url, Some(&token), Some(id))).await;
    stream.event().await;
    assert_eq!(
        ack(&ch.subscribe_url, &token, &format!(r#"{{"id": {id}}}"#)).await,
        204
    );
    let (code, metrics) = send(get(&relay.url("/metrics"), None, None)).await;
    assert_eq!(code, 200);
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    for line in [
        "rm_relay_deliveries_ingested_total{outcome=\"new\"} 2",
        "rm_relay_subscribers{form=\"relay\"} 1",
        "rm_relay_events_sent_total{form=\"relay\"} 1",
        "rm_relay_acks_total 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in\n{metrics}"
        );
    }

    relay.terminate();
    match stream.next(PATIENCE).await {
        Next::End => {}
        Next::Event(event) => panic!("event during shutdown: {event:?}"),
        Next::Timeout => panic!("SIGTERM left the stream open"),
    }
    assert_eq!(relay.wait_exit(PATIENCE).code(), Some(0));
}
