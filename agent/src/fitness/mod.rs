//! The fitness gate (CONTRACT §8 `host_unfit`): whether this host may register new runners. It
//! owns that one decision. A host whose runner root or data directory is short of space or not
//! writable, whose available memory is below the largest policy `memory_max`, or that lacks a
//! tool the operator requires, would only waste a JIT registration on a job that then fails:
//! while it is unfit, allocation registers nothing (supervision, deregistration and cleanup go
//! on), and once it is fit again allocation resumes by itself.
//!
//! - [`judge`] is the decision: a pure function of measured [`Facts`] against the
//!   [`Requirements`] the configuration makes;
//! - [`probe`] measures (statvfs, a real write of a probe file, `/proc/meminfo`, the `PATH`)
//!   behind the [`probe::Probes`] trait, and [`deadline::Prober`] runs each probe on a thread of
//!   its own under [`PROBE_DEADLINE`]: a probe that does not answer in time (a hung NFS mount) is
//!   a problem of its own, `probe_timeout`, and the gate answers all the same;
//! - [`Gate`] holds the latest judgement for allocation, the status snapshot and `/metrics`;
//!   [`spawn`] re-judges every [`CHECK_INTERVAL`] ([`RECHECK_WHILE_UNFIT`] while unfit), logs
//!   and notifies the transitions, and wakes allocation when the host is fit again;
//! - [`report`] says it in `status`, `/metrics` and `check`.

pub(crate) mod deadline;
pub(crate) mod probe;
pub(crate) mod report;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::Config;
use crate::notify::{Notifier, OperatorEvent};
pub(crate) use deadline::Prober;

/// How often a fit host is checked again: a filling disk is noticed within this, at the cost
/// of two statvfs calls, two small synced writes and one read of `/proc/meminfo`.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// How often an unfit host is checked again: allocation resumes within this of the space
/// being freed.
pub(crate) const RECHECK_WHILE_UNFIT: Duration = Duration::from_secs(5);

/// How long one round of probes may take before a probe that has not answered is a
/// `probe_timeout` problem. A local filesystem answers statvfs and a small synced write in
/// milliseconds, and a loaded one within a second or two; a mount that has not answered in ten
/// seconds is hung as far as a job is concerned (its runner would hang on it the same way).
/// The next round starts [`RECHECK_WHILE_UNFIT`] after a round ends, so a hung host is judged
/// again about every 15 seconds, and the gate never waits on a probe longer than this.
pub(crate) const PROBE_DEADLINE: Duration = Duration::from_secs(10);

/// The stable problem codes (CONTRACT §8, `status --json` `host.problems[].code`).
pub(crate) const DISK_SPACE: &str = "disk_space";
pub(crate) const NOT_WRITABLE: &str = "not_writable";
pub(crate) const MEMORY: &str = "memory";
pub(crate) const MISSING_TOOL: &str = "missing_tool";
pub(crate) const PROBE_TIMEOUT: &str = "probe_timeout";
/// Every code, in the order `/metrics` lists them.
pub(crate) const CODES: [&str; 5] = [
    DISK_SPACE,
    NOT_WRITABLE,
    MEMORY,
    MISSING_TOOL,
    PROBE_TIMEOUT,
];

/// The gate's judgement at one check, as [`Gate`] holds it and the status snapshot carries it
/// ([`crate::status_file::Snapshot::fitness`]): while `problems` is not empty the host registers
/// no new runner (supervision and cleanup go on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fitness {
    pub checked_at_ms: i64,
    pub problems: Vec<FitnessProblem>,
}

/// One reason the host is unfit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitnessProblem {
    /// Stable, for scripts: `disk_space`, `not_writable`, `memory`, `missing_tool`,
    /// `probe_timeout`.
    pub code: String,
    /// One sentence naming what is short and the remedy.
    pub message: String,
}

/// A directory the gate watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirRole {
    RunnerRoot,
    DataDir,
}

