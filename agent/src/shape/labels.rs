//! The grammar of one shape label (`rm-cpu=8`, `rm-mem=32g`, `rm-disk=100g`, `rm-shape=large`,
//! `rm-gpu=1`): what it asks, or why it cannot be read. Keys and values are compared
//! case-insensitively, as GitHub compares labels. Nothing is guessed: a value the grammar does
//! not read whole (`1.5g`, `32gb`, a bare `1024`) is unreadable, with the form that would be.

use crate::config::shape::{
    CPU_FRACTION_DIGITS, MAX_GROUP_NAME_LEN, MAX_SHAPE_NAME_LEN, SHAPE_LABEL_PREFIX, is_group_name,
    is_shape_name, parse_cpu, parse_size,
};

/// What one shape label asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ask {
    /// `rm-cpu=N`: CPUs, in thousandths.
    Cpu(u64),
    /// `rm-mem=SIZE`: bytes.
    Memory(u64),
    /// `rm-disk=SIZE`: bytes.
    Disk(u64),
    /// `rm-shape=NAME`: a named shape of the policy (lowercased).
    Shape(String),
    /// `rm-<group>=N`: N devices of a group.
    Devices(String, u32),
}

/// Reads a label [`super::is_shape_label`] said is one: its key (lowercase, without `rm-`; two
/// labels of one job may not share it) and what it asks, or why it cannot be read (with the
/// form that would be).
pub(super) fn read(label: &str) -> Result<(String, Ask), String> {
    let rest = label.get(SHAPE_LABEL_PREFIX.len()..).unwrap_or_default();
    let Some((key, value)) = rest.split_once('=') else {
        return Err(
            "a shape label is rm-KEY=VALUE: rm-cpu=N, rm-mem=SIZE, rm-disk=SIZE, rm-shape=NAME or rm-GROUP=N (a device group)"
                .to_owned(),
        );
    };
    let key = key.to_ascii_lowercase();
    let ask = match key.as_str() {
        "cpu" => Ask::Cpu(cpus(value)?),
        "mem" => Ask::Memory(size(value)?),
        "disk" => Ask::Disk(size(value)?),
        "shape" => {
            let name = value.to_ascii_lowercase();
            if !is_shape_name(&name) {
                return Err(format!(
                    "`{value}` is not a shape name (letters, digits, `-` or `_`, at most {MAX_SHAPE_NAME_LEN}); write rm-shape=NAME with a [[policy.shape]] name"
                ));
            }
            Ask::Shape(name)
        }
        group if is_group_name(group) => Ask::Devices(key.clone(), count(value)?),
        _ => {
            return Err(format!(
                "`{key}` is not a shape key; the keys are cpu, mem, disk, shape, and a device group's name (a lowercase letter, then letters, digits or `_`, at most {MAX_GROUP_NAME_LEN})"
            ));
        }
    };
    Ok((key, ask))
}

/// `N` CPUs: more than 0, at most [`CPU_FRACTION_DIGITS`] digits after the point.
fn cpus(value: &str) -> Result<u64, String> {
    match parse_cpu(value) {
        Some(0) => Err("0 CPUs is no CPU at all; ask for more, e.g. rm-cpu=0.5".to_owned()),
        Some(millis) => Ok(millis),
        None => Err(format!(
            "`{value}` is not a number of CPUs; write it like rm-cpu=4 or rm-cpu=0.5 (at most {CPU_FRACTION_DIGITS} digits after the point)"
        )),
    }
}

/// A size: a whole number and a unit `k`, `m`, `g` or `t` in either case (powers of 1024), as
/// the configuration's sizes but never without a unit: `rm-mem=16` could mean gigabytes to one
/// reader and bytes to another.
fn size(value: &str) -> Result<u64, String> {
    let unit_ok = value
        .bytes()
        .last()
        .is_some_and(|b| matches!(b.to_ascii_lowercase(), b'k' | b'm' | b'g' | b't'));
    let digits_ok = value.len() > 1
        && value
            .bytes()
            .take(value.len() - 1)
            .all(|b| b.is_ascii_digit());
    match (unit_ok && digits_ok).then(|| parse_size(value)).flatten() {
        Some(bytes) => Ok(bytes),
        None => Err(format!(
            "`{value}` is not a size; write a whole number and a unit K, M, G or T (powers of 1024), e.g. 32g or 1536m"
        )),
    }
}

/// `N` devices: a whole number, at least 1.
fn count(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(0) => Err("asks 0 devices; ask for at least 1, or drop the label".to_owned()),
        Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!(
            "`{value}` is not a device count; write a whole number, e.g. rm-gpu=1"
        )),
    }
}
