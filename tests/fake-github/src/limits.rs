//! GitHub's secondary rate limits as the fake enforces them, and how it answers a limit. GitHub
//! documents, per App installation (and per App JWT): no more than 900 points per minute to a
//! single REST endpoint (a `GET`, `HEAD` or `OPTIONS` costs 1 point, a `POST`, `PATCH`, `PUT` or
//! `DELETE` 5), no more than 80 content-creating requests per minute and 500 per hour, and no
//! more than 100 concurrent requests ("Rate limits for the REST API", secondary rate limits).
//! GitHub does not say which endpoints create content, so a test says how this fake reads it
//! ([`ContentCounting`]): `Strict` (the default) counts every `POST`, `Loose` leaves JIT
//! registrations out, as the peer terraform-aws-github-runner reads GitHub. A test may also
//! lower any of the numbers below the documented ones ("limits may change without notice"),
//! and give registrations their own primary bucket ([`REGISTRATION_RESOURCE`], limit
//! [`REGISTRATION_LIMIT`] an hour unless the test says otherwise; `FakeOptions::registration_limit`).
//! So the fake can disagree with rm's reading, and a test sees rm learn from GitHub's answers.
//!
//! The windows are sliding (what was sent in the last 60 s or 3600 s, on the fake's own clock),
//! as GitHub counts "per minute". A request over a limit is refused and spends nothing; the
//! answer is GitHub's: 403 or 429, a JSON `message` and `documentation_url`, `retry-after` in
//! seconds, and the primary `x-ratelimit-*` headers (with quota left, so only `retry-after` and
//! the message say which limit it was). Everything here is pure: the caller passes the time.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use crate::auth::Caller;

/// The secondary limits the fake enforces per scope (an installation, or the App's JWT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecondaryLimits {
    /// Points one endpoint may be sent per minute.
    pub points_per_minute: u32,
    /// Content-creating requests (every `POST`) per minute, across endpoints.
    pub creations_per_minute: u32,
    /// Content-creating requests per hour, across endpoints.
    pub creations_per_hour: u32,
    /// Requests in flight at once.
    pub concurrent: u32,
    /// Which `POST`s count as content creation.
    pub content: ContentCounting,
}

/// Which requests this fake counts as content creation: GitHub does not list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContentCounting {
    /// Every `POST` (the default: the cautious reading, which keeps every limit test exercising
    /// the content limits).
    #[default]
    Strict,
    /// Every `POST` but a JIT registration (`generate-jitconfig`), as terraform-aws-github-runner
    /// reads GitHub.
    Loose,
}

impl SecondaryLimits {
    /// GitHub's documented numbers: the fake's default.
    pub const GITHUB: SecondaryLimits = SecondaryLimits {
        points_per_minute: 900,
        creations_per_minute: 80,
        creations_per_hour: 500,
        concurrent: 100,
        content: ContentCounting::Strict,
    };
}

/// The `x-ratelimit-resource` of GitHub's primary bucket for runner registrations.
pub const REGISTRATION_RESOURCE: &str = "actions_runner_registration";
/// Its limit an hour, as GitHub staff have given it (actions/runner#1339).
pub const REGISTRATION_LIMIT: u64 = 10_000;

impl Default for SecondaryLimits {
    fn default() -> Self {
        Self::GITHUB
    }
}

/// Points a read (`GET`, `HEAD`, `OPTIONS`) costs.
pub const READ_POINTS: u32 = 1;
/// Points a write (`POST`, `PATCH`, `PUT`, `DELETE`) costs.
pub const WRITE_POINTS: u32 = 5;
/// The span of the per-minute windows.
pub const MINUTE: Duration = Duration::from_secs(60);
/// The span of the per-hour window.
pub const HOUR: Duration = Duration::from_secs(3600);
/// The `retry-after` of a refusal for too many requests in flight: GitHub gives no number; one
/// in flight finishing is what makes room, and the fake answers within milliseconds.
pub const CONCURRENCY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// GitHub's message for every secondary limit (it adds the request id).
pub const SECONDARY_MESSAGE: &str = "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID";
/// Where GitHub's secondary-limit answers point.
pub const SECONDARY_DOCS: &str = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api#about-secondary-rate-limits";
/// Where GitHub's primary-limit answers point.
pub const PRIMARY_DOCS: &str = "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api#about-primary-rate-limits";

