//! The processes of a runner uid: finding every process that runs as a pool uid, and killing
//! them all before the uid is handed to the next runner. The runner's cgroup kills what the job
//! started; this is the second net, for a uid whose cgroup is gone (a crash, a host without
//! cgroup v2) and for processes that reached the uid some other way. A uid is only ever
//! reused once a scan of `/proc` finds nothing running as it.
//!
//! The decisions are pure ([`parse_status_uids`], [`parse_status_threads`], [`runs_as`],
//! [`is_live`]); the scan and the signals are thin wrappers around `/proc` and pidfds.

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal};

use crate::process::read_stat;

/// How long [`kill_all`] keeps killing before it reports survivors. Killed processes exit in
/// milliseconds; a job that forks faster than it is killed loses within a few rounds, so what is
/// left after this is stuck in the kernel (uninterruptible sleep) and the uid stays out of the
/// pool until a later sweep.
pub(crate) const KILL_UID_WAIT: Duration = Duration::from_secs(10);

/// How often [`kill_all`] scans `/proc` again while processes of the uid remain.
pub(crate) const KILL_UID_POLL: Duration = Duration::from_millis(20);

const PROC: &str = "/proc";

/// What can go wrong killing a uid's processes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UidError {
    #[error(
        "refusing to kill every process of uid {uid}: it is root or the agent's own user; give runners uids of their own (host.runner_uids)"
    )]
    Refused { uid: u32 },
    #[error(
        "cannot scan /proc for the processes of uid {uid}: {source}; the agent needs /proc mounted"
    )]
    Scan { uid: u32, source: io::Error },
    #[error(
        "{count} processes of uid {uid} survived SIGKILL for {waited:?}; they are probably stuck in uninterruptible sleep: the uid stays out of the pool until they are gone"
    )]
    Survivors {
        uid: u32,
        count: usize,
        waited: Duration,
    },
}

/// The real, effective, saved and filesystem uids of a `/proc/<pid>/status` text.
pub(crate) fn parse_status_uids(status: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut fields = line.split_whitespace().map(|f| f.parse::<u32>().ok());
    let uids = [
        fields.next()??,
        fields.next()??,
        fields.next()??,
        fields.next()??,
    ];
    fields.next().is_none().then_some(uids)
}

/// The thread count (`Threads:`) of a `/proc/<pid>/status` text.
pub(crate) fn parse_status_threads(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// Whether any of a process's uids is `uid`: a process that kept `uid` only as its saved or
/// filesystem uid can switch back to it or act with its file rights.
pub(crate) fn runs_as(uids: [u32; 4], uid: u32) -> bool {
    uids.contains(&uid)
}

/// Whether a process still runs code. A zombie leader (`dead`) can still have live threads (its
/// main thread called `pthread_exit`): that process is alive, and counting it as dead would let
/// a job hide from [`kill_all`] that way.
pub fn is_live(dead: bool, threads: Option<u32>) -> bool {
    !dead || threads.is_some_and(|n| n > 1)
}

/// A process of a uid: its pid and start time (field 22 of `/proc/<pid>/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UidProcess {
    pub pid: u32,
    pub start_time: u64,
}

/// Every live process any of whose uids is `uid`. Processes that exit while `/proc` is read are
/// simply not listed.
pub fn processes_of(uid: u32) -> io::Result<Vec<UidProcess>> {
    let mut found = Vec::new();
    for pid in pids()? {
        if let Some((_, process)) = live(pid, |uids| runs_as(uids, uid))? {
            found.push(process);
        }
    }
    Ok(found)
}

/// Every uid some live process of this host runs as (any of its four): the uids no runner may
/// be given. A zombie holds nothing but its pid (init reaps it, sometimes a second late) and
/// does not count.
pub fn running_uids() -> io::Result<HashSet<u32>> {
    let mut running = HashSet::new();
    for pid in pids()? {
        if let Some((uids, _)) = live(pid, |_| true)? {
            running.extend(uids);
        }
    }
    Ok(running)
}

/// The pids `/proc` lists now.
fn pids() -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(PROC)? {
        if let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// The uids of the process `pid` and who it is, if it is live and its uids pass `wanted`;
/// `None` if they do not, or it is dead or gone.
fn live(
    pid: u32,
    wanted: impl FnOnce([u32; 4]) -> bool,
) -> io::Result<Option<([u32; 4], UidProcess)>> {
    let status = match std::fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("status"))
    {
        Ok(status) => status,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(uids) = parse_status_uids(&status).filter(|uids| wanted(*uids)) else {
        return Ok(None);
    };
    let Some(stat) = read_stat(pid)? else {
        return Ok(None);
    };
    Ok(
        is_live(stat.is_dead(), parse_status_threads(&status)).then_some((
            uids,
            UidProcess {
                pid,
                start_time: stat.start_time,
            },
        )),
    )
}

/// An error reading `/proc/<pid>/...` that only means the process went away.
fn gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error())
}

/// SIGKILLs every process of `uid` and scans again, until a scan finds none or `wait` has
/// passed. Each process is re-identified through a pidfd just before its signal, so a pid
/// recycled to another user's process is never hit. Returns how many distinct processes were
/// signalled. Refused for uid 0 and for the agent's own real or effective uid.
pub(crate) fn kill_all(uid: u32, wait: Duration) -> Result<usize, UidError> {
    let own = [
        rustix::process::getuid().as_raw(),
        rustix::process::geteuid().as_raw(),
    ];
    if uid == 0 || own.contains(&uid) {
        return Err(UidError::Refused { uid });
    }
    let start = Instant::now();
    let mut signalled = HashSet::new();
    loop {
        let found = processes_of(uid).map_err(|source| UidError::Scan { uid, source })?;
        if found.is_empty() {
            return Ok(signalled.len());
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(UidError::Survivors {
                uid,
                count: found.len(),
                waited,
            });
        }
        for process in found {
            if signal(process, uid) {
                signalled.insert(process);
            }
        }
        std::thread::sleep(KILL_UID_POLL.min(wait - waited));
    }
}

