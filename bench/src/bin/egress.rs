//! `egress`: what egress by name (`policy.egress`, issue 41) costs a runner's DNS and its
//! connections, each beside the path without it, in one run (see docs/performance.md).
//!
//! Everything stays on this machine, wired as `rm-agent run` wires it (`agent/src/egress.rs`),
//! through the product's own functions:
//!
//! - an upstream DNS stand-in on the host's loopback ([`UPSTREAM`], UDP and TCP): A records
//!   with TTL [`TTL`] for the bench's names, NXDOMAIN for every other;
//! - `rm_egress::resolver::Resolver` bound with that upstream, opening answers through
//!   `rm_runner::network::egress::open`, served on a tokio runtime;
//! - the host table (`HostNetwork::install`) with the resolver's port and the loopback
//!   resolver, the bench's own name ([`HOST_TABLE`]);
//! - three runner namespaces with egress (`network::create` with `runner_table(..,
//!   Some(EgressRules))`, each registered with the resolver) and one without it, the control
//!   (its DNS rewritten to the upstream directly, as runners without egress reach the host's
//!   loopback resolver);
//! - a stand-in namespace of the bench's own behind a veth, at a TEST-NET-2 address, with a TCP
//!   listener the allowed name resolves to.
//!
//! It measures, each sample a fresh socket made inside the runner's namespace (as a C
//! library's resolver or a client does): a query of an open name through the resolver against
//! the same query from the control straight to the upstream; the first answer of a name (its
//! address opened with `nft`) against its repeat; TCP connection set-up from an egress runner
//! against the control; and one egress runner's queries while another floods the resolver
//! with unique names, against the same queries at rest. Queries of one runner are paced at
//! [`PACE_PER_SECOND`] a second, under the resolver's per-runner rate, so that no measured
//! query is refused for rate.
//!
//! Every namespace, veth and table it makes is removed on exit, on an error, a panic of the
//! main thread or Ctrl-C ([`Cleanup`]).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use hdrhistogram::Histogram;
use rm_egress::allow::AllowList;
use rm_egress::dns;
use rm_egress::record::Mode;
use rm_egress::resolver::{Firewall, QUERIES_PER_SECOND, Resolver, Runner};
use rm_runner::network::egress::MAX_ADDRESSES;
use rm_runner::network::{self, EgressRules, HostNetwork, HostRules, Names};

/// The upstream DNS stand-in, on the host's loopback (the e2e stand-ins use 127.0.0.53 and
/// the few after it).
const UPSTREAM: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 77);

/// DNS's port.
const DNS_PORT: u16 = 53;

/// The TTL of the stand-in's answers: a common one, well above the resolver's shortest open
/// time, so an address stays open for the whole run.
const TTL: u32 = 300;

/// The name the runners' allow list names, resolving to the listener.
const ALLOWED_NAME: &str = "allowed.bench-egress.test";

/// `f<N>.` this zone resolves to [`first_address`]`(N)`: a fresh address per name, so each
/// first answer runs `nft`.
const FIRST_ZONE: &str = "first.bench-egress.test";

/// The flood's names: `<round>-<N>.` this zone, each unique, allowed, NXDOMAIN upstream.
const FLOOD_ZONE: &str = "flood.bench-egress.test";

/// The host table's name: the bench's own, beside any agent's (`rm_<hash>`).
const HOST_TABLE: &str = "rm_bench_egress";

/// The runners' uids; only their slots matter (their /30s). The last slots of the range, away
/// from the default pool's.
const UIDS: [u32; 4] = [16_380, 16_381, 16_382, 16_383];

/// The runners' short ids (12 hex characters, as an attempt's): `rm-<id>` and `rmv<id>`.
const SHORTS: [&str; 4] = [
    "be9e55000001",
    "be9e55000002",
    "be9e55000003",
    "be9e550000c0",
];

/// The stand-in namespace, and its veth's host end (not `rmv*`: the tables take those for
/// runners).
const STANDIN_NETNS: &str = "rmbench-egress";
const STANDIN_VETH: &str = "rmbegress0";
const STANDIN_PEER: &str = "up0";

