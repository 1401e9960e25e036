//! Turning the file's values into a [`Config`]: defaults, ranges and the rules that tie keys
//! together. Pure: it reads no files and no clock, so every rule is a unit test.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rm_journal::Retention;
use rm_runner::docker::unbounded::Unbounded;

use super::*;

/// The active polling interval's floor: faster polling spends the shared request budget.
const POLLING_INTERVAL_FLOOR: Duration = Duration::from_secs(30);
/// The idle interval's floor. A conditional request answered 304 is free, so it may be short.
const POLLING_IDLE_FLOOR: Duration = Duration::from_secs(5);
const DEFAULT_POLLING_INTERVAL: Duration = Duration::from_secs(60);
const DEFAULT_POLLING_IDLE: Duration = Duration::from_secs(10);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// GitHub lets an App redeliver for 3 days; forgetting a GUID sooner would let a redelivery in
/// twice.
const MIN_DELIVERY_RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// Completed jobs are kept at least GitHub's queue lifetime: until then a job's old `queued`
/// body posted again under a fresh GUID is not yet `stale` by its dates, and only the completed
/// row keeps it from becoming demand again.
const MIN_JOB_RETENTION: Duration =
    Duration::from_millis(rm_handlers::QUEUE_LIFETIME_MS.unsigned_abs());
/// The Default runner group.
const DEFAULT_RUNNER_GROUP: u64 = 1;
/// Runner names are `rm-<host>-<12 hex>`; GitHub caps runner names at 64 characters.
const MAX_HOST_NAME_LEN: usize = 40;
/// The default runner uid pool (CONTRACT §7): 64 uids far above any distribution's regular and
/// system accounts, below 65534 (`nobody`).
pub(super) const DEFAULT_RUNNER_UIDS: RunnerUids = RunnerUids::Range {
    first: 64200,
    last: 64263,
};
/// The largest pool: a bigger one is a typo, and allocation scans it.
const MAX_POOL: usize = 65_536;
/// cgroup v2 `cpu.weight` bounds.
const CPU_WEIGHT_MIN: u32 = 1;
const CPU_WEIGHT_MAX: u32 = 10_000;
/// Uids a runner may never have: root, and `nobody`/the overflow uid (files of unmapped users
/// show as it, so a runner holding it could read them).
const FORBIDDEN_UIDS: [u32; 2] = [0, 65534];

/// The primary App's id and key file, and the Apps after it.
type Apps = (Option<u64>, Option<PathBuf>, Vec<GithubApp>);

/// The primary App (id, key file) and the others, from `github.app_id` and
/// `github.private_key_file` or from `[[github.app]]`: one form or the other, never both, and
/// no App twice. `Err` names the key and the problem.
fn apps(section: &GithubSection) -> Result<Apps, (String, String)> {
    if section.apps.is_empty() {
        return Ok((section.app_id, section.private_key_file.clone(), Vec::new()));
    }
    let single = [
        ("github.app_id", section.app_id.is_some()),
        (
            "github.private_key_file",
            section.private_key_file.is_some(),
        ),
    ];
    if let Some((key, _)) = single.iter().find(|(_, set)| *set) {
        return Err((
            (*key).to_owned(),
            "names the App beside `[[github.app]]`; use one form: move it into the first `[[github.app]]` entry (`id`, `private_key_file`), the primary App".to_owned(),
        ));
    }
    let mut seen = Vec::new();
    for (n, app) in section.apps.iter().enumerate() {
        if app.id == 0 {
            return Err((
                format!("github.app[{n}].id"),
                "must be the App's id, a positive number".to_owned(),
            ));
        }
        if seen.contains(&app.id) {
            return Err((
                format!("github.app[{n}].id"),
                format!(
                    "App {} is listed twice; each `[[github.app]]` is a different App (another installation of the same App on a target is the same App)",
                    app.id
                ),
            ));
        }
        seen.push(app.id);
    }
    let mut apps = section.apps.iter().map(|a| GithubApp {
        id: a.id,
        private_key_file: a.private_key_file.clone(),
    });
    let primary = apps.next();
    Ok((
        primary.as_ref().map(|p| p.id),
        primary.map(|p| p.private_key_file),
        apps.collect(),
    ))
}

