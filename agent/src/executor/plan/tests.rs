//! The plan's rules, as tables: what starts, what is claimed, and what holds demand back.

use std::collections::{HashMap, HashSet};

use rm_journal::{LiveCounts, PolicyLive};
use rm_vocab::JobId;

use super::*;
use crate::executor::harness::policy;

fn jobs(ids: &[i64]) -> Vec<JobId> {
    ids.iter().map(|&id| JobId::new(id)).collect()
}

fn counts(per_policy: &[(&str, u32, u32)]) -> LiveCounts {
    let mut counts = LiveCounts::default();
    for &(name, live, busy) in per_policy {
        counts
            .per_policy
            .insert(name.to_owned(), PolicyLive { live, busy });
    }
    counts
}

fn inputs<'a>(p: &'a Policy, queued: &[i64]) -> PolicyInputs<'a> {
    PolicyInputs {
        policy: p,
        backing_off_until: None,
        jobs: jobs(queued),
        fenced: 0,
        count: u32::try_from(queued.len()).unwrap(),
        busy_unknown: 0,
        shaped: Shaped::default(),
    }
}

fn one(plan: &Plan) -> &PolicyPlan {
    &plan.policies[0]
}

#[test]
fn demand_starts_runners_up_to_the_first_ceiling_and_says_which() {
    let linux = policy("linux", &["self-hosted"], 3);
    // (queued, live, busy, host_max, start, held)
    let at_max = Held::AtCapacity {
        limit: CeilingKind::MaxRunners,
        ceiling: 3,
    };
    // Both ceilings full: the host's is named (the policy could not start one anyway).
    let at_host = Held::AtCapacity {
        limit: CeilingKind::HostCapacity,
        ceiling: 3,
    };
    for (queued, live, busy, host_max, start, held) in [
        (&[1, 2][..], 0, 0, 4, 2, vec![]),
        // Runners waiting for a job offset demand: a queued job whose runner starts gets no
        // second one.
        (&[1, 2], 2, 0, 4, 0, vec![]),
        // Busy runners do not; the policy's ceiling counts them.
        (&[1, 2, 3, 4], 2, 2, 8, 1, vec![at_max.clone()]),
        (&[1, 2, 3], 3, 3, 8, 0, vec![at_max]),
        (
            &[1, 2, 3],
            0,
            0,
            2,
            2,
            vec![Held::AtCapacity {
                limit: CeilingKind::HostCapacity,
                ceiling: 2,
            }],
        ),
        (&[1, 2, 3], 3, 3, 3, 0, vec![at_host]),
        (&[], 0, 0, 4, 0, vec![]),
    ] {
        let counts = counts(&[("linux", live, busy)]);
        let plan = plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit: true,
            host_max,
            counts: &counts,
            policies: vec![inputs(&linux, queued)],
            standing: None,
            free_uids: None,
            packing: Packing::default(),
        });
        let p = one(&plan);
        assert_eq!(
            (p.demand, p.start, &p.held),
            (u32::try_from(queued.len()).unwrap(), start, &held),
            "{queued:?} live {live} busy {busy} host {host_max}"
        );
    }
}

#[test]
fn the_surplus_is_the_runners_waiting_for_a_job_beyond_the_count() {
    let set = policy("set", &["set"], 8);
    // (count, live, busy, surplus)
    for (count, live, busy, surplus) in [
        (0, 0, 0, 0),
        // Two idle runners, one job: one too many.
        (1, 2, 0, 1),
        (2, 2, 0, 0),
        // Busy runners are not surplus: the count is already less them.
        (0, 3, 3, 0),
        (1, 4, 2, 1),
        // Fewer than wanted: runners start instead.
        (3, 1, 0, 0),
    ] {
        let counts = counts(&[("set", live, busy)]);
        let plan = plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit: true,
            host_max: 8,
            counts: &counts,
            policies: vec![PolicyInputs {
                count,
                ..inputs(&set, &[])
            }],
            standing: None,
            free_uids: None,
            packing: Packing::default(),
        });
        assert_eq!(
            one(&plan).surplus(),
            surplus,
            "count {count} live {live} busy {busy}"
        );
    }
}

#[test]
fn policies_take_the_host_s_room_in_their_order() {
    let (a, b) = (policy("a", &["a"], 10), policy("b", &["b"], 10));
    let counts = counts(&[]);
    let plan = plan(&Inputs {
        now_ms: UnixMs::new(1_000),
        fit: true,
        host_max: 3,
        counts: &counts,
        policies: vec![inputs(&a, &[1, 2]), inputs(&b, &[3, 4])],
        standing: None,
        free_uids: None,
        packing: Packing::default(),
    });
    let starts: Vec<u32> = plan.policies.iter().map(|p| p.start).collect();
    assert_eq!(starts, [2, 1]);
    assert_eq!(
        plan.policies[1].held,
        [Held::AtCapacity {
            limit: CeilingKind::HostCapacity,
            ceiling: 3
        }]
    );
}

