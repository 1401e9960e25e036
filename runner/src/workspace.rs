//! Ephemeral runtime directories under the runner root: creating `<runner_root>/<12 hex>/` with a
//! copy of the runner package and its `tmp/`, and removing a runtime whole once its runner is
//! gone. Removal never follows a symbolic link (a job can plant one pointing anywhere), copes
//! with directories a job made read-only, is idempotent, and refuses any path that is not a
//! direct child of the canonical runner root. Both are blocking filesystem work (a package is
//! thousands of files), done for the backends ([`crate::backend`]), which are called off the
//! async runtime; a runtime is made and removed only through the attempt's backend.
//!
//! Removal works on directory file descriptors (`openat(O_NOFOLLOW)`, `unlinkat`), so every step
//! happens inside the directory it was checked in: a name that is a link is unlinked as a name,
//! and no path string is ever resolved again after the root was opened. It walks the tree
//! without recursion and without a depth limit ([`walk`]): whatever a job could nest, the kernel
//! accepted, and the runtime must go, or its uid is never released.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

pub(crate) mod walk;

use walk::DirStack;

/// Length of a runtime directory's name: the first 12 hex digits of the attempt id (CONTRACT
/// §5). Short on purpose: checkouts nest deep under `_work` and some tools still cap path length.
pub const WORKSPACE_NAME_LEN: usize = 12;

/// The folder the runner is registered with (`work_folder` in the JIT request). A package that
/// ships one at its top would hand a stale checkout to the next job, so it is refused.
pub const WORK_FOLDER: &str = "_work";

/// The runtime's temporary directory; the runner's `TMPDIR`, `TMP` and `TEMP` point here so a
/// job's temporary files are removed with the runtime.
pub const TMP_DIR: &str = "tmp";

/// Mode of a new runtime directory: only the agent's user may enter it (it holds the runner's
/// credentials once registered).
pub(super) const RUNTIME_MODE: u32 = 0o700;

/// How often a directory is re-read and emptied when entries keep appearing in it while it is
/// being removed (a process that escaped the stop). Past this the removal fails and is retried
/// later by the caller rather than looping forever.
const MAX_EMPTY_PASSES: usize = 4;

/// What can go wrong with a runtime directory. Paths are the agent's own (the root and the
/// runtime), never a name a job chose.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The runner root cannot be created or resolved.
    #[error(
        "the runner root {root} cannot be used: {source}; check `host.runner_root` and its permissions"
    )]
    Root { root: PathBuf, source: io::Error },
    /// The attempt id does not carry the hex digits a runtime name is made of.
    #[error("attempt id {0:?} does not start with {WORKSPACE_NAME_LEN} hex digits")]
    AttemptId(String),
    /// The package ships a top-level `_work`.
    #[error(
        "the runner package {package} has a top-level `_work` folder; remove it from the package (the runner creates its own)"
    )]
    PackageHasWorkFolder { package: PathBuf },
    /// The package directory is not a readable directory.
    #[error("the runner package {package} cannot be read: {source}; check `runner.package_dir`")]
    Package { package: PathBuf, source: io::Error },
    /// The runtime directory is already there: two attempts never share one.
    #[error("the runtime directory {runtime} already exists; two attempts never share a workspace")]
    RuntimeExists { runtime: PathBuf },
    /// Copying the package (or creating `tmp/`) failed; what was copied has been removed.
    #[error("cannot copy the runner package into {runtime}: {source}")]
    Copy { runtime: PathBuf, source: io::Error },
    /// A removal was asked for a path that is not a direct child of the runner root.
    #[error(
        "refusing to remove {path}: it is not a runtime directory directly inside the runner root {root}"
    )]
    OutsideRoot { path: PathBuf, root: PathBuf },
    /// A persistent slot was asked for at a path that is not `<root>/<policy>/s<N>`, or for a
    /// policy name that cannot name a directory.
    #[error(
        "{path} is not a persistent slot (<runner root>/<policy>/s<N>) of the runner root {root}"
    )]
    NotASlot { path: PathBuf, root: PathBuf },
    /// Removing the runtime failed part-way; what is left stays for a later attempt.
    #[error("cannot remove the runtime directory {runtime}: {source}")]
    Remove { runtime: PathBuf, source: io::Error },
}

