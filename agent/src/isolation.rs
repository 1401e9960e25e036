//! Which isolation `rm-agent run` starts runners under, decided once at start from the
//! configuration and what this host allows (CONTRACT §7), and the backends that carry it out:
//! `user` where the agent may switch users (the default), `none` only when the configuration
//! names it. Also what `check` and `status` say about it.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rm_journal::IsolationKind;

use crate::config::{Config, Isolation, Network, display_file};
use crate::executor::Backends;
use crate::exit::Exit;
use rm_runner::RunnerRoot;
use rm_runner::backend::{LinkedPackage, NoIsolation, UserIsolation};
use rm_runner::cgroup::{CgroupRoot, Controllers};
use rm_runner::docker;
use rm_runner::docker::unbounded::Unbounded;
use rm_runner::isolate::{self, Pool};
use rm_runner::network::{self, HostNetwork, HostRules};
use rm_runner::store::Store;

/// What a job can reach under `isolation = "none"`, for `check`, `status` and the start-up log.
pub(crate) const NONE_REACHES: &str = "jobs run as the agent's own user: a job can read the App's private key and the other secrets, the journal and status, read the agent's memory and environment and signal it, reach every other runner, rewrite the package later runners start from, and leave files in HOME and /tmp and processes behind for later jobs; set [host] isolation = \"user\" (run the agent as root) unless every job runs code you wrote";

/// What a job can reach under `host.network = "host"`, for `check`, `status` and the start-up log.
pub(crate) const HOST_NETWORK_REACHES: &str = "runners share the host's network: a job reaches every service of the host on loopback (the receiver's port, a local proxy or database), can bind a port before the agent does after a restart, reaches the cloud metadata service and every other runner; set [host] network = \"private\" (the default)";

/// The host's part of `host.network = "private"`, installed: forwarding and the agent's table.
fn host_network(
    config: &Config,
    pool: &Pool,
    egress_resolver: Option<u16>,
) -> Result<HostNetwork, Exit> {
    let uids = pool.accounts().iter().map(|a| a.uid);
    if let Some((a, b)) = network::slots_collide(uids.clone()) {
        return Err(usage(
            config,
            "host.runner_uids",
            &format!(
                "uids {a} and {b} would share a runner network (their uids differ by a multiple of {}); choose uids within {} consecutive numbers",
                network::NETWORK_SLOTS,
                network::NETWORK_SLOTS
            ),
        ));
    }
    // Unreadable or absent: no resolver is let through (a runner then resolves nothing).
    let resolv = std::fs::read_to_string(network::RESOLV_CONF).unwrap_or_default();
    let mut rules = HostRules::new(
        &config.host.network_host_ports,
        &config.host.network_deny,
        &resolv,
        uids,
    );
    rules.egress_resolver = egress_resolver;
    let host = HostNetwork {
        table: network::host_table_name(&config.data_dir),
        rules,
    };
    host.install().map_err(|e| {
        Exit::runtime(anyhow::anyhow!(
            "cannot set up the runners' network (host.network = \"private\"): {e}"
        ))
    })?;
    Ok(host)
}

