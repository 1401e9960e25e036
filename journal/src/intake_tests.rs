//! The intake's tests, each run against both journals (CONTRACT §9): the SQLite file in a
//! temporary directory and a database of its own on the test binary's PostgreSQL server
//! (`tests/support/postgres.rs`). Duplicates, out-of-order and stale deliveries, ignored,
//! rejected and refused bodies, replays, and the demand's snapshot: what `record` answers and
//! what it leaves in the job rows must be the same whichever journal is behind the receiver.
//!
//! `intake_test!` instantiates each generic test once per journal (`sqlite::name`,
//! `postgres::name`). Where PostgreSQL cannot run here the PostgreSQL tests fail, unless
//! `RM_TEST_ALLOW_SKIP` names `postgres`.

use std::path::PathBuf;
use std::sync::Mutex;

use rm_vocab::{Source, UnixMs};
use serde_json::{Value, json};

use crate::pg_server::{self, PgDatabase};
use crate::*;
use rm_vocab::JobId;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");

/// A reader of the demand that a thread owns ([`Backend::demand_reader`]).
pub(crate) type DemandRead = Box<dyn FnMut(&[&str]) -> DemandView + Send>;

/// A journal under test, with the reads the tests check its rows by.
pub(crate) trait Backend {
    async fn record(&self, incoming: Incoming) -> Result<Recorded, JournalError>;
    fn job(&self, job_id: i64) -> Option<JobRow>;
    fn delivery(&self, guid: &str) -> Option<StoredDelivery>;
    fn delivery_count(&self) -> i64;
    fn job_counts(&self) -> Vec<(String, i64)>;
    fn installations(&self) -> Vec<InstallationRow>;
    /// A reader of its own, for a thread: `demand` as the agent's allocation reads it.
    fn demand_reader(&self) -> DemandRead;
    /// `rm-agent deliveries replay GUID` at `now_ms`.
    fn replay(&self, guid: &str, now_ms: i64) -> Result<(Outcome, Option<String>), JournalError>;
    /// Runs `statements` (SQL both dialects read alike) as an older rm's writes.
    fn run_sql(&self, statements: &str);
}

/// The SQLite journal on a file of its own.
pub(crate) struct Sqlite {
    pub(crate) journal: Journal,
    pub(crate) path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sqlite {
    pub(crate) fn new() -> Sqlite {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let journal = Journal::open(&path, keep_all()).unwrap();
        Sqlite {
            journal,
            path,
            _dir: dir,
        }
    }

    fn reader(&self) -> Reader {
        Reader::open(&self.path).unwrap()
    }
}

impl Backend for Sqlite {
    async fn record(&self, incoming: Incoming) -> Result<Recorded, JournalError> {
        Intake::record_judged(&self.journal, Judged::of(incoming)?).await
    }
    fn job(&self, job_id: i64) -> Option<JobRow> {
        self.reader().job(JobId::new(job_id)).unwrap()
    }
    fn delivery(&self, guid: &str) -> Option<StoredDelivery> {
        self.reader().delivery(guid).unwrap()
    }
    fn delivery_count(&self) -> i64 {
        self.reader().delivery_count().unwrap()
    }
    fn job_counts(&self) -> Vec<(String, i64)> {
        self.reader().job_counts().unwrap()
    }
    fn installations(&self) -> Vec<InstallationRow> {
        self.reader().installations().unwrap()
    }
    fn demand_reader(&self) -> DemandRead {
        let reader = self.reader();
        Box::new(move |names| reader.demand(names).unwrap())
    }
    fn replay(&self, guid: &str, now_ms: i64) -> Result<(Outcome, Option<String>), JournalError> {
        crate::replay(&self.path, guid, UnixMs::new(now_ms))
    }
    fn run_sql(&self, statements: &str) {
        rusqlite::Connection::open(&self.path)
            .unwrap()
            .execute_batch(statements)
            .unwrap();
    }
}

/// The PostgreSQL journal on a database of its own.
pub(crate) struct Postgres {
    pub(crate) journal: PgJournal,
    /// Always `Some` until dropped (off the runtime: a sync client's drop blocks).
    reader: Option<Mutex<PgReader>>,
    // Dropped last: the database goes once the journal's connections are closed.
    pub(crate) db: PgDatabase,
}

impl Postgres {
    /// A fresh database for `test`, or `None` when PostgreSQL cannot run here and the skip
    /// policy allows it (otherwise the test fails, saying why).
    pub(crate) fn new(test: &str) -> Option<Postgres> {
        let server = match pg_server::shared() {
            Ok(server) => server,
            Err(why) => {
                crate::skip::cannot_run(test, "postgres", &why);
                return None;
            }
        };
        let db = server.database(test).unwrap();
        let url = db.url();
        let (journal, reader) = off_runtime(|| {
            (
                PgJournal::connect(&url).unwrap(),
                PgReader::connect(&url).unwrap(),
            )
        });
        Some(Postgres {
            journal,
            reader: Some(Mutex::new(reader)),
            db,
        })
    }

