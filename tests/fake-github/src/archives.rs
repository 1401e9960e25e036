//! Action repositories on the fake, as the host's action archives fetch them: a test publishes
//! `owner/repo` with refs (branches, tags) naming commits, each commit with a real `.tar.gz`
//! laid out as GitHub's (one top folder `{owner}-{repo}-{sha7}/`, a `pax_global_header` with
//! the commit id first), public or private.
//!
//! The fake answers, as GitHub does:
//! - `GET /repos/{owner}/{repo}/commits/{ref}`: the commit; with `Accept:
//!   application/vnd.github.sha` its SHA alone as text; `ETag` and `304` on `If-None-Match`;
//!   `404` for an unknown repository, `422` for a ref that names no commit.
//! - `GET /repos/{owner}/{repo}/tarball/{ref}`: `302` to codeload (here
//!   [`CODELOAD_PREFIX`] on the server root) with, for a private repository, a short-lived
//!   `token` in the query.
//! - `GET {CODELOAD_PREFIX}{owner}/{repo}/legacy.tar.gz/{sha}`: the bytes (no credential;
//!   a private repository's URL needs its `token`).
//!
//! Who may call: a private repository's commits and tarball need an installation token whose
//! installation covers the repository (its owner's, see [`State::covers`]) and has `contents`
//! read, else `404` (as GitHub hides what a token cannot see); a public repository's are open
//! to any valid installation token, and to none. Each API call spends the caller's `core` quota
//! and answers with the rate-limit headers; a spent quota is `403`. Injected `Status` faults
//! apply (by path) as to every other endpoint.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::model::RequestRecord;
use crate::releases::Raw;
use crate::state::{FaultAction, State};

/// Where the fake's codeload serves archives, below the server root (github.com redirects to
/// `https://codeload.github.com/{owner}/{repo}/legacy.tar.gz/{ref}`).
pub const CODELOAD_PREFIX: &str = "/_codeload/";
/// The media type of a commit's bare SHA.
pub const SHA_MEDIA_TYPE: &str = "application/vnd.github.sha";

/// One published action repository.
#[derive(Debug, Clone, Default)]
pub struct ActionRepo {
    pub public: bool,
    /// Ref (branch or tag name) → commit SHA.
    pub refs: BTreeMap<String, String>,
    /// Commit SHA → the tarball GitHub serves for it.
    pub tarballs: BTreeMap<String, Bytes>,
}

/// Every action repository by `owner/repo`, and the answers a test asked to spoil.
#[derive(Debug, Clone, Default)]
pub struct Archives {
    pub repos: BTreeMap<String, ActionRepo>,
    /// How many codeload downloads still answer an HTML error page with `200` (as a captive
    /// portal or a broken proxy would), instead of the archive.
    pub html_downloads: usize,
    /// Codeload downloads served so far.
    pub downloads: u64,
}

/// A `.tar.gz` as GitHub makes a commit's: a `pax_global_header` carrying the commit id, then
/// every file under `{owner}-{repo}-{sha7}/`.
pub fn tarball(owner: &str, repo: &str, sha: &str, files: &[(&str, &[u8])]) -> Vec<u8> {
    let top = format!("{owner}-{repo}-{}", &sha[..sha.len().min(7)]);
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    let comment = format!("52 comment={sha}\n");
    let mut global = tar::Header::new_ustar();
    global.set_entry_type(tar::EntryType::XGlobalHeader);
    global.set_size(comment.len() as u64);
    global.set_mode(0o666);
    append(
        &mut builder,
        &mut global,
        "pax_global_header",
        comment.as_bytes(),
    );
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o775);
    dir.set_size(0);
    append(&mut builder, &mut dir, &format!("{top}/"), &[]);
    for (path, bytes) in files {
        let mut file = tar::Header::new_gnu();
        file.set_size(bytes.len() as u64);
        file.set_mode(0o664);
        append(&mut builder, &mut file, &format!("{top}/{path}"), bytes);
    }
    builder
        .into_inner()
        .and_then(|gz| gz.finish())
        .unwrap_or_default()
}

fn append(
    builder: &mut tar::Builder<flate2::write::GzEncoder<Vec<u8>>>,
    header: &mut tar::Header,
    path: &str,
    bytes: &[u8],
) {
    // Writing into memory cannot fail but for a path tar cannot hold, which the tests choose.
    let _ = builder.append_data(header, path, bytes);
}

