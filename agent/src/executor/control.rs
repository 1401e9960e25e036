//! The control loop: the one owner of the executor's state between passes (allocation's
//! memory, supervision's listings and retries, the launches and effects in flight, whether it
//! drains, when the inventory was last reconciled). Rooms get this state lent for one call and
//! give their results back as values. The loop waits on its inputs directly: the `watch`es that
//! say new demand may be there ([`Executor::wake_on`]), the effect tasks it owns and joins
//! ([`super::effects`]), and the [`Event`]s launch tasks and the poller send on one channel
//! ([`Handle`]). No effect runs in a pass: a runner being stopped or cleaned never holds back
//! the allocation of another. What only the loop knows is published on a `watch` after every
//! pass and message, for the status snapshot (`explain`, `status`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rm_journal::{AttemptId, HostInfo, Store};
use rm_vocab::{JobId, UnixMs};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::Instrument as _;

use super::allocate::{self, Allocator, Created};
use super::claims::{self, Membership};
use super::context::Context;
use super::effects::{self, Effect, Effected, Outcome};
use super::journal::AttemptJournal;
use super::launch::Launch;
use super::plan::{self, Held, Plan};
use super::registry::Registry;
use super::seams::Seams;
use super::supervise::{self, PassReport, Supervisor};
use super::{
    DRAIN_CLEANUP, DRAIN_LAUNCHES, DrainReport, Event, INVENTORY_INTERVAL, PASS_INTERVAL,
    RECOVERY_RETRY, RecoveryIncomplete, STARTUP_SYNC_WAIT, Settings, recovery,
};
use crate::executor::allocate::published::AllocationMemory;
use crate::fault;
use crate::notify::Notifier;
use rm_runner::RunnerRoot;

/// The runner labels a host serves: every label of its policies, once each, sorted.
fn host_labels(policies: &[crate::config::Policy]) -> Vec<String> {
    let mut labels: Vec<String> = policies
        .iter()
        .flat_map(|p| p.labels.iter().cloned())
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

/// How often a drain looks whether the launches in flight have ended.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// The executor: its control loop and the state it owns. [`Executor::run`] drives it in
/// production; the in-process harness drives [`Executor::recover`] and [`Executor::pass`] itself.
pub struct Executor {
    ctx: Arc<Context>,
    events: mpsc::UnboundedReceiver<Event>,
    handle: Handle,
    published: watch::Sender<AllocationMemory>,
    allocator: Allocator,
    supervisor: Supervisor,
    /// Attempts whose launch task has not reported yet: supervision leaves them to it.
    launching: HashSet<AttemptId>,
    /// True once the agent drains; launch tasks read it between JIT tries.
    draining: watch::Sender<bool>,
    /// When GitHub's inventory was last reconciled (on the executor's clock).
    last_inventory: Option<UnixMs>,
    /// In a fleet: the task renewing this host's lease while the loop runs.
    renewal: Option<tokio::task::JoinHandle<()>>,
    /// In a fleet: the jobs this host held claims on as of its last allocation. A job its
    /// runner ran may complete before supervision learns the runner took it, and a claim on a
    /// completed job no longer shows in the fleet: this says it was this host's.
    claimed: HashSet<JobId>,
    /// The re-run scan (`policy.rerun_on`): when it last started, the one in flight.
    reruns: super::rerun::Reruns,
    /// The latest allocation plan, for the launches in flight (is their policy still wanted?)
    /// and the status snapshot.
    plans: watch::Sender<Arc<Plan>>,
    /// The scale sets' policies whose count the last plan read from their listener's
    /// statistics (not the default before the first): only their surplus is scaled down.
    counted: HashSet<String>,
    /// The stops and cleanups in flight, each a task the loop joins (and a drain waits for).
    effects: JoinSet<Effected>,
    /// The attempt of each effect task, for a task that ends without reporting.
    effect_of: HashMap<tokio::task::Id, AttemptId>,
    /// What may bring new demand (durable deliveries, a poll that moved a job, the host fit
    /// again): any change wakes the loop for a pass.
    wakers: Vec<watch::Receiver<u64>>,
}

/// What the rest of the agent holds of the executor: it can wake the loop, tell it the journal
/// was refreshed, and read what the loop published. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    events: mpsc::UnboundedSender<Event>,
    published: watch::Receiver<AllocationMemory>,
}

