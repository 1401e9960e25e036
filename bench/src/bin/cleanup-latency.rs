//! `cleanup-latency`: how long a queued job waits for its runner while the agent removes the
//! runtime of a job that left a large checkout, against the same wait at rest, in one run (see
//! docs/performance.md). One fake GitHub on loopback, the fake runner package, one real
//! `rm-agent run` taking webhooks (`isolation = "user"` by default, so the bench runs as root).
//! Each round:
//!
//! - **at rest**: one job queued with nothing else going on; its wait is queued → its runner
//!   registered (the runner process's first request) and queued → job started, on the fake's
//!   clock;
//! - **during removal**: a first job whose runner writes `--files` small files into its
//!   checkout ([`RunnerBehavior::checkout_files`]); the bench flushes them to disk (a real
//!   checkout has long been written back when its job ends), watches every directory of the
//!   runtime with inotify, and only then lets the job end ([`FINISH_FILE`]). The moment the
//!   first entry of the runtime is unlinked (the agent's removal began), the next job is queued;
//!   its wait is measured as above, and the removal's own duration is from that first unlink to
//!   the runtime directory's own removal from the runner root (inotify again).
//!
//! Nothing is simulated on the agent's side: the real binary, real files, its real removal.

use std::ffi::OsString;
use std::mem::MaybeUninit;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use rm_bench::agent::AgentProcess;
use rm_bench::local::{free_port, sibling};
use rm_fake_github::jit::RUNNER_PROTOCOL_PREFIX;
use rm_fake_github::{FakeGithub, JobStatus, RunnerBehavior};
use rm_fake_runner::{CHECKOUT_DONE_FILE, FINISH_FILE};
use rustix::fs::inotify;
use secrecy::SecretString;
use tokio::sync::oneshot;

const APP_ID: u64 = 79;
const REPO: &str = "acme/widgets";
const LABELS: &[&str] = &["self-hosted", "linux"];
const SECRET: &str = "bench-webhook-secret";
/// How long the agent may take to ask for its runner inventory after it starts.
const STARTUP: Duration = Duration::from_secs(60);
/// First uid of this benchmark's runner uid ranges: above the default pool, the e2e fleets'
/// blocks (up to about 9,400,000) and `runner-latency`'s (40,000,000 up to 42,097,152).
const UID_BASE: u32 = 43_000_000;
/// Uids in the range: at most this many runners (`--host-max`).
const UIDS: u32 = 16;
/// How long one step of a round (a job served and cleaned, a checkout written) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the bench looks at the fake and the runner root while it waits.
const POLL: Duration = Duration::from_millis(20);
/// How long the checkout job runs unless the bench ends it first: far longer than writing and
/// flushing its files, so the job ends when the bench says, never before its watches are set.
const CHECKOUT_JOB_MAX: Duration = Duration::from_secs(1800);
/// The fake runner's checkout directories hold 250 files each (`rm-fake-runner`).
const FILES_PER_DIR: u32 = 250;

#[derive(Parser, Debug)]
#[command(
    about = "Queued-to-runner wait of rm-agent run at rest, and while it removes the runtime of \
             a job that left a large checkout"
)]
struct Args {
    /// Rounds; each measures one job at rest and one queued during a removal.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Files the first job of a removal round leaves in its checkout.
    #[arg(long, default_value_t = 100_000)]
    files: u32,
    /// How long the measured jobs (at rest, and the one queued during the removal) run.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    job_duration: Duration,
    /// `host.isolation`: `user` (the agent's default: each runtime hard links to the package
    /// store, the runner runs under a uid of its own, so the bench runs as root) or `none` (each
    /// runtime a copy of the package, the runner as the agent's user). Either way the runtime
    /// is a directory of the runner root that the agent removes when the runner is done.
    #[arg(long, default_value = "user", value_parser = ["user", "none"])]
    isolation: String,
    /// `host.max_runners`: at least 2, so the runner being cleaned never holds the next job
    /// back by capacity.
    #[arg(long, default_value_t = 4)]
    host_max: u32,
    /// The rm-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// The fake runner binary (default: next to this one).
    #[arg(long)]
    runner: Option<PathBuf>,
}

