//! `rm-agent run` with `[runner] version` instead of `package_dir`, through the real binary and
//! the fake GitHub serving the fake runner package as an actions/runner release: the package is
//! downloaded (through the redirect to signed storage), verified, cached and run, a restart
//! finds it in the cache without a request, and a corrupted download is refused at start with
//! nothing cached.

use std::path::PathBuf;
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, REPO, wait_until};
use rm_fake_github::ReleaseOptions;

const LABELS: &[&str] = &["self-hosted", "linux"];
const VERSION: &str = "2.330.0";

/// Release requests (metadata, download, storage) the fake answered, as `STATUS PATH`.
fn release_requests(fleet: &Fleet) -> Vec<String> {
    fleet
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/releases/") || r.path.starts_with("/_release-assets/"))
        .map(|r| format!("{} {}", r.status, r.path))
        .collect()
}

fn packages_dir(fleet: &Fleet) -> PathBuf {
    fleet.setup.dir.path().join("data").join("packages")
}

/// What the package cache holds.
fn cached(fleet: &Fleet) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(packages_dir(fleet))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_version_is_downloaded_once_verified_cached_and_run() {
    let fleet = Fleet::start(FleetOptions {
        runner_version: Some(VERSION),
        ..FleetOptions::default()
    })
    .await;
    let agent = fleet.start_agent(&[]).await;
    let requests = release_requests(&fleet);
    assert_eq!(
        requests.len(),
        3,
        "metadata, redirect, storage: {requests:?}"
    );
    assert!(requests[0].starts_with("200 /repos/actions/runner/releases/tags/v2.330.0"));
    assert!(requests[1].starts_with("302 /actions/runner/releases/download/v2.330.0/"));
    assert!(requests[2].starts_with("200 /_release-assets/"));
    let names = cached(&fleet);
    assert_eq!(names.len(), 1, "one package, no leftovers: {names:?}");
    assert!(
        names[0].starts_with("actions-runner-") && names[0].ends_with(VERSION),
        "{names:?}"
    );
    assert!(
        packages_dir(&fleet)
            .join(&names[0])
            .join("bin/Runner.Listener")
            .is_file()
    );

    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(
        Duration::from_secs(60),
        "the job ran on the downloaded package",
        || fleet.completed(job) && fleet.all_cleaned(),
    )
    .await;
    assert!(agent.terminate().success());

    fleet.fake.clear_requests();
    let _agent = fleet.start_agent(&[]).await;
    let second = fleet.fake.queue_job(REPO, "again", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "the second job ran", || {
        fleet.completed(second) && fleet.all_cleaned()
    })
    .await;
    assert_eq!(
        release_requests(&fleet),
        Vec::<String>::new(),
        "the second start found the package in the cache"
    );
    assert_eq!(cached(&fleet), names);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_download_is_refused_at_start_and_nothing_is_cached() {
    let fleet = Fleet::start(FleetOptions {
        runner_version: Some(VERSION),
        runner_release: ReleaseOptions {
            corrupt: true,
            ..ReleaseOptions::default()
        },
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    let (status, stderr) = fleet.run_agent_until_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(1), "a runtime failure: {stderr}");
    assert!(
        stderr.contains("does not match its published SHA-256"),
        "the error says why: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(cached(&fleet), Vec::<String>::new(), "nothing cached");
    assert!(fleet.attempts().is_empty(), "no runner started");
    assert!(fleet.fake.runners().is_empty(), "no runner registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_in_a_terminal_shows_a_progress_bar() {
    use std::os::unix::process::CommandExt as _;
    let fleet = Fleet::start(FleetOptions {
        runner_version: Some(VERSION),
        ..FleetOptions::default()
    })
    .await;
    // `script` gives the agent a pseudo-terminal and records what it draws there.
    let agent = fleet.setup.command(&["run"]);
    let quoted: Vec<String> = std::iter::once(agent.get_program())
        .chain(agent.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    let typescript = fleet.setup.dir.path().join("terminal.txt");
    let mut script = std::process::Command::new("script");
    script
        .args(["-q", "-f", "-e", "-c", &quoted.join(" ")])
        .arg(&typescript)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0);
    for (key, value) in agent.get_envs() {
        match value {
            Some(value) => script.env(key, value),
            None => script.env_remove(key),
        };
    }
    let mut child = script.spawn().unwrap();
    let drawn = || std::fs::read_to_string(&typescript).unwrap_or_default();
    // The bar's last redraw reaches the typescript after the package is cached: wait for it
    // too, or a kill in between leaves a screen with only the first frame (seen in CI).
    wait_until(
        Duration::from_secs(30),
        "the package downloaded and its bar drawn",
        || cached(&fleet).len() == 1 && drawn().contains("eta") && drawn().contains("[==="),
    )
    .await;
    let group = format!("-{}", child.id());
    std::process::Command::new("kill")
        .args(["-KILL", "--", &group])
        .status()
        .unwrap();
    let _ = child.wait();

    let screen = drawn();
    assert!(
        screen.contains("actions-runner-") && screen.contains(VERSION),
        "the bar names the package: {screen}"
    );
    assert!(screen.contains("[==="), "a bar was drawn: {screen}");
    assert!(
        !screen.contains("downloading the runner package"),
        "log lines are for non-terminals: {screen}"
    );
}

/// The runtime directory of the runner that took `job`, once it has.
fn runtime_of(fleet: &Fleet, job: u64) -> Option<PathBuf> {
    let name = fleet.fake.job(job)?.runner_name?;
    fleet
        .attempts()
        .into_iter()
        .find(|a| a.runner_name == name)
        .map(|a| a.runtime_dir)
}

/// The stored trees of the isolated package store (one per package content).
fn stored(fleet: &Fleet) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fleet.runner_root.join(".rm-package"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// How many times the fake served the bytes of `version`'s package.
fn downloads_of(fleet: &Fleet, version: &str) -> usize {
    fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.status == 200 && r.path.starts_with(&format!("/_release-assets/{version}/")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_follows_a_new_release_while_a_runner_runs_on_the_old_one() {
    const OLD: &str = "2.330.0";
    const NEW: &str = "2.331.0";
    let fleet = Fleet::start(FleetOptions {
        runner_version: Some("latest"),
        release_check_interval: Some("5s"),
        ..FleetOptions::default()
    })
    .await;
    // Two packages that differ (a file naming the version), so each has its own stored tree.
    let package_of = |version: &str| {
        let dir = fleet.setup.dir.path().join(format!("package-{version}"));
        let package =
            rm_fake_runner::assemble_package(&rm_e2e::binary(rm_fake_runner::BINARY_NAME), &dir)
                .unwrap();
        std::fs::write(package.join("VERSION"), version).unwrap();
        rm_e2e::fleet::tarball(&package)
    };
    fleet.fake.publish_runner_release(OLD, package_of(OLD));
    // The first runner's job lasts until the new release is followed and a second runner runs.
    fleet
        .fake
        .set_runner_behavior(rm_fake_github::RunnerBehavior {
            job_duration_ms: 600_000,
            ..Default::default()
        });
    let agent = fleet.start_agent(&[]).await;
    assert_eq!(cached(&fleet).len(), 1, "{:?}", cached(&fleet));
    let first = fleet.fake.queue_job(REPO, "long", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "the first job runs", || {
        runtime_of(&fleet, first).is_some_and(|rt| rt.join("VERSION").is_file())
    })
    .await;
    let first_runtime = runtime_of(&fleet, first).unwrap();
    assert_eq!(
        std::fs::read_to_string(first_runtime.join("VERSION")).unwrap(),
        OLD
    );
    let old_trees = stored(&fleet);
    assert_eq!(old_trees.len(), 1, "{old_trees:?}");

    // A new release while the first runner runs: followed within a check interval.
    fleet.fake.publish_runner_release(NEW, package_of(NEW));
    let new_name = |names: &[String]| names.iter().any(|n| n.ends_with(NEW));
    wait_until(
        Duration::from_secs(90),
        "the new release is downloaded and stored",
        || new_name(&cached(&fleet)) && stored(&fleet).len() == 2,
    )
    .await;
    // The next runner starts from the new package, the running one stays on its own.
    fleet
        .fake
        .set_runner_behavior(rm_fake_github::RunnerBehavior {
            job_duration_ms: 2_000,
            ..Default::default()
        });
    let second = fleet.fake.queue_job(REPO, "next", LABELS).unwrap();
    wait_until(Duration::from_secs(60), "the second job runs", || {
        runtime_of(&fleet, second).is_some_and(|rt| rt.join("VERSION").is_file())
    })
    .await;
    let second_runtime = runtime_of(&fleet, second).unwrap();
    assert_eq!(
        std::fs::read_to_string(second_runtime.join("VERSION")).unwrap(),
        NEW
    );
    wait_until(Duration::from_secs(60), "the second job completes", || {
        fleet.completed(second)
    })
    .await;
    assert!(!fleet.completed(first), "the first job still runs");
    // Still in use by the first runner: the old package is kept.
    tokio::time::sleep(latest_prune_wait()).await;
    assert!(
        cached(&fleet).iter().any(|n| n.ends_with(OLD)),
        "the old package is kept while a runner runs on it: {:?}",
        cached(&fleet)
    );
    assert!(
        stored(&fleet).contains(&old_trees[0]),
        "{:?}",
        stored(&fleet)
    );
    assert_eq!(
        std::fs::read_to_string(first_runtime.join("VERSION")).unwrap(),
        OLD
    );

    // The first runner finishes on the old package; then the old package goes.
    std::fs::write(
        first_runtime
            .join("_diag")
            .join(rm_fake_runner::FINISH_FILE),
        "",
    )
    .unwrap();
    wait_until(
        Duration::from_secs(90),
        "the old package is removed once unused",
        || fleet.all_cleaned() && cached(&fleet).len() == 1 && stored(&fleet).len() == 1,
    )
    .await;
    assert!(new_name(&cached(&fleet)), "{:?}", cached(&fleet));
    assert!(!stored(&fleet).contains(&old_trees[0]));
    assert_eq!(
        downloads_of(&fleet, OLD),
        1,
        "{:?}",
        release_requests(&fleet)
    );
    assert_eq!(
        downloads_of(&fleet, NEW),
        1,
        "{:?}",
        release_requests(&fleet)
    );
    // Asked conditionally: an unchanged latest release is a 304, the new one a 200.
    let asked: Vec<u16> = fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.path == "/repos/actions/runner/releases/latest")
        .map(|r| r.status)
        .collect();
    assert!(asked.contains(&304) && asked.contains(&200), "{asked:?}");
    assert!(agent.terminate().success());

    // A restart asks GitHub again and finds the latest in the cache: nothing downloaded.
    fleet.fake.clear_requests();
    let _agent = fleet.start_agent(&[]).await;
    let third = fleet.fake.queue_job(REPO, "after-restart", LABELS).unwrap();
    wait_until(
        Duration::from_secs(60),
        "a job after the restart runs",
        || fleet.completed(third) && fleet.all_cleaned(),
    )
    .await;
    assert_eq!(
        downloads_of(&fleet, NEW),
        0,
        "{:?}",
        release_requests(&fleet)
    );
    assert!(
        fleet
            .fake
            .requests()
            .iter()
            .any(|r| r.path == "/repos/actions/runner/releases/latest"),
        "the start asked GitHub for its latest release"
    );
}

/// Longer than the follower's sweep of superseded packages (10 s), so a package kept is kept
/// by a decision, not by a sweep yet to come.
fn latest_prune_wait() -> Duration {
    Duration::from_secs(12)
}
