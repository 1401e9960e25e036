//! Runner attempts: the durable record of every runner this host starts, from the row written
//! before any effect outside the process (ARCHITECTURE guarantee 3) to `cleaned`.
//!
//! This module owns the attempt's persisted vocabulary (states, outcomes, stop intents, the
//! workspace kind), the state graph the writes enforce, and the writes and reads over the
//! `attempts` table. Every transition is one compare-and-set statement
//! (`UPDATE ... WHERE attempt_id = ? AND state IN (<allowed predecessors>)`) that reports whether
//! it won, so supervision, the webhook path and recovery can race without two of them both
//! moving an attempt. Moves decided on an observation that could be stale (a conclusion, the
//! step back to `idle`) compare against exactly the state the decision was made in. The JIT
//! configuration is never written here.
//!
//! The agent's lifecycle is not on the webhook hot path, so these writes are synchronous calls on
//! a connection the agent owns ([`Attempts`]), opened with the group writer's pragmas; SQLite
//! serialises the two writers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OptionalExtension, Row, params};
use serde::Serialize;

use crate::{JournalError, connection};

/// Length of an attempt id: 128 random bits as lowercase hex.
pub const ATTEMPT_ID_LEN: usize = 32;

/// How much of the attempt id names the runner and its ephemeral workspace (CONTRACT §5).
pub const ATTEMPT_SHORT_LEN: usize = 12;

/// An attempt's id: 32 lowercase hex characters. Fresh for every attempt, never reused.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct AttemptId(String);

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
    /// expected fate of a surplus runner: never a failure, never replaced.
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
}

impl StopIntent {
    pub const ALL: [StopIntent; 3] = [
        StopIntent::RegistrationTimeout,
        StopIntent::IdleTimeout,
        StopIntent::Concluded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StopIntent::RegistrationTimeout => "registration_timeout",
            StopIntent::IdleTimeout => "idle_timeout",
            StopIntent::Concluded => "concluded",
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
sql_text_enum!(AttemptState, AttemptOutcome, StopIntent, WorkspaceKind);

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
    pub created_at_ms: i64,
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
    pub state_changed_at_ms: i64,
    pub outcome: Option<AttemptOutcome>,
    /// The failure kind (snake_case), for failed attempts.
    pub reason: Option<String>,
    /// One sentence for the operator (never the JIT, a token or a child's output).
    pub detail: Option<String>,
    pub runner_id: Option<i64>,
    pub job_id: Option<i64>,
    pub pid: Option<u32>,
    /// The process's start time as the kernel reports it (Linux: field 22 of `/proc/<pid>/stat`,
    /// clock ticks since boot). With the pid it names one process: a recycled pid has another.
    pub pid_start_time: Option<u64>,
    pub stop_intent: Option<StopIntent>,
    pub stop_intent_at_ms: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The boot the pid and start time belong to; `None` for attempts journalled before rm
    /// recorded it (their identity is then trusted within the current boot only).
    pub pid_boot_id: Option<String>,
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
    #[error("attempt {attempt_id} or runner name {runner_name} is already journalled")]
    AlreadyJournalled {
        attempt_id: AttemptId,
        runner_name: String,
    },
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
}

impl From<rusqlite::Error> for AttemptError {
    fn from(err: rusqlite::Error) -> Self {
        AttemptError::Journal(JournalError::Sqlite(err))
    }
}

pub(crate) const ATTEMPT_COLUMNS: &str = "attempt_id, policy, runner_name, workspace, runtime_dir, state, \
     state_changed_at, outcome, reason, detail, runner_id, job_id, pid, pid_start_time, stop_intent, \
     stop_intent_at, created_at, updated_at, pid_boot_id";

/// `'a', 'b'` for an SQL `IN` list. The names come from the enums, never from input.
fn in_list(states: &[AttemptState]) -> String {
    states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The live-state filter, spelled as the partial index `attempts_live` spells it so the planner
/// uses that index.
fn live_filter() -> String {
    format!("state IN ({})", in_list(&AttemptState::LIVE))
}

pub(crate) fn attempt_row(row: &Row<'_>) -> rusqlite::Result<AttemptRecord> {
    let attempt_id: String = row.get(0)?;
    let runtime_dir: String = row.get(4)?;
    Ok(AttemptRecord {
        // The schema's CHECK admits only well-formed ids.
        attempt_id: AttemptId(attempt_id),
        policy: row.get(1)?,
        runner_name: row.get(2)?,
        workspace: row.get(3)?,
        runtime_dir: PathBuf::from(runtime_dir),
        state: row.get(5)?,
        state_changed_at_ms: row.get(6)?,
        outcome: row.get(7)?,
        reason: row.get(8)?,
        detail: row.get(9)?,
        runner_id: row.get(10)?,
        job_id: row.get(11)?,
        pid: row.get(12)?,
        pid_start_time: row.get(13)?,
        stop_intent: row.get(14)?,
        stop_intent_at_ms: row.get(15)?,
        created_at_ms: row.get(16)?,
        updated_at_ms: row.get(17)?,
        pid_boot_id: row.get(18)?,
    })
}

/// Journals a new attempt in `allocated` and returns its row.
pub(crate) fn create(
    conn: &Connection,
    new: &NewAttempt<'_>,
) -> Result<AttemptRecord, AttemptError> {
    let id = new.attempt_id;
    let short = id.short();
    let well_named = new
        .runner_name
        .strip_prefix("rm-")
        .and_then(|rest| rest.strip_suffix(short))
        .is_some_and(|host| host.len() > 1 && host.ends_with('-'));
    if !well_named {
        return Err(AttemptError::InvalidRunnerName {
            attempt_id: id.clone(),
            runner_name: new.runner_name.to_owned(),
        });
    }
    let runtime_dir = new
        .runtime_dir
        .to_str()
        .ok_or_else(|| AttemptError::NonUtf8Path(new.runtime_dir.to_owned()))?;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
                 state_changed_at, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'allocated', ?6, ?6, ?6)",
        )?
        .execute(params![
            id.as_str(),
            new.policy,
            new.runner_name,
            new.workspace,
            runtime_dir,
            new.created_at_ms,
        ]);
    match inserted {
        Ok(_) => {}
        Err(err) if err.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
            // Name the constraint that refused it; the statement itself is atomic.
            let clash: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM attempts WHERE attempt_id = ?1 OR runner_name = ?2)",
                )?
                .query_row(params![id.as_str(), new.runner_name], |r| r.get(0))?;
            if clash {
                return Err(AttemptError::AlreadyJournalled {
                    attempt_id: id.clone(),
                    runner_name: new.runner_name.to_owned(),
                });
            }
            let occupied: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM attempts
                         WHERE runtime_dir = ?1 AND state != 'cleaned')",
                )?
                .query_row([runtime_dir], |r| r.get(0))?;
            if occupied {
                return Err(AttemptError::WorkspaceInUse(new.runtime_dir.to_owned()));
            }
            return Err(err.into());
        }
        Err(err) => return Err(err.into()),
    }
    get(conn, id)?.ok_or_else(|| AttemptError::Unknown(id.clone()))
}

