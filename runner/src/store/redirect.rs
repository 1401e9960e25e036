//! The cache redirect: a declared, verified derivation of a stored runner package whose worker
//! no longer overwrites `ACTIONS_RESULTS_URL` and `ACTIONS_CACHE_URL` for a step, so the values
//! the agent gives the runner process (the host-local cache service) reach the step.
//!
//! Why a rewrite is needed: actions/runner's worker sets both variables for every node and
//! container action step from the job message, after the step's environment is assembled from
//! the runner's own (actions/runner 2.336.0, commit 258d6c8,
//! `src/Runner.Worker/Handlers/NodeScriptActionHandler.cs`: `Environment["ACTIONS_CACHE_URL"] =
//! cacheUrl;` and `Environment["ACTIONS_RESULTS_URL"] = resultsUrl;`, the same two lines in
//! `ContainerActionHandler.cs`; no other source of the runner names either). A host step's
//! process starts from the worker's own environment with that dictionary laid over it
//! (`src/Runner.Sdk/ProcessInvoker.cs`), so once the worker sets another name the runner's
//! value reaches the step. A step in a job container or a container action gets only the
//! dictionary's names (`docker exec -e NAME`, `StepHost.cs`; `docker run`,
//! `DockerCommandManager.cs`): with the redirect it gets neither variable from the
//! worker (falcondev-oss/github-actions-cache-server#126 is `upload-artifact` failing in a
//! container action for this reason): the agent's job-started hook puts both in the job's own
//! environment (`$GITHUB_ENV`), whose names every step gets (`rm_runner::backend::CachePlan`).
//!
//! Both names are C# string literals, so the compiled `bin/Runner.Worker.dll` (IL with its
//! metadata: the project sets no `PublishReadyToRun`) holds each once in its `#US` (user
//! strings) heap: ECMA-335 §II.24.2.4 stores a literal as a blob whose compressed length
//! (§II.23.2: one byte below 0x80, two from 0x80, four from 0x4000) is `2 × UTF-16 code units +
//! 1`, then the UTF-16LE code units, then one byte that is 1 when a character has a bit in its
//! high byte or a low byte in 0x01–0x08, 0x0E–0x1F, 0x27, 0x2D, 0x7F, else 0 (`BlobBuilder.
//! WriteUserString` in .NET's System.Reflection.Metadata documents the same); the compiler adds
//! each distinct literal once (`MetadataBuilder.GetOrAddUserString`: "if it's not there
//! already"). Renaming a literal to another of the same length and flag (`ACTIONS_RESULTS_URL`
//! → `ACTIONS_RESULTS_ORL`) leaves every offset, token and length in the assembly as it was:
//! the worker then sets `ACTIONS_RESULTS_ORL`, which nothing reads, and the step keeps the
//! runner's `ACTIONS_RESULTS_URL`.
//!
//! One **occurrence** of a name is, anywhere in the file, the byte sequence: the compressed blob
//! length for the name (`2 × len + 1`), the name in UTF-16LE, then a byte `0x00` or `0x01`.
//! A longer literal that merely contains the name is not one: the byte before the name inside it
//! is the previous character's high byte, and the byte after is the next character's low byte.
//! Only a literal whose characters happen to spell the frame (U+27xx right before
//! `ACTIONS_RESULTS_URL`, U+23xx before `ACTIONS_CACHE_URL`, and a character whose low byte is
//! 0x00 or 0x01 right after) could look like one; that makes the count 2, so the package is
//! refused: the count fails closed.
//!
//! The rule ([`derive`]) applies the table [`REWRITES`] only when each `from` occurs exactly the
//! declared number of times and each `to` not at all; otherwise the package is [`Unfit`] and its
//! runners run uncached (a worker whose strings moved, or a release that renamed them, is never
//! patched by guess; falcondev-oss/github-actions-cache-server#265 is a patched runner whose
//! releases silently did not carry the patch).
//!
//! The derived package is a tree of its own, `<store>/<digest>+cache-redirect-v1/` with its own
//! manifest, never a change to the stored tree: runtimes hard-link the stored files, so patching
//! in place would change every runner's worker, cached or not, and the stored tree would no
//! longer match the manifest its digest names. Every file of the derived tree but the rewritten
//! ones is a hard link to the stored tree's inode (no byte copied); a rewritten file is a new
//! read-only file. It is built once per package digest from the verified stored tree, in a
//! staging folder renamed into place in one step, and verified like the stored tree (every
//! entry against its manifest, every byte hashed, every linked file the stored inode) the first
//! time a process uses it. The derivation's version is in the folder name, so a changed rule
//! makes a new tree; the store's cleanup removes a derived tree with its stored package and keeps
//! it while that package is kept ([`super::Store::remove_unused`]).

