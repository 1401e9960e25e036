//! What the executor writes to its log, through the harness on the test's own thread (a
//! current-thread runtime, so [`LogCapture`] sees the launch tasks' lines too): no secret it
//! handles reaches it (`.ci/mutants`: `log-jit`). The end-to-end test
//! `lifecycle::a_queued_webhook_becomes_one_runner_that_takes_its_job_and_leaves_nothing` checks
//! the same of the real binary's log, journal, status and CLI output together.

use crate::test_log_capture::LogCapture;

use super::*;

#[tokio::test]
async fn a_runner_s_jit_configuration_and_tokens_never_reach_the_log() {
    let capture = LogCapture::start(tracing::Level::TRACE);
    let mut h = Harness::new(Options::default()).await;
    let job = h.queue("build", &["self-hosted"]);
    h.until(
        "the job completed and its runner cleaned",
        |_| {},
        |h| h.completed(job) && h.all_cleaned() && !h.attempts().is_empty(),
    )
    .await;
    let log = capture.text();
    assert!(
        log.contains("runner started"),
        "the launch's lines were captured: {log}"
    );
    let jits: Vec<String> = h
        .backend
        .jits
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .cloned()
        .collect();
    assert_eq!(jits.len(), 1, "one runner was given a JIT configuration");
    let tokens = h.fake.issued_tokens();
    assert!(!tokens.is_empty(), "the executor used installation tokens");
    for (what, secret) in jits
        .iter()
        .map(|j| ("the JIT configuration", j))
        .chain(tokens.iter().map(|t| ("an installation token", t)))
    {
        assert!(!log.contains(secret.as_str()), "{what} is in the log");
    }
}