/// The stand-in link's /30, in TEST-NET-2 (RFC 5737): the far end is the listener.
const STANDIN_HOST: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const STANDIN_FAR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);

/// The listener's port.
const LISTEN_PORT: u16 = 80;

/// Queries a second one runner sends while measured: under the resolver's rate
/// ([`QUERIES_PER_SECOND`]), so no measured query is refused for it.
const PACE_PER_SECOND: f64 = QUERIES_PER_SECOND * 0.8;

/// The port the bench's resolver takes on the loopback when it is free (any unused port).
const RESOLVER_PORT: u16 = 53_153;

/// How long a query waits for its answer before it counts as unanswered (a C library's
/// resolver waits 5 s, then asks again).
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Unmeasured queries or connections before each measured series.
const WARM_UP: usize = 20;

#[derive(Parser, Debug)]
#[command(
    about = "DNS through rm's egress resolver against the upstream directly, first answers \
             against repeats, TCP set-up with and without the runner's egress sets, and a \
             runner's DNS while another floods the resolver, in one run (as root)"
)]
struct Args {
    /// Queries in each DNS series (and first answers: each a fresh address in the runner's set).
    #[arg(long, default_value_t = 2000)]
    queries: usize,
    /// TCP connections from each runner.
    #[arg(long, default_value_t = 2000)]
    connects: usize,
    /// Unique names per round of the flood; rounds go on until the measured runner is done.
    #[arg(long, default_value_t = 20_000)]
    flood: usize,
}

/// The resolver's firewall: the runner's own table, through `nft` in its namespace (as the
/// agent's).
struct Nft;

impl Firewall for Nft {
    fn open(&self, names: &Names, addresses: &[(Ipv4Addr, Duration)]) -> Result<(), String> {
        network::egress::open(names, addresses).map_err(|e| e.to_string())
    }
}

/// The address of first-answer name `n`, from the benchmarking block 198.18.0.0/15 (RFC 2544):
/// only ever put in a runner's set, never connected to.
fn first_address(n: usize) -> Ipv4Addr {
    let n = u32::try_from(n).unwrap_or(u32::MAX) % (1 << 17);
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + n)
}

/// What the upstream stand-in answers for `name`.
fn lookup(name: &str) -> Option<Ipv4Addr> {
    if name == ALLOWED_NAME {
        return Some(STANDIN_FAR);
    }
    let first = name.strip_suffix(FIRST_ZONE)?.strip_suffix('.')?;
    first.strip_prefix('f')?.parse().ok().map(first_address)
}

/// The upstream's reply to `message`: A with [`TTL`] for a known name, NXDOMAIN otherwise.
fn upstream_reply(message: &[u8]) -> Option<Vec<u8>> {
    let query = dns::parse_query(message).ok()?;
    let Some(addr) = lookup(&query.name).filter(|_| query.qtype == 1) else {
        return Some(dns::respond(message, &query, dns::NXDOMAIN));
    };
    // The question ends after the name (its labels, each with a length byte, and the root's
    // zero) and its type and class: the query has no compression (parse_query says so).
    let name_wire = if query.name == "." {
        1
    } else {
        query.name.len() + 2
    };
    let question_end = 12 + name_wire + 4;
    let mut out = Vec::with_capacity(question_end + 16);
    out.extend_from_slice(message.get(..2)?);
    // A response, recursion desired and available, NOERROR; one question, one answer.
    out.extend_from_slice(&[0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0]);
    out.extend_from_slice(message.get(12..question_end)?);
    out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
    out.extend_from_slice(&TTL.to_be_bytes());
    out.extend_from_slice(&[0, 4]);
    out.extend_from_slice(&addr.octets());
    Some(out)
}

