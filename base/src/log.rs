//! The log setup every rm binary uses: lines on stderr (stdout is for output), as text for people
//! or JSON for log collectors, filtered by `RM_LOG` (an `EnvFilter` directive such as
//! `rm_agent=debug`) or else the command's default level.

use std::io::IsTerminal as _;

/// The environment variable that overrides a command's default log level.
pub const LOG_ENV: &str = "RM_LOG";

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the process's log subscriber. Colour only when stderr is a terminal.
pub fn init(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