/// The points a request of `method` costs.
pub fn points_of(method: &str) -> u32 {
    match method {
        "GET" | "HEAD" | "OPTIONS" => READ_POINTS,
        _ => WRITE_POINTS,
    }
}

/// Whether a request of `method` to `template` counts as content creation under `counting`:
/// every `POST`, or (`Loose`) every `POST` but a JIT registration.
pub fn creates(method: &str, template: &str, counting: ContentCounting) -> bool {
    method == "POST"
        && match counting {
            ContentCounting::Strict => true,
            ContentCounting::Loose => !template.ends_with("/generate-jitconfig"),
        }
}

/// Which status a limit is answered with: GitHub documents "403 or 429" for both kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitStatus {
    Forbidden,
    TooManyRequests,
    /// 403 and 429 in turn, from one answer to the next (the default: rm must take both).
    #[default]
    Alternating,
}

impl LimitStatus {
    /// The status of the `n`-th limit answer (0-based).
    pub fn nth(self, n: u64) -> u16 {
        match self {
            LimitStatus::Forbidden => 403,
            LimitStatus::TooManyRequests => 429,
            LimitStatus::Alternating if n.is_multiple_of(2) => 403,
            LimitStatus::Alternating => 429,
        }
    }
}

/// Which secondary limit a request went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Concurrency,
    Points,
    CreationsPerMinute,
    CreationsPerHour,
}

/// A refused request: the limit, and how long until a request like it would fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub exceeded: Exceeded,
    pub retry_after: Duration,
}

impl Refusal {
    /// `retry-after` as GitHub sends it: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        let d = self.retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }
}

/// What was spent in a sliding window: `(when, amount)`, in the order entered.
#[derive(Debug, Default, Clone)]
struct Window {
    spent: VecDeque<(SystemTime, u32)>,
}

impl Window {
    fn expire(&mut self, now: SystemTime, span: Duration) {
        while self.spent.front().is_some_and(|(at, _)| *at + span <= now) {
            self.spent.pop_front();
        }
    }

    fn total(&self, now: SystemTime, span: Duration) -> u32 {
        self.spent
            .iter()
            .filter(|(at, _)| *at + span > now)
            .map(|(_, n)| *n)
            .sum()
    }

    /// How long from `now` until `amount` more fits under `limit`; zero if it fits now.
    fn wait(&self, now: SystemTime, amount: u32, limit: u32, span: Duration) -> Duration {
        let mut counted = self.total(now, span);
        for (at, n) in &self.spent {
            if counted + amount <= limit {
                break;
            }
            let expiry = *at + span;
            if expiry > now {
                counted -= n;
                if counted + amount <= limit {
                    return expiry.duration_since(now).unwrap_or(Duration::ZERO);
                }
            }
        }
        if counted + amount <= limit {
            Duration::ZERO
        } else {
            // More than the limit in one request: no wait makes room.
            span
        }
    }
}

/// One scope's windows and requests in flight.
#[derive(Debug, Default, Clone)]
struct ScopeLedger {
    points: HashMap<&'static str, Window>,
    creations_minute: Window,
    creations_hour: Window,
    in_flight: u32,
}

/// What every scope has sent, for the secondary limits.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    scopes: HashMap<Caller, ScopeLedger>,
}

impl Ledger {
    /// A request of `scope` arrived: it is in flight until [`Ledger::leave`].
    pub fn arrive(&mut self, scope: Caller) {
        self.scopes.entry(scope).or_default().in_flight += 1;
    }

