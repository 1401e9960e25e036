//! The runner package store: one agent-owned, read-only copy of each package content under
//! `<runner_root>/.rm-package/<digest>/` (the tree and its [`Manifest`]), and the runtimes made
//! from it by hard links rather than copies.
//!
//! Why: a runtime used to get a full copy of the package (about 400 MB per job), and a job
//! running as the agent's user could rewrite the package the next runners start from. A stored
//! tree is written once, with modes no runner can change (owned by the agent, nothing writable
//! by group or other, files read-only), inside a directory no runner can enter; a runtime gets
//! the same inodes through hard links in directories of its own, so creating one copies no byte
//! and checking one ([`StoredPackage::verify_runtime`]) is a stat per entry.
//!
//! Every walk works on directory descriptors (`openat(O_NOFOLLOW)`, `linkat`, `mkdirat`), in the
//! manifest's depth-first order, so a name is never resolved through a link and no path string is
//! resolved again below the directory it was opened from.

pub(crate) mod manifest;
pub mod redirect;
#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sha2::{Digest as _, Sha256};

pub use manifest::{Entry, EntryKind, Manifest, ManifestError};

use super::workspace::{entry_names, open_dir, remove_entry};
use manifest::{DIR_MODE, MAX_DEPTH, name_of, parent_of, stored_mode};

/// The store's folder inside the runner root: one agent-owned tree per package content.
pub const STORE_DIR: &str = ".rm-package";

/// The manifest file written next to a stored tree.
pub(crate) const MANIFEST_FILE: &str = "manifest.json";

/// The stored tree's folder inside `<store>/<digest>/`.
pub(crate) const TREE_DIR: &str = "tree";

/// Mode of the store's folder: only the agent may list or enter it, so a runner reaches package
/// files only through the links in its own runtime.
pub(crate) const STORE_MODE: u32 = 0o700;

/// Prefix of the folder a tree is built in before it is renamed to its digest in one step. Any
/// name in the store but the current digest is removed by the next install, so a build cut
/// short by a crash leaves nothing behind for long.
const STAGING_PREFIX: &str = ".staging-";

/// Read size while hashing and copying: large enough that syscalls are not the cost, small
/// enough to stay in cache between the hash and the write.
const BUFFER_SIZE: usize = 64 * 1024;

/// Flags for opening a directory below one already open: never through a link.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Flags for reading a file below an open directory: never through a link.
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The manifest the unpacked package at `source` is stored under: every entry scanned (never
/// through a link) and hashed, with the modes the store gives it. Its digest names the stored
/// tree ([`Store::install`]) and what `check` calls the package (`redirect::source_digest`).
pub(crate) fn source_manifest(source: &Path, buf: &mut [u8]) -> Result<Manifest, StoreError> {
    let found = scan(source, buf).map_err(|e| e.into_source_error(source))?;
    Ok(Manifest {
        entries: found
            .into_iter()
            .map(|f| Entry {
                mode: stored_mode(&f.entry.kind, f.entry.mode),
                ..f.entry
            })
            .collect(),
    })
}

/// How an entry on disk differs from the manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Difference {
    #[error("it is missing")]
    Missing,
    #[error("it is not in the manifest")]
    Extra,
    #[error("it is a {found}, the manifest has a {expected}")]
    Kind {
        expected: &'static str,
        found: &'static str,
    },
    #[error("its mode is {found:o}, the manifest has {expected:o}")]
    Mode { expected: u32, found: u32 },
    #[error("it is owned by uid {uid}, not by the agent's user")]
    Owner { uid: u32 },
    #[error("it has {found} bytes, the manifest has {expected}")]
    Size { expected: u64, found: u64 },
    #[error("its content does not have the manifest's SHA-256")]
    Content,
    #[error("it points to {found:?}, the manifest has {expected:?}")]
    Target { expected: String, found: String },
    #[error("it is not the stored file (another inode)")]
    Inode,
}

/// What can go wrong with the store, a stored package, or a runtime made from it. Paths are the
/// agent's own (the store, the package, a runtime) and the package's entry paths.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the package store {dir} cannot be created or opened: {source}; check `host.runner_root` and its permissions"
    )]
    Open { dir: PathBuf, source: io::Error },
    #[error(
        "the package store {dir} is owned by uid {uid}, not by the agent's user; remove it (the agent creates it again)"
    )]
    NotOwned { dir: PathBuf, uid: u32 },
    #[error(
        "cannot read {path} in the runner package {package}: {source}; check `runner.package_dir` and its permissions"
    )]
    Source {
        package: PathBuf,
        path: String,
        source: io::Error,
    },
    #[error("the runner package {package} is not stored: a job could change it: {why}")]
    Changeable { package: PathBuf, why: String },
    #[error(
        "the runner package {package} has a top-level `_work` folder; remove it from the package (the runner creates its own)"
    )]
    WorkFolder { package: PathBuf },
    #[error(
        "{path} in the runner package {package} is not a file, directory or symbolic link; remove it from the package"
    )]
    Unsupported { package: PathBuf, path: String },
    #[error("a name in {dir} of the runner package {package} is not UTF-8; rename it")]
    NotUtf8 { package: PathBuf, dir: String },
    #[error(
        "the runner package {package} nests more than {MAX_DEPTH} levels deep at {path}; flatten it"
    )]
    TooDeep { package: PathBuf, path: String },
    #[error(
        "the runner package {package} changed at {path} while it was installed; install it again once nothing writes to it"
    )]
    Changed { package: PathBuf, path: String },
    #[error(
        "cannot write the package store {dir}: {source}; check the free space and permissions of the runner root"
    )]
    Write { dir: PathBuf, source: io::Error },
    #[error(
        "cannot read the stored package {tree} at {path}: {source}; the next install rebuilds it"
    )]
    TreeRead {
        tree: PathBuf,
        path: String,
        source: io::Error,
    },
    #[error(
        "the stored manifest {manifest} cannot be used: {reason}; the next install rebuilds it"
    )]
    Manifest { manifest: PathBuf, reason: String },
    #[error(
        "the stored package {tree} differs from its manifest at {path}: {difference}; the next install (an agent restart) rebuilds it"
    )]
    Tampered {
        tree: PathBuf,
        path: String,
        difference: Difference,
    },
    #[error(
        "the runtime {runtime} is on another filesystem than the package store {store}, and hard links cannot cross filesystems; keep the runner root on one filesystem"
    )]
    CrossDevice { runtime: PathBuf, store: PathBuf },
    #[error(
        "the runtime {runtime} already has {path}, which the runner package provides; remove it from the runtime"
    )]
    RuntimeEntryExists { runtime: PathBuf, path: String },
    #[error(
        "cannot populate the runtime {runtime} at {path}: {source}; remove the runtime and create it again"
    )]
    Link {
        runtime: PathBuf,
        path: String,
        source: io::Error,
    },
    #[error(
        "the runtime {runtime} does not match the stored package at {path}: {difference}; remove the runtime and create it again"
    )]
    RuntimeMismatch {
        runtime: PathBuf,
        path: String,
        difference: Difference,
    },
    #[error(
        "cannot check the runtime {runtime} at {path}: {source}; remove the runtime and create it again"
    )]
    RuntimeRead {
        runtime: PathBuf,
        path: String,
        source: io::Error,
    },
}

