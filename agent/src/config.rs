//! The agent's configuration (CONTRACT §2): the TOML file's shape, and the validation that turns
//! it into a [`Config`] or into one error naming the file, the key, what is wrong and what would
//! be right. Unknown keys, wrong types and out-of-range values are all refused at start.

pub mod bounds;
pub mod cache;
mod duration;
pub mod egress;
pub mod fitness;
pub mod image;
pub mod logs;
pub mod notifications;
pub mod rerun;
pub mod runner_version;
pub mod scale_sets;
pub mod shape;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rm_journal::Retention;
use serde::Deserialize;

// The values the runner crate acts on are its own types; the configuration parses into them.
pub use duration::ConfigDuration;
pub use rm_runner::cgroup::Limits as RunnerLimits;
pub use rm_runner::docker::{DockerPolicy, ImageFile, RegistryMirror};
pub use rm_runner::isolate::RunnerUids;
pub use rm_runner::network::{Cidr, NETWORK_SLOTS};
// What shapes are made of (issue 42): the host's capacity and devices, a policy's shapes.
pub use shape::{Device, HostCapacity, PolicyShapes, ShapeBounds};

/// Where the configuration is looked for when neither `--config` nor `$RM_CONFIG` names it.
pub const DEFAULT_CONFIG_FILE: &str = "rm-agent.toml";
/// The data directory when neither the file, `--data-dir` nor `$RM_DATA_DIR` names one.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/rm-agent";
/// GitHub.com's REST API.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// The receiver's default webhook path.
pub const DEFAULT_WEBHOOK_PATH: &str = "/webhook";

/// A configuration mistake: which file, which key, and what would be right.
#[derive(Debug, thiserror::Error)]
#[error("{file}: `{key}`: {problem}")]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub problem: String,
}

/// The file as written. Every table refuses keys it does not know.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    #[serde(default)]
    pub github: GithubSection,
    pub receiver: Option<ReceiverSection>,
    pub relay: Option<RelaySection>,
    #[serde(default)]
    pub host: HostSection,
    #[serde(default)]
    pub runner: RunnerSection,
    #[serde(default)]
    pub polling: PollingSection,
    #[serde(default)]
    pub notifications: NotificationsSection,
    #[serde(default)]
    pub journal: JournalSection,
    /// `[logs]`: the bounds of the kept runner logs.
    #[serde(default)]
    pub logs: logs::LogsSection,
    /// `[cache]`: the host-local cache service; absent, no runner is cached.
    #[serde(default)]
    pub cache: Option<cache::CacheSection>,
    #[serde(default, rename = "policy")]
    pub policies: Vec<PolicySection>,
    /// `[[scale_set]]`: GitHub runner scale sets served by a policy's runners.
    #[serde(default, rename = "scale_set")]
    pub scale_sets: Vec<scale_sets::ScaleSetSection>,
}

/// `[github]`: the App and where GitHub's API is.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GithubSection {
    pub api_url: Option<String>,
    pub app_id: Option<u64>,
    pub private_key_file: Option<PathBuf>,
    pub webhook_secret_file: Option<PathBuf>,
    pub pacing: Option<String>,
    /// `[[github.app]]`: several Apps installed on the same targets, the first the primary;
    /// instead of `app_id` and `private_key_file`.
    #[serde(default, rename = "app")]
    pub apps: Vec<AppSection>,
}

/// One `[[github.app]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSection {
    pub id: u64,
    pub private_key_file: PathBuf,
}

/// `[receiver]`: inbound webhooks. Without the table there is no inbound HTTP at all.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverSection {
    pub listen: String,
    pub path: Option<String>,
}

/// `[relay]`: a subscription to an `rm-relay` channel.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    pub url: String,
    pub token_file: Option<PathBuf>,
}

