//! A runner's rootless Docker daemon with the real tools, as root (issue 30): for a pool uid
//! without a passwd entry, in a cgroup v2 group and a network namespace made here, the daemon
//! starts, imports an image made from `busybox-static` (never a pull), runs containers, publishes
//! a port reachable in the namespace only, runs a container under a subordinate uid; a
//! privileged container with the host's `/` bound cannot write a root-owned host file; the daemon's
//! `/var/run/docker.sock` is its own socket; and after the cgroup's kill nothing of the uid or its
//! subordinate range is left (process, mount, listener), and the runtime can be removed.
//!
//! Needs root, a cgroup v2 mount, `ip`, and the tools of `rm_runner::docker::host::TOOLS`
//! plus `busybox` (`apt-get install docker.io rootlesskit slirp4netns uidmap busybox-static`):
//! without them the tests fail unless `RM_TEST_ALLOW_SKIP` names `root`, `cgroup` or `docker`.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rm_agent::config::RegistryMirror;
use rm_runner::cgroup;
use rm_runner::docker::subid::{self, Files, SubRange};
use rm_runner::docker::{self, DaemonSpec, Layout, Tools};
use rm_runner::isolate::{Account, Pool};
use rm_runner::network::{self, HostNetwork, HostRules, Names};

use crate::skip::cannot_run;

/// A pool uid with no passwd entry (a bare numeric range), as `host.runner_uids = "64290-..."`
/// gives. Each test takes its own, so the suite's tests can run at once.
const UID_MAIN: u32 = 64290;
const UID_COSTS: u32 = 64291;
/// Never given a subordinate range.
const UID_NO_RANGE: u32 = 64292;
const UID_MIRROR: u32 = 64293;
const UID_MIRROR_COSTS: u32 = 64294;

/// How many pulls and loads [`docker_mirror_costs`] times, per image.
const MIRROR_COST_RUNS: usize = 5;

/// The padding of [`docker_mirror_costs`]'s large image: about the size of a small real image
/// (`docs/performance.md` measured a 107 MB `docker load`).
const LARGE_PADDING: usize = 100 << 20;

/// How many daemons [`docker_costs`] starts.
const COST_RUNS: usize = 10;

/// The port the published container listens on in the runner's namespace: unusual, so that a
/// listener of the host's own on it would be noticed, not confused with ours.
const PUBLISHED: u16 = 38517;

/// How long the test waits for the published port to answer (rootlesskit's port driver sets
/// it up after `docker run -d` returns).
const PORT_WITHIN: Duration = Duration::from_secs(10);

/// How long killed processes may stay zombies before their new parent reaps them.
const REAPED_WITHIN: Duration = Duration::from_secs(5);

/// The image's name in the runner's daemon.
const IMAGE: &str = "rm-test-busybox";

/// The programs of the image: links to busybox.
const APPLETS: &[&str] = &[
    "sh", "true", "echo", "cat", "sleep", "httpd", "id", "test", "ls", "tr", "wc", "readlink",
    "head",
];

/// What the tests need, or why they cannot run (after `cannot_run` has been told).
fn needs(test: &str) -> Option<Tools> {
    if !rustix::process::geteuid().is_root() {
        cannot_run(test, "root", "it starts a daemon as another uid");
        return None;
    }
    let tools = match Tools::find() {
        Ok(tools) => tools,
        Err(e) => {
            cannot_run(test, "docker", &e.to_string());
            return None;
        }
    };
    if busybox().is_none() {
        cannot_run(
            test,
            "docker",
            "busybox not found: install busybox-static (the test image is made from it)",
        );
        return None;
    }
    if cgroup_mount().is_none() {
        cannot_run(test, "cgroup", "no cgroup v2 filesystem is mounted");
        return None;
    }
    Some(tools)
}

use crate::busybox_image::busybox;

fn cgroup_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup::cgroup2_mounts(&mountinfo)
        .into_iter()
        .next()
        .map(|m| m.mount_point)
}

/// Everything a test made on the host, removed on drop even when the test fails half-way: the
/// cgroup killed (the daemon tree with it), the namespace deleted, the directory removed.
struct Host {
    dir: tempfile::TempDir,
    cgroup: PathBuf,
    netns: String,
}

