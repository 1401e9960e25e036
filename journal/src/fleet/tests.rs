//! The fleet's tests. First the pure rules with explicit times; then one suite that runs against
//! both implementations (`sqlite::name` on a journal file, `postgres::name` on a database of
//! its own), jobs made by real deliveries through the intake; then races only PostgreSQL can
//! have: two hosts, two connections, at the same moment.
//!
//! Times: a lease that must hold lasts [`HOLDS`] (minutes; no test lasts that long); one that
//! must pass lasts [`PASSES`] and is awaited by polling for at most [`BOUND`]. Nothing asserts
//! how long anything took.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use ::postgres::{Client, NoTls};
use rm_vocab::{JobId, JobState, UnixMs};

use super::*;
use crate::intake_tests::{Postgres, Sqlite, job_delivery, off_runtime};
use crate::{LocalFleet, PgFleet};

/// A lease no test outlives.
const HOLDS: Duration = Duration::from_secs(600);
/// A lease that has passed a moment after it is given.
const PASSES: Duration = Duration::from_millis(20);
/// How long a test waits for a short lease to pass: generous, the machine is shared.
const BOUND: Duration = Duration::from_secs(30);

// --- The pure rules. ---

/// The instant `ms` after the epoch: the pure rules' explicit times.
fn t(ms: i64) -> UnixMs {
    UnixMs::new(ms)
}

#[test]
fn a_lease_holds_until_its_expiry_and_not_at_it() {
    assert!(lease_live(t(1_000), t(999)));
    assert!(!lease_live(t(1_000), t(1_000)));
    assert!(!lease_live(t(1_000), t(1_001)));
    assert_eq!(expiry(t(1_000), Duration::from_millis(250)), t(1_250));
    assert_eq!(expiry(t(i64::MAX - 1), Duration::from_secs(1)), t(i64::MAX));
    assert_eq!(expiry(t(0), Duration::MAX), t(i64::MAX));
}

#[test]
fn a_renewal_registers_renews_or_reacquires() {
    assert_eq!(renewal(None, t(5)), Renewal::Registered);
    assert_eq!(renewal(Some(t(6)), t(5)), Renewal::Renewed);
    assert_eq!(
        renewal(Some(t(5)), t(5)),
        Renewal::Reacquired { dropped_claims: 0 }
    );
}

#[test]
fn a_role_is_taken_when_free_or_expired_and_renewed_by_its_holder() {
    assert_eq!(lead(None, "a", t(5)), Lead::Take);
    assert_eq!(lead(Some(("a", t(10))), "a", t(5)), Lead::Renew);
    // Its holder renews even an expired lease (nobody took it meanwhile).
    assert_eq!(lead(Some(("a", t(1))), "a", t(5)), Lead::Renew);
    assert_eq!(lead(Some(("b", t(10))), "a", t(5)), Lead::Refuse);
    assert_eq!(lead(Some(("b", t(5))), "a", t(5)), Lead::Take);
}

#[test]
fn a_shared_window_has_room_until_its_limit_then_when_the_oldest_leaves() {
    let ms = Duration::from_millis;
    let minute = SpendWindow {
        limit: 3,
        span: Duration::from_millis(60),
    };
    let hour = SpendWindow {
        limit: 4,
        span: Duration::from_millis(3_600),
    };
    assert_eq!(room_after(&[], 100, &[minute]), None);
    assert_eq!(room_after(&[90, 95], 100, &[minute]), None);
    // Full: the oldest leaves at 90 + 60.
    assert_eq!(room_after(&[90, 95, 99], 100, &[minute]), Some(ms(50)));
    // One that left the window (40 + 60 = 100, not after 100) does not count.
    assert_eq!(room_after(&[40, 95, 99], 100, &[minute]), None);
    // Over the limit (it was lowered): as many as the excess must leave.
    assert_eq!(room_after(&[90, 92, 95, 99], 100, &[minute]), Some(ms(52)));
    // The fuller window decides: the minute has room, the hour not until 10 + 3600.
    assert_eq!(
        room_after(&[10, 20, 30, 95], 100, &[minute, hour]),
        Some(ms(3_510))
    );
    // A limit of 0 never has room: a whole span.
    let none = SpendWindow { limit: 0, ..minute };
    assert_eq!(room_after(&[], 100, &[none]), Some(ms(60)));
    assert_eq!(longest_ms(&[minute, hour]), 3_600);
    assert_eq!(longest_ms(&[]), 0);
}

