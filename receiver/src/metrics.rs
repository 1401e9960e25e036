//! The receiver's Prometheus metrics, and the rendering of `/metrics` (which also reports what
//! the journal holds, read at scrape time).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rm_journal::JournalMetrics;

use crate::journal::ScrapeCounts;
use rm_http_serve::budget::BodyBudget;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    event: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    status: u16,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// Counters the request path updates; gauges refreshed from the journal at scrape time.
pub(crate) struct Metrics {
    /// Behind a lock only so that collectors can be added after the receiver is built.
    registry: Mutex<Registry>,
    deliveries: Family<DeliveryLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    jobs: Family<StateLabels, Gauge>,
    runners: Family<StateLabels, Gauge>,
    bodies: Arc<BodyBudget>,
    body_bytes: Gauge,
    body_bytes_high_water: Gauge,
}

impl Metrics {
    pub(crate) fn new(journal: &JournalMetrics, bodies: Arc<BodyBudget>) -> Self {
        let mut registry = Registry::default();
        let deliveries = Family::<DeliveryLabels, Counter>::default();
        let refused = Family::<RefusedLabels, Counter>::default();
        let jobs = Family::<StateLabels, Gauge>::default();
        let runners = Family::<StateLabels, Gauge>::default();
        registry.register(
            "rm_deliveries",
            "Webhook deliveries journalled, by event and outcome (already_journalled: a GUID seen before)",
            deliveries.clone(),
        );
        registry.register(
            "rm_receiver_refused",
            "Requests refused with nothing journalled, by status and reason",
            refused.clone(),
        );
        registry.register("rm_jobs", "Journalled workflow jobs by state", jobs.clone());
        registry.register(
            "rm_runners",
            "Runner attempts of this host by state",
            runners.clone(),
        );
        let body_bytes = Gauge::default();
        let body_bytes_high_water = Gauge::default();
        registry.register(
            "rm_receiver_body_bytes",
            "Bytes held by request bodies now, streaming in or waiting for their commit",
            body_bytes.clone(),
        );
        registry.register(
            "rm_receiver_body_bytes_high_water",
            "The most bytes request bodies have held at once since start",
            body_bytes_high_water.clone(),
        );
        journal.register(&mut registry);
        Metrics {
            registry: Mutex::new(registry),
            deliveries,
            refused,
            jobs,
            runners,
            bodies,
            body_bytes,
            body_bytes_high_water,
        }
    }

    /// Adds metrics that are read at scrape time from outside the receiver.
    pub(crate) fn add_collector(&self, collector: Box<dyn Collector>) {
        self.registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .register_collector(collector);
    }

    pub(crate) fn delivery(&self, event: &str, outcome: &str) {
        self.deliveries
            .get_or_create(&DeliveryLabels {
                event: event.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    pub(crate) fn refused(&self, status: u16, reason: &'static str) {
        self.refused
            .get_or_create(&RefusedLabels { status, reason })
            .inc();
    }

    /// Renders the text exposition, after refreshing the gauges from `counts` when the journal
    /// could be read.
    pub(crate) fn render(&self, counts: Option<ScrapeCounts>) -> String {
        if let Some(counts) = counts {
            refresh(&self.jobs, counts.jobs, "job");
            if let Some(runners) = counts.runners {
                refresh(&self.runners, runners, "runner");
            }
        }
        let gauge = |bytes: usize| i64::try_from(bytes).unwrap_or(i64::MAX);
        self.body_bytes.set(gauge(self.bodies.held()));
        self.body_bytes_high_water
            .set(gauge(self.bodies.high_water()));
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        if encode(&mut out, &registry).is_err() {
            tracing::warn!("cannot encode /metrics");
        }
        out
    }
}

/// Sets a by-state gauge family to the journal's counts, dropping states that emptied.
fn refresh(
    family: &Family<StateLabels, Gauge>,
    counts: Result<Vec<(String, i64)>, rm_journal::JournalError>,
    what: &str,
) {
    match counts {
        Ok(counts) => {
            family.clear();
            for (state, count) in counts {
                family.get_or_create(&StateLabels { state }).set(count);
            }
        }
        Err(err) => tracing::warn!(error = %err, "cannot read {what} counts for /metrics"),
    }
}
