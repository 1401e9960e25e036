//! `check`'s `isolation` finding (CONTRACT §7): the isolation `run` would give runners here, with
//! its evidence: the uid pool and how much of it is held, the cgroup v2 directory runner cgroups
//! would go in and which limit controllers it offers, and that no secret file is readable by a
//! runner uid. Looks only: it creates no cgroup and moves no process.

use std::path::PathBuf;

use super::{Finding, Status};
use crate::config::{Config, Isolation, Network};
use rm_runner::cgroup::{self, Controllers};
use rm_runner::isolate::{self, Pool};

pub(super) fn isolation(config: &Config) -> Finding {
    if config.host.isolation == Isolation::None {
        return Finding::warn(
            "isolation",
            format!("isolation none: {}", crate::isolation::NONE_REACHES),
            "set [host] isolation = \"user\" and run rm-agent as root (deploy/systemd/rm-agent.service)",
        );
    }
    if !isolate::can_switch_users() {
        return Finding::from_exit(
            Status::Fail,
            "isolation",
            &crate::isolation::cannot_switch(config),
        );
    }
    let pool = match Pool::resolve(&config.host.runner_uids) {
        Ok(pool) => pool,
        Err(problem) => {
            return Finding::fail(
                "isolation",
                format!("the runner uid pool cannot be used: {problem}"),
                "fix `host.runner_uids`",
            );
        }
    };
    if let Err(exit) = crate::secrets::refuse_readable_by_runners(config, &pool) {
        return Finding::from_exit(Status::Fail, "isolation", &exit);
    }
    let held = crate::commands::open_reader(config)
        .ok()
        .and_then(|r| r.uncleaned_attempts().ok())
        .map_or(0, |a| a.iter().filter(|a| a.uid.is_some()).count());
    let evidence = cgroup_evidence(config);
    let unenforced = bounds_unenforced(
        evidence.as_ref().ok().map(|(_, c)| *c),
        config
            .policies
            .iter()
            .any(|p| p.limits.memory_max.is_some()),
        config.policies.iter().any(|p| p.limits.pids_max.is_some()),
    );
    let cgroups = match evidence {
        Ok((dir, controllers)) => {
            let have: Vec<&str> = [
                ("memory", controllers.memory),
                ("pids", controllers.pids),
                ("cpu", controllers.cpu),
            ]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
            let lacking = limits_lacking(config, controllers);
            format!(
                "runner cgroups under {} (limit controllers offered: {}){}",
                dir.display(),
                if have.is_empty() {
                    "none".to_owned()
                } else {
                    have.join(", ")
                },
                if lacking.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; these limits cannot be applied here: {} (pids_max still applies as the runner uid's process limit)",
                        lacking.join(", ")
                    )
                }
            )
        }
        Err(why) => format!(
            "no runner cgroups ({why}): every process of a runner's uid is killed at cleanup instead"
        ),
    };
    let what = format!(
        "isolation user: runner uids {} ({} held by attempts not yet cleaned); {cgroups}; no secret file is readable by a runner uid",
        describe_pool(&pool),
        held
    );
    match unenforced {
        None => Finding::ok("isolation", what),
        Some(why) => Finding::warn(
            "isolation",
            format!("{what}; {why}"),
            "give the runner cgroups the memory and pids controllers: cgroup v2 only (boot with systemd.unified_cgroup_hierarchy=1), and Delegate=yes for the agent's unit (deploy/systemd/rm-agent.service) or a host.cgroup_root that has them",
        ),
    }
}

/// Why memory or processes go unbounded here although a policy bounds them (every policy does
/// by default): the runner cgroups would get no `memory` or no `pids` controller, or there are
/// no runner cgroups at all (`None`). Pure: `None` when nothing is missing.
pub(super) fn bounds_unenforced(
    controllers: Option<Controllers>,
    memory_bounded: bool,
    pids_bounded: bool,
) -> Option<String> {
    let controllers = controllers.unwrap_or_default();
    let mut missing = Vec::new();
    if memory_bounded && !controllers.memory {
        missing.push(
            "no memory controller: memory_max is not applied and a job may take the host's memory",
        );
    }
    if pids_bounded && !controllers.pids {
        missing.push("no pids controller: pids_max applies only as the runner uid's RLIMIT_NPROC");
    }
    (!missing.is_empty()).then(|| format!("bounds not enforced here: {}", missing.join("; ")))
}

