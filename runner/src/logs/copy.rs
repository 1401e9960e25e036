//! Reading a runtime's `_diag` safely: the runtime is written by a hostile job, so every name is
//! opened relative to a directory descriptor, never through a link (`O_NOFOLLOW`), without
//! blocking on a FIFO or a device (`O_NONBLOCK`), and only a regular file (checked with `fstat`
//! on the descriptor it was opened as, with no other name: no hard link) is read. Only the top level of `_diag` is read: a
//! directory in it (a loop of links, a deep tree) is never entered. A file over its cap keeps
//! its head and its tail, cut at line ends, with one marker line saying how many bytes were
//! left out. A file is streamed ([`stream_capped`]): read a chunk at a time and handed on line
//! by line, a line longer than [`MAX_PIECE`] in pieces, so a reader holds a chunk and a piece
//! however large the file, and counts what it read.

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

/// How many bytes a streamed read takes from a file at once.
pub const READ_CHUNK: usize = 64 << 10;

/// The longest piece of one line handed on at once. A longer line (megabytes without a line
/// end, a sparse file's zeros) is handed on in pieces, each cut where no secret's shape can be
/// cut ([`cut_at`]): no reader of a job's file ever holds more than this and one chunk.
pub const MAX_PIECE: usize = 1 << 20;

/// What a streamed read did, by its own count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streamed {
    /// Bytes read from the file, looking for line ends included.
    pub read: u64,
    /// The most bytes held at once: the chunk buffer and the line being gathered (capacity).
    pub held: usize,
}

impl Streamed {
    /// Two reads' counts together (the bytes of both, the larger buffer).
    pub fn add(&mut self, other: Streamed) {
        self.read += other.read;
        self.held = self.held.max(other.held);
    }
}

/// The sizes a streamed read works in ([`READ_CHUNK`], [`MAX_PIECE`]; tests use small ones to
/// reach every edge).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub chunk: usize,
    pub piece: usize,
}

impl Sizes {
    pub(crate) const DEFAULT: Sizes = Sizes {
        chunk: READ_CHUNK,
        piece: MAX_PIECE,
    };
}

/// Receives a text piece by piece: a piece holds no line end, and the flag says whether one
/// followed it (`false`: the line goes on in the next piece, or the text ends without one).
pub type Sink<'a> = &'a mut dyn FnMut(&[u8], bool) -> io::Result<()>;

/// Streams the bytes of a file kept under `cap` to `sink`: all of it when it fits; else its
/// head and its tail cut at line ends with the [`marker`] line between them. Reads a file under
/// its cap once; over it, at most `cap` bytes and two chunks more (the chunk the head's last
/// and the tail's first line end were found in is read again); holds at most a chunk, and a
/// line of at most a [`MAX_PIECE`] and a chunk.
pub fn stream_capped(file: &File, size: u64, cap: u64, sink: Sink<'_>) -> io::Result<Streamed> {
    stream_capped_in(file, size, cap, Sizes::DEFAULT, sink)
}

pub(crate) fn stream_capped_in(
    file: &File,
    size: u64,
    cap: u64,
    sizes: Sizes,
    sink: Sink<'_>,
) -> io::Result<Streamed> {
    let mut reader = Reader::new(file, sizes);
    if size <= cap {
        reader.stream(0, size, sink)?;
        return Ok(reader.stats);
    }
    let half = cap / 2;
    let head_end = reader.last_line_end(0, half)?.map_or(0, |at| at + 1);
    let tail_start = reader
        .first_line_end(size - half, size)?
        .map_or(size, |at| at + 1);
    reader.stream(0, head_end, sink)?;
    sink(marker(tail_start - head_end).as_bytes(), true)?;
    reader.stream(tail_start, size, sink)?;
    Ok(reader.stats)
}

/// Streams a whole file (a kept copy, already capped and scrubbed) to `sink`, piece by piece.
pub fn stream_all(file: &File, sink: Sink<'_>) -> io::Result<Streamed> {
    let mut reader = Reader::new(file, Sizes::DEFAULT);
    reader.stream(0, u64::MAX, sink)?;
    Ok(reader.stats)
}

/// Whether a byte may be part of a secret's shape (a token, a JWT, base64 and its padding).
fn in_secret_shape(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_' | b'.' | b'=')
}

