//! The polling fallback's journal on PostgreSQL ([`PgPollJournal`], behind
//! [`crate::PollStore`]): what the poller of each host in a fleet writes and reads in the shared
//! database. The same tables as SQLite's (`jobs`, `poll_cursors`, `redeliveries`, the
//! installations) and the same merge: a sighting goes through the intake's `apply_job`
//! (`rm_vocab::merge_job`, forward only), so a poll and a webhook for one job meet in one
//! place whichever arrives first.
//!
//! Several writers touch the job rows at once here (the intake writer of every receiver, the
//! poller of every host), so a group of sightings locks its rows in job-id order, as the intake
//! writer does with its verdicts: two writers that share jobs wait for each other instead of
//! deadlocking.

use std::collections::HashSet;

use postgres::Client;

use super::tls::PgConnect;
use rm_handlers::JobObservation;
use rm_vocab::{JobId, UnixMs};

use super::apply::{ApplyError, Sql, StatementCache, apply_job};
use crate::JournalError;
use crate::polls::{PollStore, QueuedJobRef, Sighting};

/// What the server is told a poller's connection is (`pg_stat_activity`).
const POLLS_APPLICATION: &str = "rm-journal-polls";

/// The poller's connection to the PostgreSQL journal. Its calls block: make them off the async
/// runtime (`spawn_blocking`, or a thread). A lost connection (a server restart) fails the call
/// that met it; the next call connects again.
pub struct PgPollJournal {
    config: PgConnect,
    /// `None` after the connection was lost.
    client: Option<Client>,
    /// The merge's statements, prepared once per connection.
    cache: StatementCache,
}

impl PgPollJournal {
    /// Connects to `url`; refuses a database this build has not migrated to its version (the
    /// journal's writer, [`crate::PgJournal::connect`], migrates).
    pub fn connect(url: &str) -> Result<PgPollJournal, JournalError> {
        let mut polls = PgPollJournal {
            config: super::writer::config(url, POLLS_APPLICATION)?,
            client: None,
            cache: StatementCache::default(),
        };
        polls.client()?;
        Ok(polls)
    }

    /// As [`PgPollJournal::connect`], to a configured target (its password from the
    /// environment).
    pub fn open(target: &super::PgTarget) -> Result<PgPollJournal, JournalError> {
        let mut polls = PgPollJournal {
            config: target.client_config(POLLS_APPLICATION),
            client: None,
            cache: StatementCache::default(),
        };
        polls.client()?;
        Ok(polls)
    }

    fn client(&mut self) -> Result<&mut Client, JournalError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let mut client = self.config.connect()?;
            super::schema::require_current(&mut client)?;
            self.cache.clear();
            self.client = Some(client);
        }
        // Set just above when it was missing.
        self.client.as_mut().ok_or(JournalError::WriterStopped)
    }

    /// Which of `keys` `sql` (one `= ANY($1)` parameter, answering the keys found) finds.
    fn present(&mut self, sql: &str, keys: &[&str]) -> Result<HashSet<String>, JournalError> {
        if keys.is_empty() {
            return Ok(HashSet::new());
        }
        let keys: Vec<&str> = keys.to_vec();
        Ok(self
            .client()?
            .query(sql, &[&keys])?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }
}

impl From<ApplyError> for JournalError {
    fn from(err: ApplyError) -> Self {
        match err {
            ApplyError::Postgres(err) => JournalError::Postgres(err),
            unsettled @ ApplyError::Unsettled(_) => JournalError::Commit(unsettled.to_string()),
        }
    }
}

fn queued_ref(row: &postgres::Row) -> QueuedJobRef {
    QueuedJobRef {
        job_id: JobId::new(row.get(0)),
        repository: row.get(1),
        updated_at_ms: UnixMs::new(row.get(2)),
        checked_at_ms: row.get::<_, Option<i64>>(3).map(UnixMs::new),
    }
}

impl PollStore for PgPollJournal {
    fn record_sightings(&mut self, jobs: &[JobObservation]) -> Result<Vec<Sighting>, JournalError> {
        // The rows are locked in job-id order (see the module's docs); the answer keeps the
        // caller's order.
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by_key(|&i| jobs[i].job_id);
        let mut answers: Vec<Option<Sighting>> = vec![None; jobs.len()];
        self.client()?;
        let PgPollJournal {
            client: Some(client),
            cache,
            ..
        } = self
        else {
            // Connected just above.
            return Err(JournalError::WriterStopped);
        };
        let mut tx = client.transaction()?;
        let mut sql = Sql { tx: &mut tx, cache };
        for i in order {
            let job = &jobs[i];
            let moved = apply_job(&mut sql, job)?.is_none();
            let row = sql.query_opt(
                "SELECT state, announced_at IS NOT NULL FROM jobs WHERE job_id = $1",
                &[&job.job_id.get()],
            )?;
            // The merge has just inserted or locked the row.
            let row = row.ok_or_else(|| {
                JournalError::Commit(format!("job {} vanished while merged", job.job_id))
            })?;
            answers[i] = Some(Sighting {
                job_id: job.job_id,
                moved,
                announced: row.get(1),
                state: crate::types::stored_job_state(row.get(0)),
            });
        }
        tx.commit()?;
        Ok(answers.into_iter().flatten().collect())
    }

