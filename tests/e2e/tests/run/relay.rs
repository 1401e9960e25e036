//! `rm-agent run` behind NAT: no receiver, only a subscription to a real `rm-relay`. The fake
//! GitHub sends its signed webhooks to the relay's ingest URL; the agent streams them, verifies
//! them with its own secret, journals them (source `relay`) and runs the jobs. Deliveries sent
//! while the agent is down are replayed when it comes back; a forged one is refused; the token
//! never shows in anything the run leaves behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, HOST, REPO, wait_until};
use rm_e2e::{SECRET, binary, free_port, json_stdout};
use secrecy::SecretString;

const LABELS: &[&str] = &["self-hosted", "linux"];
const CHANNEL: &str = "ci";

/// A running `rm-relay serve`, killed when dropped.
struct Relay {
    child: Child,
    data: PathBuf,
    addr: String,
}

impl Relay {
    fn start(data: &Path) -> Relay {
        Relay::start_at(data, format!("127.0.0.1:{}", free_port()))
    }

    fn start_at(data: &Path, addr: String) -> Relay {
        // Debug logs, appended across restarts, so a test can search them for secrets.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.join("relay.log"))
            .unwrap();
        let child = rm_e2e::ends_with_its_test(&mut Command::new(binary("rm-relay")))
            .args(["serve", "--listen", &addr, "--data-dir"])
            .arg(data)
            .args(["--public-url", &format!("http://{addr}")])
            .env("RM_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Relay {
            child,
            data: data.to_owned(),
            addr,
        }
    }

    fn command(&self, args: &[&str]) -> serde_json::Value {
        let output = Command::new(binary("rm-relay"))
            .args(args)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--json")
            .output()
            .unwrap();
        assert!(output.status.success(), "rm-relay {args:?}: {output:?}");
        json_stdout(&output)
    }

