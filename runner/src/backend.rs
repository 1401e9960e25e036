//! The execution seam (CONTRACT §7, ARCHITECTURE guarantee 7): making a runner's runtime,
//! starting the runner in it, looking at it and stopping it (a backend is the runner's process
//! table, [`Processes`]), and cleaning up after it go through [`Backend`],
//! whose implementation is chosen per attempt at allocation and journalled with it
//! ([`IsolationKind`]), so allocation and supervision never depend on which one runs, and a
//! container or microVM backend is one more implementation.
//!
//! - [`NoIsolation`] (`isolation = "none"`): runners run as the agent's own user from a copy of
//!   the package; cleanup stops what still works inside the runtime and removes it.
//! - [`UserIsolation`] (`isolation = "user"`): a uid of the pool, a cgroup and a private mount
//!   namespace per runner, a runtime of hard links to the verified package store; cleanup kills
//!   the cgroup and every process of the uid, and only then removes the runtime: a uid is
//!   released (its attempt journalled released, before its registration is removed and it is
//!   `cleaned`) only once nothing of it is left.

use std::cell::Cell;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use rm_journal::{AttemptRecord, IsolationKind, WorkspaceKind};
use secrecy::SecretString;

use crate::docker::DockerPolicy;

use super::cgroup::{self, CgroupRoot, Limits};
use super::docker::{self, DaemonSpec, Tools};
use super::env_file::{OperatorEnv, with_operator_env};
use super::isolate::{self, Account, ChildSetup, Pool, Sandbox};
use super::network::{self, HostNetwork};
use super::package::current::CurrentPackage;
use super::process::{self, ProcStat, ProcessError, Processes, RunnerChild, Spawned, StopSignal};
use super::store::{self, Store, StoreError, StoredPackage};
use super::workspace::{Removal, RunnerRoot, Runtime, WorkspaceError, create_tmp};
use super::{OsProcesses, discover, uid};

/// What a backend needs to know about one attempt: the journalled facts and its policy's
/// limits.
#[derive(Debug, Clone)]
pub struct Plan {
    pub attempt_id: String,
    pub workspace: WorkspaceKind,
    pub runtime_dir: PathBuf,
    pub uid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub limits: Limits,
    /// The policy's operator variables (`env_file`), added to the runner's environment.
    pub env: OperatorEnv,
    /// The policy's `network_allow`: when set, the only networks the runner reaches.
    pub network_allow: Option<Vec<network::Cidr>>,
    /// The policy's `egress`: the runner reaches what the agent's resolver opens for it
    /// ([`network::egress`]); `None`: `network_allow` decides.
    pub egress: Option<network::EgressRules>,
    /// With `egress`: the agent's directory for this runner (its job-completed hook and the
    /// report it prints), lent read-only at [`EGRESS_IN_RUN`] and named by
    /// [`JOB_COMPLETED_HOOK`], so the job's own log says what its egress policy refused.
    pub egress_report: Option<PathBuf>,
    /// The policy's `docker`: the runner gets a rootless Docker daemon of its own, started
    /// before it with these images loaded ([`super::docker`]); `None`: no Docker.
    pub docker: Option<DockerPolicy>,
    /// The policy's `cache`: the runner is linked from the redirected package and pointed at
    /// the host-local cache ([`CachePlan`]); `None`: no cache.
    pub cache: Option<CachePlan>,
    /// The policy's `image`: the runner's root is the image's verified root under a per-runner
    /// overlay ([`crate::image_root`]); `None`: the host's root. `user` isolation only.
    pub image: Option<crate::image_root::ImagePlan>,
    /// The host declares devices (`[[host.device]]`): the runner gets a `/dev` of its own with
    /// exactly these nodes (none when it was given none), and no other device node opens
    /// ([`crate::devices`]); `None`: the host declares none, and the runner sees the host's
    /// `/dev`. `user` isolation only (`none` refuses a plan with devices).
    pub devices: Option<crate::devices::DevicePlan>,
}

/// What a cached runner gets (`policy.cache`, the `rm_cache` service): its runtime linked from
/// the stored package's redirected derivation ([`StoredPackage::redirected`]), so that the
/// runner's worker leaves the service's URLs ([`cache_environment`]) as the runner's environment
/// says; the host's action archives, read-only at [`ARCHIVES_IN_RUN`]; and a job-started hook,
/// read-only at [`HOOK_IN_RUN`], that copies the URLs into the job's own environment, so steps in
/// a container (which get only the job's variables) have them too. Fails closed: a runner whose
/// runtime's worker is not redirected gets none of it (it runs uncached, against GitHub, and
/// says so), never a URL its worker would overwrite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePlan {
    /// The service's port on the host's loopback; a runner reaches it at the host end of its
    /// network, as its containers do.
    pub port: u16,
    /// The host's action archives (`<owner>_<repo>/<sha>.tar.gz`); `None`: none kept.
    pub archives: Option<PathBuf>,
    /// The agent's job-started hook file; `None`: none.
    pub hook: Option<PathBuf>,
}

