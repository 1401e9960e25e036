//! `rm-agent status`: the host at a glance. Webhook health, the polling pace and next poll, the
//! rate-limit budget, queued jobs per policy, runners by state and the last GitHub contact, with
//! anything degraded said in words a person can act on.
//!
//! Counts come from the journal. What only the running agent knows (pace, next poll, rate
//! limit, webhook trust, GitHub contact) comes from the snapshot it publishes
//! ([`crate::status_file`]); a snapshot whose writer is gone or silent is not shown as current,
//! and the report says that no agent is running.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use rm_journal::{AttemptOutcome, AttemptState, Reader};
use serde_json::{Value, json};

use crate::config::Config;
use crate::demand::{self, Demand, QueuedJob};
use crate::exit::Exit;
use crate::output::{print_json, rfc3339};
use crate::status_file::{self, Liveness, Snapshot};
use rm_vocab::UnixMs;

/// Under this share of the rate limit left, `status` calls the budget low (percent). The same
/// threshold stretches the polling pace (`polling::schedule`).
const LOW_RATE_LIMIT_PERCENT: u64 = 20;
/// This many failed runner attempts in a row, newest first, means runners are failing.
const FAILING_RUNNERS: usize = 3;
/// How many of the newest attempts `status` looks at for failures.
const RECENT_ATTEMPTS: usize = 20;

/// Everything `status` reports, gathered before anything is decided (so the rules are pure).
#[derive(Debug)]
pub(crate) struct Facts {
    pub now_ms: UnixMs,
    pub data_dir: String,
    pub agent: Liveness,
    /// The newest snapshot, current or not.
    pub snapshot: Option<Snapshot>,
    pub deliveries: i64,
    pub rejected: i64,
    pub last_delivery_at_ms: Option<UnixMs>,
    pub jobs_by_state: BTreeMap<String, i64>,
    pub attempts_by_state: BTreeMap<String, i64>,
    /// This host's re-runs of jobs the infrastructure killed, by state (`policy.rerun_on`).
    pub reruns: rm_journal::RerunCounts,
    /// The queued jobs routed to the configured policies.
    pub demand: Demand,
    /// Queued jobs no policy of this host matches.
    pub unmatched: usize,
    /// The outcome and reason of the newest attempts that ended, newest first.
    pub recent_outcomes: Vec<(AttemptOutcome, Option<String>)>,
    /// `host.max_runners` of the configuration (the running agent's own wins).
    pub configured_capacity: u32,
    /// `host.isolation` of the configuration.
    pub isolation: crate::config::Isolation,
    /// `host.network` of the configuration.
    pub network: crate::config::Network,
    /// Runner uids held by attempts neither cleaned nor released.
    pub uids_held: usize,
    /// How many uids `host.runner_uids` holds.
    pub uid_pool: usize,
    /// Attempts concluded longer than [`CLEANUP_OVERDUE`] ago and still not released: their
    /// cleanup keeps failing, and their uids stay held.
    pub cleanup_overdue: usize,
    /// The runners not yet cleaned up that run (or ran) in an image, oldest first (issue 40).
    pub runner_images: Vec<RunnerImage>,
    /// Every queued job's verdict, oldest first (CONTRACT §8, [`crate::explain`]).
    pub waiting: Vec<crate::explain::Explanation>,
    /// Wait times over the last hour, from the journal (CONTRACT §8, [`crate::latency`]).
    pub latency: crate::latency::Latency,
    /// What the agent last learned about `runner.version` (rm_runner::package::report).
    pub runner_version: Option<rm_runner::package::report::VersionReport>,
    /// In a fleet (`journal.url`, CONTRACT §9): every host with its lease, claims and runners.
    pub fleet: Option<rm_journal::FleetView>,
    /// Each `[[scale_set]]` with what the journal holds of it (`None`: never listened to yet).
    pub scale_sets: Vec<ScaleSetFacts>,
    /// `host.name`: this host in the fleet's view.
    pub host_name: String,
    /// This host's capacity, what its live runners take of it, and its devices (issue 42).
    pub capacity: HostUse,
}

/// One dimension of the host's capacity (issue 42): what it offers and what live runners take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// `None`: unbounded (the machine's size is unknown and `host.capacity` writes none).
    pub total: Option<u64>,
    /// The sum of what the live runners' shapes take.
    pub used: u64,
}

impl Usage {
    /// What is left; `None` when unbounded. Never negative: a configuration lowered under what
    /// runners already hold shows none free.
    fn free(self) -> Option<u64> {
        self.total.map(|total| total.saturating_sub(self.used))
    }
}

/// A `[[host.device]]` and the runner holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceUse {
    /// Its id (its first node).
    pub device: String,
    /// The holder's runner name (its attempt id if the attempt is not among those read).
    pub holder: Option<String>,
}

/// This host's capacity per resource and its devices per group, as allocation packs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HostUse {
    pub cpu_millis: Usage,
    pub memory: Usage,
    pub disk: Usage,
    /// Per group (by name), its devices in configuration order.
    pub groups: BTreeMap<String, Vec<DeviceUse>>,
}

/// What the host offers and what its live runners take: each live attempt's journalled shape,
/// or its policy's default shape for one journalled without (as allocation counts it,
/// [`crate::executor::sizing::packing`]); each device with its holder from the journal's holds
/// (a device held after its attempt concluded stays held until cleanup frees it). A hold of a
/// device the configuration no longer lists counts nowhere. Pure.
pub(crate) fn host_use(
    config: &Config,
    uncleaned: &[rm_journal::AttemptRecord],
    holds: &[(String, rm_journal::AttemptId)],
) -> HostUse {
    let host = crate::executor::sizing::Host {
        capacity: &config.host.capacity,
        devices: &config.host.devices,
        max_runners: config.host.max_runners,
    };
    let packing = crate::executor::sizing::packing(host, &config.policies, uncleaned);
    let sum = |take: fn(&crate::executor::plan::pack::Need) -> u64| {
        packing
            .held
            .iter()
            .map(take)
            .fold(0u64, u64::saturating_add)
    };
    let mut groups: BTreeMap<String, Vec<DeviceUse>> = BTreeMap::new();
    for device in &config.host.devices {
        let id = device.id().to_string_lossy().into_owned();
        let holder = holds.iter().find(|(d, _)| *d == id).map(|(_, attempt)| {
            uncleaned
                .iter()
                .find(|a| &a.attempt_id == attempt)
                .map_or_else(|| attempt.to_string(), |a| a.runner_name.clone())
        });
        groups
            .entry(device.group.clone())
            .or_default()
            .push(DeviceUse { device: id, holder });
    }
    HostUse {
        cpu_millis: Usage {
            total: config.host.capacity.cpu_millis,
            used: sum(|n| n.cpu_millis),
        },
        memory: Usage {
            total: config.host.capacity.memory,
            used: sum(|n| n.memory),
        },
        disk: Usage {
            total: config.host.capacity.disk,
            used: sum(|n| n.disk),
        },
        groups,
    }
}

/// CPUs in thousandths as a JSON number of CPUs.
fn cpus(millis: u64) -> Value {
    // Thousandths of a CPU are far inside f64's exact integers.
    #[expect(clippy::cast_precision_loss, reason = "CPUs for people and scripts")]
    let cpus = millis as f64 / 1000.0;
    json!(cpus)
}

