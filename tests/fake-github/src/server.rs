//! The fake's HTTP side: accepting connections, injected faults, authentication, the rate-limit
//! headers and limits, ETags, the request log, and the runner protocol. The endpoints' answers
//! come from [`crate::routes`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedSender;

use crate::auth::{Caller, bearer};
use crate::jit::{Acquired, JobDone, RUNNER_PROTOCOL_PREFIX, Registered, RunnerHello};
use crate::model::RequestRecord;
use crate::routes::{Reply, Route, answer_as};
use crate::state::{FaultAction, State};

/// Largest request body the fake reads.
pub const MAX_BODY: usize = 1024 * 1024;

/// State shared by the server, the webhook sender and the test's handle.
pub struct Shared {
    pub state: Mutex<State>,
    /// New delivery ids go here, to the sender.
    pub outbox: UnboundedSender<u64>,
}

impl Shared {
    /// Runs `f` on the state, then hands every delivery it added to the sender.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (out, new_ids) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            // Before ageing: a job GitHub gives up sends its `completed` delivery too.
            let before = state.deliveries.len();
            state.age_runners();
            let out = f(&mut state);
            let ids: Vec<u64> = state.deliveries[before..].iter().map(|d| d.id).collect();
            (out, ids)
        };
        for id in new_ids {
            // The sender only stops when the fake is dropped; nothing to deliver then.
            let _ = self.outbox.send(id);
        }
        out
    }
}

/// What to do with a request.
enum Action {
    /// An answer and its extra headers.
    Reply(Reply, Vec<(String, String)>),
    Hang,
    Drop,
}

/// Error that makes hyper close the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

/// Accepts connections until the task is aborted.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
            // A dropped or reset connection is the client's business (or a fault we injected).
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(plain(413, "body too large")),
    };
    let method = parts.method.as_str().to_owned();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    if let Some(raw) = shared
        .with(|state| crate::results::answer(state, &method, &path, &query, &parts.headers, &body))
    {
        return Ok(raw_response(raw));
    }
    if wants_user_agent(&path) && !has_user_agent(&parts.headers) {
        return Ok(shared.with(|state| refuse_without_user_agent(state, &method, &path, &query)));
    }
    if shared.with(|state| crate::broker::owns(&state.base_path, &path)) {
        let json_body: Option<Value> = serde_json::from_slice(&body).ok();
        return Ok(crate::broker::answer(
            shared.clone(),
            &method,
            &path,
            &query,
            &parts.headers,
            json_body.as_ref(),
        )
        .await);
    }
    if let Some(raw) = shared.with(|state| crate::releases::answer(state, &method, &path, &query)) {
        return Ok(raw_response(raw));
    }
    if let Some(raw) =
        shared.with(|state| crate::archives::answer(state, &method, &path, &query, &parts.headers))
    {
        return Ok(raw_response(raw));
    }
    let json_body: Option<Value> = serde_json::from_slice(&body).ok();
    let (action, caller) = shared.with(|state| {
        let base = state.base_path.clone();
        // In flight from here until the answer is handed to hyper (or the hung request is
        // given up): what the concurrency limit counts.
        let caller = if path.strip_prefix(RUNNER_PROTOCOL_PREFIX).is_some() {
            None
        } else {
            caller_of(state, &parts.headers)
        };
        if let Some(c) = caller {
            state.ledger.arrive(c);
        }
        let (rel, action) = if let Some(rest) = path.strip_prefix(RUNNER_PROTOCOL_PREFIX) {
            (
                path.clone(),
                Action::Reply(
                    runner_protocol(state, &method, rest, json_body.as_ref()),
                    Vec::new(),
                ),
            )
        } else if let Some(rel) = path.strip_prefix(&base).filter(|r| r.starts_with('/')) {
            let rel = rel.to_owned();
            let action = respond(
                state,
                &method,
                &rel,
                &query,
                &parts.headers,
                json_body.as_ref(),
            );
            (rel, action)
        } else {
            (
                path.clone(),
                Action::Reply(Reply::error(404, "Not Found"), Vec::new()),
            )
        };
        let (status, response_body, response_headers) = match &action {
            Action::Reply(r, extra) => (
                r.status,
                r.body.clone(),
                r.headers.iter().chain(extra).cloned().collect(),
            ),
            Action::Hang | Action::Drop => (0, None, Vec::new()),
        };
        // The runner protocol's credential stays out of the log, like every other one.
        let mut body = json_body.clone();
        if let Some(token) = body.as_mut().and_then(|b| b.get_mut("token")) {
            *token = Value::String("<redacted>".into());
        }
        state.requests.push(RequestRecord {
            method: method.clone(),
            path: rel,
            query: query.clone(),
            status,
            headers: redacted(&parts.headers),
            body,
            response_body,
            response_headers,
            caller,
            at: state.now(),
        });
        (action, caller)
    });
    let _in_flight = caller.map(|caller| InFlight {
        shared: shared.clone(),
        caller,
    });
    match action {
        Action::Reply(r, extra) => Ok(to_response(r, &extra)),
        Action::Drop => Err(Dropped),
        Action::Hang => std::future::pending().await,
    }
}