/// Where a cached runner finds the host's action archives: read-only, in its own `/run`.
pub const ARCHIVES_IN_RUN: &str = "/run/rm-actions";

/// Where a cached runner finds the agent's job-started hook: read-only, in its own `/run`.
pub const HOOK_IN_RUN: &str = "/run/rm-cache/job-started.sh";

/// The runner's variable naming its job-started hook (actions/runner's "pre-job script").
pub const JOB_STARTED_HOOK: &str = "ACTIONS_RUNNER_HOOK_JOB_STARTED";

/// Where the agent's hook finds the operator's own job-started hook, which it runs after its
/// own lines (an `env_file` that names one keeps it).
pub const OPERATOR_JOB_STARTED_HOOK: &str = "RM_OPERATOR_JOB_STARTED_HOOK";

/// Where an egress runner finds the agent's directory for it: read-only, in its own `/run`.
pub const EGRESS_IN_RUN: &str = "/run/rm-egress";

/// The job-completed hook an egress runner runs, in [`EGRESS_IN_RUN`].
pub const EGRESS_HOOK_IN_RUN: &str = "/run/rm-egress/job-completed.sh";

/// The runner's variable naming its job-completed hook (actions/runner's "post-job script").
pub const JOB_COMPLETED_HOOK: &str = "ACTIONS_RUNNER_HOOK_JOB_COMPLETED";

/// Where the agent's job-completed hook finds the operator's own, which it runs after its own
/// lines (an `env_file` that names one keeps it).
pub const OPERATOR_JOB_COMPLETED_HOOK: &str = "RM_OPERATOR_JOB_COMPLETED_HOOK";

/// The environment that points an egress runner at the agent's job-completed hook, keeping an
/// operator's (`operator_hook`, from the policy's `env_file`) for it to run. Pure.
pub fn egress_environment(operator_hook: Option<&std::ffi::OsStr>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> =
        vec![(JOB_COMPLETED_HOOK.into(), EGRESS_HOOK_IN_RUN.into())];
    if let Some(theirs) = operator_hook {
        env.push((OPERATOR_JOB_COMPLETED_HOOK.into(), theirs.to_owned()));
    }
    env
}

/// The service's URL as a runner at `host_end` reaches it (its containers too).
pub fn cache_url(plan: &CachePlan, host_end: std::net::Ipv4Addr) -> String {
    format!("http://{host_end}:{}/", plan.port)
}

/// The environment that points a redirected runner's steps at the local service
/// (`ACTIONS_RESULTS_URL` for cache v2, `ACTIONS_CACHE_URL` for v1, `RM_CACHE_URL` for the
/// hook), its action downloads at the archives and its job-started hook at the agent's; an
/// operator's hook (`operator_hook`, from the policy's `env_file`) is kept for the agent's hook
/// to run. Pure.
pub fn cache_environment(
    plan: &CachePlan,
    host_end: std::net::Ipv4Addr,
    operator_hook: Option<&std::ffi::OsStr>,
) -> Vec<(OsString, OsString)> {
    let url = cache_url(plan, host_end);
    let mut env: Vec<(OsString, OsString)> = vec![
        ("ACTIONS_RESULTS_URL".into(), url.clone().into()),
        ("ACTIONS_CACHE_URL".into(), url.clone().into()),
        ("RM_CACHE_URL".into(), url.into()),
    ];
    if plan.archives.is_some() {
        env.push((
            "ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE".into(),
            ARCHIVES_IN_RUN.into(),
        ));
    }
    if plan.hook.is_some() {
        env.push((JOB_STARTED_HOOK.into(), HOOK_IN_RUN.into()));
        if let Some(theirs) = operator_hook {
            env.push((OPERATOR_JOB_STARTED_HOOK.into(), theirs.to_owned()));
        }
    }
    env
}

impl Plan {
    pub fn of(record: &AttemptRecord, limits: Limits) -> Plan {
        Plan {
            attempt_id: record.attempt_id.as_str().to_owned(),
            workspace: record.workspace,
            runtime_dir: record.runtime_dir.clone(),
            uid: record.uid,
            cgroup: record.cgroup.clone(),
            limits,
            env: OperatorEnv::default(),
            network_allow: None,
            egress: None,
            egress_report: None,
            docker: None,
            cache: None,
            image: None,
            devices: None,
        }
    }
}

/// What a cleanup did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleaned {
    /// Processes killed that had outlived the runner (escaped its process group).
    pub killed: usize,
    pub runtime: Removal,
}

