//! The allocation plan: the one answer, per pass, to "should this host start a runner, and if
//! not, why not?". [`plan`] is a pure function of what the control loop gathered (the demand
//! allocation's memory left after fences and unknown completions, the journal's live counts,
//! the back-offs, fitness, in a fleet this host's claims) and returns, per policy, how many
//! runners to start, which claims to make and give back, and what held the rest of its demand
//! back ([`Held`]). The loop carries it out, notes what only carrying it out can find (a claim
//! another host won, a uid pool found empty, a launch that failed meanwhile) with
//! [`PolicyPlan::after_claims`] and [`PolicyPlan::hold`], and publishes it: a launch in flight
//! asks the latest plan whether its policy still wants runners ([`Plan::wants`]), and `status`
//! and `explain` read it from the status snapshot.
//!
//! The ceilings themselves are [`crate::allocation`]'s; this is their one caller.

use std::collections::{BTreeMap, HashMap, HashSet};

use rm_journal::LiveCounts;
use rm_vocab::{JobId, UnixMs};
use serde::{Deserialize, Serialize};

use super::allocate::{LiveView, allocation_input};
use super::claims::{self, Standing};
use crate::allocation::{self, AllocationInput, Limit};
use crate::config::Policy;
use pack::{Need, Room, Wait};

/// Why some of a policy's demand gets no runner now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "held", rename_all = "snake_case")]
pub enum Held {
    /// The host is unfit (`rm-agent status` says why): nothing is registered.
    Unfit,
    /// Launches of the policy failed; none is tried before this time (ms since the epoch).
    BackingOff { until_ms: UnixMs },
    /// This many queued jobs were seen before a runner of the policy gave up on them (its
    /// fence): they are not demand until GitHub confirms them again.
    Fenced { jobs: u32 },
    /// A ceiling: the policy's `max_runners` (`max_runners`) or the host's (`host_capacity`),
    /// at `ceiling` live runners.
    AtCapacity { limit: CeilingKind, ceiling: u32 },
    /// The runner uid pool has no free uid: nothing starts until a cleanup frees one.
    NoFreeUid,
    /// In a fleet: this many of the policy's jobs are claimed by other hosts.
    ClaimedElsewhere { jobs: u32 },
    /// Jobs wait for what running runners hold (issue 42): the first short resource of the
    /// oldest of them; each job's own wait is in [`PublishedPolicy::waits`].
    WaitingForRoom { resource: pack::Resource },
    /// This many jobs ask for more than the host has at all: they never start here.
    ShapeExceedsHost { jobs: u32 },
}

/// Which ceiling held demand back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CeilingKind {
    MaxRunners,
    HostCapacity,
}

/// One policy's part of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyPlan {
    pub(crate) policy: String,
    /// Its queued jobs that want a runner from this host: routed to it, seen after its fence,
    /// less the completions the journal has not named, and in a fleet no more than its claims.
    pub(crate) demand: u32,
    /// Runners to start now.
    pub(crate) start: u32,
    /// Runners the ceilings leave room for now, whether or not the policy may start any (fit,
    /// not backing off, a free uid): `start` is at most this, and a queued job beyond it waits
    /// for a ceiling ([`Held::AtCapacity`]) whatever else holds it too.
    pub(crate) room: u32,
    /// In a fleet: jobs to claim before starting (oldest first), and claims to give back (jobs
    /// that no longer count for it).
    pub(crate) claim: Vec<JobId>,
    pub(crate) release: Vec<JobId>,
    /// What held the rest back, in the order found.
    pub(crate) held: Vec<Held>,
    /// What each of the `start` runners is for, in the order they start: `start` is their
    /// number once packing decided ([`PolicyPlan::pack`]).
    pub(crate) starts: Vec<Start>,
    /// The jobs packing left waiting, and why.
    pub(crate) waits: Vec<(JobId, Wait)>,
    /// In a fleet: the jobs this host serves (its claims, and those it is about to make):
    /// packing starts runners for their shapes only.
    serving: Option<HashSet<JobId>>,
    /// Which rule bounded `start` (for the notification of demand waiting at the host's
    /// ceiling).
    pub(crate) limit: Limit,
    /// What `start` was computed from, to compute it again once the claims are known.
    basis: Basis,
}