#[test]
fn choosing_keeps_the_request_s_order_each_job_once_and_the_ceiling() {
    let free: HashSet<JobId> = ids([1, 2, 3, 5]).into();
    assert_eq!(
        choose(&ids([5, 4, 3, 3, 2, 1]), &free, 0, None),
        (ids([5, 3, 2, 1]).to_vec(), false)
    );
    assert_eq!(
        choose(&ids([5, 3, 2, 1]), &free, 1, Some(3)),
        (ids([5, 3]).to_vec(), true)
    );
    assert_eq!(
        choose(&ids([5, 3]), &free, 1, Some(3)),
        (ids([5, 3]).to_vec(), false)
    );
    assert_eq!(choose(&ids([5, 3]), &free, 3, Some(3)), (vec![], true));
    // More live claims than the ceiling (it was lowered): nothing, no underflow.
    assert_eq!(choose(&ids([5]), &free, 9, Some(3)), (vec![], true));
    // Nothing free: not held back by the ceiling.
    assert_eq!(choose(&ids([4]), &free, 3, Some(3)), (vec![], false));
}

#[test]
fn the_view_shows_claims_only_under_live_hosts_and_only_live_leaders() {
    let host = |name: &str, expires| HostRow {
        host: name.to_owned(),
        registered_at_ms: t(1),
        renewed_at_ms: t(2),
        expires_at_ms: expires,
        labels: r#"["self-hosted"]"#.to_owned(),
        policies: r#"["small"]"#.to_owned(),
    };
    let claim = |name: &str, job_id, job_state| ClaimRow {
        host: name.to_owned(),
        view: ClaimView {
            job_id: JobId::new(job_id),
            policy: "small".to_owned(),
            runner_name: None,
            claimed_at_ms: UnixMs::new(3),
            job_state,
        },
    };
    let leader = |role: &str, expires| LeaderView {
        role: role.to_owned(),
        host: "a".to_owned(),
        acquired_at_ms: UnixMs::new(1),
        renewed_at_ms: UnixMs::new(2),
        expires_at_ms: UnixMs::new(expires),
    };
    let view = assemble(
        t(100),
        vec![host("a", t(200)), host("dead", t(100))],
        vec![
            claim("a", 1, JobState::Queued),
            claim("a", 2, JobState::InProgress),
            claim("a", 3, JobState::Completed),
            claim("dead", 4, JobState::Queued),
            claim("gone", 5, JobState::Queued),
        ],
        vec![leader("live", 101), leader("passed", 100)],
    );
    let a = &view.hosts[0];
    assert!(a.live);
    assert_eq!(a.labels, ["self-hosted"]);
    assert_eq!(a.policies, ["small"]);
    assert_eq!(
        a.claims.iter().map(|c| c.job_id.get()).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(!view.hosts[1].live);
    assert!(view.hosts[1].claims.is_empty());
    assert_eq!(view.leaders.len(), 1);
    assert_eq!(view.leaders[0].role, "live");
}

// --- The suite both journals run. ---

/// A journal under test: its intake (to make jobs as deliveries do) and new fleet connections.
struct World {
    db: Db,
    rt: tokio::runtime::Runtime,
}

enum Db {
    Sqlite(Sqlite),
    Postgres(Box<Postgres>),
}

impl World {
    fn sqlite() -> World {
        World::with(Db::Sqlite(Sqlite::new()))
    }

    fn postgres(test: &str) -> Option<World> {
        Postgres::new(test).map(|pg| World::with(Db::Postgres(Box::new(pg))))
    }

    fn with(db: Db) -> World {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        World { db, rt }
    }

    /// A fleet handle on a connection of its own, as each host has.
    fn fleet(&self) -> Box<dyn Fleet + Send> {
        match &self.db {
            Db::Sqlite(db) => Box::new(LocalFleet::open(&db.path).unwrap()),
            Db::Postgres(db) => Box::new(PgFleet::connect(&db.db.url()).unwrap()),
        }
    }

    /// Records the delivery of each job in `action` (`queued`, `in_progress`, `completed`).
    fn jobs(&self, ids: impl IntoIterator<Item = i64>, action: &str) {
        for id in ids {
            let delivery = job_delivery(&format!("{id}-{action}"), id, action, 1_000 + id);
            let recorded = match &self.db {
                Db::Sqlite(db) => self.rt.block_on(db.journal.record(delivery)),
                Db::Postgres(db) => self.rt.block_on(db.journal.record(delivery)),
            };
            assert!(recorded.is_ok(), "{recorded:?}");
        }
    }
}

/// `name` with the suite's labels and policy.
fn host(name: &str) -> HostInfo {
    HostInfo {
        host: name.to_owned(),
        labels: vec!["self-hosted".to_owned(), "linux".to_owned()],
        policies: vec!["small".to_owned()],
    }
}

/// Job ids from their numbers.
fn ids<const N: usize>(numbers: [i64; N]) -> [JobId; N] {
    numbers.map(JobId::new)
}

/// Job ids from a list of numbers.
fn job_ids(numbers: &[i64]) -> Vec<JobId> {
    numbers.iter().copied().map(JobId::new).collect()
}

fn request<'a>(host: &'a str, job_ids: &'a [JobId]) -> ClaimRequest<'a> {
    ClaimRequest {
        host,
        policy: "small",
        job_ids,
        max_runners: None,
    }
}

fn capped<'a>(host: &'a str, policy: &'a str, job_ids: &'a [JobId], max: u32) -> ClaimRequest<'a> {
    ClaimRequest {
        host,
        policy,
        job_ids,
        max_runners: Some(max),
    }
}

