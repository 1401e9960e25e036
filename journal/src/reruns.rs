//! Re-runs of jobs the infrastructure killed (issue 28): the `reruns` table, its state graph and
//! its statements. This module owns the at-most-once record; what to re-run is decided by the
//! agent (`agent/src/rerun.rs`), the request is the GitHub client's.
//!
//! One row per job (the primary key is the fence): written `intended` when the agent decides,
//! moved to `sending` by a compare-and-set committed before the request leaves, then to what
//! GitHub answered (`sent`, `refused`). A row found `sending` when the agent starts may or may
//! not have reached GitHub: it becomes `unknown` and is never sent again, so a crash can lose a
//! re-run but never ask for one twice. A request GitHub's limits held back (it did nothing) goes
//! back to `intended` and is sent later.

use rm_vocab::{JobId, UnixMs};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::{AttemptError, AttemptId};

/// Where a re-run is: the closed vocabulary of `reruns.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RerunState {
    /// Decided and journalled; nothing sent yet.
    Intended,
    /// About to be sent (journalled before the request): the fence against a second request.
    Sending,
    /// GitHub answered 201: the job was queued again.
    Sent,
    /// GitHub refused it (a missing `actions: write`, a run still in progress, ...); `detail`
    /// says why. Never sent again.
    Refused,
    /// The agent stopped (or the answer was lost) between `sending` and an answer: it may have
    /// been re-run. Never sent again.
    Unknown,
}

impl RerunState {
    pub const ALL: [RerunState; 5] = [
        RerunState::Intended,
        RerunState::Sending,
        RerunState::Sent,
        RerunState::Refused,
        RerunState::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RerunState::Intended => "intended",
            RerunState::Sending => "sending",
            RerunState::Sent => "sent",
            RerunState::Refused => "refused",
            RerunState::Unknown => "unknown",
        }
    }

    pub fn parse(name: &str) -> Option<RerunState> {
        RerunState::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The states a row may move to `self` from. `sending → intended` is the one step back: a
    /// request GitHub did not act on (a limit, the client's own budget, a run still running)
    /// is sent again later. `intended → refused` gives one up unsent (it waited past the
    /// agent's bound for its run to finish).
    pub fn allowed_predecessors(self) -> &'static [RerunState] {
        match self {
            RerunState::Intended => &[RerunState::Sending],
            RerunState::Sending => &[RerunState::Intended],
            RerunState::Refused => &[RerunState::Sending, RerunState::Intended],
            RerunState::Sent | RerunState::Unknown => &[RerunState::Sending],
        }
    }

    /// Whether a row may move from `from` to `to`.
    pub fn can_move(from: RerunState, to: RerunState) -> bool {
        to.allowed_predecessors().contains(&from)
    }

    /// Whether the row is still to be sent (or being sent).
    pub fn is_open(self) -> bool {
        matches!(self, RerunState::Intended | RerunState::Sending)
    }
}

impl ToSql for RerunState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for RerunState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        RerunState::parse(text)
            .ok_or_else(|| FromSqlError::Other(format!("unknown rerun state {text:?}").into()))
    }
}

/// What the agent journals when it decides to re-run a job.
#[derive(Debug, Clone)]
pub struct NewRerun<'a> {
    pub job_id: JobId,
    /// The attempt whose conclusion asked for it.
    pub attempt_id: &'a AttemptId,
    pub policy: &'a str,
    /// The attempt's failure reason (snake_case), one of the policy's `rerun_on`.
    pub reason: &'a str,
    /// `owner/name`.
    pub repository: &'a str,
    pub run_id: i64,
    pub run_attempt: i64,
}

/// A journalled re-run, as `explain`, `status` and the agent read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunRecord {
    pub job_id: JobId,
    pub attempt_id: String,
    pub policy: String,
    pub reason: String,
    pub repository: String,
    pub run_id: i64,
    pub run_attempt: i64,
    pub state: RerunState,
    /// One sentence for the operator: GitHub's refusal, or why the outcome is unknown.
    pub detail: Option<String>,
    pub created_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
}

/// How many re-runs are in each state (`status --json`'s `reruns`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RerunCounts {
    /// `intended` and `sending`: decided, not answered yet.
    pub pending: u64,
    pub sent: u64,
    pub refused: u64,
    pub unknown: u64,
}

pub(crate) const RERUN_COLUMNS: &str = "job_id, attempt_id, policy, reason, repository, run_id, \
     run_attempt, state, detail, created_at, updated_at";

