//! The file-system side of [`super`]: every path resolved beneath the root by the kernel
//! (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` from a root directory fd), every
//! entry made relative to its resolved parent with `*at` calls that never follow a final
//! symlink, and a directory tree removed without following links. Thin adapters: what to make
//! is decided in [`super`].

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Timespec, Timestamps, Uid,
};

/// How often a resolution is retried when the kernel answers `EAGAIN` (`openat2` does when a
/// rename raced a `..` lookup under `RESOLVE_IN_ROOT`; nothing renames inside a root being
/// unpacked, so one retry is already unexpected).
const RESOLVE_RETRIES: u32 = 8;

/// The mode of a parent directory a layer uses without listing it (as Docker makes them).
const IMPLICIT_DIR_MODE: u32 = 0o755;

/// The owner, mode and mtime a tar header (and its pax extensions) gives an entry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mode: u32,
    pub(super) mtime: (i64, u32),
}

/// The pax keys naming an extended attribute (GNU tar/star's and libarchive's).
const XATTR_PREFIXES: [&[u8]; 2] = [b"SCHILY.xattr.", b"LIBARCHIVE.xattr."];

impl Meta {
    /// Reads an entry's owner, mode and mtime, pax `uid`/`gid`/`mtime` winning over the header
    /// (they carry what the header's fields cannot hold); also the names of the extended
    /// attributes it carries, which are not applied.
    pub(super) fn of<R: Read>(
        entry: &mut tar::Entry<'_, R>,
    ) -> Result<(Meta, Vec<String>), &'static str> {
        let header = entry.header();
        let old = header.as_old();
        let mut uid = empty_is_zero(&old.uid, header.uid()).ok_or("an unreadable uid")?;
        let mut gid = empty_is_zero(&old.gid, header.gid()).ok_or("an unreadable gid")?;
        let mode = empty_is_zero(&old.mode, header.mode().map(u64::from))
            .and_then(|m| u32::try_from(m).ok())
            .ok_or("an unreadable mode")?;
        let secs = empty_is_zero(&old.mtime, header.mtime()).ok_or("an unreadable mtime")?;
        let mut mtime = (i64::try_from(secs).map_err(|_| "an mtime out of range")?, 0);
        let mut xattrs = Vec::new();
        if let Some(pax) = entry
            .pax_extensions()
            .map_err(|_| "unreadable pax extensions")?
        {
            for ext in pax {
                let ext = ext.map_err(|_| "an unreadable pax extension")?;
                let value = ext.value_bytes();
                match ext.key_bytes() {
                    b"uid" => uid = parse_decimal(value).ok_or("an unreadable pax uid")?,
                    b"gid" => gid = parse_decimal(value).ok_or("an unreadable pax gid")?,
                    b"mtime" => mtime = parse_pax_time(value).ok_or("an unreadable pax mtime")?,
                    k => {
                        if let Some(name) = XATTR_PREFIXES.iter().find_map(|p| k.strip_prefix(*p)) {
                            xattrs.push(String::from_utf8_lossy(name).into_owned());
                        }
                    }
                }
            }
        }
        Ok((
            Meta {
                uid: id_of(uid).ok_or("a uid out of range")?,
                gid: id_of(gid).ok_or("a gid out of range")?,
                mode,
                mtime,
            },
            xattrs,
        ))
    }

    fn times(&self) -> Timestamps {
        let t = Timespec {
            tv_sec: self.mtime.0,
            tv_nsec: i64::from(self.mtime.1),
        };
        Timestamps {
            last_access: t,
            last_modification: t,
        }
    }

    fn owner(&self) -> (Option<Uid>, Option<Gid>) {
        (Some(Uid::from_raw(self.uid)), Some(Gid::from_raw(self.gid)))
    }
}

/// A uid or gid as the kernel takes it: `u32::MAX` is `-1`, "leave unchanged", never an owner.
/// A numeric header field read as tar tools read it: a field left empty (all NUL or spaces)
/// is 0, as GNU tar and Go's `archive/tar` (Docker's and containerd's) take it, so an image
/// they accept is not refused for it; any other unreadable value is refused.
fn empty_is_zero(field: &[u8], parsed: std::io::Result<u64>) -> Option<u64> {
    match parsed {
        Ok(value) => Some(value),
        Err(_) if field.iter().all(|b| *b == 0 || *b == b' ') => Some(0),
        Err(_) => None,
    }
}

