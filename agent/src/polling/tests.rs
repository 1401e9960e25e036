//! The poller against the fake GitHub: polled demand in the journal, the budget and limits
//! honoured to the request, the outage back-off, stale jobs. Time is a manual clock moved with
//! the fake's, so hours pass in milliseconds. Delivery recovery and webhook health are in
//! `tests/recovery.rs`.

mod budget;
mod fleet;
mod recovery;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions, FaultAction};
use rm_github::{ClientConfig, GithubClient, Target};
use rm_journal::{JOURNAL_FILE, Journal, PollJournal, Reader, Retention};
use rm_vocab::JobId;
use rm_vocab::ManualClock;

use super::schedule::Pace;
use super::status::PassReport;
use super::*;

const APP_ID: u64 = 4711;

fn key() -> &'static AppKeyPair {
    static KEY: OnceLock<AppKeyPair> = OnceLock::new();
    KEY.get_or_init(|| AppKeyPair::generate().unwrap())
}

struct Harness {
    fake: FakeGithub,
    client: GithubClient,
    clock: ManualClock,
    journal: Journal,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn new() -> Harness {
        let fake = FakeGithub::start(FakeOptions::new(APP_ID, key().public_pem.clone()))
            .await
            .unwrap();
        fake.add_org("acme");
        fake.add_repo("acme/widgets");
        fake.add_repo("acme/gadgets");
        let clock = ManualClock::new();
        let config = ClientConfig::new(fake.api_url(), APP_ID, key().private_pem.clone());
        let client = GithubClient::with_clock(config, Arc::new(clock.clone())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let journal = Journal::open(&path, Retention::default()).unwrap();
        Harness {
            fake,
            client,
            clock,
            journal,
            path,
            _dir: dir,
        }
    }

    fn poller(&self, targets: &[&str], intake: bool) -> Poller {
        let config = PollerConfig {
            targets: targets.iter().map(|t| t.parse().unwrap()).collect(),
            interval: Duration::from_secs(60),
            idle_interval: Duration::from_secs(10),
            intake,
        };
        let journal = Box::new(PollJournal::open(&self.path).unwrap());
        Poller::new(
            config,
            self.client.clone(),
            journal,
            Arc::new(self.clock.clone()),
        )
        .unwrap()
        .with_jitter(Box::new(|| 0.0))
    }

    /// Moves the poller's, the client's and the fake's clocks together.
    fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.fake.advance_clock(by);
    }

    /// Requests the fake has answered (or faulted) so far.
    fn requests(&self) -> usize {
        self.fake.requests().len()
    }

    fn requests_to(&self, part: &str) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.path.contains(part))
            .count()
    }

    fn job(&self, id: u64) -> rm_journal::JobRow {
        Reader::open(&self.path)
            .unwrap()
            .job(JobId::try_from(id).unwrap())
            .unwrap()
            .unwrap()
    }

    fn queue(&self, repo: &str) -> u64 {
        self.fake
            .queue_job(repo, "build", &["self-hosted"])
            .unwrap()
    }
}

/// Steps the poller at each wake strictly before `until` (manual time); returns the steps and
/// the time that passed.
async fn step_through(h: &Harness, poller: &mut Poller, until: Duration) -> (usize, Duration) {
    let mut elapsed = Duration::ZERO;
    let mut steps = 0;
    loop {
        let wake = poller.next_wake().await;
        if elapsed + wake >= until {
            return (steps, elapsed);
        }
        h.advance(wake);
        elapsed += wake;
        poller.poll_once().await.unwrap();
        steps += 1;
    }
}

fn next_poll_secs(poller: &Poller, h: &Harness) -> u64 {
    use rm_vocab::Clock as _;
    poller
        .status()
        .borrow()
        .next_poll_in_ms(h.clock.now().to_system_time())
        / 1000
}

