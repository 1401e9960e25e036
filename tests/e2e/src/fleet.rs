//! The harness for `rm-agent run` end to end: a fake GitHub in the test process (the App
//! installed on `acme`, holding `acme/widgets`), the fake runner package, and the real binary
//! pointed at both, with the fake's webhooks signed and sent to the agent's receiver.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions, ReleaseOptions};
use rm_journal::{AttemptRecord, Reader};
use secrecy::{ExposeSecret as _, SecretString};

use crate::{Agent, SECRET, STARTUP_TIMEOUT, Setup, binary};

/// The App id of every fleet.
pub const APP_ID: u64 = 9090;
/// `host.name` of every fleet: runner names start `rm-e2e-`.
pub const HOST: &str = "e2e";
/// The repository every test queues jobs in.
pub const REPO: &str = "acme/widgets";

/// One `[[policy]]`.
#[derive(Debug, Clone)]
pub struct PolicySpec {
    pub name: &'static str,
    pub target: &'static str,
    pub labels: &'static [&'static str],
    pub max_runners: u32,
    /// `workspace`: `"ephemeral"` or `"persistent"`.
    pub workspace: &'static str,
    /// TOML lines appended to the policy as they are (e.g. `"pids_max = 40\n"`).
    pub extra: &'static str,
}

/// The default policy: the organization, `self-hosted` + `linux`.
pub const LINUX: PolicySpec = PolicySpec {
    name: "linux",
    target: "acme",
    labels: &["self-hosted", "linux"],
    max_runners: 8,
    workspace: "ephemeral",
    extra: "",
};

/// A policy beside the one under test, routed apart by its label: its job, queued after the
/// fact under test, gets a runner only from an allocation pass that began after it, and that
/// pass weighed every other policy's demand too ([`Fleet::serve_control_job`]). A positive
/// event in place of a "nothing happened" window.
pub const CONTROL: PolicySpec = PolicySpec {
    name: "control",
    target: REPO,
    labels: &["self-hosted", "control"],
    max_runners: 1,
    workspace: "ephemeral",
    extra: "",
};

/// How a fleet is configured.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub host_max: u32,
    pub policies: Vec<PolicySpec>,
    pub idle_timeout: &'static str,
    pub registration_timeout: &'static str,
    /// Whether the agent runs a receiver (without one, jobs are found by polling alone).
    pub receiver: bool,
    /// `[polling] idle_interval`.
    pub polling_idle_interval: &'static str,
    /// `[relay] url`: the subscribe URL of an rm-relay channel (the token goes in
    /// `RM_RELAY_TOKEN` when the agent starts).
    pub relay_url: Option<String>,
    /// `[runner] version` instead of `package_dir`: the fake runner package is published on
    /// the fake GitHub as actions/runner release `v{version}`, as `runner_release` says.
    /// `"latest"` publishes nothing: the test publishes the releases it follows.
    pub runner_version: Option<&'static str>,
    pub runner_release: ReleaseOptions,
    /// `[runner] release_check_interval`, for `runner_version: Some("latest")`.
    pub release_check_interval: Option<&'static str>,
    /// `[notifications] desktop`.
    pub desktop_notifications: bool,
    /// `[host] isolation` (`"user"` or `"none"`); unset, the agent's default.
    pub isolation: Option<&'static str>,
    /// More `[host]` lines (`network_deny = [...]`, ...).
    pub host_extra: String,
    /// Where the setup directory (data, key, package, runner root) is made instead of the
    /// system's temporary directory.
    pub base_dir: Option<PathBuf>,
    /// TOML appended to the configuration as it is (`[[scale_set]]` tables, ...).
    pub tail: String,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            host_max: 4,
            policies: vec![LINUX],
            idle_timeout: "10m",
            registration_timeout: "5m",
            receiver: true,
            polling_idle_interval: "10s",
            relay_url: None,
            runner_version: None,
            runner_release: ReleaseOptions::default(),
            release_check_interval: None,
            desktop_notifications: false,
            isolation: None,
            host_extra: String::new(),
            base_dir: None,
            tail: String::new(),
        }
    }
}