/// The package store of one runner root.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A package in the store, verified when it was installed.
#[derive(Debug, Clone)]
pub struct StoredPackage {
    tree: PathBuf,
    manifest: Arc<Manifest>,
    /// The tree's filesystem and, per manifest entry, a file's inode (0 for other kinds): what
    /// a runtime's links must be.
    dev: u64,
    inodes: Arc<[u64]>,
    /// The cache-redirected package derived from this one, once this process made or verified
    /// it ([`StoredPackage::redirected`]); shared by clones.
    redirect: Arc<Mutex<Option<StoredPackage>>>,
}

impl Store {
    /// `<runner_root>/.rm-package`, created mode 0700 owned by the agent: no runner can list or
    /// enter it (runners reach package files only through the hard links in their own runtime,
    /// whose permission checks use the runtime's path). An existing one must be a directory (not
    /// a link) owned by the agent's user; its mode is set back to 0700.
    pub fn open(runner_root: &Path) -> Result<Store, StoreError> {
        let dir = runner_root.join(STORE_DIR);
        let fail = |source| StoreError::Open {
            dir: dir.clone(),
            source,
        };
        std::fs::create_dir_all(runner_root).map_err(fail)?;
        match std::fs::DirBuilder::new().mode(STORE_MODE).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail(e)),
        }
        let meta = std::fs::symlink_metadata(&dir).map_err(fail)?;
        if !meta.is_dir() {
            return Err(fail(io::Error::new(
                io::ErrorKind::NotADirectory,
                "not a directory (a link is not followed)",
            )));
        }
        if meta.uid() != euid() {
            return Err(StoreError::NotOwned {
                dir,
                uid: meta.uid(),
            });
        }
        // Also undoes a umask that took bits off, or a mode someone widened.
        if meta.mode() & 0o7777 != STORE_MODE {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(STORE_MODE))
                .map_err(fail)?;
        }
        Ok(Store { dir })
    }

    /// The store's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Installs the unpacked package at `source` once: walks it (never following links; a
    /// socket/device/fifo is refused; a top-level `_work` is refused), copies it into
    /// `<store>/<digest>/tree/` (staged under a temp name, renamed into place in one step,
    /// manifest written with the tree) with modes normalised so no runner can change anything
    /// (see [`manifest::stored_mode`]). If `<store>/<digest>` already exists its manifest is
    /// read and the tree verified (full hashes); a mismatch (someone changed it) is logged
    /// naming the first differing path and the tree is rebuilt from `source`. Stale trees of
    /// other digests are removed unless a runtime still links them ([`tree_in_use`]; no runtime
    /// may be created meanwhile). Returns the stored package.
    ///
    /// Nothing is fsynced: a tree a crash left short fails the verification of the next install,
    /// which rebuilds it.
    pub fn install(&self, source: &Path) -> Result<StoredPackage, StoreError> {
        let package = self.install_beside(source)?;
        self.remove_unused(&[package.digest()], Leftovers::Remove);
        Ok(package)
    }

    /// [`Store::install`] that leaves every other tree in place: for a package that replaces
    /// the current one while runtimes may still be made from that (`runner.version =
    /// "latest"`); [`Store::remove_unused`] removes the superseded one later.
    pub(crate) fn install_beside(&self, source: &Path) -> Result<StoredPackage, StoreError> {
        check_source(source)?;
        let mut buf = vec![0; BUFFER_SIZE];
        let manifest = source_manifest(source, &mut buf)?;
        let digest = manifest.digest();
        let stored = self.dir.join(&digest);
        let existing = match std::fs::symlink_metadata(&stored) {
            Ok(_) => match self.load(&digest, &manifest, &mut buf) {
                Ok(package) => Some(package),
                Err(e) => {
                    tracing::warn!(
                        tree = %stored.display(),
                        path = e.differing_path().unwrap_or("?"),
                        error = %e,
                        "the stored runner package was changed; rebuilding it from the package"
                    );
                    self.remove(&digest)?;
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(source) => return Err(self.write_error(source)),
        };
        let package = match existing {
            Some(package) => package,
            None => self.build(source, &digest, manifest, &mut buf)?,
        };
        Ok(package)
    }

    /// Reads back `<store>/<digest>` and verifies it fully against `expected` (the source's
    /// manifest, whose digest names it).
    fn load(
        &self,
        digest: &str,
        expected: &Manifest,
        buf: &mut [u8],
    ) -> Result<StoredPackage, StoreError> {
        let path = self.dir.join(digest).join(MANIFEST_FILE);
        let bad = |reason: String| StoreError::Manifest {
            manifest: path.clone(),
            reason,
        };
        let bytes = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        manifest.validate().map_err(|e| bad(e.to_string()))?;
        if manifest != *expected {
            return Err(bad("it is not the package's manifest".into()));
        }
        let tree = self.dir.join(digest).join(TREE_DIR);
        let (dev, found) = check_tree(&tree, &manifest, buf)?;
        Ok(StoredPackage {
            tree,
            inodes: inodes_of(&manifest, found.iter().map(|f| f.ino)),
            manifest: Arc::new(manifest),
            dev,
            redirect: Arc::default(),
        })
    }

    /// Copies `source` into a staging folder along `manifest` (checking every byte against it
    /// again), writes the manifest next to the tree, and renames the folder to `digest`.
    fn build(
        &self,
        source: &Path,
        digest: &str,
        manifest: Manifest,
        buf: &mut [u8],
    ) -> Result<StoredPackage, StoreError> {
        // Removed on drop if anything below fails.
        let staging = Staging::create(self)?;
        let staged_tree = staging.path().join(TREE_DIR);
        std::fs::create_dir(&staged_tree).map_err(|e| self.write_error(e))?;
        std::fs::set_permissions(&staged_tree, std::fs::Permissions::from_mode(DIR_MODE))
            .map_err(|e| self.write_error(e))?;
        let inodes = copy_package(source, &staged_tree, &manifest, buf, &self.dir)?;
        let manifest_path = staging.path().join(MANIFEST_FILE);
        let write_manifest = || -> io::Result<()> {
            let mut file = File::create_new(&manifest_path)?;
            file.write_all(&manifest.canonical_bytes())?;
            file.set_permissions(std::fs::Permissions::from_mode(manifest::FILE_MODE))
        };
        write_manifest().map_err(|e| self.write_error(e))?;
        let dev = std::fs::symlink_metadata(&staged_tree)
            .map_err(|e| self.write_error(e))?
            .dev();
        let stored = self.dir.join(digest);
        std::fs::rename(staging.path(), &stored).map_err(|e| self.write_error(e))?;
        // Renamed: there is nothing left at the staging path to remove.
        staging.keep();
        tracing::info!(
            tree = %stored.display(),
            files = manifest.entries.len(),
            bytes = manifest.total_size(),
            "stored the runner package"
        );
        Ok(StoredPackage {
            tree: stored.join(TREE_DIR),
            manifest: Arc::new(manifest),
            dev,
            inodes,
            redirect: Arc::default(),
        })
    }

    /// Removes `<store>/<name>` whole (never following a link in it).
    fn remove(&self, name: &str) -> Result<(), StoreError> {
        let store = open_dir(&self.dir).map_err(|e| self.write_error(e))?;
        let name = CString::new(name).map_err(|e| self.write_error(io::Error::other(e)))?;
        remove_entry(store.as_fd(), &name, None).map_err(|e| self.write_error(e))?;
        Ok(())
    }

    /// Removes everything in the store but the digests in `keep` (with the trees derived from
    /// them by the current [`redirect::DERIVATION`]) and the trees a runtime still links
    /// ([`tree_in_use`]: a runner finishes on the package it started from): trees of
    /// packages no longer configured and, with [`Leftovers::Remove`], staging folders a crash left
    /// (only where no build can be under way: at start). Returns the names removed. A failure
    /// only costs space, so it is logged, not returned.
    pub(crate) fn remove_unused(&self, keep: &[String], leftovers: Leftovers) -> Vec<String> {
        let mut removed = Vec::new();
        let names = match open_dir(&self.dir).and_then(|store| entry_names(&store)) {
            Ok(names) => names,
            Err(e) => {
                tracing::warn!(store = %self.dir.display(), error = %e, "cannot list the package store for stale trees");
                return removed;
            }
        };
        for name in names {
            if keep.iter().any(|k| {
                name.to_bytes() == k.as_bytes() || redirect::is_derived_of(name.to_bytes(), k)
            }) {
                continue;
            }
            let shown = name.to_string_lossy().into_owned();
            if shown.starts_with(STAGING_PREFIX) && leftovers == Leftovers::Keep {
                continue;
            }
            if !shown.starts_with(STAGING_PREFIX)
                && tree_in_use(&self.dir.join(&shown).join(TREE_DIR))
            {
                tracing::debug!(name = %shown, "a superseded stored runner package is still linked by a runtime; kept");
                continue;
            }
            match self.remove(&shown) {
                Ok(()) => {
                    tracing::info!(store = %self.dir.display(), name = %shown, "removed a stale stored runner package");
                    removed.push(shown);
                }
                Err(e) => {
                    tracing::warn!(error = %e, name = %shown, "cannot remove a stale stored runner package")
                }
            }
        }
        removed
    }

    fn write_error(&self, source: io::Error) -> StoreError {
        StoreError::Write {
            dir: self.dir.clone(),
            source,
        }
    }
}

/// The folder a tree is built in (`<store>/.staging-<random>`, mode [`STAGING_MODE`]), removed
/// when dropped unless kept. Made here rather than with a temporary-directory crate so the
/// product does not depend on one; the removal walks by descriptors like every other.
struct Staging<'a> {
    store: &'a Store,
    name: String,
    path: PathBuf,
    kept: bool,
}