    async fn wait_healthy(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while request(
            http::Request::get(format!("http://{}/healthz", self.addr)),
            Vec::new(),
        )
        .await
            != Some(200)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "rm-relay did not become healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Sends one request; its status, `None` when there was no answer.
async fn request(builder: http::request::Builder, body: Vec<u8>) -> Option<u16> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = builder
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    client
        .request(request)
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A relay with one channel and a token for the fleet's host, and a fleet with no receiver
/// subscribed to it, the fake GitHub sending its webhooks to the channel's ingest URL.
struct NatHost {
    relay_dir: tempfile::TempDir,
    relay: Relay,
    /// `channel add --json`: `ingest_url`, `subscribe_url`, `smee_url`.
    urls: serde_json::Value,
    token: String,
    fleet: Fleet,
}

impl NatHost {
    async fn start() -> NatHost {
        let relay_dir = tempfile::tempdir().unwrap();
        let relay = Relay::start(relay_dir.path());
        relay.wait_healthy().await;
        let urls = relay.command(&["channel", "add", CHANNEL]);
        let token = relay.command(&["channel", "token", CHANNEL, HOST])["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let fleet = Fleet::start(FleetOptions {
            receiver: false,
            relay_url: Some(urls["subscribe_url"].as_str().unwrap().to_owned()),
            ..FleetOptions::default()
        })
        .await;
        fleet.fake.set_webhook(
            urls["ingest_url"].as_str().unwrap(),
            SecretString::from(SECRET),
        );
        NatHost {
            relay_dir,
            relay,
            urls,
            token,
            fleet,
        }
    }
}

/// Journalled delivery GUIDs, from `rm-agent deliveries --json`.
fn journalled_guids(fleet: &Fleet) -> Vec<String> {
    let output = fleet.setup.run(&["deliveries", "--json"]);
    json_stdout(&output)
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["guid"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_behind_nat_runs_jobs_from_the_relay_and_misses_none_while_down() {
    let NatHost {
        relay_dir,
        relay,
        urls,
        token,
        fleet,
    } = NatHost::start().await;
    let env = [("RM_RELAY_TOKEN", token.as_str())];
    // `check` opens the stream with the token, and tells a wrong one.
    for (token, expect) in [(token.as_str(), "ok"), ("rmr_wrong", "fail")] {
        let output = fleet
            .setup
            .command(&["check", "--json"])
            .env("RM_RELAY_TOKEN", token)
            .output()
            .unwrap();
        let findings: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let relay = findings["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == "relay")
            .unwrap_or_else(|| panic!("no relay finding: {findings}"))
            .clone();
        assert_eq!(relay["status"], expect, "{relay}");
    }

    let agent = fleet.start_agent(&env).await;
    let first = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    wait_until(Duration::from_secs(40), "the first job completed", || {
        fleet.completed(first)
    })
    .await;
    // The journal learns the completion from the relay's delivery, which the fake sends a
    // little after the job ends (delayed and possibly reordered, as GitHub may): wait for it.
    // Its `queued` may have been found by the agent's first poll instead, which runs as the
    // job is queued; the state a delivery moves the job to is the relay's.
    let journalled = |state: &str| {
        let jobs = json_stdout(&fleet.setup.run(&["jobs", "--json"]));
        jobs.as_array()
            .unwrap()
            .iter()
            .find(|j| j["job_id"] == first && j["state"] == state)
            .cloned()
    };
    wait_until(
        Duration::from_secs(40),
        "the journal holds the job completed",
        || journalled("completed").is_some(),
    )
    .await;
    let job = journalled("completed").unwrap();
    assert_eq!(job["source"], "relay", "{job}");

    // Down: GitHub keeps delivering to the relay, which keeps them.
    agent.kill();
    let second = fleet.fake.queue_job(REPO, "test", LABELS).unwrap();
    fleet.fake.settle().await.unwrap();
    let sent_while_down: Vec<String> = fleet
        .fake
        .deliveries()
        .into_iter()
        .filter(|d| body_names_job(&d.body, second))
        .map(|d| d.guid)
        .collect();
    assert!(!sent_while_down.is_empty());

    // A forged delivery reaches the relay too: anyone who knows the ingest URL can post.
    let forged = forge(&relay, urls["ingest_url"].as_str().unwrap()).await;

    let agent = fleet.start_agent(&env).await;
    // Generous: recovery after the SIGKILL, the relay's replay, a runner start, and cleanup of
    // runners GitHub lists for a while after their job, on two busy cores.
    wait_until(
        Duration::from_secs(90),
        "the job queued while down completed",
        || fleet.completed(second),
    )
    .await;
    wait_until(Duration::from_secs(60), "every attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
    let guids = journalled_guids(&fleet);
    for guid in &sent_while_down {
        assert!(guids.contains(guid), "{guid} was not replayed: {guids:?}");
    }
    assert!(
        !guids.contains(&forged),
        "the forged delivery was journalled"
    );
    agent.terminate();
    // Everything was acknowledged (the forged one too: it can never become valid), so a restart
    // would replay nothing.
    let db = rusqlite::Connection::open_with_flags(
        relay_dir.path().join("relay.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (acked, newest): (i64, i64) = db
        .query_row(
            "SELECT (SELECT last_id FROM acks WHERE channel = ?1 AND host = ?2), \
                    (SELECT max(id) FROM deliveries WHERE channel = ?1)",
            [CHANNEL, HOST],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(acked, newest, "not every relayed delivery was acknowledged");

    let logs = fleet.setup.logs();
    assert!(
        logs.contains("relayed delivery refused"),
        "the forged delivery left no trace"
    );
    assert!(!logs.contains(&token), "the relay token reached the log");
    // Neither the token nor the channel's URL secrets reach the relay's own log.
    let relay_log = std::fs::read_to_string(relay_dir.path().join("relay.log")).unwrap();
    assert!(relay_log.contains("listening"), "{relay_log}");
    for secret in [
        token.as_str(),
        urls["ingest_url"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap(),
        urls["smee_url"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap(),
    ] {
        assert!(
            !relay_log.contains(secret),
            "{secret} is in the relay's log"
        );
    }
    let journal = fleet.journal_bytes();
    assert!(
        !journal.windows(token.len()).any(|w| w == token.as_bytes()),
        "the relay token reached the journal"
    );
}

fn body_names_job(body: &[u8], job: u64) -> bool {
    serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["workflow_job"]["id"] == job)
}

/// Posts a `workflow_job` signed with the wrong secret to the relay; its GUID.
async fn forge(relay: &Relay, ingest_url: &str) -> String {
    let guid = format!("forged-{}", relay.addr.replace([':', '.'], "-"));
    let body = rm_e2e::delivery("workflow_job.queued.5", Some(999_999)).body;
    let builder = http::Request::post(ingest_url)
        .header("content-type", "application/json")
        .header("x-github-event", "workflow_job")
        .header("x-github-delivery", &guid)
        .header(
            "x-hub-signature-256",
            rm_receiver::sign(b"not-the-secret", &body),
        );
    assert_eq!(request(builder, body).await, Some(202));
    guid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reconnects_when_the_relay_comes_back() {
    let NatHost {
        relay_dir,
        relay,
        urls: _,
        token,
        fleet,
    } = NatHost::start().await;
    let _agent = fleet
        .start_agent(&[("RM_RELAY_TOKEN", token.as_str())])
        .await;
    // Null until the agent has opened its journal and published its status.
    let status = || {
        serde_json::from_slice::<serde_json::Value>(&fleet.setup.run(&["status", "--json"]).stdout)
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(20), "the subscription open", || {
        status()["webhooks"]["relay"]["connected"] == true
    })
    .await;

    // The relay dies (SIGKILL) and the agent notices and says why.
    let addr = relay.addr.clone();
    drop(relay);
    wait_until(Duration::from_secs(20), "the outage shown", || {
        let status = status();
        status["webhooks"]["relay"]["connected"] == false
            && status["degraded"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| {
                    d.as_str()
                        .unwrap()
                        .starts_with("The relay subscription is down")
                })
    })
    .await;

    // Back on the same address: the agent reconnects and jobs flow again through the relay.
    let relay = Relay::start_at(relay_dir.path(), addr);
    relay.wait_healthy().await;
    wait_until(Duration::from_secs(30), "the subscription reopened", || {
        status()["webhooks"]["relay"]["connected"] == true
    })
    .await;
    let job = fleet.fake.queue_job(REPO, "after", LABELS).unwrap();
    wait_until(Duration::from_secs(40), "the job completed", || {
        fleet.completed(job)
    })
    .await;
    let jobs = json_stdout(&fleet.setup.run(&["jobs", "--json"]));
    let source = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == job)
        .map(|j| j["source"].clone());
    assert_eq!(source, Some(serde_json::json!("relay")));
}