#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::{AtFlags, Mode, OFlags};
use sha2::{Digest as _, Sha256};

use super::manifest::{self, DIR_MODE, parent_of};
use super::{
    BUFFER_SIZE, DIR_FLAGS, Difference, DirStack, EntryKind, MANIFEST_FILE, Manifest, READ_FLAGS,
    STAGING_MODE, STAGING_PREFIX, Staging, Store, StoreError, StoredPackage, TREE_DIR, check_tree,
    entry_name,
};
use crate::workspace::open_dir;

/// The derivation's name and version: the suffix of a derived tree's folder
/// (`<digest>+cache-redirect-v1`). Bump the version when [`REWRITES`] or the rule changes, so a
/// tree made by the old rule is never taken for one made by the new.
pub const DERIVATION: &str = "cache-redirect-v1";

/// The runner's worker assembly, where the step environment is set.
pub const WORKER_DLL: &str = "bin/Runner.Worker.dll";

/// One declared rewrite of a .NET string literal in a package file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewrite {
    /// The package entry path.
    pub file: &'static str,
    /// The literal as the runner has it.
    pub from: &'static str,
    /// What it becomes: the same length and the same flag byte, so nothing else in the file moves.
    pub to: &'static str,
    /// How many occurrences of `from` the file must have (see the module doc).
    pub occurrences: usize,
}

/// What the cache redirect changes: the two variables the worker sets for a step from the job
/// message, renamed so the worker sets names nothing reads.
pub const REWRITES: [Rewrite; 2] = [
    Rewrite {
        file: WORKER_DLL,
        from: "ACTIONS_RESULTS_URL",
        to: "ACTIONS_RESULTS_ORL",
        occurrences: 1,
    },
    Rewrite {
        file: WORKER_DLL,
        from: "ACTIONS_CACHE_URL",
        to: "ACTIONS_CACHE_ORL",
        occurrences: 1,
    },
];

/// Why a package does not fit the redirect (its runners then run uncached).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("it has no file {file}")]
    Missing { file: &'static str },
    #[error("its {file} cannot be read: {why}")]
    Unreadable { file: &'static str, why: String },
    #[error(
        "its {file} holds the string literal {string} {found} time(s), the redirect is declared for {expected}"
    )]
    Count {
        file: &'static str,
        string: &'static str,
        found: usize,
        expected: usize,
    },
    #[error(
        "its {file} already holds the string literal {string} ({found} time(s)), which the redirect would write"
    )]
    Taken {
        file: &'static str,
        string: &'static str,
        found: usize,
    },
}

/// Why [`StoredPackage::redirected`] gave no derived package.
#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    /// The package does not fit the rule: nothing was derived.
    #[error("runner package {package} does not fit the cache redirect: {unfit}")]
    Unfit { package: String, unfit: Unfit },
    /// The stored package or the store failed (a tampered tree, a full disk).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The blob frame before a literal of `text` in the `#US` heap and the literal's UTF-16LE code
/// units: compressed length (ECMA-335 §II.23.2) of `2 × units + 1`, then the units.
fn framed(text: &str) -> Vec<u8> {
    let units: Vec<u16> = text.encode_utf16().collect();
    let len = units.len() * 2 + 1;
    let mut out = Vec::with_capacity(len + 4);
    // `as` is exact in each arm: the value is below the arm's bound.
    if len < 0x80 {
        out.push(len as u8);
    } else if len < 0x4000 {
        out.extend_from_slice(&[0x80 | (len >> 8) as u8, (len & 0xff) as u8]);
    } else {
        out.extend_from_slice(&[
            0xc0 | ((len >> 24) & 0x1f) as u8,
            ((len >> 16) & 0xff) as u8,
            ((len >> 8) & 0xff) as u8,
            (len & 0xff) as u8,
        ]);
    }
    out.extend(units.iter().flat_map(|u| u.to_le_bytes()));
    out
}

