//! Configuration parsing and validation: the contract's example, defaults, and every refusal
//! naming its key.

use super::*;
use rm_runner::docker::unbounded::Unbounded;

const CONTRACT_EXAMPLE: &str = r#"
data_dir = "/var/lib/rm-agent"

[github]
api_url = "https://api.github.com"
app_id = 123456
private_key_file = "/etc/rm-agent/app.pem"
webhook_secret_file = "/etc/rm-agent/webhook-secret"

[receiver]
listen = "0.0.0.0:8080"
path = "/webhook"

[relay]
url = "https://relay.example.net/subscribe/CHANNEL"
token_file = "/etc/rm-agent/relay-token"

[host]
name = "builder-01"
max_runners = 4
runner_root = "/var/lib/rm-agent/runners"

[runner]
package_dir = "/opt/actions-runner"
idle_timeout = "10m"
registration_timeout = "5m"

[polling]
interval = "60s"
idle_interval = "10s"

[notifications]
desktop = false

[[notifications.webhook]]
url = "https://alerts.example.net/rm"
secret_file = "/etc/rm-agent/notify-secret"
events = ["runners_failing_to_start", "host_unfit"]

[[policy]]
name = "linux"
target = "acme"
labels = ["self-hosted", "linux", "x64"]
runner_group_id = 1
max_runners = 4
min_runners = 0
workspace = "ephemeral"
"#;

fn load_text(text: &str) -> Result<Config, ConfigError> {
    let path = Path::new("rm-agent.toml");
    validate::validate(
        parse(Some(path), text)?,
        Some(path.to_owned()),
        None,
        bounds::HostFacts::probe(Path::new("/")),
    )
}

fn refusal(text: &str) -> ConfigError {
    match load_text(text) {
        Ok(config) => panic!("accepted: {config:?}"),
        Err(err) => err,
    }
}

#[test]
fn the_contract_example_loads() {
    let config = load_text(CONTRACT_EXAMPLE).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/rm-agent"));
    assert_eq!(config.github.app_id, Some(123_456));
    let receiver = config.receiver.unwrap();
    assert_eq!(receiver.listen.port(), 8080);
    assert_eq!(receiver.path, "/webhook");
    assert_eq!(config.host.name, "builder-01");
    assert_eq!(config.host.max_runners, 4);
    assert_eq!(config.runner.idle_timeout, Duration::from_secs(600));
    assert_eq!(config.polling.interval, Duration::from_secs(60));
    let policy = &config.policies[0];
    assert_eq!(policy.target, Target::Org("acme".to_owned()));
    assert_eq!(policy.workspace, Workspace::Ephemeral);
    assert_eq!(config.retention, Retention::default());
    assert_eq!(config.webhook_notifications.len(), 1);
}

#[test]
fn an_empty_file_takes_every_default() {
    let config = load_text("").unwrap();
    assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(config.github.api_url, DEFAULT_API_URL);
    assert!(config.receiver.is_none());
    assert_eq!(
        config.host.runner_root,
        PathBuf::from(DEFAULT_DATA_DIR).join("runners")
    );
    assert_eq!(config.polling.idle_interval, Duration::from_secs(10));
    assert!(!config.desktop_notifications);
}

#[test]
fn github_pacing_takes_each_named_value() {
    use rm_github::pacing::{DOCUMENTED, Pacing};
    let cases = [
        ("", Pacing::Documented(DOCUMENTED)),
        (
            "[github]\npacing = \"documented\"\n",
            Pacing::Documented(DOCUMENTED),
        ),
        (
            "[github]\npacing = \"cautious\"\n",
            Pacing::Cautious(DOCUMENTED),
        ),
        (
            "[github]\npacing = \"one_per_second\"\n",
            Pacing::Spaced(Duration::from_secs(1)),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(load_text(text).unwrap().github.pacing, want, "{text:?}");
    }
}

#[test]
fn the_data_dir_flag_wins_over_the_file() {
    let file = parse(None, "data_dir = \"/from/file\"").unwrap();
    let config = validate::validate(
        file,
        None,
        Some(PathBuf::from("/from/flag")),
        bounds::HostFacts::probe(Path::new("/")),
    )
    .unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/from/flag"));
}

#[test]
fn unknown_keys_and_wrong_types_name_the_key() {
    let err = refusal("[receiver]\nlisten = \"127.0.0.1:1\"\nport = 8080\n");
    assert_eq!(err.file, "rm-agent.toml");
    assert!(err.problem.contains("unknown field `port`"), "{err}");
    assert!(err.problem.contains("line 3"), "{err}");

    let err = refusal("[host]\nmax_runners = \"four\"\n");
    assert_eq!(err.key, "host.max_runners");

    let err = refusal("[polling]\ninterval = \"soon\"\n");
    assert_eq!(err.key, "polling.interval");
    assert!(err.problem.contains("\"30s\""), "{err}");

    let err = refusal("colour = \"blue\"\n");
    assert!(err.problem.contains("unknown field `colour`"), "{err}");

    let err = refusal("[github\n");
    assert_eq!(err.key, "(syntax)");
}

#[test]
fn out_of_range_values_are_refused_with_the_remedy() {
    let cases = [
        ("[polling]\ninterval = \"10s\"\n", "polling.interval", "30s"),
        (
            "[polling]\nidle_interval = \"1s\"\n",
            "polling.idle_interval",
            "5s",
        ),
        (
            "[polling]\ninterval = \"30s\"\nidle_interval = \"45s\"\n",
            "polling.idle_interval",
            "interval",
        ),
        (
            "[receiver]\nlisten = \"8080\"\n",
            "receiver.listen",
            "0.0.0.0:8080",
        ),
        (
            "[receiver]\nlisten = \"127.0.0.1:1\"\npath = \"hook\"\n",
            "receiver.path",
            "/webhook",
        ),
        (
            "[host]\nmax_runners = 0\n",
            "host.max_runners",
            "at least 1",
        ),
        ("[host]\nname = \"my host\"\n", "host.name", "letters"),
        (
            "[github]\napi_url = \"api.github.com\"\n",
            "github.api_url",
            "https://",
        ),
        (
            "[runner]\npackage_dir = \"/x\"\nversion = \"2.330.0\"\n",
            "runner.version",
            "not both",
        ),
        (
            "[runner]\nversion = \"v2.330.0\"\n",
            "runner.version",
            "without the `v`",
        ),
        (
            "[runner]\nversion = \"2.330.0/../../x\"\n",
            "runner.version",
            "2.330.0",
        ),
        (
            "[runner]\nidle_timeout = \"0s\"\n",
            "runner.idle_timeout",
            "zero",
        ),
        (
            "[runner]\nversion = \"latest\"\nrelease_check_interval = \"1s\"\n",
            "runner.release_check_interval",
            "5s to 7d",
        ),
        (
            "[runner]\nversion = \"newest\"\n",
            "runner.version",
            "\"latest\"",
        ),
        (
            "[journal]\ndelivery_retention = \"1d\"\n",
            "journal.delivery_retention",
            "3d",
        ),
        (
            "[journal]\njob_retention = \"23h\"\n",
            "journal.job_retention",
            "queue lifetime",
        ),
        (
            "[github]\npacing = \"fast\"\n",
            "github.pacing",
            "one_per_second",
        ),
        (
            "[github]\npacing = \"careful\"\n",
            "github.pacing",
            "\"cautious\"",
        ),
    ];
    for (text, key, hint) in cases {
        let err = refusal(text);
        assert_eq!(err.key, key, "{text}");
        assert!(err.problem.contains(hint), "{text}: {err}");
    }
}

#[test]
fn policies_are_checked_one_by_one() {
    let policy = |extra: &str| {
        format!(
            "[[policy]]\nname = \"p\"\ntarget = \"acme/widgets\"\nlabels = [\"self-hosted\"]\n{extra}"
        )
    };
    let cases = [
        (policy("max_runners = 1\nmin_runners = 2\n"), "policy[0].min_runners"),
        (policy("workspace = \"shared\"\n"), "policy[0].workspace"),
        (policy("runner_group_id = 0\n"), "policy[0].runner_group_id"),
        (format!("{}{}", policy(""), policy("")), "policy[1].name"),
        (
            "[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\nworkspace = \"persistent\"\n".to_owned(),
            "policy[0].workspace",
        ),
        ("[[policy]]\nname = \"p\"\ntarget = \"a/b/c\"\nlabels = [\"x\"]\n".to_owned(), "policy[0].target"),
        ("[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = []\n".to_owned(), "policy[0].labels"),
        ("[[policy]]\nname = \"../p\"\ntarget = \"acme\"\nlabels = [\"x\"]\n".to_owned(), "policy[0].name"),
    ];
    for (text, key) in cases {
        assert_eq!(refusal(&text).key, key, "{text}");
    }
    let config = load_text(&policy("workspace = \"persistent\"\n")).unwrap();
    assert_eq!(
        config.policies[0].target,
        Target::Repo {
            owner: "acme".to_owned(),
            repo: "widgets".to_owned()
        }
    );
    assert_eq!(
        config.policies[0].max_runners, 1,
        "defaults to the host's ceiling"
    );
}

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
const CONFIGURATION_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");

#[test]
fn every_example_configuration_in_deploy_loads() {
    let mut seen = 0;
    for entry in std::fs::read_dir(DEPLOY).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let file = parse(Some(&path), &text).unwrap_or_else(|e| panic!("{e}"));
            validate::validate(
                file,
                Some(path.clone()),
                None,
                bounds::HostFacts::probe(Path::new("/")),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
        }
    }
    assert!(
        seen >= 2,
        "deploy/ should hold the quickstart and the full example"
    );
}