/// `[host]`: this machine.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSection {
    pub name: Option<String>,
    pub max_runners: Option<u32>,
    pub runner_root: Option<PathBuf>,
    pub isolation: Option<String>,
    pub runner_uids: Option<RunnerUidsSection>,
    pub cgroup_root: Option<String>,
    /// The fitness gate (`crate::fitness`): least free space on the runner root's filesystem.
    pub min_free_space: Option<String>,
    /// The least free space on the data directory's filesystem.
    pub data_dir_min_free_space: Option<String>,
    /// Programs runners need: names looked up on the runners' `PATH`, or absolute paths.
    pub required_tools: Option<Vec<String>>,
    /// `"private"` (a network namespace per runner) or `"host"`.
    pub network: Option<String>,
    /// Host loopback TCP ports runners reach at `127.0.0.1:PORT` in their namespace.
    pub network_host_ports: Option<Vec<u16>>,
    /// Networks no runner reaches, besides the built-in ones.
    pub network_deny: Option<Vec<String>>,
    /// What of the host's `/run` runners keep in the empty `/run` each gets.
    pub runner_run_keep: Option<Vec<PathBuf>>,
    /// What every `policy.egress` allows besides its own list ([`egress`]).
    pub egress_allow: Option<Vec<String>>,
    /// The resolver the agent's egress resolver forwards allowed names to (`"ADDR:PORT"`).
    pub dns_upstream: Option<String>,
    /// What the host offers jobs' shapes: CPUs, memory, disk ([`shape`]); absent: the machine
    /// less `reserve`.
    pub capacity: Option<shape::ResourcesSection>,
    /// What of the machine is kept for the host when `capacity` is not written.
    pub reserve: Option<shape::ResourcesSection>,
    /// `[[host.device]]`: the devices a job may be given, each whole.
    #[serde(default, rename = "device")]
    pub devices: Vec<shape::DeviceSection>,
}

/// `host.runner_uids` as written: a range `"64200-64263"` or a list of account names.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RunnerUidsSection {
    Range(String),
    Accounts(Vec<String>),
}

/// `[runner]`: the runner package and its timeouts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerSection {
    pub package_dir: Option<PathBuf>,
    pub version: Option<String>,
    pub idle_timeout: Option<ConfigDuration>,
    pub registration_timeout: Option<ConfigDuration>,
    /// How long an idle runner may live unlisted by GitHub before it is stopped as a ghost.
    pub ghost_timeout: Option<ConfigDuration>,
    /// How often `version = "latest"` asks GitHub for a new release.
    pub release_check_interval: Option<ConfigDuration>,
}

/// `[polling]`: the REST fallback's pace.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PollingSection {
    pub interval: Option<ConfigDuration>,
    pub idle_interval: Option<ConfigDuration>,
}

/// `[notifications]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationsSection {
    pub desktop: Option<bool>,
    /// `[[notifications.webhook]]`: endpoints each event is posted to as JSON.
    pub webhook: Option<Vec<notifications::WebhookSection>>,
}

/// `[journal]`: where the journal is (CONTRACT §9: the embedded SQLite file, or a fleet's
/// PostgreSQL database) and how long it keeps what it holds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalSection {
    /// A PostgreSQL connection string; without it, the SQLite journal in `data_dir`.
    pub url: Option<String>,
    pub body_retention: Option<ConfigDuration>,
    pub delivery_retention: Option<ConfigDuration>,
    pub job_retention: Option<ConfigDuration>,
}

