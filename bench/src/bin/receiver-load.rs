//! `receiver-load`: sends a sustained load of signed, unique `workflow_job` deliveries to one
//! webhook receiver on this machine and prints a one-line JSON summary (see docs/performance.md).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Parser;
use rm_bench::delivery::{Templates, build_pool};
use rm_bench::load::{Plan, Target, run};

/// The environment variable holding the webhook secret (never taken from argv, which `ps` shows).
/// Comma-separated like the agent's; the first secret signs.
const SECRET_ENV: &str = "RM_WEBHOOK_SECRET";

#[derive(Parser, Debug)]
#[command(about = "Load a webhook receiver on this machine with signed workflow_job deliveries")]
struct Args {
    /// The receiver's webhook URL: http://IP:PORT/PATH on a loopback address.
    #[arg(long, default_value = "http://127.0.0.1:8080/webhook")]
    url: String,
    /// Concurrent keep-alive connections.
    #[arg(long, env = "CONNECTIONS", default_value_t = 32)]
    connections: usize,
    /// Load sent before measuring.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// The measured window.
    #[arg(long, env = "DURATION", default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Jobs in the pre-signed pool (three deliveries each: queued, in_progress, completed).
    /// Past the pool, bodies repeat under fresh GUIDs; the summary says so (`pool_wrapped`).
    #[arg(long, default_value_t = 100_000)]
    jobs: usize,
    /// The first workflow_job.id; by default derived from the clock so that runs do not collide.
    #[arg(long)]
    first_job_id: Option<u64>,
    /// Stop after this many requests in all (the duration still bounds the run).
    #[arg(long)]
    max_requests: Option<u64>,
    /// The webhook fixtures the bodies are made from.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks"))]
    fixtures: PathBuf,
    /// Write every delivery GUID answered 2xx here, one a line, for the durability check.
    #[arg(long)]
    guids_out: Option<PathBuf>,
    /// Runtime threads for the generator: it shares the machine with the receiver under test.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Instead of a receiver over HTTP, measure the journals' intake side by side: SQLite, then
    /// PostgreSQL (a server started for the run) with each of --pg-writers writers; every body
    /// of the pool (--jobs × 3) recorded once by --recorders concurrent recorders.
    #[arg(long)]
    intake: bool,
    /// --intake: concurrent recorders (as many requests in flight in a receiver).
    #[arg(long, default_value_t = 32)]
    recorders: usize,
    /// Instead of a receiver over HTTP, measure judging a delivery: its cost by body size beside
    /// a trip to the blocking pool, and small deliveries' waits while large ones are judged on
    /// their worker or on the blocking pool (docs/performance.md, "Judging a delivery").
    #[arg(long)]
    judge: bool,
    /// --judge: the large body's size in the stall runs.
    #[arg(long, default_value_t = 8 << 20)]
    large_bytes: usize,
    /// --intake: the PostgreSQL writer counts to run (one writer per receiver).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pg_writers: Vec<usize>,
}

fn main() {
    if let Err(err) = real_main(Args::parse()) {
        eprintln!("receiver-load: {err:#}");
        std::process::exit(1);
    }
}

