//! Every query the relay runs, each a plain function over a connection so the commands (a
//! connection of their own) and the server (through [`super::Store`]) share them.

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value};

use crate::limits::{Room, make_room};
use crate::sse::StoredDelivery;
use rm_vocab::UnixMs;

/// A stream's catch-up reads at most this many deliveries at a time...
const BATCH_MAX_ROWS: i64 = 64;
/// ...and stops adding rows past this many body bytes (a delivery may be 25 MiB).
const BATCH_MAX_BYTES: usize = 8 * 1024 * 1024;

const PUBLIC_URL_KEY: &str = "public_url";

pub fn public_url(conn: &Connection) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT value FROM meta WHERE key = ?1",
        [PUBLIC_URL_KEY],
        |row| row.get(0),
    )
    .optional()
}

pub fn set_public_url(conn: &Connection, url: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        params![PUBLIC_URL_KEY, url],
    )
    .map(drop)
}

/// A new channel's secrets, as `channel add` made them.
pub struct NewChannel<'a> {
    pub name: &'a str,
    pub ingest_id: &'a str,
    pub smee_id: &'a str,
    pub created_at_ms: UnixMs,
}

/// Creates a channel; `false` when the name is taken (nothing changed).
pub fn add_channel(conn: &Connection, channel: &NewChannel<'_>) -> rusqlite::Result<bool> {
    let added = conn.execute(
        "INSERT INTO channels (name, ingest_id, smee_id, created_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name) DO NOTHING",
        params![
            channel.name,
            channel.ingest_id,
            channel.smee_id,
            channel.created_at_ms
        ],
    )?;
    Ok(added == 1)
}

/// Stores a host's token digest, replacing the host's previous token; `false` when the channel
/// does not exist.
pub fn issue_token(
    conn: &mut Connection,
    channel: &str,
    host: &str,
    digest: &str,
    now_ms: UnixMs,
) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let exists = tx
        .query_row("SELECT 1 FROM channels WHERE name = ?1", [channel], |_| {
            Ok(())
        })
        .optional()?
        .is_some();
    if exists {
        tx.execute(
            "INSERT INTO tokens (channel, host, token_sha256, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (channel, host) DO UPDATE
             SET token_sha256 = excluded.token_sha256, created_at = excluded.created_at",
            params![channel, host, digest, now_ms],
        )?;
    }
    tx.commit()?;
    Ok(exists)
}

/// Deletes a host's token; `false` when there was none. The host's ack stays: a host given a
/// new token later resumes where it was.
pub fn revoke_token(conn: &Connection, channel: &str, host: &str) -> rusqlite::Result<bool> {
    let removed = conn.execute(
        "DELETE FROM tokens WHERE channel = ?1 AND host = ?2",
        params![channel, host],
    )?;
    Ok(removed == 1)
}

pub fn channel_by_ingest_id(conn: &Connection, id: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT name FROM channels WHERE ingest_id = ?1",
        [id],
        |row| row.get(0),
    )
    .optional()
}

pub fn channel_by_smee_id(conn: &Connection, id: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT name FROM channels WHERE smee_id = ?1",
        [id],
        |row| row.get(0),
    )
    .optional()
}

/// The host a token digest belongs to on `channel`, if it is valid there.
pub fn host_for_token(
    conn: &Connection,
    channel: &str,
    digest: &str,
) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT host FROM tokens WHERE channel = ?1 AND token_sha256 = ?2",
        params![channel, digest],
        |row| row.get(0),
    )
    .optional()
}

/// A delivery as the ingest path hands it over.
pub struct NewDelivery {
    pub channel: String,
    pub guid: String,
    pub received_at_ms: UnixMs,
    /// The kept headers as a JSON object.
    pub headers: Map<String, Value>,
    pub body: bytes::Bytes,
}

/// What storing a delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Stored under this id, after dropping `dropped` acknowledged deliveries to make room.
    New { id: i64, dropped: usize },
    /// The channel already had this GUID (a GitHub redelivery): the stored delivery's id.
    Duplicate(i64),
    /// Nothing stored: the channel's quota is full of deliveries some host has not
    /// acknowledged yet.
    OverQuota,
}

