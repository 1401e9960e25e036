//! The schedule with the prior art's own numbers (`prior-art-reconcile.md` §2).

use super::*;

const S: fn(u64) -> Duration = Duration::from_secs;

fn schedule() -> PollSchedule {
    // The configuration's defaults (`polling.interval`, `polling.idle_interval`).
    PollSchedule::new(S(60), Some(S(10))).unwrap()
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + S(1_700_000_000)
}

fn quota(remaining: u64, reset_in: u64) -> Conditions {
    Conditions {
        quota: Some(Quota {
            remaining,
            limit: 5000,
            reset_in: Some(S(reset_in)),
        }),
        ..Conditions::default()
    }
}

fn ok(s: &mut PollSchedule, c: Conditions) -> NextPoll {
    s.next_poll(None, c, 0.0, t0())
}

#[test]
fn intervals_have_floors_and_idle_never_exceeds_active() {
    assert_eq!(
        PollSchedule::new(S(29), None).unwrap_err(),
        ScheduleError::ActiveTooShort(S(29))
    );
    let s = PollSchedule::new(S(30), Some(S(1))).unwrap();
    assert_eq!((s.active(), s.idle()), (S(30), S(5)));
    let s = PollSchedule::new(S(60), Some(S(120))).unwrap();
    assert_eq!(s.idle(), S(60));
    // Without an idle interval there is no idle pace.
    let mut s = PollSchedule::new(S(60), None).unwrap();
    let quiet = Conditions {
        quiet: true,
        ..Conditions::default()
    };
    assert_eq!(ok(&mut s, quiet).pace, Pace::Nominal);
}

#[test]
fn success_is_nominal_or_idle_when_quiet() {
    let mut s = schedule();
    assert_eq!(
        ok(&mut s, Conditions::default()),
        NextPoll {
            delay: S(60),
            pace: Pace::Nominal
        }
    );
    let quiet = |requests_per_pass| Conditions {
        quiet: true,
        requests_per_pass,
        ..Conditions::default()
    };
    assert_eq!(
        ok(&mut s, quiet(20)),
        NextPoll {
            delay: S(10),
            pace: Pace::Idle
        }
    );
    // 400 requests a pass: at most 300 a minute, so 80 s, even past the active interval.
    assert_eq!(ok(&mut s, quiet(400)).delay, S(80));
}

#[test]
fn a_low_quota_stretches_the_pace_and_beats_idle() {
    let mut s = schedule();
    assert_eq!(
        ok(&mut s, quota(1000, 3000)).pace,
        Pace::Nominal,
        "20 % is normal"
    );
    assert_eq!(
        ok(&mut s, quota(999, 3000)),
        NextPoll {
            delay: S(120),
            pace: Pace::StretchedLowBudget
        }
    );
    for remaining in [200, 100] {
        assert_eq!(
            ok(&mut s, quota(remaining, 3000)),
            NextPoll {
                delay: S(240),
                pace: Pace::StretchedCriticalBudget
            },
            "{remaining}"
        );
    }
    // Never past a reset that comes sooner, never under the active interval.
    assert_eq!(ok(&mut s, quota(999, 90)).delay, S(90));
    assert_eq!(ok(&mut s, quota(999, 5)).delay, S(60));
    let mut quiet = quota(999, 3000);
    quiet.quiet = true;
    assert_eq!(ok(&mut s, quiet).pace, Pace::StretchedLowBudget);
    // A reset that has passed is normal pressure.
    let mut expired = quota(10, 0);
    expired.quota = expired.quota.map(|q| Quota {
        reset_in: None,
        ..q
    });
    assert_eq!(ok(&mut s, expired).pace, Pace::Nominal);
}

