//! `runner-latency --compare-fleet`: how many runners a fleet on PostgreSQL starts per second,
//! one host against three (CONTRACT §9, docs/performance.md). Each fleet gets its own fake
//! GitHub and its own database on one PostgreSQL server the run starts with its default
//! durability ([`crate::pg_server::durable`]), one `rm-agent receive` taking the fake's
//! webhooks, and its `rm-agent run` hosts (each `host.max_runners` runners, its own data
//! directory, runner root and runner uids). The whole matrix is queued at once; the fleets run
//! one after the other in the same run, so each has the machine's two cores to itself and both
//! see the same arrivals.
//!
//! The figures come from the fake: when each job was queued and started, which runner ran it,
//! the JIT registrations asked for, and the answers a secondary limit refused (the fake enforces
//! GitHub's documented limits per installation, and every host of a fleet spends the same
//! installation's).

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Result, bail};
use rm_fake_github::JobStatus;
use rm_fake_github::jit::RUNNER_PROTOCOL_PREFIX;
use rm_journal::Fleet as _;
use secrecy::SecretString;

use crate::agent::AgentProcess;
use crate::local::free_port;
use crate::pg_server;

const APP_ID: u64 = 78;
const REPO: &str = "acme/widgets";
const LABELS: &[&str] = &["self-hosted", "linux"];
const SECRET: &str = "bench-fleet-webhook-secret";
/// How long a fleet may take until every host holds its lease (under `isolation = "user"` each
/// stores the package first) and the receiver answers.
const STARTUP: Duration = Duration::from_secs(90);
/// How long the matrix may take once queued.
const SERVE: Duration = Duration::from_secs(600);

/// What each fleet is given.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    pub jobs: usize,
    pub job_duration: Duration,
    /// `host.max_runners` of every host.
    pub host_max: u32,
}

/// One fleet's figures.
#[derive(Debug)]
pub struct FleetFigures {
    pub hosts: usize,
    pub jobs: usize,
    /// Runner names the fleet asked JIT registrations for.
    pub registrations: usize,
    /// From queueing the matrix to its last job starting on a runner.
    pub last_started: Duration,
    /// From queueing the matrix to its last job completing.
    pub last_completed: Duration,
    /// Queued → running on its runner, per job, sorted.
    pub waits: Vec<Duration>,
    /// REST requests the fake answered (not the runner protocol).
    pub requests: usize,
    /// Of those, refused by a secondary limit (403 or 429).
    pub limited: usize,
    /// Jobs each host's runners ran, by host.
    pub per_host: Vec<(String, usize)>,
}

impl FleetFigures {
    /// Runners that took a job per second, from queueing to the last start.
    pub fn starts_per_second(&self) -> f64 {
        self.jobs as f64 / self.last_started.as_secs_f64()
    }
}