/// One `[[policy]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    pub name: String,
    pub target: String,
    pub labels: Vec<String>,
    pub runner_group_id: Option<u64>,
    pub max_runners: Option<u32>,
    pub min_runners: Option<u32>,
    /// In a fleet (`journal.url`): the policy's ceiling on live runners across all hosts.
    pub fleet_max_runners: Option<u32>,
    pub workspace: Option<String>,
    /// `true`: each runner gets a rootless Docker daemon of its own ([`rm_runner::docker`]).
    pub docker: Option<bool>,
    /// Image tarballs (`docker save` output) loaded into each runner's daemon, each an absolute
    /// path, optionally pinned to the file's SHA-256 (`path@sha256:<hex>`,
    /// [`rm_runner::docker::ImageFile`]).
    pub docker_images: Option<Vec<String>>,
    /// A pull-through registry mirror each runner's daemon pulls Docker Hub images through.
    pub docker_registry_mirror: Option<String>,
    /// What the policy accepts its Docker jobs may take without bound where the host cannot
    /// bound it (`"memory"`, `"pids"`).
    pub docker_unbounded: Option<Vec<String>>,
    /// A size, or `"none"`; absent: [`bounds::default_memory_max`].
    pub memory_max: Option<String>,
    /// A count, or `"none"`; absent: [`bounds::DEFAULT_PIDS_MAX`].
    pub pids_max: Option<bounds::CountOrNone>,
    pub cpu_weight: Option<u32>,
    /// A size, or `"none"`; absent: [`bounds::DEFAULT_DISK_MAX`].
    pub disk_max: Option<String>,
    /// `KEY=VALUE` lines added to this policy's runners' environment ([`rm_runner::env_file`]).
    pub env_file: Option<PathBuf>,
    /// When set, the only networks this policy's runners reach.
    pub network_allow: Option<Vec<String>>,
    /// `[policy.egress]`: the names its runners reach ([`egress`]).
    pub egress: Option<egress::EgressSection>,
    /// `cache = true`: the policy's runners use the host-local cache (`[cache]`).
    pub cache: Option<bool>,
    /// The image the policy's runners run in (`oci:`, `oci-archive:`, `docker-archive:`,
    /// `docker://`), [`image`].
    pub image: Option<String>,
    /// How often a tag of `image` is resolved again; absent: only at start.
    pub image_refresh: Option<ConfigDuration>,
    /// The registry's `user:password`, for a `docker://` image.
    pub image_credentials_file: Option<PathBuf>,
    /// Failure reasons whose job rm asks GitHub to re-run ([`rerun::RERUNNABLE_REASONS`]);
    /// absent or `[]`: none.
    pub rerun_on: Option<Vec<String>>,
    /// At most this many re-runs of one job; absent: [`rerun::DEFAULT_MAX_RERUNS`].
    pub max_reruns: Option<u32>,
    /// The CPUs of a runner whose job asks none (`8`, `0.5`; [`shape`]).
    pub cpu: Option<toml::Value>,
    /// The most a job's shape labels may ask (`{ cpu = 16, memory = "64G", gpu = 2 }`).
    pub shape_max: Option<shape::ShapeSection>,
    /// `[[policy.shape]]`: named shapes a job picks with `rm-shape=NAME`.
    #[serde(default, rename = "shape")]
    pub shapes: Vec<shape::NamedShapeSection>,
}

/// The validated configuration.
#[derive(Debug)]
pub struct Config {
    /// The file it came from, when there was one.
    pub source: Option<PathBuf>,
    pub data_dir: PathBuf,
    pub github: Github,
    pub receiver: Option<ReceiverSettings>,
    pub relay: Option<RelaySettings>,
    pub host: Host,
    pub runner: Runner,
    pub polling: Polling,
    pub desktop_notifications: bool,
    /// `[[notifications.webhook]]`, in the file's order (`crate::notify` posts to each).
    pub webhook_notifications: Vec<notifications::Webhook>,
    /// `journal.url`: the fleet's PostgreSQL journal, without its password (that comes from
    /// `RM_JOURNAL_PASSWORD`, [`crate::secrets::journal_target`]); `None`: the SQLite journal.
    pub pg_journal: Option<rm_journal::PgTarget>,
    pub retention: Retention,
    /// `[logs]`: how many runner logs are kept, how long, how much in all.
    pub logs: logs::Logs,
    /// `[cache]`: the host-local cache service (`rm_cache`), run by `rm-agent run` when a
    /// policy sets `cache = true`.
    pub cache: Option<cache::Cache>,
    pub policies: Vec<Policy>,
    /// Each policy's re-run rule (`rerun_on`, `max_reruns`), by policy name; a policy without
    /// `rerun_on` has none. Beside [`Policy`] rather than in it: only the re-run scan reads it.
    pub reruns: std::collections::BTreeMap<String, rerun::RerunPolicy>,
    /// `[[scale_set]]`, in the file's order; each one's policy names it in [`Policy::scale_set`].
    pub scale_sets: Vec<scale_sets::ScaleSet>,
}

