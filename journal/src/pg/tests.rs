//! Tests of what only the PostgreSQL journal has: its schema against SQLite's, migration by
//! several receivers at once, two writers racing on the same GUIDs, and group commit answered
//! only after COMMIT. The intake tests both journals share are in `crate::intake_tests`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use postgres::{Client, NoTls};

use crate::intake_tests::{Postgres, job_delivery, off_runtime};
use crate::{Outcome, PgJournal, PgReader, Recorded, SCHEMA_VERSION};

/// A client for a plain (not async) test.
fn client(url: &str) -> Client {
    Client::connect(url, NoTls).unwrap()
}

/// Every table and column of SQLite's schema (as its migrations leave it) exists in the
/// PostgreSQL schema, and nothing else: the two dialects hold the same rows.
#[test]
fn the_schema_has_every_table_and_column_of_sqlite_s() {
    let Some(pg) = Postgres::new("the_schema_has_every_table_and_column_of_sqlite_s") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(crate::JOURNAL_FILE);
    let mut conn = crate::connection::open_writer(&path).unwrap();
    crate::schema::migrate(&mut conn, &path).unwrap();
    let mut sqlite: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut tables = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap();
    for table in tables.query_map([], |row| row.get::<_, String>(0)).unwrap() {
        let table = table.unwrap();
        let mut columns = conn
            .prepare("SELECT name FROM pragma_table_info(?1)")
            .unwrap();
        let names = columns
            .query_map([&table], |row| row.get::<_, String>(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        sqlite.insert(table, names);
    }
    let url = pg.db.url();
    let postgres: BTreeMap<String, BTreeSet<String>> = off_runtime(|| {
        let mut client = Client::connect(&url, NoTls).unwrap();
        let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for row in client
            .query(
                "SELECT table_name::text, column_name::text FROM information_schema.columns
                 WHERE table_schema = 'public' AND table_name != 'rm_schema_version'",
                &[],
            )
            .unwrap()
        {
            found.entry(row.get(0)).or_default().insert(row.get(1));
        }
        found
    });
    assert!(sqlite.contains_key("jobs") && sqlite.contains_key("attempts"));
    assert_eq!(postgres, sqlite);
}

/// Receivers that start together migrate once, to SQLite's version; a later start changes
/// nothing.
#[test]
fn receivers_starting_together_migrate_once_to_sqlite_s_version() {
    let Some(pg) = Postgres::new("receivers_starting_together_migrate_once") else {
        return;
    };
    // `Postgres::new` migrated an empty database already; a fresh one shows the race.
    let db = crate::pg_server::shared()
        .unwrap()
        .database("migrate_race")
        .unwrap();
    let url = db.url();
    let journals: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| PgJournal::connect(&url)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for journal in &journals {
        assert!(journal.is_ok(), "{:?}", journal.as_ref().err());
    }
    let version: i64 = client(&url)
        .query_one("SELECT version FROM rm_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    drop(journals);
    drop(pg);
}

/// Two receivers, each with its own writer and connection, record the same GUIDs at once (a
/// delivery and its redelivery landing on different receivers): each GUID is answered `New` by
/// exactly one of them and makes one delivery row; two sightings of one job racing on the two
/// writers merge forward (the later state wins whichever commits first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_racing_on_the_same_guids_apply_each_once() {
    let Some(pg) = Postgres::new("two_writers_racing_on_the_same_guids_apply_each_once") else {
        return;
    };
    let url = pg.db.url();
    let second = off_runtime(|| PgJournal::connect(&url).unwrap());
    const N: i64 = 200;
    // Each job has a `queued` and an `in_progress` delivery. Every `queued` is sent to both
    // writers (a redelivery racing its original on another receiver); the `in_progress` goes to
    // the second writer only, so it races the first writer's `queued` of the same job.
    let guids: Vec<(String, i64, &str)> = (0..N)
        .flat_map(|i| {
            [
                // (A writer takes its group's GUIDs in order: the second takes the job's
                // `in_progress` before its `queued`, while the first inserts the job.)
                (format!("race-{i:03}-2-queued"), 9000 + i, "queued"),
                (format!("race-{i:03}-1-started"), 9000 + i, "in_progress"),
            ]
        })
        .collect();
    // Both writers queue their whole share behind a lock, and start together when it goes.
    let held = Held::deliveries(&url);
    let mut tasks = Vec::new();
    for (n, journal) in [pg.journal.clone(), second.clone()].into_iter().enumerate() {
        for (k, (guid, job, action)) in guids.iter().cloned().enumerate() {
            if n == 0 && action == "in_progress" {
                continue;
            }
            let journal = journal.clone();
            tasks.push(tokio::spawn(async move {
                (k, journal.record(job_delivery(&guid, job, action, 1)).await)
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release();
    let mut new_per_guid = vec![0; guids.len()];
    for task in tasks {
        let (k, answer) = task.await.unwrap();
        match answer.unwrap() {
            // A `queued` merged after its job's `in_progress` changes nothing: a duplicate.
            Recorded::New(Outcome::Applied | Outcome::Duplicate) => new_per_guid[k] += 1,
            Recorded::AlreadyJournalled => {}
            other => panic!("{}: {other:?}", guids[k].0),
        }
    }
    assert!(
        new_per_guid.iter().all(|&n| n == 1),
        "GUIDs answered New other than once: {:?}",
        new_per_guid
            .iter()
            .enumerate()
            .filter(|(_, n)| **n != 1)
            .collect::<Vec<_>>()
    );
    let (deliveries, jobs) = off_runtime(|| {
        let mut reader = PgReader::connect(&url).unwrap();
        (
            reader.delivery_count().unwrap(),
            reader.job_counts().unwrap(),
        )
    });
    assert_eq!(deliveries, 2 * N);
    // Forward only, whichever writer's sighting came first: every job is in progress.
    assert_eq!(jobs, vec![("in_progress".to_owned(), N)]);
}

/// While another session holds the deliveries table, a burst queues behind it: nobody is
/// answered before the COMMIT that holds their delivery, and the burst commits in groups, not
/// one transaction per delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_committed_in_groups_and_answered_only_after_commit() {
    let Some(pg) = Postgres::new("a_burst_is_committed_in_groups") else {
        return;
    };
    let url = pg.db.url();
    let held = Held::deliveries(&url);
    const N: i64 = 300;
    let mut tasks = Vec::new();
    for i in 0..N {
        let journal = pg.journal.clone();
        tasks.push(tokio::spawn(async move {
            journal
                .record(job_delivery(&format!("group-{i}"), 100 + i, "queued", i))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        tasks.iter().all(|t| !t.is_finished()),
        "a delivery was answered while its commit could not have happened"
    );
    assert_eq!(pg.delivery_count_now(), 0);
    held.release();
    for task in tasks {
        assert_eq!(
            task.await.unwrap().unwrap(),
            Recorded::New(Outcome::Applied)
        );
    }
    assert_eq!(pg.delivery_count_now(), N);
    let commits = pg.journal.metrics().commits();
    assert!(
        commits < N as u64 / 2,
        "{commits} commits for {N} deliveries queued behind one lock: no grouping"
    );
}

impl Postgres {
    fn delivery_count_now(&self) -> i64 {
        let url = self.db.url();
        off_runtime(|| PgReader::connect(&url).unwrap().delivery_count().unwrap())
    }
}

/// Another session holding the deliveries table (no writer can insert) until released.
struct Held {
    release: std::sync::mpsc::Sender<()>,
    session: std::thread::JoinHandle<()>,
}

impl Held {
    fn deliveries(url: &str) -> Held {
        let url = url.to_owned();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (locked, is_locked) = std::sync::mpsc::channel::<()>();
        let session = std::thread::spawn(move || {
            let mut client = Client::connect(&url, NoTls).unwrap();
            let mut tx = client.transaction().unwrap();
            tx.batch_execute("LOCK TABLE deliveries IN EXCLUSIVE MODE")
                .unwrap();
            locked.send(()).unwrap();
            released.recv().unwrap();
            tx.commit().unwrap();
        });
        is_locked.recv().unwrap();
        Held { release, session }
    }

    fn release(self) {
        self.release.send(()).unwrap();
        self.session.join().unwrap();
    }
}
