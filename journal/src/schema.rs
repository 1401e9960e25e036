//! The journal's schema as an ordered list of migrations. `PRAGMA user_version` records how many
//! have been applied; each runs in its own transaction, so a crash mid-migration leaves the file
//! at the previous version. Migrations are only ever appended, never edited.

use std::path::Path;

use rusqlite::Connection;

use crate::JournalError;

/// Migration `n` (0-based) takes the schema from version `n` to `n + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // v1: deliveries, jobs, installations and their repositories.
    r#"
    CREATE TABLE deliveries (
        id            INTEGER PRIMARY KEY,
        guid          TEXT NOT NULL UNIQUE,
        event         TEXT NOT NULL,
        action        TEXT,
        source        TEXT NOT NULL,
        received_at   INTEGER NOT NULL,          -- ms since the Unix epoch
        headers       TEXT NOT NULL,             -- JSON object of the headers kept
        body          BLOB,                      -- exact bytes; NULL once past retention
        outcome       TEXT NOT NULL CHECK (outcome IN ('applied', 'duplicate', 'ignored', 'rejected')),
        reason        TEXT,
        replayed_at   INTEGER
    );
    CREATE INDEX deliveries_received_at ON deliveries (received_at);
    CREATE INDEX deliveries_outcome ON deliveries (outcome, received_at);

    CREATE TABLE jobs (
        job_id          INTEGER PRIMARY KEY,      -- workflow_job.id
        run_id          INTEGER NOT NULL,
        run_attempt     INTEGER NOT NULL,
        repository      TEXT NOT NULL,            -- owner/name
        installation_id INTEGER,
        labels          TEXT NOT NULL,            -- JSON array, as GitHub sent them
        workflow_name   TEXT,
        job_name        TEXT,
        state           TEXT NOT NULL CHECK (state IN ('waiting', 'queued', 'in_progress', 'completed')),
        state_rank      INTEGER NOT NULL,
        conclusion      TEXT,
        runner_name     TEXT,
        runner_id       INTEGER,
        source          TEXT NOT NULL,            -- where the current state was learned
        first_seen_at   INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL
    );
    CREATE INDEX jobs_state ON jobs (state_rank, updated_at);

    CREATE TABLE installations (
        id                   INTEGER PRIMARY KEY,
        account              TEXT,
        account_type         TEXT,
        repository_selection TEXT,
        suspended            INTEGER NOT NULL DEFAULT 0,
        removed              INTEGER NOT NULL DEFAULT 0,
        updated_at           INTEGER NOT NULL
    );

    CREATE TABLE installation_repositories (
        installation_id INTEGER NOT NULL REFERENCES installations (id) ON DELETE CASCADE,
        repository_id   INTEGER NOT NULL,
        full_name       TEXT NOT NULL,
        PRIMARY KEY (installation_id, repository_id)
    );
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// Applies every migration the file has not seen yet.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), JournalError> {
    migrate_to(conn, path, SCHEMA_VERSION)
}

/// Applies migrations up to `target`; tests use it to build every earlier version.
pub(crate) fn migrate_to(
    conn: &mut Connection,
    path: &Path,
    target: i64,
) -> Result<(), JournalError> {
    let found = user_version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(JournalError::TooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= found || version > target {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
        tracing::info!(version, "journal schema migrated");
    }
    Ok(())
}

/// A reader refuses a file from a newer rm, and one that was never initialised.
pub(crate) fn check_readable(conn: &Connection, path: &Path) -> Result<(), JournalError> {
    match user_version(conn)? {
        0 => Err(JournalError::Missing(path.to_owned())),
        found if found > SCHEMA_VERSION => Err(JournalError::TooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }),
        found if found < SCHEMA_VERSION => Err(JournalError::TooOld {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }),
        _ => Ok(()),
    }
}
