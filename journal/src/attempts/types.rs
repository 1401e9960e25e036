//! The attempt's persisted vocabulary: its id, states and the graph between them, outcomes, stop
//! intents, the workspace kind, the rows written and read, and the errors callers match.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rm_vocab::{JobId, RunnerId, UnixMs};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::Serialize;

use crate::JournalError;
use crate::shapes::AttemptShape;

/// Length of an attempt id: 128 random bits as lowercase hex.
pub const ATTEMPT_ID_LEN: usize = 32;

/// How much of the attempt id names the runner and its ephemeral workspace (CONTRACT §5).
pub const ATTEMPT_SHORT_LEN: usize = 12;

/// An attempt's id: 32 lowercase hex characters. Fresh for every attempt, never reused.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct AttemptId(pub(super) String);

impl AttemptId {
    /// A new random id.
    pub fn generate() -> AttemptId {
        AttemptId(uuid::Uuid::new_v4().simple().to_string())
    }

    /// Accepts exactly 32 lowercase hex characters.
    pub fn parse(text: &str) -> Result<AttemptId, AttemptError> {
        if text.len() == ATTEMPT_ID_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(AttemptId(text.to_owned()))
        } else {
            Err(AttemptError::InvalidId(text.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex characters: the runner name's suffix and the ephemeral workspace's name.
    pub fn short(&self) -> &str {
        // Always in bounds: `parse` and `generate` only make 32-character ASCII ids.
        self.0.get(..ATTEMPT_SHORT_LEN).unwrap_or(&self.0)
    }

    /// `rm-<host>-<short id>`, the runner's name at GitHub (CONTRACT §5).
    pub fn runner_name(&self, host: &str) -> String {
        format!("rm-{host}-{}", self.short())
    }
}

/// Read back as written: a stored id that is not one is a conversion error, never an id.
impl FromSql for AttemptId {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        AttemptId::parse(value.as_str()?).map_err(|err| FromSqlError::Other(Box::new(err)))
    }
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an attempt is in its lifecycle:
/// `allocated → jit_received → starting → idle ⇄ busy → finished | failed | orphaned → cleaned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    /// Journalled under the allocation lock; nothing outside the process has happened yet.
    Allocated,
    /// GitHub issued the JIT configuration (the registration exists); no process recorded yet.
    JitReceived,
    /// The runner process is spawned and its identity recorded; not yet seen registered.
    Starting,
    /// Registered at GitHub, waiting for a job.
    Idle,
    /// Running its one job.
    Busy,
    /// Ended well: it completed its job, or exited idle (not a failure).
    Finished,
    /// Ended in a failure; the reason says which.
    Failed,
    /// Lost while it had a job: the process is gone and nothing says the job completed.
    Orphaned,
    /// Deregistered and its workspace removed or scrubbed: nothing is left.
    Cleaned,
}

use AttemptState::{
    Allocated, Busy, Cleaned, Failed, Finished, Idle, JitReceived, Orphaned, Starting,
};

impl AttemptState {
    /// Every state, in lifecycle order.
    pub const ALL: [AttemptState; 9] = [
        Allocated,
        JitReceived,
        Starting,
        Idle,
        Busy,
        Finished,
        Failed,
        Orphaned,
        Cleaned,
    ];

    /// The states that hold a runner (or are about to): they count against capacity.
    pub const LIVE: [AttemptState; 5] = [Allocated, JitReceived, Starting, Idle, Busy];

    /// The concluded states: the runner is over, its cleanup is not done yet.
    pub const TERMINAL: [AttemptState; 3] = [Finished, Failed, Orphaned];

    pub fn as_str(self) -> &'static str {
        match self {
            Allocated => "allocated",
            JitReceived => "jit_received",
            Starting => "starting",
            Idle => "idle",
            Busy => "busy",
            Finished => "finished",
            Failed => "failed",
            Orphaned => "orphaned",
            Cleaned => "cleaned",
        }
    }

    pub fn parse(name: &str) -> Option<AttemptState> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The states from which an attempt may move to `self`. `allocated` is only ever inserted.
    ///
    /// Beyond the main line: a runner can register and take its job between two observations
    /// (`starting → busy`), a job GitHub withdrew sends it back (`busy → idle`), and a runner
    /// that ran its job may be found dead before its start or registration was recorded
    /// (`jit_received | starting → finished`). A failure or an orphaning can end any live state.
    pub fn allowed_predecessors(self) -> &'static [AttemptState] {
        match self {
            Allocated => &[],
            JitReceived => &[Allocated],
            Starting => &[JitReceived],
            Idle => &[Starting, Busy],
            Busy => &[Starting, Idle],
            Finished => &[JitReceived, Starting, Idle, Busy],
            Failed | Orphaned => &Self::LIVE,
            Cleaned => &Self::TERMINAL,
        }
    }

