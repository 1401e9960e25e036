//! The executor's journal seam: its own attempt-writer and reader connections, called only
//! through [`AttemptJournal::write`] and [`AttemptJournal::read`], which run the call on a
//! blocking thread. An attempt write is a synchronous SQLite commit (`synchronous=FULL`: an
//! fsync), and a tokio worker thread blocked on it would stall every other task on it (the
//! receiver's answers, the launches' GitHub calls); here only a blocking-pool thread waits.
//!
//! Jobs (the demand, and which job a runner took) are read from where the store keeps them
//! ([`rm_journal::Store::jobs`]): this host's journal file, or in a fleet the shared journal
//! (CONTRACT §9). Attempts are always this host's: its processes, its runtimes.
//!
//! Nothing here decides anything: the rooms say what to write and when.

use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use rm_journal::{AttemptError, Attempts, JobReader, JobRow, JournalError, Reader, Store};
use rm_vocab::UnixMs;

/// The executor's connections to the journal, shared by its loop and its launch tasks.
#[derive(Clone)]
pub(super) struct AttemptJournal {
    attempts: Arc<Mutex<Attempts>>,
    reader: Arc<Mutex<Reader>>,
    /// The jobs, wherever the store keeps them.
    jobs: Arc<Mutex<JobReader>>,
}

impl AttemptJournal {
    /// Opens the executor's own writer and reader on the store's file, and its reader of jobs.
    pub(super) fn open(store: &Store) -> anyhow::Result<AttemptJournal> {
        let path = store.file();
        let attempts = store
            .attempts()
            .with_context(|| format!("cannot open the journal {}", path.display()))?;
        let reader = Reader::open(path)
            .with_context(|| format!("cannot read the journal {}", path.display()))?;
        // On a shared journal, connected on first use: a database down at start is retried
        // by every pass.
        let jobs = store
            .jobs()
            .with_context(|| format!("cannot read {}", store.describe()))?;
        Ok(AttemptJournal {
            attempts: Arc::new(Mutex::new(attempts)),
            reader: Arc::new(Mutex::new(reader)),
            jobs: Arc::new(Mutex::new(jobs)),
        })
    }

    /// The jobs that name one of these runners (their `in_progress` or `completed` sighting).
    pub(super) async fn jobs_for_runners(
        &self,
        names: Vec<String>,
    ) -> Result<Vec<JobRow>, AttemptError> {
        self.on_jobs(move |jobs| jobs.jobs_for_runners(&as_strs(&names)))
            .await
    }

    /// The queued jobs and the jobs naming one of these runners, from one snapshot.
    pub(super) async fn demand(
        &self,
        names: Vec<String>,
    ) -> Result<rm_journal::DemandView, AttemptError> {
        self.on_jobs(move |jobs| jobs.demand(&as_strs(&names)))
            .await
    }

    /// One job as the journal knows it (the re-run decision reads its state and run attempt).
    pub(super) async fn job(
        &self,
        job_id: rm_vocab::JobId,
    ) -> Result<Option<JobRow>, AttemptError> {
        self.on_jobs(move |jobs| jobs.job(job_id)).await
    }

    /// Runs `call` on the reader of jobs, on a blocking thread.
    async fn on_jobs<R: Send + 'static>(
        &self,
        call: impl FnOnce(&mut JobReader) -> Result<R, JournalError> + Send + 'static,
    ) -> Result<R, AttemptError> {
        let jobs = Arc::clone(&self.jobs);
        blocking(move || call(&mut jobs.lock().unwrap_or_else(PoisonError::into_inner))).await
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
