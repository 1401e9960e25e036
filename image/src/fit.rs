//! Whether an unpacked image can run a runner package, and if not what it lacks and how to
//! fix it: the fitness gate's answer, given before any runner is started in the image.
//!
//! What is checked, as the dynamic loader will see it once the image is the runner's root:
//! - every ELF file under the package's `bin/` (and its subdirectories), and the `node` of
//!   each `externals/node*/` (the runner runs JavaScript actions with it; `*_alpine` ones are
//!   for Alpine job containers, built for musl, and are left out): its interpreter
//!   (`PT_INTERP`) and every library it needs (`DT_NEEDED`). A library is satisfied by the
//!   package (beside the file, or in its `DT_RUNPATH`/`DT_RPATH` through `$ORIGIN`) or by the
//!   image (its `DT_RUNPATH`/`DT_RPATH`, the directories of the image's `/etc/ld.so.conf` and
//!   its `include`s, the multiarch directories, `/lib64`, `/usr/lib64`, `/lib`, `/usr/lib`),
//!   and a library found in the image is checked the same way in turn (`libicuuc` needs
//!   `libicudata`). A candidate of another class or machine is passed over, as the loader does;
//!   `LD_LIBRARY_PATH` from the image's `ENV` is not followed.
//! - for a .NET runner (`bin/libcoreclr.so` present), the libraries the .NET runtime loads by
//!   name at run time, as actions/runner's `installdependencies.sh` lists them
//!   (`DOTNET_RUNTIME_LOADS`; any ICU and any OpenSSL version the runtime accepts).
//!
//! Image paths are looked up with links resolved inside the image (`root`); the package is
//! the store's verified copy and is read as it is. Files are read through a bounded ELF reader
//! (`elf`); a file that starts like an ELF file but cannot be read is skipped with a note.

mod elf;
mod root;

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use elf::{Arch, ElfError};
use root::Root;

/// The most files walked under the package's `bin/` (the runner's has a few hundred).
pub(crate) const MAX_PACKAGE_FILES: usize = 20_000;

/// How deep the walk of the package's `bin/` goes.
pub(crate) const MAX_PACKAGE_DEPTH: usize = 16;

/// The most ELF files examined in all, the package's and the image's libraries they pull in
/// (a .NET runner and node need ~100).
pub(crate) const MAX_EXAMINED: usize = 4096;

/// How many files a missing piece names as needing it before "and N more".
const MAX_NEEDED_BY_NAMED: usize = 3;

/// The package's file whose presence makes it a .NET runner (actions/runner).
const DOTNET_MARKER: &str = "bin/libcoreclr.so";

/// Package files the .NET runtime loads only if their own libraries load, and runs without
/// otherwise: their missing libraries are reported as optional, never as unfit. coreclr
/// dlopens the LTTng tracepoint provider and ignores a failure (LTTng is a soft dependency:
/// dotnet/coreclr#4132).
const OPTIONAL_PACKAGE_FILES: &[&str] = &["libcoreclrtraceptprovider.so"];

/// A library the .NET runtime loads by name at run time (not a `DT_NEEDED` of any file).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RuntimeLoad {
    /// What the report names.
    pub(crate) what: &'static str,
    /// The file names any one of which satisfies it (globs: `*`, `?`).
    pub(crate) alternatives: &'static [&'static str],
    /// Whether the runner fails without it; an optional one is reported, never unfit.
    pub(crate) required: bool,
    /// How to provide it.
    pub(crate) fix: &'static str,
}

