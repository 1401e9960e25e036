//! The wait-time rules over rows as the journal returns them.

use rm_receiver::prometheus_client::encoding::text::encode;
use rm_receiver::prometheus_client::registry::Registry;

use rm_vocab::UnixMs;

use super::*;

const T0: i64 = 1_700_000_000_000;

fn row(job_id: i64, policy: &str, queued: Option<i64>, runner: Option<i64>, job: i64) -> WaitRow {
    WaitRow {
        job_id: JobId::new(job_id),
        policy: policy.to_owned(),
        queued_at_ms: queued.map(UnixMs::new),
        first_seen_at_ms: UnixMs::new(T0 + 700),
        job_started_at_ms: UnixMs::new(job),
        runner_started_at_ms: runner.map(UnixMs::new),
    }
}

#[test]
fn a_wait_runs_from_github_s_queue_time_or_else_the_first_sighting() {
    let rows = [
        row(1, "linux", Some(T0), Some(T0 + 3_000), T0 + 5_000),
        // No created_at in any sighting: the journal's first sighting starts the wait.
        row(2, "linux", None, Some(T0 + 3_000), T0 + 5_000),
        // A spare runner started before the job was queued, and a start GitHub dates a little
        // before the queue time on its whole-second clock: neither is a negative wait.
        row(3, "gpu", Some(T0), Some(T0 - 60_000), T0 - 400),
        // An attempt from before the journal kept runner starts.
        row(4, "gpu", Some(T0), None, T0 + 1_000),
    ];
    let got = samples(&rows);
    let waits: Vec<(Option<i64>, i64)> = got
        .iter()
        .map(|s| (s.queue_to_runner_started_ms, s.queue_to_job_started_ms))
        .collect();
    assert_eq!(
        waits,
        vec![
            (Some(3_000), 5_000),
            (Some(2_300), 4_300),
            (Some(0), 0),
            (None, 1_000)
        ]
    );
    assert_eq!(got[2].policy, "gpu");
    assert_eq!(got[2].started_at_ms, UnixMs::new(T0 - 400));
}

#[test]
fn percentiles_are_nearest_rank_waits_that_happened_and_ordered() {
    let hundred: Vec<i64> = (1..=100).rev().map(|n| n * 10).collect();
    let p = Percentiles::of(hundred);
    assert_eq!(
        (p.count, p.p50_ms, p.p90_ms, p.p99_ms),
        (100, Some(500), Some(900), Some(990))
    );
    let one = Percentiles::of(vec![42]);
    assert_eq!(
        (one.p50_ms, one.p90_ms, one.p99_ms),
        (Some(42), Some(42), Some(42))
    );
    let few = Percentiles::of(vec![300, 100, 200]);
    assert_eq!(
        (few.p50_ms, few.p90_ms, few.p99_ms),
        (Some(200), Some(300), Some(300))
    );
    assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    assert_eq!(Percentiles::default().p50_ms, None);
}

#[test]
fn the_window_holds_the_jobs_that_started_in_the_last_hour_per_policy() {
    let now = T0 + 2 * 3_600_000;
    let rows = [
        // Started just over an hour ago: out.
        row(1, "linux", Some(T0), Some(T0 + 1_000), now - 3_600_000),
        row(
            2,
            "linux",
            Some(now - 10_000),
            Some(now - 8_000),
            now - 6_000,
        ),
        row(
            3,
            "linux",
            Some(now - 10_000),
            Some(now - 9_000),
            now - 4_000,
        ),
        row(4, "gpu", Some(now - 30_000), None, now - 1_000),
    ];
    let latency = summarize(&rows, UnixMs::new(now), WINDOW);
    assert_eq!(latency.window, WINDOW);
    assert_eq!(latency.all.queue_to_job_started.count, 3);
    assert_eq!(latency.all.queue_to_job_started.p50_ms, Some(6_000));
    assert_eq!(latency.all.queue_to_job_started.p99_ms, Some(29_000));
    assert_eq!(
        latency.all.queue_to_runner_started.count, 2,
        "the gpu runner's start is unknown"
    );
    assert_eq!(latency.all.queue_to_runner_started.p90_ms, Some(2_000));
    let policies: Vec<(&str, usize)> = latency
        .per_policy
        .iter()
        .map(|(p, w)| (p.as_str(), w.queue_to_job_started.count))
        .collect();
    assert_eq!(policies, vec![("gpu", 1), ("linux", 2)]);
    assert_eq!(
        latency.per_policy["gpu"].queue_to_runner_started,
        Percentiles::default()
    );
}

