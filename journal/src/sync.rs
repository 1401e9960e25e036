//! Making committed groups durable, off the writer thread. The group writer commits with
//! `synchronous=NORMAL` (SQLite appends the group's WAL frames and does not wait for the disk);
//! this thread then `fdatasync`s the WAL and only after that answers the group's callers. While
//! it waits for the disk, the writer is already writing the next group, and every group that
//! committed meanwhile is made durable by the same flush. A 2xx still means "on disk": exactly
//! the guarantee of `synchronous=FULL`, without the writer idling through every flush (on this
//! project's virtual disk a flush under load takes about 4 ms, longer than writing a group).
//!
//! Which error means what: a full disk shows at the commit (the WAL `write` fails, SQLite
//! answers `SQLITE_FULL` and rolls the group back; nothing of it is visible or answered 2xx), so
//! the writer refuses that group and takes the next one as usual. A failed flush is different:
//! the group is committed (other connections see it) but the kernel may have dropped its dirty
//! pages, so the file is in an unknown state. That poisons the journal: every later delivery
//! is refused, and the process is told ([`Poison::reason`]) so it can drain and exit for its
//! service manager to restart it (SQLite recovers the WAL at the next open).
//!
//! The flush keeps one descriptor of the WAL for the writer's whole life ([`WalFile`]): Linux
//! reports an asynchronous write-back error once to each descriptor that was open when it
//! happened, so a descriptor opened for each flush could miss an error already reported
//! elsewhere (to SQLite's own descriptor at a checkpoint) and answer 2xx for lost pages.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
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

/// The `fdatasync` of the journal's WAL through one kept descriptor (see the module's docs).
pub(crate) fn wal_sync(journal: &Path) -> SyncFn {
    let mut wal = journal.as_os_str().to_owned();
    wal.push("-wal");
    let mut file = WalFile::new(PathBuf::from(wal));
    Box::new(move || file.flush())
}

/// Which file a path or a descriptor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// What one flush does with the descriptor it holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Descriptor {
    /// None held yet: open the WAL.
    Open,
    /// The held descriptor is still the WAL's file: flush it.
    Keep,
    /// The WAL's path now names another file, or none. The writer's connection still appends
    /// to the file it opened, which crash recovery will not read any more: what was committed
    /// since cannot be made durable, so the flush fails (and poisons the journal). Opening the
    /// new file instead would flush a file nobody writes to and answer 2xx for nothing.
    Replaced,
}

/// The descriptor rule, as a pure function of the file held and the file at the WAL's path.
pub(crate) fn descriptor(held: Option<FileId>, at_path: Option<FileId>) -> Descriptor {
    match (held, at_path) {
        (None, _) => Descriptor::Open,
        (Some(held), Some(now)) if held == now => Descriptor::Keep,
        (Some(_), _) => Descriptor::Replaced,
    }
}

/// The WAL's one kept descriptor.
pub(crate) struct WalFile {
    path: PathBuf,
    held: Option<(File, FileId)>,
    /// How many times the WAL was opened (once, for the life of the writer).
    pub(crate) opens: u32,
}

impl WalFile {
    pub(crate) fn new(path: PathBuf) -> WalFile {
        WalFile {
            path,
            held: None,
            opens: 0,
        }
    }

    /// Makes everything written to the WAL so far durable.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        let at_path = match std::fs::metadata(&self.path) {
            Ok(meta) => Some(FileId::of(&meta)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => None,
            Err(err) => return Err(err),
        };
        match descriptor(self.held.as_ref().map(|(_, id)| *id), at_path) {
            Descriptor::Open => {
                let file = File::open(&self.path)?;
                let id = FileId::of(&file.metadata()?);
                self.opens += 1;
                file.sync_data()?;
                self.held = Some((file, id));
                Ok(())
            }
            Descriptor::Keep => match &self.held {
                Some((file, _)) => file.sync_data(),
                None => Err(io::Error::other("no WAL descriptor held")),
            },
            Descriptor::Replaced => Err(io::Error::other(format!(
                "the journal's WAL {} was removed or replaced while rm-agent was writing it",
                self.path.display()
            ))),
        }
    }
}

