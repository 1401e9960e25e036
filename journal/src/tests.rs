//! Journal tests on a real SQLite file in a temporary directory: group commit, retention (and
//! a pruned body's replay) and migrations from every earlier version. The intake's tests that
//! both journals share (duplicate, out-of-order, stale and rejected deliveries, replay) are in
//! `intake_tests`.

use std::path::PathBuf;

use rusqlite::Connection;

use crate::intake_tests::{job_delivery, keep_all};
use crate::*;
use rm_vocab::JobId;

fn temp_journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    (dir, path)
}

#[tokio::test]
async fn concurrent_deliveries_are_committed_in_groups() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    const N: i64 = 400;
    // Another connection holds the write lock while the burst arrives, so the writer waits
    // (busy timeout) with its first delivery and finds the rest queued when the lock goes:
    // grouping is then certain, not a race against the writer's speed.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut tasks = Vec::new();
    for i in 0..N {
        let journal = journal.clone();
        tasks.push(tokio::spawn(async move {
            journal
                .record(job_delivery(&format!("guid-{i}"), 1000 + i, "queued", i))
                .await
        }));
    }
    // A duplicate GUID racing its original inside the same burst is still answered once.
    let dup = tokio::spawn({
        let journal = journal.clone();
        async move {
            journal
                .record(job_delivery("guid-0", 1000, "queued", 0))
                .await
        }
    });
    // Let every task send its delivery, then release the lock.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    blocker.execute_batch("COMMIT").unwrap();
    let mut new = 0;
    for task in tasks {
        if task.await.unwrap().unwrap() == Recorded::New(Outcome::Applied) {
            new += 1;
        }
    }
    let dup = dup.await.unwrap().unwrap();
    assert_eq!(new + i64::from(dup == Recorded::New(Outcome::Applied)), N);
    let reader = Reader::open(&path).unwrap();
    assert_eq!(reader.delivery_count().unwrap(), N);
    assert_eq!(reader.job_counts().unwrap(), vec![("queued".to_owned(), N)]);
    let commits = journal.metrics().commits();
    // (18 to 46 commits in practice: the writer's batches are cut by its own pace, but one
    // commit per delivery would mean no grouping at all.)
    assert!(
        commits < N as u64 / 2,
        "{commits} commits for {N} deliveries queued behind one lock: no grouping"
    );
}

#[tokio::test]
async fn retention_drops_old_bodies_rows_and_finished_jobs() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    const DAY: i64 = 24 * 3600 * 1000;
    let now = 100 * DAY;
    journal
        .record(job_delivery("ancient", 1, "completed", now - 40 * DAY))
        .await
        .unwrap();
    journal
        .record(job_delivery("old", 2, "completed", now - 8 * DAY))
        .await
        .unwrap();
    journal
        .record(job_delivery("old-queued", 3, "queued", now - 8 * DAY))
        .await
        .unwrap();
    journal
        .record(job_delivery("fresh", 4, "completed", now - DAY))
        .await
        .unwrap();
    drop(journal);

    let mut conn = crate::connection::open_writer(&path).unwrap();
    while crate::retention::prune_step(&mut conn, &Retention::default(), rm_vocab::UnixMs::new(now))
        .unwrap()
    {}
    let reader = Reader::open(&path).unwrap();
    assert!(reader.delivery("ancient").unwrap().is_none());
    assert!(reader.delivery("old").unwrap().unwrap().body.is_none());
    assert!(reader.delivery("fresh").unwrap().unwrap().body.is_some());
    assert!(matches!(
        replay(&path, "old", rm_vocab::UnixMs::new(now)),
        Err(JournalError::BodyPruned(_))
    ));
    let mut jobs: Vec<i64> = reader
        .jobs(100)
        .unwrap()
        .iter()
        .map(|j| j.job_id.get())
        .collect();
    jobs.sort_unstable();
    // Finished jobs past retention go; a queued job stays however old it is.
    assert_eq!(jobs, vec![3, 4]);
}