/// Serves the upstream stand-in on [`UPSTREAM`], UDP and TCP, on threads of its own.
fn serve_upstream() -> Result<()> {
    let at = SocketAddr::from((UPSTREAM, DNS_PORT));
    let udp = UdpSocket::bind(at).with_context(|| format!("binding the upstream at {at}"))?;
    let tcp = TcpListener::bind(at).with_context(|| format!("binding the upstream at {at}"))?;
    std::thread::spawn(move || {
        let mut buf = vec![0u8; dns::MAX_UDP];
        loop {
            let Ok((len, from)) = udp.recv_from(&mut buf) else {
                continue;
            };
            if let Some(reply) = buf.get(..len).and_then(upstream_reply) {
                let _ = udp.send_to(&reply, from);
            }
        }
    });
    std::thread::spawn(move || {
        for stream in tcp.incoming().flatten() {
            std::thread::spawn(move || serve_upstream_tcp(stream));
        }
    });
    Ok(())
}

fn serve_upstream_tcp(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    loop {
        let mut len = [0u8; 2];
        if stream.read_exact(&mut len).is_err() {
            return;
        }
        let mut message = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if stream.read_exact(&mut message).is_err() {
            return;
        }
        let Some(reply) = upstream_reply(&message) else {
            return;
        };
        if stream.write_all(&dns::frame(&reply)).is_err() {
            return;
        }
    }
}

/// A query for `name`'s A record, recursion desired.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// How one query ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The answer's rcode, and how long it took.
    Answered(u8, Duration),
    /// No answer within [`QUERY_TIMEOUT`].
    Unanswered,
}

/// One query as a client's resolver asks it: a fresh socket (a fresh source port), to the
/// runner's nameserver, waiting for the answer with its id. Called on a thread in the
/// runner's namespace.
fn ask(id: u16, name: &str) -> Result<Outcome> {
    let message = query(id, name);
    let started = Instant::now();
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.connect((UPSTREAM, DNS_PORT))?;
    socket.send(&message)?;
    let mut buf = [0u8; 512];
    loop {
        let left = QUERY_TIMEOUT.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(Outcome::Unanswered);
        }
        socket.set_read_timeout(Some(left))?;
        match socket.recv(&mut buf) {
            Ok(len) if len >= 4 && buf[..2] == message[..2] => {
                return Ok(Outcome::Answered(buf[3] & 0x0f, started.elapsed()));
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(Outcome::Unanswered);
            }
            // An ICMP error of the rewritten path (a port nobody answers): unanswered.
            Err(_) => return Ok(Outcome::Unanswered),
        }
    }
}

/// A series' latencies (of the answers with the rcode it expects) and what else came back.
#[derive(Debug)]
struct Series {
    latencies: Histogram<u64>,
    expected: u8,
    /// The latencies of answers with another rcode, by rcode (a refusal's latency tells
    /// whether it came at once or after a wait).
    other: BTreeMap<u8, Histogram<u64>>,
    unanswered: u64,
    total: u64,
}

impl Series {
    fn new(expected: u8) -> Result<Series> {
        Ok(Series {
            latencies: Histogram::new(3)?,
            expected,
            other: BTreeMap::new(),
            unanswered: 0,
            total: 0,
        })
    }

