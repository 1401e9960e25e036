//! Drives one receiver: N keep-alive HTTP/1.1 connections, each sending pre-signed deliveries in a
//! closed loop for a warm-up then a measured window, recording every latency and every status.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::delivery::{Delivery, request};

/// Pause before reconnecting after a transport error, so a dead server costs a few hundred
/// attempts per second rather than a busy loop.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);
/// Highest latency the histogram tracks, in microseconds (60 s); anything slower is clamped.
const MAX_TRACKED_US: u64 = 60_000_000;
/// Significant decimal digits the histogram keeps: 0.1 % resolution at every scale.
const HISTOGRAM_PRECISION: u8 = 3;

/// Where the deliveries go. Only loopback addresses are accepted: this is a load generator.
#[derive(Clone, Debug)]
pub struct Target {
    /// The receiver's socket address.
    pub addr: SocketAddr,
    /// The webhook path, e.g. `/webhook`.
    pub path: String,
    host: HeaderValue,
}

impl Target {
    /// Parses `http://IP:PORT/path`, refusing anything that is not on this machine.
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("the target {url} is not an http:// URL"))?;
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let addr: SocketAddr = authority
            .parse()
            .with_context(|| format!("the target {url} does not name IP:PORT"))?;
        if !addr.ip().is_loopback() {
            bail!("the target {url} is not a loopback address; load is only sent to this machine");
        }
        let path = if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        };
        let host = HeaderValue::try_from(authority).context("the target's host:port")?;
        Ok(Self { addr, path, host })
    }
}

/// How much load, for how long.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Concurrent keep-alive connections, each with one request in flight at a time.
    pub connections: usize,
    /// Load sent before measuring: lets both sides reach a steady state (JIT, caches, WAL size).
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// An optional bound on the number of requests, across all connections.
    pub max_requests: Option<u64>,
}

/// What a run saw.
#[derive(Debug)]
pub struct Outcome {
    /// Requests started in the measured window that got a response.
    pub requests: u64,
    /// From the start of the measured window to its last response.
    pub elapsed: Duration,
    /// Latency of those requests, in microseconds.
    pub latency_us: Histogram<u64>,
    /// Responses in the measured window, by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Transport errors over the whole run (failed connects, resets, malformed responses).
    pub errors: u64,
    /// Every delivery GUID answered 2xx, warm-up included: each must be durable.
    pub ok_guids: Vec<Uuid>,
    /// Requests sent over the whole run, warm-up included.
    pub sent: u64,
}

impl Outcome {
    /// Measured responses per second.
    pub fn rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.requests as f64 / secs
        } else {
            0.0
        }
    }

    /// The one-line summary the benchmark script reads.
    pub fn summary(&self, target: &Target, plan: &Plan, pool_len: usize) -> Value {
        let ms = |us: u64| us as f64 / 1000.0;
        let h = &self.latency_us;
        let statuses: BTreeMap<String, u64> = self
            .statuses
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        json!({
            "target": format!("http://{}{}", target.addr, target.path),
            "connections": plan.connections,
            "warmup_s": plan.warmup.as_secs_f64(),
            "duration_s": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "requests": self.requests,
            "rps": self.rps().round(),
            "p50_ms": ms(h.value_at_quantile(0.50)),
            "p99_ms": ms(h.value_at_quantile(0.99)),
            "p999_ms": ms(h.value_at_quantile(0.999)),
            "max_ms": ms(h.max()),
            "mean_ms": (h.mean() / 10.0).round() / 100.0,
            "statuses": statuses,
            "errors": self.errors,
            "sent_total": self.sent,
            "ok_total": self.ok_guids.len(),
            // Past the pool, bodies (not GUIDs) repeat: a job's events arrive again, as redeliveries.
            "pool_wrapped": self.sent > pool_len as u64,
        })
    }
}

/// The instants every connection works to.
#[derive(Clone, Copy)]
struct Clock {
    measure_from: Instant,
    end: Instant,
}

struct ConnStats {
    latency_us: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
    requests: u64,
    errors: u64,
    ok_guids: Vec<Uuid>,
    last_response: Option<Instant>,
}

