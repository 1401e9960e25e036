//! The journal changes a handler can ask for. They are plain values: the journal applies them
//! inside the transaction that records the delivery.

use rm_vocab::{JobId, JobState, RunnerId, Source, UnixMs};

/// A change to the journal's state.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A `workflow_job` was seen in some state; the journal merges it forward only.
    Job(JobObservation),
    /// The App was installed on an account, or an installation became usable again.
    InstallationUpsert(Installation),
    /// An installation was suspended (`true`) or unsuspended (`false`).
    InstallationSuspended {
        installation_id: i64,
        suspended: bool,
    },
    /// The App was uninstalled: the installation and its repository scope are gone.
    InstallationRemoved { installation_id: i64 },
    /// Repositories joined an installation's scope.
    RepositoriesAdded {
        installation_id: i64,
        repositories: Vec<Repository>,
    },
    /// Repositories left an installation's scope.
    RepositoriesRemoved {
        installation_id: i64,
        repository_ids: Vec<i64>,
    },
}

/// One sighting of a `workflow_job`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobObservation {
    pub job_id: JobId,
    pub run_id: i64,
    pub run_attempt: i64,
    /// `owner/name`.
    pub repository: String,
    pub installation_id: Option<i64>,
    /// The job's `runs-on` labels, as GitHub sent them.
    pub labels: Vec<String>,
    pub state: JobState,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
    pub runner_id: Option<RunnerId>,
    pub workflow_name: Option<String>,
    pub job_name: Option<String>,
    /// GitHub's `created_at`: when the job was queued, the start of its
    /// wait (CONTRACT §8). `None` when the sighting carries none that can be read.
    pub queued_at_ms: Option<UnixMs>,
    /// GitHub's `started_at`, for an `in_progress` or `completed` sighting only: GitHub fills it
    /// with the creation time while the job is still queued, which says nothing about a start.
    pub started_at_ms: Option<UnixMs>,
    /// When the journal learned this.
    pub observed_at_ms: UnixMs,
    pub source: Source,
}

/// An App installation as `installation` deliveries describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct Installation {
    pub id: i64,
    /// The organization or user login the App is installed on.
    pub account: Option<String>,
    /// `Organization` or `User`.
    pub account_type: Option<String>,
    /// `all` or `selected`.
    pub repository_selection: Option<String>,
    pub suspended: bool,
    /// The repositories the delivery listed; `None` when it listed none (a `selection = all`
    /// installation may omit them), which leaves the known scope untouched.
    pub repositories: Option<Vec<Repository>>,
}

/// A repository in an installation's scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    pub id: i64,
    /// `owner/name`.
    pub full_name: String,
}
