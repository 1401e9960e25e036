//! Finding a runner's processes by where they run rather than by a journalled pid: every
//! process whose working directory is inside a runtime directory belongs to that runner (rm
//! created the directory for it alone). Two uses:
//! - recovery of an agent that crashed between spawning a runner and journalling its pid: the
//!   listener is the group leader whose working directory is the runtime itself;
//! - cleanup: a job process that left the runner's process group (`setsid`) but still works in
//!   the runtime is stopped before the runtime is removed, instead of being orphaned there.

use std::io;
use std::path::{Path, PathBuf};

use super::process::{ProcStat, ProcessIdentity, read_stat};

/// Where the kernel shows processes.
const PROC: &str = "/proc";

/// A live process working inside a runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    pub stat: ProcStat,
    /// Its working directory is the runtime itself (not a folder inside it).
    pub at_top: bool,
}

/// Which of the candidate `(stat, cwd)` pairs work inside `runtime`; pure.
pub(crate) fn residents_of(
    runtime: &Path,
    candidates: impl IntoIterator<Item = (ProcStat, PathBuf)>,
    own_pid: u32,
) -> Vec<Resident> {
    candidates
        .into_iter()
        .filter(|(stat, cwd)| stat.pid != own_pid && !stat.is_dead() && cwd.starts_with(runtime))
        .map(|(stat, cwd)| Resident {
            stat,
            at_top: cwd == runtime,
        })
        .collect()
}

/// The listener among the residents: a process-group leader working at the runtime's top.
pub fn listener(residents: &[Resident]) -> Option<ProcessIdentity> {
    residents
        .iter()
        .filter(|r| r.at_top && r.stat.pgrp == r.stat.pid)
        .min_by_key(|r| r.stat.start_time)
        .map(|r| ProcessIdentity {
            pid: r.stat.pid,
            start_time: r.stat.start_time,
        })
}

/// The live processes working inside `runtime` (canonicalised). A process that cannot be
/// looked at (another user's) is not ours and is skipped.
pub fn residents(runtime: &Path) -> io::Result<Vec<Resident>> {
    let Ok(runtime) = runtime.canonicalize() else {
        return Ok(Vec::new());
    };
    let mut candidates = Vec::new();
    for entry in std::fs::read_dir(PROC)? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(Path::new(PROC).join(pid.to_string()).join("cwd")) else {
            continue;
        };
        if let Ok(Some(stat)) = read_stat(pid) {
            candidates.push((stat, cwd));
        }
    }
    Ok(residents_of(&runtime, candidates, std::process::id()))
}

/// SIGKILLs every process still working inside `runtime`, each re-identified by its start time
/// just before the signal. Returns how many were signalled.
pub(crate) fn kill_residents(runtime: &Path) -> io::Result<usize> {
    let mut killed = 0;
    for resident in residents(runtime)? {
        let pid = resident.stat.pid;
        let still_same =
            matches!(read_stat(pid), Ok(Some(now)) if now.start_time == resident.stat.start_time);
        let Some(target) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .filter(|p| p.as_raw_nonzero().get() > 1)
        else {
            continue;
        };
        if still_same
            && rustix::process::kill_process(target, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    Ok(killed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt as _;

    use super::*;

    fn stat(pid: u32, pgrp: u32, start_time: u64, state: char) -> ProcStat {
        ProcStat {
            pid,
            state,
            pgrp,
            start_time,
        }
    }

    #[test]
    fn residents_are_live_processes_inside_the_runtime_but_not_the_agent() {
        let runtime = Path::new("/runners/abc");
        let found = residents_of(
            runtime,
            [
                (stat(10, 10, 5, 'S'), PathBuf::from("/runners/abc")),
                (stat(11, 10, 6, 'S'), PathBuf::from("/runners/abc/_work/r")),
                (stat(12, 12, 7, 'S'), PathBuf::from("/runners/abcdef")),
                (stat(13, 13, 8, 'Z'), PathBuf::from("/runners/abc")),
                (stat(14, 14, 9, 'S'), PathBuf::from("/runners/abc")),
            ],
            14,
        );
        let pids: Vec<u32> = found.iter().map(|r| r.stat.pid).collect();
        assert_eq!(pids, [10, 11]);
        assert_eq!(
            listener(&found),
            Some(ProcessIdentity {
                pid: 10,
                start_time: 5
            })
        );
    }

    #[test]
    fn a_job_process_is_not_mistaken_for_the_listener() {
        let runtime = Path::new("/runners/abc");
        let found = residents_of(
            runtime,
            [(stat(11, 10, 6, 'S'), PathBuf::from("/runners/abc"))],
            1,
        );
        assert_eq!(listener(&found), None);
    }

    #[test]
    fn finds_and_kills_a_real_process_working_in_a_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("rt");
        std::fs::create_dir(&runtime).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(&runtime)
            .process_group(0)
            .spawn()
            .unwrap();
        let found = residents(&runtime).unwrap();
        let leader = listener(&found).unwrap();
        assert_eq!(leader.pid, child.id());
        assert_eq!(kill_residents(&runtime).unwrap(), 1);
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(residents(&runtime).unwrap().is_empty());
    }
}
