//! A stand-in for GitHub's results service (`results-receiver.actions.githubusercontent.com`:
//! cache v2 and artifacts, Twirp JSON over POST). GitHub's service is a host of its own whose
//! Twirp services sit at its root (`/twirp/github.actions.results.api.v1.*`), and
//! `@actions/cache` keeps only the origin of `ACTIONS_RESULTS_URL` (`new URL('/twirp/...',
//! base)`), so the stand-in owns [`TWIRP_PREFIX`] at the fake's server root (the REST API has
//! no such path), and the results URL a job message names is the server root
//! ([`results_url`]). A job whose cache calls were not redirected to a runner manager's local
//! cache sends them here, and the fake records each one ([`crate::RequestKind::Results`]): a
//! test can say "GitHub saw no cache request at all".
//!
//! It serves nothing of the cache: every call is answered `404` (Twirp's `bad_route`), which
//! `@actions/cache` takes as a miss or a failed save and goes on without. One artifact call,
//! [`CREATE_ARTIFACT`], is answered `200` as GitHub does, so a test can show that a call the
//! local service does not serve still reaches "GitHub", its `Authorization` unchanged (the
//! record keeps a fingerprint of it, [`AUTHORIZATION_FINGERPRINT`], never the credential).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::RequestRecord;
use crate::releases::Raw;
use crate::state::State;

/// The results service's Twirp calls, at the fake's server root (not below the API base path:
/// the results service is a host of its own).
pub const TWIRP_PREFIX: &str = "/twirp/";

/// Where the stand-in's "signed" upload URLs point (nothing is stored there).
pub const UPLOAD_PREFIX: &str = "/_fake/results/upload/";

/// The artifact call answered `200`.
pub const CREATE_ARTIFACT: &str =
    "/twirp/github.actions.results.api.v1.ArtifactService/CreateArtifact";

/// The header a results request's record carries in place of its credential: the SHA-256 (hex)
/// of the whole `Authorization` value ([`fingerprint`]).
pub const AUTHORIZATION_FINGERPRINT: &str = "x-fake-authorization-sha256";

/// The results service's URL on a fake whose server root is `server_url`: the root, as
/// GitHub's `ACTIONS_RESULTS_URL` is its host's.
pub fn results_url(server_url: &str) -> String {
    format!("{}/", server_url.trim_end_matches('/'))
}

/// Whether a request to `path` (at the server root) is the results service's.
pub fn owns(path: &str) -> bool {
    path.starts_with(TWIRP_PREFIX) || path.starts_with(UPLOAD_PREFIX)
}

/// What a record keeps of an `Authorization` value: its SHA-256, hex.
pub fn fingerprint(authorization: &str) -> String {
    hex::encode(Sha256::digest(authorization.as_bytes()))
}

/// An `ACTIONS_RUNTIME_TOKEN` for a job of `repository` on `git_ref`, shaped as GitHub's (a JWT
/// whose `ac` claim lists the cache scopes the job may use, `Permission` 3 read and write on its
/// own ref, 1 read on the others), with a `repository` claim naming the job's repository. The
/// signature is random bytes: nothing checks it, and what it claims is the job's to forge.
pub fn runtime_token(repository: &str, git_ref: &str) -> String {
    let header = json!({"typ": "JWT", "alg": "RS256", "x5t": "fake"});
    let scopes = json!([{"Scope": git_ref, "Permission": 3}]).to_string();
    let claims = json!({
        "nameid": "dddddddd-dddd-dddd-dddd-dddddddddddd",
        "scp": "Actions.GenericRead:00000000-0000-0000-0000-000000000000 Actions.Results:fake:fake",
        "ac": scopes,
        "repository": repository,
        "iss": "vstoken.actions.githubusercontent.com",
        "aud": "vstoken.actions.githubusercontent.com",
    });
    let part = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let signature = URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
    format!("{}.{}.{signature}", part(&header), part(&claims))
}

/// The claims of a token shaped as [`runtime_token`]'s, if it is one.
pub fn token_claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