/// Rootless Docker for the runners when a policy sets `docker = true`: the host judged able
/// (every lack refuses the start, exit 2, with its fix, as `check` says it), the pool's
/// subordinate id ranges checked and the missing ones written, the tools found. `None` when no
/// policy asks for Docker.
fn docker_for_runners(
    config: &Config,
    root: &Path,
    pool: &Pool,
    cgroups: Option<&CgroupRoot>,
) -> Result<Option<docker::Tools>, Exit> {
    let Some(policy) = config.policies.iter().find(|p| p.docker.is_some()) else {
        return Ok(None);
    };
    if let Some(problem) = docker_runner_root(config, root) {
        return Err(usage(config, "host.runner_root", &problem));
    }
    let refuse = |problem: String| {
        usage(
            config,
            &format!("policy.docker (policy `{}`)", policy.name),
            &problem,
        )
    };
    if cgroups.is_none() {
        return Err(refuse(
            "a runner's Docker daemon needs a runner cgroup (its containers run under subordinate ids, and only the cgroup's kill stops them at cleanup), and no writable cgroup v2 was found; set host.cgroup_root".to_owned(),
        ));
    }
    let accounts: Vec<(u32, u32)> = pool.accounts().iter().map(|a| (a.uid, a.gid)).collect();
    let files = docker::subid::Files::host();
    let facts = docker::Facts::gather(&accounts, &files);
    let available = cgroups.map(CgroupRoot::available).unwrap_or_default();
    for bounds in docker_bounds(config, available, facts.kernel) {
        if !bounds.unaccepted.is_empty() {
            return Err(usage(
                config,
                &format!("policy.docker_unbounded (policy `{}`)", bounds.policy),
                &unbounded_refusal(&bounds.unaccepted),
            ));
        }
        for accepted in bounds.accepted {
            tracing::warn!(
                policy = bounds.policy,
                unbounded = accepted.as_str(),
                "accepted by docker_unbounded: {}",
                accepted.why()
            );
        }
    }
    let lacks = docker::judge(&facts);
    if !lacks.is_empty() {
        let said: Vec<String> = lacks
            .iter()
            .map(|lack| format!("{} ({})", lack.what, lack.remedy))
            .collect();
        return Err(refuse(format!(
            "this host cannot give runners a rootless Docker: {}",
            said.join("; ")
        )));
    }
    let assigned = docker::subid::ensure(&files, &accounts).map_err(|e| refuse(e.to_string()))?;
    if assigned.added > 0 {
        tracing::info!(
            lines = assigned.added,
            "subordinate id ranges added for the runner uids (/etc/subuid, /etc/subgid)"
        );
    }
    let tools = docker::Tools::find().map_err(|e| refuse(e.to_string()))?;
    tracing::info!(script = %tools.rootless_script.display(), "runners of policies with docker = true get a rootless Docker daemon each");
    Ok(Some(tools))
}

/// Why no runner of some `docker = true` policy could start its Docker daemon under the runner
/// root `root` (canonical), naming the policy, the reason and the fix; `None` when the deepest
/// runtime of every such policy can hold one. The rule is `docker::check_runner_root`, the one
/// each launch applies to its runtime: judged here, `run` refuses at start (and `check` fails)
/// what would otherwise fail every launch as `process_start_failed`, backing off for minutes.
pub(crate) fn docker_runner_root(config: &Config, root: &Path) -> Option<String> {
    config
        .policies
        .iter()
        .filter(|p| p.docker.is_some())
        .find_map(|policy| {
            let slots = (policy.workspace == crate::config::Workspace::Persistent)
                .then_some((policy.name.as_str(), policy.max_runners));
            let err = docker::check_runner_root(root, slots).err()?;
            let whose = format!(
                "each runner of policy `{}` (docker = true) keeps its Docker daemon's tree in its runtime under {}",
                policy.name,
                root.display()
            );
            Some(match err {
                docker::DockerError::UnderPrivateDir { dir, .. } => format!(
                    "{whose}, which lies under {dir}: the daemon gets an empty tmpfs of its own on {dir}, so it would not find its runtime and every launch would fail; choose a host.runner_root outside {} (such as /var/lib/rm-agent/runners)",
                    docker::daemon_tmpfs_dirs()
                ),
                docker::DockerError::PathTooLong { path } => format!(
                    "{whose}, too deep for the daemon's unix sockets: {} would be {} bytes, longer than a socket's path may be, so every launch would fail; choose a shorter host.runner_root",
                    path.display(),
                    path.as_os_str().len()
                ),
                other => format!("{whose}: {other}"),
            })
        })
}

/// What one `docker = true` policy's runners leave unbounded here
/// ([`docker::unbounded::unbounded`]), split by whether its `docker_unbounded` accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DockerBounds {
    pub policy: String,
    /// Unbounded and not accepted: `run` refuses to start, `check` fails.
    pub unaccepted: Vec<Unbounded>,
    /// Unbounded and accepted by name: a warning at start and in `check`.
    pub accepted: Vec<Unbounded>,
}

