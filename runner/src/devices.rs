//! A runner's own `/dev` (issue 42): the small tmpfs with the nodes every program expects
//! (`null`, `zero`, `full`, `random`, `urandom`, `tty`, its own `devpts`, an empty `shm`, the
//! `fd` and `std*` links) that an image runner always gets ([`crate::image_root`]) and that every
//! isolated runner gets on a host that declares devices (`[[host.device]]`, [`DevicePlan`]), plus
//! exactly the device nodes the runner was given: so a job can open the GPU it was handed and no
//! other. Before the fork ([`DevSetup::prepare`]): each given node is checked (an absolute, plain
//! path under `/dev/`, a character or block device) and its type, device number, permission bits
//! and owner are read from the host's node. Between fork and exec ([`private_dev`], raw calls
//! only): the tmpfs on `/dev`, the basic nodes, then each given node made with `mknod` as the
//! host's is (its number and mode) and owned by the runner's uid (it has no supplementary
//! groups, so a node the host gives a group would not open for it otherwise).
//!
//! What else a hostile job could use to reach a device it was not given, and why it cannot (each
//! verified by `backend::tests::a_runner_opens_only_the_devices_it_was_given`, as root, with two
//! nodes cloned from `/dev/null` under `/dev/rm-test-*` and a third clone outside `/dev`):
//!
//! - **Another path to the same node.** The private `/dev` hides only the host's `/dev`; a node
//!   of the same number elsewhere (a copy an administrator or a container engine left under
//!   `/var` or `/srv`) would still open by its own permission bits. That is why a given node must
//!   lie under `/dev/` (a node elsewhere would be visible by its host path anyway), and why, on a
//!   device host, every mount of the runner's namespace is made `nodev` first
//!   ([`nodev_everywhere`], recursive `mount_setattr`): a device node anywhere but the private
//!   `/dev` (which is mounted after, without `nodev`) cannot be opened (`EACCES`). The test's
//!   clone in the runner's own runtime opens in the control run and not with a device plan.
//! - **`mknod` by the job.** The runner switches from root to its pool uid, which clears every
//!   capability, and runs with `no_new_privs`; making a device node needs `CAP_MKNOD` in the
//!   initial user namespace (a user namespace the job makes for itself gives it no device
//!   nodes), so `mknod` fails with `EPERM`: the test's `mknod` of the ungiven node's number does.
//! - **`/proc/<pid>/root` of a host process.** The runner has a PID namespace of its own with
//!   its own `/proc` ([`crate::isolate`]): no host process is there to go through (the test
//!   looks for its own pid in the runner's `/proc` and does not find it). Its namespace's pid 1
//!   is root's, which a runner uid cannot `ptrace`, so its `root` link is closed too (the test
//!   lists `/proc/1/root/` and is refused).
//! - **`/sys`** (not tested here). The host's `/sys` stays visible, but sysfs holds attributes,
//!   not device nodes; what in it touches hardware (PCI `resource*`, `config` writes) is root's
//!   alone.
//!
//! - **Its Docker daemon.** A runner's own Docker daemon ([`crate::docker`]) has a mount
//!   namespace of its own, which sees the host's `/dev`: a job could have it pass any node into
//!   a container. Until the daemon gets the runner's `/dev` too, a device host's runner with
//!   `policy.docker` is refused ([`DeviceError::WithDocker`]): failing closed.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode};

use super::isolate::mkdir_here;

/// What of the host's devices a runner sees, on a host that declares devices
/// (`[[host.device]]`). `None` in [`crate::backend::Plan`]: the host declares none, and the
/// runner sees the host's `/dev` (as every runner did before devices existed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevicePlan {
    /// The host's device nodes the runner gets in its own `/dev`, at the same paths: the
    /// granted devices' nodes and their groups' shared nodes. Empty: none.
    pub nodes: Vec<PathBuf>,
}

/// The most device nodes one runner may be given: the child holds them prepared in a list
/// made before the fork, and the `/dev` tmpfs has an inode budget ([`DEV_TMPFS_OPTIONS`]).
pub const MAX_DEVICE_NODES: usize = 64;

