//! What the polling fallback writes and reads: job sightings from GitHub's REST API (source
//! `poll`, merged forward only through the same code as a delivery's), the stale-job checks, the
//! position of the hook-delivery scan and the GUIDs asked to be redelivered.
//!
//! What the poller needs is one interface ([`PollStore`]) with two implementations: this SQLite
//! one ([`PollJournal`]) and the PostgreSQL one of a fleet ([`crate::PgPollJournal`]), over the
//! same tables and the same forward-only merge (`rm_vocab::merge_job`) as the deliveries', so
//! a sighting and a webhook for one job merge in one place whichever journal holds them.
//!
//! Like [`crate::Attempts`], [`PollJournal`] is the agent's own write connection (WAL,
//! `synchronous=FULL`, busy timeout), off the webhook hot path; SQLite serialises it with the
//! group writer, and every job write is the same compare-and-set on the state's rank, so neither
//! can move a row back.

use std::collections::HashSet;
use std::path::Path;

use rm_handlers::JobObservation;
use rm_vocab::{JobId, JobState};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::apply::apply_job;
use crate::{JournalError, connection};
use rm_vocab::UnixMs;

/// The `poll_cursors` name of the newest hook delivery the redelivery scan has judged.
pub const HOOK_DELIVERY_CURSOR: &str = "hook_deliveries";

/// What one polled sighting did to the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    pub job_id: JobId,
    /// The row was inserted or moved forward: the poll knew something the journal did not.
    pub moved: bool,
    /// A delivery (webhook, relay or redelivery) has mentioned this job.
    pub announced: bool,
    /// The row's state after the merge.
    pub state: JobState,
}

/// A job the journal holds as `queued`, as a stale-job check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedJobRef {
    pub job_id: JobId,
    /// `owner/name`.
    pub repository: String,
    /// When it entered `queued` in the journal.
    pub updated_at_ms: rm_vocab::UnixMs,
    /// When a stale check last asked GitHub about it.
    pub checked_at_ms: Option<rm_vocab::UnixMs>,
}

/// What the polling fallback writes and reads, whichever journal holds it. Every call blocks
/// (a SQLite commit, a PostgreSQL round trip): make them off the async runtime
/// (`spawn_blocking`), as the PostgreSQL client cannot run on a runtime's worker at all.
pub trait PollStore: Send {
    /// Merges polled sightings in one transaction, each forward only, and reports what each
    /// did, in the order given.
    fn record_sightings(&mut self, jobs: &[JobObservation]) -> Result<Vec<Sighting>, JournalError>;
    /// Which of `job_ids` a delivery has announced by now.
    fn announced(&mut self, job_ids: &[JobId]) -> Result<HashSet<JobId>, JournalError>;
    /// Jobs `queued` since before `queued_before_ms` and not checked since `checked_before_ms`,
    /// never-checked first, then the longest-unchecked.
    fn stale_queued(
        &mut self,
        queued_before_ms: UnixMs,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<QueuedJobRef>, JournalError>;
    /// Jobs of `repository` (any case) held as `queued`, with their run, not checked since
    /// `checked_before_ms`.
    fn queued_in_repository(
        &mut self,
        repository: &str,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<(QueuedJobRef, i64)>, JournalError>;
    /// Dates a stale check of `job_id`.
    fn mark_checked(&mut self, job_id: JobId, at_ms: UnixMs) -> Result<(), JournalError>;
    /// When the newest delivery was journalled (any intake, any receiver).
    fn last_delivery_at(&mut self) -> Result<Option<UnixMs>, JournalError>;
    /// Which of `guids` the journal holds as deliveries.
    fn known_guids(&mut self, guids: &[&str]) -> Result<HashSet<String>, JournalError>;
    /// Which of `guids` have been asked to be redelivered already.
    fn redelivered(&mut self, guids: &[&str]) -> Result<HashSet<String>, JournalError>;
    /// Records that `guid` was asked for again; `false` when it had been already.
    fn record_redelivery(
        &mut self,
        guid: &str,
        delivery_id: i64,
        at_ms: UnixMs,
    ) -> Result<bool, JournalError>;
    /// A named position ([`HOOK_DELIVERY_CURSOR`]).
    fn cursor(&mut self, name: &str) -> Result<Option<i64>, JournalError>;
    fn set_cursor(&mut self, name: &str, value: i64, at_ms: UnixMs) -> Result<(), JournalError>;
    /// The repositories (`owner/name`, sorted bytewise) of the live installations on `account`
    /// (any case).
    fn repositories_of(&mut self, account: &str) -> Result<Vec<String>, JournalError>;
    /// How many jobs a poll found that no delivery has announced (`status`).
    fn unannounced_count(&mut self) -> Result<i64, JournalError>;
}

/// The polling fallback's handle on the SQLite journal. Not shared between threads: wrap it in a
/// mutex.
pub struct PollJournal {
    conn: Connection,
}

impl PollJournal {
    /// Opens (creating and migrating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<PollJournal, JournalError> {
        Ok(PollJournal {
            conn: connection::open_writer(path)?,
        })
    }

    /// Merges polled sightings in one transaction, each forward only, and reports what each did.
    pub fn record_sightings(
        &mut self,
        jobs: &[JobObservation],
    ) -> Result<Vec<Sighting>, JournalError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            let moved = apply_job(&tx, job)?.is_none();
            let (state, announced): (String, Option<i64>) = tx
                .prepare_cached("SELECT state, announced_at FROM jobs WHERE job_id = ?1")?
                .query_row([job.job_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
            out.push(Sighting {
                job_id: job.job_id,
                moved,
                announced: announced.is_some(),
                state: crate::types::stored_job_state(&state),
            });
        }
        tx.commit()?;
        Ok(out)
    }

    /// Which of `job_ids` a delivery has announced by now.
    pub fn announced(&self, job_ids: &[JobId]) -> Result<HashSet<JobId>, JournalError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT 1 FROM jobs WHERE job_id = ?1 AND announced_at IS NOT NULL")?;
        let mut out = HashSet::new();
        for id in job_ids {
            if stmt.exists([id])? {
                out.insert(*id);
            }
        }
        Ok(out)
    }