/// [`DockerBounds`] of every `docker = true` policy with something unbounded, for runner
/// cgroups offering `available` on a kernel `kernel`. Pure.
pub(crate) fn docker_bounds(
    config: &Config,
    available: Controllers,
    kernel: Option<(u32, u32)>,
) -> Vec<DockerBounds> {
    config
        .policies
        .iter()
        .filter_map(|p| {
            let docker = p.docker.as_ref()?;
            let unbounded = docker::unbounded::unbounded(&p.limits, available, kernel);
            let unaccepted = docker::unbounded::unaccepted(&unbounded, &docker.unbounded);
            let accepted = unbounded
                .into_iter()
                .filter(|u| !unaccepted.contains(u))
                .collect::<Vec<_>>();
            (!unaccepted.is_empty() || !accepted.is_empty()).then(|| DockerBounds {
                policy: p.name.clone(),
                unaccepted,
                accepted,
            })
        })
        .collect()
}

/// Why a policy's Docker is refused, with both ways out: bound it, or accept it by name.
pub(crate) fn unbounded_refusal(unaccepted: &[Unbounded]) -> String {
    let why: Vec<&str> = unaccepted.iter().map(|u| u.why()).collect();
    let names: Vec<String> = unaccepted
        .iter()
        .map(|u| format!("\"{}\"", u.as_str()))
        .collect();
    format!(
        "{}; give the runner cgroups the controller (cgroup v2 with memory and pids delegated: Delegate=yes for the agent's unit, or a host.cgroup_root that has them), or accept it for this policy with docker_unbounded = [{}]",
        why.join("; "),
        names.join(", ")
    )
}

/// The mode of the runner root under `user`: runners pass through it to their own runtime
/// (mode 0700, owned by their uid) and can list nothing.
const RUNNER_ROOT_MODE: u32 = 0o711;