/// What a removal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The runtime was there and is gone now.
    Removed,
    /// There was nothing to remove (already removed, or never created).
    Absent,
}

/// A runtime directory: ephemeral ([`RunnerRoot::create_ephemeral`]) or a persistent slot
/// ([`RunnerRoot::prepare_slot`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    dir: PathBuf,
}

impl Runtime {
    pub(super) fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The runtime directory: the runner's working directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<runtime>/tmp`: the runner's `TMPDIR`.
    pub fn tmp(&self) -> PathBuf {
        self.dir.join(TMP_DIR)
    }
}

/// The runner root (`host.runner_root`), resolved once to its canonical path: every runtime is a
/// direct child of it, and nothing outside it is ever removed.
#[derive(Debug, Clone)]
pub struct RunnerRoot {
    root: PathBuf,
}

/// The runtime directory name for an attempt: the first [`WORKSPACE_NAME_LEN`] hex digits of its
/// id (hyphens of a UUID skipped), lower-case.
pub fn workspace_name(attempt_id: &str) -> Result<String, WorkspaceError> {
    let name: String = attempt_id
        .chars()
        .filter(|c| *c != '-')
        .take(WORKSPACE_NAME_LEN)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if name.len() == WORKSPACE_NAME_LEN && name.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(name)
    } else {
        Err(WorkspaceError::AttemptId(attempt_id.to_owned()))
    }
}

impl RunnerRoot {
    /// Creates the runner root if needed and resolves it to its canonical path.
    pub fn open(root: &Path) -> Result<Self, WorkspaceError> {
        let fail = |source| WorkspaceError::Root {
            root: root.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(root).map_err(fail)?;
        let canonical = root.canonicalize().map_err(fail)?;
        Ok(Self { root: canonical })
    }

    /// The canonical runner root.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Where an attempt's ephemeral runtime lives; touches nothing.
    pub fn ephemeral_path(&self, attempt_id: &str) -> Result<PathBuf, WorkspaceError> {
        Ok(self.root.join(workspace_name(attempt_id)?))
    }

    /// Creates `<root>/<12 hex>/` (mode 0700; refused if it exists), copies the runner package
    /// into it and creates its `tmp/`. A package with a top-level `_work` is refused before
    /// anything is created; a copy that fails part-way is removed again.
    pub fn create_ephemeral(
        &self,
        attempt_id: &str,
        package: &Path,
    ) -> Result<Runtime, WorkspaceError> {
        check_package(package)?;
        self.create_ephemeral_with(attempt_id, |runtime| {
            copy_tree(package, runtime).and_then(|()| create_tmp(runtime))
        })
    }

    /// Creates `<root>/<12 hex>/` (mode 0700; refused if it exists) and lets `fill` put the
    /// runtime's contents in it; a runtime `fill` fails on part-way is removed again.
    pub(crate) fn create_ephemeral_with(
        &self,
        attempt_id: &str,
        fill: impl FnOnce(&Path) -> io::Result<()>,
    ) -> Result<Runtime, WorkspaceError> {
        let runtime = self.ephemeral_path(attempt_id)?;
        match std::fs::DirBuilder::new()
            .mode(RUNTIME_MODE)
            .create(&runtime)
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(WorkspaceError::RuntimeExists { runtime });
            }
            Err(source) => return Err(WorkspaceError::Copy { runtime, source }),
        }
        if let Err(source) = fill(&runtime) {
            // Leave no half-made runtime behind; if even that fails, the caller's cleanup pass
            // finds the directory and retries the removal.
            if let Err(e) = self.remove_runtime(&runtime) {
                tracing::warn!(error = %e, "cannot remove a half-made runtime");
            }
            return Err(WorkspaceError::Copy { runtime, source });
        }
        Ok(Runtime { dir: runtime })
    }

    /// Removes a runtime directory whole, without following any symbolic link in it (a link is
    /// removed, its target is left alone), making directories a job locked writable again first.
    /// `runtime` must be a direct child of the runner root; anything else is refused. Removing an
    /// absent runtime is fine ([`Removal::Absent`]).
    pub fn remove_runtime(&self, runtime: &Path) -> Result<Removal, WorkspaceError> {
        let name = self.child_name(runtime)?;
        let fail = |source| WorkspaceError::Remove {
            runtime: runtime.to_path_buf(),
            source,
        };
        let root = open_dir(&self.root).map_err(fail)?;
        let name = CString::new(name.as_bytes()).map_err(|e| fail(io::Error::other(e)))?;
        remove_entry(root.as_fd(), &name, None).map_err(fail)
    }

    /// The name of `path` inside the root, if `path` is a direct child of it: its last component
    /// is a plain name and its parent resolves to the canonical root.
    fn child_name<'p>(&self, path: &'p Path) -> Result<&'p OsStr, WorkspaceError> {
        let outside = || WorkspaceError::OutsideRoot {
            path: path.to_path_buf(),
            root: self.root.clone(),
        };
        let Some(Component::Normal(name)) = path.components().next_back() else {
            return Err(outside());
        };
        let parent = path.parent().ok_or_else(outside)?;
        // A parent that cannot be resolved cannot be shown to be the root.
        let parent = parent.canonicalize().map_err(|_| outside())?;
        if parent == self.root {
            Ok(name)
        } else {
            Err(outside())
        }
    }
}

