//! The request budget shared by every caller in the process: one account per installation (or
//! the App itself) and per `x-ratelimit-resource`. It learns the quota from GitHub's
//! `x-ratelimit-*` headers, refuses to send once only the reserve is left, paces requests inside
//! GitHub's documented secondary limits ([`crate::pacing`]: a burst of registrations leaves at
//! once), and stays silent through a secondary limit's wait. A secondary limit also teaches a
//! scope that GitHub counts its `POST`s as content ([`crate::pacing::content_rule`]); the
//! per-scope [`PacingSnapshot`] says so, why and until when. It never sleeps for long: a
//! request that would have to wait for a reset, a `retry-after` or more than its wait bound
//! ([`PACING_WAIT_MAX`] unless the client says otherwise) for room in a window is refused at
//! once with [`GithubError::RateLimited`], so callers schedule the retry and nothing retries
//! into a limit. Its windows run on the client's clock: the caller passes the time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{GithubError, LimitKind, RateHeaders};
use crate::pacing::{ContentReason, Cost, PacedBy, Pacing, Windows, content_rule};

/// GitHub's conservative advice for mutating requests, at most one per second: the spacing of
/// [`Pacing::Spaced`], which rm used before it paced by the documented limits.
pub const MUTATION_SPACING: Duration = Duration::from_secs(1);
/// The longest a request waits inside the budget for room in a pacing window by default; a
/// longer wait is refused with its time, for the caller to schedule. A few seconds keeps a
/// burst's tail in one call instead of a retry; the client can set another bound
/// (`ClientConfig::pacing_wait_max`; zero refuses every wait, for a test on a manual clock).
pub const PACING_WAIT_MAX: Duration = Duration::from_secs(5);
/// Longest wait after repeated secondary limits that came without `retry-after`.
pub const SECONDARY_BACKOFF_CAP: Duration = Duration::from_secs(16 * 60);
/// First wait after a secondary limit without `retry-after`; doubles with each further one.
pub const SECONDARY_BACKOFF_BASE: Duration = crate::error::SECONDARY_DEFAULT_WAIT;
/// The resource assumed for an endpoint until GitHub names it in `x-ratelimit-resource`.
pub const DEFAULT_RESOURCE: &str = "core";

/// Whose quota a request spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Requests signed with this App's JWT (its id): each App has its own quota.
    App(u64),
    /// Requests made with an installation token. Installation ids are unique across Apps, so
    /// the id alone names whose quota it is (the client knows which App it belongs to).
    Installation(u64),
}

impl std::fmt::Display for Scope {
    /// The label `status` and `/metrics` show: `app:<id>` or `installation:<id>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::App(id) => write!(f, "app:{id}"),
            Scope::Installation(id) => write!(f, "installation:{id}"),
        }
    }
}

/// How much of the quota to leave unspent: other hosts and the operator share the account, and
/// a budget spent to zero leaves nothing to clean up runners with.
pub fn reserve(limit: u64) -> u64 {
    (limit / 100).max(1)
}

/// What the budget knows of one resource of one scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceState {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub used: Option<u64>,
    pub reset: Option<SystemTime>,
    /// A primary limit GitHub reported (403/429 with nothing remaining), until its reset.
    pub blocked_until: Option<SystemTime>,
    /// Requests admitted whose answer is not in yet.
    pub in_flight: u64,
    /// Answers that cost quota.
    pub charged: u64,
    /// `304 Not Modified` answers, which cost nothing.
    pub uncharged: u64,
}

/// Whether a request may leave now: `Err` names the limit and when it lifts.
pub fn admit(
    res: &ResourceState,
    secondary_until: Option<SystemTime>,
    now: SystemTime,
) -> Result<(), (LimitKind, SystemTime)> {
    if let Some(until) = secondary_until.filter(|u| *u > now) {
        return Err((LimitKind::Secondary, until));
    }
    if let Some(until) = res.blocked_until.filter(|u| *u > now) {
        return Err((LimitKind::Primary, until));
    }
    if let (Some(limit), Some(remaining), Some(reset)) = (res.limit, res.remaining, res.reset) {
        // After the reset the window is fresh again: let one request through to learn it.
        if reset > now && remaining.saturating_sub(res.in_flight) <= reserve(limit) {
            return Err((LimitKind::Primary, reset));
        }
    }
    Ok(())
}

/// How long a mutating request must still wait after the previous one, `spacing` apart.
pub fn mutation_wait(last: Option<SystemTime>, now: SystemTime, spacing: Duration) -> Duration {
    last.and_then(|l| (l + spacing).duration_since(now).ok())
        .unwrap_or(Duration::ZERO)
}

/// The wait after the `strikes`-th consecutive secondary limit without `retry-after`.
pub fn secondary_backoff(strikes: u32) -> Duration {
    let factor = 1u32 << strikes.saturating_sub(1).min(8);
    (SECONDARY_BACKOFF_BASE * factor).min(SECONDARY_BACKOFF_CAP)
}