/// The most path components below `/dev/` a given node may have (`/dev/dri/renderD128` has
/// two): each level is a directory made in the runner's `/dev`, within its inode budget.
pub const MAX_DEVICE_DEPTH: usize = 4;

/// Why a device plan cannot be given to a runner: each message names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "{path} is not a plain path under /dev/ (absolute, no `.`, `..`, `//` or trailing `/`, at most {MAX_DEVICE_DEPTH} levels); name the device node itself"
    )]
    NotUnderDev { path: PathBuf },
    #[error("{path} is in every runner's own /dev already; do not list it as a device node")]
    Basic { path: PathBuf },
    #[error("{path} is a {kind}, not a character or block device; name the device node itself")]
    NotADevice { path: PathBuf, kind: &'static str },
    #[error("cannot look at the device node {path}: {source}; check that the device is present")]
    Stat { path: PathBuf, source: io::Error },
    #[error(
        "a runner may be given at most {MAX_DEVICE_NODES} device nodes, not {count}; give fewer devices to one job"
    )]
    TooMany { count: usize },
    #[error(
        "a runner that is not isolated (`isolation = \"none\"`) sees every device of the host; a host that declares devices needs `isolation = \"user\"`"
    )]
    NotIsolated,
    #[error(
        "a runner's own Docker daemon sees the host's /dev, through which its job could reach devices it was not given (`docker run --device`); on a host that declares devices a policy cannot have `docker` yet"
    )]
    WithDocker,
}

/// The names the runner's `/dev` has of its own ([`DEVICES`], [`DEV_LINKS`], `pts`, `shm`).
const BASIC: [&str; 13] = [
    "null", "zero", "full", "random", "urandom", "tty", "ptmx", "fd", "stdin", "stdout", "stderr",
    "pts", "shm",
];

/// The character devices of a runner's `/dev` (name, major, minor): what programs expect to
/// open, none that reaches hardware or the host's memory.
const DEVICES: [(&std::ffi::CStr, u32, u32); 6] = [
    (c"/dev/null", 1, 3),
    (c"/dev/zero", 1, 5),
    (c"/dev/full", 1, 7),
    (c"/dev/random", 1, 8),
    (c"/dev/urandom", 1, 9),
    (c"/dev/tty", 5, 0),
];

/// The links of a runner's `/dev` (link, target).
const DEV_LINKS: [(&std::ffi::CStr, &std::ffi::CStr); 5] = [
    (c"/dev/ptmx", c"pts/ptmx"),
    (c"/dev/fd", c"/proc/self/fd"),
    (c"/dev/stdin", c"/proc/self/fd/0"),
    (c"/dev/stdout", c"/proc/self/fd/1"),
    (c"/dev/stderr", c"/proc/self/fd/2"),
];

/// The size of the runner's `/dev` tmpfs: device nodes, links and directories only (no data
/// pages), the inodes bounded for the basic ones plus [`MAX_DEVICE_NODES`] nodes, each with up
/// to [`MAX_DEVICE_DEPTH`] directories.
const DEV_TMPFS_OPTIONS: &std::ffi::CStr = c"mode=755,size=64k,nr_inodes=512";

/// `devpts`: a new instance of the runner's own (its ptys are not the host's).
const DEVPTS_OPTIONS: &std::ffi::CStr = c"newinstance,ptmxmode=0666,mode=0620";

/// Mode of a basic `/dev` character device: anyone reads and writes (the umask would take it).
const DEVICE_MODE: u32 = 0o666;

/// One given device node, read from the host's before the fork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceNode {
    path: CString,
    /// The directories between `/dev` and the node, outermost first.
    parents: Vec<CString>,
    block: bool,
    rdev: u64,
    /// The host node's permission bits (no set-id or sticky bit).
    mode: u32,
    uid: u32,
    gid: u32,
}

/// The given nodes, prepared before the fork; present only on a host that declares devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DevSetup {
    nodes: Vec<DeviceNode>,
}

