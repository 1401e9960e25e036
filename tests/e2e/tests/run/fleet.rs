//! A fleet on PostgreSQL end to end (CONTRACT §9, docs/fleet.md "The end-to-end tests"): real
//! `rm-agent receive` and `rm-agent run` processes sharing one real PostgreSQL journal, the
//! fake GitHub delivering its webhooks to every receiver (each delivery to one of them, drawn
//! from the printed seed; duplicates and reordering as usual) and fake runners taking the jobs.
//!
//! The fake GitHub decides which runner runs which job (the oldest queued job that fits, to the
//! first idle runner that asks), exactly as GitHub does, so "served once" is read there: every
//! job completed by one runner, no runner with two jobs. What rm decides is how many runners
//! the fleet starts for them: the JIT registrations the fake counts, against the jobs.
//!
//! The figures each test prints (`FLEET FIGURES`) go in docs/performance.md.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rm_e2e::fleet::{PolicySpec, REPO, wait_until};
use rm_e2e::pg_fleet::{FleetHost, PgFleet, PgFleetOptions};
use rm_fake_github::{JobStatus, RunnerBehavior};
use rm_journal::{AttemptOutcome, AttemptRecord, AttemptState, Fleet as _, PgFleet as PgFleetDb};

use crate::pg_server;
use crate::skip;

const LABELS: &[&str] = &["self-hosted", "linux"];

const POLICY: PolicySpec = PolicySpec {
    name: "linux",
    target: "acme",
    labels: LABELS,
    max_runners: 8,
    workspace: "ephemeral",
    extra: "",
};

/// The lease a host holds in the fleet: a killed host's claims count this long at most.
const LEASE_TTL: Duration = rm_agent::executor::LEASE_TTL;

fn options() -> PgFleetOptions {
    PgFleetOptions {
        host_max: 4,
        policy: POLICY,
        // Short, so surplus runners (a job taken by another host's runner) are stopped and
        // cleaned within the test; long enough that a runner started for a job gets it.
        idle_timeout: "20s",
        registration_timeout: "2m",
    }
}

/// The runner names the fleet asked JIT registrations for (a request retried after a failed
/// answer asks for the same name again: counted once).
fn jit_names(fleet: &PgFleet) -> HashSet<String> {
    fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .filter_map(|r| Some(r.body.as_ref()?["name"].as_str()?.to_owned()))
        .collect()
}

fn queue(fleet: &PgFleet, n: usize, burst: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            fleet
                .fake
                .queue_job(REPO, &format!("burst{burst}-{i}"), LABELS)
                .unwrap()
        })
        .collect()
}

fn all_completed(fleet: &PgFleet, jobs: &[u64]) -> bool {
    jobs.iter().all(|j| {
        fleet
            .fake
            .job(*j)
            .is_some_and(|j| j.status == JobStatus::Completed)
    })
}

/// The fleet's view of the shared journal (the hosts' leases and claims).
fn view(url: &str) -> Option<rm_journal::FleetView> {
    pg(|| PgFleetDb::connect(url).ok()?.view().ok())
}

/// Runs a call of the journal's PostgreSQL clients, which block (each runs a runtime of its
/// own, made and dropped inside), off this test's async runtime.
fn pg<R>(call: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(call)
}

/// The jobs the journal still holds as queued.
fn journal_queued(url: &str) -> usize {
    pg(|| {
        rm_journal::PgReader::connect(url)
            .unwrap()
            .queued_jobs()
            .unwrap()
            .len()
    })
}

