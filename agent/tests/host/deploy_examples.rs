//! Every example in deploy/ parses and agrees with the code and the example configuration: the
//! systemd unit (as INI: the hardening, root with exactly the capabilities isolation needs, the
//! delegated cgroup, the drain's stop timeout, `rm-agent ... run`), the
//! launchd plist (as a plist), the reverse proxies (the receiver's port and path, the body
//! limit), the relay's container image (its stages, the Rust version, the non-root user, the
//! command line). The TOML configurations go through the real loader in `config::tests`; here the full
//! example is loaded again to read the port, path and data directory the others must match.
//! Where `systemd-analyze` or `caddy` is installed, they check their files too.

#![allow(clippy::unwrap_used, reason = "tests")]

use crate::skip;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use rm_agent::config::{self, Config, Sources};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

fn deploy(path: &str) -> PathBuf {
    Path::new(DEPLOY).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("deploy/{path}: {e}"))
}

/// The full example configuration, through the real loader.
fn example_config() -> Config {
    config::load(&Sources {
        explicit_file: Some(deploy("rm-agent.example.toml")),
        data_dir: None,
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A systemd unit file: section -> key -> every value given (keys may repeat).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn parse_unit(text: &str) -> Unit {
    let mut unit = Unit::new();
    let mut section: Option<String> = None;
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.to_owned());
            unit.entry(name.to_owned()).or_default();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not `Key=value`: {line}", number + 1));
        let section = section
            .as_ref()
            .unwrap_or_else(|| panic!("line {}: outside any [Section]", number + 1));
        assert!(
            !line.ends_with('\\'),
            "line {}: no continuations",
            number + 1
        );
        unit.get_mut(section)
            .unwrap()
            .entry(key.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    }
    unit
}

fn one<'a>(unit: &'a Unit, section: &str, key: &str) -> &'a str {
    let values = unit
        .get(section)
        .and_then(|s| s.get(key))
        .unwrap_or_else(|| panic!("[{section}] has no {key}="));
    values.last().unwrap()
}

#[test]
fn the_systemd_unit_is_hardened_and_drains_within_its_stop_timeout() {
    let text = read("systemd/rm-agent.service");
    let unit = parse_unit(&text);
    for section in ["Unit", "Service", "Install"] {
        assert!(unit.contains_key(section), "no [{section}]");
    }
    assert_eq!(one(&unit, "Install", "WantedBy"), "multi-user.target");

    // `rm-agent --config FILE run`.
    let exec: Vec<&str> = one(&unit, "Service", "ExecStart")
        .split_whitespace()
        .collect();
    assert!(
        exec[0].starts_with('/') && exec[0].ends_with("/rm-agent"),
        "{exec:?}"
    );
    assert_eq!(exec.last(), Some(&"run"), "{exec:?}");
    let config_at = exec.iter().position(|a| *a == "--config").unwrap();
    assert!(exec[config_at + 1].ends_with(".toml"));

    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("AmbientCapabilities", ""),
        // The runners' cgroups live in the unit's delegated subtree.
        ("Delegate", "yes"),
        // Runners outlive a restart and are adopted: only the agent gets the stop signal.
        ("KillMode", "process"),
        ("KillSignal", "SIGTERM"),
    ] {
        assert_eq!(one(&unit, "Service", key), value, "{key}");
    }
    let service = &unit["Service"];
    // The agent runs as root (it starts each runner under a uid of its own), bounded to exactly
    // the capabilities isolation needs (docs/security.md lists why each one).
    for key in ["User", "Group", "DynamicUser"] {
        assert!(
            !service.contains_key(key),
            "{key}=: the agent runs as root to switch runners to their own uids"
        );
    }
    let bounding: BTreeSet<&str> = service
        .get("CapabilityBoundingSet")
        .expect("a capability bounding set")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .collect();
    assert_eq!(
        bounding,
        [
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FOWNER",
            "CAP_KILL",
            "CAP_NET_ADMIN",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SYS_ADMIN",
        ]
        .into_iter()
        .collect(),
        "CapabilityBoundingSet must be exactly what isolation needs"
    );
    assert!(
        service["CapabilityBoundingSet"]
            .iter()
            .all(|v| !v.starts_with('~')),
        "an allow-list, not a deny-list"
    );
    assert!(
        !service.contains_key("ProtectControlGroups"),
        "the agent writes its delegated cgroup subtree"
    );
    let security =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
            .unwrap();
    for capability in &bounding {
        assert!(
            security.contains(&format!("`{capability}`")),
            "docs/security.md does not say why the unit keeps {capability}"
        );
    }
    assert!(
        !service.contains_key("ProtectHostname"),
        "its seccomp filter refuses sethostname(2): runners' and containers' UTS namespaces are named"
    );
    assert!(
        !service.contains_key("MemoryDenyWriteExecute"),
        "the runner is a .NET program: it needs W^X memory for its JIT"
    );

    // The drain exits within 60 s (CONTRACT §3); systemd must not SIGKILL before that.
    let stop: u64 = one(&unit, "Service", "TimeoutStopSec").parse().unwrap();
    assert!((61..=120).contains(&stop), "TimeoutStopSec={stop}");

    // Configuration mistakes and a data directory owned by another agent are not retried.
    let no_restart: Vec<u8> = one(&unit, "Service", "RestartPreventExitStatus")
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .collect();
    assert!(no_restart.contains(&rm_agent::exit::USAGE));
    assert!(no_restart.contains(&rm_agent::exit::CONFLICT));

    // The data directory the example configuration uses is the unit's writable state.
    let data_dir = example_config().data_dir;
    let state = one(&unit, "Service", "StateDirectory");
    assert_eq!(data_dir, Path::new("/var/lib").join(state));
    assert!(
        one(&unit, "Service", "ReadWritePaths")
            .split_whitespace()
            .any(|p| Path::new(p) == data_dir),
        "ReadWritePaths must hold {}",
        data_dir.display()
    );
    assert!(
        one(&unit, "Service", "EnvironmentFile").starts_with('-'),
        "the environment file is optional"
    );

    systemd_analyze_verify(&text);
}