/// Set once, by the first failed flush, with why. The writer looks at it before every group;
/// the handles wait for it ([`crate::Journal::poisoned`]).
pub(crate) struct Poison {
    set: AtomicBool,
    reason: watch::Sender<Option<String>>,
}

impl Poison {
    pub(crate) fn new() -> Arc<Poison> {
        Arc::new(Poison {
            set: AtomicBool::new(false),
            reason: watch::Sender::new(None),
        })
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Why the journal is poisoned, once it is.
    pub(crate) fn reason(&self) -> Option<String> {
        self.reason.borrow().clone()
    }

    /// Completes, with the reason, once the journal is poisoned.
    pub(crate) async fn wait(&self) -> String {
        let mut reason = self.reason.subscribe();
        match reason.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            // Unreachable: `self` holds the sender.
            Err(_) => std::future::pending().await,
        }
    }

    fn poison(&self, reason: String) {
        if !self.set.swap(true, Ordering::SeqCst) {
            self.reason.send_replace(Some(reason));
        }
    }
}

/// Starts the flush thread; returns where the writer sends each committed group's waiters. The
/// thread stops when the writer drops that sender, after answering everything sent to it.
pub(crate) fn spawn(
    sync: SyncFn,
    poisoned: Arc<Poison>,
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
    poisoned: &Poison,
    metrics: &JournalMetrics,
    durable: &watch::Sender<u64>,
) {
    while let Ok(mut waiters) = rx.recv() {
        // Every group committed while the previous flush ran is covered by this one.
        while let Ok(more) = rx.try_recv() {
            waiters.extend(more);
        }
        if poisoned.is_set() {
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
                let reason = format!("flushing the journal to disk failed ({err})");
                tracing::error!(error = %err, "flushing the journal's WAL failed; refusing deliveries until rm-agent restarts");
                poisoned.poison(reason.clone());
                Waiter::fail_all(waiters, &reason);
            }
        }
    }
}

/// What every delivery is told once a flush has failed.
pub(crate) const POISONED: &str = "an earlier flush of the journal to disk failed; restart rm-agent so SQLite can recover the journal";

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino }
    }

    #[test]
    fn the_descriptor_is_opened_once_kept_and_a_replaced_wal_fails() {
        assert_eq!(descriptor(None, Some(id(7))), Descriptor::Open);
        assert_eq!(descriptor(None, None), Descriptor::Open);
        assert_eq!(descriptor(Some(id(7)), Some(id(7))), Descriptor::Keep);
        assert_eq!(descriptor(Some(id(7)), Some(id(8))), Descriptor::Replaced);
        assert_eq!(
            descriptor(Some(id(7)), Some(FileId { dev: 2, ino: 7 })),
            Descriptor::Replaced
        );
        assert_eq!(descriptor(Some(id(7)), None), Descriptor::Replaced);
    }

    /// Every flush goes through the one descriptor opened first; a WAL replaced under the
    /// writer (the path now names a new, empty file) fails the flush instead of flushing the
    /// new file and calling the old one's frames durable.
    #[test]
    fn flushes_keep_one_descriptor_and_refuse_a_replaced_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite3-wal");
        std::fs::write(&path, b"frames").unwrap();
        let mut wal = WalFile::new(path.clone());
        for _ in 0..3 {
            wal.flush().unwrap();
        }
        assert_eq!(wal.opens, 1, "the WAL was opened again for a flush");

        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        std::fs::write(&path, b"").unwrap();
        let err = wal.flush().unwrap_err();
        assert!(err.to_string().contains("removed or replaced"), "{err}");

        let mut gone = WalFile::new(dir.path().join("other-wal"));
        std::fs::write(dir.path().join("other-wal"), b"").unwrap();
        gone.flush().unwrap();
        std::fs::remove_file(dir.path().join("other-wal")).unwrap();
        assert!(gone.flush().is_err(), "a removed WAL flushed");
    }
}
