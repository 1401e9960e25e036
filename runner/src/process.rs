//! The runner process: starting `<runtime>/bin/Runner.Listener run` the way CONTRACT §5 says
//! (cleared environment rebuilt from an allow-list, the JIT configuration in
//! `ACTIONS_RUNNER_INPUT_JITCONFIG` only, its own process group), telling a live runner from a
//! recycled pid by its start time, and stopping a runner's whole process group.
//!
//! The decisions (reading `/proc/<pid>/stat`, what a process's state is, what a stop does next,
//! which variables a runner gets) are pure functions; the OS calls sit behind [`Processes`], with
//! [`OsProcesses`] the one production adapter (Linux: it reads `/proc`).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

/// The runner's entry point, relative to the runtime directory.
pub const LISTENER: &str = "bin/Runner.Listener";

/// The listener's argv after its path: exactly `run` (the JIT configuration comes from the
/// environment; `--jitconfig` on a command line would show it to every user of the host).
pub(crate) const LISTENER_ARGS: [&str; 1] = ["run"];

/// The one variable the JIT configuration travels in.
pub const JIT_ENV: &str = "ACTIONS_RUNNER_INPUT_JITCONFIG";

/// The temporary-directory variables; all point at `<runtime>/tmp`.
pub const TMP_ENV: [&str; 3] = ["TMPDIR", "TMP", "TEMP"];

/// The agent's own variables (its secrets among them) start with this; none reaches a runner,
/// even if a later edit put one on [`INHERITED_ENV`].
pub(crate) const AGENT_ENV_PREFIX: &str = "RM_";

/// The variables a runner inherits from the agent: where programs are, who and where the user
/// is, the locale, and the proxy settings a runner behind a proxy cannot reach GitHub without.
/// Everything else (tokens, cloud credentials, the agent's configuration) stays behind.
pub const INHERITED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "TZ",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// `PATH` for a runner when the agent has none (a bare service environment).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How often a stop looks at the process group again while it waits for it to exit.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(50);

/// How long a stop waits after the grace (and SIGKILL) before it reports the group as
/// surviving: SIGKILL cannot be ignored, but a process in uninterruptible sleep dies late.
pub(crate) const KILL_SETTLE: Duration = Duration::from_secs(5);

/// How often [`RunnerChild::wait`] checks whether the child has exited.
pub(crate) const WAIT_POLL: Duration = Duration::from_millis(50);

/// Where the kernel shows processes.
const PROC: &str = "/proc";

/// This boot's id: start times count from boot, so a journalled identity is only meaningful
/// within the boot it was recorded in.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The current boot's id, read once; `None` where the kernel does not say.
pub fn boot_id() -> Option<&'static str> {
    static BOOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string(BOOT_ID)
            .ok()
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty())
    })
    .as_deref()
}

/// Whether an identity journalled in boot `journalled` may name a process now. An identity from
/// another boot names nothing (its runner died with that boot) and is never signalled; one
/// journalled without a boot, or when the current boot cannot be read, is taken as this boot's.
pub fn same_boot(journalled: Option<&str>, current: Option<&str>) -> bool {
    match (journalled, current) {
        (Some(then), Some(now)) => then == now,
        _ => true,
    }
}

/// Which process a runner is: its pid and its start time (field 22 of `/proc/<pid>/stat`, clock
/// ticks since boot). A pid alone can be recycled; the pair names one process for the host's
/// uptime, so it is what the journal keeps and what recovery checks before any signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time: u64,
}

/// A journalled runner process's identity, when it was journalled on this boot (a pid of
/// another boot names nothing now). Pure over the boot id read once ([`boot_id`]).
pub fn journalled(
    pid: Option<u32>,
    start_time: Option<u64>,
    boot: Option<&str>,
) -> Option<ProcessIdentity> {
    let (pid, start_time) = (pid?, start_time?);
    same_boot(boot, boot_id()).then_some(ProcessIdentity { pid, start_time })
}

/// What became of a runner process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Alive.
    Running,
    /// Exited, not yet reaped by its parent (the agent, for a runner it started).
    Exited,
    /// No process with this identity exists: reaped, or its pid now belongs to another process.
    Gone,
}

/// The leader of a runner's process group (the runner itself), as the stop sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leader {
    Running,
    /// A zombie with the runner's identity.
    Exited,
    /// No process has the pid.
    Absent,
    /// The pid belongs to another process (its start time differs): never signal it.
    Recycled,
}

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 5: the process group.
    pub pgrp: u32,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

