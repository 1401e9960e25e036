//! Whether a job could change what the agent takes from disk and hands to every later runner
//! (CONTRACT §7): the runner package tree (`runner.package_dir`, or the package `runner.version`
//! downloaded), each policy's `env_file` and each `docker_images` tarball. A job that can change
//! one of them backdoors every runner that reads it next, so the agent judges them at start
//! (`run` refuses, `check` fails) and again when it reads them: the package source right before
//! it is stored ([`crate::backend::LinkedPackage`]), an image right before it is loaded
//! ([`crate::docker::load_images`]).
//!
//! One rule, [`judge`], pure: an object as it was stat'ed (owner, mode and kind, a link's
//! target) and the directory it was found in, in; the problem and its fix out. Two thin
//! adapters feed it: [`trail`] reads every object the kernel meets on the way to a path (links
//! followed as the kernel does, each judged), [`judge_tree`] every entry below a directory
//! (by descriptors, never following a link, bounded by [`MAX_TREE_ENTRIES`] and
//! [`MAX_TREE_DEPTH`]).
//!
//! The rule: nothing owned by a runner uid; nothing group- or world-writable, except a sticky
//! directory owned by root or the agent (others may add entries there but not rename or remove
//! one they do not own), whose entries must then be root's or the agent's; in a tree, no link
//! that leaves it (the store keeps links as they are, so a link out would hand a runner whatever
//! is at its target). One rule an operator can check by eye, even where a group looks harmless.

use std::collections::VecDeque;
use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::isolate::Pool;

/// How many symbolic links [`trail`] follows before it gives up (the kernel's own limit,
/// `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// How many entries [`judge_tree`] looks at before it refuses the tree: a runner package holds
/// a few thousand; a tree far larger is not a package, and judging it would hold the start.
pub const MAX_TREE_ENTRIES: usize = 200_000;

/// How deep [`judge_tree`] goes below the tree's top: the package store's own bound (a deeper
/// package cannot be stored anyway), which also bounds the directories held open at once.
pub const MAX_TREE_DEPTH: usize = crate::store::manifest::MAX_DEPTH;

/// The mode bits that let a group or other users write.
const GROUP_OR_OTHER_WRITE: u32 = 0o022;
/// The sticky bit: in a directory, only an entry's owner (or the directory's, or root) may
/// rename or remove the entry.
const STICKY: u32 = 0o1000;

/// `S_IFMT`, `S_IFDIR`, `S_IFLNK`: the file type bits of `st_mode` and two of their values.
const S_IFMT: u32 = 0o170_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

/// One object as it was stat'ed (never through a link): a directory looked in, a link, or a
/// file. `mode` is the whole `st_mode` (type and permission bits); `target` a link's, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub path: PathBuf,
    pub uid: u32,
    pub mode: u32,
    pub target: Option<PathBuf>,
}

impl Seen {
    fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    fn is_link(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }

    /// Writable by its group or other users: a sticky directory too (judged by [`judge`]).
    fn shared(&self) -> bool {
        !self.is_link() && self.mode & GROUP_OR_OTHER_WRITE != 0
    }
}

/// Why a job could change what the agent trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    /// A runner uid owns this object: a job under that uid can change it at will.
    OwnedByRunner { path: PathBuf, uid: u32 },
    /// This object is writable by its group or by every user.
    Writable { path: PathBuf, mode: u32 },
    /// A sticky directory others may write holds an entry that is neither root's nor the
    /// agent's: its owner may replace it.
    InSharedDir {
        dir: PathBuf,
        mode: u32,
        entry: PathBuf,
        uid: u32,
    },
    /// A link in a tree points out of it (or climbs back after a name, which a link on the way
    /// could take out): what a runner finds there is not the tree's.
    LinkOut {
        link: PathBuf,
        target: PathBuf,
        tree: PathBuf,
    },
}