/// The libraries the .NET runtime of actions/runner loads at run time, after the runner's own
/// dependency list (`src/Misc/layoutbin/installdependencies.sh`: `libkrb5-3 zlib1g`,
/// `liblttng-ust1|liblttng-ust0`, `libssl3|libssl1.1|libssl1.0.x`, `libicu<N>` for the
/// versions it knows; and the .NET runtime's Linux prerequisites, which name
/// `libgssapi-krb5-2` for the Kerberos library .NET loads).
pub(crate) const DOTNET_RUNTIME_LOADS: &[RuntimeLoad] = &[
    RuntimeLoad {
        what: "libicuuc.so.*",
        alternatives: &["libicuuc.so.*"],
        required: true,
        fix: "install ICU in the image (Debian/Ubuntu: libicu<N> for the release, e.g. libicu72 \
              on Debian 12, libicu76 on Debian 13, libicu74 on Ubuntu 24.04; Fedora: libicu)",
    },
    RuntimeLoad {
        what: "libicui18n.so.*",
        alternatives: &["libicui18n.so.*"],
        required: true,
        fix: "install ICU in the image (Debian/Ubuntu: libicu<N> for the release, e.g. libicu72 \
              on Debian 12, libicu76 on Debian 13, libicu74 on Ubuntu 24.04; Fedora: libicu)",
    },
    RuntimeLoad {
        what: "libssl.so.3 (or libssl.so.1.1, libssl.so.1.0.*)",
        alternatives: &["libssl.so.3", "libssl.so.1.1", "libssl.so.1.0.*"],
        required: true,
        fix: "install OpenSSL's library in the image (Debian 12, Ubuntu 22.04: libssl3; \
              Debian 13, Ubuntu 24.04: libssl3t64; Fedora: openssl-libs)",
    },
    RuntimeLoad {
        what: "libgssapi_krb5.so.2",
        alternatives: &["libgssapi_krb5.so.2"],
        required: true,
        fix: "install Kerberos GSSAPI in the image (Debian/Ubuntu: libgssapi-krb5-2, which \
              the runner's list pulls in with libkrb5-3; Fedora: krb5-libs)",
    },
    RuntimeLoad {
        what: "libz.so.1",
        alternatives: &["libz.so.1"],
        required: true,
        fix: "install zlib in the image (Debian/Ubuntu: zlib1g; Fedora: zlib)",
    },
    RuntimeLoad {
        what: "liblttng-ust.so.*",
        alternatives: &["liblttng-ust.so.0", "liblttng-ust.so.1"],
        // A soft dependency: without it .NET emits no LTTng events and runs.
        required: false,
        fix: "optional, for .NET's LTTng tracing only (Debian/Ubuntu: liblttng-ust1t64, \
              liblttng-ust1 or liblttng-ust0; Fedora: lttng-ust)",
    },
];

/// Debian/Ubuntu packages of libraries common enough to name in a fix (glob, package).
const KNOWN_LIBRARIES: &[(&str, &str)] = &[
    ("ld-linux*.so.*", "libc6"),
    ("libc.so.6", "libc6"),
    ("libm.so.6", "libc6"),
    ("libdl.so.2", "libc6"),
    ("libpthread.so.0", "libc6"),
    ("librt.so.1", "libc6"),
    ("libresolv.so.2", "libc6"),
    ("libstdc++.so.6", "libstdc++6"),
    ("libgcc_s.so.1", "libgcc-s1"),
    ("libz.so.1", "zlib1g"),
    ("libselinux.so.1", "libselinux1"),
    ("libpcre2-8.so.0", "libpcre2-8-0"),
];

/// One thing the image lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Missing {
    /// The library (`libc.so.6`, `libicuuc.so.*`) or the interpreter's path.
    pub what: String,
    /// What needs it: package-relative files (`bin/Runner.Listener`), an image library
    /// (`/usr/lib/x86_64-linux-gnu/libicuuc.so.72 in the image`), or the runner's .NET
    /// runtime; several are named, then "and N more".
    pub needed_by: String,
    /// How to fix the image.
    pub fix: String,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the image lacks {}, needed by {}: {}",
            self.what, self.needed_by, self.fix
        )
    }
}

/// The answer of [`check`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitReport {
    /// What the image lacks that the runner needs: the image is unfit unless empty.
    pub missing: Vec<Missing>,
    /// What the image lacks that the runner runs without (LTTng).
    pub optional: Vec<Missing>,
    /// Files skipped (not an ELF we can read), limits reached, configuration not read.
    pub notes: Vec<String>,
    /// How many ELF files were examined, the package's and the image's.
    pub examined: usize,
}