impl Host {
    fn new(name: &str) -> Host {
        // Not under /tmp (a checkout there included): the daemon gets a tmpfs of its own
        // there, which would hide it.
        let dir = tempfile::Builder::new()
            .prefix("rm-docker-")
            .tempdir_in(crate::runner_base::base_dir())
            .unwrap();
        // The runner's uid must reach its runtime below it.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let cgroup = cgroup_mount()
            .unwrap()
            .join(format!("rm-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&cgroup).unwrap();
        let netns = format!("rm-t{name}-{}", std::process::id());
        ip(&["netns", "add", &netns]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        Host { dir, cgroup, netns }
    }

    fn procs(&self) -> OwnedFd {
        rustix::fs::open(
            self.cgroup.join("cgroup.procs"),
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    fn netns_fd(&self) -> OwnedFd {
        rustix::fs::open(
            Path::new("/run/netns").join(&self.netns),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    /// A fresh runtime for `account` (as the backend hands one over: the uid's, mode 0700).
    fn runtime(&self, name: &str, account: Account) -> PathBuf {
        let runtime = self.dir.path().join(name);
        std::fs::create_dir(&runtime).unwrap();
        std::os::unix::fs::chown(&runtime, Some(account.uid), Some(account.gid)).unwrap();
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        runtime
    }

    /// Kills the cgroup and everything in it, and waits until it is gone.
    fn kill(&self) -> Duration {
        let started = Instant::now();
        cgroup::kill_and_remove(&self.cgroup, cgroup::KILL_WAIT).unwrap();
        started.elapsed()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = cgroup::kill_and_remove(&self.cgroup, cgroup::KILL_WAIT);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image: busybox and its applets, a page to serve, a home for the `--user 1000` run.
fn image_tar(path: &Path) {
    std::fs::write(path, image_layer(0)).unwrap();
}

/// [`image_tar`]'s bytes, with a file of `padding` incompressible bytes (`/pad`) when not 0.
fn image_layer(padding: usize) -> Vec<u8> {
    crate::busybox_image::rootfs(APPLETS, b"served-from-the-runner-daemon\n", padding)
}

/// Runs the `docker` client as the runner's uid against its daemon (as a job does).
fn docker(layout: &Layout, account: Account, args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .env_clear()
        .env("PATH", docker::host::DAEMON_PATH)
        .env("HOME", &layout.home)
        .env("DOCKER_HOST", layout.docker_host())
        .uid(account.uid)
        .gid(account.gid)
        .current_dir("/")
        .output()
        .unwrap()
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `GET <path>` over a unix socket, HTTP/1.0: the answer's body.
fn unix_get(socket: &Path, path: &str) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// `GET /` of `127.0.0.1:port` from inside the network namespace `netns` (a thread of this
/// process joins it; the connection is made there).
fn get_in_netns(netns: &OwnedFd, port: u16) -> std::io::Result<String> {
    let fd = netns.try_clone()?;
    std::thread::spawn(move || {
        rustix::thread::move_into_link_name_space(
            fd.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    })
    .join()
    .unwrap()
}

/// Every process whose real or effective uid is `uid` or in `range`: `(pid, uid)`.
fn processes_of(uid: u32, range: SubRange) -> Vec<(u32, u32)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let ids: Vec<u32> = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(&id) = ids.iter().find(|&&id| id == uid || range.contains(id)) {
            found.push((pid, id));
        }
    }
    found
}

/// Asserts that no process of `uid` or its `range` is left. Killed processes are zombies until
/// whoever inherits them reaps them: gone soon after.
fn nothing_left(uid: u32, range: SubRange) {
    let deadline = Instant::now() + REAPED_WITHIN;
    let mut left = processes_of(uid, range);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        left = processes_of(uid, range);
    }
    let described: Vec<String> = left
        .iter()
        .map(|(pid, id)| {
            let read =
                |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let state = read("status")
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or_default()
                .to_owned();
            format!(
                "{pid} (uid {id}, {state}, {}, cgroup {})",
                read("cmdline").replace('\0', " ").trim(),
                read("cgroup")
                    .lines()
                    .find(|l| l.starts_with("0::"))
                    .unwrap_or_default()
            )
        })
        .collect();
    assert!(
        left.is_empty(),
        "processes of uid {uid} or its range left: {described:?}"
    );
}

/// The pool account's ranges, written to the host's files if missing (rm does this at start).
fn sub_ranges(account: Account) -> SubRange {
    let assigned = subid::ensure(&Files::host(), &[(account.uid, account.gid)]).unwrap();
    assigned.uids[&account.uid]
}

fn no_passwd_entry(uid: u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(
        !passwd
            .lines()
            .any(|l| l.split(':').nth(2) == Some(uid.to_string().as_str())),
        "uid {uid} must be a bare number for this test, but /etc/passwd has it"
    );
}

#[test]
fn a_runners_rootless_docker_works_and_leaves_nothing_after_the_cgroup_kill() {
    let Some(tools) = needs("a_runners_rootless_docker_works_and_leaves_nothing") else {
        return;
    };
    let account = Account {
        uid: UID_MAIN,
        gid: UID_MAIN,
    };
    no_passwd_entry(account.uid);
    let range = sub_ranges(account);
    assert!(
        processes_of(account.uid, range).is_empty(),
        "something already runs as {} or its range",
        account.uid
    );
    let host = Host::new("dk");
    let runtime = host.runtime("runtime", account);
    let netns = host.netns_fd();

    let daemon = docker::start(
        DaemonSpec {
            account,
            hostname: "rm-test".to_owned(),
            run_keep: vec![],
            pids_max: None,
            runtime: runtime.clone(),
            cgroup_procs: host.procs(),
            netns: Some(netns.try_clone().unwrap()),
            resolv_conf: None,
            env: vec![],
            registry_mirror: None,
        },
        &tools,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let layout = daemon.layout.clone();
    eprintln!("daemon ready after {:?}", daemon.ready_after);
    assert!(daemon.socket().starts_with(&runtime));
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    assert!(
        status.contains(&format!("Uid:\t{0}\t{0}\t{0}\t{0}", account.uid)),
        "the daemon runs as the runner's uid: {status}"
    );
    assert!(status.contains("NoNewPrivs:\t0"), "{status}");
    let in_cgroup = std::fs::read_to_string(host.cgroup.join("cgroup.procs")).unwrap();
    assert!(
        in_cgroup.lines().any(|p| p == daemon.pid().to_string()),
        "the daemon is in the runner's cgroup: {in_cgroup}"
    );
    let net = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let netns_id = rustix::fs::fstat(&netns).unwrap().st_ino;
    assert_eq!(
        net(daemon.pid()),
        PathBuf::from(format!("net:[{netns_id}]")),
        "the daemon is in the runner's network namespace"
    );

    // An image from a tarball: no registry.
    let tar = host.dir.path().join("busybox.tar");
    image_tar(&tar);
    std::fs::set_permissions(&tar, std::fs::Permissions::from_mode(0o644)).unwrap();
    ok(
        docker(&layout, account, &["import", tar.to_str().unwrap(), IMAGE]),
        "docker import",
    );
    let started = Instant::now();
    let hello = ok(
        docker(
            &layout,
            account,
            &["run", "--rm", IMAGE, "/bin/echo", "hello-from-rootless"],
        ),
        "docker run",
    );
    eprintln!("first docker run --rm took {:?}", started.elapsed());
    assert_eq!(hello.trim(), "hello-from-rootless");

    // `policy.docker_images`: a saved image loaded by the agent through the socket.
    let saved = layout.home.join("saved.tar");
    ok(
        docker(
            &layout,
            account,
            &["save", "-o", saved.to_str().unwrap(), IMAGE],
        ),
        "docker save",
    );
    ok(docker(&layout, account, &["rmi", IMAGE]), "docker rmi");
    // The file lies in the runner's home: `run` judges it against the pool; here it is loaded
    // as it is, by no pool.
    let no_pool = Pool::new(Vec::new());
    let pinned = |sha256: String| docker::ImageFile {
        path: saved.clone(),
        sha256: Some(sha256),
    };
    // Pinned to another SHA-256 (docker_images = ["saved.tar@sha256:..."]): refused, and the
    // daemon, whose body was cut short before the tarball's end, loaded nothing.
    let mismatch =
        docker::load_images(daemon.socket(), &[pinned("0".repeat(64))], &no_pool).unwrap_err();
    assert!(
        matches!(mismatch, docker::ImageError::Digest { .. }),
        "{mismatch}"
    );
    assert!(
        !docker(&layout, account, &["image", "inspect", IMAGE])
            .status
            .success(),
        "an image that is not the pinned one was loaded"
    );
    let sha256 = crate::busybox_image::sha256_hex(&std::fs::read(&saved).unwrap());
    let loaded = docker::load_images(daemon.socket(), &[pinned(sha256)], &no_pool).unwrap();
    assert!(
        loaded.iter().any(|l| l.contains(IMAGE)),
        "loaded: {loaded:?}"
    );
    let not_an_image = host.dir.path().join("not-an-image.tar");
    std::fs::write(&not_an_image, "plain text").unwrap();
    let refused =
        docker::load_images(daemon.socket(), &[not_an_image.into()], &no_pool).unwrap_err();
    eprintln!("a file that is not an image: {refused}");
    ok(
        docker(&layout, account, &["run", "--rm", IMAGE, "/bin/true"]),
        "docker run of the loaded image",
    );

    // `container:` jobs: the runner binds /var/run/docker.sock; in the daemon's mount namespace
    // that is the runner's own socket, whatever the host has there.
    ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                "-v",
                "/var/run/docker.sock:/var/run/docker.sock",
                IMAGE,
                "/bin/test",
                "-S",
                "/var/run/docker.sock",
            ],
        ),
        "a container given /var/run/docker.sock",
    );
    // The pid file holds dockerd's pid in the tree's own PID namespace: find it in the cgroup.
    let dockerd = std::fs::read_to_string(host.cgroup.join("cgroup.procs"))
        .unwrap()
        .lines()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "dockerd")
        })
        .expect("dockerd in the runner's cgroup")
        .to_owned();
    // Seen from the daemon's own mount namespace (where bind sources are resolved), as root:
    // the runner's daemon answers there, not a host daemon.
    let info = Command::new("nsenter")
        .args(["--target", &dockerd, "--mount", "--"])
        .args([
            "docker",
            "-H",
            "unix:///var/run/docker.sock",
            "info",
            "--format",
        ])
        .arg("{{.DockerRootDir}}")
        .env_clear()
        .env("PATH", docker::host::DAEMON_PATH)
        .env("HOME", host.dir.path())
        .output()
        .unwrap();
    assert_eq!(
        ok(info, "docker info in the daemon's mount namespace").trim(),
        layout.data.to_string_lossy(),
        "/var/run/docker.sock in the daemon's namespace is the runner's daemon"
    );
    let ours = unix_get(Path::new("/var/run/docker.sock"), "/info");
    if let Ok(answer) = ours {
        assert!(
            !answer.contains(&layout.data.to_string_lossy().into_owned()),
            "the host's socket must not be the runner's daemon"
        );
    }

    // A published port: in the runner's namespace only.
    ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "-d",
                "-p",
                &format!("{PUBLISHED}:80"),
                IMAGE,
                "/bin/httpd",
                "-f",
                "-p",
                "80",
                "-h",
                "/www",
            ],
        ),
        "docker run -p",
    );
    let deadline = Instant::now() + PORT_WITHIN;
    let page = loop {
        match get_in_netns(&netns, PUBLISHED) {
            Ok(answer) if answer.contains("200") => break answer,
            other if Instant::now() > deadline => panic!("the published port: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert!(page.contains("served-from-the-runner-daemon"), "{page}");
    assert!(
        TcpStream::connect(("127.0.0.1", PUBLISHED)).is_err(),
        "the published port must not listen in the host's namespace"
    );

    // A container under a subordinate uid: what a sweep by uid would miss.
    ok(
        docker(
            &layout,
            account,
            &["run", "-d", "--user", "1000", IMAGE, "/bin/sleep", "600"],
        ),
        "docker run --user 1000",
    );
    let sub_uid = range.start + 999;
    let deadline = Instant::now() + PORT_WITHIN;
    while !processes_of(account.uid, range)
        .iter()
        .any(|&(_, id)| id == sub_uid)
    {
        assert!(
            Instant::now() < deadline,
            "no process runs as the subordinate uid {sub_uid}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // What containers write counts against the runner's disk bound: the disk watch's own walk
    // (`rm_runner::disk::measure`, as root) finds a container's file, written under a subordinate
    // uid inside the daemon's data root, in the runtime.
    let measured = |runtime: &Path| match rm_runner::disk::measure(runtime, u64::MAX) {
        Ok(rm_runner::disk::Measured::Bytes(bytes)) => bytes,
        other => panic!("the runtime could not be measured: {other:?}"),
    };
    let before = measured(&runtime);
    const WRITTEN: u64 = 32 << 20;
    ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--user",
                "1000",
                IMAGE,
                "/bin/sh",
                "-c",
                &format!("head -c {WRITTEN} /dev/zero > /tmp/written"),
            ],
        ),
        "a container writing 32 MiB",
    );
    let grown = measured(&runtime).saturating_sub(before);
    assert!(
        grown >= WRITTEN,
        "the runtime grew by {grown} bytes when a container wrote {WRITTEN}"
    );

    // Hostile: a privileged container with the host's / cannot write a root-owned host file.
    let victim_dir = host.dir.path().join("victim");
    std::fs::create_dir(&victim_dir).unwrap();
    std::fs::set_permissions(&victim_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = victim_dir.join("file");
    std::fs::write(&victim, "original\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    let inside = format!("/host{}", victim.display());
    let attack = docker(
        &layout,
        account,
        &[
            "run",
            "--rm",
            "--privileged",
            "-v",
            "/:/host",
            IMAGE,
            "/bin/sh",
            "-c",
            &format!("echo pwned >> {inside} && echo WROTE"),
        ],
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&attack.stdout),
        String::from_utf8_lossy(&attack.stderr)
    );
    assert!(
        !attack.status.success() && !said.contains("WROTE"),
        "the write went through: {said}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original\n");
    eprintln!(
        "privileged write through a bind of /: refused ({})",
        said.trim()
    );

    // Hostile: `--pid=host` is refused or confined: the host's PID namespace belongs to the
    // host's user namespace, where the daemon cannot mount a `/proc`. Either the run fails, or
    // what it sees holds no process of the host (one of this test's, its command line marked).
    let mut marked = Command::new("sh")
        .args(["-c", "sleep 120", "rm-pid-marker"])
        .spawn()
        .unwrap();
    // And a bind of the daemon's own `/proc` (which a runner's PID namespace hides from it).
    let bound = ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                "-v",
                "/proc:/hostproc:ro",
                IMAGE,
                "/bin/sh",
                "-c",
                "cat /hostproc/[0-9]*/cmdline | tr '\\0' ' '",
            ],
        ),
        "docker run -v /proc:/hostproc",
    );
    assert!(
        !bound.contains("rm-pid-marker"),
        "the daemon's /proc shows the host's processes"
    );
    let pid_host = docker(
        &layout,
        account,
        &[
            "run",
            "--rm",
            "--pid=host",
            IMAGE,
            "/bin/sh",
            "-c",
            "cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
        ],
    );
    marked.kill().unwrap();
    marked.wait().unwrap();
    let seen = String::from_utf8_lossy(&pid_host.stdout);
    let refusal = String::from_utf8_lossy(&pid_host.stderr);
    if pid_host.status.success() {
        assert!(
            !seen.contains("rm-pid-marker"),
            "--pid=host shows the host's processes: {seen}"
        );
    } else {
        assert!(
            refusal.contains("mount proc") && !seen.contains("rm-pid-marker"),
            "--pid=host failed otherwise than refused: {refusal}"
        );
    }
    eprintln!(
        "--pid=host: {}",
        if pid_host.status.success() {
            "confined"
        } else {
            "refused (no /proc of the host's PID namespace)"
        }
    );

