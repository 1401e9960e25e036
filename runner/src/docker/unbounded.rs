//! What a runner's Docker leaves unbounded on this host, and whether the configuration accepted
//! it (`policy.docker_unbounded`). One pure rule, [`unbounded`], owned here: `run` refuses a
//! `docker = true` policy while it leaves something unbounded the policy did not accept, and
//! `check` says the same.
//!
//! Why Docker needs its own rule: a runner's own processes are bounded by its cgroup and, where
//! the pids controller is missing, by its uid's `RLIMIT_NPROC`. A daemon's containers run under
//! the uid's *subordinate* ids, so a per-uid count misses them unless the kernel charges a user
//! namespace's processes to its creator (Linux 5.14 and later: the daemon tree is started under
//! the runner's `RLIMIT_NPROC`, `docker::launch`). Without a memory controller nothing bounds the
//! daemon's memory or its containers' (the daemon's own tmpfs are sized: `docker::copy_up`).

use crate::cgroup::{Controllers, Limits};

/// The first kernel that keeps `RLIMIT_NPROC` counts per user namespace and charges them up to
/// the namespace's creator ("ucounts: Move RLIMIT_NPROC into ucounts", Linux 5.14). Before it,
/// each subordinate uid of a container had a count of its own.
pub const NPROC_CHARGED_TO_CREATOR_SINCE: (u32, u32) = (5, 14);

/// A resource a runner's Docker can take without bound here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unbounded {
    Memory,
    Pids,
}

impl Unbounded {
    /// Every value, as `docker_unbounded` names them.
    pub const ALL: [Unbounded; 2] = [Unbounded::Memory, Unbounded::Pids];

    pub fn as_str(self) -> &'static str {
        match self {
            Unbounded::Memory => "memory",
            Unbounded::Pids => "pids",
        }
    }

    /// A `docker_unbounded` entry. Pure.
    pub fn parse(written: &str) -> Result<Unbounded, String> {
        Unbounded::ALL
            .into_iter()
            .find(|u| u.as_str() == written)
            .ok_or_else(|| format!("`{written}` is neither \"memory\" nor \"pids\""))
    }

    /// What stays unbounded, for an operator.
    pub fn why(self) -> &'static str {
        match self {
            Unbounded::Memory => {
                "runner cgroups get no memory controller here, so memory_max is not applied: a Docker job's daemon, its containers and their tmpfs take the host's memory without bound"
            }
            Unbounded::Pids => {
                "runner cgroups get no pids controller here and the kernel (before 5.14) counts each subordinate uid's processes on their own: a Docker job's containers escape pids_max"
            }
        }
    }
}

/// What a runner's Docker leaves unbounded under `limits`, where runner cgroups offer
/// `available` and the kernel is `kernel` (`None`: unknown, taken as too old). A bound the
/// policy itself opted out of (`"none"`) is the policy's choice, named where it wrote it, and
/// not listed again. Pure.
pub fn unbounded(
    limits: &Limits,
    available: Controllers,
    kernel: Option<(u32, u32)>,
) -> Vec<Unbounded> {
    let mut out = Vec::new();
    if limits.memory_max.is_some() && !available.memory {
        out.push(Unbounded::Memory);
    }
    if limits.pids_max.is_some() && !available.pids && !charged_to_creator(kernel) {
        out.push(Unbounded::Pids);
    }
    out
}

/// Whether kernel `kernel` (`None`: unknown, taken as too old) bounds a runner's containers
/// by the runner's `RLIMIT_NPROC`. Pure.
pub fn charged_to_creator(kernel: Option<(u32, u32)>) -> bool {
    kernel.is_some_and(|k| k >= NPROC_CHARGED_TO_CREATOR_SINCE)
}

/// What of `unbounded` the policy did not accept. Pure.
pub fn unaccepted(unbounded: &[Unbounded], accepted: &[Unbounded]) -> Vec<Unbounded> {
    unbounded
        .iter()
        .copied()
        .filter(|u| !accepted.contains(u))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_runners_docker_leaves_unbounded() {
        let both = Limits {
            memory_max: Some(1 << 30),
            pids_max: Some(4096),
            cpu_weight: None,
            cpu_max: None,
        };
        let none = Limits {
            memory_max: None,
            pids_max: None,
            cpu_weight: None,
            cpu_max: None,
        };
        let offered = |memory, pids| Controllers {
            memory,
            pids,
            cpu: false,
        };
        use Unbounded::{Memory, Pids};
        for (limits, available, kernel, expected) in [
            // Every controller: nothing.
            (&both, offered(true, true), Some((6, 1)), vec![]),
            // This machine: no controller, a kernel that charges the creator: memory only.
            (&both, offered(false, false), Some((6, 18)), vec![Memory]),
            (&both, offered(false, false), Some((5, 14)), vec![Memory]),
            // An older kernel: containers' processes escape RLIMIT_NPROC too.
            (
                &both,
                offered(false, false),
                Some((5, 13)),
                vec![Memory, Pids],
            ),
            (&both, offered(true, false), Some((5, 10)), vec![Pids]),
            // A kernel that could not be read is taken as too old.
            (&both, offered(true, false), None, vec![Pids]),
            // The pids controller bounds them on any kernel.
            (&both, offered(true, true), Some((5, 10)), vec![]),
            // A bound the policy opted out of is not listed again.
            (&none, offered(false, false), Some((5, 10)), vec![]),
        ] {
            assert_eq!(
                unbounded(limits, available, kernel),
                expected,
                "{limits:?} {available:?} {kernel:?}"
            );
        }
    }

    #[test]
    fn only_what_was_not_accepted_refuses() {
        use Unbounded::{Memory, Pids};
        assert_eq!(unaccepted(&[Memory, Pids], &[Memory]), [Pids]);
        assert_eq!(unaccepted(&[Memory], &[Memory, Pids]), []);
        assert_eq!(unaccepted(&[], &[]), []);
        assert_eq!(Unbounded::parse("memory"), Ok(Memory));
        assert_eq!(Unbounded::parse("pids"), Ok(Pids));
        assert!(Unbounded::parse("cpu").unwrap_err().contains("`cpu`"));
    }
}