/// Refuses a package that is not a directory or ships a top-level `_work` (of any file type:
/// a link named `_work` would be worse than a folder).
pub(crate) fn check_package(package: &Path) -> Result<(), WorkspaceError> {
    let fail = |source| WorkspaceError::Package {
        package: package.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(package).map_err(fail)?;
    if !meta.is_dir() {
        return Err(fail(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    match std::fs::symlink_metadata(package.join(WORK_FOLDER)) {
        Ok(_) => Err(WorkspaceError::PackageHasWorkFolder {
            package: package.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(fail(source)),
    }
}

/// Copies the contents of `from` into the existing directory `to`: directories are recreated,
/// files copied with their permission bits, links recreated as links (never followed). Anything
/// else (a socket, a device) in a package is an error.
pub fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&target)?;
            copy_tree(&source, &target)?;
            let mode = entry.metadata()?.permissions().mode();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)?;
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a file, directory or link", source.display()),
            ));
        }
    }
    Ok(())
}

/// Creates `<runtime>/tmp`; a real directory of that name from the package is kept.
pub(super) fn create_tmp(runtime: &Path) -> io::Result<()> {
    let tmp = runtime.join(TMP_DIR);
    match std::fs::create_dir(&tmp) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(&tmp)?.is_dir() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the package's `tmp` is not a directory",
                ))
            }
        }
        other => other,
    }
}

/// Opens a directory by path for `openat`/`unlinkat` work below it.
pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory `name` inside `parent` without following a link. A directory a job made
/// unreadable (mode 000) is made accessible to its owner first. `chmodat` itself would follow a
/// link, so the entry is checked to be a real directory just before; nothing can swap it in
/// between because the runner's whole process group is stopped before its runtime is removed.
pub(super) fn open_child_dir(parent: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(&parent, name, flags, Mode::empty()) {
        Err(rustix::io::Errno::ACCESS) => {
            let stat = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                return Err(rustix::io::Errno::NOTDIR.into());
            }
            rustix::fs::chmodat(&parent, name, Mode::RWXU, AtFlags::empty())?;
            Ok(rustix::fs::openat(&parent, name, flags, Mode::empty())?)
        }
        other => Ok(other?),
    }
}

/// Removes the entry `name` of `parent`, whatever it is. A directory is emptied through its own
/// descriptor first, level by level without recursion ([`empty_tree`]); anything else, links
/// included, is unlinked as a name. `device` is the mount of the tree `parent` belongs to
/// (`None` for a runtime itself): a directory on another one is a mount point, and removal stops
/// there rather than delete what the mount shows (`rm --one-file-system`), since a privileged
/// job could bind-mount anything into its workspace.
pub(super) fn remove_entry(
    parent: impl AsFd,
    name: &CStr,
    device: Option<MountKey>,
) -> io::Result<Removal> {
    let stat = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(Removal::Absent),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        let dir = open_child_dir(&parent, name)?;
        let here = MountKey::of(&dir)?;
        if device.is_some_and(|d| !d.same_mount(here)) {
            return Err(mount_point());
        }
        empty_tree(dir, here)?;
        rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR)?;
    } else {
        match rustix::fs::unlinkat(&parent, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Removal::Removed)
}

