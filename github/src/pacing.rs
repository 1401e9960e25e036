//! Pacing requests inside GitHub's secondary rate limits, so a burst of mutations (the JIT
//! registrations of a 100-job matrix) leaves at once instead of one a second. GitHub
//! documents, per App installation: no more than 900 points per minute to a single REST
//! endpoint (a GET costs 1 point, a mutating request 5), no more than 80 content-creating
//! requests per minute and 500 per hour, and no more than 100 concurrent requests. GitHub adds
//! that the limits may change without notice: its own answers (a 403 or 429 with `retry-after`)
//! still steer the budget, which waits as told.
//!
//! "A single REST endpoint" is GitHub's path template (`POST
//! /repos/{owner}/{repo}/actions/runners/generate-jitconfig`), so the points windows are keyed
//! by it ([`crate::endpoints::template`]): every repository's registrations share one window.
//!
//! GitHub does not say which endpoints create content; nothing shows that it counts a JIT
//! registration as content (the peer terraform-aws-github-runner reads it as not). So the
//! content limits are learned, not assumed ([`content_rule`]): under [`Pacing::Documented`] a
//! scope's `POST`s count as content only for [`CONTENT_LEARNED_FOR`] after GitHub answered that
//! scope with a secondary limit; [`Pacing::Cautious`] counts them from the start. The content
//! windows record every `POST` either way, so the moment a limit is learned they already hold
//! what GitHub counted in the last hour.
//!
//! The windows here are sliding, not refilling buckets: a refilling bucket of 80 admits up to
//! 160 in one minute (a full bucket, then what it refills), where a sliding window of the last
//! 60 s holds exactly what GitHub counts in any minute. They run on the client's clock
//! ([`crate::Clock`], the wall clock in production), so a test can move an hour in a step; the
//! price is that a wall-clock step back makes entries look younger, which holds requests longer
//! (never sends more), by at most the step. The decisions are pure; the budget holds the state
//! and the clock.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

/// GitHub's documented secondary limits on REST requests of one installation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecondaryLimits {
    /// Points one endpoint (path template) may be sent per minute.
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
/// How long a scope's `POST`s count as content after GitHub answered it with a secondary limit
/// (under [`Pacing::Documented`]): the content limit's longest window. A limit met at `T` may
/// have been the hour's 500th creation, and GitHub's hour still holds what was sent up to `T`
/// until `T` + 1 h; an hour after the last limit, nothing GitHub counted then is left in any of
/// its windows, so that answer says nothing more about what GitHub counts now. Each further
/// limit learns it again from its own time. The paced hour (with the [`ARRIVAL_MARGIN`]) keeps
/// it on the cautious side of GitHub's. Under a load past the content limit for longer than
/// this, the learned limit lapses while GitHub still counts: one more secondary limit an hour,
/// waited out, is the price of returning to the points window alone when GitHub does not.
pub const CONTENT_LEARNED_FOR: Duration = PACED_HOUR;

/// How a request counts against the secondary limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// A read: 1 point.
    Read,
    /// A change that creates nothing (a runner's deletion): 5 points.
    Mutation,
    /// A `POST` (a JIT registration, a redelivery, an installation token): 5 points, and one
    /// content creation while its scope counts content ([`content_rule`]). GitHub does not list
    /// which endpoints count as content; the content windows record every `POST`.
    Creation,
}

impl Cost {
    /// The cost of a request by its method: `POST` may create, other writes change, reads read.
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

/// Why a scope's `POST`s count as content creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentReason {
    /// `github.pacing = "cautious"`: every `POST` counts, from the start.
    Cautious,
    /// GitHub answered the scope with a secondary limit at `at`; counted until `until`.
    Learned { at: SystemTime, until: SystemTime },
}

/// Which of rm's windows holds a request back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacedBy {
    /// The points window of this path template (900 points a minute per endpoint).
    Points(&'static str),
    /// The content-creation windows (80 a minute, 500 an hour).
    Content,
    /// One mutation per interval ([`Pacing::Spaced`]).
    Spacing,
}

