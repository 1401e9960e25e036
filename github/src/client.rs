//! The REST client: one octocrab transport, the App's credentials, the token cache, the shared
//! budget and the ETag cache, and every endpoint rm calls. Each request passes the budget
//! before it leaves, and its answer (headers, status) goes back into the budget before the
//! caller sees it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use octocrab::Octocrab;
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::auth::{AppCredentials, InstallationToken, TokenCache};
use crate::budget::{Budget, BudgetSnapshot, Scope};
use crate::error::{GithubError, RateHeaders, classify};
use crate::etag::EtagCache;
use crate::stats::{Contact, Stats};
use crate::target::Target;
use crate::wire::parse_rfc3339;
use rm_vocab::{Clock, SystemClock};

/// How long one request may take, from sending to the last byte of the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Items per page for every list (GitHub's maximum).
pub const PER_PAGE: usize = 100;
/// Most pages read from one list in one call; beyond it the list is truncated.
pub const MAX_PAGES: u32 = 10;
/// The REST API version rm is written against.
pub const API_VERSION: &str = "2022-11-28";
/// The media type GitHub's REST API answers JSON in.
pub(crate) const GITHUB_JSON: &str = "application/vnd.github+json";

/// How long an App found not installed on a target (a `404` from its installation lookup) is
/// left out of that target's registrations before it is asked again: an operator who installs
/// it later sees it take a share within this time, without a restart.
pub const ABSENT_RECHECK: Duration = Duration::from_secs(10 * 60);

/// One more App beside the primary: its id and private key.
#[derive(Clone)]
pub struct AppKey {
    pub app_id: u64,
    pub private_key_pem: SecretString,
}

impl std::fmt::Debug for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppKey")
            .field("app_id", &self.app_id)
            .field("private_key_pem", &"<redacted>")
            .finish()
    }
}

/// What the client needs to know.
#[derive(Clone)]
pub struct ClientConfig {
    /// `https://api.github.com`, or a GHES base such as `https://ghe.example.com/api/v3`.
    pub api_url: String,
    /// The primary App: it reads webhook deliveries and makes every request that is not a JIT
    /// registration.
    pub app_id: u64,
    pub private_key_pem: SecretString,
    /// Further Apps installed on the same targets: JIT registrations are spread over every
    /// App's installation (GitHub limits each installation's registrations a minute), nothing
    /// else uses them.
    pub more_apps: Vec<AppKey>,
    pub request_timeout: Duration,
    /// How requests of one installation are paced: inside GitHub's documented secondary limits
    /// by default.
    pub pacing: crate::pacing::Pacing,
    /// The longest a request sleeps in the budget for room in a pacing window
    /// ([`crate::budget::PACING_WAIT_MAX`]); a longer wait is refused with its time. Zero
    /// refuses every wait (a test on a manual clock schedules them itself).
    pub pacing_wait_max: Duration,
}

impl ClientConfig {
    /// A configuration with GitHub's defaults for the timeout and the pacing.
    pub fn new(api_url: impl Into<String>, app_id: u64, private_key_pem: SecretString) -> Self {
        Self {
            api_url: api_url.into(),
            app_id,
            private_key_pem,
            more_apps: Vec::new(),
            request_timeout: REQUEST_TIMEOUT,
            pacing: crate::pacing::Pacing::default(),
            pacing_wait_max: crate::budget::PACING_WAIT_MAX,
        }
    }
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("api_url", &self.api_url)
            .field("app_id", &self.app_id)
            .field("private_key_pem", &"<redacted>")
            .field("more_apps", &self.more_apps)
            .field("request_timeout", &self.request_timeout)
            .field("pacing", &self.pacing)
            .field("pacing_wait_max", &self.pacing_wait_max)
            .finish()
    }
}

/// A polled list, and whether GitHub said it had not changed since the last poll (a `304` that
/// cost no quota; the value is then the cached one).
#[derive(Debug, Clone, PartialEq)]
pub struct Polled<T> {
    pub value: T,
    pub not_modified: bool,
}

/// Who a request speaks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Auth {
    /// The App of this id, with its JWT.
    App(u64),
    Installation(u64),
}

impl Auth {
    fn scope(self) -> Scope {
        match self {
            Auth::App(id) => Scope::App(id),
            Auth::Installation(id) => Scope::Installation(id),
        }
    }
}

