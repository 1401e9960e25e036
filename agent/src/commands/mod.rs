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

/// Refuses a command that is not built on a PostgreSQL journal yet when `[journal] url` names
/// one (CONTRACT §9), rather than letting it use the SQLite journal in the data directory,
/// which the fleet does not write: `receive`, `run`, `status` and `check` work on PostgreSQL;
/// the other commands that read the journal do not yet. Exit 2.
pub fn refuse_unbuilt_on_postgres(command: &str, config: &Config) -> Result<(), Exit> {
    if config.pg_journal.is_none() || matches!(command, "receive" | "check" | "run" | "status") {
        return Ok(());
    }
    let file = crate::config::display_file(config.source.as_deref());
    let what = format!(
        "`rm-agent {command}` reads the embedded SQLite journal only; on a PostgreSQL journal it is not built yet"
    );
    Err(Exit::usage(format!(
        "{file}: `journal.url`: {what} (or remove `journal.url` to use the SQLite journal in data_dir)"
    )))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(journal: &str) -> Config {
        crate::config::from_text(&format!("[journal]\n{journal}\n")).unwrap()
    }

    #[test]
    fn on_postgres_only_receive_and_check_run_and_run_says_to_use_receive() {
        let pg = config("url = \"postgres://rm@db.example.net/rm\"");
        for command in ["receive", "check", "run", "status"] {
            assert!(
                refuse_unbuilt_on_postgres(command, &pg).is_ok(),
                "{command}"
            );
        }
        for command in ["jobs", "runners", "deliveries", "explain"] {
            let exit = refuse_unbuilt_on_postgres(command, &pg).unwrap_err();
            assert_eq!(exit.code, crate::exit::USAGE);
            assert!(exit.message.contains(command), "{}", exit.message);
        }
        let sqlite = config("");
        for command in ["run", "status", "jobs", "receive"] {
            assert!(
                refuse_unbuilt_on_postgres(command, &sqlite).is_ok(),
                "{command}"
            );
        }
    }
}
