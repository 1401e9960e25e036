//! A cgroup v2 per runner: finding the subtree the agent may manage (its own delegated cgroup, or
//! the directory `host.cgroup_root` names), enabling the limit controllers for its children,
//! creating a runner's cgroup with its limits, and killing everything in a runner's cgroup before
//! removing it. A runner cannot leave its cgroup (runner uids cannot write cgroupfs), so the
//! cgroup is what makes "nothing a job starts survives its conclusion" hold even for processes
//! that double-fork and `setsid` away from the runner's process group.
//!
//! Paths and values are parsed by pure functions ([`cgroup2_mounts`], [`own_cgroup_path`],
//! [`parse_controllers`], [`parse_populated`], [`limit_writes`], [`cpu_max_value`],
//! [`parse_cpu_usage`], [`parse_memory_peak`]); the rest are thin wrappers around cgroupfs
//! reads and writes, among them what a runner used ([`read_usage`]).

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write as _};
use std::ops::RangeInclusive;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{Access, Mode, OFlags};
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::Removal;

/// The leaf the agent moves itself into when its own cgroup is not the kernel's root cgroup:
/// cgroup v2 lets a cgroup hand controllers to its children only while it holds no processes
/// itself (the "no internal processes" rule), so the agent must not stay in the cgroup whose
/// children are the runners.
pub(crate) const AGENT_LEAF: &str = "rm-agent";

/// The directory runner cgroups go in when the agent runs in the kernel's root cgroup (no
/// systemd unit, no container): the root's other children belong to the rest of the host, and a
/// recovery sweep over [`CgroupRoot::children`] must only ever see runners.
pub(crate) const ROOT_RUNNERS: &str = "rm-runners";

/// How long [`kill_and_remove`] waits for a cgroup to empty after killing it. Killed processes
/// normally exit in milliseconds; one stuck in uninterruptible sleep (a hung NFS mount) holds
/// the cgroup until it wakes, and the caller retries later instead of blocking the agent.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

/// How often [`kill_and_remove`] looks at `cgroup.events` while waiting (and, without
/// `cgroup.kill`, signals the processes again).
pub(crate) const KILL_POLL: Duration = Duration::from_millis(20);

/// The range the kernel accepts for `cpu.weight`.
pub(crate) const CPU_WEIGHT_RANGE: RangeInclusive<u32> = 1..=10_000;

/// The period of a runner's `cpu.max`, in microseconds: the kernel's default (100 ms), over
/// which a quota of `millis * CPU_QUOTA_US_PER_MILLI` is a share of `millis / 1000` CPUs.
pub const CPU_MAX_PERIOD_US: u64 = 100_000;

/// Microseconds of quota per [`CPU_MAX_PERIOD_US`] for one CPU milli (1000 millis: one whole
/// period, one CPU).
pub const CPU_QUOTA_US_PER_MILLI: u64 = CPU_MAX_PERIOD_US / 1000;

/// The smallest quota the kernel takes in `cpu.max` (1 ms): a smaller share is raised to it.
pub const CPU_MIN_QUOTA_US: u64 = 1_000;

/// Prefix of the probe cgroup [`CgroupRoot::resolve`] creates and removes. The `.` keeps it
/// apart from every runner name (see [`valid_runner_name`]).
const PROBE_PREFIX: &str = "rm-probe.";

/// Held by tests while they resolve a root: a resolution makes (and removes) a probe cgroup
/// named after this process, which a test that looks for leftover probes would otherwise see
/// from another test's thread.
#[cfg(test)]
pub(crate) static TEST_RESOLVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `f_type` of a cgroup v2 filesystem (`statfs(2)`).
const CGROUP2_SUPER_MAGIC: i128 = 0x6367_7270;

/// How deep [`kill_and_remove`] descends into child cgroups. Runners cannot create cgroups, so
/// anything below a runner cgroup came from the agent or an administrator; the bound only keeps
/// a pathological tree from exhausting the stack.
const MAX_NESTING: usize = 64;

const MOUNTINFO: &str = "/proc/self/mountinfo";
const PROC_SELF_CGROUP: &str = "/proc/self/cgroup";

