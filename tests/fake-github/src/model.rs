//! What the fake GitHub holds: installations, repositories, runner groups, runners, workflow
//! runs and jobs, tokens, deliveries and the requests it has seen. Plain data; the operations
//! that change it live in [`crate::state`].

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::jit::RunnerBehavior;

/// An App installation on an account.
#[derive(Debug, Clone)]
pub struct Installation {
    pub id: u64,
    /// The App installed: the fake's primary App, or one added by `FakeGithub::add_app`.
    pub app_id: u64,
    pub account_login: String,
    pub account_id: u64,
    /// `Organization` or `User`.
    pub account_type: String,
    pub permissions: BTreeMap<String, String>,
    pub created_at: SystemTime,
}

/// The permissions a fresh installation gets: everything rm needs.
pub fn default_permissions() -> BTreeMap<String, String> {
    [
        ("actions", "read"),
        ("administration", "write"),
        ("metadata", "read"),
        ("organization_self_hosted_runners", "write"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[derive(Debug, Clone)]
pub struct Repo {
    pub id: u64,
    pub owner: String,
    pub owner_id: u64,
    pub name: String,
    pub private: bool,
    pub installation_id: u64,
    pub created_at: SystemTime,
    /// The branch GitHub names `default_branch` (`main` unless a test says otherwise): the
    /// branch whose caches every ref of the repository may restore.
    pub default_branch: String,
}

impl Repo {
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.owner, self.name)
    }
}

#[derive(Debug, Clone)]
pub struct RunnerGroup {
    pub id: u64,
    pub name: String,
    pub default: bool,
}

/// Where a runner is registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerScope {
    Org(String),
    Repo(u64),
    /// An enterprise, by its slug: its runners may take jobs of every repository (the fake
    /// does not model which organizations an enterprise holds).
    Enterprise(String),
}

#[derive(Debug, Clone)]
pub struct Runner {
    pub id: u64,
    pub name: String,
    pub scope: RunnerScope,
    pub labels: Vec<String>,
    pub group_id: u64,
    /// True once the runner process has registered (it is then `online`).
    pub online: bool,
    pub busy: bool,
    /// When the job this (ephemeral) runner ran completed: from then on GitHub keeps listing it
    /// for a while, busy at first (see [`crate::state::EphemeralLag`]), before removing it.
    pub job_done_at: Option<SystemTime>,
    /// GitHub gave its job up when it stopped renewing the lock (a crash): listed offline until
    /// someone deletes it; it takes no other job.
    pub abandoned: bool,
    /// The runner's credential in the fake's runner protocol.
    pub token: String,
    pub behavior: Option<RunnerBehavior>,
    /// The scale set it was created for (`generatejitconfig`): it takes only that set's
    /// assigned jobs, never a REST job (see [`crate::broker`]). `None`: a REST JIT runner.
    pub scale_set_id: Option<u64>,
}

/// A job's status, as GitHub names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    /// Held by an environment's protection rules until approved.
    Waiting,
    Queued,
    InProgress,
    Completed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Waiting => "waiting",
            JobStatus::Queued => "queued",
            JobStatus::InProgress => "in_progress",
            JobStatus::Completed => "completed",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Run {
    pub id: u64,
    pub repo_id: u64,
    pub run_number: u64,
    pub run_attempt: u64,
    pub workflow_name: String,
    pub head_sha: String,
    pub head_branch: String,
    /// What triggered the run (`push`, `pull_request`, ...), as the run's `event` says.
    pub event: String,
    /// `owner/name` of the repository the head commit is in: the run's own, or a fork's for a
    /// pull request from a fork.
    pub head_repository: String,
    /// The pull request's number for a `pull_request` run (its `GITHUB_REF` is
    /// `refs/pull/<n>/merge`); `None` otherwise.
    pub pull_number: Option<u64>,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

impl Run {
    /// The ref a job of this run checks out and runs for (`GITHUB_REF`): the pull request's
    /// merge ref for a pull request, the branch otherwise.
    pub fn git_ref(&self) -> String {
        match self.pull_number {
            Some(n) => format!("refs/pull/{n}/merge"),
            None => format!("refs/heads/{}", self.head_branch),
        }
    }
}

/// Who a queued job is, beyond its repository: what its run says of the branch, the event and
/// the head repository, the repository's default branch, and the actions its steps use. What
/// the agent learns a job's cache scope from, and what the fake runner's job message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOrigin {
    /// `main` by default.
    pub head_branch: String,
    /// `push` by default; `pull_request` makes the run a pull request's (a number of its own).
    pub event: String,
    /// `owner/name`; `None` (the default): the job's own repository.
    pub head_repository: Option<String>,
    /// Sets the repository's default branch before the job is queued; `None` leaves it.
    pub default_branch: Option<String>,
    /// The actions the job's steps use, `owner/repo@sha`, in order (none by default).
    pub uses: Vec<String>,
}