impl Untrusted {
    /// The problem and its fix, as one sentence ("problem; fix") for `run`, `check` and the
    /// readers' refusals.
    pub fn describe(&self) -> String {
        match self {
            Untrusted::OwnedByRunner { path, uid } => format!(
                "{} is owned by runner uid {uid}, so a job could change it; move what rm reads out of the runner accounts' reach (e.g. under /opt, owned by root) or run `chown root:root {}`",
                path.display(),
                path.display()
            ),
            Untrusted::Writable { path, mode } => format!(
                "{} is writable by {} (mode {:o}), so a job could change it; run `chmod go-w {}`",
                path.display(),
                if mode & 0o002 != 0 {
                    "every user"
                } else {
                    "its group"
                },
                mode & 0o7777,
                path.display()
            ),
            Untrusted::InSharedDir {
                dir,
                mode,
                entry,
                uid,
            } => format!(
                "{} lies in {}, which every user may write (mode {:o}), and is owned by uid {uid}, not root or the agent, so it could be replaced; move it out of {} or run `chown root:root {}`",
                entry.display(),
                dir.display(),
                mode & 0o7777,
                dir.display(),
                entry.display()
            ),
            Untrusted::LinkOut { link, target, tree } => format!(
                "{} is a link to {}, out of {}, so a runner would get whatever is there; remove it (`rm {}`) or make it a relative link that stays inside {}",
                link.display(),
                target.display(),
                tree.display(),
                link.display(),
                tree.display()
            ),
        }
    }
}

/// The one rule: why a job could change `seen`, found in the directory `parent` (`None` for
/// `/` or a tree's top), if it could. `tree`: the top of the tree `seen` lies in, where a link
/// must stay inside it (`None` on a [`trail`], which follows each link and judges the way to its
/// target). In order:
/// - owned by a uid of `pool`: refused;
/// - in a directory others may write (sticky, or it was refused itself): refused unless owned
///   by root or `agent_uid`;
/// - a link: its own mode means nothing (always `0777`); in a tree it must stay inside it
///   ([`stays_inside`]);
/// - writable by its group or other users: refused unless a sticky directory owned by root or
///   `agent_uid`, whose entries this rule then holds to the line above.
pub fn judge(
    seen: &Seen,
    parent: Option<&Seen>,
    tree: Option<&Path>,
    pool: &Pool,
    agent_uid: u32,
) -> Option<Untrusted> {
    let trusted_owner = |uid: u32| uid == 0 || uid == agent_uid;
    if pool.contains_uid(seen.uid) {
        return Some(Untrusted::OwnedByRunner {
            path: seen.path.clone(),
            uid: seen.uid,
        });
    }
    if let Some(dir) = parent.filter(|p| p.shared())
        && !trusted_owner(seen.uid)
    {
        return Some(Untrusted::InSharedDir {
            dir: dir.path.clone(),
            mode: dir.mode,
            entry: seen.path.clone(),
            uid: seen.uid,
        });
    }
    if seen.is_link() {
        let (Some(tree), Some(target)) = (tree, &seen.target) else {
            return None;
        };
        return (!stays_inside(&seen.path, target, tree)).then(|| Untrusted::LinkOut {
            link: seen.path.clone(),
            target: target.clone(),
            tree: tree.to_owned(),
        });
    }
    if seen.shared() && !(seen.is_dir() && seen.mode & STICKY != 0 && trusted_owner(seen.uid)) {
        return Some(Untrusted::Writable {
            path: seen.path.clone(),
            mode: seen.mode,
        });
    }
    None
}

/// Whether the link at `link` (a path under `tree`) resolves inside `tree` whatever the other
/// links of the tree are: `..` only at the start of a relative target and never above `tree`
/// (climbing from a real directory), then only names (each a directory, a file, or a link held
/// to this same rule); or an absolute target under `tree`, names only. A `..` after a name could
/// climb out of a link's target rather than the name's directory, so it is refused. Pure.
fn stays_inside(link: &Path, target: &Path, tree: &Path) -> bool {
    let names_only = |rest: &Path| {
        rest.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    };
    if target.is_absolute() {
        return target.strip_prefix(tree).is_ok_and(names_only);
    }
    let Some(depth) = link
        .parent()
        .and_then(|dir| dir.strip_prefix(tree).ok())
        .map(|below| below.components().count())
    else {
        return false;
    };
    let mut climbed = 0;
    let mut components = target.components().peekable();
    while let Some(Component::ParentDir) = components.peek() {
        components.next();
        climbed += 1;
    }
    climbed <= depth && names_only(&components.collect::<PathBuf>())
}