/// Distinguishes probe cgroups of concurrent resolutions in one process (tests do this).
static PROBE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What can go wrong with cgroups. Each message names the path and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}; the agent needs /proc mounted to find its cgroup")]
    Proc { path: PathBuf, source: io::Error },
    #[error(
        "no cgroup v2 filesystem is mounted; mount one (or boot with systemd.unified_cgroup_hierarchy=1), or set host.isolation = \"none\""
    )]
    NoCgroup2,
    #[error(
        "/proc/self/cgroup names no cgroup v2 path the agent can reach ({own:?}); run the agent in a cgroup under the cgroup v2 mount, or set host.cgroup_root"
    )]
    OwnCgroup { own: String },
    #[error(
        "host.cgroup_root {path} is not a directory inside a cgroup v2 mount; set it to a directory under {mounts}"
    )]
    NotCgroup2 { path: PathBuf, mounts: String },
    #[error(
        "cannot move the agent into {leaf}: {source}; delegate the agent's cgroup to it (systemd: Delegate=yes) or set host.cgroup_root"
    )]
    Leaf { leaf: PathBuf, source: io::Error },
    #[error(
        "the agent cannot create cgroups under {path}: {source}; delegate the agent's cgroup to it (systemd: Delegate=yes) or set host.cgroup_root to a writable directory under the cgroup v2 mount"
    )]
    NotWritable { path: PathBuf, source: io::Error },
    #[error(
        "{name:?} cannot name a runner cgroup; use letters, digits, `_` and `-` only, and not `{AGENT_LEAF}`"
    )]
    Name { name: String },
    #[error("cpu_weight {weight} is outside {}..={}; set a weight in that range", CPU_WEIGHT_RANGE.start(), CPU_WEIGHT_RANGE.end())]
    CpuWeight { weight: u32 },
    #[error(
        "cannot create the runner cgroup {path}: {source}; check that the cgroup root is still delegated to the agent"
    )]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write {value} to {path}: {source}; lower or remove the policy's limit")]
    Limit {
        path: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error(
        "refusing to kill {path}: it is not a runner cgroup ({why}); pass a cgroup below the cgroup root"
    )]
    NotRunnerCgroup { path: PathBuf, why: &'static str },
    #[error(
        "cannot kill the processes of {path}: {source}; check that the cgroup root is still delegated to the agent"
    )]
    Kill { path: PathBuf, source: io::Error },
    #[error(
        "{path} still holds processes {waited:?} after they were killed; they are probably stuck in uninterruptible sleep: retry later"
    )]
    StillPopulated { path: PathBuf, waited: Duration },
    #[error(
        "cannot remove the cgroup {path}: {source}; remove it by hand once it is empty (rmdir, bottom-up)"
    )]
    Remove { path: PathBuf, source: io::Error },
}

/// A cgroup v2 mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup2Mount {
    /// The cgroup mounted there (field 4): `/` for the whole hierarchy (or a cgroup namespace's
    /// root), a cgroup path when a subtree is bind-mounted (containers without cgroupns).
    pub root: String,
    /// Where it is mounted (field 5).
    pub mount_point: PathBuf,
}

/// Every cgroup v2 mount in a `/proc/self/mountinfo` text, in file order.
pub fn cgroup2_mounts(mountinfo: &str) -> Vec<Cgroup2Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Fields 7.. are optional tags ended by a lone `-`; the filesystem type follows it.
            let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            if *fields.get(dash + 1)? != "cgroup2" {
                return None;
            }
            Some(Cgroup2Mount {
                root: unescape_mountinfo(fields.get(3)?),
                mount_point: PathBuf::from(unescape_mountinfo(fields.get(4)?)),
            })
        })
        .collect()
}

/// The mount point of the first cgroup v2 filesystem in a `/proc/self/mountinfo` text.
#[cfg(test)]
pub(crate) fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    cgroup2_mounts(mountinfo)
        .into_iter()
        .next()
        .map(|m| m.mount_point)
}

/// Undoes the kernel's octal escapes of space, tab, newline and backslash (`\040`, `\011`,
/// `\012`, `\134`) in a mountinfo path. Anything else is kept as written.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = bytes.get(i + 1..i + 4)
            && code.iter().all(|b| (b'0'..=b'7').contains(b))
            && let Ok(byte) = u8::from_str_radix(&String::from_utf8_lossy(code), 8)
        {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path (the `0::<path>` line) of a `/proc/self/cgroup` text.
pub fn own_cgroup_path(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|path| path.trim_end().to_owned())
        .filter(|path| path.starts_with('/'))
}