/// Mode of a staging folder, and so of a stored `<digest>/` folder: the agent's alone.
const STAGING_MODE: u32 = 0o700;

impl<'a> Staging<'a> {
    fn create(store: &'a Store) -> Result<Staging<'a>, StoreError> {
        // A fresh random name: never one a crashed build left (those go at the next install).
        let name = format!("{STAGING_PREFIX}{}", rm_journal::AttemptId::generate());
        let path = store.dir.join(&name);
        std::fs::DirBuilder::new()
            .mode(STAGING_MODE)
            .create(&path)
            .map_err(|e| store.write_error(e))?;
        Ok(Staging {
            store,
            name,
            path,
            kept: false,
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// The folder was renamed away: nothing to remove.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // A failure only costs space, and the next install removes it.
        if let Err(e) = self.store.remove(&self.name) {
            tracing::warn!(error = %e, "cannot remove a runner package staging folder");
        }
    }
}

impl StoredPackage {
    /// The stored tree (inside the store: only the agent can reach it by this path).
    pub fn tree(&self) -> &Path {
        &self.tree
    }

    /// The content digest that names it in the store.
    pub fn digest(&self) -> String {
        self.tree
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// How many handles to this stored package the process holds (clones share one count): a
    /// runtime being linked from it holds one beside its owner's, and so does one being linked
    /// from the package derived from it (beyond the hold this one keeps on it).
    pub(crate) fn holders(&self) -> usize {
        let derived = self
            .redirect
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map_or(0, |d| d.holders().saturating_sub(1));
        Arc::strong_count(&self.manifest) + derived
    }

    /// What the stored tree holds, and what every runtime made from it must hold.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Full check of the stored tree against the manifest (path, kind, mode, size, SHA-256),
    /// and that every entry is owned by the agent's euid and not writable by group/other (the
    /// stored modes never are), and that each file is still the inode it was when installed.
    pub fn verify(&self) -> Result<(), StoreError> {
        let mut buf = vec![0; BUFFER_SIZE];
        let (_, found) = check_tree(&self.tree, &self.manifest, &mut buf)?;
        for ((entry, found), ino) in self.manifest.entries.iter().zip(&found).zip(&*self.inodes) {
            if matches!(entry.kind, EntryKind::File) && found.ino != *ino {
                return Err(StoreError::Tampered {
                    tree: self.tree.clone(),
                    path: entry.path.clone(),
                    difference: Difference::Inode,
                });
            }
        }
        Ok(())
    }

    /// Populates the existing directory `runtime` with the package: every directory created
    /// (mode from the manifest, owned by the agent), every file hard-linked from the stored tree
    /// (no byte copied), every symlink recreated. Fails (leaving what it made for the caller's
    /// removal) if `runtime` is on another filesystem. Entries already present in `runtime`
    /// (e.g. a persistent slot's `_work`) are left alone; a package entry whose name already
    /// exists is an error.
    pub fn link_into(&self, runtime: &Path) -> Result<(), StoreError> {
        let at = |path: &str| {
            let path = path.to_owned();
            move |source: io::Error| StoreError::Link {
                runtime: runtime.to_path_buf(),
                path,
                source,
            }
        };
        let tree_error = |path: &str| {
            let path = path.to_owned();
            move |source: io::Error| StoreError::TreeRead {
                tree: self.tree.clone(),
                path,
                source,
            }
        };
        let runtime_root = open_dir(runtime).map_err(at("."))?;
        // Checked first so the usual mistake gets its own message before anything is made.
        if rustix::fs::fstat(&runtime_root)
            .map_err(|e| at(".")(e.into()))?
            .st_dev
            != self.dev
        {
            return Err(self.cross_device(runtime));
        }
        let mut tree_dirs = DirStack::new(open_dir(&self.tree).map_err(tree_error("."))?);
        let mut runtime_dirs = DirStack::new(runtime_root);
        for entry in &self.manifest.entries {
            let path = entry.path.as_str();
            let name = entry_name(path).map_err(at(path))?;
            let parent = parent_of(path);
            let tree_dir = tree_dirs.at(parent).map_err(tree_error(path))?;
            let runtime_dir = runtime_dirs.at(parent).map_err(at(path))?;
            let exists = || StoreError::RuntimeEntryExists {
                runtime: runtime.to_path_buf(),
                path: path.to_owned(),
            };
            match &entry.kind {
                EntryKind::Dir => {
                    match rustix::fs::mkdirat(runtime_dir, &name, Mode::RWXU) {
                        Ok(()) => {}
                        Err(rustix::io::Errno::EXIST) => return Err(exists()),
                        Err(e) => return Err(at(path)(e.into())),
                    }
                    let made = rustix::fs::openat(runtime_dir, &name, DIR_FLAGS, Mode::empty())
                        .map_err(|e| at(path)(e.into()))?;
                    // mkdirat's mode went through the umask; set the manifest's exactly.
                    rustix::fs::fchmod(&made, Mode::from_raw_mode(entry.mode))
                        .map_err(|e| at(path)(e.into()))?;
                    let stored = rustix::fs::openat(tree_dir, &name, DIR_FLAGS, Mode::empty())
                        .map_err(|e| tree_error(path)(e.into()))?;
                    runtime_dirs.push(path, made);
                    tree_dirs.push(path, stored);
                }
                EntryKind::File => {
                    // No AT_SYMLINK_FOLLOW: the name itself is linked, and it is a stored file.
                    match rustix::fs::linkat(tree_dir, &name, runtime_dir, &name, AtFlags::empty())
                    {
                        Ok(()) => {}
                        Err(rustix::io::Errno::EXIST) => return Err(exists()),
                        Err(rustix::io::Errno::XDEV) => return Err(self.cross_device(runtime)),
                        Err(e) => return Err(at(path)(e.into())),
                    }
                }
                EntryKind::Symlink { target } => {
                    match rustix::fs::symlinkat(target.as_str(), runtime_dir, &name) {
                        Ok(()) => {}
                        Err(rustix::io::Errno::EXIST) => return Err(exists()),
                        Err(e) => return Err(at(path)(e.into())),
                    }
                }
            }
        }
        Ok(())
    }

    /// The cheap check before a runtime is handed to a runner: every manifest entry under
    /// `runtime` is there with the manifest's kind and mode (directories owned by the agent),
    /// files are the stored inode (same st_dev and st_ino as in the tree) and size, symlinks
    /// have the manifest's target. O(entries) stats, no hashing. Names the package does not
    /// have (the runner's own files, a slot's `_work`) are not looked at.
    pub fn verify_runtime(&self, runtime: &Path) -> Result<(), StoreError> {
        let read = |path: &str| {
            let path = path.to_owned();
            move |source: io::Error| StoreError::RuntimeRead {
                runtime: runtime.to_path_buf(),
                path,
                source,
            }
        };
        let mismatch = |path: &str, difference| StoreError::RuntimeMismatch {
            runtime: runtime.to_path_buf(),
            path: path.to_owned(),
            difference,
        };
        let uid = euid();
        let mut dirs = DirStack::new(open_dir(runtime).map_err(read("."))?);
        for (entry, ino) in self.manifest.entries.iter().zip(&*self.inodes) {
            let path = entry.path.as_str();
            let name = entry_name(path).map_err(read(path))?;
            let dir = dirs.at(parent_of(path)).map_err(read(path))?;
            let stat = match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(rustix::io::Errno::NOENT) => return Err(mismatch(path, Difference::Missing)),
                Err(e) => return Err(read(path)(e.into())),
            };
            let found = kind_name(FileType::from_raw_mode(stat.st_mode));
            if found != entry_kind_name(&entry.kind) {
                let expected = entry_kind_name(&entry.kind);
                return Err(mismatch(path, Difference::Kind { expected, found }));
            }
            let mode = stat.st_mode & 0o7777;
            if mode != entry.mode {
                let expected = entry.mode;
                return Err(mismatch(
                    path,
                    Difference::Mode {
                        expected,
                        found: mode,
                    },
                ));
            }
            match &entry.kind {
                EntryKind::Dir => {
                    if stat.st_uid != uid {
                        return Err(mismatch(path, Difference::Owner { uid: stat.st_uid }));
                    }
                    let child = rustix::fs::openat(dir, &name, DIR_FLAGS, Mode::empty())
                        .map_err(|e| read(path)(e.into()))?;
                    dirs.push(path, child);
                }
                EntryKind::File => {
                    if stat.st_dev != self.dev || stat.st_ino != *ino {
                        return Err(mismatch(path, Difference::Inode));
                    }
                    let size = u64::try_from(stat.st_size).unwrap_or(0);
                    if size != entry.size {
                        let expected = entry.size;
                        return Err(mismatch(
                            path,
                            Difference::Size {
                                expected,
                                found: size,
                            },
                        ));
                    }
                }
                EntryKind::Symlink { target } => {
                    let found = read_target(dir, &name).map_err(read(path))?;
                    if found != *target {
                        let expected = target.clone();
                        return Err(mismatch(path, Difference::Target { expected, found }));
                    }
                }
            }
        }
        Ok(())
    }

    fn cross_device(&self, runtime: &Path) -> StoreError {
        StoreError::CrossDevice {
            runtime: runtime.to_path_buf(),
            store: self
                .tree
                .parent()
                .and_then(Path::parent)
                .unwrap_or(&self.tree)
                .to_path_buf(),
        }
    }
}

impl StoreError {
    /// The package path a verification found different, if this is one.
    pub(crate) fn differing_path(&self) -> Option<&str> {
        match self {
            StoreError::Tampered { path, .. }
            | StoreError::RuntimeMismatch { path, .. }
            | StoreError::TreeRead { path, .. } => Some(path),
            StoreError::Manifest { .. } => Some(MANIFEST_FILE),
            _ => None,
        }
    }
}

/// Whether [`Store::remove_unused`] removes staging folders: only where no build can be under
/// way (a repair may build one while the agent runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leftovers {
    Remove,
    Keep,
}

/// Whether a runtime still links the stored `tree` or a tree of its group (the stored package
/// and the trees derived from it, [`redirect`], which hard-link its files): a runtime's files
/// are hard links to a tree's, so a file with more links than the group's trees hold is in a
/// runtime. Links are never followed. A tree that cannot be read counts as in use (removing it
/// can wait for the next pass).
pub(crate) fn tree_in_use(tree: &Path) -> bool {
    /// Per file of the walked trees: its link count, and how many of the walked names are it.
    type Links = std::collections::HashMap<(u64, u64), (u64, u64)>;
    fn walk(dir: &Path, depth: usize, links: &mut Links) -> io::Result<()> {
        if depth > MAX_DEPTH {
            return Ok(());
        }
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            if meta.is_file() {
                links
                    .entry((meta.dev(), meta.ino()))
                    .or_insert((meta.nlink(), 0))
                    .1 += 1;
            }
            if meta.is_dir() {
                walk(&entry.path(), depth + 1, links)?;
            }
        }
        Ok(())
    }
    let group = tree_group(tree);
    let mut links = Links::new();
    for member in &group {
        match walk(member, 0, &mut links) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(tree = %member.display(), error = %e, "cannot tell whether a stored runner package is in use; kept");
                return true;
            }
        }
    }
    links.values().any(|(nlink, seen)| nlink > seen)
}