/// Stores a delivery once per (channel, GUID) within the channel's `quota` (bytes of bodies
/// and headers) and commits before returning. Room is made by dropping the channel's oldest
/// acknowledged deliveries ([`crate::limits::make_room`]), in the same transaction.
pub fn insert_delivery(
    conn: &mut Connection,
    d: &NewDelivery,
    quota: u64,
) -> rusqlite::Result<Inserted> {
    let headers = Value::Object(d.headers.clone()).to_string();
    // What the usage triggers count for this row: length(body) + octet_length(headers).
    let incoming = u64::try_from(d.body.len() + headers.len()).unwrap_or(u64::MAX);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let existing: Option<i64> = tx
        .query_row(
            "SELECT id FROM deliveries WHERE channel = ?1 AND guid = ?2",
            params![d.channel, d.guid],
            |row| row.get(0),
        )
        .optional()?;
    if let Some(id) = existing {
        return Ok(Inserted::Duplicate(id));
    }
    let used = channel_usage(&tx, &d.channel)?;
    let room = {
        let watermark = acknowledged_through(&tx, &d.channel)?;
        let mut stmt = tx.prepare_cached(
            "SELECT id, length(body) + octet_length(headers) FROM deliveries
             WHERE channel = ?1 AND id <= ?2 ORDER BY id",
        )?;
        let mut rows = stmt.query(params![d.channel, watermark])?;
        let mut failed = None;
        let acknowledged = std::iter::from_fn(|| match rows.next() {
            Ok(Some(row)) => match (row.get::<_, i64>(0), row.get::<_, i64>(1)) {
                (Ok(id), Ok(bytes)) => Some((id, u64::try_from(bytes).unwrap_or(0))),
                (Err(err), _) | (_, Err(err)) => {
                    failed = Some(err);
                    None
                }
            },
            Ok(None) => None,
            Err(err) => {
                failed = Some(err);
                None
            }
        });
        let room = make_room(used, quota, incoming, acknowledged);
        if let Some(err) = failed {
            return Err(err);
        }
        room
    };
    let dropped = match room {
        Room::Fits => 0,
        Room::Full => return Ok(Inserted::OverQuota),
        Room::DropThrough { last_id, count } => {
            let deleted = tx.execute(
                "DELETE FROM deliveries WHERE channel = ?1 AND id <= ?2",
                params![d.channel, last_id],
            )?;
            debug_assert_eq!(deleted, count);
            deleted
        }
    };
    tx.execute(
        "INSERT INTO deliveries (channel, guid, received_at_ms, headers, body)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![d.channel, d.guid, d.received_at_ms, headers, &d.body[..]],
    )?;
    let id = tx.last_insert_rowid();
    tx.commit()?;
    Ok(Inserted::New { id, dropped })
}

/// The bytes of bodies and headers a channel keeps (what its quota counts).
pub fn channel_usage(conn: &Connection, channel: &str) -> rusqlite::Result<u64> {
    let bytes: Option<i64> = conn
        .query_row(
            "SELECT bytes FROM channel_usage WHERE channel = ?1",
            [channel],
            |row| row.get(0),
        )
        .optional()?;
    Ok(bytes.map_or(0, |b| u64::try_from(b).unwrap_or(0)))
}

/// The highest id every host holding a token on the channel has acknowledged: deliveries up to
/// it are acknowledged. 0 when some host has acknowledged nothing, or when the channel has no
/// host at all (smee form only: nobody acknowledges, so nothing is ever "acknowledged").
pub fn acknowledged_through(conn: &Connection, channel: &str) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT COALESCE(MIN(COALESCE(a.last_id, 0)), 0)
         FROM tokens t LEFT JOIN acks a ON a.channel = t.channel AND a.host = t.host
         WHERE t.channel = ?1",
        [channel],
        |row| row.get(0),
    )
}

/// The channel's deliveries after `after`, oldest first: a bounded batch (see the consts).
pub fn deliveries_after(
    conn: &Connection,
    channel: &str,
    after: i64,
) -> rusqlite::Result<Vec<StoredDelivery>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, received_at_ms, headers, body FROM deliveries
         WHERE channel = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
    )?;
    let mut rows = stmt.query(params![channel, after, BATCH_MAX_ROWS])?;
    let mut batch = Vec::new();
    let mut bytes = 0;
    while let Some(row) = rows.next()? {
        let headers: String = row.get(2)?;
        let headers = serde_json::from_str::<Map<String, Value>>(&headers).map_err(|err| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(err))
        })?;
        let body: Vec<u8> = row.get(3)?;
        bytes += body.len();
        batch.push(StoredDelivery {
            id: row.get(0)?,
            received_at_ms: row.get(1)?,
            headers,
            body,
        });
        if bytes >= BATCH_MAX_BYTES {
            break;
        }
    }
    Ok(batch)
}

/// The newest delivery id of the channel (0 when none): where a smee stream without
/// `Last-Event-ID` starts.
pub fn latest_id(conn: &Connection, channel: &str) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT COALESCE(MAX(id), 0) FROM deliveries WHERE channel = ?1",
        [channel],
        |row| row.get(0),
    )
}

/// The id a host last acknowledged on a channel (0 when none).
pub fn acked(conn: &Connection, channel: &str, host: &str) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT last_id FROM acks WHERE channel = ?1 AND host = ?2",
        params![channel, host],
        |row| row.get(0),
    )
    .optional()
    .map(|id| id.unwrap_or(0))
}

/// Records an ack: the stored id only moves forward, and never past the newest id ever given
/// out (a wrong ack must not make the host skip deliveries that have not arrived yet). Returns
/// the stored id.
pub fn record_ack(
    conn: &mut Connection,
    channel: &str,
    host: &str,
    id: i64,
    now_ms: UnixMs,
) -> rusqlite::Result<i64> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let newest: i64 = tx.query_row(
        "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'deliveries'",
        [],
        |row| row.get(0),
    )?;
    tx.execute(
        "INSERT INTO acks (channel, host, last_id, updated_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (channel, host) DO UPDATE
         SET last_id = max(last_id, excluded.last_id), updated_at = excluded.updated_at",
        params![channel, host, id.min(newest), now_ms],
    )?;
    let stored = tx.query_row(
        "SELECT last_id FROM acks WHERE channel = ?1 AND host = ?2",
        params![channel, host],
        |row| row.get(0),
    )?;
    tx.commit()?;
    Ok(stored)
}

/// A read of the file that writes nothing, as `/healthz` needs: proves the file is there,
/// readable and a relay database this build understands.
pub fn check_readable(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT COUNT(*) FROM channels", [], |row| row.get(0))
}