pub(super) fn validate(
    file: FileConfig,
    source: Option<PathBuf>,
    data_dir_override: Option<PathBuf>,
    host_facts: bounds::HostFacts,
) -> Result<Config, ConfigError> {
    let file_name = display_file(source.as_deref());
    let err = |key: &str, problem: String| ConfigError {
        file: file_name.clone(),
        key: key.to_owned(),
        problem,
    };

    let runner_root = runner_root(&file, data_dir_override.as_deref());
    let data_dir = data_dir_override
        .or(file.data_dir)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));

    let api_url = file
        .github
        .api_url
        .clone()
        .unwrap_or_else(|| DEFAULT_API_URL.to_owned());
    if let Err(problem) = transport(&api_url) {
        return Err(err(
            "github.api_url",
            format!(
                "`{api_url}` {problem}; use \"https://api.github.com\" or your GHES \"https://HOST/api/v3\""
            ),
        ));
    }
    if file.github.app_id == Some(0) {
        return Err(err(
            "github.app_id",
            "must be the App's id, a positive number".to_owned(),
        ));
    }
    let pacing = match file.github.pacing.as_deref() {
        None | Some("documented") => rm_github::pacing::Pacing::default(),
        Some("cautious") => rm_github::pacing::Pacing::Cautious(rm_github::pacing::DOCUMENTED),
        Some("one_per_second") => {
            rm_github::pacing::Pacing::Spaced(rm_github::budget::MUTATION_SPACING)
        }
        Some(other) => {
            return Err(err(
                "github.pacing",
                format!(
                    "`{other}` is not a pacing; use \"documented\" (GitHub's documented secondary limits, content creation counted once GitHub shows it counts it; the default), \"cautious\" (every POST counted as content from the start) or \"one_per_second\" (a second between two mutations)"
                ),
            ));
        }
    };
    let (app_id, private_key_file, more_apps) = apps(&file.github).map_err(|(k, p)| err(&k, p))?;
    let github = Github {
        api_url: api_url.trim_end_matches('/').to_owned(),
        app_id,
        private_key_file,
        more_apps,
        app_list: !file.github.apps.is_empty(),
        webhook_secret_file: file.github.webhook_secret_file,
        pacing,
    };

    let receiver = match file.receiver {
        None => None,
        Some(section) => {
            let listen: SocketAddr = section.listen.parse().map_err(|_| {
                err(
                    "receiver.listen",
                    format!(
                        "`{}` is not an address and port; write it like \"0.0.0.0:8080\"",
                        section.listen
                    ),
                )
            })?;
            let path = section
                .path
                .unwrap_or_else(|| DEFAULT_WEBHOOK_PATH.to_owned());
            if !path.starts_with('/') || path == "/healthz" || path == "/metrics" {
                return Err(err(
                    "receiver.path",
                    format!(
                        "`{path}` must start with `/` and not be /healthz or /metrics; the default is \"/webhook\""
                    ),
                ));
            }
            Some(ReceiverSettings { listen, path })
        }
    };

    let relay = match file.relay {
        None => None,
        Some(section) => {
            if let Err(problem) = transport(&section.url) {
                return Err(err(
                    "relay.url",
                    format!(
                        "`{}` {problem}; use the subscribe URL `rm-relay channel add` printed (behind TLS)",
                        section.url
                    ),
                ));
            }
            Some(RelaySettings {
                url: section.url,
                token_file: section.token_file,
            })
        }
    };

    let host_name = match file.host.name {
        Some(name) => name,
        None => default_host_name(),
    };
    if host_name.is_empty()
        || host_name.len() > MAX_HOST_NAME_LEN
        || !host_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(err(
            "host.name",
            format!(
                "`{host_name}` must be 1 to {MAX_HOST_NAME_LEN} letters, digits or `-` (it is part of every runner name); set [host] name"
            ),
        ));
    }
    let max_runners = file.host.max_runners.unwrap_or(1);
    if max_runners == 0 {
        return Err(err("host.max_runners", "must be at least 1".to_owned()));
    }
    let (isolation, isolation_named) = match file.host.isolation.as_deref() {
        None => (Isolation::User, false),
        Some("user") => (Isolation::User, true),
        Some("none") => (Isolation::None, true),
        Some(other) => {
            return Err(err(
                "host.isolation",
                format!(
                    "`{other}` is not an isolation; use \"user\" (a uid and a cgroup per runner) or \"none\" (runners as the agent's own user, only for code you wrote)"
                ),
            ));
        }
    };
    let runner_uids = match file.host.runner_uids {
        None => DEFAULT_RUNNER_UIDS,
        Some(section) => {
            runner_uids(section).map_err(|problem| err("host.runner_uids", problem))?
        }
    };
    if isolation == Isolation::User && runner_uids.len() < max_runners as usize {
        return Err(err(
            "host.runner_uids",
            format!(
                "holds {} uid(s), fewer than host.max_runners ({max_runners}); every live runner needs a uid of its own",
                runner_uids.len()
            ),
        ));
    }
    let network = match (file.host.network.as_deref(), isolation) {
        (None, Isolation::User) | (Some("private"), Isolation::User) => Network::Private,
        (None, Isolation::None) | (Some("host"), _) => Network::Host,
        (Some("private"), Isolation::None) => {
            return Err(err(
                "host.network",
                "\"private\" needs isolation = \"user\" (a namespace per runner is made by root); use \"host\" or isolate the runners".to_owned(),
            ));
        }
        (Some(other), _) => {
            return Err(err(
                "host.network",
                format!(
                    "`{other}` is not a network; use \"private\" (a network namespace per runner: the world, none of the host) or \"host\" (runners share the host's network and reach its every service)"
                ),
            ));
        }
    };
    let mut network_host_ports = file.host.network_host_ports.unwrap_or_default();
    if network_host_ports.contains(&0) {
        return Err(err("host.network_host_ports", "0 is not a port".to_owned()));
    }
    let cache = file
        .cache
        .map(|section| super::cache::validate(section, &data_dir))
        .transpose()
        .map_err(|(key, problem)| err(key, problem))?;
    let cached = file.policies.iter().any(|p| p.cache == Some(true));
    // Runners reach the service through their network's host-port path: its port is one of
    // them whenever a policy uses it (said in configuration.md).
    if let Some(cache) = &cache
        && cached
        && !network_host_ports.contains(&cache.port)
    {
        network_host_ports.push(cache.port);
    }
    let network_deny = cidrs(file.host.network_deny.unwrap_or_default())
        .map_err(|problem| err("host.network_deny", problem))?;
    let runner_run_keep = file.host.runner_run_keep.unwrap_or_default();
    if runner_run_keep.len() > rm_runner::isolate::MAX_RUN_KEEP {
        return Err(err(
            "host.runner_run_keep",
            format!(
                "names {} paths, more than {}; keep a directory that holds them",
                runner_run_keep.len(),
                rm_runner::isolate::MAX_RUN_KEEP
            ),
        ));
    }
    for path in &runner_run_keep {
        rm_runner::isolate::run_keep_entry(path)
            .map_err(|problem| err("host.runner_run_keep", problem))?;
    }
    if network == Network::Private && runner_uids.len() > NETWORK_SLOTS as usize {
        return Err(err(
            "host.runner_uids",
            format!(
                "holds {} uids, more than the {NETWORK_SLOTS} runner networks host.network = \"private\" numbers; use a smaller pool",
                runner_uids.len()
            ),
        ));
    }
    let cgroup_root = match file.host.cgroup_root.as_deref() {
        None | Some("auto") => None,
        Some(path) if path.starts_with('/') => Some(PathBuf::from(path)),
        Some(other) => {
            return Err(err(
                "host.cgroup_root",
                format!(
                    "`{other}` is neither \"auto\" nor an absolute directory inside the cgroup v2 mount"
                ),
            ));
        }
    };
    let capacity = super::shape::host_capacity(file.host.capacity, file.host.reserve, &host_facts)
        .map_err(|(key, problem)| err(&format!("host.{key}"), problem))?;
    let devices = super::shape::devices(file.host.devices)
        .map_err(|(key, problem)| err(&format!("host.{key}"), problem))?;
    // Only an isolated runner gets a `/dev` of its own: under `none` every job would see
    // every device.
    if !devices.is_empty() && isolation != Isolation::User {
        return Err(err(
            "host.device",
            "gives each runner only its own devices in a /dev of its own, which needs host.isolation = \"user\"".to_owned(),
        ));
    }
    let host = Host {
        name: host_name,
        max_runners,
        runner_root,
        isolation,
        isolation_named,
        runner_uids,
        cgroup_root,
        fitness: super::fitness::thresholds(
            file.host.min_free_space.as_deref(),
            file.host.data_dir_min_free_space.as_deref(),
            file.host.required_tools,
        )
        .map_err(|(key, problem)| err(&format!("host.{key}"), problem))?,
        network,
        network_host_ports,
        network_deny,
        runner_run_keep,
        egress: super::egress::validate_host(file.host.egress_allow, file.host.dns_upstream)
            .map_err(|(key, problem)| err(&format!("host.{key}"), problem))?,
        capacity,
        devices,
    };

    if file.runner.package_dir.is_some() && file.runner.version.is_some() {
        return Err(err(
            "runner.version",
            "set either `package_dir` (an unpacked runner) or `version` (downloaded), not both"
                .to_owned(),
        ));
    }
    if let Some(version) = &file.runner.version
        && !is_runner_version(version)
        && version != super::runner_version::LATEST
    {
        // The version becomes part of a URL and of a directory name: digits and dots only.
        return Err(err(
            "runner.version",
            format!(
                "`{version}` is not an actions/runner version; write it as the releases list it, without the `v`, e.g. \"2.330.0\", or \"latest\" to follow actions/runner's releases"
            ),
        ));
    }
    let positive = |key: &str, d: Option<ConfigDuration>, default: Duration| {
        let d = d.map_or(default, |d| d.0);
        if d.is_zero() {
            Err(err(key, "must be longer than zero".to_owned()))
        } else {
            Ok(d)
        }
    };
    let runner = Runner {
        package_dir: file.runner.package_dir,
        version: file.runner.version,
        idle_timeout: positive(
            "runner.idle_timeout",
            file.runner.idle_timeout,
            DEFAULT_IDLE_TIMEOUT,
        )?,
        registration_timeout: positive(
            "runner.registration_timeout",
            file.runner.registration_timeout,
            DEFAULT_REGISTRATION_TIMEOUT,
        )?,
        ghost_timeout: positive(
            "runner.ghost_timeout",
            file.runner.ghost_timeout,
            crate::lifecycle::GHOST_AFTER,
        )?,
        release_check_interval: super::runner_version::check_interval(
            file.runner.release_check_interval.map(|d| d.0),
        )
        .map_err(|problem| err("runner.release_check_interval", problem))?,
    };

    let interval = file
        .polling
        .interval
        .map_or(DEFAULT_POLLING_INTERVAL, |d| d.0);
    if interval < POLLING_INTERVAL_FLOOR {
        return Err(err(
            "polling.interval",
            format!(
                "{} is below the floor of 30s, which keeps the shared request budget safe; use \"30s\" or more",
                humantime::format_duration(interval)
            ),
        ));
    }
    let idle_interval = file
        .polling
        .idle_interval
        .map_or(DEFAULT_POLLING_IDLE.min(interval), |d| d.0);
    if idle_interval < POLLING_IDLE_FLOOR {
        return Err(err(
            "polling.idle_interval",
            format!(
                "{} is below the floor of 5s; use \"5s\" or more",
                humantime::format_duration(idle_interval)
            ),
        ));
    }
    if idle_interval > interval {
        return Err(err(
            "polling.idle_interval",
            format!(
                "{} is above `interval` ({}); the idle interval may not be slower than the active one",
                humantime::format_duration(idle_interval),
                humantime::format_duration(interval)
            ),
        ));
    }

    let defaults = Retention::default();
    let retention = Retention {
        delivery_bodies: file
            .journal
            .body_retention
            .map_or(defaults.delivery_bodies, |d| d.0),
        delivery_rows: file
            .journal
            .delivery_retention
            .map_or(defaults.delivery_rows, |d| d.0),
        finished_jobs: file
            .journal
            .job_retention
            .map_or(defaults.finished_jobs, |d| d.0),
    };
    if retention.delivery_rows < MIN_DELIVERY_RETENTION {
        return Err(err(
            "journal.delivery_retention",
            "must be at least \"3d\", GitHub's redelivery window, or a redelivered GUID would be taken as new".to_owned(),
        ));
    }
    if retention.finished_jobs < MIN_JOB_RETENTION {
        return Err(err(
            "journal.job_retention",
            "must be at least \"1d\", GitHub's queue lifetime, or an old `queued` body posted again could revive a job that was pruned".to_owned(),
        ));
    }
    if retention.delivery_bodies > retention.delivery_rows {
        return Err(err(
            "journal.body_retention",
            "may not be longer than `delivery_retention` (a body is kept with its row)".to_owned(),
        ));
    }

    let logs = super::logs::validate(&file.logs).map_err(|(key, problem)| err(key, problem))?;

    // The password never comes from here: a connection string holding one is refused (the
    // error does not repeat the string).
    let pg_journal = match &file.journal.url {
        None => None,
        Some(url) => Some(
            rm_journal::PgTarget::parse(url)
                .map_err(|problem| err("journal.url", problem.to_string()))?,
        ),
    };

    let mut webhook_notifications = Vec::new();
    for (index, section) in file.notifications.webhook.into_iter().flatten().enumerate() {
        webhook_notifications.push(super::notifications::webhook(section).map_err(
            |(field, problem)| err(&format!("notifications.webhook[{index}].{field}"), problem),
        )?);
    }

    let mut names = HashSet::new();
    let mut policies = Vec::with_capacity(file.policies.len());
    let mut reruns = std::collections::BTreeMap::new();
    for (index, mut section) in file.policies.into_iter().enumerate() {
        let key = |field: &str| format!("policy[{index}].{field}");
        let rerun = super::rerun::validate(section.rerun_on.take(), section.max_reruns.take())
            .map_err(|(field, problem)| err(&key(field), problem))?;
        let shapes = super::shape::PolicyShapesSection {
            cpu: section.cpu.take(),
            shape_max: section.shape_max.take(),
            shapes: std::mem::take(&mut section.shapes),
        };
        let mut policy = validate_policy(section, max_runners, host_facts)
            .map_err(|(field, problem)| err(&key(field), problem))?;
        policy.shapes = super::shape::policy_shapes(shapes, &host.capacity, &host.devices)
            .map_err(|(field, problem)| err(&key(&field), problem))?;
        // A policy that takes shapes reads every job label starting with `rm-` as one: a
        // runner label of its own starting so could never be asked for.
        if policy.shapes.accepts_shapes()
            && let Some(label) = policy
                .labels
                .iter()
                .find(|l| super::shape::is_shape_label(l))
        {
            return Err(err(
                &key("labels"),
                format!(
                    "`{label}` starts with `rm-`, which a policy with shape_max or [[policy.shape]] reads as a job's shape label; rename the label"
                ),
            ));
        }
        if let Some(rerun) = rerun {
            reruns.insert(policy.name.clone(), rerun);
        }
        if policy.fleet_max_runners.is_some() && pg_journal.is_none() {
            return Err(err(
                &key("fleet_max_runners"),
                "is a fleet's ceiling across hosts and needs `journal.url`; on one host, `max_runners` is the policy's ceiling".to_owned(),
            ));
        }
        if policy.cache {
            cache_reachable(cache.as_ref(), isolation, network)
                .map_err(|problem| err(&key("cache"), problem))?;
        }
        if let Some(egress) = &mut policy.egress {
            egress_possible(isolation, network, policy.network_allow.is_some())
                .map_err(|problem| err(&key("egress"), problem))?;
            egress.allow = std::sync::Arc::new(egress.own.with(&host.egress.allow));
            // The cache reaches its upstream for the runner: only where the runner may itself.
            if let (true, Some(cache)) = (policy.cache, &cache) {
                cache_upstream_allowed(&cache.upstream, egress)
                    .map_err(|problem| err(&key("egress"), problem))?;
            }
        }
        if policy.image.is_some() && isolation != Isolation::User {
            return Err(err(
                &key("image"),
                "is mounted as each runner's root in the runner's own mount namespace, and needs host.isolation = \"user\"".to_owned(),
            ));
        }
        // A runner's own Docker daemon sees the host's `/dev`, not the runner's private one: a
        // job could hand itself any device with `docker run --device`. Refused until the
        // daemon gets the runner's `/dev` too (issue 42).
        if policy.docker.is_some() && !host.devices.is_empty() {
            return Err(err(
                &key("docker"),
                "cannot be used on a host with [[host.device]]: a runner's own Docker daemon sees every device node of the host's /dev; serve Docker jobs from a host without devices".to_owned(),
            ));
        }
        if policy.docker.is_some() && isolation != Isolation::User {
            return Err(err(
                &key("docker"),
                "gives each runner a rootless Docker daemon running as the runner's own uid, and needs host.isolation = \"user\"".to_owned(),
            ));
        }
        if let Some(mirror) = policy
            .docker
            .as_ref()
            .and_then(|d| d.registry_mirror.as_ref())
            && network == Network::Private
        {
            mirror_reachable(mirror, &host.network_host_ports)
                .map_err(|problem| err(&key("docker_registry_mirror"), problem))?;
        }
        if !names.insert(policy.name.clone()) {
            return Err(err(
                &key("name"),
                format!(
                    "`{}` is used by another policy; names must be unique",
                    policy.name
                ),
            ));
        }
        policies.push(policy);
    }
    let scale_sets = super::scale_sets::validate(file.scale_sets, &mut policies)
        .map_err(|(key, problem)| err(&key, problem))?;
    // The cache scopes a runner by its job's journalled row and GitHub's run of it; a scale
    // set's jobs are journalled apart (their runners would only ever be refused).
    if let Some((index, _)) = policies
        .iter()
        .enumerate()
        .find(|(_, p)| p.cache && p.scale_set.is_some())
    {
        return Err(err(
            &format!("policy[{index}].cache"),
            "is not available to a policy that serves a [[scale_set]] yet: its jobs are not scoped; leave `cache` off it".to_owned(),
        ));
    }

    Ok(Config {
        source,
        data_dir,
        github,
        receiver,
        relay,
        host,
        runner,
        polling: Polling {
            interval,
            idle_interval,
        },
        desktop_notifications: file.notifications.desktop.unwrap_or(false),
        webhook_notifications,
        pg_journal,
        retention,
        logs,
        cache,
        policies,
        reruns,
        scale_sets,
    })
}

