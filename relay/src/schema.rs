//! The relay's schema as an ordered list of migrations, as in the journal: `PRAGMA user_version`
//! records how many have been applied, each runs in its own transaction, and migrations are only
//! ever appended, never edited.

use rusqlite::Connection;

/// Migration `n` (0-based) takes the schema from version `n` to `n + 1`.
const MIGRATIONS: &[&str] = &[
    // v1: the whole relay. `deliveries.id` is AUTOINCREMENT so an id is never reused, even after
    // the newest rows are pruned: it is the event id subscribers acknowledge and resume from.
    // `guid` (X-GitHub-Delivery) is kept beside the headers so a redelivery is found by index.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY NOT NULL,
        value TEXT NOT NULL
    );

    CREATE TABLE channels (
        name       TEXT PRIMARY KEY NOT NULL,
        ingest_id  TEXT NOT NULL UNIQUE,            -- 32 hex: the secret in the ingest URL
        smee_id    TEXT NOT NULL UNIQUE,            -- 32 hex: the secret in the smee URL
        created_at INTEGER NOT NULL                 -- ms since the Unix epoch
    );

    CREATE TABLE tokens (
        channel      TEXT NOT NULL REFERENCES channels (name),
        host         TEXT NOT NULL,
        token_sha256 TEXT NOT NULL UNIQUE,          -- hex SHA-256 of the token; never the token
        created_at   INTEGER NOT NULL,
        PRIMARY KEY (channel, host)
    );

    CREATE TABLE acks (
        channel    TEXT NOT NULL REFERENCES channels (name),
        host       TEXT NOT NULL,
        last_id    INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (channel, host)
    );

    CREATE TABLE deliveries (
        id             INTEGER PRIMARY KEY AUTOINCREMENT,
        channel        TEXT NOT NULL REFERENCES channels (name),
        guid           TEXT NOT NULL,                -- X-GitHub-Delivery
        received_at_ms INTEGER NOT NULL,
        headers        TEXT NOT NULL,                -- JSON object, names lowercased
        body           BLOB NOT NULL,                -- the exact bytes GitHub sent
        UNIQUE (channel, guid)
    );
    CREATE INDEX deliveries_stream ON deliveries (channel, id);
    CREATE INDEX deliveries_received ON deliveries (received_at_ms);
    "#,
    // v2: the bytes each channel keeps (bodies and headers), for its quota, kept by triggers
    // so every insert and delete (ingest, quota drops, retention) counts, in its transaction.
    r#"
    CREATE TABLE channel_usage (
        channel TEXT PRIMARY KEY NOT NULL REFERENCES channels (name),
        bytes   INTEGER NOT NULL
    );
    INSERT INTO channel_usage (channel, bytes)
        SELECT channel, SUM(length(body) + octet_length(headers)) FROM deliveries
        GROUP BY channel;
    CREATE TRIGGER deliveries_usage_insert AFTER INSERT ON deliveries BEGIN
        INSERT INTO channel_usage (channel, bytes)
            VALUES (NEW.channel, length(NEW.body) + octet_length(NEW.headers))
            ON CONFLICT (channel) DO UPDATE SET bytes = bytes + excluded.bytes;
    END;
    CREATE TRIGGER deliveries_usage_delete AFTER DELETE ON deliveries BEGIN
        UPDATE channel_usage SET bytes = bytes - (length(OLD.body) + octet_length(OLD.headers))
            WHERE channel = OLD.channel;
    END;
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The file was written by a newer rm-relay.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "schema version {found} is newer than this rm-relay supports ({supported}); upgrade rm-relay"
    )]
    TooNew { found: i64, supported: i64 },
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// Applies every migration the file has not seen yet.
pub fn migrate(conn: &mut Connection) -> Result<(), SchemaError> {
    let found = user_version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(SchemaError::TooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= found {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // A `channel` command and `serve` may open a new file at the same moment.
        if user_version(&tx)? >= version {
            continue;
        }
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
        tracing::info!(version, "relay schema migrated");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_is_a_no_op_and_a_newer_file_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        assert!(matches!(
            migrate(&mut conn),
            Err(SchemaError::TooNew { .. })
        ));
    }
}
