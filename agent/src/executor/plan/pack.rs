//! Packing (issue 42): which of a policy's waiting jobs start now, by what each one needs of the
//! host. Pure: the plan hands it the host's [`Room`] (its capacity less what live runners hold),
//! the jobs in queue order with their [`Need`], and how many runners the ceilings allow; it says
//! which start and why each other one waits.
//!
//! The rule, in queue order, first fit: each job starts if what it needs fits what is left, so a
//! small job starts beside a large one where both fit, and a job that does not fit does not hold
//! back a smaller one behind it. That alone can starve a large job on a busy host (smaller jobs
//! keep taking what frees up), so a job that has waited [`RESERVE_AFTER`] for room reserves it:
//! no job after it (in this policy, or in a policy planned after it) starts until it has. A job
//! whose need exceeds the host's whole capacity never fits: it is named ([`Wait::ExceedsHost`])
//! and holds nothing back.
//!
//! `docs/performance.md` ("Packing by shape") compares this with largest-first and with one size
//! for every runner, on the same queue.

use std::collections::BTreeMap;
use std::time::Duration;

use rm_vocab::JobId;
use serde::{Deserialize, Serialize};

/// How long a job may wait for room before it reserves it (see the module's doc): long enough
/// that a host's usual churn of small jobs is not stopped for a large one that will fit soon
/// anyway, short enough that a large job waits minutes, not hours, behind a stream of small
/// ones.
pub(crate) const RESERVE_AFTER: Duration = Duration::from_secs(10 * 60);

/// What a runner takes from the host while it lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Need {
    pub(crate) cpu_millis: u64,
    /// Bytes.
    pub(crate) memory: u64,
    /// Bytes.
    pub(crate) disk: u64,
    /// Devices per group.
    pub(crate) devices: BTreeMap<String, u32>,
}

/// A host's capacity, or what is left of it. `None`: unbounded in that dimension (the machine
/// did not say and the configuration did not write it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Room {
    pub(crate) cpu_millis: Option<u64>,
    pub(crate) memory: Option<u64>,
    pub(crate) disk: Option<u64>,
    /// Devices per group (free ones, in what is left).
    pub(crate) devices: BTreeMap<String, u32>,
    /// A job that waited [`RESERVE_AFTER`] and did not fit: nothing planned after it starts.
    pub(crate) reserved_for: Option<JobId>,
}

/// A resource a job waits for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "resource", content = "group", rename_all = "snake_case")]
pub enum Resource {
    Cpu,
    Memory,
    Disk,
    /// A device of this group (`[[host.device]]`).
    Device(String),
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Cpu => f.write_str("CPUs"),
            Resource::Memory => f.write_str("memory"),
            Resource::Disk => f.write_str("disk"),
            Resource::Device(group) => write!(f, "a `{group}` device"),
        }
    }
}

/// Why a job did not start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "wait", rename_all = "snake_case")]
pub enum Wait {
    /// What running runners hold leaves too little of `resource` (`waiting_for_device` when it
    /// is a device, `waiting_for_capacity` otherwise).
    Room { resource: Resource },
    /// The job needs more of `resource` than the host has at all: it never starts here.
    ExceedsHost { resource: Resource },
    /// An older job reserved the host's room ([`RESERVE_AFTER`]).
    Behind { job_id: JobId },
}

/// A job that wants a runner, in queue order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Want<'a> {
    pub(crate) job_id: JobId,
    pub(crate) need: &'a Need,
    /// How long it has been queued.
    pub(crate) waited: Duration,
}

/// What [`pack`] decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Packed {
    /// Indexes into the wants, in the order they start.
    pub(crate) start: Vec<usize>,
    /// The others that were considered, with why they wait. Wants beyond `max_starts` are in
    /// neither: a ceiling holds them (the plan says which).
    pub(crate) wait: Vec<(JobId, Wait)>,
}

