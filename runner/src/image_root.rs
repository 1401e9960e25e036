//! A runner whose policy names an image (`policy.image`, issue 40) runs with the image as its
//! root: this module owns what that is made of. Before the fork ([`prepare`]): the per-runner
//! overlay's directories in the runtime (`.rm-root/`, root's, mode 0700: the upper, the
//! overlay's work directory and the mount point), and what the upper holds from the start (the
//! host's resolver file, a `hosts` naming the runner, `passwd` and `group` with the runner's
//! uid). Between fork and exec ([`ImageRootSetup::enter`], raw calls only): the overlay of the
//! image's verified root (read-only lower) and that upper, `pivot_root` into it with the host's
//! root detached, the runtime bound back at its own path, and a minimal `/dev` (the one
//! [`crate::devices`] makes, with the runner's given device nodes on a device host). The private
//! `/tmp`, `/var/tmp`, `/dev/shm` and `/run` and the runner's `/proc` are then made by
//! [`crate::isolate`] as for any runner, inside the image. Also the environment rule
//! ([`with_image_env`], pure).
//!
//! Nothing of the image is ever resolved against the host: every path inside the image is
//! walked only after `pivot_root`, where an absolute or `..` link the image carries resolves
//! inside it. The mounts live in the runner's mount namespace alone and end with its last
//! process; the directories in the runtime go with it at cleanup.

use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

use super::isolate::{Account, mkdir_here};

/// The runtime's directory for the image root: root's (mode 0700), so the runner, which sees
/// its runtime, cannot reach the overlay's upper or work directory under the mount.
pub const IMAGE_ROOT_DIR: &str = ".rm-root";

/// The user name a runner's uid gets in the image's `passwd` (GitHub's hosted runners' user).
pub const RUNNER_USER: &str = "runner";

/// What a runner with an image gets: the image's verified root and the environment it declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePlan {
    /// The image's id (`sha256:...`), for the log and the journal.
    pub id: String,
    /// The store's unpacked root filesystem: the overlay's read-only lower.
    pub rootfs: PathBuf,
    /// The image's `ENV` (`USER` and `WORKDIR` are never applied: the runner runs as its own
    /// uid, in its runtime).
    pub env: Vec<(String, String)>,
}

/// The variables rm sets for an isolated runner whatever the image declares: its home, its
/// temporary and XDG directories are in its runtime.
const RM_OWNS: [&str; 9] = [
    "HOME",
    "TMPDIR",
    "TMP",
    "TEMP",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
];

/// The environment of a runner in an image: the isolated runner's (`env`), with each of the
/// image's `ENV` over it (the image's `PATH` replaces the host's, which names the host's
/// directories) except the names rm sets itself ([`RM_OWNS`]) and rm's own prefix (`RM_`).
/// The operator's `env_file` goes over this, as for any runner. Sorted by name. Pure.
pub fn with_image_env(
    mut env: Vec<(OsString, OsString)>,
    image_env: &[(String, String)],
) -> Vec<(OsString, OsString)> {
    for (key, value) in image_env {
        if RM_OWNS.contains(&key.as_str()) || key.starts_with("RM_") || key.is_empty() {
            continue;
        }
        env.retain(|(k, _)| k.as_bytes() != key.as_bytes());
        env.push((OsString::from(key), OsString::from(value)));
    }
    env.sort();
    env
}

/// The overlay's directories in the runtime.
#[derive(Debug, Clone)]
pub(crate) struct RootDirs {
    pub(crate) dir: PathBuf,
    pub(crate) upper: PathBuf,
    pub(crate) work: PathBuf,
    pub(crate) merged: PathBuf,
}

impl RootDirs {
    pub(crate) fn of(runtime: &Path) -> RootDirs {
        let dir = runtime.join(IMAGE_ROOT_DIR);
        RootDirs {
            upper: dir.join("upper"),
            work: dir.join("work"),
            merged: dir.join("merged"),
            dir,
        }
    }
}

