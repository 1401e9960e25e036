//! `runtime-create`: how long making one runner runtime takes, with the full copy of the runner
//! package a runtime used to get (the walk of `rm_agent::runner::workspace::copy_tree`,
//! reproduced here) against hard links from the package store
//! (`rm_agent::runner::store::StoredPackage::link_into` then `verify_runtime`), side by side in
//! one run on the same synthetic package (see docs/performance.md). In process: no agent, no
//! runner, only the filesystem work.

use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, ensure};
use clap::Parser;
use rm_agent::runner::store::{Store, StoredPackage};

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
/// What the package must reach to stand for a real release.
const MIN_BYTES: u64 = 400 << 20;
const MIN_FILES: usize = 5_000;
/// The runtime directory's mode (the agent's `RUNTIME_MODE`).
const RUNTIME_MODE: u32 = 0o700;

#[derive(Parser, Debug)]
#[command(
    about = "Runtime creation: a full copy of the runner package against hard links from the store"
)]
struct Args {
    /// Runtimes created per method.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Where the package, the store and the runtimes go (one filesystem; default: a new
    /// temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// xorshift64*: deterministic content that does not compress to nothing, fast enough that
/// generating 400 MB is not the run's cost.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn between(&mut self, (low, high): (u64, u64)) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// Writes `size` pseudo-random bytes to `path` with `mode`.
fn write_file(path: &Path, size: u64, mode: u32, rng: &mut Rng) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = File::create(path)?;
    let mut chunk = vec![0u8; 64 << 10];
    let mut left = size;
    while left > 0 {
        for word in chunk.chunks_exact_mut(8) {
            word.copy_from_slice(&rng.next().to_le_bytes());
        }
        let n = usize::try_from(left.min(64 << 10))?;
        file.write_all(&chunk[..n])?;
        left -= u64::try_from(n)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// A package shaped like an actions/runner release: scripts at the top, `bin/` with thousands of
/// small assemblies and a few large files, `externals/node20` with node and a node_modules tree
/// and a relative link. Returns (files, bytes).
fn make_package(dir: &Path) -> Result<(usize, u64)> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut files = 0;
    let mut bytes = 0;
    let mut add = |path: PathBuf, size: u64, mode: u32, rng: &mut Rng| -> Result<()> {
        write_file(&path, size, mode, rng)?;
        files += 1;
        bytes += size;
        Ok(())
    };
    for script in ["config.sh", "run.sh", "env.sh", "safe_sleep.sh"] {
        add(dir.join(script), 4 << 10, 0o755, &mut rng)?;
    }
    add(dir.join("run-helper.sh.template"), 3 << 10, 0o644, &mut rng)?;
    for i in 0..BIN_FILES {
        let size = rng.between(BIN_SIZES);
        // Every tenth is a native executable or library, as the release's are.
        let mode = if i % 10 == 0 { 0o755 } else { 0o644 };
        add(dir.join(format!("bin/Lib{i:04}.dll")), size, mode, &mut rng)?;
    }
    for (path, mib) in LARGE_FILES {
        add(dir.join(path), mib << 20, 0o755, &mut rng)?;
    }
    let modules = dir.join("externals/node20/lib/node_modules");
    for p in 0..NODE_PACKAGES {
        for f in 0..FILES_PER_NODE_PACKAGE {
            let sub = if f % 2 == 0 { "lib" } else { "" };
            let path = modules
                .join(format!("pkg{p:03}"))
                .join(sub)
                .join(format!("f{f}.js"));
            add(path, rng.between(NODE_SIZES), 0o644, &mut rng)?;
        }
    }
    symlink(
        "../lib/node_modules/pkg000/lib/f0.js",
        dir.join("externals/node20/bin/npm"),
    )?;
    Ok((files, bytes))
}

/// Today's runtime copy, as `rm_agent::runner::workspace::copy_tree` does it (not reachable from
/// here): directories recreated with their mode, files `std::fs::copy`'d, links recreated.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&target)?;
            copy_tree(&source, &target)?;
            let mode = entry.metadata()?.permissions().mode();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)?;
        } else {
            return Err(io::Error::other(format!("{} is special", source.display())));
        }
    }
    Ok(())
}

/// Flushes the filesystem of `dir`: the write-back a creation left behind, timed separately so
/// each run starts with nothing dirty.
fn syncfs(dir: &Path) -> Result<Duration> {
    let started = Instant::now();
    rustix::fs::syncfs(File::open(dir)?)?;
    Ok(started.elapsed())
}