/// One runner the plan starts: for a job's shape, or a warm runner of the policy's own
/// (`min_runners`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    /// The job whose shape it has; `None`: the policy's default shape.
    pub(crate) job: Option<JobId>,
    /// Its shape's key ([`Sized::key`]).
    pub(crate) key: String,
}

/// A counted job as packing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sized {
    /// Its shape's key (`crate::shape::Shape::key`, "" for the policy's default shape): a live
    /// runner of a key stands for a queued job of that key only.
    pub(crate) key: String,
    /// What its runner would take from the host.
    pub(crate) need: Need,
    /// When it was first seen queued.
    pub(crate) queued_at_ms: UnixMs,
}

/// A policy's shapes, for packing (issue 42). The default (no sizes, nothing in flight, a
/// warm runner needing nothing) packs as the ceilings alone did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shaped {
    /// The counted jobs' shapes (a job missing here has the default shape and needs nothing).
    pub(crate) sizes: HashMap<JobId, Sized>,
    /// The policy's live runners that stand for its queued jobs, per shape key: not busy, or
    /// busy with a job the journal does not know yet.
    pub(crate) in_flight: BTreeMap<String, u32>,
    /// What a runner of the policy's default shape takes (a warm runner's).
    pub(crate) warm: Need,
}

/// The host's side of packing: its capacity and what its live runners hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Packing {
    /// `[host] capacity` with the host's devices (the default: unbounded, no devices).
    pub(crate) capacity: Room,
    /// What each live runner holds.
    pub(crate) held: Vec<Need>,
}

/// The facts a policy's `start` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Basis {
    /// The ceilings' input, its demand the one assumed before the claims were made.
    ceilings: AllocationInput,
    /// Jobs that count, before any claim.
    count: u32,
    /// In a fleet: this host's claims on jobs that count.
    mine: Option<u32>,
    /// Busy runners of the policy whose job the journal does not know yet.
    busy_unknown: usize,
    /// Whether it may start at all (fit, not backing off).
    may_start: bool,
    /// Runner uids of the pool left free after the policies before it took theirs (`None`: no
    /// uid pool).
    free_uids: Option<u32>,
    /// Runners its jobs want beyond what the live runners offset as a number: a live runner
    /// stands for a job of its own shape only, so an idle runner of one shape leaves a job of
    /// another uncovered ([`uncovered_beyond_count`]).
    uncovered_extra: u32,
}

/// The plan of one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// When it was made.
    pub(crate) at_ms: UnixMs,
    pub(crate) policies: Vec<PolicyPlan>,
}

/// No plan made yet: made at the epoch, which [`super::allocate::Allocator::published`] leaves
/// out of the snapshot.
impl Default for Plan {
    fn default() -> Self {
        Self {
            at_ms: UnixMs::EPOCH,
            policies: Vec::new(),
        }
    }
}

/// What the loop gathered for one pass.
#[derive(Debug)]
pub(crate) struct Inputs<'a> {
    pub(crate) now_ms: UnixMs,
    /// The fitness gate says fit.
    pub(crate) fit: bool,
    /// `host.max_runners`.
    pub(crate) host_max: u32,
    /// The journal's live attempts.
    pub(crate) counts: &'a LiveCounts,
    /// Every configured policy, in configuration order (which is also the order in which
    /// they take the host's room).
    pub(crate) policies: Vec<PolicyInputs<'a>>,
    /// In a fleet: this host's claims and every live claim.
    pub(crate) standing: Option<&'a Standing>,
    /// Under `isolation = "user"`: the uids of `host.runner_uids` no uncleaned attempt holds
    /// (`None`: no uid pool). A uid a process outside rm runs as is found only when a runner
    /// takes one ([`PolicyPlan::hold`]).
    pub(crate) free_uids: Option<u32>,
    /// The host's capacity and what runs (issue 42).
    pub(crate) packing: Packing,
}

