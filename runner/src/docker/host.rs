//! Can this host give runners a rootless Docker? [`judge`] decides from [`Facts`] (pure, table
//! tests below); [`Facts::gather`] looks (files, modes and `/proc` only: it starts nothing and
//! writes nothing). [`Tools::find`] is what the launcher uses to find the one script it runs.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use super::launch::DockerError;
use super::subid::{self, Files};

/// The daemon tree's `PATH`: Debian ships `dockerd-rootless.sh` in the first directory, off
/// everyone's `PATH`; the rest is the usual system one, where `rootlesskit`, `slirp4netns`,
/// `newuidmap`, `iptables`, `containerd` and `runc` are.
pub const DAEMON_PATH: &str =
    "/usr/share/docker.io/contrib:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The tun device rootlesskit and slirp4netns open.
pub(crate) const TUN: &str = "/dev/net/tun";

/// The resolver configuration the daemon gets when the caller gives none.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// `CAP_MKNOD` (linux/capability.h).
const CAP_MKNOD: u32 = 27;

/// The kernel a rootless daemon needs: native overlayfs in a user namespace (5.11). Older
/// kernels need fuse-overlayfs, which rm does not set up.
pub(crate) const MIN_KERNEL: (u32, u32) = (5, 11);

/// A program the daemon tree runs, and the Debian package that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    pub name: &'static str,
    pub package: &'static str,
    /// Must be setuid root (`newuidmap`, `newgidmap`).
    pub setuid: bool,
}

/// Everything the tree runs. `docker` is the jobs' client (the runner runs it for `container:`
/// jobs and Docker actions).
pub const TOOLS: &[Tool] = &[
    Tool {
        name: "dockerd-rootless.sh",
        package: "docker.io",
        setuid: false,
    },
    Tool {
        name: "dockerd",
        package: "docker.io",
        setuid: false,
    },
    Tool {
        name: "docker",
        package: "docker.io",
        setuid: false,
    },
    Tool {
        name: "containerd",
        package: "containerd",
        setuid: false,
    },
    Tool {
        name: "runc",
        package: "runc",
        setuid: false,
    },
    Tool {
        name: "rootlesskit",
        package: "rootlesskit",
        setuid: false,
    },
    Tool {
        name: "slirp4netns",
        package: "slirp4netns",
        setuid: false,
    },
    Tool {
        name: "iptables",
        package: "iptables",
        setuid: false,
    },
    Tool {
        name: "newuidmap",
        package: "uidmap",
        setuid: true,
    },
    Tool {
        name: "newgidmap",
        package: "uidmap",
        setuid: true,
    },
];

/// What was found of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Missing,
    At { path: PathBuf, setuid_root: bool },
}

/// What the host has, as [`judge`] needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub tools: Vec<(Tool, Found)>,
    /// `/dev/net/tun` is a character device.
    pub tun: bool,
    /// `/dev/net/tun` is readable and writable by everyone (udev's default).
    pub tun_open: bool,
    /// The agent holds `CAP_MKNOD`: the daemon then gets a tun node of its own, mode 0666, and
    /// the host's may stay 0600.
    pub can_mknod: bool,
    /// `overlay` is in `/proc/filesystems`.
    pub overlay: bool,
    /// `(major, minor)` of the running kernel.
    pub kernel: Option<(u32, u32)>,
    /// The agent itself runs with `no_new_privs` (its unit's `NoNewPrivileges=`): the daemon,
    /// its child, would inherit it and the setuid `newuidmap` would not work.
    pub no_new_privs: bool,
    /// `user.max_user_namespaces`: 0 forbids the daemon's user namespace.
    pub max_user_namespaces: Option<u64>,
    /// The pool's subordinate ranges: the lines rm would add (`<file>: <line>`), or why it
    /// cannot.
    pub subids: Result<Vec<String>, String>,
}

/// One reason the host cannot run a runner's Docker, with its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lack {
    pub what: String,
    pub remedy: String,
}