    fn read<T: Send>(&self, f: impl FnOnce(&mut PgReader) -> T + Send) -> T {
        let mut guard = self.reader.as_ref().unwrap().lock().unwrap();
        let reader: &mut PgReader = &mut guard;
        off_runtime(|| f(reader))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let reader = self.reader.take();
        off_runtime(move || drop(reader));
    }
}

/// Runs blocking PostgreSQL client calls on a thread of their own: the sync client starts a
/// runtime, which cannot run inside the test's.
pub(crate) fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(f).join().unwrap())
}

impl Backend for Postgres {
    async fn record(&self, incoming: Incoming) -> Result<Recorded, JournalError> {
        Intake::record_judged(&self.journal, Judged::of(incoming)?).await
    }
    fn job(&self, job_id: i64) -> Option<JobRow> {
        self.read(|r| r.job(JobId::new(job_id)).unwrap())
    }
    fn delivery(&self, guid: &str) -> Option<StoredDelivery> {
        self.read(|r| r.delivery(guid).unwrap())
    }
    fn delivery_count(&self) -> i64 {
        self.read(|r| r.delivery_count().unwrap())
    }
    fn job_counts(&self) -> Vec<(String, i64)> {
        self.read(|r| r.job_counts().unwrap())
    }
    fn installations(&self) -> Vec<InstallationRow> {
        self.read(|r| r.installations().unwrap())
    }
    fn demand_reader(&self) -> DemandRead {
        // Connected on the reading thread: the sync client cannot start on the test's runtime.
        let url = self.db.url();
        let mut reader: Option<PgReader> = None;
        Box::new(move |names| {
            reader
                .get_or_insert_with(|| PgReader::connect(&url).unwrap())
                .demand(names)
                .unwrap()
        })
    }
    fn replay(&self, guid: &str, now_ms: i64) -> Result<(Outcome, Option<String>), JournalError> {
        let target = PgTarget::parse(&self.db.url()).unwrap();
        off_runtime(|| replay_pg(&target, guid, UnixMs::new(now_ms)))
    }
    fn run_sql(&self, statements: &str) {
        let url = self.db.url();
        off_runtime(|| {
            ::postgres::Client::connect(&url, ::postgres::NoTls)
                .unwrap()
                .batch_execute(statements)
                .unwrap();
        });
    }
}

/// Instantiates each generic test `name<B: Backend>(backend: B)` as `sqlite::name` and
/// `postgres::name`.
macro_rules! intake_test {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Sqlite::new()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(backend) = super::Postgres::new(stringify!($name)) {
                        super::$name(backend).await;
                    }
                }
            )*
        }
    };
}