/// Whether `path` may name a given device node: absolute, strictly below `/dev/`, plain (no
/// `.`, `..`, empty component or trailing `/`), at most [`MAX_DEVICE_DEPTH`] levels, and not a
/// name the runner's `/dev` has of its own. Pure.
pub fn device_path(path: &Path) -> Result<(), DeviceError> {
    let not_under = || DeviceError::NotUnderDev {
        path: path.to_path_buf(),
    };
    let text = path.to_str().ok_or_else(not_under)?;
    let below = text
        .strip_prefix("/dev/")
        .filter(|b| !b.is_empty())
        .ok_or_else(not_under)?;
    let parts: Vec<&str> = below.split('/').collect();
    if parts.len() > MAX_DEVICE_DEPTH
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(not_under());
    }
    if parts.first().is_some_and(|first| BASIC.contains(first)) {
        return Err(DeviceError::Basic {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// What a file that is not a device is, for the message.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_symlink() {
        "link"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_file() {
        "regular file"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "file of another kind"
    }
}

fn c_path(path: &Path) -> Result<CString, DeviceError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| DeviceError::NotUnderDev {
        path: path.to_path_buf(),
    })
}

impl DeviceNode {
    /// Checks `path` ([`device_path`]) and reads the host's node there, not following a link
    /// (a link is refused: the node it points to is the one to name).
    fn of(path: &Path) -> Result<DeviceNode, DeviceError> {
        device_path(path)?;
        let meta = std::fs::symlink_metadata(path).map_err(|source| DeviceError::Stat {
            path: path.to_path_buf(),
            source,
        })?;
        let file_type = meta.file_type();
        let block = file_type.is_block_device();
        if !block && !file_type.is_char_device() {
            return Err(DeviceError::NotADevice {
                path: path.to_path_buf(),
                kind: kind_of(file_type),
            });
        }
        let mut parents = Vec::new();
        let mut at = PathBuf::from("/dev");
        if let Ok(below) = path.strip_prefix("/dev") {
            let parts: Vec<_> = below.components().collect();
            for part in parts.iter().take(parts.len().saturating_sub(1)) {
                at.push(part);
                parents.push(c_path(&at)?);
            }
        }
        Ok(DeviceNode {
            path: c_path(path)?,
            parents,
            block,
            rdev: meta.rdev(),
            mode: meta.mode() & 0o777,
            uid: meta.uid(),
            gid: meta.gid(),
        })
    }

    /// Makes the node in the runner's `/dev` as the host's is, between fork and exec, as root:
    /// raw calls only.
    fn make(&self) -> io::Result<()> {
        for dir in &self.parents {
            mkdir_here(dir.as_c_str())?;
        }
        let file_type = if self.block {
            FileType::BlockDevice
        } else {
            FileType::CharacterDevice
        };
        rustix::fs::mknodat(
            rustix::fs::CWD,
            self.path.as_c_str(),
            file_type,
            Mode::from_raw_mode(self.mode),
            self.rdev,
        )?;
        rustix::fs::chown(
            self.path.as_c_str(),
            Some(rustix::fs::Uid::from_raw(self.uid)),
            Some(rustix::fs::Gid::from_raw(self.gid)),
        )?;
        // The umask took bits at creation; the owner's change may take set-id ones (none kept).
        rustix::fs::chmod(self.path.as_c_str(), Mode::from_raw_mode(self.mode))?;
        Ok(())
    }
}