/// Where the cgroup `own` (a `/proc/self/cgroup` path) is in the filesystem: under the first
/// mount whose cgroup is `own` or one of its ancestors.
pub fn cgroup_dir(mounts: &[Cgroup2Mount], own: &str) -> Option<PathBuf> {
    mounts.iter().find_map(|mount| {
        let rest = Path::new(own).strip_prefix(&mount.root).ok()?;
        // `..` would climb out of the mount: a cgroup outside this namespace's view.
        if rest
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return None;
        }
        Some(if rest.as_os_str().is_empty() {
            mount.mount_point.clone()
        } else {
            mount.mount_point.join(rest)
        })
    })
}

/// The limit controllers a cgroup offers or hands to its children.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Controllers {
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
}

/// Parses a `cgroup.controllers` or `cgroup.subtree_control` line (`cpu io memory pids`).
pub fn parse_controllers(text: &str) -> Controllers {
    let mut controllers = Controllers::default();
    for name in text.split_whitespace() {
        match name {
            "memory" => controllers.memory = true,
            "pids" => controllers.pids = true,
            "cpu" => controllers.cpu = true,
            _ => {}
        }
    }
    controllers
}

/// A runner's limits (a policy's `memory_max`, `pids_max`, `cpu_weight`, a job's shape's CPUs:
/// the agent's configuration parses into this type); `None` leaves the kernel's default (no
/// limit, weight 100).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Bytes.
    pub memory_max: Option<u64>,
    pub pids_max: Option<u32>,
    /// 1..=10000 (cgroup v2 `cpu.weight`).
    pub cpu_weight: Option<u32>,
    /// CPU millis (1000: one CPU), a hard bound: cgroup v2 `cpu.max` ([`cpu_max_value`]).
    pub cpu_max: Option<u64>,
}

impl Limits {
    /// The limits asked for whose controller the cgroup root does not offer, by their policy
    /// key (`memory_max`, `pids_max`, `cpu_weight`, and `cpu` for a shape's CPUs):
    /// [`CgroupRoot::create`] skips them and the caller says so.
    pub fn unapplied(&self, available: Controllers) -> Vec<&'static str> {
        [
            (self.memory_max.is_some() && !available.memory, "memory_max"),
            (self.pids_max.is_some() && !available.pids, "pids_max"),
            (self.cpu_weight.is_some() && !available.cpu, "cpu_weight"),
            (self.cpu_max.is_some() && !available.cpu, "cpu"),
        ]
        .into_iter()
        .filter_map(|(skipped, key)| skipped.then_some(key))
        .collect()
    }
}

/// The control files to write, and what, for `limits` under the `available` controllers.
pub(crate) fn limit_writes(
    limits: &Limits,
    available: Controllers,
) -> Result<Vec<(&'static str, String)>, CgroupError> {
    let mut writes = Vec::new();
    if let Some(bytes) = limits.memory_max.filter(|_| available.memory) {
        writes.push(("memory.max", bytes.to_string()));
        // Out of memory, the whole job goes, not one process picked from it: a job left with
        // half its processes is worse than a failed one (and its runner reports the failure).
        writes.push(("memory.oom.group", "1".to_owned()));
    }
    if let Some(pids) = limits.pids_max.filter(|_| available.pids) {
        writes.push(("pids.max", pids.to_string()));
    }
    if let Some(weight) = limits.cpu_weight {
        // Checked even when the controller is missing: a bad value is a configuration error
        // on every host.
        if !CPU_WEIGHT_RANGE.contains(&weight) {
            return Err(CgroupError::CpuWeight { weight });
        }
        if available.cpu {
            writes.push(("cpu.weight", weight.to_string()));
        }
    }
    if let Some(millis) = limits.cpu_max.filter(|_| available.cpu) {
        writes.push(("cpu.max", cpu_max_value(millis)));
    }
    Ok(writes)
}

