//! Re-run record tests on a real SQLite file: the state graph, every compare-and-set, one row
//! per job, the settling of an interrupted `sending` at start, and the reads `explain`,
//! `status`, `/metrics` and the agent's scan use.

use std::path::PathBuf;

use rm_vocab::UnixMs;

use crate::*;
use rm_vocab::{JobId, RunnerId};

fn temp_journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    (dir, path)
}

fn id(n: u8) -> AttemptId {
    AttemptId::parse(&format!("{n:02x}{}", "0".repeat(30))).unwrap()
}

/// A concluded attempt of `policy` that took `job` and ended with `outcome` and `reason`.
fn concluded(
    attempts: &Attempts,
    n: u8,
    job: i64,
    outcome: AttemptOutcome,
    reason: Option<&str>,
    at: i64,
) -> AttemptId {
    let id = id(n);
    let dir = PathBuf::from(format!("/runners/{}", id.short()));
    attempts
        .create(&NewAttempt {
            attempt_id: &id,
            policy: "linux",
            runner_name: &id.runner_name("host"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &dir,
            created_at_ms: UnixMs::new(at),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: None,
            shape: None,
        })
        .unwrap();
    assert!(
        attempts
            .jit_received(&id, RunnerId::new(7), UnixMs::new(at))
            .unwrap()
    );
    assert!(attempts.started(&id, 4242, 1234, UnixMs::new(at)).unwrap());
    assert!(
        attempts
            .mark_busy(&id, Some(JobId::new(job)), UnixMs::new(at))
            .unwrap()
    );
    assert!(
        attempts
            .conclude(
                &id,
                AttemptState::Busy,
                outcome,
                reason,
                None,
                UnixMs::new(at)
            )
            .unwrap()
    );
    id
}

fn intend(attempts: &Attempts, job: i64, attempt: &AttemptId, at: i64) -> bool {
    attempts
        .intend_rerun(
            &NewRerun {
                job_id: JobId::new(job),
                attempt_id: attempt,
                policy: "linux",
                reason: "runner_crashed",
                repository: "acme/widgets",
                run_id: 77,
                run_attempt: 1,
            },
            UnixMs::new(at),
        )
        .unwrap()
}

#[test]
fn the_state_graph_is_exactly_intended_sending_then_an_answer() {
    use RerunState::*;
    // Row: from; columns: to, in `RerunState::ALL` order (intended, sending, sent, refused,
    // unknown).
    let table: [(RerunState, [bool; 5]); 5] = [
        (Intended, [false, true, false, true, false]),
        (Sending, [true, false, true, true, true]),
        (Sent, [false; 5]),
        (Refused, [false; 5]),
        (Unknown, [false; 5]),
    ];
    for (from, row) in table {
        for (to, allowed) in RerunState::ALL.into_iter().zip(row) {
            assert_eq!(
                RerunState::can_move(from, to),
                allowed,
                "{from:?} -> {to:?}"
            );
        }
    }
    for state in RerunState::ALL {
        assert_eq!(RerunState::parse(state.as_str()), Some(state));
    }
    assert!(Intended.is_open() && Sending.is_open() && !Sent.is_open() && !Unknown.is_open());
}

#[test]
fn every_transition_is_a_compare_and_set_on_the_file() {
    use RerunState::*;
    // For every (from, to): a row walked to `from`, then moved to `to` as if from `from`.
    for from in RerunState::ALL {
        for to in RerunState::ALL {
            let (_dir, path) = temp_journal();
            let attempts = Attempts::open(&path).unwrap();
            let a = concluded(
                &attempts,
                1,
                10,
                AttemptOutcome::Failed,
                Some("oom_killed"),
                5,
            );
            assert!(intend(&attempts, 10, &a, 6));
            let walk: &[(RerunState, RerunState)] = match from {
                Intended => &[],
                Sending => &[(Intended, Sending)],
                Sent | Refused | Unknown => &[(Intended, Sending), (Sending, from)],
            };
            for (f, t) in walk {
                assert!(
                    attempts
                        .advance_rerun(JobId::new(10), *f, *t, None, UnixMs::new(7))
                        .unwrap()
                );
            }
            let moved =
                attempts.advance_rerun(JobId::new(10), from, to, Some("why"), UnixMs::new(8));
            let now = attempts.rerun_for_job(JobId::new(10)).unwrap().unwrap();
            if RerunState::can_move(from, to) {
                assert!(moved.unwrap(), "{from:?} -> {to:?}");
                assert_eq!(now.state, to);
                assert_eq!(now.detail.as_deref(), Some("why"));
                assert_eq!(now.updated_at_ms, UnixMs::new(8));
            } else {
                assert!(
                    matches!(moved, Err(AttemptError::IllegalTransition { .. })),
                    "{from:?} -> {to:?}: {moved:?}"
                );
                assert_eq!(now.state, from);
            }
        }
    }
}

#[test]
fn a_stale_compare_and_set_loses_and_only_one_sender_wins() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = concluded(
        &attempts,
        1,
        10,
        AttemptOutcome::Failed,
        Some("oom_killed"),
        5,
    );
    assert!(intend(&attempts, 10, &a, 6));
    let job = JobId::new(10);
    // Two senders of one intended row: only the first moves it to sending.
    let first = attempts.advance_rerun(
        job,
        RerunState::Intended,
        RerunState::Sending,
        None,
        UnixMs::new(7),
    );
    let second = attempts.advance_rerun(
        job,
        RerunState::Intended,
        RerunState::Sending,
        None,
        UnixMs::new(7),
    );
    assert!(first.unwrap());
    assert!(!second.unwrap());
    // No row: nothing moves.
    assert!(
        !attempts
            .advance_rerun(
                JobId::new(99),
                RerunState::Intended,
                RerunState::Sending,
                None,
                UnixMs::new(7)
            )
            .unwrap()
    );
}

