//! Wait times through `rm-agent run` (CONTRACT §8): jobs of two policies run on fake runners,
//! and both waits (queued to runner started, queued to job started) come back per policy from
//! `/metrics` as histograms and from `status --json` as the last hour's percentiles, while the
//! agent runs and after it stopped. No value is asserted against the clock: counts, labels and
//! the order of the percentiles.

use std::collections::BTreeMap;
use std::time::Duration;

use rm_e2e::fleet::{Fleet, FleetOptions, LINUX, PolicySpec, REPO, wait_until};
use rm_e2e::json_stdout;
use rm_fake_github::RunnerBehavior;
use serde_json::Value;

const GPU: PolicySpec = PolicySpec {
    name: "gpu",
    target: REPO,
    labels: &["self-hosted", "gpu"],
    max_runners: 2,
    workspace: "ephemeral",
    extra: "",
};

const SERIES: [&str; 2] = [
    "rm_job_queue_to_runner_started_seconds",
    "rm_job_queue_to_job_started_seconds",
];

/// One histogram of a scrape: its `le` bounds with their cumulative counts, its count and sum.
#[derive(Debug, Default)]
struct Histogram {
    buckets: Vec<(String, u64)>,
    count: u64,
    sum: f64,
}

/// The histograms of `series` in Prometheus text, by their `policy` label.
fn histograms(text: &str, series: &str) -> BTreeMap<String, Histogram> {
    let mut found: BTreeMap<String, Histogram> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((name, labels)) = name_labels.split_once('{') else {
            continue;
        };
        let labels: BTreeMap<&str, &str> = labels
            .trim_end_matches('}')
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        let Some(policy) = labels.get("policy") else {
            continue;
        };
        let entry = found.entry((*policy).to_owned()).or_default();
        match name.strip_prefix(series) {
            Some("_bucket") => entry
                .buckets
                .push((labels["le"].to_owned(), value.parse().unwrap())),
            Some("_count") => entry.count = value.parse().unwrap(),
            Some("_sum") => entry.sum = value.parse().unwrap(),
            _ => {}
        }
    }
    found.retain(|_, h| !h.buckets.is_empty());
    found
}

fn ordered(waits: &Value, count: u64) {
    assert_eq!(waits["count"], count, "{waits}");
    let p = |name: &str| {
        waits[name]
            .as_i64()
            .unwrap_or_else(|| panic!("{name} missing in {waits}"))
    };
    let (p50, p90, p99) = (p("p50_ms"), p("p90_ms"), p("p99_ms"));
    assert!(0 <= p50 && p50 <= p90 && p90 <= p99, "{waits}");
}

/// What `status --json` says of the waits: both kinds overall and per policy.
fn check_status(latency: &Value, served: &BTreeMap<&str, u64>) {
    assert_eq!(latency["window_s"], 3600, "{latency}");
    let total: u64 = served.values().sum();
    for kind in ["queue_to_runner_started", "queue_to_job_started"] {
        ordered(&latency[kind], total);
        for (policy, jobs) in served {
            ordered(&latency["per_policy"][policy][kind], *jobs);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_runs_fill_the_wait_histograms_and_the_status_percentiles() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![LINUX, GPU],
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_000,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let mut jobs = Vec::new();
    for i in 0..3 {
        jobs.push(
            fleet
                .fake
                .queue_job(REPO, &format!("linux {i}"), LINUX.labels)
                .unwrap(),
        );
    }
    for i in 0..2 {
        jobs.push(
            fleet
                .fake
                .queue_job(REPO, &format!("gpu {i}"), GPU.labels)
                .unwrap(),
        );
    }
    let served = BTreeMap::from([("gpu", 2_u64), ("linux", 3)]);
    wait_until(Duration::from_secs(120), "every job completed", || {
        jobs.iter().all(|j| fleet.completed(*j))
    })
    .await;

    // `/metrics`: a histogram per policy of each wait, holding every job served. The journal
    // learns of a start from GitHub's (delayed, reordered) deliveries or a poll, and the
    // histograms read it a round later: waited for, not timed.
    let mut scrape = String::new();
    let mut counts = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < deadline {
        let (code, text) = agent.get("/metrics").await.unwrap();
        assert_eq!(code, 200);
        counts = SERIES
            .iter()
            .map(|s| {
                let by_policy: BTreeMap<String, u64> = histograms(&text, s)
                    .into_iter()
                    .map(|(p, h)| (p, h.count))
                    .collect();
                (*s, by_policy)
            })
            .collect::<BTreeMap<_, _>>();
        scrape = text;
        let expected: BTreeMap<String, u64> =
            served.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect();
        if counts.values().all(|c| *c == expected) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for series in SERIES {
        let found = histograms(&scrape, series);
        let policies: Vec<&str> = found.keys().map(String::as_str).collect();
        assert_eq!(policies, vec!["gpu", "linux"], "{series}:\n{scrape}");
        for (policy, histogram) in &found {
            assert_eq!(
                histogram.count,
                served[policy.as_str()],
                "{series} {policy}: {counts:?}\n{scrape}"
            );
            // Cumulative buckets ending in +Inf at the count; the documented bounds.
            let values: Vec<u64> = histogram.buckets.iter().map(|(_, n)| *n).collect();
            assert!(values.windows(2).all(|w| w[0] <= w[1]), "{histogram:?}");
            assert_eq!(
                histogram.buckets.last(),
                Some(&("+Inf".to_owned(), histogram.count))
            );
            assert_eq!(histogram.buckets.first().unwrap().0, "0.05");
            assert_eq!(histogram.buckets[histogram.buckets.len() - 2].0, "3600.0");
            assert!(histogram.sum >= 0.0, "{histogram:?}");
        }
    }

    // `status --json`, from the journal: the last hour's percentiles, overall and per policy.
    let status = json_stdout(&fleet.setup.run(&["status", "--json"]));
    check_status(&status["latency"], &served);
    let text = String::from_utf8(fleet.setup.run(&["status"]).stdout).unwrap();
    assert!(
        text.contains("latency   5 jobs started in the last 1h: queued to runner started p50 "),
        "{text}"
    );

    // A stopped agent answers the same from the journal.
    assert!(agent.terminate().success());
    let stopped = json_stdout(&fleet.setup.run(&["status", "--json"]));
    assert_eq!(stopped["agent"]["running"], false, "{stopped}");
    check_status(&stopped["latency"], &served);
    assert_eq!(stopped["latency"], status["latency"]);
}
