//! The fake's mutable state and the operations on it: setting up accounts, issuing tokens,
//! moving jobs through their states, assigning them to runners, and recording each change as a
//! signed webhook delivery. Everything here runs under one lock; nothing here does I/O.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;
use sha2::Sha256;

use crate::auth::Caller;
use crate::jit::{AssignedJob, RunnerBehavior};
use crate::limits::{Ledger, LimitStatus, SecondaryLimits};
use crate::model::*;
use crate::render::{self, Ctx};

/// How long an installation token lives unless a test says otherwise (GitHub: one hour).
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// The primary quota per scope and resource unless a test says otherwise (GitHub: 5,000/h).
pub const DEFAULT_LIMIT: u64 = 5000;
/// The length of a primary rate-limit window.
pub const RATE_WINDOW: Duration = Duration::from_secs(3600);

/// How long GitHub keeps a finished ephemeral runner busy: the job's `completed` webhook and the
/// job's REST state say done while the runner is still wrapping up, and a DELETE answers `422`
/// ("still running a job") until then. Runner managers meet this as a 422 right after a job
/// (actions-runner-controller's "Runner is still running a job" on scale-down).
pub const EPHEMERAL_BUSY_LAG: Duration = Duration::from_secs(2);
/// How long GitHub keeps listing a finished ephemeral runner (offline, idle, deletable with
/// `204`) before it removes the registration itself; after that a DELETE answers `404`. GitHub
/// does not document it; seconds to a minute is what one sees. Long enough here that a test
/// which checks for leftover registrations right after rm cleaned up sees rm's work, not
/// GitHub's (and [`State::expired_runners`] names any the fake removed itself).
pub const EPHEMERAL_LISTED_LAG: Duration = Duration::from_secs(30);

/// How long GitHub lets a running job go without its runner renewing the lock before it gives
/// the job up: the job completes with conclusion `failure` ("The self-hosted runner ... lost
/// communication with the server") and the runner is listed offline. GitHub does not document
/// the number; about ten minutes is what one sees. Tests of a crashed runner lower it
/// ([`crate::FakeGithub::set_job_lock_timeout`]).
pub const JOB_LOCK_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How long a finished ephemeral runner stays busy, then listed, after its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EphemeralLag {
    pub busy: Duration,
    /// From the job's completion; at least `busy`.
    pub listed: Duration,
}

impl Default for EphemeralLag {
    fn default() -> Self {
        EphemeralLag {
            busy: EPHEMERAL_BUSY_LAG,
            listed: EPHEMERAL_LISTED_LAG,
        }
    }
}

/// A primary quota of one scope and resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub limit: u64,
    pub remaining: u64,
    pub reset: SystemTime,
}

/// A secondary limit in force, set by a test (the windows of [`crate::limits`] answer their own).
#[derive(Debug, Clone, Copy)]
pub struct Secondary {
    pub until: SystemTime,
    /// 403 or 429.
    pub status: u16,
    /// Whether to send `retry-after` (GitHub sometimes does not).
    pub send_retry_after: bool,
    /// Whose requests it holds: one scope (an installation, or the App's JWT), or every one.
    pub scope: Option<Caller>,
}

/// A secondary limit armed to fall in the middle of a burst: after `requests_left` more
/// requests whose path contains `path_contains` are answered, the next one trips a
/// [`Secondary`] of `duration` on its own scope, with `retry-after`.
#[derive(Debug, Clone)]
pub struct SecondaryTrigger {
    pub path_contains: String,
    pub requests_left: u32,
    pub duration: Duration,
    /// 403 or 429.
    pub status: u16,
}

/// What to do to requests that match, instead of answering them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this status and a GitHub-style error body.
    Status(u16),
    /// Never answer.
    Hang,
    /// Close the connection without an answer.
    Drop,
    /// Do what the request asks, then close the connection without an answer: the change is
    /// made and the caller never learns it (a timeout after GitHub acted).
    DropAfter,
}

#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<String>,
    /// Matches when the path (below the API base) contains this.
    pub path_contains: String,
    pub action: FaultAction,
    /// How many requests it still applies to.
    pub times: usize,
}

/// Where deliveries go: one URL, or several (a fleet's receivers behind no load balancer), each
/// delivery to one of them (see [`crate::webhook::pick_url`]).
pub struct WebhookTarget {
    pub urls: Vec<String>,
    pub secret: SecretString,
}

pub struct State {
    pub app_id: u64,
    pub app_slug: String,
    pub hook_id: u64,
    pub public_key_pem: String,
    /// Further Apps by id, each with its public key: installed on the same accounts as the
    /// primary (`FakeGithub::install_app`), with installations of their own. Only the primary
    /// sends webhooks.
    pub more_apps: BTreeMap<u64, String>,
    /// API root URL (server root + base path).
    pub api_url: String,
    pub server_url: String,
    pub base_path: String,
    pub clock_offset: Duration,
    next_id: u64,
    pub installations: BTreeMap<u64, Installation>,
    pub repos: BTreeMap<u64, Repo>,
    pub runner_groups: BTreeMap<String, Vec<RunnerGroup>>,
    pub runners: BTreeMap<u64, Runner>,
    /// How finished ephemeral runners linger (see [`EphemeralLag`]).
    pub ephemeral_lag: EphemeralLag,
    /// Names of runners GitHub removed itself at the end of their lag (nobody deleted them).
    pub expired_runners: Vec<String>,
    /// How long a running job may go without a lock renewal (see [`JOB_LOCK_TIMEOUT`]).
    pub job_lock_timeout: Duration,
    /// Jobs GitHub gave up because their runner stopped renewing the lock.
    pub abandoned_jobs: Vec<u64>,
    /// Every re-run GitHub did: `(job re-run, the new job)`, in order.
    pub reruns: Vec<(u64, u64)>,
    pub runs: BTreeMap<u64, Run>,
    pub jobs: BTreeMap<u64, Job>,
    /// Installation tokens: token → (installation, expiry).
    pub tokens: HashMap<String, (u64, SystemTime)>,
    pub token_ttl: Duration,
    /// Quotas by (scope, resource); scope is `app` or the installation id.
    pub quotas: HashMap<(String, String), Quota>,
    pub default_limit: u64,
    /// Primary limits forced by a test: resource (`None`: all) → until when.
    pub exhausted: Vec<(Option<String>, SystemTime)>,
    /// The resource `generate-jitconfig` spends.
    pub jit_resource: String,
    /// Primary limits of resources that do not take [`State::default_limit`] (the registration
    /// bucket).
    pub resource_limits: HashMap<String, u64>,
    pub secondary: Option<Secondary>,
    /// A secondary limit waiting for its place in a burst.
    pub secondary_trigger: Option<SecondaryTrigger>,
    /// The documented secondary limits, enforced per scope (GitHub's numbers unless a test
    /// lowers them).
    pub secondary_limits: SecondaryLimits,
    /// What each scope sent, against [`State::secondary_limits`].
    pub ledger: Ledger,
    /// 403 or 429 for the limits the fake answers itself (primary and secondary windows).
    pub limit_status: LimitStatus,
    /// Limit answers given so far (for [`LimitStatus::Alternating`]).
    pub limit_answers: u64,
    pub faults: Vec<Fault>,
    pub requests: Vec<RequestRecord>,
    pub deliveries: Vec<Delivery>,
    pub webhook: Option<WebhookTarget>,
    /// Deliveries still to be failed without sending (to simulate missed webhooks).
    pub fail_deliveries: usize,
    /// How the sender orders, delays and duplicates deliveries (see [`crate::webhook`]).
    pub webhook_order: crate::webhook::WebhookOrder,
    /// The sender's random state, from the order's seed.
    pub webhook_rng: crate::webhook::Rng,
    /// Deliveries sent so far (numbers [`Delivery::sent_seq`]).
    pub sent: u64,
    /// Deliveries given a URL so far: the round-robin's turn among several webhook URLs (in
    /// order).
    pub url_turn: u64,
    pub default_behavior: RunnerBehavior,
    pub behavior_by_name: HashMap<String, RunnerBehavior>,
    /// Published actions/runner releases (see [`crate::releases`]).
    pub releases: crate::releases::Releases,
    /// Action repositories and their archives (see [`crate::archives`]).
    pub archives: crate::archives::Archives,
    /// The Actions service of runner scale sets (see [`crate::broker`]).
    pub broker: crate::broker::Broker,
}