fn got(fleet: &mut (dyn Fleet + Send), request: ClaimRequest<'_>) -> Vec<i64> {
    let claimed = fleet.claim(&request).unwrap().job_ids;
    claimed.iter().map(|id| id.get()).collect()
}

/// Polls `done` until it holds, failing after [`BOUND`]: for a short lease to pass.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Instantiates each `name(world: &World)` as `sqlite::name` and `postgres::name`.
macro_rules! fleet_test {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&super::World::sqlite());
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    if let Some(world) = super::World::postgres(stringify!($name)) {
                        super::$name(&world);
                    }
                }
            )*
        }
    };
}

fleet_test!(
    a_queued_job_is_claimed_by_one_host_only,
    a_claim_needs_a_live_lease,
    a_dead_host_s_claims_pass_to_another_host_and_never_come_back,
    release_and_completion_end_a_claim,
    fleet_max_runners_counts_the_policy_s_live_claims_on_every_host,
    the_view_shows_hosts_leases_and_runners_per_host,
    one_leader_per_role_until_its_lease_passes,
    renewals_register_renew_and_reacquire,
    hosts_reserve_in_one_shared_window_per_scope,
);

/// Two hosts reserve in one window of a scope: together no more than its limit, the refusal
/// says how long until the oldest leaves, another scope is apart, and once the window's span
/// has passed there is room again.
fn hosts_reserve_in_one_shared_window_per_scope(w: &World) {
    let (mut a, mut b) = (w.fleet(), w.fleet());
    let holds = [SpendWindow {
        limit: 3,
        span: HOLDS,
    }];
    assert_eq!(a.reserve("installation:1", "a", &holds).unwrap(), None);
    assert_eq!(a.reserve("installation:1", "a", &holds).unwrap(), None);
    assert_eq!(b.reserve("installation:1", "b", &holds).unwrap(), None);
    let wait = b.reserve("installation:1", "b", &holds).unwrap().unwrap();
    assert!(wait <= HOLDS && wait > HOLDS - BOUND, "{wait:?}");
    assert!(a.reserve("installation:1", "a", &holds).unwrap().is_some());
    assert_eq!(b.reserve("installation:2", "b", &holds).unwrap(), None);
    // A short window: full, then free once its span has passed.
    let passes = [SpendWindow {
        limit: 1,
        span: PASSES,
    }];
    assert_eq!(a.reserve("installation:3", "a", &passes).unwrap(), None);
    eventually("the short window has room", || {
        b.reserve("installation:3", "b", &passes).unwrap().is_none()
    });
}