#[test]
fn the_json_has_the_contract_shape_with_null_percentiles_when_empty() {
    let empty = to_json(&Latency::default());
    assert_eq!(
        empty,
        json!({
            "window_s": 3600,
            "queue_to_runner_started": {"count": 0, "p50_ms": null, "p90_ms": null, "p99_ms": null},
            "queue_to_job_started": {"count": 0, "p50_ms": null, "p90_ms": null, "p99_ms": null},
            "per_policy": {},
        })
    );
    let now = T0 + 10_000;
    let latency = summarize(
        &[row(1, "linux", Some(T0), Some(T0 + 1_500), T0 + 2_500)],
        UnixMs::new(now),
        WINDOW,
    );
    let value = to_json(&latency);
    assert_eq!(value["queue_to_runner_started"]["p50_ms"], 1_500);
    assert_eq!(value["queue_to_job_started"]["p99_ms"], 2_500);
    assert_eq!(
        value["per_policy"]["linux"]["queue_to_job_started"]["count"],
        1
    );
    let text = render(&latency);
    assert!(
        text.contains("1 job started in the last 1h: queued to runner started p50 1.5s"),
        "{text}"
    );
    assert!(render(&Latency::default()).contains("no job started"));
}

#[test]
fn the_recorder_counts_each_new_job_once_and_not_what_the_journal_held_at_start() {
    let before = [row(1, "linux", Some(T0), Some(T0 + 1), T0 + 2)];
    let mut recorder = Recorder::seeded(&before);
    let mut rows = before.to_vec();
    rows.push(row(2, "linux", Some(T0), Some(T0 + 1), T0 + 3));
    let fresh: Vec<i64> = recorder
        .fresh(&rows, UnixMs::new(T0))
        .iter()
        .map(|s| s.job_id.get())
        .collect();
    assert_eq!(fresh, vec![2]);
    assert!(
        recorder.fresh(&rows, UnixMs::new(T0)).is_empty(),
        "counted once"
    );
    // A job GitHub dates before another already counted is still new.
    rows.push(row(3, "gpu", Some(T0), None, T0 + 1));
    let fresh: Vec<i64> = recorder
        .fresh(&rows, UnixMs::new(T0))
        .iter()
        .map(|s| s.job_id.get())
        .collect();
    assert_eq!(fresh, vec![3]);
    // Past the window the rows are no longer read, and the recorder forgets them.
    assert!(recorder.fresh(&[], UnixMs::new(T0 + 10)).is_empty());
    assert!(recorder.seen.is_empty());
}

#[test]
fn the_histograms_are_labelled_by_policy_with_the_documented_buckets() {
    let metrics = WaitMetrics::default();
    let now = T0 + 60_000;
    for sample in samples(&[
        row(1, "linux", Some(T0), Some(T0 + 40), T0 + 3_000),
        row(2, "linux", Some(T0), Some(T0 + 2_000), T0 + 4_000),
        row(3, "gpu", Some(T0), None, T0 + 7_200_000),
    ]) {
        assert!(sample.started_at_ms <= UnixMs::new(now) || sample.job_id == JobId::new(3));
        metrics.observe(&sample);
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(metrics));
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    for line in [
        "# TYPE rm_job_queue_to_runner_started_seconds histogram",
        "rm_job_queue_to_runner_started_seconds_count{policy=\"linux\"} 2",
        "rm_job_queue_to_runner_started_seconds_bucket{le=\"0.05\",policy=\"linux\"} 1",
        "rm_job_queue_to_runner_started_seconds_bucket{le=\"2.5\",policy=\"linux\"} 2",
        "rm_job_queue_to_job_started_seconds_count{policy=\"linux\"} 2",
        "rm_job_queue_to_job_started_seconds_bucket{le=\"2.5\",policy=\"linux\"} 0",
        "rm_job_queue_to_job_started_seconds_bucket{le=\"5.0\",policy=\"linux\"} 2",
        "rm_job_queue_to_job_started_seconds_sum{policy=\"linux\"} 7.0",
        // Two hours: past the last bound.
        "rm_job_queue_to_job_started_seconds_bucket{le=\"3600.0\",policy=\"gpu\"} 0",
        "rm_job_queue_to_job_started_seconds_bucket{le=\"+Inf\",policy=\"gpu\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing in\n{text}"
        );
    }
    assert!(
        !text.contains("rm_job_queue_to_runner_started_seconds_count{policy=\"gpu\"}"),
        "no runner start known for gpu:\n{text}"
    );
}
