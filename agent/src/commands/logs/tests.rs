//! `rm-agent logs`: which attempts an argument names (the journal's, then kept copies only),
//! and a kept copy printed file by file. The whole path (a runner cleaned up, its logs kept and
//! printed) is the executor harness's
//! `a_cleaned_attempts_diag_is_kept_scrubbed_once_and_printed_by_logs`.

#![allow(
    clippy::unwrap_used,
    reason = "a failed step in a test helper should fail the test loudly"
)]

use rm_runner::logs::{Attempt, Bounds, Kept, Manifest, Store};

use super::*;

fn manifest(attempt_id: &str, runner: &str, job: Option<i64>, at: i64) -> Manifest {
    Manifest {
        attempt_id: attempt_id.to_owned(),
        runner_name: runner.to_owned(),
        policy: "linux".to_owned(),
        job_id: job,
        kept_at_ms: at,
        files: Vec::new(),
        left_out: Vec::new(),
    }
}

#[test]
fn a_job_a_runner_or_an_attempt_names_its_kept_attempts_oldest_first() {
    let kept = || {
        vec![
            manifest("bbbb", "rm-h-bbbb", Some(7), 20),
            manifest("aaaa", "rm-h-aaaa", Some(7), 10),
            manifest("cccc", "rm-h-cccc", None, 30),
        ]
    };
    let ids = |target: &str| -> Vec<String> {
        resolve(target, None, &[], kept())
            .into_iter()
            .map(|f| f.attempt_id)
            .collect()
    };
    // A job retried on two runners: both, oldest first.
    assert_eq!(ids("7"), ["aaaa", "bbbb"]);
    assert_eq!(ids("rm-h-cccc"), ["cccc"]);
    assert_eq!(ids("bbbb"), ["bbbb"]);
    assert!(ids("8").is_empty());
    assert!(ids("rm-h-dddd").is_empty());
    // A job whose row names its runner, where the attempt never learnt the job.
    let by_row: Vec<String> = resolve("9", Some("rm-h-cccc"), &[], kept())
        .into_iter()
        .map(|f| f.attempt_id)
        .collect();
    assert_eq!(by_row, ["cccc"]);
}

#[test]
fn a_kept_copy_prints_file_by_file_with_a_header_each() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(runtime.join("_diag")).unwrap();
    std::fs::write(runtime.join("_diag/Runner_1.log"), "listening\n").unwrap();
    std::fs::write(
        runtime.join("_diag/Worker_1.log"),
        "step one\nAuthorization: Bearer x\n",
    )
    .unwrap();
    let store = Store::new(dir.path(), Bounds::default());
    let attempt = Attempt {
        attempt_id: "0123456789ab".to_owned(),
        runner_name: "rm-h-0123456789ab".to_owned(),
        policy: "linux".to_owned(),
        job_id: Some(5),
        runtime_dir: runtime.clone(),
    };
    // Live: read from the runtime the same way.
    let live = render_live(&runtime);
    assert!(live.contains("--- Worker_1.log (live"), "{live}");
    assert!(matches!(store.keep(&attempt, 1).unwrap(), Kept::Made(_)));
    std::fs::remove_dir_all(&runtime).unwrap();
    let printed = render_kept(&store, "0123456789ab");
    assert_eq!(
        printed,
        "--- Worker_1.log (33 bytes) ---\nstep one\nAuthorization: [redacted]\n\
         --- Runner_1.log (10 bytes) ---\nlistening\n"
    );
    assert!(render_kept(&store, "ffffffffffff").starts_with("(no logs kept"));
}

#[test]
fn follow_prints_whole_lines_as_they_come_and_resumes_in_the_kept_copy() {
    use std::io::Write as _;

    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(runtime.join("_diag")).unwrap();
    let path = runtime.join("_diag/Worker_1.log");
    let mut log = std::fs::File::create(&path).unwrap();
    let mut followed = HashMap::new();
    let mut current = None;
    log.write_all(b"one\ntwo\nthr").unwrap();
    follow_once(&runtime, &mut followed, &mut current);
    let seen = &followed["Worker_1.log"];
    // A line still being written waits for its end.
    assert_eq!((seen.offset, seen.lines), (8, 2));
    log.write_all(b"ee\n").unwrap();
    follow_once(&runtime, &mut followed, &mut current);
    assert_eq!(followed["Worker_1.log"].lines, 3);
    assert_eq!(current.as_deref(), Some("Worker_1.log"));
    // Cleaned up: the kept copy's lines after the three shown are the rest.
    let kept = b"one\ntwo\nthree\nfour\nfive\n";
    assert_eq!(lines_after(kept, 3), b"four\nfive\n");
    assert_eq!(lines_after(kept, 0), kept);
    assert!(lines_after(kept, 9).is_empty());
}
