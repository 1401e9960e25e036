//! Logs kept (issue 28): what a runner said, readable after its runtime is gone. This module
//! owns three things:
//!
//! - **Capture**: the runner's stdout and stderr go to `<runtime>/_diag/rm-output.log`
//!   ([`open_output`]), a file in the runtime (owned by the runner's uid, as the rest of it), so
//!   its growth counts against the runner's own `disk_max` and an agent that dies takes nothing
//!   from the runner: no pipe to the agent, no `SIGPIPE` mid-job.
//! - **Keeping**: before cleanup removes a runtime, its `_diag` files are copied
//!   ([`copy`]: safe against a hostile job), capped, scrubbed of secrets ([`scrub`]) and kept
//!   under `<data_dir>/logs/<attempt_id>/` (root only), written to a temporary directory and
//!   renamed, so a crash leaves no copy or a whole one. Keeping is idempotent: once an
//!   attempt's copy exists it is not made again (a cleanup retried after a crash may find the
//!   runtime half removed, and must not replace a whole copy with a part). A failure to keep
//!   never blocks cleanup: it is logged at `warn` and counted ([`keep_failures`]).
//! - **Bounds**: the store is pruned oldest first by count, age and size ([`prune`], pure),
//!   after every keep.
//!
//! A job runs as the uid that writes `_diag`: what is kept is the job's evidence, not proof.

pub mod copy;
pub(crate) mod prune;
pub mod scrub;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

pub use copy::DIAG_DIR;
pub use prune::{Bounds, DEFAULT_KEEP, DEFAULT_MAX_AGE, DEFAULT_MAX_TOTAL, Entry};

/// The file the runner's stdout and stderr go to, in its `_diag`.
pub const OUTPUT_FILE: &str = "rm-output.log";

/// The kept copies' directory under the data directory.
pub const STORE_DIR: &str = "logs";

/// The manifest in each kept copy: who the attempt was, what was kept and what was left out.
/// A `_diag` file of this name is not kept (it would be taken for the manifest).
pub(crate) const MANIFEST: &str = "rm-kept.json";

/// The most bytes kept of one file; a larger one keeps its head and its tail.
pub const PER_FILE_CAP: u64 = 16 << 20;

/// The most bytes kept of one attempt; files after the budget is spent are named in the
/// manifest as left out.
pub const PER_ATTEMPT_CAP: u64 = 64 << 20;

/// The caps a keep applies ([`PER_FILE_CAP`], [`PER_ATTEMPT_CAP`]; tests use small ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    pub per_file: u64,
    pub per_attempt: u64,
}

impl Caps {
    pub(crate) const DEFAULT: Caps = Caps {
        per_file: PER_FILE_CAP,
        per_attempt: PER_ATTEMPT_CAP,
    };
}

/// What is left to read of one attempt's `_diag`: each file is read to at most
/// [`PER_FILE_CAP`] and what is left of [`PER_ATTEMPT_CAP`], and what was read of it (line ends
/// looked for included) is spent. The kept copy and the live view (`rm-agent logs`) spend it
/// the same way, so neither reads more of a job's files than [`PER_ATTEMPT_CAP`] and the two
/// chunks [`copy::stream_capped`] may read again, whatever the job put there (4096 sparse
/// files of a terabyte each).
#[derive(Debug, Clone)]
pub struct Budget {
    caps: Caps,
    left: u64,
}

impl Budget {
    /// The budget of one attempt, under the default caps.
    pub fn attempt() -> Budget {
        Budget::with(Caps::DEFAULT)
    }

    pub(crate) fn with(caps: Caps) -> Budget {
        Budget {
            caps,
            left: caps.per_attempt,
        }
    }

    /// The cap of the next file; `None` once the attempt's bytes are spent.
    pub fn next_cap(&self) -> Option<u64> {
        (self.left > 0).then(|| self.caps.per_file.min(self.left))
    }

    /// Spends what a file's read took: what it read, and at least its size up to the `cap` it
    /// was read under, so a file read short (cut at a line end, shrunk meanwhile) still spends
    /// its share and a budget always runs out.
    pub fn spend(&mut self, size: u64, cap: u64, read: u64) {
        self.left = self.left.saturating_sub(read.max(size.min(cap)));
    }

