//! The group-commit writer: one thread owns the write connection. It takes every request that
//! queued up while the previous commit was in flight, commits them in one transaction, and only
//! then answers each caller, so throughput grows with load instead of collapsing to one fsync per
//! delivery, and a 2xx always means "on disk".

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use rm_handlers::Verdict;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::apply::apply_verdict;
use crate::checkpoint;
use crate::judged::{Judged, Stored};
use crate::metrics::JournalMetrics;
use crate::queue::{self, Queue, Request};
use crate::retention::{PRUNE_INTERVAL, Retention, prune_step};
use crate::sync::{self, Waiter};
use crate::{Incoming, JournalError, Outcome, Recorded, connection};

/// How long the writer sleeps when idle before it looks at retention again.
const IDLE_WAKEUP: Duration = Duration::from_secs(60);

/// The request's caller, to be told that its batch failed.
fn failed_waiter(request: Request) -> Waiter {
    match request {
        // The answer is never read: a failed waiter is only ever sent the error.
        Request::Record { reply, .. } => Waiter::Record(reply, Recorded::AlreadyJournalled),
        Request::Probe(reply) => Waiter::Probe(reply),
    }
}

/// A cheap, cloneable handle to the journal's writer thread.
#[derive(Clone)]
pub struct Journal {
    queue: Queue,
    path: Arc<PathBuf>,
    metrics: JournalMetrics,
    durable: tokio::sync::watch::Receiver<u64>,
    poisoned: Arc<sync::Poison>,
}

impl Journal {
    /// Opens (creating and migrating if needed) the journal file and starts its writer thread.
    /// The thread stops when the last handle is dropped, after answering everything queued.
    pub fn open(path: &Path, retention: Retention) -> Result<Journal, JournalError> {
        Self::open_with_sync(path, retention, sync::wal_sync(path))
    }

    /// [`Journal::open`] with the flush that makes committed groups durable given by the caller
    /// (tests hold it back or make it fail).
    pub(crate) fn open_with_sync(
        path: &Path,
        retention: Retention,
        flush: sync::SyncFn,
    ) -> Result<Journal, JournalError> {
        let conn = connection::open_group_writer(path)?;
        let (stop_checkpoints, checkpoints_stopped) = mpsc::channel();
        let restart = checkpoint::spawn(path, checkpoints_stopped)?;
        let (queue, rx) = Queue::new();
        let metrics = JournalMetrics::default();
        let poisoned = sync::Poison::new();
        let (durable_tx, durable) = tokio::sync::watch::channel(0);
        let syncer = sync::spawn(flush, poisoned.clone(), metrics.clone(), durable_tx)?;
        let writer = Writer {
            conn,
            syncer,
            poisoned: poisoned.clone(),
            retention,
            metrics: metrics.clone(),
            next_prune: Instant::now(),
            disk_full: false,
            restart,
            _stop_checkpoints: stop_checkpoints,
        };
        thread::Builder::new()
            .name("rm-journal-writer".to_owned())
            .spawn(move || writer.run(rx))
            .map_err(|e| JournalError::Commit(format!("cannot start the writer thread: {e}")))?;
        Ok(Journal {
            queue,
            path: Arc::new(path.to_owned()),
            metrics,
            durable,
            poisoned,
        })
    }

    /// Changes (to a count of durable groups) each time deliveries become durable: a consumer
    /// awaits `changed()` instead of polling the file.
    pub fn durable_groups(&self) -> tokio::sync::watch::Receiver<u64> {
        self.durable.clone()
    }

    /// Completes once the journal is poisoned (a flush of committed deliveries failed, so every
    /// later one is refused until the process restarts and SQLite recovers the file), with why.
    /// A long-running command waits for it to drain and exit, so its service manager restarts
    /// it instead of leaving it answering 503 forever. A full disk does not poison: deliveries
    /// are refused while it lasts and taken again once there is space.
    pub async fn poisoned(&self) -> String {
        self.poisoned.wait().await
    }

    /// Why the journal is poisoned, if it is.
    pub fn poison_reason(&self) -> Option<String> {
        self.poisoned.reason()
    }

    /// The file this journal writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The writer's metrics, for `/metrics`.
    pub fn metrics(&self) -> &JournalMetrics {
        &self.metrics
    }