/// `tree` (`<store>/<name>/tree`) and the trees of every store name of its group: the stored
/// package `<base>` and its derivations `<base>+...`.
fn tree_group(tree: &Path) -> Vec<PathBuf> {
    let mut group = vec![tree.to_path_buf()];
    let Some(folder) = tree.parent() else {
        return group;
    };
    let (Some(store), Some(name)) = (folder.parent(), folder.file_name()) else {
        return group;
    };
    let name = name.to_string_lossy();
    let base = redirect::base_of(&name);
    if let Ok(entries) = std::fs::read_dir(store) {
        for entry in entries.filter_map(Result::ok) {
            let other = entry.file_name().to_string_lossy().into_owned();
            let member = other == base
                || other
                    .strip_prefix(base)
                    .is_some_and(|rest| rest.starts_with('+'));
            if member && other != *name {
                group.push(store.join(other).join(TREE_DIR));
            }
        }
    }
    group
}

/// The agent's effective uid: the owner of everything it stores.
fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Refuses a source that is not a directory or ships a top-level `_work` (of any file type: a
/// link named `_work` would be worse than a folder). The source itself may be reached through a
/// link (it is the agent's own configured path); nothing below it is.
/// Refuses a package source a job could change ([`crate::trust`], the rule `run` and `check`
/// judge it by at start): called right before the source is read into the store, so one changed
/// since the start (a directory made writable, an entry given to a runner uid, a link out) is
/// not stored. Apart from [`Store::install`], which takes no pool: the store's own tests and
/// tools install packages with no runner uids about.
pub(crate) fn refuse_changeable(
    source: &Path,
    pool: &crate::isolate::Pool,
) -> Result<(), StoreError> {
    match crate::trust::changeable(source, crate::trust::Kind::Tree, pool) {
        Some(why) => Err(StoreError::Changeable {
            package: source.to_path_buf(),
            why,
        }),
        None => Ok(()),
    }
}

fn check_source(source: &Path) -> Result<(), StoreError> {
    use crate::WorkspaceError;
    // The same rule a copied runtime's package is held to.
    crate::workspace::check_package(source).map_err(|e| match e {
        WorkspaceError::PackageHasWorkFolder { package } => StoreError::WorkFolder { package },
        WorkspaceError::Package { package, source } => StoreError::Source {
            package,
            path: ".".into(),
            source,
        },
        other => StoreError::Source {
            package: source.to_path_buf(),
            path: ".".into(),
            source: io::Error::other(other.to_string()),
        },
    })
}

/// An entry as a walk found it: its mode as it is, not as it would be stored.
#[derive(Debug)]
struct Found {
    entry: Entry,
    uid: u32,
    ino: u64,
}

/// Why a walk stopped.
#[derive(Debug)]
enum WalkError {
    Io { path: String, source: io::Error },
    Unsupported { path: String },
    NotUtf8 { dir: String },
    TooDeep { path: String },
}

impl WalkError {
    fn into_source_error(self, package: &Path) -> StoreError {
        let package = package.to_path_buf();
        match self {
            WalkError::Io { path, source } => StoreError::Source {
                package,
                path,
                source,
            },
            WalkError::Unsupported { path } => StoreError::Unsupported { package, path },
            WalkError::NotUtf8 { dir } => StoreError::NotUtf8 { package, dir },
            WalkError::TooDeep { path } => StoreError::TooDeep { package, path },
        }
    }

    /// In a stored tree, anything a walk cannot take is something that was put there.
    fn into_tree_error(self, tree: &Path) -> StoreError {
        let tree = tree.to_path_buf();
        let tampered = |path, difference| StoreError::Tampered {
            tree: tree.clone(),
            path,
            difference,
        };
        match self {
            WalkError::Io { path, source } => StoreError::TreeRead {
                tree: tree.clone(),
                path,
                source,
            },
            WalkError::Unsupported { path } => tampered(
                path,
                Difference::Kind {
                    expected: "file, directory or link",
                    found: "special file",
                },
            ),
            WalkError::NotUtf8 { dir } | WalkError::TooDeep { path: dir } => {
                tampered(dir, Difference::Extra)
            }
        }
    }
}

/// Every entry below `root`, depth first with siblings in byte order (the manifest's order),
/// files hashed. Links are listed, never followed; a socket, device or fifo stops the walk.
fn scan(root: &Path, buf: &mut [u8]) -> Result<Vec<Found>, WalkError> {
    let dir = open_dir(root).map_err(|source| WalkError::Io {
        path: ".".into(),
        source,
    })?;
    let mut found = Vec::new();
    walk(&dir, "", 1, buf, &mut found)?;
    Ok(found)
}

/// [`scan`] of the open directory `dir` at `prefix` (`""` for the top), `depth` components down.
fn walk(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    buf: &mut [u8],
    found: &mut Vec<Found>,
) -> Result<(), WalkError> {
    let io_at = |path: &str| {
        let path = if path.is_empty() { "." } else { path }.to_owned();
        move |source: io::Error| WalkError::Io { path, source }
    };
    let mut names = entry_names(dir).map_err(io_at(prefix))?;
    names.sort_by(|a, b| a.to_bytes().cmp(b.to_bytes()));
    for name in names {
        let Ok(text) = name.to_str() else {
            return Err(WalkError::NotUtf8 {
                dir: if prefix.is_empty() { "." } else { prefix }.to_owned(),
            });
        };
        let path = if prefix.is_empty() {
            text.to_owned()
        } else {
            format!("{prefix}/{text}")
        };
        if depth > MAX_DEPTH {
            return Err(WalkError::TooDeep { path });
        }
        let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_at(&path)(e.into()))?;
        let (kind, size, sha256) = match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => (EntryKind::Dir, 0, None),
            FileType::RegularFile => {
                let file = rustix::fs::openat(dir, &name, READ_FLAGS, Mode::empty())
                    .map_err(|e| io_at(&path)(e.into()))?;
                let (size, sha256) = pump(&mut File::from(file), None, buf)
                    .map_err(|e| io_at(&path)(e.into_inner()))?;
                (EntryKind::File, size, Some(sha256))
            }
            FileType::Symlink => {
                let target = read_target(dir, &name).map_err(io_at(&path))?;
                (EntryKind::Symlink { target }, 0, None)
            }
            _ => return Err(WalkError::Unsupported { path }),
        };
        let is_dir = kind == EntryKind::Dir;
        found.push(Found {
            entry: Entry {
                path: path.clone(),
                kind,
                mode: stat.st_mode & 0o7777,
                size,
                sha256,
            },
            uid: stat.st_uid,
            ino: stat.st_ino,
        });
        if is_dir {
            let child = rustix::fs::openat(dir, &name, DIR_FLAGS, Mode::empty())
                .map_err(|e| io_at(&path)(e.into()))?;
            walk(&child, &path, depth + 1, buf, found)?;
        }
    }
    Ok(())
}

