//! The per-host resolver runners of an egress policy ask (their DNS is rewritten to it inside
//! their own namespace): UDP and TCP on one port of the host's loopback. It tells each runner
//! by the source address of its query (its namespace's address: a job cannot send from
//! another, it has no capability in its namespace), decides the name against the runner's
//! allow list ([`decide`]), answers a refused name itself (NXDOMAIN; never sent upstream, so
//! nothing of it leaves the host), forwards an allowed one to the host's upstream and, before
//! it answers, opens the answer's addresses in the runner's table for the answer's TTL
//! ([`open_for`]). Audit mode forwards everything and opens nothing (its table refuses
//! nothing).
//!
//! Bounds, each per runner so that a job flooding the resolver degrades only itself: queries
//! per second ([`Bucket`], past it REFUSED), queries in flight ([`MAX_IN_FLIGHT`]), TCP
//! connections ([`MAX_TCP_CONNECTIONS`]); what is recorded is bounded by [`crate::record`].
//! A source no runner is registered for is answered REFUSED.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rm_runner::network::Names;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::time::Instant;

use crate::allow::AllowList;
use crate::dns::{self, Query};
use crate::record::{Mode, Record, Tally, Verdict};

/// Queries a runner may ask per second, sustained.
pub const QUERIES_PER_SECOND: f64 = 100.0;

/// Queries a runner may ask at once before the rate applies (a build's first second resolves
/// many names).
pub const QUERY_BURST: f64 = 200.0;

/// A runner's queries waiting for the upstream at once; past it REFUSED.
pub const MAX_IN_FLIGHT: usize = 32;

/// A runner's open TCP connections to the resolver; past it a new one is closed at once.
pub const MAX_TCP_CONNECTIONS: usize = 8;

/// How long one upstream has to answer before the next is asked (then SERVFAIL).
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// A TCP connection that sends no whole query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);

/// The shortest time an answer's address stays open: many names answer with TTLs of seconds,
/// and a client connects after it resolved (sometimes to the address it resolved a minute ago).
pub const MIN_OPEN: Duration = Duration::from_secs(60);

/// The longest time an answer's address stays open, whatever TTL it came with: an address a
/// name stopped pointing at is closed within the hour.
pub const MAX_OPEN: Duration = Duration::from_secs(3600);

/// How long an address stays open for an answer of `ttl` seconds. Pure.
pub fn open_for(ttl: u32) -> Duration {
    Duration::from_secs(u64::from(ttl)).clamp(MIN_OPEN, MAX_OPEN)
}

/// What the resolver does with one query of a registered runner. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forward upstream and open the answer's addresses (enforce mode, allowed name).
    ForwardAndOpen,
    /// Forward upstream, open nothing (audit mode: the table refuses nothing).
    Forward,
    /// Answer NXDOMAIN without asking upstream.
    Refuse,
}

/// The decision for a name under `mode`, and its verdict. Pure.
pub fn decide(allow: &AllowList, mode: Mode, name: &str) -> (Decision, Verdict) {
    let allowed = allow.allows_name(name);
    let verdict = Verdict::of_name(allowed, mode);
    let decision = match (allowed, mode) {
        (true, Mode::Enforce) => Decision::ForwardAndOpen,
        (_, Mode::Audit) => Decision::Forward,
        (false, Mode::Enforce) => Decision::Refuse,
    };
    (decision, verdict)
}

/// A token bucket: [`QUERY_BURST`] at once, [`QUERIES_PER_SECOND`] after. Pure over the
/// instants it is given.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(now: Instant) -> Bucket {
        Bucket {
            tokens: QUERY_BURST,
            last: now,
        }
    }

    /// Whether a query at `now` is within the rate (and takes its token).
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now.max(self.last);
        self.tokens = (self.tokens + elapsed * QUERIES_PER_SECOND).min(QUERY_BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One runner the resolver answers.
#[derive(Debug, Clone)]
pub struct Runner {
    pub attempt_id: String,
    /// Its namespace's address: the source of its queries.
    pub address: Ipv4Addr,
    /// Its policy's list joined with the host's.
    pub allow: Arc<AllowList>,
    pub mode: Mode,
    /// Its network namespace, where its table is.
    pub names: Names,
}

/// The name a runner asks to have its report written now (the agent's job-completed hook asks
/// it before it prints the report): answered NXDOMAIN after [`Reporter::report`], never
/// recorded, never sent upstream. `.invalid` is reserved (RFC 6761): no real name is it.
pub const REPORT_NAME: &str = "report.rm-egress.invalid";

/// A runner's report is written at most this often on its asking ([`REPORT_NAME`]): each
/// writing reads the runner's table with `nft`, and a job asking in a loop must not make the
/// agent do that a hundred times a second.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Writes a runner's report where its job-completed hook reads it (the agent's). Blocking.
pub trait Reporter: Send + Sync + 'static {
    fn report(&self, runner: &Runner, tally: &Tally);
}