/// Where `text` occurs in `bytes` as a framed user string (module doc), as the offset of its
/// first UTF-16 unit. Occurrences never overlap (a frame cannot start inside another).
fn occurrences(bytes: &[u8], text: &str) -> Vec<usize> {
    let frame = framed(text);
    let prefix = frame.len() - text.encode_utf16().count() * 2;
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = bytes.get(at..).and_then(|rest| {
        rest.windows(frame.len())
            .position(|w| w == frame.as_slice())
    }) {
        let start = at + i;
        let end = start + frame.len();
        if matches!(bytes.get(end), Some(0 | 1)) {
            found.push(start + prefix);
            at = end + 1;
        } else {
            at = start + 1;
        }
    }
    found
}

/// The content `file` has in the derived package, from its content in the stored one: every
/// rewrite of [`REWRITES`] for `file` applied, when each `from` occurs exactly as declared and
/// each `to` not at all. Only the rewritten characters change; the length is the same. A file
/// the table does not name comes back unchanged.
pub fn derive(file: &str, bytes: &[u8]) -> Result<Vec<u8>, Unfit> {
    let rewrites: Vec<&Rewrite> = REWRITES.iter().filter(|r| r.file == file).collect();
    let mut at = Vec::with_capacity(rewrites.len());
    for rewrite in &rewrites {
        let found = occurrences(bytes, rewrite.from);
        if found.len() != rewrite.occurrences {
            return Err(Unfit::Count {
                file: rewrite.file,
                string: rewrite.from,
                found: found.len(),
                expected: rewrite.occurrences,
            });
        }
        let taken = occurrences(bytes, rewrite.to).len();
        if taken != 0 {
            return Err(Unfit::Taken {
                file: rewrite.file,
                string: rewrite.to,
                found: taken,
            });
        }
        at.push((found, *rewrite));
    }
    let mut out = bytes.to_vec();
    for (offsets, rewrite) in at {
        let to: Vec<u8> = rewrite
            .to
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        for offset in offsets {
            if let Some(target) = out.get_mut(offset..offset + to.len()) {
                target.copy_from_slice(&to);
            }
        }
    }
    Ok(out)
}

/// The package files [`REWRITES`] names, each once, in table order.
fn files() -> Vec<&'static str> {
    let mut files: Vec<&'static str> = Vec::new();
    for rewrite in &REWRITES {
        if !files.contains(&rewrite.file) {
            files.push(rewrite.file);
        }
    }
    files
}

/// Every file the table rewrites, derived from what `read` gives for it (`Ok(None)`: the package
/// has no such file; `Err`: it cannot be read, and why). Pure apart from `read`.
pub(crate) fn derive_package(
    mut read: impl FnMut(&'static str) -> Result<Option<Vec<u8>>, String>,
) -> Result<Vec<(&'static str, Vec<u8>)>, Unfit> {
    let mut out = Vec::new();
    for file in files() {
        let bytes = match read(file) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Err(Unfit::Missing { file }),
            Err(why) => return Err(Unfit::Unreadable { file, why }),
        };
        out.push((file, derive(file, &bytes)?));
    }
    Ok(out)
}

/// Whether the unpacked package at `package` fits the redirect: what `check` judges before the
/// agent has stored it. Reads only the files the table names, never through a link.
pub fn source_fits(package: &Path) -> Result<(), Unfit> {
    derive_package(|file| read_below(package, file).map_err(|e| e.to_string())).map(drop)
}

/// The store digest the unpacked package at `package` would be stored under (every file
/// hashed, as [`Store::install`] does): what `check` names a package by.
pub fn source_digest(package: &Path) -> Result<String, StoreError> {
    let mut buf = vec![0; BUFFER_SIZE];
    Ok(super::source_manifest(package, &mut buf)?.digest())
}

