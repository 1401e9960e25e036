//! The harness for end-to-end tests: runs the real `rm-agent` binary in a temporary data
//! directory, plays GitHub's part (signed deliveries from the real example payloads) and reads
//! what the binary leaves behind.

#![allow(
    clippy::unwrap_used,
    reason = "test harness: a failed step should fail the test loudly"
)]

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub mod disk;
pub mod fleet;
pub mod fresh;
pub mod pg_fleet;
pub mod standin;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The webhook secret every test receiver accepts. Tests check it never appears in output.
pub const SECRET: &str = "e2e-webhook-secret-0f3c9a";

/// The fitness gate's thresholds in every configuration the harness writes: low enough that a
/// test machine with little free disk still registers runners (the defaults ask for 2 GiB under
/// the runner root), high enough to stay a real check. The gate itself is tested on a small
/// tmpfs (`run/fitness.rs`), which replaces these lines.
pub const HOST_FREE_SPACE: &str =
    "min_free_space = \"64MiB\"\ndata_dir_min_free_space = \"16MiB\"\n";

/// How long a started binary may take to answer `/healthz`.
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/webhooks");

/// A workspace binary next to this test executable (`cargo test --workspace` builds them all),
/// refused (the test fails, naming the build command) when it is missing or older than a source
/// it is built from ([`fresh`]). Checked once per binary and test process: the first call stats
/// the few hundred sources, later ones reuse the verdict.
pub fn binary(name: &str) -> PathBuf {
    static CHECKED: OnceLock<Mutex<HashMap<String, Result<(), String>>>> = OnceLock::new();
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap().to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`{}`; `cargo test --workspace` does it; see docs/development.md)",
        path.display(),
        fresh::BUILD_COMMAND
    );
    let verdict = CHECKED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(name.to_owned())
        .or_insert_with(|| fresh::check(&path))
        .clone();
    if let Err(why) = verdict {
        panic!("{why}");
    }
    path
}

/// The agent these tests run: `rm-agent`'s command line built with the test features `demo` and
/// `fault-injection` (agent/Cargo.toml), a binary of its own so that a featureless build of the
/// product (`cargo build -p rm-agent`, `cargo test -p rm-agent`) never replaces it.
pub const AGENT: &str = "rm-agent-e2e";

/// [`AGENT`] under the product's name: `<target>/debug/rm-e2e-agent/rm-agent`, a hard link this
/// test process makes once (to a fresh name, renamed over the old, so processes running at the
/// same time never see half a link). The name matters: a process's name is its file's, and
/// `rm-agent status` tells a live agent by it.
pub fn agent_binary() -> PathBuf {
    static LINKED: OnceLock<PathBuf> = OnceLock::new();
    LINKED
        .get_or_init(|| {
            let built = binary(AGENT);
            let dir = built.parent().unwrap().join("rm-e2e-agent");
            std::fs::create_dir_all(&dir).unwrap();
            let fresh = dir.join(format!(".rm-agent.{}", std::process::id()));
            let _ = std::fs::remove_file(&fresh);
            std::fs::hard_link(&built, &fresh).unwrap();
            let path = dir.join("rm-agent");
            std::fs::rename(&fresh, &path).unwrap();
            path
        })
        .clone()
}

/// [`AGENT`], checked to carry the feature `feature` (`demo`, `fault-injection`, `fleet`):
/// should it not, the test fails here, naming the build command, rather than waiting in vain for a demo or
/// a crash that cannot come.
pub fn agent_with(feature: &str) -> PathBuf {
    let agent = agent_binary();
    let out = Command::new(&agent).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    let features = version
        .split_once("(features: ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(list, _)| list.split(", ").collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(
        out.status.success() && features.contains(&feature),
        "{} was built without the `{feature}` feature (it says {:?}): build it with \
         `cargo build -p rm-agent --all-features -p rm-relay -p rm-fake-runner` (`cargo test \
         --workspace` does it), see docs/development.md",
        agent.display(),
        version.trim()
    );
    agent
}

