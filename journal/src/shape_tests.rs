//! Schema v15 on a real SQLite file (`crate::shapes`): an attempt's shape written with its row
//! and read back, the device fence the database keeps (one holder per device, the holds and the
//! row written together or not at all, freed at release or clean), the shapes that still occupy
//! the host, usage recorded once and read against the shape with the job's name, and a v14 file
//! upgraded in place.

use std::path::{Path, PathBuf};

use rm_vocab::{JobId, RunnerId, UnixMs};
use rusqlite::Connection;

use crate::*;

fn temp_journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    (dir, path)
}

fn id(n: u8) -> AttemptId {
    AttemptId::parse(&format!("{n:02x}{}", "0".repeat(30))).unwrap()
}

const GIB: u64 = 1 << 30;

/// A shape of `cpus` CPUs holding `devices`.
fn shape(cpus: u64, devices: &[&str]) -> AttemptShape {
    AttemptShape {
        labels: vec![format!("rm-cpu={cpus}"), "rm-mem=8g".to_owned()],
        cpu_millis: cpus * 1000,
        memory: 8 * GIB,
        disk: 40 * GIB,
        devices: devices.iter().map(|d| (*d).to_owned()).collect(),
    }
}

/// Journals an attempt of `policy` with `shape`, its workspace named after its id.
fn create(
    attempts: &Attempts,
    id: &AttemptId,
    policy: &str,
    at_ms: i64,
    shape: Option<&AttemptShape>,
) -> Result<AttemptRecord, AttemptError> {
    attempts.create(&NewAttempt {
        attempt_id: id,
        policy,
        runner_name: &id.runner_name("host"),
        workspace: WorkspaceKind::Ephemeral,
        runtime_dir: &PathBuf::from(format!("/runners/{}", id.short())),
        created_at_ms: UnixMs::new(at_ms),
        isolation: IsolationKind::None,
        uid: None,
        cgroup: None,
        image: None,
        shape,
    })
}

/// Moves a new attempt to `failed` (from `allocated`: any live state may fail).
fn fail(attempts: &Attempts, id: &AttemptId, at_ms: i64) {
    assert!(
        attempts
            .conclude(
                id,
                AttemptState::Allocated,
                AttemptOutcome::Failed,
                Some("x"),
                None,
                UnixMs::new(at_ms),
            )
            .unwrap()
    );
}

fn held(attempts: &Attempts) -> Vec<(String, AttemptId)> {
    attempts.held_devices().unwrap()
}

fn hold(device: &str, holder: &AttemptId) -> (String, AttemptId) {
    (device.to_owned(), holder.clone())
}

fn count(path: &Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |row| row.get(0))
        .unwrap()
}

/// The shape is written with the row and reads back whole through every read of attempts,
/// after the writer is gone too (a crash right after the create: nothing else ran); an attempt
/// without one reads `None` and holds nothing.
#[test]
fn an_attempt_s_shape_and_holds_are_written_with_it_and_read_back() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let (a, b) = (id(1), id(2));
    let big = shape(8, &["/dev/nvidia1", "/dev/nvidia0"]);
    let created = create(&attempts, &a, "gpu", 10, Some(&big)).unwrap();
    assert_eq!(created.shape.as_ref(), Some(&big));
    assert_eq!(create(&attempts, &b, "gpu", 11, None).unwrap().shape, None);
    drop(attempts);

    let attempts = Attempts::open(&path).unwrap();
    assert_eq!(attempts.get(&a).unwrap().unwrap().shape, Some(big.clone()));
    assert_eq!(
        held(&attempts),
        vec![hold("/dev/nvidia0", &a), hold("/dev/nvidia1", &a)]
    );
    let reader = Reader::open(&path).unwrap();
    let shapes: Vec<_> = reader
        .uncleaned_attempts()
        .unwrap()
        .into_iter()
        .map(|r| (r.attempt_id, r.shape))
        .collect();
    assert_eq!(shapes, vec![(a.clone(), Some(big.clone())), (b, None)]);
    assert_eq!(reader.held_devices().unwrap(), held(&attempts));
    // A shape of no devices holds nothing; the empty lists read back as empty, not as `None`.
    let c = id(3);
    let bare = shape(2, &[]);
    create(&attempts, &c, "gpu", 12, Some(&bare)).unwrap();
    assert_eq!(attempts.get(&c).unwrap().unwrap().shape, Some(bare));
    assert_eq!(held(&attempts).len(), 2);
}

