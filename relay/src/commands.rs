//! The commands: `serve` (the relay itself) and `channel add|token|revoke`, which write the same
//! file and work while `serve` runs. Each maps its failure to CONTRACT §1's exit codes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rusqlite::Connection;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;

use crate::ids;
use crate::limits::IngestLimits;
use crate::retention::{PRUNE_INTERVAL, PRUNE_STEP_ROWS, prune_step};
use crate::state::Relay;
use crate::store::{self, DB_FILE, NewChannel, Store, StoreError};
use rm_base::exit::Exit;
use rm_base::outln;

/// What `serve` was given.
pub struct ServeArgs {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub public_url: Option<String>,
    pub retention: Duration,
    pub limits: IngestLimits,
}

/// Checks a public URL (`http(s)://host[:port][/prefix]`, no query) and drops a trailing `/`.
pub fn normalize_public_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|err| format!("--public-url {url:?} is not a URL: {err}"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.authority().is_none() || uri.query().is_some() {
        return Err(format!(
            "--public-url {url:?} must be an http:// or https:// URL with a host and no query, e.g. https://relay.example.net"
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

fn store_exit(err: StoreError) -> Exit {
    match err {
        StoreError::Dir { .. } => Exit::usage(format!("{err}; check --data-dir")),
        StoreError::Locked { .. } => Exit::conflict(err.to_string()),
        other => Exit::runtime(other),
    }
}

/// Runs the relay until SIGINT or SIGTERM.
pub async fn serve(args: ServeArgs) -> Result<(), Exit> {
    let public_url = args
        .public_url
        .as_deref()
        .map(normalize_public_url)
        .transpose()
        .map_err(Exit::usage)?;
    // Held until `serve` returns (and by the kernel until the process is gone).
    let _lock = store::lock_instance(&args.data_dir).map_err(store_exit)?;
    let store = Store::open(&args.data_dir).map_err(store_exit)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))
        .map_err(Exit::runtime)?;
    let addr = listener
        .local_addr()
        .context("cannot read the listening address")
        .map_err(Exit::runtime)?;
    let public_url = public_url.unwrap_or_else(|| format!("http://{addr}"));
    remember_public_url(&store, &public_url).await;
    if public_url.contains("://0.0.0.0") || public_url.contains("://[::]") {
        tracing::warn!(%public_url, "no --public-url: the URLs `channel add` prints will not be reachable");
    }
    tracing::info!(
        %addr,
        %public_url,
        db = %store.path().display(),
        retention = %humantime::format_duration(args.retention),
        channel_quota_bytes = args.limits.channel_quota,
        ingest_rate = args.limits.ingest_rate,
        "listening"
    );
    let relay = Relay::new(store.clone(), args.limits);
    let pruning = tokio::spawn(prune_loop(
        store,
        args.retention,
        relay.shutdown.subscribe(),
    ));
    relay.serve(listener, shutdown_signal()).await;
    pruning.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Stores the public URL for `channel add` when it changed. A failure is a warning, not a
/// reason not to serve: on a full disk the relay must still start and stream what it has (and
/// take deliveries again once space returns), and the URL only saves `channel add` a flag.
async fn remember_public_url(store: &Store, public_url: &str) {
    let url = public_url.to_owned();
    let result = store
        .write(move |conn| {
            if store::public_url(conn)?.as_deref() == Some(url.as_str()) {
                return Ok(());
            }
            store::set_public_url(conn, &url)
        })
        .await;
    if let Err(err) = result {
        tracing::warn!(error = %err, "cannot store the public URL; `channel add` needs --public-url until a later start stores it");
    }
}

/// Removes expired deliveries now and every [`PRUNE_INTERVAL`], a bounded step at a time.
async fn prune_loop(
    store: Store,
    retention: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        loop {
            match store
                .write(move |conn| prune_step(conn, rm_vocab::now(), retention))
                .await
            {
                Ok(removed) => {
                    if removed > 0 {
                        tracing::info!(removed, "pruned deliveries past the retention");
                    }
                    if i64::try_from(removed).unwrap_or(i64::MAX) < PRUNE_STEP_ROWS {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "pruning failed; retrying at the next pass");
                    break;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PRUNE_INTERVAL) => {}
            _ = shutdown.wait_for(|stopping| *stopping) => return,
        }
    }
}

/// Resolves on SIGINT or SIGTERM (Ctrl-C elsewhere).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => {
                tracing::warn!("cannot install signal handlers; stop the relay with SIGKILL");
                std::future::pending::<()>().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The URLs of a new channel.
#[derive(serde::Serialize)]
pub struct ChannelUrls {
    pub ingest_url: String,
    pub subscribe_url: String,
    pub smee_url: String,
}

fn check_name(name: &str) -> Result<(), Exit> {
    if ids::is_valid_channel_name(name) {
        Ok(())
    } else {
        Err(Exit::usage(format!(
            "channel name {name:?} is not valid: use 1 to 64 of A-Z a-z 0-9 _ -"
        )))
    }
}

fn check_host(host: &str) -> Result<(), Exit> {
    if ids::is_valid_host_name(host) {
        Ok(())
    } else {
        Err(Exit::usage(format!(
            "host name {host:?} is not valid: use 1 to 253 of A-Z a-z 0-9 _ - ."
        )))
    }
}

/// Opens the database of an existing relay (token and revoke never create one).
fn open_existing(data_dir: &Path) -> Result<Connection, Exit> {
    let path = data_dir.join(DB_FILE);
    if !path.exists() {
        return Err(Exit::usage(format!(
            "no relay database at {}: check --data-dir, or create a channel first with `rm-relay channel add`",
            path.display()
        )));
    }
    store::open(data_dir).map_err(store_exit)
}

/// `channel add`: a new channel with fresh ingest and smee ids. A name already taken is a
/// usage error (exit 2) and changes nothing.
pub fn channel_add(
    name: &str,
    data_dir: &Path,
    public_url: Option<&str>,
    json: bool,
) -> Result<(), Exit> {
    check_name(name)?;
    let given = public_url
        .map(normalize_public_url)
        .transpose()
        .map_err(Exit::usage)?;
    let conn = store::open(data_dir).map_err(store_exit)?;
    let public = match given {
        Some(url) => url,
        None => store::public_url(&conn).map_err(Exit::runtime)?.ok_or_else(|| {
            Exit::usage(
                "no public URL is known yet: pass --public-url https://relay.example.net, or start `rm-relay serve` once with this --data-dir",
            )
        })?,
    };
    let ingest_id = ids::new_channel_id().map_err(Exit::runtime)?;
    let smee_id = ids::new_channel_id().map_err(Exit::runtime)?;
    let added = store::add_channel(
        &conn,
        &NewChannel {
            name,
            ingest_id: &ingest_id,
            smee_id: &smee_id,
            created_at_ms: rm_vocab::now(),
        },
    )
    .map_err(Exit::runtime)?;
    if !added {
        return Err(Exit::usage(format!(
            "channel {name} already exists: pick another name, or issue a token for it with `rm-relay channel token {name} HOST`"
        )));
    }
    let urls = ChannelUrls {
        ingest_url: format!("{public}/hooks/{ingest_id}"),
        subscribe_url: format!("{public}/subscribe/{name}"),
        smee_url: format!("{public}/smee/{smee_id}"),
    };
    if json {
        outln!("{}", serde_json::to_string(&urls).map_err(Exit::runtime)?);
    } else {
        outln!("ingest_url:    {}", urls.ingest_url);
        outln!("subscribe_url: {}", urls.subscribe_url);
        outln!("smee_url:      {}", urls.smee_url);
        eprintln!("Set ingest_url as the GitHub App's webhook URL; keep it and smee_url secret.");
    }
    Ok(())
}

/// `channel token`: a new token for `host`, replacing the host's previous one. The token is
/// printed once and only its digest is stored.
pub fn channel_token(name: &str, host: &str, data_dir: &Path, json: bool) -> Result<(), Exit> {
    check_name(name)?;
    check_host(host)?;
    let mut conn = open_existing(data_dir)?;
    let token = ids::new_token().map_err(Exit::runtime)?;
    let issued = store::issue_token(
        &mut conn,
        name,
        host,
        &ids::token_digest(&token),
        rm_vocab::now(),
    )
    .map_err(Exit::runtime)?;
    if !issued {
        return Err(Exit::usage(format!(
            "no channel {name}: create it with `rm-relay channel add {name}`"
        )));
    }
    if json {
        let doc = serde_json::json!({ "token": token.expose_secret() });
        outln!("{doc}");
    } else {
        outln!("{}", token.expose_secret());
        eprintln!(
            "This token is shown once: put it in the host's relay token file (RM_RELAY_TOKEN)."
        );
    }
    Ok(())
}

/// `channel revoke`: deletes the host's token; open streams with it close within seconds.
pub fn channel_revoke(name: &str, host: &str, data_dir: &Path) -> Result<(), Exit> {
    check_name(name)?;
    check_host(host)?;
    let conn = open_existing(data_dir)?;
    if !store::revoke_token(&conn, name, host).map_err(Exit::runtime)? {
        return Err(Exit::usage(format!(
            "host {host} has no token on channel {name}: nothing to revoke"
        )));
    }
    eprintln!("Revoked; open streams with that token close within seconds.");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls_are_http_or_https_with_a_host() {
        assert_eq!(
            normalize_public_url("https://relay.example.net/").unwrap(),
            "https://relay.example.net"
        );
        assert_eq!(
            normalize_public_url("http://10.0.0.1:8080").unwrap(),
            "http://10.0.0.1:8080"
        );
        assert_eq!(
            normalize_public_url("https://example.net/relay").unwrap(),
            "https://example.net/relay"
        );
        for bad in [
            "relay.example.net",
            "ftp://x",
            "https://x/?a=1",
            "/hooks",
            "",
        ] {
            assert!(normalize_public_url(bad).is_err(), "{bad}");
        }
    }
}
