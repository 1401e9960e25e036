//! Pacing requests inside GitHub's documented secondary rate limits, so a burst of mutations (the
//! JIT registrations of a 100-job matrix) leaves at once instead of one a second. GitHub
//! documents, per App installation: no more than 900 points per minute to a single REST
//! endpoint (a GET costs 1 point, a mutating request 5), no more than 80 content-creating
//! requests per minute and 500 per hour, and no more than 100 concurrent requests. GitHub adds
//! that the limits may change without notice: its own answers (a 403 or 429 with `retry-after`)
//! still steer the budget, which waits as told.
//!
//! The windows here are sliding, not refilling buckets: a refilling bucket of 80 admits up to
//! 160 in one minute (a full bucket, then what it refills), where a sliding window of the last
//! 60 s holds exactly what GitHub counts in any minute. The decisions are pure; the budget holds
//! the state and the clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// GitHub's documented secondary limits on REST requests of one installation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecondaryLimits {
    /// Points one endpoint may be sent per minute.
    pub points_per_minute: u32,
    /// Content-creating requests per minute, across endpoints.
    pub creations_per_minute: u32,
    /// Content-creating requests per hour, across endpoints.
    pub creations_per_hour: u32,
    /// Requests in flight at once.
    pub concurrent: usize,
}

/// GitHub's documented numbers ("Rate limits for the REST API", secondary rate limits).
pub const DOCUMENTED: SecondaryLimits = SecondaryLimits {
    points_per_minute: 900,
    creations_per_minute: 80,
    creations_per_hour: 500,
    concurrent: 100,
};

/// Points a `GET` (or `HEAD`, `OPTIONS`) costs.
pub const READ_POINTS: u32 = 1;
/// Points a `POST`, `PATCH`, `PUT` or `DELETE` costs.
pub const MUTATION_POINTS: u32 = 5;
/// The span of the per-minute windows.
pub const MINUTE: Duration = Duration::from_secs(60);
/// The span of the per-hour window.
pub const HOUR: Duration = Duration::from_secs(3600);
/// GitHub counts a request when it arrives, rm when it leaves: two requests a minute apart on
/// rm's clock arrive less than a minute apart when the first took longer on its way (a token
/// minted first, a new connection). rm paces by windows this much longer than GitHub's, so a
/// burst's next minute never arrives early.
pub const ARRIVAL_MARGIN: Duration = Duration::from_secs(1);
/// The per-minute windows rm paces by: GitHub's minute and the [`ARRIVAL_MARGIN`].
pub const PACED_MINUTE: Duration = MINUTE.saturating_add(ARRIVAL_MARGIN);
/// The per-hour window rm paces by: GitHub's hour and the [`ARRIVAL_MARGIN`].
pub const PACED_HOUR: Duration = HOUR.saturating_add(ARRIVAL_MARGIN);

/// How a request counts against the secondary limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// A read: 1 point.
    Read,
    /// A change that creates nothing (a runner's deletion): 5 points.
    Mutation,
    /// A request that creates something at GitHub (a JIT registration, a redelivery, an
    /// installation token): 5 points and one content creation. GitHub does not list which
    /// endpoints count as content; rm counts every `POST`, the cautious reading.
    Creation,
}

impl Cost {
    /// The cost of a request by its method: `POST` creates, other writes change, reads read.
    pub fn of_method(method: &http::Method) -> Self {
        match *method {
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS => Cost::Read,
            http::Method::POST => Cost::Creation,
            _ => Cost::Mutation,
        }
    }

    /// Its points against the endpoint's per-minute window.
    pub fn points(self) -> u32 {
        match self {
            Cost::Read => READ_POINTS,
            Cost::Mutation | Cost::Creation => MUTATION_POINTS,
        }
    }

    /// Whether it spends a mutation's place: the spacing of the [`Pacing::Spaced`] rule.
    pub fn mutating(self) -> bool {
        self != Cost::Read
    }
}

/// What was spent in a sliding window: `(when, amount)`, oldest first. Entries may lie a little
/// in the future (a request admitted to leave after a wait is entered at its departure).
#[derive(Debug, Default, Clone)]
pub struct Window {
    spent: VecDeque<(Instant, u32)>,
}

