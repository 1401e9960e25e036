//! The demo itself (built with the `demo` feature only): the whole flow on this machine with no
//! GitHub account (CONTRACT §3). A simulated GitHub (`rm-fake-github`, in this process) and fake
//! runners (this very binary, copied into the runner package as `bin/Runner.Listener`, which
//! [`super::fake_runner_mode`] turns into the fake runner) play a scenario through the real
//! receiver, journal, poller and executor ([`run::serve`]): two single jobs, a matrix of three,
//! a job whose webhook is lost before the agent starts and one whose webhook is lost while it
//! runs (each recovered by polling or by GitHub's redelivery, whichever comes first), and a job
//! that is announced but never handed to a runner (its runner exits idle and is not replaced).
//!
//! It prints a timeline read from the journal and the simulated GitHub while it runs, then a
//! summary, and succeeds only if every part ended as expected. Everything lives in a temporary
//! directory, removed at the end unless `--keep` is given; nothing leaves loopback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use rm_fake_github::jit::RUNNER_PROTOCOL_PREFIX;
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions, JobStatus, RunnerBehavior};
use rm_github::{ClientConfig, GithubClient};
use rm_journal::{AttemptId, AttemptOutcome, AttemptRecord, AttemptState, Reader, StopIntent};
use rm_vocab::UnixMs;
use secrecy::{ExposeSecret as _, SecretString};

use crate::commands::run;
use crate::config::{self, Config};
use crate::exit::Exit;
use crate::lock;
use crate::polling::Pacing;

/// The simulated GitHub App's id.
/// The poller's slow cadences in the demo: seconds instead of minutes, so the webhook lost while
/// the agent runs is redelivered within the demo's half minute.
const DEMO_PACING: Pacing = Pacing {
    reconcile_interval: Duration::from_secs(5),
    scan_interval: Duration::from_secs(2),
    delivery_settle: Duration::from_secs(1),
};

const APP_ID: u64 = 4242;
/// The organization the App is installed on.
const ORG: &str = "acme";
/// The repository every job runs in.
const REPO: &str = "acme/widgets";
/// `host.name`: the runners are `rm-demo-<12 hex>`.
const HOST: &str = "demo";
/// What the `linux` policy's jobs ask for.
const LINUX_LABELS: &[&str] = &["self-hosted", "linux"];
/// What the `gpu` policy's (never handed out) job asks for.
const GPU_LABELS: &[&str] = &["self-hosted", "gpu"];
/// `runner.idle_timeout`: short, so the idle runner is stopped within the demo.
const IDLE_TIMEOUT: &str = "3s";
/// How long each fake job runs: long enough to see the runner busy.
const JOB_DURATION: Duration = Duration::from_millis(1500);
/// The fake runner's own patience for a job: longer than the agent's idle timeout, so it is the
/// agent that stops the idle runner.
const RUNNER_IDLE: Duration = Duration::from_secs(60);
/// How often the timeline looks at the journal and the simulated GitHub: often enough to see
/// most states an attempt passes through (one passed between two looks is still printed).
const WATCH_INTERVAL: Duration = Duration::from_millis(25);
/// How long an event waits before it is printed: events seen later but dated earlier (a
/// delivery is dated when received, seen when committed) still print in order.
const PRINT_LAG: Duration = Duration::from_millis(750);
/// How long the receiver may take to listen.
const RECEIVER_WAIT: Duration = Duration::from_secs(10);
/// How long after the idle runner is cleaned the demo watches for a replacement (longer than
/// the executor's pass interval, so a replacement would show).
const NO_REPLACEMENT_WATCH: Duration = Duration::from_millis(2500);
/// The demo's runner uids: beside the default pool (64200-64263), so a demo next to a running
/// agent never takes one of its runners' uids.
pub const DEMO_UIDS: &str = "64300-64331";
/// The scenario gives up after this: a hang guard, not a speed test. The scenario takes about
/// 10 s on an idle host; on a busy one it is slower, which is not a failure (its time is in
/// the summary), so only something that never ends trips this.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(120);

