//! `rm-agent demo` (CONTRACT §3): owns whether this build can play the demo, and the one sentence
//! that says how to get it when it cannot. The demo embeds test code (the simulated GitHub of
//! `tests/fake-github`, the fake runner of `tests/fake-runner`), and test code is not part of the
//! product: only a build with the `demo` feature has it ([`play`]), so the `rm-agent` a user
//! installs (`cargo install --path agent`) carries no fake and no fake-runner mode.

#[cfg(feature = "demo")]
mod play;

/// The demo's runner uids, for tests that run beside it and must not share a uid or its
/// network slot.
#[cfg(feature = "demo")]
pub use play::DEMO_UIDS;

use std::process::ExitCode;

use crate::exit::Exit;

/// The command that runs the demo from a source checkout (the README's first command).
#[cfg(any(test, not(feature = "demo")))]
pub(crate) const DEMO_COMMAND: &str = "cargo run --release -p rm-agent --features demo -- demo";

/// The name the runner package's listener has: the demo copies this binary there.
#[cfg(feature = "demo")]
const RUNNER_LISTENER: &str = "Runner.Listener";

/// Runs the demo; `keep` leaves its temporary directory behind (and says where).
#[cfg(feature = "demo")]
pub async fn run(keep: bool) -> Result<(), Exit> {
    play::run(keep).await
}

/// Without the `demo` feature: exit 2 with [`unavailable`].
#[cfg(not(feature = "demo"))]
pub async fn run(_keep: bool) -> Result<(), Exit> {
    Err(unavailable())
}

/// Why this build has no demo and how to get one, as one sentence (a usage error: this binary
/// was asked for a command it was built without).
#[cfg(any(test, not(feature = "demo")))]
pub(crate) fn unavailable() -> Exit {
    Exit::usage(format!(
        "this rm-agent was built without the demo (it embeds a simulated GitHub and fake runners, \
         which an installed agent does not carry); run it from a source checkout with `{DEMO_COMMAND}`"
    ))
}

/// Started as `<package>/bin/Runner.Listener` by the demo, this binary is the fake runner, not
/// the agent: its exit code. `None` (always without the `demo` feature): be the agent.
pub fn fake_runner_mode() -> Option<ExitCode> {
    #[cfg(feature = "demo")]
    {
        let argv0 = std::env::args_os().next().unwrap_or_default();
        if std::path::Path::new(&argv0).file_name() == Some(RUNNER_LISTENER.as_ref()) {
            return Some(rm_fake_runner::listener_main());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_demo_one_sentence_names_the_command_that_has_it() {
        let exit = unavailable();
        assert_eq!(exit.code, crate::exit::USAGE);
        assert!(exit.message.contains(DEMO_COMMAND), "{}", exit.message);
        assert!(!exit.message.contains('\n'), "{}", exit.message);
        // One sentence: its only full stop would be its end (the caller adds none).
        assert!(!exit.message.contains(". "), "{}", exit.message);
    }

    /// The command the message names is the one that turns the demo on.
    #[test]
    fn the_demo_command_enables_the_demo_feature() {
        let manifest = include_str!("../../Cargo.toml");
        assert!(
            manifest.contains("\ndemo = ["),
            "no `demo` feature in agent/Cargo.toml"
        );
        assert!(DEMO_COMMAND.contains("--features demo"), "{DEMO_COMMAND}");
        // `cargo run -p rm-agent` must know which of the package's binaries to run (the tests'
        // `rm-agent-e2e` is the other).
        assert!(
            manifest.contains("\ndefault-run = \"rm-agent\"\n"),
            "agent/Cargo.toml has no default-run: `{DEMO_COMMAND}` would not know what to run"
        );
        let readme = include_str!("../../../README.md");
        assert!(
            readme.contains(DEMO_COMMAND),
            "the README's demo command is not {DEMO_COMMAND:?}"
        );
    }
}
