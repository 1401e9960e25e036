//! An attempt's shape, the devices it holds, and what its runner used (schema v15, issue 42).
//!
//! This module owns the shape's persisted form (the `shape_*` columns of `attempts`), the
//! `device_holds` table and its statements, the usage recorded once at a runner's end (the
//! `usage_*` columns) and the reads over them: the devices held, the shapes of the attempts that
//! still occupy the host, and what each attempt of a policy asked for against what it used.
//!
//! The database fences devices itself, as the partial unique index fences runner uids: a
//! device's row in `device_holds` is its hold (the primary key admits one holder), inserted in
//! the transaction that inserts the attempt row and deleted in the transaction that releases or
//! cleans it (`crate::attempts`), so a crash at any step leaves either both or neither, and
//! never one device with two holders. The holds are in the host's own journal file, as its
//! attempts are in every configuration (`Store::attempts`, a fleet too): the file is the host,
//! so a hold carries no host column; the PostgreSQL schema has the same table for one version
//! across dialects, and nothing writes it there.

use rusqlite::types::Type;
use rusqlite::{Connection, ErrorCode, OptionalExtension as _, Row, params};
use serde::Serialize;

use crate::JournalError;
use crate::attempts::{AttemptError, AttemptId};
use rm_vocab::UnixMs;

/// What one attempt's runner takes from its host: written with the attempt row, never changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AttemptShape {
    /// The job's shape labels, as its JIT registration carries them.
    pub labels: Vec<String>,
    /// CPU the runner takes from the host's capacity, in thousandths of a CPU.
    pub cpu_millis: u64,
    /// Memory, bytes.
    pub memory: u64,
    /// Disk, bytes.
    pub disk: u64,
    /// The ids of the devices it holds (a device's first node path), each held by it alone
    /// until it is released or cleaned.
    pub devices: Vec<String>,
}

/// One attempt of a policy, what it asked for and what its runner used (`rm-agent shapes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShapeUsage {
    pub attempt_id: AttemptId,
    /// The job it ran, when the journal learned it.
    pub job_id: Option<rm_vocab::JobId>,
    /// The job's name, from this journal's `jobs` row of that job (`None` when the journal has
    /// no such row: in a fleet the jobs are in the shared database, keyed by `job_id`).
    pub job_name: Option<String>,
    /// What it asked for; `None` for an attempt journalled without a shape.
    pub shape: Option<AttemptShape>,
    /// `memory.peak`, bytes, when it could be read.
    pub peak_memory: Option<u64>,
    /// `cpu.stat`'s `usage_usec`, when it could be read.
    pub cpu_usec: Option<u64>,
    /// From the job's start (the journal's `jobs.started_at`) to the runner's end (when usage
    /// was recorded), when the journal knows both.
    pub ran_ms: Option<u64>,
}

/// The shape columns in the order [`shape_at`] reads them; `attempts::ATTEMPT_COLUMNS` ends
/// with them.
pub(crate) const SHAPE_COLUMNS: &str =
    "shape_labels, shape_cpu_millis, shape_memory, shape_disk, shape_devices";

/// The shape whose five columns start at `first` (all NULL: no shape; the schema's CHECK keeps
/// them NULL together).
pub(crate) fn shape_at(row: &Row<'_>, first: usize) -> rusqlite::Result<Option<AttemptShape>> {
    let Some(labels) = row.get::<_, Option<String>>(first)? else {
        return Ok(None);
    };
    Ok(Some(AttemptShape {
        labels: json_list(&labels, first)?,
        cpu_millis: row.get(first + 1)?,
        memory: row.get(first + 2)?,
        disk: row.get(first + 3)?,
        devices: json_list(&row.get::<_, String>(first + 4)?, first + 4)?,
    }))
}

/// A JSON array of strings as the shape columns keep them.
fn json_list(text: &str, column: usize) -> rusqlite::Result<Vec<String>> {
    serde_json::from_str(text)
        .map_err(|err| rusqlite::Error::FromSqlConversionFailure(column, Type::Text, Box::new(err)))
}

/// The shape's lists as the columns keep them (JSON arrays of strings), or `None` for no shape.
pub(crate) fn shape_lists(
    shape: Option<&AttemptShape>,
) -> Result<(Option<String>, Option<String>), AttemptError> {
    let Some(shape) = shape else {
        return Ok((None, None));
    };
    let text = |list: &[String]| {
        serde_json::to_string(list).map_err(|err| {
            AttemptError::from(rusqlite::Error::ToSqlConversionFailure(Box::new(err)))
        })
    };
    Ok((Some(text(&shape.labels)?), Some(text(&shape.devices)?)))
}

/// Refuses a shape whose device list names one device twice (the second hold would clash with
/// the first, and the caller meant something else) or an empty id.
pub(crate) fn check_devices(shape: &AttemptShape) -> Result<(), AttemptError> {
    for (i, device) in shape.devices.iter().enumerate() {
        if device.is_empty() || shape.devices[..i].contains(device) {
            return Err(AttemptError::InvalidDevice(device.clone()));
        }
    }
    Ok(())
}

