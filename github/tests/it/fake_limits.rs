//! The client against what the fake enforces by itself, as GitHub does (not injected by a
//! test): GitHub's documented secondary limits, answered 403 or 429 with `retry-after`; a spent
//! primary quota answered 403 or 429 with `x-ratelimit-reset`; a `User-Agent` on every request.
//! The client must take each answer in either status, and its own pacing must agree with the
//! documented numbers.

use std::time::Duration;

use rm_fake_github::{LimitStatus, SecondaryLimits};
use rm_github::{Clock as _, GithubError, LimitKind};

use crate::common::*;

/// 100 registrations at once: the client's pacing lets the documented 80 a minute leave and
/// refuses the rest itself with the time they may leave, so GitHub (the fake, with GitHub's
/// numbers) never has to answer a secondary limit.
#[tokio::test]
async fn a_burst_of_registrations_stays_inside_the_documented_limits() {
    let h = harness().await;
    let mut created = 0;
    let mut held = 0;
    for n in 0..100 {
        match h
            .client
            .generate_jitconfig(&org(), &jit_request(&format!("r{n}")))
            .await
        {
            Ok(_) => created += 1,
            Err(GithubError::RateLimited {
                kind: LimitKind::Secondary,
                ..
            }) => held += 1,
            Err(other) => panic!("registration {n}: {other}"),
        }
    }
    assert_eq!((created, held), (80, 20));
    let jits = h.seen("/generate-jitconfig");
    assert_eq!(jits, 80, "only what fits left the process");
    assert!(
        h.fake.requests().iter().all(|r| !r.secondary_limited()),
        "GitHub had to refuse a request"
    );
    assert_eq!(h.fake.creations(Some(h.org_installation)).0, 80);
}

/// When GitHub's limit is tighter than the documented one (GitHub: "limits may change without
/// notice"), its own answer steers: a 403 and then a 429 with `retry-after` are each a
/// secondary limit until then, and nothing of that installation leaves meanwhile.
#[tokio::test]
async fn a_tighter_limit_at_github_is_honoured_in_either_status() {
    for status in [LimitStatus::Forbidden, LimitStatus::TooManyRequests] {
        let h = harness().await;
        h.fake.set_limit_status(status);
        h.fake.set_secondary_limits(SecondaryLimits {
            creations_per_minute: 3,
            ..SecondaryLimits::GITHUB
        });
        for n in 0..3 {
            h.client
                .generate_jitconfig(&org(), &jit_request(&format!("r{n}")))
                .await
                .unwrap_or_else(|e| panic!("{status:?} {n}: {e}"));
        }
        let retry_at = match h
            .client
            .generate_jitconfig(&org(), &jit_request("r3"))
            .await
        {
            Err(GithubError::RateLimited {
                kind: LimitKind::Secondary,
                retry_at,
                ..
            }) => retry_at,
            other => panic!("{status:?}: {other:?}"),
        };
        let limited: Vec<_> = h
            .fake
            .requests()
            .into_iter()
            .filter(|r| r.secondary_limited())
            .collect();
        assert_eq!(limited.len(), 1);
        let want = if status == LimitStatus::Forbidden {
            403
        } else {
            429
        };
        assert_eq!(limited[0].status, want);
        let secs: u64 = limited[0]
            .response_header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(secs >= 55, "retry-after {secs}");
        let now = h.clock.now();
        assert!(
            retry_at >= now + Duration::from_secs(secs - 1),
            "retry-after read"
        );
        // Held: a read of the same installation does not leave either.
        let seen = h.fake.requests().len();
        h.advance(Duration::from_secs(secs - 5));
        assert!(matches!(
            h.client.list_runners(&org()).await,
            Err(GithubError::RateLimited { .. })
        ));
        assert_eq!(
            h.fake.requests().len(),
            seen,
            "a request left into the wait"
        );
        h.advance(Duration::from_secs(6));
        h.client
            .generate_jitconfig(&org(), &jit_request("r3"))
            .await
            .unwrap_or_else(|e| panic!("{status:?} after the wait: {e}"));
    }
}

/// A spent quota answered 403 or 429 (with `x-ratelimit-remaining: 0`) is a primary limit until
/// `x-ratelimit-reset` either way.
#[tokio::test]
async fn a_spent_quota_is_a_primary_limit_in_either_status() {
    for status in [LimitStatus::Forbidden, LimitStatus::TooManyRequests] {
        let h = harness().await;
        h.fake.set_limit_status(status);
        h.client
            .list_runners(&org())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        h.fake.exhaust_rate_limit(Duration::from_secs(600));
        match h.client.list_runners(&org()).await {
            Err(GithubError::RateLimited {
                kind: LimitKind::Primary,
                retry_at,
                ..
            }) => {
                let now = h.clock.now();
                assert!(retry_at > now + Duration::from_secs(590), "{status:?}");
            }
            other => panic!("{status:?}: {other:?}"),
        }
        let last = h.fake.requests().pop().map(|r| r.status);
        let want = if status == LimitStatus::Forbidden {
            403
        } else {
            429
        };
        assert_eq!(last, Some(want));
    }
}

/// GitHub refuses a request without a `User-Agent` (403, "Request forbidden by administrative
/// rules"), and so does the fake: every kind of request the client makes (JWT, token mint,
/// installation reads and writes) carries one and is answered.
#[tokio::test]
async fn every_request_names_its_user_agent() {
    let h = harness().await;
    h.client.app().await.unwrap_or_else(|e| panic!("{e}"));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let jit = h
        .client
        .generate_jitconfig(&org(), &jit_request("ua"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.client
        .delete_runner(&org(), jit.runner.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let requests = h.fake.requests();
    assert!(requests.len() >= 5, "{} requests", requests.len());
    for r in &requests {
        let ua = r.header("user-agent").unwrap_or("");
        assert!(
            !ua.trim().is_empty(),
            "{} {} without a User-Agent",
            r.method,
            r.path
        );
        assert_ne!(r.status, 403, "{} {} refused", r.method, r.path);
    }
}
