//! The statements over `scale_sets`, `scale_set_messages` and `scale_set_jobs`: journalling a
//! message with everything it changes in one transaction, the listener's own writes (session,
//! statistics, cursor reset, note), and the reads (pruning is the journal's retention step, `retention.rs`).

use rm_vocab::UnixMs;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};

use super::types::*;
use crate::JournalError;

/// The columns [`record_row`] reads, in its order.
const RECORD_COLUMNS: &str = "name, scale_set_id, session_id, last_message_id, last_message_at, \
     statistics, statistics_at, messages, generation, note, note_at";

/// The columns [`job_row`] reads, in its order.
const JOB_COLUMNS: &str = "scale_set, job_id, runner_request_id, state, repository, \
     workflow_run_id, display_name, labels, runner_name, result, first_seen, updated_at, \
     message_id, unhandled";

/// A value as JSON text. The types written are plain structs and strings, which always
/// serialise; the error is kept rather than unwrapped all the same.
fn to_json<T: serde::Serialize>(value: &T) -> Result<String, JournalError> {
    serde_json::to_string(value)
        .map_err(|err| JournalError::Commit(format!("cannot write a scale-set value: {err}")))
}

/// A JSON column read back; a row this build did not write is an error naming the column.
fn from_json<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    index: usize,
) -> rusqlite::Result<Option<T>> {
    let Some(text) = row.get::<_, Option<String>>(index)? else {
        return Ok(None);
    };
    serde_json::from_str(&text).map(Some).map_err(|err| {
        rusqlite::Error::FromSqlConversionFailure(index, rusqlite::types::Type::Text, err.into())
    })
}

fn record_row(row: &Row<'_>) -> rusqlite::Result<ScaleSetRecord> {
    Ok(ScaleSetRecord {
        name: row.get(0)?,
        scale_set_id: row.get(1)?,
        session_id: row.get(2)?,
        last_message_id: row.get(3)?,
        last_message_at: row.get(4)?,
        statistics: from_json(row, 5)?,
        statistics_at: row.get(6)?,
        messages: row.get(7)?,
        generation: row.get(8)?,
        note: row.get(9)?,
        note_at: row.get(10)?,
    })
}

fn job_row(row: &Row<'_>) -> rusqlite::Result<ScaleSetJobRow> {
    Ok(ScaleSetJobRow {
        scale_set: row.get(0)?,
        job_id: row.get(1)?,
        runner_request_id: row.get(2)?,
        state: row.get(3)?,
        repository: row.get(4)?,
        workflow_run_id: row.get(5)?,
        display_name: row.get(6)?,
        labels: from_json(row, 7)?.unwrap_or_default(),
        runner_name: row.get(8)?,
        result: row.get(9)?,
        first_seen: row.get(10)?,
        updated_at: row.get(11)?,
        message_id: row.get(12)?,
        unhandled: row.get(13)?,
    })
}

/// One write transaction. `BEGIN IMMEDIATE` takes the write lock at once, so what is read inside
/// (a message already journalled, a job's state) is still true when it is written.
fn begin(conn: &Connection) -> rusqlite::Result<Transaction<'_>> {
    Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
}

/// Makes the scale set's row if it has none, so every write below is a plain `UPDATE`.
fn ensure(tx: &Connection, scale_set: &str, at: UnixMs) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO scale_sets (name, updated_at) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
    )?
    .execute(params![scale_set, at])?;
    Ok(())
}

pub(super) fn record_message(
    conn: &Connection,
    scale_set: &str,
    message: &IncomingMessage,
) -> Result<MessageRecorded, JournalError> {
    let at = message.received_at;
    let tx = begin(conn)?;
    ensure(&tx, scale_set, at)?;
    let generation: i64 = tx
        .prepare_cached("SELECT generation FROM scale_sets WHERE name = ?1")?
        .query_row([scale_set], |r| r.get(0))?;
    let seen: bool = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM scale_set_messages
                 WHERE scale_set = ?1 AND generation = ?2 AND message_id = ?3)",
        )?
        .query_row(params![scale_set, generation, message.message_id], |r| {
            r.get(0)
        })?;
    if seen {
        // Dropping the transaction rolls back the row `ensure` may have made (it cannot have:
        // a journalled message has its scale set's row).
        return Ok(MessageRecorded::AlreadyJournalled);
    }
    // A message whose type is not understood is kept and counted; nothing in it is applied,
    // statistics included, since what they mean beside that type is not known.
    let understood = message.unknown_type.is_none();
    let mut unhandled = 0_i64;
    if understood {
        for event in &message.events {
            if !apply_event(&tx, scale_set, message.message_id, event, at)? {
                unhandled += 1;
            }
        }
    }
    let statistics = match &message.statistics {
        Some(statistics) if understood => Some(to_json(statistics)?),
        _ => None,
    };
    tx.prepare_cached(
        "INSERT INTO scale_set_messages (scale_set, generation, message_id, received_at,
             statistics, event_count, unhandled, unknown_type, events)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        scale_set,
        generation,
        message.message_id,
        at,
        message.statistics.as_ref().map(to_json).transpose()?,
        message.events.len() as i64,
        unhandled,
        message.unknown_type,
        to_json(&message.events)?,
    ])?;
    // The cursor never goes back within a generation: a lower id not yet journalled (GitHub
    // reset its numbering) is journalled, and the poll still sends the highest.
    tx.prepare_cached(
        "UPDATE scale_sets SET
             last_message_id = max(last_message_id, ?2),
             last_message_at = ?3,
             messages = messages + 1,
             statistics = coalesce(?4, statistics),
             statistics_at = CASE WHEN ?4 IS NULL THEN statistics_at ELSE ?3 END,
             updated_at = ?3
         WHERE name = ?1",
    )?
    .execute(params![scale_set, message.message_id, at, statistics])?;
    tx.commit()?;
    Ok(MessageRecorded::New)
}

