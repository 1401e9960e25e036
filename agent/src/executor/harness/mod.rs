//! The executor's in-process harness (test code only, in the spirit of bors's `BorsTester`):
//! the real [`Executor`] and the real poller, on a real journal file, against the in-process
//! fake GitHub (`rm-fake-github`), with two fakes behind the executor's [`Seams`]:
//! - a **manual clock** ([`ManualClock`]) the executor, the poller and the GitHub client read,
//!   moved by the test together with the fake's own clock;
//! - a **backend** ([`FakeBackend`]), the executor's one process seam: its process table
//!   ([`FakeProcesses`]: pids, start times, signals, exits, no real process) is what the
//!   executor looks at and signals runners in, and its `start` puts a process in that table and
//!   runs it as a runner against the fake (JIT configuration in, register, take a queued job,
//!   complete it when its job's duration has passed on the manual clock), so GitHub's side is
//!   the fake's own.
//!
//! Runtimes are real directories (the `none` backend's `prepare` and `clean`), so cleanup is
//! checked on disk. A test drives passes with [`Harness::step`] (one clock tick, one poll, one
//! executor pass) until what it expects holds ([`Harness::until`]); minutes of a runner's life
//! take a few hundred milliseconds. See docs/development.md, "The executor harness".

mod ceiling_tests;
mod log_tests;
mod rerun_tests;
mod shape_tests;
mod tests;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use rm_fake_github::jit::FakeJitConfig;
use rm_fake_github::runner_client::RunnerSession;
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use rm_github::{ClientConfig, GithubClient, Target};
use rm_journal::{
    AttemptRecord, Attempts, IsolationKind, JOURNAL_FILE, Journal, PollJournal, Retention, Scope,
};
use rm_vocab::{Clock as _, ManualClock};
use secrecy::{ExposeSecret as _, SecretString};

use super::registry::Registry;
use super::seams::{Execution, Seams};
use super::{Backends, Executor, Settings};
use crate::config::{Policy, RunnerLimits, Workspace};
use crate::lifecycle::Timeouts;
use crate::polling::{Poller, PollerConfig};
use rm_runner::backend::{Backend, BackendError, Cleaned, NoIsolation, Plan};
use rm_runner::package::current::CurrentPackage;
use rm_runner::process::{
    self, ProcStat, ProcessError, ProcessIdentity, Reap, RunnerChild, Spawned, StopSignal,
};
use rm_runner::{RunnerRoot, Runtime};

const APP_ID: u64 = 4711;
/// The repository every harness policy serves.
pub(super) const REPO: &str = "acme/widgets";
/// The host name: runners are `rm-h-<12 hex>`.
pub(super) const HOST: &str = "h";
/// How far the manual clock moves per [`Harness::step`].
pub(super) const TICK: Duration = Duration::from_secs(1);
/// The timers of a harness executor unless a test sets its own.
pub(super) const TIMEOUT: Duration = Duration::from_secs(20);
/// The most steps [`Harness::until`] takes before it fails the test (at a second of manual
/// time each: far beyond any timer a test sets).
const MAX_STEPS: usize = 1_000;
/// The real time a fake runner waits between two looks at the fake or its table.
const RUNNER_POLL: Duration = Duration::from_millis(5);
/// The longest a held `start` waits (real time): a failing test still ends.
const HOLD_LIMIT: Duration = Duration::from_secs(30);
/// The real time between two steps, so launch tasks and fake runners get the runtime.
const STEP_PAUSE: Duration = Duration::from_millis(5);

fn key() -> &'static AppKeyPair {
    static KEY: OnceLock<AppKeyPair> = OnceLock::new();
    KEY.get_or_init(|| AppKeyPair::generate().expect("an App key"))
}

/// The most Apps beside the primary a harness test configures ([`Options::more_apps`]).
const MORE_APPS_MAX: usize = 3;

/// The keys of the Apps beside the primary, made once per test binary (only when a test asks).
fn more_keys() -> &'static [AppKeyPair; MORE_APPS_MAX] {
    static KEYS: OnceLock<[AppKeyPair; MORE_APPS_MAX]> = OnceLock::new();
    KEYS.get_or_init(|| std::array::from_fn(|_| AppKeyPair::generate().expect("an App key")))
}

