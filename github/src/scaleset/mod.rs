//! The Actions service of GitHub's runner scale sets (`github-scale-sets.md` §1.3–1.12): the
//! RemoteAuth exchange that turns a registration token into the service's URL and an admin
//! token, scale sets, message sessions, the long-polled message queue, acknowledgement, job
//! acquisition and scale-set JIT configurations.
//!
//! It owns the admin connection (renewed within [`ADMIN_RENEW_BEFORE`] of its JWT's `exp`) and
//! the mapping of the service's errors, read by the `typeName` of their JSON body, to
//! [`ScaleSetError`]. It rides on [`GithubClient`]: the registration token is a REST call with
//! the [`Credential`] of the scope (the App's installation token for an organization or a
//! repository, a classic PAT for an enterprise), and every request goes through the same
//! octocrab transport. A session's queue token is the caller's, in the [`Session`] it holds.
//! Every token is a `secrecy` value; the PAT and the JIT configuration too.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use http_body_util::Full;
use octocrab::Octocrab;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::client::{Call, GithubClient};
use crate::error::GithubError;
use crate::target::Target;
use crate::wire::{from_unix_secs, percent_encode};

pub mod listener;

/// The API version of every Actions-service call.
pub const API_VERSION: &str = "api-version=6.0-preview";
/// How long a call other than the poll may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a poll may take: the service holds it about 50 s before `202`, so this must be
/// well above that.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(120);
/// Renew the admin token this long before its `exp` (the Go client's margin).
pub const ADMIN_RENEW_BEFORE: Duration = Duration::from_secs(60);
/// The UTF-8 byte-order mark some answers start with.
const BOM: &[u8] = b"\xEF\xBB\xBF";
/// The nil UUID the Go client sends as a new session's id.
const NIL_SESSION: &str = "00000000-0000-0000-0000-000000000000";

/// What went wrong talking to the Actions service; the variants callers act on are typed.
#[derive(Debug, thiserror::Error)]
pub enum ScaleSetError {
    /// The scale set already has an active session (`RunnerScaleSetSessionConflictException`).
    #[error("the scale set already has an active session: {message}")]
    SessionConflict { message: String },
    /// The session no longer exists (a refresh answered 404): create a new one.
    #[error("the message session is gone: {message}")]
    SessionGone { message: String },
    /// The scale set does not exist (`RunnerScaleSetNotFoundException`).
    #[error("the scale set was not found: {message}")]
    ScaleSetNotFound { message: String },
    /// A runner of that name exists (`AgentExistsException`).
    #[error("a runner of that name already exists: {message}")]
    AgentExists { message: String },
    /// The runner holds a job and cannot be removed now (`JobStillRunningException`, 400 per
    /// ARC's ADR, 409 in the Go client's test): try again once it is idle.
    #[error("the runner is still running a job: {message}")]
    JobStillRunning { message: String },
    /// The poll answered 200 without a readable message: transient, poll again after a while.
    #[error("the message queue answered 200 without a readable message: {reason}")]
    UnreadableMessage { reason: String },
    /// The credential was refused (401).
    #[error("the Actions service refused the credential on {endpoint}: {message}")]
    Unauthorized {
        endpoint: &'static str,
        message: String,
    },
    /// Any other refusal, with its `typeName` (empty when the body had none).
    #[error("the Actions service answered {status} on {endpoint}: {type_name} {message}")]
    Service {
        endpoint: &'static str,
        status: u16,
        type_name: String,
        message: String,
    },
    /// No answer.
    #[error("the Actions service is unreachable on {endpoint}: {reason}")]
    Unreachable {
        endpoint: &'static str,
        reason: String,
    },
    /// An answer that is not what the protocol says.
    #[error("unexpected answer from the Actions service on {endpoint}: {message}")]
    Unexpected {
        endpoint: &'static str,
        message: String,
    },
    /// GitHub refused the enterprise's personal access token on the registration-token
    /// request (401 or 403): wrong, expired or revoked, or without `manage_runners:enterprise`.
    /// Waiting does not fix it; replacing the token does.
    #[error(
        "GitHub refused the enterprise's personal access token ({status} on {endpoint}: {message}); it must be a valid classic PAT with the scope `manage_runners:enterprise`"
    )]
    TokenRefused {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    /// The REST side (the registration token).
    #[error(transparent)]
    Github(#[from] GithubError),
}

/// The service's counters, as sessions and messages carry them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Statistics {
    pub total_available_jobs: i64,
    pub total_acquired_jobs: i64,
    pub total_assigned_jobs: i64,
    pub total_running_jobs: i64,
    pub total_registered_runners: i64,
    pub total_busy_runners: i64,
    pub total_idle_runners: i64,
}

/// A label of a scale set.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Label {
    pub name: String,
}

/// A runner scale set.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSet {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub runner_group_id: u64,
    #[serde(default)]
    pub labels: Vec<Label>,
}

/// A message session: the caller holds it, and the poll refreshes its queue token in place.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub session_id: String,
    #[serde(default)]
    pub owner_name: String,
    pub message_queue_url: String,
    pub message_queue_access_token: SecretString,
    #[serde(default)]
    pub statistics: Option<Statistics>,
    /// The scale set it belongs to (not in the answer; set by [`ScaleSetClient::create_session`]).
    #[serde(skip)]
    pub scale_set_id: u64,
}

/// One element of a job message's `body`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobMessage {
    /// `JobAvailable`, `JobAssigned`, `JobStarted`, `JobCompleted`, or one not known yet.
    pub message_type: String,
    #[serde(default)]
    pub runner_request_id: i64,
    #[serde(default)]
    pub job_id: String,
    #[serde(default)]
    pub job_display_name: String,
    /// The repository's name, without its owner.
    #[serde(default)]
    pub repository_name: String,
    #[serde(default)]
    pub owner_name: String,
    #[serde(default)]
    pub workflow_run_id: Option<i64>,
    /// `owner/repo/.github/workflows/ci.yml@refs/heads/main`.
    #[serde(default)]
    pub job_workflow_ref: String,
    #[serde(default)]
    pub request_labels: Vec<String>,
    /// On `JobStarted` and `JobCompleted`: the runner that took the job.
    #[serde(default)]
    pub runner_id: Option<i64>,
    #[serde(default)]
    pub runner_name: Option<String>,
    /// On `JobCompleted`: `succeeded`, `failed`, `canceled`, ...
    #[serde(default)]
    pub result: Option<String>,
}