impl DirRole {
    fn describe(self) -> &'static str {
        match self {
            DirRole::RunnerRoot => "the runner root",
            DirRole::DataDir => "the data directory",
        }
    }

    fn threshold_key(self) -> &'static str {
        match self {
            DirRole::RunnerRoot => "host.min_free_space",
            DirRole::DataDir => "host.data_dir_min_free_space",
        }
    }
}

/// One directory and the free space its filesystem must keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirRequirement {
    pub role: DirRole,
    pub path: PathBuf,
    pub min_free: u64,
}

/// Everything the gate checks, from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Requirements {
    pub dirs: Vec<DirRequirement>,
    /// The largest `memory_max` a policy writes, and its policy: one runner of it must fit (a
    /// default share is not required: [`crate::config::Policy::memory_required`]).
    pub memory: Option<(u64, String)>,
    pub tools: Vec<String>,
    /// The `PATH` runners get, where tool names are looked up.
    pub path: OsString,
    /// How long a round of probes may take ([`PROBE_DEADLINE`]; shorter in tests).
    pub deadline: Duration,
}

impl Requirements {
    /// What `config` requires; `path` is the runners' `PATH` ([`probe::runner_path`]).
    pub(crate) fn of(config: &Config, path: OsString) -> Requirements {
        let thresholds = &config.host.fitness;
        Requirements {
            dirs: vec![
                DirRequirement {
                    role: DirRole::RunnerRoot,
                    path: config.host.runner_root.clone(),
                    min_free: thresholds.min_free_space,
                },
                DirRequirement {
                    role: DirRole::DataDir,
                    path: config.data_dir.clone(),
                    min_free: thresholds.data_dir_min_free_space,
                },
            ],
            memory: config
                .policies
                .iter()
                .filter_map(|p| p.memory_required.map(|m| (m, p.name.clone())))
                .max_by_key(|(m, _)| *m),
            tools: required_tools(config),
            path,
            deadline: PROBE_DEADLINE,
        }
    }
}

/// The operator's `required_tools`, and where a policy sets `docker = true` every program a
/// runner's Docker daemon runs, by the absolute path it has now (a tool removed later makes the
/// host unfit instead of failing each runner's daemon at its start; one never found is named
/// bare, and reported missing).
fn required_tools(config: &Config) -> Vec<String> {
    let mut tools = config.host.fitness.required_tools.clone();
    if config.policies.iter().any(|p| p.docker.is_some()) {
        for tool in rm_runner::docker::host::TOOLS {
            let named = rm_runner::docker::host::find(tool.name)
                .map_or_else(|| tool.name.to_owned(), |p| p.display().to_string());
            if !tools.contains(&named) {
                tools.push(named);
            }
        }
    }
    tools
}

/// One probe's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Probed<T> {
    /// What it measured.
    Answered(T),
    /// No answer within [`Requirements::deadline`]: a `probe_timeout` problem.
    TimedOut,
}

/// What was measured of one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirFacts {
    /// Bytes available to unprivileged users (runners) on its filesystem, or why not known.
    pub free: Probed<Result<u64, String>>,
    /// Whether a probe file could be created, written, synced and removed, or why not.
    pub write: Probed<Result<(), String>>,
}

/// What was measured, in the order of the [`Requirements`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Facts {
    pub dirs: Vec<DirFacts>,
    /// `MemAvailable` in bytes; `None` where the kernel does not say, or no policy writes a
    /// `memory_max` (nothing is judged then).
    pub mem_available: Probed<Option<u64>>,
    /// Per required tool: where it was found.
    pub tools: Vec<Probed<Option<PathBuf>>>,
}

