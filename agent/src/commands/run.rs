//! `rm-agent run`: everything configured in one process: the receiver (when `[receiver]` is
//! set) journalling deliveries, and the executor turning queued jobs into runners. SIGINT or
//! SIGTERM drains (CONTRACT §3): the receiver answers what is in flight, no new runner starts,
//! no busy runner is killed, and the agent exits within 60 seconds; runners still alive are
//! adopted at the next start. A poisoned journal drains the same way and then exits 1.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rm_github::{ClientConfig, GithubClient};
use rm_journal::{Journal, Store};
use rm_receiver::{MAX_BODY_BYTES, Receiver, ReceiverConfig};
use rm_vocab::SystemClock;
use tokio::sync::watch;

use crate::config::{Config, display_file};
use crate::executor::registry::Registry;
use crate::executor::{DrainReport, Executor, FleetSettings, Handle, Settings};
use crate::exit::Exit;
use crate::lifecycle::Timeouts;
use crate::notify::{Notifier, OperatorEvent};
use crate::polling::{Pacing, Poller, PollerConfig, PollerStatus};
use crate::relay::Subscription;
use crate::{lock, secrets};

pub async fn run(config: &Config) -> Result<(), Exit> {
    let app_id = config.github.app_id.ok_or_else(|| {
        usage(
            config,
            "github.app_id",
            "`rm-agent run` needs the GitHub App's id (its settings page shows it)",
        )
    })?;
    let client = GithubClient::new(client_config(config, app_id)?)
        .context("cannot set up the GitHub client")
        .map_err(Exit::runtime)?;
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let report = serve(config, client, super::receive::shutdown_signal()).await?;
    tracing::info!(
        left_running = report.left_running,
        launches_unfinished = report.launches_unfinished,
        "drained; runners still alive are adopted at the next start"
    );
    Ok(())
}

/// The GitHub client's configuration: the primary App (`app_id`) with its key, every further
/// `[[github.app]]` with its own, the API and the pacing. Keys are read (and refused when
/// missing, empty or readable by others) here, once.
pub(crate) fn client_config(config: &Config, app_id: u64) -> Result<ClientConfig, Exit> {
    Ok(ClientConfig {
        pacing: config.github.pacing,
        more_apps: secrets::more_app_keys(config)?,
        ..ClientConfig::new(
            config.github.api_url.clone(),
            app_id,
            secrets::private_key(config)?,
        )
    })
}

/// Runs everything `config` asks for with this GitHub client until `shutdown` completes, then
/// drains. The caller holds the data-directory lock. `rm-agent demo` runs the same with a
/// simulated GitHub.
pub(crate) async fn serve(
    config: &Config,
    client: GithubClient,
    shutdown: impl Future<Output = ()>,
) -> Result<DrainReport, Exit> {
    serve_paced(config, client, Pacing::default(), shutdown).await
}

/// How long the drain waits for `run`'s other tasks (receiver, relay, poller, follower, ...) to
/// end after the control loop has drained; they were told to stop when the drain began. With
/// the loop's own drain it keeps the exit within CONTRACT §3's 60 seconds.
const TASKS_JOIN: Duration = Duration::from_secs(5);

