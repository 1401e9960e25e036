//! The pure decisions of the runner process adapter, and the stop loop driven through a fake
//! [`Processes`] that reacts to signals the way a runner would.

use std::sync::Mutex;

use super::*;

const ME: ProcessIdentity = ProcessIdentity {
    pid: 4242,
    start_time: 1000,
};

fn stat(pid: u32, state: char, pgrp: u32, start_time: u64) -> ProcStat {
    ProcStat {
        pid,
        state,
        pgrp,
        start_time,
    }
}

/// A stat line with `comm` and the given state, pgrp and start time at their field numbers.
fn stat_line(pid: u32, comm: &str, state: char, pgrp: u32, start: u64) -> String {
    // Fields 3..=22, then a few more as the kernel prints them.
    let mut fields = vec![state.to_string(), "1".into(), pgrp.to_string()];
    fields.extend((6..=21).map(|n| n.to_string()));
    fields.push(start.to_string());
    fields.extend(["123456", "789", "18446744073709551615"].map(String::from));
    format!("{pid} ({comm}) {}\n", fields.join(" "))
}

#[test]
fn a_stat_line_gives_pid_state_group_and_start_time() {
    let line = stat_line(4242, "Runner.Listener", 'S', 4242, 987_654);
    assert_eq!(parse_stat(&line).unwrap(), stat(4242, 'S', 4242, 987_654));
}

#[test]
fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
    let line = stat_line(7, "a) (b c) 9 9", 'Z', 3, 55);
    assert_eq!(parse_stat(&line).unwrap(), stat(7, 'Z', 3, 55));
}

#[test]
fn a_real_stat_line_from_the_kernel_parses() {
    let line = std::fs::read_to_string("/proc/self/stat").unwrap();
    let parsed = parse_stat(&line).unwrap();
    assert_eq!(parsed.pid, std::process::id());
    assert!(parsed.start_time > 0);
}

#[test]
fn malformed_stat_lines_are_refused() {
    assert_eq!(parse_stat("42 no comm"), Err(StatParseError::NoComm));
    assert_eq!(
        parse_stat("x (a) S 1 2"),
        Err(StatParseError::Field { field: 1 })
    );
    assert_eq!(
        parse_stat("42 (a) S 1 2 3"),
        Err(StatParseError::Field { field: 22 })
    );
    let bad_start = stat_line(42, "a", 'S', 42, 1).replace(" 1 123456", " x 123456");
    assert_eq!(
        parse_stat(&bad_start),
        Err(StatParseError::Field { field: 22 })
    );
    assert_eq!(
        parse_stat(&stat_line(42, "a", 'S', 42, 1).replacen(" S ", " SS ", 1)),
        Err(StatParseError::Field { field: 3 })
    );
}

#[test]
fn the_start_time_tells_the_runner_from_a_recycled_pid() {
    assert_eq!(leader_state(ME, None), Leader::Absent);
    assert_eq!(
        leader_state(ME, Some(&stat(4242, 'S', 4242, 1000))),
        Leader::Running
    );
    assert_eq!(
        leader_state(ME, Some(&stat(4242, 'Z', 4242, 1000))),
        Leader::Exited
    );
    assert_eq!(
        leader_state(ME, Some(&stat(4242, 'S', 4242, 1001))),
        Leader::Recycled
    );
    assert_eq!(
        leader_state(ME, Some(&stat(4242, 'Z', 4242, 999))),
        Leader::Recycled
    );
    assert_eq!(process_state(Leader::Running), ProcessState::Running);
    assert_eq!(process_state(Leader::Exited), ProcessState::Exited);
    assert_eq!(process_state(Leader::Absent), ProcessState::Gone);
    assert_eq!(process_state(Leader::Recycled), ProcessState::Gone);
}

#[test]
fn only_live_later_processes_of_the_runners_group_are_members() {
    let group = [
        stat(4242, 'S', 4242, 1000), // the leader itself
        stat(4300, 'S', 4242, 1005), // a job's background process
        stat(4301, 'Z', 4242, 1006), // a zombie: dead
        stat(4302, 'S', 4243, 1007), // another group
        stat(4303, 'S', 4242, 999),  // older than the runner: not from it
    ];
    assert_eq!(live_members(ME, &group), 1);
}