/// `check`'s `network` finding: what a runner's network is, and whether the tools that make a
/// private one are here (looked up, not run against the kernel: `check` changes nothing).
pub(super) fn network(config: &Config) -> Finding {
    if config.host.isolation == Isolation::None {
        return Finding::ok(
            "network",
            "network host: runners run as the agent's own user (isolation none), in its network",
        );
    }
    if config.host.network == Network::Host {
        return Finding::warn(
            "network",
            format!("network host: {}", crate::isolation::HOST_NETWORK_REACHES),
            "set [host] network = \"private\" (the default)",
        );
    }
    let missing = rm_runner::network::missing_tools();
    if !missing.is_empty() {
        return Finding::fail(
            "network",
            format!(
                "network private needs {} to make each runner's namespace, and it is not on the PATH",
                missing.join(" and ")
            ),
            format!(
                "install {} (or set [host] network = \"host\", and jobs reach every service of the host)",
                missing.join(" and ")
            ),
        );
    }
    let ports: Vec<String> = config
        .host
        .network_host_ports
        .iter()
        .map(ToString::to_string)
        .collect();
    let deny: Vec<String> = config
        .host
        .network_deny
        .iter()
        .map(ToString::to_string)
        .collect();
    Finding::ok(
        "network",
        format!(
            "network private: a namespace per runner, the world through NAT; host ports reachable: {}; denied besides the host, other runners and {}: {}",
            if ports.is_empty() {
                "none".to_owned()
            } else {
                ports.join(", ")
            },
            rm_runner::network::BUILTIN_DENY.join(", "),
            if deny.is_empty() {
                "nothing".to_owned()
            } else {
                deny.join(", ")
            },
        ),
    )
}

fn describe_pool(pool: &Pool) -> String {
    let accounts = pool.accounts();
    match (accounts.first(), accounts.last()) {
        (Some(first), Some(last)) => {
            format!("{}-{} ({} uids)", first.uid, last.uid, accounts.len())
        }
        _ => "(empty)".to_owned(),
    }
}

/// Where runner cgroups would go and what the place offers to its children, without changing
/// anything: the configured directory, or (auto) the agent's own cgroup.
pub(super) fn cgroup_evidence(config: &Config) -> Result<(PathBuf, Controllers), String> {
    let dir = match &config.host.cgroup_root {
        Some(dir) => dir.clone(),
        None => {
            let mountinfo =
                std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
            let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
            let own = cgroup::own_cgroup_path(&own).ok_or("this process is in no cgroup v2")?;
            cgroup::cgroup_dir(&cgroup::cgroup2_mounts(&mountinfo), &own)
                .ok_or("no cgroup v2 is mounted")?
        }
    };
    let controllers = std::fs::read_to_string(dir.join("cgroup.controllers"))
        .map_err(|e| format!("{} is not a cgroup v2 directory: {e}", dir.display()))?;
    rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).map_err(|e| {
        format!(
            "{} is not writable: {e}; on systemd set Delegate=yes",
            dir.display()
        )
    })?;
    Ok((dir, cgroup::parse_controllers(&controllers)))
}

/// The configured limits whose controller is not offered, as `memory_max of policy linux`.
fn limits_lacking(config: &Config, controllers: Controllers) -> Vec<String> {
    crate::isolation::unavailable_limits(config, controllers)
        .into_iter()
        .flat_map(|(policy, missing)| {
            missing
                .into_iter()
                .map(move |name| format!("{name} of policy {policy}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_without_its_controller_is_a_warning() {
        let all = Controllers {
            memory: true,
            pids: true,
            cpu: true,
        };
        let hugetlb_only = Controllers::default();
        let pids_only = Controllers {
            pids: true,
            ..Controllers::default()
        };
        for (controllers, memory, pids, warns) in [
            (Some(all), true, true, &[][..]),
            (Some(hugetlb_only), true, true, &["memory", "pids"][..]),
            (Some(pids_only), true, true, &["memory"][..]),
            // No runner cgroups at all: neither is enforced.
            (None, true, true, &["memory", "pids"][..]),
            // A bound every policy opted out of needs no controller.
            (Some(hugetlb_only), false, true, &["pids"][..]),
            (None, false, false, &[][..]),
        ] {
            let found = bounds_unenforced(controllers, memory, pids);
            assert_eq!(
                found.is_some(),
                !warns.is_empty(),
                "{controllers:?} {found:?}"
            );
            for name in warns {
                let text = found.as_deref().unwrap_or_default();
                assert!(text.contains(&format!("no {name} controller")), "{text}");
            }
        }
    }
}
