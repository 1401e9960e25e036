//! Scale-set record tests on a real SQLite file: a message journalled once (a redelivery
//! changes nothing), jobs moved forward only whatever the order of their events, statistics
//! kept through GitHub's `null`, nothing lost to a crash between messages, events that cannot
//! be handled kept and never failing their message, the cursor reset of a re-created scale set,
//! the session, notes, the reads and pruning.

use std::path::PathBuf;

use rm_vocab::UnixMs;
use rusqlite::Connection;

use crate::*;

fn temp_journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    (dir, path)
}

const SET: &str = "linux-x64";

fn event(kind: &str, job_id: &str) -> JobEvent {
    JobEvent {
        kind: kind.to_owned(),
        job_id: job_id.to_owned(),
        runner_request_id: 77,
        repository: "acme/widgets".to_owned(),
        workflow_run_id: Some(900),
        display_name: "build".to_owned(),
        labels: vec!["self-hosted".to_owned(), "linux".to_owned()],
        runner_name: matches!(kind, "JobStarted" | "JobCompleted")
            .then(|| "rm-host-0001".to_owned()),
        result: (kind == "JobCompleted").then(|| "succeeded".to_owned()),
    }
}

fn stats(assigned: i64) -> ScaleSetStatistics {
    ScaleSetStatistics {
        assigned,
        registered: 2,
        idle: 2,
        ..ScaleSetStatistics::default()
    }
}

fn message(id: i64, at: i64, events: Vec<JobEvent>) -> IncomingMessage {
    IncomingMessage {
        message_id: id,
        statistics: Some(stats(events.len() as i64)),
        events,
        unknown_type: None,
        received_at: UnixMs::new(at),
    }
}

/// Every row of the three tables, as text: what "nothing changed" compares.
fn snapshot(path: &std::path::Path) -> Vec<String> {
    let conn = Connection::open(path).unwrap();
    let mut all = Vec::new();
    for table in ["scale_sets", "scale_set_messages", "scale_set_jobs"] {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2"))
            .unwrap();
        let columns = stmt.column_count();
        let rows = stmt
            .query_map([], |row| {
                let mut text = table.to_owned();
                for i in 0..columns {
                    let value: rusqlite::types::Value = row.get(i)?;
                    text.push_str(&format!(" {value:?}"));
                }
                Ok(text)
            })
            .unwrap();
        all.extend(rows.map(Result::unwrap));
    }
    all
}

#[test]
fn a_redelivered_message_is_already_journalled_and_changes_nothing() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    let first = message(10, 1_000, vec![event("JobAssigned", "j1")]);
    assert_eq!(
        sets.record_message(SET, &first).unwrap(),
        MessageRecorded::New
    );
    let before = snapshot(&path);
    // The same id again, even with other contents and later: a redelivery after a lost ack.
    let mut again = message(10, 5_000, vec![event("JobCompleted", "j1")]);
    again.statistics = Some(stats(9));
    assert_eq!(
        sets.record_message(SET, &again).unwrap(),
        MessageRecorded::AlreadyJournalled
    );
    assert_eq!(snapshot(&path), before);
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.messages, 1);
    assert_eq!(record.last_message_id, 10);
    assert_eq!(record.last_message_at, Some(UnixMs::new(1_000)));
    assert_eq!(
        sets.job("j1").unwrap().unwrap().state,
        ScaleSetJobState::Assigned
    );
    // The same id on another scale set is another message.
    assert_eq!(
        sets.record_message("other", &first).unwrap(),
        MessageRecorded::New
    );
}

