//! How large a runner's private tmpfs may grow (issue 25): each of `/tmp`, `/var/tmp`,
//! `/dev/shm` and `/run` (its `/run/lock` inside) gets a `size=` and an `nr_inodes=` so that all of them together
//! stay within the runner's `memory_max`. Unsized, each tmpfs may grow to half the host's RAM,
//! and where no memory controller charges its pages to the job (a cgroup v1 host, or a root
//! without `memory` delegated), nothing else bounds them.
//!
//! Pure: [`private_tmpfs_bounds`] computes, the isolation code mounts.

/// The size of a memory page the sizes are rounded down to: tmpfs counts whole pages.
const PAGE: u64 = 4096;

/// One inode per this many bytes of a tmpfs's size. Each inode costs the kernel about a KiB
/// (the inode and its dentry), so the inodes of a full tmpfs cost at most 1/16 of its size
/// again; and a job can still make a file for every 16 KiB, more than a source tree needs (a
/// typical `node_modules` averages above 20 KiB a file).
const BYTES_PER_INODE: u64 = 16 << 10;

/// The fewest inodes any of them gets, so a tiny `memory_max` still leaves room for a few
/// lock files and sockets.
const MIN_INODES: u64 = 64;

/// `/run` holds a runner's lock files (`/run/lock`), which are empty, a resolver file and a
/// link: a MiB at most, 1/16 of `memory_max` on a tiny one.
const RUN_LOCK_MAX: u64 = 1 << 20;

/// The bounds of one private tmpfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TmpfsBounds {
    /// Bytes, a whole number of pages.
    pub size: u64,
    pub nr_inodes: u64,
}

impl TmpfsBounds {
    /// The mount options, `size=<bytes>,nr_inodes=<n>`, to add to the tmpfs's others
    /// (`mode=1777`).
    pub(crate) fn mount_options(&self) -> String {
        format!("size={},nr_inodes={}", self.size, self.nr_inodes)
    }
}

/// The bounds of the private tmpfs mounted on `dir` (one of
/// [`crate::isolate::PRIVATE_DIRS`]) for a runner whose `memory_max` is `memory_max`:
/// `/tmp` half of it, `/var/tmp` a quarter, `/run` at most a MiB, `/dev/shm` the rest, so
/// the four together never exceed `memory_max`. `None`: no bound (the policy has no
/// `memory_max`, or `dir` is not one of them), the kernel's default applies.
pub(crate) fn private_tmpfs_bounds(dir: &str, memory_max: Option<u64>) -> Option<TmpfsBounds> {
    let total = memory_max?;
    let tmp = total / 2;
    let var_tmp = total / 4;
    let run_lock = (total / 16).min(RUN_LOCK_MAX);
    let dev_shm = total - tmp - var_tmp - run_lock;
    let share = match dir {
        "/tmp" => tmp,
        "/var/tmp" => var_tmp,
        "/dev/shm" => dev_shm,
        "/run" => run_lock,
        _ => return None,
    };
    // At least a page: `size=0` would mean "unlimited" to the kernel.
    let size = (share / PAGE * PAGE).max(PAGE);
    Some(TmpfsBounds {
        size,
        nr_inodes: (size / BYTES_PER_INODE).max(MIN_INODES),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolate::PRIVATE_DIRS;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn each_private_tmpfs_gets_its_share_of_memory_max() {
        for (dir, memory_max, size, nr_inodes) in [
            ("/tmp", 8 * GIB, 4 * GIB, 4 * GIB / (16 << 10)),
            ("/var/tmp", 8 * GIB, 2 * GIB, 2 * GIB / (16 << 10)),
            ("/run", 8 * GIB, MIB, 64),
            (
                "/dev/shm",
                8 * GIB,
                2 * GIB - MIB,
                (2 * GIB - MIB) / (16 << 10),
            ),
            // A small memory_max: /run takes 1/16, sizes are whole pages.
            ("/run", 8 * MIB, 512 << 10, 64),
            ("/tmp", 8 * MIB + 100, 4 * MIB, 256),
            // Tiny: never size=0 (unlimited to the kernel), never fewer than 64 inodes.
            ("/run", 1000, 4096, 64),
            ("/dev/shm", 1000, 4096, 64),
        ] {
            assert_eq!(
                private_tmpfs_bounds(dir, Some(memory_max)),
                Some(TmpfsBounds { size, nr_inodes }),
                "{dir} under memory_max {memory_max}"
            );
        }
    }

    #[test]
    fn together_they_stay_within_memory_max() {
        for memory_max in [64 * MIB, 3 * GIB + 12_345, 8 * GIB, 12 * GIB + 1] {
            let total: u64 = PRIVATE_DIRS
                .iter()
                .map(|dir| private_tmpfs_bounds(dir, Some(memory_max)).unwrap().size)
                .sum();
            assert!(total <= memory_max, "{total} > {memory_max}");
            // And nothing much is left unused.
            assert!(total + 4 * PAGE >= memory_max, "{total} of {memory_max}");
        }
    }

    #[test]
    fn no_memory_max_or_another_place_is_no_bound() {
        assert_eq!(private_tmpfs_bounds("/tmp", None), None);
        assert_eq!(private_tmpfs_bounds("/home", Some(GIB)), None);
    }

    #[test]
    fn the_options_are_what_mount_takes() {
        let bounds = TmpfsBounds {
            size: 4096,
            nr_inodes: 64,
        };
        assert_eq!(bounds.mount_options(), "size=4096,nr_inodes=64");
    }
}
