//! `cache`: what the host-local cache saves a job (issue 39), measured with the real clients in
//! one run (see docs/performance.md, "The host-local cache against GitHub's, over a
//! self-hosted runner's link").
//!
//! - **Save and restore**: the real `@actions/cache` (6.3.0, under Node, cache service v2) saves
//!   and restores a directory of random bytes (64 MiB, repeated; 1 GiB, once) through an
//!   `rm_cache::Service` on loopback (the local service, as a runner reaches it), and through
//!   other `rm_cache::Service`s (each its own directory) behind a throttling TCP proxy that
//!   stands in for GitHub's cache as a self-hosted runner reaches it: the same server, so the
//!   difference is the link. Each figure is the wall time of `saveCache`/`restoreCache` inside
//!   the Node process (archive creation and extraction included, module loading not); the
//!   part spent in `tar` (with its `zstdmt`) is timed by a `tar` on the client's `PATH` that
//!   runs the real one.
//! - **Set up job**: the fake runner (`tests/fake-runner`) takes a job using four actions of
//!   the real actions' sizes, from the host's archives (`ACTIONS_RUNNER_ACTION_ARCHIVE_CACHE`,
//!   laid out by `rm_cache::actions::ArchiveStore`) or downloaded from the fake GitHub's tarball
//!   endpoint through the same throttled link; the figure is what the runner writes in
//!   `_diag/setup.done`.
//!
//! The link: every byte waits RTT/2 after it has been sent (a delay line, not a delay per
//! read), sending is paced by a token bucket per connection and one shared by all connections
//! (each way), and a new connection's first byte leaves only after its handshakes.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rm_bench::rng::Rng;
use rm_cache::scope::{RunFacts, scope_of};
use rm_cache::{Caller, Callers, Refusal, Service, Settings};
use rm_fake_github::{AppKeyPair, FakeGithub, FakeJitConfig, FakeOptions, JobOrigin};
use rm_fake_github::{RunnerBehavior, archives};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// npm packages installed once and reused (shared with the tests by path).
#[path = "../../../tests/support/npm.rs"]
mod npm;

/// The client measured: the npm package `actions/cache` (5.x: `^5.0.5`) and the `setup-*`
/// actions (setup-node: `^6.2.0`) bundle; 6.3.0 is the one rm-cache's own test drives.
const CLIENT_PACKAGE: &str = "@actions/cache";
const CLIENT_VERSION: &str = "6.3.0";
/// The most a proxy reads at once: one chunk through the delay line.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight per direction of a connection, past which the proxy stops reading (a
/// receive window of 16 MiB, above any bandwidth-delay product measured here).
const WINDOW_CHUNKS: usize = 256;
/// How far an idle link may send ahead of its rate (so the timer's 1 ms granularity costs
/// no throughput).
const BURST: Duration = Duration::from_millis(10);
/// How long one Node save or restore may take before the bench gives up.
const OP_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the fake runner may take to register, run "Set up job" and exit.
const RUNNER_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the fake runner is looked at while it runs.
const RUNNER_POLL: Duration = Duration::from_millis(20);
/// The bytes of the link check's bulk transfer.
const CHECK_BYTES: usize = 16 << 20;
/// The App id of the fake GitHub.
const APP_ID: u64 = 39;
const MIB: f64 = 1024.0 * 1024.0;

/// The actions "Set up job" fetches, with the sizes of the real ones (`git archive` of each
/// repository's default branch, gzip; 2026 snapshots): name, uncompressed tar bytes, files.
/// actions/checkout 477 kB gzip (2.18 MB tar, 101 files), actions/setup-node 1.81 MB (8.36 MB,
/// 155), actions/cache 2.51 MB (13.5 MB, 103), actions/setup-python 1.63 MB (8.27 MB, 133).
const ACTIONS: [(&str, usize, usize); 4] = [
    ("actions/checkout", 2_181_120, 101),
    ("actions/setup-node", 8_355_840, 155),
    ("actions/cache", 13_516_800, 103),
    ("actions/setup-python", 8_273_920, 133),
];

