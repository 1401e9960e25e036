//! The package manifest: every entry of a stored runner package (path, kind, mode, size and
//! SHA-256), in one canonical order, and the digest over it that names the stored tree. Pure:
//! nothing here touches the filesystem.

use std::cmp::Ordering;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Mode of every stored (and linked) directory: the agent may change it, everyone may list and
/// enter it, nobody else may add, remove or rename a name in it.
pub(crate) const DIR_MODE: u32 = 0o755;

/// Mode of a stored file the package ships executable. Read-only even for its owner: one inode
/// backs the tree and every runtime linking it, so no process of the agent's user should open it
/// for writing by accident either.
pub(crate) const EXECUTABLE_MODE: u32 = 0o555;

/// Mode of any other stored file (read-only for everyone, see [`EXECUTABLE_MODE`]).
pub(crate) const FILE_MODE: u32 = 0o444;

/// Mode Linux reports for every symbolic link (a link's own mode is never used).
pub(crate) const SYMLINK_MODE: u32 = 0o777;

/// How many components an entry path may have. Each level of a walk holds a directory
/// descriptor (and a stack frame while a tree is scanned), and a package must not be able to
/// exhaust either; real packages (node_modules included) stay far below this.
pub(crate) const MAX_DEPTH: usize = 128;

/// Length of a SHA-256 in lower-case hex.
const SHA256_HEX_LEN: usize = 64;

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    /// A symbolic link, recreated with the same target and never followed.
    Symlink {
        target: String,
    },
}

/// One entry of a package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the package's top, `/`-separated, without `.`, `..` or empty components.
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// Bytes of a file; 0 for the other kinds.
    pub size: u64,
    /// Lower-case hex SHA-256 of a file's content; `None` for the other kinds.
    pub sha256: Option<String>,
}

/// Every entry of a package, sorted by [`path_order`]: a directory comes right before what it
/// holds (depth first), so a walk in this order always finds an entry's parent already made.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

/// Why a manifest read back from the store is not one this module could have written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("entry {path:?} is not a relative `/`-separated path of plain names")]
    BadPath { path: String },
    #[error("entry {path:?} is out of order or listed twice")]
    Order { path: String },
    #[error("entry {path:?} is listed before (or without) its directory")]
    NoParent { path: String },
    #[error("entry {path:?} is inconsistent: {reason}")]
    BadEntry { path: String, reason: &'static str },
}

/// The canonical order of entry paths: component by component, each compared by bytes. This is
/// a depth-first order (`a`, `a/b`, `a-b`), which plain string order is not (`a`, `a-b`, `a/b`).
pub(crate) fn path_order(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

/// The mode an entry gets in the store, whatever the package had: no setuid, setgid or sticky
/// bit (a runner could otherwise run a program as the agent), nothing writable by group or
/// other, and readable (and, where it matters, searchable or executable) by other, so a runner
/// that is neither the owner nor in the group can use it.
pub(crate) fn stored_mode(kind: &EntryKind, mode: u32) -> u32 {
    match kind {
        EntryKind::Dir => DIR_MODE,
        EntryKind::File if mode & 0o111 != 0 => EXECUTABLE_MODE,
        EntryKind::File => FILE_MODE,
        EntryKind::Symlink { .. } => SYMLINK_MODE,
    }
}

/// The parent of an entry path; `""` for a top-level entry.
pub(crate) fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(parent, _)| parent)
}

/// The last component of an entry path.
pub(crate) fn name_of(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, name)| name)
}

