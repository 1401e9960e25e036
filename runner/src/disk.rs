//! The disk bound of a runner (`policy.disk_max`, issue 25): how much its runtime holds, measured
//! by a walk, and whether that is past the bound ([`judge`], pure). Supervision measures each
//! live runner every [`DISK_CHECK_INTERVAL`] on a blocking thread, one walk at a time, and stops
//! a runner whose runtime is past its bound (the agent's `executor::supervise`).
//!
//! A walk, not a quota: ext4 and xfs have project quotas, but only where the filesystem was made
//! and mounted for them, which most hosts' are not; a walk works on every filesystem. The job
//! owns the tree it walks, so the walk assumes it hostile:
//! - it never follows a link (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`) and never crosses into
//!   another mount (device and mount id), so nothing outside the runtime is counted or opened;
//! - it is iterative (a stack of names, no recursion), so any depth the kernel accepts is
//!   walked; a parent's descriptor is kept only while names in it wait, and a walk that would
//!   keep more than [`MAX_OPEN_DIRS`] open at once stops and counts as past the bound;
//! - it stops counting at the bound (a runtime far past it costs no more than one at it), and
//!   after [`MAX_ENTRIES`] entries, which also counts as past the bound: inodes are disk too,
//!   and a tree that large is the abuse the bound is for;
//! - it counts allocated blocks (`st_blocks`), so a sparse file counts what it holds, and a file
//!   with several links in the runtime once.
//!
//! Not counted: a file the job deleted while holding it open (its blocks stay allocated until
//! the descriptor is closed; only the job's processes see it), and anything it writes outside
//! its runtime. docs/security.md says so.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// What the last measurement of the runner's runtime says against the policy's `disk_max`
/// ([`judge`]); the agent's lifecycle decision reads it as an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskUse {
    /// Within the bound, no bound, or not measured (yet, or it could not be).
    Within,
    /// Past the bound: the runner is stopped.
    Over,
}

/// How often a live runner's runtime is measured. A job writing at disk speed (say 1 GB/s)
/// overshoots its bound by at most this much time's worth before it is stopped; a walk of a
/// large checkout (a few hundred thousand files) takes a fraction of a second of one core.
pub const DISK_CHECK_INTERVAL: Duration = Duration::from_secs(15);

/// The most entries one walk counts; a runtime with more is past its bound.
pub(crate) const MAX_ENTRIES: u64 = 2_000_000;

/// The most directories one walk keeps open at once (the agent shares its descriptor limit
/// with its connections and its journal). Reached only by a tree more than this deep whose
/// every level still has names waiting, which no build makes.
pub const MAX_OPEN_DIRS: usize = 64;

/// What a walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measured {
    /// Every entry was counted: the bytes allocated to the runtime.
    Bytes(u64),
    /// Counting stopped once past the bound it was given: at least this many bytes.
    AtLeast(u64),
    /// More than [`MAX_ENTRIES`] entries.
    TooManyEntries,
    /// Walking it would keep more than [`MAX_OPEN_DIRS`] directories open.
    TooDeep,
}

impl Measured {
    /// A sentence for the log and the attempt's detail.
    pub fn describe(self) -> String {
        match self {
            Measured::Bytes(bytes) => format!("{bytes} bytes"),
            Measured::AtLeast(bytes) => format!("more than {bytes} bytes"),
            Measured::TooManyEntries => format!("more than {MAX_ENTRIES} files and directories"),
            Measured::TooDeep => format!(
                "a tree more than {MAX_OPEN_DIRS} directories deep with entries at every level"
            ),
        }
    }
}

/// Whether a runtime is past `disk_max`. No measurement yet (or one that failed) and no bound
/// are within: the runner is not stopped on a guess.
pub fn judge(measured: Option<Measured>, disk_max: Option<u64>) -> DiskUse {
    let (Some(measured), Some(max)) = (measured, disk_max) else {
        return DiskUse::Within;
    };
    match measured {
        Measured::Bytes(bytes) | Measured::AtLeast(bytes) if bytes <= max => DiskUse::Within,
        _ => DiskUse::Over,
    }
}