/// A runner as the service's runner endpoints show it (`github-scale-sets.md` §1.13).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ScaleSetRunner {
    pub id: u64,
    pub name: String,
    /// The scale set it belongs to; 0 for a runner of none.
    #[serde(default, rename = "runnerScaleSetId")]
    pub scale_set_id: u64,
}

/// What a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageBody {
    /// `RunnerScaleSetJobMessages`: its `body`, decoded.
    Jobs(Vec<JobMessage>),
    /// A top-level type this client does not know: kept as it came, for the caller to log.
    Unknown { message_type: String, body: String },
}

/// A message of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: u64,
    pub statistics: Option<Statistics>,
    pub body: MessageBody,
}

/// A scale-set runner's JIT configuration. The encoded configuration is a secret until the
/// runner has used it: it never appears in `Debug`.
#[derive(Debug, Clone)]
pub struct ScaleSetJit {
    pub runner_id: u64,
    pub runner_name: String,
    pub encoded_jit_config: SecretString,
}

/// The HTTP client of the Actions service and its queue (absolute URLs).
type ServiceHttp = crate::https::HttpsClient<Full<Bytes>>;

/// Which client a call goes through: the REST API's (its base, its `User-Agent`) for the
/// RemoteAuth exchange, the service's for everything after it.
#[derive(Clone, Copy)]
enum Transport<'a> {
    Rest(&'a Octocrab),
    Service(&'a ServiceHttp),
}

/// The service's URL and admin token, and when the token expires.
#[derive(Clone)]
struct AdminConnection {
    url: String,
    token: SecretString,
    /// `None` when the token's `exp` cannot be read: it is used until the service refuses it
    /// (401 or 403), then renewed.
    expires_at: Option<SystemTime>,
}

/// What the registration token is asked with, and for which scope.
pub enum Credential {
    /// The App's installation covering an organization or a repository target.
    App(Target),
    /// A classic personal access token (`manage_runners:enterprise`) of enterprise `slug`: the
    /// one credential GitHub takes for an enterprise's scale sets. No App request is made.
    EnterprisePat { slug: String, token: SecretString },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::App(target) => f.debug_tuple("App").field(target).finish(),
            // The token's text never, not even redacted by `secrecy`'s own `Debug`.
            Credential::EnterprisePat { slug, .. } => f
                .debug_struct("EnterprisePat")
                .field("slug", slug)
                .finish_non_exhaustive(),
        }
    }
}

/// The endpoint name of the enterprise registration-token request (a REST call: GitHub's
/// media type, not the service's).
const ENTERPRISE_TOKEN_ENDPOINT: &str = "enterprises.runners.registration_token";

/// The `Accept` of a request to `endpoint`: GitHub's REST media type for the enterprise
/// registration token, the service's API version for everything else (the RemoteAuth
/// exchange included, as the Go client sends it).
fn accept(endpoint: &str) -> String {
    if endpoint == ENTERPRISE_TOKEN_ENDPOINT {
        "application/vnd.github+json".to_owned()
    } else {
        format!("application/json; {API_VERSION}")
    }
}

/// The client of one scope's Actions service.
pub struct ScaleSetClient {
    github: GithubClient,
    credential: Credential,
    /// The scope's URL as the service knows it (`https://github.com/acme`).
    config_url: String,
    /// The transport for the service's absolute URLs (no base path of its own).
    http: ServiceHttp,
    admin: tokio::sync::Mutex<Option<AdminConnection>>,
    /// The `version` of the `User-Agent` (see [`ScaleSetClient::with_version`]).
    version: String,
}

impl std::fmt::Debug for ScaleSetClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScaleSetClient")
            .field("credential", &self.credential)
            .field("config_url", &self.config_url)
            .finish_non_exhaustive()
    }
}

/// `body` without a leading UTF-8 byte-order mark.
pub fn strip_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(BOM).unwrap_or(body)
}

/// When the JWT `token` expires: the `exp` of its payload, whatever its header's `alg` says
/// (`none` included). rm never verifies the admin token's signature (the service does), so the
/// header has nothing to tell it; GitHub's own client reads it the same way (golang-jwt's
/// `ParseUnverified`). `None` when the payload cannot be read: the caller uses the token until
/// the service refuses it.
pub fn jwt_expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&base64url(payload)?).ok()?;
    let exp = claims.get("exp")?;
    // A NumericDate may be written with a fraction (RFC 7519 §2); its seconds are enough
    // (a float cast to an integer saturates, never wraps).
    let secs = exp.as_u64().or_else(|| {
        exp.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f as u64)
    })?;
    Some(from_unix_secs(secs))
}