fn id_of(v: u64) -> Option<u32> {
    u32::try_from(v).ok().filter(|v| *v != u32::MAX)
}

/// A pax decimal number (`uid`, `gid`).
pub(super) fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A pax time: decimal seconds, maybe negative, maybe with a fraction (`1700000000.25`), as
/// seconds and nanoseconds (digits past nanoseconds dropped).
pub(super) fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let (neg, v) = match v.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let (whole, frac) = match v.iter().position(|b| *b == b'.') {
        Some(i) => (&v[..i], &v[i + 1..]),
        None => (v, &b""[..]),
    };
    if !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let secs = i64::try_from(parse_decimal(whole)?).ok()?;
    let mut nanos: u32 = 0;
    for i in 0..9 {
        nanos = nanos * 10 + frac.get(i).map_or(0, |d| u32::from(d - b'0'));
    }
    if neg {
        // -1.25 is 1.25 s before the epoch: -2 s + 0.75 s.
        if nanos == 0 {
            Some((-secs, 0))
        } else {
            Some((-secs - 1, 1_000_000_000 - nanos))
        }
    } else {
        Some((secs, nanos))
    }
}

/// The root an image is unpacked into, held as an `O_PATH` directory fd every lookup starts at.
pub(super) struct Beneath {
    root: OwnedFd,
}