#[test]
fn an_unfit_host_a_back_off_and_a_fence_hold_demand_back_but_it_still_counts() {
    let linux = policy("linux", &["self-hosted"], 4);
    let counts = counts(&[]);
    let mut backing_off = inputs(&linux, &[1, 2]);
    backing_off.backing_off_until = Some(UnixMs::new(5_000));
    let mut fenced = inputs(&linux, &[3]);
    fenced.fenced = 2;
    let mut over = inputs(&linux, &[1]);
    over.backing_off_until = Some(UnixMs::new(500));
    // (fit, inputs, start, held)
    for (fit, p, start, held) in [
        (false, inputs(&linux, &[1, 2]), 0, vec![Held::Unfit]),
        (
            true,
            backing_off,
            0,
            vec![Held::BackingOff {
                until_ms: UnixMs::new(5_000),
            }],
        ),
        // A back-off that is over holds nothing.
        (true, over, 1, vec![]),
        (true, fenced, 1, vec![Held::Fenced { jobs: 2 }]),
    ] {
        let demand = p.count;
        let plan = plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit,
            host_max: 4,
            counts: &counts,
            policies: vec![p],
            standing: None,
            free_uids: None,
            packing: Packing::default(),
        });
        let p = one(&plan);
        assert_eq!((p.demand, p.start, &p.held), (demand, start, &held));
        // A launch in flight for the policy is still wanted: its jobs are there.
        assert!(plan.wants(&linux));
    }
}

#[test]
fn busy_runners_whose_job_is_unknown_took_queued_jobs() {
    let linux = policy("linux", &["self-hosted"], 4);
    let counts = counts(&[("linux", 1, 1)]);
    let mut p = inputs(&linux, &[1, 2]);
    p.busy_unknown = 1;
    let plan = plan(&Inputs {
        now_ms: UnixMs::new(1_000),
        fit: true,
        host_max: 4,
        counts: &counts,
        policies: vec![p],
        standing: None,
        free_uids: None,
        packing: Packing::default(),
    });
    assert_eq!((one(&plan).demand, one(&plan).start), (2, 1));
}

fn standing(mine: &[i64], others: &[i64]) -> Standing {
    let mine = jobs(mine);
    let mut taken: HashSet<JobId> = jobs(others).into_iter().collect();
    taken.extend(mine.iter().copied());
    Standing {
        mine: HashMap::from([("linux".to_owned(), mine.clone())]),
        held: mine.into_iter().collect(),
        taken,
    }
}

#[test]
fn a_fleet_host_claims_what_it_could_start_gives_back_what_no_longer_counts_and_starts_what_it_won()
{
    let linux = policy("linux", &["self-hosted"], 3);
    let counts = counts(&[]);
    // Queued 1..=5; this host claims 1, and 9 (no longer queued); another host claims 2.
    let standing = standing(&[1, 9], &[2]);
    let mut plan = plan(&Inputs {
        now_ms: UnixMs::new(1_000),
        fit: true,
        host_max: 8,
        counts: &counts,
        policies: vec![inputs(&linux, &[1, 2, 3, 4, 5])],
        standing: Some(&standing),
        free_uids: None,
        packing: Packing::default(),
    });
    let p = &mut plan.policies[0];
    // Room for 3 (its max_runners): it holds 1, so it claims the 2 oldest unclaimed.
    assert_eq!(p.claim, jobs(&[3, 4]));
    assert_eq!(p.release, jobs(&[9]));
    assert!(p.held.contains(&Held::ClaimedElsewhere { jobs: 1 }));
    assert_eq!((p.demand, p.start), (3, 3));
    // Another host won one of the two.
    p.after_claims(&jobs(&[3]));
    assert_eq!((p.demand, p.start), (2, 2));
    // It won none, and its claim went away: no demand on this host, and its launches in
    // flight are not wanted any more.
    p.after_claims(&[]);
    assert_eq!((p.demand, p.start), (1, 1));
}

#[test]
fn a_plan_says_a_policy_without_demand_wants_no_runner_unless_it_keeps_a_minimum() {
    let mut linux = policy("linux", &["self-hosted"], 3);
    let counts = counts(&[]);
    let made = |p: &Policy| {
        plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit: true,
            host_max: 4,
            counts: &counts,
            policies: vec![inputs(p, &[])],
            standing: None,
            free_uids: None,
            packing: Packing::default(),
        })
    };
    assert!(!made(&linux).wants(&linux));
    linux.min_runners = 1;
    assert!(made(&linux).wants(&linux));
    // No plan yet: a launch goes on.
    linux.min_runners = 0;
    assert!(Plan::default().wants(&linux));
}

