//! The executor: everything `rm-agent run` does between the journal and the runner processes.
//! It owns this host's runner attempts while the agent runs:
//! - **recovery** at start ([`recovery`]): every journalled attempt observed and decided with
//!   the same code as supervision, GitHub's inventory reconciled for our `rm-<host>-<12 hex>` names;
//!   no runner is launched until it is complete;
//! - **one control loop** ([`Executor::run`]): each pass supervises every attempt ([`supervise`])
//!   and then allocates runners for the journal's queued jobs ([`allocate`]), woken by durable
//!   deliveries, by a runner exiting, or by its interval;
//! - **one task per launch** ([`launch`]): workspace, JIT registration, process, then waiting for
//!   the process to exit.
//!
//! Every effect is preceded by its journal record (the attempt before the workspace and GitHub,
//! the runner id before the process, the stop intent before the signal), so an agent killed at
//! any instant restarts into a state recovery can decide.

pub mod allocate;
pub mod evidence;
pub mod fault;
mod launch;
mod recovery;
pub mod registry;
pub(crate) mod seams;
mod supervise;

#[cfg(test)]
mod harness;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rm_journal::{AttemptId, Attempts, IsolationKind, Reader};
use tokio::sync::{Notify, watch};

use crate::config::Policy;
use crate::lifecycle::Timeouts;
use crate::notify::Notifier;
use crate::runner::RunnerRoot;
use crate::runner::backend::{Backend, NoIsolation, Plan, UserIsolation};
use registry::Registry;
use seams::{Execution, ProcessTable, Seams};

pub use recovery::RecoveryIncomplete;

/// The longest the control loop sleeps between passes when nothing wakes it: timeouts are
/// noticed within this.
pub const PASS_INTERVAL: Duration = Duration::from_secs(2);

/// How long a failed recovery waits before it tries again (GitHub unreachable, most likely).
pub const RECOVERY_RETRY: Duration = Duration::from_secs(10);

/// How long the first allocation waits for the journal to catch up with GitHub after a start
/// (the poller's first pass): a job finished while the agent was down must not start a runner.
pub const STARTUP_SYNC_WAIT: Duration = Duration::from_secs(30);

/// How long a drain waits for launches in flight to reach a runner or a conclusion. With
/// [`DRAIN_CLEANUP`], the agent exits well within CONTRACT §3's 60 seconds.
pub const DRAIN_LAUNCHES: Duration = Duration::from_secs(30);

/// How long a drain's last supervision pass may take (it concludes and cleans what ended).
pub const DRAIN_CLEANUP: Duration = Duration::from_secs(20);

/// How often GitHub's runner inventory is reconciled with the journal after startup: catches a
/// registration a failed deregistration left behind.
pub const INVENTORY_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// How long a stop waits between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The executor's settings, from the validated configuration.
#[derive(Debug)]
pub struct Settings {
    /// `host.name`: the runner names' `rm-<host>-` prefix.
    pub host: String,
    pub max_runners: u32,
    /// An unpacked runner package (copied into each runtime under `isolation = "none"`).
    pub package_dir: PathBuf,
    /// The execution backends; new attempts get `backends.isolation`.
    pub backends: Arc<Backends>,
    /// Supervision timers (registration, idle, launch, exit grace).
    pub timeouts: Timeouts,
    /// Policies with an ephemeral workspace.
    pub policies: Vec<Policy>,
    /// Each policy's `env_file` variables, by policy name (read once at start).
    pub operator_env: HashMap<String, crate::runner::env_file::OperatorEnv>,
    /// The fitness gate: while it says unfit, allocation registers no runner.
    pub fitness: crate::fitness::Gate,
}

/// The execution backends this agent can drive (CONTRACT §7). Each attempt names its own in the
/// journal; new ones get `isolation`.
#[derive(Debug)]
pub struct Backends {
    /// The backend new attempts are started under.
    pub isolation: IsolationKind,
    pub none: NoIsolation,
    /// Present where the agent may switch users: for new attempts under `user`, and to clean up
    /// after attempts started isolated even when the configuration now says `none`.
    pub user: Option<UserIsolation>,
}

impl Backends {
    /// The backend of an attempt journalled under `kind`; `None` when this agent cannot drive
    /// it (an isolated attempt, and the agent may no longer switch users).
    pub fn of(&self, kind: IsolationKind) -> Option<&dyn Backend> {
        match kind {
            IsolationKind::None => Some(&self.none),
            IsolationKind::User => self.user.as_ref().map(|u| u as &dyn Backend),
        }
    }
}

impl Settings {
    /// Whether GitHub's runner `name` is one of this host's: exactly `rm-<host>-<12 hex>`
    /// (CONTRACT §5), the only names this agent ever removes.
    pub fn owns_runner_name(&self, name: &str) -> bool {
        owns_runner_name(&self.host, name)
    }
}

