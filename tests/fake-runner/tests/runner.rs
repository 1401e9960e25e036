//! The fake runner package run as rm runs a runner: `bin/Runner.Listener run` in its runtime
//! directory with the JIT configuration in the environment, against the fake GitHub.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rm_fake_github::{AppKeyPair, CrashPoint, FakeGithub, FakeOptions, RunnerBehavior};
use rm_vocab::JobId;
use tokio::process::{Child, Command};

/// Generous bound for a runner that should exit on its own: tests fail rather than hang.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

struct Setup {
    fake: FakeGithub,
    _dir: tempfile::TempDir,
    runtime: PathBuf,
}

async fn setup() -> Setup {
    let key = AppKeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeGithub::start(FakeOptions::new(9, key.public_pem))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fake.add_repo("acme/widgets");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let runtime = dir.path().join("runtime");
    rm_fake_runner::assemble_package(Path::new(env!("CARGO_BIN_EXE_rm-fake-runner")), &runtime)
        .unwrap_or_else(|e| panic!("{e:#}"));
    Setup {
        fake,
        _dir: dir,
        runtime,
    }
}

fn spawn(s: &Setup, name: &str) -> Child {
    let jit = s
        .fake
        .generate_jitconfig("acme", name, &["self-hosted", "linux"])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut command = Command::new(s.runtime.join("bin").join("Runner.Listener"));
    command
        .arg("run")
        .current_dir(&s.runtime)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ACTIONS_RUNNER_INPUT_JITCONFIG", jit)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // `ETXTBSY`: another test of this binary, on another thread, forked while this one's
    // package was still being written, and its child holds the write descriptor until it
    // execs. It lets go within moments.
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < SPAWN_TRIES => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            spawned => return spawned.unwrap_or_else(|e| panic!("{e}")),
        }
    }
}

/// Linux's "text file busy".
const ETXTBSY: i32 = 26;
/// How often a spawn that met [`ETXTBSY`] is tried again.
const SPAWN_TRIES: u32 = 40;

async fn exit_code(child: &mut Child) -> i32 {
    let status = tokio::time::timeout(EXIT_WITHIN, child.wait()).await;
    let status = status.unwrap_or_else(|_| panic!("runner did not exit"));
    status.ok().and_then(|s| s.code()).unwrap_or(-1)
}

