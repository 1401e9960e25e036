//! `job-image`: what a job image (`policy.image`, issue 40) costs, in one run (see
//! docs/performance.md, "Job images"). Two figures:
//!
//! - **Unpack, once per digest**: `rm_image::source::pull` of a small and a 1 GiB image (the
//!   test images of `tests/support/job_image.rs`: the slim Debian root plus an uncompressed
//!   padding layer) into a fresh store (every blob checked, then every layer unpacked with its
//!   diff_id checked, then synced and renamed into place), against `tar -x` of the same layer
//!   blobs into a fresh directory followed by a `syncfs` (no check at all), alternating which
//!   goes first; and what a second pull of a stored image costs (manifest and config only).
//! - **Per-runner setup**: `UserIsolation::prepare` + `start` until the runner's first
//!   instruction (its listener, a shell script, opens a FIFO the bench waits on), for the host's
//!   root (today's start), the small image and the 1 GiB image, rotating which goes first; the
//!   same backend, cgroup and package for all three.
//!
//! Needs root (runner uids, mounts) and the tools `job_image` makes its images with
//! (mmdebstrap, skopeo, apt-get, dpkg-deb); the images are cached under `target/rm-test-images`.

use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use rm_image::reference::ImageRef;
use rm_image::store::Store as ImageStore;
use rm_journal::WorkspaceKind;
use rm_runner::RunnerRoot;
use rm_runner::backend::{Backend as _, LinkedPackage, Plan, UserIsolation};
use rm_runner::cgroup::{CgroupRoot, Limits};
use rm_runner::image_root::ImagePlan;
use rm_runner::isolate::{Account, Pool};
use rm_runner::store::Store as PackageStore;
use secrecy::SecretString;

/// The test images, made from the host's Debian packages and cached under the target dir.
#[path = "../../../tests/support/job_image.rs"]
mod job_image;

/// The FIFO in a runtime the listener opens as its first instruction.
const STARTED_FIFO: &str = "started";

/// The listener: its first instruction opens the FIFO in its runtime (the path from `$0`, a
/// parameter expansion: no fork, no command before it), then it exits. The same script runs on
/// the host's root and in an image (its `/bin/sh` is the image's).
const LISTENER_SCRIPT: &str = "#!/bin/sh\necho > \"${0%/bin/*}/started\"\n";

/// How long a runner may take to reach its first instruction, or to exit, before the run is
/// called failed (a figure is seconds at worst on this machine).
const RUNNER_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the bench looks whether a runner has exited (the exit is not timed).
const EXIT_POLL: Duration = Duration::from_millis(2);

/// The first runner uid used: far above any account of a host.
const FIRST_UID: u32 = 3_400_000;

#[derive(Parser, Debug)]
#[command(
    about = "Job images: unpack once per digest against tar -x, and per-runner setup with a small and a 1 GiB image against the host's root"
)]
struct Args {
    /// Runners started per root (after one warm-up start each, not counted).
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Unpacks of each image into a fresh store (and as many `tar -x`).
    #[arg(long, default_value_t = 3)]
    unpack_runs: usize,
    /// The small image's padding layer, in MiB (0: the slim Debian root alone, about 13 MB).
    #[arg(long, default_value_t = 0)]
    small_mib: u64,
    /// The large image's padding layer, in MiB.
    #[arg(long, default_value_t = 1024)]
    large_mib: u64,
    /// Where the stores, the runner root and the `tar -x` trees go (one filesystem; default: a
    /// new temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// One image of the run: its layout and what it weighs.
struct TestImage {
    name: String,
    reference: ImageRef,
    /// Each layer's blob, base first.
    blobs: Vec<PathBuf>,
    /// The blobs' bytes (what is read) and the layers' uncompressed bytes (what is written).
    blob_bytes: u64,
    tar_bytes: u64,
}

impl TestImage {
    fn of(name: &str, padding: u64) -> Result<TestImage> {
        let made = Instant::now();
        let image = job_image::padded_image(padding);
        eprintln!(
            "{name}: layout {} ({:.1} s)",
            image.layout.display(),
            made.elapsed().as_secs_f64()
        );
        let blobs: Vec<PathBuf> = image
            .info
            .layers
            .iter()
            .map(|digest| job_image::blob_path(&image.layout, digest))
            .collect();
        let mut blob_bytes = 0;
        let mut tar_bytes = 0;
        for blob in &blobs {
            blob_bytes += std::fs::metadata(blob)?.len();
            tar_bytes += uncompressed_len(blob)?;
        }
        let reference = ImageRef::parse(&format!(
            "oci:{}:{}@{}",
            image.layout.display(),
            image.tag,
            image.info.manifest_digest
        ))?;
        Ok(TestImage {
            name: name.to_owned(),
            reference,
            blobs,
            blob_bytes,
            tar_bytes,
        })
    }
}

/// The uncompressed length of a layer blob (gzip or plain tar).
fn uncompressed_len(blob: &Path) -> Result<u64> {
    let mut file = File::open(blob)?;
    let mut magic = [0u8; 2];
    let gzip = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    if !gzip {
        return Ok(std::fs::metadata(blob)?.len());
    }
    let mut decoder = flate2::read::GzDecoder::new(File::open(blob)?);
    Ok(std::io::copy(&mut decoder, &mut std::io::sink())?)
}

/// Flushes the filesystem of `dir`; how long it took.
fn syncfs(dir: &Path) -> Result<Duration> {
    let started = Instant::now();
    rustix::fs::syncfs(File::open(dir)?)?;
    Ok(started.elapsed())
}

/// `tar -x` of every layer blob, base first, into `into` (GNU tar detects gzip), then a
/// `syncfs`: what the same bytes cost unpacked with no check.
fn tar_x(image: &TestImage, into: &Path) -> Result<Duration> {
    std::fs::create_dir(into)?;
    let started = Instant::now();
    for blob in &image.blobs {
        let status = Command::new("tar")
            .arg("-x")
            .arg("-f")
            .arg(blob)
            .arg("-C")
            .arg(into)
            .status()
            .context("cannot run tar")?;
        ensure!(status.success(), "tar -x of {} failed", blob.display());
    }
    rustix::fs::syncfs(File::open(into)?)?;
    Ok(started.elapsed())
}

/// Median of a sample (the lower middle of an even one).
fn median(sample: &[Duration]) -> Duration {
    let mut sorted = sample.to_vec();
    sorted.sort_unstable();
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A duration for the report: milliseconds below a second, seconds above.
fn seconds(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2} ms", millis(d))
    } else if d < Duration::from_secs(1) {
        format!("{:.1} ms", millis(d))
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 30)
}

