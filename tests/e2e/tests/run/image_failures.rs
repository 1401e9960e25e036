//! Job images (issue 40) that go wrong, through `rm-agent run`; each test checks what is left
//! on disk (the store under `<data_dir>/images`, the host's files) and in the kernel (mounts,
//! processes, cgroups, runtimes).
//!
//! - A layer with one byte flipped refuses the start before any runner, naming the layer; the
//!   store holds nothing of it and no runner was registered.
//! - Hostile layers (every `job_image::Hostile` kind) refuse the start, at unpack (a name that
//!   climbs out or is absolute) or at the fitness check (the hostile base has no libc); what
//!   the store kept of them is neutralised (no device node, no setuid bit, an escaping link's
//!   file inside the image's root), and nothing reached the host.
//! - An agent SIGKILLed while it unpacks a large image leaves a staging directory and no
//!   entry; the next start removes the staging directory, installs the image whole and runs a
//!   job in it.
//! - An agent SIGKILLed right after a runner in an image started (or was spawned): the next
//!   agent recovers the job and leaves no mount, process, cgroup or runtime.
//! - A `docker://` image from a real registry (Debian's `docker-registry`, basic auth): a job
//!   runs in it with the right credentials and the password is never logged; a wrong password
//!   refuses the start naming the registry and no password.
//! - A Docker Hub image (`docker://rm-e2e-ci:1`) with `docker_registry_mirror` set comes from
//!   the mirror (a real `docker-registry`, anonymous): a job runs in it, the mirror's access log
//!   shows the agent's manifest and blob GETs. With no mirror listening (and no Docker Hub from
//!   here) the start is refused naming the mirror and Docker Hub's failure; nothing is stored.

use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rm_e2e::Agent;
use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState};

use crate::isolation::{base_dir, names_with_prefix, processes};
use crate::job_image::{self, Hostile};
use crate::skip;

const LABELS: &[&str] = &["self-hosted", "imaged"];

/// The policy's name in every fleet here.
const POLICY: &str = "imaged";

/// How long a refused start may take (a bound, not a measurement: it installs a small image).
const REFUSAL_WAIT: Duration = Duration::from_secs(120);

/// How long an agent may take to become healthy when its start installs a large image.
const LARGE_START_WAIT: Duration = Duration::from_secs(600);

/// The size of the large image's padding layer: big enough that its unpack lasts long enough
/// (here, seconds) for the test to see the staging directory and kill the agent in it.
const LARGE_PADDING: u64 = 512 << 20;

/// The store's staging directories' prefix (rm_image::store).
const STAGING_PREFIX: &str = ".staging-";

/// The report's name in the runner's `_diag` (kept by the agent after the runtime is gone).
const REPORT: &str = "rm-image-failures-report.txt";

/// The job of the registry test: writes the image's marker into `_diag`, then runs the fake
/// runner. `@...@` are replaced.
const SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$HERE/_diag"
printf 'marker=%s\n' "$(cat /@MARKER_FILE@ 2>/dev/null)" > "$HERE/_diag/@REPORT@"
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

/// Whether this host can make the test images; records the skip when not.
fn can_run(test: &str) -> bool {
    if let Some((tool, why)) = job_image::missing_tool() {
        skip::cannot_run(test, tool, &why);
        return false;
    }
    true
}

/// A fleet of one policy whose extra lines are `extra` (its `image = ...`), under user
/// isolation with a private network, in a setup outside the runners' private directories.
fn options(extra: &str) -> FleetOptions {
    FleetOptions {
        host_max: 1,
        policies: vec![PolicySpec {
            name: POLICY,
            target: "acme",
            labels: LABELS,
            max_runners: 1,
            workspace: "ephemeral",
            extra: Box::leak(extra.to_owned().into_boxed_str()),
        }],
        isolation: Some("user"),
        host_extra: "network = \"private\"\n".to_owned(),
        base_dir: Some(base_dir()),
        ..FleetOptions::default()
    }
}

/// `image = "oci:<layout>:<tag>@<manifest>"`.
fn oci_image(layout: &Path, tag: &str, manifest: &str) -> String {
    format!("image = \"oci:{}:{tag}@{manifest}\"\n", layout.display())
}