/// The `cpu.max` text for a bound of `millis` CPU millis: `"<quota> <period>"`, the quota
/// `millis * 100` µs per [`CPU_MAX_PERIOD_US`] (so 1000 millis is one CPU's whole period, 2500
/// two and a half CPUs' across several), never below the kernel's [`CPU_MIN_QUOTA_US`]. Pure.
pub fn cpu_max_value(millis: u64) -> String {
    let quota = millis
        .saturating_mul(CPU_QUOTA_US_PER_MILLI)
        .max(CPU_MIN_QUOTA_US);
    format!("{quota} {CPU_MAX_PERIOD_US}")
}

/// Whether `name` can name a runner cgroup: `[A-Za-z0-9_-]+` and not [`AGENT_LEAF`]. No `.`, so
/// no name is `..`, a probe, or a systemd unit of the host.
pub(crate) fn valid_runner_name(name: &str) -> bool {
    !name.is_empty()
        && name != AGENT_LEAF
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Parses `memory.events` for its `oom_kill` count: processes of the cgroup (or below it) the
/// kernel's OOM killer ended. `None` without the key (a kernel before 4.13).
pub fn parse_oom_kills(events: &str) -> Option<u64> {
    events.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

/// What a runner cgroup says of its memory: OOM kills (`memory.events`) and the peak
/// (`memory.peak`, kernel 5.19+). Zero and `None` where the memory controller is off (no
/// such files), which is also where no limit could be set.
pub fn memory_report(path: &Path) -> (u64, Option<u64>) {
    let kills = fs::read_to_string(path.join("memory.events"))
        .ok()
        .and_then(|events| parse_oom_kills(&events))
        .unwrap_or(0);
    let peak = fs::read_to_string(path.join("memory.peak"))
        .ok()
        .and_then(|peak| parse_memory_peak(&peak));
    (kills, peak)
}

/// What a runner used, read from its cgroup at the end of its run ([`read_usage`]): what the
/// operator right-sizes its shapes by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// The most memory the cgroup held at once, in bytes (`memory.peak`: the memory controller
    /// and Linux 5.19); `None` where it is not there.
    pub peak_memory: Option<u64>,
    /// The CPU time its processes used, in microseconds (`cpu.stat`'s `usage_usec`, in every
    /// cgroup v2 cgroup with or without the cpu controller); `None` where it cannot be read.
    pub cpu_usec: Option<u64>,
}

/// Parses `cpu.stat` for its `usage_usec` key: the CPU time (user and system) of the cgroup's
/// processes, in microseconds. Pure.
pub fn parse_cpu_usage(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "usage_usec").then(|| value.trim().parse().ok())?
    })
}

/// Parses `memory.peak`: one number of bytes. Pure.
pub fn parse_memory_peak(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// What the runner cgroup at `cgroup_dir` used ([`Usage`]): read it at the end of the runner's
/// run, before [`kill_and_remove`] removes the cgroup. A file that is missing or unreadable
/// leaves its number `None`: what a runner used is a report, never a reason to fail cleanup.
pub fn read_usage(cgroup_dir: &Path) -> Usage {
    let read = |file: &str| fs::read_to_string(cgroup_dir.join(file)).ok();
    Usage {
        peak_memory: read("memory.peak").and_then(|text| parse_memory_peak(&text)),
        cpu_usec: read("cpu.stat").and_then(|text| parse_cpu_usage(&text)),
    }
}

/// Parses `cgroup.events` for its `populated` key: whether any process is in the cgroup or
/// below it.
pub(crate) fn parse_populated(events: &str) -> Option<bool> {
    events
        .lines()
        .find_map(|line| match line.strip_prefix("populated")?.trim() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        })
}

/// How the agent's own cgroup becomes the runners' root under `host.cgroup_root = "auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AutoPlan {
    /// The agent already lives in `<root>/rm-agent` (a restart): the root is its parent.
    Parent,
    /// The agent moves into `<own>/rm-agent`, and `<own>` is the root.
    MoveToLeaf,
    /// The agent is in the kernel's root cgroup, which shares its children with the host and
    /// is exempt from the no-internal-processes rule: the root is `<mount>/rm-runners`.
    Subdir,
}