/// Applies one event to its job's row. `Ok(false)` when the event names no job (counted on the
/// message); an event of a kind this build does not know is kept on the job's row. Neither
/// fails the message: one event that cannot be handled must not block the scale set's queue
/// (GARM #812).
fn apply_event(
    tx: &Connection,
    scale_set: &str,
    message_id: i64,
    event: &JobEvent,
    at: UnixMs,
) -> Result<bool, JournalError> {
    if event.job_id.is_empty() {
        return Ok(false);
    }
    let row: Option<(ScaleSetJobState, Option<String>, Option<String>)> = tx
        .prepare_cached(
            "SELECT state, result, runner_name FROM scale_set_jobs
             WHERE scale_set = ?1 AND job_id = ?2",
        )?
        .query_row([scale_set, &event.job_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let current = row.as_ref().map(|(state, _, _)| *state);
    let reassignable = row.as_ref().is_some_and(|(state, result, runner)| {
        ScaleSetJobState::reassignable(*state, result.as_deref(), runner.as_deref())
    });
    let labels = to_json(&event.labels)?;
    let Some(state) = ScaleSetJobState::of_event(&event.kind) else {
        let why = format!(
            "message {message_id}: event kind {:?} is not known",
            event.kind
        );
        if current.is_some() {
            tx.prepare_cached(
                "UPDATE scale_set_jobs SET unhandled = ?3, updated_at = ?4
                 WHERE scale_set = ?1 AND job_id = ?2",
            )?
            .execute(params![scale_set, event.job_id, why, at])?;
        } else {
            insert_job(
                tx,
                scale_set,
                message_id,
                event,
                ScaleSetJobState::Available,
                &labels,
                Some(&why),
                at,
            )?;
        }
        return Ok(true);
    };
    if !ScaleSetJobState::moves(current, reassignable, state) {
        return Ok(true);
    }
    // Assigned again after a cancellation: the cancellation's result no longer holds.
    let reassigned = reassignable && state != ScaleSetJobState::Completed;
    if current.is_none() {
        insert_job(tx, scale_set, message_id, event, state, &labels, None, at)?;
        return Ok(true);
    }
    // What the job is (repository, name, labels) fills in what earlier events left empty; the
    // runner and result come with the events that carry them and are never erased by one that
    // does not.
    tx.prepare_cached(
        "UPDATE scale_set_jobs SET
             state = ?3,
             runner_request_id = CASE WHEN ?4 != 0 THEN ?4 ELSE runner_request_id END,
             repository = CASE WHEN repository = '' THEN ?5 ELSE repository END,
             workflow_run_id = coalesce(workflow_run_id, ?6),
             display_name = CASE WHEN display_name = '' THEN ?7 ELSE display_name END,
             labels = CASE WHEN labels = '[]' THEN ?8 ELSE labels END,
             runner_name = coalesce(?9, runner_name),
             result = CASE WHEN ?13 THEN NULL ELSE coalesce(?10, result) END,
             updated_at = ?11,
             message_id = ?12
         WHERE scale_set = ?1 AND job_id = ?2",
    )?
    .execute(params![
        scale_set,
        event.job_id,
        state,
        event.runner_request_id,
        event.repository,
        event.workflow_run_id,
        event.display_name,
        labels,
        runner_of(state, event),
        result_of(state, event),
        at,
        message_id,
        reassigned,
    ])?;
    Ok(true)
}

/// The runner an event names, from the kinds that carry one (`JobStarted`, `JobCompleted`).
fn runner_of(state: ScaleSetJobState, event: &JobEvent) -> Option<&str> {
    match state {
        ScaleSetJobState::Started | ScaleSetJobState::Completed => event.runner_name.as_deref(),
        ScaleSetJobState::Available | ScaleSetJobState::Assigned => None,
    }
}

/// The result an event carries: only a completion has one.
fn result_of(state: ScaleSetJobState, event: &JobEvent) -> Option<&str> {
    match state {
        ScaleSetJobState::Completed => event.result.as_deref(),
        _ => None,
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one row's columns, from one call site"
)]
fn insert_job(
    tx: &Connection,
    scale_set: &str,
    message_id: i64,
    event: &JobEvent,
    state: ScaleSetJobState,
    labels: &str,
    unhandled: Option<&str>,
    at: UnixMs,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO scale_set_jobs (scale_set, job_id, runner_request_id, state, repository,
             workflow_run_id, display_name, labels, runner_name, result, first_seen, updated_at,
             message_id, unhandled)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, ?12, ?13)",
    )?
    .execute(params![
        scale_set,
        event.job_id,
        event.runner_request_id,
        state,
        event.repository,
        event.workflow_run_id,
        event.display_name,
        labels,
        runner_of(state, event),
        result_of(state, event),
        at,
        message_id,
        unhandled,
    ])?;
    Ok(())
}

