//! Walking a directory tree a job made, without recursion and with a bounded number of open
//! descriptors: what removing a runtime, scrubbing a slot and handing a `_work` to a runner uid
//! ([`crate::isolate::chown_tree`]) are built on.
//!
//! A job can nest directories as deep as the kernel lets it (nothing bounds the depth but
//! inodes), so neither the call stack nor the descriptor table may grow with the depth: a tree
//! 100 000 levels deep must be walked to the bottom, not refused (a runtime that cannot be
//! removed never releases its uid). [`DirStack`] keeps, for every level, the names still to
//! visit, but an open descriptor only for the top and the deepest [`OPEN_DIRS`] levels.
//!
//! A level whose descriptor was closed is opened again through `..` of the level below it, and
//! is used only if it is still the very directory that was left (same device and inode). A
//! directory a job moved while the walk was below it therefore stops the walk with an error
//! (the caller tries again later) instead of letting it climb into whatever `..` is now: the
//! walk never leaves the tree it started in. Descriptors the walk holds pin their directories,
//! as a recursive walk's would; a held directory that was moved elsewhere is still the one the
//! walk entered.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};

use super::entry_names;

/// How many levels below the top keep their directory descriptor open during a walk. Deeper
/// levels than this behind the walk's position are closed and reopened through `..` on the way
/// back up, so a walk never holds more than `OPEN_DIRS + 1` descriptors whatever the depth
/// (plus, for a moment, the directory it is entering and the one reading a directory's names).
/// Sixteen makes the reopening rare in real checkouts (which seldom nest deeper) and costs
/// nothing against the agent's descriptor limit.
pub(crate) const OPEN_DIRS: usize = 16;

/// What identifies a directory across a close and a reopen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirId {
    dev: u64,
    ino: u64,
}

impl DirId {
    fn of(fd: impl AsFd) -> io::Result<Self> {
        let stat = rustix::fs::fstat(fd)?;
        Ok(Self {
            dev: stat.st_dev,
            ino: stat.st_ino,
        })
    }
}

/// One level of the walk: a directory entered and what is left to do in it.
#[derive(Debug)]
struct Level {
    /// Open while the level is the top or among the deepest [`OPEN_DIRS`].
    fd: Option<OwnedFd>,
    id: DirId,
    /// Its name in the level above (empty for the top, which is the caller's).
    name: CString,
    /// Names read from it and not yet visited; taken from the end.
    pending: Vec<CString>,
    /// How many times its names were read.
    reads: usize,
}

/// The directories from the top of a walk down to where it is now. The deepest level's
/// descriptor is always open ([`DirStack::dir`]).
#[derive(Debug)]
pub(crate) struct DirStack {
    levels: Vec<Level>,
}

impl DirStack {
    /// Starts a walk at the open directory `top` and reads its names.
    pub(crate) fn new(top: OwnedFd) -> io::Result<Self> {
        let mut stack = Self { levels: Vec::new() };
        stack.push(top, CString::default())?;
        Ok(stack)
    }

    /// The deepest level's directory.
    pub(crate) fn dir(&self) -> io::Result<&OwnedFd> {
        self.levels
            .last()
            .and_then(|level| level.fd.as_ref())
            .ok_or_else(|| io::Error::other("the directory walk lost its place"))
    }

    /// The next name of the deepest level still to visit.
    pub(crate) fn next_name(&mut self) -> Option<CString> {
        self.levels.last_mut()?.pending.pop()
    }

    /// Reads the deepest level's names again (a removal re-reads a directory until a read finds
    /// it empty); whether any were found.
    pub(crate) fn reread(&mut self) -> io::Result<bool> {
        let names = entry_names(self.dir()?)?;
        let found = !names.is_empty();
        if let Some(level) = self.levels.last_mut() {
            level.pending = names;
            level.reads += 1;
        }
        Ok(found)
    }

    /// How many times the deepest level's names have been read.
    pub(crate) fn reads(&self) -> usize {
        self.levels.last().map_or(0, |level| level.reads)
    }

    /// Goes down into `dir`, the entry `name` of the deepest level, which the caller opened
    /// (without following a link) and checked; its names are read. The descriptor of the level
    /// [`OPEN_DIRS`] above the new one is closed.
    pub(crate) fn descend(&mut self, dir: OwnedFd, name: &CStr) -> io::Result<()> {
        self.push(dir, name.to_owned())?;
        let depth = self.levels.len() - 1;
        if depth > OPEN_DIRS {
            // Never the top's (index 0): the walk ends there and its caller works on it.
            if let Some(level) = self.levels.get_mut(depth - OPEN_DIRS) {
                level.fd = None;
            }
        }
        Ok(())
    }