/// Measures the runtime `dir`: the blocks allocated to it and everything below it on its own
/// mount, until past `stop_above` bytes. Blocking; an error means the walk could not finish
/// (the runtime gone, a directory it may not read), not that the runtime is large.
pub fn measure(dir: &Path, stop_above: u64) -> io::Result<Measured> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let root = rustix::fs::open(dir, flags, Mode::empty())?;
    let stat = rustix::fs::fstat(&root)?;
    let mut walk = Walk {
        stop_above,
        bytes: 0,
        entries: 0,
        linked: HashSet::new(),
        dev: stat.st_dev,
        mount_id: mount_id(&root, c"", AtFlags::EMPTY_PATH)?,
        open: Rc::new(Cell::new(0)),
    };
    walk.count(&stat);
    let mut pending: Vec<(Rc<OpenDir>, CString)> = Vec::new();
    let mut next = Some(walk.open_dir(root));
    loop {
        if let Some(dir) = next.take() {
            if walk.open.get() > MAX_OPEN_DIRS {
                return Ok(Measured::TooDeep);
            }
            if let Some(done) = walk.list(&dir, &mut pending)? {
                return Ok(done);
            }
        }
        let Some((parent, name)) = pending.pop() else {
            return Ok(Measured::Bytes(walk.bytes));
        };
        match rustix::fs::openat(&parent.fd, &name, flags, Mode::empty()) {
            Ok(fd) => next = Some(walk.open_dir(fd)),
            // Removed, or replaced by a file or a link, since it was listed: the job's own
            // doing; what replaced it is counted at the next measurement.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            }
            Err(e) => return Err(e.into()),
        }
        // The parent stays open only while names in it wait on the stack.
        drop(parent);
    }
}

struct Walk {
    stop_above: u64,
    bytes: u64,
    entries: u64,
    /// Inodes with more than one link already counted, by (device, inode).
    linked: HashSet<(u64, u64)>,
    dev: u64,
    mount_id: Option<u64>,
    /// How many directories are open now.
    open: Rc<Cell<usize>>,
}

/// A directory descriptor the walk holds, counted in [`Walk::open`] while it lives.
struct OpenDir {
    fd: OwnedFd,
    open: Rc<Cell<usize>>,
}

impl Drop for OpenDir {
    fn drop(&mut self) {
        self.open.set(self.open.get().saturating_sub(1));
    }
}

impl Walk {
    fn open_dir(&self, fd: OwnedFd) -> Rc<OpenDir> {
        self.open.set(self.open.get() + 1);
        Rc::new(OpenDir {
            fd,
            open: Rc::clone(&self.open),
        })
    }

    fn count(&mut self, stat: &rustix::fs::Stat) {
        if stat.st_nlink > 1 && !self.linked.insert((stat.st_dev, stat.st_ino)) {
            return;
        }
        let blocks = u64::try_from(stat.st_blocks).unwrap_or(0);
        self.bytes = self.bytes.saturating_add(blocks.saturating_mul(512));
    }

    /// Counts the entries of `dir` and puts its subdirectories on `pending`; `Some` when the
    /// walk is over (past the bound, or too many entries).
    fn list(
        &mut self,
        dir: &Rc<OpenDir>,
        pending: &mut Vec<(Rc<OpenDir>, CString)>,
    ) -> io::Result<Option<Measured>> {
        for entry in rustix::fs::Dir::read_from(&dir.fd)? {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Ok(Some(Measured::TooManyEntries));
            }
            let stat = match rustix::fs::statat(&dir.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
                // Another mount (a bind mount of the same filesystem shows only in its mount
                // id): neither counted nor entered; what it shows is not the runtime's.
                if stat.st_dev != self.dev
                    || !same_mount(
                        self.mount_id,
                        mount_id(&dir.fd, name, AtFlags::SYMLINK_NOFOLLOW)?,
                    )
                {
                    continue;
                }
                pending.push((Rc::clone(dir), name.to_owned()));
            }
            self.count(&stat);
            if self.bytes > self.stop_above {
                return Ok(Some(Measured::AtLeast(self.bytes)));
            }
        }
        Ok(None)
    }
}

/// Unknown mount ids (an old kernel) compare equal: the device still tells most mounts apart.
fn same_mount(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// The mount id of `name` in `dir` (or of `dir` itself with `EMPTY_PATH`), where the kernel
/// reports one.
fn mount_id(dir: impl AsFd, name: &std::ffi::CStr, flags: AtFlags) -> io::Result<Option<u64>> {
    match rustix::fs::statx(dir, name, flags, rustix::fs::StatxFlags::MNT_ID) {
        Ok(stx) if stx.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0 => {
            Ok(Some(stx.stx_mnt_id))
        }
        Ok(_) | Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::INVAL) => Ok(None),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
