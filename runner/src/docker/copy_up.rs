//! Bounding rootlesskit's copy-up tmpfs ([`bound`]). `dockerd-rootless.sh` starts rootlesskit
//! with `--copy-up=/etc --copy-up=/run`: in the tree's mount namespace each becomes a tmpfs of
//! links to the original entries, mounted without a size, so each may grow to half the host's
//! memory. A job reaches both: a `--privileged -v /:/host` container writes the daemon's
//! `/etc` and `/run` as root of the daemon's user namespace. Where runner cgroups have a memory
//! controller the pages count against `memory_max`; where they have none nothing else bounds
//! them. So once the daemon answers (rootlesskit has mounted them by then), the agent enters the
//! tree's mount namespace and remounts each with [`COPY_UPS`]' size: the bound is the
//! filesystem's, so every container's copy of the mount has it too.
//!
//! Which mounts, and with which flags, is decided from the tree's `mountinfo` ([`remount_flags`],
//! pure); [`bound`] is the thin adapter.

use std::ffi::CString;
use std::io;
use std::path::Path;

use rustix::mount::MountFlags;

/// rootlesskit's copy-up places and the options each is remounted with: `/etc` holds links
/// and the few files rm writes (`passwd`, `group`, the resolver), `/run` links, sockets' links
/// and what the tools put there; both far below these sizes. An inode per 4 KiB at most.
pub(crate) const COPY_UPS: [(&str, &std::ffi::CStr); 2] = [
    ("/etc", c"size=16m,nr_inodes=4096"),
    ("/run", c"size=64m,nr_inodes=16384"),
];

/// The file in rootlesskit's `--state-dir` that holds its child's pid (in the agent's PID
/// namespace): the process whose mount namespace holds the copies.
const CHILD_PID: &str = "child_pid";

/// The flags a remount of the tmpfs on `mount_point` must keep (its per-mount `ro`, `nosuid`,
/// `nodev`, `noexec`), read from a `/proc/<pid>/mountinfo` text: the topmost mount there, if
/// it is a tmpfs. `None`: no tmpfs is mounted there. Pure.
pub(crate) fn remount_flags(mountinfo: &str, mount_point: &str) -> Option<MountFlags> {
    let top = mountinfo
        .lines()
        .rfind(|line| line.split_whitespace().nth(4) == Some(mount_point))?;
    let fields: Vec<&str> = top.split_whitespace().collect();
    let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    if *fields.get(dash + 1)? != "tmpfs" {
        return None;
    }
    let mut flags = MountFlags::empty();
    for option in fields.get(5)?.split(',') {
        flags |= match option {
            "ro" => MountFlags::RDONLY,
            "nosuid" => MountFlags::NOSUID,
            "nodev" => MountFlags::NODEV,
            "noexec" => MountFlags::NOEXEC,
            _ => MountFlags::empty(),
        };
    }
    Some(flags)
}

/// Remounts each of [`COPY_UPS`] in the mount namespace of the rootlesskit child named in
/// `state_dir` with its size. A copy that is not there, or cannot be bounded, is an error: a
/// daemon whose `/etc` or `/run` could take the host's memory is not handed to a job.
#[allow(unsafe_code)]
pub(crate) fn bound(state_dir: &Path) -> io::Result<()> {
    let pid: u32 = std::fs::read_to_string(state_dir.join(CHILD_PID))?
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{CHILD_PID}: {e}")))?;
    let proc = Path::new("/proc").join(pid.to_string());
    let mountinfo = std::fs::read_to_string(proc.join("mountinfo"))?;
    let mut remounts = Vec::new();
    for (dir, options) in COPY_UPS {
        let flags = remount_flags(&mountinfo, dir).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("rootlesskit mounted no tmpfs on {dir}"),
            )
        })?;
        let target = CString::new(dir).map_err(io::Error::other)?;
        remounts.push((target, flags, options));
    }
    let namespace = std::fs::File::open(proc.join("ns/mnt"))?;
    // A thread of its own: joining a mount namespace needs a file system context not shared
    // with the agent's other threads, and the thread ends with it.
    std::thread::Builder::new()
        .name("rm-dockerd-bound".to_owned())
        .spawn(move || -> io::Result<()> {
            // SAFETY: unsharing the file system context affects this thread only, which no
            // other code shares; it is not used after this closure.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS)? };
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&namespace),
                Some(rustix::thread::LinkNameSpaceType::Mount),
            )?;
            for (target, flags, options) in &remounts {
                rustix::mount::mount_remount(target.as_c_str(), *flags, *options)?;
            }
            Ok(())
        })?
        .join()
        .map_err(|_| io::Error::other("the thread bounding the copies panicked"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topmost_tmpfs_on_a_place_is_remounted_with_its_flags() {
        let mountinfo = "\
1 0 8:1 / / rw,relatime - ext4 /dev/vda1 rw
2 1 0:40 / /etc rw,nosuid,relatime - tmpfs tmpfs rw,mode=755
3 1 0:41 / /run rw,nosuid,nodev - tmpfs tmpfs rw
4 3 0:42 / /run ro,noexec - tmpfs none rw
5 1 0:43 / /srv rw - ext4 /dev/vda2 rw
6 1 0:44 / /opt rw shared:7 master:1 - tmpfs none rw
";
        assert_eq!(remount_flags(mountinfo, "/etc"), Some(MountFlags::NOSUID));
        // The topmost of two mounts on /run is what the daemon sees.
        assert_eq!(
            remount_flags(mountinfo, "/run"),
            Some(MountFlags::RDONLY | MountFlags::NOEXEC)
        );
        // Optional fields before the separator.
        assert_eq!(remount_flags(mountinfo, "/opt"), Some(MountFlags::empty()));
        // Not a tmpfs, or nothing there.
        assert_eq!(remount_flags(mountinfo, "/srv"), None);
        assert_eq!(remount_flags(mountinfo, "/home"), None);
    }
}