    /// Whether `from → to` is an edge of the lifecycle.
    pub fn can_move(from: AttemptState, to: AttemptState) -> bool {
        to.allowed_predecessors().contains(&from)
    }

    /// Live: the attempt holds (or is about to hold) a runner and counts against capacity.
    pub fn counts_against_capacity(self) -> bool {
        Self::LIVE.contains(&self)
    }

    /// Concluded but not yet cleaned.
    pub fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self)
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// It ran its job.
    CompletedJob,
    /// It got no job and was stopped or left on its own. Demand is advisory, so this is the
    /// expected fate of a surplus runner: never a failure, and replaced only to keep its
    /// policy's `min_runners`.
    IdleExit,
    /// It failed; `reason` says how.
    Failed,
    /// It was lost while it had a job.
    Orphaned,
}

impl AttemptOutcome {
    pub const ALL: [AttemptOutcome; 4] = [
        AttemptOutcome::CompletedJob,
        AttemptOutcome::IdleExit,
        AttemptOutcome::Failed,
        AttemptOutcome::Orphaned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::CompletedJob => "completed_job",
            AttemptOutcome::IdleExit => "idle_exit",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Orphaned => "orphaned",
        }
    }

    pub fn parse(name: &str) -> Option<AttemptOutcome> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// The terminal state an attempt with this outcome is in.
    pub fn terminal_state(self) -> AttemptState {
        match self {
            AttemptOutcome::CompletedJob | AttemptOutcome::IdleExit => Finished,
            AttemptOutcome::Failed => Failed,
            AttemptOutcome::Orphaned => Orphaned,
        }
    }

    /// Only failures and orphanings count as failures; an idle exit never does.
    pub fn is_failure(self) -> bool {
        matches!(self, AttemptOutcome::Failed | AttemptOutcome::Orphaned)
    }
}

/// Why the agent is stopping a runner process. Journalled (and synced) before the first signal,
/// so a crash between the two leaves the reason behind for recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopIntent {
    /// Spawned but not registered within `runner.registration_timeout`: a failure.
    RegistrationTimeout,
    /// Registered but no job within `runner.idle_timeout`: an idle exit.
    IdleTimeout,
    /// Concluded, but its process outlived the grace period: stopped before its workspace goes.
    Concluded,
    /// Its runtime holds more than the policy's `disk_max`: a failure, stopped even while busy.
    DiskExceeded,
    /// Idle, alive, and GitHub has not listed it online for a while (a ghost): a failure.
    Ghost,
    /// An idle runner of a scale set that wants fewer runners than it has (its jobs cancelled
    /// or taken elsewhere): removed from the scale set, then stopped; an idle exit.
    ScaleDown,
}

impl StopIntent {
    pub const ALL: [StopIntent; 6] = [
        StopIntent::RegistrationTimeout,
        StopIntent::IdleTimeout,
        StopIntent::Concluded,
        StopIntent::DiskExceeded,
        StopIntent::Ghost,
        StopIntent::ScaleDown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StopIntent::RegistrationTimeout => "registration_timeout",
            StopIntent::IdleTimeout => "idle_timeout",
            StopIntent::Concluded => "concluded",
            StopIntent::DiskExceeded => "disk_exceeded",
            StopIntent::Ghost => "ghost",
            StopIntent::ScaleDown => "scale_down",
        }
    }

    pub fn parse(name: &str) -> Option<StopIntent> {
        Self::ALL.into_iter().find(|i| i.as_str() == name)
    }

    /// The states this intent may be recorded in. Recording it is the compare-and-set that
    /// licenses the signal: a runner that became busy since the decision is never stopped.
    pub fn applies_to(self) -> &'static [AttemptState] {
        match self {
            StopIntent::RegistrationTimeout => &[Starting],
            StopIntent::IdleTimeout => &[Idle],
            StopIntent::Concluded => &AttemptState::TERMINAL,
            // A job that fills the disk is stopped whatever it is doing: the bound protects the
            // host and every other runner on it.
            StopIntent::DiskExceeded => &[Starting, Idle, Busy],
            // A ghost is idle: once GitHub lists it busy it is no ghost (the record compare-and-
            // set loses to a runner that took a job meanwhile).
            StopIntent::Ghost => &[Idle],
            // Idle only: a runner that took a job since is not stopped (and the scale set
            // refused its removal then).
            StopIntent::ScaleDown => &[Idle],
        }
    }
}

/// What cleanup does with the runtime directory: dispatched on this journalled kind, never on the
/// directory's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceKind {
    /// `<runner_root>/<short id>/`, removed whole.
    Ephemeral,
    /// `<runner_root>/<policy>/s<N>/`, scrubbed down to `_work`.
    Persistent,
}