/// Walks the stored `tree` fully and compares it with `manifest`; on success returns the tree's
/// filesystem and what the walk found (one per manifest entry, in order).
fn check_tree(
    tree: &Path,
    manifest: &Manifest,
    buf: &mut [u8],
) -> Result<(u64, Vec<Found>), StoreError> {
    let tampered = |path: &str, difference| StoreError::Tampered {
        tree: tree.to_path_buf(),
        path: path.to_owned(),
        difference,
    };
    let top = std::fs::symlink_metadata(tree).map_err(|source| StoreError::TreeRead {
        tree: tree.to_path_buf(),
        path: ".".into(),
        source,
    })?;
    let uid = euid();
    if !top.is_dir() {
        let found = if top.is_symlink() { "link" } else { "file" };
        let expected = "directory";
        return Err(tampered(".", Difference::Kind { expected, found }));
    }
    if top.uid() != uid {
        return Err(tampered(".", Difference::Owner { uid: top.uid() }));
    }
    if top.mode() & 0o7777 != DIR_MODE {
        let found = top.mode() & 0o7777;
        let expected = DIR_MODE;
        return Err(tampered(".", Difference::Mode { expected, found }));
    }
    let found = scan(tree, buf).map_err(|e| e.into_tree_error(tree))?;
    compare(&manifest.entries, &found, uid).map_err(|(path, d)| tampered(&path, d))?;
    Ok((top.dev(), found))
}