/// The agent, its fake GitHub and where its runtimes go.
struct Bench {
    fake: FakeGithub,
    agent: AgentProcess,
    /// `host.runner_root`: every runtime is a direct child.
    root: PathBuf,
    /// What the runner root held once the agent was ready (no runtime).
    baseline: Vec<OsString>,
    /// The behaviour of the measured jobs' runners.
    plain: RunnerBehavior,
    dir: tempfile::TempDir,
}

/// A job's wait for its runner, on the fake's clock.
struct Wait {
    /// Queued → its runner's first request (registration): the agent's decision, the runtime,
    /// the JIT registration and the process start.
    registered: Duration,
    /// Queued → the runner took the job.
    started: Duration,
}

/// One removal round.
struct Removal {
    /// How long the runner took to write its checkout (its own figure).
    written: String,
    /// The runtime's entry the removal unlinked first.
    unlinked: String,
    /// The first job completed → the first entry of its runtime unlinked.
    completed_to_began: Duration,
    /// The first entry unlinked → the runtime directory itself gone.
    removal: Duration,
    /// The removal began → the next job queued (the bench's own reaction).
    queued_after_began: Duration,
    /// Whether the next job was queued before the runtime was gone.
    queued_during: bool,
    /// The next job's runner registered minus the removal's end, in ms: positive when it
    /// waited past the end of the removal.
    registered_after_end_ms: f64,
    wait: Wait,
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `to − from` in ms, negative when `to` came first.
fn signed_ms(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => millis(d),
        Err(e) => -millis(e.duration()),
    }
}

/// Median (the lower of the two middle values) and max, in ms.
fn median_max(mut sample: Vec<f64>) -> (f64, f64) {
    sample.sort_by(f64::total_cmp);
    match sample.len() {
        0 => (0.0, 0.0),
        n => (sample[(n - 1) / 2], sample[n - 1]),
    }
}

/// Waits until `done` says so, or fails after [`STEP_TIMEOUT`] naming `what`.
async fn until(
    agent: &mut AgentProcess,
    what: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    while !done()? {
        agent.check_running()?;
        if Instant::now() > deadline {
            bail!("waited {STEP_TIMEOUT:?} for {what}");
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

fn entries(dir: &Path) -> Result<Vec<OsString>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name()))
        .collect::<Result<Vec<_>>>()?;
    names.sort();
    Ok(names)
}

/// When the runner that took job `id` first spoke to the fake (its registration).
fn registered_at(fake: &FakeGithub, runner_id: u64) -> Option<SystemTime> {
    let register = format!("{RUNNER_PROTOCOL_PREFIX}/register");
    fake.requests().into_iter().find_map(|r| {
        let of_runner = r
            .body
            .as_ref()
            .and_then(|b| b.get("runner_id"))
            .and_then(serde_json::Value::as_u64)
            == Some(runner_id);
        (r.path == register && r.status == 200 && of_runner).then_some(r.at)
    })
}

