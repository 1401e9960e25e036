//! Shapes in the configuration (issue 42): `[host]`'s `capacity` and `reserve`, its
//! `[[host.device]]` entries, and a policy's `cpu`, `shape_max` and `[[policy.shape]]`, turned
//! into [`HostCapacity`], [`Device`] and [`PolicyShapes`]. Pure: the machine's size comes in as
//! [`HostFacts`]. The job labels that pick a shape (`rm-cpu=8`) are read by `crate::shape`,
//! which uses the value grammar defined here ([`parse_cpu`], [`parse_size`], [`is_group_name`]).
//!
//! Every shape the file writes is checked against the host once, at start: a named shape or a
//! `shape_max` larger than the host's capacity, or asking more devices of a group than the host
//! has, could never run here, and is refused with the fix rather than left to queue forever.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::bounds::HostFacts;

/// The CPU (in thousandths) kept for the host when `host.capacity.cpu` is not written and
/// `host.reserve.cpu` neither: the agent, its journal and the kernel's own work.
pub const RESERVE_CPU_MILLIS: u64 = 500;
/// The default CPU reserve is never more than this fraction (1/N) of the machine: on a 1-CPU
/// machine half a CPU would leave runners too little.
pub const RESERVE_CPU_DIVISOR: u64 = 4;
/// The memory kept for the host by default (1 GiB): the agent, page cache for the runner
/// package, the host's own services.
pub const RESERVE_MEMORY: u64 = 1 << 30;
/// The default memory reserve is never more than this fraction (1/N) of the machine.
pub const RESERVE_MEMORY_DIVISOR: u64 = 8;
/// The disk kept for the host by default (10 GiB): the journal, logs, the package store.
pub const RESERVE_DISK: u64 = 10 << 30;
/// The default disk reserve is never more than this fraction (1/N) of the filesystem.
pub const RESERVE_DISK_DIVISOR: u64 = 10;
/// The most CPUs a value may say (in thousandths): far beyond any machine; a bigger number is
/// a typo, and the arithmetic on it stays far from overflow.
pub const MAX_CPU_MILLIS: u64 = 65_536 * 1000;
/// Digits a CPU value may carry after its point: cgroup `cpu.max` is written in microseconds of
/// a period, and a thousandth of a CPU is finer than any job needs.
pub const CPU_FRACTION_DIGITS: usize = 3;
/// The longest device group name (`rm-<group>=N` must stay a readable label).
pub const MAX_GROUP_NAME_LEN: usize = 16;
/// The longest named shape (`rm-shape=<name>`).
pub const MAX_SHAPE_NAME_LEN: usize = 32;
/// Names a device group may not take: the keys of a shape and of the label grammar.
pub const RESERVED_GROUPS: [&str; 5] = ["cpu", "mem", "memory", "disk", "shape"];

/// `host.capacity` or `host.reserve` as written: each dimension optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourcesSection {
    /// CPUs: a number (`8`, `0.5`) or a string of one (`"0.5"`).
    pub cpu: Option<toml::Value>,
    /// A size, `"32G"`.
    pub memory: Option<String>,
    /// A size, `"200G"`.
    pub disk: Option<String>,
}

/// One `[[host.device]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSection {
    pub group: String,
    pub nodes: Vec<PathBuf>,
    #[serde(default)]
    pub shared_nodes: Vec<PathBuf>,
}

/// `policy.shape_max`, or the sizes of a `[[policy.shape]]`, as written. Not
/// `deny_unknown_fields`: every other key is a device group's count, collected in `devices` and
/// checked against the host's groups by [`policy_shapes`] (which refuses any other key).
#[derive(Debug, Default, Deserialize)]
pub struct ShapeSection {
    pub cpu: Option<toml::Value>,
    pub memory: Option<String>,
    pub disk: Option<String>,
    #[serde(flatten)]
    pub devices: BTreeMap<String, toml::Value>,
}

/// One `[[policy.shape]]` as written.
#[derive(Debug, Deserialize)]
pub struct NamedShapeSection {
    pub name: String,
    #[serde(flatten)]
    pub shape: ShapeSection,
}

