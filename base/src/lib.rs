//! rm-base: the plumbing every rm binary shares at its edges, said once (issue 13: the agent and
//! the relay each had their own copy):
//! - [`exit`]: CONTRACT §1's exit codes and a command's failure as one sentence;
//! - [`log`]: the log setup (`RM_LOG`, text or JSON lines on stderr);
//! - [`output`]: stdout that survives a reader closing the pipe (`out!`, `outln!`);
//! - [`clock`]: the wall clock in milliseconds since the Unix epoch, the unit every stored time
//!   uses (the journal, the relay's store, the status snapshot).

pub mod clock;
pub mod exit;
pub mod log;
pub mod output;
