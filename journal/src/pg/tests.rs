//! Tests of what only the PostgreSQL journal has: its schema against SQLite's, migration by
//! several receivers at once, two writers racing on the same GUIDs, and group commit answered
//! only after COMMIT. The intake tests both journals share are in `crate::intake_tests`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use postgres::{Client, NoTls};

use crate::intake_tests::{Postgres, job_delivery, off_runtime};
use crate::{Outcome, PgJournal, PgReader, Recorded, SCHEMA_VERSION};
use rm_vocab::JobId;

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

/// A database from the rm before images (v12) migrates to v13: its attempts read no image
/// (they ran on the host's root), and the column takes an image id and nothing else, as
/// SQLite's does.
#[test]
fn attempts_from_before_images_migrate_to_no_image() {
    let Some(pg) = Postgres::new("attempts_from_before_images_migrate_to_no_image") else {
        return;
    };
    // `Postgres::new` migrated its database already; a fresh one is built to v12 by hand.
    let db = crate::pg_server::shared()
        .unwrap()
        .database("images_from_v12")
        .unwrap();
    let url = db.url();
    let mut client = client(&url);
    let mut tx = client.transaction().unwrap();
    for sql in &crate::pg::schema::MIGRATIONS[..12] {
        tx.batch_execute(sql).unwrap();
    }
    tx.batch_execute(
        "CREATE TABLE rm_schema_version (
             one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
             version BIGINT NOT NULL
         );
         INSERT INTO rm_schema_version (version) VALUES (12);
         INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
             state_changed_at, created_at, updated_at)
             VALUES ('0123456789abcdef0123456789abcdef', 'linux', 'rm-h-0123456789ab',
                 'ephemeral', '/r/0123456789ab', 'busy', 5, 1, 5);",
    )
    .unwrap();
    tx.commit().unwrap();

    drop(PgJournal::connect(&url).unwrap());
    let version: i64 = client
        .query_one("SELECT version FROM rm_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    let image: Option<String> = client
        .query_one("SELECT image FROM attempts", &[])
        .unwrap()
        .get(0);
    assert_eq!(image, None);
    let set = |client: &mut Client, text: &str| {
        client.execute("UPDATE attempts SET image = $1", &[&text])
    };
    let hex = "0123456789abcdef".repeat(4);
    for bad in [
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha256:{hex}0"),
        format!("sha512:{hex}"),
        hex.clone(),
    ] {
        assert!(set(&mut client, &bad).is_err(), "{bad:?}");
    }
    let good = format!("sha256:{hex}");
    set(&mut client, &good).unwrap();
    let image: Option<String> = client
        .query_one("SELECT image FROM attempts", &[])
        .unwrap()
        .get(0);
    assert_eq!(image, Some(good));
    drop(client);
    drop(db);
    drop(pg);
}