intake_test!(
    a_new_delivery_is_applied_and_its_guid_is_answered_once,
    an_old_body_under_fresh_guids_is_stale_and_never_demand,
    a_queued_after_completed_never_revives_the_job,
    a_job_never_moves_backwards,
    waiting_then_queued_moves_forward_and_a_queued_sighting_names_no_runner,
    unknown_events_are_ignored_and_unreadable_ones_rejected_with_their_body,
    a_body_that_is_not_json_is_refused_and_nothing_is_written,
    a_burst_with_redelivered_guids_applies_each_guid_once,
    installations_keep_their_repository_scope,
    the_demand_never_sees_a_job_both_queued_and_naming_its_runner,
    replay_applies_a_delivery_that_an_older_rm_rejected,
);

/// Retention that keeps everything: these tests use timestamps near the epoch.
pub(crate) fn keep_all() -> Retention {
    let forever = std::time::Duration::from_secs(u64::MAX / 1000);
    Retention {
        delivery_bodies: forever,
        delivery_rows: forever,
        finished_jobs: forever,
    }
}

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A `workflow_job` delivery for `job_id` in `action`, built from GitHub's example payload.
pub(crate) fn job_delivery(guid: &str, job_id: i64, action: &str, at_ms: i64) -> Incoming {
    let mut body = fixture(&format!(
        "workflow_job.{}",
        match action {
            "queued" => "queued.6",
            "waiting" => "waiting.7",
            "in_progress" => "in_progress.4",
            _ => "completed.1",
        }
    ));
    body["action"] = json!(action);
    body["workflow_job"]["id"] = json!(job_id);
    body["installation"] = json!({"id": 7});
    incoming(
        guid,
        "workflow_job",
        serde_json::to_vec(&body).unwrap(),
        at_ms,
    )
}

fn incoming(guid: &str, event: &str, body: Vec<u8>, at_ms: i64) -> Incoming {
    Incoming {
        guid: guid.to_owned(),
        event: event.to_owned(),
        headers: vec![("x-github-event".to_owned(), event.to_owned())],
        body,
        received_at_ms: UnixMs::new(at_ms),
        source: Source::Webhook,
    }
}

async fn a_new_delivery_is_applied_and_its_guid_is_answered_once<B: Backend>(b: B) {
    let first = b
        .record(job_delivery("g-1", 11, "queued", 1_000))
        .await
        .unwrap();
    assert_eq!(first, Recorded::New(Outcome::Applied));
    let again = b
        .record(job_delivery("g-1", 11, "queued", 2_000))
        .await
        .unwrap();
    assert_eq!(again, Recorded::AlreadyJournalled);

    assert_eq!(b.delivery_count(), 1);
    let job = b.job(11).unwrap();
    assert_eq!(job.state, rm_vocab::JobState::Queued);
    assert_eq!(job.labels, vec!["self-hosted", "k8s"]);
    assert_eq!(job.repository, "lineville/elastic-machines-testing");
    assert_eq!(job.installation_id, Some(7));
    assert_eq!(job.source, "webhook");
    assert_eq!(
        (job.first_seen_at_ms.get(), job.updated_at_ms.get()),
        (1_000, 1_000)
    );
    let stored = b.delivery("g-1").unwrap();
    assert_eq!(stored.row.outcome, Outcome::Applied);
    assert_eq!(stored.row.action.as_deref(), Some("queued"));
    assert_eq!(stored.row.received_at_ms.get(), 1_000);
    assert_eq!(
        stored.headers,
        vec![("x-github-event".to_owned(), "workflow_job".to_owned())]
    );
    assert_eq!(
        stored.body.unwrap(),
        job_delivery("g-1", 11, "queued", 1_000).body
    );
}