/// [`serve`] with the poller's slow cadences given (the demo's are seconds, not minutes).
pub(crate) async fn serve_paced(
    config: &Config,
    client: GithubClient,
    pacing: Pacing,
    shutdown: impl Future<Output = ()>,
) -> Result<DrainReport, Exit> {
    let (settings, version) = settings(config, &client).await?;
    let host_network = settings
        .backends
        .user
        .as_ref()
        .and_then(|u| u.network.clone());
    let follower = crate::package::follower(
        config,
        &client,
        &settings.backends.none,
        settings.backends.user.as_ref(),
        &version,
    )
    .map(|follower| match &settings.images {
        // A release no policy's image can run is not adopted (crate::image::admission).
        Some(images) => follower.admitting(crate::image::admission(Arc::clone(images))),
        None => follower,
    });
    let webhook_secrets = match &config.receiver {
        Some(_) => Some(secrets::webhook_secrets(config)?),
        None => None,
    };
    let store = super::store(config);
    let journal_path = store.file().to_owned();
    let journal = Journal::open(&journal_path, config.retention)
        .with_context(|| format!("cannot open the journal in {}", config.data_dir.display()))
        .map_err(Exit::runtime)?;
    let notifier = Arc::new(crate::notify::from_config(config)?);
    let mut executor = Executor::open(
        settings,
        &store,
        &config.host.runner_root,
        Registry::new(client.clone()),
        Arc::clone(&notifier),
    )
    .map_err(Exit::runtime)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Tasks::default();
    let board = Arc::clone(&executor.settings().scale_sets);
    executor.wake_on(board.subscribe());
    spawn_scale_set_listeners(
        config,
        &board,
        &journal_path,
        &notifier,
        &stop_rx,
        &mut tasks,
    );
    // The fitness gate (crate::fitness): judged once before the first registration, then again
    // in the background; allocation registers nothing while it says unfit.
    let fitness = executor.settings().fitness.clone();
    let handle = executor.handle();
    let mut fitness_prober = crate::fitness::Prober::host(crate::fitness::Requirements::of(
        config,
        crate::fitness::probe::runner_path(),
    ));
    crate::fitness::check_once(&mut fitness_prober, &fitness, &notifier).await;
    tasks.until_aborted(
        "fitness checker",
        crate::fitness::spawn(fitness_prober, fitness.clone(), Arc::clone(&notifier)),
    );
    executor.wake_on(fitness.fit_again());
    // For `rm-agent status` and `/metrics`: what only the running agent knows.
    let published = client.clone();
    // Checked before anything starts, so a missing token is a usage error at start.
    let relay = match &config.relay {
        Some(relay) => Some(
            Subscription::new(
                &relay.url,
                secrets::relay_token(config)?,
                Arc::new(secrets::webhook_secrets(config)?),
                journal.clone(),
            )
            .map_err(Exit::runtime)?,
        ),
        None => None,
    };
    // The host-local cache (`[cache]`, `policy.cache`): listening before any runner starts.
    let cache = match crate::cache::wanted(config) {
        Some(cache) => {
            let uids = executor
                .settings()
                .backends
                .user
                .as_ref()
                .map(|user| user.pool.accounts().iter().map(|a| a.uid).collect())
                .unwrap_or_default();
            let jobs = store
                .jobs()
                .context("cannot read the journal's jobs for the cache")
                .map_err(Exit::runtime)?;
            let running = crate::cache::start(
                cache,
                uids,
                journal_path.clone(),
                jobs,
                client.clone(),
                stopped(stop_rx.clone()),
            )
            .await
            .map_err(Exit::runtime)?;
            tasks.ending_on_stop("cache service", tokio::spawn(running.serving));
            // Validated with the configuration: a bad entry never gets here.
            let actions = rm_cache::actions::parse_actions(&cache.actions)
                .map_err(|e| usage(config, "cache.actions", &e.to_string()))?;
            tasks.ending_on_stop(
                "action archives",
                tokio::spawn(crate::cache::actions::refresh_loop(
                    client.clone(),
                    cache.dir.join(rm_cache::actions::ACTIONS_DIR),
                    actions,
                    config.reading_target().cloned(),
                    stopped(stop_rx.clone()),
                )),
            );
            let board = crate::cache::report::Board::default();
            let package = executor
                .settings()
                .backends
                .user
                .as_ref()
                .and_then(|user| user.package.clone());
            tasks.until_aborted(
                "cache report",
                crate::cache::report::spawn(running.service, package, board.clone()),
            );
            Some(board)
        }
        None => None,
    };
    // The egress resolver (crate::egress): answering before any runner starts; what runners
    // asked for and reached written to the journal as they run.
    if let Some(egress) = executor.settings().egress.clone() {
        tasks.until_aborted("egress resolver", tokio::spawn(Arc::clone(&egress).serve()));
        tasks.ending_on_stop(
            "egress records",
            tokio::spawn(crate::egress::flush_loop(
                egress,
                store.clone(),
                stopped(stop_rx.clone()),
            )),
        );
    }
    // Each policy's `image_refresh` (crate::image): its tag resolved again, what no uncleaned
    // attempt uses any more removed.
    if let Some(images) = executor.settings().images.clone() {
        let linked = executor
            .settings()
            .backends
            .user
            .as_ref()
            .and_then(|user| user.package.clone());
        for policy in config
            .policies
            .iter()
            .filter(|p| p.image.as_ref().is_some_and(|i| i.refresh.is_some()))
        {
            let journal = store.clone();
            tasks.ending_on_stop(
                "image refresh",
                tokio::spawn(crate::image::refresh_loop(
                    Arc::clone(&images),
                    policy.clone(),
                    {
                        let linked = linked.clone();
                        move || {
                            linked
                                .as_ref()
                                .map(|linked| linked.current().tree().to_path_buf())
                        }
                    },
                    move || crate::image::in_use(&journal),
                    stopped(stop_rx.clone()),
                )),
            );
        }
    }
    let poller = open_poller(config, client, &store)
        .await?
        .with_pacing(pacing);
    executor.wake_on(journal.durable_groups());
    executor.wake_on(poller.changes());
    // These end when the poller does (their watch closes).
    tasks.ending_on_stop(
        "webhook health watch",
        tokio::spawn(watch_webhook_health(poller.status(), Arc::clone(&notifier))),
    );
    tasks.ending_on_stop(
        "status publisher",
        crate::status_file::spawn_publisher(
            config.data_dir.clone(),
            poller.status(),
            relay.as_ref().map(Subscription::state),
            published.clone(),
            config.host.max_runners,
            crate::status_file::Readers {
                allocation: Some({
                    let handle = handle.clone();
                    Arc::new(move || handle.published_memory())
                }),
                fitness: Some({
                    let fitness = fitness.clone();
                    Arc::new(move || fitness.current())
                }),
                cache: cache.clone(),
            },
        ),
    );
    tasks.ending_on_stop(
        "journal refresh notes",
        tokio::spawn(note_refreshes(poller.status(), handle.clone())),
    );
    let agent_metrics = crate::metrics::AgentMetrics::new(poller.status(), published);
    let executor_egress = executor.settings().egress.clone();
    let poller_status = poller.status();
    if let (Some(settings), Some(secrets)) = (&config.receiver, webhook_secrets) {
        let receiver = Receiver::new(
            ReceiverConfig {
                path: settings.path.clone(),
                secrets,
                max_body_bytes: MAX_BODY_BYTES,
            },
            journal.clone(),
        );
        receiver.add_collector(Box::new(agent_metrics));
        receiver.add_collector(Box::new(crate::scaleset::metrics::ScaleSetMetrics::new(
            Arc::clone(&board),
        )));
        if let Some(egress) = &executor_egress {
            receiver.add_collector(Box::new(egress.metrics()));
        }
        // Wait times since this start (CONTRACT §8): seeded before deliveries are taken.
        let waits = crate::latency::WaitMetrics::default();
        tasks.until_aborted(
            "wait-time recorder",
            crate::latency::spawn_recorder(&journal_path, waits.clone()).map_err(Exit::runtime)?,
        );
        receiver.add_collector(Box::new(waits));
        receiver.add_collector(Box::new(crate::fitness::report::FitnessMetrics::new(
            fitness.clone(),
        )));
        if let Some(board) = &cache {
            receiver.add_collector(Box::new(crate::cache::report::CacheMetrics::new(
                board.clone(),
            )));
        }
        if let Some(notifications) = notifier.metrics() {
            receiver.add_collector(Box::new(notifications));
        }
        let serving = listen(settings, receiver, stopped(stop_rx.clone())).await?;
        tasks.ending_on_stop("receiver", tokio::spawn(serving));
    } else {
        tracing::info!("no [receiver]: jobs are found by polling");
    }
    if let Some(subscription) = relay {
        tracing::info!(url = %subscription.url(), "subscribing to the relay");
        tasks.ending_on_stop(
            "relay subscription",
            tokio::spawn(subscription.run(stop_rx.clone())),
        );
    }
    tasks.ending_on_stop("poller", tokio::spawn(poller.run(stopped(stop_rx.clone()))));
    if let Some(follower) = follower {
        tasks.ending_on_stop(
            "runner release follower",
            tokio::spawn(follower.run(stopped(stop_rx.clone()))),
        );
    }
    // A poisoned journal drains like a signal (runners are left running, adopted at the next
    // start), and then the agent exits 1 for its service manager to restart it.
    let watched = journal.clone();
    let signal = async move {
        super::receive::until_stopped(shutdown, &watched).await;
        let _ = stop_tx.send(true);
    };
    let mut first_pass = poller_status;
    let synced = async move {
        let _ = first_pass.wait_for(|s| s.last_pass.at.is_some()).await;
    };
    let report = executor.run(synced, signal).await;
    // No runner of this agent is left: neither is its host table (a runner still running keeps
    // it, for the next start to replace).
    if report.left_running == 0
        && report.launches_unfinished == 0
        && let Some(network) = &host_network
        && let Err(e) = network.uninstall()
    {
        tracing::warn!(error = %e, table = %network.table, "cannot remove the runners' host table");
    }
    tasks.join(TASKS_JOIN).await;
    if let Some(exit) = super::receive::poisoned_exit(&journal) {
        tracing::info!(
            left_running = report.left_running,
            launches_unfinished = report.launches_unfinished,
            "drained; runners still alive are adopted at the next start"
        );
        return Err(exit);
    }
    Ok(report)
}