/// The overlay's mount options. A path with `,`, `:` or `\` would be read as another option
/// or another layer; such a path is refused. Pure.
pub(crate) fn overlay_options(lower: &Path, dirs: &RootDirs) -> io::Result<String> {
    let mut parts = Vec::new();
    for (name, path) in [
        ("lowerdir", lower),
        ("upperdir", &dirs.upper),
        ("workdir", &dirs.work),
    ] {
        let text = path
            .to_str()
            .ok_or_else(|| invalid(format!("{} is not UTF-8", path.display())))?;
        if text.contains([',', ':', '\\']) {
            return Err(invalid(format!(
                "{text} holds `,`, `:` or `\\`, which an overlay's options cannot name"
            )));
        }
        parts.push(format!("{name}={text}"));
    }
    Ok(parts.join(","))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// The `hosts` a runner in an image reads: loopback under its own host name. Pure.
pub(crate) fn hosts_file(hostname: &str) -> String {
    format!(
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
    )
}

/// The image's `passwd` (or `group`) text with the runner's entry added: its uid (or gid)
/// named [`RUNNER_USER`], its home in its runtime. An entry of the image with the same name or
/// id is dropped, so tools that look the uid up find the runner. Pure.
pub(crate) fn with_runner_entry(image_text: &str, entry_name: &str, id: u32, line: &str) -> String {
    let mut out = String::new();
    for existing in image_text.lines() {
        let mut fields = existing.split(':');
        let name = fields.next().unwrap_or_default();
        let same_id = fields.nth(1).and_then(|f| f.parse::<u32>().ok()) == Some(id);
        if name == entry_name || same_id {
            continue;
        }
        out.push_str(existing);
        out.push('\n');
    }
    out.push_str(line);
    out.push('\n');
    out
}

/// The most bytes of the image's `passwd` or `group` read to add the runner's entry.
const ACCOUNTS_FILE_MAX: u64 = 1 << 20;

/// Reads `rel` (e.g. `etc/passwd`) of the image's root, with links resolved inside the image,
/// never the host's: empty when it has none.
fn read_in_image(rootfs: &Path, rel: &str) -> io::Result<String> {
    use std::io::Read as _;
    let root = rustix::fs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = match rustix::fs::openat2(
        &root,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(String::new()),
        Err(e) => return Err(e.into()),
    };
    if !rustix::fs::fstat(&fd)
        .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::RegularFile)
    {
        return Ok(String::new());
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(ACCOUNTS_FILE_MAX)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Makes the runtime's image root directories (anew: a slot may hold a previous runner's) and
/// fills the upper with what the runner reads from the start, as root, before the fork.
pub(crate) fn prepare(
    runtime: &Path,
    plan: &ImagePlan,
    account: Account,
    hostname: &str,
    resolv_conf: Option<&[u8]>,
) -> io::Result<ImageRootSetup> {
    if !plan.rootfs.is_absolute() || !plan.rootfs.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("image {} is not in the image store", plan.id),
        ));
    }
    let dirs = RootDirs::of(runtime);
    match std::fs::symlink_metadata(&dirs.dir) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&dirs.dir)?,
        Ok(_) => std::fs::remove_file(&dirs.dir)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::DirBuilder::new().mode(0o700).create(&dirs.dir)?;
    for (dir, mode) in [
        (&dirs.upper, 0o755),
        (&dirs.work, 0o700),
        (&dirs.merged, 0o755),
    ] {
        std::fs::DirBuilder::new().mode(mode).create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    let etc = dirs.upper.join("etc");
    std::fs::DirBuilder::new().mode(0o755).create(&etc)?;
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755))?;
    let home = runtime.join(super::isolate::HOME_DIR);
    let passwd = with_runner_entry(
        &read_in_image(&plan.rootfs, "etc/passwd")?,
        RUNNER_USER,
        account.uid,
        &format!(
            "{RUNNER_USER}:x:{}:{}:rm runner:{}:/bin/sh",
            account.uid,
            account.gid,
            home.display()
        ),
    );
    let group = with_runner_entry(
        &read_in_image(&plan.rootfs, "etc/group")?,
        RUNNER_USER,
        account.gid,
        &format!("{RUNNER_USER}:x:{}:", account.gid),
    );
    let mut files: Vec<(&str, Vec<u8>)> = vec![
        ("hosts", hosts_file(hostname).into_bytes()),
        ("passwd", passwd.into_bytes()),
        ("group", group.into_bytes()),
    ];
    if let Some(resolv) = resolv_conf {
        files.push(("resolv.conf", resolv.to_vec()));
    }
    for (name, bytes) in files {
        let path = etc.join(name);
        std::fs::write(&path, bytes)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    ImageRootSetup::new(runtime, &plan.rootfs, &dirs)
}