impl WorkspaceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceKind::Ephemeral => "ephemeral",
            WorkspaceKind::Persistent => "persistent",
        }
    }

    pub fn parse(name: &str) -> Option<WorkspaceKind> {
        [WorkspaceKind::Ephemeral, WorkspaceKind::Persistent]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

/// Which execution backend runs an attempt's runner (CONTRACT §7). Journalled at allocation:
/// supervision and cleanup dispatch on it, never on the current configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationKind {
    /// The runner runs as the agent's own user.
    None,
    /// A uid of the pool, a cgroup and a private mount namespace per runner.
    User,
}

impl IsolationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationKind::None => "none",
            IsolationKind::User => "user",
        }
    }

    pub fn parse(name: &str) -> Option<IsolationKind> {
        [IsolationKind::None, IsolationKind::User]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

macro_rules! sql_text_enum {
    ($($ty:ty),*) => {$(
        impl ToSql for $ty {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }
        impl FromSql for $ty {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let text = value.as_str()?;
                <$ty>::parse(text).ok_or_else(|| {
                    FromSqlError::Other(format!("unknown {} {text:?}", stringify!($ty)).into())
                })
            }
        }
    )*};
}
sql_text_enum!(
    AttemptState,
    AttemptOutcome,
    StopIntent,
    WorkspaceKind,
    IsolationKind
);

/// The row written before anything else happens for a runner.
#[derive(Debug, Clone)]
pub struct NewAttempt<'a> {
    pub attempt_id: &'a AttemptId,
    pub policy: &'a str,
    /// Must be [`AttemptId::runner_name`] of this id.
    pub runner_name: &'a str,
    pub workspace: WorkspaceKind,
    /// Must be UTF-8 and spelled the same way for every attempt (the workspace fence compares
    /// the text).
    pub runtime_dir: &'a Path,
    pub created_at_ms: UnixMs,
    pub isolation: IsolationKind,
    /// The runner uid, held until the attempt is released or cleaned (`user` isolation only).
    pub uid: Option<u32>,
    /// The runner's cgroup directory (`user` isolation where cgroup v2 is writable).
    pub cgroup: Option<&'a Path>,
    /// The id of the image the runner's root is (its config digest, `sha256:<64 lowercase
    /// hex>`: the image store's key); `None` for a runner on the host's own root.
    pub image: Option<&'a str>,
    /// What the runner takes from the host and the devices it holds, written with the row (the
    /// holds in the same transaction); `None` for a runner of no declared shape.
    pub shape: Option<&'a AttemptShape>,
}

/// An image id's algorithm prefix: the only digest the image store keys on.
const IMAGE_ID_PREFIX: &str = "sha256:";

/// Hex characters of a sha256 image id after its prefix.
const IMAGE_ID_HEX_LEN: usize = 64;

/// Whether `text` is an image id as the journal stores it: `sha256:` and 64 lowercase hex
/// characters (the schema's CHECK says the same).
pub(crate) fn is_image_id(text: &str) -> bool {
    text.strip_prefix(IMAGE_ID_PREFIX).is_some_and(|hex| {
        hex.len() == IMAGE_ID_HEX_LEN
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// One attempt as the journal holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub attempt_id: AttemptId,
    pub policy: String,
    pub runner_name: String,
    pub workspace: WorkspaceKind,
    pub runtime_dir: PathBuf,
    pub state: AttemptState,
    /// When the current state was entered: the registration, idle and launch timers run from it.
    pub state_changed_at_ms: UnixMs,
    pub outcome: Option<AttemptOutcome>,
    /// The failure kind (snake_case), for failed attempts.
    pub reason: Option<String>,
    /// One sentence for the operator (never the JIT, a token or a child's output).
    pub detail: Option<String>,
    pub runner_id: Option<RunnerId>,
    pub job_id: Option<JobId>,
    pub pid: Option<u32>,
    /// The process's start time as the kernel reports it (Linux: field 22 of `/proc/<pid>/stat`,
    /// clock ticks since boot). With the pid it names one process: a recycled pid has another.
    pub pid_start_time: Option<u64>,
    pub stop_intent: Option<StopIntent>,
    pub stop_intent_at_ms: Option<UnixMs>,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
    /// The boot the pid and start time belong to; `None` for attempts journalled before rm
    /// recorded it (their identity is then trusted within the current boot only).
    pub pid_boot_id: Option<String>,
    /// The backend the attempt was started under.
    pub isolation: IsolationKind,
    /// The runner uid the attempt holds until it is released or cleaned (kept for the record
    /// afterwards: the fence reads [`AttemptRecord::released_at_ms`] too).
    pub uid: Option<u32>,
    /// The runner's cgroup directory.
    pub cgroup: Option<PathBuf>,
    /// When the concluded attempt was released: its processes proven gone, its runtime removed
    /// (or its slot scrubbed) and its uid free for another runner. `None` until then; the
    /// attempt is `cleaned` once its registration is settled too.
    pub released_at_ms: Option<UnixMs>,
    /// The id of the image the runner ran in (`sha256:<64 hex>`); `None` for a runner on the
    /// host's own root, and for every attempt journalled before rm recorded it (schema v13).
    pub image: Option<String>,
    /// What the runner took from the host and the devices it held (kept for the record after
    /// they are freed: the holds themselves are [`crate::Attempts::held_devices`]); `None` for
    /// an attempt journalled without one, and for every attempt from before schema v15.
    pub shape: Option<AttemptShape>,
}

/// Which attempts a listing returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every attempt, cleaned ones included (until retention removes them).
    All,
    /// Everything supervision still has work on: live and concluded-but-not-cleaned.
    Uncleaned,
    /// Live attempts only: what counts against capacity.
    Live,
}

/// One policy's live attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyLive {
    /// Live attempts (allocated, jit_received, starting, idle or busy).
    pub live: u32,
    /// Of those, busy ones: they took a job and do not offset demand.
    pub busy: u32,
}

