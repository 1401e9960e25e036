//! Job images (issue 40) through `rm-agent run`: a policy whose `image` is a small Debian root
//! made in the test from Debian packages (`job_image`, never a pull), pinned by digest.
//!
//! - Its job runs in the image: it reads the image's marker file, gets the image's `PATH` (and
//!   none of its `RM_` variables, nor its `USER` or `WORKDIR`), its uid is named `runner`, and
//!   it finds none of what the test planted on the host under `/etc`, `/opt` and `/home`, nor
//!   the agent's data directory, nor a host program the image lacks. The same job on a policy
//!   without an image (the control) finds every one of them.
//! - What the first job wrote into the image's tree is not there for the next; the store's copy
//!   is untouched; the job's Docker (`docker = true`) works from inside the image.
//! - Each attempt journals the image it ran, and `explain JOB` names it; nothing of the runners
//!   is left (no mount, no process, no runtime).
//!
//! The job is the package's `bin/Runner.Listener`, wrapped (`Fleet::wrap_listener`): a POSIX sh
//! script run by the image's `/bin/sh`, which writes its report into the runner's `_diag` (kept
//! by the agent after the runtime is gone: the only place of the host a job in an image writes
//! to that the test can read) and then `exec`s the fake runner, which the image's libc runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::AttemptRecord;

use crate::isolation::base_dir;
use crate::job_image;
use crate::skip;

const IMAGED: &[&str] = &["self-hosted", "imaged"];
const HOST_ROOT: &[&str] = &["self-hosted", "hostroot"];

/// The report's name in the runner's `_diag`.
const REPORT: &str = "rm-image-report.txt";

/// A host program the image lacks (the image has busybox, libc and the Docker CLI).
const HOST_ONLY_PROGRAM: &str = "/usr/bin/gcc";

/// The job: what it sees, then the fake runner. `@...@` are replaced.
const SCRIPT: &str = r#"#!/bin/sh
START=$(pwd)
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$HERE/_diag"
R="$HERE/_diag/@REPORT@"
say() { printf '%s=%s\n' "$1" "$(printf '%s' "$2" | tr '\n' ' ')" >> "$R"; }
seen() { if [ -e "$2" ]; then say "$1" seen; else say "$1" absent; fi; }
say marker "$(cat /@MARKER_FILE@ 2>/dev/null)"
say user "$(id -un 2>&1)"
say path "$PATH"
say image_rm_env "${RM_IMAGE_ENV:-unset}"
say start "$START"
seen host_etc "@HOST_ETC@"
seen host_opt "@HOST_OPT@"
seen host_home "@HOST_HOME@"
seen data_dir "@DATA_DIR@"
seen host_program "@HOST_PROGRAM@"
seen left /@SCRATCH@/left
if echo "$$" > /@SCRATCH@/left 2>/dev/null; then say scratch_write ok; else say scratch_write denied; fi
if touch /etc/rm-e2e-written 2>/dev/null; then say etc_write ok; else say etc_write denied; fi
if [ -n "$DOCKER_HOST" ]; then
    say docker "$(docker run --rm @BASE_IMAGE@ echo from-a-container 2>&1)"
    say docker_socket "$(docker -H unix:///var/run/docker.sock info --format '{{.Name}}' 2>&1)"
fi
say done yes
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

/// Files the test plants on the host, world-readable, removed on drop.
struct Planted(Vec<PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// `key=value` lines of a report.
fn field<'r>(report: &'r str, key: &str) -> &'r str {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in the report:\n{report}"))
}

/// The report the job of `attempt` left in its `_diag`, as the agent kept it.
fn kept_report(fleet: &Fleet, attempt: &AttemptRecord) -> String {
    let path = fleet
        .setup
        .dir
        .path()
        .join("data/logs")
        .join(attempt.attempt_id.as_str())
        .join(REPORT);
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "no report at {} ({e})\n{}",
            path.display(),
            fleet.setup.logs()
        )
    })
}

/// Whether this host can run the test; records the skip when not.
fn can_run(test: &str) -> bool {
    if let Some((tool, why)) = job_image::missing_tool() {
        skip::cannot_run(test, tool, &why);
        return false;
    }
    true
}