/// Decides [`AutoPlan`] from the agent's cgroup path and whether that is the kernel's root
/// cgroup (which, unlike a cgroup namespace's root, has no `cgroup.type`).
pub(crate) fn auto_plan(own: &str, kernel_root: bool) -> AutoPlan {
    if kernel_root {
        AutoPlan::Subdir
    } else if Path::new(own).file_name() == Some(AGENT_LEAF.as_ref()) {
        AutoPlan::Parent
    } else {
        AutoPlan::MoveToLeaf
    }
}

/// The directory runner cgroups are created in, with the limit controllers it hands to them.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    path: PathBuf,
    available: Controllers,
}

/// A runner's new cgroup. The runner's child writes `0` to `procs` between fork and exec, so the
/// runner is in its cgroup before it runs any code.
#[derive(Debug)]
pub struct RunnerCgroup {
    pub path: PathBuf,
    /// `<path>/cgroup.procs`, open for writing, close-on-exec.
    pub procs: OwnedFd,
}

impl CgroupRoot {
    /// Finds and prepares the root. `configured`: `None` is `"auto"`: the agent's own cgroup.
    /// Unless the agent is already in `<own>/rm-agent` (then the root is `<own>`'s parent), it
    /// moves itself, all its threads with it, into `<own>/rm-agent` so that `<own>` holds no
    /// processes and can hand controllers to the runners. In the kernel's root cgroup the root is
    /// `<mount>/rm-runners` instead (see [`AutoPlan::Subdir`]). `Some(path)`: a directory inside
    /// a cgroup v2 mount, created if missing.
    ///
    /// Then enables `memory`, `pids` and `cpu` for the root's children where offered (what could
    /// not be enabled shows in [`CgroupRoot::available`]), and checks that a child cgroup can be
    /// created and removed.
    pub fn resolve(configured: Option<&Path>) -> Result<CgroupRoot, CgroupError> {
        let mounts = cgroup2_mounts(&read_proc(MOUNTINFO)?);
        let own = own_cgroup_path(&read_proc(PROC_SELF_CGROUP)?);
        resolve_with(configured, &mounts, own.as_deref(), std::process::id())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The limit controllers runner cgroups get.
    pub fn available(&self) -> Controllers {
        self.available
    }

    /// Where the runner cgroup `name` lives.
    pub fn runner_path(&self, name: &str) -> Result<PathBuf, CgroupError> {
        if !valid_runner_name(name) {
            return Err(CgroupError::Name {
                name: name.to_owned(),
            });
        }
        Ok(self.path.join(name))
    }

    /// Creates the runner cgroup `name` with `limits` (those whose controller is unavailable are
    /// skipped: see [`Limits::unapplied`]) and opens its `cgroup.procs`. A cgroup of that name
    /// left by a crash is killed and removed first, so the runner never shares it with a
    /// survivor or inherits stale limits.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<RunnerCgroup, CgroupError> {
        let path = self.runner_path(name)?;
        let writes = limit_writes(limits, self.available)?;
        let create_error = |source| CgroupError::Create {
            path: path.clone(),
            source,
        };
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                kill_and_remove(&path, KILL_WAIT)?;
                fs::create_dir(&path).map_err(create_error)?;
            }
            Err(e) => return Err(create_error(e)),
        }
        let configured = configure(&path, &writes);
        if configured.is_err() {
            // Empty and unused: a plain rmdir suffices, and the error that matters is the write.
            let _ = fs::remove_dir(&path);
        }
        configured?;
        match rustix::fs::open(
            path.join("cgroup.procs"),
            OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(procs) => Ok(RunnerCgroup { path, procs }),
            Err(e) => {
                let _ = fs::remove_dir(&path);
                Err(create_error(e.into()))
            }
        }
    }

    /// The names of the root's children that can be runner cgroups ([`valid_runner_name`]:
    /// never [`AGENT_LEAF`] or a probe). The agent never needs it (each runner's cgroup is
    /// journalled before it is made); the tests check what is left with it.
    #[cfg(test)]
    pub(crate) fn children(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.path)? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            if let Some(name) = entry.file_name().to_str()
                && valid_runner_name(name)
            {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }
}