/// Every key the full example uses is documented in docs/configuration.md.
#[test]
fn the_configuration_reference_documents_every_key() {
    let doc = std::fs::read_to_string(CONFIGURATION_DOC).unwrap();
    let example = std::fs::read_to_string(format!("{DEPLOY}/rm-agent.example.toml")).unwrap();
    let table: toml::Table = example.parse().unwrap();
    let mut keys = Vec::new();
    for (key, value) in &table {
        match value {
            toml::Value::Table(section) => {
                keys.extend(section.keys().map(|k| format!("{key}.{k}")))
            }
            toml::Value::Array(items) => {
                for item in items.iter().filter_map(toml::Value::as_table) {
                    keys.extend(item.keys().map(|k| format!("{key}.{k}")));
                }
            }
            _ => keys.push(key.clone()),
        }
    }
    assert!(keys.len() > 20, "{keys:?}");
    for key in keys {
        assert!(
            doc.contains(&format!("`{key}`")),
            "docs/configuration.md does not document `{key}`"
        );
    }
}

/// The keys serde knows for the top level (`None`) or a table, read from the refusal of an
/// unknown key (`deny_unknown_fields` lists every field it expects); `None` when `table` is
/// not a table.
fn fields_of(table: Option<&str>) -> Option<Vec<String>> {
    const PROBE: &str = "rm_unknown_probe";
    let text = match table {
        None => format!("{PROBE} = 1\n"),
        Some("policy") => format!("[[policy]]\n{PROBE} = 1\n"),
        Some("scale_set") => format!("[[scale_set]]\n{PROBE} = 1\n"),
        Some(t) => format!("[{t}]\n{PROBE} = 1\n"),
    };
    let err = parse(None, &text).err()?;
    if !err.problem.contains(PROBE) {
        return None;
    }
    let expected = err.problem.split("expected").nth(1)?;
    Some(
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every key the configuration types accept (read from serde itself, so a new field cannot be
/// forgotten) is documented in docs/configuration.md.
#[test]
fn the_configuration_reference_documents_every_key_the_types_accept() {
    let doc = std::fs::read_to_string(CONFIGURATION_DOC).unwrap();
    let top = fields_of(None).expect("the top level refuses unknown keys");
    assert!(top.contains(&"policy".to_owned()), "{top:?}");
    let mut keys = Vec::new();
    for field in &top {
        match fields_of(Some(field)) {
            Some(inner) => keys.extend(inner.iter().map(|k| format!("{field}.{k}"))),
            None => keys.push(field.clone()),
        }
    }
    assert!(keys.len() > 25, "{keys:?}");
    for known in [
        "data_dir",
        "journal.job_retention",
        "policy.min_runners",
        "relay.token_file",
    ] {
        assert!(
            keys.contains(&known.to_owned()),
            "{known} not traced: {keys:?}"
        );
    }
    for key in &keys {
        assert!(
            doc.contains(&format!("`{key}`")),
            "docs/configuration.md does not document `{key}`"
        );
    }
}

#[test]
fn isolation_is_user_by_default_and_none_only_when_named() {
    let config = load_text("").unwrap();
    assert_eq!(config.host.isolation, Isolation::User);
    assert!(!config.host.isolation_named);
    assert_eq!(
        config.host.runner_uids,
        RunnerUids::Range {
            first: 64200,
            last: 64263
        }
    );
    assert_eq!(config.host.cgroup_root, None);
    let none = load_text("[host]\nisolation = \"none\"\n").unwrap();
    assert_eq!(none.host.isolation, Isolation::None);
    assert!(none.host.isolation_named);
    let explicit = load_text(
        "[host]\nisolation = \"user\"\nrunner_uids = [\"ci-1\", \"ci-2\"]\ncgroup_root = \"/sys/fs/cgroup/rm\"\n",
    )
    .unwrap();
    assert!(explicit.host.isolation_named);
    assert_eq!(
        explicit.host.runner_uids,
        RunnerUids::Accounts(vec!["ci-1".into(), "ci-2".into()])
    );
    assert_eq!(
        explicit.host.cgroup_root.as_deref(),
        Some(Path::new("/sys/fs/cgroup/rm"))
    );
    let limits = load_text(
        "[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\nmemory_max = \"8G\"\npids_max = 4096\ncpu_weight = 100\n",
    )
    .unwrap()
    .policies[0]
        .limits;
    assert_eq!(
        limits,
        RunnerLimits {
            memory_max: Some(8 << 30),
            pids_max: Some(4096),
            cpu_weight: Some(100),
            cpu_max: None,
        }
    );
}

#[test]
fn a_policy_is_bounded_by_default_and_none_opts_out() {
    let host = bounds::HostFacts {
        mem_total: Some(16 << 30),
        ..Default::default()
    };
    let policy = |extra: &str| {
        let text = format!(
            "[host]\nmax_runners = 4\n[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\n{extra}\n"
        );
        from_text_on(&text, host).unwrap().policies.remove(0)
    };
    let default = policy("");
    assert_eq!(
        default.limits,
        RunnerLimits {
            // Three quarters of 16 GiB over host.max_runners = 4.
            memory_max: Some(3 << 30),
            pids_max: Some(bounds::DEFAULT_PIDS_MAX),
            cpu_weight: None,
            cpu_max: None,
        }
    );
    assert_eq!(default.disk_max, Some(bounds::DEFAULT_DISK_MAX));
    // A default share is not a reservation the fitness gate holds the host to.
    assert_eq!(default.memory_required, None);

    let written = policy("memory_max = \"6G\"\npids_max = 100\ndisk_max = \"2G\"");
    assert_eq!(written.limits.memory_max, Some(6 << 30));
    assert_eq!(written.memory_required, Some(6 << 30));
    assert_eq!(written.limits.pids_max, Some(100));
    assert_eq!(written.disk_max, Some(2 << 30));

    let opted_out = policy("memory_max = \"none\"\npids_max = \"none\"\ndisk_max = \"none\"");
    assert_eq!(opted_out.limits, RunnerLimits::default());
    assert_eq!(opted_out.disk_max, None);
    assert_eq!(opted_out.memory_required, None);

    // A host whose memory is unknown gets no memory default rather than a guess.
    let unknown = from_text_on(
        "[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\n",
        bounds::HostFacts::default(),
    )
    .unwrap();
    assert_eq!(unknown.policies[0].limits.memory_max, None);
    assert_eq!(unknown.policies[0].limits.pids_max, Some(4096));
}

#[test]
fn isolation_mistakes_name_their_key() {
    let policy = |extra: &str| {
        format!("[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\n{extra}\n")
    };
    let cases = [
        (
            "[host]\nisolation = \"vm\"\n".to_owned(),
            "host.isolation",
            "\"user\"",
        ),
        (
            "[host]\nrunner_uids = \"64263-64200\"\n".to_owned(),
            "host.runner_uids",
            "first-last",
        ),
        (
            "[host]\nrunner_uids = \"0-10\"\n".to_owned(),
            "host.runner_uids",
            "uid 0",
        ),
        (
            "[host]\nrunner_uids = \"65530-65540\"\n".to_owned(),
            "host.runner_uids",
            "65534",
        ),
        (
            "[host]\nmax_runners = 4\nrunner_uids = \"70000-70001\"\n".to_owned(),
            "host.runner_uids",
            "fewer than host.max_runners",
        ),
        (
            "[host]\nrunner_uids = [\"root\"]\n".to_owned(),
            "host.runner_uids",
            "root",
        ),
        (
            "[host]\nrunner_uids = [\"a\", \"a\"]\n".to_owned(),
            "host.runner_uids",
            "twice",
        ),
        (
            "[host]\ncgroup_root = \"rm\"\n".to_owned(),
            "host.cgroup_root",
            "absolute",
        ),
        (
            policy("memory_max = \"8 GB\""),
            "policy[0].memory_max",
            "8G",
        ),
        (policy("pids_max = 0"), "policy[0].pids_max", "at least 1"),
        (
            policy("pids_max = \"many\""),
            "policy[0].pids_max",
            "\"none\"",
        ),
        (
            policy("disk_max = \"a lot\""),
            "policy[0].disk_max",
            "\"none\"",
        ),
        (
            policy("memory_max = \"\""),
            "policy[0].memory_max",
            "\"none\"",
        ),
        (policy("cpu_weight = 0"), "policy[0].cpu_weight", "10000"),
        (
            policy("cpu_weight = 10001"),
            "policy[0].cpu_weight",
            "10000",
        ),
        (
            policy("docker_images = [\"/srv/images/pg.tar\"]"),
            "policy[0].docker_images",
            "docker = true",
        ),
        (
            policy("docker = true\ndocker_images = [\"images/pg.tar\"]"),
            "policy[0].docker_images",
            "absolute",
        ),
        (
            policy("docker = true\ndocker_images = [\"/srv/images/pg.tar@sha256:abc\"]"),
            "policy[0].docker_images",
            "64 hex digits",
        ),
        (
            format!("[host]\nisolation = \"none\"\n{}", policy("docker = true")),
            "policy[0].docker",
            "isolation = \"user\"",
        ),
        (
            policy("docker_unbounded = [\"memory\"]"),
            "policy[0].docker_unbounded",
            "docker = true",
        ),
        (
            policy("docker = true\ndocker_unbounded = [\"cpu\"]"),
            "policy[0].docker_unbounded",
            "neither \"memory\" nor \"pids\"",
        ),
        (
            policy("docker = true\ndocker_unbounded = [\"memory\", \"memory\"]"),
            "policy[0].docker_unbounded",
            "twice",
        ),
    ];
    for (text, key, hint) in cases {
        let err = refusal(&text);
        assert_eq!(err.key, key, "{text}");
        assert!(err.problem.contains(hint), "{text}: {err}");
    }
    let docker = load_text(&policy(
        "docker = true\ndocker_images = [\"/srv/images/pg.tar\", \"/srv/images/node.tar\"]",
    ))
    .unwrap();
    assert_eq!(
        docker.policies[0].docker,
        Some(DockerPolicy {
            images: vec![
                PathBuf::from("/srv/images/pg.tar").into(),
                PathBuf::from("/srv/images/node.tar").into()
            ],
            registry_mirror: None,
            unbounded: vec![],
        })
    );
    assert_eq!(
        load_text(&policy(
            "docker = true\ndocker_unbounded = [\"pids\", \"memory\"]"
        ))
        .unwrap()
        .policies[0]
            .docker
            .as_ref()
            .map(|d| d.unbounded.clone()),
        Some(vec![Unbounded::Pids, Unbounded::Memory])
    );
    // A pin: the file's SHA-256 after `@sha256:`.
    let pinned = load_text(&policy(&format!(
        "docker = true\ndocker_images = [\"/srv/images/pg.tar@sha256:{}\"]",
        "AB".repeat(32)
    )))
    .unwrap();
    assert_eq!(
        pinned.policies[0].docker.as_ref().unwrap().images,
        [ImageFile {
            path: "/srv/images/pg.tar".into(),
            sha256: Some("ab".repeat(32)),
        }]
    );
    assert_eq!(load_text(&policy("")).unwrap().policies[0].docker, None);
    assert_eq!(
        load_text(&policy("docker = false\ndocker_images = []"))
            .unwrap()
            .policies[0]
            .docker,
        None
    );
    // A small pool is fine where runners are not isolated.
    assert!(
        load_text("[host]\nisolation = \"none\"\nmax_runners = 4\nrunner_uids = \"70000-70001\"\n")
            .is_ok()
    );
}

#[test]
fn a_registry_mirror_must_be_reachable_by_the_runners_daemons() {
    let config = |host: &str, extra: &str| {
        format!(
            "[host]\nmax_runners = 4\n{host}\n[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\n{extra}\n"
        )
    };
    let private = "network_host_ports = [5000, 8080]";
    let key = "policy[0].docker_registry_mirror";
    let refused = [
        (
            config(
                private,
                "docker_registry_mirror = \"http://127.0.0.1:5000\"",
            ),
            "docker = true",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"127.0.0.1:5000\"",
            ),
            "http://",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"ftp://127.0.0.1:5000\"",
            ),
            "http://",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://\"",
            ),
            "URL",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.1:5000/v2/\"",
            ),
            "path",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://u:p@127.0.0.1:5000\"",
            ),
            "user",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.1:5001\"",
            ),
            "network_host_ports",
        ),
        // The scheme's own port must be listed too.
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.1\"",
            ),
            "port 80",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"https://mirror.example:5000\"",
            ),
            "127.0.0.1",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.2:5000\"",
            ),
            "127.0.0.1",
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://[::1]:5000\"",
            ),
            "127.0.0.1",
        ),
        (
            config(
                "network = \"host\"",
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.1:0\"",
            ),
            "port",
        ),
    ];
    for (text, hint) in refused {
        let err = refusal(&text);
        assert_eq!(err.key, key, "{text}");
        assert!(err.problem.contains(hint), "{text}: {err}");
    }
    let mirror_of = |text: &str| {
        load_text(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .policies[0]
            .docker
            .clone()
            .unwrap()
            .registry_mirror
            .unwrap()
    };
    let accepted = [
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.1:5000\"",
            ),
            false,
            "127.0.0.1",
            5000,
        ),
        (
            config(
                private,
                "docker = true\ndocker_registry_mirror = \"HTTP://localhost:8080/\"",
            ),
            false,
            "localhost",
            8080,
        ),
        (
            config(
                "network_host_ports = [443]",
                "docker = true\ndocker_registry_mirror = \"https://127.0.0.1\"",
            ),
            true,
            "127.0.0.1",
            443,
        ),
        // Runners in the host's network: any URL.
        (
            config(
                "network = \"host\"",
                "docker = true\ndocker_registry_mirror = \"https://mirror.example:5000\"",
            ),
            true,
            "mirror.example",
            5000,
        ),
        (
            config(
                "network = \"host\"",
                "docker = true\ndocker_registry_mirror = \"http://127.0.0.1:5000\"",
            ),
            false,
            "127.0.0.1",
            5000,
        ),
    ];
    for (text, https, host, port) in accepted {
        assert_eq!(
            mirror_of(&text),
            RegistryMirror {
                https,
                host: host.to_owned(),
                port
            },
            "{text}"
        );
    }
}