/// Whether `name` is exactly `rm-<host>-` and the 12 lowercase hex digits of an attempt id. A
/// prefix alone is not enough: host `ci` must never take host `ci-2`'s `rm-ci-2-<12 hex>` for
/// its own.
pub fn owns_runner_name(host: &str, name: &str) -> bool {
    name.strip_prefix("rm-")
        .and_then(|rest| rest.strip_prefix(host))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|short| {
            short.len() == rm_journal::ATTEMPT_SHORT_LEN
                && short
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// What a drain left behind, for the last log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Runners still alive (busy or idle): adopted at the next start.
    pub left_running: usize,
    /// Launches that had not finished when the drain gave up waiting.
    pub launches_unfinished: usize,
}

/// The executor. Shared by the control loop and the launch tasks.
pub struct Executor {
    settings: Settings,
    attempts: Mutex<Attempts>,
    reader: Mutex<Reader>,
    registry: Registry,
    root: RunnerRoot,
    processes: Arc<ProcessTable>,
    /// The backend of each attempt (the configured [`Backends`] in production).
    execution: Arc<dyn Execution>,
    clock: Arc<dyn rm_github::Clock>,
    /// The host-wide allocation lock: taken per runner created, with the attempts and the
    /// capacity re-read under it.
    allocation: tokio::sync::Mutex<()>,
    /// Attempts whose launch task is still running: supervision leaves them to it.
    launching: Mutex<HashSet<AttemptId>>,
    wake: Notify,
    draining: AtomicBool,
    memory: Mutex<allocate::Memory>,
    observations: Mutex<supervise::Observations>,
    /// When GitHub's inventory was last reconciled (ms, on the executor's clock).
    last_inventory: Mutex<Option<i64>>,
    notifier: Arc<Notifier>,
}

impl Executor {
    /// Opens the executor's own journal connections and the runner root.
    pub fn open(
        settings: Settings,
        journal: &std::path::Path,
        runner_root: &std::path::Path,
        registry: Registry,
        notifier: Arc<Notifier>,
    ) -> anyhow::Result<Arc<Executor>> {
        let seams = Seams::production(Arc::clone(&settings.backends));
        Executor::open_with(settings, journal, runner_root, registry, notifier, seams)
    }

    /// [`Executor::open`] reading the world through `seams` (the harness's fakes in tests).
    pub(crate) fn open_with(
        settings: Settings,
        journal: &std::path::Path,
        runner_root: &std::path::Path,
        registry: Registry,
        notifier: Arc<Notifier>,
        seams: Seams,
    ) -> anyhow::Result<Arc<Executor>> {
        use anyhow::Context as _;
        let attempts = Attempts::open(journal)
            .with_context(|| format!("cannot open the journal {}", journal.display()))?;
        let reader = Reader::open(journal)
            .with_context(|| format!("cannot read the journal {}", journal.display()))?;
        let root = RunnerRoot::open(runner_root)?;
        Ok(Arc::new(Executor {
            settings,
            attempts: Mutex::new(attempts),
            reader: Mutex::new(reader),
            registry,
            root,
            processes: seams.processes,
            execution: seams.execution,
            clock: seams.clock,
            allocation: tokio::sync::Mutex::new(()),
            launching: Mutex::new(HashSet::new()),
            wake: Notify::new(),
            draining: AtomicBool::new(false),
            memory: Mutex::new(allocate::Memory::default()),
            observations: Mutex::new(supervise::Observations::default()),
            last_inventory: Mutex::new(None),
            notifier,
        }))
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Wakes the control loop whenever `changes` changes (durable deliveries, a poll that moved
    /// a job): new demand is served at once instead of at the next interval.
    pub fn wake_on(self: &Arc<Self>, mut changes: watch::Receiver<u64>) {
        let executor = Arc::downgrade(self);
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                match executor.upgrade() {
                    Some(executor) => executor.wake.notify_one(),
                    None => break,
                }
            }
        });
    }

    /// Recovers, waits (at most [`STARTUP_SYNC_WAIT`]) for `synced` (the journal caught up
    /// with GitHub: jobs that finished while the agent was down are no longer queued), then runs
    /// passes until `shutdown` completes, then drains.
    pub async fn run(
        self: &Arc<Self>,
        synced: impl Future<Output = ()>,
        shutdown: impl Future<Output = ()>,
    ) -> DrainReport {
        tokio::pin!(shutdown);
        loop {
            let recovered = tokio::select! {
                () = &mut shutdown => return self.drain().await,
                recovered = self.recover() => recovered,
            };
            match recovered {
                Ok(()) => break,
                Err(incomplete) => {
                    tracing::warn!(%incomplete, retry_in_s = RECOVERY_RETRY.as_secs(), "recovery is incomplete; no runner is started until it completes");
                    tokio::select! {
                        () = &mut shutdown => return self.drain().await,
                        () = tokio::time::sleep(RECOVERY_RETRY) => {}
                    }
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return self.drain().await,
            synced = tokio::time::timeout(STARTUP_SYNC_WAIT, synced) => {
                if synced.is_err() {
                    tracing::warn!(waited_s = STARTUP_SYNC_WAIT.as_secs(), "the first poll did not finish; serving the journal's queued jobs as they are");
                }
            }
        }
        tracing::info!(host = %self.settings.host, max_runners = self.settings.max_runners, "recovery complete; serving queued jobs");
        loop {
            self.pass().await;
            tokio::select! {
                () = &mut shutdown => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(PASS_INTERVAL) => {}
            }
        }
        self.drain().await
    }

    /// One pass: supervise every attempt, then allocate (unless draining).
    pub async fn pass(self: &Arc<Self>) {
        let timeouts = self.settings.timeouts;
        if let Err(e) = self.supervise_all(timeouts, false).await {
            tracing::warn!(error = %e, "supervision pass failed");
        }
        if self.inventory_due()
            && let Err(e) = self.reconcile_inventory().await
        {
            tracing::warn!(error = %e, "inventory reconciliation failed; tried again next interval");
        }
        if !self.draining.load(Ordering::SeqCst)
            && let Err(e) = self.allocate().await
        {
            tracing::warn!(error = %format!("{e:#}"), "allocation pass failed");
        }
    }

    /// CONTRACT §3's drain: no new runner, no busy runner killed. Launches in flight get
    /// [`DRAIN_LAUNCHES`] to finish, ended runners are cleaned, live ones are left running.
    async fn drain(self: &Arc<Self>) -> DrainReport {
        self.draining.store(true, Ordering::SeqCst);
        tracing::info!("draining: no new runners; running ones are left to finish");
        let deadline = tokio::time::Instant::now() + DRAIN_LAUNCHES;
        while !self.lock_launching().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let launches_unfinished = self.lock_launching().len();
        let timeouts = self.settings.timeouts;
        match tokio::time::timeout(DRAIN_CLEANUP, self.supervise_all(timeouts, false)).await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the drain's last supervision pass failed"),
            Err(_) => tracing::warn!("the drain's last supervision pass did not finish in time"),
            Ok(Ok(_)) => {}
        }
        let left_running = self
            .lock_attempts()
            .list(rm_journal::Scope::Live, None)
            .map_or(0, |live| live.len());
        DrainReport {
            left_running,
            launches_unfinished,
        }
    }

    /// Whether the periodic inventory reconciliation is due (and if so, marks it done now).
    fn inventory_due(&self) -> bool {
        let mut last = self
            .last_inventory
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = self.now_ms();
        match *last {
            Some(at) if now.saturating_sub(at) < rm_base::clock::ms(INVENTORY_INTERVAL) => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }

    /// Now, in ms since the epoch, on the executor's clock: every time it journals or decides by.
    fn now_ms(&self) -> i64 {
        rm_base::clock::unix_ms(self.clock.now())
    }

    fn lock_attempts(&self) -> MutexGuard<'_, Attempts> {
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_reader(&self) -> MutexGuard<'_, Reader> {
        self.reader.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_launching(&self) -> MutexGuard<'_, HashSet<AttemptId>> {
        self.launching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn policy(&self, name: &str) -> Option<&Policy> {
        self.settings.policies.iter().find(|p| p.name == name)
    }

    /// What the attempt's backend needs to know about it.
    fn plan(&self, record: &rm_journal::AttemptRecord) -> Plan {
        let limits = self
            .policy(&record.policy)
            .map(|p| p.limits)
            .unwrap_or_default();
        let mut plan = Plan::of(record, limits);
        // The operator's variables of the policy's env_file (crate::runner::env_file).
        if let Some(env) = self.settings.operator_env.get(&record.policy) {
            plan.env = env.clone();
        }
        plan
    }
}

/// The span every event about one attempt happens in (its launch task, each supervision step),
/// so that each carries the attempt, its runner and its policy once.
fn attempt_span(record: &rm_journal::AttemptRecord) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        id = %record.attempt_id,
        runner = %record.runner_name,
        policy = %record.policy
    )
}

/// The target of each policy by name, for attempts whose policy is still configured.
fn targets_by_policy(policies: &[Policy]) -> HashMap<String, rm_github::Target> {
    policies
        .iter()
        .map(|p| (p.name.clone(), p.target.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::owns_runner_name;

    #[test]
    fn a_host_owns_exactly_its_own_runner_names() {
        assert!(owns_runner_name("ci", "rm-ci-0123456789ab"));
        // Another host whose name starts with ours, and names that only look like ours.
        for other in [
            "rm-ci-2-0123456789ab",
            "rm-ci-0123456789abc",
            "rm-ci-0123456789a",
            "rm-ci-0123456789AB",
            "rm-ci-0123456789ag",
            "rm-ci-",
            "rm-ci",
            "rm-cix-0123456789ab",
            "xrm-ci-0123456789ab",
        ] {
            assert!(!owns_runner_name("ci", other), "{other}");
        }
        assert!(owns_runner_name("ci-2", "rm-ci-2-0123456789ab"));
    }
}