#[test]
fn a_job_moves_forward_only_and_a_completion_always_wins() {
    use ScaleSetJobState::*;
    let table: &[(Option<ScaleSetJobState>, ScaleSetJobState, bool)] = &[
        (None, Available, true),
        (None, Assigned, true),
        (None, Started, true),
        (None, Completed, true),
        (Some(Available), Available, false),
        (Some(Available), Assigned, true),
        (Some(Available), Started, true),
        (Some(Available), Completed, true),
        (Some(Assigned), Available, false),
        (Some(Assigned), Assigned, false),
        (Some(Assigned), Started, true),
        (Some(Assigned), Completed, true),
        (Some(Started), Available, false),
        (Some(Started), Assigned, false),
        (Some(Started), Started, false),
        (Some(Started), Completed, true),
        (Some(Completed), Available, false),
        (Some(Completed), Assigned, false),
        (Some(Completed), Started, false),
        (Some(Completed), Completed, true),
    ];
    for &(current, event, moves) in table {
        assert_eq!(
            ScaleSetJobState::moves(current, false, event),
            moves,
            "{current:?} on {event:?}"
        );
    }
    // Cancelled before any runner took it: assigned (or started) again moves it back; a
    // later completion still wins; an older state never comes back.
    for (event, moves) in [
        (Available, false),
        (Assigned, true),
        (Started, true),
        (Completed, true),
    ] {
        assert_eq!(
            ScaleSetJobState::moves(Some(Completed), true, event),
            moves,
            "reassignable on {event:?}"
        );
    }
    for (state, result, runner, reassignable) in [
        (Completed, Some("canceled"), None, true),
        (Completed, Some("canceled"), Some("rm-host-0001"), false),
        (Completed, Some("succeeded"), None, false),
        (Completed, None, None, false),
        (Assigned, Some("canceled"), None, false),
    ] {
        assert_eq!(
            ScaleSetJobState::reassignable(state, result, runner),
            reassignable,
            "{state:?} {result:?} {runner:?}"
        );
    }
}

#[test]
fn a_job_cancelled_before_it_started_and_assigned_again_is_assigned_again() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    let cancelled = JobEvent {
        runner_name: None,
        result: Some("canceled".to_owned()),
        ..event("JobCompleted", "j1")
    };
    for (id, e) in [
        (1, event("JobAssigned", "j1")),
        (2, cancelled),
        (3, event("JobAssigned", "j1")),
    ] {
        sets.record_message(SET, &message(id, 1_000 + id, vec![e]))
            .unwrap();
    }
    let job = sets.job("j1").unwrap().unwrap();
    assert_eq!(
        (job.state, job.result.as_deref(), job.message_id),
        (ScaleSetJobState::Assigned, None, 3),
        "assigned again, the cancellation's result gone"
    );
    for (id, kind) in [(4, "JobStarted"), (5, "JobCompleted")] {
        sets.record_message(SET, &message(id, 1_000 + id, vec![event(kind, "j1")]))
            .unwrap();
    }
    let job = sets.job("j1").unwrap().unwrap();
    assert_eq!(
        (job.state, job.result.as_deref(), job.runner_name.as_deref()),
        (
            ScaleSetJobState::Completed,
            Some("succeeded"),
            Some("rm-host-0001")
        )
    );
}

#[test]
fn events_in_any_order_end_in_the_same_job() {
    use ScaleSetJobState::*;
    // Each case: the kinds in the order they arrive (one message each), and the job's end.
    let table: &[(&[&str], ScaleSetJobState, Option<&str>)] = &[
        (
            &["JobAssigned", "JobStarted", "JobCompleted"],
            Completed,
            Some("succeeded"),
        ),
        (
            &["JobCompleted", "JobStarted", "JobAssigned"],
            Completed,
            Some("succeeded"),
        ),
        (&["JobStarted", "JobAssigned"], Started, None),
        (&["JobAssigned", "JobAvailable"], Assigned, None),
        (&["JobAvailable", "JobAssigned"], Assigned, None),
        (
            &["JobStarted", "JobCompleted", "JobAssigned", "JobStarted"],
            Completed,
            Some("succeeded"),
        ),
        (&["JobAvailable"], Available, None),
    ];
    for (case, &(kinds, end, result)) in table.iter().enumerate() {
        let (_dir, path) = temp_journal();
        let sets = ScaleSets::open(&path).unwrap();
        let mut moved_by = 0;
        let mut rank = None;
        for (i, kind) in kinds.iter().enumerate() {
            let id = i as i64 + 1;
            let state = ScaleSetJobState::of_event(kind).unwrap();
            if ScaleSetJobState::moves(rank, false, state) {
                rank = Some(state);
                moved_by = id;
            }
            let at = 1_000 + id;
            sets.record_message(SET, &message(id, at, vec![event(kind, "j1")]))
                .unwrap();
        }
        let job = sets.job("j1").unwrap().unwrap();
        assert_eq!(job.state, end, "case {case}: {kinds:?}");
        assert_eq!(job.result.as_deref(), result, "case {case}");
        assert_eq!(
            job.message_id, moved_by,
            "case {case}: the message that moved it"
        );
        assert_eq!(job.first_seen, UnixMs::new(1_001), "case {case}");
        let runner = (end >= Started).then_some("rm-host-0001");
        assert_eq!(job.runner_name.as_deref(), runner, "case {case}");
        assert_eq!(job.repository, "acme/widgets");
        assert_eq!(job.labels, ["self-hosted", "linux"]);
        assert_eq!(job.unhandled, None);
    }
}