/// One source per `[[scale_set]]`, each with a client of its scope's Actions service: its
/// policy's target through the App's installation there, or its enterprise through the PAT
/// read (and refused when missing, empty or open to others: exit 2) here, once.
fn scale_set_board(config: &Config, client: &GithubClient) -> Result<crate::scaleset::Board, Exit> {
    use rm_github::scaleset::{Credential, ScaleSetClient};
    let mut sources = Vec::with_capacity(config.scale_sets.len());
    for (index, set) in config.scale_sets.iter().enumerate() {
        let policy = config
            .policies
            .iter()
            .find(|p| p.name == set.policy)
            .with_context(|| format!("scale set `{}`: no policy `{}`", set.name, set.policy))
            .map_err(Exit::runtime)?;
        let api = &config.github.api_url;
        let (credential, config_url) = match &set.enterprise {
            None => (
                Credential::App(policy.target.clone()),
                crate::scaleset::config_url(api, &policy.target),
            ),
            Some(enterprise) => (
                Credential::EnterprisePat {
                    slug: enterprise.slug.clone(),
                    token: secrets::enterprise_token(
                        &enterprise.token_file,
                        &format!("scale_set[{index}].token_file"),
                    )?,
                },
                crate::scaleset::enterprise_config_url(api, &enterprise.slug),
            ),
        };
        let scale_set_client =
            ScaleSetClient::with_credential(client.clone(), credential, config_url)
                .map_err(Exit::runtime)?;
        sources.push(Arc::new(crate::scaleset::Source::new(
            set.clone(),
            Arc::new(scale_set_client),
        )));
    }
    Ok(crate::scaleset::Board::new(sources))
}

