//! One REST budget for a fleet: pollers of two or three hosts on one PostgreSQL database
//! (`tests/support/postgres.rs`) and one fake GitHub, each host with its own GitHub client, as
//! hosts have. With the election, each target is polled by one host (the requests the fake
//! answers are one host's, not one per host); once the leader stops renewing, another host takes
//! its targets over and polls them at once. Manual time drives the pollers; the leases are judged
//! by the database's clock, so the takeover waits for a short lease in real time.
//!
//! Where PostgreSQL cannot run here these tests fail, unless `RM_TEST_ALLOW_SKIP` names
//! `postgres`.

use std::time::Instant;

use rm_journal::{PgFleet, PgJournal, PgPollJournal};
use rm_vocab::JobId;

use super::*;
use crate::test_pg_server::{self as pg_server, PgDatabase};

/// Runs blocking PostgreSQL client calls (connections, their drop) on a thread of their own:
/// the sync client starts a runtime, which cannot run inside the test's.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(f).join().unwrap())
}

/// A migrated database of its own for `test`; `None` when PostgreSQL cannot run here and the
/// skip policy allows it.
fn database(test: &str) -> Option<PgDatabase> {
    let server = match pg_server::shared() {
        Ok(server) => server,
        Err(why) => {
            crate::test_skip::cannot_run(test, "postgres", &why);
            return None;
        }
    };
    let db = server.database(test).unwrap();
    let url = db.url();
    // The intake's writer migrates; the poll store and the fleet refuse an unmigrated database.
    off_runtime(move || drop(PgJournal::connect(&url).unwrap()));
    Some(db)
}

/// How one host's poller is set up.
struct Host<'a> {
    name: &'a str,
    /// Elected through the fleet (else it polls everything, as a host alone does).
    elect: bool,
    lead_ttl: Duration,
    interval: Duration,
}

impl Host<'_> {
    fn electing(name: &str) -> Host<'_> {
        Host {
            name,
            elect: true,
            lead_ttl: election::LEAD_TTL,
            interval: Duration::from_secs(60),
        }
    }
}

/// A poller for `host` on the database at `url`, with a GitHub client of its own.
fn host_poller(h: &Harness, url: &str, host: &Host<'_>, targets: &[&str], intake: bool) -> Poller {
    let config = PollerConfig {
        targets: targets.iter().map(|t| t.parse().unwrap()).collect(),
        interval: host.interval,
        idle_interval: host.interval,
        intake,
    };
    let client = GithubClient::with_clock(
        ClientConfig::new(h.fake.api_url(), APP_ID, key().private_pem.clone()),
        Arc::new(h.clock.clone()),
    )
    .unwrap();
    let (store, fleet) = off_runtime(|| {
        (
            PgPollJournal::connect(url).unwrap(),
            PgFleet::connect(url).unwrap(),
        )
    });
    let poller = Poller::new(config, client, Box::new(store), Arc::new(h.clock.clone()))
        .unwrap()
        .with_jitter(Box::new(|| 0.0));
    if host.elect {
        poller
            .with_fleet(Box::new(fleet), host.name)
            .with_lead_ttl(host.lead_ttl)
    } else {
        off_runtime(move || drop(fleet));
        poller
    }
}

/// Steps every poller at each of its wakes for `span` of manual time, in lockstep; returns each
/// poller's reports.
async fn run_for(h: &Harness, pollers: &mut [Poller], span: Duration) -> Vec<Vec<PassReport>> {
    let mut due = vec![Duration::ZERO; pollers.len()];
    let mut reports = vec![Vec::new(); pollers.len()];
    let mut elapsed = Duration::ZERO;
    loop {
        let next = due.iter().copied().min().unwrap_or(span);
        if next >= span {
            return reports;
        }
        h.advance(next - elapsed);
        elapsed = next;
        for (i, poller) in pollers.iter_mut().enumerate() {
            if due[i] == elapsed {
                reports[i].push(poller.poll_once().await.unwrap());
                due[i] = elapsed + poller.next_wake().await;
            }
        }
    }
}

