//! Read-only queries for the CLI, `/metrics` and the agent's demand loop. A [`Reader`] is
//! its own connection, so it never waits for the writer.

use std::path::Path;

use rm_vocab::JobId;
use rusqlite::{Connection, OptionalExtension, Row};

use crate::attempts::{ATTEMPT_COLUMNS, attempt_row};
use crate::{
    AttemptRecord, DeliveryRow, InstallationRow, JobRow, JournalError, Outcome, RerunCounts,
    RerunRecord, RerunState, StoredDelivery, connection,
};
use rm_vocab::UnixMs;

/// The jobs the demand is counted from, read from one snapshot ([`Reader::demand`]).
#[derive(Debug, Clone, Default)]
pub struct DemandView {
    /// Every job in state `queued`, oldest sighting first.
    pub queued: Vec<JobRow>,
    /// The jobs that name one of the runners asked about.
    pub naming: Vec<JobRow>,
}

/// A read-only view of the journal.
pub struct Reader {
    conn: Connection,
}

pub(crate) const JOB_COLUMNS: &str = "job_id, run_id, run_attempt, repository, installation_id, labels, \
     state, conclusion, runner_name, runner_id, workflow_name, job_name, source, first_seen_at, \
     updated_at";

pub(crate) const DELIVERY_COLUMNS: &str =
    "guid, event, action, source, received_at, outcome, reason, replayed_at, body IS NOT NULL";

impl Reader {
    /// Opens an existing journal read-only.
    pub fn open(path: &Path) -> Result<Reader, JournalError> {
        Ok(Reader {
            conn: connection::open_reader(path)?,
        })
    }