impl Room {
    /// What is left of `capacity` while runners holding `held` live (saturating: a host whose
    /// capacity was lowered below what runs has none left).
    pub(crate) fn left<'n>(capacity: &Room, held: impl IntoIterator<Item = &'n Need>) -> Room {
        let mut room = capacity.clone();
        for need in held {
            room.take(need);
        }
        room
    }

    /// The first resource `need` is short of, if any.
    pub(crate) fn short_of(&self, need: &Need) -> Option<Resource> {
        let short = |left: Option<u64>, wanted: u64| left.is_some_and(|left| wanted > left);
        if short(self.cpu_millis, need.cpu_millis) {
            return Some(Resource::Cpu);
        }
        if short(self.memory, need.memory) {
            return Some(Resource::Memory);
        }
        if short(self.disk, need.disk) {
            return Some(Resource::Disk);
        }
        need.devices
            .iter()
            .find(|(group, wanted)| **wanted > self.devices.get(*group).copied().unwrap_or(0))
            .map(|(group, _)| Resource::Device(group.clone()))
    }

    /// Takes `need` from what is left.
    pub(crate) fn take(&mut self, need: &Need) {
        let less = |left: &mut Option<u64>, taken: u64| {
            if let Some(left) = left {
                *left = left.saturating_sub(taken);
            }
        };
        less(&mut self.cpu_millis, need.cpu_millis);
        less(&mut self.memory, need.memory);
        less(&mut self.disk, need.disk);
        for (group, taken) in &need.devices {
            if let Some(left) = self.devices.get_mut(group) {
                *left = left.saturating_sub(*taken);
            }
        }
    }
}

