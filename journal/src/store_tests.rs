//! The store hands out the same handles whichever journal is behind it: after the intake
//! recorded a queued job, the store's reader of jobs, poll store, fleet and replay say the same
//! things on the SQLite file (`Store::open(file, None)`) and on a PostgreSQL database
//! (`Store::open(file, Some(target))`). On the database its reader of jobs connects again after
//! its connection was cut, as the agent's executor relies on.

use std::time::Duration;

use rm_vocab::{JobId, JobState, UnixMs};

use crate::intake_tests::{Postgres, Sqlite, job_delivery, off_runtime};
use crate::*;

const GUID: &str = "store-g1";
const JOB: i64 = 7_001;

fn record_one_queued_job(intake: &impl Intake) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let judged = Judged::of(job_delivery(GUID, JOB, "queued", 1_000)).unwrap();
    let recorded = runtime.block_on(intake.record_judged(judged)).unwrap();
    assert!(
        matches!(recorded, Recorded::New(Outcome::Applied)),
        "{recorded:?}"
    );
}

/// What every handle of `store` says of the one queued job the intake recorded.
fn the_handles_read_what_the_intake_wrote(store: &Store) {
    let job = JobId::new(JOB);
    let mut jobs = store.jobs().unwrap();
    let row = jobs.job(job).unwrap().expect("the job");
    assert_eq!(row.state, JobState::Queued);
    assert_eq!(jobs.queued_jobs().unwrap().len(), 1);
    assert_eq!(jobs.demand(&[]).unwrap().queued.len(), 1);
    assert_eq!(jobs.delivery_count().unwrap(), 1);
    assert!(jobs.delivery(GUID).unwrap().is_some());
    assert_eq!(jobs.deliveries(10).unwrap().len(), 1);
    assert_eq!(jobs.job_counts().unwrap(), vec![("queued".to_owned(), 1)]);

    let mut polls = store.polls().unwrap();
    assert!(polls.announced(&[job]).unwrap().contains(&job));

    let mut fleet = store.fleet().unwrap();
    let host = HostInfo {
        host: "h1".to_owned(),
        labels: vec!["self-hosted".to_owned()],
        policies: vec!["default".to_owned()],
    };
    fleet.renew_lease(&host, Duration::from_secs(30)).unwrap();
    let claimed = fleet
        .claim(&ClaimRequest {
            host: "h1",
            policy: "default",
            job_ids: &[job],
            max_runners: None,
        })
        .unwrap();
    assert_eq!(claimed.job_ids, vec![job]);

    // Replayed, the delivery finds its change already there.
    let (outcome, _) = store.replay(GUID, UnixMs::new(2_000)).unwrap();
    assert_ne!(outcome, Outcome::Rejected);
    assert!(matches!(
        store.replay("no-such-guid", UnixMs::new(2_000)),
        Err(JournalError::UnknownDelivery(_))
    ));
}

#[test]
fn on_the_file_every_handle_reads_what_the_intake_wrote() {
    let sqlite = Sqlite::new();
    record_one_queued_job(&sqlite.journal);
    let store = Store::open(sqlite.path.clone(), None);
    assert!(!store.is_shared());
    assert!(
        store
            .describe()
            .contains(&sqlite.path.display().to_string())
    );
    the_handles_read_what_the_intake_wrote(&store);
    // The runners are always the file's.
    assert!(store.attempts().is_ok());
}

#[test]
fn on_a_database_every_handle_reads_what_the_intake_wrote() {
    let Some(pg) = Postgres::new("on_a_database_every_handle_reads_what_the_intake_wrote") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(JOURNAL_FILE);
    // The host's own file holds its runners; a fleet host's `run` made it (`Journal::open`).
    drop(Journal::open(&file, Retention::default()).unwrap());
    let target = PgTarget::parse(&pg.db.url()).unwrap();
    let store = Store::open(file, Some(target));
    assert!(store.is_shared());
    assert!(store.describe().starts_with("the fleet's journal"));
    // The store's own intake, as `rm-agent receive` opens it.
    let intake = off_runtime(|| store.shared_intake().expect("a shared store").unwrap());
    record_one_queued_job(&intake);
    off_runtime(|| {
        the_handles_read_what_the_intake_wrote(&store);
        drop(intake);
    });
}

#[test]
fn on_a_database_the_reader_of_jobs_connects_again_after_its_connection_was_cut() {
    let test = "on_a_database_the_reader_of_jobs_connects_again";
    let Some(pg) = Postgres::new(test) else {
        return;
    };
    record_one_queued_job(&pg.journal);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path().join(JOURNAL_FILE),
        Some(PgTarget::parse(&pg.db.url()).unwrap()),
    );
    let url = pg.db.url();
    off_runtime(move || {
        let mut jobs = store.jobs().unwrap();
        assert!(jobs.job(JobId::new(JOB)).unwrap().is_some());
        // The server ends the reader's connection (a restart, a failover).
        let mut admin = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let cut = admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = $1",
                &[&crate::pg::READER_APPLICATION],
            )
            .unwrap();
        // The store's reader, and the test journal's own (unused from here on).
        assert!(cut >= 1, "no reader connection to cut");
        // The call that finds the connection gone fails; the next one connects again.
        assert!(jobs.job(JobId::new(JOB)).is_err());
        assert!(jobs.job(JobId::new(JOB)).unwrap().is_some());
    });
}
