//! The ends of a job's wait on a real SQLite file: what sightings record on the job, what the
//! `starting` transition records on the attempt, what `Reader::job_waits` joins, and what the
//! v7 migration keeps of rows journalled before it.

use std::path::PathBuf;

use rm_vocab::{Source, UnixMs};
use rusqlite::Connection;
use serde_json::json;

use crate::*;
use rm_vocab::{JobId, RunnerId};

const T0: i64 = 1_700_000_000_000;

fn temp_journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    (dir, path)
}

fn rfc3339(ms: i64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap());
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A `workflow_job` delivery; `created`/`started` are GitHub's dates, absent when `None`.
fn sighting(
    guid: &str,
    job_id: i64,
    action: &str,
    runner: Option<&str>,
    created: Option<i64>,
    started: Option<i64>,
    at_ms: i64,
) -> Incoming {
    let mut job = json!({
        "id": job_id, "run_id": 5, "run_attempt": 1, "labels": ["self-hosted"],
        "runner_name": runner, "runner_id": runner.map(|_| 1),
        "conclusion": (action == "completed").then_some("success"),
    });
    if let Some(created) = created {
        job["created_at"] = json!(rfc3339(created));
    }
    if let Some(started) = started {
        job["started_at"] = json!(rfc3339(started));
    }
    let body = json!({
        "action": action, "workflow_job": job,
        "repository": {"full_name": "acme/widgets"}, "installation": {"id": 7},
    });
    Incoming {
        guid: guid.to_owned(),
        event: "workflow_job".to_owned(),
        headers: Vec::new(),
        body: serde_json::to_vec(&body).unwrap(),
        received_at_ms: UnixMs::new(at_ms),
        source: Source::Webhook,
    }
}

fn attempt_id(n: u8) -> AttemptId {
    AttemptId::parse(&format!("{n:02x}{}", "0".repeat(30))).unwrap()
}

/// An attempt of `policy` whose runner process was started at `started_at`; its runner name.
fn started_attempt(attempts: &Attempts, n: u8, policy: &str, started_at: i64) -> String {
    let id = attempt_id(n);
    let dir = PathBuf::from(format!("/runners/{}", id.short()));
    let name = id.runner_name("host");
    attempts
        .create(&NewAttempt {
            attempt_id: &id,
            policy,
            runner_name: &name,
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &dir,
            created_at_ms: UnixMs::new(started_at - 500),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: None,
            shape: None,
        })
        .unwrap();
    assert!(
        attempts
            .jit_received(&id, RunnerId::new(7), UnixMs::new(started_at - 100))
            .unwrap()
    );
    assert!(
        attempts
            .started(&id, 4242, 99, UnixMs::new(started_at))
            .unwrap()
    );
    // Later states move `state_changed_at` on; the start must stay.
    assert!(
        attempts
            .mark_idle(&id, AttemptState::Starting, UnixMs::new(started_at + 700))
            .unwrap()
    );
    assert!(
        attempts
            .mark_busy(&id, None, UnixMs::new(started_at + 900))
            .unwrap()
    );
    name
}

#[tokio::test]
async fn a_served_job_has_github_s_queue_time_its_runner_s_start_and_its_own_start() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, Retention::default()).unwrap();
    let attempts = Attempts::open(&path).unwrap();
    let runner = started_attempt(&attempts, 1, "linux", T0 + 4_000);

    // Queued at T0 by GitHub's clock, learned 1.5 s later; started at T0 + 9 s.
    journal
        .record(sighting(
            "q",
            11,
            "queued",
            None,
            Some(T0),
            Some(T0),
            T0 + 1_500,
        ))
        .await
        .unwrap();
    journal
        .record(sighting(
            "p",
            11,
            "in_progress",
            Some(&runner),
            Some(T0),
            Some(T0 + 9_000),
            T0 + 9_800,
        ))
        .await
        .unwrap();
    // A job a runner of another host took is not this host's wait.
    journal
        .record(sighting(
            "elsewhere",
            12,
            "in_progress",
            Some("someone-else"),
            Some(T0),
            Some(T0 + 5_000),
            T0 + 5_500,
        ))
        .await
        .unwrap();

    let reader = Reader::open(&path).unwrap();
    assert_eq!(
        reader.job_waits(UnixMs::new(T0)).unwrap(),
        vec![WaitRow {
            job_id: JobId::new(11),
            policy: "linux".to_owned(),
            queued_at_ms: Some(UnixMs::new(T0)),
            first_seen_at_ms: UnixMs::new(T0 + 1_500),
            job_started_at_ms: UnixMs::new(T0 + 9_000),
            runner_started_at_ms: Some(UnixMs::new(T0 + 4_000)),
        }]
    );
    // The window is by the job's start.
    assert!(
        reader
            .job_waits(UnixMs::new(T0 + 9_001))
            .unwrap()
            .is_empty()
    );

    // The completion changes none of it.
    journal
        .record(sighting(
            "c",
            11,
            "completed",
            Some(&runner),
            Some(T0),
            Some(T0 + 9_000),
            T0 + 20_000,
        ))
        .await
        .unwrap();
    assert_eq!(
        reader.job_waits(UnixMs::new(T0)).unwrap()[0].job_started_at_ms,
        UnixMs::new(T0 + 9_000)
    );
}

