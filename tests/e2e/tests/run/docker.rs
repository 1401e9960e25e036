//! A job's own rootless Docker (issue 30) through `rm-agent run`: a policy with `docker = true`
//! and an image in `docker_images`. The runner package's `bin/Runner.Listener` is a job (a POSIX
//! sh script, run as the runner's uid in its namespaces, as a workflow's steps are) that uses the
//! Docker it was given, writes one line per step (`name ok|failed output`) to a report, then
//! `exec`s the real fake listener so the runner registers and completes its job.
//!
//! - The first job does what workflows do: finds the preloaded image, imports another from a
//!   tarball, runs a container, builds an image `FROM` the preloaded one, starts a
//!   `services:`-style container with a published port and reaches it at `localhost`, runs a
//!   step in a container (`docker exec`), makes a volume, and leaves a container running.
//! - The second job, on the same uid, finds none of that, then attacks: `--privileged` with the
//!   host's `/` bound (writing a root-owned directory is refused, and `/etc` is the daemon's
//!   copy; its own runtime, the control, is written: the bind works, the uid confines it),
//!   `--pid=host` (a marker process of the host is not seen), `--net=host` (the agent's receiver
//!   on the host's loopback is not reached), the host's disk as a device, and the host
//!   daemon's socket (`/var/run/docker.sock` is the job's own daemon); and, through its own daemon (issue 38), what the agent inherited from the
//!   shell that started it: a `--privileged --pid=host` container finds the agent's descriptor
//!   in no process of the daemon's tree, and `docker info` and a `--uts=host` container name
//!   the runner, not the host.
//! - After each job nothing is left: no process of the runner uids or of their subordinate
//!   ranges, no mount below the runner root, no network namespace, veth or cgroup, no runtime.
//!
//! Needs root and the tools of `rm_runner::docker::host::TOOLS` plus `busybox` (the
//! images are made from it; never a pull); without them the test fails unless
//! `RM_TEST_ALLOW_SKIP` names `docker`. The agent writes the pool's subordinate ranges to
//! `/etc/subuid` and `/etc/subgid`; the test puts both files back as they were.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState};

use crate::busybox_image::{self, busybox, saved_image};
use crate::isolation::{base_dir, cgroups_left, names_with_prefix, processes};
use crate::skip;

const LABELS: &[&str] = &["self-hosted", "docker"];

/// The preloaded image (`docker_images`); the job imports `rm-e2e-imported` itself.
pub(crate) const BASE_IMAGE: &str = "rm-e2e-base";

/// The programs of the images: links to busybox.
const APPLETS: &[&str] = &[
    "sh", "true", "echo", "cat", "sleep", "httpd", "id", "ls", "tr", "wget", "head", "grep",
    "touch",
];

/// The port the `services:`-style container publishes in the runner's network.
const SERVICE_PORT: u16 = 38518;

/// `pids_max` of the Docker policy: room for the runner, its daemon's tree (about 150 tasks
/// with their threads) and the first job's builds, far below [`FORKS`].
const PIDS_MAX: u32 = 1000;

/// How many processes the second job's container tries to start.
const FORKS: u32 = 1500;

/// The argument of the host's marker process `--pid=host` must not show.
const MARKER_SECONDS: &str = "3133731";

