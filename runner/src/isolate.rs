//! What `isolation = "user"` does to a runner besides its cgroup (CONTRACT §7): the steps the
//! child takes between fork and exec ([`ChildSetup`]: into its cgroup, a private mount namespace
//! with fresh `/tmp`, `/var/tmp`, `/dev/shm` (and, on a host that declares devices, every mount
//! `nodev` and a `/dev` of its own with only its given device nodes: [`super::devices`]) and an
//! IPC namespace of its own, its process limit, `no_new_privs`, then the
//! runner's uid and gid with no supplementary groups), the environment it gets (`HOME`, `XDG_*`
//! and the temporary directories inside its runtime), handing a runtime to the runner's uid
//! ([`chown_tree`]), the uid pool ([`Pool`], [`pick_uid`]), and the checks that tell whether the
//! agent can isolate at all ([`can_switch_users`], [`check_traversable`]).
//!
//! The child-side steps run after `fork` in a multi-threaded agent, where only
//! async-signal-safe work is allowed: every path and buffer is made before the fork, and the
//! steps are raw system calls through rustix (no allocation, no lock). That is the one place
//! this crate needs `unsafe` ([`ChildSetup::install`]).

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::process::runner_environment;
use super::workspace::walk::DirStack;
use super::workspace::{MountKey, TMP_DIR};

/// The runner's home directory inside its runtime: a job's `~/.gitconfig`, `~/.cargo` or
/// `~/.docker/config.json` goes with the runtime.
pub(crate) const HOME_DIR: &str = "home";

/// The shared writable places a runner gets its own empty tmpfs for, where they exist: nothing a
/// job writes there is seen by another runner or outlives its own. `/run` is among them for
/// what it holds rather than for what a job could write there: the host's services put their
/// unix sockets in it (a fleet's PostgreSQL under `local trust`, D-Bus, a container engine's),
/// which a job would otherwise reach as its uid. The fresh `/run` gets back only what a job
/// needs ([`RunDir`]).
pub const PRIVATE_DIRS: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", RUN];

/// The host's runtime directory, which a runner sees empty but for [`RunDir`].
pub(crate) const RUN: &str = "/run";

/// `/run/lock` inside the runner's fresh `/run`: lock files (sticky, world-writable as the
/// host's), on the `/run` tmpfs and within its bound.
const RUN_LOCK: &std::ffi::CStr = c"/run/lock";

/// Where a job finds its own Docker daemon's socket in its `/run` (`/var/run/docker.sock`, the
/// path tools that ignore `DOCKER_HOST` use): a link to the socket in its runtime.
const RUN_DOCKER_SOCKET: &std::ffi::CStr = c"/run/docker.sock";

/// The umask a runner starts with (the agent's own is 077, which would make every file a job
/// creates unreadable to the tools it starts under other users, such as a container engine).
const RUNNER_UMASK: u32 = 0o022;

/// `CAP_SETGID` and `CAP_SETUID` (linux/capability.h): what switching to a runner uid needs.
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

/// Where a pool account's uid and primary gid are read.
const PASSWD: &str = "/etc/passwd";

/// One runner identity of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
}

/// The runner uid pool as configured (`host.runner_uids`); accounts are resolved to uids when
/// `run` starts ([`Pool::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerUids {
    /// Every uid from `first` to `last`, inclusive; gid = uid.
    Range { first: u32, last: u32 },
    /// Existing accounts: their uid and primary gid.
    Accounts(Vec<String>),
}

impl RunnerUids {
    /// How many runners the pool can hold at once.
    pub fn len(&self) -> usize {
        match self {
            RunnerUids::Range { first, last } => (*last - *first) as usize + 1,
            RunnerUids::Accounts(names) => names.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The runner uid pool, resolved (account names looked up once at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    accounts: Vec<Account>,
}

impl Pool {
    pub fn new(accounts: Vec<Account>) -> Pool {
        Pool { accounts }
    }

    /// Resolves the configured pool: a range as uid = gid, account names through `/etc/passwd`.
    pub fn resolve(configured: &RunnerUids) -> Result<Pool, String> {
        match configured {
            RunnerUids::Range { first, last } => Ok(Pool::new(
                (*first..=*last)
                    .map(|uid| Account { uid, gid: uid })
                    .collect(),
            )),
            RunnerUids::Accounts(names) => {
                let passwd = std::fs::read_to_string(PASSWD)
                    .map_err(|e| format!("cannot read {PASSWD} to look the accounts up: {e}"))?;
                let mut accounts = Vec::with_capacity(names.len());
                for name in names {
                    let account = lookup_account(&passwd, name).ok_or_else(|| {
                        format!(
                            "there is no account `{name}` in {PASSWD}; create it or use a uid range"
                        )
                    })?;
                    if account.uid == 0 || account.gid == 0 {
                        return Err(format!(
                            "account `{name}` has uid or gid 0; a runner never runs as root"
                        ));
                    }
                    accounts.push(account);
                }
                Ok(Pool::new(accounts))
            }
        }
    }

    pub fn accounts(&self) -> &[Account] {
        &self.accounts
    }

    pub fn contains_uid(&self, uid: u32) -> bool {
        self.accounts.iter().any(|a| a.uid == uid)
    }

    pub(crate) fn contains_gid(&self, gid: u32) -> bool {
        self.accounts.iter().any(|a| a.gid == gid)
    }

    /// The gid that goes with a journalled uid: the pool's, or the uid's own number for a uid
    /// the pool no longer holds (the configuration changed since it was allocated).
    pub(crate) fn gid_of(&self, uid: u32) -> u32 {
        self.accounts
            .iter()
            .find(|a| a.uid == uid)
            .map_or(uid, |a| a.gid)
    }
}

/// An account's uid and primary gid from `/etc/passwd` text.
pub(crate) fn lookup_account(passwd: &str, name: &str) -> Option<Account> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some(Account { uid, gid })
    })
}

/// The first account of the pool no uncleaned attempt holds (`held`) and no process runs as
/// (`running`, a uid someone else uses on this host would share its files and signals).
pub fn pick_uid(pool: &Pool, held: &[u32], running: &HashSet<u32>) -> Option<Account> {
    pool.accounts
        .iter()
        .find(|a| !held.contains(&a.uid) && !running.contains(&a.uid))
        .copied()
}

