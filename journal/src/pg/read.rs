//! Reads of the PostgreSQL journal: what the intake wrote, in the same row types as SQLite's
//! [`crate::Reader`] gives: the intake's rows, and the demand the executor of a fleet host reads
//! (queued jobs, the jobs its runners took).

use postgres::{Client, GenericClient, Row};
use rm_vocab::{JobId, RunnerId, UnixMs};

use crate::read::{DELIVERY_COLUMNS, JOB_COLUMNS};
use crate::{DeliveryRow, InstallationRow, JobRow, JournalError, Outcome, StoredDelivery};

/// What the server is told a reader's connection is (`pg_stat_activity`).
pub(crate) const READER_APPLICATION: &str = "rm-journal-reader";

/// A connection for reading the PostgreSQL journal. Its calls block: make them off the async
/// runtime (`spawn_blocking`, or a thread), as the sync client runs a runtime of its own.
pub struct PgReader {
    client: Client,
}

impl PgReader {
    /// Connects to `url`; refuses a database this build has not migrated to its version.
    pub fn connect(url: &str) -> Result<PgReader, JournalError> {
        Self::start(&super::writer::config(url, READER_APPLICATION)?)
    }

    /// As [`PgReader::connect`], to a configured target.
    pub fn open(target: &super::PgTarget) -> Result<PgReader, JournalError> {
        Self::start(&target.client_config(READER_APPLICATION))
    }

    pub(super) fn start(config: &super::tls::PgConnect) -> Result<PgReader, JournalError> {
        let mut client = config.connect()?;
        super::schema::require_current(&mut client)?;
        Ok(PgReader { client })
    }

    /// Jobs, most recently changed first, at most `limit`, as [`crate::Reader::jobs`].
    pub fn jobs(&mut self, limit: usize) -> Result<Vec<JobRow>, JournalError> {
        let rows = self.client.query(
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs ORDER BY updated_at DESC, job_id DESC LIMIT $1"
            ),
            &[&limit_param(limit)],
        )?;
        Ok(rows.iter().map(job_row).collect())
    }

    /// Deliveries, newest first, at most `limit`, as [`crate::Reader::deliveries`].
    pub fn deliveries(&mut self, limit: usize) -> Result<Vec<DeliveryRow>, JournalError> {
        let rows = self.client.query(
            &format!(
                "SELECT {DELIVERY_COLUMNS} FROM deliveries ORDER BY received_at DESC, id DESC LIMIT $1"
            ),
            &[&limit_param(limit)],
        )?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    /// One job by its `workflow_job.id`.
    pub fn job(&mut self, job_id: JobId) -> Result<Option<JobRow>, JournalError> {
        let row = self.client.query_opt(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = $1"),
            &[&job_id.get()],
        )?;
        Ok(row.as_ref().map(job_row))
    }

    /// Every queued job, oldest first: the fleet's demand, as [`crate::Reader::queued_jobs`]
    /// gives the host's.
    pub fn queued_jobs(&mut self) -> Result<Vec<JobRow>, JournalError> {
        queued_jobs(&mut self.client)
    }

    /// The jobs these runners took, as [`crate::Reader::jobs_for_runners`].
    pub fn jobs_for_runners(&mut self, runner_names: &[&str]) -> Result<Vec<JobRow>, JournalError> {
        jobs_for_runners(&mut self.client, runner_names)
    }

    /// The demand's two reads from one snapshot, as [`crate::Reader::demand`]: a read-only
    /// `REPEATABLE READ` transaction.
    pub fn demand(&mut self, runner_names: &[&str]) -> Result<crate::DemandView, JournalError> {
        let mut snapshot = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let view = crate::DemandView {
            queued: queued_jobs(&mut snapshot)?,
            naming: jobs_for_runners(&mut snapshot, runner_names)?,
        };
        snapshot.commit()?;
        Ok(view)
    }

    /// How many jobs are in each state, by state name.
    pub fn job_counts(&mut self) -> Result<Vec<(String, i64)>, JournalError> {
        let rows = self.client.query(
            "SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state",
            &[],
        )?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// How many deliveries have each outcome (`status`).
    pub fn delivery_outcome_counts(&mut self) -> Result<Vec<(String, i64)>, JournalError> {
        let rows = self.client.query(
            "SELECT outcome, COUNT(*) FROM deliveries GROUP BY outcome ORDER BY outcome",
            &[],
        )?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// When the newest delivery was journalled by any receiver, ms since the Unix epoch.
    pub fn last_delivery_at(&mut self) -> Result<Option<UnixMs>, JournalError> {
        Ok(self
            .client
            .query_one("SELECT MAX(received_at) FROM deliveries", &[])?
            .get::<_, Option<i64>>(0)
            .map(UnixMs::new))
    }

    /// How many deliveries the journal holds.
    pub fn delivery_count(&mut self) -> Result<i64, JournalError> {
        Ok(self
            .client
            .query_one("SELECT COUNT(*) FROM deliveries", &[])?
            .get(0))
    }

    /// Installations and the repositories in their scope.
    pub fn installations(&mut self) -> Result<Vec<InstallationRow>, JournalError> {
        let rows = self.client.query(
            "SELECT i.id, i.account, i.account_type, i.repository_selection, i.suspended,
                 i.removed,
                 COALESCE(ARRAY_AGG(r.full_name ORDER BY r.full_name)
                     FILTER (WHERE r.full_name IS NOT NULL), '{}')
             FROM installations i
             LEFT JOIN installation_repositories r ON r.installation_id = i.id
             GROUP BY i.id ORDER BY i.id",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|row| InstallationRow {
                id: row.get(0),
                account: row.get(1),
                account_type: row.get(2),
                repository_selection: row.get(3),
                suspended: row.get(4),
                removed: row.get(5),
                repositories: row.get(6),
            })
            .collect())
    }

    /// One delivery with its headers and body.
    pub fn delivery(&mut self, guid: &str) -> Result<Option<StoredDelivery>, JournalError> {
        stored_delivery(&mut self.client, guid, false)
    }
}

