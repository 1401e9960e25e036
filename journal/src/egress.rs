//! What each attempt's runner asked for and reached under `policy.egress` (schema v14's
//! `attempt_egress`): one JSON record per attempt, which the journal keeps without reading
//! (its shape is `rm_egress::record::Record`'s), written by the agent's writer and read by
//! `explain` and `rm-agent egress` through the reader.

use rusqlite::{Connection, OptionalExtension as _};

use crate::attempts::{AttemptError, AttemptId};
use rm_vocab::UnixMs;

/// Replaces the attempt's record.
pub(crate) fn write(
    conn: &Connection,
    id: &AttemptId,
    record: &str,
    at_ms: UnixMs,
) -> Result<(), AttemptError> {
    conn.execute(
        "INSERT INTO attempt_egress (attempt_id, record, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (attempt_id) DO UPDATE SET record = excluded.record,
                                                updated_at = excluded.updated_at",
        rusqlite::params![id.as_str(), record, at_ms.get()],
    )?;
    Ok(())
}

/// The attempt's record, if one was kept.
pub(crate) fn of_attempt(
    conn: &Connection,
    id: &AttemptId,
) -> Result<Option<String>, AttemptError> {
    Ok(conn
        .query_row(
            "SELECT record FROM attempt_egress WHERE attempt_id = ?1",
            [id.as_str()],
            |row| row.get(0),
        )
        .optional()?)
}

/// The records of `policy`'s attempts created at or after `since`, oldest first.
pub(crate) fn of_policy(
    conn: &Connection,
    policy: &str,
    since: UnixMs,
) -> Result<Vec<(AttemptId, String)>, AttemptError> {
    let mut statement = conn.prepare(
        "SELECT a.attempt_id, e.record FROM attempt_egress e
         JOIN attempts a ON a.attempt_id = e.attempt_id
         WHERE a.policy = ?1 AND a.created_at >= ?2
         ORDER BY a.created_at, a.attempt_id",
    )?;
    let rows = statement.query_map(rusqlite::params![policy, since.get()], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, record) = row?;
        out.push((AttemptId::parse(&id)?, record));
    }
    Ok(out)
}