#[derive(Parser, Debug)]
#[command(
    about = "actions/cache save/restore and Set up job: the host-local cache against a throttled stand-in for GitHub's"
)]
struct Args {
    /// The small size saved and restored, MiB (repeated).
    #[arg(long, default_value_t = 64)]
    small_mib: usize,
    /// The large size saved and restored once, MiB (0: none).
    #[arg(long, default_value_t = 1024)]
    large_mib: usize,
    /// Runs of each small save/restore and of each Set up job (the median is shown).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Round trip of the representative link.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    rtt: Duration,
    /// Bandwidth of the representative link, MiB/s each way, per connection and in aggregate.
    #[arg(long, default_value_t = 10.0)]
    mib_per_s: f64,
    /// Round trip of the generous link.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    generous_rtt: Duration,
    /// Bandwidth of the generous link, MiB/s.
    #[arg(long, default_value_t = 25.0)]
    generous_mib_per_s: f64,
    /// Round trips a new connection waits before its first byte (TCP, then TLS 1.3).
    #[arg(long, default_value_t = 2)]
    handshake_rtts: u32,
    /// Where `@actions/cache` is installed (`<dir>/actions-cache-6.3.0`), once.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench-npm"))]
    npm_dir: PathBuf,
    /// Skip the save/restore part.
    #[arg(long)]
    no_cache: bool,
    /// Skip the Set up job part.
    #[arg(long)]
    no_setup: bool,
}

// ---------------------------------------------------------------------------------------------
// The link

/// A stand-in for the path between a self-hosted runner and GitHub's cache.
#[derive(Debug, Clone)]
struct Link {
    name: String,
    rtt: Duration,
    /// Bytes per second, each way, per connection and in aggregate.
    rate: f64,
    handshake_rtts: u32,
}

/// A token bucket kept as virtual time: when the bytes offered so far have all been sent.
#[derive(Debug)]
struct Pacer {
    rate: f64,
    next: Instant,
}

impl Pacer {
    fn new(rate: f64) -> Pacer {
        Pacer {
            rate,
            next: Instant::now(),
        }
    }

    /// Takes `n` bytes offered at `now`; when they have been sent. An idle link may be up to
    /// [`BURST`] behind `now`, so a burst that size goes at once; a busy one sends at `rate`
    /// whatever the timer's lateness (the clock advances from the last departure, not from
    /// when the sender woke).
    fn reserve(&mut self, n: usize, now: Instant) -> Instant {
        let floor = now.checked_sub(BURST).unwrap_or(now);
        let start = self.next.max(floor);
        self.next = start + Duration::from_secs_f64(n as f64 / self.rate);
        self.next
    }
}

/// The shared buckets of one link, one each way.
struct Aggregate {
    up: Mutex<Pacer>,
    down: Mutex<Pacer>,
}

/// Serves `listener` forever: each connection is forwarded to `upstream` through `link`.
async fn serve_link(listener: TcpListener, upstream: SocketAddr, link: Link) {
    let shared = Arc::new(Aggregate {
        up: Mutex::new(Pacer::new(link.rate)),
        down: Mutex::new(Pacer::new(link.rate)),
    });
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let opened = Instant::now();
        let (link, shared) = (link.clone(), Arc::clone(&shared));
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            // Small writes (a Twirp call, a block list) must not wait for Nagle's ACK.
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let ready = opened + link.rtt * link.handshake_rtts;
            let up = pump(
                client_read,
                server_write,
                link.clone(),
                ready,
                Arc::clone(&shared),
                true,
            );
            let down = pump(server_read, client_write, link, ready, shared, false);
            tokio::join!(up, down);
        });
    }
}

/// One direction of a connection: read a chunk, wait until the buckets have sent it, hand it
/// to the delay line, which writes it RTT/2 later. Nothing leaves before `ready`.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    link: Link,
    ready: Instant,
    shared: Arc<Aggregate>,
    up: bool,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Option<Bytes>)>(WINDOW_CHUNKS);
    let one_way = link.rtt / 2;
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            let Some(chunk) = chunk else {
                let _ = to.shutdown().await;
                return;
            };
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut own = Pacer::new(link.rate);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        let now = Instant::now().max(ready);
        if n == 0 {
            let _ = tx.send((now + one_way, None)).await;
            break;
        }
        let all = if up { &shared.up } else { &shared.down };
        let sent = {
            let mut all = all
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            own.reserve(n, now).max(all.reserve(n, now))
        };
        // A burst is sent now, not in the past: its delay starts when it leaves.
        let sent = sent.max(now);
        tokio::time::sleep_until(sent).await;
        let chunk = Bytes::copy_from_slice(&buf[..n]);
        if tx.send((sent + one_way, Some(chunk))).await.is_err() {
            break;
        }
    }
    let _ = writer.await;
}

