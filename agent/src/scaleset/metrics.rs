//! `/metrics` for the scale sets, from the live [`Board`]: per scale set, the statistics its
//! listener last saw, the last message journalled, whether it holds a session, and the
//! capacity the allocation pass last published for it.

use std::fmt;
use std::sync::Arc;

use rm_receiver::prometheus_client::collector::Collector;
use rm_receiver::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use rm_receiver::prometheus_client::metrics::MetricType;
use rm_receiver::prometheus_client::metrics::gauge::ConstGauge;

use super::Board;

/// How a gauge reads its value from what a listener saw (`None`: not known yet).
type Reading = fn(&super::Seen) -> Option<i64>;

/// The scale sets' gauges.
#[derive(Debug)]
pub struct ScaleSetMetrics {
    board: Arc<Board>,
}

impl ScaleSetMetrics {
    pub fn new(board: Arc<Board>) -> Self {
        Self { board }
    }
}

impl Collector for ScaleSetMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        if self.board.is_empty() {
            return Ok(());
        }
        let seen: Vec<(String, super::Seen)> = self
            .board
            .sources()
            .map(|s| (s.set.name.clone(), s.seen()))
            .collect();
        let gauges: [(&str, &str, Reading); 5] = [
            (
                "rm_scale_set_assigned_jobs",
                "Jobs assigned to the scale set (running ones included), from its last statistics",
                |s| s.statistics.as_ref().map(|s| s.total_assigned_jobs),
            ),
            (
                "rm_scale_set_running_jobs",
                "The scale set's running jobs, from its last statistics",
                |s| s.statistics.as_ref().map(|s| s.total_running_jobs),
            ),
            (
                "rm_scale_set_idle_runners",
                "The scale set's idle runners, from its last statistics",
                |s| s.statistics.as_ref().map(|s| s.total_idle_runners),
            ),
            (
                "rm_scale_set_last_message_id",
                "The id of the scale set's last message journalled",
                |s| i64::try_from(s.last_message_id).ok(),
            ),
            (
                "rm_scale_set_session",
                "1 while the listener holds the scale set's message session",
                |s| Some(i64::from(s.session_id.is_some())),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (set, seen) in &seen {
                if let Some(v) = value(seen) {
                    ConstGauge::new(v)
                        .encode(family.encode_family(&[("scale_set", set.as_str())])?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "rm_scale_set_capacity",
            "The jobs the scale set may have assigned at once on this host now (X-ScaleSetMaxCapacity of its next poll); 0 while the host takes no new runner",
            None,
            MetricType::Gauge,
        )?;
        for (set, capacity) in self.board.capacities() {
            ConstGauge::new(i64::from(capacity))
                .encode(family.encode_family(&[("scale_set", set.as_str())])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rm_receiver::prometheus_client::encoding::text::encode;
    use rm_receiver::prometheus_client::registry::Registry;

    use super::*;

    // A runtime: the HTTP client, never called, is built on one.
    #[tokio::test]
    async fn each_scale_set_has_its_statistics_session_and_capacity_as_gauges() {
        // Never called: the gauges read what the listener saw.
        let source = Arc::new(super::super::test_source());
        source.update(|seen| {
            seen.statistics = Some(rm_github::scaleset::Statistics {
                total_assigned_jobs: 3,
                total_running_jobs: 1,
                total_idle_runners: 2,
                ..Default::default()
            });
            seen.last_message_id = 100_004;
            seen.session_id = Some("s".into());
        });
        source.set_capacity(3);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ScaleSetMetrics::new(Arc::new(Board::new(vec![
            source,
        ])))));
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            "rm_scale_set_assigned_jobs{scale_set=\"acme-big\"} 3",
            "rm_scale_set_running_jobs{scale_set=\"acme-big\"} 1",
            "rm_scale_set_idle_runners{scale_set=\"acme-big\"} 2",
            "rm_scale_set_last_message_id{scale_set=\"acme-big\"} 100004",
            "rm_scale_set_session{scale_set=\"acme-big\"} 1",
            "rm_scale_set_capacity{scale_set=\"acme-big\"} 3",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }
}