/// [`CgroupRoot::resolve`] with the mounts, the agent's cgroup path and its pid given (tests
/// move a stand-in process instead of themselves).
fn resolve_with(
    configured: Option<&Path>,
    mounts: &[Cgroup2Mount],
    own: Option<&str>,
    pid: u32,
) -> Result<CgroupRoot, CgroupError> {
    if mounts.is_empty() {
        return Err(CgroupError::NoCgroup2);
    }
    // The directories whose `cgroup.subtree_control` is written, top-down: a controller
    // reaches the runners only if every level above them enables it.
    let (path, enable) = match configured {
        Some(path) => explicit_root(path, mounts)?,
        None => auto_root(mounts, own, pid)?,
    };
    for dir in &enable {
        enable_controllers(dir);
    }
    probe(&path)?;
    let available = fs::read_to_string(path.join("cgroup.subtree_control"))
        .map(|text| parse_controllers(&text))
        .map_err(|source| CgroupError::NotWritable {
            path: path.clone(),
            source,
        })?;
    Ok(CgroupRoot { path, available })
}

fn auto_root(
    mounts: &[Cgroup2Mount],
    own: Option<&str>,
    pid: u32,
) -> Result<(PathBuf, Vec<PathBuf>), CgroupError> {
    let own_error = || CgroupError::OwnCgroup {
        own: own.unwrap_or_default().to_owned(),
    };
    let own = own.ok_or_else(own_error)?;
    let own_dir = cgroup_dir(mounts, own).ok_or_else(own_error)?;
    let kernel_root = !own_dir.join("cgroup.type").exists();
    match auto_plan(own, kernel_root) {
        AutoPlan::Parent => {
            let root = own_dir.parent().ok_or_else(own_error)?.to_path_buf();
            Ok((root.clone(), vec![root]))
        }
        AutoPlan::MoveToLeaf => {
            let leaf = own_dir.join(AGENT_LEAF);
            let leaf_error = |source| CgroupError::Leaf {
                leaf: leaf.clone(),
                source,
            };
            make_dir(&leaf).map_err(leaf_error)?;
            // Writing a pid to `cgroup.procs` moves the whole thread group.
            write_file(&leaf.join("cgroup.procs"), &pid.to_string()).map_err(leaf_error)?;
            Ok((own_dir.clone(), vec![own_dir]))
        }
        AutoPlan::Subdir => {
            let root = own_dir.join(ROOT_RUNNERS);
            make_dir(&root).map_err(|source| CgroupError::NotWritable {
                path: own_dir.clone(),
                source,
            })?;
            Ok((root.clone(), vec![own_dir, root]))
        }
    }
}

/// An explicit `host.cgroup_root`: must lie in a cgroup v2 mount; missing levels are created.
fn explicit_root(
    path: &Path,
    mounts: &[Cgroup2Mount],
) -> Result<(PathBuf, Vec<PathBuf>), CgroupError> {
    let not_cgroup2 = || CgroupError::NotCgroup2 {
        path: path.to_path_buf(),
        mounts: mounts
            .iter()
            .map(|m| m.mount_point.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(not_cgroup2());
    }
    // The levels that do not exist yet, bottom-up, and the deepest one that does.
    let mut missing = Vec::new();
    let mut existing = path;
    while !existing.exists() {
        missing.push(existing.to_path_buf());
        existing = existing.parent().ok_or_else(not_cgroup2)?;
    }
    if !is_cgroup2(existing) || !existing.is_dir() {
        return Err(not_cgroup2());
    }
    let mut enable = Vec::new();
    if !missing.is_empty() {
        // The new levels get controllers only from their parent.
        enable.push(existing.to_path_buf());
    }
    for dir in missing.into_iter().rev() {
        make_dir(&dir).map_err(|source| CgroupError::NotWritable {
            path: dir.clone(),
            source,
        })?;
        enable.push(dir);
    }
    if enable.is_empty() {
        enable.push(path.to_path_buf());
    }
    Ok((path.to_path_buf(), enable))
}

/// Enables `memory`, `pids` and `cpu` for `dir`'s children where `dir` offers them, one by one:
/// the kernel rejects a whole write when one controller fails (e.g. `cpu` while a realtime
/// process is in the subtree), and a missing controller only means a missing limit, which
/// [`CgroupRoot::available`] reports.
fn enable_controllers(dir: &Path) {
    let Ok(offered) = fs::read_to_string(dir.join("cgroup.controllers")) else {
        return;
    };
    let offered = parse_controllers(&offered);
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))
        .map(|text| parse_controllers(&text))
        .unwrap_or_default();
    for (name, offer, on) in [
        ("memory", offered.memory, enabled.memory),
        ("pids", offered.pids, enabled.pids),
        ("cpu", offered.cpu, enabled.cpu),
    ] {
        if offer && !on {
            let _ = write_file(&dir.join("cgroup.subtree_control"), &format!("+{name}"));
        }
    }
}