#[derive(Debug)]
pub struct Github {
    pub api_url: String,
    /// The primary App: `github.app_id`, or the first `[[github.app]]`. It reads webhook
    /// deliveries and makes every request but JIT registrations.
    pub app_id: Option<u64>,
    pub private_key_file: Option<PathBuf>,
    /// The Apps after the first `[[github.app]]`: JIT registrations are spread over every
    /// App's installation covering a target. Empty with one App.
    pub more_apps: Vec<GithubApp>,
    /// The Apps were listed as `[[github.app]]`: every key comes from its file, and
    /// `$RM_GITHUB_PRIVATE_KEY` (one key, no App named) is refused.
    pub app_list: bool,
    pub webhook_secret_file: Option<PathBuf>,
    /// `github.pacing`: how requests of one installation are paced.
    pub pacing: rm_github::pacing::Pacing,
}

/// One App beside the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GithubApp {
    pub id: u64,
    pub private_key_file: PathBuf,
}

impl Github {
    /// Every configured App's id and key file (`None`: from `$RM_GITHUB_PRIVATE_KEY`), the
    /// primary first, each with the key that names its file in the configuration.
    pub fn apps(&self) -> Vec<(u64, Option<&Path>, String)> {
        let mut apps = Vec::new();
        if let Some(id) = self.app_id {
            let key = if self.app_list {
                "github.app[0].private_key_file"
            } else {
                "github.private_key_file"
            };
            apps.push((id, self.private_key_file.as_deref(), key.to_owned()));
        }
        for (n, app) in self.more_apps.iter().enumerate() {
            apps.push((
                app.id,
                Some(app.private_key_file.as_path()),
                format!("github.app[{}].private_key_file", n + 1),
            ));
        }
        apps
    }
}

#[derive(Debug)]
pub struct ReceiverSettings {
    pub listen: SocketAddr,
    pub path: String,
}

#[derive(Debug)]
pub struct RelaySettings {
    pub url: String,
    pub token_file: Option<PathBuf>,
}

#[derive(Debug)]
pub struct Host {
    pub name: String,
    pub max_runners: u32,
    pub runner_root: PathBuf,
    /// `host.isolation`; the default ([`Isolation::User`]) unless the file names one.
    pub isolation: Isolation,
    /// Whether the file named `host.isolation` (CONTRACT §7: `none` is only ever taken when
    /// named, and an unnamed `user` that cannot be had refuses `run`).
    pub isolation_named: bool,
    pub runner_uids: RunnerUids,
    /// `host.cgroup_root`: `None` is `"auto"`.
    pub cgroup_root: Option<PathBuf>,
    /// What the fitness gate requires of this host ([`crate::fitness`]).
    pub fitness: fitness::Thresholds,
    /// `host.network`: the default ([`Network::Private`]) under `isolation = "user"`.
    pub network: Network,
    /// `host.network_host_ports`.
    pub network_host_ports: Vec<u16>,
    /// `host.network_deny` (the built-in list is added by the runner's network).
    pub network_deny: Vec<Cidr>,
    /// `host.runner_run_keep`: each a plain path below `/run`
    /// ([`rm_runner::isolate::run_keep_entry`]).
    pub runner_run_keep: Vec<PathBuf>,
    /// `host.egress_allow` and `host.dns_upstream` ([`egress`]).
    pub egress: egress::HostEgress,
    /// What the host offers jobs' shapes (`host.capacity`, or the machine less `host.reserve`).
    pub capacity: HostCapacity,
    /// `[[host.device]]`, in the file's order; each node in one device only.
    pub devices: Vec<Device>,
}

/// What a runner's network is (CONTRACT §7, `rm_runner::network`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// A network namespace per runner: the world through NAT; nothing of the host but the
    /// named ports; no metadata service, no other runner.
    Private,
    /// The host's own network: a job reaches every service of the host.
    Host,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Private => "private",
            Network::Host => "host",
        }
    }
}