pub(super) fn record_statistics(
    conn: &Connection,
    scale_set: &str,
    statistics: &ScaleSetStatistics,
    at: UnixMs,
) -> Result<(), JournalError> {
    let statistics = to_json(statistics)?;
    let tx = begin(conn)?;
    ensure(&tx, scale_set, at)?;
    tx.prepare_cached(
        "UPDATE scale_sets SET statistics = ?2, statistics_at = ?3, updated_at = ?3
         WHERE name = ?1",
    )?
    .execute(params![scale_set, statistics, at])?;
    tx.commit()?;
    Ok(())
}

pub(super) fn record_session(
    conn: &Connection,
    scale_set: &str,
    scale_set_id: i64,
    session_id: Option<&str>,
    at: UnixMs,
) -> Result<(), JournalError> {
    let tx = begin(conn)?;
    ensure(&tx, scale_set, at)?;
    tx.prepare_cached(
        "UPDATE scale_sets SET scale_set_id = ?2, session_id = ?3, session_at = ?4,
             updated_at = ?4
         WHERE name = ?1",
    )?
    .execute(params![scale_set, scale_set_id, session_id, at])?;
    tx.commit()?;
    Ok(())
}

pub(super) fn reset_cursor(
    conn: &Connection,
    scale_set: &str,
    new_scale_set_id: i64,
    at: UnixMs,
) -> Result<(), JournalError> {
    let tx = begin(conn)?;
    ensure(&tx, scale_set, at)?;
    // A session recorded for the old id died with the old scale set; one already recorded for
    // the new id (the listener may record it first) is kept.
    tx.prepare_cached(
        "UPDATE scale_sets SET
             session_id = CASE WHEN scale_set_id IS ?2 THEN session_id ELSE NULL END,
             session_at = CASE WHEN scale_set_id IS ?2 THEN session_at ELSE ?3 END,
             scale_set_id = ?2,
             generation = generation + 1,
             last_message_id = 0,
             updated_at = ?3
         WHERE name = ?1",
    )?
    .execute(params![scale_set, new_scale_set_id, at])?;
    tx.commit()?;
    Ok(())
}

pub(super) fn record_note(
    conn: &Connection,
    scale_set: &str,
    note: Option<&str>,
    at: UnixMs,
) -> Result<(), JournalError> {
    let tx = begin(conn)?;
    ensure(&tx, scale_set, at)?;
    tx.prepare_cached(
        "UPDATE scale_sets SET note = ?2,
             note_at = CASE WHEN ?2 IS NULL THEN NULL ELSE ?3 END,
             updated_at = ?3
         WHERE name = ?1",
    )?
    .execute(params![scale_set, note, at])?;
    tx.commit()?;
    Ok(())
}

pub(super) fn get(
    conn: &Connection,
    scale_set: &str,
) -> Result<Option<ScaleSetRecord>, JournalError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {RECORD_COLUMNS} FROM scale_sets WHERE name = ?1"
        ))?
        .query_row([scale_set], record_row)
        .optional()?)
}

pub(super) fn all(conn: &Connection) -> Result<Vec<ScaleSetRecord>, JournalError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM scale_sets ORDER BY name"
    ))?;
    let rows = stmt.query_map([], record_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn jobs(
    conn: &Connection,
    scale_set: Option<&str>,
    limit: usize,
) -> Result<Vec<ScaleSetJobRow>, JournalError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {JOB_COLUMNS} FROM scale_set_jobs WHERE ?1 IS NULL OR scale_set = ?1
         ORDER BY updated_at DESC, rowid DESC LIMIT ?2"
    ))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt.query_map(params![scale_set, limit], job_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn job(conn: &Connection, job_id: &str) -> Result<Option<ScaleSetJobRow>, JournalError> {
    // A job id is GitHub's and names one job; were it in two scale sets' records, the one
    // changed last is the one that says where it is.
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM scale_set_jobs WHERE job_id = ?1
             ORDER BY updated_at DESC, rowid DESC LIMIT 1"
        ))?
        .query_row([job_id], job_row)
        .optional()?)
}
