//! How a job's runner ended (issue 28, `explain` for jobs that ran): the attempt that took the
//! job, its outcome and attributed reason with the journal's evidence sentence, and where its
//! logs are. Pure: the command gathers the attempts ([`RanAttempt`]) from this host's journal
//! and its kept logs.
//!
//! The reason's code is the attempt's own: its attributed failure (`oom_killed`, `disk_full`,
//! `runner_crashed`, `ghost`, `host_lost`, or any other failure reason), else its outcome
//! (`completed_job`, `orphaned`, `idle_exit`); `runner_live` while it has not ended. Then
//! `logs_kept` (or `logs_live`, or `logs_not_kept`). Between them, `runner_image` for each
//! attempt whose runner's root was an image (issue 40), naming the image's full id; nothing for
//! a runner on the host's root.

use std::path::PathBuf;

use rm_journal::{AttemptOutcome, RerunRecord, RerunState};
use rm_vocab::JobId;
use serde::Serialize;

use super::{Reason, reason};
use crate::lifecycle::FailureReason;

/// One attempt of this host that ran the job (by the journal's attempt, or only a kept copy of
/// its logs once the journal pruned it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RanAttempt {
    pub attempt_id: String,
    pub runner_name: String,
    /// `None`: the journal no longer has the attempt (only its kept logs).
    pub outcome: Option<AttemptOutcome>,
    pub reason: Option<String>,
    pub detail: Option<String>,
    /// Its runtime may still be there (not cleaned).
    pub live: bool,
    /// Its kept logs, when a copy exists.
    pub logs: Option<PathBuf>,
    /// The id of the image its runner ran in (`sha256:<64 hex>`); `None` on the host's root, or
    /// once the journal pruned the attempt.
    pub image: Option<String>,
}

/// The end beside the contract's fields (`explain --json`'s `runner_end`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RunnerEnd {
    pub attempt_id: String,
    pub runner_name: String,
    /// `completed_job`, `idle_exit`, `failed`, `orphaned`; null while it runs (or once the
    /// journal pruned it).
    pub outcome: Option<&'static str>,
    pub reason: Option<String>,
    pub detail: Option<String>,
    /// The kept copy of its logs.
    pub logs: Option<String>,
    /// The id of the image its runner ran in; null on the host's root (issue 40).
    pub image: Option<String>,
}

/// The re-run the agent asked GitHub for (issue 28, `policy.rerun_on`), if any.
pub(crate) fn rerun(rerun: Option<&RerunRecord>) -> Option<Reason> {
    let rerun = rerun?;
    let why = format!(
        "its runner ended {} and policy {} re-runs that (rerun_on)",
        rerun.reason, rerun.policy
    );
    let detail = rerun
        .detail
        .as_deref()
        .map_or_else(String::new, |d| format!(": {d}"));
    Some(match rerun.state {
        RerunState::Sent => reason(
            "rerun_sent",
            format!(
                "The agent asked GitHub to re-run the job, because {why}; the re-run is run attempt {} of run {}.",
                rerun.run_attempt + 1,
                rerun.run_id
            ),
        ),
        RerunState::Intended | RerunState::Sending => reason(
            "rerun_pending",
            format!(
                "The agent will ask GitHub to re-run the job once its run has finished, because {why}."
            ),
        ),
        RerunState::Refused => reason(
            "rerun_refused",
            format!(
                "The agent asked GitHub to re-run the job, because {why}, and GitHub refused{detail}."
            ),
        ),
        RerunState::Unknown => reason(
            "rerun_unknown",
            format!(
                "The agent stopped while asking GitHub to re-run the job ({why}); whether GitHub did is unknown, and it is never asked twice{detail}."
            ),
        ),
    })
}

/// The code of an ended attempt: its failure reason when it has one the agent knows, else its
/// outcome.
fn code(attempt: &RanAttempt) -> &'static str {
    match (attempt.outcome, attempt.reason.as_deref()) {
        (Some(AttemptOutcome::Failed), Some(reason)) => {
            FailureReason::parse(reason).map_or("failed", FailureReason::as_str)
        }
        (Some(outcome), _) => outcome.as_str(),
        (None, _) if attempt.live => "runner_live",
        (None, _) => "runner_pruned",
    }
}

