//! Looking files up inside an image's root as if it were `/`, never reaching the host: every
//! path is resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from a directory fd
//! of the root, so an absolute symlink (`/lib/x -> /usr/lib/x`) or a `..` that climbs past the
//! top lands inside the image, as it will once the image is the runner's root. Also the
//! loader's configuration read from there (`/etc/ld.so.conf` and its `include`s), and the
//! multiarch directories of an architecture. The parsing and the glob are pure and
//! table-tested.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

use super::elf::{Arch, Class, Endian};

/// The most bytes of one loader configuration file read.
pub(crate) const MAX_CONF_BYTES: u64 = 64 * 1024;

/// How deep `include`s of the loader's configuration nest before the rest are ignored
/// (glibc's ldconfig has no bound; a loop must not hang the check).
pub(crate) const MAX_CONF_DEPTH: usize = 8;

/// The most configuration files read in all (`/etc/ld.so.conf.d` holds a handful).
pub(crate) const MAX_CONF_FILES: usize = 256;

/// The most entries of one directory listed (to match `libicuuc.so.*` or an `include` glob);
/// a library directory holds a few thousand.
pub(crate) const MAX_DIR_ENTRIES: usize = 65_536;

/// The directories glibc searches after the cache, for every architecture, after the
/// multiarch ones of [`multiarch_triplets`] (Debian and Ubuntu list those in
/// `/etc/ld.so.conf.d`; they are searched even when an image lacks that file).
pub(crate) const DEFAULT_DIRS: &[&str] = &["/lib64", "/usr/lib64", "/lib", "/usr/lib"];

/// Debian's multiarch triplets by architecture: (class, byte order, `e_machine`, triplets).
const MULTIARCH: &[(Class, Endian, u16, &[&str])] = &[
    (Class::Elf64, Endian::Little, 62, &["x86_64-linux-gnu"]),
    (Class::Elf32, Endian::Little, 3, &["i386-linux-gnu"]),
    (Class::Elf64, Endian::Little, 183, &["aarch64-linux-gnu"]),
    (
        Class::Elf32,
        Endian::Little,
        40,
        &["arm-linux-gnueabihf", "arm-linux-gnueabi"],
    ),
    (Class::Elf64, Endian::Little, 243, &["riscv64-linux-gnu"]),
    (Class::Elf64, Endian::Little, 21, &["powerpc64le-linux-gnu"]),
    (Class::Elf64, Endian::Big, 21, &["powerpc64-linux-gnu"]),
    (Class::Elf64, Endian::Big, 22, &["s390x-linux-gnu"]),
    (
        Class::Elf64,
        Endian::Little,
        258,
        &["loongarch64-linux-gnu"],
    ),
];

/// The multiarch triplets of `arch` (none for one Debian does not name).
pub(crate) fn multiarch_triplets(arch: Arch) -> &'static [&'static str] {
    MULTIARCH
        .iter()
        .find(|(class, endian, machine, _)| {
            *class == arch.class && *endian == arch.endian && *machine == arch.machine
        })
        .map_or(&[], |(_, _, _, triplets)| triplets)
}

/// The directories searched for a library of `arch` in an image whose loader configuration
/// names `conf_dirs`: those first (they are what the image's `ld.so.cache` holds), then
/// `/lib/<triplet>`, `/usr/lib/<triplet>`, then [`DEFAULT_DIRS`]; each once.
pub(crate) fn search_dirs(arch: Arch, conf_dirs: &[String]) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    let mut add = |d: String| {
        let d = normalise_dir(&d);
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    };
    conf_dirs.iter().cloned().for_each(&mut add);
    for triplet in multiarch_triplets(arch) {
        add(format!("/lib/{triplet}"));
        add(format!("/usr/lib/{triplet}"));
    }
    DEFAULT_DIRS.iter().map(|d| (*d).to_owned()).for_each(add);
    dirs
}

/// `dir` without trailing slashes (but `/` kept).
fn normalise_dir(dir: &str) -> String {
    let trimmed = dir.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// One meaningful line of a loader configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfLine {
    /// A directory to search.
    Dir(String),
    /// `include PATTERN...`: files to read as configuration too.
    Include(Vec<String>),
}

/// Parses a loader configuration file as glibc's ldconfig does: `#` starts a comment,
/// `include` names glob patterns, `hwcap` lines are ignored (ldconfig ignores them too since
/// glibc 2.26), every other non-empty line is a directory.
pub(crate) fn parse_conf(text: &str) -> Vec<ConfLine> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                return None;
            }
            let mut words = line.split_whitespace();
            match words.next() {
                Some("include") => Some(ConfLine::Include(words.map(str::to_owned).collect())),
                Some("hwcap") => None,
                _ => Some(ConfLine::Dir(line.to_owned())),
            }
        })
        .collect()
}