/// Where the first piece of an over-long `line` ends, at most `max` bytes in (pure): after the
/// last ASCII byte no secret's shape holds (a space, a quote, a control), so a token is not
/// cut in two and left unrecognised; else at the last character's start (a UTF-8 character is
/// never cut); else at `max`.
pub fn cut_at(line: &[u8], max: usize) -> usize {
    let window = &line[..max.min(line.len())];
    if let Some(at) = window
        .iter()
        .rposition(|b| b.is_ascii() && !in_secret_shape(*b))
    {
        return at + 1;
    }
    // `line[at]` starts a character: the piece is `line[..at]`.
    (1..=window.len())
        .rev()
        .take(4)
        .find(|at| line.get(*at).is_none_or(|b| b & 0xC0 != 0x80))
        .unwrap_or(window.len())
}

/// A file read in chunks through one buffer, counting what it reads and holds.
struct Reader<'a> {
    file: &'a File,
    sizes: Sizes,
    buf: Vec<u8>,
    stats: Streamed,
}

impl<'a> Reader<'a> {
    fn new(file: &'a File, sizes: Sizes) -> Reader<'a> {
        Reader {
            file,
            sizes,
            // Allocated once, to the size (growing it would round a small one up).
            buf: vec![0; sizes.chunk],
            stats: Streamed::default(),
        }
    }

    /// Reads up to `len` (at most a chunk) bytes at `offset` into the buffer; fewer at the
    /// file's end.
    fn fill(&mut self, offset: u64, len: u64) -> io::Result<usize> {
        let len = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(self.sizes.chunk);
        let mut filled = 0;
        while filled < len {
            match self
                .file
                .read_at(&mut self.buf[filled..len], offset + filled as u64)
            {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.stats.read += filled as u64;
        self.stats.held = self.stats.held.max(self.buf.capacity());
        Ok(filled)
    }

    /// The offset of the last line end in `start..end`, read backwards a chunk at a time.
    fn last_line_end(&mut self, start: u64, end: u64) -> io::Result<Option<u64>> {
        let mut at = end;
        while at > start {
            let from = at.saturating_sub(self.sizes.chunk as u64).max(start);
            let n = self.fill(from, at - from)?;
            if let Some(i) = self.buf[..n].iter().rposition(|b| *b == b'\n') {
                return Ok(Some(from + i as u64));
            }
            at = from;
        }
        Ok(None)
    }

    /// The offset of the first line end in `start..end`.
    fn first_line_end(&mut self, start: u64, end: u64) -> io::Result<Option<u64>> {
        let mut at = start;
        while at < end {
            let n = self.fill(at, end - at)?;
            if n == 0 {
                break;
            }
            if let Some(i) = self.buf[..n].iter().position(|b| *b == b'\n') {
                return Ok(Some(at + i as u64));
            }
            at += n as u64;
        }
        Ok(None)
    }

    /// Hands `start..end` (or to the file's end) to `sink` line by line, a line over the
    /// piece size in pieces.
    fn stream(&mut self, start: u64, end: u64, sink: Sink<'_>) -> io::Result<()> {
        let mut line: Vec<u8> = Vec::new();
        let mut at = start;
        while at < end {
            let n = self.fill(at, end - at)?;
            if n == 0 {
                break;
            }
            at += n as u64;
            let mut rest = &self.buf[..n];
            loop {
                let (part, ended) = match rest.iter().position(|b| *b == b'\n') {
                    Some(i) => (&rest[..i], true),
                    None => (rest, false),
                };
                // Grown by doubling up to a piece and a chunk, never past: what is held is
                // bounded by the sizes, not by how the line came in.
                let needed = line.len() + part.len();
                if needed > line.capacity() {
                    let most = self.sizes.piece + self.sizes.chunk;
                    let grown = needed.max((line.capacity() * 2).min(most));
                    line.reserve_exact(grown - line.len());
                }
                line.extend_from_slice(part);
                while line.len() > self.sizes.piece {
                    let cut = cut_at(&line, self.sizes.piece);
                    sink(&line[..cut], false)?;
                    line.drain(..cut);
                }
                self.stats.held = self.stats.held.max(self.buf.capacity() + line.capacity());
                if !ended {
                    break;
                }
                sink(&line, true)?;
                line.clear();
                rest = &rest[part.len() + 1..];
            }
        }
        if !line.is_empty() {
            sink(&line, false)?;
        }
        Ok(())
    }
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
/// The rule [`stream_capped`] follows without holding the file, in memory: its tests' model.
#[cfg(test)]
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

/// [`stream_capped`] on bytes in memory (the pure rule's table, and the model streaming is
/// held to).
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
