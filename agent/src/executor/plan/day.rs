//! A synthetic day of a mixed queue through the plan (issue 42's `docs/performance.md` figures):
//! the same arrivals packed by shape in queue order (what rm does), packed largest first, and
//! on one-size runners (every runner the largest shape, which is what a host without shapes
//! must do for its largest job to fit). Each pass is [`super::plan`] itself, the function the
//! executor calls every pass (and the harness drives); runners, their start-up and their jobs
//! are simulated on a clock of its own, so a day takes seconds.
//!
//! Run: `cargo test -p rm-agent --release --lib executor::plan::day -- --ignored --nocapture`.

use std::collections::HashMap;

use rm_journal::{LiveCounts, PolicyLive};
use rm_vocab::{JobId, UnixMs};

use super::pack::{Need, Room};
use super::{Inputs, Packing, PolicyInputs, Shaped, Sized, plan};
use crate::executor::harness::policy;

const GIB: u64 = 1 << 30;
/// Seconds between two passes (the executor's own [`crate::executor::PASS_INTERVAL`] is an
/// upper bound; it also passes on every delivery).
const PASS_S: i64 = 5;
/// A runner's start-up, from the plan's start to its job running.
const START_UP_S: i64 = 20;
const DAY_S: i64 = 24 * 3600;

/// A kind of job: its share of arrivals (percent), CPUs, memory (GiB) and run time (minutes).
const MIX: [(&str, u32, u64, u64, i64); 3] = [
    ("lint", 50, 1, 2, 3),
    ("test", 35, 2, 8, 10),
    ("build", 15, 6, 24, 20),
];

/// Arrivals an hour: with [`MIX`] about 320 CPU-minutes of work an hour on a host of 480 (two thirds), and two thirds of its memory.
const ARRIVALS_PER_HOUR: f64 = 12.0;

#[derive(Clone, Copy)]
enum Strategy {
    QueueOrder,
    LargestFirst,
    OneSize,
}

struct Job {
    kind: usize,
    arrives: i64,
    started: Option<i64>,
    ends: Option<i64>,
}

/// A deterministic generator (a linear congruential one): the same day for every strategy.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64)
    }
}

fn arrivals() -> Vec<Job> {
    let mut rng = Lcg(42);
    let mut jobs = Vec::new();
    let mut at = 0.0;
    loop {
        at += -(1.0 - rng.next()).ln() * 3600.0 / ARRIVALS_PER_HOUR;
        if at >= DAY_S as f64 {
            return jobs;
        }
        let pick = (rng.next() * 100.0) as u32;
        let mut sum = 0;
        let kind = MIX
            .iter()
            .position(|m| {
                sum += m.1;
                pick < sum
            })
            .unwrap_or(0);
        jobs.push(Job {
            kind,
            arrives: at as i64,
            started: None,
            ends: None,
        });
    }
}

fn need(kind: usize, strategy: Strategy) -> Need {
    let (cpus, gib) = match strategy {
        // Every runner sized for the largest job.
        Strategy::OneSize => MIX.iter().map(|m| (m.2, m.3)).max().unwrap_or((1, 1)),
        _ => (MIX[kind].2, MIX[kind].3),
    };
    Need {
        cpu_millis: cpus * 1000,
        memory: gib * GIB,
        ..Need::default()
    }
}