/// The drop-in for Docker policies lifts exactly what stops a runner's rootless daemon (the
/// setuid `newuidmap` under `no_new_privs`, `/dev/net/tun` under `PrivateDevices`, the daemon's
/// own tun node without `CAP_MKNOD`) and nothing else; the unit with it still verifies.
#[test]
fn the_docker_drop_in_lifts_only_what_a_rootless_daemon_needs() {
    let text = read("systemd/rm-agent.service.d/docker.conf");
    let drop_in = parse_unit(&text);
    assert_eq!(drop_in.keys().collect::<Vec<_>>(), ["Service"]);
    let service = &drop_in["Service"];
    let mut keys: Vec<&str> = service.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["CapabilityBoundingSet", "NoNewPrivileges", "PrivateDevices"]
    );
    assert_eq!(one(&drop_in, "Service", "NoNewPrivileges"), "no");
    assert_eq!(one(&drop_in, "Service", "PrivateDevices"), "no");
    assert_eq!(
        one(&drop_in, "Service", "CapabilityBoundingSet"),
        "CAP_MKNOD"
    );
    // What the agent itself checks before it starts a daemon says the same.
    let setup =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/setup.md")).unwrap();
    assert!(
        setup.contains("rm-agent.service.d/docker.conf"),
        "docs/setup.md does not point Docker hosts at the drop-in"
    );
    // systemd merges a drop-in's [Service] into the unit's, as a second section of one file.
    let unit = read("systemd/rm-agent.service");
    systemd_analyze_verify(&format!("{unit}\n{text}"));
}

/// `systemd-analyze verify` on the unit, with ExecStart pointed at an existing program.
fn systemd_analyze_verify(text: &str) {
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        skip::cannot_run(
            "the systemd unit under systemd-analyze verify",
            "systemd-analyze",
            "systemd-analyze is not installed (apt-get install systemd): the unit was only parsed as INI",
        );
        return;
    };
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join("rm-agent.service");
    let exe = std::env::current_exe().unwrap();
    std::fs::write(
        &unit,
        text.replace("/usr/local/bin/rm-agent", exe.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    assert!(
        !stderr.contains("rm-agent.service:"),
        "systemd-analyze complains about the unit: {stderr}"
    );
}

#[test]
fn the_launchd_plist_runs_the_agent_and_gives_the_drain_its_time() {
    let plist = plist::Value::from_file(deploy("launchd/dev.rm.agent.plist")).unwrap();
    let dict = plist.as_dictionary().unwrap();
    assert_eq!(
        dict.get("Label").and_then(plist::Value::as_string),
        Some("dev.rm.agent")
    );
    let args: Vec<&str> = dict
        .get("ProgramArguments")
        .and_then(plist::Value::as_array)
        .unwrap()
        .iter()
        .map(|a| a.as_string().unwrap())
        .collect();
    assert!(args[0].ends_with("/rm-agent"), "{args:?}");
    assert_eq!(args.last(), Some(&"run"));
    assert!(args.contains(&"--config"));
    let exit_timeout = dict
        .get("ExitTimeOut")
        .and_then(plist::Value::as_signed_integer)
        .unwrap();
    assert!(exit_timeout > 60, "ExitTimeOut={exit_timeout}");
    assert_eq!(
        dict.get("AbandonProcessGroup")
            .and_then(plist::Value::as_boolean),
        Some(true),
        "a busy runner must survive the agent's exit"
    );
    assert!(dict.contains_key("KeepAlive"));
    assert_eq!(
        dict.get("Umask").and_then(plist::Value::as_signed_integer),
        Some(0o077)
    );
}

/// The receiver's port and path in the example configuration.
fn receiver() -> (u16, String) {
    let receiver = example_config().receiver.unwrap();
    (receiver.listen.port(), receiver.path)
}

fn assert_balanced(name: &str, text: &str) {
    let mut depth = 0i32;
    for c in text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::chars)
    {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        assert!(depth >= 0, "{name}: unbalanced braces");
    }
    assert_eq!(depth, 0, "{name}: unbalanced braces");
}