/// The first difference between the manifest's entries and those a walk found (both in
/// canonical order), as the path it is at and what differs.
fn compare(expected: &[Entry], found: &[Found], uid: u32) -> Result<(), (String, Difference)> {
    let mut expected = expected.iter().peekable();
    let mut found = found.iter().peekable();
    loop {
        let (e, f) = match (expected.peek(), found.peek()) {
            (None, None) => return Ok(()),
            (Some(e), None) => return Err((e.path.clone(), Difference::Missing)),
            (None, Some(f)) => return Err((f.entry.path.clone(), Difference::Extra)),
            (Some(e), Some(f)) => (*e, *f),
        };
        match manifest::path_order(&e.path, &f.entry.path) {
            std::cmp::Ordering::Less => return Err((e.path.clone(), Difference::Missing)),
            std::cmp::Ordering::Greater => return Err((f.entry.path.clone(), Difference::Extra)),
            std::cmp::Ordering::Equal => {
                compare_entry(e, f, uid).map_err(|d| (e.path.clone(), d))?;
                expected.next();
                found.next();
            }
        }
    }
}

/// How one found entry differs from the manifest's entry of the same path, if it does.
fn compare_entry(expected: &Entry, found: &Found, uid: u32) -> Result<(), Difference> {
    let (want, got) = (
        entry_kind_name(&expected.kind),
        entry_kind_name(&found.entry.kind),
    );
    if want != got {
        return Err(Difference::Kind {
            expected: want,
            found: got,
        });
    }
    if found.uid != uid {
        return Err(Difference::Owner { uid: found.uid });
    }
    if found.entry.mode != expected.mode {
        return Err(Difference::Mode {
            expected: expected.mode,
            found: found.entry.mode,
        });
    }
    if found.entry.size != expected.size {
        return Err(Difference::Size {
            expected: expected.size,
            found: found.entry.size,
        });
    }
    if found.entry.sha256 != expected.sha256 {
        return Err(Difference::Content);
    }
    match (&expected.kind, &found.entry.kind) {
        (EntryKind::Symlink { target: want }, EntryKind::Symlink { target: got })
            if want != got =>
        {
            Err(Difference::Target {
                expected: want.clone(),
                found: got.clone(),
            })
        }
        _ => Ok(()),
    }
}