#[test]
fn a_ceiling_is_said_even_while_the_policy_may_not_start_and_room_counts_it() {
    let linux = policy("linux", &["self-hosted"], 2);
    let counts = counts(&[("linux", 1, 1)]);
    let mut p = inputs(&linux, &[1, 2, 3]);
    p.backing_off_until = Some(UnixMs::new(5_000));
    let plan = plan(&Inputs {
        now_ms: UnixMs::new(1_000),
        fit: true,
        host_max: 8,
        counts: &counts,
        policies: vec![p],
        standing: None,
        free_uids: None,
        packing: Packing::default(),
    });
    let p = one(&plan);
    // One more runner fits under max_runners = 2; the back-off starts none.
    assert_eq!((p.demand, p.start, p.room), (3, 0, 1));
    assert_eq!(
        p.held,
        [
            Held::BackingOff {
                until_ms: UnixMs::new(5_000),
            },
            Held::AtCapacity {
                limit: CeilingKind::MaxRunners,
                ceiling: 2
            }
        ]
    );
}

#[test]
fn free_uids_bound_the_starts_of_every_policy_in_their_order() {
    let (a, b) = (policy("a", &["a"], 10), policy("b", &["b"], 10));
    let counts = counts(&[]);
    // (free uids, starts of a and b, whether each said NoFreeUid)
    for (free, starts, no_uid) in [
        (None, [2, 2], [false, false]),
        (Some(4), [2, 2], [false, false]),
        (Some(3), [2, 1], [false, true]),
        (Some(1), [1, 0], [true, true]),
        (Some(0), [0, 0], [true, true]),
    ] {
        let plan = plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit: true,
            host_max: 8,
            counts: &counts,
            policies: vec![inputs(&a, &[1, 2]), inputs(&b, &[3, 4])],
            standing: None,
            free_uids: free,
            packing: Packing::default(),
        });
        let got: Vec<u32> = plan.policies.iter().map(|p| p.start).collect();
        assert_eq!(got, starts, "{free:?}");
        let said: Vec<bool> = plan
            .policies
            .iter()
            .map(|p| p.held.contains(&Held::NoFreeUid))
            .collect();
        assert_eq!(said, no_uid, "{free:?}");
        // The ceilings' room is not the uids'.
        assert!(plan.policies.iter().all(|p| p.room == 2));
    }
}

/// Packing (issue 42): sizes in CPUs (each also 1 GiB), on a host of `cpus` CPUs.
mod packing {
    use super::*;
    use crate::executor::plan::pack::{Need, Resource, Room, Wait};

    fn need(cpus: u64) -> Need {
        Need {
            cpu_millis: cpus * 1000,
            memory: 1 << 30,
            ..Need::default()
        }
    }

    fn host(cpus: u64, held: &[u64]) -> Packing {
        Packing {
            capacity: Room {
                cpu_millis: Some(cpus * 1000),
                ..Room::default()
            },
            held: held.iter().map(|c| need(*c)).collect(),
        }
    }

