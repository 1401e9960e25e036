//! The poller's loop: one [`Poller`] owns the schedule, webhook health, the demand state and the
//! journal handle, and each step ([`Poller::poll_once`]) does what is due at that moment: the
//! failed-delivery scan, the demand poll, the stale-job checks. After an outage or a rate limit
//! nothing is sent before the schedule says so. In a fleet ([`Poller::with_fleet`]) each step
//! first renews or seeks the lead of each of its roles (`super::election`) and does only the
//! work of those it leads.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rm_github::{GithubClient, Target};
use rm_journal::{Fleet, FleetError, JournalError, PollStore};
use rm_vocab::{Clock, UnixMs};
use tokio::sync::watch;
use tracing::Instrument as _;

use super::Pacing;
use super::PollerConfig;
use super::blocking::{FleetHandle, Store};
use super::election::{self, Standing};
use super::health::{Evidence, Trust, WebhookHealth};
use super::redeliver;
use super::schedule::{
    Conditions, Failure, NextPoll, Pace, PollSchedule, STATUS_REFRESH, ScheduleError,
};
use super::stale;
use super::status::{
    PassReport, PollerStatus, RequestWindow, WebhookStatus, binding_rate_limit, totals,
};
use super::targets::{self, DemandError, DemandState};

/// The shortest sleep between two steps (guards against a busy loop).
const MIN_WAKE: Duration = Duration::from_millis(100);

/// A source of jitter in `[0, 1]` (tests pass `Box::new(|| 0.0)`).
pub(crate) type Jitter = Box<dyn FnMut() -> f64 + Send>;

