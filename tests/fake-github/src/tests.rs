//! The fake over HTTP, as a client meets it: GitHub's secondary limits (points per endpoint,
//! content creation, concurrency) and primary limits, answered with GitHub's statuses, headers
//! and messages. Tokens are issued straight from the state, so no App key is needed.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::{FakeGithub, FakeOptions, FaultAction, LimitStatus, SecondaryLimits};

/// The `User-Agent` these requests send (GitHub refuses requests without one).
const AGENT: &str = "rm-fake-github-tests";

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").and_then(|v| v.parse().ok())
    }

    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    /// A secondary limit as GitHub answers one: 403 or 429, its message and documentation,
    /// quota left (so only the message and `retry-after` say which limit it was).
    fn is_secondary(&self) -> bool {
        matches!(self.status, 403 | 429)
            && self.message().contains("exceeded a secondary rate limit")
            && self.body["documentation_url"]
                .as_str()
                .is_some_and(|u| u.contains("secondary-rate-limits"))
            && self
                .header("x-ratelimit-remaining")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|r| r > 0)
    }
}

struct Harness {
    fake: FakeGithub,
    client: Client<HttpConnector, Full<Bytes>>,
    acme: String,
    other: String,
}

async fn harness(secondary_limits: SecondaryLimits) -> Harness {
    let mut options = FakeOptions::new(1, String::new());
    options.secondary_limits = secondary_limits;
    let fake = FakeGithub::start(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let acme = fake.add_org("acme");
    let other = fake.add_org("other");
    let (acme, other) = fake.with(|s| (s.issue_token(acme).0, s.issue_token(other).0));
    Harness {
        fake,
        client: Client::builder(TokioExecutor::new()).build_http(),
        acme,
        other,
    }
}

impl Harness {
    async fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Answer {
        self.call_as(method, path, &format!("Bearer {token}"), body)
            .await
    }

    /// A request with the whole `Authorization` value.
    async fn call_as(
        &self,
        method: &str,
        path: &str,
        authorization: &str,
        body: Option<Value>,
    ) -> Answer {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.fake.api_url()))
            .header("authorization", authorization)
            .header("user-agent", AGENT);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let req = req.body(Full::new(bytes)).unwrap_or_else(|e| panic!("{e}"));
        let resp = self
            .client
            .request(req)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        }
    }

    async fn jit(&self, token: &str, org: &str, name: &str) -> Answer {
        let body = json!({"name": name, "runner_group_id": 1, "labels": ["self-hosted"]});
        self.call(
            "POST",
            &format!("/orgs/{org}/actions/runners/generate-jitconfig"),
            token,
            Some(body),
        )
        .await
    }

    async fn list(&self, token: &str, org: &str) -> Answer {
        self.call("GET", &format!("/orgs/{org}/actions/runners"), token, None)
            .await
    }
}

/// GitHub's documented 80 content creations a minute hold by default: a burst of 80 JIT
/// registrations is served, the 81st is refused as GitHub refuses it (and the one after it
/// with the other status GitHub may use), reads and other installations go on, and the minute
/// on the fake's clock makes room again.
#[tokio::test]
async fn by_default_the_81st_creation_in_a_minute_is_refused_as_github_does() {
    let h = harness(SecondaryLimits::default()).await;
    for n in 0..80 {
        let a = h.jit(&h.acme, "acme", &format!("r{n}")).await;
        assert_eq!(a.status, 201, "registration {n}: {:?}", a.body);
    }
    let refused = h.jit(&h.acme, "acme", "r80").await;
    assert!(
        refused.is_secondary(),
        "{} {:?}",
        refused.status,
        refused.body
    );
    let retry_after = refused.retry_after().unwrap_or(0);
    assert!(
        (50..=60).contains(&retry_after),
        "retry-after {retry_after}: the first registration leaves the minute then"
    );
    let again = h.jit(&h.acme, "acme", "r80").await;
    assert!(again.is_secondary());
    assert_eq!(
        [refused.status, again.status],
        [403, 429],
        "403 and 429 in turn by default"
    );
    assert!(
        h.fake.runners().iter().all(|r| r.name != "r80"),
        "a refused registration created a runner"
    );
    assert_eq!(h.list(&h.acme, "acme").await.status, 200);
    assert_eq!(h.jit(&h.other, "other", "r0").await.status, 201);
    h.fake.advance_clock(Duration::from_secs(61));
    assert_eq!(h.jit(&h.acme, "acme", "r80").await.status, 201);
}

