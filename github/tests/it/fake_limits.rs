//! The client against what the fake enforces by itself, as GitHub does (not injected by a
//! test): GitHub's documented secondary limits, answered 403 or 429 with `retry-after`; a spent
//! primary quota answered 403 or 429 with `x-ratelimit-reset`; a `User-Agent` on every request.
//! The client must take each answer in either status, and its own pacing must agree with the
//! documented numbers.

use std::time::{Duration, SystemTime};

use rm_fake_github::{ContentCounting, LimitStatus, SecondaryLimits};
use rm_github::pacing::{CONTENT_LEARNED_FOR, ContentReason, MINUTE, Pacing};
use rm_github::{GithubError, LimitKind};
use rm_vocab::Clock as _;

use crate::common::*;

/// Cautious pacing, 100 registrations at once: the client lets the documented 80 content
/// creations a minute leave and refuses the rest itself with the time they may leave, so GitHub
/// (the fake, with GitHub's numbers, counting every POST) never has to answer a secondary limit.
#[tokio::test]
async fn cautious_a_burst_of_registrations_stays_inside_the_documented_limits() {
    let mut h = harness().await;
    h.client = client_paced(
        h.fake.api_url(),
        &h.clock,
        Pacing::Cautious(rm_github::pacing::DOCUMENTED),
        rm_github::budget::PACING_WAIT_MAX,
    );
    let mut created = 0;
    let mut held = 0;
    for n in 0..100 {
        match h
            .client
            .generate_jitconfig(&org(), &jit_request(&format!("r{n}")))
            .await
        {
            Ok(_) => created += 1,
            Err(GithubError::RateLimited {
                kind: LimitKind::Secondary,
                ..
            }) => held += 1,
            Err(other) => panic!("registration {n}: {other}"),
        }
    }
    assert_eq!((created, held), (80, 20));
    let jits = h.seen("/generate-jitconfig");
    assert_eq!(jits, 80, "only what fits left the process");
    assert!(
        h.fake.requests().iter().all(|r| !r.secondary_limited()),
        "GitHub had to refuse a request"
    );
    assert_eq!(h.fake.creations(Some(h.org_installation)).0, 80);
}

/// When GitHub's limit is tighter than the documented one (GitHub: "limits may change without
/// notice"), its own answer steers: a 403 and then a 429 with `retry-after` are each a
/// secondary limit until then, and nothing of that installation leaves meanwhile.
#[tokio::test]
async fn a_tighter_limit_at_github_is_honoured_in_either_status() {
    for status in [LimitStatus::Forbidden, LimitStatus::TooManyRequests] {
        let h = harness().await;
        h.fake.set_limit_status(status);
        h.fake.set_secondary_limits(SecondaryLimits {
            creations_per_minute: 3,
            ..SecondaryLimits::GITHUB
        });
        for n in 0..3 {
            h.client
                .generate_jitconfig(&org(), &jit_request(&format!("r{n}")))
                .await
                .unwrap_or_else(|e| panic!("{status:?} {n}: {e}"));
        }
        let retry_at = match h
            .client
            .generate_jitconfig(&org(), &jit_request("r3"))
            .await
        {
            Err(GithubError::RateLimited {
                kind: LimitKind::Secondary,
                retry_at,
                ..
            }) => retry_at,
            other => panic!("{status:?}: {other:?}"),
        };
        let limited: Vec<_> = h
            .fake
            .requests()
            .into_iter()
            .filter(|r| r.secondary_limited())
            .collect();
        assert_eq!(limited.len(), 1);
        let want = if status == LimitStatus::Forbidden {
            403
        } else {
            429
        };
        assert_eq!(limited[0].status, want);
        let secs: u64 = limited[0]
            .response_header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(secs >= 55, "retry-after {secs}");
        let now = h.clock.now().to_system_time();
        assert!(
            retry_at >= now + Duration::from_secs(secs - 1),
            "retry-after read"
        );
        // Held: a read of the same installation does not leave either.
        let seen = h.fake.requests().len();
        h.advance(Duration::from_secs(secs - 5));
        assert!(matches!(
            h.client.list_runners(&org()).await,
            Err(GithubError::RateLimited { .. })
        ));
        assert_eq!(
            h.fake.requests().len(),
            seen,
            "a request left into the wait"
        );
        h.advance(Duration::from_secs(6));
        h.client
            .generate_jitconfig(&org(), &jit_request("r3"))
            .await
            .unwrap_or_else(|e| panic!("{status:?} after the wait: {e}"));
    }
}