/// Copies `source` into the empty directory `dest` along `manifest`, creating every name
/// exclusively with the manifest's mode, and checks every file and link against the manifest
/// while copying (the source must not have changed since it was walked). Returns each entry's
/// inode in the copy (0 for non-files).
fn copy_package(
    source: &Path,
    dest: &Path,
    manifest: &Manifest,
    buf: &mut [u8],
    store: &Path,
) -> Result<Arc<[u64]>, StoreError> {
    let read = |path: &str| {
        let path = path.to_owned();
        move |e: io::Error| StoreError::Source {
            package: source.to_path_buf(),
            path,
            source: e,
        }
    };
    let write = |e: io::Error| StoreError::Write {
        dir: store.to_path_buf(),
        source: e,
    };
    let changed = |path: &str| StoreError::Changed {
        package: source.to_path_buf(),
        path: path.to_owned(),
    };
    let mut source_dirs = DirStack::new(open_dir(source).map_err(read("."))?);
    let mut dest_dirs = DirStack::new(open_dir(dest).map_err(write)?);
    let mut inodes = Vec::with_capacity(manifest.entries.len());
    for entry in &manifest.entries {
        let path = entry.path.as_str();
        let name = entry_name(path).map_err(write)?;
        let parent = parent_of(path);
        let from = source_dirs.at(parent).map_err(read(path))?;
        let to = dest_dirs.at(parent).map_err(write)?;
        let mut ino = 0;
        match &entry.kind {
            EntryKind::Dir => {
                let opened = match rustix::fs::openat(from, &name, DIR_FLAGS, Mode::empty()) {
                    Ok(fd) => fd,
                    // Now a link (ELOOP) or not a directory: not what was walked.
                    Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                        return Err(changed(path));
                    }
                    Err(e) => return Err(read(path)(e.into())),
                };
                rustix::fs::mkdirat(to, &name, Mode::RWXU).map_err(|e| write(e.into()))?;
                let made = rustix::fs::openat(to, &name, DIR_FLAGS, Mode::empty())
                    .map_err(|e| write(e.into()))?;
                rustix::fs::fchmod(&made, Mode::from_raw_mode(entry.mode))
                    .map_err(|e| write(e.into()))?;
                source_dirs.push(path, opened);
                dest_dirs.push(path, made);
            }
            EntryKind::File => {
                let mut input = match rustix::fs::openat(from, &name, READ_FLAGS, Mode::empty()) {
                    Ok(fd) => File::from(fd),
                    Err(rustix::io::Errno::LOOP) => return Err(changed(path)),
                    Err(e) => return Err(read(path)(e.into())),
                };
                if !input.metadata().map_err(read(path))?.is_file() {
                    return Err(changed(path));
                }
                let create = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | READ_FLAGS;
                let mut output = File::from(
                    rustix::fs::openat(to, &name, create, Mode::RUSR | Mode::WUSR)
                        .map_err(|e| write(e.into()))?,
                );
                let (size, sha256) =
                    pump(&mut input, Some(&mut output), buf).map_err(|e| match e {
                        Pumped::Read(e) => read(path)(e),
                        Pumped::Write(e) => write(e),
                    })?;
                if size != entry.size || Some(&sha256) != entry.sha256.as_ref() {
                    return Err(changed(path));
                }
                output
                    .set_permissions(std::fs::Permissions::from_mode(entry.mode))
                    .map_err(write)?;
                ino = output.metadata().map_err(write)?.ino();
            }
            EntryKind::Symlink { target } => {
                match read_target(from, &name) {
                    Ok(found) if found == *target => {}
                    Ok(_) => return Err(changed(path)),
                    Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                        // EINVAL: no longer a link.
                        return Err(changed(path));
                    }
                    Err(e) => return Err(read(path)(e)),
                }
                rustix::fs::symlinkat(target.as_str(), to, &name).map_err(|e| write(e.into()))?;
            }
        }
        inodes.push(ino);
    }
    Ok(inodes.into())
}