#[tokio::test]
async fn without_github_s_dates_the_journal_s_own_times_stand_in() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, Retention::default()).unwrap();
    let attempts = Attempts::open(&path).unwrap();
    let runner = started_attempt(&attempts, 2, "gpu", T0 + 2_000);
    journal
        .record(sighting("q", 21, "queued", None, None, None, T0 + 1_000))
        .await
        .unwrap();
    journal
        .record(sighting(
            "p",
            21,
            "in_progress",
            Some(&runner),
            None,
            None,
            T0 + 6_000,
        ))
        .await
        .unwrap();
    let waits = Reader::open(&path)
        .unwrap()
        .job_waits(UnixMs::new(0))
        .unwrap();
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].queued_at_ms, None, "no created_at in any sighting");
    assert_eq!(waits[0].first_seen_at_ms, UnixMs::new(T0 + 1_000));
    assert_eq!(
        waits[0].job_started_at_ms,
        UnixMs::new(T0 + 6_000),
        "the journal learned of the in_progress then"
    );
}

#[tokio::test]
async fn a_late_in_progress_fills_github_s_dates_but_never_its_arrival() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, Retention::default()).unwrap();
    let attempts = Attempts::open(&path).unwrap();
    let runner = started_attempt(&attempts, 3, "linux", T0 + 2_000);
    // The completion came first and carried no dates (a poll of an odd GHES, say).
    journal
        .record(sighting(
            "c",
            31,
            "completed",
            Some(&runner),
            None,
            None,
            T0 + 9_000,
        ))
        .await
        .unwrap();
    let reader = Reader::open(&path).unwrap();
    assert!(
        reader.job_waits(UnixMs::new(0)).unwrap().is_empty(),
        "a finished job's arrival is not its start"
    );
    // The reordered in_progress changes no state but says when the job was queued and started.
    journal
        .record(sighting(
            "p",
            31,
            "in_progress",
            Some(&runner),
            Some(T0),
            Some(T0 + 3_000),
            T0 + 9_500,
        ))
        .await
        .unwrap();
    let waits = reader.job_waits(UnixMs::new(0)).unwrap();
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].queued_at_ms, Some(UnixMs::new(T0)));
    assert_eq!(waits[0].job_started_at_ms, UnixMs::new(T0 + 3_000));
}

/// v7 keeps what rows from before it can still say: a job in progress started when it entered
/// that state (`updated_at`), an attempt still starting was started at `state_changed_at`.
#[test]
fn the_v7_migration_dates_what_earlier_rows_can_still_date() {
    let (_dir, path) = temp_journal();
    let mut conn = Connection::open(&path).unwrap();
    crate::schema::migrate_to(&mut conn, &path, 6).unwrap();
    conn.execute_batch(
        "INSERT INTO jobs (job_id, run_id, run_attempt, repository, labels, state, state_rank,
             runner_name, source, first_seen_at, updated_at)
             VALUES (1, 2, 1, 'o/r', '[]', 'in_progress', 3, 'rm-h-0123456789ab', 'webhook',
                 10, 30),
                    (2, 2, 1, 'o/r', '[]', 'completed', 4, 'rm-h-fedcba987654', 'webhook',
                 10, 40);
         INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
             state_changed_at, pid, pid_start_time, created_at, updated_at)
             VALUES ('0123456789abcdef0123456789abcdef', 'linux', 'rm-h-0123456789ab',
                 'ephemeral', '/r/0123456789ab', 'starting', 20, 4242, 77, 1, 20),
                    ('fedcba9876543210fedcba9876543210', 'linux', 'rm-h-fedcba987654',
                 'ephemeral', '/r/fedcba987654', 'busy', 25, 4243, 78, 1, 25);",
    )
    .unwrap();
    drop(conn);
    drop(crate::connection::open_writer(&path).unwrap());
    let waits = Reader::open(&path)
        .unwrap()
        .job_waits(UnixMs::new(0))
        .unwrap();
    assert_eq!(
        waits,
        vec![WaitRow {
            job_id: JobId::new(1),
            policy: "linux".to_owned(),
            queued_at_ms: None,
            first_seen_at_ms: UnixMs::new(10),
            job_started_at_ms: UnixMs::new(30),
            runner_started_at_ms: Some(UnixMs::new(20)),
        }],
        "the completed job's start is unknown; the busy attempt's start was overwritten"
    );
}
