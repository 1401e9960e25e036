//! How a command ends: CONTRACT §1's exit codes, each failure one sentence with its remedy
//! ([`rm_base::exit`], shared with rm-relay), and how the agent's own errors map to them.

pub use rm_base::exit::{CONFLICT, Exit, RUNTIME, USAGE};

use crate::config::ConfigError;

impl From<ConfigError> for Exit {
    fn from(err: ConfigError) -> Self {
        Exit::usage(err.to_string())
    }
}
