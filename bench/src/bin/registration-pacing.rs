//! `registration-pacing`: how long a matrix's JIT registrations take to leave when rm learns
//! GitHub's content-creation limit (`github.pacing = "documented"`, the default) against counting
//! every `POST` as content from the start (`"cautious"`, rm's reading before), side by side in
//! one run, against a fake GitHub that counts registrations as content (`strict`) and one that
//! does not (`loose`, as terraform-aws-github-runner reads GitHub). The real `GithubClient` and
//! its budget against the in-process fake GitHub, both on one manual clock: no runner, no
//! agent, and simulated time (an hour of pacing costs seconds). See docs/performance.md.
//!
//! Registrations are all wanted at once, spread round-robin over `--apps` installations (each
//! its own budget scope and its own secondary limits at the fake: how several Apps would be
//! counted, if GitHub counts them per installation as it documents). Each is sent as soon as the
//! budget lets it; a refusal (rm's pacing, or GitHub's answer) names the time it may leave, and
//! the clock moves there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use clap::Parser;
use rm_fake_github::limits::REGISTRATION_LIMIT;
use rm_fake_github::{AppKeyPair, ContentCounting, FakeGithub, FakeOptions, SecondaryLimits};
use rm_github::pacing::{DOCUMENTED, Pacing};
use rm_github::types::JitRequest;
use rm_github::{ClientConfig, GithubClient, GithubError, Target};
use rm_vocab::{Clock as _, ManualClock};

const APP_ID: u64 = 4242;

#[derive(Parser, Debug)]
#[command(about = "A matrix's JIT registrations: the content limit learned against assumed")]
struct Args {
    /// Registrations wanted at once (a matrix).
    #[arg(long, default_value_t = 500)]
    registrations: usize,
    /// Installations they are spread over (one per App, as an approximation of several Apps).
    #[arg(long, default_value_t = 1)]
    apps: usize,
}

/// One run's figures.
struct Figures {
    /// Simulated time from the first request to the last registration.
    last: Duration,
    /// Registrations that left in the first minute.
    first_minute: usize,
    /// Secondary-limit answers GitHub (the fake) gave.
    refused: usize,
}

async fn run(
    key: &AppKeyPair,
    args: &Args,
    pacing: Pacing,
    content: ContentCounting,
) -> Result<Figures> {
    let mut options = FakeOptions::new(APP_ID, key.public_pem.clone());
    options.webhook_order = rm_fake_github::WebhookOrder::InOrder;
    options.secondary_limits = SecondaryLimits {
        content,
        ..SecondaryLimits::GITHUB
    };
    options.registration_limit = Some(REGISTRATION_LIMIT);
    let fake = FakeGithub::start(options).await?;
    let targets: Vec<Target> = (0..args.apps.max(1))
        .map(|n| {
            let org = format!("org{n}");
            fake.add_org(&org);
            Target::Org(org)
        })
        .collect();
    let clock = ManualClock::new();
    let config = ClientConfig {
        pacing,
        // Every wait comes back as a time: the clock is moved there, nothing sleeps.
        pacing_wait_max: Duration::ZERO,
        ..ClientConfig::new(fake.api_url(), APP_ID, key.private_pem.clone())
    };
    let client = GithubClient::with_clock(config, Arc::new(clock.clone()))?;
    let start = clock.now().to_system_time();
    // Wanted registrations by when they may next be tried (index → target), earliest first.
    let mut due: BTreeMap<(SystemTime, usize), ()> =
        (0..args.registrations).map(|n| ((start, n), ())).collect();
    let mut created = Vec::with_capacity(args.registrations);
    while let Some(((at, n), ())) = due.pop_first() {
        if let Ok(ahead) = at.duration_since(clock.now().to_system_time()) {
            clock.advance(ahead);
            fake.advance_clock(ahead);
        }
        let request = JitRequest {
            name: format!("rm-bench-{n:05}"),
            runner_group_id: 1,
            labels: vec!["self-hosted".into()],
            work_folder: "_work".into(),
        };
        match client
            .generate_jitconfig(&targets[n % targets.len()], &request)
            .await
        {
            Ok(_) => created.push(clock.now().to_system_time()),
            Err(GithubError::RateLimited { retry_at, .. }) => {
                let retry = retry_at.max(clock.now().to_system_time() + Duration::from_millis(1));
                due.insert((retry, n), ());
            }
            Err(other) => return Err(other).context(format!("registration {n}")),
        }
    }
    let last = created
        .iter()
        .max()
        .and_then(|t| t.duration_since(start).ok())
        .unwrap_or_default();
    let first_minute = created
        .iter()
        .filter(|t| {
            t.duration_since(start)
                .is_ok_and(|d| d < Duration::from_secs(60))
        })
        .count();
    let refused = fake
        .requests()
        .iter()
        .filter(|r| r.secondary_limited())
        .count();
    Ok(Figures {
        last,
        first_minute,
        refused,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let key = AppKeyPair::generate()?;
    println!(
        "{} registrations at once over {} installation(s); simulated time",
        args.registrations, args.apps
    );
    println!(
        "| GitHub counts registrations as content | pacing | last registration | in the first minute | secondary limits answered |"
    );
    println!("|---|---|---|---|---|");
    for (github, content) in [
        ("no (loose)", ContentCounting::Loose),
        ("yes (strict)", ContentCounting::Strict),
    ] {
        for (name, pacing) in [
            ("documented (learned)", Pacing::Documented(DOCUMENTED)),
            ("cautious", Pacing::Cautious(DOCUMENTED)),
        ] {
            let f = run(&key, &args, pacing, content).await?;
            println!(
                "| {github} | {name} | {:.0} s | {} | {} |",
                f.last.as_secs_f64(),
                f.first_minute,
                f.refused
            );
        }
    }
    Ok(())
}