/// The timings of one method.
#[derive(Default)]
struct Timings {
    create: Vec<Duration>,
    flush: Vec<Duration>,
    remove: Vec<Duration>,
}

/// The methods compared.
#[derive(Clone, Copy)]
enum Method {
    Copy,
    Link,
}

/// Creates one runtime at `runtime` with `method`, times it, flushes, removes it.
fn run_once(
    method: Method,
    package: &Path,
    stored: &StoredPackage,
    runtime: &Path,
    timings: &mut Timings,
    split: &mut Vec<(Duration, Duration)>,
) -> Result<()> {
    let started = Instant::now();
    std::fs::DirBuilder::new()
        .mode(RUNTIME_MODE)
        .create(runtime)?;
    match method {
        Method::Copy => copy_tree(package, runtime)?,
        Method::Link => {
            stored.link_into(runtime)?;
            let linked = started.elapsed();
            stored.verify_runtime(runtime)?;
            split.push((linked, started.elapsed() - linked));
        }
    }
    timings.create.push(started.elapsed());
    timings.flush.push(syncfs(runtime)?);
    let started = Instant::now();
    std::fs::remove_dir_all(runtime)?;
    timings.remove.push(started.elapsed());
    syncfs(package)?;
    Ok(())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of an unsorted sample.
fn percentile(sample: &[Duration], p: f64) -> Duration {
    let mut sorted = sample.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.runs > 0, "--runs must be at least 1");
    let temp;
    let base = match &args.dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    let package = base.join("package");
    let root = base.join("root");
    std::fs::create_dir_all(&root)?;

    let started = Instant::now();
    let (files, bytes) = make_package(&package).context("cannot build the synthetic package")?;
    ensure!(
        files >= MIN_FILES && bytes >= MIN_BYTES,
        "the package is too small"
    );
    syncfs(&package)?;
    eprintln!(
        "package: {files} files, {:.0} MiB, built in {:.1} s",
        bytes as f64 / f64::from(1 << 20),
        started.elapsed().as_secs_f64()
    );

    let store = Store::open(&root)?;
    let started = Instant::now();
    let stored = store.install(&package)?;
    let install = started.elapsed();
    syncfs(&root)?;
    let started = Instant::now();
    let again = store.install(&package)?;
    let reinstall = started.elapsed();
    ensure!(
        again.tree() == stored.tree(),
        "the second install rebuilt the tree"
    );
    let started = Instant::now();
    stored.verify()?;
    let verify = started.elapsed();
    let entries = stored.manifest().entries.len();

    let mut copy = Timings::default();
    let mut link = Timings::default();
    let mut split = Vec::new();
    for run in 0..args.runs {
        // Alternate which goes first, so neither always finds the caches the other left.
        let order = if run % 2 == 0 {
            [Method::Copy, Method::Link]
        } else {
            [Method::Link, Method::Copy]
        };
        for method in order {
            let (name, timings) = match method {
                Method::Copy => ("c", &mut copy),
                Method::Link => ("l", &mut link),
            };
            let runtime = root.join(format!("{name}{run:011}"));
            run_once(method, &package, &stored, &runtime, timings, &mut split)?;
        }
        eprint!(".");
    }
    eprintln!();

    println!(
        "package: {files} files, {entries} entries, {:.0} MiB",
        bytes as f64 / f64::from(1 << 20)
    );
    println!(
        "store: first install {:.0} ms, install of a stored package (full verify) {:.0} ms, verify {:.0} ms",
        millis(install),
        millis(reinstall),
        millis(verify)
    );
    println!("| method | runs | p50 | p99 | max | syncfs after, p50 | removal, p50 |");
    println!("|---|---|---|---|---|---|---|");
    for (name, t) in [
        ("full copy (`copy_tree`)", &copy),
        ("store links (`link_into` + `verify_runtime`)", &link),
    ] {
        println!(
            "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
            t.create.len(),
            millis(percentile(&t.create, 50.0)),
            millis(percentile(&t.create, 99.0)),
            millis(t.create.iter().max().copied().unwrap_or_default()),
            millis(percentile(&t.flush, 50.0)),
            millis(percentile(&t.remove, 50.0)),
        );
    }
    let (linked, verified): (Vec<Duration>, Vec<Duration>) = split.into_iter().unzip();
    println!(
        "of which link_into p50 {:.1} ms, verify_runtime p50 {:.1} ms",
        millis(percentile(&linked, 50.0)),
        millis(percentile(&verified, 50.0))
    );
    println!(
        "finished {}",
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    Ok(())
}
