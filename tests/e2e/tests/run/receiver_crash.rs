//! The receiver is killed with SIGKILL in the middle of a burst of concurrent deliveries. After
//! a restart, every GUID it answered 2xx is in the journal, the journal is sound, and the
//! receiver takes deliveries again.

#![allow(clippy::unwrap_used, reason = "tests")]

#[path = "receiver_crash/disk_full.rs"]
mod disk_full;
#[path = "receiver_crash/modes.rs"]
mod modes;
#[path = "receiver_crash/poisoned.rs"]
mod poisoned;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rm_e2e::{Setup, delivery, json_stdout};
use tokio::sync::Mutex;

/// Concurrent senders, like GitHub's bursts for a large matrix.
const SENDERS: usize = 32;
/// Answered deliveries before the kill: enough that many commits are behind us and many
/// requests are in flight at the moment of the kill.
const ANSWERED_BEFORE_KILL: usize = 400;
/// The longest one delivery may take; far above the receiver's milliseconds.
const SEND_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_delivery_answered_2xx_survives_sigkill() {
    let setup = Setup::new();
    let agent = setup.start_receiver().await;
    let pid = agent.child.id();
    let agent = Arc::new(agent);
    let answered = Arc::new(Mutex::new(Vec::<String>::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for sender in 0..SENDERS {
        let (agent, answered, count) = (agent.clone(), answered.clone(), count.clone());
        senders.push(tokio::spawn(async move {
            for n in 0.. {
                let job_id = 1_000_000 + (sender as i64) * 100_000 + n;
                let d = delivery("workflow_job.queued.6", Some(job_id));
                // Bounded: a request caught by the kill at an unlucky moment must end the
                // sender, not hang the test (it then counts as unanswered, which it was).
                let answer = tokio::time::timeout(SEND_TIMEOUT, agent.deliver(&d))
                    .await
                    .unwrap_or_else(|_| Err("no answer in time".to_owned()));
                match answer {
                    Ok(status) if (200..300).contains(&status) => {
                        answered.lock().await.push(d.guid);
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(status) => panic!("unexpected status {status}"),
                    // The kill: connections reset or refused from here on.
                    Err(_) => return,
                }
            }
        }));
    }
    while count.load(Ordering::SeqCst) < ANSWERED_BEFORE_KILL {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // SIGKILL while the senders are still sending: no flush, no drain, no destructor.
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    for s in senders {
        s.await.unwrap();
    }
    let answered: HashSet<String> = answered.lock().await.iter().cloned().collect();
    assert!(answered.len() >= ANSWERED_BEFORE_KILL);

    // The journal opens clean (the writer recovers the WAL) and holds every answered GUID.
    drop(rm_journal::Journal::open(&setup.journal(), rm_journal::Retention::default()).unwrap());
    let reader = rm_journal::Reader::open(&setup.journal()).unwrap();
    assert_eq!(reader.integrity_check().unwrap(), vec!["ok"]);
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
        "{} deliveries answered 2xx are missing, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    let jobs = json_stdout(&setup.run(&["jobs", "--json", "--limit", "1000000"]));
    assert!(jobs.as_array().unwrap().len() >= answered.len());

    // And it takes deliveries again.
    let agent = setup.start_receiver().await;
    let again = delivery("workflow_job.queued.6", Some(1));
    assert_eq!(agent.deliver(&again).await, Ok(202));
    assert_eq!(agent.deliver(&again).await, Ok(200));
}
