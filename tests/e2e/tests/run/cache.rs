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
//! - The control: a package whose worker holds `ACTIONS_RESULTS_URL` twice does not fit the
//!   redirect, so its job runs uncached: its step is given the fake's results service, and the
//!   fake records its cache calls (what the first test's "no cache call" would see had the
//!   agent's redirect not applied).
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

const LABELS: &[&str] = &["self-hosted", "cache"];

/// Another repository of the organization the policy serves.
const OTHER_REPO: &str = "acme/gadgets";

/// What job A saves: 64 MiB of random bytes.
const SAVED_BYTES: u64 = 64 << 20;

/// What the jobs' own later saves write.
const SMALL_BYTES: u64 = 1 << 20;

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
struct CacheFleet {
    fleet: Fleet,
    reports: PathBuf,
    /// The agent's cache service's port on the host's loopback.
    port: u16,
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

/// [`cache_fleet_with`] the package's own synthetic worker.
async fn cache_fleet(test: &str) -> Option<CacheFleet> {
    cache_fleet_with(test, None).await
}

/// A cached fleet; `worker`, when given, replaces the package's `bin/Runner.Worker.dll`.
async fn cache_fleet_with(test: &str, worker: Option<Vec<u8>>) -> Option<CacheFleet> {
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
    options.tail = format!(
        "\n[cache]\ndir = \"{dir}\"\nport = {port}\nmax_size = \"1GiB\"\nupstream = \"{upstream}\"\n",
        dir = fleet.setup.dir.path().join("cache").display(),
        upstream = fleet.fake.results_url(),
    );
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
    })
}

/// How long one job may take, runner start and cleanup included (a 64 MiB save is a few
/// seconds of tar and zstd on this 2-core machine).
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

impl CacheFleet {
    /// Queues job `name` in `repo` as `origin` with `plan` (the script's operations), waits until
    /// it is done and every runner cleaned, and returns its report.
    async fn job(&self, name: &str, repo: &str, origin: &JobOrigin, plan: Value) -> Value {
        std::fs::write(
            self.reports.join(format!("{name}.plan.json")),
            plan.to_string(),
        )
        .unwrap();
        let job = self
            .fleet
            .fake
            .queue_job_as(repo, name, LABELS, origin)
            .unwrap();
        wait_until(JOB_TIMEOUT, &format!("job {name} done"), || {
            self.fleet.completed(job) && self.fleet.all_cleaned()
        })
        .await;
        let path = self.reports.join(format!("{name}.json"));
        let report: Value = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(e) => panic!(
                "job {name} wrote no report {} ({e}); its conclusion: {:?}",
                path.display(),
                self.fleet.fake.job(job).and_then(|j| j.conclusion)
            ),
        };
        eprintln!("job {name}: {report:#}");
        report
    }

    /// The agent's service as a job's results URL.
    fn local_url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

/// The report's operation `n`.
fn op(report: &Value, n: usize) -> &Value {
    &report["ops"][n]
}

/// That operation `n` of `report` ran without an error.
fn ran(report: &Value, n: usize) -> &Value {
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

fn default_branch() -> JobOrigin {
    JobOrigin::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_share_a_cache_scoped_by_who_their_runner_is() {
    let Some(cf) = cache_fleet("cache::jobs_share_a_cache_scoped_by_who_their_runner_is").await
    else {
        return;
    };
    let fleet = &cf.fleet;
    let _agent = fleet.start_agent(&[]).await;

    // A: the default branch saves 64 MiB.
    let a = cf
        .job(
            "save-a",
            REPO,
            &default_branch(),
            json!([{"op": "save", "key": "deps-a", "bytes": SAVED_BYTES}]),
        )
        .await;
    let saved = ran(&a, 0);
    assert_ne!(saved["id"], json!(-1), "job A's save failed: {saved}");
    let a_digest = saved["sha256"].clone();
    assert!(a_digest.is_string());

    // B: another runner, later, restores it byte for byte.
    let b = cf
        .job(
            "restore-b",
            REPO,
            &default_branch(),
            json!([{"op": "restore", "key": "deps-a"}]),
        )
        .await;
    let restored = ran(&b, 0);
    assert_eq!(restored["hit"], json!("deps-a"), "job B missed A's entry");
    assert_eq!(restored["sha256"], a_digest, "job B restored other bytes");

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
        assert_eq!(
            (report["results_url"].as_str(), report["cache_url"].as_str()),
            (Some(cf.local_url().as_str()), Some(cf.local_url().as_str())),
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
}