/// The judgement: every problem, one sentence each with its remedy; none means fit. A probe
/// that did not answer is a `probe_timeout` naming it and its path (the statvfs and the write of
/// one directory together in one), beside whatever the probes that answered show.
pub(crate) fn judge(required: &Requirements, facts: &Facts) -> Vec<FitnessProblem> {
    let mut problems = Vec::new();
    let mut problem = |code: &str, message: String| {
        problems.push(FitnessProblem {
            code: code.to_owned(),
            message,
        });
    };
    let within = format!("{:?}", required.deadline);
    for (dir, measured) in required.dirs.iter().zip(&facts.dirs) {
        let what = dir.role.describe();
        let path = dir.path.display();
        let hung: Vec<&str> = [
            (
                matches!(measured.free, Probed::TimedOut),
                "free-space check (statvfs)",
            ),
            (matches!(measured.write, Probed::TimedOut), "write probe"),
        ]
        .into_iter()
        .filter_map(|(hung, probe)| hung.then_some(probe))
        .collect();
        if !hung.is_empty() {
            problem(
                PROBE_TIMEOUT,
                format!(
                    "the {} of {what} {path} did not answer within {within} (a hung filesystem, such as an NFS mount whose server is gone): no new runner is registered until it answers; check the mount and its server",
                    hung.join(" and the ")
                ),
            );
        }
        if let Probed::Answered(Err(reason)) = &measured.write {
            problem(
                NOT_WRITABLE,
                format!(
                    "{what} {path} is not writable ({reason}): no new runner is registered until it is; check its free space, permissions and mount"
                ),
            );
        }
        match &measured.free {
            Probed::Answered(Ok(free)) if *free < dir.min_free => problem(
                DISK_SPACE,
                format!(
                    "{what} {path} has {} free, below {} ({}): no new runner is registered until space is freed (remove old files, grow the filesystem or lower {})",
                    bytes(*free),
                    dir.role.threshold_key(),
                    bytes(dir.min_free),
                    dir.role.threshold_key()
                ),
            ),
            Probed::Answered(Ok(_)) | Probed::TimedOut => {}
            // A write error above already says the directory is unusable.
            Probed::Answered(Err(_)) if matches!(measured.write, Probed::Answered(Err(_))) => {}
            Probed::Answered(Err(reason)) => problem(
                NOT_WRITABLE,
                format!(
                    "cannot tell the free space of {what} {path} ({reason}): no new runner is registered until it can be; check that it exists and is mounted"
                ),
            ),
        }
    }
    if let Some((needed, policy)) = &required.memory {
        match facts.mem_available {
            Probed::Answered(Some(available)) if available < *needed => problem(
                MEMORY,
                format!(
                    "{} of memory available, less than policy {policy}'s memory_max ({}): no new runner is registered until memory is freed (or lower memory_max)",
                    bytes(available),
                    bytes(*needed)
                ),
            ),
            Probed::Answered(_) => {}
            Probed::TimedOut => problem(
                PROBE_TIMEOUT,
                format!(
                    "reading {} did not answer within {within}: no new runner is registered until it answers; the host is starved (check its load and the kernel log)",
                    probe::MEMINFO
                ),
            ),
        }
    }
    for (tool, found) in required.tools.iter().zip(&facts.tools) {
        if found == &Probed::TimedOut {
            let looked = if tool.starts_with('/') {
                format!("the lookup of required tool {tool}")
            } else {
                format!(
                    "the lookup of required tool `{tool}` on the runners' PATH ({})",
                    required.path.to_string_lossy()
                )
            };
            problem(
                PROBE_TIMEOUT,
                format!(
                    "{looked} did not answer within {within} (a hung filesystem on its path, such as an NFS mount whose server is gone): no new runner is registered until it answers; check the mounts on that path"
                ),
            );
        } else if found == &Probed::Answered(None) {
            let where_ = if tool.starts_with('/') {
                "does not exist or is not executable".to_owned()
            } else {
                format!(
                    "is not on the runners' PATH ({})",
                    required.path.to_string_lossy()
                )
            };
            problem(
                MISSING_TOOL,
                format!(
                    "required tool `{tool}` {where_}: no new runner is registered until it is installed (or removed from host.required_tools)"
                ),
            );
        }
    }
    problems
}

/// A size for people: `1.5 GiB`, `300.0 MiB`, `512 B`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    #[expect(clippy::cast_precision_loss, reason = "a size for people")]
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// How the judgement changed between two checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Fit (or not judged yet) before, unfit now.
    BecameUnfit,
    /// Unfit before, fit now.
    BecameFit,
    /// Unfit before and now, for other reasons (other codes).
    ReasonsChanged,
    Unchanged,
}

