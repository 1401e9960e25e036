//! The package cache, `<data_dir>/packages/`: one unpacked directory per package name, made
//! whole or not at all. A download goes to `.partial-<name>`, is unpacked into
//! `.unpack-<name>/`, gets the completion marker written last, and is renamed into place in one
//! step; whatever a crash leaves under a `.partial-`/`.unpack-` name is removed by the next
//! attempt. A directory without its marker is not a package.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::process::LISTENER;

/// The cache's folder in the data directory.
pub(crate) const PACKAGES_DIR: &str = "packages";
/// Written last into a package's directory, holding the SHA-256 its archive was verified
/// against: its presence means the directory is complete.
pub const COMPLETE_MARKER: &str = ".rm-package-complete";
/// Prefix of a download in progress (or left by a crash).
const PARTIAL_PREFIX: &str = ".partial-";
/// Prefix of an unpacking in progress (or left by a crash).
const UNPACK_PREFIX: &str = ".unpack-";

/// A package found complete in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    pub dir: PathBuf,
    /// The SHA-256 of the archive it was unpacked from.
    pub sha256: String,
}

/// `<data_dir>/packages/`.
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    root: PathBuf,
}

impl Cache {
    pub(crate) fn new(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join(PACKAGES_DIR),
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// Where the package `name` lives once complete.
    pub(crate) fn package_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Where its archive is downloaded to.
    pub(crate) fn partial_file(&self, name: &str) -> PathBuf {
        self.root.join(format!("{PARTIAL_PREFIX}{name}"))
    }

    /// Where its archive is unpacked before it is renamed into place.
    pub(crate) fn unpack_dir(&self, name: &str) -> PathBuf {
        self.root.join(format!("{UNPACK_PREFIX}{name}"))
    }

    /// The package `name`, if it is in the cache and complete. Reads two small files; makes no
    /// request.
    pub(crate) fn complete(&self, name: &str) -> Option<Cached> {
        let dir = self.package_dir(name);
        let sha256 = is_complete(&dir)?;
        Some(Cached { dir, sha256 })
    }

    /// Makes the cache directory and removes what an interrupted attempt left: every
    /// `.partial-*` and `.unpack-*`, and the directory of `name` if it is there without its
    /// marker (which a rename never leaves, but a hand-made copy might). The caller holds the
    /// data directory's lock, so no other attempt is running.
    pub(crate) fn prepare(&self, name: &str) -> io::Result<()> {
        std::fs::create_dir_all(&self.root)?;
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            let file_name = entry.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with(PARTIAL_PREFIX) || file_name.starts_with(UNPACK_PREFIX) {
                remove_any(&entry.path())?;
            }
        }
        let dir = self.package_dir(name);
        if dir.symlink_metadata().is_ok() && is_complete(&dir).is_none() {
            tracing::warn!(dir = %dir.display(), "removing an incomplete runner package");
            remove_any(&dir)?;
        }
        Ok(())
    }

    /// Moves the unpacked `name` into place: writes the marker with `sha256` into the unpack
    /// directory, flushes the file system, renames the directory to its final name (one step:
    /// a crash before leaves no package, after a complete one), and drops the archive.
    pub(crate) fn commit(&self, name: &str, sha256: &str) -> io::Result<PathBuf> {
        let unpacked = self.unpack_dir(name);
        let mut marker = std::fs::File::create(unpacked.join(COMPLETE_MARKER))?;
        marker.write_all(format!("{sha256}\n").as_bytes())?;
        marker.sync_all()?;
        drop(marker);
        // The rename must not reach the disk before the files it publishes do.
        flush_file_system(&unpacked)?;
        let dir = self.package_dir(name);
        std::fs::rename(&unpacked, &dir)?;
        std::fs::File::open(&self.root)?.sync_all()?;
        remove_any(&self.partial_file(name))?;
        Ok(dir)
    }

    /// Removes the package `name` whole (a superseded one nothing uses any more: see
    /// [`super::latest`]). Absent is fine.
    pub(crate) fn remove_package(&self, name: &str) -> io::Result<()> {
        remove_any(&self.package_dir(name))
    }

    /// Removes what a failed attempt at `name` wrote (its archive and unpack directory).
    pub(crate) fn discard(&self, name: &str) {
        for path in [self.partial_file(name), self.unpack_dir(name)] {
            if let Err(e) = remove_any(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a failed runner package download; the next attempt retries");
            }
        }
    }
}

