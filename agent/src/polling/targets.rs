//! Polled demand: each distinct policy target read once per pass, however many policies share
//! it. An organization expands to its installation's repositories (listed again every
//! [`REPOSITORY_LIST_REFRESH_MULTIPLE`] active intervals, or sooner when the journal's
//! `installation_repositories` for it changed); each repository's `queued` and `in_progress` runs
//! are listed with conditional requests (a `304` costs no quota), and the jobs of runs that
//! changed are merged into the journal with source `poll`, forward only.
//!
//! A job the journal holds as `queued` whose run GitHub no longer lists as queued or in progress
//! finished while nobody was told (its deliveries lost, or too quick for the poll to see it
//! run): it is reported as vanished, and the poller asks GitHub about it at once rather than
//! after the stale-job bound, so it stops counting as demand.
//!
//! `in_progress` runs are listed too: a matrix run with one job started is `in_progress` while
//! its other jobs are still queued, and would be invisible to a `queued` listing.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use rm_github::types::WorkflowJob;
use rm_github::wire::parse_rfc3339;
use rm_github::{GithubClient, GithubError, Target};
use rm_handlers::JobObservation;
use rm_journal::{JournalError, QueuedJobRef};
use rm_vocab::{JobId, UnixMs};

use super::blocking::Store;
use super::health::is_unannounced;
use super::schedule::Failure;
use super::sighting::observation;

/// An organization's repository list is listed again after this many active intervals.
pub(crate) const REPOSITORY_LIST_REFRESH_MULTIPLE: u32 = 30;
/// The run statuses listed per repository.
const RUN_STATUSES: [&str; 2] = ["queued", "in_progress"];

/// A repository as `owner`, `name`.
type Repo = (String, String);

#[derive(Debug, Clone)]
struct CachedScope {
    repositories: Vec<Repo>,
    listed_at: SystemTime,
    /// What the journal said the scope was when it was listed.
    journal_view: Vec<String>,
}

/// What the demand side remembers between passes.
#[derive(Debug, Default)]
pub(crate) struct DemandState {
    scopes: HashMap<String, CachedScope>,
    /// Per repository and run status: each listed run's `updated_at`, as last read.
    runs: HashMap<(String, &'static str), HashMap<u64, String>>,
    /// Whether each repository's last listings held any run (a `304` keeps the last answer).
    busy: HashMap<(String, &'static str), bool>,
    /// Queued jobs a poll found unannounced inside the grace: job id → when the grace started.
    pending: HashMap<JobId, SystemTime>,
    /// Real repository-list calls (tests read it).
    pub lookups: u64,
}

/// What a demand poll did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DemandReport {
    pub targets_read: usize,
    pub repositories: usize,
    pub jobs_seen: usize,
    pub jobs_changed: usize,
    pub unannounced: usize,
    pub requests: u32,
    pub failure: Option<Failure>,
    /// Every target read, and no repository had a queued or running run.
    pub quiet: bool,
    /// Queued jobs whose run GitHub no longer lists (at most [`MAX_VANISHED_PER_PASS`]).
    pub vanished: Vec<QueuedJobRef>,
    /// Targets that failed, and why.
    pub unreadable: Vec<super::UnreadableTarget>,
}

/// Most vanished jobs reported (and asked about) per pass.
pub(crate) const MAX_VANISHED_PER_PASS: usize = 10;

/// Errors that stop a pass (GitHub's are folded into the report).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemandError {
    #[error("the journal: {0}")]
    Journal(#[from] JournalError),
}

/// One pass over `targets`. A target that fails is unreadable (not empty); an outage or a rate
/// limit ends the pass, since every further request would meet it too.
pub(super) async fn poll(
    state: &mut DemandState,
    client: &GithubClient,
    journal: &Store,
    targets: &[Target],
    active: Duration,
    now: SystemTime,
) -> Result<DemandReport, DemandError> {
    let mut report = DemandReport::default();
    // A repository in two targets (its organization's and its own) is listed once a pass.
    let mut listed = HashSet::new();
    for target in targets {
        let pass = Pass {
            client,
            journal,
            active,
            now,
        };
        match poll_target(state, &pass, target, &mut listed, &mut report).await? {
            Ok(()) => report.targets_read += 1,
            Err(error) => {
                let failure = Failure::from_error(&error, now);
                tracing::warn!(target = %target, error = %error, "polling: target unreadable");
                report.unreadable.push(super::UnreadableTarget {
                    target: target.to_string(),
                    reason: error.to_string(),
                });
                report.failure = Some(Failure::worst(report.failure, failure));
                if matches!(failure, Failure::Offline | Failure::RateLimited { .. }) {
                    break;
                }
            }
        }
    }
    report.quiet = report.failure.is_none() && state.busy.values().all(|busy| !busy);
    Ok(report)
}

/// What every step of a pass shares.
struct Pass<'a> {
    client: &'a GithubClient,
    journal: &'a Store,
    active: Duration,
    now: SystemTime,
}