/// One attempt by id.
pub(crate) fn get(
    conn: &Connection,
    id: &AttemptId,
) -> Result<Option<AttemptRecord>, AttemptError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ?1"
        ))?
        .query_row([id.as_str()], attempt_row)
        .optional()?)
}

/// One attempt by runner name (a webhook names the runner, GitHub's inventory lists names).
pub(crate) fn by_runner_name(
    conn: &Connection,
    runner_name: &str,
) -> Result<Option<AttemptRecord>, AttemptError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE runner_name = ?1"
        ))?
        .query_row([runner_name], attempt_row)
        .optional()?)
}

/// Attempts in `scope`, of one policy or all, oldest first (the order they were allocated).
pub(crate) fn list(
    conn: &Connection,
    scope: Scope,
    policy: Option<&str>,
) -> Result<Vec<AttemptRecord>, AttemptError> {
    let filter = match scope {
        Scope::All => "1".to_owned(),
        Scope::Uncleaned => "state != 'cleaned'".to_owned(),
        Scope::Live => live_filter(),
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {filter} AND (?1 IS NULL OR policy = ?1)
         ORDER BY created_at, attempt_id"
    ))?;
    let rows = stmt.query_map([policy], attempt_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Live attempts per policy (and so host-wide).
pub(crate) fn live_counts(conn: &Connection) -> Result<LiveCounts, AttemptError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT policy, COUNT(*), SUM(state = 'busy') FROM attempts WHERE {} GROUP BY policy",
        live_filter()
    ))?;
    let per_policy = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                PolicyLive {
                    live: row.get(1)?,
                    busy: row.get(2)?,
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    Ok(LiveCounts { per_policy })
}

/// The compare-and-set at the heart of every transition: moves `id` to `to` from any of
/// `from`, applying `set` (extra `column = ?n` assignments, parameters from `?4`) in the same
/// statement. Returns whether it won.
fn compare_and_set(
    conn: &Connection,
    id: &AttemptId,
    from: &[AttemptState],
    to: AttemptState,
    set: &str,
    extra: &[&dyn ToSql],
    at_ms: i64,
) -> Result<bool, AttemptError> {
    for state in from {
        if !AttemptState::can_move(*state, to) {
            return Err(AttemptError::IllegalTransition {
                from: state.as_str(),
                to: to.as_str(),
            });
        }
    }
    if from.is_empty() {
        return Ok(false);
    }
    let sql = format!(
        "UPDATE attempts SET state = ?2, state_changed_at = ?3, updated_at = ?3{set}
         WHERE attempt_id = ?1 AND state IN ({})",
        in_list(from)
    );
    let mut values: Vec<&dyn ToSql> = vec![&id.0, &to, &at_ms];
    values.extend_from_slice(extra);
    let changed = conn
        .prepare_cached(&sql)?
        .execute(rusqlite::params_from_iter(values))?;
    Ok(changed == 1)
}

