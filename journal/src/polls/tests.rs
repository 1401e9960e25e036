//! The polling fallback's journal: polled sightings merge forward only beside deliveries, the
//! announcement of a job is dated whichever arrives first, and the scan's cursor, redelivery
//! requests and stale checks persist.

use std::path::PathBuf;

use rm_handlers::{JobObservation, JobState, Source};
use rusqlite::Connection;
use serde_json::json;

use crate::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");

fn temp_journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    (dir, path)
}

fn keep_all() -> Retention {
    let forever = std::time::Duration::from_secs(u64::MAX / 1000);
    Retention {
        delivery_bodies: forever,
        delivery_rows: forever,
        finished_jobs: forever,
    }
}

fn delivery(guid: &str, job_id: i64, action: &str, at_ms: i64) -> Incoming {
    let name = match action {
        "queued" => "workflow_job.queued.6",
        "in_progress" => "workflow_job.in_progress.4",
        _ => "workflow_job.completed.1",
    };
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}.json")).unwrap();
    let mut body: serde_json::Value = serde_json::from_str(&text).unwrap();
    body["action"] = json!(action);
    body["workflow_job"]["id"] = json!(job_id);
    Incoming {
        guid: guid.to_owned(),
        event: "workflow_job".to_owned(),
        headers: Vec::new(),
        body: serde_json::to_vec(&body).unwrap(),
        received_at_ms: at_ms,
        source: Source::Webhook,
    }
}

fn polled(job_id: i64, state: JobState, at_ms: i64) -> JobObservation {
    JobObservation {
        job_id: JobId::new(job_id),
        run_id: 5,
        run_attempt: 1,
        repository: "acme/widgets".to_owned(),
        installation_id: Some(7),
        labels: vec!["self-hosted".to_owned()],
        state,
        conclusion: (state == JobState::Completed).then(|| "cancelled".to_owned()),
        runner_name: None,
        runner_id: None,
        workflow_name: None,
        job_name: Some("build".to_owned()),
        queued_at_ms: None,
        started_at_ms: None,
        observed_at_ms: at_ms,
        source: Source::Poll,
    }
}

#[tokio::test]
async fn a_polled_job_is_journalled_as_poll_and_announced_when_a_delivery_names_it() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    let mut polls = PollJournal::open(&path).unwrap();

    let first = polls
        .record_sightings(&[polled(11, JobState::Queued, 1_000)])
        .unwrap();
    assert_eq!(
        first,
        vec![Sighting {
            job_id: JobId::new(11),
            moved: true,
            announced: false,
            state: rm_handlers::JobState::Queued
        }]
    );
    let row = Reader::open(&path)
        .unwrap()
        .job(JobId::new(11))
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.source.as_str(), row.state.as_str()),
        ("poll", "queued")
    );
    assert_eq!(polls.unannounced_count().unwrap(), 1);

    // The same sighting again changes nothing.
    let again = polls
        .record_sightings(&[polled(11, JobState::Queued, 2_000)])
        .unwrap();
    assert!(!again[0].moved);

    // The late webhook for the same state is stale, but it dates the announcement.
    journal
        .record(delivery("g-1", 11, "queued", 3_000))
        .await
        .unwrap();
    assert_eq!(
        polls.announced(&[JobId::new(11), JobId::new(12)]).unwrap(),
        [JobId::new(11)].into()
    );
    assert_eq!(polls.unannounced_count().unwrap(), 0);
}

#[tokio::test]
async fn a_poll_never_moves_a_job_back_and_moves_it_forward_as_poll() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    let mut polls = PollJournal::open(&path).unwrap();
    journal
        .record(delivery("g-1", 21, "queued", 1_000))
        .await
        .unwrap();
    journal
        .record(delivery("g-2", 22, "completed", 1_000))
        .await
        .unwrap();

    let seen = polls
        .record_sightings(&[
            polled(21, JobState::Completed, 2_000),
            polled(22, JobState::Queued, 2_000),
        ])
        .unwrap();
    assert_eq!(
        seen.iter()
            .map(|s| (s.moved, s.announced, s.state.as_str()))
            .collect::<Vec<_>>(),
        vec![(true, true, "completed"), (false, true, "completed")]
    );
    let reader = Reader::open(&path).unwrap();
    let moved = reader.job(JobId::new(21)).unwrap().unwrap();
    assert_eq!(
        (moved.source.as_str(), moved.conclusion.as_deref()),
        ("poll", Some("cancelled"))
    );
    assert_eq!(
        reader.job(JobId::new(22)).unwrap().unwrap().source,
        "webhook"
    );
}

