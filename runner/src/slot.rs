//! Persistent slots (CONTRACT §5): `<runner_root>/<policy>/s<N>/`, a runtime whose `_work`
//! outlives its runner, so the next job of the same repository starts with its checkout and
//! caches. Everything else in a slot is one runner's (its registration files, `_diag`, `tmp`,
//! the package copy) and goes after every runner: the slot is scrubbed down to `_work`, and the
//! package is copied in afresh for the next one. Scrubbing works like removing an ephemeral
//! runtime: on directory descriptors, never following a link, stopping at mount points; a
//! `_work` that is not a real directory (a job replaced it with a link) is removed too.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::AsFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType};

use super::workspace::{
    MountKey, RUNTIME_MODE, WORK_FOLDER, check_package, copy_tree, create_tmp, entry_names,
    open_child_dir, open_dir, remove_entry,
};
use super::{Removal, RunnerRoot, Runtime, WorkspaceError};

/// A slot directory's name is this prefix and the slot number.
pub(crate) const SLOT_PREFIX: &str = "s";

/// The lowest slot number not in `held`: a policy's slots are reused from `s0` up, so a policy
/// with `max_runners = N` never has more than N slot directories.
pub fn free_slot(held: &[u32]) -> u32 {
    (0..).find(|n| !held.contains(n)).unwrap_or(u32::MAX)
}

/// The slot number of a slot directory name (`s3` → 3).
pub fn slot_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(SLOT_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `<root>/<policy>/s<slot>`, where `policy`'s slot `slot` lives under the runner root `root`.
/// Pure; [`RunnerRoot::slot_path`] checks the policy's name too.
pub(crate) fn slot_dir(root: &Path, policy: &str, slot: u32) -> PathBuf {
    root.join(policy).join(format!("{SLOT_PREFIX}{slot}"))
}

/// Whether `name` can be a policy's directory: the configuration allows letters, digits, `-`
/// and `_`; checked again here because a slot path is built from it.
fn is_policy_dir(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
}

impl RunnerRoot {
    /// Where `policy`'s slot `slot` lives; touches nothing.
    pub fn slot_path(&self, policy: &str, slot: u32) -> Result<PathBuf, WorkspaceError> {
        let path = slot_dir(self.path(), policy, slot);
        if is_policy_dir(OsStr::new(policy)) {
            Ok(path)
        } else {
            Err(self.not_a_slot(&path))
        }
    }

    /// Makes the slot at `runtime` ready for a runner: creates it (mode 0700) if needed,
    /// scrubs whatever a crash left besides `_work`, copies the package in and creates `tmp/`.
    /// A package with a top-level `_work` is refused before anything is touched.
    pub fn prepare_slot(&self, runtime: &Path, package: &Path) -> Result<Runtime, WorkspaceError> {
        check_package(package)?;
        self.prepare_slot_with(runtime, |runtime| {
            copy_tree(package, runtime).and_then(|()| create_tmp(runtime))
        })
    }

    /// [`RunnerRoot::prepare_slot`] with `fill` putting the runtime's contents beside `_work`.
    pub(crate) fn prepare_slot_with(
        &self,
        runtime: &Path,
        fill: impl FnOnce(&Path) -> io::Result<()>,
    ) -> Result<Runtime, WorkspaceError> {
        self.slot_names(runtime)?;
        let copy_error = |source| WorkspaceError::Copy {
            runtime: runtime.to_path_buf(),
            source,
        };
        for dir in [runtime.parent().unwrap_or(runtime), runtime] {
            create_real_dir(dir).map_err(copy_error)?;
        }
        self.scrub_slot(runtime)?;
        if let Err(source) = fill(runtime) {
            if let Err(e) = self.scrub_slot(runtime) {
                tracing::warn!(error = %e, "cannot scrub a half-made slot");
            }
            return Err(copy_error(source));
        }
        Ok(Runtime::at(runtime.to_path_buf()))
    }

    /// Removes everything in the slot at `runtime` but its `_work` directory. An absent slot is
    /// fine ([`Removal::Absent`]); a path that is not `<root>/<policy>/s<N>` is refused.
    pub fn scrub_slot(&self, runtime: &Path) -> Result<Removal, WorkspaceError> {
        let (policy, slot) = self.slot_names(runtime)?;
        let fail = |source| WorkspaceError::Remove {
            runtime: runtime.to_path_buf(),
            source,
        };
        let c_name =
            |name: &OsStr| CString::new(name.as_bytes()).map_err(|e| fail(io::Error::other(e)));
        let root = open_dir(self.path()).map_err(fail)?;
        let policy_dir = match open_child_dir(root.as_fd(), &c_name(policy)?) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Absent),
            Err(e) => return Err(fail(e)),
        };
        let slot = c_name(slot)?;
        match rustix::fs::statat(&policy_dir, &slot, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {}
            Ok(_) => {
                // Not a directory (a link a job planted): it is no slot, remove the name.
                return remove_entry(&policy_dir, &slot, None).map_err(fail);
            }
            Err(rustix::io::Errno::NOENT) => return Ok(Removal::Absent),
            Err(e) => return Err(fail(e.into())),
        }
        let slot_dir = open_child_dir(&policy_dir, &slot).map_err(fail)?;
        let device = MountKey::of(&slot_dir).map_err(fail)?;
        for name in entry_names(&slot_dir).map_err(fail)? {
            if name.to_bytes() == WORK_FOLDER.as_bytes() && is_real_dir(&slot_dir, &name) {
                continue;
            }
            remove_entry(&slot_dir, &name, Some(device)).map_err(fail)?;
        }
        Ok(Removal::Removed)
    }

    /// The policy and slot names of `path`, if it is `<root>/<policy>/s<N>`.
    fn slot_names<'p>(&self, path: &'p Path) -> Result<(&'p OsStr, &'p OsStr), WorkspaceError> {
        let refuse = || self.not_a_slot(path);
        let mut components = path.components().rev();
        let (Some(Component::Normal(slot)), Some(Component::Normal(policy))) =
            (components.next(), components.next())
        else {
            return Err(refuse());
        };
        let grandparent = path.parent().and_then(Path::parent).ok_or_else(refuse)?;
        // A parent that cannot be resolved cannot be shown to be the root.
        let grandparent = grandparent.canonicalize().map_err(|_| refuse())?;
        let slot_ok = slot.to_str().and_then(slot_number).is_some();
        if grandparent == self.path() && slot_ok && is_policy_dir(policy) {
            Ok((policy, slot))
        } else {
            Err(refuse())
        }
    }

    fn not_a_slot(&self, path: &Path) -> WorkspaceError {
        WorkspaceError::NotASlot {
            path: path.to_path_buf(),
            root: self.path().to_path_buf(),
        }
    }
}