/// Seeds a journal at `version` with rows that every later version must keep.
fn seed(conn: &Connection, version: i64) {
    if version >= 1 {
        conn.execute_batch(
            "INSERT INTO deliveries (guid, event, source, received_at, headers, body, outcome)
                 VALUES ('seed', 'ping', 'webhook', 1, '{}', x'7b7d', 'applied');
             INSERT INTO jobs (job_id, run_id, run_attempt, repository, labels, state,
                 state_rank, source, first_seen_at, updated_at)
                 VALUES (1, 2, 1, 'o/r', '[\"self-hosted\"]', 'queued', 1, 'webhook', 1, 1);",
        )
        .unwrap();
    }
    if version >= 2 {
        conn.execute_batch(
            "INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
                 state_changed_at, runner_id, pid, pid_start_time, created_at, updated_at)
                 VALUES ('0123456789abcdef0123456789abcdef', 'linux', 'rm-h-0123456789ab',
                     'ephemeral', '/r/0123456789ab', 'busy', 5, 42, 4242, 77, 1, 5);
             INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
                 state_changed_at, outcome, reason, created_at, updated_at)
                 VALUES ('fedcba9876543210fedcba9876543210', 'linux', 'rm-h-fedcba987654',
                     'persistent', '/r/linux/s1', 'cleaned', 9, 'failed', 'jit_expired', 2, 9);",
        )
        .unwrap();
    }
}

#[test]
fn migrations_run_from_every_earlier_version() {
    for start in 0..=schema::SCHEMA_VERSION {
        let (_dir, path) = temp_journal();
        let mut conn = Connection::open(&path).unwrap();
        schema::migrate_to(&mut conn, &path, start).unwrap();
        seed(&conn, start);
        drop(conn);

        let conn = crate::connection::open_writer(&path).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION, "from v{start}");
        let reader = Reader::open(&path).unwrap();
        assert_eq!(reader.integrity_check().unwrap(), vec!["ok"]);
        if start >= 1 {
            assert_eq!(reader.delivery_count().unwrap(), 1, "from v{start}");
            // v6 rebuilt the deliveries table: the row keeps its outcome and its body's bytes.
            let rows = reader.deliveries(10).unwrap();
            assert_eq!(rows[0].guid, "seed", "from v{start}");
            assert_eq!(rows[0].outcome, Outcome::Applied, "from v{start}");
            let body: Vec<u8> = conn
                .query_row("SELECT body FROM deliveries WHERE guid = 'seed'", [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(body, b"{}", "from v{start}");
            assert_eq!(
                reader.job(JobId::new(1)).unwrap().unwrap().labels,
                vec!["self-hosted"]
            );
        }
        // Every outcome this build writes fits the migrated table's CHECK.
        for (n, outcome) in ["applied", "duplicate", "ignored", "rejected", "stale"]
            .into_iter()
            .enumerate()
        {
            conn.execute(
                "INSERT INTO deliveries (guid, event, source, received_at, headers, outcome)
                 VALUES (?1, 'ping', 'webhook', 1, '{}', ?2)",
                rusqlite::params![format!("outcome-{n}"), outcome],
            )
            .unwrap_or_else(|e| panic!("from v{start}: outcome {outcome}: {e}"));
        }
        let attempts = reader.attempts(10).unwrap();
        if start >= 2 {
            let states: Vec<_> = attempts.iter().map(|a| a.state).collect();
            assert_eq!(
                states,
                vec![AttemptState::Cleaned, AttemptState::Busy],
                "from v{start}"
            );
            assert_eq!(attempts[1].pid, Some(4242));
            assert_eq!(attempts[1].pid_start_time, Some(77));
            assert_eq!(attempts[0].outcome, Some(AttemptOutcome::Failed));
            // Attempts journalled before v5 ran as the agent's own user and hold no uid.
            assert_eq!(attempts[1].isolation, IsolationKind::None, "from v{start}");
            assert_eq!(attempts[1].uid, None);
            // Attempts journalled before v13 ran on the host's root: no image.
            assert!(attempts.iter().all(|a| a.image.is_none()), "from v{start}");
            // Attempts journalled before v15 declared no shape.
            assert!(attempts.iter().all(|a| a.shape.is_none()), "from v{start}");
        } else {
            // The table exists (the reader would fail otherwise) and starts empty.
            assert!(attempts.is_empty(), "from v{start}");
        }
    }
}

/// A file from the rm before images (v12) opens: its attempts read no image (they ran on the
/// host's root), keep everything else, and the next attempt journals its image beside them.
#[test]
fn attempts_from_before_images_read_none_and_new_ones_keep_theirs() {
    let (_dir, path) = temp_journal();
    let mut conn = Connection::open(&path).unwrap();
    schema::migrate_to(&mut conn, &path, 12).unwrap();
    seed(&conn, 12);
    let has_image: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('attempts') WHERE name = 'image')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!has_image, "v12 is the schema before images");
    drop(conn);

    let attempts = Attempts::open(&path).unwrap();
    let old = AttemptId::parse("0123456789abcdef0123456789abcdef").unwrap();
    let row = attempts.get(&old).unwrap().unwrap();
    assert_eq!(
        (row.state, row.pid, row.image),
        (AttemptState::Busy, Some(4242), None)
    );
    let new = AttemptId::parse("00112233445566778899aabbccddeeff").unwrap();
    let image = format!("sha256:{}", "ab".repeat(32));
    let dir = PathBuf::from("/r/00112233");
    attempts
        .create(&NewAttempt {
            attempt_id: &new,
            policy: "linux",
            runner_name: &new.runner_name("h"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &dir,
            created_at_ms: rm_vocab::UnixMs::new(10),
            isolation: IsolationKind::User,
            uid: Some(64_200),
            cgroup: None,
            image: Some(&image),
            shape: None,
        })
        .unwrap();
    drop(attempts);
    let reader = Reader::open(&path).unwrap();
    let images: Vec<_> = reader
        .attempts(10)
        .unwrap()
        .into_iter()
        .map(|a| (a.attempt_id.as_str().to_owned(), a.image))
        .collect();
    assert_eq!(
        images,
        vec![
            (new.as_str().to_owned(), Some(image)),
            ("fedcba9876543210fedcba9876543210".to_owned(), None),
            (old.as_str().to_owned(), None),
        ]
    );
}