/// 900 points a minute to one endpoint: with the number lowered to 10, two deletions (5 points
/// each) fill the endpoint; the third is refused while reads of another endpoint are not.
#[tokio::test]
async fn points_per_endpoint_are_counted_with_writes_at_five() {
    let h = harness(SecondaryLimits {
        points_per_minute: 10,
        ..SecondaryLimits::default()
    })
    .await;
    h.fake.set_limit_status(LimitStatus::TooManyRequests);
    for id in [1, 2] {
        let a = h
            .call(
                "DELETE",
                &format!("/orgs/acme/actions/runners/{id}"),
                &h.acme,
                None,
            )
            .await;
        assert_eq!(a.status, 404, "an unknown runner, but counted");
    }
    let refused = h
        .call("DELETE", "/orgs/acme/actions/runners/3", &h.acme, None)
        .await;
    assert!(
        refused.is_secondary() && refused.status == 429,
        "{:?}",
        refused.body
    );
    for _ in 0..10 {
        assert_eq!(
            h.list(&h.acme, "acme").await.status,
            200,
            "reads cost 1 each"
        );
    }
    assert!(
        h.list(&h.acme, "acme").await.is_secondary(),
        "the 11th read"
    );
}

/// Requests in flight count per scope: with the number lowered to 1, a request that hangs holds
/// the installation's only slot, so the next is refused (retry-after given), while another
/// installation's request goes.
#[tokio::test]
async fn requests_in_flight_past_the_concurrency_limit_are_refused() {
    let h = harness(SecondaryLimits {
        concurrent: 1,
        ..SecondaryLimits::default()
    })
    .await;
    h.fake
        .inject_fault(Some("GET"), "/runner-groups", FaultAction::Hang, 1);
    let hung = {
        let req = http::Request::get(format!(
            "{}/orgs/acme/actions/runner-groups",
            h.fake.api_url()
        ))
        .header("authorization", format!("Bearer {}", h.acme))
        .header("user-agent", AGENT)
        .body(Full::new(Bytes::new()))
        .unwrap_or_else(|e| panic!("{e}"));
        let client = h.client.clone();
        tokio::spawn(async move { client.request(req).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !h
        .fake
        .requests()
        .iter()
        .any(|r| r.path.contains("runner-groups"))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hung request never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = h.list(&h.acme, "acme").await;
    assert!(
        refused.is_secondary(),
        "{} {:?}",
        refused.status,
        refused.body
    );
    assert!(refused.retry_after().is_some());
    assert_eq!(h.list(&h.other, "other").await.status, 200);
    hung.abort();
    // Once the hung request is given up, its slot is free again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = h.list(&h.acme, "acme").await;
        if a.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A limit armed for the middle of a burst: the first creations are served, the next trips it,
/// and from then on every request of that installation (reads too) gets it with a shrinking
/// `retry-after` until it lifts; another installation is not held.
#[tokio::test]
async fn an_armed_limit_falls_in_the_middle_of_a_burst_and_holds_that_installation() {
    let h = harness(SecondaryLimits::default()).await;
    h.fake
        .secondary_limit_after("generate-jitconfig", 2, Duration::from_secs(30), 429);
    assert_eq!(h.jit(&h.acme, "acme", "a").await.status, 201);
    assert_eq!(h.jit(&h.acme, "acme", "b").await.status, 201);
    let tripped = h.jit(&h.acme, "acme", "c").await;
    assert!(tripped.is_secondary() && tripped.status == 429);
    assert_eq!(tripped.retry_after(), Some(30));
    assert!(
        tripped
            .message()
            .contains(tripped.header("x-github-request-id").unwrap_or("?"))
    );
    h.fake.advance_clock(Duration::from_secs(20));
    let read = h.list(&h.acme, "acme").await;
    assert!(read.is_secondary());
    assert!(read.retry_after().is_some_and(|s| (9..=10).contains(&s)));
    assert_eq!(h.list(&h.other, "other").await.status, 200);
    h.fake.advance_clock(Duration::from_secs(10));
    assert_eq!(h.jit(&h.acme, "acme", "c").await.status, 201);
    let recorded: Vec<_> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.secondary_limited())
        .collect();
    assert_eq!(recorded.len(), 2);
    assert!(
        recorded
            .iter()
            .all(|r| r.response_header("retry-after").is_some())
    );
}

/// A spent primary quota is answered 403 and 429 in turn by default, each with GitHub's
/// `x-ratelimit-remaining: 0` and `x-ratelimit-reset`; a test can pin either.
#[tokio::test]
async fn a_spent_primary_quota_is_answered_403_or_429_with_the_reset() {
    let h = harness(SecondaryLimits::default()).await;
    h.fake.exhaust_rate_limit(Duration::from_secs(600));
    let now = crate::time::unix(std::time::SystemTime::now());
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let a = h.list(&h.acme, "acme").await;
        assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
        let reset: u64 = a
            .header("x-ratelimit-reset")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(
            (now + 590..=now + 610).contains(&reset),
            "reset {reset}, now {now}"
        );
        assert!(
            a.message().contains("API rate limit exceeded"),
            "{:?}",
            a.body
        );
        assert!(
            a.retry_after().is_none(),
            "a primary limit says when with the reset"
        );
        statuses.push(a.status);
    }
    assert_eq!(statuses, [403, 429]);
    h.fake.set_limit_status(LimitStatus::Forbidden);
    assert_eq!(h.list(&h.acme, "acme").await.status, 403);
    assert_eq!(h.list(&h.acme, "acme").await.status, 403);
}

/// GitHub refuses an API request without a `User-Agent` (403, plain text, before looking at the
/// credential); the same request with one is answered. Downloads from github.com are not the
/// API.
#[tokio::test]
async fn an_api_request_without_a_user_agent_is_refused() {
    let h = harness(SecondaryLimits::default()).await;
    let send = |user_agent: Option<&'static str>, path: String| {
        let mut req = http::Request::get(format!("{}{path}", h.fake.server_url()))
            .header("authorization", format!("Bearer {}", h.acme));
        if let Some(ua) = user_agent {
            req = req.header("user-agent", ua);
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .unwrap_or_else(|e| panic!("{e}"));
        let client = h.client.clone();
        async move {
            let resp = client.request(req).await.unwrap_or_else(|e| panic!("{e}"));
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let runners = "/orgs/acme/actions/runners".to_owned();
    let (status, body) = send(None, runners.clone()).await;
    assert_eq!(status, 403);
    assert!(
        body.starts_with("Request forbidden by administrative rules"),
        "{body}"
    );
    assert!(body.contains("User-Agent"));
    assert_eq!(
        send(Some("  "), runners.clone()).await.0,
        403,
        "an empty one"
    );
    assert_eq!(send(Some(AGENT), runners.clone()).await.0, 200);
    // The releases API is the API too.
    let release = "/repos/actions/runner/releases/tags/v2.330.0".to_owned();
    assert_eq!(send(None, release.clone()).await.0, 403);
    assert_eq!(
        send(Some(AGENT), release).await.0,
        404,
        "not published, but answered"
    );
    let refused: Vec<_> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.status == 403)
        .map(|r| r.path)
        .collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
}

/// Several Apps on the same organization: another App's installation registers runners on the
/// target the primary's does, each registration counted against the installation that asked
/// (its own secondary limits), and its token reaches no account the App is not installed on.
#[tokio::test]
async fn another_app_s_installation_registers_on_the_same_target_and_nowhere_else() {
    let h = harness(SecondaryLimits::default()).await;
    h.fake.add_app(2, String::new());
    let second = h.fake.install_app(2, "acme");
    let primary = h
        .fake
        .with(|s| s.installation_by_login("acme").map(|i| i.id));
    assert!(
        primary.is_some_and(|p| p != second),
        "installation ids are distinct across Apps"
    );
    let token = h.fake.with(|s| s.issue_token(second).0);

    let a = h.jit(&token, "acme", "through-the-second").await;
    assert_eq!(a.status, 201, "{:?}", a.body);
    let b = h.jit(&h.acme, "acme", "through-the-primary").await;
    assert_eq!(b.status, 201, "{:?}", b.body);
    let listed = h.list(&h.acme, "acme").await;
    let names: Vec<&str> = listed.body["runners"]
        .as_array()
        .map(|rs| rs.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names.len(),
        2,
        "both on acme, whoever registered: {names:?}"
    );
    assert_eq!(h.fake.creations(Some(second)).0, 1);

    let elsewhere = h.jit(&token, "other", "not-installed-there").await;
    assert_eq!(elsewhere.status, 403, "{:?}", elsewhere.body);
    let counts = h.fake.registrations_by_installation();
    assert_eq!(counts.get(&second), Some(&1));
    assert_eq!(primary.and_then(|p| counts.get(&p)), Some(&1));
}

/// The scale-set broker: RemoteAuth only with a registration token, the API version required,
/// the admin and queue tokens each only where they belong, one session per scale set.
#[tokio::test]
async fn the_broker_checks_its_credentials_and_api_version() {
    let h = harness(SecondaryLimits::default()).await;
    h.fake.set_poll_hold(Duration::from_millis(10));
    let reg = h
        .call(
            "POST",
            "/orgs/acme/actions/runners/registration-token",
            &h.acme,
            None,
        )
        .await;
    assert_eq!(reg.status, 201, "{:?}", reg.body);
    let reg = reg.body["token"].as_str().unwrap_or_default().to_owned();
    let body = json!({"url": "https://github.com/acme", "runner_event": "register"});
    let bearer = h
        .call(
            "POST",
            "/actions/runner-registration",
            &reg,
            Some(body.clone()),
        )
        .await;
    assert_eq!(bearer.status, 401, "RemoteAuth is required");
    let remote = h
        .call_as(
            "POST",
            "/actions/runner-registration",
            &format!("RemoteAuth {reg}"),
            Some(body),
        )
        .await;
    assert_eq!(remote.status, 201, "{:?}", remote.body);
    assert!(
        remote.body["url"]
            .as_str()
            .is_some_and(|u| u.ends_with("/rest/"))
    );
    let admin = remote.body["token"].as_str().unwrap_or_default().to_owned();
    assert_eq!(admin.split('.').count(), 3, "a JWT");

    let sets = "/rest/_apis/runtime/runnerscalesets";
    let set = json!({"name": "linux", "runnerGroupId": 1});
    let unversioned = h.call("POST", sets, &admin, Some(set.clone())).await;
    assert_eq!(unversioned.status, 400);
    let created = h
        .call(
            "POST",
            &format!("{sets}?api-version=6.0-preview"),
            &admin,
            Some(set),
        )
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let id = created.body["id"].as_u64().unwrap_or_default();
    let sessions = format!("{sets}/{id}/sessions?api-version=6.0-preview");
    let owner = json!({"sessionId": "00000000-0000-0000-0000-000000000000", "ownerName": "t"});
    let session = h.call("POST", &sessions, &admin, Some(owner.clone())).await;
    assert_eq!(session.status, 200, "{:?}", session.body);
    let second = h.call("POST", &sessions, &admin, Some(owner)).await;
    assert_eq!(second.status, 409);
    assert!(
        second.body["typeName"]
            .as_str()
            .is_some_and(|t| t.contains("RunnerScaleSetSessionConflictException"))
    );
    let queue_token = session.body["messageQueueAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let queue = session.body["messageQueueUrl"].as_str().unwrap_or_default();
    let queue_path = queue
        .strip_prefix(&h.fake.server_url())
        .unwrap_or_default()
        .to_owned();
    let poll = format!("{queue_path}&api-version=6.0-preview");
    assert_eq!(
        h.call("GET", &poll, &admin, None).await.status,
        401,
        "admin token on the queue"
    );
    assert_eq!(h.call("GET", &poll, &queue_token, None).await.status, 202);
    let get = format!("{sets}/{id}?api-version=6.0-preview");
    assert_eq!(
        h.call("GET", &get, &queue_token, None).await.status,
        401,
        "queue token as admin"
    );
    assert_eq!(h.call("GET", &get, &admin, None).await.status, 200);
}

/// An enterprise: its registration token only for its PAT (an installation token `403`, a
/// wrong PAT `401`), and that token opens only its own config URL (not an organization's, nor
/// another enterprise's), while an organization's token does not open it; its scale sets and
/// runners are served like an organization's, the runners in the enterprise's scope.
#[tokio::test]
async fn an_enterprise_takes_only_its_pat_and_its_token_opens_only_the_enterprise() {
    let h = harness(SecondaryLimits::default()).await;
    h.fake.set_enterprise_pat("octo", "ghp_enterprise");
    h.fake.set_enterprise_pat("other", "ghp_other");
    let path = "/enterprises/octo/actions/runners/registration-token";
    assert_eq!(
        h.call("POST", path, &h.acme, None).await.status,
        403,
        "an App"
    );
    assert_eq!(h.call("POST", path, "ghp_wrong", None).await.status, 401);
    assert_eq!(h.call("POST", path, "ghp_other", None).await.status, 401);
    let nowhere = "/enterprises/none/actions/runners/registration-token";
    assert_eq!(
        h.call("POST", nowhere, "ghp_enterprise", None).await.status,
        404
    );
    let reg = h.call("POST", path, "ghp_enterprise", None).await;
    assert_eq!(reg.status, 201, "{:?}", reg.body);
    let reg = reg.body["token"].as_str().unwrap_or_default().to_owned();
    for elsewhere in [
        "https://github.com/acme",
        "https://github.com/enterprises/other",
    ] {
        assert_eq!(h.exchange(elsewhere, &reg).await.status, 403, "{elsewhere}");
    }
    let enterprise = "https://github.com/enterprises/octo";
    let org_token = h
        .call(
            "POST",
            "/orgs/acme/actions/runners/registration-token",
            &h.acme,
            None,
        )
        .await;
    let org_token = org_token.body["token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(h.exchange(enterprise, &org_token).await.status, 403);
    let remote = h.exchange(enterprise, &reg).await;
    assert_eq!(remote.status, 201, "{:?}", remote.body);
    let admin = remote.body["token"].as_str().unwrap_or_default().to_owned();
    let v = "api-version=6.0-preview";
    let sets = "/rest/_apis/runtime/runnerscalesets";
    let created = h
        .call(
            "POST",
            &format!("{sets}?{v}"),
            &admin,
            Some(json!({"name": "ent", "runnerGroupId": 1})),
        )
        .await;
    assert_eq!(created.status, 200, "{:?}", created.body);
    let set = created.body["id"].as_u64().unwrap_or_default();
    let made = h
        .call(
            "POST",
            &format!("{sets}/{set}/generatejitconfig?{v}"),
            &admin,
            Some(json!({"name": "ent-1", "workFolder": "_work"})),
        )
        .await;
    assert_eq!(made.status, 200, "{:?}", made.body);
    let runners = h.fake.scale_set_runners(set);
    assert_eq!(runners.len(), 1);
    assert_eq!(
        runners[0].scope,
        crate::RunnerScope::Enterprise("octo".into())
    );
    // Not an organization's runner: `acme`'s REST list does not show it.
    let listed = h
        .call("GET", "/orgs/acme/actions/runners", &h.acme, None)
        .await;
    assert_eq!(listed.body["total_count"], 0, "{:?}", listed.body);
    // The PAT is never kept in the requests the fake records.
    assert!(
        !format!("{:?}", h.fake.requests()).contains("ghp_enterprise"),
        "the PAT was recorded"
    );
}

impl Harness {
    /// An admin token of the broker for `url` (registration token, then RemoteAuth).
    async fn admin_token(&self, url: &str) -> String {
        let remote = self.remote_auth(url).await;
        assert_eq!(remote.status, 201, "{:?}", remote.body);
        remote.body["token"].as_str().unwrap_or_default().to_owned()
    }

    /// The RemoteAuth exchange for `url` with a fresh registration token of `acme`.
    async fn remote_auth(&self, url: &str) -> Answer {
        let reg = self
            .call(
                "POST",
                "/orgs/acme/actions/runners/registration-token",
                &self.acme,
                None,
            )
            .await;
        let reg = reg.body["token"].as_str().unwrap_or_default().to_owned();
        self.exchange(url, &reg).await
    }

    /// The RemoteAuth exchange for `url` with the registration token `reg`.
    async fn exchange(&self, url: &str, reg: &str) -> Answer {
        self.call_as(
            "POST",
            "/actions/runner-registration",
            &format!("RemoteAuth {reg}"),
            Some(json!({"url": url, "runner_event": "register"})),
        )
        .await
    }
}

/// A scale-set runner from `generatejitconfig` is a runner of the fake: listed by its
/// organization's REST runner list, found and got through the service's runner endpoints
/// (`runnerScaleSetId` its set), speaking the runner protocol with its `encodedJITConfig`;
/// busy, its removal is `JobStillRunningException` (400, or the status a test sets); idle,
/// `204`, and `204` again once it is gone. A repository the fake does not have is no target.
#[tokio::test]
async fn a_scale_set_runner_is_a_runner_of_its_target_and_is_removed_through_the_service() {
    let h = harness(SecondaryLimits::default()).await;
    let nowhere = h.remote_auth("https://github.com/acme/nowhere").await;
    assert_eq!(nowhere.status, 404, "no such repository");
    let admin = h.admin_token("https://github.com/acme").await;
    let v = "api-version=6.0-preview";
    let sets = "/rest/_apis/runtime/runnerscalesets";
    let created = h
        .call(
            "POST",
            &format!("{sets}?{v}"),
            &admin,
            Some(json!({"name": "linux", "runnerGroupId": 1})),
        )
        .await;
    let set = created.body["id"].as_u64().unwrap_or_default();
    let jit = format!("{sets}/{set}/generatejitconfig?{v}");
    let body = json!({"name": "ss-1", "workFolder": "_work"});
    let made = h.call("POST", &jit, &admin, Some(body.clone())).await;
    assert_eq!(made.status, 200, "{:?}", made.body);
    assert_eq!(made.body["runner"]["runnerScaleSetId"], json!(set));
    let runner_id = made.body["runner"]["id"].as_u64().unwrap_or_default();
    let config = crate::FakeJitConfig::decode(made.body["encodedJITConfig"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the fake runner's config: {e}"));
    assert_eq!(
        (config.runner_id, config.runner_name.as_str()),
        (runner_id, "ss-1")
    );
    let again = h.call("POST", &jit, &admin, Some(body)).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.body["typeName"], "AgentExistsException");

    let listed = h
        .call("GET", "/orgs/acme/actions/runners", &h.acme, None)
        .await;
    assert_eq!(
        listed.body["runners"][0]["name"], "ss-1",
        "{:?}",
        listed.body
    );
    let agents = "/rest/_apis/distributedtask/pools/0/agents";
    let found = h
        .call("GET", &format!("{agents}?agentName=ss-1&{v}"), &admin, None)
        .await;
    assert_eq!(found.body["count"], 1, "{:?}", found.body);
    assert_eq!(found.body["value"][0]["runnerScaleSetId"], json!(set));
    let none = h
        .call("GET", &format!("{agents}?agentName=ss-2&{v}"), &admin, None)
        .await;
    assert_eq!(none.body["count"], 0);
    let one = format!("{agents}/{runner_id}?{v}");
    let got = h.call("GET", &one, &admin, None).await;
    assert_eq!((got.status, &got.body["name"]), (200, &json!("ss-1")));
    assert_eq!(h.call("GET", &one, &h.acme, None).await.status, 401);
    assert_eq!(
        h.call("GET", &format!("{agents}/{runner_id}"), &admin, None)
            .await
            .status,
        400,
        "api-version"
    );

    let session = crate::runner_client::RunnerSession::new(config);
    session.register().await.unwrap_or_else(|e| panic!("{e}"));
    let request = h.fake.queue_scale_set_job(set, "build").unwrap_or_default();
    let job = session.acquire().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(job.as_ref().map(|j| j.job_id), Some(request));
    let busy = h.call("DELETE", &one, &admin, None).await;
    assert_eq!(busy.status, 400);
    assert!(
        busy.body["typeName"]
            .as_str()
            .is_some_and(|t| t.ends_with("JobStillRunningException"))
    );
    h.fake.set_job_still_running_status(409);
    assert_eq!(h.call("DELETE", &one, &admin, None).await.status, 409);
    h.fake
        .set_ephemeral_lag(Duration::ZERO, Duration::from_secs(30));
    session
        .complete(request, "success")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Idle, and a removal refused once as if the service handed it a job at that instant.
    h.fake.refuse_next_removals(1);
    assert_eq!(h.call("DELETE", &one, &admin, None).await.status, 409);
    assert_eq!(h.call("DELETE", &one, &admin, None).await.status, 204);
    assert_eq!(
        h.call("DELETE", &one, &admin, None).await.status,
        204,
        "gone"
    );
    let gone = h.call("GET", &one, &admin, None).await;
    assert_eq!(
        (gone.status, &gone.body["typeName"]),
        (404, &json!("AgentNotFoundException"))
    );
    assert!(h.fake.scale_set_runners(set).is_empty());
}
