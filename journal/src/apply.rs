//! Applying a handler's verdict to the journal inside a transaction the caller owns. The group
//! writer and `deliveries replay` both come through here, so a replay does exactly what the
//! original delivery would have done.

use rm_handlers::{Change, Installation, JobObservation, Repository, Verdict};
use rm_vocab::{JobMerge, JobState, Source};
use rusqlite::{Connection, OptionalExtension, params};

use crate::Outcome;
use rm_vocab::UnixMs;

/// The outcome of a verdict and the reason journalled beside it.
pub(crate) struct Applied {
    pub outcome: Outcome,
    pub reason: Option<String>,
}

/// Applies `verdict`'s changes. Returns `Duplicate` when changes were asked for and none of them
/// moved anything, so an operator can tell a stale re-send from real news.
pub(crate) fn apply_verdict(
    conn: &Connection,
    verdict: &Verdict,
    at_ms: UnixMs,
) -> rusqlite::Result<Applied> {
    apply_verdict_with(verdict, |change| apply_change(conn, change, at_ms))
}

/// The outcome of a verdict, each change applied by `apply_change` (`Some(why)` when it changed
/// nothing). The one rule for both journals (SQLite, PostgreSQL): only the SQL differs.
pub(crate) fn apply_verdict_with<E>(
    verdict: &Verdict,
    mut apply_change: impl FnMut(&Change) -> Result<Option<String>, E>,
) -> Result<Applied, E> {
    match verdict {
        Verdict::Ignore { reason, .. } => Ok(Applied {
            outcome: Outcome::Ignored,
            reason: Some(reason.clone()),
        }),
        Verdict::Reject { reason, .. } => Ok(Applied {
            outcome: Outcome::Rejected,
            reason: Some(reason.clone()),
        }),
        Verdict::Stale { reason, .. } => Ok(Applied {
            outcome: Outcome::Stale,
            reason: Some(reason.clone()),
        }),
        Verdict::Apply { changes, note, .. } => {
            let mut stale = Vec::new();
            for change in changes {
                if let Some(why) = apply_change(change)? {
                    stale.push(why);
                }
            }
            if !changes.is_empty() && stale.len() == changes.len() {
                Ok(Applied {
                    outcome: Outcome::Duplicate,
                    reason: Some(stale.join("; ")),
                })
            } else {
                Ok(Applied {
                    outcome: Outcome::Applied,
                    reason: note.clone(),
                })
            }
        }
    }
}

/// Applies one change; `Some(why)` when it changed nothing.
fn apply_change(
    conn: &Connection,
    change: &Change,
    at_ms: UnixMs,
) -> rusqlite::Result<Option<String>> {
    let changed = match change {
        Change::Job(job) => return apply_job(conn, job),
        Change::InstallationUpsert(installation) => upsert_installation(conn, installation, at_ms)?,
        Change::InstallationSuspended {
            installation_id,
            suspended,
        } => {
            conn.prepare_cached(
                "INSERT INTO installations (id, suspended, updated_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET suspended = excluded.suspended,
                     updated_at = excluded.updated_at
                 WHERE suspended != excluded.suspended",
            )?
            .execute(params![installation_id, suspended, at_ms])?
                > 0
        }
        Change::InstallationRemoved { installation_id } => {
            let removed = conn
                .prepare_cached(
                    "INSERT INTO installations (id, removed, updated_at) VALUES (?1, 1, ?2)
                     ON CONFLICT (id) DO UPDATE SET removed = 1, updated_at = excluded.updated_at
                     WHERE removed = 0",
                )?
                .execute(params![installation_id, at_ms])?;
            let repos = conn
                .prepare_cached("DELETE FROM installation_repositories WHERE installation_id = ?1")?
                .execute([installation_id])?;
            removed + repos > 0
        }
        Change::RepositoriesAdded {
            installation_id,
            repositories,
        } => {
            ensure_installation(conn, *installation_id, at_ms)?;
            add_repositories(conn, *installation_id, repositories)? > 0
        }
        Change::RepositoriesRemoved {
            installation_id,
            repository_ids,
        } => {
            let mut delete = conn.prepare_cached(
                "DELETE FROM installation_repositories
                 WHERE installation_id = ?1 AND repository_id = ?2",
            )?;
            let mut removed = 0;
            for id in repository_ids {
                removed += delete.execute(params![installation_id, id])?;
            }
            removed > 0
        }
    };
    Ok((!changed).then(|| SCOPE_UNCHANGED.to_owned()))
}