    /// Jobs, most recently changed first, at most `limit`.
    pub fn jobs(&self, limit: usize) -> Result<Vec<JobRow>, JournalError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs ORDER BY updated_at DESC, job_id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit_param(limit)], job_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// One job by its `workflow_job.id`.
    pub fn job(&self, job_id: JobId) -> Result<Option<JobRow>, JournalError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?1"))?;
        Ok(stmt.query_row([job_id], job_row).optional()?)
    }

    /// Every job in state `queued`, oldest sighting first: the demand the agent routes.
    pub fn queued_jobs(&self) -> Result<Vec<JobRow>, JournalError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state = 'queued' ORDER BY first_seen_at, job_id"
        ))?;
        let rows = stmt.query_map([], job_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Jobs that name one of `runner_names` as their runner (an `in_progress` or `completed`
    /// sighting): how the agent learns which of its runners took which job.
    pub fn jobs_for_runners(&self, runner_names: &[&str]) -> Result<Vec<JobRow>, JournalError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE runner_name = ?1"
        ))?;
        let mut jobs = Vec::new();
        for name in runner_names {
            for row in stmt.query_map([name], job_row)? {
                jobs.push(row?);
            }
        }
        Ok(jobs)
    }

    /// [`Reader::queued_jobs`] and [`Reader::jobs_for_runners`] read from one snapshot (one
    /// read transaction): a delivery that names a runner moves its job out of `queued` in the
    /// same commit, and two separate reads could see the job still queued and the runner
    /// already named, counting that job twice.
    pub fn demand(&self, runner_names: &[&str]) -> Result<DemandView, JournalError> {
        let snapshot = self.conn.unchecked_transaction()?;
        let view = DemandView {
            queued: self.queued_jobs()?,
            naming: self.jobs_for_runners(runner_names)?,
        };
        snapshot.commit()?;
        Ok(view)
    }

    /// Jobs that started at or after `since_ms` on a runner of this host, with the ends of their
    /// wait (CONTRACT §8), oldest start first.
    pub fn job_waits(&self, since_ms: UnixMs) -> Result<Vec<crate::WaitRow>, JournalError> {
        crate::waits::wait_rows(&self.conn, since_ms)
    }

    /// How many jobs are in each state.
    pub fn job_counts(&self) -> Result<Vec<(String, i64)>, JournalError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state")?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Deliveries, newest first, at most `limit`.
    pub fn deliveries(&self, limit: usize) -> Result<Vec<DeliveryRow>, JournalError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries ORDER BY received_at DESC, id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit_param(limit)], delivery_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many deliveries the journal holds.
    pub fn delivery_count(&self) -> Result<i64, JournalError> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM deliveries", [], |row| row.get(0))?)
    }

    /// How many deliveries have each outcome (`status`).
    pub fn delivery_outcome_counts(&self) -> Result<Vec<(String, i64)>, JournalError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT outcome, COUNT(*) FROM deliveries GROUP BY outcome ORDER BY outcome",
        )?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// When the newest delivery was journalled (any intake), ms since the Unix epoch.
    pub fn last_delivery_at(&self) -> Result<Option<UnixMs>, JournalError> {
        last_delivery_at(&self.conn)
    }

    /// One delivery with its headers and body.
    pub fn delivery(&self, guid: &str) -> Result<Option<StoredDelivery>, JournalError> {
        stored_delivery(&self.conn, guid)
    }

    /// Installations and the repositories in their scope.
    pub fn installations(&self) -> Result<Vec<InstallationRow>, JournalError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, account, account_type, repository_selection, suspended, removed
             FROM installations ORDER BY id",
        )?;
        let mut installations: Vec<InstallationRow> = stmt
            .query_map([], |row| {
                Ok(InstallationRow {
                    id: row.get(0)?,
                    account: row.get(1)?,
                    account_type: row.get(2)?,
                    repository_selection: row.get(3)?,
                    suspended: row.get(4)?,
                    removed: row.get(5)?,
                    repositories: Vec::new(),
                })
            })?
            .collect::<Result<_, _>>()?;
        let mut repos = self.conn.prepare_cached(
            "SELECT full_name FROM installation_repositories WHERE installation_id = ?1
             ORDER BY full_name",
        )?;
        for installation in &mut installations {
            installation.repositories = repos
                .query_map([installation.id], |row| row.get(0))?
                .collect::<Result<_, _>>()?;
        }
        Ok(installations)
    }

    /// Runner attempts, most recently allocated first, at most `limit` (`rm-agent runners`).
    pub fn attempts(&self, limit: usize) -> Result<Vec<AttemptRecord>, JournalError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts
             ORDER BY created_at DESC, attempt_id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit_param(limit)], attempt_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// What the attempt's runner asked for and reached (`policy.egress`, JSON), if kept.
    pub fn egress(&self, id: &crate::AttemptId) -> Result<Option<String>, crate::AttemptError> {
        crate::egress::of_attempt(&self.conn, id)
    }

    /// The egress records of `policy`'s attempts created at or after `since`, oldest first.
    pub fn egress_of_policy(
        &self,
        policy: &str,
        since: UnixMs,
    ) -> Result<Vec<(crate::AttemptId, String)>, crate::AttemptError> {
        crate::egress::of_policy(&self.conn, policy, since)
    }

    /// Every device held on this host and its holder, by device id (`status`).
    pub fn held_devices(&self) -> Result<Vec<(String, crate::AttemptId)>, JournalError> {
        crate::shapes::held_devices(&self.conn)
    }

    /// The shapes of the attempts neither cleaned nor released, oldest first (`status`).
    pub fn live_shapes(
        &self,
    ) -> Result<Vec<(crate::AttemptId, crate::AttemptShape)>, JournalError> {
        crate::shapes::live_shapes(&self.conn)
    }

    /// What `policy`'s attempts created at or after `since` asked for against what they used,
    /// oldest first (`rm-agent shapes`).
    pub fn shape_usage(
        &self,
        policy: &str,
        since: UnixMs,
    ) -> Result<Vec<crate::ShapeUsage>, JournalError> {
        crate::shapes::shape_usage(&self.conn, policy, since)
    }

    /// Every attempt not yet cleaned (what holds a runner uid or awaits cleanup), oldest first.
    pub fn uncleaned_attempts(&self) -> Result<Vec<AttemptRecord>, JournalError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE state != 'cleaned'
             ORDER BY created_at, attempt_id"
        ))?;
        let rows = stmt.query_map([], attempt_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many attempts are in each state (`/metrics`, `status`).
    pub fn attempt_counts(&self) -> Result<Vec<(String, i64)>, JournalError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT state, COUNT(*) FROM attempts GROUP BY state ORDER BY state")?;
        let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Concluded attempts that took a job, concluded (last updated) at or after `since_ms`, with
    /// a reason among `reasons`, whose job has no re-run journalled yet: the re-run candidates,
    /// oldest first.
    pub fn rerun_candidates(
        &self,
        since_ms: UnixMs,
        reasons: &[&str],
    ) -> Result<Vec<AttemptRecord>, JournalError> {
        if reasons.is_empty() {
            return Ok(Vec::new());
        }
        let placeholders = (0..reasons.len())
            .map(|i| format!("?{}", i + 2))
            .collect::<Vec<_>>()
            .join(", ");
        // An attempt concluded before any delivery named its runner (a crash right after it
        // took its job) never learnt its job: the job's row names the runner instead.
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts a
             WHERE a.outcome IS NOT NULL AND a.updated_at >= ?1
               AND a.reason IN ({placeholders})
               AND (a.job_id IS NOT NULL
                    OR EXISTS (SELECT 1 FROM jobs j WHERE j.runner_name = a.runner_name))
             ORDER BY a.updated_at, a.attempt_id"
        ))?;
        let mut values: Vec<&dyn rusqlite::ToSql> = vec![&since_ms];
        values.extend(reasons.iter().map(|r| r as &dyn rusqlite::ToSql));
        let rows = stmt.query_map(rusqlite::params_from_iter(values), attempt_row)?;
        let attempts: Vec<AttemptRecord> = rows.collect::<Result<_, _>>()?;
        let mut named = self.conn.prepare_cached(
            "SELECT job_id FROM jobs WHERE runner_name = ?1 ORDER BY job_id DESC LIMIT 1",
        )?;
        let mut rerun = self
            .conn
            .prepare_cached("SELECT 1 FROM reruns WHERE job_id = ?1")?;
        let mut candidates = Vec::with_capacity(attempts.len());
        for mut attempt in attempts {
            if attempt.job_id.is_none() {
                attempt.job_id = named
                    .query_row([&attempt.runner_name], |row| row.get::<_, i64>(0))
                    .optional()?
                    .map(JobId::new);
            }
            let Some(job_id) = attempt.job_id else {
                continue;
            };
            if !rerun.exists([job_id.get()])? {
                candidates.push(attempt);
            }
        }
        Ok(candidates)
    }

    /// The job's re-run, if the agent journalled one (`explain`: it was re-run, and why).
    pub fn rerun_for_job(&self, job_id: JobId) -> Result<Option<RerunRecord>, JournalError> {
        Ok(crate::reruns::for_job(&self.conn, job_id)?)
    }

    /// How many re-runs are in each state (`status`).
    pub fn rerun_counts(&self) -> Result<RerunCounts, JournalError> {
        Ok(crate::reruns::counts(&self.conn)?)
    }

    /// `(policy, reason, state, count)` of every re-run journalled (`/metrics`).
    pub fn rerun_totals(&self) -> Result<Vec<(String, String, RerunState, u64)>, JournalError> {
        Ok(crate::reruns::totals(&self.conn)?)
    }

    /// The outcome of `PRAGMA integrity_check`: `["ok"]` for a sound file.
    pub fn integrity_check(&self) -> Result<Vec<String>, JournalError> {
        let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
        let rows = stmt.query_map([], |row| row.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// SQLite takes `-1` as "no limit".
/// When the newest delivery was journalled, on any connection (the reader's, the poller's).
pub(crate) fn last_delivery_at(conn: &Connection) -> Result<Option<UnixMs>, JournalError> {
    Ok(
        conn.query_row("SELECT MAX(received_at) FROM deliveries", [], |row| {
            row.get(0)
        })?,
    )
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(-1)
}

fn job_row(row: &Row<'_>) -> rusqlite::Result<JobRow> {
    let labels: String = row.get(5)?;
    Ok(JobRow {
        job_id: row.get(0)?,
        run_id: row.get(1)?,
        run_attempt: row.get(2)?,
        repository: row.get(3)?,
        installation_id: row.get(4)?,
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        state: crate::types::stored_job_state(&row.get::<_, String>(6)?),
        conclusion: row.get(7)?,
        runner_name: row.get(8)?,
        runner_id: row.get(9)?,
        workflow_name: row.get(10)?,
        job_name: row.get(11)?,
        source: row.get(12)?,
        first_seen_at_ms: row.get(13)?,
        updated_at_ms: row.get(14)?,
    })
}

fn delivery_row(row: &Row<'_>) -> rusqlite::Result<DeliveryRow> {
    let outcome: String = row.get(5)?;
    Ok(DeliveryRow {
        guid: row.get(0)?,
        event: row.get(1)?,
        action: row.get(2)?,
        source: row.get(3)?,
        received_at_ms: row.get(4)?,
        // The schema's CHECK constraint admits only known outcomes.
        outcome: Outcome::parse(&outcome).unwrap_or(Outcome::Rejected),
        reason: row.get(6)?,
        replayed_at_ms: row.get(7)?,
        body_kept: row.get(8)?,
    })
}

pub(crate) fn stored_delivery(
    conn: &Connection,
    guid: &str,
) -> Result<Option<StoredDelivery>, JournalError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {DELIVERY_COLUMNS}, headers, body FROM deliveries WHERE guid = ?1"
    ))?;
    let found = stmt
        .query_row([guid], |row| {
            let headers: String = row.get(9)?;
            Ok(StoredDelivery {
                row: delivery_row(row)?,
                headers: serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
                    &headers,
                )
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_owned()))
                .collect(),
                body: row
                    .get::<_, Option<Vec<u8>>>(10)?
                    .map(|stored| crate::body::decode(&stored))
                    .transpose()
                    .map_err(|err| {
                        rusqlite::Error::FromSqlConversionFailure(
                            10,
                            rusqlite::types::Type::Blob,
                            Box::new(err),
                        )
                    })?,
            })
        })
        .optional()?;
    Ok(found)
}
