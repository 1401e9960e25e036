//! The store of unpacked images: one directory per image ID (the digest of its config),
//! `<dir>/<hex>/{rootfs/, config.json, unpack.json}`, complete or absent. It owns the commit
//! rule: an image is filled into a private `.staging-*` directory, synced, and renamed to its
//! name in one step, so an error or a crash at any point leaves nothing [`Store::get`] returns;
//! what a crash left (`.staging-*`, `.removing-*`) is removed at the next [`Store::open`]. It
//! does not know where images come from: [`Store::install`]'s caller fills the root (`source`
//! with [`crate::unpack::apply_layer`]).
//!
//! The store directory is root's, mode 0700 (no other user reaches an image through it);
//! inside an entry, `rootfs/` keeps the image's own owners and modes.

#[cfg(test)]
mod tests;

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, Dir, FileType, FlockOperation, Mode, OFlags, RenameFlags};

use crate::reference::Digest;
use crate::unpack::{UnpackReport, remove_tree};

/// The prefix of an entry being filled; renamed to `<hex>` when complete.
const STAGING_PREFIX: &str = ".staging-";

/// The prefix an entry is renamed to before its tree is deleted, so no reader sees it half gone.
const REMOVING_PREFIX: &str = ".removing-";

/// An entry's root filesystem.
const ROOTFS: &str = "rootfs";

/// An entry's image config, byte for byte as the image has it (its digest is the entry's name).
const CONFIG: &str = "config.json";

/// An entry's [`UnpackReport`], as JSON.
const REPORT: &str = "unpack.json";

/// The store directory's mode: root's alone.
const STORE_MODE: u32 = 0o700;

/// The mode of an entry's `rootfs/` until the image's own `./` entry (if any) sets it.
const ROOTFS_MODE: u32 = 0o755;

/// The mode of `config.json` and `unpack.json`.
const META_FILE_MODE: u32 = 0o644;

/// The largest `config.json` read back (an image config is a few KiB; `source` bounds what it
/// accepts far below this).
const MAX_CONFIG_LEN: u64 = 16 << 20;

/// The largest `unpack.json` read back ([`crate::unpack::MAX_REPORTED`] items of a few hundred
/// bytes at most, with room).
const MAX_REPORT_LEN: u64 = 64 << 20;

/// A store of unpacked images in one directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    fd: OwnedFd,
}

/// A complete entry of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    /// The image ID: the digest of [`StoredImage::config_json`].
    pub id: Digest,
    /// `<store>/<hex>`.
    pub dir: PathBuf,
    /// `<store>/<hex>/rootfs`: the image's root filesystem.
    pub rootfs: PathBuf,
    /// The image config, as the image has it (checked against [`StoredImage::id`] when read).
    pub config_json: Vec<u8>,
    /// What unpacking neutralised.
    pub report: UnpackReport,
}

impl Store {
    /// Opens the store at `dir`, making it (and its parents) if missing; the directory is made
    /// ours (the agent runs as root) with mode 0700. What a crash left is removed: staging and
    /// removing directories no live process holds (each holder keeps an `flock` on it).
    pub fn open(dir: &Path) -> io::Result<Store> {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match rustix::fs::mkdir(dir, Mode::from_raw_mode(STORE_MODE)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let stat = rustix::fs::fstat(&fd)?;
        let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
        if stat.st_uid != uid.as_raw() || stat.st_gid != gid.as_raw() {
            rustix::fs::fchown(&fd, Some(uid), Some(gid))?;
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(STORE_MODE))?;
        let store = Store {
            dir: dir.to_path_buf(),
            fd,
        };
        store.remove_leftovers()?;
        Ok(store)
    }

    /// The store at `dir` as it is, for a reader that must change nothing (`rm-agent check`):
    /// not made, its mode not set, no leftover removed; `None` where there is no store.
    pub fn existing(dir: &Path) -> io::Result<Option<Store>> {
        let fd = match rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(Store {
            dir: dir.to_path_buf(),
            fd,
        }))
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The complete entry for `id`, if there is one. An entry that cannot be read back (its
    /// config no longer matching its name, say) is logged and treated as absent.
    pub fn get(&self, id: &Digest) -> Option<StoredImage> {
        match self.read_entry(id) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(image = %id, error = %e, "an image store entry cannot be read");
                None
            }
        }
    }