/// The reasons saying how the last attempt that ran `job_id` ended, and where its logs are;
/// nothing when no attempt of this host ran it.
pub(crate) fn reasons(job_id: JobId, ran: &[RanAttempt]) -> (Vec<Reason>, Option<RunnerEnd>) {
    let Some(last) = ran.last() else {
        return (Vec::new(), None);
    };
    let code = code(last);
    let mut reasons = Vec::new();
    let ended = match (last.outcome, &last.reason) {
        (Some(outcome), Some(why)) => format!("{} ({why})", outcome.as_str()),
        (Some(outcome), None) => outcome.as_str().to_owned(),
        (None, _) => String::new(),
    };
    let message = match (&ended[..], &last.detail) {
        ("", _) if last.live => format!("Its runner {} has not ended yet.", last.runner_name),
        ("", _) => format!(
            "Its runner {} ran it; this host's journal no longer has how it ended.",
            last.runner_name
        ),
        (ended, Some(detail)) => {
            format!("Its runner {} ended {ended}: {detail}.", last.runner_name)
        }
        (ended, None) => format!("Its runner {} ended {ended}.", last.runner_name),
    };
    reasons.push(reason(code, message));
    reasons.extend(images(ran));
    match (&last.logs, last.live) {
        (Some(path), _) => reasons.push(reason(
            "logs_kept",
            format!(
                "Its logs are kept in {}: `rm-agent logs {job_id}` prints them.",
                path.display()
            ),
        )),
        (None, true) => reasons.push(reason(
            "logs_live",
            format!("`rm-agent logs {job_id} --follow` shows its logs as they are written."),
        )),
        (None, false) => reasons.push(reason(
            "logs_not_kept",
            "No copy of its logs is kept (pruned by [logs] keep, max_age or max_total, or the copy failed: see the agent's log).",
        )),
    }
    let end = RunnerEnd {
        attempt_id: last.attempt_id.clone(),
        runner_name: last.runner_name.clone(),
        outcome: last.outcome.map(AttemptOutcome::as_str),
        reason: last.reason.clone(),
        detail: last.detail.clone(),
        logs: last.logs.as_ref().map(|p| p.display().to_string()),
        image: last.image.clone(),
    };
    (reasons, Some(end))
}