fn real_main(args: Args) -> Result<()> {
    if args.intake {
        return intake(&args);
    }
    if args.judge {
        return judge(&args);
    }
    let secrets = std::env::var(SECRET_ENV)
        .with_context(|| format!("set {SECRET_ENV} to the receiver's webhook secret"))?;
    let secret = secrets
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    anyhow::ensure!(
        !secret.is_empty(),
        "{SECRET_ENV} is empty; set it to the webhook secret"
    );
    let target = Target::parse(&args.url)?;
    let plan = Plan {
        connections: args.connections,
        warmup: args.warmup,
        duration: args.duration,
        max_requests: args.max_requests,
    };
    let first_job_id = match args.first_job_id {
        Some(id) => id,
        // Seconds × 10⁶ leaves room for a million jobs a run and stays below 2⁵³ (JSON numbers).
        None => {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .context("the clock")?
                .as_secs()
                * 1_000_000
        }
    };

    let built = Instant::now();
    let templates = Templates::load(&args.fixtures)?;
    let pool = Arc::new(build_pool(
        &templates,
        secret.as_bytes(),
        args.jobs,
        first_job_id,
    )?);
    let bytes: usize = pool.iter().map(|d| d.body.len()).sum();
    eprintln!(
        "receiver-load: {} signed deliveries ({} jobs, {:.0} MiB) built in {:.1?}; {} connections, \
         {:?} warm-up, {:?} measured, to {}",
        pool.len(),
        args.jobs,
        bytes as f64 / (1 << 20) as f64,
        built.elapsed(),
        plan.connections,
        plan.warmup,
        plan.duration,
        args.url,
    );

    // One thread by default: a current-thread runtime has no cross-thread wake-ups, which keeps
    // the generator's share of the two cores small.
    let mut builder = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(args.threads);
        b
    };
    let runtime = builder
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let outcome = runtime.block_on(run(&target, &plan, pool.clone()))?;

    if let Some(path) = &args.guids_out {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the GUID file {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for guid in &outcome.ok_guids {
            writeln!(out, "{guid}").with_context(|| format!("writing {}", path.display()))?;
        }
        out.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", outcome.summary(&target, &plan, pool.len()));
    Ok(())
}

/// `--intake`: SQLite against PostgreSQL, one JSON line per journal.
fn intake(args: &Args) -> Result<()> {
    anyhow::ensure!(
        args.recorders > 0 && args.pg_writers.iter().all(|&w| w > 0),
        "--recorders and --pg-writers must be positive"
    );
    let templates = Templates::load(&args.fixtures)?;
    // The bodies are recorded, not verified: any key signs them.
    let first_job_id = args.first_job_id.unwrap_or(1);
    let pool = Arc::new(build_pool(
        &templates,
        b"intake-bench",
        args.jobs,
        first_job_id,
    )?);
    eprintln!(
        "receiver-load --intake: {} deliveries ({} jobs), {} recorders, PostgreSQL writers {:?}",
        pool.len(),
        args.jobs,
        args.recorders,
        args.pg_writers
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(2))
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let figures = runtime.block_on(rm_bench::intake::compare(
        pool,
        args.recorders,
        &args.pg_writers,
    ))?;
    for run in figures {
        println!("{}", run.summary());
    }
    Ok(())
}

/// `--judge`: one JSON line per body size, one for the blocking pool, one per stall run.
fn judge(args: &Args) -> Result<()> {
    use rm_bench::judge;
    let templates = Templates::load(&args.fixtures)?;
    let pool = build_pool(&templates, b"judge-bench", 1, 1)?;
    let small = pool.first().context("no body built")?.body.to_vec();
    for size in [0, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20, 24 << 20] {
        let body = if size == 0 {
            small.clone()
        } else {
            judge::grown(&small, size)?
        };
        let runs = if body.len() > (1 << 20) { 5 } else { 200 };
        let (p50, max) = judge::cost(&body, runs)?;
        println!(
            "{}",
            serde_json::json!({
                "judge_bytes": body.len(),
                "runs": runs,
                "judge_p50_us": p50.as_micros(),
                "judge_max_us": max.as_micros(),
            })
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let (p50, max) = judge::blocking_trip(&runtime, 2000);
    println!(
        "{}",
        serde_json::json!({"blocking_pool_trip_p50_us": p50.as_micros(), "blocking_pool_trip_max_us": max.as_micros()})
    );
    let large = judge::grown(&small, args.large_bytes)?;
    for off_worker in [false, true] {
        let run = judge::stall(&small, &large, off_worker)?;
        println!(
            "{}",
            serde_json::json!({
                "large_bytes": large.len(),
                "large_judged": if run.large_off_worker { "blocking pool" } else { "on the worker" },
                "large_deliveries": run.large_judged,
                "small_deliveries": run.small.len(),
                "small_wait_p50_us": run.small.value_at_quantile(0.50),
                "small_wait_p99_us": run.small.value_at_quantile(0.99),
                "small_wait_max_us": run.small.max(),
            })
        );
    }
    Ok(())
}
