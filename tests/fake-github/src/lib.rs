//! rm-fake-github: a fake GitHub on loopback, faithful enough to test rm against, and the
//! simulated GitHub of `rm-agent demo`.
//!
//! It serves the REST subset rm uses (shaped as GitHub's own OpenAPI description says), checks
//! App JWTs and installation tokens, sends rate-limit headers from budgets a test controls,
//! answers conditional requests with `304`, holds repositories, runs, jobs and runners, and
//! sends signed `workflow_job` webhooks as jobs move. Runners registered through its JIT
//! configurations (see [`jit`]) take its queued jobs.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
//! let key = AppKeyPair::generate()?;
//! let fake = FakeGithub::start(FakeOptions::new(42, key.public_pem.clone())).await?;
//! fake.add_repo("acme/widgets");
//! let job = fake.queue_job("acme/widgets", "build", &["self-hosted", "linux"])?;
//! // point a client at fake.api_url() with app id 42 and key.private_pem
//! # Ok(()) }
//! ```

pub mod archives;
pub mod auth;
pub mod broker;
pub mod jit;
pub mod keys;
pub mod limits;
pub mod model;
pub mod releases;
pub mod render;
pub mod results;
pub mod routes;
pub mod runner_client;
pub mod server;
pub mod state;
pub mod time;
pub mod webhook;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use secrecy::SecretString;
use tokio::task::JoinHandle;

pub use jit::{CrashPoint, FakeJitConfig, RunnerBehavior};
pub use keys::AppKeyPair;
pub use limits::{ContentCounting, LimitStatus, SecondaryLimits};
pub use model::{
    Delivery, Job, JobOrigin, JobStatus, RequestKind, RequestRecord, Runner, RunnerScope,
};
pub use releases::ReleaseOptions;
pub use state::{FaultAction, signature};
pub use webhook::{Chaos, WebhookOrder};

use server::Shared;
use state::{Fault, Secondary, SecondaryTrigger, State, WebhookTarget};

/// How often the fake moves its state along its clock with no request to do it (finished
/// runners' lag, jobs given up for want of a lock renewal).
const TICK: Duration = Duration::from_millis(250);

/// Moves the state along its clock until the fake is dropped, as GitHub's does with no one
/// asking.
async fn tick(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(TICK).await;
        shared.with(|_| ());
    }
}

/// How long [`FakeGithub::settle`] waits for pending deliveries at most.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);
/// How often [`FakeGithub::settle`] looks.
const SETTLE_POLL: Duration = Duration::from_millis(10);

/// How to start the fake.
#[derive(Debug, Clone)]
pub struct FakeOptions {
    pub app_id: u64,
    /// The App's public key (PEM); JWTs must be signed by its private half.
    pub public_key_pem: String,
    /// Where the API lives below the server root: `""` like api.github.com, `"/api/v3"` like GHES.
    pub base_path: String,
    /// How webhooks are sent: by default delayed, reordered and duplicated from a seed
    /// ([`webhook::WebhookOrder::default_chaotic`]); in order only where a test says why.
    pub webhook_order: WebhookOrder,
    /// The secondary limits enforced per installation and per App JWT: GitHub's documented
    /// numbers ([`SecondaryLimits::GITHUB`]); lower only where a test says why.
    pub secondary_limits: SecondaryLimits,
    /// Whether the fake's own limit answers are 403 or 429: by default in turn, as GitHub may
    /// give either.
    pub limit_status: LimitStatus,
    /// `Some(limit)`: JIT registrations spend a primary bucket of their own,
    /// `x-ratelimit-resource: actions_runner_registration` with `limit` an hour
    /// ([`limits::REGISTRATION_LIMIT`] is GitHub's), answered 403/429 when spent. `None` (the
    /// default, which existing tests of the `core` quota rely on): they spend `core`.
    pub registration_limit: Option<u64>,
}

impl FakeOptions {
    pub fn new(app_id: u64, public_key_pem: String) -> Self {
        Self {
            app_id,
            public_key_pem,
            base_path: String::new(),
            webhook_order: WebhookOrder::default_chaotic(),
            secondary_limits: SecondaryLimits::GITHUB,
            limit_status: LimitStatus::default(),
            registration_limit: None,
        }
    }
}