/// `allocated → jit_received`, with GitHub's runner id from the JIT response (recorded before the
/// process starts, so deregistration never depends on the process).
pub(crate) fn jit_received(
    conn: &Connection,
    id: &AttemptId,
    runner_id: i64,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        JitReceived.allowed_predecessors(),
        JitReceived,
        ", runner_id = ?4",
        &[&runner_id],
        at_ms,
    )
}

/// `jit_received → starting`, with the process identity (pid and start time).
pub(crate) fn started(
    conn: &Connection,
    id: &AttemptId,
    pid: u32,
    pid_start_time: u64,
    boot_id: Option<&str>,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        Starting.allowed_predecessors(),
        Starting,
        ", pid = ?4, pid_start_time = ?5, pid_boot_id = ?6",
        &[&pid, &pid_start_time, &boot_id],
        at_ms,
    )
}

/// `starting → idle` (registered and waiting) or `busy → idle` (a job GitHub withdrew before
/// any worker started), from the state the observation was made in. Idle is the one move back,
/// so it is compare-and-set on that exact state: an observation of a starting runner must not
/// pull back one the webhook path has just marked busy.
pub(crate) fn mark_idle(
    conn: &Connection,
    id: &AttemptId,
    from: AttemptState,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    compare_and_set(conn, id, &[from], Idle, "", &[], at_ms)
}

/// `starting | idle → busy`, with the job when it is known (a later assignment replaces one
/// GitHub withdrew). Forward only, so any predecessor will do.
pub(crate) fn mark_busy(
    conn: &Connection,
    id: &AttemptId,
    job_id: Option<i64>,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        Busy.allowed_predecessors(),
        Busy,
        ", job_id = COALESCE(?4, job_id)",
        &[&job_id],
        at_ms,
    )
}

/// Records a value that is journalled once (`runner_id`, `job_id`): set when empty, accepted
/// again when equal, refused when different. A cleaned attempt takes nothing.
fn record_once(
    conn: &Connection,
    id: &AttemptId,
    column: &'static str,
    value: i64,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE attempts SET {column} = ?2, updated_at = ?3
             WHERE attempt_id = ?1 AND state != 'cleaned' AND {column} IS NULL"
        ))?
        .execute(params![id.as_str(), value, at_ms])?;
    if changed == 1 {
        return Ok(true);
    }
    let current: Option<(Option<i64>, AttemptState)> = conn
        .prepare_cached(&format!(
            "SELECT {column}, state FROM attempts WHERE attempt_id = ?1"
        ))?
        .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match current {
        None => Err(AttemptError::Unknown(id.clone())),
        Some((Some(journalled), _)) if journalled != value => Err(AttemptError::Conflict {
            attempt_id: id.clone(),
            field: column,
            journalled,
            offered: value,
        }),
        // Already this value, or the attempt is cleaned.
        Some(_) => Ok(false),
    }
}

/// Records a stop intent; `true` means it is journalled and synced and the signal may be sent.
/// It wins only while the attempt is in a state the intent applies to: a runner that turned busy
/// after the decision is never stopped for idling. A later intent replaces an earlier one (the
/// latest signal's reason is what recovery must conclude with).
pub(crate) fn record_stop_intent(
    conn: &Connection,
    id: &AttemptId,
    intent: StopIntent,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE attempts SET stop_intent = ?2, updated_at = ?3,
                 stop_intent_at = CASE WHEN stop_intent IS ?2 THEN stop_intent_at ELSE ?3 END
             WHERE attempt_id = ?1 AND state IN ({})",
            in_list(intent.applies_to())
        ))?
        .execute(params![id.as_str(), intent, at_ms])?;
    Ok(changed == 1)
}

/// Concludes an attempt that is still in `from` (the state the decision was made from): a
/// runner that changed state since (took a job, say) is not concluded on stale facts.
pub(crate) fn conclude(
    conn: &Connection,
    id: &AttemptId,
    from: AttemptState,
    outcome: AttemptOutcome,
    reason: Option<&str>,
    detail: Option<&str>,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        &[from],
        outcome.terminal_state(),
        ", outcome = ?4, reason = ?5, detail = ?6",
        &[&outcome, &reason, &detail],
        at_ms,
    )
}