/// A harness policy on [`REPO`] with `labels`.
pub(super) fn policy(name: &str, labels: &[&str], max_runners: u32) -> Policy {
    policy_on(REPO, name, labels, max_runners)
}

/// A harness policy on `target` (`acme` or [`REPO`]) with `labels`.
pub(super) fn policy_on(target: &str, name: &str, labels: &[&str], max_runners: u32) -> Policy {
    Policy {
        name: name.to_owned(),
        target: target.parse().expect("a target"),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        runner_group_id: 1,
        max_runners,
        min_runners: 0,
        fleet_max_runners: None,
        workspace: Workspace::Ephemeral,
        docker: None,
        limits: RunnerLimits::default(),
        memory_required: None,
        disk_max: None,
        disk_required: None,
        shapes: Default::default(),
        env_file: None,
        network_allow: None,
        egress: None,
        cache: false,
        image: None,
        scale_set: None,
    }
}

/// What a harness executor is configured with.
pub(super) struct Options {
    pub max_runners: u32,
    pub policies: Vec<Policy>,
    pub timeouts: Timeouts,
    /// A fleet host rather than a lone one, with these fleet-wide `max_runners` by policy: it
    /// claims jobs in the journal file's fleet tables (`LocalFleet`, the same rules as
    /// PostgreSQL's) before it starts runners for them.
    pub fleet: Option<HashMap<String, u32>>,
    /// A fleet host's shared registration windows (`None`: the default pacing's).
    pub registrations: Option<Vec<rm_journal::SpendWindow>>,
    /// Apps beside the primary (at most [`MORE_APPS_MAX`]), by id, and whether each is
    /// installed on `acme`: JIT registrations are spread over their installations.
    pub more_apps: Vec<(u64, bool)>,
    /// Each policy's re-run rule (`policy.rerun_on`), by policy name.
    pub reruns: std::collections::BTreeMap<String, crate::config::rerun::RerunPolicy>,
    /// `[host] capacity` (issue 42); the default: unbounded.
    pub capacity: crate::config::HostCapacity,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_runners: 4,
            policies: vec![policy("linux", &["self-hosted"], 10)],
            timeouts: Timeouts::supervision(TIMEOUT, TIMEOUT),
            fleet: None,
            registrations: None,
            more_apps: Vec::new(),
            reruns: Default::default(),
            capacity: Default::default(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The process table.

/// One fake process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Running,
    /// Exited with this status, not yet reaped: a zombie.
    Exited(i32),
    /// Reaped: the pid names nothing.
    Reaped,
}

#[derive(Debug)]
struct Entry {
    start_time: u64,
    life: Life,
    /// Signals its group received.
    signals: Vec<StopSignal>,
}

#[derive(Debug, Default)]
struct Table {
    next_pid: u32,
    processes: HashMap<u32, Entry>,
}

/// A process table: what `/proc` and `kill(2)` are to the production adapter. A signal ends
/// the process at once (a runner that honours SIGTERM).
#[derive(Debug, Clone, Default)]
pub(super) struct FakeProcesses {
    table: Arc<Mutex<Table>>,
}

impl FakeProcesses {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new running process.
    fn start(&self) -> ProcessIdentity {
        let mut table = self.lock();
        table.next_pid += 1;
        let pid = 10_000 + table.next_pid;
        let start_time = u64::from(table.next_pid) * 100;
        table.processes.insert(
            pid,
            Entry {
                start_time,
                life: Life::Running,
                signals: Vec::new(),
            },
        );
        ProcessIdentity { pid, start_time }
    }

    fn running(&self, pid: u32) -> bool {
        self.lock()
            .processes
            .get(&pid)
            .is_some_and(|e| e.life == Life::Running)
    }

    /// The process exits by itself with `code` (its job done, or a crash).
    pub(super) fn exit(&self, pid: u32, code: i32) {
        if let Some(entry) = self.lock().processes.get_mut(&pid)
            && entry.life == Life::Running
        {
            entry.life = Life::Exited(code);
        }
    }