    fn announced(&mut self, job_ids: &[JobId]) -> Result<HashSet<JobId>, JournalError> {
        if job_ids.is_empty() {
            return Ok(HashSet::new());
        }
        let ids = super::job_numbers(job_ids);
        Ok(self
            .client()?
            .query(
                "SELECT job_id FROM jobs WHERE job_id = ANY($1) AND announced_at IS NOT NULL",
                &[&ids],
            )?
            .iter()
            .map(|row| JobId::new(row.get(0)))
            .collect())
    }

    fn stale_queued(
        &mut self,
        queued_before_ms: UnixMs,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<QueuedJobRef>, JournalError> {
        Ok(self
            .client()?
            .query(
                "SELECT job_id, repository, updated_at, checked_at FROM jobs
                 WHERE state = 'queued' AND updated_at < $1
                   AND (checked_at IS NULL OR checked_at < $2)
                 ORDER BY checked_at IS NOT NULL, checked_at, updated_at, job_id",
                &[&queued_before_ms.get(), &checked_before_ms.get()],
            )?
            .iter()
            .map(queued_ref)
            .collect())
    }

    fn queued_in_repository(
        &mut self,
        repository: &str,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<(QueuedJobRef, i64)>, JournalError> {
        // GitHub's names are case-insensitive (SQLite compares them `COLLATE NOCASE`).
        Ok(self
            .client()?
            .query(
                "SELECT job_id, repository, updated_at, checked_at, run_id FROM jobs
                 WHERE state = 'queued' AND lower(repository) = lower($1)
                   AND (checked_at IS NULL OR checked_at < $2)
                 ORDER BY job_id",
                &[&repository, &checked_before_ms.get()],
            )?
            .iter()
            .map(|row| (queued_ref(row), row.get(4)))
            .collect())
    }

    fn mark_checked(&mut self, job_id: JobId, at_ms: UnixMs) -> Result<(), JournalError> {
        self.client()?.execute(
            "UPDATE jobs SET checked_at = $2 WHERE job_id = $1",
            &[&job_id.get(), &at_ms.get()],
        )?;
        Ok(())
    }

    fn last_delivery_at(&mut self) -> Result<Option<UnixMs>, JournalError> {
        Ok(self
            .client()?
            .query_one("SELECT MAX(received_at) FROM deliveries", &[])?
            .get::<_, Option<i64>>(0)
            .map(UnixMs::new))
    }

    fn known_guids(&mut self, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        self.present("SELECT guid FROM deliveries WHERE guid = ANY($1)", guids)
    }

    fn redelivered(&mut self, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        self.present("SELECT guid FROM redeliveries WHERE guid = ANY($1)", guids)
    }

    fn record_redelivery(
        &mut self,
        guid: &str,
        delivery_id: i64,
        at_ms: UnixMs,
    ) -> Result<bool, JournalError> {
        let inserted = self.client()?.execute(
            "INSERT INTO redeliveries (guid, delivery_id, requested_at) VALUES ($1, $2, $3)
             ON CONFLICT (guid) DO NOTHING",
            &[&guid, &delivery_id, &at_ms.get()],
        )?;
        Ok(inserted > 0)
    }

    fn cursor(&mut self, name: &str) -> Result<Option<i64>, JournalError> {
        Ok(self
            .client()?
            .query_opt("SELECT value FROM poll_cursors WHERE name = $1", &[&name])?
            .map(|row| row.get(0)))
    }

    fn set_cursor(&mut self, name: &str, value: i64, at_ms: UnixMs) -> Result<(), JournalError> {
        self.client()?.execute(
            "INSERT INTO poll_cursors (name, value, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value,
                 updated_at = excluded.updated_at",
            &[&name, &value, &at_ms.get()],
        )?;
        Ok(())
    }

    fn repositories_of(&mut self, account: &str) -> Result<Vec<String>, JournalError> {
        // Bytewise order, as SQLite's: whatever the database's collation.
        Ok(self
            .client()?
            .query(
                "SELECT r.full_name FROM installation_repositories r
                 JOIN installations i ON i.id = r.installation_id
                 WHERE lower(i.account) = lower($1) AND NOT i.removed
                 ORDER BY r.full_name COLLATE \"C\"",
                &[&account],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }

    fn unannounced_count(&mut self) -> Result<i64, JournalError> {
        Ok(self
            .client()?
            .query_one(
                "SELECT COUNT(*) FROM jobs WHERE announced_at IS NULL AND polled_at IS NOT NULL",
                &[],
            )?
            .get(0))
    }
}
