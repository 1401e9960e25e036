//! The journal's side of job wait times (CONTRACT §8): the rows that say when each job this host
//! served was queued, when the runner that took it was started, and when it started. The agent
//! turns them into samples and percentiles (`rm_agent::latency`); this module only reads.

use rm_vocab::{JobId, UnixMs};
use rusqlite::{Connection, Row};

use crate::JournalError;

/// One job that started on a runner of this host, with the ends of its wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitRow {
    pub job_id: JobId,
    /// The policy of the attempt whose runner took the job.
    pub policy: String,
    /// GitHub's `created_at`, when a sighting carried it.
    pub queued_at_ms: Option<UnixMs>,
    /// When the journal first saw the job: the start of the wait when GitHub's is unknown.
    pub first_seen_at_ms: UnixMs,
    /// GitHub's `started_at`, else when the journal learned of the `in_progress`.
    pub job_started_at_ms: UnixMs,
    /// When the runner process was started; `None` for attempts from before the journal kept it
    /// (or one found already running its job).
    pub runner_started_at_ms: Option<UnixMs>,
}

/// Jobs that started at or after `since_ms` on a runner of this host (the journal names the
/// runner GitHub reported; only runners of this host have attempts), oldest start first.
pub(crate) fn wait_rows(conn: &Connection, since_ms: UnixMs) -> Result<Vec<WaitRow>, JournalError> {
    let mut stmt = conn.prepare_cached(
        "SELECT j.job_id, a.policy, j.queued_at, j.first_seen_at, j.started_at, a.started_at
         FROM jobs j JOIN attempts a ON a.runner_name = j.runner_name
         WHERE j.started_at IS NOT NULL AND j.started_at >= ?1
         ORDER BY j.started_at, j.job_id",
    )?;
    let rows = stmt.query_map([since_ms], wait_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn wait_row(row: &Row<'_>) -> rusqlite::Result<WaitRow> {
    Ok(WaitRow {
        job_id: row.get(0)?,
        policy: row.get(1)?,
        queued_at_ms: row.get(2)?,
        first_seen_at_ms: row.get(3)?,
        job_started_at_ms: row.get(4)?,
        runner_started_at_ms: row.get(5)?,
    })
}