impl ProcStat {
    /// A zombie or a dead task: it runs nothing and cannot be signalled any more.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// A `/proc/<pid>/stat` line the parser cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatParseError {
    #[error("no `(comm)` in the stat line")]
    NoComm,
    #[error("stat field {field} is missing or malformed")]
    Field { field: usize },
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so the fields after it are counted from the *last* `)`.
pub fn parse_stat(line: &str) -> Result<ProcStat, StatParseError> {
    let open = line.find('(').ok_or(StatParseError::NoComm)?;
    let close = line.rfind(')').ok_or(StatParseError::NoComm)?;
    if close < open {
        return Err(StatParseError::NoComm);
    }
    let pid = line[..open]
        .trim()
        .parse()
        .map_err(|_| StatParseError::Field { field: 1 })?;
    // `rest[0]` is field 3.
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    let field = |n: usize| {
        rest.get(n - 3)
            .copied()
            .ok_or(StatParseError::Field { field: n })
    };
    let mut state = field(3)?.chars();
    let (Some(state), None) = (state.next(), state.next()) else {
        return Err(StatParseError::Field { field: 3 });
    };
    let number = |n: usize| {
        field(n)?
            .parse::<u64>()
            .map_err(|_| StatParseError::Field { field: n })
    };
    let pgrp = u32::try_from(number(5)?).map_err(|_| StatParseError::Field { field: 5 })?;
    Ok(ProcStat {
        pid,
        state,
        pgrp,
        start_time: number(22)?,
    })
}

/// What the process with the identity's pid says about the runner.
pub(crate) fn leader_state(identity: ProcessIdentity, stat: Option<&ProcStat>) -> Leader {
    match stat {
        None => Leader::Absent,
        Some(s) if s.pid != identity.pid || s.start_time != identity.start_time => Leader::Recycled,
        Some(s) if s.is_dead() => Leader::Exited,
        Some(_) => Leader::Running,
    }
}

/// [`ProcessState`] of a runner from its leader: an absent or recycled pid is gone.
pub(crate) fn process_state(leader: Leader) -> ProcessState {
    match leader {
        Leader::Running => ProcessState::Running,
        Leader::Exited => ProcessState::Exited,
        Leader::Absent | Leader::Recycled => ProcessState::Gone,
    }
}

/// How many live processes besides the leader are in the runner's process group. A member that
/// started before the runner cannot have come from it and is not counted.
pub(crate) fn live_members(identity: ProcessIdentity, group: &[ProcStat]) -> usize {
    group
        .iter()
        .filter(|s| {
            s.pgrp == identity.pid
                && s.pid != identity.pid
                && !s.is_dead()
                && s.start_time >= identity.start_time
        })
        .count()
}

/// Whether an identity could ever be a runner's: pid 0 and 1 never are, and signalling their
/// "group" would mean the caller's own group or every process the agent may signal.
pub(crate) fn signallable(identity: ProcessIdentity) -> bool {
    identity.pid > 1 && i32::try_from(identity.pid).is_ok()
}

/// A signal a stop sends to the runner's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Term,
    Kill,
}

/// Where a stop is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StopProgress {
    /// SIGTERM has been sent to the group.
    pub terminated: bool,
    /// The grace after SIGTERM is over.
    pub grace_over: bool,
}

/// What a stop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopAction {
    /// Nothing of the runner is alive.
    Done,
    /// The identity names another process: leave it alone.
    NotOurs,
    Signal(StopSignal),
    Wait,
}

/// The stop's next step from a fresh observation. A pid that belongs to another process is never
/// signalled. While any process is still in the runner's group, the kernel keeps the group's id
/// (the runner's pid) from being reused, so a recycled leader pid also means the group is empty:
/// before the first signal that makes the stop none of our business, after it the stop is done.
pub(crate) fn stop_action(
    identity: ProcessIdentity,
    leader: Leader,
    members: usize,
    progress: StopProgress,
) -> StopAction {
    if !signallable(identity) {
        return StopAction::NotOurs;
    }
    if leader == Leader::Recycled {
        return if progress.terminated {
            StopAction::Done
        } else {
            StopAction::NotOurs
        };
    }
    if leader != Leader::Running && members == 0 {
        return StopAction::Done;
    }
    if !progress.terminated {
        StopAction::Signal(StopSignal::Term)
    } else if progress.grace_over {
        StopAction::Signal(StopSignal::Kill)
    } else {
        StopAction::Wait
    }
}