/// How runners are kept from the agent, from each other and from later jobs (CONTRACT §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// A uid of the pool, a cgroup and a private mount namespace per runner.
    User,
    /// Runners run as the agent's own user: only for code the operator wrote.
    None,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::User => "user",
            Isolation::None => "none",
        }
    }
}

#[derive(Debug)]
pub struct Runner {
    pub package_dir: Option<PathBuf>,
    /// A pinned `2.330.0`, or `"latest"` ([`runner_version::LATEST`]).
    pub version: Option<String>,
    pub idle_timeout: Duration,
    pub registration_timeout: Duration,
    /// An idle runner alive while GitHub has not listed it online this long is stopped as a
    /// ghost (default [`crate::lifecycle::GHOST_AFTER`]).
    pub ghost_timeout: Duration,
    /// How often `version = "latest"` asks GitHub for a new release (default a day).
    pub release_check_interval: Duration,
}

#[derive(Debug)]
pub struct Polling {
    pub interval: Duration,
    pub idle_interval: Duration,
}

/// What a policy targets: the one target type of the workspace (issue 13), with its parser and
/// [`Target::contains`].
pub use rm_github::Target;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workspace {
    Ephemeral,
    Persistent,
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub target: Target,
    pub labels: Vec<String>,
    pub runner_group_id: u64,
    pub max_runners: u32,
    pub min_runners: u32,
    /// `fleet_max_runners`: in a fleet, the policy's live runners across every host (claims
    /// counted in the shared journal, CONTRACT §9); `None`: no fleet-wide ceiling.
    pub fleet_max_runners: Option<u32>,
    pub workspace: Workspace,
    /// `docker = true`: a rootless Docker daemon per runner (issue 30); `None`: no Docker.
    pub docker: Option<DockerPolicy>,
    /// Per-runner limits applied through the runner's cgroup (and `pids_max` as the runner
    /// uid's process limit), defaults included ([`bounds`]).
    pub limits: RunnerLimits,
    /// `memory_max` as the file wrote it: what the fitness gate requires available before a
    /// runner of the policy is registered. A default share is a bound, not a reservation: the
    /// gate would otherwise hold a busy host unfit for memory its idle runners never use.
    pub memory_required: Option<u64>,
    /// `disk_max`: the bytes a runner's runtime may hold before supervision stops it
    /// ([`rm_runner::disk`]); `None`: no bound (`"none"`).
    pub disk_max: Option<u64>,
    /// `disk_max` as the file wrote it: what a runner of the policy whose job asks no disk
    /// takes from the host's disk capacity (`crate::shape::reservation`); the default bound is
    /// a ceiling, not a reservation, as for [`Policy::memory_required`].
    pub disk_required: Option<u64>,
    /// `cpu`, `shape_max` and `[[policy.shape]]`: the shapes its jobs may ask for
    /// (`crate::shape`); empty: every runner the same size, as before shapes.
    pub shapes: PolicyShapes,
    /// `env_file`: where operator variables for this policy's runners come from (read once
    /// when `rm-agent run` starts, by `rm_runner::env_file::load_policies`).
    pub env_file: Option<PathBuf>,
    /// `network_allow`: when set, the only networks this policy's runners reach.
    pub network_allow: Option<Vec<Cidr>>,
    /// `[policy.egress]`: its runners reach only the names (and networks) it and
    /// `host.egress_allow` list, or, in audit mode, what they would not is recorded
    /// ([`egress::PolicyEgress`], `crate::egress`); `None`: `network_allow` decides.
    pub egress: Option<egress::PolicyEgress>,
    /// `cache = true`: the policy's runners use the host-local cache service for actions/cache
    /// and the action archives (`[cache]`), when their runner package takes the redirect.
    pub cache: bool,
    /// `image`: the runners' root is this image ([`image::PolicyImage`], `crate::image`);
    /// `None`: the host's.
    pub image: Option<image::PolicyImage>,
    /// The `[[scale_set]]` this policy's runners serve ([`scale_sets`]): its demand comes from
    /// the scale set's statistics, never from webhook or polled jobs. `None`: a webhook policy.
    pub scale_set: Option<scale_sets::ScaleSet>,
}