/// GitHub signs the body, not the GUID: an old `queued` body posted again under a fresh GUID is
/// journalled as `stale` and is never demand, however often it comes.
async fn an_old_body_under_fresh_guids_is_stale_and_never_demand<B: Backend>(b: B) {
    // The example was queued at 2023-04-19T21:12:12Z; these copies arrive two days later.
    let two_days_later = 1_681_938_732_000 + 2 * rm_handlers::QUEUE_LIFETIME_MS;
    for n in 0..3 {
        let replay = job_delivery(&format!("fresh-guid-{n}"), 77, "queued", two_days_later + n);
        assert_eq!(
            b.record(replay).await.unwrap(),
            Recorded::New(Outcome::Stale)
        );
    }
    assert!(b.job(77).is_none(), "a stale body made a job");
    assert!(b.job_counts().is_empty());
    let stored = b.delivery("fresh-guid-0").unwrap();
    assert_eq!(stored.row.outcome, Outcome::Stale);
    assert_eq!(stored.row.action.as_deref(), Some("queued"));
    assert!(
        stored.row.reason.as_deref().unwrap_or("").contains("24 h"),
        "{:?}",
        stored.row.reason
    );
}

/// A `queued` for a job the journal holds as completed (a replay within the day, under a new
/// GUID) never revives it as demand.
async fn a_queued_after_completed_never_revives_the_job<B: Backend>(b: B) {
    for (guid, action, at) in [
        ("q", "queued", 10),
        ("s", "in_progress", 20),
        ("c", "completed", 30),
    ] {
        b.record(job_delivery(guid, 9, action, at)).await.unwrap();
    }
    let again = b
        .record(job_delivery("q-again", 9, "queued", 40))
        .await
        .unwrap();
    assert_eq!(again, Recorded::New(Outcome::Duplicate));
    assert_eq!(b.job(9).unwrap().state, rm_vocab::JobState::Completed);
    assert_eq!(b.job_counts(), vec![("completed".to_owned(), 1)]);
}

async fn a_job_never_moves_backwards<B: Backend>(b: B) {
    // `in_progress` before its `queued`.
    let started = b
        .record(job_delivery("a", 5, "in_progress", 10))
        .await
        .unwrap();
    assert_eq!(started, Recorded::New(Outcome::Applied));
    let late_queue = b.record(job_delivery("b", 5, "queued", 20)).await.unwrap();
    assert_eq!(late_queue, Recorded::New(Outcome::Duplicate));
    let job = b.job(5).unwrap();
    assert_eq!(job.state, rm_vocab::JobState::InProgress);
    assert_eq!(job.runner_name.as_deref(), Some("GitHub Actions 6"));
    assert_eq!(job.updated_at_ms.get(), 10);

    b.record(job_delivery("c", 5, "completed", 30))
        .await
        .unwrap();
    // A re-sent old `completed` (new GUID) and an old `in_progress` change nothing.
    let resent = b
        .record(job_delivery("d", 5, "completed", 40))
        .await
        .unwrap();
    assert_eq!(resent, Recorded::New(Outcome::Duplicate));
    let old = b
        .record(job_delivery("e", 5, "in_progress", 50))
        .await
        .unwrap();
    assert_eq!(old, Recorded::New(Outcome::Duplicate));
    let job = b.job(5).unwrap();
    assert_eq!(job.state, rm_vocab::JobState::Completed);
    assert_eq!(job.conclusion.as_deref(), Some("failure"));
    assert_eq!(job.updated_at_ms.get(), 30);
    let reason = b.delivery("e").unwrap().row.reason;
    assert!(reason.unwrap().contains("already completed"));
}

async fn waiting_then_queued_moves_forward_and_a_queued_sighting_names_no_runner<B: Backend>(b: B) {
    b.record(job_delivery("w", 9, "waiting", 1)).await.unwrap();
    assert_eq!(b.job(9).unwrap().state, rm_vocab::JobState::Waiting);
    b.record(job_delivery("q", 9, "queued", 2)).await.unwrap();
    let job = b.job(9).unwrap();
    assert_eq!(job.state, rm_vocab::JobState::Queued);
    assert_eq!(job.runner_name, None);
}

