//! The request budget shared by every caller in the process: one account per installation (or
//! the App itself) and per `x-ratelimit-resource`. It learns the quota from GitHub's
//! `x-ratelimit-*` headers, refuses to send once only the reserve is left, paces requests inside
//! GitHub's documented secondary limits ([`crate::pacing`]: a burst of registrations leaves at
//! once), and stays silent through a secondary limit's wait. It never sleeps for long: a
//! request that would have to wait for a reset, a `retry-after` or more than
//! [`PACING_WAIT_MAX`] for room in a window is refused at once with
//! [`GithubError::RateLimited`], so callers schedule the retry and nothing retries into a limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::error::{GithubError, LimitKind, RateHeaders};
use crate::pacing::{Cost, Pacing, Windows};

/// GitHub's conservative advice for mutating requests, at most one per second: the spacing of
/// [`Pacing::Spaced`], which rm used before it paced by the documented limits.
pub const MUTATION_SPACING: Duration = Duration::from_secs(1);
/// The longest a request waits inside the budget for room in a pacing window; a longer wait is
/// refused with its time, for the caller to schedule.
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
pub fn mutation_wait(last: Option<Instant>, now: Instant, spacing: Duration) -> Duration {
    last.map(|l| (l + spacing).saturating_duration_since(now))
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
        res.reset = Some(crate::clock::from_unix_secs(reset));
    }
}

#[derive(Debug, Default)]
struct ScopeState {
    resources: HashMap<String, ResourceState>,
    secondary_until: Option<SystemTime>,
    secondary_strikes: u32,
    /// When the last mutating request left ([`Pacing::Spaced`]).
    last_mutation: Option<Instant>,
    /// What was sent in the documented limits' windows ([`Pacing::Documented`]).
    windows: Windows,
    /// Requests in flight at once, bounded by the documented concurrency.
    concurrency: Option<Arc<Semaphore>>,
}

#[derive(Debug)]
struct Inner {
    /// How requests of one scope are paced.
    pacing: Pacing,
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
    /// A budget pacing requests by `pacing` (GitHub's documented limits by default).
    pub fn new(pacing: Pacing) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                pacing,
                scopes: HashMap::new(),
                learned: HashMap::new(),
            })),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Whether a request of `endpoint` for `scope` would be admitted now, without reserving
    /// anything: checked before spending other requests (a token) on one that cannot leave.
    pub fn check(
        &self,
        scope: Scope,
        endpoint: &'static str,
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
            admit(res, state.secondary_until, now).map_err(|(kind, retry_at)| {
                GithubError::RateLimited {
                    kind,
                    resource,
                    retry_at,
                }
            })
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
            Pacing::Documented(limits) => Some(Arc::clone(
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
            let state = inner.scopes.entry(scope).or_default();
            let res = state.resources.entry(resource.clone()).or_default();
            if let Err((kind, retry_at)) = admit(res, state.secondary_until, now) {
                return Err(GithubError::RateLimited {
                    kind,
                    resource: resource.clone(),
                    retry_at,
                });
            }
            let t = Instant::now();
            let departure = match pacing {
                Pacing::Documented(limits) => state
                    .windows
                    .departure(endpoint, cost, &limits, t)
                    .unwrap_or(t + crate::pacing::HOUR),
                Pacing::Spaced(spacing) if cost.mutating() => {
                    t + mutation_wait(state.last_mutation, t, spacing)
                }
                Pacing::Spaced(_) => t,
            };
            let wait = departure - t;
            if wait > PACING_WAIT_MAX {
                // GitHub's secondary limits would refuse it: the caller schedules it for then.
                return Err(GithubError::RateLimited {
                    kind: LimitKind::Secondary,
                    resource: resource.clone(),
                    retry_at: now + wait,
                });
            }
            // Claim the departure now so concurrent requests queue behind this one.
            match pacing {
                Pacing::Documented(_) => state.windows.spend(endpoint, cost, departure, t),
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
            res.reset = Some(crate::clock::from_unix_secs(reset));
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::from_unix_secs;
    use crate::pacing::{DOCUMENTED, SecondaryLimits};

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
        let t = Instant::now();
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

    /// A burst of registrations leaves at once up to the documented 80 a minute; the next is
    /// refused with the time it may leave (past the budget's short wait), never sent into the
    /// limit; another installation is not held back.
    #[tokio::test(start_paused = true)]
    async fn a_burst_leaves_at_once_inside_the_documented_limits() {
        let budget = Budget::default();
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
        // Room again once the first leaves the paced minute (61 s): 59 s ahead is over the short
        // wait, so advance the clock to within it and the budget sleeps the rest.
        tokio::time::advance(Duration::from_secs(57)).await;
        assert!(budget.acquire(scope, "get", Cost::Read, now).await.is_ok());
        assert_eq!(Instant::now(), t + Duration::from_secs(61));
    }
}
