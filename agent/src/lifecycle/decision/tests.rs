//! The decision table, row by row, and a sweep of every state × process × GitHub × evidence ×
//! intent × time that checks the rules no row may break (never signal what is not proven ours,
//! never stop a busy runner, never call an idle exit a failure, only moves the journal accepts).

use std::time::Duration;

use super::*;
use AttemptState::*;
use GithubObservation::{NotRegistered, Registered, Unreachable};
use JobEvidence::{NoJob, RanAJob, Unknown};
use ProcessObservation::{Exited, Gone, Running};

/// The prior art's test timers: 10 s each.
const T: Timeouts = Timeouts {
    registration: Duration::from_secs(10),
    idle: Duration::from_secs(10),
    launch: Duration::from_secs(10),
    exit_grace: Duration::from_secs(10),
    ghost: Duration::from_secs(10),
};

const NOW: UnixMs = UnixMs::new(1_000_000);

const IDLE: GithubObservation = Registered { busy: false };
const BUSY: GithubObservation = Registered { busy: true };

/// What the process adapter, GitHub and `_diag` say.
type Seen = (ProcessObservation, GithubObservation, JobEvidence);

/// A table row: state, seconds in it, journalled intent, what is seen, the decision.
type Row = (AttemptState, i64, Option<StopIntent>, Seen, Decision);

fn decide(
    state: AttemptState,
    secs_in_state: i64,
    intent: Option<StopIntent>,
    observation: Seen,
) -> Decision {
    decide_disk(state, secs_in_state, intent, observation, DiskUse::Within)
}

/// [`decide`] with what the disk watch says.
fn decide_disk(
    state: AttemptState,
    secs_in_state: i64,
    intent: Option<StopIntent>,
    observation: Seen,
    disk: DiskUse,
) -> Decision {
    decide_all(
        state,
        secs_in_state,
        intent,
        observation,
        disk,
        Findings::default(),
    )
}

/// The decision with everything given: the disk watch's word and the findings.
fn decide_all(
    state: AttemptState,
    secs_in_state: i64,
    intent: Option<StopIntent>,
    (process, github, evidence): Seen,
    disk: DiskUse,
    findings: Findings,
) -> Decision {
    recovery_decision(
        &AttemptFacts {
            state,
            state_changed_at_ms: NOW.saturating_add_ms(-secs_in_state * 1000),
            stop_intent: intent,
        },
        &Observation {
            process,
            github,
            evidence,
            disk,
            findings,
        },
        &T,
        NOW,
    )
}

fn failed(reason: FailureReason) -> Decision {
    Decision::Conclude(Conclusion::Failed(reason))
}