#[test]
fn sizes_are_powers_of_1024() {
    use super::validate::parse_bytes;
    assert_eq!(parse_bytes("512"), Some(512));
    assert_eq!(parse_bytes("1K"), Some(1024));
    assert_eq!(parse_bytes("512M"), Some(512 << 20));
    assert_eq!(parse_bytes("2g"), Some(2 << 30));
    assert_eq!(parse_bytes("1T"), Some(1 << 40));
    for bad in ["", "0", "G", "1.5G", "8 GB", "-1", "99999999999T"] {
        assert_eq!(parse_bytes(bad), None, "{bad}");
    }
}

#[test]
fn plain_http_is_refused_off_loopback_with_the_reason() {
    for (text, key) in [
        (
            "[github]\napi_url = \"http://ghe.example.com/api/v3\"\n",
            "github.api_url",
        ),
        (
            "[github]\napi_url = \"http://10.0.0.1:8080\"\n",
            "github.api_url",
        ),
        (
            // Loopback-looking names that resolve anywhere, userinfo, and other spellings.
            "[github]\napi_url = \"http://127.0.0.1.example.com\"\n",
            "github.api_url",
        ),
        (
            "[github]\napi_url = \"http://localhost@ghe.example.com\"\n",
            "github.api_url",
        ),
        (
            "[github]\napi_url = \"HTTP://ghe.example.com\"\n",
            "github.api_url",
        ),
        (
            "[github]\napi_url = \"http://[::2]:8080\"\n",
            "github.api_url",
        ),
        (
            "[relay]\nurl = \"http://relay.example.net/subscribe/c\"\ntoken_file = \"/t\"\n",
            "relay.url",
        ),
        (
            "[relay]\nurl = \"http://0.0.0.0:8080/subscribe/c\"\ntoken_file = \"/t\"\n",
            "relay.url",
        ),
    ] {
        let err = refusal(text);
        assert_eq!(err.key, key, "{text}: {err}");
        assert!(err.problem.contains("in clear"), "{text}: {err}");
        assert!(err.problem.contains("https://"), "{text}: {err}");
    }
}

