//! `rm-agent receive` with its journal on a full filesystem (a small tmpfs the test mounts on
//! the data directory): deliveries are refused with 503 and never answered 2xx unless they are
//! on disk, they are taken again by themselves once space returns, and after a SIGKILL while
//! the disk is full every delivery answered 2xx is in the journal.

use std::collections::HashSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rm_e2e::disk::{Tmpfs, fill};
use rm_e2e::{Agent, Setup, delivery, json_stdout};

/// Big enough for the journal and its WAL, small enough to fill in a moment.
const TMPFS_SIZE: &str = "16m";
/// Deliveries sent into a full disk before one must have been refused: the WAL may still have
/// room in pages it already holds.
const MAX_UNTIL_REFUSED: usize = 5_000;
/// Concurrent senders while the disk fills and the receiver is killed.
const SENDERS: i64 = 4;
/// The longest one delivery may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends one delivery, bounded in time; the status, or `None` for no answer.
async fn send(agent: &Agent, job: i64) -> (String, Option<u16>) {
    let d = delivery("workflow_job.queued.6", Some(job));
    let status = tokio::time::timeout(SEND_TIMEOUT, agent.deliver(&d))
        .await
        .ok()
        .and_then(Result::ok);
    (d.guid, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_deliveries_loses_no_2xx_and_resumes_by_itself() {
    let setup = Setup::new();
    let data = setup.dir.path().join("data");
    let _tmpfs = Tmpfs::mount(&data, TMPFS_SIZE);
    let mut answered: HashSet<String> = HashSet::new();
    let mut job = 10_000;
    let mut next = || {
        job += 1;
        job
    };

    let mut agent = setup.start_receiver().await;
    for _ in 0..50 {
        let (guid, status) = send(&agent, next()).await;
        assert_eq!(status, Some(202));
        answered.insert(guid);
    }

    // Full: every delivery is answered, and refused with 503 once the WAL has no room left.
    let filler = fill(&data);
    let mut refused = 0;
    for _ in 0..MAX_UNTIL_REFUSED {
        let (guid, status) = send(&agent, next()).await;
        match status {
            Some(202) => {
                answered.insert(guid);
            }
            Some(503) => {
                refused += 1;
                if refused == 20 {
                    break;
                }
            }
            other => panic!("a delivery into a full disk was answered {other:?}"),
        }
    }
    assert_eq!(refused, 20, "a full disk never refused a delivery");
    eprintln!("full: {} answered 2xx so far, 20 refused", answered.len());
    assert!(!agent.exited(), "the receiver exited on a full disk");
    // A WAL that started over writes into its own file's frames, which needs no new disk
    // space: while such room is left the journal IS writable and /healthz rightly says 200
    // (seen in a clean-clone run). Deliveries use that room up; then it must say 503.
    let mut health = 0;
    for _ in 0..MAX_UNTIL_REFUSED {
        health = agent.get("/healthz").await.unwrap().0;
        if health == 503 {
            break;
        }
        let (guid, status) = send(&agent, next()).await;
        if status == Some(202) {
            answered.insert(guid);
        }
    }
    assert_eq!(
        health, 503,
        "/healthz says the journal is writable on a full disk"
    );

    // Space returns: health comes back by itself and deliveries are taken again, without a
    // restart.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(agent.get("/healthz").await.unwrap().0, 200);
    let (guid, status) = send(&agent, next()).await;
    assert_eq!(status, Some(202), "{}", setup.logs());
    answered.insert(guid);

    // Killed in the middle of a stream of concurrent deliveries, with the disk filling up
    // under them.
    let pid = agent.child.id();
    let agent = Arc::new(agent);
    let answers = Arc::new(Mutex::new(Vec::<(String, Option<u16>)>::new()));
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let (agent, answers) = (agent.clone(), answers.clone());
        let first = next() * 1_000 + sender * 100_000;
        senders.push(tokio::spawn(async move {
            for n in 0.. {
                let (guid, status) = send(&agent, first + n).await;
                answers.lock().unwrap().push((guid, status));
                if status.is_none() {
                    return;
                }
            }
        }));
    }
    let answered_now = |answers: &Mutex<Vec<(String, Option<u16>)>>| answers.lock().unwrap().len();
    while answered_now(&answers) < 100 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Counted before the filling starts: the disk is full part-way through `fill`, and a
    // delivery refused meanwhile is refused "while full".
    let filled_at = answered_now(&answers);
    let filler = fill(&data);
    while answered_now(&answers) < filled_at + 200 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    for s in senders {
        s.await.unwrap();
    }
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let mut refused_while_full = 0;
    for (n, (guid, status)) in answers.into_iter().enumerate() {
        match status {
            Some(202) => {
                answered.insert(guid);
            }
            Some(503) if n >= filled_at => refused_while_full += 1,
            None => {}
            other => panic!("a delivery was answered {other:?}"),
        }
    }
    assert!(refused_while_full > 0, "nothing refused while full");
    eprintln!(
        "killed: {} answered 2xx in all, {refused_while_full} refused while full",
        answered.len()
    );
    drop(agent);
    std::fs::remove_file(&filler).unwrap();

    let agent = setup.start_receiver().await;
    let (_, status) = send(&agent, next()).await;
    assert_eq!(status, Some(202));
    let listed = json_stdout(&setup.run(&["deliveries", "--json", "--limit", "1000000"]));
    let journalled: HashSet<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["guid"].as_str().unwrap().to_owned())
        .collect();
    let lost: Vec<_> = answered.difference(&journalled).collect();
    assert!(
        lost.is_empty(),
        "{} of {} deliveries answered 2xx are missing",
        lost.len(),
        answered.len()
    );
    let reader = rm_journal::Reader::open(&setup.journal()).unwrap();
    assert_eq!(reader.integrity_check().unwrap(), vec!["ok"]);
}