#[test]
fn a_journal_from_a_newer_rm_is_refused_and_a_missing_one_named() {
    let (_dir, path) = temp_journal();
    drop(crate::connection::open_writer(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    assert!(matches!(
        Journal::open(&path, Retention::default()),
        Err(JournalError::TooNew { .. })
    ));
    assert!(matches!(
        Reader::open(&path),
        Err(JournalError::TooNew { .. })
    ));
    let missing = path.with_file_name("nothing-here.sqlite3");
    assert!(matches!(
        Reader::open(&missing),
        Err(JournalError::Missing(_))
    ));
}

#[test]
fn the_file_is_wal_with_full_sync() {
    let (_dir, path) = temp_journal();
    let conn = crate::connection::open_writer(&path).unwrap();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    let sync: i64 = conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    assert_eq!((mode.as_str(), sync), ("wal", 2));
}

/// A second connection holding the write lock stands for a slow disk: the caller must not be
/// answered until its delivery is committed.
#[tokio::test]
async fn record_is_answered_only_after_the_commit() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    let blocker = Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.record(job_delivery("held", 1, "queued", 1)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !pending.is_finished(),
        "answered while the commit could not happen"
    );

    blocker.execute_batch("COMMIT").unwrap();
    assert_eq!(
        pending.await.unwrap().unwrap(),
        Recorded::New(Outcome::Applied)
    );
    assert!(
        Reader::open(&path)
            .unwrap()
            .delivery("held")
            .unwrap()
            .is_some()
    );
}

/// When a commit fails, every caller in the group gets the error (the receiver answers 503 and
/// GitHub records a failed delivery), nothing is half-written, and the writer goes on.
#[tokio::test]
async fn a_failed_commit_fails_the_whole_group_and_the_writer_recovers() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    let blocker = Connection::open(&path).unwrap();
    // Held past the writer's busy timeout.
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let result = journal.record(job_delivery("lost", 1, "queued", 1)).await;
    assert!(matches!(result, Err(JournalError::Commit(_))), "{result:?}");
    blocker.execute_batch("COMMIT").unwrap();

    assert!(
        Reader::open(&path)
            .unwrap()
            .delivery("lost")
            .unwrap()
            .is_none()
    );
    let retried = journal
        .record(job_delivery("lost", 1, "queued", 2))
        .await
        .unwrap();
    assert_eq!(retried, Recorded::New(Outcome::Applied));
}