/// What stops a step (GitHub's errors are part of the report, not errors).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PollerError {
    #[error("invalid polling configuration: {0}")]
    Schedule(#[from] ScheduleError),
    #[error("the journal: {0}")]
    Journal(#[from] JournalError),
    /// The fleet's database could not say who leads: this step did nothing.
    #[error("the fleet's election: {0}")]
    Election(#[from] FleetError),
}

impl From<DemandError> for PollerError {
    fn from(error: DemandError) -> Self {
        match error {
            DemandError::Journal(e) => PollerError::Journal(e),
        }
    }
}

impl From<redeliver::ScanError> for PollerError {
    fn from(error: redeliver::ScanError) -> Self {
        match error {
            redeliver::ScanError::Journal(e) => PollerError::Journal(e),
        }
    }
}

/// A failure after which nothing more should be sent until the schedule's next poll.
fn holds(failure: Option<Failure>) -> bool {
    matches!(
        failure,
        Some(Failure::Offline | Failure::RateLimited { .. })
    )
}

/// A poller's place in a fleet: the fleet's leases, this host's name, the lead's lifetime and the
/// roles it led after the last step.
struct Membership {
    fleet: FleetHandle,
    host: String,
    ttl: Duration,
    led: HashSet<String>,
}

/// The polling fallback. Build it with [`Poller::new`] (and, in a fleet, [`Poller::with_fleet`]),
/// keep [`Poller::status`] and [`Poller::changes`], then [`Poller::run`] it in a task.
pub(crate) struct Poller {
    client: GithubClient,
    journal: Store,
    /// `None`: alone (no fleet), every target polled here.
    fleet: Option<Membership>,
    clock: Arc<dyn Clock>,
    targets: Vec<Target>,
    schedule: PollSchedule,
    health: WebhookHealth,
    demand: DemandState,
    window: RequestWindow,
    jitter: Jitter,
    /// When the last demand poll (or held failure) was scheduled, and what the schedule said.
    last_poll: Option<(SystemTime, NextPoll)>,
    /// After an outage or a rate limit: nothing is sent before this.
    hold_until: Option<SystemTime>,
    /// Steps taken so far: each step's span carries its number.
    passes: u64,
    next_scan_at: SystemTime,
    next_stale_at: SystemTime,
    /// When this poller was made: jobs queued before it are checked at once.
    started: SystemTime,
    pacing: Pacing,
    status: watch::Sender<PollerStatus>,
    changes: watch::Sender<u64>,
    /// What the latest demand poll could not read; steps that poll no demand keep it.
    unreadable: Vec<super::UnreadableTarget>,
}

/// A small xorshift generator seeded from the clock: jitter only spreads hosts apart.
fn default_jitter(seed: SystemTime) -> Jitter {
    let mut state = UnixMs::from_system_time(seed).get().unsigned_abs() | 1;
    Box::new(move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    })
}

impl Poller {
    /// A poller whose first step polls everything (the start-up reconciliation and scan).
    /// `journal` is where it writes ([`rm_journal::Store::polls`]: this host's file, or a
    /// fleet's shared journal).
    pub(crate) fn new(
        config: PollerConfig,
        client: GithubClient,
        journal: Box<dyn PollStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Poller, PollerError> {
        let schedule = PollSchedule::new(config.interval, Some(config.idle_interval))?;
        let now = clock.now().to_system_time();
        let health = WebhookHealth::new(config.intake);
        let mut window = RequestWindow::default();
        window.record(now, totals(&client.budget()));
        let trust = Trust {
            trusted: config.intake,
            reason: if config.intake {
                "deliveries_trusted"
            } else {
                "no_intake"
            },
            evidence_at: None,
        };
        let initial = PollerStatus {
            pace: Pace::Nominal,
            next_poll_at: Some(now),
            webhooks: WebhookStatus::new(config.intake, trust, None),
            requests_last_hour: window.last_hour(),
            rate_limit: None,
            offline: None,
            unannounced_jobs: 0,
            last_pass: PassReport::default(),
            unreadable_targets: Vec::new(),
        };
        Ok(Poller {
            client,
            journal: Store::new(journal),
            fleet: None,
            targets: config.targets,
            schedule,
            health,
            demand: DemandState::default(),
            window,
            jitter: default_jitter(now),
            last_poll: None,
            hold_until: None,
            passes: 0,
            next_scan_at: now,
            next_stale_at: now,
            started: now,
            pacing: Pacing::default(),
            status: watch::Sender::new(initial),
            changes: watch::Sender::new(0),
            unreadable: Vec::new(),
            clock,
        })
    }

    /// Replaces the slow cadences (the demo shortens them).
    pub(crate) fn with_pacing(mut self, pacing: Pacing) -> Poller {
        self.pacing = pacing;
        self
    }

    /// Makes this poller one of a fleet's: `host` (its name in the fleet, unique) polls a target
    /// only while it leads the target's role (`poll:<target>`, `election::role`) and scans the
    /// App's hook deliveries only while it leads `election::SCAN_ROLE`, seeking or renewing
    /// each lead at every step for [`election::LEAD_TTL`]. `fleet` is the fleet's shared state
    /// ([`rm_journal::Store::fleet`]; on this host's file alone it makes a fleet of one); its
    /// calls run on the blocking pool. The journal given to [`Poller::new`] should be the same
    /// store's, so the hosts share what each polled.
    pub(crate) fn with_fleet(
        mut self,
        fleet: Box<dyn Fleet + Send>,
        host: impl Into<String>,
    ) -> Poller {
        self.fleet = Some(Membership {
            fleet: FleetHandle::new(fleet),
            host: host.into(),
            ttl: election::LEAD_TTL,
            led: HashSet::new(),
        });
        self
    }

    /// Replaces the lead's lifetime (tests wait for a lapsed lead in real time: the database's
    /// clock judges leases, not the poller's).
    #[cfg(test)]
    pub(crate) fn with_lead_ttl(mut self, ttl: Duration) -> Poller {
        if let Some(member) = &mut self.fleet {
            member.ttl = ttl;
        }
        self
    }

    /// Replaces the jitter source.
    #[cfg(test)]
    pub(crate) fn with_jitter(mut self, jitter: Jitter) -> Poller {
        self.jitter = jitter;
        self
    }

    /// The latest [`PollerStatus`], updated after every step.
    pub(crate) fn status(&self) -> watch::Receiver<PollerStatus> {
        self.status.subscribe()
    }

    /// Ticks whenever a step inserted or moved a job in the journal (wake the allocation).
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn trust(&mut self, now: SystemTime) -> Result<(Trust, Option<SystemTime>), PollerError> {
        let last = self
            .journal
            .call(|j| j.last_delivery_at())
            .await?
            .map(UnixMs::to_system_time);
        Ok((self.health.assess(last, now), last))
    }

    /// Where this host stands on each target's role and on the scan's, in this step: alone
    /// without a fleet; else what the fleet answered (each lead sought or renewed now).
    async fn elect(&mut self) -> Result<(Vec<Standing>, Standing), PollerError> {
        let scans = self.health.intake();
        let Some(member) = &mut self.fleet else {
            return Ok((vec![Standing::Alone; self.targets.len()], Standing::Alone));
        };
        let mut roles: Vec<String> = self.targets.iter().map(election::role).collect();
        if scans {
            roles.push(election::SCAN_ROLE.to_owned());
        }
        let (host, ttl) = (member.host.clone(), member.ttl);
        let asked = roles.clone();
        let leads: Vec<bool> = member
            .fleet
            .call(move |fleet| {
                asked
                    .iter()
                    .map(|role| fleet.try_lead(role, &host, ttl))
                    .collect::<Result<Vec<bool>, FleetError>>()
            })
            .await?;
        let standings: Vec<Standing> = roles
            .iter()
            .zip(&leads)
            .map(|(role, leads)| Standing::elected(*leads, member.led.contains(role)))
            .collect();
        for (role, standing) in roles.iter().zip(&standings) {
            match standing {
                Standing::Leads { took_over: true } => {
                    tracing::info!(role = %role, host = %member.host, "polling: this host leads the role now");
                }
                Standing::Follows if member.led.contains(role) => {
                    tracing::warn!(role = %role, host = %member.host, "polling: another host leads the role now");
                }
                _ => {}
            }
        }
        member.led = roles
            .iter()
            .zip(&leads)
            .filter(|(_, leads)| **leads)
            .map(|(role, _)| role.clone())
            .collect();
        let mut standings = standings;
        let scan = if scans {
            standings.pop().unwrap_or(Standing::Follows)
        } else {
            Standing::Follows
        };
        Ok((standings, scan))
    }

    /// When the next demand poll is due and the pace it runs at, given the webhooks' health.
    fn next_poll(&self, trust: Trust, now: SystemTime) -> (SystemTime, Pace) {
        match self.last_poll {
            None => (now, Pace::Nominal),
            Some((at, next)) if trust.trusted => {
                let pace = if next.pace.is_throttled() {
                    next.pace
                } else {
                    Pace::Reconciling
                };
                (at + next.delay.max(self.pacing.reconcile_interval), pace)
            }
            Some((at, next)) => (at + next.delay, next.pace),
        }
    }

    /// How long to sleep before the next step.
    pub(crate) async fn next_wake(&mut self) -> Duration {
        let now = self.clock.now().to_system_time();
        let trust = self.trust(now).await.map(|(t, _)| t).unwrap_or(Trust {
            trusted: false,
            reason: "journal_unreadable",
            evidence_at: None,
        });
        let mut at = self.next_poll(trust, now).0.min(self.next_stale_at);
        if self.health.intake() {
            at = at.min(self.next_scan_at);
        }
        if let Some(due) = self.demand.next_announcement_due() {
            at = at.min(due);
        }
        if let Some(hold) = self.hold_until {
            at = at.max(hold);
        }
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .clamp(MIN_WAKE, STATUS_REFRESH)
    }

    /// Runs until `shutdown` completes; a step in flight is abandoned at its next request.
    pub(crate) async fn run(mut self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                result = self.poll_once() => {
                    if let Err(error) = result {
                        tracing::error!(error = %error, "polling step failed; retrying later");
                        self.hold_until = Some(self.clock.now().to_system_time() + self.schedule.active());
                    }
                }
            }
            let wait = self.next_wake().await;
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        tracing::debug!("polling stopped");
    }

    /// One step: whatever is due now. Returns what it did. Every event of the step (its scan,
    /// its demand poll, its stale checks) carries the step's number from its span.
    pub(crate) async fn poll_once(&mut self) -> Result<PassReport, PollerError> {
        self.passes += 1;
        let span = tracing::info_span!("poll_pass", pass = self.passes);
        self.pass().instrument(span).await
    }

    async fn pass(&mut self) -> Result<PassReport, PollerError> {
        let now = self.clock.now().to_system_time();
        let open = self.hold_until.is_none_or(|hold| now >= hold);
        let mut report = PassReport {
            at: Some(now),
            ..PassReport::default()
        };
        let mut failure: Option<Failure> = None;
        fn note(failure: &mut Option<Failure>, f: Option<Failure>) {
            if let Some(f) = f {
                *failure = Some(Failure::worst(*failure, f));
            }
        }

        let (standings, scan_standing) = self.elect().await?;
        let scan_scheduled = now >= self.next_scan_at;
        if open && self.health.intake() && election::works_now(scan_standing, scan_scheduled) {
            let scan = redeliver::scan(
                &self.client,
                &self.journal,
                now,
                self.pacing.delivery_settle,
            )
            .await?;
            report.deliveries_examined = scan.examined;
            report.failed_deliveries = scan.failed;
            report.redelivered = scan.redelivered;
            report.requests += scan.requests;
            if scan.failed > 0 {
                self.health.distrust(Evidence::FailedDelivery, now);
            }
            // Only an outage or a limit on the App's requests holds demand polling back.
            note(&mut failure, scan.failure.filter(|f| holds(Some(*f))));
            self.next_scan_at = now + self.pacing.scan_interval;
        } else if scan_scheduled && scan_standing == Standing::Follows {
            // Another host scans: this one looks again at its next interval, not at once.
            self.next_scan_at = now + self.pacing.scan_interval;
        }

        let (trust, _) = self.trust(now).await?;
        let scheduled = now >= self.next_poll(trust, now).0;
        let (mine, due) = election::demand(&self.targets, &standings, scheduled);
        report.targets_led_elsewhere = self.targets.len() - mine.len();
        let demand_due = open && !holds(failure) && due;
        let mut quiet = false;
        if demand_due {
            let polled = targets::poll(
                &mut self.demand,
                &self.client,
                &self.journal,
                &mine,
                self.schedule.active(),
                now,
            )
            .await?;
            report.polled_demand = !mine.is_empty();
            self.unreadable.clone_from(&polled.unreadable);
            if !polled.vanished.is_empty() {
                let checked =
                    stale::check_jobs(&self.client, &self.journal, polled.vanished.clone(), now)
                        .await?;
                report.stale_checked += checked.checked;
                report.stale_resolved += checked.resolved;
                report.requests += checked.requests;
            }
            report.targets_read = polled.targets_read;
            report.repositories = polled.repositories;
            report.jobs_seen = polled.jobs_seen;
            report.jobs_changed = polled.jobs_changed;
            report.requests += polled.requests;
            quiet = polled.quiet;
            note(&mut failure, polled.failure);
        }

        if open && !holds(failure) && (demand_due || now >= self.next_stale_at) {
            let checked =
                stale::check(&self.client, &self.journal, &mine, now, self.started).await?;
            report.stale_checked += checked.checked;
            report.stale_resolved += checked.resolved;
            report.requests += checked.requests;
            quiet &= checked.checked == 0;
            note(&mut failure, checked.failure);
            self.next_stale_at = now + self.schedule.active();
        }

        let unannounced =
            targets::settle_announcements(&mut self.demand, &self.journal, now).await?;
        if unannounced > 0 {
            report.unannounced = unannounced;
            self.health.distrust(Evidence::UnannouncedJob, now);
            tracing::warn!(
                jobs = unannounced,
                "polling found queued jobs no delivery announced; polling at the full schedule"
            );
        }

        if demand_due || holds(failure) {
            let conditions = Conditions {
                quiet,
                quota: binding_rate_limit(&self.client.budget()).map(|r| r.quota(now)),
                requests_per_pass: report.requests,
            };
            let next = self
                .schedule
                .next_poll(failure, conditions, (self.jitter)(), now);
            self.last_poll = Some((now, next));
            self.hold_until = holds(failure).then_some(now + next.delay);
        }
        report.failure = failure.map(Failure::as_str);
        if report.jobs_changed + report.stale_resolved > 0 {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        self.publish(now, &report).await?;
        Ok(report)
    }

    async fn publish(&mut self, now: SystemTime, report: &PassReport) -> Result<(), PollerError> {
        let budget = self.client.budget();
        self.window.record(now, totals(&budget));
        let (trust, last_delivery_at) = self.trust(now).await?;
        let (next_poll_at, pace) = self.next_poll(trust, now);
        let next_poll_at = self
            .hold_until
            .map_or(next_poll_at, |h| next_poll_at.max(h));
        let unannounced_jobs = self.journal.call(|j| j.unannounced_count()).await?;
        let retry_in = next_poll_at.duration_since(now).unwrap_or(Duration::ZERO);
        let status = PollerStatus {
            pace,
            next_poll_at: Some(next_poll_at),
            webhooks: WebhookStatus::new(self.health.intake(), trust, last_delivery_at),
            requests_last_hour: self.window.last_hour(),
            rate_limit: binding_rate_limit(&budget),
            offline: self.schedule.offline(now, retry_in),
            unannounced_jobs,
            last_pass: report.clone(),
            unreadable_targets: self.unreadable.clone(),
        };
        tracing::debug!(
            pace = pace.as_str(),
            retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX),
            webhooks = trust.reason,
            jobs_changed = report.jobs_changed,
            requests = report.requests,
            targets_led_elsewhere = report.targets_led_elsewhere,
            failure = report.failure,
            "polling step"
        );
        self.status.send_replace(status);
        Ok(())
    }
}
