//! JWT rules and installation-token caching, expiry and renewal, against the fake's checks.

use std::time::Duration;

use rm_fake_github::AppKeyPair;
use rm_github::GithubError;

use crate::common::*;

#[tokio::test]
async fn one_token_serves_many_calls_and_is_renewed_before_expiry() {
    let h = harness().await;
    for _ in 0..3 {
        h.client
            .list_runners(&org())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(h.seen("/access_tokens"), 1);
    // 49 minutes in, the token (one hour) is still good for more than ten minutes.
    h.advance(Duration::from_secs(49 * 60));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.seen("/access_tokens"), 1);
    // 51 minutes in, it is renewed before use.
    h.advance(Duration::from_secs(2 * 60));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.seen("/access_tokens"), 2);
    assert!(h.fake.requests().iter().all(|r| r.status != 401));
}

#[tokio::test]
async fn tokens_are_cached_per_installation() {
    let h = harness().await;
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let user_repo = "alice/tool".parse().unwrap_or_else(|e| panic!("{e}"));
    h.client
        .list_runners(&user_repo)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let minted: Vec<String> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/access_tokens"))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        minted,
        [
            format!("/app/installations/{}/access_tokens", h.org_installation),
            format!("/app/installations/{}/access_tokens", h.user_installation),
        ]
    );
}

#[tokio::test]
async fn a_revoked_token_is_replaced_once() {
    let h = harness().await;
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.fake.revoke_tokens();
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.seen("/access_tokens"), 2);
    let statuses: Vec<u16> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/orgs/acme/actions/runners")
        .map(|r| r.status)
        .collect();
    // The retry carries the ETag of the first answer, so it is a (free) 304.
    assert_eq!(statuses, [200, 401, 304]);
}

#[tokio::test]
async fn the_fake_refuses_expired_future_and_foreign_jwts() {
    let h = harness().await;
    // The fake's clock is 20 minutes ahead: the client's JWT has expired there.
    h.fake.advance_clock(Duration::from_secs(20 * 60));
    assert!(matches!(
        h.client.app().await,
        Err(GithubError::Unauthorized { .. })
    ));
    // The client's clock 20 minutes further still: iat is in the fake's future.
    h.clock.advance(Duration::from_secs(40 * 60));
    assert!(matches!(
        h.client.app().await,
        Err(GithubError::Unauthorized { .. })
    ));
    h.fake.advance_clock(Duration::from_secs(20 * 60));
    assert!(h.client.app().await.is_ok(), "clocks agree again");
    let other = AppKeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let config = rm_github::ClientConfig {
        api_url: h.fake.api_url(),
        app_id: APP_ID,
        private_key_pem: other.private_pem,
        request_timeout: Duration::from_secs(5),
        mutation_spacing: MUTATION_SPACING,
    };
    let stranger =
        rm_github::GithubClient::with_clock(config, std::sync::Arc::new(h.clock.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
    match stranger.app().await {
        Err(e @ GithubError::Unauthorized { .. }) => {
            assert!(e.to_string().contains("private key"))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_expired_token_is_refused_by_the_fake() {
    let h = harness().await;
    h.fake.set_token_ttl(Duration::from_secs(30));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // A 30-second token is always due for renewal, so every call mints one; the fake's
    // expiry check is what a stale cached token would meet.
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.seen("/access_tokens"), 2);
    h.fake.advance_clock(Duration::from_secs(31));
    h.fake.set_token_ttl(Duration::from_secs(3600));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(h.fake.requests().iter().all(|r| r.status != 401));
}

#[tokio::test]
async fn concurrent_callers_share_one_new_token() {
    let h = harness().await;
    h.client
        .installation_for(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let client = h.client.clone();
            tokio::spawn(async move { client.list_runners(&org()).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(r.is_ok(), "{r:?}");
    }
    assert_eq!(h.seen("/access_tokens"), 1);
}

#[tokio::test]
async fn an_uninstalled_app_is_looked_up_again() {
    let h = harness().await;
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.fake.revoke_tokens();
    // Simulate the installation disappearing for one token request.
    h.fake.inject_fault(
        Some("POST"),
        "/access_tokens",
        rm_fake_github::FaultAction::Status(404),
        1,
    );
    assert!(matches!(
        h.client.list_runners(&org()).await,
        Err(GithubError::NotFound { .. })
    ));
    let lookups_before = h.seen("/orgs/acme/installation");
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(h.seen("/orgs/acme/installation"), lookups_before + 1);
}
