//! `runner-latency`: how long a queued job waits for its fresh runner, with `rm-agent run`
//! driven by webhooks and, in the same run and on the same arrival schedule, by polling alone
//! (see docs/performance.md). Two fake GitHubs on loopback (one per agent), the fake runner
//! package, and two real `rm-agent run` processes; the fake records when each job was queued,
//! when its runner process first spoke to it (its registration) and when that runner started
//! the job, so the figures are "queued → runner process executed" and "queued → running on its
//! own JIT runner", which includes the runner's start, registration and first job request.
//!
//! With `--compare-runtimes`, both agents take webhooks and the fake runner package carries the
//! synthetic payload of a real actions/runner release ([`rm_bench::package`], 418 MiB in 5,008
//! files); one agent runs `isolation = "none"` (the package copied into every runtime), the other
//! `isolation = "user"` (every runtime hard links to the verified package store).
//!
//! With `--compare-pacing`, both agents take webhooks; one paces its requests inside GitHub's
//! documented secondary limits (`github.pacing = "documented"`, the default), the other a second
//! between two mutations (`"one_per_second"`, rm's rule before). `--every 0s` queues all jobs at
//! once, a matrix: the `max` columns are then the time until every runner has registered and
//! until every job has started.
//!
//! With `--compare-fleet`, a fleet on PostgreSQL of one host, then one of three
//! ([`rm_bench::fleet`]), each through the same matrix queued at once: runner starts per second.
//!
//! With `--compare-scale-set`, the same burst queued at once for an agent taking webhooks (the
//! jobs queued as REST jobs) and then for an agent with no receiver serving a `[[scale_set]]`
//! (the jobs queued at the fake's broker): how soon runners start against the host's capacity,
//! how many are alive at once, and every request each agent sent during its burst, by endpoint.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use std::collections::HashMap;

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use rm_bench::agent::AgentProcess;
use rm_bench::fleet::{self, FleetPlan};
use rm_bench::local::{free_port, sibling};
use rm_bench::package::{Size, add_payload, measure};
use rm_fake_github::jit::RUNNER_PROTOCOL_PREFIX;
use rm_fake_github::{FakeGithub, JobStatus, RequestKind};
use secrecy::SecretString;

const APP_ID: u64 = 77;
const REPO: &str = "acme/widgets";
const LABELS: &[&str] = &["self-hosted", "linux"];
const SECRET: &str = "bench-webhook-secret";
/// How long an agent may take to ask for its runner inventory (under `isolation = "user"` it
/// stores the package first).
const STARTUP: Duration = Duration::from_secs(60);
/// First uid of the benchmark's runner uid ranges: far above the default pool (64200-64263) and
/// above the blocks the e2e fleets take (1,000,000 up to about 9,400,000).
const UID_BASE: u32 = 40_000_000;
/// Uids per agent.
const UIDS_PER_MODE: u32 = 128;
/// Agents of one run with runners: two, or one host and then three with `--compare-fleet`.
const AGENTS_PER_RUN: u32 = 4;

