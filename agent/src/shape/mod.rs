//! A job's shape (issue 42): what its labels ask of a runner (CPUs, memory, disk, devices),
//! resolved against its policy's shapes, and what a runner of that shape takes from the host's
//! capacity. Pure: the policy, the host's capacity and devices come in as values.
//!
//! A job label starting with `rm-` (any case) is a shape label ([`is_shape_label`]); its grammar
//! is [`labels`]. Resolution, in order of precedence: a label (`rm-cpu=8`) wins over the named
//! shape the job picks (`rm-shape=large`), which wins over the policy's `cpu`; memory and disk
//! not written by either are left to the policy's `memory_max` and `disk_max`. What a job may
//! ask is bounded by the policy's `shape_max`, per dimension it writes; a policy with named
//! shapes and no `shape_max` lets its jobs pick a named shape and ask for devices, but refuses
//! a size label ([`Refusal::NoMax`]). Devices are bounded by how many the host has, which
//! [`exceeds_host`] checks.

mod labels;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::config::shape::{format_cpu, format_size};
use crate::config::{Device, HostCapacity, Policy, ShapeBounds};

pub use crate::config::shape::is_shape_label;

use labels::Ask;

/// What a job asks of its runner, resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// The job's shape labels as the job wrote them, in its order (the JIT registration carries
    /// them, so GitHub routes the job to the runner made for it).
    pub labels: Vec<String>,
    /// The labels lowercased, sorted and joined with `,`: two jobs with the same key ask for
    /// the same runner. `""` when the job writes none.
    pub key: String,
    /// CPUs in thousandths: a label, else the named shape, else the policy's `cpu`.
    pub cpu_millis: Option<u64>,
    /// Bytes: a label, else the named shape; `None`: the policy's `memory_max` applies.
    pub memory: Option<u64>,
    /// Bytes: a label, else the named shape; `None`: the policy's `disk_max` applies.
    pub disk: Option<u64>,
    /// Devices per group: the named shape's, each overridden by a label.
    pub devices: BTreeMap<String, u32>,
}

/// Why a job's shape cannot be had from its policy. `Display` is one sentence ending with the
/// fix, as `explain` shows it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the label `{label}` cannot be read: {why}")]
    Unreadable { label: String, why: String },
    #[error(
        "the label `{label}` asks for a shape, but the policy declares neither shape_max nor [[policy.shape]]; declare them in the policy or drop the label"
    )]
    NoShapes { label: String },
    #[error(
        "the label `{label}` asks for a size, but the policy declares no shape_max, so its jobs may only pick a named shape (rm-shape=NAME) and devices; add shape_max to the policy or pick a named shape"
    )]
    NoMax { label: String },
    #[error(
        "the policy has no shape `{name}` (its shapes: {}); pick one of them with rm-shape=NAME or add a [[policy.shape]] named `{name}`",
        known.join(", ")
    )]
    UnknownShape { name: String, known: Vec<String> },
    #[error(
        "the job asks {what} {asked}, more than the policy's shape_max.{what} ({max}); ask for at most {max} or raise shape_max.{what}"
    )]
    OverMax {
        what: String,
        asked: String,
        max: String,
    },
}

/// Resolves the shape `job_labels` ask of `policy` (its non-shape labels are demand's to match,
/// not read here).
pub fn resolve(policy: &Policy, job_labels: &[String]) -> Result<Shape, Refusal> {
    let mut written = Vec::new();
    let mut asks: Vec<(String, Ask)> = Vec::new();
    for label in job_labels.iter().filter(|l| is_shape_label(l)) {
        let unreadable = |why: String| Refusal::Unreadable {
            label: label.clone(),
            why,
        };
        let (key, ask) = labels::read(label).map_err(unreadable)?;
        if asks.iter().any(|(seen, _)| *seen == key) {
            return Err(unreadable(format!(
                "it repeats rm-{key}, which another label of the job sets; keep one"
            )));
        }
        written.push(label.clone());
        asks.push((key, ask));
    }
    let shapes = &policy.shapes;
    if let Some(first) = written.first()
        && !shapes.accepts_shapes()
    {
        return Err(Refusal::NoShapes {
            label: first.clone(),
        });
    }
    let empty = ShapeBounds::default();
    let named = match asks.iter().find_map(|(_, ask)| match ask {
        Ask::Shape(name) => Some(name),
        _ => None,
    }) {
        None => &empty,
        Some(name) => shapes.named(name).ok_or_else(|| Refusal::UnknownShape {
            name: name.clone(),
            known: shapes.named.iter().map(|(n, _)| n.clone()).collect(),
        })?,
    };
    let mut shape = Shape {
        cpu_millis: named.cpu_millis.or(shapes.cpu_millis),
        memory: named.memory,
        disk: named.disk,
        devices: named.devices.clone(),
        ..Shape::default()
    };
    for ((_, ask), label) in asks.iter().zip(&written) {
        let sized = match ask {
            Ask::Cpu(millis) => {
                shape.cpu_millis = Some(*millis);
                true
            }
            Ask::Memory(bytes) => {
                shape.memory = Some(*bytes);
                true
            }
            Ask::Disk(bytes) => {
                shape.disk = Some(*bytes);
                true
            }
            Ask::Devices(group, n) => {
                shape.devices.insert(group.clone(), *n);
                false
            }
            Ask::Shape(_) => false,
        };
        if sized && shapes.max.is_none() {
            return Err(Refusal::NoMax {
                label: label.clone(),
            });
        }
    }
    if let Some(max) = &shapes.max {
        within(&shape, max)?;
    }
    shape.key = key_of(&written);
    shape.labels = written;
    Ok(shape)
}

