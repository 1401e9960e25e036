//! The host-local cache (issue 39) through `rm-agent run`: a policy with `cache = true`, runners
//! under `isolation = "user"` on the private network, and the real `@actions/cache` client from
//! npm run with Node as each job's step (the fake runner's worker runs `bin/step.sh`, which runs
//! `cache/job.mjs` with the job's plan and writes a report).
//!
//! The fake runner's worker sets `ACTIONS_RESULTS_URL` and `ACTIONS_CACHE_URL` to the fake
//! GitHub's results service for each of those names its package's `bin/Runner.Worker.dll` holds,
//! as the real worker does; so a job reaches the agent's cache only through the package the
//! agent derived (the literals renamed), and an underived package's cache calls land on the
//! fake, which records them.
//!
//! - Job A (acme/widgets, its default branch) saves 64 MiB of random bytes under a key; job B,
//!   another runner later, restores them byte for byte; job C of another repository misses;
//!   job D, a pull request's, restores A's entry and saves its own, which a later default-branch
//!   job E does not see. E also makes an artifact call, which the agent passes on to "GitHub"
//!   (the fake's results service) with its `Authorization` unchanged.
//! - A hostile job of acme/gadgets forges a runtime token naming acme/widgets' default branch:
//!   through the client and through raw Twirp calls for A's key and version it reads nothing,
//!   and what it writes is not what a later acme/widgets job restores.
//! - Every job saw the agent's service as its results URL; the fake recorded no cache call.
//! - Action archives from the host: `[cache] actions` names an action published on the fake;
//!   once the agent has fetched its archive, job A (using it at that commit) sets it up from the
//!   host (the fake worker's `_diag/setup.done`, and no download at the fake), while job B, using
//!   an action not configured, downloads it (the control). A's step, through the directory the
//!   runner is lent (`ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE`), tries to create, replace, append
//!   to, rename, remove and chmod: each refused as a read-only file system (the host's files
//!   were opened to everyone first, so the read-only view alone refuses), and the host's archive
//!   is byte for byte what it was.
//! - `rm-agent explain` says `cache_active` for A with the bytes it saved, and `rm-agent check`
//!   says caching is active for the package.
//! - The control: a package whose worker holds `ACTIONS_RESULTS_URL` twice does not fit the
//!   redirect, so its job runs uncached: its step is given the fake's results service, and the
//!   fake records its cache calls (what the first test's "no cache call" would see had the
//!   agent's redirect not applied). `check` says the package does not fit and its jobs run
//!   uncached; the agent's status says the redirect is inactive, and `explain` `cache_inactive`.
//! - The agent SIGKILLed while a job's save streams its blob: the job's step creates an entry
//!   (raw Twirp, its own token) and sends part of its Put Blob, then stalls; the test kills
//!   `rm-agent` (the staged bytes are on disk), starts it again, and once the job is done and
//!   its runner cleaned the cache holds no entry, no staged file and no orphaned blob
//!   (`rm_cache::disk_report`); a later job misses that key and saves it anew.
//!
//! Needs `node` and `npm` (the test installs `@actions/cache` under the setups' base directory,
//! where runner uids can read it); without them it fails unless `RM_TEST_ALLOW_SKIP` names
//! `node`.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, PolicySpec, REPO, wait_until};
use rm_fake_github::{JobOrigin, RequestKind, RunnerBehavior};
use serde_json::{Value, json};

use crate::isolation::base_dir;
use crate::{npm, skip};

/// The `@actions/cache` release the jobs use: the current one when written (`npm view
/// @actions/cache version`).
const ACTIONS_CACHE_VERSION: &str = "6.3.0";

pub(crate) const LABELS: &[&str] = &["self-hosted", "cache"];

/// Another repository of the organization the policy serves.
const OTHER_REPO: &str = "acme/gadgets";

/// What job A saves: 64 MiB of random bytes.
const SAVED_BYTES: u64 = 64 << 20;

/// What the jobs' own later saves write.
const SMALL_BYTES: u64 = 1 << 20;

/// The action `[cache] actions` names (public on the fake), and the commit its `v1` names.
const HOST_ACTION: &str = "actions/setup-tool";
const HOST_ACTION_SHA: &str = "5f3c7a1e9b2d4c6e8f0a1b3c5d7e9f1a2b4c6d8e";
/// An action no `[cache] actions` entry names: jobs download it.
const OTHER_ACTION: &str = "actions/other-tool";
const OTHER_ACTION_SHA: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
const ACTION_FILES: &[(&str, &[u8])] = &[
    (
        "action.yml",
        b"name: tool\nruns:\n  using: node20\n  main: index.js\n",
    ),
    ("index.js", b"console.log('tool');\n"),
];