/// The backends for `config`, refusing (exit 2) an isolation this host cannot give.
/// `egress_resolver`: the egress resolver's port on the host's loopback, when one runs
/// (`crate::egress`).
pub(crate) fn backends(
    config: &Config,
    package_dir: &Path,
    egress_resolver: Option<u16>,
) -> Result<Backends, Exit> {
    let root = RunnerRoot::open(&config.host.runner_root).map_err(Exit::runtime)?;
    let none = NoIsolation {
        root: root.clone(),
        package: rm_runner::package::current::CurrentPackage::new(package_dir),
    };
    let can_switch = isolate::can_switch_users();
    let decided = decide(config.host.isolation, can_switch);
    let pool = Pool::resolve(&config.host.runner_uids)
        .map_err(|problem| usage(config, "host.runner_uids", &problem));
    match decided {
        None => Err(cannot_switch(config)),
        Some(IsolationKind::None) => {
            tracing::warn!("host.isolation = \"none\": {NONE_REACHES}");
            // Attempts started isolated before the configuration changed still need an agent
            // that can clean up after their uid and cgroup.
            let user = match (can_switch, pool) {
                (true, Ok(pool)) => Some(UserIsolation {
                    root,
                    package: None,
                    pool,
                    cgroups: None,
                    network: None,
                    docker: None,
                    run_keep: Vec::new(),
                }),
                _ => None,
            };
            Ok(Backends {
                isolation: IsolationKind::None,
                none,
                user,
            })
        }
        Some(IsolationKind::User) => {
            let pool = pool?;
            let me = rustix::process::geteuid().as_raw();
            if pool.contains_uid(me) {
                return Err(usage(
                    config,
                    "host.runner_uids",
                    &format!("holds the agent's own uid {me}; runners must never share it"),
                ));
            }
            crate::secrets::refuse_readable_by_runners(config, &pool)?;
            private_data_dir(&config.data_dir, &config.host.runner_root).map_err(Exit::runtime)?;
            std::fs::set_permissions(
                root.path(),
                std::fs::Permissions::from_mode(RUNNER_ROOT_MODE),
            )
            .map_err(|e| {
                Exit::runtime(anyhow::anyhow!(
                    "cannot set the runner root {} to mode 711: {e}",
                    root.path().display()
                ))
            })?;
            isolate::check_traversable(root.path(), &config.data_dir)
                .map_err(|problem| usage(config, "host.runner_root", &problem))?;
            let store = Store::open(root.path()).map_err(Exit::runtime)?;
            let package =
                LinkedPackage::install(store, package_dir, &pool).map_err(Exit::runtime)?;
            let cgroups = match CgroupRoot::resolve(config.host.cgroup_root.as_deref()) {
                Ok(cgroups) => {
                    warn_unavailable_limits(config, &cgroups);
                    Some(cgroups)
                }
                Err(e) if config.host.cgroup_root.is_some() => {
                    return Err(usage(config, "host.cgroup_root", &e.to_string()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no writable cgroup v2: runners get no cgroup; every process of a runner's uid is killed before the uid serves another job");
                    None
                }
            };
            let network = match config.host.network {
                Network::Private => Some(std::sync::Arc::new(host_network(
                    config,
                    &pool,
                    egress_resolver,
                )?)),
                Network::Host => {
                    tracing::warn!("host.network = \"host\": {HOST_NETWORK_REACHES}");
                    None
                }
            };
            let docker = docker_for_runners(config, root.path(), &pool, cgroups.as_ref())?;
            tracing::info!(uids = pool.accounts().len(), cgroup_root = ?cgroups.as_ref().map(CgroupRoot::path), package = %package.current().tree().display(), network = config.host.network.as_str(), "runners are isolated: a uid, a cgroup, and mount, PID, IPC and UTS namespaces each");
            Ok(Backends {
                isolation: IsolationKind::User,
                none,
                user: Some(UserIsolation {
                    root,
                    package: Some(std::sync::Arc::new(package)),
                    pool,
                    cgroups,
                    network,
                    docker,
                    run_keep: config.host.runner_run_keep.clone(),
                }),
            })
        }
    }
}

/// Shared by `run` and `check`: why `user` cannot be had here, with both ways out.
pub(crate) fn cannot_switch(config: &Config) -> Exit {
    let why = "rm-agent may not switch users here (it is not root and lacks CAP_SETUID and CAP_SETGID), so it cannot give each runner a uid of its own";
    if config.host.isolation_named {
        usage(
            config,
            "host.isolation",
            &format!(
                "\"user\" is set, but {why}; run rm-agent as root (deploy/systemd/rm-agent.service), or set isolation = \"none\" if every job runs code you wrote"
            ),
        )
    } else {
        usage(
            config,
            "host.isolation",
            &format!(
                "runners are isolated by default, but {why}; run rm-agent as root (deploy/systemd/rm-agent.service), or set [host] isolation = \"none\" to run jobs as the agent's own user (only for code you wrote)"
            ),
        )
    }
}

/// Makes everything in the data directory private to the agent but the way to the runner
/// root: files and directories made before the agent set its umask, or by an older rm, lose
/// their group and other bits (the journal, status file and package cache hold what no job may
/// read).
fn private_data_dir(data_dir: &Path, runner_root: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(data_dir)?;
    let root = runner_root
        .canonicalize()
        .unwrap_or_else(|_| runner_root.to_path_buf());
    let data = data_dir.canonicalize()?;
    let on_the_way = |path: &Path| root.starts_with(path);
    let mut dirs: Vec<PathBuf> = vec![data.clone()];
    while let Some(dir) = dirs.pop() {
        let meta = std::fs::symlink_metadata(&dir)?;
        if !on_the_way(&dir) {
            restrict(&dir, &meta)?;
            continue;
        }
        if dir == root {
            continue;
        }
        // On the way to the runner root: search for others, nothing else.
        let mode = (meta.mode() & 0o700) | 0o001;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                dirs.push(path);
            } else {
                restrict(&path, &entry.metadata()?)?;
            }
        }
    }
    Ok(())
}

/// Takes group and other bits off one file or directory (not its contents: nothing below a
/// 0700 directory can be reached by a runner uid).
fn restrict(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    if meta.file_type().is_symlink() || meta.mode() & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode() & 0o7700))
}

/// Logs every configured limit the runner cgroups cannot apply (their controller is not
/// enabled in cgroup v2 here).
fn warn_unavailable_limits(config: &Config, cgroups: &CgroupRoot) {
    for (policy, missing) in unavailable_limits(config, cgroups.available()) {
        tracing::warn!(policy, limits = ?missing, "these limits cannot be applied: their cgroup v2 controller is not available here (pids_max still applies as the runner uid's process limit)");
    }
}