/// Validates one policy; the error names the field and the problem.
fn validate_policy(
    section: PolicySection,
    host_max: u32,
    host_facts: bounds::HostFacts,
) -> Result<Policy, (&'static str, String)> {
    if section.name.is_empty()
        || !section
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err((
            "name",
            format!(
                "`{}` must be letters, digits, `-` or `_` (it names a directory)",
                section.name
            ),
        ));
    }
    let target = parse_target(&section.target).ok_or_else(|| {
        (
            "target",
            format!(
                "`{}` is neither an organization (\"acme\") nor a repository (\"acme/widgets\")",
                section.target
            ),
        )
    })?;
    if section.labels.is_empty() || section.labels.iter().any(|l| l.trim().is_empty()) {
        return Err((
            "labels",
            "must list the labels this policy's runners carry, e.g. [\"self-hosted\", \"linux\", \"x64\"]".to_owned(),
        ));
    }
    let max_runners = section.max_runners.unwrap_or(host_max);
    let min_runners = section.min_runners.unwrap_or(0);
    if max_runners == 0 {
        return Err(("max_runners", "must be at least 1".to_owned()));
    }
    if min_runners > max_runners {
        return Err((
            "min_runners",
            format!("{min_runners} is above max_runners ({max_runners})"),
        ));
    }
    if section.fleet_max_runners == Some(0) {
        return Err(("fleet_max_runners", "must be at least 1".to_owned()));
    }
    let workspace = match section.workspace.as_deref() {
        None | Some("ephemeral") => Workspace::Ephemeral,
        Some("persistent") => Workspace::Persistent,
        Some(other) => {
            return Err((
                "workspace",
                format!("`{other}` is not a workspace kind; use \"ephemeral\" or \"persistent\""),
            ));
        }
    };
    if workspace == Workspace::Persistent && matches!(target, Target::Org(_)) {
        return Err((
            "workspace",
            "\"persistent\" is for repository targets only: a slot's _work must not be shared across repositories".to_owned(),
        ));
    }
    let image = super::image::validate(
        section.image.as_deref(),
        section.image_refresh.map(|d| d.0),
        section.image_credentials_file.clone(),
    )?;
    let docker_on = section.docker.unwrap_or(false);
    let pulls_image = image.as_ref().is_some_and(|i| !i.reference.is_local());
    if !docker_on && !pulls_image && section.docker_registry_mirror.is_some() {
        return Err((
            "docker_registry_mirror",
            "is what each runner's own Docker daemon, and a `docker://` image, pull through: set `docker = true` or such an image too"
                .to_owned(),
        ));
    }
    let registry_mirror = section
        .docker_registry_mirror
        .as_deref()
        .map(registry_mirror)
        .transpose()
        .map_err(|problem| ("docker_registry_mirror", problem))?;
    let image = image.map(|mut image| {
        image.mirror = registry_mirror.clone().filter(|_| pulls_image);
        image
    });
    let unbounded = docker_unbounded(docker_on, section.docker_unbounded)?;
    let docker = match (docker_on, section.docker_images) {
        (false, Some(images)) if !images.is_empty() => {
            return Err((
                "docker_images",
                "are loaded into each runner's own Docker daemon: set `docker = true` too"
                    .to_owned(),
            ));
        }
        (false, _) => None,
        (true, images) => {
            let images = images
                .unwrap_or_default()
                .iter()
                .map(|written| ImageFile::parse(written))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|problem| ("docker_images", problem))?;
            if let Some(relative) = images.iter().find(|i| !i.path.is_absolute()) {
                return Err((
                    "docker_images",
                    format!(
                        "`{}` must be an absolute path to an image tarball (`docker save` output)",
                        relative.path.display()
                    ),
                ));
            }
            Some(DockerPolicy {
                images,
                registry_mirror,
                unbounded,
            })
        }
    };
    if section.runner_group_id == Some(0) {
        return Err((
            "runner_group_id",
            "must be a runner group id; the Default group is 1".to_owned(),
        ));
    }
    // Unwritten bounds take their defaults (`bounds`); `"none"` opts out.
    let memory_written = bounds::written_size(section.memory_max.as_deref(), parse_bytes)
        .map_err(|problem| ("memory_max", problem))?;
    let memory_max = memory_written.or(host_facts
        .mem_total
        .map(|total| bounds::default_memory_max(total, host_max)));
    let pids_max = bounds::written_count(section.pids_max.as_ref())
        .map_err(|problem| ("pids_max", problem))?
        .or(Some(bounds::DEFAULT_PIDS_MAX));
    let disk_written = bounds::written_size(section.disk_max.as_deref(), parse_bytes)
        .map_err(|problem| ("disk_max", problem))?;
    let disk_max = disk_written.or(Some(bounds::DEFAULT_DISK_MAX));
    if let Some(weight) = section.cpu_weight
        && !(CPU_WEIGHT_MIN..=CPU_WEIGHT_MAX).contains(&weight)
    {
        return Err((
            "cpu_weight",
            format!(
                "{weight} is outside {CPU_WEIGHT_MIN}..={CPU_WEIGHT_MAX} (cgroup v2 cpu.weight; 100 is the default share)"
            ),
        ));
    }
    let network_allow = section
        .network_allow
        .map(cidrs)
        .transpose()
        .map_err(|problem| ("network_allow", problem))?;
    let egress = super::egress::validate_policy(section.egress)?;
    let limits = RunnerLimits {
        memory_max,
        pids_max,
        cpu_weight: section.cpu_weight,
        cpu_max: None,
    };
    Ok(Policy {
        limits,
        memory_required: memory_written.or(None),
        disk_max,
        disk_required: disk_written.or(None),
        // Filled by the caller, which knows the host's capacity and devices.
        shapes: PolicyShapes::default(),
        name: section.name,
        target,
        labels: section.labels,
        runner_group_id: section.runner_group_id.unwrap_or(DEFAULT_RUNNER_GROUP),
        max_runners,
        min_runners,
        fleet_max_runners: section.fleet_max_runners,
        workspace,
        docker,
        env_file: section.env_file,
        network_allow,
        egress,
        cache: section.cache.unwrap_or(false),
        image,
        scale_set: None,
    })
}

