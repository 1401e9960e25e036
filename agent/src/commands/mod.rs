//! One module per `rm-agent` command.

pub(crate) mod check;
pub(crate) mod deliveries;
pub(crate) mod demo;
pub(crate) mod egress;
#[cfg(feature = "demo")]
pub use demo::DEMO_UIDS;
pub(crate) mod explain;
pub(crate) mod jobs;
pub(crate) mod logs;
pub(crate) mod receive;
pub(crate) mod run;
pub(crate) mod runners;
pub(crate) mod shapes;
pub(crate) mod status;

// The entry point of each command, for the binary's dispatch (`main.rs`); everything else of a
// command is crate-private.
pub use check::run as check;
pub use deliveries::{list as deliveries_list, replay as deliveries_replay};
pub use demo::{fake_runner_mode, run as demo};
pub use egress::{
    DEFAULT_SINCE as EGRESS_DEFAULT_SINCE, job as egress_job, policy as egress_policy,
};
pub use explain::run as explain;
pub use jobs::run as jobs;
pub use logs::run as logs;
pub use receive::run as receive;
pub use run::run as run_agent;
pub use runners::run as runners;
pub use shapes::{DEFAULT_SINCE as SHAPES_DEFAULT_SINCE, run as shapes};
pub use status::run as status;

use std::path::PathBuf;

use rm_journal::{JOURNAL_FILE, JobReader, JournalError, Reader, Store};

use crate::config::Config;
use crate::exit::Exit;

/// With `[journal] url` (CONTRACT §9) every command reads the fleet's journal (and `runners`
/// this host's own, which a fleet host journals in its own SQLite file), but a fleet's `run`
/// takes no deliveries itself: `[receiver]` and `[relay]` beside `journal.url` are refused
/// (exit 2), naming the key and the way out.
pub fn refuse_on_shared_journal(command: &str, config: &Config) -> Result<(), Exit> {
    if config.pg_journal.is_none() || command != "run" {
        return Ok(());
    }
    let file = crate::config::display_file(config.source.as_deref());
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
    match refused {
        Some((key, why)) => Err(Exit::usage(format!("{file}: `{key}`: {why}"))),
        None => Ok(()),
    }
}

/// Where this host's journal is: its file in the data directory, and the fleet's shared
/// journal when `journal.url` names one (its password from the environment).
pub fn store(config: &Config) -> Store {
    Store::open(journal_path(config), crate::secrets::journal_target(config))
}

/// Reads jobs or deliveries with `read`, wherever the store keeps them, on this (runtime-free)
/// thread: the listing commands. A single host's journal that no agent has made yet is the
/// empty state under `--json` ([`open_reader_or_empty`]).
pub fn read_jobs<T: Default>(
    config: &Config,
    json: bool,
    read: impl FnOnce(&mut JobReader) -> Result<T, JournalError>,
) -> Result<T, Exit> {
    let store = store(config);
    let failed = |e| journal_failed(&store, "read", e);
    match empty_if_missing(store.jobs(), json).map_err(failed)? {
        Some(mut jobs) => read(&mut jobs).map_err(failed),
        None => Ok(T::default()),
    }
}

/// A command's journal error (exit 1): on the fleet's journal it says which database (the
/// file's errors name the file already).
pub(crate) fn journal_failed(store: &Store, doing: &str, e: JournalError) -> Exit {
    if store.is_shared() {
        Exit::runtime(anyhow::Error::new(e).context(format!("cannot {doing} {}", store.describe())))
    } else {
        Exit::runtime(e)
    }
}

/// The fleet's hosts, leases and claims (`status`, `explain`), on this (runtime-free) thread.
pub(crate) fn fleet_view(store: &Store) -> Result<rm_journal::FleetView, JournalError> {
    store.fleet()?.view().map_err(|e| match e {
        rm_journal::FleetError::Journal(e) => e,
        other => JournalError::Commit(other.to_string()),
    })
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
    empty_if_missing(Reader::open(&journal_path(config)), json).map_err(Exit::runtime)
}

/// `opened`, or under `--json` the empty state (`None`, said on stderr) when the journal file
/// does not exist yet ([`open_reader_or_empty`]).
fn empty_if_missing<T>(
    opened: Result<T, JournalError>,
    json: bool,
) -> Result<Option<T>, JournalError> {
    match opened {
        Ok(opened) => Ok(Some(opened)),
        Err(err @ JournalError::Missing(_)) if json => {
            eprintln!("rm-agent: {err}; printing the empty state.");
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// Opens this host's own journal on a fleet host (its runners' attempts); `None`, silently,
/// when no `run` has used the data directory yet: a receiver-only host, or a host not yet
/// started, has no runners, and the fleet's answer does not depend on it.
pub fn open_local_reader(config: &Config) -> Result<Option<Reader>, Exit> {
    match Reader::open(&journal_path(config)) {
        Ok(reader) => Ok(Some(reader)),
        Err(JournalError::Missing(_)) => Ok(None),
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
    fn on_postgres_every_command_runs_but_run_takes_no_deliveries() {
        let pg = config("url = \"postgres://rm@db.example.net/rm\"");
        for command in [
            "receive",
            "check",
            "run",
            "status",
            "explain",
            "egress",
            "jobs",
            "deliveries",
            "deliveries replay",
            "runners",
            "logs",
        ] {
            assert!(refuse_on_shared_journal(command, &pg).is_ok(), "{command}");
        }
        // A fleet's `run` takes no deliveries itself: its intake is `receive`.
        let with_receiver = crate::config::from_text(
            "[journal]\nurl = \"postgres://rm@db.example.net/rm\"\n[receiver]\nlisten = \"127.0.0.1:8080\"\n",
        )
        .unwrap();
        let run = refuse_on_shared_journal("run", &with_receiver).unwrap_err();
        assert_eq!(run.code, crate::exit::USAGE);
        assert!(run.message.contains("`receiver`"), "{}", run.message);
        assert!(refuse_on_shared_journal("receive", &with_receiver).is_ok());
        // Without `journal.url` the same file's `run` takes its deliveries.
        let sqlite = crate::config::from_text("[receiver]\nlisten = \"127.0.0.1:8080\"\n").unwrap();
        assert!(refuse_on_shared_journal("run", &sqlite).is_ok());
    }
}