fn diag_logs(runtime: &Path, prefix: &str) -> usize {
    std::fs::read_dir(runtime.join("_diag"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

fn quick() -> RunnerBehavior {
    RunnerBehavior {
        idle_timeout_ms: Some(300),
        job_duration_ms: 50,
        ..RunnerBehavior::default()
    }
}

#[tokio::test]
async fn a_runner_takes_one_job_and_exits() {
    let s = setup().await;
    s.fake.set_runner_behavior(quick());
    let job = s
        .fake
        .queue_job("acme/widgets", "build", &["self-hosted"])
        .unwrap_or_else(|e| panic!("{e}"));
    s.fake
        .set_ephemeral_lag(Duration::from_secs(600), Duration::from_secs(600));
    let mut child = spawn(&s, "rm-h-000000000001");
    assert_eq!(exit_code(&mut child).await, 0);
    let job = s.fake.job(job).unwrap_or_else(|| panic!("job gone"));
    assert_eq!(job.status, rm_fake_github::JobStatus::Completed);
    assert_eq!(job.conclusion.as_deref(), Some("success"));
    assert_eq!(job.runner_name.as_deref(), Some("rm-h-000000000001"));
    assert!(s.runtime.join("_work/widgets/widgets/job.txt").is_file());
    assert_eq!(diag_logs(&s.runtime, "Runner_"), 1);
    assert_eq!(diag_logs(&s.runtime, "Worker_"), 1);
    // Ephemeral: GitHub still lists it busy right after its job, and removes it itself once
    // its lag is over (a short one here).
    assert!(
        s.fake.runners().iter().all(|r| r.busy),
        "listed busy after its job"
    );
    s.fake.set_ephemeral_lag(Duration::ZERO, Duration::ZERO);
    assert!(
        s.fake.runners().is_empty(),
        "removed by GitHub after its lag"
    );
    assert_eq!(s.fake.expired_runners(), ["rm-h-000000000001"]);
}

#[tokio::test]
async fn a_runner_told_to_leaves_a_checkout_of_that_many_files() {
    let s = setup().await;
    s.fake.set_runner_behavior(RunnerBehavior {
        checkout_files: 601,
        ..quick()
    });
    s.fake
        .queue_job("acme/widgets", "checkout", &["self-hosted"])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut child = spawn(&s, "rm-h-000000000009");
    assert_eq!(exit_code(&mut child).await, 0);
    let src = s.runtime.join("_work/widgets/widgets/src");
    let dirs: Vec<_> = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|d| d.unwrap_or_else(|e| panic!("{e}")).path())
        .collect();
    // 250 files a directory: 601 make three.
    assert_eq!(dirs.len(), 3);
    let files: usize = dirs
        .iter()
        .map(|d| std::fs::read_dir(d).map_or(0, Iterator::count))
        .sum();
    assert_eq!(files, 601);
    let done = std::fs::read_to_string(
        s.runtime
            .join("_diag")
            .join(rm_fake_runner::CHECKOUT_DONE_FILE),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(done.starts_with("601 files in "), "{done}");
}

/// Longer than the 2 s after which the fake runner used to give up on its own.
const LONGER_THAN_THE_OLD_IDLE_EXIT: Duration = Duration::from_secs(3);

#[tokio::test]
async fn by_default_a_runner_waits_for_a_job_until_one_comes() {
    let s = setup().await;
    let mut child = spawn(&s, "rm-h-000000000005");
    let online = async {
        while !s.fake.runners().iter().any(|r| r.online) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(EXIT_WITHIN, online)
        .await
        .unwrap_or_else(|_| panic!("the runner never registered"));
    tokio::time::sleep(LONGER_THAN_THE_OLD_IDLE_EXIT).await;
    assert!(
        child.try_wait().ok().flatten().is_none(),
        "a runner without a job gave up by itself"
    );
    let job = s
        .fake
        .queue_job("acme/widgets", "late", &["self-hosted"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exit_code(&mut child).await, 0);
    assert_eq!(
        s.fake.job(job).map(|j| j.status),
        Some(rm_fake_github::JobStatus::Completed)
    );
}

#[tokio::test]
async fn an_idle_runner_exits_and_stays_registered_offline() {
    let s = setup().await;
    s.fake.set_runner_behavior(quick());
    let mut child = spawn(&s, "rm-h-000000000002");
    assert_eq!(exit_code(&mut child).await, 0);
    assert_eq!(diag_logs(&s.runtime, "Runner_"), 1);
    assert_eq!(diag_logs(&s.runtime, "Worker_"), 0);
    assert!(!s.runtime.join("_work").exists());
    let runners = s.fake.runners();
    assert_eq!(runners.len(), 1);
    assert!(!runners[0].online, "offline until someone deletes it");
    let requests = s.fake.requests();
    assert!(requests.iter().all(|r| {
        r.body
            .as_ref()
            .is_none_or(|b| b.get("token").is_none_or(|t| t == "<redacted>"))
    }));
    let spoken: Vec<String> = requests.into_iter().map(|r| r.path).collect();
    assert!(
        spoken.iter().any(|p| p.ends_with("/register")),
        "{spoken:?}"
    );
    assert!(spoken.iter().any(|p| p.ends_with("/exit")), "{spoken:?}");
}

#[tokio::test]
async fn a_runner_crashes_when_told_to() {
    let s = setup().await;
    for (crash, name) in [
        (CrashPoint::AfterRegister, "rm-h-c1"),
        (CrashPoint::DuringJob, "rm-h-c2"),
    ] {
        s.fake.set_runner_behavior_for(
            name,
            RunnerBehavior {
                crash: Some(crash),
                ..quick()
            },
        );
    }
    let mut first = spawn(&s, "rm-h-c1");
    assert_eq!(exit_code(&mut first).await, 3);
    let job = s
        .fake
        .queue_job("acme/widgets", "build", &["linux"])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut second = spawn(&s, "rm-h-c2");
    assert_eq!(exit_code(&mut second).await, 3);
    let job = s.fake.job(job).unwrap_or_else(|| panic!("job gone"));
    assert_eq!(
        job.status,
        rm_fake_github::JobStatus::InProgress,
        "left running by the crash"
    );
}

#[tokio::test]
async fn a_runner_hangs_forks_and_plants_symlinks_when_told_to() {
    let s = setup().await;
    let target = s
        .runtime
        .parent()
        .map(|p| p.join("outside"))
        .unwrap_or_default();
    std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("{e}"));
    s.fake.set_runner_behavior(RunnerBehavior {
        hang: true,
        fork_background: true,
        plant_symlink: Some(target.display().to_string()),
        ..quick()
    });
    let mut child = spawn(&s, "rm-h-000000000003");
    // Well past its idle time it is still running.
    let waited = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
    assert!(waited.is_err(), "a hanging runner exited: {waited:?}");
    let link = s.runtime.join("_work/planted-link");
    let meta = std::fs::symlink_metadata(&link).unwrap_or_else(|e| panic!("{e}"));
    assert!(meta.file_type().is_symlink());
    assert_eq!(std::fs::read_link(&link).ok(), Some(target));
    let pid = std::fs::read_to_string(s.runtime.join("_diag/background.pid"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        Path::new(&format!("/proc/{}", pid.trim())).exists(),
        "background process alive"
    );
    child.kill().await.unwrap_or_else(|e| panic!("{e}"));
    // Clean up the background process this test asked for.
    let _ = std::process::Command::new("kill").arg(pid.trim()).status();
}

#[tokio::test]
async fn the_listener_insists_on_run_and_its_environment() {
    let s = setup().await;
    let listener = s.runtime.join("bin").join("Runner.Listener");
    let status = Command::new(&listener).arg("configure").status().await;
    assert_eq!(status.ok().and_then(|s| s.code()), Some(2));
    let status = Command::new(&listener)
        .arg("run")
        .env_remove("ACTIONS_RUNNER_INPUT_JITCONFIG")
        .current_dir(&s.runtime)
        .status()
        .await;
    assert_eq!(status.ok().and_then(|s| s.code()), Some(1));
}

#[test]
fn the_package_has_the_listener_and_no_work_folder() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pkg = rm_fake_runner::assemble_package(
        Path::new(env!("CARGO_BIN_EXE_rm-fake-runner")),
        dir.path(),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(pkg.join("bin/Runner.Listener").is_file());
    assert!(pkg.join("run.sh").is_file());
    assert!(!pkg.join("_work").exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode =
            std::fs::metadata(pkg.join("bin/Runner.Listener")).map(|m| m.permissions().mode());
        assert_eq!(mode.ok().map(|m| m & 0o111), Some(0o111));
    }
}

/// The path rm takes, minus the agent: the client asks for a JIT configuration, the runner
/// gets it in its environment only, takes the queued job, and GitHub forgets the runner.
#[tokio::test]
async fn a_jit_config_from_the_client_runs_a_job_end_to_end() {
    use rm_github::types::JitRequest;
    use rm_github::{ClientConfig, GithubClient, Target};
    use secrecy::ExposeSecret;

    let key = AppKeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeGithub::start(FakeOptions::new(31, key.public_pem.clone()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fake.add_repo("acme/widgets");
    fake.set_runner_behavior(quick());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let runtime = dir.path().join("0123456789ab");
    rm_fake_runner::assemble_package(Path::new(env!("CARGO_BIN_EXE_rm-fake-runner")), &runtime)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let client = GithubClient::new(ClientConfig::new(
        fake.api_url(),
        31,
        key.private_pem.clone(),
    ))
    .unwrap_or_else(|e| panic!("{e:#}"));
    let target: Target = "acme".parse().unwrap_or_else(|e| panic!("{e}"));
    let job = fake
        .queue_job("acme/widgets", "build", &["self-hosted", "linux"])
        .unwrap_or_else(|e| panic!("{e}"));
    let request = JitRequest {
        name: "rm-host-0123456789ab".into(),
        runner_group_id: 1,
        labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
        work_folder: "_work".into(),
    };
    // Busy for long enough after the job that the checks below see it busy.
    fake.set_ephemeral_lag(Duration::from_secs(600), Duration::from_secs(600));
    let jit = client
        .generate_jitconfig(&target, &request)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(runtime.join("bin/Runner.Listener"))
        .arg("run")
        .current_dir(&runtime)
        .env(
            "ACTIONS_RUNNER_INPUT_JITCONFIG",
            jit.encoded_jit_config.expose_secret(),
        )
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exit_code(&mut child).await, 0);
    let done = client
        .get_job("acme", "widgets", JobId::try_from(job).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(done.status, "completed");
    assert_eq!(done.runner_name.as_deref(), Some("rm-host-0123456789ab"));
    assert_eq!(done.runner_id, Some(jit.runner.id));
    // As on GitHub, the finished ephemeral runner is still listed busy and cannot be deleted
    // (422); once GitHub lets go of it a DELETE removes it (204), and then it is gone (404).
    let left = client
        .list_runners(&target)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        left.value.len() == 1 && left.value[0].busy,
        "{:?}",
        left.value
    );
    let id = jit.runner.id;
    let busy = client.delete_runner(&target, id).await;
    assert!(
        matches!(busy, Err(rm_github::GithubError::Unprocessable { .. })),
        "{busy:?}"
    );
    // GitHub lets go of the runner (its busy lag over at once: no sleeping in the test).
    fake.set_ephemeral_lag(Duration::ZERO, Duration::from_secs(600));
    let removed = client.delete_runner(&target, id).await;
    assert!(removed.is_ok(), "{removed:?}");
    let gone = client.delete_runner(&target, id).await;
    assert!(
        matches!(gone, Err(rm_github::GithubError::NotFound { .. })),
        "{gone:?}"
    );
    let left = client
        .list_runners(&target)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(left.value.is_empty(), "{:?}", left.value);
    assert!(fake.expired_runners().is_empty(), "deleted, not expired");
}