/// One policy's inputs.
#[derive(Debug)]
pub(crate) struct PolicyInputs<'a> {
    pub(crate) policy: &'a Policy,
    /// Its launch back-off, if it is in one now: no launch before this time.
    pub(crate) backing_off_until: Option<UnixMs>,
    /// Its queued jobs routed to it and seen after its fence, oldest first.
    pub(crate) jobs: Vec<JobId>,
    /// Routed jobs held back by its fence.
    pub(crate) fenced: u32,
    /// How many runners `jobs` want: less the completions the journal has not named.
    pub(crate) count: u32,
    /// Its busy runners whose job the journal does not know yet.
    pub(crate) busy_unknown: usize,
    /// Its jobs' shapes and its live runners' (issue 42).
    pub(crate) shaped: Shaped,
}

/// The plan for `inputs`. Policies take the host's room in their order; in a fleet each one's
/// start assumes its claims are granted ([`PolicyPlan::after_claims`] corrects it).
pub(crate) fn plan(inputs: &Inputs<'_>) -> Plan {
    let mut host_live = inputs.counts.host_live();
    let mut free_uids = inputs.free_uids;
    let mut room = Room::left(&inputs.packing.capacity, &inputs.packing.held);
    let mut policies = Vec::with_capacity(inputs.policies.len());
    for p in &inputs.policies {
        let mut planned = plan_policy(inputs, p, host_live, free_uids, &room);
        planned.pack(&mut room, &inputs.packing.capacity, p, inputs.now_ms);
        host_live = host_live.saturating_add(planned.start);
        free_uids = free_uids.map(|free| free.saturating_sub(planned.start));
        policies.push(planned);
    }
    Plan {
        at_ms: inputs.now_ms,
        policies,
    }
}

/// One policy's plan, with `host_live` runners live or planned before it and `free_uids` uids
/// left by the policies before it.
fn plan_policy(
    inputs: &Inputs<'_>,
    p: &PolicyInputs<'_>,
    host_live: u32,
    free_uids: Option<u32>,
    room: &Room,
) -> PolicyPlan {
    let mut held = Vec::new();
    if p.fenced > 0 {
        held.push(Held::Fenced { jobs: p.fenced });
    }
    let backing_off = p.backing_off_until.filter(|until| inputs.now_ms < *until);
    // Both are said when both hold; either stops the policy's starts.
    if !inputs.fit {
        held.push(Held::Unfit);
    }
    if let Some(until_ms) = backing_off {
        held.push(Held::BackingOff { until_ms });
    }
    let may_start = inputs.fit && backing_off.is_none();
    let live = LiveView {
        counts: inputs.counts.clone(),
        busy_unknown: p.busy_unknown,
    };
    // The ceilings' one builder; demand is set by each use.
    let mut ceilings = allocation_input(p.policy, 0, &live, inputs.host_max);
    ceilings.host_live = host_live;
    let (claim, release, mine, serving) = match inputs.standing {
        Some(standing) if may_start => {
            let fleet = fleet_claims(standing, p, ceilings, room, &inputs.packing.capacity);
            if fleet.elsewhere > 0 {
                held.push(Held::ClaimedElsewhere {
                    jobs: fleet.elsewhere,
                });
            }
            let serving = fleet.held.iter().chain(&fleet.claim).copied().collect();
            (fleet.claim, fleet.release, Some(fleet.mine), Some(serving))
        }
        // A policy that may not start now neither claims nor gives back: its claims wait.
        Some(standing) => {
            let counted: HashSet<JobId> = p.jobs.iter().copied().collect();
            let mine: HashSet<JobId> = standing
                .mine(&p.policy.name)
                .iter()
                .filter(|id| counted.contains(id))
                .copied()
                .collect();
            (
                Vec::new(),
                Vec::new(),
                Some(count_u32(mine.len())),
                Some(mine),
            )
        }
        None => (Vec::new(), Vec::new(), None, None),
    };
    let basis = Basis {
        ceilings,
        count: p.count,
        mine,
        busy_unknown: p.busy_unknown,
        may_start,
        free_uids,
        uncovered_extra: uncovered_beyond_count(p),
    };
    let mut planned = PolicyPlan {
        policy: p.policy.name.clone(),
        demand: 0,
        start: 0,
        room: 0,
        claim,
        release,
        held,
        starts: Vec::new(),
        waits: Vec::new(),
        serving,
        limit: Limit::Demand,
        basis,
    };
    let granted = planned.claim.len();
    planned.decide(granted);
    planned
}

