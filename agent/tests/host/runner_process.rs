//! The runner process adapter with real processes: a shell script stands in as
//! `bin/Runner.Listener` and shows what it was given (argv, environment, working directory,
//! process group); stops reach hanging runners and what they left in the background; and a
//! process whose start time does not match the identity is never signalled.

#![allow(
    clippy::unwrap_used,
    reason = "a failed step in a test helper should fail the test loudly"
)]

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::time::Duration;

use rm_runner::process::{
    self, INHERITED_ENV, JIT_ENV, LISTENER, OsProcesses, ProcessIdentity, ProcessState,
    StopOutcome, TMP_ENV, parse_stat,
};
use rm_runner::{RunnerChild, RunnerRoot, Runtime, Spawned};
use secrecy::SecretString;

/// A JIT configuration shaped like the real one (base64 JSON); tests look for it everywhere.
const JIT: &str = "eyJzZWNyZXQiOiJnaHBfRE9fTk9UX0xFQUsiLCJydW5uZXIiOiJybS10ZXN0In0=";

/// Bound on waiting for a script to reach a point: a test fails rather than hangs.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Grace for stops in tests: short, so a runner that ignores SIGTERM costs little.
const GRACE: Duration = Duration::from_millis(200);

// The scripts give up after about a minute, so a failed test leaves nothing running for long.

/// Writes what it was given, says it is ready, and waits to be released; exits 7.
const PROBE: &str = r#"#!/bin/sh
printf '%s\n' "$#" "$@" > argv.txt
env > env.txt
touch ready
i=0
while [ ! -e release ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
exit 7
"#;

/// Ignores SIGTERM, leaves a background process behind, and does not exit on its own.
const HANGS_AND_FORKS: &str = r#"#!/bin/sh
trap '' TERM
sleep 60 &
echo $! > background.pid
touch ready
i=0
while [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done
"#;

/// Leaves a background process that ignores SIGTERM, then exits on its own.
const EXITS_LEAVING_A_CHILD: &str = r#"#!/bin/sh
(trap '' TERM; exec sleep 60) &
echo $! > background.pid
exit 0
"#;

/// Exits cleanly on SIGTERM.
const POLITE: &str = r#"#!/bin/sh
trap 'exit 0' TERM
touch ready
i=0
while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
exit 3
"#;

struct Setup {
    _dir: tempfile::TempDir,
    runtime: Runtime,
}

/// A runtime made by the workspace adapter from a package whose listener is `script`.
fn setup(script: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("package");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    let listener = package.join(LISTENER);
    std::fs::write(&listener, script).unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = RunnerRoot::open(&dir.path().join("runners")).unwrap();
    let runtime = root.create_ephemeral("00000000000a", &package).unwrap();
    Setup { _dir: dir, runtime }
}

fn spawn(s: &Setup) -> Spawned<RunnerChild> {
    OsProcesses
        .spawn(s.runtime.dir(), &SecretString::from(JIT))
        .unwrap()
}

/// Waits until `path` exists; panics after [`READY_WITHIN`].
fn await_file(path: &Path) {
    let deadline = std::time::Instant::now() + READY_WITHIN;
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn nul_separated(bytes: Vec<u8>) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect()
}

fn proc_file(pid: u32, name: &str) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/{name}")).unwrap()
}

fn environ(pid: u32) -> Vec<(String, String)> {
    nul_separated(proc_file(pid, "environ"))
        .into_iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// Whether a process that is not ours to reap is still running (a reparented zombie is not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|line| parse_stat(&line).ok())
        .is_some_and(|stat| !stat.is_dead())
}

fn identity_of(pid: u32) -> ProcessIdentity {
    let stat = parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap()).unwrap();
    ProcessIdentity {
        pid,
        start_time: stat.start_time,
    }
}

