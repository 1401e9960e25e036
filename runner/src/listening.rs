//! Whether a runner's listener has connected to GitHub and waits for a job, as the runner itself
//! reports it: actions/runner writes `Listening for Jobs` once its session with GitHub is open
//! (`src/Runner.Listener/Runner.cs`), and every line it writes to its terminal is traced into
//! its `_diag/Runner_*.log` as `WRITE LINE: …` (`src/Runner.Common/Terminal.cs`).
//!
//! Supervision reads this for a scale set's runner instead of GitHub's REST runner listing (a
//! scale set's runners are watched without REST requests, issue 29). It is read only while the
//! runner is `starting`, which is before any job ran: the words are the runner's, not a job's.
//! The log is read bounded, never followed through a link, and only matched against a fixed
//! phrase: nothing of it is logged or journalled.

use std::path::Path;

use super::logs::copy;

/// What actions/runner writes when its listener is connected and waits for a job.
pub(crate) const LISTENING_PHRASE: &str = "Listening for Jobs";
/// How much of the end of each listener log is read. The phrase comes after the start-up's
/// traces (tens of KiB on a real runner) and before anything else is written, so the end of a
/// log not yet past a MiB holds it.
pub const READ_BYTES: u64 = 1024 * 1024;

/// Whether any `Runner_*.log` in the `diag` folder says the listener is connected. Unreadable,
/// missing or linked files say nothing; every file is opened relative to the folder without
/// following a link and without waiting on a FIFO ([`copy::any_listener_log_tail`]).
pub fn listening(diag: &Path) -> bool {
    copy::any_listener_log_tail(diag, READ_BYTES, |text| text.contains(LISTENING_PHRASE))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As actions/runner 2.330.0 traces its terminal line into its listener log.
    const REAL: &str = "[2026-08-22 13:46:17Z INFO Terminal] WRITE LINE: 2026-08-22 13:46:17Z: Listening for Jobs\n";

    #[test]
    fn the_runner_s_own_words_are_recognised_in_its_listener_log() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!listening(dir.path()));
        assert!(!listening(&dir.path().join("missing")));
        std::fs::write(
            dir.path().join("Runner_1-utc.log"),
            "[2026-08-22 13:46:10Z INFO Runner] Starting\n",
        )
        .unwrap();
        assert!(!listening(dir.path()), "started, not yet connected");
        // After a long start-up.
        let long = format!("{}{REAL}", "x".repeat(200 * 1024));
        std::fs::write(dir.path().join("Runner_1-utc.log"), long).unwrap();
        assert!(listening(dir.path()));
    }
}
