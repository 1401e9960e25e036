//! `recovery_decision`: what to do with one attempt, given what the process adapter, GitHub and
//! the runner's own `_diag` logs say about it now. Pure: no clock (the caller passes `now`), no
//! I/O, so every branch is a table row below.
//!
//! The rules that shape it (prior art, from real incidents):
//! - A process is only ever signalled when the adapter proved it is ours (pid and start identity
//!   match: [`ProcessObservation::Running`]); a recycled pid is [`ProcessObservation::Gone`] and
//!   is never touched. A busy runner is never stopped.
//! - Stopping is intent first: [`Decision::Terminate`] carries the intent the caller journals
//!   (compare-and-set on the state it was decided from) before the signal.
//! - An idle exit is not a failure and is not replaced.
//! - Without GitHub nothing live is decided ([`Decision::Defer`]): a runner that looks idle may
//!   have taken a job, a dead one may have finished its job.
//! - Evidence beats intent: a runner whose `_diag` shows a `Worker_*.log` ran a job, whatever
//!   the agent meant to do with it. Except for one intent: a runner stopped for holding more
//!   than its `disk_max` ([`DiskUse::Over`]) failed for that, busy or not, job or not; it is the
//!   one stop a busy runner gets, and it needs no word from GitHub (the bound protects the host).

use std::time::Duration;

use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState, StopIntent};
use rm_vocab::UnixMs;

/// How long an attempt may stay `allocated` or `jit_received` while this agent runs before
/// supervision treats its launch as abandoned. A launch concludes its own failures; this only
/// catches a launch that never did. JIT retries, the package copy and the spawn fit well inside.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How long a concluded attempt's process may keep running (uploading its last logs) before it
/// is stopped so its workspace can go.
pub const EXIT_GRACE: Duration = Duration::from_secs(60);

/// How long an idle runner's process may stay alive while GitHub no longer lists it online (its
/// registration deleted, or the runner offline) before it is stopped as a ghost
/// (actions/runner#4617) instead of holding its slot until `runner.idle_timeout`. Two minutes:
/// a runner's session reconnect or a brief GitHub outage lists it offline for less.
pub const GHOST_AFTER: Duration = Duration::from_secs(2 * 60);

/// Why an attempt failed: the journal's `reason`, a closed set of snake_case kinds that logs and
/// metrics can carry (GitHub's own messages go to `detail`, never to a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// GitHub did not issue a JIT configuration (after bounded retries, or a terminal 403).
    JitRequestFailed,
    /// A JIT configuration was issued but no runner was recorded starting with it.
    JitExpired,
    /// The agent stopped between journalling the attempt and asking GitHub for a JIT.
    LaunchInterrupted,
    /// The runner package could not be prepared or the process could not be spawned.
    ProcessStartFailed,
    /// The process died before it registered, or while idle, without a word about a job.
    ProcessExitedUnexpectedly,
    /// It never registered within `runner.registration_timeout` and was stopped.
    TerminatedAfterRegistrationTimeout,
    /// The runner package did not verify against its published checksum.
    RunnerPackageUnverified,
    /// GitHub refused the runner's version.
    RunnerVersionRejected,
    /// Its runtime held more than the policy's `disk_max`, and it was stopped.
    DiskExceeded,
    /// The kernel killed a process of its cgroup for memory (`memory.events` `oom_kill`).
    OomKilled,
    /// Its logs say a write failed for want of space ("No space left on device"), or its
    /// filesystem had none left.
    DiskFull,
    /// Its process exited non-zero (or by a signal the agent did not send) after it took a job.
    RunnerCrashed,
    /// Its process lived on while GitHub no longer listed it online, past [`GHOST_AFTER`]: it
    /// could never take a job, and was stopped.
    Ghost,
    /// The agent, starting again (after its own crash or the host's reboot), found the runner
    /// gone in the middle of its job, which the journal does not have completed.
    HostLost,
}

