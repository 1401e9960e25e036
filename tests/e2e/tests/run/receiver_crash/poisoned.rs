//! A poisoned journal ends `rm-agent receive`: once a flush of committed deliveries fails, the
//! receiver answers what is in flight and exits 1 (systemd's `Restart=on-failure` restarts it
//! and SQLite recovers the journal), instead of answering 503 forever.
//!
//! The fault is real, not injected: the WAL is removed under the writer, so what the writer
//! commits next lands in a file that crash recovery would never read, and its flush fails.

use std::time::{Duration, Instant};

use rm_e2e::{Setup, delivery};

/// How long the receiver may take to drain and exit; far above what it needs.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The journal's WAL beside `journal`.
pub(crate) fn wal_of(journal: &std::path::Path) -> std::path::PathBuf {
    let mut wal = journal.as_os_str().to_owned();
    wal.push("-wal");
    wal.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_journal_drains_and_exits_1() {
    let setup = Setup::new();
    let mut agent = setup.start_receiver().await;
    assert_eq!(
        agent
            .deliver(&delivery("workflow_job.queued.6", Some(1)))
            .await,
        Ok(202)
    );

    std::fs::remove_file(wal_of(&setup.journal())).unwrap();
    let after = delivery("workflow_job.queued.6", Some(2));
    assert_eq!(agent.deliver(&after).await, Ok(503));

    let deadline = Instant::now() + EXIT_TIMEOUT;
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "rm-agent receive still runs with a poisoned journal"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "{}", setup.logs());
    let logs = setup.logs();
    assert!(logs.contains("was poisoned"), "{logs}");
    assert!(logs.contains("removed or replaced"), "{logs}");

    // Started again, the journal is sound and takes deliveries. (What was only in the removed
    // WAL is gone with it: that is the fault, not something rm can undo.)
    let agent = setup.start_receiver().await;
    assert_eq!(
        agent
            .deliver(&delivery("workflow_job.queued.6", Some(3)))
            .await,
        Ok(202)
    );
    let reader = rm_journal::Reader::open(&setup.journal()).unwrap();
    assert_eq!(reader.integrity_check().unwrap(), vec!["ok"]);
}