impl Handle {
    /// The journal was brought up to date with GitHub by a poll pass that began at `at_ms`.
    pub fn journal_refreshed(&self, at_ms: UnixMs) {
        // A loop that has stopped has no allocation left to correct.
        self.events.send(Event::Refreshed(at_ms)).ok();
    }

    /// What allocation remembers (fences, back-offs, launches in flight, draining), as of the
    /// loop's last pass or message.
    pub fn published_memory(&self) -> AllocationMemory {
        self.published.borrow().clone()
    }
}

impl Executor {
    /// Opens the executor's own journal connections and the runner root.
    pub fn open(
        settings: Settings,
        store: &Store,
        runner_root: &Path,
        registry: Registry,
        notifier: Arc<Notifier>,
    ) -> anyhow::Result<Executor> {
        let seams = Seams::production(Arc::clone(&settings.backends));
        Executor::open_with(settings, store, runner_root, registry, notifier, seams)
    }

    /// [`Executor::open`] reading the world through `seams` (the harness's fakes in tests).
    pub(crate) fn open_with(
        settings: Settings,
        store: &Store,
        runner_root: &Path,
        registry: Registry,
        notifier: Arc<Notifier>,
        seams: Seams,
    ) -> anyhow::Result<Executor> {
        let membership = settings.fleet.as_ref().map(|fleet| {
            Membership::new(
                fleet,
                store.clone(),
                HostInfo {
                    host: settings.host.clone(),
                    labels: host_labels(&settings.policies),
                    policies: settings.policies.iter().map(|p| p.name.clone()).collect(),
                },
                registry.client().clone(),
            )
        });
        let ctx = Context {
            settings,
            journal: AttemptJournal::open(store)?,
            membership,
            registry,
            root: RunnerRoot::open(runner_root)?,
            execution: seams.execution,
            clock: seams.clock,
            notifier,
        };
        let (sender, events) = mpsc::unbounded_channel();
        let (published, watched) = watch::channel(AllocationMemory::default());
        Ok(Executor {
            ctx: Arc::new(ctx),
            events,
            handle: Handle {
                events: sender,
                published: watched,
            },
            published,
            allocator: Allocator::default(),
            supervisor: Supervisor::default(),
            launching: HashSet::new(),
            draining: watch::channel(false).0,
            last_inventory: None,
            renewal: None,
            claimed: HashSet::new(),
            reruns: super::rerun::Reruns::default(),
            plans: watch::channel(Arc::new(Plan::default())).0,
            counted: HashSet::new(),
            effects: JoinSet::new(),
            effect_of: HashMap::new(),
            wakers: Vec::new(),
        })
    }

    /// Wakes the control loop whenever `changes` changes (durable deliveries, a poll that moved
    /// a job, the host fit again): new demand is served at once instead of at the next interval.
    pub fn wake_on(&mut self, changes: watch::Receiver<u64>) {
        self.wakers.push(changes);
    }

    pub fn settings(&self) -> &Settings {
        &self.ctx.settings
    }