/// One holder per device: a second attempt asking for a held device fails with `DeviceHeld`
/// naming the device and its holder, and nothing of it is written: no row, and not the hold
/// of its other device either, taken earlier in the same transaction.
#[test]
fn a_held_device_refuses_the_next_attempt_and_writes_nothing_of_it() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let (a, b) = (id(1), id(2));
    create(&attempts, &a, "gpu", 10, Some(&shape(4, &["/dev/nvidia0"]))).unwrap();
    let refused = create(
        &attempts,
        &b,
        "gpu",
        11,
        Some(&shape(4, &["/dev/nvidia1", "/dev/nvidia0"])),
    );
    assert!(
        matches!(
            &refused,
            Err(AttemptError::DeviceHeld { device, holder })
                if device == "/dev/nvidia0" && *holder == a
        ),
        "{refused:?}"
    );
    assert_eq!(attempts.get(&b).unwrap(), None);
    assert_eq!(held(&attempts), vec![hold("/dev/nvidia0", &a)]);
    assert_eq!(count(&path, "SELECT count(*) FROM attempts"), 1);
    // Its id, name and workspace were not taken either: the same attempt with a free device
    // goes in.
    create(&attempts, &b, "gpu", 12, Some(&shape(4, &["/dev/nvidia1"]))).unwrap();
    assert_eq!(
        held(&attempts),
        vec![hold("/dev/nvidia0", &a), hold("/dev/nvidia1", &b)]
    );
}

/// A shape naming one device twice, or an empty id, is refused before anything is written.
#[test]
fn a_shape_listing_a_device_twice_is_refused() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    for devices in [&["/dev/a", "/dev/b", "/dev/a"][..], &[""][..]] {
        let refused = create(&attempts, &id(1), "gpu", 10, Some(&shape(1, devices)));
        assert!(
            matches!(&refused, Err(AttemptError::InvalidDevice(_))),
            "{devices:?}: {refused:?}"
        );
    }
    assert_eq!(attempts.get(&id(1)).unwrap(), None);
    assert!(held(&attempts).is_empty());
}

/// The row and its holds are one transaction: when writing a hold fails for any reason (here
/// the table refuses every insert, as a full disk or an I/O error would), the attempt row is
/// gone with it.
#[test]
fn a_hold_that_cannot_be_written_takes_the_attempt_row_with_it() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse_holds BEFORE INSERT ON device_holds
             BEGIN SELECT RAISE(ABORT, 'no room'); END;",
        )
        .unwrap();
    let refused = create(&attempts, &id(1), "gpu", 10, Some(&shape(1, &["/dev/a"])));
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(attempts.get(&id(1)).unwrap(), None);
    // Without devices there is no hold to write: the attempt goes in as before v15.
    create(&attempts, &id(2), "gpu", 11, Some(&shape(1, &[]))).unwrap();
    assert_eq!(count(&path, "SELECT count(*) FROM attempts"), 1);
}

/// A device is held while its attempt runs and after it concludes (its processes may still be
/// there), and freed in the transaction that releases the attempt, or that cleans it when it
/// was never released; a new attempt takes it then. Freeing one attempt's devices leaves the
/// others' alone, and the record keeps the devices it held.
#[test]
fn a_device_is_freed_when_its_attempt_is_released_or_cleaned() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let (a, b, c, d) = (id(1), id(2), id(3), id(4));
    let gpu0 = shape(1, &["/dev/nvidia0"]);
    create(&attempts, &a, "gpu", 10, Some(&gpu0)).unwrap();
    create(&attempts, &c, "gpu", 11, Some(&shape(1, &["/dev/nvidia1"]))).unwrap();
    // A live attempt is never released.
    assert!(!attempts.mark_released(&a, UnixMs::new(12)).unwrap());
    fail(&attempts, &a, 13);
    assert!(matches!(
        create(&attempts, &b, "gpu", 14, Some(&gpu0)),
        Err(AttemptError::DeviceHeld { .. })
    ));
    assert!(attempts.mark_released(&a, UnixMs::new(15)).unwrap());
    assert_eq!(held(&attempts), vec![hold("/dev/nvidia1", &c)]);
    create(&attempts, &b, "gpu", 16, Some(&gpu0)).unwrap();
    // Cleaning the released attempt later frees nothing of the new holder's.
    assert!(attempts.mark_cleaned(&a, UnixMs::new(17)).unwrap());
    assert_eq!(
        held(&attempts),
        vec![hold("/dev/nvidia0", &b), hold("/dev/nvidia1", &c)]
    );
    assert_eq!(attempts.get(&a).unwrap().unwrap().shape, Some(gpu0));
    // Cleaned without a release first: freed by the clean.
    fail(&attempts, &c, 18);
    assert!(attempts.mark_cleaned(&c, UnixMs::new(19)).unwrap());
    assert_eq!(held(&attempts), vec![hold("/dev/nvidia0", &b)]);
    create(&attempts, &d, "gpu", 20, Some(&shape(1, &["/dev/nvidia1"]))).unwrap();
    // Retention removing an attempt row takes any hold with it (the foreign key).
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "foreign_keys", "ON").unwrap();
    conn.execute("DELETE FROM attempts WHERE attempt_id = ?1", [d.as_str()])
        .unwrap();
    assert_eq!(held(&attempts), vec![hold("/dev/nvidia0", &b)]);
}