/// What GitHub answers (403, plain text) to an API request without a `User-Agent`.
pub const NO_USER_AGENT_MESSAGE: &str = "Request forbidden by administrative rules. Please make sure your request has a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). Check https://developer.github.com for other possible causes.";

/// Whether GitHub refuses a request to `path` without a `User-Agent`: every REST request (the
/// releases API included). The fake's own runner protocol and the github.com download and
/// storage paths are not the API.
fn wants_user_agent(path: &str) -> bool {
    ![
        RUNNER_PROTOCOL_PREFIX,
        crate::releases::DOWNLOAD_PREFIX,
        crate::releases::ASSET_STORAGE_PREFIX,
    ]
    .iter()
    .any(|prefix| path.starts_with(prefix))
}

/// A `User-Agent` that says something (GitHub asks for the app's name).
fn has_user_agent(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().is_empty())
}

/// GitHub's refusal of a request without a `User-Agent`, logged like every request: a `403`
/// in plain text, before any credential is looked at (so without rate-limit headers).
fn refuse_without_user_agent(
    state: &mut State,
    method: &str,
    path: &str,
    query: &str,
) -> Response<Full<Bytes>> {
    let rel = path
        .strip_prefix(state.base_path.as_str())
        .filter(|r| r.starts_with('/'))
        .unwrap_or(path);
    state.requests.push(RequestRecord {
        method: method.to_owned(),
        path: rel.to_owned(),
        query: query.to_owned(),
        status: 403,
        headers: Vec::new(),
        body: None,
        response_body: None,
        response_headers: Vec::new(),
        caller: None,
        at: state.now(),
    });
    raw_response(crate::releases::Raw {
        status: 403,
        headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
        body: Bytes::from_static(NO_USER_AGENT_MESSAGE.as_bytes()),
    })
}

/// A request counted in flight for its scope until dropped.
struct InFlight {
    shared: Arc<Shared>,
    caller: Caller,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.shared.with(|state| state.ledger.leave(self.caller));
    }
}

/// Whose request this is by its credential, before it is checked: an issued installation token
/// (expired or not) is that installation's, anything else shaped like a JWT the App's.
fn caller_of(state: &State, headers: &HeaderMap) -> Option<Caller> {
    let credential = bearer(
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )?;
    match state.tokens.get(credential) {
        Some((installation, _)) => Some(Caller::Installation(*installation)),
        None => (credential.split('.').count() == 3).then_some(Caller::App),
    }
}

pub(crate) fn redacted(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            let v = v.to_str().unwrap_or("<binary>");
            let v = if k == http::header::AUTHORIZATION {
                let scheme = v.split(' ').next().unwrap_or("");
                format!("{scheme} <redacted>")
            } else {
                v.to_owned()
            };
            (k.as_str().to_owned(), v)
        })
        .collect()
}

