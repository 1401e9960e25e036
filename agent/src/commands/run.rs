//! `rm-agent run`: everything configured in one process: the receiver (when `[receiver]` is
//! set) journalling deliveries, and the executor turning queued jobs into runners. SIGINT or
//! SIGTERM drains (CONTRACT §3): the receiver answers what is in flight, no new runner starts,
//! no busy runner is killed, and the agent exits within 60 seconds; runners still alive are
//! adopted at the next start.

use std::sync::Arc;

use anyhow::Context as _;
use rm_github::{ClientConfig, GithubClient};
use rm_journal::Journal;
use rm_receiver::{MAX_BODY_BYTES, Receiver, ReceiverConfig};
use tokio::sync::watch;

use crate::config::{Config, Workspace, display_file};
use crate::executor::registry::Registry;
use crate::executor::{Executor, Settings};
use crate::exit::Exit;
use crate::lifecycle::Timeouts;
use crate::{lock, secrets};

pub async fn run(config: &Config) -> Result<(), Exit> {
    let settings = settings(config)?;
    let app_id = config.github.app_id.ok_or_else(|| {
        usage(
            config,
            "github.app_id",
            "`rm-agent run` needs the GitHub App's id (its settings page shows it)",
        )
    })?;
    let key = secrets::private_key(config)?;
    let webhook_secrets = match &config.receiver {
        Some(_) => Some(secrets::webhook_secrets(config)?),
        None => None,
    };
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let journal_path = super::journal_path(config);
    let journal = Journal::open(&journal_path, config.retention)
        .with_context(|| format!("cannot open the journal in {}", config.data_dir.display()))
        .map_err(Exit::runtime)?;
    let client = GithubClient::new(ClientConfig::new(
        config.github.api_url.clone(),
        app_id,
        key,
    ))
    .context("cannot set up the GitHub client")
    .map_err(Exit::runtime)?;
    let executor = Executor::open(
        settings,
        &journal_path,
        &config.host.runner_root,
        Registry::new(client),
    )
    .map_err(Exit::runtime)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let receiver = match (&config.receiver, webhook_secrets) {
        (Some(settings), Some(secrets)) => {
            let listener = tokio::net::TcpListener::bind(settings.listen)
                .await
                .with_context(|| format!("cannot listen on {} (receiver.listen)", settings.listen))
                .map_err(Exit::runtime)?;
            tracing::info!(listen = %listener.local_addr().map_err(Exit::runtime)?, path = %settings.path, "receiver listening");
            let receiver = Receiver::new(
                ReceiverConfig {
                    path: settings.path.clone(),
                    secrets,
                    max_body_bytes: MAX_BODY_BYTES,
                },
                journal.clone(),
            );
            let shutdown = stopped(stop_rx.clone());
            Some(tokio::spawn(async move {
                receiver.serve(listener, shutdown).await
            }))
        }
        _ => {
            tracing::info!("no [receiver]: jobs come from the journal only");
            None
        }
    };
    let deliveries = Some(journal.durable_groups());
    let signal = async move {
        super::receive::shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    let report = Arc::clone(&executor).run(deliveries, signal).await;
    if let Some(receiver) = receiver {
        match receiver.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the receiver stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "the receiver task failed"),
        }
    }
    tracing::info!(
        left_running = report.left_running,
        launches_unfinished = report.launches_unfinished,
        "drained; runners still alive are adopted at the next start"
    );
    Ok(())
}

/// The executor's settings, refusing what `run` cannot do yet.
fn settings(config: &Config) -> Result<Settings, Exit> {
    if config.policies.is_empty() {
        return Err(usage(
            config,
            "policy",
            "`rm-agent run` needs at least one [[policy]] (name, target, labels)",
        ));
    }
    if let Some(policy) = config
        .policies
        .iter()
        .find(|p| p.workspace == Workspace::Persistent)
    {
        return Err(usage(
            config,
            "policy.workspace",
            &format!(
                "policy {:?}: persistent workspaces are not supported by this version yet; use workspace = \"ephemeral\"",
                policy.name
            ),
        ));
    }
    let package_dir = match (&config.runner.package_dir, &config.runner.version) {
        (Some(dir), _) => dir.clone(),
        (None, Some(_)) => {
            return Err(usage(
                config,
                "runner.version",
                "downloading the runner package is not supported by this version yet; unpack actions/runner and set runner.package_dir",
            ));
        }
        (None, None) => {
            return Err(usage(
                config,
                "runner.package_dir",
                "`rm-agent run` needs an unpacked actions/runner package (runner.package_dir)",
            ));
        }
    };
    Ok(Settings {
        host: config.host.name.clone(),
        max_runners: config.host.max_runners,
        package_dir,
        timeouts: Timeouts::supervision(
            config.runner.registration_timeout,
            config.runner.idle_timeout,
        ),
        policies: config.policies.clone(),
    })
}

fn usage(config: &Config, key: &str, problem: &str) -> Exit {
    Exit::usage(format!(
        "{}: `{key}`: {problem}",
        display_file(config.source.as_deref())
    ))
}