#[test]
fn the_decision_table() {
    use Decision::*;
    use FailureReason::*;
    use StopIntent::*;
    #[rustfmt::skip]
    let rows: &[Row] = &[
        // Starting, alive, not registered: adopt; at the registration timeout, stop (intent first).
        (Starting, 0, None, (Running, NotRegistered, Unknown), Adopt),
        (Starting, 9, None, (Running, NotRegistered, NoJob), Adopt),
        (Starting, 10, None, (Running, NotRegistered, NoJob), Terminate(RegistrationTimeout)),
        (Starting, 3600, None, (Running, NotRegistered, Unknown), Terminate(RegistrationTimeout)),
        // Already signalled and still alive: signal again.
        (Starting, 1, Some(RegistrationTimeout), (Running, NotRegistered, Unknown), Terminate(RegistrationTimeout)),
        // Registered: record what GitHub says, whatever the timer.
        (Starting, 0, None, (Running, IDLE, NoJob), Observe(Idle)),
        (Starting, 3600, None, (Running, IDLE, NoJob), Observe(Idle)),
        (Starting, 3600, Some(RegistrationTimeout), (Running, IDLE, NoJob), Observe(Idle)),
        (Starting, 0, None, (Running, BUSY, Unknown), Observe(Busy)),
        (Starting, 3600, None, (Running, NotRegistered, RanAJob), Observe(Busy)),
        (Idle, 0, None, (Running, BUSY, NoJob), Observe(Busy)),
        (Idle, 3600, None, (Running, IDLE, RanAJob), Observe(Busy)),
        (Idle, 3600, Some(IdleTimeout), (Running, BUSY, Unknown), Observe(Busy)),
        (Busy, 0, None, (Running, BUSY, RanAJob), Adopt),
        // An assignment GitHub withdrew before any worker started: back to idle.
        (Busy, 0, None, (Running, IDLE, NoJob), Observe(Idle)),
        (Busy, 0, None, (Running, IDLE, Unknown), Adopt),
        (Busy, 0, None, (Running, IDLE, RanAJob), Adopt),
        // A busy runner is never stopped: unlisted (its job done, it is exiting), or forever.
        (Busy, 3600, None, (Running, NotRegistered, Unknown), Adopt),
        (Busy, 3600, Some(IdleTimeout), (Running, NotRegistered, NoJob), Adopt),
        // Idle past idle_timeout: stopped as an idle exit; at 9 s nothing.
        (Idle, 9, None, (Running, IDLE, NoJob), Adopt),
        (Idle, 10, None, (Running, IDLE, NoJob), Terminate(IdleTimeout)),
        (Idle, 10, None, (Running, NotRegistered, Unknown), Terminate(IdleTimeout)),
        (Idle, 1, Some(IdleTimeout), (Running, IDLE, NoJob), Terminate(IdleTimeout)),
        // A registration-timeout intent from before it registered is stale once it is idle.
        (Idle, 1, Some(RegistrationTimeout), (Running, IDLE, NoJob), Adopt),
        // Dead before it registered.
        (Starting, 1, None, (Exited, NotRegistered, Unknown), failed(ProcessExitedUnexpectedly)),
        (Starting, 1, None, (Exited, NotRegistered, NoJob), failed(ProcessExitedUnexpectedly)),
        (Starting, 1, None, (Gone, IDLE, NoJob), failed(ProcessExitedUnexpectedly)),
        // Dead after the stop we journalled.
        (Starting, 20, Some(RegistrationTimeout), (Exited, NotRegistered, NoJob), failed(TerminatedAfterRegistrationTimeout)),
        (Starting, 20, Some(RegistrationTimeout), (Gone, IDLE, Unknown), failed(TerminatedAfterRegistrationTimeout)),
        (Idle, 20, Some(IdleTimeout), (Exited, IDLE, Unknown), Conclude(Conclusion::IdleExit)),
        (Idle, 20, Some(IdleTimeout), (Exited, NotRegistered, NoJob), Conclude(Conclusion::IdleExit)),
        // A scale set's surplus runner, removed from the scale set and stopped: an idle exit.
        // Still alive, it is not signalled by the decision (only the scale-down, once the
        // service let it go), and its idle timeout still holds; busy since, the intent is
        // stale and it is left alone.
        (Idle, 1, Some(ScaleDown), (Exited, NotRegistered, NoJob), Conclude(Conclusion::IdleExit)),
        (Idle, 1, Some(ScaleDown), (Running, IDLE, NoJob), Adopt),
        (Idle, 10, Some(ScaleDown), (Running, IDLE, NoJob), Terminate(IdleTimeout)),
        (Busy, 1, Some(ScaleDown), (Running, BUSY, RanAJob), Adopt),
        // Evidence beats intent: a Worker log means it ran a job.
        (Starting, 20, Some(RegistrationTimeout), (Exited, NotRegistered, RanAJob), Conclude(Conclusion::CompletedJob)),
        (Idle, 20, Some(IdleTimeout), (Exited, NotRegistered, RanAJob), Conclude(Conclusion::CompletedJob)),
        // Dead with the runner's own logs as the word on its job.
        (Starting, 1, None, (Exited, NotRegistered, RanAJob), Conclude(Conclusion::CompletedJob)),
        (Idle, 1, None, (Exited, NotRegistered, RanAJob), Conclude(Conclusion::CompletedJob)),
        (Busy, 1, None, (Exited, NotRegistered, RanAJob), Conclude(Conclusion::CompletedJob)),
        (Busy, 1, None, (Gone, BUSY, RanAJob), Conclude(Conclusion::CompletedJob)),
        (Idle, 1, None, (Exited, NotRegistered, NoJob), Conclude(Conclusion::IdleExit)),
        (Busy, 1, None, (Exited, NotRegistered, NoJob), Conclude(Conclusion::IdleExit)),
        // Dead while busy with nothing to say the job completed: orphaned.
        (Busy, 1, None, (Exited, NotRegistered, Unknown), Conclude(Conclusion::Orphaned)),
        (Busy, 1, None, (Gone, BUSY, Unknown), Conclude(Conclusion::Orphaned)),
        (Idle, 1, None, (Exited, BUSY, Unknown), Conclude(Conclusion::Orphaned)),
        (Idle, 1, None, (Exited, IDLE, Unknown), failed(ProcessExitedUnexpectedly)),
        // A recycled pid is dead to us, and never signalled, however long past its timers.
        (Starting, 3600, None, (Gone, NotRegistered, Unknown), failed(ProcessExitedUnexpectedly)),
        (Idle, 3600, None, (Gone, IDLE, NoJob), Conclude(Conclusion::IdleExit)),
        (Idle, 3600, Some(IdleTimeout), (Gone, IDLE, Unknown), Conclude(Conclusion::IdleExit)),
        // Without GitHub nothing live is decided.
        (Starting, 3600, None, (Running, Unreachable, Unknown), Defer),
        (Starting, 1, None, (Exited, Unreachable, RanAJob), Defer),
        (Idle, 3600, None, (Running, Unreachable, NoJob), Defer),
        (Busy, 1, None, (Exited, Unreachable, Unknown), Defer),
        (JitReceived, 3600, None, (Exited, Unreachable, Unknown), Defer),
        // A launch in flight is left to its launcher.
        (Allocated, 9, None, (Exited, NotRegistered, Unknown), Wait),
        (JitReceived, 9, None, (Exited, IDLE, Unknown), Wait),
        (JitReceived, 9, None, (Running, Unreachable, Unknown), Wait),
        // JIT issued, no runner recorded, too long: expired (and deregistered if listed).
        (JitReceived, 11, None, (Exited, NotRegistered, Unknown), failed(JitExpired)),
        (JitReceived, 11, None, (Gone, IDLE, NoJob), failed(JitExpired)),
        (JitReceived, 11, None, (Exited, NotRegistered, RanAJob), Conclude(Conclusion::CompletedJob)),
        // Spawned just before a crash, its start never recorded: adopt it.
        (JitReceived, 11, None, (Running, NotRegistered, Unknown), Adopt),
        // Allocated and abandoned: a JIT issued but never journalled is expired; else interrupted.
        (Allocated, 11, None, (Exited, IDLE, Unknown), failed(JitExpired)),
        (Allocated, 11, None, (Gone, NotRegistered, Unknown), failed(LaunchInterrupted)),
        // An allocated attempt has no process: a live pid is not its runner.
        (Allocated, 11, None, (Running, NotRegistered, Unknown), failed(LaunchInterrupted)),
        // Concluded: clean once the process is gone; give a live one its exit grace, then stop it.
        (Finished, 0, None, (Exited, NotRegistered, RanAJob), Clean),
        (Failed, 0, None, (Gone, IDLE, Unknown), Clean),
        (Orphaned, 0, None, (Exited, Unreachable, Unknown), Clean),
        (Finished, 9, None, (Running, NotRegistered, RanAJob), Wait),
        (Finished, 10, None, (Running, NotRegistered, RanAJob), Terminate(Concluded)),
        (Failed, 1, Some(Concluded), (Running, Unreachable, Unknown), Terminate(Concluded)),
        (Failed, 1, Some(RegistrationTimeout), (Running, NotRegistered, Unknown), Wait),
        (Cleaned, 0, None, (Running, BUSY, RanAJob), Nothing),
        (Cleaned, 3600, None, (Exited, Unreachable, Unknown), Nothing),
    ];
    for (state, secs, intent, observation, expected) in rows {
        assert_eq!(
            decide(*state, *secs, *intent, *observation),
            *expected,
            "{state:?} {secs}s {intent:?} {observation:?}"
        );
    }
}

