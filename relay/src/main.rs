//! `rm-relay`: the relay's command line (CONTRACT §6). Parses arguments, runs one command and
//! maps its result to CONTRACT §1's exit codes, printing any failure as one sentence on stderr.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rm_base::exit::Exit;
use rm_base::log::LogFormat;

use rm_relay::commands::{self, ServeArgs};
use rm_relay::limits::{DEFAULT_INGEST_RATE, IngestLimits, parse_body_pool, parse_quota};
use rm_relay::retention::parse_retention;

#[derive(Parser)]
#[command(
    name = "rm-relay",
    version,
    about = "rm's relay for runner hosts behind NAT: takes GitHub webhooks on a public address, keeps them durably and streams them to authenticated hosts, with replay",
    after_help = "Examples:\n  rm-relay serve --listen 0.0.0.0:8080 --data-dir /var/lib/rm-relay --public-url https://relay.example.net\n  rm-relay channel add acme --data-dir /var/lib/rm-relay\n  rm-relay channel token acme builder-01 --data-dir /var/lib/rm-relay"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay: ingest on /hooks/ID, streams on /subscribe/NAME and /smee/ID, /healthz
    /// and /metrics. SIGINT or SIGTERM: stop accepting, finish ingests, close streams, exit 0.
    Serve {
        /// The address to listen on (plain HTTP; put TLS in front).
        #[arg(long, value_name = "ADDR")]
        listen: SocketAddr,
        /// The directory of relay.db (created if needed).
        #[arg(long, env = "RM_RELAY_DATA_DIR", value_name = "DIR")]
        data_dir: PathBuf,
        /// The URL GitHub and hosts reach the relay at; `channel add` prints URLs under it.
        /// Default: http://<listen address>.
        #[arg(long, value_name = "URL")]
        public_url: Option<String>,
        /// How long deliveries are kept for hosts that are away (at least 1m).
        #[arg(long, value_name = "DURATION", default_value = "72h", value_parser = parse_retention)]
        retention: Duration,
        /// Bytes of delivery bodies and headers one channel may keep (at least 26MiB). When a
        /// new delivery does not fit, the oldest deliveries every host has acknowledged are
        /// dropped; if that is not enough it is refused with 503 and Retry-After.
        #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_quota)]
        channel_quota: u64,
        /// Deliveries per second one channel may send over time, with bursts of 10 seconds'
        /// worth; more are refused with 429 and Retry-After. 0: no limit.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_INGEST_RATE)]
        ingest_rate: u32,
        /// Bytes ingest bodies share past the 64 KiB each may hold, while they stream in and
        /// until they are stored: with 1024 connections, bodies never hold more than 64 MiB plus
        /// this. An upload the pool cannot grow is refused with 503 and Retry-After.
        #[arg(long, value_name = "SIZE", default_value = "192MiB", value_parser = parse_body_pool)]
        body_pool: usize,
        /// Log lines as text for people or JSON for log collectors.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Manage channels: one per GitHub App (webhook URL), with a token per host.
    Channel {
        #[command(subcommand)]
        action: ChannelAction,
    },
}

#[derive(Subcommand)]
enum ChannelAction {
    /// Create a channel and print its ingest URL (the App's webhook URL), its subscribe URL
    /// (for rm-agent) and its smee URL (for smee-client). Exit 2 if the name is taken.
    Add {
        /// The channel's name: 1 to 64 of A-Z a-z 0-9 _ -.
        name: String,
        #[arg(long, env = "RM_RELAY_DATA_DIR", value_name = "DIR")]
        data_dir: PathBuf,
        /// The URL to print under; default: the one `serve` last stored.
        #[arg(long, value_name = "URL")]
        public_url: Option<String>,
        /// One JSON document {"ingest_url","subscribe_url","smee_url"} on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Issue a subscriber token for one host (replacing its previous one) and print it once.
    Token {
        name: String,
        /// The host the token is for, e.g. builder-01.
        host: String,
        #[arg(long, env = "RM_RELAY_DATA_DIR", value_name = "DIR")]
        data_dir: PathBuf,
        /// One JSON document {"token"} on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a host's token; its open streams close within seconds.
    Revoke {
        name: String,
        host: String,
        #[arg(long, env = "RM_RELAY_DATA_DIR", value_name = "DIR")]
        data_dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Output a reader cut short (`| head`) is not a failure; any other write error is.
    let result = run(cli).and_then(|()| match rm_base::output::stdout_error() {
        Some(err) => Err(Exit::runtime(anyhow::anyhow!(err))),
        None => Ok(()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => {
            eprintln!("rm-relay: {exit}");
            ExitCode::from(exit.code)
        }
    }
}

fn run(cli: Cli) -> Result<(), Exit> {
    match cli.command {
        Command::Serve {
            listen,
            data_dir,
            public_url,
            retention,
            channel_quota,
            ingest_rate,
            body_pool,
            log_format,
        } => {
            rm_base::log::init(log_format, "info");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(Exit::runtime)?;
            runtime.block_on(commands::serve(ServeArgs {
                listen,
                data_dir,
                public_url,
                retention,
                limits: IngestLimits {
                    channel_quota,
                    ingest_rate,
                    bodies: rm_http_serve::budget::BodyLimits {
                        pool: body_pool,
                        ..rm_http_serve::budget::BodyLimits::default()
                    },
                    ..IngestLimits::default()
                },
            }))
        }
        Command::Channel { action } => {
            rm_base::log::init(LogFormat::Text, "warn");
            match action {
                ChannelAction::Add {
                    name,
                    data_dir,
                    public_url,
                    json,
                } => commands::channel_add(&name, &data_dir, public_url.as_deref(), json),
                ChannelAction::Token {
                    name,
                    host,
                    data_dir,
                    json,
                } => commands::channel_token(&name, &host, &data_dir, json),
                ChannelAction::Revoke {
                    name,
                    host,
                    data_dir,
                } => commands::channel_revoke(&name, &host, &data_dir),
            }
        }
    }
}
