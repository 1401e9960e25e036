//! Making committed groups durable, off the writer thread. The group writer commits with
//! `synchronous=NORMAL` (SQLite appends the group's WAL frames and does not wait for the disk);
//! this thread then `fdatasync`s the WAL and only after that answers the group's callers. While
//! it waits for the disk, the writer is already writing the next group, and every group that
//! committed meanwhile is made durable by the same flush. A 2xx still means "on disk": exactly
//! the guarantee of `synchronous=FULL`, without the writer idling through every flush (on this
//! project's virtual disk a flush under load takes about 4 ms, longer than writing a group).
//!
//! A failed flush leaves the file in an unknown state (the kernel may have dropped the dirty
//! pages), so it poisons the journal: every later delivery is refused until rm-agent restarts
//! and SQLite recovers the WAL.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Instant;

use tokio::sync::{oneshot, watch};

use crate::metrics::JournalMetrics;
use crate::{JournalError, Recorded};

/// Makes everything written to the WAL so far durable.
pub(crate) type SyncFn = Box<dyn FnMut() -> io::Result<()> + Send>;

/// A caller waiting for its group to be durable.
pub(crate) enum Waiter {
    Record(oneshot::Sender<Result<Recorded, JournalError>>, Recorded),
    Probe(oneshot::Sender<Result<(), JournalError>>),
}

impl Waiter {
    fn answer(self, result: Result<(), &JournalErrorText>) {
        match (self, result) {
            (Waiter::Record(reply, recorded), Ok(())) => {
                let _ = reply.send(Ok(recorded));
            }
            (Waiter::Probe(reply), Ok(())) => {
                let _ = reply.send(Ok(()));
            }
            (Waiter::Record(reply, _), Err(text)) => {
                let _ = reply.send(Err(JournalError::Commit(text.0.clone())));
            }
            (Waiter::Probe(reply), Err(text)) => {
                let _ = reply.send(Err(JournalError::Commit(text.0.clone())));
            }
        }
    }

    /// Answers every waiter with the same failure.
    pub(crate) fn fail_all(waiters: Vec<Waiter>, message: &str) {
        let text = JournalErrorText(message.to_owned());
        for waiter in waiters {
            waiter.answer(Err(&text));
        }
    }
}

/// An error message shared by every waiter of a failed flush.
struct JournalErrorText(String);

/// The `fdatasync` of the journal's WAL. The file is opened for each flush so it is always the
/// WAL the writer is appending to; fsync works on the file, whichever descriptor names it.
pub(crate) fn wal_sync(journal: &Path) -> SyncFn {
    let mut wal = journal.as_os_str().to_owned();
    wal.push("-wal");
    Box::new(move || std::fs::File::open(&wal)?.sync_data())
}

/// Starts the flush thread; returns where the writer sends each committed group's waiters. The
/// thread stops when the writer drops that sender, after answering everything sent to it.
pub(crate) fn spawn(
    sync: SyncFn,
    poisoned: Arc<AtomicBool>,
    metrics: JournalMetrics,
    durable: watch::Sender<u64>,
) -> Result<Sender<Vec<Waiter>>, JournalError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("rm-journal-sync".to_owned())
        .spawn(move || run(&rx, sync, &poisoned, &metrics, &durable))
        .map_err(|e| JournalError::Commit(format!("cannot start the sync thread: {e}")))?;
    Ok(tx)
}

fn run(
    rx: &Receiver<Vec<Waiter>>,
    mut sync: SyncFn,
    poisoned: &AtomicBool,
    metrics: &JournalMetrics,
    durable: &watch::Sender<u64>,
) {
    while let Ok(mut waiters) = rx.recv() {
        // Every group committed while the previous flush ran is covered by this one.
        while let Ok(more) = rx.try_recv() {
            waiters.extend(more);
        }
        if poisoned.load(Ordering::SeqCst) {
            Waiter::fail_all(waiters, POISONED);
            continue;
        }
        let started = Instant::now();
        let result = sync();
        metrics.observe_sync(started.elapsed(), result.is_ok());
        match result {
            Ok(()) => {
                for waiter in waiters {
                    waiter.answer(Ok(()));
                }
                // Wakes whoever consumes the journal (the agent's executor) without polling.
                durable.send_modify(|groups| *groups = groups.wrapping_add(1));
            }
            Err(err) => {
                poisoned.store(true, Ordering::SeqCst);
                tracing::error!(error = %err, "flushing the journal's WAL failed; refusing deliveries until rm-agent restarts");
                Waiter::fail_all(
                    waiters,
                    &format!("flushing the journal to disk failed ({err})"),
                );
            }
        }
    }
}

/// What every delivery is told once a flush has failed.
pub(crate) const POISONED: &str = "an earlier flush of the journal to disk failed; restart rm-agent so SQLite can recover the journal";
