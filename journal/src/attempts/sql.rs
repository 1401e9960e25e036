//! The statements over the `attempts` table: creation, the compare-and-set transitions, the
//! write-once fields, and the reads (by id, by runner name, by scope, live counts).

use std::path::PathBuf;

use rm_vocab::{JobId, RunnerId};
use rusqlite::types::ToSql;
use rusqlite::{
    Connection, ErrorCode, OptionalExtension, Row, Transaction, TransactionBehavior, params,
};

use super::types::AttemptState::{Busy, Cleaned, Idle, JitReceived, Starting};
use super::types::*;
use rm_vocab::UnixMs;

pub(crate) const ATTEMPT_COLUMNS: &str = "attempt_id, policy, runner_name, workspace, runtime_dir, state, \
     state_changed_at, outcome, reason, detail, runner_id, job_id, pid, pid_start_time, stop_intent, \
     stop_intent_at, created_at, updated_at, pid_boot_id, isolation, uid, cgroup, released_at, image, \
     shape_labels, shape_cpu_millis, shape_memory, shape_disk, shape_devices";

/// Where [`ATTEMPT_COLUMNS`]' shape columns (`crate::shapes::SHAPE_COLUMNS`) start.
const SHAPE_FIRST: usize = 24;

/// `'a', 'b'` for an SQL `IN` list. The names come from the enums, never from input.
pub(super) fn in_list(states: &[AttemptState]) -> String {
    states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The live-state filter, spelled as the partial index `attempts_live` spells it so the planner
/// uses that index.
pub(super) fn live_filter() -> String {
    format!("state IN ({})", in_list(&AttemptState::LIVE))
}

pub(crate) fn attempt_row(row: &Row<'_>) -> rusqlite::Result<AttemptRecord> {
    let attempt_id: String = row.get(0)?;
    let runtime_dir: String = row.get(4)?;
    Ok(AttemptRecord {
        // The schema's CHECK admits only well-formed ids.
        attempt_id: AttemptId(attempt_id),
        policy: row.get(1)?,
        runner_name: row.get(2)?,
        workspace: row.get(3)?,
        runtime_dir: PathBuf::from(runtime_dir),
        state: row.get(5)?,
        state_changed_at_ms: row.get(6)?,
        outcome: row.get(7)?,
        reason: row.get(8)?,
        detail: row.get(9)?,
        runner_id: row.get(10)?,
        job_id: row.get(11)?,
        pid: row.get(12)?,
        pid_start_time: row.get(13)?,
        stop_intent: row.get(14)?,
        stop_intent_at_ms: row.get(15)?,
        created_at_ms: row.get(16)?,
        updated_at_ms: row.get(17)?,
        pid_boot_id: row.get(18)?,
        isolation: row.get(19)?,
        uid: row.get(20)?,
        cgroup: row.get::<_, Option<String>>(21)?.map(PathBuf::from),
        released_at_ms: row.get(22)?,
        image: row.get(23)?,
        shape: crate::shapes::shape_at(row, SHAPE_FIRST)?,
    })
}

/// Journals a new attempt in `allocated` and returns its row: the row and the holds of its
/// shape's devices in one transaction, so both are written or neither is.
pub(crate) fn create(
    conn: &Connection,
    new: &NewAttempt<'_>,
) -> Result<AttemptRecord, AttemptError> {
    let id = new.attempt_id;
    let short = id.short();
    let well_named = new
        .runner_name
        .strip_prefix("rm-")
        .and_then(|rest| rest.strip_suffix(short))
        .is_some_and(|host| host.len() > 1 && host.ends_with('-'));
    if !well_named {
        return Err(AttemptError::InvalidRunnerName {
            attempt_id: id.clone(),
            runner_name: new.runner_name.to_owned(),
        });
    }
    let runtime_dir = new
        .runtime_dir
        .to_str()
        .ok_or_else(|| AttemptError::NonUtf8Path(new.runtime_dir.to_owned()))?;
    let cgroup = match new.cgroup {
        Some(path) => Some(
            path.to_str()
                .ok_or_else(|| AttemptError::NonUtf8Path(path.to_owned()))?,
        ),
        None => None,
    };
    if let Some(image) = new.image.filter(|image| !is_image_id(image)) {
        return Err(AttemptError::InvalidImage(image.to_owned()));
    }
    if let Some(shape) = new.shape {
        crate::shapes::check_devices(shape)?;
    }
    let (shape_labels, shape_devices) = crate::shapes::shape_lists(new.shape)?;
    // Immediate: the write lock is taken at BEGIN, so a second writer waits here rather than
    // failing to upgrade a read transaction. Dropped without commit on any error: rolled back.
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let conn: &Connection = &tx;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
                 state_changed_at, created_at, updated_at, isolation, uid, cgroup, image,
                 shape_labels, shape_cpu_millis, shape_memory, shape_disk, shape_devices)
             VALUES (?1, ?2, ?3, ?4, ?5, 'allocated', ?6, ?6, ?6, ?7, ?8, ?9, ?10,
                     ?11, ?12, ?13, ?14, ?15)",
        )?
        .execute(params![
            id.as_str(),
            new.policy,
            new.runner_name,
            new.workspace,
            runtime_dir,
            new.created_at_ms,
            new.isolation,
            new.uid,
            cgroup,
            new.image,
            shape_labels,
            new.shape.map(|s| s.cpu_millis),
            new.shape.map(|s| s.memory),
            new.shape.map(|s| s.disk),
            shape_devices,
        ]);
    match inserted {
        Ok(_) => {}
        Err(err) if err.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
            // Name the constraint that refused it; the statement itself is atomic.
            let clash: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM attempts WHERE attempt_id = ?1 OR runner_name = ?2)",
                )?
                .query_row(params![id.as_str(), new.runner_name], |r| r.get(0))?;
            if clash {
                return Err(AttemptError::AlreadyJournalled {
                    attempt_id: id.clone(),
                    runner_name: new.runner_name.to_owned(),
                });
            }
            let occupied: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM attempts
                         WHERE runtime_dir = ?1 AND state != 'cleaned')",
                )?
                .query_row([runtime_dir], |r| r.get(0))?;
            if occupied {
                return Err(AttemptError::WorkspaceInUse(new.runtime_dir.to_owned()));
            }
            if let Some(uid) = new.uid {
                let held: bool = conn
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM attempts
                             WHERE uid = ?1 AND state != 'cleaned' AND released_at IS NULL)",
                    )?
                    .query_row([uid], |r| r.get(0))?;
                if held {
                    return Err(AttemptError::UidInUse(uid));
                }
            }
            return Err(err.into());
        }
        Err(err) => return Err(err.into()),
    }
    if let Some(shape) = new.shape {
        crate::shapes::hold(conn, id, &shape.devices, new.created_at_ms)?;
    }
    let record = get(conn, id)?.ok_or_else(|| AttemptError::Unknown(id.clone()))?;
    tx.commit()?;
    Ok(record)
}

