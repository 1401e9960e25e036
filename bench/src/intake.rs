//! The journal intake benchmark (`receiver-load --intake`): the same pre-signed delivery bodies
//! recorded straight into each journal behind `rm_journal::Intake` (no HTTP), side by side in one
//! run: the SQLite journal (a file in a temporary directory, full sync) and the PostgreSQL
//! journal with one and with two writers (two receivers) on a PostgreSQL server started for the
//! run with its default durability (`fsync` on, synchronous commit; tests/support/postgres.rs).
//! N concurrent recorders each take the next body, give it a fresh GUID and await `record`;
//! every record's latency is kept. One JSON line per journal; docs/performance.md has figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use hdrhistogram::Histogram;
use rm_journal::{Incoming, Intake, Journal, Judged, PgJournal, Recorded, Retention};

use crate::delivery::{Delivery, EVENT};
use crate::pg_server;

/// Latencies above this are clamped (a record that takes a minute is a failure anyway).
const MAX_TRACKED_US: u64 = 60_000_000;

/// One journal's figures.
pub struct Figures {
    pub journal: String,
    pub recorders: usize,
    pub deliveries: usize,
    pub elapsed: Duration,
    pub latency_us: Histogram<u64>,
    pub commits: u64,
}

impl Figures {
    /// The one-line JSON summary.
    pub fn summary(&self) -> String {
        serde_json::json!({
            "journal": self.journal,
            "recorders": self.recorders,
            "deliveries": self.deliveries,
            "seconds": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "deliveries_per_s": (self.deliveries as f64 / self.elapsed.as_secs_f64()).round(),
            "commits": self.commits,
            "record_p50_us": self.latency_us.value_at_quantile(0.50),
            "record_p99_us": self.latency_us.value_at_quantile(0.99),
            "record_max_us": self.latency_us.max(),
        })
        .to_string()
    }
}

/// Runs the comparison over `pool` (each journal records every body once) with `recorders`
/// concurrent recorders; `pg_writers` lists the PostgreSQL writer counts to run (1, 2).
pub async fn compare(
    pool: Arc<Vec<Delivery>>,
    recorders: usize,
    pg_writers: &[usize],
) -> Result<Vec<Figures>> {
    let mut figures = Vec::new();
    let dir = tempfile::tempdir().context("a temporary directory for the SQLite journal")?;
    let sqlite = Journal::open(
        &dir.path().join(rm_journal::JOURNAL_FILE),
        Retention::default(),
    )
    .context("opening the SQLite journal")?;
    let commits = sqlite.metrics().clone();
    let mut run = drive("sqlite", vec![sqlite], pool.clone(), recorders).await?;
    run.commits = commits.commits();
    figures.push(run);

    let server = tokio::task::spawn_blocking(pg_server::durable)
        .await?
        .map_err(|why| anyhow!("cannot start PostgreSQL for the benchmark: {why}"))?;
    for &writers in pg_writers {
        let db = server
            .database(&format!("bench_{writers}"))
            .map_err(|why| anyhow!(why))?;
        let url = db.url();
        let journals = tokio::task::spawn_blocking(move || {
            (0..writers)
                .map(|_| PgJournal::connect(&url))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?
        .context("connecting to PostgreSQL")?;
        let metrics: Vec<_> = journals.iter().map(|j| j.metrics().clone()).collect();
        let label = format!(
            "postgres, {writers} writer{}",
            if writers == 1 { "" } else { "s" }
        );
        let mut run = drive(&label, journals, pool.clone(), recorders).await?;
        run.commits = metrics.iter().map(|m| m.commits()).sum();
        figures.push(run);
        tokio::task::spawn_blocking(move || drop(db)).await?;
    }
    Ok(figures)
}

/// Records every body of `pool` once through `journals` (recorder `n` uses journal
/// `n % journals.len()`, as receivers behind a load balancer would).
async fn drive<J: Intake>(
    label: &str,
    journals: Vec<J>,
    pool: Arc<Vec<Delivery>>,
    recorders: usize,
) -> Result<Figures> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..recorders {
        let journal = journals[n % journals.len()].clone();
        let pool = pool.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new_with_bounds(1, MAX_TRACKED_US, 3)?;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(delivery) = pool.get(index) else {
                    break;
                };
                let incoming = Incoming {
                    guid: uuid::Uuid::new_v4().to_string(),
                    event: EVENT.to_owned(),
                    headers: vec![
                        ("x-github-event".to_owned(), EVENT.to_owned()),
                        ("x-hub-signature-256".to_owned(), signature(delivery)),
                    ],
                    body: delivery.body.to_vec(),
                    received_at_ms: rm_vocab::now(),
                    source: rm_vocab::Source::Webhook,
                };
                let at = Instant::now();
                // Judged here, as the receiver judges a body of this size (inline).
                let answer = journal.record_judged(Judged::of(incoming)?).await?;
                latency.saturating_record(at.elapsed().as_micros().max(1) as u64);
                anyhow::ensure!(
                    matches!(answer, Recorded::New(_)),
                    "a fresh GUID was answered {answer:?}"
                );
            }
            anyhow::Ok(latency)
        }));
    }
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, MAX_TRACKED_US, 3)?;
    for task in tasks {
        latency_us.add(task.await??)?;
    }
    Ok(Figures {
        journal: label.to_owned(),
        recorders,
        deliveries: pool.len(),
        elapsed: started.elapsed(),
        latency_us,
        commits: 0,
    })
}

fn signature(delivery: &Delivery) -> String {
    delivery.signature.to_str().unwrap_or_default().to_owned()
}