#[test]
fn at_startup_an_abandoned_launch_is_decided_at_once() {
    let startup = T.at_startup();
    let facts = AttemptFacts {
        state: JitReceived,
        state_changed_at_ms: NOW,
        stop_intent: None,
    };
    let dead = Observation {
        process: Exited,
        github: IDLE,
        evidence: Unknown,
        disk: DiskUse::Within,
        findings: Findings::default(),
    };
    assert_eq!(recovery_decision(&facts, &dead, &T, NOW), Decision::Wait);
    assert_eq!(
        recovery_decision(&facts, &dead, &startup, NOW),
        failed(FailureReason::JitExpired)
    );
    assert_eq!(startup.registration, T.registration);
    let supervision = Timeouts::supervision(Duration::from_secs(300), Duration::from_secs(600));
    assert_eq!(
        (supervision.launch, supervision.exit_grace),
        (LAUNCH_TIMEOUT, EXIT_GRACE)
    );
}

#[test]
fn a_clock_that_went_backwards_starts_no_timer() {
    let facts = AttemptFacts {
        state: Idle,
        state_changed_at_ms: NOW.saturating_add_ms(3_600_000),
        stop_intent: None,
    };
    let observation = Observation {
        process: Running,
        github: IDLE,
        evidence: NoJob,
        disk: DiskUse::Within,
        findings: Findings::default(),
    };
    assert_eq!(
        recovery_decision(&facts, &observation, &T, NOW),
        Decision::Adopt
    );
}

