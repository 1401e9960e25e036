//! Whether GitHub refused a runner for its version, as the runner itself reports it: an
//! actions/runner too old for GitHub (a JIT runner cannot update itself) has its first request
//! for a job answered `403`, writes `Runner version vX.Y.Z is deprecated and cannot receive
//! messages.` to its `_diag/Runner_*.log` (and stdout, which the agent does not read) and exits.
//! Supervision reads this so the attempt fails as `runner_version_rejected`, in those words,
//! rather than as a runner that exited for no known reason.
//!
//! The log is the listener's own, written before any job ran (a runner that ran a job is judged
//! by its `Worker_*.log` first); it is read bounded, never followed through a link, and only
//! matched against a fixed phrase: nothing of it is logged or journalled.

use std::path::Path;

use super::logs::copy;

/// What actions/runner writes when GitHub refuses its version
/// (`src/Runner.Common/RunnerServer.cs` / the broker's `GetRunnerMessageAsync`: a `403` becomes
/// `AccessDeniedException("… Runner version v{version} is deprecated and cannot receive
/// messages.")`).
pub(crate) const REFUSED_PHRASE: &str = "is deprecated and cannot receive messages";
/// How much of the end of each listener log is read (the refusal is among its last lines).
pub const TAIL_BYTES: u64 = 64 * 1024;

/// Whether `text` is the runner saying GitHub refused its version.
pub(crate) fn says_refused(text: &str) -> bool {
    text.contains(REFUSED_PHRASE)
}

/// Whether any `Runner_*.log` in the `diag` folder says GitHub refused the runner's version.
/// Unreadable, missing or linked files say nothing. The folder is the job's to write: every
/// file is opened relative to the folder's descriptor without following a link and without
/// waiting on a FIFO ([`copy::any_listener_log_tail`]), so a job that swaps a log for a FIFO or a link
/// between a look and an open cannot stall supervision or point it elsewhere.
pub fn refused(diag: &Path) -> bool {
    copy::any_listener_log_tail(diag, TAIL_BYTES, says_refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What actions/runner 2.330.0 wrote when GitHub refused it (a service's journal).
    const REAL: &str = "2026-08-22 13:46:17Z: Listening for Jobs\nAn error occured: Runner version v2.330.0 is deprecated and cannot receive messages.\nRunner listener exit with terminated error, stop the service, no retry needed.\n";

    #[test]
    fn the_runner_s_own_words_are_recognised_in_its_listener_log() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!refused(dir.path()));
        assert!(!refused(&dir.path().join("missing")));
        std::fs::write(dir.path().join("Runner_1-utc.log"), "registered\n").unwrap();
        assert!(!refused(dir.path()));
        // At the end of a long log.
        let long = format!("{}{REAL}", "x".repeat(3 * TAIL_BYTES as usize));
        std::fs::write(dir.path().join("Runner_2-utc.log"), long).unwrap();
        assert!(refused(dir.path()));
    }
}