/// Whether this process may switch to another uid and gid: `CapEff` of `/proc/self/status`
/// holds `CAP_SETUID` and `CAP_SETGID` (root normally does; a capability bounding set may take
/// them away even from root).
pub fn can_switch_users() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| effective_capabilities(&status))
        .is_some_and(|caps| caps & (1 << CAP_SETUID) != 0 && caps & (1 << CAP_SETGID) != 0)
}

/// The `CapEff:` bit mask of a `/proc/<pid>/status` text.
pub(crate) fn effective_capabilities(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// Hardens the agent against its own runners, once at start: no process (not even one of the
/// agent's own uid without `CAP_SYS_PTRACE`) may read its memory or environment through `/proc`
/// or attach to it, and every file it creates is private to it unless it says otherwise.
pub fn harden_agent() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    rustix::process::umask(Mode::from_raw_mode(0o077));
    Ok(())
}

/// Checks that a runner uid (neither owner nor group) can reach its runtime under
/// `runner_root`: every ancestor must be searchable by others. An ancestor inside the agent's
/// `data_dir` (or the data directory itself) that the agent owns gets `o+x` added (search, not
/// listing); any other one is refused with the fix.
pub fn check_traversable(runner_root: &Path, data_dir: &Path) -> Result<(), String> {
    let root = runner_root.canonicalize().map_err(|e| {
        format!(
            "cannot resolve the runner root {}: {e}",
            runner_root.display()
        )
    })?;
    let data = data_dir.canonicalize().ok();
    let me = rustix::process::geteuid().as_raw();
    for dir in root.ancestors().skip(1) {
        let meta =
            std::fs::metadata(dir).map_err(|e| format!("cannot look at {}: {e}", dir.display()))?;
        if meta.mode() & 0o001 != 0 {
            continue;
        }
        let ours = data.as_deref().is_some_and(|d| dir.starts_with(d)) && meta.uid() == me;
        if ours {
            let mode = (meta.mode() & 0o7777) | 0o001;
            rustix::fs::chmod(dir, Mode::from_raw_mode(mode))
                .map_err(|e| format!("cannot let runners traverse {}: {e}", dir.display()))?;
            continue;
        }
        return Err(format!(
            "{} is not searchable by other users, so a runner uid cannot reach its runtime under {}; run `chmod o+x {}` or choose a host.runner_root whose every parent is",
            dir.display(),
            root.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// Why a secret file is readable by a runner uid, if it is: mode `o+r`, or owned by (or, with
/// `g+r`, in the group of) an account of the pool.
pub fn readable_by_runners(meta: &std::fs::Metadata, pool: &Pool) -> Option<String> {
    let mode = meta.mode();
    if mode & 0o004 != 0 {
        return Some(format!(
            "it is readable by every user (mode {:o})",
            mode & 0o777
        ));
    }
    if pool.contains_uid(meta.uid()) {
        return Some(format!("it is owned by runner uid {}", meta.uid()));
    }
    if mode & 0o040 != 0 && pool.contains_gid(meta.gid()) {
        return Some(format!("its group {} is a runner gid", meta.gid()));
    }
    None
}

/// The environment of an isolated runner (without the JIT configuration): the allow-listed
/// variables as for any runner, but `HOME` = `<runtime>/home`, the XDG base directories under
/// it, `XDG_RUNTIME_DIR` = `<runtime>/tmp`, and no `USER`, `LOGNAME` or `SHELL` of the agent's
/// (they would name the agent's account). Sorted by name.
pub(crate) fn isolated_environment(
    agent_env: impl IntoIterator<Item = (OsString, OsString)>,
    runtime: &Path,
) -> Vec<(OsString, OsString)> {
    const REPLACED: [&str; 9] = [
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
    ];
    let mut env = runner_environment(agent_env, runtime);
    env.retain(|(key, _)| !REPLACED.iter().any(|r| key == r));
    let home = runtime.join(HOME_DIR);
    let under_home = |rel: &str| home.join(rel).into_os_string();
    env.extend([
        (OsString::from("HOME"), home.clone().into_os_string()),
        ("XDG_CONFIG_HOME".into(), under_home(".config")),
        ("XDG_CACHE_HOME".into(), under_home(".cache")),
        ("XDG_DATA_HOME".into(), under_home(".local/share")),
        ("XDG_STATE_HOME".into(), under_home(".local/state")),
        (
            "XDG_RUNTIME_DIR".into(),
            runtime.join(TMP_DIR).into_os_string(),
        ),
    ]);
    env.sort();
    env
}

/// Makes `<runtime>/tmp` and `<runtime>/home` (if missing) and gives them and the runtime
/// directory itself to the runner: owner `account`, mode 0700. What the package put in the
/// runtime stays the agent's.
pub(crate) fn hand_over(runtime: &Path, account: Account) -> io::Result<()> {
    for dir in [TMP_DIR, HOME_DIR] {
        let path = runtime.join(dir);
        match std::fs::create_dir(&path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !std::fs::symlink_metadata(&path)?.is_dir() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("the runtime's `{dir}` is not a directory"),
                    ));
                }
            }
            other => other?,
        }
        give(&path, account)?;
    }
    give(runtime, account)
}

/// Takes a persistent slot back from the runner that held it, once nothing of that runner is
/// left: the slot directory and its `_work` become the agent's again (mode 0700, not following
/// a link), so a later runner of the same uid, of any policy, cannot reach the checkout; the
/// next holder of the slot gets it with [`hand_over`] and [`chown_tree`].
pub(crate) fn take_back(slot: &Path) -> io::Result<()> {
    let agent = Account {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    };
    match give(slot, agent) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    }
    match give(&slot.join(super::workspace::WORK_FOLDER), agent) {
        // No `_work` (the runner never made one), or not a directory (scrubbing removed it).
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// `lchown` to the account and mode 0700, without following a link.
fn give(path: &Path, account: Account) -> io::Result<()> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::fs::fchown(
        &fd,
        Some(rustix::fs::Uid::from_raw(account.uid)),
        Some(rustix::fs::Gid::from_raw(account.gid)),
    )?;
    rustix::fs::fchmod(&fd, Mode::RWXU)?;
    Ok(())
}

