//! The journal's errors. Callers match on them: the receiver answers 503 for any of them, the CLI
//! turns each into one sentence with its remedy.

use std::path::PathBuf;

/// Everything that can go wrong between rm and its SQLite file.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot open the journal at {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "no journal at {0}: no rm-agent has run with this data directory yet (check --data-dir)"
    )]
    Missing(PathBuf),
    #[error(
        "the journal at {path} has schema version {found}, newer than this rm-agent knows ({supported}); run the newer rm-agent, or restore a backup"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error(
        "the journal at {path} has schema version {found}, older than this rm-agent's ({supported}); start `rm-agent receive` or `rm-agent run` once to migrate it"
    )]
    TooOld {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error("journal query failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The PostgreSQL journal (CONTRACT §9): unreachable, refused, or a query failed. Its text
    /// names the server's message, never the connection string (it may hold a password).
    #[cfg(feature = "postgres")]
    #[error("the PostgreSQL journal: {}", crate::pg::describe(.0))]
    Postgres(#[from] postgres::Error),
    /// A connection string a test or benchmark passed that cannot be used (the agent's own is
    /// checked at start, [`crate::PgTarget::parse`]). Never repeats the string.
    #[error("the PostgreSQL connection string {0}")]
    PgUrl(#[from] crate::PgUrlError),
    #[error(
        "the PostgreSQL journal has schema version {found}, newer than this rm-agent knows ({supported}); run the newer rm-agent, or restore a backup"
    )]
    PgTooNew { found: i64, supported: i64 },
    #[error("the journal could not commit: {0}")]
    Commit(String),
    #[error("the body is not JSON")]
    NotJson,
    #[error("the journal writer has stopped")]
    WriterStopped,
    #[error("no delivery {0} in the journal")]
    UnknownDelivery(String),
    #[error(
        "delivery {0} has no body any more (bodies are kept for the retention period); ask GitHub to redeliver it"
    )]
    BodyPruned(String),
}