impl FitReport {
    /// Whether the image can run the package: nothing required is missing.
    pub fn is_fit(&self) -> bool {
        self.missing.is_empty()
    }
}

impl fmt::Display for FitReport {
    /// One operator-readable message naming every missing piece and its fix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_fit() {
            write!(
                f,
                "the image can run the runner package ({} ELF files examined)",
                self.examined
            )?;
        } else {
            let n = self.missing.len();
            write!(
                f,
                "the image cannot run the runner package: {n} {} missing",
                if n == 1 { "piece is" } else { "pieces are" }
            )?;
            for m in &self.missing {
                write!(f, "\n  - {m}")?;
            }
        }
        if !self.optional.is_empty() {
            write!(f, "\noptional (the runner runs without them):")?;
            for m in &self.optional {
                write!(f, "\n  - {m}")?;
            }
        }
        if !self.notes.is_empty() {
            write!(f, "\nnotes:")?;
            for note in &self.notes {
                write!(f, "\n  - {note}")?;
            }
        }
        Ok(())
    }
}

/// Checks whether the image unpacked at `rootfs` can run the runner package at `package`.
/// Never fails: what cannot be read is in the report (an unreadable root as missing, an
/// unreadable file as a note).
pub fn check(rootfs: &Path, package: &Path) -> FitReport {
    let root = match Root::open(rootfs) {
        Ok(root) => root,
        Err(e) => {
            return FitReport {
                missing: vec![Missing {
                    what: format!("a readable root ({})", rootfs.display()),
                    needed_by: "the runner package".to_owned(),
                    fix: format!("cannot open it ({e}): unpack the image again"),
                }],
                ..FitReport::default()
            };
        }
    };
    let (conf_dirs, conf_notes) = root.conf_dirs();
    let mut checker = Checker {
        root,
        package: package.to_owned(),
        conf_dirs,
        seen: HashSet::new(),
        queue: VecDeque::new(),
        missing: Collector::default(),
        optional: Collector::default(),
        notes: conf_notes,
        examined: 0,
    };
    for (file, label) in package_files(package, &mut checker.notes) {
        checker.enqueue_package_file(&file, label);
    }
    checker.dotnet_runtime_loads();
    checker.run();
    let missing = checker.missing.into_missing();
    let mut optional = checker.optional.into_missing();
    // What a required file lacks is named there; an optional file's need of it adds nothing.
    optional.retain(|o| !missing.iter().any(|m| m.what == o.what));
    FitReport {
        missing,
        optional,
        notes: checker.notes,
        examined: checker.examined,
    }
}

/// The package's files to examine: every regular file under `bin/` (ELF or not: the reader
/// tells), then `externals/node*/bin/node` but the Alpine ones; with their package-relative
/// names.
fn package_files(package: &Path, notes: &mut Vec<String>) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let bin = package.join("bin");
    if bin.is_dir() {
        let mut walked = 0;
        walk(&bin, 0, &mut walked, &mut files, notes);
    } else {
        notes.push(format!(
            "the package {} has no bin/: nothing of it was checked",
            package.display()
        ));
    }
    let externals = package.join("externals");
    if let Ok(entries) = std::fs::read_dir(&externals) {
        let mut nodes: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("node") && !n.ends_with("_alpine"))
            .map(|n| externals.join(n).join("bin/node"))
            .filter(|p| p.is_file())
            .collect();
        nodes.sort();
        files.extend(nodes);
    }
    files
        .into_iter()
        .map(|p| {
            let label = p
                .strip_prefix(package)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            (p, label)
        })
        .collect()
}

fn walk(
    dir: &Path,
    depth: usize,
    walked: &mut usize,
    files: &mut Vec<PathBuf>,
    notes: &mut Vec<String>,
) {
    let mut entries: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(Result::ok).map(|e| e.path()).collect(),
        Err(e) => {
            notes.push(format!("{}: cannot list it: {e}", dir.display()));
            return;
        }
    };
    entries.sort();
    for path in entries {
        *walked += 1;
        if *walked > MAX_PACKAGE_FILES {
            notes.push(format!(
                "the package's bin/ has more than {MAX_PACKAGE_FILES} files: the rest were \
                 not checked"
            ));
            return;
        }
        // Not following links: a linked file is examined where it lies if under bin/.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_file() {
            files.push(path);
        } else if meta.is_dir() {
            if depth + 1 >= MAX_PACKAGE_DEPTH {
                notes.push(format!(
                    "{}: deeper than {MAX_PACKAGE_DEPTH} levels: not checked",
                    path.display()
                ));
                continue;
            }
            walk(&path, depth + 1, walked, files, notes);
        }
    }
}