/// Checks what only the fake can tell: every job completed, by one runner, each runner with
/// at most one job; and what the attempts say: every runner that ran a job is one of the
/// hosts' attempts, and no job is in two attempts. Returns the job each runner ran.
fn check_served_once(fleet: &PgFleet, jobs: &[u64], attempts: &[AttemptRecord]) {
    let mut runner_of: HashMap<String, u64> = HashMap::new();
    for &job in jobs {
        let j = fleet.fake.job(job).unwrap();
        assert_eq!(j.status, JobStatus::Completed, "job {job} not completed");
        assert_eq!(
            j.conclusion.as_deref(),
            Some("success"),
            "job {job} concluded {:?}",
            j.conclusion
        );
        let runner = j
            .runner_name
            .clone()
            .expect("a completed job names its runner");
        if let Some(other) = runner_of.insert(runner.clone(), job) {
            panic!("runner {runner} ran two jobs: {other} and {job}");
        }
    }
    let ours: HashSet<&str> = attempts.iter().map(|a| a.runner_name.as_str()).collect();
    for runner in runner_of.keys() {
        assert!(
            ours.contains(runner.as_str()),
            "job run by {runner}, which no host journalled"
        );
    }
    let mut job_attempts: HashMap<rm_vocab::JobId, &str> = HashMap::new();
    for a in attempts {
        if let Some(job) = a.job_id
            && let Some(other) = job_attempts.insert(job, &a.runner_name)
        {
            panic!("job {job} in two attempts: {other} and {}", a.runner_name);
        }
    }
}

/// Every delivery a receiver answered 2xx is in the journal (by its GUID); returns how many
/// GUIDs were answered 2xx.
fn check_acknowledged_are_journalled(fleet: &PgFleet, url: &str) -> usize {
    let acknowledged: HashSet<String> = fleet
        .fake
        .deliveries()
        .into_iter()
        .filter(|d| (200..300).contains(&d.status_code))
        .map(|d| d.guid)
        .collect();
    pg(|| {
        let mut reader = rm_journal::PgReader::connect(url).unwrap();
        for guid in &acknowledged {
            assert!(
                reader.delivery(guid).unwrap().is_some(),
                "delivery {guid} was answered 2xx but is not in the journal"
            );
        }
    });
    acknowledged.len()
}

/// The surplus runners (attempts whose runner ran no job at the fake): each ended idle,
/// cleaned, never with a job. A runner that ran a job the journal had not named when its host
/// concluded it (a killed host's runner that finished while the host was down, concluded at
/// its restart before the delivery naming the runner was in) is no surplus: it ended
/// `completed_job` without a job id.
fn check_surplus(fleet: &PgFleet, jobs: &[u64], attempts: &[AttemptRecord]) -> usize {
    let ran: HashSet<String> = jobs
        .iter()
        .filter_map(|j| fleet.fake.job(*j)?.runner_name)
        .collect();
    for a in attempts
        .iter()
        .filter(|a| a.job_id.is_none() && ran.contains(&a.runner_name))
    {
        assert_eq!(
            (a.state, a.outcome),
            (AttemptState::Cleaned, Some(AttemptOutcome::CompletedJob)),
            "runner {} ran a job the journal did not name",
            a.runner_name
        );
    }
    let surplus: Vec<&AttemptRecord> = attempts
        .iter()
        .filter(|a| a.job_id.is_none() && !ran.contains(&a.runner_name))
        .collect();
    for a in &surplus {
        // A launch the SIGKILL cut short is concluded failed (`launch_interrupted`) by the
        // killed host when it starts again: expected of that host alone, never with a job.
        if a.runner_name.starts_with("rm-e2e-h3-")
            && a.reason.as_deref() == Some("launch_interrupted")
        {
            continue;
        }
        // A surplus runner idles out; under load one may instead miss its registration window
        // (failed, never registered): either way it ran no job and is cleaned.
        assert_eq!(
            a.state,
            AttemptState::Cleaned,
            "surplus runner {} not cleaned",
            a.runner_name
        );
        assert!(
            matches!(
                a.outcome,
                Some(AttemptOutcome::IdleExit | AttemptOutcome::Failed)
            ),
            "surplus runner {} ended {:?} ({:?})",
            a.runner_name,
            a.outcome,
            a.reason
        );
    }
    for a in attempts.iter().filter(|a| a.job_id.is_some()) {
        assert_eq!(
            (a.state, a.outcome),
            (AttemptState::Cleaned, Some(AttemptOutcome::CompletedJob)),
            "runner {} with job {:?}",
            a.runner_name,
            a.job_id
        );
    }
    surplus.len()
}