/// A fleet policy's claims: which to make, which to give back, how many of its counted jobs
/// this host holds, and how many others hold.
struct FleetClaims {
    claim: Vec<JobId>,
    release: Vec<JobId>,
    mine: u32,
    /// The counted jobs this host holds claims on.
    held: Vec<JobId>,
    elsewhere: u32,
}

/// As many claims as the runners this host could have for the policy's jobs exceed its claims
/// ([`claims::claims_to_make`]), on jobs no live claim holds; its claims on jobs that no longer
/// count go back.
fn fleet_claims(
    standing: &Standing,
    p: &PolicyInputs<'_>,
    ceilings: AllocationInput,
    room: &Room,
    capacity: &Room,
) -> FleetClaims {
    let counted: HashSet<JobId> = p.jobs.iter().copied().collect();
    let (held, release): (Vec<JobId>, Vec<JobId>) = standing
        .mine(&p.policy.name)
        .iter()
        .partition(|id| counted.contains(id));
    let mine = count_u32(held.len());
    // Only jobs whose shape fits what this host has left now (after its own claims' jobs): a
    // job another host can fit is left to it, not held here waiting for room (issue 42).
    let unclaimed = claims::candidates(&p.jobs, &standing.taken);
    let candidates = fitting(p, &held, &unclaimed, room, capacity);
    let elsewhere = count_u32(p.jobs.len())
        .saturating_sub(mine)
        .saturating_sub(count_u32(unclaimed.len()));
    let could_start = allocation::allocate(AllocationInput {
        demand: mine.saturating_add(count_u32(candidates.len())),
        ..ceilings
    })
    .to_start;
    let n = claims::claims_to_make(
        could_start,
        ceilings.unassigned_in_flight,
        mine,
        count_u32(candidates.len()),
    );
    FleetClaims {
        claim: candidates.into_iter().take(n as usize).collect(),
        release,
        mine,
        held,
        elsewhere,
    }
}

/// Which of `candidates` (queue order) would start in `room` after the jobs this host already
/// holds (`held`) took theirs: packed as the plan packs ([`pack::pack`]).
fn fitting(
    p: &PolicyInputs<'_>,
    held: &[JobId],
    candidates: &[JobId],
    room: &Room,
    capacity: &Room,
) -> Vec<JobId> {
    let default = p.shaped.warm.clone();
    let need = |id: &JobId| p.shaped.sizes.get(id).map_or(&default, |s| &s.need);
    let wants: Vec<pack::Want<'_>> = held
        .iter()
        .chain(candidates)
        .map(|id| pack::Want {
            job_id: *id,
            need: need(id),
            // Claims are made for room now: no reservation is simulated.
            waited: std::time::Duration::ZERO,
        })
        .collect();
    let packed = pack::pack(&mut room.clone(), capacity, &wants, u32::MAX);
    packed
        .start
        .into_iter()
        .filter(|&i| i >= held.len())
        .map(|i| wants[i].job_id)
        .collect()
}

impl PolicyPlan {
    /// Its runners live and not busy beyond what its count wants: for a scale set's policy, the
    /// idle runners to scale down ([`crate::scaleset::scale_down`]; the scale set's target
    /// fell, its jobs cancelled or taken by other runners). A webhook policy's are not scaled
    /// down: they end at `runner.idle_timeout`.
    pub(crate) fn surplus(&self) -> u32 {
        self.basis
            .ceilings
            .unassigned_in_flight
            .saturating_sub(self.basis.count)
    }

