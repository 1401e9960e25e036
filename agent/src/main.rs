//! `rm-agent`: the host agent's command line (CONTRACT §3). Parses arguments, loads the
//! configuration, runs one command and maps its result to CONTRACT §1's exit codes, printing any
//! failure as one sentence on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rm_base::log::{LogFormat, init as init_logging};

use rm_agent::exit::Exit;
use rm_agent::{commands, config};

/// How many rows the listing commands show unless told otherwise.
const DEFAULT_LIMIT: usize = 100;

#[derive(Parser)]
#[command(
    name = "rm-agent",
    version = rm_agent::features::version(),
    about = "rm's host agent: ephemeral, just-in-time GitHub Actions runners driven by webhooks",
    after_help = "Examples:\n  rm-agent demo\n  rm-agent --config /etc/rm-agent/rm-agent.toml receive\n  rm-agent --data-dir /var/lib/rm-agent jobs --json\n  rm-agent deliveries replay 72d3162e-cc78-11e3-81ab-4c9367dc0958"
)]
struct Cli {
    /// The configuration file (TOML). Default: ./rm-agent.toml when it exists.
    #[arg(long, global = true, env = "RM_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// The data directory (journal, runner roots); wins over the file's `data_dir`.
    #[arg(long, global = true, env = "RM_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run everything configured: the receiver, and runners for the queued jobs. SIGINT or
    /// SIGTERM drains: no new runner, no busy runner killed, exit within 60 seconds.
    #[command(
        after_help = "Example:\n  RM_WEBHOOK_SECRET=... RM_GITHUB_PRIVATE_KEY=\"$(cat app.pem)\" rm-agent --config /etc/rm-agent/rm-agent.toml run"
    )]
    Run {
        /// Log lines as text for people or JSON for log collectors.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Run the webhook receiver alone: verify each delivery, journal it, answer.
    #[command(
        after_help = "Example:\n  RM_WEBHOOK_SECRET=... rm-agent --config rm-agent.toml receive --log-format json"
    )]
    Receive {
        /// Log lines as text for people or JSON for log collectors.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Check that this host is ready to run: the configuration, the secrets, then GitHub (the
    /// App's JWT, each policy's installation, the permission runner registration needs, the
    /// runner group). Each finding comes with its remedy; exits 1 when one blocks running.
    #[command(
        after_help = "Examples:\n  rm-agent --config /etc/rm-agent/rm-agent.toml check\n  rm-agent check --json | jq '.findings[] | select(.status != \"ok\")'"
    )]
    Check {
        /// One JSON document on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show the host at a glance: webhook health, the polling pace and next poll, the rate-limit
    /// budget, queued jobs per policy, runners by state, the last GitHub contact, and anything
    /// degraded with what to do about it. Says so when no agent is running.
    #[command(
        after_help = "Examples:\n  rm-agent --config /etc/rm-agent/rm-agent.toml status\n  rm-agent status --json | jq '.github.rate_limit.remaining'"
    )]
    Status {
        /// One JSON document on stdout instead of a report.
        #[arg(long)]
        json: bool,
    },
    /// Say why a job is where it is: the decision chain the agent applies (its policy, the
    /// ceilings and who holds them, launch back-off, rate limit, GitHub, the host's fitness, the
    /// runner it waits for). Works with the agent stopped; exits 1 when the journal has no such job.
    #[command(
        after_help = "Examples:\n  rm-agent explain 123456789\n  rm-agent explain 123456789 --json | jq -r .verdict"
    )]
    Explain {
        /// The job's id (`workflow_job.id`: the number its URL ends in).
        job_id: i64,
        /// One JSON document on stdout instead of a report.
        #[arg(long)]
        json: bool,
    },
    /// Show what the runners of a job asked for and reached under `policy.egress`: each name and
    /// connection with its verdict (allowed, denied, would_deny) and count. With `--policy`
    /// instead of a job: propose an `allow` list from what that policy's jobs really used.
    #[command(
        after_help = "Examples:\n  rm-agent egress 123456789\n  rm-agent egress --policy build --since 7d"
    )]
    Egress {
        /// The job's id (`workflow_job.id`).
        #[arg(required_unless_present = "policy", conflicts_with = "policy")]
        job_id: Option<i64>,
        /// Propose an allow list from this policy's runners.
        #[arg(long)]
        policy: Option<String>,
        /// With `--policy`: the runners started this long ago or later (e.g. `7d`, `12h`).
        #[arg(long, requires = "policy", value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
        /// One JSON document on stdout instead of a report.
        #[arg(long)]
        json: bool,
    },
    /// Right-size a policy's shapes: per job name and shape, what its runners asked for (CPUs,
    /// memory, disk) against what they used (peak memory, average CPUs; max and p50 over the
    /// runs), with a hint: oversized, undersized, fits or unmeasured. Reads this host's journal.
    #[command(
        after_help = "Examples:\n  rm-agent shapes --policy build\n  rm-agent shapes --policy build --since 30d --json | jq '.rows[] | select(.hint != \"fits\")'"
    )]
    Shapes {
        /// The policy whose runs to report.
        #[arg(long)]
        policy: String,
        /// The runners started this long ago or later (e.g. `7d`, `12h`). Default: 7d.
        #[arg(long, value_parser = humantime::parse_duration)]
        since: Option<std::time::Duration>,
        /// One JSON document on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the journalled workflow jobs and their states, most recently changed first.
    #[command(
        after_help = "Example:\n  rm-agent jobs --json | jq '.[] | select(.state == \"queued\")'"
    )]
    Jobs {
        /// One JSON document on stdout instead of a table.
        #[arg(long)]
        json: bool,
        /// Show at most this many jobs.
        #[arg(long, default_value_t = DEFAULT_LIMIT)]
        limit: usize,
    },
    /// List the runner attempts of this host and their states, newest first.
    #[command(
        after_help = "Example:\n  rm-agent runners --json | jq '.[] | select(.state == \"busy\")'"
    )]
    Runners {
        /// One JSON document on stdout instead of a table.
        #[arg(long)]
        json: bool,
        /// Show at most this many attempts.
        #[arg(long, default_value_t = DEFAULT_LIMIT)]
        limit: usize,
    },
    /// Print the logs a job's runner left: its `_diag` files and its stdout/stderr
    /// (`rm-output.log`), kept after cleanup under <data_dir>/logs, or read live from its
    /// runtime while it runs; scrubbed of secrets. Works with the agent stopped; exits 1 when no
    /// attempt of this host ran the job or runner.
    #[command(
        after_help = "Examples:\n  rm-agent logs 123456789\n  rm-agent logs rm-builder-01-0123456789ab --follow"
    )]
    Logs {
        /// A job id (`workflow_job.id`), a runner name (`rm-<host>-<12 hex>`) or an attempt id.
        target: String,
        /// Keep printing what a live runner writes until its attempt is cleaned up, then the
        /// rest from the kept copy.
        #[arg(long)]
        follow: bool,
    },
    /// List the journalled webhook deliveries, newest first; or replay one.
    #[command(
        after_help = "Examples:\n  rm-agent deliveries --json\n  rm-agent deliveries replay 72d3162e-cc78-11e3-81ab-4c9367dc0958"
    )]
    Deliveries {
        /// One JSON document on stdout instead of a table.
        #[arg(long, global = true)]
        json: bool,
        /// Show at most this many deliveries.
        #[arg(long, default_value_t = DEFAULT_LIMIT)]
        limit: usize,
        #[command(subcommand)]
        action: Option<DeliveriesAction>,
    },
    /// Play the whole flow on this machine with no GitHub account and no network: a simulated
    /// GitHub and fake runners drive the real receiver, journal and agent through single jobs,
    /// a matrix, a lost webhook and a runner that never gets a job. Prints a timeline and a
    /// summary; exits 0 only if every part ended as expected. Ignores --config and --data-dir.
    #[command(after_help = "Examples:\n  rm-agent demo\n  rm-agent demo --keep")]
    Demo {
        /// Keep the demo's temporary directory (configuration, journal, runner root) and print
        /// its path.
        #[arg(long)]
        keep: bool,
    },
}