/// Whether `name` matches the shell glob `pattern` (`*` and `?`; no brackets: no library
/// name or configuration glob we need uses them).
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with one backtrack point: linear, no recursion.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether `name` holds a glob character.
pub(crate) fn is_glob(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// An image's root, open for lookups inside it.
pub(crate) struct Root {
    fd: OwnedFd,
}

impl Root {
    /// Opens the directory `path` as a root.
    pub(crate) fn open(path: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root { fd })
    }

    fn resolve(&self, path: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        // Relative to the root fd; RESOLVE_IN_ROOT makes a leading `/` (of the path or of a
        // link's target) and every `..` stop at the root.
        let relative = path.trim_start_matches('/');
        let relative = if relative.is_empty() { "." } else { relative };
        rustix::fs::openat2(
            &self.fd,
            relative,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// The regular file at `path` (absolute, in the image), open for reading; `None` when
    /// there is none (absent, a dangling link, a directory, a device).
    pub(crate) fn open_file(&self, path: &str) -> io::Result<Option<File>> {
        // O_PATH first: opening a FIFO or a device to read could block or act.
        let probe = match self.resolve(path, OFlags::PATH) {
            Ok(fd) => fd,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if FileType::from_raw_mode(rustix::fs::fstat(&probe)?.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        match self.resolve(path, OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The names in directory `path` of the image, at most [`MAX_DIR_ENTRIES`]; empty when
    /// it is not a directory.
    pub(crate) fn list_dir(&self, path: &str) -> io::Result<Vec<String>> {
        let fd = match self.resolve(path, OFlags::RDONLY | OFlags::DIRECTORY) {
            Ok(fd) => fd,
            Err(e) if is_absent(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::new(fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy();
            if name != "." && name != ".." {
                names.push(name.into_owned());
            }
            if names.len() >= MAX_DIR_ENTRIES {
                break;
            }
        }
        names.sort();
        Ok(names)
    }

    /// The first `max` bytes of the regular file at `path`, `None` when there is none.
    pub(crate) fn read_small(&self, path: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        let Some(file) = self.open_file(path)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        file.take(max).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// The directories the image's loader configuration (`/etc/ld.so.conf` and what it
    /// includes) names, in order, and notes on what could not be read.
    pub(crate) fn conf_dirs(&self) -> (Vec<String>, Vec<String>) {
        let mut walk = ConfWalk::default();
        walk.file(self, "/etc/ld.so.conf", 0);
        (walk.dirs, walk.notes)
    }
}

/// Whether an open error means "no such file here" rather than a failure to report: absent,
/// a dangling or looping link, a non-directory in the path.
fn is_absent(e: &rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [Errno::NOENT, Errno::NOTDIR, Errno::LOOP, Errno::XDEV].contains(e)
}

#[derive(Default)]
struct ConfWalk {
    dirs: Vec<String>,
    notes: Vec<String>,
    files: usize,
}

impl ConfWalk {
    fn file(&mut self, root: &Root, path: &str, depth: usize) {
        if depth > MAX_CONF_DEPTH || self.files >= MAX_CONF_FILES {
            self.notes.push(format!(
                "{path}: not read (the loader configuration nests deeper than \
                 {MAX_CONF_DEPTH} or names more than {MAX_CONF_FILES} files)"
            ));
            return;
        }
        self.files += 1;
        let text = match root.read_small(path, MAX_CONF_BYTES) {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(None) => return,
            Err(e) => {
                self.notes
                    .push(format!("{path} in the image: cannot read it: {e}"));
                return;
            }
        };
        let here = path.rsplit_once('/').map_or("/", |(dir, _)| dir);
        for line in parse_conf(&text) {
            match line {
                ConfLine::Dir(dir) => self.dirs.push(dir),
                ConfLine::Include(patterns) => {
                    for pattern in patterns {
                        // ldconfig reads a relative pattern against the including file's
                        // directory.
                        let pattern = if pattern.starts_with('/') {
                            pattern
                        } else {
                            format!("{here}/{pattern}")
                        };
                        for included in self.expand(root, &pattern) {
                            self.file(root, &included, depth + 1);
                        }
                    }
                }
            }
        }
    }

    /// The files a pattern names, sorted as glob(3) sorts them. Only the last component may
    /// hold a glob (as every distribution's `include /etc/ld.so.conf.d/*.conf` does).
    fn expand(&mut self, root: &Root, pattern: &str) -> Vec<String> {
        let (dir, name) = pattern.rsplit_once('/').unwrap_or(("", pattern));
        if is_glob(dir) {
            self.notes.push(format!(
                "include {pattern}: a glob before the last component is not followed"
            ));
            return Vec::new();
        }
        if !is_glob(name) {
            return vec![pattern.to_owned()];
        }
        match root.list_dir(if dir.is_empty() { "/" } else { dir }) {
            Ok(names) => names
                .into_iter()
                .filter(|n| glob_match(name, n) && !n.starts_with('.'))
                .map(|n| format!("{dir}/{n}"))
                .collect(),
            Err(e) => {
                self.notes
                    .push(format!("{dir} in the image: cannot list it: {e}"));
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests;