/// A running fake GitHub. Dropping it stops the server and the webhook sender.
pub struct FakeGithub {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for FakeGithub {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl std::fmt::Debug for FakeGithub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeGithub")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeGithub {
    /// Starts the fake on an ephemeral loopback port.
    pub async fn start(options: FakeOptions) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the fake GitHub to a loopback port")?;
        let addr = listener.local_addr()?;
        let base_path = options.base_path.trim_end_matches('/').to_owned();
        let state = State::new(
            options.app_id,
            options.public_key_pem,
            format!("http://{addr}"),
            base_path,
        );
        if let WebhookOrder::Chaotic(chaos) = options.webhook_order {
            // Printed so a failing test's output names the plan it ran under.
            eprintln!(
                "rm-fake-github: webhooks delayed, reordered and duplicated with seed {seed} (replay: {env}={seed})",
                seed = chaos.seed,
                env = webhook::SEED_ENV
            );
        }
        let mut state = state;
        state.webhook_order = options.webhook_order;
        state.secondary_limits = options.secondary_limits;
        state.limit_status = options.limit_status;
        if let Some(limit) = options.registration_limit {
            state.set_registration_limit(limit);
        }
        if let WebhookOrder::Chaotic(chaos) = options.webhook_order {
            state.webhook_rng = webhook::Rng::new(chaos.seed);
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            outbox: tx,
        });
        let tasks = vec![
            tokio::spawn(server::serve(listener, shared.clone())),
            tokio::spawn(webhook::sender(shared.clone(), rx)),
            tokio::spawn(tick(shared.clone())),
        ];
        Ok(Self {
            shared,
            addr,
            tasks,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.shared.with(f)
    }

    /// The API root to give a client (`github.api_url`).
    pub fn api_url(&self) -> String {
        self.with(|s| s.api_url.clone())
    }

    /// The port the fake listens on (on the host's loopback): what an isolated runner, in a
    /// network namespace of its own, reaches through `host.network_host_ports`.
    pub fn port(&self) -> u16 {
        let url = self.server_url();
        url.rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("no port in {url}"))
    }

    /// The server root, without the API base path.
    pub fn server_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    // ---- accounts ----

    /// An organization with the App installed; returns the installation id.
    pub fn add_org(&self, login: &str) -> u64 {
        self.with(|s| s.ensure_installation(login, "Organization"))
    }

    /// A user account with the App installed; returns the installation id.
    pub fn add_user(&self, login: &str) -> u64 {
        self.with(|s| s.ensure_installation(login, "User"))
    }

    /// Another GitHub App, `app_id` with its own key pair (the public half here), beside the
    /// one the fake was started with: large organisations install several on the same
    /// targets to multiply JIT registrations. It is installed nowhere until
    /// [`Self::install_app`]; it sends no webhooks.
    pub fn add_app(&self, app_id: u64, public_key_pem: String) {
        self.with(|s| {
            s.more_apps.insert(app_id, public_key_pem);
        })
    }

    /// Installs App `app_id` (added by [`Self::add_app`]) on the account `login` (an
    /// organization or user the primary App is installed on): an installation of its own,
    /// covering every repository of the account, its tokens valid for it alone. Returns its id.
    pub fn install_app(&self, app_id: u64, login: &str) -> u64 {
        self.with(|s| s.install_app(app_id, login))
    }

    /// JIT registrations GitHub issued (`201` to `generate-jitconfig`), by the installation
    /// whose token asked.
    pub fn registrations_by_installation(&self) -> std::collections::BTreeMap<u64, usize> {
        let mut counts = std::collections::BTreeMap::new();
        self.with(|s| {
            for r in &s.requests {
                if let (true, 201, Some(auth::Caller::Installation(id))) =
                    (r.path.ends_with("/generate-jitconfig"), r.status, r.caller)
                {
                    *counts.entry(id).or_insert(0) += 1;
                }
            }
        });
        counts
    }

    /// A repository `owner/name` (its owner becomes an organization if unknown); returns its id.
    pub fn add_repo(&self, full_name: &str) -> u64 {
        let (owner, name) = full_name.split_once('/').unwrap_or((full_name, full_name));
        self.with(|s| {
            let kind = s.owner_type(owner);
            let kind = if s.installation_by_login(owner).is_some() {
                kind
            } else {
                "Organization".into()
            };
            s.add_repo(owner, name, &kind)
        })
    }

    /// Adds a runner group to an organization; returns its id.
    pub fn add_runner_group(&self, org: &str, name: &str) -> u64 {
        self.with(|s| {
            let id = s.next_id();
            s.runner_groups
                .entry(org.to_owned())
                .or_default()
                .push(model::RunnerGroup {
                    id,
                    name: name.to_owned(),
                    default: false,
                });
            id
        })
    }

    /// Replaces an installation's permissions (e.g. to make runner endpoints answer 403).
    pub fn set_permissions(&self, installation: u64, permissions: &[(&str, &str)]) {
        self.with(|s| {
            if let Some(i) = s.installations.get_mut(&installation) {
                i.permissions = permissions
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
            }
        })
    }

    /// Grants (or takes back) an installation's "Actions: Read and write": without it, as
    /// GitHub does, a re-run request is answered 403 "Resource not accessible by integration".
    /// A fresh installation has "Actions: Read" only (what rm needs without `rerun_on`).
    pub fn set_actions_write(&self, installation: u64, write: bool) {
        self.with(|s| {
            if let Some(i) = s.installations.get_mut(&installation) {
                let level = if write { "write" } else { "read" };
                i.permissions.insert("actions".into(), level.into());
            }
        })
    }

    /// Every re-run the fake did: `(job re-run, the new job)`, in order.
    pub fn reruns(&self) -> Vec<(u64, u64)> {
        self.with(|s| s.reruns.clone())
    }

