//! Receivers on a fleet's PostgreSQL journal (CONTRACT §9), over real HTTP on loopback against a
//! real server (`tests/support/postgres.rs`): two receivers, each with its own `PgJournal`, on
//! one database. A delivery GUID is committed once whichever receiver gets it and however often;
//! while the database cannot be reached every delivery is answered 503 (never a 2xx for what is
//! not committed), and the receivers take deliveries again by themselves once it is back.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a failed step should fail the test loudly"
)]

#[path = "../../tests/support/postgres.rs"]
mod pg_server;
#[path = "../../tests/support/skip.rs"]
mod skip;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rm_journal::PgJournal;
use rm_receiver::{MAX_BODY_BYTES, Receiver, ReceiverConfig, WebhookSecrets, sign};
use secrecy::SecretString;

const SECRET: &str = "It's a Secret to Everybody";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");

/// Two receivers on one database.
struct Fleet {
    addrs: [SocketAddr; 2],
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
    client: Client<HttpConnector, Full<Bytes>>,
    // Dropped last: `dropdb --force` ends the journals' connections.
    db: pg_server::PgDatabase,
}

/// Runs `f` on a thread of its own: the sync PostgreSQL client runs a runtime of its own, which
/// cannot start inside the test's.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(f).join().unwrap())
}

impl Fleet {
    async fn start(test: &str) -> Option<Fleet> {
        let server = match pg_server::shared() {
            Ok(server) => server,
            Err(why) => {
                skip::cannot_run(test, "postgres", &why);
                return None;
            }
        };
        let db = server.database(test).unwrap();
        let url = db.url();
        let mut addrs = Vec::new();
        let mut stops = Vec::new();
        for _ in 0..2 {
            let journal = off_runtime(|| PgJournal::connect(&url).unwrap());
            let secrets = WebhookSecrets::new(vec![SecretString::from(SECRET)]).unwrap();
            let receiver = Receiver::new(
                ReceiverConfig {
                    path: "/webhook".to_owned(),
                    secrets,
                    max_body_bytes: MAX_BODY_BYTES,
                },
                journal,
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(listener.local_addr().unwrap());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(receiver.serve(listener, async move {
                let _ = stopped.await;
            }));
            stops.push(stop);
        }
        Some(Fleet {
            addrs: [addrs[0], addrs[1]],
            _stops: stops,
            client: Client::builder(TokioExecutor::new()).build_http(),
            db,
        })
    }

    /// Sends a signed `workflow_job` delivery with `guid` to receiver `which`; its status.
    async fn send(&self, which: usize, guid: &str, body: &[u8]) -> u16 {
        let req = http::Request::post(format!("http://{}/webhook", self.addrs[which]))
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/test")
            .header("x-github-event", "workflow_job")
            .header("x-github-delivery", guid)
            .header("x-hub-signature-256", sign(SECRET.as_bytes(), body))
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        let res = self.client.request(req).await.unwrap();
        let status = res.status().as_u16();
        let _ = res.into_body().collect().await;
        status
    }

    async fn health(&self, which: usize) -> u16 {
        let req = http::Request::get(format!("http://{}/healthz", self.addrs[which]))
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.client.request(req).await.unwrap().status().as_u16()
    }

    /// How many rows the database holds for each GUID.
    fn rows_by_guid(&self) -> BTreeMap<String, i64> {
        let url = self.db.url();
        off_runtime(move || {
            postgres::Client::connect(&url, postgres::NoTls)
                .unwrap()
                .query("SELECT guid, COUNT(*) FROM deliveries GROUP BY guid", &[])
                .unwrap()
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect()
        })
    }

    /// Makes the database refuse connections and ends the ones it has (`up = false`), or takes
    /// connections again (`up = true`): to the receivers, the database is down, then back. The
    /// server itself keeps running for the other tests of this binary.
    fn set_database_up(&self, up: bool) {
        let admin = pg_server::shared().unwrap().url("postgres");
        let name = self.db.name().to_owned();
        off_runtime(move || {
            let mut client = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
            client
                .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {up}"))
                .unwrap();
            if !up {
                client
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE datname = $1 AND pid <> pg_backend_pid()",
                        &[&name],
                    )
                    .unwrap();
            }
        });
    }
}

/// A real `workflow_job` delivery for job `job_id`, dated now (an old one would be `stale`).
fn body(action: &str, job_id: i64) -> Vec<u8> {
    let fixture = match action {
        "queued" => "workflow_job.queued.6",
        "in_progress" => "workflow_job.in_progress.4",
        _ => "workflow_job.completed.1",
    };
    let text = std::fs::read_to_string(format!("{FIXTURES}/{fixture}.json")).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["installation"] = serde_json::json!({"id": 99});
    value["workflow_job"]["id"] = serde_json::json!(job_id);
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    if let Some(job) = value["workflow_job"].as_object_mut() {
        for key in ["created_at", "started_at", "completed_at"] {
            if job.get(key).is_some_and(serde_json::Value::is_string) {
                job.insert(key.to_owned(), serde_json::json!(now));
            }
        }
    }
    serde_json::to_vec(&value).unwrap()
}

