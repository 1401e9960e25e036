//! `relay-latency`: webhook delivery latency for a host behind NAT, from "rm-relay answered 202 to
//! GitHub's POST" to "the delivery is in the host's journal" (see docs/performance.md). One
//! rm-relay with two channels; every delivery is posted to both ingest URLs at the same moment:
//! (a) rm-relay's subscription stream → `rm-agent run` with `[relay]`;
//! (b) the same relay's smee-compatible stream → the unmodified npm `smee-client` →
//!     `rm-agent receive`. smee.io is not reachable here, so rm-relay's smee form stands in for it.
//! The figure is the agent's `received_at` (journal) minus the instant the 202 arrived, per GUID.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use clap::Parser;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use rm_bench::delivery::{EVENT, USER_AGENT, sign};
use rm_bench::local::{free_port, sibling};
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use serde_json::Value;
use uuid::Uuid;

const APP_ID: u64 = 77;
const SECRET: &str = "bench-webhook-secret";
/// The smee-client release measured (pinned in bench/node/package.json).
const SMEE_CLIENT: &str = "smee-client@5.0.0";
/// The first `workflow_job.id`; each delivery gets the next one.
const FIRST_JOB_ID: u64 = 910_000_000;
/// How long the relay, both agents and smee-client may take to carry a first delivery.
const STARTUP: Duration = Duration::from_secs(30);
/// How often the journals are read while waiting.
const POLL: Duration = Duration::from_millis(200);
/// The agent's log line for a relayed delivery it refused (signature, headers or body).
const RELAY_REFUSED_LOG: &str = "relayed delivery refused";

#[derive(Parser, Debug)]
#[command(
    about = "202-at-the-relay to journalled latency: rm-relay subscription against smee-client"
)]
struct Args {
    /// Deliveries posted (each to both paths).
    #[arg(long, default_value_t = 300)]
    deliveries: usize,
    /// Time between two deliveries.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    every: Duration,
    /// How long to wait after the last post before counting the missing ones as lost.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The `workflow_job.queued` fixture the bodies are made from.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks/workflow_job.queued.5.json"))]
    fixture: PathBuf,
    /// The directory holding package.json with smee-client.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/node"))]
    node_dir: PathBuf,
}

/// A child process, killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Http = Client<HttpConnector, Full<Bytes>>;

fn spawn(cmd: &mut Command, log: &Path) -> Result<Proc> {
    let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let child = cmd.stdout(log.try_clone()?).stderr(log).spawn();
    Ok(Proc(
        child.with_context(|| format!("cannot start {cmd:?}"))?,
    ))
}

/// Runs `rm-relay ARGS --data-dir DATA --json` and parses what it prints.
fn relay_json(relay: &Path, data: &Path, args: &[&str]) -> Result<Value> {
    let mut cmd = Command::new(relay);
    cmd.args(args).arg("--data-dir").arg(data).arg("--json");
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{cmd:?}: {stderr}");
    serde_json::from_slice(&out.stdout).with_context(|| format!("{cmd:?} printed no JSON"))
}

/// Writes `<dir>/<name>.toml` and starts `rm-agent --config it COMMAND`, logging to `<name>.log`.
fn start_agent(
    agent: &Path,
    dir: &Path,
    name: &str,
    config: &str,
    cmd_env: [&str; 3],
) -> Result<Proc> {
    let [command, env, value] = cmd_env;
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, config)?;
    let mut cmd = Command::new(agent);
    cmd.arg("--config").arg(file).arg(command);
    cmd.env("RM_WEBHOOK_SECRET", SECRET)
        .env("RM_LOG", "warn")
        .env(env, value);
    spawn(&mut cmd, &dir.join(format!("{name}.log")))
}

fn field(v: &Value, key: &str) -> Result<String> {
    let value = v[key]
        .as_str()
        .with_context(|| format!("no `{key}` in {v}"));
    Ok(value?.to_owned())
}

/// smee-client from package-lock.json, installed the way bench/receiver.sh installs its Node deps.
fn ensure_smee(node_dir: &Path) -> Result<(PathBuf, String)> {
    let package = node_dir.join("node_modules/smee-client/package.json");
    if !package.is_file() {
        eprintln!("installing {SMEE_CLIENT}: npm ci in {}", node_dir.display());
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(node_dir)
            .status()
            .context("cannot run npm")?;
        ensure!(status.success(), "npm ci failed in {}", node_dir.display());
    }
    let meta: Value = serde_json::from_slice(&std::fs::read(&package)?).context("package.json")?;
    let bin = node_dir.join("node_modules/smee-client/bin/smee.js");
    Ok((bin, field(&meta, "version")?))
}