/// Only queued jobs are claimed, each by one host: the second host gets none of them, and a
/// job already claimed is not handed out again, even to its own host.
fn a_queued_job_is_claimed_by_one_host_only(w: &World) {
    w.jobs(1..=4, "queued");
    w.jobs([4], "in_progress");
    let (mut a, mut b) = (w.fleet(), w.fleet());
    a.renew_lease(&host("a"), HOLDS).unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    // 4 is in progress, 5 was never journalled.
    assert_eq!(got(&mut *a, request("a", &ids([3, 1, 2, 4, 5]))), [3, 1, 2]);
    assert_eq!(
        got(&mut *b, request("b", &ids([1, 2, 3]))),
        Vec::<i64>::new()
    );
    assert_eq!(got(&mut *a, request("a", &ids([1]))), Vec::<i64>::new());
    w.jobs([6], "queued");
    assert_eq!(got(&mut *b, request("b", &ids([1, 2, 3, 6]))), [6]);
}

/// A host claims nothing without a live lease: never registered, left, or expired.
fn a_claim_needs_a_live_lease(w: &World) {
    w.jobs([1], "queued");
    let mut a = w.fleet();
    let refused = |result: Result<Claimed, FleetError>| matches!(result, Err(FleetError::LeaseExpired { host }) if host == "a");
    assert!(refused(a.claim(&request("a", &ids([1])))));
    a.renew_lease(&host("a"), HOLDS).unwrap();
    a.leave("a").unwrap();
    assert!(refused(a.claim(&request("a", &ids([1])))));
    a.renew_lease(&host("a"), PASSES).unwrap();
    // Asks for no job while waiting, so a claim made before the lease passed cannot hide it.
    eventually("a's short lease passes", || {
        refused(a.claim(&request("a", &[])))
    });
    assert!(refused(a.claim(&request("a", &ids([1])))));
    // The refusals were the lease's, not the job's: a live host claims it.
    let mut b = w.fleet();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    assert_eq!(got(&mut *b, request("b", &ids([1]))), [1]);
}

/// Host a claims two jobs and stops renewing: while its lease holds, host b gets neither; once
/// it passed, b takes one. When a comes back its lease is new and the claim b did not take is
/// dropped, not revived: b can take that one too, and a gets neither back.
fn a_dead_host_s_claims_pass_to_another_host_and_never_come_back(w: &World) {
    w.jobs([1, 2], "queued");
    let (mut a, mut b) = (w.fleet(), w.fleet());
    a.renew_lease(&host("a"), HOLDS).unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    assert_eq!(got(&mut *a, request("a", &ids([1, 2]))), [1, 2]);
    assert_eq!(got(&mut *b, request("b", &ids([1]))), Vec::<i64>::new());
    a.renew_lease(&host("a"), PASSES).unwrap();
    eventually("b takes job 1 once a's lease passed", || {
        got(&mut *b, request("b", &ids([1]))) == [1]
    });
    let back = a.renew_lease(&host("a"), HOLDS).unwrap();
    assert_eq!(back.renewal, Renewal::Reacquired { dropped_claims: 1 });
    assert_eq!(got(&mut *a, request("a", &ids([1, 2]))), [2]);
    assert_eq!(got(&mut *b, request("b", &ids([2]))), Vec::<i64>::new());
    assert!(
        !a.name_runner("a", JobId::new(1), "rm-a-1").unwrap(),
        "a's claim on 1 is b's now"
    );
    assert!(b.name_runner("b", JobId::new(1), "rm-b-1").unwrap());
}

