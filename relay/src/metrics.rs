//! The relay's Prometheus metrics and the rendering of `/metrics`. No label carries a channel
//! name or a host, so the page tells an outsider nothing about who uses the relay.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rm_http_serve::budget::BodyBudget;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: u16,
}

/// Which form of a channel's stream.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    pub form: &'static str,
}

/// The relay form (`/subscribe/NAME`).
pub const RELAY_FORM: StreamLabels = StreamLabels { form: "relay" };
/// The smee form (`/smee/ID`).
pub const SMEE_FORM: StreamLabels = StreamLabels { form: "smee" };

pub struct Metrics {
    registry: Registry,
    ingested: Family<OutcomeLabels, Counter>,
    refused: Family<StatusLabels, Counter>,
    limited: Family<ReasonLabels, Counter>,
    dropped: Counter,
    subscribers: Family<StreamLabels, Gauge>,
    events_sent: Family<StreamLabels, Counter>,
    acks: Counter,
    bodies: Arc<BodyBudget>,
    body_bytes: Gauge,
    body_bytes_high_water: Gauge,
}

impl Metrics {
    /// The relay's metrics; `bodies` is the ingest's body budget, read at every scrape.
    pub fn new(bodies: Arc<BodyBudget>) -> Self {
        let mut registry = Registry::default();
        let ingested = Family::<OutcomeLabels, Counter>::default();
        let refused = Family::<StatusLabels, Counter>::default();
        let limited = Family::<ReasonLabels, Counter>::default();
        let dropped = Counter::default();
        let subscribers = Family::<StreamLabels, Gauge>::default();
        let events_sent = Family::<StreamLabels, Counter>::default();
        let acks = Counter::default();
        registry.register(
            "rm_relay_deliveries_ingested",
            "Deliveries taken on /hooks, by outcome (new: stored; duplicate: a GUID seen before)",
            ingested.clone(),
        );
        registry.register(
            "rm_relay_ingest_refused",
            "Ingest requests refused with nothing stored, by status",
            refused.clone(),
        );
        registry.register(
            "rm_relay_ingest_limited",
            "Deliveries refused by a channel's limits, by reason (rate: 429; quota: 503, the quota holds only unacknowledged deliveries; memory: 503, the ingest's body budget is spent)",
            limited.clone(),
        );
        registry.register(
            "rm_relay_deliveries_dropped",
            "Acknowledged deliveries dropped, oldest first, to keep a channel within its quota",
            dropped.clone(),
        );
        registry.register(
            "rm_relay_subscribers",
            "Streams open now, by form (relay or smee)",
            subscribers.clone(),
        );
        registry.register(
            "rm_relay_events_sent",
            "Delivery events written to streams, by form",
            events_sent.clone(),
        );
        registry.register("rm_relay_acks", "Acks recorded", acks.clone());
        let body_bytes = Gauge::default();
        let body_bytes_high_water = Gauge::default();
        registry.register(
            "rm_relay_ingest_body_bytes",
            "Bytes ingest bodies hold now, while they stream in and until they are stored",
            body_bytes.clone(),
        );
        registry.register(
            "rm_relay_ingest_body_bytes_high_water",
            "The most bytes ingest bodies have held at once since start",
            body_bytes_high_water.clone(),
        );
        Metrics {
            bodies,
            body_bytes,
            body_bytes_high_water,
            registry,
            ingested,
            refused,
            limited,
            dropped,
            subscribers,
            events_sent,
            acks,
        }
    }
}

impl Metrics {
    pub fn ingested(&self, duplicate: bool) {
        let outcome = if duplicate { "duplicate" } else { "new" };
        self.ingested
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn refused(&self, status: u16) {
        self.refused.get_or_create(&StatusLabels { status }).inc();
    }

    /// A delivery refused by a channel's limits: `reason` is `rate` or `quota`.
    pub fn limited(&self, reason: &'static str) {
        self.limited.get_or_create(&ReasonLabels { reason }).inc();
    }

    pub fn dropped(&self, count: usize) {
        self.dropped
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// Counts a stream as open until the returned guard is dropped.
    pub fn subscriber(&self, form: StreamLabels) -> SubscriberGuard {
        let gauge = self.subscribers.get_or_create(&form).clone();
        gauge.inc();
        SubscriberGuard(gauge)
    }

    pub fn event_sent(&self, form: StreamLabels) {
        self.events_sent.get_or_create(&form).inc();
    }

    pub fn ack(&self) {
        self.acks.inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.body_bytes.set(gauge(self.bodies.held()));
        self.body_bytes_high_water
            .set(gauge(self.bodies.high_water()));
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            tracing::warn!("cannot encode /metrics");
        }
        out
    }
}

/// Keeps a stream counted in `rm_relay_subscribers` for as long as it lives.
pub struct SubscriberGuard(Gauge);

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