/// A fake GitHub, a runner package and a configuration for one agent.
pub struct Fleet {
    pub options: FleetOptions,
    pub setup: Setup,
    pub fake: FakeGithub,
    pub key: AppKeyPair,
    pub package: PathBuf,
    pub runner_root: PathBuf,
    /// This fleet's `host.runner_uids`: agents of tests running side by side on one host must
    /// never share a runner uid (one's cleanup kills every process of its runners' uids).
    pub uids: String,
}

/// How many runner uids each fleet gets.
pub const UIDS_PER_FLEET: u32 = 32;

/// A uid range no other fleet of any test process on this host holds: the process id and a
/// counter pick a block far above any regular account. A block whose network slots (a runner's
/// /30 is its uid's slot, `network::slot_of`) meet the demo's (`rm-agent demo` runs beside the
/// fleets in the same test binary, on its own fixed uids) is passed over: two runners on one
/// slot would share an address, and the second could not start.
pub fn fleet_uids() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let demo = parse_uids(rm_agent::commands::DEMO_UIDS);
    let demo_slots: std::collections::HashSet<u32> =
        (demo.0..=demo.1).map(rm_runner::network::slot_of).collect();
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 64;
        let first =
            1_000_000 + (std::process::id() % 4096) * 64 * UIDS_PER_FLEET + n * UIDS_PER_FLEET;
        let last = first + UIDS_PER_FLEET - 1;
        if (first..=last).all(|uid| !demo_slots.contains(&rm_runner::network::slot_of(uid))) {
            return format!("{first}-{last}");
        }
    }
}

