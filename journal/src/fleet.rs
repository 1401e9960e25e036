//! The fleet's shared state (CONTRACT §9): host leases, claims on queued jobs, and leader leases.
//! This module owns what those mean: when a lease is live, when a claim counts, how many claims
//! a fleet-wide `max_runners` admits, who may lead a role. It holds the interface ([`Fleet`]),
//! its values, and those rules as pure functions; the two implementations apply them under
//! their database's locks: [`crate::PgFleet`] (PostgreSQL, shared by many hosts) and
//! [`LocalFleet`] (the SQLite file, one host: the same semantics, so one test suite runs
//! against both).
//!
//! - **A host lease** ([`Fleet::renew_lease`]) is live while `expires_at > now`. A host that lets
//!   it expire is dead for the fleet: its claims stop counting at once and other hosts may claim
//!   their jobs. Renewing an expired lease starts a new one and drops every claim of the old
//!   one ([`Renewal::Reacquired`]), so a host that comes back never revives a claim another host
//!   may have judged dead.
//! - **A claim** ([`Fleet::claim`]) takes a queued job for one host. It counts while its host's
//!   lease is live and its job is not completed: it ends when the host releases it (the runner
//!   gave up without the job), when the job completes, or when the host's lease expires. Only a
//!   queued job can be claimed, and only when no claim on it counts. A claim survives the job's
//!   move to `in_progress` on purpose: the runner running it still counts toward a fleet-wide
//!   `max_runners`, and `status` still shows it under its host. Which jobs a host may serve
//!   (label routing) is the agent's decision; the journal takes the candidates and answers
//!   which ones this host got.
//! - **A leader lease** ([`Fleet::try_lead`]) gives one host a role (one poller per target)
//!   until it expires; the holder renews it, anyone takes it once expired.
//!
//! **The clock.** Leases are compared across hosts, whose clocks drift, so on PostgreSQL every
//! "now" (a lease's expiry, the judgement whether one has passed) is the database server's
//! `clock_timestamp()`, read after the rows it judges are locked; the hosts' clocks never meet.
//! The SQLite journal has one host and uses its clock. No call takes a "now": the rules that
//! compare times are the pure functions below, and their tests pass times explicitly; the tests
//! against a database use a lease of minutes where it must hold and one of milliseconds,
//! awaited with a generous bound, where it must pass. None asserts a wall-clock duration.

mod local;

use std::collections::HashSet;
use std::time::Duration;

use rm_vocab::{JobId, JobState, UnixMs};
use serde::Serialize;

use crate::JournalError;

pub use local::LocalFleet;

/// What the fleet can refuse; callers match on [`FleetError::LeaseExpired`] (register again
/// before claiming).
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The claiming host holds no live lease: it never registered, left, or let it expire.
    /// Nothing was claimed.
    #[error(
        "host {host} holds no live lease (never registered, or it expired): renew the lease before claiming"
    )]
    LeaseExpired { host: String },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl From<rusqlite::Error> for FleetError {
    fn from(err: rusqlite::Error) -> Self {
        FleetError::Journal(err.into())
    }
}

#[cfg(feature = "postgres")]
impl From<postgres::Error> for FleetError {
    fn from(err: postgres::Error) -> Self {
        FleetError::Journal(err.into())
    }
}

/// What a host says about itself when it renews its lease (shown by `status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// The host's name in the fleet; two processes must not share one.
    pub host: String,
    /// The runner labels it serves.
    pub labels: Vec<String>,
    /// The `[[policy]]` names it runs.
    pub policies: Vec<String>,
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Renewal {
    /// The host had no lease: a new one.
    Registered,
    /// The lease was live and now lasts longer.
    Renewed,
    /// The lease had expired: a new one began, and the claims of the old one were dropped
    /// (`dropped_claims`), since other hosts may already serve their jobs.
    Reacquired { dropped_claims: u64 },
}

/// A host's lease after a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub renewal: Renewal,
    /// When it expires, on the journal's clock.
    pub expires_at_ms: UnixMs,
}

/// A host asking for some of the jobs it could serve.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    pub host: &'a str,
    /// The `[[policy]]` the runners would be started under.
    pub policy: &'a str,
    /// The jobs the agent routed to this policy, most wanted first.
    pub job_ids: &'a [JobId],
    /// The policy's fleet-wide ceiling on live claims, across all hosts; `None`: no ceiling.
    pub max_runners: Option<u32>,
}

/// What a claim got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The jobs now claimed by this host, in the request's order.
    pub job_ids: Vec<JobId>,
    /// The fleet-wide `max_runners` held back at least one job no other host had claimed.
    pub at_ceiling: bool,
}

/// The fleet as `rm-agent status` shows it: every host that has a lease row (live or not),
/// the claims that count under each live one, and the live leaders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetView {
    /// When this view was read, on the journal's clock.
    pub now_ms: UnixMs,
    pub hosts: Vec<HostView>,
    pub leaders: Vec<LeaderView>,
}