/// Gives everything under the directory `dir` (and `dir` itself) to `account`, never following
/// a link (a link is re-owned as a link; `dir` itself must not be one) and not crossing into
/// another mount: a persistent slot's `_work` changes hands between runner uids, and only the
/// holder may write it. However deep a job nested it: the walk has no depth limit and holds a
/// bounded number of descriptors ([`super::workspace::walk`]).
pub fn chown_tree(dir: &Path, account: Account) -> io::Result<()> {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let device = MountKey::of(&fd)?;
    let mut walk = DirStack::new(fd)?;
    while chown_next(&mut walk, device, account)? {}
    rustix::fs::fchown(
        walk.dir()?,
        Some(rustix::fs::Uid::from_raw(account.uid)),
        Some(rustix::fs::Gid::from_raw(account.gid)),
    )?;
    Ok(())
}

/// One step of [`chown_tree`]: re-owns the next entry of the walk's deepest directory (going
/// down into it if it is a directory on the same mount), or climbs up once that directory is
/// done. Whether there is more to do.
fn chown_next(walk: &mut DirStack, device: MountKey, account: Account) -> io::Result<bool> {
    let Some(name) = walk.next_name() else {
        return Ok(walk.ascend()?.is_some());
    };
    let dir = walk.dir()?;
    let stat = match rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    // What the agent owns is never given away: a store file hard-linked into `_work` (which
    // `fs.protected_hardlinks` should prevent) would become the runner's to rewrite.
    if stat.st_uid == rustix::process::geteuid().as_raw() {
        return Ok(true);
    }
    let uid = Some(rustix::fs::Uid::from_raw(account.uid));
    let gid = Some(rustix::fs::Gid::from_raw(account.gid));
    rustix::fs::chownat(dir, &name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory && stat.st_dev == device.dev {
        let child = rustix::fs::openat(
            dir,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // A mount point is re-owned as an entry, never entered (a bind mount of the same
        // filesystem has the same device: its mount id tells it apart).
        if device.same_mount(MountKey::of(&child)?) {
            walk.descend(child, &name)?;
        }
    }
    Ok(true)
}

/// What bounds each private tmpfs when the policy writes `memory_max = "none"`: a job's `/tmp`
/// still cannot take half the host's memory (the kernel's default for tmpfs); shared out as a
/// `memory_max` of this size would be ([`super::tmpfs::private_tmpfs_bounds`]).
pub(crate) const DEFAULT_TMPFS_SIZE: u64 = 4 << 30;

/// The mount options of the private tmpfs on `dir`: sticky and world-writable like the real
/// ones, and bounded by the policy's `memory_max` ([`super::tmpfs::private_tmpfs_bounds`], the
/// one owner of the shares), or as if it were [`DEFAULT_TMPFS_SIZE`].
pub(crate) fn tmpfs_options(dir: &str, memory_max: Option<u64>) -> String {
    let bounds =
        super::tmpfs::private_tmpfs_bounds(dir, Some(memory_max.unwrap_or(DEFAULT_TMPFS_SIZE)));
    // `/run` is root's and not writable by others, as the host's is; the rest are sticky and
    // world-writable.
    let mode = if dir == RUN { "mode=755" } else { "mode=1777" };
    match bounds {
        Some(b) => format!("{mode},{}", b.mount_options()),
        None => mode.to_owned(),
    }
}

/// Where `/etc/resolv.conf` puts the resolver file when a fresh tmpfs hides `/run`: nowhere to
/// go when it is not under `/run`, or, where it is a link into `/run` (systemd-resolved's
/// `stub-resolv.conf`, resolvconf's), the directories to recreate in the fresh `/run`
/// (outermost first) and the file. Pure.
pub(crate) fn resolv_in_run(resolved: &Path) -> io::Result<Option<(Vec<CString>, CString)>> {
    let Ok(below) = resolved.strip_prefix(RUN) else {
        return Ok(None);
    };
    let mut dirs = Vec::new();
    let mut at = PathBuf::from(RUN);
    let parts: Vec<_> = below.components().collect();
    for part in parts.iter().take(parts.len().saturating_sub(1)) {
        at.push(part);
        dirs.push(c_path(&at)?);
    }
    Ok(Some((dirs, c_path(resolved)?)))
}

/// What a runner's fresh `/run` holds, prepared before the fork: `/run/lock`, the resolver file
/// where `/etc/resolv.conf` links into `/run`, and the link to its own Docker daemon's socket.
#[derive(Debug, Default)]
struct RunDir {
    /// The host has a `/run/lock` (Debian's `/var/lock` links to it).
    lock: bool,
    /// [`resolv_in_run`]'s directories and file, and the host's resolver text for it.
    resolv: Option<(Vec<CString>, CString, Vec<u8>)>,
    /// The runner's Docker daemon's socket, linked at `/run/docker.sock`.
    docker_socket: Option<CString>,
    /// What the operator keeps of the host's `/run` (`host.runner_run_keep`), and what the
    /// agent lends the runner read-only there ([`Sandbox::lent`]).
    kept: KeptInRun,
}

impl RunDir {
    fn prepare(
        docker_socket: Option<&Path>,
        keep: &[PathBuf],
        lent: &[Lent],
        in_image: bool,
    ) -> io::Result<RunDir> {
        if in_image {
            // The image's `/etc` has the resolver file (its upper holds the host's), and its
            // `/run/lock` is made as a host's would be.
            return Ok(RunDir {
                lock: true,
                resolv: None,
                docker_socket: docker_socket.map(c_path).transpose()?,
                kept: KeptInRun::prepare(keep, lent)?,
            });
        }
        let resolv = match std::fs::canonicalize(super::network::RESOLV_CONF) {
            // No resolver file (or a dangling link): the runner gets none either.
            Err(_) => None,
            Ok(resolved) => match resolv_in_run(&resolved)? {
                None => None,
                Some((dirs, file)) => {
                    let text = std::fs::read(&resolved).unwrap_or_default();
                    Some((dirs, file, text))
                }
            },
        };
        Ok(RunDir {
            lock: std::fs::symlink_metadata("/run/lock").is_ok_and(|m| m.is_dir()),
            resolv,
            docker_socket: docker_socket.map(c_path).transpose()?,
            kept: KeptInRun::prepare(keep, lent)?,
        })
    }

    /// Fills the fresh `/run` (with `kept`, [`KeptInRun::detach`]ed before it was mounted), in
    /// the child, as root: raw calls only.
    fn fill(&self, kept: Detached) -> io::Result<()> {
        if self.lock {
            mkdir_here(RUN_LOCK)?;
            // The umask took the sticky and write bits of group and others.
            rustix::fs::chmod(RUN_LOCK, Mode::from_raw_mode(0o1777))?;
        }
        if let Some((dirs, file, text)) = &self.resolv {
            for dir in dirs {
                mkdir_here(dir.as_c_str())?;
            }
            write_new(file.as_c_str(), text)?;
        }
        if let Some(socket) = &self.docker_socket {
            rustix::fs::symlink(socket.as_c_str(), RUN_DOCKER_SOCKET)?;
        }
        self.kept.attach(kept)
    }
}

/// Whether `path` may be a `host.runner_run_keep` entry: an absolute, plain path strictly below
/// `/run` (no `.`, `..`, empty component or trailing `/`), and not one of the places a runner's
/// `/run` has of its own (`/run/lock`, `/run/docker.sock`). Pure.
pub fn run_keep_entry(path: &Path) -> Result<(), String> {
    let text = path.to_string_lossy();
    let below = text
        .strip_prefix("/run/")
        .filter(|below| !below.is_empty())
        .ok_or_else(|| format!("`{text}` is not below /run"))?;
    if below
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!(
            "`{text}` must be a plain path (no `.`, `..`, `//` or trailing `/`)"
        ));
    }
    for own in [RUN_LOCK, RUN_DOCKER_SOCKET] {
        let own = own.to_string_lossy();
        if text == own || text.starts_with(&format!("{own}/")) {
            return Err(format!("`{own}` is each runner's own"));
        }
    }
    Ok(())
}