async fn poll_target(
    state: &mut DemandState,
    pass: &Pass<'_>,
    target: &Target,
    listed_repositories: &mut HashSet<String>,
    report: &mut DemandReport,
) -> Result<Result<(), GithubError>, DemandError> {
    let Pass {
        client,
        journal,
        active,
        now,
    } = *pass;
    let installation = match client.installation_for(target).await {
        Ok(id) => id,
        Err(error) => return Ok(Err(error)),
    };
    let repositories = match target {
        Target::Repo { owner, repo } => vec![(owner.clone(), repo.clone())],
        Target::Org(org) => {
            match scope_of(
                state,
                client,
                journal,
                org,
                installation,
                active,
                now,
                report,
            )
            .await?
            {
                Ok(repositories) => repositories,
                Err(error) => return Ok(Err(error)),
            }
        }
    };
    for (owner, name) in &repositories {
        let full_name = format!("{owner}/{name}");
        if !listed_repositories.insert(full_name.to_ascii_lowercase()) {
            continue;
        }
        report.repositories += 1;
        for status in RUN_STATUSES {
            report.requests += 1;
            let runs = match client.list_workflow_runs(owner, name, status).await {
                Ok(runs) => runs,
                Err(error) => return Ok(Err(error)),
            };
            let key = (full_name.clone(), status);
            state.busy.insert(key.clone(), !runs.value.is_empty());
            if runs.not_modified {
                continue;
            }
            let seen = state.runs.get(&key).cloned().unwrap_or_default();
            let mut listed = HashMap::new();
            for run in &runs.value {
                if seen.get(&run.id) == Some(&run.updated_at) {
                    listed.insert(run.id, run.updated_at.clone());
                    continue;
                }
                report.requests += 1;
                let jobs = match client.list_run_jobs(owner, name, run.id).await {
                    Ok(jobs) => jobs.value,
                    Err(error) => {
                        state.runs.insert(key, listed);
                        return Ok(Err(error));
                    }
                };
                record(state, journal, &jobs, &full_name, installation, now, report).await?;
                listed.insert(run.id, run.updated_at.clone());
            }
            state.runs.insert(key, listed);
        }
        note_vanished(state, journal, &full_name, now, report).await?;
    }
    Ok(Ok(()))
}

/// Reports the repository's journal-queued jobs whose run is in neither listing.
async fn note_vanished(
    state: &DemandState,
    journal: &Store,
    repository: &str,
    now: SystemTime,
    report: &mut DemandReport,
) -> Result<(), DemandError> {
    let room = MAX_VANISHED_PER_PASS.saturating_sub(report.vanished.len());
    if room == 0 {
        return Ok(());
    }
    let active: HashSet<u64> = RUN_STATUSES
        .iter()
        .filter_map(|status| state.runs.get(&(repository.to_owned(), *status)))
        .flat_map(|runs| runs.keys().copied())
        .collect();
    let checked_before = super::stale::recheck_before(UnixMs::from_system_time(now));
    let repository = repository.to_owned();
    let queued = journal
        .call(move |j| j.queued_in_repository(&repository, checked_before))
        .await?;
    report
        .vanished
        .extend(vanished(queued, &active).into_iter().take(room));
    Ok(())
}

/// The queued jobs whose run is not among the `active` runs; pure.
pub(crate) fn vanished(
    queued: Vec<(QueuedJobRef, i64)>,
    active: &HashSet<u64>,
) -> Vec<QueuedJobRef> {
    queued
        .into_iter()
        .filter(|(_, run)| u64::try_from(*run).is_ok_and(|run| !active.contains(&run)))
        .map(|(job, _)| job)
        .collect()
}