    // ---- credentials and time ----

    /// How long new installation tokens live.
    pub fn set_token_ttl(&self, ttl: Duration) {
        self.with(|s| s.token_ttl = ttl)
    }

    /// Forgets every installation token issued so far (they answer 401 from now on).
    pub fn revoke_tokens(&self) {
        self.with(|s| s.tokens.clear())
    }

    /// Moves the fake's clock forward (token expiry, JWT checks, rate-limit windows).
    pub fn advance_clock(&self, by: Duration) {
        self.with(|s| s.clock_offset += by)
    }

    // ---- rate limits ----

    /// Sets the primary quota of every scope and resource to a fresh window of `limit`.
    pub fn set_rate_limit(&self, limit: u64) {
        self.with(|s| {
            s.default_limit = limit;
            s.quotas.clear();
        })
    }

    /// Spends every primary quota until `reset_in` from now (on the fake's clock).
    pub fn exhaust_rate_limit(&self, reset_in: Duration) {
        self.with(|s| {
            let until = s.now() + reset_in;
            s.exhausted.push((None, until));
        })
    }

    /// Spends one resource's quota (every scope) until `reset_in` from now.
    pub fn exhaust_resource(&self, resource: &str, reset_in: Duration) {
        self.with(|s| {
            let until = s.now() + reset_in;
            s.exhausted.push((Some(resource.to_owned()), until));
        })
    }

    /// Which `x-ratelimit-resource` `generate-jitconfig` spends (default `core`; GitHub staff
    /// have named `actions_runner_registration`).
    pub fn set_jit_resource(&self, resource: &str) {
        self.with(|s| s.jit_resource = resource.to_owned())
    }

    /// Gives JIT registrations their own primary bucket of `limit` an hour
    /// (`actions_runner_registration`), from a fresh window.
    pub fn set_registration_limit(&self, limit: u64) {
        self.with(|s| s.set_registration_limit(limit))
    }

    /// The registration bucket's quota of `installation` now: `(limit, remaining)`.
    pub fn registration_quota(&self, installation: u64) -> (u64, u64) {
        self.with(|s| {
            let q = s.quota(&installation.to_string(), limits::REGISTRATION_RESOURCE);
            (q.limit, q.remaining)
        })
    }

    /// Answers every API request with a secondary limit (`status` 403 or 429) for `duration`,
    /// with `retry-after` if `send_retry_after`.
    pub fn secondary_limit(&self, duration: Duration, status: u16, send_retry_after: bool) {
        self.with(|s| {
            s.secondary = Some(Secondary {
                until: s.now() + duration,
                status,
                send_retry_after,
                scope: None,
            })
        })
    }

    /// Arms a secondary limit for the middle of a burst: the next `requests` requests whose
    /// path (below the API base) contains `path_contains` are answered, and the one after trips
    /// a limit of `duration` on its own scope (installation or App), answered with `status`
    /// (403 or 429) and `retry-after` to every request of that scope until it lifts, as GitHub
    /// holds a client that tripped one.
    pub fn secondary_limit_after(
        &self,
        path_contains: &str,
        requests: u32,
        duration: Duration,
        status: u16,
    ) {
        self.with(|s| {
            s.secondary_trigger = Some(SecondaryTrigger {
                path_contains: path_contains.to_owned(),
                requests_left: requests,
                duration,
                status,
            })
        })
    }

    /// Replaces the secondary limits enforced from now on (what was sent stays counted).
    /// GitHub's numbers are the default: lower them only where a test says why.
    pub fn set_secondary_limits(&self, limits: SecondaryLimits) {
        self.with(|s| s.secondary_limits = limits)
    }

    /// Content creations (`POST`s) of `installation` (`None`: the App's JWT) in the last minute
    /// and the last hour, as the secondary limits count them.
    pub fn creations(&self, installation: Option<u64>) -> (u32, u32) {
        let caller = installation.map_or(auth::Caller::App, auth::Caller::Installation);
        self.with(|s| s.ledger.creations(caller, s.now()))
    }

    /// Whether the fake's own limit answers (primary quota, secondary windows) are 403, 429,
    /// or each in turn (the default).
    pub fn set_limit_status(&self, status: LimitStatus) {
        self.with(|s| s.limit_status = status)
    }

    // ---- faults ----

    /// The next `times` requests whose path (below the API base) contains `path_contains` (and
    /// whose method is `method`, if given) get `action` instead of an answer.
    pub fn inject_fault(
        &self,
        method: Option<&str>,
        path_contains: &str,
        action: FaultAction,
        times: usize,
    ) {
        self.with(|s| {
            s.faults.push(Fault {
                method: method.map(str::to_owned),
                path_contains: path_contains.to_owned(),
                action,
                times,
            })
        })
    }

    /// Withdraws every injected fault not yet used up (an outage ends).
    pub fn clear_faults(&self) {
        self.with(|s| s.faults.clear())
    }

    // ---- webhooks ----