/// Per policy, the limits it sets whose controller is not `available`.
pub(crate) fn unavailable_limits(
    config: &Config,
    available: Controllers,
) -> Vec<(String, Vec<&'static str>)> {
    config
        .policies
        .iter()
        .filter_map(|p| {
            let mut limits = p.limits;
            // A shape's CPUs are a `cpu.max` (issue 42): the policy's `cpu`, a named shape's,
            // or a job's `rm-cpu` within `shape_max`.
            let shapes = &p.shapes;
            if shapes.cpu_millis.is_some()
                || shapes.max.is_some()
                || shapes.named.iter().any(|(_, b)| b.cpu_millis.is_some())
            {
                limits.cpu_max = Some(1);
            }
            let missing = limits.unapplied(available);
            (!missing.is_empty()).then(|| (p.name.clone(), missing))
        })
        .collect()
}

fn usage(config: &Config, key: &str, problem: &str) -> Exit {
    Exit::usage(format!(
        "{}: `{key}`: {problem}",
        display_file(config.source.as_deref())
    ))
}

/// The isolation new runners get: `none` only when the configuration says so, `user` only
/// where the agent may switch users; `None` means `run` refuses to start. Pure: the rule
/// CONTRACT §7 states, whatever the host.
pub(crate) fn decide(configured: Isolation, can_switch_users: bool) -> Option<IsolationKind> {
    match configured {
        Isolation::None => Some(IsolationKind::None),
        Isolation::User if can_switch_users => Some(IsolationKind::User),
        Isolation::User => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_only_taken_when_named_and_user_only_where_users_can_be_switched() {
        assert_eq!(decide(Isolation::User, true), Some(IsolationKind::User));
        assert_eq!(decide(Isolation::User, false), None);
        assert_eq!(decide(Isolation::None, true), Some(IsolationKind::None));
        assert_eq!(decide(Isolation::None, false), Some(IsolationKind::None));
    }

    #[test]
    fn a_refusal_names_both_ways_out() {
        let mut config = crate::config::from_text("[host]\nisolation = \"user\"\n").unwrap();
        let named = cannot_switch(&config);
        assert_eq!(named.code, crate::exit::USAGE);
        assert!(
            named.message.contains("\"user\" is set"),
            "{}",
            named.message
        );
        config.host.isolation_named = false;
        let default = cannot_switch(&config).message;
        for words in [
            "isolated by default",
            "run rm-agent as root",
            "isolation = \"none\"",
        ] {
            assert!(default.contains(words), "{default}");
        }
    }

    /// `run` refuses, and `check` fails, a Docker policy that leaves a resource unbounded it
    /// did not accept by name; one that accepted it is only warned about.
    #[test]
    fn docker_without_a_bound_is_refused_unless_the_policy_accepts_it_by_name() {
        let policy = |name: &str, extra: &str| {
            format!(
                "[[policy]]\nname = \"{name}\"\ntarget = \"acme\"\nlabels = [\"self-hosted\", \"{name}\"]\nmemory_max = \"2G\"\n{extra}\n"
            )
        };
        let config = crate::config::from_text(&format!(
            "{}{}{}{}",
            policy("plain", "docker = true"),
            policy(
                "accepting",
                "docker = true\ndocker_unbounded = [\"memory\"]"
            ),
            policy("no-docker", ""),
            policy(
                "opted-out",
                "docker = true\nmemory_max = \"none\"\npids_max = \"none\""
            )
            .replace("memory_max = \"2G\"\n", ""),
        ))
        .unwrap();
        let none = Controllers::default();
        let all = Controllers {
            memory: true,
            pids: true,
            cpu: true,
        };
        assert_eq!(
            docker_bounds(&config, none, Some((6, 1))),
            [
                DockerBounds {
                    policy: "plain".into(),
                    unaccepted: vec![Unbounded::Memory],
                    accepted: vec![],
                },
                DockerBounds {
                    policy: "accepting".into(),
                    unaccepted: vec![],
                    accepted: vec![Unbounded::Memory],
                },
            ]
        );
        // An old kernel lets containers escape pids_max too, which neither accepted.
        let old = docker_bounds(&config, none, Some((5, 10)));
        assert_eq!(old[0].unaccepted, [Unbounded::Memory, Unbounded::Pids]);
        assert_eq!(old[1].unaccepted, [Unbounded::Pids]);
        assert_eq!(docker_bounds(&config, all, Some((5, 10))), []);
        let said = unbounded_refusal(&old[0].unaccepted);
        for words in [
            "no memory controller",
            "no pids controller",
            "Delegate=yes",
            "docker_unbounded = [\"memory\", \"pids\"]",
        ] {
            assert!(said.contains(words), "{said}");
        }
    }

    /// A policy whose runners may get CPUs from a shape (its `cpu`, `shape_max`, a named
    /// shape's) needs the cpu controller; without it, `check` and the log name `cpu`.
    #[test]
    fn a_shape_s_cpus_without_the_cpu_controller_are_named() {
        let policy = |extra: &str| {
            format!(
                "[host]\ncapacity = {{ cpu = 4 }}\n\n[[policy]]\nname = \"p\"\ntarget = \"acme/app\"\nlabels = [\"self-hosted\"]\npids_max = \"none\"\nmemory_max = \"none\"\n{extra}\n"
            )
        };
        let no_cpu = Controllers {
            memory: true,
            pids: true,
            cpu: false,
        };
        for (extra, named) in [
            ("", false),
            ("cpu = 1", true),
            ("shape_max = { memory = \"1G\" }", true),
        ] {
            let config = crate::config::from_text(&policy(extra)).unwrap();
            let missing = unavailable_limits(&config, no_cpu);
            assert_eq!(
                missing.iter().any(|(_, m)| m.contains(&"cpu")),
                named,
                "{extra}: {missing:?}"
            );
        }
    }

    /// `run` refuses, and `check` fails, a runner root no Docker policy's runner could start
    /// its daemon in, naming the policy, the reason and the fix; a policy without Docker, or a
    /// root that fits, says nothing. Persistent slots are judged at the policy's highest one.
    #[test]
    fn a_runner_root_docker_cannot_serve_is_named_with_its_policy_and_the_fix() {
        let policy = |name: &str, extra: &str| {
            format!(
                "[[policy]]\nname = \"{name}\"\ntarget = \"acme/app\"\nlabels = [\"self-hosted\", \"{name}\"]\n{extra}\n"
            )
        };
        let plain = crate::config::from_text(&policy("plain", "")).unwrap();
        let docker = crate::config::from_text(&format!(
            "{}{}",
            policy("plain", ""),
            policy("builds", "docker = true")
        ))
        .unwrap();
        assert_eq!(
            docker_runner_root(&plain, Path::new("/tmp/rm/runners")),
            None
        );
        assert_eq!(
            docker_runner_root(&docker, Path::new("/var/lib/rm-agent/runners")),
            None
        );
        for (root, says) in [
            ("/tmp/rm/runners", "lies under /tmp"),
            ("/dev/shm/runners", "lies under /dev/shm"),
            ("/run/rm-agent/runners", "lies under /run"),
        ] {
            let said = docker_runner_root(&docker, Path::new(root)).unwrap();
            for words in [
                "policy `builds`",
                says,
                "empty tmpfs",
                "every launch would fail",
                "choose a host.runner_root outside /run, /tmp, /var/tmp, /dev/shm",
            ] {
                assert!(said.contains(words), "{words}: {said}");
            }
        }
        // 56 bytes: an ephemeral runtime's containerd socket is 108, one more than fits.
        let deep = format!("/{}", "r".repeat(55));
        let said = docker_runner_root(&docker, Path::new(&deep)).unwrap();
        for words in ["too deep", "108 bytes", "choose a shorter host.runner_root"] {
            assert!(said.contains(words), "{words}: {said}");
        }
        // 55 bytes: an ephemeral runtime (`/` and 12 hex digits) fits, as does a slot of the
        // nine-letter `docker-ci` up to `s9`; an eleventh slot, `s10`, is one byte too long.
        let root = format!("/{}", "r".repeat(54));
        assert_eq!(docker_runner_root(&docker, Path::new(&root)), None);
        let slots = |max: u32| {
            crate::config::from_text(&policy(
                "docker-ci",
                &format!("docker = true\nworkspace = \"persistent\"\nmax_runners = {max}"),
            ))
            .unwrap()
        };
        assert_eq!(docker_runner_root(&slots(1), Path::new(&root)), None);
        assert_eq!(docker_runner_root(&slots(10), Path::new(&root)), None);
        let said = docker_runner_root(&slots(11), Path::new(&root)).unwrap();
        assert!(said.contains("/docker-ci/s10/docker/"), "{said}");
    }
}