    /// The handle the rest of the agent talks to the loop through.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Recovers, waits (at most [`STARTUP_SYNC_WAIT`]) for `synced` (the journal caught up
    /// with GitHub: jobs that finished while the agent was down are no longer queued), then runs
    /// passes until `shutdown` completes, then drains.
    pub async fn run(
        mut self,
        synced: impl Future<Output = ()>,
        shutdown: impl Future<Output = ()>,
    ) -> DrainReport {
        tokio::pin!(shutdown);
        // In a fleet the lease is held from the start: claims need it, and other hosts see
        // this one alive while it recovers.
        self.renewal = self.ctx.membership.as_ref().map(Membership::spawn_renewal);
        loop {
            let recovered = tokio::select! {
                () = &mut shutdown => return self.drain().await,
                recovered = self.recover() => recovered,
            };
            match recovered {
                Ok(()) => break,
                Err(incomplete) => {
                    tracing::warn!(%incomplete, retry_in_s = RECOVERY_RETRY.as_secs(), "recovery is incomplete; no runner is started until it completes");
                    tokio::select! {
                        () = &mut shutdown => return self.drain().await,
                        () = tokio::time::sleep(RECOVERY_RETRY) => {}
                    }
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return self.drain().await,
            synced = tokio::time::timeout(STARTUP_SYNC_WAIT, synced) => {
                if synced.is_err() {
                    tracing::warn!(waited_s = STARTUP_SYNC_WAIT.as_secs(), "the first poll did not finish; serving the journal's queued jobs as they are");
                }
            }
        }
        tracing::info!(host = %self.ctx.settings.host, max_runners = self.ctx.settings.max_runners, "recovery complete; serving queued jobs");
        loop {
            self.pass().await;
            // Whatever arrives first leads to the next pass: an effect that ended (a stopped
            // runner is concluded, a cleaned one frees its uid), a message, new demand.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(joined) = self.effects.join_next_with_id() => self.effected(joined),
                event = self.events.recv() => {
                    if let Some(event) = event {
                        self.take(event);
                    }
                }
                () = any_changed(&mut self.wakers) => {}
                () = tokio::time::sleep(PASS_INTERVAL) => {}
            }
        }
        self.drain().await
    }

    /// In a fleet, renews this host's lease now (production renews it from a task that
    /// [`Executor::run`] starts; the harness, which drives passes itself, calls this).
    #[cfg(test)]
    pub(crate) async fn renew_lease(&self) {
        if let Some(membership) = &self.ctx.membership {
            membership.renew().await.expect("the lease");
        }
    }

    /// Waits for the re-run scan in flight, if any (the harness, between passes).
    #[cfg(test)]
    pub(crate) async fn settle_reruns(&mut self) {
        self.reruns.settle().await;
    }

    /// Startup recovery: every journalled attempt supervised with the startup timers and GitHub
    /// asked afresh, then GitHub's inventory reconciled.
    pub(crate) async fn recover(&mut self) -> Result<(), RecoveryIncomplete> {
        // Before any re-run scan can start: a re-run an earlier agent left `sending` is never
        // sent again.
        super::rerun::settle_at_start(&self.ctx)
            .await
            .map_err(|e| RecoveryIncomplete::Journal(format!("{e:#}")))?;
        let timeouts = self.ctx.settings.timeouts.at_startup();
        let report = self
            .supervisor
            .pass(&self.ctx, &self.launching, timeouts, true, &HashMap::new())
            .await
            .map_err(|e| RecoveryIncomplete::Journal(e.to_string()))?;
        let deferred = report.deferred;
        self.supervised(report).await;
        if deferred > 0 {
            return Err(RecoveryIncomplete::Deferred(deferred));
        }
        recovery::reconcile_inventory(&self.ctx).await?;
        self.last_inventory = Some(self.ctx.now());
        Ok(())
    }

    /// One pass: the messages and effect reports waiting taken, every attempt supervised (its
    /// slow effects started as tasks, never awaited here), the inventory reconciled when due,
    /// then allocation (unless draining).
    pub(crate) async fn pass(&mut self) {
        self.take_waiting();
        let timeouts = self.ctx.settings.timeouts;
        let surplus = self.scale_set_surplus();
        match self
            .supervisor
            .pass(&self.ctx, &self.launching, timeouts, false, &surplus)
            .await
        {
            Ok(report) => self.supervised(report).await,
            Err(e) => tracing::warn!(error = %e, "supervision pass failed"),
        }
        // Off the loop: a scan in flight is left to finish, a due one started.
        self.reruns.tick(&self.ctx);
        if self.inventory_due()
            && let Err(e) = recovery::reconcile_inventory(&self.ctx).await
        {
            tracing::warn!(error = %e, "inventory reconciliation failed; tried again next interval");
        }
        if !*self.draining.borrow()
            && let Err(e) = self.allocate().await
        {
            tracing::warn!(error = %format!("{e:#}"), "allocation pass failed");
        }
        self.publish();
    }

    /// The last plan's surplus of each scale set's policy: its idle runners beyond its count,
    /// which supervision scales down. A pass late at most, and scaled down only past
    /// [`crate::scaleset::SCALE_DOWN_GRACE`] of idleness; a draining agent scales nothing down.
    fn scale_set_surplus(&self) -> HashMap<String, u32> {
        if *self.draining.borrow() {
            return HashMap::new();
        }
        self.plans
            .borrow()
            .policies
            .iter()
            // A plan made before its listener's first statistics (a start) had the count
            // defaulted, not known: nothing is scaled down on it.
            .filter(|p| self.counted.contains(&p.policy))
            .map(|p| (p.policy.clone(), p.surplus()))
            .collect()
    }

    /// Allocates runners for every policy's queued jobs: the loop gathers the plan's inputs,
    /// [`plan::plan`] decides, and the loop carries the plan out (claims, then attempts and
    /// their launches) and publishes it.
    async fn allocate(&mut self) -> anyhow::Result<()> {
        let ctx = Arc::clone(&self.ctx);
        let (jobs, named) =
            allocate::demand_view(&ctx, self.allocator.unknown_runner_names()).await?;
        let live = allocate::live_counts(&ctx).await?;
        // In a fleet, this host serves the jobs it claims (crate::executor::claims).
        let standing = match &ctx.membership {
            Some(membership) => Some(membership.standing().await.map_err(|e| {
                anyhow::anyhow!("cannot read this host's claims in the fleet: {e}")
            })?),
            None => None,
        };
        if let Some(standing) = &standing {
            self.claimed = standing.held.clone();
        }
        let now = ctx.now();
        // Read before the counts: statistics that come meanwhile count at the next plan.
        let counted: HashSet<String> = ctx
            .settings
            .scale_sets
            .sources()
            .filter(|source| source.read(|seen| seen.statistics.is_some()))
            .map(|source| source.set.policy.clone())
            .collect();
        let inputs = plan::Inputs {
            now_ms: now,
            // An unfit host registers nothing (crate::fitness): a runner would fail its job.
            // The gate wakes the loop when the host is fit again.
            fit: ctx.settings.fitness.is_fit(),
            host_max: ctx.settings.max_runners,
            counts: &live.counts,
            policies: self.allocator.inputs(
                &ctx.settings.policies,
                &jobs,
                &named,
                &live,
                &ctx.settings.scale_sets,
                ctx.settings.sizing_host(),
                now,
            ),
            standing: standing.as_ref(),
            free_uids: live.free_uids(ctx.uid_pool()),
            packing: super::sizing::packing(
                ctx.settings.sizing_host(),
                &ctx.settings.policies,
                &live.attempts,
            ),
        };
        let mut plan = plan::plan(&inputs);
        if let Some(membership) = &ctx.membership {
            for planned in &mut plan.policies {
                let got = settle_claims(membership, planned).await;
                self.claimed.extend(got);
            }
        }
        for planned in &plan.policies {
            self.allocator.note_waiting(
                &planned.policy,
                planned.demand,
                planned.limit,
                now,
                &ctx.notifier,
            );
        }
        let started = self.start_planned(&ctx, &mut plan, &jobs).await;
        publish_capacities(&ctx, &self.allocator, &live, &plan, inputs.fit, now);
        self.plans.send_replace(Arc::new(plan));
        self.counted = counted;
        started
    }

    /// Starts the runners the plan says, policy by policy: each one journalled
    /// ([`allocate::create_attempt`]) and handed to its launch task. What stops it short (a
    /// launch that failed meanwhile backs its policy off; no free uid stops every policy) is
    /// noted in the plan.
    async fn start_planned(
        &mut self,
        ctx: &Arc<Context>,
        plan: &mut Plan,
        jobs: &[rm_journal::JobRow],
    ) -> anyhow::Result<()> {
        // Which uids other processes run as, read once (a `/proc` scan) and only if a runner is
        // to start: the uids handed out here are fenced by the journal, and a process that
        // takes a pool uid after the scan is caught when the runner starts.
        let mut running_uids = None;
        for planned in &mut plan.policies {
            let Some(policy) = ctx.policy(&planned.policy) else {
                continue;
            };
            let starts = planned.starts.clone();
            for (started, start) in (0u32..).zip(&starts) {
                // A launch started by this loop may already have failed (a broken package fails
                // in milliseconds): its back-off holds the rest of the plan too, or the loop
                // would replace each failed attempt at once.
                self.take_waiting();
                if self.allocator.backing_off(&policy.name, ctx.now()) {
                    let until_ms = self
                        .allocator
                        .backoff_until(&policy.name)
                        .unwrap_or(UnixMs::EPOCH);
                    planned.hold(started, Held::BackingOff { until_ms });
                    break;
                }
                let shape = start
                    .job
                    .and_then(|id| jobs.iter().find(|j| j.job_id == id))
                    .map_or_else(
                        || crate::shape::resolve(policy, &[]),
                        |job| crate::shape::resolve(policy, &job.labels),
                    )
                    .unwrap_or_default();
                let record =
                    match allocate::create_attempt(ctx, policy, &shape, &mut running_uids).await {
                        Ok(Created::Attempt(record)) => *record,
                        // Another runner took the device meanwhile (a cleanup not yet seen by the
                        // plan's read, or one the journal's fence caught): it waits like a ceiling.
                        Ok(Created::NoFreeDevice(group)) => {
                            planned.hold(
                                started,
                                Held::WaitingForRoom {
                                    resource: super::plan::pack::Resource::Device(group),
                                },
                            );
                            break;
                        }
                        // Like a ceiling: nothing starts until cleanup releases a uid.
                        Ok(Created::NoFreeUid(none)) => {
                            self.allocator.note_uid_pool(Some(&none));
                            planned.hold(started, Held::NoFreeUid);
                            return Ok(());
                        }
                        Err(e) => {
                            planned.start = started;
                            return Err(e);
                        }
                    };
                self.allocator.note_uid_pool(None);
                let span = super::attempt_span(&record);
                span.in_scope(|| tracing::info!(demand = planned.demand, "runner allocated"));
                fault::crash_point("attempt_journalled");
                self.launching.insert(record.attempt_id.clone());
                let launch = Launch {
                    ctx: Arc::clone(ctx),
                    record,
                    events: self.handle.events.clone(),
                    draining: self.draining.subscribe(),
                    plans: self.plans.subscribe(),
                };
                tokio::spawn(launch.run().instrument(span));
            }
        }
        Ok(())
    }

    /// CONTRACT §3's drain: no new runner, no busy runner killed. Launches in flight get
    /// [`DRAIN_LAUNCHES`] to finish, ended runners are cleaned, live ones are left running.
    async fn drain(mut self) -> DrainReport {
        self.draining.send_replace(true);
        // No new runner: no scale set takes a job on this host any more.
        self.ctx.settings.scale_sets.close();
        self.publish();
        tracing::info!("draining: no new runners; running ones are left to finish");
        let deadline = tokio::time::Instant::now() + DRAIN_LAUNCHES;
        while !self.launching.is_empty() && tokio::time::Instant::now() < deadline {
            if let Ok(Some(event)) = tokio::time::timeout(DRAIN_POLL, self.events.recv()).await {
                self.take(event);
            }
        }
        let launches_unfinished = self.launching.len();
        if tokio::time::timeout(DRAIN_CLEANUP, self.last_pass())
            .await
            .is_err()
        {
            tracing::warn!(
                effects_unfinished = self.effects.len(),
                "the drain's last supervision pass and its cleanups did not finish in time; the next start does what is left"
            );
        }
        // Those not finished are stopped here; each one's decision is found again at the next
        // start (every effect is idempotent).
        self.effects.abort_all();
        let left_running = self
            .ctx
            .journal
            .write(|attempts| attempts.list(rm_journal::Scope::Live, None))
            .await
            .map_or(0, |live| live.len());
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if let Some(membership) = &self.ctx.membership {
            // Its claims on queued jobs go to other hosts now rather than after the lease.
            match membership.leave().await {
                Ok(()) => tracing::info!(host = membership.host(), "left the fleet"),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot leave the fleet; its claims lapse with the lease")
                }
            }
        }
        DrainReport {
            left_running,
            launches_unfinished,
        }
    }