/// The file at entry path `path` below `root`, opened component by component without following
/// a link; `Ok(None)` when a component is missing or the entry is not a regular file.
fn read_below(root: &Path, path: &str) -> io::Result<Option<Vec<u8>>> {
    let mut dir = open_dir(root)?;
    let mut components = path.split('/').peekable();
    while let Some(component) = components.next() {
        let name = CString::new(component).map_err(io::Error::other)?;
        let last = components.peek().is_none();
        let flags = if last { READ_FLAGS } else { DIR_FLAGS };
        let fd = match rustix::fs::openat(&dir, &name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if last {
            let mut file = File::from(fd);
            if !file.metadata()?.is_file() {
                return Ok(None);
            }
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            return Ok(Some(bytes));
        }
        dir = fd;
    }
    Ok(None)
}

/// Serialises derivations in this process: two launches asking for the same derived tree build
/// it once, and a staging folder of a derivation's fixed name is only ever a crash's leftover.
static DERIVING: Mutex<()> = Mutex::new(());

impl StoredPackage {
    /// Whether this is a derived package (its folder name carries a derivation).
    pub fn is_redirected(&self) -> bool {
        self.digest().ends_with(&format!("+{DERIVATION}"))
    }

    /// Whether the stored package fits the redirect: the rule applied to the stored files the
    /// table names, nothing written. For `check` and for saying why a runner runs uncached.
    pub fn redirect_fits(&self) -> Result<(), Unfit> {
        self.rewritten_files().map(drop).map_err(|e| match e {
            RedirectError::Unfit { unfit, .. } => unfit,
            RedirectError::Store(e) => Unfit::Unreadable {
                file: WORKER_DLL,
                why: e.to_string(),
            },
        })
    }

    /// The derived package runtimes of a cached policy are linked from (module doc): built once
    /// per package digest from this verified stored tree, or, when it exists, verified and
    /// returned. A package the rule does not fit is [`RedirectError::Unfit`] and nothing is left
    /// on disk. Within a process the derived package is kept with this one; a later call checks
    /// it as a runtime is checked (a stat per entry, every file the inode it was made with) and
    /// hashes the rewritten files again, and one that fails is removed and built again.
    /// Blocking (the first call of a process hashes the whole tree).
    pub fn redirected(&self) -> Result<StoredPackage, RedirectError> {
        if self.is_redirected() {
            return Ok(self.clone());
        }
        let _one = DERIVING.lock().unwrap_or_else(PoisonError::into_inner);
        let rewritten = self.rewritten_files()?;
        let expected = derived_manifest(&self.manifest, &rewritten);
        let mut memo = self.redirect.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(derived) = memo.as_ref() {
            match derived.recheck(&expected, &rewritten) {
                Ok(()) => return Ok(derived.clone()),
                Err(e) => {
                    tracing::warn!(tree = %derived.tree.display(), error = %e, "the derived runner package was changed; building it again");
                    *memo = None;
                }
            }
        }
        let store = Store {
            dir: self.store_dir(),
        };
        let name = format!("{}+{DERIVATION}", self.digest());
        let derived = match std::fs::symlink_metadata(store.dir.join(&name)) {
            Ok(_) => match self.load_derived(&store, &name, &expected) {
                Ok(derived) => Some(derived),
                Err(e) => {
                    tracing::warn!(
                        name = %name,
                        path = e.differing_path().unwrap_or("?"),
                        error = %e,
                        "the derived runner package does not verify; building it again"
                    );
                    store.remove(&name)?;
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(store.write_error(e).into()),
        };
        let derived = match derived {
            Some(derived) => derived,
            None => self.build_derived(&store, &name, expected, &rewritten)?,
        };
        *memo = Some(derived.clone());
        Ok(derived)
    }

    /// `<store>`: the parent of this package's `<digest>/` folder.
    fn store_dir(&self) -> PathBuf {
        self.tree
            .parent()
            .and_then(Path::parent)
            .unwrap_or(&self.tree)
            .to_path_buf()
    }

    /// The files the table rewrites, read from the stored tree (each checked against the
    /// manifest's SHA-256: a derivation is only ever made from verified bytes) and derived.
    fn rewritten_files(&self) -> Result<Vec<(&'static str, Vec<u8>)>, RedirectError> {
        let mut tampered = None;
        let derived = derive_package(|file| {
            let Some(entry) = self
                .manifest
                .entries
                .iter()
                .find(|e| e.path == file && e.kind == EntryKind::File)
            else {
                return Ok(None);
            };
            let bytes = read_below(&self.tree, file).map_err(|e| e.to_string())?;
            match bytes {
                Some(bytes) if Some(sha256_hex(&bytes)) == entry.sha256 => Ok(Some(bytes)),
                _ => {
                    tampered = Some(file);
                    Err("it differs from the manifest".to_owned())
                }
            }
        });
        if let Some(path) = tampered {
            return Err(RedirectError::Store(StoreError::Tampered {
                tree: self.tree.clone(),
                path: path.to_owned(),
                difference: Difference::Content,
            }));
        }
        derived.map_err(|unfit| RedirectError::Unfit {
            package: short(&self.digest()).to_owned(),
            unfit,
        })
    }

    /// Reads back the derived tree `<store>/<name>` and verifies it fully: its manifest is the
    /// expected one, every entry matches it (every byte hashed), and every file but the
    /// rewritten ones is this package's inode.
    fn load_derived(
        &self,
        store: &Store,
        name: &str,
        expected: &Manifest,
    ) -> Result<StoredPackage, StoreError> {
        let path = store.dir.join(name).join(MANIFEST_FILE);
        let bad = |reason: String| StoreError::Manifest {
            manifest: path.clone(),
            reason,
        };
        let bytes = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if manifest != *expected {
            return Err(bad("it is not the derived package's manifest".into()));
        }
        self.checked_derived(store.dir.join(name).join(TREE_DIR), manifest)
    }

    /// The full check of a derived tree at `tree` against `manifest`, and the package for it.
    fn checked_derived(
        &self,
        tree: PathBuf,
        manifest: Manifest,
    ) -> Result<StoredPackage, StoreError> {
        let mut buf = vec![0; BUFFER_SIZE];
        let (dev, found) = check_tree(&tree, &manifest, &mut buf)?;
        let mut inodes = Vec::with_capacity(found.len());
        for (((entry, base), found), base_ino) in manifest
            .entries
            .iter()
            .zip(&self.manifest.entries)
            .zip(&found)
            .zip(self.inodes.iter())
        {
            let linked = entry.kind == EntryKind::File && entry.sha256 == base.sha256;
            if linked && (dev != self.dev || found.ino != *base_ino) {
                return Err(StoreError::Tampered {
                    tree,
                    path: entry.path.clone(),
                    difference: Difference::Inode,
                });
            }
            inodes.push(if entry.kind == EntryKind::File {
                found.ino
            } else {
                0
            });
        }
        Ok(StoredPackage {
            tree,
            manifest: Arc::new(manifest),
            dev,
            inodes: inodes.into(),
            redirect: Arc::default(),
        })
    }

    /// The check of a derived package this process already verified: its manifest is still the
    /// one this package and the rule give, every entry is as a runtime's is checked (kind, mode,
    /// the inode it was made with, size, link target), and the rewritten files hash as derived.
    fn recheck(
        &self,
        expected: &Manifest,
        rewritten: &[(&'static str, Vec<u8>)],
    ) -> Result<(), StoreError> {
        if *self.manifest != *expected {
            return Err(StoreError::Manifest {
                manifest: self.store_dir().join(self.digest()).join(MANIFEST_FILE),
                reason: "it is not the derived package's manifest".into(),
            });
        }
        self.verify_runtime(&self.tree)?;
        for (file, bytes) in rewritten {
            let found = read_below(&self.tree, file).map_err(|source| StoreError::TreeRead {
                tree: self.tree.clone(),
                path: (*file).to_owned(),
                source,
            })?;
            if found.as_deref() != Some(bytes.as_slice()) {
                return Err(StoreError::Tampered {
                    tree: self.tree.clone(),
                    path: (*file).to_owned(),
                    difference: Difference::Content,
                });
            }
        }
        Ok(())
    }

    /// Builds the derived tree in `<store>/.staging-<name>` (a leftover of that name is a
    /// crash's, removed first), each file linked from this tree but the rewritten ones, which
    /// are written anew read-only; writes its manifest; checks it fully; renames it to `name`.
    fn build_derived(
        &self,
        store: &Store,
        name: &str,
        manifest: Manifest,
        rewritten: &[(&'static str, Vec<u8>)],
    ) -> Result<StoredPackage, StoreError> {
        let staging_name = format!("{STAGING_PREFIX}{name}");
        let staging_path = store.dir.join(&staging_name);
        if std::fs::symlink_metadata(&staging_path).is_ok() {
            tracing::info!(name = %staging_name, "removing a derived runner package a crash left half built");
            store.remove(&staging_name)?;
        }
        std::fs::DirBuilder::new()
            .mode(STAGING_MODE)
            .create(&staging_path)
            .map_err(|e| store.write_error(e))?;
        // Removed on drop if anything below fails.
        let staging = Staging {
            store,
            name: staging_name,
            path: staging_path,
            kept: false,
        };
        let staged_tree = staging.path().join(TREE_DIR);
        std::fs::create_dir(&staged_tree).map_err(|e| store.write_error(e))?;
        std::fs::set_permissions(&staged_tree, std::fs::Permissions::from_mode(DIR_MODE))
            .map_err(|e| store.write_error(e))?;
        self.link_derived(&staged_tree, &manifest, rewritten)
            .map_err(|e| store.write_error(e))?;
        let write_manifest = || -> io::Result<()> {
            let mut file = File::create_new(staging.path().join(MANIFEST_FILE))?;
            file.write_all(&manifest.canonical_bytes())?;
            file.set_permissions(std::fs::Permissions::from_mode(manifest::FILE_MODE))
        };
        write_manifest().map_err(|e| store.write_error(e))?;
        // Checked before it is renamed: nothing unverified is ever at a derived tree's name.
        let mut derived = self.checked_derived(staged_tree, manifest)?;
        let stored = store.dir.join(name);
        std::fs::rename(staging.path(), &stored).map_err(|e| store.write_error(e))?;
        staging.keep();
        tracing::info!(tree = %stored.display(), "derived the cache-redirected runner package");
        // A rename keeps every inode: only the path changes.
        derived.tree = stored.join(TREE_DIR);
        Ok(derived)
    }

    /// Fills the empty `dest` along this package's manifest: directories made with their mode,
    /// links recreated, files hard-linked from this tree, except the `rewritten` ones, created
    /// exclusively with the derived content and the manifest's (read-only) mode.
    fn link_derived(
        &self,
        dest: &Path,
        manifest: &Manifest,
        rewritten: &[(&'static str, Vec<u8>)],
    ) -> io::Result<()> {
        let mut from_dirs = DirStack::new(open_dir(&self.tree)?);
        let mut to_dirs = DirStack::new(open_dir(dest)?);
        for entry in &manifest.entries {
            let path = entry.path.as_str();
            let name = entry_name(path)?;
            let parent = parent_of(path);
            let from = from_dirs.at(parent)?;
            let to = to_dirs.at(parent)?;
            match &entry.kind {
                EntryKind::Dir => {
                    rustix::fs::mkdirat(to, &name, Mode::RWXU)?;
                    let made = rustix::fs::openat(to, &name, DIR_FLAGS, Mode::empty())?;
                    rustix::fs::fchmod(&made, Mode::from_raw_mode(entry.mode))?;
                    let opened = rustix::fs::openat(from, &name, DIR_FLAGS, Mode::empty())?;
                    from_dirs.push(path, opened);
                    to_dirs.push(path, made);
                }
                EntryKind::File => match rewritten.iter().find(|(f, _)| *f == path) {
                    Some((_, bytes)) => {
                        let create = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | READ_FLAGS;
                        let mut output = File::from(rustix::fs::openat(
                            to,
                            &name,
                            create,
                            Mode::RUSR | Mode::WUSR,
                        )?);
                        output.write_all(bytes)?;
                        output.set_permissions(std::fs::Permissions::from_mode(entry.mode))?;
                    }
                    None => rustix::fs::linkat(from, &name, to, &name, AtFlags::empty())?,
                },
                EntryKind::Symlink { target } => {
                    rustix::fs::symlinkat(target.as_str(), to, &name)?;
                }
            }
        }
        Ok(())
    }
}

/// The derived package's manifest: this one's, with the rewritten files' SHA-256 (their size is
/// the same: [`derive`] changes no length).
fn derived_manifest(base: &Manifest, rewritten: &[(&'static str, Vec<u8>)]) -> Manifest {
    let mut manifest = base.clone();
    for entry in &mut manifest.entries {
        if let Some((_, bytes)) = rewritten.iter().find(|(f, _)| *f == entry.path) {
            entry.sha256 = Some(sha256_hex(bytes));
            entry.size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        }
    }
    manifest
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The first 12 characters of a digest: how logs and `check` name a package.
pub fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// Whether `name` in the store is the derived tree of the stored package `digest` by the
/// current rule (kept while that package is).
pub(crate) fn is_derived_of(name: &[u8], digest: &str) -> bool {
    name.strip_prefix(digest.as_bytes())
        .and_then(|rest| rest.strip_prefix(b"+"))
        .is_some_and(|rest| rest == DERIVATION.as_bytes())
}

/// The stored package a store name belongs to: the name itself, or a derived tree's base.
pub(crate) fn base_of(name: &str) -> &str {
    name.split_once('+').map_or(name, |(base, _)| base)
}