/// The registrations of the fleet's runners still listed at the fake (a leak), and those of
/// `hosts`' runners the fake removed itself at the end of a finished runner's lag (nobody
/// deleted them in the 32 s GitHub lists a finished runner). A host killed while its runners
/// finished is not among `hosts`: GitHub removing those is what happens to a dead host's.
fn registrations_left(fleet: &PgFleet, hosts: &[&FleetHost]) -> (Vec<String>, Vec<String>) {
    let listed = fleet
        .fake
        .runners()
        .into_iter()
        .map(|r| r.name)
        .filter(|n| n.starts_with("rm-e2e-"))
        .collect();
    let expired = fleet
        .fake
        .expired_runners()
        .into_iter()
        .filter(|n| {
            hosts
                .iter()
                .any(|h| n.starts_with(&format!("rm-{}-", h.name)))
        })
        .collect();
    (listed, expired)
}

/// Waits (bounded) until no registration of the fleet is listed at the fake; fails naming
/// them. Returns the runners of `hosts` GitHub removed itself (not deleted by their agent).
async fn no_registration_left(fleet: &PgFleet, hosts: &[&FleetHost]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (listed, expired) = registrations_left(fleet, hosts);
        if listed.is_empty() {
            return expired;
        }
        assert!(
            Instant::now() < deadline,
            "registrations left at the fake: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn all_attempts(hosts: &[FleetHost]) -> Vec<AttemptRecord> {
    hosts.iter().flat_map(FleetHost::attempts).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_and_two_receivers_serve_a_hundred_jobs_once_through_a_killed_host() {
    let server = match pg_server::shared() {
        Ok(server) => server,
        Err(why) => {
            skip::cannot_run("fleet::three_hosts", "postgres", &why);
            return;
        }
    };
    let db = server.database("fleet_three_hosts").unwrap();
    let url = db.url();
    let fleet = PgFleet::new(url.clone(), options()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_500,
        ..RunnerBehavior::default()
    });
    let r1 = fleet.start_receiver().await;
    let r2 = fleet.start_receiver().await;
    fleet.deliver_to(&[&r1, &r2]);
    let mut hosts: Vec<FleetHost> = ["h1", "h2", "h3"].iter().map(|n| fleet.host(n)).collect();
    for host in &mut hosts {
        host.start();
    }
    let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    wait_until(Duration::from_secs(60), "every host holds a lease", || {
        view(&url).is_some_and(|v| {
            names
                .iter()
                .all(|n| v.hosts.iter().any(|h| &h.host == n && h.live))
        })
    })
    .await;

    let started = Instant::now();
    let mut jobs = queue(&fleet, 25, 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    jobs.extend(queue(&fleet, 25, 2));

    // The host killed is one with claims on queued jobs: jobs the others must take over.
    let dead = hosts[2].name.clone();
    let mut dead_claims: Vec<i64> = Vec::new();
    wait_until(
        Duration::from_secs(60),
        "the third host claims queued jobs",
        || {
            dead_claims = view(&url)
                .and_then(|v| v.hosts.into_iter().find(|h| h.host == dead))
                .map(|h| {
                    h.claims
                        .into_iter()
                        .filter(|c| c.job_state == rm_vocab::JobState::Queued)
                        .map(|c| c.job_id.get())
                        .collect()
                })
                .unwrap_or_default();
            !dead_claims.is_empty()
        },
    )
    .await;
    // Another host's `explain` says whose the job is (or, if a runner took it meanwhile, that
    // it runs or ran): read from the fleet's journal, not from its own.
    let asked = dead_claims[0];
    let out = hosts[0]
        .setup
        .run(&["explain", &asked.to_string(), "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!(
        "{} explains job {asked}: {}",
        hosts[0].name, answer["summary"]
    );
    if answer["state"] == "queued" {
        assert_eq!(answer["reasons"][0]["code"], "claimed_by_host", "{answer}");
        let said = answer["reasons"][0]["message"].as_str().unwrap_or_default();
        assert!(said.contains(&format!("Host {dead} ")), "{answer}");
    } else {
        assert!(
            ["running", "done"].contains(&answer["verdict"].as_str().unwrap_or_default()),
            "{answer}"
        );
    }
    hosts[2].kill();
    let killed = Instant::now();
    let dead_runners_at_kill = hosts[2].runner_processes().len();
    eprintln!(
        "killed {dead} holding claims on queued jobs {dead_claims:?} ({dead_runners_at_kill} runner processes left running)"
    );
    jobs.extend(queue(&fleet, 25, 3));
    tokio::time::sleep(Duration::from_secs(3)).await;
    jobs.extend(queue(&fleet, 25, 4));

    // Its claims stop counting when its lease passes, and the others serve those jobs (its
    // own runners, left running, may take some before: GitHub gives a job to any runner).
    let dead_jobs: Vec<u64> = dead_claims.iter().map(|j| *j as u64).collect();
    wait_until(
        LEASE_TTL + Duration::from_secs(90),
        "the killed host's claimed jobs served",
        || {
            dead_jobs.iter().all(|j| {
                fleet
                    .fake
                    .job(*j)
                    .is_some_and(|j| j.status != JobStatus::Queued)
            })
        },
    )
    .await;
    let takeover = killed.elapsed();
    wait_until(
        LEASE_TTL + Duration::from_secs(30),
        "the killed host's lease passed",
        || {
            view(&url).is_some_and(|v| {
                v.hosts
                    .iter()
                    .any(|h| h.host == dead && !h.live && h.claims.is_empty())
            })
        },
    )
    .await;

    wait_until(Duration::from_secs(240), "all 100 jobs completed", || {
        all_completed(&fleet, &jobs)
    })
    .await;
    let served_in = started.elapsed();
    let dead_served_by: Vec<String> = dead_jobs
        .iter()
        .filter_map(|j| fleet.fake.job(*j).and_then(|j| j.runner_name))
        .collect();

    // The surviving hosts clean every attempt (surplus runners stop at their idle timeout).
    let survivors = &hosts[..2];
    wait_until(
        Duration::from_secs(120),
        "every attempt of the surviving hosts cleaned",
        || survivors.iter().all(FleetHost::all_cleaned),
    )
    .await;
    // The killed host, started again on its data directory, adopts what its runners left
    // (finished or idle) and cleans it: nothing of it stays registered or running.
    hosts[2].start();
    wait_until(
        Duration::from_secs(120),
        "the restarted host cleaned its attempts",
        || hosts[2].all_cleaned() && hosts[2].runner_processes().is_empty(),
    )
    .await;
    // Open finding (see the commit and docs/fleet.md): under this load some finished runners of
    // the surviving hosts are removed by GitHub at the end of their 32 s lag before their agent
    // deletes them. Not a leak (nothing stays registered), but not the agent's doing: counted
    // and printed, not asserted, until it is understood.
    let undeleted = no_registration_left(&fleet, &[&hosts[0], &hosts[1]]).await;

    let attempts = all_attempts(&hosts);
    check_served_once(&fleet, &jobs, &attempts);
    let surplus = check_surplus(&fleet, &jobs, &attempts);
    let names = jit_names(&fleet);
    let journalled: HashSet<String> = attempts.iter().map(|a| a.runner_name.clone()).collect();
    assert!(
        names.is_subset(&journalled),
        "every JIT registration is one host's attempt: not journalled {:?}",
        names.difference(&journalled).collect::<Vec<_>>()
    );
    // An attempt is journalled before its JIT request (intent before effect): the killed host
    // may have journalled some it never asked GitHub for. Only it, and those never registered.
    let dead_prefix = format!("rm-{dead}-");
    for unasked in attempts.iter().filter(|a| !names.contains(&a.runner_name)) {
        assert!(
            unasked.runner_name.starts_with(&dead_prefix)
                && unasked.runner_id.is_none()
                && unasked.state == AttemptState::Cleaned,
            "an attempt without a JIT request that is not the killed host's, never registered and cleaned: {unasked:?}"
        );
        eprintln!(
            "{}: journalled, never asked GitHub for (killed before): {:?} {:?}",
            unasked.runner_name, unasked.reason, unasked.detail
        );
    }
    let jits = names.len();
    let acknowledged = check_acknowledged_are_journalled(&fleet, &url);
    assert_eq!(journal_queued(&url), 0, "jobs left queued in the journal");
    for host in &hosts {
        assert!(
            host.runtimes().is_empty(),
            "{}: runtime left: {:?}",
            host.name,
            host.runtimes()
        );
    }
    let per_host: Vec<String> = hosts
        .iter()
        .map(|h| {
            let a = h.attempts();
            format!(
                "{}: {} runners, {} jobs",
                h.name,
                a.len(),
                a.iter().filter(|a| a.job_id.is_some()).count()
            )
        })
        .collect();
    eprintln!(
        "FLEET FIGURES (3 hosts x {} runners, 2 receivers, 100 jobs of 1.5 s in 4 bursts): all served in {:.1} s; \
         {jits} JIT registrations, surplus {surplus}; killed host's {} claimed queued jobs all taken {:.1} s after the kill \
         (lease {} s), by {dead_served_by:?}; {acknowledged} GUIDs answered 2xx, all journalled; {} finished runners of the surviving hosts removed by GitHub after their lag, not deleted by their agent ({undeleted:?}); {}",
        options().host_max,
        served_in.as_secs_f64(),
        dead_jobs.len(),
        takeover.as_secs_f64(),
        LEASE_TTL.as_secs(),
        undeleted.len(),
        per_host.join("; "),
    );
    // Surplus runners come from runners that took a job another host had claimed: the killed
    // host's runners left waiting (at most its ceiling) take jobs the others then start
    // runners for too, and at each burst's tail a host may start a runner for a claim whose
    // job another host's runner took in the same pass (at most one pass's launches per host,
    // its ceiling). Without claims each host would start a runner for every queued job it
    // sees: hundreds of registrations for 100 jobs.
    let bound = (1 + hosts.len()) * options().host_max as usize;
    assert!(
        surplus <= bound,
        "{surplus} surplus runners for 100 jobs (bound {bound})"
    );
}

/// When the fake answered each JIT registration whose runner name starts with `prefix`.
fn jit_times(fleet: &PgFleet, prefix: &str) -> Vec<SystemTime> {
    fleet
        .fake
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .filter(|r| {
            r.body
                .as_ref()
                .and_then(|b| b["name"].as_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|r| r.at)
        .collect()
}

/// The lease hand-over on its own: a host dies right after claiming jobs, before any runner for
/// them exists (`RM_FAULT_CRASH_AT=jobs_claimed`), so no runner of anyone's can take them. The
/// other host must leave them alone while the dead host's lease holds, and serve them once it
/// has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_holding_claims_hands_its_jobs_over_when_its_lease_passes() {
    let server = match pg_server::shared() {
        Ok(server) => server,
        Err(why) => {
            skip::cannot_run("fleet::a_host_killed_holding_claims", "postgres", &why);
            return;
        }
    };
    let db = server.database("fleet_lease_handover").unwrap();
    let url = db.url();
    let fleet = PgFleet::new(url.clone(), options()).await;
    let r1 = fleet.start_receiver().await;
    fleet.deliver_to(&[&r1]);
    let mut doomed = fleet.host("lease-doomed");
    let mut survivor = fleet.host("lease-survivor");
    // The jobs are in the journal before the doomed host starts, so its first claim takes all
    // three: no job is left for the survivor before the lease passes, and any runner it
    // registered then would be one too many.
    let jobs = queue(&fleet, 3, 1);
    wait_until(Duration::from_secs(60), "the 3 jobs journalled", || {
        journal_queued(&url) == 3
    })
    .await;
    doomed.start_with_env(&[("RM_FAULT_CRASH_AT", "jobs_claimed")]);
    let dead = doomed.name.clone();
    wait_until(
        Duration::from_secs(60),
        "the doomed host dies at its first claim",
        || doomed.exited(),
    )
    .await;
    let died = Instant::now();
    let dead_host = view(&url)
        .and_then(|v| v.hosts.into_iter().find(|h| h.host == dead))
        .expect("the dead host is in the fleet view");
    assert!(dead_host.live, "its lease outlives it");
    let dead_claims: HashSet<u64> = dead_host
        .claims
        .iter()
        .map(|c| c.job_id.get() as u64)
        .collect();
    assert_eq!(dead_claims.len(), 3, "it died holding {dead_claims:?}");
    assert!(
        dead_host.claims.iter().all(|c| c.runner_name.is_none()),
        "it named a runner for a claim before dying: {:?}",
        dead_host.claims
    );
    let lease_end =
        UNIX_EPOCH + Duration::from_millis(dead_host.expires_at_ms.get().try_into().unwrap());

    survivor.start();
    wait_until(
        LEASE_TTL + Duration::from_secs(90),
        "every job completed",
        || all_completed(&fleet, &jobs),
    )
    .await;
    let served_in = died.elapsed();

    // While the dead host's lease held, its claimed jobs waited: the survivor registered no
    // runner before the lease passed.
    let survivor_jits = jit_times(&fleet, &format!("rm-{}-", survivor.name));
    let early = survivor_jits.iter().filter(|at| **at < lease_end).count();
    assert_eq!(
        early, 0,
        "{early} runners registered before the dead host's lease passed"
    );
    assert!(
        jit_times(&fleet, &format!("rm-{}-", dead)).is_empty(),
        "the dead host registered a runner"
    );
    wait_until(Duration::from_secs(90), "every attempt cleaned", || {
        survivor.all_cleaned()
    })
    .await;
    let attempts = survivor.attempts();
    check_served_once(&fleet, &jobs, &attempts);
    for job in &dead_claims {
        let runner = fleet.fake.job(*job).and_then(|j| j.runner_name).unwrap();
        assert!(
            runner.starts_with(&format!("rm-{}-", survivor.name)),
            "the dead host's job {job} was run by {runner}"
        );
    }
    assert_eq!(journal_queued(&url), 0, "jobs left queued in the journal");
    let after_lease: Vec<f64> = survivor_jits
        .iter()
        .filter_map(|at| at.duration_since(lease_end).ok())
        .map(|d| d.as_secs_f64())
        .collect();
    eprintln!(
        "FLEET FIGURES (lease hand-over: a host died right after claiming {} of 3 queued jobs, no runner started): \
         all served {:.1} s after it died (lease {} s); the survivor's JIT registrations {:?} s after the lease passed, {early} before it",
        dead_claims.len(),
        served_in.as_secs_f64(),
        LEASE_TTL.as_secs(),
        after_lease,
    );
}

/// How long the database stays stopped: about a lease, so the hosts' leases pass while it is
/// away (their renewals fail) and they must take their lease again when it returns.
const OUTAGE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_stopped_mid_burst_loses_no_acknowledged_delivery_and_serves_every_job_once() {
    // A server of its own: the shared one serves every other test of this binary.
    let mut server = match pg_server::StoppableServer::start("outage") {
        Ok(server) => server,
        Err(why) => {
            skip::cannot_run("fleet::the_database_stopped", "postgres", &why);
            return;
        }
    };
    let url = server.url();
    let fleet = PgFleet::new(url.clone(), options()).await;
    let mut r1 = fleet.start_receiver().await;
    let mut r2 = fleet.start_receiver().await;
    fleet.deliver_to(&[&r1, &r2]);
    let mut hosts: Vec<FleetHost> = ["o1", "o2"].iter().map(|n| fleet.host(n)).collect();
    for host in &mut hosts {
        host.start();
    }

    // Runners registering now run their job for longer than the outage: they are running when
    // the database stops and must finish their jobs undisturbed.
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 45_000,
        ..RunnerBehavior::default()
    });
    let long = queue(&fleet, 3, 1);
    wait_until(Duration::from_secs(90), "the long jobs running", || {
        long.iter().all(|j| {
            fleet
                .fake
                .job(*j)
                .is_some_and(|j| j.status == JobStatus::InProgress)
        })
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_000,
        ..RunnerBehavior::default()
    });

    // A burst, with the database stopped in its middle.
    let mut jobs = long.clone();
    jobs.extend(queue(&fleet, 7, 2));
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.stop().unwrap();
    let stopped = Instant::now();
    jobs.extend(queue(&fleet, 8, 2));
    let remaining = OUTAGE.saturating_sub(stopped.elapsed());
    tokio::time::sleep(remaining).await;
    let during: Vec<_> = fleet.fake.deliveries();
    server.resume().unwrap();
    let outage = stopped.elapsed();
    // Nothing was answered 2xx while the database was away (the receivers say 503): the
    // deliveries GitHub sent then failed.
    fleet.fake.settle().await.unwrap();

    // GitHub does not redeliver failed deliveries by itself: the operator redelivers them from
    // the App's settings (docs/fleet.md), once the receivers answer again. Each GUID that never
    // got a 2xx, once.
    for r in [&mut r1, &mut r2] {
        r.agent.wait_healthy().await;
    }
    let deliveries = fleet.fake.deliveries();
    let acknowledged: HashSet<&str> = deliveries
        .iter()
        .filter(|d| (200..300).contains(&d.status_code))
        .map(|d| d.guid.as_str())
        .collect();
    let mut failed: HashMap<&str, u64> = HashMap::new();
    for d in &deliveries {
        if !acknowledged.contains(d.guid.as_str()) {
            failed.insert(d.guid.as_str(), d.id);
        }
    }
    let refused = during.iter().filter(|d| d.status_code == 503).count();
    assert!(
        refused > 0,
        "no delivery was refused while the database was stopped"
    );
    for id in failed.values() {
        fleet.fake.redeliver(*id).unwrap();
    }
    let redelivered = failed.len();
    fleet.fake.settle().await.unwrap();

    // The rest of the burst, with the database back.
    jobs.extend(queue(&fleet, 12, 3));
    wait_until(Duration::from_secs(180), "all 30 jobs completed", || {
        all_completed(&fleet, &jobs)
    })
    .await;
    let resumed_in = stopped.elapsed();
    wait_until(Duration::from_secs(120), "every attempt cleaned", || {
        hosts.iter().all(FleetHost::all_cleaned)
    })
    .await;
    let undeleted = no_registration_left(&fleet, &[&hosts[0], &hosts[1]]).await;
    assert!(
        undeleted.is_empty(),
        "runners never deleted by their agent (GitHub removed them after their lag): {undeleted:?}"
    );

    let attempts = all_attempts(&hosts);
    check_served_once(&fleet, &jobs, &attempts);
    // The long jobs ran across the outage on the runners that had them: one runner each,
    // completed with success (check_served_once), and their attempts say they completed.
    for job in &long {
        let a = attempts
            .iter()
            .find(|a| a.job_id == Some(rm_vocab::JobId::try_from(*job).unwrap()))
            .expect("the long job's attempt");
        assert_eq!(a.outcome, Some(AttemptOutcome::CompletedJob));
    }
    let surplus = check_surplus(&fleet, &jobs, &attempts);
    let names = jit_names(&fleet);
    let journalled: HashSet<String> = attempts.iter().map(|a| a.runner_name.clone()).collect();
    assert_eq!(
        names, journalled,
        "every JIT registration is one host's attempt"
    );
    let jits = names.len();
    let acknowledged = check_acknowledged_are_journalled(&fleet, &url);
    assert_eq!(journal_queued(&url), 0, "jobs left queued in the journal");
    eprintln!(
        "FLEET FIGURES (database stopped {:.1} s mid-burst; 2 hosts x {} runners, 2 receivers, 30 jobs): \
         {refused} deliveries answered 503 during the outage, {redelivered} GUIDs redelivered after; \
         all served {:.1} s after the stop; {jits} JIT registrations, surplus {surplus}; {acknowledged} GUIDs answered 2xx, all journalled",
        outage.as_secs_f64(),
        options().host_max,
        resumed_in.as_secs_f64(),
    );
    let bound = (1 + hosts.len()) * options().host_max as usize;
    assert!(
        surplus <= bound,
        "{surplus} surplus runners (bound {bound})"
    );
}