/// The first object of `trail` (from `/` down to the thing itself, as [`trail`] reads it) that
/// a job could change, by [`judge`], each with the directory it was looked up in.
pub fn judge_trail(trail: &[Seen], pool: &Pool, agent_uid: u32) -> Option<Untrusted> {
    trail.iter().enumerate().find_map(|(index, seen)| {
        let parent = trail[..index]
            .iter()
            .rev()
            .find(|earlier| Some(earlier.path.as_path()) == seen.path.parent());
        judge(seen, parent, None, pool, agent_uid)
    })
}

/// A path's part still to resolve.
enum Part {
    Parent,
    Name(OsString),
}

fn parts(path: &Path) -> impl Iterator<Item = Part> + '_ {
    path.components().filter_map(|c| match c {
        Component::ParentDir => Some(Part::Parent),
        Component::Normal(name) => Some(Part::Name(name.to_owned())),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

/// Every object the kernel meets resolving `path`, in order: `/`, each directory a name is
/// looked up in, each symbolic link (then the way to its target), and the object at the end.
/// Read without following anything by hand, so a link's own directory is judged too.
pub fn trail(path: &Path) -> io::Result<Vec<Seen>> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    let seen = |at: &Path| -> io::Result<Seen> {
        let meta = std::fs::symlink_metadata(at)?;
        let target = meta
            .file_type()
            .is_symlink()
            .then(|| std::fs::read_link(at))
            .transpose()?;
        Ok(Seen {
            path: at.to_owned(),
            uid: meta.uid(),
            mode: meta.mode(),
            target,
        })
    };
    let mut steps = vec![seen(Path::new("/"))?];
    let mut at = PathBuf::from("/");
    let mut rest: VecDeque<Part> = parts(&absolute).collect();
    let mut links = 0;
    while let Some(part) = rest.pop_front() {
        let name = match part {
            Part::Parent => {
                at.pop();
                continue;
            }
            Part::Name(name) => name,
        };
        let here = at.join(&name);
        let reached = seen(&here)?;
        let (target, is_dir) = (reached.target.clone(), reached.is_dir());
        steps.push(reached);
        if let Some(target) = target {
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::other(format!(
                    "more than {MAX_LINKS} symbolic links on the way to {}",
                    path.display()
                )));
            }
            if target.is_absolute() {
                at = PathBuf::from("/");
            }
            for part in parts(&target).collect::<Vec<_>>().into_iter().rev() {
                rest.push_front(part);
            }
        } else if is_dir {
            at = here;
        } else if !rest.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", here.display()),
            ));
        }
    }
    Ok(steps)
}

/// Flags for opening a directory of a tree: never through a link.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The first entry of the tree at `top` (itself included) a job could change, by [`judge`]
/// with `top` as the tree: each entry stat'ed below the directory descriptor it was listed
/// from (`statat`, `openat` with `O_NOFOLLOW`), so no link is ever followed and nothing is
/// resolved again by path. `top` itself is opened by its path, whose way [`trail`] judges.
/// More than [`MAX_TREE_ENTRIES`] entries or [`MAX_TREE_DEPTH`] levels is an error, as is
/// anything unreadable.
pub fn judge_tree(top: &Path, pool: &Pool, agent_uid: u32) -> io::Result<Option<Untrusted>> {
    let dir: OwnedFd = rustix::fs::open(
        top,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&dir)?;
    let seen = Seen {
        path: top.to_owned(),
        uid: stat.st_uid,
        mode: stat.st_mode,
        target: None,
    };
    if let Some(untrusted) = judge(&seen, None, Some(top), pool, agent_uid) {
        return Ok(Some(untrusted));
    }
    let mut walk = TreeWalk {
        top,
        pool,
        agent_uid,
        entries: 0,
    };
    walk.dir(&dir, &seen, 1)
}