    /// A request of `scope` was answered (or given up).
    pub fn leave(&mut self, scope: Caller) {
        if let Some(s) = self.scopes.get_mut(&scope) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    /// Requests of `scope` in flight now (the one being decided included, once arrived).
    pub fn in_flight(&self, scope: Caller) -> u32 {
        self.scopes.get(&scope).map_or(0, |s| s.in_flight)
    }

    /// Content creations of `scope` in the last minute and the last hour.
    pub fn creations(&self, scope: Caller, now: SystemTime) -> (u32, u32) {
        self.scopes.get(&scope).map_or((0, 0), |s| {
            (
                s.creations_minute.total(now, MINUTE),
                s.creations_hour.total(now, HOUR),
            )
        })
    }

    /// Decides a request of `scope` to `endpoint` (a route template) by `method` at `now`: if it
    /// fits every limit it is spent and `Ok`; otherwise nothing is spent and the refusal says
    /// which limit and for how long. The request must have [`Ledger::arrive`]d.
    pub fn admit(
        &mut self,
        scope: Caller,
        endpoint: &'static str,
        method: &str,
        now: SystemTime,
        limits: &SecondaryLimits,
    ) -> Result<(), Refusal> {
        let s = self.scopes.entry(scope).or_default();
        if s.in_flight > limits.concurrent {
            return Err(Refusal {
                exceeded: Exceeded::Concurrency,
                retry_after: CONCURRENCY_RETRY_AFTER,
            });
        }
        let points = s.points.entry(endpoint).or_default();
        points.expire(now, MINUTE);
        s.creations_minute.expire(now, MINUTE);
        s.creations_hour.expire(now, HOUR);
        let cost = points_of(method);
        let wait = points.wait(now, cost, limits.points_per_minute, MINUTE);
        if !wait.is_zero() {
            return Err(Refusal {
                exceeded: Exceeded::Points,
                retry_after: wait,
            });
        }
        let creating = creates(method, endpoint, limits.content);
        if creating {
            let per_minute = s
                .creations_minute
                .wait(now, 1, limits.creations_per_minute, MINUTE);
            if !per_minute.is_zero() {
                return Err(Refusal {
                    exceeded: Exceeded::CreationsPerMinute,
                    retry_after: per_minute,
                });
            }
            let per_hour = s
                .creations_hour
                .wait(now, 1, limits.creations_per_hour, HOUR);
            if !per_hour.is_zero() {
                return Err(Refusal {
                    exceeded: Exceeded::CreationsPerHour,
                    retry_after: per_hour,
                });
            }
        }
        points.spent.push_back((now, cost));
        if creating {
            s.creations_minute.spent.push_back((now, 1));
            s.creations_hour.spent.push_back((now, 1));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INST: Caller = Caller::Installation(7);

    fn at(base: SystemTime, millis: u64) -> SystemTime {
        base + Duration::from_millis(millis)
    }

    fn send(
        l: &mut Ledger,
        scope: Caller,
        endpoint: &'static str,
        method: &str,
        now: SystemTime,
        limits: &SecondaryLimits,
    ) -> Result<(), Refusal> {
        l.arrive(scope);
        let r = l.admit(scope, endpoint, method, now, limits);
        l.leave(scope);
        r
    }

    #[test]
    fn the_defaults_are_githubs_documented_numbers() {
        let d = SecondaryLimits::default();
        assert_eq!(
            (
                d.points_per_minute,
                d.creations_per_minute,
                d.creations_per_hour,
                d.concurrent
            ),
            (900, 80, 500, 100)
        );
        assert_eq!(points_of("GET"), 1);
        assert_eq!(points_of("HEAD"), 1);
        assert_eq!(points_of("OPTIONS"), 1);
        for write in ["POST", "PATCH", "PUT", "DELETE"] {
            assert_eq!(points_of(write), 5, "{write}");
        }
        let jit = "POST /orgs/{org}/actions/runners/generate-jitconfig";
        let strict = ContentCounting::Strict;
        assert!(creates("POST", jit, strict) && !creates("DELETE", "DELETE /x", strict));
        assert!(!creates("GET", "GET /x", strict));
        assert_eq!(d.content, strict);
    }

    /// Loose: registrations are held by the template's 900 points alone (180 a minute), while
    /// other `POST`s still count as content.
    #[test]
    fn a_loose_github_does_not_count_registrations_as_content() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let limits = SecondaryLimits {
            content: ContentCounting::Loose,
            ..SecondaryLimits::GITHUB
        };
        let jit = "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig";
        let mut l = Ledger::default();
        for n in 0..180 {
            assert_eq!(send(&mut l, INST, jit, "POST", t, &limits), Ok(()), "{n}");
        }
        assert_eq!(
            send(&mut l, INST, jit, "POST", t, &limits).map_err(|r| r.exceeded),
            Err(Exceeded::Points)
        );
        assert_eq!(l.creations(INST, t), (0, 0));
        let redeliver = "POST /app/hook/deliveries/{delivery_id}/attempts";
        assert_eq!(send(&mut l, INST, redeliver, "POST", t, &limits), Ok(()));
        assert_eq!(l.creations(INST, t), (1, 1));
        // Strict, the same registrations stop at 80.
        let mut l = Ledger::default();
        for _ in 0..80 {
            assert_eq!(
                send(&mut l, INST, jit, "POST", t, &SecondaryLimits::GITHUB),
                Ok(())
            );
        }
        assert_eq!(
            send(&mut l, INST, jit, "POST", t, &SecondaryLimits::GITHUB).map_err(|r| r.exceeded),
            Err(Exceeded::CreationsPerMinute)
        );
    }

    /// 180 deletions fill one endpoint's 900 points in a minute; the 181st is refused until the
    /// first leaves the sliding minute, while other endpoints and scopes are apart.
    #[test]
    fn points_per_endpoint_slide_over_the_minute() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let limits = SecondaryLimits::GITHUB;
        let mut l = Ledger::default();
        for n in 0..180 {
            assert_eq!(
                send(
                    &mut l,
                    INST,
                    "DELETE runner",
                    "DELETE",
                    at(t, n * 100),
                    &limits
                ),
                Ok(()),
                "deletion {n}"
            );
        }
        let refused = send(
            &mut l,
            INST,
            "DELETE runner",
            "DELETE",
            at(t, 18_000),
            &limits,
        );
        assert_eq!(
            refused,
            Err(Refusal {
                exceeded: Exceeded::Points,
                retry_after: Duration::from_secs(42),
            }),
            "room when the first deletion (at 0 s) leaves the minute"
        );
        assert_eq!(refused.map_err(|r| r.retry_after_secs()), Err(42));
        // Reads of another endpoint and another installation's deletions still go.
        assert_eq!(
            send(&mut l, INST, "GET runners", "GET", at(t, 18_000), &limits),
            Ok(())
        );
        let other = Caller::Installation(8);
        assert_eq!(
            send(
                &mut l,
                other,
                "DELETE runner",
                "DELETE",
                at(t, 18_000),
                &limits
            ),
            Ok(())
        );
        // A refused request spent nothing: at 60 s exactly one more fits (the first left).
        assert_eq!(
            send(
                &mut l,
                INST,
                "DELETE runner",
                "DELETE",
                at(t, 60_000),
                &limits
            ),
            Ok(())
        );
        assert!(
            send(
                &mut l,
                INST,
                "DELETE runner",
                "DELETE",
                at(t, 60_000),
                &limits
            )
            .is_err()
        );
        // 900 reads of one endpoint fit, the 901st does not.
        let mut l = Ledger::default();
        for _ in 0..900 {
            assert_eq!(send(&mut l, INST, "GET runs", "GET", t, &limits), Ok(()));
        }
        assert_eq!(
            send(&mut l, INST, "GET runs", "GET", t, &limits).map_err(|r| r.exceeded),
            Err(Exceeded::Points)
        );
    }

    #[test]
    fn creations_are_capped_per_minute_and_per_hour_across_endpoints() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let limits = SecondaryLimits::GITHUB;
        let mut l = Ledger::default();
        for n in 0..80 {
            let endpoint = if n % 2 == 0 {
                "POST jit"
            } else {
                "POST redeliver"
            };
            assert_eq!(
                send(&mut l, INST, endpoint, "POST", at(t, n), &limits),
                Ok(())
            );
        }
        assert_eq!(l.creations(INST, at(t, 80)), (80, 80));
        let refused = send(&mut l, INST, "POST other", "POST", at(t, 1_000), &limits);
        assert_eq!(
            refused.map_err(|r| (r.exceeded, r.retry_after)),
            Err((Exceeded::CreationsPerMinute, Duration::from_secs(59)))
        );
        // A DELETE creates nothing: not held by the creation cap.
        assert_eq!(
            send(
                &mut l,
                INST,
                "DELETE runner",
                "DELETE",
                at(t, 1_000),
                &limits
            ),
            Ok(())
        );

        // 500 an hour: 80 a minute for six minutes, 20 in the seventh, then nothing until the
        // first of them leaves the hour.
        let mut l = Ledger::default();
        let mut sent = 0;
        for minute in 0..7 {
            for _ in 0..80 {
                if sent == 500 {
                    break;
                }
                let now = t + Duration::from_secs(minute * 60);
                assert_eq!(send(&mut l, INST, "POST jit", "POST", now, &limits), Ok(()));
                sent += 1;
            }
        }
        let now = t + Duration::from_secs(8 * 60);
        let refused = send(&mut l, INST, "POST jit", "POST", now, &limits);
        assert_eq!(
            refused.map_err(|r| (r.exceeded, r.retry_after)),
            Err((
                Exceeded::CreationsPerHour,
                HOUR - Duration::from_secs(8 * 60)
            ))
        );
        assert_eq!(
            send(&mut l, INST, "POST jit", "POST", t + HOUR, &limits),
            Ok(())
        );
    }