    /// The drain's last supervision: the effects in flight, then one more pass for what ended
    /// since, and the effects it started; all waited for.
    async fn last_pass(&mut self) {
        self.settle_effects().await;
        let timeouts = self.ctx.settings.timeouts;
        match self
            .supervisor
            .pass(&self.ctx, &self.launching, timeouts, false, &HashMap::new())
            .await
        {
            Ok(report) => self.supervised(report).await,
            Err(e) => tracing::warn!(error = %e, "the drain's last supervision pass failed"),
        }
        self.settle_effects().await;
    }

    /// Waits for every effect in flight and takes its report.
    pub(super) async fn settle_effects(&mut self) {
        while let Some(joined) = self.effects.join_next_with_id().await {
            self.effected(joined);
        }
    }

    /// Takes every message and effect report already waiting.
    fn take_waiting(&mut self) {
        while let Some(joined) = self.effects.try_join_next_with_id() {
            self.effected(joined);
        }
        while let Ok(event) = self.events.try_recv() {
            self.take(event);
        }
    }

    /// Starts each effect supervision decided as a task of its own, in its attempt's span.
    fn start_effects(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            let span = super::attempt_span(effect.attempt());
            let attempt = effect.attempt().attempt_id.clone();
            let task = self
                .effects
                .spawn(effects::carry_out(Arc::clone(&self.ctx), effect).instrument(span));
            self.effect_of.insert(task.id(), attempt);
        }
    }

    /// An effect task ended: its report goes to supervision (a task that panicked reports
    /// [`Outcome::Lost`], so its attempt is supervised again rather than left alone for good).
    fn effected(&mut self, joined: Result<(tokio::task::Id, Effected), tokio::task::JoinError>) {
        let effected = match joined {
            Ok((id, effected)) => {
                self.effect_of.remove(&id);
                effected
            }
            Err(e) => {
                let Some(attempt) = self.effect_of.remove(&e.id()) else {
                    return;
                };
                tracing::warn!(%attempt, error = %e, "an effect task ended without reporting; the attempt is supervised again");
                Effected {
                    attempt,
                    outcome: Outcome::Lost,
                }
            }
        };
        self.supervisor.note_effected(effected, self.ctx.now());
    }

    /// One message: the state it changes (a wake changes none: the pass it leads to is the
    /// point).
    fn take(&mut self, event: Event) {
        match event {
            Event::Exited(attempt, exit) => {
                tracing::debug!(%attempt, ?exit, "a runner process exited; supervising it");
                self.supervisor.note_exit(attempt, exit);
            }
            Event::Refreshed(at_ms) => self.allocator.journal_refreshed(at_ms),
            Event::Launched {
                attempt,
                policy,
                failed,
            } => {
                self.launching.remove(&attempt);
                match &failed {
                    // Its launch task now waits on the process: its exit comes as an event.
                    None => self.supervisor.note_started(attempt.clone()),
                    // Supervision concludes it at its next pass.
                    Some(failure) => self.supervisor.note_launch_failed(attempt.clone(), failure),
                }
                self.allocator.remember_launch(
                    &policy,
                    failed.as_ref(),
                    self.ctx.now(),
                    &self.ctx.notifier,
                );
            }
        }
        self.publish();
    }

    /// What supervision concluded, for allocation's fences and unknown completions; in a
    /// fleet, the claims of the jobs its runners took; the effects it decided, started.
    async fn supervised(&mut self, report: PassReport) {
        self.start_effects(report.effects);
        for concluded in &report.concluded {
            self.allocator.remember_conclusion(concluded);
        }
        if let Some(membership) = &self.ctx.membership {
            for taken in &report.took {
                took(membership, taken, &self.claimed).await;
            }
        }
    }

    /// Whether the periodic inventory reconciliation is due (and if so, marks it done now).
    fn inventory_due(&mut self) -> bool {
        let now = self.ctx.now();
        match self.last_inventory {
            Some(at) if now.saturating_sub(at) < rm_vocab::millis(INVENTORY_INTERVAL) => false,
            _ => {
                self.last_inventory = Some(now);
                true
            }
        }
    }

    /// Publishes what only the loop knows, for the status snapshot.
    fn publish(&self) {
        let plan = self.plans.borrow().published();
        let mut memory = self
            .allocator
            .published(&self.launching, *self.draining.borrow(), plan);
        memory.scale_set_capacity = self.ctx.settings.scale_sets.capacities();
        self.published.send_replace(memory);
    }
}