    /// In a fleet, the claims made: `granted` of those asked were won (others raced this host
    /// to the rest). Demand and start follow.
    pub(crate) fn after_claims(&mut self, granted: &[JobId]) {
        self.held
            .retain(|h| !matches!(h, Held::AtCapacity { .. } | Held::NoFreeUid));
        self.decide(granted.len());
        // Packing took the host's room for the jobs it meant to serve; those whose claim
        // another host won get no runner of their shape here.
        let lost: Vec<JobId> = self
            .claim
            .iter()
            .filter(|id| !granted.contains(id))
            .copied()
            .collect();
        self.starts
            .retain(|s| s.job.is_none_or(|job| !lost.contains(&job)));
        self.starts.truncate(self.start as usize);
        self.start = count_u32(self.starts.len());
    }

    /// Carrying the plan out found a reason it could not start the rest (a launch failed
    /// meanwhile and backs the policy off, or the uid pool is empty).
    pub(crate) fn hold(&mut self, started: u32, why: Held) {
        self.start = started;
        self.starts.truncate(started as usize);
        if !self.held.contains(&why) {
            self.held.push(why);
        }
    }

    /// Demand and start from the basis, with `granted` claims won in a fleet.
    fn decide(&mut self, granted: usize) {
        let b = self.basis;
        self.demand = match b.mine {
            Some(mine) => mine.saturating_add(count_u32(granted)).min(b.count),
            None => b.count,
        };
        let decided = allocation::allocate(AllocationInput {
            demand: super::allocate::demand_after_unknown_busy(self.demand, b.busy_unknown)
                .saturating_add(b.uncovered_extra),
            ..b.ceilings
        });
        self.limit = decided.limit;
        self.room = decided.to_start;
        self.start = if b.may_start { decided.to_start } else { 0 };
        // Said whether or not it may start: a job beyond the room waits for a ceiling too
        // (`max_runners` also when the runners it allows stand for older jobs already).
        let ceiling = match decided.limit {
            Limit::MaxRunners => Some((
                CeilingKind::MaxRunners,
                b.ceilings.max_runners.max(b.ceilings.min_runners),
            )),
            Limit::HostCapacity => Some((CeilingKind::HostCapacity, b.ceilings.host_max)),
            Limit::Demand | Limit::MinRunners => None,
        };
        if let Some((limit, ceiling)) = ceiling {
            self.held.push(Held::AtCapacity { limit, ceiling });
        }
        if let Some(free) = b.free_uids
            && self.start > free
        {
            self.start = free;
            self.held.push(Held::NoFreeUid);
        }
    }
}

impl PolicyPlan {
    /// Packs the `start` runners the ceilings allow into what is left of the host (`room`,
    /// taken from as they start; `capacity` the whole host): the jobs no live runner of their
    /// shape stands for, in queue order ([`pack::pack`]), then warm runners of the default
    /// shape for `min_runners`. `start` becomes what fits.
    fn pack(&mut self, room: &mut Room, capacity: &Room, p: &PolicyInputs<'_>, now_ms: UnixMs) {
        let default = Sized {
            key: String::new(),
            need: p.shaped.warm.clone(),
            queued_at_ms: now_ms,
        };
        let mut uncovered = uncovered_jobs(p);
        if let Some(serving) = &self.serving {
            uncovered.retain(|id| serving.contains(id));
        }
        let wants: Vec<pack::Want<'_>> = uncovered
            .iter()
            .map(|id| {
                let sized = p.shaped.sizes.get(id).unwrap_or(&default);
                pack::Want {
                    job_id: *id,
                    need: &sized.need,
                    waited: std::time::Duration::from_millis(
                        u64::try_from(now_ms.saturating_sub(sized.queued_at_ms)).unwrap_or(0),
                    ),
                }
            })
            .collect();
        let packed = pack::pack(room, capacity, &wants, self.start);
        let mut starts: Vec<Start> = packed
            .start
            .iter()
            .map(|&i| Start {
                job: Some(wants[i].job_id),
                key: p
                    .shaped
                    .sizes
                    .get(&wants[i].job_id)
                    .map_or_else(String::new, |s| s.key.clone()),
            })
            .collect();
        // Warm runners for `min_runners`: what the ceilings allow beyond the uncovered jobs.
        let warm = self.start.saturating_sub(count_u32(uncovered.len()));
        for _ in 0..warm {
            if room.reserved_for.is_some() || room.short_of(&default.need).is_some() {
                break;
            }
            room.take(&default.need);
            starts.push(Start {
                job: None,
                key: String::new(),
            });
        }
        let mut exceeding = 0;
        let mut first_short = None;
        for (_, wait) in &packed.wait {
            match wait {
                Wait::ExceedsHost { .. } => exceeding += 1,
                Wait::Room { resource } if first_short.is_none() => {
                    first_short = Some(resource.clone());
                }
                _ => {}
            }
        }
        if let Some(resource) = first_short {
            self.held.push(Held::WaitingForRoom { resource });
        }
        if exceeding > 0 {
            self.held.push(Held::ShapeExceedsHost { jobs: exceeding });
        }
        self.start = count_u32(starts.len());
        self.starts = starts;
        self.waits = packed.wait;
    }
}

