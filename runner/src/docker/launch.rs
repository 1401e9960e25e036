//! Starting one runner's rootless Docker daemon ([`start`]): `dockerd-rootless.sh` (rootlesskit,
//! slirp4netns, dockerd, containerd) as the runner's uid, with everything it keeps under
//! `<runtime>/docker/` ([`Layout`]), in the runner's cgroup and, when given, its network
//! namespace, and a mount namespace of its own prepared so that the daemon works for a pool uid
//! that is a bare number:
//!
//! - `/run` is a private tmpfs whose `docker.sock` is a link to the runner's socket. The runner
//!   bind-mounts `/var/run/docker.sock` into `container:` jobs and Docker actions, and the daemon
//!   resolves that path in its own mount namespace: the job's containers reach the job's own
//!   daemon, never a host daemon's socket (which the tmpfs hides).
//! - `/etc/passwd` and `/etc/group` are the host's plus an entry for the runner's uid and gid:
//!   `newuidmap` refuses a uid without a name ("Cannot determine your user name").
//! - `/dev/net/tun` is a node of the daemon's own, mode 0666: slirp4netns and rootlesskit open
//!   it as the runner's uid, and the host's may be 0600 (no udev). Opening it lets a process
//!   make tun devices only in network namespaces it administers (its own user namespace's).
//!   Making the node needs `CAP_MKNOD`; without it the host's node is used as it is.
//! - `/etc/resolv.conf` is the one given (or the host's), written into the tmpfs: slirp4netns
//!   forwards the containers' DNS to what it names.
//! - `/tmp`, `/var/tmp` and `/dev/shm` are empty tmpfs of its own ([`PRIVATE_DIRS`]), and
//!   rootlesskit gives the tree a PID and an IPC namespace of its own ([`rootlesskit_flags`]):
//!   through the daemon (`-v /proc:/p`, `-v /tmp:/t`, `--pid=host`, `--ipc=host`) a job reaches
//!   no more of the host than the runner's own namespaces let it.
//!
//! The tree is sealed as the runner is, by the same steps: `process::seal_session` (a session of
//! its own, every descriptor above stderr closed at exec, a new session keyring), then, as the
//! runner's uid, a session keyring of its own (`isolate::join_own_session_keyring`) and the
//! runner's `RLIMIT_NPROC` (`isolate::limit_processes`), which since Linux 5.14 bounds the
//! containers too: a user namespace charges its processes to its creator's uid and enforces the
//! creator's limit there, whatever subordinate uid a container runs as. It also gets a UTS
//! namespace with the runner's host name and a cgroup namespace rooted at the runner's cgroup
//! (with that cgroup v2 view mounted), so neither `docker info` nor a `--uts=host` or
//! `--cgroupns=host` container names the host or its cgroup tree.
//!
//! The tree runs **without** `no_new_privs`: rootlesskit needs the setuid `newuidmap` and
//! `newgidmap` to map its subordinate ids, and under `no_new_privs` the kernel ignores the
//! setuid bit. The runner itself keeps `no_new_privs`. rootlesskit takes the ranges from
//! `/etc/subuid` and `/etc/subgid` with `--subid-source=static`: 1.1's default (`auto`, through
//! `getsubids`) finds a numeric entry twice and fails writing `uid_map` (`EINVAL`).
//!
//! The child-side steps run after `fork` in a multi-threaded agent: every path and every byte
//! they write is prepared before the fork, and the steps are raw system calls through rustix (no
//! allocation, no lock), as in `isolate::ChildSetup`.

use std::ffi::{CString, OsString};
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::fs::{FileType, Mode, OFlags};

use super::host::{self as tools, DAEMON_PATH, Tools};
use super::mirror::{DaemonMirror, mirror_flags};
use crate::isolate::{Account, mkdir_here, write_new};

/// How long [`start`] waits for the daemon to answer `/_ping`. Measured here: 0.4-0.65 s warm,
/// 2.1 s for the first start after boot (cold caches), about 1 s in a runner's network
/// namespace under load; the bound leaves room for a loaded host without hiding a daemon that
/// will never come.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often [`start`] asks while it waits: a few percent of the usual start time.
pub(crate) const READY_POLL: Duration = Duration::from_millis(25);

/// The most one `/_ping` may take (connect, request, answer) before it counts as "not yet".
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The most one image load may wait on the daemon between two reads or writes (a 100 MB image
/// loads in about 1.3 s here; the daemon unpacks as it reads).
pub(crate) const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// The most of an `/images/load` answer read (a line per image and layer).
const MAX_LOAD_ANSWER: u64 = 1 << 20;

/// The longest path a unix socket may have (`sockaddr_un.sun_path` is 108 bytes with its NUL).
/// The daemon's socket and containerd's, under the exec root, must fit.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// The deepest socket the daemon makes below its exec root (containerd's).
const DEEPEST_SOCKET: &str = "containerd/containerd.sock";

/// How much of the daemon's log an error quotes.
const LOG_TAIL_LINES: usize = 15;

/// Bytes of the daemon's log read for [`LOG_TAIL_LINES`].
const LOG_TAIL_BYTES: u64 = 8192;

/// The directory of the runtime the daemon's tree lives in.
pub(crate) const DOCKER_DIR: &str = "docker";

/// The size of the daemon's private `/run` (a few links and small files).
const RUN_TMPFS_OPTIONS: &std::ffi::CStr = c"mode=755,size=1m";

/// The shared writable places the daemon gets an empty tmpfs of its own on, as the runner does
/// (`isolate::PRIVATE_DIRS`; `/run/lock` is inside the daemon's private `/run` already):
/// otherwise a job could reach the host's through a bind mount (`docker run -v /tmp:/t`) and
/// leave files there for later jobs.
pub(crate) const PRIVATE_DIRS: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

/// Their tmpfs options: sticky and world-writable like the real ones, and small (dockerd keeps
/// its temporary files in the data root; these only hold what a job binds and writes).
const PRIVATE_TMPFS_OPTIONS: &std::ffi::CStr = c"mode=1777,size=64m";

/// `/dev/net/tun`'s device number (Documentation/admin-guide/devices.txt: misc 200).
const TUN_MAJOR: u32 = 10;
const TUN_MINOR: u32 = 200;

/// Where the daemon's own files go inside its private `/run`.
const RUN_RM: &std::ffi::CStr = c"/run/rm";
const RUN_PASSWD: &std::ffi::CStr = c"/run/rm/passwd";
const RUN_GROUP: &std::ffi::CStr = c"/run/rm/group";
const RUN_RESOLV: &std::ffi::CStr = c"/run/rm/resolv.conf";
const RUN_TUN: &std::ffi::CStr = c"/run/rm/tun";
const RUN_SOCKET_LINK: &std::ffi::CStr = c"/run/docker.sock";

/// Where everything of one runner's daemon lives, under `<runtime>/docker/`. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub root: PathBuf,
    /// `--data-root`: images, containers, volumes, build cache.
    pub data: PathBuf,
    /// `--exec-root`: containerd's state and sockets.
    pub exec: PathBuf,
    /// `XDG_RUNTIME_DIR`: the socket, the pid file, rootlesskit's state.
    pub run: PathBuf,
    /// The daemon's `HOME` (its `~/.config/docker/daemon.json`, if a job writes one, is read by
    /// the next daemon only if the runtime is reused, which it is not).
    pub home: PathBuf,
    /// `DOCKER_HOST=unix://<socket>` for the runner.
    pub socket: PathBuf,
    pub pidfile: PathBuf,
    /// rootlesskit's `--state-dir` (its API socket and the child's pid).
    pub rootlesskit: PathBuf,
    /// The daemon tree's stdout and stderr (root's, mode 0600).
    pub log: PathBuf,
}