#[test]
fn a_completion_again_records_its_result_and_runner() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    let mut cancelled = event("JobCompleted", "j1");
    cancelled.result = Some("canceled".to_owned());
    cancelled.runner_name = None;
    sets.record_message(SET, &message(1, 10, vec![cancelled]))
        .unwrap();
    let job = sets.job("j1").unwrap().unwrap();
    assert_eq!(job.result.as_deref(), Some("canceled"));
    assert_eq!(job.runner_name, None);
    sets.record_message(SET, &message(2, 20, vec![event("JobCompleted", "j1")]))
        .unwrap();
    let job = sets.job("j1").unwrap().unwrap();
    assert_eq!(job.result.as_deref(), Some("succeeded"));
    assert_eq!(job.runner_name.as_deref(), Some("rm-host-0001"));
    assert_eq!(job.message_id, 2);
    assert_eq!(job.updated_at, UnixMs::new(20));
}

#[test]
fn null_statistics_keep_the_last_known() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    // From the session create, before any message.
    sets.record_statistics(SET, &stats(5), UnixMs::new(100))
        .unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.statistics, Some(stats(5)));
    assert_eq!(record.statistics_at, Some(UnixMs::new(100)));

    sets.record_message(SET, &message(1, 200, vec![event("JobAssigned", "j1")]))
        .unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.statistics, Some(stats(1)));
    assert_eq!(record.statistics_at, Some(UnixMs::new(200)));

    let mut null = message(2, 300, vec![event("JobStarted", "j1")]);
    null.statistics = None;
    assert_eq!(
        sets.record_message(SET, &null).unwrap(),
        MessageRecorded::New
    );
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(
        record.statistics,
        Some(stats(1)),
        "null keeps the last known"
    );
    assert_eq!(record.statistics_at, Some(UnixMs::new(200)));
    assert_eq!(record.last_message_at, Some(UnixMs::new(300)));
    assert_eq!(record.messages, 2);
}

/// The files as a crash would leave them: the database and its WAL copied while connections
/// are open and a transaction is in flight (nothing closed, nothing checkpointed). SQLite
/// rebuilds the shared-memory index from the WAL on open, as after a crash.
fn crash_image(path: &std::path::Path, into: &std::path::Path) -> PathBuf {
    let image = into.join(JOURNAL_FILE);
    std::fs::copy(path, &image).unwrap();
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let mut image_wal = image.as_os_str().to_owned();
    image_wal.push("-wal");
    std::fs::copy(wal, image_wal).unwrap();
    image
}

