//! One store: where the journal is, and the handles every part of the agent takes on it. A
//! host's journal is its SQLite file; in a fleet (CONTRACT §9, `journal.url`) the deliveries,
//! jobs, polls and the fleet's claims are in the shared database and the host's own runners
//! stay in its file. Which dialect answers is decided here, once, by how the store was made
//! ([`Store::open`]): the agent asks for what it needs (the jobs, the poll store, the fleet,
//! its attempts, a replay, the fleet's intake) and never names a dialect. The shared database
//! exists only in a build with the `postgres` feature; without it a `journal.url` is refused
//! where it is parsed ([`crate::PgUrlError::NotBuilt`]), so no store here can name one.
//!
//! Everything here blocks (a SQLite commit, a PostgreSQL round trip): call it off the async
//! workers.

use std::path::{Path, PathBuf};

use rm_vocab::{JobId, UnixMs};

use crate::{
    Attempts, DeliveryRow, DemandView, Fleet, InstallationRow, JobRow, JournalError, LocalFleet,
    Outcome, PgJournal, PgTarget, PollJournal, PollStore, Reader, ScaleSets, StoredDelivery,
};

/// Where the journal is: this host's file, and the fleet's database when there is one.
#[derive(Debug, Clone)]
pub struct Store {
    /// This host's journal file: its runners (attempts), and everything else when alone.
    file: PathBuf,
    /// The fleet's shared journal: deliveries, jobs, polls, claims and leases.
    shared: Option<Box<PgTarget>>,
}

impl Store {
    /// The store at `file`, with the fleet's database `shared` when `journal.url` names one.
    /// Connects to nothing: each handle connects when it is made or first used.
    pub fn open(file: PathBuf, shared: Option<PgTarget>) -> Store {
        Store {
            file,
            shared: shared.map(Box::new),
        }
    }

    /// This host's journal file (its runners are always here).
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Whether jobs and deliveries are in a database the fleet shares.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Where jobs and deliveries are, for messages: never a password.
    pub fn describe(&self) -> String {
        match &self.shared {
            Some(target) => format!("the fleet's journal ({})", target.describe()),
            None => format!("the journal {}", self.file.display()),
        }
    }

    /// This host's runner attempts: always its own file, in a fleet too (its processes, its
    /// runtimes). A writer of its own, each transition a synchronous commit.
    pub fn attempts(&self) -> Result<Attempts, JournalError> {
        Attempts::open(&self.file)
    }

    /// This host's record of GitHub's runner scale sets: always its own file, in a fleet too
    /// (one message session per scale set per host). A writer of its own, each message a
    /// synchronous commit made before the message is acknowledged.
    pub fn scale_sets(&self) -> Result<ScaleSets, JournalError> {
        ScaleSets::open(&self.file)
    }

    /// A reader of jobs and deliveries. On the file it opens now (an `Err` when the file cannot
    /// be read); on the shared database it connects on first use and again after a failed
    /// call, so a database down at start, or restarted since, is tried again by the next one.
    pub fn jobs(&self) -> Result<JobReader, JournalError> {
        Ok(JobReader {
            at: match &self.shared {
                None => At::File(Reader::open(&self.file)?),
                Some(target) => At::shared(target),
            },
        })
    }

    /// What the polling fallback writes and reads, on its own connection.
    pub fn polls(&self) -> Result<Box<dyn PollStore + Send>, JournalError> {
        match &self.shared {
            None => Ok(Box::new(PollJournal::open(&self.file)?)),
            Some(target) => shared::polls(target),
        }
    }

    /// The fleet's claims, host leases and leader leases, on their own connection. Alone, the
    /// same rules on the file: a fleet of one host.
    pub fn fleet(&self) -> Result<Box<dyn Fleet + Send>, JournalError> {
        match &self.shared {
            None => Ok(Box::new(LocalFleet::open(&self.file)?)),
            Some(target) => shared::fleet(target),
        }
    }

    /// The fleet's intake (`rm-agent receive` with `journal.url`): connects, migrates the
    /// database to this build's schema and starts its writer; `None` when the store is this
    /// host's file alone (whose intake is [`crate::Journal`], with the data directory's lock).
    pub fn shared_intake(&self) -> Option<Result<PgJournal, JournalError>> {
        self.shared.as_deref().map(shared::intake)
    }

    /// Runs the delivery `guid`'s handler again and applies its verdict
    /// (`rm-agent deliveries replay`); its new outcome and reason.
    pub fn replay(
        &self,
        guid: &str,
        now: UnixMs,
    ) -> Result<(Outcome, Option<String>), JournalError> {
        match &self.shared {
            None => crate::replay(&self.file, guid, now),
            Some(target) => shared::replay(target, guid, now),
        }
    }
}

/// Reads jobs and deliveries wherever the store keeps them.
pub struct JobReader {
    at: At,
}

enum At {
    File(Reader),
    #[cfg(feature = "postgres")]
    Shared(Box<shared::Reconnecting>),
}

impl At {
    #[cfg(feature = "postgres")]
    fn shared(target: &PgTarget) -> At {
        At::Shared(Box::new(shared::Reconnecting::new(target.clone())))
    }

    #[cfg(not(feature = "postgres"))]
    fn shared(target: &PgTarget) -> At {
        target.unbuilt()
    }
}

/// One read, said once for both dialects: `$read` is the same call on a [`Reader`] and a
/// `PgReader`.
macro_rules! read {
    ($self:ident, |$reader:ident| $read:expr) => {
        match &mut $self.at {
            At::File($reader) => $read,
            #[cfg(feature = "postgres")]
            At::Shared(shared) => shared.with(|$reader| $read),
        }
    };
}

