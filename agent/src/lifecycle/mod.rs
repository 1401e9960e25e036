//! The runner attempt's lifecycle, as pure decisions over values: how an attempt ends
//! ([`Conclusion`], [`FailureReason`]) and what supervision and startup recovery do with what
//! they observe of an attempt ([`recovery_decision`]). Recovery uses the same decision as
//! ordinary supervision; startup only supplies the first observation (and no launch window,
//! see [`Timeouts::at_startup`]).
//!
//! The states and their graph (`allocated → jit_received → starting → idle ⇄ busy → finished |
//! failed | orphaned → cleaned`) are [`AttemptState`], which lives in `rm-journal` and is
//! re-exported here: the journal builds every compare-and-set from that graph, so there is one
//! copy of it. The adapters that carry a decision out live in `crate::executor` (GitHub) and
//! the `rm-runner` crate (process, workspace).

mod decision;

pub use decision::{
    AttemptFacts, Conclusion, Decision, DiskUse, EXIT_GRACE, ExitSeen, FailureReason, Findings,
    GHOST_AFTER, GithubObservation, JobEvidence, LAUNCH_TIMEOUT, Observation, ProcessObservation,
    Timeouts, recovery_decision,
};
pub use rm_journal::{AttemptOutcome, AttemptState, StopIntent};