/// SIGKILLs `process` if it is still the process of `uid` the scan found. The pidfd pins one
/// process; checking the start time and uid after opening it proves it is that process, so the
/// signal cannot reach a recycled pid. Returns whether a signal was sent.
fn signal(process: UidProcess, uid: u32) -> bool {
    let Some(pid) = i32::try_from(process.pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    let pidfd = match rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => Some(fd),
        // Before Linux 5.3: a plain kill after the same checks, with the small window that
        // leaves between check and signal.
        Err(rustix::io::Errno::NOSYS) => None,
        Err(_) => return false, // Gone.
    };
    let same = matches!(
        live(process.pid, |uids| runs_as(uids, uid)),
        Ok(Some((_, now))) if now.start_time == process.start_time
    );
    if !same {
        return false;
    }
    match pidfd {
        Some(fd) => rustix::process::pidfd_send_signal(&fd, Signal::KILL).is_ok(),
        None => rustix::process::kill_process(pid, Signal::KILL).is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    use std::process::{Child, Command, Stdio};

    use super::*;

    const STATUS: &str = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nPid:\t4242\n\
        PPid:\t1\nUid:\t64990\t64991\t64992\t64993\nGid:\t64990\t64990\t64990\t64990\n\
        Groups:\t\nThreads:\t1\n";

    #[test]
    fn the_four_uids_come_from_the_uid_line() {
        assert_eq!(
            parse_status_uids(STATUS),
            Some([64990, 64991, 64992, 64993])
        );
        assert_eq!(parse_status_threads(STATUS), Some(1));
        assert_eq!(parse_status_uids("Uid:\t0\t0\t0\t0\n"), Some([0; 4]));
    }

    #[test]
    fn a_malformed_uid_line_gives_nothing() {
        for bad in [
            "Name:\tx\n",
            "Uid:\t1\t2\t3\n",
            "Uid:\t1\t2\t3\t4\t5\n",
            "Uid:\t1\t2\tx\t4\n",
            // Gid is not Uid.
            "Gid:\t1\t2\t3\t4\n",
        ] {
            assert_eq!(parse_status_uids(bad), None, "{bad:?}");
        }
        assert_eq!(parse_status_threads("Threads:\tmany\n"), None);
    }

    #[test]
    fn any_of_the_four_uids_counts() {
        let uids = [1000, 64990, 1000, 1000];
        assert!(runs_as(uids, 64990));
        assert!(runs_as([1, 1, 1, 64990], 64990));
        assert!(!runs_as(uids, 64991));
    }

    #[test]
    fn a_zombie_leader_with_live_threads_is_live() {
        assert!(is_live(false, Some(1)));
        assert!(is_live(false, None));
        assert!(!is_live(true, Some(1)));
        assert!(!is_live(true, None));
        assert!(is_live(true, Some(3)));
    }

    #[test]
    fn root_and_the_agents_own_uid_are_refused() {
        let me = rustix::process::geteuid().as_raw();
        for uid in [0, me, rustix::process::getuid().as_raw()] {
            assert!(matches!(
                kill_all(uid, KILL_UID_WAIT),
                Err(UidError::Refused { uid: u }) if u == uid
            ));
        }
    }

    #[test]
    fn an_unused_uid_has_no_processes_and_nothing_to_kill() {
        // Only root can run as this uid, and no test in this crate uses it.
        let uid = 64_989;
        assert!(processes_of(uid).unwrap().is_empty());
        if rustix::process::geteuid().as_raw() != uid {
            assert_eq!(kill_all(uid, KILL_UID_WAIT).unwrap(), 0);
        }
    }

    fn spawn_as(uid: u32, program: &str, args: &[&str]) -> Child {
        Command::new(program)
            .args(args)
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn kill_all_kills_every_process_of_the_uid_and_their_children() {
        if !rustix::process::geteuid().is_root() {
            crate::test_skip::cannot_run(
                "kill_all_kills_every_process_of_the_uid_and_their_children",
                "root",
                "the tests do not run as root (only root can start processes under another uid)",
            );
            return;
        }
        // Unused by anything else on a test host; distinct per run of this test binary so
        // concurrent runs (another worktree) do not count each other's processes.
        let uid = 64_990 + std::process::id() % 9;
        let lone = spawn_as(uid, "sleep", &["60"]);
        let parent = spawn_as(uid, "sh", &["-c", "sleep 61 & sleep 62 & wait"]);
        // sh forks its two sleeps shortly after it starts.
        let deadline = Instant::now() + Duration::from_secs(10);
        while processes_of(uid).unwrap().len() < 4 {
            assert!(
                Instant::now() < deadline,
                "the test processes did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let before = processes_of(uid).unwrap();
        assert!(before.iter().any(|p| p.pid == lone.id()));
        assert!(before.iter().any(|p| p.pid == parent.id()));

        let signalled = kill_all(uid, KILL_UID_WAIT).unwrap();
        assert!(signalled >= 4, "{signalled}");
        assert!(processes_of(uid).unwrap().is_empty());
        for mut child in [lone, parent] {
            let status = child.wait().unwrap();
            assert_eq!(status.signal(), Some(9), "{status:?}");
        }
        assert!(processes_of(uid).unwrap().is_empty());
    }
}
