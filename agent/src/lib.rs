//! rm-agent's library: configuration, secrets, the data-directory lock and the commands. The
//! binary (`main.rs`) is only the command line on top.

pub mod allocation;
pub mod commands;
pub mod config;
pub mod demand;
pub mod executor;
pub mod exit;
pub mod explain;
pub mod features;
pub mod fitness;
pub mod https;
pub mod isolation;
pub mod latency;
pub mod lifecycle;
pub mod lock;
pub mod metrics;
pub mod notify;
pub mod output;
pub mod polling;
pub mod relay;
pub mod runner;
pub mod secrets;
pub mod status_file;

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