/// Folds one answer's headers into the resource's state. `charged` is false for answers GitHub
/// does not count: `304 Not Modified` and `GET /rate_limit`.
pub fn observe(res: &mut ResourceState, charged: bool, rate: &RateHeaders) {
    if charged {
        res.charged += 1;
    } else {
        res.uncharged += 1;
    }
    if let Some(limit) = rate.limit {
        res.limit = Some(limit);
    }
    if let Some(remaining) = rate.remaining {
        res.remaining = Some(remaining);
    }
    if let Some(used) = rate.used {
        res.used = Some(used);
    }
    if let Some(reset) = rate.reset {
        res.reset = Some(crate::wire::from_unix_secs(reset));
    }
}

#[derive(Debug, Default)]
struct ScopeState {
    resources: HashMap<String, ResourceState>,
    secondary_until: Option<SystemTime>,
    secondary_strikes: u32,
    /// When the last mutating request left ([`Pacing::Spaced`]).
    last_mutation: Option<SystemTime>,
    /// When GitHub last answered this scope with a secondary limit: its `POST`s count as
    /// content for a while after ([`content_rule`]).
    content_learned_at: Option<SystemTime>,
    /// The window that held this scope's last request refused for pacing, and until when.
    paced: Option<(PacedBy, SystemTime)>,
    /// What was sent in the documented limits' windows ([`Pacing::Documented`]).
    windows: Windows,
    /// Requests in flight at once, bounded by the documented concurrency.
    concurrency: Option<Arc<Semaphore>>,
}

#[derive(Debug)]
struct Inner {
    /// How requests of one scope are paced.
    pacing: Pacing,
    /// The longest a request sleeps here for room in a window.
    wait_max: Duration,
    scopes: HashMap<Scope, ScopeState>,
    /// Which resource each endpoint spends, as GitHub last said.
    learned: HashMap<&'static str, String>,
}

/// One line of `status` / `/metrics`: a resource of a scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetSnapshot {
    pub scope: Scope,
    pub resource: String,
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub used: Option<u64>,
    pub reset_at: Option<SystemTime>,
    /// Set while no request may leave, with the limit that stops it.
    pub blocked: Option<(LimitKind, SystemTime)>,
    pub charged: u64,
    pub uncharged: u64,
}

/// One scope's pacing, for `status`, `/metrics` and `explain`: whether its `POST`s count as
/// content creation now, why and until when, what the content windows hold, and which of rm's
/// windows held its last refused request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacingSnapshot {
    pub scope: Scope,
    /// `Some` while `POST`s count as content: cautious, or learned at a time until a time.
    pub counted: Option<ContentReason>,
    /// `POST`s sent in the last minute and the last hour (recorded whether counted or not).
    pub creations_minute: u32,
    pub creations_hour: u32,
    /// The content limits they are held to while counted (GitHub's documented 80 and 500).
    pub limit_minute: u32,
    pub limit_hour: u32,
    /// The window that refused this scope's last request for pacing, and until when.
    pub paced: Option<(PacedBy, SystemTime)>,
}

impl PacingSnapshot {
    /// When counting content ends, if it is counted and ends (`cautious` never does).
    pub fn until(&self) -> Option<SystemTime> {
        match self.counted {
            Some(ContentReason::Learned { until, .. }) => Some(until),
            _ => None,
        }
    }
}

/// The shared budget. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Budget {
    inner: Arc<Mutex<Inner>>,
}

/// A request admitted by the budget; hand it back with [`Budget::record`]. Dropping it unrecorded
/// (the request never got an answer) releases its in-flight slot.
#[derive(Debug)]
pub struct Permit {
    budget: Budget,
    scope: Scope,
    resource: String,
    endpoint: &'static str,
    done: bool,
    /// The scope's concurrency slot, held until the answer is in.
    _slot: Option<OwnedSemaphorePermit>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.budget.with(|inner| {
                if let Some(res) = inner
                    .scopes
                    .get_mut(&self.scope)
                    .and_then(|s| s.resources.get_mut(&self.resource))
                {
                    res.in_flight = res.in_flight.saturating_sub(1);
                }
            });
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(Pacing::default())
    }
}

impl Budget {
    /// A budget pacing requests by `pacing` (GitHub's documented limits by default), sleeping
    /// up to [`PACING_WAIT_MAX`] for room.
    pub fn new(pacing: Pacing) -> Self {
        Self::with_wait_max(pacing, PACING_WAIT_MAX)
    }