/// Runs the demo; `keep` leaves its temporary directory behind (and says where).
pub(super) async fn run(keep: bool) -> Result<(), Exit> {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("rm-demo-")
        .tempdir()
        .context("cannot create a temporary directory for the demo; check $TMPDIR")
        .map_err(Exit::runtime)?;
    let outcome = play(dir.path(), started).await;
    if keep {
        let path = dir.keep();
        let config = path.join("rm-agent.toml");
        crate::outln!("\nKept {}. Look around with:", path.display());
        for command in ["runners", "jobs", "deliveries"] {
            crate::outln!("  rm-agent --config {} {command}", config.display());
        }
    } else if let Err(e) = dir.close() {
        tracing::warn!(error = %e, "cannot remove the demo's temporary directory");
    }
    outcome
}

/// The jobs the scenario queues at the simulated GitHub.
#[derive(Debug, Default)]
struct Scenario {
    /// Every job that should run: id → name.
    jobs: BTreeMap<u64, String>,
    /// The jobs whose `queued` webhook was lost: one before the agent starts (found by the
    /// start-up poll), one while it runs (redelivered after the failed-delivery scan).
    lost: Vec<u64>,
}

async fn play(dir: &Path, started: Instant) -> Result<(), Exit> {
    crate::outln!(
        "rm-agent demo: the real receiver, journal and agent against a simulated GitHub and fake\n\
         runners, all on this machine. Scenario: two single jobs, a matrix of three, a job whose\n\
         webhook is lost before the agent starts and one whose webhook is lost while it runs, and a
         job that is announced but never handed to a runner.\n"
    );
    let key = AppKeyPair::generate()
        .context("cannot generate the simulated App's key")
        .map_err(Exit::runtime)?;
    let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem.clone()))
        .await
        .map_err(Exit::runtime)?;
    fake.add_org(ORG);
    fake.add_repo(REPO);
    fake.set_runner_behavior(RunnerBehavior {
        idle_timeout_ms: Some(millis(RUNNER_IDLE)),
        job_duration_ms: millis(JOB_DURATION),
        ..RunnerBehavior::default()
    });
    let secret = format!("demo-{}", AttemptId::generate());
    let addr = free_loopback_addr().map_err(Exit::runtime)?;
    let config = write_config(dir, &fake, &key, &secret, addr).map_err(Exit::runtime)?;
    let config = config::load(&config::Sources {
        explicit_file: Some(config),
        data_dir: None,
    })?;
    fake.set_webhook(
        &format!("http://{addr}/webhook"),
        SecretString::from(secret),
    );
    let mut timeline = Timeline::new(started, crate::commands::journal_path(&config));
    timeline.note(
        "github",
        &format!(
            "simulated GitHub on {}: App {APP_ID} installed on {ORG}, repository {REPO}",
            fake.server_url()
        ),
    );

    // The lost webhook: GitHub fails to deliver this job's `queued` event before the agent runs.
    let mut scenario = Scenario::default();
    fake.fail_next_deliveries(1);
    let lost = queue(&fake, &mut scenario, "nightly-report").map_err(Exit::runtime)?;
    scenario.lost.push(lost);
    fake.settle().await.map_err(Exit::runtime)?;
    timeline.tick(&fake);

    let client = GithubClient::new(ClientConfig::new(
        fake.api_url(),
        APP_ID,
        key.private_pem.clone(),
    ))
    .context("cannot set up the GitHub client")
    .map_err(Exit::runtime)?;
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve = run::serve_paced(&config, client, DEMO_PACING, async {
        let _ = stopped.await;
    });
    tokio::pin!(serve);
    let scenario_done = async {
        wait_listening(addr).await?;
        timeline.note(
            "agent",
            &format!("started: receiver on {addr}, poller, executor (policies linux and gpu)"),
        );
        play_scenario(&fake, &mut scenario, &mut timeline, started).await
    };
    let played = tokio::select! {
        served = &mut serve => {
            let problem = match served {
                Ok(_) => "the agent stopped before the scenario ended".to_owned(),
                Err(exit) => exit.message,
            };
            return Err(Exit::runtime(anyhow::anyhow!("demo failed: {problem}")));
        }
        () = crate::commands::receive::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
        played = scenario_done => played,
    };
    let _ = stop.send(());
    let report = serve.await?;
    timeline.finish(&fake);
    let elapsed = started.elapsed();
    let mut problems = match played {
        Ok(()) => Vec::new(),
        Err(e) => vec![format!("{e:#}")],
    };
    if report.left_running > 0 || report.launches_unfinished > 0 {
        problems.push(format!(
            "the agent left {} runner(s) running and {} launch(es) unfinished",
            report.left_running, report.launches_unfinished
        ));
    }
    let summary = Summary::gather(&config, &fake, &scenario, &timeline).map_err(Exit::runtime)?;
    problems.extend(summary.problems(&scenario));
    summary.print(elapsed);
    if problems.is_empty() {
        crate::outln!("\ndemo: every scenario ended as expected.");
        Ok(())
    } else {
        Err(Exit::runtime(anyhow::anyhow!(
            "demo failed: {}",
            problems.join("; ")
        )))
    }
}

