//! The journal on PostgreSQL (CONTRACT §9, first slice): a fleet's receivers record deliveries
//! into one shared database. This module owns the PostgreSQL dialect of the journal: its schema
//! and migrations ([`schema`], the same versions as SQLite's), the group-commit writer of the
//! intake path ([`PgJournal`], behind [`crate::Intake`] like the SQLite journal), the verdict's
//! SQL (`apply`, the same rule as SQLite's) and the reads of what the intake wrote
//! ([`PgReader`]). Claims, leases and fleet status are not built yet.

mod apply;
mod read;
pub(crate) mod schema;
mod writer;

pub use read::PgReader;
pub use writer::PgJournal;

#[cfg(test)]
mod tests;
