//! rm-journal: the only owner of rm's SQLite file. It holds every webhook delivery (exact body,
//! the headers that matter, what became of it), one row per `workflow_job`, and the App's
//! installations with their repository scope, and every runner attempt ([`Attempts`]).
//!
//! Writes go through one writer thread that commits in groups ([`Journal`]): every delivery
//! that arrived while the previous commit was in flight is committed in the next transaction,
//! and each caller is answered only after the commit that holds its delivery. Reads go through
//! [`Reader`], a separate read-only connection (WAL lets readers run beside the writer).
//!
//! [`Store`] is where the journal is (this file, and a fleet's shared database when there is
//! one) and hands out the readers, poll store and fleet on it: the agent asks it, and never
//! chooses a dialect itself. The PostgreSQL dialect is built only with the `postgres` feature.
//!
//! The delivery intake is one interface ([`Intake`]) with two implementations: this SQLite
//! journal (the default) and the PostgreSQL journal of a fleet ([`PgJournal`], CONTRACT §9).
//! So is the fleet's shared state (host leases, claims on queued jobs, leader leases:
//! [`Fleet`]): [`PgFleet`] for many hosts, [`LocalFleet`] on the SQLite file for one; and so is
//! what the polling fallback writes ([`PollStore`]: [`PollJournal`], [`PgPollJournal`]).
//!
//! Every state change is compare-and-set (`UPDATE ... WHERE state_rank < ?`) so that two writers
//! (the agent's writer and a `deliveries replay` from the CLI) can never both win. Runner
//! attempts are written synchronously on the agent's own connection ([`Attempts`]), each
//! transition compare-and-set over the lifecycle's graph ([`AttemptState`]). GitHub's runner
//! scale sets as this host's listener sees them ([`ScaleSets`]: each queue message journalled
//! before it is acknowledged, a redelivery recognised, the jobs moved forward only) are on a
//! connection of their own too.

mod apply;
mod attempts;
mod body;
mod checkpoint;
mod connection;
mod egress;
mod error;
mod fleet;
mod intake;
mod judged;
mod metrics;
mod pg;
mod polls;
mod queue;
mod read;
mod replay;
mod reruns;
mod retention;
mod scale_sets;
mod schema;
mod shapes;
mod store;
mod sync;
mod types;
mod waits;
mod writer;

pub use attempts::{
    ATTEMPT_ID_LEN, ATTEMPT_SHORT_LEN, AttemptError, AttemptId, AttemptOutcome, AttemptRecord,
    AttemptState, Attempts, IsolationKind, LiveCounts, NewAttempt, PolicyLive, Scope, StopIntent,
    WorkspaceKind,
};
pub use connection::JOURNAL_FILE;
pub use error::JournalError;
pub use fleet::{
    ClaimRequest, ClaimView, Claimed, Fleet, FleetError, FleetView, HostInfo, HostView, LeaderView,
    Lease, LocalFleet, Renewal, SpendWindow,
};
pub use intake::Intake;
pub use judged::Judged;
pub use metrics::JournalMetrics;
#[cfg(feature = "postgres")]
pub use pg::{PgFleet, PgPollJournal, PgReader, replay_pg};
pub use pg::{PgInspection, PgJournal, PgRight, PgSchemaState, PgSslMode, PgTarget, PgUrlError};
pub use polls::{HOOK_DELIVERY_CURSOR, PollJournal, PollStore, QueuedJobRef, Sighting};
pub use read::{DemandView, Reader};
pub use replay::replay;
pub use reruns::{NewRerun, RerunCounts, RerunRecord, RerunState};
pub use retention::Retention;
pub use scale_sets::{
    IncomingMessage, JobEvent, MessageRecorded, ScaleSetJobRow, ScaleSetJobState, ScaleSetRecord,
    ScaleSetStatistics, ScaleSets,
};
pub use schema::SCHEMA_VERSION;
pub use shapes::{AttemptShape, ShapeUsage};
pub use store::{JobReader, Store};
pub use types::{
    DeliveryRow, Incoming, InstallationRow, JobRow, Outcome, Recorded, StoredDelivery,
};
pub use waits::WaitRow;
pub use writer::Journal;

#[cfg(test)]
mod attempt_tests;
#[cfg(test)]
mod durability_tests;
#[cfg(test)]
mod intake_tests;
#[cfg(test)]
#[cfg(feature = "postgres")]
#[path = "../../tests/support/postgres.rs"]
mod pg_server;
#[cfg(test)]
mod rerun_tests;
#[cfg(test)]
mod scale_set_tests;
#[cfg(test)]
mod shape_tests;
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
mod skip;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod waits_tests;