#[test]
fn a_job_gets_one_row_whoever_decides_again() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = concluded(
        &attempts,
        1,
        10,
        AttemptOutcome::Failed,
        Some("oom_killed"),
        5,
    );
    let b = concluded(
        &attempts,
        2,
        10,
        AttemptOutcome::Failed,
        Some("runner_crashed"),
        5,
    );
    assert!(intend(&attempts, 10, &a, 6));
    assert!(
        !intend(&attempts, 10, &b, 7),
        "a second decision for the job"
    );
    let row = attempts.rerun_for_job(JobId::new(10)).unwrap().unwrap();
    assert_eq!(row.attempt_id, a.as_str());
    assert_eq!(row.state, RerunState::Intended);
    assert_eq!(row.created_at_ms, UnixMs::new(6));
    assert_eq!(attempts.intended_reruns().unwrap(), vec![row]);
}

#[test]
fn sending_found_at_start_becomes_unknown_and_is_never_offered_again() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    for (n, job) in [(1, 10), (2, 11), (3, 12)] {
        let a = concluded(
            &attempts,
            n,
            job,
            AttemptOutcome::Failed,
            Some("oom_killed"),
            5,
        );
        assert!(intend(&attempts, job, &a, 6));
    }
    // 10 was being sent when the agent died; 11 was answered; 12 was only decided.
    let (j10, j11, j12) = (JobId::new(10), JobId::new(11), JobId::new(12));
    use RerunState::*;
    assert!(
        attempts
            .advance_rerun(j10, Intended, Sending, None, UnixMs::new(7))
            .unwrap()
    );
    assert!(
        attempts
            .advance_rerun(j11, Intended, Sending, None, UnixMs::new(7))
            .unwrap()
    );
    assert!(
        attempts
            .advance_rerun(j11, Sending, Sent, None, UnixMs::new(8))
            .unwrap()
    );
    drop(attempts);

    let attempts = Attempts::open(&path).unwrap();
    assert_eq!(
        attempts.settle_interrupted_reruns(UnixMs::new(20)).unwrap(),
        vec![j10]
    );
    let settled = attempts.rerun_for_job(j10).unwrap().unwrap();
    assert_eq!(settled.state, Unknown);
    assert!(settled.detail.unwrap().contains("may have re-run"));
    // Only the decided one is still to send; the unknown one cannot be moved to sending.
    let open: Vec<JobId> = attempts
        .intended_reruns()
        .unwrap()
        .iter()
        .map(|r| r.job_id)
        .collect();
    assert_eq!(open, vec![j12]);
    assert!(
        attempts
            .advance_rerun(j10, Intended, Sending, None, UnixMs::new(21))
            .map(|won| !won)
            .unwrap()
    );
    assert!(
        attempts
            .settle_interrupted_reruns(UnixMs::new(22))
            .unwrap()
            .is_empty()
    );

    let reader = Reader::open(&path).unwrap();
    assert_eq!(
        reader.rerun_counts().unwrap(),
        RerunCounts {
            pending: 1,
            sent: 1,
            refused: 0,
            unknown: 1
        }
    );
    assert_eq!(
        reader.rerun_totals().unwrap(),
        vec![
            ("linux".into(), "runner_crashed".into(), Intended, 1),
            ("linux".into(), "runner_crashed".into(), Sent, 1),
            ("linux".into(), "runner_crashed".into(), Unknown, 1),
        ]
    );
    assert_eq!(reader.rerun_for_job(j11).unwrap().unwrap().state, Sent);
    assert_eq!(reader.rerun_for_job(JobId::new(404)).unwrap(), None);
}

#[test]
fn candidates_are_concluded_attempts_with_a_listed_reason_a_job_and_no_rerun() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let oom = concluded(
        &attempts,
        1,
        10,
        AttemptOutcome::Failed,
        Some("oom_killed"),
        100,
    );
    let _own = concluded(&attempts, 2, 11, AttemptOutcome::CompletedJob, None, 100);
    let _other = concluded(
        &attempts,
        3,
        12,
        AttemptOutcome::Failed,
        Some("disk_full"),
        100,
    );
    let _old = concluded(
        &attempts,
        4,
        13,
        AttemptOutcome::Failed,
        Some("oom_killed"),
        10,
    );
    let crashed = concluded(
        &attempts,
        5,
        14,
        AttemptOutcome::Orphaned,
        Some("runner_crashed"),
        100,
    );
    let reader = Reader::open(&path).unwrap();
    let ids = |since: i64, reasons: &[&str]| -> Vec<String> {
        reader
            .rerun_candidates(UnixMs::new(since), reasons)
            .unwrap()
            .into_iter()
            .map(|a| a.attempt_id.as_str().to_owned())
            .collect()
    };
    assert_eq!(
        ids(50, &["oom_killed", "runner_crashed"]),
        vec![oom.as_str().to_owned(), crashed.as_str().to_owned()]
    );
    assert!(ids(50, &[]).is_empty(), "no policy asks for re-runs");
    assert_eq!(
        ids(0, &["oom_killed"]).len(),
        2,
        "the old one is inside a wider window"
    );
    // Once the job has a row, its attempt is no candidate any more.
    assert!(intend(&attempts, 10, &oom, 120));
    assert_eq!(
        ids(50, &["oom_killed", "runner_crashed"]),
        vec![crashed.as_str().to_owned()]
    );
}