impl FailureReason {
    pub const ALL: [FailureReason; 14] = [
        FailureReason::JitRequestFailed,
        FailureReason::JitExpired,
        FailureReason::LaunchInterrupted,
        FailureReason::ProcessStartFailed,
        FailureReason::ProcessExitedUnexpectedly,
        FailureReason::TerminatedAfterRegistrationTimeout,
        FailureReason::RunnerPackageUnverified,
        FailureReason::RunnerVersionRejected,
        FailureReason::DiskExceeded,
        FailureReason::OomKilled,
        FailureReason::DiskFull,
        FailureReason::RunnerCrashed,
        FailureReason::Ghost,
        FailureReason::HostLost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::JitRequestFailed => "jit_request_failed",
            FailureReason::JitExpired => "jit_expired",
            FailureReason::LaunchInterrupted => "launch_interrupted",
            FailureReason::ProcessStartFailed => "process_start_failed",
            FailureReason::ProcessExitedUnexpectedly => "process_exited_unexpectedly",
            FailureReason::TerminatedAfterRegistrationTimeout => {
                "terminated_after_registration_timeout"
            }
            FailureReason::RunnerPackageUnverified => "runner_package_unverified",
            FailureReason::RunnerVersionRejected => "runner_version_rejected",
            FailureReason::DiskExceeded => "disk_exceeded",
            FailureReason::OomKilled => "oom_killed",
            FailureReason::DiskFull => "disk_full",
            FailureReason::RunnerCrashed => "runner_crashed",
            FailureReason::Ghost => "ghost",
            FailureReason::HostLost => "host_lost",
        }
    }

    pub fn parse(name: &str) -> Option<FailureReason> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// An end the infrastructure, not the job's code, names (issue 28): told to the operator
    /// (`runner_failed`) and re-runnable by `policy.rerun_on`.
    pub fn is_attributed(self) -> bool {
        matches!(
            self,
            FailureReason::OomKilled
                | FailureReason::DiskFull
                | FailureReason::RunnerCrashed
                | FailureReason::Ghost
                | FailureReason::HostLost
        )
    }
}

/// How an attempt ends: the journal's outcome and reason together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Conclusion {
    CompletedJob,
    /// Never a failure, never replaced.
    IdleExit,
    Failed(FailureReason),
    Orphaned,
}

impl Conclusion {
    pub fn outcome(self) -> AttemptOutcome {
        match self {
            Conclusion::CompletedJob => AttemptOutcome::CompletedJob,
            Conclusion::IdleExit => AttemptOutcome::IdleExit,
            Conclusion::Failed(_) => AttemptOutcome::Failed,
            Conclusion::Orphaned => AttemptOutcome::Orphaned,
        }
    }

    /// The journal's `reason`: the failure kind, for failures only.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Conclusion::Failed(reason) => Some(reason.as_str()),
            _ => None,
        }
    }

    pub fn is_failure(self) -> bool {
        self.outcome().is_failure()
    }
}

/// What the process adapter found for the journalled identity (pid and start time); the same
/// three answers as `rm_runner::process::ProcessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessObservation {
    /// Alive, and its start time matches the journal's: it is our runner.
    Running,
    /// Our runner ended (a zombie with its identity, not yet reaped).
    Exited,
    /// No process has this identity: reaped, or the pid now belongs to another process
    /// (recycled), or no identity was ever journalled. Dead to us, and never signalled.
    Gone,
}

/// What GitHub's runner list says about the runner's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GithubObservation {
    Registered {
        busy: bool,
    },
    NotRegistered,
    /// The list could not be read: decide nothing that depends on it.
    Unreachable,
}

/// What the runner's `_diag` folder says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvidence {
    /// A `Worker_*.log`: a job ran (or is running).
    RanAJob,
    /// Only `Runner_*.log`: the listener ran and no job was ever handed to it.
    NoJob,
    /// Only `Runner_*.log`, saying GitHub refused the runner's version
    /// ([`rm_runner::refusal`]): it can never take a job.
    VersionRefused,
    /// No `_diag`, or it could not be read in time.
    Unknown,
}

/// What the last measurement of the runner's runtime says against the policy's `disk_max`
/// (judged by [`rm_runner::disk::judge`], which owns the type).
pub use rm_runner::disk::DiskUse;

