//! The fake's Actions service for runner scale sets (the "broker"): the registration token and
//! the RemoteAuth exchange, scale sets, message sessions, the long-polled message queue, job
//! acquisition, scale-set JIT configurations and runners, as `actions/scaleset` and ARC see
//! them (see `github-scale-sets.md` §1.3–1.13). An enterprise
//! ([`Broker::enterprise_pats`]) takes only its classic PAT for its registration token (an
//! installation token is `403`, anything else `401`), and that token opens only the
//! enterprise's config URL (`…/enterprises/{slug}`); its scale sets are served like an
//! organization's. It owns the broker's state ([`Broker`]) and
//! its answers; [`crate::server`] hands it every request it owns ([`owns`]) before anything
//! else.
//!
//! Paths: `{api}/actions/runner-registration` and
//! `{api}/{orgs|repos|enterprises}/…/registration-token` below the API base; the service itself at `{server}/rest/_apis/runtime/…` and
//! `{server}/rest/_apis/distributedtask/pools/0/agents`; the queue at
//! `{server}/scalesets/message?scaleSetId={id}` (its query kept, ids appended to its path).
//! Every service call must carry `api-version=6.0-preview` (in the query, or for the queue in
//! `Accept`), and the admin token or, for the queue and `acquirejobs`, the session's queue
//! token.
//!
//! Jobs follow `queued → available/assigned → running → completed` ([`JobState`]): assigned
//! only while the set's unfinished assigned jobs are below the last `X-ScaleSetMaxCapacity`,
//! in GHES mode announced `JobAvailable` and assigned only once acquired; their job messages
//! (repository, owner, run id, workflow ref, labels; the runner on started and completed) are
//! batched at most [`Broker::jobs_per_message`] a message, and the statistics on every message
//! and session are computed from their states. With [`Broker::reassign_after`] set, a job
//! assigned and not started in time is cancelled and assigned again, at most
//! [`MAX_REASSIGNMENTS`] times.
//!
//! Scale-set runners are runners of the fake ([`State::runners`], with
//! [`Runner::scale_set_id`]): `generatejitconfig` registers one in the set's target (the
//! RemoteAuth `url`: an organization or a repository), listed by its REST runner list, with the
//! fake's [`crate::jit::FakeJitConfig`] as `encodedJITConfig`. Through the runner protocol it
//! takes the oldest assigned job of its own set only ([`State::assign`]) and reports it done
//! (`JobCompleted` with its conclusion as the service's result); REST runners never take
//! scale-set jobs. The service's runner endpoints (`_apis/distributedtask/pools/0/agents`)
//! find, get and remove the runners of the admin token's target: removal is `204` also for a
//! runner gone, `JobStillRunningException` while it is busy (its job, then its lag).
//!
//! By default it answers as `actions/scaleset` expects the service to; knobs make it answer as
//! other services and proxies do, each decided by its status first: unsecured admin and queue
//! tokens ([`Broker::alg_none_tokens`]), a session conflict under another type name or none
//! ([`Broker::session_conflict_type`]), a bare `404` on the queue for a session it dropped
//! ([`Broker::drop_sessions`]) and for a scale set that does not exist
//! ([`Broker::bare_not_found`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};

use crate::model::{RequestRecord, Runner, RunnerScope};
use crate::server::Shared;
use crate::state::State;

/// The API version every Actions-service call carries.
pub const API_VERSION: &str = "api-version=6.0-preview";
/// How long the fake's admin tokens live (the real TTL is undocumented; one hour assumed).
pub const ADMIN_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// How long a registration token lives, as GitHub's.
pub const REGISTRATION_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// How long a poll waits for a message before `202`, by default (GitHub holds ~50 s).
pub const DEFAULT_HOLD: Duration = Duration::from_millis(50);
/// How often a held poll looks for a message.
const HOLD_STEP: Duration = Duration::from_millis(5);
/// The most job messages one queue message carries; a larger backlog is split over several
/// messages (the `actions/scaleset` README: "at most 50 job messages per response").
pub const MAX_JOBS_PER_MESSAGE: usize = 50;
/// The queue's path on the server.
const QUEUE_PATH: &str = "/scalesets/message";
/// The service's path on the server.
const SERVICE_PREFIX: &str = "/rest/";
/// The service's runner endpoints (`github-scale-sets.md` §1.13).
const AGENTS_PATH: &str = "/rest/_apis/distributedtask/pools/0/agents";
/// How many times a job assigned and not started is cancelled and assigned again (the
/// `actions/scaleset` README: "up to 3 times").
pub const MAX_REASSIGNMENTS: u32 = 3;
/// The exception type name of the `409` a session create meets while the set has a session,
/// as the service names it.
pub const SESSION_CONFLICT_TYPE: &str = "RunnerScaleSetSessionConflictException";

/// A scale set.
#[derive(Debug, Clone)]
pub struct ScaleSet {
    pub id: u64,
    pub name: String,
    pub runner_group_id: u64,
    pub labels: Vec<String>,
    /// Where its runners are registered: the target of the admin token that created it.
    pub scope: RunnerScope,
    /// The repository (`owner/name`) its jobs come from unless queued in another one.
    pub default_repository: String,
    /// Messages not yet deleted, oldest first.
    pub pending: Vec<Message>,
    /// Runner request ids announced and not yet acquired.
    pub acquirable: Vec<u64>,
    /// Its jobs by runner request id, in the order they were queued.
    pub jobs: BTreeMap<u64, ScaleSetJob>,
    /// Job messages not yet put into a [`Message`].
    pub outbox: Vec<Value>,
    /// The `X-ScaleSetMaxCapacity` of the last poll; `None` (no limit) before the first, so
    /// that a job queued before any poll is assigned at once, as the service does.
    pub capacity: Option<u64>,
}

/// Where a scale-set job is (`github-scale-sets.md` §6.6: queued → available/assigned →
/// running → completed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for capacity to be assigned (github.com).
    Queued,
    /// Announced as `JobAvailable`, waiting for `acquirejobs` (GHES mode).
    Available,
    /// Acquired, waiting for capacity to be assigned (GHES mode).
    Acquired,
    /// Assigned to the scale set (`JobAssigned` sent).
    Assigned,
    /// Picked up by a runner (`JobStarted` sent).
    Running,
    /// Finished (`JobCompleted` sent).
    Completed,
}

/// A job of a scale set.
#[derive(Debug, Clone)]
pub struct ScaleSetJob {
    pub name: String,
    pub state: JobState,
    /// `owner/name`.
    pub repository: String,
    pub workflow_run_id: u64,
    /// The runner that started it.
    pub runner_name: Option<String>,
    pub runner_id: Option<u64>,
    /// When it was last assigned (on the fake's clock): the reassignment timer counts from it.
    pub assigned_at: Option<SystemTime>,
    /// How many times it was cancelled and assigned again for want of a runner.
    pub reassignments: u32,
    /// When its runner took it, and last renewed its lock (see [`crate::state::JOB_LOCK_TIMEOUT`]).
    pub started_at: Option<SystemTime>,
    pub lock_renewed_at: Option<SystemTime>,
    /// Its `JobCompleted` result.
    pub result: Option<String>,
}

/// A runner's conclusion (`success`, `failure`, `cancelled`) as the service's `result`
/// (`succeeded`, `failed`, `canceled`); any other as it is.
pub fn scale_set_result(conclusion: &str) -> &str {
    match conclusion {
        "success" => "succeeded",
        "failure" => "failed",
        "cancelled" => "canceled",
        other => other,
    }
}

/// A message of the queue.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: u64,
    /// The job messages of its `body`.
    pub jobs: Vec<Value>,
}

/// A message session: one per scale set.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub owner: String,
    pub queue_token: String,
    /// Whether the queue token is still accepted.
    pub token_valid: bool,
}

