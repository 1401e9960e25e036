//! `rm-agent receive`: the webhook receiver alone. Verifies, journals, answers; stops on SIGINT
//! or SIGTERM after answering the requests in flight. A poisoned journal (a failed flush) stops
//! it the same way, but with exit 1, so the service manager restarts it and SQLite recovers the
//! journal, instead of it answering 503 forever.
//!
//! With `[journal] url` (CONTRACT §9) it records into the fleet's PostgreSQL journal instead,
//! beside any number of other receivers: no data-directory lock (it keeps nothing there), and
//! no poisoning: while the database cannot commit, deliveries are answered 503 and `/healthz`
//! says so, and the writer connects again by itself for the next delivery once it is back.

use anyhow::Context;
use rm_journal::{Journal, PgTarget, Store};
use rm_receiver::{MAX_BODY_BYTES, Receiver, ReceiverConfig, WebhookSecrets};

use crate::config::Config;
use crate::exit::Exit;
use crate::{lock, secrets};

pub async fn run(config: &Config) -> Result<(), Exit> {
    let Some(settings) = &config.receiver else {
        return Err(Exit::usage(format!(
            "{}: `receiver`: `rm-agent receive` needs a [receiver] table, e.g. listen = \"0.0.0.0:8080\"",
            crate::config::display_file(config.source.as_deref())
        )));
    };
    let secrets = secrets::webhook_secrets(config)?;
    if let Some(target) = secrets::journal_target(config) {
        return receive_on_shared(config, settings, secrets, target).await;
    }
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let journal_path = super::journal_path(config);
    let journal = Journal::open(&journal_path, config.retention)
        .with_context(|| format!("cannot open the journal in {}", config.data_dir.display()))
        .map_err(Exit::runtime)?;
    let (listener, local) = listen(settings).await?;
    tracing::info!(
        listen = %local,
        path = %settings.path,
        secrets = secrets.len(),
        journal = %journal_path.display(),
        "receiver listening"
    );
    let receiver = Receiver::new(
        ReceiverConfig {
            path: settings.path.clone(),
            secrets,
            max_body_bytes: MAX_BODY_BYTES,
        },
        journal.clone(),
    );
    receiver
        .serve(listener, until_stopped(shutdown_signal(), &journal))
        .await
        .context("the receiver stopped")
        .map_err(Exit::runtime)?;
    if let Some(exit) = poisoned_exit(&journal) {
        return Err(exit);
    }
    tracing::info!("receiver stopped");
    Ok(())
}

/// The receiver's listening socket and the address it got.
async fn listen(
    settings: &crate::config::ReceiverSettings,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), Exit> {
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {} (receiver.listen)", settings.listen))
        .map_err(Exit::runtime)?;
    let local = listener.local_addr().map_err(Exit::runtime)?;
    Ok((listener, local))
}

/// `receive` on the fleet's shared journal: connects and migrates (or fails, exit 1, with the
/// server's reason and never the connection string), then serves until a signal.
async fn receive_on_shared(
    config: &Config,
    settings: &crate::config::ReceiverSettings,
    secrets: WebhookSecrets,
    target: PgTarget,
) -> Result<(), Exit> {
    // `receive` runs no jobs: what is unsafe for a runner host is only said.
    crate::journal_auth::enforce(config, crate::journal_auth::Role::Receive, &target)?;
    let server = target.describe();
    let store = Store::open(super::journal_path(config), Some(target));
    // Connecting blocks (the sync client runs a runtime of its own): off this one.
    let journal = tokio::task::spawn_blocking(move || store.shared_intake())
        .await
        .map_err(Exit::runtime)?
        .ok_or_else(|| Exit::runtime(anyhow::anyhow!("the fleet's journal is not configured")))?
        .with_context(|| {
            format!(
                "cannot open the PostgreSQL journal {server} (journal.url in {}); check that the database is up and the role may log in (${} holds its password), then run `rm-agent check`",
                crate::config::display_file(config.source.as_deref()),
                secrets::JOURNAL_PASSWORD_ENV
            )
        })
        .map_err(Exit::runtime)?;
    let (listener, local) = listen(settings).await?;
    tracing::info!(
        listen = %local,
        path = %settings.path,
        secrets = secrets.len(),
        journal = %server,
        "receiver listening on the PostgreSQL journal"
    );
    let receiver = Receiver::new(
        ReceiverConfig {
            path: settings.path.clone(),
            secrets,
            max_body_bytes: MAX_BODY_BYTES,
        },
        journal,
    );
    receiver
        .serve(listener, shutdown_signal())
        .await
        .context("the receiver stopped")
        .map_err(Exit::runtime)?;
    tracing::info!("receiver stopped");
    Ok(())
}

/// Completes when `shutdown` does or when the journal is poisoned, whichever is first: either
/// way the command stops taking work and answers what is in flight.
pub(crate) async fn until_stopped(
    shutdown: impl std::future::Future<Output = ()>,
    journal: &Journal,
) {
    tokio::select! {
        () = shutdown => {}
        reason = journal.poisoned() => {
            tracing::error!(%reason, "the journal is poisoned: no delivery can be taken until rm-agent restarts; answering the requests in flight, then exiting with status 1");
        }
    }
}

/// The exit of a command whose journal was poisoned: status 1 (CONTRACT §1, a run-time failure;
/// systemd's `Restart=on-failure` restarts it) with why and what to do.
pub(crate) fn poisoned_exit(journal: &Journal) -> Option<Exit> {
    journal.poison_reason().map(|reason| {
        Exit::runtime(anyhow::anyhow!(
            "the journal {} was poisoned ({reason}), so rm-agent stopped taking deliveries, answered those in flight and exited; start it again (systemd's Restart=on-failure does) and SQLite recovers the journal from its WAL; if it happens again, check the disk (dmesg, SMART)",
            journal.path().display()
        ))
    })
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled, so a signal that arrives while the agent is still starting is
/// not lost (and does not kill the agent with the default action). Call it inside the runtime.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = term.recv() => {}
                }
            }
            (term, interrupt) => {
                let err = term.err().or(interrupt.err());
                tracing::warn!(error = ?err, "cannot watch SIGTERM/SIGINT; stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        tracing::info!("signal received; answering the requests in flight, then stopping");
    }
}
