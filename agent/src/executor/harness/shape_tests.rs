//! Packing by shape (issue 42) as the executor carries it out, through the harness (manual
//! clock): a queue of mixed shapes on a host of 8 CPUs and 32 GiB never holds more than the host
//! at any step, starts a small job beside a large one where both fit, and publishes why each
//! job it holds back waits. The rule's tables are `plan/pack.rs`'s and `plan/tests.rs`'s.

use rm_fake_github::RunnerBehavior;

use super::*;
use crate::config::{HostCapacity, PolicyShapes, ShapeBounds};
use crate::executor::plan::pack::{Resource, Wait};

const GIB: u64 = 1 << 30;

const LARGE: &[&str] = &["build", "rm-cpu=6", "rm-mem=24g"];
const SMALL: &[&str] = &["build", "rm-cpu=2", "rm-mem=8g"];

/// A policy taking shapes up to the whole host.
fn shaped_policy() -> Policy {
    let mut p = policy("build", &["build"], 8);
    p.shapes = PolicyShapes {
        cpu_millis: Some(1000),
        max: Some(ShapeBounds {
            cpu_millis: Some(8000),
            memory: Some(32 * GIB),
            disk: None,
            devices: Default::default(),
        }),
        named: Vec::new(),
    };
    p
}

/// What the live attempts hold, in CPU millis and bytes of memory.
fn held(h: &Harness) -> (u64, u64) {
    h.attempts()
        .iter()
        .filter(|a| a.state.counts_against_capacity())
        .filter_map(|a| a.shape.as_ref())
        .fold((0, 0), |(cpu, mem), s| (cpu + s.cpu_millis, mem + s.memory))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_queue_never_over_commits_and_a_small_job_runs_beside_a_large_one() {
    let mut h = Harness::new(Options {
        max_runners: 8,
        policies: vec![shaped_policy()],
        capacity: HostCapacity {
            cpu_millis: Some(8000),
            memory: Some(32 * GIB),
            disk: None,
        },
        ..Options::default()
    })
    .await;
    h.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 30_000,
        ..RunnerBehavior::default()
    });
    // Queue order: large, large, small, small.
    let large = [h.queue("large (1)", LARGE), h.queue("large (2)", LARGE)];
    let small = [h.queue("small (1)", SMALL), h.queue("small (2)", SMALL)];
    let all: Vec<u64> = large.iter().chain(&small).copied().collect();
    let mut beside = false;
    let mut waits_seen: Vec<Wait> = Vec::new();
    h.until(
        "every job completed",
        |h| {
            let (cpu, mem) = held(h);
            assert!(cpu <= 8000, "{cpu} CPU millis held on a host of 8 CPUs");
            assert!(mem <= 32 * GIB, "{mem} bytes held on a host of 32 GiB");
            let live: Vec<u64> = h
                .attempts()
                .iter()
                .filter(|a| a.state.counts_against_capacity())
                .filter_map(|a| a.shape.as_ref().map(|s| s.cpu_millis))
                .collect();
            beside |= live.contains(&6000) && live.contains(&2000);
            if let Some(plan) = h.executor.handle().published_memory().plan
                && let Some(p) = plan.policies.get("build")
            {
                waits_seen.extend(p.waits.iter().map(|w| w.wait.clone()));
            }
        },
        |h| all.iter().all(|j| h.completed(*j)),
    )
    .await;
    assert!(beside, "a small job never ran beside a large one");
    // The second large job waited for CPUs while the first ran (and said so).
    assert!(
        waits_seen.contains(&Wait::Room {
            resource: Resource::Cpu
        }),
        "no job was published as waiting for CPUs: {waits_seen:?}"
    );
    h.until("every attempt cleaned", |_| {}, Harness::all_cleaned)
        .await;
    // One runner per job, each registered for its own shape.
    let attempts = h.attempts();
    assert_eq!(attempts.len(), 4);
    let mut shapes: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            a.shape
                .as_ref()
                .map(|s| s.labels.clone())
                .unwrap_or_default()
        })
        .collect();
    shapes.sort();
    assert_eq!(
        shapes,
        vec![
            vec!["rm-cpu=2".to_owned(), "rm-mem=8g".to_owned()],
            vec!["rm-cpu=2".to_owned(), "rm-mem=8g".to_owned()],
            vec!["rm-cpu=6".to_owned(), "rm-mem=24g".to_owned()],
            vec!["rm-cpu=6".to_owned(), "rm-mem=24g".to_owned()],
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shape_larger_than_the_host_starts_nothing_and_says_so() {
    let mut h = Harness::new(Options {
        max_runners: 8,
        policies: vec![shaped_policy()],
        capacity: HostCapacity {
            cpu_millis: Some(4000),
            memory: Some(32 * GIB),
            disk: None,
        },
        ..Options::default()
    })
    .await;
    let job = h.queue("huge", LARGE);
    let small = h.queue("small", SMALL);
    h.until("the small job completed", |_| {}, |h| h.completed(small))
        .await;
    assert!(!h.completed(job));
    let plan = h.executor.handle().published_memory().plan.expect("a plan");
    let waits = &plan.policies["build"].waits;
    assert!(
        waits.iter().any(|w| w.wait
            == Wait::ExceedsHost {
                resource: Resource::Cpu
            }),
        "{waits:?}"
    );
    // Only the small job's runner was ever made.
    assert_eq!(
        h.attempts().len(),
        1,
        "{:#?}",
        h.attempts()
            .iter()
            .map(|a| (&a.shape, a.state, a.outcome, &a.reason, a.job_id))
            .collect::<Vec<_>>()
    );
}
