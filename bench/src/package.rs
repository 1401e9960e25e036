//! A synthetic runner package shaped like an actions/runner release, for the benchmarks that
//! make runtimes from one (`runtime-create`, `runner-latency --compare-runtimes`): scripts at the
//! top, `bin/` with thousands of small assemblies and a few large files, `externals/node20` with
//! node, a `node_modules` tree and a relative link. 5,008 files, 506 directories, 418 MiB of
//! pseudo-random content (nothing sparse or compressible).

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::rng::Rng;

/// Small `.dll`-like files in `bin/`, as in an actions/runner release.
const BIN_FILES: usize = 2_500;
/// Their size range (uniform).
const BIN_SIZES: (u64, u64) = (2 << 10, 220 << 10);
/// The few large files of a release (CoreLib, libcoreclr, node), in MiB.
const LARGE_FILES: &[(&str, u64)] = &[
    ("bin/System.Private.CoreLib.dll", 24),
    ("bin/libcoreclr.so", 40),
    ("externals/node20/bin/node", 60),
];
/// Small files of `externals/node20/lib/node_modules`: packages of a few files each.
const NODE_PACKAGES: usize = 250;
const FILES_PER_NODE_PACKAGE: usize = 10;
const NODE_SIZES: (u64, u64) = (1 << 10, 16 << 10);
/// The release's scripts at the top of the package.
const SCRIPTS: &[&str] = &["config.sh", "run.sh", "env.sh", "safe_sleep.sh"];
/// What a package must reach to stand for a real release.
pub const MIN_BYTES: u64 = 400 << 20;
pub const MIN_FILES: usize = 5_000;

/// How much a package holds: regular files and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    pub files: usize,
    pub bytes: u64,
}

impl Size {
    /// Whether it stands for a real release ([`MIN_FILES`], [`MIN_BYTES`]).
    pub fn is_release_sized(self) -> bool {
        self.files >= MIN_FILES && self.bytes >= MIN_BYTES
    }

    pub fn mib(self) -> f64 {
        self.bytes as f64 / f64::from(1 << 20)
    }
}

/// Writes files of pseudo-random bytes and counts them.
struct Writer {
    rng: Rng,
    size: Size,
}

impl Writer {
    fn new() -> Writer {
        Writer {
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            size: Size::default(),
        }
    }

    /// Writes `size` pseudo-random bytes to `path` with `mode`.
    fn add(&mut self, path: &Path, size: u64, mode: u32) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = File::create(path)?;
        let mut chunk = vec![0u8; 64 << 10];
        let mut left = size;
        while left > 0 {
            for word in chunk.chunks_exact_mut(8) {
                word.copy_from_slice(&self.rng.next_u64().to_le_bytes());
            }
            let n = usize::try_from(left.min(64 << 10))?;
            file.write_all(&chunk[..n])?;
            left -= u64::try_from(n)?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        self.size.files += 1;
        self.size.bytes += size;
        Ok(())
    }

    /// `bin/` and `externals/`: everything of a release but its top-level scripts.
    fn payload(&mut self, dir: &Path) -> Result<()> {
        for i in 0..BIN_FILES {
            let size = self.rng.between(BIN_SIZES);
            // Every tenth is a native executable or library, as the release's are.
            let mode = if i % 10 == 0 { 0o755 } else { 0o644 };
            self.add(&dir.join(format!("bin/Lib{i:04}.dll")), size, mode)?;
        }
        for (path, mib) in LARGE_FILES {
            self.add(&dir.join(path), mib << 20, 0o755)?;
        }
        let modules = dir.join("externals/node20/lib/node_modules");
        for p in 0..NODE_PACKAGES {
            for f in 0..FILES_PER_NODE_PACKAGE {
                let sub = if f % 2 == 0 { "lib" } else { "" };
                let path: PathBuf = modules
                    .join(format!("pkg{p:03}"))
                    .join(sub)
                    .join(format!("f{f}.js"));
                let size = self.rng.between(NODE_SIZES);
                self.add(&path, size, 0o644)?;
            }
        }
        symlink(
            "../lib/node_modules/pkg000/lib/f0.js",
            dir.join("externals/node20/bin/npm"),
        )?;
        Ok(())
    }
}

/// The whole synthetic package in `dir`: the release's scripts (pseudo-random too), its
/// `run-helper.sh.template`, and [`add_payload`]'s `bin/` and `externals/`. 5,008 files,
/// 418 MiB.
pub fn make_package(dir: &Path) -> Result<Size> {
    let mut writer = Writer::new();
    for script in SCRIPTS {
        writer.add(&dir.join(script), 4 << 10, 0o755)?;
    }
    writer.add(&dir.join("run-helper.sh.template"), 3 << 10, 0o644)?;
    writer.payload(dir)?;
    Ok(writer.size)
}

/// The synthetic package's `bin/` and `externals/` (5,003 files, 418 MiB) added to a package
/// that already holds its own scripts and `bin/Runner.Listener` (such as the fake runner's,
/// `rm_fake_runner::assemble_package`): nothing it writes has a name such a package uses.
pub fn add_payload(dir: &Path) -> Result<Size> {
    let mut writer = Writer::new();
    writer.payload(dir)?;
    Ok(writer.size)
}

/// The regular files under `dir` and their bytes (links are not followed).
pub fn measure(dir: &Path) -> Result<Size> {
    let mut size = Size::default();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                size.files += 1;
                size.bytes += entry.metadata()?.len();
            }
        }
    }
    Ok(size)
}