#[test]
fn plain_http_to_loopback_and_https_anywhere_load() {
    for api_url in [
        "http://127.0.0.1:8080",
        "http://127.8.9.10/api/v3",
        "http://localhost:1234",
        "http://LOCALHOST",
        "http://[::1]:9000/api",
        "https://ghe.example.com/api/v3",
        "HTTPS://api.github.com",
    ] {
        let text = format!(
            "[github]\napi_url = \"{api_url}\"\n[relay]\nurl = \"{api_url}/subscribe/c\"\ntoken_file = \"/t\"\n"
        );
        let config = load_text(&text).unwrap_or_else(|e| panic!("{api_url}: {e}"));
        assert!(config.relay.is_some());
    }
}

#[test]
fn latest_is_a_runner_version_checked_daily_by_default() {
    let config = from_text("[runner]\nversion = \"latest\"\n").unwrap();
    assert_eq!(config.runner.version.as_deref(), Some("latest"));
    assert_eq!(
        config.runner.release_check_interval,
        crate::config::runner_version::DEFAULT_RELEASE_CHECK
    );
    // Never a release to look up by tag.
    assert!(crate::package::wanted(&config).is_none());
    let config =
        from_text("[runner]\nversion = \"latest\"\nrelease_check_interval = \"6h\"\n").unwrap();
    assert_eq!(
        config.runner.release_check_interval,
        std::time::Duration::from_secs(6 * 3600)
    );
}

#[test]
fn journal_url_defaults_to_sqlite_and_takes_a_postgres_connection_string() {
    assert!(load_text("").unwrap().pg_journal.is_none());
    for url in [
        "postgres://rm@db.example.net/rm",
        "host=/run/postgresql user=rm dbname=rm",
    ] {
        let config = load_text(&format!("[journal]\nurl = \"{url}\"\n")).unwrap();
        let target = config.pg_journal.expect("journal.url was dropped");
        assert_eq!(target.user(), Some("rm"));
        assert!(!target.has_password());
    }
}

#[test]
fn journal_url_with_a_password_or_what_rm_cannot_use_is_refused_naming_the_key() {
    for (url, says) in [
        ("postgres://rm:hunter2@db/rm", "RM_JOURNAL_PASSWORD"),
        ("host=db user=rm password=hunter2", "RM_JOURNAL_PASSWORD"),
        ("postgres://rm@db/rm?passfile=/hunter2", "passfile"),
        (
            "postgres://rm@db/rm?application_name=hunter2&sslmode=allow",
            "sslmode=allow is not supported",
        ),
        (
            "host=db application_name=hunter2 sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
            "sslrootcert: cannot read /nonexistent/ca.pem",
        ),
        (
            "host=db application_name=hunter2 sslcert=/etc/rm/client.pem",
            "unknown option `sslcert`",
        ),
        ("host=db port=hunter2", "not a PostgreSQL connection string"),
    ] {
        let err = refusal(&format!("[journal]\nurl = \"{url}\"\n"));
        assert_eq!(err.key, "journal.url", "{url}");
        assert!(err.problem.contains(says), "{url}: {err}");
        // Never the string itself: it may hold a password.
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    let err = refusal("[journal]\nurl = 5432\n");
    assert_eq!(err.key, "journal.url");
}

#[test]
fn webhook_notifications_are_none_by_default_and_several_may_be_configured() {
    assert!(load_text("").unwrap().webhook_notifications.is_empty());
    let config = load_text(
        r#"
[notifications]
desktop = true

[[notifications.webhook]]
url = "https://alerts.example.net/rm/T000/B000/s3cretpath?token=t0k3n"
secret_file = "/etc/rm-agent/notify-secret"

[[notifications.webhook]]
url = "http://10.0.0.5:9000/hook"
events = ["host_unfit", "runners_failing_to_start"]
"#,
    )
    .unwrap();
    assert!(config.desktop_notifications);
    let [signed, filtered] = &config.webhook_notifications[..] else {
        panic!("{:?}", config.webhook_notifications);
    };
    assert_eq!(
        signed.secret_file.as_deref(),
        Some(Path::new("/etc/rm-agent/notify-secret"))
    );
    assert_eq!(signed.events, notifications::EventKind::ALL);
    assert_eq!(signed.url.host(), "alerts.example.net");
    assert_eq!(
        signed.url.uri().to_string(),
        "https://alerts.example.net/rm/T000/B000/s3cretpath?token=t0k3n"
    );
    // Plain http anywhere: a body carries no secret.
    assert_eq!(filtered.url.redacted(), "http://10.0.0.5:9000");
    assert_eq!(filtered.secret_file, None);
    // In the file's order of kinds, whatever order they were written in.
    assert_eq!(
        filtered.events,
        [
            notifications::EventKind::RunnersFailingToStart,
            notifications::EventKind::HostUnfit
        ]
    );
    // What the configuration prints of a URL is its scheme and authority: a token may be in
    // the path or the query.
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("s3cretpath") && !shown.contains("t0k3n"),
        "{shown}"
    );
}

#[test]
fn webhook_notification_mistakes_name_their_key() {
    let hook = |body: &str| {
        format!(
            "[[notifications.webhook]]\nurl = \"https://a.example\"\n[[notifications.webhook]]\n{body}\n"
        )
    };
    for (body, key, says) in [
        ("url = \"ftp://a.example/x\"", "url", "http:// or https://"),
        (
            "url = \"alerts.example.net/rm\"",
            "url",
            "http:// or https://",
        ),
        ("url = \"https://a example/\"", "url", "not a valid URL"),
        ("url = \"https://\"", "url", "not a valid URL"),
        (
            "url = \"https://user:pw@a.example/x\"",
            "url",
            "user name or password",
        ),
        ("url = \"http://a.example:0/x\"", "url", "port 0"),
        (
            "url = \"https://a.example\"\nsecret_file = \"\"",
            "secret_file",
            "is empty",
        ),
        (
            "url = \"https://a.example\"\nevents = [\"runners_failing\"]",
            "events",
            "the kinds are webhooks_stopped, credentials_rejected, runners_failing_to_start, demand_waiting_at_capacity, host_unfit",
        ),
        (
            "url = \"https://a.example\"\nevents = [\"host_unfit\", \"host_unfit\"]",
            "events",
            "listed twice",
        ),
        (
            "url = \"https://a.example\"\nevents = []",
            "events",
            "is empty",
        ),
    ] {
        let err = refusal(&hook(body));
        assert_eq!(
            err.key,
            format!("notifications.webhook[1].{key}"),
            "{body}: {err}"
        );
        assert!(err.problem.contains(says), "{body}: {err}");
    }
    // A URL's user and password are not repeated in the refusal.
    let err = refusal(&hook("url = \"https://user:pw@a.example/x\""));
    assert!(!err.to_string().contains("pw@"), "{err}");

    let err = refusal("[[notifications.webhook]]\nurl = \"https://a.example\"\ncolour = 1\n");
    assert!(err.problem.contains("unknown field `colour`"), "{err}");
    let err = refusal("[[notifications.webhook]]\nsecret_file = \"/s\"\n");
    assert!(err.problem.contains("missing field `url`"), "{err}");
}

/// Every key of a `[[notifications.webhook]]` entry (read from serde's refusal of an unknown
/// one) is documented in docs/configuration.md.
#[test]
fn the_configuration_reference_documents_every_webhook_key() {
    let doc = std::fs::read_to_string(CONFIGURATION_DOC).unwrap();
    let err = parse(None, "[[notifications.webhook]]\nrm_unknown_probe = 1\n").unwrap_err();
    let expected = err.problem.split("expected").nth(1).unwrap();
    let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    assert_eq!(keys, ["url", "secret_file", "events"], "{err}");
    for key in keys {
        let key = format!("`notifications.webhook[].{key}`");
        assert!(
            doc.contains(&key),
            "docs/configuration.md does not document {key}"
        );
    }
    for kind in notifications::EventKind::ALL {
        assert!(
            doc.contains(&format!("`{kind}`")),
            "docs/configuration.md does not name the kind `{kind}`"
        );
    }
}