/// Releasing a claim frees its job at once; only the holder can release it. A claim outlives
/// the job's start (its runner still counts) and ends when the job completes.
fn release_and_completion_end_a_claim(w: &World) {
    w.jobs([1, 2], "queued");
    let (mut a, mut b) = (w.fleet(), w.fleet());
    a.renew_lease(&host("a"), HOLDS).unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    assert_eq!(got(&mut *a, request("a", &ids([1, 2]))), [1, 2]);
    assert!(
        !b.release("b", JobId::new(1)).unwrap(),
        "b released a's claim"
    );
    assert_eq!(got(&mut *b, request("b", &ids([1]))), Vec::<i64>::new());
    assert!(a.release("a", JobId::new(1)).unwrap());
    assert!(!a.release("a", JobId::new(1)).unwrap());
    assert_eq!(got(&mut *b, request("b", &ids([1]))), [1]);

    let claims_of = |fleet: &mut (dyn Fleet + Send), name: &str| -> Vec<(i64, JobState)> {
        let view = fleet.view().unwrap();
        let host = view.hosts.iter().find(|h| h.host == name).unwrap();
        host.claims
            .iter()
            .map(|c| (c.job_id.get(), c.job_state))
            .collect()
    };
    w.jobs([2], "in_progress");
    assert_eq!(claims_of(&mut *a, "a"), [(2, JobState::InProgress)]);
    w.jobs([2], "completed");
    assert!(claims_of(&mut *a, "a").is_empty());
}

/// A fleet-wide `max_runners` of 2 for `small`: counted over every host's live claims of that
/// policy (not another policy's), including a job in progress, not a completed job's, a
/// released one's or a dead host's.
fn fleet_max_runners_counts_the_policy_s_live_claims_on_every_host(w: &World) {
    w.jobs(1..=7, "queued");
    let (mut a, mut b) = (w.fleet(), w.fleet());
    a.renew_lease(&host("a"), HOLDS).unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    let claimed = a.claim(&capped("a", "small", &ids([1, 2, 3]), 2)).unwrap();
    assert_eq!(
        claimed,
        Claimed {
            job_ids: ids([1, 2]).to_vec(),
            at_ceiling: true
        }
    );
    let claimed = b.claim(&capped("b", "small", &ids([3, 4]), 2)).unwrap();
    assert_eq!(
        claimed,
        Claimed {
            job_ids: vec![],
            at_ceiling: true
        }
    );
    assert_eq!(got(&mut *b, capped("b", "large", &ids([3]), 2)), [3]);
    assert!(a.release("a", JobId::new(1)).unwrap());
    assert_eq!(got(&mut *b, capped("b", "small", &ids([4, 5]), 2)), [4]);
    w.jobs([2], "in_progress");
    assert_eq!(
        got(&mut *b, capped("b", "small", &ids([5]), 2)),
        Vec::<i64>::new()
    );
    w.jobs([2], "completed");
    assert_eq!(got(&mut *b, capped("b", "small", &ids([5]), 2)), [5]);
    // b holds both of small's runners; once b's lease passed, they no longer count.
    assert_eq!(
        got(&mut *a, capped("a", "small", &ids([6]), 2)),
        Vec::<i64>::new()
    );
    b.renew_lease(&host("b"), PASSES).unwrap();
    eventually("a claims once b's lease passed", || {
        got(&mut *a, capped("a", "small", &ids([6, 7]), 2)) == [6, 7]
    });
}