    // Hostile: `--ipc=host` is the tree's IPC namespace, not the host's (the host's System V
    // shared memory, semaphores and queues stay out of reach, as for the runner itself).
    let ipc = ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                "--ipc=host",
                IMAGE,
                "/bin/readlink",
                "/proc/self/ns/ipc",
            ],
        ),
        "docker run --ipc=host",
    );
    let host_ipc = std::fs::read_link("/proc/self/ns/ipc").unwrap();
    assert_ne!(
        ipc.trim(),
        host_ipc.to_string_lossy(),
        "--ipc=host is the host's IPC namespace"
    );

    // Hostile: the host's /tmp is not the daemon's: a file left through a bind of it is seen
    // by no one else and goes with the daemon.
    ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                "-v",
                "/tmp:/hosttmp",
                IMAGE,
                "/bin/sh",
                "-c",
                "echo left > /hosttmp/rm-docker-left-for-the-next-job",
            ],
        ),
        "docker run -v /tmp:/hosttmp",
    );
    assert!(
        !Path::new("/tmp/rm-docker-left-for-the-next-job").exists(),
        "a job's container wrote the host's /tmp"
    );

    // The end: one cgroup kill takes the whole tree.
    let took = host.kill();
    eprintln!("cgroup kill and removal took {took:?}");
    // The agent reaps the process it started, as it reaps a runner.
    let mut daemon = daemon;
    let status = daemon.child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status:?}"
    );
    nothing_left(account.uid, range);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let runtime_text = runtime.to_string_lossy().into_owned();
    assert!(
        !mountinfo.contains(&runtime_text),
        "mounts left under the runtime: {mountinfo}"
    );
    assert!(
        get_in_netns(&netns, PUBLISHED).is_err(),
        "the published port still answers"
    );
    let started = Instant::now();
    std::fs::remove_dir_all(&runtime).unwrap();
    eprintln!("runtime removed in {:?}", started.elapsed());
}