/// Which side of a [`pump`] failed.
#[derive(Debug)]
enum Pumped {
    Read(io::Error),
    Write(io::Error),
}

impl Pumped {
    fn into_inner(self) -> io::Error {
        match self {
            Pumped::Read(e) | Pumped::Write(e) => e,
        }
    }
}

/// Reads from `input` to its end in `buf`-sized pieces, hashing, and writing to `output` if
/// given; returns the bytes read and their SHA-256 (lower-case hex).
fn pump(
    input: &mut File,
    mut output: Option<&mut File>,
    buf: &mut [u8],
) -> Result<(u64, String), Pumped> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    loop {
        let n = match input.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Pumped::Read(e)),
        };
        let chunk = &buf[..n];
        hasher.update(chunk);
        if let Some(output) = output.as_deref_mut() {
            output.write_all(chunk).map_err(Pumped::Write)?;
        }
        size += u64::try_from(n).unwrap_or(u64::MAX);
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// A manifest's inodes, from a walk that matched it entry for entry.
fn inodes_of(manifest: &Manifest, found: impl Iterator<Item = u64>) -> Arc<[u64]> {
    manifest
        .entries
        .iter()
        .zip(found)
        .map(|(e, ino)| if e.kind == EntryKind::File { ino } else { 0 })
        .collect()
}

/// The last component of an entry path as a C string (a validated path has no NUL).
fn entry_name(path: &str) -> io::Result<CString> {
    CString::new(name_of(path)).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A link's target, as UTF-8 (a manifest holds strings).
fn read_target(dir: impl AsFd, name: &CString) -> io::Result<String> {
    rustix::fs::readlinkat(dir, name, Vec::new())?
        .into_string()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn entry_kind_name(kind: &EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Dir => "directory",
        EntryKind::Symlink { .. } => "link",
    }
}

fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "file",
        FileType::Directory => "directory",
        FileType::Symlink => "link",
        _ => "special file",
    }
}

/// The open directories along the path of a walk in manifest order, from the top down: a
/// depth-first order visits a directory's entries right after it, so the parent of each entry
/// is on the stack and whatever was walked out of can be closed (at most [`MAX_DEPTH`]
/// descriptors are open, whatever the package's size).
struct DirStack {
    /// `(entry path, its directory)`; the first is the top (`""`).
    stack: Vec<(String, OwnedFd)>,
}

impl DirStack {
    fn new(top: OwnedFd) -> Self {
        Self {
            stack: vec![(String::new(), top)],
        }
    }

    /// The open directory of entry path `dir` (`""` for the top), closing those walked out of.
    fn at(&mut self, dir: &str) -> io::Result<&OwnedFd> {
        while self.stack.len() > 1 && self.stack.last().is_some_and(|(p, _)| p != dir) {
            self.stack.pop();
        }
        match self.stack.last() {
            Some((path, fd)) if path == dir => Ok(fd),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the manifest lists an entry outside the directory before it",
            )),
        }
    }

    /// Enters the directory `dir` (the entry just visited).
    fn push(&mut self, dir: &str, fd: OwnedFd) {
        self.stack.push((dir.to_owned(), fd));
    }
}