/// Opens addresses in a runner's table (`rm_runner::network::egress::open`; tests give their
/// own). Blocking: it runs `nft`.
pub trait Firewall: Send + Sync + 'static {
    fn open(&self, names: &Names, addresses: &[(Ipv4Addr, Duration)]) -> Result<(), String>;
}

/// Counts over all runners, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub would_deny: AtomicU64,
    pub rate_limited: AtomicU64,
    pub unknown_source: AtomicU64,
    pub upstream_failed: AtomicU64,
    /// UDP replies the kernel would not take (the runner gets none and asks again).
    pub reply_failed: AtomicU64,
}

struct Entry {
    runner: Runner,
    tally: Tally,
    bucket: Bucket,
    /// Until when each address was last opened: a repeat answer within half of that does not
    /// run `nft` again.
    opened: HashMap<Ipv4Addr, Instant>,
    in_flight: usize,
    tcp: usize,
    /// When its report was last written on its asking.
    reported: Option<Instant>,
}

struct Inner {
    runners: Mutex<HashMap<Ipv4Addr, Entry>>,
    upstreams: Vec<SocketAddr>,
    firewall: Arc<dyn Firewall>,
    reporter: std::sync::OnceLock<Arc<dyn Reporter>>,
    counters: Counters,
}

impl Inner {
    fn runners(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, Entry>> {
        // A panic elsewhere leaves the map as consistent as each short section left it.
        self.runners.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The resolver: bound, registered with runners, served by [`Resolver::serve`].
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<Inner>,
    udp: Arc<UdpSocket>,
    tcp: Arc<TcpListener>,
    port: u16,
}

/// Why the resolver could not start.
#[derive(Debug, thiserror::Error)]
pub enum ResolverError {
    #[error("the egress resolver cannot bind the host's loopback: {0}")]
    Bind(std::io::Error),
    #[error(
        "the egress resolver has no upstream: host.dns_upstream is unset and the host's resolv.conf names no IPv4 nameserver"
    )]
    NoUpstream,
}

/// How many ports [`Resolver::bind`] tries for one where both UDP and TCP are free.
const BIND_TRIES: usize = 16;

impl Resolver {
    /// Binds UDP and TCP on one free port of `127.0.0.1`.
    pub async fn bind(
        upstreams: Vec<SocketAddr>,
        firewall: Arc<dyn Firewall>,
    ) -> Result<Resolver, ResolverError> {
        Resolver::bind_preferring(None, upstreams, firewall).await
    }