impl Policy {
    /// Whether the App's installation on [`Policy::target`] is what this policy's runners are
    /// registered through: every policy's but an enterprise scale set's (registered with the
    /// enterprise's PAT; its target is then not where it lives).
    pub fn registers_through_app(&self) -> bool {
        self.scale_set
            .as_ref()
            .is_none_or(|set| set.enterprise.is_none())
    }
}

impl Config {
    /// The target whose App installation reads what any installation may read (the runner
    /// releases of `actions/runner`): the first policy registering through the App, else the
    /// first policy's (an agent serving enterprise scale sets only).
    pub fn reading_target(&self) -> Option<&Target> {
        self.policies
            .iter()
            .find(|p| p.registers_through_app())
            .or(self.policies.first())
            .map(|p| &p.target)
    }
}

/// Where the configuration comes from, after the command line and the environment had a say.
#[derive(Debug, Clone)]
pub struct Sources {
    /// `--config` or `$RM_CONFIG`: must exist.
    pub explicit_file: Option<PathBuf>,
    /// `--data-dir` or `$RM_DATA_DIR`: wins over the file's `data_dir`.
    pub data_dir: Option<PathBuf>,
}

/// Loads and validates the configuration. A file named explicitly must exist; the default
/// `./rm-agent.toml` may be absent, and then every key takes its default.
pub fn load(sources: &Sources) -> Result<Config, ConfigError> {
    let (path, text) = match &sources.explicit_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|err| ConfigError {
                file: path.display().to_string(),
                key: "--config".to_owned(),
                problem: format!(
                    "cannot read the configuration file ({err}); pass an existing file with --config or $RM_CONFIG"
                ),
            })?;
            (Some(path.clone()), text)
        }
        None => match std::fs::read_to_string(DEFAULT_CONFIG_FILE) {
            Ok(text) => (Some(PathBuf::from(DEFAULT_CONFIG_FILE)), text),
            Err(_) => (None, String::new()),
        },
    };
    let file = parse(path.as_deref(), &text)?;
    let facts =
        bounds::HostFacts::probe(&validate::runner_root(&file, sources.data_dir.as_deref()));
    validate::validate(file, path, sources.data_dir.clone(), facts)
}

/// Loads and validates configuration text that comes from no file (tests, embedded examples),
/// on this host.
pub fn from_text(text: &str) -> Result<Config, ConfigError> {
    let file = parse(None, text)?;
    let facts = bounds::HostFacts::probe(&validate::runner_root(&file, None));
    validate::validate(file, None, None, facts)
}

/// [`from_text`] as if on a host with these facts.
pub fn from_text_on(text: &str, host: bounds::HostFacts) -> Result<Config, ConfigError> {
    validate::validate(parse(None, text)?, None, None, host)
}

/// Parses the TOML text, naming the key path of any mistake.
pub fn parse(path: Option<&Path>, text: &str) -> Result<FileConfig, ConfigError> {
    let file_name = display_file(path);
    let deserializer = toml::de::Deserializer::parse(text).map_err(|err| ConfigError {
        file: file_name.clone(),
        key: "(syntax)".to_owned(),
        problem: toml_problem(text, &err),
    })?;
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let key = err.path().to_string();
        ConfigError {
            file: file_name,
            key: if key == "." {
                "(top level)".to_owned()
            } else {
                key
            },
            problem: toml_problem(text, err.inner()),
        }
    })
}

/// The file name as errors show it.
pub fn display_file(path: Option<&Path>) -> String {
    path.map_or_else(
        || "(no configuration file)".to_owned(),
        |p| p.display().to_string(),
    )
}

/// A TOML error as one line with its line number.
fn toml_problem(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim().replace('\n', " ");
    match err.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("{message} (line {line})")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests;