/// Merges a job sighting forward only. The update is compare-and-set on the rank, so a writer
/// that read an older state can never move the row backwards.
///
/// The sighting is also dated on the row: a delivery's in `announced_at`, a poll's in
/// `polled_at` (the first of each), so the polling fallback can tell a job no delivery announced.
pub(crate) fn apply_job(
    conn: &Connection,
    job: &JobObservation,
) -> rusqlite::Result<Option<String>> {
    let found: Option<(String, Option<i64>, Option<i64>)> = conn
        .prepare_cached("SELECT state, announced_at, polled_at FROM jobs WHERE job_id = ?1")?
        .query_row([job.job_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()?;
    let (current, announced_at, polled_at) = match found {
        Some((state, announced, polled)) => (Some(state), announced, polled),
        None => (None, None, None),
    };
    let current_state = current.as_deref().and_then(JobState::parse);
    let labels = serde_json::to_string(&job.labels).unwrap_or_else(|_| "[]".to_owned());
    let polled = job.source == Source::Poll;
    let announced_now = (!polled).then_some(job.observed_at_ms);
    let polled_now = polled.then_some(job.observed_at_ms);
    let merge = rm_vocab::merge_job(current_state, job.state);
    // When the job started: GitHub's `started_at`, else the time the journal learned of the
    // `in_progress` transition (a sighting of a finished job without one says nothing of it).
    let started_at = job
        .started_at_ms
        .or((job.state == JobState::InProgress).then_some(job.observed_at_ms));
    let moved = match merge {
        JobMerge::Insert => conn
            .prepare_cached(
                "INSERT INTO jobs (job_id, run_id, run_attempt, repository, installation_id,
                     labels, workflow_name, job_name, state, state_rank, conclusion, runner_name,
                     runner_id, source, first_seen_at, updated_at, announced_at, polled_at,
                     queued_at, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?15,
                     ?16, ?17, ?18, ?19)
                 ON CONFLICT (job_id) DO NOTHING",
            )?
            .execute(params![
                job.job_id,
                job.run_id,
                job.run_attempt,
                job.repository,
                job.installation_id,
                labels,
                job.workflow_name,
                job.job_name,
                job.state.as_str(),
                job.state.rank(),
                job.conclusion,
                job.runner_name,
                job.runner_id,
                job.source.as_str(),
                job.observed_at_ms,
                announced_now,
                polled_now,
                job.queued_at_ms,
                started_at,
            ])?,
        JobMerge::Advance => conn
            .prepare_cached(
                "UPDATE jobs SET state = ?2, state_rank = ?3,
                     conclusion = COALESCE(?4, conclusion),
                     runner_name = COALESCE(?5, runner_name),
                     runner_id = COALESCE(?6, runner_id),
                     installation_id = COALESCE(?7, installation_id),
                     source = ?8, updated_at = ?9,
                     announced_at = COALESCE(announced_at, ?10),
                     polled_at = COALESCE(polled_at, ?11),
                     queued_at = COALESCE(queued_at, ?12),
                     started_at = COALESCE(started_at, ?13)
                 WHERE job_id = ?1 AND state_rank < ?3",
            )?
            .execute(params![
                job.job_id,
                job.state.as_str(),
                job.state.rank(),
                job.conclusion,
                job.runner_name,
                job.runner_id,
                job.installation_id,
                job.source.as_str(),
                job.observed_at_ms,
                announced_now,
                polled_now,
                job.queued_at_ms,
                started_at,
            ])?,
        JobMerge::Stale => 0,
    };
    // A stale sighting still dates the first announcement or poll (one row, rarely).
    if moved == 0 && merge != JobMerge::Insert {
        let column = match (announced_now, polled_now) {
            (Some(at), _) if announced_at.is_none() => Some(("announced_at", at)),
            (_, Some(at)) if polled_at.is_none() => Some(("polled_at", at)),
            _ => None,
        };
        if let Some((column, at)) = column {
            conn.prepare_cached(&format!(
                "UPDATE jobs SET {column} = ?2 WHERE job_id = ?1 AND {column} IS NULL"
            ))?
            .execute(params![job.job_id, at])?;
        }
        // And GitHub's own dates of the wait, when the row lacks them (an `in_progress` that
        // arrives after the `completed`); never the arrival time, which is not the start.
        conn.prepare_cached(
            "UPDATE jobs SET queued_at = COALESCE(queued_at, ?2),
                 started_at = COALESCE(started_at, ?3)
             WHERE job_id = ?1 AND ((queued_at IS NULL AND ?2 IS NOT NULL)
                 OR (started_at IS NULL AND ?3 IS NOT NULL))",
        )?
        .execute(params![job.job_id, job.queued_at_ms, job.started_at_ms])?;
    }
    Ok((moved == 0).then(|| job_unchanged(job, current.as_deref())))
}

/// Why an installation change moved nothing.
pub(crate) const SCOPE_UNCHANGED: &str = "the installation scope already said so";

/// Why a job sighting moved nothing, given the state the journal holds.
pub(crate) fn job_unchanged(job: &JobObservation, current: Option<&str>) -> String {
    format!(
        "job {} is already {}; a `{}` sighting changes nothing",
        job.job_id,
        current.unwrap_or("journalled"),
        job.state.as_str()
    )
}

fn upsert_installation(
    conn: &Connection,
    installation: &Installation,
    at_ms: UnixMs,
) -> rusqlite::Result<bool> {
    let mut changed = conn
        .prepare_cached(
            "INSERT INTO installations (id, account, account_type, repository_selection,
                 suspended, removed, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6)
             ON CONFLICT (id) DO UPDATE SET
                 account = COALESCE(excluded.account, account),
                 account_type = COALESCE(excluded.account_type, account_type),
                 repository_selection = COALESCE(excluded.repository_selection, repository_selection),
                 suspended = excluded.suspended, removed = 0, updated_at = excluded.updated_at",
        )?
        .execute(params![
            installation.id,
            installation.account,
            installation.account_type,
            installation.repository_selection,
            installation.suspended,
            at_ms,
        ])?
        > 0;
    if let Some(repositories) = &installation.repositories {
        // The delivery lists the whole scope: it replaces what the journal knew.
        conn.prepare_cached("DELETE FROM installation_repositories WHERE installation_id = ?1")?
            .execute([installation.id])?;
        changed |= add_repositories(conn, installation.id, repositories)? > 0;
    }
    Ok(changed)
}

fn ensure_installation(conn: &Connection, id: i64, at_ms: UnixMs) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO installations (id, updated_at) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING",
    )?
    .execute(params![id, at_ms])?;
    Ok(())
}

fn add_repositories(
    conn: &Connection,
    installation_id: i64,
    repositories: &[Repository],
) -> rusqlite::Result<usize> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO installation_repositories (installation_id, repository_id, full_name)
         VALUES (?1, ?2, ?3)
         ON CONFLICT (installation_id, repository_id) DO UPDATE SET full_name = excluded.full_name
         WHERE full_name != excluded.full_name",
    )?;
    let mut added = 0;
    for repo in repositories {
        added += insert.execute(params![installation_id, repo.id, repo.full_name])?;
    }
    Ok(added)
}