impl Fleet {
    pub async fn start(options: FleetOptions) -> Fleet {
        let key = AppKeyPair::generate().unwrap();
        let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem.clone()))
            .await
            .unwrap();
        fake.add_org("acme");
        fake.add_repo(REPO);
        let setup = match &options.base_dir {
            Some(dir) => Setup::new_in(dir),
            None => Setup::new(),
        };
        let package = rm_fake_runner::assemble_package(
            &binary(rm_fake_runner::BINARY_NAME),
            &setup.dir.path().join("package"),
        )
        .unwrap();
        if let Some(version) = options.runner_version.filter(|v| *v != "latest") {
            fake.publish_runner_release_with(version, tarball(&package), options.runner_release);
        }
        let runner_root = setup.dir.path().join("runners");
        let fleet = Fleet {
            options: options.clone(),
            setup,
            fake,
            key,
            package,
            runner_root,
            uids: fleet_uids(),
        };
        fleet.configure(&options);
        fleet.fake.set_webhook(
            &format!("http://{}/webhook", fleet.setup.addr),
            SecretString::from(SECRET),
        );
        fleet
    }

    /// Writes the key (mode 600) and the configuration.
    pub fn configure(&self, options: &FleetOptions) {
        let key_file = self.setup.dir.path().join("app.pem");
        std::fs::write(&key_file, self.key.private_pem.expose_secret()).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut config = format!(
            "data_dir = \"{data}\"\n\n[github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n\n\
             {receiver}{relay}[notifications]\ndesktop = {desktop}\n\n[polling]\nidle_interval = \"{idle_poll}\"\n\n[host]\nname = \"{HOST}\"\nmax_runners = {max}\nrunner_root = \"{root}\"\nrunner_uids = \"{uids}\"\nnetwork_host_ports = [{port}]\n{free}{host_extra}{isolation}\n\
             [runner]\n{package}idle_timeout = \"{idle}\"\nregistration_timeout = \"{registration}\"\n",
            data = self.setup.dir.path().join("data").display(),
            api = self.fake.api_url(),
            key = key_file.display(),
            receiver = if options.receiver {
                format!("[receiver]\nlisten = \"{}\"\n\n", self.setup.addr)
            } else {
                String::new()
            },
            relay = match &options.relay_url {
                Some(url) => format!("[relay]\nurl = \"{url}\"\n\n"),
                None => String::new(),
            },
            desktop = options.desktop_notifications,
            idle_poll = options.polling_idle_interval,
            max = options.host_max,
            root = self.runner_root.display(),
            uids = self.uids,
            // The fake GitHub, on the host's loopback: runners in their own network reach it.
            port = self.fake.port(),
            free = crate::HOST_FREE_SPACE,
            host_extra = options.host_extra,
            isolation = match options.isolation {
                Some(isolation) => format!("isolation = \"{isolation}\"\n"),
                None => String::new(),
            },
            package = match options.runner_version {
                Some(version) => format!(
                    "version = \"{version}\"\n{}",
                    options
                        .release_check_interval
                        .map(|i| format!("release_check_interval = \"{i}\"\n"))
                        .unwrap_or_default()
                ),
                None => format!("package_dir = \"{}\"\n", self.package.display()),
            },
            idle = options.idle_timeout,
            registration = options.registration_timeout,
        );
        for p in &options.policies {
            let labels: Vec<String> = p.labels.iter().map(|l| format!("\"{l}\"")).collect();
            config.push_str(&format!(
                "\n[[policy]]\nname = \"{}\"\ntarget = \"{}\"\nlabels = [{}]\nmax_runners = {}\nworkspace = \"{}\"\n{}",
                p.name,
                p.target,
                labels.join(", "),
                p.max_runners,
                p.workspace,
                p.extra
            ));
        }
        config.push_str(&options.tail);
        std::fs::write(self.setup.config(), config).unwrap();
    }

    /// Starts `rm-agent run` with `env` added, logging (debug) to a file of the setup, and waits
    /// for its receiver to answer `/healthz`.
    pub async fn start_agent(&self, env: &[(&str, &str)]) -> Agent {
        self.start_agent_with(env, |_| {}).await
    }

    /// [`Self::start_agent`], with `configure` adding to the command (a mount namespace, a
    /// descriptor the agent inherits).
    pub async fn start_agent_with(
        &self,
        env: &[(&str, &str)],
        configure: impl FnOnce(&mut Command),
    ) -> Agent {
        let log = std::fs::File::create(self.setup.dir.path().join(format!(
            "agent-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )))
        .unwrap();
        let mut command = self.setup.command(&["run"]);
        command
            .env("RM_LOG", "debug")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        configure(&mut command);
        let mut agent = Agent::spawn(command, self.setup.addr);
        if self.options.receiver
            && let Err(why) = agent.healthy_within(STARTUP_TIMEOUT).await
        {
            panic!("rm-agent run {why}\n{}", self.setup.failure_report());
        }
        agent
    }

    /// Starts `rm-agent run` expecting it to stop by itself (a refusal at start) within
    /// `timeout`; its exit status and what it wrote to stderr.
    pub async fn run_agent_until_exit(
        &self,
        timeout: Duration,
    ) -> (std::process::ExitStatus, String) {
        let log = self.setup.dir.path().join("agent-until-exit.log");
        let mut child = self
            .setup
            .command(&["run"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, std::fs::read_to_string(&log).unwrap());
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("rm-agent run did not stop by itself within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every attempt in the journal, newest first.
    /// Queues a job for [`CONTROL`] and waits up to `timeout` until it is served and every
    /// attempt is cleaned; asserts it got exactly one runner, and returns the other attempts.
    pub async fn serve_control_job(&self, timeout: Duration) -> Vec<AttemptRecord> {
        let control = self
            .fake
            .queue_job(REPO, "control", CONTROL.labels)
            .unwrap();
        wait_until(timeout, "the control job served after the others", || {
            self.completed(control) && self.all_cleaned()
        })
        .await;
        let (controls, others): (Vec<_>, Vec<_>) = self
            .attempts()
            .into_iter()
            .partition(|a| a.policy == CONTROL.name);
        assert_eq!(controls.len(), 1, "one runner for the control job");
        others
    }

    /// How many JIT registrations the agent asked the fake for.
    pub fn jit_requests(&self) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/generate-jitconfig"))
            .count()
    }

    pub fn attempts(&self) -> Vec<AttemptRecord> {
        match Reader::open(&self.setup.journal()) {
            Ok(reader) => reader.attempts(10_000).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Whether the fake holds `job` as completed.
    pub fn completed(&self, job: u64) -> bool {
        self.fake
            .job(job)
            .is_some_and(|j| j.status == rm_fake_github::JobStatus::Completed)
    }

    /// Whether there are attempts and every one is cleaned.
    pub fn all_cleaned(&self) -> bool {
        let attempts = self.attempts();
        !attempts.is_empty()
            && attempts
                .iter()
                .all(|a| a.state == rm_journal::AttemptState::Cleaned)
    }

    /// Whether some attempt is busy with a job.
    pub fn any_busy(&self) -> bool {
        self.attempts()
            .iter()
            .any(|a| a.state == rm_journal::AttemptState::Busy)
    }

    /// What runners left in the runner root (the agent's package store, `.rm-package`, is not
    /// a runner's).
    pub fn runtimes(&self) -> Vec<PathBuf> {
        crate::runtimes_in(&self.runner_root)
    }

    /// A directory of the setup every runner uid may write into and no one may remove another's
    /// file from (mode 1777): where a job's script writes its report.
    pub fn reports_dir(&self) -> PathBuf {
        let reports = self.setup.dir.path().join("reports");
        std::fs::create_dir_all(&reports).unwrap();
        std::fs::set_permissions(&reports, std::fs::Permissions::from_mode(0o1777)).unwrap();
        reports
    }

    /// Puts a job in front of the package's runner: the real `bin/Runner.Listener` moves to
    /// `bin/Runner.Listener.real` and `script` (a POSIX sh script that ends by `exec`ing it)
    /// takes its place, mode 0755. Returns the real listener's bytes.
    pub fn wrap_listener(&self, script: &str) -> Vec<u8> {
        let bin = self.package.join("bin");
        let real = bin.join("Runner.Listener.real");
        std::fs::rename(bin.join("Runner.Listener"), &real).unwrap();
        std::fs::write(bin.join("Runner.Listener"), script).unwrap();
        std::fs::set_permissions(
            bin.join("Runner.Listener"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::read(real).unwrap()
    }

    /// Registrations named with our prefix that the agent did not remove: those the fake still
    /// lists, and those it removed itself at the end of a finished ephemeral runner's lag (the
    /// agent never deleted them; GitHub did). Empty means the agent deregistered every runner
    /// it started, however long the check came after the job.
    pub fn our_registrations(&self) -> Vec<String> {
        let prefix = format!("rm-{HOST}-");
        let listed = self.fake.runners().into_iter().map(|r| r.name);
        let expired = self
            .fake
            .expired_runners()
            .into_iter()
            .map(|n| format!("{n} (never deleted; GitHub removed it after its lag)"));
        listed
            .chain(expired)
            .filter(|n| n.starts_with(&prefix))
            .collect()
    }

    /// The journal file and its WAL, as bytes (for secret scans).
    pub fn journal_bytes(&self) -> Vec<u8> {
        let mut all = Vec::new();
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.setup.journal().into_os_string();
            path.push(suffix);
            if let Ok(bytes) = std::fs::read(Path::new(&path)) {
                all.extend(bytes);
            }
        }
        all
    }
}

impl Fleet {
    /// `rm-agent explain JOB --json`, which must succeed, as JSON.
    pub fn explain(&self, job: u64) -> serde_json::Value {
        let out = self.setup.run(&["explain", &job.to_string(), "--json"]);
        assert!(out.status.success(), "explain {job}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// The codes of an `explain --json` answer's reasons, in order.
pub fn reason_codes(answer: &serde_json::Value) -> Vec<String> {
    answer["reasons"]
        .as_array()
        .map(|reasons| {
            reasons
                .iter()
                .filter_map(|r| r["code"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `dir` as a `.tar.gz` with entries under `./`, as actions/runner packs its releases.
pub fn tarball(dir: &Path) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    {
        let mut tar = tar::Builder::new(&mut gz);
        tar.append_dir_all(".", dir).unwrap();
        tar.finish().unwrap();
    }
    gz.finish().unwrap()
}

/// Waits until `check` holds, polling every 50 ms, failing with `what` after `timeout`.
pub async fn wait_until(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Fleet {
    /// What agents stopped by SIGKILL leave in the kernel (such an agent never drains, and a
    /// test's last agent is killed when it is dropped): each attempt's runner cgroup (killed,
    /// then removed), network namespace and veth, and the agent's host table. Through the
    /// agent's own idempotent cleanup; what is already gone is no error.
    fn sweep(&self) {
        sweep_kernel(
            &self.setup.dir.path().join("data"),
            &self.attempts(),
            parse_uids(&self.uids),
        );
    }
}

/// `first-last` as numbers.
pub fn parse_uids(uids: &str) -> (u32, u32) {
    let (first, last) = uids.split_once('-').unwrap();
    (first.parse().unwrap(), last.parse().unwrap())
}

/// What an agent with this data directory and these runner uids may have left in the kernel:
/// each journalled attempt's runner cgroup (killed, then removed), network namespace and veth;
/// any veth holding one of the uids' network slots (an attempt the journal lost, as a poisoned
/// journal's may, still has one), with the namespace and runner cgroup of that attempt, named
/// by the veth; and the agent's host table. Through the agent's own idempotent
/// cleanup; what is already gone is no error. Leftovers would hold those slots' addresses for
/// later tests (and fill the host's nft ruleset run after run).
pub fn sweep_kernel(data_dir: &Path, attempts: &[AttemptRecord], (first, last): (u32, u32)) {
    use rm_runner::{cgroup, network};
    // Where runner cgroups are: beside a journalled one, else where an agent of this process's
    // cgroup resolves them (as the tests' agents, its children, do). Resolved (a probe cgroup
    // made and removed) only when a lost attempt is found.
    let journalled_root = attempts
        .iter()
        .find_map(|a| a.cgroup.as_deref()?.parent().map(Path::to_path_buf));
    let cgroup_root = || {
        journalled_root.clone().or_else(|| {
            cgroup::CgroupRoot::resolve(None)
                .ok()
                .map(|root| root.path().to_path_buf())
        })
    };
    let mut shorts: Vec<String> = Vec::new();
    for a in attempts {
        if let Some(path) = &a.cgroup
            && path.exists()
        {
            let _ = cgroup::kill_and_remove(path, SWEEP_WAIT);
        }
        shorts.push(a.attempt_id.short().to_owned());
    }
    for uid in first..=last {
        let host = network::addresses(network::slot_of(uid)).host;
        let Ok(out) = std::process::Command::new("ip")
            .args(["-o", "-4", "addr", "show", "to", &format!("{host}/32")])
            .output()
        else {
            continue;
        };
        // `4: rmv0123456789ab    inet 10.213.0.1/30 ...`
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if let Some(short) = text
            .split_whitespace()
            .nth(1)
            .and_then(|veth| veth.split('@').next())
            .and_then(|veth| veth.strip_prefix(network::VETH_PREFIX))
        {
            // An attempt the journal lost: its cgroup is named by the same short id.
            if let Some(root) = cgroup_root() {
                let _ = cgroup::kill_and_remove(&root.join(format!("rm-{short}")), SWEEP_WAIT);
            }
            shorts.push(short.to_owned());
        }
    }
    for short in shorts {
        let _ = network::remove(&network::Names::of(&short));
    }
    let host = network::HostNetwork {
        table: network::host_table_name(data_dir),
        rules: network::HostRules::new(&[], &[], "", std::iter::empty()),
    };
    let _ = host.uninstall();
}

/// How long [`Fleet::sweep`] waits for a runner cgroup to empty after its kill.
const SWEEP_WAIT: Duration = Duration::from_secs(5);

impl Drop for Fleet {
    /// A failed test shows the end of what the agents logged, and the attempts; then what the
    /// agents left in the kernel is swept.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.setup.failure_report());
            for a in self.attempts() {
                eprintln!(
                    "attempt {} {} state={} outcome={:?} reason={:?} intent={:?}",
                    a.attempt_id,
                    a.runner_name,
                    a.state.as_str(),
                    a.outcome,
                    a.reason,
                    a.stop_intent
                );
            }
        }
        self.sweep();
    }
}