/// The broker's state, inside the fake's [`State`].
#[derive(Debug)]
pub struct Broker {
    pub registration_tokens: HashMap<String, SystemTime>,
    /// The enterprise each registration token issued with an enterprise's PAT is for: it
    /// opens that enterprise's config URL and no other (and no other token opens it).
    pub enterprise_registrations: HashMap<String, String>,
    /// The enterprises the fake has, by slug, each with the one classic PAT it accepts.
    pub enterprise_pats: HashMap<String, String>,
    pub admin_tokens: HashMap<String, SystemTime>,
    pub scale_sets: BTreeMap<u64, ScaleSet>,
    /// The target (organization or repository) of each admin token, from the RemoteAuth
    /// exchange's `url`.
    pub admin_targets: HashMap<String, RunnerScope>,
    /// Sessions by scale-set id.
    pub sessions: BTreeMap<u64, Session>,
    next_id: u64,
    next_message_id: u64,
    /// How long a poll is held before `202`.
    pub hold: Duration,
    /// Answer the next poll with an empty `200`.
    pub empty_next_poll: bool,
    /// Prefix the next JSON answer with a UTF-8 byte-order mark.
    pub bom_next: bool,
    /// Answer this many next polls with [`Broker::failing_status`].
    pub failing_polls: u32,
    /// The status of a failing poll (a 5xx outage, a 403).
    pub failing_status: u16,
    /// The Actions service is down: every request to it (sessions, polls, acknowledgements,
    /// JIT configurations, removals) is answered `503` until this is cleared.
    pub down: bool,
    /// GHES mode: jobs are announced `JobAvailable` and assigned only once acquired.
    pub ghes: bool,
    /// A job assigned and not started within this is cancelled (`JobCompleted` `canceled`)
    /// and assigned again, at most [`MAX_REASSIGNMENTS`] times. `None` (the default): never.
    pub reassign_after: Option<Duration>,
    /// The status of `JobStillRunningException` when a busy runner is deleted: 400 as ARC's
    /// ADR saw it, 409 as the Go client's test has it (a client must read the `typeName`).
    pub job_still_running_status: u16,
    /// Lose the answers of this many next `generatejitconfig` calls: the runner is registered
    /// and the caller gets `503` (a timeout after the service acted, §1.12): asking again with
    /// the same name is `409 AgentExistsException`.
    pub lost_jit_answers: u32,
    /// Refuse this many next removals of an existing runner with `JobStillRunningException`,
    /// busy or not: the service handing the runner a job at the instant it is removed (a race
    /// a scale-down must lose gracefully).
    pub refused_removals: u32,
    /// Scale-set runners asking for a job get none (runners slow to come: an assigned job
    /// waits, and is reassigned if [`Broker::reassign_after`] says so).
    pub runners_paused: bool,
    /// The most job messages one queue message carries: [`MAX_JOBS_PER_MESSAGE`] as the
    /// service, less for a test that wants a small burst truncated over several messages.
    pub jobs_per_message: usize,
    /// Issue the admin and queue tokens as unsecured JWTs (`"alg": "none"`, an empty
    /// signature), as an emulator of the service others wrote does: a client reads their
    /// `exp` whatever the header's algorithm, or not at all. Off: `RS256`-shaped tokens.
    pub alg_none_tokens: bool,
    /// The `typeName` of the `409` a session create meets while the set has a session:
    /// [`SESSION_CONFLICT_TYPE`] by default, another name, or `None` (a body with a message
    /// and no type name): a client must decide on the status.
    pub session_conflict_type: Option<String>,
    /// Queue tokens of sessions the broker dropped ([`Broker::drop_sessions`]): a queue call
    /// (poll, acknowledgement) or `acquirejobs` carrying one is answered `404` without a type
    /// name (the session is gone, not the token unknown). Empty by default: a token of no
    /// session is `401`.
    pub dropped_queue_tokens: HashSet<String>,
    /// A scale set that does not exist is answered with a bare `404` (a message, no
    /// `RunnerScaleSetNotFoundException`), as a proxy or another version of the service may
    /// answer: a client must decide on the status. Off by default.
    pub bare_not_found: bool,
    /// The fake's clock, set by [`State::age_runners`] before every change.
    pub now: SystemTime,
}

impl Default for Broker {
    fn default() -> Self {
        Broker {
            registration_tokens: HashMap::new(),
            enterprise_registrations: HashMap::new(),
            enterprise_pats: HashMap::new(),
            admin_tokens: HashMap::new(),
            scale_sets: BTreeMap::new(),
            admin_targets: HashMap::new(),
            sessions: BTreeMap::new(),
            next_id: 1,
            next_message_id: 100_000,
            hold: DEFAULT_HOLD,
            empty_next_poll: false,
            bom_next: false,
            failing_polls: 0,
            failing_status: 500,
            down: false,
            ghes: false,
            reassign_after: None,
            job_still_running_status: 400,
            lost_jit_answers: 0,
            refused_removals: 0,
            runners_paused: false,
            jobs_per_message: MAX_JOBS_PER_MESSAGE,
            alg_none_tokens: false,
            session_conflict_type: Some(SESSION_CONFLICT_TYPE.to_owned()),
            dropped_queue_tokens: HashSet::new(),
            bare_not_found: false,
            now: SystemTime::UNIX_EPOCH,
        }
    }
}

impl Broker {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Queues a job for scale set `id`: announced `JobAvailable` in GHES mode, else assigned
    /// (`JobAssigned`) as soon as capacity allows. Its runner request id, or `None` for an
    /// unknown set.
    pub fn queue_job(&mut self, id: u64, job_name: &str) -> Option<u64> {
        Some(self.queue_jobs(id, &[job_name])?[0])
    }

    /// Queues `names` as one burst, so that their messages are batched together (at most
    /// [`Broker::jobs_per_message`] a message); their runner request ids, or `None` for an unknown
    /// set.
    pub fn queue_jobs(&mut self, id: u64, names: &[&str]) -> Option<Vec<u64>> {
        self.queue_jobs_in(id, names, None)
    }

    /// [`Broker::queue_jobs`] from repository `owner/name` (`None`: the set's
    /// [`ScaleSet::default_repository`]).
    pub fn queue_jobs_in(
        &mut self,
        id: u64,
        names: &[&str],
        repository: Option<&str>,
    ) -> Option<Vec<u64>> {
        let repository = match repository {
            Some(r) => r.to_owned(),
            None => self.scale_sets.get(&id)?.default_repository.clone(),
        };
        let ids: Vec<(u64, u64)> = names
            .iter()
            .map(|_| (self.next_id(), self.next_id()))
            .collect();
        let ghes = self.ghes;
        let set = self.scale_sets.get_mut(&id)?;
        for ((request_id, run_id), name) in ids.iter().zip(names) {
            set.acquirable.push(*request_id);
            let state = if ghes {
                JobState::Available
            } else {
                JobState::Queued
            };
            set.jobs.insert(
                *request_id,
                ScaleSetJob {
                    name: (*name).to_owned(),
                    state,
                    repository: repository.clone(),
                    workflow_run_id: *run_id,
                    runner_name: None,
                    runner_id: None,
                    assigned_at: None,
                    reassignments: 0,
                    started_at: None,
                    lock_renewed_at: None,
                    result: None,
                },
            );
            if ghes {
                let mut message = Self::job_message(set, *request_id, "JobAvailable");
                message["acquireJobUrl"] = json!(format!(
                    "{SERVICE_PREFIX}_apis/runtime/runnerscalesets/{id}/acquirejobs"
                ));
                set.outbox.push(message);
            }
        }
        self.settle(id);
        Some(ids.into_iter().map(|(request_id, _)| request_id).collect())
    }

    /// `acquirejobs` on set `id`: the jobs of `asked` still acquirable are acquired (the
    /// others ignored) and assigned as capacity allows; `None` if there is no such set.
    pub fn acquire(&mut self, id: u64, asked: Vec<u64>) -> Option<Vec<u64>> {
        let set = self.scale_sets.get_mut(&id)?;
        let acquired: Vec<u64> = asked
            .into_iter()
            .filter(|r| set.acquirable.contains(r))
            .collect();
        set.acquirable.retain(|r| !acquired.contains(r));
        // In GHES mode an acquired job waits only for capacity now; without this call it
        // would stay available forever (scaleset #75).
        for request_id in &acquired {
            if let Some(job) = set.jobs.get_mut(request_id)
                && job.state == JobState::Available
            {
                job.state = JobState::Acquired;
            }
        }
        self.settle(id);
        Some(acquired)
    }