/// `policy.egress` is enforced in each runner's own network namespace, by the resolver its
/// namespace address names: it needs both, and says the networks `network_allow` would.
fn egress_possible(
    isolation: Isolation,
    network: Network,
    network_allow: bool,
) -> Result<(), String> {
    if isolation != Isolation::User || network != Network::Private {
        return Err(
            "needs host.isolation = \"user\" and host.network = \"private\": egress is enforced in each runner's own network namespace, and the agent's resolver knows a runner by that namespace's address".to_owned(),
        );
    }
    if network_allow {
        return Err(
            "and network_allow both say what runners reach: put the networks into egress.allow (\"10.20.0.0/16\") and drop network_allow".to_owned(),
        );
    }
    Ok(())
}

/// A cached egress policy: the cache passes its runners' unserved calls to `cache.upstream`,
/// so the upstream's host must be one the policy's runners may reach themselves (in enforce
/// mode); otherwise the cache would be a way around the list.
fn cache_upstream_allowed(
    upstream: &str,
    egress: &super::egress::PolicyEgress,
) -> Result<(), String> {
    if egress.mode == rm_egress::record::Mode::Audit {
        return Ok(());
    }
    let host = upstream
        .parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.host().map(str::to_owned))
        .unwrap_or_default();
    let allowed = match host.parse::<std::net::Ipv4Addr>() {
        Ok(address) => egress.allow.allows_address(address),
        Err(_) => egress.allow.allows_name(&host),
    };
    if allowed {
        return Ok(());
    }
    Err(format!(
        "with cache = true, the cache passes its runners' other calls to cache.upstream ({upstream}), whose host `{host}` egress.allow (with host.egress_allow) does not allow: add it, or the cache would reach for the job what the job may not"
    ))
}