/// The environment of a runner, without the JIT configuration (added at spawn, so this list
/// can be shown or logged): the allow-listed variables of `agent_env` (never one starting with
/// `RM_`), a default `PATH` if the agent has none, and `TMPDIR`/`TMP`/`TEMP` = `<runtime>/tmp`.
/// Sorted by name.
pub fn runner_environment(
    agent_env: impl IntoIterator<Item = (OsString, OsString)>,
    runtime: &Path,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = agent_env
        .into_iter()
        .filter(|(key, _)| inherited(key))
        .collect();
    if !env.iter().any(|(key, _)| key == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    let tmp = runtime.join(crate::workspace::TMP_DIR);
    env.retain(|(key, _)| !TMP_ENV.iter().any(|t| key == t));
    env.extend(
        TMP_ENV
            .iter()
            .map(|t| (OsString::from(t), tmp.clone().into())),
    );
    env.sort();
    env.dedup_by(|a, b| a.0 == b.0);
    env
}

fn inherited(key: &OsStr) -> bool {
    !key.as_bytes().starts_with(AGENT_ENV_PREFIX.as_bytes())
        && INHERITED_ENV.iter().any(|name| key == *name)
}

/// Errors of the runner process adapters. None carries the JIT configuration.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start the runner {listener}: {source}")]
    Spawn {
        listener: PathBuf,
        source: io::Error,
    },
    #[error(
        "the runner started as pid {pid} but its start time cannot be read ({source}); it was killed"
    )]
    Identity { pid: u32, source: io::Error },
    #[error("cannot look at process {pid}: {source}")]
    Observe { pid: u32, source: io::Error },
    #[error("cannot signal the process group of runner {pid}: {source}")]
    Signal { pid: u32, source: io::Error },
    #[error("runner {pid} or a process of its group is still alive after SIGKILL")]
    Survived { pid: u32 },
}

/// A started runner: who it is, and the handle of the child process.
#[derive(Debug)]
pub struct Spawned<C> {
    pub identity: ProcessIdentity,
    pub child: C,
}

/// How a stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// Nothing of the runner is alive any more; `signalled` says whether it took a signal.
    Stopped { signalled: bool },
    /// The identity names a process that is not the runner: nothing was signalled.
    NotOurs,
}

/// The process table a runner is looked at and signalled through: what [`observe`],
/// [`inspect`] and [`stop`] read and act on. [`OsProcesses`] is the host's (`/proc`, `kill(2)`);
/// every [`crate::backend::Backend`] is one, so the executor sees and stops an attempt's runner
/// through the attempt's backend, its one seam (a test fakes the backend and thereby this).
pub trait Processes {
    /// `/proc/<pid>/stat`, or `None` if there is no such process.
    fn stat(&self, pid: u32) -> io::Result<Option<ProcStat>>;
    /// Every process whose process group is `pgid`.
    fn group(&self, pgid: u32) -> io::Result<Vec<ProcStat>>;
    /// Sends `signal` to the process group `pgid`; an empty group is not an error.
    fn signal_group(&self, pgid: u32, signal: StopSignal) -> io::Result<()>;
}

/// The runner's leader state and the number of other live processes in its group.
pub fn observe<P: Processes + ?Sized>(
    processes: &P,
    identity: ProcessIdentity,
) -> Result<(Leader, usize), ProcessError> {
    let fail = |source| ProcessError::Observe {
        pid: identity.pid,
        source,
    };
    let leader = leader_state(
        identity,
        processes.stat(identity.pid).map_err(fail)?.as_ref(),
    );
    let members = live_members(identity, &processes.group(identity.pid).map_err(fail)?);
    Ok((leader, members))
}

/// Whether the runner with this identity is running, has exited (not yet reaped) or is gone.
/// For a runner the agent started and still holds, [`RunnerChild::try_wait`] is the better
/// witness: once reaped, its pid says nothing.
pub fn inspect<P: Processes + ?Sized>(
    processes: &P,
    identity: ProcessIdentity,
) -> Result<ProcessState, ProcessError> {
    if !signallable(identity) {
        return Ok(ProcessState::Gone);
    }
    let stat = processes
        .stat(identity.pid)
        .map_err(|source| ProcessError::Observe {
            pid: identity.pid,
            source,
        })?;
    Ok(process_state(leader_state(identity, stat.as_ref())))
}