    /// Why a file is left out once the budget is spent.
    pub fn spent(&self) -> String {
        format!(
            "the attempt's {} bytes were read already",
            self.caps.per_attempt
        )
    }
}

/// The prefix of a copy being made; a crash leaves one, which the next keep of the same
/// attempt removes and the pruning ignores.
const TEMP_PREFIX: &str = ".tmp-";

/// How many keeps failed since the agent started (each also logged at `warn`).
static KEEP_FAILURES: AtomicU64 = AtomicU64::new(0);

/// How many times keeping an attempt's logs failed in this process.
pub fn keep_failures() -> u64 {
    KEEP_FAILURES.load(Ordering::Relaxed)
}

/// Opens (creating it and `_diag` if needed) the file the runner's stdout and stderr go to, for
/// appending. `owner`: the runner's uid and gid under `isolation = "user"`; the file and `_diag`
/// become theirs, as the rest of the runtime. Opened relative to the runtime's descriptor and
/// never through a link: a persistent slot's runtime held a job before.
pub(crate) fn open_output(runtime: &Path, owner: Option<(u32, u32)>) -> io::Result<File> {
    let root = copy::open_dir(runtime)?;
    match rustix::fs::mkdirat(&root, DIAG_DIR, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let diag = copy::open_dir_at(&root, OsStr::new(DIAG_DIR))?;
    let file = rustix::fs::openat(
        &diag,
        OUTPUT_FILE,
        OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::APPEND
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o640),
    )?;
    let stat = rustix::fs::fstat(&file)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::other(format!(
            "{DIAG_DIR}/{OUTPUT_FILE} is not a regular file"
        )));
    }
    // A file that is also another file (a hard link), or someone else's, is never handed to
    // the runner's uid: the chown below would give it away.
    let ours = stat.st_uid == rustix::process::geteuid().as_raw()
        || owner.is_some_and(|(uid, _)| stat.st_uid == uid);
    if stat.st_nlink > 1 || !ours {
        return Err(io::Error::other(format!(
            "{DIAG_DIR}/{OUTPUT_FILE} is a hard link or belongs to another user"
        )));
    }
    if let Some((uid, gid)) = owner {
        let (uid, gid) = (
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
        rustix::fs::fchown(&diag, uid, gid)?;
        rustix::fs::fchown(&file, uid, gid)?;
    }
    // Blocking writes for the runner: the flag only kept the open from waiting on a FIFO.
    rustix::fs::fcntl_setfl(&file, OFlags::APPEND)?;
    Ok(File::from(file))
}

/// Points a runner command's stdout and stderr at [`OUTPUT_FILE`]. A file that cannot be made
/// leaves them at `/dev/null` (a log must never stop a runner); it is said at `warn`.
pub(crate) fn capture_output(
    command: &mut std::process::Command,
    runtime: &Path,
    owner: Option<(u32, u32)>,
) {
    let opened = open_output(runtime, owner).and_then(|file| Ok((file.try_clone()?, file)));
    match opened {
        Ok((out, err)) => {
            // std duplicates each onto 1 and 2 in the child: the copies are not close-on-exec
            // there, and the agent's own descriptors close when the command is dropped.
            command.stdout(out).stderr(err);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the runner's output file; its stdout and stderr are discarded");
        }
    }
}

/// Who an attempt was, written into its kept copy (never a secret: names and ids only).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub attempt_id: String,
    pub runner_name: String,
    pub policy: String,
    pub job_id: Option<i64>,
    pub kept_at_ms: i64,
    /// The files kept, in the order they were copied.
    pub files: Vec<KeptFile>,
    /// What was in `_diag` and not kept, with why.
    pub left_out: Vec<LeftOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeptFile {
    pub name: String,
    /// The file's size in the runtime.
    pub original_bytes: u64,
    /// What was kept of it, scrubbed.
    pub kept_bytes: u64,
    /// It was over its cap: the middle was left out.
    pub capped: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LeftOut {
    /// The name, or a description of it when it is not printable.
    pub name: String,
    pub why: String,
}

/// The attempt a keep is for.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub attempt_id: String,
    pub runner_name: String,
    pub policy: String,
    pub job_id: Option<i64>,
    pub runtime_dir: PathBuf,
}