/// `policy.cache = true` needs `[cache]`, and runners the service can tell apart: each in its
/// own uid and network namespace, so the address a connection comes from names its runner
/// (`rm_cache::Callers`); on the host's network every runner would come from the host itself.
fn cache_reachable(
    cache: Option<&super::cache::Cache>,
    isolation: Isolation,
    network: Network,
) -> Result<(), String> {
    if cache.is_none() {
        return Err(
            "needs a `[cache]` section (where the host-local cache keeps its entries)".to_owned(),
        );
    }
    if isolation != Isolation::User || network != Network::Private {
        return Err(
            "needs host.isolation = \"user\" and host.network = \"private\": the cache knows a runner by the address of its own network, and scopes its entries by that runner's job".to_owned(),
        );
    }
    Ok(())
}

/// `policy.docker_unbounded` parsed: only beside `docker = true`, each entry once. Whether
/// the host needs it is decided at start (`rm_runner::docker::unbounded`), not here.
fn docker_unbounded(
    docker_on: bool,
    written: Option<Vec<String>>,
) -> Result<Vec<Unbounded>, (&'static str, String)> {
    const KEY: &str = "docker_unbounded";
    let written = written.unwrap_or_default();
    if !docker_on && !written.is_empty() {
        return Err((
            KEY,
            "accepts what a runner's own Docker leaves unbounded: set `docker = true` too"
                .to_owned(),
        ));
    }
    let mut accepted = Vec::new();
    for entry in &written {
        let resource = Unbounded::parse(entry).map_err(|problem| (KEY, problem))?;
        if accepted.contains(&resource) {
            return Err((KEY, format!("names \"{entry}\" twice")));
        }
        accepted.push(resource);
    }
    Ok(accepted)
}

