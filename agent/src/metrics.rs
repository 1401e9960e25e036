//! What `rm-agent run` adds to the receiver's `/metrics` (CONTRACT §4): GitHub requests by
//! endpoint and status, the rate limit, each App's budgets and JIT registrations (several Apps
//! may share them), the polling pace and next poll, the requests of the last hour and whether
//! webhooks are trusted. Read at every scrape from the GitHub client and the
//! poller's latest status, so nothing here has to be kept up to date.

use std::fmt;
use std::time::SystemTime;

use rm_github::GithubClient;
use rm_receiver::prometheus_client::collector::Collector;
use rm_receiver::prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeMetric as _,
};
use rm_receiver::prometheus_client::metrics::MetricType;
use rm_receiver::prometheus_client::metrics::counter::ConstCounter;
use rm_receiver::prometheus_client::metrics::gauge::ConstGauge;
use tokio::sync::watch;

use crate::polling::PollerStatus;

/// The agent's scrape-time metrics; register with [`rm_receiver::Receiver::add_collector`].
pub(crate) struct AgentMetrics {
    status: watch::Receiver<PollerStatus>,
    client: GithubClient,
}

impl AgentMetrics {
    pub(crate) fn new(status: watch::Receiver<PollerStatus>, client: GithubClient) -> AgentMetrics {
        AgentMetrics { status, client }
    }
}

impl fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentMetrics").finish_non_exhaustive()
    }
}

