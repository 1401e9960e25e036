//! How many runners a policy starts now. Pure arithmetic over values the executor's control loop
//! (the only allocator) reads before each runner it creates, following the predecessor's rule (it came from real incidents):
//!
//! `to_start = min(clamp(demand, min, max) - starting and not yet busy, max - live of the policy,
//! host headroom)`
//!
//! Busy runners do not offset demand (they took a job; the queued ones still need runners), and
//! runners still starting or idle do (they will take the queued jobs), so a job that stays
//! `queued` while its runner starts never causes a second runner. A policy's `max_runners` is
//! its ceiling on live runners, busy ones included, as an operator reads it (two GPUs, two
//! runners): the predecessor left open whether its ceiling capped busy runners, and capping only
//! the runners waiting for a job let a policy run past it. Demand is advisory: a surplus runner
//! exits on its idle timeout and counts as an idle exit, not a failure.

/// The inputs of one allocation, read by the control loop before each runner it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AllocationInput {
    /// Queued jobs routed to this policy.
    pub demand: u32,
    pub min_runners: u32,
    pub max_runners: u32,
    /// This policy's runners that are allocated, starting or idle: live but not busy.
    pub unassigned_in_flight: u32,
    /// This policy's live runners, busy ones included.
    pub policy_live: u32,
    /// Live runners of every policy on this host (allocated, starting, idle or busy).
    pub host_live: u32,
    pub host_max: u32,
}

/// Why the allocation is what it is, for `status` and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Demand (or its absence) decided.
    Demand,
    /// `min_runners` raised the target above demand.
    MinRunners,
    /// `max_runners` capped the target.
    MaxRunners,
    /// The host's ceiling left no more room.
    HostCapacity,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub desired: u32,
    pub headroom: u32,
    pub to_start: u32,
    pub limit: Limit,
}

/// The policy ceiling: how many more runners a policy with ceiling `max` (its `max_runners`,
/// raised to its `min_runners`) may have while `policy_live` of its runners are live, busy ones
/// included. `.ci/mutants` breaks this rule by name (`policy-ceiling`).
pub(crate) fn policy_room(max: u32, policy_live: u32) -> u32 {
    max.saturating_sub(policy_live)
}

/// The host ceiling: how many more runners of any policy the host may have while `host_live`
/// are live under its `host.max_runners` (`host_max`); never an underflow when the ceiling was
/// lowered below what runs. `.ci/mutants` breaks this rule by name (`host-ceiling`).
pub(crate) fn host_headroom(host_max: u32, host_live: u32) -> u32 {
    host_max.saturating_sub(host_live)
}

/// Decides how many runners to start.
pub(crate) fn allocate(input: AllocationInput) -> Allocation {
    let max = input.max_runners.max(input.min_runners);
    let desired = input.demand.clamp(input.min_runners, max);
    let wanted = desired.saturating_sub(input.unassigned_in_flight);
    let headroom = host_headroom(input.host_max, input.host_live);
    let policy_room = policy_room(max, input.policy_live);
    let to_start = wanted.min(headroom).min(policy_room);
    let limit = if to_start < wanted && policy_room < headroom {
        Limit::MaxRunners
    } else if to_start < wanted {
        Limit::HostCapacity
    } else if input.demand > max {
        Limit::MaxRunners
    } else if input.demand < input.min_runners {
        Limit::MinRunners
    } else {
        Limit::Demand
    };
    Allocation {
        desired,
        headroom,
        to_start,
        limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(demand: u32, in_flight: u32, host_live: u32) -> AllocationInput {
        AllocationInput {
            demand,
            min_runners: 0,
            max_runners: 4,
            unassigned_in_flight: in_flight,
            policy_live: host_live,
            host_live,
            host_max: 4,
        }
    }

    #[test]
    fn each_ceiling_leaves_the_room_below_it_and_never_underflows() {
        // (ceiling, live, room): the same rule for a policy's and the host's ceiling.
        for (ceiling, live, room) in [(2, 0, 2), (2, 1, 1), (2, 2, 0), (2, 5, 0), (0, 0, 0)] {
            assert_eq!(policy_room(ceiling, live), room, "policy {ceiling} {live}");
            assert_eq!(host_headroom(ceiling, live), room, "host {ceiling} {live}");
        }
    }

    #[test]
    fn a_policys_ceiling_counts_its_busy_runners() {
        // Two GPUs: max_runners 2, both runners busy, a third job queued: nothing starts, and
        // the policy's ceiling (not the roomy host) is what holds it.
        let a = allocate(AllocationInput {
            demand: 1,
            min_runners: 0,
            max_runners: 2,
            unassigned_in_flight: 0,
            policy_live: 2,
            host_live: 2,
            host_max: 8,
        });
        assert_eq!((a.to_start, a.limit), (0, Limit::MaxRunners));
        // One finished and cleaned: one more.
        let a = allocate(AllocationInput {
            demand: 1,
            min_runners: 0,
            max_runners: 2,
            unassigned_in_flight: 0,
            policy_live: 1,
            host_live: 1,
            host_max: 8,
        });
        assert_eq!(a.to_start, 1);
    }

    #[test]
    fn busy_runners_do_not_offset_demand_but_starting_ones_do() {
        // One busy (host_live counts it), one starting, two queued: start one more.
        let a = allocate(input(2, 1, 2));
        assert_eq!(a.to_start, 1);
        assert_eq!(a.limit, Limit::Demand);
    }

    #[test]
    fn a_job_still_queued_while_its_runner_starts_starts_nothing_more() {
        assert_eq!(allocate(input(1, 1, 1)).to_start, 0);
    }

    #[test]
    fn an_eight_job_matrix_on_a_four_runner_host_starts_four() {
        let a = allocate(input(8, 0, 0));
        assert_eq!((a.desired, a.to_start, a.limit), (4, 4, Limit::MaxRunners));
        // Four busy: the next four jobs still queued get nothing until one finishes.
        let a = allocate(input(4, 0, 4));
        assert_eq!((a.to_start, a.limit), (0, Limit::HostCapacity));
        // One finished and cleaned.
        assert_eq!(allocate(input(4, 0, 3)).to_start, 1);
    }

    #[test]
    fn min_runners_start_without_demand() {
        let a = allocate(AllocationInput {
            min_runners: 2,
            ..input(0, 0, 0)
        });
        assert_eq!((a.to_start, a.limit), (2, Limit::MinRunners));
    }

    #[test]
    fn the_host_ceiling_caps_every_policy() {
        let a = allocate(AllocationInput {
            max_runners: 10,
            ..input(10, 0, 3)
        });
        assert_eq!(
            (a.headroom, a.to_start, a.limit),
            (1, 1, Limit::HostCapacity)
        );
        // Over the ceiling (a lowered host.max_runners): nothing, never an underflow.
        assert_eq!(allocate(input(4, 0, 9)).to_start, 0);
    }

    #[test]
    fn never_more_than_the_host_allows_for_any_input() {
        for demand in 0..10 {
            for in_flight in 0..6 {
                for live in in_flight..8 {
                    let a = allocate(input(demand, in_flight, live));
                    assert!(
                        live + a.to_start <= 4 || a.to_start == 0,
                        "{demand} {in_flight} {live}: {a:?}"
                    );
                    assert!(a.to_start + in_flight <= 4.max(in_flight));
                }
            }
        }
    }
}