    fn add(&mut self, outcome: Outcome) -> Result<()> {
        self.total += 1;
        match outcome {
            Outcome::Answered(rcode, took) if rcode == self.expected => {
                self.latencies.record(micros(took))?;
            }
            Outcome::Answered(rcode, took) => {
                let other = match self.other.entry(rcode) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => e.insert(Histogram::new(3)?),
                };
                other.record(micros(took))?;
            }
            Outcome::Unanswered => self.unanswered += 1,
        }
        Ok(())
    }

    fn add_time(&mut self, took: Duration) -> Result<()> {
        self.total += 1;
        self.latencies.record(micros(took))?;
        Ok(())
    }

    fn answered(&self) -> u64 {
        self.latencies.len()
    }

    /// `p50 p99 max` in ms, and how many of the series got the expected answer.
    fn row(&self) -> String {
        let ms = |v: u64| v as f64 / 1000.0;
        let mut row = if self.latencies.is_empty() {
            format!("{:>9} {:>9} {:>9}", "-", "-", "-")
        } else {
            format!(
                "{:>6.3} ms {:>6.3} ms {:>6.3} ms",
                ms(self.latencies.value_at_quantile(0.5)),
                ms(self.latencies.value_at_quantile(0.99)),
                ms(self.latencies.max()),
            )
        };
        row.push_str(&format!("   {}/{}", self.answered(), self.total));
        for (rcode, latencies) in &self.other {
            row.push_str(&format!(
                ", rcode {rcode}: {} (p50 {:.3} ms, max {:.3} ms)",
                latencies.len(),
                ms(latencies.value_at_quantile(0.5)),
                ms(latencies.max())
            ));
        }
        if self.unanswered > 0 {
            row.push_str(&format!(", unanswered: {}", self.unanswered));
        }
        row
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Runs `work` on a thread that joined the network namespace `netns` (sockets it makes belong
/// to it); the bench's other threads stay where they are.
fn in_netns<T: Send>(netns: &str, work: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let path = format!("/run/netns/{netns}");
    let fd = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&fd),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .with_context(|| format!("entering {netns}"))?;
                work()
            })
            .join()
            .unwrap_or_else(|_| bail!("the thread in {netns} panicked"))
    })
}

/// Waits until `i` queries of a series paced at `per_second` are due.
fn pace(started: Instant, i: usize, per_second: f64) {
    let due = started + Duration::from_secs_f64(i as f64 / per_second);
    if let Some(wait) = due.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

/// `n` queries of `name(i)` from the namespace `netns`, paced, after a warm-up of `name(0)`.
fn query_series(
    netns: &str,
    n: usize,
    expected: u8,
    name: impl Fn(usize) -> String + Send + Sync,
) -> Result<Series> {
    in_netns(netns, || {
        let started = Instant::now();
        for i in 0..WARM_UP {
            ask(i as u16, &name(0))?;
            pace(started, i + 1, PACE_PER_SECOND);
        }
        let mut series = Series::new(expected)?;
        let started = Instant::now();
        for i in 0..n {
            series.add(ask(i as u16, &name(i))?)?;
            pace(started, i + 1, PACE_PER_SECOND);
        }
        Ok(series)
    })
}

/// `n` pairs from `netns`: the first query of a fresh name, then its repeat.
fn first_and_repeat(netns: &str, n: usize) -> Result<(Series, Series)> {
    in_netns(netns, || {
        let mut first = Series::new(dns::NOERROR)?;
        let mut repeat = Series::new(dns::NOERROR)?;
        let started = Instant::now();
        for i in 0..n {
            let name = format!("f{i}.{FIRST_ZONE}");
            first.add(ask(i as u16, &name)?)?;
            repeat.add(ask(i as u16 ^ 0x8000, &name)?)?;
            pace(started, 2 * (i + 1), PACE_PER_SECOND);
        }
        Ok((first, repeat))
    })
}

/// `n` TCP connections from `netns` to the listener, each closed at once, after a warm-up.
fn connect_series(netns: &str, n: usize) -> Result<Series> {
    let to = SocketAddr::from((STANDIN_FAR, LISTEN_PORT));
    in_netns(netns, || {
        for _ in 0..WARM_UP {
            TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)
                .with_context(|| format!("connecting to {to} from {netns}"))?;
        }
        let mut series = Series::new(0)?;
        for _ in 0..n {
            let started = Instant::now();
            let stream = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)
                .with_context(|| format!("connecting to {to} from {netns}"))?;
            series.add_time(started.elapsed())?;
            drop(stream);
        }
        Ok(series)
    })
}

/// What the flooding runner sent and got back.
#[derive(Debug, Default)]
struct Flood {
    sent: AtomicU64,
    send_failed: AtomicU64,
    /// Answers by rcode (0 NOERROR, 3 NXDOMAIN, 5 REFUSED ...).
    answers: Mutex<BTreeMap<u8, u64>>,
    elapsed: Mutex<Duration>,
}

