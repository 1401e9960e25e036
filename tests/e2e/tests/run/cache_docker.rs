//! The host-local cache for a step in a container (issue 39) through `rm-agent run`: a policy
//! with `cache = true` and `docker = true` (the runner's own rootless Docker, the base image a
//! busybox one loaded from a tarball, as in `docker`), runners under `isolation = "user"` on the
//! private network.
//!
//! actions/runner gives a step in a container (a `container:` job's step, a Docker container
//! action) only the names of the step's environment dictionary (`docker run -e NAME`), never the
//! runner's own environment; and the redirected worker sets neither `ACTIONS_RESULTS_URL` nor
//! `ACTIONS_CACHE_URL` in that dictionary. The agent's job-started hook puts both, as the URL the
//! runner's own containers reach the service at (the host end of its network), in the job's
//! `$GITHUB_ENV`, which every later step's dictionary holds. The fake runner's worker does what
//! the real one does with it (`rm_fake_runner`'s `steps`: the hook with `bash -e`, `$GITHUB_ENV`
//! read into the job's dictionary, the container step given exactly the dictionary's names).
//!
//! - Job "container-save": its host step (node, `cache/job.mjs`) saves 1 MiB under a key and a
//!   version by raw Twirp calls; its container step (`busybox wget`) asks the results URL it was
//!   given for that key and version (`GetCacheEntryDownloadURL`), downloads the signed URL and
//!   prints the bytes' SHA-256: the host step's. The URL it was given, and the signed URL's base,
//!   are the runner's host end; the worker's own variables (`RM_CACHE_URL`) are not in the
//!   container; the fake GitHub saw no cache call.
//! - The hook is root's, lent read-only: the host step's attempts to append to, overwrite,
//!   chmod, rename or remove it fail, and the host's file is unchanged.
//! - The operator's own hook (`ACTIONS_RUNNER_HOOK_JOB_STARTED` in the policy's `env_file`) still
//!   runs, after the agent's: what it writes to `$GITHUB_ENV` reaches the host step and the
//!   container.
//! - The control, job "container-withheld": its runner starts with
//!   `ACTIONS_RUNNER_HOOK_JOB_STARTED` unset (the package's listener, a wrapper, unsets it while
//!   a file of the test exists), so no hook runs: its host step still has the local URL (the
//!   runner's environment), its container has no `ACTIONS_RESULTS_URL`, no `ACTIONS_CACHE_URL` and
//!   nothing of the operator's hook, while the names the handler sets (`GITHUB_JOB`,
//!   `ACTIONS_RUNTIME_TOKEN`) still reach it.
//!
//! Needs what `cache` needs (`node`, `npm`) and what `docker` needs (root, the rootless Docker
//! tools, `busybox`); without them it fails unless `RM_TEST_ALLOW_SKIP` names `node` or `docker`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use rm_e2e::fleet::{Fleet, REPO, wait_until};
use serde_json::{Value, json};

use crate::busybox_image;
use crate::cache::{CacheFleet, JOB_TIMEOUT, cache_fleet_with, default_branch, ran};
use crate::docker::{BASE_IMAGE, ONE_AT_A_TIME, SubIds, docker_policy, uids_of};

/// The key and version the host step saves and the container step looks up.
const KEY: &str = "container-deps";
const VERSION: &str = "container-v1";

/// What the host step saves.
const SAVED_BYTES: u64 = 1 << 20;

/// The programs of the container's image: links to busybox.
const APPLETS: &[&str] = &[
    "sh",
    "echo",
    "printf",
    "cat",
    "wget",
    "sha256sum",
    "sed",
    "cut",
];