impl Layout {
    pub fn of(runtime: &Path) -> Layout {
        let root = runtime.join(DOCKER_DIR);
        let run = root.join("run");
        Layout {
            data: root.join("data"),
            exec: root.join("exec"),
            home: root.join("home"),
            socket: run.join("docker.sock"),
            pidfile: run.join("docker.pid"),
            rootlesskit: run.join("rootlesskit"),
            log: root.join("dockerd.log"),
            run,
            root,
        }
    }

    /// Refuses a runtime so deep that a socket's path would not fit a `sockaddr_un` (part of
    /// [`check_runtime`]).
    fn check_socket_paths(&self) -> Result<(), DockerError> {
        for path in [self.socket.clone(), self.exec.join(DEEPEST_SOCKET)] {
            if path.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(DockerError::PathTooLong { path });
            }
        }
        Ok(())
    }

    /// `DOCKER_HOST` for the runner and the jobs' `docker` CLI.
    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

/// The daemon's `/run`: an empty tmpfs in its mount namespace, as [`PRIVATE_DIRS`] are.
const DAEMON_RUN: &str = "/run";

/// Whether a runner's daemon can keep its tree in `runtime`, the one rule for it: not below a
/// directory the daemon's mount namespace gets an empty tmpfs on (its `/run` and
/// [`PRIVATE_DIRS`]: the daemon would find its data root, exec root and socket directory
/// hidden), and no socket path of its [`Layout`] longer than a `sockaddr_un` holds
/// ([`MAX_SOCKET_PATH`]). Pure: `runtime` as the runner root resolved it (canonical, so a link
/// such as `/var/run` is already `/run`). Judged at each launch ([`start`]) and, for the deepest
/// runtime a policy's runners can get, when `run` starts ([`check_runner_root`]).
pub fn check_runtime(runtime: &Path) -> Result<(), DockerError> {
    for dir in std::iter::once(DAEMON_RUN).chain(PRIVATE_DIRS) {
        if runtime.starts_with(dir) {
            return Err(DockerError::UnderPrivateDir {
                runtime: runtime.to_owned(),
                dir,
            });
        }
    }
    Layout::of(runtime).check_socket_paths()
}

/// The directories [`check_runtime`] keeps runtimes out of, as a message names them
/// (`/run, /tmp, ...`).
pub fn daemon_tmpfs_dirs() -> String {
    let dirs: Vec<&str> = std::iter::once(DAEMON_RUN).chain(PRIVATE_DIRS).collect();
    dirs.join(", ")
}

/// [`check_runtime`] for the deepest runtime a `docker = true` policy's runners can get under
/// the runner root `root` (canonical): `<root>/<12 hex>` for ephemeral runtimes, or, with
/// `persistent_slots = Some((policy, max_runners))`, its highest slot `<root>/<policy>/s<N>`
/// (slots are reused lowest first, so `N` stays below `max_runners`). Pure: what `run` refuses
/// at start instead of failing every launch.
pub fn check_runner_root(
    root: &Path,
    persistent_slots: Option<(&str, u32)>,
) -> Result<(), DockerError> {
    let deepest = match persistent_slots {
        None => root.join("f".repeat(crate::workspace::WORKSPACE_NAME_LEN)),
        Some((policy, max_runners)) => {
            crate::slot::slot_dir(root, policy, max_runners.saturating_sub(1))
        }
    };
    check_runtime(&deepest)
}

/// The rootlesskit flags the launcher adds (`DOCKERD_ROOTLESS_ROOTLESSKIT_FLAGS`). Pure.
///
/// - `--subid-source=static`: rootlesskit 1.1's default (`auto`, through `getsubids`) finds a
///   numeric `/etc/subuid` line twice and fails writing `uid_map` (`EINVAL`).
/// - `--pidns`: the tree gets a PID namespace (and a `/proc`) of its own. Without it the
///   daemon's `/proc` is the host's, and a container given `-v /proc:/p` lists every process
///   of the host, which the runner's own PID namespace hides from the job.
/// - `--ipcns`: an IPC namespace of its own, so `--ipc=host` is the tree's, never the host's.
pub(crate) fn rootlesskit_flags(layout: &Layout) -> String {
    format!(
        "--subid-source=static --pidns --ipcns --state-dir={}",
        layout.rootlesskit.display()
    )
}

/// `dockerd`'s arguments (after `dockerd-rootless.sh`), the registry mirror's among them when
/// one is set, and the containers' default `nproc` ulimit at `pids_max` (the tree's own
/// `RLIMIT_NPROC` bounds them already; this makes each container's limit say so, and `docker
/// run --ulimit` cannot raise it past the tree's hard limit). Pure.
pub(crate) fn dockerd_args(
    layout: &Layout,
    mirror: Option<&DaemonMirror>,
    pids_max: Option<u32>,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut flag = |name: &str, value: OsString| {
        args.push(name.into());
        args.push(value);
    };
    flag("--data-root", layout.data.clone().into_os_string());
    flag("--exec-root", layout.exec.clone().into_os_string());
    flag("--host", layout.docker_host().into());
    flag("--pidfile", layout.pidfile.clone().into_os_string());
    if let Some(max) = pids_max {
        flag("--default-ulimit", format!("nproc={max}:{max}").into());
    }
    if let Some(mirror) = mirror {
        args.extend(mirror_flags(mirror).into_iter().map(OsString::from));
    }
    args
}

