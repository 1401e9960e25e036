//! Bounded retention: delivery bodies, old delivery rows, finished jobs and cleaned runner
//! attempts are removed in small steps so the file does not grow without end and no step holds
//! the writer for long.

use std::time::Duration;

use rm_vocab::UnixMs;
use rusqlite::{Connection, params};

/// How often a retention pass starts.
pub(crate) const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// The most rows one prune step touches per table.
const PRUNE_STEP_ROWS: i64 = 1000;

/// How long the journal keeps what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Delivery bodies are dropped after this (the row, with its outcome, stays). GitHub lets an
    /// App redeliver for 3 days, so this is what `deliveries replay` can reach back.
    pub delivery_bodies: Duration,
    /// Delivery rows are removed after this. Must cover GitHub's redelivery window, since a
    /// removed GUID would be accepted as new again.
    pub delivery_rows: Duration,
    /// Completed jobs, and runner attempts cleaned this long ago, are removed after this.
    pub finished_jobs: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Retention {
            delivery_bodies: Duration::from_secs(7 * DAY),
            delivery_rows: Duration::from_secs(30 * DAY),
            finished_jobs: Duration::from_secs(7 * DAY),
        }
    }
}

fn cutoff(now: UnixMs, keep: Duration) -> UnixMs {
    now - keep
}

/// Runs one bounded step of retention. Returns `true` when there is more to remove.
pub(crate) fn prune_step(
    conn: &mut Connection,
    retention: &Retention,
    now: UnixMs,
) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let bodies = tx.execute(
        "UPDATE deliveries SET body = NULL WHERE id IN (
             SELECT id FROM deliveries WHERE received_at < ?1 AND body IS NOT NULL LIMIT ?2)",
        params![cutoff(now, retention.delivery_bodies), PRUNE_STEP_ROWS],
    )?;
    let rows = tx.execute(
        "DELETE FROM deliveries WHERE id IN (
             SELECT id FROM deliveries WHERE received_at < ?1 LIMIT ?2)",
        params![cutoff(now, retention.delivery_rows), PRUNE_STEP_ROWS],
    )?;
    let jobs = tx.execute(
        "DELETE FROM jobs WHERE job_id IN (
             SELECT job_id FROM jobs WHERE state = 'completed' AND updated_at < ?1 LIMIT ?2)",
        params![cutoff(now, retention.finished_jobs), PRUNE_STEP_ROWS],
    )?;
    // Only cleaned attempts: a live or concluded one still has a runner or a workspace behind it.
    let attempts = tx.execute(
        "DELETE FROM attempts WHERE attempt_id IN (
             SELECT attempt_id FROM attempts
             WHERE state = 'cleaned' AND state_changed_at < ?1 LIMIT ?2)",
        params![cutoff(now, retention.finished_jobs), PRUNE_STEP_ROWS],
    )?;
    // Redelivery requests only matter inside GitHub's 3-day window; kept as long as the
    // delivery rows they stand beside.
    let redeliveries = tx.execute(
        "DELETE FROM redeliveries WHERE guid IN (
             SELECT guid FROM redeliveries WHERE requested_at < ?1 LIMIT ?2)",
        params![cutoff(now, retention.delivery_rows), PRUNE_STEP_ROWS],
    )?;
    // Scale-set messages as long as delivery rows (a pruned message redelivered would be taken
    // as new; GitHub redelivers only until it is acknowledged), their finished jobs as long as
    // finished jobs. The scale sets' own rows (cursor, session) are never pruned.
    let messages = tx.execute(
        "DELETE FROM scale_set_messages WHERE rowid IN (
             SELECT rowid FROM scale_set_messages WHERE received_at < ?1 LIMIT ?2)",
        params![cutoff(now, retention.delivery_rows), PRUNE_STEP_ROWS],
    )?;
    let scale_set_jobs = tx.execute(
        "DELETE FROM scale_set_jobs WHERE rowid IN (
             SELECT rowid FROM scale_set_jobs
             WHERE state = 'completed' AND updated_at < ?1 LIMIT ?2)",
        params![cutoff(now, retention.finished_jobs), PRUNE_STEP_ROWS],
    )?;
    tx.commit()?;
    let counts = [
        bodies,
        rows,
        jobs,
        attempts,
        redeliveries,
        messages,
        scale_set_jobs,
    ];
    if counts.iter().sum::<usize>() > 0 {
        tracing::debug!(
            bodies,
            rows,
            jobs,
            attempts,
            redeliveries,
            messages,
            scale_set_jobs,
            "journal retention step"
        );
    }
    let step = usize::try_from(PRUNE_STEP_ROWS).unwrap_or(usize::MAX);
    Ok(counts.contains(&step))
}
