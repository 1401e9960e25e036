//! The fake's own encoded JIT configuration and the small protocol its runners speak. Real
//! GitHub's `encoded_jit_config` is opaque to rm; the fake's is base64 of a JSON document that
//! carries what the fake runner needs to find the fake again and prove who it is.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// Path prefix of the runner protocol on the fake's server (outside the REST API).
pub const RUNNER_PROTOCOL_PREFIX: &str = "/_fake/runner";

/// What `ACTIONS_RUNNER_INPUT_JITCONFIG` decodes to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FakeJitConfig {
    /// The fake's server root (no API base path), e.g. `http://127.0.0.1:4711`.
    pub server_url: String,
    pub runner_id: u64,
    pub runner_name: String,
    /// The runner's credential towards the fake.
    pub token: String,
    pub work_folder: String,
}

impl FakeJitConfig {
    pub fn encode(&self) -> String {
        STANDARD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(encoded: &str) -> anyhow::Result<Self> {
        let bytes = STANDARD.decode(encoded.trim())?;
        Ok(serde_json::from_slice(&bytes)?)
    }
}

/// Where a runner crashes, when told to.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CrashPoint {
    /// Right after registering, before asking for a job.
    AfterRegister,
    /// After taking a job, before finishing it.
    DuringJob,
}

/// How a fake runner behaves; the fake hands it out when the runner registers, so a test can
/// set it any time before the runner starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunnerBehavior {
    /// How long to wait for a job before exiting idle. `None` (the default): wait until stopped,
    /// as a real JIT runner does; only a runner manager's idle timeout ends it. `Some` is for
    /// tests of a runner that exits on its own (an idle exit the manager did not ask for).
    pub idle_timeout_ms: Option<u64>,
    /// How long a job takes.
    pub job_duration_ms: u64,
    /// `success`, `failure`, `cancelled`, ...
    pub conclusion: String,
    pub crash: Option<CrashPoint>,
    /// Never exit (after registering): for tests of timeouts and kills.
    pub hang: bool,
    /// Start a background process that outlives the runner (for process-group cleanup tests).
    pub fork_background: bool,
    /// Plant `_work/planted-link` pointing here (for cleanup tests that must not follow links).
    pub plant_symlink: Option<String>,
    /// GitHub refuses this runner's version: its first request for a job is answered `403`, as
    /// GitHub answers a runner too old for it (the runner then says so in its log and exits).
    #[serde(default)]
    pub version_refused: bool,
    /// Bind `127.0.0.1:PORT`, retrying until it is free, and hold it until the runner exits, as
    /// a job squatting a port the agent (or a proxy of the host) binds after a restart would
    /// (`_diag/squat.txt` says when the bind worked).
    #[serde(default)]
    pub squat_port: Option<u16>,
    /// During its job, write to `/tmp` until a write fails (a full disk), print the failure as
    /// `dd` would, and end the job `failure` (as a real step failing on a full disk does).
    #[serde(default)]
    pub fill_tmp: bool,
    /// During its job, allocate and touch memory until the kernel kills it (a job past its
    /// `memory_max`).
    #[serde(default)]
    pub exhaust_memory: bool,
    /// During its job, before its duration, write this many small files into its checkout
    /// (`_work/<repo>/<repo>/src/`, a few hundred directories of them), then say so in
    /// `_diag/checkout.done`: a job that leaves a large checkout for cleanup to remove (the
    /// `cleanup-latency` benchmark). `0` (the default): none.
    #[serde(default)]
    pub checkout_files: u32,
}

impl Default for RunnerBehavior {
    fn default() -> Self {
        Self {
            idle_timeout_ms: None,
            job_duration_ms: 100,
            conclusion: "success".into(),
            crash: None,
            hang: false,
            fork_background: false,
            plant_symlink: None,
            version_refused: false,
            squat_port: None,
            fill_tmp: false,
            exhaust_memory: false,
            checkout_files: 0,
        }
    }
}

/// A runner's request to the fake: who it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunnerHello {
    pub runner_id: u64,
    pub token: String,
}

/// The answer to registering.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registered {
    pub behavior: RunnerBehavior,
}

/// A job handed to a runner: what actions/runner's job message gives its worker, as far as the
/// fake runner uses it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssignedJob {
    pub job_id: u64,
    pub run_id: u64,
    pub name: String,
    /// `owner/name`.
    pub repository: String,
    /// `GITHUB_REF`: `refs/heads/<branch>`, or `refs/pull/<n>/merge` for a pull request.
    #[serde(default)]
    pub git_ref: String,
    /// `GITHUB_SHA`.
    #[serde(default)]
    pub sha: String,
    /// `GITHUB_EVENT_NAME`.
    #[serde(default)]
    pub event: String,
    /// The results service's URL (`ACTIONS_RESULTS_URL` in the job message's system
    /// connection): the fake's stand-in, its server root ([`crate::results`]).
    #[serde(default)]
    pub results_url: String,
    /// `ACTIONS_RUNTIME_TOKEN`: JWT-shaped, naming the job's repository and ref
    /// ([`crate::results::runtime_token`]). A credential: never logged.
    #[serde(default)]
    pub runtime_token: String,
    /// The actions the job's steps use, `owner/repo@sha`, in order: what "Set up job" fetches.
    #[serde(default)]
    pub uses: Vec<String>,
    /// The job's `GITHUB_TOKEN` (an installation token of the repository's installation),
    /// which actions/runner downloads the actions' tarballs with; empty for a job that uses
    /// none. A credential: never logged.
    #[serde(default)]
    pub github_token: String,
}

/// The answer to asking for a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Acquired {
    pub job: Option<AssignedJob>,
}

/// How often a runner renews the lock on the job it runs. A real runner renews every 60 s and
/// GitHub gives a job up after minutes without a renewal; the fake's runner renews every second
/// so a test can lower the fake's lock timeout ([`crate::state::JOB_LOCK_TIMEOUT`]) to seconds.
pub const JOB_RENEW_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A runner renewing the lock on its job (`/renew`): it is still alive and running it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRenewal {
    pub runner_id: u64,
    pub token: String,
    pub job_id: u64,
}

/// A runner reporting a finished job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDone {
    pub runner_id: u64,
    pub token: String,
    pub job_id: u64,
    pub conclusion: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jit_config_round_trips_and_rejects_garbage() {
        let c = FakeJitConfig {
            server_url: "http://127.0.0.1:1".into(),
            runner_id: 7,
            runner_name: "rm-h-abc".into(),
            token: "t".into(),
            work_folder: "_work".into(),
        };
        assert_eq!(FakeJitConfig::decode(&c.encode()).ok(), Some(c));
        assert!(FakeJitConfig::decode("!!!").is_err());
        assert!(FakeJitConfig::decode(&STANDARD.encode(b"{}")).is_err());
    }
}
