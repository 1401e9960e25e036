//! A policy's resource bounds when the file writes none (issue 25): every runner is bounded in
//! memory, processes and disk unless the operator opts out by writing `"none"`. A job is
//! whatever a pull request says, and before these defaults one job could take the host's whole
//! memory, pids or disk for its whole run (GitHub allows 6 h).
//!
//! The values, and why:
//! - `memory_max`: [`DEFAULT_MEMORY_SHARE`] of the host's memory, split evenly between
//!   `host.max_runners`: all runners together never hold more than that share, so the agent and
//!   the host keep the rest whatever the jobs do. It is what a VM per job gives (a fixed size
//!   each); a job that needs more on a host with many runners gets it by a written value. A
//!   fixed number would be no bound at all on a host smaller than it.
//! - `pids_max`: [`DEFAULT_PIDS_MAX`], far above what builds start (a parallel compile with its
//!   threads is hundreds) and far below the kernel's smallest default `pid_max` (32 768).
//! - `disk_max`: [`DEFAULT_DISK_MAX`], a little over the free disk GitHub's hosted runners give
//!   a job (about 14 GB), so a job written for them fits.
//!
//! What the host is (its memory, its CPUs, the runner root's filesystem) comes in as
//! [`HostFacts`], read by [`HostFacts::probe`] where the file is loaded: validation stays pure.
//! The same facts size the host's capacity for shapes (`super::shape::host_capacity`).

use std::path::Path;

/// Processes and threads per runner when the policy writes no `pids_max`.
pub const DEFAULT_PIDS_MAX: u32 = 4096;

/// Bytes a runner's runtime may hold when the policy writes no `disk_max` (16 GiB).
pub const DEFAULT_DISK_MAX: u64 = 16 << 30;

/// The share of the host's memory (numerator, denominator) that all runners together may hold
/// by default; each runner's default `memory_max` is this share over `host.max_runners`.
pub const DEFAULT_MEMORY_SHARE: (u64, u64) = (3, 4);

/// The word that opts a policy out of a bound.
pub const NO_BOUND: &str = "none";

/// Where the host's memory is read.
const MEMINFO: &str = "/proc/meminfo";

/// What validation needs to know about this host. `Default`: nothing known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// `MemTotal`, in bytes; `None` where the kernel does not say (then no default memory
    /// bound can be computed, and none is applied; the memory capacity is unbounded unless
    /// written).
    pub mem_total: Option<u64>,
    /// CPUs this process may run on (`std::thread::available_parallelism`: online CPUs, less
    /// what affinity or a cgroup quota takes away); `None`: unknown, the CPU capacity is
    /// unbounded unless written.
    pub cpus: Option<u64>,
    /// The runner root's filesystem's size in bytes (`statvfs`: blocks × fragment size);
    /// `None`: unknown, the disk capacity is unbounded unless written.
    pub disk_total: Option<u64>,
}

impl HostFacts {
    /// This host's facts, the disk's for `runner_root` (or, before it exists, for its nearest
    /// existing ancestor: the filesystem it will be made on).
    pub fn probe(runner_root: &Path) -> HostFacts {
        HostFacts {
            mem_total: std::fs::read_to_string(MEMINFO)
                .ok()
                .and_then(|text| mem_total(&text)),
            cpus: std::thread::available_parallelism()
                .ok()
                .and_then(|n| u64::try_from(n.get()).ok()),
            disk_total: filesystem_size(runner_root),
        }
    }
}

/// The size of the filesystem `path` is on, or would be made on (its nearest existing
/// ancestor), in bytes.
pub fn filesystem_size(path: &Path) -> Option<u64> {
    path.ancestors().find_map(|dir| {
        let stat = rustix::fs::statvfs(dir).ok()?;
        stat.f_blocks.checked_mul(stat.f_frsize)
    })
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// One runner's default `memory_max`: [`DEFAULT_MEMORY_SHARE`] of `mem_total` over
/// `host_max_runners`, rounded down to a MiB (at least one MiB; `max_runners` 0 counts as 1).
pub fn default_memory_max(mem_total: u64, host_max_runners: u32) -> u64 {
    let (num, den) = DEFAULT_MEMORY_SHARE;
    let share = u128::from(mem_total) * u128::from(num)
        / u128::from(den)
        / u128::from(host_max_runners.max(1));
    let mib = 1u128 << 20;
    u64::try_from((share / mib).max(1) * mib).unwrap_or(u64::MAX)
}

/// A bound as the file writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written<T> {
    /// Not written: the default applies.
    Default,
    /// `"none"`: no bound, on purpose.
    Unbounded,
    Value(T),
}