/// How the runner's process ended, as the agent saw when it reaped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitSeen {
    /// It exited with this status (under `isolation = "user"` a signal reaches the agent as
    /// 128 + its number, as a shell reports it).
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl ExitSeen {
    pub fn success(self) -> bool {
        self == ExitSeen::Code(0)
    }

    /// "exit status 3", "signal 9".
    pub fn describe(self) -> String {
        match self {
            ExitSeen::Code(code) => format!("exit status {code}"),
            ExitSeen::Signal(signal) => format!("signal {signal}"),
        }
    }
}

/// What else supervision knows that names why a runner ended (or must be stopped): gathered
/// beside the observation, each from its own source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Findings {
    /// How the process ended, if this agent reaped it; `None` for a runner it adopted, or one
    /// that ended while no agent ran.
    pub exit: Option<ExitSeen>,
    /// Processes the kernel killed for memory in the runner's cgroup (`memory.events`).
    pub oom_kills: u64,
    /// Its logs or its filesystem say the disk was full.
    pub disk_full: bool,
    /// How long supervision has watched the runner alive while GitHub did not list it online;
    /// `None` while it is listed (or not watched yet).
    pub unlisted_for: Option<Duration>,
    /// Startup recovery: the previous agent run, not this one, last saw the runner.
    pub recovering: bool,
    /// The attempt's job ended: the journal has it completed (GitHub said so), or the runner's
    /// console said so.
    pub job_completed: bool,
}

/// One observation of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub process: ProcessObservation,
    pub github: GithubObservation,
    pub evidence: JobEvidence,
    pub disk: DiskUse,
    pub findings: Findings,
}

/// The part of a journalled attempt the decision reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptFacts {
    pub state: AttemptState,
    /// When the current state was entered.
    pub state_changed_at_ms: UnixMs,
    pub stop_intent: Option<StopIntent>,
}

impl AttemptFacts {
    /// Time spent in the current state; zero if the clock went backwards.
    fn in_state(&self, now: UnixMs) -> Duration {
        now.duration_since(self.state_changed_at_ms)
    }

    /// Whether the journalled stop intent was meant for the state the attempt is in now. An
    /// intent from an earlier state is stale: the runner outlived that signal and moved on.
    fn intent_for_now(&self) -> Option<StopIntent> {
        self.stop_intent
            .filter(|intent| intent.applies_to().contains(&self.state))
    }
}

impl From<&AttemptRecord> for AttemptFacts {
    fn from(record: &AttemptRecord) -> Self {
        AttemptFacts {
            state: record.state,
            state_changed_at_ms: record.state_changed_at_ms,
            stop_intent: record.stop_intent,
        }
    }
}

/// The timers the decision applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `runner.registration_timeout`: spawned, not registered by then → stopped (a failure).
    pub registration: Duration,
    /// `runner.idle_timeout`: registered, no job by then → stopped (an idle exit).
    pub idle: Duration,
    /// How long `allocated`/`jit_received` may last before the launch counts as abandoned.
    pub launch: Duration,
    /// How long a concluded attempt's process may keep running.
    pub exit_grace: Duration,
    /// How long an idle runner may stay unlisted while alive before it is stopped as a ghost.
    pub ghost: Duration,
}

impl Timeouts {
    /// The timers for supervision while this agent runs and may have launches in flight.
    pub fn supervision(registration: Duration, idle: Duration) -> Timeouts {
        Timeouts {
            registration,
            idle,
            launch: LAUNCH_TIMEOUT,
            exit_grace: EXIT_GRACE,
            ghost: GHOST_AFTER,
        }
    }

    /// The same at startup: no launch of this process can own an attempt yet, so an attempt
    /// left `allocated` or `jit_received` by the previous run is decided at once.
    pub fn at_startup(self) -> Timeouts {
        Timeouts {
            launch: Duration::ZERO,
            ..self
        }
    }
}