/// Binds a link in front of `upstream`; its address.
async fn start_link(upstream: SocketAddr, link: Link) -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve_link(listener, upstream, link));
    Ok(addr)
}

/// The link as this run sees it: a request/reply round trip on a new connection and on an
/// open one, and a bulk transfer, against a sink on loopback.
async fn check_link(link: &Link) -> Result<String> {
    let sink = TcpListener::bind("127.0.0.1:0").await?;
    let sink_addr = sink.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = sink.accept().await {
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                // Each request: a length, that many bytes; each reply: one byte.
                loop {
                    let Ok(len) = s.read_u64().await else { return };
                    let mut left = len;
                    let mut buf = vec![0u8; CHUNK];
                    while left > 0 {
                        let want = usize::try_from(left).unwrap_or(CHUNK).min(CHUNK);
                        match s.read(&mut buf[..want]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => left -= n as u64,
                        }
                    }
                    if s.write_u8(1).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let addr = start_link(sink_addr, link.clone()).await?;
    let opened = Instant::now();
    let mut c = TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    c.write_u64(0).await?;
    c.read_u8().await?;
    let first = opened.elapsed();
    let started = Instant::now();
    c.write_u64(0).await?;
    c.read_u8().await?;
    let rtt = started.elapsed();
    let started = Instant::now();
    c.write_u64(CHECK_BYTES as u64).await?;
    c.write_all(&vec![7u8; CHECK_BYTES]).await?;
    c.read_u8().await?;
    let bulk = started.elapsed();
    let rate = CHECK_BYTES as f64 / MIB / bulk.saturating_sub(rtt).as_secs_f64();
    Ok(format!(
        "{}: request→reply {} (first on a new connection {}); {} MiB in {} = {rate:.1} MiB/s",
        link.name,
        ms(rtt),
        ms(first),
        CHECK_BYTES >> 20,
        secs(bulk),
    ))
}

// ---------------------------------------------------------------------------------------------
// Services

/// Every connection is one default-branch job of `acme/app` (the agent maps a runner's address
/// to its job; here every request comes from 127.0.0.1, the proxy's included).
struct OneJob(Caller);

impl Callers for OneJob {
    fn identify(
        &self,
        _peer: std::net::IpAddr,
    ) -> Pin<Box<dyn Future<Output = Result<Caller, Refusal>> + Send + '_>> {
        let caller = self.0.clone();
        Box::pin(async move { Ok(caller) })
    }
}

fn one_job() -> Arc<dyn Callers> {
    Arc::new(OneJob(Caller {
        job: 1,
        attempt: "bench-attempt".into(),
        scope: scope_of(&RunFacts {
            repository: "acme/app".into(),
            default_branch: "main".into(),
            head_branch: "main".into(),
            event: "push".into(),
            head_repository: "acme/app".into(),
        }),
        // Signed URLs on the service's `public_base`: the link's address for a stand-in.
        base: None,
    }))
}

/// An `rm_cache::Service` in `dir` serving on `listener`, handing out URLs on `public_base`.
fn start_service(dir: &Path, listener: TcpListener, public_base: String) -> Result<Service> {
    let service = Service::open(Settings {
        dir: dir.to_owned(),
        max_size: u64::MAX,
        max_age: Duration::from_secs(24 * 3600),
        repo_quota: None,
        upstream: None,
        public_base,
    })
    .with_context(|| format!("opening the cache in {}", dir.display()))?;
    let serving = service.clone();
    tokio::spawn(async move {
        serving
            .serve(listener, one_job(), std::future::pending())
            .await;
    });
    Ok(service)
}

/// Where a save or restore goes.
struct Target {
    name: String,
    /// `ACTIONS_RESULTS_URL`.
    base: String,
}

async fn local_target(dir: &Path) -> Result<Target> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}/", listener.local_addr()?);
    start_service(&dir.join("local-cache"), listener, base.clone())?;
    Ok(Target {
        name: "local service".into(),
        base,
    })
}