#[derive(Parser, Debug)]
#[command(
    about = "Queued-to-running latency of rm-agent run: webhooks against polling alone, or \
             (--compare-runtimes) a copied runtime against store links"
)]
struct Args {
    /// Jobs queued per mode [default: 200; 100 with --compare-runtimes].
    #[arg(long)]
    jobs: Option<usize>,
    /// Time between two queued jobs [default: 1200ms; 2s with --compare-runtimes]. GitHub asks
    /// for a second between mutations of one installation, and each job costs one JIT
    /// registration, so faster arrivals only queue up behind that spacing.
    #[arg(long, value_parser = humantime::parse_duration)]
    every: Option<Duration>,
    /// How long each job runs.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    job_duration: Duration,
    /// `host.max_runners` of both agents [default: 8; 4 with --compare-runtimes].
    #[arg(long)]
    host_max: Option<u32>,
    /// Compare runtimes instead of event sources: both agents take webhooks, one with
    /// `isolation = "none"` (the package copied into every runtime), one with
    /// `isolation = "user"` (store links), both with the fake runner package plus a synthetic
    /// 418 MiB, 5,008-file payload shaped like an actions/runner release.
    #[arg(long)]
    compare_runtimes: bool,
    /// Compare pacings instead of event sources: both agents take webhooks, one with
    /// `github.pacing = "documented"`, one with `"one_per_second"`.
    #[arg(long, conflicts_with = "compare_runtimes")]
    compare_pacing: bool,
    /// Compare fleets on PostgreSQL instead: one host against three (one receiver each, the
    /// journal on a PostgreSQL server the run starts), the whole matrix queued at once, one
    /// fleet after the other [defaults: --jobs 120, --host-max 4].
    #[arg(long, conflicts_with_all = ["compare_runtimes", "compare_pacing"])]
    compare_fleet: bool,
    /// Compare demand sources for a burst queued at once: webhooks (REST jobs, JIT
    /// registrations through the REST API) against a runner scale set (no receiver; the jobs
    /// queued at the fake's broker, runners registered through the scale set's
    /// `generatejitconfig`), one agent after the other [defaults: --jobs 120, --host-max 8].
    #[arg(long, conflicts_with_all = ["compare_runtimes", "compare_pacing", "compare_fleet"])]
    compare_scale_set: bool,
    /// The rm-agent binary (default: next to this one).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// The fake runner binary (default: next to this one).
    #[arg(long)]
    runner: Option<PathBuf>,
}

/// The run's settings, with the defaults of its kind filled in.
struct Plan {
    jobs: usize,
    every: Duration,
    job_duration: Duration,
    host_max: u32,
}

/// What one agent is started with.
struct Spec {
    name: &'static str,
    webhooks: bool,
    /// `host.isolation`; `None` leaves the agent's default (`user`).
    isolation: Option<&'static str>,
    /// `host.runner_uids`: agents side by side must never share a uid (one's cleanup kills
    /// every process of its runners' uids).
    uids: String,
    /// A package to use instead of a fresh fake runner package.
    package: Option<PathBuf>,
    /// `github.pacing`; `None` leaves the agent's default (`documented`).
    pacing: Option<&'static str>,
    /// A `[[scale_set]]` of this name served by the agent's policy (whose only label is then
    /// the scale set's name); `None` for a webhook policy labelled [`LABELS`].
    scale_set: Option<&'static str>,
}

/// One agent with its fake GitHub.
struct Mode {
    name: &'static str,
    fake: FakeGithub,
    agent: AgentProcess,
    /// From starting the agent to its first ask for the runner inventory (with a scale set:
    /// to its session journalled).
    ready_after: Duration,
    /// `host.runner_uids`, first and last.
    uids: (u32, u32),
    /// The scale set's id at the fake, once the agent created it.
    scale_set_id: Option<u64>,
    dir: tempfile::TempDir,
}

/// A new temporary directory every uid may pass through: a runner uid must reach its runtime
/// below it.
fn passable_tempdir() -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
    Ok(dir)
}