    /// A job message of `kind` for job `request_id` of `set`: `JobStarted` and
    /// `JobCompleted` name the job's runner, if it has one.
    fn job_message(set: &ScaleSet, request_id: u64, kind: &str) -> Value {
        let job = set.jobs.get(&request_id);
        let repository = job.map(|j| j.repository.as_str()).unwrap_or("");
        let (owner, name) = repository.split_once('/').unwrap_or(("", repository));
        let mut message = json!({
            "messageType": kind,
            "runnerRequestId": request_id,
            "jobId": format!("job-{request_id}"),
            "jobDisplayName": job.map(|j| j.name.as_str()).unwrap_or(""),
            "repositoryName": name,
            "ownerName": owner,
            "workflowRunId": job.map(|j| j.workflow_run_id),
            "jobWorkflowRef": format!("{repository}/.github/workflows/ci.yml@refs/heads/main"),
            "eventName": "push",
            "requestLabels": set.labels,
        });
        if matches!(kind, "JobStarted" | "JobCompleted")
            && let Some(job) = job.filter(|j| j.runner_name.is_some())
        {
            message["runnerId"] = json!(job.runner_id.unwrap_or(0));
            message["runnerName"] = json!(job.runner_name);
        }
        message
    }

    /// Assigns waiting jobs of set `id` while its assigned-but-unfinished jobs are below the
    /// last capacity polled, then puts the outbox into messages of at most
    /// [`Broker::jobs_per_message`] jobs. Called after every change of jobs or capacity, so that
    /// freed capacity is used at once.
    fn settle(&mut self, id: u64) {
        let now = self.now;
        // At least one a message, or the outbox would never empty.
        let per_message = self.jobs_per_message.max(1);
        let next_message_id = &mut self.next_message_id;
        let Some(set) = self.scale_sets.get_mut(&id) else {
            return;
        };
        let capacity = set
            .capacity
            .and_then(|c| usize::try_from(c).ok())
            .unwrap_or(usize::MAX);
        let busy = Self::count(set, &[JobState::Assigned, JobState::Running]);
        // The oldest waiting jobs first, as many as the capacity leaves room for.
        let waiting: Vec<u64> = set
            .jobs
            .iter()
            .filter(|(_, j)| matches!(j.state, JobState::Queued | JobState::Acquired))
            .map(|(r, _)| *r)
            .take(capacity.saturating_sub(busy))
            .collect();
        for request_id in waiting {
            if let Some(job) = set.jobs.get_mut(&request_id) {
                job.state = JobState::Assigned;
                job.assigned_at = Some(now);
            }
            let message = Self::job_message(set, request_id, "JobAssigned");
            set.outbox.push(message);
        }
        while !set.outbox.is_empty() {
            let take = set.outbox.len().min(per_message);
            *next_message_id += 1;
            set.pending.push(Message {
                id: *next_message_id,
                jobs: set.outbox.drain(..take).collect(),
            });
        }
    }

    /// The set holding job `request_id`.
    fn set_of_job(&self, request_id: u64) -> Option<u64> {
        self.scale_sets
            .values()
            .find(|s| s.jobs.contains_key(&request_id))
            .map(|s| s.id)
    }

    /// Job `request_id`, assigned, is picked up by runner `runner_name` (`JobStarted`).
    /// Whether it was assigned.
    pub fn start_job(&mut self, request_id: u64, runner_id: u64, runner_name: &str) -> bool {
        let now = self.now;
        let Some(set) = self
            .set_of_job(request_id)
            .and_then(|id| self.scale_sets.get_mut(&id))
        else {
            return false;
        };
        let id = set.id;
        match set.jobs.get_mut(&request_id) {
            Some(job) if job.state == JobState::Assigned => {
                job.state = JobState::Running;
                job.runner_name = Some(runner_name.to_owned());
                job.runner_id = Some(runner_id);
                job.started_at = Some(now);
            }
            _ => return false,
        }
        let message = Self::job_message(set, request_id, "JobStarted");
        set.outbox.push(message);
        self.settle(id);
        true
    }

    /// The oldest assigned job of scale set `set_id`, started by runner `runner_id`
    /// (`JobStarted`): what a scale-set runner asking for a job gets. Its runner request id.
    pub fn take_job(&mut self, set_id: u64, runner_id: u64, runner_name: &str) -> Option<u64> {
        if self.runners_paused {
            return None;
        }
        let request_id = self
            .scale_sets
            .get(&set_id)?
            .jobs
            .iter()
            .find(|(_, j)| j.state == JobState::Assigned)
            .map(|(r, _)| *r)?;
        self.start_job(request_id, runner_id, runner_name)
            .then_some(request_id)
    }

    /// Job `request_id` of any set.
    pub fn job(&self, request_id: u64) -> Option<&ScaleSetJob> {
        let set = self.set_of_job(request_id)?;
        self.scale_sets.get(&set)?.jobs.get(&request_id)
    }

    /// Job `request_id` of any set, to change.
    pub fn job_mut(&mut self, request_id: u64) -> Option<&mut ScaleSetJob> {
        let set = self.set_of_job(request_id)?;
        self.scale_sets.get_mut(&set)?.jobs.get_mut(&request_id)
    }

    /// Cancels and assigns again every job assigned longer than [`Broker::reassign_after`]
    /// without a runner starting it (`JobCompleted` `canceled`, then `JobAssigned`), each at
    /// most [`MAX_REASSIGNMENTS`] times; after that it stays assigned.
    pub fn reassign_overdue(&mut self) {
        let Some(after) = self.reassign_after else {
            return;
        };
        let now = self.now;
        let ids: Vec<u64> = self.scale_sets.keys().copied().collect();
        for id in ids {
            let Some(set) = self.scale_sets.get_mut(&id) else {
                continue;
            };
            let overdue: Vec<u64> = set
                .jobs
                .iter()
                .filter(|(_, j)| {
                    j.state == JobState::Assigned && j.reassignments < MAX_REASSIGNMENTS
                })
                .filter(|(_, j)| {
                    j.assigned_at
                        .is_some_and(|at| now.duration_since(at).unwrap_or(Duration::ZERO) >= after)
                })
                .map(|(r, _)| *r)
                .collect();
            if overdue.is_empty() {
                continue;
            }
            for request_id in overdue {
                let mut cancelled = Self::job_message(set, request_id, "JobCompleted");
                cancelled["result"] = json!("canceled");
                set.outbox.push(cancelled);
                let assigned = Self::job_message(set, request_id, "JobAssigned");
                set.outbox.push(assigned);
                if let Some(job) = set.jobs.get_mut(&request_id) {
                    job.reassignments += 1;
                    job.assigned_at = Some(now);
                }
            }
            self.settle(id);
        }
    }

    /// Job `request_id` finishes with `result` (`JobCompleted`), from any state short of
    /// completed (a job cancelled before it ran completes too); its capacity is freed.
    /// Whether it was not yet completed.
    pub fn complete_job(&mut self, request_id: u64, result: &str) -> bool {
        let Some(set) = self
            .set_of_job(request_id)
            .and_then(|id| self.scale_sets.get_mut(&id))
        else {
            return false;
        };
        let id = set.id;
        match set.jobs.get_mut(&request_id) {
            Some(job) if job.state != JobState::Completed => {
                job.state = JobState::Completed;
                job.result = Some(result.to_owned());
            }
            _ => return false,
        }
        set.acquirable.retain(|r| *r != request_id);
        let mut message = Self::job_message(set, request_id, "JobCompleted");
        message["result"] = json!(result);
        set.outbox.push(message);
        self.settle(id);
        true
    }

    /// How many jobs of `set` are in `state`.
    fn count(set: &ScaleSet, states: &[JobState]) -> usize {
        set.jobs
            .values()
            .filter(|j| states.contains(&j.state))
            .count()
    }