/// A spent quota answered 403 or 429 (with `x-ratelimit-remaining: 0`) is a primary limit until
/// `x-ratelimit-reset` either way.
#[tokio::test]
async fn a_spent_quota_is_a_primary_limit_in_either_status() {
    for status in [LimitStatus::Forbidden, LimitStatus::TooManyRequests] {
        let h = harness().await;
        h.fake.set_limit_status(status);
        h.client
            .list_runners(&org())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        h.fake.exhaust_rate_limit(Duration::from_secs(600));
        match h.client.list_runners(&org()).await {
            Err(GithubError::RateLimited {
                kind: LimitKind::Primary,
                retry_at,
                ..
            }) => {
                let now = h.clock.now().to_system_time();
                assert!(retry_at > now + Duration::from_secs(590), "{status:?}");
            }
            other => panic!("{status:?}: {other:?}"),
        }
        let last = h.fake.requests().pop().map(|r| r.status);
        let want = if status == LimitStatus::Forbidden {
            403
        } else {
            429
        };
        assert_eq!(last, Some(want));
    }
}

/// GitHub refuses a request without a `User-Agent` (403, "Request forbidden by administrative
/// rules"), and so does the fake: every kind of request the client makes (JWT, token mint,
/// installation reads and writes) carries one and is answered.
#[tokio::test]
async fn every_request_names_its_user_agent() {
    let h = harness().await;
    h.client.app().await.unwrap_or_else(|e| panic!("{e}"));
    h.client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let jit = h
        .client
        .generate_jitconfig(&org(), &jit_request("ua"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    h.client
        .delete_runner(&org(), jit.runner.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let requests = h.fake.requests();
    assert!(requests.len() >= 5, "{} requests", requests.len());
    for r in &requests {
        let ua = r.header("user-agent").unwrap_or("");
        assert!(
            !ua.trim().is_empty(),
            "{} {} without a User-Agent",
            r.method,
            r.path
        );
        assert_ne!(r.status, 403, "{} {} refused", r.method, r.path);
    }
}

/// Registers `name` on `target`, moving both clocks to each time the client names when it is
/// refused (its budget sleeps for nothing: every wait comes back as `retry_at`). Returns when it
/// was created.
async fn register_when_allowed(h: &Harness, target: &rm_github::Target, name: &str) -> SystemTime {
    for _ in 0..100 {
        match h
            .client
            .generate_jitconfig(target, &jit_request(name))
            .await
        {
            Ok(_) => return h.clock.now().to_system_time(),
            Err(GithubError::RateLimited { retry_at, .. }) => {
                let wait = retry_at
                    .duration_since(h.clock.now().to_system_time())
                    .unwrap_or(Duration::ZERO);
                h.advance(wait.max(Duration::from_millis(1)));
            }
            Err(other) => panic!("{name}: {other}"),
        }
    }
    panic!("{name}: never registered");
}

/// A GitHub that counts every POST as content (the fake's strict default) against rm's default
/// (the content limit learned): a 300-job matrix meets one secondary limit at most, after which
/// the client paces at 80 a minute; every registration succeeds, and the content snapshot says
/// the installation's POSTs count, learned when, until when.
#[tokio::test]
async fn strict_github_one_limit_at_most_then_paced_at_eighty_a_minute() {
    let mut h = harness().await;
    h.client = client_paced(
        h.fake.api_url(),
        &h.clock,
        Pacing::default(),
        Duration::ZERO,
    );
    let mut created = Vec::new();
    for n in 0..300 {
        created.push(register_when_allowed(&h, &repo(), &format!("s{n}")).await);
    }
    let limited: Vec<_> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.secondary_limited())
        .collect();
    assert_eq!(limited.len(), 1, "GitHub refused more than once");
    let at_once = created.iter().filter(|t| **t == created[0]).count();
    assert_eq!(at_once, 80, "the first minute's 80 left at once");
    // From the limit on, never more than 80 in any of GitHub's minutes.
    for (i, t) in created.iter().enumerate().skip(80) {
        let in_minute = created[i..]
            .iter()
            .take_while(|u| **u < *t + MINUTE)
            .count();
        assert!(
            in_minute <= 80,
            "{in_minute} in the minute from registration {i}"
        );
    }
    let scope = rm_github::Scope::Installation(h.org_installation);
    let content = h.client.content_pacing();
    let line = content
        .iter()
        .find(|c| c.scope == scope)
        .unwrap_or_else(|| panic!("{content:?}"));
    match line.counted {
        Some(ContentReason::Learned { at, until }) => {
            assert_eq!(until, at + CONTENT_LEARNED_FOR);
            assert!(
                at <= created[80] && at >= created[0],
                "learned at the limit"
            );
        }
        other => panic!("content not learned: {other:?}"),
    }
    assert!(line.creations_minute <= 80);
}

/// A GitHub that does not count registrations as content (loose) and keeps them in their own
/// primary bucket (10,000 an hour): 2,000 registrations of one App spread over an hour all
/// succeed, GitHub never answers a limit, the registration bucket is never spent, and the
/// installation's POSTs never start counting as content.
#[tokio::test]
async fn loose_github_takes_2000_registrations_in_an_hour_without_a_limit() {
    let mut h = harness().await;
    h.fake.set_secondary_limits(SecondaryLimits {
        content: ContentCounting::Loose,
        ..SecondaryLimits::GITHUB
    });
    h.fake
        .set_registration_limit(rm_fake_github::limits::REGISTRATION_LIMIT);
    h.client = client_paced(
        h.fake.api_url(),
        &h.clock,
        Pacing::default(),
        Duration::ZERO,
    );
    let start = h.clock.now().to_system_time();
    // 2,000 in 3,600 s: a burst of 100 every 180 s (each burst inside the template's 180 a
    // minute), the last burst 57 minutes in.
    for burst in 0..20u64 {
        let due = start + Duration::from_secs(burst * 180);
        if let Ok(ahead) = due.duration_since(h.clock.now().to_system_time()) {
            h.advance(ahead);
        }
        for n in 0..100 {
            register_when_allowed(&h, &repo(), &format!("l{burst}-{n}")).await;
        }
    }
    assert!(
        h.clock.now().to_system_time() < start + Duration::from_secs(3600),
        "over the hour"
    );
    let requests = h.fake.requests();
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.path.ends_with("/generate-jitconfig") && r.status == 201)
            .count(),
        2000
    );
    let refused: Vec<_> = requests
        .iter()
        .filter(|r| matches!(r.status, 403 | 429))
        .collect();
    assert!(refused.is_empty(), "GitHub refused {}", refused.len());
    let (limit, remaining) = h.fake.registration_quota(h.org_installation);
    assert_eq!((limit, remaining), (10_000, 8_000));
    let scope = rm_github::Scope::Installation(h.org_installation);
    assert!(
        h.client
            .content_pacing()
            .iter()
            .filter(|c| c.scope == scope)
            .all(|c| c.counted.is_none())
    );
    assert!(
        h.client
            .budget()
            .iter()
            .any(|b| b.scope == scope && b.resource == "actions_runner_registration")
    );
}