/// One [`judge_tree`] under way: the bounds' count and what every entry is judged against.
struct TreeWalk<'a> {
    top: &'a Path,
    pool: &'a Pool,
    agent_uid: u32,
    entries: usize,
}

impl TreeWalk<'_> {
    /// Judges the entries of the open directory `dir` (seen as `seen`), `depth` levels below
    /// the top, and the directories among them, depth first in name order.
    fn dir(&mut self, dir: &OwnedFd, seen: &Seen, depth: usize) -> io::Result<Option<Untrusted>> {
        let mut names = crate::workspace::entry_names(dir)?;
        names.sort_by(|a, b| a.to_bytes().cmp(b.to_bytes()));
        for name in names {
            let path = seen.path.join(OsStr::from_bytes(name.to_bytes()));
            self.entries += 1;
            if self.entries > MAX_TREE_ENTRIES {
                return Err(io::Error::other(format!(
                    "{} holds more than {MAX_TREE_ENTRIES} entries, far more than a runner package; point the configuration at the package itself",
                    self.top.display()
                )));
            }
            if depth > MAX_TREE_DEPTH {
                return Err(io::Error::other(format!(
                    "{} nests more than {MAX_TREE_DEPTH} levels deep at {}; flatten it",
                    self.top.display(),
                    path.display()
                )));
            }
            let entry = self.stat(dir, &name, path)?;
            if let Some(untrusted) = judge(
                &entry,
                Some(seen),
                Some(self.top),
                self.pool,
                self.agent_uid,
            ) {
                return Ok(Some(untrusted));
            }
            if entry.is_dir() {
                let below: OwnedFd = rustix::fs::openat(dir, &name, DIR_FLAGS, Mode::empty())
                    .map_err(|e| at(&entry.path, e.into()))?;
                if let Some(untrusted) = self.dir(&below, &entry, depth + 1)? {
                    return Ok(Some(untrusted));
                }
            }
        }
        Ok(None)
    }

    /// The entry `name` of `dir` as [`judge`] takes it, a link's target read beside it.
    fn stat(&self, dir: &OwnedFd, name: &CStr, path: PathBuf) -> io::Result<Seen> {
        let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| at(&path, e.into()))?;
        let target = if stat.st_mode & S_IFMT == S_IFLNK {
            let read =
                rustix::fs::readlinkat(dir, name, Vec::new()).map_err(|e| at(&path, e.into()))?;
            Some(PathBuf::from(OsStr::from_bytes(read.as_bytes())))
        } else {
            None
        };
        Ok(Seen {
            path,
            uid: stat.st_uid,
            mode: stat.st_mode,
            target,
        })
    }
}

/// `error` about `path`, with the path named.
fn at(path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// What a reader is about to read: one file, or a whole tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An `env_file` or an image tarball: the way to it and the file.
    File,
    /// The runner package: the way to it and every entry below it.
    Tree,
}

/// Why a job could change `path` (`kind`), if it could, as "problem; fix": [`judge_trail`] over
/// its [`trail`], then for a tree [`judge_tree`], with the effective uid as the agent's. A path
/// that is not there is not judged (its reader says it is missing); one that cannot be read is
/// refused with the reason.
pub fn changeable(path: &Path, kind: Kind, pool: &Pool) -> Option<String> {
    let agent_uid = rustix::process::geteuid().as_raw();
    let judged = trail(path).and_then(|trail| {
        if let Some(untrusted) = judge_trail(&trail, pool, agent_uid) {
            return Ok(Some(untrusted));
        }
        match kind {
            Kind::File => Ok(None),
            Kind::Tree => judge_tree(path, pool, agent_uid),
        }
    });
    match judged {
        Ok(untrusted) => untrusted.map(|u| u.describe()),
        Err(e) if e.kind() == io::ErrorKind::NotFound && !path.exists() => None,
        Err(e) => Some(format!(
            "cannot tell who may change {}: {e}; check the path and its permissions",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests;