impl PolicyLive {
    /// Live but not busy: runners that will take the queued jobs.
    pub fn unassigned(&self) -> u32 {
        self.live.saturating_sub(self.busy)
    }
}

/// Live attempts per policy; the host-wide figure is their sum. Attempts of a policy no longer
/// configured still count: they hold runners on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveCounts {
    pub per_policy: BTreeMap<String, PolicyLive>,
}

impl LiveCounts {
    pub fn host_live(&self) -> u32 {
        self.per_policy.values().map(|p| p.live).sum()
    }

    pub fn policy(&self, policy: &str) -> PolicyLive {
        self.per_policy.get(policy).copied().unwrap_or_default()
    }
}

/// What callers of the attempt writes match on.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error("{0:?} is not an attempt id (32 lowercase hex characters)")]
    InvalidId(String),
    #[error("runner name {runner_name:?} is not rm-<host>-<first 12 hex of attempt {attempt_id}>")]
    InvalidRunnerName {
        attempt_id: AttemptId,
        runner_name: String,
    },
    #[error("runtime directory {0} is not UTF-8; choose a runner_root with a UTF-8 path")]
    NonUtf8Path(PathBuf),
    /// The image named is not an image id (`sha256:` and 64 lowercase hex characters).
    #[error("{0:?} is not an image id (sha256: and 64 lowercase hex characters)")]
    InvalidImage(String),
    #[error("attempt {attempt_id} or runner name {runner_name} is already journalled")]
    AlreadyJournalled {
        attempt_id: AttemptId,
        runner_name: String,
    },
    /// The uid fence: an attempt that is not cleaned yet holds this runner uid.
    #[error("runner uid {0} is still held by an attempt that is not cleaned")]
    UidInUse(u32),
    /// The device fence: an attempt neither released nor cleaned holds this device. Nothing of
    /// the refused attempt was written.
    #[error("device {device} is held by attempt {holder}, which is neither released nor cleaned")]
    DeviceHeld { device: String, holder: AttemptId },
    /// A shape's device list names a device twice, or an empty id.
    #[error("device {0:?} is listed twice in one shape, or is no device id")]
    InvalidDevice(String),
    /// The workspace fence: an attempt that is not cleaned yet holds this directory or slot.
    #[error("runtime directory {0} still belongs to an attempt that is not cleaned")]
    WorkspaceInUse(PathBuf),
    #[error("no attempt {0} in the journal")]
    Unknown(AttemptId),
    /// A different value is already journalled; overwriting it could deregister or attribute the
    /// wrong runner.
    #[error("attempt {attempt_id} already has {field} {journalled}, not {offered}")]
    Conflict {
        attempt_id: AttemptId,
        field: &'static str,
        journalled: i64,
        offered: i64,
    },
    /// A caller asked for a move the lifecycle does not have (a bug in the caller).
    #[error("an attempt cannot move from {from} to {to}")]
    IllegalTransition {
        from: &'static str,
        to: &'static str,
    },
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The call ran on a blocking thread that could not finish it (the runtime is shutting
    /// down): nothing is known to have been written.
    #[error("the journal call did not run: {0}")]
    NotRun(String),
}

impl From<rusqlite::Error> for AttemptError {
    fn from(err: rusqlite::Error) -> Self {
        AttemptError::Journal(JournalError::Sqlite(err))
    }
}