/// `status`'s view: every host with its lease, labels and policies, the claims under each
/// with the runner named for them; a host whose lease passed shows as not live, with none.
fn the_view_shows_hosts_leases_and_runners_per_host(w: &World) {
    w.jobs([1, 2, 3], "queued");
    let (mut a, mut b) = (w.fleet(), w.fleet());
    let lease_a = a.renew_lease(&host("a"), HOLDS).unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    assert_eq!(got(&mut *a, request("a", &ids([1, 2]))), [1, 2]);
    assert_eq!(got(&mut *b, request("b", &ids([3]))), [3]);
    assert!(
        a.name_runner("a", JobId::new(1), "rm-a-000000000001")
            .unwrap()
    );
    assert!(
        !b.name_runner("b", JobId::new(2), "rm-b-000000000002")
            .unwrap()
    );
    let view = b.view().unwrap();
    let names: Vec<&str> = view.hosts.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let a_view = &view.hosts[0];
    assert!(a_view.live);
    assert_eq!(a_view.expires_at_ms, lease_a.expires_at_ms);
    assert!(a_view.renewed_at_ms < a_view.expires_at_ms && a_view.renewed_at_ms <= view.now_ms);
    assert_eq!(a_view.labels, ["self-hosted", "linux"]);
    assert_eq!(a_view.policies, ["small"]);
    let runners: Vec<(i64, Option<&str>)> = a_view
        .claims
        .iter()
        .map(|c| (c.job_id.get(), c.runner_name.as_deref()))
        .collect();
    assert_eq!(runners, [(1, Some("rm-a-000000000001")), (2, None)]);
    assert_eq!(view.hosts[1].claims.len(), 1);

    a.renew_lease(&host("a"), PASSES).unwrap();
    eventually("a shows as dead", || {
        let view = b.view().unwrap();
        !view.hosts[0].live && view.hosts[0].claims.is_empty() && view.hosts[1].live
    });
}

/// A role has one leader: the holder renews it, others are refused until it resigns or its
/// lease passes; then another host takes it and the first is refused.
fn one_leader_per_role_until_its_lease_passes(w: &World) {
    let (mut a, mut b) = (w.fleet(), w.fleet());
    let poller = "poller:github.com/acme";
    assert!(a.try_lead(poller, "a", HOLDS).unwrap());
    assert!(!b.try_lead(poller, "b", HOLDS).unwrap());
    assert!(a.try_lead(poller, "a", HOLDS).unwrap());
    assert!(b.try_lead("poller:github.com/other", "b", HOLDS).unwrap());
    assert!(!b.resign(poller, "b").unwrap());
    assert!(a.resign(poller, "a").unwrap());
    assert!(b.try_lead(poller, "b", HOLDS).unwrap());
    assert!(!a.try_lead(poller, "a", HOLDS).unwrap());
    // b stops renewing.
    assert!(b.try_lead(poller, "b", PASSES).unwrap());
    eventually("a takes the role once b's lease passed", || {
        a.try_lead(poller, "a", HOLDS).unwrap()
    });
    assert!(!b.try_lead(poller, "b", HOLDS).unwrap());
    let view = b.view().unwrap();
    let leaders: Vec<(&str, &str)> = view
        .leaders
        .iter()
        .map(|l| (l.role.as_str(), l.host.as_str()))
        .collect();
    assert_eq!(
        leaders,
        [
            ("poller:github.com/acme", "a"),
            ("poller:github.com/other", "b")
        ]
    );
}

/// What each renewal reports; a renewal also forgets the host's claims on completed jobs, and
/// leaving ends the host's claims and leaderships at once.
fn renewals_register_renew_and_reacquire(w: &World) {
    w.jobs([1, 2], "queued");
    let (mut a, mut b) = (w.fleet(), w.fleet());
    assert_eq!(
        a.renew_lease(&host("a"), HOLDS).unwrap().renewal,
        Renewal::Registered
    );
    assert_eq!(
        a.renew_lease(&host("a"), PASSES).unwrap().renewal,
        Renewal::Renewed
    );
    std::thread::sleep(PASSES * 2);
    assert_eq!(
        a.renew_lease(&host("a"), HOLDS).unwrap().renewal,
        Renewal::Reacquired { dropped_claims: 0 }
    );
    assert_eq!(got(&mut *a, request("a", &ids([1, 2]))), [1, 2]);
    w.jobs([1], "completed");
    assert_eq!(
        a.renew_lease(&host("a"), HOLDS).unwrap().renewal,
        Renewal::Renewed
    );
    assert!(
        !a.release("a", JobId::new(1)).unwrap(),
        "the completed job's claim was kept"
    );
    assert!(a.try_lead("role", "a", HOLDS).unwrap());
    a.leave("a").unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    assert_eq!(got(&mut *b, request("b", &ids([2]))), [2]);
    assert!(b.try_lead("role", "b", HOLDS).unwrap());
    assert_eq!(
        a.renew_lease(&host("a"), HOLDS).unwrap().renewal,
        Renewal::Registered
    );
}