impl Beneath {
    pub(super) fn open(root: &Path) -> io::Result<Beneath> {
        let root = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Beneath { root })
    }

    /// Opens the directory at `comps` (the root for none), resolved beneath the root: symlinks
    /// on the way followed as if the root were `/`, magic links refused.
    fn resolve(&self, comps: &[&[u8]], flags: OFlags) -> io::Result<OwnedFd> {
        let path = if comps.is_empty() {
            b".".to_vec()
        } else {
            comps.join(&b'/')
        };
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(
                &self.root,
                &path,
                flags | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            ) {
                Err(rustix::io::Errno::AGAIN) if tries < RESOLVE_RETRIES => tries += 1,
                other => return Ok(other?),
            }
        }
    }

    /// The existing directory at `comps`, as an `O_PATH` fd for `*at` calls.
    pub(super) fn existing_dir(&self, comps: &[&[u8]]) -> io::Result<OwnedFd> {
        self.resolve(comps, OFlags::PATH)
    }

    /// The directory at `comps`, made (owned by root, [`IMPLICIT_DIR_MODE`]) where missing.
    pub(super) fn parent(&self, comps: &[&[u8]]) -> io::Result<OwnedFd> {
        match self.existing_dir(comps) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => return other,
        }
        // Walk down from the root, making each missing component relative to the one above
        // it as resolved: a component that is a dangling symlink stays an error (ENOENT), never
        // a directory made through it.
        let mut fd = self.existing_dir(&[])?;
        for i in 1..=comps.len() {
            match self.existing_dir(&comps[..i]) {
                Ok(next) => fd = next,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    rustix::fs::mkdirat(&fd, comps[i - 1], Mode::from_raw_mode(0o700))?;
                    let made = rustix::fs::openat(
                        &fd,
                        comps[i - 1],
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?;
                    rustix::fs::fchmod(&made, Mode::from_raw_mode(IMPLICIT_DIR_MODE))?;
                    fd = self.existing_dir(&comps[..i])?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(fd)
    }

    /// Deletes `name` in the directory at `dir` (a whiteout); nothing there is no error.
    pub(super) fn delete(&self, dir: &[&[u8]], name: &[u8]) -> io::Result<()> {
        match self.existing_dir(dir) {
            Ok(fd) => clear_slot(&fd, name, false).map(|_| ()),
            Err(e) if is_absent(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes everything under the directory at `dir` that this layer did not write
    /// (`written`, keys as [`super::key`] makes them), descending into the directories it did
    /// write: their lower contents go too.
    pub(super) fn make_opaque(&self, dir: &[&[u8]], written: &HashSet<Vec<u8>>) -> io::Result<()> {
        let mut stack = vec![super::key(dir)];
        while let Some(path) = stack.pop() {
            let comps: Vec<&[u8]> = path
                .split(|b| *b == b'/')
                .filter(|c| !c.is_empty())
                .collect();
            let fd = match self.resolve(&comps, OFlags::RDONLY) {
                Ok(fd) => fd,
                Err(e) if is_absent(&e) => continue,
                Err(e) => return Err(e),
            };
            for (name, is_dir) in list(&fd)? {
                let mut child = path.clone();
                if !child.is_empty() {
                    child.push(b'/');
                }
                child.extend_from_slice(&name);
                if !written.contains(&child) {
                    clear_slot(&fd, &name, false)?;
                } else if is_dir {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// Gives the root itself the owner and mode of the layer's `./` entry.
    pub(super) fn set_root(&self, meta: &Meta, mode: u32) -> io::Result<()> {
        let fd = self.resolve(&[], OFlags::RDONLY)?;
        set_owner_mode(&fd, meta, mode)
    }

    /// Sets a directory's mtime, named by its key; gone since (a later entry replaced it) is
    /// no error.
    pub(super) fn set_dir_time(&self, key: &[u8], meta: &Meta) -> io::Result<()> {
        let comps: Vec<&[u8]> = key
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let result = match comps.split_last() {
            None => rustix::fs::utimensat(&self.root, ".", &meta.times(), AtFlags::empty()),
            Some((name, parent)) => {
                let fd = match self.existing_dir(parent) {
                    Ok(fd) => fd,
                    Err(e) if is_absent(&e) => return Ok(()),
                    Err(e) => return Err(e),
                };
                rustix::fs::utimensat(&fd, *name, &meta.times(), AtFlags::SYMLINK_NOFOLLOW)
            }
        };
        match result {
            Err(rustix::io::Errno::NOENT) => Ok(()),
            other => Ok(other?),
        }
    }
}

/// ENOENT or ENOTDIR: the path is not there (as a directory) to act on.
fn is_absent(e: &io::Error) -> bool {
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR)
    )
}

/// Makes room for a new entry `name` in `parent`: a non-directory there is unlinked, a
/// directory removed with everything under it unless `keep_dir` (a directory entry over a
/// directory keeps its contents). Returns whether a directory was kept.
pub(super) fn clear_slot(parent: &impl AsFd, name: &[u8], keep_dir: bool) -> io::Result<bool> {
    let stat = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        if keep_dir {
            return Ok(true);
        }
        remove_tree(parent, name)?;
    } else {
        rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
    }
    Ok(false)
}

/// Sets an open entry's owner, then its mode (in that order: chown clears setuid bits).
fn set_owner_mode(fd: &impl AsFd, meta: &Meta, mode: u32) -> io::Result<()> {
    let (uid, gid) = meta.owner();
    rustix::fs::fchown(fd, uid, gid)?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?;
    Ok(())
}

/// Opens an entry just made by name, never following a symlink.
fn open_made(parent: &impl AsFd, name: &[u8], flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// A directory entry: an existing directory keeps its contents and takes the new owner and
/// mode; anything else at the name is replaced. Its mtime is set later (by the caller).
pub(super) fn dir(parent: &impl AsFd, name: &[u8], meta: &Meta, mode: u32) -> io::Result<()> {
    if !clear_slot(parent, name, true)? {
        rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))?;
    }
    let fd = open_made(parent, name, OFlags::RDONLY | OFlags::DIRECTORY)?;
    set_owner_mode(&fd, meta, mode)
}

/// A regular file, created exclusively (never through a symlink left at the name) and filled.
pub(super) fn file(
    parent: &impl AsFd,
    name: &[u8],
    meta: &Meta,
    mode: u32,
    data: &mut impl Read,
) -> io::Result<()> {
    clear_slot(parent, name, false)?;
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = File::from(fd);
    io::copy(data, &mut file)?;
    set_owner_mode(&file, meta, mode)?;
    rustix::fs::futimens(&file, &meta.times())?;
    Ok(())
}

/// A symlink, its target stored as the layer gave it (resolved inside the image at run time,
/// and by [`Beneath`] here).
pub(super) fn symlink(
    parent: &impl AsFd,
    name: &[u8],
    target: &[u8],
    meta: &Meta,
) -> io::Result<()> {
    clear_slot(parent, name, false)?;
    rustix::fs::symlinkat(target, parent, name)?;
    let (uid, gid) = meta.owner();
    rustix::fs::chownat(parent, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
    rustix::fs::utimensat(parent, name, &meta.times(), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// A fifo (the only special file made: it reaches nothing outside the image).
pub(super) fn fifo(parent: &impl AsFd, name: &[u8], meta: &Meta, mode: u32) -> io::Result<()> {
    clear_slot(parent, name, false)?;
    rustix::fs::mknodat(parent, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)?;
    // Non-blocking: opening a fifo for reading otherwise waits for a writer.
    let fd = open_made(parent, name, OFlags::RDONLY | OFlags::NONBLOCK)?;
    set_owner_mode(&fd, meta, mode)?;
    rustix::fs::futimens(&fd, &meta.times())?;
    Ok(())
}

/// A hard link `name` in `parent` to `target_name` in `target_parent` (both resolved beneath
/// the root); a symlink as the target is linked itself, not followed.
pub(super) fn link(
    parent: &impl AsFd,
    name: &[u8],
    target_parent: &impl AsFd,
    target_name: &[u8],
) -> io::Result<()> {
    clear_slot(parent, name, false)?;
    rustix::fs::linkat(target_parent, target_name, parent, name, AtFlags::empty())?;
    Ok(())
}

/// The entries of an open directory (`.` and `..` left out), each with whether it is a
/// directory (as `lstat` says where the file system gives no type).
fn list(dir: &impl AsFd) -> io::Result<Vec<(Vec<u8>, bool)>> {
    let mut out = Vec::new();
    let mut entries = Dir::read_from(dir)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => FileType::from_raw_mode(stat.st_mode) == FileType::Directory,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            },
            t => t == FileType::Directory,
        };
        out.push((name.to_vec(), is_dir));
    }
    Ok(out)
}

/// Removes the directory `name` in `parent` and everything under it, never following a
/// symlink, with two directory fds open at a time however deep the tree (a hostile layer can
/// nest directories past any stack or fd limit through symlinked parents): it descends by
/// name with `O_NOFOLLOW` and climbs back through `..`, which for a directory reached that way
/// is the one it came from. Entries already gone (another remover) are no error.
pub(crate) fn remove_tree(parent: &impl AsFd, name: &[u8]) -> io::Result<()> {
    let open = |at: &dyn AsFd, name: &[u8]| {
        rustix::fs::openat(
            at.as_fd(),
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let gone = |e: &rustix::io::Errno| *e == rustix::io::Errno::NOENT;
    let mut fd = match open(parent, name) {
        Ok(fd) => fd,
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    // Each level: the directory's name in the one above, and its subdirectories still to do.
    let mut stack: Vec<(Vec<u8>, Vec<Vec<u8>>)> = vec![(name.to_vec(), scan(&fd)?)];
    loop {
        let Some((_, pending)) = stack.last_mut() else {
            return Ok(());
        };
        if let Some(child) = pending.pop() {
            match open(&fd, &child) {
                Ok(child_fd) => {
                    let pending = scan(&child_fd)?;
                    stack.push((child, pending));
                    fd = child_fd;
                }
                Err(e) if gone(&e) => {}
                // Not a directory any more (replaced since the scan): unlink it as it is now.
                Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
                    unlink_quiet(&fd, &child, AtFlags::empty())?;
                }
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        let Some((done, _)) = stack.pop() else {
            return Ok(());
        };
        if stack.is_empty() {
            return unlink_quiet(parent, &done, AtFlags::REMOVEDIR);
        }
        let up = open(&fd, b"..")?;
        unlink_quiet(&up, &done, AtFlags::REMOVEDIR)?;
        fd = up;
    }
}

/// Unlinks an open directory's non-directories; returns its subdirectories' names.
fn scan(dir: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    let mut dirs = Vec::new();
    for (name, is_dir) in list(dir)? {
        if is_dir {
            dirs.push(name);
        } else {
            unlink_quiet(dir, &name, AtFlags::empty())?;
        }
    }
    Ok(dirs)
}

/// `unlinkat`, an entry already gone being no error.
fn unlink_quiet(dir: &impl AsFd, name: &[u8], flags: AtFlags) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, flags) {
        Err(rustix::io::Errno::NOENT) => Ok(()),
        other => Ok(other?),
    }
}