#[test]
fn logs_bounds_take_their_defaults_good_values_and_refuse_what_cannot_hold_a_copy() {
    assert_eq!(load_text("").unwrap().logs, logs::Logs::default());
    let config =
        load_text("[logs]\nkeep = 50\nmax_age = \"3d\"\nmax_total = \"500MiB\"\n").unwrap();
    assert_eq!(
        config.logs,
        logs::Logs {
            keep: 50,
            max_age: Duration::from_secs(3 * 24 * 3600),
            max_total: 500 << 20,
        }
    );
    // `keep = 0`: no logs kept (the other bounds still validated).
    assert_eq!(load_text("[logs]\nkeep = 0\n").unwrap().logs.keep, 0);
    for (text, key, says) in [
        ("[logs]\nmax_age = \"10m\"\n", "logs.max_age", "1h"),
        ("[logs]\nmax_age = \"soon\"\n", "logs.max_age", "\"30s\""),
        ("[logs]\nmax_total = \"1MiB\"\n", "logs.max_total", "64MiB"),
        (
            "[logs]\nmax_total = \"lots\"\n",
            "logs.max_total",
            "not a size",
        ),
        ("[logs]\nkeep = -1\n", "logs.keep", ""),
        ("[logs]\nkeep_all = true\n", "logs", "unknown field"),
    ] {
        let err = refusal(text);
        assert!(err.key.starts_with(key), "{text}: {err}");
        assert!(err.problem.contains(says), "{text}: {err}");
    }
}

/// One App as `[github]` keys or several as `[[github.app]]`, the first the primary; both forms
/// at once, an App twice, an id 0 or an entry without its key file are refused naming the key.
#[test]
fn one_app_or_several_and_never_both_forms() {
    let p = |s: &str| PathBuf::from(s);
    // (file, primary, its key file, the further Apps, listed)
    type Accepted<'a> = (&'a str, Option<u64>, Option<PathBuf>, Vec<GithubApp>, bool);
    let accepted: [Accepted; 4] = [
        ("", None, None, vec![], false),
        (
            "[github]\napp_id = 7\nprivate_key_file = \"/k/7.pem\"\n",
            Some(7),
            Some(p("/k/7.pem")),
            vec![],
            false,
        ),
        (
            "[[github.app]]\nid = 7\nprivate_key_file = \"/k/7.pem\"\n",
            Some(7),
            Some(p("/k/7.pem")),
            vec![],
            true,
        ),
        (
            "[github]\napi_url = \"https://api.github.com\"\n\
             [[github.app]]\nid = 7\nprivate_key_file = \"/k/7.pem\"\n\
             [[github.app]]\nid = 8\nprivate_key_file = \"/k/8.pem\"\n\
             [[github.app]]\nid = 9\nprivate_key_file = \"/k/9.pem\"\n",
            Some(7),
            Some(p("/k/7.pem")),
            vec![
                GithubApp {
                    id: 8,
                    private_key_file: p("/k/8.pem"),
                },
                GithubApp {
                    id: 9,
                    private_key_file: p("/k/9.pem"),
                },
            ],
            true,
        ),
    ];
    for (text, primary, key, more, listed) in accepted {
        let config = load_text(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let github = &config.github;
        assert_eq!(github.app_id, primary, "{text}");
        assert_eq!(github.private_key_file, key, "{text}");
        assert_eq!(github.more_apps, more, "{text}");
        assert_eq!(github.app_list, listed, "{text}");
    }
    let three = load_text(
        "[[github.app]]\nid = 7\nprivate_key_file = \"/k/7.pem\"\n\
         [[github.app]]\nid = 8\nprivate_key_file = \"/k/8.pem\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let keys: Vec<(u64, String)> = three
        .github
        .apps()
        .into_iter()
        .map(|(id, _, key)| (id, key))
        .collect();
    assert_eq!(
        keys,
        [
            (7, "github.app[0].private_key_file".to_owned()),
            (8, "github.app[1].private_key_file".to_owned())
        ]
    );

    // (file, the key named, a word of the problem)
    let refused = [
        (
            "[github]\napp_id = 7\n[[github.app]]\nid = 8\nprivate_key_file = \"/k/8.pem\"\n",
            "github.app_id",
            "one form",
        ),
        (
            "[github]\nprivate_key_file = \"/k/7.pem\"\n[[github.app]]\nid = 8\nprivate_key_file = \"/k/8.pem\"\n",
            "github.private_key_file",
            "one form",
        ),
        (
            "[[github.app]]\nid = 7\nprivate_key_file = \"/k/7.pem\"\n\
             [[github.app]]\nid = 8\nprivate_key_file = \"/k/8.pem\"\n\
             [[github.app]]\nid = 7\nprivate_key_file = \"/k/7b.pem\"\n",
            "github.app[2].id",
            "listed twice",
        ),
        (
            "[[github.app]]\nid = 0\nprivate_key_file = \"/k/0.pem\"\n",
            "github.app[0].id",
            "positive",
        ),
        (
            "[[github.app]]\nid = 7\n",
            "github.app[0]",
            "private_key_file",
        ),
        (
            "[[github.app]]\nid = 7\nprivate_key_file = \"/k/7.pem\"\nkey = \"x\"\n",
            "github.app[0].key",
            "unknown field `key`",
        ),
    ];
    for (text, key, problem) in refused {
        let err = refusal(text);
        assert_eq!(err.key, key, "{text}: {err}");
        assert!(err.problem.contains(problem), "{text}: {err}");
    }
}

#[test]
fn rerun_on_defaults_to_none_and_takes_the_rerunnable_reasons() {
    let base = "[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\n";
    assert!(
        load_text(base).unwrap().reruns.is_empty(),
        "default: no re-runs"
    );
    let empty = format!("{base}rerun_on = []\n");
    assert!(load_text(&empty).unwrap().reruns.is_empty());
    let text = format!("{base}rerun_on = [\"runner_crashed\", \"oom_killed\", \"oom_killed\"]\n");
    let config = load_text(&text).unwrap();
    assert_eq!(
        config.reruns.get("linux"),
        Some(&rerun::RerunPolicy {
            rerun_on: vec!["oom_killed".into(), "runner_crashed".into()],
            max_reruns: rerun::DEFAULT_MAX_RERUNS,
        })
    );
    let every = rerun::RERUNNABLE_REASONS
        .iter()
        .map(|r| format!("\"{r}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "{base}rerun_on = [{every}]\nmax_reruns = {}\n",
        rerun::MAX_RERUNS_LIMIT
    );
    let config = load_text(&text).unwrap();
    let rule = &config.reruns["linux"];
    assert_eq!(rule.rerun_on.len(), rerun::RERUNNABLE_REASONS.len());
    assert_eq!(rule.max_reruns, rerun::MAX_RERUNS_LIMIT);
}

#[test]
fn rerun_refusals_name_their_key() {
    let base = "[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\n";
    for (extra, key, says) in [
        (
            "rerun_on = [\"flaky_test\"]",
            "policy[0].rerun_on",
            "flaky_test",
        ),
        // A job that failed on its own, or a runner that never registered, is no reason.
        (
            "rerun_on = [\"process_exited_unexpectedly\"]",
            "policy[0].rerun_on",
            "oom_killed",
        ),
        (
            "rerun_on = [\"oom_killed\"]\nmax_reruns = 0",
            "policy[0].max_reruns",
            "1..=3",
        ),
        (
            "rerun_on = [\"oom_killed\"]\nmax_reruns = 4",
            "policy[0].max_reruns",
            "1..=3",
        ),
        ("max_reruns = 2", "policy[0].max_reruns", "rerun_on"),
    ] {
        let text = format!("{base}{extra}\n");
        let err = refusal(&text);
        assert_eq!(err.key, key, "{text}: {err}");
        assert!(err.problem.contains(says), "{text}: {err}");
    }
}

const SCALE_SET_BASE: &str = r#"
[[policy]]
name = "big"
target = "acme"
labels = ["self-hosted", "big"]
max_runners = 4

[[policy]]
name = "linux"
target = "acme"
labels = ["self-hosted", "linux"]
"#;

#[test]
fn a_scale_set_names_its_policy_which_then_serves_it_alone() {
    let config = load_text(&format!(
        "{SCALE_SET_BASE}\n[[scale_set]]\nname = \"acme-big\"\npolicy = \"big\"\nlabels = [\"gpu\"]\n"
    ))
    .expect("loads");
    assert_eq!(
        config.scale_sets,
        vec![scale_sets::ScaleSet {
            name: "acme-big".into(),
            policy: "big".into(),
            labels: vec!["acme-big".into(), "gpu".into()],
            runner_group_id: 1,
            enterprise: None,
        }]
    );
    let served: Vec<_> = config
        .policies
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.scale_set.as_ref().map(|s| s.name.as_str()),
            )
        })
        .collect();
    assert_eq!(served, [("big", Some("acme-big")), ("linux", None)]);
}

