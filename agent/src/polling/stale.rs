//! Stale jobs: a job the journal has held as `queued` for longer than [`STALE_AFTER`] is asked
//! about (`GET .../actions/jobs/{id}`), at most [`MAX_STALE_CHECKS_PER_PASS`] a pass and each at
//! most every [`STALE_RECHECK`], so a job cancelled, completed or taken by a runner elsewhere
//! (whose delivery was lost) stops counting as demand. Only jobs in this agent's targets are
//! asked about. A job GitHub no longer knows (`404`) is left as it is and asked about again later.

use std::time::{Duration, SystemTime};

use rm_github::{GithubClient, GithubError, Target};
use rm_journal::{JournalError, QueuedJobRef};
use rm_vocab::UnixMs;

use super::blocking::Store;
use super::schedule::Failure;
use super::sighting::observation;

/// A job queued in the journal for longer than this is checked against GitHub.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(10 * 60);
/// The same job is checked again at most this often.
pub(crate) const STALE_RECHECK: Duration = Duration::from_secs(15 * 60);
/// Most stale jobs checked in one pass.
pub(crate) const MAX_STALE_CHECKS_PER_PASS: usize = 5;

/// What the checks did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StaleReport {
    pub checked: usize,
    /// Jobs GitHub no longer holds as queued.
    pub resolved: usize,
    pub requests: u32,
    pub failure: Option<Failure>,
}

/// The time before which a queued job counts as stale: [`STALE_AFTER`] ago, or the agent's
/// start if that is later.
pub(crate) fn stale_before(now: UnixMs, started: UnixMs) -> UnixMs {
    (now - STALE_AFTER).max(started)
}

/// Checks the stale queued jobs due now; `started` is when this agent started.
pub(super) async fn check(
    client: &GithubClient,
    journal: &Store,
    targets: &[Target],
    now: SystemTime,
    started: SystemTime,
) -> Result<StaleReport, JournalError> {
    let at = UnixMs::from_system_time(now);
    let before = stale_before(at, UnixMs::from_system_time(started));
    let due: Vec<_> = journal
        .call(move |j| j.stale_queued(before, recheck_before(at)))
        .await?
        .into_iter()
        .filter(|job| targets.iter().any(|t| t.contains(&job.repository)))
        .take(MAX_STALE_CHECKS_PER_PASS)
        .collect();
    check_jobs(client, journal, due, now).await
}

/// The recheck bound as the journal query wants it: checked before this time.
pub(crate) fn recheck_before(now: UnixMs) -> UnixMs {
    now - STALE_RECHECK
}

/// Asks GitHub about each job and records what it says.
pub(super) async fn check_jobs(
    client: &GithubClient,
    journal: &Store,
    due: Vec<QueuedJobRef>,
    now: SystemTime,
) -> Result<StaleReport, JournalError> {
    let now_ms = UnixMs::from_system_time(now).get();
    let mut report = StaleReport::default();
    for job in due {
        let Some((owner, name)) = job.repository.split_once('/') else {
            continue;
        };
        report.requests += 1;
        match client.get_job(owner, name, job.job_id).await {
            Ok(found) => {
                if let Some(seen) = observation(&found, &job.repository, None, now_ms) {
                    let sightings = journal.call(move |j| j.record_sightings(&[seen])).await?;
                    report.resolved += sightings
                        .iter()
                        .filter(|s| s.state != rm_vocab::JobState::Queued)
                        .count();
                }
            }
            Err(GithubError::NotFound { .. }) => {
                tracing::debug!(
                    job_id = job.job_id.get(),
                    "stale check: GitHub does not know the job"
                );
            }
            Err(error) => {
                let failure = Failure::from_error(&error, now);
                report.failure = Some(Failure::worst(report.failure, failure));
                if matches!(failure, Failure::Offline | Failure::RateLimited { .. }) {
                    break;
                }
            }
        }
        report.checked += 1;
        let job_id = job.job_id;
        journal
            .call(move |j| j.mark_checked(job_id, UnixMs::new(now_ms)))
            .await?;
    }
    Ok(report)
}

#[cfg(test)]
mod start_tests {
    use super::*;

    #[test]
    fn jobs_queued_before_the_agent_started_are_stale_at_once() {
        let ten_min = rm_vocab::millis(STALE_AFTER);
        let at = UnixMs::new;
        // Just started: everything queued before the start is stale.
        assert_eq!(stale_before(at(1_000_000), at(999_000)), at(999_000));
        // Long running: the usual bound.
        assert_eq!(stale_before(at(10 * ten_min), at(0)), at(9 * ten_min));
    }
}