impl<T> Written<T> {
    /// The bound in force: the written value, none, or `default`.
    pub fn or(self, default: Option<T>) -> Option<T> {
        match self {
            Written::Default => default,
            Written::Unbounded => None,
            Written::Value(v) => Some(v),
        }
    }
}

/// A size bound (`memory_max`, `disk_max`): absent, `"none"`, or a size `parse` reads.
pub fn written_size(
    text: Option<&str>,
    parse: impl Fn(&str) -> Option<u64>,
) -> Result<Written<u64>, String> {
    match text {
        None => Ok(Written::Default),
        Some(text) if text.trim() == NO_BOUND => Ok(Written::Unbounded),
        Some(text) => parse(text).map(Written::Value).ok_or_else(|| {
            format!(
                "`{text}` is not a size; write it like \"8G\", \"512M\" (powers of 1024), or \"{NO_BOUND}\" for no bound"
            )
        }),
    }
}

/// `pids_max` as written: a number, or `"none"`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum CountOrNone {
    Count(u32),
    Word(String),
}

/// A count bound (`pids_max`): absent, `"none"`, or at least 1.
pub fn written_count(value: Option<&CountOrNone>) -> Result<Written<u32>, String> {
    match value {
        None => Ok(Written::Default),
        Some(CountOrNone::Count(0)) => Err(format!(
            "must be at least 1 (write \"{NO_BOUND}\" for no bound)"
        )),
        Some(CountOrNone::Count(n)) => Ok(Written::Value(*n)),
        Some(CountOrNone::Word(word)) if word.trim() == NO_BOUND => Ok(Written::Unbounded),
        Some(CountOrNone::Word(word)) => Err(format!(
            "`{word}` is not a count; write a number such as 4096, or \"{NO_BOUND}\" for no bound"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_default_memory_is_three_quarters_of_the_host_shared_by_its_runners() {
        for (mem_total, runners, expected) in [
            (16 * GIB, 1, 12 * GIB),
            (16 * GIB, 4, 3 * GIB),
            (16 * GIB, 0, 12 * GIB),
            // Rounded down to a MiB.
            (GIB + 5, 3, 256 * MIB),
            (10 * GIB, 3, 2560 * MIB),
            // Never zero: a limit of 0 would kill every runner at once.
            (1024, 64, MIB),
            // No overflow on any host.
            (u64::MAX, 1, (u64::MAX / 4 * 3) / MIB * MIB),
        ] {
            assert_eq!(
                default_memory_max(mem_total, runners),
                expected,
                "{mem_total} bytes, {runners} runners"
            );
        }
    }

    #[test]
    fn the_filesystem_size_is_read_from_the_nearest_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let existing = filesystem_size(dir.path()).unwrap();
        assert!(existing > 0);
        // A runner root not made yet is sized by the filesystem it will be made on.
        assert_eq!(
            filesystem_size(&dir.path().join("not/yet/made")),
            Some(existing)
        );
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       24683884 kB\nMemAvailable:   24083652 kB\n";
        assert_eq!(mem_total(text), Some(24_683_884 * 1024));
        assert_eq!(mem_total("MemAvailable: 5 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);
    }

    #[test]
    fn a_written_bound_wins_none_opts_out_and_absence_takes_the_default() {
        let parse = |t: &str| t.parse::<u64>().ok();
        assert_eq!(written_size(None, parse), Ok(Written::Default));
        assert_eq!(written_size(Some("none"), parse), Ok(Written::Unbounded));
        assert_eq!(written_size(Some("7"), parse), Ok(Written::Value(7)));
        assert!(
            written_size(Some("lots"), parse)
                .unwrap_err()
                .contains("\"none\"")
        );
        assert_eq!(Written::Default.or(Some(3)), Some(3));
        assert_eq!(Written::<u64>::Unbounded.or(Some(3)), None);
        assert_eq!(Written::Value(9).or(Some(3)), Some(9));

        assert_eq!(written_count(None), Ok(Written::Default));
        assert_eq!(
            written_count(Some(&CountOrNone::Count(64))),
            Ok(Written::Value(64))
        );
        assert_eq!(
            written_count(Some(&CountOrNone::Word("none".into()))),
            Ok(Written::Unbounded)
        );
        assert!(written_count(Some(&CountOrNone::Count(0))).is_err());
        assert!(written_count(Some(&CountOrNone::Word("many".into()))).is_err());
    }
}