/// The host's `/etc/passwd` text plus a line for `account` if no line has its uid, so that
/// `newuidmap` finds a name for it. The name is `rm<uid>`; the home is the daemon's. Pure.
pub(crate) fn passwd_with(host: &str, account: Account, home: &Path) -> String {
    let has = host
        .lines()
        .any(|l| l.split(':').nth(2) == Some(account.uid.to_string().as_str()));
    let mut text = with_newline(host);
    if !has {
        text.push_str(&format!(
            "rm{uid}:x:{uid}:{gid}:rm runner:{home}:/usr/sbin/nologin\n",
            uid = account.uid,
            gid = account.gid,
            home = home.display()
        ));
    }
    text
}

/// The host's `/etc/group` text plus a line for `account`'s gid if none has it. Pure.
pub(crate) fn group_with(host: &str, account: Account) -> String {
    let has = host
        .lines()
        .any(|l| l.split(':').nth(2) == Some(account.gid.to_string().as_str()));
    let mut text = with_newline(host);
    if !has {
        text.push_str(&format!("rm{gid}:x:{gid}:\n", gid = account.gid));
    }
    text
}

fn with_newline(text: &str) -> String {
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// What one runner's daemon is started with.
#[derive(Debug)]
pub struct DaemonSpec {
    pub account: Account,
    /// The runner's host name (its UTS namespace's): the daemon's tree gets a UTS namespace of
    /// its own with the same name, never the host's.
    pub hostname: String,
    /// The runner's `pids_max`: the tree's `RLIMIT_NPROC` (which, shared with the runner's own
    /// processes through the uid, bounds runner, daemon and containers together) and the
    /// containers' default `nproc` ulimit. `None`: the policy opted out (`"none"`).
    pub pids_max: Option<u32>,
    /// `host.runner_run_keep`: what of the host's `/run` the daemon's private `/run` keeps, as
    /// the runner's does (a kept socket a container binds from `/run` is the host's).
    pub run_keep: Vec<PathBuf>,
    /// The runner's runtime: the daemon's tree goes in `<runtime>/docker/`, which must not exist.
    pub runtime: PathBuf,
    /// The runner cgroup's `cgroup.procs`, opened by the agent (close-on-exec): the daemon
    /// writes itself in before it runs anything, so the cgroup's kill takes every process of
    /// the tree, those running under subordinate uids included.
    pub cgroup_procs: OwnedFd,
    /// The runner's network namespace (an fd of `/run/netns/<name>` or `/proc/<pid>/ns/net`),
    /// joined before anything else: slirp4netns then opens its sockets there, and published
    /// ports listen there only. `None`: the host's network, where rootlesskit publishes `-p`
    /// ports on every host address.
    pub netns: Option<OwnedFd>,
    /// The daemon's `/etc/resolv.conf` (the one the runner gets); `None`: the host's.
    pub resolv_conf: Option<Vec<u8>>,
    /// Variables added to the daemon's environment (a proxy for pulls, say); never a secret of
    /// the agent's: the daemon is the runner's uid, and the runner can read its environment.
    pub env: Vec<(OsString, OsString)>,
    /// The pull-through registry mirror as the daemon must address it
    /// ([`super::mirror::daemon_mirror`]); `None`: pulls go to the registries themselves.
    pub registry_mirror: Option<DaemonMirror>,
}

/// A daemon that answered `/_ping`.
#[derive(Debug)]
pub struct Daemon {
    /// The process started (rootlesskit, exec'd by `dockerd-rootless.sh`): the top of the
    /// tree, its session leader. Reap it with `wait`; stop the tree by killing the cgroup.
    pub child: Child,
    pub layout: Layout,
    /// How long the daemon took to answer.
    pub ready_after: Duration,
    /// Of that, how long sizing rootlesskit's copies took once the daemon answered.
    pub copies_bounded_in: Duration,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn socket(&self) -> &Path {
        &self.layout.socket
    }

    /// `unix://<socket>`, for the runner's `DOCKER_HOST`.
    pub fn docker_host(&self) -> String {
        self.layout.docker_host()
    }
}

/// Why a runner's daemon could not start. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("{tool} not found{where_}: install {package}")]
    Missing {
        tool: &'static str,
        package: &'static str,
        where_: String,
    },
    #[error(
        "{tool} is not setuid root: rootless Docker cannot map its subordinate ids; reinstall {package}"
    )]
    NotSetuid {
        tool: &'static str,
        package: &'static str,
    },
    #[error("/dev/net/tun is missing or not the tun device: load the tun module (`modprobe tun`)")]
    NoTun,
    #[error(
        "the agent runs with no_new_privs: the daemon needs the setuid newuidmap; remove NoNewPrivileges= from the agent's unit"
    )]
    NoNewPrivs,
    #[error(
        "the socket path {path} is longer than {MAX_SOCKET_PATH} bytes; choose a shorter host.runner_root"
    )]
    PathTooLong { path: PathBuf },
    #[error(
        "the runtime {runtime} lies under {dir}, which the daemon gets an empty tmpfs on; choose a host.runner_root outside {hidden}",
        hidden = daemon_tmpfs_dirs()
    )]
    UnderPrivateDir { runtime: PathBuf, dir: &'static str },
    #[error("{path} already exists: a daemon's directory is made fresh for each runner")]
    Exists { path: PathBuf },
    #[error("cannot prepare {path}: {source}")]
    Prepare { path: PathBuf, source: io::Error },
    #[error(
        "cannot bound the daemon's /etc and /run copies (rootlesskit's copy-up tmpfs), so it is not used: {source}; its log is {log}"
    )]
    CopyUp { log: PathBuf, source: io::Error },
    #[error("cannot start {script}: {source}")]
    Spawn { script: PathBuf, source: io::Error },
    #[error("the daemon exited ({status}) before it answered; its log {log} ends with:\n{tail}")]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error(
        "the daemon did not answer {socket} within {waited:?}; its log {log} ends with:\n{tail}"
    )]
    NotReady {
        socket: PathBuf,
        waited: Duration,
        log: PathBuf,
        tail: String,
    },
}

