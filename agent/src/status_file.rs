//! What only the running agent knows, published for `rm-agent status` (a separate process):
//! the polling pace and next poll, the requests of the last hour, the rate limit, webhook trust
//! and the last GitHub contact. `rm-agent run` rewrites `<data_dir>/status.json` whenever the
//! poller's status changes and at least every [`PUBLISH_EVERY`]; each write is a temporary file
//! renamed over the old one, so a reader never sees half a document. It holds no secret.
//!
//! The file outlives the agent. A reader tells a live snapshot from a stale one by its age
//! ([`STALE_AFTER`]) and by whether the process that wrote it is still there ([`liveness`]).
//!
//! It owns the document (its sections, [`FORMAT_VERSION`], the write and the read), not every
//! fact in it: it builds its own sections from what the poller and the relay report, and a fact
//! another module decides and publishes whole keeps that module's shape (the fitness gate's
//! [`crate::fitness::Fitness`], allocation's [`crate::executor::allocate::published`]). So
//! those modules never name this one (the module-cycle check, `crate::module_cycles`), and
//! `status` and `explain` read such a fact in its owner's terms.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rm_github::GithubClient;
use rm_github::stats::Contact;
use rm_vocab::UnixMs;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::polling::PollerStatus;

/// The snapshot's file name inside the data directory.
pub(crate) const STATUS_FILE: &str = "status.json";
/// The longest time between two snapshots while the agent runs (GitHub contact and the next
/// poll's countdown change without a poller step).
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(5);
/// A snapshot older than this was not written by a working agent: six missed publications.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(30);
/// Bumped when a field changes meaning; a reader ignores a snapshot of another version.
const FORMAT_VERSION: u32 = 1;
/// The temporary file a snapshot is written to before the rename.
const TMP_FILE: &str = ".status.json.tmp";

/// One publication. Times are milliseconds since the Unix epoch, as in the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub version: u32,
    pub written_at_ms: UnixMs,
    /// The agent's process id.
    pub pid: u32,
    pub polling: Polling,
    pub github: Github,
    pub host: Host,
    /// The relay subscription, when `[relay]` is configured.
    #[serde(default)]
    pub relay: Option<Relay>,
    /// The host's fitness as the gate last judged it (CONTRACT §8: `host_unfit`); `None` before
    /// the first check.
    #[serde(default)]
    pub fitness: Option<crate::fitness::Fitness>,
    /// What allocation remembers (fences, launch back-offs, launches in flight), for
    /// `explain` and `status`'s waiting jobs (CONTRACT §8); `None` from an agent that has none.
    #[serde(default)]
    pub allocation: Option<crate::executor::allocate::published::AllocationMemory>,
    /// The host-local cache (`[cache]`), when a policy uses it: its totals and whether the
    /// installed runner package takes its redirect.
    #[serde(default)]
    pub cache: Option<crate::cache::report::CacheReport>,
}

/// The relay subscription as the agent last saw it ([`crate::relay::RelayState`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Relay {
    pub connected: bool,
    pub last_event_id: Option<u64>,
    pub journalled: u64,
    pub refused: u64,
    /// Why the last connection failed or ended, while not connected.
    pub problem: Option<String>,
}