// --- Races on PostgreSQL: two hosts, two connections. ---

/// Another session holding `table` in EXCLUSIVE mode (reads pass, writes wait) until released:
/// both racers get past every read and queue at their first write, so they overlap.
struct Held {
    release: std::sync::mpsc::Sender<()>,
    session: std::thread::JoinHandle<()>,
}

impl Held {
    fn table(url: &str, table: &'static str) -> Held {
        let url = url.to_owned();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (locked, is_locked) = std::sync::mpsc::channel::<()>();
        let session = std::thread::spawn(move || {
            let mut client = Client::connect(&url, NoTls).unwrap();
            let mut tx = client.transaction().unwrap();
            tx.batch_execute(&format!("LOCK TABLE {table} IN EXCLUSIVE MODE"))
                .unwrap();
            locked.send(()).unwrap();
            released.recv().unwrap();
            tx.commit().unwrap();
        });
        is_locked.recv().unwrap();
        Held { release, session }
    }

    fn release(self) {
        self.release.send(()).unwrap();
        self.session.join().unwrap();
    }
}

/// How long the racers get to reach the held table before it is released: only makes the
/// overlap likelier, no result depends on it.
const OVERLAP: Duration = Duration::from_millis(300);

/// Runs `race(host)` for hosts `a` and `b` on two threads, each with its own connection,
/// started together; with `hold`, behind that table held until both had [`OVERLAP`] to get to
/// it.
fn both<T: Send>(
    world: &World,
    hold: Option<&'static str>,
    race: impl Fn(&mut (dyn Fleet + Send), &str) -> T + Sync,
) -> [T; 2] {
    let Db::Postgres(pg) = &world.db else {
        unreachable!("races run on PostgreSQL")
    };
    let url = pg.db.url();
    let mut fleets = [world.fleet(), world.fleet()];
    let start = std::sync::Barrier::new(3);
    std::thread::scope(|scope| {
        let race = &race;
        let start = &start;
        let held = hold.map(|table| Held::table(&url, table));
        let handles: Vec<_> = fleets
            .iter_mut()
            .zip(["a", "b"])
            .map(|(fleet, name)| {
                scope.spawn(move || {
                    start.wait();
                    race(&mut **fleet, name)
                })
            })
            .collect();
        start.wait();
        if let Some(held) = held {
            std::thread::sleep(OVERLAP);
            held.release();
        }
        let [a, b]: [std::thread::ScopedJoinHandle<'_, T>; 2] = handles.try_into().ok().unwrap();
        [a.join().unwrap(), b.join().unwrap()]
    })
}

fn racing_world(test: &str) -> Option<World> {
    let world = World::postgres(test)?;
    let (mut a, mut b) = (world.fleet(), world.fleet());
    a.renew_lease(&host("a"), HOLDS).unwrap();
    b.renew_lease(&host("b"), HOLDS).unwrap();
    Some(world)
}

/// Two hosts claim the same ten jobs at once: once with both held at their first write (so
/// both decided before either committed), then in twenty free-running rounds. Every job is
/// claimed by exactly one of them.
#[test]
fn two_hosts_racing_for_the_same_jobs_claim_each_once() {
    let Some(w) = racing_world("two_hosts_racing_for_the_same_jobs") else {
        return;
    };
    let mut rounds: Vec<(Option<&'static str>, Vec<i64>)> =
        vec![(Some("claims"), (1..=10).collect())];
    for round in 1..=20 {
        rounds.push((None, (round * 100..round * 100 + 10).collect()));
    }
    for (hold, jobs) in rounds {
        w.jobs(jobs.iter().copied(), "queued");
        let [a, b] = both(&w, hold, |fleet, name| {
            got(fleet, request(name, &job_ids(&jobs)))
        });
        let a_set: BTreeSet<i64> = a.iter().copied().collect();
        let b_set: BTreeSet<i64> = b.iter().copied().collect();
        assert!(a_set.is_disjoint(&b_set), "claimed twice: {a:?} and {b:?}");
        assert_eq!(a.len() + b.len(), jobs.len(), "{a:?} {b:?}");
    }
}

/// Two hosts, each with jobs of its own, claim under a fleet-wide `max_runners` of 3 at once:
/// together they get 3, not 3 each; with both held before their first write as well.
#[test]
fn two_hosts_racing_under_a_fleet_max_runners_stay_within_it() {
    let Some(w) = racing_world("two_hosts_racing_under_a_fleet_max_runners") else {
        return;
    };
    for (round, hold) in [Some("claims"), None, None, None, None, None]
        .into_iter()
        .enumerate()
    {
        let base = round as i64 * 100;
        let policy = format!("p{round}");
        w.jobs(base + 1..=base + 10, "queued");
        let jobs_of = |name: &str| -> Vec<i64> {
            let first = if name == "a" { base + 1 } else { base + 6 };
            (first..first + 5).collect()
        };
        let [a, b] = both(&w, hold, |fleet, name| {
            got(fleet, capped(name, &policy, &job_ids(&jobs_of(name)), 3)).len()
        });
        assert_eq!(a + b, 3, "round {round}: a got {a}, b got {b}");
    }
}

/// Two hosts race to lead a role nobody leads: exactly one does, every time; with both held
/// before their first write too.
#[test]
fn two_hosts_racing_to_lead_a_role_elect_exactly_one() {
    let Some(w) = racing_world("two_hosts_racing_to_lead_a_role") else {
        return;
    };
    for round in 0..20 {
        let hold = (round == 0).then_some("leaders");
        let role = format!("poller:{round}");
        let [a, b] = both(&w, hold, |fleet, name| {
            fleet.try_lead(&role, name, HOLDS).unwrap()
        });
        assert!(a != b, "round {round}: a leads: {a}, b leads: {b}");
    }
}

/// Two hosts reserve ten times each at once in a window of ten: together exactly ten, every
/// round; with both held before their first write once (behind the table), then twenty
/// free-running rounds (without the advisory lock, most runs fail within them).
#[test]
fn two_hosts_racing_to_reserve_stay_within_the_shared_window() {
    let Some(w) = racing_world("two_hosts_racing_to_reserve") else {
        return;
    };
    let window = [SpendWindow {
        limit: 10,
        span: HOLDS,
    }];
    for round in 0..=20 {
        let hold = (round == 0).then_some("spends");
        let scope = format!("installation:{round}");
        let [a, b] = both(&w, hold, |fleet, name| {
            (0..10)
                .filter(|_| fleet.reserve(&scope, name, &window).unwrap().is_none())
                .count()
        });
        assert_eq!(a + b, 10, "round {round}: a reserved {a}, b {b}");
    }
}

/// A fleet connection that was cut (a server restart) is made again by the next call.
#[test]
fn a_lost_fleet_connection_is_made_again() {
    let Some(w) = World::postgres("a_lost_fleet_connection_is_made_again") else {
        return;
    };
    let Db::Postgres(pg) = &w.db else {
        unreachable!()
    };
    let mut a = w.fleet();
    a.renew_lease(&host("a"), HOLDS).unwrap();
    let url = pg.db.url();
    let cut: i64 = off_runtime(|| {
        Client::connect(&url, NoTls)
            .unwrap()
            .query_one(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'rm-journal-fleet'",
                &[],
            )
            .unwrap()
            .get(0)
    });
    assert_eq!(cut, 1);
    // pg_terminate_backend only signals: wait until the backend has gone, so the next call
    // is the one that finds its connection cut.
    eventually("the terminated backend has gone", || {
        let left: i64 = off_runtime(|| {
            Client::connect(&url, NoTls)
                .unwrap()
                .query_one(
                    "SELECT COUNT(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'rm-journal-fleet'",
                    &[],
                )
                .unwrap()
                .get(0)
        });
        left == 0
    });
    // The call that finds it cut fails; the next one connects again.
    let _ = a.renew_lease(&host("a"), HOLDS);
    assert_eq!(
        a.renew_lease(&host("a"), HOLDS).unwrap().renewal,
        Renewal::Renewed
    );
}
