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

/// A WAL longer than this many frames (256 MiB of 4 KiB pages) is started over (the writer
/// finishes a checkpoint), so a sustained burst cannot grow it without bound. Each start-over
/// holds the writer for a WAL flush and a database flush (30-50 ms on this project's virtual
/// disk under load, whatever the WAL's length), so it is rare: at 10 000 deliveries a second
/// (~20 frames a commit) this is every ~2 s, where 64 MiB was every 0.6 s and held 0.5 % of all
/// deliveries for those 30-50 ms (docs/performance.md). A host under ordinary traffic never
/// gets here: between bursts a background pass copies everything and the WAL starts over by
/// itself.
const RESTART_ABOVE_FRAMES: i64 = 64 * 1024;

/// Before asking the writer, background passes run back to back until fewer frames than this
/// are left to copy (what the writer's own checkpoint then copies while deliveries wait)...
const CATCH_UP_FRAMES: i64 = 256;
/// ... or until this many passes have run (a writer faster than the disk never lets them catch
/// up; the writer then copies the rest).
const MAX_CATCH_UP_PASSES: usize = 16;

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
                catch_up(conn);
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

/// Background passes until little is left for the writer to copy.
fn catch_up(conn: &Connection) {
    for passes in 1..=MAX_CATCH_UP_PASSES {
        match checkpoint(conn, "PASSIVE") {
            Ok(pass) if pass.frames - pass.copied > CATCH_UP_FRAMES => {
                tracing::trace!(passes, left = pass.frames - pass.copied, "WAL catch-up");
            }
            Ok(pass) => {
                tracing::trace!(passes, left = pass.frames - pass.copied, "WAL caught up");
                return;
            }
            Err(err) => {
                tracing::debug!(error = %err, "WAL catch-up checkpoint failed");
                return;
            }
        }
    }
}

/// What one `PRAGMA wal_checkpoint` reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pass {
    /// The WAL's length in frames.
    pub(crate) frames: i64,
    /// Frames copied back into the database file so far.
    pub(crate) copied: i64,
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
            copied,
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