impl Default for JobOrigin {
    fn default() -> Self {
        JobOrigin {
            head_branch: "main".into(),
            event: "push".into(),
            head_repository: None,
            default_branch: None,
            uses: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Job {
    pub id: u64,
    pub run_id: u64,
    /// The run attempt the job belongs to: 1, and one more for each re-run of it (a re-run is
    /// a new job of the same run; the earlier job keeps its attempt).
    pub run_attempt: u64,
    pub name: String,
    pub labels: Vec<String>,
    pub status: JobStatus,
    pub conclusion: Option<String>,
    pub runner_id: Option<u64>,
    pub runner_name: Option<String>,
    pub runner_group_id: Option<u64>,
    pub runner_group_name: Option<String>,
    pub created_at: SystemTime,
    pub started_at: Option<SystemTime>,
    pub completed_at: Option<SystemTime>,
    /// When the runner running it last renewed its lock (`None`: not since it started).
    pub lock_renewed_at: Option<SystemTime>,
    /// The actions its steps use, `owner/repo@sha` ([`JobOrigin::uses`]).
    pub uses: Vec<String>,
}

/// One attempt to deliver a webhook.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: u64,
    pub guid: String,
    pub event: String,
    pub action: Option<String>,
    pub installation_id: Option<u64>,
    pub repository_id: Option<u64>,
    pub redelivery: bool,
    /// The delivery this one repeats (same GUID and body): GitHub delivering one event twice.
    pub duplicate_of: Option<u64>,
    /// Position in the order the sender finished sending (`None` until sent): with webhooks
    /// delayed and reordered, not the order they were recorded in.
    pub sent_seq: Option<u64>,
    pub delivered_at: SystemTime,
    /// The exact body sent.
    pub body: bytes::Bytes,
    /// The headers sent (signature included).
    pub headers: Vec<(String, String)>,
    /// The webhook URL it was sent to (`None` until sent, or when none is configured).
    pub url: Option<String>,
    /// Filled in when the attempt is over: `OK`, or what went wrong.
    pub status: String,
    /// The receiver's status code, 0 while pending or when there was no answer.
    pub status_code: u16,
    pub duration_ms: u64,
    pub response_body: String,
}

/// One request the fake answered.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub method: String,
    /// The path below the API base (the runner protocol keeps its own prefix).
    pub path: String,
    pub query: String,
    pub status: u16,
    /// Request headers; the credential of `authorization` is replaced by `<redacted>`.
    pub headers: Vec<(String, String)>,
    /// The request's JSON body, if it had one.
    pub body: Option<serde_json::Value>,
    /// The JSON body of the answer, if it had one.
    pub response_body: Option<serde_json::Value>,
    /// The answer's headers (`retry-after`, `x-ratelimit-*`, ...), beside those every answer has.
    pub response_headers: Vec<(String, String)>,
    /// Whose request it was by its credential (an installation token, or the App's JWT);
    /// `None` for the runner protocol and requests without a credential.
    pub caller: Option<crate::auth::Caller>,
    /// When the fake answered it (the fake's clock, as `Job::created_at`).
    pub at: SystemTime,
}

/// What kind of request a [`RequestRecord`] was, by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestKind {
    /// A credential: an installation token, a registration token, the RemoteAuth exchange.
    Token,
    /// The Actions service of scale sets (`/rest/…`) or its message queue.
    Broker,
    /// The fake's runner protocol (what runners say, not what a manager asks).
    RunnerProtocol,
    /// A release download (github.com, not the API).
    Download,
    /// GitHub's results service (cache v2, artifacts), the fake's stand-in for it
    /// ([`crate::results`]): a job's cache calls that were not redirected land here.
    Results,
    /// Any other REST API request.
    Rest,
}

impl RequestRecord {
    /// What kind of request it was.
    pub fn kind(&self) -> RequestKind {
        let path = self.path.as_str();
        if path.ends_with("/access_tokens")
            || path.ends_with("/registration-token")
            || path.ends_with("/actions/runner-registration")
        {
            RequestKind::Token
        } else if path.starts_with("/rest/") || path.starts_with("/scalesets/") {
            RequestKind::Broker
        } else if crate::results::owns(path) {
            RequestKind::Results
        } else if path.starts_with(crate::jit::RUNNER_PROTOCOL_PREFIX) {
            RequestKind::RunnerProtocol
        } else if path.starts_with(crate::releases::DOWNLOAD_PREFIX)
            || path.starts_with(crate::releases::ASSET_STORAGE_PREFIX)
        {
            RequestKind::Download
        } else {
            RequestKind::Rest
        }
    }

    /// `METHOD path` with every numeric path segment as `{id}`: what
    /// [`crate::FakeGithub::request_counts_since`] counts by.
    pub fn endpoint(&self) -> String {
        let path: Vec<&str> = self
            .path
            .split('/')
            .map(|seg| {
                if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
                    "{id}"
                } else {
                    seg
                }
            })
            .collect();
        format!("{} {}", self.method, path.join("/"))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A header of the answer, by name.
    pub fn response_header(&self, name: &str) -> Option<&str> {
        self.response_headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the answer was a secondary rate limit (403 or 429 with GitHub's message).
    pub fn secondary_limited(&self) -> bool {
        matches!(self.status, 403 | 429)
            && self
                .response_body
                .as_ref()
                .and_then(|b| b.get("message"))
                .and_then(serde_json::Value::as_str)
                .is_some_and(|m| m.contains("secondary rate limit"))
    }
}
