//! `rm-agent receive`: the webhook receiver alone. Verifies, journals, answers; stops on SIGINT
//! or SIGTERM after answering the requests in flight.

use anyhow::Context;
use rm_journal::Journal;
use rm_receiver::{MAX_BODY_BYTES, Receiver, ReceiverConfig};

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
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let journal_path = super::journal_path(config);
    let journal = Journal::open(&journal_path, config.retention)
        .with_context(|| format!("cannot open the journal in {}", config.data_dir.display()))
        .map_err(Exit::runtime)?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {} (receiver.listen)", settings.listen))
        .map_err(Exit::runtime)?;
    let local = listener.local_addr().map_err(Exit::runtime)?;
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

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled, so a signal that arrives while the agent is still starting is
/// not lost (and does not kill the agent with the default action). Call it inside the runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
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
