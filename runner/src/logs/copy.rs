//! Reading a runtime's `_diag` safely: the runtime is written by a hostile job, so every name is
//! opened relative to a directory descriptor, never through a link (`O_NOFOLLOW`), without
//! blocking on a FIFO or a device (`O_NONBLOCK`), and only a regular file (checked with `fstat`
//! on the descriptor it was opened as, with no other name: no hard link) is read. Only the top level of `_diag` is read: a
//! directory in it (a loop of links, a deep tree) is never entered. A file over its cap keeps
//! its head and its tail, cut at line ends ([`cap_text`], pure), with one marker line saying how
//! many bytes were left out.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

/// The runner's diagnostics directory in its runtime.
pub const DIAG_DIR: &str = "_diag";

/// The most entries of one `_diag` looked at: a job that made a million files there does not
/// make cleanup read a million names.
pub(crate) const MAX_DIAG_ENTRIES: usize = 4096;

/// The longest file name kept. Names are also limited to [`safe_name`]'s characters: they are
/// printed on an operator's terminal.
pub(crate) const MAX_NAME_LEN: usize = 128;

/// Opens a directory `name` under `dir` without following a link.
pub(crate) fn open_dir_at(dir: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens a directory by path, not following a link in its last component (the components
/// above a runtime are the agent's own).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    open_dir_at(rustix::fs::CWD, path.as_os_str())
}

/// A regular file `name` under `dir`, opened for reading, and its size; anything else (a link, a
/// FIFO, a socket, a device, a directory) is refused with why.
pub fn open_regular_at(dir: impl AsFd, name: &OsStr) -> Result<(File, u64), String> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP => "a symbolic link".to_owned(),
        e => format!("cannot open it: {}", io::Error::from(e)),
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| format!("cannot look at it: {e}"))?;
    match FileType::from_raw_mode(stat.st_mode) {
        // A second name for a file is how a job would show another file's content as its own
        // (with `fs.protected_hardlinks` off, even one it cannot read); a runner's logs have one.
        FileType::RegularFile if stat.st_nlink > 1 => {
            Err("a hard link (a file with another name elsewhere)".to_owned())
        }
        FileType::RegularFile => Ok((File::from(fd), u64::try_from(stat.st_size).unwrap_or(0))),
        other => Err(format!("not a regular file ({other:?})")),
    }
}

/// Whether a name from `_diag` may be kept and printed: `[A-Za-z0-9._-]`, not starting with a
/// dot, at most [`MAX_NAME_LEN`] bytes.
pub fn safe_name(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && bytes[0] != b'.'
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The names at the top of a directory, at most [`MAX_DIAG_ENTRIES`] looked at; `.` and `..`
/// left out. Whether each is a file is decided when it is opened, not from the listing.
pub fn list(dir: impl AsFd) -> io::Result<Vec<std::ffi::OsString>> {
    let mut names = Vec::new();
    let mut listing = rustix::fs::Dir::read_from(dir)?;
    for entry in listing.by_ref().take(MAX_DIAG_ENTRIES) {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// The bytes of a file kept under `cap`: all of it when it fits; else its head and its tail.
pub fn read_capped(file: &File, size: u64, cap: u64) -> io::Result<Vec<u8>> {
    if size <= cap {
        return read_range(file, 0, size);
    }
    let half = cap / 2;
    let head = read_range(file, 0, half)?;
    let tail = read_range(file, size - half, half)?;
    Ok(cap_text(&head, &tail, size))
}

/// Whether the last `tail` bytes of any of the first `most` regular files of the folder `diag`
/// whose names `pick` accepts satisfy `says`. Every file is opened through
/// [`open_regular_at`] (no link, no FIFO wait); a missing or unreadable folder or file says
/// nothing. For the phrases supervision looks for in a runner's logs.
pub fn any_tail(
    diag: &Path,
    pick: impl Fn(&OsStr) -> bool,
    most: usize,
    tail: u64,
    says: impl Fn(&str) -> bool,
) -> bool {
    let Ok(dir) = open_dir(diag) else {
        return false;
    };
    let Ok(names) = list(&dir) else {
        return false;
    };
    names
        .iter()
        .filter(|name| pick(name))
        .take(most)
        .any(|name| {
            let Ok((file, size)) = open_regular_at(&dir, name) else {
                return false;
            };
            let start = size.saturating_sub(tail);
            read_at(&file, start, size - start)
                .is_ok_and(|bytes| says(&String::from_utf8_lossy(&bytes)))
        })
}

/// How many listener logs are looked at (one per listener start; a runtime has one or two).
const MAX_LISTENER_LOGS: usize = 8;

/// Whether the last `tail` bytes of any of actions/runner's listener logs (`Runner_*.log`,
/// written before any job runs) in the folder `diag` satisfy `says` ([`any_tail`]).
pub fn any_listener_log_tail(diag: &Path, tail: u64, says: impl Fn(&str) -> bool) -> bool {
    any_tail(
        diag,
        |name| {
            let name = name.to_string_lossy();
            name.starts_with("Runner_") && name.ends_with(".log")
        },
        MAX_LISTENER_LOGS,
        tail,
        says,
    )
}

/// Reads up to `len` bytes at `offset` (fewer when the file shrank meanwhile).
pub fn read_at(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    read_range(file, offset, len)
}

fn read_range(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(io::Error::other)?;
    let mut buf = vec![0; len];
    let mut filled = 0;
    while filled < len {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The marker line between a capped file's head and tail.
pub fn marker(left_out: u64) -> String {
    format!("[rm-agent: {left_out} bytes left out here: the file was over its cap]")
}

/// A capped file from its first and last bytes (`head`, `tail`) and its whole `size`: the head
/// up to its last line end, the marker line, the tail from its first line start. Cutting at
/// line ends means no secret is kept half (a half is too short for the scrubber to know it).
pub(crate) fn cap_text(head: &[u8], tail: &[u8], size: u64) -> Vec<u8> {
    let head = match head.iter().rposition(|b| *b == b'\n') {
        Some(end) => &head[..=end],
        None => &[],
    };
    let tail = match tail.iter().position(|b| *b == b'\n') {
        Some(start) => &tail[start + 1..],
        None => &[],
    };
    let left_out = size.saturating_sub((head.len() + tail.len()) as u64);
    let mut out = Vec::with_capacity(head.len() + tail.len() + 80);
    out.extend_from_slice(head);
    out.extend_from_slice(marker(left_out).as_bytes());
    out.push(b'\n');
    out.extend_from_slice(tail);
    out
}

/// [`read_capped`] on bytes in memory (tests, and the pure rule's table).
#[cfg(test)]
pub(crate) fn cap_bytes(all: &[u8], cap: u64) -> Vec<u8> {
    let size = all.len() as u64;
    if size <= cap {
        return all.to_vec();
    }
    let half = usize::try_from(cap / 2)
        .unwrap_or(usize::MAX)
        .min(all.len());
    cap_text(&all[..half], &all[all.len() - half..], size)
}