/// Whether a scope's `POST`s count as content at `now`, and why: under [`Pacing::Cautious`]
/// always; under [`Pacing::Documented`] for [`CONTENT_LEARNED_FOR`] after the scope's last
/// secondary limit (`learned_at`); never under [`Pacing::Spaced`], whose one-a-second spacing
/// stays under every window.
pub fn content_rule(
    pacing: &Pacing,
    learned_at: Option<SystemTime>,
    now: SystemTime,
) -> Option<ContentReason> {
    match pacing {
        Pacing::Cautious(_) => Some(ContentReason::Cautious),
        Pacing::Documented(_) => learned_at
            .map(|at| ContentReason::Learned {
                at,
                until: at + CONTENT_LEARNED_FOR,
            })
            .filter(|r| matches!(r, ContentReason::Learned { until, .. } if *until > now)),
        Pacing::Spaced(_) => None,
    }
}

/// What was spent in a sliding window: `(when, amount)`, oldest first. Entries may lie a little
/// in the future (a request admitted to leave after a wait is entered at its departure).
#[derive(Debug, Default, Clone)]
pub struct Window {
    spent: VecDeque<(SystemTime, u32)>,
}

impl Window {
    /// The earliest instant at or after `at` when `amount` more fits under `limit` in a window
    /// of `span`, counting everything entered after `t - span` (reservations ahead of `t`
    /// included, so a window around them can never overflow). `None` when `amount` alone is
    /// over `limit`.
    pub fn earliest(
        &self,
        at: SystemTime,
        amount: u32,
        limit: u32,
        span: Duration,
    ) -> Option<SystemTime> {
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
    pub fn spend(&mut self, at: SystemTime, amount: u32) {
        let index = self.spent.partition_point(|(when, _)| *when <= at);
        self.spent.insert(index, (at, amount));
    }

    /// Forgets what left the window before `now`.
    pub fn expire(&mut self, now: SystemTime, span: Duration) {
        while self
            .spent
            .front()
            .is_some_and(|(when, _)| *when + span <= now)
        {
            self.spent.pop_front();
        }
    }

    /// What was spent in the `span` up to `now` (reservations ahead of it left out).
    pub fn total(&self, now: SystemTime, span: Duration) -> u32 {
        self.spent
            .iter()
            .filter(|(when, _)| *when <= now && *when + span > now)
            .map(|(_, n)| *n)
            .sum()
    }
}

/// One scope's windows: the points of each endpoint (path template), the `POST`s per minute and
/// per hour (which bind only while the scope counts content).
#[derive(Debug, Default, Clone)]
pub struct Windows {
    points: std::collections::HashMap<&'static str, Window>,
    creations_minute: Window,
    creations_hour: Window,
}

impl Windows {
    /// When a request of `cost` to `template` may leave, at or after `now`, under `limits`:
    /// the first instant every window it counts in has room; the content windows count only if
    /// `content`. `None` when it can never fit.
    pub fn departure(
        &self,
        template: &'static str,
        cost: Cost,
        content: bool,
        limits: &SecondaryLimits,
        now: SystemTime,
    ) -> Option<SystemTime> {
        let empty = Window::default();
        let points = self.points.get(template).unwrap_or(&empty);
        let mut at = now;
        // Each window's earliest is monotone in `at`: repeat until all agree.
        loop {
            let mut next =
                points.earliest(at, cost.points(), limits.points_per_minute, PACED_MINUTE)?;
            if content && cost == Cost::Creation {
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

    /// Which window holds a request of `cost` to `template` back at `now`: the content windows
    /// when they alone set a later departure than the points, else the template's points.
    pub fn binding(
        &self,
        template: &'static str,
        cost: Cost,
        content: bool,
        limits: &SecondaryLimits,
        now: SystemTime,
    ) -> PacedBy {
        let by_points = self.departure(template, cost, false, limits, now);
        let with_content = self.departure(template, cost, content, limits, now);
        if content && cost == Cost::Creation && with_content > by_points {
            PacedBy::Content
        } else {
            PacedBy::Points(template)
        }
    }

    /// Enters a request of `cost` to `template` leaving at `at`; forgets what expired by `now`.
    /// A `POST` is entered in the content windows whether they bind or not.
    pub fn spend(&mut self, template: &'static str, cost: Cost, at: SystemTime, now: SystemTime) {
        let points = self.points.entry(template).or_default();
        points.expire(now, PACED_MINUTE);
        points.spend(at, cost.points());
        if cost == Cost::Creation {
            self.creations_minute.expire(now, PACED_MINUTE);
            self.creations_minute.spend(at, 1);
            self.creations_hour.expire(now, PACED_HOUR);
            self.creations_hour.spend(at, 1);
        }
    }

    /// `POST`s counted in the last minute and the last hour, for `status`.
    pub fn creations(&self, now: SystemTime) -> (u32, u32) {
        (
            self.creations_minute.total(now, MINUTE),
            self.creations_hour.total(now, HOUR),
        )
    }

    /// Points spent on `template` in the last minute.
    pub fn points(&self, template: &str, now: SystemTime) -> u32 {
        self.points
            .get(template)
            .map_or(0, |w| w.total(now, MINUTE))
    }
}

/// How mutating requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Inside GitHub's documented secondary limits (the default): points per endpoint always,
    /// content creation only once GitHub has shown it counts it ([`content_rule`]). Bursts of
    /// registrations leave at once, up to 180 a minute per installation.
    Documented(SecondaryLimits),
    /// Inside the documented limits, counting every `POST` as content from the start (80 a
    /// minute, 500 an hour): what rm did before it learned the content limit.
    Cautious(SecondaryLimits),
    /// Every mutation at least this long after the previous one of its installation: GitHub's
    /// conservative advice ("at least one second between each request"), kept for the
    /// benchmark that compares the two.
    Spaced(Duration),
}

impl Pacing {
    /// The secondary limits it paces by, if it paces by windows.
    pub fn limits(&self) -> Option<SecondaryLimits> {
        match self {
            Pacing::Documented(l) | Pacing::Cautious(l) => Some(*l),
            Pacing::Spaced(_) => None,
        }
    }
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing::Documented(DOCUMENTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JIT: &str = "POST /orgs/{org}/actions/runners/generate-jitconfig";
    const DELETE: &str = "DELETE /orgs/{org}/actions/runners/{runner_id}";

    fn base() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)
    }

    fn at(base: SystemTime, secs: u64) -> SystemTime {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn a_window_admits_up_to_its_limit_then_when_the_oldest_leaves() {
        let t = base();
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
        let t = base();
        let mut w = Window::default();
        w.spend(at(t, 10), 1);
        w.spend(at(t, 0), 1);
        // Ordered on entry, whatever the order of entering.
        assert_eq!(w.earliest(at(t, 5), 1, 2, MINUTE), Some(at(t, 60)));
    }

    /// Sends `n` requests of `cost` to `template` at `t`, each at its departure; returns them.
    fn burst(
        w: &mut Windows,
        template: &'static str,
        cost: Cost,
        content: bool,
        n: usize,
        t: SystemTime,
    ) -> Vec<SystemTime> {
        (0..n)
            .map(|_| {
                let d = w
                    .departure(template, cost, content, &DOCUMENTED, t)
                    .unwrap_or_else(|| panic!("never fits"));
                w.spend(template, cost, d, t);
                d
            })
            .collect()
    }

    /// Counting content, a 100-job matrix leaves 80 registrations at once and the rest as the
    /// first ones age out of the paced minute.
    #[test]
    fn counting_content_a_burst_leaves_eighty_then_waits_a_paced_minute() {
        let t = base();
        let mut w = Windows::default();
        let departures = burst(&mut w, JIT, Cost::Creation, true, 100, t);
        assert!(departures[..80].iter().all(|d| *d == t));
        assert!(departures[80..].iter().all(|d| *d == at(t, 61)));
        assert_eq!(w.creations(t), (80, 80));
    }

    /// Not counting content, registrations are held only by the template's 900 points: 180 at
    /// once, the 181st a paced minute later; the content windows still record every `POST`.
    #[test]
    fn not_counting_content_a_burst_is_held_by_the_points_alone() {
        let t = base();
        let mut w = Windows::default();
        let departures = burst(&mut w, JIT, Cost::Creation, false, 181, t);
        assert!(departures[..180].iter().all(|d| *d == t));
        assert_eq!(departures[180], at(t, 61));
        assert_eq!(w.creations(t), (180, 180));
        assert_eq!(w.points(JIT, t), 900);
        assert_eq!(
            w.binding(JIT, Cost::Creation, false, &DOCUMENTED, t),
            PacedBy::Points(JIT)
        );
        // 80 counted as content: the content windows hold the next one, not the points.
        let mut c = Windows::default();
        burst(&mut c, JIT, Cost::Creation, true, 80, t);
        assert_eq!(
            c.binding(JIT, Cost::Creation, true, &DOCUMENTED, t),
            PacedBy::Content
        );
        // Counting content from now, the next registration waits until the minute's 180 have
        // left it (the content windows already hold them), however the points stand.
        assert_eq!(
            w.departure(JIT, Cost::Creation, true, &DOCUMENTED, t),
            Some(at(t, 61))
        );
        // Deletions are another template; reads of a third are apart.
        let mut w = Windows::default();
        let deletions = burst(&mut w, DELETE, Cost::Mutation, true, 181, t);
        assert!(deletions[..180].iter().all(|d| *d == t));
        assert_eq!(deletions[180], at(t, 61));
        assert_eq!(
            w.departure(
                "GET /orgs/{org}/actions/runners",
                Cost::Read,
                true,
                &DOCUMENTED,
                t
            ),
            Some(t)
        );
        assert_eq!(w.creations(t), (0, 0));
    }

    #[test]
    fn the_hour_window_holds_creations_past_the_minute() {
        let t = base();
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
                let d = w.departure(JIT, Cost::Creation, true, &limits, now);
                assert_eq!(d, Some(now));
                w.spend(JIT, Cost::Creation, now, now);
            }
        }
        // 100 in the hour: the next waits for the first to leave the hour, not the minute.
        assert_eq!(
            w.departure(JIT, Cost::Creation, true, &limits, at(t, 120)),
            Some(at(t, 3601))
        );
        // Not counting content, only the points hold it.
        assert_eq!(
            w.departure(JIT, Cost::Creation, false, &limits, at(t, 122)),
            Some(at(t, 122))
        );
    }