    /// Leaves the deepest level, all of its names visited: returns its name in the level above,
    /// which is now the deepest and open ([`DirStack::dir`]), or `None` when the level left was
    /// the top (the walk is done and the top stays open). Reopening a level through `..` fails
    /// if it is no longer the directory the walk came down through.
    pub(crate) fn ascend(&mut self) -> io::Result<Option<CString>> {
        if self.levels.len() <= 1 {
            return Ok(None);
        }
        let Some(left) = self.levels.pop() else {
            return Ok(None);
        };
        let Some(above) = self.levels.last_mut() else {
            return Ok(None);
        };
        if above.fd.is_none() {
            let Some(below) = left.fd.as_ref() else {
                return Err(io::Error::other("the directory walk lost its place"));
            };
            let reopened = rustix::fs::openat(
                below,
                c"..",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            if DirId::of(&reopened)? != above.id {
                return Err(moved());
            }
            above.fd = Some(reopened);
        }
        Ok(Some(left.name))
    }

    fn push(&mut self, dir: OwnedFd, name: CString) -> io::Result<()> {
        let id = DirId::of(&dir)?;
        let pending = entry_names(&dir)?;
        self.levels.push(Level {
            fd: Some(dir),
            id,
            name,
            pending,
            reads: 1,
        });
        Ok(())
    }

    /// How many levels hold an open descriptor.
    #[cfg(test)]
    fn open_levels(&self) -> usize {
        self.levels
            .iter()
            .filter(|level| level.fd.is_some())
            .count()
    }
}

/// A directory above the walk's position is not where the walk left it.
fn moved() -> io::Error {
    io::Error::other(
        "a directory was moved while the tree was walked; the walk stopped rather than leave the tree",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: OFlags = OFlags::RDONLY
        .union(OFlags::DIRECTORY)
        .union(OFlags::NOFOLLOW)
        .union(OFlags::CLOEXEC);

    /// A chain `d/d/.../d` of `levels` directories under `top`, through descriptors (a path of
    /// thousands of components would exceed `PATH_MAX`).
    fn chain(top: &std::path::Path, levels: usize) {
        let mut dir = rustix::fs::open(top, FLAGS, Mode::empty()).unwrap();
        for _ in 0..levels {
            rustix::fs::mkdirat(&dir, c"d", Mode::RWXU).unwrap();
            dir = rustix::fs::openat(&dir, c"d", FLAGS, Mode::empty()).unwrap();
        }
    }

    /// A scratch directory on a tmpfs where there is one: this host's disk takes seconds per
    /// thousand levels of a chain, and the walk is under test, not the disk.
    fn scratch() -> tempfile::TempDir {
        match std::path::Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm").unwrap(),
            false => tempfile::tempdir().unwrap(),
        }
    }

    /// Walks down the chain to its bottom, checking the descriptor bound at every step.
    fn walk_down(stack: &mut DirStack) -> usize {
        let mut depth = 0;
        while let Some(name) = stack.next_name() {
            let child = rustix::fs::openat(stack.dir().unwrap(), &name, FLAGS, Mode::empty());
            stack.descend(child.unwrap(), &name).unwrap();
            depth += 1;
            assert!(
                stack.open_levels() <= OPEN_DIRS + 1,
                "{} descriptors open at depth {depth}",
                stack.open_levels()
            );
        }
        depth
    }

    #[test]
    fn a_deep_walk_holds_a_bounded_number_of_descriptors_and_climbs_back_to_its_top() {
        let tmp = scratch();
        chain(tmp.path(), 5000);
        let top = rustix::fs::open(tmp.path(), FLAGS, Mode::empty()).unwrap();
        let top_id = DirId::of(&top).unwrap();
        let mut stack = DirStack::new(top).unwrap();
        assert_eq!(walk_down(&mut stack), 5000);
        let mut climbed = 0;
        while let Some(name) = stack.ascend().unwrap() {
            assert_eq!(name.as_bytes(), b"d");
            climbed += 1;
            assert!(stack.open_levels() <= OPEN_DIRS + 1);
        }
        assert_eq!(climbed, 5000);
        assert_eq!(DirId::of(stack.dir().unwrap()).unwrap(), top_id);
    }

    /// The walk is below a level whose descriptor it closed; a job moves that level out of the
    /// tree. Climbing back, `..` of the moved level is the directory it was moved into: the
    /// walk must refuse it, not go on there.
    #[test]
    fn a_level_moved_out_of_the_tree_stops_the_walk_instead_of_climbing_out() {
        let tmp = scratch();
        let tree = tmp.path().join("tree");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let depth = OPEN_DIRS + 30;
        chain(&tree, depth);
        let top = rustix::fs::open(&tree, FLAGS, Mode::empty()).unwrap();
        let mut stack = DirStack::new(top).unwrap();
        walk_down(&mut stack);
        // Level 5 (tree/d/d/d/d/d) goes outside while the walk is far below it.
        let level5: std::path::PathBuf = std::iter::once(tree.clone())
            .chain(std::iter::repeat_n("d".into(), 5))
            .collect();
        std::fs::rename(&level5, outside.join("moved")).unwrap();

        let mut climbed = 0;
        let stopped = loop {
            match stack.ascend() {
                Ok(Some(_)) => climbed += 1,
                Ok(None) => panic!("the walk climbed to a top it should never have reached"),
                Err(e) => break e,
            }
        };
        assert!(stopped.to_string().contains("moved"), "{stopped}");
        // It climbed from the bottom up to level 5 (the moved directory itself, still the one
        // it entered) and stopped before its `..`, which is `outside` now.
        assert_eq!(climbed, depth - 5);
    }
}