/// The scenario once the agent listens: the jobs, then watching until all of it has ended.
async fn play_scenario(
    fake: &FakeGithub,
    scenario: &mut Scenario,
    timeline: &mut Timeline,
    started: Instant,
) -> anyhow::Result<()> {
    queue(fake, scenario, "build")?;
    queue(fake, scenario, "lint")?;
    timeline.watch(fake, Duration::from_millis(500)).await;
    // A webhook lost while the agent runs: GitHub's hook log shows it failed, and the agent's
    // failed-delivery scan asks GitHub to send it again.
    fake.fail_next_deliveries(1);
    let lost = queue(fake, scenario, "deploy-docs")?;
    scenario.lost.push(lost);
    timeline.watch(fake, Duration::from_millis(500)).await;
    let matrix = fake.queue_matrix(REPO, "test", LINUX_LABELS, &["ubuntu", "debian", "alpine"])?;
    for id in matrix {
        if let Some(job) = fake.job(id) {
            scenario.jobs.insert(id, job.name);
        }
    }
    timeline.watch(fake, Duration::from_millis(500)).await;
    fake.queue_vanishing_job(REPO, "gpu-benchmark", GPU_LABELS)?;
    loop {
        timeline.tick(fake);
        if timeline.scenario_over(fake, scenario) {
            return Ok(());
        }
        if started.elapsed() > SCENARIO_DEADLINE {
            anyhow::bail!(
                "the scenario did not end within {}s",
                SCENARIO_DEADLINE.as_secs()
            );
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// Queues one `linux` job and remembers it.
fn queue(fake: &FakeGithub, scenario: &mut Scenario, name: &str) -> anyhow::Result<u64> {
    let id = fake.queue_job(REPO, name, LINUX_LABELS)?;
    scenario.jobs.insert(id, name.to_owned());
    Ok(id)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A loopback address that was free a moment ago (the receiver binds it right after).
fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free loopback port for the receiver")?;
    Ok(listener.local_addr()?)
}

/// Waits until the receiver accepts connections.
async fn wait_listening(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + RECEIVER_WAIT;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            anyhow::bail!("the receiver did not listen on {addr} within {RECEIVER_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Writes a secret file readable by its owner only.
fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// The runner package (this binary as `bin/Runner.Listener`), the secrets and the agent's
/// configuration file in `dir`; returns the configuration's path.
fn write_config(
    dir: &Path,
    fake: &FakeGithub,
    key: &AppKeyPair,
    secret: &str,
    addr: SocketAddr,
) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let package = rm_fake_runner::assemble_package(&exe, &dir.join("package"))?;
    // Isolated where this user may switch users (CONTRACT §7); runners then pass through the
    // demo's directory to their runtimes, so others may search it (not list it).
    let isolation = if rm_runner::isolate::can_switch_users() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        crate::config::Isolation::User
    } else {
        crate::config::Isolation::None
    };
    // A network namespace per runner where the tools for it are here (CONTRACT §7); without
    // them the demo still runs, in the host's network, and its summary says so.
    let network = if isolation == crate::config::Isolation::User
        && rm_runner::network::missing_tools().is_empty()
    {
        crate::config::Network::Private
    } else {
        crate::config::Network::Host
    };
    let key_file = dir.join("app.pem");
    write_secret(&key_file, key.private_pem.expose_secret())?;
    let secret_file = dir.join("webhook-secret");
    write_secret(&secret_file, secret)?;
    let path = dir.join("rm-agent.toml");
    let toml = format!(
        r#"# Written by `rm-agent demo`: the agent against the simulated GitHub.
data_dir = "{data}"

[github]
api_url = "{api}"
app_id = {APP_ID}
private_key_file = "{key}"
webhook_secret_file = "{secret}"

[receiver]
listen = "{addr}"
path = "/webhook"

[host]
name = "{HOST}"
max_runners = 8
runner_root = "{root}"
isolation = "{isolation}"
runner_uids = "{DEMO_UIDS}"
network = "{network}"
# The simulated GitHub, on this host's loopback: what isolated runners reach of the host.
network_host_ports = [{port}]
# The fake runners need little room: a machine with a small /tmp still runs the demo.
min_free_space = "64MiB"
data_dir_min_free_space = "16MiB"

[runner]
package_dir = "{package}"
idle_timeout = "{IDLE_TIMEOUT}"
registration_timeout = "20s"

[[policy]]
name = "linux"
target = "{ORG}"
labels = ["self-hosted", "linux"]
max_runners = 6

[[policy]]
name = "gpu"
target = "{ORG}"
labels = ["self-hosted", "gpu"]
max_runners = 1
"#,
        data = dir.join("data").display(),
        api = fake.api_url(),
        key = key_file.display(),
        secret = secret_file.display(),
        root = dir.join("runners").display(),
        package = package.display(),
        isolation = isolation.as_str(),
        network = network.as_str(),
        port = fake.port(),
    );
    std::fs::write(&path, toml).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The timeline: what the journal and the simulated GitHub say happened, printed once each, in
/// time order per look, in seconds since the demo started.
struct Timeline {
    /// The demo's start on the wall clock (ms since the epoch), for journal timestamps.
    started_ms: i64,
    journal: PathBuf,
    reader: Option<Reader>,
    /// Keys of the events seen so far.
    printed: HashSet<String>,
    /// Seen, not printed yet.
    pending: Vec<Event>,
    /// Delivery GUID → (job id, job name), from the simulated GitHub's deliveries.
    jobs_by_guid: HashMap<String, (u64, String)>,
    /// Jobs whose webhook the simulated GitHub failed to deliver: job id → the lost GUIDs.
    lost: HashMap<u64, HashSet<String>>,
    /// When each runner took its job at the simulated GitHub (ms since the epoch).
    taken_at: HashMap<String, i64>,
    /// Lost-webhook jobs the agent learnt about anyway, and how ("polling", "redelivery").
    recovered: BTreeMap<u64, &'static str>,
}

/// A line of the timeline.
struct Event {
    key: String,
    at_ms: i64,
    who: &'static str,
    text: String,
}

impl Timeline {
    fn new(started: Instant, journal: PathBuf) -> Timeline {
        let elapsed = i64::try_from(started.elapsed().as_millis()).unwrap_or(0);
        Timeline {
            started_ms: rm_vocab::now().get() - elapsed,
            journal,
            reader: None,
            printed: HashSet::new(),
            pending: Vec::new(),
            jobs_by_guid: HashMap::new(),
            lost: HashMap::new(),
            taken_at: HashMap::new(),
            recovered: BTreeMap::new(),
        }
    }

    /// Adds a line about now.
    fn note(&mut self, who: &'static str, text: &str) {
        let key = format!("note:{text}");
        self.printed.insert(key.clone());
        self.pending.push(Event {
            key,
            at_ms: rm_vocab::now().get(),
            who,
            text: text.to_owned(),
        });
    }

    /// Looks for `period`, printing what happens.
    async fn watch(&mut self, fake: &FakeGithub, period: Duration) {
        let until = Instant::now() + period;
        while Instant::now() < until {
            self.tick(fake);
            tokio::time::sleep(WATCH_INTERVAL).await;
        }
    }

    /// One look: collects every new event and prints, in time order, those older than
    /// [`PRINT_LAG`] (a delivery is journalled a little after it was received).
    fn tick(&mut self, fake: &FakeGithub) {
        let mut events = self.github_events(fake);
        events.extend(self.journal_events());
        for e in events {
            if self.printed.insert(e.key.clone()) {
                self.pending.push(e);
            }
        }
        let lag = i64::try_from(PRINT_LAG.as_millis()).unwrap_or(0);
        self.print_until(rm_vocab::now().get() - lag);
    }

    /// Prints every pending event up to `until_ms` (ms since the epoch), oldest first.
    fn print_until(&mut self, until_ms: i64) {
        self.pending.sort_by_key(|e| e.at_ms);
        let due = self.pending.partition_point(|e| e.at_ms <= until_ms);
        for e in self.pending.drain(..due) {
            let at = (e.at_ms - self.started_ms).max(0) as f64 / 1000.0;
            crate::outln!("{at:>6.1}s  {:<8}  {}", e.who, e.text);
        }
    }

    /// A last look, printing everything.
    fn finish(&mut self, fake: &FakeGithub) {
        self.tick(fake);
        self.print_until(i64::MAX);
    }

    /// Lost deliveries, jobs taken and jobs completed, as the simulated GitHub saw them.
    fn github_events(&mut self, fake: &FakeGithub) -> Vec<Event> {
        let mut events = Vec::new();
        for d in fake.deliveries() {
            let job = serde_json::from_slice::<serde_json::Value>(&d.body)
                .ok()
                .and_then(|v| {
                    let job = v.get("workflow_job")?;
                    Some((
                        job.get("id")?.as_u64()?,
                        job.get("name")?.as_str()?.to_owned(),
                    ))
                });
            if let Some(job) = &job {
                self.jobs_by_guid.insert(d.guid.clone(), job.clone());
            }
            if let (true, Some((id, name))) = (lost(&d), job) {
                self.lost.entry(id).or_default().insert(d.guid.clone());
                events.push(Event {
                    key: format!("lost:{}", d.id),
                    at_ms: system_ms(d.delivered_at),
                    who: "github",
                    text: format!(
                        "{} {}; its webhook is lost ({})",
                        job_label(id, &name),
                        d.action.as_deref().unwrap_or("changed"),
                        d.status
                    ),
                });
            }
        }
        for job in fake.jobs() {
            let label = job_label(job.id, &job.name);
            let runner = job.runner_name.clone().unwrap_or_default();
            if let Some(at) = job.started_at {
                self.taken_at.insert(runner.clone(), system_ms(at));
                events.push(Event {
                    key: format!("taken:{}", job.id),
                    at_ms: system_ms(at),
                    who: "runner",
                    text: format!("{runner} busy: took {label}"),
                });
            }
            if let (JobStatus::Completed, Some(at)) = (job.status, job.completed_at) {
                events.push(Event {
                    key: format!("done:{}", job.id),
                    at_ms: system_ms(at),
                    who: "github",
                    text: format!(
                        "{label} completed: {} (by {runner})",
                        job.conclusion.as_deref().unwrap_or("?")
                    ),
                });
            }
        }
        events
    }

    /// Deliveries journalled, jobs found by polling, and each runner attempt's life.
    fn journal_events(&mut self) -> Vec<Event> {
        if self.reader.is_none() && self.journal.exists() {
            self.reader = Reader::open(&self.journal).ok();
        }
        let Some(reader) = &self.reader else {
            return Vec::new();
        };
        let deliveries = reader.deliveries(10_000).unwrap_or_default();
        let jobs = reader.jobs(10_000).unwrap_or_default();
        let attempts = reader.attempts(10_000).unwrap_or_default();
        let mut events = Vec::new();
        // Per job: when its first webhook was journalled, and whether a lost GUID came back.
        let mut first_webhook: HashMap<u64, i64> = HashMap::new();
        let mut redelivered: HashMap<u64, i64> = HashMap::new();
        for d in &deliveries {
            let job = self.jobs_by_guid.get(&d.guid);
            if let Some((id, _)) = job {
                let received = d.received_at_ms.get();
                let first = first_webhook.entry(*id).or_insert(received);
                *first = (*first).min(received);
                if self.lost.get(id).is_some_and(|g| g.contains(&d.guid)) {
                    redelivered.insert(*id, received);
                }
            }
            let what = match (&d.action, job) {
                (Some(action), Some((id, name))) => {
                    format!("{}.{action} for {}", d.event, job_label(*id, name))
                }
                (Some(action), None) => format!("{}.{action}", d.event),
                (None, _) => d.event.clone(),
            };
            let mut text = format!("webhook {what}");
            if d.outcome.as_str() != "applied" {
                text.push_str(&format!(" ({})", d.outcome.as_str()));
            }
            events.push(Event {
                key: format!("delivery:{}", d.guid),
                at_ms: d.received_at_ms.get(),
                who: "receiver",
                text,
            });
        }
        // A lost-webhook job the journal holds: GitHub redelivered the lost GUID, or the
        // agent knew the job before any webhook about it arrived, so polling found it.
        for job in jobs {
            let Ok(id) = u64::try_from(job.job_id) else {
                continue;
            };
            if !self.lost.contains_key(&id) || self.recovered.contains_key(&id) {
                continue;
            }
            let (how, at_ms) = match (redelivered.get(&id), first_webhook.get(&id)) {
                (Some(at), _) => ("redelivery", *at),
                (None, Some(webhook)) if *webhook <= job.first_seen_at_ms.get() => continue,
                (None, _) => ("polling", job.first_seen_at_ms.get()),
            };
            self.recovered.insert(id, how);
            let found = if how == "polling" {
                "found by polling GitHub"
            } else {
                "redelivered by GitHub"
            };
            events.push(Event {
                key: format!("recovered:{id}"),
                at_ms,
                who: "poller",
                text: format!(
                    "{} {found}: the lost webhook is recovered",
                    job_label(id, job.job_name.as_deref().unwrap_or("?"))
                ),
            });
        }
        for a in &attempts {
            events.extend(self.attempt_events(a));
        }
        events
    }

    /// An attempt's milestones. A milestone passed between two looks is printed when the next
    /// state is seen: a start just before the runner took its job (or reached its state), a
    /// conclusion at the time of the cleanup that followed it.
    fn attempt_events(&self, a: &AttemptRecord) -> Vec<Event> {
        use AttemptState::*;
        let name = &a.runner_name;
        let event = |milestone: &str, at_ms: i64, text: String| Event {
            key: format!("{milestone}:{name}"),
            at_ms,
            who: "agent",
            text,
        };
        let mut events = vec![event(
            "allocated",
            a.created_at_ms.get(),
            format!("{name} allocated for policy {}", a.policy),
        )];
        let now = a.state_changed_at_ms.get();
        if let Some(pid) = a.pid
            && matches!(
                a.state,
                Starting | Idle | Busy | Finished | Failed | Orphaned | Cleaned
            )
        {
            let at = self
                .taken_at
                .get(name)
                .map_or(now, |taken| now.min(*taken - 1));
            events.push(event("started", at, format!("{name} started (pid {pid})")));
        }
        if a.state == Idle {
            events.push(event(
                "idle",
                now,
                format!("{name} registered, waiting for a job"),
            ));
        }
        let idle_stop = match (
            a.stop_intent,
            a.stop_intent_at_ms.map(UnixMs::get),
            a.outcome,
        ) {
            (Some(StopIntent::IdleTimeout), Some(at_ms), _) => Some(at_ms),
            // A runner slow to exit has its stop escalated, and the journal then names the
            // escalation instead; the demo's runners never give up by themselves (they wait
            // [`RUNNER_IDLE`]), so an idle exit is the agent's stop all the same.
            (_, _, Some(AttemptOutcome::IdleExit)) => Some(now),
            _ => None,
        };
        if let Some(at_ms) = idle_stop {
            events.push(event(
                "stopping",
                at_ms,
                format!(
                    "{name} got no job within runner.idle_timeout ({IDLE_TIMEOUT}): stopping it"
                ),
            ));
        }
        if let Some(outcome) = a.outcome {
            let reason = a
                .reason
                .as_deref()
                .map_or(String::new(), |r| format!(" ({r})"));
            events.push(event(
                "concluded",
                now,
                format!("{name} concluded: {}{reason}", outcome.as_str()),
            ));
        }
        if a.state == Cleaned {
            events.push(event(
                "cleaned",
                now,
                format!("{name} cleaned: deregistered, runtime removed"),
            ));
        }
        events
    }

    /// Whether everything has ended: every job completed, every attempt cleaned, the idle
    /// runner cleaned long enough ago that a replacement would have shown.
    fn scenario_over(&self, fake: &FakeGithub, scenario: &Scenario) -> bool {
        let jobs_done = scenario.jobs.keys().all(|id| {
            fake.job(*id)
                .is_some_and(|j| j.status == JobStatus::Completed)
        });
        let Some(reader) = &self.reader else {
            return false;
        };
        let attempts = reader.attempts(10_000).unwrap_or_default();
        let all_cleaned =
            !attempts.is_empty() && attempts.iter().all(|a| a.state == AttemptState::Cleaned);
        let idle_settled = attempts.iter().filter(|a| a.policy == "gpu").any(|a| {
            a.state == AttemptState::Cleaned
                && rm_vocab::now().get() - a.state_changed_at_ms.get()
                    >= i64::try_from(NO_REPLACEMENT_WATCH.as_millis()).unwrap_or(0)
        });
        jobs_done && all_cleaned && idle_settled
    }
}

/// Whether a delivery attempt at the simulated GitHub failed (the receiver never got it).
fn lost(d: &rm_fake_github::Delivery) -> bool {
    d.status != "OK" && d.status != "pending"
}

fn job_label(id: u64, name: &str) -> String {
    format!("job {id} \"{name}\"")
}

fn system_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What the demo found at the end.
struct Summary {
    isolation: crate::config::Isolation,
    network: crate::config::Network,
    /// The runner uids the attempts held.
    uids: std::collections::BTreeSet<u32>,
    attempts: Vec<AttemptRecord>,
    /// Job id → (completed with success, runner name) at the simulated GitHub.
    jobs: BTreeMap<u64, (bool, Option<String>)>,
    webhooks_journalled: usize,
    webhooks_lost: usize,
    recovered: BTreeMap<u64, &'static str>,
    api_requests: usize,
    runtimes_left: Vec<PathBuf>,
    registrations_left: Vec<String>,
}

impl Summary {
    fn gather(
        config: &Config,
        fake: &FakeGithub,
        scenario: &Scenario,
        timeline: &Timeline,
    ) -> anyhow::Result<Summary> {
        let reader = Reader::open(&crate::commands::journal_path(config))?;
        let attempts = reader.attempts(10_000)?;
        let jobs = scenario
            .jobs
            .keys()
            .map(|id| {
                let job = fake.job(*id);
                let ok = job.as_ref().is_some_and(|j| {
                    j.status == JobStatus::Completed && j.conclusion.as_deref() == Some("success")
                });
                (*id, (ok, job.and_then(|j| j.runner_name)))
            })
            .collect();
        let deliveries = fake.deliveries();
        let prefix = format!("rm-{HOST}-");
        // The agent's package store is the agent's, not something a runner left.
        let runtimes_left = match std::fs::read_dir(&config.host.runner_root) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name() != Some(std::ffi::OsStr::new(rm_runner::store::STORE_DIR))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        Ok(Summary {
            isolation: config.host.isolation,
            network: config.host.network,
            uids: attempts.iter().filter_map(|a| a.uid).collect(),
            attempts,
            jobs,
            webhooks_journalled: reader.deliveries(10_000)?.len(),
            webhooks_lost: deliveries.iter().filter(|d| lost(d)).count(),
            recovered: timeline.recovered.clone(),
            api_requests: fake
                .requests()
                .iter()
                .filter(|r| !r.path.starts_with(RUNNER_PROTOCOL_PREFIX))
                .count(),
            runtimes_left,
            registrations_left: fake
                .runners()
                .into_iter()
                .map(|r| r.name)
                .filter(|n| n.starts_with(&prefix))
                .collect(),
        })
    }

    fn with_outcome(&self, outcome: AttemptOutcome) -> usize {
        self.attempts
            .iter()
            .filter(|a| a.outcome == Some(outcome))
            .count()
    }

    /// Everything that did not end as the scenario expects.
    fn problems(&self, scenario: &Scenario) -> Vec<String> {
        let mut problems = Vec::new();
        let by_name: HashMap<&str, &AttemptRecord> = self
            .attempts
            .iter()
            .map(|a| (a.runner_name.as_str(), a))
            .collect();
        let mut runners_used: HashMap<&str, u64> = HashMap::new();
        for (id, (ok, runner)) in &self.jobs {
            let name = scenario.jobs.get(id).map_or("?", String::as_str);
            let Some(runner) = runner.as_deref().filter(|_| *ok) else {
                problems.push(format!("job {id} \"{name}\" did not complete successfully"));
                continue;
            };
            match by_name.get(runner) {
                Some(a) if a.outcome == Some(AttemptOutcome::CompletedJob) => {}
                Some(a) => problems.push(format!(
                    "{runner} ran job {id} but ended {}",
                    a.outcome.map_or("unconcluded", AttemptOutcome::as_str)
                )),
                None => problems.push(format!("job {id} ran on {runner}, not one of ours")),
            }
            if let Some(other) = runners_used.insert(runner, *id) {
                problems.push(format!("{runner} ran two jobs ({other} and {id})"));
            }
        }
        let gpu: Vec<&AttemptRecord> = self.attempts.iter().filter(|a| a.policy == "gpu").collect();
        match gpu.as_slice() {
            [a] if a.outcome == Some(AttemptOutcome::IdleExit) => {}
            [a] => problems.push(format!(
                "the runner for the vanishing job ended {}, not idle_exit",
                a.outcome.map_or("unconcluded", AttemptOutcome::as_str)
            )),
            [] => problems.push("no runner was started for the vanishing job".to_owned()),
            many => problems.push(format!(
                "the idle runner was replaced: {} runners for the vanishing job",
                many.len()
            )),
        }
        for a in &self.attempts {
            if a.state != AttemptState::Cleaned {
                problems.push(format!(
                    "{} is {}, not cleaned",
                    a.runner_name,
                    a.state.as_str()
                ));
            }
            if a.outcome.is_some_and(AttemptOutcome::is_failure) {
                problems.push(format!(
                    "{} failed ({})",
                    a.runner_name,
                    a.reason.as_deref().unwrap_or("no reason")
                ));
            }
        }
        for lost in &scenario.lost {
            if !self.recovered.contains_key(lost) {
                problems.push(format!(
                    "job {lost} (lost webhook) was not seen arriving by polling or redelivery"
                ));
            }
        }
        if self.webhooks_lost == 0 {
            problems.push("no webhook was lost, so nothing was recovered".to_owned());
        }
        if !self.runtimes_left.is_empty() {
            problems.push(format!(
                "the runner root still holds {}",
                self.runtimes_left
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !self.registrations_left.is_empty() {
            problems.push(format!(
                "runners still registered at GitHub: {}",
                self.registrations_left.join(", ")
            ));
        }
        problems
    }

    fn print(&self, elapsed: Duration) {
        let served = self.jobs.values().filter(|(ok, _)| *ok).count();
        let idle = self.with_outcome(AttemptOutcome::IdleExit);
        let replaced = self
            .attempts
            .iter()
            .filter(|a| a.policy == "gpu")
            .count()
            .saturating_sub(1);
        let left = if self.runtimes_left.is_empty() && self.registrations_left.is_empty() {
            "nothing (runner root empty, no registration at GitHub)".to_owned()
        } else {
            format!(
                "{} runtime(s), {} registration(s)",
                self.runtimes_left.len(),
                self.registrations_left.len()
            )
        };
        crate::outln!("\nSummary");
        let line = |what: &str, value: String| crate::outln!("  {what:<18}{value}");
        line(
            "jobs served",
            format!(
                "{served} of {}, each by exactly one runner",
                self.jobs.len()
            ),
        );
        line(
            "runners started",
            format!(
                "{} ({} ran a job, {} exited idle)",
                self.attempts.len(),
                self.with_outcome(AttemptOutcome::CompletedJob),
                idle
            ),
        );
        line("idle exits", format!("{idle}, replaced: {replaced}"));
        line(
            "webhooks",
            format!(
                "{} journalled, {} lost, {} job(s) recovered",
                self.webhooks_journalled,
                self.webhooks_lost,
                self.recovered.len()
            ),
        );
        line(
            "API requests",
            format!("{} (counted by the simulated GitHub)", self.api_requests),
        );
        line("left behind", left);
        line(
            "isolation",
            match self.isolation {
                crate::config::Isolation::User => format!(
                    "user: each runner had its own uid ({} distinct), cgroup, private /tmp and /proc, and {}",
                    self.uids.len(),
                    match self.network {
                        crate::config::Network::Private => "network namespace (the simulated GitHub its one host port)",
                        crate::config::Network::Host => "the host's network (install iproute2 and nftables for a namespace each)",
                    }
                ),
                crate::config::Isolation::None => "NONE: this user may not switch users, so the runners ran as it, unisolated (run the demo as root to see isolation)".to_owned(),
            },
        );
        line("time taken", format!("{:.1}s", elapsed.as_secs_f64()));
    }
}