/// The most entries `host.runner_run_keep` may name: the child holds a descriptor for each in a
/// fixed array (no allocation between fork and exec).
pub const MAX_RUN_KEEP: usize = 16;

/// What of the host's `/run` a runner (and its Docker daemon) keeps in its fresh one
/// (`host.runner_run_keep`), prepared before the fork. Between fork and exec, in the child's
/// new mount namespace and before its `/run` is covered, each entry is cloned as a detached
/// mount ([`KeptInRun::detach`]: `open_tree`, never through a link); once the fresh `/run` is
/// there, each clone is attached at its place in it ([`KeptInRun::attach`]). An entry missing
/// when the runner starts (a service not started yet), or a link (which could lead anywhere of
/// the host), is left out, with a warning when it is known before the fork.
#[derive(Debug, Default)]
pub(crate) struct KeptInRun {
    entries: Vec<Kept>,
}

#[derive(Debug)]
struct Kept {
    /// What is cloned: `target` itself for a kept entry, a directory of the agent's for a lent
    /// one.
    source: CString,
    target: CString,
    /// Attached read-only (and no exec, no devices, no set-uid): a lent directory.
    read_only: bool,
    /// The directories between `/run` and `target`, outermost first.
    parents: Vec<CString>,
    dir: bool,
}

/// [`KeptInRun`]'s detached clones, in its order; `None` where the entry was not there.
pub(crate) struct Detached([Option<OwnedFd>; MAX_RUN_KEEP]);

/// A directory of the agent's a runner gets read-only at a place of its own `/run` (the host's
/// action archives, `policy.cache`): cloned like a kept entry, from anywhere of the host (the
/// agent's data directory, which no runner may enter), then made read-only where it is
/// attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lent {
    /// The agent's directory.
    pub source: PathBuf,
    /// Where the runner finds it: a plain path below `/run` ([`run_keep_entry`]'s rule).
    pub target: PathBuf,
}