/// Stops a runner and everything in its process group: SIGTERM to the group, up to `grace` for
/// it to exit, then SIGKILL to the group. The identity is checked again before every signal, so
/// a pid that now belongs to another process is never signalled. A runner that already exited
/// still has its leftover group members (a job's background process) stopped the same way.
pub async fn stop<P: Processes + ?Sized>(
    processes: &P,
    identity: ProcessIdentity,
    grace: Duration,
) -> Result<StopOutcome, ProcessError> {
    let started = tokio::time::Instant::now();
    let mut progress = StopProgress::default();
    loop {
        let (leader, members) = observe(processes, identity)?;
        let elapsed = started.elapsed();
        progress.grace_over = elapsed >= grace;
        match stop_action(identity, leader, members, progress) {
            StopAction::Done => {
                return Ok(StopOutcome::Stopped {
                    signalled: progress.terminated,
                });
            }
            StopAction::NotOurs => return Ok(StopOutcome::NotOurs),
            StopAction::Wait => {}
            StopAction::Signal(signal) => {
                tracing::debug!(
                    pid = identity.pid,
                    ?signal,
                    "signalling a runner's process group"
                );
                processes
                    .signal_group(identity.pid, signal)
                    .map_err(|source| ProcessError::Signal {
                        pid: identity.pid,
                        source,
                    })?;
                progress.terminated = true;
            }
        }
        if elapsed >= grace + KILL_SETTLE {
            return Err(ProcessError::Survived { pid: identity.pid });
        }
        tokio::time::sleep(STOP_POLL).await;
    }
}

/// What a runner's handle reaps: the child process in production ([`Child`]); a test's process
/// table gives its own (the executor's harness), so the executor never needs a real process to
/// learn that its runner exited.
pub trait Reap: Send + std::fmt::Debug {
    /// The exit status if the process has exited (reaping it), else `None`.
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>>;
}

impl Reap for Child {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        Child::try_wait(self)
    }
}

/// A runner the agent started: the handle to reap it with. Dropped unreaped, the runner stays a
/// zombie until the agent exits; its [`ProcessIdentity`] still tells recovery what it was.
#[derive(Debug)]
pub struct RunnerChild {
    child: Box<dyn Reap>,
}

impl RunnerChild {
    /// The handle of a started runner that `child` reaps.
    pub fn new(child: impl Reap + 'static) -> Self {
        RunnerChild {
            child: Box::new(child),
        }
    }

    /// The exit status if the runner has exited (reaping it), else `None`.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits for the runner to exit and reaps it. Polls, so it does not hold a thread.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }
}

/// The host's [`Processes`]: `/proc` to look, `kill(2)` on the process group to signal; and
/// `std::process` to start a runner as the agent's own user ([`OsProcesses::spawn`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsProcesses;

impl OsProcesses {
    /// Starts `<runtime>/bin/Runner.Listener run` per CONTRACT §5 in its own process group,
    /// with the environment [`runner_environment`] builds and nothing between fork and exec.
    pub fn spawn(
        self,
        runtime: &Path,
        jit: &SecretString,
    ) -> Result<Spawned<RunnerChild>, ProcessError> {
        spawn_listener(
            runtime,
            jit,
            runner_environment(std::env::vars_os(), runtime),
            |_| {},
        )
    }
}

impl Processes for OsProcesses {
    fn stat(&self, pid: u32) -> io::Result<Option<ProcStat>> {
        read_stat(pid)
    }

    fn group(&self, pgid: u32) -> io::Result<Vec<ProcStat>> {
        let mut members = Vec::new();
        for entry in std::fs::read_dir(PROC)? {
            let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // A process that exits while the table is read is simply not a member any more.
            if let Ok(Some(stat)) = read_stat(pid)
                && stat.pgrp == pgid
            {
                members.push(stat);
            }
        }
        Ok(members)
    }

