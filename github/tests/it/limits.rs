//! The budget against the fake's rate limits: nothing leaves the process while a limit holds.

use std::time::Duration;

use rm_github::{GithubError, LimitKind};
use rm_vocab::RunnerId;

use crate::common::*;

#[tokio::test]
async fn with_the_quota_spent_no_request_leaves_until_the_reset() {
    let h = harness().await;
    // Warm up: installation known, token minted.
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.fake.exhaust_rate_limit(Duration::from_secs(600));
    let first = h.client.list_runners(&org()).await;
    let retry_at = match first {
        Err(GithubError::RateLimited {
            kind: LimitKind::Primary,
            retry_at,
            ..
        }) => retry_at,
        other => panic!("{other:?}"),
    };
    let seen = h.fake.requests().len();
    for _ in 0..5 {
        match h.client.list_runners(&org()).await {
            Err(GithubError::RateLimited { retry_at: r, .. }) => assert_eq!(r, retry_at),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        h.fake.requests().len(),
        seen,
        "requests left during the limit"
    );
    h.advance(Duration::from_secs(601));
    let after = h.client.list_runners(&org()).await;
    assert!(after.is_ok(), "{after:?}");
    assert_eq!(h.fake.requests().len(), seen + 1);
}

#[tokio::test]
async fn the_client_stops_at_its_reserve_before_github_says_no() {
    let h = harness().await;
    h.fake.set_rate_limit(5);
    // access_tokens and the installation lookup spend the App's quota, not the installation's.
    let mut ok = 0;
    let mut refused = None;
    for _ in 0..10 {
        match h.client.get_runner(&org(), RunnerId::new(1)).await {
            Err(GithubError::NotFound { .. }) => ok += 1,
            Err(e @ GithubError::RateLimited { .. }) => {
                refused = Some(e);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    // Limit 5, reserve 1: four requests, then refusal before the quota reaches zero.
    assert_eq!(ok, 4);
    assert!(refused.is_some());
    // GitHub answers a spent quota 403 or 429 (the fake alternates): neither was needed.
    assert!(
        h.fake
            .requests()
            .iter()
            .all(|r| !matches!(r.status, 403 | 429)),
        "GitHub never had to refuse"
    );
}

#[tokio::test]
async fn a_secondary_limits_retry_after_is_honoured() {
    for status in [403, 429] {
        let h = harness().await;
        h.client.app().await.unwrap_or_else(|e| panic!("{e}"));
        h.fake
            .secondary_limit(Duration::from_secs(30), status, true);
        let retry_at = match h.client.app().await {
            Err(GithubError::RateLimited {
                kind: LimitKind::Secondary,
                retry_at,
                ..
            }) => retry_at,
            other => panic!("{status}: {other:?}"),
        };
        let now = std::time::SystemTime::now();
        assert!(retry_at > now + Duration::from_secs(20), "retry-after read");
        let seen = h.fake.requests().len();
        h.advance(Duration::from_secs(20));
        assert!(matches!(
            h.client.app().await,
            Err(GithubError::RateLimited { .. })
        ));
        assert_eq!(h.fake.requests().len(), seen);
        h.advance(Duration::from_secs(15));
        assert!(h.client.app().await.is_ok());
        assert_eq!(h.fake.requests().len(), seen + 1);
    }
}

#[tokio::test]
async fn a_secondary_limit_without_retry_after_waits_a_minute() {
    let h = harness().await;
    h.fake.secondary_limit(Duration::from_secs(10), 403, false);
    assert!(matches!(
        h.client.app().await,
        Err(GithubError::RateLimited {
            kind: LimitKind::Secondary,
            ..
        })
    ));
    let seen = h.fake.requests().len();
    h.advance(Duration::from_secs(30));
    assert!(
        h.client.app().await.is_err(),
        "GitHub's limit is over, but a minute has not passed"
    );
    assert_eq!(h.fake.requests().len(), seen);
    h.advance(Duration::from_secs(31));
    assert!(h.client.app().await.is_ok());
}

#[tokio::test]
async fn a_blocked_installation_does_not_even_renew_its_token() {
    let h = harness().await;
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.fake
        .secondary_limit(Duration::from_secs(2 * 3600), 429, true);
    assert!(matches!(
        h.client.list_runners(&org()).await,
        Err(GithubError::RateLimited {
            kind: LimitKind::Secondary,
            ..
        })
    ));
    // 55 minutes on, the token is due for renewal but the installation is still held.
    h.advance(Duration::from_secs(55 * 60));
    let seen = h.fake.requests().len();
    assert!(matches!(
        h.client.list_runners(&org()).await,
        Err(GithubError::RateLimited { .. })
    ));
    assert_eq!(
        h.fake.requests().len(),
        seen,
        "a token was requested for a held call"
    );
}

#[tokio::test]
async fn budgets_are_kept_per_resource_as_github_names_them() {
    let h = harness().await;
    h.fake.set_jit_resource("actions_runner_registration");
    h.client
        .generate_jitconfig(&org(), &jit_request("a"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.fake
        .exhaust_resource("actions_runner_registration", Duration::from_secs(900));
    match h.client.generate_jitconfig(&org(), &jit_request("b")).await {
        Err(GithubError::RateLimited {
            kind: LimitKind::Primary,
            resource,
            ..
        }) => {
            assert_eq!(resource, "actions_runner_registration")
        }
        other => panic!("{other:?}"),
    }
    let seen = h.fake.requests().len();
    // The registration budget is held; the core one is not.
    assert!(matches!(
        h.client.generate_jitconfig(&org(), &jit_request("c")).await,
        Err(GithubError::RateLimited { .. })
    ));
    assert_eq!(h.fake.requests().len(), seen);
    assert!(h.client.list_runners(&org()).await.is_ok());
    let lines = h.client.budget();
    let registration = lines
        .iter()
        .find(|b| b.resource == "actions_runner_registration")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(registration.blocked.is_some());
    assert!(
        lines
            .iter()
            .filter(|b| b.resource == "core")
            .all(|b| b.blocked.is_none())
    );
}

/// Registrations in their own primary bucket (`actions_runner_registration`, as the fake gives
/// them on request): every JIT answer carries the bucket's `x-ratelimit-*` headers, the client
/// keeps that bucket apart from `core` and stops at its reserve before GitHub says no, while
/// reads of the same installation go on. A second client (another tool on the same App) that
/// spends the rest meets GitHub's own primary-limit answer.
#[tokio::test]
async fn registrations_spend_their_own_bucket_and_stop_at_its_reserve() {
    let h = harness().await;
    h.fake.set_registration_limit(3);
    for name in ["a", "b"] {
        h.client
            .generate_jitconfig(&org(), &jit_request(name))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let answered: Vec<_> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/generate-jitconfig"))
        .collect();
    let headers = |r: &rm_fake_github::RequestRecord| {
        (
            r.response_header("x-ratelimit-resource").map(str::to_owned),
            r.response_header("x-ratelimit-limit").map(str::to_owned),
            r.response_header("x-ratelimit-remaining")
                .map(str::to_owned),
        )
    };
    assert_eq!(
        headers(&answered[1]),
        (
            Some("actions_runner_registration".into()),
            Some("3".into()),
            Some("1".into())
        )
    );
    // One left is the reserve (a hundredth, at least one): the client keeps it.
    let seen = h.fake.requests().len();
    match h.client.generate_jitconfig(&org(), &jit_request("c")).await {
        Err(GithubError::RateLimited {
            kind: LimitKind::Primary,
            resource,
            ..
        }) => assert_eq!(resource, "actions_runner_registration"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.fake.requests().len(),
        seen,
        "a request left into the reserve"
    );
    assert!(h.client.list_runners(&org()).await.is_ok());
    // Another client of the same App spends the last one; then GitHub itself says no.
    let other = client_for(h.fake.api_url(), Duration::from_secs(10), &h.clock);
    other
        .generate_jitconfig(&org(), &jit_request("d"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let fresh = client_for(h.fake.api_url(), Duration::from_secs(10), &h.clock);
    match fresh.generate_jitconfig(&org(), &jit_request("e")).await {
        Err(GithubError::RateLimited {
            kind: LimitKind::Primary,
            resource,
            ..
        }) => assert_eq!(resource, "actions_runner_registration"),
        other => panic!("{other:?}"),
    }
    let last = h
        .fake
        .requests()
        .pop()
        .unwrap_or_else(|| panic!("no request"));
    assert!(matches!(last.status, 403 | 429), "{}", last.status);
    assert_eq!(last.response_header("x-ratelimit-remaining"), Some("0"));
}