/// One request to make.
pub(crate) struct Call {
    pub(crate) endpoint: &'static str,
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) body: Option<Value>,
    pub(crate) auth: Auth,
    /// Send `If-None-Match` and answer a `304` from the cache.
    pub(crate) conditional: bool,
    /// Whether GitHub counts this request against the primary limit.
    pub(crate) charged: bool,
    /// The media type asked for: [`GITHUB_JSON`] but where an endpoint offers a lighter one
    /// (a commit's bare SHA, `application/vnd.github.sha`).
    pub(crate) accept: &'static str,
    /// Whether a redirect (3xx) is the answer, its `Location` in the headers: an archive
    /// download's first hop, which GitHub answers with a redirect to codeload.
    pub(crate) redirect: bool,
}

impl Call {
    pub(crate) fn get(endpoint: &'static str, auth: Auth, path: String) -> Self {
        Call {
            endpoint,
            method: Method::GET,
            path,
            body: None,
            auth,
            conditional: false,
            charged: true,
            accept: GITHUB_JSON,
            redirect: false,
        }
    }
}

/// A successful answer.
pub(crate) struct Answer {
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) not_modified: bool,
}

/// What the client knows of the Apps' installations.
#[derive(Debug, Default)]
pub(crate) struct Installations {
    /// The installation of an App (its id) covering a target.
    pub(crate) by_target: HashMap<(u64, Target), u64>,
    /// The App each installation known to the client belongs to: its tokens are minted with
    /// that App's JWT.
    pub(crate) app_of: HashMap<u64, u64>,
    /// Apps GitHub said are not installed on a target (`404`), and when it said so.
    pub(crate) absent: HashMap<(u64, Target), SystemTime>,
    /// The (App, target) pairs already logged as not installed: logged once, not per launch.
    pub(crate) absence_logged: HashSet<(u64, Target)>,
}

pub(crate) struct Inner {
    pub(crate) octo: Octocrab,
    /// Every App, the primary first.
    pub(crate) apps: Vec<AppCredentials>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) tokens: TokenCache,
    /// Held while an installation token is minted.
    pub(crate) minting: tokio::sync::Mutex<()>,
    pub(crate) installations: Mutex<Installations>,
    pub(crate) budget: Budget,
    pub(crate) etags: EtagCache,
    pub(crate) stats: Stats,
    pub(crate) timeout: Duration,
}

impl Inner {
    /// Now, on the client's clock, as the time its budget windows, token expiries and rate-limit
    /// resets are kept in: they are `SystemTime` plus GitHub's `Duration`s and whole seconds
    /// (`retry-after`, `x-ratelimit-reset`, JWT claims), so the clock's `UnixMs` is converted
    /// here, once, rather than at every reading.
    pub(crate) fn now(&self) -> SystemTime {
        self.clock.now().to_system_time()
    }
}

/// The GitHub client. Cloning shares everything: the budget, tokens and ETags are per process.
#[derive(Clone)]
pub struct GithubClient {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for GithubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubClient")
            .field("app_ids", &self.app_ids())
            .finish_non_exhaustive()
    }
}

fn join_err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

impl GithubClient {
    /// A client on the real clock.
    pub fn new(config: ClientConfig) -> anyhow::Result<Self> {
        Self::with_clock(config, Arc::new(SystemClock))
    }

    /// A client reading the time from `clock` (tests pass an [`rm_vocab::ManualClock`]).
    pub fn with_clock(config: ClientConfig, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let mut apps = vec![AppCredentials::new(config.app_id, &config.private_key_pem)?];
        for more in &config.more_apps {
            let creds = AppCredentials::new(more.app_id, &more.private_key_pem)
                .with_context(|| format!("App {}", more.app_id))?;
            apps.push(creds);
        }
        let base = config.api_url.trim_end_matches('/').to_owned();
        let octo = Octocrab::builder()
            .base_uri(base.as_str())
            .map_err(join_err)
            .with_context(|| format!("github.api_url {base:?} is not a URL"))?
            .build()
            .map_err(join_err)
            .context("cannot build the HTTP client")?;
        Ok(Self {
            inner: Arc::new(Inner {
                octo,
                apps,
                clock,
                tokens: TokenCache::default(),
                minting: tokio::sync::Mutex::new(()),
                installations: Mutex::new(Installations::default()),
                budget: Budget::with_wait_max(config.pacing, config.pacing_wait_max),
                etags: EtagCache::default(),
                stats: Stats::default(),
                timeout: config.request_timeout,
            }),
        })
    }

