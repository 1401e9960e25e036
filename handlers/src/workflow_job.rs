//! `workflow_job`: a job was queued, is waiting on an environment, started on a runner, or
//! finished. Each delivery is one sighting of the job; the journal merges it forward only.
//!
//! A delivery whose own timestamps are older than GitHub's queue lifetime is `stale` and changes
//! nothing. GitHub signs the body, not the `X-GitHub-Delivery` header, so anyone holding an old
//! signed body (a relay operator, a proxy hop) can post it again under a fresh GUID; dating the
//! body itself is what keeps such a replay from becoming demand.

use serde::Deserialize;

use crate::{Change, Delivery, JobObservation, Verdict, ignore_action, parse};
use rm_vocab::{JobId, JobState, RunnerId, UnixMs};

/// GitHub cancels a job that no runner took within 24 hours, and a job's sightings carry the
/// times it was created, started and completed: a delivery that arrives longer than this after
/// the newest of them is a replay or a re-send of something long over, never news.
pub const QUEUE_LIFETIME_MS: i64 = 24 * 60 * 60 * 1000;

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
    /// The job's own dates (RFC 3339): what a delivery's age is judged by.
    created_at: Option<String>,
    started_at: Option<String>,
    completed_at: Option<String>,
}

impl Job {
    /// The newest of the job's own timestamps that can be read, in ms since the epoch.
    fn newest_timestamp_ms(&self) -> Option<i64> {
        [&self.created_at, &self.started_at, &self.completed_at]
            .into_iter()
            .filter_map(|t| t.as_deref().and_then(UnixMs::parse_rfc3339))
            .map(UnixMs::get)
            .max()
    }
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
    if let Some(newest) = job.newest_timestamp_ms() {
        let age_ms = delivery.received_at_ms.saturating_sub(UnixMs::new(newest));
        if age_ms > QUEUE_LIFETIME_MS {
            return Verdict::Stale {
                action: Some(payload.action),
                reason: format!(
                    "job {} says it was last touched {} h before this delivery arrived; GitHub \
                     cancels a job no runner took within 24 h, so this is an old body sent \
                     again and changes nothing",
                    job.id,
                    age_ms / 3_600_000
                ),
            };
        }
    }
    let observation = JobObservation {
        job_id: JobId::new(job.id),
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
        runner_id: job
            .runner_id
            .map(RunnerId::new)
            .filter(|_| state >= JobState::InProgress),
        workflow_name: job.workflow_name,
        job_name: job.name,
        queued_at_ms: job.created_at.as_deref().and_then(UnixMs::parse_rfc3339),
        // A queued job's `started_at` is its creation time (GitHub fills it before any runner
        // took it), so only a sighting of a started job says when it started.
        started_at_ms: job
            .started_at
            .as_deref()
            .and_then(UnixMs::parse_rfc3339)
            .filter(|_| state >= JobState::InProgress),
        observed_at_ms: delivery.received_at_ms,
        source: delivery.source,
    };
    Verdict::Apply {
        action: Some(payload.action),
        changes: vec![Change::Job(observation)],
        note: None,
    }
}
