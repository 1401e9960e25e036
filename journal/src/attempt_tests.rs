//! Runner attempt tests on a real SQLite file: the state graph, every compare-and-set, the
//! workspace fence, the counts allocation reads, the CLI listing and retention.

use std::path::{Path, PathBuf};

use rm_vocab::UnixMs;
use rusqlite::Connection;

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

/// Creates an ephemeral attempt of `policy` with a workspace named after its id.
fn create(attempts: &Attempts, id: &AttemptId, policy: &str, at_ms: i64) -> AttemptRecord {
    let dir = PathBuf::from(format!("/runners/{}", id.short()));
    attempts
        .create(&NewAttempt {
            attempt_id: id,
            policy,
            runner_name: &id.runner_name("host"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &dir,
            created_at_ms: UnixMs::new(at_ms),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: None,
            shape: None,
        })
        .unwrap()
}

/// Walks an attempt to `state` along the main line.
fn walk_to(attempts: &Attempts, id: &AttemptId, state: AttemptState) {
    use AttemptState::*;
    let steps: &[AttemptState] = match state {
        Allocated => &[],
        JitReceived => &[JitReceived],
        Starting => &[JitReceived, Starting],
        Idle => &[JitReceived, Starting, Idle],
        Busy => &[JitReceived, Starting, Idle, Busy],
        Finished | Failed | Orphaned => &[JitReceived, Starting, Idle, Busy, state],
        Cleaned => &[JitReceived, Starting, Idle, Busy, Finished, Cleaned],
    };
    for (i, step) in steps.iter().enumerate() {
        let at = 100 + i as i64;
        let won = match step {
            JitReceived => attempts.jit_received(id, RunnerId::new(7), UnixMs::new(at)),
            Starting => attempts.started(id, 4242, 1234, UnixMs::new(at)),
            Idle => attempts.mark_idle(id, Starting, UnixMs::new(at)),
            Busy => attempts.mark_busy(id, None, UnixMs::new(at)),
            Finished => attempts.conclude(
                id,
                Busy,
                AttemptOutcome::CompletedJob,
                None,
                None,
                UnixMs::new(at),
            ),
            Failed => attempts.conclude(
                id,
                Busy,
                AttemptOutcome::Failed,
                Some("process_exited_unexpectedly"),
                None,
                UnixMs::new(at),
            ),
            Orphaned => attempts.conclude(
                id,
                Busy,
                AttemptOutcome::Orphaned,
                None,
                None,
                UnixMs::new(at),
            ),
            Cleaned => attempts.mark_cleaned(id, UnixMs::new(at)),
            Allocated => unreachable!(),
        }
        .unwrap();
        assert!(won, "{step:?}");
    }
    assert_eq!(attempts.get(id).unwrap().unwrap().state, state);
}

#[test]
fn the_state_graph_is_exactly_the_lifecycle() {
    use AttemptState::*;
    // Row: from; columns: to, in `AttemptState::ALL` order.
    let expected: [(AttemptState, [u8; 9]); 9] = [
        //            al ji st id bu fi fa or cl
        (Allocated, [0, 1, 0, 0, 0, 0, 1, 1, 0]),
        (JitReceived, [0, 0, 1, 0, 0, 1, 1, 1, 0]),
        (Starting, [0, 0, 0, 1, 1, 1, 1, 1, 0]),
        (Idle, [0, 0, 0, 0, 1, 1, 1, 1, 0]),
        (Busy, [0, 0, 0, 1, 0, 1, 1, 1, 0]),
        (Finished, [0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (Failed, [0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (Orphaned, [0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (Cleaned, [0, 0, 0, 0, 0, 0, 0, 0, 0]),
    ];
    for (from, row) in expected {
        for (to, allowed) in AttemptState::ALL.into_iter().zip(row) {
            assert_eq!(
                AttemptState::can_move(from, to),
                allowed == 1,
                "{from:?} -> {to:?}"
            );
        }
    }
    // Failure and orphaning end any live state; cleaning only follows a conclusion.
    for state in AttemptState::ALL {
        assert_eq!(
            AttemptState::can_move(state, Failed),
            state.counts_against_capacity()
        );
        assert_eq!(AttemptState::can_move(state, Cleaned), state.is_terminal());
        assert_eq!(AttemptState::parse(state.as_str()), Some(state));
    }
    let live: Vec<_> = AttemptState::ALL
        .into_iter()
        .filter(|s| s.counts_against_capacity())
        .collect();
    assert_eq!(live, vec![Allocated, JitReceived, Starting, Idle, Busy]);
    // Every outcome lands in a terminal state the graph can reach it from some live state.
    for outcome in AttemptOutcome::ALL {
        assert!(outcome.terminal_state().is_terminal());
        assert_eq!(AttemptOutcome::parse(outcome.as_str()), Some(outcome));
    }
    assert!(!AttemptOutcome::IdleExit.is_failure());
    assert!(!AttemptOutcome::CompletedJob.is_failure());
    assert!(AttemptOutcome::Failed.is_failure() && AttemptOutcome::Orphaned.is_failure());
}

#[test]
fn attempt_ids_name_the_runner_and_refuse_anything_else() {
    let a = AttemptId::generate();
    let b = AttemptId::generate();
    assert_ne!(a, b);
    assert_eq!(AttemptId::parse(a.as_str()).unwrap(), a);
    assert_eq!(a.as_str().len(), ATTEMPT_ID_LEN);
    let fixed = AttemptId::parse("0123456789abcdef0123456789abcdef").unwrap();
    assert_eq!(fixed.short(), "0123456789ab");
    assert_eq!(
        fixed.runner_name("builder-01"),
        "rm-builder-01-0123456789ab"
    );
    for bad in [
        "",
        "0123456789ABCDEF0123456789ABCDEF",
        "0123456789abcdef0123456789abcde",
        "0123456789abcdef0123456789abcdefa",
        "0123456789abcdef-123456789abcdef",
        "0123456789abcdeg0123456789abcdef",
    ] {
        assert!(
            matches!(AttemptId::parse(bad), Err(AttemptError::InvalidId(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn an_attempt_walks_every_state_and_keeps_what_each_step_recorded() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(1);
    let created = create(&attempts, &a, "linux", 10);
    assert_eq!(created.state, AttemptState::Allocated);
    assert_eq!(created.runner_name, "rm-host-010000000000");
    assert_eq!(created.runtime_dir, Path::new("/runners/010000000000"));
    assert_eq!(
        (
            created.created_at_ms.get(),
            created.updated_at_ms.get(),
            created.state_changed_at_ms.get()
        ),
        (10, 10, 10)
    );
    assert_eq!(created.outcome, None);

    assert!(
        attempts
            .jit_received(&a, RunnerId::new(55), UnixMs::new(20))
            .unwrap()
    );
    assert!(attempts.started(&a, 999, 31337, UnixMs::new(30)).unwrap());
    assert!(
        attempts
            .mark_idle(&a, AttemptState::Starting, UnixMs::new(40))
            .unwrap()
    );
    assert!(
        attempts
            .mark_busy(&a, Some(JobId::new(8001)), UnixMs::new(50))
            .unwrap()
    );
    let busy = attempts.get(&a).unwrap().unwrap();
    assert_eq!(busy.runner_id, Some(RunnerId::new(55)));
    assert_eq!(busy.pid, Some(999));
    assert_eq!(busy.pid_start_time, Some(31337));
    assert_eq!(busy.job_id, Some(JobId::new(8001)));
    assert_eq!(
        (busy.state_changed_at_ms.get(), busy.updated_at_ms.get()),
        (50, 50)
    );

    assert!(
        attempts
            .conclude(
                &a,
                AttemptState::Busy,
                AttemptOutcome::CompletedJob,
                None,
                None,
                UnixMs::new(60)
            )
            .unwrap()
    );
    assert!(attempts.mark_cleaned(&a, UnixMs::new(70)).unwrap());
    let done = attempts.get(&a).unwrap().unwrap();
    assert_eq!(done.state, AttemptState::Cleaned);
    assert_eq!(done.outcome, Some(AttemptOutcome::CompletedJob));
    assert_eq!(
        (done.runner_id, done.job_id),
        (Some(RunnerId::new(55)), Some(JobId::new(8001)))
    );
    assert_eq!(done.state_changed_at_ms.get(), 70);
    assert_eq!(done.created_at_ms.get(), 10);
    assert_eq!(
        attempts.by_runner_name("rm-host-010000000000").unwrap(),
        Some(done)
    );
    assert_eq!(
        attempts.by_runner_name("rm-host-ffffffffffff").unwrap(),
        None
    );
}

#[test]
fn a_transition_only_wins_from_its_predecessors() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(2);
    create(&attempts, &a, "linux", 1);
    // Not yet: no JIT, no process.
    assert!(!attempts.started(&a, 1, 5, UnixMs::new(2)).unwrap());
    assert!(
        !attempts
            .mark_idle(&a, AttemptState::Starting, UnixMs::new(2))
            .unwrap()
    );
    assert!(
        !attempts
            .mark_busy(&a, Some(JobId::new(3)), UnixMs::new(2))
            .unwrap()
    );
    assert!(!attempts.mark_cleaned(&a, UnixMs::new(2)).unwrap());
    assert!(
        attempts
            .jit_received(&a, RunnerId::new(7), UnixMs::new(3))
            .unwrap()
    );
    // Twice is once.
    assert!(
        !attempts
            .jit_received(&a, RunnerId::new(7), UnixMs::new(4))
            .unwrap()
    );
    let row = attempts.get(&a).unwrap().unwrap();
    assert_eq!(
        (row.state, row.state_changed_at_ms.get()),
        (AttemptState::JitReceived, 3)
    );
    // An unknown attempt wins nothing.
    assert!(
        !attempts
            .jit_received(&id(99), RunnerId::new(7), UnixMs::new(4))
            .unwrap()
    );
}

#[test]
fn two_writers_racing_for_one_transition_never_both_win() {
    let (_dir, path) = temp_journal();
    let first = Attempts::open(&path).unwrap();
    let second = Attempts::open(&path).unwrap();
    let a = id(3);
    create(&first, &a, "linux", 1);
    walk_to(&first, &a, AttemptState::Idle);
    // Supervision concludes an idle exit while the webhook path marks it busy: one wins.
    let concluded = first
        .conclude(
            &a,
            AttemptState::Idle,
            AttemptOutcome::IdleExit,
            None,
            None,
            UnixMs::new(200),
        )
        .unwrap();
    let busy = second
        .mark_busy(&a, Some(JobId::new(5)), UnixMs::new(201))
        .unwrap();
    assert!(concluded && !busy);

    // The other order: busy first, and the conclusion decided on `idle` loses.
    let b = id(4);
    create(&first, &b, "linux", 1);
    walk_to(&first, &b, AttemptState::Idle);
    assert!(
        second
            .mark_busy(&b, Some(JobId::new(6)), UnixMs::new(200))
            .unwrap()
    );
    assert!(
        !first
            .conclude(
                &b,
                AttemptState::Idle,
                AttemptOutcome::IdleExit,
                None,
                None,
                UnixMs::new(201)
            )
            .unwrap()
    );
    let row = first.get(&b).unwrap().unwrap();
    assert_eq!(
        (row.state, row.job_id),
        (AttemptState::Busy, Some(JobId::new(6)))
    );

    // Supervision saw a starting runner registered; the webhook marked it busy meanwhile: the
    // observation must not pull it back to idle. Made from `busy`, the same move is allowed.
    let c = id(9);
    create(&first, &c, "linux", 1);
    walk_to(&first, &c, AttemptState::Starting);
    assert!(
        second
            .mark_busy(&c, Some(JobId::new(7)), UnixMs::new(200))
            .unwrap()
    );
    assert!(
        !first
            .mark_idle(&c, AttemptState::Starting, UnixMs::new(201))
            .unwrap()
    );
    assert_eq!(first.get(&c).unwrap().unwrap().state, AttemptState::Busy);
    assert!(
        first
            .mark_idle(&c, AttemptState::Busy, UnixMs::new(202))
            .unwrap()
    );
    // A later assignment replaces the withdrawn one.
    assert!(
        second
            .mark_busy(&c, Some(JobId::new(8)), UnixMs::new(203))
            .unwrap()
    );
    assert_eq!(first.get(&c).unwrap().unwrap().job_id, Some(JobId::new(8)));
    assert!(matches!(
        first.mark_idle(&c, AttemptState::Allocated, UnixMs::new(204)),
        Err(AttemptError::IllegalTransition { .. })
    ));
}

#[test]
fn a_conclusion_carries_its_outcome_reason_and_detail() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(5);
    create(&attempts, &a, "linux", 1);
    assert!(
        attempts
            .conclude(
                &a,
                AttemptState::Allocated,
                AttemptOutcome::Failed,
                Some("jit_request_failed"),
                Some("GitHub refused JIT registration with 403; check the App's runner permission"),
                UnixMs::new(9),
            )
            .unwrap()
    );
    let row = attempts.get(&a).unwrap().unwrap();
    assert_eq!(row.state, AttemptState::Failed);
    assert_eq!(row.outcome, Some(AttemptOutcome::Failed));
    assert_eq!(row.reason.as_deref(), Some("jit_request_failed"));
    assert!(row.detail.unwrap().contains("403"));
    // A conclusion asked from a state that cannot conclude is a caller bug, not a lost race.
    assert!(matches!(
        attempts.conclude(
            &a,
            AttemptState::Cleaned,
            AttemptOutcome::Failed,
            None,
            None,
            UnixMs::new(10)
        ),
        Err(AttemptError::IllegalTransition { .. })
    ));
    // Idle exits and completed jobs end `finished`, orphanings `orphaned`.
    for (n, outcome, state) in [
        (6, AttemptOutcome::IdleExit, AttemptState::Finished),
        (7, AttemptOutcome::CompletedJob, AttemptState::Finished),
        (8, AttemptOutcome::Orphaned, AttemptState::Orphaned),
    ] {
        let b = id(n);
        create(&attempts, &b, "linux", 1);
        walk_to(&attempts, &b, AttemptState::Busy);
        assert!(
            attempts
                .conclude(&b, AttemptState::Busy, outcome, None, None, UnixMs::new(5))
                .unwrap()
        );
        assert_eq!(attempts.get(&b).unwrap().unwrap().state, state);
    }
}

#[test]
fn a_stop_intent_is_only_journalled_in_the_state_it_was_decided_for() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(10);
    create(&attempts, &a, "linux", 1);
    walk_to(&attempts, &a, AttemptState::Starting);
    // Idle timeout does not apply to a runner that has not registered.
    assert!(
        !attempts
            .record_stop_intent(&a, StopIntent::IdleTimeout, UnixMs::new(5))
            .unwrap()
    );
    assert!(
        attempts
            .record_stop_intent(&a, StopIntent::RegistrationTimeout, UnixMs::new(6))
            .unwrap()
    );
    // Recorded again (a second signal): the first time is kept.
    assert!(
        attempts
            .record_stop_intent(&a, StopIntent::RegistrationTimeout, UnixMs::new(9))
            .unwrap()
    );
    let row = attempts.get(&a).unwrap().unwrap();
    assert_eq!(
        (row.stop_intent, row.stop_intent_at_ms.map(UnixMs::get)),
        (Some(StopIntent::RegistrationTimeout), Some(6))
    );

    // A runner that took a job after the idle decision is never licensed to be stopped.
    let b = id(11);
    create(&attempts, &b, "linux", 1);
    walk_to(&attempts, &b, AttemptState::Idle);
    assert!(
        attempts
            .mark_busy(&b, Some(JobId::new(1)), UnixMs::new(7))
            .unwrap()
    );
    assert!(
        !attempts
            .record_stop_intent(&b, StopIntent::IdleTimeout, UnixMs::new(8))
            .unwrap()
    );
    assert_eq!(attempts.get(&b).unwrap().unwrap().stop_intent, None);
    // Only its disk bound stops a busy runner, and it is read back as written (no CHECK).
    assert!(
        attempts
            .record_stop_intent(&b, StopIntent::DiskExceeded, UnixMs::new(9))
            .unwrap()
    );
    assert_eq!(
        attempts.get(&b).unwrap().unwrap().stop_intent,
        Some(StopIntent::DiskExceeded)
    );

    // A later intent replaces an earlier one, with its own time.
    let c = id(12);
    create(&attempts, &c, "linux", 1);
    walk_to(&attempts, &c, AttemptState::Starting);
    assert!(
        attempts
            .record_stop_intent(&c, StopIntent::RegistrationTimeout, UnixMs::new(5))
            .unwrap()
    );
    assert!(
        attempts
            .mark_idle(&c, AttemptState::Starting, UnixMs::new(6))
            .unwrap()
    );
    assert!(
        attempts
            .record_stop_intent(&c, StopIntent::IdleTimeout, UnixMs::new(7))
            .unwrap()
    );
    let row = attempts.get(&c).unwrap().unwrap();
    assert_eq!(
        (row.stop_intent, row.stop_intent_at_ms.map(UnixMs::get)),
        (Some(StopIntent::IdleTimeout), Some(7))
    );
    // `concluded` applies to concluded attempts only.
    assert!(
        !attempts
            .record_stop_intent(&c, StopIntent::Concluded, UnixMs::new(8))
            .unwrap()
    );
    assert!(
        attempts
            .conclude(
                &c,
                AttemptState::Idle,
                AttemptOutcome::IdleExit,
                None,
                None,
                UnixMs::new(9)
            )
            .unwrap()
    );
    assert!(
        attempts
            .record_stop_intent(&c, StopIntent::Concluded, UnixMs::new(10))
            .unwrap()
    );
}

#[test]
fn runner_and_job_ids_are_recorded_once_and_never_overwritten() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(20);
    create(&attempts, &a, "linux", 1);
    assert!(
        attempts
            .record_runner_id(&a, RunnerId::new(31), UnixMs::new(2))
            .unwrap()
    );
    assert!(
        !attempts
            .record_runner_id(&a, RunnerId::new(31), UnixMs::new(3))
            .unwrap()
    );
    assert!(matches!(
        attempts.record_runner_id(&a, RunnerId::new(32), UnixMs::new(3)),
        Err(AttemptError::Conflict {
            field: "runner_id",
            journalled: 31,
            offered: 32,
            ..
        })
    ));
    assert!(
        attempts
            .record_job(&a, JobId::new(900), UnixMs::new(4))
            .unwrap()
    );
    assert!(matches!(
        attempts.record_job(&a, JobId::new(901), UnixMs::new(4)),
        Err(AttemptError::Conflict {
            field: "job_id",
            ..
        })
    ));
    assert!(matches!(
        attempts.record_job(&id(21), JobId::new(1), UnixMs::new(4)),
        Err(AttemptError::Unknown(_))
    ));
    // A cleaned attempt takes nothing new.
    let b = id(22);
    create(&attempts, &b, "linux", 1);
    walk_to(&attempts, &b, AttemptState::Cleaned);
    assert!(
        !attempts
            .record_job(&b, JobId::new(5), UnixMs::new(9))
            .unwrap()
    );
    assert_eq!(attempts.get(&b).unwrap().unwrap().job_id, None);
}

#[test]
fn creating_refuses_duplicates_bad_names_and_an_occupied_workspace() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(30);
    create(&attempts, &a, "linux", 1);
    let dir = PathBuf::from("/elsewhere");
    let again = NewAttempt {
        attempt_id: &a,
        policy: "linux",
        runner_name: &a.runner_name("host"),
        workspace: WorkspaceKind::Ephemeral,
        runtime_dir: &dir,
        created_at_ms: UnixMs::new(2),
        isolation: IsolationKind::None,
        uid: None,
        cgroup: None,
        image: None,
        shape: None,
    };
    assert!(matches!(
        attempts.create(&again),
        Err(AttemptError::AlreadyJournalled { .. })
    ));
    for name in [
        "rm-host-ffffffffffff",
        "host-1f0000000000",
        "rm--1f0000000000",
        "rm-1f0000000000",
    ] {
        let other = id(31);
        let bad = NewAttempt {
            attempt_id: &other,
            runner_name: name,
            ..again.clone()
        };
        assert!(
            matches!(
                attempts.create(&bad),
                Err(AttemptError::InvalidRunnerName { .. })
            ),
            "{name}"
        );
    }

    // A persistent slot is held by its attempt until that attempt is cleaned.
    let slot = PathBuf::from("/runners/linux/s1");
    let first = id(40);
    let second = id(41);
    fn lease<'a>(
        attempt_id: &'a AttemptId,
        runner_name: &'a str,
        slot: &'a Path,
    ) -> NewAttempt<'a> {
        NewAttempt {
            attempt_id,
            policy: "linux",
            runner_name,
            workspace: WorkspaceKind::Persistent,
            runtime_dir: slot,
            created_at_ms: UnixMs::new(3),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: None,
            shape: None,
        }
    }
    let (first_name, second_name) = (first.runner_name("host"), second.runner_name("host"));
    attempts.create(&lease(&first, &first_name, &slot)).unwrap();
    assert!(matches!(
        attempts.create(&lease(&second, &second_name, &slot)),
        Err(AttemptError::WorkspaceInUse(p)) if p == slot
    ));
    // Concluded but not cleaned still holds it.
    assert!(
        attempts
            .conclude(
                &first,
                AttemptState::Allocated,
                AttemptOutcome::Failed,
                Some("jit_request_failed"),
                None,
                UnixMs::new(4)
            )
            .unwrap()
    );
    assert!(matches!(
        attempts.create(&lease(&second, &second_name, &slot)),
        Err(AttemptError::WorkspaceInUse(_))
    ));
    assert!(attempts.mark_cleaned(&first, UnixMs::new(5)).unwrap());
    let row = attempts
        .create(&lease(&second, &second_name, &slot))
        .unwrap();
    assert_eq!(row.workspace, WorkspaceKind::Persistent);
}

#[test]
fn live_counts_and_listings_follow_the_states() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    use AttemptState::*;
    let layout = [
        (50, "linux", Allocated),
        (51, "linux", Starting),
        (52, "linux", Busy),
        (53, "linux", Busy),
        (54, "linux", Failed),
        (55, "linux", Cleaned),
        (56, "gpu", Idle),
        (57, "gpu", Orphaned),
        (58, "retired", JitReceived),
    ];
    for (i, (n, policy, state)) in layout.iter().enumerate() {
        let a = id(*n);
        create(&attempts, &a, policy, i as i64);
        walk_to(&attempts, &a, *state);
    }
    let counts = attempts.live_counts().unwrap();
    assert_eq!(counts.host_live(), 6);
    assert_eq!(counts.policy("linux"), PolicyLive { live: 4, busy: 2 });
    assert_eq!(counts.policy("linux").unassigned(), 2);
    assert_eq!(counts.policy("gpu"), PolicyLive { live: 1, busy: 0 });
    // A policy no longer configured still holds a runner on this host.
    assert_eq!(counts.policy("retired").live, 1);
    assert_eq!(counts.policy("absent"), PolicyLive::default());

    let ids = |scope, policy| -> Vec<String> {
        attempts
            .list(scope, policy)
            .unwrap()
            .iter()
            .map(|a| a.attempt_id.short().to_owned())
            .collect()
    };
    assert_eq!(ids(Scope::All, None).len(), 9);
    assert_eq!(
        ids(Scope::Live, Some("linux")),
        vec![
            "320000000000",
            "330000000000",
            "340000000000",
            "350000000000"
        ]
    );
    assert_eq!(
        ids(Scope::Uncleaned, Some("linux")),
        vec![
            "320000000000",
            "330000000000",
            "340000000000",
            "350000000000",
            "360000000000"
        ]
    );
    assert_eq!(ids(Scope::Uncleaned, None).len(), 8);
    assert_eq!(ids(Scope::Live, Some("gpu")), vec!["380000000000"]);

    let reader = Reader::open(&path).unwrap();
    let listed = reader.attempts(3).unwrap();
    // Newest first, as `rm-agent runners` shows them.
    let names: Vec<_> = listed.iter().map(|a| a.runner_name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "rm-host-3a0000000000",
            "rm-host-390000000000",
            "rm-host-380000000000"
        ]
    );
    let counts = reader.attempt_counts().unwrap();
    assert!(counts.contains(&("busy".to_owned(), 2)));
    assert!(counts.contains(&("cleaned".to_owned(), 1)));
}

#[test]
fn capacity_reads_use_the_live_index_and_the_fence_is_an_index() {
    let (_dir, path) = temp_journal();
    drop(Attempts::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    let live_filter = format!(
        "state IN ({})",
        AttemptState::LIVE
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let plan: Vec<String> = conn
        .prepare(&format!(
            "EXPLAIN QUERY PLAN SELECT policy, COUNT(*) FROM attempts WHERE {live_filter}
             GROUP BY policy"
        ))
        .unwrap()
        .query_map([], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(plan.iter().any(|p| p.contains("attempts_live")), "{plan:?}");
}

#[test]
fn the_schema_itself_refuses_inconsistent_rows() {
    let (_dir, path) = temp_journal();
    drop(Attempts::open(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    let insert = |id: &str, name: &str, state: &str, outcome: Option<&str>| {
        conn.execute(
            "INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
                 state_changed_at, outcome, created_at, updated_at)
             VALUES (?1, 'p', ?2, 'ephemeral', ?1, ?3, 1, ?4, 1, 1)",
            rusqlite::params![id, name, state, outcome],
        )
    };
    let good = "0123456789abcdef0123456789abcdef";
    let name = "rm-h-0123456789ab";
    for (id, name, state, outcome) in [
        // A live attempt has no outcome; a concluded one must.
        (good, name, "busy", Some("completed_job")),
        (good, name, "finished", None),
        (good, name, "cleaned", None),
        // An outcome must match its terminal state.
        (good, name, "failed", Some("idle_exit")),
        (good, name, "finished", Some("orphaned")),
        // Unknown words.
        (good, name, "running", None),
        (good, name, "failed", Some("crashed")),
        // The id and the runner name.
        (
            "0123456789ABCDEF0123456789ABCDEF",
            "rm-h-0123456789AB",
            "allocated",
            None,
        ),
        (good, "rm-h-ffffffffffff", "allocated", None),
        (good, "gh-h-0123456789ab", "allocated", None),
    ] {
        assert!(
            insert(id, name, state, outcome).is_err(),
            "{id} {name} {state} {outcome:?}"
        );
    }
    insert(good, name, "cleaned", Some("idle_exit")).unwrap();
    // An image is a sha256 digest in lowercase hex, or nothing.
    let image = |text: Option<&str>| {
        conn.execute(
            "UPDATE attempts SET image = ?2 WHERE attempt_id = ?1",
            rusqlite::params![good, text],
        )
    };
    let hex = "0123456789abcdef".repeat(4);
    for bad in [
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha512:{hex}"),
        format!("sha256:{}", &hex[1..]),
        format!("sha256:{hex}0"),
        format!("sha256:{}g", &hex[1..]),
        hex.clone(),
        String::new(),
    ] {
        assert!(image(Some(&bad)).is_err(), "{bad:?}");
    }
    image(Some(&format!("sha256:{hex}"))).unwrap();
    image(None).unwrap();
    // No column could hold a JIT configuration or a token.
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('attempts')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // v5 added `isolation` (a closed set), `uid` (a number) and `cgroup` (a path the agent
    // builds from the attempt id); v7 `started_at` and v12 `released_at` (times in ms); v13
    // `image` (a digest, checked below); v15 the shape (the job's own labels and device ids,
    // JSON arrays the schema checks, and numbers) and the usage (numbers and a time).
    assert_eq!(
        columns.len(),
        33,
        "a new column: check it cannot hold a secret"
    );
    for column in &columns {
        for word in ["jit", "config", "token", "secret"] {
            assert!(!column.contains(word), "{column}");
        }
    }
}

#[test]
fn retention_removes_only_attempts_cleaned_long_ago() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    const DAY: i64 = 24 * 3600 * 1000;
    let now = 100 * DAY;
    let old_cleaned = id(60);
    let old_failed = id(61);
    let old_busy = id(62);
    let fresh_cleaned = id(63);
    for a in [&old_cleaned, &old_failed, &old_busy, &fresh_cleaned] {
        create(&attempts, a, "linux", 1);
    }
    walk_to(&attempts, &old_cleaned, AttemptState::Cleaned);
    walk_to(&attempts, &old_failed, AttemptState::Failed);
    walk_to(&attempts, &old_busy, AttemptState::Busy);
    walk_to(&attempts, &fresh_cleaned, AttemptState::Finished);
    assert!(
        attempts
            .mark_cleaned(&fresh_cleaned, UnixMs::new(now - DAY))
            .unwrap()
    );
    drop(attempts);

    let mut conn = crate::connection::open_writer(&path).unwrap();
    while crate::retention::prune_step(&mut conn, &Retention::default(), rm_vocab::UnixMs::new(now))
        .unwrap()
    {}
    let mut left: Vec<_> = Reader::open(&path)
        .unwrap()
        .attempts(10)
        .unwrap()
        .into_iter()
        .map(|a| a.attempt_id)
        .collect();
    left.sort();
    assert_eq!(left, vec![old_failed, old_busy, fresh_cleaned]);
}

/// The group writer and the agent's attempt connection open the same file, possibly at once:
/// whichever migrates first, the others find the work done instead of failing.
#[test]
fn connections_opening_a_new_journal_at_once_all_succeed() {
    for _ in 0..5 {
        let (_dir, path) = temp_journal();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
        let opened: Vec<_> = (0..4)
            .map(|_| {
                let path = path.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    Attempts::open(&path).map(drop)
                })
            })
            .collect();
        for handle in opened {
            handle.join().unwrap().unwrap();
        }
        assert_eq!(
            Reader::open(&path).unwrap().integrity_check().unwrap(),
            vec!["ok"]
        );
    }
}

#[test]
fn the_boot_of_a_runner_identity_is_journalled_with_it() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let id = id(9);
    create(&attempts, &id, "p", 1);
    assert!(
        attempts
            .jit_received(&id, RunnerId::new(7), UnixMs::new(2))
            .unwrap()
    );
    assert!(
        attempts
            .started_on_boot(&id, 42, 4242, "boot-a", UnixMs::new(3))
            .unwrap()
    );
    let row = attempts.get(&id).unwrap().unwrap();
    assert_eq!(
        (row.pid, row.pid_start_time, row.pid_boot_id.as_deref()),
        (Some(42), Some(4242), Some("boot-a"))
    );
}

/// The uid fence: two uncleaned attempts never hold one runner uid; cleaning releases it, and
/// the backend, uid and cgroup read back as journalled.
#[test]
fn a_runner_uid_is_held_by_one_uncleaned_attempt_until_it_is_cleaned() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let new = |id: &AttemptId, dir: &Path, uid: u32| {
        attempts.create(&NewAttempt {
            attempt_id: id,
            policy: "linux",
            runner_name: &id.runner_name("host"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: dir,
            created_at_ms: UnixMs::new(1),
            isolation: IsolationKind::User,
            uid: Some(uid),
            cgroup: Some(Path::new("/sys/fs/cgroup/rm/rm-0100")),
            image: None,
            shape: None,
        })
    };
    let (a, b) = (id(1), id(2));
    let first = new(&a, Path::new("/runners/a"), 64200).unwrap();
    assert_eq!(first.isolation, IsolationKind::User);
    assert_eq!(first.uid, Some(64200));
    assert_eq!(
        first.cgroup.as_deref(),
        Some(Path::new("/sys/fs/cgroup/rm/rm-0100"))
    );
    assert!(matches!(
        new(&b, Path::new("/runners/b"), 64200),
        Err(AttemptError::UidInUse(64200))
    ));
    assert_eq!(attempts.held_uids().unwrap(), [64200]);
    // Concluded but not cleaned: still held (its processes may not be proven gone yet).
    assert!(
        attempts
            .conclude(
                &a,
                AttemptState::Allocated,
                AttemptOutcome::Failed,
                Some("x"),
                None,
                UnixMs::new(2)
            )
            .unwrap()
    );
    assert!(new(&b, Path::new("/runners/b"), 64200).is_err());
    assert!(attempts.mark_cleaned(&a, UnixMs::new(3)).unwrap());
    assert!(attempts.held_uids().unwrap().is_empty());
    assert_eq!(
        new(&b, Path::new("/runners/b"), 64200).unwrap().uid,
        Some(64200)
    );
    // An attempt journalled before v5 ran as the agent's own user.
    assert_eq!(
        create(&attempts, &id(3), "linux", 4).isolation,
        IsolationKind::None
    );
}

/// A concluded attempt released (its processes gone, its runtime removed) frees its uid at once
/// while it stays uncleaned for its registration: the next attempt may take the uid, the
/// release is written once and only for a concluded attempt, and the uid stays on its record.
#[test]
fn a_released_attempt_frees_its_uid_before_it_is_cleaned() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let new = |id: &AttemptId, uid: u32| {
        attempts.create(&NewAttempt {
            attempt_id: id,
            policy: "linux",
            runner_name: &id.runner_name("host"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &PathBuf::from(format!("/runners/{}", id.short())),
            created_at_ms: UnixMs::new(1),
            isolation: IsolationKind::User,
            uid: Some(uid),
            cgroup: None,
            image: None,
            shape: None,
        })
    };
    let (a, b) = (id(1), id(2));
    new(&a, 64200).unwrap();
    // A live attempt is never released: its runner may still run as the uid.
    walk_to(&attempts, &a, AttemptState::Busy);
    assert!(!attempts.mark_released(&a, UnixMs::new(5)).unwrap());
    assert_eq!(attempts.held_uids().unwrap(), [64200]);
    assert!(
        attempts
            .conclude(
                &a,
                AttemptState::Busy,
                AttemptOutcome::Failed,
                Some("disk_exceeded"),
                None,
                UnixMs::new(6)
            )
            .unwrap()
    );
    assert!(matches!(new(&b, 64200), Err(AttemptError::UidInUse(64200))));
    assert!(attempts.mark_released(&a, UnixMs::new(7)).unwrap());
    // Written once: a second release (a cleanup run again after a crash) changes nothing.
    assert!(!attempts.mark_released(&a, UnixMs::new(8)).unwrap());
    let released = attempts.get(&a).unwrap().unwrap();
    assert_eq!(released.state, AttemptState::Failed);
    assert_eq!(released.released_at_ms, Some(UnixMs::new(7)));
    assert_eq!(
        released.uid,
        Some(64200),
        "the record keeps which uid ran it"
    );
    assert!(attempts.held_uids().unwrap().is_empty());
    // Still uncleaned (its registration waits), and its uid already another runner's.
    let uncleaned = attempts.list(Scope::Uncleaned, None).unwrap();
    assert_eq!(uncleaned.len(), 1);
    assert_eq!(new(&b, 64200).unwrap().uid, Some(64200));
    assert_eq!(attempts.held_uids().unwrap(), [64200]);
    assert!(attempts.mark_cleaned(&a, UnixMs::new(9)).unwrap());
    assert!(!attempts.mark_released(&a, UnixMs::new(10)).unwrap());
}

fn image_id(fill: char) -> String {
    format!("sha256:{}", fill.to_string().repeat(64))
}

/// The image a runner ran is journalled with its attempt at creation, read back by every read
/// (by id, by runner name, the listings, the reader's) and still there after the file is opened
/// again; an attempt on the host's root has none.
#[test]
fn an_attempt_s_image_is_journalled_and_survives_reopening() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let (a, b) = (id(70), id(71));
    let image = image_id('a');
    let dir = PathBuf::from("/runners/a");
    let row = attempts
        .create(&NewAttempt {
            attempt_id: &a,
            policy: "linux",
            runner_name: &a.runner_name("host"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &dir,
            created_at_ms: UnixMs::new(1),
            isolation: IsolationKind::User,
            uid: Some(64_300),
            cgroup: None,
            image: Some(&image),
            shape: None,
        })
        .unwrap();
    assert_eq!(row.image.as_deref(), Some(image.as_str()));
    assert_eq!(create(&attempts, &b, "linux", 2).image, None);
    // The image is the attempt's for its whole life: a transition leaves it as it was.
    walk_to(&attempts, &a, AttemptState::Finished);
    drop(attempts);

    let attempts = Attempts::open(&path).unwrap();
    let read = attempts.get(&a).unwrap().unwrap();
    assert_eq!(read.state, AttemptState::Finished);
    assert_eq!(read.image.as_deref(), Some(image.as_str()));
    assert_eq!(
        attempts
            .by_runner_name(&a.runner_name("host"))
            .unwrap()
            .unwrap()
            .image,
        read.image
    );
    let listed: Vec<_> = attempts
        .list(Scope::All, None)
        .unwrap()
        .into_iter()
        .map(|r| (r.attempt_id, r.image))
        .collect();
    assert_eq!(
        listed,
        vec![(a.clone(), Some(image.clone())), (b.clone(), None)]
    );
    let reader = Reader::open(&path).unwrap();
    let mut images: Vec<_> = reader
        .attempts(10)
        .unwrap()
        .into_iter()
        .map(|r| (r.attempt_id, r.image))
        .collect();
    images.sort();
    assert_eq!(images, listed);
    assert_eq!(
        reader.uncleaned_attempts().unwrap()[0].image.as_deref(),
        Some(image.as_str())
    );
}

/// Only an image id is journalled: anything else is refused before the row is written.
#[test]
fn an_image_that_is_not_an_image_id_is_refused() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let a = id(72);
    let dir = PathBuf::from("/runners/b");
    let hex = "f".repeat(64);
    for bad in [
        "docker://debian:12".to_owned(),
        hex.clone(),
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha256:{}", &hex[1..]),
    ] {
        let refused = attempts.create(&NewAttempt {
            attempt_id: &a,
            policy: "linux",
            runner_name: &a.runner_name("host"),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: &dir,
            created_at_ms: UnixMs::new(1),
            isolation: IsolationKind::None,
            uid: None,
            cgroup: None,
            image: Some(&bad),
            shape: None,
        });
        assert!(
            matches!(&refused, Err(AttemptError::InvalidImage(text)) if *text == bad),
            "{bad:?}: {refused:?}"
        );
    }
    assert_eq!(attempts.get(&a).unwrap(), None);
}

#[test]
fn an_image_id_is_sha256_and_64_lowercase_hex() {
    let hex = "0123456789abcdef".repeat(4);
    for (text, ok) in [
        (format!("sha256:{hex}"), true),
        (image_id('0'), true),
        (format!("sha256:{}", hex.to_uppercase()), false),
        (format!("sha256:{}", &hex[2..]), false),
        (format!("sha256:{hex}ab"), false),
        (format!("sha384:{hex}"), false),
        (format!("SHA256:{hex}"), false),
        (format!("sha256:{}-", &hex[1..]), false),
        (hex.clone(), false),
        ("sha256:".to_owned(), false),
        (String::new(), false),
    ] {
        assert_eq!(crate::attempts::is_image_id(&text), ok, "{text:?}");
    }
}

/// What a runner asked for and reached under `policy.egress` is kept per attempt, replaced by
/// each flush, listed by policy and time, and goes with its attempt.
#[test]
fn an_attempt_s_egress_record_is_replaced_listed_and_goes_with_it() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let (a, b, c) = (id(80), id(81), id(82));
    create(&attempts, &a, "build", 10);
    create(&attempts, &b, "build", 20);
    create(&attempts, &c, "lint", 30);
    assert_eq!(attempts.egress(&a).unwrap(), None);
    attempts
        .write_egress(&a, r#"{"names":[]}"#, UnixMs::new(11))
        .unwrap();
    attempts
        .write_egress(&a, r#"{"names":[{"name":"x"}]}"#, UnixMs::new(12))
        .unwrap();
    attempts
        .write_egress(&b, r#"{"names":[]}"#, UnixMs::new(21))
        .unwrap();
    attempts
        .write_egress(&c, r#"{"names":[]}"#, UnixMs::new(31))
        .unwrap();
    assert_eq!(
        attempts.egress(&a).unwrap().as_deref(),
        Some(r#"{"names":[{"name":"x"}]}"#)
    );
    // Not JSON: refused by the table.
    assert!(attempts.write_egress(&a, "{", UnixMs::new(13)).is_err());
    // Of an attempt the journal does not have: refused.
    assert!(
        attempts
            .write_egress(&id(89), "{}", UnixMs::new(13))
            .is_err()
    );
    let reader = crate::Reader::open(&path).unwrap();
    assert_eq!(reader.egress(&a).unwrap(), attempts.egress(&a).unwrap());
    let listed: Vec<AttemptId> = reader
        .egress_of_policy("build", UnixMs::new(15))
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(listed, vec![b.clone()]);
    assert_eq!(
        reader
            .egress_of_policy("build", UnixMs::new(0))
            .unwrap()
            .len(),
        2
    );
    // An attempt removed (retention) takes its record with it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "foreign_keys", "ON").unwrap();
    conn.execute("DELETE FROM attempts WHERE attempt_id = ?1", [a.as_str()])
        .unwrap();
    let left: i64 = conn
        .query_row("SELECT count(*) FROM attempt_egress", [], |row| row.get(0))
        .unwrap();
    assert_eq!(left, 2);
}