#[test]
fn a_crash_between_two_messages_loses_nothing() {
    let (_dir, path) = temp_journal();
    let after_crash = tempfile::tempdir().unwrap();
    let sets = ScaleSets::open(&path).unwrap();
    sets.record_session(SET, 42, Some("session-1"), UnixMs::new(5))
        .unwrap();
    sets.record_message(SET, &message(1, 10, vec![event("JobAssigned", "j1")]))
        .unwrap();
    // The second message is half written when the process dies: its transaction began, wrote,
    // and never committed.
    let dying = Connection::open(&path).unwrap();
    dying.execute_batch("BEGIN IMMEDIATE").unwrap();
    dying
        .execute(
            "UPDATE scale_sets SET last_message_id = 2, messages = messages + 1",
            [],
        )
        .unwrap();
    dying
        .execute(
            "UPDATE scale_set_jobs SET state = 'started', message_id = 2",
            [],
        )
        .unwrap();
    let image = crash_image(&path, after_crash.path());
    drop(dying);
    drop(sets);

    let sets = ScaleSets::open(&image).unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.last_message_id, 1);
    assert_eq!(record.messages, 1);
    assert_eq!(record.scale_set_id, Some(42));
    assert_eq!(record.session_id.as_deref(), Some("session-1"));
    assert_eq!(record.statistics, Some(stats(1)));
    let job = sets.job("j1").unwrap().unwrap();
    assert_eq!(job.state, ScaleSetJobState::Assigned);
    assert_eq!(job.message_id, 1);
    // GitHub redelivers both, neither having been acknowledged.
    assert_eq!(
        sets.record_message(SET, &message(1, 30, vec![event("JobAssigned", "j1")]))
            .unwrap(),
        MessageRecorded::AlreadyJournalled
    );
    assert_eq!(
        sets.record_message(SET, &message(2, 31, vec![event("JobStarted", "j1")]))
            .unwrap(),
        MessageRecorded::New
    );
    assert_eq!(
        sets.job("j1").unwrap().unwrap().state,
        ScaleSetJobState::Started
    );
}

#[test]
fn events_that_cannot_be_handled_are_kept_and_never_fail_their_message() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    let events = vec![
        event("JobAssigned", "j1"),
        event("JobTeleported", "j1"),
        event("JobTeleported", "j2"),
        event("JobStarted", ""),
        event("JobAssigned", "j3"),
    ];
    assert_eq!(
        sets.record_message(SET, &message(1, 10, events)).unwrap(),
        MessageRecorded::New
    );
    // A known job keeps its state and says what was not handled.
    let j1 = sets.job("j1").unwrap().unwrap();
    assert_eq!(j1.state, ScaleSetJobState::Assigned);
    assert!(
        j1.unhandled.as_deref().unwrap().contains("JobTeleported"),
        "{j1:?}"
    );
    // A job first seen through an unknown kind is kept, at the lowest state.
    let j2 = sets.job("j2").unwrap().unwrap();
    assert_eq!(j2.state, ScaleSetJobState::Available);
    assert!(j2.unhandled.as_deref().unwrap().contains("JobTeleported"));
    // The events around them were applied.
    assert_eq!(
        sets.job("j3").unwrap().unwrap().state,
        ScaleSetJobState::Assigned
    );
    // The event without a job is counted on the message; all five are kept for audit.
    let conn = Connection::open(&path).unwrap();
    let (count, unhandled, events): (i64, i64, String) = conn
        .query_row(
            "SELECT event_count, unhandled, events FROM scale_set_messages WHERE message_id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((count, unhandled), (5, 1));
    let kept: Vec<JobEvent> = serde_json::from_str(&events).unwrap();
    assert_eq!(kept.len(), 5);
    assert_eq!(kept[1].kind, "JobTeleported");
    // A later known event still moves the job.
    sets.record_message(SET, &message(2, 20, vec![event("JobStarted", "j2")]))
        .unwrap();
    assert_eq!(
        sets.job("j2").unwrap().unwrap().state,
        ScaleSetJobState::Started
    );
}

#[test]
fn a_message_of_an_unknown_type_is_kept_counted_and_applies_nothing() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    sets.record_statistics(SET, &stats(3), UnixMs::new(1))
        .unwrap();
    let mut odd = message(7, 10, vec![event("JobAssigned", "j1")]);
    odd.unknown_type = Some("RunnerScaleSetSomethingNew".to_owned());
    odd.statistics = Some(stats(99));
    assert_eq!(
        sets.record_message(SET, &odd).unwrap(),
        MessageRecorded::New
    );
    assert_eq!(sets.job("j1").unwrap(), None);
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.statistics, Some(stats(3)));
    assert_eq!(record.messages, 1);
    assert_eq!(
        record.last_message_id, 7,
        "acknowledged and passed, like any other"
    );
    let kept: Option<String> = Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT unknown_type FROM scale_set_messages WHERE message_id = 7",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kept.as_deref(), Some("RunnerScaleSetSomethingNew"));
    assert_eq!(
        sets.record_message(SET, &odd).unwrap(),
        MessageRecorded::AlreadyJournalled
    );
}