/// Why a step of a backend failed. None names the JIT configuration.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("the runner's cgroup: {0}")]
    Cgroup(String),
    #[error("the runner uid: {0}")]
    Uid(String),
    #[error("the runner package store: {0}")]
    Store(String),
    #[error("attempt is journalled without a runner uid; it cannot run isolated")]
    NoUid,
    #[error("the runner's network: {0}")]
    Network(#[from] network::NetworkError),
    #[error("the runner's Docker daemon: {0}")]
    Docker(String),
    #[error("the runner's image: {0}")]
    Image(String),
    #[error("the runner's devices: {0}")]
    Device(#[from] crate::devices::DeviceError),
}

/// The seam. Every method blocks (file trees, `/proc`, cgroupfs): call them off the async
/// runtime (`spawn_blocking`).
pub trait Backend: Send + Sync {
    fn kind(&self) -> IsolationKind;

    /// Makes the attempt's runtime ready to hand to its runner.
    fn prepare(&self, plan: &Plan) -> Result<Runtime, BackendError>;

    /// Starts the runner in the prepared runtime; the JIT configuration goes into its
    /// environment and nowhere else.
    fn start(
        &self,
        plan: &Plan,
        runtime: &Runtime,
        jit: &SecretString,
    ) -> Result<Spawned<RunnerChild>, BackendError>;

    /// Everything the attempt left, after its runner's process group was stopped: processes
    /// that escaped it, the runtime (removed, or a slot scrubbed down to `_work`), and what the
    /// backend made for it. Returns only when nothing of the runner is left; an error leaves
    /// the attempt uncleaned (its uid held) for a later try.
    fn clean(&self, plan: &Plan) -> Result<Cleaned, BackendError>;

    // Where this backend's runners are seen and signalled: every backend is a process table
    // ([`Processes`], through the impl below), which [`process::inspect`] and [`process::stop`]
    // read and act on. `none` and `user` both start runners as host processes, so they keep
    // the host's (`/proc`, `kill(2)`); a container backend would answer for its own, and a
    // test's backend answers from its fake table. So a runner is started, looked at, stopped
    // and cleaned through one seam.

    /// `/proc/<pid>/stat` as this backend sees it, or `None` if there is no such process.
    fn stat(&self, pid: u32) -> io::Result<Option<ProcStat>> {
        OsProcesses.stat(pid)
    }

    /// Every process whose process group is `pgid`.
    fn group(&self, pgid: u32) -> io::Result<Vec<ProcStat>> {
        OsProcesses.group(pgid)
    }

    /// Sends `signal` to the process group `pgid`; an empty group is not an error.
    fn signal_group(&self, pgid: u32, signal: StopSignal) -> io::Result<()> {
        OsProcesses.signal_group(pgid, signal)
    }
}

/// Every backend is the process table its runners are looked at and stopped through.
impl<B: Backend + ?Sized> Processes for B {
    fn stat(&self, pid: u32) -> io::Result<Option<ProcStat>> {
        Backend::stat(self, pid)
    }

    fn group(&self, pgid: u32) -> io::Result<Vec<ProcStat>> {
        Backend::group(self, pgid)
    }

    fn signal_group(&self, pgid: u32, signal: StopSignal) -> io::Result<()> {
        Backend::signal_group(self, pgid, signal)
    }
}

/// `isolation = "none"`: today's runner, as the agent's own user.
#[derive(Debug, Clone)]
pub struct NoIsolation {
    pub root: RunnerRoot,
    /// The unpacked package, copied into every runtime (swapped when `runner.version =
    /// "latest"` moves).
    pub package: CurrentPackage,
}

impl Backend for NoIsolation {
    fn kind(&self) -> IsolationKind {
        IsolationKind::None
    }

    fn prepare(&self, plan: &Plan) -> Result<Runtime, BackendError> {
        // Held until the copy is made: a superseded package is not removed under it.
        let package = self.package.get();
        Ok(match plan.workspace {
            WorkspaceKind::Persistent => self.root.prepare_slot(&plan.runtime_dir, &package)?,
            WorkspaceKind::Ephemeral => self.root.create_ephemeral(&plan.attempt_id, &package)?,
        })
    }

    fn start(
        &self,
        plan: &Plan,
        runtime: &Runtime,
        jit: &SecretString,
    ) -> Result<Spawned<RunnerChild>, BackendError> {
        // A runner as the agent's own user sees every device node the agent does: it cannot be
        // held to the devices it was given.
        if plan.devices.is_some() {
            return Err(crate::devices::DeviceError::NotIsolated.into());
        }
        let env = with_operator_env(
            process::runner_environment(std::env::vars_os(), runtime.dir()),
            &plan.env,
        );
        Ok(process::spawn_listener(
            runtime.dir(),
            jit,
            env,
            |command| super::logs::capture_output(command, runtime.dir(), None),
        )?)
    }

    fn clean(&self, plan: &Plan) -> Result<Cleaned, BackendError> {
        // A job process that left the group but still works in the runtime; one that left it
        // too (`cd /; setsid ...`) is beyond what this backend can find: see CONTRACT §7.
        let killed = discover::kill_residents(&plan.runtime_dir).unwrap_or(0);
        let runtime = remove_runtime(&self.root, plan)?;
        Ok(Cleaned { killed, runtime })
    }
}

/// The package isolated runtimes are linked from, and what it is made from: a runtime that fails
/// its check against the manifest has the store verified in full and, when it does not verify,
/// rebuilt from the source package (CONTRACT §7: a mismatch rebuilds the package). The source
/// is judged right before each time it is read ([`crate::trust`]): one a runner uid could have
/// changed is not stored.
#[derive(Debug)]
pub struct LinkedPackage {
    store: Store,
    /// The runner uids the source is judged against.
    pool: Pool,
    /// The stored package runtimes are linked from now, and the unpacked package it was
    /// installed from (a repair reinstalls from it).
    current: Mutex<(StoredPackage, PathBuf)>,
}

impl LinkedPackage {
    /// Installs `source` into `store` (once per content) and verifies it in full; a source
    /// `pool` could change is refused.
    pub fn install(store: Store, source: &Path, pool: &Pool) -> Result<LinkedPackage, StoreError> {
        store::refuse_changeable(source, pool)?;
        let package = store.install(source)?;
        package.verify()?;
        Ok(LinkedPackage {
            store,
            pool: pool.clone(),
            current: Mutex::new((package, source.to_path_buf())),
        })
    }

    /// The stored package runtimes are linked from now.
    pub fn current(&self) -> StoredPackage {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    /// The store the packages are in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Makes `source` the package new runtimes link from: installed beside the current one
    /// (once per content) and verified in full before it is swapped in, so a runtime is only
    /// ever linked from a verified tree. Returns the superseded stored package: runtimes linked
    /// from it keep running on it, and it is removed once nothing uses it
    /// ([`Store::remove_unused`]). Blocking (a package of thousands of files).
    pub(crate) fn switch(&self, source: &Path) -> Result<StoredPackage, StoreError> {
        store::refuse_changeable(source, &self.pool)?;
        let package = self.store.install_beside(source)?;
        package.verify()?;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let (old, _) = std::mem::replace(&mut *current, (package, source.to_path_buf()));
        Ok(old)
    }

    /// After a runtime failed its check: the store verified in full, and rebuilt from the
    /// source when it does not verify. Serialised, so concurrent launches repair once.
    pub(crate) fn repair(&self) -> Result<StoredPackage, StoreError> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = current.0.verify() {
            tracing::warn!(error = %e, "the runner package store does not verify; rebuilding it from the package");
            // Beside the others: a superseded tree may still be linked by running runners.
            store::refuse_changeable(&current.1, &self.pool)?;
            current.0 = self.store.install_beside(&current.1)?;
        }
        Ok(current.0.clone())
    }
}

/// `isolation = "user"`: a uid, a cgroup and a private mount namespace per runner.
#[derive(Debug, Clone)]
pub struct UserIsolation {
    pub root: RunnerRoot,
    /// The verified package runtimes are linked from; `None` in a backend that only cleans up
    /// (an agent now configured otherwise, recovering attempts started isolated).
    pub package: Option<Arc<LinkedPackage>>,
    pub pool: Pool,
    /// Where runner cgroups are made; `None` where no cgroup v2 is writable (every process of
    /// the uid is then killed at cleanup instead).
    pub cgroups: Option<CgroupRoot>,
    /// `host.network = "private"`: the host's part, installed; `None`: runners share the
    /// host's network. Cleanup removes a runner's network whatever this says (it may have been
    /// started under another configuration).
    pub network: Option<Arc<HostNetwork>>,
    /// The rootless Docker tools, found at start when a policy sets `docker = true` (and the
    /// pool's subordinate ids ensured); `None`: no runner of this agent gets a Docker daemon.
    /// Cleanup needs nothing of it: the daemon's tree dies with the runner's cgroup, and its
    /// files lie in the runtime.
    pub docker: Option<Tools>,
    /// `host.runner_run_keep`: what of the host's `/run` each runner, and its Docker daemon,
    /// keeps in the empty `/run` it gets.
    pub run_keep: Vec<PathBuf>,
}

impl UserIsolation {
    /// The runner's network, made after removing what a runner no journal knows any more left
    /// on its uid's slot: a runner whose attempt was lost with a poisoned journal's last writes
    /// is never cleaned, and its network would hold the slot (every later start on the uid
    /// refused) and its cgroup stay forever. Nothing runs as the uid (the caller checked), so
    /// nothing of that runner is alive: its network and its cgroup, named by its veth, go, and
    /// the network is made again, once. Any other holder of the slot stays refused.
    fn runner_network(
        &self,
        names: &network::Names,
        uid: u32,
        table: &str,
    ) -> Result<std::os::fd::OwnedFd, BackendError> {
        match network::create(names, uid, table) {
            Err(network::NetworkError::HeldByRunner { short, .. }) => {
                tracing::warn!(
                    uid,
                    runner = %format!("rm-{short}"),
                    "a runner no journal knows left its network and cgroup on this uid; removing them before the uid serves again"
                );
                network::remove(&network::Names::of(&short))?;
                if let Some(root) = &self.cgroups {
                    let path = root
                        .runner_path(&format!("rm-{short}"))
                        .map_err(|e| BackendError::Cgroup(e.to_string()))?;
                    cgroup::kill_and_remove(&path, cgroup::KILL_WAIT)
                        .map_err(|e| BackendError::Cgroup(e.to_string()))?;
                }
                Ok(network::create(names, uid, table)?)
            }
            made => Ok(made?),
        }
    }

    fn account(&self, plan: &Plan) -> Result<Account, BackendError> {
        let uid = plan.uid.ok_or(BackendError::NoUid)?;
        Ok(Account {
            uid,
            gid: self.pool.gid_of(uid),
        })
    }

    /// Fills a runtime from `package`; `mismatch` is set when the links fail their check (the
    /// caller repairs the store and tries once more).
    fn fill(
        &self,
        package: &StoredPackage,
        runtime: &Path,
        account: Account,
        slot: bool,
        mismatch: &Cell<bool>,
    ) -> std::io::Result<()> {
        package
            .link_into(runtime)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // The check before the runtime is handed over: the links are the verified files.
        if let Err(e) = package.verify_runtime(runtime) {
            mismatch.set(true);
            tracing::warn!(runtime = %runtime.display(), error = %e, "a runtime does not match the package manifest; it is not handed to a runner");
            return Err(std::io::Error::other(e.to_string()));
        }
        if slot {
            let work = runtime.join(super::workspace::WORK_FOLDER);
            if work.is_dir() {
                isolate::chown_tree(&work, account)?;
            }
        }
        create_tmp(runtime)?;
        isolate::hand_over(runtime, account)
    }

    /// One try at the runtime from `package`.
    fn prepare_from(
        &self,
        plan: &Plan,
        account: Account,
        package: &StoredPackage,
        mismatch: &Cell<bool>,
    ) -> Result<Runtime, BackendError> {
        Ok(match plan.workspace {
            WorkspaceKind::Persistent => {
                // The policy's directory: runners pass through it to their slot, list nothing.
                if let Some(policy_dir) = plan.runtime_dir.parent() {
                    let made = std::fs::create_dir_all(policy_dir).and_then(|()| {
                        std::fs::set_permissions(
                            policy_dir,
                            std::os::unix::fs::PermissionsExt::from_mode(0o711),
                        )
                    });
                    made.map_err(|source| WorkspaceError::Copy {
                        runtime: plan.runtime_dir.clone(),
                        source,
                    })?;
                }
                self.root.prepare_slot_with(&plan.runtime_dir, |rt| {
                    self.fill(package, rt, account, true, mismatch)
                })?
            }
            WorkspaceKind::Ephemeral => {
                self.root.create_ephemeral_with(&plan.attempt_id, |rt| {
                    self.fill(package, rt, account, false, mismatch)
                })?
            }
        })
    }
}

impl UserIsolation {
    /// Whether the worker this runtime would run is the redirected derivation's: the same
    /// inode as the verified derived tree's file (runtimes are hard links to the store), so the
    /// cache's URLs are given only to a runner whose worker leaves them in place. The package
    /// switched since the runtime was made, or a derivation that cannot be had, is a reason.
    fn worker_redirected(&self, runtime: &Path) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt as _;
        let linked = self
            .package
            .as_ref()
            .ok_or("this agent has no runner package")?;
        let redirected = linked.current().redirected().map_err(|e| e.to_string())?;
        let file = store::redirect::WORKER_DLL;
        let stat = |path: &Path| {
            std::fs::symlink_metadata(path)
                .map(|m| (m.dev(), m.ino()))
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        if stat(&runtime.join(file))? == stat(&redirected.tree().join(file))? {
            Ok(())
        } else {
            Err(format!(
                "its {file} is not the redirected package's (the package changed since the runtime was made, or the derivation could not be had)"
            ))
        }
    }

    /// Starts the runner's rootless Docker daemon as `account` in `runtime`, in the runner's
    /// cgroup (`procs`) and network namespace, loads the policy's images, and hands the daemon's
    /// process to a thread that reaps it. Returns `DOCKER_HOST` for the runner.
    fn start_docker(
        &self,
        policy: &DockerPolicy,
        plan: &Plan,
        account: Account,
        runtime: &Path,
        procs: Option<&std::os::fd::OwnedFd>,
        netns: Option<&std::os::fd::OwnedFd>,
    ) -> Result<String, BackendError> {
        let tools = self.docker.as_ref().ok_or_else(|| {
            BackendError::Docker(
                "this agent did not set up rootless Docker at start (no policy asked for it then)"
                    .to_owned(),
            )
        })?;
        // Without a cgroup nothing would take the containers at cleanup: they run under
        // subordinate ids, which a sweep of the runner's uid does not find.
        let procs = procs.ok_or_else(|| {
            BackendError::Docker(
                "the runner has no cgroup, and a daemon's containers can only be stopped through one"
                    .to_owned(),
            )
        })?;
        // The uid's ranges, again: the lines written at start may have been edited or lost
        // since (another writer of /etc/subuid renaming its own version over it), and a daemon
        // without them cannot map its containers. Writes nothing when they are there.
        docker::subid::ensure(&docker::subid::Files::host(), &[(account.uid, account.gid)])
            .map_err(|e| BackendError::Docker(e.to_string()))?;
        let clone = |fd: &std::os::fd::OwnedFd| {
            fd.try_clone()
                .map_err(|e| BackendError::Docker(format!("cannot pass a descriptor on: {e}")))
        };
        let spec = DaemonSpec {
            account,
            // The runner's: the job's `hostname` and its daemon's `docker info` agree.
            hostname: network_names(plan).netns,
            run_keep: self.run_keep.clone(),
            pids_max: plan.limits.pids_max,
            runtime: runtime.to_path_buf(),
            cgroup_procs: clone(procs)?,
            netns: netns.map(clone).transpose()?,
            // The host's, as the runner sees it: its loopback resolver is let through to the
            // host by the runner's network (`network::HostRules`).
            resolv_conf: None,
            env: Vec::new(),
            // In a private network the daemon reaches a loopback mirror at the host end of the
            // runner's veth (`docker::mirror`).
            registry_mirror: policy.registry_mirror.as_ref().map(|mirror| {
                let route = match (&self.network, netns) {
                    (Some(_), Some(_)) => docker::Route::Private {
                        host_end: network::addresses(network::slot_of(account.uid)).host,
                    },
                    _ => docker::Route::Host,
                };
                docker::daemon_mirror(mirror, route)
            }),
        };
        let daemon = docker::start(spec, tools).map_err(|e| BackendError::Docker(e.to_string()))?;
        let docker_host = daemon.docker_host();
        let socket = daemon.socket().to_path_buf();
        tracing::info!(
            ready_ms = daemon.ready_after.as_millis() as u64,
            copies_bounded_ms = daemon.copies_bounded_in.as_millis() as u64,
            "the runner's Docker daemon answers"
        );
        reap(daemon.child);
        let loaded = docker::load_images(&socket, &policy.images, &self.pool)
            .map_err(|e| BackendError::Docker(e.to_string()))?;
        if !loaded.is_empty() {
            tracing::info!(images = ?loaded, "images loaded into the runner's Docker daemon");
        }
        Ok(docker_host)
    }
}

/// Waits for a runner's daemon process on a thread of its own, so that it never stays a zombie
/// of the agent's (a zombie of the runner's uid would hold the uid: `uid::processes_of`). The
/// thread ends when the daemon does, at the latest when cleanup kills the runner's cgroup.
fn reap(mut child: std::process::Child) {
    let pid = child.id();
    let spawned = std::thread::Builder::new()
        .name("rm-dockerd-wait".to_owned())
        .spawn(move || {
            if let Err(e) = child.wait() {
                tracing::warn!(pid, error = %e, "cannot reap a runner's Docker daemon");
            }
        });
    if let Err(e) = spawned {
        // It is still killed with the cgroup; it stays a zombie until the agent exits.
        tracing::warn!(pid, error = %e, "cannot start a thread to reap a runner's Docker daemon");
    }
}

impl Backend for UserIsolation {
    fn kind(&self) -> IsolationKind {
        IsolationKind::User
    }

    fn prepare(&self, plan: &Plan) -> Result<Runtime, BackendError> {
        let account = self.account(plan)?;
        let linked = self.package.as_ref().ok_or_else(|| {
            BackendError::Store(
                "this agent has no runner package to start isolated runners from".to_owned(),
            )
        })?;
        let mismatch = Cell::new(false);
        let current = linked.current();
        // A cached runner's runtime comes from the redirected derivation; one that cannot be
        // had runs uncached (its start finds the worker unredirected and says so).
        let package = match &plan.cache {
            Some(_) => match current.redirected() {
                Ok(redirected) => redirected,
                Err(e) => {
                    tracing::warn!(error = %e, "the runner package does not take the cache redirect; this runner runs uncached");
                    current
                }
            },
            None => current,
        };
        match self.prepare_from(plan, account, &package, &mismatch) {
            Err(_) if mismatch.get() => {
                let mut repaired = linked
                    .repair()
                    .map_err(|e| BackendError::Store(e.to_string()))?;
                // The derivation is checked again too (rebuilt when it does not verify).
                if plan.cache.is_some() {
                    match repaired.redirected() {
                        Ok(redirected) => repaired = redirected,
                        Err(e) => {
                            tracing::warn!(error = %e, "the runner package does not take the cache redirect; this runner runs uncached");
                        }
                    }
                }
                mismatch.set(false);
                self.prepare_from(plan, account, &repaired, &mismatch)
            }
            other => other,
        }
    }

    fn start(
        &self,
        plan: &Plan,
        runtime: &Runtime,
        jit: &SecretString,
    ) -> Result<Spawned<RunnerChild>, BackendError> {
        let account = self.account(plan)?;
        // Checked first, before anything is made for the runner: a node that is not a device
        // under /dev/ is the operator's to fix, and no runner starts with it.
        let devices = plan
            .devices
            .as_ref()
            .map(|plan| crate::devices::DevSetup::prepare(plan, Some((account.uid, account.gid))))
            .transpose()?;
        if devices.is_some() && plan.docker.is_some() {
            return Err(crate::devices::DeviceError::WithDocker.into());
        }
        // A uid someone else runs as would share its files and signals with this runner.
        let running = uid::processes_of(account.uid).map_err(|e| {
            BackendError::Uid(format!("cannot look for processes of {}: {e}", account.uid))
        })?;
        if !running.is_empty() {
            return Err(BackendError::Uid(format!(
                "{} process(es) already run as uid {}; it is not given to a runner",
                running.len(),
                account.uid
            )));
        }
        let procs = match (&self.cgroups, &plan.cgroup) {
            (Some(root), Some(path)) => {
                let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
                    BackendError::Cgroup(format!("{} names no cgroup", path.display()))
                })?;
                let made = root
                    .create(name, &plan.limits)
                    .map_err(|e| BackendError::Cgroup(e.to_string()))?;
                Some(made.procs)
            }
            _ => None,
        };
        // Before the runner's first instruction: its namespace, joined between fork and exec.
        let netns = match &self.network {
            Some(host) => {
                let table = host.runner_table(
                    account.uid,
                    plan.network_allow.as_deref(),
                    plan.egress.as_ref(),
                );
                Some(self.runner_network(&network_names(plan), account.uid, &table)?)
            }
            None => None,
        };
        let isolated = isolate::isolated_environment(std::env::vars_os(), runtime.dir());
        // An image's `ENV` goes over the host's; the operator's variables and what rm sets
        // below (its Docker, its cache) go over the image's.
        let isolated = match &plan.image {
            Some(image) => crate::image_root::with_image_env(isolated, &image.env),
            None => isolated,
        };
        let mut env = with_operator_env(isolated, &plan.env);
        // Before the runner: its Docker daemon, in the same cgroup and network namespace, so
        // that the cgroup's kill at cleanup takes the daemon and every container with it.
        if let Some(policy) = &plan.docker {
            let docker_host = self.start_docker(
                policy,
                plan,
                account,
                runtime.dir(),
                procs.as_ref(),
                netns.as_ref(),
            )?;
            env.retain(|(key, _)| key != "DOCKER_HOST");
            env.push(("DOCKER_HOST".into(), docker_host.into()));
        }
        // The cache's URLs only where the runtime's worker is redirected (fail closed).
        let mut lent = Vec::new();
        if let Some(cache) = &plan.cache {
            // The host end of the runner's own network: its containers reach it too.
            let host_end = self
                .network
                .as_ref()
                .map(|_| network::addresses(network::slot_of(account.uid)).host);
            match host_end
                .ok_or_else(|| "the runner has no network of its own".to_owned())
                .and_then(|host_end| Ok((host_end, self.worker_redirected(runtime.dir())?)))
            {
                Ok((host_end, ())) => {
                    let operator_hook = env
                        .iter()
                        .find(|(key, _)| key == JOB_STARTED_HOOK)
                        .map(|(_, value)| value.clone());
                    let extra = cache_environment(cache, host_end, operator_hook.as_deref());
                    env.retain(|(key, _)| !extra.iter().any(|(k, _)| k == key));
                    env.extend(extra);
                    for (source, target) in [
                        (&cache.archives, ARCHIVES_IN_RUN),
                        (&cache.hook, HOOK_IN_RUN),
                    ] {
                        if let Some(source) = source {
                            lent.push(isolate::Lent {
                                source: source.clone(),
                                target: PathBuf::from(target),
                            });
                        }
                    }
                }
                Err(why) => {
                    tracing::warn!(attempt = %plan.attempt_id, why = %why, "this runner runs uncached: its worker is not redirected to the host-local cache");
                }
            }
        }
        // Egress: the job's own log ends with what its policy refused (the agent's hook).
        if let Some(dir) = &plan.egress_report {
            let operator_hook = env
                .iter()
                .find(|(key, _)| key == JOB_COMPLETED_HOOK)
                .map(|(_, value)| value.clone());
            let extra = egress_environment(operator_hook.as_deref());
            env.retain(|(key, _)| !extra.iter().any(|(k, _)| k == key));
            env.extend(extra);
            lent.push(isolate::Lent {
                source: dir.clone(),
                target: PathBuf::from(EGRESS_IN_RUN),
            });
        }
        // The image root's upper is made last, once nothing before it can fail the start: a
        // start that fails leaves it to the runtime's removal like the rest.
        let image = match &plan.image {
            Some(image) => {
                let resolv = std::fs::read(network::RESOLV_CONF).ok();
                Some(
                    crate::image_root::prepare(
                        runtime.dir(),
                        image,
                        account,
                        &network_names(plan).netns,
                        resolv.as_deref(),
                    )
                    .map_err(|e| {
                        BackendError::Image(format!(
                            "cannot prepare the runner's root from image {}: {e}",
                            image.id
                        ))
                    })?,
                )
            }
            None => None,
        };
        let sandbox = Sandbox {
            devices,
            image,
            lent,
            cgroup_procs: procs,
            netns,
            pids_max: plan.limits.pids_max,
            memory_max: plan.limits.memory_max,
            hostname: network_names(plan).netns,
            run_keep: self.run_keep.clone(),
            // Its own daemon's socket where tools that ignore `DOCKER_HOST` look for one.
            docker_socket: plan
                .docker
                .as_ref()
                .map(|_| docker::Layout::of(runtime.dir()).socket),
        };
        let setup = ChildSetup::new(account, runtime.dir(), sandbox).map_err(|e| {
            BackendError::Uid(format!("cannot prepare the runner's isolation: {e}"))
        })?;
        Ok(process::spawn_listener(
            runtime.dir(),
            jit,
            env,
            |command| {
                super::logs::capture_output(
                    command,
                    runtime.dir(),
                    Some((account.uid, account.gid)),
                );
                setup.install(command)
            },
        )?)
    }

    fn clean(&self, plan: &Plan) -> Result<Cleaned, BackendError> {
        if let Some(path) = &plan.cgroup {
            cgroup::kill_and_remove(path, cgroup::KILL_WAIT)
                .map_err(|e| BackendError::Cgroup(e.to_string()))?;
        }
        // With or without a cgroup: the uid is released only when no process runs as it (a
        // process the cgroup could not hold, or every process where there is no cgroup).
        let killed = match plan.uid {
            Some(uid) => uid::kill_all(uid, uid::KILL_UID_WAIT)
                .map_err(|e| BackendError::Uid(e.to_string()))?,
            None => 0,
        };
        // Nothing runs in it any more: its namespace, veth and table go (whatever the
        // configuration says now: the attempt may have started under another one).
        network::remove(&network_names(plan))?;
        if let Some(uid) = plan.uid {
            isolate::clear_keyrings(Account {
                uid,
                gid: self.pool.gid_of(uid),
            })
            .map_err(|e| BackendError::Uid(e.to_string()))?;
        }
        let runtime = remove_runtime(&self.root, plan)?;
        if plan.workspace == WorkspaceKind::Persistent {
            isolate::take_back(&plan.runtime_dir).map_err(|e| {
                BackendError::Uid(format!(
                    "cannot take the slot {} back from uid {:?}: {e}",
                    plan.runtime_dir.display(),
                    plan.uid
                ))
            })?;
        }
        Ok(Cleaned { killed, runtime })
    }
}

/// The names of an attempt's network namespace and veth (from its short id).
fn network_names(plan: &Plan) -> network::Names {
    let short = plan.attempt_id.get(..12).unwrap_or(&plan.attempt_id);
    network::Names::of(short)
}

fn remove_runtime(root: &RunnerRoot, plan: &Plan) -> Result<Removal, WorkspaceError> {
    match plan.workspace {
        WorkspaceKind::Persistent => root.scrub_slot(&plan.runtime_dir),
        WorkspaceKind::Ephemeral => root.remove_runtime(&plan.runtime_dir),
    }
}

#[cfg(test)]
mod tests;
