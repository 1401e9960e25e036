//! Applying a handler's verdict to the PostgreSQL journal inside the writer's transaction: the
//! same rule as SQLite's (`crate::apply`: the outcome from `apply_verdict_with`, the forward-only
//! merge from `rm_vocab::merge_job`), in PostgreSQL's SQL. Unlike SQLite, several writers
//! (one per receiver) run at once, so a job row is read `FOR UPDATE` before it is merged, and an
//! insert that lost a race to another writer is merged again over the row that won.

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Row, Statement, Transaction};
use rm_handlers::{Change, Installation, JobObservation, Repository};
use rm_vocab::{JobId, JobMerge, JobState, RunnerId, Source, UnixMs};

use crate::apply::{Applied, SCOPE_UNCHANGED, apply_verdict_with, job_unchanged};

/// How many times a job sighting is merged again after its insert lost a race: once is enough
/// (the row then exists and is locked), the bound only stops a bug from spinning.
const MERGE_ATTEMPTS: usize = 3;

/// Why a verdict could not be applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApplyError {
    #[error("{}", super::describe(.0))]
    Postgres(#[from] postgres::Error),
    #[error("job {0} kept changing under concurrent writers")]
    Unsettled(JobId),
}

/// Statements prepared once per connection: the hot path is one round trip per statement, not
/// two (parse, then execute).
#[derive(Default)]
pub(crate) struct StatementCache {
    prepared: HashMap<&'static str, Statement>,
}

impl StatementCache {
    /// Forgets every statement (a new connection prepares its own).
    pub(crate) fn clear(&mut self) {
        self.prepared.clear();
    }
}

/// A transaction with the connection's prepared statements.
pub(crate) struct Sql<'a, 'b> {
    pub(crate) tx: &'a mut Transaction<'b>,
    pub(crate) cache: &'a mut StatementCache,
}

impl Sql<'_, '_> {
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.cache.prepared.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.tx.prepare(sql)?;
        self.cache.prepared.insert(sql, statement.clone());
        Ok(statement)
    }

    pub(crate) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.execute(&statement, params)
    }

    pub(crate) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.query(&statement, params)
    }

    pub(crate) fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.query_opt(&statement, params)
    }
}

/// Applies `verdict`'s changes (see `crate::apply::apply_verdict`).
pub(crate) fn apply_verdict(
    sql: &mut Sql<'_, '_>,
    verdict: &rm_handlers::Verdict,
    at_ms: UnixMs,
) -> Result<Applied, ApplyError> {
    apply_verdict_with(verdict, |change| apply_change(sql, change, at_ms))
}

fn apply_change(
    sql: &mut Sql<'_, '_>,
    change: &Change,
    at_ms: UnixMs,
) -> Result<Option<String>, ApplyError> {
    let changed = match change {
        Change::Job(job) => return apply_job(sql, job),
        Change::InstallationUpsert(installation) => upsert_installation(sql, installation, at_ms)?,
        Change::InstallationSuspended {
            installation_id,
            suspended,
        } => {
            sql.execute(
                "INSERT INTO installations (id, suspended, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET suspended = excluded.suspended,
                     updated_at = excluded.updated_at
                 WHERE installations.suspended != excluded.suspended",
                &[installation_id, suspended, &at_ms.get()],
            )? > 0
        }
        Change::InstallationRemoved { installation_id } => {
            let removed = sql.execute(
                "INSERT INTO installations (id, removed, updated_at) VALUES ($1, TRUE, $2)
                 ON CONFLICT (id) DO UPDATE SET removed = TRUE, updated_at = excluded.updated_at
                 WHERE NOT installations.removed",
                &[installation_id, &at_ms.get()],
            )?;
            let repos = sql.execute(
                "DELETE FROM installation_repositories WHERE installation_id = $1",
                &[installation_id],
            )?;
            removed + repos > 0
        }
        Change::RepositoriesAdded {
            installation_id,
            repositories,
        } => {
            sql.execute(
                "INSERT INTO installations (id, updated_at) VALUES ($1, $2)
                 ON CONFLICT (id) DO NOTHING",
                &[installation_id, &at_ms.get()],
            )?;
            add_repositories(sql, *installation_id, repositories)? > 0
        }
        Change::RepositoriesRemoved {
            installation_id,
            repository_ids,
        } => {
            let mut removed = 0;
            for id in repository_ids {
                removed += sql.execute(
                    "DELETE FROM installation_repositories
                     WHERE installation_id = $1 AND repository_id = $2",
                    &[installation_id, id],
                )?;
            }
            removed > 0
        }
    };
    Ok((!changed).then(|| SCOPE_UNCHANGED.to_owned()))
}

