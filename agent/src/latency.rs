//! How long jobs wait (CONTRACT §8): from queued to the start of the runner process that took
//! the job, and from queued to the job's start (GitHub's `in_progress`), per policy.
//!
//! This module owns what a wait sample is ([`samples`]), the windowed percentiles `status`
//! shows ([`summarize`], computed from the journal so a stopped agent answers too), and the
//! `/metrics` histograms `rm-agent run` keeps since it started ([`WaitMetrics`], fed by
//! [`spawn_recorder`] from the same rows). The journal owns the rows (`rm_journal::WaitRow`).
//!
//! The ends of a wait: "queued" is GitHub's `created_at` of the job (the journal's first sighting
//! when no sighting carried it); "runner started" is when this host started the runner process
//! of the attempt GitHub gave the job to; "job started" is GitHub's `started_at` of the started
//! job (the time the journal learned of the `in_progress` when absent). Only jobs that started
//! on a runner of this host are samples, counted once the job has started. GitHub's dates come
//! from GitHub's clock and have whole seconds; a wait that comes out negative (a spare runner of
//! `min_runners` started before the job was queued, or clock skew) counts as 0.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rm_journal::{Reader, WaitRow};
use rm_receiver::prometheus_client::collector::Collector;
use rm_receiver::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use rm_receiver::prometheus_client::metrics::MetricType;
use rm_receiver::prometheus_client::metrics::family::Family;
use rm_receiver::prometheus_client::metrics::histogram::Histogram;
use rm_vocab::{JobId, UnixMs};
use serde_json::{Value, json};

/// The window `status` reports percentiles over: the waits of jobs that started in the last
/// hour (CONTRACT §8).
pub(crate) const WINDOW: Duration = Duration::from_secs(3600);

/// The histograms' upper bounds, in seconds: from a runner already waiting (a few tens of ms)
/// through a cold start (a package copy and a registration: seconds) and a queue behind a full
/// host (minutes) to GitHub's patience with a queued job. Waits past an hour land in `+Inf`.
pub(crate) const BUCKETS_SECONDS: [f64; 17] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
    1800.0, 3600.0,
];

/// How often `rm-agent run` looks for newly started jobs to add to the histograms. A scrape sees
/// a job at most this much after the journal learned it started; each look reads the last
/// [`WINDOW`] of started jobs, a small indexed query.
pub(crate) const RECORD_INTERVAL: Duration = Duration::from_secs(2);

/// The series names (CONTRACT §8).
pub(crate) const RUNNER_STARTED_SERIES: &str = "rm_job_queue_to_runner_started_seconds";
pub(crate) const JOB_STARTED_SERIES: &str = "rm_job_queue_to_job_started_seconds";

/// One job's wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sample {
    pub job_id: JobId,
    pub policy: String,
    /// When the job started: what places the sample in a window.
    pub started_at_ms: UnixMs,
    /// `None` when the journal does not know when the runner was started.
    pub queue_to_runner_started_ms: Option<i64>,
    pub queue_to_job_started_ms: i64,
}

/// The samples of the journal's rows: the one place that says where a wait begins and ends.
pub(crate) fn samples(rows: &[WaitRow]) -> Vec<Sample> {
    rows.iter()
        .map(|row| {
            let queued = row.queued_at_ms.unwrap_or(row.first_seen_at_ms);
            Sample {
                job_id: row.job_id,
                policy: row.policy.clone(),
                started_at_ms: row.job_started_at_ms,
                queue_to_runner_started_ms: row
                    .runner_started_at_ms
                    .map(|at| at.saturating_sub(queued).max(0)),
                queue_to_job_started_ms: row.job_started_at_ms.saturating_sub(queued).max(0),
            }
        })
        .collect()
}

/// Count and nearest-rank percentiles of one kind of wait; no percentile without a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Percentiles {
    pub count: usize,
    pub p50_ms: Option<i64>,
    pub p90_ms: Option<i64>,
    pub p99_ms: Option<i64>,
}

impl Percentiles {
    fn of(mut values: Vec<i64>) -> Percentiles {
        values.sort_unstable();
        // Nearest rank: the smallest value with at least p% of the samples at or below it, so
        // every percentile is a wait that happened and p50 <= p90 <= p99.
        let rank = |p: usize| {
            let n = values.len();
            let index = (p * n).div_ceil(100).clamp(1, n.max(1)) - 1;
            values.get(index).copied()
        };
        Percentiles {
            count: values.len(),
            p50_ms: rank(50),
            p90_ms: rank(90),
            p99_ms: rank(99),
        }
    }

    fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
        })
    }
}

/// Both waits over one set of samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Waits {
    pub queue_to_runner_started: Percentiles,
    pub queue_to_job_started: Percentiles,
}

