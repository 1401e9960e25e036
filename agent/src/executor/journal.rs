//! The executor's journal seam: its own attempt-writer and reader connections, called only
//! through [`AttemptJournal::write`] and [`AttemptJournal::read`], which run the call on a
//! blocking thread. An attempt write is a synchronous SQLite commit (`synchronous=FULL`: an
//! fsync), and a tokio worker thread blocked on it would stall every other task on it (the
//! receiver's answers, the launches' GitHub calls); here only a blocking-pool thread waits.
//!
//! Jobs (the demand, and which job a runner took) are read from where the deliveries are
//! journalled ([`JobSource`]): this host's SQLite journal, or in a fleet the shared PostgreSQL
//! journal (CONTRACT §9). Attempts are always this host's: its processes, its runtimes.
//!
//! Nothing here decides anything: the rooms say what to write and when.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use rm_journal::{AttemptError, Attempts, JobRow, JournalError, PgReader, Reader};
use rm_vocab::UnixMs;

/// Where the executor reads jobs from.
#[derive(Debug, Clone)]
pub(super) enum JobSource {
    /// This host's journal file: the embedded default.
    Local,
    /// The fleet's PostgreSQL journal (`[journal] url`, its password kept apart).
    Fleet(Box<rm_journal::PgTarget>),
}

/// The executor's connections to the journal, shared by its loop and its launch tasks.
#[derive(Clone)]
pub(super) struct AttemptJournal {
    attempts: Arc<Mutex<Attempts>>,
    reader: Arc<Mutex<Reader>>,
    /// The fleet's reader, when jobs come from PostgreSQL.
    fleet: Option<Arc<Mutex<FleetReader>>>,
}

/// A PostgreSQL reader made again after its connection was lost (a server restart).
struct FleetReader {
    target: rm_journal::PgTarget,
    reader: Option<PgReader>,
}

impl Drop for FleetReader {
    fn drop(&mut self) {
        // A PostgreSQL client closes its connection on drop, which blocks and panics on a
        // runtime's worker (it runs a runtime of its own).
        if let Some(reader) = self.reader.take() {
            std::thread::spawn(move || drop(reader));
        }
    }
}

impl FleetReader {
    /// Runs `call` on the reader, connecting first if there is none; a failed call drops the
    /// connection, so the next one connects afresh.
    fn with<R>(
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

impl AttemptJournal {
    /// Opens the executor's own writer and reader on the journal file at `path`, and reads
    /// jobs from `jobs`.
    pub(super) fn open(path: &Path, jobs: &JobSource) -> anyhow::Result<AttemptJournal> {
        let attempts = Attempts::open(path)
            .with_context(|| format!("cannot open the journal {}", path.display()))?;
        let reader = Reader::open(path)
            .with_context(|| format!("cannot read the journal {}", path.display()))?;
        let fleet = match jobs {
            JobSource::Local => None,
            // Connected on first use: a database down at start is retried by every pass.
            JobSource::Fleet(target) => Some(Arc::new(Mutex::new(FleetReader {
                target: (**target).clone(),
                reader: None,
            }))),
        };
        Ok(AttemptJournal {
            attempts: Arc::new(Mutex::new(attempts)),
            reader: Arc::new(Mutex::new(reader)),
            fleet,
        })
    }

    /// The jobs that name one of these runners (their `in_progress` or `completed` sighting).
    pub(super) async fn jobs_for_runners(
        &self,
        names: Vec<String>,
    ) -> Result<Vec<JobRow>, AttemptError> {
        match &self.fleet {
            None => {
                self.read(move |reader| reader.jobs_for_runners(&as_strs(&names)))
                    .await
            }
            Some(fleet) => {
                on_fleet(fleet, move |reader| {
                    reader.jobs_for_runners(&as_strs(&names))
                })
                .await
            }
        }
    }

    /// The queued jobs and the jobs naming one of these runners, from one snapshot.
    pub(super) async fn demand(
        &self,
        names: Vec<String>,
    ) -> Result<rm_journal::DemandView, AttemptError> {
        match &self.fleet {
            None => {
                self.read(move |reader| reader.demand(&as_strs(&names)))
                    .await
            }
            Some(fleet) => on_fleet(fleet, move |reader| reader.demand(&as_strs(&names))).await,
        }
    }

    /// One job as the journal knows it (the re-run decision reads its state and run attempt).
    pub(super) async fn job(
        &self,
        job_id: rm_vocab::JobId,
    ) -> Result<Option<JobRow>, AttemptError> {
        match &self.fleet {
            None => self.read(move |reader| reader.job(job_id)).await,
            Some(fleet) => on_fleet(fleet, move |reader| reader.job(job_id)).await,
        }
    }

    /// Runs `call` on the attempt writer, on a blocking thread.
    pub(super) async fn write<R, F>(&self, call: F) -> Result<R, AttemptError>
    where
        F: FnOnce(&Attempts) -> Result<R, AttemptError> + Send + 'static,
        R: Send + 'static,
    {
        let attempts = Arc::clone(&self.attempts);
        let ran = tokio::task::spawn_blocking(move || {
            call(&attempts.lock().unwrap_or_else(PoisonError::into_inner))
        })
        .await;
        match ran {
            Ok(result) => result,
            Err(e) => Err(not_run(e)),
        }
    }

    /// Runs `call` on the reader, on a blocking thread.
    pub(super) async fn read<R, F>(&self, call: F) -> Result<R, AttemptError>
    where
        F: FnOnce(&Reader) -> Result<R, JournalError> + Send + 'static,
        R: Send + 'static,
    {
        let reader = Arc::clone(&self.reader);
        let ran = tokio::task::spawn_blocking(move || {
            call(&reader.lock().unwrap_or_else(PoisonError::into_inner))
        })
        .await;
        match ran {
            Ok(result) => result.map_err(AttemptError::from),
            Err(e) => Err(not_run(e)),
        }
    }
}

/// Runs `call` on the fleet's reader, on a blocking thread.
async fn on_fleet<R: Send + 'static>(
    fleet: &Arc<Mutex<FleetReader>>,
    call: impl FnOnce(&mut PgReader) -> Result<R, JournalError> + Send + 'static,
) -> Result<R, AttemptError> {
    let fleet = Arc::clone(fleet);
    blocking(move || {
        fleet
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .with(call)
    })
    .await
}

fn as_strs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// Runs a journal call on the blocking pool.
async fn blocking<R: Send + 'static>(
    call: impl FnOnce() -> Result<R, JournalError> + Send + 'static,
) -> Result<R, AttemptError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result.map_err(AttemptError::from),
        Err(e) => Err(not_run(e)),
    }
}

/// A blocking call that did not return: a panic in it is a bug and goes on unwinding here; a
/// call cancelled by the runtime's shutdown wrote nothing known.
fn not_run(e: tokio::task::JoinError) -> AttemptError {
    match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(e) => AttemptError::NotRun(e.to_string()),
    }
}

impl AttemptJournal {
    /// `jit_received → starting` with the process's identity and, where it can be read, this
    /// boot's id (so a pid from another boot is never taken for a process).
    pub(super) async fn started(
        &self,
        id: &rm_journal::AttemptId,
        identity: rm_runner::process::ProcessIdentity,
        at: UnixMs,
    ) -> Result<bool, AttemptError> {
        let id = id.clone();
        self.write(move |attempts| match rm_runner::process::boot_id() {
            Some(boot) => {
                attempts.started_on_boot(&id, identity.pid, identity.start_time, boot, at)
            }
            None => attempts.started(&id, identity.pid, identity.start_time, at),
        })
        .await
    }
}
