//! The executor: everything `rm-agent run` does between the journal and the runner processes.
//! It owns this host's runner attempts while the agent runs, in rooms with one owner each that
//! talk to one control loop through messages, never through each other's memory:
//! - **the control loop** ([`control`]: [`Executor`]) owns the rooms' state, the launches and
//!   the effects in flight; each pass supervises every attempt, reconciles GitHub's inventory
//!   when it is due, then allocates, and never waits for a slow effect. It waits on its inputs
//!   directly: the `watch`es that say new demand may be there ([`Executor::wake_on`]: durable
//!   deliveries, a poll that moved a job, the host fit again), the effect tasks it joins, the
//!   messages ([`Event`]: a poll that refreshed the journal, a launch that ended, a runner that
//!   exited), or its interval;
//! - **demand and allocation** ([`allocate`]: what to start, under which ceilings, fences and
//!   back-offs; the attempt row, a runner's first effect);
//! - **launch** ([`launch`]: one task per launch: runtime, JIT registration, process; it tells the
//!   loop how it ended);
//! - **supervision** ([`supervise`]: observe, decide with [`crate::lifecycle`], mark, journal a
//!   stop intent or a conclusion) and its **effects** ([`effects`]: a stop, a cleanup with the
//!   deregistration, each a task the loop owns and joins, reporting back);
//! - **recovery** ([`recovery`]: the startup pass and the inventory reconciliation).
//!
//! Every decision is a pure function in one of them; the world is read through seams
//! ([`seams`]: clock, process table, backends), GitHub through [`registry`], and the journal
//! through [`journal`], whose calls run off the async worker threads. Every effect is preceded
//! by its journal record (the attempt before the workspace and GitHub, the runner id before the
//! process, the stop intent before the signal, the conclusion before the cleanup), so an agent
//! killed at any instant restarts into a state recovery can decide.

pub(crate) mod allocate;
mod claims;
mod cleanup;
mod context;
mod control;
mod deregister;
mod disk_watch;
mod effects;
pub mod evidence;

pub mod findings;
mod journal;
mod launch;
pub(crate) mod plan;
mod recovery;
pub(crate) mod registry;
mod rerun;
pub(crate) mod seams;
pub(crate) mod sizing;
mod supervise;
pub(crate) mod tally;

#[cfg(test)]
mod harness;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rm_journal::{AttemptId, IsolationKind};

use crate::config::Policy;
use crate::lifecycle::Timeouts;
use rm_runner::backend::{Backend, NoIsolation, UserIsolation};

pub use claims::{FleetSettings, LEASE_RENEW, LEASE_TTL, RegistrationWindows, shared_windows};
pub use control::{Executor, Handle};
pub use recovery::RecoveryIncomplete;

/// A message to the control loop: what the rest of the agent and the launch tasks tell it.
#[derive(Debug)]
enum Event {
    /// A poll pass that began at this time brought the journal up to date with GitHub.
    Refreshed(rm_vocab::UnixMs),
    /// A launch task ended its bring-up: a runner runs (`failed: None`), or it failed so
    /// (supervision concludes the attempt with it).
    Launched {
        attempt: AttemptId,
        policy: String,
        failed: Option<allocate::LaunchFailure>,
    },
    /// A runner process this agent started exited, with how (`None`: its status could not be
    /// read).
    Exited(AttemptId, Option<crate::lifecycle::ExitSeen>),
}

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
    pub operator_env: HashMap<String, rm_runner::env_file::OperatorEnv>,
    /// The fitness gate: while it says unfit, allocation registers no runner.
    pub fitness: crate::fitness::Gate,
    /// In a fleet (CONTRACT §9): where its shared journal is; jobs are read and claimed there.
    /// `None`: this host alone, on its own journal.
    pub fleet: Option<FleetSettings>,
    /// Where each attempt's `_diag` is kept before its runtime is removed
    /// ([`rm_runner::logs`]); `None`: nothing is kept.
    pub logs: Option<Arc<rm_runner::logs::Store>>,
    /// Each policy's re-run rule, by policy name (`policy.rerun_on`); empty: no re-runs, and no
    /// re-run scan at all.
    pub reruns: std::collections::BTreeMap<String, crate::config::rerun::RerunPolicy>,
    /// The `[[scale_set]]`s: their statistics are their policies' demand, and their runners
    /// are registered through the scale set's own JIT endpoint. Empty: none.
    pub scale_sets: Arc<crate::scaleset::Board>,
    /// What a runner of a policy with `cache = true` is given (`[cache]`); `None`: no cache.
    pub cache: Option<rm_runner::backend::CachePlan>,
    /// The job images (`policy.image`): each policy's current one, recorded with each new
    /// attempt, and the store a runner is started from; `None`: no policy has an image.
    pub images: Option<Arc<crate::image::Images>>,
    /// The egress resolver (`policy.egress`): each runner of an egress policy is registered
    /// with it before it starts and its record written before its network goes; `None`: no
    /// policy has egress.
    pub egress: Option<Arc<crate::egress::Egress>>,
    /// `[host] capacity`, resolved: what packing fits runners into (issue 42).
    pub capacity: crate::config::HostCapacity,
    /// `[[host.device]]`: the devices runners are given one at a time; non-empty, every
    /// isolated runner gets a `/dev` of its own holding only its own.
    pub devices: Vec<crate::config::Device>,
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
    /// The host's shape facts ([`sizing::Host`]).
    pub(crate) fn sizing_host(&self) -> sizing::Host<'_> {
        sizing::Host {
            capacity: &self.capacity,
            devices: &self.devices,
            max_runners: self.max_runners,
        }
    }

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