/// A burst of real signed deliveries sent to both receivers at once, every GUID to each of them
/// and some twice more: each GUID is answered 202 exactly once fleet-wide (the rest 200,
/// "already journalled"), and the database holds each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_on_one_database_commit_each_guid_once() {
    let Some(fleet) = Fleet::start("two_receivers_on_one_database").await else {
        return;
    };
    let fleet = Arc::new(fleet);
    let mut sends = tokio::task::JoinSet::new();
    let mut guids = BTreeSet::new();
    for n in 0..60_i64 {
        let guid = uuid::Uuid::new_v4().to_string();
        guids.insert(guid.clone());
        let action = ["queued", "in_progress", "completed"][(n % 3) as usize];
        let body = Arc::new(body(action, 1000 + n / 3));
        let copies = if n % 4 == 0 { 4 } else { 2 };
        for copy in 0..copies {
            let (fleet, guid, body) = (Arc::clone(&fleet), guid.clone(), Arc::clone(&body));
            sends.spawn(async move {
                let status = fleet.send(copy % 2, &guid, &body).await;
                (guid, status)
            });
        }
    }
    let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
    while let Some(sent) = sends.join_next().await {
        let (guid, status) = sent.unwrap();
        assert!(status == 202 || status == 200, "{guid}: {status}");
        *accepted.entry(guid).or_default() += usize::from(status == 202);
    }
    for guid in &guids {
        assert_eq!(accepted.get(guid), Some(&1), "{guid} was not accepted once");
    }
    let rows = fleet.rows_by_guid();
    assert_eq!(rows.keys().cloned().collect::<BTreeSet<_>>(), guids);
    assert!(rows.values().all(|&count| count == 1), "{rows:?}");
}

/// How many answers so far `pred` holds for.
fn count(answers: &Mutex<Vec<Answer>>, pred: impl Fn(&Answer) -> bool) -> usize {
    answers.lock().unwrap().iter().filter(|a| pred(a)).count()
}

/// Waits (up to 30 s, else fails) until `pred` holds.
async fn wait_for(what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One answer: the GUID, its body, and what the receiver said when.
type Answer = (String, Arc<Vec<u8>>, u16, Instant);

/// Deliveries keep coming to both receivers while the database goes away and comes back: every
/// GUID answered 2xx is committed (exactly once), deliveries meanwhile are answered 503 and
/// `/healthz` says 503, and both receivers answer 2xx again once the database is back, with no
/// restart. The GUIDs refused meanwhile, redelivered afterwards, are committed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_database_is_down_deliveries_get_503_never_a_2xx_and_then_2xx_again() {
    let Some(fleet) = Fleet::start("while_the_database_is_down").await else {
        return;
    };
    let fleet = Arc::new(fleet);
    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    for sender in 0..4_i64 {
        let (fleet, answers, stop) = (Arc::clone(&fleet), Arc::clone(&answers), Arc::clone(&stop));
        senders.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let guid = uuid::Uuid::new_v4().to_string();
                let body = Arc::new(body("queued", sender * 100_000 + n));
                let status = fleet.send((n % 2) as usize, &guid, &body).await;
                answers
                    .lock()
                    .unwrap()
                    .push((guid, body, status, Instant::now()));
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    wait_for("2xx before the outage", || {
        count(&answers, |a| a.2 == 202) >= 20
    })
    .await;
    let down_at = Instant::now();
    fleet.set_database_up(false);
    wait_for("503s during the outage", || {
        count(&answers, |a| a.2 == 503 && a.3 > down_at) >= 10
    })
    .await;
    assert_eq!(fleet.health(0).await, 503);
    assert_eq!(fleet.health(1).await, 503);
    let up_at = Instant::now();
    fleet.set_database_up(true);
    // Both receivers take deliveries again by themselves: each answers 202 after the return.
    wait_for("2xx again after the outage", || {
        count(&answers, |a| a.2 == 202 && a.3 > up_at) >= 20
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.await.unwrap();
    }
    assert_eq!(fleet.health(0).await, 200);
    assert_eq!(fleet.health(1).await, 200);

    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let statuses: BTreeSet<u16> = answers.iter().map(|a| a.2).collect();
    assert!(
        statuses.iter().all(|s| [200, 202, 503].contains(s)),
        "{statuses:?}"
    );
    let rows = fleet.rows_by_guid();
    for (guid, _, status, _) in &answers {
        // A 200 can only be a commit whose answer was lost and found again by its GUID.
        if *status == 202 || *status == 200 {
            assert_eq!(
                rows.get(guid),
                Some(&1),
                "{guid} answered {status} but not committed"
            );
        }
    }
    // GitHub's redelivery (the agent's, after a failed delivery) brings the refused ones in.
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.2 == 503).collect();
    assert!(!refused.is_empty());
    for (n, (guid, body, _, _)) in refused.iter().enumerate() {
        let status = fleet.send(n % 2, guid, body).await;
        assert!(status == 202 || status == 200, "{guid}: {status}");
    }
    let rows = fleet.rows_by_guid();
    assert_eq!(rows.len(), answers.len());
    assert!(rows.values().all(|&count| count == 1));
}
