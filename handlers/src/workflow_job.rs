//! `workflow_job`: a job was queued, is waiting on an environment, started on a runner, or
//! finished. Each delivery is one sighting of the job; the journal merges it forward only.

use serde::Deserialize;

use crate::{Change, Delivery, JobObservation, JobState, Verdict, ignore_action, parse};

#[derive(Deserialize)]
struct Payload {
    action: String,
    workflow_job: Job,
    repository: RepositoryRef,
    installation: Option<InstallationRef>,
}

#[derive(Deserialize)]
struct Job {
    id: i64,
    run_id: i64,
    /// Missing on payloads from before GitHub added re-run attempts; those are the first.
    #[serde(default = "first_attempt")]
    run_attempt: i64,
    labels: Vec<String>,
    conclusion: Option<String>,
    runner_name: Option<String>,
    runner_id: Option<i64>,
    workflow_name: Option<String>,
    name: Option<String>,
}

fn first_attempt() -> i64 {
    1
}

#[derive(Deserialize)]
struct RepositoryRef {
    full_name: String,
}

#[derive(Deserialize)]
struct InstallationRef {
    id: i64,
}

pub(crate) fn handle(delivery: &Delivery<'_>) -> Verdict {
    let payload: Payload = match parse(delivery.body) {
        Ok(payload) => payload,
        Err(rejection) => return rejection,
    };
    let Some(state) = JobState::parse(&payload.action) else {
        return ignore_action(delivery.event, payload.action);
    };
    let job = payload.workflow_job;
    if job.id <= 0 || job.run_id <= 0 {
        return Verdict::Reject {
            action: Some(payload.action),
            reason: format!(
                "workflow_job.id ({}) and run_id ({}) must be positive",
                job.id, job.run_id
            ),
        };
    }
    let observation = JobObservation {
        job_id: job.id,
        run_id: job.run_id,
        run_attempt: job.run_attempt,
        repository: payload.repository.full_name,
        installation_id: payload.installation.map(|i| i.id),
        labels: job.labels,
        state,
        conclusion: job.conclusion,
        // GitHub fills the runner fields once a runner takes the job; a `queued` sighting that
        // carries them (old GHES versions do) must not name a runner that never ran it.
        runner_name: job.runner_name.filter(|_| state >= JobState::InProgress),
        runner_id: job.runner_id.filter(|_| state >= JobState::InProgress),
        workflow_name: job.workflow_name,
        job_name: job.name,
        observed_at_ms: delivery.received_at_ms,
        source: delivery.source,
    };
    Verdict::Apply {
        action: Some(payload.action),
        changes: vec![Change::Job(observation)],
        note: None,
    }
}