/// `sha256=` + hex HMAC-SHA256 of the exact body, as GitHub signs deliveries.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

fn random_hex(bytes: usize) -> String {
    let mut out = String::new();
    while out.len() < bytes * 2 {
        out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    out.truncate(bytes * 2);
    out
}

impl State {
    pub fn new(app_id: u64, public_key_pem: String, server_url: String, base_path: String) -> Self {
        Self {
            app_id,
            app_slug: "rm-fake-app".into(),
            hook_id: 400_000_000 + app_id,
            public_key_pem,
            more_apps: BTreeMap::new(),
            api_url: format!("{server_url}{base_path}"),
            server_url,
            base_path,
            clock_offset: Duration::ZERO,
            next_id: 1000,
            installations: BTreeMap::new(),
            repos: BTreeMap::new(),
            runner_groups: BTreeMap::new(),
            runners: BTreeMap::new(),
            ephemeral_lag: EphemeralLag::default(),
            expired_runners: Vec::new(),
            job_lock_timeout: JOB_LOCK_TIMEOUT,
            abandoned_jobs: Vec::new(),
            reruns: Vec::new(),
            runs: BTreeMap::new(),
            jobs: BTreeMap::new(),
            tokens: HashMap::new(),
            token_ttl: DEFAULT_TOKEN_TTL,
            quotas: HashMap::new(),
            default_limit: DEFAULT_LIMIT,
            exhausted: Vec::new(),
            jit_resource: "core".into(),
            resource_limits: HashMap::new(),
            secondary: None,
            secondary_trigger: None,
            secondary_limits: SecondaryLimits::GITHUB,
            ledger: Ledger::default(),
            limit_status: LimitStatus::default(),
            limit_answers: 0,
            faults: Vec::new(),
            requests: Vec::new(),
            deliveries: Vec::new(),
            webhook: None,
            fail_deliveries: 0,
            webhook_order: crate::webhook::WebhookOrder::InOrder,
            webhook_rng: crate::webhook::Rng::new(0),
            sent: 0,
            url_turn: 0,
            default_behavior: RunnerBehavior::default(),
            behavior_by_name: HashMap::new(),
            releases: crate::releases::Releases::default(),
            archives: crate::archives::Archives::default(),
            broker: crate::broker::Broker::default(),
        }
    }

    pub fn now(&self) -> SystemTime {
        crate::time::shifted(self.clock_offset)
    }

    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn ctx(&self) -> Ctx<'_> {
        Ctx {
            api: &self.api_url,
            web: &self.server_url,
            app_id: self.app_id,
            app_slug: &self.app_slug,
        }
    }

    /// Moves finished ephemeral runners along their lag on the fake's clock: busy until
    /// `busy` after the job, then offline and idle, removed at `listed`. Called before anything
    /// reads or changes the state, so every answer sees the runner where GitHub would have it.
    pub fn age_runners(&mut self) {
        let now = self.now();
        self.broker.now = now;
        let lag = self.ephemeral_lag;
        let mut expired = Vec::new();
        for runner in self.runners.values_mut() {
            let Some(done) = runner.job_done_at else {
                continue;
            };
            let since = now.duration_since(done).unwrap_or(Duration::ZERO);
            if since >= lag.listed.max(lag.busy) {
                expired.push(runner.id);
            } else if since >= lag.busy {
                runner.busy = false;
                runner.online = false;
            }
        }
        for id in expired {
            if let Some(r) = self.runners.remove(&id) {
                self.expired_runners.push(r.name);
            }
        }
        self.abandon_unrenewed_jobs();
        self.abandon_unrenewed_scale_set_jobs();
        self.broker.reassign_overdue();
    }

    /// [`State::abandon_unrenewed_jobs`] for scale-set jobs: a job whose runner still holds
    /// it (running, or completed early) and has not renewed the lock within the timeout is
    /// given up: a running one completes `failed` (`JobCompleted`), and the runner is listed
    /// offline and idle.
    fn abandon_unrenewed_scale_set_jobs(&mut self) {
        let now = self.now();
        let timeout = self.job_lock_timeout;
        let runners = &self.runners;
        let holds = |runner: Option<u64>| {
            runner
                .and_then(|id| runners.get(&id))
                .is_some_and(|r| r.busy && r.job_done_at.is_none() && !r.abandoned)
        };
        let stale: Vec<(u64, Option<u64>)> = self
            .broker
            .scale_sets
            .values()
            .flat_map(|s| s.jobs.iter())
            .filter(|(_, j)| {
                j.state == crate::broker::JobState::Running
                    || (j.state == crate::broker::JobState::Completed && holds(j.runner_id))
            })
            .filter(|(_, j)| {
                j.lock_renewed_at
                    .or(j.started_at)
                    .is_some_and(|at| now.duration_since(at).unwrap_or(Duration::ZERO) >= timeout)
            })
            .map(|(r, j)| (*r, j.runner_id))
            .collect();
        for (request_id, runner_id) in stale {
            self.broker.complete_job(request_id, "failed");
            if let Some(r) = runner_id.and_then(|id| self.runners.get_mut(&id)) {
                r.job_done_at = None;
                r.busy = false;
                r.online = false;
                r.abandoned = true;
            }
        }
    }

    /// Gives up the running jobs whose runner has not renewed the lock within
    /// [`State::job_lock_timeout`] (it crashed, was killed or lost the network): each completes
    /// with `failure` (and its `completed` delivery), and its runner is listed offline and idle,
    /// a registration left for its manager to delete.
    pub fn abandon_unrenewed_jobs(&mut self) {
        let now = self.now();
        let timeout = self.job_lock_timeout;
        let stale: Vec<(u64, Option<u64>)> = self
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::InProgress && j.runner_id.is_some())
            .filter(|j| {
                j.lock_renewed_at
                    .or(j.started_at)
                    .is_some_and(|at| now.duration_since(at).unwrap_or(Duration::ZERO) >= timeout)
            })
            .map(|j| (j.id, j.runner_id))
            .collect();
        for (job_id, runner_id) in stale {
            self.complete(job_id, "failure");
            self.abandoned_jobs.push(job_id);
            if let Some(r) = runner_id.and_then(|id| self.runners.get_mut(&id)) {
                // Not a finished job's lag: the runner is gone, GitHub just lists it offline.
                r.job_done_at = None;
                r.busy = false;
                r.online = false;
                r.abandoned = true;
            }
        }
    }

    /// A runner renews the lock on the job it runs; `false` if the job is not its running one
    /// (GitHub gave it up, or it was never this runner's).
    pub fn renew_job(&mut self, runner_id: u64, job_id: u64) -> bool {
        let now = self.now();
        if self.scale_set_runner(runner_id).is_some() {
            // Its job is the broker's; a job completed early is still the runner's to run.
            let holding = self
                .runners
                .get(&runner_id)
                .is_some_and(|r| r.busy && r.job_done_at.is_none());
            return match self.broker.job_mut(job_id) {
                Some(j) if j.runner_id == Some(runner_id) && holding => {
                    j.lock_renewed_at = Some(now);
                    true
                }
                _ => false,
            };
        }
        match self.jobs.get_mut(&job_id) {
            Some(j) if j.runner_id == Some(runner_id) && j.status == JobStatus::InProgress => {
                j.lock_renewed_at = Some(now);
                true
            }
            _ => false,
        }
    }

    // ---- accounts ----

    /// The primary App's installation on `login`, created (as an organization's) if there is
    /// none.
    pub fn ensure_installation(&mut self, login: &str, account_type: &str) -> u64 {
        if let Some(i) = self.installation_by_login(login) {
            return i.id;
        }
        let id = self.next_id();
        let account_id = self.next_id();
        let now = self.now();
        self.installations.insert(
            id,
            Installation {
                id,
                app_id: self.app_id,
                account_login: login.to_owned(),
                account_id,
                account_type: account_type.to_owned(),
                permissions: default_permissions(),
                created_at: now,
            },
        );
        if account_type == "Organization" {
            self.runner_groups.insert(
                login.to_owned(),
                vec![RunnerGroup {
                    id: 1,
                    name: "Default".into(),
                    default: true,
                }],
            );
        }
        id
    }

    /// The primary App's installation on `login`.
    pub fn installation_by_login(&self, login: &str) -> Option<&Installation> {
        self.app_installation(self.app_id, login)
    }

    /// App `app_id`'s installation on `login`.
    pub fn app_installation(&self, app_id: u64, login: &str) -> Option<&Installation> {
        self.installations
            .values()
            .find(|i| i.app_id == app_id && i.account_login == login)
    }

    /// Installs App `app_id` (one of [`State::more_apps`]) on `login`, an account the primary
    /// is installed on: a new installation, its id distinct from every other. Returns it.
    pub fn install_app(&mut self, app_id: u64, login: &str) -> u64 {
        if let Some(i) = self.app_installation(app_id, login) {
            return i.id;
        }
        let (account_id, account_type) = self
            .installation_by_login(login)
            .map(|i| (i.account_id, i.account_type.clone()))
            .unwrap_or_else(|| (0, "Organization".to_owned()));
        let id = self.next_id();
        let now = self.now();
        self.installations.insert(
            id,
            Installation {
                id,
                app_id,
                account_login: login.to_owned(),
                account_id,
                account_type,
                permissions: default_permissions(),
                created_at: now,
            },
        );
        id
    }

    /// Whether `installation` reaches `repo`: the primary's through the repository's record,
    /// another App's through being installed on its owner (every installation here selects
    /// all repositories).
    pub fn covers(&self, installation: &Installation, repo: &Repo) -> bool {
        repo.installation_id == installation.id
            || (installation.app_id != self.app_id && installation.account_login == repo.owner)
    }

    /// The App whose key signed `token`, an App JWT: the primary's key is tried first, then
    /// every other App's. The error is the primary's (GitHub's message for a bad JWT).
    pub fn jwt_app(&self, token: &str, now: SystemTime) -> Result<u64, String> {
        let now = crate::time::unix(now);
        let primary = crate::auth::verify_jwt(token, &self.public_key_pem, self.app_id, now);
        match primary {
            Ok(()) => Ok(self.app_id),
            Err(e) => self
                .more_apps
                .iter()
                .find(|(id, pem)| crate::auth::verify_jwt(token, pem, **id, now).is_ok())
                .map(|(id, _)| *id)
                .ok_or(e),
        }
    }

    pub fn repo_by_name(&self, owner: &str, name: &str) -> Option<&Repo> {
        self.repos
            .values()
            .find(|r| r.owner == owner && r.name == name)
    }

    pub fn add_repo(&mut self, owner: &str, name: &str, account_type: &str) -> u64 {
        if let Some(r) = self.repo_by_name(owner, name) {
            return r.id;
        }
        let installation_id = self.ensure_installation(owner, account_type);
        let owner_id = self
            .installations
            .get(&installation_id)
            .map(|i| i.account_id)
            .unwrap_or_default();
        let id = self.next_id();
        let now = self.now();
        self.repos.insert(
            id,
            Repo {
                id,
                owner: owner.to_owned(),
                owner_id,
                name: name.to_owned(),
                private: true,
                installation_id,
                created_at: now,
                default_branch: "main".into(),
            },
        );
        id
    }

    pub fn owner_type(&self, login: &str) -> String {
        self.installation_by_login(login)
            .map(|i| i.account_type.clone())
            .unwrap_or_else(|| "User".into())
    }

    pub fn repo_json(&self, repo: &Repo) -> serde_json::Value {
        render::repository(&self.ctx(), repo, &self.owner_type(&repo.owner))
    }

    /// The repository `run`'s head commit is in, as GitHub renders it: the run's own, another
    /// of the fake's, or a fork the fake does not hold (rendered from its name, as public).
    pub fn head_repo_json(&self, run: &Run) -> serde_json::Value {
        let (owner, name) = run
            .head_repository
            .split_once('/')
            .unwrap_or((run.head_repository.as_str(), ""));
        if let Some(repo) = self.repo_by_name(owner, name) {
            return self.repo_json(repo);
        }
        let fork = Repo {
            // An id of its own, far from the fake's.
            id: 500_000_000 + run.id,
            owner: owner.to_owned(),
            owner_id: 600_000_000 + run.id,
            name: name.to_owned(),
            private: false,
            installation_id: 0,
            created_at: run.created_at,
            default_branch: "main".into(),
        };
        render::repository(&self.ctx(), &fork, "User")
    }

    // ---- tokens ----

    pub fn issue_token(&mut self, installation: u64) -> (String, SystemTime) {
        let token = format!("ghs_{}", random_hex(18));
        let expires = self.now() + self.token_ttl;
        self.tokens.insert(token.clone(), (installation, expires));
        (token, expires)
    }

    // ---- rate limits ----

    /// The quota of a scope and resource, refilled if its window has passed.
    pub fn quota(&mut self, scope: &str, resource: &str) -> &mut Quota {
        let now = self.now();
        let limit = self
            .resource_limits
            .get(resource)
            .copied()
            .unwrap_or(self.default_limit);
        let q = self
            .quotas
            .entry((scope.to_owned(), resource.to_owned()))
            .or_insert(Quota {
                limit,
                remaining: limit,
                reset: now + RATE_WINDOW,
            });
        if q.reset <= now {
            q.remaining = q.limit;
            q.reset = now + RATE_WINDOW;
        }
        q
    }

    /// JIT registrations spend their own bucket of `limit` an hour, from a fresh window.
    pub fn set_registration_limit(&mut self, limit: u64) {
        let resource = crate::limits::REGISTRATION_RESOURCE;
        self.jit_resource = resource.to_owned();
        self.resource_limits.insert(resource.to_owned(), limit);
        self.quotas.retain(|(_, r), _| r != resource);
    }

    /// The status of the next limit answer the fake gives itself (403 or 429).
    pub fn next_limit_status(&mut self) -> u16 {
        let status = self.limit_status.nth(self.limit_answers);
        self.limit_answers += 1;
        status
    }

    /// Until when a test has spent `resource`'s quota, if it has and that is still ahead.
    pub fn exhausted_until(&self, resource: &str) -> Option<SystemTime> {
        let now = self.now();
        self.exhausted
            .iter()
            .filter(|(r, until)| r.as_deref().is_none_or(|r| r == resource) && *until > now)
            .map(|(_, until)| *until)
            .max()
    }

    // ---- jobs ----

    /// Queues a job in a new workflow run of `repo_id` and records its `queued` delivery.
    pub fn queue_job(&mut self, repo_id: u64, name: &str, labels: &[String]) -> Option<u64> {
        self.create_job(
            repo_id,
            name,
            labels,
            JobStatus::Queued,
            &JobOrigin::default(),
        )
    }

    /// [`Self::queue_job`] for a job whose run is `origin`'s (branch, event, head repository),
    /// using `origin`'s actions; `origin.default_branch` becomes the repository's first.
    pub fn queue_job_as(
        &mut self,
        repo_id: u64,
        name: &str,
        labels: &[String],
        origin: &JobOrigin,
    ) -> Option<u64> {
        if let Some(branch) = &origin.default_branch {
            self.repos.get_mut(&repo_id)?.default_branch = branch.clone();
        }
        self.create_job(repo_id, name, labels, JobStatus::Queued, origin)
    }

    /// Queues a matrix: one workflow run of `repo_id` with a job `name (variant)` per variant,
    /// each with its `queued` delivery; returns the job ids in order.
    pub fn queue_matrix(
        &mut self,
        repo_id: u64,
        name: &str,
        labels: &[String],
        variants: &[String],
    ) -> Option<Vec<u64>> {
        let first = variants.first()?;
        let first_id = self.queue_job(repo_id, &format!("{name} ({first})"), labels)?;
        let run_id = self.jobs.get(&first_id)?.run_id;
        let mut ids = vec![first_id];
        for variant in &variants[1..] {
            let job_id = self.next_id();
            let mut job = self.jobs.get(&first_id)?.clone();
            job.id = job_id;
            job.name = format!("{name} ({variant})");
            job.created_at = self.now();
            self.jobs.insert(job_id, job);
            self.touch_run(run_id);
            self.record_job_event(job_id, "queued");
            ids.push(job_id);
        }
        Some(ids)
    }

    /// Records a `queued` delivery for a job that then vanishes (its run and job are dropped):
    /// no runner is ever given it, and the REST API does not list it. What a runner manager
    /// sees when GitHub announces a job another runner takes, or one cancelled at once.
    pub fn queue_vanishing_job(
        &mut self,
        repo_id: u64,
        name: &str,
        labels: &[String],
    ) -> Option<u64> {
        let job_id = self.queue_job(repo_id, name, labels)?;
        let job = self.jobs.remove(&job_id)?;
        self.runs.remove(&job.run_id);
        Some(job_id)
    }

    /// Creates a job held for approval (`waiting`), as an environment-protected job is.
    pub fn queue_waiting_job(
        &mut self,
        repo_id: u64,
        name: &str,
        labels: &[String],
    ) -> Option<u64> {
        self.create_job(
            repo_id,
            name,
            labels,
            JobStatus::Waiting,
            &JobOrigin::default(),
        )
    }

    /// Approves a waiting job: it becomes `queued` (and says so in a delivery).
    pub fn approve(&mut self, job_id: u64) -> bool {
        let Some(job) = self
            .jobs
            .get_mut(&job_id)
            .filter(|j| j.status == JobStatus::Waiting)
        else {
            return false;
        };
        job.status = JobStatus::Queued;
        let run_id = job.run_id;
        self.touch_run(run_id);
        self.record_job_event(job_id, "queued");
        true
    }

    fn create_job(
        &mut self,
        repo_id: u64,
        name: &str,
        labels: &[String],
        status: JobStatus,
        origin: &JobOrigin,
    ) -> Option<u64> {
        let full_name = self.repos.get(&repo_id)?.full_name();
        let run_id = self.next_id();
        let job_id = self.next_id();
        // A pull request's number: small, and unique within the fake.
        let pull_number = (origin.event == "pull_request").then(|| run_id - 1000);
        let now = self.now();
        self.runs.insert(
            run_id,
            Run {
                id: run_id,
                repo_id,
                run_number: run_id - 1000,
                run_attempt: 1,
                workflow_name: "CI".into(),
                head_sha: random_hex(20),
                head_branch: origin.head_branch.clone(),
                event: origin.event.clone(),
                head_repository: origin.head_repository.clone().unwrap_or(full_name),
                pull_number,
                created_at: now,
                updated_at: now,
            },
        );
        self.jobs.insert(
            job_id,
            Job {
                id: job_id,
                run_id,
                run_attempt: 1,
                name: name.to_owned(),
                labels: labels.to_vec(),
                status,
                conclusion: None,
                runner_id: None,
                runner_name: None,
                runner_group_id: None,
                runner_group_name: None,
                created_at: now,
                started_at: None,
                completed_at: None,
                lock_renewed_at: None,
                uses: origin.uses.clone(),
            },
        );
        self.record_job_event(job_id, status.as_str());
        Some(job_id)
    }

    /// The run's status, from its jobs.
    pub fn run_status(&self, run_id: u64) -> (&'static str, Option<String>) {
        let jobs: Vec<&Job> = self.jobs.values().filter(|j| j.run_id == run_id).collect();
        if jobs.iter().all(|j| j.status == JobStatus::Completed) {
            let failed = jobs
                .iter()
                .find(|j| j.conclusion.as_deref() != Some("success"));
            let conclusion = failed
                .and_then(|j| j.conclusion.clone())
                .unwrap_or_else(|| "success".into());
            ("completed", Some(conclusion))
        } else if jobs.iter().any(|j| j.status == JobStatus::Waiting) {
            ("waiting", None)
        } else if jobs.iter().all(|j| j.status == JobStatus::Queued) {
            ("queued", None)
        } else {
            ("in_progress", None)
        }
    }

    fn repo_of_run(&self, run_id: u64) -> Option<&Repo> {
        self.runs
            .get(&run_id)
            .and_then(|r| self.repos.get(&r.repo_id))
    }

    /// Whether `runner` may take `job`: same repository or organization, and every label the
    /// job asks for is one of the runner's (case-insensitively, as GitHub matches).
    pub fn runner_fits(&self, runner: &Runner, job: &Job) -> bool {
        let Some(repo) = self.repo_of_run(job.run_id) else {
            return false;
        };
        let scope_ok = match &runner.scope {
            RunnerScope::Org(org) => *org == repo.owner,
            RunnerScope::Repo(id) => *id == repo.id,
            RunnerScope::Enterprise(_) => true,
        };
        scope_ok
            && job
                .labels
                .iter()
                .all(|l| runner.labels.iter().any(|r| r.eq_ignore_ascii_case(l)))
    }

    /// The scale set runner `runner_id` belongs to, if it is a scale-set runner.
    pub fn scale_set_runner(&self, runner_id: u64) -> Option<u64> {
        self.runners.get(&runner_id)?.scale_set_id
    }

    /// Gives the oldest fitting queued job to a registered, idle runner: a REST job to a REST
    /// runner, the oldest assigned job of its scale set to a scale-set runner (`JobStarted`).
    pub fn assign(&mut self, runner_id: u64) -> Option<AssignedJob> {
        let runner = self.runners.get(&runner_id)?.clone();
        // An ephemeral runner takes one job, ever.
        if !runner.online || runner.busy || runner.job_done_at.is_some() || runner.abandoned {
            return None;
        }
        if let Some(set_id) = runner.scale_set_id {
            self.broker.now = self.now();
            let request_id = self.broker.take_job(set_id, runner.id, &runner.name)?;
            if let Some(r) = self.runners.get_mut(&runner_id) {
                r.busy = true;
            }
            let job = self.broker.job(request_id)?.clone();
            // A scale-set job's run is not modelled: a push to `main` of its repository.
            let git_ref = "refs/heads/main";
            return Some(AssignedJob {
                job_id: request_id,
                run_id: job.workflow_run_id,
                name: job.name.clone(),
                repository: job.repository.clone(),
                git_ref: git_ref.into(),
                event: "push".into(),
                results_url: crate::results::results_url(&self.server_url),
                runtime_token: crate::results::runtime_token(&job.repository, git_ref),
                ..AssignedJob::default()
            });
        }
        let job_id = self
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Queued && self.runner_fits(&runner, j))?
            .id;
        let group_name = self.group_name(&runner);
        let now = self.now();
        let job = self.jobs.get_mut(&job_id)?;
        job.status = JobStatus::InProgress;
        job.started_at = Some(now);
        job.runner_id = Some(runner.id);
        job.runner_name = Some(runner.name.clone());
        job.runner_group_id = Some(runner.group_id);
        job.runner_group_name = Some(group_name);
        let (run_id, name, uses) = (job.run_id, job.name.clone(), job.uses.clone());
        if let Some(r) = self.runners.get_mut(&runner_id) {
            r.busy = true;
        }
        self.touch_run(run_id);
        self.record_job_event(job_id, "in_progress");
        let repo = self.repo_of_run(run_id)?.clone();
        let run = self.runs.get(&run_id)?.clone();
        let repository = repo.full_name();
        // The job's GITHUB_TOKEN, for the action downloads of "Set up job": issued only to a
        // job that uses actions, the one thing the fake runner needs it for.
        let github_token = if uses.is_empty() {
            String::new()
        } else {
            self.issue_token(repo.installation_id).0
        };
        Some(AssignedJob {
            job_id,
            run_id,
            name,
            git_ref: run.git_ref(),
            sha: run.head_sha.clone(),
            event: run.event.clone(),
            results_url: crate::results::results_url(&self.server_url),
            runtime_token: crate::results::runtime_token(&repository, &run.git_ref()),
            repository,
            uses,
            github_token,
        })
    }

    fn group_name(&self, runner: &Runner) -> String {
        let org = match &runner.scope {
            RunnerScope::Org(org) => Some(org.clone()),
            RunnerScope::Repo(id) => self.repos.get(id).map(|r| r.owner.clone()),
            // Enterprise runner groups are not modelled: Default.
            RunnerScope::Enterprise(_) => None,
        };
        org.and_then(|o| self.runner_groups.get(&o))
            .and_then(|gs| gs.iter().find(|g| g.id == runner.group_id))
            .map(|g| g.name.clone())
            .unwrap_or_else(|| "Default".into())
    }

    fn touch_run(&mut self, run_id: u64) {
        let now = self.now();
        if let Some(run) = self.runs.get_mut(&run_id) {
            run.updated_at = now;
        }
    }

    /// Completes a job. The ephemeral runner that ran it stays listed, busy and then offline,
    /// for [`State::ephemeral_lag`] before GitHub removes it (see [`State::age_runners`]).
    pub fn complete(&mut self, job_id: u64, conclusion: &str) -> bool {
        let now = self.now();
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return false;
        };
        if job.status == JobStatus::Completed {
            return false;
        }
        job.status = JobStatus::Completed;
        job.conclusion = Some(conclusion.to_owned());
        job.completed_at = Some(now);
        if job.started_at.is_none() {
            job.started_at = Some(now);
        }
        let (run_id, runner_id) = (job.run_id, job.runner_id);
        if let Some(r) = runner_id.and_then(|id| self.runners.get_mut(&id)) {
            r.job_done_at = Some(now);
        }
        self.touch_run(run_id);
        self.record_job_event(job_id, "completed");
        true
    }

    /// Scale-set runner `runner_id` reports its job `request_id` done with `conclusion`: a
    /// job still running completes (`JobCompleted`, the conclusion as the service names it);
    /// one completed already (early, or by a test) stays as it was. Either way the runner
    /// starts its lag as an ephemeral REST runner does. Whether the job was this runner's.
    pub fn finish_scale_set_job(
        &mut self,
        runner_id: u64,
        request_id: u64,
        conclusion: &str,
    ) -> bool {
        let now = self.now();
        let Some(job) = self
            .broker
            .job(request_id)
            .filter(|j| j.runner_id == Some(runner_id))
        else {
            return false;
        };
        if job.state == crate::broker::JobState::Running {
            self.broker
                .complete_job(request_id, crate::broker::scale_set_result(conclusion));
        }
        if let Some(r) = self.runners.get_mut(&runner_id)
            && r.job_done_at.is_none()
        {
            r.job_done_at = Some(now);
        }
        true
    }

    /// The runner of scale-set job `request_id`, if it still holds it, starts its lag: the
    /// job is over for it (completed by a test rather than by the runner).
    pub fn release_scale_set_runner(&mut self, request_id: u64) {
        let now = self.now();
        let runner = self.broker.job(request_id).and_then(|j| j.runner_id);
        if let Some(r) = runner.and_then(|id| self.runners.get_mut(&id))
            && r.busy
            && r.job_done_at.is_none()
        {
            r.job_done_at = Some(now);
        }
    }

    /// Re-runs a completed job as GitHub's "re-run a job" does: a new job (new id, same run,
    /// the run's attempt one more), queued with its `queued` delivery. GitHub's refusals: the
    /// job is not finished, or another job of its run is not ("The workflow run containing
    /// this job is already running"). Returns the new job's id.
    pub fn rerun(&mut self, job_id: u64) -> Result<u64, &'static str> {
        let job = self.jobs.get(&job_id).cloned().ok_or("Not Found")?;
        let running = self
            .jobs
            .values()
            .any(|j| j.run_id == job.run_id && j.status != JobStatus::Completed);
        if running {
            return Err("The workflow run containing this job is already running");
        }
        let run = self.runs.get_mut(&job.run_id).ok_or("Not Found")?;
        run.run_attempt += 1;
        let run_attempt = run.run_attempt;
        let new_id = self.next_id();
        let now = self.now();
        self.jobs.insert(
            new_id,
            Job {
                id: new_id,
                run_attempt,
                status: JobStatus::Queued,
                conclusion: None,
                runner_id: None,
                runner_name: None,
                runner_group_id: None,
                runner_group_name: None,
                created_at: now,
                started_at: None,
                completed_at: None,
                lock_renewed_at: None,
                ..job
            },
        );
        self.reruns.push((job_id, new_id));
        self.touch_run(job.run_id);
        self.record_job_event(new_id, "queued");
        Ok(new_id)
    }

    // ---- deliveries ----

    /// Records a `workflow_job` delivery for the job's current state; returns its id.
    pub fn record_job_event(&mut self, job_id: u64, action: &str) -> Option<u64> {
        let job = self.jobs.get(&job_id)?.clone();
        let run = self.runs.get(&job.run_id)?.clone();
        let repo = self.repos.get(&run.repo_id)?.clone();
        let ctx = self.ctx();
        let mut payload = json!({
            "action": action,
            "workflow_job": render::job(&ctx, &job, &run, &repo.full_name()),
            "repository": self.repo_json(&repo),
            "sender": render::user(&ctx, "fake-user", 1, "User"),
            "installation": {"id": repo.installation_id, "node_id": format!("I_{}", repo.installation_id)},
        });
        if self.owner_type(&repo.owner) == "Organization"
            && let Some(map) = payload.as_object_mut()
        {
            map.insert(
                "organization".into(),
                json!({"login": repo.owner, "id": repo.owner_id, "node_id": format!("O_{}", repo.owner_id)}),
            );
        }
        let body = Bytes::from(serde_json::to_vec(&payload).ok()?);
        let guid = uuid::Uuid::new_v4().to_string();
        Some(self.record_delivery(
            guid,
            "workflow_job",
            Some(action.to_owned()),
            Some(repo.installation_id),
            Some(repo.id),
            body,
            false,
        ))
    }

    /// Adds a delivery (signed with the current secret) to the log; returns its id.
    #[expect(
        clippy::too_many_arguments,
        reason = "a delivery's fields, named at each call"
    )]
    pub fn record_delivery(
        &mut self,
        guid: String,
        event: &str,
        action: Option<String>,
        installation_id: Option<u64>,
        repository_id: Option<u64>,
        body: Bytes,
        redelivery: bool,
    ) -> u64 {
        let id = self.next_id() + 90_000_000_000;
        let mut headers = vec![
            ("Accept".to_owned(), "*/*".to_owned()),
            ("Content-Type".to_owned(), "application/json".to_owned()),
            (
                "User-Agent".to_owned(),
                "GitHub-Hookshot/fake0001".to_owned(),
            ),
            ("X-GitHub-Delivery".to_owned(), guid.clone()),
            ("X-GitHub-Event".to_owned(), event.to_owned()),
            ("X-GitHub-Hook-ID".to_owned(), self.hook_id.to_string()),
            (
                "X-GitHub-Hook-Installation-Target-ID".to_owned(),
                self.app_id.to_string(),
            ),
            (
                "X-GitHub-Hook-Installation-Target-Type".to_owned(),
                "integration".to_owned(),
            ),
        ];
        if let Some(target) = &self.webhook {
            headers.push((
                "X-Hub-Signature-256".to_owned(),
                signature(target.secret.expose_secret().as_bytes(), &body),
            ));
        }
        let now = self.now();
        self.deliveries.push(Delivery {
            id,
            guid,
            event: event.to_owned(),
            action,
            installation_id,
            repository_id,
            redelivery,
            duplicate_of: None,
            sent_seq: None,
            delivered_at: now,
            body,
            headers,
            url: None,
            status: "pending".into(),
            status_code: 0,
            duration_ms: 0,
            response_body: String::new(),
        });
        id
    }

    /// A second sending of a delivery, as GitHub's at-least-once delivery sometimes does: same
    /// GUID, body and headers; returns its id.
    pub fn duplicate_delivery(&mut self, delivery_id: u64) -> Option<u64> {
        let original = self
            .deliveries
            .iter()
            .find(|d| d.id == delivery_id)?
            .clone();
        let id = self.next_id() + 90_000_000_000;
        let now = self.now();
        self.deliveries.push(Delivery {
            id,
            duplicate_of: Some(delivery_id),
            sent_seq: None,
            delivered_at: now,
            url: None,
            status: "pending".into(),
            status_code: 0,
            duration_ms: 0,
            response_body: String::new(),
            ..original
        });
        Some(id)
    }

    /// A new attempt of an earlier delivery: same GUID and body, re-signed.
    pub fn redeliver(&mut self, delivery_id: u64) -> Option<u64> {
        let d = self
            .deliveries
            .iter()
            .find(|d| d.id == delivery_id)?
            .clone();
        Some(self.record_delivery(
            d.guid,
            &d.event,
            d.action,
            d.installation_id,
            d.repository_id,
            d.body,
            true,
        ))
    }

    pub fn delivery_mut(&mut self, id: u64) -> Option<&mut Delivery> {
        self.deliveries.iter_mut().find(|d| d.id == id)
    }

    /// The behaviour a runner gets when it registers.
    pub fn behavior_for(&self, name: &str) -> RunnerBehavior {
        self.behavior_by_name
            .get(name)
            .cloned()
            .unwrap_or_else(|| self.default_behavior.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::new(1, String::new(), "http://x".into(), String::new())
    }

    fn online_runner(s: &mut State, scope: RunnerScope, labels: &[&str]) -> u64 {
        let id = s.next_id();
        s.runners.insert(
            id,
            Runner {
                id,
                name: format!("r{id}"),
                scope,
                labels: labels.iter().map(|l| l.to_string()).collect(),
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
        id
    }

    /// A registered scale-set runner of set `set` in `acme`, labelled like a REST runner.
    fn scale_set_runner(s: &mut State, set: u64) -> u64 {
        let id = online_runner(
            s,
            RunnerScope::Org("acme".into()),
            &["self-hosted", "linux"],
        );
        if let Some(r) = s.runners.get_mut(&id) {
            r.scale_set_id = Some(set);
        }
        id
    }

    fn set_job(s: &State, request_id: u64) -> crate::broker::ScaleSetJob {
        s.broker
            .job(request_id)
            .cloned()
            .unwrap_or_else(|| panic!("no job {request_id}"))
    }

    /// A scale-set runner takes the oldest assigned job of its own set only (`JobStarted`
    /// naming it), never a REST job its labels would fit; a REST runner never takes a
    /// scale-set job. Done, the job completes with the runner's conclusion as the service's
    /// result, and the runner lingers busy like an ephemeral REST runner.
    #[test]
    fn a_scale_set_runner_takes_only_its_sets_jobs_and_a_rest_runner_only_rest_jobs() {
        let mut s = state();
        let repo = s.add_repo("acme", "widgets", "Organization");
        let labels = vec!["self-hosted".to_owned(), "linux".to_owned()];
        let acme = RunnerScope::Org("acme".into());
        let mine = s.broker.add_set_for_test("mine", acme.clone());
        let other = s.broker.add_set_for_test("other", acme.clone());
        let runner = scale_set_runner(&mut s, mine);
        let rest_job = s.queue_job(repo, "rest", &labels).unwrap_or_default();
        let others = s.broker.queue_job(other, "theirs").unwrap_or_default();
        assert!(
            s.assign(runner).is_none(),
            "neither a REST job nor another set's"
        );
        let first = s.broker.queue_job(mine, "first").unwrap_or_default();
        let second = s.broker.queue_job(mine, "second").unwrap_or_default();
        let rest_runner = online_runner(&mut s, acme, &["self-hosted", "linux"]);
        assert_eq!(
            s.assign(rest_runner).map(|a| a.job_id),
            Some(rest_job),
            "the REST job, not a scale-set one"
        );
        let another_rest = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        assert!(
            s.assign(another_rest).is_none(),
            "no scale-set job for a REST runner"
        );
        let taken = s.assign(runner);
        assert_eq!(taken.as_ref().map(|a| a.job_id), Some(first), "the oldest");
        assert_eq!(
            taken.map(|a| (a.name, a.repository)),
            Some(("first".into(), "acme/widgets".into()))
        );
        let job = set_job(&s, first);
        assert_eq!(job.state, crate::broker::JobState::Running);
        assert_eq!(job.runner_id, Some(runner));
        assert!(s.runners[&runner].busy);
        assert!(s.assign(runner).is_none(), "one job at a time");
        assert!(
            !s.finish_scale_set_job(runner, second, "success"),
            "not its job"
        );
        assert!(s.renew_job(runner, first));
        assert!(s.finish_scale_set_job(runner, first, "failure"));
        let job = set_job(&s, first);
        assert_eq!(
            (job.state, job.result.as_deref()),
            (crate::broker::JobState::Completed, Some("failed"))
        );
        assert!(!s.renew_job(runner, first), "done");
        assert!(s.runners[&runner].busy, "busy for its lag");
        assert!(s.assign(runner).is_none(), "ephemeral: one job ever");
        s.clock_offset = s.ephemeral_lag.busy;
        s.age_runners();
        assert!(!s.runners[&runner].busy, "idle after its lag");
        assert_eq!(set_job(&s, second).state, crate::broker::JobState::Assigned);
        assert_eq!(set_job(&s, others).state, crate::broker::JobState::Assigned);
    }

    /// A scale-set runner that stops renewing its lock (it crashed) has its job given up
    /// after the lock timeout: `JobCompleted` `failed`, the runner offline and idle. One whose
    /// job was completed early is let go of the same way.
    #[test]
    fn a_scale_set_job_whose_runner_stops_renewing_is_failed_after_the_lock_timeout() {
        let mut s = state();
        s.add_repo("acme", "widgets", "Organization");
        let set = s
            .broker
            .add_set_for_test("mine", RunnerScope::Org("acme".into()));
        let crashed = scale_set_runner(&mut s, set);
        let early = scale_set_runner(&mut s, set);
        let job = s.broker.queue_job(set, "a").unwrap_or_default();
        let other = s.broker.queue_job(set, "b").unwrap_or_default();
        assert_eq!(s.assign(crashed).map(|a| a.job_id), Some(job));
        assert_eq!(s.assign(early).map(|a| a.job_id), Some(other));
        assert!(s.broker.complete_job(other, "succeeded"));
        s.clock_offset = s.job_lock_timeout - Duration::from_secs(1);
        s.age_runners();
        assert_eq!(set_job(&s, job).state, crate::broker::JobState::Running);
        s.clock_offset = s.job_lock_timeout;
        s.age_runners();
        let given_up = set_job(&s, job);
        assert_eq!(
            (given_up.state, given_up.result.as_deref()),
            (crate::broker::JobState::Completed, Some("failed"))
        );
        assert_eq!(set_job(&s, other).result.as_deref(), Some("succeeded"));
        for id in [crashed, early] {
            let r = &s.runners[&id];
            assert!(!r.busy && !r.online && r.abandoned, "{id} let go of");
        }
    }

    /// `JobCompleted` sent while the runner still runs the job (early completion): the runner
    /// stays busy and holds its lock; its own report later is accepted and changes nothing but
    /// its lag (no second `JobCompleted`).
    #[test]
    fn a_scale_set_job_completed_early_stays_its_runners_until_it_reports_done() {
        let mut s = state();
        s.add_repo("acme", "widgets", "Organization");
        let set = s
            .broker
            .add_set_for_test("mine", RunnerScope::Org("acme".into()));
        let runner = scale_set_runner(&mut s, set);
        let job = s.broker.queue_job(set, "build").unwrap_or_default();
        assert_eq!(s.assign(runner).map(|a| a.job_id), Some(job));
        assert!(s.broker.complete_job(job, "succeeded"));
        let completed = |s: &State| {
            s.broker.scale_sets[&set]
                .pending
                .iter()
                .flat_map(|m| m.jobs.iter())
                .filter(|j| j["messageType"] == "JobCompleted")
                .count()
        };
        assert_eq!(completed(&s), 1);
        assert!(s.runners[&runner].busy, "still running it");
        assert!(s.renew_job(runner, job), "the runner still holds it");
        s.clock_offset = s.ephemeral_lag.busy * 2;
        s.age_runners();
        assert!(s.runners[&runner].busy, "no lag before it reports");
        assert!(s.finish_scale_set_job(runner, job, "success"));
        assert!(
            s.finish_scale_set_job(runner, job, "success"),
            "again: harmless"
        );
        assert_eq!(completed(&s), 1, "no second JobCompleted");
        assert_eq!(set_job(&s, job).result.as_deref(), Some("succeeded"));
        s.clock_offset += s.ephemeral_lag.busy;
        s.age_runners();
        assert!(!s.runners[&runner].busy);
    }

    #[test]
    fn a_rerun_is_a_new_job_of_the_same_run_one_attempt_later_once_the_run_is_done() {
        let mut s = state();
        let repo = s.add_repo("acme", "w", "Organization");
        let labels = vec!["self-hosted".to_owned()];
        let ids = s
            .queue_matrix(repo, "test", &labels, &["a".into(), "b".into()])
            .unwrap_or_default();
        let (a, b) = (ids[0], ids[1]);
        // Not finished, or its run is not: refused as GitHub refuses it.
        let running = Err("The workflow run containing this job is already running");
        assert_eq!(s.rerun(a), running);
        assert!(s.complete(a, "failure"));
        assert_eq!(s.rerun(a), running, "b is still queued");
        assert!(s.complete(b, "success"));
        let new = s.rerun(a).unwrap_or_default();
        let (old, again) = (s.jobs[&a].clone(), s.jobs[&new].clone());
        assert_ne!(new, a);
        assert_eq!(again.run_id, old.run_id);
        assert_eq!((old.run_attempt, again.run_attempt), (1, 2));
        assert_eq!(again.status, JobStatus::Queued);
        assert_eq!(again.conclusion, None);
        assert_eq!(again.name, old.name);
        assert_eq!(s.runs[&old.run_id].run_attempt, 2);
        assert_eq!(s.reruns, vec![(a, new)]);
        assert_eq!(s.rerun(404_404), Err("Not Found"));
    }

    #[test]
    fn signature_matches_githubs_test_vector() {
        assert_eq!(
            signature(b"It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn jobs_go_to_runners_whose_labels_cover_them_and_move_forward() {
        let mut s = state();
        let repo = s.add_repo("acme", "w", "Organization");
        let labels = vec!["self-hosted".to_owned(), "Linux".to_owned()];
        let job = s.queue_job(repo, "build", &labels).unwrap_or_default();
        let other_org = online_runner(
            &mut s,
            RunnerScope::Org("else".into()),
            &["self-hosted", "linux"],
        );
        let too_few = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        assert!(s.assign(other_org).is_none());
        assert!(s.assign(too_few).is_none());
        let good = online_runner(
            &mut s,
            RunnerScope::Repo(repo),
            &["self-hosted", "linux", "x64"],
        );
        let assigned = s.assign(good).map(|a| a.job_id);
        assert_eq!(assigned, Some(job));
        assert_eq!(s.run_status(s.jobs[&job].run_id).0, "in_progress");
        assert!(s.complete(job, "success"));
        assert!(!s.complete(job, "failure"), "completed is final");
        s.age_runners();
        assert!(
            s.runners.get(&good).is_some_and(|r| r.busy),
            "a finished ephemeral runner is still listed busy at first"
        );
        assert!(
            s.assign(good).is_none(),
            "an ephemeral runner takes one job"
        );
        assert_eq!(
            s.run_status(s.jobs[&job].run_id),
            ("completed", Some("success".into()))
        );
        let actions: Vec<_> = s
            .deliveries
            .iter()
            .filter_map(|d| d.action.clone())
            .collect();
        assert_eq!(actions, ["queued", "in_progress", "completed"]);
    }

    #[test]
    fn a_finished_ephemeral_runner_is_busy_then_listed_then_removed_by_github() {
        let mut s = state();
        let repo = s.add_repo("acme", "w", "Organization");
        let job = s
            .queue_job(repo, "build", &["self-hosted".into()])
            .unwrap_or_default();
        let runner = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        assert_eq!(s.assign(runner).map(|a| a.job_id), Some(job));
        assert!(s.complete(job, "success"));
        let lag = s.ephemeral_lag;
        let at = |s: &mut State, after: Duration| {
            s.clock_offset = after;
            s.age_runners();
            s.runners.get(&runner).map(|r| (r.busy, r.online))
        };
        assert_eq!(at(&mut s, Duration::ZERO), Some((true, true)));
        let just_before = lag.busy - Duration::from_millis(100);
        assert_eq!(at(&mut s, just_before), Some((true, true)));
        assert_eq!(at(&mut s, lag.busy), Some((false, false)));
        assert!(s.expired_runners.is_empty());
        assert_eq!(at(&mut s, lag.listed), None, "GitHub removed it itself");
        assert_eq!(s.expired_runners, [format!("r{runner}")]);
    }

    /// A runner that stops renewing its job's lock (it crashed) has the job given up after the
    /// lock timeout, as GitHub does: the job completes with `failure` and its delivery, the
    /// runner is listed offline and idle (deletable) and takes nothing more. A runner that
    /// renews keeps its job however long it runs.
    #[test]
    fn a_job_whose_runner_stops_renewing_is_failed_after_the_lock_timeout() {
        let mut s = state();
        let repo = s.add_repo("acme", "w", "Organization");
        let labels = vec!["self-hosted".to_owned()];
        let crashed_job = s.queue_job(repo, "a", &labels).unwrap_or_default();
        let alive_job = s.queue_job(repo, "b", &labels).unwrap_or_default();
        let crashed = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        let alive = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        assert_eq!(s.assign(crashed).map(|a| a.job_id), Some(crashed_job));
        assert_eq!(s.assign(alive).map(|a| a.job_id), Some(alive_job));
        let timeout = s.job_lock_timeout;
        assert_eq!(timeout, JOB_LOCK_TIMEOUT);
        let step = crate::jit::JOB_RENEW_INTERVAL;
        let mut t = Duration::ZERO;
        while t + step < timeout + step * 2 {
            t += step;
            s.clock_offset = t;
            assert!(s.renew_job(alive, alive_job), "renewal at {t:?}");
            s.age_runners();
            let still = s.jobs[&crashed_job].status == JobStatus::InProgress;
            assert_eq!(still, t < timeout, "the crashed runner's job at {t:?}");
        }
        let job = &s.jobs[&crashed_job];
        assert_eq!(
            (job.status, job.conclusion.as_deref()),
            (JobStatus::Completed, Some("failure"))
        );
        assert_eq!(s.abandoned_jobs, [crashed_job]);
        assert_eq!(s.jobs[&alive_job].status, JobStatus::InProgress, "renewed");
        let r = &s.runners[&crashed];
        assert!(!r.busy && !r.online, "listed offline and idle");
        assert!(!s.renew_job(crashed, crashed_job), "given up for good");
        let completed: Vec<_> = s
            .deliveries
            .iter()
            .filter(|d| d.action.as_deref() == Some("completed"))
            .collect();
        assert_eq!(completed.len(), 1);
        // Offline and not GitHub's to expire: it stays listed until someone deletes it.
        s.clock_offset = t + EPHEMERAL_LISTED_LAG * 2;
        s.age_runners();
        assert!(s.runners.contains_key(&crashed));
        s.queue_job(repo, "c", &labels);
        assert!(s.assign(crashed).is_none(), "it takes no other job");
    }

    #[test]
    fn waiting_jobs_are_not_handed_out_until_approved() {
        let mut s = state();
        let repo = s.add_repo("acme", "w", "Organization");
        let job = s
            .queue_waiting_job(repo, "deploy", &["self-hosted".into()])
            .unwrap_or_default();
        let runner = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        assert!(s.assign(runner).is_none());
        assert_eq!(s.run_status(s.jobs[&job].run_id).0, "waiting");
        assert!(s.approve(job));
        assert!(!s.approve(job), "only a waiting job is approved");
        assert_eq!(s.assign(runner).map(|a| a.job_id), Some(job));
        let actions: Vec<_> = s
            .deliveries
            .iter()
            .filter_map(|d| d.action.clone())
            .collect();
        assert_eq!(actions, ["waiting", "queued", "in_progress"]);
    }

    #[test]
    fn a_matrix_is_one_run_and_a_vanishing_job_is_only_announced() {
        let mut s = state();
        let repo = s.add_repo("acme", "w", "Organization");
        let labels = vec!["self-hosted".to_owned()];
        let variants = vec!["a".to_owned(), "b".to_owned()];
        let ids = s
            .queue_matrix(repo, "test", &labels, &variants)
            .unwrap_or_default();
        assert_eq!(ids.len(), 2);
        assert_eq!(s.jobs[&ids[0]].run_id, s.jobs[&ids[1]].run_id);
        assert_eq!(s.jobs[&ids[1]].name, "test (b)");
        assert_eq!(s.deliveries.len(), 2, "one queued delivery per job");
        let runner = online_runner(&mut s, RunnerScope::Org("acme".into()), &["self-hosted"]);
        for id in &ids {
            s.complete(*id, "success");
        }
        let gone = s.queue_vanishing_job(repo, "gone", &labels);
        assert!(gone.is_some_and(|id| !s.jobs.contains_key(&id)));
        assert_eq!(s.deliveries.len(), 5, "the vanishing job was announced");
        assert!(s.assign(runner).is_none(), "and is never handed out");
    }

    #[test]
    fn quotas_refill_after_their_window() {
        let mut s = state();
        s.quota("app", "core").remaining = 0;
        assert_eq!(s.quota("app", "core").remaining, 0);
        s.clock_offset = RATE_WINDOW + Duration::from_secs(1);
        assert_eq!(s.quota("app", "core").remaining, DEFAULT_LIMIT);
    }

    #[test]
    fn redelivery_keeps_the_guid_and_body() {
        let mut s = state();
        let repo = s.add_repo("alice", "tool", "User");
        s.queue_job(repo, "j", &["self-hosted".into()]);
        let first = s.deliveries[0].clone();
        let again = s.redeliver(first.id).unwrap_or_default();
        let second = s.deliveries.iter().find(|d| d.id == again).cloned();
        let second = second.unwrap_or_else(|| panic!("no redelivery"));
        assert_eq!(
            (second.guid, second.body, second.redelivery),
            (first.guid, first.body, true)
        );
        let payload: serde_json::Value =
            serde_json::from_slice(&s.deliveries[0].body).unwrap_or_default();
        assert_eq!(
            payload["installation"]["id"],
            s.repos[&repo].installation_id
        );
        assert!(
            payload.get("organization").is_none(),
            "a user's repo has no organization"
        );
    }
}