/// Merges a job sighting forward only, as SQLite's `apply_job` does. The row is locked while it
/// is merged, so two writers' sightings of one job are merged one after the other.
pub(crate) fn apply_job(
    sql: &mut Sql<'_, '_>,
    job: &JobObservation,
) -> Result<Option<String>, ApplyError> {
    let labels = serde_json::to_string(&job.labels).unwrap_or_else(|_| "[]".to_owned());
    let polled = job.source == Source::Poll;
    // The times cross this edge as their numbers (see `super::job_numbers`).
    let observed_at = job.observed_at_ms.get();
    let queued_at = job.queued_at_ms.map(UnixMs::get);
    let announced_now = (!polled).then_some(observed_at);
    let polled_now = polled.then_some(observed_at);
    let started_at = job
        .started_at_ms
        .map(UnixMs::get)
        .or((job.state == JobState::InProgress).then_some(observed_at));
    for _ in 0..MERGE_ATTEMPTS {
        let found = sql.query_opt(
            "SELECT state, announced_at, polled_at FROM jobs WHERE job_id = $1 FOR UPDATE",
            &[&job.job_id.get()],
        )?;
        let (current, announced_at, polled_at): (Option<String>, Option<i64>, Option<i64>) =
            match &found {
                Some(row) => (Some(row.get(0)), row.get(1), row.get(2)),
                None => (None, None, None),
            };
        let merge = rm_vocab::merge_job(current.as_deref().and_then(JobState::parse), job.state);
        let moved = match merge {
            JobMerge::Insert => {
                let inserted = sql.execute(
                    "INSERT INTO jobs (job_id, run_id, run_attempt, repository, installation_id,
                         labels, workflow_name, job_name, state, state_rank, conclusion,
                         runner_name, runner_id, source, first_seen_at, updated_at, announced_at,
                         polled_at, queued_at, started_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                         $15, $16, $17, $18, $19)
                     ON CONFLICT (job_id) DO NOTHING",
                    &[
                        &job.job_id.get(),
                        &job.run_id,
                        &job.run_attempt,
                        &job.repository,
                        &job.installation_id,
                        &labels,
                        &job.workflow_name,
                        &job.job_name,
                        &job.state.as_str(),
                        &job.state.rank(),
                        &job.conclusion,
                        &job.runner_name,
                        &job.runner_id.map(RunnerId::get),
                        &job.source.as_str(),
                        &observed_at,
                        &announced_now,
                        &polled_now,
                        &queued_at,
                        &started_at,
                    ],
                )?;
                if inserted == 0 {
                    // Another writer inserted it since our read: merge over its row.
                    continue;
                }
                inserted
            }
            JobMerge::Advance => sql.execute(
                "UPDATE jobs SET state = $2, state_rank = $3,
                     conclusion = COALESCE($4, conclusion),
                     runner_name = COALESCE($5, runner_name),
                     runner_id = COALESCE($6, runner_id),
                     installation_id = COALESCE($7, installation_id),
                     source = $8, updated_at = $9,
                     announced_at = COALESCE(announced_at, $10),
                     polled_at = COALESCE(polled_at, $11),
                     queued_at = COALESCE(queued_at, $12),
                     started_at = COALESCE(started_at, $13)
                 WHERE job_id = $1 AND state_rank < $3",
                &[
                    &job.job_id.get(),
                    &job.state.as_str(),
                    &job.state.rank(),
                    &job.conclusion,
                    &job.runner_name,
                    &job.runner_id.map(RunnerId::get),
                    &job.installation_id,
                    &job.source.as_str(),
                    &observed_at,
                    &announced_now,
                    &polled_now,
                    &queued_at,
                    &started_at,
                ],
            )?,
            JobMerge::Stale => 0,
        };
        if moved == 0 && merge != JobMerge::Insert {
            date_stale_sighting(sql, job, announced_at, polled_at, announced_now, polled_now)?;
        }
        return Ok((moved == 0).then(|| job_unchanged(job, current.as_deref())));
    }
    // Not seen in practice (see MERGE_ATTEMPTS): the delivery is journalled as rejected with
    // the reason, to be replayed.
    Err(ApplyError::Unsettled(job.job_id))
}