/// The bytes of base64url `text` (RFC 4648 §5; padding and the standard alphabet's `+` and
/// `/` taken too); `None` on any other character. Written out here: the one decoding rm needs
/// of it, and `jsonwebtoken`'s own refuses a header it does not know.
fn base64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim_end_matches('=').bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from(acc >> bits).ok()?);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `url` with `param` added to its query.
fn with_query(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// `url` with `segment` appended to its path, its query kept.
fn with_segment(url: &str, segment: &str) -> String {
    match url.split_once('?') {
        Some((path, query)) => format!("{}/{segment}?{query}", path.trim_end_matches('/')),
        None => format!("{}/{segment}", url.trim_end_matches('/')),
    }
}

/// The endpoint that opens a session: a `409` there is a session the scale set has already.
const SESSION_CREATE: &str = "runnerscalesets.sessions.create";
/// The endpoint that gives a session a new queue token.
const SESSION_REFRESH: &str = "runnerscalesets.sessions.refresh";
/// The message long poll.
const MESSAGE_GET: &str = "scalesets.message.get";
/// The acknowledgement: the message's deletion.
const MESSAGE_DELETE: &str = "scalesets.message.delete";
/// Job acquisition, with the session's queue token.
const ACQUIRE: &str = "runnerscalesets.acquirejobs";
/// The scale set found by its name.
const SCALE_SET_FIND: &str = "runnerscalesets.find";
/// The endpoints of our session: a `404` there is the session gone, whatever the type name
/// (unless it names the scale set).
const SESSION_ENDPOINTS: [&str; 4] = [MESSAGE_GET, MESSAGE_DELETE, ACQUIRE, SESSION_REFRESH];
/// The endpoints of the scale set itself: a `404` there is the scale set gone, whatever the
/// type name.
const SCALE_SET_ENDPOINTS: [&str; 2] = [SCALE_SET_FIND, SESSION_CREATE];

/// The error an answer other than 2xx to `endpoint` means: by its status first, then by the
/// `typeName` of its body, which only refines (a service version, a GHES or a proxy in between
/// may name it otherwise, or not at all; GitHub's own client decides on the status too).
///
/// - `RunnerScaleSetNotFoundException` anywhere: the scale set is gone.
/// - `401`: the credential was refused (the caller re-authenticates once).
/// - `409` on the session's creation: the scale set has a session.
/// - `404` on the poll, the acknowledgement, acquisition or the session's refresh: our session
///   is gone (but on the acknowledgement, `MessageNotFoundException` is the message deleted
///   already); on the scale set's find or a session's creation: the scale set is gone.
/// - otherwise the names rm knows (`AgentExistsException`, `JobStillRunningException`, the
///   session conflict's), else [`ScaleSetError::Service`] with its status and type name.
fn service_error(endpoint: &'static str, status: StatusCode, body: &[u8]) -> ScaleSetError {
    let body = strip_bom(body);
    let (type_name, message) = match serde_json::from_slice::<Value>(body) {
        Ok(v) => (
            v.get("typeName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            v.get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        ),
        Err(_) => (
            String::new(),
            String::from_utf8_lossy(body).chars().take(200).collect(),
        ),
    };
    let named = |name: &str| type_name.contains(name);
    // With its type name, so that a log says what the service called it.
    let said = || {
        if type_name.is_empty() {
            message.clone()
        } else {
            format!("{type_name}: {message}")
        }
    };
    match status.as_u16() {
        _ if named("RunnerScaleSetNotFoundException") => {
            ScaleSetError::ScaleSetNotFound { message }
        }
        401 => ScaleSetError::Unauthorized { endpoint, message },
        409 if endpoint == SESSION_CREATE => ScaleSetError::SessionConflict { message: said() },
        // The message, not the session, is gone: deleted already (the caller's ack is done).
        404 if endpoint == MESSAGE_DELETE && named("MessageNotFoundException") => {
            ScaleSetError::Service {
                endpoint,
                status: 404,
                type_name,
                message,
            }
        }
        // See: https://github.com/actions/scaleset/issues/123 (a broker that evicts every
        // session answers its refresh 404, typeName RunnerAdminException).
        404 if SESSION_ENDPOINTS.contains(&endpoint) => {
            ScaleSetError::SessionGone { message: said() }
        }
        404 if SCALE_SET_ENDPOINTS.contains(&endpoint) => {
            ScaleSetError::ScaleSetNotFound { message: said() }
        }
        _ if named("RunnerScaleSetSessionConflictException") => {
            ScaleSetError::SessionConflict { message }
        }
        _ if named("AgentExistsException") => ScaleSetError::AgentExists { message },
        _ if named("JobStillRunningException") => ScaleSetError::JobStillRunning { message },
        status => ScaleSetError::Service {
            endpoint,
            status,
            type_name,
            message,
        },
    }
}

/// `body` (a byte-order mark stripped) as `T`.
fn decode<T: DeserializeOwned>(endpoint: &'static str, body: &[u8]) -> Result<T, ScaleSetError> {
    serde_json::from_slice(strip_bom(body)).map_err(|e| ScaleSetError::Unexpected {
        endpoint,
        message: format!("cannot read the answer: {e}"),
    })
}

/// A registration token as GitHub answers it (its `expires_at` is not needed: the admin token
/// it is exchanged for at once carries its own expiry).
#[derive(Deserialize)]
struct RegistrationToken {
    token: SecretString,
}

/// A REST error body's `message` (`Bad credentials`), at most 200 characters of it; the
/// body's text when it is not JSON.
fn rest_message(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Value>(strip_bom(body)) {
        Ok(v) => v
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    text.chars().take(200).collect()
}

/// A request to the service.
#[derive(Clone)]
struct Request<'a> {
    endpoint: &'static str,
    method: Method,
    url: String,
    /// The whole `Authorization` value.
    authorization: String,
    body: Option<&'a Value>,
    /// For the queue: `X-ScaleSetMaxCapacity`.
    max_capacity: Option<u32>,
    timeout: Duration,
}

/// Which part of a scale-set manager makes a call, for the `User-Agent`: the listener
/// (sessions, the queue, acquisition) or the agent (scale sets, JIT configurations, runners).
fn subsystem(endpoint: &str) -> &'static str {
    if endpoint.starts_with("scalesets.message")
        || endpoint.starts_with("runnerscalesets.sessions")
        || endpoint == "runnerscalesets.acquirejobs"
    {
        "listener"
    } else {
        "agent"
    }
}

/// The scale set a service URL is about (`…/runnerscalesets/{id}…` or `scaleSetId={id}`).
fn scale_set_of(url: &str) -> Option<u64> {
    ["runnerscalesets/", "scaleSetId="]
        .iter()
        .find_map(|marker| {
            let (_, rest) = url.split_once(marker)?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
}

impl ScaleSetClient {
    /// A client of `target`'s scale sets through the App's installation there; `config_url`
    /// is the scope as the service knows it (`https://github.com/acme`).
    pub fn new(
        github: GithubClient,
        target: Target,
        config_url: impl Into<String>,
    ) -> anyhow::Result<Self> {
        Self::with_credential(github, Credential::App(target), config_url)
    }

    /// A client of the scale sets of the scope `credential` opens; `config_url` is that scope
    /// as the service knows it (`https://github.com/enterprises/octo` for an enterprise).
    /// `github` is the transport (the API's base URL); an enterprise's client never asks it
    /// for an App or installation token.
    pub fn with_credential(
        github: GithubClient,
        credential: Credential,
        config_url: impl Into<String>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        // Not octocrab: it adds its own `User-Agent` to every request, and the service's calls
        // carry ours (a second one would make the header a list).
        let http = crate::https::client().context("cannot build the HTTP client")?;
        Ok(Self {
            github,
            credential,
            config_url: config_url.into(),
            http,
            admin: tokio::sync::Mutex::new(None),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        })
    }

    /// The version the `User-Agent` names (default: this crate's).
    #[must_use]
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// The JSON `User-Agent` of a service call (`github-scale-sets.md` §1.5; the Go client
    /// sends the same shape): what is calling, from which part, about which scale set.
    fn user_agent(&self, endpoint: &str, url: &str) -> String {
        let mut agent = json!({
            "system": "rm-agent",
            "version": self.version,
            "subsystem": subsystem(endpoint),
            "kind": "scaleset",
        });
        if let Some(id) = scale_set_of(url) {
            agent["scale_set_id"] = json!(id);
        }
        agent.to_string()
    }

    /// Sends `request` through `transport`; the status and the body of any answer.
    async fn exchange(
        transport: Transport<'_>,
        request: Request<'_>,
        user_agent: Option<String>,
    ) -> Result<(StatusCode, Bytes), ScaleSetError> {
        let endpoint = request.endpoint;
        let unreachable = |reason: String| ScaleSetError::Unreachable { endpoint, reason };
        let mut authorization = HeaderValue::from_str(&request.authorization).map_err(|_| {
            ScaleSetError::Unauthorized {
                endpoint,
                message: "the credential is not a valid header value".into(),
            }
        })?;
        authorization.set_sensitive(true);
        let mut builder = http::Request::builder()
            .method(request.method)
            .uri(request.url.as_str())
            .header(header::AUTHORIZATION, authorization)
            .header(header::ACCEPT, accept(endpoint));
        if let Some(capacity) = request.max_capacity {
            builder = builder.header("X-ScaleSetMaxCapacity", capacity.to_string());
        }
        if let Some(agent) = user_agent {
            builder = builder.header(header::USER_AGENT, agent);
        }
        let exchange = async {
            match transport {
                Transport::Rest(octo) => {
                    let built = octo
                        .build_request(builder, request.body)
                        .map_err(|e| format!("cannot build the request: {e}"))?;
                    let response = octo.execute(built).await.map_err(|e| e.to_string())?;
                    let (parts, body) = response.into_parts();
                    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
                    Ok::<_, String>((parts, body))
                }
                Transport::Service(http) => {
                    let body = match request.body {
                        Some(value) => {
                            Bytes::from(serde_json::to_vec(value).map_err(|e| e.to_string())?)
                        }
                        None => Bytes::new(),
                    };
                    let built = builder
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(body))
                        .map_err(|e| format!("cannot build the request: {e}"))?;
                    let response = http.request(built).await.map_err(|e| e.to_string())?;
                    let (parts, body) = response.into_parts();
                    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
                    Ok((parts, body))
                }
            }
        };
        match tokio::time::timeout(request.timeout, exchange).await {
            Ok(Ok((parts, body))) => {
                tracing::debug!(
                    endpoint,
                    status = parts.status.as_u16(),
                    activity_id = parts
                        .headers
                        .get("ActivityId")
                        .and_then(|v| v.to_str().ok()),
                    request_id = parts
                        .headers
                        .get("X-GitHub-Request-Id")
                        .and_then(|v| v.to_str().ok()),
                    "actions service request"
                );
                Ok((parts.status, body))
            }
            Ok(Err(reason)) => Err(unreachable(reason)),
            Err(_) => Err(unreachable(format!(
                "no answer within {:?}",
                request.timeout
            ))),
        }
    }

    /// The answer's body on 2xx, its error otherwise.
    async fn call(&self, request: Request<'_>) -> Result<(StatusCode, Bytes), ScaleSetError> {
        let endpoint = request.endpoint;
        let user_agent = self.user_agent(endpoint, &request.url);
        let (status, body) =
            Self::exchange(Transport::Service(&self.http), request, Some(user_agent)).await?;
        if status.is_success() {
            Ok((status, body))
        } else {
            Err(service_error(endpoint, status, &body))
        }
    }

    /// A registration token for the scope: REST, with the installation token of the App's
    /// installation on the target, or with an enterprise's PAT.
    async fn registration_token(&self) -> Result<SecretString, ScaleSetError> {
        let target = match &self.credential {
            Credential::App(target) => target,
            Credential::EnterprisePat { slug, token } => {
                return self.enterprise_registration_token(slug, token).await;
            }
        };
        let (endpoint, path) = match target {
            Target::Org(org) => (
                "orgs.runners.registration_token",
                format!("/orgs/{org}/actions/runners/registration-token"),
            ),
            Target::Repo { owner, repo } => (
                "repos.runners.registration_token",
                format!("/repos/{owner}/{repo}/actions/runners/registration-token"),
            ),
        };
        let auth = self.github.installation_of(target).await?;
        let call = Call {
            method: Method::POST,
            ..Call::get(endpoint, auth, path)
        };
        let token: RegistrationToken = self.github.get_json(call).await?;
        Ok(token.token)
    }

    /// `POST /enterprises/{slug}/actions/runners/registration-token` with the PAT as its
    /// bearer. Not through the App's client: the PAT is no installation's, and its requests
    /// (one an hour, at the admin token's renewal) are outside the App's budget. A 401 or 403
    /// is [`ScaleSetError::TokenRefused`].
    async fn enterprise_registration_token(
        &self,
        slug: &str,
        token: &SecretString,
    ) -> Result<SecretString, ScaleSetError> {
        let request = Request {
            endpoint: ENTERPRISE_TOKEN_ENDPOINT,
            method: Method::POST,
            // Relative: the REST client's base (with its path, on GHES) is put before it.
            url: format!(
                "/enterprises/{}/actions/runners/registration-token",
                percent_encode(slug)
            ),
            authorization: format!("Bearer {}", token.expose_secret()),
            body: None,
            max_capacity: None,
            timeout: CALL_TIMEOUT,
        };
        let (status, answer) =
            Self::exchange(Transport::Rest(&self.github.inner.octo), request, None).await?;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ScaleSetError::TokenRefused {
                endpoint: ENTERPRISE_TOKEN_ENDPOINT,
                status: status.as_u16(),
                message: rest_message(&answer),
            });
        }
        if !status.is_success() {
            return Err(service_error(ENTERPRISE_TOKEN_ENDPOINT, status, &answer));
        }
        let registration: RegistrationToken = decode(ENTERPRISE_TOKEN_ENDPOINT, &answer)?;
        Ok(registration.token)
    }

    /// Whether GitHub issues the scope's registration token to this client's credential:
    /// what `rm-agent check` asks of an enterprise's PAT. The token is dropped (it expires in
    /// an hour, unused).
    pub async fn verify_credential(&self) -> Result<(), ScaleSetError> {
        self.registration_token().await.map(drop)
    }

    /// The RemoteAuth exchange: the service's URL and a fresh admin token.
    async fn connect(&self) -> Result<AdminConnection, ScaleSetError> {
        const ENDPOINT: &str = "actions.runner_registration";
        #[derive(Deserialize)]
        struct Connection {
            url: String,
            token: SecretString,
        }
        let registration = self.registration_token().await?;
        let body = json!({"url": self.config_url, "runner_event": "register"});
        let request = Request {
            endpoint: ENDPOINT,
            method: Method::POST,
            // Relative: the REST client's base (with its path, on GHES) is put before it.
            url: "/actions/runner-registration".into(),
            authorization: format!("RemoteAuth {}", registration.expose_secret()),
            body: Some(&body),
            max_capacity: None,
            timeout: CALL_TIMEOUT,
        };
        let (status, answer) =
            Self::exchange(Transport::Rest(&self.github.inner.octo), request, None).await?;
        if !status.is_success() {
            return Err(service_error(ENDPOINT, status, &answer));
        }
        let connection: Connection = decode(ENDPOINT, &answer)?;
        if connection.url.is_empty() || connection.token.expose_secret().is_empty() {
            return Err(ScaleSetError::Unexpected {
                endpoint: ENDPOINT,
                message: "the answer has an empty url or token".into(),
            });
        }
        let expires_at = jwt_expiry(connection.token.expose_secret());
        if expires_at.is_none() {
            // Never a reason to stop: the service, not rm, judges the token.
            tracing::warn!(
                "the admin token's exp cannot be read; it is used until the service refuses it"
            );
        }
        Ok(AdminConnection {
            url: connection.url,
            token: connection.token,
            expires_at,
        })
    }

    /// The service's URL and the admin token, renewed when within [`ADMIN_RENEW_BEFORE`] of
    /// its expiry (one whose expiry is unknown, only once refused: see [`Self::admin_call`]).
    async fn admin(&self) -> Result<AdminConnection, ScaleSetError> {
        let mut admin = self.admin.lock().await;
        let now = self.github.inner.now();
        let due = admin.as_ref().is_none_or(|a| {
            a.expires_at
                .is_some_and(|expires_at| now + ADMIN_RENEW_BEFORE >= expires_at)
        });
        if due {
            *admin = Some(self.connect().await?);
        }
        match admin.as_ref() {
            Some(a) => Ok(a.clone()),
            None => Err(ScaleSetError::Unexpected {
                endpoint: "actions.runner_registration",
                message: "no admin connection".into(),
            }),
        }
    }

    /// An admin-token call to `path` below the service's URL (`_apis/runtime/…`, with any
    /// query but the API version).
    async fn admin_call(
        &self,
        endpoint: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Bytes), ScaleSetError> {
        let mut reconnected = false;
        loop {
            let AdminConnection {
                url: base,
                token,
                expires_at,
            } = self.admin().await?;
            let url = with_query(
                &format!("{}/{path}", base.trim_end_matches('/')),
                API_VERSION,
            );
            let answer = self
                .call(Request {
                    endpoint,
                    method: method.clone(),
                    url,
                    authorization: format!("Bearer {}", token.expose_secret()),
                    body,
                    max_capacity: None,
                    timeout: CALL_TIMEOUT,
                })
                .await;
            match answer {
                // The service no longer takes the admin token before its `exp` (or one whose
                // `exp` rm cannot read, refused either way): forget it and make the exchange
                // again, once.
                Err(ScaleSetError::Unauthorized { .. }) if !reconnected => {
                    reconnected = true;
                    *self.admin.lock().await = None;
                }
                Err(ScaleSetError::Service { status: 403, .. })
                    if !reconnected && expires_at.is_none() =>
                {
                    reconnected = true;
                    *self.admin.lock().await = None;
                }
                other => return other,
            }
        }
    }

    /// The scale set `name` in runner group `runner_group_id`, if it exists.
    pub async fn get_scale_set(
        &self,
        runner_group_id: u64,
        name: &str,
    ) -> Result<Option<ScaleSet>, ScaleSetError> {
        const ENDPOINT: &str = SCALE_SET_FIND;
        #[derive(Deserialize)]
        struct List {
            count: usize,
            value: Vec<ScaleSet>,
        }
        let path = format!(
            "_apis/runtime/runnerscalesets?runnerGroupId={runner_group_id}&name={}",
            percent_encode(name)
        );
        let body = match self.admin_call(ENDPOINT, Method::GET, &path, None).await {
            Ok((_, body)) => body,
            // A 404, named or bare: there is no such set (the caller creates it).
            Err(ScaleSetError::ScaleSetNotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut list: List = decode(ENDPOINT, &body)?;
        if list.count > 1 || list.value.len() > 1 {
            return Err(ScaleSetError::Unexpected {
                endpoint: ENDPOINT,
                message: format!("{} scale sets named {name:?}", list.count),
            });
        }
        Ok(list.value.pop())
    }

    /// Creates the scale set `name` in runner group `runner_group_id` with `labels` (its name
    /// alone when empty); runners it starts are not auto-updated.
    pub async fn create_scale_set(
        &self,
        runner_group_id: u64,
        name: &str,
        labels: &[String],
    ) -> Result<ScaleSet, ScaleSetError> {
        const ENDPOINT: &str = "runnerscalesets.create";
        let labels: Vec<&str> = if labels.is_empty() {
            vec![name]
        } else {
            labels.iter().map(String::as_str).collect()
        };
        let body = json!({
            "name": name,
            "runnerGroupId": runner_group_id,
            "labels": labels.iter().map(|l| json!({"type": "System", "name": l})).collect::<Vec<_>>(),
            // Sic: the service spells it with a capital R.
            "RunnerSetting": {"disableUpdate": true},
        });
        let (_, answer) = self
            .admin_call(
                ENDPOINT,
                Method::POST,
                "_apis/runtime/runnerscalesets",
                Some(&body),
            )
            .await?;
        decode(ENDPOINT, &answer)
    }

    /// Opens the message session of scale set `scale_set_id` as `owner_name`. A second one
    /// is refused with [`ScaleSetError::SessionConflict`] (any `409`), a scale set gone with
    /// [`ScaleSetError::ScaleSetNotFound`] (any `404`).
    pub async fn create_session(
        &self,
        scale_set_id: u64,
        owner_name: &str,
    ) -> Result<Session, ScaleSetError> {
        const ENDPOINT: &str = SESSION_CREATE;
        let body = json!({"sessionId": NIL_SESSION, "ownerName": owner_name});
        let path = format!("_apis/runtime/runnerscalesets/{scale_set_id}/sessions");
        let (_, answer) = self
            .admin_call(ENDPOINT, Method::POST, &path, Some(&body))
            .await?;
        let mut session: Session = decode(ENDPOINT, &answer)?;
        if session.message_queue_url.is_empty() {
            return Err(ScaleSetError::Unexpected {
                endpoint: ENDPOINT,
                message: "the session has no message queue URL".into(),
            });
        }
        session.scale_set_id = scale_set_id;
        Ok(session)
    }

    /// Refreshes `session` in place (a new queue token). A session the service no longer
    /// knows (a `404`) is [`ScaleSetError::SessionGone`].
    pub async fn refresh_session(&self, session: &mut Session) -> Result<(), ScaleSetError> {
        const ENDPOINT: &str = SESSION_REFRESH;
        let path = format!(
            "_apis/runtime/runnerscalesets/{}/sessions/{}",
            session.scale_set_id, session.session_id
        );
        let (_, answer) = self
            .admin_call(ENDPOINT, Method::PATCH, &path, None)
            .await?;
        let mut fresh: Session = decode(ENDPOINT, &answer)?;
        fresh.scale_set_id = session.scale_set_id;
        *session = fresh;
        Ok(())
    }

    /// Closes `session`; one the service already let go of is closed too.
    pub async fn delete_session(&self, session: &Session) -> Result<(), ScaleSetError> {
        self.delete_session_by_id(session.scale_set_id, &session.session_id)
            .await
    }

    /// Closes session `session_id` of scale set `scale_set_id` by its id alone: the way to
    /// free a session a crashed process left open, its id read back from the journal.
    pub async fn delete_session_by_id(
        &self,
        scale_set_id: u64,
        session_id: &str,
    ) -> Result<(), ScaleSetError> {
        const ENDPOINT: &str = "runnerscalesets.sessions.delete";
        let path = format!(
            "_apis/runtime/runnerscalesets/{scale_set_id}/sessions/{}",
            percent_encode(session_id)
        );
        match self.admin_call(ENDPOINT, Method::DELETE, &path, None).await {
            Ok(_) => Ok(()),
            // Gone already (a 404, whatever its type name) is what the delete wanted.
            Err(ScaleSetError::Service { status: 404, .. }) => Ok(()),
            Err(ScaleSetError::Service { type_name, .. })
                if type_name.contains("RunnerScaleSetSessionExpiredException") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// A queue-token call (`request` with the session's queue token); on 401 the session is
    /// refreshed once and the call made again.
    async fn queue_call(
        &self,
        session: &mut Session,
        request: Request<'_>,
    ) -> Result<(StatusCode, Bytes), ScaleSetError> {
        let mut refreshed = false;
        loop {
            let authorization = format!(
                "Bearer {}",
                session.message_queue_access_token.expose_secret()
            );
            match self
                .call(Request {
                    authorization,
                    ..request.clone()
                })
                .await
            {
                Err(ScaleSetError::Unauthorized { .. }) if !refreshed => {
                    refreshed = true;
                    self.refresh_session(session).await?;
                }
                other => return other,
            }
        }
    }

    /// Long-polls the queue for the message after `last_message_id` (0: the first one still
    /// there), telling the service this client can run `max_capacity` runners now. `None` when
    /// nothing came within the service's hold. An empty or unreadable `200` is
    /// [`ScaleSetError::UnreadableMessage`]: transient.
    pub async fn get_message(
        &self,
        session: &mut Session,
        last_message_id: u64,
        max_capacity: u32,
    ) -> Result<Option<Message>, ScaleSetError> {
        const ENDPOINT: &str = MESSAGE_GET;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw {
            message_id: u64,
            message_type: String,
            #[serde(default)]
            statistics: Option<Statistics>,
            #[serde(default)]
            body: Option<String>,
        }
        let mut url = session.message_queue_url.clone();
        if last_message_id > 0 {
            url = with_query(&url, &format!("lastMessageId={last_message_id}"));
        }
        let (status, answer) = self
            .queue_call(
                session,
                Request {
                    endpoint: ENDPOINT,
                    method: Method::GET,
                    url,
                    authorization: String::new(),
                    body: None,
                    max_capacity: Some(max_capacity),
                    timeout: POLL_TIMEOUT,
                },
            )
            .await?;
        if status == StatusCode::ACCEPTED {
            return Ok(None);
        }
        let unreadable = |reason: String| ScaleSetError::UnreadableMessage { reason };
        let answer = strip_bom(&answer);
        if answer.iter().all(u8::is_ascii_whitespace) {
            return Err(unreadable("an empty body".into()));
        }
        let raw: Raw =
            serde_json::from_slice(answer).map_err(|e| unreadable(format!("the message: {e}")))?;
        let text = raw.body.unwrap_or_default();
        let body = if raw.message_type == "RunnerScaleSetJobMessages" {
            let jobs = if text.trim().is_empty() {
                Vec::new()
            } else {
                serde_json::from_str(&text)
                    .map_err(|e| unreadable(format!("the message's body: {e}")))?
            };
            MessageBody::Jobs(jobs)
        } else {
            tracing::warn!(
                message_type = raw.message_type,
                message_id = raw.message_id,
                "a scale-set message of a type rm does not know"
            );
            MessageBody::Unknown {
                message_type: raw.message_type,
                body: text,
            }
        };
        Ok(Some(Message {
            id: raw.message_id,
            statistics: raw.statistics,
            body,
        }))
    }

    /// Acknowledges (deletes) message `message_id`; one deleted already
    /// (`404 MessageNotFoundException`) is acknowledged too. Any other `404` is
    /// [`ScaleSetError::SessionGone`] (or [`ScaleSetError::ScaleSetNotFound`] when its type
    /// name says so): the message comes again after a new session, and the caller's journal
    /// recognises it.
    pub async fn delete_message(
        &self,
        session: &mut Session,
        message_id: u64,
    ) -> Result<(), ScaleSetError> {
        const ENDPOINT: &str = MESSAGE_DELETE;
        let url = with_segment(&session.message_queue_url, &message_id.to_string());
        match self
            .queue_call(
                session,
                Request {
                    endpoint: ENDPOINT,
                    method: Method::DELETE,
                    url,
                    authorization: String::new(),
                    body: None,
                    max_capacity: None,
                    timeout: CALL_TIMEOUT,
                },
            )
            .await
        {
            Ok(_) | Err(ScaleSetError::Service { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Acquires the jobs of `runner_request_ids` (with the queue token); the ids acquired. A
    /// `404` is [`ScaleSetError::SessionGone`], as on the poll.
    pub async fn acquire_jobs(
        &self,
        session: &mut Session,
        runner_request_ids: &[i64],
    ) -> Result<Vec<i64>, ScaleSetError> {
        const ENDPOINT: &str = ACQUIRE;
        #[derive(Deserialize)]
        struct Acquired {
            #[serde(default)]
            value: Vec<i64>,
        }
        let base = self.admin().await?.url;
        let url = with_query(
            &format!(
                "{}/_apis/runtime/runnerscalesets/{}/acquirejobs",
                base.trim_end_matches('/'),
                session.scale_set_id
            ),
            API_VERSION,
        );
        let body = json!(runner_request_ids);
        let (_, answer) = self
            .queue_call(
                session,
                Request {
                    endpoint: ENDPOINT,
                    method: Method::POST,
                    url,
                    authorization: String::new(),
                    body: Some(&body),
                    max_capacity: None,
                    timeout: CALL_TIMEOUT,
                },
            )
            .await?;
        Ok(decode::<Acquired>(ENDPOINT, &answer)?.value)
    }

    /// A JIT configuration for a new runner `name` of scale set `scale_set_id`. A name taken
    /// is [`ScaleSetError::AgentExists`].
    pub async fn generate_jit_config(
        &self,
        scale_set_id: u64,
        name: &str,
        work_folder: &str,
    ) -> Result<ScaleSetJit, ScaleSetError> {
        const ENDPOINT: &str = "runnerscalesets.generatejitconfig";
        #[derive(Deserialize)]
        struct Runner {
            id: u64,
            name: String,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Jit {
            runner: Runner,
            #[serde(rename = "encodedJITConfig")]
            encoded_jit_config: SecretString,
        }
        let body = json!({"name": name, "workFolder": work_folder});
        let path = format!("_apis/runtime/runnerscalesets/{scale_set_id}/generatejitconfig");
        let (_, answer) = self
            .admin_call(ENDPOINT, Method::POST, &path, Some(&body))
            .await?;
        let jit: Jit = decode(ENDPOINT, &answer)?;
        Ok(ScaleSetJit {
            runner_id: jit.runner.id,
            runner_name: jit.runner.name,
            encoded_jit_config: jit.encoded_jit_config,
        })
    }

    /// The runner named `name`, of this scale set or another (its `scale_set_id` says
    /// which; 0 for none): what to look at before removing a runner whose JIT configuration
    /// was lost (§1.12, ARC's recovery from `AgentExistsException`).
    pub async fn find_runner(&self, name: &str) -> Result<Option<ScaleSetRunner>, ScaleSetError> {
        const ENDPOINT: &str = "agents.find";
        #[derive(Deserialize)]
        struct List {
            #[serde(default)]
            value: Vec<ScaleSetRunner>,
        }
        let path = format!(
            "_apis/distributedtask/pools/0/agents?agentName={}",
            percent_encode(name)
        );
        let (_, body) = self.admin_call(ENDPOINT, Method::GET, &path, None).await?;
        let list: List = decode(ENDPOINT, &body)?;
        Ok(list.value.into_iter().find(|r| r.name == name))
    }

    /// Runner `runner_id`, `None` when the service does not know it.
    pub async fn get_runner(
        &self,
        runner_id: u64,
    ) -> Result<Option<ScaleSetRunner>, ScaleSetError> {
        const ENDPOINT: &str = "agents.get";
        let path = format!("_apis/distributedtask/pools/0/agents/{runner_id}");
        match self.admin_call(ENDPOINT, Method::GET, &path, None).await {
            Ok((_, body)) => Ok(Some(decode(ENDPOINT, &body)?)),
            Err(ScaleSetError::Service { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes runner `runner_id`; one already gone (`204` or `404`) is removed too. A runner
    /// holding a job is [`ScaleSetError::JobStillRunning`], whatever the status.
    pub async fn remove_runner(&self, runner_id: u64) -> Result<(), ScaleSetError> {
        const ENDPOINT: &str = "agents.remove";
        let path = format!("_apis/distributedtask/pools/0/agents/{runner_id}");
        match self.admin_call(ENDPOINT, Method::DELETE, &path, None).await {
            Ok(_) | Err(ScaleSetError::Service { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_enterprise_registration_token_asks_for_github_s_media_type() {
        assert_eq!(
            accept(ENTERPRISE_TOKEN_ENDPOINT),
            "application/vnd.github+json"
        );
        for endpoint in ["actions.runner_registration", "scalesets.message.get"] {
            assert_eq!(
                accept(endpoint),
                "application/json; api-version=6.0-preview"
            );
        }
    }

    #[test]
    fn an_enterprise_credential_never_shows_its_token() {
        let credential = Credential::EnterprisePat {
            slug: "octo".into(),
            token: SecretString::from("ghp_secret123"),
        };
        let shown = format!("{credential:?}");
        assert!(shown.contains("octo") && !shown.contains("ghp_"), "{shown}");
        assert_eq!(
            rest_message(br#"{"message":"Bad credentials"}"#),
            "Bad credentials"
        );
    }

    #[test]
    fn urls_keep_the_queue_query() {
        assert_eq!(
            with_segment("https://b/scalesets/message?scaleSetId=3", "17"),
            "https://b/scalesets/message/17?scaleSetId=3"
        );
        assert_eq!(with_segment("https://b/m/", "17"), "https://b/m/17");
        assert_eq!(with_query("https://b/m", "a=1"), "https://b/m?a=1");
        assert_eq!(with_query("https://b/m?x=2", "a=1"), "https://b/m?x=2&a=1");
    }

    /// The kind of error an answer is, as a word for the table below.
    fn kind(error: &ScaleSetError) -> String {
        match error {
            ScaleSetError::SessionConflict { .. } => "conflict".into(),
            ScaleSetError::SessionGone { .. } => "session gone".into(),
            ScaleSetError::ScaleSetNotFound { .. } => "set gone".into(),
            ScaleSetError::AgentExists { .. } => "agent exists".into(),
            ScaleSetError::JobStillRunning { .. } => "still running".into(),
            ScaleSetError::Unauthorized { .. } => "unauthorized".into(),
            ScaleSetError::Service { status, .. } => format!("service {status}"),
            other => format!("{other:?}"),
        }
    }

    /// Status first, the type name refining: (endpoint, status, body, the error).
    #[test]
    fn answers_are_read_by_status_first_then_type_name() {
        let named = |name: &str| format!(r#"{{"typeName":"{name}","message":"m"}}"#);
        let conflict = named("GitHub.Actions.RunnerScaleSetSessionConflictException, x");
        let other = named("GitHub.Actions.SomethingElseException");
        let set_gone = named("GitHub.Actions.RunnerScaleSetNotFoundException");
        let admin = named("RunnerAdminException");
        let message_gone = named("MessageNotFoundException");
        let agent = named("AgentExistsException");
        let busy = named("GitHub.DistributedTask.WebApi.JobStillRunningException");
        let mut bom = BOM.to_vec();
        bom.extend_from_slice(agent.as_bytes());
        let rows: Vec<(&str, u16, &[u8], &str)> = vec![
            // A session exists, whatever the name, or none.
            (SESSION_CREATE, 409, conflict.as_bytes(), "conflict"),
            (SESSION_CREATE, 409, other.as_bytes(), "conflict"),
            (SESSION_CREATE, 409, b"", "conflict"),
            (SESSION_CREATE, 409, b"plain text", "conflict"),
            // The name alone still says it, on another status.
            ("e", 400, conflict.as_bytes(), "conflict"),
            // Our session gone: a 404 on its endpoints, named or not.
            (MESSAGE_GET, 404, b"", "session gone"),
            (MESSAGE_GET, 404, other.as_bytes(), "session gone"),
            (MESSAGE_DELETE, 404, b"", "session gone"),
            (MESSAGE_DELETE, 404, other.as_bytes(), "session gone"),
            // ... but a message not found is the message deleted already.
            (MESSAGE_DELETE, 404, message_gone.as_bytes(), "service 404"),
            (ACQUIRE, 404, b"", "session gone"),
            (SESSION_REFRESH, 404, admin.as_bytes(), "session gone"),
            // ... unless the name says the scale set is.
            (MESSAGE_GET, 404, set_gone.as_bytes(), "set gone"),
            (MESSAGE_DELETE, 404, set_gone.as_bytes(), "set gone"),
            // The scale set gone: a bare (or unknown) 404 on the set itself.
            (SESSION_CREATE, 404, b"", "set gone"),
            (SESSION_CREATE, 404, other.as_bytes(), "set gone"),
            (SCALE_SET_FIND, 404, b"", "set gone"),
            (SESSION_CREATE, 409, set_gone.as_bytes(), "set gone"),
            // 401 is the credential, whatever the endpoint.
            (MESSAGE_GET, 401, b"", "unauthorized"),
            (SESSION_CREATE, 401, other.as_bytes(), "unauthorized"),
            // The names that refine a status with no meaning of its own there.
            (
                "runnerscalesets.generatejitconfig",
                409,
                &bom,
                "agent exists",
            ),
            ("agents.remove", 400, busy.as_bytes(), "still running"),
            ("agents.remove", 409, busy.as_bytes(), "still running"),
            // Anything else keeps its status, for the rules to judge.
            ("e", 409, b"plain text", "service 409"),
            (MESSAGE_GET, 409, b"", "service 409"),
            ("runnerscalesets.generatejitconfig", 404, b"", "service 404"),
            (MESSAGE_GET, 400, other.as_bytes(), "service 400"),
            (SESSION_CREATE, 403, b"", "service 403"),
            (MESSAGE_GET, 503, b"", "service 503"),
        ];
        for (endpoint, status, body, expected) in rows {
            let status = StatusCode::from_u16(status).expect("a status");
            let error = service_error(endpoint, status, body);
            assert_eq!(kind(&error), expected, "{status} on {endpoint}: {error:?}");
        }
        // An unnamed answer says what it was; a named one, its name.
        let unnamed = service_error(SESSION_CREATE, StatusCode::CONFLICT, b"busy");
        assert!(unnamed.to_string().ends_with("busy"), "{unnamed}");
        let renamed = service_error(SESSION_CREATE, StatusCode::CONFLICT, other.as_bytes());
        assert!(
            renamed.to_string().contains("SomethingElseException"),
            "{renamed}"
        );
    }

    #[test]
    fn the_user_agent_names_the_subsystem_and_the_scale_set() {
        assert_eq!(subsystem("scalesets.message.get"), "listener");
        assert_eq!(subsystem("runnerscalesets.sessions.create"), "listener");
        assert_eq!(subsystem("runnerscalesets.acquirejobs"), "listener");
        assert_eq!(subsystem("runnerscalesets.generatejitconfig"), "agent");
        assert_eq!(subsystem("agents.remove"), "agent");
        assert_eq!(
            scale_set_of("https://b/rest/_apis/runtime/runnerscalesets/12/sessions"),
            Some(12)
        );
        assert_eq!(
            scale_set_of("https://b/scalesets/message?scaleSetId=7&x=1"),
            Some(7)
        );
        assert_eq!(
            scale_set_of("https://b/rest/_apis/runtime/runnerscalesets?name=x"),
            None
        );
    }

    #[test]
    fn the_admin_token_expiry_is_its_exp_whatever_its_alg() {
        let at = Some(from_unix_secs(1_700_000_000));
        // (the token, its expiry): header . payload . signature
        let rows = [
            // {"alg":"HS256"} . {"exp":1700000000} . sig
            ("eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjE3MDAwMDAwMDB9.c2ln", at),
            // {"alg":"none","typ":"JWT"} . {"exp":1700000000} . (no signature)
            (
                "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJleHAiOjE3MDAwMDAwMDB9.",
                at,
            ),
            // {"alg":"whatever"} . {"exp":1700000000}, padded . sig
            (
                "eyJhbGciOiJ3aGF0ZXZlciJ9.eyJleHAiOjE3MDAwMDAwMDB9==.c2ln",
                at,
            ),
            // {"alg":"RS256"} . {"sub":"a","exp":1700000000.5,"x":"?>"} (url-safe `-`, `_`)
            (
                "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIiwiZXhwIjoxNzAwMDAwMDAwLjUsIngiOiI_PiJ9.c2ln",
                at,
            ),
            // {"alg":"none"} . {"sub":"a"}: no exp
            ("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.", None),
            // {"alg":"none"} . {"exp":"soon"}
            ("eyJhbGciOiJub25lIn0.eyJleHAiOiJzb29uIn0.", None),
            ("eyJhbGciOiJub25lIn0.not*base64.", None),
            ("not a jwt", None),
            ("", None),
        ];
        for (token, expiry) in rows {
            assert_eq!(jwt_expiry(token), expiry, "{token}");
        }
    }

    #[test]
    fn base64url_decodes_both_alphabets_and_refuses_other_characters() {
        assert_eq!(base64url("").as_deref(), Some(&b""[..]));
        assert_eq!(base64url("Zg").as_deref(), Some(&b"f"[..]));
        assert_eq!(base64url("Zm8=").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64url("Zm9v").as_deref(), Some(&b"foo"[..]));
        assert_eq!(base64url("-_-_").as_deref(), Some(&[0xfb, 0xff, 0xbf][..]));
        assert_eq!(base64url("+/+/").as_deref(), Some(&[0xfb, 0xff, 0xbf][..]));
        assert_eq!(base64url("Zm 9v"), None);
    }
}