    /// A scale set made without the service (for the fake's own tests): named `name`,
    /// labelled with its name, in group 1 of `scope`, its jobs from `acme/widgets`.
    #[cfg(test)]
    pub(crate) fn add_set_for_test(&mut self, name: &str, scope: RunnerScope) -> u64 {
        let id = self.next_id();
        self.scale_sets.insert(
            id,
            ScaleSet {
                id,
                name: name.to_owned(),
                runner_group_id: 1,
                labels: vec![name.to_owned()],
                scope,
                default_repository: "acme/widgets".into(),
                pending: Vec::new(),
                acquirable: Vec::new(),
                jobs: BTreeMap::new(),
                outbox: Vec::new(),
                capacity: None,
            },
        );
        id
    }

    /// Deletes scale set `id` out of band; its session is left in place so that the next call
    /// on the set, queue calls included, is `404 RunnerScaleSetNotFoundException` (a bare
    /// `404` with [`Broker::bare_not_found`]). Whether it existed.
    pub fn delete_scale_set(&mut self, id: u64) -> bool {
        self.scale_sets.remove(&id).is_some()
    }

    /// Drops every session, its queue token then answered `404` without a type name (see
    /// [`Broker::dropped_queue_tokens`]): a service that lost its sessions, not a token it
    /// does not know.
    pub fn drop_sessions(&mut self) {
        let dropped = std::mem::take(&mut self.sessions);
        self.dropped_queue_tokens
            .extend(dropped.into_values().map(|s| s.queue_token));
    }

    /// A token carrying `exp`, shaped as [`Broker::alg_none_tokens`] says.
    fn token_with_exp(&self, exp: SystemTime) -> String {
        jwt_with_exp(exp, self.alg_none_tokens)
    }

    /// Queues a message of a top-level type the client does not know.
    pub fn queue_raw(&mut self, id: u64, message_type: &str) -> Option<u64> {
        self.next_message_id += 1;
        let message_id = self.next_message_id;
        let set = self.scale_sets.get_mut(&id)?;
        set.pending.push(Message {
            id: message_id,
            jobs: vec![json!({"messageType": message_type})],
        });
        Some(message_id)
    }

    /// The statistics of `set`, computed from its jobs and its runners (those `runners`
    /// created for it). `totalAssignedJobs` counts running jobs too (assigned to the set and
    /// not finished), which is what ARC scales on.
    fn statistics(&self, set: &ScaleSet, runners: &BTreeMap<u64, Runner>) -> Value {
        let busy: std::collections::BTreeSet<&str> = set
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .filter_map(|j| j.runner_name.as_deref())
            .collect();
        let registered = runners
            .values()
            .filter(|r| r.scale_set_id == Some(set.id))
            .count();
        json!({
            "totalAvailableJobs": Self::count(set, &[JobState::Available]),
            "totalAcquiredJobs": Self::count(set, &[JobState::Acquired]),
            "totalAssignedJobs": Self::count(set, &[JobState::Assigned, JobState::Running]),
            "totalRunningJobs": Self::count(set, &[JobState::Running]),
            "totalRegisteredRunners": registered,
            "totalBusyRunners": busy.len(),
            "totalIdleRunners": registered.saturating_sub(busy.len()),
        })
    }

    fn scale_set_json(&self, set: &ScaleSet, runners: &BTreeMap<u64, Runner>) -> Value {
        json!({
            "id": set.id, "name": set.name, "runnerGroupId": set.runner_group_id,
            "runnerGroupName": "Default",
            "labels": set.labels.iter().map(|l| json!({"type": "System", "name": l})).collect::<Vec<_>>(),
            "RunnerSetting": {"disableUpdate": true},
            "statistics": self.statistics(set, runners),
        })
    }
}

/// Whether the broker answers `path` (the server path, before the API base is taken off).
pub fn owns(base_path: &str, path: &str) -> bool {
    if path.starts_with(SERVICE_PREFIX) || path.starts_with(QUEUE_PATH) {
        return true;
    }
    let Some(rel) = path.strip_prefix(base_path) else {
        return false;
    };
    rel == "/actions/runner-registration" || rel.ends_with("/actions/runners/registration-token")
}

/// An answer of the broker.
struct Answer {
    status: u16,
    body: Option<Value>,
    /// The raw body, when it is not JSON (an injected empty `200`).
    raw: Option<Bytes>,
}

impl Answer {
    fn json(status: u16, body: Value) -> Self {
        Answer {
            status,
            body: Some(body),
            raw: None,
        }
    }

    fn empty(status: u16) -> Self {
        Answer {
            status,
            body: None,
            raw: None,
        }
    }

    /// An Actions-service error: `typeName` and `message`.
    fn error(status: u16, type_name: &str, message: &str) -> Self {
        Answer::json(status, json!({"typeName": type_name, "message": message}))
    }
}

/// One request, as the broker reads it.
struct Ask<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    headers: &'a HeaderMap,
    body: Option<&'a Value>,
}

impl Ask<'_> {
    fn authorization(&self, scheme: &str) -> Option<&str> {
        self.headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix(scheme))
            .map(str::trim)
    }

    fn has_api_version(&self) -> bool {
        self.query.split('&').any(|kv| kv == API_VERSION)
            || self
                .headers
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains(API_VERSION))
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    }
}

/// Answers a request [`owns`] says is the broker's, holding a poll up to [`Broker::hold`].
pub async fn answer(
    shared: Arc<Shared>,
    method: &str,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Response<Full<Bytes>> {
    let ask = Ask {
        method,
        path,
        query,
        headers,
        body,
    };
    let polling = method == "GET" && path == QUEUE_PATH;
    let deadline = tokio::time::Instant::now() + shared.with(|s| s.broker.hold);
    let answer = loop {
        let answer = shared.with(|state| respond(state, &ask));
        match answer {
            // Nothing for the poll yet: hold it.
            Some(a) => break a,
            None if polling && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(HOLD_STEP).await;
            }
            None => break Answer::empty(202),
        }
    };
    shared.with(|state| {
        let bom = answer.body.is_some() && std::mem::take(&mut state.broker.bom_next);
        let mut bytes = answer
            .raw
            .clone()
            .unwrap_or_else(|| match &answer.body {
                Some(v) => Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
                None => Bytes::new(),
            })
            .to_vec();
        if bom {
            bytes.splice(0..0, [0xEF, 0xBB, 0xBF]);
        }
        state.requests.push(RequestRecord {
            method: method.to_owned(),
            path: path.to_owned(),
            query: query.to_owned(),
            status: answer.status,
            headers: crate::server::redacted(headers),
            body: body.cloned(),
            response_body: answer.body.clone(),
            response_headers: Vec::new(),
            caller: None,
            at: state.now(),
        });
        Response::builder()
            .status(
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            )
            .header("content-type", "application/json; charset=utf-8")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
    })
}