    /// Where to send deliveries, and the secret to sign them with.
    pub fn set_webhook(&self, url: &str, secret: SecretString) {
        self.set_webhooks(&[url], secret);
    }

    /// Several receivers for one App webhook (a fleet's receivers behind DNS or a load
    /// balancer): each delivery, and each duplicate of one, goes to one of `urls`; in turn with
    /// [`WebhookOrder::InOrder`], else drawn from the printed webhook seed. Which one is in
    /// [`Delivery::url`].
    pub fn set_webhooks(&self, urls: &[&str], secret: SecretString) {
        self.with(|s| {
            s.webhook = Some(WebhookTarget {
                urls: urls.iter().map(|u| (*u).to_owned()).collect(),
                secret,
            })
        })
    }

    /// Redelivers an earlier delivery (`POST /app/hook/deliveries/{id}/attempts`, the App
    /// settings' "Redeliver"): a new attempt with the same GUID and body, sent as any other.
    /// Returns the new delivery's id (`None`: no such delivery).
    pub fn redeliver(&self, delivery_id: u64) -> Option<u64> {
        self.with(|s| s.redeliver(delivery_id))
    }

    /// How deliveries are sent from now on. [`WebhookOrder::InOrder`] is easier than GitHub:
    /// say why at the call.
    pub fn set_webhook_order(&self, order: WebhookOrder) {
        self.with(|s| {
            s.webhook_order = order;
            if let WebhookOrder::Chaotic(chaos) = order {
                s.webhook_rng = webhook::Rng::new(chaos.seed);
            }
        })
    }

    /// The next `n` deliveries fail without reaching the receiver (missed webhooks).
    pub fn fail_next_deliveries(&self, n: usize) {
        self.with(|s| s.fail_deliveries += n)
    }