impl DevSetup {
    /// Checks every node of `plan` and reads each from the host, before the fork: any path that
    /// is not a device node under `/dev/` is an error naming it, and the runner does not start.
    /// A node listed twice (two devices of one group each bring its shared nodes) is made once.
    ///
    /// With `owner` (the runner's uid and gid), each node is made the runner's: the runner has
    /// no supplementary groups, so a node the host gives a group (`0660 root:render`) would not
    /// open for it otherwise, and the copy is in its own `/dev` alone. Its mode stays the
    /// host's.
    pub(crate) fn prepare(
        plan: &DevicePlan,
        owner: Option<(u32, u32)>,
    ) -> Result<DevSetup, DeviceError> {
        let mut paths: Vec<&PathBuf> = plan.nodes.iter().collect();
        paths.sort();
        paths.dedup();
        if paths.len() > MAX_DEVICE_NODES {
            return Err(DeviceError::TooMany { count: paths.len() });
        }
        let mut nodes: Vec<DeviceNode> = paths
            .into_iter()
            .map(|path| DeviceNode::of(path))
            .collect::<Result<_, _>>()?;
        if let Some((uid, gid)) = owner {
            for node in &mut nodes {
                (node.uid, node.gid) = (uid, gid);
            }
        }
        Ok(DevSetup { nodes })
    }
}

/// `struct mount_attr` (linux/mount.h), for `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_NODEV` (linux/mount.h).
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// Makes every mount of the calling process's mount namespace `nodev` (recursive
/// `mount_setattr` on `/`, Linux 5.12): a device node anywhere but the runner's `/dev`, mounted
/// after this, cannot be opened. Between fork and exec, in the runner's new mount namespace,
/// before anything of the host is cloned into it: raw call only. Fails closed (an older kernel's
/// `ENOSYS` fails the start): a device host's runner never starts with another way to a node.
#[allow(unsafe_code)]
pub(crate) fn nodev_everywhere() -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `mount_setattr` with a NUL-terminated path and a pointer to a `mount_attr` of the
    // size passed, both alive for the call; no allocation, async-signal-safe.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The runner's `/dev`: a small tmpfs (not `nodev`: its nodes must open) with [`DEVICES`], its