/// Starts the runner's daemon and waits until it answers (at most [`READY_TIMEOUT`]).
///
/// On an error after the spawn, the process started is killed and reaped; what it started in
/// turn is in the cgroup, which the caller kills as for any runner.
pub fn start(spec: DaemonSpec, tools: &Tools) -> Result<Daemon, DockerError> {
    start_within(spec, tools, READY_TIMEOUT)
}

/// [`start`] with another bound (tests).
pub(crate) fn start_within(
    spec: DaemonSpec,
    tools: &Tools,
    timeout: Duration,
) -> Result<Daemon, DockerError> {
    if tools::agent_has_no_new_privs() {
        return Err(DockerError::NoNewPrivs);
    }
    check_runtime(&spec.runtime)?;
    let layout = Layout::of(&spec.runtime);
    let log = prepare(&layout, spec.account)?;
    let setup = DaemonChild::new(&spec, &layout)?;
    let mut command = Command::new(&tools.rootless_script);
    command
        .args(dockerd_args(
            &layout,
            spec.registry_mirror.as_ref(),
            spec.pids_max,
        ))
        .env_clear()
        .env("PATH", DAEMON_PATH)
        .env("HOME", &layout.home)
        .env("XDG_RUNTIME_DIR", &layout.run)
        .env(
            "DOCKERD_ROOTLESS_ROOTLESSKIT_FLAGS",
            rootlesskit_flags(&layout),
        )
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log_stdio(&log, &layout)?)
        .stderr(log_stdio(&log, &layout)?);
    install_steps(&mut command, setup);
    let started = Instant::now();
    let mut child = command.spawn().map_err(|source| DockerError::Spawn {
        script: tools.rootless_script.clone(),
        source,
    })?;
    // The spec's descriptors (cgroup, netns) were for the child; the parent lets them go.
    drop(spec);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(DockerError::Exited {
                    status,
                    log: layout.log.clone(),
                    tail: log_tail(&layout.log),
                });
            }
            Ok(None) => {}
            Err(source) => {
                give_up(&mut child);
                return Err(DockerError::Spawn {
                    script: tools.rootless_script.clone(),
                    source,
                });
            }
        }
        if ping(&layout.socket) {
            let answered = started.elapsed();
            // Before any job can write them: rootlesskit's `/etc` and `/run` copies, sized.
            if let Err(source) = super::copy_up::bound(&layout.rootlesskit) {
                give_up(&mut child);
                return Err(DockerError::CopyUp {
                    log: layout.log.clone(),
                    source,
                });
            }
            return Ok(Daemon {
                child,
                copies_bounded_in: started.elapsed().saturating_sub(answered),
                ready_after: started.elapsed(),
                layout,
            });
        }
        if started.elapsed() >= timeout {
            give_up(&mut child);
            return Err(DockerError::NotReady {
                socket: layout.socket.clone(),
                waited: started.elapsed(),
                log: layout.log.clone(),
                tail: log_tail(&layout.log),
            });
        }
        std::thread::sleep(READY_POLL);
    }
}

/// What the daemon's child does between fork and exec: the runner's own first steps
/// (`process::seal_session`: a session, descriptors closed at exec, a keyring), the same
/// function that seals a runner, then the daemon's ([`DaemonChild::apply`]).
fn install_steps(command: &mut Command, setup: DaemonChild) {
    crate::process::seal_session(command);
    setup.install(command);
}

/// Kills the process started (its session: the tree's processes that stayed in it) and reaps it.
fn give_up(child: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Loads image tarballs (`docker save` output) into a runner's daemon (`policy.docker_images`):
/// the agent reads each file (the runner's uid need not be able to) and posts it to
/// `/images/load` on the daemon's socket, as `docker load` does. Each file is judged right
/// before it is read, by the rule `run` judged it by at start ([`crate::trust`]: a tarball a job
/// could have rewritten since is refused); a pinned one is checked against its SHA-256 as it is
/// streamed ([`load_image`]). Returns what the daemon said it loaded, one line per image.
pub fn load_images(
    socket: &Path,
    images: &[super::ImageFile],
    pool: &crate::isolate::Pool,
) -> Result<Vec<String>, ImageError> {
    let mut loaded = Vec::new();
    for image in images {
        if let Some(why) = crate::trust::changeable(&image.path, crate::trust::Kind::File, pool) {
            return Err(ImageError::Changeable {
                image: image.path.clone(),
                why,
            });
        }
        let answer = load_image(socket, image)?;
        loaded.extend(
            parse_load_answer(&answer).map_err(|said| ImageError::Refused {
                image: image.path.clone(),
                said,
            })?,
        );
    }
    Ok(loaded)
}

/// Why an image did not load.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot load {image} into the runner's daemon: {source}")]
    Io { image: PathBuf, source: io::Error },
    #[error("the runner's daemon refused {image}: {said}; is it `docker save` output?")]
    Refused { image: PathBuf, said: String },
    #[error("{image} is not loaded: a job could have changed it: {why}")]
    Changeable { image: PathBuf, why: String },
    #[error(
        "{image} is not loaded: its SHA-256 is {found}, not the {pinned} docker_images pins; if the file was replaced on purpose, pin its new digest (`sha256sum {image}`), else restore it"
    )]
    Digest {
        image: PathBuf,
        pinned: String,
        found: String,
    },
}

/// How much of the end of a pinned image tarball [`load_image`] keeps back until the whole
/// file's SHA-256 is known: a tarball's end (its last entry and the end-of-archive blocks) never
/// reaches the daemon unless the file is the pinned one, so the daemon's load of one that is
/// not ends cut short. Small enough to hold in memory.
pub(crate) const HELD_BACK: u64 = 1 << 20;