pub(crate) fn rerun_row(row: &Row<'_>) -> rusqlite::Result<RerunRecord> {
    Ok(RerunRecord {
        job_id: row.get(0)?,
        attempt_id: row.get(1)?,
        policy: row.get(2)?,
        reason: row.get(3)?,
        repository: row.get(4)?,
        run_id: row.get(5)?,
        run_attempt: row.get(6)?,
        state: row.get(7)?,
        detail: row.get(8)?,
        created_at_ms: row.get(9)?,
        updated_at_ms: row.get(10)?,
    })
}

/// Journals the decision to re-run a job, `intended`. `Ok(false)`: the job already has a row
/// (whatever its state): a job is re-run at most once by this journal.
pub(crate) fn intend(
    conn: &Connection,
    new: &NewRerun<'_>,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO reruns (job_id, attempt_id, policy, reason, repository, run_id,
                                 run_attempt, state, detail, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'intended', NULL, ?8, ?8)
             ON CONFLICT (job_id) DO NOTHING",
        )?
        .execute(params![
            new.job_id,
            new.attempt_id.as_str(),
            new.policy,
            new.reason,
            new.repository,
            new.run_id,
            new.run_attempt,
            at_ms
        ])?;
    Ok(inserted == 1)
}

/// Moves the job's row from `from` to `to` (with `detail` when given), compare-and-set.
/// `Ok(true)`: this call moved it; `Ok(false)`: the row was not in `from` (another writer
/// moved it, or there is none).
pub(crate) fn advance(
    conn: &Connection,
    job_id: JobId,
    from: RerunState,
    to: RerunState,
    detail: Option<&str>,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    if !RerunState::can_move(from, to) {
        return Err(AttemptError::IllegalTransition {
            from: from.as_str(),
            to: to.as_str(),
        });
    }
    let changed = conn
        .prepare_cached(
            "UPDATE reruns SET state = ?3, detail = COALESCE(?4, detail), updated_at = ?5
             WHERE job_id = ?1 AND state = ?2",
        )?
        .execute(params![job_id, from, to, detail, at_ms])?;
    Ok(changed == 1)
}

/// At start, before anything is sent: every row left `sending` by an agent that stopped
/// becomes `unknown` (GitHub may have re-run it). Returns the jobs settled.
pub(crate) fn settle_interrupted(
    conn: &Connection,
    at_ms: UnixMs,
) -> Result<Vec<JobId>, AttemptError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE reruns SET state = 'unknown', updated_at = ?1,
             detail = 'the agent stopped after it journalled the request and before an answer: \
                       GitHub may have re-run the job; it is never asked again'
         WHERE state = 'sending' RETURNING job_id",
    )?;
    let jobs = stmt
        .query_map([at_ms], |row| row.get(0))?
        .collect::<Result<Vec<JobId>, _>>()?;
    Ok(jobs)
}

/// Rows still `intended`, oldest first: decided, never sent.
pub(crate) fn intended(conn: &Connection) -> Result<Vec<RerunRecord>, AttemptError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {RERUN_COLUMNS} FROM reruns WHERE state = 'intended' ORDER BY created_at, job_id"
    ))?;
    let rows = stmt.query_map([], rerun_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The job's row, if it has one.
pub(crate) fn for_job(conn: &Connection, job_id: JobId) -> rusqlite::Result<Option<RerunRecord>> {
    conn.prepare_cached(&format!(
        "SELECT {RERUN_COLUMNS} FROM reruns WHERE job_id = ?1"
    ))?
    .query_row([job_id], rerun_row)
    .optional()
}

/// How many rows are in each state.
pub(crate) fn counts(conn: &Connection) -> rusqlite::Result<RerunCounts> {
    let mut counts = RerunCounts::default();
    for (state, n) in totals(conn)?.into_iter().map(|(_, _, state, n)| (state, n)) {
        match state {
            RerunState::Intended | RerunState::Sending => counts.pending += n,
            RerunState::Sent => counts.sent += n,
            RerunState::Refused => counts.refused += n,
            RerunState::Unknown => counts.unknown += n,
        }
    }
    Ok(counts)
}

/// `(policy, reason, state, count)` for every combination present (`/metrics`).
pub(crate) fn totals(
    conn: &Connection,
) -> rusqlite::Result<Vec<(String, String, RerunState, u64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT policy, reason, state, COUNT(*) FROM reruns
         GROUP BY policy, reason, state ORDER BY policy, reason, state",
    )?;
    let rows = stmt.query_map([], |row| {
        let n: i64 = row.get(3)?;
        Ok((
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            u64::try_from(n).unwrap_or(0),
        ))
    })?;
    rows.collect()
}