impl Command {
    /// The command's name as typed (`commands::refuse_on_shared_journal` decides by it).
    fn name(&self) -> &'static str {
        match self {
            Command::Run { .. } => "run",
            Command::Receive { .. } => "receive",
            Command::Check { .. } => "check",
            Command::Status { .. } => "status",
            Command::Explain { .. } => "explain",
            Command::Egress { .. } => "egress",
            Command::Shapes { .. } => "shapes",
            Command::Jobs { .. } => "jobs",
            Command::Runners { .. } => "runners",
            Command::Logs { .. } => "logs",
            Command::Deliveries {
                action: Some(DeliveriesAction::Replay { .. }),
                ..
            } => "deliveries replay",
            Command::Deliveries { .. } => "deliveries",
            Command::Demo { .. } => "demo",
        }
    }
}

#[derive(Subcommand)]
enum DeliveriesAction {
    /// Run a journalled delivery's handler again and apply what it says (changes only move
    /// forward, so a replay of an applied delivery changes nothing).
    Replay {
        /// The delivery's GUID (its X-GitHub-Delivery header).
        guid: String,
    },
}

/// `pub(crate)`: `src/bin/rm-agent-e2e.rs` (the test build's binary) runs this same `main`.
pub(crate) fn main() -> ExitCode {
    // Started as `<package>/bin/Runner.Listener` by `rm-agent demo` (a build with the `demo`
    // feature only), this binary is the fake runner, not the agent.
    if let Some(code) = commands::fake_runner_mode() {
        return code;
    }
    // Before anything else: no runner (of any uid) may read this process's memory or
    // environment, and what it creates is private to it.
    if let Err(e) = rm_runner::isolate::harden_agent() {
        eprintln!("rm-agent: cannot make this process undumpable: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse();
    let result = run(cli).and_then(|()| match rm_agent::output::stdout_error() {
        Some(error) => Err(Exit::runtime(anyhow::anyhow!(error))),
        None => Ok(()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => {
            eprintln!("rm-agent: {exit}");
            ExitCode::from(exit.code)
        }
    }
}

fn run(cli: Cli) -> Result<(), Exit> {
    // The demo writes its own configuration: no file of the operator's is read.
    if let Command::Demo { keep } = cli.command {
        return demo(keep);
    }
    let sources = config::Sources {
        explicit_file: cli.config,
        data_dir: cli.data_dir,
    };
    let config = config::load(&sources)?;
    commands::refuse_on_shared_journal(cli.command.name(), &config)?;
    match cli.command {
        Command::Run { log_format } => {
            init_logging(log_format, "info");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(Exit::runtime)?;
            runtime.block_on(commands::run_agent(&config))
        }
        Command::Receive { log_format } => {
            init_logging(log_format, "info");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(Exit::runtime)?;
            runtime.block_on(commands::receive(&config))
        }
        Command::Check { json } => {
            init_logging(LogFormat::Text, "warn");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(Exit::runtime)?;
            runtime.block_on(commands::check(&config, json))
        }
        Command::Status { json } => {
            init_logging(LogFormat::Text, "warn");
            commands::status(&config, json)
        }
        Command::Explain { job_id, json } => {
            init_logging(LogFormat::Text, "warn");
            commands::explain(&config, rm_vocab::JobId::new(job_id), json)
        }
        Command::Egress {
            job_id,
            policy,
            since,
            json,
        } => {
            init_logging(LogFormat::Text, "warn");
            match (job_id, policy) {
                (_, Some(policy)) => commands::egress_policy(
                    &config,
                    &policy,
                    since.unwrap_or(commands::EGRESS_DEFAULT_SINCE),
                    json,
                ),
                (Some(job_id), None) => {
                    commands::egress_job(&config, rm_vocab::JobId::new(job_id), json)
                }
                (None, None) => Err(Exit::usage("name a job, or --policy".to_owned())),
            }
        }
        Command::Shapes {
            policy,
            since,
            json,
        } => {
            init_logging(LogFormat::Text, "warn");
            commands::shapes(
                &config,
                &policy,
                since.unwrap_or(commands::SHAPES_DEFAULT_SINCE),
                json,
            )
        }
        Command::Jobs { json, limit } => {
            init_logging(LogFormat::Text, "warn");
            commands::jobs(&config, json, limit)
        }
        Command::Runners { json, limit } => {
            init_logging(LogFormat::Text, "warn");
            commands::runners(&config, json, limit)
        }
        Command::Logs { target, follow } => {
            init_logging(LogFormat::Text, "warn");
            commands::logs(&config, &target, follow)
        }
        Command::Deliveries {
            json,
            limit,
            action,
        } => {
            init_logging(LogFormat::Text, "warn");
            match action {
                None => commands::deliveries_list(&config, json, limit),
                Some(DeliveriesAction::Replay { guid }) => {
                    commands::deliveries_replay(&config, &guid, json)
                }
            }
        }
        Command::Demo { keep } => demo(keep),
    }
}

fn demo(keep: bool) -> Result<(), Exit> {
    init_logging(LogFormat::Text, "warn");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Exit::runtime)?;
    runtime.block_on(commands::demo(keep))
}