/// Creates and removes a child of `root`, and checks that processes can be moved into it (the
/// agent writes the runner's pid through the root's `cgroup.procs` rules).
fn probe(root: &Path) -> Result<(), CgroupError> {
    let not_writable = |source| CgroupError::NotWritable {
        path: root.to_path_buf(),
        source,
    };
    let n = PROBE_COUNTER.fetch_add(1, Ordering::Relaxed);
    let probe = root.join(format!("{PROBE_PREFIX}{}.{n}", std::process::id()));
    fs::create_dir(&probe).map_err(not_writable)?;
    let access = rustix::fs::access(probe.join("cgroup.procs"), Access::WRITE_OK);
    let removed = fs::remove_dir(&probe);
    access.map_err(|e| not_writable(e.into()))?;
    removed.map_err(not_writable)
}

fn configure(path: &Path, writes: &[(&'static str, String)]) -> Result<(), CgroupError> {
    for (file, value) in writes {
        let file = path.join(file);
        write_file(&file, value).map_err(|source| CgroupError::Limit {
            path: file,
            value: value.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Whether the cgroup at `path`, or any cgroup below it, holds a process.
pub(crate) fn is_populated(path: &Path) -> io::Result<bool> {
    let events = fs::read_to_string(path.join("cgroup.events"))?;
    parse_populated(&events).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "cgroup.events has no `populated` line",
        )
    })
}

/// How [`kill_and_remove`] kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillMethod {
    /// `cgroup.kill` (Linux 5.14), falling back to [`KillMethod::Signals`] where it is missing.
    Auto,
    /// Freeze the cgroup (so nothing forks) and SIGKILL every pid in it, on every poll.
    Signals,
}

/// Kills every process in the cgroup at `path` and below it, waits up to `wait` for them to be
/// gone, and removes the cgroup and any child cgroups bottom-up. An absent cgroup is
/// [`Removal::Absent`]. Never loops past `wait`: processes that outlive it leave the cgroup in
/// place and return [`CgroupError::StillPopulated`].
///
/// Refused for anything that is not a non-root cgroup v2 directory, and for the agent's own
/// cgroup or one of its ancestors.
pub fn kill_and_remove(path: &Path, wait: Duration) -> Result<Removal, CgroupError> {
    kill_and_remove_with(path, wait, KillMethod::Auto)
}

fn kill_and_remove_with(
    path: &Path,
    wait: Duration,
    method: KillMethod,
) -> Result<Removal, CgroupError> {
    let refuse = |why| CgroupError::NotRunnerCgroup {
        path: path.to_path_buf(),
        why,
    };
    let kill_error = |source| CgroupError::Kill {
        path: path.to_path_buf(),
        source,
    };
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Absent),
        Err(e) => return Err(kill_error(e)),
        Ok(meta) if !meta.is_dir() => return Err(refuse("not a directory")),
        Ok(_) => {}
    }
    if !is_cgroup2(path) {
        return Err(refuse("not on a cgroup v2 filesystem"));
    }
    // The kernel's root cgroup has no `cgroup.type`, and no `cgroup.kill` either: without this
    // check the fallback would SIGKILL every process on the host.
    if !path.join("cgroup.type").exists() {
        return Err(refuse("it is the root cgroup"));
    }
    if own_cgroup_dir().is_some_and(|own| own.starts_with(path)) {
        return Err(refuse("the agent itself is in it"));
    }

    let mut method = method;
    if method == KillMethod::Auto {
        match write_file(&path.join("cgroup.kill"), "1") {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => method = KillMethod::Signals,
            Err(e) => return Err(kill_error(e)),
        }
    }
    if method == KillMethod::Signals {
        // Frozen tasks cannot fork but still die of SIGKILL (Linux 5.2+; ignored before).
        let _ = write_file(&path.join("cgroup.freeze"), "1");
    }

    let start = Instant::now();
    loop {
        let populated = match is_populated(path) {
            Ok(populated) => populated,
            // Removed meanwhile by someone else (a concurrent sweep).
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Absent),
            Err(e) => return Err(kill_error(e)),
        };
        if !populated {
            match remove_tree(path, 0) {
                Ok(()) => return Ok(Removal::Removed),
                // A child cgroup still being torn down; wait like for a process.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {}
                Err(source) => {
                    return Err(CgroupError::Remove {
                        path: path.to_path_buf(),
                        source,
                    });
                }
            }
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(CgroupError::StillPopulated {
                path: path.to_path_buf(),
                waited,
            });
        }
        if method == KillMethod::Signals {
            signal_tree(path, 0).map_err(kill_error)?;
        }
        std::thread::sleep(KILL_POLL.min(wait - waited));
    }
}