#[tokio::test]
async fn jobs_queued_with_no_receiver_are_journalled_by_polling_with_source_poll() {
    let h = Harness::new().await;
    let jobs = [
        h.queue("acme/widgets"),
        h.queue("acme/widgets"),
        h.queue("acme/gadgets"),
    ];
    // The organization and one of its repositories: each repository is still listed once.
    let mut poller = h.poller(&["acme", "acme/widgets"], false);
    let report = poller.poll_once().await.unwrap();
    assert!(report.polled_demand);
    assert_eq!((report.targets_read, report.jobs_changed), (2, 3));
    for id in jobs {
        let row = h.job(id);
        assert_eq!(
            (row.state.as_str(), row.source.as_str()),
            ("queued", "poll")
        );
        assert!(row.installation_id.is_some());
    }
    assert_eq!(h.requests_to("/installation/repositories"), 1);
    assert_eq!(
        h.requests_to("/actions/runs"),
        2 * 2 + 3,
        "2 statuses × 2 repos + 3 runs"
    );
    let status = poller.status().borrow().clone();
    assert_eq!(
        (status.webhooks.trusted, status.webhooks.reason),
        (false, "no_intake")
    );
    assert_eq!(status.pace, Pace::Nominal, "queued runs: not idle");
    assert_eq!(next_poll_secs(&poller, &h), 60);
    assert_eq!(*poller.changes().borrow(), 1);

    // Nothing changed: the next pass is all `304`s, which cost no quota.
    h.fake.clear_requests();
    h.advance(Duration::from_secs(60));
    let again = poller.poll_once().await.unwrap();
    assert_eq!(again.jobs_changed, 0);
    let statuses: Vec<u16> = h.fake.requests().iter().map(|r| r.status).collect();
    assert!(statuses.iter().all(|s| *s == 304), "{statuses:?}");
    let counts = poller.status().borrow().requests_last_hour;
    assert!(counts.uncharged >= 4 && counts.charged >= 7, "{counts:?}");
}

#[tokio::test]
async fn a_quiet_organization_is_polled_at_the_idle_interval() {
    let h = Harness::new().await;
    let mut poller = h.poller(&["acme"], false);
    poller.poll_once().await.unwrap();
    assert_eq!(poller.status().borrow().pace, Pace::Idle);
    assert_eq!(next_poll_secs(&poller, &h), 10);
    // A job queued meanwhile is journalled within the idle interval.
    let job = h.queue("acme/gadgets");
    h.advance(Duration::from_secs(10));
    poller.poll_once().await.unwrap();
    assert_eq!(h.job(job).source, "poll");
}

#[tokio::test]
async fn with_the_budget_exhausted_not_one_request_leaves_until_the_reset() {
    let h = Harness::new().await;
    h.queue("acme/widgets");
    let mut poller = h.poller(&["acme"], false);
    poller.poll_once().await.unwrap();
    h.advance(Duration::from_secs(60));
    h.fake.exhaust_rate_limit(Duration::from_secs(600));
    let limited = poller.poll_once().await.unwrap();
    assert_eq!(limited.failure, Some("rate_limited"));
    assert_eq!(poller.status().borrow().pace, Pace::RateLimitedPrimary);
    let secs = next_poll_secs(&poller, &h);
    assert!((595..=600).contains(&secs), "{secs}");

    let sent = h.requests();
    let wait = Duration::from_secs(secs);
    let (steps, elapsed) = step_through(&h, &mut poller, wait).await;
    assert!(steps >= 10, "the loop kept waking ({steps})");
    assert_eq!(h.requests(), sent, "a request left before the reset");

    h.advance(wait - elapsed + Duration::from_secs(2));
    let after = poller.poll_once().await.unwrap();
    assert_eq!(after.failure, None);
    assert!(h.requests() > sent);
    assert_eq!(poller.status().borrow().pace, Pace::Nominal);
}

#[tokio::test]
async fn a_secondary_limits_retry_after_is_honoured() {
    let h = Harness::new().await;
    let mut poller = h.poller(&["acme"], false);
    poller.poll_once().await.unwrap();
    h.advance(Duration::from_secs(10));
    h.fake.secondary_limit(Duration::from_secs(300), 429, true);
    poller.poll_once().await.unwrap();
    assert_eq!(poller.status().borrow().pace, Pace::RateLimitedSecondary);
    // retry-after (about 300 s) is the floor of the wait, not added to the interval.
    let secs = next_poll_secs(&poller, &h);
    assert!((299..=301).contains(&secs), "{secs}");
    let sent = h.requests();
    let wait = Duration::from_secs(secs);
    let (_, elapsed) = step_through(&h, &mut poller, wait).await;
    assert_eq!(h.requests(), sent);
    h.advance(wait - elapsed + Duration::from_secs(2));
    let after = poller.poll_once().await.unwrap();
    assert_eq!(after.failure, None);
    assert_eq!(poller.status().borrow().pace, Pace::Idle);
}