impl crate::FakeGithub {
    /// Publishes (or updates) action repository `full_name` ("owner/repo"): `refs` name
    /// commits, each commit gets a tarball with `files`. A private one is readable by the
    /// installation covering its owner, so it is also added as a repository of the fake.
    pub fn publish_action(
        &self,
        full_name: &str,
        public: bool,
        refs: &[(&str, &str)],
        files: &[(&str, &[u8])],
    ) {
        let (owner, name) = full_name.split_once('/').unwrap_or((full_name, ""));
        if !public {
            self.add_repo(full_name);
        }
        self.with(|s| {
            let repo = s.archives.repos.entry(full_name.to_owned()).or_default();
            repo.public = public;
            for (reference, sha) in refs {
                repo.refs.insert((*reference).to_owned(), (*sha).to_owned());
                repo.tarballs
                    .entry((*sha).to_owned())
                    .or_insert_with(|| Bytes::from(tarball(owner, name, sha, files)));
            }
        });
    }

    /// Moves `reference` of action repository `full_name` to commit `sha` (a new tarball with
    /// `files` when the commit is new), as a pushed tag or branch does.
    pub fn move_action_ref(
        &self,
        full_name: &str,
        reference: &str,
        sha: &str,
        files: &[(&str, &[u8])],
    ) {
        let (owner, name) = full_name.split_once('/').unwrap_or((full_name, ""));
        self.with(|s| {
            if let Some(repo) = s.archives.repos.get_mut(full_name) {
                repo.refs.insert(reference.to_owned(), sha.to_owned());
                repo.tarballs
                    .entry(sha.to_owned())
                    .or_insert_with(|| Bytes::from(tarball(owner, name, sha, files)));
            }
        });
    }

    /// The next `count` codeload downloads answer `200` with an HTML page instead of the
    /// archive.
    pub fn serve_html_downloads(&self, count: usize) {
        self.with(|s| s.archives.html_downloads = count);
    }

    /// Codeload downloads served so far.
    pub fn action_downloads(&self) -> u64 {
        self.with(|s| s.archives.downloads)
    }
}

/// What a request is, by its path from the server root.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Request {
    Commit { repo: String, reference: String },
    Tarball { repo: String, reference: String },
    Codeload { repo: String, sha: String },
}

fn parse(state: &State, method: &str, path: &str) -> Option<Request> {
    if method != "GET" {
        return None;
    }
    if let Some(rest) = path.strip_prefix(CODELOAD_PREFIX) {
        let segs: Vec<&str> = rest.split('/').collect();
        return match segs.as_slice() {
            [o, r, "legacy.tar.gz", sha] => Some(Request::Codeload {
                repo: format!("{o}/{r}"),
                sha: (*sha).to_owned(),
            }),
            _ => None,
        };
    }
    let rel = path
        .strip_prefix(state.base_path.as_str())
        .filter(|r| r.starts_with('/'))?;
    let segs: Vec<&str> = rel.trim_start_matches('/').split('/').collect();
    match segs.as_slice() {
        ["repos", o, r, kind @ ("commits" | "tarball"), rest @ ..] if !rest.is_empty() => {
            let repo = format!("{o}/{r}");
            let reference = rest.join("/");
            Some(if *kind == "commits" {
                Request::Commit { repo, reference }
            } else {
                Request::Tarball { repo, reference }
            })
        }
        _ => None,
    }
}