fn mount_point() -> io::Error {
    io::Error::other("a mount point inside the runtime; unmount it and remove the runtime again")
}

/// Which mount a directory is on: its filesystem, and the kernel's mount id where `statx`
/// reports it. The device alone cannot tell a bind mount of the same filesystem from the
/// directory it was mounted on; the mount id can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MountKey {
    pub dev: u64,
    pub mount_id: Option<u64>,
}

impl MountKey {
    /// The mount of the open directory (or file) `fd`. Read from the descriptor, not a name,
    /// so it is the mount of what was opened, whatever the name shows by now.
    pub(super) fn of(fd: impl AsFd) -> io::Result<MountKey> {
        let dev = rustix::fs::fstat(&fd)?.st_dev;
        let stx = rustix::fs::statx(
            &fd,
            c"",
            AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
            rustix::fs::StatxFlags::MNT_ID,
        );
        let mount_id = match stx {
            Ok(stx) if stx.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0 => {
                Some(stx.stx_mnt_id)
            }
            // An older kernel without statx or its mount id: the device still catches most
            // mounts.
            Ok(_) | Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::INVAL) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(MountKey { dev, mount_id })
    }

    /// Whether `other` is on the same mount (unknown mount ids compare by device alone).
    pub(super) fn same_mount(self, other: MountKey) -> bool {
        self.dev == other.dev
            && match (self.mount_id, other.mount_id) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// Gives the directory's owner write and search rights on it (a job may have made it
/// read-only; unlinking needs them on the directory, not on the files).
fn make_writable(dir: &OwnedFd) -> io::Result<()> {
    let mode = rustix::fs::fstat(dir)?.st_mode;
    if mode & RUNTIME_MODE != RUNTIME_MODE {
        rustix::fs::fchmod(dir, Mode::from_raw_mode((mode & 0o7777) | RUNTIME_MODE))?;
    }
    Ok(())
}

/// Removes everything inside the open directory `dir` (on mount `device`), however deep, with a
/// bounded number of open descriptors ([`DirStack`]). Names are collected before anything is
/// removed, since removing while reading can skip entries; a directory is re-read until a read
/// finds it empty (at most [`MAX_EMPTY_PASSES`] times), and only then removed from the one
/// above. A directory on another mount stops the removal; a directory moved while the walk was
/// below it stops it too, and the caller tries again later.
fn empty_tree(dir: OwnedFd, device: MountKey) -> io::Result<()> {
    make_writable(&dir)?;
    let mut walk = DirStack::new(dir)?;
    loop {
        if let Some(name) = walk.next_name() {
            let here = walk.dir()?;
            let stat = match rustix::fs::statat(here, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                match rustix::fs::unlinkat(here, &name, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
                continue;
            }
            let child = open_child_dir(here, &name)?;
            if !device.same_mount(MountKey::of(&child)?) {
                return Err(mount_point());
            }
            make_writable(&child)?;
            walk.descend(child, &name)?;
            continue;
        }
        if walk.reread()? {
            if walk.reads() >= MAX_EMPTY_PASSES {
                return Err(io::Error::other(
                    "entries keep appearing while the directory is removed",
                ));
            }
            continue;
        }
        let Some(done) = walk.ascend()? else {
            return Ok(());
        };
        match rustix::fs::unlinkat(walk.dir()?, &done, AtFlags::REMOVEDIR) {
            // Gone from here already (moved within the tree: a later read of its new place
            // finds it).
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The names in a directory, without `.` and `..`.
pub(super) fn entry_names(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_name_is_the_first_twelve_hex_digits() {
        assert_eq!(
            workspace_name("0123ABCD-ef45-4678-9abc-def012345678").unwrap(),
            "0123abcdef45"
        );
        assert_eq!(workspace_name("0123456789abcdef").unwrap(), "0123456789ab");
        for bad in ["", "0123", "0123456789ag", "../../etc/pw", "0123456789a/"] {
            assert!(
                matches!(workspace_name(bad), Err(WorkspaceError::AttemptId(_))),
                "{bad:?}"
            );
        }
    }
}
