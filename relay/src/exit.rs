//! How a command ends: CONTRACT §1's exit codes, each failure one sentence with its remedy.

use std::fmt;

/// `1`: something failed at run time.
pub const RUNTIME: u8 = 1;
/// `2`: usage or configuration error (including a channel name that is already taken, or a
/// channel or host that does not exist).
pub const USAGE: u8 = 2;

/// `3`: conflict: another `rm-relay serve` already uses the data directory.
pub const CONFLICT: u8 = 3;

/// A command's failure and the exit code it maps to.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl Exit {
    pub fn usage(message: impl Into<String>) -> Self {
        Exit {
            code: USAGE,
            message: message.into(),
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Exit {
            code: CONFLICT,
            message: message.into(),
        }
    }

    /// A run-time failure; the error's whole context chain on one line.
    pub fn runtime(err: impl Into<anyhow::Error>) -> Self {
        Exit {
            code: RUNTIME,
            message: format!("{:#}", err.into()),
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