    /// Every delivery attempt so far, oldest first.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.with(|s| s.deliveries.clone())
    }

    /// Waits until no delivery is pending (bounded by [`SETTLE_TIMEOUT`]).
    pub async fn settle(&self) -> anyhow::Result<()> {
        let wait = async {
            while self.with(|s| s.deliveries.iter().any(|d| d.status == "pending")) {
                tokio::time::sleep(SETTLE_POLL).await;
            }
        };
        tokio::time::timeout(SETTLE_TIMEOUT, wait)
            .await
            .context("deliveries still pending")
    }

    // ---- jobs and runners ----

    /// Queues a job (in a new workflow run) in `owner/name`; sends its `queued` webhook.
    pub fn queue_job(&self, repo: &str, name: &str, labels: &[&str]) -> anyhow::Result<u64> {
        self.in_repo(repo, labels, |s, id, labels| s.queue_job(id, name, labels))
    }

    /// [`Self::queue_job`] for a job whose run is `origin`'s: its branch, event and head
    /// repository (what `GET /repos/{owner}/{repo}/actions/runs/{run_id}` and the job's
    /// webhooks say), the repository's default branch, the actions its steps use.
    pub fn queue_job_as(
        &self,
        repo: &str,
        name: &str,
        labels: &[&str],
        origin: &JobOrigin,
    ) -> anyhow::Result<u64> {
        self.in_repo(repo, labels, |s, id, labels| {
            s.queue_job_as(id, name, labels, origin)
        })
    }

    /// The results service's URL jobs are given (`ACTIONS_RESULTS_URL`): the fake's stand-in
    /// ([`results`]).
    pub fn results_url(&self) -> String {
        results::results_url(&self.server_url())
    }

    /// Every request the results stand-in answered (a job's cache or artifact calls that
    /// reached "GitHub"), oldest first.
    pub fn results_requests(&self) -> Vec<RequestRecord> {
        self.with(|s| {
            s.requests
                .iter()
                .filter(|r| r.kind() == RequestKind::Results)
                .cloned()
                .collect()
        })
    }

    /// Runs `queue` on the state with the id of repository `owner/name` and the labels owned;
    /// `None` from it (or an unknown repository) is an error naming the repository.
    fn in_repo<T>(
        &self,
        repo: &str,
        labels: &[&str],
        queue: impl FnOnce(&mut State, u64, &[String]) -> Option<T>,
    ) -> anyhow::Result<T> {
        let (owner, repo_name) = repo
            .split_once('/')
            .context("repository must be owner/name")?;
        let labels: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        self.with(|s| {
            let id = s.repo_by_name(owner, repo_name).map(|r| r.id)?;
            queue(s, id, &labels)
        })
        .with_context(|| format!("no repository {repo} in the fake (or nothing to queue)"))
    }

    /// Queues a matrix in `owner/name`: one workflow run with a job `name (variant)` per
    /// variant, each sending its `queued` webhook; returns the job ids in order.
    pub fn queue_matrix(
        &self,
        repo: &str,
        name: &str,
        labels: &[&str],
        variants: &[&str],
    ) -> anyhow::Result<Vec<u64>> {
        let variants: Vec<String> = variants.iter().map(|v| (*v).to_owned()).collect();
        self.in_repo(repo, labels, |s, id, labels| {
            s.queue_matrix(id, name, labels, &variants)
        })
    }

    /// Sends a `queued` webhook for a job in `owner/name` that no runner is ever given (it
    /// vanishes at once, as a job another runner took would): for idle-runner scenarios.
    /// Returns the announced job id.
    pub fn queue_vanishing_job(
        &self,
        repo: &str,
        name: &str,
        labels: &[&str],
    ) -> anyhow::Result<u64> {
        self.in_repo(repo, labels, |s, id, labels| {
            s.queue_vanishing_job(id, name, labels)
        })
    }

    /// Like [`Self::queue_job`], but the job waits for approval (an environment's protection
    /// rules) and sends a `waiting` webhook; [`Self::approve_job`] queues it.
    pub fn queue_waiting_job(
        &self,
        repo: &str,
        name: &str,
        labels: &[&str],
    ) -> anyhow::Result<u64> {
        self.in_repo(repo, labels, |s, id, labels| {
            s.queue_waiting_job(id, name, labels)
        })
    }

    /// Approves a waiting job: it becomes `queued` and sends a `queued` webhook.
    pub fn approve_job(&self, job_id: u64) -> bool {
        self.with(|s| s.approve(job_id))
    }

    /// Completes a job (whatever its state); sends its `completed` webhook.
    pub fn complete_job(&self, job_id: u64, conclusion: &str) -> bool {
        self.with(|s| s.complete(job_id, conclusion))
    }

    pub fn job(&self, job_id: u64) -> Option<Job> {
        self.with(|s| s.jobs.get(&job_id).cloned())
    }

    pub fn jobs(&self) -> Vec<Job> {
        self.with(|s| s.jobs.values().cloned().collect())
    }

    /// The runner inventory (JIT-configured, registered or not), as GitHub lists it now: a
    /// finished ephemeral runner stays in it until someone deletes it or its lag ends.
    pub fn runners(&self) -> Vec<Runner> {
        self.with(|s| s.runners.values().cloned().collect())
    }

    /// Deletes a runner's registration as an administrator does in GitHub's settings (or as
    /// GitHub loses one: actions/runner#4617), whatever the runner process does; returns
    /// whether it was registered.
    pub fn delete_registration(&self, runner_name: &str) -> bool {
        self.with(|s| {
            let before = s.runners.len();
            s.runners.retain(|_, r| r.name != runner_name);
            s.runners.len() != before
        })
    }

    /// How long a finished ephemeral runner stays busy (a DELETE answers `422`) and then listed
    /// (`204`), counted from its job's completion, before GitHub removes it itself (`404`).
    /// Defaults: [`state::EPHEMERAL_BUSY_LAG`], [`state::EPHEMERAL_LISTED_LAG`].
    pub fn set_ephemeral_lag(&self, busy: Duration, listed: Duration) {
        self.with(|s| s.ephemeral_lag = state::EphemeralLag { busy, listed })
    }

    /// How long a running job may go without its runner renewing the lock before GitHub gives
    /// it up (conclusion `failure`, runner offline). Default [`state::JOB_LOCK_TIMEOUT`]; at
    /// least three renewals ([`jit::JOB_RENEW_INTERVAL`]) long.
    pub fn set_job_lock_timeout(&self, timeout: Duration) {
        self.with(|s| s.job_lock_timeout = timeout.max(3 * jit::JOB_RENEW_INTERVAL))
    }

    /// Jobs GitHub gave up because their runner stopped renewing the lock, oldest first.
    pub fn abandoned_jobs(&self) -> Vec<u64> {
        self.with(|s| s.abandoned_jobs.clone())
    }

    /// Names of the runners GitHub removed itself at the end of their lag: registrations no
    /// one deleted.
    pub fn expired_runners(&self) -> Vec<String> {
        self.with(|s| s.expired_runners.clone())
    }

    /// Creates a JIT runner the way `generate-jitconfig` does (for `target` "org" or
    /// "owner/repo", default runner group) and returns its encoded configuration: for tests
    /// and the demo that start a runner without going through a client.
    pub fn generate_jitconfig(
        &self,
        target: &str,
        name: &str,
        labels: &[&str],
    ) -> anyhow::Result<String> {
        let scope = match target.split_once('/') {
            Some((o, r)) => routes::Scope::Repo(o.to_owned(), r.to_owned()),
            None => routes::Scope::Org(target.to_owned()),
        };
        let body = serde_json::json!({"name": name, "runner_group_id": 1, "labels": labels});
        let reply = self.with(|s| {
            routes::answer(
                s,
                auth::Caller::App,
                &routes::Route::Jit(scope),
                "",
                Some(&body),
            )
        });
        match (reply.status, reply.body) {
            (201, Some(b)) => b["encoded_jit_config"]
                .as_str()
                .map(str::to_owned)
                .context("no encoded_jit_config in the answer"),
            (status, b) => {
                anyhow::bail!("generate-jitconfig for {target} answered {status}: {b:?}")
            }
        }
    }

    /// The behaviour runners get when they register, unless named in
    /// [`Self::set_runner_behavior_for`].
    pub fn set_runner_behavior(&self, behavior: RunnerBehavior) {
        self.with(|s| s.default_behavior = behavior)
    }

    pub fn set_runner_behavior_for(&self, runner_name: &str, behavior: RunnerBehavior) {
        self.with(|s| {
            s.behavior_by_name.insert(runner_name.to_owned(), behavior);
        })
    }

    // ---- actions/runner releases ----

    /// Publishes actions/runner release `v{version}` with `tarball` as the package of every
    /// platform, its SHA-256 as each asset's `digest` and in the release notes' markers.
    pub fn publish_runner_release(&self, version: &str, tarball: Vec<u8>) {
        self.publish_runner_release_with(version, tarball, ReleaseOptions::default());
    }

    /// [`Self::publish_runner_release`] with the digest or the notes' checksums left out, or
    /// the download corrupted.
    pub fn publish_runner_release_with(
        &self,
        version: &str,
        tarball: Vec<u8>,
        options: ReleaseOptions,
    ) {
        self.with(|s| {
            let id = s.next_id();
            let now = s.now();
            s.releases.publish(id, version, tarball, options, now);
        })
    }

    // ---- inspection ----

    /// Every installation token the fake has issued: credentials a test checks never leak.
    pub fn issued_tokens(&self) -> Vec<String> {
        self.with(|s| s.tokens.keys().cloned().collect())
    }

    /// Every request answered (or faulted) so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.with(|s| s.requests.clone())
    }

    pub fn clear_requests(&self) {
        self.with(|s| s.requests.clear())
    }

    /// The fake's clock now (what [`RequestRecord::at`] is stamped with): take it before a
    /// phase of a test to look at the requests of that phase only.
    pub fn now(&self) -> std::time::SystemTime {
        self.with(|s| s.now())
    }

    /// Every request answered at or after `since` (the fake's clock, [`Self::now`]).
    pub fn requests_since(&self, since: std::time::SystemTime) -> Vec<RequestRecord> {
        self.with(|s| {
            s.requests
                .iter()
                .filter(|r| r.at >= since)
                .cloned()
                .collect()
        })
    }

    /// How many requests of each endpoint ([`RequestRecord::endpoint`]: `METHOD path`, ids as
    /// `{id}`) and kind ([`RequestKind`]) were answered at or after `since`: e.g. that a
    /// scale-set agent made no [`RequestKind::Rest`] request after its start-up, only
    /// [`RequestKind::Token`] ones.
    pub fn request_counts_since(
        &self,
        since: std::time::SystemTime,
    ) -> std::collections::BTreeMap<(RequestKind, String), usize> {
        let mut counts = std::collections::BTreeMap::new();
        for r in self.requests_since(since) {
            *counts.entry((r.kind(), r.endpoint())).or_insert(0) += 1;
        }
        counts
    }

    // ---- the scale-set broker (see [`broker`]) ----

    /// Queues a job for scale set `scale_set_id` from its default repository (the target's,
    /// or the organization's first); its runner request id, or `None` for an unknown set.
    pub fn queue_scale_set_job(&self, scale_set_id: u64, job_name: &str) -> Option<u64> {
        self.with(|s| s.broker.queue_job(scale_set_id, job_name))
    }

    /// [`Self::queue_scale_set_job`] from repository `owner/name`, as its job messages'
    /// `ownerName` and `repositoryName` say.
    pub fn queue_scale_set_job_in(
        &self,
        scale_set_id: u64,
        job_name: &str,
        repository: &str,
    ) -> Option<u64> {
        self.with(|s| {
            s.broker
                .queue_jobs_in(scale_set_id, &[job_name], Some(repository))
                .and_then(|ids| ids.first().copied())
        })
    }

    /// Queues `names` as one burst for scale set `scale_set_id` (their messages batched, at
    /// most [`broker::MAX_JOBS_PER_MESSAGE`] a message, or what
    /// [`Self::set_scale_set_jobs_per_message`] says); their runner request ids, or `None`
    /// for an unknown set.
    pub fn queue_scale_set_jobs(&self, scale_set_id: u64, names: &[&str]) -> Option<Vec<u64>> {
        self.with(|s| s.broker.queue_jobs(scale_set_id, names))
    }

    /// At most `limit` job messages a queue message (the service's: 50): a burst smaller
    /// than 50 comes truncated over several messages too.
    pub fn set_scale_set_jobs_per_message(&self, limit: usize) {
        self.with(|s| s.broker.jobs_per_message = limit)
    }

    /// The `X-ScaleSetMaxCapacity` of scale set `scale_set_id`'s last poll (`None`: not
    /// polled yet, or no such set).
    pub fn scale_set_capacity(&self, scale_set_id: u64) -> Option<u64> {
        self.with(|s| s.broker.scale_sets.get(&scale_set_id)?.capacity)
    }

    /// GHES mode on or off: jobs queued from now on are announced `JobAvailable` and assigned
    /// only once `acquirejobs` names them (scaleset #75).
    pub fn set_scale_set_ghes(&self, on: bool) {
        self.with(|s| s.broker.ghes = on)
    }

    /// The assigned job `request_id` is picked up by runner `runner_name` (`JobStarted`)
    /// without the runner asking: a runner of that name is listed busy. Whether it was
    /// assigned. A scale-set runner asking through the runner protocol does this itself.
    pub fn start_scale_set_job(&self, request_id: u64, runner_name: &str) -> bool {
        self.with(|s| {
            let runner_id = s
                .runners
                .values()
                .find(|r| r.name == runner_name && r.scale_set_id.is_some())
                .map(|r| r.id);
            let started = s
                .broker
                .start_job(request_id, runner_id.unwrap_or(0), runner_name);
            if let Some(r) = runner_id.and_then(|id| s.runners.get_mut(&id))
                && started
            {
                r.busy = true;
            }
            started
        })
    }

    /// Job `request_id` finishes with `result` (`JobCompleted`), freeing its capacity; its
    /// runner, if it has one, is done with it (busy for its lag, then idle). Whether it had
    /// not finished yet.
    pub fn complete_scale_set_job(&self, request_id: u64, result: &str) -> bool {
        self.with(|s| {
            let completed = s.broker.complete_job(request_id, result);
            if completed {
                s.release_scale_set_runner(request_id);
            }
            completed
        })
    }

    /// Sends `JobCompleted` (`succeeded`) for job `request_id` while its runner keeps running
    /// it (§6.6 scenario 16): the runner stays busy and reports done later through the runner
    /// protocol, which then changes nothing but the runner's lag. Whether it had not finished.
    pub fn complete_scale_set_job_early(&self, request_id: u64) -> bool {
        self.with(|s| s.broker.complete_job(request_id, "succeeded"))
    }

    /// A job assigned and not started within `after` is cancelled (`JobCompleted` with result
    /// `canceled`) and assigned again (`JobAssigned`), at most [`broker::MAX_REASSIGNMENTS`]
    /// times. Off by default.
    pub fn set_scale_set_reassign_after(&self, after: Duration) {
        self.with(|s| s.broker.reassign_after = Some(after))
    }

    /// The status of `JobStillRunningException` when a busy runner is removed through the
    /// service: 400 by default (ARC's ADR), 409 as the Go client's test has it.
    pub fn set_job_still_running_status(&self, status: u16) {
        self.with(|s| s.broker.job_still_running_status = status)
    }

    /// The next `count` scale-set JIT configurations are made (the runner registered) and
    /// their answers lost (`503`): the caller's next request with the same name meets
    /// `409 AgentExistsException` (§6.6 scenario 11).
    pub fn lose_next_jit_answers(&self, count: u32) {
        self.with(|s| s.broker.lost_jit_answers = count)
    }

    /// The next `count` removals of an idle runner through the service are refused with
    /// `JobStillRunningException`, as when the service hands the runner a job at the instant it
    /// is removed.
    pub fn refuse_next_removals(&self, count: u32) {
        self.with(|s| s.broker.refused_removals = count)
    }

    /// While `paused`, scale-set runners asking for a job get none: runners slow to come, their
    /// assigned jobs waiting (and reassigned, with [`Self::set_scale_set_reassign_after`]).
    pub fn pause_scale_set_runners(&self, paused: bool) {
        self.with(|s| s.broker.runners_paused = paused)
    }

    /// The runners created for scale set `scale_set_id` (`generatejitconfig`) still listed,
    /// with their state (`online`, `busy`).
    pub fn scale_set_runners(&self, scale_set_id: u64) -> Vec<Runner> {
        self.with(|s| {
            s.runners
                .values()
                .filter(|r| r.scale_set_id == Some(scale_set_id))
                .cloned()
                .collect()
        })
    }

    /// The jobs of scale set `scale_set_id` by runner request id, oldest first: their state,
    /// runner, result and reassignments.
    pub fn scale_set_jobs(&self, scale_set_id: u64) -> Vec<(u64, broker::ScaleSetJob)> {
        self.with(|s| {
            s.broker
                .scale_sets
                .get(&scale_set_id)
                .map(|set| set.jobs.iter().map(|(r, j)| (*r, j.clone())).collect())
                .unwrap_or_default()
        })
    }

    /// Scale-set job `request_id`, of any set.
    pub fn scale_set_job(&self, request_id: u64) -> Option<broker::ScaleSetJob> {
        self.with(|s| s.broker.job(request_id).cloned())
    }

    /// Queues a message of top-level type `message_type` (one the client may not know); its
    /// message id.
    pub fn queue_scale_set_message(&self, scale_set_id: u64, message_type: &str) -> Option<u64> {
        self.with(|s| s.broker.queue_raw(scale_set_id, message_type))
    }

    /// Deletes scale set `scale_set_id` out of band (scenario 9 of §6.6): the next call on it,
    /// polls included, is `404 RunnerScaleSetNotFoundException`. Whether it existed.
    pub fn delete_scale_set(&self, scale_set_id: u64) -> bool {
        self.with(|s| s.broker.delete_scale_set(scale_set_id))
    }

    /// The admin and queue tokens issued from now on are unsecured JWTs (`"alg": "none"`, an
    /// empty signature), as an emulator of the service others wrote issues them; `false`:
    /// `RS256`-shaped, as by default.
    pub fn set_alg_none_tokens(&self, on: bool) {
        self.with(|s| s.broker.alg_none_tokens = on)
    }

    /// The `typeName` of the `409` a session create meets while the scale set has a session:
    /// `Some(name)` (by default [`broker::SESSION_CONFLICT_TYPE`]) or `None`, a message with no
    /// type name at all.
    pub fn set_session_conflict_type(&self, type_name: Option<&str>) {
        self.with(|s| s.broker.session_conflict_type = type_name.map(str::to_owned))
    }

    /// Drops every session as a service that lost them: a poll, an acknowledgement or an
    /// `acquirejobs` with a dropped session's queue token is answered `404` without a type
    /// name (not the `401` of [`Self::evict_sessions`]); its refresh is `404`, a new session
    /// is made as usual.
    pub fn drop_sessions(&self) {
        self.with(|s| s.broker.drop_sessions())
    }

    /// While `on`, a scale set that does not exist (deleted, or never made) is answered with a
    /// bare `404` (a message, no `RunnerScaleSetNotFoundException`) wherever it is named:
    /// getting it, its sessions, the queue of its session, `acquirejobs`, JIT configurations.
    pub fn set_bare_not_found(&self, on: bool) {
        self.with(|s| s.broker.bare_not_found = on)
    }

    /// The queue token of every session stops being accepted: the next queue call gets `401`
    /// until the session is refreshed.
    pub fn expire_queue_tokens(&self) {
        self.with(|s| {
            for session in s.broker.sessions.values_mut() {
                session.token_valid = false;
            }
        })
    }

    /// Every admin token issued so far stops being accepted (before its `exp`).
    pub fn expire_admin_tokens(&self) {
        self.with(|s| s.broker.admin_tokens.clear())
    }

    /// Another listener (another rm, an ARC) holds a session of scale set `scale_set_id`: a
    /// session created meanwhile is refused `409 RunnerScaleSetSessionConflictException` until
    /// it is dropped ([`Self::evict_sessions`]). Whether the set exists and had no session.
    pub fn hold_session_elsewhere(&self, scale_set_id: u64, owner: &str) -> bool {
        self.with(|s| {
            if !s.broker.scale_sets.contains_key(&scale_set_id)
                || s.broker.sessions.contains_key(&scale_set_id)
            {
                return false;
            }
            s.broker.sessions.insert(
                scale_set_id,
                broker::Session {
                    id: format!("held-by-{owner}"),
                    owner: owner.to_owned(),
                    queue_token: String::new(),
                    token_valid: false,
                },
            );
            true
        })
    }

    /// Drops every session, as the broker of scaleset #123 did: the next refresh gets `404`.
    pub fn evict_sessions(&self) {
        self.with(|s| s.broker.sessions.clear())
    }

    /// The next poll is answered `200` with an empty body.
    pub fn empty_next_poll(&self) {
        self.with(|s| s.broker.empty_next_poll = true)
    }

    /// The next JSON answer of the broker starts with a UTF-8 byte-order mark.
    pub fn bom_next_answer(&self) {
        self.with(|s| s.broker.bom_next = true)
    }

    /// The next `count` polls are answered `status` (a 5xx burst, a 403), with a JSON error.
    pub fn fail_next_polls(&self, count: u32, status: u16) {
        self.with(|s| {
            s.broker.failing_polls = count;
            s.broker.failing_status = status;
        })
    }

    /// Takes the Actions service down (`true`: every request to it is answered `503`) or
    /// brings it back; the REST API and the token exchange stay up.
    pub fn set_broker_down(&self, down: bool) {
        self.with(|s| s.broker.down = down)
    }

    /// An enterprise `slug` whose registration token is issued to the classic PAT `pat` alone
    /// (set again: the PAT is replaced, and the old one refused from then on).
    pub fn set_enterprise_pat(&self, slug: &str, pat: &str) {
        self.with(|s| {
            s.broker
                .enterprise_pats
                .insert(slug.to_owned(), pat.to_owned());
        })
    }

    /// How long a poll with nothing to deliver is held before `202`.
    pub fn set_poll_hold(&self, hold: Duration) {
        self.with(|s| s.broker.hold = hold)
    }

    /// The broker's requests (`/rest/…`, the queue, the registration exchange) with `method`
    /// whose path (the server's, with the API base path) contains `part`.
    pub fn broker_calls(&self, method: &str, part: &str) -> usize {
        self.with(|s| {
            s.requests
                .iter()
                .filter(|r| r.method == method && r.path.contains(part))
                .count()
        })
    }
}