impl Attempt {
    pub fn of(record: &rm_journal::AttemptRecord) -> Attempt {
        Attempt {
            attempt_id: record.attempt_id.as_str().to_owned(),
            runner_name: record.runner_name.clone(),
            policy: record.policy.clone(),
            job_id: record.job_id.map(|j| j.get()),
            runtime_dir: record.runtime_dir.clone(),
        }
    }
}

/// What a keep did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// A copy was made now.
    Made(Manifest),
    /// A whole copy was already there (a cleanup tried again): nothing was copied.
    Already,
}

/// The store of kept logs: `<data_dir>/logs/`, root only (0700 directories, 0600 files).
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    bounds: Bounds,
}

impl Store {
    pub fn new(data_dir: &Path, bounds: Bounds) -> Store {
        Store {
            dir: data_dir.join(STORE_DIR),
            bounds,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where an attempt's kept copy is (whether or not there is one).
    pub fn entry(&self, attempt_id: &str) -> PathBuf {
        self.dir.join(attempt_id)
    }

    /// The cleanup step: keeps the attempt's logs, then prunes the store. Never fails: a
    /// failure is logged at `warn` and counted, and cleanup goes on.
    pub fn keep_and_prune(&self, attempt: &Attempt, now_ms: i64) {
        match self.keep(attempt, now_ms) {
            Ok(Kept::Made(manifest)) => tracing::debug!(
                files = manifest.files.len(),
                left_out = manifest.left_out.len(),
                "runner logs kept"
            ),
            Ok(Kept::Already) => tracing::debug!("runner logs were already kept"),
            Err(e) => {
                KEEP_FAILURES.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot keep the runner's logs; cleaning up without them"
                );
            }
        }
        if let Err(e) = self.prune(now_ms) {
            KEEP_FAILURES.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                error = format!("{e:#}"),
                "cannot prune the kept runner logs"
            );
        }
    }

    /// Copies the attempt's `_diag` into the store, unless a whole copy is already there.
    pub fn keep(&self, attempt: &Attempt, now_ms: i64) -> anyhow::Result<Kept> {
        self.keep_with(attempt, now_ms, Caps::DEFAULT)
    }

    /// [`Store::keep`] under `caps`.
    pub(crate) fn keep_with(
        &self,
        attempt: &Attempt,
        now_ms: i64,
        caps: Caps,
    ) -> anyhow::Result<Kept> {
        anyhow::ensure!(
            copy::safe_name(OsStr::new(&attempt.attempt_id)),
            "the attempt id is not a file name"
        );
        self.make_store()?;
        let store = copy::open_dir(&self.dir)
            .with_context(|| format!("cannot open {}", self.dir.display()))?;
        match rustix::fs::statat(
            &store,
            attempt.attempt_id.as_str(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(_) => return Ok(Kept::Already),
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(io::Error::from(e)).context("cannot look for an earlier copy"),
        }
        let temp = format!("{TEMP_PREFIX}{}", attempt.attempt_id);
        let temp_path = self.dir.join(&temp);
        // Left by a crash mid-copy: ours, root's, made of plain files.
        match std::fs::remove_dir_all(&temp_path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", temp_path.display()));
            }
            _ => {}
        }
        rustix::fs::mkdirat(&store, temp.as_str(), Mode::from_raw_mode(0o700))
            .map_err(io::Error::from)
            .with_context(|| format!("cannot create {}", temp_path.display()))?;
        let out = copy::open_dir_at(&store, OsStr::new(&temp))?;
        let mut manifest = Manifest {
            attempt_id: attempt.attempt_id.clone(),
            runner_name: attempt.runner_name.clone(),
            policy: attempt.policy.clone(),
            job_id: attempt.job_id,
            kept_at_ms: now_ms,
            files: Vec::new(),
            left_out: Vec::new(),
        };
        match open_diag(&attempt.runtime_dir) {
            Ok(Some(diag)) => copy_diag(&diag, &out, &mut manifest, caps),
            Ok(None) => {}
            // A `_diag` that is a link (or not a directory) is the job's doing: the entry says
            // so rather than be missing.
            Err(e) => manifest.left_out.push(LeftOut {
                name: DIAG_DIR.to_owned(),
                why: format!("{e:#}"),
            }),
        }
        let json = serde_json::to_vec_pretty(&manifest).context("cannot write the manifest")?;
        write_new(&out, OsStr::new(MANIFEST), &json).context("cannot write the manifest")?;
        rustix::fs::fsync(&out).map_err(io::Error::from)?;
        rustix::fs::renameat(&store, temp.as_str(), &store, attempt.attempt_id.as_str())
            .map_err(io::Error::from)
            .context("cannot move the copy into place")?;
        rustix::fs::fsync(&store).map_err(io::Error::from)?;
        Ok(Kept::Made(manifest))
    }