/// A stale sighting still dates the first announcement or poll, and GitHub's own dates of the
/// wait when the row lacks them (as SQLite's `apply_job`).
fn date_stale_sighting(
    sql: &mut Sql<'_, '_>,
    job: &JobObservation,
    announced_at: Option<i64>,
    polled_at: Option<i64>,
    announced_now: Option<i64>,
    polled_now: Option<i64>,
) -> Result<(), postgres::Error> {
    match (announced_now, polled_now) {
        (Some(at), _) if announced_at.is_none() => {
            sql.execute(
                "UPDATE jobs SET announced_at = $2 WHERE job_id = $1 AND announced_at IS NULL",
                &[&job.job_id.get(), &at],
            )?;
        }
        (_, Some(at)) if polled_at.is_none() => {
            sql.execute(
                "UPDATE jobs SET polled_at = $2 WHERE job_id = $1 AND polled_at IS NULL",
                &[&job.job_id.get(), &at],
            )?;
        }
        _ => {}
    }
    sql.execute(
        "UPDATE jobs SET queued_at = COALESCE(queued_at, $2::BIGINT),
             started_at = COALESCE(started_at, $3::BIGINT)
         WHERE job_id = $1 AND ((queued_at IS NULL AND $2::BIGINT IS NOT NULL)
             OR (started_at IS NULL AND $3::BIGINT IS NOT NULL))",
        &[
            &job.job_id.get(),
            &job.queued_at_ms.map(UnixMs::get),
            &job.started_at_ms.map(UnixMs::get),
        ],
    )?;
    Ok(())
}

fn upsert_installation(
    sql: &mut Sql<'_, '_>,
    installation: &Installation,
    at_ms: UnixMs,
) -> Result<bool, postgres::Error> {
    let mut changed = sql.execute(
        "INSERT INTO installations (id, account, account_type, repository_selection,
             suspended, removed, updated_at)
         VALUES ($1, $2, $3, $4, $5, FALSE, $6)
         ON CONFLICT (id) DO UPDATE SET
             account = COALESCE(excluded.account, installations.account),
             account_type = COALESCE(excluded.account_type, installations.account_type),
             repository_selection = COALESCE(excluded.repository_selection,
                 installations.repository_selection),
             suspended = excluded.suspended, removed = FALSE, updated_at = excluded.updated_at",
        &[
            &installation.id,
            &installation.account,
            &installation.account_type,
            &installation.repository_selection,
            &installation.suspended,
            &at_ms.get(),
        ],
    )? > 0;
    if let Some(repositories) = &installation.repositories {
        // The delivery lists the whole scope: it replaces what the journal knew.
        sql.execute(
            "DELETE FROM installation_repositories WHERE installation_id = $1",
            &[&installation.id],
        )?;
        changed |= add_repositories(sql, installation.id, repositories)? > 0;
    }
    Ok(changed)
}

fn add_repositories(
    sql: &mut Sql<'_, '_>,
    installation_id: i64,
    repositories: &[Repository],
) -> Result<u64, postgres::Error> {
    let mut added = 0;
    for repo in repositories {
        added += sql.execute(
            "INSERT INTO installation_repositories (installation_id, repository_id, full_name)
             VALUES ($1, $2, $3)
             ON CONFLICT (installation_id, repository_id) DO UPDATE
                 SET full_name = excluded.full_name
             WHERE installation_repositories.full_name != excluded.full_name",
            &[&installation_id, &repo.id, &repo.full_name],
        )?;
    }
    Ok(added)
}