#[test]
fn a_stop_terms_then_waits_then_kills_and_never_touches_a_foreign_pid() {
    let fresh = StopProgress::default();
    let waiting = StopProgress {
        terminated: true,
        grace_over: false,
    };
    let overdue = StopProgress {
        terminated: true,
        grace_over: true,
    };
    use StopAction::*;
    use StopSignal::*;
    let cases = [
        (Leader::Running, 0, fresh, Signal(Term)),
        (Leader::Running, 0, waiting, Wait),
        (Leader::Running, 0, overdue, Signal(Kill)),
        (Leader::Exited, 0, fresh, Done),
        (Leader::Absent, 0, fresh, Done),
        (Leader::Exited, 2, fresh, Signal(Term)),
        (Leader::Absent, 1, waiting, Wait),
        (Leader::Absent, 1, overdue, Signal(Kill)),
        (Leader::Recycled, 0, fresh, NotOurs),
        (Leader::Recycled, 3, fresh, NotOurs),
        (Leader::Recycled, 0, overdue, Done),
    ];
    for (leader, members, progress, want) in cases {
        assert_eq!(
            stop_action(ME, leader, members, progress),
            want,
            "{leader:?} members={members} {progress:?}"
        );
    }
    for pid in [0, 1] {
        let init = ProcessIdentity { pid, start_time: 0 };
        assert_eq!(
            stop_action(init, Leader::Running, 0, fresh),
            NotOurs,
            "pid {pid}"
        );
    }
}

