//! The runner adapters with the fake runner package against the fake GitHub: a runtime made by
//! the workspace adapter, the listener started by the process adapter with a real JIT
//! configuration, a job taken, and the runtime removed; and a runner that hangs, forks and
//! plants a link is stopped with everything it started, its runtime removed, the link's target
//! intact.

#![allow(
    clippy::unwrap_used,
    reason = "a failed step in a test helper should fail the test loudly"
)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions, JobStatus, RunnerBehavior};
use rm_runner::process::{self, OsProcesses, ProcessState, StopOutcome};
use rm_runner::{Removal, RunnerRoot, Runtime, Spawned};
use secrecy::SecretString;

/// Generous bound for a runner that should exit on its own: tests fail rather than hang.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// Bound on waiting for the runner to reach a point.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Grace for the stop of a hanging runner.
const GRACE: Duration = Duration::from_millis(500);

const ATTEMPT: &str = "5e1f00d2-7a9b-4c3d-8e2f-0123456789ab";
const RUNNER_NAME: &str = "rm-testhost-5e1f00d27a9b";

/// The fake runner's binary. `cargo test --workspace` builds it beside this test; when only this
/// package is tested, cargo builds a dependency's library but never its binary, so build it here.
/// (Building it here even when present would resolve features for that one package and rebuild
/// half the dependency tree: 98 s in a clean CI run.)
fn fake_runner_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(binary) = rm_fake_runner::locate_binary() {
            return binary;
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .args(["build", "--quiet", "-p", "rm-fake-runner", "--bin"])
            .arg(rm_fake_runner::BINARY_NAME)
            .arg("--manifest-path")
            .arg(manifest);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build.status().unwrap();
        assert!(status.success(), "cannot build the fake runner");
        rm_fake_runner::locate_binary().unwrap()
    })
}

struct Setup {
    fake: FakeGithub,
    dir: tempfile::TempDir,
    root: RunnerRoot,
    runtime: Runtime,
}

async fn setup(behavior: RunnerBehavior) -> Setup {
    let binary = fake_runner_binary();
    let key = AppKeyPair::generate().unwrap();
    let fake = FakeGithub::start(FakeOptions::new(7, key.public_pem))
        .await
        .unwrap();
    fake.add_repo("acme/widgets");
    fake.set_runner_behavior(behavior);
    let dir = tempfile::tempdir().unwrap();
    let package = rm_fake_runner::assemble_package(binary, &dir.path().join("package")).unwrap();
    let root = RunnerRoot::open(&dir.path().join("runners")).unwrap();
    let runtime = root.create_ephemeral(ATTEMPT, &package).unwrap();
    Setup {
        fake,
        dir,
        root,
        runtime,
    }
}

fn jit(s: &Setup) -> SecretString {
    SecretString::from(
        s.fake
            .generate_jitconfig("acme", RUNNER_NAME, &["self-hosted", "linux"])
            .unwrap(),
    )
}

async fn await_file(path: &Path) {
    let deadline = tokio::time::Instant::now() + READY_WITHIN;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|line| process::parse_stat(&line).ok())
        .is_some_and(|stat| !stat.is_dead())
}