/// The double-demand guard: `rm-agent check` and `run` refuse a scale-set label a webhook
/// policy also carries (a job would get a runner from each), and the other mistakes name their
/// key.
#[test]
fn scale_set_mistakes_and_overlapping_labels_are_refused() {
    let cases: [(&str, &str, &str); 7] = [
        (
            "[[scale_set]]\nname = \"linux\"\npolicy = \"big\"\n",
            "scale_set[0].labels",
            "also carried by policy `linux`",
        ),
        (
            "[[scale_set]]\nname = \"acme-big\"\npolicy = \"big\"\nlabels = [\"LINUX\"]\n",
            "scale_set[0].labels",
            "also carried by policy `linux`",
        ),
        (
            "[[scale_set]]\nname = \"acme-big\"\npolicy = \"nope\"\n",
            "scale_set[0].policy",
            "not a policy",
        ),
        (
            "[[scale_set]]\nname = \"has space\"\npolicy = \"big\"\n",
            "scale_set[0].name",
            "letters, digits",
        ),
        (
            "[[scale_set]]\nname = \"a\"\npolicy = \"big\"\n[[scale_set]]\nname = \"b\"\npolicy = \"big\"\n",
            "scale_set[1].policy",
            "already serves",
        ),
        (
            "[[scale_set]]\nname = \"a\"\npolicy = \"big\"\n[[scale_set]]\nname = \"A\"\npolicy = \"linux\"\n",
            "scale_set[1].name",
            "unique",
        ),
        (
            "[[scale_set]]\nname = \"a\"\npolicy = \"big\"\nlabels = [\"x\"]\n[[scale_set]]\nname = \"b\"\npolicy = \"linux\"\nlabels = [\"x\"]\n",
            "scale_set[1].labels",
            "also scale set `a`",
        ),
    ];
    for (extra, key, problem) in cases {
        let err = refusal(&format!("{SCALE_SET_BASE}\n{extra}"));
        assert_eq!(err.key, key, "{extra}: {err:?}");
        assert!(err.problem.contains(problem), "{extra}: {}", err.problem);
    }
    // Control: the policy that serves the scale set may carry its label itself.
    load_text(&format!(
        "{SCALE_SET_BASE}\n[[scale_set]]\nname = \"big\"\npolicy = \"big\"\n"
    ))
    .expect("the serving policy's own label is no overlap");
}

/// An enterprise scale set: `enterprise` with its PAT's `token_file`, kept on the scale set;
/// its runners are still its policy's.
#[test]
fn an_enterprise_scale_set_names_its_enterprise_and_its_token_file() {
    let config = load_text(&format!(
        "{SCALE_SET_BASE}\n[[scale_set]]\nname = \"ent-big\"\npolicy = \"big\"\nenterprise = \"octo-corp\"\ntoken_file = \"/etc/rm-agent/enterprise.pat\"\n"
    ))
    .expect("loads");
    assert_eq!(
        config.scale_sets[0].enterprise,
        Some(scale_sets::Enterprise {
            slug: "octo-corp".into(),
            token_file: PathBuf::from("/etc/rm-agent/enterprise.pat"),
        })
    );
    let big = config
        .policies
        .iter()
        .find(|p| p.name == "big")
        .expect("big");
    assert_eq!(
        big.scale_set.as_ref().and_then(|s| s.enterprise.as_ref()),
        config.scale_sets[0].enterprise.as_ref()
    );
}

/// Releases are read through the first policy registering through the App: an enterprise
/// scale set's policy (whose target the App may not be installed on) is passed over.
#[test]
fn releases_are_read_through_a_policy_of_the_app() {
    let enterprise_first = "[[policy]]\nname = \"ent\"\ntarget = \"elsewhere\"\nlabels = [\"ent\"]\n\
         [[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"linux\"]\n\
         [[scale_set]]\nname = \"ent\"\npolicy = \"ent\"\nenterprise = \"octo\"\ntoken_file = \"/t\"\n";
    let config = load_text(enterprise_first).expect("loads");
    let served: Vec<bool> = config
        .policies
        .iter()
        .map(Policy::registers_through_app)
        .collect();
    assert_eq!(served, [false, true]);
    assert_eq!(
        config.reading_target().map(ToString::to_string).as_deref(),
        Some("acme")
    );
    // Enterprise scale sets alone: the first policy's, as before.
    let alone = load_text(
        "[[policy]]\nname = \"ent\"\ntarget = \"elsewhere\"\nlabels = [\"ent\"]\n\
         [[scale_set]]\nname = \"ent\"\npolicy = \"ent\"\nenterprise = \"octo\"\ntoken_file = \"/t\"\n",
    )
    .expect("loads");
    assert_eq!(
        alone.reading_target().map(ToString::to_string).as_deref(),
        Some("elsewhere")
    );
}

/// `enterprise` and `token_file` go together, the slug stays in its URL segment, and an
/// enterprise's jobs (from any repository of it) never share a persistent workspace.
#[test]
fn enterprise_scale_set_mistakes_name_their_key() {
    let persistent = "\n[[policy]]\nname = \"slot\"\ntarget = \"acme/widgets\"\nlabels = [\"slot\"]\nworkspace = \"persistent\"\n";
    let cases: [(&str, &str, &str); 6] = [
        (
            "[[scale_set]]\nname = \"e\"\npolicy = \"big\"\nenterprise = \"octo\"\n",
            "scale_set[0].token_file",
            "required with `enterprise`",
        ),
        (
            "[[scale_set]]\nname = \"e\"\npolicy = \"big\"\ntoken_file = \"/t\"\n",
            "scale_set[0].token_file",
            "set `enterprise` too",
        ),
        (
            "[[scale_set]]\nname = \"e\"\npolicy = \"big\"\nenterprise = \"octo/x\"\ntoken_file = \"/t\"\n",
            "scale_set[0].enterprise",
            "not an enterprise slug",
        ),
        (
            "[[scale_set]]\nname = \"e\"\npolicy = \"big\"\nenterprise = \"\"\ntoken_file = \"/t\"\n",
            "scale_set[0].enterprise",
            "not an enterprise slug",
        ),
        (
            "[[scale_set]]\nname = \"e\"\npolicy = \"big\"\nenterprise = \"octo\"\ntoken_file = \"\"\n",
            "scale_set[0].token_file",
            "is empty",
        ),
        (
            "[[scale_set]]\nname = \"e\"\npolicy = \"slot\"\nenterprise = \"octo\"\ntoken_file = \"/t\"\n",
            "scale_set[0].enterprise",
            "persistent",
        ),
    ];
    for (extra, key, problem) in cases {
        let err = refusal(&format!("{SCALE_SET_BASE}{persistent}\n{extra}"));
        assert_eq!(err.key, key, "{extra}: {err:?}");
        assert!(err.problem.contains(problem), "{extra}: {}", err.problem);
    }
    // Control: a persistent policy may serve a scale set of its own repository.
    load_text(&format!(
        "{SCALE_SET_BASE}{persistent}\n[[scale_set]]\nname = \"s\"\npolicy = \"slot\"\n"
    ))
    .expect("a repository scale set may be persistent");
}