/// `policy.docker_registry_mirror` parsed: `http(s)://HOST[:PORT]`, at most a `/` after it
/// (dockerd refuses a mirror with a path, and would not start).
fn registry_mirror(text: &str) -> Result<RegistryMirror, String> {
    let lower = text.to_ascii_lowercase();
    let https = if lower.starts_with("https://") {
        true
    } else if lower.starts_with("http://") {
        false
    } else {
        return Err(format!(
            "`{text}` is not an http:// or https:// URL (a registry mirror such as \"http://127.0.0.1:5000\")"
        ));
    };
    let uri: http::Uri = text
        .parse()
        .map_err(|_| format!("`{text}` is not a valid URL"))?;
    let host = match (uri.host(), uri.authority()) {
        (Some(host), Some(authority)) if !host.is_empty() && !authority.as_str().contains('@') => {
            host.to_owned()
        }
        _ => return Err(format!("`{text}` names no host (or carries a user)")),
    };
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "`{text}` has a path or a query; a registry mirror is a bare `http(s)://HOST:PORT`"
        ));
    }
    let port = match uri.port_u16() {
        Some(0) => return Err(format!("`{text}`: 0 is not a port")),
        Some(port) => port,
        None if https => 443,
        None => 80,
    };
    Ok(RegistryMirror { https, host, port })
}

