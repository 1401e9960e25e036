//! What the receiver needs of a journal: the intake ([`rm_journal::Intake`]: record, probe) and
//! what `/metrics` shows of it (the writer's commit metrics, the job and runner counts read at
//! scrape time). Implemented for the embedded SQLite journal and for the PostgreSQL journal of
//! a fleet (CONTRACT §9), so several `rm-agent receive` processes can share one database.

use std::future::Future;

use rm_journal::{Intake, Journal, JournalError, JournalMetrics, Reader};

/// How long a scrape waits for the PostgreSQL journal's counts: a database that is down must
/// not hold `/metrics` (the counts are then left as the last scrape saw them).
const PG_SCRAPE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A state name and how many rows are in it.
pub type StateCounts = Vec<(String, i64)>;

/// What one scrape read from the journal.
pub struct ScrapeCounts {
    /// Jobs by state.
    pub jobs: Result<StateCounts, JournalError>,
    /// This host's runner attempts by state; `None` where the journal holds none (the
    /// PostgreSQL journal, until runs use it).
    pub runners: Option<Result<StateCounts, JournalError>>,
}

/// A journal the receiver can write deliveries to and report on.
pub trait ReceiverJournal: Intake {
    /// The writer's metrics (commit time, group sizes), registered once with `/metrics`.
    fn metrics(&self) -> &JournalMetrics;

    /// The counts `/metrics` shows, read at scrape time; `None` when the journal cannot be
    /// read now (the gauges keep their last values).
    fn counts(&self) -> impl Future<Output = Option<ScrapeCounts>> + Send;
}

impl ReceiverJournal for Journal {
    fn metrics(&self) -> &JournalMetrics {
        Journal::metrics(self)
    }

    async fn counts(&self) -> Option<ScrapeCounts> {
        let path = self.path().to_owned();
        tokio::task::spawn_blocking(move || {
            let reader = Reader::open(&path).ok()?;
            Some(ScrapeCounts {
                jobs: reader.job_counts(),
                runners: Some(reader.attempt_counts()),
            })
        })
        .await
        .ok()
        .flatten()
    }
}

impl ReceiverJournal for rm_journal::PgJournal {
    fn metrics(&self) -> &JournalMetrics {
        rm_journal::PgJournal::metrics(self)
    }

    async fn counts(&self) -> Option<ScrapeCounts> {
        let journal = self.clone();
        // The sync client (and its drop) block: the whole read runs off the runtime.
        let read = tokio::task::spawn_blocking(move || {
            Some(ScrapeCounts {
                jobs: journal.job_counts(),
                runners: None,
            })
        });
        tokio::time::timeout(PG_SCRAPE_TIMEOUT, read)
            .await
            .ok()?
            .ok()
            .flatten()
    }
}