async fn unknown_events_are_ignored_and_unreadable_ones_rejected_with_their_body<B: Backend>(b: B) {
    let run = serde_json::to_vec(&fixture("workflow_run.completed.0")).unwrap();
    assert_eq!(
        b.record(incoming("r", "workflow_run", run, 1))
            .await
            .unwrap(),
        Recorded::New(Outcome::Ignored)
    );
    let bad = br#"{"action":"queued","workflow_job":{"id":"not a number"}}"#.to_vec();
    assert_eq!(
        b.record(incoming("x", "workflow_job", bad.clone(), 2))
            .await
            .unwrap(),
        Recorded::New(Outcome::Rejected)
    );
    let stored = b.delivery("x").unwrap();
    assert_eq!(stored.body.as_deref(), Some(bad.as_slice()));
    assert!(stored.row.reason.unwrap().contains("unreadable payload"));
    assert!(b.job_counts().is_empty());
}

/// A body that is not JSON at all is refused before the writer: nothing is journalled, so the
/// receiver answers 400 and GitHub shows the failure.
async fn a_body_that_is_not_json_is_refused_and_nothing_is_written<B: Backend>(b: B) {
    let refused = b
        .record(incoming("nj", "workflow_job", b"not json {".to_vec(), 1))
        .await;
    assert!(matches!(refused, Err(JournalError::NotJson)), "{refused:?}");
    assert!(b.delivery("nj").is_none());
    assert_eq!(b.delivery_count(), 0);
}

/// Many deliveries at once, each GUID sent twice (GitHub's redelivery racing its original):
/// every GUID is answered `New` exactly once and makes exactly one delivery row and one job.
async fn a_burst_with_redelivered_guids_applies_each_guid_once<B: Backend>(b: B) {
    const N: i64 = 200;
    let sends = (0..N).flat_map(|i| {
        [
            job_delivery(&format!("burst-{i}"), 500 + i, "queued", i),
            job_delivery(&format!("burst-{i}"), 500 + i, "queued", i + 1),
        ]
    });
    let answers = futures_join_all(sends.map(|incoming| b.record(incoming))).await;
    let new = answers
        .iter()
        .filter(|a| matches!(a, Ok(Recorded::New(Outcome::Applied))))
        .count();
    let again = answers
        .iter()
        .filter(|a| matches!(a, Ok(Recorded::AlreadyJournalled)))
        .count();
    assert_eq!((new, again), (N as usize, N as usize), "{answers:?}");
    assert_eq!(b.delivery_count(), N);
    assert_eq!(b.job_counts(), vec![("queued".to_owned(), N)]);
}

/// Polls every future to completion on this task (no spawn: the backend is borrowed).
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (slot, future) in done.iter_mut().zip(pending.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(out) => *slot = Some(out),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|out| out.expect("polled to completion"))
        .collect()
}

async fn installations_keep_their_repository_scope<B: Backend>(b: B) {
    let body = |name: &str| serde_json::to_vec(&fixture(name)).unwrap();
    b.record(incoming(
        "i1",
        "installation",
        body("installation.created.1"),
        1,
    ))
    .await
    .unwrap();
    let mut added = fixture("installation_repositories.added.0");
    let id = fixture("installation.created.1")["installation"]["id"].clone();
    added["installation"]["id"] = id.clone();
    b.record(incoming(
        "i2",
        "installation_repositories",
        serde_json::to_vec(&added).unwrap(),
        2,
    ))
    .await
    .unwrap();
    let installations = b.installations();
    let installation = installations.iter().find(|i| json!(i.id) == id).unwrap();
    assert_eq!(installation.account.as_deref(), Some("Codertocat"));
    assert!(!installation.removed);
    assert!(
        installation
            .repositories
            .contains(&"Codertocat/Hello-World".to_owned())
    );
    assert!(
        installation
            .repositories
            .contains(&"Codertocat/Space".to_owned())
    );

    let mut deleted = fixture("installation.deleted.0");
    deleted["installation"]["id"] = id.clone();
    b.record(incoming(
        "i3",
        "installation",
        serde_json::to_vec(&deleted).unwrap(),
        3,
    ))
    .await
    .unwrap();
    let installations = b.installations();
    let installation = installations.iter().find(|i| json!(i.id) == id).unwrap();
    assert!(installation.removed);
    assert!(installation.repositories.is_empty());
}