/// A `LIMIT` of `limit` rows; `NULL` (no limit) past what an `i64` holds.
fn limit_param(limit: usize) -> Option<i64> {
    i64::try_from(limit).ok()
}

/// One delivery with its headers and body, on a connection or inside a transaction; with
/// `for_update` the row is locked until the transaction ends (a replay, which rewrites it).
pub(super) fn stored_delivery(
    client: &mut impl GenericClient,
    guid: &str,
    for_update: bool,
) -> Result<Option<StoredDelivery>, JournalError> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let Some(row) = client.query_opt(
        &format!("SELECT {DELIVERY_COLUMNS}, headers, body FROM deliveries WHERE guid = $1{lock}"),
        &[&guid],
    )?
    else {
        return Ok(None);
    };
    let headers: String = row.get(9);
    let body = row
        .get::<_, Option<Vec<u8>>>(10)
        .map(|stored| crate::body::decode(&stored))
        .transpose()
        .map_err(|err| JournalError::Commit(format!("a stored body is damaged: {err}")))?;
    Ok(Some(StoredDelivery {
        row: delivery_row(&row),
        headers: serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&headers)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        body,
    }))
}

/// Every queued job, oldest first, on a connection or inside a transaction.
fn queued_jobs(client: &mut impl GenericClient) -> Result<Vec<JobRow>, JournalError> {
    let rows = client.query(
        &format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state = 'queued' ORDER BY first_seen_at, job_id"
        ),
        &[],
    )?;
    Ok(rows.iter().map(job_row).collect())
}

/// The jobs naming one of `runner_names`, on a connection or inside a transaction.
fn jobs_for_runners(
    client: &mut impl GenericClient,
    runner_names: &[&str],
) -> Result<Vec<JobRow>, JournalError> {
    let rows = client.query(
        &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE runner_name = ANY($1)"),
        &[&runner_names],
    )?;
    Ok(rows.iter().map(job_row).collect())
}

fn job_row(row: &Row) -> JobRow {
    let labels: String = row.get(5);
    JobRow {
        job_id: JobId::new(row.get(0)),
        run_id: row.get(1),
        run_attempt: row.get(2),
        repository: row.get(3),
        installation_id: row.get(4),
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        state: crate::types::stored_job_state(row.get(6)),
        conclusion: row.get(7),
        runner_name: row.get(8),
        runner_id: row.get::<_, Option<i64>>(9).map(RunnerId::new),
        workflow_name: row.get(10),
        job_name: row.get(11),
        source: row.get(12),
        first_seen_at_ms: UnixMs::new(row.get(13)),
        updated_at_ms: UnixMs::new(row.get(14)),
    }
}

fn delivery_row(row: &Row) -> DeliveryRow {
    let outcome: String = row.get(5);
    DeliveryRow {
        guid: row.get(0),
        event: row.get(1),
        action: row.get(2),
        source: row.get(3),
        received_at_ms: UnixMs::new(row.get(4)),
        // The schema's CHECK constraint admits only known outcomes.
        outcome: Outcome::parse(&outcome).unwrap_or(Outcome::Rejected),
        reason: row.get(6),
        replayed_at_ms: row.get::<_, Option<i64>>(7).map(UnixMs::new),
        body_kept: row.get(8),
    }
}
