//! Desktop notifications against a real notification receiver: a private `dbus-daemon` session
//! bus started here, with a fake `org.freedesktop.Notifications` server on it. The notifier runs
//! in a child process (this test binary again) whose `DBUS_SESSION_BUS_ADDRESS` names that bus:
//! notify-rust reads the address only from the environment, and setting the environment of this
//! multithreaded test process would be unsound.

#![allow(clippy::unwrap_used, reason = "tests")]

use crate::skip;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use rm_agent::notify::{APP_NAME, Dispatch, Notifier, OperatorEvent, SESSION_BUS_ENV};

/// Tells the child test what to do and expect.
const CHILD_ENV: &str = "RM_NOTIFY_TEST_CHILD";
const CHILD_TEST: &str = "notify_dbus::child_sends_notifications";

/// A notification the fake server received.
#[derive(Debug, Clone)]
struct Shown {
    app_name: String,
    summary: String,
    body: String,
}

struct FakeNotificationServer {
    shown: Arc<Mutex<Vec<Shown>>>,
}

#[zbus::interface(name = "org.freedesktop.Notifications")]
impl FakeNotificationServer {
    #[allow(
        clippy::too_many_arguments,
        reason = "the signature of the Notify method of the notification spec"
    )]
    fn notify(
        &self,
        app_name: String,
        _replaces_id: u32,
        _app_icon: String,
        summary: String,
        body: String,
        _actions: Vec<String>,
        _hints: HashMap<String, zbus::OwnedVariant>,
        _expire_timeout: i32,
    ) -> u32 {
        let mut shown = self.shown.lock().unwrap();
        shown.push(Shown {
            app_name,
            summary,
            body,
        });
        u32::try_from(shown.len()).unwrap()
    }

    fn get_capabilities(&self) -> Vec<String> {
        vec!["body".to_owned()]
    }

    fn get_server_information(&self) -> (String, String, String, String) {
        (
            "rm-test-notifications".to_owned(),
            "rm".to_owned(),
            "1.0".to_owned(),
            "1.2".to_owned(),
        )
    }

    fn close_notification(&self, _id: u32) {}
}

/// A `dbus-daemon` that dies with the test.
struct Bus {
    child: Child,
    address: String,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// `dbus-daemon`, installed from Debian's package if it is missing and this runs as root.
fn dbus_daemon() -> Option<PathBuf> {
    if let Some(path) = find_in_path("dbus-daemon") {
        return Some(path);
    }
    if rustix::process::geteuid().is_root() && find_in_path("apt-get").is_some() {
        eprintln!("dbus-daemon is missing: installing Debian's `dbus-daemon` package");
        let installed = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "dbus-daemon"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            let _ = Command::new("apt-get").arg("update").status();
            let _ = Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "dbus-daemon"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status();
        }
    }
    find_in_path("dbus-daemon")
}

/// Starts a private session bus listening in `dir`; no service is ever auto-started on it.
fn start_bus(daemon: &Path, dir: &Path) -> Bus {
    let config = dir.join("session.conf");
    std::fs::write(
        &config,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:dir={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
            dir.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(daemon)
        .arg(format!("--config-file={}", config.display()))
        .args(["--print-address", "--nofork"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line.trim().to_owned();
    assert!(address.starts_with("unix:"), "dbus-daemon printed {line:?}");
    Bus { child, address }
}

/// Runs [`CHILD_TEST`] in a child process with `address` as its session bus (`None`: unset).
fn run_child(mode: &str, address: Option<&str>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([CHILD_TEST, "--exact", "--ignored", "--nocapture"])
        .env(CHILD_ENV, mode)
        .env_remove(SESSION_BUS_ENV);
    if let Some(address) = address {
        command.env(SESSION_BUS_ENV, address);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "the {mode} child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The child really ran its test (a filter that matched nothing would pass too).
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn notifications_reach_the_session_bus_once_per_window() {
    let Some(daemon) = dbus_daemon() else {
        skip::cannot_run(
            "notifications_reach_the_session_bus_once_per_window",
            "dbus",
            "`dbus-daemon` is not installed and could not be installed (apt-get install dbus-daemon)",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bus = start_bus(&daemon, dir.path());
    let shown = Arc::new(Mutex::new(Vec::new()));
    let server = FakeNotificationServer {
        shown: shown.clone(),
    };
    let _connection = zbus::block_on(
        zbus::connection::Builder::address(bus.address.as_str())
            .name("org.freedesktop.Notifications")
            .serve_at("/org/freedesktop/Notifications", server)
            .build(),
    )
    .unwrap();

    run_child("shown", Some(&bus.address));
    let shown = shown.lock().unwrap().clone();
    assert_eq!(
        shown.len(),
        2,
        "the repeated event within the window must not be sent: {shown:?}"
    );
    let (summary, body) = OperatorEvent::WebhooksStopped.message();
    assert_eq!(shown[0].app_name, APP_NAME);
    assert_eq!(shown[0].summary, summary);
    assert_eq!(shown[0].body, body);
    assert_eq!(
        shown[1].summary,
        "rm: runners of policy linux fail to start"
    );
    assert!(shown[1].body.starts_with("3 attempts in a row failed"));

    // A bus address that leads nowhere, and none at all: a logged no-op, not a failure.
    let nowhere = format!("unix:path={}", dir.path().join("no-bus").display());
    run_child("unreachable", Some(&nowhere));
    run_child("no_session", None);
}

/// The notifier's side, run by the test above in a child process.
#[test]
#[ignore = "run by notifications_reach_the_session_bus_once_per_window, in a child process"]
fn child_sends_notifications() {
    let mode = std::env::var(CHILD_ENV).unwrap();
    let notifier = Notifier::new(true);
    let failing = OperatorEvent::RunnersFailingToStart {
        policy: "linux".to_owned(),
        failures: 3,
    };
    match mode.as_str() {
        "shown" => {
            let Dispatch::Sending(sending) = notifier.dispatch(OperatorEvent::WebhooksStopped)
            else {
                panic!("not sent");
            };
            assert!(sending.wait(), "the server did not take it");
            assert!(matches!(
                notifier.dispatch(OperatorEvent::WebhooksStopped),
                Dispatch::RateLimited
            ));
            let Dispatch::Sending(sending) = notifier.dispatch(failing) else {
                panic!("another kind is not limited by the first");
            };
            assert!(sending.wait());
        }
        "unreachable" => {
            let Dispatch::Sending(sending) = notifier.dispatch(OperatorEvent::CredentialsRejected)
            else {
                panic!("not attempted");
            };
            assert!(!sending.wait(), "nothing listens there");
            // `notify` itself neither fails nor panics.
            notifier.notify(failing);
        }
        "no_session" => {
            assert!(matches!(
                notifier.dispatch(OperatorEvent::WebhooksStopped),
                Dispatch::NoSession
            ));
            notifier.notify(failing);
        }
        other => panic!("unknown mode {other}"),
    }
}