#[tokio::test]
async fn a_started_runner_takes_its_job_and_its_runtime_is_removed() {
    let s = setup(RunnerBehavior {
        idle_timeout_ms: Some(5_000),
        job_duration_ms: 50,
        ..RunnerBehavior::default()
    })
    .await;
    let job = s
        .fake
        .queue_job("acme/widgets", "build", &["self-hosted"])
        .unwrap();
    let Spawned {
        identity,
        mut child,
    } = OsProcesses.spawn(s.runtime.dir(), &jit(&s)).unwrap();

    let status = tokio::time::timeout(EXIT_WITHIN, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let job = s.fake.job(job).unwrap();
    assert_eq!(job.status, JobStatus::Completed);
    assert_eq!(job.runner_name.as_deref(), Some(RUNNER_NAME));
    assert!(
        s.runtime
            .dir()
            .join("_work/widgets/widgets/job.txt")
            .is_file()
    );

    assert_eq!(
        process::inspect(&OsProcesses, identity).unwrap(),
        ProcessState::Gone
    );
    let outcome = process::stop(&OsProcesses, identity, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: false });
    assert_eq!(
        s.root.remove_runtime(s.runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert!(!s.runtime.dir().exists());
}

#[tokio::test]
async fn a_hanging_runner_is_stopped_with_what_it_forked_and_cleaned_without_following_its_link() {
    let precious = {
        // Set up before the fake, which needs the path in the behaviour.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("precious.txt"), "keep me").unwrap();
        d
    };
    let s = setup(RunnerBehavior {
        hang: true,
        fork_background: true,
        plant_symlink: Some(precious.path().display().to_string()),
        ..RunnerBehavior::default()
    })
    .await;
    let Spawned {
        identity,
        mut child,
    } = OsProcesses.spawn(s.runtime.dir(), &jit(&s)).unwrap();

    let pid_file = s.runtime.dir().join("_diag/background.pid");
    await_file(&pid_file).await;
    await_file(&s.runtime.dir().join("_work/planted-link")).await;
    // The pid file is written right after the fork; wait until it is complete.
    let background: u32 = loop {
        if let Ok(pid) = std::fs::read_to_string(&pid_file).unwrap().trim().parse() {
            break pid;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(alive(background));
    assert_eq!(
        process::inspect(&OsProcesses, identity).unwrap(),
        ProcessState::Running
    );

    let outcome = process::stop(&OsProcesses, identity, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    let status = tokio::time::timeout(EXIT_WITHIN, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "{status:?}");
    assert!(!alive(background), "the forked process outlived the runner");

    assert_eq!(
        s.root.remove_runtime(s.runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert!(!s.runtime.dir().exists());
    assert_eq!(
        std::fs::read_to_string(precious.path().join("precious.txt")).unwrap(),
        "keep me"
    );
    assert!(s.dir.path().join("package/bin/Runner.Listener").is_file());
}

/// A runner GitHub refuses for its version says so in its own log and exits, as actions/runner
/// does; supervision reads those words from its `_diag` and concludes the attempt failed for
/// that reason, not as a runner that exited without a known cause (nor an idle exit: it was
/// registered and idle when it went).
#[tokio::test]
async fn a_runner_refused_for_its_version_is_concluded_as_such_from_its_own_log() {
    use rm_agent::lifecycle::{
        AttemptFacts, AttemptState, Conclusion, Decision, DiskUse, FailureReason,
        GithubObservation, JobEvidence, Observation, ProcessObservation, Timeouts,
        recovery_decision,
    };
    let s = setup(RunnerBehavior {
        version_refused: true,
        ..RunnerBehavior::default()
    })
    .await;
    let Spawned { mut child, .. } = OsProcesses.spawn(s.runtime.dir(), &jit(&s)).unwrap();
    let status = tokio::time::timeout(EXIT_WITHIN, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(1), "actions/runner's terminated error");

    let evidence = rm_agent::executor::evidence::read(s.runtime.dir());
    assert_eq!(evidence, JobEvidence::VersionRefused);
    let decision = recovery_decision(
        &AttemptFacts {
            state: AttemptState::Idle,
            state_changed_at_ms: rm_vocab::UnixMs::EPOCH,
            stop_intent: None,
        },
        &Observation {
            process: ProcessObservation::Exited,
            github: GithubObservation::Registered { busy: false },
            evidence,
            disk: DiskUse::Within,
            findings: rm_agent::lifecycle::Findings {
                exit: Some(rm_agent::lifecycle::ExitSeen::Code(1)),
                ..Default::default()
            },
        },
        &Timeouts::supervision(Duration::from_secs(300), Duration::from_secs(600)),
        rm_vocab::UnixMs::new(1_000),
    );
    assert_eq!(
        decision,
        Decision::Conclude(Conclusion::Failed(FailureReason::RunnerVersionRejected))
    );
    assert_eq!(
        s.root.remove_runtime(s.runtime.dir()).unwrap(),
        Removal::Removed
    );
}
