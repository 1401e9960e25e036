//! `runtime-create`: how long making one runner runtime takes, with the full copy of the runner
//! package a runtime gets under `isolation = "none"` (the agent's own
//! `rm_runner::workspace::copy_tree`) against hard links from the package store
//! (`rm_runner::store::StoredPackage::link_into` then `verify_runtime`), side by side in
//! one run on the same synthetic package ([`rm_bench::package`]; see docs/performance.md). In
//! process: no agent, no runner, only the filesystem work.

use std::fs::File;
use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, ensure};
use clap::Parser;
use rm_bench::package::make_package;
use rm_runner::store::{Store, StoredPackage};

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

/// Today's runtime copy (`isolation = "none"`): the agent's own `copy_tree`.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    rm_runner::workspace::copy_tree(from, to)
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
    let size = make_package(&package).context("cannot build the synthetic package")?;
    ensure!(size.is_release_sized(), "the package is too small");
    let (files, bytes) = (size.files, size.bytes);
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