/// The runner uids attempts neither cleaned nor released hold (spelled as the partial index
/// `attempts_uid_held` spells it).
pub(crate) fn held_uids(conn: &Connection) -> Result<Vec<u32>, AttemptError> {
    let mut stmt = conn.prepare_cached(
        "SELECT uid FROM attempts
         WHERE state != 'cleaned' AND released_at IS NULL AND uid IS NOT NULL ORDER BY uid",
    )?;
    let rows = stmt.query_map([], |r| r.get::<_, u32>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// One attempt by id.
pub(crate) fn get(
    conn: &Connection,
    id: &AttemptId,
) -> Result<Option<AttemptRecord>, AttemptError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ?1"
        ))?
        .query_row([id.as_str()], attempt_row)
        .optional()?)
}

/// One attempt by runner name (a webhook names the runner, GitHub's inventory lists names).
pub(crate) fn by_runner_name(
    conn: &Connection,
    runner_name: &str,
) -> Result<Option<AttemptRecord>, AttemptError> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE runner_name = ?1"
        ))?
        .query_row([runner_name], attempt_row)
        .optional()?)
}

/// Attempts in `scope`, of one policy or all, oldest first (the order they were allocated).
pub(crate) fn list(
    conn: &Connection,
    scope: Scope,
    policy: Option<&str>,
) -> Result<Vec<AttemptRecord>, AttemptError> {
    let filter = match scope {
        Scope::All => "1".to_owned(),
        Scope::Uncleaned => "state != 'cleaned'".to_owned(),
        Scope::Live => live_filter(),
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {filter} AND (?1 IS NULL OR policy = ?1)
         ORDER BY created_at, attempt_id"
    ))?;
    let rows = stmt.query_map([policy], attempt_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Live attempts per policy (and so host-wide).
pub(crate) fn live_counts(conn: &Connection) -> Result<LiveCounts, AttemptError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT policy, COUNT(*), SUM(state = 'busy') FROM attempts WHERE {} GROUP BY policy",
        live_filter()
    ))?;
    let per_policy = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                PolicyLive {
                    live: row.get(1)?,
                    busy: row.get(2)?,
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    Ok(LiveCounts { per_policy })
}