/// Floods the resolver from `netns` with unique names, `per_round` a round, as fast as one
/// socket sends, until `stop`; a second thread counts the answers.
fn flood(netns: &str, per_round: usize, stop: &AtomicBool, out: &Flood) -> Result<()> {
    let socket = in_netns(netns, || {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        socket.connect((UPSTREAM, DNS_PORT))?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(socket)
    })?;
    let receiver = socket.try_clone()?;
    let sending = AtomicBool::new(true);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut buf = [0u8; 512];
            loop {
                match receiver.recv(&mut buf) {
                    Ok(len) if len >= 4 => {
                        *out.answers
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .entry(buf[3] & 0x0f)
                            .or_default() += 1;
                    }
                    Ok(_) => {}
                    // Answers still on their way come within the read timeout.
                    Err(_) if !sending.load(Ordering::SeqCst) => return,
                    Err(_) => {}
                }
            }
        });
        let started = Instant::now();
        let mut round = 0usize;
        'rounds: loop {
            for i in 0..per_round {
                if stop.load(Ordering::Relaxed) {
                    break 'rounds;
                }
                let name = format!("r{round}-{i}.{FLOOD_ZONE}");
                match socket.send(&query(i as u16, &name)) {
                    Ok(_) => out.sent.fetch_add(1, Ordering::Relaxed),
                    Err(_) => out.send_failed.fetch_add(1, Ordering::Relaxed),
                };
            }
            round += 1;
        }
        *out.elapsed.lock().unwrap_or_else(PoisonError::into_inner) = started.elapsed();
        sending.store(false, Ordering::SeqCst);
    });
    Ok(())
}

/// What the bench made, removed once: on drop (the end, an error, a panic of the main thread)
/// or on Ctrl-C.
#[derive(Default)]
struct Made {
    runners: Vec<Names>,
    standin: bool,
    host: Option<HostNetwork>,
}

#[derive(Clone, Default)]
struct Cleanup(Arc<Mutex<Made>>);