/// What changed from `before` to `now`. Pure.
pub(crate) fn change(before: Option<&Fitness>, now: &Fitness) -> Change {
    let was_unfit = before.is_some_and(|b| !b.problems.is_empty());
    fn codes(f: &Fitness) -> Vec<&str> {
        let mut codes: Vec<&str> = f.problems.iter().map(|p| p.code.as_str()).collect();
        codes.sort_unstable();
        codes.dedup();
        codes
    }
    match (was_unfit, now.problems.is_empty()) {
        (false, false) => Change::BecameUnfit,
        (true, true) => Change::BecameFit,
        (true, false) if before.map(codes) != Some(codes(now)) => Change::ReasonsChanged,
        _ => Change::Unchanged,
    }
}

/// The latest judgement, shared by the checker (writes), allocation and the publishers
/// (read). Before the first check the host counts as fit: `run` checks once before its first
/// allocation, so only code that runs no checker (tests) sees that.
#[derive(Debug, Clone)]
pub struct Gate {
    state: Arc<watch::Sender<Option<Fitness>>>,
    /// Bumped each time the host becomes fit again: allocation waits on it ([`Gate::fit_again`]).
    fit_again: Arc<watch::Sender<u64>>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            state: Arc::new(watch::channel(None).0),
            fit_again: Arc::new(watch::channel(0).0),
        }
    }
}

impl Gate {
    /// Whether new runners may be registered now.
    pub fn is_fit(&self) -> bool {
        self.state
            .borrow()
            .as_ref()
            .is_none_or(|f| f.problems.is_empty())
    }

    /// The latest judgement; `None` before the first.
    pub fn current(&self) -> Option<Fitness> {
        self.state.borrow().clone()
    }

    /// Changes each time the host becomes fit again (for [`crate::executor::Executor::wake_on`]).
    pub fn fit_again(&self) -> watch::Receiver<u64> {
        self.fit_again.subscribe()
    }

    /// Records a judgement; what changed.
    pub fn record(&self, now: Fitness) -> Change {
        let change = change(self.state.borrow().as_ref(), &now);
        self.state.send_replace(Some(now));
        if change == Change::BecameFit {
            self.fit_again.send_modify(|n| *n = n.wrapping_add(1));
        }
        change
    }
}

/// Measures, judges and records once, within the probes' deadline whatever they do; logs and
/// notifies a transition.
pub(crate) async fn check_once(prober: &mut Prober, gate: &Gate, notifier: &Notifier) {
    let facts = match prober.measure().await {
        Ok(facts) => facts,
        Err(e) => {
            tracing::warn!(error = %e, "the fitness probes failed; the last judgement stands");
            return;
        }
    };
    let fitness = Fitness {
        checked_at_ms: rm_vocab::now().get(),
        problems: judge(prober.required(), &facts),
    };
    let problems: Vec<String> = fitness.problems.iter().map(|p| p.message.clone()).collect();
    match gate.record(fitness) {
        Change::BecameUnfit => {
            for problem in &problems {
                tracing::warn!(problem = %problem, "host unfit: no new runner is registered");
            }
            notifier.notify(OperatorEvent::HostUnfit { problems });
        }
        Change::ReasonsChanged => {
            for problem in &problems {
                tracing::warn!(problem = %problem, "host still unfit");
            }
        }
        Change::BecameFit => {
            tracing::info!("host fit again: allocation resumes");
        }
        Change::Unchanged => {}
    }
}

/// Re-checks until the task is aborted: every [`CHECK_INTERVAL`], every
/// [`RECHECK_WHILE_UNFIT`] while unfit.
pub(crate) fn spawn(
    mut prober: Prober,
    gate: Gate,
    notifier: Arc<Notifier>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let wait = if gate.is_fit() {
                CHECK_INTERVAL
            } else {
                RECHECK_WHILE_UNFIT
            };
            tokio::time::sleep(wait).await;
            check_once(&mut prober, &gate, &notifier).await;
        }
    })
}

#[cfg(test)]
mod tests;