#[test]
fn the_nginx_example_forwards_the_webhook_path_to_the_receiver() {
    let text = read("proxy/nginx.conf");
    assert_balanced("nginx.conf", &text);
    let (port, path) = receiver();
    let directives: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert!(
        directives.contains(&format!("server 127.0.0.1:{port};").as_str()),
        "the upstream must be the receiver's port {port}"
    );
    assert!(directives.contains(&format!("location = {path} {{").as_str()));
    assert!(directives.contains(&"client_max_body_size 25m;"));
    assert!(directives.iter().any(|d| d.starts_with("listen 443 ssl")));
    assert!(directives.iter().any(|d| d.starts_with("ssl_certificate ")));
    assert!(
        !directives.contains(&"proxy_pass_request_headers off;"),
        "the X-GitHub-* headers must reach the receiver"
    );
    assert!(
        !directives
            .iter()
            .any(|d| d.starts_with("proxy_set_header X-GitHub")
                || d.starts_with("proxy_set_header X-Hub")),
        "the GitHub headers pass unchanged"
    );
}

#[test]
fn the_caddy_example_forwards_the_webhook_path_to_the_receiver() {
    let text = read("proxy/Caddyfile");
    assert_balanced("Caddyfile", &text);
    let (port, path) = receiver();
    let directives: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert!(
        directives.contains(&format!("reverse_proxy 127.0.0.1:{port}").as_str()),
        "the upstream must be the receiver's port {port}"
    );
    assert!(directives.contains(&format!("handle {path} {{").as_str()));
    assert!(directives.contains(&"max_size 25MiB"));
    assert!(
        !directives.iter().any(|d| d.starts_with("header_up -")),
        "the GitHub headers pass unchanged"
    );

    // Caddy's own parser, where it is installed (it needs no certificate to adapt).
    match Command::new("caddy")
        .args(["adapt", "--adapter", "caddyfile", "--config"])
        .arg(deploy("proxy/Caddyfile"))
        .output()
    {
        Err(_) => skip::cannot_run(
            "the_caddy_example_forwards_the_webhook_path_to_the_receiver (caddy adapt)",
            "caddy",
            "caddy is not installed (apt-get install caddy): the Caddyfile was only checked as text",
        ),
        Ok(out) => {
            assert!(
                out.status.success(),
                "caddy adapt: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let text = json.to_string();
            assert!(text.contains(&format!("\"dial\":\"127.0.0.1:{port}\"")));
            assert!(text.contains("\"max_size\":26214400"), "25 MiB: {text}");
        }
    }
}

/// Every file in deploy/ is one of the examples tested here or in `config::tests`, so a new
/// example cannot land untested.
#[test]
fn every_file_in_deploy_is_checked() {
    let checked = [
        "rm-agent.example.toml",
        "quickstart.toml",
        "systemd/rm-agent.service",
        "systemd/rm-agent.service.d/docker.conf",
        "launchd/dev.rm.agent.plist",
        "proxy/nginx.conf",
        "proxy/Caddyfile",
        "relay/Dockerfile",
    ];
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from(DEPLOY)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let relative = path.strip_prefix(DEPLOY).unwrap();
                found.push(relative.to_str().unwrap().to_owned());
            }
        }
    }
    for file in &found {
        // Top-level TOML files are loaded by `config::tests`.
        let toml_at_top = !file.contains('/') && file.ends_with(".toml");
        assert!(
            toml_at_top || checked.contains(&file.as_str()),
            "deploy/{file} is not checked by any test: add it here"
        );
    }
    for file in checked {
        assert!(found.iter().any(|f| f == file), "deploy/{file} is missing");
    }
}

/// A Dockerfile as (INSTRUCTION, arguments), comments dropped and `\` continuations joined.
fn parse_dockerfile(text: &str) -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let (name, args) = pending.split_once(char::is_whitespace).unwrap();
        instructions.push((name.to_ascii_uppercase(), args.trim().to_owned()));
        pending.clear();
    }
    assert!(pending.is_empty(), "a continuation runs off the end");
    instructions
}

