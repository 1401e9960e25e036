//! The journal's delivery intake as one interface with two implementations (CONTRACT §9): the
//! embedded SQLite journal ([`crate::Journal`], the default) and the PostgreSQL journal
//! ([`crate::PgJournal`], shared by a fleet's receivers). Both take a delivery already judged
//! ([`crate::Judged`]: the caller ran the handler, where it chose), apply its verdict with the same forward-only merge
//! (`rm_vocab::merge_job`), commit in groups on one writer thread, and answer only after the
//! commit that holds the delivery: a 2xx means committed, whichever journal is behind it.

use std::future::Future;

use crate::{JournalError, Judged, Recorded};

/// Where a receiver records the deliveries it verified.
pub trait Intake: Clone + Send + Sync + 'static {
    /// Records a judged delivery once per GUID; returns after the commit that holds it.
    fn record_judged(
        &self,
        judged: Judged,
    ) -> impl Future<Output = Result<Recorded, JournalError>> + Send;

    /// Succeeds when the writer is alive and can write (`/healthz`).
    fn probe(&self) -> impl Future<Output = Result<(), JournalError>> + Send;
}

impl Intake for crate::Journal {
    fn record_judged(
        &self,
        judged: Judged,
    ) -> impl Future<Output = Result<Recorded, JournalError>> + Send {
        crate::Journal::record_judged(self, judged)
    }

    fn probe(&self) -> impl Future<Output = Result<(), JournalError>> + Send {
        crate::Journal::probe(self)
    }
}