/// Publishes each scale set's capacity ([`crate::scaleset::capacity`]) from what this pass
/// had: the journal's live counts and free uids with the plan's starts added, fitness (`fit`)
/// and the policy's launch back-off. Its listener sends it at its next poll.
fn publish_capacities(
    ctx: &Context,
    allocator: &Allocator,
    live: &allocate::LiveRead,
    plan: &Plan,
    fit: bool,
    now: UnixMs,
) {
    let starts = |policy: Option<&str>| -> u32 {
        plan.policies
            .iter()
            .filter(|p| policy.is_none_or(|name| p.policy == name))
            .map(|p| p.start)
            .sum()
    };
    let host_live = live.counts.host_live().saturating_add(starts(None));
    let free_uids = live
        .free_uids(ctx.uid_pool())
        .map(|free| free.saturating_sub(starts(None)));
    for source in ctx.settings.scale_sets.sources() {
        let Some(policy) = ctx.policy(&source.set.policy) else {
            continue;
        };
        let capacity = crate::scaleset::capacity(crate::scaleset::CapacityInput {
            open: fit && !allocator.backing_off(&policy.name, now),
            max_runners: policy.max_runners,
            min_runners: policy.min_runners,
            policy_live: live
                .counts
                .policy(&policy.name)
                .live
                .saturating_add(starts(Some(&policy.name))),
            host_live,
            host_max: ctx.settings.max_runners,
            free_uids,
        });
        source.set_capacity(capacity);
    }
}