/// A database from the rm before shapes (v14) migrates to v15 in place: its attempts read no
/// shape and no usage, and the database itself keeps what SQLite's keeps: a shape whole, usage
/// tied to its time, one holder per device (a second holder's transaction fails, and the
/// attempt row written in it goes too), a freed device taken again, a hold gone with its
/// attempt.
#[test]
fn attempts_from_before_shapes_migrate_and_the_database_fences_devices() {
    let Some(pg) = Postgres::new("attempts_from_before_shapes_migrate") else {
        return;
    };
    let db = crate::pg_server::shared()
        .unwrap()
        .database("shapes_from_v14")
        .unwrap();
    let url = db.url();
    let mut client = client(&url);
    let mut tx = client.transaction().unwrap();
    for sql in &crate::pg::schema::MIGRATIONS[..14] {
        tx.batch_execute(sql).unwrap();
    }
    tx.batch_execute(
        "CREATE TABLE rm_schema_version (
             one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
             version BIGINT NOT NULL
         );
         INSERT INTO rm_schema_version (version) VALUES (14);
         INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
             state_changed_at, created_at, updated_at)
             VALUES ('0123456789abcdef0123456789abcdef', 'linux', 'rm-h-0123456789ab',
                 'ephemeral', '/r/0123456789ab', 'busy', 5, 1, 5);",
    )
    .unwrap();
    tx.commit().unwrap();

    drop(PgJournal::connect(&url).unwrap());
    let version: i64 = client
        .query_one("SELECT version FROM rm_schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    let row = client
        .query_one(
            "SELECT shape_labels IS NULL AND shape_cpu_millis IS NULL AND shape_devices IS NULL
                    AND usage_at IS NULL
             FROM attempts",
            &[],
        )
        .unwrap();
    assert!(row.get::<_, bool>(0));
    for bad in [
        "UPDATE attempts SET shape_memory = 1",
        "UPDATE attempts SET shape_labels = '[]', shape_devices = '[]', shape_cpu_millis = 1,
             shape_memory = 1, shape_disk = -1",
        "UPDATE attempts SET shape_labels = '{}', shape_devices = '[]', shape_cpu_millis = 1,
             shape_memory = 1, shape_disk = 1",
        "UPDATE attempts SET usage_cpu_usec = 1",
    ] {
        assert!(client.batch_execute(bad).is_err(), "{bad}");
    }
    client
        .batch_execute(
            "UPDATE attempts SET shape_labels = '[\"rm-gpu=1\"]',
                 shape_devices = '[\"/dev/nvidia0\"]', shape_cpu_millis = 1000,
                 shape_memory = 1, shape_disk = 1, usage_at = 9, usage_cpu_usec = 3;
             INSERT INTO device_holds (device, attempt_id, held_at)
                 VALUES ('/dev/nvidia0', '0123456789abcdef0123456789abcdef', 1);",
        )
        .unwrap();
    let second = "INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir,
             state, state_changed_at, created_at, updated_at)
             VALUES ('fedcba9876543210fedcba9876543210', 'linux', 'rm-h-fedcba987654',
                 'ephemeral', '/r/fedcba987654', 'allocated', 6, 6, 6);
         INSERT INTO device_holds (device, attempt_id, held_at)
             VALUES ('/dev/nvidia0', 'fedcba9876543210fedcba9876543210', 6);";
    let mut tx = client.transaction().unwrap();
    assert!(tx.batch_execute(second).is_err());
    drop(tx);
    let count =
        |client: &mut Client, sql: &str| -> i64 { client.query_one(sql, &[]).unwrap().get(0) };
    assert_eq!(count(&mut client, "SELECT count(*) FROM attempts"), 1);
    client
        .batch_execute(
            "DELETE FROM device_holds WHERE attempt_id = '0123456789abcdef0123456789abcdef'",
        )
        .unwrap();
    let mut tx = client.transaction().unwrap();
    tx.batch_execute(second).unwrap();
    tx.commit().unwrap();
    let holder: String = client
        .query_one("SELECT attempt_id FROM device_holds", &[])
        .unwrap()
        .get(0);
    assert_eq!(holder, "fedcba9876543210fedcba9876543210");
    client
        .batch_execute("DELETE FROM attempts WHERE attempt_id = 'fedcba9876543210fedcba9876543210'")
        .unwrap();
    assert_eq!(count(&mut client, "SELECT count(*) FROM device_holds"), 0);
    drop(client);
    drop(db);
    drop(pg);
}