/// Creates `dir` (mode 0700) unless a real directory is there; anything else there is an error.
fn create_real_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(RUNTIME_MODE).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if std::fs::symlink_metadata(dir)?.is_dir() {
                Ok(())
            } else {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is there but is not a directory", dir.display()),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

fn is_real_dir(parent: &impl std::os::fd::AsFd, name: &std::ffi::CStr) -> bool {
    rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::Directory)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn package(dir: &Path) -> PathBuf {
        let package = dir.join("package");
        std::fs::create_dir_all(package.join("bin")).unwrap();
        std::fs::write(package.join("bin").join("Runner.Listener"), "#!/bin/sh\n").unwrap();
        std::fs::write(package.join("config.sh"), "x").unwrap();
        package
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn slots_are_reused_lowest_first() {
        assert_eq!(free_slot(&[]), 0);
        assert_eq!(free_slot(&[0, 1, 3]), 2);
        assert_eq!(free_slot(&[1]), 0);
        assert_eq!(slot_number("s12"), Some(12));
        for bad in ["s", "12", "s1x", "s-1", "t1"] {
            assert_eq!(slot_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_scrubbed_slot_keeps_only_its_work_folder_and_follows_no_link() {
        let tmp = tempfile::tempdir().unwrap();
        let root = RunnerRoot::open(&tmp.path().join("runners")).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "not the slot's").unwrap();
        let slot = root.slot_path("widgets", 0).unwrap();
        let runtime = root.prepare_slot(&slot, &package(tmp.path())).unwrap();
        assert_eq!(names(runtime.dir()), ["bin", "config.sh", "tmp"]);

        // What a runner and its job leave behind.
        std::fs::create_dir_all(slot.join("_work/widgets/widgets")).unwrap();
        std::fs::write(slot.join("_work/widgets/widgets/job.txt"), "job 1").unwrap();
        symlink(&outside, slot.join("_work/link-out")).unwrap();
        std::fs::create_dir(slot.join("_diag")).unwrap();
        std::fs::write(slot.join(".runner"), "{}").unwrap();
        symlink(&outside, slot.join("escape")).unwrap();

        assert_eq!(root.scrub_slot(&slot).unwrap(), Removal::Removed);
        assert_eq!(names(&slot), ["_work"]);
        assert_eq!(
            std::fs::read_to_string(slot.join("_work/widgets/widgets/job.txt")).unwrap(),
            "job 1"
        );
        assert!(outside.join("keep.txt").exists(), "a link was followed");

        // The next runner gets a fresh package beside the kept checkout.
        root.prepare_slot(&slot, &package(tmp.path())).unwrap();
        assert_eq!(names(&slot), ["_work", "bin", "config.sh", "tmp"]);
    }

    #[test]
    fn a_work_folder_replaced_by_a_link_is_removed_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = RunnerRoot::open(&tmp.path().join("runners")).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "x").unwrap();
        let slot = root.slot_path("widgets", 1).unwrap();
        root.prepare_slot(&slot, &package(tmp.path())).unwrap();
        symlink(&outside, slot.join("_work")).unwrap();
        root.scrub_slot(&slot).unwrap();
        assert!(names(&slot).is_empty());
        assert!(outside.join("keep.txt").exists());
    }

    #[test]
    fn only_slot_paths_inside_the_root_are_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let root = RunnerRoot::open(&tmp.path().join("runners")).unwrap();
        assert!(root.slot_path("../etc", 0).is_err());
        assert!(root.slot_path("", 0).is_err());
        for bad in [
            tmp.path().join("runners").join("widgets"),
            tmp.path().join("runners").join("widgets").join("x1"),
            tmp.path().join("elsewhere").join("widgets").join("s0"),
            tmp.path()
                .join("runners")
                .join("a")
                .join("widgets")
                .join("s0"),
            PathBuf::from("/"),
        ] {
            assert!(
                matches!(root.scrub_slot(&bad), Err(WorkspaceError::NotASlot { .. })),
                "{}",
                bad.display()
            );
        }
        // An absent slot is nothing to scrub.
        let absent = root.slot_path("widgets", 7).unwrap();
        assert_eq!(root.scrub_slot(&absent).unwrap(), Removal::Absent);
    }

    #[test]
    fn a_package_with_a_work_folder_is_refused_before_the_slot_is_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let root = RunnerRoot::open(&tmp.path().join("runners")).unwrap();
        let package = package(tmp.path());
        std::fs::create_dir(package.join("_work")).unwrap();
        let slot = root.slot_path("widgets", 0).unwrap();
        assert!(matches!(
            root.prepare_slot(&slot, &package),
            Err(WorkspaceError::PackageHasWorkFolder { .. })
        ));
        assert!(!slot.exists());
    }
}