/// The agent counts a queued job as demand unless a runner it knows completed it: the queued
/// jobs and the jobs naming its runners must come from one snapshot. While every job moves
/// from `queued` to `in_progress` on its own runner, one commit each, a reader reading the
/// demand as fast as it can sees each job in exactly one of the two lists: never in both (two
/// reads apart saw it still queued, then already named: a surplus runner), never in neither.
async fn the_demand_never_sees_a_job_both_queued_and_naming_its_runner<B: Backend>(b: B) {
    const N: i64 = 150;
    let runner = |i: i64| format!("rm-h-{i:012}");
    for i in 0..N {
        b.record(job_delivery(&format!("q-{i}"), 900 + i, "queued", i))
            .await
            .unwrap();
    }
    let names: Vec<String> = (0..N).map(runner).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut demand = b.demand_reader();
    let reading = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let (mut views, mut torn) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let view = demand(&names);
                let queued: std::collections::BTreeSet<i64> =
                    view.queued.iter().map(|j| j.job_id.get()).collect();
                let naming: std::collections::BTreeSet<i64> =
                    view.naming.iter().map(|j| j.job_id.get()).collect();
                let both = queued.intersection(&naming).count();
                let seen = queued.union(&naming).count();
                if both > 0 || seen != N as usize {
                    torn.push((both, seen));
                }
                views += 1;
            }
            (views, torn)
        })
    };
    for i in 0..N {
        let mut started = job_delivery(&format!("p-{i}"), 900 + i, "in_progress", N + i);
        let mut body: Value = serde_json::from_slice(&started.body).unwrap();
        body["workflow_job"]["runner_name"] = json!(runner(i));
        started.body = serde_json::to_vec(&body).unwrap();
        b.record(started).await.unwrap();
        // Let the reader in between commits.
        tokio::task::yield_now().await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (views, torn) = reading.join().unwrap();
    assert!(views > 0);
    assert!(
        torn.is_empty(),
        "{} of {views} views torn (in both lists, seen at all): {:?}",
        torn.len(),
        &torn[..torn.len().min(10)]
    );
    assert_eq!(b.job_counts(), vec![("in_progress".to_owned(), N)]);
}

/// `deliveries replay` runs the handler again over the kept body and applies what it says now;
/// a second replay finds everything there, and an unknown GUID is an error of its own.
async fn replay_applies_a_delivery_that_an_older_rm_rejected<B: Backend>(b: B) {
    b.record(job_delivery("ok", 77, "queued", 5)).await.unwrap();
    // What an older rm, whose handler could not read this payload, would have left behind.
    b.run_sql(
        "DELETE FROM jobs;
         UPDATE deliveries SET outcome = 'rejected', reason = 'old handler' WHERE guid = 'ok';",
    );
    assert!(b.job(77).is_none());

    let (outcome, _) = b.replay("ok", 99).unwrap();
    assert_eq!(outcome, Outcome::Applied);
    let job = b.job(77).unwrap();
    assert_eq!(
        (job.state.as_str(), job.updated_at_ms.get()),
        ("queued", 99)
    );
    let row = b.delivery("ok").unwrap().row;
    assert_eq!(
        (row.outcome, row.reason, row.replayed_at_ms.map(|t| t.get())),
        (Outcome::Applied, None, Some(99))
    );
    // A second replay finds everything already there.
    assert_eq!(b.replay("ok", 100).unwrap().0, Outcome::Duplicate);
    assert!(matches!(
        b.replay("nope", 1),
        Err(JournalError::UnknownDelivery(_))
    ));
}