/// Packing after a restart starts from the shapes of the attempts neither cleaned nor released:
/// a concluded attempt still counts until it is released; unshaped attempts are not listed.
#[test]
fn live_shapes_are_those_of_attempts_neither_released_nor_cleaned() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    let (a, b, c, d) = (id(1), id(2), id(3), id(4));
    create(&attempts, &a, "gpu", 10, Some(&shape(1, &["/dev/a"]))).unwrap();
    create(&attempts, &b, "gpu", 11, Some(&shape(2, &[]))).unwrap();
    create(&attempts, &c, "cpu", 12, None).unwrap();
    create(&attempts, &d, "cpu", 13, Some(&shape(4, &[]))).unwrap();
    fail(&attempts, &b, 14);
    fail(&attempts, &d, 14);
    assert!(attempts.mark_released(&d, UnixMs::new(15)).unwrap());
    let live: Vec<_> = attempts
        .live_shapes()
        .unwrap()
        .into_iter()
        .map(|(id, shape)| (id, shape.cpu_millis))
        .collect();
    assert_eq!(live, vec![(a.clone(), 1000), (b.clone(), 2000)]);
    assert!(attempts.mark_cleaned(&b, UnixMs::new(16)).unwrap());
    let reader = Reader::open(&path).unwrap();
    assert_eq!(
        reader.live_shapes().unwrap(),
        vec![(a, shape(1, &["/dev/a"]))]
    );
}

/// Usage is written once, at the runner's end, and read per policy and time against the shape
/// asked for, with the name of the job it ran and how long that job ran; attempts that recorded
/// nothing are not listed, unshaped ones are with no shape.
#[test]
fn usage_is_recorded_once_and_read_against_the_shape_with_the_job_s_name() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    Connection::open(&path)
        .unwrap()
        .execute_batch(
            "INSERT INTO jobs (job_id, run_id, run_attempt, repository, labels, job_name, state,
                 state_rank, source, first_seen_at, updated_at, started_at)
                 VALUES (7, 1, 1, 'o/r', '[]', 'build', 'completed', 4, 'webhook', 1, 1, 1000);",
        )
        .unwrap();
    let (a, b, c, d, e) = (id(1), id(2), id(3), id(4), id(5));
    let asked = shape(8, &["/dev/nvidia0"]);
    create(&attempts, &a, "gpu", 100, Some(&asked)).unwrap();
    create(&attempts, &b, "gpu", 200, None).unwrap();
    create(&attempts, &c, "gpu", 300, Some(&shape(1, &[]))).unwrap();
    create(&attempts, &d, "other", 400, Some(&shape(1, &[]))).unwrap();
    create(&attempts, &e, "gpu", 50, Some(&shape(1, &[]))).unwrap();
    assert!(
        attempts
            .jit_received(&a, RunnerId::new(1), UnixMs::new(101))
            .unwrap()
    );
    assert!(attempts.started(&a, 1, 1, UnixMs::new(102)).unwrap());
    assert!(
        attempts
            .mark_busy(&a, Some(JobId::new(7)), UnixMs::new(103))
            .unwrap()
    );

    assert!(
        attempts
            .record_usage(&a, Some(3 * GIB), Some(9_000_000), UnixMs::new(61_000))
            .unwrap()
    );
    // Once: a second reading (a cleanup run again after a crash) changes nothing.
    assert!(
        !attempts
            .record_usage(&a, Some(1), Some(1), UnixMs::new(62_000))
            .unwrap()
    );
    assert!(
        attempts
            .record_usage(&b, None, Some(5), UnixMs::new(201))
            .unwrap()
    );
    assert!(
        attempts
            .record_usage(&d, Some(1), Some(1), UnixMs::new(401))
            .unwrap()
    );
    assert!(
        attempts
            .record_usage(&e, Some(1), Some(1), UnixMs::new(51))
            .unwrap()
    );
    assert!(matches!(
        attempts.record_usage(&id(9), None, None, UnixMs::new(1)),
        Err(AttemptError::Unknown(_))
    ));
    // A cleaned attempt takes nothing.
    fail(&attempts, &c, 301);
    assert!(attempts.mark_cleaned(&c, UnixMs::new(302)).unwrap());
    assert!(
        !attempts
            .record_usage(&c, Some(1), None, UnixMs::new(303))
            .unwrap()
    );

    let reader = Reader::open(&path).unwrap();
    let usage = reader.shape_usage("gpu", UnixMs::new(100)).unwrap();
    assert_eq!(
        usage,
        vec![
            ShapeUsage {
                attempt_id: a.clone(),
                job_id: Some(JobId::new(7)),
                job_name: Some("build".to_owned()),
                shape: Some(asked),
                peak_memory: Some(3 * GIB),
                cpu_usec: Some(9_000_000),
                ran_ms: Some(60_000),
            },
            ShapeUsage {
                attempt_id: b,
                job_id: None,
                job_name: None,
                shape: None,
                peak_memory: None,
                cpu_usec: Some(5),
                ran_ms: None,
            },
        ]
    );
    assert_eq!(
        attempts.shape_usage("gpu", UnixMs::new(100)).unwrap(),
        usage
    );
    assert_eq!(reader.shape_usage("gpu", UnixMs::new(0)).unwrap().len(), 3);
    assert_eq!(
        reader.shape_usage("other", UnixMs::new(0)).unwrap()[0].attempt_id,
        d
    );
}