/// A service of its own behind `link`: its signed URLs name the link's address, so the blob
/// transfers cross the link as the Twirp calls do.
async fn remote_target(dir: &Path, link: &Link, n: usize) -> Result<Target> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let upstream = listener.local_addr()?;
    let front = start_link(upstream, link.clone()).await?;
    let base = format!("http://{front}/");
    start_service(
        &dir.join(format!("remote-cache-{n}")),
        listener,
        base.clone(),
    )?;
    Ok(Target {
        name: link.name.clone(),
        base,
    })
}

// ---------------------------------------------------------------------------------------------
// The Node client

/// `saveCache`/`restoreCache` timed inside Node, so module loading is left out.
const NODE_SCRIPT: &str = r#"
const [mode, client, key, path] = process.argv.slice(2);
const cache = await import(`${client}/node_modules/@actions/cache/lib/cache.js`);
const started = performance.now();
const result = mode === 'save'
  ? await cache.saveCache([path], key)
  : (await cache.restoreCache([path], key)) ?? null;
console.log(JSON.stringify({ result, ms: performance.now() - started }));
"#;

/// A `tar` that runs the real one and appends its wall time (ns) to `$RM_BENCH_TAR_LOG`: the
/// client finds tar on `PATH` and runs `zstdmt` through it.
fn tar_shim(dir: &Path) -> Result<PathBuf> {
    let real = Command::new("sh")
        .args(["-c", "command -v tar"])
        .output()
        .context("cannot look for tar")?;
    let real = String::from_utf8(real.stdout)?.trim().to_owned();
    ensure!(!real.is_empty(), "no tar on PATH");
    let bin = dir.join("shim-bin");
    std::fs::create_dir_all(&bin)?;
    let script = format!(
        "#!/bin/sh\nstart=$(date +%s%N)\n\"{real}\" \"$@\"\nrc=$?\nend=$(date +%s%N)\necho $((end - start)) >> \"$RM_BENCH_TAR_LOG\"\nexit $rc\n"
    );
    let path = bin.join("tar");
    std::fs::write(&path, script)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(bin)
}

/// `@actions/cache` installed once under `npm_dir` (the tests' rule, `tests/support/npm.rs`);
/// the prefix.
fn ensure_client(npm_dir: &Path) -> Result<PathBuf> {
    npm::node_and_npm().map_err(anyhow::Error::msg)?;
    Ok(npm::npm_package(npm_dir, CLIENT_PACKAGE, CLIENT_VERSION))
}

/// What the client machinery needs for every run.
struct NodeClient {
    prefix: PathBuf,
    script: PathBuf,
    shim: PathBuf,
    tar_log: PathBuf,
}

/// One save or restore: the call's wall time and the tar time within it.
#[derive(Debug, Clone, Copy)]
struct Timed {
    wall: Duration,
    tar: Duration,
}

/// Runs `mode` (`save`/`restore`) of `key` for `data` in `workspace` against `target`.
fn node_op(
    client: &NodeClient,
    target: &Target,
    workspace: &Path,
    mode: &str,
    key: &str,
) -> Result<Timed> {
    let temp = workspace.join("runner-temp");
    std::fs::create_dir_all(&temp)?;
    std::fs::write(&client.tar_log, "")?;
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = Command::new("node");
    command
        .arg(&client.script)
        .args([mode, &client.prefix.display().to_string(), key, "data"])
        .current_dir(workspace)
        .env("PATH", format!("{}:{path}", client.shim.display()))
        .env("RM_BENCH_TAR_LOG", &client.tar_log)
        .env("RUNNER_TEMP", &temp)
        .env("GITHUB_WORKSPACE", workspace)
        .env("GITHUB_SERVER_URL", "https://github.com")
        .env("ACTIONS_RUNTIME_TOKEN", "bench-token")
        .env("ACTIONS_CACHE_SERVICE_V2", "true")
        .env("ACTIONS_RESULTS_URL", &target.base)
        .env_remove("ACTIONS_CACHE_URL")
        .env_remove("RUNNER_DEBUG");
    let out = command.output().context("cannot run node")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "node {mode} {key} against {}: {stdout}\n{}",
        target.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("no result from node {mode}: {stdout}"))?;
    let answer: Value = serde_json::from_str(last)?;
    match mode {
        "save" => ensure!(
            answer["result"].as_i64().is_some_and(|id| id > 0),
            "save {key} to {} did not save: {stdout}",
            target.name
        ),
        _ => ensure!(
            answer["result"] == key,
            "restore {key} from {} missed: {stdout}",
            target.name
        ),
    }
    let wall = Duration::from_secs_f64(answer["ms"].as_f64().context("no ms")? / 1000.0);
    let tar_ns: u64 = std::fs::read_to_string(&client.tar_log)?
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .sum();
    Ok(Timed {
        wall,
        tar: Duration::from_nanos(tar_ns),
    })
}