/// The per-runner cost of a Docker daemon, printed (docs/performance.md, "A runner's Docker"):
/// over [`COST_RUNS`] fresh daemons, each in a fresh cgroup, network namespace and runtime, how
/// long until it answers, the image import, the first `docker run --rm`, and the cgroup kill;
/// beside a runner without Docker (the same uid's `true` spawned into the same kind of cgroup).
/// Ignored by default (about 40 s):
/// `cargo test -p rm-agent --test host docker_costs -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check: run it by name"]
fn docker_costs() {
    let Some(tools) = needs("docker_costs") else {
        return;
    };
    let account = Account {
        uid: UID_COSTS,
        gid: UID_COSTS,
    };
    no_passwd_entry(account.uid);
    sub_ranges(account);
    let mut baseline = Vec::new();
    let mut ready = Vec::new();
    let mut bounded = Vec::new();
    let mut import = Vec::new();
    let mut first_run = Vec::new();
    let mut kill = Vec::new();
    for run in 0..COST_RUNS {
        let host = Host::new(&format!("c{run}"));
        let runtime = host.runtime("runtime", account);

        let procs = host.procs();
        let started = Instant::now();
        let mut command = Command::new("true");
        command.uid(account.uid).gid(account.gid);
        // SAFETY: only a raw write(2) to a descriptor opened before the fork.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                rustix::io::write(&procs, b"0")?;
                Ok(())
            });
        }
        assert!(command.status().unwrap().success());
        baseline.push(started.elapsed());

        let tar = host.dir.path().join("busybox.tar");
        image_tar(&tar);
        std::fs::set_permissions(&tar, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut daemon = docker::start(
            DaemonSpec {
                account,
                hostname: "rm-test".to_owned(),
                run_keep: vec![],
                pids_max: None,
                runtime,
                cgroup_procs: host.procs(),
                netns: Some(host.netns_fd()),
                resolv_conf: None,
                env: vec![],
                registry_mirror: None,
            },
            &tools,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        ready.push(daemon.ready_after);
        bounded.push(daemon.copies_bounded_in);
        let layout = daemon.layout.clone();
        let started = Instant::now();
        ok(
            docker(&layout, account, &["import", tar.to_str().unwrap(), IMAGE]),
            "docker import",
        );
        import.push(started.elapsed());
        let started = Instant::now();
        ok(
            docker(&layout, account, &["run", "--rm", IMAGE, "/bin/true"]),
            "docker run",
        );
        first_run.push(started.elapsed());
        kill.push(host.kill());
        daemon.child.wait().unwrap();
    }
    let line = |what: &str, mut v: Vec<Duration>| {
        v.sort();
        // Nearest rank: the smallest sample with at least q % of the samples at or below it.
        let at = |q: usize| {
            let rank = (q * v.len()).div_ceil(100).max(1);
            v[rank - 1].as_secs_f64() * 1000.0
        };
        eprintln!(
            "{what:<44} p50 {:>7.1} ms  p99 {:>7.1} ms  (n={}, min {:.1})",
            at(50),
            at(99),
            v.len(),
            at(0),
        );
    };
    eprintln!(
        "a runner's Docker, {COST_RUNS} fresh daemons (uid {})",
        account.uid
    );
    line("without Docker: spawn the uid's `true`", baseline);
    line("daemon ready (spawn, /_ping answers, sized)", ready);
    line("  of which: sizing rootlesskit's copies", bounded);
    line("docker import (busybox rootfs, 2 MB)", import);
    line("first docker run --rm (client included)", first_run);
    line("cgroup kill until empty, removed", kill);
}

/// A daemon that cannot start (here: its uid has no subordinate range) fails with the daemon's
/// own words, the process started is reaped, and the cgroup's kill leaves nothing.
#[test]
fn a_daemon_that_cannot_start_says_why_and_leaves_nothing() {
    let Some(tools) = needs("a_daemon_that_cannot_start_says_why_and_leaves_nothing") else {
        return;
    };
    let account = Account {
        uid: UID_NO_RANGE,
        gid: UID_NO_RANGE,
    };
    no_passwd_entry(account.uid);
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    assert!(
        !subuid
            .lines()
            .any(|l| l.starts_with(&format!("{}:", account.uid))),
        "uid {} must have no /etc/subuid line for this test",
        account.uid
    );
    let host = Host::new("nr");
    let runtime = host.runtime("runtime", account);
    let err = docker::start(
        DaemonSpec {
            account,
            hostname: "rm-test".to_owned(),
            run_keep: vec![],
            pids_max: None,
            runtime: runtime.clone(),
            cgroup_procs: host.procs(),
            netns: Some(host.netns_fd()),
            resolv_conf: None,
            env: vec![],
            registry_mirror: None,
        },
        &tools,
    )
    .expect_err("a uid without a subordinate range cannot map its containers' ids");
    let said = err.to_string();
    eprintln!("{said}");
    assert!(matches!(err, docker::DockerError::Exited { .. }), "{said}");
    assert!(
        said.contains("dockerd.log"),
        "the error names the log: {said}"
    );
    assert!(
        said.to_lowercase().contains("subuid") || said.contains("newuidmap"),
        "the error quotes the daemon's reason: {said}"
    );
    host.kill();
    nothing_left(account.uid, SubRange { start: 0, count: 0 });
    std::fs::remove_dir_all(&runtime).unwrap();
}

/// A registry's `sha256:<hex>` digest of `bytes`.
fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::busybox_image::sha256_hex(bytes))
}

/// One image a [`Registry`] serves: its schema2 manifest and the blobs it names.
struct Served {
    name: String,
    manifest: Vec<u8>,
    blobs: Vec<(String, Vec<u8>)>,
}

impl Served {
    /// `library/<name>:latest` of one gzip layer made from `layer` (a plain tar).
    fn new(name: &str, layer: &[u8]) -> Served {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(layer).unwrap();
        let gz = gz.finish().unwrap();
        let arch = crate::busybox_image::arch();
        let config = serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "config": { "Cmd": ["/bin/sh"] },
            "rootfs": { "type": "layers", "diff_ids": [digest(layer)] },
            "history": [{ "created_by": "rm's runner_docker test" }],
        })
        .to_string()
        .into_bytes();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": config.len(),
                "digest": digest(&config),
            },
            "layers": [{
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": gz.len(),
                "digest": digest(&gz),
            }],
        })
        .to_string()
        .into_bytes();
        Served {
            name: name.to_owned(),
            manifest,
            blobs: vec![(digest(&config), config), (digest(&gz), gz)],
        }
    }
}