/// The stop-then-observe walk: what a timeout stop ends as once the process is seen dead.
#[test]
fn a_timed_out_runner_ends_as_its_intent_says_and_an_idle_exit_is_never_a_failure() {
    for (state, intent, ends) in [
        (Idle, StopIntent::IdleTimeout, Conclusion::IdleExit),
        (
            Starting,
            StopIntent::RegistrationTimeout,
            Conclusion::Failed(FailureReason::TerminatedAfterRegistrationTimeout),
        ),
    ] {
        assert_eq!(
            decide(state, 10, None, (Running, NotRegistered, NoJob)),
            Decision::Terminate(intent)
        );
        assert!(intent.applies_to().contains(&state));
        for process in [Exited, Gone] {
            for github in [NotRegistered, IDLE] {
                for evidence in [NoJob, Unknown] {
                    assert_eq!(
                        decide(state, 11, Some(intent), (process, github, evidence)),
                        Decision::Conclude(ends),
                        "{state:?} {process:?} {github:?} {evidence:?}"
                    );
                }
            }
        }
    }
    assert!(!Conclusion::IdleExit.is_failure());
    assert_eq!(Conclusion::IdleExit.outcome(), AttemptOutcome::IdleExit);
    assert_eq!(Conclusion::IdleExit.reason(), None);
}

#[test]
fn conclusions_map_to_the_journals_outcomes_and_reasons() {
    assert_eq!(
        Conclusion::Failed(FailureReason::JitExpired).reason(),
        Some("jit_expired")
    );
    assert!(Conclusion::Failed(FailureReason::JitExpired).is_failure());
    assert!(Conclusion::Orphaned.is_failure());
    assert!(!Conclusion::CompletedJob.is_failure());
    assert_eq!(Conclusion::Orphaned.outcome(), AttemptOutcome::Orphaned);
    let mut names: Vec<_> = FailureReason::ALL.iter().map(|r| r.as_str()).collect();
    for reason in FailureReason::ALL {
        assert_eq!(FailureReason::parse(reason.as_str()), Some(reason));
    }
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), FailureReason::ALL.len());
}