/// In a fleet: gives back this host's claims on jobs that no longer count for the policy, makes
/// the claims the plan asks for, and tells the plan how many were granted; returns the jobs
/// claimed now.
async fn settle_claims(membership: &Membership, planned: &mut plan::PolicyPlan) -> Vec<JobId> {
    for &job_id in &planned.release {
        if let Err(e) = membership.release(job_id).await {
            tracing::warn!(job_id = job_id.get(), error = %e, "cannot give back a claim on a job this host no longer serves");
        }
    }
    if planned.claim.is_empty() {
        return Vec::new();
    }
    let policy = planned.policy.clone();
    match membership.claim(&policy, planned.claim.clone()).await {
        Ok(claimed) => {
            if !claimed.job_ids.is_empty() {
                tracing::info!(policy = %policy, jobs = ?claimed.job_ids, "claimed jobs");
                // A host that dies holding claims and no runner for them: the lease hand-over.
                fault::crash_point("jobs_claimed");
            }
            if claimed.at_ceiling {
                tracing::info!(policy = %policy, "the policy's fleet-wide max_runners holds further jobs back");
            }
            planned.after_claims(&claimed.job_ids);
            claimed.job_ids
        }
        Err(e) => {
            tracing::warn!(policy = %policy, error = %e, "cannot claim jobs; serving only this host's claims");
            planned.after_claims(&[]);
            Vec::new()
        }
    }
}