    /// Installs the image `id` (whose config is `config_json`, checked against `id`): `fill`
    /// unpacks it into the root it is given (a fresh directory in a private staging entry) and
    /// returns what it neutralised; then the config and report are written, everything is
    /// synced, and the entry is renamed into place. An error of `fill` (or of the store) leaves
    /// nothing behind. An entry already present is returned without calling `fill`; of two
    /// concurrent installs of one id, the one that renames second throws its work away and
    /// returns the first one's entry.
    pub fn install<E, F>(&self, id: &Digest, config_json: &[u8], fill: F) -> Result<StoredImage, E>
    where
        E: From<io::Error>,
        F: FnOnce(&Path) -> Result<UnpackReport, E>,
    {
        if Digest::of(config_json) != *id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the config given for image {id} has another digest"),
            )
            .into());
        }
        // An entry that exists but cannot be read is an error, not a reason to unpack again:
        // the rename would fail on it anyway, and removing it is the caller's call (a runner
        // may have it mounted).
        let unreadable = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("the store entry of image {id} cannot be read (remove it): {e}"),
            )
        };
        if let Some(found) = self.read_entry(id).map_err(unreadable)? {
            return Ok(found);
        }
        let staging = Staging::make(self, id)?;
        rustix::fs::mkdirat(&staging.fd, ROOTFS, Mode::from_raw_mode(0o700))
            .map_err(io::Error::from)?;
        let rootfs_fd = rustix::fs::openat(
            &staging.fd,
            ROOTFS,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        // Made 0700 then widened: the mode must not depend on the process umask.
        rustix::fs::fchmod(&rootfs_fd, Mode::from_raw_mode(ROOTFS_MODE))
            .map_err(io::Error::from)?;
        let report = fill(&self.dir.join(&staging.name).join(ROOTFS))?;
        let report_json = serde_json::to_vec_pretty(&report).map_err(io::Error::from)?;
        write_new(&staging.fd, CONFIG, config_json)?;
        write_new(&staging.fd, REPORT, &report_json)?;
        // One syncfs for the whole tree (every file of every layer) before the commit point.
        rustix::fs::syncfs(&staging.fd).map_err(io::Error::from)?;
        let hex = id.hex();
        match rustix::fs::renameat_with(
            &self.fd,
            staging.name.as_str(),
            &self.fd,
            hex.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY) => {
                drop(staging);
                return match self.read_entry(id) {
                    Ok(Some(found)) => Ok(found),
                    Ok(None) => Err(io::Error::other(format!(
                        "image {id} was installed and removed while this install ran"
                    ))
                    .into()),
                    Err(e) => Err(unreadable(e).into()),
                };
            }
            Err(e) => return Err(io::Error::from(e).into()),
        }
        staging.committed();
        rustix::fs::fsync(&self.fd).map_err(io::Error::from)?;
        let dir = self.dir.join(&hex);
        Ok(StoredImage {
            id: *id,
            rootfs: dir.join(ROOTFS),
            dir,
            config_json: config_json.to_vec(),
            report,
        })
    }

    /// The IDs of the complete entries, sorted.
    pub fn list(&self) -> io::Result<Vec<Digest>> {
        let mut ids: Vec<Digest> = names(&self.fd)?
            .iter()
            .filter_map(|name| entry_id(name))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Removes the entry `id`: renamed out of place first (the commit: [`Store::get`] no longer
    /// returns it, crash or not), then its tree deleted without following links. Returns
    /// whether there was one. A runner still using the entry is the caller's to rule out.
    pub fn remove(&self, id: &Digest) -> io::Result<bool> {
        let hex = id.hex();
        let entry = match rustix::fs::openat(
            &self.fd,
            hex.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        // Held until the tree is gone, so an `open` meanwhile leaves it to us.
        rustix::fs::flock(&entry, FlockOperation::LockExclusive)?;
        let name = format!("{REMOVING_PREFIX}{hex}-{}", unique());
        match rustix::fs::renameat(&self.fd, hex.as_str(), &self.fd, name.as_str()) {
            Ok(()) => {}
            Err(rustix::io::Errno::NOENT) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        rustix::fs::fsync(&self.fd)?;
        remove_tree(&self.fd, name.as_bytes())?;
        Ok(true)
    }

    /// Reads the entry `id` back, checking its config against the id.
    fn read_entry(&self, id: &Digest) -> io::Result<Option<StoredImage>> {
        let hex = id.hex();
        let entry = match rustix::fs::openat(
            &self.fd,
            hex.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let config_json = read_bounded(&entry, CONFIG, MAX_CONFIG_LEN)?;
        if Digest::of(&config_json) != *id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{CONFIG} no longer has the entry's digest"),
            ));
        }
        let report: UnpackReport =
            serde_json::from_slice(&read_bounded(&entry, REPORT, MAX_REPORT_LEN)?)?;
        let rootfs = rustix::fs::statat(&entry, ROOTFS, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(rootfs.st_mode) != FileType::Directory {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{ROOTFS} is not a directory"),
            ));
        }
        let dir = self.dir.join(&hex);
        Ok(Some(StoredImage {
            id: *id,
            rootfs: dir.join(ROOTFS),
            dir,
            config_json,
            report,
        }))
    }

    /// Removes the staging and removing directories of processes that are gone (their
    /// `flock` released); one still held is another live process's and is left to it.
    fn remove_leftovers(&self) -> io::Result<()> {
        for name in names(&self.fd)? {
            if !is_leftover(&name) {
                continue;
            }
            let fd = match rustix::fs::openat(
                &self.fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    tracing::info!(store = %self.dir.display(), leftover = %name,
                        "removing what an interrupted install or removal left");
                    remove_tree(&self.fd, name.as_bytes())?;
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// Whether a store directory name is what an install or removal leaves while it runs.
fn is_leftover(name: &str) -> bool {
    name.starts_with(STAGING_PREFIX) || name.starts_with(REMOVING_PREFIX)
}

/// The image ID a store directory name is the entry of, if it is one (`<64 hex>`); staging,
/// removing and download directories are not.
fn entry_id(name: &str) -> Option<Digest> {
    if name.starts_with('.') {
        return None;
    }
    Digest::parse(&format!("sha256:{name}")).ok()
}

/// A name unique to this call: the process, a per-process counter and the time (a pid may be
/// reused after a crash; the time tells the two apart).
fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{n}-{nanos}", std::process::id())
}

/// The names in a directory (`.` and `..` left out; names that are not UTF-8 skipped: the
/// store makes none).
fn names(dir: &impl AsFd) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut entries = Dir::read_from(dir)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        if let Ok(name) = entry.file_name().to_str()
            && name != "."
            && name != ".."
        {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

/// Writes a new file in `dir` and syncs it.
fn write_new(dir: &impl AsFd, name: &str, bytes: &[u8]) -> io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(META_FILE_MODE))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.sync_all()
}

/// Reads a file of `dir`, refusing one longer than `max`.
fn read_bounded(dir: &impl AsFd, name: &str, max: u64) -> io::Result<Vec<u8>> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(max + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is longer than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// A staging directory being filled, locked (`flock`) while this process holds it; removed
/// when dropped unless committed (an error or a panic of the fill leaves nothing).
struct Staging<'s> {
    store: &'s Store,
    name: String,
    fd: OwnedFd,
    committed: bool,
}

impl<'s> Staging<'s> {
    fn make(store: &'s Store, id: &Digest) -> io::Result<Staging<'s>> {
        let name = format!("{STAGING_PREFIX}{}-{}", id.hex(), unique());
        rustix::fs::mkdirat(&store.fd, name.as_str(), Mode::from_raw_mode(0o700))?;
        let opened = rustix::fs::openat(
            &store.fd,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let fd = match opened {
            Ok(fd) => fd,
            Err(e) => {
                let _ = rustix::fs::unlinkat(&store.fd, name.as_str(), AtFlags::REMOVEDIR);
                return Err(e.into());
            }
        };
        let staging = Staging {
            store,
            name,
            fd,
            committed: false,
        };
        // Between the mkdir and this lock, another process's `open` may have taken the new
        // directory for a crash's leftover; then it holds the lock, or has removed the
        // directory (checked below), and this install fails rather than fill a deleted tree.
        rustix::fs::flock(&staging.fd, FlockOperation::NonBlockingLockExclusive)?;
        let here = rustix::fs::statat(&store.fd, staging.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        let held = rustix::fs::fstat(&staging.fd)?;
        if (here.st_dev, here.st_ino) != (held.st_dev, held.st_ino) {
            return Err(io::Error::other(
                "the staging directory was removed by a concurrent open of the store",
            ));
        }
        Ok(staging)
    }

    fn committed(mut self) {
        self.committed = true;
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Err(e) = remove_tree(&self.store.fd, self.name.as_bytes()) {
            tracing::warn!(store = %self.store.dir.display(), staging = %self.name, error = %e,
                "cannot remove a staging directory (the next open of the store will)");
        }
    }
}
