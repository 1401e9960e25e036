//! The journal on PostgreSQL (CONTRACT §9): a fleet's receivers and hosts share one database.
//! This module owns the PostgreSQL dialect of the journal: its schema and migrations
//! ([`schema`], the same versions as SQLite's), the group-commit writer of the intake path
//! ([`PgJournal`], behind [`crate::Intake`] like the SQLite journal), the verdict's SQL
//! (`apply`, the same rule as SQLite's), the reads of what the intake wrote ([`PgReader`]), a
//! delivery's replay ([`replay_pg`]), what the pollers write and read ([`PgPollJournal`], behind
//! [`crate::PollStore`] like SQLite's), the fleet's claims, host leases and leader leases
//! ([`PgFleet`], behind [`crate::Fleet`]), the connection settings a configuration names
//! ([`PgTarget`]) and what `rm-agent check` asks of a database ([`PgInspection`]).
//!
//! All of it is built only with the `postgres` feature. Without it, [`surface`] (the names the
//! agent's configuration and `check` use) and `absent` (a target that cannot be made) stand in,
//! and [`crate::Store`] is the only way to the rest.

mod surface;

// Also in every test build (which has the feature): its refusal is tested in process.
#[cfg(any(test, not(feature = "postgres")))]
#[cfg_attr(
    feature = "postgres",
    allow(dead_code, unreachable_pub, unused_imports)
)]
mod absent;
pub use surface::{PgInspection, PgRight, PgSchemaState, PgSslMode, PgUrlError};

#[cfg(not(feature = "postgres"))]
pub use absent::{PgJournal, PgTarget};

/// Each item, built only with the `postgres` feature.
macro_rules! with_postgres {
    ($($item:item)*) => { $( #[cfg(feature = "postgres")] $item )* };
}

with_postgres! {
    mod apply;
    mod fleet;
    mod inspect;
    mod polls;
    mod read;
    mod replay;
    pub(crate) mod schema;
    mod target;
    mod tls;
    mod writer;

    pub use fleet::PgFleet;
    pub use polls::PgPollJournal;
    pub use read::PgReader;
    pub use replay::replay_pg;
    pub use target::PgTarget;
    pub use writer::PgJournal;
    #[cfg(test)]
    pub(crate) use read::READER_APPLICATION;

    use rm_vocab::JobId;
}

/// A PostgreSQL error in one line: the server's message and SQLSTATE, or what failed on the
/// way to it (the client's `Display` says only "db error"). Never the connection string.
#[cfg(feature = "postgres")]
pub(crate) fn describe(err: &postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    match std::error::Error::source(err) {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

/// Job ids as a statement binds a list of them (`= ANY($1)`, `unnest($1::bigint[])`). The
/// `postgres` crate's traits are foreign to [`JobId`] and [`rm_vocab::RunnerId`], so the ids
/// cross this edge as their numbers: `id.get()` bound, `JobId::new(row.get(i))` read. Times
/// ([`rm_vocab::UnixMs`]) cross it the same way: `t.get()` bound, `UnixMs::new(row.get(i))`
/// read.
#[cfg(feature = "postgres")]
pub(crate) fn job_numbers(ids: &[JobId]) -> Vec<i64> {
    ids.iter().map(|id| id.get()).collect()
}

#[cfg(test)]
#[cfg(feature = "postgres")]
mod rights_tests;
#[cfg(test)]
#[cfg(feature = "postgres")]
mod tests;
#[cfg(test)]
#[cfg(feature = "postgres")]
mod tls_tests;