/// (jobs finished within the day, mean wait s, p95 wait s, longest wait s)
fn simulate(strategy: Strategy) -> (usize, i64, i64, i64) {
    let p = policy("ci", &["ci"], 64);
    let capacity = Room {
        cpu_millis: Some(8000),
        memory: Some(32 * GIB),
        ..Room::default()
    };
    let mut jobs = arrivals();
    let mut now = 0;
    while now < DAY_S || jobs.iter().any(|j| j.ends.is_none_or(|e| e > now)) {
        let running: Vec<usize> = (0..jobs.len())
            .filter(|&i| jobs[i].started.is_some() && jobs[i].ends.is_some_and(|e| e > now))
            .collect();
        let mut queued: Vec<usize> = (0..jobs.len())
            .filter(|&i| jobs[i].arrives <= now && jobs[i].started.is_none())
            .collect();
        if let Strategy::LargestFirst = strategy {
            queued.sort_by_key(|&i| std::cmp::Reverse(MIX[jobs[i].kind].2));
        }
        let id = |i: usize| JobId::new(i64::try_from(i).unwrap_or(i64::MAX));
        let sizes: HashMap<JobId, Sized> = queued
            .iter()
            .map(|&i| {
                (
                    id(i),
                    Sized {
                        key: MIX[jobs[i].kind].0.to_owned(),
                        need: need(jobs[i].kind, strategy),
                        queued_at_ms: UnixMs::new(jobs[i].arrives * 1000),
                    },
                )
            })
            .collect();
        let n = u32::try_from(running.len()).unwrap_or(u32::MAX);
        let counts = LiveCounts {
            per_policy: [("ci".to_owned(), PolicyLive { live: n, busy: n })].into(),
        };
        let made = plan(&Inputs {
            now_ms: UnixMs::new(now * 1000),
            fit: true,
            host_max: 64,
            counts: &counts,
            policies: vec![PolicyInputs {
                policy: &p,
                backing_off_until: None,
                jobs: queued.iter().map(|&i| id(i)).collect(),
                fenced: 0,
                count: u32::try_from(queued.len()).unwrap_or(u32::MAX),
                busy_unknown: 0,
                shaped: Shaped {
                    sizes,
                    in_flight: Default::default(),
                    warm: Need::default(),
                },
            }],
            standing: None,
            free_uids: None,
            packing: Packing {
                capacity: capacity.clone(),
                held: running
                    .iter()
                    .map(|&i| need(jobs[i].kind, strategy))
                    .collect(),
            },
        });
        for start in &made.policies[0].starts {
            let Some(job) = start.job else { continue };
            let i = usize::try_from(job.get()).unwrap_or(usize::MAX);
            jobs[i].started = Some(now);
            jobs[i].ends = Some(now + START_UP_S + MIX[jobs[i].kind].4 * 60);
        }
        now += PASS_S;
    }
    let finished = jobs
        .iter()
        .filter(|j| j.ends.is_some_and(|e| e <= DAY_S))
        .count();
    let mut waits: Vec<i64> = jobs
        .iter()
        .filter_map(|j| Some(j.started? + START_UP_S - j.arrives))
        .collect();
    waits.sort_unstable();
    let mean = waits.iter().sum::<i64>() / i64::try_from(waits.len().max(1)).unwrap_or(1);
    let p95 = waits[waits.len() * 95 / 100];
    (finished, mean, p95, *waits.last().unwrap_or(&0))
}

#[test]
#[ignore = "a benchmark: prints docs/performance.md's packing figures"]
fn a_day_of_a_mixed_queue() {
    let total = arrivals().len();
    println!(
        "a synthetic day: {total} jobs ({ARRIVALS_PER_HOUR}/h; lint 1 CPU 2 GiB 3 min 50%, test 2 CPU 8 GiB 10 min 35%, build 6 CPU 24 GiB 20 min 15%) on 8 CPUs / 32 GiB, start-up {START_UP_S}s"
    );
    println!("strategy                      jobs/h (day)  mean wait  p95 wait  longest wait");
    for (name, strategy) in [
        ("packed by shape, queue order", Strategy::QueueOrder),
        ("packed by shape, largest 1st", Strategy::LargestFirst),
        ("one size (6 CPU / 24 GiB)", Strategy::OneSize),
    ] {
        let (finished, mean, p95, longest) = simulate(strategy);
        println!(
            "{name:<29} {:>12.1} {:>9}s {:>8}s {:>12}s",
            finished as f64 / 24.0,
            mean,
            p95,
            longest
        );
    }
}