/// Where a file lies, for its `$ORIGIN` and for where its own libraries may come from.
#[derive(Debug, Clone)]
enum Origin {
    /// In the package, in this host directory.
    Package(PathBuf),
    /// In the image, in this directory of it.
    Image(String),
}

/// A file waiting to be examined.
struct Subject {
    file: File,
    /// How the report names it.
    label: String,
    origin: Origin,
    /// Whether what it lacks is optional.
    optional: bool,
}

/// The missing pieces, one per `what`, with everything that needs it.
#[derive(Default)]
struct Collector {
    entries: Vec<(String, Vec<String>, String)>,
}

impl Collector {
    fn add(&mut self, what: &str, needed_by: &str, fix: String) {
        match self.entries.iter_mut().find(|(w, _, _)| w == what) {
            Some((_, by, _)) => {
                if !by.iter().any(|b| b == needed_by) {
                    by.push(needed_by.to_owned());
                }
            }
            None => self
                .entries
                .push((what.to_owned(), vec![needed_by.to_owned()], fix)),
        }
    }

    fn into_missing(self) -> Vec<Missing> {
        self.entries
            .into_iter()
            .map(|(what, by, fix)| Missing {
                what,
                needed_by: name_list(&by),
                fix,
            })
            .collect()
    }
}

/// "a", "a, b and c", or "a, b, c and 4 more".
fn name_list(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        _ if names.len() <= MAX_NEEDED_BY_NAMED => {
            let (last, rest) = names
                .split_last()
                .map_or((&names[0], &names[..0]), |(l, r)| (l, r));
            format!("{} and {last}", rest.join(", "))
        }
        _ => format!(
            "{} and {} more",
            names[..MAX_NEEDED_BY_NAMED].join(", "),
            names.len() - MAX_NEEDED_BY_NAMED
        ),
    }
}