/// `status --json`'s `capacity` (issue 42).
fn capacity_json(host: &str, capacity: &HostUse) -> Value {
    let dimension = |u: Usage, value: fn(u64) -> Value| {
        json!({
            "total": u.total.map(value),
            "used": value(u.used),
            "free": u.free().map(value),
        })
    };
    json!({
        "host": host,
        "cpu": dimension(capacity.cpu_millis, cpus),
        "memory": dimension(capacity.memory, |b| json!(b)),
        "disk": dimension(capacity.disk, |b| json!(b)),
        "devices": capacity.groups.iter().map(|(group, devices)| {
            let held: Vec<&DeviceUse> = devices.iter().filter(|d| d.holder.is_some()).collect();
            json!({
                "group": group,
                "total": devices.len(),
                "held": held.len(),
                "free": devices.len() - held.len(),
                "holders": held.iter().map(|d| json!({
                    "device": d.device,
                    "runner": d.holder,
                })).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}

/// `status`'s `capacity` line, and a `devices` line when the host has devices.
fn capacity_lines(capacity: &HostUse) -> (String, Option<String>) {
    let dimension = |name: &str, u: Usage, show: fn(u64) -> String| match (u.total, u.free()) {
        (Some(total), Some(free)) => format!(
            "{name} {} of {} used, {} free",
            show(u.used),
            show(total),
            show(free)
        ),
        _ => format!("{name} {} used (unbounded)", show(u.used)),
    };
    let resources = [
        dimension("cpu", capacity.cpu_millis, crate::config::shape::format_cpu),
        dimension("memory", capacity.memory, crate::fitness::bytes),
        dimension("disk", capacity.disk, crate::fitness::bytes),
    ]
    .join("; ");
    let groups: Vec<String> = capacity
        .groups
        .iter()
        .map(|(group, devices)| {
            let held: Vec<String> = devices
                .iter()
                .filter_map(|d| Some(format!("{} by {}", d.device, d.holder.as_deref()?)))
                .collect();
            let free = devices.len() - held.len();
            if held.is_empty() {
                format!("{group} {} free of {}", free, devices.len())
            } else {
                format!(
                    "{group} {} of {} held ({}), {free} free",
                    held.len(),
                    devices.len(),
                    held.join(", ")
                )
            }
        })
        .collect();
    (resources, (!groups.is_empty()).then(|| groups.join("; ")))
}

/// A runner not yet cleaned up and the image it runs in (issue 40): what `status` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunnerImage {
    pub runner_name: String,
    pub policy: String,
    pub state: AttemptState,
    /// The image's id, `sha256:<64 hex>`.
    pub image: String,
}

/// Of the attempts not cleaned, those whose runner's root is an image, in the order given.
fn runner_images(uncleaned: &[rm_journal::AttemptRecord]) -> Vec<RunnerImage> {
    uncleaned
        .iter()
        .filter_map(|a| {
            Some(RunnerImage {
                runner_name: a.runner_name.clone(),
                policy: a.policy.clone(),
                state: a.state,
                image: a.image.clone()?,
            })
        })
        .collect()
}

/// `status`'s line of images: each image (short) with the runners in it, in the order they
/// first appear; `None` when no runner runs in an image.
fn images_line(runners: &[RunnerImage]) -> Option<String> {
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in runners {
        match groups.iter_mut().find(|(image, _)| *image == r.image) {
            Some((_, names)) => names.push(&r.runner_name),
            None => groups.push((&r.image, vec![&r.runner_name])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    Some(
        groups
            .iter()
            .map(|(image, names)| {
                format!(
                    "{} ({})",
                    super::runners::short_image(image),
                    names.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
    )
}

/// A scale set as `status` shows it.
#[derive(Debug)]
pub(crate) struct ScaleSetFacts {
    pub name: String,
    pub policy: String,
    /// The enterprise it lives in (its slug), for an enterprise scale set.
    pub enterprise: Option<String>,
    pub record: Option<rm_journal::ScaleSetRecord>,
}

/// What the journal holds of each configured scale set, read-only: `status` never creates or
/// migrates a journal.
fn scale_set_facts(config: &Config) -> anyhow::Result<Vec<ScaleSetFacts>> {
    if config.scale_sets.is_empty() {
        return Ok(Vec::new());
    }
    let file = super::store(config).file().to_owned();
    let records = if file.exists() {
        rm_journal::ScaleSets::open_read_only(&file)?.all()?
    } else {
        Vec::new()
    };
    Ok(config
        .scale_sets
        .iter()
        .map(|set| ScaleSetFacts {
            name: set.name.clone(),
            policy: set.policy.clone(),
            enterprise: set.enterprise.as_ref().map(|e| e.slug.clone()),
            record: records.iter().find(|r| r.name == set.name).cloned(),
        })
        .collect())
}

/// `capacity`: what the running agent's allocation pass last published for the scale set
/// (`None` without a running agent).
fn scale_set_json(set: &ScaleSetFacts, capacity: Option<u32>) -> Value {
    let record = set.record.as_ref();
    let statistics = record.and_then(|r| r.statistics.as_ref());
    json!({
        "name": set.name,
        "policy": set.policy,
        "enterprise": set.enterprise,
        "scale_set_id": record.and_then(|r| r.scale_set_id),
        "session_id": record.and_then(|r| r.session_id.clone()),
        "last_message_id": record.map(|r| r.last_message_id),
        "last_message_at": record.and_then(|r| r.last_message_at).map(UnixMs::to_rfc3339),
        "messages": record.map(|r| r.messages),
        "statistics": statistics.map(|s| json!({
            "available": s.available,
            "acquired": s.acquired,
            "assigned": s.assigned,
            "running": s.running,
            "registered_runners": s.registered,
            "busy_runners": s.busy,
            "idle_runners": s.idle,
        })),
        "statistics_at": record.and_then(|r| r.statistics_at).map(UnixMs::to_rfc3339),
        "note": record.and_then(|r| r.note.clone()),
        "capacity": capacity,
    })
}

fn render_scale_set(set: &ScaleSetFacts, now_ms: UnixMs, capacity: Option<u32>) -> String {
    let scope = match &set.enterprise {
        Some(slug) => format!("policy {}, enterprise {slug}", set.policy),
        None => format!("policy {}", set.policy),
    };
    let Some(record) = &set.record else {
        return format!("{} ({scope}): not listened to yet", set.name);
    };
    let session = record
        .session_id
        .as_deref()
        .map_or_else(|| "no session".to_owned(), |id| format!("session {id}"));
    let last = record.last_message_at.map_or_else(
        || "no message yet".to_owned(),
        |at| {
            format!(
                "last message {} {} ago",
                record.last_message_id,
                ago(now_ms.duration_since(at))
            )
        },
    );
    let statistics = record.statistics.as_ref().map_or_else(String::new, |s| {
        format!(
            "; {} assigned, {} running, {} runners idle",
            s.assigned, s.running, s.idle
        )
    });
    let capacity = capacity.map_or_else(String::new, |c| format!("; capacity {c}"));
    let note = record
        .note
        .as_deref()
        .map_or_else(String::new, |note| format!("; {note}"));
    format!(
        "{} ({scope}): {session}, {last}{statistics}{capacity}{note}",
        set.name
    )
}

/// How long an attempt may stay concluded before `status` says its cleanup is failing (a clean
/// retry backs off from 30 s, so a few failures fit in this).
pub(crate) const CLEANUP_OVERDUE: Duration = Duration::from_secs(5 * 60);

impl Facts {
    /// The snapshot, when an agent is running and wrote it.
    fn live(&self) -> Option<&Snapshot> {
        if self.agent.is_running() {
            self.snapshot.as_ref()
        } else {
            None
        }
    }

    /// The capacity the running agent last published for scale set `name`
    /// ([`crate::scaleset::capacity`]).
    fn scale_set_capacity(&self, name: &str) -> Option<u32> {
        self.live()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.scale_set_capacity.get(name).copied())
    }

    fn jobs(&self, state: &str) -> i64 {
        self.jobs_by_state.get(state).copied().unwrap_or(0)
    }

    fn active_runners(&self) -> i64 {
        AttemptState::LIVE
            .iter()
            .map(|s| self.attempts_by_state.get(s.as_str()).copied().unwrap_or(0))
            .sum()
    }

    fn capacity(&self) -> u32 {
        self.live()
            .map_or(self.configured_capacity, |s| s.host.max_runners)
    }

    fn webhooks_healthy(&self) -> bool {
        self.live()
            .is_some_and(|s| s.polling.webhooks.intake && s.polling.webhooks.trusted)
    }

    fn next_poll_in_ms(&self) -> Option<i64> {
        let at = self.live()?.polling.next_poll_at_ms?;
        Some(at.saturating_sub(self.now_ms).max(0))
    }

    fn age_of(&self, at_ms: UnixMs) -> Duration {
        self.now_ms.duration_since(at_ms)
    }
}

pub fn run(config: &Config, json: bool) -> Result<(), Exit> {
    let store = super::store(config);
    let facts = match store.is_shared() {
        false => {
            let reader = super::open_reader_or_empty(config, json)?;
            let journalled = match &reader {
                Some(reader) => journalled(reader).map_err(Exit::runtime)?,
                None => Journalled::default(),
            };
            gather(config, journalled, reader.as_ref(), None, SystemTime::now())
        }
        true => {
            // This host's runners are in its own journal (it may have none yet); the fleet's
            // deliveries, jobs and claims are in the shared one.
            let local = super::open_local_reader(config)?;
            let now = SystemTime::now();
            let (journalled, fleet) =
                fleet_journalled(config, &store, local.as_ref(), now).map_err(Exit::runtime)?;
            // Wait times join jobs with attempts, which a fleet host keeps apart: not built.
            gather(config, journalled, None, Some(fleet), now)
        }
    }
    .map_err(Exit::runtime)?;
    if json {
        print_json(&to_json(&facts));
    } else {
        crate::out!("{}", render(&facts));
    }
    Ok(())
}

/// What a fleet host's `status` reads: deliveries and jobs from the fleet's journal, this host's
/// attempts from its own, the fleet's hosts, leases and claims, and the waiting jobs' verdicts
/// as this host sees them ([`super::explain::waiting_in_fleet`]).
fn fleet_journalled(
    config: &Config,
    store: &rm_journal::Store,
    local: Option<&Reader>,
    now: SystemTime,
) -> anyhow::Result<(Journalled, InFleet)> {
    use anyhow::Context as _;
    let what = || format!("cannot read {}", store.describe());
    let mut pg = store.jobs().with_context(what)?;
    let view = super::fleet_view(store).with_context(what)?;
    // Read once: the waiting verdicts and the counts come from the same queue.
    let queued = pg.queued_jobs()?;
    let journalled_queued: Vec<QueuedJob> = queued.iter().map(QueuedJob::from).collect();
    let waiting = super::explain::waiting_in_fleet(config, local, queued, view.clone(), now)
        .with_context(what)?;
    let mut journalled = match local {
        Some(reader) => journalled(reader)?,
        None => Journalled::default(),
    };
    journalled.outcomes = pg.delivery_outcome_counts()?.into_iter().collect();
    journalled.queued = journalled_queued;
    journalled.last_delivery_at_ms = pg.last_delivery_at()?;
    journalled.jobs_by_state = pg.job_counts()?.into_iter().collect();
    Ok((journalled, InFleet { view, waiting }))
}

/// What a fleet host's `status` adds: the fleet, and the waiting verdicts read from it.
struct InFleet {
    view: rm_journal::FleetView,
    waiting: Vec<crate::explain::Explanation>,
}

/// What the journal says, or the empty state when there is none yet.
#[derive(Debug, Default)]
struct Journalled {
    outcomes: BTreeMap<String, i64>,
    queued: Vec<QueuedJob>,
    uncleaned: Vec<rm_journal::AttemptRecord>,
    recent_outcomes: Vec<(AttemptOutcome, Option<String>)>,
    last_delivery_at_ms: Option<UnixMs>,
    jobs_by_state: BTreeMap<String, i64>,
    attempts_by_state: BTreeMap<String, i64>,
    reruns: rm_journal::RerunCounts,
    /// This host's device holds and their holders' attempts (issue 42).
    holds: Vec<(String, rm_journal::AttemptId)>,
}

fn journalled(reader: &Reader) -> anyhow::Result<Journalled> {
    Ok(Journalled {
        outcomes: reader.delivery_outcome_counts()?.into_iter().collect(),
        queued: reader.queued_jobs()?.iter().map(QueuedJob::from).collect(),
        uncleaned: reader.uncleaned_attempts()?,
        recent_outcomes: reader
            .attempts(RECENT_ATTEMPTS)?
            .into_iter()
            .filter_map(|a| a.outcome.map(|o| (o, a.detail.or(a.reason))))
            .collect(),
        last_delivery_at_ms: reader.last_delivery_at()?,
        jobs_by_state: reader.job_counts()?.into_iter().collect(),
        attempts_by_state: reader.attempt_counts()?.into_iter().collect(),
        reruns: reader.rerun_counts()?,
        holds: reader.held_devices()?,
    })
}

/// Decides from what the journal said (`journalled`), the snapshot and the processes; `reader`
/// (this host's journal, when it holds the jobs) gives the wait times, and the waiting verdicts
/// unless `fleet` brought them from the fleet's journal.
fn gather(
    config: &Config,
    journalled: Journalled,
    reader: Option<&Reader>,
    fleet: Option<InFleet>,
    now: SystemTime,
) -> anyhow::Result<Facts> {
    let now_ms = UnixMs::from_system_time(now);
    let (snapshot, agent) = status_file::observe(&config.data_dir, now_ms);
    let Journalled {
        outcomes,
        queued,
        uncleaned,
        recent_outcomes,
        last_delivery_at_ms,
        jobs_by_state,
        attempts_by_state,
        reruns,
        holds,
    } = journalled;
    let demand = demand::route(&config.policies, &queued);
    let routed: usize = demand.per_policy.values().map(Vec::len).sum();
    let unmatched = queued
        .len()
        .saturating_sub(routed + demand.unresolvable.len() + demand.overlapping.len());
    let (uids_held, cleanup_overdue) = holding(&uncleaned, now_ms - CLEANUP_OVERDUE);
    let runner_images = runner_images(&uncleaned);
    let capacity = host_use(config, &uncleaned, &holds);
    let (fleet, waiting) = match fleet {
        Some(InFleet { view, waiting }) => (Some(view), waiting),
        None => (None, super::explain::waiting(config, reader, now)?),
    };
    let latency = match reader {
        Some(reader) => crate::latency::read(reader, now_ms)?,
        None => crate::latency::Latency::default(),
    };
    Ok(Facts {
        now_ms,
        data_dir: config.data_dir.display().to_string(),
        agent,
        snapshot,
        deliveries: outcomes.values().sum(),
        rejected: outcomes.get("rejected").copied().unwrap_or(0),
        last_delivery_at_ms,
        jobs_by_state,
        attempts_by_state,
        reruns,
        demand,
        unmatched,
        recent_outcomes,
        configured_capacity: config.host.max_runners,
        isolation: config.host.isolation,
        network: config.host.network,
        uids_held,
        uid_pool: config.host.runner_uids.len(),
        cleanup_overdue,
        runner_images,
        waiting,
        latency,
        runner_version: config
            .runner
            .version
            .as_ref()
            .and_then(|_| rm_runner::package::report::read(&config.data_dir)),
        fleet,
        scale_sets: scale_set_facts(config)?,
        host_name: config.host.name.clone(),
        capacity,
    })
}

/// CONTRACT §3's `status --json`, with extra fields beside the contract's.
pub(crate) fn to_json(facts: &Facts) -> Value {
    let live = facts.live();
    let rate_limit = live.and_then(|s| s.polling.rate_limit);
    json!({
        "agent": {
            "running": facts.agent.is_running(),
            "pid": facts.agent.pid(),
            "status_written_at": facts.snapshot.as_ref().map(|s| s.written_at_ms.to_rfc3339()),
        },
        "webhooks": {
            "last_delivery_at": facts.last_delivery_at_ms.map(UnixMs::to_rfc3339),
            "deliveries": facts.deliveries,
            "rejected": facts.rejected,
            "healthy": facts.webhooks_healthy(),
            "intake": live.map(|s| s.polling.webhooks.intake),
            "trusted": live.map(|s| s.polling.webhooks.trusted),
            "reason": live.map(|s| s.polling.webhooks.reason.as_str()),
            "relay": live.and_then(|s| s.relay.as_ref()).map(|r| json!({
                "connected": r.connected,
                "last_event_id": r.last_event_id,
                "journalled": r.journalled,
                "refused": r.refused,
                "problem": r.problem,
            })),
        },
        "polling": {
            "pace": live.map(|s| s.polling.pace.as_str()),
            "next_poll_in_ms": facts.next_poll_in_ms(),
            "requests_last_hour": live.map(|s| json!({
                "charged": s.polling.requests_last_hour.charged,
                "uncharged": s.polling.requests_last_hour.uncharged,
            })),
            "unreadable_targets": live.map(|s| s.polling.unreadable_targets.iter().map(|t| json!({
                "target": t.target,
                "reason": t.reason,
            })).collect::<Vec<_>>()),
            "offline": live.and_then(|s| s.polling.offline.as_ref()).map(|o| json!({
                "since": o.since_ms.to_rfc3339(),
                "outlasted_the_queue": o.outlasted_the_queue,
                "description": o.description,
            })),
        },
        "github": {
            "reachable": live.map(|s| s.github.reachable),
            "last_contact_at": facts
                .snapshot
                .as_ref()
                .and_then(|s| s.github.last_contact_at_ms)
                .map(UnixMs::to_rfc3339),
            "rate_limit": {
                "remaining": rate_limit.map(|r| r.remaining),
                "limit": rate_limit.map(|r| r.limit),
                "reset_at": rate_limit.and_then(|r| r.reset_at_ms).map(UnixMs::to_rfc3339),
            },
            "rate_limited": live.and_then(|s| s.github.held.as_ref()).map(|h| json!({
                "kind": h.kind,
                "until": h.until_ms.to_rfc3339(),
                "limit": h.limit,
            })),
            "content_pacing": live.map(|s| s.github.content.iter().map(|c| json!({
                "scope": c.scope,
                "counted": c.counted,
                "reason": c.reason,
                "learned_at": c.learned_at_ms.map(UnixMs::to_rfc3339),
                "until": c.until_ms.map(UnixMs::to_rfc3339),
                "creations_last_minute": c.creations_minute,
                "creations_last_hour": c.creations_hour,
                "limit_per_minute": c.limit_minute,
                "limit_per_hour": c.limit_hour,
            })).collect::<Vec<_>>()),
            "apps": live.map(|s| s.github.apps.iter().map(|a| json!({
                "app_id": a.app_id,
                "registrations": a.registrations,
                "budgets": a.budgets.iter().map(|b| json!({
                    "scope": b.scope,
                    "resource": b.resource,
                    "remaining": b.remaining,
                    "limit": b.limit,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>()).unwrap_or_default(),
        },
        "jobs": {
            "queued": facts.jobs("queued"),
            "in_progress": facts.jobs("in_progress"),
            "waiting": facts.jobs("waiting"),
            "queued_per_policy": facts
                .demand
                .per_policy
                .iter()
                .map(|(policy, jobs)| (policy.clone(), json!(jobs.len())))
                .collect::<serde_json::Map<_, _>>(),
            "queued_unmatched": facts.unmatched,
        },
        "reruns": {
            "pending": facts.reruns.pending,
            "sent": facts.reruns.sent,
            "refused": facts.reruns.refused,
            "unknown": facts.reruns.unknown,
        },
        "runners": {
            "active": facts.active_runners(),
            "capacity": facts.capacity(),
            "by_state": facts.attempts_by_state,
            // Issue 40: each runner not yet cleaned up that runs in an image, with its full id.
            "images": facts.runner_images.iter().map(|r| json!({
                "runner_name": r.runner_name,
                "policy": r.policy,
                "state": r.state.as_str(),
                "image": r.image,
            })).collect::<Vec<_>>(),
        },
        "isolation": {
            "mode": facts.isolation.as_str(),
            "uids_held": facts.uids_held,
            "uid_pool": facts.uid_pool,
            "cleanup_overdue": facts.cleanup_overdue,
        },
        "waiting": facts.waiting.iter().map(|e| json!({
            "job_id": e.job_id,
            "verdict": e.verdict.as_str(),
            "summary": e.summary,
        })).collect::<Vec<_>>(),
        // The fitness gate's judgement (crate::fitness); `fit` null without a live agent.
        "host": crate::fitness::report::status_json(live.and_then(|s| s.fitness.as_ref())),
        // The host-local cache, when a policy uses it (crate::cache::report); null otherwise.
        "cache": live.and_then(|s| s.cache.as_ref()),
        "latency": crate::latency::to_json(&facts.latency),
        "runner_version": facts.runner_version.as_ref().map(|r| json!({
            "version": r.version,
            "follows_latest": r.follows_latest,
            "window": r.window(facts.now_ms.get()).as_str(),
            "window_closes_at": r.window_closes_at_ms.map(rfc3339),
            "checked_at": rfc3339(r.checked_at_ms),
        })),
        // Issue 42: this host's capacity per resource and its devices per group.
        "capacity": capacity_json(&facts.host_name, &facts.capacity),
        "fleet": facts.fleet.as_ref().map(|view| fleet_json(view, facts)),
        "scale_sets": facts
            .scale_sets
            .iter()
            .map(|set| scale_set_json(set, facts.scale_set_capacity(&set.name)))
            .collect::<Vec<_>>(),
        "degraded": degraded(facts),
    })
}

/// The fleet in `status --json`: hosts with their lease and claims, and the leaders. A host's
/// `capacity` is known for this host only: the fleet's journal holds no host's shapes.
fn fleet_json(view: &rm_journal::FleetView, facts: &Facts) -> Value {
    json!({
        "hosts": view.hosts.iter().map(|h| json!({
            "capacity": (h.host == facts.host_name)
                .then(|| capacity_json(&facts.host_name, &facts.capacity)),
            "host": h.host,
            "live": h.live,
            "labels": h.labels,
            "policies": h.policies,
            "registered_at": rfc3339(h.registered_at_ms.get()),
            "renewed_at": rfc3339(h.renewed_at_ms.get()),
            "expires_at": rfc3339(h.expires_at_ms.get()),
            "claims": h.claims.iter().map(|c| json!({
                "job_id": c.job_id,
                "policy": c.policy,
                "runner": c.runner_name,
                "job_state": c.job_state.as_str(),
                "claimed_at": rfc3339(c.claimed_at_ms.get()),
            })).collect::<Vec<_>>(),
            "runners": h.claims.iter().filter(|c| c.runner_name.is_some()).count(),
        })).collect::<Vec<_>>(),
        "leaders": view.leaders.iter().map(|l| json!({
            "role": l.role,
            "host": l.host,
            "expires_at": rfc3339(l.expires_at_ms.get()),
        })).collect::<Vec<_>>(),
    })
}

/// The fleet in `status`'s text: one line for the fleet, one per host.
fn render_fleet(view: &rm_journal::FleetView, out: &mut String) {
    let live = view.hosts.iter().filter(|h| h.live).count();
    let claims: usize = view.hosts.iter().map(|h| h.claims.len()).sum();
    let leaders: Vec<String> = view
        .leaders
        .iter()
        .map(|l| format!("{} by {}", l.role, l.host))
        .collect();
    let _ = writeln!(
        out,
        "{:<9} {live} of {} hosts live; {claims} claims{}",
        "fleet",
        view.hosts.len(),
        if leaders.is_empty() {
            String::new()
        } else {
            format!("; {}", leaders.join(", "))
        }
    );
    let age = |at: rm_vocab::UnixMs| ago(view.now_ms.duration_since(at));
    for host in &view.hosts {
        let text = if host.live {
            let running = host
                .claims
                .iter()
                .filter(|c| c.runner_name.is_some())
                .count();
            format!(
                "live, renewed {} ago; {} claims ({running} with a runner that took its job)",
                age(host.renewed_at_ms),
                host.claims.len()
            )
        } else {
            format!(
                "DEAD: its lease expired {} ago; its claims went to the other hosts",
                age(host.expires_at_ms)
            )
        };
        let _ = writeln!(out, "  {:<7} {text}", host.host);
    }
}

fn ago(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// What needs a person, one sentence each with what to do; empty when all is well.
pub(crate) fn degraded(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    // A pinned runner version GitHub's window is closing on (rm_runner::package::window).
    found.extend(
        facts
            .runner_version
            .as_ref()
            .and_then(|r| r.warning(facts.now_ms.get())),
    );
    found.extend(crate::fitness::report::degraded(
        facts.live().and_then(|s| s.fitness.as_ref()),
    ));
    // Cached policies whose runners run uncached: said, never silent.
    if let Some(redirect) = facts
        .live()
        .and_then(|s| s.cache.as_ref())
        .and_then(|c| c.redirect.as_ref())
        .filter(|r| !r.active)
    {
        found.push(format!(
            "The host-local cache is not used: {}.",
            redirect
                .why
                .as_deref()
                .unwrap_or("the runner package does not take the redirect")
        ));
    }
    if facts.isolation == crate::config::Isolation::None {
        found.push(format!(
            "Runners are not isolated (host.isolation = \"none\"): {}.",
            crate::isolation::NONE_REACHES
        ));
    }
    if facts.isolation == crate::config::Isolation::User
        && facts.network == crate::config::Network::Host
    {
        found.push(format!(
            "Runners share the host's network (host.network = \"host\"): {}.",
            crate::isolation::HOST_NETWORK_REACHES
        ));
    }
    if facts.isolation == crate::config::Isolation::User
        && facts.uid_pool > 0
        && facts.uids_held >= facts.uid_pool
    {
        found.push(format!(
            "Every runner uid of host.runner_uids ({}) is held by an attempt not yet cleaned up: no \
             runner can start until one is. Fix the cleanup the agent's log names (`cannot clean \
             up after the runner`), or give host.runner_uids more uids.",
            facts.uid_pool
        ));
    }
    if facts.cleanup_overdue > 0 {
        found.push(format!(
            "{} runner(s) concluded more than {} ago are still not cleaned up: their uid stays \
             held and cleanup is retried with back-off. The agent's log says why (`cannot clean \
             up after the runner`); `rm-agent runners` lists them.",
            facts.cleanup_overdue,
            ago(CLEANUP_OVERDUE)
        ));
    }
    match facts.agent {
        Liveness::Running { .. } => {}
        Liveness::Silent { pid, age } => found.push(format!(
            "rm-agent (pid {pid}) has not published its status for {}: it may be stuck. Check \
             its log, and restart it if it stays silent.",
            ago(age)
        )),
        Liveness::ReceiverOnly { pid } => found.push(format!(
            "Only an rm-agent that runs no runners holds the data directory (pid {pid}, e.g. \
             `rm-agent receive`): deliveries are journalled but no job gets a runner and nothing \
             polls. Stop it and start `rm-agent run`."
        )),
        Liveness::Stopped { last_seen } => found.push(format!(
            "No rm-agent is running for {}{}: queued jobs get no runner. Start it with \
             `rm-agent run` (or `systemctl start rm-agent`).",
            facts.data_dir,
            last_seen.map_or_else(String::new, |age| format!(
                " (its last status is {} old)",
                ago(age)
            )),
        )),
    }
    if let Some(live) = facts.live() {
        let polling = &live.polling;
        let webhooks = &polling.webhooks;
        if webhooks.intake && !webhooks.trusted {
            found.push(match webhooks.reason.as_str() {
                "unannounced_job" => "Webhooks are not trusted: polling found queued jobs that \
                    no delivery announced, so deliveries are being lost. Check the App's webhook \
                    URL and its Recent Deliveries page, and that GitHub can reach the receiver; \
                    polling runs at the full schedule until deliveries arrive again."
                    .to_owned(),
                "failed_delivery" => "Webhooks are not trusted: GitHub's delivery log shows \
                    deliveries that failed to reach this host (they are being redelivered). \
                    Check that GitHub can reach the receiver (DNS, TLS proxy, firewall) and that \
                    it answers 2xx; polling runs at the full schedule meanwhile."
                    .to_owned(),
                other => format!(
                    "Webhooks are not trusted ({other}); polling runs at the full schedule."
                ),
            });
        }
        if let Some(relay) = live.relay.as_ref().filter(|r| !r.connected) {
            found.push(format!(
                "The relay subscription is down ({}). Deliveries wait at the relay and are \
                 replayed when the agent reconnects (it retries with back-off); polling finds \
                 jobs meanwhile. Check relay.url, the token and that this host can reach the relay.",
                relay.problem.as_deref().unwrap_or("not connected yet")
            ));
        }
        if let Some(held) = &live.github.held
            && held.until_ms > facts.now_ms
        {
            found.push(format!(
                "GitHub's {} rate limit holds every request of the installation for {}{}: no \
                 runner is registered or removed until then, and the jobs waiting are served \
                 after it. Other tools using the same App installation add to it.",
                held.kind,
                ago(held.until_ms.duration_since(facts.now_ms)),
                held.limit
                    .as_ref()
                    .map_or_else(String::new, |l| format!(" ({l})"))
            ));
        }
        if let Some(offline) = &polling.offline {
            found.push(format!("{}.", offline.description));
        } else if !live.github.reachable
            && let Some(at) = live.github.last_contact_at_ms
        {
            found.push(format!(
                "GitHub did not answer the last request (its last answer was {} ago); the \
                 agent retries with back-off. Check this host's network and proxy settings.",
                ago(facts.age_of(at))
            ));
        }
        for unreadable in &polling.unreadable_targets {
            found.push(format!(
                "Polling cannot read the target {} ({}): jobs there are found only through \
                 webhooks until it can. It is tried again at every active interval; `rm-agent \
                 check` verifies the App's access to it, and the agent's log has GitHub's answer \
                 (`polling: target unreadable`).",
                unreadable.target, unreadable.reason
            ));
        }
        // A target GitHub answered unreadably is said above; "refused" would be wrong for it.
        let unreadable_only = !polling.unreadable_targets.is_empty()
            && polling.last_failure.as_deref() == Some("failed");
        match polling.pace.as_str() {
            "blocked" if unreadable_only => {}
            "blocked" => found.push(format!(
                "Polling is blocked: GitHub refused the App's requests ({}). Run `rm-agent \
                 check` to find the credential or permission to fix.",
                polling.last_failure.as_deref().unwrap_or("refused")
            )),
            "rate_limited_secondary" => found.push(
                "GitHub's secondary rate limit was hit: polling waits as long as GitHub asked. \
                 Other tools using the same App installation add to it."
                    .to_owned(),
            ),
            _ => {}
        }
        if let Some(rate) = polling.rate_limit
            && rate.limit > 0
            && rate.remaining.saturating_mul(100)
                < rate.limit.saturating_mul(LOW_RATE_LIMIT_PERCENT)
        {
            let reset = rate.reset_at_ms.map_or_else(String::new, |at| {
                format!(", resets in {}", ago(at.duration_since(facts.now_ms)))
            });
            let what = if rate.remaining == 0 {
                "is used up: no request is sent until it resets"
            } else {
                "is low: polling is stretched to last until it resets"
            };
            found.push(format!(
                "GitHub's rate limit {what} ({} of {} left{reset}). Every host and tool using \
                 the same App installation shares it.",
                rate.remaining, rate.limit
            ));
        }
    }
    let failing = facts
        .recent_outcomes
        .iter()
        .take_while(|(o, _)| matches!(o, AttemptOutcome::Failed | AttemptOutcome::Orphaned))
        .count();
    if failing >= FAILING_RUNNERS {
        let latest = facts
            .recent_outcomes
            .first()
            .and_then(|(_, reason)| reason.as_deref())
            .unwrap_or("no reason recorded");
        found.push(format!(
            "The last {failing} runners failed (latest: {latest}). `rm-agent runners` shows \
             each; `rm-agent check` verifies the runner package, the App's permission and the \
             runner group."
        ));
    }
    for (job, policies) in &facts.demand.overlapping {
        found.push(format!(
            "Job {job} matches the policies {}: it gets no runner. Make their labels distinct.",
            policies.join(" and ")
        ));
    }
    if !facts.demand.unresolvable.is_empty() {
        found.push(format!(
            "{} queued job(s) have a label that is an unevaluated expression (`${{{{ ... }}}}`): \
             no policy serves them. Check the workflow's `runs-on`.",
            facts.demand.unresolvable.len()
        ));
    }
    if facts.rejected > 0 {
        found.push(format!(
            "{} journalled deliveries could not be read (outcome rejected): `rm-agent \
             deliveries` lists them, and `rm-agent deliveries replay GUID` applies one after an \
             upgrade that can read it.",
            facts.rejected
        ));
    }
    found
}

/// The report for people.
pub(crate) fn render(facts: &Facts) -> String {
    let mut out = String::new();
    let live = facts.live();
    let mut line = |label: &str, text: String| {
        let _ = writeln!(out, "{label:<9} {text}");
    };
    line(
        "agent",
        match facts.agent {
            Liveness::Running { pid } => format!("running (pid {pid})"),
            Liveness::Silent { pid, age } => format!("silent for {} (pid {pid})", ago(age)),
            Liveness::ReceiverOnly { pid } => format!("receiver only (pid {pid})"),
            Liveness::Stopped { .. } => "not running".to_owned(),
        },
    );

    let last_delivery = facts.last_delivery_at_ms.map_or_else(
        || "none yet".to_owned(),
        |at| format!("{} ago", ago(facts.age_of(at))),
    );
    let journalled = format!(
        "last delivery {last_delivery}; {} journalled, {} rejected",
        facts.deliveries, facts.rejected
    );
    let relay = match live.and_then(|s| s.relay.as_ref()) {
        Some(r) if r.connected => format!(
            "; relay connected ({} relayed, {} refused)",
            r.journalled, r.refused
        ),
        Some(_) => "; relay DISCONNECTED".to_owned(),
        None => String::new(),
    };
    line(
        "webhooks",
        match live.map(|s| &s.polling.webhooks) {
            Some(w) if !w.intake => {
                format!("no receiver or relay configured: jobs are found by polling; {journalled}")
            }
            Some(w) if w.trusted => format!("healthy; {journalled}{relay}"),
            Some(w) => format!("NOT trusted ({}); {journalled}{relay}", w.reason),
            None => format!("unknown (no agent); {journalled}"),
        },
    );

    line(
        "polling",
        match live {
            Some(s) => {
                let next = facts.next_poll_in_ms().map_or_else(
                    || "no poll scheduled".to_owned(),
                    |ms| {
                        format!(
                            "next poll in {}",
                            ago(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
                        )
                    },
                );
                let unreadable = match s.polling.unreadable_targets.as_slice() {
                    [] => String::new(),
                    targets => format!(
                        "; UNREADABLE: {}",
                        targets
                            .iter()
                            .map(|t| t.target.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                format!(
                    "{}; {next}; {} charged and {} uncharged requests in the last hour{unreadable}",
                    s.polling.pace,
                    s.polling.requests_last_hour.charged,
                    s.polling.requests_last_hour.uncharged
                )
            }
            None => "not polling (no agent)".to_owned(),
        },
    );

    let last_contact = facts
        .snapshot
        .as_ref()
        .and_then(|s| s.github.last_contact_at_ms)
        .map_or_else(
            || "no contact yet".to_owned(),
            |at| format!("last contact {} ago", ago(facts.age_of(at))),
        );
    line(
        "github",
        match live {
            Some(s) => {
                let reach = if s.polling.offline.is_some()
                    || (!s.github.reachable && s.github.last_contact_at_ms.is_some())
                {
                    "UNREACHABLE"
                } else {
                    "reachable"
                };
                let rate = s.polling.rate_limit.map_or_else(
                    || "rate limit not known yet".to_owned(),
                    |r| format!("rate limit {} of {} left", r.remaining, r.limit),
                );
                let held = s.github.held.as_ref().map_or_else(String::new, |h| {
                    format!(
                        "; HELD by a {} rate limit for {}",
                        h.kind,
                        ago(h.until_ms.duration_since(facts.now_ms))
                    )
                });
                let content: Vec<String> = s
                    .github
                    .content
                    .iter()
                    .filter(|c| c.counted)
                    .map(|c| match c.until_ms {
                        Some(until) => format!(
                            "{} paced as content (learned) until {}",
                            c.scope,
                            until.to_rfc3339()
                        ),
                        None => format!("{} paced as content (cautious)", c.scope),
                    })
                    .collect();
                let content = if content.is_empty() {
                    String::new()
                } else {
                    format!("; {}", content.join(", "))
                };
                format!("{reach}; {last_contact}; {rate}{held}{content}")
            }
            None => last_contact,
        },
    );
    // Several Apps share the registrations: each one's share and budgets.
    if let Some(s) = live.filter(|s| s.github.apps.len() > 1) {
        for app in &s.github.apps {
            line("  app", app_line(app));
        }
    }

    let per_policy: Vec<String> = facts
        .demand
        .per_policy
        .iter()
        .map(|(policy, jobs)| format!("{policy} {}", jobs.len()))
        .collect();
    let mut jobs = format!(
        "{} queued ({}), {} in progress",
        facts.jobs("queued"),
        if per_policy.is_empty() {
            "no policy".to_owned()
        } else {
            per_policy.join(", ")
        },
        facts.jobs("in_progress")
    );
    if facts.unmatched > 0 {
        let _ = write!(jobs, "; {} queued match no policy here", facts.unmatched);
    }
    line("jobs", jobs);
    if let Some(waiting) = crate::explain::waiting_summary(&facts.waiting) {
        line(
            "waiting",
            format!("{waiting} (`rm-agent explain JOB_ID` says why)"),
        );
    }
    line("latency", crate::latency::render(&facts.latency));
    if let Some(r) = &facts.runner_version {
        line(
            "runner",
            format!(
                "v{}{}, GitHub asked {} ago",
                r.version,
                if r.follows_latest {
                    " (follows latest)"
                } else {
                    ""
                },
                ago(facts.age_of(UnixMs::new(r.checked_at_ms)))
            ),
        );
    }

    let by_state: Vec<String> = AttemptState::ALL
        .iter()
        .filter_map(|s| {
            let n = facts
                .attempts_by_state
                .get(s.as_str())
                .copied()
                .unwrap_or(0);
            (n > 0).then(|| format!("{} {n}", s.as_str()))
        })
        .collect();
    line(
        "runners",
        format!(
            "{} active of {}{}",
            facts.active_runners(),
            facts.capacity(),
            if by_state.is_empty() {
                String::new()
            } else {
                format!(" ({})", by_state.join(", "))
            }
        ),
    );

    if let Some(images) = images_line(&facts.runner_images) {
        line("images", images);
    }
    let (resources, devices) = capacity_lines(&facts.capacity);
    line("capacity", resources);
    if let Some(devices) = devices {
        line("devices", devices);
    }

    line(
        "isolation",
        match facts.isolation {
            crate::config::Isolation::User => format!(
                "user: a uid, a cgroup and a private /tmp per runner; uids {} of {} held",
                facts.uids_held, facts.uid_pool
            ),
            crate::config::Isolation::None => {
                "NONE: runners run as the agent's own user".to_owned()
            }
        },
    );

    // An agent publishes its fitness gate's judgement once it has checked (crate::fitness).
    if let Some(fitness) = live.and_then(|s| s.fitness.as_ref()) {
        line("host", crate::fitness::report::status_line(Some(fitness)));
    }
    if let Some(cache) = live.and_then(|s| s.cache.as_ref()) {
        line("cache", crate::cache::report::status_line(cache));
    }

    for set in &facts.scale_sets {
        let _ = writeln!(
            out,
            "{:<9} {}",
            "scale set",
            render_scale_set(set, facts.now_ms, facts.scale_set_capacity(&set.name))
        );
    }
    if let Some(fleet) = &facts.fleet {
        render_fleet(fleet, &mut out);
    }

    let problems = degraded(facts);
    if problems.is_empty() {
        out.push_str("\nAll is well.\n");
    } else {
        out.push_str("\nNeeds attention:\n");
        for problem in problems {
            let _ = writeln!(out, "  - {problem}");
        }
    }
    out
}

/// One App's line: its registrations and each scope's core budget.
fn app_line(app: &crate::status_file::AppBudget) -> String {
    let budgets: Vec<String> = app
        .budgets
        .iter()
        .filter(|b| b.resource == "core")
        .map(|b| match (b.remaining, b.limit) {
            (Some(remaining), Some(limit)) => format!("{} {remaining} of {limit} left", b.scope),
            _ => format!("{} not known yet", b.scope),
        })
        .collect();
    let budgets = if budgets.is_empty() {
        "no request yet".to_owned()
    } else {
        budgets.join(", ")
    };
    format!(
        "{}: {} registrations; {budgets}",
        app.app_id, app.registrations
    )
}

/// Of the attempts not cleaned: how many hold a runner uid, and how many concluded before
/// `overdue_before` are still not released (their runtime removal keeps failing). A released
/// attempt (its runtime removed, its registration waiting for GitHub) holds no uid and is not
/// overdue: its uid already serves the pool again.
fn holding(uncleaned: &[rm_journal::AttemptRecord], overdue_before: UnixMs) -> (usize, usize) {
    let holds = |a: &&rm_journal::AttemptRecord| a.released_at_ms.is_none();
    let uids_held = uncleaned
        .iter()
        .filter(holds)
        .filter(|a| a.uid.is_some())
        .count();
    let overdue = uncleaned
        .iter()
        .filter(holds)
        .filter(|a| a.state.is_terminal() && a.state_changed_at_ms < overdue_before)
        .count();
    (uids_held, overdue)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status_file::{Github, Host, Offline, Polling, RateLimit, Requests, Webhooks};
    use rm_vocab::JobId;

    const NOW: i64 = 1_700_000_100_000;

    fn snapshot() -> Snapshot {
        Snapshot {
            version: 1,
            written_at_ms: UnixMs::new(NOW - 2_000),
            pid: 42,
            polling: Polling {
                pace: "reconciling".to_owned(),
                throttled: false,
                next_poll_at_ms: Some(UnixMs::new(NOW + 90_000)),
                requests_last_hour: Requests {
                    charged: 7,
                    uncharged: 11,
                },
                rate_limit: Some(RateLimit {
                    remaining: 4900,
                    limit: 5000,
                    reset_at_ms: Some(UnixMs::new(NOW + 600_000)),
                }),
                offline: None,
                webhooks: Webhooks {
                    intake: true,
                    trusted: true,
                    reason: "deliveries_trusted".to_owned(),
                    evidence_at_ms: None,
                },
                last_failure: None,
                unannounced_jobs: 0,
                unreadable_targets: Vec::new(),
            },
            github: Github {
                reachable: true,
                last_contact_at_ms: Some(UnixMs::new(NOW - 3_000)),
                held: None,
                content: Vec::new(),
                apps: Vec::new(),
            },
            host: Host { max_runners: 6 },
            relay: None,
            fitness: None,
            allocation: None,
            cache: None,
        }
    }

    fn facts() -> Facts {
        let mut demand = Demand::default();
        demand
            .per_policy
            .insert("linux".to_owned(), vec![JobId::new(1), JobId::new(2)]);
        demand.per_policy.insert("gpu".to_owned(), vec![]);
        Facts {
            now_ms: UnixMs::new(NOW),
            data_dir: "/var/lib/rm-agent".to_owned(),
            agent: Liveness::Running { pid: 42 },
            snapshot: Some(snapshot()),
            deliveries: 10,
            rejected: 0,
            last_delivery_at_ms: Some(UnixMs::new(NOW - 60_000)),
            jobs_by_state: [("queued", 3), ("in_progress", 1), ("completed", 9)]
                .map(|(s, n)| (s.to_owned(), n))
                .into(),
            attempts_by_state: [("busy", 1), ("idle", 1), ("cleaned", 5)]
                .map(|(s, n)| (s.to_owned(), n))
                .into(),
            reruns: rm_journal::RerunCounts {
                pending: 0,
                sent: 2,
                refused: 1,
                unknown: 0,
            },
            demand,
            unmatched: 1,
            recent_outcomes: vec![(AttemptOutcome::CompletedJob, None)],
            configured_capacity: 4,
            isolation: crate::config::Isolation::User,
            network: crate::config::Network::Private,
            uids_held: 0,
            uid_pool: 64,
            cleanup_overdue: 0,
            runner_images: Vec::new(),
            waiting: Vec::new(),
            latency: crate::latency::Latency::default(),
            runner_version: None,
            fleet: None,
            scale_sets: Vec::new(),
            host_name: "builder-01".to_owned(),
            capacity: HostUse {
                cpu_millis: Usage {
                    total: Some(8000),
                    used: 2500,
                },
                memory: Usage {
                    total: Some(32 << 30),
                    used: 8 << 30,
                },
                disk: Usage {
                    total: None,
                    used: 40 << 30,
                },
                groups: BTreeMap::new(),
            },
        }
    }

    #[test]
    fn the_json_has_the_contract_shape_and_values() {
        let value = to_json(&facts());
        // CONTRACT §3: every key of the contract's shape, with these values.
        assert_eq!(
            value["webhooks"]["last_delivery_at"],
            "2023-11-14T22:14:00.000Z"
        );
        assert_eq!(value["webhooks"]["deliveries"], 10);
        assert_eq!(value["webhooks"]["rejected"], 0);
        assert_eq!(value["webhooks"]["healthy"], true);
        assert_eq!(value["polling"]["pace"], "reconciling");
        assert_eq!(value["polling"]["next_poll_in_ms"], 90_000);
        assert_eq!(value["github"]["reachable"], true);
        assert_eq!(
            value["github"]["last_contact_at"],
            "2023-11-14T22:14:57.000Z"
        );
        assert_eq!(
            value["github"]["rate_limit"],
            json!({"remaining": 4900, "limit": 5000, "reset_at": "2023-11-14T22:25:00.000Z"})
        );
        assert_eq!(value["jobs"]["queued"], 3);
        assert_eq!(value["jobs"]["in_progress"], 1);
        assert_eq!(
            value["reruns"],
            json!({"pending": 0, "sent": 2, "refused": 1, "unknown": 0})
        );
        // The running agent's capacity wins over the configuration's.
        assert_eq!(
            value["runners"],
            json!({
                "active": 2,
                "capacity": 6,
                "by_state": {"busy": 1, "idle": 1, "cleaned": 5},
                "images": [],
            })
        );
        // Extras beside the contract.
        assert_eq!(value["agent"]["running"], true);
        assert_eq!(value["agent"]["pid"], 42);
        assert_eq!(
            value["jobs"]["queued_per_policy"],
            json!({"gpu": 0, "linux": 2})
        );
        assert_eq!(
            value["polling"]["requests_last_hour"],
            json!({"charged": 7, "uncharged": 11})
        );
        assert_eq!(value["degraded"], json!([]));
    }

    #[test]
    fn a_stopped_agent_shows_no_live_values_and_says_so() {
        let mut f = facts();
        f.agent = Liveness::Stopped {
            last_seen: Some(Duration::from_secs(3600)),
        };
        let value = to_json(&f);
        assert_eq!(value["agent"]["running"], false);
        assert_eq!(value["agent"]["pid"], Value::Null);
        assert_eq!(value["webhooks"]["healthy"], false);
        assert_eq!(value["polling"]["pace"], Value::Null);
        assert_eq!(value["polling"]["next_poll_in_ms"], Value::Null);
        assert_eq!(value["github"]["reachable"], Value::Null);
        assert_eq!(
            value["github"]["rate_limit"],
            json!({"remaining": null, "limit": null, "reset_at": null})
        );
        // History stays: the last contact, and the journal's counts.
        assert_eq!(
            value["github"]["last_contact_at"],
            "2023-11-14T22:14:57.000Z"
        );
        assert_eq!(value["jobs"]["queued"], 3);
        assert_eq!(value["runners"]["capacity"], 4);
        let problems = degraded(&f);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "No rm-agent is running for /var/lib/rm-agent (its last status is 1h old)"
            ),
            "{}",
            problems[0]
        );
        let text = render(&f);
        assert!(text.contains("agent     not running\n"), "{text}");
        assert!(
            text.contains("Needs attention:\n  - No rm-agent is running"),
            "{text}"
        );
    }

    #[test]
    fn a_healthy_host_reads_well() {
        let text = render(&facts());
        assert_eq!(
            text,
            "agent     running (pid 42)\n\
             webhooks  healthy; last delivery 1m ago; 10 journalled, 0 rejected\n\
             polling   reconciling; next poll in 1m 30s; 7 charged and 11 uncharged requests in the last hour\n\
             github    reachable; last contact 3s ago; rate limit 4900 of 5000 left\n\
             jobs      3 queued (gpu 0, linux 2), 1 in progress; 1 queued match no policy here\n\
             latency   no job started on this host in the last 1h\n\
             runners   2 active of 6 (idle 1, busy 1, cleaned 5)\n\
             capacity  cpu 2.5 of 8 used, 5.5 free; memory 8.0 GiB of 32.0 GiB used, 24.0 GiB free; disk 40.0 GiB used (unbounded)\n\
             isolation user: a uid, a cgroup and a private /tmp per runner; uids 0 of 64 held\n\
             \n\
             All is well.\n"
        );
    }

    /// Each scale set: a line with its session, last message, statistics and what holds it, and
    /// `scale_sets` in the JSON; one never listened to yet says so.
    #[test]
    fn each_scale_set_shows_its_session_last_message_statistics_capacity_and_note() {
        let mut facts = facts();
        // The running agent's allocation pass published the first scale set's capacity only.
        let mut allocation = crate::executor::allocate::published::AllocationMemory::default();
        allocation
            .scale_set_capacity
            .insert("acme-big".to_owned(), 2);
        facts.snapshot.as_mut().expect("a snapshot").allocation = Some(allocation);
        facts.scale_sets = vec![
            ScaleSetFacts {
                name: "acme-big".into(),
                policy: "big".into(),
                enterprise: None,
                record: Some(rm_journal::ScaleSetRecord {
                    name: "acme-big".into(),
                    scale_set_id: Some(7),
                    session_id: Some("s-1".into()),
                    last_message_id: 100_004,
                    last_message_at: Some(UnixMs::new(NOW - 2_000)),
                    statistics: Some(rm_journal::ScaleSetStatistics {
                        assigned: 3,
                        running: 1,
                        idle: 2,
                        ..Default::default()
                    }),
                    statistics_at: Some(UnixMs::new(NOW - 2_000)),
                    messages: 12,
                    generation: 0,
                    note: Some("backing off after 2 failure(s)".into()),
                    note_at: Some(UnixMs::new(NOW - 1_000)),
                }),
            },
            ScaleSetFacts {
                name: "acme-gpu".into(),
                policy: "gpu".into(),
                enterprise: None,
                record: None,
            },
            ScaleSetFacts {
                name: "octo-big".into(),
                policy: "octo".into(),
                enterprise: Some("octo-corp".into()),
                record: None,
            },
        ];
        let text = render(&facts);
        assert!(
            text.contains(
                "scale set acme-big (policy big): session s-1, last message 100004 2s ago; 3 assigned, 1 running, 2 runners idle; capacity 2; backing off after 2 failure(s)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("scale set acme-gpu (policy gpu): not listened to yet\n"),
            "{text}"
        );
        // An enterprise scale set names its enterprise.
        assert!(
            text.contains(
                "scale set octo-big (policy octo, enterprise octo-corp): not listened to yet\n"
            ),
            "{text}"
        );
        let json = to_json(&facts);
        let set = &json["scale_sets"][0];
        assert_eq!(set["scale_set_id"], 7);
        assert_eq!(set["session_id"], "s-1");
        assert_eq!(set["last_message_id"], 100_004);
        assert_eq!(set["messages"], 12);
        assert_eq!(set["statistics"]["assigned"], 3);
        assert_eq!(set["statistics"]["idle_runners"], 2);
        assert_eq!(set["note"], "backing off after 2 failure(s)");
        assert_eq!(set["capacity"], 2);
        assert_eq!(json["scale_sets"][1]["session_id"], serde_json::Value::Null);
        assert_eq!(json["scale_sets"][1]["capacity"], serde_json::Value::Null);
        // No agent running: no capacity is said.
        facts.agent = Liveness::Stopped { last_seen: None };
        assert!(
            render(&facts).contains("2 runners idle; backing off"),
            "{}",
            render(&facts)
        );
        assert_eq!(json["scale_sets"][0]["enterprise"], serde_json::Value::Null);
        assert_eq!(json["scale_sets"][2]["enterprise"], "octo-corp");
    }

    /// With several Apps, each App's registrations and budgets: a line each in the table, and
    /// `github.apps` in the JSON (one App: the JSON only).
    #[test]
    fn several_apps_show_their_registrations_and_budgets() {
        use crate::status_file::{AppBudget, ScopeBudget};
        let app = |app_id: u64, registrations: u64, scope: &str| AppBudget {
            app_id,
            registrations,
            budgets: vec![ScopeBudget {
                scope: scope.to_owned(),
                resource: "core".to_owned(),
                remaining: Some(4000),
                limit: Some(5000),
            }],
        };
        let mut f = facts();
        if let Some(s) = f.snapshot.as_mut() {
            s.github.apps = vec![app(1, 7, "installation:10")];
        }
        assert!(!render(&f).contains("\n  app "), "{}", render(&f));
        assert_eq!(to_json(&f)["github"]["apps"][0]["registrations"], 7);
        if let Some(s) = f.snapshot.as_mut() {
            s.github.apps.push(app(2, 5, "installation:20"));
        }
        let text = render(&f);
        assert!(
            text.contains("\n  app     2: 5 registrations; installation:20 4000 of 5000 left\n"),
            "{text}"
        );
        let json = to_json(&f);
        assert_eq!(json["github"]["apps"][1]["app_id"], 2);
        assert_eq!(
            json["github"]["apps"][1]["budgets"][0]["scope"],
            "installation:20"
        );
    }

    #[test]
    fn runners_without_isolation_and_cleanups_that_keep_failing_need_attention() {
        let mut f = facts();
        f.isolation = crate::config::Isolation::None;
        let problems = degraded(&f);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("not isolated"), "{}", problems[0]);
        assert!(problems[0].contains("private key"), "{}", problems[0]);
        let text = render(&f);
        assert!(text.contains("isolation NONE"), "{text}");
        let json = to_json(&f);
        assert_eq!(json["isolation"]["mode"], "none");

        let mut f = facts();
        f.cleanup_overdue = 2;
        f.uids_held = 3;
        let problems = degraded(&f);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("2 runner(s) concluded"),
            "{}",
            problems[0]
        );
        assert_eq!(to_json(&f)["isolation"]["uids_held"], 3);
    }

    #[test]
    fn each_degraded_condition_is_said_with_what_to_do() {
        let mut f = facts();
        {
            let s = f.snapshot.as_mut().unwrap();
            s.polling.webhooks.trusted = false;
            s.polling.webhooks.reason = "unannounced_job".to_owned();
            s.polling.rate_limit = Some(RateLimit {
                remaining: 400,
                limit: 5000,
                reset_at_ms: Some(UnixMs::new(NOW + 1_800_000)),
            });
            s.polling.offline = Some(Offline {
                description: "GitHub has been unreachable for 2h (9 failed polls)".to_owned(),
                since_ms: UnixMs::new(NOW - 7_200_000),
                outlasted_the_queue: false,
            });
            s.github.reachable = false;
        }
        f.recent_outcomes = vec![
            (
                AttemptOutcome::Failed,
                Some("the runner exited at start".to_owned()),
            ),
            (AttemptOutcome::Failed, None),
            (AttemptOutcome::Orphaned, None),
            (AttemptOutcome::CompletedJob, None),
        ];
        f.demand.overlapping = vec![(JobId::new(7), vec!["linux".to_owned(), "gpu".to_owned()])];
        f.rejected = 2;
        let problems = degraded(&f);
        let expect = [
            "Webhooks are not trusted: polling found queued jobs that no delivery announced",
            "GitHub has been unreachable for 2h (9 failed polls).",
            "GitHub's rate limit is low: polling is stretched to last until it resets (400 of 5000 left, resets in 30m)",
            "The last 3 runners failed (latest: the runner exited at start)",
            "Job 7 matches the policies linux and gpu: it gets no runner",
            "2 journalled deliveries could not be read",
        ];
        assert_eq!(problems.len(), expect.len(), "{problems:#?}");
        for (problem, start) in problems.iter().zip(expect) {
            assert!(
                problem.starts_with(start),
                "{problem:?} should start {start:?}"
            );
        }
        assert!(render(&f).contains("github    UNREACHABLE; last contact 3s ago"));

        // Two failures in a row are not yet a pattern; an exhausted budget says so.
        f.recent_outcomes.truncate(2);
        f.recent_outcomes.push((AttemptOutcome::IdleExit, None));
        let s = f.snapshot.as_mut().unwrap();
        s.polling.rate_limit = Some(RateLimit {
            remaining: 0,
            limit: 5000,
            reset_at_ms: None,
        });
        s.polling.offline = None;
        s.polling.pace = "blocked".to_owned();
        s.polling.last_failure = Some("unauthorized".to_owned());
        let problems = degraded(&f).join("\n");
        assert!(!problems.contains("runners failed"), "{problems}");
        assert!(problems.contains("GitHub's rate limit is used up: no request is sent until it resets (0 of 5000 left)"), "{problems}");
        assert!(
            problems
                .contains("GitHub did not answer the last request (its last answer was 3s ago)"),
            "{problems}"
        );
        assert!(problems.contains("Polling is blocked: GitHub refused the App's requests (unauthorized). Run `rm-agent check`"), "{problems}");
    }

    #[test]
    fn an_agent_that_stopped_publishing_or_only_receives_is_named() {
        let mut f = facts();
        f.agent = Liveness::Silent {
            pid: 42,
            age: Duration::from_secs(125),
        };
        let problems = degraded(&f);
        assert!(
            problems[0].starts_with("rm-agent (pid 42) has not published its status for 2m 5s")
        );
        f.agent = Liveness::ReceiverOnly { pid: 9 };
        assert!(degraded(&f)[0].contains("pid 9, e.g. `rm-agent receive`"));
        // Without intake, untrusted webhooks are the configuration, not a fault.
        f.agent = Liveness::Running { pid: 42 };
        let s = f.snapshot.as_mut().unwrap();
        s.polling.webhooks = Webhooks {
            intake: false,
            trusted: false,
            reason: "no_intake".to_owned(),
            evidence_at_ms: None,
        };
        assert!(degraded(&f).is_empty());
        assert_eq!(to_json(&f)["webhooks"]["healthy"], false);
        assert!(render(&f).contains("webhooks  no receiver or relay configured"));
    }

    #[test]
    fn the_cache_is_said_and_an_unused_one_needs_attention() {
        let mut f = facts();
        assert_eq!(to_json(&f)["cache"], Value::Null);
        let mut report = crate::cache::report::CacheReport {
            hits: 1,
            entries: 1,
            bytes_stored: 1 << 20,
            redirect: Some(crate::cache::report::Redirect {
                package: "0123456789ab".to_owned(),
                active: true,
                why: None,
            }),
            ..Default::default()
        };
        f.snapshot.as_mut().unwrap().cache = Some(report.clone());
        assert_eq!(to_json(&f)["cache"]["hits"], 1);
        let text = render(&f);
        assert!(
            text.contains("cache     active (runner package 0123456789ab)"),
            "{text}"
        );
        assert!(degraded(&f).is_empty(), "{:?}", degraded(&f));
        report.redirect = Some(crate::cache::report::Redirect {
            package: "0123456789ab".to_owned(),
            active: false,
            why: Some("runner package 0123456789ab does not fit the cache redirect".to_owned()),
        });
        f.snapshot.as_mut().unwrap().cache = Some(report);
        assert!(
            degraded(&f)
                .iter()
                .any(|d| d.starts_with("The host-local cache is not used: runner package")),
            "{:?}",
            degraded(&f)
        );
    }

    #[test]
    fn an_unfit_host_is_said_in_json_text_and_needs_attention() {
        let mut f = facts();
        assert_eq!(to_json(&f)["host"]["fit"], Value::Null);
        f.snapshot.as_mut().unwrap().fitness = Some(crate::fitness::Fitness {
            checked_at_ms: NOW,
            problems: vec![crate::fitness::FitnessProblem {
                code: "disk_space".to_owned(),
                message: "the runner root /r has 1.0 MiB free".to_owned(),
            }],
        });
        let json = to_json(&f);
        assert_eq!(json["host"]["fit"], false);
        assert_eq!(json["host"]["problems"][0]["code"], "disk_space");
        let text = render(&f);
        assert!(
            text.contains("host      UNFIT (disk_space): no new runner is registered"),
            "{text}"
        );
        assert!(
            text.contains("  - Host unfit (disk_space): the runner root /r has 1.0 MiB free."),
            "{text}"
        );
        // A stopped agent's last judgement is not the host's now.
        f.agent = Liveness::Stopped { last_seen: None };
        assert_eq!(to_json(&f)["host"]["fit"], Value::Null);
        assert!(!render(&f).contains("UNFIT"));
    }

    #[test]
    fn a_relay_subscription_is_shown_and_its_outage_named() {
        let mut f = facts();
        f.snapshot.as_mut().unwrap().relay = Some(crate::status_file::Relay {
            connected: true,
            last_event_id: Some(17),
            journalled: 5,
            refused: 1,
            problem: None,
        });
        assert!(degraded(&f).is_empty(), "{:?}", degraded(&f));
        assert_eq!(to_json(&f)["webhooks"]["relay"]["last_event_id"], 17);
        assert!(render(&f).contains("relay connected (5 relayed, 1 refused)"));

        let relay = f.snapshot.as_mut().unwrap().relay.as_mut().unwrap();
        relay.connected = false;
        relay.problem = Some("cannot reach the relay".to_owned());
        let problems = degraded(&f);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("The relay subscription is down (cannot reach the relay)."),
            "{problems:?}"
        );
        assert_eq!(to_json(&f)["webhooks"]["relay"]["connected"], false);
        assert!(render(&f).contains("relay DISCONNECTED"));
    }

    #[test]
    fn an_unreadable_target_is_named_in_text_and_json() {
        let mut facts = facts();
        if let Some(snapshot) = facts.snapshot.as_mut() {
            snapshot.polling.pace = "blocked".to_owned();
            snapshot.polling.last_failure = Some("failed".to_owned());
            snapshot.polling.unreadable_targets = vec![crate::polling::UnreadableTarget {
                target: "acme/widgets".to_owned(),
                reason: "GitHub's answer to repos.actions.jobs was unexpected".to_owned(),
            }];
        }
        let json = to_json(&facts);
        assert_eq!(
            json["polling"]["unreadable_targets"],
            serde_json::json!([{
                "target": "acme/widgets",
                "reason": "GitHub's answer to repos.actions.jobs was unexpected",
            }])
        );
        let problems = degraded(&facts);
        assert!(
            problems.iter().any(|p| p
                .starts_with("Polling cannot read the target acme/widgets (GitHub's")
                && p.contains("every active interval")),
            "{problems:?}"
        );
        assert!(
            !problems.iter().any(|p| p.contains("refused the App")),
            "{problems:?}"
        );
        let text = render(&facts);
        assert!(text.contains("UNREADABLE: acme/widgets"), "{text}");

        // All readable: an empty list, and nothing said.
        let json = to_json(&self::facts());
        assert_eq!(json["polling"]["unreadable_targets"], serde_json::json!([]));
    }

    /// A rate limit holding the installation's requests shows in `status --json`
    /// (`github.rate_limited`), on the github line and under "Needs attention" while it lasts.
    #[test]
    fn a_rate_limit_holding_requests_is_said_while_it_lasts() {
        let mut facts = facts();
        if let Some(snapshot) = facts.snapshot.as_mut() {
            snapshot.github.held = Some(crate::status_file::Held {
                kind: "secondary".to_owned(),
                until_ms: UnixMs::new(NOW + 42_000),
                limit: Some("rm's pacing (installation 7): the content limit".to_owned()),
            });
            snapshot.github.content = vec![crate::status_file::ContentPacing {
                scope: "installation 7".to_owned(),
                counted: true,
                reason: Some("learned".to_owned()),
                learned_at_ms: Some(UnixMs::new(NOW - 1_000)),
                until_ms: Some(UnixMs::new(NOW + 3_600_000)),
                creations_minute: 80,
                creations_hour: 81,
                limit_minute: 80,
                limit_hour: 500,
            }];
        }
        let json = to_json(&facts);
        assert_eq!(json["github"]["rate_limited"]["kind"], "secondary");
        assert_eq!(
            json["github"]["rate_limited"]["limit"],
            "rm's pacing (installation 7): the content limit"
        );
        let content = &json["github"]["content_pacing"][0];
        assert_eq!(
            (&content["scope"], &content["counted"], &content["reason"]),
            (&json!("installation 7"), &json!(true), &json!("learned"))
        );
        assert_eq!(content["until"], crate::output::rfc3339(NOW + 3_600_000));
        assert_eq!(content["creations_last_minute"], 80);
        assert_eq!(
            json["github"]["rate_limited"]["until"],
            crate::output::rfc3339(NOW + 42_000)
        );
        let text = render(&facts);
        assert!(
            text.contains("HELD by a secondary rate limit for 42s"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "installation 7 paced as content (learned) until {}",
                crate::output::rfc3339(NOW + 3_600_000)
            )),
            "{text}"
        );
        let problems = degraded(&facts);
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("GitHub's secondary rate limit holds every request")),
            "{problems:?}"
        );
        // None held: null, and nothing said.
        let facts = self::facts();
        assert_eq!(to_json(&facts)["github"]["rate_limited"], Value::Null);
        assert!(!render(&facts).contains("HELD"));
    }

    #[test]
    fn a_pinned_version_whose_window_closes_is_named_days_ahead() {
        const DAY_MS: i64 = 86_400_000;
        let mut f = facts();
        let report = rm_runner::package::report::VersionReport {
            version: "2.330.0".into(),
            follows_latest: false,
            next_release: Some("2.331.0".into()),
            window_closes_at_ms: Some(f.now_ms.get() + 4 * DAY_MS + 1_000),
            checked_at_ms: f.now_ms.get() - 3_600_000,
        };
        f.runner_version = Some(report.clone());
        let problems = degraded(&f);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("2.330.0") && p.contains("in 4 day(s)")),
            "{problems:?}"
        );
        let json = to_json(&f);
        assert_eq!(json["runner_version"]["window"], "closing");
        assert_eq!(json["runner_version"]["follows_latest"], false);
        assert!(render(&f).contains("v2.330.0, GitHub asked 1h ago"));

        // Far from closing: nothing to attend to.
        f.runner_version = Some(rm_runner::package::report::VersionReport {
            window_closes_at_ms: Some(f.now_ms.get() + 20 * DAY_MS),
            ..report
        });
        assert!(!degraded(&f).iter().any(|p| p.contains("2.330.0")));
        assert_eq!(to_json(&f)["runner_version"]["window"], "open");
    }

    #[test]
    fn a_fleet_shows_each_host_its_lease_and_its_claims() {
        use rm_journal::{ClaimView, FleetView, HostView, LeaderView};
        use rm_vocab::{JobState, UnixMs};
        let host = |name: &str, live: bool, claims: Vec<ClaimView>| HostView {
            host: name.to_owned(),
            labels: vec!["self-hosted".to_owned()],
            policies: vec!["linux".to_owned()],
            registered_at_ms: UnixMs::new(NOW - 600_000),
            renewed_at_ms: UnixMs::new(NOW - 3_000),
            expires_at_ms: UnixMs::new(if live { NOW + 27_000 } else { NOW - 41_000 }),
            live,
            claims,
        };
        let claim = |job_id: i64, runner: Option<&str>, job_state| ClaimView {
            job_id: rm_vocab::JobId::new(job_id),
            policy: "linux".to_owned(),
            runner_name: runner.map(str::to_owned),
            claimed_at_ms: UnixMs::new(NOW - 10_000),
            job_state,
        };
        let mut f = facts();
        f.host_name = "a".to_owned();
        f.fleet = Some(FleetView {
            now_ms: UnixMs::new(NOW),
            hosts: vec![
                host(
                    "a",
                    true,
                    vec![
                        claim(7, Some("rm-a-0123456789ab"), JobState::InProgress),
                        claim(8, None, JobState::Queued),
                    ],
                ),
                host("b", false, vec![]),
            ],
            leaders: vec![LeaderView {
                role: "poll:acme".to_owned(),
                host: "a".to_owned(),
                acquired_at_ms: UnixMs::new(NOW - 60_000),
                renewed_at_ms: UnixMs::new(NOW - 1_000),
                expires_at_ms: UnixMs::new(NOW + 29_000),
            }],
        });
        let text = render(&f);
        assert!(
            text.contains("fleet     1 of 2 hosts live; 2 claims; poll:acme by a"),
            "{text}"
        );
        assert!(
            text.contains(
                "  a       live, renewed 3s ago; 2 claims (1 with a runner that took its job)"
            ),
            "{text}"
        );
        assert!(
            text.contains("  b       DEAD: its lease expired 41s ago"),
            "{text}"
        );
        let json = to_json(&f);
        let hosts = &json["fleet"]["hosts"];
        assert_eq!(hosts[0]["host"], "a");
        assert_eq!(hosts[0]["runners"], 1);
        assert_eq!(hosts[0]["claims"][0]["job_state"], "in_progress");
        assert_eq!(hosts[0]["claims"][1]["runner"], Value::Null);
        assert_eq!(hosts[1]["live"], false);
        // Issue 42: a host's capacity is known for this host only (the fleet's journal holds
        // no host's shapes).
        assert_eq!(hosts[0]["capacity"]["host"], "a");
        assert_eq!(hosts[0]["capacity"]["cpu"]["used"], 2.5);
        assert_eq!(hosts[1]["capacity"], Value::Null);
        assert_eq!(json["fleet"]["leaders"][0]["role"], "poll:acme");
        // A host alone has no fleet.
        assert_eq!(to_json(&facts())["fleet"], Value::Null);
    }

    #[test]
    fn a_released_attempt_holds_no_uid_and_is_not_overdue() {
        use rm_journal::{AttemptId, AttemptRecord, AttemptState, IsolationKind, WorkspaceKind};
        let record = |state: AttemptState, changed: i64, released: Option<i64>| {
            let id = AttemptId::generate();
            AttemptRecord {
                runner_name: id.runner_name("h"),
                attempt_id: id,
                policy: "linux".into(),
                workspace: WorkspaceKind::Ephemeral,
                runtime_dir: "/r/x".into(),
                state,
                state_changed_at_ms: UnixMs::new(changed),
                outcome: None,
                reason: None,
                detail: None,
                runner_id: None,
                job_id: None,
                pid: None,
                pid_start_time: None,
                stop_intent: None,
                stop_intent_at_ms: None,
                created_at_ms: UnixMs::EPOCH,
                updated_at_ms: UnixMs::EPOCH,
                pid_boot_id: None,
                isolation: IsolationKind::User,
                uid: Some(64_200),
                cgroup: None,
                released_at_ms: released.map(UnixMs::new),
                image: None,
                shape: None,
            }
        };
        let overdue_before = UnixMs::new(1_000);
        use AttemptState::{Busy, Failed, Finished};
        for (attempts, held, overdue) in [
            // A live runner holds its uid; a concluded one too until it is released.
            (vec![record(Busy, 10, None)], 1, 0),
            (vec![record(Finished, 2_000, None)], 1, 0),
            // Concluded long ago and not released: its runtime removal keeps failing.
            (vec![record(Failed, 10, None)], 1, 1),
            // Released, its registration still waiting for GitHub: neither.
            (vec![record(Failed, 10, Some(20))], 0, 0),
            (vec![record(Finished, 2_000, Some(2_001))], 0, 0),
            (
                vec![
                    record(Busy, 10, None),
                    record(Failed, 10, None),
                    record(Failed, 10, Some(20)),
                ],
                2,
                1,
            ),
        ] {
            assert_eq!(
                holding(&attempts, overdue_before),
                (held, overdue),
                "{attempts:#?}"
            );
        }
    }

    /// An attempt of policy `linux` in `state`, holding `shape` (`None`: journalled without one).
    fn attempt(
        n: u8,
        state: AttemptState,
        shape: Option<rm_journal::AttemptShape>,
    ) -> rm_journal::AttemptRecord {
        use rm_journal::{AttemptId, AttemptRecord, IsolationKind, WorkspaceKind};
        let id = AttemptId::parse(&format!("{n:02x}{}", "0".repeat(30))).unwrap();
        AttemptRecord {
            runner_name: id.runner_name("h"),
            attempt_id: id,
            policy: "linux".into(),
            workspace: WorkspaceKind::Ephemeral,
            runtime_dir: "/r/x".into(),
            state,
            state_changed_at_ms: UnixMs::EPOCH,
            outcome: None,
            reason: None,
            detail: None,
            runner_id: None,
            job_id: None,
            pid: None,
            pid_start_time: None,
            stop_intent: None,
            stop_intent_at_ms: None,
            created_at_ms: UnixMs::EPOCH,
            updated_at_ms: UnixMs::EPOCH,
            pid_boot_id: None,
            isolation: IsolationKind::User,
            uid: None,
            cgroup: None,
            released_at_ms: None,
            image: None,
            shape,
        }
    }

    /// Issue 42: used is the sum of the live runners' shapes (a runner journalled without one
    /// takes its policy's default, an even share), free what is left, and each device is held
    /// by the runner the journal's holds name, until cleanup frees it.
    #[test]
    fn capacity_is_what_live_runners_take_and_devices_name_their_holders() {
        const GIB: u64 = 1 << 30;
        let config = crate::config::from_text(
            r#"
[host]
max_runners = 4
capacity = { cpu = 8, memory = "32G", disk = "100G" }
[[host.device]]
group = "gpu"
nodes = ["/dev/nvidia0"]
shared_nodes = ["/dev/nvidiactl"]
[[host.device]]
group = "gpu"
nodes = ["/dev/nvidia1"]
shared_nodes = ["/dev/nvidiactl"]
[[host.device]]
group = "fpga"
nodes = ["/dev/fpga0"]

[[policy]]
name = "linux"
target = "acme"
labels = ["linux"]
"#,
        )
        .unwrap();
        let shaped = |cpu_millis, memory, devices: &[&str]| {
            Some(rm_journal::AttemptShape {
                labels: vec!["rm-gpu=1".to_owned()],
                cpu_millis,
                memory,
                disk: 10 * GIB,
                devices: devices.iter().map(|d| (*d).to_owned()).collect(),
            })
        };
        let uncleaned = [
            attempt(
                1,
                AttemptState::Busy,
                shaped(4000, 16 * GIB, &["/dev/nvidia1"]),
            ),
            // Journalled without a shape: the policy's default, capacity over max_runners.
            attempt(2, AttemptState::Idle, None),
            // Concluded: it no longer counts against capacity, its device is held until
            // cleanup frees it.
            attempt(
                3,
                AttemptState::Finished,
                shaped(2000, 4 * GIB, &["/dev/fpga0"]),
            ),
        ];
        let holds = [
            ("/dev/fpga0".to_owned(), uncleaned[2].attempt_id.clone()),
            ("/dev/nvidia1".to_owned(), uncleaned[0].attempt_id.clone()),
        ];
        let used = host_use(&config, &uncleaned, &holds);
        assert_eq!(
            (used.cpu_millis, used.memory, used.disk),
            (
                Usage {
                    total: Some(8000),
                    used: 4000 + 2000
                },
                Usage {
                    total: Some(32 * GIB),
                    used: 16 * GIB + 8 * GIB
                },
                Usage {
                    total: Some(100 * GIB),
                    used: 10 * GIB + 25 * GIB
                },
            )
        );
        let holder = |d: &str, runner: Option<&str>| DeviceUse {
            device: d.to_owned(),
            holder: runner.map(str::to_owned),
        };
        assert_eq!(
            used.groups,
            BTreeMap::from([
                (
                    "fpga".to_owned(),
                    vec![holder("/dev/fpga0", Some("rm-h-030000000000"))]
                ),
                (
                    "gpu".to_owned(),
                    vec![
                        holder("/dev/nvidia0", None),
                        holder("/dev/nvidia1", Some("rm-h-010000000000")),
                    ]
                ),
            ])
        );
        // Nothing live: all free.
        let empty = host_use(&config, &[], &[]);
        assert_eq!(
            (empty.cpu_millis.used, empty.cpu_millis.free()),
            (0, Some(8000))
        );
        assert!(empty.groups["gpu"].iter().all(|d| d.holder.is_none()));

        // The same in status's JSON and text.
        let mut f = facts();
        f.capacity = used;
        let value = to_json(&f);
        assert_eq!(
            value["capacity"],
            json!({
                "host": "builder-01",
                "cpu": {"total": 8.0, "used": 6.0, "free": 2.0},
                "memory": {"total": 32 * GIB, "used": 24 * GIB, "free": 8 * GIB},
                "disk": {"total": 100 * GIB, "used": 35 * GIB, "free": 65 * GIB},
                "devices": [
                    {"group": "fpga", "total": 1, "held": 1, "free": 0,
                     "holders": [{"device": "/dev/fpga0", "runner": "rm-h-030000000000"}]},
                    {"group": "gpu", "total": 2, "held": 1, "free": 1,
                     "holders": [{"device": "/dev/nvidia1", "runner": "rm-h-010000000000"}]},
                ],
            })
        );
        let text = render(&f);
        for line in [
            "capacity  cpu 6 of 8 used, 2 free; memory 24.0 GiB of 32.0 GiB used, 8.0 GiB free; \
             disk 35.0 GiB of 100.0 GiB used, 65.0 GiB free\n",
            "devices   fpga 1 of 1 held (/dev/fpga0 by rm-h-030000000000), 0 free; \
             gpu 1 of 2 held (/dev/nvidia1 by rm-h-010000000000), 1 free\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        // A host without devices has no devices line, and an unbounded dimension says so.
        let text = render(&facts());
        assert!(!text.contains("devices"), "{text}");
        assert!(text.contains("disk 40.0 GiB used (unbounded)\n"), "{text}");
        assert_eq!(
            to_json(&facts())["capacity"]["disk"],
            json!({"total": null, "used": 40u64 << 30, "free": null})
        );
    }

    /// Issue 40: `status` names the image each runner not yet cleaned up runs in, the full id
    /// in JSON and the short one in text, and says nothing of images when every runner runs on
    /// the host's root.
    #[test]
    fn status_names_the_image_each_runner_runs_in() {
        use rm_journal::{AttemptId, AttemptRecord, IsolationKind, WorkspaceKind};
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "0123456789abcdef".repeat(4));
        let record = |n: u8, state: AttemptState, image: Option<&str>| {
            let id = AttemptId::parse(&format!("{n:02x}{}", "0".repeat(30))).unwrap();
            AttemptRecord {
                runner_name: id.runner_name("h"),
                attempt_id: id,
                policy: if n == 3 { "gpu" } else { "linux" }.into(),
                workspace: WorkspaceKind::Ephemeral,
                runtime_dir: "/r/x".into(),
                state,
                state_changed_at_ms: UnixMs::EPOCH,
                outcome: None,
                reason: None,
                detail: None,
                runner_id: None,
                job_id: None,
                pid: None,
                pid_start_time: None,
                stop_intent: None,
                stop_intent_at_ms: None,
                created_at_ms: UnixMs::EPOCH,
                updated_at_ms: UnixMs::EPOCH,
                pid_boot_id: None,
                isolation: IsolationKind::User,
                uid: None,
                cgroup: None,
                released_at_ms: None,
                image: image.map(str::to_owned),
                shape: None,
            }
        };
        let uncleaned = [
            record(1, AttemptState::Busy, Some(&a)),
            record(2, AttemptState::Idle, None),
            record(3, AttemptState::Starting, Some(&b)),
            record(4, AttemptState::Finished, Some(&a)),
        ];
        let images = runner_images(&uncleaned);
        assert_eq!(
            images
                .iter()
                .map(|r| (r.runner_name.as_str(), r.state, r.image.as_str()))
                .collect::<Vec<_>>(),
            [
                ("rm-h-010000000000", AttemptState::Busy, a.as_str()),
                ("rm-h-030000000000", AttemptState::Starting, b.as_str()),
                ("rm-h-040000000000", AttemptState::Finished, a.as_str()),
            ]
        );

        let mut f = facts();
        f.runner_images = images;
        let json = to_json(&f);
        let listed = json["runners"]["images"].as_array().unwrap();
        assert_eq!(listed.len(), 3);
        assert_eq!(listed[0]["runner_name"], "rm-h-010000000000");
        assert_eq!(listed[0]["image"], a.as_str());
        assert_eq!(listed[1]["policy"], "gpu");
        assert_eq!(listed[1]["state"], "starting");
        assert_eq!(listed[1]["image"], b.as_str());
        let text = render(&f);
        assert!(
            text.contains(
                "images    sha256:aaaaaaaaaaaa (rm-h-010000000000, rm-h-040000000000); \
                 sha256:0123456789ab (rm-h-030000000000)\n"
            ),
            "{text}"
        );

        // Every runner on the host's root: an empty list, and no line.
        let f = facts();
        assert_eq!(to_json(&f)["runners"]["images"], json!([]));
        assert!(!render(&f).contains("images"), "{}", render(&f));
        assert_eq!(images_line(&runner_images(&uncleaned[1..2])), None);
    }
}
