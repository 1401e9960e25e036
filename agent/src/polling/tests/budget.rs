//! The polling budget benchmark (issue 5; docs/performance.md): charged and uncharged REST
//! requests in one simulated hour against the fake GitHub, for an idle organization of 20
//! repositories and for a steady load of jobs, with healthy webhooks (the fake's deliveries go to
//! the real receiver, journalling into the poller's journal) and with polling alone. Manual time:
//! the hour passes in seconds. Ignored in the suite (it prints figures, asserts none); run it
//! with
//!
//! ```sh
//! cargo test -p rm-agent --release --lib polling_budget -- --ignored --nocapture
//! ```

use std::time::Duration;

use super::recovery::receive;
use super::*;

const HOUR: Duration = Duration::from_secs(3600);
const REPOSITORIES: usize = 20;

/// What one simulated hour cost.
#[derive(Debug, Default)]
struct Cost {
    charged: usize,
    uncharged: usize,
    jobs: usize,
}

/// Runs one hour: `jobs_every` queues a job (round robin over the repositories) that a runner
/// "serves" by completing it a minute later.
async fn hour(webhooks: bool, jobs_every: Option<Duration>) -> Cost {
    let h = Harness::new().await;
    for n in 3..=REPOSITORIES {
        h.fake.add_repo(&format!("acme/repo-{n:02}"));
    }
    let repos: Vec<String> = ["acme/widgets".to_owned(), "acme/gadgets".to_owned()]
        .into_iter()
        .chain((3..=REPOSITORIES).map(|n| format!("acme/repo-{n:02}")))
        .collect();
    if webhooks {
        receive(&h).await;
    }
    let mut poller = h.poller(&["acme"], webhooks);
    let before = h.fake.requests().len();
    let serve_after = Duration::from_secs(60);
    let mut elapsed = Duration::ZERO;
    let mut next_job = jobs_every.unwrap_or(HOUR * 2);
    let mut to_complete: Vec<(Duration, u64)> = Vec::new();
    let mut jobs = 0;
    poller.poll_once().await.unwrap();
    while elapsed < HOUR {
        let next_completion = to_complete.first().map_or(HOUR * 2, |(at, _)| *at);
        let wake = elapsed + poller.next_wake().await;
        let at = wake.min(next_job).min(next_completion).min(HOUR);
        h.advance(at - elapsed);
        elapsed = at;
        if elapsed >= HOUR {
            break;
        }
        if elapsed == next_job {
            let repo = &repos[jobs % repos.len()];
            let id = h.fake.queue_job(repo, "build", &["self-hosted"]).unwrap();
            to_complete.push((elapsed + serve_after, id));
            jobs += 1;
            next_job += jobs_every.unwrap_or(HOUR * 2);
        }
        while to_complete.first().is_some_and(|(due, _)| *due <= elapsed) {
            let (_, id) = to_complete.remove(0);
            h.fake.complete_job(id, "success");
        }
        if webhooks {
            h.fake.settle().await.unwrap();
        }
        if elapsed == wake {
            poller.poll_once().await.unwrap();
        }
    }
    let requests = h.fake.requests();
    let hour_requests = &requests[before..];
    let uncharged = hour_requests.iter().filter(|r| r.status == 304).count();
    Cost {
        charged: hour_requests.len() - uncharged,
        uncharged,
        jobs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints figures; run with --ignored --nocapture"]
async fn polling_budget() {
    println!(
        "\none simulated hour, organization of {REPOSITORIES} repositories, [polling] interval 60s idle_interval 10s"
    );
    println!("scenario                 mode             charged  uncharged  jobs  charged/job");
    for (scenario, every) in [
        ("idle organization", None),
        ("a job every 2 minutes", Some(Duration::from_secs(120))),
    ] {
        for (mode, webhooks) in [("healthy webhooks", true), ("polling alone", false)] {
            let cost = hour(webhooks, every).await;
            let per_job = if cost.jobs == 0 {
                "-".to_owned()
            } else {
                format!("{:.1}", cost.charged as f64 / cost.jobs as f64)
            };
            println!(
                "{scenario:<24} {mode:<16} {:>7}  {:>9}  {:>4}  {per_job:>11}",
                cost.charged, cost.uncharged, cost.jobs
            );
        }
    }
}