/// The job's step: node with the test's script, the job's plan and report named by the job.
const STEP: &str = r#"#!/bin/sh
# The job's one step (tests/e2e/tests/run/cache.rs): @actions/cache through node.
export PLAN='@REPORTS@'/"$GITHUB_JOB".plan.json
export REPORT='@REPORTS@'/"$GITHUB_JOB".json
export CACHE_LIB='@CACHE_LIB@'
exec '@NODE@' '@REPORTS@/job.mjs'
"#;

/// The cached policy: every runner of the organization, user isolation, the private network.
const CACHED: PolicySpec = PolicySpec {
    name: "cached",
    target: "acme",
    labels: LABELS,
    max_runners: 2,
    workspace: "ephemeral",
    extra: "cache = true\n",
};

/// A fleet whose runners run the cache client as their step.
pub(crate) struct CacheFleet {
    pub(crate) fleet: Fleet,
    pub(crate) reports: PathBuf,
    /// The agent's cache service's port on the host's loopback.
    port: u16,
    /// `cache.dir`.
    pub(crate) dir: PathBuf,
}

/// `node` by its full path (the runner's `PATH` is not the test's).
fn node_path() -> PathBuf {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        .canonicalize()
        .unwrap()
}

/// [`cache_fleet_with`] the package's own synthetic worker, no action archives.
async fn cache_fleet(test: &str) -> Option<CacheFleet> {
    cache_fleet_with(test, None, &[], |_| String::new()).await
}

/// A cached fleet; `worker`, when given, replaces the package's `bin/Runner.Worker.dll`;
/// `actions` are `[cache] actions`; `policy_extra` gives more lines of the cached policy, once
/// the fleet's setup directory is made.
pub(crate) async fn cache_fleet_with(
    test: &str,
    worker: Option<Vec<u8>>,
    actions: &[&str],
    policy_extra: impl FnOnce(&Fleet) -> String,
) -> Option<CacheFleet> {
    if let Err(why) = npm::node_and_npm() {
        skip::cannot_run(test, "node", &why);
        return None;
    }
    let base = base_dir();
    let prefix = npm::npm_package(&base, "@actions/cache", ACTIONS_CACHE_VERSION);
    let cache_lib = prefix.join("node_modules/@actions/cache/lib");
    assert!(
        cache_lib.join("cache.js").is_file(),
        "{}",
        cache_lib.display()
    );
    let port = rm_e2e::free_port();
    let mut options = FleetOptions {
        host_max: 2,
        policies: vec![CACHED],
        isolation: Some("user"),
        host_extra: "network = \"private\"\n".to_owned(),
        base_dir: Some(base),
        ..FleetOptions::default()
    };
    let fleet = Fleet::start(options.clone()).await;
    fleet.fake.add_repo(OTHER_REPO);
    // The service's settings, where the fake's results service is "GitHub's" for the calls it
    // does not serve.
    let dir = fleet.setup.dir.path().join("cache");
    let actions: Vec<String> = actions.iter().map(|a| format!("\"{a}\"")).collect();
    options.tail = format!(
        "\n[cache]\ndir = \"{dir}\"\nport = {port}\nmax_size = \"1GiB\"\nupstream = \"{upstream}\"\nactions = [{actions}]\n",
        dir = dir.display(),
        upstream = fleet.fake.results_url(),
        actions = actions.join(", "),
    );
    let extra = policy_extra(&fleet);
    if !extra.is_empty() {
        options.policies[0].extra = Box::leak(format!("{}{extra}", CACHED.extra).into_boxed_str());
    }
    fleet.configure(&options);
    let reports = fleet.reports_dir();
    std::fs::write(reports.join("job.mjs"), include_str!("cache/job.mjs")).unwrap();
    let step = STEP
        .replace("@REPORTS@", &reports.display().to_string())
        .replace("@CACHE_LIB@", &cache_lib.display().to_string())
        .replace("@NODE@", &node_path().display().to_string());
    if let Some(worker) = worker {
        std::fs::write(
            fleet.package.join("bin").join(rm_fake_runner::WORKER_DLL),
            worker,
        )
        .unwrap();
    }
    let step_file = fleet.package.join("bin").join(rm_fake_runner::STEP_SCRIPT);
    std::fs::write(&step_file, step).unwrap();
    std::fs::set_permissions(&step_file, std::fs::Permissions::from_mode(0o755)).unwrap();
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 0,
        ..RunnerBehavior::default()
    });
    Some(CacheFleet {
        fleet,
        reports,
        port,
        dir,
    })
}