#[tokio::test]
async fn an_outage_backs_off_as_specified_and_recovery_resumes_the_normal_pace() {
    let h = Harness::new().await;
    let mut poller = h.poller(&["acme"], false);
    poller.poll_once().await.unwrap();
    h.fake.inject_fault(None, "/", FaultAction::Drop, 10_000);
    let mut waits = Vec::new();
    for _ in 0..6 {
        let wake = poller
            .status()
            .borrow()
            .next_poll_in_ms(rm_vocab::Clock::now(&h.clock).to_system_time());
        h.advance(Duration::from_millis(wake));
        let report = poller.poll_once().await.unwrap();
        assert_eq!(report.failure, Some("offline"));
        waits.push(next_poll_secs(&poller, &h));
    }
    assert_eq!(waits, [60, 120, 240, 480, 900, 900]);
    let status = poller.status().borrow().clone();
    assert_eq!(status.pace, Pace::Offline);
    let offline = status.offline.unwrap();
    assert_eq!(offline.consecutive, 6);
    assert!(!offline.has_outlasted_the_queue());
    // Nothing is sent between the scheduled tries.
    let sent = h.requests();
    let (_, elapsed) = step_through(&h, &mut poller, Duration::from_secs(899)).await;
    assert_eq!(h.requests(), sent);

    h.fake.clear_faults();
    h.advance(Duration::from_secs(901) - elapsed);
    let back = poller.poll_once().await.unwrap();
    assert_eq!(back.failure, None);
    let status = poller.status().borrow().clone();
    assert_eq!((status.pace, status.offline), (Pace::Idle, None));
    assert_eq!(next_poll_secs(&poller, &h), 10);
}

#[tokio::test]
async fn jobs_the_fake_cancelled_stop_being_queued_once_their_runs_vanish() {
    let h = Harness::new().await;
    let jobs: Vec<u64> = (0..7).map(|_| h.queue("acme/widgets")).collect();
    let mut poller = h.poller(&["acme/widgets"], false);
    poller.poll_once().await.unwrap();
    for id in &jobs {
        assert!(h.fake.complete_job(*id, "cancelled"));
    }
    // The next demand poll no longer lists their runs: each job is asked about at once, not
    // after the stale bound.
    let wake = poller
        .status()
        .borrow()
        .next_poll_in_ms(rm_vocab::Clock::now(&h.clock).to_system_time());
    h.advance(Duration::from_millis(wake));
    let first = poller.poll_once().await.unwrap();
    assert_eq!((first.stale_checked, first.stale_resolved), (7, 7));
    h.advance(stale::STALE_AFTER + Duration::from_secs(1));
    let second = poller.poll_once().await.unwrap();
    assert_eq!((second.stale_checked, second.stale_resolved), (0, 0));
    for id in jobs {
        let row = h.job(id);
        assert_eq!(
            (row.state.as_str(), row.conclusion.as_deref()),
            ("completed", Some("cancelled"))
        );
    }
    assert_eq!(h.requests_to("/actions/jobs/"), 7, "each asked about once");
}

#[tokio::test]
async fn an_organizations_repositories_are_listed_again_when_old_or_changed() {
    let h = Harness::new().await;
    let mut poller = h.poller(&["acme"], false);
    poller.poll_once().await.unwrap();
    h.advance(Duration::from_secs(60));
    poller.poll_once().await.unwrap();
    assert_eq!(h.requests_to("/installation/repositories"), 1, "cached");

    // An `installation` delivery changes the journal's scope of acme: listed again.
    let body = serde_json::json!({
        "action": "created",
        "installation": {"id": 99, "account": {"login": "acme", "type": "Organization"}},
        "repositories": [{"id": 5, "full_name": "acme/new"}],
    });
    h.journal
        .record(rm_journal::Incoming {
            guid: "install-1".into(),
            event: "installation".into(),
            headers: Vec::new(),
            body: serde_json::to_vec(&body).unwrap(),
            received_at_ms: rm_vocab::now(),
            source: rm_vocab::Source::Webhook,
        })
        .await
        .unwrap();
    h.advance(Duration::from_secs(60));
    poller.poll_once().await.unwrap();
    assert_eq!(h.requests_to("/installation/repositories"), 2);
    // And after 30 active intervals.
    h.advance(Duration::from_secs(30 * 60));
    poller.poll_once().await.unwrap();
    assert_eq!(h.requests_to("/installation/repositories"), 3);
}