/// Every reason this host cannot give runners a rootless Docker; empty when it can. Pure.
pub fn judge(facts: &Facts) -> Vec<Lack> {
    let mut lacks = Vec::new();
    let mut lack = |what: String, remedy: String| lacks.push(Lack { what, remedy });
    let mut missing_packages: Vec<&str> = Vec::new();
    let mut missing_tools: Vec<&str> = Vec::new();
    for (tool, found) in &facts.tools {
        match found {
            Found::Missing => {
                missing_tools.push(tool.name);
                if !missing_packages.contains(&tool.package) {
                    missing_packages.push(tool.package);
                }
            }
            Found::At { path, setuid_root } if tool.setuid && !setuid_root => lack(
                format!("{} is not setuid root", path.display()),
                format!(
                    "reinstall {} (or `chmod u+s {}`, owner root)",
                    tool.package,
                    path.display()
                ),
            ),
            Found::At { .. } => {}
        }
    }
    if !missing_tools.is_empty() {
        lack(
            format!("not found: {}", missing_tools.join(", ")),
            format!(
                "apt-get install {} (dockerd-rootless.sh is looked for in {DAEMON_PATH})",
                missing_packages.join(" ")
            ),
        );
    }
    if !facts.tun {
        lack(
            format!("{TUN} is missing or not a character device"),
            "load the tun module (`modprobe tun`); under systemd, the agent's unit must not set PrivateDevices=yes".into(),
        );
    } else if !facts.tun_open && !facts.can_mknod {
        lack(
            format!(
                "{TUN} is not open to every user and the agent lacks CAP_MKNOD to give the daemon a node of its own"
            ),
            format!("`chmod 0666 {TUN}` (udev's default), or give the agent CAP_MKNOD"),
        );
    }
    match facts.kernel {
        Some(kernel) if kernel < MIN_KERNEL => lack(
            format!(
                "kernel {}.{} has no overlayfs in user namespaces (needs {}.{})",
                kernel.0, kernel.1, MIN_KERNEL.0, MIN_KERNEL.1
            ),
            "upgrade the kernel".into(),
        ),
        Some(_) => {}
        None => lack(
            "the kernel's version cannot be read".into(),
            "mount /proc".into(),
        ),
    }
    if !facts.overlay {
        lack(
            "the kernel offers no overlay filesystem".into(),
            "load it: `modprobe overlay` (and add it to /etc/modules)".into(),
        );
    }
    if facts.no_new_privs {
        lack(
            "the agent runs with no_new_privs, so the daemon could not use the setuid newuidmap"
                .into(),
            "remove NoNewPrivileges= from the agent's systemd unit".into(),
        );
    }
    if facts.max_user_namespaces == Some(0) {
        lack(
            "user.max_user_namespaces is 0: the daemon cannot make its user namespace".into(),
            "`sysctl user.max_user_namespaces=15000` (and in /etc/sysctl.d)".into(),
        );
    }
    if let Err(why) = &facts.subids {
        lack(
            format!("subordinate ids: {why}"),
            "fix /etc/subuid and /etc/subgid as said; rm adds the missing ranges itself".into(),
        );
    }
    lacks
}

/// `(major, minor)` of a kernel release such as `6.18.44-fc-v1147`. Pure.
pub(crate) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The running kernel's `(major, minor)`, `None` where it cannot be read.
pub fn running_kernel() -> Option<(u32, u32)> {
    kernel_version(&std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default())
}

/// Whether `/proc/filesystems` text lists `overlay`. Pure.
pub(crate) fn has_overlay(filesystems: &str) -> bool {
    filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"))
}

/// The `NoNewPrivs:` flag of a `/proc/<pid>/status` text. Pure.
pub fn no_new_privs(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NoNewPrivs:"))
        .is_some_and(|v| v.trim() == "1")
}

/// Whether the agent runs with `no_new_privs`.
pub(crate) fn agent_has_no_new_privs() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| no_new_privs(&s))
}

/// The first `name` in the directories of [`DAEMON_PATH`].
pub fn find(name: &str) -> Option<PathBuf> {
    DAEMON_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|path| {
            std::fs::metadata(path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn found(tool: &Tool) -> Found {
    match find(tool.name) {
        None => Found::Missing,
        Some(path) => {
            let setuid_root =
                std::fs::metadata(&path).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o4000 != 0);
            Found::At { path, setuid_root }
        }
    }
}

impl Facts {
    /// Looks at this host for a pool of `(uid, gid)` accounts.
    pub fn gather(pool: &[(u32, u32)], files: &Files) -> Facts {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        Facts {
            tools: TOOLS.iter().map(|tool| (*tool, found(tool))).collect(),
            tun: std::fs::metadata(TUN)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type())),
            tun_open: std::fs::metadata(TUN).is_ok_and(|m| m.mode() & 0o006 == 0o006),
            can_mknod: crate::isolate::effective_capabilities(&read("/proc/self/status"))
                .is_some_and(|caps| caps & (1 << CAP_MKNOD) != 0),
            overlay: has_overlay(&read("/proc/filesystems")),
            kernel: running_kernel(),
            no_new_privs: agent_has_no_new_privs(),
            max_user_namespaces: read("/proc/sys/user/max_user_namespaces")
                .trim()
                .parse()
                .ok(),
            subids: subid::check(files, pool)
                .map(|(uids, gids)| {
                    let lines = |file: &Path, plan: subid::Plan| {
                        let file = file.display().to_string();
                        plan.add.into_iter().map(move |l| format!("{file}: {l}"))
                    };
                    lines(&files.subuid, uids)
                        .chain(lines(&files.subgid, gids))
                        .collect()
                })
                .map_err(|e| e.to_string()),
        }
    }
}

/// The programs the launcher runs, found.
#[derive(Debug, Clone)]
pub struct Tools {
    /// `dockerd-rootless.sh`, by absolute path (rootlesskit re-executes it by its `$0`).
    pub rootless_script: PathBuf,
}