    /// Whether GitHub answers, and when it last did.
    pub fn contact(&self) -> Contact {
        self.inner.stats.contact()
    }

    /// Requests so far by endpoint name and status (`0`: no answer), for `/metrics`.
    pub fn request_counts(&self) -> Vec<(&'static str, u16, u64)> {
        self.inner.stats.requests()
    }

    /// JIT registrations issued so far, `(app, installation, count)`, for `status` and
    /// `/metrics`.
    pub fn registration_counts(&self) -> Vec<(u64, u64, u64)> {
        self.inner.stats.registrations()
    }

    /// The budget's view of every scope and resource, for `status` and `/metrics`.
    pub fn budget(&self) -> Vec<BudgetSnapshot> {
        self.inner.budget.snapshot(self.inner.now())
    }

    /// Every App's id, the primary first.
    pub fn app_ids(&self) -> Vec<u64> {
        self.inner.apps.iter().map(AppCredentials::app_id).collect()
    }

    /// The primary App's id.
    pub fn primary_app(&self) -> u64 {
        self.inner.apps.first().map_or(0, AppCredentials::app_id)
    }

    /// The App `installation` belongs to, when the client has looked it up (else `None`; such
    /// an installation is taken as the primary App's).
    pub fn app_of(&self, installation: u64) -> Option<u64> {
        self.known().app_of.get(&installation).copied()
    }

    pub(crate) fn known(&self) -> std::sync::MutexGuard<'_, Installations> {
        self.inner
            .installations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The primary App's JWT.
    pub(crate) fn primary(&self) -> Auth {
        Auth::App(self.primary_app())
    }

