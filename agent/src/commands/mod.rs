//! One module per `rm-agent` command.

pub(crate) mod check;
pub(crate) mod deliveries;
pub(crate) mod demo;
pub(crate) mod explain;
pub(crate) mod jobs;
pub(crate) mod receive;
pub(crate) mod run;
pub(crate) mod runners;
pub(crate) mod status;

// The entry point of each command, for the binary's dispatch (`main.rs`); everything else of a
// command is crate-private.
pub use check::run as check;
pub use deliveries::{list as deliveries_list, replay as deliveries_replay};
pub use demo::{fake_runner_mode, run as demo};
pub use explain::run as explain;
pub use jobs::run as jobs;
pub use receive::run as receive;
pub use run::run as run_agent;
pub use runners::run as runners;
pub use status::run as status;

use std::path::PathBuf;

use rm_journal::{JOURNAL_FILE, JournalError, Reader};

use crate::config::Config;
use crate::exit::Exit;

/// Refuses a command that is not built on a PostgreSQL journal yet when `[journal] url` names
/// one (CONTRACT §9), rather than letting it use the SQLite journal in the data directory,
/// which the fleet does not write: `receive`, `run`, `status`, `check`, `jobs`, `deliveries`
/// and `deliveries replay` work on PostgreSQL, and `runners` lists this host's runners, which a
/// fleet host journals in its own SQLite file; `explain` does not yet. Exit 2.
pub fn refuse_unbuilt_on_postgres(command: &str, config: &Config) -> Result<(), Exit> {
    let file = crate::config::display_file(config.source.as_deref());
    if config.pg_journal.is_some() && command == "run" {
        // In a fleet, deliveries reach the shared journal through `rm-agent receive`.
        let refused = if config.receiver.is_some() {
            Some((
                "receiver",
                "with `journal.url`, `rm-agent run` takes no deliveries itself: run `rm-agent receive` (any number, on any hosts) for the fleet's intake and remove [receiver] here",
            ))
        } else if config.relay.is_some() {
            Some((
                "relay",
                "with `journal.url`, a relay subscription is not built yet: subscribe from a host without `journal.url`, or take the webhooks with `rm-agent receive`",
            ))
        } else {
            None
        };
        if let Some((key, why)) = refused {
            return Err(Exit::usage(format!("{file}: `{key}`: {why}")));
        }
    }
    if config.pg_journal.is_none()
        || matches!(
            command,
            "receive"
                | "check"
                | "run"
                | "status"
                | "jobs"
                | "deliveries"
                | "deliveries replay"
                | "runners"
        )
    {
        return Ok(());
    }
    let what = format!(
        "`rm-agent {command}` reads the embedded SQLite journal only; on a PostgreSQL journal it is not built yet"
    );
    Err(Exit::usage(format!(
        "{file}: `journal.url`: {what} (or remove `journal.url` to use the SQLite journal in data_dir)"
    )))
}

/// Reads the fleet's PostgreSQL journal with `read`, on this (runtime-free) thread: the
/// listing commands.
pub fn fleet_read<T>(
    target: &rm_journal::PgTarget,
    read: impl FnOnce(&mut rm_journal::PgReader) -> Result<T, JournalError>,
) -> Result<T, Exit> {
    let what = || format!("cannot read the fleet's journal ({})", target.describe());
    let mut reader = rm_journal::PgReader::open(target)
        .map_err(|e| Exit::runtime(anyhow::Error::new(e).context(what())))?;
    read(&mut reader).map_err(|e| Exit::runtime(anyhow::Error::new(e).context(what())))
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
    fn on_postgres_the_commands_that_read_sqlite_refuse_and_run_takes_no_deliveries() {
        let pg = config("url = \"postgres://rm@db.example.net/rm\"");
        for command in [
            "receive",
            "check",
            "run",
            "status",
            "jobs",
            "deliveries",
            "deliveries replay",
            "runners",
        ] {
            assert!(
                refuse_unbuilt_on_postgres(command, &pg).is_ok(),
                "{command}"
            );
        }
        let exit = refuse_unbuilt_on_postgres("explain", &pg).unwrap_err();
        assert_eq!(exit.code, crate::exit::USAGE);
        assert!(exit.message.contains("explain"), "{}", exit.message);
        let sqlite = config("");
        for command in ["run", "status", "jobs", "receive"] {
            assert!(
                refuse_unbuilt_on_postgres(command, &sqlite).is_ok(),
                "{command}"
            );
        }
        // A fleet's `run` takes no deliveries itself: its intake is `receive`.
        let with_receiver = crate::config::from_text(
            "[journal]\nurl = \"postgres://rm@db.example.net/rm\"\n[receiver]\nlisten = \"127.0.0.1:8080\"\n",
        )
        .unwrap();
        let run = refuse_unbuilt_on_postgres("run", &with_receiver).unwrap_err();
        assert_eq!(run.code, crate::exit::USAGE);
        assert!(run.message.contains("`receiver`"), "{}", run.message);
        assert!(refuse_unbuilt_on_postgres("receive", &with_receiver).is_ok());
    }
}