/// Encodes one gauge without labels.
fn gauge<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: V,
) -> fmt::Result {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

/// Encodes one gauge family of `(label name, label value)` samples.
/// A counter family read from `crate::executor::tally`: name, help, label names, counts.
type TallyFamily = (
    &'static str,
    &'static str,
    [&'static str; 3],
    Vec<([String; 3], u64)>,
);

fn gauge_family<V: EncodeGaugeValue + Copy>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    samples: &[(&str, V)],
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (value_label, value) in samples {
        let labels = [(label, *value_label)];
        ConstGauge::new(*value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for AgentMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let status = self.status.borrow().clone();
        let now = SystemTime::now();

        let counts = self.client.request_counts();
        let statuses: Vec<String> = counts.iter().map(|(_, s, _)| s.to_string()).collect();
        {
            let mut requests = encoder.encode_descriptor(
                "rm_github_requests",
                "Requests sent to GitHub by endpoint and status (status 0: no answer)",
                None,
                MetricType::Counter,
            )?;
            for ((endpoint, _, count), status) in counts.iter().zip(&statuses) {
                let labels = [("endpoint", *endpoint), ("status", status.as_str())];
                ConstCounter::new(*count).encode(requests.encode_family(&labels)?)?;
            }
        }

        if let Some(rate) = status.rate_limit {
            let remaining = i64::try_from(rate.remaining).unwrap_or(i64::MAX);
            let limit = i64::try_from(rate.limit).unwrap_or(i64::MAX);
            gauge(
                &mut encoder,
                "rm_github_rate_limit_remaining",
                "Requests left in the binding core rate limit (the installation with least left)",
                remaining,
            )?;
            gauge(
                &mut encoder,
                "rm_github_rate_limit_limit",
                "The binding core rate limit's size per hour",
                limit,
            )?;
        }
        let apps = crate::status_file::app_budgets(
            &self.client.app_ids(),
            &self.client.budget(),
            |installation| self.client.app_of(installation),
            &self.client.registration_counts(),
        );
        {
            let mut remaining = encoder.encode_descriptor(
                "rm_github_budget_remaining",
                "Requests left in a rate-limit resource of a scope (an App's JWT, app:<id>, or an installation, installation:<id>), by the App it belongs to",
                None,
                MetricType::Gauge,
            )?;
            for app in &apps {
                let app_id = app.app_id.to_string();
                for b in &app.budgets {
                    let Some(left) = b.remaining else { continue };
                    let labels = [
                        ("app", app_id.as_str()),
                        ("scope", b.scope.as_str()),
                        ("resource", b.resource.as_str()),
                    ];
                    ConstGauge::new(i64::try_from(left).unwrap_or(i64::MAX))
                        .encode(remaining.encode_family(&labels)?)?;
                }
            }
        }
        {
            let mut registrations = encoder.encode_descriptor(
                "rm_github_jit_registrations",
                "JIT registrations GitHub issued, by the App whose installation asked",
                None,
                MetricType::Counter,
            )?;
            for app in &apps {
                let labels = [("app", app.app_id.to_string())];
                ConstCounter::new(app.registrations)
                    .encode(registrations.encode_family(&labels)?)?;
            }
        }
        let reachable = self.client.contact().reachable;
        gauge(
            &mut encoder,
            "rm_github_reachable",
            "1 while GitHub answers requests, 0 after one got no answer",
            i64::from(reachable),
        )?;
        // Per installation (and the App): whether its POSTs count as content creation now, and
        // until when a learned content limit lasts.
        let content = crate::status_file::content(&self.client.content_pacing());
        let scopes: Vec<(String, i64, Option<i64>)> = content
            .iter()
            // The gauge is plain seconds since the epoch: the instant ends here.
            .map(|c| {
                let until = c.until_ms.map(rm_vocab::UnixMs::get);
                (c.scope.clone(), i64::from(c.counted), until)
            })
            .collect();
        let paced: Vec<(&str, i64)> = scopes.iter().map(|(s, v, _)| (s.as_str(), *v)).collect();
        gauge_family(
            &mut encoder,
            "rm_github_content_paced",
            "1 while the scope's POSTs count as content creation (80 a minute, 500 an hour): \
             github.pacing = \"cautious\", or learned from a secondary limit GitHub answered",
            "scope",
            &paced,
        )?;
        let until: Vec<(&str, i64)> = scopes
            .iter()
            .filter_map(|(s, _, u)| Some((s.as_str(), u.map(|ms| ms / 1000)?)))
            .collect();
        gauge_family(
            &mut encoder,
            "rm_github_content_paced_until_seconds",
            "When a learned content limit stops counting, in seconds since the Unix epoch",
            "scope",
            &until,
        )?;
        let last_hour = status.requests_last_hour;
        gauge_family(
            &mut encoder,
            "rm_github_requests_last_hour",
            "Requests to GitHub in the last hour: charged against the rate limit or not (304s)",
            "charged",
            &[
                ("true", i64::try_from(last_hour.charged).unwrap_or(i64::MAX)),
                (
                    "false",
                    i64::try_from(last_hour.uncharged).unwrap_or(i64::MAX),
                ),
            ],
        )?;
        if let Some(at) = status.next_poll_at {
            let seconds = at.duration_since(now).map_or(0.0, |d| d.as_secs_f64());
            gauge(
                &mut encoder,
                "rm_polling_next_poll_seconds",
                "Seconds until the next demand poll",
                seconds,
            )?;
        }
        gauge_family(
            &mut encoder,
            "rm_polling_pace",
            "The polling pace: 1 for the current one (nominal, idle, reconciling, stretched_*, rate_limited_*, offline, blocked)",
            "pace",
            &[(status.pace.as_str(), 1_i64)],
        )?;
        gauge(
            &mut encoder,
            "rm_webhooks_trusted",
            "1 while webhook deliveries are trusted to announce jobs (polling only reconciles), else 0",
            i64::from(status.webhooks.trusted),
        )?;
        // Kept runner logs (`rm_runner::logs`): a failure never holds cleanup up, so it is
        // counted where an operator looks.
        let failures = encoder.encode_descriptor(
            "rm_runner_logs_keep_failures",
            "Times keeping or pruning a runner's logs failed since the agent started (each logged at warn)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(rm_runner::logs::keep_failures()).encode(failures)?;
        // Why runners ended, and the re-runs asked for (issue 28), since the agent started.
        let families: [TallyFamily; 2] = [
            (
                "rm_runner_ends",
                "Runners concluded since the agent started, by policy, outcome and reason (oom_killed, disk_full, runner_crashed, ghost, host_lost, ...; empty for none)",
                ["policy", "outcome", "reason"],
                crate::executor::tally::ends(),
            ),
            (
                "rm_job_reruns",
                "Re-runs of jobs the infrastructure killed (policy.rerun_on) since the agent started, by policy, reason and result (sent, refused, unknown)",
                ["policy", "reason", "result"],
                crate::executor::tally::reruns(),
            ),
        ];
        for (name, help, names, counts) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (values, count) in counts {
                let labels = [
                    (names[0], values[0].as_str()),
                    (names[1], values[1].as_str()),
                    (names[2], values[2].as_str()),
                ];
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
    use rm_github::ClientConfig;
    use rm_receiver::prometheus_client::encoding::text::encode;
    use rm_receiver::prometheus_client::registry::Registry;

    use super::*;
    use crate::polling::health::Trust;
    use crate::polling::schedule::Pace;
    use crate::polling::status::{PassReport, RateLimitStatus, RequestCounts, WebhookStatus};

    #[tokio::test]
    async fn the_agent_series_are_read_at_scrape_time() {
        let key = AppKeyPair::generate().unwrap();
        let fake = FakeGithub::start(FakeOptions::new(7, key.public_pem.clone()))
            .await
            .unwrap();
        let client = GithubClient::new(ClientConfig::new(
            fake.api_url(),
            7,
            key.private_pem.clone(),
        ))
        .unwrap();
        client.app().await.unwrap();
        let status = PollerStatus {
            pace: Pace::Reconciling,
            next_poll_at: Some(SystemTime::now() + Duration::from_secs(600)),
            webhooks: WebhookStatus::new(
                true,
                Trust {
                    trusted: true,
                    reason: "deliveries_trusted",
                    evidence_at: None,
                },
                None,
            ),
            requests_last_hour: RequestCounts {
                charged: 3,
                uncharged: 5,
            },
            rate_limit: Some(RateLimitStatus {
                remaining: 4321,
                limit: 5000,
                reset_at: None,
            }),
            offline: None,
            unannounced_jobs: 0,
            last_pass: PassReport::default(),
            unreadable_targets: Vec::new(),
        };
        let (tx, rx) = watch::channel(status);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(AgentMetrics::new(rx, client)));
        let scrape = || {
            let mut out = String::new();
            encode(&mut out, &registry).unwrap();
            out
        };
        let text = scrape();
        for line in [
            "# TYPE rm_github_requests counter",
            "rm_github_requests_total{endpoint=\"app.get\",status=\"200\"} 1",
            "rm_github_rate_limit_remaining 4321",
            "rm_github_rate_limit_limit 5000",
            "rm_github_reachable 1",
            // The App's JWT asked once: its POSTs are not counted as content (nothing learned).
            "rm_github_content_paced{scope=\"app:7\"} 0",
            "rm_github_jit_registrations_total{app=\"7\"} 0",
            "rm_github_budget_remaining{app=\"7\",scope=\"app:7\",resource=\"core\"} 4999",
            "rm_github_requests_last_hour{charged=\"true\"} 3",
            "rm_github_requests_last_hour{charged=\"false\"} 5",
            "rm_polling_pace{pace=\"reconciling\"} 1",
            "rm_webhooks_trusted 1",
            "# TYPE rm_runner_logs_keep_failures counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in\n{text}"
            );
        }
        let next = text
            .lines()
            .find_map(|l| l.strip_prefix("rm_polling_next_poll_seconds "))
            .unwrap();
        let next: f64 = next.parse().unwrap();
        assert!((590.0..=600.0).contains(&next), "{next}");

        // The next scrape sees the poller's newest status.
        tx.send_modify(|s| {
            s.pace = Pace::Offline;
            s.webhooks.trusted = false;
        });
        let text = scrape();
        assert!(
            text.contains("rm_polling_pace{pace=\"offline\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("pace=\"reconciling\""), "{text}");
        assert!(text.contains("rm_webhooks_trusted 0\n"), "{text}");
    }
}