/// SIGKILLs every process in the cgroup at `path` and in its children. A pid is signalled
/// through a pidfd opened before `cgroup.procs` is read again, and only if it is still listed
/// then: a pid recycled to a process outside the cgroup is never signalled.
fn signal_tree(path: &Path, depth: usize) -> io::Result<()> {
    if depth > MAX_NESTING {
        return Ok(());
    }
    let procs = path.join("cgroup.procs");
    let listed = match read_pids(&procs) {
        Ok(pids) => pids,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut opened = Vec::new();
    for pid in listed {
        let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
            continue;
        };
        match rustix::process::pidfd_open(raw, PidfdFlags::empty()) {
            Ok(fd) => opened.push((pid, Some(fd))),
            // Before Linux 5.3: plain kill, with the small recycling window that implies.
            Err(rustix::io::Errno::NOSYS) => opened.push((pid, None)),
            Err(_) => {} // Gone already.
        }
    }
    let still: HashSet<u32> = read_pids(&procs).unwrap_or_default().into_iter().collect();
    for (pid, fd) in opened {
        if !still.contains(&pid) {
            continue;
        }
        let _ = match fd {
            Some(fd) => rustix::process::pidfd_send_signal(&fd, Signal::KILL),
            None => i32::try_from(pid)
                .ok()
                .and_then(Pid::from_raw)
                .map_or(Ok(()), |p| rustix::process::kill_process(p, Signal::KILL)),
        };
    }
    for child in child_dirs(path)? {
        signal_tree(&child, depth + 1)?;
    }
    Ok(())
}

/// Removes the cgroup at `path` after its children, deepest first.
fn remove_tree(path: &Path, depth: usize) -> io::Result<()> {
    if depth <= MAX_NESTING {
        for child in child_dirs(path)? {
            remove_tree(&child, depth + 1)?;
        }
    }
    match fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The child cgroups of `path` (in cgroupfs every directory is one); none if it is gone.
fn child_dirs(path: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            dirs.push(entry.path());
        }
    }
    Ok(dirs)
}

fn read_pids(procs: &Path) -> io::Result<Vec<u32>> {
    Ok(fs::read_to_string(procs)?
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect())
}

/// The agent's own cgroup directory, if it can be found.
fn own_cgroup_dir() -> Option<PathBuf> {
    let mounts = cgroup2_mounts(&fs::read_to_string(MOUNTINFO).ok()?);
    let own = own_cgroup_path(&fs::read_to_string(PROC_SELF_CGROUP).ok()?)?;
    cgroup_dir(&mounts, &own)
}

fn is_cgroup2(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|st| i128::from(st.f_type) == CGROUP2_SUPER_MAGIC)
}

fn read_proc(path: &str) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Proc {
        path: PathBuf::from(path),
        source,
    })
}

/// `mkdir`, where an existing directory is fine.
fn make_dir(path: &Path) -> io::Result<()> {
    match fs::create_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// Writes a control file in one `write(2)`: cgroupfs acts on each write, so the value must not
/// be split.
fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

#[cfg(test)]
mod tests;