    /// A budget pacing by `pacing` that sleeps at most `wait_max` for room in a window.
    pub fn with_wait_max(pacing: Pacing, wait_max: Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                pacing,
                wait_max,
                scopes: HashMap::new(),
                learned: HashMap::new(),
            })),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Whether a request of `endpoint` for `scope` that costs `cost` would be admitted now,
    /// without reserving anything: checked before spending other requests (a token) on one that
    /// cannot leave, and by the choice of the installation a registration goes through (a full
    /// pacing window says so here, before anything is reserved elsewhere). Refuses as
    /// [`Budget::acquire`] would: a reported limit, or the pacing windows holding it past the
    /// wait bound.
    pub fn check(
        &self,
        scope: Scope,
        endpoint: &'static str,
        cost: Cost,
        now: SystemTime,
    ) -> Result<(), GithubError> {
        self.with(|inner| {
            let resource = inner
                .learned
                .get(endpoint)
                .cloned()
                .unwrap_or_else(|| DEFAULT_RESOURCE.to_owned());
            let Some(state) = inner.scopes.get(&scope) else {
                return Ok(());
            };
            let fresh = ResourceState::default();
            let res = state.resources.get(&resource).unwrap_or(&fresh);
            let refused = |kind, retry_at| GithubError::RateLimited {
                kind,
                resource: resource.clone(),
                retry_at,
            };
            admit(res, state.secondary_until, now).map_err(|(kind, at)| refused(kind, at))?;
            let departure = match inner.pacing {
                Pacing::Documented(limits) | Pacing::Cautious(limits) => {
                    let template = crate::endpoints::template(endpoint).unwrap_or(endpoint);
                    let content =
                        content_rule(&inner.pacing, state.content_learned_at, now).is_some();
                    state
                        .windows
                        .departure(template, cost, content, &limits, now)
                        .unwrap_or(now + crate::pacing::HOUR)
                }
                Pacing::Spaced(spacing) if cost.mutating() => {
                    now + mutation_wait(state.last_mutation, now, spacing)
                }
                Pacing::Spaced(_) => now,
            };
            match departure.duration_since(now) {
                Ok(wait) if wait > inner.wait_max => Err(refused(LimitKind::Secondary, departure)),
                _ => Ok(()),
            }
        })
    }

    /// Admits one request of `endpoint` for `scope` that costs `cost`, waiting (briefly) for a
    /// concurrency slot and for room under the pacing rule.
    pub async fn acquire(
        &self,
        scope: Scope,
        endpoint: &'static str,
        cost: Cost,
        now: SystemTime,
    ) -> Result<Permit, GithubError> {
        let concurrency = self.with(|inner| match inner.pacing {
            Pacing::Documented(limits) | Pacing::Cautious(limits) => Some(Arc::clone(
                inner
                    .scopes
                    .entry(scope)
                    .or_default()
                    .concurrency
                    .get_or_insert_with(|| Arc::new(Semaphore::new(limits.concurrent))),
            )),
            Pacing::Spaced(_) => None,
        });
        // Requests end within their timeout, so a full scope frees a slot soon.
        let slot = match concurrency {
            Some(semaphore) => semaphore.acquire_owned().await.ok(),
            None => None,
        };
        let (resource, wait) = self.with(|inner| {
            let resource = inner
                .learned
                .get(endpoint)
                .cloned()
                .unwrap_or_else(|| DEFAULT_RESOURCE.to_owned());
            let pacing = inner.pacing;
            let wait_max = inner.wait_max;
            let state = inner.scopes.entry(scope).or_default();
            let res = state.resources.entry(resource.clone()).or_default();
            if let Err((kind, retry_at)) = admit(res, state.secondary_until, now) {
                return Err(GithubError::RateLimited {
                    kind,
                    resource: resource.clone(),
                    retry_at,
                });
            }
            // GitHub counts points per path template: every name and target of it share one.
            let template = crate::endpoints::template(endpoint).unwrap_or(endpoint);
            let content = content_rule(&pacing, state.content_learned_at, now).is_some();
            let departure = match pacing {
                Pacing::Documented(limits) | Pacing::Cautious(limits) => state
                    .windows
                    .departure(template, cost, content, &limits, now)
                    .unwrap_or(now + crate::pacing::HOUR),
                Pacing::Spaced(spacing) if cost.mutating() => {
                    now + mutation_wait(state.last_mutation, now, spacing)
                }
                Pacing::Spaced(_) => now,
            };
            let wait = departure.duration_since(now).unwrap_or(Duration::ZERO);
            if wait > wait_max {
                // GitHub's secondary limits would refuse it: the caller schedules it for then.
                let by = match pacing {
                    Pacing::Documented(limits) | Pacing::Cautious(limits) => {
                        state.windows.binding(template, cost, content, &limits, now)
                    }
                    Pacing::Spaced(_) => PacedBy::Spacing,
                };
                state.paced = Some((by, departure));
                return Err(GithubError::RateLimited {
                    kind: LimitKind::Secondary,
                    resource: resource.clone(),
                    retry_at: now + wait,
                });
            }
            // Claim the departure now so concurrent requests queue behind this one.
            match pacing {
                Pacing::Documented(_) | Pacing::Cautious(_) => {
                    state.windows.spend(template, cost, departure, now)
                }
                Pacing::Spaced(_) if cost.mutating() => state.last_mutation = Some(departure),
                Pacing::Spaced(_) => {}
            }
            res.in_flight += 1;
            Ok((resource, wait))
        })?;
        let permit = Permit {
            budget: self.clone(),
            scope,
            resource,
            endpoint,
            done: false,
            _slot: slot,
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(permit)
    }

    /// Records the answer to an admitted request; `limited` is its classification when GitHub
    /// answered with a rate limit.
    pub fn record(
        &self,
        mut permit: Permit,
        charged: bool,
        rate: &RateHeaders,
        limited: Option<(LimitKind, SystemTime)>,
        now: SystemTime,
    ) {
        permit.done = true;
        self.with(|inner| {
            let resource = rate.resource.clone().unwrap_or(permit.resource.clone());
            inner.learned.insert(permit.endpoint, resource.clone());
            let state = inner.scopes.entry(permit.scope).or_default();
            if let Some(res) = state.resources.get_mut(&permit.resource) {
                res.in_flight = res.in_flight.saturating_sub(1);
            }
            let res = state.resources.entry(resource).or_default();
            observe(res, charged, rate);
            match limited {
                Some((LimitKind::Primary, until)) => res.blocked_until = Some(until),
                Some((LimitKind::Secondary, until)) => {
                    state.secondary_strikes += 1;
                    let until = if rate.retry_after.is_some() {
                        until
                    } else {
                        now + secondary_backoff(state.secondary_strikes)
                    };
                    state.secondary_until = Some(until);
                    // GitHub showed it holds this scope to a secondary limit rm did not pace
                    // by: from now on its POSTs count as content (for `CONTENT_LEARNED_FOR`).
                    state.content_learned_at = Some(now);
                }
                None => state.secondary_strikes = 0,
            }
        });
    }

    /// Takes GitHub's word (from `GET /rate_limit`) for a resource's quota.
    pub fn seed(&self, scope: Scope, resource: &str, limit: u64, remaining: u64, reset: u64) {
        self.with(|inner| {
            let state = inner.scopes.entry(scope).or_default();
            let res = state.resources.entry(resource.to_owned()).or_default();
            res.limit = Some(limit);
            res.remaining = Some(remaining);
            res.used = Some(limit.saturating_sub(remaining));
            res.reset = Some(crate::wire::from_unix_secs(reset));
        });
    }

    /// Every resource of every scope seen so far.
    pub fn snapshot(&self, now: SystemTime) -> Vec<BudgetSnapshot> {
        self.with(|inner| {
            let mut out: Vec<BudgetSnapshot> = inner
                .scopes
                .iter()
                .flat_map(|(scope, state)| {
                    state
                        .resources
                        .iter()
                        .map(move |(name, res)| BudgetSnapshot {
                            scope: *scope,
                            resource: name.clone(),
                            limit: res.limit,
                            remaining: res.remaining,
                            used: res.used,
                            reset_at: res.reset,
                            blocked: admit(
                                &ResourceState {
                                    in_flight: 0,
                                    ..res.clone()
                                },
                                state.secondary_until,
                                now,
                            )
                            .err(),
                            charged: res.charged,
                            uncharged: res.uncharged,
                        })
                })
                .collect();
            out.sort_by(|a, b| (a.scope, &a.resource).cmp(&(b.scope, &b.resource)));
            out
        })
    }

    /// Whether `scope`'s `POST`s count as content at `now`, and why.
    pub fn content_counted(&self, scope: Scope, now: SystemTime) -> Option<ContentReason> {
        self.with(|inner| {
            let learned = inner.scopes.get(&scope).and_then(|s| s.content_learned_at);
            content_rule(&inner.pacing, learned, now)
        })
    }

    /// Every scope's content pacing (scopes seen so far), in scope order.
    pub fn content(&self, now: SystemTime) -> Vec<PacingSnapshot> {
        self.with(|inner| {
            let limits = inner.pacing.limits().unwrap_or(crate::pacing::DOCUMENTED);
            let mut out: Vec<PacingSnapshot> = inner
                .scopes
                .iter()
                .map(|(scope, state)| {
                    let (minute, hour) = state.windows.creations(now);
                    PacingSnapshot {
                        scope: *scope,
                        counted: content_rule(&inner.pacing, state.content_learned_at, now),
                        creations_minute: minute,
                        creations_hour: hour,
                        limit_minute: limits.creations_per_minute,
                        limit_hour: limits.creations_per_hour,
                        paced: state.paced.filter(|(_, until)| *until > now),
                    }
                })
                .collect();
            out.sort_by_key(|c| c.scope);
            out
        })
    }
}

