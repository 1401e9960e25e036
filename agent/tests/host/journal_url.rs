//! `[journal] url` through the real binary (CONTRACT §9): an unreachable database is named (and
//! no SQLite journal made instead), a password in it is refused naming the key and never
//! echoed, and `receive` on a real PostgreSQL server (`tests/support/postgres.rs`) commits a
//! signed delivery before its 202, which `deliveries` then lists from the database and
//! `deliveries replay` replays there; `explain` judges a queued job from the database, naming
//! another host's claim on it; `receive` stops on SIGTERM with exit 0.

#![allow(clippy::unwrap_used, reason = "tests")]

use crate::pg_server;
use crate::skip;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "It's a Secret to Everybody";
/// Set in the agent's environment; must never appear in what it prints.
const PASSWORD: &str = "pw-never-printed-7f3a";

fn agent(config: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rm-agent"));
    command
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(args)
        .env("RM_WEBHOOK_SECRET", SECRET)
        .env("RM_JOURNAL_PASSWORD", PASSWORD)
        .env_remove("RM_CONFIG")
        .env_remove("RM_DATA_DIR");
    command
}

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("rm-agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_unreachable_fleet_journal_is_named_and_a_password_in_the_url_is_refused_unechoed() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1: the connection is refused at once.
    let config = write_config(
        dir.path(),
        "[journal]\nurl = \"postgres://rm@127.0.0.1:1/rm\"\n",
    );
    let out = agent(&config, dir.path(), &["explain", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot read the fleet's journal"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    // It read the database, not the SQLite journal in the data directory: none was made.
    assert!(!dir.path().join("data").join("journal.sqlite3").exists());

    let config = write_config(
        dir.path(),
        "[journal]\nurl = \"postgres://rm:hunter2@db.example.net/rm\"\n",
    );
    let out = agent(&config, dir.path(), &["receive"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`journal.url`"), "{stderr}");
    assert!(stderr.contains("RM_JOURNAL_PASSWORD"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// A signed webhook delivery of `event` as one HTTP/1.1 request.
fn signed_post(event: &str, guid: &str, body: &[u8]) -> Vec<u8> {
    let request = format!(
        "POST /webhook HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         X-GitHub-Event: {event}\r\nX-GitHub-Delivery: {guid}\r\nX-Hub-Signature-256: {}\r\n\
         Content-Length: {}\r\n\r\n",
        rm_receiver::sign(SECRET.as_bytes(), body),
        body.len()
    );
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One HTTP/1.1 request on a fresh connection; the status code, or `None` if nothing answered.
fn http(port: u16, request: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream.write_all(request).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn receive_on_postgres_commits_before_202_and_stops_on_sigterm() {
    let test = "receive_on_postgres_commits_before_202";
    let server = match pg_server::shared() {
        Ok(server) => server,
        Err(why) => {
            skip::cannot_run(test, "postgres", &why);
            return;
        }
    };
    let db = server.database("receive_binary").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[receiver]\nlisten = \"127.0.0.1:{port}\"\n\n[journal]\nurl = \"{}\"\n",
            db.url()
        ),
    );
    let mut child = Stopped(Some(
        agent(&config, dir.path(), &["receive"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let healthz = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(port, healthz.as_bytes()) != Some(200) {
        assert!(Instant::now() < deadline, "receive did not become healthy");
        std::thread::sleep(Duration::from_millis(50));
    }

    let body = br#"{"action":"created","installation":{"id":99}}"#;
    let guid = "2f6b1f2e-0000-4000-8000-00000000beef";
    let bytes = signed_post("ping", guid, body);
    assert_eq!(http(port, &bytes), Some(202));
    assert_eq!(http(port, &bytes), Some(200));
    let url = db.url();
    let rows: i64 = std::thread::spawn(move || {
        postgres::Client::connect(&url, postgres::NoTls)
            .unwrap()
            .query_one("SELECT COUNT(*) FROM deliveries WHERE guid = $1", &[&guid])
            .unwrap()
            .get(0)
    })
    .join()
    .unwrap();
    assert_eq!(rows, 1);

    // The listings read the fleet's database: the delivery this receiver took, no job (a ping
    // makes none).
    let listed = agent(&config, dir.path(), &["deliveries", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        listed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let deliveries: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(deliveries[0]["guid"], guid, "{deliveries}");
    assert_eq!(deliveries.as_array().map(Vec::len), Some(1), "{deliveries}");
    let jobs = agent(&config, dir.path(), &["jobs", "--json"])
        .output()
        .unwrap();
    assert_eq!(jobs.status.code(), Some(0));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&jobs.stdout).unwrap(),
        serde_json::json!([])
    );
    // A replay runs the handler again in the database: the same outcome, now dated.
    let replay = agent(
        &config,
        dir.path(),
        &["deliveries", "replay", guid, "--json"],
    )
    .output()
    .unwrap();
    let replay_err = String::from_utf8_lossy(&replay.stderr);
    assert_eq!(replay.status.code(), Some(0), "{replay_err}");
    assert!(!replay_err.contains(PASSWORD), "{replay_err}");
    let replayed: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(replayed["outcome"], deliveries[0]["outcome"], "{replayed}");
    let url = db.url();
    let replayed_at: Option<i64> = std::thread::spawn(move || {
        postgres::Client::connect(&url, postgres::NoTls)
            .unwrap()
            .query_one(
                "SELECT replayed_at FROM deliveries WHERE guid = $1",
                &[&guid],
            )
            .unwrap()
            .get(0)
    })
    .join()
    .unwrap();
    assert!(replayed_at.is_some());

    // `explain` reads the fleet's journal: a job no host claimed is this host's to judge; once
    // another host claims it, it is that host's.
    let job_id = 4_242_001_u64;
    let mut queued: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/webhooks/workflow_job.queued.6.json"
        ))
        .unwrap(),
    )
    .unwrap();
    queued["workflow_job"]["id"] = serde_json::json!(job_id);
    // Queued now: an old body under a fresh GUID is stale, never demand.
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    queued["workflow_job"]["created_at"] = serde_json::json!(now);
    let queued = serde_json::to_vec(&queued).unwrap();
    let bytes = signed_post(
        "workflow_job",
        "2f6b1f2e-0000-4000-8000-00000000cafe",
        &queued,
    );
    assert_eq!(http(port, &bytes), Some(202));
    let explain = |id: u64, expect: i32| {
        let out = agent(&config, dir.path(), &["explain", &id.to_string(), "--json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(expect), "{stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let answer = explain(job_id, 0);
    assert_eq!(answer["state"], "queued", "{answer}");
    let codes: Vec<&str> = answer["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["code"].as_str())
        .collect();
    assert!(codes.contains(&"unclaimed"), "{answer}");
    let url = db.url();
    std::thread::spawn(move || {
        use rm_journal::Fleet as _;
        let mut fleet = rm_journal::PgFleet::connect(&url).unwrap();
        let other = rm_journal::HostInfo {
            host: "other-host".to_owned(),
            labels: vec!["ubuntu-latest".to_owned()],
            policies: vec!["linux".to_owned()],
        };
        fleet.renew_lease(&other, Duration::from_secs(300)).unwrap();
        let claimed = fleet
            .claim(&rm_journal::ClaimRequest {
                host: "other-host",
                policy: "linux",
                job_ids: &[rm_vocab::JobId::new(i64::try_from(job_id).unwrap())],
                max_runners: None,
            })
            .unwrap();
        assert_eq!(claimed.job_ids.len(), 1);
    })
    .join()
    .unwrap();
    let answer = explain(job_id, 0);
    assert_eq!(
        (&answer["verdict"], &answer["reasons"][0]["code"]),
        (
            &serde_json::json!("launching"),
            &serde_json::json!("claimed_by_host")
        ),
        "{answer}"
    );
    assert_eq!(answer["policy"], "linux", "{answer}");
    // `status` lists the job among the waiting ones with the same verdict.
    let status = agent(&config, dir.path(), &["status", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        status.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        (
            &status["waiting"][0]["job_id"],
            &status["waiting"][0]["verdict"]
        ),
        (&serde_json::json!(job_id), &serde_json::json!("launching")),
        "{status}"
    );
    // An id the fleet's journal does not hold: `not_seen`, exit 1.
    assert_eq!(explain(job_id + 1, 1)["verdict"], "not_seen");

    let child = child.0.take().unwrap();
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("receiver listening on the PostgreSQL journal"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    // It kept nothing in the data directory: the fleet's journal is the database.
    assert!(!dir.path().join("data").join("journal.sqlite3").exists());
}

/// The agent this test started, killed if the test fails before stopping it.
struct Stopped(Option<std::process::Child>);

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `run` with isolated runners (the default) refuses a `journal.url` without a password, over
/// TCP or over a unix socket: rm cannot see the server's pg_hba.conf, and a server that lets this
/// host in on its address (`trust` on a `host` line), or whoever opens its socket (`trust` on a
/// `local` line), lets a job of the host in with it (docs/fleet.md, "Logging in: the password
/// rule"). Exit 2 before anything is set up, naming the key, the reason and the fix. The rule's
/// table is `journal_auth::tests`.
#[test]
fn run_refuses_a_fleet_journal_without_a_password_over_tcp_or_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("app.pem");
    let made = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let package = dir.path().join("package");
    std::fs::create_dir_all(&package).unwrap();
    // (journal.url, what the refusal says beside the key, the password and `trust`)
    let cases: [(&str, &[&str]); 2] = [
        (
            "postgres://rm@127.0.0.1:1/rm",
            &["over TCP without a password", "address alone"],
        ),
        (
            "host=/run/postgresql user=rm dbname=rm",
            &[
                "over a unix socket without a password",
                "cannot read pg_hba.conf to tell `peer` from `trust`",
                "`local` line",
            ],
        ),
    ];
    for (url, specific) in cases {
        let config = write_config(
            dir.path(),
            &format!(
                "[github]\napp_id = 1\nprivate_key_file = \"{}\"\n\n[runner]\npackage_dir = \"{}\"\n\n\
                 [journal]\nurl = \"{url}\"\n\n\
                 [[policy]]\nname = \"linux\"\ntarget = \"octo-org\"\nlabels = [\"linux\"]\n",
                key.display(),
                package.display()
            ),
        );
        let out = agent(&config, dir.path(), &["run"])
            .env_remove("RM_JOURNAL_PASSWORD")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        for says in [
            "`journal.url`",
            "`trust`",
            "RM_JOURNAL_PASSWORD",
            "scram-sha-256",
        ]
        .iter()
        .chain(specific)
        {
            assert!(stderr.contains(says), "{url}: {says}: {stderr}");
        }
        // Refused before anything is set up: no journal of attempts made.
        assert!(
            !dir.path().join("data").join("journal.sqlite3").exists(),
            "{url}"
        );
    }
}