#[test]
fn targets_shared_by_policies_are_polled_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rm-agent.toml");
    let policy = |name: &str, target: &str| {
        format!(
            "[[policy]]\nname = \"{name}\"\ntarget = \"{target}\"\nlabels = [\"self-hosted\"]\n"
        )
    };
    let text = [
        policy("a", "acme"),
        policy("b", "ACME"),
        policy("c", "acme/widgets"),
    ]
    .concat();
    std::fs::write(&file, text).unwrap();
    let config = crate::config::load(&crate::config::Sources {
        explicit_file: Some(file),
        data_dir: Some(dir.path().to_owned()),
    })
    .unwrap();
    let poller = PollerConfig::from_config(&config);
    assert_eq!(
        poller.targets,
        vec![
            Target::Org("acme".into()),
            Target::Repo {
                owner: "acme".into(),
                repo: "widgets".into()
            }
        ]
    );
    assert!(!poller.intake);
    assert_eq!(poller.interval, Duration::from_secs(60));
}

#[test]
fn a_scale_set_s_policy_is_not_polled() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rm-agent.toml");
    let text = "[[policy]]\nname = \"hooks\"\ntarget = \"acme/widgets\"\nlabels = [\"self-hosted\"]\n\
                [[policy]]\nname = \"big\"\ntarget = \"acme\"\nlabels = [\"big\"]\n\
                [[scale_set]]\nname = \"acme-big\"\npolicy = \"big\"\n";
    std::fs::write(&file, text).unwrap();
    let config = crate::config::load(&crate::config::Sources {
        explicit_file: Some(file),
        data_dir: Some(dir.path().to_owned()),
    })
    .unwrap();
    assert_eq!(
        PollerConfig::from_config(&config).targets,
        vec![Target::Repo {
            owner: "acme".into(),
            repo: "widgets".into()
        }]
    );
}

#[test]
fn the_loop_can_be_spawned() {
    fn spawnable<T: Send + 'static>(_: T) {}
    // Type-checked, never called: `run` must be a future `tokio::spawn` takes.
    let _ = |poller: Poller| spawnable(poller.run(std::future::pending::<()>()));
}

#[tokio::test]
async fn an_unreadable_target_is_named_and_retried_at_the_active_interval() {
    let h = Harness::new().await;
    let readable = h.queue("acme/widgets");
    h.queue("acme/gadgets");
    // GitHub answers one repository's run listing with something rm cannot use (a 422 here;
    // an answer without its list is the same class): the other target is still read.
    h.fake.inject_fault(
        None,
        "/repos/acme/gadgets/actions/runs",
        FaultAction::Status(422),
        1,
    );
    let mut poller = h.poller(&["acme/widgets", "acme/gadgets"], false);
    let report = poller.poll_once().await.unwrap();
    assert_eq!(report.targets_read, 1);
    assert_eq!(h.job(readable).source, "poll");
    let status = poller.status().borrow().clone();
    let named: Vec<&str> = status
        .unreadable_targets
        .iter()
        .map(|t| t.target.as_str())
        .collect();
    assert_eq!(named, ["acme/gadgets"]);
    assert!(!status.unreadable_targets[0].reason.is_empty());
    assert_eq!(
        next_poll_secs(&poller, &h),
        60,
        "retried at the active interval"
    );

    // Readable again at the next poll: no longer named.
    h.advance(Duration::from_secs(60));
    poller.poll_once().await.unwrap();
    assert!(poller.status().borrow().unreadable_targets.is_empty());
}

/// Every event of a poll step carries the step's number from its span, so an operator can tell
/// which lines belong to one pass (the target warning names only its target).
#[tokio::test]
async fn every_event_of_a_poll_step_carries_the_steps_number() {
    let capture = crate::test_log_capture::LogCapture::start(tracing::Level::INFO);
    let h = Harness::new().await;
    h.queue("acme/gadgets");
    h.fake.inject_fault(
        None,
        "/repos/acme/gadgets/actions/runs",
        FaultAction::Status(422),
        2,
    );
    let mut poller = h.poller(&["acme/gadgets"], false);
    poller.poll_once().await.unwrap();
    h.advance(Duration::from_secs(60));
    poller.poll_once().await.unwrap();
    let log = capture.text();
    for pass in [1, 2] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("poll_pass{{pass={pass}}}"))
                    && l.contains("target unreadable")),
            "pass {pass}: {log}"
        );
    }
}
