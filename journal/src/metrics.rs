//! The writer's own measurements, registered into the process's Prometheus registry.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Commit time and batch size of the group-commit writer.
#[derive(Clone)]
pub struct JournalMetrics {
    commit_seconds: Histogram,
    batch_size: Histogram,
    commit_failures: Counter,
    commits: Counter,
    sync_seconds: Histogram,
    sync_failures: Counter,
}

impl Default for JournalMetrics {
    fn default() -> Self {
        JournalMetrics {
            // 100 µs .. ~1.6 s.
            commit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            // 1 .. 1024 deliveries.
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            commit_failures: Counter::default(),
            commits: Counter::default(),
            sync_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            sync_failures: Counter::default(),
        }
    }
}

impl JournalMetrics {
    pub(crate) fn observe_commit(&self, took: Duration, size: usize, ok: bool) {
        self.commit_seconds.observe(took.as_secs_f64());
        self.batch_size.observe(size as f64);
        if ok {
            self.commits.inc();
        } else {
            self.commit_failures.inc();
        }
    }

    pub(crate) fn observe_sync(&self, took: Duration, ok: bool) {
        self.sync_seconds.observe(took.as_secs_f64());
        if !ok {
            self.sync_failures.inc();
        }
    }

    /// Group commits that succeeded since the journal was opened.
    pub fn commits(&self) -> u64 {
        self.commits.get()
    }

    /// Adds the writer's metrics to `registry` under `rm_journal_*`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rm_journal_commit_seconds",
            "Time to write and commit one group of deliveries (its flush to disk is rm_journal_sync_seconds)",
            self.commit_seconds.clone(),
        );
        registry.register(
            "rm_journal_commit_batch_size",
            "Deliveries committed together in one transaction",
            self.batch_size.clone(),
        );
        registry.register(
            "rm_journal_commits",
            "Group commits that succeeded",
            self.commits.clone(),
        );
        registry.register(
            "rm_journal_sync_seconds",
            "Time to flush the WAL to disk before answering the groups committed meanwhile",
            self.sync_seconds.clone(),
        );
        registry.register(
            "rm_journal_sync_failures",
            "Failed WAL flushes (the journal then refuses deliveries until restarted)",
            self.sync_failures.clone(),
        );
        registry.register(
            "rm_journal_commit_failures",
            "Group commits that failed (every delivery in them was answered 503)",
            self.commit_failures.clone(),
        );
    }
}