    #[test]
    fn lowered_limits_are_counted_the_same_way() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let limits = SecondaryLimits {
            creations_per_minute: 5,
            ..SecondaryLimits::GITHUB
        };
        let mut l = Ledger::default();
        for n in 0..5 {
            assert_eq!(
                send(&mut l, INST, "POST jit", "POST", at(t, n * 1_000), &limits),
                Ok(())
            );
        }
        let refused = send(&mut l, INST, "POST jit", "POST", at(t, 10_500), &limits);
        assert_eq!(
            refused.map(|()| 0).map_err(|r| r.retry_after_secs()),
            Err(50),
            "49.5 s until the first leaves the minute, rounded up"
        );
    }

    #[test]
    fn too_many_in_flight_are_refused_until_one_is_answered() {
        let t = SystemTime::UNIX_EPOCH;
        let limits = SecondaryLimits {
            concurrent: 2,
            ..SecondaryLimits::GITHUB
        };
        let mut l = Ledger::default();
        l.arrive(INST);
        l.arrive(INST);
        assert_eq!(l.admit(INST, "GET a", "GET", t, &limits), Ok(()));
        l.arrive(INST);
        assert_eq!(
            l.admit(INST, "GET a", "GET", t, &limits),
            Err(Refusal {
                exceeded: Exceeded::Concurrency,
                retry_after: CONCURRENCY_RETRY_AFTER
            })
        );
        // The App's JWT is a scope of its own.
        assert_eq!(
            send(&mut l, Caller::App, "GET a", "GET", t, &limits),
            Ok(())
        );
        l.leave(INST);
        l.leave(INST);
        assert_eq!(l.in_flight(INST), 1);
        l.arrive(INST);
        assert_eq!(l.admit(INST, "GET a", "GET", t, &limits), Ok(()));
    }

    #[test]
    fn limit_statuses_alternate_by_default() {
        let s = LimitStatus::default();
        assert_eq!([s.nth(0), s.nth(1), s.nth(2)], [403, 429, 403]);
        assert_eq!(LimitStatus::Forbidden.nth(1), 403);
        assert_eq!(LimitStatus::TooManyRequests.nth(0), 429);
    }
}