/// A registry v2 server (the part of the API a pull uses) on the host's loopback, on a thread
/// of the test: `GET /v2/`, `GET|HEAD /v2/library/<name>/manifests/<latest|digest>`,
/// `GET /v2/library/<name>/blobs/<digest>`. It stands for a pull-through mirror such as
/// `registry:2` with `REGISTRY_PROXY_REMOTEURL`, and records every request line it answers.
struct Registry {
    port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Registry {
    fn start(images: Vec<Served>) -> Registry {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let images = std::sync::Arc::new(images);
        let log = seen.clone();
        // Left blocked in `accept` when the test ends: the test binary's exit ends it.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let images = images.clone();
                let log = log.clone();
                std::thread::spawn(move || {
                    let _ = Registry::answer(stream, &images, &log);
                });
            }
        });
        Registry { port, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// Answers the requests of one connection (keep-alive) until the client closes it.
    fn answer(
        stream: TcpStream,
        images: &[Served],
        log: &std::sync::Mutex<Vec<String>>,
    ) -> std::io::Result<()> {
        use std::io::BufRead as _;
        let mut reader = std::io::BufReader::new(stream.try_clone()?);
        let mut out = stream;
        loop {
            let mut request = String::new();
            if reader.read_line(&mut request)? == 0 {
                return Ok(());
            }
            // The headers: none matters here (GET and HEAD carry no body).
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    break;
                }
            }
            let request = request.trim().to_owned();
            log.lock().unwrap().push(request.clone());
            let mut words = request.split_whitespace();
            let method = words.next().unwrap_or_default();
            let path = words.next().unwrap_or_default();
            let (status, kind, body, digest_header) = Registry::route(path, images);
            let mut head = format!(
                "HTTP/1.1 {status}\r\nDocker-Distribution-API-Version: registry/2.0\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n",
                body.len()
            );
            if let Some(d) = digest_header {
                head.push_str(&format!("Docker-Content-Digest: {d}\r\n"));
            }
            head.push_str("\r\n");
            out.write_all(head.as_bytes())?;
            if method != "HEAD" {
                out.write_all(&body)?;
            }
            out.flush()?;
        }
    }

    /// The status, content type, body and digest of the answer to `path`.
    fn route(
        path: &str,
        images: &[Served],
    ) -> (&'static str, &'static str, Vec<u8>, Option<String>) {
        let json = "application/json";
        if path == "/v2/" || path == "/v2" {
            return ("200 OK", json, b"{}".to_vec(), None);
        }
        for image in images {
            let prefix = format!("/v2/library/{}/", image.name);
            let Some(rest) = path.strip_prefix(&prefix) else {
                continue;
            };
            let manifest_digest = digest(&image.manifest);
            if let Some(reference) = rest.strip_prefix("manifests/")
                && (reference == "latest" || reference == manifest_digest)
            {
                return (
                    "200 OK",
                    "application/vnd.docker.distribution.manifest.v2+json",
                    image.manifest.clone(),
                    Some(manifest_digest),
                );
            }
            if let Some(wanted) = rest.strip_prefix("blobs/")
                && let Some((d, bytes)) = image.blobs.iter().find(|(d, _)| d == wanted)
            {
                return (
                    "200 OK",
                    "application/octet-stream",
                    bytes.clone(),
                    Some(d.clone()),
                );
            }
        }
        (
            "404 Not Found",
            json,
            br#"{"errors":[{"code":"NAME_UNKNOWN","message":"not served here"}]}"#.to_vec(),
            None,
        )
    }
}

/// A runner's real network (`host.network = "private"`): the host's table with
/// `host.network_host_ports = [port]` for `account`'s slot, and the runner's namespace, veth and
/// table, as the backend makes them. Removed on drop, even when the test fails half-way.
struct RunnerNetwork {
    host: HostNetwork,
    names: Names,
    netns: OwnedFd,
}

impl RunnerNetwork {
    fn new(short_id: &str, account: Account, port: u16) -> RunnerNetwork {
        let host = HostNetwork {
            table: format!("rm_t{short_id}"),
            rules: HostRules::new(&[port], &[], "", [account.uid]),
        };
        let names = Names::of(short_id);
        host.install().unwrap_or_else(|e| panic!("{e}"));
        // Made before anything can fail, so that the drop removes the table in every case.
        let mut made = RunnerNetwork {
            host,
            names,
            netns: rustix::fs::open("/", rustix::fs::OFlags::RDONLY, rustix::fs::Mode::empty())
                .unwrap(),
        };
        let table = made.host.runner_table(account.uid, None, None);
        made.netns =
            network::create(&made.names, account.uid, &table).unwrap_or_else(|e| panic!("{e}"));
        made
    }
}

impl Drop for RunnerNetwork {
    fn drop(&mut self) {
        if let Err(e) = network::remove(&self.names) {
            eprintln!("cannot remove the runner's network {:?}: {e}", self.names);
        }
        if let Err(e) = self.host.uninstall() {
            eprintln!("cannot remove the table {}: {e}", self.host.table);
        }
    }
}

/// What the mirror tests need besides [`needs`]: `ip` and `nft` for the real network.
fn needs_network(test: &str) -> Option<Tools> {
    let tools = needs(test)?;
    let missing = network::missing_tools();
    if !missing.is_empty() {
        cannot_run(
            test,
            "docker",
            &format!("a runner's network needs {}", missing.join(", ")),
        );
        return None;
    }
    Some(tools)
}