/// `runner_image` for each attempt that ran the job in an image, oldest first: the last is the
/// job's runner, any earlier one a runner that took the job before it.
fn images(ran: &[RanAttempt]) -> Vec<Reason> {
    let last = ran.len().saturating_sub(1);
    ran.iter()
        .enumerate()
        .filter_map(|(n, attempt)| {
            let image = attempt.image.as_deref()?;
            let name = &attempt.runner_name;
            let message = match (n == last, attempt.live && attempt.outcome.is_none()) {
                (true, true) => format!("Its runner {name} runs in image {image}."),
                (true, false) => format!("Its runner {name} ran in image {image}."),
                (false, _) => {
                    format!("Runner {name}, which took the job before, ran in image {image}.")
                }
            };
            Some(reason("runner_image", message))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(outcome: Option<AttemptOutcome>, reason: Option<&str>, live: bool) -> RanAttempt {
        RanAttempt {
            attempt_id: "a1".into(),
            runner_name: "rm-h-a1".into(),
            outcome,
            reason: reason.map(str::to_owned),
            detail: Some("the evidence".into()),
            live,
            logs: (!live).then(|| PathBuf::from("/var/lib/rm/logs/a1")),
            image: None,
        }
    }

    const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// Issue 40: each attempt's image is named with its full id, between the end and the logs;
    /// a runner on the host's root adds nothing.
    #[test]
    fn the_image_each_attempt_ran_in_is_named_in_full() {
        let job = JobId::new(7);
        let codes = |said: &[Reason]| said.iter().map(|r| r.code).collect::<Vec<_>>();
        let mut ran = attempt(Some(AttemptOutcome::CompletedJob), None, false);
        let (said, end) = reasons(job, std::slice::from_ref(&ran));
        assert_eq!(codes(&said), ["completed_job", "logs_kept"]);
        assert_eq!(end.unwrap().image, None);

        ran.image = Some(IMAGE.into());
        let (said, end) = reasons(job, std::slice::from_ref(&ran));
        assert_eq!(codes(&said), ["completed_job", "runner_image", "logs_kept"]);
        assert_eq!(
            said[1].message,
            format!("Its runner rm-h-a1 ran in image {IMAGE}.")
        );
        assert_eq!(end.unwrap().image.as_deref(), Some(IMAGE));

        let mut running = attempt(None, None, true);
        running.image = Some(IMAGE.into());
        let (said, _) = reasons(job, &[running]);
        assert_eq!(
            said[1].message,
            format!("Its runner rm-h-a1 runs in image {IMAGE}.")
        );

        // Two attempts took the job: each is named, the earlier one as such.
        let other = format!("sha256:{}", "f".repeat(64));
        let mut first = attempt(Some(AttemptOutcome::Failed), Some("runner_crashed"), false);
        first.runner_name = "rm-h-a0".into();
        first.image = Some(other.clone());
        let (said, end) = reasons(job, &[first, ran]);
        assert_eq!(
            codes(&said),
            ["completed_job", "runner_image", "runner_image", "logs_kept"]
        );
        assert_eq!(
            said[1].message,
            format!("Runner rm-h-a0, which took the job before, ran in image {other}.")
        );
        assert!(said[2].message.contains(IMAGE), "{}", said[2].message);
        assert_eq!(end.unwrap().image.as_deref(), Some(IMAGE));
    }

    #[test]
    fn each_end_is_said_with_its_own_code_and_where_its_logs_are() {
        let job = JobId::new(7);
        assert_eq!(reasons(job, &[]), (Vec::new(), None));
        for (outcome, why, code) in [
            (AttemptOutcome::Failed, Some("oom_killed"), "oom_killed"),
            (AttemptOutcome::Failed, Some("disk_full"), "disk_full"),
            (
                AttemptOutcome::Failed,
                Some("runner_crashed"),
                "runner_crashed",
            ),
            (AttemptOutcome::Failed, Some("ghost"), "ghost"),
            (AttemptOutcome::Failed, Some("host_lost"), "host_lost"),
            (
                AttemptOutcome::Failed,
                Some("disk_exceeded"),
                "disk_exceeded",
            ),
            (AttemptOutcome::Failed, Some("from a newer agent"), "failed"),
            (AttemptOutcome::CompletedJob, None, "completed_job"),
            (AttemptOutcome::Orphaned, None, "orphaned"),
        ] {
            let (said, end) = reasons(job, &[attempt(Some(outcome), why, false)]);
            assert_eq!(said[0].code, code);
            assert!(
                said[0].message.contains("the evidence"),
                "{}",
                said[0].message
            );
            assert_eq!(said[1].code, "logs_kept");
            assert!(said[1].message.contains("rm-agent logs 7"));
            let end = end.unwrap();
            assert_eq!(end.outcome, Some(outcome.as_str()));
            assert_eq!(end.logs.as_deref(), Some("/var/lib/rm/logs/a1"));
        }
        let (said, _) = reasons(job, &[attempt(None, None, true)]);
        assert_eq!(
            said.iter().map(|r| r.code).collect::<Vec<_>>(),
            ["runner_live", "logs_live"]
        );
        let mut pruned = attempt(Some(AttemptOutcome::CompletedJob), None, false);
        pruned.logs = None;
        let (said, _) = reasons(job, &[pruned]);
        assert_eq!(said[1].code, "logs_not_kept");
    }

    #[test]
    fn a_rerun_says_its_state_and_why() {
        assert_eq!(rerun(None), None);
        let mut record = RerunRecord {
            job_id: JobId::new(7),
            attempt_id: "a1".into(),
            policy: "linux".into(),
            reason: "runner_crashed".into(),
            repository: "acme/widgets".into(),
            run_id: 40,
            run_attempt: 1,
            state: RerunState::Sent,
            detail: None,
            created_at_ms: rm_vocab::UnixMs::new(0),
            updated_at_ms: rm_vocab::UnixMs::new(0),
        };
        for (state, code) in [
            (RerunState::Sent, "rerun_sent"),
            (RerunState::Intended, "rerun_pending"),
            (RerunState::Sending, "rerun_pending"),
            (RerunState::Refused, "rerun_refused"),
            (RerunState::Unknown, "rerun_unknown"),
        ] {
            record.state = state;
            let said = rerun(Some(&record)).unwrap();
            assert_eq!(said.code, code);
            assert!(said.message.contains("runner_crashed"), "{}", said.message);
        }
        record.state = RerunState::Sent;
        assert!(
            rerun(Some(&record))
                .unwrap()
                .message
                .contains("run attempt 2 of run 40")
        );
    }

    #[test]
    fn the_last_attempt_is_the_one_said() {
        let mut first = attempt(Some(AttemptOutcome::Failed), Some("runner_crashed"), false);
        first.attempt_id = "a0".into();
        let second = attempt(Some(AttemptOutcome::CompletedJob), None, false);
        let (said, end) = reasons(JobId::new(1), &[first, second]);
        assert_eq!(said[0].code, "completed_job");
        assert_eq!(end.unwrap().attempt_id, "a1");
    }
}