/// What a runner host offers the jobs' shapes (`host.capacity`, or the machine less
/// `host.reserve`). `None`: unbounded in that dimension (the machine's size is unknown and the
/// file writes none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCapacity {
    /// CPUs, in thousandths.
    pub cpu_millis: Option<u64>,
    /// Bytes of memory.
    pub memory: Option<u64>,
    /// Bytes on the runner root's filesystem.
    pub disk: Option<u64>,
}

/// One `[[host.device]]`: a device a job may be given, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// What a job asks for it by (`rm-<group>=N`).
    pub group: String,
    /// Its own nodes (at least one, each under `/dev/`, none another device's).
    pub nodes: Vec<PathBuf>,
    /// Nodes every holder of a device of the group also needs (`/dev/nvidiactl`).
    pub shared_nodes: Vec<PathBuf>,
}

impl Device {
    /// The device's identity: its first node, unique on the host.
    pub fn id(&self) -> &Path {
        self.nodes.first().map_or(Path::new(""), PathBuf::as_path)
    }
}

/// A shape's sizes: a `shape_max`, or a named shape. An unwritten dimension is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShapeBounds {
    pub cpu_millis: Option<u64>,
    pub memory: Option<u64>,
    pub disk: Option<u64>,
    /// Devices per group, each at least 1.
    pub devices: BTreeMap<String, u32>,
}

/// The shapes a policy offers its jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyShapes {
    /// `policy.cpu`: the CPUs of a runner whose job asks none.
    pub cpu_millis: Option<u64>,
    /// `policy.shape_max`: the most a job's labels may ask, per dimension written.
    pub max: Option<ShapeBounds>,
    /// `[[policy.shape]]`, in the file's order.
    pub named: Vec<(String, ShapeBounds)>,
}

impl PolicyShapes {
    /// Whether the policy takes shape labels (`rm-…`): it declares `shape_max` or a named shape.
    pub fn accepts_shapes(&self) -> bool {
        self.max.is_some() || !self.named.is_empty()
    }

    /// The named shape `name` (names are lowercase).
    pub fn named(&self, name: &str) -> Option<&ShapeBounds> {
        self.named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, bounds)| bounds)
    }
}

/// What starts a job's shape label, compared case-insensitively as GitHub compares labels.
pub const SHAPE_LABEL_PREFIX: &str = "rm-";

/// Whether a job's label is a shape label (`rm-cpu=8`, `RM-GPU=1`): it starts with
/// [`SHAPE_LABEL_PREFIX`], in any case. Read by `crate::shape`; here so that the configuration
/// can refuse such a policy label without naming the module that reads jobs.
pub fn is_shape_label(label: &str) -> bool {
    label
        .get(..SHAPE_LABEL_PREFIX.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(SHAPE_LABEL_PREFIX))
}

/// CPUs as written, `"2"`, `"0.5"`, `"1.125"`, in thousandths; `None` for anything else (a sign,
/// an exponent, more than [`CPU_FRACTION_DIGITS`] fractional digits, beyond [`MAX_CPU_MILLIS`]).
/// Zero is read (the caller says whether it may be).
pub fn parse_cpu(text: &str) -> Option<u64> {
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || whole.len() > 9
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > CPU_FRACTION_DIGITS
        || (text.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let mut millis: u64 = 0;
    for (place, digit) in fraction.bytes().enumerate() {
        let scale = 10u64.pow(u32::try_from(CPU_FRACTION_DIGITS - 1 - place).ok()?);
        millis += u64::from(digit - b'0') * scale;
    }
    let total = whole.checked_mul(1000)?.checked_add(millis)?;
    (total <= MAX_CPU_MILLIS).then_some(total)
}

/// CPUs in thousandths as a person writes them: `2`, `0.5`, `1.25`.
pub fn format_cpu(millis: u64) -> String {
    let (whole, fraction) = (millis / 1000, millis % 1000);
    if fraction == 0 {
        return whole.to_string();
    }
    let fraction = format!("{fraction:03}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
}

/// A size as the configuration writes it (`"32G"`, `"512M"`, powers of 1024, or bytes): the
/// same reader as `memory_max`.
pub fn parse_size(text: &str) -> Option<u64> {
    super::validate::parse_bytes(text)
}

/// Bytes in the largest unit that holds them whole: `64G`, `1536M`, `1000` (the form
/// [`parse_size`] reads back).
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// A device group name: `[a-z][a-z0-9_]{0,15}`, not one of [`RESERVED_GROUPS`].
pub fn is_group_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && name.len() <= MAX_GROUP_NAME_LEN
        && !RESERVED_GROUPS.contains(&name)
}

/// A named shape's name: `[a-z0-9][a-z0-9_-]{0,31}`.
pub fn is_shape_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name.len() <= MAX_SHAPE_NAME_LEN
}