/// Under `host.network = "private"` a runner's daemon reaches the host only at a
/// `host.network_host_ports` port of the host's `127.0.0.1` (`rm_runner::network`): the mirror
/// must listen there.
fn mirror_reachable(mirror: &RegistryMirror, host_ports: &[u16]) -> Result<(), String> {
    let url = mirror.url();
    if !(mirror.host.eq_ignore_ascii_case("localhost") || mirror.host == "127.0.0.1") {
        return Err(format!(
            "`{url}` is not on this host's 127.0.0.1: under host.network = \"private\" runners reach the host only at 127.0.0.1 on a port of host.network_host_ports; run the mirror there"
        ));
    }
    if !host_ports.contains(&mirror.port) {
        return Err(format!(
            "`{url}`: port {} is not in host.network_host_ports, so runners' daemons cannot reach it; add it there",
            mirror.port
        ));
    }
    Ok(())
}

/// Networks as written, each parsed, or the first that is not one.
fn cidrs(texts: Vec<String>) -> Result<Vec<Cidr>, String> {
    texts.iter().map(|t| t.parse()).collect()
}

/// `acme` is an organization, `acme/widgets` a repository ([`Target`]'s own parser).
fn parse_target(target: &str) -> Option<Target> {
    target.parse().ok()
}

