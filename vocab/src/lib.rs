//! rm-vocab: the words every rm crate shares, said once. It owns
//! - the ids that cross crates, [`JobId`] and [`RunnerId`] (`ids.rs`);
//! - a job's states and their forward-only merge, [`JobState`] and [`merge_job`] (`job_state.rs`);
//! - where a delivery or a sighting entered rm, [`Source`] (`source.rs`);
//! - the instant [`UnixMs`] (`unix_ms.rs`), with the workspace's one RFC 3339 parser and
//!   formatter (`timestamp.rs`), and [`millis`], a `Duration` in its unit;
//! - the wall clock, [`Clock`] with its [`SystemClock`] (and [`now`] for code with none to
//!   inject) and [`ManualClock`] for tests (`clock.rs`).
//!
//! It is a leaf: it depends on no crate of the workspace, so the handlers, the journal, the
//! GitHub client, the receiver, the relay and the agent all speak it without depending on one
//! another (`rm-github` used to depend on the webhook handlers only for the ids). There are no
//! policy names here: a policy is named by a `String` in the agent's configuration and the
//! journal's rows, and no crate shares a type for it.

mod clock;
mod ids;
mod job_state;
mod source;
mod timestamp;
mod unix_ms;

pub use clock::{Clock, ManualClock, SystemClock, now};
pub use ids::{IdOutOfRange, JobId, RunnerId};
pub use job_state::{JobMerge, JobState, merge_job};
pub use source::Source;
pub use unix_ms::{UnixMs, millis};