/// What to do with the attempt now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Cleaned: nothing is left to do.
    Nothing,
    /// Nothing yet: a launch may still own it, or a concluded process is in its exit grace.
    Wait,
    /// GitHub could not be asked; decide nothing. At startup this keeps recovery incomplete.
    Defer,
    /// Alive and ours: keep supervising it as it is. A `jit_received` attempt first records
    /// `starting` with the identity the process adapter recovered.
    Adopt,
    /// It moved: record `idle` (`Attempts::mark_idle` from the current state) or `busy`
    /// (`Attempts::mark_busy`). Losing that compare-and-set means someone else moved it first.
    Observe(AttemptState),
    /// Journal this stop intent (compare-and-set on the current state), then, only if that won,
    /// signal the process; conclude once it is seen dead.
    Terminate(StopIntent),
    /// Deregister if GitHub still lists it (best effort, never blocking), conclude from the
    /// current state (`Attempts::conclude`), then clean.
    Conclude(Conclusion),
    /// Concluded and its process is gone: remove or scrub the workspace and release the uid,
    /// then deregister if listed, then mark it cleaned.
    Clean,
}

/// Decides what supervision (or startup recovery) does with one attempt.
pub fn recovery_decision(
    attempt: &AttemptFacts,
    observation: &Observation,
    timeouts: &Timeouts,
    now: UnixMs,
) -> Decision {
    use AttemptState::*;
    let in_state = attempt.in_state(now);
    // An allocated attempt has started no process: whatever the adapter reports is not its
    // runner, so it is never adopted or signalled.
    let running = observation.process == ProcessObservation::Running && attempt.state != Allocated;
    match attempt.state {
        Cleaned => Decision::Nothing,
        Finished | Failed | Orphaned => {
            if !running {
                Decision::Clean
            } else if attempt.intent_for_now() == Some(StopIntent::Concluded)
                || in_state >= timeouts.exit_grace
            {
                Decision::Terminate(StopIntent::Concluded)
            } else {
                Decision::Wait
            }
        }
        Allocated | JitReceived => {
            if in_state < timeouts.launch {
                Decision::Wait
            } else if observation.github == GithubObservation::Unreachable {
                Decision::Defer
            } else if running {
                Decision::Adopt
            } else {
                Decision::Conclude(abandoned_launch(attempt.state, observation))
            }
        }
        Starting | Idle | Busy => {
            if running
                && (observation.disk == DiskUse::Over
                    || attempt.intent_for_now() == Some(StopIntent::DiskExceeded))
            {
                // Stopped, and again while it lives, whatever GitHub says or cannot say.
                Decision::Terminate(StopIntent::DiskExceeded)
            } else if observation.github == GithubObservation::Unreachable {
                Decision::Defer
            } else if running {
                alive(attempt, observation, timeouts, in_state)
            } else {
                Decision::Conclude(dead(attempt, observation))
            }
        }
    }
}

/// An `allocated` or `jit_received` attempt with no live runner, past the launch window.
fn abandoned_launch(state: AttemptState, observation: &Observation) -> Conclusion {
    match (state, observation.evidence, observation.github) {
        // Spawned just before a crash, and it ran its job before anyone recorded the start.
        (AttemptState::JitReceived, JobEvidence::RanAJob, _) => Conclusion::CompletedJob,
        (AttemptState::JitReceived, _, _) => Conclusion::Failed(FailureReason::JitExpired),
        // The JIT was issued but the crash came before it was journalled.
        (_, _, GithubObservation::Registered { .. }) => {
            Conclusion::Failed(FailureReason::JitExpired)
        }
        _ => Conclusion::Failed(FailureReason::LaunchInterrupted),
    }
}