    /// The signals process `pid`'s group received.
    pub(super) fn signals(&self, pid: u32) -> Vec<StopSignal> {
        self.lock()
            .processes
            .get(&pid)
            .map(|e| e.signals.clone())
            .unwrap_or_default()
    }

    /// The pids of processes still running.
    pub(super) fn alive(&self) -> Vec<u32> {
        let mut alive: Vec<u32> = self
            .lock()
            .processes
            .iter()
            .filter(|(_, e)| e.life == Life::Running)
            .map(|(pid, _)| *pid)
            .collect();
        alive.sort_unstable();
        alive
    }

    fn stat_of(pid: u32, entry: &Entry) -> Option<ProcStat> {
        let state = match entry.life {
            Life::Running => 'S',
            Life::Exited(_) => 'Z',
            Life::Reaped => return None,
        };
        Some(ProcStat {
            pid,
            state,
            pgrp: pid,
            start_time: entry.start_time,
        })
    }
}

/// What [`FakeBackend`]'s process table answers (its `Backend::stat`, `group`,
/// `signal_group`): a signal ends a process.
impl FakeProcesses {
    fn stat(&self, pid: u32) -> std::io::Result<Option<ProcStat>> {
        Ok(self
            .lock()
            .processes
            .get(&pid)
            .and_then(|e| Self::stat_of(pid, e)))
    }

    fn group(&self, pgid: u32) -> std::io::Result<Vec<ProcStat>> {
        self.stat(pgid).map(|s| s.into_iter().collect())
    }

