//! Sizing (issue 42): the executor's side of shapes. It turns the journal's jobs and live
//! attempts into what the plan packs ([`plan::Shaped`], [`plan::Packing`]), the shape a new
//! attempt journals with the devices it takes ([`attempt_shape`], [`pick_devices`]), and the
//! bounds a runner of a shape gets ([`bounds`]). The rules themselves are `crate::shape`'s
//! (grammar, resolution, reservation) and [`plan::pack`]'s (what fits); this module only
//! assembles their inputs, purely.

use std::collections::BTreeMap;

use rm_journal::{AttemptRecord, AttemptShape, AttemptState, JobRow};
use rm_vocab::JobId;

use super::plan::pack::{Need, Room};
use super::plan::{Packing, Shaped, Sized};
use crate::config::{Device, HostCapacity, Policy};
use crate::shape::{self, Refusal, Shape};

/// The host's shape facts: its capacity, its devices and its runner ceiling (the even share
/// of an unwritten dimension is capacity over `max_runners`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Host<'a> {
    pub(crate) capacity: &'a HostCapacity,
    pub(crate) devices: &'a [Device],
    pub(crate) max_runners: u32,
}

impl Host<'_> {
    /// The host's whole room: its capacity and its devices, counted per group.
    pub(crate) fn room(&self) -> Room {
        let mut devices: BTreeMap<String, u32> = BTreeMap::new();
        for device in self.devices {
            *devices.entry(device.group.clone()).or_default() += 1;
        }
        Room {
            cpu_millis: self.capacity.cpu_millis,
            memory: self.capacity.memory,
            disk: self.capacity.disk,
            devices,
            reserved_for: None,
        }
    }

    /// What a runner of `shape` in `policy` takes from the host.
    pub(crate) fn need(&self, policy: &Policy, shape: &Shape) -> Need {
        let size = shape::reservation(shape, policy, self.capacity, self.max_runners);
        Need {
            cpu_millis: size.cpu_millis,
            memory: size.memory,
            disk: size.disk,
            devices: shape.devices.clone(),
        }
    }

    /// What a live attempt holds: what its journalled shape says it took, or (an attempt
    /// journalled without one) its policy's default shape.
    fn held(&self, attempt: &AttemptRecord, policy: Option<&Policy>) -> Need {
        match (&attempt.shape, policy) {
            (Some(shape), _) => Need {
                cpu_millis: shape.cpu_millis,
                memory: shape.memory,
                disk: shape.disk,
                devices: self.groups_of(&shape.devices),
            },
            (None, Some(policy)) => self.need(policy, &Shape::default()),
            (None, None) => Need::default(),
        }
    }

    /// Device ids counted per group (an id no configured device has counts nowhere: the
    /// configuration no longer offers it).
    fn groups_of(&self, ids: &[String]) -> BTreeMap<String, u32> {
        let mut groups: BTreeMap<String, u32> = BTreeMap::new();
        for id in ids {
            if let Some(device) = self
                .devices
                .iter()
                .find(|d| d.id().as_os_str() == id.as_str())
            {
                *groups.entry(device.group.clone()).or_default() += 1;
            }
        }
        groups
    }
}

/// The host's packing inputs: its room, and what each of `live` (attempts counting against
/// capacity) holds.
pub(crate) fn packing(host: Host<'_>, policies: &[Policy], live: &[AttemptRecord]) -> Packing {
    Packing {
        capacity: host.room(),
        held: live
            .iter()
            .filter(|a| a.state.counts_against_capacity())
            .map(|a| host.held(a, policies.iter().find(|p| p.name == a.policy)))
            .collect(),
    }
}