/// In a fleet: one of this host's runners took `job_id`. If that job was not one of its
/// claims (`claimed`: as of the last allocation, or now), it gives one of its claims on a
/// queued job of the policy back ([`claims::claim_to_release`]); if it was, the claim names the
/// runner (for `status`).
async fn took(membership: &Membership, took: &supervise::Took, claimed: &HashSet<JobId>) {
    let standing = match membership.standing().await {
        Ok(standing) => standing,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this host's claims; the next pass corrects them");
            return;
        }
    };
    let held: HashSet<JobId> = standing.held.union(claimed).copied().collect();
    match claims::claim_to_release(took.job_id, &held, standing.mine(&took.policy)) {
        Some(release) => match membership.release(release).await {
            Ok(_) => tracing::info!(
                job_id = took.job_id.get(),
                released = release.get(),
                "a runner took a job this host had not claimed; one of its claims goes back to the fleet"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot give a claim back"),
        },
        None if standing.held.contains(&took.job_id) => {
            if let Err(e) = membership
                .name_runner(took.job_id, took.runner_name.clone())
                .await
            {
                tracing::warn!(error = %e, "cannot name the runner on its claim");
            }
        }
        None => {}
    }
}

/// Completes when any of `wakers` changes; never, when there is none. A waker whose sender is
/// gone is dropped (its source stopped: nothing more comes from it).
async fn any_changed(wakers: &mut Vec<watch::Receiver<u64>>) {
    loop {
        if wakers.is_empty() {
            return std::future::pending().await;
        }
        let (changed, index, _) =
            futures_util::future::select_all(wakers.iter_mut().map(|w| Box::pin(w.changed())))
                .await;
        match changed {
            Ok(()) => return,
            Err(_) => {
                wakers.swap_remove(index);
            }
        }
    }
}