    fn signal_group(&self, pgid: u32, signal: StopSignal) -> io::Result<()> {
        let raw = i32::try_from(pgid).map_err(|_| refused("not a process group id"))?;
        let group = rustix::process::Pid::from_raw(raw)
            .filter(|p| p.as_raw_nonzero().get() > 1)
            .ok_or_else(|| refused("process group 0 and 1 are never signalled"))?;
        if rustix::process::getpgid(None).ok() == Some(group) {
            return Err(refused("the agent's own process group is never signalled"));
        }
        let signal = match signal {
            StopSignal::Term => rustix::process::Signal::TERM,
            StopSignal::Kill => rustix::process::Signal::KILL,
        };
        match rustix::process::kill_process_group(group, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Starts `<runtime>/bin/Runner.Listener run` per CONTRACT §5 with exactly `env` (plus the JIT
/// configuration) in its own process group, `configure` adding what a backend needs (the
/// isolation steps between fork and exec), and reads its identity. A runner that cannot be
/// identified is killed: it could never be stopped safely later.
pub(crate) fn spawn_listener(
    runtime: &Path,
    jit: &SecretString,
    env: Vec<(OsString, OsString)>,
    configure: impl FnOnce(&mut Command),
) -> Result<Spawned<RunnerChild>, ProcessError> {
    let listener = runtime.join(LISTENER);
    let mut command = Command::new(&listener);
    command
        .args(LISTENER_ARGS)
        .current_dir(runtime)
        .env_clear()
        .envs(env)
        .env(JIT_ENV, jit.expose_secret())
        // The runner keeps its own logs in `_diag`; its output never reaches the agent's
        // log, where a job could otherwise write anything. A backend's `configure` points
        // stdout and stderr at a file in the runtime instead (`crate::logs::capture_output`).
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // A session and group of its own: a stop reaches everything the job started, a signal
    // sent to the agent's group (Ctrl-C in a terminal) does not reach the runner, and the
    // runner has no controlling terminal to push input into (`TIOCSTI`).
    seal_session(&mut command);
    configure(&mut command);
    // `command` holds the JIT configuration: never format it (its Debug shows the env).
    let mut child = spawn_past_busy_text(&mut command)
        .map_err(|source| ProcessError::Spawn { listener, source })?;
    let pid = child.id();
    tracing::debug!(pid, runtime = %runtime.display(), "runner started");
    // Until reaped, even a runner that exited at once keeps its /proc entry, so this read
    // names the process we started.
    match read_stat(pid) {
        Ok(Some(stat)) => Ok(Spawned {
            identity: ProcessIdentity {
                pid,
                start_time: stat.start_time,
            },
            child: RunnerChild::new(child),
        }),
        other => {
            let source = match other {
                Err(e) => e,
                Ok(_) => io::Error::new(io::ErrorKind::NotFound, "no /proc entry"),
            };
            let _ = OsProcesses.signal_group(pid, StopSignal::Kill);
            let _ = child.kill();
            let _ = child.wait();
            Err(ProcessError::Identity { pid, source })
        }
    }
}

/// How often a start that met `ETXTBSY` is tried again, and how long apart. The agent writes
/// executables (a runtime's copy of the package, under `isolation = "none"`) while its other
/// threads fork (other launches, a runner's Docker, the tools it runs); a child forked while one
/// was open for writing holds that descriptor until it execs, moments later, and an `exec` of
/// the file meanwhile fails with "text file busy". Without the retry the launch fails and its
/// policy backs off.
const TEXT_BUSY_TRIES: u32 = 50;
const TEXT_BUSY_PAUSE: Duration = Duration::from_millis(10);

/// `command.spawn()`, tried again while the executable is busy being written
/// ([`TEXT_BUSY_TRIES`]). Blocking: called where a runner starts, off the async workers.
fn spawn_past_busy_text(command: &mut Command) -> io::Result<Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
                    && tries < TEXT_BUSY_TRIES =>
            {
                tries += 1;
                std::thread::sleep(TEXT_BUSY_PAUSE);
            }
            spawned => return spawned,
        }
    }
}

/// Before any backend's own steps, in every isolation mode: a new session (the runner's pid is
/// its session and process group id, and it has no controlling terminal: `/dev/tty` answers
/// `ENXIO`), and every descriptor above stderr closed at `exec`, so nothing the agent inherited
/// from whatever started it (a shell's redirections, a supervisor's sockets) reaches a job; and a
/// session keyring of its own.
/// Close-on-exec rather than closed now: std's own error pipe and a backend's prepared
/// descriptors are still used until then.
#[allow(unsafe_code)]
pub(crate) fn seal_session(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before `exec` and makes raw system calls on
    // integers (`setsid`, `close_range`, `keyctl`): async-signal-safe, no allocation, no lock.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, || {
            rustix::process::setsid()?;
            let marked = libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if marked < 0 {
                return Err(io::Error::last_os_error());
            }
            // KEYCTL_JOIN_SESSION_KEYRING with no name: a new, empty session keyring, so the
            // runner does not possess the agent's (nor the keys whoever started it put there).
            // A kernel without keyrings (ENOSYS) has nothing to share.
            let joined = libc::syscall(libc::SYS_keyctl, 1, std::ptr::null::<libc::c_char>());
            if joined < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOSYS) {
                    return Err(e);
                }
            }
            Ok(())
        });
    }
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why.to_owned())
}

/// Reads and parses `/proc/<pid>/stat`; `None` if the process does not exist.
pub(crate) fn read_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    match std::fs::read_to_string(Path::new(PROC).join(pid.to_string()).join("stat")) {
        Ok(line) => parse_stat(&line)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        // ESRCH: the process went away between opening and reading.
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