/// One host in the [`FleetView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostView {
    pub host: String,
    pub labels: Vec<String>,
    pub policies: Vec<String>,
    /// When its current lease began.
    pub registered_at_ms: UnixMs,
    /// Its last renewal.
    pub renewed_at_ms: UnixMs,
    pub expires_at_ms: UnixMs,
    /// The lease holds: the host is alive for the fleet.
    pub live: bool,
    /// Its claims that count (none once its lease expired), oldest first.
    pub claims: Vec<ClaimView>,
}

/// One claim in the [`FleetView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimView {
    pub job_id: JobId,
    pub policy: String,
    /// The runner started for it, once the host has said.
    pub runner_name: Option<String>,
    pub claimed_at_ms: UnixMs,
    /// The job's state (queued or in progress: a completed job's claim has ended).
    #[serde(serialize_with = "state_name")]
    pub job_state: JobState,
}

/// A job state as its stored name (`queued`, `in_progress`).
fn state_name<S: serde::Serializer>(state: &JobState, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(state.as_str())
}

/// A live leader in the [`FleetView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderView {
    pub role: String,
    pub host: String,
    pub acquired_at_ms: UnixMs,
    pub renewed_at_ms: UnixMs,
    pub expires_at_ms: UnixMs,
}

/// The fleet's shared state: one interface over the PostgreSQL journal ([`crate::PgFleet`])
/// and the SQLite one ([`LocalFleet`]). Calls block (make them off the async runtime); each is
/// one transaction.
pub trait Fleet {
    /// Registers or renews `info.host`'s lease for `ttl` from now, and records its labels and
    /// policies. Also forgets the host's claims on completed jobs (they no longer count).
    fn renew_lease(&mut self, info: &HostInfo, ttl: Duration) -> Result<Lease, FleetError>;

    /// Ends `host`'s lease now (an orderly shutdown): its claims and leaderships go with it.
    fn leave(&mut self, host: &str) -> Result<(), FleetError>;

    /// Claims for `request.host` those of `request.job_ids` that are queued and claimed by no
    /// live claim, up to the policy's fleet-wide `max_runners`. Refused with
    /// [`FleetError::LeaseExpired`] unless the host's lease is live.
    fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Claimed, FleetError>;

    /// Records the runner started for `host`'s claim on `job_id`; `false` if the host no longer
    /// holds that claim (released, or taken over after its lease expired).
    fn name_runner(
        &mut self,
        host: &str,
        job_id: JobId,
        runner_name: &str,
    ) -> Result<bool, FleetError>;

    /// Ends `host`'s claim on `job_id` (the runner gave up without the job): the job is free to
    /// claim again. `false` if the host did not hold it.
    fn release(&mut self, host: &str, job_id: JobId) -> Result<bool, FleetError>;

    /// Leads `role` for `ttl` from now if no live lease holds it or `host` holds it (then it is
    /// renewed); `false` while another host's lease on it is live.
    fn try_lead(&mut self, role: &str, host: &str, ttl: Duration) -> Result<bool, FleetError>;

    /// Gives up `role` if `host` leads it, so another host can take it at once; `false` if it
    /// did not.
    fn resign(&mut self, role: &str, host: &str) -> Result<bool, FleetError>;

    /// The fleet for `status`.
    fn view(&mut self) -> Result<FleetView, FleetError>;

    /// Reserves one request of `scope` (what GitHub counts together across the fleet's hosts:
    /// one installation's content creations) for `host` now, if every one of `windows` has
    /// room for it beside what every host reserved; `None` when reserved, else how long until
    /// they all have room (nothing is reserved: ask again then).
    fn reserve(
        &mut self,
        scope: &str,
        host: &str,
        windows: &[SpendWindow],
    ) -> Result<Option<Duration>, FleetError>;
}

/// A sliding window of a shared limit: at most `limit` requests in any `span`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpendWindow {
    pub limit: u32,
    pub span: Duration,
}

/// The span of the longest of `windows`: what was reserved before it can be forgotten.
pub(crate) fn longest_ms(windows: &[SpendWindow]) -> i64 {
    windows
        .iter()
        .map(|w| i64::try_from(w.span.as_millis()).unwrap_or(i64::MAX))
        .max()
        .unwrap_or(0)
}