/// A directory for layouts in the setup (root's: the agent refuses an image a job could
/// change).
fn layouts_dir(fleet: &Fleet) -> PathBuf {
    let dir = fleet.setup.dir.path().join("layouts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// The image store of the fleet's agent.
fn store(fleet: &Fleet) -> PathBuf {
    fleet.setup.dir.path().join("data").join("images")
}

/// The store's entry of an image (`sha256:<hex>` → `<store>/<hex>`).
fn entry(fleet: &Fleet, id: &str) -> PathBuf {
    store(fleet).join(id.trim_start_matches("sha256:"))
}

/// The names in the store that are entries or leftovers (the registry's downloads excluded).
fn store_names(fleet: &Fleet) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store(fleet))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".downloads")
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The store's staging directories.
fn staging(fleet: &Fleet) -> Vec<String> {
    names_with_prefix(&store(fleet), STAGING_PREFIX)
}

/// Every path below `dir` (itself excluded), links not followed, with its metadata.
fn walk(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path.clone());
            }
            found.push((path, meta));
        }
    }
    found
}

/// Starts `rm-agent run` with `env` (debug log to a file of the setup) without waiting for it.
fn spawn_agent(fleet: &Fleet, env: &[(&str, &str)]) -> Agent {
    let log = std::fs::File::create(fleet.setup.dir.path().join(format!(
        "agent-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )))
    .unwrap();
    let mut command = fleet.setup.command(&["run"]);
    command
        .env("RM_LOG", "debug")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log);
    Agent::spawn(command, fleet.setup.addr)
}

/// What is left of the fleet's runners on this host ([`crate::docker::left_of`]: processes of
/// its runner uids, mounts naming the runner root or an image root, network namespaces, veths,
/// cgroups, runtimes), given a moment for killed processes to be reaped.
async fn left_of(fleet: &Fleet, attempts: &[AttemptRecord]) -> Vec<String> {
    let mut left = Vec::new();
    for _ in 0..150 {
        left = crate::docker::left_of(fleet, attempts, &[]);
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    left
}

/// Queues a job, waits until it completed and every attempt is cleaned; its attempt.
async fn run_one_job(fleet: &Fleet, name: &str) -> AttemptRecord {
    let job = fleet.fake.queue_job(REPO, name, LABELS).unwrap();
    wait_until(
        Duration::from_secs(180),
        &format!("job {name} done and its attempt cleaned"),
        || fleet.completed(job) && fleet.all_cleaned(),
    )
    .await;
    let served_by = fleet.fake.job(job).unwrap().runner_name;
    fleet
        .attempts()
        .into_iter()
        .find(|a| Some(&a.runner_name) == served_by.as_ref())
        .unwrap_or_else(|| panic!("no attempt served job {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_with_a_flipped_byte_refuses_the_start_and_leaves_nothing() {
    let test = "image_failures::a_layer_with_a_flipped_byte_refuses_the_start_and_leaves_nothing";
    if !can_run(test) {
        return;
    }
    let image = job_image::debian_image();
    let fleet = Fleet::start(options("")).await;
    let layout = layouts_dir(&fleet).join("corrupt");
    job_image::copy_layout(&image.layout, &layout);
    let layer = job_image::corrupt_one_byte(&layout, image.tag, 0);
    fleet.configure(&options(&oci_image(
        &layout,
        image.tag,
        &image.info.manifest_digest,
    )));

    let (status, stderr) = fleet.run_agent_until_exit(REFUSAL_WAIT).await;
    eprintln!("{status}: {stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&layer),
        "the message names {layer}: {stderr}"
    );
    assert!(
        stderr.contains(POLICY),
        "the message names the policy: {stderr}"
    );
    // Nothing of it in the store, no runner registered or journalled.
    assert_eq!(store_names(&fleet), Vec::<String>::new());
    assert_eq!(fleet.jit_requests(), 0);
    assert!(fleet.attempts().is_empty(), "{:?}", fleet.attempts());
    assert!(fleet.runtimes().is_empty(), "{:?}", fleet.runtimes());
}

/// What one hostile kind did.
struct Outcome {
    kind: Hostile,
    image: job_image::HostileImage,
    code: Option<i32>,
    stderr: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_layers_are_refused_or_neutralised_and_the_host_is_untouched() {
    let test =
        "image_failures::hostile_layers_are_refused_or_neutralised_and_the_host_is_untouched";
    if !can_run(test) {
        return;
    }
    let fleet = Fleet::start(options("")).await;
    let layouts = layouts_dir(&fleet);
    let hostname_before = std::fs::read("/etc/hostname").ok();
    let hostname_id = std::fs::metadata("/etc/hostname")
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let mut outcomes = Vec::new();
    for kind in Hostile::ALL {
        let layout = layouts.join(format!("{kind:?}"));
        let image = job_image::hostile_layout(kind, &layout, "hostile");
        fleet.configure(&options(&oci_image(
            &layout,
            "hostile",
            &image.info.manifest_digest,
        )));
        let (status, stderr) = fleet.run_agent_until_exit(REFUSAL_WAIT).await;
        eprintln!("{kind:?}: {status}: {stderr}");
        outcomes.push(Outcome {
            kind,
            image,
            code: status.code(),
            stderr,
        });
    }

    let mut summary = Vec::new();
    for Outcome {
        kind,
        image,
        code,
        stderr,
    } in &outcomes
    {
        let dir = entry(&fleet, &image.info.config_digest);
        let rootfs = dir.join("rootfs");
        let stored = dir.exists();
        summary.push(format!("{kind:?}: exit {code:?}, stored {stored}"));
        // The host: no escaped file.
        if let Some(escape) = &image.host_escape {
            assert!(
                !escape.exists(),
                "{kind:?} wrote {} on the host",
                escape.display()
            );
        }
        match kind {
            // Refused at unpack, naming the entry; nothing stored.
            Hostile::PathTraversal | Hostile::AbsolutePath => {
                assert_eq!(*code, Some(1), "{kind:?}: {stderr}");
                let name = image.host_escape.as_ref().unwrap().file_name().unwrap();
                // Once: the cause is not said again by the error chain.
                assert_eq!(
                    stderr.matches(name.to_str().unwrap()).count(),
                    1,
                    "{kind:?}: the message names the entry {} once: {stderr}",
                    image.entry
                );
                assert!(!stored, "{kind:?} left {}", dir.display());
            }
            // A device node and setuid bits are neutralised, not refused: the image is
            // installed, then refused as unfit (no libc in the hostile base).
            Hostile::DeviceNode | Hostile::Setuid => {
                assert!(stored, "{kind:?} was not installed neutralised: {stderr}");
                assert_eq!(*code, Some(2), "{kind:?}: {stderr}");
                assert!(
                    stderr.contains("cannot run the runner"),
                    "{kind:?}: refused as unfit: {stderr}"
                );
            }
            // An escaping link: its file lands in the image (installed, then refused as unfit)
            // or the entry is refused at unpack with nothing stored.
            _ => {
                if stored {
                    assert_eq!(*code, Some(2), "{kind:?}: {stderr}");
                    assert!(
                        stderr.contains("cannot run the runner"),
                        "{kind:?}: refused as unfit: {stderr}"
                    );
                } else {
                    assert_eq!(*code, Some(1), "{kind:?}: {stderr}");
                }
            }
        }
        if !stored {
            continue;
        }
        let report = std::fs::read_to_string(dir.join("unpack.json")).unwrap();
        let files = walk(&store(&fleet));
        match kind {
            Hostile::AbsoluteSymlinkEscape | Hostile::RelativeSymlinkEscape => {
                let name = image.host_escape.as_ref().unwrap().file_name().unwrap();
                let landed: Vec<&PathBuf> = files
                    .iter()
                    .filter(|(p, _)| p.file_name() == Some(name))
                    .map(|(p, _)| p)
                    .collect();
                for path in &landed {
                    assert!(
                        path.starts_with(&rootfs),
                        "{kind:?}: {} is outside the image's root",
                        path.display()
                    );
                }
                summary.push(format!("  the escaping file landed at {landed:?}"));
            }
            Hostile::HardLinkEscape => {
                if let Some(host) = hostname_id {
                    let shared: Vec<&PathBuf> = files
                        .iter()
                        .filter(|(_, m)| (m.dev(), m.ino()) == host)
                        .map(|(p, _)| p)
                        .collect();
                    assert!(
                        shared.is_empty(),
                        "{kind:?}: {shared:?} is the host's /etc/hostname"
                    );
                }
            }
            Hostile::DeviceNode => {
                let node = rootfs.join(&image.entry);
                let made = std::fs::symlink_metadata(&node).ok();
                assert!(
                    !made.as_ref().is_some_and(
                        |m| m.file_type().is_char_device() || m.file_type().is_block_device()
                    ),
                    "{kind:?}: {} is a device node",
                    node.display()
                );
                assert!(
                    files.iter().all(|(_, m)| !m.file_type().is_char_device()
                        && !m.file_type().is_block_device()),
                    "{kind:?}: a device node in the store"
                );
                assert!(
                    report.contains(&image.entry),
                    "{kind:?}: unpack.json lists {}: {report}",
                    image.entry
                );
            }
            Hostile::Setuid => {
                for name in ["bin/rm-setuid", "bin/rm-setgid"] {
                    let mode = std::fs::metadata(rootfs.join(name)).unwrap().mode();
                    assert_eq!(mode & 0o6000, 0, "{kind:?}: {name} is mode {mode:o}");
                    assert!(report.contains(name), "unpack.json lists {name}: {report}");
                }
            }
            Hostile::PathTraversal | Hostile::AbsolutePath => {}
        }
    }
    eprintln!("{}", summary.join("\n"));
    // The host's file a hard link named is as it was; no start left a staging directory, and
    // none got so far as a runner.
    assert_eq!(std::fs::read("/etc/hostname").ok(), hostname_before);
    assert_eq!(staging(&fleet), Vec::<String>::new());
    assert_eq!(fleet.jit_requests(), 0);
    assert!(fleet.attempts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_unpack_leaves_no_entry_and_the_next_installs_it_whole() {
    let test =
        "image_failures::an_agent_killed_mid_unpack_leaves_no_entry_and_the_next_installs_it_whole";
    if !can_run(test) {
        return;
    }
    let image = job_image::padded_image(LARGE_PADDING);
    let fleet = Fleet::start(options(&oci_image(
        &image.layout,
        image.tag,
        &image.info.manifest_digest,
    )))
    .await;
    let id = &image.info.config_digest;

    // The first agent: killed once the padding layer is being written into the staging
    // directory (its file there, not yet whole).
    let started = Instant::now();
    let mut first = spawn_agent(&fleet, &[]);
    let mut to_staging = None;
    let (staged, partial) = loop {
        assert!(
            !first.exited(),
            "the agent exited before it unpacked the image\n{}",
            fleet.setup.logs()
        );
        assert!(
            started.elapsed() < LARGE_START_WAIT,
            "no staging directory with the padding appeared"
        );
        assert!(
            !entry(&fleet, id).exists(),
            "the image was installed before the test saw it unpacked: raise LARGE_PADDING"
        );
        if let Some(name) = staging(&fleet).first() {
            to_staging.get_or_insert_with(|| started.elapsed());
            let padding = store(&fleet).join(name).join("rootfs/rm-padding");
            if let Ok(meta) = std::fs::metadata(&padding)
                && meta.len() > 0
            {
                break (name.clone(), meta.len());
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let at_kill = started.elapsed();
    first.kill();
    let seen = vec![staged.clone()];
    let staged = store(&fleet).join(&staged);
    let after_kill = std::fs::metadata(staged.join("rootfs/rm-padding")).map_or(0, |m| m.len());
    eprintln!(
        "{} seen after {to_staging:?}, killed after {at_kill:?} with {partial} (at the kill \
         {after_kill}) of {LARGE_PADDING} padding bytes unpacked",
        staged.display()
    );
    assert!(
        after_kill < LARGE_PADDING,
        "the padding was whole at the kill: raise LARGE_PADDING"
    );
    assert!(staged.exists(), "the SIGKILLed agent's staging directory");
    assert!(
        !entry(&fleet, id).exists(),
        "a complete entry after the kill"
    );
    assert_eq!(
        store_names(&fleet),
        seen,
        "the staging directory alone is in the store"
    );

    // The next: the leftover removed, the image installed whole, a job run in it.
    let restarted = Instant::now();
    let mut second = spawn_agent(&fleet, &[]);
    if let Err(why) = second.healthy_within(LARGE_START_WAIT).await {
        panic!("rm-agent run {why}\n{}", fleet.setup.failure_report());
    }
    eprintln!(
        "the restarted agent installed the image and was healthy after {:?}",
        restarted.elapsed()
    );
    assert!(!staged.exists(), "{} left", staged.display());
    assert_eq!(staging(&fleet), Vec::<String>::new());
    let padding = entry(&fleet, id).join("rootfs/rm-padding");
    assert_eq!(
        std::fs::metadata(&padding).map(|m| m.len()).ok(),
        Some(LARGE_PADDING),
        "{}",
        padding.display()
    );
    let attempt = run_one_job(&fleet, "in-the-large-image").await;
    assert_eq!(attempt.outcome, Some(AttemptOutcome::CompletedJob));
    assert_eq!(attempt.image.as_deref(), Some(id.as_str()));
    let left = left_of(&fleet, &fleet.attempts()).await;
    assert!(left.is_empty(), "left: {left:#?}");
}

/// The processes of the fleet's runner uids whose root is the image (its marker file there
/// reads `marker`).
fn processes_in_image(fleet: &Fleet, marker: &str) -> Vec<u32> {
    let (first, last) = fleet.uids.split_once('-').unwrap();
    let uids: std::ops::RangeInclusive<u32> = first.parse().unwrap()..=last.parse().unwrap();
    processes()
        .into_iter()
        .filter(|p| !p.zombie() && p.uids.iter().any(|u| uids.contains(u)))
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{}/root/{}", p.pid, job_image::MARKER_FILE))
                .is_ok_and(|m| m == marker)
        })
        .map(|p| p.pid)
        .collect()
}

/// The agent kills itself at `point` of a runner's start in the image; the next agent recovers
/// the job, and nothing of the runner is left.
async fn crash_in_an_image(test: &str, point: &str) {
    if !can_run(test) {
        return;
    }
    rm_e2e::agent_with("fault-injection");
    let image = job_image::debian_image();
    let fleet = Fleet::start(options(&oci_image(
        &image.layout,
        image.tag,
        &image.info.manifest_digest,
    )))
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_500,
        ..RunnerBehavior::default()
    });
    let mut first = fleet.start_agent(&[("RM_FAULT_CRASH_AT", point)]).await;
    let job = fleet.fake.queue_job(REPO, "crashed", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "the agent to kill itself", || {
        first.exited()
    })
    .await;
    assert!(
        fleet
            .setup
            .logs()
            .contains(&format!("RM_FAULT_CRASH_AT={point}")),
        "the agent did not reach {point}\n{}",
        fleet.setup.failure_report()
    );
    // The runner outlives the agent (its own session and cgroup); once it started, it runs
    // in the image: a process of the runner uids whose root holds the image's marker.
    let crashed = fleet.attempts();
    let live: Vec<u32> = crashed
        .iter()
        .filter_map(|a| a.pid)
        .filter(|pid| Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    let in_image = processes_in_image(&fleet, &image.info.marker);
    eprintln!(
        "{point}: {} attempt(s) after the crash, live journalled runner pids {live:?}, runner \
         processes in the image {in_image:?}",
        crashed.len()
    );
    if point == "runner_started" {
        assert!(
            !in_image.is_empty(),
            "no runner process in the image after the crash"
        );
    }

    let _second = fleet.start_agent(&[]).await;
    wait_until(
        Duration::from_secs(120),
        "the job completed and every attempt cleaned",
        || fleet.completed(job) && fleet.all_cleaned(),
    )
    .await;
    let attempts = fleet.attempts();
    let summary: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "{} {} {:?} {:?} image={:?}",
                a.attempt_id.short(),
                a.state.as_str(),
                a.outcome,
                a.reason,
                a.image
            )
        })
        .collect();
    eprintln!("{point}: {summary:#?}");
    assert!(
        attempts.iter().all(|a| a.state == AttemptState::Cleaned),
        "{summary:?}"
    );
    assert_eq!(
        attempts
            .iter()
            .filter(|a| a.outcome == Some(AttemptOutcome::CompletedJob))
            .count(),
        1,
        "one runner completed the job: {summary:?}"
    );
    assert!(
        attempts
            .iter()
            .all(|a| a.image.as_deref() == Some(image.info.config_digest.as_str())),
        "every attempt ran the image: {summary:?}"
    );
    for pid in live.iter().chain(&in_image) {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .is_ok_and(|s| s.contains("State:\tZ")),
            "the crashed agent's runner {pid} is still there"
        );
    }
    let left = left_of(&fleet, &attempts).await;
    assert!(left.is_empty(), "left: {left:#?}");
    assert!(fleet.our_registrations().is_empty(), "registration left");
    // The store keeps the image (the policy's current one), complete.
    assert!(
        entry(&fleet, &image.info.config_digest)
            .join("rootfs")
            .join(job_image::MARKER_FILE)
            .exists()
    );
    assert_eq!(staging(&fleet), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_after_a_runner_in_an_image_started_leaves_nothing() {
    crash_in_an_image(
        "image_failures::an_agent_killed_after_a_runner_in_an_image_started_leaves_nothing",
        "runner_started",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_after_a_runner_in_an_image_was_spawned_leaves_nothing() {
    crash_in_an_image(
        "image_failures::an_agent_killed_after_a_runner_in_an_image_was_spawned_leaves_nothing",
        "process_spawned",
    )
    .await;
}

/// How long the registry may take to listen (polled; a bound, not a measurement).
const REGISTRY_START_WAIT: Duration = Duration::from_secs(20);

/// Debian's `docker-registry` on a free loopback port, storage in a temporary directory,
/// htpasswd basic auth for one user or none; killed on drop.
struct Registry {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Started with basic auth for `auth`'s `(user, password)`, or anonymous when `None`.
    fn start(auth: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: test-only\n",
            dir.path().join("data").display(),
        );
        if let Some((user, password)) = auth {
            let htpasswd = dir.path().join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .output()
                .unwrap();
            assert!(out.status.success(), "htpasswd: {out:?}");
            std::fs::write(&htpasswd, &out.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: basic-realm\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = dir.path().join("registry.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let mut registry = Registry {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + REGISTRY_START_WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = registry.child.try_wait() {
                panic!("docker-registry exited ({status}): {}", registry.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen: {}",
                registry.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log_text(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

/// A loopback port nothing listened on a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// Pushes the Debian test image to `reference` (a `docker://` one on `registry`) with skopeo,
/// with `creds` (`user:password`) when given.
fn push(image: &job_image::DebianImage, registry: &Registry, reference: &str, creds: Option<&str>) {
    let mut command = Command::new("skopeo");
    command.args([
        "--insecure-policy",
        "copy",
        "--quiet",
        "--dest-tls-verify=false",
    ]);
    if let Some(creds) = creds {
        command.arg(format!("--dest-creds={creds}"));
    }
    let out = command
        .arg(format!("oci:{}:{}", image.layout.display(), image.tag))
        .arg(reference)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo copy: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        registry.log_text()
    );
}

/// Whether `tool` is on the PATH.
fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether every `(tool, package)` is installed; records the skip of the first that is not.
fn tools_installed(test: &str, tools: &[(&str, &str)]) -> bool {
    for (tool, package) in tools {
        if !installed(tool) {
            skip::cannot_run(
                test,
                tool,
                &format!("`{tool}` is not installed (apt-get install {package})"),
            );
            return false;
        }
    }
    true
}

/// Runs one job under the fleet's agent (its listener wrapped in [`SCRIPT`]) and checks that
/// it ran in `image`, pushed to a registry: the marker its job wrote to the kept report, the
/// attempt's image (the config digest), the store's entry. Its attempt.
async fn run_in_pushed_image(
    fleet: &Fleet,
    image: &job_image::DebianImage,
    name: &str,
) -> AttemptRecord {
    let attempt = run_one_job(fleet, name).await;
    let report_path = fleet
        .setup
        .dir
        .path()
        .join("data/logs")
        .join(attempt.attempt_id.as_str())
        .join(REPORT);
    let report = std::fs::read_to_string(&report_path).unwrap_or_else(|e| {
        panic!(
            "no report at {} ({e})\n{}",
            report_path.display(),
            fleet.setup.logs()
        )
    });
    assert_eq!(
        report.trim(),
        format!("marker={}", image.info.marker),
        "the job ran in the pushed image"
    );
    assert_eq!(attempt.outcome, Some(AttemptOutcome::CompletedJob));
    assert_eq!(
        attempt.image.as_deref(),
        Some(image.info.config_digest.as_str())
    );
    assert!(entry(fleet, &image.info.config_digest).exists());
    attempt
}

/// Writes `user:password` to `path`, mode 0600.
fn credentials_file(path: &Path, user: &str, password: &str) {
    std::fs::write(path, format!("{user}:{password}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_image_with_basic_auth_runs_a_job_and_no_password_is_logged() {
    let test =
        "image_failures::a_registry_image_with_basic_auth_runs_a_job_and_no_password_is_logged";
    if !can_run(test) {
        return;
    }
    if !tools_installed(
        test,
        &[
            ("docker-registry", "docker-registry"),
            ("htpasswd", "apache2-utils"),
        ],
    ) {
        return;
    }
    let image = job_image::debian_image();
    let user = "ci-bot";
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let wrong = format!("wrong-{}", uuid::Uuid::new_v4().simple());
    let registry = Registry::start(Some((user, &password)));
    let reference = format!("docker://{}/acme/ci:1", registry.address());
    push(
        &image,
        &registry,
        &reference,
        Some(&format!("{user}:{password}")),
    );

    let fleet = Fleet::start(options("")).await;
    let secrets = layouts_dir(&fleet);
    let right_file = secrets.join("registry-credentials");
    let wrong_file = secrets.join("wrong-credentials");
    credentials_file(&right_file, user, &password);
    credentials_file(&wrong_file, user, &wrong);
    let policy = |file: &Path| {
        options(&format!(
            "image = \"{reference}\"\nimage_credentials_file = \"{}\"\n",
            file.display()
        ))
    };

    // A wrong password: refused, naming the registry, never a password.
    fleet.configure(&policy(&wrong_file));
    let (status, stderr) = fleet.run_agent_until_exit(REFUSAL_WAIT).await;
    eprintln!("wrong password: {status}: {stderr}");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&registry.address()),
        "the message names the registry: {stderr}"
    );
    assert!(
        !stderr.contains(&wrong) && !stderr.contains(&password),
        "{stderr}"
    );
    assert_eq!(fleet.jit_requests(), 0);
    assert_eq!(store_names(&fleet), Vec::<String>::new());

    // The right one: a job runs in the image.
    fleet.configure(&policy(&right_file));
    fleet.wrap_listener(
        &SCRIPT
            .replace("@REPORT@", REPORT)
            .replace("@MARKER_FILE@", job_image::MARKER_FILE),
    );
    let _agent = fleet.start_agent(&[]).await;
    run_in_pushed_image(&fleet, &image, "from-the-registry").await;

    // Neither password in anything the agent wrote: its logs (debug), its journal.
    let logs = fleet.setup.logs();
    assert!(
        logs.contains(&registry.address()),
        "the logs name the registry"
    );
    for secret in [&password, &wrong] {
        assert!(
            !logs.contains(secret.as_str()),
            "a password in the agent's log"
        );
        let journal = String::from_utf8_lossy(&fleet.journal_bytes()).into_owned();
        assert!(
            !journal.contains(secret.as_str()),
            "a password in the journal"
        );
    }
    let left = left_of(&fleet, &fleet.attempts()).await;
    assert!(left.is_empty(), "left: {left:#?}");
}

/// The Docker Hub name of the mirror test's image (`docker.io/library/rm-e2e-ci:1`), and its
/// repository as the mirror serves it.
const HUB_IMAGE: &str = "docker://rm-e2e-ci:1";
const HUB_REPOSITORY: &str = "library/rm-e2e-ci";
const HUB_IMAGE_NORMALISED: &str = "docker://docker.io/library/rm-e2e-ci:1";

/// The registry client's warning when the mirror failed and Docker Hub is asked next.
const MIRROR_FAILED: &str = "the registry mirror failed; asking the registry itself";

/// The agent's User-Agent (rm_image's registry client): tells its requests in a registry's
/// access log from skopeo's.
const AGENT_USER_AGENT: &str = "rm-image/";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_hub_image_comes_through_the_registry_mirror() {
    let test = "image_failures::a_docker_hub_image_comes_through_the_registry_mirror";
    if !can_run(test) || !tools_installed(test, &[("docker-registry", "docker-registry")]) {
        return;
    }
    let image = job_image::debian_image();
    // `docker = true` is not set: the mirror is the image's alone.
    let policy = |port: u16| {
        options(&format!(
            "image = \"{HUB_IMAGE}\"\ndocker_registry_mirror = \"http://127.0.0.1:{port}\"\n"
        ))
    };
    let fleet = Fleet::start(options("")).await;

    // No mirror on its port, and no Docker Hub from here: refused, naming both; nothing
    // stored, no runner.
    let dead = free_port();
    fleet.configure(&policy(dead));
    let (status, stderr) = fleet.run_agent_until_exit(REFUSAL_WAIT).await;
    eprintln!("no mirror: {status}: {stderr}");
    assert_eq!(status.code(), Some(1), "{stderr}");
    // The mirror's failure is a warning (Docker's rule: Docker Hub is asked next); the refusal
    // is Docker Hub's failure.
    assert!(
        stderr.contains(&format!("cannot reach the mirror http://127.0.0.1:{dead}")),
        "the output names the mirror's failure: {stderr}"
    );
    let refusal = stderr
        .lines()
        .find(|l| l.starts_with("rm-agent: "))
        .unwrap_or_else(|| panic!("no refusal: {stderr}"));
    assert!(
        refusal.contains(HUB_IMAGE_NORMALISED)
            && refusal.contains("cannot reach docker.io")
            && refusal.contains(&format!("cannot reach the mirror http://127.0.0.1:{dead}")),
        "the refusal names the image, Docker Hub's failure and the mirror's: {refusal}"
    );
    assert!(
        refusal.contains(POLICY),
        "the refusal names the policy: {refusal}"
    );
    assert_eq!(store_names(&fleet), Vec::<String>::new());
    let downloaded: Vec<PathBuf> = walk(&store(&fleet).join(".downloads"))
        .into_iter()
        .filter(|(_, meta)| !meta.is_dir())
        .map(|(path, _)| path)
        .collect();
    assert_eq!(downloaded, Vec::<PathBuf>::new(), "downloaded files");
    assert_eq!(fleet.jit_requests(), 0);
    assert!(fleet.attempts().is_empty(), "{:?}", fleet.attempts());

    // The mirror holds the image under Docker Hub's name: the job runs in it.
    let mirror = Registry::start(None);
    push(
        &image,
        &mirror,
        &format!("docker://{}/{HUB_REPOSITORY}:1", mirror.address()),
        None,
    );
    fleet.configure(&policy(mirror.port));
    fleet.wrap_listener(
        &SCRIPT
            .replace("@REPORT@", REPORT)
            .replace("@MARKER_FILE@", job_image::MARKER_FILE),
    );
    let _agent = fleet.start_agent(&[]).await;
    run_in_pushed_image(&fleet, &image, "through-the-mirror").await;

    // The mirror served the manifest and every blob to the agent; the agent never went on to
    // Docker Hub.
    let access = mirror.log_text();
    let served: Vec<&str> = access
        .lines()
        .filter(|l| l.contains(AGENT_USER_AGENT) && l.contains("\"GET /v2/"))
        .collect();
    eprintln!("the mirror served the agent: {served:#?}");
    let got = |path: &str| {
        served.iter().any(|l| {
            l.contains(&format!(
                "\"GET /v2/{HUB_REPOSITORY}/{path} HTTP/1.1\" 200 "
            ))
        })
    };
    assert!(got("manifests/1"), "no manifest GET: {served:#?}");
    for blob in std::iter::once(&image.info.config_digest).chain(&image.info.layers) {
        assert!(
            got(&format!("blobs/{blob}")),
            "no GET of {blob}: {served:#?}"
        );
    }
    // The refused start's warning is the only one in the logs.
    let logs = fleet.setup.logs();
    assert_eq!(
        logs.matches(MIRROR_FAILED).count(),
        stderr.matches(MIRROR_FAILED).count(),
        "the agent went past the mirror: {logs}"
    );
    let left = left_of(&fleet, &fleet.attempts()).await;
    assert!(left.is_empty(), "left: {left:#?}");
}