impl Waits {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample> + Clone) -> Waits {
        Waits {
            queue_to_runner_started: Percentiles::of(
                samples
                    .clone()
                    .filter_map(|s| s.queue_to_runner_started_ms)
                    .collect(),
            ),
            queue_to_job_started: Percentiles::of(
                samples.map(|s| s.queue_to_job_started_ms).collect(),
            ),
        }
    }

    fn to_json(self) -> Value {
        json!({
            "queue_to_runner_started": self.queue_to_runner_started.to_json(),
            "queue_to_job_started": self.queue_to_job_started.to_json(),
        })
    }
}

/// What `status` reports: the waits of jobs that started within the window, overall and per
/// policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Latency {
    pub window: Duration,
    pub all: Waits,
    pub per_policy: BTreeMap<String, Waits>,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            window: WINDOW,
            all: Waits::default(),
            per_policy: BTreeMap::new(),
        }
    }
}

/// The window's percentiles from the journal's rows: samples of the jobs that started in
/// `(now - window, now]`, overall and per policy.
pub(crate) fn summarize(rows: &[WaitRow], now_ms: UnixMs, window: Duration) -> Latency {
    let since = now_ms - window;
    let in_window: Vec<Sample> = samples(rows)
        .into_iter()
        .filter(|s| s.started_at_ms > since && s.started_at_ms <= now_ms)
        .collect();
    let mut policies: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for sample in &in_window {
        policies.entry(&sample.policy).or_default().push(sample);
    }
    Latency {
        window,
        all: Waits::of(in_window.iter()),
        per_policy: policies
            .into_iter()
            .map(|(policy, samples)| (policy.to_owned(), Waits::of(samples.into_iter())))
            .collect(),
    }
}

/// [`summarize`] over what the journal holds for the last [`WINDOW`].
pub(crate) fn read(reader: &Reader, now_ms: UnixMs) -> anyhow::Result<Latency> {
    let rows = reader
        .job_waits(window_start(now_ms))
        .map_err(|e| anyhow::anyhow!("cannot read job wait times from the journal: {e}"))?;
    Ok(summarize(&rows, now_ms, WINDOW))
}

/// `status --json`'s `latency` (CONTRACT §8), with `per_policy` beside the contract's fields.
pub(crate) fn to_json(latency: &Latency) -> Value {
    let mut value = latency.all.to_json();
    if let Some(map) = value.as_object_mut() {
        map.insert("window_s".into(), json!(latency.window.as_secs()));
        map.insert(
            "per_policy".into(),
            latency
                .per_policy
                .iter()
                .map(|(policy, waits)| (policy.clone(), waits.to_json()))
                .collect::<serde_json::Map<_, _>>()
                .into(),
        );
    }
    value
}

/// A wait for people: `850ms`, `4.2s`, `3m 10s`.
fn human(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(Duration::from_secs(u64::try_from(ms / 1000).unwrap_or(0)))
            .to_string()
    }
}

fn render_percentiles(p: Percentiles) -> String {
    match (p.p50_ms, p.p90_ms, p.p99_ms) {
        (Some(p50), Some(p90), Some(p99)) => {
            format!("p50 {} p90 {} p99 {}", human(p50), human(p90), human(p99))
        }
        _ => "none".to_owned(),
    }
}

/// `status`'s line: the window's waits, then the policies' when there is more than one.
pub(crate) fn render(latency: &Latency) -> String {
    let window = humantime::format_duration(latency.window);
    let count = latency.all.queue_to_job_started.count;
    if count == 0 {
        return format!("no job started on this host in the last {window}");
    }
    let waits = |w: &Waits| {
        format!(
            "queued to runner started {}; queued to job started {}",
            render_percentiles(w.queue_to_runner_started),
            render_percentiles(w.queue_to_job_started)
        )
    };
    let mut out = format!(
        "{count} job{} started in the last {window}: {}",
        if count == 1 { "" } else { "s" },
        waits(&latency.all)
    );
    if latency.per_policy.len() > 1 {
        for (policy, w) in &latency.per_policy {
            out.push_str(&format!(
                "\n          {policy} ({}): {}",
                w.queue_to_job_started.count,
                waits(w)
            ));
        }
    }
    out
}

/// Which started jobs the histograms have counted. Jobs the journal held when the process
/// started are not this process's news (the histograms count since the process started, as
/// Prometheus expects of a counter); each other job is counted once, when it is first seen
/// started within the window.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// Job id → its start, kept while the start is within the window (rows older than that are
    /// never read again, so forgetting them cannot count a job twice).
    seen: HashMap<JobId, UnixMs>,
}

impl Recorder {
    /// A recorder that treats every job in `rows` as already counted.
    pub(crate) fn seeded(rows: &[WaitRow]) -> Recorder {
        Recorder {
            seen: rows
                .iter()
                .map(|r| (r.job_id, r.job_started_at_ms))
                .collect(),
        }
    }