/// A policy's packing inputs from its counted jobs (oldest first) and the host's live
/// attempts, and the jobs whose shape is refused: they are no demand (never guessed), and
/// `explain` says why.
pub(crate) fn shaped(
    host: Host<'_>,
    policy: &Policy,
    counted: &[&JobRow],
    live: &[AttemptRecord],
) -> (Shaped, Vec<(JobId, Refusal)>) {
    let mut shaped = Shaped {
        warm: host.need(policy, &Shape::default()),
        ..Shaped::default()
    };
    let mut refused = Vec::new();
    for job in counted {
        match shape::resolve(policy, &job.labels) {
            Ok(shape) => {
                shaped.sizes.insert(
                    job.job_id,
                    Sized {
                        need: host.need(policy, &shape),
                        key: shape.key,
                        queued_at_ms: job.first_seen_at_ms,
                    },
                );
            }
            Err(refusal) => refused.push((job.job_id, refusal)),
        }
    }
    // Runners stand for queued jobs of their own shape: those not busy yet, and busy ones
    // whose job the journal does not know yet (they took one of the queued jobs, which the
    // plan's count already takes off: `demand_after_unknown_busy`).
    for attempt in live.iter().filter(|a| {
        a.policy == policy.name
            && a.state.counts_against_capacity()
            && (a.state != AttemptState::Busy || a.job_id.is_none())
    }) {
        let key = attempt
            .shape
            .as_ref()
            .map_or_else(String::new, |s| shape::key_of(&s.labels));
        *shaped.in_flight.entry(key).or_default() += 1;
    }
    (shaped, refused)
}

/// The devices a new runner of `shape` takes: per group it asks for, the lowest ids (in
/// configuration order) no live attempt holds. `Err(group)`: the group has too few free.
pub(crate) fn pick_devices(
    wanted: &BTreeMap<String, u32>,
    devices: &[Device],
    held: &[String],
) -> Result<Vec<String>, String> {
    let mut picked = Vec::new();
    for (group, n) in wanted {
        let free: Vec<String> = devices
            .iter()
            .filter(|d| &d.group == group)
            .map(|d| d.id().to_string_lossy().into_owned())
            .filter(|id| !held.contains(id))
            .take(*n as usize)
            .collect();
        if free.len() < *n as usize {
            return Err(group.clone());
        }
        picked.extend(free);
    }
    Ok(picked)
}

/// The shape a new attempt journals: the job's labels (its JIT registration carries them),
/// what it takes from the host, and the devices it holds.
pub(crate) fn attempt_shape(shape: &Shape, need: &Need, devices: Vec<String>) -> AttemptShape {
    AttemptShape {
        labels: shape.labels.clone(),
        cpu_millis: need.cpu_millis,
        memory: need.memory,
        disk: need.disk,
        devices,
    }
}

/// The device nodes a runner holding `ids` is given: each device's own nodes, and the shared
/// nodes of every group it holds a device of (each once).
pub(crate) fn device_nodes(devices: &[Device], ids: &[String]) -> Vec<std::path::PathBuf> {
    let held: Vec<&Device> = devices
        .iter()
        .filter(|d| ids.iter().any(|id| d.id().as_os_str() == id.as_str()))
        .collect();
    let mut nodes = Vec::new();
    for device in &held {
        nodes.extend(device.nodes.iter().cloned());
    }
    let mut groups: Vec<&str> = held.iter().map(|d| d.group.as_str()).collect();
    groups.sort_unstable();
    groups.dedup();
    for group in groups {
        for device in devices.iter().filter(|d| d.group == group) {
            for node in &device.shared_nodes {
                if !nodes.contains(node) {
                    nodes.push(node.clone());
                }
            }
        }
    }
    nodes
}

/// The bounds a runner of a journalled shape gets: what the shape writes, else its policy's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) memory_max: Option<u64>,
    pub(crate) disk_max: Option<u64>,
    pub(crate) cpu_max: Option<u64>,
}

/// `record`'s bounds under `policy`: its shape's labels resolved again against the policy (a
/// label written at allocation reads the same now; one the policy no longer accepts falls back
/// to the policy's own bounds, never to none).
pub(crate) fn bounds(policy: &Policy, record: &AttemptRecord) -> Bounds {
    let labels = record.shape.as_ref().map_or(&[][..], |s| &s.labels[..]);
    let shape = shape::resolve(policy, labels)
        .or_else(|_| shape::resolve(policy, &[]))
        .unwrap_or_default();
    Bounds {
        memory_max: shape.memory.or(policy.limits.memory_max),
        disk_max: shape.disk.or(policy.disk_max),
        cpu_max: shape.cpu_millis,
    }
}