    /// Records a judged delivery: its verdict's changes are applied in the same transaction
    /// that records the delivery. Returns once that transaction is committed (and, as every
    /// answer of this journal, flushed).
    pub async fn record_judged(&self, judged: Judged) -> Result<Recorded, JournalError> {
        self.queue.record(judged).await
    }

    /// Judges `incoming` here, on the caller's thread ([`Judged::of`]), and records it: for
    /// callers with small bodies of their own (the polling fallback's tests, the benches). The
    /// receiver judges first, off the async workers for a large body, and calls
    /// [`Journal::record_judged`].
    pub async fn record(&self, incoming: Incoming) -> Result<Recorded, JournalError> {
        self.record_judged(Judged::of(incoming)?).await
    }

    /// Succeeds when the writer is alive and can take the write lock.
    pub async fn probe(&self) -> Result<(), JournalError> {
        self.queue.probe().await
    }
}

struct Writer {
    conn: Connection,
    /// Where committed groups wait for their flush (see `sync`).
    syncer: mpsc::Sender<Vec<Waiter>>,
    /// Set by the sync thread when a flush failed: nothing more is written.
    poisoned: Arc<sync::Poison>,
    retention: Retention,
    metrics: JournalMetrics,
    next_prune: Instant,
    /// The last group could not be written for want of space (`SQLITE_FULL`). A full disk
    /// fails the commit, never the flush, so it does not poison the journal: the next group
    /// simply tries again. Meanwhile a probe also writes (one header page), so `/healthz` says
    /// 503 while the disk is full and 200 again once there is room, deliveries or not.
    disk_full: bool,
    /// Where the checkpoint thread asks the writer to start the WAL over.
    restart: Arc<checkpoint::Restart>,
    /// Dropped with the writer: the checkpoint thread then makes a last checkpoint and stops.
    _stop_checkpoints: mpsc::Sender<()>,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Request>) {
        loop {
            let first = match rx.recv_timeout(IDLE_WAKEUP) {
                Ok(request) => request,
                Err(RecvTimeoutError::Timeout) => {
                    self.maybe_prune();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            self.commit(queue::group(first, &rx));
            self.maybe_restart_wal();
            self.maybe_prune();
        }
        tracing::debug!("journal writer stopped");
    }

    /// Commits one batch and hands its callers to the sync thread, which answers them once the
    /// batch is on disk. A batch that fails to commit is answered with the error at once.
    fn commit(&mut self, batch: Vec<Request>) {
        let size = batch.len();
        if self.poisoned.is_set() {
            Waiter::fail_all(
                batch.into_iter().map(failed_waiter).collect(),
                sync::POISONED,
            );
            return;
        }
        let started = Instant::now();
        let result = self.write(&batch);
        self.metrics
            .observe_commit(started.elapsed(), size, result.is_ok());
        self.disk_full = result.as_ref().err().is_some_and(is_disk_full);
        match result {
            Ok(answers) => {
                let waiters: Vec<Waiter> = batch
                    .into_iter()
                    .zip(answers)
                    .map(|(request, answer)| match request {
                        Request::Record { reply, .. } => Waiter::Record(reply, answer),
                        Request::Probe(reply) => Waiter::Probe(reply),
                    })
                    .collect();
                if let Err(mpsc::SendError(waiters)) = self.syncer.send(waiters) {
                    Waiter::fail_all(waiters, "the journal's sync thread has stopped");
                }
            }
            Err(err) => {
                tracing::error!(error = %err, deliveries = size, "journal commit failed");
                let waiters = batch.into_iter().map(failed_waiter).collect();
                Waiter::fail_all(waiters, &err.to_string());
            }
        }
    }

    /// Writes a batch in one transaction; one answer per request, in order.
    fn write(&mut self, batch: &[Request]) -> rusqlite::Result<Vec<Recorded>> {
        let probe_writes = self.disk_full;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut answers = Vec::with_capacity(batch.len());
        for request in batch {
            let answer = match request {
                Request::Record {
                    incoming,
                    verdict,
                    stored,
                    ..
                } => record_one(&tx, incoming, verdict, stored)?,
                // Placeholder answer; a probe only needs the commit to succeed.
                Request::Probe(_) => {
                    if probe_writes {
                        touch_header(&tx)?;
                    }
                    Recorded::AlreadyJournalled
                }
            };
            answers.push(answer);
        }
        tx.commit()?;
        Ok(answers)
    }

    /// Finishes a checkpoint the checkpoint thread asked for, between two groups (the group just
    /// committed is already with the sync thread): as the only writer, this one completes, and
    /// the next transaction starts the WAL over without anyone waiting on a lock.
    fn maybe_restart_wal(&mut self) {
        // A poisoned journal copies nothing more anywhere.
        if !self.restart.take() || self.poisoned.is_set() {
            return;
        }
        let started = Instant::now();
        match checkpoint::checkpoint(&self.conn, "PASSIVE") {
            Ok(pass) if pass.complete => {
                tracing::debug!(frames = pass.frames, took = ?started.elapsed(), "WAL started over");
            }
            // A reader still on an older snapshot, or the checkpoint thread mid-pass: it asks
            // again after its next pass.
            Ok(pass) => tracing::debug!(frames = pass.frames, "WAL restart deferred"),
            Err(err) => tracing::debug!(error = %err, "WAL restart deferred"),
        }
    }

    fn maybe_prune(&mut self) {
        if Instant::now() < self.next_prune {
            return;
        }
        match prune_step(&mut self.conn, &self.retention, rm_vocab::now()) {
            // More to do: come back after the next batch, so pruning never holds deliveries up
            // for more than one small step.
            Ok(true) => {}
            Ok(false) => self.next_prune = Instant::now() + PRUNE_INTERVAL,
            Err(err) => {
                tracing::warn!(error = %err, "journal retention pass failed; retrying later");
                self.next_prune = Instant::now() + PRUNE_INTERVAL;
            }
        }
    }
}

/// Whether a commit failed because the disk is full.
fn is_disk_full(err: &rusqlite::Error) -> bool {
    matches!(err, rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull)
}

/// Rewrites the database header's `application_id` (unused by rm) with its own value: a write
/// of one page that changes nothing, so a probe's commit needs the space a delivery would.
fn touch_header(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let id: i64 = tx.pragma_query_value(None, "application_id", |row| row.get(0))?;
    tx.pragma_update(None, "application_id", id)
}

/// Records one delivery inside the batch's transaction. A GUID already in the journal (committed
/// earlier or earlier in this batch) is answered as such and not written again.
fn record_one(
    tx: &rusqlite::Transaction<'_>,
    incoming: &Incoming,
    verdict: &Verdict,
    stored: &Stored,
) -> rusqlite::Result<Recorded> {
    let known: Option<i64> = tx
        .prepare_cached("SELECT id FROM deliveries WHERE guid = ?1")?
        .query_row([&incoming.guid], |row| row.get(0))
        .optional()?;
    if known.is_some() {
        return Ok(Recorded::AlreadyJournalled);
    }
    // The changes run in a savepoint: if applying them fails, they are undone and the delivery
    // is still journalled, as rejected with the reason, so nothing GitHub sent is lost. The
    // savepoint statements are prepared once, not parsed again for every delivery.
    tx.prepare_cached("SAVEPOINT delivery")?.execute([])?;
    let applied = match apply_verdict(tx, verdict, incoming.received_at_ms) {
        Ok(applied) => {
            tx.prepare_cached("RELEASE delivery")?.execute([])?;
            Ok(applied)
        }
        Err(err) => {
            tx.prepare_cached("ROLLBACK TO delivery")?.execute([])?;
            tx.prepare_cached("RELEASE delivery")?.execute([])?;
            Err(err)
        }
    };
    let (outcome, reason) = match applied {
        Ok(applied) => (applied.outcome, applied.reason),
        Err(err) => (
            Outcome::Rejected,
            Some(format!("the journal could not apply this delivery: {err}")),
        ),
    };
    insert_delivery(
        tx,
        incoming,
        stored,
        verdict.action(),
        outcome,
        reason.as_deref(),
    )?;
    Ok(Recorded::New(outcome))
}

fn insert_delivery(
    conn: &Connection,
    incoming: &Incoming,
    stored: &Stored,
    action: Option<&str>,
    outcome: Outcome,
    reason: Option<&str>,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO deliveries (guid, event, action, source, received_at, headers, body,
             outcome, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        incoming.guid,
        incoming.event,
        action,
        incoming.source.as_str(),
        incoming.received_at_ms,
        stored.headers,
        stored.body,
        outcome.as_str(),
        reason,
    ])?;
    Ok(())
}