/// Posts `image` to the daemon and returns its answer. An unpinned file is streamed as it is;
/// a pinned one is hashed as it is streamed, all but its last [`HELD_BACK`] bytes sent at once,
/// those only once the file proved to have the pinned SHA-256 (else the connection is closed
/// with the body short, and [`ImageError::Digest`] returned). One read of the file, never whole
/// in memory.
fn load_image(socket: &Path, image: &super::ImageFile) -> Result<Vec<u8>, ImageError> {
    use sha2::Digest as _;
    let failed = |source| ImageError::Io {
        image: image.path.clone(),
        source,
    };
    let mut file = std::fs::File::open(&image.path).map_err(failed)?;
    let length = file.metadata().map_err(failed)?.len();
    let mut stream = UnixStream::connect(socket).map_err(failed)?;
    stream
        .set_read_timeout(Some(LOAD_TIMEOUT))
        .map_err(failed)?;
    stream
        .set_write_timeout(Some(LOAD_TIMEOUT))
        .map_err(failed)?;
    write!(
        stream,
        "POST /images/load?quiet=1 HTTP/1.0\r\nHost: docker\r\nContent-Type: application/x-tar\r\nContent-Length: {length}\r\n\r\n"
    )
    .map_err(failed)?;
    match &image.sha256 {
        None => {
            io::copy(&mut (&mut file).take(length), &mut stream).map_err(failed)?;
        }
        Some(pinned) => {
            let mut hasher = sha2::Sha256::new();
            let head = length.saturating_sub(HELD_BACK);
            let mut sent = (&mut file).take(head);
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = sent.read(&mut buf).map_err(failed)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                stream.write_all(&buf[..n]).map_err(failed)?;
            }
            let short = sent.limit() != 0;
            // One byte more than is due: a file that grew since its length was sent differs.
            let mut tail = Vec::new();
            (&mut file)
                .take(length - head + 1)
                .read_to_end(&mut tail)
                .map_err(failed)?;
            hasher.update(&tail);
            let found = hex::encode(hasher.finalize());
            if found != *pinned || short || head + tail.len() as u64 != length {
                // Dropped with the body short: the daemon's load fails on the early end.
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return Err(ImageError::Digest {
                    image: image.path.clone(),
                    pinned: pinned.clone(),
                    found,
                });
            }
            stream.write_all(&tail).map_err(failed)?;
        }
    }
    let mut answer = Vec::new();
    stream
        .take(MAX_LOAD_ANSWER)
        .read_to_end(&mut answer)
        .map_err(failed)?;
    Ok(answer)
}

/// What an `/images/load` answer says: the `Loaded image` lines, or the daemon's error. Pure.
pub(crate) fn parse_load_answer(answer: &[u8]) -> Result<Vec<String>, String> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{status} {}", body.trim()));
    }
    let mut loaded = Vec::new();
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("unreadable answer `{line}`: {e}"))?;
        if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
            return Err(error.to_owned());
        }
        if let Some(said) = value.get("stream").and_then(|s| s.as_str()) {
            loaded.extend(
                said.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    Ok(loaded)
}

/// Whether a Docker daemon answers `GET /_ping` with `200 OK` on `socket` within
/// [`PING_TIMEOUT`]. HTTP/1.0, so the daemon closes the connection after its answer.
pub(crate) fn ping(socket: &Path) -> bool {
    let answer = (|| -> io::Result<Vec<u8>> {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(PING_TIMEOUT))?;
        stream.set_write_timeout(Some(PING_TIMEOUT))?;
        stream.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")?;
        let mut answer = Vec::new();
        stream.take(4096).read_to_end(&mut answer)?;
        Ok(answer)
    })();
    answer.is_ok_and(|a| ping_answered(&a))
}

/// Whether an HTTP answer is `200` with the body `OK`. Pure.
pub(crate) fn ping_answered(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let status_ok = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        == Some("200");
    status_ok && text.split("\r\n\r\n").nth(1).map(str::trim) == Some("OK")
}

/// Makes `<runtime>/docker/` and its directories for `account`, and the log file (root's). The
/// tree is made while it is still the agent's, and handed over last, so the runner's uid never
/// sees it half made; a runtime that already has `docker/` is refused.
fn prepare(layout: &Layout, account: Account) -> Result<std::fs::File, DockerError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| DockerError::Prepare { path, source }
    };
    match std::fs::symlink_metadata(&layout.root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Ok(_) => {
            return Err(DockerError::Exists {
                path: layout.root.clone(),
            });
        }
        Err(source) => {
            return Err(DockerError::Prepare {
                path: layout.root.clone(),
                source,
            });
        }
    }
    rustix::fs::mkdir(&layout.root, Mode::from_raw_mode(0o700))
        .map_err(|e| err(&layout.root)(e.into()))?;
    let root = open_dir(&layout.root).map_err(err(&layout.root))?;
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc_nofollow())
        .open(&layout.log)
        .map_err(err(&layout.log))?;
    for dir in [&layout.data, &layout.exec, &layout.run, &layout.home] {
        let name = dir.file_name().unwrap_or_default();
        rustix::fs::mkdirat(&root, name, Mode::from_raw_mode(0o700))
            .map_err(|e| err(dir)(e.into()))?;
        let fd = rustix::fs::openat(
            &root,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(dir)(e.into()))?;
        give(&fd, account).map_err(err(dir))?;
    }
    give(&root, account).map_err(err(&layout.root))?;
    Ok(log)
}

/// `O_NOFOLLOW` for `OpenOptions::custom_flags`.
fn libc_nofollow() -> i32 {
    OFlags::NOFOLLOW.bits() as i32
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn give(fd: &OwnedFd, account: Account) -> io::Result<()> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(account.uid)),
        Some(rustix::fs::Gid::from_raw(account.gid)),
    )?;
    rustix::fs::fchmod(fd, Mode::RWXU)?;
    Ok(())
}

fn log_stdio(log: &std::fs::File, layout: &Layout) -> Result<Stdio, DockerError> {
    log.try_clone()
        .map(Stdio::from)
        .map_err(|source| DockerError::Prepare {
            path: layout.log.clone(),
            source,
        })
}