    async fn authorization(&self, auth: Auth, fresh: bool) -> Result<SecretString, GithubError> {
        let now = self.inner.now();
        match auth {
            Auth::App(app_id) => {
                let creds = self
                    .inner
                    .apps
                    .iter()
                    .find(|a| a.app_id() == app_id)
                    .ok_or_else(|| GithubError::Unauthorized {
                        message: format!("App {app_id} is not configured"),
                    })?;
                creds.jwt(now).map_err(|e| GithubError::Unauthorized {
                    message: e.to_string(),
                })
            }
            Auth::Installation(id) => {
                if !fresh && let Some(token) = self.inner.tokens.get(id, now) {
                    return Ok(token);
                }
                // One mint at a time: callers that queued here find the new token cached.
                let _minting = self.inner.minting.lock().await;
                if !fresh && let Some(token) = self.inner.tokens.get(id, self.inner.now()) {
                    return Ok(token);
                }
                // Boxed: minting a token is itself a (JWT) request through `send`.
                match Box::pin(self.create_installation_token(id)).await {
                    Ok(token) => {
                        self.inner.tokens.put(id, token.clone());
                        Ok(token.token)
                    }
                    Err(e @ GithubError::NotFound { .. }) => {
                        // The App was uninstalled (perhaps reinstalled under a new id): look the
                        // installation up again next time.
                        self.forget_installation(id);
                        Err(e)
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// `POST /app/installations/{id}/access_tokens`: a new token (bypassing the cache), signed
    /// by the JWT of the App the installation belongs to.
    pub async fn create_installation_token(
        &self,
        installation: u64,
    ) -> Result<InstallationToken, GithubError> {
        let app = self
            .app_of(installation)
            .unwrap_or_else(|| self.primary_app());
        #[derive(serde::Deserialize)]
        struct Token {
            token: SecretString,
            expires_at: String,
        }
        let call = Call {
            endpoint: "app.access_tokens",
            method: Method::POST,
            path: format!("/app/installations/{installation}/access_tokens"),
            body: None,
            auth: Auth::App(app),
            conditional: false,
            charged: true,
            accept: GITHUB_JSON,
            redirect: false,
        };
        let answer = self.send(&call, false).await?;
        let t: Token = decode(call.endpoint, &answer.body)?;
        let expires_at = parse_rfc3339(&t.expires_at).ok_or_else(|| GithubError::Unexpected {
            endpoint: call.endpoint,
            status: 201,
            message: format!("expires_at {:?} is not a timestamp", t.expires_at),
        })?;
        Ok(InstallationToken {
            token: t.token,
            expires_at,
        })
    }

    /// Sends a call; an installation token GitHub refuses is dropped and replaced once.
    pub(crate) async fn run(&self, call: &Call) -> Result<Answer, GithubError> {
        match self.send(call, false).await {
            Err(GithubError::Unauthorized { .. }) if matches!(call.auth, Auth::Installation(_)) => {
                if let Auth::Installation(id) = call.auth {
                    self.inner.tokens.invalidate(id);
                }
                self.send(call, true).await
            }
            other => other,
        }
    }

    async fn send(&self, call: &Call, fresh_token: bool) -> Result<Answer, GithubError> {
        let inner = &self.inner;
        let scope = call.auth.scope();
        let cost = crate::pacing::Cost::of_method(&call.method);
        // A request that cannot leave must not spend a token request either.
        inner
            .budget
            .check(scope, call.endpoint, cost, inner.now())?;
        let credential = self.authorization(call.auth, fresh_token).await?;
        let permit = inner
            .budget
            .acquire(scope, call.endpoint, cost, inner.now())
            .await?;

        let mut bearer = HeaderValue::from_str(&format!("Bearer {}", credential.expose_secret()))
            .map_err(|_| GithubError::Unauthorized {
            message: "the credential is not a valid header value".into(),
        })?;
        bearer.set_sensitive(true);
        let mut builder = http::Request::builder()
            .method(call.method.clone())
            .uri(call.path.as_str())
            .header(header::AUTHORIZATION, bearer)
            .header(header::ACCEPT, call.accept);
        let cached_etag = call
            .conditional
            .then(|| inner.etags.etag(scope, &call.path))
            .flatten();
        if let Some(etag) = &cached_etag {
            builder = builder.header(header::IF_NONE_MATCH, etag.as_str());
        }
        let unreachable = |reason: String| GithubError::Unreachable {
            endpoint: call.endpoint,
            reason,
        };
        let request = inner
            .octo
            .build_request(builder, call.body.as_ref())
            .map_err(|e| unreachable(format!("cannot build the request: {e}")))?;

        let exchange = async {
            let response = inner
                .octo
                .execute(request)
                .await
                .map_err(|e| e.to_string())?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((parts, body))
        };
        let (parts, body) = match tokio::time::timeout(inner.timeout, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(reason)) => {
                inner.stats.unanswered(call.endpoint);
                return Err(unreachable(reason));
            }
            Err(_) => {
                inner.stats.unanswered(call.endpoint);
                return Err(unreachable(format!("no answer within {:?}", inner.timeout)));
            }
        };

        let now = inner.now();
        let rate = RateHeaders::parse(&parts.headers);
        let status = parts.status;
        inner.stats.answered(call.endpoint, status.as_u16(), now);
        // Endpoint names and numbers only: paths can carry names, never credentials, but the
        // log has no need for them.
        tracing::debug!(
            endpoint = call.endpoint,
            status = status.as_u16(),
            remaining = rate.remaining,
            resource = rate.resource.as_deref(),
            "github request"
        );
        if status == StatusCode::NOT_MODIFIED
            && let Some(cached) = inner.etags.body(scope, &call.path)
        {
            inner.budget.record(permit, false, &rate, None, now);
            return Ok(Answer {
                headers: parts.headers,
                body: cached,
                not_modified: true,
            });
        }
        let redirected =
            call.redirect && status.is_redirection() && status != StatusCode::NOT_MODIFIED;
        if status.is_success() || redirected {
            inner.budget.record(permit, call.charged, &rate, None, now);
            if call.conditional
                && let Some(etag) = parts
                    .headers
                    .get(header::ETAG)
                    .and_then(|v| v.to_str().ok())
            {
                inner
                    .etags
                    .store(scope, &call.path, etag.to_owned(), body.clone());
            }
            return Ok(Answer {
                headers: parts.headers,
                body,
                not_modified: false,
            });
        }
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default();
        let error = classify(call.endpoint, status, &parts.headers, &message, now);
        let limited = match &error {
            GithubError::RateLimited { kind, retry_at, .. } => {
                tracing::warn!(endpoint = call.endpoint, %kind, "GitHub rate limit: holding requests");
                Some((*kind, *retry_at))
            }
            _ => None,
        };
        inner
            .budget
            .record(permit, call.charged, &rate, limited, now);
        Err(error)
    }

    pub(crate) async fn get_json<T: DeserializeOwned>(&self, call: Call) -> Result<T, GithubError> {
        let answer = self.run(&call).await?;
        decode(call.endpoint, &answer.body)
    }

    /// Reads every page (up to [`MAX_PAGES`]) of a list whose items sit under `field`.
    pub(crate) async fn list<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        auth: Auth,
        path: &str,
        query: &str,
        field: &str,
    ) -> Result<Polled<Vec<T>>, GithubError> {
        let mut items = Vec::new();
        let mut not_modified = true;
        for page in 1..=MAX_PAGES {
            let sep = if query.is_empty() { "" } else { "&" };
            let call = Call {
                conditional: true,
                ..Call::get(
                    endpoint,
                    auth,
                    format!("{path}?{query}{sep}per_page={PER_PAGE}&page={page}"),
                )
            };
            let answer = self.run(&call).await?;
            not_modified &= answer.not_modified;
            let mut value: Value = decode(endpoint, &answer.body)?;
            let (batch, listed) = decode_items(endpoint, value.get_mut(field).map(Value::take))?;
            // Counted as GitHub listed them: a skipped object must not end the paging.
            let full = listed == PER_PAGE;
            items.extend(batch);
            if !full {
                break;
            }
        }
        Ok(Polled {
            value: items,
            not_modified,
        })
    }

    /// Forgets which targets `installation` covers, so the next call looks them up again.
    pub fn forget_installation(&self, installation: u64) {
        // Which App it belonged to stays known (installation ids are never reused): a token
        // asked for it again is still asked with its own App's JWT.
        self.known().by_target.retain(|_, id| *id != installation);
        self.inner.tokens.invalidate(installation);
    }

    pub(crate) async fn installation_of(&self, target: &Target) -> Result<Auth, GithubError> {
        self.installation_for(target).await.map(Auth::Installation)
    }
}

pub(crate) fn decode<T: DeserializeOwned>(
    endpoint: &'static str,
    body: &[u8],
) -> Result<T, GithubError> {
    serde_json::from_slice(body).map_err(|e| GithubError::Unexpected {
        endpoint,
        status: 200,
        message: format!("cannot read the answer: {e}"),
    })
}

/// A list's objects, each read on its own: one that lacks a field rm needs (or has it null or of
/// another type) is skipped with a warning naming it, instead of making the whole answer, and
/// with it a whole polling target, unreadable. The types hold only what rm reads, so a field rm
/// does not use can never cause a skip. `Err` only when there is no list at all. Also returns
/// how many objects GitHub listed, for paging.
pub(crate) fn decode_items<T: DeserializeOwned>(
    endpoint: &'static str,
    value: Option<Value>,
) -> Result<(Vec<T>, usize), GithubError> {
    let list: Vec<Value> = decode_value(endpoint, value)?;
    let listed = list.len();
    let items = list
        .into_iter()
        .enumerate()
        .filter_map(|(index, object)| {
            let id = object
                .get("id")
                .map_or_else(String::new, ToString::to_string);
            match serde_json::from_value(object) {
                Ok(item) => Some(item),
                Err(err) => {
                    tracing::warn!(
                        endpoint,
                        index,
                        id = %id,
                        error = %err,
                        "GitHub listed an object without a field rm needs; skipped"
                    );
                    None
                }
            }
        })
        .collect();
    Ok((items, listed))
}

pub(crate) fn decode_value<T: DeserializeOwned>(
    endpoint: &'static str,
    value: Option<Value>,
) -> Result<T, GithubError> {
    serde_json::from_value(value.unwrap_or(Value::Null)).map_err(|e| GithubError::Unexpected {
        endpoint,
        status: 200,
        message: format!("cannot read the answer: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_debug_hides_the_key() {
        let c = ClientConfig {
            api_url: "http://x".into(),
            app_id: 1,
            private_key_pem: SecretString::from("-----BEGIN KEY-----secret"),
            more_apps: vec![AppKey {
                app_id: 2,
                private_key_pem: SecretString::from("-----BEGIN KEY-----other"),
            }],
            request_timeout: REQUEST_TIMEOUT,
            pacing: crate::pacing::Pacing::default(),
            pacing_wait_max: crate::budget::PACING_WAIT_MAX,
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("secret") && !shown.contains("other"));
        assert!(shown.contains("app_id: 2"));
    }

    /// A `GET .../actions/runs/{id}/jobs` page shaped as GitHub sends it (the OpenAPI's Job):
    /// one job with fields rm does not read null or missing, one without a field rm needs.
    const JOBS_PAGE: &str = r#"{"total_count": 3, "jobs": [
      {"id": 21, "run_id": 5, "run_url": "https://api.github.com/repos/acme/w/actions/runs/5",
       "run_attempt": 1, "node_id": "MDg6Q2hlY2tSdW40",
       "head_sha": "009b8a3a9ccbb128af87f9b1c0f4c62e8a304f6d",
       "url": "https://api.github.com/repos/acme/w/actions/jobs/21", "html_url": null,
       "status": "queued", "conclusion": null, "created_at": "2019-08-08T08:00:00-07:00",
       "started_at": "2019-08-08T08:00:00-07:00", "completed_at": null, "name": "build",
       "steps": [], "check_run_url": "https://api.github.com/repos/acme/w/check-runs/21",
       "labels": ["self-hosted", "linux"], "runner_id": null, "runner_name": null,
       "runner_group_id": null, "runner_group_name": null, "workflow_name": "CI",
       "head_branch": "main"},
      {"id": 22, "run_id": 5, "status": "queued", "name": "test",
       "created_at": "2019-08-08T08:00:00-07:00", "labels": ["self-hosted"],
       "head_sha": null, "started_at": null, "steps": null, "node_id": null, "url": null,
       "workflow_name": null, "run_attempt": null, "runner_group_id": "not a number"},
      {"id": 23, "run_id": 5, "status": "queued", "name": "lint",
       "created_at": "2019-08-08T08:00:00-07:00", "labels": null}
    ]}"#;

    #[test]
    fn a_null_or_missing_unused_field_costs_nothing_and_a_missing_needed_one_only_its_object() {
        let mut page: Value = serde_json::from_str(JOBS_PAGE).expect("JSON");
        let (jobs, listed) = decode_items::<crate::types::WorkflowJob>(
            "repos.actions.jobs",
            page.get_mut("jobs").map(Value::take),
        )
        .expect("the page is readable");
        assert_eq!(listed, 3, "paging counts what GitHub listed");
        let ids: Vec<i64> = jobs.iter().map(|j| j.id.get()).collect();
        // 22 has null or missing head_sha, started_at, steps, run_attempt, workflow_name and a
        // runner_group_id of another type: none of them is read. 23 has no labels: skipped.
        assert_eq!(ids, [21, 22]);
        assert_eq!(jobs[1].run_attempt, None);
        assert_eq!(jobs[1].labels, ["self-hosted"]);
        assert_eq!(jobs[0].workflow_name.as_deref(), Some("CI"));
    }

    #[test]
    fn a_list_that_is_not_there_is_still_unreadable() {
        let page: Value = serde_json::from_str(r#"{"total_count": 0}"#).expect("JSON");
        let missing = decode_items::<crate::types::WorkflowJob>(
            "repos.actions.jobs",
            page.get("jobs").cloned(),
        );
        assert!(matches!(missing, Err(GithubError::Unexpected { .. })));
    }

    #[test]
    fn runners_runs_repositories_and_deliveries_tolerate_nulls_they_do_not_read() {
        // The fields GitHub documents as nullable, or that rm does not read, set to null.
        let runner = r#"{"id": 1, "name": "rm-h-0123456789ab", "os": null, "status": "online",
            "busy": false, "ephemeral": null, "runner_group_id": null,
            "labels": [{"id": null, "name": "self-hosted", "type": null}]}"#;
        let run = r#"{"id": 5, "updated_at": "2024-01-01T00:00:00Z", "head_sha": null,
            "created_at": null, "status": null, "conclusion": null, "run_attempt": null,
            "name": null, "head_branch": null}"#;
        let repository = r#"{"id": null, "name": "w", "full_name": null, "private": null,
            "owner": {"login": "acme", "id": null}}"#;
        let delivery = r#"{"id": 9, "guid": "g", "delivered_at": "2024-01-01T00:00:00Z",
            "redelivery": null, "duration": null, "status": "OK", "status_code": 202,
            "event": "workflow_job", "action": null, "installation_id": null,
            "repository_id": null, "throttled_at": null}"#;
        assert_eq!(decoded::<crate::types::Runner>(runner), 1);
        assert_eq!(decoded::<crate::types::WorkflowRun>(run), 1);
        assert_eq!(decoded::<crate::types::Repository>(repository), 1);
        assert_eq!(decoded::<crate::types::HookDelivery>(delivery), 1);
    }

    /// How many objects of a one-object list decode as `T`.
    fn decoded<T: DeserializeOwned>(object: &str) -> usize {
        let list = Value::Array(vec![serde_json::from_str(object).expect("JSON")]);
        decode_items::<T>("x", Some(list)).expect("a list").0.len()
    }
}