impl From<&crate::relay::RelayState> for Relay {
    fn from(state: &crate::relay::RelayState) -> Self {
        Relay {
            connected: state.connected,
            last_event_id: state.last_event_id,
            journalled: state.journalled,
            refused: state.refused,
            problem: state.problem.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Polling {
    /// [`crate::polling::Pace::as_str`].
    pub pace: String,
    /// Slowed by something the operator should see (a low budget, a limit, an outage).
    pub throttled: bool,
    pub next_poll_at_ms: Option<UnixMs>,
    pub requests_last_hour: Requests,
    pub rate_limit: Option<RateLimit>,
    /// Set while GitHub is unreachable.
    pub offline: Option<Offline>,
    pub webhooks: Webhooks,
    /// The latest pass's most severe failure (`offline`, `rate_limited`, `unauthorized`, ...).
    pub last_failure: Option<String>,
    /// Queued jobs a poll found that no delivery announced.
    pub unannounced_jobs: i64,
    /// Policy targets the latest demand poll could not read, with GitHub's reason.
    #[serde(default)]
    pub unreadable_targets: Vec<crate::polling::UnreadableTarget>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Requests {
    pub charged: u64,
    pub uncharged: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RateLimit {
    pub remaining: u64,
    pub limit: u64,
    pub reset_at_ms: Option<UnixMs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Offline {
    /// One sentence for `status` ([`crate::polling::schedule::OfflineState::describe`]).
    pub description: String,
    pub since_ms: UnixMs,
    /// 24 hours passed: GitHub has cancelled the jobs that were queued.
    pub outlasted_the_queue: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Webhooks {
    /// A receiver or relay is configured.
    pub intake: bool,
    pub trusted: bool,
    /// `deliveries_trusted`, `no_intake`, `unannounced_job` or `failed_delivery`.
    pub reason: String,
    /// When the latest evidence of a lost delivery was seen.
    pub evidence_at_ms: Option<UnixMs>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Github {
    /// False after a request got no answer, until the next answer.
    pub reachable: bool,
    pub last_contact_at_ms: Option<UnixMs>,
    /// Set while a rate limit holds every request of an installation (or the App) back: GitHub
    /// answered one, or the hourly quota is down to its reserve. Which kind, and until when.
    #[serde(default)]
    pub held: Option<Held>,
    /// Per installation (and the App): whether its `POST`s count as content creation now.
    #[serde(default)]
    pub content: Vec<ContentPacing>,
    /// Each configured App (the primary first): its budgets and the JIT registrations its
    /// installations made (`[[github.app]]` spreads them over several Apps).
    #[serde(default)]
    pub apps: Vec<AppBudget>,
}

/// One App's share of GitHub: the budgets of its JWT and of its installations, and its
/// registrations since the agent started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppBudget {
    pub app_id: u64,
    pub registrations: u64,
    pub budgets: Vec<ScopeBudget>,
}

/// One scope's quota of one resource, as the budget learnt it from GitHub's headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ScopeBudget {
    /// `app:<id>` (the App's JWT) or `installation:<id>`.
    pub scope: String,
    pub resource: String,
    pub remaining: Option<u64>,
    pub limit: Option<u64>,
}

/// Each of `app_ids` (in order) with the budgets of its scopes and its registrations;
/// `app_of` names an installation's App (the primary's when unknown); `registrations` are the
/// client's `(app, installation, count)`.
pub(crate) fn app_budgets(
    app_ids: &[u64],
    budget: &[rm_github::BudgetSnapshot],
    app_of: impl Fn(u64) -> Option<u64>,
    registrations: &[(u64, u64, u64)],
) -> Vec<AppBudget> {
    let primary = app_ids.first().copied().unwrap_or_default();
    app_ids
        .iter()
        .map(|app| {
            let owner = |scope: rm_github::Scope| match scope {
                rm_github::Scope::App(id) => id,
                rm_github::Scope::Installation(id) => app_of(id).unwrap_or(primary),
            };
            AppBudget {
                app_id: *app,
                registrations: registrations
                    .iter()
                    .filter(|(a, _, _)| a == app)
                    .map(|(_, _, n)| n)
                    .sum(),
                budgets: budget
                    .iter()
                    .filter(|b| owner(b.scope) == *app)
                    .map(|b| ScopeBudget {
                        scope: b.scope.to_string(),
                        resource: b.resource.clone(),
                        remaining: b.remaining,
                        limit: b.limit,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// A rate limit holding requests back, as the budget knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    /// `primary` (the hourly quota) or `secondary` (GitHub's abuse limits).
    pub kind: String,
    pub until_ms: UnixMs,
    /// Which limit, in words: a resource's primary bucket, a secondary limit GitHub answered,
    /// or one of rm's pacing windows (a path template's points, the content limit and why).
    #[serde(default)]
    pub limit: Option<String>,
}

/// One scope's content pacing, as the budget knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContentPacing {
    /// `installation <id>` or `app`.
    pub scope: String,
    /// Whether its `POST`s count as content creation now.
    pub counted: bool,
    /// While counted: `cautious` (`github.pacing`) or `learned` (GitHub answered a secondary
    /// limit at `learned_at_ms`; counted until `until_ms`).
    pub reason: Option<String>,
    pub learned_at_ms: Option<UnixMs>,
    pub until_ms: Option<UnixMs>,
    /// `POST`s sent in the last minute and hour, and the content limits they are held to.
    pub creations_minute: u32,
    pub creations_hour: u32,
    pub limit_minute: u32,
    pub limit_hour: u32,
}

/// How a budget scope is named to the operator.
pub(crate) fn scope_name(scope: rm_github::Scope) -> String {
    match scope {
        rm_github::Scope::App(id) => format!("App {id}"),
        rm_github::Scope::Installation(id) => format!("installation {id}"),
    }
}

/// Every scope's content pacing, from the budget's snapshot.
pub(crate) fn content(pacing: &[rm_github::PacingSnapshot]) -> Vec<ContentPacing> {
    use rm_github::pacing::ContentReason;
    pacing
        .iter()
        .map(|p| {
            let (reason, learned_at_ms, until_ms) = match p.counted {
                None => (None, None, None),
                Some(ContentReason::Cautious) => (Some("cautious"), None, None),
                Some(ContentReason::Learned { at, until }) => (
                    Some("learned"),
                    Some(UnixMs::from_system_time(at)),
                    Some(UnixMs::from_system_time(until)),
                ),
            };
            ContentPacing {
                scope: p.scope.to_string(),
                counted: p.counted.is_some(),
                reason: reason.map(str::to_owned),
                learned_at_ms,
                until_ms,
                creations_minute: p.creations_minute,
                creations_hour: p.creations_hour,
                limit_minute: p.limit_minute,
                limit_hour: p.limit_hour,
            }
        })
        .collect()
}

/// The content limit of `p` in words, while it counts.
fn content_words(p: &rm_github::PacingSnapshot) -> Option<String> {
    use rm_github::pacing::ContentReason;
    let limits = format!(
        "the content limit ({} a minute, {} an hour)",
        p.limit_minute, p.limit_hour
    );
    match p.counted? {
        ContentReason::Cautious => Some(format!(
            "{limits}, counted for every POST (github.pacing = \"cautious\")"
        )),
        ContentReason::Learned { at, until } => Some(format!(
            "{limits}, learned from GitHub's secondary limit at {} and counted until {}",
            crate::output::rfc3339(rm_vocab::UnixMs::from_system_time(at).get()),
            crate::output::rfc3339(rm_vocab::UnixMs::from_system_time(until).get())
        )),
    }
}

/// The rate limit that holds requests back longest at `now`, from the budget's snapshots: a
/// limit GitHub answered (or the quota's reserve), or the window of rm's pacing that refused
/// the scope's last request; with which limit it is, in words.
pub(crate) fn held(
    budget: &[rm_github::BudgetSnapshot],
    pacing: &[rm_github::PacingSnapshot],
    now: SystemTime,
) -> Option<Held> {
    use rm_github::LimitKind;
    use rm_github::pacing::PacedBy;
    let content_of = |scope| {
        pacing
            .iter()
            .find(|p| p.scope == scope)
            .and_then(content_words)
    };
    let answered = budget.iter().filter_map(|b| {
        let (kind, until) = b.blocked?;
        let words = match kind {
            LimitKind::Primary => format!(
                "the primary bucket of resource `{}` ({}) until its reset",
                b.resource,
                scope_name(b.scope)
            ),
            LimitKind::Secondary => {
                let mut words = format!(
                    "a secondary limit GitHub answered ({}), waited out as told",
                    scope_name(b.scope)
                );
                if let Some(content) = content_of(b.scope) {
                    words.push_str("; from it rm paces by ");
                    words.push_str(&content);
                }
                words
            }
        };
        Some((kind, until, words))
    });
    let paced = pacing.iter().filter_map(|p| {
        let (by, until) = p.paced?;
        let words = match by {
            PacedBy::Points(template) => format!(
                "rm's pacing ({}): the points window of `{template}` (900 points a minute per \
                 endpoint, 5 a request)",
                scope_name(p.scope)
            ),
            PacedBy::Content => format!(
                "rm's pacing ({}): {}",
                scope_name(p.scope),
                content_words(p).unwrap_or_else(|| "the content limit".to_owned())
            ),
            PacedBy::Spacing => format!(
                "rm's pacing ({}): one mutation a second (github.pacing = \"one_per_second\")",
                scope_name(p.scope)
            ),
        };
        Some((LimitKind::Secondary, until, words))
    });
    answered
        .chain(paced)
        .filter(|(_, until, _)| *until > now)
        .max_by_key(|(_, until, _)| *until)
        .map(|(kind, until, words)| Held {
            kind: kind.to_string(),
            until_ms: UnixMs::from_system_time(until),
            limit: Some(words),
        })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Host {
    /// `host.max_runners` of the running agent.
    pub max_runners: u32,
}

impl Snapshot {
    /// The snapshot of `status` and `contact` at `now`.
    pub(crate) fn capture(
        status: &PollerStatus,
        contact: Contact,
        max_runners: u32,
        pid: u32,
        now: SystemTime,
    ) -> Snapshot {
        Snapshot {
            version: FORMAT_VERSION,
            written_at_ms: UnixMs::from_system_time(now),
            pid,
            polling: Polling {
                pace: status.pace.as_str().to_owned(),
                throttled: status.pace.is_throttled(),
                next_poll_at_ms: status.next_poll_at.map(UnixMs::from_system_time),
                requests_last_hour: Requests {
                    charged: status.requests_last_hour.charged,
                    uncharged: status.requests_last_hour.uncharged,
                },
                rate_limit: status.rate_limit.map(|r| RateLimit {
                    remaining: r.remaining,
                    limit: r.limit,
                    reset_at_ms: r.reset_at.map(UnixMs::from_system_time),
                }),
                offline: status.offline.as_ref().map(|o| Offline {
                    description: o.describe(),
                    since_ms: UnixMs::from_system_time(o.since),
                    outlasted_the_queue: o.has_outlasted_the_queue(),
                }),
                webhooks: Webhooks {
                    intake: status.webhooks.intake,
                    trusted: status.webhooks.trusted,
                    reason: status.webhooks.reason.to_owned(),
                    evidence_at_ms: status.webhooks.evidence_at.map(UnixMs::from_system_time),
                },
                last_failure: status.last_pass.failure.map(str::to_owned),
                unannounced_jobs: status.unannounced_jobs,
                unreadable_targets: status.unreadable_targets.clone(),
            },
            github: Github {
                reachable: contact.reachable,
                last_contact_at_ms: contact.last_contact_at.map(UnixMs::from_system_time),
                held: None,
                content: Vec::new(),
                apps: Vec::new(),
            },
            host: Host { max_runners },
            relay: None,
            fitness: None,
            allocation: None,
            cache: None,
        }
    }

    /// How old the snapshot is at `now_ms` (zero when written "in the future").
    pub(crate) fn age(&self, now_ms: UnixMs) -> Duration {
        now_ms.duration_since(self.written_at_ms)
    }
}

/// Writes `snapshot` to `<data_dir>/status.json` atomically, readable by the agent's user only
/// (mode 0600). It holds no secret, but it names every repository, job and runner the host
/// serves, and the data directory is searchable (0711) by runner uids when the runner root is
/// inside it: a job that guesses the name must not learn about other jobs.
pub(crate) fn write(data_dir: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    let tmp = data_dir.join(TMP_FILE);
    let bytes = serde_json::to_vec_pretty(snapshot).map_err(std::io::Error::other)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&bytes)?;
    file.write_all(b"\n")?;
    // A file left by an earlier version may be wider: it is replaced by this one, set here.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    drop(file);
    std::fs::rename(&tmp, data_dir.join(STATUS_FILE))
}

/// The last snapshot written in `data_dir`: `Ok(None)` when there is none, or when it is of
/// another format version (an agent of another release wrote it).
pub(crate) fn read(data_dir: &Path) -> Result<Option<Snapshot>, String> {
    let path = data_dir.join(STATUS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("cannot read {} ({err})", path.display())),
    };
    match serde_json::from_slice::<Snapshot>(&bytes) {
        Ok(snapshot) if snapshot.version == FORMAT_VERSION => Ok(Some(snapshot)),
        Ok(_) => Ok(None),
        Err(err) => Err(format!(
            "{} is not a status snapshot ({err})",
            path.display()
        )),
    }
}

/// How the publisher reads a fact another part of the agent owns, at each publication.
pub(crate) type Source<T> = std::sync::Arc<dyn Fn() -> T + Send + Sync>;

/// What the publisher reads of other parts of the agent at each publication, through closures
/// and boards: this module names only the shapes they publish, and none of them names it.
#[derive(Default)]
pub(crate) struct Readers {
    /// The executor's memory.
    pub allocation: Option<Source<crate::executor::allocate::published::AllocationMemory>>,
    /// The fitness gate's latest judgement.
    pub fitness: Option<Source<Option<crate::fitness::Fitness>>>,
    /// The host-local cache's last report, when it runs.
    pub cache: Option<crate::cache::report::Board>,
}

/// Publishes the agent's status until the poller stops: at once, whenever `status` changes,
/// and at least every [`PUBLISH_EVERY`]. A failed write is logged and retried at the next one.
/// `relay` is the relay subscription's state, when there is one; `readers` the other parts'.
pub(crate) fn spawn_publisher(
    data_dir: PathBuf,
    mut status: watch::Receiver<PollerStatus>,
    mut relay: Option<watch::Receiver<crate::relay::RelayState>>,
    client: GithubClient,
    max_runners: u32,
    readers: Readers,
) -> tokio::task::JoinHandle<()> {
    let Readers {
        allocation,
        fitness,
        cache,
    } = readers;
    tokio::spawn(async move {
        let pid = std::process::id();
        let mut tick = tokio::time::interval(PUBLISH_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut warned = false;
        loop {
            let mut snapshot = Snapshot::capture(
                &status.borrow_and_update(),
                client.contact(),
                max_runners,
                pid,
                SystemTime::now(),
            );
            snapshot.relay = relay.as_mut().map(|r| Relay::from(&*r.borrow_and_update()));
            // Read at every publication, not only at poll passes: a limit GitHub answered to a
            // burst of registrations shows within [`PUBLISH_EVERY`].
            let budget = client.budget();
            let pacing = client.content_pacing();
            snapshot.github.held = held(&budget, &pacing, SystemTime::now());
            snapshot.github.content = content(&pacing);
            snapshot.github.apps = app_budgets(
                &client.app_ids(),
                &budget,
                |installation| client.app_of(installation),
                &client.registration_counts(),
            );
            snapshot.allocation = allocation.as_ref().map(|read| read());
            snapshot.fitness = fitness.as_ref().and_then(|read| read());
            snapshot.cache = cache.as_ref().and_then(|board| {
                board
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
            });
            let dir = data_dir.clone();
            match tokio::task::spawn_blocking(move || write(&dir, &snapshot)).await {
                Ok(Ok(())) => warned = false,
                Ok(Err(err)) if !warned => {
                    warned = true;
                    tracing::warn!(error = %err, dir = %data_dir.display(), "cannot publish the status for `rm-agent status`");
                }
                Ok(Err(_)) => {}
                Err(err) => tracing::warn!(error = %err, "the status writer failed"),
            }
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() {
                        // The poller stopped: the agent is shutting down.
                        break;
                    }
                }
                _ = tick.tick() => {}
                // A relay that stopped reporting (shutdown) falls back to the tick.
                Some(Ok(())) = async {
                    match relay.as_mut() {
                        Some(r) => Some(r.changed().await),
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    })
}

/// Whether an agent is serving the data directory, as far as `status` can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// The snapshot is fresh and the process that wrote it is alive.
    Running { pid: u32 },
    /// The process that wrote the snapshot is alive but stopped publishing `age` ago.
    Silent { pid: u32, age: Duration },
    /// An rm-agent that publishes nothing holds the data directory (`rm-agent receive`).
    ReceiverOnly { pid: u32 },
    /// No agent runs; the last snapshot, if any, was written `last_seen` ago.
    Stopped { last_seen: Option<Duration> },
}

impl Liveness {
    pub(crate) fn is_running(self) -> bool {
        matches!(self, Liveness::Running { .. })
    }

    /// The process serving the data directory, if any.
    pub(crate) fn pid(self) -> Option<u32> {
        match self {
            Liveness::Running { pid }
            | Liveness::Silent { pid, .. }
            | Liveness::ReceiverOnly { pid } => Some(pid),
            Liveness::Stopped { .. } => None,
        }
    }
}

/// Decides [`Liveness`] from the snapshot (its writer and age), the pid the data directory's
/// lock file records, and whether a pid is an rm-agent still running.
pub(crate) fn liveness(
    snapshot: Option<&Snapshot>,
    lock_owner: Option<u32>,
    now_ms: UnixMs,
    is_agent: impl Fn(u32) -> bool,
) -> Liveness {
    if let Some(s) = snapshot
        && is_agent(s.pid)
    {
        let age = s.age(now_ms);
        return if age <= STALE_AFTER {
            Liveness::Running { pid: s.pid }
        } else {
            Liveness::Silent { pid: s.pid, age }
        };
    }
    match lock_owner {
        Some(pid) if is_agent(pid) => Liveness::ReceiverOnly { pid },
        _ => Liveness::Stopped {
            last_seen: snapshot.map(|s| s.age(now_ms)),
        },
    }
}

/// What a reader process (`status`, `explain`) learns about the agent serving `data_dir` at
/// `now_ms`: the last snapshot (an unreadable one is logged and ignored) and whether its
/// writer still runs.
pub(crate) fn observe(data_dir: &Path, now_ms: UnixMs) -> (Option<Snapshot>, Liveness) {
    let snapshot = read(data_dir).unwrap_or_else(|problem| {
        tracing::warn!("{problem}; ignoring it");
        None
    });
    let agent = liveness(
        snapshot.as_ref(),
        crate::lock::recorded_owner(data_dir),
        now_ms,
        is_rm_agent,
    );
    (snapshot, agent)
}

/// Whether `pid` is a live rm-agent process. Where `/proc` tells a process's name, a recycled
/// pid that now names another program does not count.
pub(crate) fn is_rm_agent(pid: u32) -> bool {
    let Some(raw) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    match rustix::process::test_kill_process(raw) {
        Ok(()) | Err(rustix::io::Errno::PERM) => {}
        Err(_) => return false,
    }
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(name) => name.trim_end() == "rm-agent",
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::polling::schedule::OfflineState;
    use crate::polling::{
        health::Trust,
        schedule::Pace,
        status::{PassReport, RateLimitStatus, RequestCounts, WebhookStatus},
    };

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn status() -> PollerStatus {
        PollerStatus {
            pace: Pace::StretchedLowBudget,
            next_poll_at: Some(t(90)),
            webhooks: WebhookStatus::new(
                true,
                Trust {
                    trusted: false,
                    reason: "unannounced_job",
                    evidence_at: Some(t(10)),
                },
                Some(t(5)),
            ),
            requests_last_hour: RequestCounts {
                charged: 12,
                uncharged: 30,
            },
            rate_limit: Some(RateLimitStatus {
                remaining: 900,
                limit: 5000,
                reset_at: Some(t(1800)),
            }),
            offline: Some(OfflineState {
                consecutive: 3,
                since: t(0),
                offline_for: Duration::from_secs(25 * 3600),
                retry_in: Duration::from_secs(60),
            }),
            unannounced_jobs: 2,
            last_pass: PassReport {
                failure: Some("offline"),
                ..PassReport::default()
            },
            unreadable_targets: vec![crate::polling::UnreadableTarget {
                target: "acme/widgets".to_owned(),
                reason: "unexpected answer".to_owned(),
            }],
        }
    }

    #[test]
    fn a_snapshot_carries_what_status_needs_and_reads_back() {
        let contact = Contact {
            last_contact_at: Some(t(20)),
            reachable: false,
        };
        let s = Snapshot::capture(&status(), contact, 4, 77, t(60));
        assert_eq!(s.polling.pace, "stretched_low_budget");
        assert!(s.polling.throttled);
        assert_eq!(
            s.polling.next_poll_at_ms,
            Some(UnixMs::from_system_time(t(90)))
        );
        assert_eq!(
            s.polling.requests_last_hour,
            Requests {
                charged: 12,
                uncharged: 30
            }
        );
        assert_eq!(s.polling.rate_limit.unwrap().remaining, 900);
        let offline = s.polling.offline.as_ref().unwrap();
        assert!(offline.outlasted_the_queue);
        assert!(offline.description.contains("unreachable for 1day 1h"));
        assert_eq!(
            (
                s.polling.webhooks.trusted,
                s.polling.webhooks.reason.as_str()
            ),
            (false, "unannounced_job")
        );
        assert_eq!(s.polling.last_failure.as_deref(), Some("offline"));
        assert_eq!(
            s.github.last_contact_at_ms,
            Some(UnixMs::from_system_time(t(20)))
        );
        assert_eq!((s.pid, s.host.max_runners), (77, 4));
        assert_eq!(
            s.age(UnixMs::from_system_time(t(75))),
            Duration::from_secs(15)
        );
        assert_eq!(s.age(UnixMs::from_system_time(t(0))), Duration::ZERO);

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        write(dir.path(), &s).unwrap();
        write(dir.path(), &s).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(s));
        let mode = std::fs::metadata(dir.path().join(STATUS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!dir.path().join(TMP_FILE).exists());
    }

    #[test]
    fn liveness_needs_a_live_writer_and_a_fresh_snapshot() {
        let mut s = Snapshot::capture(&status(), Contact::default(), 4, 77, t(0));
        let now = UnixMs::from_system_time(t(10));
        let alive = |pid| pid == 77;
        assert_eq!(
            liveness(Some(&s), Some(77), now, alive),
            Liveness::Running { pid: 77 }
        );
        let later = UnixMs::from_system_time(t(100));
        assert_eq!(
            liveness(Some(&s), Some(77), later, alive),
            Liveness::Silent {
                pid: 77,
                age: Duration::from_secs(100)
            }
        );
        // The writer is gone: stopped, however fresh the file.
        assert_eq!(
            liveness(Some(&s), Some(77), now, |_| false),
            Liveness::Stopped {
                last_seen: Some(Duration::from_secs(10))
            }
        );
        // Another live agent holds the lock and publishes nothing.
        s.pid = 5;
        assert_eq!(
            liveness(Some(&s), Some(77), now, alive),
            Liveness::ReceiverOnly { pid: 77 }
        );
        assert_eq!(
            liveness(None, None, now, alive),
            Liveness::Stopped { last_seen: None }
        );
        assert!(Liveness::Running { pid: 1 }.is_running());
        assert_eq!(Liveness::Stopped { last_seen: None }.pid(), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_test_process_is_not_an_rm_agent() {
        assert!(!is_rm_agent(std::process::id()));
        assert!(!is_rm_agent(0));
    }

    #[test]
    fn the_longest_hold_of_the_budget_is_the_one_said() {
        use rm_github::{BudgetSnapshot, LimitKind, Scope};
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        let line = |blocked: Option<(LimitKind, SystemTime)>| BudgetSnapshot {
            scope: Scope::Installation(1),
            resource: "core".to_owned(),
            limit: None,
            remaining: None,
            used: None,
            reset_at: None,
            blocked,
            charged: 0,
            uncharged: 0,
        };
        let budget = [
            line(None),
            line(Some((LimitKind::Primary, at(150)))),
            line(Some((LimitKind::Secondary, at(200)))),
        ];
        let held_at = |budget: &[BudgetSnapshot], pacing: &[rm_github::PacingSnapshot], t| {
            held(budget, pacing, at(t)).map(|h| (h.kind, h.until_ms, h.limit.unwrap_or_default()))
        };
        let (kind, until, words) = held_at(&budget, &[], 100).unwrap();
        assert_eq!((kind.as_str(), until), ("secondary", UnixMs::new(200_000)));
        assert!(words.contains("secondary limit GitHub answered"), "{words}");
        assert_eq!(held(&budget, &[], at(200)), None);
        assert_eq!(held(&budget[..1], &[], at(100)), None);
        let (_, _, words) = held_at(&budget[..2], &[], 100).unwrap();
        assert!(
            words.contains("primary bucket of resource `core`"),
            "{words}"
        );

        // A learned content limit is named with its time; rm's own window when it holds longer.
        use rm_github::pacing::{ContentReason, PacedBy};
        let template = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig";
        let pacing = |paced| rm_github::PacingSnapshot {
            scope: Scope::Installation(1),
            counted: Some(ContentReason::Learned {
                at: at(90),
                until: at(3691),
            }),
            creations_minute: 80,
            creations_hour: 81,
            limit_minute: 80,
            limit_hour: 500,
            paced,
        };
        let (_, _, words) = held_at(&budget, &[pacing(None)], 100).unwrap();
        assert!(
            words.contains("learned from GitHub's secondary limit at"),
            "{words}"
        );
        let (_, until, words) =
            held_at(&budget, &[pacing(Some((PacedBy::Content, at(300))))], 100).unwrap();
        assert_eq!(until, UnixMs::new(300_000));
        assert!(
            words.starts_with("rm's pacing (installation 1): the content limit"),
            "{words}"
        );
        let (_, _, words) = held_at(
            &[],
            &[pacing(Some((PacedBy::Points(template), at(300))))],
            100,
        )
        .unwrap();
        assert!(words.contains(template), "{words}");
        let lines = content(&[pacing(None)]);
        assert_eq!(lines[0].reason.as_deref(), Some("learned"));
        assert_eq!(lines[0].until_ms, Some(UnixMs::new(3_691_000)));
        assert!(lines[0].counted);
    }

    /// Each App's budgets are its JWT's and its installations' (an installation the client has
    /// not placed counts as the primary's), its registrations its installations'.
    #[test]
    fn budgets_and_registrations_are_shown_per_app() {
        use rm_github::{BudgetSnapshot, Scope};
        let line = |scope: Scope, remaining: u64| BudgetSnapshot {
            scope,
            resource: "core".to_owned(),
            limit: Some(5000),
            remaining: Some(remaining),
            used: None,
            reset_at: None,
            blocked: None,
            charged: 0,
            uncharged: 0,
        };
        let budget = [
            line(Scope::App(1), 4990),
            line(Scope::App(2), 4980),
            line(Scope::Installation(10), 4000),
            line(Scope::Installation(20), 3000),
            line(Scope::Installation(99), 2000),
        ];
        let app_of = |installation: u64| match installation {
            10 => Some(1),
            20 => Some(2),
            _ => None,
        };
        let apps = app_budgets(&[1, 2, 3], &budget, app_of, &[(1, 10, 4), (2, 20, 5)]);
        type Shown = (u64, u64, Vec<(String, Option<u64>)>);
        let shown: Vec<Shown> = apps
            .iter()
            .map(|a| {
                (
                    a.app_id,
                    a.registrations,
                    a.budgets
                        .iter()
                        .map(|b| (b.scope.clone(), b.remaining))
                        .collect(),
                )
            })
            .collect();
        let s = |scope: &str, left: u64| (scope.to_owned(), Some(left));
        assert_eq!(
            shown,
            [
                (
                    1,
                    4,
                    vec![
                        s("app:1", 4990),
                        s("installation:10", 4000),
                        s("installation:99", 2000)
                    ]
                ),
                (2, 5, vec![s("app:2", 4980), s("installation:20", 3000)]),
                (3, 0, vec![]),
            ]
        );
    }
}