// ---------------------------------------------------------------------------------------------
// Data

/// `mib` MiB of random bytes in `files` files under `dir/data`.
fn random_tree(dir: &Path, mib: usize, files: usize, seed: u64) -> Result<()> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let mut rng = Rng(seed | 1);
    let per = (mib << 20) / files;
    let mut buf = vec![0u8; per];
    for i in 0..files {
        rng.fill(&mut buf);
        std::fs::write(data.join(format!("part-{i:04}.bin")), &buf)?;
    }
    Ok(())
}

/// Every file under `a` has its twin, byte for byte, under `b`, and no more.
fn same_tree(a: &Path, b: &Path) -> Result<u64> {
    let mut names_a: Vec<_> = std::fs::read_dir(a)?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let mut names_b: Vec<_> = std::fs::read_dir(b)?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names_a.sort();
    names_b.sort();
    ensure!(
        names_a == names_b,
        "{} and {} hold other files",
        a.display(),
        b.display()
    );
    let mut bytes = 0;
    for name in names_a {
        let (x, y) = (std::fs::read(a.join(&name))?, std::fs::read(b.join(&name))?);
        ensure!(
            x == y,
            "{} differs after the restore",
            name.to_string_lossy()
        );
        bytes += x.len() as u64;
    }
    Ok(bytes)
}

/// Text-like bytes: phrases of a small vocabulary, repeated as code repeats itself; gzip
/// shrinks them about 4.8 times, as it does the real actions' bundles (4.6-5.4).
fn text(rng: &mut Rng, phrases: &[String], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 128);
    while out.len() < len {
        let phrase = &phrases[(rng.next_u64() % phrases.len() as u64) as usize];
        out.extend_from_slice(phrase.as_bytes());
        out.push(if rng.next_u64().is_multiple_of(4) {
            b'\n'
        } else {
            b' '
        });
    }
    out.truncate(len);
    out
}