#[tokio::test]
async fn stale_queued_jobs_are_listed_never_checked_first_and_rotate_once_checked() {
    let (_dir, path) = temp_journal();
    let mut polls = PollJournal::open(&path).unwrap();
    polls
        .record_sightings(&[
            polled(1, JobState::Queued, 1_000),
            polled(2, JobState::Queued, 2_000),
            polled(3, JobState::Queued, 9_000),
            polled(4, JobState::Completed, 1_000),
        ])
        .unwrap();
    let ids = |queued_before, checked_before| -> Vec<i64> {
        polls
            .stale_queued(queued_before, checked_before)
            .unwrap()
            .iter()
            .map(|j| j.job_id.get())
            .collect()
    };
    assert_eq!(ids(5_000, 5_000), vec![1, 2]);
    polls.mark_checked(JobId::new(1), 4_000).unwrap();
    assert_eq!(ids(5_000, 3_000), vec![2], "checked after 3 s: not due");
    assert_eq!(ids(5_000, 5_000), vec![2, 1], "the never-checked one first");
}

#[tokio::test]
async fn cursors_redeliveries_and_known_guids_persist() {
    let (_dir, path) = temp_journal();
    let journal = Journal::open(&path, keep_all()).unwrap();
    let polls = PollJournal::open(&path).unwrap();
    assert_eq!(polls.last_delivery_at().unwrap(), None);
    journal
        .record(delivery("g-1", 1, "queued", 5_000))
        .await
        .unwrap();
    assert_eq!(polls.last_delivery_at().unwrap(), Some(5_000));
    assert_eq!(
        polls.known_guids(&["g-1", "g-2"]).unwrap(),
        ["g-1".to_owned()].into()
    );

    assert_eq!(polls.cursor(HOOK_DELIVERY_CURSOR).unwrap(), None);
    polls.set_cursor(HOOK_DELIVERY_CURSOR, 10, 1).unwrap();
    polls.set_cursor(HOOK_DELIVERY_CURSOR, 12, 2).unwrap();
    assert!(polls.record_redelivery("g-2", 9, 3).unwrap());
    assert!(
        !polls.record_redelivery("g-2", 11, 4).unwrap(),
        "once per GUID"
    );
    drop(polls);

    let polls = PollJournal::open(&path).unwrap();
    assert_eq!(polls.cursor(HOOK_DELIVERY_CURSOR).unwrap(), Some(12));
    assert_eq!(
        polls.redelivered(&["g-1", "g-2"]).unwrap(),
        ["g-2".to_owned()].into()
    );
}

#[test]
fn repositories_of_an_account_come_from_its_live_installations() {
    let (_dir, path) = temp_journal();
    let polls = PollJournal::open(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(
        "INSERT INTO installations (id, account, updated_at) VALUES (1, 'Acme', 1), (2, 'other', 1);
         INSERT INTO installations (id, account, removed, updated_at) VALUES (3, 'acme', 1, 1);
         INSERT INTO installation_repositories VALUES (1, 10, 'Acme/b'), (1, 11, 'Acme/a'),
             (2, 12, 'other/x'), (3, 13, 'acme/gone');",
    )
    .unwrap();
    assert_eq!(polls.repositories_of("acme").unwrap(), ["Acme/a", "Acme/b"]);
}

#[test]
fn migrating_to_v3_dates_the_announcement_of_jobs_deliveries_brought() {
    let (_dir, path) = temp_journal();
    let mut conn = Connection::open(&path).unwrap();
    crate::schema::migrate_to(&mut conn, &path, 2).unwrap();
    conn.execute_batch(
        "INSERT INTO jobs (job_id, run_id, run_attempt, repository, labels, state, state_rank,
             source, first_seen_at, updated_at)
             VALUES (1, 2, 1, 'o/r', '[]', 'queued', 1, 'webhook', 7, 7);",
    )
    .unwrap();
    drop(conn);
    let polls = PollJournal::open(&path).unwrap();
    assert_eq!(
        polls.announced(&[JobId::new(1)]).unwrap(),
        [JobId::new(1)].into()
    );
    assert_eq!(polls.unannounced_count().unwrap(), 0);
}