/// Two receivers, each with its own writer and connection, racing. First, two sightings of
/// each job (`queued` on one, `in_progress` on the other, distinct GUIDs) inserted at the same
/// moment: they merge forward, every job ends in progress. Then the same GUIDs on both (a
/// delivery and its redelivery landing on different receivers): each GUID is answered `New` by
/// exactly one of them and makes one delivery row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_racing_on_the_same_guids_apply_each_once() {
    let Some(pg) = Postgres::new("two_writers_racing_on_the_same_guids_apply_each_once") else {
        return;
    };
    let url = pg.db.url();
    let writers = [
        pg.journal.clone(),
        off_runtime(|| PgJournal::connect(&url).unwrap()),
    ];
    const N: i64 = 200;
    let reader = || {
        let url = url.clone();
        off_runtime(move || {
            let mut reader = PgReader::connect(&url).unwrap();
            (
                reader.delivery_count().unwrap(),
                reader.job_counts().unwrap(),
            )
        })
    };

    let sightings: Vec<Send> = (0..N)
        .flat_map(|i| {
            [
                (0, format!("m-{i:03}-q"), 9000 + i, "queued"),
                (1, format!("m-{i:03}-s"), 9000 + i, "in_progress"),
            ]
        })
        .collect();
    let new = race(&url, &writers, &sightings).await;
    assert!(new.values().all(|&n| n == 1), "{new:?}");
    // Forward only, whichever writer's sighting came first: every job is in progress.
    assert_eq!(reader(), (2 * N, vec![("in_progress".to_owned(), N)]));

    // Every GUID to both writers, in opposite orders.
    let redelivered: Vec<Send> = (0..N)
        .map(|i| (0, format!("d-{i:03}"), 10_000 + i, "queued"))
        .chain(
            (0..N)
                .rev()
                .map(|i| (1, format!("d-{i:03}"), 10_000 + i, "queued")),
        )
        .collect();
    let new = race(&url, &writers, &redelivered).await;
    assert_eq!(new.len(), N as usize);
    assert!(
        new.values().all(|&n| n == 1),
        "GUIDs answered New other than once: {:?}",
        new.iter().filter(|(_, n)| **n != 1).collect::<Vec<_>>()
    );
    assert_eq!(
        reader(),
        (
            3 * N,
            vec![("in_progress".to_owned(), N), ("queued".to_owned(), N)]
        )
    );
}

