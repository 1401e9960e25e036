//! One module per `rm-agent` command.

pub mod check;
pub mod deliveries;
pub mod demo;
pub mod jobs;
pub mod receive;
pub mod run;
pub mod runners;
pub mod status;

use std::path::PathBuf;

use rm_journal::{JOURNAL_FILE, Reader};

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