#[test]
fn a_lower_message_id_not_yet_journalled_is_journalled_and_the_cursor_stays() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    sets.record_message(SET, &message(50, 10, vec![])).unwrap();
    assert_eq!(
        sets.record_message(SET, &message(3, 20, vec![event("JobAssigned", "j1")]))
            .unwrap(),
        MessageRecorded::New
    );
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.last_message_id, 50);
    assert_eq!(record.messages, 2);
    assert!(sets.job("j1").unwrap().is_some());
}

#[test]
fn reset_cursor_remembers_the_new_id_and_numbers_messages_anew() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    sets.record_session(SET, 42, Some("old-session"), UnixMs::new(1))
        .unwrap();
    sets.record_message(SET, &message(1, 10, vec![event("JobAssigned", "j1")]))
        .unwrap();
    sets.record_message(SET, &message(2, 20, vec![event("JobStarted", "j1")]))
        .unwrap();

    sets.reset_cursor(SET, 43, UnixMs::new(30)).unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.scale_set_id, Some(43));
    assert_eq!(record.last_message_id, 0);
    assert_eq!(record.generation, 1);
    assert_eq!(
        record.session_id, None,
        "the old set's session died with it"
    );
    assert_eq!(record.messages, 2, "history stays");
    assert_eq!(record.statistics, Some(stats(1)), "the last known stays");
    assert!(sets.job("j1").unwrap().is_some(), "jobs stay");

    // The re-created set starts its ids again: message 1 is a new message, not a redelivery.
    assert_eq!(
        sets.record_message(SET, &message(1, 40, vec![event("JobAssigned", "j9")]))
            .unwrap(),
        MessageRecorded::New
    );
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.last_message_id, 1);
    assert_eq!(record.messages, 3);
    assert!(sets.job("j9").unwrap().is_some());
    assert_eq!(
        sets.record_message(SET, &message(1, 50, vec![])).unwrap(),
        MessageRecorded::AlreadyJournalled
    );

    // A session the listener recorded for the new id before resetting is kept.
    sets.record_session(SET, 44, Some("new-session"), UnixMs::new(60))
        .unwrap();
    sets.reset_cursor(SET, 44, UnixMs::new(61)).unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.session_id.as_deref(), Some("new-session"));
    assert_eq!(record.generation, 2);
}

#[test]
fn a_session_is_recorded_and_cleared() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    assert_eq!(sets.get(SET).unwrap(), None);
    sets.record_session(SET, 42, Some("session-1"), UnixMs::new(10))
        .unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.scale_set_id, Some(42));
    assert_eq!(record.session_id.as_deref(), Some("session-1"));
    assert_eq!(record.last_message_id, 0);
    assert_eq!(record.messages, 0);
    // A successor reads it from the file to delete the stale session.
    drop(sets);
    let sets = ScaleSets::open(&path).unwrap();
    assert_eq!(
        sets.get(SET).unwrap().unwrap().session_id.as_deref(),
        Some("session-1")
    );
    sets.record_session(SET, 42, None, UnixMs::new(20)).unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.session_id, None);
    assert_eq!(record.scale_set_id, Some(42));
}

#[test]
fn a_note_is_recorded_and_cleared() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    let waiting = "waiting: another listener holds the session";
    sets.record_note(SET, Some(waiting), UnixMs::new(10))
        .unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.note.as_deref(), Some(waiting));
    assert_eq!(record.note_at, Some(UnixMs::new(10)));
    sets.record_note(SET, None, UnixMs::new(20)).unwrap();
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!((record.note, record.note_at), (None, None));
}

#[test]
fn the_reads_list_scale_sets_by_name_and_jobs_newest_first() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    sets.record_message("b", &message(1, 10, vec![event("JobAssigned", "b1")]))
        .unwrap();
    sets.record_message("a", &message(1, 20, vec![event("JobAssigned", "a1")]))
        .unwrap();
    sets.record_message("b", &message(2, 30, vec![event("JobAssigned", "b2")]))
        .unwrap();
    sets.record_message("a", &message(2, 40, vec![event("JobStarted", "a1")]))
        .unwrap();
    let names: Vec<String> = sets.all().unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["a", "b"]);
    let ids = |rows: Vec<ScaleSetJobRow>| rows.into_iter().map(|r| r.job_id).collect::<Vec<_>>();
    assert_eq!(ids(sets.jobs(None, 10).unwrap()), ["a1", "b2", "b1"]);
    assert_eq!(ids(sets.jobs(None, 2).unwrap()), ["a1", "b2"]);
    assert_eq!(ids(sets.jobs(Some("b"), 10).unwrap()), ["b2", "b1"]);
    let a1 = sets.job("a1").unwrap().unwrap();
    assert_eq!(a1.scale_set, "a");
    assert_eq!(a1.runner_request_id, 77);
    assert_eq!(a1.workflow_run_id, Some(900));
    assert_eq!(sets.job("nope").unwrap(), None);
}