/// A CPU value as TOML wrote it (an integer, a float or a string), in thousandths, more than 0.
fn cpu_value(value: &toml::Value) -> Result<u64, String> {
    let text = match value {
        toml::Value::Integer(n) => n.to_string(),
        // `{}` of a float never uses an exponent: 0.5 is "0.5", 2.0 is "2".
        toml::Value::Float(f) => f.to_string(),
        toml::Value::String(s) => s.trim().to_owned(),
        other => other.to_string(),
    };
    match parse_cpu(&text) {
        Some(0) => Err("must be more than 0 CPUs".to_owned()),
        Some(millis) => Ok(millis),
        None => Err(format!(
            "`{text}` is not a number of CPUs; write it like 8 or 0.5 (at most {CPU_FRACTION_DIGITS} digits after the point, at most {})",
            MAX_CPU_MILLIS / 1000
        )),
    }
}

/// A size key of a shape or of `host.capacity`.
fn size_value(text: &str) -> Result<u64, String> {
    parse_size(text).ok_or_else(|| {
        format!("`{text}` is not a size; write it like \"32G\" or \"512M\" (powers of 1024)")
    })
}

/// A `host.reserve` size: [`parse_size`], or `"0"` for none.
fn reserve_size(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    size_value(text)
}

/// `host.capacity` and `host.reserve` resolved against the machine: per dimension, the written
/// capacity, else the machine less the reserve (written, or the default capped at a share of
/// the machine), else unbounded where the machine's size is unknown. `Err` names the key
/// (below `host.`) and the problem.
pub(super) fn host_capacity(
    capacity: Option<ResourcesSection>,
    reserve: Option<ResourcesSection>,
    facts: &HostFacts,
) -> Result<HostCapacity, (String, String)> {
    let capacity = capacity.unwrap_or_default();
    let reserve = reserve.unwrap_or_default();
    let cpu = |value: &Option<toml::Value>, zero_ok: bool| match value {
        None => Ok(None),
        Some(toml::Value::Integer(0)) if zero_ok => Ok(Some(0)),
        Some(value) => cpu_value(value).map(Some),
    };
    let written_cpu = cpu(&capacity.cpu, false).map_err(|p| ("capacity.cpu".to_owned(), p))?;
    let reserve_cpu = cpu(&reserve.cpu, true).map_err(|p| ("reserve.cpu".to_owned(), p))?;
    let written_memory = capacity
        .memory
        .as_deref()
        .map(size_value)
        .transpose()
        .map_err(|p| ("capacity.memory".to_owned(), p))?;
    let reserve_memory = reserve
        .memory
        .as_deref()
        .map(reserve_size)
        .transpose()
        .map_err(|p| ("reserve.memory".to_owned(), p))?;
    let written_disk = capacity
        .disk
        .as_deref()
        .map(size_value)
        .transpose()
        .map_err(|p| ("capacity.disk".to_owned(), p))?;
    let reserve_disk = reserve
        .disk
        .as_deref()
        .map(reserve_size)
        .transpose()
        .map_err(|p| ("reserve.disk".to_owned(), p))?;
    Ok(HostCapacity {
        cpu_millis: dimension(
            "cpu",
            written_cpu,
            reserve_cpu,
            facts.cpus.and_then(|n| n.checked_mul(1000)),
            (RESERVE_CPU_MILLIS, RESERVE_CPU_DIVISOR),
            format_cpu,
        )?,
        memory: dimension(
            "memory",
            written_memory,
            reserve_memory,
            facts.mem_total,
            (RESERVE_MEMORY, RESERVE_MEMORY_DIVISOR),
            format_size,
        )?,
        disk: dimension(
            "disk",
            written_disk,
            reserve_disk,
            facts.disk_total,
            (RESERVE_DISK, RESERVE_DISK_DIVISOR),
            format_size,
        )?,
    })
}