/// Starts the listener of every scale set (they end when the agent stops, closing their
/// sessions).
fn spawn_scale_set_listeners(
    config: &Config,
    board: &Arc<crate::scaleset::Board>,
    journal: &std::path::Path,
    notifier: &Arc<Notifier>,
    stop: &watch::Receiver<bool>,
    tasks: &mut Tasks,
) {
    for source in board.sources() {
        // The capacity each poll sends is the allocation pass's (crate::scaleset::capacity).
        tracing::info!(scale_set = %source.set.name, policy = %source.set.policy, "listening to the scale set");
        tasks.ending_on_stop(
            "scale-set listener",
            tokio::spawn(crate::scaleset::listen::run(
                Arc::clone(source),
                Arc::clone(board),
                journal.to_owned(),
                config.host.name.clone(),
                Arc::clone(notifier),
                stop.clone(),
            )),
        );
    }
}

/// Completes once `stop` says the agent stops.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Binds the receiver's address (a taken port fails the start) and returns its serving, which
/// ends once `shutdown` completes and the deliveries in flight are answered.
async fn listen(
    settings: &crate::config::ReceiverSettings,
    receiver: Arc<Receiver>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = ()> + Send + 'static, Exit> {
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {} (receiver.listen)", settings.listen))
        .map_err(Exit::runtime)?;
    tracing::info!(listen = %listener.local_addr().map_err(Exit::runtime)?, path = %settings.path, "receiver listening");
    Ok(async move {
        if let Err(e) = receiver.serve(listener, shutdown).await {
            tracing::warn!(error = %e, "the receiver stopped with an error");
        }
    })
}