async fn start(spec: Spec, plan: &Plan, agent: &Path, runner: &Path) -> Result<Mode> {
    let name = spec.name;
    let (key, fake) = rm_bench::agent::fake_github(APP_ID, REPO, plan.job_duration).await?;
    let dir = passable_tempdir()?;
    let package = match spec.package {
        Some(package) => package,
        None => rm_fake_runner::assemble_package(runner, &dir.path().join("package"))?,
    };
    let key_file = rm_bench::agent::write_app_key(dir.path(), &key)?;
    let port = free_port()?;
    let receiver = if spec.webhooks {
        fake.set_webhook(
            &format!("http://127.0.0.1:{port}/webhook"),
            SecretString::from(SECRET),
        );
        format!("[receiver]\nlisten = \"127.0.0.1:{port}\"\n\n")
    } else {
        String::new()
    };
    let config = format!(
        "data_dir = \"{data}\"\n\n[github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n{pacing}\n\
         {receiver}[polling]\ninterval = \"30s\"\nidle_interval = \"5s\"\n\n[host]\nname = \"bench\"\nmax_runners = {max}\n\
         runner_root = \"{root}\"\nrunner_uids = \"{uids}\"\nnetwork_host_ports = [{port}]\n{isolation}\n[runner]\npackage_dir = \"{package}\"\n\n[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = {labels}\nmax_runners = {max}\n{scale_set}",
        data = dir.path().join("data").display(),
        api = fake.api_url(),
        port = fake.port(),
        key = key_file.display(),
        max = plan.host_max,
        root = dir.path().join("runners").display(),
        uids = spec.uids,
        isolation = spec
            .isolation
            .map(|i| format!("isolation = \"{i}\"\n"))
            .unwrap_or_default(),
        package = package.display(),
        pacing = spec
            .pacing
            .map(|p| format!("pacing = \"{p}\"\n"))
            .unwrap_or_default(),
        labels = match spec.scale_set {
            Some(set) => format!("[\"{set}\"]"),
            None => format!("{LABELS:?}"),
        },
        scale_set = spec
            .scale_set
            .map(|set| format!("\n[[scale_set]]\nname = \"{set}\"\npolicy = \"linux\"\n"))
            .unwrap_or_default(),
    );
    let config_file = dir.path().join("rm-agent.toml");
    std::fs::write(&config_file, config)?;
    let launched = Instant::now();
    let agent = AgentProcess::spawn(
        name,
        agent,
        &config_file,
        "run",
        SECRET,
        dir.path().join("agent.log"),
    )?;
    let uids = spec
        .uids
        .split_once('-')
        .and_then(|(from, to)| Some((from.parse().ok()?, to.parse().ok()?)))
        .context("host.runner_uids is FROM-TO")?;
    let mut mode = Mode {
        name,
        fake,
        agent,
        ready_after: Duration::ZERO,
        uids,
        scale_set_id: None,
        dir,
    };
    // Ready once the agent has asked the fake for its runner inventory (recovery); with a
    // scale set, once it has journalled the scale set's id and its message session.
    let journal = mode.dir.path().join("data").join(rm_journal::JOURNAL_FILE);
    let deadline = Instant::now() + STARTUP;
    loop {
        if let Some(set) = spec.scale_set {
            let record = journal
                .exists()
                .then(|| rm_journal::ScaleSets::open(&journal).ok()?.get(set).ok()?)
                .flatten();
            if let Some(record) = record
                && record.session_id.is_some()
            {
                mode.scale_set_id = record.scale_set_id.and_then(|id| u64::try_from(id).ok());
            }
            if mode.scale_set_id.is_some() {
                break;
            }
        } else if mode
            .fake
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/actions/runners"))
        {
            break;
        }
        mode.agent.check_running()?;
        if Instant::now() > deadline {
            bail!("{name}: rm-agent did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    mode.ready_after = launched.elapsed();
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

/// p50, p99 and max of a sample, sorted in place, in ms.
fn summary(sample: &mut [Duration]) -> (f64, f64, f64) {
    sample.sort_unstable();
    (
        millis(percentile(sample, 50.0)),
        millis(percentile(sample, 99.0)),
        millis(sample.last().copied().unwrap_or_default()),
    )
}

/// When each runner first spoke to the fake (its registration), by runner id.
fn registered_at(fake: &FakeGithub) -> HashMap<u64, SystemTime> {
    first_answered(fake.requests(), "register", "runner_id")
}

/// The first time each value of `field` in the body of a runner-protocol request to `call`
/// (`register`, `complete`) was answered 200, by that value, on the fake's clock.
fn first_answered(
    requests: Vec<rm_fake_github::RequestRecord>,
    call: &str,
    field: &str,
) -> HashMap<u64, SystemTime> {
    let path = format!("{RUNNER_PROTOCOL_PREFIX}/{call}");
    let mut first = HashMap::new();
    for request in requests {
        let value = request
            .body
            .as_ref()
            .and_then(|b| b.get(field))
            .and_then(serde_json::Value::as_u64);
        if request.path == path
            && request.status == 200
            && let Some(value) = value
        {
            first.entry(value).or_insert(request.at);
        }
    }
    first
}

/// The synthetic release-sized package: the fake runner's, plus [`add_payload`].
fn release_sized_package(runner: &Path, dir: &Path) -> Result<(PathBuf, Size)> {
    let started = Instant::now();
    let package = rm_fake_runner::assemble_package(runner, &dir.join("package"))?;
    add_payload(&package).context("cannot build the synthetic payload")?;
    rustix::fs::syncfs(std::fs::File::open(&package)?)?;
    let size = measure(&package)?;
    ensure!(
        size.is_release_sized(),
        "the package is too small: {size:?}"
    );
    eprintln!(
        "package: {} files, {:.0} MiB, built in {:.1} s",
        size.files,
        size.mib(),
        started.elapsed().as_secs_f64()
    );
    Ok((package, size))
}

/// `--compare-fleet`: one host, then three, through the same matrix; one table.
async fn compare_fleet(
    plan: &FleetPlan,
    agent: &Path,
    runner: &Path,
    uids: impl Fn(u32) -> String,
) -> Result<()> {
    eprintln!(
        "queueing {} jobs at once per fleet, {} runners per host, jobs of {:?}",
        plan.jobs, plan.host_max, plan.job_duration
    );
    let began = Instant::now();
    let one = fleet::run(1, plan, agent, runner, |n| uids(n as u32)).await?;
    eprintln!("1 host done");
    let three = fleet::run(3, plan, agent, runner, |n| uids(1 + n as u32)).await?;
    println!(
        "| fleet | runners | jobs | JIT registrations | runner starts / s | last started | last done | wait p50 | p99 | REST requests | refused by a secondary limit | jobs per host |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for f in [&one, &three] {
        let mut waits = f.waits.clone();
        let (p50, p99, _) = summary(&mut waits);
        let per_host: Vec<String> = f.per_host.iter().map(|(h, n)| format!("{h} {n}")).collect();
        println!(
            "| {} host{} | {} | {} | {} | {:.2} | {:.1} s | {:.1} s | {p50:.0} ms | {p99:.0} ms | {} | {} | {} |",
            f.hosts,
            if f.hosts == 1 { "" } else { "s" },
            f.hosts as u32 * plan.host_max,
            f.jobs,
            f.registrations,
            f.starts_per_second(),
            f.last_started.as_secs_f64(),
            f.last_completed.as_secs_f64(),
            f.requests,
            f.limited,
            per_host.join(", "),
        );
    }
    println!(
        "wall time {:.0} s; finished {}",
        began.elapsed().as_secs_f64(),
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    Ok(())
}

/// The scale set of `--compare-scale-set`'s second agent (its policy's only label).
const SCALE_SET: &str = "rm-burst";
/// How long a burst may take, from queueing to its last job completed.
const BURST_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a burst's runners may then take to be removed at the fake.
const REMOVAL_TIMEOUT: Duration = Duration::from_secs(90);
/// How often a burst is looked at: its jobs, and the host's live runners.
const SAMPLE: Duration = Duration::from_millis(100);

/// How many uids in `uids` (inclusive) own a live process now: the runners alive on the host,
/// since each runner has a uid of its own while it runs (`isolation = "user"`).
fn live_runner_uids(uids: (u32, u32)) -> usize {
    let mut seen = std::collections::HashSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        // The real uid (a process gone meanwhile is skipped).
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        if let Some(uid) = uid
            && (uids.0..=uids.1).contains(&uid)
        {
            seen.insert(uid);
        }
    }
    seen.len()
}

/// One job of a burst, whichever way it was queued.
struct JobView {
    started_at: Option<SystemTime>,
    runner_id: Option<u64>,
    completed: bool,
}

fn job_view(mode: &Mode, id: u64) -> Option<JobView> {
    if mode.scale_set_id.is_some() {
        let job = mode.fake.scale_set_job(id)?;
        Some(JobView {
            started_at: job.started_at,
            runner_id: job.runner_id,
            completed: job.state == rm_fake_github::broker::JobState::Completed,
        })
    } else {
        let job = mode.fake.job(id)?;
        Some(JobView {
            started_at: job.started_at,
            runner_id: job.runner_id,
            completed: job.status == JobStatus::Completed,
        })
    }
}

/// What one agent did with a burst, from the moment it was queued (the fake's clock).
struct Burst {
    jobs: usize,
    first_registered: Duration,
    started_p50: Duration,
    all_started: Duration,
    all_completed: Duration,
    /// Most runner uids with a live process at once, sampled every [`SAMPLE`].
    most_alive: usize,
    /// Runners that registered (their first runner-protocol request) since the burst.
    registered: usize,
    /// Distinct runners that took the burst's jobs.
    runners_for_jobs: usize,
    /// JIT configurations asked for, REST or scale set.
    jit: usize,
    /// From queueing until the fake listed no runner any more; `None` if that took longer than
    /// [`REMOVAL_TIMEOUT`] after the last job completed.
    removed: Option<Duration>,
    /// Every request the fake answered from queueing until the runners were removed.
    counts: std::collections::BTreeMap<(RequestKind, String), usize>,
    /// The same by the fake's answer (status code).
    statuses: HashMap<(RequestKind, String), std::collections::BTreeMap<u16, usize>>,
}

impl Burst {
    fn of_kind(&self, kind: RequestKind) -> usize {
        self.counts
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Queues `plan.jobs` jobs at once for `mode` (REST jobs, or at its scale set), waits until
/// every one has completed and every runner is removed, and measures.
async fn burst(mode: &mut Mode, plan: &Plan) -> Result<Burst> {
    let names: Vec<String> = (0..plan.jobs).map(|n| format!("job {n}")).collect();
    let began = mode.fake.now();
    let started = Instant::now();
    let ids: Vec<u64> = match mode.scale_set_id {
        Some(set) => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            mode.fake
                .queue_scale_set_jobs(set, &names)
                .context("the fake does not know the scale set")?
        }
        None => {
            let mut ids = Vec::with_capacity(names.len());
            for name in &names {
                ids.push(mode.fake.queue_job(REPO, name, LABELS)?);
            }
            ids
        }
    };
    let mut most_alive = 0;
    loop {
        most_alive = most_alive.max(live_runner_uids(mode.uids));
        let done = ids
            .iter()
            .filter(|id| job_view(mode, **id).is_some_and(|j| j.completed))
            .count();
        if done == ids.len() {
            break;
        }
        mode.agent.check_running()?;
        if started.elapsed() > BURST_TIMEOUT {
            let kept = keep_log(mode);
            bail!(
                "{}: {done} of {} jobs completed within {BURST_TIMEOUT:?}; its log: {}",
                mode.name,
                ids.len(),
                kept.display()
            );
        }
        tokio::time::sleep(SAMPLE).await;
    }
    let jobs_done = Instant::now();
    let removed = loop {
        most_alive = most_alive.max(live_runner_uids(mode.uids));
        if mode.fake.runners().is_empty() {
            break Some(started.elapsed());
        }
        if jobs_done.elapsed() > REMOVAL_TIMEOUT {
            break None;
        }
        tokio::time::sleep(SAMPLE).await;
    };
    let since = |at: SystemTime| at.duration_since(began).unwrap_or_default();
    let jobs: Vec<JobView> = ids.iter().filter_map(|id| job_view(mode, *id)).collect();
    let mut starts: Vec<Duration> = jobs
        .iter()
        .filter_map(|j| j.started_at.map(since))
        .collect();
    ensure!(
        starts.len() == ids.len(),
        "{}: a job without its start",
        mode.name
    );
    starts.sort_unstable();
    // A job's end is its runner's report (`/complete`, answered 200) on the fake's clock.
    let completed_at = first_answered(mode.fake.requests_since(began), "complete", "job_id");
    let ends: Vec<Duration> = ids
        .iter()
        .filter_map(|id| completed_at.get(id).copied().map(since))
        .collect();
    ensure!(
        ends.len() == ids.len(),
        "{}: {} of {} jobs without their runner's report",
        mode.name,
        ids.len() - ends.len(),
        ids.len()
    );
    let registered: Vec<Duration> = registered_at(&mode.fake)
        .into_values()
        .filter(|at| *at >= began)
        .map(since)
        .collect();
    let runners_for_jobs = jobs
        .iter()
        .filter_map(|j| j.runner_id)
        .collect::<std::collections::HashSet<_>>()
        .len();
    // The agent keeps polling while this counts: one snapshot, cut at `end`, gives the counts
    // and their answers (counted as `request_counts_since` counts: by kind and endpoint).
    let end = mode.fake.now();
    let mut counts = std::collections::BTreeMap::new();
    let mut statuses: HashMap<_, std::collections::BTreeMap<u16, usize>> = HashMap::new();
    for request in mode.fake.requests_since(began) {
        if request.at >= end {
            continue;
        }
        let key = (request.kind(), request.endpoint());
        *counts.entry(key.clone()).or_insert(0) += 1;
        *statuses
            .entry(key)
            .or_default()
            .entry(request.status)
            .or_default() += 1;
    }
    let jit = counts
        .iter()
        .filter(|((_, endpoint), _)| endpoint.contains("jitconfig"))
        .map(|(_, n)| n)
        .sum();
    Ok(Burst {
        jobs: ids.len(),
        first_registered: registered.iter().min().copied().unwrap_or_default(),
        started_p50: percentile(&starts, 50.0),
        all_started: starts.last().copied().unwrap_or_default(),
        all_completed: ends.iter().max().copied().unwrap_or_default(),
        most_alive,
        registered: registered.len(),
        runners_for_jobs,
        jit,
        removed,
        counts,
        statuses,
    })
}

/// Copies the agent's log out of its temporary directory (removed with it); the copy's path.
fn keep_log(mode: &Mode) -> PathBuf {
    let kept = mode.dir.path().with_extension("log");
    let _ = std::fs::copy(mode.dir.path().join("agent.log"), &kept);
    kept
}

/// `--compare-scale-set`: the same burst through webhooks, then through a scale set; one agent
/// at a time, so neither shares the two cores with the other's runners.
async fn compare_scale_set(
    plan: &Plan,
    agent: &Path,
    runner: &Path,
    uids: impl Fn(u32) -> String,
) -> Result<()> {
    let specs = [
        Spec {
            name: "webhooks",
            webhooks: true,
            isolation: None,
            uids: uids(0),
            package: None,
            pacing: None,
            scale_set: None,
        },
        Spec {
            name: "scale set",
            webhooks: false,
            isolation: None,
            uids: uids(1),
            package: None,
            pacing: None,
            scale_set: Some(SCALE_SET),
        },
    ];
    eprintln!(
        "queueing {} jobs at once per agent, one agent after the other, {} runners per host, \
         jobs of {:?}",
        plan.jobs, plan.host_max, plan.job_duration
    );
    let wall = Instant::now();
    let mut bursts = Vec::new();
    for spec in specs {
        let mut mode = start(spec, plan, agent, runner).await?;
        eprintln!(
            "{}: ready {:.1} s after start",
            mode.name,
            mode.ready_after.as_secs_f64()
        );
        let burst = burst(&mut mode, plan).await?;
        mode.agent.stop().await?;
        eprintln!(
            "{}: done; its log: {}",
            mode.name,
            keep_log(&mode).display()
        );
        bursts.push((mode.name, burst));
    }
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    println!(
        "| agent | jobs | host max | first runner registered | job started p50 | every job started | every job completed | most runners alive at once | runners registered | runners that took a job | JIT configs | runners all removed | REST | tokens | broker |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, b) in &bursts {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            b.jobs,
            plan.host_max,
            secs(b.first_registered),
            secs(b.started_p50),
            secs(b.all_started),
            secs(b.all_completed),
            b.most_alive,
            b.registered,
            b.runners_for_jobs,
            b.jit,
            b.removed
                .map_or_else(|| format!("not within {REMOVAL_TIMEOUT:?}"), secs),
            b.of_kind(RequestKind::Rest),
            b.of_kind(RequestKind::Token),
            b.of_kind(RequestKind::Broker),
        );
    }
    println!();
    println!("Requests from queueing until every runner was removed, by endpoint:");
    println!();
    println!(
        "| kind | endpoint | {} |",
        bursts
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(bursts.len()));
    let mut endpoints: Vec<&(RequestKind, String)> =
        bursts.iter().flat_map(|(_, b)| b.counts.keys()).collect();
    endpoints.sort();
    endpoints.dedup();
    for key in endpoints {
        let (kind, endpoint) = key;
        // `120 (200: 120)`: the count, then by the fake's answer.
        let row: Vec<String> = bursts
            .iter()
            .map(|(_, b)| {
                let count = b.counts.get(key).copied().unwrap_or(0);
                let answers: Vec<String> = b
                    .statuses
                    .get(key)
                    .into_iter()
                    .flatten()
                    .map(|(status, n)| format!("{status}: {n}"))
                    .collect();
                if answers.is_empty() {
                    count.to_string()
                } else {
                    format!("{count} ({})", answers.join(", "))
                }
            })
            .collect();
        println!("| {kind:?} | `{endpoint}` | {} |", row.join(" | "));
    }
    println!(
        "wall time {:.0} s; finished {}",
        wall.elapsed().as_secs_f64(),
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let compare = args.compare_runtimes;
    let plan = Plan {
        jobs: args.jobs.unwrap_or(if compare { 100 } else { 200 }),
        every: args.every.unwrap_or(if compare {
            Duration::from_secs(2)
        } else {
            Duration::from_millis(1200)
        }),
        job_duration: args.job_duration,
        host_max: args.host_max.unwrap_or(if compare { 4 } else { 8 }),
    };
    ensure!(
        plan.host_max <= UIDS_PER_MODE,
        "--host-max is at most {UIDS_PER_MODE}"
    );
    let agent = match &args.agent {
        Some(p) => p.clone(),
        None => sibling("rm-agent")?,
    };
    let runner = match &args.runner {
        Some(p) => p.clone(),
        None => sibling(rm_fake_runner::BINARY_NAME)?,
    };
    // A uid block per run (the process id picks it) and a range per agent within it.
    let first = UID_BASE + (std::process::id() % 4096) * AGENTS_PER_RUN * UIDS_PER_MODE;
    let uids = |n: u32| {
        let from = first + n * UIDS_PER_MODE;
        format!("{from}-{}", from + UIDS_PER_MODE - 1)
    };
    if args.compare_fleet {
        let plan = FleetPlan {
            jobs: args.jobs.unwrap_or(120),
            job_duration: args.job_duration,
            host_max: args.host_max.unwrap_or(4),
        };
        return compare_fleet(&plan, &agent, &runner, uids).await;
    }
    if args.compare_scale_set {
        let plan = Plan {
            jobs: args.jobs.unwrap_or(120),
            every: Duration::ZERO,
            job_duration: args.job_duration,
            host_max: args.host_max.unwrap_or(8),
        };
        return compare_scale_set(&plan, &agent, &runner, uids).await;
    }
    let shared = passable_tempdir()?;
    let specs = if compare {
        let (package, _) = release_sized_package(&runner, shared.path())?;
        [
            Spec {
                name: "copy (isolation none)",
                webhooks: true,
                isolation: Some("none"),
                uids: uids(0),
                package: Some(package.clone()),
                pacing: None,
                scale_set: None,
            },
            Spec {
                name: "store links (isolation user)",
                webhooks: true,
                isolation: Some("user"),
                uids: uids(1),
                package: Some(package),
                pacing: None,
                scale_set: None,
            },
        ]
    } else if args.compare_pacing {
        [
            Spec {
                name: "documented limits",
                webhooks: true,
                isolation: None,
                uids: uids(0),
                package: None,
                pacing: Some("documented"),
                scale_set: None,
            },
            Spec {
                name: "one per second",
                webhooks: true,
                isolation: None,
                uids: uids(1),
                package: None,
                pacing: Some("one_per_second"),
                scale_set: None,
            },
        ]
    } else {
        [
            Spec {
                name: "webhooks",
                webhooks: true,
                isolation: None,
                uids: uids(0),
                package: None,
                pacing: None,
                scale_set: None,
            },
            Spec {
                name: "polling alone",
                webhooks: false,
                isolation: None,
                uids: uids(1),
                package: None,
                pacing: None,
                scale_set: None,
            },
        ]
    };
    let [a, b] = specs;
    let mut modes = [
        start(a, &plan, &agent, &runner).await?,
        start(b, &plan, &agent, &runner).await?,
    ];
    for mode in &modes {
        eprintln!(
            "{}: ready {:.1} s after start",
            mode.name,
            mode.ready_after.as_secs_f64()
        );
    }
    eprintln!(
        "queueing {} jobs per mode, one every {:?}, {} runners per host",
        plan.jobs, plan.every, plan.host_max
    );
    let began = SystemTime::now();
    let started = Instant::now();
    let mut ids: Vec<Vec<u64>> = vec![Vec::new(); modes.len()];
    // `--every 0s`: the whole matrix at once (an interval cannot be zero).
    let mut tick = (!plan.every.is_zero()).then(|| tokio::time::interval(plan.every));
    for n in 0..plan.jobs {
        if let Some(tick) = tick.as_mut() {
            tick.tick().await;
        }
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
            for (mode, ids) in modes.iter().zip(&ids) {
                let done = ids
                    .iter()
                    .filter(|id| {
                        mode.fake
                            .job(**id)
                            .is_some_and(|j| j.status == JobStatus::Completed)
                    })
                    .count();
                let log = mode.dir.path().join("agent.log");
                let kept = mode.dir.path().with_extension("log");
                let _ = std::fs::copy(&log, &kept);
                eprintln!(
                    "{}: {done} of {} jobs completed; its log: {}",
                    mode.name,
                    ids.len(),
                    kept.display()
                );
            }
            bail!("not every job completed within 5 minutes of the last arrival");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let wall = started.elapsed();
    println!(
        "| mode | jobs | runner executed p50 | p99 | max | job started p50 | p99 | max | last job done | API requests |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (mode, ids) in modes.iter().zip(&ids) {
        let registered = registered_at(&mode.fake);
        let jobs: Vec<_> = ids.iter().filter_map(|id| mode.fake.job(*id)).collect();
        // A runner is made for a queued job but takes the oldest one it fits, which may have
        // been queued after it registered: that wait is zero.
        let mut executed: Vec<Duration> = jobs
            .iter()
            .filter_map(|j| {
                let at = registered.get(&j.runner_id?)?;
                Some(at.duration_since(j.created_at).unwrap_or_default())
            })
            .collect();
        let mut running: Vec<Duration> = jobs
            .iter()
            .filter_map(|j| j.started_at?.duration_since(j.created_at).ok())
            .collect();
        ensure!(
            executed.len() == ids.len() && running.len() == ids.len(),
            "{}: a job without its runner's registration or start",
            mode.name
        );
        let last = jobs
            .iter()
            .filter_map(|j| j.completed_at?.duration_since(began).ok())
            .max()
            .unwrap_or_default();
        let requests = mode
            .fake
            .requests()
            .iter()
            .filter(|r| !r.path.starts_with(RUNNER_PROTOCOL_PREFIX))
            .count();
        let (e50, e99, emax) = summary(&mut executed);
        let (r50, r99, rmax) = summary(&mut running);
        println!(
            "| {} | {} | {e50:.0} ms | {e99:.0} ms | {emax:.0} ms | {r50:.0} ms | {r99:.0} ms | {rmax:.0} ms | {:.1} s | {requests} |",
            mode.name,
            ids.len(),
            last.as_secs_f64()
        );
    }
    println!(
        "wall time {:.0} s; finished {}",
        wall.as_secs_f64(),
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    for mode in &mut modes {
        mode.agent.stop().await?;
    }
    Ok(())
}