    fn make_store(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)
            .and_then(|()| {
                std::fs::set_permissions(
                    &self.dir,
                    std::os::unix::fs::PermissionsExt::from_mode(0o700),
                )
            })
            .with_context(|| format!("cannot create {}", self.dir.display()))
    }

    /// Every kept copy, with when it was kept and its size; copies being made are left out.
    pub fn entries(&self) -> anyhow::Result<Vec<(Entry, Option<Manifest>)>> {
        let mut entries = Vec::new();
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(entries),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.dir.display())),
        };
        for item in listing {
            let item = item?;
            let name = item.file_name();
            let Some(attempt) = name.to_str().filter(|n| copy::safe_name(OsStr::new(n))) else {
                continue;
            };
            let path = item.path();
            let manifest = read_manifest(&path);
            let mut bytes = 0;
            for file in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                bytes += file.metadata().map_or(0, |m| m.len());
            }
            // A copy without a readable manifest is dated by its directory.
            let kept_at_ms = match &manifest {
                Some(m) => m.kept_at_ms,
                None => item
                    .metadata()
                    .and_then(|m| m.modified())
                    .map_or(0, |t| rm_vocab::UnixMs::from_system_time(t).get()),
            };
            entries.push((
                Entry {
                    attempt: attempt.to_owned(),
                    kept_at_ms,
                    bytes,
                },
                manifest,
            ));
        }
        Ok(entries)
    }

    /// Removes what [`prune::to_prune`] says goes; returns the attempts removed.
    pub fn prune(&self, now_ms: i64) -> anyhow::Result<Vec<String>> {
        let entries: Vec<Entry> = self.entries()?.into_iter().map(|(e, _)| e).collect();
        let gone = prune::to_prune(&entries, self.bounds, now_ms);
        for attempt in &gone {
            let path = self.entry(attempt);
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
        Ok(gone)
    }
}

/// The manifest of a kept copy, if it has a readable one.
pub fn read_manifest(entry: &Path) -> Option<Manifest> {
    let text = std::fs::read(entry.join(MANIFEST)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The runtime's `_diag`, opened without following a link; `None` when there is none (a
/// launch that failed before the runner ran, a runtime already removed).
pub fn open_diag(runtime: &Path) -> anyhow::Result<Option<OwnedFd>> {
    let root = match copy::open_dir(runtime) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", runtime.display())),
    };
    match copy::open_dir_at(&root, OsStr::new(DIAG_DIR)) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("cannot open {DIAG_DIR} (a link, or not a directory)"))
        }
    }
}

/// The order files are kept in, so the attempt's budget goes to what says most: the runner's
/// output, the job's worker log, the listener's log, then the rest; by name within each.
fn priority(name: &OsStr) -> u8 {
    let name = name.as_bytes();
    if name == OUTPUT_FILE.as_bytes() {
        0
    } else if name.starts_with(b"Worker_") {
        1
    } else if name.starts_with(b"Runner_") {
        2
    } else {
        3
    }
}