/// A flush the test controls: each flush waits for a token, and the token says whether it works.
fn controlled_flush() -> (std::sync::mpsc::Sender<bool>, crate::sync::SyncFn) {
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    let flush: crate::sync::SyncFn = Box::new(move || match rx.recv() {
        Ok(true) => Ok(()),
        _ => Err(std::io::Error::other("injected flush failure")),
    });
    (tx, flush)
}

/// The writer commits without waiting for the disk; the caller is answered only after the
/// flush that follows the commit.
#[tokio::test]
async fn record_is_answered_only_after_the_flush() {
    let (_dir, path) = temp_journal();
    let (flushes, flush) = controlled_flush();
    let journal = Journal::open_with_sync(&path, keep_all(), flush).unwrap();
    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.record(job_delivery("f1", 1, "queued", 1)).await }
    });
    // The group is committed (a reader sees it: waited for, not timed); it is only not yet
    // known to be on disk, and the flush is held, so its caller has no answer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while Reader::open(&path)
        .ok()
        .and_then(|r| r.delivery("f1").ok().flatten())
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the delivery was never committed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // An answer sent at the commit would arrive in this while (it cannot make the test flake:
    // with the flush held, the right code has no answer to give however long this is).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "answered before the flush");
    flushes.send(true).unwrap();
    assert_eq!(
        pending.await.unwrap().unwrap(),
        Recorded::New(Outcome::Applied)
    );
}

/// A failed flush fails its callers and poisons the journal: nothing more is accepted, since
/// the kernel may have dropped the dirty pages.
#[tokio::test]
async fn a_failed_flush_fails_its_callers_and_every_later_one() {
    let (_dir, path) = temp_journal();
    let (flushes, flush) = controlled_flush();
    let journal = Journal::open_with_sync(&path, keep_all(), flush).unwrap();
    flushes.send(false).unwrap();
    let first = journal.record(job_delivery("p1", 1, "queued", 1)).await;
    assert!(
        matches!(first, Err(JournalError::Commit(ref m)) if m.contains("injected")),
        "{first:?}"
    );
    let later = journal.record(job_delivery("p2", 2, "queued", 2)).await;
    assert!(
        matches!(later, Err(JournalError::Commit(ref m)) if m.contains("restart")),
        "{later:?}"
    );
    assert!(journal.probe().await.is_err());
    assert!(
        Reader::open(&path)
            .unwrap()
            .delivery("p2")
            .unwrap()
            .is_none(),
        "written after a failed flush"
    );
}

/// Groups committed while a flush runs are answered together by the next flush, not one flush
/// each.
#[tokio::test]
async fn one_flush_answers_the_groups_committed_meanwhile() {
    let (_dir, path) = temp_journal();
    let (flushes, flush) = controlled_flush();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted: crate::sync::SyncFn = {
        let calls = calls.clone();
        let mut flush = flush;
        Box::new(move || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            flush()
        })
    };
    let journal = Journal::open_with_sync(&path, keep_all(), counted).unwrap();
    let first = tokio::spawn({
        let journal = journal.clone();
        async move { journal.record(job_delivery("g0", 100, "queued", 1)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // The sync thread now waits in the first flush; these commit behind it, one at a time.
    let mut later = Vec::new();
    for i in 1..20 {
        let journal = journal.clone();
        later.push(tokio::spawn(async move {
            journal
                .record(job_delivery(&format!("g{i}"), 100 + i, "queued", 1))
                .await
        }));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Enough tokens for one flush per delivery: the test can never hang on a missing token.
    for _ in 0..20 {
        flushes.send(true).unwrap();
    }
    first.await.unwrap().unwrap();
    for task in later {
        assert_eq!(
            task.await.unwrap().unwrap(),
            Recorded::New(Outcome::Applied)
        );
    }
    let calls = calls.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        calls < 20,
        "{calls} flushes for 20 deliveries committed behind a slow one"
    );
}