    /// The content rule, as a table: (pacing, learned at, now) → counted, and why.
    #[test]
    fn content_counts_when_cautious_or_for_an_hour_after_a_learned_limit() {
        let t = base();
        let documented = Pacing::Documented(DOCUMENTED);
        let learned = |secs| ContentReason::Learned {
            at: at(t, secs),
            until: at(t, secs) + CONTENT_LEARNED_FOR,
        };
        type Case = (
            &'static str,
            Pacing,
            Option<SystemTime>,
            SystemTime,
            Option<ContentReason>,
        );
        let cases: [Case; 7] = [
            ("documented, never limited", documented, None, t, None),
            (
                "documented, limited now",
                documented,
                Some(t),
                t,
                Some(learned(0)),
            ),
            (
                "documented, within the hour",
                documented,
                Some(t),
                at(t, 3600),
                Some(learned(0)),
            ),
            (
                "documented, expired",
                documented,
                Some(t),
                at(t, 3601),
                None,
            ),
            (
                "cautious, never limited",
                Pacing::Cautious(DOCUMENTED),
                None,
                t,
                Some(ContentReason::Cautious),
            ),
            (
                "cautious, long after a limit",
                Pacing::Cautious(DOCUMENTED),
                Some(t),
                at(t, 99_999),
                Some(ContentReason::Cautious),
            ),
            (
                "spaced",
                Pacing::Spaced(Duration::from_secs(1)),
                Some(t),
                t,
                None,
            ),
        ];
        for (name, pacing, learned_at, now, want) in cases {
            assert_eq!(content_rule(&pacing, learned_at, now), want, "{name}");
        }
        assert_eq!(CONTENT_LEARNED_FOR, HOUR + ARRIVAL_MARGIN);
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
