//! GitHub's runner scale sets as this host's listener sees them (issue 29): the durable record
//! of every message taken from a scale set's queue, the jobs those messages describe, and the
//! listener's own state (the scale set's id, the session it holds, the message cursor, the last
//! statistics, a note for the operator).
//!
//! This module owns the tables `scale_sets`, `scale_set_messages` and `scale_set_jobs` and the
//! rules of their writes. A message is journalled with everything it changes in one
//! transaction, before the listener acknowledges it at GitHub: a crash before the commit loses
//! nothing (GitHub redelivers what was not acknowledged), and a crash after it makes the
//! redelivery [`MessageRecorded::AlreadyJournalled`]. Jobs move forward only
//! ([`ScaleSetJobState::moves`]), so events in any order end in the same state; an event that
//! cannot be handled is kept and never fails its message, so one bad event cannot block the
//! queue. What the listener decides (when to poll, when to give up a session) is
//! `rm_github::scaleset::listener`'s; the queue's token and JIT configurations never come here.
//!
//! A session is one per scale set per host, so this record is always in the host's own file,
//! never in a fleet's shared database: like [`crate::Attempts`], a handle with its own
//! synchronous write connection.

mod sql;
mod types;

use std::path::Path;

use rm_vocab::UnixMs;
use rusqlite::Connection;

pub use types::*;

use crate::{JournalError, connection};

/// The listener's handle on the scale-set record: its own write connection, opened with the
/// group writer's settings (WAL, `synchronous=FULL`, busy timeout), so a call that returns `Ok`
/// is on disk. Not shared between threads: wrap it in a mutex.
pub struct ScaleSets {
    conn: Connection,
}

impl ScaleSets {
    /// Opens (creating and migrating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<ScaleSets, JournalError> {
        Ok(ScaleSets {
            conn: connection::open_writer(path)?,
        })
    }

    /// Opens an existing journal read-only, for the readers (`status`): never creates or
    /// migrates it; its writes fail.
    pub fn open_read_only(path: &Path) -> Result<ScaleSets, JournalError> {
        Ok(ScaleSets {
            conn: connection::open_reader(path)?,
        })
    }

    /// Journals a message of `scale_set`'s queue and applies it, in one transaction; call it
    /// before acknowledging the message. A message of this scale set with this id already
    /// journalled (since the cursor was last reset) is [`MessageRecorded::AlreadyJournalled`]
    /// and changes nothing. Otherwise: the message's row (statistics, events as JSON, how many
    /// named no job, an unknown top-level type), each event applied to its job, forward only,
    /// the cursor moved to the highest id, and the statistics when GitHub sent any (a `null`
    /// keeps the last known).
    pub fn record_message(
        &self,
        scale_set: &str,
        message: &IncomingMessage,
    ) -> Result<MessageRecorded, JournalError> {
        sql::record_message(&self.conn, scale_set, message)
    }

    /// The statistics a session create (or refresh) returned: the starting state to scale on.
    pub fn record_statistics(
        &self,
        scale_set: &str,
        statistics: &ScaleSetStatistics,
        at: UnixMs,
    ) -> Result<(), JournalError> {
        sql::record_statistics(&self.conn, scale_set, statistics, at)
    }

    /// The session the listener holds on scale set `scale_set_id`, written before it is used so
    /// a crashed agent's successor can delete the stale session by id; `None` once closed.
    pub fn record_session(
        &self,
        scale_set: &str,
        scale_set_id: i64,
        session_id: Option<&str>,
        at: UnixMs,
    ) -> Result<(), JournalError> {
        sql::record_session(&self.conn, scale_set, scale_set_id, session_id, at)
    }

    /// The scale set was deleted at GitHub and re-created as `new_scale_set_id`: remember the
    /// id, start the cursor again at 0 and a new generation of message ids (the new set numbers
    /// its messages anew). A session recorded for the old id is forgotten. Jobs and messages
    /// stay, as history.
    pub fn reset_cursor(
        &self,
        scale_set: &str,
        new_scale_set_id: i64,
        at: UnixMs,
    ) -> Result<(), JournalError> {
        sql::reset_cursor(&self.conn, scale_set, new_scale_set_id, at)
    }

    /// One sentence for the operator about the scale set (e.g. "waiting: another listener holds
    /// the session"); `None` clears it.
    pub fn record_note(
        &self,
        scale_set: &str,
        note: Option<&str>,
        at: UnixMs,
    ) -> Result<(), JournalError> {
        sql::record_note(&self.conn, scale_set, note, at)
    }

    /// One scale set's record, if anything was ever recorded for it.
    pub fn get(&self, scale_set: &str) -> Result<Option<ScaleSetRecord>, JournalError> {
        sql::get(&self.conn, scale_set)
    }

    /// Every scale set's record, by name.
    pub fn all(&self) -> Result<Vec<ScaleSetRecord>, JournalError> {
        sql::all(&self.conn)
    }

    /// Jobs of one scale set or of all, the most recently changed first, at most `limit`.
    pub fn jobs(
        &self,
        scale_set: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ScaleSetJobRow>, JournalError> {
        sql::jobs(&self.conn, scale_set, limit)
    }

    /// One job by GitHub's `jobId`.
    pub fn job(&self, job_id: &str) -> Result<Option<ScaleSetJobRow>, JournalError> {
        sql::job(&self.conn, job_id)
    }
}