/// The directories every image root gets if the image lacks them: where the runner's own
/// `/proc`, `/dev` and private temporary places are mounted.
const MOUNT_POINTS: [&CStr; 6] = [c"/proc", c"/dev", c"/tmp", c"/run", c"/var", c"/var/tmp"];

/// The child's steps for an image root, prepared before the fork.
#[derive(Debug)]
pub(crate) struct ImageRootSetup {
    merged: CString,
    overlay_options: CString,
    /// The runtime's path, and the directories from `/` down to it, outermost first: made in
    /// the image after `pivot_root`, where the image's links resolve inside it.
    runtime: CString,
    runtime_dirs: Vec<CString>,
}

impl ImageRootSetup {
    fn new(runtime: &Path, lower: &Path, dirs: &RootDirs) -> io::Result<ImageRootSetup> {
        let c =
            |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|e| invalid(e.to_string()));
        let mut runtime_dirs = Vec::new();
        let mut at = PathBuf::from("/");
        for part in runtime.components().skip(1) {
            at.push(part);
            runtime_dirs.push(c(&at)?);
        }
        Ok(ImageRootSetup {
            merged: c(&dirs.merged)?,
            overlay_options: CString::new(overlay_options(lower, dirs)?)
                .map_err(|e| invalid(e.to_string()))?,
            runtime: c(runtime)?,
            runtime_dirs,
        })
    }

    /// Between fork and exec, in the runner's new mount namespace (already a slave of the
    /// host's), as root, with the runtime as the working directory: the runner's root becomes
    /// the image, with its own `/dev` holding `devices`' nodes too
    /// ([`crate::devices::private_dev`]). Raw calls only. On return the working directory is
    /// the runtime again.
    pub(crate) fn enter(&self, devices: Option<&crate::devices::DevSetup>) -> io::Result<()> {
        use rustix::mount::{MountFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags};
        // The runtime, cloned before the host's tree goes: bound back at its path inside.
        let runtime: OwnedFd = rustix::mount::open_tree(
            rustix::fs::CWD,
            c".",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )?;
        rustix::mount::mount(
            c"overlay",
            self.merged.as_c_str(),
            c"overlay",
            MountFlags::NOSUID | MountFlags::NODEV,
            self.overlay_options.as_c_str(),
        )?;
        rustix::process::chdir(self.merged.as_c_str())?;
        // `pivot_root(".", ".")`: the old root is stacked on the new one and detached at once,
        // so no directory of the image is needed for it.
        rustix::process::pivot_root(c".", c".")?;
        rustix::mount::unmount(c".", UnmountFlags::DETACH)?;
        rustix::process::chdir(c"/")?;
        for dir in MOUNT_POINTS {
            mkdir_here(dir)?;
        }
        for dir in &self.runtime_dirs {
            mkdir_here(dir.as_c_str())?;
        }
        rustix::mount::move_mount(
            runtime.as_fd(),
            c"",
            rustix::fs::CWD,
            self.runtime.as_c_str(),
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )?;
        crate::devices::private_dev(devices)?;
        rustix::process::chdir(self.runtime.as_c_str())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