#[tokio::test]
async fn a_runner_gets_run_its_runtime_and_the_jit_in_its_environment_only() {
    // The shared capture: it also holds a second dispatcher, without which a sibling test
    // thread reaching the adapters' callsites first caches them as disabled for this one too
    // (tracing's one-dispatcher shortcut), and the capture comes back empty.
    let logs = crate::log_capture::LogCapture::start(tracing::Level::TRACE);

    let s = setup(PROBE);
    let dir = s.runtime.dir();
    let Spawned {
        identity,
        mut child,
    } = spawn(&s);
    await_file(&dir.join("ready"));
    let pid = identity.pid;

    // argv: the interpreter, the listener, then exactly `run`.
    let cmdline = nul_separated(proc_file(pid, "cmdline"));
    let listener = dir.join(LISTENER).display().to_string();
    assert_eq!(&cmdline[1..], [listener.as_str(), "run"], "{cmdline:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("argv.txt")).unwrap(),
        "1\nrun\n"
    );
    assert!(cmdline.iter().all(|arg| !arg.contains(JIT)));

    // The environment: the JIT in its variable, TMPDIR & co. in the runtime, nothing else but
    // allow-listed names.
    let env = environ(pid);
    assert!(env.contains(&(JIT_ENV.to_owned(), JIT.to_owned())));
    let tmp = s.runtime.tmp().display().to_string();
    for name in TMP_ENV {
        assert!(env.contains(&(name.to_owned(), tmp.clone())), "{name}");
    }
    for (key, value) in &env {
        assert!(
            key == JIT_ENV
                || TMP_ENV.contains(&key.as_str())
                || INHERITED_ENV.contains(&key.as_str()),
            "{key} is not allow-listed"
        );
        assert!(
            key == JIT_ENV || !value.contains(JIT),
            "{key} carries the JIT"
        );
    }
    assert!(env.iter().any(|(k, _)| k == "PATH"));

    // Working directory and process group.
    assert_eq!(std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(), dir);
    let stat = parse_stat(&String::from_utf8(proc_file(pid, "stat")).unwrap()).unwrap();
    assert_eq!(stat.pgrp, pid, "the runner leads its own process group");
    assert_eq!(stat.start_time, identity.start_time);
    assert_eq!(
        process::inspect(&OsProcesses, identity).unwrap(),
        ProcessState::Running
    );

    // Nothing the agent holds or says about the runner shows the JIT.
    assert!(!format!("{identity:?} {child:?}").contains(JIT));

    std::fs::write(dir.join("release"), "").unwrap();
    let status = child.wait().await.unwrap();
    assert_eq!(status.code(), Some(7));
    assert_eq!(
        process::inspect(&OsProcesses, identity).unwrap(),
        ProcessState::Gone
    );
    let outcome = process::stop(&OsProcesses, identity, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: false });

    // The listener itself saw the JIT (the file is its own doing); the agent's logs did not.
    assert!(
        std::fs::read_to_string(dir.join("env.txt"))
            .unwrap()
            .contains(JIT)
    );
    let logs = logs.text();
    assert!(logs.contains("runner started"), "the capture works: {logs}");
    assert!(!logs.contains(JIT), "{logs}");
}

#[tokio::test]
async fn a_failed_start_names_the_listener_but_not_the_jit() {
    let dir = tempfile::tempdir().unwrap();
    let err = OsProcesses
        .spawn(dir.path(), &SecretString::from(JIT))
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("Runner.Listener"), "{shown}");
    assert!(!shown.contains(JIT), "{shown}");
}

/// Names of the agent's secrets set for the re-run of the test below, and their values.
const AGENT_SECRETS: [(&str, &str); 5] = [
    ("RM_WEBHOOK_SECRET", "whsec-do-not-leak-1"),
    (
        "RM_GITHUB_PRIVATE_KEY",
        "-----BEGIN RSA PRIVATE KEY----- do-not-leak-2",
    ),
    ("RM_RELAY_TOKEN", "relay-do-not-leak-3"),
    ("RM_SOMETHING_NEW", "future-do-not-leak-4"),
    ("GITHUB_TOKEN", "ghp_do-not-leak-5"),
];

/// Where the re-run says it got to the end (not `RM_`-prefixed: the runner must not see it
/// either, and it is not on the allow-list).
const REEXEC_MARKER: &str = "RUNNER_TEST_REEXEC_MARKER";