/// A daemon for `account` in `host`'s cgroup and `net`'s namespace, told the mirror on the
/// host's `127.0.0.1:port` as rm tells it (`docker::daemon_mirror`).
fn daemon_with_mirror(
    tools: &Tools,
    host: &Host,
    net: &RunnerNetwork,
    account: Account,
    port: u16,
) -> docker::Daemon {
    let written = RegistryMirror {
        https: false,
        host: "127.0.0.1".to_owned(),
        port,
    };
    let mirror = docker::daemon_mirror(
        &written,
        docker::Route::Private {
            host_end: network::addresses(network::slot_of(account.uid)).host,
        },
    );
    docker::start(
        DaemonSpec {
            account,
            hostname: "rm-test".to_owned(),
            run_keep: vec![],
            pids_max: None,
            runtime: host.runtime("runtime", account),
            cgroup_procs: host.procs(),
            netns: Some(net.netns.try_clone().unwrap()),
            resolv_conf: None,
            env: vec![],
            registry_mirror: Some(mirror),
        },
        tools,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// `policy.docker_registry_mirror` with real parts: a registry on the host's loopback, its port
/// in `host.network_host_ports`, the runner's real network (host table, namespace, veth, runner
/// table); the runner's daemon pulls `docker.io/library/<name>` through it (Docker Hub is not
/// reachable from here: the pull succeeds only through the mirror) and runs it.
#[test]
fn a_runners_docker_pulls_through_the_hosts_registry_mirror() {
    let test = "a_runners_docker_pulls_through_the_hosts_registry_mirror";
    let Some(tools) = needs_network(test) else {
        return;
    };
    let account = Account {
        uid: UID_MIRROR,
        gid: UID_MIRROR,
    };
    no_passwd_entry(account.uid);
    let range = sub_ranges(account);
    let name = "rm-mirrored-busybox";
    let registry = Registry::start(vec![Served::new(name, &image_layer(0))]);
    let host = Host::new("mi");
    let net = RunnerNetwork::new(
        &format!("ee{:010x}", std::process::id()),
        account,
        registry.port,
    );
    let daemon = daemon_with_mirror(&tools, &host, &net, account, registry.port);
    let layout = daemon.layout.clone();
    let info = ok(
        docker(
            &layout,
            account,
            &["info", "--format", "{{json .RegistryConfig.Mirrors}}"],
        ),
        "docker info",
    );
    eprintln!("the daemon's mirrors: {}", info.trim());
    let host_end = network::addresses(network::slot_of(account.uid)).host;
    assert!(
        info.contains(&format!("http://{host_end}:{}/", registry.port)),
        "{info}"
    );

    let started = Instant::now();
    let pulled = ok(
        docker(&layout, account, &["pull", name]),
        "docker pull through the mirror",
    );
    eprintln!(
        "docker pull through the mirror took {:?}: {}",
        started.elapsed(),
        pulled.trim()
    );
    let seen = registry.seen();
    eprintln!("the mirror answered: {seen:?}");
    for wanted in [
        format!("/v2/library/{name}/manifests/latest"),
        format!("/v2/library/{name}/blobs/sha256:"),
    ] {
        assert!(
            seen.iter().any(|r| r.contains(&wanted)),
            "the mirror never saw {wanted}: {seen:?}"
        );
    }
    let said = ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                name,
                "/bin/echo",
                "pulled-through-the-mirror",
            ],
        ),
        "docker run of the pulled image",
    );
    assert_eq!(said.trim(), "pulled-through-the-mirror");

    // A name the mirror does not have: the pull fails (it falls back to Docker Hub, which this
    // host's runners cannot reach here), and the mirror was asked first.
    let missing = docker(&layout, account, &["pull", "rm-not-on-the-mirror"]);
    assert!(!missing.status.success());
    assert!(
        registry
            .seen()
            .iter()
            .any(|r| r.contains("/v2/library/rm-not-on-the-mirror/manifests/latest")),
        "the mirror was not asked for a name it lacks"
    );

    host.kill();
    let mut daemon = daemon;
    daemon.child.wait().unwrap();
    nothing_left(account.uid, range);
    drop(net);
    assert!(!network::exists(&Names::of(&format!(
        "ee{:010x}",
        std::process::id()
    ))));
}

/// What a pull through the host's mirror costs beside loading the same image from a tarball
/// (`policy.docker_images`), printed for docs/performance.md ("A runner's Docker"): one daemon
/// in a runner's real network, [`MIRROR_COST_RUNS`] times each for a small image (busybox,
/// about 1 MB gzip) and a large one (busybox and [`LARGE_PADDING`] incompressible bytes): `docker
/// pull` through the mirror (client included), then `docker save`, `docker rmi`, and
/// `load_images` of the saved file (the agent's path), `docker rmi` again. Ignored by default:
/// `cargo test -p rm-agent --test host docker_mirror_costs -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check: run it by name"]
fn docker_mirror_costs() {
    let test = "docker_mirror_costs";
    let Some(tools) = needs_network(test) else {
        return;
    };
    let account = Account {
        uid: UID_MIRROR_COSTS,
        gid: UID_MIRROR_COSTS,
    };
    no_passwd_entry(account.uid);
    sub_ranges(account);
    let images = [("rm-cost-small", 0), ("rm-cost-large", LARGE_PADDING)];
    let served: Vec<Served> = images
        .iter()
        .map(|(name, padding)| Served::new(name, &image_layer(*padding)))
        .collect();
    let sizes: Vec<usize> = served.iter().map(|s| s.blobs[1].1.len()).collect();
    let registry = Registry::start(served);
    let host = Host::new("mc");
    let net = RunnerNetwork::new(
        &format!("ef{:010x}", std::process::id()),
        account,
        registry.port,
    );
    let mut daemon = daemon_with_mirror(&tools, &host, &net, account, registry.port);
    let layout = daemon.layout.clone();
    let mut lines = Vec::new();
    for ((name, _), gz) in images.iter().zip(sizes) {
        let mut pull = Vec::new();
        let mut load = Vec::new();
        let mut saved_size = 0;
        for run in 0..MIRROR_COST_RUNS {
            let started = Instant::now();
            ok(
                docker(&layout, account, &["pull", "-q", name]),
                "docker pull",
            );
            pull.push(started.elapsed());
            let saved = layout.home.join(format!("{name}-{run}.tar"));
            ok(
                docker(
                    &layout,
                    account,
                    &["save", "-o", saved.to_str().unwrap(), name],
                ),
                "docker save",
            );
            saved_size = std::fs::metadata(&saved).unwrap().len();
            ok(docker(&layout, account, &["rmi", name]), "docker rmi");
            let started = Instant::now();
            docker::load_images(
                daemon.socket(),
                &[saved.clone().into()],
                &Pool::new(Vec::new()),
            )
            .unwrap();
            load.push(started.elapsed());
            ok(docker(&layout, account, &["rmi", name]), "docker rmi");
            std::fs::remove_file(&saved).unwrap();
        }
        let mb = |b: u64| b as f64 / (1 << 20) as f64;
        lines.push(summary(
            &format!("docker pull via mirror ({:.1} MB gzip)", mb(gz as u64)),
            pull,
        ));
        lines.push(summary(
            &format!("load_images of its save ({:.1} MB tar)", mb(saved_size)),
            load,
        ));
    }
    eprintln!(
        "a runner's Docker: pull through the host's mirror vs load from a tarball, {MIRROR_COST_RUNS} each (uid {})",
        account.uid
    );
    for line in lines {
        eprintln!("{line}");
    }
    host.kill();
    daemon.child.wait().unwrap();
    drop(net);
}

/// `p50 .. p99 .. (n, min)` of `v`, nearest rank, as [`docker_costs`] prints.
fn summary(what: &str, mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |q: usize| {
        let rank = (q * v.len()).div_ceil(100).max(1);
        v[rank - 1].as_secs_f64() * 1000.0
    };
    format!(
        "{what:<44} p50 {:>7.1} ms  p99 {:>7.1} ms  (n={}, min {:.1})",
        at(50),
        at(99),
        v.len(),
        at(0),
    )
}

/// A directory of the host's removed when the test ends, failed or not.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The uid of [`a_runners_docker_tree_is_sealed_as_the_runner_is`].
const UID_SEAL: u32 = 64295;

/// `pids_max` of the sealed daemon: room for the tree's own tasks (rootlesskit, slirp4netns,
/// dockerd, containerd and their threads: about 150 here) and a container, far below [`FORKS`].
const SEAL_PIDS_MAX: u32 = 800;