/// One dimension of [`host_capacity`]. `default_reserve` is the reserve and the divisor that
/// caps it (never more than `machine / divisor`).
fn dimension(
    key: &str,
    written: Option<u64>,
    reserve: Option<u64>,
    machine: Option<u64>,
    default_reserve: (u64, u64),
    show: fn(u64) -> String,
) -> Result<Option<u64>, (String, String)> {
    if let Some(capacity) = written {
        if reserve.is_some() {
            return Err((
                format!("reserve.{key}"),
                format!(
                    "is taken from the machine's size only where host.capacity.{key} is not written, and host.capacity.{key} is; drop one of them"
                ),
            ));
        }
        return Ok(Some(capacity));
    }
    // The machine's size unknown (no /proc, no statvfs): no bound rather than a guess.
    let Some(machine) = machine else {
        return Ok(None);
    };
    let (default, divisor) = default_reserve;
    let reserve = reserve.unwrap_or_else(|| default.min(machine / divisor));
    if reserve >= machine {
        return Err((
            format!("reserve.{key}"),
            format!(
                "{} leaves nothing of this machine's {} for runners; lower host.reserve.{key} or write host.capacity.{key}",
                show(reserve),
                show(machine)
            ),
        ));
    }
    Ok(Some(machine - reserve))
}

/// `[[host.device]]` validated: group names, nodes under `/dev/`, no node twice. `Err` names the
/// key (below `host.`) and the problem.
pub(super) fn devices(sections: Vec<DeviceSection>) -> Result<Vec<Device>, (String, String)> {
    let mut devices: Vec<Device> = Vec::with_capacity(sections.len());
    for (index, section) in sections.into_iter().enumerate() {
        let key = |field: &str| format!("device[{index}].{field}");
        if !is_group_name(&section.group) {
            return Err((
                key("group"),
                format!(
                    "`{}` is not a device group name: a lowercase letter, then lowercase letters, digits or `_`, at most {MAX_GROUP_NAME_LEN} in all, and not one of {} (jobs ask for it as rm-<group>=N)",
                    section.group,
                    RESERVED_GROUPS.join(", ")
                ),
            ));
        }
        if section.nodes.is_empty() {
            return Err((
                key("nodes"),
                "must list the device's own nodes, e.g. [\"/dev/nvidia0\"]".to_owned(),
            ));
        }
        for (field, list) in [
            ("nodes", &section.nodes),
            ("shared_nodes", &section.shared_nodes),
        ] {
            // The runner's rule for a node it may be given (`rm_runner::devices`), at start.
            if let Some((bad, why)) = list.iter().find_map(|node| {
                rm_runner::devices::device_path(node)
                    .err()
                    .map(|why| (node, why))
            }) {
                return Err((
                    key(field),
                    format!("`{}` is not a device node: {why}", bad.display()),
                ));
            }
        }
        // A device's own node is its alone: given to a second device (or shared by a group)
        // it would reach two runners at once.
        for node in &section.nodes {
            let twice = section.nodes.iter().filter(|n| *n == node).count() > 1;
            let elsewhere = devices
                .iter()
                .find(|d| d.nodes.contains(node) || d.shared_nodes.contains(node));
            if twice || section.shared_nodes.contains(node) || elsewhere.is_some() {
                return Err((
                    key("nodes"),
                    format!(
                        "`{}` is listed twice; each node belongs to one device (a node every device of a group needs goes in shared_nodes)",
                        node.display()
                    ),
                ));
            }
        }
        if let Some(node) = section
            .shared_nodes
            .iter()
            .find(|node| devices.iter().any(|d| d.nodes.contains(node)))
        {
            return Err((
                key("shared_nodes"),
                format!(
                    "`{}` is another device's own node; it cannot also be shared",
                    node.display()
                ),
            ));
        }
        devices.push(Device {
            group: section.group,
            nodes: section.nodes,
            shared_nodes: section.shared_nodes,
        });
    }
    Ok(devices)
}