/// A live runner (`starting`, `idle`, `busy`) whose process is ours and alive; GitHub answered.
fn alive(
    attempt: &AttemptFacts,
    observation: &Observation,
    timeouts: &Timeouts,
    in_state: Duration,
) -> Decision {
    use AttemptState::*;
    let github_busy = observation.github == GithubObservation::Registered { busy: true };
    let has_job = github_busy || observation.evidence == JobEvidence::RanAJob;
    match attempt.state {
        Busy => {
            // GitHub withdrew the assignment and no worker ever started: back to idle (the idle
            // timer starts again). Otherwise a busy runner is left alone, whatever GitHub says:
            // an ephemeral runner is unlisted as soon as its job is done, while it still exits.
            if observation.github == (GithubObservation::Registered { busy: false })
                && observation.evidence == JobEvidence::NoJob
            {
                Decision::Observe(Idle)
            } else {
                Decision::Adopt
            }
        }
        Starting | Idle if has_job => Decision::Observe(Busy),
        Starting if observation.github == (GithubObservation::Registered { busy: false }) => {
            Decision::Observe(Idle)
        }
        state => {
            // Signalled already, and still alive: signal again (the adapter escalates). Not a
            // scale-down: its intent is journalled before the scale set is asked to let the
            // runner go, and only that effect, once the service removed it, stops the runner
            // (a refusal means the service just handed it a job).
            if let Some(intent) = attempt
                .intent_for_now()
                .filter(|i| *i != StopIntent::ScaleDown)
            {
                return Decision::Terminate(intent);
            }
            // Alive, idle, and GitHub has not listed it online for a while: it can never take a
            // job (a ghost). Stopped now rather than at the idle timeout.
            if state == Idle
                && observation
                    .findings
                    .unlisted_for
                    .is_some_and(|unlisted| unlisted >= timeouts.ghost)
            {
                return Decision::Terminate(StopIntent::Ghost);
            }
            let (limit, intent) = if state == Starting {
                (timeouts.registration, StopIntent::RegistrationTimeout)
            } else {
                (timeouts.idle, StopIntent::IdleTimeout)
            };
            if in_state >= limit {
                Decision::Terminate(intent)
            } else {
                Decision::Adopt
            }
        }
    }
}

/// A live runner (`starting`, `idle`, `busy`) whose process is dead or not ours; GitHub answered.
/// The causes the agent stopped it for come first, then what the kernel and the runner's logs
/// prove (memory, disk), then how its process ended against what the journal knows of its job.
fn dead(attempt: &AttemptFacts, observation: &Observation) -> Conclusion {
    use AttemptState::*;
    let findings = &observation.findings;
    // Stopped for its disk, or as a ghost: that is why it ended, whether it ran a job or not.
    match attempt.intent_for_now() {
        Some(StopIntent::DiskExceeded) => return Conclusion::Failed(FailureReason::DiskExceeded),
        Some(StopIntent::Ghost) => return Conclusion::Failed(FailureReason::Ghost),
        _ => {}
    }
    if findings.oom_kills > 0 {
        return Conclusion::Failed(FailureReason::OomKilled);
    }
    if findings.disk_full {
        return Conclusion::Failed(FailureReason::DiskFull);
    }
    let github_busy = observation.github == GithubObservation::Registered { busy: true };
    let had_job =
        observation.evidence == JobEvidence::RanAJob || attempt.state == Busy || github_busy;
    if had_job {
        // A non-zero exit the agent did not cause (no stop intent, not even a stale one).
        if let Some(exit) = findings.exit
            && !exit.success()
            && attempt.stop_intent.is_none()
        {
            return Conclusion::Failed(FailureReason::RunnerCrashed);
        }
        // Gone while no agent watched, its job not completed: the host (or the agent) was lost
        // under it. A job completed meanwhile ended as jobs do.
        if findings.exit.is_none() && findings.recovering && !findings.job_completed {
            return Conclusion::Failed(FailureReason::HostLost);
        }
    }
    if observation.evidence == JobEvidence::RanAJob {
        return Conclusion::CompletedJob;
    }
    // Whatever state it reached and whoever stopped it: the runner's own words name the cause.
    if observation.evidence == JobEvidence::VersionRefused {
        return Conclusion::Failed(FailureReason::RunnerVersionRejected);
    }
    match attempt.intent_for_now() {
        Some(StopIntent::IdleTimeout | StopIntent::ScaleDown) => return Conclusion::IdleExit,
        Some(StopIntent::RegistrationTimeout) => {
            return Conclusion::Failed(FailureReason::TerminatedAfterRegistrationTimeout);
        }
        Some(StopIntent::Concluded | StopIntent::DiskExceeded | StopIntent::Ghost) | None => {}
    }
    match (attempt.state, observation.evidence) {
        (Starting, JobEvidence::NoJob) => {
            Conclusion::Failed(FailureReason::ProcessExitedUnexpectedly)
        }
        (_, JobEvidence::NoJob) => Conclusion::IdleExit,
        (Busy, _) => Conclusion::Orphaned,
        _ if github_busy => Conclusion::Orphaned,
        _ => Conclusion::Failed(FailureReason::ProcessExitedUnexpectedly),
    }
}

#[cfg(test)]
mod tests;