/// The answer to `ask`, or `None` for a poll with nothing to deliver yet.
fn respond(state: &mut State, ask: &Ask<'_>) -> Option<Answer> {
    let rel = ask
        .path
        .strip_prefix(state.base_path.as_str())
        .unwrap_or(ask.path);
    if !ask.path.starts_with(SERVICE_PREFIX) && !ask.path.starts_with(QUEUE_PATH) {
        if rel.ends_with("/actions/runners/registration-token") && ask.method == "POST" {
            return Some(registration_token(state, ask, rel));
        }
        if rel == "/actions/runner-registration" && ask.method == "POST" {
            return Some(remote_auth(state, ask));
        }
        return Some(Answer::error(404, "NotFound", "no such route"));
    }
    if state.broker.down {
        return Some(Answer::error(
            503,
            "ServiceUnavailableException",
            "the service is down (an outage the test asked for)",
        ));
    }
    if !ask.has_api_version() {
        return Some(Answer::error(
            400,
            "VssInvalidApiVersionException",
            "api-version=6.0-preview is required",
        ));
    }
    if let Some(rest) = ask.path.strip_prefix(QUEUE_PATH) {
        return queue(state, ask, rest);
    }
    let now = state.now();
    let agents = ask.path.strip_prefix(AGENTS_PATH);
    let Some(rest) = ask
        .path
        .strip_prefix("/rest/_apis/runtime/runnerscalesets")
        .or(agents)
    else {
        return Some(Answer::error(404, "NotFound", "no such route"));
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    // acquirejobs takes the queue token; everything else the admin token.
    if agents.is_none()
        && let [id, "acquirejobs"] = segments.as_slice()
    {
        return Some(acquire_jobs(state, ask, id));
    }
    let target = ask.authorization("Bearer ").and_then(|t| {
        let valid = state
            .broker
            .admin_tokens
            .get(t)
            .is_some_and(|exp| *exp > now);
        valid.then(|| state.broker.admin_targets.get(t).cloned())
    });
    let Some(target) = target else {
        return Some(Answer::error(
            401,
            "UnauthorizedException",
            "the admin token is missing, unknown or expired",
        ));
    };
    if agents.is_some() {
        return Some(agents_call(state, ask, target, &segments));
    }
    if let ("POST", [id, "generatejitconfig"]) = (ask.method, segments.as_slice()) {
        let answer = generate_jit(state, id, ask.body);
        if answer.status == 200 && state.broker.lost_jit_answers > 0 {
            state.broker.lost_jit_answers -= 1;
            return Some(Answer::error(
                503,
                "ServiceUnavailableException",
                "the answer was lost after the runner was registered",
            ));
        }
        return Some(answer);
    }
    let default_repository = default_repository(state, target.as_ref());
    let server = state.server_url.clone();
    let State {
        broker, runners, ..
    } = state;
    let runners = &*runners;
    Some(match (ask.method, segments.as_slice()) {
        ("GET", []) => {
            let name = ask.param("name").unwrap_or("");
            let group: Option<u64> = ask.param("runnerGroupId").and_then(|g| g.parse().ok());
            let broker = &*broker;
            let found: Vec<Value> = broker
                .scale_sets
                .values()
                .filter(|s| s.name == name && group.is_none_or(|g| s.runner_group_id == g))
                .map(|s| broker.scale_set_json(s, runners))
                .collect();
            Answer::json(200, json!({"count": found.len(), "value": found}))
        }
        ("POST", []) => create_scale_set(
            broker,
            runners,
            ask.body,
            target.unwrap_or_else(|| RunnerScope::Org(String::new())),
            default_repository,
        ),
        ("GET", [id]) => match id
            .parse()
            .ok()
            .and_then(|id: u64| broker.scale_sets.get(&id))
        {
            Some(set) => Answer::json(200, broker.scale_set_json(set, runners)),
            None => not_found_set(broker),
        },
        ("POST", [id, "sessions"]) => create_session(broker, runners, &server, id, ask.body),
        ("PATCH", [id, "sessions", session]) => {
            refresh_session(broker, runners, &server, id, session)
        }
        ("DELETE", [id, "sessions", session]) => {
            let id: u64 = id.parse().unwrap_or(0);
            match broker.sessions.get(&id) {
                Some(s) if s.id == *session => {
                    broker.sessions.remove(&id);
                    Answer::empty(204)
                }
                _ => Answer::error(
                    400,
                    "RunnerScaleSetSessionExpiredException",
                    "the session has expired or does not exist",
                ),
            }
        }
        _ => Answer::error(404, "NotFound", "no such route"),
    })
}

/// The repository a new scale set's jobs come from by default: the target's, or for an
/// organization its first repository in the fake (`{org}/widgets` without one).
fn default_repository(state: &State, target: Option<&RunnerScope>) -> String {
    match target {
        Some(RunnerScope::Repo(id)) => state
            .repos
            .get(id)
            .map(|r| r.full_name())
            .unwrap_or_default(),
        Some(RunnerScope::Org(org)) => state
            .repos
            .values()
            .find(|r| r.owner == *org)
            .map(|r| r.full_name())
            .unwrap_or_else(|| format!("{org}/widgets")),
        // Any repository of the enterprise: the fake's first.
        Some(RunnerScope::Enterprise(_)) => state
            .repos
            .values()
            .next()
            .map(|r| r.full_name())
            .unwrap_or_else(|| "acme/widgets".to_owned()),
        None => "acme/widgets".to_owned(),
    }
}

/// A runner as the service's runner endpoints show it.
fn agent_json(runner: &Runner) -> Value {
    json!({
        "id": runner.id,
        "name": runner.name,
        "runnerScaleSetId": runner.scale_set_id.unwrap_or(0),
        "status": if runner.online { "online" } else { "offline" },
        "busy": runner.busy,
    })
}

/// The service's runner endpoints (`github-scale-sets.md` §1.13) over the runners of the admin
/// token's target, scale-set runners and others (`runnerScaleSetId` 0): find by name, get,
/// and remove (`204` also when it does not exist; `JobStillRunningException` while busy).
fn agents_call(
    state: &mut State,
    ask: &Ask<'_>,
    target: Option<RunnerScope>,
    segments: &[&str],
) -> Answer {
    let in_target = |r: &Runner| target.as_ref().is_none_or(|t| r.scope == *t);
    match (ask.method, segments) {
        ("GET", []) => {
            let name = ask.param("agentName").map(percent_decode);
            let found: Vec<Value> = state
                .runners
                .values()
                .filter(|r| in_target(r) && name.as_ref().is_none_or(|n| *n == r.name))
                .map(agent_json)
                .collect();
            Answer::json(200, json!({"count": found.len(), "value": found}))
        }
        ("GET", [id]) => match id
            .parse::<u64>()
            .ok()
            .and_then(|id| state.runners.get(&id))
            .filter(|r| in_target(r))
        {
            Some(r) => Answer::json(200, agent_json(r)),
            None => Answer::error(404, "AgentNotFoundException", "the runner was not found"),
        },
        ("DELETE", [id]) => {
            let id: u64 = id.parse().unwrap_or(0);
            match state.runners.get(&id).filter(|r| in_target(r)) {
                None => Answer::empty(204),
                Some(r) if r.busy || state.broker.refused_removals > 0 => {
                    state.broker.refused_removals = state
                        .broker
                        .refused_removals
                        .saturating_sub(u32::from(!r.busy));
                    Answer::error(
                        state.broker.job_still_running_status,
                        "GitHub.DistributedTask.WebApi.JobStillRunningException",
                        &format!("The runner {} is still running a job", r.name),
                    )
                }
                Some(_) => {
                    state.runners.remove(&id);
                    Answer::empty(204)
                }
            }
        }
        _ => Answer::error(404, "NotFound", "no such route"),
    }
}

/// `%XX` escapes and `+` of a query value decoded.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let escaped = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                if let Some(b) = escaped {
                    out.push(b);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `404` of a scale set that does not exist: `RunnerScaleSetNotFoundException`, or with
/// [`Broker::bare_not_found`] a message alone.
fn not_found_set(broker: &Broker) -> Answer {
    const MESSAGE: &str = "the runner scale set was not found";
    if broker.bare_not_found {
        return Answer::json(404, json!({ "message": MESSAGE }));
    }
    Answer::error(404, "RunnerScaleSetNotFoundException", MESSAGE)
}

/// The answer to a queue call or `acquirejobs` whose queue token opens no session: `404`
/// without a type name for the token of a session the broker dropped
/// ([`Broker::dropped_queue_tokens`]), else `401`.
fn no_session(broker: &Broker, ask: &Ask<'_>) -> Answer {
    let dropped = ask
        .authorization("Bearer ")
        .is_some_and(|t| broker.dropped_queue_tokens.contains(t));
    if dropped {
        return Answer::json(404, json!({"message": "the message session was not found"}));
    }
    Answer::error(401, "UnauthorizedException", "the queue token is not valid")
}

fn random_token(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// A JWT shaped token carrying `exp`: `RS256` in its header with a random (never checked)
/// signature, or with `alg_none` an unsecured JWT (`"alg": "none"`, an empty signature,
/// RFC 7519 §6.1).
fn jwt_with_exp(exp: SystemTime, alg_none: bool) -> String {
    let claims = json!({"exp": crate::time::unix(exp), "jti": uuid::Uuid::new_v4().to_string()});
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    if alg_none {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        return format!("{header}.{claims}.");
    }
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
    let signature = URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
    format!("{header}.{claims}.{signature}")
}

fn registration_token(state: &mut State, ask: &Ask<'_>, rel: &str) -> Answer {
    if let Some(slug) = enterprise_of_path(rel) {
        return enterprise_registration_token(state, ask, slug);
    }
    let now = state.now();
    let valid = ask
        .authorization("Bearer ")
        .or_else(|| ask.authorization("token "))
        .and_then(|t| state.tokens.get(t))
        .is_some_and(|(_, exp)| *exp > now);
    if !valid {
        return Answer::json(401, json!({"message": "Bad credentials"}));
    }
    issue_registration_token(state).1
}

/// A new registration token, good for [`REGISTRATION_TOKEN_TTL`], and the `201` carrying it.
fn issue_registration_token(state: &mut State) -> (String, Answer) {
    let token = random_token("AREG");
    let expires = state.now() + REGISTRATION_TOKEN_TTL;
    state
        .broker
        .registration_tokens
        .insert(token.clone(), expires);
    let answer = Answer::json(
        201,
        json!({"token": token, "expires_at": crate::time::rfc3339(expires)}),
    );
    (token, answer)
}

/// The enterprise slug of `/enterprises/{slug}/actions/runners/registration-token`.
fn enterprise_of_path(rel: &str) -> Option<&str> {
    rel.strip_prefix("/enterprises/")?
        .strip_suffix("/actions/runners/registration-token")
        .filter(|slug| !slug.is_empty() && !slug.contains('/'))
}

/// An enterprise's registration token: only its classic PAT, as a bearer, gets one. An
/// installation token is refused `403` as GitHub refuses an App on an enterprise endpoint.
fn enterprise_registration_token(state: &mut State, ask: &Ask<'_>, slug: &str) -> Answer {
    let now = state.now();
    let presented = ask
        .authorization("Bearer ")
        .or_else(|| ask.authorization("token "));
    let Some(pat) = state.broker.enterprise_pats.get(slug) else {
        return Answer::json(404, json!({"message": "Not Found"}));
    };
    if presented != Some(pat.as_str()) {
        let installation = presented
            .and_then(|t| state.tokens.get(t))
            .is_some_and(|(_, exp)| *exp > now);
        return if installation {
            Answer::json(
                403,
                json!({"message": "Resource not accessible by integration"}),
            )
        } else {
            Answer::json(401, json!({"message": "Bad credentials"}))
        };
    }
    let (token, answer) = issue_registration_token(state);
    state
        .broker
        .enterprise_registrations
        .insert(token, slug.to_owned());
    answer
}

fn remote_auth(state: &mut State, ask: &Ask<'_>) -> Answer {
    let now = state.now();
    let presented = ask.authorization("RemoteAuth ");
    let valid = presented
        .and_then(|t| state.broker.registration_tokens.get(t))
        .is_some_and(|exp| *exp > now);
    if !valid {
        return Answer::json(401, json!({"message": "Bad credentials"}));
    }
    let url = ask
        .body
        .and_then(|b| b.get("url"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(target) = target_of_url(state, url) else {
        return Answer::json(404, json!({"message": "Not Found"}));
    };
    // An enterprise's token opens that enterprise alone, and only its token opens it.
    let issued_for = presented.and_then(|t| state.broker.enterprise_registrations.get(t));
    let opened = match &target {
        RunnerScope::Enterprise(slug) => Some(slug),
        _ => None,
    };
    if issued_for != opened {
        return Answer::json(
            403,
            json!({"message": "the registration token is not this scope's"}),
        );
    }
    let exp = now + ADMIN_TOKEN_TTL;
    let token = state.broker.token_with_exp(exp);
    state.broker.admin_tokens.insert(token.clone(), exp);
    state.broker.admin_targets.insert(token.clone(), target);
    Answer::json(
        201,
        json!({"url": format!("{}{SERVICE_PREFIX}", state.server_url), "token": token}),
    )
}

/// The runner scope a RemoteAuth `url` (`https://github.com/acme`, `…/acme/widgets`,
/// `…/enterprises/octo`) names; `None` for a repository or an enterprise the fake does not
/// have, or no URL at all.
fn target_of_url(state: &State, url: &str) -> Option<RunnerScope> {
    let path = url.split_once("://").map_or(url, |(_, rest)| rest);
    let segments: Vec<&str> = path.split('/').skip(1).filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["enterprises", slug] => state
            .broker
            .enterprise_pats
            .contains_key(*slug)
            .then(|| RunnerScope::Enterprise((*slug).to_owned())),
        [name] => Some(RunnerScope::Org((*name).to_owned())),
        [owner, repo] => state
            .repo_by_name(owner, repo)
            .map(|r| RunnerScope::Repo(r.id)),
        _ => None,
    }
}

fn create_scale_set(
    broker: &mut Broker,
    runners: &BTreeMap<u64, Runner>,
    body: Option<&Value>,
    scope: RunnerScope,
    default_repository: String,
) -> Answer {
    let body = body.cloned().unwrap_or(Value::Null);
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    let group = body
        .get("runnerGroupId")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    if name.is_empty() {
        return Answer::error(400, "ArgumentException", "name is required");
    }
    if broker
        .scale_sets
        .values()
        .any(|s| s.name == name && s.runner_group_id == group)
    {
        return Answer::error(
            409,
            "RunnerScaleSetExistsException",
            "a scale set of that name exists in the runner group",
        );
    }
    let mut labels: Vec<String> = body
        .get("labels")
        .and_then(Value::as_array)
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if labels.is_empty() {
        labels.push(name.to_owned());
    }
    let id = broker.next_id();
    let set = ScaleSet {
        id,
        name: name.to_owned(),
        runner_group_id: group,
        labels,
        scope,
        default_repository,
        pending: Vec::new(),
        acquirable: Vec::new(),
        jobs: BTreeMap::new(),
        outbox: Vec::new(),
        capacity: None,
    };
    let answer = Answer::json(200, broker.scale_set_json(&set, runners));
    broker.scale_sets.insert(id, set);
    answer
}

fn session_json(
    broker: &Broker,
    runners: &BTreeMap<u64, Runner>,
    set_id: u64,
    server: &str,
) -> Option<Value> {
    let set = broker.scale_sets.get(&set_id)?;
    let session = broker.sessions.get(&set_id)?;
    Some(json!({
        "sessionId": session.id,
        "ownerName": session.owner,
        "runnerScaleSet": broker.scale_set_json(set, runners),
        "messageQueueUrl": format!("{server}{QUEUE_PATH}?scaleSetId={set_id}"),
        "messageQueueAccessToken": session.queue_token,
        "statistics": broker.statistics(set, runners),
    }))
}

fn create_session(
    broker: &mut Broker,
    runners: &BTreeMap<u64, Runner>,
    server: &str,
    id: &str,
    body: Option<&Value>,
) -> Answer {
    let Some(id) = id
        .parse::<u64>()
        .ok()
        .filter(|id| broker.scale_sets.contains_key(id))
    else {
        return not_found_set(broker);
    };
    if broker.sessions.contains_key(&id) {
        let message = format!("The actions runner scaleset {id} already has an active session");
        return match &broker.session_conflict_type {
            Some(type_name) => Answer::error(409, type_name, &message),
            None => Answer::json(409, json!({ "message": message })),
        };
    }
    let owner = body
        .and_then(|b| b.get("ownerName"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    broker.sessions.insert(
        id,
        Session {
            id: uuid::Uuid::new_v4().to_string(),
            owner,
            queue_token: broker.token_with_exp(SystemTime::now() + ADMIN_TOKEN_TTL),
            token_valid: true,
        },
    );
    match session_json(broker, runners, id, server) {
        Some(v) => Answer::json(200, v),
        None => not_found_set(broker),
    }
}

fn refresh_session(
    broker: &mut Broker,
    runners: &BTreeMap<u64, Runner>,
    server: &str,
    id: &str,
    session: &str,
) -> Answer {
    let id: u64 = id.parse().unwrap_or(0);
    let queue_token = broker.token_with_exp(SystemTime::now() + ADMIN_TOKEN_TTL);
    match broker.sessions.get_mut(&id) {
        Some(s) if s.id == session => {
            s.queue_token = queue_token;
            s.token_valid = true;
        }
        _ => {
            return Answer::error(
                404,
                "RunnerAdminException",
                "runner referenced a session ID that doesn't exist in redis",
            );
        }
    }
    match session_json(broker, runners, id, server) {
        Some(v) => Answer::json(200, v),
        None => not_found_set(broker),
    }
}

/// A JIT configuration for a new runner of scale set `id`: a runner of the fake's runner
/// model ([`State::runners`]) in the set's scope, group and labels, belonging to the set, with
/// the fake's own [`crate::jit::FakeJitConfig`] as `encodedJITConfig`. A name taken in that
/// scope is `409 AgentExistsException`.
fn generate_jit(state: &mut State, id: &str, body: Option<&Value>) -> Answer {
    let Some(set) = id
        .parse::<u64>()
        .ok()
        .and_then(|id| state.broker.scale_sets.get(&id))
    else {
        return not_found_set(&state.broker);
    };
    let (id, scope, labels, group_id) = (
        set.id,
        set.scope.clone(),
        set.labels.clone(),
        set.runner_group_id,
    );
    let field = |name: &str| body.and_then(|b| b.get(name)).and_then(Value::as_str);
    let name = field("name").unwrap_or("").to_owned();
    if name.is_empty() {
        return Answer::error(400, "ArgumentException", "name is required");
    }
    let work_folder = field("workFolder").unwrap_or("_work").to_owned();
    if state
        .runners
        .values()
        .any(|r| r.scope == scope && r.name == name)
    {
        return Answer::error(
            409,
            "AgentExistsException",
            &format!("Agent exists with name {name}"),
        );
    }
    let runner_id = state.next_id();
    let token = uuid::Uuid::new_v4().simple().to_string();
    let encoded = crate::jit::FakeJitConfig {
        server_url: state.server_url.clone(),
        runner_id,
        runner_name: name.clone(),
        token: token.clone(),
        work_folder,
    }
    .encode();
    state.runners.insert(
        runner_id,
        Runner {
            id: runner_id,
            name: name.clone(),
            scope,
            labels,
            group_id,
            online: false,
            busy: false,
            job_done_at: None,
            abandoned: false,
            token,
            behavior: None,
            scale_set_id: Some(id),
        },
    );
    Answer::json(
        200,
        json!({"runner": {"id": runner_id, "name": name, "runnerScaleSetId": id}, "encodedJITConfig": encoded}),
    )
}

/// The scale set whose session holds the queue token of `ask`, if it is still valid.
fn queue_owner(broker: &Broker, ask: &Ask<'_>) -> Option<u64> {
    let token = ask.authorization("Bearer ")?;
    broker
        .sessions
        .iter()
        .find(|(_, s)| s.queue_token == token && s.token_valid)
        .map(|(id, _)| *id)
}

fn acquire_jobs(state: &mut State, ask: &Ask<'_>, id: &str) -> Answer {
    let broker = &mut state.broker;
    let Some(owner) = queue_owner(broker, ask) else {
        return no_session(broker, ask);
    };
    if id.parse::<u64>().ok() != Some(owner) {
        return Answer::error(403, "AccessDeniedException", "not this scale set's session");
    }
    let asked: Vec<u64> = ask
        .body
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let Some(acquired) = broker.acquire(owner, asked) else {
        return not_found_set(broker);
    };
    Answer::json(200, json!({"count": acquired.len(), "value": acquired}))
}

/// The queue: `GET` polls (`None` while there is nothing to deliver), `DELETE /{id}` acks.
fn queue(state: &mut State, ask: &Ask<'_>, rest: &str) -> Option<Answer> {
    let State {
        broker, runners, ..
    } = state;
    let runners = &*runners;
    let Some(owner) = queue_owner(broker, ask) else {
        return Some(no_session(broker, ask));
    };
    // A set deleted out of band keeps its session's token valid, so the queue can say the
    // set is gone (404) rather than that the token is bad, as the real service does.
    let Some(set) = broker.scale_sets.get_mut(&owner) else {
        return Some(not_found_set(broker));
    };
    // The capacity the client can run now bounds what is assigned from this poll on; a poll
    // without the header leaves the last one in force.
    if ask.method == "GET"
        && let Some(capacity) = ask
            .headers
            .get("x-scalesetmaxcapacity")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    {
        set.capacity = Some(capacity);
        broker.settle(owner);
    }
    match (ask.method, rest.trim_start_matches('/')) {
        ("GET", "") => {
            if broker.failing_polls > 0 {
                broker.failing_polls -= 1;
                return Some(Answer::error(
                    broker.failing_status,
                    "InjectedFailureException",
                    "a failure the test asked for",
                ));
            }
            if std::mem::take(&mut broker.empty_next_poll) {
                return Some(Answer {
                    status: 200,
                    body: None,
                    raw: Some(Bytes::new()),
                });
            }
            let last: u64 = ask
                .param("lastMessageId")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            let broker = &*broker;
            let set = broker.scale_sets.get(&owner)?;
            let message = set.pending.iter().find(|m| m.id > last)?;
            let body = Value::Array(message.jobs.clone()).to_string();
            Some(Answer::json(
                200,
                json!({
                    "messageId": message.id,
                    "messageType": message
                        .jobs
                        .first()
                        .and_then(|j| j.get("messageType"))
                        .and_then(Value::as_str)
                        .filter(|t| !t.starts_with("Job"))
                        .unwrap_or("RunnerScaleSetJobMessages"),
                    "statistics": broker.statistics(set, runners),
                    "body": body,
                }),
            ))
        }
        ("DELETE", id) => {
            let id: u64 = id.parse().unwrap_or(0);
            let set = broker.scale_sets.get_mut(&owner)?;
            let before = set.pending.len();
            set.pending.retain(|m| m.id != id);
            Some(if set.pending.len() < before {
                Answer::empty(204)
            } else {
                Answer::error(404, "MessageNotFoundException", "no such message")
            })
        }
        _ => Some(Answer::error(404, "NotFound", "no such route")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The types (and results) of every job message of set `id` not yet acknowledged.
    fn kinds(broker: &Broker, id: u64) -> Vec<String> {
        broker.scale_sets[&id]
            .pending
            .iter()
            .flat_map(|m| m.jobs.iter())
            .map(|j| match j["result"].as_str() {
                Some(result) => format!("{} {result}", j["messageType"].as_str().unwrap_or("")),
                None => j["messageType"].as_str().unwrap_or("").to_owned(),
            })
            .collect()
    }

    /// A job assigned and not started within the timer is cancelled and assigned again, three
    /// times at most; a started job never is; with no timer nothing is.
    #[test]
    fn an_unstarted_job_is_cancelled_and_reassigned_at_most_three_times() {
        let mut b = Broker {
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
            ..Broker::default()
        };
        let id = b.add_set_for_test("linux", RunnerScope::Org("acme".into()));
        let waiting = b.queue_job(id, "waits").unwrap_or_default();
        let started = b.queue_job(id, "starts").unwrap_or_default();
        assert!(b.start_job(started, 77, "r"));
        let step = Duration::from_secs(1);
        b.now += step * 5;
        b.reassign_overdue();
        assert_eq!(kinds(&b, id).len(), 3, "no timer, no reassignment");
        b.reassign_after = Some(step);
        for _ in 0..6 {
            b.now += step;
            b.reassign_overdue();
        }
        let again = ["JobCompleted canceled", "JobAssigned"];
        let mut expected = vec!["JobAssigned", "JobAssigned", "JobStarted"];
        for _ in 0..MAX_REASSIGNMENTS {
            expected.extend(again);
        }
        assert_eq!(kinds(&b, id), expected);
        let job = &b.scale_sets[&id].jobs[&waiting];
        assert_eq!((job.state, job.reassignments), (JobState::Assigned, 3));
        assert_eq!(b.scale_sets[&id].jobs[&started].reassignments, 0);
        let message = &b.scale_sets[&id].pending.last().map(|m| m.jobs[0].clone());
        let message = message.clone().unwrap_or_default();
        assert_eq!(
            message["runnerRequestId"],
            json!(waiting),
            "the same job each time"
        );
        assert_eq!(message["repositoryName"], "widgets");
        assert_eq!(message["ownerName"], "acme");
        assert!(message["workflowRunId"].as_u64().is_some());
        assert_eq!(
            message["jobWorkflowRef"],
            "acme/widgets/.github/workflows/ci.yml@refs/heads/main"
        );
    }

    /// Assignment stops at the capacity last polled, and resumes as jobs finish or the
    /// capacity grows; a burst is truncated over messages of at most `jobs_per_message` jobs.
    #[test]
    fn jobs_are_assigned_within_the_capacity_in_messages_of_the_batch_limit() {
        let mut b = Broker {
            jobs_per_message: 3,
            ..Broker::default()
        };
        let id = b.add_set_for_test("linux", RunnerScope::Org("acme".into()));
        if let Some(set) = b.scale_sets.get_mut(&id) {
            set.capacity = Some(0);
        }
        let names: Vec<String> = (0..8).map(|n| format!("burst {n}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let jobs = b.queue_jobs(id, &names).unwrap_or_default();
        assert!(kinds(&b, id).is_empty(), "capacity 0 assigns nothing");
        if let Some(set) = b.scale_sets.get_mut(&id) {
            set.capacity = Some(4);
        }
        b.settle(id);
        assert_eq!(kinds(&b, id), ["JobAssigned"; 4]);
        let sizes: Vec<usize> = b.scale_sets[&id]
            .pending
            .iter()
            .map(|m| m.jobs.len())
            .collect();
        assert_eq!(sizes, [3, 1], "truncated at the batch limit");
        // One finished: one more assigned, never more than the capacity at once.
        assert!(b.start_job(jobs[0], 1, "r"));
        assert!(b.complete_job(jobs[0], "succeeded"));
        let unfinished = |b: &Broker| {
            b.scale_sets[&id]
                .jobs
                .values()
                .filter(|j| matches!(j.state, JobState::Assigned | JobState::Running))
                .count()
        };
        assert_eq!(unfinished(&b), 4);
        assert_eq!(b.scale_sets[&id].jobs[&jobs[4]].state, JobState::Assigned);
        assert_eq!(b.scale_sets[&id].jobs[&jobs[5]].state, JobState::Queued);
    }

    /// Scenario 13's model (scaleset #75): in GHES mode a job is only announced
    /// (`JobAvailable`) and never assigned, however long it waits with room to spare, until
    /// its listener acquires it; a job acquired twice is acquired once.
    #[test]
    fn a_ghes_job_is_assigned_only_once_acquired() {
        let mut b = Broker {
            ghes: true,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
            reassign_after: Some(Duration::from_secs(1)),
            ..Broker::default()
        };
        let id = b.add_set_for_test("linux", RunnerScope::Org("acme".into()));
        let jobs = b.queue_jobs(id, &["one", "two"]).unwrap_or_default();
        assert_eq!(kinds(&b, id), ["JobAvailable"; 2]);
        for _ in 0..10 {
            b.now += Duration::from_secs(60);
            b.reassign_overdue();
            b.settle(id);
        }
        assert_eq!(
            kinds(&b, id),
            ["JobAvailable"; 2],
            "no acquire, never assigned"
        );
        assert_eq!(b.scale_sets[&id].jobs[&jobs[0]].state, JobState::Available);

        assert_eq!(b.acquire(id, vec![jobs[0], 999]), Some(vec![jobs[0]]));
        assert_eq!(b.acquire(id, vec![jobs[0]]), Some(vec![]), "acquired once");
        assert_eq!(
            kinds(&b, id),
            ["JobAvailable", "JobAvailable", "JobAssigned"]
        );
        assert_eq!(b.scale_sets[&id].jobs[&jobs[0]].state, JobState::Assigned);
        assert_eq!(b.scale_sets[&id].jobs[&jobs[1]].state, JobState::Available);
        assert_eq!(b.acquire(id + 1, vec![jobs[1]]), None, "no such set");
    }

    /// A session create on a set with a session is `409` with the type name the broker is
    /// set to answer, or none; a missing set is `404` with or without its type name.
    #[test]
    fn conflicts_and_missing_sets_carry_the_type_name_they_are_set_to() {
        let runners = BTreeMap::new();
        let cases: [(Option<&str>, bool, Value, Value); 3] = [
            (
                Some(SESSION_CONFLICT_TYPE),
                false,
                json!(SESSION_CONFLICT_TYPE),
                json!("RunnerScaleSetNotFoundException"),
            ),
            (
                Some("SomethingElse"),
                true,
                json!("SomethingElse"),
                Value::Null,
            ),
            (None, true, Value::Null, Value::Null),
        ];
        for (conflict, bare, conflict_type, missing_type) in cases {
            let mut b = Broker {
                session_conflict_type: conflict.map(str::to_owned),
                bare_not_found: bare,
                ..Broker::default()
            };
            let id = b.add_set_for_test("linux", RunnerScope::Org("acme".into()));
            let id = id.to_string();
            let first = create_session(&mut b, &runners, "http://s", &id, None);
            assert_eq!(first.status, 200);
            let second = create_session(&mut b, &runners, "http://s", &id, None);
            let body = second.body.unwrap_or_default();
            assert_eq!((second.status, &body["typeName"]), (409, &conflict_type));
            assert!(body["message"].is_string(), "{body}");
            let missing = create_session(&mut b, &runners, "http://s", "999", None);
            let body = missing.body.unwrap_or_default();
            assert_eq!((missing.status, &body["typeName"]), (404, &missing_type));
        }
    }

    /// A dropped session's queue token is `404` without a type name; a token of no session the
    /// broker ever had is `401`, as it was before any drop.
    #[test]
    fn a_dropped_session_s_queue_token_is_a_bare_404() {
        let runners = BTreeMap::new();
        let mut b = Broker::default();
        let id = b.add_set_for_test("linux", RunnerScope::Org("acme".into()));
        create_session(&mut b, &runners, "http://s", &id.to_string(), None);
        let token = b.sessions[&id].queue_token.clone();
        let answer = |b: &Broker, token: &str| {
            let mut headers = HeaderMap::new();
            let bearer = format!("Bearer {token}");
            headers.insert(
                http::header::AUTHORIZATION,
                bearer.parse().unwrap_or(http::HeaderValue::from_static("")),
            );
            let ask = Ask {
                method: "GET",
                path: QUEUE_PATH,
                query: "",
                headers: &headers,
                body: None,
            };
            let a = no_session(b, &ask);
            (a.status, a.body.unwrap_or_default()["typeName"].clone())
        };
        assert_eq!(answer(&b, &token).0, 401, "not dropped yet");
        b.drop_sessions();
        assert!(b.sessions.is_empty());
        assert_eq!(answer(&b, &token), (404, Value::Null));
        assert_eq!(answer(&b, "never-issued").0, 401);
    }

    /// `alg_none_tokens`: an unsecured JWT (`alg: none`, an empty signature) whose payload
    /// carries the `exp`; otherwise `RS256` with a signature.
    #[test]
    fn alg_none_tokens_are_unsecured_jwts_with_an_exp() {
        let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let part = |token: &str, n: usize| -> Value {
            let part = token.split('.').nth(n).unwrap_or_default();
            let bytes = URL_SAFE_NO_PAD.decode(part).unwrap_or_default();
            serde_json::from_slice(&bytes).unwrap_or_default()
        };
        for (alg_none, alg) in [(true, "none"), (false, "RS256")] {
            let b = Broker {
                alg_none_tokens: alg_none,
                ..Broker::default()
            };
            let token = b.token_with_exp(exp);
            assert_eq!(part(&token, 0)["alg"], alg, "{token}");
            assert_eq!(part(&token, 1)["exp"], 1_700_000_000, "{token}");
            assert_eq!(token.ends_with('.'), alg_none, "{token}");
        }
    }

    #[test]
    fn runner_conclusions_are_named_as_the_service_names_results() {
        assert_eq!(scale_set_result("success"), "succeeded");
        assert_eq!(scale_set_result("failure"), "failed");
        assert_eq!(scale_set_result("cancelled"), "canceled");
        assert_eq!(scale_set_result("skipped"), "skipped");
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decode("rm-h%2Fa+b%zz%4"), "rm-h/a b%zz%4");
    }
}