/// Every combination, checked against the rules that hold whatever the row.
#[test]
fn no_combination_breaks_the_rules() {
    let processes = [Running, Exited, Gone];
    let githubs = [IDLE, BUSY, NotRegistered, Unreachable];
    let evidences = [RanAJob, NoJob, Unknown];
    let intents = [
        None,
        Some(StopIntent::RegistrationTimeout),
        Some(StopIntent::IdleTimeout),
        Some(StopIntent::Concluded),
        Some(StopIntent::DiskExceeded),
    ];
    let mut seen = 0;
    for state in AttemptState::ALL {
        for secs in [0, 9, 10, 3600] {
            for intent in intents {
                for process in processes {
                    for github in githubs {
                        for evidence in evidences {
                            for disk in [DiskUse::Within, DiskUse::Over] {
                                let decision = decide_disk(
                                    state,
                                    secs,
                                    intent,
                                    (process, github, evidence),
                                    disk,
                                );
                                let case = format!(
                                    "{state:?} {secs}s {intent:?} {process:?} {github:?} {evidence:?} {disk:?} -> {decision:?}"
                                );
                                let disk_stop = disk == DiskUse::Over
                                    || intent.is_some_and(|i| {
                                        i == StopIntent::DiskExceeded
                                            && i.applies_to().contains(&state)
                                    });
                                check(state, process, github, evidence, disk_stop, decision, &case);
                                seen += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(seen, 9 * 4 * 5 * 3 * 4 * 3 * 2);
}

/// `disk_stop`: the runtime is over its `disk_max`, or a stop for it is journalled for this
/// state: the one stop that may hit a busy runner, or one GitHub could not be asked about.
fn check(
    state: AttemptState,
    process: ProcessObservation,
    github: GithubObservation,
    evidence: JobEvidence,
    disk_stop: bool,
    decision: Decision,
    case: &str,
) {
    let has_job = github == BUSY || evidence == RanAJob;
    assert_eq!(decision == Decision::Nothing, state == Cleaned, "{case}");
    // A live runner past its disk bound is stopped, whatever else is seen, and only then.
    let live_and_ours = process == Running && matches!(state, Starting | Idle | Busy);
    assert_eq!(
        decision == Decision::Terminate(StopIntent::DiskExceeded),
        disk_stop && live_and_ours,
        "{case}"
    );
    if let Decision::Terminate(StopIntent::DiskExceeded) = decision {
        return;
    }
    if let Decision::Conclude(conclusion) = decision
        && disk_stop
        && state.counts_against_capacity()
        && state != Allocated
        && state != JitReceived
    {
        // Dead after the stop for its disk: that is its cause, even with a job's logs.
        if conclusion == Conclusion::Failed(FailureReason::DiskExceeded) {
            assert!(process != Running, "{case}");
            return;
        }
    }
    match decision {
        Decision::Terminate(intent) => {
            // Only a process proven ours, never an allocated attempt's, never a busy runner.
            assert_eq!(process, Running, "{case}");
            assert_ne!(state, Allocated, "{case}");
            assert_ne!(state, Busy, "{case}");
            if state.counts_against_capacity() {
                assert!(!has_job, "{case}");
                assert_ne!(github, Unreachable, "{case}");
            }
            // The intent's compare-and-set can win from here.
            assert!(intent.applies_to().contains(&state), "{case}");
        }
        Decision::Observe(to) => {
            assert!(AttemptState::can_move(state, to), "{case}");
            assert_eq!(process, Running, "{case}");
            assert!(matches!(to, Idle | Busy), "{case}");
        }
        Decision::Conclude(conclusion) => {
            assert!(state.counts_against_capacity(), "{case}");
            assert!(
                AttemptState::can_move(state, conclusion.outcome().terminal_state()),
                "{case}"
            );
            assert!(process != Running || state == Allocated, "{case}");
            assert_ne!(github, Unreachable, "{case}");
            if evidence == RanAJob && state != Allocated {
                assert_eq!(conclusion, Conclusion::CompletedJob, "{case}");
            }
            if conclusion == Conclusion::IdleExit {
                assert!(!conclusion.is_failure(), "{case}");
                assert_ne!(evidence, RanAJob, "{case}");
            }
        }
        Decision::Clean => {
            assert!(state.is_terminal(), "{case}");
            assert_ne!(process, Running, "{case}");
        }
        Decision::Adopt => {
            assert!(state.counts_against_capacity(), "{case}");
            assert_eq!(process, Running, "{case}");
            assert_ne!(state, Allocated, "{case}");
        }
        Decision::Defer => {
            assert_eq!(github, Unreachable, "{case}");
            assert!(state.counts_against_capacity(), "{case}");
        }
        Decision::Wait | Decision::Nothing => {}
    }
    // Without GitHub a live attempt is only ever deferred or left to its launcher.
    if github == Unreachable && state.counts_against_capacity() {
        assert!(
            matches!(decision, Decision::Defer | Decision::Wait),
            "{case}"
        );
    }
}

/// A runner GitHub refused for its version (its listener log says so) failed for that reason,
/// in whatever live state it died, where it would otherwise be an exit without a cause (or an
/// idle exit, not a failure at all: a refused JIT runner is registered, then exits).
#[test]
fn a_runner_refused_for_its_version_fails_for_that_reason() {
    let refused = JobEvidence::VersionRefused;
    for (state, github) in [
        (Starting, NotRegistered),
        (Starting, IDLE),
        (Idle, IDLE),
        (Idle, NotRegistered),
    ] {
        for process in [Exited, Gone] {
            assert_eq!(
                decide(state, 1, None, (process, github, refused)),
                failed(FailureReason::RunnerVersionRejected),
                "{state:?} {process:?} {github:?}"
            );
        }
    }
    // Without those words the same runner is an exit without a known cause, or an idle exit.
    assert_eq!(
        decide(Starting, 1, None, (Exited, NotRegistered, NoJob)),
        failed(FailureReason::ProcessExitedUnexpectedly)
    );
    assert_eq!(
        decide(Idle, 1, None, (Exited, IDLE, NoJob)),
        Decision::Conclude(Conclusion::IdleExit)
    );
    // A Worker log still means a job ran.
    assert_eq!(
        decide(Idle, 1, None, (Exited, IDLE, RanAJob)),
        Decision::Conclude(Conclusion::CompletedJob)
    );
}

/// The disk bound: a live runner past it is stopped, busy or not and with or without GitHub,
/// and once dead it failed for that, whatever its logs say about a job.
#[test]
fn a_runner_past_its_disk_bound_is_stopped_busy_or_not_and_fails_for_it() {
    use DiskUse::{Over, Within};
    use StopIntent::DiskExceeded;
    for state in [Starting, Idle, Busy] {
        for github in [IDLE, BUSY, NotRegistered, Unreachable] {
            for evidence in [RanAJob, NoJob, Unknown] {
                let seen = (Running, github, evidence);
                assert_eq!(
                    decide_disk(state, 1, None, seen, Over),
                    Decision::Terminate(DiskExceeded),
                    "{state:?} {github:?} {evidence:?}"
                );
                // Signalled already and still alive (it may have deleted files meanwhile).
                assert_eq!(
                    decide_disk(state, 1, Some(DiskExceeded), seen, Within),
                    Decision::Terminate(DiskExceeded),
                    "{state:?} {github:?} {evidence:?}"
                );
                for process in [Exited, Gone] {
                    let dead = decide_disk(
                        state,
                        1,
                        Some(DiskExceeded),
                        (process, github, evidence),
                        Within,
                    );
                    let expected = if github == Unreachable {
                        Decision::Defer
                    } else {
                        failed(FailureReason::DiskExceeded)
                    };
                    assert_eq!(
                        dead, expected,
                        "{state:?} {process:?} {github:?} {evidence:?}"
                    );
                }
            }
        }
    }
    // Within its bound a busy runner is still never stopped.
    assert_eq!(
        decide_disk(Busy, 3600, None, (Running, NotRegistered, Unknown), Within),
        Decision::Adopt
    );
    // Nothing live to stop: a launch in flight, a concluded runner (cleanup removes its files).
    assert_eq!(
        decide_disk(JitReceived, 1, None, (Running, IDLE, Unknown), Over),
        Decision::Wait
    );
    assert_eq!(
        decide_disk(Finished, 0, None, (Exited, NotRegistered, RanAJob), Over),
        Decision::Clean
    );
    // A runner that died by itself before it was stopped ends as it would have.
    assert_eq!(
        decide_disk(Busy, 1, None, (Exited, NotRegistered, RanAJob), Over),
        Decision::Conclude(Conclusion::CompletedJob)
    );
    assert_eq!(
        Conclusion::Failed(FailureReason::DiskExceeded).reason(),
        Some("disk_exceeded")
    );
}

/// [`decide`] with findings.
fn decide_with(
    state: AttemptState,
    secs_in_state: i64,
    intent: Option<StopIntent>,
    seen: Seen,
    findings: Findings,
) -> Decision {
    decide_all(
        state,
        secs_in_state,
        intent,
        seen,
        DiskUse::Within,
        findings,
    )
}

/// Issue 28: an end that says what happened. Each row: the attempt, what is seen, the
/// findings, the decision.
#[test]
fn ends_are_attributed_to_their_cause() {
    use Decision::*;
    use FailureReason::*;
    let none = Findings::default();
    let exit = |code| Findings {
        exit: Some(ExitSeen::Code(code)),
        ..none
    };
    let oom = Findings {
        oom_kills: 1,
        exit: Some(ExitSeen::Code(0)),
        ..none
    };
    let full = Findings {
        disk_full: true,
        exit: Some(ExitSeen::Code(1)),
        ..none
    };
    let recovering = Findings {
        recovering: true,
        ..none
    };
    let recovering_done = Findings {
        job_completed: true,
        ..recovering
    };
    let unlisted = |secs| Findings {
        unlisted_for: Some(Duration::from_secs(secs)),
        ..none
    };
    #[rustfmt::skip]
    let rows: &[(AttemptState, Option<StopIntent>, Seen, Findings, Decision)] = &[
        // The kernel's OOM count names the cause, whatever the exit and the evidence said.
        (Busy, None, (Exited, NotRegistered, RanAJob), oom, failed(OomKilled)),
        (Idle, None, (Gone, NotRegistered, NoJob), oom, failed(OomKilled)),
        (Starting, None, (Gone, NotRegistered, Unknown), oom, failed(OomKilled)),
        // A write that failed for want of space.
        (Busy, None, (Exited, NotRegistered, RanAJob), full, failed(DiskFull)),
        // A non-zero exit or a signal mid-job, which the agent did not cause.
        (Busy, None, (Exited, NotRegistered, RanAJob), exit(3), failed(RunnerCrashed)),
        (Busy, None, (Exited, BUSY, Unknown), exit(137), failed(RunnerCrashed)),
        (Idle, None, (Exited, NotRegistered, RanAJob), Findings { exit: Some(ExitSeen::Signal(11)), ..none }, failed(RunnerCrashed)),
        // Exit 0 after a job: it ran its job.
        (Busy, None, (Exited, NotRegistered, RanAJob), exit(0), Conclude(Conclusion::CompletedJob)),
        // A non-zero exit with no job is not a crash mid-job.
        (Starting, None, (Exited, NotRegistered, NoJob), exit(1), failed(ProcessExitedUnexpectedly)),
        (Idle, None, (Exited, NotRegistered, NoJob), exit(1), Conclude(Conclusion::IdleExit)),
        // The agent stopped it (a stale intent too): its signal is no crash.
        (Busy, Some(StopIntent::IdleTimeout), (Exited, NotRegistered, RanAJob), exit(143), Conclude(Conclusion::CompletedJob)),
        // Found gone mid-job by an agent starting again, its job not completed: the host was lost.
        (Busy, None, (Gone, NotRegistered, RanAJob), recovering, failed(HostLost)),
        (Busy, None, (Gone, NotRegistered, Unknown), recovering, failed(HostLost)),
        (Idle, None, (Gone, NotRegistered, RanAJob), recovering, failed(HostLost)),
        // ... unless the journal has its job completed (it ended while the agent was away).
        (Busy, None, (Gone, NotRegistered, RanAJob), recovering_done, Conclude(Conclusion::CompletedJob)),
        (Busy, None, (Gone, NotRegistered, Unknown), recovering_done, Conclude(Conclusion::Orphaned)),
        // Not recovering, and no exit seen (a runner adopted from an earlier run): as before.
        (Busy, None, (Gone, NotRegistered, RanAJob), none, Conclude(Conclusion::CompletedJob)),
        (Busy, None, (Gone, NotRegistered, Unknown), none, Conclude(Conclusion::Orphaned)),
        // An idle runner left with no job at recovery is no lost host.
        (Idle, None, (Gone, NotRegistered, NoJob), recovering, Conclude(Conclusion::IdleExit)),
        // A ghost: alive, idle, unlisted past the bound: stopped (intent first), then failed so.
        (Idle, None, (Running, NotRegistered, NoJob), unlisted(9), Adopt),
        (Idle, None, (Running, NotRegistered, NoJob), unlisted(10), Terminate(StopIntent::Ghost)),
        (Idle, Some(StopIntent::Ghost), (Running, NotRegistered, NoJob), unlisted(11), Terminate(StopIntent::Ghost)),
        (Idle, Some(StopIntent::Ghost), (Exited, NotRegistered, NoJob), none, failed(Ghost)),
        (Idle, Some(StopIntent::Ghost), (Gone, NotRegistered, Unknown), exit(143), failed(Ghost)),
        // A runner that took a job meanwhile is no ghost; a busy one is never one.
        (Idle, None, (Running, NotRegistered, RanAJob), unlisted(60), Observe(Busy)),
        (Busy, None, (Running, NotRegistered, RanAJob), unlisted(60), Adopt),
        // A starting runner unlisted is the registration timeout's business.
        (Starting, None, (Running, NotRegistered, Unknown), unlisted(9), Adopt),
    ];
    for (i, (state, intent, seen, findings, expected)) in rows.iter().enumerate() {
        assert_eq!(
            decide_with(*state, 1, *intent, *seen, *findings),
            *expected,
            "row {i}: {state:?} {intent:?} {seen:?} {findings:?}"
        );
    }
    for reason in [OomKilled, DiskFull, RunnerCrashed, Ghost, HostLost] {
        assert_eq!(FailureReason::parse(reason.as_str()), Some(reason));
        assert!(Conclusion::Failed(reason).is_failure());
    }
    assert!(StopIntent::Ghost.applies_to() == [Idle]);
}