/// A policy's shape keys as written, taken out of its section before the rest is validated.
#[derive(Debug, Default)]
pub struct PolicyShapesSection {
    pub cpu: Option<toml::Value>,
    pub shape_max: Option<ShapeSection>,
    pub shapes: Vec<NamedShapeSection>,
}

/// A policy's `cpu`, `shape_max` and `[[policy.shape]]` validated: values readable, device keys
/// naming the host's groups, named shapes unique and within `shape_max`, and every shape within
/// what the host has. `Err` names the key (below `policy[N].`) and the problem.
pub(super) fn policy_shapes(
    section: PolicyShapesSection,
    capacity: &HostCapacity,
    devices: &[Device],
) -> Result<PolicyShapes, (String, String)> {
    let mut groups: BTreeMap<&str, u32> = BTreeMap::new();
    for device in devices {
        *groups.entry(device.group.as_str()).or_default() += 1;
    }
    let cpu_millis = section
        .cpu
        .as_ref()
        .map(cpu_value)
        .transpose()
        .map_err(|p| ("cpu".to_owned(), p))?;
    let max = section
        .shape_max
        .map(|s| bounds(s, "shape_max", &groups))
        .transpose()?;
    let mut named: Vec<(String, ShapeBounds)> = Vec::with_capacity(section.shapes.len());
    for (index, shape) in section.shapes.into_iter().enumerate() {
        let at = format!("shape[{index}]");
        if !is_shape_name(&shape.name) {
            return Err((
                format!("{at}.name"),
                format!(
                    "`{}` is not a shape name: lowercase letters, digits, `-` or `_`, starting with a letter or digit, at most {MAX_SHAPE_NAME_LEN} (jobs pick it as rm-shape=<name>)",
                    shape.name
                ),
            ));
        }
        if named.iter().any(|(n, _)| *n == shape.name) {
            return Err((
                format!("{at}.name"),
                format!(
                    "`{}` names another shape of this policy too; names must be unique",
                    shape.name
                ),
            ));
        }
        let bounds = bounds(shape.shape, &at, &groups)?;
        named.push((shape.name, bounds));
    }
    if let Some(max) = &max {
        if let (Some(cpu), Some(most)) = (cpu_millis, max.cpu_millis)
            && cpu > most
        {
            return Err((
                "cpu".to_owned(),
                format!(
                    "{} CPUs is more than shape_max.cpu ({}); lower it or raise shape_max.cpu",
                    format_cpu(cpu),
                    format_cpu(most)
                ),
            ));
        }
        for (index, (_, shape)) in named.iter().enumerate() {
            within_max(shape, max, &format!("shape[{index}]"))?;
        }
    }
    if let (Some(cpu), Some(most)) = (cpu_millis, capacity.cpu_millis)
        && cpu > most
    {
        return Err((
            "cpu".to_owned(),
            format!(
                "{} CPUs is more than this host's capacity of {} CPUs; lower cpu to {} or raise host.capacity.cpu",
                format_cpu(cpu),
                format_cpu(most),
                format_cpu(most)
            ),
        ));
    }
    if let Some(max) = &max {
        within_host(max, "shape_max", capacity, &groups)?;
    }
    for (index, (_, shape)) in named.iter().enumerate() {
        within_host(shape, &format!("shape[{index}]"), capacity, &groups)?;
    }
    Ok(PolicyShapes {
        cpu_millis,
        max,
        named,
    })
}

