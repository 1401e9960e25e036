//! How a command ends: CONTRACT §1's exit codes, each failure one sentence with its remedy.

use std::fmt;

/// `1`: something failed at run time.
pub const RUNTIME: u8 = 1;
/// `2`: usage or configuration error (the message names the file, the key and why).
pub const USAGE: u8 = 2;
/// `3`: conflict: another process already owns the data directory.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_failure_carries_its_whole_context_on_one_line() {
        let err = anyhow::anyhow!("disk full").context("cannot write the journal");
        let exit = Exit::runtime(err);
        assert_eq!(exit.code, RUNTIME);
        assert_eq!(exit.to_string(), "cannot write the journal: disk full");
        assert_eq!(Exit::usage("x").code, USAGE);
        assert_eq!(Exit::conflict("x").code, CONFLICT);
    }
}
