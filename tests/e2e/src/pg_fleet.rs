//! The harness for a fleet on PostgreSQL end to end (CONTRACT §9, docs/fleet.md): one fake
//! GitHub in the test process, any number of `rm-agent receive` processes recording its
//! webhooks into one PostgreSQL journal, and any number of `rm-agent run` hosts (each its own
//! data directory, host name, runner root and runner uids) reading and claiming jobs there,
//! all on loopback. The database is the caller's (a connection string).

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::Stdio;

use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use rm_journal::{AttemptRecord, AttemptState, Reader};
use secrecy::{ExposeSecret as _, SecretString};

use crate::fleet::{APP_ID, PolicySpec, REPO, fleet_uids};
use crate::{Agent, SECRET, Setup, binary};

/// Every host's name starts with this: runner names are `rm-e2e-<host>-…`.
pub const HOST_PREFIX: &str = "e2e-";

/// `$RM_JOURNAL_PASSWORD` of every `run` host: `run` with isolated runners refuses a login
/// without a password (agent/src/journal_auth.rs). The test server trusts its socket
/// (tests/support/postgres.rs), so it never asks for this one.
const JOURNAL_PASSWORD: &str = "e2e-fleet-journal";

/// How the hosts are configured.
#[derive(Debug, Clone)]
pub struct PgFleetOptions {
    /// `[host] max_runners` of every host.
    pub host_max: u32,
    pub policy: PolicySpec,
    pub idle_timeout: &'static str,
    pub registration_timeout: &'static str,
}

/// The fake, the runner package, the App key and a base directory for every process.
pub struct PgFleet {
    pub options: PgFleetOptions,
    pub fake: FakeGithub,
    pub url: String,
    pub base: tempfile::TempDir,
    key: AppKeyPair,
    key_file: PathBuf,
    package: PathBuf,
}

/// One `rm-agent receive`.
pub struct FleetReceiver {
    pub setup: Setup,
    pub agent: Agent,
}

/// One `rm-agent run` host.
pub struct FleetHost {
    /// Its `host.name`.
    pub name: String,
    pub setup: Setup,
    pub runner_root: PathBuf,
    /// Its `host.runner_uids` (`first-last`), unique to it among every test's fleets.
    pub uids: (u32, u32),
    /// The running agent (`None` once killed or stopped).
    pub agent: Option<Agent>,
}

impl PgFleet {
    /// The fake (App installed on `acme`, holding [`REPO`]), the App key and the runner
    /// package; nothing started yet.
    pub async fn new(url: String, options: PgFleetOptions) -> PgFleet {
        // An agent without the PostgreSQL journal refuses `journal.url`: say how to build one.
        crate::agent_with("fleet");
        let key = AppKeyPair::generate().unwrap();
        let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem.clone()))
            .await
            .unwrap();
        fake.add_org("acme");
        fake.add_repo(REPO);
        let base = tempfile::tempdir().unwrap();
        // Runners run under uids of their own: they pass through the directories above theirs.
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let key_file = base.path().join("app.pem");
        std::fs::write(&key_file, key.private_pem.expose_secret()).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let package = rm_fake_runner::assemble_package(
            &binary(rm_fake_runner::BINARY_NAME),
            &base.path().join("package"),
        )
        .unwrap();
        PgFleet {
            options,
            fake,
            url,
            base,
            key,
            key_file,
            package,
        }
    }

    /// The App's private key (for secret scans).
    pub fn key(&self) -> &AppKeyPair {
        &self.key
    }

    /// Starts `rm-agent receive` on the fleet's journal and waits until it answers `/healthz`.
    pub async fn start_receiver(&self) -> FleetReceiver {
        let setup = Setup::new_in(self.base.path());
        std::fs::write(
            setup.config(),
            format!(
                "data_dir = \"{data}\"\n\n[journal]\nurl = \"{url}\"\n\n[receiver]\nlisten = \"{addr}\"\npath = \"/webhook\"\n",
                data = setup.dir.path().join("data").display(),
                url = self.url,
                addr = setup.addr,
            ),
        )
        .unwrap();
        let agent = setup.start_receiver().await;
        FleetReceiver { setup, agent }
    }

    /// Points the fake's webhook at every receiver (each delivery to one of them, drawn from
    /// the printed webhook seed).
    pub fn deliver_to(&self, receivers: &[&FleetReceiver]) {
        let urls: Vec<String> = receivers
            .iter()
            .map(|r| format!("http://{}/webhook", r.setup.addr))
            .collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        self.fake.set_webhooks(&urls, SecretString::from(SECRET));
    }

    /// A host named `e2e-<name>` configured on the fleet's journal; not started.
    pub fn host(&self, name: &str) -> FleetHost {
        let setup = Setup::new_in(self.base.path());
        let name = format!("{HOST_PREFIX}{name}");
        let runner_root = setup.dir.path().join("runners");
        let uids = fleet_uids();
        let (first, last) = uids.split_once('-').unwrap();
        let uids = (first.parse().unwrap(), last.parse().unwrap());
        let o = &self.options;
        let p = &o.policy;
        let labels: Vec<String> = p.labels.iter().map(|l| format!("\"{l}\"")).collect();
        std::fs::write(
            setup.config(),
            format!(
                "data_dir = \"{data}\"\n\n[journal]\nurl = \"{url}\"\n\n\
                 [github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n\n\
                 [notifications]\ndesktop = false\n\n\
                 [host]\nname = \"{name}\"\nmax_runners = {max}\nrunner_root = \"{root}\"\nrunner_uids = \"{first}-{last}\"\nnetwork_host_ports = [{port}]\n{free}\n\
                 [runner]\npackage_dir = \"{package}\"\nidle_timeout = \"{idle}\"\nregistration_timeout = \"{registration}\"\n\n\
                 [[policy]]\nname = \"{policy}\"\ntarget = \"{target}\"\nlabels = [{labels}]\nmax_runners = {policy_max}\nworkspace = \"{workspace}\"\n{extra}",
                data = setup.dir.path().join("data").display(),
                url = self.url,
                api = self.fake.api_url(),
                port = self.fake.port(),
                free = crate::HOST_FREE_SPACE,
                key = self.key_file.display(),
                max = o.host_max,
                root = runner_root.display(),
                first = uids.0,
                last = uids.1,
                package = self.package.display(),
                idle = o.idle_timeout,
                registration = o.registration_timeout,
                policy = p.name,
                target = p.target,
                labels = labels.join(", "),
                policy_max = p.max_runners,
                workspace = p.workspace,
                extra = p.extra,
            ),
        )
        .unwrap();
        FleetHost {
            name,
            setup,
            runner_root,
            uids,
            agent: None,
        }
    }
}