/// `"1.95"` -> (1, 95).
fn minor_version(text: &str) -> (u32, u32) {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

#[test]
fn the_relay_image_builds_rm_relay_and_runs_its_serve_command_unprivileged() {
    let instructions = parse_dockerfile(&read("relay/Dockerfile"));
    // Stages: each starts at a FROM.
    let mut stages: Vec<Vec<(String, String)>> = Vec::new();
    for (name, args) in instructions {
        if name == "FROM" {
            stages.push(Vec::new());
        }
        stages
            .last_mut()
            .expect("the Dockerfile must start with FROM")
            .push((name, args));
    }
    assert!(
        stages.len() >= 2,
        "a multi-stage build: a builder and a runtime"
    );
    let args_of = |stage: &[(String, String)], name: &str| -> Vec<String> {
        stage
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
            .collect()
    };

    // The builder: a Rust image no older than the workspace's rust-version, building rm-relay.
    let builder = &stages[0];
    let from = &args_of(builder, "FROM")[0];
    let (image, stage_name) = from
        .split_once(" AS ")
        .or_else(|| from.split_once(" as "))
        .unwrap();
    let tag = image
        .strip_prefix("rust:")
        .expect("the builder is the official rust image");
    let manifest: toml::Table = toml::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml")).unwrap(),
    )
    .unwrap();
    let rust_version = manifest["workspace"]["package"]["rust-version"]
        .as_str()
        .unwrap();
    let image_version = tag.split('-').next().unwrap();
    assert!(
        minor_version(image_version) >= minor_version(rust_version),
        "the builder's Rust {image_version} is older than the workspace's rust-version {rust_version}"
    );
    let build = args_of(builder, "RUN").join(" ");
    let cargo: Vec<&str> = build
        .split("&&")
        .find(|c| c.contains("cargo build"))
        .expect("the builder runs cargo build")
        .split_whitespace()
        .collect();
    for flag in ["--release", "--locked"] {
        assert!(
            cargo.contains(&flag),
            "cargo build without {flag}: {cargo:?}"
        );
    }
    let package = cargo
        .iter()
        .position(|a| *a == "-p" || *a == "--package")
        .unwrap();
    assert_eq!(cargo[package + 1], "rm-relay");

    // The runtime: the binary from the builder, a non-root user, JSON-form ENTRYPOINT and CMD.
    let runtime = stages.last().unwrap();
    assert!(
        args_of(runtime, "COPY")
            .iter()
            .any(|c| c.contains(&format!("--from={stage_name}")) && c.contains("rm-relay")),
        "the runtime copies rm-relay from the {stage_name} stage"
    );
    let user = args_of(runtime, "USER")
        .pop()
        .expect("the runtime sets USER");
    let user = user.split(':').next().unwrap();
    assert!(!["root", "0", ""].contains(&user), "USER {user} is root");
    let json_array = |name: &str| -> Vec<String> {
        let args = args_of(runtime, name)
            .pop()
            .unwrap_or_else(|| panic!("no {name}"));
        serde_json::from_str(&args)
            .unwrap_or_else(|_| panic!("{name} is not in JSON-array form: {args}"))
    };
    assert_eq!(json_array("ENTRYPOINT"), ["rm-relay"]);
    let cmd = json_array("CMD");
    assert_eq!(cmd[0], "serve", "{cmd:?}");
    let value_of = |flag: &str| {
        let at = cmd
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("CMD has no {flag}"));
        cmd[at + 1].clone()
    };
    let listen: std::net::SocketAddr = value_of("--listen").parse().unwrap();
    assert_eq!(args_of(runtime, "EXPOSE"), [listen.port().to_string()]);
    assert_eq!(args_of(runtime, "VOLUME"), [value_of("--data-dir")]);

    // Every CMD flag is one `rm-relay serve` accepts, asked of the built binary when this
    // target directory has one (a workspace test run builds it; relay/tests/relay/container.rs
    // also runs this very CMD).
    let bin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("rm-relay");
    match Command::new(&bin).args(["serve", "--help"]).output() {
        Ok(out) if out.status.success() => {
            let help = String::from_utf8(out.stdout).unwrap();
            for flag in cmd.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.split_whitespace()
                        .any(|w| w.trim_end_matches(',') == flag),
                    "`rm-relay serve` has no {flag}:\n{help}"
                );
            }
        }
        _ => eprintln!(
            "{} is not built: the CMD flags were checked by the relay's own tests",
            bin.display()
        ),
    }
}