/// The compare-and-set at the heart of every transition: moves `id` to `to` from any of
/// `from`, applying `set` (extra `column = ?n` assignments, parameters from `?4`) in the same
/// statement. Returns whether it won.
pub(super) fn compare_and_set(
    conn: &Connection,
    id: &AttemptId,
    from: &[AttemptState],
    to: AttemptState,
    set: &str,
    extra: &[&dyn ToSql],
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    for state in from {
        if !AttemptState::can_move(*state, to) {
            return Err(AttemptError::IllegalTransition {
                from: state.as_str(),
                to: to.as_str(),
            });
        }
    }
    if from.is_empty() {
        return Ok(false);
    }
    let sql = format!(
        "UPDATE attempts SET state = ?2, state_changed_at = ?3, updated_at = ?3{set}
         WHERE attempt_id = ?1 AND state IN ({})",
        in_list(from)
    );
    let mut values: Vec<&dyn ToSql> = vec![&id.0, &to, &at_ms];
    values.extend_from_slice(extra);
    let changed = conn
        .prepare_cached(&sql)?
        .execute(rusqlite::params_from_iter(values))?;
    Ok(changed == 1)
}

/// `allocated → jit_received`, with GitHub's runner id from the JIT response (recorded before the
/// process starts, so deregistration never depends on the process).
pub(crate) fn jit_received(
    conn: &Connection,
    id: &AttemptId,
    runner_id: RunnerId,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        JitReceived.allowed_predecessors(),
        JitReceived,
        ", runner_id = ?4",
        &[&runner_id],
        at_ms,
    )
}

/// `jit_received → starting`, with the process identity (pid and start time).
pub(crate) fn started(
    conn: &Connection,
    id: &AttemptId,
    pid: u32,
    pid_start_time: u64,
    boot_id: Option<&str>,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        Starting.allowed_predecessors(),
        Starting,
        // `started_at`: the runner's start, the end of a job's wait for a runner (CONTRACT §8),
        // kept when later states move `state_changed_at` on.
        ", pid = ?4, pid_start_time = ?5, pid_boot_id = ?6, started_at = ?3",
        &[&pid, &pid_start_time, &boot_id],
        at_ms,
    )
}

/// `starting → idle` (registered and waiting) or `busy → idle` (a job GitHub withdrew before
/// any worker started), from the state the observation was made in. Idle is the one move back,
/// so it is compare-and-set on that exact state: an observation of a starting runner must not
/// pull back one the webhook path has just marked busy.
pub(crate) fn mark_idle(
    conn: &Connection,
    id: &AttemptId,
    from: AttemptState,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    compare_and_set(conn, id, &[from], Idle, "", &[], at_ms)
}

/// `starting | idle → busy`, with the job when it is known (a later assignment replaces one
/// GitHub withdrew). Forward only, so any predecessor will do.
pub(crate) fn mark_busy(
    conn: &Connection,
    id: &AttemptId,
    job_id: Option<JobId>,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        Busy.allowed_predecessors(),
        Busy,
        ", job_id = COALESCE(?4, job_id)",
        &[&job_id],
        at_ms,
    )
}

