//! The polling fallback's journal: polled sightings merge forward only beside deliveries, the
//! announcement of a job is dated whichever arrives first, and the scan's cursor, redelivery
//! requests and stale checks persist. Each test runs against both poll stores
//! (`polls::tests::sqlite::NAME`, `polls::tests::postgres::NAME`; see `crate::intake_tests`),
//! the deliveries going through that journal's own intake. Then the PostgreSQL-only race: two
//! hosts' pollers recording the same jobs at once.

use std::time::{Duration, Instant};

use ::postgres::{Client, NoTls};
use rm_handlers::JobObservation;
use rm_vocab::{JobState, Source};
use rusqlite::Connection;

use crate::intake_tests::{Backend, Postgres, Sqlite, job_delivery, off_runtime};
use crate::*;
use rm_vocab::JobId;
use rm_vocab::UnixMs;

/// A journal under test that can also open the poller's store on itself.
trait PollBackend: Backend {
    /// A new poll store (its own connection) on this journal.
    fn open_polls(&self) -> Polls;
    /// Runs `sql` on a connection of its own (rows the intake has no delivery for).
    fn execute(&self, sql: &str);
}

impl PollBackend for Sqlite {
    fn open_polls(&self) -> Polls {
        Polls(Some(Box::new(PollJournal::open(&self.path).unwrap())))
    }
    fn execute(&self, sql: &str) {
        Connection::open(&self.path)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
    }
}

impl PollBackend for Postgres {
    fn open_polls(&self) -> Polls {
        let url = self.db.url();
        Polls(Some(off_runtime(move || {
            Box::new(PgPollJournal::connect(&url).unwrap()) as Box<dyn PollStore>
        })))
    }
    fn execute(&self, sql: &str) {
        let url = self.db.url();
        off_runtime(move || {
            Client::connect(&url, NoTls)
                .unwrap()
                .batch_execute(sql)
                .unwrap();
        });
    }
}

/// A poll store whose every call (and drop) runs off the test's runtime, as the agent makes
/// them: the PostgreSQL client cannot block a runtime's thread.
struct Polls(Option<Box<dyn PollStore>>);

impl Polls {
    fn call<T: Send>(&mut self, f: impl FnOnce(&mut dyn PollStore) -> T + Send) -> T {
        let store = self.0.as_mut().unwrap();
        off_runtime(move || f(store.as_mut()))
    }
}

impl Drop for Polls {
    fn drop(&mut self) {
        let store = self.0.take();
        off_runtime(move || drop(store));
    }
}

fn delivery(guid: &str, job_id: i64, action: &str, at_ms: i64) -> Incoming {
    job_delivery(guid, job_id, action, at_ms)
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
        observed_at_ms: UnixMs::new(at_ms),
        source: Source::Poll,
    }
}

