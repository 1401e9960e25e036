//! rm-receiver: the HTTP intake for GitHub App webhook deliveries, and nothing else. It streams a
//! body in under a cap, checks the signature against every secret, hands the delivery to the
//! journal (judged first: [`INLINE_JUDGE_BYTES`]) and answers only after the journal's commit: a 2xx means the delivery is committed
//! (the embedded SQLite journal's file, or a fleet's PostgreSQL journal: [`ReceiverJournal`]). It
//! knows nothing about jobs; the handlers and the journal do.
//!
//! Routes: `POST <path>` (CONTRACT §4), `GET /healthz`, `GET /metrics`.

mod journal;
mod judge;
mod metrics;
mod server;
mod signature;
mod verify;

pub use journal::{ReceiverJournal, ScrapeCounts, StateCounts};
pub use judge::{INLINE_JUDGE_BYTES, judge};
/// The metrics library `/metrics` is built on, for [`Receiver::add_collector`]'s callers.
pub use prometheus_client;
/// The body budget the receiver shares with the relay's ingest (one implementation, in
/// `rm-http-serve`).
pub use rm_http_serve::budget::{
    BODY_ALLOWANCE_BYTES, BODY_POOL_BYTES, BUSY_RETRY_AFTER_SECS, BodyLimits,
};
pub use server::{Receiver, ReceiverConfig};
pub use signature::{WebhookSecrets, sign};
pub use verify::{Envelope, Refusal, envelope};

/// GitHub does not deliver payloads over 25 MB, so anything larger is not from GitHub.
pub const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;