/// The unpack figures of one image.
#[derive(Default)]
struct Unpack {
    pull: Vec<Duration>,
    check: Vec<Duration>,
    tar: Vec<Duration>,
    again: Vec<Duration>,
}

/// Unpacks `image` `runs` times each way, alternating; leaves it installed in `store`.
fn measure_unpack(
    image: &TestImage,
    store: &ImageStore,
    base: &Path,
    runs: usize,
) -> Result<Unpack> {
    let mut out = Unpack::default();
    let tar_dir = base.join("tar-x");
    for run in 0..runs {
        let pull_first = run % 2 == 0;
        for step in 0..2 {
            syncfs(base)?;
            if (step == 0) == pull_first {
                if let Some(id) = store.list()?.into_iter().next() {
                    store.remove(&id)?;
                    syncfs(base)?;
                }
                let started = Instant::now();
                let installed = rm_image::source::pull(&image.reference, store)?;
                out.pull.push(started.elapsed());
                ensure!(installed.unpacked, "the store had the image already");
            } else {
                out.tar.push(tar_x(image, &tar_dir)?);
                std::fs::remove_dir_all(&tar_dir)?;
            }
        }
        eprint!(".");
    }
    // The check alone (every blob read and hashed before anything is unpacked): part of a pull.
    for _ in 0..runs {
        let started = Instant::now();
        let opened = rm_image::source::open(&image.reference)?;
        opened.verify_layers()?;
        out.check.push(started.elapsed());
    }
    // A stored image: what a later pull (another runner, an agent restart) pays.
    for _ in 0..runs {
        let started = Instant::now();
        let installed = rm_image::source::pull(&image.reference, store)?;
        out.again.push(started.elapsed());
        ensure!(
            !installed.unpacked,
            "a second pull unpacked the image again"
        );
    }
    eprintln!();
    Ok(out)
}

/// The roots a runner is started with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Root {
    Host,
    Small,
    Large,
}

/// The timings of one root's runners.
#[derive(Default)]
struct Setup {
    prepare: Vec<Duration>,
    start: Vec<Duration>,
    first: Vec<Duration>,
    clean: Vec<Duration>,
}

