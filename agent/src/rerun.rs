//! Whether to ask GitHub to re-run a job the infrastructure killed (issue 28): one pure
//! decision over what the journal knows. The I/O (scan, journal, request) is the executor's
//! (`executor/rerun.rs`); the at-most-once record is the journal's (`rm_journal::RerunState`).

use rm_journal::{AttemptOutcome, RerunRecord};
use rm_vocab::JobState;

use crate::config::rerun::RerunPolicy;

/// What the decision reads of the attempt that ran the job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Concluded<'a> {
    pub(crate) outcome: AttemptOutcome,
    /// The failure reason journalled with the conclusion (snake_case), if any.
    pub(crate) reason: Option<&'a str>,
}

/// What the decision reads of the job, as the journal knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobSeen<'a> {
    pub(crate) state: JobState,
    pub(crate) conclusion: Option<&'a str>,
    /// GitHub's run attempt of the job: each earlier attempt was a re-run (ours or anyone's).
    pub(crate) run_attempt: i64,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Journal it `intended`, then send it.
    Rerun,
    /// Not now: the job is not finished at GitHub yet (GitHub refuses to re-run it); asked
    /// again at the next scan.
    NotYet(&'static str),
    /// Never for this attempt, and why.
    No(&'static str),
}

/// Whether the job the attempt ran is to be re-run: only for a reason the policy lists, only
/// once GitHub has finished the job with a conclusion other than `success`, never for a job
/// that completed on its own runner, and at most `max_reruns` times (the job's earlier run
/// attempts and a journalled re-run count).
pub(crate) fn decide(
    policy: Option<&RerunPolicy>,
    attempt: Concluded<'_>,
    job: Option<JobSeen<'_>>,
    journalled: Option<&RerunRecord>,
) -> Verdict {
    let Some(policy) = policy else {
        return Verdict::No("the policy re-runs nothing (no rerun_on)");
    };
    if attempt.outcome == AttemptOutcome::CompletedJob
        || attempt.outcome == AttemptOutcome::IdleExit
    {
        return Verdict::No("the runner ended normally: the job's own result stands");
    }
    let Some(reason) = attempt.reason else {
        return Verdict::No("the attempt names no failure reason");
    };
    if !policy.rerun_on.iter().any(|r| r == reason) {
        return Verdict::No("the attempt's reason is not in the policy's rerun_on");
    }
    if journalled.is_some() {
        return Verdict::No("a re-run of this job is already journalled");
    }
    let Some(job) = job else {
        return Verdict::NotYet("the journal does not know the job yet");
    };
    // Earlier run attempts were re-runs of this job's run: they count against the bound.
    let earlier = u32::try_from(job.run_attempt.saturating_sub(1)).unwrap_or(u32::MAX);
    if earlier >= policy.max_reruns {
        return Verdict::No("the job was re-run max_reruns times already");
    }
    if job.state != JobState::Completed {
        return Verdict::NotYet("GitHub has not finished the job yet");
    }
    match job.conclusion {
        Some("success") => Verdict::No("the job succeeded"),
        Some("cancelled") => Verdict::No("the job was cancelled"),
        _ => Verdict::Rerun,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rm_journal::RerunState;
    use rm_vocab::{JobId, UnixMs};

    fn policy(reasons: &[&str], max: u32) -> RerunPolicy {
        RerunPolicy {
            rerun_on: reasons.iter().map(|r| (*r).to_owned()).collect(),
            max_reruns: max,
        }
    }

    fn record() -> RerunRecord {
        RerunRecord {
            job_id: JobId::new(1),
            attempt_id: "0".repeat(32),
            policy: "linux".into(),
            reason: "oom_killed".into(),
            repository: "acme/widgets".into(),
            run_id: 7,
            run_attempt: 1,
            state: RerunState::Sent,
            detail: None,
            created_at_ms: UnixMs::new(1),
            updated_at_ms: UnixMs::new(1),
        }
    }

    #[test]
    fn the_decision_table() {
        use AttemptOutcome::*;
        use JobState::*;
        let on = policy(&["oom_killed", "runner_crashed", "host_lost"], 1);
        let twice = policy(&["oom_killed"], 2);
        let done = |conclusion, run_attempt| {
            Some(JobSeen {
                state: Completed,
                conclusion: Some(conclusion),
                run_attempt,
            })
        };
        let running = Some(JobSeen {
            state: InProgress,
            conclusion: None,
            run_attempt: 1,
        });
        let rec = record();
        let failed = |reason| Concluded {
            outcome: Failed,
            reason: Some(reason),
        };
        type Row<'a> = (
            &'a str,
            Option<&'a RerunPolicy>,
            Concluded<'a>,
            Option<JobSeen<'a>>,
            Option<&'a RerunRecord>,
            &'a str,
        );
        let rows: Vec<Row<'_>> = vec![
            (
                "killed, finished, listed",
                Some(&on),
                failed("oom_killed"),
                done("failure", 1),
                None,
                "rerun",
            ),
            (
                "an orphaned attempt counts",
                Some(&on),
                Concluded {
                    outcome: Orphaned,
                    reason: Some("host_lost"),
                },
                done("failure", 1),
                None,
                "rerun",
            ),
            (
                "no policy",
                None,
                failed("oom_killed"),
                done("failure", 1),
                None,
                "no",
            ),
            (
                "reason not listed",
                Some(&on),
                failed("disk_full"),
                done("failure", 1),
                None,
                "no",
            ),
            (
                "failed on its own",
                Some(&on),
                failed("process_exited_unexpectedly"),
                done("failure", 1),
                None,
                "no",
            ),
            (
                "no reason",
                Some(&on),
                Concluded {
                    outcome: Failed,
                    reason: None,
                },
                done("failure", 1),
                None,
                "no",
            ),
            (
                "the runner completed its job",
                Some(&on),
                Concluded {
                    outcome: CompletedJob,
                    reason: Some("oom_killed"),
                },
                done("failure", 1),
                None,
                "no",
            ),
            (
                "idle exit",
                Some(&on),
                Concluded {
                    outcome: IdleExit,
                    reason: Some("oom_killed"),
                },
                done("failure", 1),
                None,
                "no",
            ),
            (
                "the job succeeded",
                Some(&on),
                failed("oom_killed"),
                done("success", 1),
                None,
                "no",
            ),
            (
                "the job was cancelled",
                Some(&on),
                failed("oom_killed"),
                done("cancelled", 1),
                None,
                "no",
            ),
            (
                "already journalled",
                Some(&on),
                failed("oom_killed"),
                done("failure", 1),
                Some(&rec),
                "no",
            ),
            (
                "a re-run's job: max 1 reached",
                Some(&on),
                failed("oom_killed"),
                done("failure", 2),
                None,
                "no",
            ),
            (
                "max 2: once more",
                Some(&twice),
                failed("oom_killed"),
                done("failure", 2),
                None,
                "rerun",
            ),
            (
                "max 2: reached",
                Some(&twice),
                failed("oom_killed"),
                done("failure", 3),
                None,
                "no",
            ),
            (
                "not finished at GitHub",
                Some(&on),
                failed("oom_killed"),
                running,
                None,
                "not yet",
            ),
            (
                "unknown job",
                Some(&on),
                failed("runner_crashed"),
                None,
                None,
                "not yet",
            ),
            (
                "timed out counts as not success",
                Some(&on),
                failed("oom_killed"),
                done("timed_out", 1),
                None,
                "rerun",
            ),
        ];
        for (what, policy, attempt, job, journalled, want) in rows {
            let got = match decide(policy, attempt, job, journalled) {
                Verdict::Rerun => "rerun",
                Verdict::NotYet(_) => "not yet",
                Verdict::No(_) => "no",
            };
            assert_eq!(got, want, "{what}");
        }
    }
}