impl Bench {
    async fn start(args: &Args, agent: &Path, runner: &Path) -> Result<Bench> {
        let (key, fake) = rm_bench::agent::fake_github(APP_ID, REPO, args.job_duration).await?;
        let dir = tempfile::tempdir()?;
        // Under `isolation = "user"` a runner uid must pass through it to its runtime.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
        let package = rm_fake_runner::assemble_package(runner, &dir.path().join("package"))?;
        let key_file = rm_bench::agent::write_app_key(dir.path(), &key)?;
        let port = free_port()?;
        fake.set_webhook(
            &format!("http://127.0.0.1:{port}/webhook"),
            SecretString::from(SECRET),
        );
        // A uid range per run, so two runs side by side never share one.
        let uids = UID_BASE + (std::process::id() % 4096) * UIDS;
        let root = dir.path().join("runners");
        // Under either isolation the runner writes its checkout inside its runtime, a
        // directory of the runner root the bench sees, and the agent removes it with the same
        // walk (`RunnerRoot::remove_runtime`) once the runner is stopped and deregistered.
        // `network = "host"`: a private network per runner needs nftables, and what it costs a
        // runner's start is the same at rest and during a removal.
        let config = format!(
            "data_dir = \"{data}\"\n\n[github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n\n\
             [receiver]\nlisten = \"127.0.0.1:{port}\"\n\n[polling]\ninterval = \"30s\"\nidle_interval = \"5s\"\n\n\
             [host]\nname = \"bench\"\nmax_runners = {max}\nrunner_root = \"{root}\"\nrunner_uids = \"{uids}-{last}\"\n\
             network = \"host\"\nnetwork_host_ports = [{fake_port}]\nisolation = \"{isolation}\"\n\n[runner]\npackage_dir = \"{package}\"\n\n\
             [[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\", \"linux\"]\nmax_runners = {max}\n",
            data = dir.path().join("data").display(),
            api = fake.api_url(),
            fake_port = fake.port(),
            key = key_file.display(),
            max = args.host_max,
            root = root.display(),
            last = uids + UIDS - 1,
            package = package.display(),
            isolation = args.isolation,
        );
        let config_file = dir.path().join("rm-agent.toml");
        std::fs::write(&config_file, config)?;
        let mut agent = AgentProcess::spawn(
            "agent",
            agent,
            &config_file,
            "run",
            SECRET,
            dir.path().join("agent.log"),
        )?;
        // Ready once it has asked the fake for its runner inventory (recovery).
        let deadline = Instant::now() + STARTUP;
        while !fake
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/actions/runners"))
        {
            agent.check_running()?;
            if Instant::now() > deadline {
                bail!("rm-agent did not start");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let plain = RunnerBehavior {
            job_duration_ms: u64::try_from(args.job_duration.as_millis())?,
            ..RunnerBehavior::default()
        };
        Ok(Bench {
            baseline: entries(&root)?,
            fake,
            agent,
            root,
            plain,
            dir,
        })
    }

    /// Waits until every job of `ids` has completed and every runtime is gone (the agent has
    /// cleaned up after them): the host is at rest again.
    async fn settle(&mut self, ids: &[u64]) -> Result<()> {
        let (fake, root, baseline) = (&self.fake, &self.root, &self.baseline);
        until(
            &mut self.agent,
            "the jobs to complete and be cleaned",
            || {
                let completed = ids.iter().all(|id| {
                    fake.job(*id)
                        .is_some_and(|j| j.status == JobStatus::Completed)
                });
                Ok(completed && entries(root)? == *baseline)
            },
        )
        .await
    }

    /// The wait of job `id`, which has started.
    fn wait_of(&self, id: u64) -> Result<Wait> {
        let job = self.fake.job(id).context("no such job")?;
        let started = job.started_at.context("the job never started")?;
        let runner = job.runner_id.context("the job has no runner")?;
        let registered =
            registered_at(&self.fake, runner).context("its runner never registered")?;
        Ok(Wait {
            registered: registered
                .duration_since(job.created_at)
                .unwrap_or_default(),
            started: started.duration_since(job.created_at).unwrap_or_default(),
        })
    }

    /// One job queued at rest.
    async fn at_rest(&mut self, round: usize) -> Result<Wait> {
        self.fake.set_runner_behavior(self.plain.clone());
        let id = self
            .fake
            .queue_job(REPO, &format!("at rest {round}"), LABELS)?;
        self.settle(&[id]).await?;
        self.wait_of(id)
    }

    /// A job that leaves `files` files, and the next job queued as its runtime's removal begins.
    async fn during_removal(&mut self, round: usize, files: u32) -> Result<Removal> {
        self.fake.set_runner_behavior(RunnerBehavior {
            checkout_files: files,
            job_duration_ms: u64::try_from(CHECKOUT_JOB_MAX.as_millis())?,
            ..self.plain.clone()
        });
        let first = self
            .fake
            .queue_job(REPO, &format!("checkout {round}"), LABELS)?;
        let fake = &self.fake;
        until(&mut self.agent, "the checkout job to start", || {
            Ok(fake.job(first).is_some_and(|j| j.started_at.is_some()))
        })
        .await?;
        // Its runner has its behaviour (handed out at registration): every later runner gets
        // the measured jobs' plain one.
        fake.set_runner_behavior(self.plain.clone());
        let runtimes: Vec<OsString> = entries(&self.root)?
            .into_iter()
            .filter(|n| !self.baseline.contains(n))
            .collect();
        let [name] = runtimes.as_slice() else {
            bail!("expected one runtime in the runner root, found {runtimes:?}");
        };
        let runtime = self.root.join(name);
        let done = runtime.join("_diag").join(CHECKOUT_DONE_FILE);
        until(&mut self.agent, "the checkout to be written", || {
            Ok(done.exists())
        })
        .await?;
        let written = std::fs::read_to_string(&done)?.trim().to_owned();
        // A job's checkout is on disk when the job ends, not in the page cache waiting for
        // write-back: removing dirty, never-written files is cheaper than removing real ones.
        rustix::fs::syncfs(std::fs::File::open(&self.root)?)?;
        let watch = RemovalWatch::start(&self.root, &runtime)?;
        let expected_dirs = files.div_ceil(FILES_PER_DIR) as usize;
        ensure!(
            watch.dirs > expected_dirs,
            "only {} directories to watch in the runtime; its checkout has {expected_dirs}",
            watch.dirs
        );
        std::fs::write(runtime.join("_diag").join(FINISH_FILE), "")?;
        let (began, unlinked) = tokio::time::timeout(STEP_TIMEOUT, watch.began)
            .await
            .context("the runtime's removal did not begin")?
            .context("the watch ended")??;
        let next = self
            .fake
            .queue_job(REPO, &format!("after checkout {round}"), LABELS)?;
        let (gone, _) = tokio::time::timeout(STEP_TIMEOUT, watch.gone)
            .await
            .context("the runtime was not removed")?
            .context("the watch ended")??;
        self.settle(&[first, next]).await?;
        let completed = self
            .fake
            .job(first)
            .and_then(|j| j.completed_at)
            .context("the checkout job has no completion time")?;
        let queued = self.fake.job(next).context("no such job")?.created_at;
        let wait = self.wait_of(next)?;
        let registered = queued + wait.registered;
        Ok(Removal {
            written,
            unlinked,
            completed_to_began: began.duration_since(completed).unwrap_or_default(),
            removal: gone.duration_since(began).unwrap_or_default(),
            queued_after_began: queued.duration_since(began).unwrap_or_default(),
            queued_during: queued < gone,
            registered_after_end_ms: signed_ms(gone, registered),
            wait,
        })
    }
}

/// inotify on a runtime about to be removed: when its first entry is unlinked, and when the
/// runtime directory itself leaves the runner root.
struct RemovalWatch {
    /// When, and the name of the entry unlinked first.
    began: oneshot::Receiver<Result<(SystemTime, String)>>,
    gone: oneshot::Receiver<Result<(SystemTime, String)>>,
    /// Directories watched in the runtime.
    dirs: usize,
}

impl RemovalWatch {
    fn start(root: &Path, runtime: &Path) -> Result<RemovalWatch> {
        // Two inotify instances, each read on its own thread: the runtime's directories, whose
        // first event is the first unlink (100,000 more overflow its queue; it is closed after
        // the first), and the runner root, whose event for the runtime's name is its end.
        let tree = inotify::init(inotify::CreateFlags::CLOEXEC)?;
        let flags = inotify::WatchFlags::DELETE
            | inotify::WatchFlags::ONLYDIR
            | inotify::WatchFlags::DONT_FOLLOW;
        let mut dirs = 0;
        let mut pending = vec![runtime.to_path_buf()];
        while let Some(dir) = pending.pop() {
            inotify::add_watch(&tree, &dir, flags)
                .with_context(|| format!("cannot watch {}", dir.display()))?;
            dirs += 1;
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                // Not following links: the agent's removal does not either.
                if entry.file_type()?.is_dir() {
                    pending.push(entry.path());
                }
            }
        }
        let parent = inotify::init(inotify::CreateFlags::CLOEXEC)?;
        inotify::add_watch(&parent, root, flags)?;
        let name = runtime
            .file_name()
            .context("a runtime has a name")?
            .to_owned();
        let (began_tx, began) = oneshot::channel();
        let (gone_tx, gone) = oneshot::channel();
        std::thread::spawn(move || {
            let _ = began_tx.send(first_event(tree, |_| true));
        });
        std::thread::spawn(move || {
            let _ = gone_tx.send(first_event(parent, |file| {
                file.is_some_and(|f| f.to_bytes() == name.as_encoded_bytes())
            }));
        });
        Ok(RemovalWatch { began, gone, dirs })
    }
}

/// Blocks until a deletion event of `fd` whose file name passes `wanted`; the time it was read
/// and that name.
fn first_event(
    fd: rustix::fd::OwnedFd,
    wanted: impl Fn(Option<&std::ffi::CStr>) -> bool,
) -> Result<(SystemTime, String)> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(&fd, &mut buf);
    loop {
        let event = reader.next()?;
        if event.events().contains(inotify::ReadFlags::QUEUE_OVERFLOW) {
            bail!("the inotify queue overflowed before the event");
        }
        if event.events().contains(inotify::ReadFlags::DELETE) && wanted(event.file_name()) {
            let at = SystemTime::now();
            let name = event
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Ok((at, name));
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        (2..=UIDS).contains(&args.host_max),
        "--host-max is at least 2 and at most {UIDS}"
    );
    ensure!(args.files > 0, "--files is at least 1");
    let agent = match &args.agent {
        Some(p) => p.clone(),
        None => sibling("rm-agent")?,
    };
    let runner = match &args.runner {
        Some(p) => p.clone(),
        None => sibling(rm_fake_runner::BINARY_NAME)?,
    };
    let mut bench = Bench::start(&args, &agent, &runner).await?;
    eprintln!(
        "{} rounds; checkouts of {} files; measured jobs of {:?}; {} runners per host; isolation {}; agent {}",
        args.rounds,
        args.files,
        args.job_duration,
        args.host_max,
        args.isolation,
        agent.display()
    );
    let began = Instant::now();
    let mut rest = Vec::new();
    let mut removals = Vec::new();
    let outcome: Result<()> = async {
        for round in 1..=args.rounds {
            let wait = bench.at_rest(round).await?;
            let removal = bench.during_removal(round, args.files).await?;
            eprintln!(
                "round {round}: at rest {:.0} ms; checkout {}; removal began {:.0} ms after the job completed (first unlinked: {}) and took {:.0} ms; next job queued {:.0} ms into it{}, waited {:.0} ms for its runner ({:+.0} ms from the removal's end)",
                millis(wait.registered),
                removal.written,
                millis(removal.completed_to_began),
                removal.unlinked,
                millis(removal.removal),
                millis(removal.queued_after_began),
                if removal.queued_during { "" } else { " (AFTER it ended)" },
                millis(removal.wait.registered),
                removal.registered_after_end_ms,
            );
            rest.push(wait);
            removals.push(removal);
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        let kept = bench.dir.path().with_extension("log");
        let _ = std::fs::copy(bench.dir.path().join("agent.log"), &kept);
        eprintln!("the agent's log: {}", kept.display());
        return Err(e);
    }
    let during = removals.iter().filter(|r| r.queued_during).count();
    println!(
        "| job | rounds | queued → runner registered, median | max | queued → job started, median | max |"
    );
    println!("|---|---|---|---|---|---|");
    let rows: [(&str, Vec<&Wait>); 2] = [
        ("at rest", rest.iter().collect()),
        (
            "queued as a removal begins",
            removals.iter().map(|r| &r.wait).collect(),
        ),
    ];
    for (name, waits) in rows {
        let (r50, rmax) = median_max(waits.iter().map(|w| millis(w.registered)).collect());
        let (s50, smax) = median_max(waits.iter().map(|w| millis(w.started)).collect());
        println!(
            "| {name} | {} | {r50:.0} ms | {rmax:.0} ms | {s50:.0} ms | {smax:.0} ms |",
            waits.len()
        );
    }
    println!();
    println!(
        "| removal of a runtime with {} checkout files | median | max |",
        args.files
    );
    println!("|---|---|---|");
    let lines: [(&str, Vec<f64>); 4] = [
        (
            "job completed → removal began (first unlink)",
            removals
                .iter()
                .map(|r| millis(r.completed_to_began))
                .collect(),
        ),
        (
            "removal: first unlink → runtime gone",
            removals.iter().map(|r| millis(r.removal)).collect(),
        ),
        (
            "removal began → next job queued",
            removals
                .iter()
                .map(|r| millis(r.queued_after_began))
                .collect(),
        ),
        (
            "next job's runner registered − removal ended",
            removals.iter().map(|r| r.registered_after_end_ms).collect(),
        ),
    ];
    for (name, sample) in lines {
        let (median, max) = median_max(sample);
        println!("| {name} | {median:.0} ms | {max:.0} ms |");
    }
    println!();
    if during == removals.len() {
        println!("the next job was queued while the removal ran in all {during} rounds");
    } else {
        println!(
            "WARNING: the next job was queued while the removal ran in only {during} of {} rounds; the others measure nothing of it",
            removals.len()
        );
    }
    println!(
        "wall time {:.0} s; finished {}",
        began.elapsed().as_secs_f64(),
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    bench.agent.stop().await?;
    Ok(())
}