/// One shape's values read; `at` is its key (`shape_max`, `shape[1]`).
fn bounds(
    section: ShapeSection,
    at: &str,
    groups: &BTreeMap<&str, u32>,
) -> Result<ShapeBounds, (String, String)> {
    let cpu_millis = section
        .cpu
        .as_ref()
        .map(cpu_value)
        .transpose()
        .map_err(|p| (format!("{at}.cpu"), p))?;
    let memory = section
        .memory
        .as_deref()
        .map(size_value)
        .transpose()
        .map_err(|p| (format!("{at}.memory"), p))?;
    let disk = section
        .disk
        .as_deref()
        .map(size_value)
        .transpose()
        .map_err(|p| (format!("{at}.disk"), p))?;
    let mut devices = BTreeMap::new();
    for (group, value) in section.devices {
        if !groups.contains_key(group.as_str()) {
            let known = if groups.is_empty() {
                "it has no [[host.device]]".to_owned()
            } else {
                format!(
                    "its groups: {}",
                    groups.keys().copied().collect::<Vec<_>>().join(", ")
                )
            };
            return Err((
                format!("{at}.{group}"),
                format!(
                    "is neither cpu, memory, disk nor a device group of this host ({known}); fix the key or add a [[host.device]] with group = \"{group}\""
                ),
            ));
        }
        let count = match value {
            toml::Value::Integer(n) if n >= 1 => u32::try_from(n).ok(),
            _ => None,
        };
        let Some(count) = count else {
            return Err((
                format!("{at}.{group}"),
                format!("`{value}` is not a device count; write a whole number, at least 1"),
            ));
        };
        devices.insert(group, count);
    }
    Ok(ShapeBounds {
        cpu_millis,
        memory,
        disk,
        devices,
    })
}

/// The first dimension in which `shape` asks more than `max` (of those both write), as
/// (what, asked, most), each as the file or a label writes it: the one rule for a named shape
/// against `shape_max` at start and a job's shape against it (`crate::shape`).
pub fn over_max(shape: &ShapeBounds, max: &ShapeBounds) -> Option<(String, String, String)> {
    let over = |what: &str, asked: String, most: String| Some((what.to_owned(), asked, most));
    if let (Some(asked), Some(most)) = (shape.cpu_millis, max.cpu_millis)
        && asked > most
    {
        return over("cpu", format_cpu(asked), format_cpu(most));
    }
    if let (Some(asked), Some(most)) = (shape.memory, max.memory)
        && asked > most
    {
        return over("memory", format_size(asked), format_size(most));
    }
    if let (Some(asked), Some(most)) = (shape.disk, max.disk)
        && asked > most
    {
        return over("disk", format_size(asked), format_size(most));
    }
    shape.devices.iter().find_map(|(group, asked)| {
        max.devices
            .get(group)
            .filter(|most| asked > *most)
            .and_then(|most| over(group, asked.to_string(), most.to_string()))
    })
}

/// A named shape within `shape_max`, in each dimension both write.
fn within_max(shape: &ShapeBounds, max: &ShapeBounds, at: &str) -> Result<(), (String, String)> {
    match over_max(shape, max) {
        None => Ok(()),
        Some((what, asked, most)) => Err((
            format!("{at}.{what}"),
            format!(
                "{asked} is more than shape_max.{what} ({most}); lower it or raise shape_max.{what}"
            ),
        )),
    }
}

/// A shape the host could hold: within its capacity and its devices. `at` is its key.
fn within_host(
    shape: &ShapeBounds,
    at: &str,
    capacity: &HostCapacity,
    groups: &BTreeMap<&str, u32>,
) -> Result<(), (String, String)> {
    let over = |what: &str, asked: String, has: String, unit: &str| {
        Err((
            format!("{at}.{what}"),
            format!(
                "{asked}{unit} is more than this host's capacity of {has}{unit}; lower {at}.{what} to {has} or raise host.capacity.{what}"
            ),
        ))
    };
    if let (Some(asked), Some(has)) = (shape.cpu_millis, capacity.cpu_millis)
        && asked > has
    {
        return over("cpu", format_cpu(asked), format_cpu(has), " CPUs");
    }
    if let (Some(asked), Some(has)) = (shape.memory, capacity.memory)
        && asked > has
    {
        return over("memory", format_size(asked), format_size(has), "");
    }
    if let (Some(asked), Some(has)) = (shape.disk, capacity.disk)
        && asked > has
    {
        return over("disk", format_size(asked), format_size(has), "");
    }
    for (group, asked) in &shape.devices {
        let has = groups.get(group.as_str()).copied().unwrap_or(0);
        if *asked > has {
            return Err((
                format!("{at}.{group}"),
                format!(
                    "{asked} `{group}` devices is more than the {has} this host has; lower {at}.{group} to {has} or add [[host.device]] entries with group = \"{group}\""
                ),
            ));
        }
    }
    Ok(())
}