/// The poller: on this host's journal, or in a fleet on the shared one, where each target is
/// polled by the one host that leads it (crate::polling::election): one REST budget for the
/// fleet.
async fn open_poller(config: &Config, client: GithubClient, store: &Store) -> Result<Poller, Exit> {
    let poller_config = PollerConfig::from_config(config);
    let store = store.clone();
    let fleet = store.is_shared();
    let server = store.describe();
    // A shared journal's client blocks and runs a runtime of its own: connected off this one.
    let opened = tokio::task::spawn_blocking(move || {
        let polls = store.polls()?;
        // Alone, every target is this host's to poll: no election.
        let fleet = if fleet { Some(store.fleet()?) } else { None };
        Ok::<_, rm_journal::JournalError>((polls, fleet))
    })
    .await
    .map_err(Exit::runtime)?;
    let (polls, fleet) = opened.map_err(|e| {
        Exit::runtime(anyhow::Error::new(e).context(format!("cannot open {server}")))
    })?;
    let poller =
        Poller::new(poller_config, client, polls, Arc::new(SystemClock)).map_err(Exit::runtime)?;
    Ok(match fleet {
        Some(fleet) => poller.with_fleet(fleet, config.host.name.clone()),
        None => poller,
    })
}

/// `run`'s long-lived tasks beside the control loop, each named: joined when the loop has
/// drained, so none outlives the agent unseen and a task that failed is said by name.
#[derive(Default)]
struct Tasks {
    /// Tasks that end by themselves once the agent stops (told through the stop watch, or
    /// their input closing): waited for, up to [`TASKS_JOIN`].
    ending: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    /// Tasks that run until aborted (periodic checks): aborted, then joined.
    endless: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
}

impl Tasks {
    fn ending_on_stop(&mut self, name: &'static str, task: tokio::task::JoinHandle<()>) {
        self.ending.push((name, task));
    }

    fn until_aborted(&mut self, name: &'static str, task: tokio::task::JoinHandle<()>) {
        self.endless.push((name, task));
    }

    /// Aborts the endless tasks and waits (at most `within`) for every task to end; one that
    /// does not is aborted and named, one that failed is named.
    async fn join(self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        for (_, task) in &self.endless {
            task.abort();
        }
        for (name, mut task) in self.ending.into_iter().chain(self.endless) {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_cancelled() => {}
                Ok(Err(e)) => tracing::warn!(task = name, error = %e, "a task of the agent failed"),
                Err(_) => {
                    task.abort();
                    tracing::warn!(
                        task = name,
                        waited_s = within.as_secs(),
                        "a task of the agent did not end in time after the drain; stopped"
                    );
                }
            }
        }
    }
}

/// Tells the executor when a poll pass brought the journal up to date with GitHub; ends when
/// the poller does.
async fn note_refreshes(mut status: watch::Receiver<PollerStatus>, executor: Handle) {
    while status.changed().await.is_ok() {
        let pass = status.borrow().last_pass.clone();
        if pass.polled_demand
            && let Some(at) = pass.at
        {
            executor.journal_refreshed(rm_vocab::UnixMs::from_system_time(at));
        }
    }
}

/// Tells the operator when webhooks stop being trusted and polling takes over; ends when the
/// poller does.
async fn watch_webhook_health(mut status: watch::Receiver<PollerStatus>, notifier: Arc<Notifier>) {
    let mut trusted = status.borrow().webhooks.trusted;
    while status.changed().await.is_ok() {
        let (now_trusted, intake) = {
            let s = status.borrow();
            (s.webhooks.trusted, s.webhooks.intake)
        };
        if intake && trusted && !now_trusted {
            tracing::warn!(
                "webhook deliveries are not trusted any more; polling at the full schedule"
            );
            notifier.notify(OperatorEvent::WebhooksStopped);
        }
        trusted = now_trusted;
    }
}