/// The top-level names of `_diag` in keeping order; unsafe names are left out with why.
pub fn diag_names(diag: impl AsFd, left_out: &mut Vec<LeftOut>) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for name in copy::list(diag)? {
        if !copy::safe_name(&name) || name == MANIFEST {
            left_out.push(LeftOut {
                name: printable(&name),
                why: "its name is not one rm keeps".to_owned(),
            });
        } else {
            names.push(name);
        }
    }
    names.sort_by(|a, b| priority(a).cmp(&priority(b)).then_with(|| a.cmp(b)));
    Ok(names)
}

/// A name as it may be printed: safe names as they are, others by their length only.
fn printable(name: &OsStr) -> String {
    if copy::safe_name(name) {
        name.to_string_lossy().into_owned()
    } else {
        format!("(a name of {} bytes)", name.len())
    }
}

/// One `_diag` file as [`stream_diag_file`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagRead {
    /// Its size when it was opened.
    pub size: u64,
    /// It was over its cap: the middle was left out.
    pub capped: bool,
    /// What reading it took.
    pub streamed: copy::Streamed,
}

/// Streams one `_diag` file safely ([`copy::open_regular_at`]) to `sink`: capped at `cap`
/// ([`copy::stream_capped`]), scrubbed piece by piece. `Err` says why it is not read (or why
/// its reading stopped).
pub fn stream_diag_file(
    diag: impl AsFd,
    name: &OsStr,
    cap: u64,
    sink: copy::Sink<'_>,
) -> Result<DiagRead, String> {
    let (file, size) = copy::open_regular_at(diag, name)?;
    let streamed =
        stream_scrubbed(&file, size, cap, sink).map_err(|e| format!("cannot read it: {e}"))?;
    Ok(DiagRead {
        size,
        capped: size > cap,
        streamed,
    })
}

/// Streams a file opened with [`copy::open_regular_at`] (of `size` bytes then) to `sink`,
/// capped at `cap` ([`copy::stream_capped`]) and scrubbed piece by piece.
pub fn stream_scrubbed(
    file: &File,
    size: u64,
    cap: u64,
    sink: copy::Sink<'_>,
) -> io::Result<copy::Streamed> {
    let mut scrubber = scrub::Scrubber::default();
    copy::stream_capped(file, size, cap, &mut |piece, ends| {
        sink(&scrubber.piece(piece, ends), ends)
    })
}

fn copy_diag(diag: &OwnedFd, out: &OwnedFd, manifest: &mut Manifest, caps: Caps) {
    let names = match diag_names(diag, &mut manifest.left_out) {
        Ok(names) => names,
        Err(e) => {
            manifest.left_out.push(LeftOut {
                name: DIAG_DIR.to_owned(),
                why: format!("cannot list it: {e}"),
            });
            return;
        }
    };
    let mut budget = Budget::with(caps);
    for name in names {
        let shown = printable(&name);
        let Some(cap) = budget.next_cap() else {
            manifest.left_out.push(LeftOut {
                name: shown,
                why: budget.spent(),
            });
            continue;
        };
        // A kept file is at most a cap (and its marker line): it is written whole.
        let mut bytes = Vec::new();
        let read = stream_diag_file(diag, &name, cap, &mut |piece, ends| {
            bytes.extend_from_slice(piece);
            if ends {
                bytes.push(b'\n');
            }
            Ok(())
        });
        if let Ok(read) = &read {
            budget.spend(read.size, cap, read.streamed.read);
        }
        let kept = read.and_then(|read| {
            write_new(out, &name, &bytes).map_err(|e| format!("cannot write its copy: {e}"))?;
            Ok(read)
        });
        match kept {
            Ok(read) => manifest.files.push(KeptFile {
                name: shown,
                original_bytes: read.size,
                kept_bytes: bytes.len() as u64,
                capped: read.capped,
            }),
            Err(why) => manifest.left_out.push(LeftOut { name: shown, why }),
        }
    }
}

/// Writes a new file (0600) under `dir`, synced.
fn write_new(dir: impl AsFd, name: &OsStr, bytes: &[u8]) -> io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests;