/// Which of `wants` (queue order) start in `room` (taken from as they do), at most `max_starts`,
/// against the host's whole `capacity` (for [`Wait::ExceedsHost`]).
pub(crate) fn pack(
    room: &mut Room,
    capacity: &Room,
    wants: &[Want<'_>],
    max_starts: u32,
) -> Packed {
    let mut packed = Packed::default();
    for (index, want) in wants.iter().enumerate() {
        if packed.start.len() >= max_starts as usize {
            break;
        }
        if let Some(resource) = capacity.short_of(want.need) {
            packed
                .wait
                .push((want.job_id, Wait::ExceedsHost { resource }));
            continue;
        }
        if let Some(job_id) = room.reserved_for {
            packed.wait.push((want.job_id, Wait::Behind { job_id }));
            continue;
        }
        match room.short_of(want.need) {
            None => {
                room.take(want.need);
                packed.start.push(index);
            }
            Some(resource) => {
                if want.waited >= RESERVE_AFTER {
                    room.reserved_for = Some(want.job_id);
                }
                packed.wait.push((want.job_id, Wait::Room { resource }));
            }
        }
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn need(cpus: u64, mem_gib: u64) -> Need {
        Need {
            cpu_millis: cpus * 1000,
            memory: mem_gib * GIB,
            disk: 0,
            devices: BTreeMap::new(),
        }
    }

    fn gpus(n: u32) -> Need {
        Need {
            devices: BTreeMap::from([("gpu".to_owned(), n)]),
            ..need(1, 1)
        }
    }

    fn host(cpus: u64, mem_gib: u64, gpus: u32) -> Room {
        Room {
            cpu_millis: Some(cpus * 1000),
            memory: Some(mem_gib * GIB),
            disk: None,
            devices: BTreeMap::from([("gpu".to_owned(), gpus)]),
            reserved_for: None,
        }
    }

    fn wants<'a>(needs: &'a [Need], waited_min: &[u64]) -> Vec<Want<'a>> {
        needs
            .iter()
            .zip(waited_min)
            .enumerate()
            .map(|(i, (need, min))| Want {
                job_id: JobId::new(i64::try_from(i).unwrap() + 1),
                need,
                waited: Duration::from_secs(min * 60),
            })
            .collect()
    }

    fn room(resource: Resource) -> Wait {
        Wait::Room { resource }
    }

    #[test]
    fn jobs_start_in_queue_order_while_they_fit_and_a_small_one_passes_a_large_one() {
        /// (host, held, queue, started job ids, waits)
        type Case = (Room, Vec<Need>, Vec<Need>, Vec<i64>, Vec<(i64, Wait)>);
        let cases: Vec<Case> = vec![
            // Both fit: a 2-CPU job starts beside a 6-CPU one on 8 CPUs.
            (
                host(8, 32, 0),
                vec![],
                vec![need(6, 24), need(2, 8)],
                vec![1, 2],
                vec![],
            ),
            // The large one does not fit beside what runs; the small one behind it does.
            (
                host(8, 32, 0),
                vec![need(4, 8)],
                vec![need(6, 8), need(2, 8)],
                vec![2],
                vec![(1, room(Resource::Cpu))],
            ),
            // Memory is what is short.
            (
                host(8, 32, 0),
                vec![need(1, 30)],
                vec![need(1, 4), need(1, 2)],
                vec![2],
                vec![(1, room(Resource::Memory))],
            ),
            // Devices: two of two held by earlier jobs; the third waits for one.
            (
                host(8, 32, 2),
                vec![],
                vec![gpus(1), gpus(1), gpus(1)],
                vec![1, 2],
                vec![(3, room(Resource::Device("gpu".into())))],
            ),
            // Larger than the host: named, and it holds nothing back.
            (
                host(8, 32, 2),
                vec![],
                vec![need(16, 8), gpus(3), need(8, 32)],
                vec![3],
                vec![
                    (
                        1,
                        Wait::ExceedsHost {
                            resource: Resource::Cpu,
                        },
                    ),
                    (
                        2,
                        Wait::ExceedsHost {
                            resource: Resource::Device("gpu".into()),
                        },
                    ),
                ],
            ),
        ];
        for (capacity, held, queue, started, waits) in cases {
            let mut left = Room::left(&capacity, &held);
            let packed = pack(&mut left, &capacity, &wants(&queue, &[0; 8]), 10);
            let ids: Vec<i64> = packed.start.iter().map(|i| *i as i64 + 1).collect();
            assert_eq!(ids, started, "{queue:?} with {held:?} held");
            let want: Vec<(JobId, Wait)> = waits
                .into_iter()
                .map(|(id, w)| (JobId::new(id), w))
                .collect();
            assert_eq!(packed.wait, want, "{queue:?}");
        }
    }

    #[test]
    fn what_starts_is_taken_and_never_over_commits() {
        let capacity = host(8, 32, 2);
        let queue = vec![need(3, 10), need(3, 10), need(3, 10), gpus(2), gpus(1)];
        let mut left = Room::left(&capacity, &[]);
        let packed = pack(&mut left, &capacity, &wants(&queue, &[0; 5]), 10);
        let cpu: u64 = packed.start.iter().map(|i| queue[*i].cpu_millis).sum();
        let mem: u64 = packed.start.iter().map(|i| queue[*i].memory).sum();
        assert!(cpu <= 8000 && mem <= 32 * GIB, "{cpu} {mem}");
        assert_eq!(packed.start, vec![0, 1, 3]);
        assert_eq!(left.cpu_millis, Some(1000));
        assert_eq!(left.devices["gpu"], 0);
    }

    #[test]
    fn the_ceiling_stops_packing_and_leaves_the_rest_unjudged() {
        let capacity = host(8, 32, 0);
        let queue = vec![need(1, 1), need(1, 1), need(1, 1)];
        let mut left = capacity.clone();
        let packed = pack(&mut left, &capacity, &wants(&queue, &[0; 3]), 2);
        assert_eq!(packed.start, vec![0, 1]);
        assert!(packed.wait.is_empty());
    }

    #[test]
    fn a_job_that_waited_long_reserves_the_room_even_across_policies() {
        let capacity = host(8, 32, 0);
        let held = [need(4, 4)];
        let queue = vec![need(6, 8), need(2, 2)];
        // Waited less than RESERVE_AFTER: the small one passes it.
        let mut left = Room::left(&capacity, &held);
        let packed = pack(&mut left, &capacity, &wants(&queue, &[9, 0]), 10);
        assert_eq!(packed.start, vec![1]);
        // Waited RESERVE_AFTER: the small one waits behind it, here and in a later policy.
        let mut left = Room::left(&capacity, &held);
        let packed = pack(&mut left, &capacity, &wants(&queue, &[10, 0]), 10);
        assert!(packed.start.is_empty());
        assert_eq!(
            packed.wait[1],
            (
                JobId::new(2),
                Wait::Behind {
                    job_id: JobId::new(1)
                }
            )
        );
        let later = vec![need(1, 1)];
        let packed = pack(&mut left, &capacity, &wants(&later, &[0]), 10);
        assert!(packed.start.is_empty());
        // A job larger than the host never reserves anything.
        let mut left = Room::left(&capacity, &held);
        let huge = vec![need(64, 1), need(2, 2)];
        let packed = pack(&mut left, &capacity, &wants(&huge, &[60, 0]), 10);
        assert_eq!(packed.start, vec![1]);
    }

    #[test]
    fn an_unbounded_dimension_never_holds_a_job_back() {
        let capacity = Room {
            cpu_millis: None,
            memory: None,
            disk: None,
            devices: BTreeMap::new(),
            reserved_for: None,
        };
        let mut left = Room::left(&capacity, &[need(100, 100)]);
        let queue = vec![need(100, 100)];
        let packed = pack(&mut left, &capacity, &wants(&queue, &[0]), 1);
        assert_eq!(packed.start, vec![0]);
    }
}