/// Inserts the holds of `id` on `devices`, inside the caller's transaction (the one that inserts
/// the attempt row). A device already held fails with [`AttemptError::DeviceHeld`]; the caller
/// then drops its transaction, and neither the attempt nor any of its holds is written.
pub(crate) fn hold(
    conn: &Connection,
    id: &AttemptId,
    devices: &[String],
    at_ms: UnixMs,
) -> Result<(), AttemptError> {
    let mut insert = conn.prepare_cached(
        "INSERT INTO device_holds (device, attempt_id, held_at) VALUES (?1, ?2, ?3)",
    )?;
    for device in devices {
        match insert.execute(params![device, id.as_str(), at_ms]) {
            Ok(_) => {}
            Err(err) if err.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                let holder: Option<AttemptId> = conn
                    .prepare_cached("SELECT attempt_id FROM device_holds WHERE device = ?1")?
                    .query_row([device], |row| row.get(0))
                    .optional()?;
                return match holder {
                    Some(holder) => Err(AttemptError::DeviceHeld {
                        device: device.clone(),
                        holder,
                    }),
                    // Another constraint refused it (the attempt row's foreign key).
                    None => Err(err.into()),
                };
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// Frees every device `id` holds, inside the caller's transaction (the one that releases or
/// cleans it).
pub(crate) fn free(conn: &Connection, id: &AttemptId) -> Result<(), AttemptError> {
    conn.prepare_cached("DELETE FROM device_holds WHERE attempt_id = ?1")?
        .execute([id.as_str()])?;
    Ok(())
}

/// Every device held on this host and its holder, by device id.
pub(crate) fn held_devices(conn: &Connection) -> Result<Vec<(String, AttemptId)>, JournalError> {
    let mut stmt =
        conn.prepare_cached("SELECT device, attempt_id FROM device_holds ORDER BY device")?;
    let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The shapes of the attempts that still occupy the host (neither cleaned nor released: their
/// processes may run, their devices are held), oldest first: what packing starts from after a
/// restart. Attempts without a shape are left out.
pub(crate) fn live_shapes(
    conn: &Connection,
) -> Result<Vec<(AttemptId, AttemptShape)>, JournalError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT attempt_id, {SHAPE_COLUMNS} FROM attempts
         WHERE state != 'cleaned' AND released_at IS NULL AND shape_labels IS NOT NULL
         ORDER BY created_at, attempt_id"
    ))?;
    let rows = stmt.query_map([], |row| Ok((row.get(0)?, shape_at(row, 1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        // The query keeps only shaped attempts.
        if let (id, Some(shape)) = row? {
            out.push((id, shape));
        }
    }
    Ok(out)
}

/// Records what the attempt's runner used, once, at its end (`at_ms`). `Ok(true)` when recorded
/// now; `Ok(false)` when usage was recorded already or the attempt is cleaned; an unknown attempt
/// is an error.
pub(crate) fn record_usage(
    conn: &Connection,
    id: &AttemptId,
    peak_memory: Option<u64>,
    cpu_usec: Option<u64>,
    at_ms: UnixMs,
) -> Result<bool, AttemptError> {
    let changed = conn
        .prepare_cached(
            "UPDATE attempts SET usage_peak_memory = ?2, usage_cpu_usec = ?3, usage_at = ?4,
                 updated_at = ?4
             WHERE attempt_id = ?1 AND state != 'cleaned' AND usage_at IS NULL",
        )?
        .execute(params![id.as_str(), peak_memory, cpu_usec, at_ms])?;
    if changed == 1 {
        return Ok(true);
    }
    let known: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM attempts WHERE attempt_id = ?1)")?
        .query_row([id.as_str()], |row| row.get(0))?;
    if known {
        Ok(false)
    } else {
        Err(AttemptError::Unknown(id.clone()))
    }
}

/// The attempts of `policy` created at or after `since` that recorded their usage, oldest
/// first, with the name of the job each ran.
pub(crate) fn shape_usage(
    conn: &Connection,
    policy: &str,
    since: UnixMs,
) -> Result<Vec<ShapeUsage>, JournalError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT a.attempt_id, a.job_id, j.job_name, a.usage_peak_memory, a.usage_cpu_usec,
                a.usage_at - j.started_at, {}
         FROM attempts a LEFT JOIN jobs j ON j.job_id = a.job_id
         WHERE a.policy = ?1 AND a.created_at >= ?2 AND a.usage_at IS NOT NULL
         ORDER BY a.created_at, a.attempt_id",
        SHAPE_COLUMNS
            .split(", ")
            .map(|column| format!("a.{column}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))?;
    let rows = stmt.query_map(params![policy, since], |row| {
        let ran: Option<i64> = row.get(5)?;
        Ok(ShapeUsage {
            attempt_id: row.get(0)?,
            job_id: row.get(1)?,
            job_name: row.get(2)?,
            shape: shape_at(row, 6)?,
            peak_memory: row.get(3)?,
            cpu_usec: row.get(4)?,
            // A job the journal saw start after the runner's end (clocks of different sources)
            // has no duration to report.
            ran_ms: ran.and_then(|ms| u64::try_from(ms).ok()),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