/// How long one job may take, runner start and cleanup included (a 64 MiB save is a few
/// seconds of tar and zstd on this 2-core machine).
pub(crate) const JOB_TIMEOUT: Duration = Duration::from_secs(120);

impl CacheFleet {
    /// Queues job `name` in `repo` as `origin` with `plan` (the script's operations); its id.
    pub(crate) fn queue(&self, name: &str, repo: &str, origin: &JobOrigin, plan: &Value) -> u64 {
        std::fs::write(
            self.reports.join(format!("{name}.plan.json")),
            plan.to_string(),
        )
        .unwrap();
        self.fleet
            .fake
            .queue_job_as(repo, name, LABELS, origin)
            .unwrap()
    }

    /// Waits until job `job` (named `name`) is done and every runner cleaned; its report, with
    /// the job's id added as `job_id`.
    pub(crate) async fn finished(&self, name: &str, job: u64) -> Value {
        wait_until(JOB_TIMEOUT, &format!("job {name} done"), || {
            self.fleet.completed(job) && self.fleet.all_cleaned()
        })
        .await;
        let path = self.reports.join(format!("{name}.json"));
        let mut report: Value = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(e) => panic!(
                "job {name} wrote no report {} ({e}); its conclusion: {:?}",
                path.display(),
                self.fleet.fake.job(job).and_then(|j| j.conclusion)
            ),
        };
        eprintln!("job {name}: {report:#}");
        report["job_id"] = json!(job);
        report
    }

    /// [`Self::queue`], then [`Self::finished`].
    async fn job(&self, name: &str, repo: &str, origin: &JobOrigin, plan: Value) -> Value {
        let job = self.queue(name, repo, origin, &plan);
        self.finished(name, job).await
    }

    /// The cache's files, read as the agent left them.
    fn disk(&self) -> rm_cache::DiskReport {
        rm_cache::disk_report(&self.dir).unwrap()
    }

    /// Where the agent keeps `repository`'s archive of commit `sha`.
    fn archive(&self, repository: &str, sha: &str) -> PathBuf {
        rm_cache::actions::archive_path(
            &self.dir.join(rm_cache::actions::ACTIONS_DIR),
            &rm_cache::actions::ArchiveKey {
                repository: repository.to_owned(),
                sha: sha.to_owned(),
            },
        )
    }

    /// `rm-agent explain JOB --json` of `report`'s job: its `cache_*` reason's code and message.
    fn explained_cache(&self, report: &Value) -> (String, String, Value) {
        let job = report["job_id"].as_u64().unwrap();
        let answer = self.fleet.explain(job);
        let reason = answer["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["code"].as_str().is_some_and(|c| c.starts_with("cache_")))
            .unwrap_or_else(|| panic!("explain {job} says nothing of the cache: {answer}"));
        (
            reason["code"].as_str().unwrap().to_owned(),
            reason["message"].as_str().unwrap().to_owned(),
            answer["cache"].clone(),
        )
    }

    /// `rm-agent check --json`'s `cache` finding (the fake answers on this process's runtime,
    /// so the command runs off it).
    async fn check_finding(&self) -> Value {
        let mut command = self.fleet.setup.command(&["check", "--json"]);
        let out = tokio::task::spawn_blocking(move || command.output().unwrap())
            .await
            .unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let found: Vec<&Value> = doc["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["check"] == "cache")
            .collect();
        assert_eq!(found.len(), 1, "one cache finding: {doc}");
        found[0].clone()
    }

    /// The agent's service as the job of `report` reaches it: at the host end of its runner's
    /// network (the runner's uid's slot), on the service's port.
    pub(crate) fn local_url(&self, report: &Value) -> String {
        let uid = u32::try_from(report["uid"].as_u64().unwrap()).unwrap();
        let host_end = rm_runner::network::addresses(rm_runner::network::slot_of(uid)).host;
        format!("http://{host_end}:{}/", self.port)
    }
}

/// The report's operation `n`.
fn op(report: &Value, n: usize) -> &Value {
    &report["ops"][n]
}

/// That operation `n` of `report` ran without an error.
pub(crate) fn ran(report: &Value, n: usize) -> &Value {
    let op = op(report, n);
    assert!(
        op["error"].is_null(),
        "{} of job {}: {}",
        op["op"],
        report["job"],
        op["error"]
    );
    op
}

/// Where "Set up job" took the report's job's actions from: `<n> actions from <where>`, as
/// the fake worker's `_diag/setup.done` says it (without how long it took).
fn actions_from(report: &Value) -> Option<&str> {
    report["setup"].as_str()?.split(" in ").next()
}

pub(crate) fn default_branch() -> JobOrigin {
    JobOrigin::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_share_a_cache_scoped_by_who_their_runner_is() {
    let Some(cf) = cache_fleet_with(
        "cache::jobs_share_a_cache_scoped_by_who_their_runner_is",
        None,
        &[&format!("{HOST_ACTION}@v1")],
        |_| String::new(),
    )
    .await
    else {
        return;
    };
    let fleet = &cf.fleet;
    fleet
        .fake
        .publish_action(HOST_ACTION, true, &[("v1", HOST_ACTION_SHA)], ACTION_FILES);
    fleet.fake.publish_action(
        OTHER_ACTION,
        true,
        &[("v1", OTHER_ACTION_SHA)],
        ACTION_FILES,
    );
    let _agent = fleet.start_agent(&[]).await;
    let archive = cf.archive(HOST_ACTION, HOST_ACTION_SHA);
    wait_until(
        Duration::from_secs(60),
        "the agent fetched the configured action's archive",
        || archive.is_file(),
    )
    .await;
    // The host's files opened to everyone: what refuses a job's change is the read-only view
    // the runner is lent, alone.
    let lent = cf.dir.join(rm_cache::actions::ACTIONS_DIR);
    for (path, mode) in [
        (&lent, 0o777),
        (&archive.parent().unwrap().to_path_buf(), 0o777),
        (&archive, 0o666),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let archive_bytes = std::fs::read(&archive).unwrap();
    let downloads = fleet.fake.action_downloads();

    // A: the default branch saves 64 MiB, with the configured action set up from the host; its
    // step tries to change the host's archives.
    let with_host_action = JobOrigin {
        uses: vec![format!("{HOST_ACTION}@{HOST_ACTION_SHA}")],
        ..default_branch()
    };
    let below_lent = archive.strip_prefix(&lent).unwrap().display().to_string();
    let a = cf
        .job(
            "save-a",
            REPO,
            &with_host_action,
            json!([
                {"op": "save", "key": "deps-a", "bytes": SAVED_BYTES},
                {"op": "archives", "archive": below_lent},
            ]),
        )
        .await;
    let saved = ran(&a, 0);
    assert_ne!(saved["id"], json!(-1), "job A's save failed: {saved}");
    let a_digest = saved["sha256"].clone();
    assert!(a_digest.is_string());
    assert_eq!(
        actions_from(&a),
        Some("1 actions from host"),
        "job A's action did not come from the host"
    );
    assert_eq!(
        fleet.fake.action_downloads(),
        downloads,
        "job A downloaded the action the host holds"
    );
    assert_eq!(
        a["archive_cache"].as_str(),
        Some(rm_runner::backend::ARCHIVES_IN_RUN)
    );
    let changes = ran(&a, 1);
    let tries = changes["tries"].as_object().unwrap();
    assert_eq!(tries.len(), 8, "{changes}");
    for (what, outcome) in tries {
        assert_eq!(
            outcome, "EROFS",
            "job A's {what} of the host's archives was not refused as read-only: {changes}"
        );
    }
    assert_eq!(changes["readable"], json!(archive_bytes.len()));
    assert_eq!(
        std::fs::read(&archive).unwrap(),
        archive_bytes,
        "the host's archive changed"
    );
    let names = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        (names(&lent), names(archive.parent().unwrap())),
        (
            vec![rm_cache::actions::repository_dir(HOST_ACTION)],
            vec![format!("{HOST_ACTION_SHA}.tar.gz")]
        ),
        "the job changed the host's archive directory"
    );

    // explain: the cache served A, and says what it saved; check: caching is active.
    let (code, message, counters) = cf.explained_cache(&a);
    assert_eq!(code, "cache_active", "{message}");
    let bytes_up = counters["bytes_up"]
        .as_u64()
        .unwrap_or_else(|| panic!("explain gave no cache counters for A: {counters}; {message}"));
    assert!(
        (SAVED_BYTES..SAVED_BYTES + (1 << 20)).contains(&bytes_up),
        "explain says A saved {bytes_up} bytes"
    );
    assert!(
        message.contains(&format!(
            "{:.1} MiB saved",
            bytes_up as f64 / f64::from(1 << 20)
        )),
        "{message}"
    );
    let finding = cf.check_finding().await;
    assert_eq!(finding["status"], "ok", "{finding}");
    assert!(
        finding["what"]
            .as_str()
            .unwrap()
            .contains("caching active for the runner at"),
        "{finding}"
    );

    // B: another runner, later, restores it byte for byte; the action it uses, which no
    // `[cache] actions` names, is downloaded (the control).
    let with_other_action = JobOrigin {
        uses: vec![format!("{OTHER_ACTION}@{OTHER_ACTION_SHA}")],
        ..default_branch()
    };
    let b = cf
        .job(
            "restore-b",
            REPO,
            &with_other_action,
            json!([{"op": "restore", "key": "deps-a"}]),
        )
        .await;
    let restored = ran(&b, 0);
    assert_eq!(restored["hit"], json!("deps-a"), "job B missed A's entry");
    assert_eq!(restored["sha256"], a_digest, "job B restored other bytes");
    assert_eq!(
        actions_from(&b),
        Some("1 actions from download"),
        "job B's action, not configured, did not come from GitHub"
    );
    assert_eq!(fleet.fake.action_downloads(), downloads + 1);

    // C: another repository misses it, by its key and by prefix.
    let c = cf
        .job(
            "other-c",
            OTHER_REPO,
            &default_branch(),
            json!([{"op": "restore", "key": "deps-a", "restore_keys": ["deps-"]}]),
        )
        .await;
    let other = ran(&c, 0);
    assert_eq!(
        other["hit"],
        Value::Null,
        "another repository restored A's entry"
    );
    assert_eq!(other["sha256"], Value::Null);

    // D: a pull request's job restores the default branch's entry and saves its own.
    let pull_request = JobOrigin {
        head_branch: "feature".into(),
        event: "pull_request".into(),
        ..JobOrigin::default()
    };
    let d = cf
        .job(
            "pr-d",
            REPO,
            &pull_request,
            json!([
                {"op": "restore", "key": "deps-a"},
                {"op": "save", "key": "deps-d", "bytes": SMALL_BYTES},
            ]),
        )
        .await;
    let pr_restore = ran(&d, 0);
    assert_eq!(
        pr_restore["hit"],
        json!("deps-a"),
        "the pull request missed the default branch's entry"
    );
    assert_eq!(pr_restore["sha256"], a_digest);
    let pr_save = ran(&d, 1);
    assert_ne!(
        pr_save["id"],
        json!(-1),
        "the pull request's save failed: {pr_save}"
    );

    // E: a later default-branch job does not see the pull request's entry; its artifact call
    // reaches GitHub.
    let e = cf
        .job(
            "main-e",
            REPO,
            &default_branch(),
            json!([
                {"op": "restore", "key": "deps-d", "restore_keys": ["deps-d"]},
                {"op": "artifact"},
            ]),
        )
        .await;
    assert_eq!(
        ran(&e, 0)["hit"],
        Value::Null,
        "the default branch restored a pull request's entry"
    );
    let artifact = ran(&e, 1);
    assert_eq!(artifact["status"], json!(200), "{artifact}");

    // The hostile job: acme/gadgets forging acme/widgets' default branch.
    let forged = json!({"forge_repository": REPO, "forge_ref": "refs/heads/main"});
    let with = |mut op: Value| {
        if let (Some(op), Some(forged)) = (op.as_object_mut(), forged.as_object()) {
            op.extend(forged.clone());
        }
        op
    };
    let hostile = cf
        .job(
            "hostile",
            OTHER_REPO,
            &default_branch(),
            json!([
                with(json!({"op": "forged_restore", "key": "deps-a", "restore_keys": ["deps-"]})),
                with(json!({"op": "raw", "key": "deps-a"})),
                with(json!({"op": "forged_save", "key": "deps-poison", "bytes": SMALL_BYTES})),
            ]),
        )
        .await;
    let forged_restore = op(&hostile, 0);
    assert_eq!(
        forged_restore["hit"],
        Value::Null,
        "a forged token read A's entry: {forged_restore}"
    );
    assert_eq!(forged_restore["sha256"], Value::Null);
    let raw = op(&hostile, 1);
    assert!(raw["error"].is_null(), "the raw calls did not run: {raw}");
    let lookup = &raw["lookup"]["json"];
    assert!(
        lookup["signed_download_url"]
            .as_str()
            .is_none_or(str::is_empty)
            && raw["fetched"].is_null(),
        "a raw lookup with a forged token was given A's entry: {raw}"
    );

    // F: acme/widgets still gets A's bytes, and nothing the hostile job saved.
    let f = cf
        .job(
            "check-f",
            REPO,
            &default_branch(),
            json!([
                {"op": "restore", "key": "deps-a"},
                {"op": "restore", "key": "deps-poison", "restore_keys": ["deps-poison"]},
            ]),
        )
        .await;
    let still = ran(&f, 0);
    assert_eq!(still["hit"], json!("deps-a"));
    assert_eq!(
        still["sha256"], a_digest,
        "the hostile job overwrote A's entry"
    );
    assert_eq!(
        ran(&f, 1)["hit"],
        Value::Null,
        "a hostile job's save under a forged token reached acme/widgets"
    );

    // Every job's step saw the agent's service, through the derived package.
    for report in [&a, &b, &c, &d, &e, &hostile, &f] {
        let local = cf.local_url(report);
        assert_eq!(
            (report["results_url"].as_str(), report["cache_url"].as_str()),
            (Some(local.as_str()), Some(local.as_str())),
            "job {} was not given the local cache",
            report["job"]
        );
    }

    // GitHub saw no cache call at all: only E's artifact call, its credential unchanged.
    let results = fleet.fake.results_requests();
    let paths: Vec<&str> = results.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [rm_fake_github::results::CREATE_ARTIFACT],
        "the fake GitHub's results service saw more than E's artifact call"
    );
    assert!(results.iter().all(|r| r.kind() == RequestKind::Results));
    assert_eq!(
        results[0].header(rm_fake_github::results::AUTHORIZATION_FINGERPRINT),
        artifact["authorization_sha256"].as_str(),
        "the artifact call reached GitHub with another Authorization"
    );
    assert_eq!(fleet.attempts().len(), 7, "one runner per job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_the_redirect_does_not_fit_runs_uncached_and_github_sees_its_cache_calls() {
    // `ACTIONS_RESULTS_URL` twice: the derivation's count does not hold.
    let worker = rm_fake_runner::synthetic_worker_dll(&[
        "ACTIONS_RESULTS_URL",
        "ACTIONS_CACHE_URL",
        "ACTIONS_RESULTS_URL",
    ]);
    let Some(cf) = cache_fleet_with(
        "cache::a_package_the_redirect_does_not_fit_runs_uncached",
        Some(worker),
        &[],
        |_| String::new(),
    )
    .await
    else {
        return;
    };
    let fleet = &cf.fleet;
    let _agent = fleet.start_agent(&[]).await;
    let report = cf
        .job(
            "uncached",
            REPO,
            &default_branch(),
            json!([{"op": "save", "key": "deps-u", "bytes": SMALL_BYTES}]),
        )
        .await;
    let github = fleet.fake.results_url();
    assert_eq!(
        (report["results_url"].as_str(), report["cache_url"].as_str()),
        (Some(github.as_str()), Some(github.as_str())),
        "an unfit package's job was not left to GitHub's results service"
    );
    // Fail closed: its runner was given none of the cache's environment (the worker would
    // overwrite the URLs, but the runner must not look cached at all).
    assert_eq!(
        (
            report["rm_cache_url"].as_str(),
            report["job_started_hook"].as_str()
        ),
        (None, None),
        "a runner whose worker is not redirected was given the cache: {report}"
    );
    assert_eq!(
        ran(&report, 0)["id"],
        json!(-1),
        "the fake's results service stored nothing"
    );
    let cache_calls: Vec<String> = fleet
        .fake
        .results_requests()
        .into_iter()
        .map(|r| r.path)
        .filter(|p| p.contains("CacheService"))
        .collect();
    assert!(
        !cache_calls.is_empty(),
        "the fake recorded none of the uncached job's cache calls"
    );

    // check says so, and so do the agent's status and explain.
    let finding = cf.check_finding().await;
    assert_eq!(finding["status"], "warn", "{finding}");
    let what = finding["what"].as_str().unwrap();
    for words in [
        "does not fit the cache redirect",
        "ACTIONS_RESULTS_URL",
        "its jobs run uncached",
    ] {
        assert!(what.contains(words), "{words}: {what}");
    }
    wait_until(
        Duration::from_secs(30),
        "the agent's status to say the redirect is inactive",
        || {
            let out = fleet.setup.run(&["status", "--json"]);
            serde_json::from_slice::<Value>(&out.stdout)
                .is_ok_and(|s| s["cache"]["redirect"]["active"] == json!(false))
        },
    )
    .await;
    let (code, message, _) = cf.explained_cache(&report);
    assert_eq!(code, "cache_inactive", "{message}");
    assert!(
        message.contains("does not fit the cache redirect"),
        "{message}"
    );
    assert!(message.contains("went to GitHub"), "{message}");
}

/// How much of its blob the stalled save sends before it stalls.
const STALLED_MIB: u64 = 8;

/// The bytes staged under the cache's `uploads/` (uploads begun, not finalized).
fn staged_bytes(dir: &std::path::Path) -> u64 {
    let Ok(items) = std::fs::read_dir(dir) else {
        return 0;
    };
    items
        .flatten()
        .map(|item| match item.file_type() {
            Ok(kind) if kind.is_dir() => staged_bytes(&item.path()),
            _ => item.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_upload_leaves_no_entry_and_no_bytes_behind() {
    let Some(cf) =
        cache_fleet("cache::an_agent_killed_mid_upload_leaves_no_entry_and_no_bytes_behind").await
    else {
        return;
    };
    let fleet = &cf.fleet;
    let first = fleet.start_agent(&[]).await;
    let marker = cf.reports.join("stalled.marker");
    let stalled = cf.queue(
        "stalled",
        REPO,
        &default_branch(),
        &json!([{
            "op": "stall_upload",
            "key": "deps-killed",
            "mib": STALLED_MIB,
            "marker": marker,
            "stall_ms": 100_000,
        }]),
    );
    // The step has sent its bytes and stalls; the agent has staged some of them.
    let uploads = cf.dir.join("uploads");
    wait_until(JOB_TIMEOUT, "the save to stall midway", || {
        marker.is_file() && staged_bytes(&uploads) >= 1 << 20
    })
    .await;
    first.kill();
    let crashed = cf.disk();
    assert!(
        crashed.staged_files > 0,
        "the killed agent left no staged upload to recover: {crashed:?}"
    );
    assert_eq!(crashed.entries, 0, "a half upload became an entry");

    let _second = fleet.start_agent(&[]).await;
    let report = cf.finished("stalled", stalled).await;
    let stall = op(&report, 0);
    assert_eq!(stall["create"], json!(200), "{stall}");
    assert_eq!(stall["sent_mib"], json!(STALLED_MIB), "{stall}");
    assert!(
        stall["upload"]["status"].is_null(),
        "the stalled upload was answered: {stall}"
    );
    assert_eq!(
        cf.disk(),
        rm_cache::DiskReport {
            entries: 0,
            blob_files: 0,
            orphaned_blobs: 0,
            staged_files: 0,
        },
        "the restarted agent's cache kept something of the killed upload"
    );

    // A later job misses the key, and saves it anew: no reservation of the killed save is left.
    let later = cf
        .job(
            "after",
            REPO,
            &default_branch(),
            json!([
                {"op": "restore", "key": "deps-killed", "restore_keys": ["deps-"]},
                {"op": "save", "key": "deps-killed", "bytes": SMALL_BYTES},
            ]),
        )
        .await;
    assert_eq!(
        ran(&later, 0)["hit"],
        Value::Null,
        "a later job restored the killed upload"
    );
    assert_ne!(ran(&later, 1)["id"], json!(-1), "{later}");
    let after = cf.disk();
    assert_eq!(
        (after.entries, after.orphaned_blobs, after.staged_files),
        (1, 0, 0),
        "{after:?}"
    );
    // Nothing of either runner is left.
    assert!(fleet.all_cleaned());
    assert!(fleet.runtimes().is_empty(), "{:?}", fleet.runtimes());
    assert!(
        fleet.our_registrations().is_empty(),
        "{:?}",
        fleet.our_registrations()
    );
    assert_eq!(fleet.attempts().len(), 2, "one runner per job");
}