/// How long from `now_ms` until one more request fits in every one of `windows`, given when
/// the requests already reserved were (`sent_ms`, oldest first); `None`: it fits now. A
/// request counts in a window while `sent + span > now`. A window whose limit is 0 never has
/// room: the wait is its whole span.
pub(crate) fn room_after(
    sent_ms: &[i64],
    now_ms: i64,
    windows: &[SpendWindow],
) -> Option<Duration> {
    let mut wait: Option<i64> = None;
    for window in windows {
        let span = i64::try_from(window.span.as_millis()).unwrap_or(i64::MAX);
        let counted: Vec<i64> = sent_ms
            .iter()
            .copied()
            .filter(|sent| sent.saturating_add(span) > now_ms)
            .collect();
        let limit = window.limit as usize;
        if counted.len() < limit {
            continue;
        }
        // The oldest `counted - limit + 1` must leave; the last of them leaves at its expiry.
        let this = match counted.get(counted.len() - limit) {
            Some(sent) if limit > 0 => sent.saturating_add(span) - now_ms,
            _ => span,
        };
        wait = Some(wait.map_or(this, |w| w.max(this)));
    }
    wait.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// A lease (host or leader) holds at `now` while its expiry is still ahead.
pub(crate) fn lease_live(expires_at: UnixMs, now: UnixMs) -> bool {
    expires_at > now
}

/// When a lease taken or renewed at `now` for `ttl` expires (saturating).
pub(crate) fn expiry(now: UnixMs, ttl: Duration) -> UnixMs {
    now + ttl
}

/// What a renewal at `now` is, given the host's current lease expiry (`None`: no lease row).
/// `Reacquired` carries no count yet: the caller drops the old claims and fills it in.
pub(crate) fn renewal(current_expiry: Option<UnixMs>, now: UnixMs) -> Renewal {
    match current_expiry {
        None => Renewal::Registered,
        Some(expires) if lease_live(expires, now) => Renewal::Renewed,
        Some(_) => Renewal::Reacquired { dropped_claims: 0 },
    }
}

/// Whether `host` may lead a role whose lease is `current` (holder and expiry; `None`: nobody
/// has held it) at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lead {
    /// Free or expired: `host` takes it.
    Take,
    /// `host` holds it: renew.
    Renew,
    /// Another host's lease is live.
    Refuse,
}

pub(crate) fn lead(current: Option<(&str, UnixMs)>, host: &str, now: UnixMs) -> Lead {
    match current {
        None => Lead::Take,
        Some((holder, _)) if holder == host => Lead::Renew,
        Some((_, expires)) if lease_live(expires, now) => Lead::Refuse,
        Some(_) => Lead::Take,
    }
}

/// Which candidates a host gets: those in `free` (queued, no claim that counts), in the
/// request's order, each once, at most as many as the fleet-wide `max_runners` leaves beside
/// the `live` claims of the policy. Returns them and whether the ceiling held any back.
pub(crate) fn choose(
    candidates: &[JobId],
    free: &HashSet<JobId>,
    live: usize,
    max_runners: Option<u32>,
) -> (Vec<JobId>, bool) {
    let room = max_runners.map_or(usize::MAX, |max| (max as usize).saturating_sub(live));
    let mut seen = HashSet::new();
    let wanted: Vec<JobId> = candidates
        .iter()
        .copied()
        .filter(|id| free.contains(id) && seen.insert(*id))
        .collect();
    let at_ceiling = wanted.len() > room;
    (wanted.into_iter().take(room).collect(), at_ceiling)
}

/// A host row as read, before it is judged against the clock.
pub(crate) struct HostRow {
    pub(crate) host: String,
    pub(crate) registered_at_ms: UnixMs,
    pub(crate) renewed_at_ms: UnixMs,
    pub(crate) expires_at_ms: UnixMs,
    pub(crate) labels: String,
    pub(crate) policies: String,
}

/// A claim row as read, with its job's state.
pub(crate) struct ClaimRow {
    pub(crate) host: String,
    pub(crate) view: ClaimView,
}

/// The [`FleetView`] at `now`: every host with its liveness, the claims that count under
/// the live ones (a dead host's claims and claims on completed jobs are left out), the
/// leaders whose lease holds.
pub(crate) fn assemble(
    now: UnixMs,
    hosts: Vec<HostRow>,
    claims: Vec<ClaimRow>,
    leaders: Vec<LeaderView>,
) -> FleetView {
    let json_list = |text: &str| serde_json::from_str::<Vec<String>>(text).unwrap_or_default();
    let mut views: Vec<HostView> = hosts
        .into_iter()
        .map(|row| HostView {
            labels: json_list(&row.labels),
            policies: json_list(&row.policies),
            live: lease_live(row.expires_at_ms, now),
            host: row.host,
            registered_at_ms: row.registered_at_ms,
            renewed_at_ms: row.renewed_at_ms,
            expires_at_ms: row.expires_at_ms,
            claims: Vec::new(),
        })
        .collect();
    for claim in claims {
        if claim.view.job_state == JobState::Completed {
            continue;
        }
        if let Some(host) = views.iter_mut().find(|h| h.host == claim.host && h.live) {
            host.claims.push(claim.view);
        }
    }
    FleetView {
        now_ms: now,
        hosts: views,
        leaders: leaders
            .into_iter()
            .filter(|leader| lease_live(leader.expires_at_ms, now))
            .collect(),
    }
}

/// A JSON array of names, as the `hosts` table stores labels and policies.
pub(crate) fn json_names(names: &[String]) -> String {
    serde_json::Value::from(names.to_vec()).to_string()
}

#[cfg(test)]
mod tests;