/// The SHA-256 in `dir`'s marker, if `dir` is a complete package: the marker holds one
/// checksum and the runner's `bin/Runner.Listener` is a file.
pub(crate) fn is_complete(dir: &Path) -> Option<String> {
    let meta = dir.symlink_metadata().ok()?;
    if !meta.is_dir() {
        return None;
    }
    let marker = std::fs::read_to_string(dir.join(COMPLETE_MARKER)).ok()?;
    let sha256 = marker.trim();
    let well_formed = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
    let listener = std::fs::metadata(dir.join(LISTENER)).is_ok_and(|m| m.is_file());
    (well_formed && listener).then(|| sha256.to_owned())
}

/// Removes a file, a link or a directory tree (links inside are removed, never followed);
/// absent is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    let result = match path.symlink_metadata() {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Flushes the file system holding `dir` (one `syncfs` rather than an `fsync` per file of a
/// package of thousands).
fn flush_file_system(dir: &Path) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let fd = std::fs::File::open(dir)?;
        rustix::fs::syncfs(&fd)?;
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = dir;
        rustix::fs::sync();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "actions-runner-linux-x64-2.330.0";

    fn sha() -> String {
        "ab".repeat(32)
    }

    /// A cache with `name` unpacked (a listener in it), not yet committed.
    fn unpacked(cache: &Cache) {
        let dir = cache.unpack_dir(NAME);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join(LISTENER), b"#!/bin/sh\n").unwrap();
        std::fs::write(cache.partial_file(NAME), b"archive").unwrap();
    }

    #[test]
    fn a_committed_package_is_complete_and_its_leftovers_are_gone() {
        let data = tempfile::tempdir().unwrap();
        let cache = Cache::new(data.path());
        assert_eq!(cache.complete(NAME), None);
        cache.prepare(NAME).unwrap();
        unpacked(&cache);
        assert_eq!(cache.complete(NAME), None, "not before the commit");
        let dir = cache.commit(NAME, &sha()).unwrap();
        assert_eq!(dir, data.path().join("packages").join(NAME));
        assert_eq!(
            cache.complete(NAME),
            Some(Cached {
                dir: dir.clone(),
                sha256: sha()
            })
        );
        assert!(!cache.partial_file(NAME).exists());
        assert!(!cache.unpack_dir(NAME).exists());
    }

    #[test]
    fn a_directory_without_its_marker_or_listener_is_not_complete() {
        let data = tempfile::tempdir().unwrap();
        let cache = Cache::new(data.path());
        let dir = cache.package_dir(NAME);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join(LISTENER), b"x").unwrap();
        assert_eq!(cache.complete(NAME), None, "no marker");
        std::fs::write(dir.join(COMPLETE_MARKER), "not a checksum\n").unwrap();
        assert_eq!(cache.complete(NAME), None, "a marker without a checksum");
        std::fs::write(dir.join(COMPLETE_MARKER), sha()).unwrap();
        assert!(cache.complete(NAME).is_some());
        std::fs::remove_file(dir.join(LISTENER)).unwrap();
        assert_eq!(cache.complete(NAME), None, "no listener");
    }

    #[test]
    fn prepare_removes_what_a_crash_left_and_keeps_complete_packages() {
        let data = tempfile::tempdir().unwrap();
        let cache = Cache::new(data.path());
        cache.prepare(NAME).unwrap();
        // A complete package of another version stays.
        let other = "actions-runner-linux-x64-2.329.0";
        std::fs::create_dir_all(cache.unpack_dir(other).join("bin")).unwrap();
        std::fs::write(cache.unpack_dir(other).join(LISTENER), b"x").unwrap();
        cache.commit(other, &sha()).unwrap();
        // A crash mid-download, one mid-unpack (with a read-only file in it), and a stray
        // directory at the final name without a marker.
        unpacked(&cache);
        let locked = cache.unpack_dir(NAME).join("locked");
        std::fs::write(&locked, b"x").unwrap();
        std::fs::set_permissions(&locked, std::os::unix::fs::PermissionsExt::from_mode(0o444))
            .unwrap();
        std::fs::create_dir_all(cache.package_dir(NAME).join("bin")).unwrap();

        cache.prepare(NAME).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(cache.root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec![other.to_owned()]);
        assert!(cache.complete(other).is_some());
    }

    #[test]
    fn discard_removes_a_failed_attempt() {
        let data = tempfile::tempdir().unwrap();
        let cache = Cache::new(data.path());
        cache.prepare(NAME).unwrap();
        unpacked(&cache);
        cache.discard(NAME);
        assert_eq!(std::fs::read_dir(cache.root()).unwrap().count(), 0);
    }
}