/// Answers (and records) a request to the stand-in; `None` for any other path.
pub fn answer(
    state: &mut State,
    method: &str,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Raw> {
    if !owns(path) {
        return None;
    }
    let (status, answer) = if method == "POST" && path == CREATE_ARTIFACT {
        let upload = format!(
            "{}{UPLOAD_PREFIX}{}",
            state.server_url.trim_end_matches('/'),
            uuid::Uuid::new_v4().simple()
        );
        (200, json!({"ok": true, "signed_upload_url": upload}))
    } else {
        // Twirp's answer to a method it does not serve.
        (
            404,
            json!({"code": "bad_route", "msg": format!("no handler for path \"{path}\"")}),
        )
    };
    let mut recorded = crate::server::redacted(headers);
    if let Some(auth) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        recorded.push((AUTHORIZATION_FINGERPRINT.into(), fingerprint(auth)));
    }
    state.requests.push(RequestRecord {
        method: method.to_owned(),
        path: path.to_owned(),
        query: query.to_owned(),
        status,
        headers: recorded,
        body: serde_json::from_slice(body).ok(),
        response_body: Some(answer.clone()),
        response_headers: Vec::new(),
        caller: None,
        at: state.now(),
    });
    Some(Raw {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from(answer.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_token_is_jwt_shaped_and_names_its_repository_and_ref() {
        let token = runtime_token("acme/widgets", "refs/heads/main");
        assert_eq!(token.split('.').count(), 3);
        let claims = token_claims(&token).unwrap_or_default();
        assert_eq!(claims["repository"], "acme/widgets");
        let scopes: Value =
            serde_json::from_str(claims["ac"].as_str().unwrap_or("")).unwrap_or_default();
        assert_eq!(scopes[0]["Scope"], "refs/heads/main");
        assert_ne!(token, runtime_token("acme/widgets", "refs/heads/main"));
        assert_eq!(token_claims("not.a-token"), None);
    }

    fn state() -> State {
        State::new(1, String::new(), "http://127.0.0.1:9".into(), String::new())
    }

    fn post(state: &mut State, call: &str, auth: Option<&str>) -> Raw {
        let mut headers = HeaderMap::new();
        if let Some(auth) = auth {
            headers.insert(
                http::header::AUTHORIZATION,
                auth.parse().unwrap_or_else(|_| unreachable!()),
            );
        }
        let path = call;
        answer(
            state,
            "POST",
            path,
            "",
            &headers,
            &Bytes::from_static(b"{}"),
        )
        .unwrap_or_else(|| unreachable!("{path} is the stand-in's"))
    }

    #[test]
    fn every_call_is_recorded_and_only_create_artifact_is_served() {
        let mut s = state();
        let cache = "/twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL";
        assert_eq!(post(&mut s, cache, Some("Bearer a.b.c")).status, 404);
        let created = post(&mut s, CREATE_ARTIFACT, Some("Bearer a.b.c"));
        assert_eq!(created.status, 200);
        let body: Value = serde_json::from_slice(&created.body).unwrap_or_default();
        assert_eq!(body["ok"], true);
        assert!(body["signed_upload_url"].is_string());
        assert_eq!(post(&mut s, "/twirp/anything/else", None).status, 404);
        let kinds: Vec<crate::RequestKind> = s.requests.iter().map(RequestRecord::kind).collect();
        assert_eq!(kinds, [crate::RequestKind::Results; 3]);
        // The credential is not kept; its fingerprint is.
        let first = &s.requests[0];
        assert_eq!(first.header("authorization"), Some("Bearer <redacted>"));
        assert_eq!(
            first.header(AUTHORIZATION_FINGERPRINT),
            Some(fingerprint("Bearer a.b.c").as_str())
        );
        assert_eq!(s.requests[2].header(AUTHORIZATION_FINGERPRINT), None);
        // Another path is not the stand-in's.
        let other = answer(
            &mut s,
            "POST",
            "/repos/a/b",
            "",
            &HeaderMap::new(),
            &Bytes::new(),
        );
        assert!(other.is_none());
    }

    #[test]
    fn a_job_says_who_it_is_in_its_run_its_webhook_and_its_job_message() {
        use crate::model::{JobOrigin, Runner, RunnerScope};
        let mut s = state();
        s.ensure_installation("acme", "Organization");
        let repo = s.add_repo("acme", "widgets", "Organization");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let origin = JobOrigin {
            head_branch: "feature".into(),
            event: "pull_request".into(),
            default_branch: Some("trunk".into()),
            uses: vec![format!("actions/cache@{sha}")],
            ..JobOrigin::default()
        };
        let labels = vec!["self-hosted".to_owned()];
        let job_id = s
            .queue_job_as(repo, "build", &labels, &origin)
            .unwrap_or_else(|| unreachable!());
        let run_id = s.jobs[&job_id].run_id;
        let run = crate::routes::Route::parse(
            "GET",
            &format!("/repos/acme/widgets/actions/runs/{run_id}"),
        )
        .unwrap_or_else(|| unreachable!());
        let answer = crate::routes::answer(&mut s, crate::auth::Caller::App, &run, "", None);
        assert_eq!(answer.status, 200);
        let body = answer.body.unwrap_or_default();
        assert_eq!(body["event"], "pull_request");
        assert_eq!(body["head_branch"], "feature");
        assert_eq!(body["head_repository"]["full_name"], "acme/widgets");
        assert_eq!(body["repository"]["default_branch"], "trunk");
        let number = body["pull_requests"][0]["number"].as_u64().unwrap_or(0);
        assert!(number > 0, "{body}");
        // The queued webhook says the same.
        let payload: Value = serde_json::from_slice(&s.deliveries[0].body).unwrap_or_default();
        assert_eq!(payload["workflow_job"]["head_branch"], "feature");
        assert_eq!(payload["repository"]["default_branch"], "trunk");
        // Another repository's run is not found through this one.
        let elsewhere = crate::routes::Route::parse(
            "GET",
            &format!("/repos/acme/gadgets/actions/runs/{run_id}"),
        )
        .unwrap_or_else(|| unreachable!());
        let missing = crate::routes::answer(&mut s, crate::auth::Caller::App, &elsewhere, "", None);
        assert_eq!(missing.status, 404);
        // The runner that takes it is told its ref, results service, token and actions.
        let runner = s.next_id();
        s.runners.insert(
            runner,
            Runner {
                id: runner,
                name: "r".into(),
                scope: RunnerScope::Org("acme".into()),
                labels: labels.clone(),
                group_id: 1,
                online: true,
                busy: false,
                job_done_at: None,
                abandoned: false,
                token: "t".into(),
                behavior: None,
                scale_set_id: None,
            },
        );
        let assigned = s.assign(runner).unwrap_or_default();
        assert_eq!(assigned.job_id, job_id);
        assert_eq!(assigned.git_ref, format!("refs/pull/{number}/merge"));
        assert_eq!(assigned.event, "pull_request");
        assert_eq!(assigned.results_url, "http://127.0.0.1:9/");
        assert_eq!(assigned.uses, [format!("actions/cache@{sha}")]);
        assert!(s.tokens.contains_key(&assigned.github_token));
        let claims = token_claims(&assigned.runtime_token).unwrap_or_default();
        assert_eq!(claims["repository"], "acme/widgets");
    }

    #[test]
    fn a_push_job_runs_for_its_branch_and_a_job_without_actions_gets_no_token() {
        use crate::model::{Runner, RunnerScope};
        let mut s = state();
        let repo = s.add_repo("acme", "widgets", "Organization");
        let labels = vec!["x".to_owned()];
        s.queue_job(repo, "plain", &labels);
        let runner = s.next_id();
        s.runners.insert(
            runner,
            Runner {
                id: runner,
                name: "r".into(),
                scope: RunnerScope::Repo(repo),
                labels,
                group_id: 1,
                online: true,
                busy: false,
                job_done_at: None,
                abandoned: false,
                token: "t".into(),
                behavior: None,
                scale_set_id: None,
            },
        );
        let assigned = s.assign(runner).unwrap_or_default();
        assert_eq!(assigned.git_ref, "refs/heads/main");
        assert_eq!(assigned.event, "push");
        assert!(assigned.github_token.is_empty());
        assert!(s.tokens.is_empty());
    }

    #[test]
    fn the_results_url_ends_with_a_slash_as_the_runner_gives_it() {
        assert_eq!(results_url("http://127.0.0.1:7/"), "http://127.0.0.1:7/");
        assert_eq!(results_url("http://127.0.0.1:7"), "http://127.0.0.1:7/");
        assert!(owns(CREATE_ARTIFACT) && owns("/_fake/results/upload/x"));
        assert!(!owns("/repos/a/b/actions/runs") && !owns("/_fake/runner/register"));
    }
}