/// What a workflow's steps do with Docker, in the first job; the second job's checks and
/// attacks. `@REPORT@`, `@RECEIVER@` and `@IMAGES@` are replaced.
const SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." && pwd)
REPORT=@REPORT@
say() { printf '%s %s\n' "$1" "$(printf '%s' "$2" | tr '\n' ' ')" >> "$REPORT"; }
try() {
    name=$1; shift
    if out=$("$@" 2>&1); then say "$name" "ok $out"; else say "$name" "failed $out"; fi
}
BASE=rm-e2e-base
if [ ! -e "$REPORT.first" ]; then
    : > "$REPORT.first"
    say job first
    say docker_host "$DOCKER_HOST"
    try preloaded docker image inspect -f '{{.Id}}' $BASE
    try import docker import @IMAGES@/rootfs.tar rm-e2e-imported
    try run_imported docker run --rm rm-e2e-imported echo hello-from-the-imported-image
    try run docker run --rm $BASE echo hello-from-a-container
    mkdir -p "$HERE/ctx"
    printf 'FROM %s\nRUN echo built-by-the-job > /built\n' $BASE > "$HERE/ctx/Dockerfile"
    try build env DOCKER_BUILDKIT=0 docker build -q -t rm-e2e-built "$HERE/ctx"
    try built docker run --rm rm-e2e-built cat /built
    try service docker run -d --name service -p @SERVICE_PORT@:80 $BASE httpd -f -p 80 -h /www
    i=0
    reached=
    while [ $i -lt 100 ]; do
        if reached=$(busybox wget -q -O - http://localhost:@SERVICE_PORT@/ 2>&1); then break; fi
        i=$((i + 1))
        sleep 0.1
    done
    say reached "$reached"
    try job_container docker run -d --name job-container $BASE sleep 600
    try exec docker exec job-container sh -c 'echo a-step-in-the-container'
    try volume docker volume create rm-e2e-volume
    try running docker ps -q
else
    say job second
    try images docker images --format '{{.Repository}}'
    try containers docker ps -aq
    try volumes docker volume ls -q
    try privileged_etc docker run --rm --privileged -v /:/host $BASE sh -c 'echo pwned > /host/etc/rm-e2e-pwned'
    try privileged_root docker run --rm --privileged -v /:/host $BASE sh -c 'echo pwned > /host@ROOT_ONLY@/pwned'
    try privileged_own docker run --rm --privileged -v /:/host $BASE sh -c "echo written > /host$HERE/from-a-container && cat /host$HERE/from-a-container"
    try pid_host docker run --rm --pid=host $BASE sh -c 'cat /proc/[0-9]*/cmdline | tr "\0" " "'
    try net_host docker run --rm --net=host $BASE wget -q -T 3 -O - http://127.0.0.1:@RECEIVER@/healthz
    try net_host_gateway docker run --rm --net=host $BASE wget -q -T 3 -O - http://10.0.2.2:@RECEIVER@/healthz
    try device docker run --rm --device @DEVICE@ $BASE head -c 512 @DEVICE@
    try host_socket docker -H unix:///var/run/docker.sock info --format '{{.Name}}'
    # `ls` fails when a process it lists ends meanwhile: the listing is what counts.
    try inherited_fd docker run --rm --privileged --pid=host $BASE sh -c 'ls -l /proc/[0-9]*/fd/ 2>/dev/null; true'
    try daemon_name docker info --format '{{.Name}}'
    try uts_host docker run --rm --uts=host $BASE cat /proc/sys/kernel/hostname
    try unix_socket_runner ls @UNIX_SOCKET@
    try unix_socket_daemon docker run --rm -v /run:/hostrun $BASE ls /hostrun@UNIX_SOCKET_BELOW_RUN@
    # Last: past pids_max the daemon itself may fail to start a thread. The container's shell
    # exits at the first fork that fails; the count of those that worked is in the bound dir.
    mkdir -p "$HERE/forks"
    docker run --rm -v "$HERE/forks:/out" $BASE sh -c 'i=0; while [ $i -lt @FORKS@ ]; do sleep 300 & i=$((i + 1)); echo $i > /out/n; done' >/dev/null 2>&1
    say forks "ok $(cat "$HERE/forks/n" 2>/dev/null)"
fi
say done yes
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

/// A block device of the host only root may read: the first disk of `/sys/block` with a node
/// in `/dev` (a loop device where there is no other).
fn root_only_device() -> PathBuf {
    let mut names: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("ram") && !n.starts_with("zram"))
        .collect();
    names.sort_by_key(|n| (n.starts_with("loop"), n.clone()));
    names
        .into_iter()
        .map(|n| Path::new("/dev").join(n))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o004 == 0))
        .expect("a block device only root may read, in /dev")
}

/// The lines the agent adds to `/etc/subuid` and `/etc/subgid` for a fleet's uids, removed on
/// drop (only those: tests running at the same time keep theirs).
pub(crate) struct SubIds(pub(crate) std::ops::RangeInclusive<u32>);

impl SubIds {
    /// Each fleet uid's subordinate uid range, from `/etc/subuid` as the agent left it.
    fn ranges(uids: &std::ops::RangeInclusive<u32>) -> Vec<std::ops::Range<u64>> {
        std::fs::read_to_string("/etc/subuid")
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(':');
                let owner: u32 = fields.next()?.parse().ok()?;
                let start: u64 = fields.next()?.parse().ok()?;
                let count: u64 = fields.next()?.parse().ok()?;
                uids.contains(&owner).then_some(start..start + count)
            })
            .collect()
    }
}