impl crate::client::GithubClient {
    /// Every scope's content pacing now, for `status`, `/metrics` and `explain`.
    pub fn content_pacing(&self) -> Vec<PacingSnapshot> {
        self.inner.budget.content(self.inner.now())
    }

    /// Whether `installation`'s `POST`s count as content now (the fleet's shared windows follow
    /// it per registration).
    pub fn counts_content(&self, installation: u64) -> Option<ContentReason> {
        self.inner
            .budget
            .content_counted(Scope::Installation(installation), self.inner.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pacing::{DOCUMENTED, SecondaryLimits};
    use crate::wire::from_unix_secs;

    fn res(limit: u64, remaining: u64, reset: u64) -> ResourceState {
        ResourceState {
            limit: Some(limit),
            remaining: Some(remaining),
            reset: Some(from_unix_secs(reset)),
            ..Default::default()
        }
    }

    #[test]
    fn stops_before_the_quota_is_spent() {
        let now = from_unix_secs(100);
        assert_eq!(reserve(5000), 50);
        assert_eq!(reserve(10), 1);
        assert!(admit(&res(5000, 51, 200), None, now).is_ok());
        assert_eq!(
            admit(&res(5000, 50, 200), None, now),
            Err((LimitKind::Primary, from_unix_secs(200)))
        );
        // In-flight requests count against what is left.
        let mut r = res(5000, 60, 200);
        r.in_flight = 10;
        assert!(admit(&r, None, now).is_err());
    }

    #[test]
    fn a_passed_reset_reopens_the_window() {
        assert!(admit(&res(5000, 0, 100), None, from_unix_secs(100)).is_ok());
    }

    #[test]
    fn secondary_and_reported_primary_limits_block_until_they_lift() {
        let now = from_unix_secs(100);
        let fresh = ResourceState::default();
        assert_eq!(
            admit(&fresh, Some(from_unix_secs(130)), now),
            Err((LimitKind::Secondary, from_unix_secs(130)))
        );
        assert!(admit(&fresh, Some(from_unix_secs(100)), now).is_ok());
        let blocked = ResourceState {
            blocked_until: Some(from_unix_secs(500)),
            ..Default::default()
        };
        assert_eq!(
            admit(&blocked, None, now),
            Err((LimitKind::Primary, from_unix_secs(500)))
        );
    }

    #[test]
    fn mutations_are_spaced_a_second_apart() {
        let t = from_unix_secs(1000);
        assert_eq!(mutation_wait(None, t, MUTATION_SPACING), Duration::ZERO);
        assert_eq!(
            mutation_wait(Some(t), t, MUTATION_SPACING),
            MUTATION_SPACING
        );
        assert_eq!(
            mutation_wait(Some(t), t + Duration::from_millis(400), MUTATION_SPACING),
            Duration::from_millis(600)
        );
        assert_eq!(
            mutation_wait(Some(t), t + Duration::from_secs(5), MUTATION_SPACING),
            Duration::ZERO
        );
    }

    #[test]
    fn secondary_backoff_doubles_from_a_minute_and_is_capped() {
        assert_eq!(secondary_backoff(1), Duration::from_secs(60));
        assert_eq!(secondary_backoff(2), Duration::from_secs(120));
        assert_eq!(secondary_backoff(3), Duration::from_secs(240));
        assert_eq!(secondary_backoff(30), SECONDARY_BACKOFF_CAP);
    }

    #[test]
    fn not_modified_answers_are_counted_apart() {
        let mut r = ResourceState::default();
        let rate = RateHeaders {
            limit: Some(5000),
            remaining: Some(4990),
            used: Some(10),
            reset: Some(99),
            ..Default::default()
        };
        observe(&mut r, true, &rate);
        observe(&mut r, false, &rate);
        observe(&mut r, false, &RateHeaders::default());
        assert_eq!((r.charged, r.uncharged), (1, 2));
        assert_eq!(r.remaining, Some(4990));
        assert_eq!(r.reset, Some(from_unix_secs(99)));
    }

    #[tokio::test(start_paused = true)]
    async fn spaced_mutations_queue_behind_each_other() {
        use tokio::time::Instant;
        let budget = Budget::new(Pacing::Spaced(MUTATION_SPACING));
        let now = from_unix_secs(100);
        let start = Instant::now();
        let a = budget
            .acquire(Scope::Installation(1), "m", Cost::Creation, now)
            .await;
        let b = budget
            .acquire(Scope::Installation(1), "m", Cost::Creation, now)
            .await;
        let c = budget
            .acquire(Scope::Installation(1), "m", Cost::Creation, now)
            .await;
        assert!(a.is_ok() && b.is_ok() && c.is_ok());
        assert!(Instant::now() - start >= 2 * MUTATION_SPACING);
        // Reads and other scopes are not held back.
        let before = Instant::now();
        let _r = budget
            .acquire(Scope::Installation(1), "r", Cost::Read, now)
            .await;
        let _o = budget
            .acquire(Scope::Installation(2), "m", Cost::Creation, now)
            .await;
        assert_eq!(Instant::now(), before);
    }

    #[tokio::test]
    async fn a_reported_limit_refuses_until_it_lifts_and_learns_the_resource() {
        let budget = Budget::default();
        let now = from_unix_secs(100);
        let scope = Scope::Installation(7);
        let p = budget.acquire(scope, "jit", Cost::Creation, now).await;
        let p = p.unwrap_or_else(|e| panic!("{e}"));
        let rate = RateHeaders {
            limit: Some(10_000),
            remaining: Some(0),
            reset: Some(400),
            resource: Some("actions_runner_registration".into()),
            ..Default::default()
        };
        budget.record(
            p,
            true,
            &rate,
            Some((LimitKind::Primary, from_unix_secs(400))),
            now,
        );
        match budget
            .acquire(scope, "jit", Cost::Creation, from_unix_secs(399))
            .await
        {
            Err(GithubError::RateLimited {
                kind: LimitKind::Primary,
                resource,
                ..
            }) => {
                assert_eq!(resource, "actions_runner_registration")
            }
            other => panic!("{other:?}"),
        }
        // The core budget of the same installation is untouched.
        assert!(budget.acquire(scope, "list", Cost::Read, now).await.is_ok());
        assert!(
            budget
                .acquire(scope, "jit", Cost::Creation, from_unix_secs(400))
                .await
                .is_ok()
        );
        let snap = budget.snapshot(now);
        assert!(
            snap.iter()
                .any(|s| s.resource == "actions_runner_registration" && s.blocked.is_some())
        );
    }

    #[tokio::test]
    async fn secondary_without_retry_after_backs_off_and_a_success_clears_the_strikes() {
        let budget = Budget::default();
        let scope = Scope::App(1);
        let now = from_unix_secs(1000);
        for (strike, wait) in [(1u64, 60u64), (2, 120)] {
            let t = now + Duration::from_secs(strike * 10_000);
            let p = budget
                .acquire(scope, "e", Cost::Read, t)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            budget.record(
                p,
                true,
                &RateHeaders::default(),
                Some((LimitKind::Secondary, t)),
                t,
            );
            let until = t + Duration::from_secs(wait);
            assert!(
                budget
                    .acquire(scope, "e", Cost::Read, until - Duration::from_secs(1))
                    .await
                    .is_err()
            );
            let p = budget
                .acquire(scope, "e", Cost::Read, until)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            drop(p);
        }
        let t = now + Duration::from_secs(50_000);
        let p = budget
            .acquire(scope, "e", Cost::Read, t)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        budget.record(p, true, &RateHeaders::default(), None, t);
        let p = budget
            .acquire(scope, "e", Cost::Read, t)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        budget.record(
            p,
            true,
            &RateHeaders::default(),
            Some((LimitKind::Secondary, t)),
            t,
        );
        assert!(
            budget
                .acquire(scope, "e", Cost::Read, t + Duration::from_secs(60))
                .await
                .is_ok()
        );
    }

    /// Cautious: a burst of registrations leaves at once up to the documented 80 a minute; the
    /// next is refused with the time it may leave (past the budget's short wait), never sent
    /// into the limit; another installation is not held back.
    #[tokio::test(start_paused = true)]
    async fn cautious_a_burst_leaves_at_once_inside_the_content_limits() {
        use tokio::time::Instant;
        let budget = Budget::new(Pacing::Cautious(DOCUMENTED));
        let now = from_unix_secs(1000);
        let start = Instant::now();
        let scope = Scope::Installation(1);
        let mut permits = Vec::new();
        for _ in 0..DOCUMENTED.creations_per_minute {
            permits.push(
                budget
                    .acquire(scope, "jit", Cost::Creation, now)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        assert_eq!(Instant::now(), start, "the burst waited");
        match budget.acquire(scope, "jit", Cost::Creation, now).await {
            Err(GithubError::RateLimited {
                kind: LimitKind::Secondary,
                retry_at,
                ..
            }) => assert_eq!(
                retry_at,
                now + crate::pacing::MINUTE + crate::pacing::ARRIVAL_MARGIN
            ),
            other => panic!("{other:?}"),
        }
        // Reads of another endpoint, and another installation's creations, still leave.
        assert!(budget.acquire(scope, "list", Cost::Read, now).await.is_ok());
        assert!(
            budget
                .acquire(Scope::Installation(2), "jit", Cost::Creation, now)
                .await
                .is_ok()
        );
        assert_eq!(Instant::now(), start);
    }

    /// A short wait for room is slept inside the budget; the documented concurrency holds a
    /// request until an earlier one is answered.
    #[tokio::test(start_paused = true)]
    async fn short_waits_are_slept_and_concurrency_is_bounded() {
        use tokio::time::Instant;
        let limits = SecondaryLimits {
            points_per_minute: 10,
            concurrent: 2,
            ..DOCUMENTED
        };
        let budget = Budget::new(Pacing::Documented(limits));
        let now = from_unix_secs(1000);
        let scope = Scope::Installation(1);
        let start = Instant::now();
        let first = budget.acquire(scope, "del", Cost::Mutation, now).await;
        let second = budget.acquire(scope, "del", Cost::Mutation, now).await;
        assert!(first.is_ok() && second.is_ok());
        assert_eq!(Instant::now(), start);
        // Both slots are held: a third request waits until one is released.
        let third = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.acquire(scope, "get", Cost::Read, now).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !third.is_finished(),
            "a third request left with two in flight"
        );
        drop(first);
        assert!(third.await.unwrap_or_else(|e| panic!("{e}")).is_ok());
        // 10 points spent on `del`: the next waits a minute, over the budget's short wait.
        assert!(matches!(
            budget.acquire(scope, "del", Cost::Mutation, now).await,
            Err(GithubError::RateLimited { .. })
        ));
        drop(second);
        let limits = SecondaryLimits {
            points_per_minute: 10,
            ..DOCUMENTED
        };
        let budget = Budget::new(Pacing::Documented(limits));
        let t = Instant::now();
        let _a = budget.acquire(scope, "get", Cost::Mutation, now).await;
        let _b = budget.acquire(scope, "get", Cost::Mutation, now).await;
        // Room again once the first leaves the paced minute (61 s): 61 s ahead is over the short
        // wait, so move both clocks to within it and the budget sleeps the rest.
        tokio::time::advance(Duration::from_secs(57)).await;
        let later = now + Duration::from_secs(57);
        assert!(
            budget
                .acquire(scope, "get", Cost::Read, later)
                .await
                .is_ok()
        );
        assert_eq!(Instant::now(), t + Duration::from_secs(61));
        // With no wait allowed, the same request is refused with the time it may leave.
        let budget = Budget::with_wait_max(Pacing::Documented(limits), Duration::ZERO);
        let _a = budget.acquire(scope, "get", Cost::Mutation, now).await;
        let _b = budget.acquire(scope, "get", Cost::Mutation, now).await;
        match budget.acquire(scope, "get", Cost::Read, later).await {
            Err(GithubError::RateLimited { retry_at, .. }) => {
                assert_eq!(retry_at, now + Duration::from_secs(61))
            }
            other => panic!("{other:?}"),
        }
    }

    /// Two names of one path template share its points; another repository's registrations
    /// are the same template (GitHub counts per endpoint, not per path).
    #[tokio::test]
    async fn points_are_counted_per_path_template() {
        let limits = SecondaryLimits {
            points_per_minute: 2,
            ..DOCUMENTED
        };
        let budget = Budget::with_wait_max(Pacing::Documented(limits), Duration::ZERO);
        let now = from_unix_secs(1000);
        let scope = Scope::Installation(1);
        assert!(
            budget
                .acquire(scope, "repos.runners.list", Cost::Read, now)
                .await
                .is_ok()
        );
        assert!(
            budget
                .acquire(scope, "repos.runners.by_name", Cost::Read, now)
                .await
                .is_ok()
        );
        assert!(
            budget
                .acquire(scope, "repos.runners.list", Cost::Read, now)
                .await
                .is_err(),
            "the template's two points were spent under two names"
        );
        assert!(
            budget
                .acquire(scope, "orgs.runners.list", Cost::Read, now)
                .await
                .is_ok()
        );
    }

    /// rm's budget against the fake's ledger (GitHub's secondary limits as the fake counts
    /// them), on a simulated clock with no wait inside the budget: `wanted` registrations of one
    /// installation from the start, sent in order, each as soon as the budget lets it (a refusal
    /// names the time). Returns when each was created and GitHub's secondary-limit answers.
    async fn simulate(
        pacing: Pacing,
        github: rm_fake_github::SecondaryLimits,
        wanted: usize,
    ) -> (Budget, Vec<SystemTime>, Vec<SystemTime>) {
        use rm_fake_github::auth::Caller;
        let budget = Budget::with_wait_max(pacing, Duration::ZERO);
        let scope = Scope::Installation(7);
        let template = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig";
        let mut ledger = rm_fake_github::limits::Ledger::default();
        let mut now = from_unix_secs(1_000_000);
        let (mut created, mut limited) = (Vec::new(), Vec::new());
        while created.len() < wanted {
            let permit = match budget
                .acquire(scope, "repos.runners.jit", Cost::Creation, now)
                .await
            {
                Ok(permit) => permit,
                Err(GithubError::RateLimited { retry_at, .. }) => {
                    assert!(retry_at > now, "refused without a later time");
                    now = retry_at;
                    continue;
                }
                Err(other) => panic!("{other}"),
            };
            ledger.arrive(Caller::Installation(7));
            let answer = ledger.admit(Caller::Installation(7), template, "POST", now, &github);
            ledger.leave(Caller::Installation(7));
            match answer {
                Ok(()) => {
                    budget.record(permit, true, &RateHeaders::default(), None, now);
                    created.push(now);
                }
                Err(refusal) => {
                    let secs = refusal.retry_after_secs();
                    let rate = RateHeaders {
                        retry_after: Some(secs),
                        ..Default::default()
                    };
                    let until = now + Duration::from_secs(secs);
                    budget.record(
                        permit,
                        true,
                        &rate,
                        Some((LimitKind::Secondary, until)),
                        now,
                    );
                    limited.push(now);
                }
            }
        }
        (budget, created, limited)
    }

    /// A GitHub that does not count registrations as content (loose): 180 leave in the first
    /// paced minute (the template's 900 points), then 180 each paced minute, and GitHub never
    /// answers a secondary limit; the scope never starts counting content.
    #[tokio::test]
    async fn loose_github_takes_180_registrations_a_minute_without_a_limit() {
        let loose = rm_fake_github::SecondaryLimits {
            content: rm_fake_github::ContentCounting::Loose,
            ..rm_fake_github::SecondaryLimits::GITHUB
        };
        let (budget, created, limited) = simulate(Pacing::default(), loose, 540).await;
        assert!(
            limited.is_empty(),
            "GitHub had to refuse a registration: {limited:?}"
        );
        let start = created[0];
        let in_minute = |m: u64| {
            created
                .iter()
                .filter(|t| **t >= start + crate::pacing::PACED_MINUTE * m as u32)
                .filter(|t| **t < start + crate::pacing::PACED_MINUTE * (m as u32 + 1))
                .count()
        };
        assert_eq!([in_minute(0), in_minute(1), in_minute(2)], [180, 180, 180]);
        let content = budget.content(start);
        assert_eq!(content.len(), 1);
        assert_eq!(content[0].counted, None);
    }

    /// A GitHub that counts every POST as content (strict): rm sends past 80, meets exactly one
    /// secondary limit, learns, and from then on paces at 80 a paced minute and 500 an hour
    /// without another; the snapshot says content is counted, learned when, until when.
    #[tokio::test]
    async fn strict_github_answers_one_limit_then_rm_paces_at_eighty_a_minute() {
        let strict = rm_fake_github::SecondaryLimits::GITHUB;
        // 500: the hour the learned limit lasts, at the hour's content limit.
        let (budget, created, limited) = simulate(Pacing::default(), strict, 500).await;
        assert_eq!(limited.len(), 1, "{limited:?}");
        let learned = limited[0];
        assert_eq!(created.iter().filter(|t| **t <= learned).count(), 80);
        // After the limit: never more than 80 in any paced minute, 500 in any hour.
        for (i, t) in created.iter().enumerate() {
            let minute = created[i..]
                .iter()
                .take_while(|u| **u < *t + crate::pacing::MINUTE)
                .count();
            assert!(minute <= 80, "{minute} in the minute from registration {i}");
        }
        let first_hour = created
            .iter()
            .filter(|t| **t < created[0] + crate::pacing::HOUR)
            .count();
        // The hour's 500 less the refused request, which rm counted too (GitHub did not).
        assert_eq!(first_hour, 499, "the hour's content limit");
        let content = budget.content(learned);
        assert_eq!(
            content[0].counted,
            Some(ContentReason::Learned {
                at: learned,
                until: learned + crate::pacing::CONTENT_LEARNED_FOR
            })
        );
        assert_eq!(
            content[0].until(),
            Some(learned + crate::pacing::CONTENT_LEARNED_FOR)
        );
        // An hour after the limit, with none since, POSTs stop counting.
        let later = learned + crate::pacing::CONTENT_LEARNED_FOR;
        assert_eq!(budget.content_counted(Scope::Installation(7), later), None);
    }

    /// Cautious against the same strict GitHub: no limit ever, 80 a paced minute from the start.
    #[tokio::test]
    async fn cautious_paces_content_from_the_start() {
        let strict = rm_fake_github::SecondaryLimits::GITHUB;
        let (budget, created, limited) = simulate(Pacing::Cautious(DOCUMENTED), strict, 160).await;
        assert!(limited.is_empty(), "{limited:?}");
        assert_eq!(created[79], created[0]);
        assert_eq!(created[80], created[0] + crate::pacing::PACED_MINUTE);
        assert_eq!(
            budget.content(created[0])[0].counted,
            Some(ContentReason::Cautious)
        );
    }

    /// `check` sees what `acquire` would wait for: a template's full points window refuses
    /// with the time there is room (nothing reserved by asking), other templates and other
    /// installations are free, and a wait inside the bound is not a refusal.
    #[tokio::test]
    async fn check_refuses_what_the_pacing_windows_would_hold_past_the_wait_bound() {
        let limits = SecondaryLimits {
            points_per_minute: 10,
            ..DOCUMENTED
        };
        let budget = Budget::with_wait_max(Pacing::Documented(limits), Duration::ZERO);
        let now = from_unix_secs(1_000);
        let scope = Scope::Installation(1);
        let jit = "repos.runners.jit";
        for _ in 0..2 {
            assert!(budget.check(scope, jit, Cost::Creation, now).is_ok());
            let permit = budget.acquire(scope, jit, Cost::Creation, now).await;
            drop(permit.unwrap_or_else(|e| panic!("{e}")));
        }
        // 10 points spent on the template: room again a paced minute after the first.
        let room = now + crate::pacing::PACED_MINUTE;
        for _ in 0..2 {
            match budget.check(scope, jit, Cost::Creation, now) {
                Err(GithubError::RateLimited {
                    kind: LimitKind::Secondary,
                    retry_at,
                    ..
                }) => assert_eq!(retry_at, room),
                other => panic!("{other:?}"),
            }
        }
        assert!(budget.check(scope, jit, Cost::Creation, room).is_ok());
        assert!(
            budget
                .check(scope, "repos.runners.list", Cost::Read, now)
                .is_ok()
        );
        assert!(
            budget
                .check(Scope::Installation(2), jit, Cost::Creation, now)
                .is_ok()
        );
        // With the default wait bound, a wait of a few seconds is slept, not refused.
        let budget = Budget::new(Pacing::Documented(limits));
        for _ in 0..2 {
            drop(budget.acquire(scope, jit, Cost::Creation, now).await);
        }
        let almost = room - Duration::from_secs(2);
        assert!(budget.check(scope, jit, Cost::Creation, almost).is_ok());
    }
}