/// The runner's captured output, for a failure message.
fn runner_log(runtime: &Path) -> String {
    let mut out = String::new();
    if let Ok(entries) = std::fs::read_dir(runtime.join("_diag")) {
        for entry in entries.flatten() {
            out.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    out
}

/// One runner: prepare, start, its first instruction, its exit, clean. Adds the timings to
/// `setup` when given (none for a warm-up).
fn run_runner(backend: &UserIsolation, plan: &Plan, setup: Option<&mut Setup>) -> Result<()> {
    let uid = plan.uid.context("a plan without a uid")?;
    let t0 = Instant::now();
    let runtime = backend.prepare(plan)?;
    let prepared = t0.elapsed();
    // The FIFO the listener opens, the runner's to write; the reader waits on it from before
    // the start, so the open returns the moment the runner's opens.
    let fifo = runtime.dir().join(STARTED_FIFO);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )?;
    rustix::fs::chown(
        &fifo,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(uid)),
    )?;
    let (opened_tx, opened) = mpsc::channel();
    let reader_path = fifo.clone();
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let mut file = File::open(&reader_path)?;
        let _ = opened_tx.send(Instant::now());
        std::io::copy(&mut file, &mut std::io::sink())?;
        Ok(())
    });
    let t1 = Instant::now();
    let mut spawned = backend.start(plan, &runtime, &SecretString::from("jit"))?;
    let started = t1.elapsed();
    let first = match opened.recv_timeout(RUNNER_TIMEOUT) {
        Ok(at) => at.duration_since(t0),
        Err(_) => {
            // Releases the reader: a writer of our own.
            let _ = rustix::fs::open(
                &fifo,
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::NONBLOCK,
                rustix::fs::Mode::empty(),
            );
            bail!(
                "the runner did not reach its first instruction in {RUNNER_TIMEOUT:?}: {}",
                runner_log(runtime.dir())
            );
        }
    };
    let deadline = Instant::now() + RUNNER_TIMEOUT;
    while spawned.child.try_wait()?.is_none() {
        ensure!(Instant::now() < deadline, "the runner did not exit");
        std::thread::sleep(EXIT_POLL);
    }
    let _ = reader.join();
    let t2 = Instant::now();
    backend.clean(plan)?;
    let cleaned = t2.elapsed();
    if let Some(setup) = setup {
        setup.prepare.push(prepared);
        setup.start.push(started);
        setup.first.push(first);
        setup.clean.push(cleaned);
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    ensure!(
        args.runs > 0 && args.unpack_runs > 0,
        "--runs and --unpack-runs must be at least 1"
    );
    ensure!(
        rustix::process::geteuid().is_root(),
        "job-image needs root: runner uids, mounts and the image store"
    );
    if let Some((tool, why)) = job_image::missing_tool() {
        bail!("{tool}: {why}");
    }
    let temp;
    let base = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_path_buf()
        }
    };
    // Runner uids pass through it to their runtimes.
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711))?;

    let small = TestImage::of("small image", args.small_mib << 20)?;
    let large = TestImage::of("large image", args.large_mib << 20)?;

    // Unpack, once per digest.
    let store = ImageStore::open(&base.join("images"))?;
    let mut unpacks = Vec::new();
    for image in [&small, &large] {
        eprintln!(
            "unpacking the {} ({} runs each way)",
            image.name, args.unpack_runs
        );
        unpacks.push(measure_unpack(image, &store, &base, args.unpack_runs)?);
    }
    let stored_plan = |image: &TestImage| -> Result<ImagePlan> {
        let installed = rm_image::source::pull(&image.reference, &store)?;
        Ok(ImagePlan {
            id: installed.stored.id.to_string(),
            rootfs: installed.stored.rootfs.clone(),
            env: installed.image.config.env,
        })
    };
    let small_plan = stored_plan(&small)?;
    let large_plan = stored_plan(&large)?;

    // Per-runner setup: one backend, as the agent's, for all three roots.
    let package = base.join("package");
    std::fs::create_dir_all(package.join("bin"))?;
    let listener = package.join("bin/Runner.Listener");
    std::fs::write(&listener, LISTENER_SCRIPT)?;
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755))?;
    let root = RunnerRoot::open(&base.join("runners"))?;
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))?;
    let first_uid = FIRST_UID + (std::process::id() % 1000) * 4;
    let pool = Pool::new(
        (first_uid..first_uid + 3)
            .map(|uid| Account { uid, gid: uid })
            .collect(),
    );
    let linked = LinkedPackage::install(PackageStore::open(root.path())?, &package, &pool)?;
    let cgroups = CgroupRoot::resolve(None).ok();
    let backend = UserIsolation {
        root: root.clone(),
        package: Some(Arc::new(linked)),
        pool,
        cgroups: cgroups.clone(),
        network: None,
        docker: None,
        run_keep: vec![],
    };
    let plan = |which: Root, n: usize| -> Result<Plan> {
        let (slot, image) = match which {
            Root::Host => (0, None),
            Root::Small => (1, Some(small_plan.clone())),
            Root::Large => (2, Some(large_plan.clone())),
        };
        let uid = first_uid + slot;
        let attempt_id = format!("{uid:08x}{:04x}{}", n % 0x1_0000, "0".repeat(20));
        let cgroup = cgroups
            .as_ref()
            .map(|c| c.runner_path(&format!("rm-{}", &attempt_id[..12])))
            .transpose()?;
        Ok(Plan {
            attempt_id: attempt_id.clone(),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: root.ephemeral_path(&attempt_id)?,
            uid: Some(uid),
            cgroup,
            limits: Limits::default(),
            env: Default::default(),
            network_allow: None,
            egress: None,
            egress_report: None,
            docker: None,
            cache: None,
            image,
            devices: None,
        })
    };
    let roots = [Root::Host, Root::Small, Root::Large];
    eprintln!(
        "per-runner setup: 1 warm-up and {} runners per root",
        args.runs
    );
    for (n, which) in roots.into_iter().enumerate() {
        run_runner(&backend, &plan(which, n)?, None)?;
    }
    let mut setups: Vec<Setup> = roots.iter().map(|_| Setup::default()).collect();
    for run in 0..args.runs {
        // Rotate which goes first, so none always finds the caches another left.
        for k in 0..roots.len() {
            let i = (run + k) % roots.len();
            let n = 16 + run * roots.len() + k;
            run_runner(&backend, &plan(roots[i], n)?, Some(&mut setups[i]))?;
        }
        eprint!(".");
    }
    eprintln!();

    // The report.
    println!(
        "rm-bench job-image, {} cores, kernel {}, load average before the run {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        load_before.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    for image in [&small, &large] {
        println!(
            "{}: {} layers, {:.1} MiB of blobs, {:.1} MiB unpacked ({})",
            image.name,
            image.blobs.len(),
            mib(image.blob_bytes),
            mib(image.tar_bytes),
            image.reference
        );
    }
    println!();
    println!(
        "Unpack into a fresh store, once per digest (median of {} [min-max]):",
        args.unpack_runs
    );
    let range = |sample: &[Duration]| {
        let min = sample.iter().min().copied().unwrap_or_default();
        let max = sample.iter().max().copied().unwrap_or_default();
        format!(
            "{:>9} [{}-{}]",
            seconds(median(sample)),
            seconds(min),
            seconds(max)
        )
    };
    for (image, unpack) in [&small, &large].into_iter().zip(&unpacks) {
        let per_gib = |d: Duration| d.as_secs_f64() / gib(image.tar_bytes);
        println!(
            "  {:<12} rm_image::source::pull       {}  {:6.2} s/GiB",
            image.name,
            range(&unpack.pull),
            per_gib(median(&unpack.pull))
        );
        println!(
            "  {:<12}   of which the blob check    {}",
            "",
            range(&unpack.check)
        );
        println!(
            "  {:<12} tar -x + syncfs (no check)   {}  {:6.2} s/GiB",
            image.name,
            range(&unpack.tar),
            per_gib(median(&unpack.tar))
        );
        println!(
            "  {:<12} pull of a stored image       {}",
            image.name,
            range(&unpack.again)
        );
    }
    // What a GiB more costs: the difference between the two images, which share their base
    // (many small files: a fixed cost per image).
    let extra = gib(large.tar_bytes.saturating_sub(small.tar_bytes));
    if let [small_unpack, large_unpack] = unpacks.as_slice()
        && extra > 0.0
    {
        let marginal = |pick: fn(&Unpack) -> &Vec<Duration>| {
            median(pick(large_unpack))
                .saturating_sub(median(pick(small_unpack)))
                .as_secs_f64()
                / extra
        };
        println!(
            "  per GiB beyond the small image: pull {:.2} s/GiB, tar -x + syncfs {:.2} s/GiB",
            marginal(|u| &u.pull),
            marginal(|u| &u.tar)
        );
    }
    println!();
    println!(
        "Per-runner setup, prepare + start to the runner's first instruction (isolation = \"user\", {}, median of {} [min-max]):",
        if cgroups.is_some() {
            "a cgroup each"
        } else {
            "no cgroup v2 writable"
        },
        args.runs
    );
    let names = ["host's root (today)", "small image", "large image"];
    for (name, setup) in names.iter().zip(&setups) {
        let min = setup.first.iter().min().copied().unwrap_or_default();
        let max = setup.first.iter().max().copied().unwrap_or_default();
        println!(
            "  {name:<20} {:7.1} ms [{:.1}-{:.1}]   prepare {:5.1} ms  start {:5.1} ms  (clean after {:5.1} ms)",
            millis(median(&setup.first)),
            millis(min),
            millis(max),
            millis(median(&setup.prepare)),
            millis(median(&setup.start)),
            millis(median(&setup.clean)),
        );
    }
    let ratio = |a: &Setup, b: &Setup| {
        median(&a.first).as_secs_f64() / median(&b.first).as_secs_f64().max(f64::EPSILON)
    };
    println!(
        "  large / small image: {:.2}x; small image / host's root: {:.2}x",
        ratio(&setups[2], &setups[1]),
        ratio(&setups[1], &setups[0])
    );
    println!(
        "finished {}",
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    Ok(())
}
