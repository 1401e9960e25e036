//! rm-agent's library: configuration, secrets, the data-directory lock and the commands. The
//! binary (`main.rs`) is only the command line on top. What a runner is made of on the host
//! (its package store, isolation, process and runtime) is the `rm-runner` crate.

pub(crate) mod allocation;
pub(crate) mod cache;
pub mod commands;
pub mod config;
pub(crate) mod demand;
pub mod egress;
pub mod executor;
pub mod exit;
pub(crate) mod explain;
pub(crate) mod fault;
pub mod features;
pub(crate) mod fitness;
pub mod image;
pub(crate) mod isolation;
pub(crate) mod journal_auth;
pub(crate) mod latency;
pub mod lifecycle;
pub(crate) mod lock;
pub(crate) mod metrics;
/// The check that no module above names another that names it back (test code only).
#[cfg(test)]
mod module_cycles;
pub mod notify;
pub mod output;
pub(crate) mod package;
pub(crate) mod polling;
pub(crate) mod relay;
pub(crate) mod rerun;
pub mod scaleset;
pub(crate) mod secrets;
pub mod shape;
pub(crate) mod status_file;
pub(crate) mod trust;

/// `print!`/`println!` that survive a reader closing stdout ([`rm_base::output`]).
pub use rm_base::{out, outln};

/// A unit test that cannot run here fails unless `RM_TEST_ALLOW_SKIP` names what it lacks.
#[cfg(test)]
#[path = "../../tests/support/skip.rs"]
pub(crate) mod test_skip;

/// A real PostgreSQL server for the fleet's tests (the poller elected per target, `check`'s
/// journal findings).
#[cfg(test)]
#[path = "../../tests/support/postgres.rs"]
pub(crate) mod test_pg_server;

/// Captures a test thread's log lines.
#[cfg(test)]
#[path = "../../tests/support/log_capture.rs"]
pub(crate) mod test_log_capture;
