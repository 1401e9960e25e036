//! The one conversion from a job as GitHub's REST API shows it to a journal sighting with
//! source `poll`: used by the demand poll ([`super::targets`]) and the stale checks
//! ([`super::stale`]) alike, so a job reads the same whichever found it.

use rm_github::types::WorkflowJob;
use rm_github::wire::parse_rfc3339;
use rm_handlers::JobObservation;
use rm_vocab::{JobState, Source, UnixMs};

/// A job as GitHub's REST API shows it, as a journal sighting with source `poll`. `None` for a
/// status the journal has no state for (`requested`, `pending`).
pub(super) fn observation(
    job: &WorkflowJob,
    repository: &str,
    installation_id: Option<u64>,
    at_ms: i64,
) -> Option<JobObservation> {
    let state = match job.status.as_str() {
        "waiting" => JobState::Waiting,
        "queued" => JobState::Queued,
        "in_progress" => JobState::InProgress,
        "completed" => JobState::Completed,
        _ => return None,
    };
    let started = state >= JobState::InProgress;
    Some(JobObservation {
        job_id: job.id,
        run_id: i64::try_from(job.run_id).ok()?,
        run_attempt: job
            .run_attempt
            .and_then(|a| i64::try_from(a).ok())
            .unwrap_or(1),
        repository: repository.to_owned(),
        installation_id: installation_id.and_then(|i| i64::try_from(i).ok()),
        labels: job.labels.clone(),
        state,
        conclusion: job.conclusion.clone(),
        runner_name: job.runner_name.clone().filter(|_| started),
        runner_id: job.runner_id.filter(|_| started),
        workflow_name: job.workflow_name.clone(),
        job_name: Some(job.name.clone()),
        queued_at_ms: parse_rfc3339(&job.created_at).map(UnixMs::from_system_time),
        // GitHub fills `started_at` with the creation time while a job is queued.
        started_at_ms: job
            .started_at
            .as_deref()
            .and_then(parse_rfc3339)
            .map(UnixMs::from_system_time)
            .filter(|_| started),
        observed_at_ms: UnixMs::new(at_ms),
        source: Source::Poll,
    })
}