/// A delivery to record: which writer, its GUID, its job, its action.
type Send = (usize, String, i64, &'static str);

/// Queues every send on its writer behind a held lock, so both writers start together when it
/// goes; returns how many times each GUID was answered `New`.
async fn race(url: &str, writers: &[PgJournal; 2], sends: &[Send]) -> BTreeMap<String, usize> {
    let held = Held::deliveries(url);
    let mut tasks = Vec::new();
    for (writer, guid, job, action) in sends.iter().cloned() {
        let journal = writers[writer].clone();
        tasks.push(tokio::spawn(async move {
            let answer = journal.record(job_delivery(&guid, job, action, 1)).await;
            (guid, answer)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release();
    let mut new = BTreeMap::new();
    for task in tasks {
        let (guid, answer) = task.await.unwrap();
        let count = new.entry(guid.clone()).or_insert(0);
        match answer.unwrap() {
            // A `queued` merged after its job's `in_progress` changes nothing: a duplicate.
            Recorded::New(Outcome::Applied | Outcome::Duplicate) => *count += 1,
            Recorded::AlreadyJournalled => {}
            other => panic!("{guid}: {other:?}"),
        }
    }
    new
}

/// While another session holds the deliveries table, a burst queues behind it: nobody is
/// answered while their delivery cannot be written, and the burst commits in groups, not one
/// transaction per delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_committed_in_groups() {
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

/// Another writer has inserted a job (`queued`) and not yet committed when this writer records
/// the job's `in_progress`: its insert waits, finds the row, and merges over it, so the job ends
/// in progress and the delivery is applied, not lost as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighting_whose_insert_loses_a_race_merges_over_the_winner() {
    let Some(pg) = Postgres::new("a_sighting_whose_insert_loses_a_race") else {
        return;
    };
    let url = pg.db.url();
    let (commit, committed) = std::sync::mpsc::channel::<()>();
    let (inserted, is_inserted) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let mut client = Client::connect(&url, NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        tx.batch_execute(
            "INSERT INTO jobs (job_id, run_id, run_attempt, repository, labels, state,
                 state_rank, source, first_seen_at, updated_at)
             VALUES (42, 1, 1, 'o/r', '[]', 'queued', 1, 'webhook', 1, 1)",
        )
        .unwrap();
        inserted.send(()).unwrap();
        committed.recv().unwrap();
        tx.commit().unwrap();
    });
    is_inserted.recv().unwrap();
    let journal = pg.journal.clone();
    let started = tokio::spawn(async move {
        journal
            .record(job_delivery("started", 42, "in_progress", 5))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    commit.send(()).unwrap();
    other.join().unwrap();
    assert_eq!(
        started.await.unwrap().unwrap(),
        Recorded::New(Outcome::Applied)
    );
    let url = pg.db.url();
    let job = off_runtime(|| {
        PgReader::connect(&url)
            .unwrap()
            .job(JobId::new(42))
            .unwrap()
            .unwrap()
    });
    assert_eq!(job.state, rm_vocab::JobState::InProgress);
}

/// A verdict PostgreSQL cannot store (a repository name with a NUL, which its text type
/// refuses) does not fail its group: that delivery is journalled as rejected with the reason,
/// its body kept for a replay, and the deliveries beside it in the same transaction are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_cannot_be_applied_is_rejected_and_its_group_still_commits() {
    let Some(pg) = Postgres::new("a_delivery_that_cannot_be_applied") else {
        return;
    };
    let url = pg.db.url();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/webhooks/installation_repositories.added.0.json"
    ))
    .unwrap();
    let mut body: serde_json::Value = serde_json::from_str(&text).unwrap();
    body["repositories_added"][0]["full_name"] = "Codertocat/Sp\u{0}ace".into();
    let bad = crate::Incoming {
        guid: "nul".to_owned(),
        event: "installation_repositories".to_owned(),
        headers: Vec::new(),
        body: serde_json::to_vec(&body).unwrap(),
        received_at_ms: rm_vocab::UnixMs::new(1),
        source: rm_vocab::Source::Webhook,
    };
    let held = Held::deliveries(&url);
    let tasks = [bad, job_delivery("fine", 3, "queued", 2)].map(|incoming| {
        let journal = pg.journal.clone();
        tokio::spawn(async move { journal.record(incoming).await })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release();
    let [bad, fine] = tasks;
    assert_eq!(
        bad.await.unwrap().unwrap(),
        Recorded::New(Outcome::Rejected)
    );
    assert_eq!(
        fine.await.unwrap().unwrap(),
        Recorded::New(Outcome::Applied)
    );
    let (stored, job) = off_runtime(|| {
        let mut reader = PgReader::connect(&url).unwrap();
        (
            reader.delivery("nul").unwrap().unwrap(),
            reader.job(JobId::new(3)).unwrap(),
        )
    });
    assert!(
        stored
            .row
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("could not apply this delivery: invalid byte sequence"),
        "{:?}",
        stored.row.reason
    );
    assert!(stored.body.is_some());
    assert_eq!(job.unwrap().state, rm_vocab::JobState::Queued);
}

/// The listings `rm-agent jobs` and `deliveries` read from the fleet's database: newest first,
/// at most the limit, as SQLite's reader gives them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_and_deliveries_are_listed_newest_first_up_to_the_limit() {
    let Some(pg) = Postgres::new("jobs_and_deliveries_are_listed") else {
        return;
    };
    for (guid, job, action, at) in [
        ("one", 1, "queued", 10),
        ("two", 2, "queued", 20),
        ("three", 1, "in_progress", 30),
    ] {
        assert_eq!(
            pg.journal
                .record(job_delivery(guid, job, action, at))
                .await
                .unwrap(),
            Recorded::New(Outcome::Applied)
        );
    }
    let url = pg.db.url();
    let (jobs, first_job, deliveries, first_delivery) = off_runtime(|| {
        let mut reader = PgReader::connect(&url).unwrap();
        (
            reader.jobs(10).unwrap(),
            reader.jobs(1).unwrap(),
            reader.deliveries(usize::MAX).unwrap(),
            reader.deliveries(1).unwrap(),
        )
    });
    let ids: Vec<i64> = jobs.iter().map(|j| j.job_id.get()).collect();
    assert_eq!(ids, [1, 2], "the job changed last comes first");
    assert_eq!(jobs[0].state, rm_vocab::JobState::InProgress);
    assert_eq!(first_job.len(), 1);
    let guids: Vec<&str> = deliveries.iter().map(|d| d.guid.as_str()).collect();
    assert_eq!(guids, ["three", "two", "one"]);
    assert_eq!(first_delivery.len(), 1);
}

/// A database migrated by a newer rm is refused at connect, naming both versions, and left as
/// it is.
#[test]
fn a_database_from_a_newer_rm_is_refused() {
    let Some(pg) = Postgres::new("a_database_from_a_newer_rm_is_refused") else {
        return;
    };
    let url = pg.db.url();
    client(&url)
        .execute("UPDATE rm_schema_version SET version = version + 1", &[])
        .unwrap();
    let refused = PgJournal::connect(&url).err();
    assert!(
        matches!(
            refused,
            Some(crate::JournalError::PgTooNew { found, supported })
                if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION
        ),
        "{refused:?}"
    );
}

/// A delivery is answered only after the COMMIT that holds it returned: a deferred trigger
/// makes COMMIT itself wait (on an advisory lock another session holds), after every statement
/// of the group ran. Meanwhile the caller has no answer and no other session sees the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_is_answered_only_after_commit_returned() {
    let Some(pg) = Postgres::new("record_is_answered_only_after_commit_returned") else {
        return;
    };
    let url = pg.db.url();
    const HOLD: i64 = 42;
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (holding, is_holding) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn({
        let url = url.clone();
        move || {
            let mut client = Client::connect(&url, NoTls).unwrap();
            client
                .batch_execute(
                    "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                     BEGIN PERFORM pg_advisory_xact_lock(42); RETURN NULL; END $$;
                     CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON deliveries
                         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_commit();",
                )
                .unwrap();
            client
                .execute("SELECT pg_advisory_lock($1)", &[&HOLD])
                .unwrap();
            holding.send(()).unwrap();
            released.recv().unwrap();
            client
                .execute("SELECT pg_advisory_unlock($1)", &[&HOLD])
                .unwrap();
        }
    });
    is_holding.recv().unwrap();
    let journal = pg.journal.clone();
    let task = tokio::spawn(async move { journal.record(job_delivery("c", 1, "queued", 1)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "answered before its COMMIT returned");
    assert_eq!(pg.delivery_count_now(), 0);
    release.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(
        task.await.unwrap().unwrap(),
        Recorded::New(Outcome::Applied)
    );
    assert_eq!(pg.delivery_count_now(), 1);
}

/// The writer's connection is cut (the server restarted, a proxy dropped it): the next group
/// connects again and is committed; the caller never sees the lost connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_made_again_for_the_next_group() {
    let Some(pg) = Postgres::new("a_lost_connection_is_made_again") else {
        return;
    };
    let first = pg
        .journal
        .record(job_delivery("before", 1, "queued", 1))
        .await;
    assert_eq!(first.unwrap(), Recorded::New(Outcome::Applied));
    let url = pg.db.url();
    let cut: i64 = off_runtime(|| {
        Client::connect(&url, NoTls)
            .unwrap()
            .query_one(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = $1",
                &[&super::writer::WRITER_APPLICATION],
            )
            .unwrap()
            .get(0)
    });
    assert_eq!(cut, 1, "the writer's connection was not found");
    let after = pg
        .journal
        .record(job_delivery("after", 2, "queued", 2))
        .await;
    assert_eq!(after.unwrap(), Recorded::New(Outcome::Applied));
    assert_eq!(pg.delivery_count_now(), 2);
}
