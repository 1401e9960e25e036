//! `rm-fake-github`: the fake GitHub as a process, for trying rm by hand. It makes an App key,
//! writes the private half to a file, sets up the repositories asked for, optionally queues
//! jobs, prints what a client needs as one JSON line, and serves until interrupted.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use secrecy::{ExposeSecret, SecretString};

/// A fake GitHub on loopback.
#[derive(Parser, Debug)]
struct Opts {
    /// The App's id.
    #[arg(long, default_value_t = 1)]
    app_id: u64,
    /// API base path (`/api/v3` to look like GHES).
    #[arg(long, default_value = "")]
    base_path: String,
    /// Where to write the App's private key (PEM, mode 0600).
    #[arg(long)]
    key_out: PathBuf,
    /// Repositories to create, `owner/name` (owners become organizations).
    #[arg(long = "repo")]
    repos: Vec<String>,
    /// Where to send webhooks.
    #[arg(long)]
    webhook_url: Option<String>,
    /// The webhook secret (with --webhook-url).
    #[arg(long, env = "RM_FAKE_WEBHOOK_SECRET")]
    webhook_secret: Option<String>,
    /// Jobs to queue in the first repository once started.
    #[arg(long, default_value_t = 0)]
    queue: usize,
    /// Labels of the queued jobs.
    #[arg(long = "label", default_values_t = ["self-hosted".to_owned(), "linux".to_owned()])]
    labels: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Opts::parse();
    let key = AppKeyPair::generate()?;
    write_private(&opts.key_out, &key.private_pem)?;
    let mut options = FakeOptions::new(opts.app_id, key.public_pem.clone());
    options.base_path = opts.base_path.clone();
    let fake = FakeGithub::start(options).await?;
    for repo in &opts.repos {
        fake.add_repo(repo);
    }
    if let Some(url) = &opts.webhook_url {
        let secret = opts
            .webhook_secret
            .clone()
            .context("--webhook-url needs --webhook-secret")?;
        fake.set_webhook(url, SecretString::from(secret));
    }
    if let Some(first) = opts.repos.first() {
        let labels: Vec<&str> = opts.labels.iter().map(String::as_str).collect();
        for i in 0..opts.queue {
            fake.queue_job(first, &format!("job-{i}"), &labels)?;
        }
    }
    let info = serde_json::json!({
        "api_url": fake.api_url(),
        "app_id": opts.app_id,
        "private_key_file": opts.key_out,
    });
    let mut out = std::io::stdout().lock();
    writeln!(out, "{info}")?;
    out.flush()?;
    drop(out);
    tokio::signal::ctrl_c().await?;
    Ok(())
}

fn write_private(path: &PathBuf, pem: &SecretString) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(path)
        .with_context(|| format!("cannot write the key to {}", path.display()))?;
    f.write_all(pem.expose_secret().as_bytes())?;
    Ok(())
}