impl Drop for SubIds {
    fn drop(&mut self) {
        for path in ["/etc/subuid", "/etc/subgid"] {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let ours = |line: &str| {
                line.split(':')
                    .next()
                    .and_then(|owner| owner.parse::<u32>().ok())
                    .is_some_and(|owner| self.0.contains(&owner))
            };
            let kept: String = text
                .lines()
                .filter(|l| !ours(l))
                .map(|l| format!("{l}\n"))
                .collect();
            if kept != text {
                // Beside it, then renamed over it: a daemon starting meanwhile reads either.
                let next = format!("{path}.rm-e2e");
                std::fs::write(&next, kept).unwrap();
                std::fs::rename(&next, path).unwrap();
            }
        }
    }
}

/// A process of the host that `--pid=host` must not show, killed on drop.
struct Marker(std::process::Child);

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The images' root filesystem, with a page for the service to serve (the job image test's
/// Docker policy preloads it too).
pub(crate) fn rootfs_tar() -> Vec<u8> {
    busybox_image::rootfs(APPLETS, b"served-by-the-jobs-service\n", 0)
}

/// The report's lines of one job: step → (ok, output).
fn steps(report: &str, job: &str) -> BTreeMap<String, (bool, String)> {
    let mut current = String::new();
    let mut steps = BTreeMap::new();
    for line in report.lines() {
        let (name, rest) = line.split_once(' ').unwrap_or((line, ""));
        if name == "job" {
            current = rest.to_owned();
            continue;
        }
        if current != job {
            continue;
        }
        let (ok, output) = match rest.split_once(' ') {
            Some(("ok", out)) => (true, out.to_owned()),
            Some(("failed", out)) => (false, out.to_owned()),
            _ if rest == "ok" => (true, String::new()),
            _ if rest == "failed" => (false, String::new()),
            _ => (true, rest.to_owned()),
        };
        steps.insert(name.to_owned(), (ok, output));
    }
    steps
}

/// What is left of `attempts` on this host: processes of the runner uids or their subordinate
/// ranges, mounts below the runner root or of an image root, network namespaces, veths, cgroups
/// and runtimes. Shared with the job image tests (`image_failures`).
pub(crate) fn left_of(
    fleet: &Fleet,
    attempts: &[AttemptRecord],
    subranges: &[std::ops::Range<u64>],
) -> Vec<String> {
    let (first, last) = fleet.uids.split_once('-').unwrap();
    let uids: std::ops::RangeInclusive<u32> = first.parse().unwrap()..=last.parse().unwrap();
    let mut left: Vec<String> = processes()
        .into_iter()
        .filter(|p| !p.zombie())
        .filter(|p| {
            p.uids
                .iter()
                .any(|u| uids.contains(u) || subranges.iter().any(|r| r.contains(&u64::from(*u))))
        })
        .map(|p| format!("process {}", p.describe()))
        .collect();
    let root = fleet.runner_root.display().to_string();
    left.extend(
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&root) || l.contains(rm_runner::image_root::IMAGE_ROOT_DIR))
            .map(|l| format!("mount {l}")),
    );
    for a in attempts {
        let short = a.attempt_id.short();
        left.extend(
            names_with_prefix(Path::new("/run/netns"), &format!("rm-{short}"))
                .into_iter()
                .map(|n| format!("netns {n}")),
        );
        left.extend(
            names_with_prefix(Path::new("/sys/class/net"), &format!("rmv{short}"))
                .into_iter()
                .map(|n| format!("veth {n}")),
        );
        if let Some(uid) = a.uid
            && Path::new(&format!("/run/user/{uid}")).exists()
        {
            left.push(format!("/run/user/{uid}"));
        }
    }
    left.extend(
        cgroups_left(attempts)
            .into_iter()
            .map(|c| format!("cgroup {}", c.display())),
    );
    left.extend(
        fleet
            .runtimes()
            .into_iter()
            .map(|r| format!("runtime {}", r.display())),
    );
    left
}