/// The schema keeps a shape whole and usage tied to its time, whoever writes the row.
#[test]
fn the_schema_refuses_a_partial_shape_and_usage_without_its_time() {
    let (_dir, path) = temp_journal();
    let attempts = Attempts::open(&path).unwrap();
    create(&attempts, &id(1), "gpu", 10, None).unwrap();
    create(&attempts, &id(2), "gpu", 11, Some(&shape(1, &[]))).unwrap();
    let conn = Connection::open(&path).unwrap();
    for sql in [
        "UPDATE attempts SET shape_memory = 1 WHERE shape_labels IS NULL",
        "UPDATE attempts SET shape_disk = NULL WHERE shape_labels IS NOT NULL",
        "UPDATE attempts SET shape_labels = '{}' WHERE shape_labels IS NOT NULL",
        "UPDATE attempts SET shape_cpu_millis = -1 WHERE shape_labels IS NOT NULL",
        "UPDATE attempts SET usage_peak_memory = 1",
        "INSERT INTO device_holds (device, attempt_id, held_at)
             VALUES ('', '01000000000000000000000000000000', 1)",
    ] {
        assert!(conn.execute(sql, []).is_err(), "{sql}");
    }
}

/// A v14 file upgrades in place: its attempts keep everything and read no shape and no usage,
/// nothing is held, and the next attempt journals its shape and holds beside them.
#[test]
fn a_journal_from_before_shapes_upgrades_in_place() {
    let (_dir, path) = temp_journal();
    let mut conn = Connection::open(&path).unwrap();
    crate::schema::migrate_to(&mut conn, &path, 14).unwrap();
    conn.execute_batch(
        "INSERT INTO attempts (attempt_id, policy, runner_name, workspace, runtime_dir, state,
             state_changed_at, pid, pid_start_time, created_at, updated_at, uid, isolation)
             VALUES ('0123456789abcdef0123456789abcdef', 'linux', 'rm-h-0123456789ab',
                 'ephemeral', '/r/0123456789ab', 'busy', 5, 4242, 77, 1, 5, 64200, 'user');",
    )
    .unwrap();
    drop(conn);

    let attempts = Attempts::open(&path).unwrap();
    let old = AttemptId::parse("0123456789abcdef0123456789abcdef").unwrap();
    let row = attempts.get(&old).unwrap().unwrap();
    assert_eq!(
        (row.state, row.pid, row.uid, row.shape),
        (AttemptState::Busy, Some(4242), Some(64200), None)
    );
    assert!(held(&attempts).is_empty());
    assert!(attempts.live_shapes().unwrap().is_empty());
    let new = id(1);
    create(&attempts, &new, "gpu", 10, Some(&shape(2, &["/dev/a"]))).unwrap();
    assert_eq!(held(&attempts), vec![hold("/dev/a", &new)]);
    assert!(
        attempts
            .record_usage(&old, Some(1), Some(2), UnixMs::new(6))
            .unwrap()
    );
    let usage = attempts.shape_usage("linux", UnixMs::new(0)).unwrap();
    assert_eq!((usage.len(), usage[0].shape.as_ref()), (1, None));
    assert_eq!(
        Reader::open(&path).unwrap().integrity_check().unwrap(),
        vec!["ok"]
    );
}