impl Cleanup {
    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes everything made so far; idempotent.
    fn run(&self) {
        let made = std::mem::take(&mut *self.made());
        for names in &made.runners {
            if let Err(e) = network::remove(names) {
                eprintln!("cannot remove {}: {e}", names.netns);
            }
        }
        if made.standin {
            remove_standin();
        }
        if let Some(host) = made.host
            && let Err(e) = host.uninstall()
        {
            eprintln!("cannot remove the table {}: {e}", host.table);
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Whichever clone goes first cleans; the others find nothing left.
        self.run();
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn remove_standin() {
    let _ = Command::new("ip")
        .args(["link", "del", STANDIN_VETH])
        .output();
    let _ = Command::new("ip")
        .args(["netns", "del", STANDIN_NETNS])
        .output();
}

/// The stand-in namespace behind its veth, with the listener accepting (and closing) every
/// connection on a thread of its own.
fn start_standin(cleanup: &Cleanup) -> Result<()> {
    remove_standin();
    cleanup.made().standin = true;
    ip(&["netns", "add", STANDIN_NETNS])?;
    ip(&[
        "link",
        "add",
        STANDIN_VETH,
        "type",
        "veth",
        "peer",
        "name",
        STANDIN_PEER,
        "netns",
        STANDIN_NETNS,
    ])?;
    ip(&[
        "addr",
        "add",
        &format!("{STANDIN_HOST}/30"),
        "dev",
        STANDIN_VETH,
    ])?;
    ip(&["link", "set", STANDIN_VETH, "up"])?;
    let inside = [
        "link set lo up".to_owned(),
        format!("addr add {STANDIN_FAR}/30 dev {STANDIN_PEER}"),
        format!("link set {STANDIN_PEER} up"),
        format!("route add default via {STANDIN_HOST}"),
    ];
    for line in &inside {
        let mut args = vec!["-n", STANDIN_NETNS];
        args.extend(line.split_whitespace());
        ip(&args)?;
    }
    let listener = in_netns(STANDIN_NETNS, || {
        Ok(TcpListener::bind((STANDIN_FAR, LISTEN_PORT))?)
    })?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.queries > 0 && args.connects > 0 && args.flood > 0,
        "--queries, --connects and --flood must be positive"
    );
    ensure!(
        args.queries < MAX_ADDRESSES as usize,
        "--queries must stay under the runner set's {MAX_ADDRESSES} addresses"
    );
    ensure!(
        rustix::process::geteuid().is_root(),
        "the bench makes network namespaces and tables: run it as root"
    );
    let missing = network::missing_tools();
    ensure!(missing.is_empty(), "install {}", missing.join(", "));
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let cleanup = Cleanup::default();
    {
        let cleanup = cleanup.clone();
        runtime.spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("interrupted: removing what the bench made");
                cleanup.run();
                std::process::exit(130);
            }
        });
    }

    serve_upstream()?;
    // One port for every run, as an agent keeps its port across restarts: the host's
    // connection tracking keeps a runner address's DNS flows rewritten to the port they first
    // went to for two minutes, and runs back to back reuse the runners' addresses.
    let resolver = runtime.block_on(Resolver::bind_preferring(
        Some(RESOLVER_PORT),
        vec![SocketAddr::from((UPSTREAM, DNS_PORT))],
        Arc::new(Nft),
    ))?;
    {
        let resolver = resolver.clone();
        runtime.spawn(async move { resolver.serve().await });
    }

    // The host's table, as the agent's: the upstream is the host's loopback resolver (what
    // runners without egress reach), the egress resolver's port behind EGRESS_DNS_PORT.
    let mut rules = HostRules::new(&[], &[], &format!("nameserver {UPSTREAM}\n"), UIDS);
    rules.egress_resolver = Some(resolver.port());
    let host = HostNetwork {
        table: HOST_TABLE.to_owned(),
        rules,
    };
    cleanup.made().host = Some(host.clone());
    host.install().context("installing the host table")?;

    start_standin(&cleanup)?;

    // Three runners with egress, registered with the resolver; the control without.
    let allow = Arc::new(
        AllowList::parse(&[
            ALLOWED_NAME.to_owned(),
            format!("*.{FIRST_ZONE}"),
            format!("*.{FLOOD_ZONE}"),
        ])
        .map_err(anyhow::Error::msg)?,
    );
    let egress_rules = EgressRules {
        audit: false,
        networks: vec![],
        nameservers: vec![UPSTREAM],
    };
    let mut netns = Vec::new();
    for (i, (uid, short)) in UIDS.iter().zip(SHORTS).enumerate() {
        let names = Names::of(short);
        let egress = (i < 3).then_some(&egress_rules);
        let table = host.runner_table(*uid, None, egress);
        cleanup.made().runners.push(names.clone());
        drop(
            network::create(&names, *uid, &table)
                .with_context(|| format!("making the runner network {}", names.netns))?,
        );
        if egress.is_some() {
            resolver.register(
                Runner {
                    attempt_id: format!("bench-egress-{i}"),
                    address: network::addresses(network::slot_of(*uid)).runner,
                    allow: Arc::clone(&allow),
                    mode: Mode::Enforce,
                    names: names.clone(),
                },
                None,
            );
        }
        netns.push(names.netns);
    }
    let [steady, first, flooder, control] = [&netns[0], &netns[1], &netns[2], &netns[3]];

    // The allowed name opened in the steady runner before anything is measured: a path that
    // does not work would measure nothing. Asked up to three times, as a client's resolver
    // asks again (a lone query can go unanswered; the series below count those).
    let mut opened = query_series(steady, 1, dns::NOERROR, |_| ALLOWED_NAME.to_owned())?;
    for _ in 0..2 {
        if opened.answered() == 1 {
            break;
        }
        opened = query_series(steady, 1, dns::NOERROR, |_| ALLOWED_NAME.to_owned())?;
    }
    ensure!(
        opened.answered() == 1,
        "the allowed name is not answered through the resolver: {}",
        opened.row()
    );
    let n = args.queries;

    eprintln!("1/4 DNS of an open name: {n} queries each, {PACE_PER_SECOND}/s");
    let through = query_series(steady, n, dns::NOERROR, |_| ALLOWED_NAME.to_owned())?;
    let direct = query_series(control, n, dns::NOERROR, |_| ALLOWED_NAME.to_owned())?;

    eprintln!("2/4 first answers against repeats: {n} pairs");
    let (first_answers, repeats) = first_and_repeat(first, n)?;

    eprintln!("3/4 TCP set-up: {} connections each", args.connects);
    let connect_egress = connect_series(steady, args.connects)?;
    let connect_control = connect_series(control, args.connects)?;

    eprintln!("4/4 a runner's DNS at rest, then while another floods the resolver");
    let rate_limited_before = resolver.counters().rate_limited.load(Ordering::Relaxed);
    let quiet = query_series(steady, n, dns::NOERROR, |_| ALLOWED_NAME.to_owned())?;
    let stop = AtomicBool::new(false);
    let flooded = Flood::default();
    let under_flood = std::thread::scope(|scope| -> Result<Series> {
        let flooding = scope.spawn(|| flood(flooder, args.flood, &stop, &flooded));
        // The flood under way before the first measured query.
        std::thread::sleep(Duration::from_millis(200));
        let measured = query_series(steady, n, dns::NOERROR, |_| ALLOWED_NAME.to_owned());
        stop.store(true, Ordering::SeqCst);
        flooding
            .join()
            .unwrap_or_else(|_| bail!("the flood panicked"))?;
        measured
    })?;
    let rate_limited =
        resolver.counters().rate_limited.load(Ordering::Relaxed) - rate_limited_before;

    println!(
        "rm-bench egress, {} cores, kernel {}, load average before the run {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        load_before.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "each query a fresh UDP socket in the runner's namespace to {UPSTREAM}:53, {PACE_PER_SECOND}/s; \
         p50 p99 max of the answers with the expected rcode, and how many had it"
    );
    println!("\n1. DNS, a name already open (steady state)");
    println!(
        "  through rm's resolver (egress runner)   {}",
        through.row()
    );
    println!("  to the upstream directly (control)      {}", direct.row());
    println!(
        "\n2. An allowed name's first answer (its address opened with nft) against its repeat"
    );
    println!(
        "  first answer                            {}",
        first_answers.row()
    );
    println!(
        "  repeat                                  {}",
        repeats.row()
    );
    println!("\n3. TCP connection set-up to the allowed address ({STANDIN_FAR}:{LISTEN_PORT})");
    println!(
        "  egress runner (allowed set)             {}",
        connect_egress.row()
    );
    println!(
        "  control runner (no egress table)        {}",
        connect_control.row()
    );
    println!("\n4. An egress runner's DNS while another floods the resolver");
    println!("  at rest                                 {}", quiet.row());
    println!(
        "  during the flood                        {}",
        under_flood.row()
    );
    let elapsed = *flooded
        .elapsed
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let sent = flooded.sent.load(Ordering::Relaxed);
    let answers = flooded
        .answers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let answered: u64 = answers.values().sum();
    println!(
        "  the flood: {sent} unique names in {:.1} s ({:.0}/s), {} sends failed; \
         answers: {answered} ({}), unanswered: {}; the resolver refused {rate_limited} for rate",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64().max(1e-9),
        flooded.send_failed.load(Ordering::Relaxed),
        answers
            .iter()
            .map(|(rcode, n)| format!("rcode {rcode}: {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        sent.saturating_sub(answered),
    );
    let counters = resolver.counters();
    println!(
        "  the resolver over the whole run: {} allowed, {} denied, {} refused for rate, {} from an unknown source, {} with no upstream answer (SERVFAIL after {} s), {} replies not sent",
        counters.allowed.load(Ordering::Relaxed),
        counters.denied.load(Ordering::Relaxed),
        counters.rate_limited.load(Ordering::Relaxed),
        counters.unknown_source.load(Ordering::Relaxed),
        counters.upstream_failed.load(Ordering::Relaxed),
        rm_egress::resolver::UPSTREAM_TIMEOUT.as_secs(),
        counters.reply_failed.load(Ordering::Relaxed),
    );

    drop(resolver);
    cleanup.run();
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