#[test]
fn an_outage_backs_off_doubling_to_fifteen_minutes_and_recovery_resets_it() {
    let mut s = schedule();
    let delays: Vec<u64> = (0..6)
        .map(|i| {
            s.next_poll(
                Some(Failure::Offline),
                Conditions::default(),
                0.0,
                t0() + S(i),
            )
            .delay
            .as_secs()
        })
        .collect();
    assert_eq!(delays, [60, 120, 240, 480, 900, 900]);
    let offline = s.offline(t0() + S(3600), S(900)).unwrap();
    assert_eq!((offline.consecutive, offline.since), (6, t0()));
    assert_eq!(offline.offline_for, S(3600));
    assert!(!offline.has_outlasted_the_queue());
    assert!(offline.describe().contains("will be cancelled"));
    // Jitter is additive only and may exceed the cap by up to half.
    let capped = s.next_poll(Some(Failure::Offline), Conditions::default(), 1.0, t0());
    assert_eq!(capped.delay, S(1350));
    // Any answer ends the run; the next outage starts from the active interval again.
    assert_eq!(ok(&mut s, Conditions::default()).pace, Pace::Nominal);
    assert!(s.offline(t0(), S(0)).is_none());
    let first = s.next_poll(Some(Failure::Offline), Conditions::default(), 0.0, t0());
    assert_eq!(first.delay, S(60));
}

#[test]
fn a_day_long_outage_says_the_queue_is_lost() {
    let mut s = schedule();
    s.next_poll(Some(Failure::Offline), Conditions::default(), 0.0, t0());
    let offline = s.offline(t0() + QUEUE_LIFETIME, S(900)).unwrap();
    assert!(offline.has_outlasted_the_queue());
    assert!(offline.describe().contains("have been cancelled"));
    // Even a short active interval never polls an outage faster than 30 s.
    let mut fast = PollSchedule::new(S(30), None).unwrap();
    let next = fast.next_poll(Some(Failure::Offline), Conditions::default(), 0.0, t0());
    assert_eq!(next.delay, S(30));
}

#[test]
fn retry_after_is_a_floor_combined_with_max_never_added() {
    let mut s = schedule();
    let limited = |retry_after, kind| Failure::RateLimited { kind, retry_after };
    let next = s.next_poll(
        Some(limited(S(5), LimitKind::Secondary)),
        Conditions::default(),
        0.0,
        t0(),
    );
    assert_eq!(
        next,
        NextPoll {
            delay: S(60),
            pace: Pace::RateLimitedSecondary
        }
    );
    let next = s.next_poll(
        Some(limited(S(300), LimitKind::Primary)),
        Conditions::default(),
        0.5,
        t0(),
    );
    assert_eq!(
        next,
        NextPoll {
            delay: S(315),
            pace: Pace::RateLimitedPrimary
        }
    );
    // Repeated limits do not compound (360, 660, 960 would be the bug).
    for _ in 0..3 {
        let again = s.next_poll(
            Some(limited(S(300), LimitKind::Primary)),
            Conditions::default(),
            0.0,
            t0(),
        );
        assert_eq!(again.delay, S(300));
    }
}

#[test]
fn refusals_keep_polling_at_the_active_interval_as_blocked() {
    let mut s = schedule();
    s.next_poll(Some(Failure::Offline), Conditions::default(), 0.0, t0());
    for failure in [Failure::Unauthorized, Failure::Forbidden, Failure::Failed] {
        let next = s.next_poll(Some(failure), Conditions::default(), 1.0, t0());
        assert_eq!(
            next,
            NextPoll {
                delay: S(60),
                pace: Pace::Blocked
            }
        );
        assert!(s.offline(t0(), S(0)).is_none(), "an answer ends the outage");
    }
}

#[test]
fn failures_rank_by_severity_and_paces_by_name() {
    let limited = Failure::RateLimited {
        kind: LimitKind::Primary,
        retry_after: S(1),
    };
    assert_eq!(
        Failure::worst(Some(limited), Failure::Offline),
        Failure::Offline
    );
    assert_eq!(Failure::worst(Some(limited), Failure::Forbidden), limited);
    assert_eq!(Failure::worst(None, Failure::Failed), Failure::Failed);
    assert_eq!(Pace::StretchedLowBudget.as_str(), "stretched_low_budget");
    assert!(Pace::Offline.is_throttled());
    assert!(!Pace::Idle.is_throttled() && !Pace::Reconciling.is_throttled());
    let now = t0();
    let error = GithubError::RateLimited {
        kind: LimitKind::Secondary,
        resource: "core".into(),
        retry_at: now + S(42),
    };
    assert_eq!(
        Failure::from_error(&error, now),
        Failure::RateLimited {
            kind: LimitKind::Secondary,
            retry_after: S(42)
        }
    );
    let down = GithubError::Unreachable {
        endpoint: "x",
        reason: "refused".into(),
    };
    assert_eq!(Failure::from_error(&down, now), Failure::Offline);
}