/// The organization's repositories: cached, listed again when the cache is old or the journal's
/// view of the installation's scope changed. Errors are not cached.
#[expect(
    clippy::too_many_arguments,
    reason = "the pass's state, its two ports, the target and the report"
)]
async fn scope_of(
    state: &mut DemandState,
    client: &GithubClient,
    journal: &Store,
    org: &str,
    installation: u64,
    active: Duration,
    now: SystemTime,
    report: &mut DemandReport,
) -> Result<Result<Vec<Repo>, GithubError>, DemandError> {
    let key = org.to_ascii_lowercase();
    let account = org.to_owned();
    let journal_view = journal.call(move |j| j.repositories_of(&account)).await?;
    let ttl = active * REPOSITORY_LIST_REFRESH_MULTIPLE;
    if let Some(cached) = state.scopes.get(&key) {
        let young = now
            .duration_since(cached.listed_at)
            .unwrap_or(Duration::ZERO)
            < ttl;
        if young && cached.journal_view == journal_view {
            return Ok(Ok(cached.repositories.clone()));
        }
    }
    report.requests += 1;
    state.lookups += 1;
    let listed = match client.list_installation_repositories(installation).await {
        Ok(listed) => listed.value,
        Err(error) => return Ok(Err(error)),
    };
    let repositories: Vec<Repo> = listed
        .into_iter()
        .filter(|r| r.owner.login.eq_ignore_ascii_case(org))
        .map(|r| (r.owner.login, r.name))
        .collect();
    state.scopes.insert(
        key,
        CachedScope {
            repositories: repositories.clone(),
            listed_at: now,
            journal_view,
        },
    );
    Ok(Ok(repositories))
}

/// Merges a run's jobs into the journal and notes queued jobs no delivery announced.
async fn record(
    state: &mut DemandState,
    journal: &Store,
    jobs: &[WorkflowJob],
    repository: &str,
    installation: u64,
    now: SystemTime,
    report: &mut DemandReport,
) -> Result<(), DemandError> {
    let at_ms = UnixMs::from_system_time(now).get();
    let (observations, created): (Vec<JobObservation>, Vec<&str>) = jobs
        .iter()
        .filter_map(|j| {
            observation(j, repository, Some(installation), at_ms)
                .map(|o| (o, j.created_at.as_str()))
        })
        .unzip();
    report.jobs_seen += observations.len();
    let sightings = journal
        .call(move |j| j.record_sightings(&observations))
        .await?;
    for (sighting, created) in sightings.iter().zip(created) {
        report.jobs_changed += usize::from(sighting.moved);
        // Counted once: when the poll is the first to put the job in `queued`.
        if sighting.moved && sighting.state == rm_vocab::JobState::Queued && !sighting.announced {
            let created = parse_rfc3339(created).unwrap_or(now);
            state.pending.entry(sighting.job_id).or_insert(created);
        }
    }
    Ok(())
}

/// Settles the queued jobs a poll found unannounced: one a delivery announced meanwhile is
/// forgotten; one still unannounced once its grace is over is evidence. Returns how many are.
pub(super) async fn settle_announcements(
    state: &mut DemandState,
    journal: &Store,
    now: SystemTime,
) -> Result<usize, DemandError> {
    let due: Vec<JobId> = state
        .pending
        .iter()
        .filter(|(_, since)| is_unannounced(**since, now))
        .map(|(id, _)| *id)
        .collect();
    if due.is_empty() {
        return Ok(0);
    }
    let asked = due.clone();
    let announced = journal.call(move |j| j.announced(&asked)).await?;
    for id in &due {
        state.pending.remove(id);
    }
    Ok(due.iter().filter(|id| !announced.contains(id)).count())
}

impl DemandState {
    /// When the next unannounced queued job's grace ends, if one is waiting.
    pub(crate) fn next_announcement_due(&self) -> Option<SystemTime> {
        self.pending
            .values()
            .map(|since| *since + super::health::ANNOUNCE_GRACE)
            .min()
    }
}

#[cfg(test)]
mod vanished_tests {
    use super::*;

    fn job(id: i64) -> QueuedJobRef {
        QueuedJobRef {
            job_id: JobId::new(id),
            repository: "acme/widgets".into(),
            updated_at_ms: UnixMs::EPOCH,
            checked_at_ms: None,
        }
    }

    #[test]
    fn a_queued_job_whose_run_is_no_longer_listed_has_vanished() {
        let active: HashSet<u64> = [10, 11].into_iter().collect();
        let found = vanished(vec![(job(1), 10), (job(2), 12), (job(3), 11)], &active);
        assert_eq!(found, vec![job(2)]);
    }
}