/// `host.runner_run_keep`: plain paths below `/run`, at most `MAX_RUN_KEEP`; the rule itself is
/// `rm_runner::isolate::run_keep_entry`'s table.
#[test]
fn what_runners_keep_of_the_hosts_run_is_read_and_bounded() {
    let host = |keep: &str| format!("[host]\nrunner_run_keep = {keep}\n");
    let config = load_text(&host(
        r#"["/run/postgresql/.s.PGSQL.5432", "/run/sccache"]"#,
    ))
    .unwrap();
    assert_eq!(
        config.host.runner_run_keep,
        [
            PathBuf::from("/run/postgresql/.s.PGSQL.5432"),
            PathBuf::from("/run/sccache")
        ]
    );
    assert!(load_text("").unwrap().host.runner_run_keep.is_empty());
    for (keep, hint) in [
        (r#"["/etc/shadow"]"#.to_owned(), "not below /run"),
        (r#"["/run/lock"]"#.to_owned(), "each runner's own"),
        (
            format!(
                "[{}]",
                (0..=rm_runner::isolate::MAX_RUN_KEEP)
                    .map(|n| format!("\"/run/s{n}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "more than",
        ),
    ] {
        let err = refusal(&host(&keep));
        assert_eq!(err.key, "host.runner_run_keep", "{keep}");
        assert!(err.problem.contains(hint), "{keep}: {err}");
    }
}

/// `policy.cache` needs `[cache]`, runners the service can tell apart (its own uid and network
/// each) and a webhook policy; a cached policy makes the cache's port one runners reach.
#[test]
fn a_cached_policy_needs_the_cache_and_runners_it_can_tell_apart() {
    let cached =
        "[[policy]]\nname = \"c\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\ncache = true\n";
    let config = load_text(&format!("[cache]\nport = 9123\n{cached}")).unwrap();
    assert!(config.policies[0].cache);
    assert!(config.host.network_host_ports.contains(&9123));
    // Without a cached policy the port is not opened to runners.
    let idle = load_text("[cache]\nport = 9123\n").unwrap();
    assert!(!idle.host.network_host_ports.contains(&9123));
    for (text, key, words) in [
        (cached.to_owned(), "policy[0].cache", "needs a `[cache]`"),
        (
            format!("[host]\nisolation = \"none\"\n[cache]\n{cached}"),
            "policy[0].cache",
            "host.isolation = \"user\"",
        ),
        (
            format!("[host]\nnetwork = \"host\"\n[cache]\n{cached}"),
            "policy[0].cache",
            "host.network = \"private\"",
        ),
        (
            format!("[cache]\n{cached}[[scale_set]]\nname = \"acme-c\"\npolicy = \"c\"\n"),
            "policy[0].cache",
            "scale_set",
        ),
    ] {
        let refused = load_text(&text).unwrap_err();
        assert_eq!(refused.key, key, "{text}: {refused}");
        assert!(refused.problem.contains(words), "{text}: {refused}");
    }
}

/// A machine of 8 CPUs, 32 GiB and a 200 GiB runner filesystem, for the shape tests.
const MACHINE: bounds::HostFacts = bounds::HostFacts {
    mem_total: Some(32 << 30),
    cpus: Some(8),
    disk_total: Some(200 << 30),
};

/// `text` validated on a machine with `facts`.
fn on(facts: bounds::HostFacts, text: &str) -> Result<Config, ConfigError> {
    from_text_on(text, facts)
}

#[test]
fn the_host_s_capacity_devices_and_a_policy_s_shapes_are_read() {
    let config = on(
        MACHINE,
        r#"
[host]
capacity = { cpu = 6, memory = "24G", disk = "150G" }
[[host.device]]
group = "gpu"
nodes = ["/dev/nvidia0"]
shared_nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm"]
[[host.device]]
group = "gpu"
nodes = ["/dev/nvidia1", "/dev/nvidia1-extra"]
shared_nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm"]

[[policy]]
name = "p"
target = "acme"
labels = ["linux"]
cpu = 1.5
shape_max = { cpu = 6, memory = "24G", disk = "100G", gpu = 2 }
[[policy.shape]]
name = "large"
cpu = "4"
memory = "16G"
gpu = 1
[[policy.shape]]
name = "tiny-1"
cpu = 0.25
"#,
    )
    .unwrap();
    assert_eq!(
        config.host.capacity,
        HostCapacity {
            cpu_millis: Some(6000),
            memory: Some(24 << 30),
            disk: Some(150 << 30),
        }
    );
    assert_eq!(config.host.devices.len(), 2);
    let second = &config.host.devices[1];
    assert_eq!(second.group, "gpu");
    assert_eq!(second.id(), Path::new("/dev/nvidia1"));
    assert_eq!(
        second.shared_nodes,
        vec![
            PathBuf::from("/dev/nvidiactl"),
            PathBuf::from("/dev/nvidia-uvm")
        ]
    );
    let shapes = &config.policies[0].shapes;
    assert!(shapes.accepts_shapes());
    assert_eq!(shapes.cpu_millis, Some(1500));
    assert_eq!(
        shapes.max,
        Some(ShapeBounds {
            cpu_millis: Some(6000),
            memory: Some(24 << 30),
            disk: Some(100 << 30),
            devices: [("gpu".to_owned(), 2)].into(),
        })
    );
    assert_eq!(
        shapes.named,
        vec![
            (
                "large".to_owned(),
                ShapeBounds {
                    cpu_millis: Some(4000),
                    memory: Some(16 << 30),
                    disk: None,
                    devices: [("gpu".to_owned(), 1)].into(),
                }
            ),
            (
                "tiny-1".to_owned(),
                ShapeBounds {
                    cpu_millis: Some(250),
                    ..ShapeBounds::default()
                }
            ),
        ]
    );
    // A policy writing none of it takes no shapes, and a written disk_max counts as written.
    let plain = on(
        MACHINE,
        "[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\ndisk_max = \"20G\"\n",
    )
    .unwrap();
    assert_eq!(plain.policies[0].shapes, PolicyShapes::default());
    assert!(!plain.policies[0].shapes.accepts_shapes());
    assert_eq!(plain.policies[0].disk_required, Some(20 << 30));
    assert!(plain.host.devices.is_empty());
}

#[test]
fn the_default_capacity_is_the_machine_less_a_reserve_capped_by_its_size() {
    const GIB: u64 = 1 << 30;
    let facts = |cpus, mem_total, disk_total| bounds::HostFacts {
        mem_total,
        cpus,
        disk_total,
    };
    let cases = [
        // Half a CPU, 1 GiB and 10 GiB kept.
        (
            facts(Some(8), Some(32 * GIB), Some(200 * GIB)),
            "",
            (Some(7500), Some(31 * GIB), Some(190 * GIB)),
        ),
        // Never more than a quarter of the CPUs, an eighth of the memory, a tenth of the disk.
        (
            facts(Some(1), Some(4 * GIB), Some(50 * GIB)),
            "",
            (Some(750), Some(3584 << 20), Some(45 * GIB)),
        ),
        // Unknown and not written: unbounded.
        (facts(None, None, None), "", (None, None, None)),
        // A written reserve is taken as written (uncapped), 0 included.
        (
            facts(Some(8), Some(32 * GIB), Some(200 * GIB)),
            "reserve = { cpu = 2, memory = \"8G\", disk = \"0\" }",
            (Some(6000), Some(24 * GIB), Some(200 * GIB)),
        ),
        (
            facts(Some(8), Some(32 * GIB), Some(200 * GIB)),
            "reserve = { cpu = 0 }",
            (Some(8000), Some(31 * GIB), Some(190 * GIB)),
        ),
        // A written capacity wins over the machine, in the dimensions it writes.
        (
            facts(Some(8), Some(32 * GIB), None),
            "capacity = { memory = \"16G\", disk = \"1T\" }",
            (Some(7500), Some(16 * GIB), Some(1024 * GIB)),
        ),
    ];
    for (facts, host, (cpu_millis, memory, disk)) in cases {
        let config = on(facts, &format!("[host]\n{host}\n")).unwrap();
        assert_eq!(
            config.host.capacity,
            HostCapacity {
                cpu_millis,
                memory,
                disk
            },
            "{facts:?} {host}"
        );
    }
}

#[test]
fn host_capacity_and_device_mistakes_are_refused_at_start() {
    let device = |group: &str, nodes: &str, shared: &str| {
        format!("[[host.device]]\ngroup = \"{group}\"\nnodes = {nodes}\nshared_nodes = {shared}\n")
    };
    let gpu0 = device("gpu", "[\"/dev/nvidia0\"]", "[\"/dev/nvidiactl\"]");
    let cases = [
        (
            "[host]\ncapacity = { cpu = 0 }\n".to_owned(),
            "host.capacity.cpu",
            "must be more than 0 CPUs",
        ),
        (
            "[host]\ncapacity = { cpu = 1.2345 }\n".to_owned(),
            "host.capacity.cpu",
            "`1.2345` is not a number of CPUs",
        ),
        (
            "[host]\ncapacity = { memory = \"lots\" }\n".to_owned(),
            "host.capacity.memory",
            "`lots` is not a size",
        ),
        (
            "[host]\ncapacity = { cpu = 4 }\nreserve = { cpu = 1 }\n".to_owned(),
            "host.reserve.cpu",
            "drop one of them",
        ),
        (
            "[host]\nreserve = { memory = \"32G\" }\n".to_owned(),
            "host.reserve.memory",
            "32G leaves nothing of this machine's 32G for runners; lower host.reserve.memory or write host.capacity.memory",
        ),
        (
            "[host]\ncapacity = { gpu = 1 }\n".to_owned(),
            "host.capacity.gpu",
            "unknown field `gpu`",
        ),
        (
            device("GPU", "[\"/dev/nvidia0\"]", "[]"),
            "host.device[0].group",
            "`GPU` is not a device group name",
        ),
        (
            device("memory", "[\"/dev/nvidia0\"]", "[]"),
            "host.device[0].group",
            "not one of cpu, mem, memory, disk, shape",
        ),
        (
            device("a_group_name_too_long", "[\"/dev/x\"]", "[]"),
            "host.device[0].group",
            "at most 16",
        ),
        (
            device("gpu", "[]", "[]"),
            "host.device[0].nodes",
            "must list the device's own nodes",
        ),
        (
            device("gpu", "[\"/tmp/nvidia0\"]", "[]"),
            "host.device[0].nodes",
            "`/tmp/nvidia0` is not a device node",
        ),
        (
            device("gpu", "[\"dev/nvidia0\"]", "[]"),
            "host.device[0].nodes",
            "is not a device node",
        ),
        (
            device("gpu", "[\"/dev/../etc/shadow\"]", "[]"),
            "host.device[0].nodes",
            "is not a device node",
        ),
        (
            device("gpu", "[\"/dev/\"]", "[]"),
            "host.device[0].nodes",
            "is not a device node",
        ),
        (
            device("gpu", "[\"/dev/nvidia0\"]", "[\"/etc/passwd\"]"),
            "host.device[0].shared_nodes",
            "`/etc/passwd` is not a device node",
        ),
        (
            device("gpu", "[\"/dev/nvidia0\", \"/dev/nvidia0\"]", "[]"),
            "host.device[0].nodes",
            "`/dev/nvidia0` is listed twice",
        ),
        (
            format!("{gpu0}{}", device("gpu", "[\"/dev/nvidia0\"]", "[]")),
            "host.device[1].nodes",
            "`/dev/nvidia0` is listed twice",
        ),
        (
            format!("{gpu0}{}", device("gpu", "[\"/dev/nvidiactl\"]", "[]")),
            "host.device[1].nodes",
            "`/dev/nvidiactl` is listed twice",
        ),
        (
            format!(
                "{gpu0}{}",
                device("gpu", "[\"/dev/nvidia1\"]", "[\"/dev/nvidia0\"]")
            ),
            "host.device[1].shared_nodes",
            "`/dev/nvidia0` is another device's own node",
        ),
    ];
    for (text, key, words) in cases {
        let refused = on(MACHINE, &text).unwrap_err();
        assert_eq!(refused.key, key, "{text}: {refused}");
        assert!(refused.problem.contains(words), "{text}: {refused}");
    }
    // Two devices of one group share their shared nodes.
    let two = format!(
        "{gpu0}{}",
        device("gpu", "[\"/dev/nvidia1\"]", "[\"/dev/nvidiactl\"]")
    );
    assert_eq!(on(MACHINE, &two).unwrap().host.devices.len(), 2);
}

#[test]
fn policy_shape_mistakes_are_refused_at_start_with_the_fix() {
    let host = "[host]\ncapacity = { cpu = 8, memory = \"32G\", disk = \"200G\" }\n[[host.device]]\ngroup = \"gpu\"\nnodes = [\"/dev/nvidia0\"]\n[[host.device]]\ngroup = \"fpga\"\nnodes = [\"/dev/fpga0\"]\n";
    let policy = |extra: &str| {
        format!(
            "{host}[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"linux\"]\n{extra}\n"
        )
    };
    let cases = [
        ("cpu = 0", "policy[0].cpu", "must be more than 0 CPUs"),
        (
            "cpu = \"two\"",
            "policy[0].cpu",
            "`two` is not a number of CPUs",
        ),
        (
            "cpu = 9",
            "policy[0].cpu",
            "9 CPUs is more than this host's capacity of 8 CPUs; lower cpu to 8 or raise host.capacity.cpu",
        ),
        (
            "cpu = 4\nshape_max = { cpu = 2 }",
            "policy[0].cpu",
            "4 CPUs is more than shape_max.cpu (2)",
        ),
        (
            "shape_max = { gpus = 1 }",
            "policy[0].shape_max.gpus",
            "is neither cpu, memory, disk nor a device group of this host (its groups: fpga, gpu); fix the key or add a [[host.device]] with group = \"gpus\"",
        ),
        (
            "shape_max = { mem = \"8G\" }",
            "policy[0].shape_max.mem",
            "is neither cpu, memory, disk nor a device group",
        ),
        (
            "shape_max = { gpu = 0 }",
            "policy[0].shape_max.gpu",
            "`0` is not a device count",
        ),
        (
            "shape_max = { memory = \"1.5G\" }",
            "policy[0].shape_max.memory",
            "`1.5G` is not a size",
        ),
        (
            "shape_max = { cpu = 16 }",
            "policy[0].shape_max.cpu",
            "16 CPUs is more than this host's capacity of 8 CPUs; lower shape_max.cpu to 8 or raise host.capacity.cpu",
        ),
        (
            "shape_max = { memory = \"64G\" }",
            "policy[0].shape_max.memory",
            "64G is more than this host's capacity of 32G; lower shape_max.memory to 32G or raise host.capacity.memory",
        ),
        (
            "shape_max = { disk = \"300G\" }",
            "policy[0].shape_max.disk",
            "lower shape_max.disk to 200G or raise host.capacity.disk",
        ),
        (
            "shape_max = { gpu = 2 }",
            "policy[0].shape_max.gpu",
            "2 `gpu` devices is more than the 1 this host has; lower shape_max.gpu to 1 or add [[host.device]] entries with group = \"gpu\"",
        ),
        (
            "[[policy.shape]]\nname = \"huge\"\ncpu = 12",
            "policy[0].shape[0].cpu",
            "12 CPUs is more than this host's capacity of 8 CPUs; lower shape[0].cpu to 8 or raise host.capacity.cpu",
        ),
        (
            "shape_max = { cpu = 4, memory = \"8G\", fpga = 1 }\n[[policy.shape]]\nname = \"a\"\ncpu = 2\n[[policy.shape]]\nname = \"b\"\nmemory = \"16G\"",
            "policy[0].shape[1].memory",
            "16G is more than shape_max.memory (8G); lower it or raise shape_max.memory",
        ),
        (
            "shape_max = { cpu = 4 }\n[[policy.shape]]\nname = \"a\"\ncpu = 6",
            "policy[0].shape[0].cpu",
            "6 is more than shape_max.cpu (4)",
        ),
        (
            "shape_max = { gpu = 1 }\n[[policy.shape]]\nname = \"a\"\ngpu = 2",
            "policy[0].shape[0].gpu",
            "2 is more than shape_max.gpu (1)",
        ),
        (
            "[[policy.shape]]\nname = \"Large\"",
            "policy[0].shape[0].name",
            "`Large` is not a shape name",
        ),
        (
            "[[policy.shape]]\nname = \"a\"\n[[policy.shape]]\nname = \"a\"",
            "policy[0].shape[1].name",
            "`a` names another shape of this policy too",
        ),
        (
            "[[policy.shape]]\nname = \"a\"\ntpu = 1",
            "policy[0].shape[0].tpu",
            "is neither cpu, memory, disk nor a device group",
        ),
    ];
    for (extra, key, words) in cases {
        let refused = on(MACHINE, &policy(extra)).unwrap_err();
        assert_eq!(refused.key, key, "{extra}: {refused}");
        assert!(refused.problem.contains(words), "{extra}: {refused}");
    }
    // A shaped policy's own label may not look like a shape label; an unshaped one's may.
    let labelled = |extra: &str| {
        format!(
            "[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"linux\", \"RM-big\"]\n{extra}\n"
        )
    };
    let refused = on(MACHINE, &labelled("shape_max = { cpu = 2 }")).unwrap_err();
    assert_eq!(refused.key, "policy[0].labels");
    assert!(
        refused.problem.contains("`RM-big` starts with `rm-`"),
        "{refused}"
    );
    assert!(on(MACHINE, &labelled("")).is_ok());
    // With no device of the group, no machine size and no shape_max: the named shape stays
    // within what is known, so it is accepted.
    let unknown = on(
        bounds::HostFacts::default(),
        "[[policy]]\nname = \"p\"\ntarget = \"acme\"\nlabels = [\"x\"]\n[[policy.shape]]\nname = \"big\"\ncpu = 64\nmemory = \"1T\"\n",
    )
    .unwrap();
    assert_eq!(
        unknown.policies[0].shapes.named[0].1.cpu_millis,
        Some(64_000)
    );
}