/// A fleet of one policy with `docker = true` and the base image in `docker_images`, whose
/// package's listener is `script` (its `@REPORT@` and `@IMAGES@` replaced, then `more`), with the
/// fleet's subordinate id lines removed at the end; `None` (a skip recorded) where this host cannot run Docker.
struct DockerFleet {
    fleet: Fleet,
    report: PathBuf,
    _images: tempfile::TempDir,
    // Dropped last: the files are put back once the fleet is gone.
    _subids: SubIds,
}

/// What a policy needs to give its runners Docker with the base image preloaded: the images'
/// directory (`rootfs.tar` for `docker import`, `base.tar` for `docker_images`, both made of
/// `rootfs`) and the policy's lines; `None` (a skip recorded) where this host cannot run
/// Docker. Shared with the cache's Docker test (`cache_docker`).
pub(crate) struct DockerPolicy {
    pub(crate) images: tempfile::TempDir,
    pub(crate) extra: String,
}

pub(crate) fn docker_policy(test: &str, rootfs: &[u8]) -> Option<DockerPolicy> {
    if let Err(e) = rm_runner::docker::Tools::find() {
        skip::cannot_run(test, "docker", &e.to_string());
        return None;
    }
    if busybox().is_none() {
        skip::cannot_run(
            test,
            "docker",
            "busybox not found: install busybox-static (the images are made from it)",
        );
        return None;
    }
    let images = tempfile::Builder::new()
        .prefix("rm-e2e-images-")
        .tempdir_in(base_dir())
        .unwrap();
    std::fs::set_permissions(images.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(images.path().join("rootfs.tar"), rootfs).unwrap();
    std::fs::set_permissions(
        images.path().join("rootfs.tar"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let saved = images.path().join("base.tar");
    std::fs::write(&saved, saved_image(rootfs, BASE_IMAGE)).unwrap();
    // On a host whose runner cgroups get no memory controller (this kind of machine), the
    // policy must accept that a Docker job's memory is unbounded there, or `run` refuses; on a
    // kernel older than 5.14 without the pids controller, its processes too.
    let extra = format!(
        "docker = true\ndocker_images = [\"{}\"]\ndocker_unbounded = [{}]\npids_max = {PIDS_MAX}\n",
        saved.display(),
        if bounded_by_nproc() {
            "\"memory\""
        } else {
            "\"memory\", \"pids\""
        }
    );
    Some(DockerPolicy { images, extra })
}

async fn docker_fleet(
    test: &str,
    script: &str,
    more: impl FnOnce(&Fleet, String) -> String,
) -> Option<DockerFleet> {
    let DockerPolicy { images, extra } = docker_policy(test, &rootfs_tar())?;
    let extra: &'static str = Box::leak(extra.into_boxed_str());
    let fleet = Fleet::start(FleetOptions {
        host_max: 1,
        policies: vec![PolicySpec {
            name: "docker",
            target: "acme",
            labels: LABELS,
            max_runners: 1,
            workspace: "ephemeral",
            extra,
        }],
        base_dir: Some(base_dir()),
        ..FleetOptions::default()
    })
    .await;
    let report = fleet.reports_dir().join("docker.txt");
    fleet.wrap_listener(&more(
        &fleet,
        script
            .replace("@REPORT@", &report.display().to_string())
            .replace("@IMAGES@", &images.path().display().to_string()),
    ));
    Some(DockerFleet {
        _subids: SubIds(uids_of(&fleet)),
        fleet,
        report,
        _images: images,
    })
}

/// Whether this kernel bounds a runner's containers by the runner's `RLIMIT_NPROC` (5.14 and
/// later: `rm_runner::docker::unbounded`).
fn bounded_by_nproc() -> bool {
    rm_runner::docker::unbounded::charged_to_creator(rm_runner::docker::host::running_kernel())
}

/// One Docker test at a time: each fleet's agent writes `/etc/subuid` and `/etc/subgid` by
/// renaming its own version over them, and a test removes its lines the same way at its end;
/// two at once could each drop the other's line.
pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This fleet's runner uids.
pub(crate) fn uids_of(fleet: &Fleet) -> std::ops::RangeInclusive<u32> {
    let (first, last) = fleet.uids.split_once('-').unwrap();
    first.parse().unwrap()..=last.parse().unwrap()
}

/// Waits until nothing of the fleet's attempts is left ([`left_of`]; killed processes are
/// reaped by init, sometimes a moment later), or fails saying what is.
async fn nothing_left(fleet: &Fleet, when: &str) {
    let mut left = Vec::new();
    for _ in 0..50 {
        left = left_of(fleet, &fleet.attempts(), &SubIds::ranges(&uids_of(fleet)));
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{when}, left: {left:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_own_docker_runs_builds_serves_and_reaches_nothing_of_the_host() {
    let _one = ONE_AT_A_TIME.lock().await;
    // A directory of root's, mode 0755, outside what the daemon copies up (`/etc`, `/run`).
    let root_only = tempfile::Builder::new()
        .prefix("rm-e2e-root-only-")
        .tempdir_in(base_dir())
        .unwrap();
    std::fs::set_permissions(root_only.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let device = root_only_device();
    // A host service's socket under `/run` every uid may connect to.
    let unix = crate::isolation::HostSocket::new();
    let below_run = unix
        .path
        .strip_prefix("/run")
        .unwrap()
        .display()
        .to_string();
    let Some(docker) = docker_fleet("docker::a_jobs_own_docker", SCRIPT, |fleet, script| {
        script
            .replace("@ROOT_ONLY@", &root_only.path().display().to_string())
            .replace("@DEVICE@", &device.display().to_string())
            .replace("@UNIX_SOCKET@", &unix.path.display().to_string())
            .replace("@UNIX_SOCKET_BELOW_RUN@", &format!("/{below_run}"))
            .replace("@FORKS@", &FORKS.to_string())
            .replace("@SERVICE_PORT@", &SERVICE_PORT.to_string())
            .replace("@RECEIVER@", &fleet.setup.addr.port().to_string())
    })
    .await
    else {
        return;
    };
    let fleet = &docker.fleet;
    let report = &docker.report;
    let root_only = root_only.path();
    let _marker = Marker(
        std::process::Command::new("sleep")
            .arg(MARKER_SECONDS)
            .spawn()
            .unwrap(),
    );
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 300,
        ..RunnerBehavior::default()
    });
    // What an agent started from a root shell holds: a descriptor on a root-only file, a key
    // in its session keyring, a terminal (`isolation::agent_inherits`).
    let root_only_file = root_only.join("root-only.txt");
    std::fs::write(&root_only_file, "").unwrap();
    std::fs::set_permissions(&root_only_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let _agent = fleet
        .start_agent_with(&[], |command| {
            crate::isolation::agent_inherits(command, &root_only_file)
        })
        .await;

    let run = async |name: &str| {
        let before: Vec<_> = fleet.attempts().into_iter().map(|a| a.attempt_id).collect();
        let job = fleet.fake.queue_job(REPO, name, LABELS).unwrap();
        wait_until(
            Duration::from_secs(120),
            &format!("job {name} done and its attempt cleaned"),
            || fleet.completed(job) && fleet.all_cleaned(),
        )
        .await;
        // The attempt started for it: the only one not there before (which job an attempt
        // took is journalled from GitHub's word, which may come after the job is done).
        let attempt = fleet
            .attempts()
            .into_iter()
            .find(|a| !before.contains(&a.attempt_id))
            .unwrap_or_else(|| panic!("no runner started for job {name}"));
        nothing_left(fleet, &format!("after job {name}")).await;
        attempt
    };
    let first = run("with-docker").await;
    let second = run("with-docker-again").await;
    let text = std::fs::read_to_string(report).unwrap_or_default();
    eprintln!("{text}");

    let one = steps(&text, "first");
    let step = |steps: &BTreeMap<String, (bool, String)>, name: &str| {
        steps
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("no step {name} in the report:\n{text}"))
    };
    let succeeded = |name: &str, needle: &str| {
        let (ok, out) = step(&one, name);
        assert!(ok && out.contains(needle), "step {name}: {out}\n{text}");
    };
    succeeded("docker_host", "unix:///");
    succeeded("preloaded", "sha256:");
    succeeded("import", "sha256:");
    succeeded("run_imported", "hello-from-the-imported-image");
    succeeded("run", "hello-from-a-container");
    succeeded("build", "sha256:");
    succeeded("built", "built-by-the-job");
    succeeded("service", "");
    succeeded("reached", "served-by-the-jobs-service");
    succeeded("job_container", "");
    succeeded("exec", "a-step-in-the-container");
    succeeded("volume", "rm-e2e-volume");
    let (_, running) = step(&one, "running");
    assert_eq!(
        running.split_whitespace().count(),
        2,
        "the service and the job container ran when the first job ended: {running}"
    );

    let two = steps(&text, "second");
    assert_eq!(
        second.uid, first.uid,
        "the second job did not get the first's uid"
    );
    let (_, images_seen) = step(&two, "images");
    assert_eq!(
        images_seen.split_whitespace().collect::<Vec<_>>(),
        [BASE_IMAGE],
        "the second job sees only the preloaded image, none of the first's"
    );
    for name in ["containers", "volumes"] {
        let (ok, out) = step(&two, name);
        assert!(
            ok && out.trim().is_empty(),
            "the second job sees the first's {name}: {out}"
        );
    }
    // Attacks: each refused, or confined to what the runner's uid may do.
    // The daemon's `/etc` is a copy (rootlesskit's `--copy-up`): a write there, refused or
    // not, never reaches the host's.
    let (_, out) = step(&two, "privileged_etc");
    assert!(
        !Path::new("/etc/rm-e2e-pwned").exists(),
        "a privileged container wrote into the host's /etc: {out}"
    );
    let (ok, out) = step(&two, "privileged_root");
    assert!(
        !ok && !root_only.join("pwned").exists(),
        "a privileged container wrote into a directory of root's: {out}"
    );
    let (ok, out) = step(&two, "privileged_own");
    assert!(
        ok && out.contains("written"),
        "the control: the same bind of / writes where the runner's uid may ({out})"
    );
    let (ok, out) = step(&two, "pid_host");
    assert!(
        ok && !out.contains(MARKER_SECONDS) && !out.contains("rm-agent"),
        "--pid=host shows the host's processes: {out}"
    );
    for name in ["net_host", "net_host_gateway"] {
        let (ok, out) = step(&two, name);
        assert!(
            !ok,
            "--net=host reached the agent's receiver on the host's loopback ({name}): {out}"
        );
    }
    let (ok, out) = step(&two, "device");
    assert!(!ok, "a container read {}: {out}", device.display());
    // `/var/run/docker.sock` is the job's own daemon (a link in its empty `/run`), never the
    // host's: it names the runner.
    let (ok, out) = step(&two, "host_socket");
    let (_, own) = step(&two, "daemon_name");
    assert!(
        ok && out.trim() == own.trim(),
        "/var/run/docker.sock is not the job's own daemon ({out}; its own: {own})"
    );
    // Through its own daemon, nothing the agent inherited: the listing works (the tree's
    // sockets are in it) and names no descriptor on the agent's root-only file.
    let (ok, out) = step(&two, "inherited_fd");
    assert!(
        ok && out.contains("socket:") && !out.contains(&root_only_file.display().to_string()),
        "a process of the job's daemon holds the agent's descriptor: {out}"
    );
    // A host service's unix socket under `/run`: neither the runner (its `/run` is its own)
    // nor a container bound to the daemon's `/run` finds it.
    for name in ["unix_socket_runner", "unix_socket_daemon"] {
        let (ok, out) = step(&two, name);
        assert!(!ok, "{name}: the job found the host's socket: {out}");
    }
    // More processes than pids_max, as a container's (its uids subordinate ones): stopped
    // below it, the runner's and the daemon's own counted in.
    let (_, forks) = step(&two, "forks");
    let forks: u32 = forks.trim().parse().unwrap_or(0);
    if bounded_by_nproc() {
        assert!(
            forks > 0 && forks < PIDS_MAX,
            "a container started {forks} of {FORKS} processes under pids_max {PIDS_MAX}"
        );
    } else {
        skip::cannot_run(
            "docker::a_jobs_own_docker (its process bound)",
            "kernel-5.14",
            "this kernel counts a container's subordinate uids on their own",
        );
    }
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for name in ["daemon_name", "uts_host"] {
        let (ok, out) = step(&two, name);
        assert!(
            ok && out.trim().starts_with("rm-") && out.trim() != host_name.trim(),
            "{name} names the host, not the runner: {out}"
        );
    }

    for a in [&first, &second] {
        assert_eq!(a.state, AttemptState::Cleaned, "{a:?}");
        assert_eq!(a.outcome, Some(AttemptOutcome::CompletedJob), "{a:?}");
    }
}

/// The crash test's job: a container left running under the daemon before the runner starts.
const HOLDING_SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." && pwd)
out=$(docker run -d rm-e2e-base sleep 600 2>&1)
printf 'held %s %s\n' "$?" "$out" >> @REPORT@
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

/// The agent SIGKILLed while a runner with its Docker daemon and a container runs, right after
/// the spawn (its pid not yet journalled: recovery cleans the attempt) and once the runner is
/// busy (the next agent adopts it): either way the job is served, and once every attempt is
/// cleaned nothing of the daemon, its containers (subordinate ids) or the runner is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_while_runners_have_docker_leaves_nothing_of_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    rm_e2e::agent_with("fault-injection");
    for point in ["process_spawned", "runner_busy"] {
        let Some(docker) = docker_fleet("docker::an_agent_killed", HOLDING_SCRIPT, |_, s| s).await
        else {
            return;
        };
        let fleet = &docker.fleet;
        fleet.fake.set_runner_behavior(RunnerBehavior {
            job_duration_ms: 3_000,
            ..RunnerBehavior::default()
        });
        let mut first = fleet.start_agent(&[("RM_FAULT_CRASH_AT", point)]).await;
        let job = fleet.fake.queue_job(REPO, point, LABELS).unwrap();
        wait_until(Duration::from_secs(60), "the agent to kill itself", || {
            first.exited()
        })
        .await;
        assert!(
            fleet
                .setup
                .logs()
                .contains(&format!("RM_FAULT_CRASH_AT={point}")),
            "the agent did not reach {point}"
        );
        let _second = fleet.start_agent(&[]).await;
        wait_until(
            Duration::from_secs(120),
            &format!("{point}: the job completed and every attempt cleaned"),
            || fleet.completed(job) && fleet.all_cleaned(),
        )
        .await;
        nothing_left(fleet, &format!("killed at {point}, then recovered")).await;
        let held = std::fs::read_to_string(&docker.report).unwrap_or_default();
        assert!(
            held.lines().any(|l| l.starts_with("held 0 ")),
            "{point}: no job's container ran: {held}"
        );
        assert!(
            fleet.our_registrations().is_empty(),
            "{point}: registration left"
        );
    }
}

/// A runner root Docker cannot serve is refused when `run` starts (issue 38), not found at each
/// launch: under `/tmp`, which each runner's daemon gets an empty tmpfs on, every launch of a
/// `docker = true` policy failed as `process_start_failed`, backing off for minutes. `run`
/// exits 2 naming `host.runner_root`, the reason and the fix, before any runner and before it
/// writes a subordinate range; `check`'s `docker` finding fails in the same words. Needs no
/// Docker tools: the runner root is judged first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_root_under_the_daemon_s_tmpfs_is_refused_at_start() {
    // Another Docker test may write /etc/subuid meanwhile, which this one reads.
    let _one = ONE_AT_A_TIME.lock().await;
    let fleet = Fleet::start(FleetOptions {
        host_max: 1,
        policies: vec![PolicySpec {
            name: "docker",
            target: "acme",
            labels: LABELS,
            max_runners: 1,
            workspace: "ephemeral",
            extra: "docker = true\ndocker_unbounded = [\"memory\"]\n",
        }],
        base_dir: Some(PathBuf::from("/tmp")),
        ..FleetOptions::default()
    })
    .await;
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    let (status, stderr) = fleet.run_agent_until_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let says = [
        "`host.runner_root`",
        "policy `docker`",
        "lies under /tmp",
        "empty tmpfs",
        "choose a host.runner_root outside /run, /tmp, /var/tmp, /dev/shm",
    ];
    for words in says {
        assert!(stderr.contains(words), "{words}: {stderr}");
    }
    assert!(fleet.attempts().is_empty(), "a runner was started");
    assert_eq!(
        std::fs::read_to_string("/etc/subuid").unwrap_or_default(),
        subuid,
        "a subordinate range was written"
    );

    let mut command = fleet.setup.command(&["check", "--json"]);
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed: Vec<&serde_json::Value> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "docker" && f["status"] == "fail")
        .filter(|f| {
            f["what"]
                .as_str()
                .is_some_and(|w| w.contains("host.runner_root"))
        })
        .collect();
    assert_eq!(out.status.code(), Some(1), "{doc}");
    assert_eq!(failed.len(), 1, "{doc}");
    for words in &says[1..] {
        assert!(
            failed[0]["what"].as_str().unwrap().contains(words),
            "{words}: {doc}"
        );
    }
}