#[test]
fn prune_removes_old_messages_and_completed_jobs_and_never_a_scale_set() {
    let (_dir, path) = temp_journal();
    let sets = ScaleSets::open(&path).unwrap();
    sets.record_message(
        SET,
        &message(
            1,
            10,
            vec![
                event("JobCompleted", "done-old"),
                event("JobStarted", "running-old"),
            ],
        ),
    )
    .unwrap();
    sets.record_message(
        SET,
        &message(2, 100, vec![event("JobCompleted", "done-new")]),
    )
    .unwrap();
    // The journal's retention (`retention::prune_step`) owns pruning: messages are kept as long
    // as delivery rows, completed jobs as long as finished jobs. Both cut at 50 here: one
    // message and one completed job are older.
    let prune = |cut: i64| {
        let now = 1_000_000_i64;
        let keep = std::time::Duration::from_millis(u64::try_from(now - cut).unwrap());
        let retention = Retention {
            delivery_rows: keep,
            finished_jobs: keep,
            ..Retention::default()
        };
        let mut conn = Connection::open(&path).unwrap();
        while crate::retention::prune_step(&mut conn, &retention, UnixMs::new(now)).unwrap() {}
    };
    prune(50);
    assert_eq!(sets.job("done-old").unwrap(), None);
    assert!(sets.job("running-old").unwrap().is_some(), "not completed");
    assert!(sets.job("done-new").unwrap().is_some(), "too recent");
    let record = sets.get(SET).unwrap().unwrap();
    assert_eq!(record.last_message_id, 2);
    assert_eq!(
        record.messages, 2,
        "the count is of every message journalled"
    );
    assert_eq!(
        sets.record_message(SET, &message(2, 110, vec![])).unwrap(),
        MessageRecorded::AlreadyJournalled,
        "a kept message is still recognised"
    );
    // Even with everything gone, the scale set's row stays.
    prune(999_999);
    assert_eq!(
        sets.jobs(None, 10).unwrap().len(),
        1,
        "only the running job"
    );
    assert!(sets.get(SET).unwrap().is_some());
    assert!(sets.job("running-old").unwrap().is_some());
}

#[test]
fn the_store_keeps_scale_sets_in_the_host_s_file_in_a_fleet_too() {
    let (_dir, path) = temp_journal();
    // A database nobody listens on: the scale sets never connect to it.
    let target = PgTarget::parse("postgres://rm@127.0.0.1:1/rm").unwrap();
    let store = Store::open(path.clone(), Some(target));
    let sets = store.scale_sets().unwrap();
    sets.record_session(SET, 42, Some("session-1"), UnixMs::new(1))
        .unwrap();
    drop(sets);
    let sets = ScaleSets::open(&path).unwrap();
    assert_eq!(sets.get(SET).unwrap().unwrap().scale_set_id, Some(42));
}

#[test]
fn the_read_only_handle_reads_and_never_creates_or_writes() {
    let (_dir, path) = temp_journal();
    assert!(matches!(
        ScaleSets::open_read_only(&path),
        Err(JournalError::Missing(_))
    ));
    assert!(!path.exists(), "a reader created the journal");
    ScaleSets::open(&path)
        .unwrap()
        .record_message(SET, &message(1, 10, vec![event("JobAssigned", "a")]))
        .unwrap();
    let reader = ScaleSets::open_read_only(&path).unwrap();
    assert_eq!(reader.get(SET).unwrap().unwrap().last_message_id, 1);
    assert!(
        reader.record_note(SET, Some("x"), UnixMs::new(20)).is_err(),
        "a reader wrote"
    );
}