/// Whether `path` is relative, `/`-separated, and made of plain names only.
fn is_plain_path(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\0')
        && path.split('/').count() <= MAX_DEPTH
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

impl Manifest {
    /// The serialisation the digest is taken over: compact JSON, fields in declaration order,
    /// entries in canonical order. Written to the store as is.
    pub(crate) fn canonical_bytes(&self) -> Vec<u8> {
        // Serialising plain strings and integers into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// SHA-256 (lower-case hex) of [`Manifest::canonical_bytes`]: names the stored tree, so two
    /// packages share a tree exactly when every path, kind, stored mode and content agree.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.canonical_bytes()))
    }

    /// Bytes of file content in the package.
    pub(crate) fn total_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }

    /// Checks what [`crate::store`] relies on when it walks a manifest it reads back:
    /// plain relative paths in strict canonical order, each below a directory listed earlier,
    /// files with a hash and other kinds without, stored modes only, and no top-level `_work`.
    pub fn validate(&self) -> Result<(), ManifestError> {
        let mut dirs: HashSet<&str> = HashSet::new();
        let mut previous: Option<&str> = None;
        for entry in &self.entries {
            let path = entry.path.as_str();
            let bad = |reason| ManifestError::BadEntry {
                path: path.to_owned(),
                reason,
            };
            if !is_plain_path(path) {
                return Err(ManifestError::BadPath {
                    path: path.to_owned(),
                });
            }
            if previous.is_some_and(|p| path_order(p, path) != Ordering::Less) {
                return Err(ManifestError::Order {
                    path: path.to_owned(),
                });
            }
            previous = Some(path);
            let parent = parent_of(path);
            if !parent.is_empty() && !dirs.contains(parent) {
                return Err(ManifestError::NoParent {
                    path: path.to_owned(),
                });
            }
            if path == crate::workspace::WORK_FOLDER {
                return Err(bad("a package never ships a top-level `_work`"));
            }
            if entry.mode != stored_mode(&entry.kind, entry.mode) {
                return Err(bad("its mode is not a stored mode"));
            }
            match &entry.kind {
                EntryKind::File => {
                    let hash_ok = entry.sha256.as_deref().is_some_and(|h| {
                        h.len() == SHA256_HEX_LEN
                            && h.bytes()
                                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                    });
                    if !hash_ok {
                        return Err(bad("a file needs a lower-case hex SHA-256"));
                    }
                }
                EntryKind::Dir => {
                    dirs.insert(path);
                }
                EntryKind::Symlink { target } => {
                    if target.is_empty() || target.contains('\0') {
                        return Err(bad("a link needs a target without NUL"));
                    }
                }
            }
            if !matches!(entry.kind, EntryKind::File) && (entry.size != 0 || entry.sha256.is_some())
            {
                return Err(bad("only a file has a size and a hash"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::Dir,
            mode: DIR_MODE,
            size: 0,
            sha256: None,
        }
    }

    fn file(path: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File,
            mode: FILE_MODE,
            size: 3,
            sha256: Some("ab".repeat(32)),
        }
    }

    #[test]
    fn the_canonical_order_is_depth_first() {
        let mut paths = vec!["a-b", "a/b", "a", "b", "a/b/c", "a/a"];
        paths.sort_by(|a, b| path_order(a, b));
        assert_eq!(paths, ["a", "a/a", "a/b", "a/b/c", "a-b", "b"]);
    }

    #[test]
    fn stored_modes_drop_special_and_write_bits() {
        assert_eq!(stored_mode(&EntryKind::Dir, 0o2777), 0o755);
        assert_eq!(stored_mode(&EntryKind::Dir, 0o700), 0o755);
        assert_eq!(stored_mode(&EntryKind::File, 0o4755), 0o555);
        assert_eq!(stored_mode(&EntryKind::File, 0o700), 0o555);
        assert_eq!(stored_mode(&EntryKind::File, 0o666), 0o444);
        assert_eq!(stored_mode(&EntryKind::File, 0o600), 0o444);
    }

    #[test]
    fn path_helpers_split_at_the_last_slash() {
        assert_eq!(parent_of("a/b/c"), "a/b");
        assert_eq!(parent_of("a"), "");
        assert_eq!(name_of("a/b/c"), "c");
        assert_eq!(name_of("a"), "a");
    }

    #[test]
    fn the_digest_depends_on_every_field() {
        let base = Manifest {
            entries: vec![dir("bin"), file("bin/f")],
        };
        assert_eq!(base.digest(), base.clone().digest());
        assert_eq!(base.digest().len(), 64);
        let mut other = base.clone();
        other.entries[1].mode = EXECUTABLE_MODE;
        assert_ne!(base.digest(), other.digest());
        let mut other = base.clone();
        other.entries[1].sha256 = Some("cd".repeat(32));
        assert_ne!(base.digest(), other.digest());
        let mut other = base.clone();
        other.entries[1].kind = EntryKind::Symlink { target: "x".into() };
        assert_ne!(base.digest(), other.digest());
    }

    #[test]
    fn the_serialisation_round_trips() {
        let manifest = Manifest {
            entries: vec![
                dir("bin"),
                file("bin/f"),
                Entry {
                    path: "bin/l".into(),
                    kind: EntryKind::Symlink {
                        target: "../../etc".into(),
                    },
                    mode: SYMLINK_MODE,
                    size: 0,
                    sha256: None,
                },
            ],
        };
        let back: Manifest = serde_json::from_slice(&manifest.canonical_bytes()).unwrap();
        assert_eq!(back, manifest);
        assert_eq!(back.validate(), Ok(()));
    }

    #[test]
    fn validation_refuses_what_the_store_never_writes() {
        let cases: Vec<(Vec<Entry>, &str)> = vec![
            (vec![dir("../x")], "BadPath"),
            (vec![dir("/abs")], "BadPath"),
            (vec![dir("a//b")], "BadPath"),
            (vec![dir("a/./b")], "BadPath"),
            (vec![dir("b"), dir("a")], "Order"),
            (vec![dir("a"), dir("a")], "Order"),
            (vec![file("a/f")], "NoParent"),
            (vec![file("a"), file("a/f")], "NoParent"),
            (vec![dir("_work")], "BadEntry"),
            (
                vec![Entry {
                    mode: 0o644,
                    ..file("f")
                }],
                "BadEntry",
            ),
            (
                vec![Entry {
                    sha256: None,
                    ..file("f")
                }],
                "BadEntry",
            ),
            (
                vec![Entry {
                    size: 1,
                    ..dir("d")
                }],
                "BadEntry",
            ),
        ];
        for (entries, want) in cases {
            let err = Manifest {
                entries: entries.clone(),
            }
            .validate()
            .unwrap_err();
            assert!(format!("{err:?}").starts_with(want), "{entries:?}: {err:?}");
        }
    }
}