/// How many processes the container tries to start.
const FORKS: u32 = 1500;

/// The top of the daemon's tree, in place of `dockerd-rootless.sh`: writes what it inherited
/// (every descriptor of its shell with its target, whether it possesses the key, its host
/// name, its cgroup, its process limit) to `$XDG_RUNTIME_DIR/probe.txt`, then runs the real
/// script with its arguments, unless `@REAL@` is empty (the control). Every process of the
/// tree descends from it, and none of rootlesskit, slirp4netns, dockerd or containerd changes
/// what it inherits of these.
const PROBE: &str = r#"#!/bin/sh
{
    echo "fds $(ls -l /proc/$$/fd/ | tr '\n' ' ')"
    echo "keys $(grep -c '@KEY@' /proc/keys)"
    echo "hostname $(cat /proc/sys/kernel/hostname)"
    echo "cgroup $(grep '^0::' /proc/self/cgroup)"
    echo "nproc $(grep 'Max processes' /proc/self/limits | tr -s ' ')"
} > "$XDG_RUNTIME_DIR/probe.txt"
if [ -n '@REAL@' ]; then exec '@REAL@' "$@"; fi
"#;

/// A session keyring of this thread's own holding a key named `name` (what an agent started
/// from a shell has: the shell's session keyring), so that a process forked from this thread
/// possesses it unless it joins another.
#[allow(unsafe_code)]
fn thread_session_key(name: &str) {
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) and add_key on strings this test owns.
    unsafe {
        assert!(
            libc::syscall(libc::SYS_keyctl, 1, std::ptr::null::<libc::c_char>()) >= 0,
            "keyctl: {}",
            std::io::Error::last_os_error()
        );
        let payload = b"the operator's secret";
        let key = libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            name.as_ptr(),
            payload.as_ptr(),
            payload.len(),
            -3 as libc::c_long, // KEY_SPEC_SESSION_KEYRING
        );
        assert!(key >= 0, "add_key: {}", std::io::Error::last_os_error());
    }
}

