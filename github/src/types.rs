//! The slices of GitHub's REST objects that rm reads, and nothing more. Fields rm does not use
//! are left out (serde ignores them), so GitHub adding, dropping or nulling one never breaks a
//! poll; a field GitHub may send as null is an `Option`. An object in a list that lacks a field
//! kept here is skipped with a warning ([`crate::client`]'s `decode_items`), not the whole page.
//! Keep it so: add a field only with the code that reads it.
//!
//! Job and runner ids are read as rm's [`JobId`] and [`RunnerId`] (the journal's signed 64-bit
//! numbers): an id past `i64::MAX`, which GitHub has never sent, fails to decode like any other
//! unreadable field instead of being clamped.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

// The ids the job and runner types hold (rm's own, shared with the journal).
use rm_vocab::{JobId, RunnerId};

/// `GET /app`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct App {
    pub id: u64,
    pub name: String,
}

/// The account an installation belongs to.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Account {
    pub login: String,
}

/// An App installation.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Installation {
    pub id: u64,
    pub account: Option<Account>,
    #[serde(default)]
    pub permissions: BTreeMap<String, String>,
    pub suspended_at: Option<String>,
}

/// A label on a self-hosted runner.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct RunnerLabel {
    pub name: String,
}

/// A self-hosted runner as GitHub lists it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Runner {
    pub id: RunnerId,
    pub name: String,
    #[serde(default)]
    pub labels: Vec<RunnerLabel>,
    /// `online` or `offline`.
    pub status: String,
    pub busy: bool,
}

/// The body of `generate-jitconfig`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct JitRequest {
    pub name: String,
    pub runner_group_id: u64,
    pub labels: Vec<String>,
    pub work_folder: String,
}

/// The answer of `generate-jitconfig`: the runner GitHub reserved, and the encoded configuration
/// the runner process needs. The configuration is a credential: it only ever goes into the
/// runner's environment.
#[derive(Debug, Clone, Deserialize)]
pub struct JitConfig {
    pub runner: Runner,
    pub encoded_jit_config: SecretString,
}

/// A workflow run.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct WorkflowRun {
    pub id: u64,
    pub updated_at: String,
}

/// What a workflow run says about who it is (`GET /repos/{owner}/{repo}/actions/runs/{run_id}`):
/// the fields the host-local cache scopes a job by, nothing else.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RunIdentity {
    pub id: u64,
    /// `push`, `pull_request`, `pull_request_target`, `schedule`, ...
    pub event: String,
    /// `null` for a run on a tag or a detached commit.
    pub head_branch: Option<String>,
    pub repository: RunRepository,
    /// `null` when the head repository was deleted (a fork's).
    pub head_repository: Option<RunRepository>,
}

/// A run's repository or head repository (GitHub's "minimal repository").
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RunRepository {
    pub full_name: String,
    /// Absent from some minimal repositories: the caller treats a run without it as unscoped.
    #[serde(default)]
    pub default_branch: Option<String>,
}

/// A workflow job.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct WorkflowJob {
    pub id: JobId,
    pub run_id: u64,
    pub run_attempt: Option<u64>,
    pub name: String,
    pub workflow_name: Option<String>,
    /// `queued`, `in_progress`, `completed`, `waiting`, `requested` or `pending`.
    pub status: String,
    pub conclusion: Option<String>,
    pub labels: Vec<String>,
    pub runner_id: Option<RunnerId>,
    pub runner_name: Option<String>,
    pub created_at: String,
    /// RFC 3339; GitHub sets it to `created_at` while the job is still queued.
    #[serde(default)]
    pub started_at: Option<String>,
}

/// The owner of a repository.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Owner {
    pub login: String,
}

/// A repository an installation can reach.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Repository {
    pub name: String,
    pub owner: Owner,
}

/// One attempt to deliver a webhook, as `GET /app/hook/deliveries` lists it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct HookDelivery {
    pub id: u64,
    pub guid: String,
    /// `OK` for a delivery the receiver accepted.
    pub status: String,
    pub event: String,
    pub delivered_at: String,
    pub status_code: u16,
}

/// A page of hook deliveries and the cursor of the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryPage {
    pub deliveries: Vec<HookDelivery>,
    pub next_cursor: Option<String>,
}

/// A runner group of an organization.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RunnerGroup {
    pub id: u64,
    pub name: String,
}

/// One resource of `GET /rate_limit`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct RateLimitEntry {
    pub limit: u64,
    pub remaining: u64,
    pub reset: u64,
}

/// `GET /rate_limit`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RateLimitOverview {
    pub resources: BTreeMap<String, RateLimitEntry>,
    pub rate: RateLimitEntry,
}

/// A release, as `GET /repos/{owner}/{repo}/releases/latest` and `GET .../releases` list it:
/// the fields rm reads to follow and judge actions/runner versions.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ReleaseSummary {
    pub id: u64,
    /// `v2.330.0`.
    pub tag_name: String,
    #[serde(default)]
    pub draft: bool,
    #[serde(default)]
    pub prerelease: bool,
    /// RFC 3339; `null` for a draft.
    #[serde(default)]
    pub published_at: Option<String>,
}
