//! `receiver-load --judge`: what judging a delivery costs (the handler's parse and the body's
//! compression, [`Judged::of`]) by body size, beside a trip to the blocking pool; and what
//! judging large bodies on the async worker does to the small deliveries that worker also
//! serves, against judging them on the blocking pool (the receiver's rule above
//! `rm_receiver::INLINE_JUDGE_BYTES`), in one run. No HTTP and no journal: the judging alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rm_journal::{Incoming, Judged};

/// How often a small delivery arrives in the stall run.
const SMALL_EVERY: Duration = Duration::from_millis(2);
/// How often a large one arrives in the stall run.
const LARGE_EVERY: Duration = Duration::from_millis(250);
/// How long each stall run lasts.
const STALL_RUN: Duration = Duration::from_secs(4);

/// A `workflow_job` body grown to at least `size` bytes with a list of repositories (the
/// shape of the largest bodies GitHub sends: an `installation` event naming every
/// repository), so that it compresses as such JSON does.
pub fn grown(body: &[u8], size: usize) -> Result<Vec<u8>> {
    let mut value: serde_json::Value =
        serde_json::from_slice(body).context("the template is not JSON")?;
    let mut repositories = Vec::new();
    let mut grown = body.len();
    let mut n = 0u64;
    while grown < size {
        let repository = serde_json::json!({
            "id": 700_000_000 + n,
            "node_id": format!("R_kgDO{n:08X}"),
            "name": format!("service-{n}"),
            "full_name": format!("acme/service-{n}"),
            "private": n.is_multiple_of(3),
        });
        grown += repository.to_string().len() + 1;
        repositories.push(repository);
        n += 1;
    }
    value["repositories"] = serde_json::Value::Array(repositories);
    serde_json::to_vec(&value).context("encoding the grown body")
}

fn incoming(body: &[u8]) -> Incoming {
    Incoming {
        guid: uuid::Uuid::new_v4().to_string(),
        event: crate::delivery::EVENT.to_owned(),
        headers: vec![(
            "x-github-event".to_owned(),
            crate::delivery::EVENT.to_owned(),
        )],
        body: body.to_vec(),
        received_at_ms: rm_vocab::now(),
        source: rm_vocab::Source::Webhook,
    }
}

/// The median and the largest time to judge `body`, over `runs` judgements.
pub fn cost(body: &[u8], runs: usize) -> Result<(Duration, Duration)> {
    let mut took = Vec::with_capacity(runs);
    for _ in 0..runs {
        let one = incoming(body);
        let at = Instant::now();
        Judged::of(one).context("judging")?;
        took.push(at.elapsed());
    }
    took.sort();
    Ok((took[took.len() / 2], took[took.len() - 1]))
}

/// The median and the largest round trip of an empty call through the blocking pool, over
/// `runs` trips, from a worker of `runtime`.
pub fn blocking_trip(runtime: &tokio::runtime::Runtime, runs: usize) -> (Duration, Duration) {
    let mut took: Vec<Duration> = runtime.block_on(async {
        let mut took = Vec::with_capacity(runs);
        for _ in 0..runs {
            let at = Instant::now();
            let _ = tokio::task::spawn_blocking(|| ()).await;
            took.push(at.elapsed());
        }
        took
    });
    took.sort();
    (took[took.len() / 2], took[took.len() - 1])
}

/// What the small deliveries of one stall run waited, from arrival to judged.
pub struct Stall {
    pub large_off_worker: bool,
    pub small: Histogram<u64>,
    pub large_judged: usize,
}

/// On a runtime of one worker, a small delivery arrives every [`SMALL_EVERY`] and a large one
/// every [`LARGE_EVERY`] for [`STALL_RUN`]; the small ones are judged on the worker, the large
/// ones on it too or (`large_off_worker`) on the blocking pool.
pub fn stall(small: &[u8], large: &[u8], large_off_worker: bool) -> Result<Stall> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("a runtime of one worker")?;
    let (small, large) = (Arc::new(small.to_vec()), Arc::new(large.to_vec()));
    runtime.block_on(async move {
        let started = Instant::now();
        let larges = tokio::spawn(async move {
            let mut judged = 0;
            let mut tick = tokio::time::interval(LARGE_EVERY);
            while started.elapsed() < STALL_RUN {
                tick.tick().await;
                let body = Arc::clone(&large);
                let judge = move || Judged::of(incoming(&body)).map(drop);
                if large_off_worker {
                    tokio::task::spawn_blocking(judge).await??;
                } else {
                    judge()?;
                }
                judged += 1;
            }
            anyhow::Ok(judged)
        });
        let mut waited = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        let mut tick = tokio::time::interval(SMALL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut due = Instant::now();
        while started.elapsed() < STALL_RUN {
            tick.tick().await;
            let body = Arc::clone(&small);
            // Each small delivery is a task of its own, as each request is in the receiver.
            let judged = tokio::spawn(async move {
                Judged::of(incoming(&body)).map(drop)?;
                anyhow::Ok(Instant::now())
            })
            .await??;
            waited.saturating_record(judged.duration_since(due).as_micros().max(1) as u64);
            due += SMALL_EVERY;
        }
        let large_judged = larges.await??;
        Ok(Stall {
            large_off_worker,
            small: waited,
            large_judged,
        })
    })
}