/// An action's files: one large bundle (`dist/index.js`, half the bytes) and the rest evenly.
fn action_files(rng: &mut Rng, tar_bytes: usize, files: usize) -> Vec<(String, Vec<u8>)> {
    let vocabulary: Vec<String> = (0..1024)
        .map(|_| {
            let len = 2 + (rng.next_u64() % 9) as usize;
            (0..len)
                .map(|_| char::from(b'a' + (rng.next_u64() % 26) as u8))
                .collect()
        })
        .collect();
    let phrases: Vec<String> = (0..1024)
        .map(|_| {
            let words = 3 + (rng.next_u64() % 8) as usize;
            (0..words)
                .map(|_| vocabulary[(rng.next_u64() % 1024) as usize].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    // A tar entry costs a 512-byte header and padding to 512.
    let payload = tar_bytes.saturating_sub(files * 1024);
    let bundle = payload / 2;
    let each = (payload - bundle) / (files - 1).max(1);
    let mut out = vec![("dist/index.js".to_owned(), text(rng, &phrases, bundle))];
    for i in 1..files {
        out.push((format!("src/file-{i:03}.ts"), text(rng, &phrases, each)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Save and restore

/// The medians (and ranges) of one size against one target.
struct Row {
    target: String,
    save: Vec<Timed>,
    restore: Vec<Timed>,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn summary(runs: &[Timed]) -> String {
    let walls: Vec<Duration> = runs.iter().map(|t| t.wall).collect();
    let tars: Vec<Duration> = runs.iter().map(|t| t.tar).collect();
    let (lo, hi) = (
        walls.iter().min().copied().unwrap_or_default(),
        walls.iter().max().copied().unwrap_or_default(),
    );
    let (wall, tar) = (median(walls), median(tars));
    let range = if runs.len() > 1 {
        format!(" [{}–{}]", secs(lo), secs(hi))
    } else {
        String::new()
    };
    format!(
        "{:>8}{range:<17} tar+zstd {:>7}  the rest {:>7}",
        secs(wall),
        secs(tar),
        secs(wall.saturating_sub(tar))
    )
}

async fn save_restore(
    client: Arc<NodeClient>,
    targets: &[Arc<Target>],
    dir: &Path,
    mib: usize,
    runs: usize,
) -> Result<Vec<Row>> {
    let files = if mib >= 512 { 64 } else { 16 };
    let source = dir.join(format!("src-{mib}"));
    let restored = dir.join(format!("dst-{mib}"));
    {
        let source = source.clone();
        tokio::task::spawn_blocking(move || random_tree(&source, mib, files, mib as u64 * 7919))
            .await??;
    }
    let mut rows = Vec::new();
    for (t, target) in targets.iter().enumerate() {
        let mut row = Row {
            target: target.name.clone(),
            save: Vec::new(),
            restore: Vec::new(),
        };
        for run in 0..runs {
            let key = format!("bench-{mib}mib-target{t}-run{run}");
            let (c, t, s, k) = (
                Arc::clone(&client),
                Arc::clone(target),
                source.clone(),
                key.clone(),
            );
            let op = tokio::task::spawn_blocking(move || node_op(&c, &t, &s, "save", &k));
            row.save.push(tokio::time::timeout(OP_TIMEOUT, op).await???);
            let _ = std::fs::remove_dir_all(restored.join("data"));
            let (c, t, d) = (Arc::clone(&client), Arc::clone(target), restored.clone());
            let op = tokio::task::spawn_blocking(move || node_op(&c, &t, &d, "restore", &key));
            row.restore
                .push(tokio::time::timeout(OP_TIMEOUT, op).await???);
            if run == 0 {
                let (a, b) = (source.join("data"), restored.join("data"));
                let bytes = tokio::task::spawn_blocking(move || same_tree(&a, &b)).await??;
                ensure!(bytes == (mib as u64) << 20, "restored {bytes} bytes");
            }
            eprintln!(
                "  {mib} MiB {}: run {} save {} restore {}",
                row.target,
                run + 1,
                secs(row.save[run].wall),
                secs(row.restore[run].wall)
            );
        }
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&source);
    let _ = std::fs::remove_dir_all(&restored);
    Ok(rows)
}

fn print_rows(mib: usize, runs: usize, rows: &[Row]) {
    let what = if runs > 1 {
        format!("median of {runs} [min–max]")
    } else {
        "one run".to_owned()
    };
    println!(
        "{} ({what}; every restore's first run compared byte for byte: identical):",
        size(mib)
    );
    for (op, pick) in [("save", 0), ("restore", 1)] {
        for row in rows {
            let runs = if pick == 0 { &row.save } else { &row.restore };
            println!("  {op:<8} {:<34} {}", row.target, summary(runs));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Set up job

/// Forwards HTTP to the fake GitHub, rewriting a redirect's `Location` from the fake's own
/// address to the link's, so the codeload download crosses the link too (the fake names
/// itself in its redirects; GitHub's codeload is as far away as its API).
async fn serve_rewriter(listener: TcpListener, fake: SocketAddr, public: String) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    while let Ok((stream, _)) = listener.accept().await {
        let (client, public) = (client.clone(), public.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                forward(client.clone(), fake, public.clone(), req)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: Client<HttpConnector, Full<Bytes>>,
    fake: SocketAddr,
    public: String,
    req: Request<Incoming>,
) -> Result<Response<Incoming>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = Request::builder()
        .method(parts.method)
        .uri(format!("http://{fake}{path}"));
    for (name, value) in &parts.headers {
        if name != http::header::HOST {
            out = out.header(name, value);
        }
    }
    let mut answer = client.request(out.body(Full::new(body))?).await?;
    let own = format!("http://{fake}");
    let moved = answer
        .headers()
        .get(http::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|l| l.strip_prefix(&own))
        .map(|rest| format!("{public}{rest}"));
    if let Some(location) = moved {
        answer
            .headers_mut()
            .insert(http::header::LOCATION, HeaderValue::from_str(&location)?);
    }
    Ok(answer)
}

/// The fake GitHub's address as the runner reaches it through `link`.
async fn fake_through(fake: &FakeGithub, link: &Link) -> Result<String> {
    let fake_addr: SocketAddr = fake
        .server_url()
        .trim_start_matches("http://")
        .parse()
        .context("the fake's address")?;
    let rewriter = TcpListener::bind("127.0.0.1:0").await?;
    let rewriter_addr = rewriter.local_addr()?;
    let front = TcpListener::bind("127.0.0.1:0").await?;
    let public = format!("http://{}", front.local_addr()?);
    tokio::spawn(serve_rewriter(rewriter, fake_addr, public.clone()));
    tokio::spawn(serve_link(front, rewriter_addr, link.clone()));
    Ok(public)
}

/// One job through the fake runner; the "Set up job" time it wrote, and its words.
async fn set_up_job(
    fake: &FakeGithub,
    binary: &Path,
    dir: &Path,
    n: usize,
    server_url: &str,
    uses: &[String],
    archives: Option<&Path>,
) -> Result<(Duration, String)> {
    fake.queue_job_as(
        "acme/widgets",
        "build",
        &["self-hosted"],
        &JobOrigin {
            uses: uses.to_vec(),
            ..JobOrigin::default()
        },
    )?;
    let name = format!("rm-h-{n:012}");
    let jit = fake.generate_jitconfig("acme", &name, &["self-hosted", "linux"])?;
    let mut config = FakeJitConfig::decode(&jit)?;
    config.server_url = server_url.to_owned();
    let runtime = dir.join(format!("runtime-{n}"));
    rm_fake_runner::assemble_package(binary, &runtime)?;
    let mut command = Command::new(runtime.join("bin").join("Runner.Listener"));
    command
        .arg("run")
        .current_dir(&runtime)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ACTIONS_RUNNER_INPUT_JITCONFIG", config.encode())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(archives) = archives {
        command.env(rm_fake_runner::ARCHIVE_CACHE_ENV, archives);
    }
    let mut child = command.spawn().context("cannot start the fake runner")?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > RUNNER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the fake runner did not finish within {RUNNER_TIMEOUT:?}");
        }
        tokio::time::sleep(RUNNER_POLL).await;
    };
    ensure!(status.success(), "the fake runner failed: {status}");
    let line = std::fs::read_to_string(runtime.join("_diag").join(rm_fake_runner::SETUP_DONE_FILE))
        .context("no setup.done")?;
    let took = line
        .trim()
        .strip_suffix(" ms")
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|m| m.parse::<u64>().ok())
        .with_context(|| format!("setup.done says {line:?}"))?;
    let _ = std::fs::remove_dir_all(&runtime);
    Ok((Duration::from_millis(took), line.trim().to_owned()))
}

async fn setup_part(args: &Args, links: &[Link], dir: &Path) -> Result<()> {
    let binary = rm_bench::local::sibling(rm_fake_runner::BINARY_NAME)?;
    let key = AppKeyPair::generate()?;
    let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem)).await?;
    fake.add_repo("acme/widgets");
    fake.set_runner_behavior(RunnerBehavior {
        idle_timeout_ms: Some(30_000),
        job_duration_ms: 0,
        ..RunnerBehavior::default()
    });
    let store = rm_cache::actions::ArchiveStore::open(dir.join("actions"))?;
    let mut rng = Rng(0x5eed_ac71_0000_0039);
    let mut uses = Vec::new();
    let mut described = Vec::new();
    for (i, (name, tar_bytes, files)) in ACTIONS.iter().enumerate() {
        let sha = format!("{:040x}", 0xac7_1000 + i);
        let files = action_files(&mut rng, *tar_bytes, *files);
        let refs: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(p, b)| (p.as_str(), b.as_slice()))
            .collect();
        fake.publish_action(name, true, &[("v1", &sha)], &refs);
        let (owner, repo) = name.split_once('/').context("owner/repo")?;
        // The bytes the fake serves (the same function makes them), installed as the agent's
        // refresher installs a download.
        let archive = archives::tarball(owner, repo, &sha, &refs);
        let staged = store.begin(&rm_cache::actions::ArchiveKey {
            repository: (*name).to_owned(),
            sha: sha.clone(),
        })?;
        let mut writer = staged.writer()?;
        writer.write_all(&archive).await?;
        writer.flush().await?;
        drop(writer);
        store.install(staged)?;
        described.push(format!(
            "{name} {:.2} MB gzip ({:.2} MB tar, {} files)",
            archive.len() as f64 / 1e6,
            *tar_bytes as f64 / 1e6,
            refs.len()
        ));
        uses.push(format!("{name}@{sha}"));
    }
    println!();
    println!(
        "Set up job: the fake runner, {} actions: {}",
        uses.len(),
        described.join(", ")
    );
    println!(
        "(\"Set up job\" as the runner times it in _diag/setup.done, median of {} [min–max])",
        args.repeat
    );
    let mut fronts = Vec::new();
    for link in links {
        fronts.push((link.clone(), fake_through(&fake, link).await?));
    }
    let mut n = 0;
    let mut lines = Vec::new();
    let variants: Vec<(String, &str, bool)> = std::iter::once((
        "from the host's archives".to_owned(),
        fronts[0].1.as_str(),
        true,
    ))
    .chain(fronts.iter().map(|(link, url)| {
        (
            format!("downloaded over {}", link.name),
            url.as_str(),
            false,
        )
    }))
    .collect();
    for (what, url, host) in variants {
        let mut took = Vec::new();
        let mut said = String::new();
        for _ in 0..args.repeat {
            n += 1;
            let archives = host.then(|| store.root());
            let (t, line) = set_up_job(&fake, &binary, dir, n, url, &uses, archives).await?;
            eprintln!("  Set up job {what}: {line}");
            took.push(t);
            said = line;
        }
        let (lo, hi) = (
            took.iter().min().copied().unwrap_or_default(),
            took.iter().max().copied().unwrap_or_default(),
        );
        let line = format!(
            "  {what:<48} {:>8} [{}–{}]   ({said})",
            ms(median(took)),
            ms(lo),
            ms(hi)
        );
        lines.push(line);
    }
    for line in lines {
        println!("{line}");
    }
    println!("  codeload downloads served: {}", fake.action_downloads());
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn size(mib: usize) -> String {
    if mib >= 1024 && mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else {
        format!("{mib} MiB")
    }
}

fn version(cmd: &str, arg: &str) -> String {
    Command::new(cmd)
        .arg(arg)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| format!("{cmd}: unknown"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.repeat >= 1, "--repeat must be at least 1");
    let link = |rtt: Duration, mib_per_s: f64| Link {
        name: format!("stand-in {} ms, {mib_per_s} MiB/s", rtt.as_millis()),
        rtt,
        rate: mib_per_s * MIB,
        handshake_rtts: args.handshake_rtts,
    };
    let links = vec![
        link(args.rtt, args.mib_per_s),
        link(args.generous_rtt, args.generous_mib_per_s),
    ];
    let dir = tempfile::Builder::new()
        .prefix("rm-bench-cache-")
        .tempdir()?;
    println!(
        "node {}, {CLIENT_PACKAGE} {CLIENT_VERSION} (cache service v2), {}, {}, {} cores",
        version("node", "--version"),
        version("tar", "--version"),
        version("zstd", "--version"),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "stand-ins: each an rm_cache::Service behind a proxy: RTT/2 delay on every byte each way, \
         the bandwidth per connection and in aggregate each way, a new connection's first byte \
         after {} RTT",
        args.handshake_rtts
    );
    for link in &links {
        println!("  link check, {}", check_link(link).await?);
    }
    if !args.no_cache {
        let prefix = ensure_client(&args.npm_dir)?;
        let script = dir.path().join("client.mjs");
        std::fs::write(&script, NODE_SCRIPT)?;
        let client = Arc::new(NodeClient {
            prefix,
            script,
            shim: tar_shim(dir.path())?,
            tar_log: dir.path().join("tar.log"),
        });
        let mut targets = vec![Arc::new(local_target(dir.path()).await?)];
        for (i, link) in links.iter().enumerate() {
            targets.push(Arc::new(remote_target(dir.path(), link, i).await?));
        }
        let mut sizes: BTreeMap<usize, usize> = BTreeMap::new();
        sizes.insert(args.small_mib, args.repeat);
        if args.large_mib > 0 {
            sizes.insert(args.large_mib, 1);
        }
        for (mib, runs) in sizes {
            println!();
            let rows = save_restore(Arc::clone(&client), &targets, dir.path(), mib, runs).await?;
            print_rows(mib, runs, &rows);
        }
    }
    if !args.no_setup {
        setup_part(&args, &links, dir.path()).await?;
    }
    Ok(())
}