impl Window {
    /// The earliest instant at or after `at` when `amount` more fits under `limit` in a window
    /// of `span`, counting everything entered after `t - span` (reservations ahead of `t`
    /// included, so a window around them can never overflow). `None` when `amount` alone is
    /// over `limit`.
    pub fn earliest(
        &self,
        at: Instant,
        amount: u32,
        limit: u32,
        span: Duration,
    ) -> Option<Instant> {
        if amount > limit {
            return None;
        }
        let mut candidate = at;
        let mut counted: u32 = self
            .spent
            .iter()
            .filter(|(when, _)| *when + span > candidate)
            .map(|(_, n)| *n)
            .sum();
        // Moving the candidate to an entry's expiry drops it from the count; the entries are
        // oldest first, so their expiries are in order too. Entries that had expired by `at`
        // were never counted.
        for (when, n) in &self.spent {
            if counted + amount <= limit {
                break;
            }
            let expiry = *when + span;
            if expiry > at {
                candidate = candidate.max(expiry);
                counted -= n;
            }
        }
        Some(candidate)
    }

    /// Enters `amount` spent at `at`, keeping the entries in order.
    pub fn spend(&mut self, at: Instant, amount: u32) {
        let index = self.spent.partition_point(|(when, _)| *when <= at);
        self.spent.insert(index, (at, amount));
    }

    /// Forgets what left the window before `now`.
    pub fn expire(&mut self, now: Instant, span: Duration) {
        while self
            .spent
            .front()
            .is_some_and(|(when, _)| *when + span <= now)
        {
            self.spent.pop_front();
        }
    }

    /// What was spent in the `span` up to `now` (reservations ahead of it left out).
    pub fn total(&self, now: Instant, span: Duration) -> u32 {
        self.spent
            .iter()
            .filter(|(when, _)| *when <= now && *when + span > now)
            .map(|(_, n)| *n)
            .sum()
    }
}

/// One scope's windows: the points of each endpoint, the content creations per minute and per
/// hour.
#[derive(Debug, Default, Clone)]
pub struct Windows {
    points: std::collections::HashMap<&'static str, Window>,
    creations_minute: Window,
    creations_hour: Window,
}

impl Windows {
    /// When a request of `cost` to `endpoint` may leave, at or after `now`, under `limits`:
    /// the first instant every window it counts in has room. `None` when it can never fit.
    pub fn departure(
        &self,
        endpoint: &'static str,
        cost: Cost,
        limits: &SecondaryLimits,
        now: Instant,
    ) -> Option<Instant> {
        let empty = Window::default();
        let points = self.points.get(endpoint).unwrap_or(&empty);
        let mut at = now;
        // Each window's earliest is monotone in `at`: repeat until all agree.
        loop {
            let mut next =
                points.earliest(at, cost.points(), limits.points_per_minute, PACED_MINUTE)?;
            if cost == Cost::Creation {
                next = next.max(self.creations_minute.earliest(
                    next,
                    1,
                    limits.creations_per_minute,
                    PACED_MINUTE,
                )?);
                next = next.max(self.creations_hour.earliest(
                    next,
                    1,
                    limits.creations_per_hour,
                    PACED_HOUR,
                )?);
            }
            if next == at {
                return Some(at);
            }
            at = next;
        }
    }

    /// Enters a request of `cost` to `endpoint` leaving at `at`; forgets what expired by `now`.
    pub fn spend(&mut self, endpoint: &'static str, cost: Cost, at: Instant, now: Instant) {
        let points = self.points.entry(endpoint).or_default();
        points.expire(now, PACED_MINUTE);
        points.spend(at, cost.points());
        if cost == Cost::Creation {
            self.creations_minute.expire(now, PACED_MINUTE);
            self.creations_minute.spend(at, 1);
            self.creations_hour.expire(now, PACED_HOUR);
            self.creations_hour.spend(at, 1);
        }
    }

    /// Content creations counted in the last minute and the last hour, for `status`.
    pub fn creations(&self, now: Instant) -> (u32, u32) {
        (
            self.creations_minute.total(now, MINUTE),
            self.creations_hour.total(now, HOUR),
        )
    }
}

