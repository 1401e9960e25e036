//! `runner-latency`: how long a queued job waits for its fresh runner, with `rm-agent run`
//! driven by webhooks and, in the same run and on the same arrival schedule, by polling alone
//! (see docs/performance.md). Two fake GitHubs on loopback (one per agent), the fake runner
//! package, and two real `rm-agent run` processes; the fake records when each job was queued
//! and when a runner started it, so the figure is "queued → running on its own JIT runner",
//! which includes the runner's start, registration and first job request.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use rm_bench::local::{free_port, sibling};
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions, JobStatus, RunnerBehavior};
use secrecy::{ExposeSecret as _, SecretString};

const APP_ID: u64 = 77;
const REPO: &str = "acme/widgets";
const LABELS: &[&str] = &["self-hosted", "linux"];
const SECRET: &str = "bench-webhook-secret";
/// How long an agent may take to answer `/healthz` (or to settle without a receiver).
const STARTUP: Duration = Duration::from_secs(20);

#[derive(Parser, Debug)]
#[command(about = "Queued-to-running latency of rm-agent run: webhooks against polling alone")]
struct Args {
    /// Jobs queued per mode.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
    /// Time between two queued jobs. GitHub asks for a second between mutations of one
    /// installation, and each job costs one JIT registration, so faster arrivals only queue up
    /// behind that spacing.
    #[arg(long, default_value = "1200ms", value_parser = humantime::parse_duration)]
    every: Duration,
    /// How long each job runs.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    job_duration: Duration,
    /// `host.max_runners` of both agents.
    #[arg(long, default_value_t = 8)]
    host_max: u32,
    /// The rm-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// The fake runner binary (default: next to this one).
    #[arg(long)]
    runner: Option<PathBuf>,
}

/// One agent with its fake GitHub.
struct Mode {
    name: &'static str,
    fake: FakeGithub,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Mode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(
    name: &'static str,
    webhooks: bool,
    args: &Args,
    agent: &Path,
    runner: &Path,
) -> Result<Mode> {
    let key = AppKeyPair::generate()?;
    let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem.clone())).await?;
    fake.add_org("acme");
    fake.add_repo(REPO);
    fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: u64::try_from(args.job_duration.as_millis())?,
        ..RunnerBehavior::default()
    });
    let dir = tempfile::tempdir()?;
    let package = rm_fake_runner::assemble_package(runner, &dir.path().join("package"))?;
    let key_file = dir.path().join("app.pem");
    std::fs::write(&key_file, key.private_pem.expose_secret())?;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
    let port = free_port()?;
    let receiver = if webhooks {
        fake.set_webhook(
            &format!("http://127.0.0.1:{port}/webhook"),
            SecretString::from(SECRET),
        );
        format!("[receiver]\nlisten = \"127.0.0.1:{port}\"\n\n")
    } else {
        String::new()
    };
    let config = format!(
        "data_dir = \"{data}\"\n\n[github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n\n\
         {receiver}[polling]\ninterval = \"30s\"\nidle_interval = \"5s\"\n\n[host]\nname = \"bench\"\nmax_runners = {max}\n\n\
         [runner]\npackage_dir = \"{package}\"\n\n[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\", \"linux\"]\nmax_runners = {max}\n",
        data = dir.path().join("data").display(),
        api = fake.api_url(),
        key = key_file.display(),
        max = args.host_max,
        package = package.display(),
    );
    let config_file = dir.path().join("rm-agent.toml");
    std::fs::write(&config_file, config)?;
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let child = Command::new(agent)
        .arg("--config")
        .arg(&config_file)
        .arg("run")
        .env("RM_WEBHOOK_SECRET", SECRET)
        .env("RM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start rm-agent")?;
    let mode = Mode {
        name,
        fake,
        child,
        _dir: dir,
    };
    // Ready once the agent has asked the fake for its runner inventory (recovery).
    let deadline = Instant::now() + STARTUP;
    while !mode
        .fake
        .requests()
        .iter()
        .any(|r| r.path.ends_with("/actions/runners"))
    {
        if Instant::now() > deadline {
            bail!("{name}: rm-agent did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(mode)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let agent = match &args.agent {
        Some(p) => p.clone(),
        None => sibling("rm-agent")?,
    };
    let runner = match &args.runner {
        Some(p) => p.clone(),
        None => sibling(rm_fake_runner::BINARY_NAME)?,
    };
    let modes = [
        start("webhooks", true, &args, &agent, &runner).await?,
        start("polling alone", false, &args, &agent, &runner).await?,
    ];
    eprintln!(
        "queueing {} jobs per mode, one every {:?}, {} runners per host",
        args.jobs, args.every, args.host_max
    );
    let started = Instant::now();
    let mut ids: Vec<Vec<u64>> = vec![Vec::new(); modes.len()];
    let mut tick = tokio::time::interval(args.every);
    for n in 0..args.jobs {
        tick.tick().await;
        for (mode, ids) in modes.iter().zip(ids.iter_mut()) {
            ids.push(mode.fake.queue_job(REPO, &format!("job {n}"), LABELS)?);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done = modes.iter().zip(&ids).all(|(mode, ids)| {
            ids.iter().all(|id| {
                mode.fake
                    .job(*id)
                    .is_some_and(|j| j.status == JobStatus::Completed)
            })
        });
        if done {
            break;
        }
        if Instant::now() > deadline {
            bail!("not every job completed within 5 minutes of the last arrival");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    println!("mode           jobs   p50 ms    p99 ms    max ms   API requests");
    for (mode, ids) in modes.iter().zip(&ids) {
        let mut waits: Vec<Duration> = ids
            .iter()
            .filter_map(|id| mode.fake.job(*id))
            .filter_map(|j| j.started_at?.duration_since(j.created_at).ok())
            .collect();
        waits.sort_unstable();
        let requests = mode
            .fake
            .requests()
            .iter()
            .filter(|r| {
                !r.path
                    .starts_with(rm_fake_github::jit::RUNNER_PROTOCOL_PREFIX)
            })
            .count();
        println!(
            "{:<14} {:>4} {:>8.0} {:>9.0} {:>9.0}   {:>6}",
            mode.name,
            waits.len(),
            millis(percentile(&waits, 50.0)),
            millis(percentile(&waits, 99.0)),
            millis(waits.last().copied().unwrap_or_default()),
            requests
        );
    }
    println!(
        "wall time {:.0} s; finished {}",
        wall.as_secs_f64(),
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    Ok(())
}
