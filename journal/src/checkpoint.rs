//! WAL checkpoints, off the commit path. SQLite's automatic checkpoint runs inside the commit that
//! crosses its threshold, so one unlucky group of deliveries would wait for pages to be copied
//! into the database file and for that file's fsync. Here a second connection copies the WAL
//! back in the background (`PASSIVE`: it never blocks the writer).
//!
//! Under a steady stream of commits a background checkpoint never catches the WAL's last frame,
//! so SQLite never starts the WAL over and it grows. Bringing it back must not block the writer:
//! a `TRUNCATE` from this thread takes the write lock, and the writer, refused, sleeps in
//! SQLite's busy handler, whose steps (1, 2, 5, 10, 15, 20, 25 ms ...) turned each truncation into
//! a 50-100 ms stall of every delivery in flight (the benchmark's p99.9; docs/performance.md).
//! Instead, once the WAL is long, this thread catches up once more and asks the writer (see
//! [`Restart`]) to finish the checkpoint itself between two groups: the writer is the only one
//! who writes, so its checkpoint copies the last few frames and completes, and its next
//! transaction starts the WAL over from its beginning. The file keeps its length and is
//! overwritten in place (which is also what keeps its flushes cheap: no size change to journal),
//! and is truncated only when the journal closes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use rusqlite::Connection;

use crate::JournalError;
use crate::connection;

/// How often the background checkpoint runs.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// A WAL longer than this many frames (64 MiB of 4 KiB pages) is started over (the writer
/// finishes a checkpoint), so a sustained burst cannot grow it without bound.
const RESTART_ABOVE_FRAMES: i64 = 16 * 1024;

/// Set by the checkpoint thread when the WAL should start over; taken by the writer between
/// groups, which then finishes the checkpoint on its own connection.
#[derive(Debug, Default)]
pub(crate) struct Restart(AtomicBool);

impl Restart {
    /// Whether a restart was asked for since the last call; clears the request.
    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }

    fn ask(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What the checkpoint thread does after a background pass that left the WAL `frames` long.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Nothing until the next interval.
    Wait,
    /// Catch up once more, then ask the writer to finish the checkpoint.
    AskWriter,
}

fn next(frames: i64) -> Next {
    if frames > RESTART_ABOVE_FRAMES {
        Next::AskWriter
    } else {
        Next::Wait
    }
}

/// Starts the checkpoint thread; returns the flag through which it asks the writer to start the
/// WAL over. It stops, after a last checkpoint, when `stop`'s sender (held by the writer thread)
/// is dropped.
pub(crate) fn spawn(path: &Path, stop: Receiver<()>) -> Result<Arc<Restart>, JournalError> {
    let conn = connection::open_checkpointer(path)?;
    let restart = Arc::new(Restart::default());
    let asks = Arc::clone(&restart);
    std::thread::Builder::new()
        .name("rm-journal-checkpoint".to_owned())
        .spawn(move || run(&conn, &stop, &asks))
        .map_err(|e| JournalError::Commit(format!("cannot start the checkpoint thread: {e}")))?;
    Ok(restart)
}

fn run(conn: &Connection, stop: &Receiver<()>, restart: &Restart) {
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_INTERVAL) {
        match checkpoint(conn, "PASSIVE") {
            Ok(pass) if next(pass.frames) == Next::AskWriter => {
                // What the writer copies is what came in since this catch-up: a few commits.
                if let Err(err) = checkpoint(conn, "PASSIVE") {
                    tracing::debug!(error = %err, "WAL catch-up checkpoint failed");
                }
                restart.ask();
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "WAL checkpoint failed; retrying"),
        }
    }
    // The writer has stopped: nothing waits on this one.
    if let Err(err) = checkpoint(conn, "TRUNCATE") {
        tracing::debug!(error = %err, "final WAL checkpoint skipped");
    }
}

/// What one `PRAGMA wal_checkpoint` reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass {
    /// The WAL's length in frames.
    pub(crate) frames: i64,
    /// Whether every frame was copied back: the next write transaction starts the WAL over.
    pub(crate) complete: bool,
}

/// Runs one checkpoint in `mode`.
pub(crate) fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<Pass> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        let busy: i64 = row.get(0)?;
        let frames: i64 = row.get(1)?;
        let copied: i64 = row.get(2)?;
        Ok(Pass {
            frames,
            complete: busy == 0 && copied == frames,
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn only_a_long_wal_asks_the_writer() {
        assert_eq!(next(0), Next::Wait);
        assert_eq!(next(RESTART_ABOVE_FRAMES), Next::Wait);
        assert_eq!(next(RESTART_ABOVE_FRAMES + 1), Next::AskWriter);
    }

    #[test]
    fn a_request_is_taken_once() {
        let restart = Restart::default();
        assert!(!restart.take());
        restart.ask();
        restart.ask();
        assert!(restart.take());
        assert!(!restart.take());
    }
}