/// Mounts whose source or target names `needle`, from this process's view (the host's).
fn mounts_naming(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_in_its_policy_s_image_and_sees_nothing_of_the_host() {
    let test = "image::a_job_runs_in_its_policy_s_image_and_sees_nothing_of_the_host";
    if !can_run(test) {
        return;
    }
    let _one = crate::docker::ONE_AT_A_TIME.lock().await;
    let image = job_image::debian_image();
    let Some(docker) = crate::docker::docker_policy(test, &crate::docker::rootfs_tar()) else {
        return;
    };
    let reference = format!(
        "oci:{}:{}@{}",
        image.layout.display(),
        image.tag,
        image.info.manifest_digest
    );
    let imaged_extra: &'static str =
        Box::leak(format!("{}image = \"{reference}\"\n", docker.extra).into_boxed_str());
    let fleet = Fleet::start(FleetOptions {
        host_max: 2,
        policies: vec![
            PolicySpec {
                name: "imaged",
                target: "acme",
                labels: IMAGED,
                max_runners: 1,
                workspace: "ephemeral",
                extra: imaged_extra,
            },
            PolicySpec {
                name: "hostroot",
                target: "acme",
                labels: HOST_ROOT,
                max_runners: 1,
                workspace: "ephemeral",
                extra: "",
            },
        ],
        isolation: Some("user"),
        host_extra: "network = \"private\"\n".to_owned(),
        base_dir: Some(base_dir()),
        ..FleetOptions::default()
    })
    .await;
    let _subids = crate::docker::SubIds(crate::docker::uids_of(&fleet));
    let token = uuid::Uuid::new_v4().simple().to_string();
    let planted = Planted(
        ["/etc", "/opt", "/home"]
            .iter()
            .map(|dir| Path::new(dir).join(format!("rm-e2e-host-marker-{token}")))
            .collect(),
    );
    for p in &planted.0 {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "host").unwrap();
    }
    assert!(
        Path::new(HOST_ONLY_PROGRAM).exists(),
        "the control needs {HOST_ONLY_PROGRAM} on the host"
    );
    assert!(
        !image.root.join(&HOST_ONLY_PROGRAM[1..]).exists(),
        "the image must lack {HOST_ONLY_PROGRAM}"
    );
    let data_dir = fleet.setup.dir.path().join("data");
    fleet.wrap_listener(
        &SCRIPT
            .replace("@REPORT@", REPORT)
            .replace("@MARKER_FILE@", job_image::MARKER_FILE)
            .replace("@SCRATCH@", job_image::SCRATCH_DIR)
            .replace("@HOST_ETC@", &planted.0[0].display().to_string())
            .replace("@HOST_OPT@", &planted.0[1].display().to_string())
            .replace("@HOST_HOME@", &planted.0[2].display().to_string())
            .replace("@DATA_DIR@", &data_dir.display().to_string())
            .replace("@HOST_PROGRAM@", HOST_ONLY_PROGRAM)
            .replace("@BASE_IMAGE@", crate::docker::BASE_IMAGE),
    );
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 200,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let run = async |name: &str, labels: &[&str]| {
        let before: Vec<_> = fleet.attempts().into_iter().map(|a| a.attempt_id).collect();
        let job = fleet.fake.queue_job(REPO, name, labels).unwrap();
        wait_until(
            Duration::from_secs(180),
            &format!("job {name} done and its attempt cleaned"),
            || fleet.completed(job) && fleet.all_cleaned(),
        )
        .await;
        let attempt = fleet
            .attempts()
            .into_iter()
            .find(|a| !before.contains(&a.attempt_id))
            .unwrap_or_else(|| panic!("no runner started for job {name}"));
        (job, attempt)
    };
    let (first_job, first) = run("in-the-image", IMAGED).await;
    let (_, control) = run("on-the-host", HOST_ROOT).await;
    let (_, second) = run("in-the-image-again", IMAGED).await;
    let one = kept_report(&fleet, &first);
    let host = kept_report(&fleet, &control);
    let two = kept_report(&fleet, &second);
    eprintln!("first:\n{one}\ncontrol:\n{host}\nsecond:\n{two}");

    // The image: its marker, its PATH, the runner's name; none of its `RM_` variables, and its
    // WORKDIR ignored (the runner starts in its runtime).
    assert_eq!(field(&one, "marker"), image.info.marker);
    assert_eq!(field(&one, "user"), "runner");
    let image_path = job_image::IMAGE_ENV
        .iter()
        .find(|(k, _)| *k == "PATH")
        .map(|(_, v)| *v)
        .unwrap();
    assert_eq!(field(&one, "path"), image_path);
    assert_eq!(field(&one, "image_rm_env"), "unset");
    assert_eq!(
        field(&one, "start"),
        first.runtime_dir.display().to_string()
    );
    // Nothing of the host; the control, on the host's root, sees every one.
    for key in [
        "host_etc",
        "host_opt",
        "host_home",
        "data_dir",
        "host_program",
    ] {
        assert_eq!(field(&one, key), "absent", "{key} in the image:\n{one}");
        assert_eq!(
            field(&host, key),
            "seen",
            "{key} on the host (the control):\n{host}"
        );
    }
    assert_ne!(field(&host, "marker"), image.info.marker);
    // Its writes: into the image's scratch directory, not into its /etc (root's); the next job
    // in the image does not see them, and the store's tree is untouched.
    assert_eq!(field(&one, "scratch_write"), "ok");
    assert_eq!(field(&one, "etc_write"), "denied");
    assert_eq!(field(&one, "left"), "absent");
    assert_eq!(
        field(&two, "left"),
        "absent",
        "the second job saw the first's write"
    );
    let store_root = data_dir
        .join("images")
        .join(image.info.config_digest.trim_start_matches("sha256:"))
        .join("rootfs");
    assert!(
        store_root.join(job_image::SCRATCH_DIR).is_dir(),
        "{}",
        store_root.display()
    );
    assert!(
        !store_root
            .join(job_image::SCRATCH_DIR)
            .join("left")
            .exists()
    );
    // The job's Docker, from inside the image, at its DOCKER_HOST and at /var/run/docker.sock.
    assert_eq!(field(&one, "docker"), "from-a-container", "{one}");
    assert!(!field(&one, "docker_socket").is_empty(), "{one}");
    assert_eq!(field(&one, "done"), "yes");

    // Each attempt journals the image it ran; the control none; explain names it.
    assert_eq!(
        first.image.as_deref(),
        Some(image.info.config_digest.as_str())
    );
    assert_eq!(
        second.image.as_deref(),
        Some(image.info.config_digest.as_str())
    );
    assert_eq!(control.image, None);
    let explained = fleet.explain(first_job).to_string();
    assert!(
        explained.contains(&image.info.config_digest),
        "explain names the image: {explained}"
    );
    // Nothing is left: no mount of the runners' roots, no runtime.
    assert_eq!(mounts_naming(".rm-root"), Vec::<String>::new());
    assert!(fleet.runtimes().is_empty(), "{:?}", fleet.runtimes());
}