/// The last [`LOG_TAIL_LINES`] lines of the daemon's log, for an error.
fn log_tail(log: &Path) -> String {
    let text = (|| -> io::Result<String> {
        let mut file = std::fs::File::open(log)?;
        let len = file.metadata()?.len();
        io::Seek::seek(
            &mut file,
            io::SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)),
        )?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    })()
    .unwrap_or_else(|e| format!("(cannot read it: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// What the daemon's child does between fork and exec, prepared before the fork.
#[derive(Debug)]
struct DaemonChild {
    uid: u32,
    gid: u32,
    cgroup_procs: OwnedFd,
    netns: Option<OwnedFd>,
    passwd: Vec<u8>,
    group: Vec<u8>,
    resolv: Vec<u8>,
    /// Where the resolver file goes: `/etc/resolv.conf` itself, or, where that is a link into
    /// `/run` (systemd-resolved, resolvconf), the link's target recreated in the private `/run`.
    resolv_target: ResolvTarget,
    socket: CString,
    /// The [`PRIVATE_DIRS`] that exist on this host.
    private_dirs: Vec<CString>,
    /// The runner's host name, set in the tree's UTS namespace.
    hostname: CString,
    /// Where the host mounts cgroup v2: each mounted again inside the tree's cgroup namespace,
    /// so that what the daemon sees there is the runner's cgroup and below, not the host's tree.
    cgroup2: Vec<CString>,
    /// The tree's `RLIMIT_NPROC` ([`DaemonSpec::pids_max`]).
    pids_max: Option<u32>,
    /// [`DaemonSpec::run_keep`], opened.
    kept: crate::isolate::KeptInRun,
}

#[derive(Debug, PartialEq, Eq)]
enum ResolvTarget {
    /// The host has none: nothing to do.
    Absent,
    /// Bind the prepared file onto this path.
    Bind(CString),
    /// Create these directories in the private `/run` (outermost first), then the file.
    InRun { dirs: Vec<CString>, file: CString },
}

impl DaemonChild {
    fn new(spec: &DaemonSpec, layout: &Layout) -> Result<DaemonChild, DockerError> {
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes()).map_err(|e| DockerError::Prepare {
                path: p.to_owned(),
                source: io::Error::new(io::ErrorKind::InvalidInput, e),
            })
        };
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(|source| DockerError::Prepare {
                path: PathBuf::from(path),
                source,
            })
        };
        let tun = std::fs::metadata(tools::TUN).ok();
        if !tun.is_some_and(|m| m.file_type().is_char_device()) {
            return Err(DockerError::NoTun);
        }
        // A runtime below one of these was refused already ([`check_runtime`], in [`start`]).
        let mut private_dirs = Vec::new();
        for dir in PRIVATE_DIRS {
            // A link (e.g. /var/tmp -> /tmp) is not mounted over.
            if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
                private_dirs.push(c(Path::new(dir))?);
            }
        }
        let account = spec.account;
        let passwd = passwd_with(&read("/etc/passwd")?, account, &layout.home);
        let group = group_with(&read("/etc/group")?, account);
        let resolv = match &spec.resolv_conf {
            Some(text) => text.clone(),
            None => std::fs::read(tools::RESOLV_CONF).unwrap_or_default(),
        };
        // A host without the file (or with a dangling link) gives the daemon none either.
        let resolv_target = match std::fs::canonicalize(tools::RESOLV_CONF) {
            Err(_) => ResolvTarget::Absent,
            Ok(resolved) => Self::resolv_target(&resolved, c)?,
        };
        let dup = |fd: &OwnedFd, what: &Path| {
            fd.try_clone().map_err(|source| DockerError::Prepare {
                path: what.to_owned(),
                source,
            })
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let cgroup2 = crate::cgroup::cgroup2_mounts(&mountinfo)
            .iter()
            .map(|mount| c(&mount.mount_point))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DaemonChild {
            hostname: CString::new(spec.hostname.as_bytes()).map_err(|e| DockerError::Prepare {
                path: PathBuf::from("hostname"),
                source: io::Error::new(io::ErrorKind::InvalidInput, e),
            })?,
            cgroup2,
            pids_max: spec.pids_max,
            kept: crate::isolate::KeptInRun::prepare(&spec.run_keep, &[]).map_err(|source| {
                DockerError::Prepare {
                    path: PathBuf::from("/run"),
                    source,
                }
            })?,
            uid: account.uid,
            gid: account.gid,
            cgroup_procs: dup(&spec.cgroup_procs, Path::new("cgroup.procs"))?,
            netns: match &spec.netns {
                Some(fd) => Some(dup(fd, Path::new("netns"))?),
                None => None,
            },
            passwd: passwd.into_bytes(),
            group: group.into_bytes(),
            resolv,
            resolv_target,
            socket: c(&layout.socket)?,
            private_dirs,
        })
    }

    /// Where the resolver file goes for a host whose `/etc/resolv.conf` is `resolved`.
    fn resolv_target(
        resolved: &Path,
        c: impl Fn(&Path) -> Result<CString, DockerError>,
    ) -> Result<ResolvTarget, DockerError> {
        // One rule for where the file goes in a fresh `/run`: the runner's (`isolate`).
        let in_run =
            crate::isolate::resolv_in_run(resolved).map_err(|source| DockerError::Prepare {
                path: resolved.to_owned(),
                source,
            })?;
        Ok(match in_run {
            Some((dirs, file)) => ResolvTarget::InRun { dirs, file },
            None => ResolvTarget::Bind(c(resolved)?),
        })
    }

    #[allow(unsafe_code)]
    fn install(self, command: &mut Command) {
        let setup = self;
        // SAFETY: `pre_exec` runs the closure in the forked child of a multi-threaded process,
        // where only async-signal-safe operations are sound. `apply` makes raw system calls
        // through rustix's linux_raw backend on paths, bytes and descriptors prepared before the
        // fork (borrowed, never converted or copied), takes no lock and allocates nothing; its
        // errors are plain errno values.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || setup.apply());
        }
    }

    /// The child's steps, after `process::seal_session`'s (its own session, descriptors closed
    /// at exec): into the cgroup first (everything after is counted and killable), the network
    /// namespace (joining needs root, and must precede the mount namespace so `/sys/class/net`
    /// would match), the mount, UTS and cgroup namespaces and their files while still root
    /// (the cgroup namespace after the cgroup is joined: its root is the runner's cgroup), the
    /// process limit, then the identity and a keyring of its own. No `no_new_privs` (see the
    /// module's comment).
    #[allow(unsafe_code)]
    fn apply(&self) -> io::Result<()> {
        use rustix::mount::{MountFlags, MountPropagationFlags};
        use rustix::thread::UnshareFlags;
        rustix::process::umask(Mode::from_raw_mode(0o022));
        rustix::io::write(self.cgroup_procs.as_fd(), b"0")?;
        if let Some(netns) = &self.netns {
            rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
        }
        let namespaces = UnshareFlags::NEWNS | UnshareFlags::NEWUTS | UnshareFlags::NEWCGROUP;
        // SAFETY: the child is single-threaded; no other thread shares its file system state.
        unsafe { rustix::thread::unshare_unsafe(namespaces)? };
        rustix::system::sethostname(self.hostname.as_bytes())?;
        // Nothing mounted here reaches the host, and nothing the host mounts later reaches in.
        rustix::mount::mount_change(
            c"/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        )?;
        for mount in &self.cgroup2 {
            // Mounted from inside the new cgroup namespace: its root is the runner's cgroup.
            // The copy of the host's mount goes first: the kernel refuses the same
            // filesystem twice on one mount point (EBUSY).
            rustix::mount::unmount(mount.as_c_str(), rustix::mount::UnmountFlags::DETACH)?;
            rustix::mount::mount(
                c"cgroup2",
                mount.as_c_str(),
                c"cgroup2",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                c"",
            )?;
        }
        // What the operator keeps of the host's `/run`, taken before the private one covers it.
        let kept = self.kept.detach()?;
        // Not `nodev`: the tun node below lives here.
        rustix::mount::mount(
            c"tmpfs",
            c"/run",
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NOEXEC,
            RUN_TMPFS_OPTIONS,
        )?;
        rustix::fs::mkdir(RUN_RM, Mode::from_raw_mode(0o755))?;
        write_new(RUN_PASSWD, &self.passwd)?;
        write_new(RUN_GROUP, &self.group)?;
        for dir in &self.private_dirs {
            rustix::mount::mount(
                c"tmpfs",
                dir.as_c_str(),
                c"tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV,
                PRIVATE_TMPFS_OPTIONS,
            )?;
        }
        rustix::mount::mount_bind(RUN_PASSWD, c"/etc/passwd")?;
        rustix::mount::mount_bind(RUN_GROUP, c"/etc/group")?;
        match &self.resolv_target {
            ResolvTarget::Absent => {}
            ResolvTarget::Bind(target) => {
                write_new(RUN_RESOLV, &self.resolv)?;
                rustix::mount::mount_bind(RUN_RESOLV, target.as_c_str())?;
            }
            ResolvTarget::InRun { dirs, file } => {
                for dir in dirs {
                    mkdir_here(dir.as_c_str())?;
                }
                write_new(file.as_c_str(), &self.resolv)?;
            }
        }
        match rustix::fs::mknodat(
            rustix::fs::CWD,
            RUN_TUN,
            FileType::CharacterDevice,
            Mode::from_raw_mode(0o666),
            rustix::fs::makedev(TUN_MAJOR, TUN_MINOR),
        ) {
            Ok(()) => {
                // The umask took write from group and others at creation.
                rustix::fs::chmod(RUN_TUN, Mode::from_raw_mode(0o666))?;
                rustix::mount::mount_bind(RUN_TUN, c"/dev/net/tun")?;
            }
            // No CAP_MKNOD (a bounding set without it, as the systemd unit's): the host's own
            // node is used as it is, which works where it is 0666 (`check` says so otherwise).
            Err(rustix::io::Errno::PERM) => {}
            Err(e) => return Err(e.into()),
        }
        rustix::fs::symlink(self.socket.as_c_str(), RUN_SOCKET_LINK)?;
        self.kept.attach(kept)?;

        if let Some(max) = self.pids_max {
            crate::isolate::limit_processes(max)?;
        }
        rustix::thread::clear_ambient_capability_set()?;
        let gid = rustix::process::Gid::from_raw(self.gid);
        let uid = rustix::process::Uid::from_raw(self.uid);
        rustix::thread::set_thread_groups(&[])?;
        rustix::thread::set_thread_res_gid(gid, gid, gid)?;
        // From root to a non-zero uid: the kernel clears every capability.
        rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        crate::isolate::join_own_session_keyring()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_of_the_daemon_is_under_the_runtime() {
        let layout = Layout::of(Path::new("/srv/rm/runners/0123456789ab"));
        for path in [
            &layout.data,
            &layout.exec,
            &layout.run,
            &layout.home,
            &layout.socket,
            &layout.pidfile,
            &layout.rootlesskit,
            &layout.log,
        ] {
            assert!(
                path.starts_with("/srv/rm/runners/0123456789ab/docker"),
                "{path:?}"
            );
        }
        assert_eq!(
            layout.docker_host(),
            "unix:///srv/rm/runners/0123456789ab/docker/run/docker.sock"
        );
        assert_eq!(
            rootlesskit_flags(&layout),
            "--subid-source=static --pidns --ipcns --state-dir=/srv/rm/runners/0123456789ab/docker/run/rootlesskit"
        );
        let args = |mirror: Option<&DaemonMirror>| -> Vec<String> {
            dockerd_args(&layout, mirror, None)
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let plain = [
            "--data-root",
            "/srv/rm/runners/0123456789ab/docker/data",
            "--exec-root",
            "/srv/rm/runners/0123456789ab/docker/exec",
            "--host",
            "unix:///srv/rm/runners/0123456789ab/docker/run/docker.sock",
            "--pidfile",
            "/srv/rm/runners/0123456789ab/docker/run/docker.pid",
        ];
        assert_eq!(args(None), plain);
        let mirror = DaemonMirror {
            url: "http://10.213.0.1:5000".to_owned(),
            insecure: None,
        };
        assert_eq!(
            args(Some(&mirror))[plain.len()..],
            ["--registry-mirror", "http://10.213.0.1:5000"]
        );
        assert_eq!(args(Some(&mirror))[..plain.len()], plain);
        assert!(layout.check_socket_paths().is_ok());
    }

    /// What a check refused: the directory a runtime lies under, or the socket path too long.
    fn refusal(checked: Result<(), DockerError>) -> Option<String> {
        match checked {
            Ok(()) => None,
            Err(DockerError::UnderPrivateDir { dir, .. }) => Some(dir.to_owned()),
            Err(DockerError::PathTooLong { path }) => Some(format!("long {}", path.display())),
            Err(other) => panic!("{other}"),
        }
    }

    /// A path of `len` bytes: `/` and `len - 1` times `r`.
    fn path_of(len: usize) -> String {
        format!("/{}", "r".repeat(len - 1))
    }

    #[test]
    fn the_runtime_rule_over_hidden_directories_and_socket_lengths() {
        // The deepest socket, containerd's, is the runtime and 39 bytes: 68 bytes fit.
        let longest = path_of(MAX_SOCKET_PATH - "/docker/exec/containerd/containerd.sock".len());
        let too_long = format!("{longest}r");
        let table: &[(&str, Option<&str>)] = &[
            ("/srv/rm/runners/0123456789ab", None),
            ("/var/lib/rm-agent/runners/0123456789ab", None),
            ("/tmp/rm/runners/0123456789ab", Some("/tmp")),
            ("/tmp", Some("/tmp")),
            ("/var/tmp/runners/0123456789ab", Some("/var/tmp")),
            ("/dev/shm/runners/0123456789ab", Some("/dev/shm")),
            ("/run/rm-agent/runners/0123456789ab", Some("/run")),
            // Whole components only: these are not below /tmp or /run.
            ("/tmpfs/runners/0123456789ab", None),
            ("/runners/0123456789ab", None),
            ("/var/lib/tmp/0123456789ab", None),
            (&longest, None),
        ];
        for (runtime, refused) in table {
            assert_eq!(
                refusal(check_runtime(Path::new(runtime))).as_deref(),
                *refused,
                "{runtime}"
            );
        }
        let deep = format!("{too_long}/docker/exec/{DEEPEST_SOCKET}");
        assert_eq!(
            refusal(check_runtime(Path::new(&too_long))),
            Some(format!("long {deep}"))
        );
        let err = check_runtime(Path::new("/tmp/r/0123456789ab")).unwrap_err();
        for says in [
            "/tmp",
            "empty tmpfs",
            "host.runner_root",
            "/run, /tmp, /var/tmp, /dev/shm",
        ] {
            assert!(err.to_string().contains(says), "{says}: {err}");
        }
        let err = check_runtime(Path::new(&too_long)).unwrap_err();
        assert!(err.to_string().contains("host.runner_root"), "{err}");
    }

    #[test]
    fn a_runner_root_is_judged_by_the_deepest_runtime_a_policy_s_runners_get() {
        // An ephemeral runtime is the root, `/` and 12 hex digits: a root of 55 bytes fits.
        let ephemeral = MAX_SOCKET_PATH - "/docker/exec/containerd/containerd.sock".len() - 13;
        // A slot is the root, `/linux/s` and its number: with ten slots (`s9`), 59 bytes fit.
        let slotted = ephemeral + 13 - "/linux/s9".len();
        // (runner root, persistent slots, whether it fits)
        type Case = (String, Option<(&'static str, u32)>, bool);
        let table: &[Case] = &[
            ("/var/lib/rm-agent/runners".to_owned(), None, true),
            (
                "/var/lib/rm-agent/runners".to_owned(),
                Some(("linux", 50)),
                true,
            ),
            (path_of(ephemeral), None, true),
            (path_of(ephemeral + 1), None, false),
            (path_of(slotted), Some(("linux", 10)), true),
            // An eleventh slot, `s10`, is one byte longer.
            (path_of(slotted), Some(("linux", 11)), false),
            (path_of(slotted + 1), Some(("linux", 10)), false),
            // A policy that may run one runner: `s0`.
            (path_of(slotted), Some(("linux", 1)), true),
            (path_of(slotted), Some(("linux", 0)), true),
        ];
        for (root, slots, fits) in table {
            let checked = check_runner_root(Path::new(root), *slots);
            assert_eq!(checked.is_ok(), *fits, "{root} {slots:?}: {checked:?}");
        }
        for root in ["/tmp/rm/runners", "/run/rm", "/dev/shm/r", "/var/tmp/r"] {
            for slots in [None, Some(("linux", 4))] {
                assert!(
                    matches!(
                        check_runner_root(Path::new(root), slots),
                        Err(DockerError::UnderPrivateDir { .. })
                    ),
                    "{root} {slots:?}"
                );
            }
        }
    }

    #[test]
    fn a_bare_numeric_uid_gets_a_name_and_a_named_one_keeps_its_own() {
        let host = "root:x:0:0:root:/root:/bin/bash\nci-1:x:64201:64201::/home/ci-1:/bin/sh";
        let bare = Account {
            uid: 64290,
            gid: 64290,
        };
        let passwd = passwd_with(host, bare, Path::new("/r/docker/home"));
        assert!(passwd.starts_with(host), "the host's lines are kept");
        assert!(
            passwd.ends_with(
                "/bin/sh\nrm64290:x:64290:64290:rm runner:/r/docker/home:/usr/sbin/nologin\n"
            ),
            "{passwd}"
        );
        let named = Account {
            uid: 64201,
            gid: 64201,
        };
        assert_eq!(
            passwd_with(host, named, Path::new("/h")),
            format!("{host}\n")
        );
        let group = "root:x:0:\nci-1:x:64201:\n";
        assert_eq!(group_with(group, named), group);
        assert_eq!(
            group_with(group, bare),
            format!("{group}rm64290:x:64290:\n")
        );
    }

    #[test]
    fn an_image_load_answer_says_what_loaded_or_why_not() {
        let ok = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"stream\":\"Loaded image: pg:16\\n\"}\n{\"stream\":\"Loaded image ID: sha256:ab\\n\"}\n";
        assert_eq!(
            parse_load_answer(ok).unwrap(),
            ["Loaded image: pg:16", "Loaded image ID: sha256:ab"]
        );
        let refused = b"HTTP/1.0 200 OK\r\n\r\n{\"errorDetail\":{\"message\":\"bad tar\"},\"error\":\"bad tar\"}\n";
        assert_eq!(parse_load_answer(refused).unwrap_err(), "bad tar");
        let failed = b"HTTP/1.0 500 Internal Server Error\r\n\r\n{\"message\":\"no space\"}";
        assert!(parse_load_answer(failed).unwrap_err().contains("500"));
    }

    #[test]
    fn a_resolver_file_linked_into_run_is_recreated_in_the_private_run() {
        let c = |p: &Path| Ok(CString::new(p.as_os_str().as_bytes()).unwrap());
        assert_eq!(
            DaemonChild::resolv_target(Path::new("/run/systemd/resolve/stub-resolv.conf"), c)
                .unwrap(),
            ResolvTarget::InRun {
                dirs: vec![c"/run/systemd".into(), c"/run/systemd/resolve".into()],
                file: c"/run/systemd/resolve/stub-resolv.conf".into(),
            }
        );
        assert_eq!(
            DaemonChild::resolv_target(Path::new("/etc/resolv.conf"), c).unwrap(),
            ResolvTarget::Bind(c"/etc/resolv.conf".into())
        );
    }

    #[test]
    fn only_a_200_ok_is_an_answer() {
        assert!(ping_answered(
            b"HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nContent-Length: 2\r\n\r\nOK"
        ));
        assert!(!ping_answered(
            b"HTTP/1.0 500 Internal Server Error\r\n\r\nOK"
        ));
        assert!(!ping_answered(b"HTTP/1.0 200 OK\r\n\r\nnot yet"));
        assert!(!ping_answered(b""));
    }
}