/// This machine's short host name, reduced to what a runner name may carry.
/// Whether `url` may carry this agent's credentials: `https://` anywhere, `http://` only to this
/// host's loopback (127.0.0.0/8, `::1`, `localhost`: tests and a TLS-terminating proxy on the
/// same machine). Over plain HTTP to anywhere else the App's installation tokens and the JIT
/// configurations they buy (`github.api_url`) or the relay subscriber token and every delivery
/// (`relay.url`) would cross the network readable and forgeable by any hop. `Err` says why, to
/// follow the URL in the message.
pub(crate) fn transport(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Ok(());
    }
    if !lower.starts_with("http://") {
        return Err("is not an http(s) URL".to_owned());
    }
    let uri: http::Uri = url.parse().map_err(|_| "is not a valid URL".to_owned())?;
    match uri.host() {
        Some(host) if rm_runner::docker::mirror::is_loopback_host(host) => Ok(()),
        _ => Err(
            "uses plain http:// to a host other than this one's loopback, so its tokens would travel in clear (refused); use https://"
                .to_owned(),
        ),
    }
}

fn default_host_name() -> String {
    let raw = gethostname::gethostname().to_string_lossy().into_owned();
    let short = raw.split('.').next().unwrap_or_default();
    short
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(MAX_HOST_NAME_LEN)
        .collect()
}

/// `MAJOR.MINOR.PATCH`, each a number.
fn is_runner_version(version: &str) -> bool {
    let parts: Vec<&str> = version.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `"64200-64263"` or a list of account names.
fn runner_uids(section: RunnerUidsSection) -> Result<RunnerUids, String> {
    match section {
        RunnerUidsSection::Range(text) => {
            let parsed = text.split_once('-').and_then(|(a, b)| {
                Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?))
            });
            let Some((first, last)) = parsed.filter(|(a, b)| a <= b) else {
                return Err(format!(
                    "`{text}` is not a uid range; write it like \"64200-64263\" (first-last, inclusive)"
                ));
            };
            if FORBIDDEN_UIDS.iter().any(|u| (first..=last).contains(u)) {
                return Err(format!(
                    "`{text}` includes uid 0 or 65534 (nobody); choose unused uids such as \"64200-64263\""
                ));
            }
            if (last - first) as usize >= MAX_POOL {
                return Err(format!("`{text}` holds more than {MAX_POOL} uids"));
            }
            Ok(RunnerUids::Range { first, last })
        }
        RunnerUidsSection::Accounts(names) => {
            let mut seen = HashSet::new();
            for name in &names {
                let valid = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
                if !valid || name == "root" {
                    return Err(format!("`{name}` is not a usable account name"));
                }
                if !seen.insert(name) {
                    return Err(format!("`{name}` is listed twice"));
                }
            }
            Ok(RunnerUids::Accounts(names))
        }
    }
}

/// Where runners are made: `host.runner_root`, else `<data_dir>/runners` (the data directory
/// as `--data-dir` or the file names it). Where the disk capacity is measured, too.
pub(super) fn runner_root(file: &FileConfig, data_dir_override: Option<&Path>) -> PathBuf {
    file.host.runner_root.clone().unwrap_or_else(|| {
        data_dir_override
            .or(file.data_dir.as_deref())
            .unwrap_or(Path::new(DEFAULT_DATA_DIR))
            .join("runners")
    })
}

/// `"8G"`, `"512M"`, `"1024K"`, `"1T"` (powers of 1024) or plain bytes.
pub(crate) fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return None,
    };
    let n: u64 = digits.parse().ok().filter(|n| *n > 0)?;
    n.checked_mul(1u64 << shift)
}