/// The policy's counted jobs no live runner of their shape stands for, in queue order: per
/// shape key, the oldest jobs are the ones its runners are counted against.
fn uncovered_jobs(p: &PolicyInputs<'_>) -> Vec<JobId> {
    let mut covered: BTreeMap<&str, u32> = BTreeMap::new();
    p.jobs
        .iter()
        .copied()
        .filter(|id| {
            let key = p.shaped.sizes.get(id).map_or("", |s| s.key.as_str());
            let used = covered.entry(key).or_default();
            if *used < p.shaped.in_flight.get(key).copied().unwrap_or(0) {
                *used += 1;
                false
            } else {
                true
            }
        })
        .collect()
}

/// How many more runners the policy's jobs want than its count less its runners in flight
/// says: a runner of one shape offsets that count but stands for no job of another.
fn uncovered_beyond_count(p: &PolicyInputs<'_>) -> u32 {
    let in_flight: u32 = p.shaped.in_flight.values().sum();
    let by_count = count_u32(p.jobs.len()).saturating_sub(in_flight);
    count_u32(uncovered_jobs(p).len()).saturating_sub(by_count)
}

impl Plan {
    /// Whether `policy` still wants runners: it has demand this host serves, or a
    /// `min_runners` to keep. A policy the plan does not know (no plan made yet) does.
    pub(crate) fn wants(&self, policy: &Policy) -> bool {
        policy.min_runners > 0
            || self
                .policies
                .iter()
                .find(|p| p.policy == policy.name)
                .is_none_or(|p| p.demand > 0)
    }

    /// What `status` and `explain` read of it.
    pub(crate) fn published(&self) -> Published {
        Published {
            at_ms: self.at_ms,
            policies: self
                .policies
                .iter()
                .map(|p| {
                    (
                        p.policy.clone(),
                        PublishedPolicy {
                            demand: p.demand,
                            start: p.start,
                            room: p.room,
                            held: p.held.clone(),
                            waits: p
                                .waits
                                .iter()
                                .map(|(job_id, wait)| JobWait {
                                    job_id: *job_id,
                                    wait: wait.clone(),
                                })
                                .collect(),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// The plan as the status snapshot carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    /// When the plan was made.
    pub at_ms: UnixMs,
    /// Per policy name.
    pub policies: std::collections::BTreeMap<String, PublishedPolicy>,
}

/// One policy's plan, published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedPolicy {
    /// Queued jobs that want a runner from this host.
    pub demand: u32,
    /// Runners the plan started.
    pub start: u32,
    /// Runners the ceilings left room for ([`PolicyPlan::room`]).
    #[serde(default)]
    pub room: u32,
    /// What held the rest back.
    #[serde(default)]
    pub held: Vec<Held>,
    /// The jobs packing left waiting, and why (issue 42).
    #[serde(default)]
    pub waits: Vec<JobWait>,
}

/// A job packing left waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobWait {
    pub job_id: JobId,
    #[serde(flatten)]
    pub wait: Wait,
}

fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

pub(crate) mod pack;

#[cfg(test)]
mod day;
#[cfg(test)]
mod tests;