#[test]
fn the_runner_environment_is_an_allow_list_plus_its_tmp() {
    let agent: Vec<(OsString, OsString)> = [
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/home/rm"),
        ("LANG", "C.UTF-8"),
        ("https_proxy", "http://proxy:3128"),
        ("RM_WEBHOOK_SECRET", "whsec"),
        ("RM_GITHUB_PRIVATE_KEY", "-----BEGIN"),
        ("RM_RELAY_TOKEN", "relay"),
        ("RM_CONFIG", "/etc/rm-agent.toml"),
        ("GITHUB_TOKEN", "ghp_x"),
        ("AWS_SECRET_ACCESS_KEY", "aws"),
        ("ACTIONS_RUNNER_INPUT_JITCONFIG", "stale"),
        ("TMPDIR", "/tmp"),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    let env = runner_environment(agent, Path::new("/r/0123456789ab"));
    let want: Vec<(OsString, OsString)> = [
        ("HOME", "/home/rm"),
        ("LANG", "C.UTF-8"),
        ("PATH", "/usr/bin:/bin"),
        ("TEMP", "/r/0123456789ab/tmp"),
        ("TMP", "/r/0123456789ab/tmp"),
        ("TMPDIR", "/r/0123456789ab/tmp"),
        ("https_proxy", "http://proxy:3128"),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    assert_eq!(env, want);
}

#[test]
fn a_runner_gets_a_path_even_when_the_agent_has_none() {
    let env = runner_environment(Vec::new(), Path::new("/r/x"));
    assert!(env.contains(&("PATH".into(), DEFAULT_PATH.into())));
}

#[test]
fn no_allow_listed_name_is_an_agent_variable() {
    assert!(
        INHERITED_ENV
            .iter()
            .all(|n| !n.starts_with(AGENT_ENV_PREFIX) && *n != JIT_ENV)
    );
}

/// How the fake runner answers SIGTERM.
#[derive(Clone, Copy, PartialEq)]
enum OnTerm {
    Exit,
    Ignore,
    /// Exits, is reaped, and its pid goes to an unrelated process at once.
    ExitAndRecycle,
}

struct FakeState {
    leader: Option<ProcStat>,
    members: Vec<ProcStat>,
    on_term: OnTerm,
    signals: Vec<StopSignal>,
}

struct Fake(Mutex<FakeState>);

impl Fake {
    fn new(leader: Option<ProcStat>, members: Vec<ProcStat>, on_term: OnTerm) -> Self {
        Self(Mutex::new(FakeState {
            leader,
            members,
            on_term,
            signals: Vec::new(),
        }))
    }

    fn signals(&self) -> Vec<StopSignal> {
        self.0.lock().unwrap().signals.clone()
    }
}

impl Processes for Fake {
    fn stat(&self, pid: u32) -> io::Result<Option<ProcStat>> {
        let s = self.0.lock().unwrap();
        Ok(s.leader.filter(|l| l.pid == pid))
    }

    fn group(&self, pgid: u32) -> io::Result<Vec<ProcStat>> {
        let s = self.0.lock().unwrap();
        Ok(s.leader
            .iter()
            .chain(&s.members)
            .filter(|m| m.pgrp == pgid)
            .copied()
            .collect())
    }

    fn signal_group(&self, pgid: u32, signal: StopSignal) -> io::Result<()> {
        let mut s = self.0.lock().unwrap();
        assert_eq!(pgid, ME.pid, "only the runner's group is signalled");
        if s.leader.is_some_and(|l| l.start_time != ME.start_time) {
            panic!("signalled a recycled pid's group");
        }
        s.signals.push(signal);
        let die = signal == StopSignal::Kill || s.on_term != OnTerm::Ignore;
        if die {
            s.members.clear();
            s.leader = match s.on_term {
                OnTerm::ExitAndRecycle => Some(stat(ME.pid, 'S', 77, ME.start_time + 500)),
                _ => s.leader.map(|l| ProcStat { state: 'Z', ..l }),
            };
        }
        Ok(())
    }
}

/// Short enough for a fast test; the loop's own pace is [`STOP_POLL`].
const GRACE: Duration = Duration::from_millis(120);

fn running() -> Option<ProcStat> {
    Some(stat(ME.pid, 'S', ME.pid, ME.start_time))
}

#[tokio::test]
async fn a_runner_that_obeys_sigterm_gets_no_sigkill() {
    let fake = Fake::new(running(), vec![], OnTerm::Exit);
    let outcome = stop(&fake, ME, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    assert_eq!(fake.signals(), [StopSignal::Term]);
}

#[tokio::test]
async fn a_runner_that_ignores_sigterm_is_killed_after_the_grace() {
    let fake = Fake::new(running(), vec![], OnTerm::Ignore);
    let outcome = stop(&fake, ME, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    assert_eq!(fake.signals(), [StopSignal::Term, StopSignal::Kill]);
}

#[tokio::test]
async fn a_pid_recycled_while_the_stop_waits_is_not_killed() {
    let fake = Fake::new(running(), vec![], OnTerm::ExitAndRecycle);
    let outcome = stop(&fake, ME, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    assert_eq!(
        fake.signals(),
        [StopSignal::Term],
        "no SIGKILL after the pid changed hands"
    );
}

#[tokio::test]
async fn a_recycled_pid_is_never_signalled() {
    let stranger = Some(stat(ME.pid, 'S', ME.pid, ME.start_time + 1));
    let fake = Fake::new(
        stranger,
        vec![stat(5000, 'S', ME.pid, 2000)],
        OnTerm::Ignore,
    );
    assert_eq!(stop(&fake, ME, GRACE).await.unwrap(), StopOutcome::NotOurs);
    assert_eq!(inspect(&fake, ME).unwrap(), ProcessState::Gone);
    assert!(fake.signals().is_empty());
}

#[tokio::test]
async fn the_leftovers_of_an_exited_runner_are_stopped() {
    let zombie = Some(stat(ME.pid, 'Z', ME.pid, ME.start_time));
    let fake = Fake::new(zombie, vec![stat(5000, 'S', ME.pid, 1200)], OnTerm::Ignore);
    assert_eq!(inspect(&fake, ME).unwrap(), ProcessState::Exited);
    let outcome = stop(&fake, ME, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    assert_eq!(fake.signals(), [StopSignal::Term, StopSignal::Kill]);
}

#[tokio::test]
async fn an_exited_runner_with_nothing_left_is_not_signalled() {
    let fake = Fake::new(None, vec![], OnTerm::Exit);
    let outcome = stop(&fake, ME, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: false });
    assert!(fake.signals().is_empty());
}

#[test]
fn an_identity_from_another_boot_names_no_process() {
    assert!(same_boot(Some("a"), Some("a")));
    assert!(!same_boot(Some("a"), Some("b")));
    // Journalled before rm recorded boots, or the kernel does not say: this boot's.
    assert!(same_boot(None, Some("b")));
    assert!(same_boot(Some("a"), None));
    let current = boot_id().expect("Linux names its boot");
    assert_eq!(current.len(), 36, "a UUID: {current}");
}

/// What every runner's start seals, tried by a child the way a job would, with a control: the
/// same child started without [`seal_session`] reaches the descriptor and the key, so the test
/// can fail.
#[test]
#[allow(
    unsafe_code,
    reason = "the test plants a descriptor and a key as an agent's parent would"
)]
fn a_sealed_start_inherits_no_descriptor_session_or_keyring() {
    // At a number no other test's descriptor has: F_DUPFD takes the lowest free one from 946 (a
    // dup2 would close whatever another test thread holds there); the child looks for any
    // descriptor from 940 up (a fresh shell has none so high).
    let file = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: fcntl(F_DUPFD) on a descriptor this test owns.
    let planted =
        unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_DUPFD, 946) };
    assert!(planted >= 946, "{}", io::Error::last_os_error());
    // SAFETY: add_key with NUL-terminated strings and a buffer of the given length, into this
    // process's session keyring (KEY_SPEC_SESSION_KEYRING = -3).
    let key = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            c"rm-process-test-key".as_ptr(),
            c"secret".as_ptr(),
            6usize,
            -3i64,
        )
    };
    assert!(key > 0, "add_key: {}", io::Error::last_os_error());
    let probe = |seal: bool| {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            "ls /proc/self/fd | grep -qE '^(9[4-9][0-9]|[0-9]{4,})$' && echo fd; grep -q rm-process-test-key /proc/keys && echo key; \
             [ \"$(cut -d' ' -f6 /proc/$$/stat)\" = \"$$\" ] && echo leader; true",
        ]);
        if seal {
            seal_session(&mut command);
        }
        // As another uid, as an isolated runner is: the key is root's, so only possessing the
        // keyring shows it.
        // SAFETY: raw set*id calls between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                let nobody = rustix::process::Uid::from_raw(65534);
                rustix::thread::set_thread_res_uid(nobody, nobody, nobody)?;
                Ok(())
            });
        }
        String::from_utf8(command.output().unwrap().stdout).unwrap()
    };
    let open = probe(false);
    let sealed = probe(true);
    // SAFETY: closes the descriptor planted above.
    unsafe { libc::close(planted) };
    assert!(
        open.contains("fd") && open.contains("key"),
        "the control: {open:?}"
    );
    assert!(
        !sealed.contains("fd"),
        "an inherited descriptor reached the runner: {sealed:?}"
    );
    assert!(
        !sealed.contains("key"),
        "the runner possessed the session keyring: {sealed:?}"
    );
    assert!(
        sealed.contains("leader"),
        "not a session of its own: {sealed:?}"
    );
}

/// An executable still open for writing somewhere (a child another thread forked while the
/// runtime was being copied) cannot be executed: the start waits for it instead of failing.
/// The control: a plain spawn meets `ETXTBSY`.
#[test]
fn a_start_waits_out_an_executable_still_open_for_writing() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("prog");
    std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&program)
        .unwrap();
    let busy = Command::new(&program).spawn().map(|mut c| c.wait());
    assert_eq!(
        busy.err().and_then(|e| e.raw_os_error()),
        Some(rustix::io::Errno::TXTBSY.raw_os_error()),
        "the control: exec of a file open for writing"
    );
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(writer);
    });
    let mut command = Command::new(&program);
    let status = spawn_past_busy_text(&mut command).unwrap().wait().unwrap();
    release.join().unwrap();
    assert!(status.success());
}