/// `finished | failed | orphaned → cleaned`: deregistered (or given up on) and the workspace
/// removed or scrubbed. Frees the runtime directory for the next attempt.
pub(crate) fn mark_cleaned(
    conn: &Connection,
    id: &AttemptId,
    at_ms: i64,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        Cleaned.allowed_predecessors(),
        Cleaned,
        "",
        &[],
        at_ms,
    )
}

/// The agent's handle on the attempt table: its own write connection, opened with the same
/// settings as the group writer (WAL, `synchronous=FULL`, busy timeout), so a call that returns
/// `Ok` is on disk. Not shared between threads: wrap it in a mutex.
pub struct Attempts {
    conn: Connection,
}

impl Attempts {
    /// Opens (creating and migrating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<Attempts, JournalError> {
        Ok(Attempts {
            conn: connection::open_writer(path)?,
        })
    }

    /// Journals a new attempt in `allocated`. Call it under the allocation lock, before any
    /// package, GitHub or process effect.
    pub fn create(&self, new: &NewAttempt<'_>) -> Result<AttemptRecord, AttemptError> {
        create(&self.conn, new)
    }

    pub fn get(&self, id: &AttemptId) -> Result<Option<AttemptRecord>, AttemptError> {
        get(&self.conn, id)
    }

    pub fn by_runner_name(&self, runner_name: &str) -> Result<Option<AttemptRecord>, AttemptError> {
        by_runner_name(&self.conn, runner_name)
    }

    /// Attempts in `scope`, of `policy` or of every policy, oldest first.
    pub fn list(
        &self,
        scope: Scope,
        policy: Option<&str>,
    ) -> Result<Vec<AttemptRecord>, AttemptError> {
        list(&self.conn, scope, policy)
    }

    /// Live attempts per policy and host-wide.
    pub fn live_counts(&self) -> Result<LiveCounts, AttemptError> {
        live_counts(&self.conn)
    }

    /// `allocated → jit_received` with the runner id. `Ok(false)`: it was no longer allocated.
    pub fn jit_received(
        &self,
        id: &AttemptId,
        runner_id: i64,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        jit_received(&self.conn, id, runner_id, at_ms)
    }

    /// `jit_received → starting` with the process identity.
    pub fn started(
        &self,
        id: &AttemptId,
        pid: u32,
        pid_start_time: u64,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        started(&self.conn, id, pid, pid_start_time, None, at_ms)
    }

    /// [`Attempts::started`] with the boot the identity belongs to.
    pub fn started_on_boot(
        &self,
        id: &AttemptId,
        pid: u32,
        pid_start_time: u64,
        boot_id: &str,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        started(&self.conn, id, pid, pid_start_time, Some(boot_id), at_ms)
    }

    /// `from → idle`, `from` being `starting` or `busy`: the state the observation was made in.
    pub fn mark_idle(
        &self,
        id: &AttemptId,
        from: AttemptState,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        mark_idle(&self.conn, id, from, at_ms)
    }

    /// `starting | idle → busy`, with the job when known.
    pub fn mark_busy(
        &self,
        id: &AttemptId,
        job_id: Option<i64>,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        mark_busy(&self.conn, id, job_id, at_ms)
    }

    /// Records GitHub's runner id learned after the fact (an attempt whose JIT response was lost
    /// to a crash, found in GitHub's inventory). `Ok(true)` when recorded now.
    pub fn record_runner_id(
        &self,
        id: &AttemptId,
        runner_id: i64,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        record_once(&self.conn, id, "runner_id", runner_id, at_ms)
    }

    /// Records the job a runner took (an `in_progress` delivery naming it). `Ok(true)` when
    /// recorded now.
    pub fn record_job(
        &self,
        id: &AttemptId,
        job_id: i64,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        record_once(&self.conn, id, "job_id", job_id, at_ms)
    }

    /// Journals why the process is about to be stopped. Signal only after `Ok(true)`.
    pub fn record_stop_intent(
        &self,
        id: &AttemptId,
        intent: StopIntent,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        record_stop_intent(&self.conn, id, intent, at_ms)
    }

    /// Moves an attempt still in `from` to `outcome`'s terminal state with its reason and detail.
    pub fn conclude(
        &self,
        id: &AttemptId,
        from: AttemptState,
        outcome: AttemptOutcome,
        reason: Option<&str>,
        detail: Option<&str>,
        at_ms: i64,
    ) -> Result<bool, AttemptError> {
        conclude(&self.conn, id, from, outcome, reason, detail, at_ms)
    }

    /// `finished | failed | orphaned → cleaned`.
    pub fn mark_cleaned(&self, id: &AttemptId, at_ms: i64) -> Result<bool, AttemptError> {
        mark_cleaned(&self.conn, id, at_ms)
    }
}