/// How mutating requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Inside GitHub's documented secondary limits (the default): bursts leave at once.
    Documented(SecondaryLimits),
    /// Every mutation at least this long after the previous one of its installation: GitHub's
    /// conservative advice ("at least one second between each request"), what rm did before,
    /// kept for the benchmark that compares the two.
    Spaced(Duration),
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing::Documented(DOCUMENTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn a_window_admits_up_to_its_limit_then_when_the_oldest_leaves() {
        let t = Instant::now();
        let mut w = Window::default();
        for s in 0..3 {
            w.spend(at(t, s), 5);
        }
        // 15 of 20 spent: one more 5 fits now, a second only once the first entry expires.
        assert_eq!(w.earliest(at(t, 3), 5, 20, MINUTE), Some(at(t, 3)));
        w.spend(at(t, 3), 5);
        assert_eq!(w.earliest(at(t, 3), 5, 20, MINUTE), Some(at(t, 60)));
        assert_eq!(w.earliest(at(t, 3), 10, 20, MINUTE), Some(at(t, 61)));
        assert_eq!(w.earliest(at(t, 3), 21, 20, MINUTE), None);
        assert_eq!(w.total(at(t, 30), MINUTE), 20);
        assert_eq!(w.total(at(t, 61), MINUTE), 10);
        w.expire(at(t, 61), MINUTE);
        assert_eq!(w.total(at(t, 61), MINUTE), 10);
    }

    #[test]
    fn a_reservation_ahead_counts_against_requests_before_it() {
        let t = Instant::now();
        let mut w = Window::default();
        w.spend(at(t, 10), 1);
        w.spend(at(t, 0), 1);
        // Ordered on entry, whatever the order of entering.
        assert_eq!(w.earliest(at(t, 5), 1, 2, MINUTE), Some(at(t, 60)));
    }

    /// The documented limits make a 100-job matrix leave 80 registrations at once and the rest
    /// as the first ones age out of the minute; a burst of deletions is held only by points.
    #[test]
    fn a_burst_leaves_inside_the_documented_limits() {
        let t = Instant::now();
        let mut w = Windows::default();
        let mut departures = Vec::new();
        for _ in 0..100 {
            let d = w
                .departure("repos.runners.jit", Cost::Creation, &DOCUMENTED, t)
                .unwrap();
            w.spend("repos.runners.jit", Cost::Creation, d, t);
            departures.push(d);
        }
        assert!(departures[..80].iter().all(|d| *d == t));
        // A minute and the arrival margin after the first.
        assert!(departures[80..].iter().all(|d| *d == at(t, 61)));
        assert_eq!(w.creations(t), (80, 80));

        // 180 deletions of 5 points fill one endpoint's 900 points; other endpoints are apart.
        let mut w = Windows::default();
        for n in 0..181 {
            let d = w
                .departure("orgs.runners.delete", Cost::Mutation, &DOCUMENTED, t)
                .unwrap();
            assert_eq!(d, if n < 180 { t } else { at(t, 61) }, "deletion {n}");
            w.spend("orgs.runners.delete", Cost::Mutation, d, t);
        }
        assert_eq!(
            w.departure("orgs.runners.list", Cost::Read, &DOCUMENTED, t),
            Some(t)
        );
        assert_eq!(w.creations(t), (0, 0));
    }

    #[test]
    fn the_hour_window_holds_creations_past_the_minute() {
        let t = Instant::now();
        let limits = SecondaryLimits {
            creations_per_minute: 80,
            creations_per_hour: 100,
            ..DOCUMENTED
        };
        let mut w = Windows::default();
        for minute in 0..2 {
            for _ in 0..50 {
                // A paced minute apart (GitHub's and the arrival margin).
                let now = at(t, minute * 61);
                let d = w.departure("jit", Cost::Creation, &limits, now).unwrap();
                assert_eq!(d, now);
                w.spend("jit", Cost::Creation, d, now);
            }
        }
        // 100 in the hour: the next waits for the first to leave the hour, not the minute.
        assert_eq!(
            w.departure("jit", Cost::Creation, &limits, at(t, 120)),
            Some(at(t, 3601))
        );
    }

    #[test]
    fn costs_follow_the_method() {
        assert_eq!(Cost::of_method(&http::Method::GET), Cost::Read);
        assert_eq!(Cost::of_method(&http::Method::POST), Cost::Creation);
        assert_eq!(Cost::of_method(&http::Method::DELETE), Cost::Mutation);
        assert_eq!(Cost::Read.points(), 1);
        assert_eq!(Cost::Creation.points(), 5);
        assert!(!Cost::Read.mutating() && Cost::Mutation.mutating());
    }
}