/// The executor's settings, refusing what `run` cannot do yet, and the runner version runners
/// start from (empty for a `package_dir`). A `runner.version` is resolved here to its package
/// in the cache, downloaded and verified first if it is not there; `"latest"` asks GitHub which
/// release that is.
async fn settings(config: &Config, client: &GithubClient) -> Result<(Settings, String), Exit> {
    if config.policies.is_empty() {
        return Err(usage(
            config,
            "policy",
            "`rm-agent run` needs at least one [[policy]] (name, target, labels)",
        ));
    }
    let (package_dir, version) = match (&config.runner.package_dir, &config.runner.version) {
        (Some(dir), _) => (dir.clone(), String::new()),
        (None, Some(_)) if crate::package::follows_latest(config) => {
            crate::package::resolve_at_start(config, client).await?
        }
        (None, Some(version)) => (
            crate::package::resolve_configured(config).await?,
            version.clone(),
        ),
        (None, None) => {
            return Err(usage(
                config,
                "runner.package_dir",
                "`rm-agent run` needs an unpacked actions/runner package (runner.package_dir)",
            ));
        }
    };
    // What every runner gets from disk must be out of every job's reach (CONTRACT §7): judged
    // before anything of it is read (the env files right below, the package when it is stored,
    // each image again right before it is loaded).
    crate::trust::refuse_changeable(config, &package_dir)?;
    // Read once, here: a bad line or an unreadable file refuses the start (exit 2).
    let operator_env = rm_runner::env_file::load_policies(
        config
            .policies
            .iter()
            .map(|p| (p.name.as_str(), p.env_file.as_deref())),
    )
    .map_err(|(key, e)| usage(config, &key, &e.to_string()))?;
    // Before the runners' network and uids are set up: a login to the fleet's journal a job
    // could make too is refused here (crate::journal_auth).
    if let Some(target) = crate::secrets::journal_target(config) {
        crate::journal_auth::enforce(
            config,
            crate::journal_auth::Role::Run(config.host.isolation),
            &target,
        )?;
    }
    for off in crate::trust::protected_links_off() {
        tracing::warn!("{off}: {}", crate::trust::PROTECTED_LINKS_FIX);
    }
    // Bound before the runners' network is set up: the host's table leads to its port.
    let egress = crate::egress::Egress::start(config, &super::store(config)).await?;
    let backends =
        crate::isolation::backends(config, &package_dir, egress.as_ref().map(|e| e.port()))?;
    let images = crate::image::start(
        config,
        backends
            .user
            .as_ref()
            .and_then(|user| user.package.as_ref())
            .map(|linked| linked.current().tree().to_path_buf()),
        &super::store(config),
    )
    .await?;
    let settings = Settings {
        host: config.host.name.clone(),
        max_runners: config.host.max_runners,
        backends: Arc::new(backends),
        package_dir,
        timeouts: Timeouts {
            ghost: config.runner.ghost_timeout,
            ..Timeouts::supervision(
                config.runner.registration_timeout,
                config.runner.idle_timeout,
            )
        },
        policies: config.policies.clone(),
        operator_env,
        fitness: crate::fitness::Gate::default(),
        // In a fleet, jobs are read and claimed in the shared journal (CONTRACT §9).
        fleet: config.pg_journal.is_some().then(|| FleetSettings {
            max_runners: config
                .policies
                .iter()
                .filter_map(|p| Some((p.name.clone(), p.fleet_max_runners?)))
                .collect(),
            registrations: crate::executor::RegistrationWindows::Paced(config.github.pacing),
        }),
        // `logs.keep = 0`: nothing is kept.
        logs: (config.logs.keep > 0)
            .then(|| Arc::new(rm_runner::logs::Store::new(&config.data_dir, config.logs))),
        reruns: config.reruns.clone(),
        scale_sets: Arc::new(scale_set_board(config, client)?),
        cache: crate::cache::wanted(config).map(crate::cache::plan),
        images,
        egress,
        capacity: config.host.capacity,
        devices: config.host.devices.clone(),
    };
    // Bounds lowered since the last run, and copies past `max_age` on a host that cleaned up
    // nothing since: pruned now, off the runtime, not only after the next cleanup.
    if let Some(store) = settings.logs.clone() {
        tokio::task::spawn_blocking(move || {
            let now = rm_vocab::UnixMs::from_system_time(std::time::SystemTime::now()).get();
            if let Err(e) = store.prune(now) {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "cannot prune the kept runner logs"
                );
            }
        });
    }
    Ok((settings, version))
}

fn usage(config: &Config, key: &str, problem: &str) -> Exit {
    Exit::usage(format!(
        "{}: `{key}`: {problem}",
        display_file(config.source.as_deref())
    ))
}