/// What runners left in a runner root (the agent's package store, `.rm-package`, is not a
/// runner's); empty when the root does not exist.
pub fn runtimes_in(runner_root: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(runner_root) {
        Ok(entries) => entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name() != Some(std::ffi::OsStr::new(".rm-package")))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The lowest port [`free_port`] hands out: above the well-known and registered ports most
/// daemons take.
const FIRST_TEST_PORT: u16 = 10_000;

/// A port on loopback that was free a moment ago, below the kernel's ephemeral range and never
/// handed out before in this process. A test that restarts a binary on its port needs both: a
/// port from the ephemeral range may meanwhile be the local end of any outgoing connection of a
/// test running beside it (then the restart fails to bind), and a port handed out twice may be
/// taken by the other test's binary while this one is down.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let end = u32::from(ephemeral_range_start()).max(u32::from(FIRST_TEST_PORT) + 1);
    let span = end - u32::from(FIRST_TEST_PORT);
    // Test binaries running at once start at different places of the range.
    let start = std::process::id() % span;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(u32::from(FIRST_TEST_PORT) + offset).unwrap();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on loopback below the ephemeral range");
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`), or Linux's default
/// when it cannot be read.
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Makes the process `command` starts get SIGTERM when the thread that starts it ends (the
/// test's thread, or the whole test process killed: an interrupted `cargo test`, a CI timeout).
/// A test's [`Agent`] is killed when it is dropped, but a test process that is killed drops
/// nothing: its agents ran on for as long as the host stayed up, polling a fake GitHub that
/// was gone and keeping their nft tables, network slots and runner uids from the next run. On
/// SIGTERM an agent drains and exits as it would under systemd.
#[allow(unsafe_code)]
pub fn ends_with_its_test(command: &mut Command) -> &mut Command {
    let parent = libc::pid_t::try_from(std::process::id()).unwrap();
    // SAFETY: the closure runs between fork and exec and makes raw system calls only.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the signal was asked for: it will never come.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the test process is gone"));
            }
            Ok(())
        })
    }
}

/// A data directory and configuration for one agent.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl Setup {
    pub fn new() -> Setup {
        Setup::in_dir(tempfile::tempdir().unwrap())
    }

    /// A setup in a new directory under `parent` (instead of the system's temporary directory,
    /// which an isolated runner sees as its own empty tmpfs).
    pub fn new_in(parent: &Path) -> Setup {
        Setup::in_dir(tempfile::tempdir_in(parent).unwrap())
    }

    fn in_dir(dir: tempfile::TempDir) -> Setup {
        // Runners run under uids of their own (CONTRACT §7): they must be able to pass through
        // the directories above the runner root (not list them).
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        std::fs::write(
            dir.path().join("rm-agent.toml"),
            format!(
                "data_dir = \"{}\"\n\n[receiver]\nlisten = \"{addr}\"\npath = \"/webhook\"\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        Setup { dir, addr }
    }

    pub fn config(&self) -> PathBuf {
        self.dir.path().join("rm-agent.toml")
    }

    pub fn journal(&self) -> PathBuf {
        self.dir.path().join("data").join(rm_journal::JOURNAL_FILE)
    }

    /// `rm-agent --config <this config> ARGS`, with the secret in the environment, ending
    /// with its test ([`ends_with_its_test`]).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(agent_binary());
        ends_with_its_test(&mut cmd);
        cmd.arg("--config").arg(self.config()).args(args);
        cmd.env("RM_WEBHOOK_SECRET", SECRET)
            .env_remove("RM_DATA_DIR")
            .env_remove("RM_CONFIG");
        cmd
    }

    /// Runs a short command to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Starts `rm-agent receive` and waits until it answers `/healthz`.
    pub async fn start_receiver(&self) -> Agent {
        let log = std::fs::File::create(self.dir.path().join(format!(
            "receiver-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )))
        .unwrap();
        let mut command = self.command(&["receive"]);
        command
            .env("RM_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(log);
        let mut agent = Agent::spawn(command, self.addr);
        if let Err(why) = agent.healthy_within(STARTUP_TIMEOUT).await {
            panic!("rm-agent receive {why}\n{}", self.failure_report());
        }
        agent
    }

    /// What a failed test prints: per log file, in the order the files were written, its
    /// INFO-and-above lines (the last [`REPORT_LINES`]) and its last [`REPORT_TAIL`] lines; the
    /// whole logs are copied to a directory that outlives the test, named in the report.
    pub fn failure_report(&self) -> String {
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .map(|p| {
                let created = std::fs::metadata(&p)
                    .and_then(|m| m.created().or_else(|_| m.modified()))
                    .unwrap_or(std::time::UNIX_EPOCH);
                (created, p)
            })
            .collect();
        files.sort();
        let kept = std::env::temp_dir().join(format!(
            "rm-e2e-failed-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        ));
        let mut report = String::new();
        for (_, path) in &files {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let notable: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
                .collect();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            report.push_str(&format!(
                "---- {name}: INFO and above ----\n{}\n---- {name}: last lines ----\n{}\n",
                notable[notable.len().saturating_sub(REPORT_LINES)..].join("\n"),
                lines[lines.len().saturating_sub(REPORT_TAIL)..].join("\n"),
            ));
            if std::fs::create_dir_all(&kept).is_ok() {
                let _ = std::fs::copy(path, kept.join(&name));
            }
        }
        report.push_str(&format!("---- the whole logs: {} ----\n", kept.display()));
        report
    }

    /// Everything the agents of this setup logged.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "log") {
                all.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
        all
    }
}

/// INFO-and-above lines a failure report shows per log file, at most.
pub const REPORT_LINES: usize = 150;
/// Last lines (any level) a failure report shows per log file.
pub const REPORT_TAIL: usize = 30;

impl Default for Setup {
    fn default() -> Self {
        Setup::new()
    }
}

/// A running `rm-agent` process.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Agent {
    /// Starts the command as an agent answering on `addr`.
    pub fn spawn(mut command: Command, addr: SocketAddr) -> Agent {
        Agent {
            child: command.spawn().unwrap(),
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Waits until the agent answers `/healthz` with 200.
    pub async fn wait_healthy(&mut self) {
        if let Err(why) = self.healthy_within(STARTUP_TIMEOUT).await {
            panic!("rm-agent {why}");
        }
    }

    /// Waits until the agent answers `/healthz` with 200; says why not when it exits first or
    /// does not answer within `timeout`.
    pub async fn healthy_within(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((200, _)) = self.get("/healthz").await {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("exited before it became healthy: {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("did not become healthy within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        let req = http::Request::get(format!("http://{}{path}", self.addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(req).await
    }

    /// Posts one signed delivery; the status, or the transport error.
    pub async fn deliver(&self, delivery: &Delivery) -> Result<u16, String> {
        let req = http::Request::post(format!("http://{}/webhook", self.addr))
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/e2e")
            .header("x-github-event", &delivery.event)
            .header("x-github-delivery", &delivery.guid)
            .header(
                "x-hub-signature-256",
                rm_receiver::sign(SECRET.as_bytes(), &delivery.body),
            )
            .body(Full::new(Bytes::from(delivery.body.clone())))
            .unwrap();
        self.send(req).await.map(|(status, _)| status)
    }

    async fn send(&self, req: http::Request<Full<Bytes>>) -> Result<(u16, String), String> {
        let res = self.client.request(req).await.map_err(|e| e.to_string())?;
        let status = res.status().as_u16();
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// SIGKILL: no chance to flush or clean anything.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then wait for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A delivery as GitHub would send it.
#[derive(Clone)]
pub struct Delivery {
    pub event: String,
    pub guid: String,
    pub body: Vec<u8>,
}

/// GitHub's example payload `name` (e.g. `workflow_job.queued.5`), with an App installation and,
/// for `workflow_job`, the given job id and the job's dates set to now, as GitHub would send it
/// today (the examples are years old, and a body older than a day is journalled as stale).
pub fn delivery(name: &str, job_id: Option<i64>) -> Delivery {
    let path = Path::new(FIXTURES).join(format!("{name}.json"));
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    value["installation"] = serde_json::json!({"id": 4242});
    if let Some(id) = job_id {
        value["workflow_job"]["id"] = serde_json::json!(id);
    }
    date_job_now(&mut value);
    Delivery {
        event: name.split('.').next().unwrap().to_owned(),
        guid: uuid::Uuid::new_v4().to_string(),
        body: serde_json::to_vec(&value).unwrap(),
    }
}

/// Sets a `workflow_job` body's dates (those it carries) to now.
pub fn date_job_now(value: &mut serde_json::Value) {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    if let Some(job) = value["workflow_job"].as_object_mut() {
        for key in ["created_at", "started_at", "completed_at"] {
            if job.get(key).is_some_and(serde_json::Value::is_string) {
                job.insert(key.to_owned(), serde_json::json!(now));
            }
        }
    }
}

/// Parses a command's stdout as one JSON document.
pub fn json_stdout(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}
