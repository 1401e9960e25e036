//! One module per `rm-agent` command.

pub mod check;
pub mod deliveries;
pub mod demo;
pub mod explain;
pub mod jobs;
pub mod receive;
pub mod run;
pub mod runners;
pub mod status;

use std::path::PathBuf;

use rm_journal::{JOURNAL_FILE, JournalError, Reader};

use crate::config::Config;
use crate::exit::Exit;

/// The journal file inside the configured data directory.
pub fn journal_path(config: &Config) -> PathBuf {
    config.data_dir.join(JOURNAL_FILE)
}

/// Opens the journal read-only for a reporting command.
pub fn open_reader(config: &Config) -> Result<Reader, Exit> {
    Reader::open(&journal_path(config)).map_err(Exit::runtime)
}

/// Opens the journal for a reporting command; `None` when `--json` asked and no agent has used
/// the data directory yet. A script then gets the contract's document for the empty state (an
/// empty list, zero counts) and exit 0 instead of no JSON at all; stderr still says that no
/// agent has run here, so a wrong `--data-dir` is noticed. Without `--json` a missing journal
/// stays an error (exit 1) that names the path.
pub fn open_reader_or_empty(config: &Config, json: bool) -> Result<Option<Reader>, Exit> {
    match Reader::open(&journal_path(config)) {
        Ok(reader) => Ok(Some(reader)),
        Err(err @ JournalError::Missing(_)) if json => {
            eprintln!("rm-agent: {err}; printing the empty state.");
            Ok(None)
        }
        Err(err) => Err(Exit::runtime(err)),
    }
}