/// The answer to an action-archive request (`path` from the server root), recorded in the
/// request log; `None` when the request is not one (or names no action repository: the REST
/// routes answer it).
pub fn answer(
    state: &mut State,
    method: &str,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Option<Raw> {
    let request = parse(state, method, path)?;
    let repo_name = match &request {
        Request::Commit { repo, .. }
        | Request::Tarball { repo, .. }
        | Request::Codeload { repo, .. } => repo.clone(),
    };
    if !state.archives.repos.contains_key(&repo_name) {
        return None;
    }
    let rel = path
        .strip_prefix(state.base_path.as_str())
        .filter(|_| !matches!(request, Request::Codeload { .. }))
        .unwrap_or(path)
        .to_owned();
    let (raw, caller) = match &request {
        Request::Codeload { repo, sha } => (codeload(state, repo, sha, query), None),
        _ => api(state, method, &rel, &request, headers),
    };
    state.requests.push(RequestRecord {
        method: method.to_owned(),
        path: rel,
        query: query.to_owned(),
        status: raw.status,
        headers: crate::server::redacted(headers),
        body: None,
        response_body: None,
        response_headers: raw.headers.clone(),
        caller,
        at: state.now(),
    });
    Some(raw)
}

fn error(status: u16, message: &str) -> Raw {
    Raw {
        status,
        headers: vec![(
            "content-type".into(),
            "application/json; charset=utf-8".into(),
        )],
        body: Bytes::from(
            serde_json::to_vec(&json!({
                "message": message,
                "documentation_url": "https://docs.github.com/rest",
                "status": status.to_string(),
            }))
            .unwrap_or_default(),
        ),
    }
}

/// The commits and tarball endpoints: credential, fault, quota, then the answer.
fn api(
    state: &mut State,
    method: &str,
    rel: &str,
    request: &Request,
    headers: &HeaderMap,
) -> (Raw, Option<crate::auth::Caller>) {
    let now = state.now();
    let credential = crate::auth::bearer(
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    let installation = match credential.map(|c| state.tokens.get(c).copied()) {
        None => None,
        Some(Some((inst, expires))) if expires > now => Some(inst),
        Some(_) => return (error(401, "Bad credentials"), None),
    };
    let caller = installation.map(crate::auth::Caller::Installation);
    if let Some(fault) = state.faults.iter_mut().find(|f| {
        f.times > 0
            && f.method.as_deref().is_none_or(|m| m == method)
            && rel.contains(&f.path_contains)
    }) && let FaultAction::Status(status) = fault.action
    {
        fault.times -= 1;
        return (error(status, "Server Error"), caller);
    }
    let (Request::Commit { repo, reference } | Request::Tarball { repo, reference }) = request
    else {
        return (error(404, "Not Found"), caller);
    };
    if !may_read(state, installation, repo) {
        return (error(404, "Not Found"), caller);
    }
    // Unauthenticated requests spend the address's own (small) quota; the fake keeps one for
    // them under "anonymous".
    let scope = installation.map_or_else(|| "anonymous".to_owned(), |i| i.to_string());
    let quota = *state.quota(&scope, "core");
    if quota.remaining == 0 {
        let mut raw = error(403, "API rate limit exceeded.");
        raw.headers.extend(limits(quota.limit, 0, quota.reset));
        return (raw, caller);
    }
    state.quota(&scope, "core").remaining -= 1;
    let limit_headers = limits(quota.limit, quota.remaining - 1, quota.reset);
    let Some(action) = state.archives.repos.get(repo) else {
        return (error(404, "Not Found"), caller);
    };
    let sha = action.refs.get(reference).cloned().or_else(|| {
        action
            .tarballs
            .contains_key(reference)
            .then(|| reference.clone())
    });
    let mut raw = match (request, sha) {
        (Request::Commit { .. }, None) => {
            error(422, &format!("No commit found for SHA: {reference}"))
        }
        (_, None) => error(404, "Not Found"),
        (Request::Commit { .. }, Some(sha)) => commit(state, repo, &sha, headers),
        (_, Some(sha)) => {
            let mut location = format!(
                "{}{CODELOAD_PREFIX}{repo}/legacy.tar.gz/{sha}",
                state.server_url
            );
            if !action.public {
                location.push_str(&format!("?token={}", codeload_token(repo, &sha)));
            }
            Raw {
                status: 302,
                headers: vec![("location".into(), location)],
                body: Bytes::new(),
            }
        }
    };
    raw.headers.extend(limit_headers);
    (raw, caller)
}

/// Whether `installation` (`None`: no credential) may read action repository `repo`.
fn may_read(state: &State, installation: Option<u64>, repo: &str) -> bool {
    if state.archives.repos.get(repo).is_some_and(|r| r.public) {
        return true;
    }
    let Some(inst) = installation.and_then(|i| state.installations.get(&i)) else {
        return false;
    };
    let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
    let covered = state
        .repo_by_name(owner, name)
        .is_some_and(|r| state.covers(inst, r));
    let granted = inst.permissions.get("contents").map(String::as_str);
    covered && matches!(granted, Some("read" | "write"))
}

/// A commit's answer: the bare SHA when asked for it, else a (much reduced) commit object;
/// `304` when `If-None-Match` names its ETag.
fn commit(state: &State, repo: &str, sha: &str, headers: &HeaderMap) -> Raw {
    let wants_sha = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(SHA_MEDIA_TYPE));
    let (content_type, body) = if wants_sha {
        (
            "application/vnd.github.sha; charset=utf-8",
            Bytes::from(sha.to_owned()),
        )
    } else {
        let value = json!({
            "sha": sha,
            "url": format!("{}/repos/{repo}/commits/{sha}", state.api_url),
            "html_url": format!("{}/{repo}/commit/{sha}", state.server_url),
        });
        (
            "application/json; charset=utf-8",
            Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
        )
    };
    let etag = format!(
        "\"{}\"",
        &hex::encode(Sha256::digest([content_type.as_bytes(), &body].concat()))[..32]
    );
    let matches = headers
        .get(http::header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    if matches {
        return Raw {
            status: 304,
            headers: vec![("etag".into(), etag)],
            body: Bytes::new(),
        };
    }
    Raw {
        status: 200,
        headers: vec![
            ("content-type".into(), content_type.into()),
            ("etag".into(), etag),
        ],
        body,
    }
}

fn limits(limit: u64, remaining: u64, reset: std::time::SystemTime) -> Vec<(String, String)> {
    vec![
        ("x-ratelimit-limit".into(), limit.to_string()),
        ("x-ratelimit-remaining".into(), remaining.to_string()),
        (
            "x-ratelimit-used".into(),
            (limit - remaining.min(limit)).to_string(),
        ),
        (
            "x-ratelimit-reset".into(),
            crate::time::unix(reset).to_string(),
        ),
        ("x-ratelimit-resource".into(), "core".into()),
    ]
}

/// The token a private repository's codeload URL carries (GitHub's expires after five minutes;
/// the fake's is fixed per commit).
fn codeload_token(repo: &str, sha: &str) -> String {
    hex::encode(&Sha256::digest(format!("codeload/{repo}/{sha}"))[..10])
}

/// The archive bytes: a public repository's to anyone, a private one's with its URL's token.
fn codeload(state: &mut State, repo: &str, sha: &str, query: &str) -> Raw {
    let Some(action) = state.archives.repos.get(repo) else {
        return error(404, "Not Found");
    };
    let signed = query
        .split('&')
        .any(|kv| kv == format!("token={}", codeload_token(repo, sha)));
    if !action.public && !signed {
        return error(404, "Not Found");
    }
    let Some(bytes) = action.tarballs.get(sha).cloned() else {
        return error(404, "Not Found");
    };
    state.archives.downloads += 1;
    if state.archives.html_downloads > 0 {
        state.archives.html_downloads -= 1;
        return Raw {
            status: 200,
            headers: vec![("content-type".into(), "text/html; charset=utf-8".into())],
            body: Bytes::from_static(
                b"<!DOCTYPE html><html><body>Sign in to continue</body></html>",
            ),
        };
    }
    let name = format!(
        "{}-{}.tar.gz",
        repo.replace('/', "-"),
        &sha[..sha.len().min(7)]
    );
    Raw {
        status: 200,
        headers: vec![
            ("content-type".into(), "application/x-gzip".into()),
            (
                "content-disposition".into(),
                format!("attachment; filename={name}"),
            ),
        ],
        body: bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    const SHA: &str = "11bd71901bbe5b1630ceea73d27597364c9af683";

    fn state() -> State {
        let mut state = State::new(1, String::new(), "http://127.0.0.1:9".into(), String::new());
        let mut repo = ActionRepo {
            public: true,
            ..ActionRepo::default()
        };
        repo.refs.insert("v4".into(), SHA.into());
        repo.tarballs.insert(
            SHA.into(),
            Bytes::from(tarball(
                "actions",
                "checkout",
                SHA,
                &[("action.yml", b"name: x\n")],
            )),
        );
        state.archives.repos.insert("actions/checkout".into(), repo);
        state
    }

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::ACCEPT, value.parse().unwrap());
        headers
    }

    #[test]
    fn a_tarball_has_github_s_layout() {
        let bytes = tarball("actions", "checkout", SHA, &[("action.yml", b"name: x\n")]);
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        let mut names = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut text = String::new();
            let _ = entry.read_to_string(&mut text);
            names.push((
                entry.header().entry_type(),
                entry.path().unwrap().display().to_string(),
                text,
            ));
        }
        assert_eq!(names[0].0, tar::EntryType::XGlobalHeader);
        assert_eq!(names[1].1, "actions-checkout-11bd719/");
        assert_eq!(names[2].1, "actions-checkout-11bd719/action.yml");
        assert_eq!(names[2].2, "name: x\n");
    }

    #[test]
    fn a_public_ref_resolves_without_a_credential_and_answers_304_when_unchanged() {
        let mut state = state();
        let headers = accept(SHA_MEDIA_TYPE);
        let raw = answer(
            &mut state,
            "GET",
            "/repos/actions/checkout/commits/v4",
            "",
            &headers,
        )
        .unwrap();
        assert_eq!(raw.status, 200);
        assert_eq!(&raw.body[..], SHA.as_bytes());
        let etag = raw
            .headers
            .iter()
            .find(|(k, _)| k == "etag")
            .unwrap()
            .1
            .clone();
        let mut again = headers.clone();
        again.insert(http::header::IF_NONE_MATCH, etag.parse().unwrap());
        let raw = answer(
            &mut state,
            "GET",
            "/repos/actions/checkout/commits/v4",
            "",
            &again,
        )
        .unwrap();
        assert_eq!(raw.status, 304);
        let missing = answer(
            &mut state,
            "GET",
            "/repos/actions/checkout/commits/v9",
            "",
            &headers,
        )
        .unwrap();
        assert_eq!(missing.status, 422);
        // Not an action repository: left to the REST routes.
        assert!(
            answer(
                &mut state,
                "GET",
                "/repos/acme/w/commits/main",
                "",
                &headers
            )
            .is_none()
        );
    }

    #[test]
    fn the_tarball_redirects_to_codeload_which_serves_the_bytes() {
        let mut state = state();
        let headers = HeaderMap::new();
        let hop = answer(
            &mut state,
            "GET",
            &format!("/repos/actions/checkout/tarball/{SHA}"),
            "",
            &headers,
        )
        .unwrap();
        assert_eq!(hop.status, 302);
        let location = &hop.headers[0].1;
        let path = location.strip_prefix("http://127.0.0.1:9").unwrap();
        let served = answer(&mut state, "GET", path, "", &headers).unwrap();
        assert_eq!(served.status, 200);
        assert_eq!(
            served.body,
            state.archives.repos["actions/checkout"].tarballs[SHA]
        );
    }

    #[test]
    fn a_private_repository_needs_a_covering_installation_with_contents_read() {
        let mut state = state();
        state
            .archives
            .repos
            .get_mut("actions/checkout")
            .unwrap()
            .public = false;
        let path = "/repos/actions/checkout/commits/v4";
        assert_eq!(
            answer(&mut state, "GET", path, "", &HeaderMap::new())
                .unwrap()
                .status,
            404
        );
        state.add_repo("actions", "checkout", "Organization");
        let inst = state
            .repo_by_name("actions", "checkout")
            .unwrap()
            .installation_id;
        let (token, _) = state.issue_token(inst);
        let mut headers = accept(SHA_MEDIA_TYPE);
        headers.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        // The default permissions have no `contents`.
        assert_eq!(
            answer(&mut state, "GET", path, "", &headers)
                .unwrap()
                .status,
            404
        );
        state
            .installations
            .get_mut(&inst)
            .unwrap()
            .permissions
            .insert("contents".into(), "read".into());
        assert_eq!(
            answer(&mut state, "GET", path, "", &headers)
                .unwrap()
                .status,
            200
        );
        let hop = answer(
            &mut state,
            "GET",
            &format!("/repos/actions/checkout/tarball/{SHA}"),
            "",
            &headers,
        )
        .unwrap();
        let location = hop.headers[0]
            .1
            .strip_prefix("http://127.0.0.1:9")
            .unwrap()
            .to_owned();
        let (path, query) = location.split_once('?').unwrap();
        assert_eq!(
            answer(&mut state, "GET", path, query, &HeaderMap::new())
                .unwrap()
                .status,
            200
        );
        assert_eq!(
            answer(&mut state, "GET", path, "", &HeaderMap::new())
                .unwrap()
                .status,
            404
        );
    }
}
