//! The `rm-agent` command line through the real binary: `--json` shapes of CONTRACT §3, exit
//! codes of CONTRACT §1, replay, and no secret in any output.

#![allow(clippy::unwrap_used, reason = "tests")]

use crate::skip;

use rm_e2e::{SECRET, Setup, delivery, json_stdout};
use rm_vocab::UnixMs;

#[tokio::test]
async fn jobs_and_deliveries_json_follow_the_contract() {
    let setup = Setup::new();
    let agent = setup.start_receiver().await;
    let queued = delivery("workflow_job.queued.6", Some(501));
    let started = delivery("workflow_job.in_progress.4", Some(501));
    let ping = delivery("ping.none.0", None);
    let run = delivery("workflow_run.completed.0", None);
    for d in [&started, &queued, &ping, &run] {
        assert_eq!(agent.deliver(d).await, Ok(202));
    }

    let jobs = json_stdout(&setup.run(&["jobs", "--json"]));
    let job = &jobs.as_array().unwrap()[0];
    for key in [
        "job_id",
        "run_id",
        "run_attempt",
        "repository",
        "labels",
        "state",
        "conclusion",
        "runner_name",
        "source",
        "updated_at",
    ] {
        assert!(job.get(key).is_some(), "jobs --json lacks {key}: {job}");
    }
    assert_eq!(job["job_id"], 501);
    assert_eq!(
        job["state"], "in_progress",
        "the late `queued` did not move it back"
    );
    assert_eq!(job["runner_name"], "GitHub Actions 6");
    assert_eq!(job["source"], "webhook");
    assert!(job["updated_at"].as_str().unwrap().ends_with('Z'));

    let deliveries = json_stdout(&setup.run(&["deliveries", "--json"]));
    let deliveries = deliveries.as_array().unwrap();
    assert_eq!(deliveries.len(), 4);
    for d in deliveries {
        for key in [
            "guid",
            "event",
            "action",
            "received_at",
            "outcome",
            "reason",
        ] {
            assert!(d.get(key).is_some(), "deliveries --json lacks {key}: {d}");
        }
    }
    let outcome = |guid: &str| {
        deliveries.iter().find(|d| d["guid"] == guid).unwrap()["outcome"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(outcome(&started.guid), "applied");
    assert_eq!(outcome(&queued.guid), "duplicate");
    assert_eq!(outcome(&ping.guid), "applied");
    assert_eq!(outcome(&run.guid), "ignored");

    // The human tables carry the same rows.
    let table = String::from_utf8(setup.run(&["jobs"]).stdout).unwrap();
    assert!(table.starts_with("JOB"), "{table}");
    assert!(table.contains("in_progress"));

    // Nothing secret in anything the agent printed or wrote.
    drop(agent);
    let journal = std::fs::read(setup.journal()).unwrap();
    assert!(!setup.logs().contains(SECRET));
    assert!(
        !journal
            .windows(SECRET.len())
            .any(|w| w == SECRET.as_bytes())
    );
}

#[tokio::test]
async fn a_rejected_delivery_is_kept_and_replay_reports_it() {
    let setup = Setup::new();
    let agent = setup.start_receiver().await;
    let mut bad = delivery("workflow_job.queued.6", Some(7));
    bad.body = br#"{"action":"queued","workflow_job":{"id":7}}"#.to_vec();
    assert_eq!(agent.deliver(&bad).await, Ok(202));
    let out = setup.run(&["deliveries", "replay", &bad.guid]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("still rejected"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one sentence: {stderr}");

    let good = delivery("workflow_job.queued.6", Some(8));
    assert_eq!(agent.deliver(&good).await, Ok(202));
    let replayed = json_stdout(&setup.run(&["deliveries", "replay", &good.guid, "--json"]));
    assert_eq!(replayed["outcome"], "duplicate");

    let unknown = setup.run(&["deliveries", "replay", "no-such-guid"]);
    assert_eq!(unknown.status.code(), Some(1));
}

#[tokio::test]
async fn a_second_receiver_on_the_same_data_directory_exits_3() {
    let setup = Setup::new();
    let _agent = setup.start_receiver().await;
    let out = setup.run(&["receive"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("owns the data directory")
    );
}

#[tokio::test]
async fn sigterm_stops_the_receiver_cleanly() {
    let setup = Setup::new();
    let agent = setup.start_receiver().await;
    assert_eq!(agent.deliver(&delivery("ping.none.1", None)).await, Ok(202));
    let status = agent.terminate();
    assert!(status.success(), "{status:?}");
}

#[test]
fn configuration_mistakes_exit_2_naming_file_and_key() {
    let setup = Setup::new();
    let cases = [
        (
            "[receiver]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n",
            "unknown field `bogus`",
        ),
        ("[polling]\ninterval = \"5s\"\n", "`polling.interval`"),
        ("[host]\nmax_runners = -1\n", "`host.max_runners`"),
    ];
    for (text, expected) in cases {
        std::fs::write(setup.config(), text).unwrap();
        let out = setup.run(&["jobs"]);
        assert_eq!(out.status.code(), Some(2), "{text}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(stderr.contains("rm-agent.toml"), "{stderr}");
        assert!(stderr.contains(expected), "{expected} not in {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let missing = setup
        .command(&["jobs"])
        .arg("--config")
        .arg("/nonexistent.toml")
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));

    // A receiver without a secret is refused at start.
    std::fs::write(setup.config(), "[receiver]\nlisten = \"127.0.0.1:1\"\n").unwrap();
    let out = setup
        .command(&["receive"])
        .env_remove("RM_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("no webhook secret")
    );
}

#[test]
fn a_world_readable_secret_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new();
    let secret_file = setup.dir.path().join("webhook-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(
        setup.config(),
        format!(
            "[github]\nwebhook_secret_file = \"{}\"\n[receiver]\nlisten = \"{}\"\n",
            secret_file.display(),
            setup.addr
        ),
    )
    .unwrap();
    let out = setup
        .command(&["receive"])
        .env_remove("RM_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("chmod 600"), "{stderr}");
    assert!(!stderr.contains(SECRET));
}

#[test]
fn help_names_every_command_with_an_example() {
    let setup = Setup::new();
    let out = setup.run(&["--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    // Every command of CONTRACT §3.
    let commands = [
        "run",
        "receive",
        "check",
        "status",
        "jobs",
        "runners",
        "deliveries",
        "demo",
    ];
    assert!(help.contains("Examples:"), "{help}");
    for command in commands {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{command} "))),
            "{command} not in {help}"
        );
        let out = setup.run(&[command, "--help"]);
        assert!(out.status.success(), "{command} --help failed");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("Example"),
            "{command} --help has no example: {text}"
        );
    }
}

/// `runners --json` lists attempts with CONTRACT §3's fields. Until the lifecycle drives
/// attempts, the test journals one the way the lifecycle will: created, JIT received, busy.
#[tokio::test]
async fn runners_json_follows_the_contract() {
    use rm_journal::{AttemptId, Attempts, IsolationKind, NewAttempt, WorkspaceKind};
    let setup = Setup::new();
    drop(setup.start_receiver().await);
    let attempts = Attempts::open(&setup.journal()).unwrap();
    let id = AttemptId::generate();
    let name = id.runner_name("e2e-host");
    let runtime = setup.dir.path().join("runners").join(id.short());
    attempts
        .create(&NewAttempt {
            attempt_id: &id,
            policy: "linux",
            runner_name: &name,
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &runtime,
            created_at_ms: UnixMs::new(1_700_000_000_000),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: None,
            shape: None,
        })
        .unwrap();
    assert!(
        attempts
            .jit_received(
                &id,
                rm_vocab::RunnerId::new(77),
                UnixMs::new(1_700_000_000_100)
            )
            .unwrap()
    );
    assert!(
        attempts
            .started(&id, 4242, 99, UnixMs::new(1_700_000_000_200))
            .unwrap()
    );
    assert!(
        attempts
            .mark_busy(
                &id,
                Some(rm_vocab::JobId::new(501)),
                UnixMs::new(1_700_000_000_300)
            )
            .unwrap()
    );

    let runners = json_stdout(&setup.run(&["runners", "--json"]));
    let runner = &runners.as_array().unwrap()[0];
    for key in [
        "attempt_id",
        "policy",
        "runner_name",
        "runner_id",
        "state",
        "outcome",
        "job_id",
        "uid",
        "created_at",
        "updated_at",
    ] {
        assert!(
            runner.get(key).is_some(),
            "runners --json lacks {key}: {runner}"
        );
    }
    assert_eq!(runner["attempt_id"], id.as_str());
    assert_eq!(runner["runner_name"], name.as_str());
    assert!(name.starts_with("rm-e2e-host-"));
    assert_eq!(
        (
            runner["state"].as_str(),
            runner["runner_id"].as_i64(),
            runner["job_id"].as_i64()
        ),
        (Some("busy"), Some(77), Some(501))
    );
    // Journalled without isolation: no uid (CONTRACT §7); on the host's root: no image.
    assert!(runner["uid"].is_null(), "{runner}");
    assert!(runner["image"].is_null(), "{runner}");
    let table = String::from_utf8(setup.run(&["runners"]).stdout).unwrap();
    assert!(table.contains(&name) && table.contains("busy"), "{table}");
    assert!(!table.contains("IMAGE"), "{table}");

    // A runner whose root is an image (issue 40): its full id in JSON, the short one in the table.
    let image = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let imaged = AttemptId::generate();
    let imaged_name = imaged.runner_name("e2e-host");
    let imaged_runtime = setup.dir.path().join("runners").join(imaged.short());
    attempts
        .create(&NewAttempt {
            attempt_id: &imaged,
            policy: "linux",
            runner_name: &imaged_name,
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &imaged_runtime,
            created_at_ms: UnixMs::new(1_700_000_001_000),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: Some(&image),
            shape: None,
        })
        .unwrap();
    let runners = json_stdout(&setup.run(&["runners", "--json"]));
    let listed: Vec<_> = runners
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["runner_name"].as_str().unwrap(), r["image"].as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            (imaged_name.as_str(), Some(image.as_str())),
            (name.as_str(), None)
        ]
    );
    let table = String::from_utf8(setup.run(&["runners"]).stdout).unwrap();
    let row = table.lines().find(|l| l.contains(&imaged_name)).unwrap();
    assert!(table.contains("IMAGE"), "{table}");
    assert!(row.contains("sha256:0123456789ab "), "{table}");
    assert!(!row.contains(&image), "{table}");
}

/// Issue 40 through the real binary: `explain JOB` names the full id of the image the job's
/// runner ran in (a `runner_image` reason and `runner_end.image`), and `status` names it for the
/// runner while it is not cleaned up (`runners.images`, the `images` line).
#[tokio::test]
async fn explain_and_status_name_the_image_a_runner_ran_in() {
    use rm_journal::{AttemptId, AttemptOutcome, AttemptState, Attempts, IsolationKind};
    use rm_journal::{NewAttempt, WorkspaceKind};
    let setup = Setup::new();
    let agent = setup.start_receiver().await;
    let started = delivery("workflow_job.in_progress.4", Some(777));
    assert_eq!(agent.deliver(&started).await, Ok(202));
    drop(agent);

    let image = format!("sha256:{}", "fedcba9876543210".repeat(4));
    let attempts = Attempts::open(&setup.journal()).unwrap();
    let id = AttemptId::generate();
    let name = id.runner_name("e2e-host");
    let runtime = setup.dir.path().join("runners").join(id.short());
    attempts
        .create(&NewAttempt {
            attempt_id: &id,
            policy: "linux",
            runner_name: &name,
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &runtime,
            created_at_ms: UnixMs::new(1_700_000_000_000),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: Some(&image),
            shape: None,
        })
        .unwrap();
    let at = |ms: i64| UnixMs::new(1_700_000_000_000 + ms);
    assert!(
        attempts
            .jit_received(&id, rm_vocab::RunnerId::new(78), at(1))
            .unwrap()
    );
    assert!(attempts.started(&id, 4243, 99, at(2)).unwrap());
    assert!(
        attempts
            .mark_busy(&id, Some(rm_vocab::JobId::new(777)), at(3))
            .unwrap()
    );
    assert!(
        attempts
            .conclude(
                &id,
                AttemptState::Busy,
                AttemptOutcome::CompletedJob,
                None,
                None,
                at(4)
            )
            .unwrap()
    );

    let answer = json_stdout(&setup.run(&["explain", "777", "--json"]));
    assert_eq!(
        answer["runner_end"]["runner_name"],
        name.as_str(),
        "{answer}"
    );
    assert_eq!(answer["runner_end"]["image"], image.as_str(), "{answer}");
    let named: Vec<_> = answer["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["code"] == "runner_image")
        .map(|r| r["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        named,
        [format!("Its runner {name} ran in image {image}.")],
        "{answer}"
    );
    let text = String::from_utf8(setup.run(&["explain", "777"]).stdout).unwrap();
    assert!(text.contains(&image), "{text}");

    // Concluded, not yet cleaned up: status names it.
    let status = json_stdout(&setup.run(&["status", "--json"]));
    assert_eq!(
        status["runners"]["images"],
        serde_json::json!([{
            "runner_name": name,
            "policy": "linux",
            "state": "finished",
            "image": image,
        }]),
        "{status}"
    );
    let text = String::from_utf8(setup.run(&["status"]).stdout).unwrap();
    assert!(
        text.contains(&format!("images    sha256:fedcba987654 ({name})")),
        "{text}"
    );
}

/// An agent that may not switch users refuses `run` when the configuration does not name
/// `isolation = "none"` (CONTRACT §7), exit 2, with both ways out; named, `none` is accepted.
#[test]
fn run_refuses_to_start_unisolated_unless_none_is_named() {
    use std::os::unix::process::CommandExt as _;
    let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if me != 0 {
        skip::cannot_run(
            "run_refuses_to_start_unisolated_unless_none_is_named",
            "root",
            "only root can run the agent as another user",
        );
        return;
    }
    // A uid far from every pool, as the user the agent runs as.
    let user = 2_900_000 + std::process::id() % 100_000;
    let setup = Setup::new();
    let data = setup.dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::os::unix::fs::chown(&data, Some(user), Some(user)).unwrap();
    let package = setup.dir.path().join("package");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    std::fs::write(package.join("bin/Runner.Listener"), "#!/bin/sh\n").unwrap();
    let config = |host: &str| {
        format!(
            "data_dir = \"{}\"\n\n[github]\napi_url = \"http://127.0.0.1:9\"\napp_id = 1\n\n{host}[runner]\npackage_dir = \"{}\"\n\n[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\n",
            data.display(),
            package.display()
        )
    };
    let key = rm_fake_github::AppKeyPair::generate().unwrap();
    let agent_as_user = || {
        let mut command = setup.command(&["run"]);
        command
            .env(
                "RM_GITHUB_PRIVATE_KEY",
                secrecy::ExposeSecret::expose_secret(&key.private_pem),
            )
            .uid(user)
            .gid(user);
        command
    };
    let run_as_user = || agent_as_user().output().unwrap();
    std::fs::write(setup.config(), config("")).unwrap();
    let out = run_as_user();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for words in [
        "host.isolation",
        "isolated by default",
        "run rm-agent as root",
        "isolation = \"none\"",
    ] {
        assert!(stderr.contains(words), "{words}: {stderr}");
    }
    // Named `user`: the same refusal, worded for the setting.
    std::fs::write(setup.config(), config("[host]\nisolation = \"user\"\n\n")).unwrap();
    let out = run_as_user();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("\"user\" is set"), "{stderr}");
    // Named `none`: no isolation refusal; the agent starts (and keeps trying the GitHub at
    // port 9 until it is stopped).
    std::fs::write(setup.config(), config("[host]\nisolation = \"none\"\n\n")).unwrap();
    let log = setup.dir.path().join("none.log");
    let mut agent = agent_as_user()
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let started = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("host.isolation = \"none\"") || agent.try_wait().unwrap().is_some() {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no start-up log: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(
        started.contains("a job can read the App's private key"),
        "the start-up log says what a job can reach: {started}"
    );
}

/// Every key path of a JSON document (`a.b`, arrays as `[]`), to compare shapes.
fn key_paths(
    value: &serde_json::Value,
    prefix: &str,
    out: &mut std::collections::BTreeSet<String>,
) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                let path = format!("{prefix}.{key}");
                out.insert(path.clone());
                key_paths(inner, &path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for inner in items {
                key_paths(inner, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// A data directory no agent has used yet: `--json` still prints the contract's document (the
/// empty state, shaped as with a journal), says on stderr that no agent has run here, and exits
/// 0; without `--json` the missing journal stays an error naming the path.
#[tokio::test]
async fn json_on_an_unused_data_directory_is_the_empty_state() {
    let setup = Setup::new();
    let mut empty_status = None;
    for (args, expected) in [
        (&["status", "--json"][..], None),
        (&["runners", "--json"][..], Some(serde_json::json!([]))),
        (&["jobs", "--json"][..], Some(serde_json::json!([]))),
        (&["deliveries", "--json"][..], Some(serde_json::json!([]))),
    ] {
        let out = setup.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            stderr.contains("no rm-agent has run with this data directory"),
            "{args:?}: {stderr}"
        );
        let doc = json_stdout(&out);
        match expected {
            Some(expected) => assert_eq!(doc, expected, "{args:?}"),
            None => empty_status = Some(doc),
        }
    }
    let empty_status = empty_status.unwrap();
    assert_eq!(empty_status["jobs"]["queued"], 0);
    assert_eq!(empty_status["runners"]["active"], 0);
    assert_eq!(empty_status["webhooks"]["deliveries"], 0);
    assert_eq!(empty_status["agent"]["running"], false);

    let text = setup.run(&["runners"]);
    assert_eq!(text.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&text.stderr).contains("no journal at"));

    // Once a journal exists (and still no agent runs), the document has the very same shape.
    drop(setup.start_receiver().await);
    let out = setup.run(&["status", "--json"]);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let with_journal = json_stdout(&out);
    let (mut empty_keys, mut journal_keys) = Default::default();
    key_paths(&empty_status, "", &mut empty_keys);
    key_paths(&with_journal, "", &mut journal_keys);
    assert_eq!(empty_keys, journal_keys);
    for key in [
        ".webhooks.healthy",
        ".polling.pace",
        ".github.rate_limit.remaining",
        ".jobs.in_progress",
        ".runners.capacity",
    ] {
        assert!(empty_keys.contains(key), "{key}: {empty_keys:?}");
    }
}

/// A reader that closes the pipe (`rm-agent jobs | head -1`) ends the output, not the command:
/// no panic, exit 0. The pipe's read end is closed before the command starts, so every write
/// it makes fails with EPIPE (Rust ignores SIGPIPE).
#[tokio::test]
async fn a_closed_stdout_ends_the_output_not_the_command() {
    let setup = Setup::new();
    let agent = setup.start_receiver().await;
    for job in 0..3 {
        assert_eq!(
            agent
                .deliver(&delivery("workflow_job.queued.6", Some(900 + job)))
                .await,
            Ok(202)
        );
    }
    for args in [
        &["jobs"][..],
        &["jobs", "--json"],
        &["deliveries"],
        &["deliveries", "--json"],
        &["runners"],
        &["runners", "--json"],
        &["status"],
        &["status", "--json"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = setup
            .command(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
    }
}