    /// Jobs `queued` since before `queued_before_ms` and not checked since `checked_before_ms`,
    /// never-checked first, then the longest-unchecked.
    pub fn stale_queued(
        &self,
        queued_before_ms: UnixMs,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<QueuedJobRef>, JournalError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT job_id, repository, updated_at, checked_at FROM jobs
             WHERE state = 'queued' AND updated_at < ?1
               AND (checked_at IS NULL OR checked_at < ?2)
             ORDER BY checked_at IS NOT NULL, checked_at, updated_at, job_id",
        )?;
        let rows = stmt.query_map(params![queued_before_ms, checked_before_ms], |row| {
            Ok(QueuedJobRef {
                job_id: row.get(0)?,
                repository: row.get(1)?,
                updated_at_ms: row.get(2)?,
                checked_at_ms: row.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Jobs of `repository` the journal holds as `queued`, with their run, not checked since
    /// `checked_before_ms`: a poll compares them with the runs GitHub still lists.
    pub fn queued_in_repository(
        &self,
        repository: &str,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<(QueuedJobRef, i64)>, JournalError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT job_id, repository, updated_at, checked_at, run_id FROM jobs
             WHERE state = 'queued' AND repository = ?1 COLLATE NOCASE
               AND (checked_at IS NULL OR checked_at < ?2)
             ORDER BY job_id",
        )?;
        let rows = stmt.query_map(params![repository, checked_before_ms], |row| {
            Ok((
                QueuedJobRef {
                    job_id: row.get(0)?,
                    repository: row.get(1)?,
                    updated_at_ms: row.get(2)?,
                    checked_at_ms: row.get(3)?,
                },
                row.get(4)?,
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Dates a stale check of `job_id`.
    pub fn mark_checked(&self, job_id: JobId, at_ms: UnixMs) -> Result<(), JournalError> {
        self.conn
            .prepare_cached("UPDATE jobs SET checked_at = ?2 WHERE job_id = ?1")?
            .execute(params![job_id, at_ms])?;
        Ok(())
    }

    /// When the newest delivery was journalled (any intake), ms since the Unix epoch.
    pub fn last_delivery_at(&self) -> Result<Option<UnixMs>, JournalError> {
        crate::read::last_delivery_at(&self.conn)
    }

    /// Which of `guids` the journal holds as deliveries.
    pub fn known_guids(&self, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        self.present("SELECT 1 FROM deliveries WHERE guid = ?1", guids)
    }

    /// Which of `guids` the agent has already asked GitHub to redeliver.
    pub fn redelivered(&self, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        self.present("SELECT 1 FROM redeliveries WHERE guid = ?1", guids)
    }

    fn present(&self, sql: &str, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut out = HashSet::new();
        for guid in guids {
            if stmt.exists([guid])? {
                out.insert((*guid).to_owned());
            }
        }
        Ok(out)
    }

    /// Records that `guid` was asked for again through hook delivery `delivery_id`. `false` when
    /// it had been already.
    pub fn record_redelivery(
        &self,
        guid: &str,
        delivery_id: i64,
        at_ms: UnixMs,
    ) -> Result<bool, JournalError> {
        let n = self
            .conn
            .prepare_cached(
                "INSERT INTO redeliveries (guid, delivery_id, requested_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (guid) DO NOTHING",
            )?
            .execute(params![guid, delivery_id, at_ms])?;
        Ok(n > 0)
    }

    /// A named position ([`HOOK_DELIVERY_CURSOR`]).
    pub fn cursor(&self, name: &str) -> Result<Option<i64>, JournalError> {
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM poll_cursors WHERE name = ?1")?
            .query_row([name], |row| row.get(0))
            .optional()?)
    }

    pub fn set_cursor(&self, name: &str, value: i64, at_ms: UnixMs) -> Result<(), JournalError> {
        self.conn
            .prepare_cached(
                "INSERT INTO poll_cursors (name, value, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value,
                     updated_at = excluded.updated_at",
            )?
            .execute(params![name, value, at_ms])?;
        Ok(())
    }

    /// The repositories (`owner/name`, sorted) of the live installations on `account`, as the
    /// `installation` and `installation_repositories` deliveries left them.
    pub fn repositories_of(&self, account: &str) -> Result<Vec<String>, JournalError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT r.full_name FROM installation_repositories r
             JOIN installations i ON i.id = r.installation_id
             WHERE i.account = ?1 COLLATE NOCASE AND i.removed = 0
             ORDER BY r.full_name",
        )?;
        let rows = stmt.query_map([account], |row| row.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many jobs a poll found that no delivery has announced (`status`).
    pub fn unannounced_count(&self) -> Result<i64, JournalError> {
        Ok(self.conn.query_row(
            "SELECT COUNT(*) FROM jobs WHERE announced_at IS NULL AND polled_at IS NOT NULL",
            [],
            |row| row.get(0),
        )?)
    }
}

impl PollStore for PollJournal {
    fn record_sightings(&mut self, jobs: &[JobObservation]) -> Result<Vec<Sighting>, JournalError> {
        PollJournal::record_sightings(self, jobs)
    }
    fn announced(&mut self, job_ids: &[JobId]) -> Result<HashSet<JobId>, JournalError> {
        PollJournal::announced(self, job_ids)
    }
    fn stale_queued(
        &mut self,
        queued_before_ms: UnixMs,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<QueuedJobRef>, JournalError> {
        PollJournal::stale_queued(self, queued_before_ms, checked_before_ms)
    }
    fn queued_in_repository(
        &mut self,
        repository: &str,
        checked_before_ms: UnixMs,
    ) -> Result<Vec<(QueuedJobRef, i64)>, JournalError> {
        PollJournal::queued_in_repository(self, repository, checked_before_ms)
    }
    fn mark_checked(&mut self, job_id: JobId, at_ms: UnixMs) -> Result<(), JournalError> {
        PollJournal::mark_checked(self, job_id, at_ms)
    }
    fn last_delivery_at(&mut self) -> Result<Option<UnixMs>, JournalError> {
        PollJournal::last_delivery_at(self)
    }
    fn known_guids(&mut self, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        PollJournal::known_guids(self, guids)
    }
    fn redelivered(&mut self, guids: &[&str]) -> Result<HashSet<String>, JournalError> {
        PollJournal::redelivered(self, guids)
    }
    fn record_redelivery(
        &mut self,
        guid: &str,
        delivery_id: i64,
        at_ms: UnixMs,
    ) -> Result<bool, JournalError> {
        PollJournal::record_redelivery(self, guid, delivery_id, at_ms)
    }
    fn cursor(&mut self, name: &str) -> Result<Option<i64>, JournalError> {
        PollJournal::cursor(self, name)
    }
    fn set_cursor(&mut self, name: &str, value: i64, at_ms: UnixMs) -> Result<(), JournalError> {
        PollJournal::set_cursor(self, name, value, at_ms)
    }
    fn repositories_of(&mut self, account: &str) -> Result<Vec<String>, JournalError> {
        PollJournal::repositories_of(self, account)
    }
    fn unannounced_count(&mut self) -> Result<i64, JournalError> {
        PollJournal::unannounced_count(self)
    }
}

#[cfg(test)]
mod tests;