/// `path` with its `..` components taken lexically (`bin/../lib/x` is `lib/x`), for a name
/// in the report: the package is the store's copy and its links are not followed here.
fn tidy(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The fix for a missing library.
fn library_fix(name: &str) -> String {
    match KNOWN_LIBRARIES
        .iter()
        .find(|(glob, _)| root::glob_match(glob, name))
    {
        Some((_, package)) => format!("install {package} in the image (Debian/Ubuntu)"),
        None => format!(
            "install the package that provides {name} in the image (on Debian/Ubuntu \
             `dpkg -S {name}` on a machine that has it names the package)"
        ),
    }
}

/// The fix for a missing interpreter.
fn interpreter_fix(arch: Arch) -> String {
    let name = match arch.machine {
        62 => "x86-64".to_owned(),
        183 => "arm64".to_owned(),
        3 => "i386".to_owned(),
        40 => "arm".to_owned(),
        m => format!("ELF machine {m}"),
    };
    format!(
        "use an image with glibc built for {name}, as the runner is (Debian/Ubuntu: libc6); \
         an image for another architecture or with musl (Alpine) cannot run it"
    )
}

struct Checker {
    root: Root,
    package: PathBuf,
    conf_dirs: Vec<String>,
    /// (device, inode) of every file queued, so each is examined once.
    seen: HashSet<(u64, u64)>,
    queue: VecDeque<Subject>,
    missing: Collector,
    optional: Collector,
    notes: Vec<String>,
    examined: usize,
}

/// Where a needed library was found.
enum Found {
    Package(File, PathBuf),
    Image(File, String),
}

impl Checker {
    fn first_sight(&mut self, file: &File) -> bool {
        match file.metadata() {
            Ok(m) => self.seen.insert((m.dev(), m.ino())),
            Err(_) => true,
        }
    }

    fn enqueue_package_file(&mut self, path: &Path, label: String) {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) => {
                self.notes.push(format!("{label}: cannot open it: {e}"));
                return;
            }
        };
        if !self.first_sight(&file) {
            return;
        }
        let optional = path
            .file_name()
            .is_some_and(|n| OPTIONAL_PACKAGE_FILES.iter().any(|o| n == *o));
        let dir = path.parent().unwrap_or(&self.package).to_owned();
        self.queue.push_back(Subject {
            file,
            label,
            origin: Origin::Package(dir),
            optional,
        });
    }

    fn enqueue_image_file(&mut self, file: File, path: String, optional: bool) {
        if !self.first_sight(&file) {
            return;
        }
        let dir = path.rsplit_once('/').map_or("/", |(d, _)| d).to_owned();
        self.queue.push_back(Subject {
            file,
            label: format!("{path} in the image"),
            origin: Origin::Image(if dir.is_empty() { "/".to_owned() } else { dir }),
            optional,
        });
    }

    fn run(&mut self) {
        while let Some(subject) = self.queue.pop_front() {
            if self.examined >= MAX_EXAMINED {
                self.notes.push(format!(
                    "more than {MAX_EXAMINED} ELF files to examine: the rest were not checked"
                ));
                return;
            }
            self.examine(subject);
        }
    }

    fn examine(&mut self, subject: Subject) {
        let elf = match elf::parse(&subject.file) {
            Ok(elf) => elf,
            Err(ElfError::NotElf) => return,
            Err(e) => {
                self.notes.push(format!("{}: {e}: skipped", subject.label));
                return;
            }
        };
        if elf.kind != elf::ET_EXEC && elf.kind != elf::ET_DYN {
            return;
        }
        self.examined += 1;
        let collector = if subject.optional {
            &mut self.optional
        } else {
            &mut self.missing
        };
        // Only the program the kernel execs has its interpreter used; a library's PT_INTERP
        // (libc.so.6 has one) is not, so only the package's files are held to theirs.
        if let (Some(interp), Origin::Package(_)) = (&elf.interpreter, &subject.origin) {
            let found = self
                .root
                .open_file(interp)
                .ok()
                .flatten()
                .is_some_and(|f| elf::parse(&f).is_ok_and(|i| i.arch == elf.arch));
            if !found {
                collector.add(
                    interp,
                    &format!("{} (its ELF interpreter)", subject.label),
                    interpreter_fix(elf.arch),
                );
            }
        }
        for name in &elf.needed {
            match self.find(name, elf.arch, elf.search_path(), &subject.origin) {
                Some(Found::Package(file, path)) => {
                    // One under bin/ is examined on its own; one elsewhere is queued here.
                    let path = tidy(&path);
                    let label = path
                        .strip_prefix(&self.package)
                        .unwrap_or(&path)
                        .to_string_lossy()
                        .into_owned();
                    if self.first_sight(&file) {
                        let dir = path.parent().unwrap_or(&self.package).to_owned();
                        self.queue.push_back(Subject {
                            file,
                            label,
                            origin: Origin::Package(dir),
                            optional: subject.optional,
                        });
                    }
                }
                Some(Found::Image(file, path)) => {
                    self.enqueue_image_file(file, path, subject.optional);
                }
                None => {
                    let collector = if subject.optional {
                        &mut self.optional
                    } else {
                        &mut self.missing
                    };
                    collector.add(name, &subject.label, library_fix(name));
                }
            }
        }
    }

    /// Finds library `name` for a file of `arch` whose search path is `search_path` and which
    /// lies at `origin`, as the loader would: a name with a `/` as that path (in the image);
    /// otherwise the package's candidates first, then the image's directories.
    fn find(
        &mut self,
        name: &str,
        arch: Arch,
        search_path: &[String],
        origin: &Origin,
    ) -> Option<Found> {
        if name.contains('/') {
            return self
                .in_image(name, arch)
                .map(|f| Found::Image(f, name.to_owned()));
        }
        let mut image_dirs = Vec::new();
        let mut package_dirs = Vec::new();
        if let Origin::Package(dir) = origin {
            // Beside the file: the runtime's own libraries load each other from bin/.
            package_dirs.push(dir.clone());
        }
        for entry in search_path {
            let Some(rest) = entry
                .strip_prefix("$ORIGIN")
                .or_else(|| entry.strip_prefix("${ORIGIN}"))
            else {
                if !entry.contains('$') {
                    image_dirs.push(entry.clone());
                }
                // $LIB and $PLATFORM are not expanded: that directory is not searched.
                continue;
            };
            match origin {
                Origin::Package(dir) => {
                    package_dirs.push(dir.join(rest.trim_start_matches('/')));
                }
                Origin::Image(dir) => image_dirs.push(format!("{dir}{rest}")),
            }
        }
        for dir in package_dirs {
            let path = dir.join(name);
            // Regular files only, looked at before opening: opening a FIFO would block.
            if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                continue;
            }
            if let Ok(file) = File::open(&path)
                && elf::parse(&file).is_ok_and(|e| e.arch == arch)
            {
                return Some(Found::Package(file, path));
            }
        }
        image_dirs.extend(root::search_dirs(arch, &self.conf_dirs));
        image_dirs.into_iter().find_map(|dir| {
            let path = format!("{}/{name}", dir.trim_end_matches('/'));
            self.in_image(&path, arch).map(|f| Found::Image(f, path))
        })
    }

    /// The file at `path` in the image if it is an ELF file of `arch`.
    fn in_image(&mut self, path: &str, arch: Arch) -> Option<File> {
        match self.root.open_file(path) {
            Ok(Some(file)) => elf::parse(&file)
                .is_ok_and(|e| e.arch == arch)
                .then_some(file),
            Ok(None) => None,
            Err(e) => {
                self.notes
                    .push(format!("{path} in the image: cannot open it: {e}"));
                None
            }
        }
    }

    /// For a .NET runner, the libraries its runtime loads by name, found in the image's
    /// directories for the runtime's architecture.
    fn dotnet_runtime_loads(&mut self) {
        let marker = self.package.join(DOTNET_MARKER);
        if !marker.is_file() {
            return;
        }
        let arch = match File::open(&marker)
            .map_err(|e| ElfError::Io(e.to_string()))
            .and_then(|f| elf::parse(&f))
        {
            Ok(elf) => elf.arch,
            Err(e) => {
                self.notes.push(format!(
                    "{DOTNET_MARKER}: {e}: the .NET runtime's run-time loads were not checked"
                ));
                return;
            }
        };
        let needed_by = format!("the runner's .NET runtime ({DOTNET_MARKER})");
        let dirs = root::search_dirs(arch, &self.conf_dirs);
        for load in DOTNET_RUNTIME_LOADS {
            let found = load
                .alternatives
                .iter()
                .find_map(|alt| self.find_in_dirs(alt, arch, &dirs));
            match found {
                Some((file, path)) => self.enqueue_image_file(file, path, !load.required),
                None if load.required => {
                    self.missing.add(load.what, &needed_by, load.fix.to_owned())
                }
                None => self
                    .optional
                    .add(load.what, &needed_by, load.fix.to_owned()),
            }
        }
    }

    /// The first file of `arch` named `pattern` (a glob matched against each directory's
    /// names) in `dirs` of the image.
    fn find_in_dirs(
        &mut self,
        pattern: &str,
        arch: Arch,
        dirs: &[String],
    ) -> Option<(File, String)> {
        for dir in dirs {
            let names = if root::is_glob(pattern) {
                match self.root.list_dir(dir) {
                    Ok(names) => names
                        .into_iter()
                        .filter(|n| root::glob_match(pattern, n))
                        .collect(),
                    Err(e) => {
                        self.notes
                            .push(format!("{dir} in the image: cannot list it: {e}"));
                        Vec::new()
                    }
                }
            } else {
                vec![pattern.to_owned()]
            };
            for name in names {
                let path = format!("{}/{name}", dir.trim_end_matches('/'));
                if let Some(file) = self.in_image(&path, arch) {
                    return Some((file, path));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
