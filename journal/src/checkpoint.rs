//! WAL checkpoints on their own thread. SQLite's automatic checkpoint runs inside the commit that
//! crosses its threshold, so one unlucky group of deliveries would wait for pages to be copied
//! into the database file and for that file's fsync. Here a second connection copies the WAL
//! back in the background (`PASSIVE`: it never blocks the writer) and only when the WAL has grown
//! large anyway does it take the brief writer-blocking `TRUNCATE` that lets the file shrink.

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use rusqlite::Connection;

use crate::JournalError;
use crate::connection;

/// How often the background checkpoint runs.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// A WAL longer than this many frames (64 MiB of 4 KiB pages) is truncated after its pages are
/// copied back, so a sustained burst cannot grow it without bound.
const TRUNCATE_ABOVE_FRAMES: i64 = 16 * 1024;

/// Starts the checkpoint thread. It stops, after a last checkpoint, when `stop`'s sender (held by
/// the writer thread) is dropped.
pub(crate) fn spawn(path: &Path, stop: Receiver<()>) -> Result<(), JournalError> {
    let conn = connection::open_checkpointer(path)?;
    std::thread::Builder::new()
        .name("rm-journal-checkpoint".to_owned())
        .spawn(move || run(&conn, &stop))
        .map_err(|e| JournalError::Commit(format!("cannot start the checkpoint thread: {e}")))?;
    Ok(())
}

fn run(conn: &Connection, stop: &Receiver<()>) {
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(CHECKPOINT_INTERVAL) {
        match checkpoint(conn, "PASSIVE") {
            Ok(frames) if frames > TRUNCATE_ABOVE_FRAMES => {
                if let Err(err) = checkpoint(conn, "TRUNCATE") {
                    tracing::debug!(error = %err, "WAL truncate deferred");
                }
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "WAL checkpoint failed; retrying"),
        }
    }
    if let Err(err) = checkpoint(conn, "TRUNCATE") {
        tracing::debug!(error = %err, "final WAL checkpoint skipped");
    }
}

/// Runs one checkpoint; returns the WAL's length in frames.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        row.get(1)
    })
}