/// Records a value that is journalled once (`runner_id`, `job_id`): set when empty, accepted
/// again when equal, refused when different. A cleaned attempt takes nothing.
pub(super) fn record_once(
    conn: &Connection,
    id: &AttemptId,
    column: &'static str,
    value: i64,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE attempts SET {column} = ?2, updated_at = ?3
             WHERE attempt_id = ?1 AND state != 'cleaned' AND {column} IS NULL"
        ))?
        .execute(params![id.as_str(), value, at_ms])?;
    if changed == 1 {
        return Ok(true);
    }
    let current: Option<(Option<i64>, AttemptState)> = conn
        .prepare_cached(&format!(
            "SELECT {column}, state FROM attempts WHERE attempt_id = ?1"
        ))?
        .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match current {
        None => Err(AttemptError::Unknown(id.clone())),
        Some((Some(journalled), _)) if journalled != value => Err(AttemptError::Conflict {
            attempt_id: id.clone(),
            field: column,
            journalled,
            offered: value,
        }),
        // Already this value, or the attempt is cleaned.
        Some(_) => Ok(false),
    }
}

/// Records a stop intent; `true` means it is journalled and synced and the signal may be sent.
/// It wins only while the attempt is in a state the intent applies to: a runner that turned busy
/// after the decision is never stopped for idling. A later intent replaces an earlier one (the
/// latest signal's reason is what recovery must conclude with).
pub(crate) fn record_stop_intent(
    conn: &Connection,
    id: &AttemptId,
    intent: StopIntent,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE attempts SET stop_intent = ?2, updated_at = ?3,
                 stop_intent_at = CASE WHEN stop_intent IS ?2 THEN stop_intent_at ELSE ?3 END
             WHERE attempt_id = ?1 AND state IN ({})",
            in_list(intent.applies_to())
        ))?
        .execute(params![id.as_str(), intent, at_ms])?;
    Ok(changed == 1)
}

/// Concludes an attempt that is still in `from` (the state the decision was made from): a
/// runner that changed state since (took a job, say) is not concluded on stale facts.
pub(crate) fn conclude(
    conn: &Connection,
    id: &AttemptId,
    from: AttemptState,
    outcome: AttemptOutcome,
    reason: Option<&str>,
    detail: Option<&str>,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    compare_and_set(
        conn,
        id,
        &[from],
        outcome.terminal_state(),
        ", outcome = ?4, reason = ?5, detail = ?6",
        &[&outcome, &reason, &detail],
        at_ms,
    )
}

/// Records that a concluded attempt (`finished | failed | orphaned`) is released: its processes
/// are proven gone and its runtime removed (or its slot scrubbed), so its runner uid and its
/// devices are free for the next runner while its registration may still wait for GitHub. The
/// devices are freed in the same transaction. Write-once: `Ok(true)` only the first time;
/// `Ok(false)` for an attempt already released, cleaned or not concluded.
pub(crate) fn mark_released(
    conn: &Connection,
    id: &AttemptId,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let changed = tx
        .prepare_cached(&format!(
            "UPDATE attempts SET released_at = ?2, updated_at = ?2
             WHERE attempt_id = ?1 AND state IN ({}) AND released_at IS NULL",
            in_list(&AttemptState::TERMINAL)
        ))?
        .execute(params![id.as_str(), at_ms])?;
    if changed == 1 {
        crate::shapes::free(&tx, id)?;
    }
    tx.commit()?;
    Ok(changed == 1)
}

/// `finished | failed | orphaned → cleaned`: deregistered (or given up on) and the workspace
/// removed or scrubbed. Frees the runtime directory, and the devices of an attempt cleaned
/// without being released first (in the same transaction), for the next attempt.
pub(crate) fn mark_cleaned(
    conn: &Connection,
    id: &AttemptId,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let won = compare_and_set(
        &tx,
        id,
        Cleaned.allowed_predecessors(),
        Cleaned,
        "",
        &[],
        at_ms,
    )?;
    if won {
        crate::shapes::free(&tx, id)?;
    }
    tx.commit()?;
    Ok(won)
}