/// A release answer: bytes as they are.
fn raw_response(raw: crate::releases::Raw) -> Response<Full<Bytes>> {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(raw.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    for (k, v) in &raw.headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    builder
        .body(Full::new(raw.body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn plain(status: u16, msg: &str) -> Response<Full<Bytes>> {
    to_response(Reply::error(status, msg), &[])
}

fn to_response(reply: Reply, extra: &[(String, String)]) -> Response<Full<Bytes>> {
    let body = reply
        .body
        .as_ref()
        .map(|v| Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
        .unwrap_or_default();
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    let has_id = reply
        .headers
        .iter()
        .chain(extra)
        .any(|(k, _)| k.eq_ignore_ascii_case(REQUEST_ID));
    if !has_id {
        builder = builder.header(REQUEST_ID, new_request_id());
    }
    if reply.body.is_some() {
        builder = builder.header("content-type", "application/json; charset=utf-8");
    }
    for (k, v) in reply.headers.iter().chain(extra) {
        builder = builder.header(k.as_str(), v.as_str());
    }
    builder
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// The header naming a request at GitHub (and in its error messages).
const REQUEST_ID: &str = "x-github-request-id";

fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string().to_uppercase()
}

/// A secondary limit's answer as GitHub gives it: `status` (403 or 429), GitHub's message
/// naming the request id, its documentation URL, the primary headers `limits` and, when known,
/// `retry-after` in whole seconds.
fn secondary_answer(
    status: u16,
    limits: &[(String, String)],
    retry_after_secs: Option<u64>,
) -> Action {
    let id = new_request_id();
    let message = format!("{} {id}.", crate::limits::SECONDARY_MESSAGE);
    let mut extra = limits.to_vec();
    extra.push((REQUEST_ID.into(), id));
    if let Some(secs) = retry_after_secs {
        extra.push(("retry-after".into(), secs.to_string()));
    }
    Action::Reply(
        Reply::error_documented(status, &message, crate::limits::SECONDARY_DOCS),
        extra,
    )
}

/// A weak ETag over the answer's body, like GitHub's.
pub fn etag_of(body: &Value) -> String {
    let digest = Sha256::digest(serde_json::to_vec(body).unwrap_or_default());
    format!("W/\"{}\"", &hex::encode(digest)[..32])
}

fn rate_headers(
    limit: u64,
    remaining: u64,
    reset: SystemTime,
    resource: &str,
) -> Vec<(String, String)> {
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
        ("x-ratelimit-resource".into(), resource.into()),
    ]
}

/// Whether `fault` still applies and matches the request.
fn fault_applies(fault: &crate::state::Fault, method: &str, rel: &str) -> bool {
    fault.times > 0
        && fault.method.as_deref().is_none_or(|m| m == method)
        && rel.contains(&fault.path_contains)
}

fn respond(
    state: &mut State,
    method: &str,
    rel: &str,
    query: &str,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Action {
    let drop_after = match state
        .faults
        .iter_mut()
        .find(|f| f.action == FaultAction::DropAfter && fault_applies(f, method, rel))
    {
        Some(fault) => {
            fault.times -= 1;
            true
        }
        None => false,
    };
    let action = respond_unless_faulted(state, method, rel, query, headers, body);
    if drop_after { Action::Drop } else { action }
}

fn respond_unless_faulted(
    state: &mut State,
    method: &str,
    rel: &str,
    query: &str,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Action {
    if let Some(fault) = state
        .faults
        .iter_mut()
        .find(|f| f.action != FaultAction::DropAfter && fault_applies(f, method, rel))
    {
        fault.times -= 1;
        return match fault.action {
            FaultAction::Status(s) => Action::Reply(Reply::error(s, "Server Error"), Vec::new()),
            FaultAction::Hang => Action::Hang,
            FaultAction::Drop | FaultAction::DropAfter => Action::Drop,
        };
    }
    let Some(route) = Route::parse(method, rel) else {
        return Action::Reply(Reply::error(404, "Not Found"), Vec::new());
    };
    let now = state.now();
    let credential = bearer(
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    // Which App signed the JWT: every App's JWT requests share the `App` ledger scope, few as
    // they are, and answers about installations are that App's.
    let mut app = state.app_id;
    let caller = if route.wants_jwt() {
        match credential.map(|c| state.jwt_app(c, now)) {
            Some(Ok(signer)) => {
                app = signer;
                Caller::App
            }
            Some(Err(msg)) => return Action::Reply(Reply::error(401, &msg), Vec::new()),
            None => {
                return Action::Reply(
                    Reply::error(401, "A JSON web token could not be decoded"),
                    Vec::new(),
                );
            }
        }
    } else {
        match credential.and_then(|c| state.tokens.get(c).copied()) {
            Some((inst, expires)) if expires > now => Caller::Installation(inst),
            _ => return Action::Reply(Reply::error(401, "Bad credentials"), Vec::new()),
        }
    };
    let scope = match caller {
        Caller::App => "app".to_owned(),
        Caller::Installation(i) => i.to_string(),
    };
    let resource = match route {
        Route::Jit(_) => state.jit_resource.clone(),
        _ => route.resource().to_owned(),
    };
    let resource = resource.as_str();
    let mut quota = *state.quota(&scope, resource);
    if let Some(until) = state.exhausted_until(resource) {
        quota.remaining = 0;
        quota.reset = until;
    }
    let limits = rate_headers(quota.limit, quota.remaining, quota.reset, resource);
    if let Some(trigger) = state
        .secondary_trigger
        .as_mut()
        .filter(|t| rel.contains(&t.path_contains))
    {
        if trigger.requests_left == 0 {
            state.secondary = Some(crate::state::Secondary {
                until: now + trigger.duration,
                status: trigger.status,
                send_retry_after: true,
                scope: Some(caller),
            });
            state.secondary_trigger = None;
        } else {
            trigger.requests_left -= 1;
        }
    }
    if let Some(sec) = state
        .secondary
        .filter(|s| s.until > now && s.scope.is_none_or(|c| c == caller))
    {
        let secs = sec.send_retry_after.then(|| {
            let left = sec.until.duration_since(now).unwrap_or(Duration::ZERO);
            left.as_secs() + u64::from(left.subsec_nanos() > 0)
        });
        return secondary_answer(sec.status, &limits, secs);
    }
    let secondary_limits = state.secondary_limits;
    if let Err(refusal) =
        state
            .ledger
            .admit(caller, route.template(), method, now, &secondary_limits)
    {
        let status = state.next_limit_status();
        return secondary_answer(status, &limits, Some(refusal.retry_after_secs()));
    }
    if !route.free() && quota.remaining == 0 {
        let msg = match caller {
            Caller::App => "API rate limit exceeded for app.".to_owned(),
            Caller::Installation(i) => format!("API rate limit exceeded for installation ID {i}."),
        };
        let status = state.next_limit_status();
        return Action::Reply(
            Reply::error_documented(status, &msg, crate::limits::PRIMARY_DOCS),
            limits,
        );
    }
    let mut reply = answer_as(state, caller, app, &route, query, body);
    let mut charged = !route.free();
    if method == "GET"
        && reply.status == 200
        && let Some(b) = &reply.body
    {
        let etag = etag_of(b);
        let matches = headers
            .get(http::header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
        if matches {
            reply = Reply::empty(304);
            charged = false;
        }
        reply.headers.push(("etag".into(), etag));
    }
    if charged {
        let q = state.quota(&scope, resource);
        q.remaining = q.remaining.saturating_sub(1);
        quota.remaining = quota.remaining.saturating_sub(1);
    }
    let limits = rate_headers(quota.limit, quota.remaining, quota.reset, resource);
    Action::Reply(reply, limits)
}

fn runner_protocol(state: &mut State, method: &str, rest: &str, body: Option<&Value>) -> Reply {
    if method != "POST" {
        return Reply::error(405, "POST only");
    }
    let hello: Option<RunnerHello> = body.and_then(|b| serde_json::from_value(b.clone()).ok());
    let Some(hello) = hello else {
        return Reply::error(400, "expected runner_id and token");
    };
    let known = state
        .runners
        .get(&hello.runner_id)
        .is_some_and(|r| r.token == hello.token);
    if !known {
        return Reply::error(401, "unknown runner or bad token");
    }
    match rest {
        "/register" => {
            let name = state
                .runners
                .get(&hello.runner_id)
                .map(|r| r.name.clone())
                .unwrap_or_default();
            let behavior = state.behavior_for(&name);
            if let Some(r) = state.runners.get_mut(&hello.runner_id) {
                r.online = true;
                r.behavior = Some(behavior.clone());
            }
            Reply::json(200, json!(Registered { behavior }))
        }
        "/acquire"
            if state
                .runners
                .get(&hello.runner_id)
                .and_then(|r| r.behavior.as_ref())
                .is_some_and(|b| b.version_refused) =>
        {
            // What GitHub answers a runner below the version it accepts.
            Reply::error(403, "Forbidden")
        }
        "/acquire" => Reply::json(
            200,
            json!(Acquired {
                job: state.assign(hello.runner_id)
            }),
        ),
        "/complete" => {
            let done: Option<JobDone> = body.and_then(|b| serde_json::from_value(b.clone()).ok());
            match done {
                // A scale-set runner's job is the broker's.
                Some(d) if state.scale_set_runner(d.runner_id).is_some() => {
                    if state.finish_scale_set_job(d.runner_id, d.job_id, &d.conclusion) {
                        Reply::json(200, json!({}))
                    } else {
                        Reply::error(422, "not this runner's job")
                    }
                }
                Some(d)
                    if state
                        .jobs
                        .get(&d.job_id)
                        .is_some_and(|j| j.runner_id == Some(d.runner_id)) =>
                {
                    state.complete(d.job_id, &d.conclusion);
                    Reply::json(200, json!({}))
                }
                _ => Reply::error(422, "not this runner's job"),
            }
        }
        "/renew" => {
            let renewal: Option<crate::jit::JobRenewal> =
                body.and_then(|b| serde_json::from_value(b.clone()).ok());
            match renewal {
                Some(r) if state.renew_job(r.runner_id, r.job_id) => Reply::json(200, json!({})),
                _ => Reply::error(422, "not this runner's running job"),
            }
        }
        "/exit" => {
            if let Some(r) = state.runners.get_mut(&hello.runner_id) {
                r.online = false;
                r.busy = false;
            }
            Reply::json(200, json!({}))
        }
        _ => Reply::error(404, "Not Found"),
    }
}