/// Sends load to `target` as `plan` says, cycling through `pool`, and gathers every measurement.
pub async fn run(target: &Target, plan: &Plan, pool: Arc<Vec<Delivery>>) -> Result<Outcome> {
    if pool.is_empty() {
        bail!("the delivery pool is empty");
    }
    let start = Instant::now();
    let clock = Clock {
        measure_from: start + plan.warmup,
        end: start + plan.warmup + plan.duration,
    };
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..plan.connections.max(1) {
        let (target, pool, next, max) = (
            target.clone(),
            pool.clone(),
            next.clone(),
            plan.max_requests,
        );
        tasks.spawn(async move { drive(&target, &pool, &next, max, clock).await });
    }
    let mut out = Outcome {
        requests: 0,
        elapsed: Duration::ZERO,
        latency_us: new_histogram()?,
        statuses: BTreeMap::new(),
        errors: 0,
        ok_guids: Vec::new(),
        sent: 0,
    };
    let mut last_response = clock.measure_from;
    while let Some(joined) = tasks.join_next().await {
        let stats = joined.context("a connection task failed")??;
        out.latency_us
            .add(&stats.latency_us)
            .context("merging latency histograms")?;
        for (status, n) in stats.statuses {
            *out.statuses.entry(status).or_default() += n;
        }
        out.requests += stats.requests;
        out.errors += stats.errors;
        out.ok_guids.extend(stats.ok_guids);
        last_response = last_response.max(stats.last_response.unwrap_or(last_response));
    }
    out.elapsed = last_response - clock.measure_from;
    // The counter overshoots by one per connection that stopped on the bound.
    out.sent = next
        .load(Ordering::Relaxed)
        .min(plan.max_requests.unwrap_or(u64::MAX));
    Ok(out)
}

fn new_histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_TRACKED_US, HISTOGRAM_PRECISION)
        .context("a latency histogram")
}

/// One connection's closed loop: reconnects after a transport error until the clock runs out.
async fn drive(
    target: &Target,
    pool: &[Delivery],
    next: &AtomicU64,
    max_requests: Option<u64>,
    clock: Clock,
) -> Result<ConnStats> {
    let mut stats = ConnStats {
        latency_us: new_histogram()?,
        statuses: BTreeMap::new(),
        requests: 0,
        errors: 0,
        ok_guids: Vec::new(),
        last_response: None,
    };
    'connection: while Instant::now() < clock.end {
        let mut sender = match connect(target.addr).await {
            Ok(sender) => sender,
            Err(_) => {
                stats.errors += 1;
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        while Instant::now() < clock.end {
            let n = next.fetch_add(1, Ordering::Relaxed);
            if max_requests.is_some_and(|max| n >= max) {
                break 'connection;
            }
            let delivery = &pool[(n % pool.len() as u64) as usize];
            let guid = Uuid::new_v4();
            let req = request(delivery, guid, &target.host, &target.path)?;
            let started = Instant::now();
            let Ok(status) = exchange(&mut sender, req).await else {
                stats.errors += 1;
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue 'connection;
            };
            let done = Instant::now();
            if status.is_success() {
                stats.ok_guids.push(guid);
            }
            if started >= clock.measure_from {
                let us = u64::try_from((done - started).as_micros()).unwrap_or(u64::MAX);
                stats.latency_us.saturating_record(us.max(1));
                *stats.statuses.entry(status.as_u16()).or_default() += 1;
                stats.requests += 1;
                stats.last_response = Some(done);
            }
        }
    }
    Ok(stats)
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await.context("connecting")?;
    // Small responses must not wait for Nagle: latency is what is measured.
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    let (sender, connection) = http1::Builder::new()
        // GitHub sends canonical header case (`X-GitHub-Event`); names are case-insensitive, but
        // a parser that is slower on one case should be measured on the real one.
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
        .context("HTTP/1.1 handshake")?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One request and its whole response; the body is read so the connection can be reused.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<StatusCode> {
    sender.ready().await.context("connection not ready")?;
    let response = sender.send_request(req).await.context("sending")?;
    let status = response.status();
    response
        .into_body()
        .collect()
        .await
        .context("reading the response body")?;
    Ok(status)
}