impl Tools {
    /// Finds every tool of [`TOOLS`], or says which is missing or not setuid.
    pub fn find() -> Result<Tools, DockerError> {
        for tool in TOOLS {
            match found(tool) {
                Found::Missing => {
                    return Err(DockerError::Missing {
                        tool: tool.name,
                        package: tool.package,
                        where_: format!(" in {DAEMON_PATH}"),
                    });
                }
                Found::At {
                    setuid_root: false, ..
                } if tool.setuid => {
                    return Err(DockerError::NotSetuid {
                        tool: tool.name,
                        package: tool.package,
                    });
                }
                Found::At { .. } => {}
            }
        }
        let rootless_script = find("dockerd-rootless.sh").ok_or(DockerError::Missing {
            tool: "dockerd-rootless.sh",
            package: "docker.io",
            where_: format!(" in {DAEMON_PATH}"),
        })?;
        Ok(Tools { rootless_script })
    }
}

/// A host that lacks nothing (tests of [`judge`]; the agent's `check` tests have their own): every tool at
/// `/usr/bin`, the two id mappers setuid root, a kernel of 6.1 with overlay.
#[cfg(test)]
pub(crate) fn all_there() -> Facts {
    Facts {
        tools: TOOLS
            .iter()
            .map(|t| {
                (
                    *t,
                    Found::At {
                        path: PathBuf::from("/usr/bin").join(t.name),
                        setuid_root: t.setuid,
                    },
                )
            })
            .collect(),
        tun: true,
        tun_open: false,
        can_mknod: true,
        overlay: true,
        kernel: Some((6, 1)),
        no_new_privs: false,
        max_user_namespaces: Some(15_000),
        subids: Ok(vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_with_everything_lacks_nothing() {
        assert_eq!(judge(&all_there()), vec![]);
    }

    #[test]
    fn each_lack_is_said_with_its_fix() {
        type Change = fn(&mut Facts);
        let cases: [(&str, Change, &str, &str); 9] = [
            (
                "a 0600 tun device and no CAP_MKNOD",
                |f| f.can_mknod = false,
                "CAP_MKNOD",
                "chmod 0666",
            ),
            (
                "newuidmap missing",
                |f| f.tools[8].1 = Found::Missing,
                "newuidmap",
                "install uidmap",
            ),
            (
                "newgidmap without its setuid bit",
                |f| {
                    f.tools[9].1 = Found::At {
                        path: "/usr/bin/newgidmap".into(),
                        setuid_root: false,
                    }
                },
                "not setuid root",
                "reinstall uidmap",
            ),
            (
                "no tun device",
                |f| f.tun = false,
                "/dev/net/tun",
                "modprobe tun",
            ),
            (
                "an old kernel",
                |f| f.kernel = Some((5, 10)),
                "kernel 5.10",
                "upgrade",
            ),
            (
                "no overlay",
                |f| f.overlay = false,
                "overlay",
                "modprobe overlay",
            ),
            (
                "an agent under no_new_privs",
                |f| f.no_new_privs = true,
                "no_new_privs",
                "NoNewPrivileges=",
            ),
            (
                "user namespaces off",
                |f| f.max_user_namespaces = Some(0),
                "max_user_namespaces",
                "sysctl",
            ),
            (
                "overlapping subordinate ids",
                |f| f.subids = Err("uid 64290's entry (line 2) overlaps ...".into()),
                "line 2",
                "/etc/subuid",
            ),
        ];
        for (name, change, what, remedy) in cases {
            let mut facts = all_there();
            change(&mut facts);
            let lacks = judge(&facts);
            assert_eq!(lacks.len(), 1, "{name}: {lacks:?}");
            assert!(lacks[0].what.contains(what), "{name}: {lacks:?}");
            assert!(lacks[0].remedy.contains(remedy), "{name}: {lacks:?}");
        }
    }

    #[test]
    fn missing_tools_are_named_together_with_their_packages_once() {
        let mut facts = all_there();
        for (tool, found) in &mut facts.tools {
            if tool.package == "docker.io" || tool.package == "uidmap" {
                *found = Found::Missing;
            }
        }
        let lacks = judge(&facts);
        assert_eq!(lacks.len(), 1, "{lacks:?}");
        assert_eq!(
            lacks[0].what,
            "not found: dockerd-rootless.sh, dockerd, docker, newuidmap, newgidmap"
        );
        assert!(
            lacks[0]
                .remedy
                .starts_with("apt-get install docker.io uidmap "),
            "{:?}",
            lacks[0].remedy
        );
    }

    #[test]
    fn proc_texts_are_read() {
        assert_eq!(kernel_version("6.18.44-fc-v1147\n"), Some((6, 18)));
        assert_eq!(kernel_version("5.10.0-28-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(has_overlay("nodev\tsysfs\nnodev\toverlay\n"));
        assert!(!has_overlay("nodev\tsysfs\n\text4\n"));
        assert!(no_new_privs("Name:\tx\nNoNewPrivs:\t1\n"));
        assert!(!no_new_privs("Name:\tx\nNoNewPrivs:\t0\n"));
    }
}
