//! What names why a runner ended, beside the observation ([`crate::lifecycle::Findings`]): the
//! kernel's word on memory (the runner cgroup's `memory.events`), and on disk space the runner's
//! own logs ("No space left on device") and its runtime's filesystem. Supervision gathers them
//! only for a runner whose process is gone (nothing else is decided from them), before cleanup
//! removes the cgroup and the runtime.
//!
//! The runtime is the job's to write: its `_diag` is read through [`copy`]'s safe opens (no
//! link followed, no FIFO waited on, top level only), a bounded tail of a bounded number of
//! files, and only matched against a fixed phrase: nothing of it is logged or journalled.

use std::path::Path;

use rm_runner::cgroup;
use rm_runner::logs::copy;

/// What the C library prints for `ENOSPC`, in every tool a job runs (and .NET's `IOException`
/// in the runner's own logs): a write failed because the filesystem had no space.
pub const ENOSPC_PHRASE: &str = "No space left on device";

/// How much of the end of each file in `_diag` is read: the failure is among the last lines a
/// runner or a step wrote.
pub const TAIL_BYTES: u64 = 64 * 1024;

/// How many files of `_diag` are read at most (a runner writes a handful; a job may write
/// thousands to slow supervision down).
pub const MAX_FILES: usize = 32;

/// What actions/runner's listener prints on its console (`JobDispatcher`: "Job build completed
/// with result: Succeeded") once its job ended, whatever the result; the agent keeps the
/// console in [`rm_runner::logs::OUTPUT_FILE`].
pub const JOB_ENDED_PHRASE: &str = " completed with result: ";

/// The runner cgroup's memory report: OOM kills and the peak, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub oom_kills: u64,
    pub peak: Option<u64>,
}

/// Reads the runner cgroup's memory report (nothing without a cgroup or a memory controller).
pub fn memory(cgroup: Option<&Path>) -> Memory {
    let Some(path) = cgroup else {
        return Memory::default();
    };
    let (oom_kills, peak) = cgroup::memory_report(path);
    Memory { oom_kills, peak }
}

/// Whether `text` (the end of a log) says a write failed for want of space.
pub fn says_disk_full(text: &str) -> bool {
    text.contains(ENOSPC_PHRASE)
}

/// Whether the runtime's filesystem has no space left for an unprivileged writer now, or any of
/// the first [`MAX_FILES`] regular files of its `_diag` ends saying a write failed for want of
/// space. A missing runtime or `_diag` says nothing.
pub fn disk_full(runtime: &Path) -> bool {
    filesystem_full(runtime) || logs_say_disk_full(&runtime.join(copy::DIAG_DIR))
}

/// Whether the runner's console (the end of its kept stdout) says its job ended. A runner gone
/// mid-job never printed it; one that finished while no agent watched did.
pub fn job_ended(runtime: &Path) -> bool {
    copy::any_tail(
        &runtime.join(copy::DIAG_DIR),
        |name| name == rm_runner::logs::OUTPUT_FILE,
        1,
        TAIL_BYTES,
        |text| text.contains(JOB_ENDED_PHRASE),
    )
}

fn filesystem_full(runtime: &Path) -> bool {
    rustix::fs::statvfs(runtime).is_ok_and(|stat| stat.f_blocks > 0 && stat.f_bavail == 0)
}

fn logs_say_disk_full(diag: &Path) -> bool {
    copy::any_tail(diag, copy::safe_name, MAX_FILES, TAIL_BYTES, says_disk_full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_s_count_of_oom_kills_is_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(cgroup::parse_oom_kills(events), Some(2));
        assert_eq!(cgroup::parse_oom_kills("low 0\noom 1\n"), None);
        assert_eq!(cgroup::parse_oom_kills("oom_kill_x 4\n"), None);

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(memory(None), Memory::default());
        assert_eq!(memory(Some(dir.path())), Memory::default(), "no controller");
        std::fs::write(dir.path().join("memory.events"), events).unwrap();
        std::fs::write(dir.path().join("memory.peak"), "536870912\n").unwrap();
        assert_eq!(
            memory(Some(dir.path())),
            Memory {
                oom_kills: 2,
                peak: Some(536_870_912)
            }
        );
    }

    #[test]
    fn a_log_that_ends_saying_enospc_means_the_disk_was_full() {
        let runtime = tempfile::tempdir().unwrap();
        assert!(!disk_full(runtime.path()), "no _diag");
        let diag = runtime.path().join("_diag");
        std::fs::create_dir(&diag).unwrap();
        std::fs::write(diag.join("Runner_1-utc.log"), "listening\n").unwrap();
        std::fs::write(diag.join("rm-output.log"), "Running job: build\n").unwrap();
        assert!(!disk_full(runtime.path()));
        // As a step's `dd` says it, after a long log.
        let words = format!(
            "{}dd: error writing '/work/big': No space left on device\n",
            "x".repeat(3 * TAIL_BYTES as usize)
        );
        std::fs::write(diag.join("rm-output.log"), words).unwrap();
        assert!(disk_full(runtime.path()));
    }

    #[test]
    fn the_runner_s_console_says_when_its_job_ended() {
        let runtime = tempfile::tempdir().unwrap();
        assert!(!job_ended(runtime.path()));
        let diag = runtime.path().join("_diag");
        std::fs::create_dir(&diag).unwrap();
        let output = diag.join(rm_runner::logs::OUTPUT_FILE);
        std::fs::write(&output, "2026-12-03 10:00:00Z: Running job: build\n").unwrap();
        assert!(!job_ended(runtime.path()), "running, not ended");
        std::fs::write(
            &output,
            "2026-12-03 10:00:00Z: Running job: build\n2026-12-03 10:00:05Z: Job build completed with result: Failed\n",
        )
        .unwrap();
        assert!(job_ended(runtime.path()));
    }

    #[test]
    fn a_link_or_a_fifo_in_diag_is_never_read() {
        let runtime = tempfile::tempdir().unwrap();
        let diag = runtime.path().join("_diag");
        std::fs::create_dir(&diag).unwrap();
        let elsewhere = runtime.path().join("elsewhere.log");
        std::fs::write(&elsewhere, "No space left on device\n").unwrap();
        std::os::unix::fs::symlink(&elsewhere, diag.join("Runner_1-utc.log")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            diag.join("Worker_1-utc.log"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Returns (a FIFO is not waited on) and says nothing.
        assert!(!disk_full(runtime.path()));
    }
}