/// Instantiates each generic test `name<B: PollBackend>(backend: B)` as `sqlite::name` and
/// `postgres::name`.
macro_rules! polls_test {
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

polls_test!(
    a_polled_job_is_journalled_as_poll_and_announced_when_a_delivery_names_it,
    a_poll_never_moves_a_job_back_and_moves_it_forward_as_poll,
    sightings_are_answered_in_the_order_given,
    stale_queued_jobs_are_listed_never_checked_first_and_rotate_once_checked,
    a_repository_s_queued_jobs_are_found_in_any_case_until_checked,
    cursors_redeliveries_and_known_guids_persist,
    repositories_of_an_account_come_from_its_live_installations,
);

async fn a_polled_job_is_journalled_as_poll_and_announced_when_a_delivery_names_it<
    B: PollBackend,
>(
    b: B,
) {
    let mut polls = b.open_polls();
    let first = polls.call(|p| {
        p.record_sightings(&[polled(11, JobState::Queued, 1_000)])
            .unwrap()
    });
    assert_eq!(
        first,
        vec![Sighting {
            job_id: JobId::new(11),
            moved: true,
            announced: false,
            state: JobState::Queued
        }]
    );
    let row = b.job(11).unwrap();
    assert_eq!(
        (row.source.as_str(), row.state.as_str()),
        ("poll", "queued")
    );
    assert_eq!(polls.call(|p| p.unannounced_count().unwrap()), 1);

    // The same sighting again changes nothing.
    let again = polls.call(|p| {
        p.record_sightings(&[polled(11, JobState::Queued, 2_000)])
            .unwrap()
    });
    assert!(!again[0].moved);

    // The late webhook for the same state is stale, but it dates the announcement.
    b.record(delivery("g-1", 11, "queued", 3_000))
        .await
        .unwrap();
    assert_eq!(
        polls.call(|p| p.announced(&[JobId::new(11), JobId::new(12)]).unwrap()),
        [JobId::new(11)].into()
    );
    assert_eq!(polls.call(|p| p.unannounced_count().unwrap()), 0);
}

async fn a_poll_never_moves_a_job_back_and_moves_it_forward_as_poll<B: PollBackend>(b: B) {
    let mut polls = b.open_polls();
    b.record(delivery("g-1", 21, "queued", 1_000))
        .await
        .unwrap();
    b.record(delivery("g-2", 22, "completed", 1_000))
        .await
        .unwrap();

    let seen = polls.call(|p| {
        p.record_sightings(&[
            polled(21, JobState::Completed, 2_000),
            polled(22, JobState::Queued, 2_000),
        ])
        .unwrap()
    });
    assert_eq!(
        seen.iter()
            .map(|s| (s.moved, s.announced, s.state.as_str()))
            .collect::<Vec<_>>(),
        vec![(true, true, "completed"), (false, true, "completed")]
    );
    let moved = b.job(21).unwrap();
    assert_eq!(
        (moved.source.as_str(), moved.conclusion.as_deref()),
        ("poll", Some("cancelled"))
    );
    assert_eq!(b.job(22).unwrap().source, "webhook");
}

async fn sightings_are_answered_in_the_order_given<B: PollBackend>(b: B) {
    // PostgreSQL merges them in job-id order (the lock order); the answer keeps the caller's.
    let mut polls = b.open_polls();
    let seen = polls.call(|p| {
        p.record_sightings(&[
            polled(33, JobState::InProgress, 1_000),
            polled(31, JobState::Queued, 1_000),
            polled(32, JobState::Completed, 1_000),
        ])
        .unwrap()
    });
    assert_eq!(
        seen.iter()
            .map(|s| (s.job_id.get(), s.state.as_str()))
            .collect::<Vec<_>>(),
        [(33, "in_progress"), (31, "queued"), (32, "completed")]
    );
}

async fn stale_queued_jobs_are_listed_never_checked_first_and_rotate_once_checked<
    B: PollBackend,
>(
    b: B,
) {
    let mut polls = b.open_polls();
    polls.call(|p| {
        p.record_sightings(&[
            polled(1, JobState::Queued, 1_000),
            polled(2, JobState::Queued, 2_000),
            polled(3, JobState::Queued, 9_000),
            polled(4, JobState::Completed, 1_000),
        ])
        .unwrap()
    });
    assert_eq!(stale_ids(&mut polls, 5_000, 5_000), vec![1, 2]);
    polls.call(|p| p.mark_checked(JobId::new(1), UnixMs::new(4_000)).unwrap());
    assert_eq!(
        stale_ids(&mut polls, 5_000, 3_000),
        vec![2],
        "checked after 3 s: not due"
    );
    assert_eq!(
        stale_ids(&mut polls, 5_000, 5_000),
        vec![2, 1],
        "the never-checked one first"
    );
}

fn stale_ids(polls: &mut Polls, queued_before: i64, checked_before: i64) -> Vec<i64> {
    polls.call(|p| {
        p.stale_queued(UnixMs::new(queued_before), UnixMs::new(checked_before))
            .unwrap()
            .iter()
            .map(|j| j.job_id.get())
            .collect()
    })
}

async fn a_repository_s_queued_jobs_are_found_in_any_case_until_checked<B: PollBackend>(b: B) {
    let mut polls = b.open_polls();
    polls.call(|p| {
        p.record_sightings(&[
            polled(41, JobState::Queued, 1_000),
            polled(42, JobState::InProgress, 1_000),
            polled(43, JobState::Queued, 1_000),
        ])
        .unwrap();
        p.mark_checked(JobId::new(43), UnixMs::new(5_000)).unwrap();
    });
    let found = polls.call(|p| {
        p.queued_in_repository("ACME/Widgets", UnixMs::new(4_000))
            .unwrap()
    });
    assert_eq!(
        found
            .iter()
            .map(|(job, run)| (job.job_id.get(), job.repository.as_str(), *run))
            .collect::<Vec<_>>(),
        [(41, "acme/widgets", 5)],
        "queued only, any case, not checked since"
    );
    assert!(
        polls
            .call(|p| p
                .queued_in_repository("acme/other", UnixMs::new(i64::MAX))
                .unwrap())
            .is_empty()
    );
}

async fn cursors_redeliveries_and_known_guids_persist<B: PollBackend>(b: B) {
    let mut polls = b.open_polls();
    assert_eq!(polls.call(|p| p.last_delivery_at().unwrap()), None);
    b.record(delivery("g-1", 1, "queued", 5_000)).await.unwrap();
    assert_eq!(
        polls.call(|p| p.last_delivery_at().unwrap()),
        Some(UnixMs::new(5_000))
    );
    assert_eq!(
        polls.call(|p| p.known_guids(&["g-1", "g-2"]).unwrap()),
        ["g-1".to_owned()].into()
    );

    assert_eq!(
        polls.call(|p| p.cursor(HOOK_DELIVERY_CURSOR).unwrap()),
        None
    );
    polls.call(|p| {
        p.set_cursor(HOOK_DELIVERY_CURSOR, 10, UnixMs::new(1))
            .unwrap();
        p.set_cursor(HOOK_DELIVERY_CURSOR, 12, UnixMs::new(2))
            .unwrap();
        assert!(p.record_redelivery("g-2", 9, UnixMs::new(3)).unwrap());
        assert!(
            !p.record_redelivery("g-2", 11, UnixMs::new(4)).unwrap(),
            "once per GUID"
        );
    });
    drop(polls);

    let mut polls = b.open_polls();
    assert_eq!(
        polls.call(|p| p.cursor(HOOK_DELIVERY_CURSOR).unwrap()),
        Some(12)
    );
    assert_eq!(
        polls.call(|p| p.redelivered(&["g-1", "g-2"]).unwrap()),
        ["g-2".to_owned()].into()
    );
}

async fn repositories_of_an_account_come_from_its_live_installations<B: PollBackend>(b: B) {
    let mut polls = b.open_polls();
    // `TRUE` reads as 1 in SQLite and as a BOOLEAN in PostgreSQL.
    b.execute(
        "INSERT INTO installations (id, account, updated_at) VALUES (1, 'Acme', 1), (2, 'other', 1);
         INSERT INTO installations (id, account, removed, updated_at) VALUES (3, 'acme', TRUE, 1);
         INSERT INTO installation_repositories VALUES (1, 10, 'Acme/b'), (1, 11, 'Acme/a'),
             (1, 14, 'Acme/B2'), (2, 12, 'other/x'), (3, 13, 'acme/gone');",
    );
    assert_eq!(
        polls.call(|p| p.repositories_of("acme").unwrap()),
        ["Acme/B2", "Acme/a", "Acme/b"],
        "bytewise order, the removed installation left out"
    );
}

#[test]
fn migrating_to_v3_dates_the_announcement_of_jobs_deliveries_brought() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
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

/// How many jobs each racer records: enough that the two overlap on many rows.
const RACE_JOBS: i64 = 40;

/// Two hosts' pollers record sightings of the same jobs at once, one in ascending and one in
/// descending order of job id, one seeing half of them `queued` and the other `in_progress`,
/// while a third session holds `jobs` until both are waiting on it. Each job has one row, in
/// `in_progress` whichever merged last, and neither racer fails: without the job-id lock order
/// the two would deadlock (one aborted by the server), without the merge's row lock a `queued`
/// could overwrite an `in_progress`.
#[tokio::test]
async fn two_pollers_recording_the_same_jobs_at_once_leave_one_forward_row_each() {
    let Some(pg) = Postgres::new("two_pollers_recording_the_same_jobs_at_once") else {
        return;
    };
    let url = pg.db.url();
    let mut a = pg.open_polls();
    let mut b = pg.open_polls();
    let state = |id: i64, flip: bool| {
        if (id % 2 == 0) ^ flip {
            JobState::Queued
        } else {
            JobState::InProgress
        }
    };
    let up: Vec<JobObservation> = (1..=RACE_JOBS)
        .map(|id| polled(id, state(id, false), 1_000))
        .collect();
    let down: Vec<JobObservation> = (1..=RACE_JOBS)
        .rev()
        .map(|id| polled(id, state(id, true), 2_000))
        .collect();
    let (store_a, store_b) = (a.0.as_mut().unwrap(), b.0.as_mut().unwrap());
    let (seen_a, seen_b) = off_runtime(move || {
        let mut holder = Client::connect(&url, NoTls).unwrap();
        let mut watcher = Client::connect(&url, NoTls).unwrap();
        let mut hold = holder.transaction().unwrap();
        hold.batch_execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
            .unwrap();
        std::thread::scope(|scope| {
            let a = scope.spawn(|| store_a.record_sightings(&up));
            let b = scope.spawn(|| store_b.record_sightings(&down));
            // Both wait behind the held table before either may go on.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let waiting: i64 = watcher
                    .query_one(
                        "SELECT COUNT(*) FROM pg_locks
                         WHERE NOT granted AND relation = 'jobs'::regclass",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                if waiting >= 2 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the racers never reached the table"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            hold.commit().unwrap();
            (a.join().unwrap(), b.join().unwrap())
        })
    });
    let (seen_a, seen_b) = (seen_a.unwrap(), seen_b.unwrap());
    let jobs = usize::try_from(RACE_JOBS).unwrap();
    assert_eq!((seen_a.len(), seen_b.len()), (jobs, jobs));
    // Every answer names the state the row holds after both: the later racer saw the first's.
    let last: Vec<&Sighting> = seen_a.iter().chain(&seen_b).filter(|s| !s.moved).collect();
    assert!(
        last.iter().all(|s| s.state == JobState::InProgress),
        "{last:?}"
    );
    assert_eq!(
        pg.job_counts(),
        [("in_progress".to_owned(), RACE_JOBS)],
        "one row per job, none moved back to queued"
    );
    for id in 1..=RACE_JOBS {
        assert_eq!(pg.job(id).unwrap().source, "poll");
    }
}