    /// The samples of `rows` not counted yet; forgets jobs that started before `since_ms`.
    pub(crate) fn fresh(&mut self, rows: &[WaitRow], since_ms: UnixMs) -> Vec<Sample> {
        self.seen.retain(|_, started| *started >= since_ms);
        samples(rows)
            .into_iter()
            .filter(|s| self.seen.insert(s.job_id, s.started_at_ms).is_none())
            .collect()
    }
}

type PolicyLabels = Vec<(String, String)>;
type Histograms = Family<PolicyLabels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS_SECONDS)
}

/// The two histograms by policy, cumulative since the process started; register with
/// [`rm_receiver::Receiver::add_collector`].
#[derive(Clone)]
pub(crate) struct WaitMetrics {
    runner_started: Arc<Histograms>,
    job_started: Arc<Histograms>,
}

impl Default for WaitMetrics {
    fn default() -> Self {
        WaitMetrics {
            runner_started: Arc::new(Family::new_with_constructor(histogram)),
            job_started: Arc::new(Family::new_with_constructor(histogram)),
        }
    }
}

impl fmt::Debug for WaitMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitMetrics").finish_non_exhaustive()
    }
}

impl WaitMetrics {
    pub(crate) fn observe(&self, sample: &Sample) {
        let labels = vec![("policy".to_owned(), sample.policy.clone())];
        let seconds = |ms: i64| ms as f64 / 1000.0;
        if let Some(ms) = sample.queue_to_runner_started_ms {
            self.runner_started
                .get_or_create(&labels)
                .observe(seconds(ms));
        }
        self.job_started
            .get_or_create(&labels)
            .observe(seconds(sample.queue_to_job_started_ms));
    }
}

impl Collector for WaitMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let metric = encoder.encode_descriptor(
            RUNNER_STARTED_SERIES,
            "Seconds from a job's queueing (GitHub's created_at) to the start of the runner process that took it, by policy",
            None,
            MetricType::Histogram,
        )?;
        self.runner_started.encode(metric)?;
        let metric = encoder.encode_descriptor(
            JOB_STARTED_SERIES,
            "Seconds from a job's queueing (GitHub's created_at) to its start on a runner of this host (GitHub's started_at), by policy",
            None,
            MetricType::Histogram,
        )?;
        self.job_started.encode(metric)
    }
}

/// Starts counting the jobs that start from now on into `metrics`: the jobs the journal at
/// `journal` already holds as started are read now (call it before the receiver takes
/// deliveries), then the journal is read every [`RECORD_INTERVAL`]. A journal that cannot be
/// read is retried at the next round; the histograms only miss what started longer than
/// [`WINDOW`] before a read succeeds.
pub(crate) fn spawn_recorder(
    journal: &Path,
    metrics: WaitMetrics,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let reader = Reader::open(journal)
        .map_err(|e| anyhow::anyhow!("cannot open the journal for wait times: {e}"))?;
    let rows = reader
        .job_waits(window_start(rm_vocab::now()))
        .map_err(|e| anyhow::anyhow!("cannot read job wait times from the journal: {e}"))?;
    let recorder = Recorder::seeded(&rows);
    let path: PathBuf = journal.to_owned();
    Ok(tokio::spawn(record(path, reader, recorder, metrics)))
}

/// The start of the [`WINDOW`] that ends at `now`.
fn window_start(now: UnixMs) -> UnixMs {
    now - WINDOW
}

async fn record(path: PathBuf, reader: Reader, recorder: Recorder, metrics: WaitMetrics) {
    let state = Arc::new(std::sync::Mutex::new((Some(reader), recorder)));
    let mut tick = tokio::time::interval(RECORD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (state, path, metrics) = (Arc::clone(&state), path.clone(), metrics.clone());
        // SQLite reads block: off the runtime's threads.
        let round = tokio::task::spawn_blocking(move || {
            let mut guard = state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (reader, recorder) = &mut *guard;
            if reader.is_none() {
                *reader = Some(Reader::open(&path)?);
            }
            let since = window_start(rm_vocab::now());
            let rows = match reader.as_ref().map(|r| r.job_waits(since)) {
                Some(Ok(rows)) => rows,
                Some(Err(e)) => {
                    // A fresh connection next round (the file may have been replaced).
                    *reader = None;
                    return Err(e);
                }
                None => Vec::new(),
            };
            for sample in recorder.fresh(&rows, since) {
                metrics.observe(&sample);
            }
            Ok::<(), rm_journal::JournalError>(())
        })
        .await;
        match round {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read job wait times; retrying"),
            Err(e) => tracing::warn!(error = %e, "the wait-time round failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests;