/// Sends `req`; its status, the Unix ms at which the answer's head arrived, and its body.
async fn send(http: &Http, req: Request<Full<Bytes>>) -> Result<(StatusCode, i64, Bytes)> {
    let what = format!("{} {}", req.method(), req.uri());
    let resp = http.request(req).await.context(what)?;
    let at = rm_vocab::now().get();
    let status = resp.status();
    Ok((status, at, resp.into_body().collect().await?.to_bytes()))
}

/// Posts one signed delivery as GitHub would; the Unix ms at which the relay's 202 arrived.
async fn post(http: &Http, url: &str, guid: &str, body: &Bytes, sig: &str) -> Result<i64> {
    let req = Request::post(url)
        .header("content-type", "application/json")
        .header("user-agent", USER_AGENT)
        .header("x-github-event", EVENT)
        .header("x-github-delivery", guid)
        .header("x-hub-signature-256", sig)
        .body(Full::new(body.clone()))?;
    let (status, at, _) = send(http, req).await?;
    ensure!(status == StatusCode::ACCEPTED, "POST {url}: {status}");
    Ok(at)
}

/// GUID → `received_at` (Unix ms) of everything in a journal; empty until the journal exists.
fn journalled(journal: &Path, limit: usize) -> Result<HashMap<String, i64>> {
    if !journal.exists() {
        return Ok(HashMap::new());
    }
    let rows = rm_journal::Reader::open(journal)?.deliveries(limit)?;
    Ok(rows
        .into_iter()
        .map(|r| (r.guid, r.received_at_ms.get()))
        .collect())
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let (agent, relay) = (sibling("rm-agent")?, sibling("rm-relay")?);
    let runner = sibling(rm_fake_runner::BINARY_NAME)?;
    let (smee_bin, smee_version) = ensure_smee(&args.node_dir)?;
    let work = tempfile::tempdir()?;
    let dir = work.path();
    let http: Http = Client::builder(TokioExecutor::new()).build_http();

    // One relay, a channel per path, a token for host (a).
    let relay_addr = format!("127.0.0.1:{}", free_port()?);
    let relay_url = format!("http://{relay_addr}");
    let data = dir.join("relay");
    let add = |name| {
        relay_json(
            &relay,
            &data,
            &["channel", "add", name, "--public-url", &relay_url],
        )
    };
    let urls = [add("sub")?, add("smee")?];
    let token = relay_json(&relay, &data, &["channel", "token", "sub", "bench"])?;
    let mut serve = Command::new(&relay);
    serve
        .args(["serve", "--listen", &relay_addr, "--data-dir"])
        .arg(&data);
    let _relay = spawn(&mut serve, &dir.join("relay.log"))?;

    // (a) `rm-agent run` against a fake GitHub (as runner-latency starts it; no jobs are queued
    // there), with `[relay]` and no `[receiver]`.
    let key = AppKeyPair::generate()?;
    let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem.clone())).await?;
    fake.add_org("acme");
    let package = rm_fake_runner::assemble_package(&runner, &dir.join("package"))?;
    let key_file = rm_bench::agent::write_app_key(dir, &key)?;
    let config = format!(
        "data_dir = \"{data}\"\n\n[github]\napi_url = \"{api}\"\napp_id = {APP_ID}\nprivate_key_file = \"{key}\"\n\n\
         [relay]\nurl = \"{sub}\"\n\n[host]\nname = \"bench\"\nmax_runners = 1\n\n[runner]\npackage_dir = \"{package}\"\n\n\
         [[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"self-hosted\", \"linux\"]\nmax_runners = 1\n",
        data = dir.join("a").display(),
        api = fake.api_url(),
        key = key_file.display(),
        sub = field(&urls[0], "subscribe_url")?,
        package = package.display(),
    );
    let _agent_a = start_agent(
        &agent,
        dir,
        "a",
        &config,
        ["run", "RM_RELAY_TOKEN", &field(&token, "token")?],
    )?;

    // (b) the smee form → smee-client → `rm-agent receive`.
    let port = free_port()?;
    let config = format!(
        "data_dir = \"{}\"\n\n[receiver]\nlisten = \"127.0.0.1:{port}\"\npath = \"/webhook\"\n",
        dir.join("b").display()
    );
    let _agent_b = start_agent(&agent, dir, "b", &config, ["receive", "RM_LOG", "warn"])?;
    let mut smee = Command::new("node");
    smee.arg(&smee_bin)
        .args(["--url", &field(&urls[1], "smee_url")?]);
    smee.args(["--target", &format!("http://127.0.0.1:{port}/webhook")]);
    let _smee = spawn(&mut smee, &dir.join("smee.log"))?;

    let names = [
        "rm-relay subscription → rm-agent run".to_owned(),
        format!("rm-relay smee form → smee-client {smee_version} → rm-agent receive"),
    ];
    let ingest = [
        field(&urls[0], "ingest_url")?,
        field(&urls[1], "ingest_url")?,
    ];
    let journals = [dir.join("a/journal.sqlite3"), dir.join("b/journal.sqlite3")];

    // Compact JSON: smee-client re-serialises the parsed body with JSON.stringify, which gives
    // back the signed bytes only for compact JSON. Each delivery is its own job.
    let fixture =
        std::fs::read(&args.fixture).with_context(|| args.fixture.display().to_string())?;
    let mut template: Value = serde_json::from_slice(&fixture).context("the fixture")?;
    let mut body_for = |n: usize| -> Result<(Bytes, String)> {
        template["workflow_job"]["id"] = (FIRST_JOB_ID + n as u64).into();
        let body = serde_json::to_vec(&template)?;
        let sig = sign(SECRET.as_bytes(), &body);
        Ok((body.into(), sig))
    };

    // Ready once a warm-up delivery has come through both paths (the smee stream does not
    // replay what was posted before smee-client connected: post one a second until then).
    let deadline = Instant::now() + STARTUP;
    loop {
        let healthz = Request::get(format!("{relay_url}/healthz")).body(Full::default())?;
        if send(&http, healthz)
            .await
            .is_ok_and(|(s, ..)| s.is_success())
        {
            let ((body, sig), guid) = (body_for(args.deliveries)?, Uuid::new_v4().to_string());
            for url in &ingest {
                post(&http, url, &guid, &body, &sig).await?;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (a, b) = (journalled(&journals[0], 1)?, journalled(&journals[1], 1)?);
        if !a.is_empty() && !b.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no warm-up came through both paths: see {}",
            dir.display()
        );
    }

    eprintln!(
        "posting {} deliveries to both paths, one every {:?}",
        args.deliveries, args.every
    );
    let mut tick = tokio::time::interval(args.every);
    let mut sends = Vec::with_capacity(args.deliveries);
    for n in 0..args.deliveries {
        tick.tick().await;
        let ((body, sig), guid) = (body_for(n)?, Uuid::new_v4().to_string());
        let (http, urls) = (http.clone(), ingest.clone());
        sends.push(tokio::spawn(async move {
            let (at_a, at_b) = tokio::join!(
                post(&http, &urls[0], &guid, &body, &sig),
                post(&http, &urls[1], &guid, &body, &sig)
            );
            anyhow::Ok((guid, [at_a?, at_b?]))
        }));
    }
    let mut accepted = Vec::with_capacity(sends.len());
    for send in sends {
        accepted.push(send.await??);
    }

    // Until every GUID is journalled on both paths, or the timeout (the rest are lost).
    let deadline = Instant::now() + args.timeout;
    let seen = loop {
        let limit = args.deliveries + 1_000;
        let seen = [
            journalled(&journals[0], limit)?,
            journalled(&journals[1], limit)?,
        ];
        let all = seen
            .iter()
            .all(|s| accepted.iter().all(|(g, _)| s.contains_key(g)));
        if all || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(POLL).await;
    };

    // Refused (signature mismatch and the like): the relay subscriber logs each; the receiver
    // counts them in /metrics.
    let refused_a = std::fs::read_to_string(dir.join("a.log"))?
        .matches(RELAY_REFUSED_LOG)
        .count();
    let metrics = Request::get(format!("http://127.0.0.1:{port}/metrics")).body(Full::default())?;
    let metrics = String::from_utf8_lossy(&send(&http, metrics).await?.2).into_owned();
    let refused_b: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("rm_receiver_refused_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let refused = [refused_a, refused_b as usize];

    println!(
        "{:<58} delivered lost refused   p50   p90   p99   max",
        "path (ms from the relay's 202 to journalled)"
    );
    for (i, name) in names.iter().enumerate() {
        let mut lat: Vec<i64> = accepted
            .iter()
            .filter_map(|(g, at)| Some(seen[i].get(g)? - at[i]))
            .collect();
        lat.sort_unstable();
        let (n, got, refused) = (accepted.len(), lat.len(), refused[i]);
        let [p50, p90, p99] = [50.0, 90.0, 99.0].map(|p| percentile(&lat, p));
        let (delivered, max) = (
            format!("{got}/{n}"),
            lat.last().copied().unwrap_or_default(),
        );
        println!(
            "{name:<58} {delivered:>9} {:>4} {refused:>7} {p50:>5} {p90:>5} {p99:>5} {max:>5}",
            n - got
        );
    }
    let node = Command::new("node")
        .arg("--version")
        .output()
        .context("node --version")?;
    println!(
        "{} deliveries of {} bytes, one every {:?}; node {}, smee-client {smee_version}. smee.io is \
         not reachable here: rm-relay's smee-compatible stream stands in for it.",
        args.deliveries,
        body_for(0)?.0.len(),
        args.every,
        String::from_utf8_lossy(&node.stdout).trim()
    );
    Ok(())
}