impl JobReader {
    /// Jobs, most recently changed first, at most `limit`.
    pub fn jobs(&mut self, limit: usize) -> Result<Vec<JobRow>, JournalError> {
        read!(self, |reader| reader.jobs(limit))
    }

    /// One job by its `workflow_job.id`.
    pub fn job(&mut self, job_id: JobId) -> Result<Option<JobRow>, JournalError> {
        read!(self, |reader| reader.job(job_id))
    }

    /// Every job in state `queued`, oldest sighting first.
    pub fn queued_jobs(&mut self) -> Result<Vec<JobRow>, JournalError> {
        read!(self, |reader| reader.queued_jobs())
    }

    /// The jobs that name one of these runners (their `in_progress` or `completed` sighting).
    pub fn jobs_for_runners(&mut self, names: &[&str]) -> Result<Vec<JobRow>, JournalError> {
        read!(self, |reader| reader.jobs_for_runners(names))
    }

    /// The queued jobs and the jobs naming one of these runners, from one snapshot.
    pub fn demand(&mut self, names: &[&str]) -> Result<DemandView, JournalError> {
        read!(self, |reader| reader.demand(names))
    }

    /// Jobs by state.
    pub fn job_counts(&mut self) -> Result<Vec<(String, i64)>, JournalError> {
        read!(self, |reader| reader.job_counts())
    }

    /// Deliveries, newest first, at most `limit`.
    pub fn deliveries(&mut self, limit: usize) -> Result<Vec<DeliveryRow>, JournalError> {
        read!(self, |reader| reader.deliveries(limit))
    }

    /// One delivery with its body, when it is still kept.
    pub fn delivery(&mut self, guid: &str) -> Result<Option<StoredDelivery>, JournalError> {
        read!(self, |reader| reader.delivery(guid))
    }

    /// How many deliveries are journalled.
    pub fn delivery_count(&mut self) -> Result<i64, JournalError> {
        read!(self, |reader| reader.delivery_count())
    }

    /// Deliveries by outcome.
    pub fn delivery_outcome_counts(&mut self) -> Result<Vec<(String, i64)>, JournalError> {
        read!(self, |reader| reader.delivery_outcome_counts())
    }

    /// When the newest delivery was journalled.
    pub fn last_delivery_at(&mut self) -> Result<Option<UnixMs>, JournalError> {
        read!(self, |reader| reader.last_delivery_at())
    }

    /// The App's installations with their repository scope.
    pub fn installations(&mut self) -> Result<Vec<InstallationRow>, JournalError> {
        read!(self, |reader| reader.installations())
    }
}

/// The shared database's handles, in a build with PostgreSQL.
#[cfg(feature = "postgres")]
mod shared {
    use super::*;
    use crate::{PgFleet, PgPollJournal, PgReader};

    pub(super) fn polls(target: &PgTarget) -> Result<Box<dyn PollStore + Send>, JournalError> {
        Ok(Box::new(PgPollJournal::open(target)?))
    }

    pub(super) fn intake(target: &PgTarget) -> Result<PgJournal, JournalError> {
        PgJournal::open(target)
    }

    pub(super) fn fleet(target: &PgTarget) -> Result<Box<dyn Fleet + Send>, JournalError> {
        Ok(Box::new(PgFleet::open(target)?))
    }

    pub(super) fn replay(
        target: &PgTarget,
        guid: &str,
        now: UnixMs,
    ) -> Result<(Outcome, Option<String>), JournalError> {
        crate::replay_pg(target, guid, now)
    }

    /// A reader connected on first use and again after a failed call (the server restarted).
    pub(super) struct Reconnecting {
        target: PgTarget,
        reader: Option<PgReader>,
    }

    impl Reconnecting {
        pub(super) fn new(target: PgTarget) -> Reconnecting {
            Reconnecting {
                target,
                reader: None,
            }
        }

        pub(super) fn with<R>(
            &mut self,
            call: impl FnOnce(&mut PgReader) -> Result<R, JournalError>,
        ) -> Result<R, JournalError> {
            let reader = match &mut self.reader {
                Some(reader) => reader,
                None => self.reader.insert(PgReader::open(&self.target)?),
            };
            let result = call(reader);
            if result.is_err() {
                self.reader = None;
            }
            result
        }
    }

    impl Drop for Reconnecting {
        fn drop(&mut self) {
            // The sync client closes its connection on drop, which blocks and panics on an
            // async runtime's worker (it runs a runtime of its own): the last holder may be one.
            if let Some(reader) = self.reader.take() {
                std::thread::spawn(move || drop(reader));
            }
        }
    }
}

/// In a build without PostgreSQL no [`PgTarget`] exists, so none of these is ever called.
#[cfg(not(feature = "postgres"))]
mod shared {
    use super::*;

    pub(super) fn polls(target: &PgTarget) -> Result<Box<dyn PollStore + Send>, JournalError> {
        target.unbuilt()
    }

    pub(super) fn intake(target: &PgTarget) -> Result<PgJournal, JournalError> {
        target.unbuilt()
    }

    pub(super) fn fleet(target: &PgTarget) -> Result<Box<dyn Fleet + Send>, JournalError> {
        target.unbuilt()
    }

    pub(super) fn replay(
        target: &PgTarget,
        _guid: &str,
        _now: UnixMs,
    ) -> Result<(Outcome, Option<String>), JournalError> {
        target.unbuilt()
    }
}