/// Runs one fleet of `hosts` hosts through the plan's matrix. `uids(n)` is host `n`'s
/// `host.runner_uids`; `runner` the fake runner binary the package is made of.
pub async fn run(
    hosts: usize,
    plan: &FleetPlan,
    agent: &Path,
    runner: &Path,
    uids: impl Fn(usize) -> String,
) -> Result<FleetFigures> {
    let server = pg_server::durable().map_err(|e| anyhow::anyhow!("PostgreSQL: {e}"))?;
    let db = server
        .database(&format!("fleet_bench_{hosts}"))
        .map_err(|e| anyhow::anyhow!("PostgreSQL: {e}"))?;
    let url = db.url();

    let (key, fake) = crate::agent::fake_github(APP_ID, REPO, plan.job_duration).await?;
    let dir = tempfile::tempdir()?;
    // Runners run under uids of their own: they pass through the directories above theirs.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
    let package = rm_fake_runner::assemble_package(runner, &dir.path().join("package"))?;
    let key_file = crate::agent::write_app_key(dir.path(), &key)?;

    let port = free_port()?;
    let receiver_dir = dir.path().join("receiver");
    std::fs::create_dir(&receiver_dir)?;
    let receiver_config = receiver_dir.join("rm-agent.toml");
    std::fs::write(
        &receiver_config,
        format!(
            "data_dir = \"{data}\"\n\n[journal]\nurl = \"{url}\"\n\n[receiver]\nlisten = \"127.0.0.1:{port}\"\npath = \"/webhook\"\n",
            data = receiver_dir.join("data").display(),
        ),
    )?;
    let mut processes = vec![AgentProcess::spawn(
        "receiver".to_owned(),
        agent,
        &receiver_config,
        "receive",
        SECRET,
        receiver_dir.join("agent.log"),
    )?];
    // Hosts refuse a journal whose schema is behind theirs, and the receiver migrates it step by
    // step: start them once it answers.
    let deadline = Instant::now() + STARTUP;
    while !healthy(port) {
        for p in &mut processes {
            p.check_running()?;
        }
        if Instant::now() > deadline {
            bail!("the receiver did not answer within {STARTUP:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut names = Vec::new();
    for n in 0..hosts {
        let name = format!("bench-h{n}");
        let host_dir = dir.path().join(&name);
        std::fs::create_dir(&host_dir)?;
        std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o711))?;
        let config = host_dir.join("rm-agent.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{data}\"\n\n[journal]\nurl = \"{url}\"\n\n\
                 [github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n\n\
                 [notifications]\ndesktop = false\n\n\
                 [host]\nname = \"{name}\"\nmax_runners = {max}\nrunner_root = \"{root}\"\nrunner_uids = \"{uids}\"\nnetwork_host_ports = [{port}]\n\n\
                 [runner]\npackage_dir = \"{package}\"\n\n\
                 [[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\", \"linux\"]\nmax_runners = {max}\n",
                data = host_dir.join("data").display(),
                api = fake.api_url(),
                port = fake.port(),
                key = key_file.display(),
                max = plan.host_max,
                root = host_dir.join("runners").display(),
                uids = uids(n),
                package = package.display(),
            ),
        )?;
        processes.push(AgentProcess::spawn(
            name.clone(),
            agent,
            &config,
            "run",
            SECRET,
            host_dir.join("agent.log"),
        )?);
        names.push(name);
    }
    fake.set_webhook(
        &format!("http://127.0.0.1:{port}/webhook"),
        SecretString::from(SECRET),
    );

    // Ready once every host holds its lease and the receiver answers.
    let deadline = Instant::now() + STARTUP;
    loop {
        for p in &mut processes {
            p.check_running()?;
        }
        let live = live_hosts(&url).await;
        if names.iter().all(|n| live.contains(n)) && healthy(port) {
            break;
        }
        if Instant::now() > deadline {
            bail!("{hosts} hosts: the fleet did not start within {STARTUP:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let queued_at = SystemTime::now();
    let mut ids = Vec::with_capacity(plan.jobs);
    for n in 0..plan.jobs {
        ids.push(fake.queue_job(REPO, &format!("job {n}"), LABELS)?);
    }
    let deadline = Instant::now() + SERVE;
    loop {
        let done = ids.iter().all(|id| {
            fake.job(*id)
                .is_some_and(|j| j.status == JobStatus::Completed)
        });
        if done {
            break;
        }
        for p in &mut processes {
            p.check_running()?;
        }
        if Instant::now() > deadline {
            let kept = dir.keep();
            bail!(
                "{hosts} hosts: not every job completed within {SERVE:?}; logs kept in {}",
                kept.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let jobs: Vec<_> = ids.iter().filter_map(|id| fake.job(*id)).collect();
    let since = |at: Option<SystemTime>| {
        at.and_then(|at| at.duration_since(queued_at).ok())
            .unwrap_or_default()
    };
    let last_started = jobs
        .iter()
        .map(|j| since(j.started_at))
        .max()
        .unwrap_or_default();
    let last_completed = jobs
        .iter()
        .map(|j| since(j.completed_at))
        .max()
        .unwrap_or_default();
    let mut waits: Vec<Duration> = jobs
        .iter()
        .filter_map(|j| j.started_at?.duration_since(j.created_at).ok())
        .collect();
    waits.sort_unstable();
    let mut per_host: HashMap<String, usize> = HashMap::new();
    for j in &jobs {
        let host = names
            .iter()
            .find(|n| {
                j.runner_name
                    .as_deref()
                    .is_some_and(|r| r.starts_with(&format!("rm-{n}-")))
            })
            .cloned()
            .unwrap_or_else(|| "?".to_owned());
        *per_host.entry(host).or_default() += 1;
    }
    let mut per_host: Vec<(String, usize)> = per_host.into_iter().collect();
    per_host.sort();
    let requests = fake.requests();
    let rest: Vec<_> = requests
        .iter()
        .filter(|r| !r.path.starts_with(RUNNER_PROTOCOL_PREFIX))
        .collect();
    let registrations: HashSet<&str> = rest
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .filter_map(|r| r.body.as_ref()?["name"].as_str())
        .collect();
    let figures = FleetFigures {
        hosts,
        jobs: jobs.len(),
        registrations: registrations.len(),
        last_started,
        last_completed,
        waits,
        requests: rest.len(),
        limited: rest
            .iter()
            .filter(|r| r.status == 403 || r.status == 429)
            .count(),
        per_host,
    };
    // Hosts first (they drain their runners), then the receiver.
    for p in processes.iter_mut().rev() {
        p.stop().await?;
    }
    Ok(figures)
}

/// The hosts holding a live lease in the fleet's journal (none while it cannot be read). The
/// journal's PostgreSQL client blocks: it runs off the async workers.
async fn live_hosts(url: &str) -> HashSet<String> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        rm_journal::PgFleet::connect(&url)
            .ok()
            .and_then(|mut fleet| fleet.view().ok())
            .map(|view| {
                view.hosts
                    .into_iter()
                    .filter(|h| h.live)
                    .map(|h| h.host)
                    .collect()
            })
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default()
}

/// Whether the receiver on `port` answers `/healthz` with 200.
fn healthy(port: u16) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