impl KeptInRun {
    pub(crate) fn prepare(paths: &[PathBuf], lent: &[Lent]) -> io::Result<KeptInRun> {
        let mut entries = Vec::new();
        let lent_entries = lent.iter().map(|l| (&l.source, &l.target, true));
        let kept_entries = paths.iter().map(|p| (p, p, false));
        // Lent first: what the agent lends is never the entry left out past the bound.
        for (source, path, read_only) in lent_entries.chain(kept_entries).take(MAX_RUN_KEEP) {
            if read_only && run_keep_entry(path).is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a plain place below /run", path.display()),
                ));
            }
            let meta = match std::fs::symlink_metadata(source) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    tracing::warn!(path = %path.display(), "host.runner_run_keep names a link, which a runner does not get: name what it points to");
                    continue;
                }
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::warn!(path = %path.display(), "host.runner_run_keep: not there when this runner starts; it does not get it");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut parents = Vec::new();
            let mut at = PathBuf::from(RUN);
            if let Ok(below) = path.strip_prefix(RUN) {
                let parts: Vec<_> = below.components().collect();
                for part in parts.iter().take(parts.len().saturating_sub(1)) {
                    at.push(part);
                    parents.push(c_path(&at)?);
                }
            }
            entries.push(Kept {
                source: c_path(source)?,
                target: c_path(path)?,
                read_only,
                parents,
                dir: meta.is_dir(),
            });
        }
        Ok(KeptInRun { entries })
    }

    /// Clones each entry as a detached mount, in the child's new mount namespace, before its
    /// `/run` is covered: raw calls only. An entry gone since [`KeptInRun::prepare`] is `None`.
    pub(crate) fn detach(&self) -> io::Result<Detached> {
        use rustix::mount::OpenTreeFlags;
        let mut detached = Detached(Default::default());
        for (kept, slot) in self.entries.iter().zip(detached.0.iter_mut()) {
            match rustix::mount::open_tree(
                rustix::fs::CWD,
                kept.source.as_c_str(),
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(fd) => *slot = Some(fd),
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(detached)
    }

    /// Attaches each clone at its place in the fresh `/run`, in the child, as root: raw calls
    /// only.
    pub(crate) fn attach(&self, detached: Detached) -> io::Result<()> {
        use rustix::mount::{MountFlags, MoveMountFlags};
        for (kept, clone) in self.entries.iter().zip(detached.0) {
            let Some(clone) = clone else { continue };
            for dir in &kept.parents {
                mkdir_here(dir.as_c_str())?;
            }
            if kept.dir {
                mkdir_here(kept.target.as_c_str())?;
            } else {
                // A mount point for a socket or a file: an empty file of root's.
                match rustix::fs::open(
                    kept.target.as_c_str(),
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                ) {
                    Ok(_) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            rustix::mount::move_mount(
                &clone,
                c"",
                rustix::fs::CWD,
                kept.target.as_c_str(),
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )?;
            if kept.read_only {
                rustix::mount::mount_remount(
                    kept.target.as_c_str(),
                    MountFlags::BIND
                        | MountFlags::RDONLY
                        | MountFlags::NOSUID
                        | MountFlags::NODEV
                        | MountFlags::NOEXEC,
                    c"",
                )?;
            }
        }
        Ok(())
    }
}

/// Creates `path` (mode 0644, root's) with `bytes`, between fork and exec (a runner's fresh
/// `/run`, its Docker daemon's): raw calls only.
pub(crate) fn write_new(path: &std::ffi::CStr, bytes: &[u8]) -> io::Result<()> {
    let fd = rustix::fs::open(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = rustix::io::write(&fd, rest)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        rest = &rest[n..];
    }
    Ok(())
}

/// `mkdir` (mode 0755 under a umask of 022), an existing one taken as it is; between fork and
/// exec: raw calls only.
pub(crate) fn mkdir_here(dir: &std::ffi::CStr) -> io::Result<()> {
    match rustix::fs::mkdir(dir, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `keyctl(2)` operations and special keyring ids (linux/keyctl.h).
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
const KEYCTL_CLEAR: libc::c_long = 7;
const KEY_SPEC_USER_KEYRING: libc::c_long = -4;
const KEY_SPEC_USER_SESSION_KEYRING: libc::c_long = -5;

/// The exit status a process killed by a signal is reported with by the runner's ancestors in
/// the agent's namespace (as a shell reports it).
const SIGNALLED_EXIT_BASE: i32 = 128;

/// What the child does between fork and exec, prepared before the fork.
#[derive(Debug)]
pub(crate) struct ChildSetup {
    account: Account,
    /// The runner cgroup's `cgroup.procs`, opened by the agent (close-on-exec).
    cgroup_procs: Option<OwnedFd>,
    /// The runner's network namespace (`host.network = "private"`), joined first.
    netns: Option<OwnedFd>,
    /// The shared writable places that exist on this host, each to get a private tmpfs, with
    /// its mount options ([`tmpfs_options`]).
    private_dirs: Vec<(CString, CString)>,
    /// The runner's host name in its UTS namespace.
    hostname: CString,
    /// The runtime, if it lies under one of `private_dirs` (the tmpfs would hide it): the
    /// directories from that place down to the runtime, recreated in the tmpfs, and the runtime
    /// bind-mounted back from `runtime_fd`.
    rebind: Option<Rebind>,
    pids_max: Option<u32>,
    /// What the fresh `/run` gets back; `None` where the host has no `/run` directory.
    run: Option<RunDir>,
    /// The runner's root is an image (`policy.image`): entered before the private places are
    /// made, which are then the image's.
    image: Option<super::image_root::ImageRootSetup>,
    /// The host declares devices: every mount `nodev`, then a `/dev` of the runner's own with
    /// exactly these nodes ([`super::devices`]). `None`: the host's `/dev` (an image's own).
    devices: Option<super::devices::DevSetup>,
}

/// The runtime is the child's working directory (std changes into it before the setup runs),
/// and `unshare` moves the working directory onto the new namespace's copy of its mount, so
/// `.` stays the runtime after the tmpfs hides its path and can be bound back there.
#[derive(Debug)]
struct Rebind {
    /// The directories to create inside the tmpfs, outermost first, ending with the runtime.
    dirs: Vec<CString>,
}

/// What [`ChildSetup`] gives a runner besides its uid.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub cgroup_procs: Option<OwnedFd>,
    pub netns: Option<OwnedFd>,
    pub pids_max: Option<u32>,
    pub memory_max: Option<u64>,
    pub hostname: String,
    /// The runner's Docker daemon's socket (`policy.docker`), linked at `/run/docker.sock`.
    pub docker_socket: Option<PathBuf>,
    /// `host.runner_run_keep`: what of the host's `/run` the runner keeps.
    pub run_keep: Vec<PathBuf>,
    /// Directories of the agent's the runner gets read-only in its `/run` (counted with
    /// `run_keep` against [`MAX_RUN_KEEP`]).
    pub lent: Vec<Lent>,
    /// The image root (`policy.image`), prepared ([`super::image_root::prepare`]).
    pub image: Option<super::image_root::ImageRootSetup>,
    /// The device nodes the runner gets in a `/dev` of its own, on a host that declares
    /// devices ([`super::devices::DevSetup::prepare`]); `None`: the host declares none.
    pub devices: Option<super::devices::DevSetup>,
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

impl ChildSetup {
    /// Prepares the steps for a runner of `account` in `runtime`.
    pub(crate) fn new(
        account: Account,
        runtime: &Path,
        sandbox: Sandbox,
    ) -> io::Result<ChildSetup> {
        let mut private_dirs = Vec::new();
        let mut rebind = None;
        let in_image = sandbox.image.is_some();
        for dir in PRIVATE_DIRS {
            // A link (e.g. /var/lock -> /run/lock) is not mounted over: its target is, if listed.
            // An image root has every one (made in it where the image lacks them).
            let is_dir = in_image || std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
            if !is_dir {
                continue;
            }
            let options = CString::new(tmpfs_options(dir, sandbox.memory_max))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            private_dirs.push((c_path(Path::new(dir))?, options));
            if rebind.is_none() && runtime.starts_with(dir) {
                let below = runtime.strip_prefix(dir).unwrap_or(runtime);
                let mut dirs = Vec::new();
                let mut at = PathBuf::from(dir);
                for part in below.components() {
                    at.push(part);
                    dirs.push(c_path(&at)?);
                }
                rebind = Some(Rebind { dirs });
            }
        }
        let invalid = |e| io::Error::new(io::ErrorKind::InvalidInput, e);
        let run = if private_dirs
            .iter()
            .any(|(dir, _)| dir.as_bytes() == RUN.as_bytes())
        {
            Some(RunDir::prepare(
                sandbox.docker_socket.as_deref(),
                &sandbox.run_keep,
                &sandbox.lent,
                in_image,
            )?)
        } else {
            None
        };
        Ok(ChildSetup {
            run,
            account,
            cgroup_procs: sandbox.cgroup_procs,
            netns: sandbox.netns,
            private_dirs,
            hostname: CString::new(sandbox.hostname).map_err(invalid)?,
            rebind,
            pids_max: sandbox.pids_max,
            image: sandbox.image,
            devices: sandbox.devices,
        })
    }

    /// Adds the steps to `command`: they run in the child after `fork`, before `exec`.
    #[allow(unsafe_code)]
    pub(crate) fn install(self, command: &mut Command) {
        let setup = self;
        // SAFETY: `pre_exec` runs the closure in the forked child of a multi-threaded process,
        // where only async-signal-safe operations are sound. `apply` makes raw system calls
        // (rustix's linux_raw backend, and `libc::syscall` for `clone` and `keyctl`, never
        // glibc's `fork` with its atfork handlers) on paths and descriptors prepared before
        // the fork (`CStr`s passed by reference, no conversion), takes no lock and allocates
        // nothing; its errors are plain errno values.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || setup.apply());
        }
    }

    /// The child's steps, in the order that makes each one count: into the cgroup first (so
    /// everything after is accounted for and killable), the namespaces while still root, then
    /// the PID namespace's first process, the limits, and the identity last (after it nothing
    /// privileged is possible).
    ///
    /// Three processes come of it. This one (outside the runner's PID namespace, the pid the
    /// agent journals) waits for the namespace's first process and exits as it does; that one
    /// (pid 1 inside, root, with the job's `/proc` mounted) reaps what the job orphans and
    /// exits as the runner does, which kills whatever is left in the namespace; the third
    /// becomes the runner. The two waiters ignore SIGTERM and SIGINT, so a stop's SIGTERM to
    /// the process group reaches the runner alone and the agent sees its child exit when the
    /// runner has.
    #[allow(unsafe_code)]
    fn apply(&self) -> io::Result<()> {
        use rustix::mount::{MountFlags, MountPropagationFlags};
        use rustix::thread::UnshareFlags;
        // First: the directories made below go through it (the agent's 077 would make the way
        // to the runtime unsearchable for the runner).
        rustix::process::umask(Mode::from_raw_mode(RUNNER_UMASK));
        if let Some(procs) = &self.cgroup_procs {
            // "0" moves the writing process itself.
            rustix::io::write(procs.as_fd(), b"0")?;
        }
        if let Some(netns) = &self.netns {
            rustix::thread::move_into_link_name_space(
                netns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
        }
        // A mount namespace of its own (the private tmpfs below), an IPC namespace of its own
        // (System V shared memory, semaphores and message queues a job leaves die with it), a
        // host name of its own, and a PID namespace for its children (below).
        let namespaces = UnshareFlags::NEWNS
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWUTS
            | UnshareFlags::NEWPID;
        // SAFETY: the child is single-threaded, so unsharing its namespaces affects no other
        // thread; no file system or IPC state is shared with another thread of this process.
        unsafe { rustix::thread::unshare_unsafe(namespaces)? };
        // Mounts made in here must not propagate back to the host.
        rustix::mount::mount_change(
            c"/",
            MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
        )?;
        // On a device host, before anything of the host is cloned into this namespace (what
        // is kept of `/run`, an image runner's runtime): no device node outside the runner's
        // own `/dev`, made after this, opens.
        if self.devices.is_some() {
            super::devices::nodev_everywhere()?;
        }
        // What the operator keeps of the host's `/run`, taken before the fresh one covers it.
        let kept = match &self.run {
            Some(run) => Some(run.kept.detach()?),
            None => None,
        };
        if let Some(image) = &self.image {
            image.enter(self.devices.as_ref())?;
        } else if let Some(devices) = &self.devices {
            // Before the private tmpfs on `/dev/shm`, which this `/dev` would hide.
            super::devices::private_dev(Some(devices))?;
        }
        let flags = MountFlags::NOSUID | MountFlags::NODEV;
        for (dir, options) in &self.private_dirs {
            rustix::mount::mount(
                c"tmpfs",
                dir.as_c_str(),
                c"tmpfs",
                flags,
                options.as_c_str(),
            )?;
        }
        if let (Some(run), Some(kept)) = (&self.run, kept) {
            run.fill(kept)?;
        }
        if let Some(rebind) = &self.rebind {
            for dir in &rebind.dirs {
                match rustix::fs::mkdir(dir.as_c_str(), Mode::from_raw_mode(0o711)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(runtime) = rebind.dirs.last() {
                rustix::mount::mount_bind(c".", runtime.as_c_str())?;
            }
        }
        rustix::system::sethostname(self.hostname.as_bytes())?;
        set_stop_signals(libc::SIG_IGN)?;
        // SAFETY: a raw `clone` without glibc's atfork handlers (see `install`); both sides
        // go on with raw system calls only.
        let first = unsafe { fork_raw()? };
        if first != 0 {
            wait_and_exit_as(first);
        }
        // Pid 1 of the runner's PID namespace.
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
        rustix::mount::mount(
            c"proc",
            c"/proc",
            c"proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            c"",
        )?;
        // SAFETY: as above.
        let runner = unsafe { fork_raw()? };
        if runner != 0 {
            reap_until(runner);
        }
        set_stop_signals(libc::SIG_DFL)?;
        if let Some(max) = self.pids_max {
            limit_processes(max)?;
        }
        rustix::thread::set_no_new_privs(true)?;
        rustix::thread::clear_ambient_capability_set()?;
        let gid = rustix::process::Gid::from_raw(self.account.gid);
        let uid = rustix::process::Uid::from_raw(self.account.uid);
        rustix::thread::set_thread_groups(&[])?;
        rustix::thread::set_thread_res_gid(gid, gid, gid)?;
        // From root to a non-zero uid: the kernel clears every capability.
        rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        join_own_session_keyring()
    }
}

/// Caps the processes (and threads) of the calling process's real uid at `max`
/// (`RLIMIT_NPROC`, soft and hard), between fork and exec, as root before the identity changes.
/// Counted per real uid: a runner's uid is its own, so this caps the job's processes even where
/// the cgroup pids controller is not available. Since Linux 5.14 the count is kept per user
/// namespace and charged up to the namespace's creator too, and the limit a user namespace
/// enforces for its creator is the creator's own `RLIMIT_NPROC` when it made it: so a runner's
/// Docker daemon started under this cap bounds its containers as well, whatever subordinate
/// uid they run as (`docker::launch`). Raw system call only: async-signal-safe.
pub(crate) fn limit_processes(max: u32) -> io::Result<()> {
    let limit = u64::from(max);
    rustix::process::setrlimit(
        rustix::process::Resource::Nproc,
        rustix::process::Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )?;
    Ok(())
}

/// Joins a new, empty session keyring owned by the caller's (new) uid, after the identity
/// changed: not the agent's (which every runner, or a runner's Docker daemon, would otherwise
/// possess, with the keys in it), nor the root-owned one `process::seal_session` made before
/// the change. Raw system call only: async-signal-safe.
#[allow(unsafe_code)]
pub(crate) fn join_own_session_keyring() -> io::Result<()> {
    // SAFETY: `keyctl` with integer arguments only.
    let joined = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if joined < 0 {
        let e = rustix::io::Errno::from_raw_os_error(errno());
        // A kernel without keyrings has none to share.
        if e != rustix::io::Errno::NOSYS {
            return Err(e.into());
        }
    }
    Ok(())
}

/// Sets the disposition of the signals a stop sends (SIGTERM) and a terminal sends (SIGINT).
#[allow(unsafe_code)]
fn set_stop_signals(handler: libc::sighandler_t) -> io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `signal` with SIG_IGN or SIG_DFL installs no handler code; async-signal-safe.
        if unsafe { libc::signal(signal, handler) } == libc::SIG_ERR {
            return Err(io::Error::from_raw_os_error(errno()));
        }
    }
    Ok(())
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// `fork` as a raw `clone(SIGCHLD)`: the child's pid in the parent, 0 in the child.
///
/// # Safety
/// The child of a multi-threaded process may only make async-signal-safe calls.
#[allow(unsafe_code)]
unsafe fn fork_raw() -> io::Result<i32> {
    // SAFETY: the caller's contract; no stack is given, so the child runs on a copy of ours.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_long::from(libc::SIGCHLD),
            0 as libc::c_long,
            0 as libc::c_long,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    if pid < 0 {
        return Err(io::Error::from_raw_os_error(errno()));
    }
    i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Closes every descriptor above stderr (a waiter holds nothing, so the spawning agent sees
/// the runner's `exec` as the end of its start).
#[allow(unsafe_code)]
fn close_inherited() {
    // SAFETY: `close_range` on integers; nothing of this process uses the descriptors after.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
    }
}

/// The exit status that reports `status` one level up.
fn exit_code(status: rustix::process::WaitStatus) -> i32 {
    if let Some(code) = status.exit_status() {
        code
    } else if let Some(signal) = status.terminating_signal() {
        SIGNALLED_EXIT_BASE + signal
    } else {
        1
    }
}

/// The outer waiter: waits for `child`, then exits as it did. Never returns.
#[allow(unsafe_code)]
fn wait_and_exit_as(child: i32) -> ! {
    close_inherited();
    let pid = rustix::process::Pid::from_raw(child);
    let code = loop {
        match rustix::process::waitpid(pid, rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => break exit_code(status),
            Err(rustix::io::Errno::INTR) | Ok(None) => {}
            Err(_) => break 1,
        }
    };
    // SAFETY: `_exit` runs no destructor or atexit handler (the agent's, copied by the fork).
    unsafe { libc::_exit(code) }
}

/// Pid 1 of the runner's namespace: reaps every process the job orphans until the runner
/// itself exits, then exits as it did (the kernel then kills what is left inside). Never
/// returns.
#[allow(unsafe_code)]
fn reap_until(runner: i32) -> ! {
    close_inherited();
    let code = loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get() == runner => {
                break exit_code(status);
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break 1,
        }
    };
    // SAFETY: as in `wait_and_exit_as`.
    unsafe { libc::_exit(code) }
}

/// Empties a uid's user keyrings (`@u`, `@us`) before the uid is released: keys a job added
/// there would otherwise wait for the uid's next job. A child of the agent switches to the uid
/// (a user keyring is reachable only as its owner) and clears them.
#[allow(unsafe_code)]
pub(crate) fn clear_keyrings(account: Account) -> io::Result<()> {
    // SAFETY: the child makes raw system calls only and leaves with `_exit`.
    let pid = unsafe { fork_raw()? };
    if pid == 0 {
        let gid = rustix::process::Gid::from_raw(account.gid);
        let uid = rustix::process::Uid::from_raw(account.uid);
        let switched = rustix::thread::set_thread_groups(&[])
            .and_then(|()| rustix::thread::set_thread_res_gid(gid, gid, gid))
            .and_then(|()| rustix::thread::set_thread_res_uid(uid, uid, uid));
        let mut code = i32::from(switched.is_err());
        if switched.is_ok() {
            for keyring in [KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING] {
                // SAFETY: `keyctl` with integer arguments only.
                let cleared = unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_CLEAR, keyring) };
                if cleared < 0 && errno() != libc::ENOSYS {
                    code = 2;
                }
            }
        }
        // SAFETY: as in `wait_and_exit_as`.
        unsafe { libc::_exit(code) }
    }
    let child = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let status = loop {
        match rustix::process::waitpid(Some(child), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => break status,
            Err(rustix::io::Errno::INTR) | Ok(None) => {}
            Err(e) => return Err(e.into()),
        }
    };
    match status.exit_status() {
        Some(0) => Ok(()),
        other => Err(io::Error::other(format!(
            "could not clear the keyrings of uid {} (status {other:?})",
            account.uid
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_read_from_passwd_lines() {
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\nci-1:x:1001:1500::/home/ci-1:/bin/sh\nbad-line\n";
        assert_eq!(
            lookup_account(passwd, "ci-1"),
            Some(Account {
                uid: 1001,
                gid: 1500
            })
        );
        assert_eq!(lookup_account(passwd, "ci"), None);
        assert_eq!(lookup_account(passwd, "bad-line"), None);
    }

    #[test]
    fn a_uid_held_or_in_use_is_never_picked() {
        let pool = Pool::new((10..13).map(|uid| Account { uid, gid: uid }).collect());
        let none = HashSet::new();
        assert_eq!(pick_uid(&pool, &[], &none).map(|a| a.uid), Some(10));
        assert_eq!(pick_uid(&pool, &[10], &none).map(|a| a.uid), Some(11));
        let running: HashSet<u32> = [11].into();
        assert_eq!(pick_uid(&pool, &[10], &running).map(|a| a.uid), Some(12));
        assert_eq!(pick_uid(&pool, &[10, 12], &running), None);
        assert_eq!(pool.gid_of(11), 11);
        assert_eq!(pool.gid_of(99), 99);
    }

    #[test]
    fn capabilities_are_read_from_the_status_mask() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t00000000000000c0\n";
        assert_eq!(effective_capabilities(status), Some(0xc0));
        assert_eq!(effective_capabilities("Name: x\n"), None);
    }

    #[test]
    fn an_isolated_runner_has_its_home_and_temporary_directories_in_its_runtime() {
        let env = isolated_environment(
            [
                ("HOME".into(), "/root".into()),
                ("USER".into(), "root".into()),
                ("PATH".into(), "/usr/bin".into()),
                ("RM_WEBHOOK_SECRET".into(), "s".into()),
            ],
            Path::new("/r/abc"),
        );
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("HOME").as_deref(), Some("/r/abc/home"));
        assert_eq!(
            get("XDG_CONFIG_HOME").as_deref(),
            Some("/r/abc/home/.config")
        );
        assert_eq!(get("XDG_RUNTIME_DIR").as_deref(), Some("/r/abc/tmp"));
        assert_eq!(get("TMPDIR").as_deref(), Some("/r/abc/tmp"));
        assert_eq!(get("PATH").as_deref(), Some("/usr/bin"));
        assert_eq!(get("USER"), None);
        assert_eq!(get("RM_WEBHOOK_SECRET"), None);
        let keys: Vec<_> = env.iter().map(|(k, _)| k.clone()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(keys, sorted, "sorted, each once");
    }

    /// A key a job put into its uid's user keyring is gone once the uid is cleaned up (the
    /// control: before the clearing, the next process of the uid sees it).
    #[test]
    #[allow(unsafe_code, reason = "the test adds a key as a job of the uid would")]
    fn a_uids_user_keyring_is_emptied_before_the_uid_is_released() {
        if !rustix::process::geteuid().is_root() {
            crate::test_skip::cannot_run(
                "a_uids_user_keyring_is_emptied_before_the_uid_is_released",
                "root",
                "only root can act as another uid",
            );
            return;
        }
        let uid = 3_200_000 + std::process::id() % 100_000;
        let account = Account { uid, gid: uid };
        // Starts `true` as the uid: with `add`, first adds a key to its user keyring; returns
        // whether the key is in that keyring (searched as the uid, as its next job would).
        let as_uid = |add: bool| -> bool {
            let mut command = Command::new("true");
            // SAFETY: raw system calls between fork and exec.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    let id = rustix::process::Uid::from_raw(uid);
                    let gid = rustix::process::Gid::from_raw(uid);
                    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
                    rustix::thread::set_thread_res_uid(id, id, id)?;
                    if add
                        && libc::syscall(
                            libc::SYS_add_key,
                            c"user".as_ptr(),
                            c"rm-user-keyring-test".as_ptr(),
                            c"x".as_ptr(),
                            1usize,
                            KEY_SPEC_USER_KEYRING,
                        ) < 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                    // KEYCTL_SEARCH: found is reported as EEXIST (the start then fails).
                    let found = libc::syscall(
                        libc::SYS_keyctl,
                        10 as libc::c_long,
                        KEY_SPEC_USER_KEYRING,
                        c"user".as_ptr(),
                        c"rm-user-keyring-test".as_ptr(),
                        0 as libc::c_long,
                    );
                    if found >= 0 {
                        return Err(io::Error::from_raw_os_error(libc::EEXIST));
                    }
                    Ok(())
                });
            }
            match command.status() {
                Ok(_) => false,
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => true,
                Err(e) => panic!("{e}"),
            }
        };
        assert!(as_uid(true), "the key was not added");
        assert!(as_uid(false), "the control: the key outlives its process");
        clear_keyrings(account).unwrap();
        assert!(!as_uid(false), "the key outlived the cleanup");
    }

    #[test]
    fn what_of_the_hosts_run_may_be_kept() {
        for (path, problem) in [
            ("/run/postgresql/.s.PGSQL.5432", None),
            ("/run/dbus/system_bus_socket", None),
            ("/run/sccache", None),
            ("/run", Some("not below /run")),
            ("/run/", Some("not below /run")),
            ("/var/run/dbus", Some("not below /run")),
            ("run/dbus", Some("not below /run")),
            ("/run/../etc/shadow", Some("plain path")),
            ("/run/dbus/", Some("plain path")),
            ("/run//dbus", Some("plain path")),
            ("/run/./dbus", Some("plain path")),
            ("/run/lock", Some("each runner's own")),
            ("/run/lock/x", Some("each runner's own")),
            ("/run/docker.sock", Some("each runner's own")),
            ("/run/locked", None),
        ] {
            let said = run_keep_entry(Path::new(path));
            match problem {
                None => assert_eq!(said, Ok(()), "{path}"),
                Some(words) => assert!(
                    said.as_ref().is_err_and(|e| e.contains(words)),
                    "{path}: {said:?}"
                ),
            }
        }
    }

    #[test]
    fn a_secret_file_a_runner_uid_could_read_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "k").unwrap();
        let pool = Pool::new(vec![Account {
            uid: 64200,
            gid: 64200,
        }]);
        let set = |mode: u32| {
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            std::fs::metadata(&file).unwrap()
        };
        assert!(readable_by_runners(&set(0o644), &pool).is_some());
        assert_eq!(readable_by_runners(&set(0o600), &pool), None);
        assert_eq!(readable_by_runners(&set(0o640), &pool), None);
    }
}