/// The container step: what it was given (`name=value` lines), then, where it has a results
/// URL, the entry looked up and downloaded through it. `@KEY@` and `@VERSION@` are replaced.
const CONTAINER_STEP: &str = r#"# The job's step in a container (tests/e2e/tests/run/cache_docker.rs).
echo "job=${GITHUB_JOB:-}"
echo "results_url=${ACTIONS_RESULTS_URL:-}"
echo "cache_url=${ACTIONS_CACHE_URL:-}"
echo "operator_hook=${OPERATOR_HOOK:-}"
echo "rm_cache_url=${RM_CACHE_URL:-}"
if [ -n "${ACTIONS_RUNTIME_TOKEN:-}" ]; then echo "runtime_token=set"; else echo "runtime_token="; fi
if [ -n "${ACTIONS_RESULTS_URL:-}" ]; then
    lookup=$(wget -q -O- --header 'Content-Type: application/json' \
        --post-data '{"key":"@KEY@","version":"@VERSION@"}' \
        "${ACTIONS_RESULTS_URL}twirp/github.actions.results.api.v1.CacheService/GetCacheEntryDownloadURL")
    echo "lookup_exit=$?"
    url=$(printf '%s' "$lookup" | sed -n 's/.*"signed_download_url":"\([^"]*\)".*/\1/p')
    echo "matched_key=$(printf '%s' "$lookup" | sed -n 's/.*"matched_key":"\([^"]*\)".*/\1/p')"
    echo "download_base=${url%%blob/*}"
    if [ -n "$url" ]; then
        echo "sha256=$(wget -q -O- "$url" | sha256sum | cut -d' ' -f1)"
    fi
fi
"#;

/// The package's listener: the real one, without the job-started hook while `@WITHHOLD@`
/// exists (the control).
const LISTENER: &str = r#"#!/bin/sh
# tests/e2e/tests/run/cache_docker.rs: the control runs without the job-started hook.
if [ -e '@WITHHOLD@' ]; then
    unset ACTIONS_RUNNER_HOOK_JOB_STARTED
fi
exec "$(dirname "$0")/Runner.Listener.real" "$@"
"#;

/// The operator's own job-started hook, named by the policy's `env_file`.
const OPERATOR_HOOK: &str = "#!/bin/sh\necho 'OPERATOR_HOOK=ran' >> \"$GITHUB_ENV\"\n";

/// Writes `text` to `path`, root's, mode `mode`.
fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The container step's report of job `name`: its `name=value` lines.
fn container_report(cf: &CacheFleet, name: &str) -> BTreeMap<String, String> {
    let path = cf.reports.join(format!("{name}.container.txt"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no container report {} ({e})", path.display()));
    eprintln!("job {name}, its container:\n{text}");
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `report`'s value of `name` (empty where it printed none).
fn said<'a>(report: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    report.get(name).map_or("", String::as_str)
}

/// Every `Worker_*.log` the agent kept (`<data_dir>/logs/<attempt>/`), each once: the ones
/// not shown before.
fn worker_logs(fleet: &Fleet) -> String {
    static SHOWN: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut shown = SHOWN.lock().unwrap();
    let mut text = String::new();
    let kept = fleet.setup.dir.path().join("data").join("logs");
    for attempt in std::fs::read_dir(kept).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(attempt.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = file.path();
            let is_worker = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("Worker_"));
            if is_worker && !shown.contains(&path) {
                text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
                shown.push(path);
            }
        }
    }
    text
}

/// Queues job `name` with `plan` and waits for it: its host step's report, its container's,
/// and the job's conclusion.
async fn job(
    cf: &CacheFleet,
    name: &str,
    plan: Value,
) -> (Value, BTreeMap<String, String>, Option<String>) {
    let id = cf.queue(name, REPO, &default_branch(), &plan);
    wait_until(JOB_TIMEOUT, &format!("job {name} done"), || {
        cf.fleet.completed(id) && cf.fleet.all_cleaned()
    })
    .await;
    // What the worker said (the hook, the steps), as the agent kept it: shown on a failure.
    eprintln!("job {name}, its worker:\n{}", worker_logs(&cf.fleet));
    let report = cf.finished(name, id).await;
    let conclusion = cf.fleet.fake.job(id).and_then(|j| j.conclusion);
    (report, container_report(cf, name), conclusion)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_in_a_container_reaches_the_cache_through_the_job_started_hook() {
    let test = "cache_docker::a_step_in_a_container_reaches_the_cache_through_the_job_started_hook";
    // The agent writes /etc/subuid and /etc/subgid, as the Docker tests' do.
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(docker) = docker_policy(test, &busybox_image::rootfs(APPLETS, b"", 0)) else {
        return;
    };
    let Some(cf) = cache_fleet_with(test, None, &[], |fleet| {
        let dir = fleet.setup.dir.path();
        let hook = dir.join("operator-hook.sh");
        write_mode(&hook, OPERATOR_HOOK, 0o644);
        let env_file = dir.join("cached.env");
        write_mode(
            &env_file,
            &format!("ACTIONS_RUNNER_HOOK_JOB_STARTED={}\n", hook.display()),
            0o644,
        );
        format!("{}env_file = \"{}\"\n", docker.extra, env_file.display())
    })
    .await
    else {
        return;
    };
    let _subids = SubIds(uids_of(&cf.fleet));
    let fleet = &cf.fleet;
    let withhold: PathBuf = cf.reports.join("withhold-hook");
    fleet.wrap_listener(&LISTENER.replace("@WITHHOLD@", &withhold.display().to_string()));
    let bin = fleet.package.join("bin");
    write_mode(
        &bin.join(rm_fake_runner::CONTAINER_STEP_SCRIPT),
        &CONTAINER_STEP
            .replace("@KEY@", KEY)
            .replace("@VERSION@", VERSION),
        0o644,
    );
    write_mode(
        &bin.join(rm_fake_runner::CONTAINER_IMAGE_FILE),
        BASE_IMAGE,
        0o644,
    );
    write_mode(
        &bin.join(rm_fake_runner::CONTAINER_REPORTS_FILE),
        &cf.reports.display().to_string(),
        0o644,
    );
    let _agent = fleet.start_agent(&[]).await;
    // The hook the agent wrote at its start, as the host holds it.
    let hook_file = cf.dir.join("hooks").join("job-started.sh");
    let hook_bytes = std::fs::read(&hook_file).unwrap();

    // The host step saves; the container step, given the URL by the hook, restores it.
    let (host, container, conclusion) = job(
        &cf,
        "container-save",
        json!([
            {"op": "raw_save", "key": KEY, "version": VERSION, "bytes": SAVED_BYTES},
            {"op": "env", "names": ["OPERATOR_HOOK"]},
            {"op": "change_file", "path": rm_runner::backend::HOOK_IN_RUN},
        ]),
    )
    .await;
    let local = cf.local_url(&host);
    let saved = ran(&host, 0);
    assert_eq!(
        (&saved["create"], &saved["upload"], &saved["finalize"]),
        (&json!(200), &json!(201), &json!(200)),
        "the host step's save: {saved}"
    );
    assert_eq!(
        format!("{}/", saved["upload_origin"].as_str().unwrap()),
        local
    );
    assert_eq!(
        said(&container, "results_url"),
        local,
        "the container was not given the local cache as ACTIONS_RESULTS_URL"
    );
    assert_eq!(said(&container, "cache_url"), local);
    assert_eq!(said(&container, "lookup_exit"), "0", "{container:?}");
    assert_eq!(said(&container, "matched_key"), KEY, "{container:?}");
    assert_eq!(
        said(&container, "download_base"),
        local,
        "the signed URL is not on the base the container reached"
    );
    assert_eq!(
        said(&container, "sha256"),
        saved["sha256"].as_str().unwrap(),
        "the container downloaded other bytes than the host step saved"
    );
    // The container got the step's dictionary, not the worker's environment.
    assert_eq!(said(&container, "job"), "container-save");
    assert_eq!(said(&container, "runtime_token"), "set");
    assert_eq!(
        said(&container, "rm_cache_url"),
        "",
        "the worker's own environment reached the container"
    );
    // The operator's hook ran after the agent's: the host step and the container have its line.
    assert_eq!(
        ran(&host, 1)["values"]["OPERATOR_HOOK"],
        json!("ran"),
        "the operator's job-started hook did not run"
    );
    assert_eq!(said(&container, "operator_hook"), "ran");
    // The hook is the agent's: the job changes none of it for the next job.
    let tries = ran(&host, 2)["tries"].as_object().unwrap().clone();
    assert_eq!(tries.len(), 5, "{tries:?}");
    assert!(
        tries.values().all(|outcome| outcome != "done"),
        "the job changed the job-started hook it was lent: {tries:?}"
    );
    assert_eq!(
        std::fs::read(&hook_file).unwrap(),
        hook_bytes,
        "the host's job-started hook changed"
    );
    assert_eq!(conclusion.as_deref(), Some("success"));

    // The control: no hook, so the container has no URL (the runner, on the host, still does).
    write_mode(&withhold, "", 0o644);
    let (host, container, conclusion) = job(
        &cf,
        "container-withheld",
        json!([{"op": "env", "names": ["OPERATOR_HOOK"]}]),
    )
    .await;
    let local = cf.local_url(&host);
    assert_eq!(
        host["results_url"].as_str(),
        Some(local.as_str()),
        "the control's runner was not cached"
    );
    assert_eq!(ran(&host, 0)["values"]["OPERATOR_HOOK"], Value::Null);
    for name in ["results_url", "cache_url", "operator_hook", "sha256"] {
        assert_eq!(
            said(&container, name),
            "",
            "without the hook the container still got {name}"
        );
    }
    assert_eq!(said(&container, "job"), "container-withheld");
    assert_eq!(said(&container, "runtime_token"), "set");
    assert_eq!(conclusion.as_deref(), Some("success"));

    // Every cache call reached the agent's service: GitHub saw none.
    let cache_calls: Vec<String> = fleet
        .fake
        .results_requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("CacheService"))
        .collect();
    assert!(cache_calls.is_empty(), "GitHub saw {cache_calls:?}");
    assert_eq!(fleet.attempts().len(), 2, "one runner per job");
}