impl FleetHost {
    /// Starts (or starts again) `rm-agent run`, logging (debug) to a file of its own. A fleet
    /// host has no listener of its own: nothing to wait for.
    pub fn start(&mut self) {
        self.start_with_env(&[]);
    }

    /// [`FleetHost::start`] with variables set for this start alone (a crash point:
    /// `RM_FAULT_CRASH_AT`, agent/src/executor/fault.rs).
    pub fn start_with_env(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::File::create(self.setup.dir.path().join(format!(
            "agent-{}.log",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )))
        .unwrap();
        let mut command = self.setup.command(&["run"]);
        command.env("RM_JOURNAL_PASSWORD", JOURNAL_PASSWORD);
        command.envs(env.iter().copied());
        command
            .env("RM_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(log);
        self.agent = Some(Agent::spawn(command, self.setup.addr));
    }

    /// SIGKILL to the agent alone: its runners go on (what a crashed agent leaves).
    pub fn kill(&mut self) {
        if let Some(agent) = self.agent.take() {
            agent.kill();
        }
    }

    /// Whether the agent process has exited by itself.
    pub fn exited(&mut self) -> bool {
        self.agent.as_mut().is_some_and(Agent::exited)
    }

    /// Every attempt in its own journal (SQLite, in its data directory), newest first.
    pub fn attempts(&self) -> Vec<AttemptRecord> {
        match Reader::open(&self.setup.journal()) {
            Ok(reader) => reader.attempts(10_000).unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    /// Whether every attempt it journalled is cleaned.
    pub fn all_cleaned(&self) -> bool {
        self.attempts()
            .iter()
            .all(|a| a.state == AttemptState::Cleaned)
    }

    /// What runners left in its runner root (its package store aside).
    pub fn runtimes(&self) -> Vec<PathBuf> {
        crate::runtimes_in(&self.runner_root)
    }

    /// The processes running under its runner uids.
    pub fn runner_processes(&self) -> Vec<u32> {
        processes_of_uids(self.uids)
    }

    /// SIGKILLs every process under its runner uids (nothing else runs under them: they are
    /// this host's alone), for a test that must leave nothing behind whatever happened.
    pub fn kill_runner_processes(&self) {
        for pid in self.runner_processes() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

impl Drop for FleetHost {
    /// A killed host's runners outlive its agent; a failed test must not leave them running.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- {} ----\n{}", self.name, self.setup.failure_report());
        }
        self.kill();
        self.kill_runner_processes();
        crate::fleet::sweep_kernel(
            &self.setup.dir.path().join("data"),
            &self.attempts(),
            self.uids,
        );
    }
}

/// The pids of processes whose real uid is in `first..=last`.
pub fn processes_of_uids((first, last): (u32, u32)) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        if uid.is_some_and(|u| (first..=last).contains(&u)) {
            pids.push(pid);
        }
    }
    pids
}