/// The key of a job's shape labels ([`Shape::key`]): lowercased, sorted, joined with `,`.
pub fn key_of(labels: &[String]) -> String {
    let mut key: Vec<String> = labels.iter().map(|l| l.to_ascii_lowercase()).collect();
    key.sort();
    key.join(",")
}

/// `shape` within `max` in every dimension `max` writes ([`crate::config::shape::over_max`]).
fn within(shape: &Shape, max: &ShapeBounds) -> Result<(), Refusal> {
    let asked = ShapeBounds {
        cpu_millis: shape.cpu_millis,
        memory: shape.memory,
        disk: shape.disk,
        devices: shape.devices.clone(),
    };
    match crate::config::shape::over_max(&asked, max) {
        None => Ok(()),
        Some((what, asked, max)) => Err(Refusal::OverMax { what, asked, max }),
    }
}

/// What a runner takes from the host's capacity, per dimension. `0` where the host's capacity
/// is unbounded (unknown and not written) and the shape writes no size: nothing is counted
/// there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    pub cpu_millis: u64,
    pub memory: u64,
    pub disk: u64,
}

/// What a runner of `shape` takes from the host's capacity: a size the job, its named shape or
/// its policy writes (`cpu`, a written `memory_max` or `disk_max`) as written; an unwritten
/// dimension an even share, capacity / `host_max_runners`, so a host without shapes packs
/// exactly as `max_runners` alone did. The default `memory_max` and `disk_max` are ceilings, not
/// sizes, and do not count.
pub fn reservation(
    shape: &Shape,
    policy: &Policy,
    capacity: &HostCapacity,
    host_max_runners: u32,
) -> Size {
    let share = |capacity: Option<u64>| {
        capacity.map_or(0, |total| total / u64::from(host_max_runners.max(1)))
    };
    Size {
        cpu_millis: shape
            .cpu_millis
            .unwrap_or_else(|| share(capacity.cpu_millis)),
        memory: shape
            .memory
            .or(policy.memory_required)
            .unwrap_or_else(|| share(capacity.memory)),
        disk: shape
            .disk
            .or(policy.disk_required)
            .unwrap_or_else(|| share(capacity.disk)),
    }
}

/// Why a runner of `size` and `shape`'s devices could never fit this host, even empty (for
/// `explain`'s `shape_exceeds_host`): a dimension beyond its capacity, or more devices of a
/// group than it has. `None`: it fits an empty host.
pub fn exceeds_host(
    size: &Size,
    shape: &Shape,
    capacity: &HostCapacity,
    devices: &[Device],
) -> Option<String> {
    if let Some(has) = capacity.cpu_millis
        && size.cpu_millis > has
    {
        return Some(format!(
            "it asks {} CPUs, more than this host's capacity of {} CPUs (host.capacity.cpu)",
            format_cpu(size.cpu_millis),
            format_cpu(has)
        ));
    }
    if let Some(has) = capacity.memory
        && size.memory > has
    {
        return Some(format!(
            "it asks {} of memory, more than this host's capacity of {} (host.capacity.memory)",
            format_size(size.memory),
            format_size(has)
        ));
    }
    if let Some(has) = capacity.disk
        && size.disk > has
    {
        return Some(format!(
            "it asks {} of disk, more than this host's capacity of {} (host.capacity.disk)",
            format_size(size.disk),
            format_size(has)
        ));
    }
    for (group, asked) in &shape.devices {
        let has = devices.iter().filter(|d| d.group == *group).count();
        if usize::try_from(*asked).unwrap_or(usize::MAX) <= has {
            continue;
        }
        if has > 0 {
            return Some(format!(
                "it asks {asked} `{group}` devices, more than the {has} this host has ([[host.device]])"
            ));
        }
        let mut groups: Vec<&str> = devices.iter().map(|d| d.group.as_str()).collect();
        groups.sort_unstable();
        groups.dedup();
        let known = if groups.is_empty() {
            "it has no [[host.device]]".to_owned()
        } else {
            format!("its groups: {}", groups.join(", "))
        };
        return Some(format!(
            "it asks {asked} `{group}` devices, and this host has no device of group `{group}` ({known})"
        ));
    }
    None
}
