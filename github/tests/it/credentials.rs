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
        request_timeout: Duration::from_secs(5),
        ..rm_github::ClientConfig::new(h.fake.api_url(), APP_ID, other.private_pem)
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

/// One request to the fake with `authorization` as given, bypassing the client (which would
/// renew a token before sending it): the status and the JSON body of the answer.
async fn send_raw(h: &Harness, path: &str, authorization: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = h.fake.server_url();
    let addr = addr.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    // HTTP/1.0 so the answer is closed-delimited, never chunked: the test reads it whole.
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: rm-tests\r\n\
         Accept: application/vnd.github+json\r\nAuthorization: {authorization}\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("send: {e}"));
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .unwrap_or_else(|e| panic!("read: {e}"));
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {answer:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let body = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
    (status, body)
}

#[tokio::test]
async fn an_expired_token_is_refused_by_the_fake() {
    let h = harness().await;
    // An installation token the fake issued, sent as is: good while it lives...
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let [token] = h
        .fake
        .issued_tokens()
        .try_into()
        .unwrap_or_else(|t| panic!("{t:?}"));
    let runners = "/orgs/acme/actions/runners";
    let auth = format!("token {token}");
    let ttl = rm_fake_github::state::DEFAULT_TOKEN_TTL;
    // (a minute of margin for a slow machine between minting and this request)
    h.fake.advance_clock(ttl - Duration::from_secs(60));
    assert_eq!(
        send_raw(&h, runners, &auth).await.0,
        200,
        "the token is still valid"
    );
    // ...and refused past its expiry as GitHub refuses it: 401 Bad credentials.
    h.fake.advance_clock(Duration::from_secs(61));
    let (status, body) = send_raw(&h, runners, &auth).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["message"], "Bad credentials", "{body}");

    // An App JWT, signed by the App's key: accepted before its `exp`, refused after it.
    let last = h.fake.requests().last().map(|r| r.at);
    let now = rm_fake_github::time::unix(last.unwrap_or_else(|| panic!("no request")));
    let claims = serde_json::json!({"iat": now - 60, "exp": now + 120, "iss": APP_ID.to_string()});
    let pem = secrecy::ExposeSecret::expose_secret(&key().private_pem)
        .as_bytes()
        .to_vec();
    let signing = jsonwebtoken::EncodingKey::from_rsa_pem(&pem).unwrap_or_else(|e| panic!("{e}"));
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    let jwt = jsonwebtoken::encode(&header, &claims, &signing).unwrap_or_else(|e| panic!("{e}"));
    let auth = format!("Bearer {jwt}");
    assert_eq!(
        send_raw(&h, "/app", &auth).await.0,
        200,
        "the JWT is still valid"
    );
    h.fake.advance_clock(Duration::from_secs(121));
    let (status, body) = send_raw(&h, "/app", &auth).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        body["message"],
        "'Expiration time' claim ('exp') must be a numeric value representing the future time \
         at which the assertion expires.",
        "{body}"
    );
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
