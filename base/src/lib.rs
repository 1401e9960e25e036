//! rm-base: the plumbing every rm binary shares at its edges, said once (issue 13: the agent and
//! the relay each had their own copy):
//! - [`exit`]: CONTRACT §1's exit codes and a command's failure as one sentence;
//! - [`log`]: the log setup (`RM_LOG`, text or JSON lines on stderr);
//! - [`output`]: stdout that survives a reader closing the pipe (`out!`, `outln!`).
//!
//! The wall clock is not here: it is `rm_vocab`'s, answering the instant every crate stores.

pub mod exit;
pub mod log;
pub mod output;