/// The probe's lines, by their first word.
fn probe_lines(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// Starts a daemon for `account` in a fresh runtime of `host`, its tree's top being the probe,
/// with `pids_max`; returns the daemon and what the probe saw.
fn probed_daemon(
    host: &Host,
    tools: &Tools,
    account: Account,
    hostname: &str,
    pids_max: Option<u32>,
    key: &str,
    run_keep: Vec<PathBuf>,
) -> (docker::Daemon, std::collections::BTreeMap<String, String>) {
    let probe = host.dir.path().join("probe.sh");
    std::fs::write(
        &probe,
        PROBE
            .replace("@KEY@", key)
            .replace("@REAL@", &tools.rootless_script.display().to_string()),
    )
    .unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = host.runtime("runtime", account);
    let daemon = docker::start(
        DaemonSpec {
            account,
            hostname: hostname.to_owned(),
            run_keep,
            pids_max,
            runtime,
            cgroup_procs: host.procs(),
            netns: Some(host.netns_fd()),
            resolv_conf: None,
            env: vec![],
            registry_mirror: None,
        },
        &Tools {
            rootless_script: probe,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let seen = std::fs::read_to_string(daemon.layout.run.join("probe.txt")).unwrap();
    eprintln!("the daemon's tree started with:\n{seen}");
    (daemon, probe_lines(&seen))
}

/// How many processes a container started before it could start no more (at most [`FORKS`]):
/// it writes its count to a bound directory after each, since the shell exits at the first
/// fork that fails, and the container with it.
fn container_forks(layout: &Layout, account: Account, out: &Path) -> u32 {
    std::fs::create_dir(out).unwrap();
    std::os::unix::fs::chown(out, Some(account.uid), Some(account.gid)).unwrap();
    let script = format!(
        "i=0; while [ $i -lt {FORKS} ]; do sleep 300 & i=$((i + 1)); echo $i > /out/n; done"
    );
    let bind = format!("{}:/out", out.display());
    // Its status says nothing: the shell dies at the failed fork, and the daemon may fail to
    // answer while the tree has no process left to spare.
    let _ = docker(
        layout,
        account,
        &["run", "--rm", "-v", &bind, IMAGE, "sh", "-c", &script],
    );
    std::fs::read_to_string(out.join("n"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Issue 38: a runner's Docker daemon is sealed as the runner is. The agent that starts it holds
/// a descriptor on a root-only file (not close-on-exec, as a shell's redirection leaves one)
/// and a key in its session keyring; the tree starts with neither, with the runner's host name
/// in a UTS namespace of its own, in a cgroup namespace rooted at the runner's cgroup, and
/// under the runner's `RLIMIT_NPROC`. Through the daemon, as a job would: `docker info` and a
/// `--uts=host` container name the runner, not the host; a `--cgroupns=host` container sees no
/// host cgroup path; a `--privileged --pid=host` container finds the descriptor in no process of
/// the tree; a container's fork bomb stops below `pids_max` (its processes run as the uid's
/// subordinate ids, which a per-uid count alone would miss).
///
/// Controls, so each part can fail: the same probe started without the seal (a plain child
/// switched to the uid) sees the descriptor, the key and the host's name; and a daemon without
/// `pids_max` lets the same container start every one of its processes.
#[test]
fn a_runners_docker_tree_is_sealed_as_the_runner_is() {
    let test = "a_runners_docker_tree_is_sealed_as_the_runner_is";
    let Some(tools) = needs(test) else {
        return;
    };
    let account = Account {
        uid: UID_SEAL,
        gid: UID_SEAL,
    };
    no_passwd_entry(account.uid);
    let range = sub_ranges(account);
    let host = Host::new("seal");
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let runner_name = format!("rm-seal{}", std::process::id());
    assert_ne!(host_name.trim(), runner_name);

    // What an agent started from a shell may hold.
    let root_only = host.dir.path().join("root-only.txt");
    std::fs::write(&root_only, "").unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inherited = rustix::fs::open(
        &root_only,
        rustix::fs::OFlags::WRONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let key = format!("rm-test-agent-key-{}", std::process::id());
    thread_session_key(&key);

    // The control: the probe as a plain child of the uid sees all three.
    let control_out = host.dir.path().join("control");
    std::fs::create_dir(&control_out).unwrap();
    std::os::unix::fs::chown(&control_out, Some(account.uid), None).unwrap();
    let control_probe = host.dir.path().join("control-probe.sh");
    std::fs::write(
        &control_probe,
        PROBE.replace("@KEY@", &key).replace("@REAL@", ""),
    )
    .unwrap();
    std::fs::set_permissions(&control_probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let status = Command::new(&control_probe)
        .env_clear()
        .env("PATH", docker::host::DAEMON_PATH)
        .env("XDG_RUNTIME_DIR", &control_out)
        .uid(account.uid)
        .gid(account.gid)
        .status()
        .unwrap();
    assert!(status.success());
    let control = probe_lines(&std::fs::read_to_string(control_out.join("probe.txt")).unwrap());
    eprintln!("the control saw: {control:?}");
    assert!(
        control["fds"].contains(&root_only.display().to_string()),
        "the control must hold the descriptor: {control:?}"
    );
    assert_eq!(control["keys"], "1", "the control must possess the key");
    assert_eq!(control["hostname"], host_name.trim());

    // A host service's socket under /run the operator keeps (`host.runner_run_keep`), and
    // one it does not.
    let services = Path::new("/run").join(format!("rm-seal-{}", std::process::id()));
    std::fs::create_dir_all(&services).unwrap();
    let _remove = RemovedOnDrop(services.clone());
    let _kept = std::os::unix::net::UnixListener::bind(services.join("kept.sock")).unwrap();
    let _hidden = std::os::unix::net::UnixListener::bind(services.join("hidden.sock")).unwrap();
    let (mut daemon, seen) = probed_daemon(
        &host,
        &tools,
        account,
        &runner_name,
        Some(SEAL_PIDS_MAX),
        &key,
        vec![services.join("kept.sock")],
    );
    drop(inherited);
    let layout = daemon.layout.clone();
    assert!(
        !seen["fds"].contains(&root_only.display().to_string()),
        "the tree holds the agent's descriptor: {}",
        seen["fds"]
    );
    assert_eq!(seen["keys"], "0", "the tree possesses the agent's key");
    assert_eq!(seen["hostname"], runner_name);
    assert_eq!(seen["cgroup"], "0::/", "the tree's cgroup namespace");
    assert!(
        seen["nproc"].contains(&format!("{SEAL_PIDS_MAX} {SEAL_PIDS_MAX}")),
        "{}",
        seen["nproc"]
    );

    let tar = host.dir.path().join("image.tar");
    image_tar(&tar);
    ok(
        docker(
            &layout,
            account,
            &["import", &tar.display().to_string(), IMAGE],
        ),
        "docker import",
    );
    let name = ok(
        docker(&layout, account, &["info", "--format", "{{.Name}}"]),
        "docker info",
    );
    assert_eq!(name.trim(), runner_name, "docker info names the runner");
    let uts = ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                "--uts=host",
                IMAGE,
                "cat",
                "/proc/sys/kernel/hostname",
            ],
        ),
        "a --uts=host container",
    );
    assert_eq!(uts.trim(), runner_name);
    let cgroup_name = host
        .cgroup
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let cgroups = docker(
        &layout,
        account,
        &[
            "run",
            "--rm",
            "--cgroupns=host",
            IMAGE,
            "cat",
            "/proc/self/cgroup",
        ],
    );
    let cgroups = String::from_utf8_lossy(&cgroups.stdout).into_owned()
        + &String::from_utf8_lossy(&cgroups.stderr);
    assert!(
        !cgroups.contains(&cgroup_name),
        "a --cgroupns=host container sees the host's cgroup path: {cgroups}"
    );
    let fds = ok(
        docker(
            &layout,
            account,
            &[
                "run",
                "--rm",
                "--privileged",
                "--pid=host",
                IMAGE,
                "sh",
                "-c",
                "ls -l /proc/[0-9]*/fd/ 2>/dev/null; echo listed",
            ],
        ),
        "a --privileged --pid=host container",
    );
    assert!(fds.contains("listed") && fds.contains("socket:"), "{fds}");
    assert!(
        !fds.contains(&root_only.display().to_string()),
        "a process of the tree holds the agent's descriptor: {fds}"
    );

    // rootlesskit's `/etc` and `/run` copies are sized (unsized, each could take half the
    // host's memory): a privileged container writing into the daemon's `/etc` runs out of space.
    let child = std::fs::read_to_string(layout.rootlesskit.join("child_pid")).unwrap();
    let mountinfo = std::fs::read_to_string(format!("/proc/{}/mountinfo", child.trim())).unwrap();
    for (dir, size) in [("/etc", "size=16384k"), ("/run", "size=65536k")] {
        let line = mountinfo
            .lines()
            .rfind(|l| l.split_whitespace().nth(4) == Some(dir))
            .unwrap_or_else(|| panic!("no mount on {dir} in the daemon's namespace"));
        assert!(
            line.contains(" - tmpfs ") && line.contains(size),
            "the daemon's {dir}: {line}"
        );
    }
    let filled = docker(
        &layout,
        account,
        &[
            "run",
            "--rm",
            "--privileged",
            "-v",
            "/:/host",
            IMAGE,
            "sh",
            "-c",
            "head -c 33554432 /dev/zero > /host/etc/rm-filler 2>/dev/null; wc -c < /host/etc/rm-filler",
        ],
    );
    let written: u64 = String::from_utf8_lossy(&filled.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{filled:?}"));
    eprintln!("a privileged container wrote {written} of 32 MiB into the daemon's /etc");
    assert!(
        written <= 16 << 20,
        "{written} bytes written into the daemon's /etc"
    );

    // Of the host's /run, a container bound to the daemon's finds what the operator kept only.
    let listed = docker(
        &layout,
        account,
        &[
            "run",
            "--rm",
            "-v",
            &format!("{}:/services", services.display()),
            IMAGE,
            "ls",
            "/services",
        ],
    );
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned()
        + &String::from_utf8_lossy(&listed.stderr);
    assert!(
        listed.contains("kept.sock") && !listed.contains("hidden.sock"),
        "the daemon's /run: {listed}"
    );

    // Only a kernel that charges a user namespace's processes to its creator bounds the
    // containers by the tree's RLIMIT_NPROC (there `docker_unbounded` must name "pids").
    let kernel = docker::host::running_kernel();
    if docker::unbounded::charged_to_creator(kernel) {
        let forks = container_forks(&layout, account, &host.dir.path().join("forks"));
        eprintln!(
            "a container started {forks} of {FORKS} processes under pids_max {SEAL_PIDS_MAX}"
        );
        assert!(forks > 0, "the container started nothing");
        assert!(
            forks < SEAL_PIDS_MAX,
            "a container started {forks} processes under pids_max {SEAL_PIDS_MAX}"
        );
    } else {
        cannot_run(
            &format!("{test} (its process bound)"),
            "kernel-5.14",
            &format!("kernel {kernel:?} counts a container's subordinate uids on their own"),
        );
    }
    host.kill();
    daemon.child.wait().unwrap();
    nothing_left(account.uid, range);

    // The control: the same container of a daemon without pids_max starts every process.
    let unbounded = Host::new("sealnone");
    let (mut daemon, seen) = probed_daemon(
        &unbounded,
        &tools,
        account,
        &runner_name,
        None,
        &key,
        vec![],
    );
    assert!(
        !seen["nproc"].contains(&format!("{SEAL_PIDS_MAX} {SEAL_PIDS_MAX}")),
        "{}",
        seen["nproc"]
    );
    let layout = daemon.layout.clone();
    ok(
        docker(
            &layout,
            account,
            &["import", &tar.display().to_string(), IMAGE],
        ),
        "docker import",
    );
    let forks = container_forks(&layout, account, &unbounded.dir.path().join("forks"));
    eprintln!("without pids_max a container started {forks} of {FORKS} processes");
    assert_eq!(forks, FORKS, "the control must start every process");
    unbounded.kill();
    daemon.child.wait().unwrap();
    nothing_left(account.uid, range);
}