/// The requests the fake answered for `hosts` pollers over ten minutes of two targets with queued
/// jobs, and each poller's reports. With `intake` the App's hook log is scanned too (its
/// redeliveries depend on the fake's random webhook timing, so counts are compared without it).
async fn ten_minutes(
    test: &str,
    hosts: &[Host<'_>],
    intake: bool,
) -> Option<(usize, Vec<Vec<PassReport>>)> {
    let db = database(test)?;
    let h = Harness::new().await;
    h.queue("acme/widgets");
    h.queue("acme/gadgets");
    let mut pollers: Vec<Poller> = hosts
        .iter()
        .map(|host| {
            host_poller(
                &h,
                &db.url(),
                host,
                &["acme/widgets", "acme/gadgets"],
                intake,
            )
        })
        .collect();
    let reports = run_for(&h, &mut pollers, Duration::from_secs(600)).await;
    Some((h.requests(), reports))
}

#[tokio::test]
async fn two_electing_hosts_poll_each_target_once_not_once_per_host() {
    let test = "two_electing_hosts_poll_each_target_once";
    let Some((alone, _)) = ten_minutes(test, &[Host::electing("a")], false).await else {
        return;
    };
    let Some((unelected, _)) = ten_minutes(
        test,
        &[
            Host {
                elect: false,
                ..Host::electing("a")
            },
            Host {
                elect: false,
                ..Host::electing("b")
            },
        ],
        false,
    )
    .await
    else {
        return;
    };
    let Some((elected, reports)) =
        ten_minutes(test, &[Host::electing("a"), Host::electing("b")], false).await
    else {
        return;
    };
    assert!(alone > 10, "the scenario polls ({alone} requests)");
    assert_eq!(unelected, 2 * alone, "without the election each host polls");
    assert_eq!(elected, alone, "elected: one host's requests for the fleet");
    // Host a stepped first and leads both targets and the scan; b sent nothing at all.
    let (a, b) = (&reports[0], &reports[1]);
    assert!(a.iter().all(|r| r.targets_led_elsewhere == 0));
    assert!(a.iter().any(|r| r.targets_read == 2));
    assert!(!b.is_empty());
    assert!(
        b.iter()
            .all(|r| r.requests == 0 && r.targets_led_elsewhere == 2 && !r.polled_demand),
        "{b:?}"
    );

    // The failed-delivery scan is elected too: only its leader reads the App's hook log.
    let Some((_, reports)) =
        ten_minutes(test, &[Host::electing("a"), Host::electing("b")], true).await
    else {
        return;
    };
    let (a, b) = (&reports[0], &reports[1]);
    assert!(a.iter().map(|r| r.deliveries_examined).sum::<usize>() > 0);
    assert!(
        b.iter()
            .all(|r| r.requests == 0 && r.deliveries_examined == 0),
        "{b:?}"
    );
}

/// How long the test waits, in real time, for a lapsed lead to pass to the other host.
const TAKEOVER_BOUND: Duration = Duration::from_secs(30);

#[tokio::test]
async fn when_the_leader_stops_renewing_the_other_host_takes_over_and_polls_at_once() {
    let Some(db) = database("when_the_leader_stops_renewing") else {
        return;
    };
    let h = Harness::new().await;
    // Long intervals: once b follows, its own schedule is not due again for ten minutes of
    // manual time, and the clock does not move below, so only the takeover makes it poll.
    let host = |name| Host {
        lead_ttl: Duration::from_millis(300),
        interval: Duration::from_secs(600),
        ..Host::electing(name)
    };
    let targets = ["acme/widgets"];
    let mut a = host_poller(&h, &db.url(), &host("a"), &targets, false);
    let mut b = host_poller(&h, &db.url(), &host("b"), &targets, false);
    let led = a.poll_once().await.unwrap();
    assert_eq!(led.targets_read, 1);
    let followed = b.poll_once().await.unwrap();
    assert_eq!((followed.requests, followed.targets_led_elsewhere), (0, 1));

    // a stops (its process is gone; its lead stays in the database until it passes).
    drop(a);
    let job = h.queue("acme/widgets");
    let sent = h.requests();
    let started = Instant::now();
    let report = loop {
        let report = b.poll_once().await.unwrap();
        if report.targets_led_elsewhere == 0 {
            break report;
        }
        assert_eq!(h.requests(), sent, "a follower sends nothing");
        assert!(
            started.elapsed() < TAKEOVER_BOUND,
            "b never took the target over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        report.polled_demand,
        "the target taken over is polled at once"
    );
    assert_eq!(report.targets_read, 1);
    assert!(h.requests() > sent);
    let url = db.url();
    let polled = off_runtime(move || {
        rm_journal::PgReader::connect(&url)
            .unwrap()
            .job(JobId::try_from(job).unwrap())
            .unwrap()
    });
    let polled = polled.expect("the job queued after a stopped was journalled by b");
    assert_eq!(
        (polled.state.as_str(), polled.source.as_str()),
        ("queued", "poll")
    );
}

/// The fleet's REST budget (docs/performance.md): charged and uncharged requests in one simulated
/// hour of two targets (a job queued in each at the start) for one host, three hosts each
/// polling alone, and three hosts elected. Ignored in the suite (it prints figures, asserts
/// none); run it with
///
/// ```sh
/// cargo test -p rm-agent --lib --features demo,fault-injection fleet_budget -- --ignored --nocapture
/// ```
#[tokio::test]
#[ignore = "a measurement: prints figures"]
async fn fleet_budget_for_one_and_three_hosts() {
    let hour = Duration::from_secs(3600);
    let unelected = |name| Host {
        elect: false,
        ..Host::electing(name)
    };
    let setups: [(&str, Vec<Host<'_>>); 3] = [
        ("1 host", vec![Host::electing("a")]),
        (
            "3 hosts, each alone",
            vec![unelected("a"), unelected("b"), unelected("c")],
        ),
        (
            "3 hosts, elected",
            vec![
                Host::electing("a"),
                Host::electing("b"),
                Host::electing("c"),
            ],
        ),
    ];
    println!("{:<22} {:>8} {:>10}", "fleet", "charged", "uncharged");
    for (label, hosts) in setups {
        let Some(db) = database("fleet_budget") else {
            return;
        };
        let h = Harness::new().await;
        h.queue("acme/widgets");
        h.queue("acme/gadgets");
        let mut pollers: Vec<Poller> = hosts
            .iter()
            .map(|host| {
                host_poller(
                    &h,
                    &db.url(),
                    host,
                    &["acme/widgets", "acme/gadgets"],
                    false,
                )
            })
            .collect();
        run_for(&h, &mut pollers, hour).await;
        let requests = h.fake.requests();
        let uncharged = requests.iter().filter(|r| r.status == 304).count();
        println!(
            "{label:<22} {:>8} {uncharged:>10}",
            requests.len() - uncharged
        );
    }
}