    /// A policy's inputs: `queued` as (job, key, cpus), `in_flight` per key.
    fn shaped<'a>(
        p: &'a Policy,
        queued: &[(i64, &str, u64)],
        in_flight: &[(&str, u32)],
        warm: u64,
    ) -> PolicyInputs<'a> {
        let ids: Vec<i64> = queued.iter().map(|q| q.0).collect();
        PolicyInputs {
            shaped: Shaped {
                sizes: queued
                    .iter()
                    .map(|&(id, key, cpus)| {
                        (
                            JobId::new(id),
                            Sized {
                                key: key.to_owned(),
                                need: need(cpus),
                                queued_at_ms: UnixMs::new(1_000),
                            },
                        )
                    })
                    .collect(),
                in_flight: in_flight
                    .iter()
                    .map(|(k, n)| ((*k).to_owned(), *n))
                    .collect(),
                warm: need(warm),
            },
            ..inputs(p, &ids)
        }
    }

    fn planned(packing: Packing, live: u32, policies: Vec<PolicyInputs<'_>>) -> Plan {
        let counts = counts(&[("linux", live, 0)]);
        plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit: true,
            host_max: 8,
            counts: &counts,
            policies,
            standing: None,
            free_uids: None,
            packing,
        })
    }

    fn started(p: &PolicyPlan) -> Vec<Option<i64>> {
        p.starts.iter().map(|s| s.job.map(|j| j.get())).collect()
    }

    #[test]
    fn a_live_runner_of_one_shape_stands_for_no_job_of_another() {
        let linux = policy("linux", &["self-hosted"], 4);
        // An idle default runner, one large job queued: the job gets a runner of its own.
        let plan = planned(
            host(8, &[1]),
            1,
            vec![shaped(&linux, &[(1, "rm-cpu=4", 4)], &[("", 1)], 1)],
        );
        assert_eq!(started(one(&plan)), vec![Some(1)]);
        assert_eq!(one(&plan).starts[0].key, "rm-cpu=4");
        // A starting runner of its own shape: nothing more.
        let plan = planned(
            host(8, &[4]),
            1,
            vec![shaped(&linux, &[(1, "rm-cpu=4", 4)], &[("rm-cpu=4", 1)], 1)],
        );
        assert_eq!(one(&plan).start, 0);
    }

    #[test]
    fn what_does_not_fit_waits_and_says_for_what() {
        let linux = policy("linux", &["self-hosted"], 8);
        let plan = planned(
            host(8, &[]),
            0,
            vec![shaped(
                &linux,
                &[
                    (1, "rm-cpu=6", 6),
                    (2, "rm-cpu=6", 6),
                    (3, "rm-cpu=2", 2),
                    (4, "rm-cpu=16", 16),
                ],
                &[],
                1,
            )],
        );
        let p = one(&plan);
        assert_eq!(started(p), vec![Some(1), Some(3)]);
        assert_eq!(
            p.waits,
            vec![
                (
                    JobId::new(2),
                    Wait::Room {
                        resource: Resource::Cpu
                    }
                ),
                (
                    JobId::new(4),
                    Wait::ExceedsHost {
                        resource: Resource::Cpu
                    }
                ),
            ]
        );
        assert!(p.held.contains(&Held::WaitingForRoom {
            resource: Resource::Cpu
        }));
        assert!(p.held.contains(&Held::ShapeExceedsHost { jobs: 1 }));
        let published = plan.published();
        assert_eq!(published.policies["linux"].waits.len(), 2);
    }

    #[test]
    fn policies_share_the_host_s_room_in_their_order_and_warm_runners_come_last() {
        let mut a = policy("a", &["a"], 4);
        a.min_runners = 2;
        let b = policy("b", &["b"], 4);
        let plan = planned(
            host(8, &[]),
            0,
            vec![
                shaped(&a, &[(1, "rm-cpu=4", 4)], &[], 2),
                shaped(&b, &[(2, "rm-cpu=4", 4)], &[], 1),
            ],
        );
        // a (planned first): a runner for its job (4 CPUs) and one warm runner of its default
        // shape (2 CPUs) for `min_runners = 2`; b's job (4 CPUs) does not fit the 2 left.
        assert_eq!(started(&plan.policies[0]), vec![Some(1), None]);
        assert_eq!(plan.policies[1].start, 0);
        assert_eq!(
            plan.policies[1].waits,
            vec![(
                JobId::new(2),
                Wait::Room {
                    resource: Resource::Cpu
                }
            )]
        );
    }

    #[test]
    fn a_fleet_host_claims_only_the_jobs_its_room_fits_and_leaves_the_rest_to_others() {
        let linux = policy("linux", &["self-hosted"], 8);
        let counts = counts(&[("linux", 1, 1)]);
        // 4 of its 8 CPUs held; queued: a 6-CPU job, a 2-CPU job, another 6-CPU job.
        let standing = standing(&[], &[]);
        let mut made = plan(&Inputs {
            now_ms: UnixMs::new(1_000),
            fit: true,
            host_max: 8,
            counts: &counts,
            policies: vec![shaped(
                &linux,
                &[(1, "rm-cpu=6", 6), (2, "rm-cpu=2", 2), (3, "rm-cpu=6", 6)],
                &[],
                1,
            )],
            standing: Some(&standing),
            free_uids: None,
            packing: host(8, &[4]),
        });
        let p = &mut made.policies[0];
        // Only the 2-CPU job fits: it alone is claimed; the 6-CPU ones are left to hosts that
        // fit them, neither claimed nor waiting here.
        assert_eq!(p.claim, jobs(&[2]));
        assert_eq!(started(p), vec![Some(2)]);
        assert!(p.waits.is_empty(), "{:?}", p.waits);
        // Another host won it: no runner of its shape starts here.
        p.after_claims(&[]);
        assert_eq!(p.start, 0);
        assert!(p.starts.is_empty());
    }

    #[test]
    fn without_capacity_or_shapes_the_plan_is_the_ceilings_alone() {
        let linux = policy("linux", &["self-hosted"], 3);
        let plan = planned(Packing::default(), 0, vec![inputs(&linux, &[1, 2, 3, 4])]);
        assert_eq!(one(&plan).start, 3);
        assert!(one(&plan).waits.is_empty());
    }
}