    /// [`Resolver::bind`] on `preferred` when it is free for both UDP and TCP (the port an
    /// earlier agent of the same data directory used), else on a free one. Keeping the port
    /// across a restart matters: the host's connection tracking keeps each runner's DNS flow
    /// rewritten to the port it first went to for up to two minutes, so a surviving runner
    /// whose client reuses a source port would send to a port nobody answers.
    pub async fn bind_preferring(
        preferred: Option<u16>,
        upstreams: Vec<SocketAddr>,
        firewall: Arc<dyn Firewall>,
    ) -> Result<Resolver, ResolverError> {
        if upstreams.is_empty() {
            return Err(ResolverError::NoUpstream);
        }
        let mut last = None;
        let ports = preferred
            .into_iter()
            .chain(std::iter::repeat_n(0, BIND_TRIES));
        for wanted in ports {
            let udp = match UdpSocket::bind((Ipv4Addr::LOCALHOST, wanted)).await {
                Ok(udp) => udp,
                Err(e) if wanted != 0 => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(ResolverError::Bind(e)),
            };
            let port = udp.local_addr().map_err(ResolverError::Bind)?.port();
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
                Ok(tcp) => {
                    return Ok(Resolver {
                        inner: Arc::new(Inner {
                            runners: Mutex::new(HashMap::new()),
                            upstreams,
                            firewall,
                            reporter: std::sync::OnceLock::new(),
                            counters: Counters::default(),
                        }),
                        udp: Arc::new(udp),
                        tcp: Arc::new(tcp),
                        port,
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(ResolverError::Bind(last.unwrap_or_else(|| {
            std::io::Error::other("no port free for both UDP and TCP")
        })))
    }

    /// Who writes a runner's report when it asks [`REPORT_NAME`] (once; later calls are
    /// ignored). Without one, the name is answered NXDOMAIN and nothing is written.
    pub fn set_reporter(&self, reporter: Arc<dyn Reporter>) {
        let _ = self.inner.reporter.set(reporter);
    }

    /// The port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Answers `runner` from now on, its tally going on from `earlier` (what the journal kept
    /// of it before an agent restart). Replaces a runner registered at the same address.
    pub fn register(&self, runner: Runner, earlier: Option<Record>) {
        let tally = match earlier {
            Some(record) => Tally::resume(record),
            None => Tally::new(runner.mode),
        };
        let entry = Entry {
            runner: runner.clone(),
            tally,
            bucket: Bucket::new(Instant::now()),
            opened: HashMap::new(),
            in_flight: 0,
            tcp: 0,
            reported: None,
        };
        self.inner.runners().insert(runner.address, entry);
    }

    /// Stops answering the runner at `address` when it is `attempt_id`'s, and gives back its
    /// tally.
    pub fn unregister(&self, address: Ipv4Addr, attempt_id: &str) -> Option<(Runner, Tally)> {
        let mut runners = self.inner.runners();
        if runners
            .get(&address)
            .is_some_and(|e| e.runner.attempt_id == attempt_id)
        {
            return runners.remove(&address).map(|e| (e.runner, e.tally));
        }
        None
    }

    /// Every registered runner and a copy of its tally (for the periodic flush).
    pub fn tallies(&self) -> Vec<(Runner, Tally)> {
        self.inner
            .runners()
            .values()
            .map(|e| (e.runner.clone(), e.tally.clone()))
            .collect()
    }

    /// Answers queries until the task is dropped.
    pub async fn serve(&self) {
        let udp = self.udp_loop();
        let tcp = self.tcp_loop();
        tokio::join!(udp, tcp);
    }

    async fn udp_loop(&self) {
        let mut buf = vec![0u8; dns::MAX_UDP];
        loop {
            let (len, from) = match self.udp.recv_from(&mut buf).await {
                Ok(got) => got,
                Err(e) => {
                    // ICMP errors of earlier replies surface here; the socket stays usable.
                    tracing::debug!(error = %e, "the egress resolver's UDP receive failed");
                    continue;
                }
            };
            let message = buf[..len].to_vec();
            let this = self.clone();
            tokio::spawn(async move {
                if let Some(reply) = this.answer(&message, from, Transport::Udp).await
                    && let Err(e) = this.udp.send_to(&reply, from).await
                {
                    this.inner
                        .counters
                        .reply_failed
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%from, error = %e, "the egress resolver's reply was not sent");
                }
            });
        }
    }

    async fn tcp_loop(&self) {
        loop {
            let (stream, from) = match self.tcp.accept().await {
                Ok(got) => got,
                Err(e) => {
                    tracing::debug!(error = %e, "the egress resolver's TCP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let SocketAddr::V4(v4) = from else { continue };
            let admitted = {
                let mut runners = self.inner.runners();
                match runners.get_mut(v4.ip()) {
                    Some(entry) if entry.tcp < MAX_TCP_CONNECTIONS => {
                        entry.tcp += 1;
                        true
                    }
                    _ => false,
                }
            };
            if !admitted {
                continue;
            }
            let this = self.clone();
            tokio::spawn(async move {
                this.tcp_connection(stream, from).await;
                if let Some(entry) = this.inner.runners().get_mut(v4.ip()) {
                    entry.tcp = entry.tcp.saturating_sub(1);
                }
            });
        }
    }

    async fn tcp_connection(&self, mut stream: TcpStream, from: SocketAddr) {
        loop {
            let message = match tokio::time::timeout(TCP_IDLE, read_framed(&mut stream)).await {
                Ok(Ok(message)) => message,
                _ => return,
            };
            let Some(reply) = self.answer(&message, from, Transport::Tcp).await else {
                return;
            };
            if stream.write_all(&dns::frame(&reply)).await.is_err() {
                return;
            }
        }
    }

    /// The reply to one message from `from`; `None`: no reply (not a query we can answer).
    async fn answer(
        &self,
        message: &[u8],
        from: SocketAddr,
        transport: Transport,
    ) -> Option<Vec<u8>> {
        let query = dns::parse_query(message).ok()?;
        let SocketAddr::V4(from) = from else {
            return Some(dns::respond(message, &query, dns::REFUSED));
        };
        let counters = &self.inner.counters;
        // Admission and the decision, under the lock; the upstream and `nft` outside it.
        let admitted = {
            let mut runners = self.inner.runners();
            match runners.get_mut(from.ip()) {
                None => Err(Refusal::Unknown),
                Some(entry) => {
                    if !entry.bucket.take(Instant::now()) || entry.in_flight >= MAX_IN_FLIGHT {
                        entry.tally.rate_limited();
                        Err(Refusal::Rate)
                    } else if query.name == REPORT_NAME {
                        Err(Refusal::Report)
                    } else {
                        let (decision, verdict) =
                            decide(&entry.runner.allow, entry.runner.mode, &query.name);
                        if decision == Decision::Refuse {
                            entry
                                .tally
                                .query(&query.name, verdict, &[], query.longest_label);
                        } else {
                            entry.in_flight += 1;
                        }
                        Ok((decision, verdict, entry.runner.names.clone()))
                    }
                }
            }
        };
        let (decision, verdict, names) = match admitted {
            Err(Refusal::Report) => {
                self.report(from.ip()).await;
                return Some(dns::respond(message, &query, dns::NXDOMAIN));
            }
            Err(Refusal::Unknown) => {
                counters.unknown_source.fetch_add(1, Ordering::Relaxed);
                return Some(dns::respond(message, &query, dns::REFUSED));
            }
            Err(Refusal::Rate) => {
                counters.rate_limited.fetch_add(1, Ordering::Relaxed);
                return Some(dns::respond(message, &query, dns::REFUSED));
            }
            Ok(admitted) => admitted,
        };
        match verdict {
            Verdict::Allowed => &counters.allowed,
            Verdict::Denied => &counters.denied,
            Verdict::WouldDeny => &counters.would_deny,
        }
        .fetch_add(1, Ordering::Relaxed);
        if decision == Decision::Refuse {
            return Some(dns::respond(message, &query, dns::NXDOMAIN));
        }
        let reply = self.forward(message, &query, transport).await;
        let result = match reply {
            None => {
                counters.upstream_failed.fetch_add(1, Ordering::Relaxed);
                self.finish(from.ip(), &query, verdict, &[]);
                dns::respond(message, &query, dns::SERVFAIL)
            }
            Some((bytes, answer)) => {
                let addresses: Vec<Ipv4Addr> = answer.a.iter().map(|(a, _)| *a).collect();
                let opened = if decision == Decision::ForwardAndOpen {
                    self.open_answer(from.ip(), &names, &answer.a).await
                } else {
                    true
                };
                self.finish(from.ip(), &query, verdict, &addresses);
                if opened {
                    bytes
                } else {
                    // Fail closed: an answer whose addresses the table does not let through
                    // would only give the job a connection that hangs or is refused.
                    dns::respond(message, &query, dns::SERVFAIL)
                }
            }
        };
        Some(result)
    }

    /// Has the runner's report written now ([`REPORT_NAME`]).
    async fn report(&self, from: &Ipv4Addr) {
        let Some(reporter) = self.inner.reporter.get().cloned() else {
            return;
        };
        let now = Instant::now();
        let found = self.inner.runners().get_mut(from).and_then(|entry| {
            if entry
                .reported
                .is_some_and(|at| now.saturating_duration_since(at) < REPORT_EVERY)
            {
                return None;
            }
            entry.reported = Some(now);
            Some((entry.runner.clone(), entry.tally.clone()))
        });
        if let Some((runner, tally)) = found {
            let _ = tokio::task::spawn_blocking(move || reporter.report(&runner, &tally)).await;
        }
    }

    /// Records a forwarded query and releases its place in flight.
    fn finish(&self, from: &Ipv4Addr, query: &Query, verdict: Verdict, addresses: &[Ipv4Addr]) {
        if let Some(entry) = self.inner.runners().get_mut(from) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry
                .tally
                .query(&query.name, verdict, addresses, query.longest_label);
        }
    }

    /// Opens what the answer gave that is not open long enough already; whether the table now
    /// lets the answer's addresses through.
    async fn open_answer(
        &self,
        from: &Ipv4Addr,
        names: &Names,
        records: &[(Ipv4Addr, u32)],
    ) -> bool {
        let now = Instant::now();
        let wanted: Vec<(Ipv4Addr, Duration)> = {
            let runners = self.inner.runners();
            let Some(entry) = runners.get(from) else {
                return false;
            };
            records
                .iter()
                .map(|(addr, ttl)| (*addr, open_for(*ttl)))
                .filter(|(addr, open)| {
                    entry
                        .opened
                        .get(addr)
                        .is_none_or(|until| *until < now + *open / 2)
                })
                .collect()
        };
        if wanted.is_empty() {
            return true;
        }
        let firewall = self.inner.firewall.clone();
        let names = names.clone();
        let to_open = wanted.clone();
        let opened = tokio::task::spawn_blocking(move || firewall.open(&names, &to_open))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        match opened {
            Ok(()) => {
                if let Some(entry) = self.inner.runners().get_mut(from) {
                    for (addr, open) in wanted {
                        entry.opened.insert(addr, now + open);
                    }
                }
                true
            }
            Err(why) => {
                tracing::warn!(runner = %from, why = %why, "cannot open an allowed answer's addresses in the runner's table; answering SERVFAIL");
                false
            }
        }
    }

    /// The upstreams' reply to `message`, in order, each given [`UPSTREAM_TIMEOUT`].
    async fn forward(
        &self,
        message: &[u8],
        query: &Query,
        transport: Transport,
    ) -> Option<(Vec<u8>, dns::Answer)> {
        for upstream in &self.inner.upstreams {
            let asked = match transport {
                Transport::Udp => ask_udp(*upstream, message),
                Transport::Tcp => Box::pin(ask_tcp(*upstream, message)),
            };
            match tokio::time::timeout(UPSTREAM_TIMEOUT, asked).await {
                Ok(Ok(bytes)) => match dns::parse_answer(&bytes, query) {
                    Ok(answer) => return Some((bytes, answer)),
                    Err(e) => {
                        tracing::debug!(%upstream, error = %e, "an upstream's answer does not answer the query");
                    }
                },
                Ok(Err(e)) => tracing::debug!(%upstream, error = %e, "an upstream failed"),
                Err(_) => tracing::debug!(%upstream, "an upstream did not answer in time"),
            }
        }
        None
    }
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    Udp,
    Tcp,
}

/// Why a query is answered without the allow list: no runner there, its rate, or the report
/// name.
enum Refusal {
    Unknown,
    Rate,
    Report,
}

type Asked<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<u8>>> + Send + 'a>>;

/// One UDP exchange from a fresh socket (a random source port per query), reading until a
/// message with the query's id comes from the upstream.
fn ask_udp(upstream: SocketAddr, message: &[u8]) -> Asked<'_> {
    Box::pin(async move {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await?;
        socket.connect(upstream).await?;
        socket.send(message).await?;
        let mut buf = vec![0u8; dns::MAX_UDP];
        loop {
            let len = socket.recv(&mut buf).await?;
            if len >= 2 && buf[..2] == message[..2] {
                return Ok(buf[..len].to_vec());
            }
        }
    })
}

async fn ask_tcp(upstream: SocketAddr, message: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.write_all(&dns::frame(message)).await?;
    read_framed(&mut stream).await
}

/// One length-framed message (RFC 1035 4.2.2).
async fn read_framed(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let len = usize::from(u16::from_be_bytes(len));
    let mut message = vec![0u8; len];
    stream.read_exact(&mut message).await?;
    Ok(message)
}

#[cfg(test)]
mod tests;