/// The agent's own secrets are in its environment; they must not reach the runner. The test
/// cannot put them in its own environment (that needs `unsafe`), so it runs itself again with
/// them set, and the re-run does the real check.
#[tokio::test]
async fn the_agents_secrets_never_reach_the_runner() {
    let Some(marker) = std::env::var_os(REEXEC_MARKER) else {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("reached-the-end");
        let mut rerun = std::process::Command::new(std::env::current_exe().unwrap());
        rerun
            .args([
                "--exact",
                "runner_process::the_agents_secrets_never_reach_the_runner",
                "--nocapture",
            ])
            .env(REEXEC_MARKER, &marker)
            .env("LANG", "C.UTF-8");
        for (key, value) in AGENT_SECRETS {
            rerun.env(key, value);
        }
        let output = rerun.output().unwrap();
        assert!(
            output.status.success(),
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(marker.is_file(), "the re-run did not get to the end");
        return;
    };

    // The re-run: the secrets are really in this process's environment.
    for (key, value) in AGENT_SECRETS {
        assert_eq!(std::env::var(key).ok().as_deref(), Some(value), "{key}");
    }
    let s = setup(PROBE);
    let Spawned {
        identity,
        mut child,
    } = spawn(&s);
    await_file(&s.runtime.dir().join("ready"));
    let environ_bytes = proc_file(identity.pid, "environ");
    let env = environ(identity.pid);
    std::fs::write(s.runtime.dir().join("release"), "").unwrap();
    child.wait().await.unwrap();

    assert!(
        env.contains(&("LANG".to_owned(), "C.UTF-8".to_owned())),
        "{env:?}"
    );
    assert!(env.iter().all(|(k, _)| !k.starts_with("RM_")), "{env:?}");
    assert!(env.iter().all(|(k, _)| k != REEXEC_MARKER), "{env:?}");
    let seen = String::from_utf8_lossy(&environ_bytes);
    for (key, value) in AGENT_SECRETS {
        assert!(!seen.contains(value), "{key} reached the runner");
    }
    std::fs::write(marker, "ok").unwrap();
}

#[tokio::test]
async fn a_stop_kills_a_hanging_runner_and_its_background_process() {
    let s = setup(HANGS_AND_FORKS);
    let Spawned {
        identity,
        mut child,
    } = spawn(&s);
    let background_file = s.runtime.dir().join("background.pid");
    await_file(&s.runtime.dir().join("ready"));
    let background: u32 = std::fs::read_to_string(&background_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(background));
    let background_stat =
        parse_stat(&std::fs::read_to_string(format!("/proc/{background}/stat")).unwrap()).unwrap();
    assert_eq!(background_stat.pgrp, identity.pid, "in the runner's group");

    let outcome = process::stop(&OsProcesses, identity, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    let status = child.wait().await.unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "SIGTERM was ignored: SIGKILL ended it"
    );
    assert!(
        !alive(background),
        "the background process outlived the runner"
    );
}

#[tokio::test]
async fn a_runner_that_exits_on_sigterm_is_not_killed() {
    let s = setup(POLITE);
    let Spawned {
        identity,
        mut child,
    } = spawn(&s);
    await_file(&s.runtime.dir().join("ready"));
    // A long grace: the runner must be gone well before it, on SIGTERM alone.
    let outcome = process::stop(&OsProcesses, identity, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    let status = child.wait().await.unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test]
async fn what_an_exited_runner_left_behind_is_stopped() {
    let s = setup(EXITS_LEAVING_A_CHILD);
    let Spawned {
        identity,
        mut child,
    } = spawn(&s);
    let status = child.wait().await.unwrap();
    assert_eq!(status.code(), Some(0));
    let background_file = s.runtime.dir().join("background.pid");
    await_file(&background_file);
    let background: u32 = std::fs::read_to_string(&background_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(background), "the leftover is running before the stop");
    assert_eq!(
        process::inspect(&OsProcesses, identity).unwrap(),
        ProcessState::Gone
    );

    let outcome = process::stop(&OsProcesses, identity, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    assert!(!alive(background), "the leftover survived the stop");
}

#[tokio::test]
async fn a_process_whose_start_time_differs_is_never_signalled() {
    // A stranger that leads its own process group, so a group signal would reach it.
    let mut stranger = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let real = identity_of(stranger.id());
    let recycled = ProcessIdentity {
        pid: real.pid,
        start_time: real.start_time - 1,
    };

    assert_eq!(
        process::inspect(&OsProcesses, recycled).unwrap(),
        ProcessState::Gone
    );
    let outcome = process::stop(&OsProcesses, recycled, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::NotOurs);
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "the stranger was signalled"
    );
    assert!(alive(real.pid));

    // The same process under its true identity is stopped: the check above could have failed.
    assert_eq!(
        process::inspect(&OsProcesses, real).unwrap(),
        ProcessState::Running
    );
    let outcome = process::stop(&OsProcesses, real, GRACE).await.unwrap();
    assert_eq!(outcome, StopOutcome::Stopped { signalled: true });
    assert_eq!(stranger.wait().unwrap().signal(), Some(15));
}

/// A policy's `env_file` reaches the runner through the backend that starts it: its variables
/// beside the launch contract's own (an operator's `LANG` replaces the inherited one), the
/// contract's `TMPDIR` and JIT variable untouched; and a file that names a reserved variable
/// is refused by line before any runner could see it.
#[tokio::test]
async fn a_policys_env_file_reaches_the_runner_and_reserved_names_are_refused() {
    use rm_runner::backend::{Backend as _, NoIsolation, Plan};
    use rm_runner::env_file::{self, EnvFileError};

    let s = setup(PROBE);
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("linux.env");
    std::fs::write(
        &file,
        "# the linux fleet's cache\nCACHE_URL=http://cache.internal:8080\n\nLANG=\"de_DE.UTF-8\"\n",
    )
    .unwrap();
    let env = env_file::load(&file).unwrap();
    let root_dir = s.runtime.dir().parent().unwrap();
    let backend = NoIsolation {
        root: RunnerRoot::open(root_dir).unwrap(),
        package: rm_runner::package::current::CurrentPackage::new(&root_dir.join("unused-package")),
    };
    let plan = Plan {
        attempt_id: "00000000000a".to_owned(),
        workspace: rm_journal::WorkspaceKind::Ephemeral,
        runtime_dir: s.runtime.dir().to_owned(),
        uid: None,
        cgroup: None,
        limits: Default::default(),
        env,
        network_allow: None,
        egress: None,
        egress_report: None,
        docker: None,
        cache: None,
        image: None,
        devices: None,
    };
    let Spawned {
        identity,
        mut child,
    } = backend
        .start(&plan, &s.runtime, &SecretString::from(JIT))
        .unwrap();
    await_file(&s.runtime.dir().join("ready"));
    let seen = environ(identity.pid);
    std::fs::write(s.runtime.dir().join("release"), "").unwrap();
    child.wait().await.unwrap();
    let get = |key: &str| seen.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    assert_eq!(
        get("CACHE_URL").as_deref(),
        Some("http://cache.internal:8080"),
        "{seen:?}"
    );
    assert_eq!(get("LANG").as_deref(), Some("de_DE.UTF-8"), "{seen:?}");
    assert_eq!(get(JIT_ENV).as_deref(), Some(JIT));
    let tmp = s.runtime.dir().join("tmp").display().to_string();
    assert_eq!(get("TMPDIR"), Some(tmp));

    for (line, reserved) in [
        (2, "ACTIONS_RUNNER_INPUT_JITCONFIG"),
        (2, "HOME"),
        (2, "TMPDIR"),
        (2, "TEMP"),
    ] {
        std::fs::write(&file, format!("OK=1\n{reserved}=do-not-print\n")).unwrap();
        match env_file::load(&file) {
            Err(err @ EnvFileError::Line { line: at, .. }) => {
                assert_eq!(at, line, "{err}");
                let message = err.to_string();
                assert!(message.contains(&file.display().to_string()), "{message}");
                assert!(message.contains(reserved), "{message}");
                assert!(!message.contains("do-not-print"), "{message}");
            }
            other => panic!("{reserved} was not refused: {other:?}"),
        }
    }
}