    fn signal_group(&self, pgid: u32, signal: StopSignal) -> std::io::Result<()> {
        if let Some(entry) = self.lock().processes.get_mut(&pgid) {
            entry.signals.push(signal);
            if entry.life == Life::Running {
                entry.life = Life::Exited(128 + 15);
            }
        }
        Ok(())
    }
}

/// The launch task's handle on a fake process: reaps it once it exited.
#[derive(Debug)]
struct FakeChild {
    table: FakeProcesses,
    pid: u32,
}

impl Reap for FakeChild {
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let mut table = self.table.lock();
        let Some(entry) = table.processes.get_mut(&self.pid) else {
            return Err(std::io::Error::other("no such child"));
        };
        match entry.life {
            Life::Running => Ok(None),
            Life::Exited(code) => {
                entry.life = Life::Reaped;
                Ok(Some(ExitStatus::from_raw(code << 8)))
            }
            Life::Reaped => Err(std::io::Error::other("already reaped")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The backend and its runners.

/// What a fake runner process does once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Program {
    /// A runner: registers with the fake, takes the first job the fake assigns it, completes it
    /// once its duration (the fake's `RunnerBehavior::job_duration_ms`) has passed on the
    /// manual clock, and exits; without a job it waits until stopped.
    Runner,
    /// Never connects to GitHub (a broken package): runs until stopped.
    Silent,
}

/// The `none` backend's runtimes with fake processes in them.
pub(super) struct FakeBackend {
    runtimes: NoIsolation,
    table: FakeProcesses,
    clock: ManualClock,
    program: Mutex<Program>,
    /// `start` fails while set (a package that cannot be started).
    refuse_start: Mutex<bool>,
    /// `start` waits while set (an agent that dies between two steps of a launch never gets
    /// past it), at most [`HOLD_LIMIT`].
    hold_start: (Mutex<bool>, Condvar),
    /// `clean` waits while set (a runtime whose removal takes as long as the test likes: a
    /// checkout of a few hundred thousand files), at most [`HOLD_LIMIT`].
    hold_clean: (Mutex<bool>, Condvar),
    /// How many `clean`s are waiting on [`FakeBackend::hold_clean`] now.
    cleans_held: Mutex<usize>,
    /// The pid of each runner by name.
    pids: Mutex<HashMap<String, u32>>,
    /// The JIT configuration each runner was started with, by runner name (the kept-logs
    /// tests look for it in what cleanup keeps).
    pub(super) jits: Mutex<HashMap<String, String>>,
}

impl FakeBackend {
    pub(super) fn set_program(&self, program: Program) {
        *self.program.lock().unwrap_or_else(PoisonError::into_inner) = program;
    }

    pub(super) fn refuse_start(&self, refuse: bool) {
        *self
            .refuse_start
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = refuse;
    }

    /// Holds (`true`) or lets go of (`false`) every `start`.
    pub(super) fn hold_start(&self, hold: bool) {
        let (held, changed) = &self.hold_start;
        *held.lock().unwrap_or_else(PoisonError::into_inner) = hold;
        changed.notify_all();
    }

    /// Holds (`true`) or lets go of (`false`) every `clean`.
    pub(super) fn hold_clean(&self, hold: bool) {
        let (held, changed) = &self.hold_clean;
        *held.lock().unwrap_or_else(PoisonError::into_inner) = hold;
        changed.notify_all();
    }

    /// How many cleanups are held in the middle of their removal now.
    pub(super) fn cleans_held(&self) -> usize {
        *self
            .cleans_held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The pid runner `name` was started as.
    pub(super) fn pid_of(&self, name: &str) -> Option<u32> {
        self.pids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .copied()
    }
}

impl Backend for FakeBackend {
    fn kind(&self) -> IsolationKind {
        IsolationKind::None
    }

    fn prepare(&self, plan: &Plan) -> Result<Runtime, BackendError> {
        self.runtimes.prepare(plan)
    }

    fn start(
        &self,
        _plan: &Plan,
        runtime: &Runtime,
        jit: &SecretString,
    ) -> Result<Spawned<RunnerChild>, BackendError> {
        {
            let (held, changed) = &self.hold_start;
            let guard = held.lock().unwrap_or_else(PoisonError::into_inner);
            let _released = changed
                .wait_timeout_while(guard, HOLD_LIMIT, |held| *held)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if *self
            .refuse_start
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return Err(BackendError::Process(ProcessError::Spawn {
                listener: PathBuf::from(process::LISTENER),
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            }));
        }
        let config = FakeJitConfig::decode(jit.expose_secret()).map_err(|e| {
            BackendError::Process(ProcessError::Spawn {
                listener: PathBuf::from(process::LISTENER),
                source: std::io::Error::other(e.to_string()),
            })
        })?;
        let identity = self.table.start();
        self.pids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(config.runner_name.clone(), identity.pid);
        self.jits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(config.runner_name.clone(), jit.expose_secret().to_owned());
        let program = *self.program.lock().unwrap_or_else(PoisonError::into_inner);
        let (table, clock) = (self.table.clone(), self.clock.clone());
        // Called off the runtime (`spawn_blocking`), whose handle it still has.
        let diag = runtime.dir().join(super::evidence::DIAG_DIR);
        tokio::runtime::Handle::current().spawn(run_program(
            program,
            config,
            identity.pid,
            (table.clone(), clock, diag),
        ));
        Ok(Spawned {
            identity,
            child: RunnerChild::new(FakeChild {
                table,
                pid: identity.pid,
            }),
        })
    }

    fn stat(&self, pid: u32) -> std::io::Result<Option<ProcStat>> {
        self.table.stat(pid)
    }

    fn group(&self, pgid: u32) -> std::io::Result<Vec<ProcStat>> {
        self.table.group(pgid)
    }

    fn signal_group(&self, pgid: u32, signal: StopSignal) -> std::io::Result<()> {
        self.table.signal_group(pgid, signal)
    }

    fn clean(&self, plan: &Plan) -> Result<Cleaned, BackendError> {
        let (held, changed) = &self.hold_clean;
        let guard = held.lock().unwrap_or_else(PoisonError::into_inner);
        if *guard {
            *self
                .cleans_held
                .lock()
                .unwrap_or_else(PoisonError::into_inner) += 1;
            let _released = changed
                .wait_timeout_while(guard, HOLD_LIMIT, |held| *held)
                .unwrap_or_else(PoisonError::into_inner);
            *self
                .cleans_held
                .lock()
                .unwrap_or_else(PoisonError::into_inner) -= 1;
        } else {
            drop(guard);
        }
        self.runtimes.clean(plan)
    }
}

/// The life of one fake runner process; it ends when the process is signalled. Like the real
/// runner (and `tests/fake-runner`), it leaves its evidence in `_diag`: `Runner_*.log` from the
/// listener, `Worker_*.log` once it was handed a job.
async fn run_program(
    program: Program,
    config: FakeJitConfig,
    pid: u32,
    (table, clock, diag): (FakeProcesses, ManualClock, PathBuf),
) {
    let alive = || table.running(pid);
    if program == Program::Silent {
        while alive() {
            tokio::time::sleep(RUNNER_POLL).await;
        }
        return;
    }
    // A careless runner that prints the JIT configuration it got (the kept-logs tests look
    // for it, and must not find it, in what cleanup keeps).
    let said = format!(
        "fake runner {}\nJIT {}\n",
        config.runner_name,
        config.encode()
    );
    let log = |name: &str| {
        let _ = std::fs::create_dir_all(&diag);
        let _ = std::fs::write(diag.join(format!("{name}_{pid}.log")), &said);
    };
    log("Runner");
    let session = RunnerSession::new(config);
    let Ok(behavior) = session.register().await else {
        table.exit(pid, 1);
        return;
    };
    while alive() {
        match session.acquire().await {
            Ok(Some(job)) => {
                log("Worker");
                let done_at = clock.now() + Duration::from_millis(behavior.job_duration_ms);
                while clock.now() < done_at {
                    if !alive() {
                        return;
                    }
                    tokio::time::sleep(RUNNER_POLL).await;
                }
                let code = match session.complete(job.job_id, &behavior.conclusion).await {
                    Ok(()) => 0,
                    Err(_) => 1,
                };
                table.exit(pid, code);
                return;
            }
            Ok(None) => tokio::time::sleep(RUNNER_POLL).await,
            Err(_) => {
                table.exit(pid, 1);
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.

/// An executor and a poller on one journal, against one fake GitHub.
pub(super) struct Harness {
    pub fake: FakeGithub,
    /// The App's installation on `acme`.
    pub installation: u64,
    /// The installations on `acme` of the Apps of [`Options::more_apps`] that are installed.
    pub more_installations: Vec<u64>,
    pub clock: ManualClock,
    pub processes: FakeProcesses,
    pub backend: Arc<FakeBackend>,
    pub executor: Executor,
    poller: Poller,
    client: GithubClient,
    options: Options,
    journal_path: PathBuf,
    root_path: PathBuf,
    package: PathBuf,
    journal: Journal,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub(super) async fn new(options: Options) -> Harness {
        let fake = FakeGithub::start(FakeOptions::new(APP_ID, key().public_pem.clone()))
            .await
            .expect("the fake GitHub");
        let installation = fake.add_org("acme");
        fake.add_repo(REPO);
        let mut more_apps = Vec::new();
        let mut more_installations = Vec::new();
        for ((app_id, installed), key) in options.more_apps.iter().zip(more_keys()) {
            fake.add_app(*app_id, key.public_pem.clone());
            if *installed {
                more_installations.push(fake.install_app(*app_id, "acme"));
            }
            more_apps.push(rm_github::AppKey {
                app_id: *app_id,
                private_key_pem: key.private_pem.clone(),
            });
        }
        // Everything on the manual clock (it starts at the real time): the executor, the
        // poller, the client (tokens, JWTs, pacing) and, moved with it, the fake's.
        let clock = ManualClock::new();
        let client = GithubClient::with_clock(
            ClientConfig {
                more_apps,
                ..ClientConfig::new(fake.api_url(), APP_ID, key().private_pem.clone())
            },
            Arc::new(clock.clone()),
        )
        .expect("a client");
        let dir = tempfile::tempdir().expect("a directory");
        let journal_path = dir.path().join(JOURNAL_FILE);
        let journal = Journal::open(&journal_path, Retention::default()).expect("a journal");
        let root_path = dir.path().join("runners");
        std::fs::create_dir_all(&root_path).expect("the runner root");
        let package = dir.path().join("package");
        std::fs::create_dir_all(package.join("bin")).expect("a package");
        std::fs::write(package.join(process::LISTENER), "fake\n").expect("a listener");
        let processes = FakeProcesses::default();
        let (backend, executor) = Self::open_executor(
            &options,
            &client,
            &clock,
            &processes,
            &journal_path,
            &root_path,
            &package,
        );
        let poller = Self::open_poller(&options, &client, &clock, &journal_path);
        Harness {
            fake,
            installation,
            more_installations,
            clock,
            processes,
            backend,
            executor,
            poller,
            client,
            options,
            journal_path,
            root_path,
            package,
            journal,
            _dir: dir,
        }
    }

    fn open_executor(
        options: &Options,
        client: &GithubClient,
        clock: &ManualClock,
        processes: &FakeProcesses,
        journal: &Path,
        root: &Path,
        package: &Path,
    ) -> (Arc<FakeBackend>, Executor) {
        let runner_root = RunnerRoot::open(root).expect("the runner root");
        let none = NoIsolation {
            root: runner_root,
            package: CurrentPackage::new(package),
        };
        let backend = Arc::new(FakeBackend {
            runtimes: none.clone(),
            table: processes.clone(),
            clock: clock.clone(),
            program: Mutex::new(Program::Runner),
            refuse_start: Mutex::new(false),
            hold_start: (Mutex::new(false), Condvar::new()),
            hold_clean: (Mutex::new(false), Condvar::new()),
            cleans_held: Mutex::new(0),
            pids: Mutex::new(HashMap::new()),
            jits: Mutex::new(HashMap::new()),
        });
        let settings = Settings {
            host: HOST.to_owned(),
            max_runners: options.max_runners,
            package_dir: package.to_path_buf(),
            backends: Arc::new(Backends {
                isolation: IsolationKind::None,
                none,
                user: None,
            }),
            timeouts: options.timeouts,
            policies: options.policies.clone(),
            operator_env: HashMap::new(),
            cache: None,
            images: None,
            egress: None,
            capacity: options.capacity,
            devices: Vec::new(),
            fitness: crate::fitness::Gate::default(),
            fleet: options
                .fleet
                .as_ref()
                .map(|max_runners| super::FleetSettings {
                    max_runners: max_runners.clone(),
                    registrations: options.registrations.clone().map_or_else(
                        || super::RegistrationWindows::Paced(rm_github::pacing::Pacing::default()),
                        super::RegistrationWindows::Fixed,
                    ),
                }),
            // Beside the journal, as `<data_dir>/logs` is in production.
            logs: journal.parent().map(|data_dir| {
                Arc::new(rm_runner::logs::Store::new(
                    data_dir,
                    rm_runner::logs::Bounds::default(),
                ))
            }),
            reruns: options.reruns.clone(),
            scale_sets: Default::default(),
        };
        let seams = Seams {
            clock: Arc::new(clock.clone()),
            execution: Arc::clone(&backend) as Arc<dyn Execution>,
        };
        let executor = Executor::open_with(
            settings,
            // A fleet of one host on the journal file, with the same rules as a shared one.
            &rm_journal::Store::open(journal.to_path_buf(), None),
            root,
            Registry::new(client.clone()),
            Arc::new(crate::notify::Notifier::new(false)),
            seams,
        )
        .expect("the executor");
        (backend, executor)
    }

    fn open_poller(
        options: &Options,
        client: &GithubClient,
        clock: &ManualClock,
        journal: &Path,
    ) -> Poller {
        let mut targets: Vec<Target> = options.policies.iter().map(|p| p.target.clone()).collect();
        targets.dedup();
        let config = PollerConfig {
            targets,
            interval: crate::polling::schedule::MIN_DELAY,
            idle_interval: crate::polling::schedule::MIN_DELAY,
            intake: false,
        };
        Poller::new(
            config,
            client.clone(),
            Box::new(PollJournal::open(journal).expect("the poll journal")),
            Arc::new(clock.clone()),
        )
        .expect("the poller")
        .with_jitter(Box::new(|| 0.0))
    }

    /// Gives the next executor (after [`Harness::restart`]) these re-run rules.
    pub(super) fn set_reruns(
        &mut self,
        reruns: std::collections::BTreeMap<String, crate::config::rerun::RerunPolicy>,
    ) {
        self.options.reruns = reruns;
    }

    /// The journal's file.
    pub(super) fn journal_path(&self) -> &Path {
        &self.journal_path
    }

    /// A new executor on the same journal, runner root, fake GitHub and process table: an agent
    /// started again after the previous one stopped (or died). Its launch tasks, if any, keep
    /// running; the test stops driving the old executor.
    pub(super) fn restart(&mut self) {
        let (backend, executor) = Self::open_executor(
            &self.options,
            &self.client,
            &self.clock,
            &self.processes,
            &self.journal_path,
            &self.root_path,
            &self.package,
        );
        self.backend = backend;
        self.executor = executor;
    }

    /// Moves the manual clock and the fake's together.
    pub(super) fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.fake.advance_clock(by);
    }

    /// The fleet's state in the journal file (for a fleet host: [`Options::fleet`]).
    pub(super) fn fleet_view(&self) -> rm_journal::FleetView {
        use rm_journal::Fleet as _;
        rm_journal::LocalFleet::open(&self.journal_path)
            .expect("the fleet tables")
            .view()
            .expect("the fleet's view")
    }

    /// Startup recovery of the current executor.
    pub(super) async fn recover(&mut self) -> Result<(), super::RecoveryIncomplete> {
        self.executor.recover().await
    }

    /// Waits for the stops and cleanups in flight (recovery and passes hand them to tasks) and
    /// gives their reports to supervision.
    pub(super) async fn settle(&mut self) {
        self.executor.settle_effects().await;
    }

    /// One step: the clocks move a [`TICK`], the poller does what is due (the journal learns
    /// GitHub's job states), the executor runs one pass (supervise, then allocate).
    pub(super) async fn step(&mut self) {
        self.advance(TICK);
        if let Ok(report) = self.poller.poll_once().await
            && report.polled_demand
            && let Some(at) = report.at
        {
            // Through the loop's own channel, as the agent's poller tells it.
            self.executor
                .handle()
                .journal_refreshed(rm_vocab::UnixMs::from_system_time(at));
        }
        self.executor.pass().await;
        tokio::time::sleep(STEP_PAUSE).await;
    }

    /// Steps until `done` holds (checking `invariant` after every step); returns the steps
    /// taken. Fails the test after [`MAX_STEPS`].
    pub(super) async fn until(
        &mut self,
        what: &str,
        mut invariant: impl FnMut(&Harness),
        mut done: impl FnMut(&Harness) -> bool,
    ) -> usize {
        for steps in 0..MAX_STEPS {
            if done(self) {
                return steps;
            }
            self.step().await;
            invariant(self);
        }
        panic!(
            "{what}: not reached in {MAX_STEPS} steps; attempts: {:#?}",
            self.attempts()
        );
    }

    /// Every attempt in the journal, newest first.
    pub(super) fn attempts(&self) -> Vec<AttemptRecord> {
        let mut attempts = Attempts::open(&self.journal_path)
            .expect("the journal")
            .list(Scope::All, None)
            .expect("the attempts");
        attempts.reverse();
        attempts
    }

    /// Attempts that count against the host's capacity now.
    pub(super) fn live(&self) -> usize {
        self.attempts()
            .iter()
            .filter(|a| a.state.counts_against_capacity())
            .count()
    }

    pub(super) fn all_cleaned(&self) -> bool {
        self.attempts()
            .iter()
            .all(|a| a.state == rm_journal::AttemptState::Cleaned)
    }

    /// Queues a job on the fake with `labels`.
    pub(super) fn queue(&self, name: &str, labels: &[&str]) -> u64 {
        self.fake
            .queue_job(REPO, name, labels)
            .expect("a queued job")
    }

    pub(super) fn completed(&self, job: u64) -> bool {
        self.fake
            .job(job)
            .is_some_and(|j| j.status == rm_fake_github::JobStatus::Completed)
    }

    /// Journals a `queued` webhook delivery for job `job_id` in [`REPO`] with `labels`, as the
    /// receiver would: demand for a job the fake does not know and so never hands out.
    pub(super) async fn deliver_queued(&self, job_id: i64, labels: &[&str]) {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/webhooks/workflow_job.queued.5.json");
        let mut body: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).expect("the fixture"))
                .expect("JSON");
        let now = humantime::format_rfc3339_seconds(self.clock.now().to_system_time()).to_string();
        body["installation"] = serde_json::json!({"id": 4242});
        body["repository"]["full_name"] = serde_json::json!(REPO);
        body["repository"]["name"] = serde_json::json!("widgets");
        body["repository"]["owner"]["login"] = serde_json::json!("acme");
        let job = &mut body["workflow_job"];
        job["id"] = serde_json::json!(job_id);
        job["labels"] = serde_json::json!(labels);
        job["created_at"] = serde_json::json!(now);
        job["started_at"] = serde_json::json!(now);
        self.journal_webhook(format!("queued-{job_id}"), &body)
            .await;
    }

    /// Journals a `completed` webhook delivery of the fake's job `job` as it stands (completed,
    /// its conclusion and runner), as the receiver would: the journal learns at once what the
    /// poller's stale checks would learn much later.
    pub(super) async fn deliver_completed(&self, job: u64) {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/webhooks/workflow_job.completed.1.json");
        let mut body: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).expect("the fixture"))
                .expect("JSON");
        let seen = self.fake.job(job).expect("the fake's job");
        let now = humantime::format_rfc3339_seconds(self.clock.now().to_system_time()).to_string();
        body["installation"] = serde_json::json!({"id": self.installation});
        body["repository"]["full_name"] = serde_json::json!(REPO);
        body["repository"]["name"] = serde_json::json!("widgets");
        body["repository"]["owner"]["login"] = serde_json::json!("acme");
        let j = &mut body["workflow_job"];
        j["id"] = serde_json::json!(seen.id);
        j["run_id"] = serde_json::json!(seen.run_id);
        j["run_attempt"] = serde_json::json!(seen.run_attempt);
        j["labels"] = serde_json::json!(seen.labels);
        j["status"] = serde_json::json!("completed");
        j["conclusion"] = serde_json::json!(seen.conclusion);
        j["runner_name"] = serde_json::json!(seen.runner_name);
        j["runner_id"] = serde_json::json!(seen.runner_id);
        j["created_at"] = serde_json::json!(now);
        j["started_at"] = serde_json::json!(now);
        j["completed_at"] = serde_json::json!(now);
        self.journal_webhook(format!("completed-{job}"), &body)
            .await;
    }

    /// Journals a `workflow_job` webhook delivery of `body` under `guid`, as the receiver would.
    async fn journal_webhook(&self, guid: String, body: &serde_json::Value) {
        self.journal
            .record(rm_journal::Incoming {
                guid,
                event: "workflow_job".into(),
                headers: Vec::new(),
                body: serde_json::to_vec(body).expect("JSON"),
                received_at_ms: self.clock.now(),
                source: rm_vocab::Source::Webhook,
            })
            .await
            .expect("the delivery journalled");
    }

    /// Registrations of this host's runners the fake still holds.
    pub(super) fn our_registrations(&self) -> Vec<String> {
        self.fake
            .runners()
            .into_iter()
            .map(|r| r.name)
            .filter(|n| super::owns_runner_name(HOST, n))
            .collect()
    }

    /// The store of kept runner logs (`<data_dir>/logs`).
    pub(super) fn kept_logs(&self) -> rm_runner::logs::Store {
        let data_dir = self.journal_path.parent().expect("the data directory");
        rm_runner::logs::Store::new(data_dir, rm_runner::logs::Bounds::default())
    }

    /// Runtime directories left under the runner root.
    pub(super) fn runtimes(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.root_path)
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }
}