/// own `devpts`, an empty `shm` (the private tmpfs goes there after) and [`DEV_LINKS`], then the
/// given nodes (`devices`, none for an image runner on a host without devices). Between fork and
/// exec, in the runner's mount namespace, as root: raw calls only.
pub(crate) fn private_dev(devices: Option<&DevSetup>) -> io::Result<()> {
    use rustix::mount::MountFlags;
    rustix::mount::mount(
        c"tmpfs",
        c"/dev",
        c"tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        DEV_TMPFS_OPTIONS,
    )?;
    for (path, major, minor) in DEVICES {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            FileType::CharacterDevice,
            Mode::from_raw_mode(DEVICE_MODE),
            rustix::fs::makedev(major, minor),
        )?;
        rustix::fs::chmod(path, Mode::from_raw_mode(DEVICE_MODE))?;
    }
    mkdir_here(c"/dev/pts")?;
    rustix::mount::mount(
        c"devpts",
        c"/dev/pts",
        c"devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        DEVPTS_OPTIONS,
    )?;
    mkdir_here(c"/dev/shm")?;
    for (link, target) in DEV_LINKS {
        rustix::fs::symlink(target, link)?;
    }
    if let Some(devices) = devices {
        for node in &devices.nodes {
            node.make()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn only_plain_paths_under_dev_name_a_device() {
        for (path, problem) in [
            ("/dev/nvidia0", None),
            ("/dev/dri/renderD128", None),
            ("/dev/a/b/c/d", None),
            ("/dev/nullx", None),
            ("/dev/a/b/c/d/e", Some("plain path under /dev/")),
            ("/dev", Some("plain path under /dev/")),
            ("/dev/", Some("plain path under /dev/")),
            ("dev/nvidia0", Some("plain path under /dev/")),
            ("/srv/nvidia0", Some("plain path under /dev/")),
            ("/devices/nvidia0", Some("plain path under /dev/")),
            ("/dev/../etc/shadow", Some("plain path under /dev/")),
            ("/dev/./nvidia0", Some("plain path under /dev/")),
            ("/dev//nvidia0", Some("plain path under /dev/")),
            ("/dev/dri/", Some("plain path under /dev/")),
            ("/dev/null", Some("every runner's own")),
            ("/dev/pts/0", Some("every runner's own")),
            ("/dev/shm/x", Some("every runner's own")),
        ] {
            let said = device_path(Path::new(path)).map_err(|e| e.to_string());
            match problem {
                None => assert!(said.is_ok(), "{path}: {said:?}"),
                Some(words) => assert!(
                    said.as_ref()
                        .is_err_and(|e| e.contains(words) && e.contains(path)),
                    "{path}: {said:?}"
                ),
            }
        }
    }

    #[test]
    fn a_plan_is_refused_before_the_fork_unless_each_node_is_a_device_under_dev() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let refused =
            |nodes: Vec<PathBuf>| DevSetup::prepare(&DevicePlan { nodes }, None).unwrap_err();
        // Outside /dev, even a real device node (the path is the host's way to it anyway).
        assert!(matches!(
            refused(vec![file.clone()]),
            DeviceError::NotUnderDev { path } if path == file
        ));
        // A way out of /dev is not under it.
        assert!(matches!(
            refused(vec![PathBuf::from("/dev/pts/../net")]),
            DeviceError::NotUnderDev { .. }
        ));
        let missing = PathBuf::from(format!("/dev/rm-absent-{}", std::process::id()));
        let said = refused(vec![missing.clone()]);
        assert!(
            matches!(&said, DeviceError::Stat { path, source } if *path == missing && source.kind() == io::ErrorKind::NotFound),
            "{said:?}"
        );
        assert!(said.to_string().contains(&missing.display().to_string()));
        // Under /dev but not a device: a directory (a regular file: the test below).
        if Path::new("/dev/net").is_dir() {
            assert!(matches!(
                refused(vec![PathBuf::from("/dev/net")]),
                DeviceError::NotADevice {
                    kind: "directory",
                    ..
                }
            ));
        }
        // One bad node refuses the whole plan.
        assert!(matches!(
            refused(vec![PathBuf::from("/dev/full"), missing]),
            DeviceError::Basic { .. }
        ));
        let too_many: Vec<PathBuf> = (0..=MAX_DEVICE_NODES)
            .map(|n| PathBuf::from(format!("/dev/n{n}")))
            .collect();
        assert!(matches!(
            refused(too_many),
            DeviceError::TooMany { count } if count == MAX_DEVICE_NODES + 1
        ));
        assert!(
            DevSetup::prepare(&DevicePlan::default(), None)
                .unwrap()
                .nodes
                .is_empty()
        );
    }

    /// A regular file under `/dev` (as root only: the test makes one there).
    #[test]
    fn a_regular_file_under_dev_is_not_a_device() {
        if !rustix::process::geteuid().is_root() {
            crate::test_skip::cannot_run(
                "a_regular_file_under_dev_is_not_a_device",
                "root",
                "only root can write under /dev",
            );
            return;
        }
        let path = PathBuf::from(format!("/dev/rm-test-file-{}", std::process::id()));
        std::fs::write(&path, "x").unwrap();
        let said = DevSetup::prepare(
            &DevicePlan {
                nodes: vec![path.clone()],
            },
            None,
        );
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(&said, Err(DeviceError::NotADevice { path: p, kind: "regular file" }) if *p == path),
            "{said:?}"
        );
    }

    #[test]
    fn a_host_node_is_read_with_its_type_number_mode_and_owner() {
        // A node every Linux host of ours has, and that no runner's /dev has of its own.
        let Some(path) = ["/dev/console", "/dev/tty0", "/dev/kmsg"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
        else {
            crate::test_skip::cannot_run(
                "a_host_node_is_read_with_its_type_number_mode_and_owner",
                "devices",
                "this host has none of /dev/console, /dev/tty0, /dev/kmsg",
            );
            return;
        };
        let read = DeviceNode::of(path).unwrap();
        let meta = std::fs::metadata(path).unwrap();
        assert!(!read.block, "a character device");
        assert_eq!(read.rdev, meta.rdev());
        assert_eq!(read.mode, meta.mode() & 0o777);
        assert_eq!((read.uid, read.gid), (meta.uid(), meta.gid()));
        assert!(read.parents.is_empty());
        assert_eq!(read.path.as_bytes(), path.as_os_str().as_bytes());
    }
}
