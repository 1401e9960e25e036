//! The fitness gate through `rm-agent run` (CONTRACT §8 `host_unfit`): the runner root on a
//! small filesystem (a tmpfs the test mounts) that the test fills. While it is full, a queued
//! job gets no JIT registration at the fake GitHub and `status --json` says the host is unfit
//! (`disk_space`); once the test frees the space the same agent, not restarted, serves the job.

use std::time::Duration;

use rm_e2e::disk::{Tmpfs, fill};
use rm_e2e::fleet::{Fleet, FleetOptions, REPO, wait_until};
use rm_journal::Reader;
use serde_json::Value;

const LABELS: &[&str] = &["self-hosted", "linux"];

/// The tmpfs under the runner root: room for the package store (the fake runner, about 11 MiB
/// in a debug build) and for the gate's threshold beside it.
const TMPFS_SIZE: &str = "64m";

/// `host.min_free_space` for the test: well below what the tmpfs has free after the package
/// store, well above what a filled one has.
const MIN_FREE: &str = "16MiB";

fn status(fleet: &Fleet) -> Value {
    rm_e2e::json_stdout(&fleet.setup.run(&["status", "--json"]))
}

fn has_problem(status: &Value, code: &str) -> bool {
    status["host"]["problems"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["code"] == code))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_runner_root_registers_no_runner_until_space_is_freed() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    let _tmpfs = Tmpfs::mount(&fleet.runner_root, TMPFS_SIZE);
    let config = std::fs::read_to_string(fleet.setup.config()).unwrap();
    assert!(config.contains("min_free_space = \"64MiB\"\n"), "{config}");
    std::fs::write(
        fleet.setup.config(),
        config.replacen(
            "min_free_space = \"64MiB\"\n",
            &format!("min_free_space = \"{MIN_FREE}\"\n"),
            1,
        ),
    )
    .unwrap();
    let mut agent = fleet.start_agent(&[]).await;
    wait_until(
        Duration::from_secs(60),
        "status says the host is fit",
        || status(&fleet)["host"]["fit"] == true,
    )
    .await;

    let filler = fill(&fleet.runner_root);
    wait_until(
        Duration::from_secs(90),
        "status says the host is unfit for disk space",
        || {
            let s = status(&fleet);
            s["host"]["fit"] == false && has_problem(&s, "disk_space")
        },
    )
    .await;
    let human = String::from_utf8_lossy(&fleet.setup.run(&["status"]).stdout).into_owned();
    assert!(human.contains("UNFIT (disk_space"), "{human}");
    let metrics = agent.get("/metrics").await.unwrap().1;
    assert!(metrics.lines().any(|l| l == "rm_host_fit 0"), "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "rm_host_fitness_problem{code=\"disk_space\"} 1"),
        "{metrics}"
    );

    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();
    let job_id = i64::try_from(job).unwrap();
    wait_until(
        Duration::from_secs(60),
        "the job journalled as queued",
        || {
            Reader::open(&fleet.setup.journal())
                .and_then(|r| r.job(rm_vocab::JobId::new(job_id)))
                .ok()
                .flatten()
                .is_some_and(|j| j.state == rm_vocab::JobState::Queued)
        },
    )
    .await;
    // Allocation passes ran meanwhile (the delivery woke the executor; it passes every 2 s):
    // two of the gate's checks after the job arrived are the positive event waited for.
    let journalled_at = rm_vocab::now().get();
    wait_until(
        Duration::from_secs(90),
        "two fitness checks after the job arrived",
        || {
            let s = status(&fleet);
            let checked = s["host"]["checked_at"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap());
            checked > journalled_at + 6_000
        },
    )
    .await;
    assert_eq!(
        fleet.jit_requests(),
        0,
        "an unfit host asked GitHub for a JIT registration"
    );
    assert!(fleet.attempts().is_empty(), "{:?}", fleet.attempts());
    let s = status(&fleet);
    assert!(has_problem(&s, "disk_space"), "{s}");
    // `explain` names the gate as the reason the job waits (CONTRACT §8 `host_unfit`).
    let out = fleet.setup.run(&["explain", &job.to_string(), "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(doc["verdict"], "host_unfit", "{doc}");
    assert!(
        doc["summary"].as_str().unwrap().contains("disk_space")
            && doc["reasons"][0]["message"]
                .as_str()
                .unwrap()
                .contains("host.min_free_space"),
        "{doc}"
    );

    std::fs::remove_file(&filler).unwrap();
    wait_until(
        Duration::from_secs(120),
        "the job served after the space was freed",
        || fleet.completed(job),
    )
    .await;
    assert!(!agent.exited(), "the agent was not to stop");
    let logs = fleet.setup.logs();
    assert!(
        logs.contains("host unfit: no new runner is registered"),
        "the transition to unfit is logged"
    );
    assert!(
        logs.contains("host fit again"),
        "the transition back is logged"
    );
    assert_eq!(fleet.jit_requests(), 1, "one registration, for the job");
    wait_until(
        Duration::from_secs(60),
        "status says the host is fit",
        || status(&fleet)["host"]["fit"] == true,
    )
    .await;
    wait_until(Duration::from_secs(60), "every attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;
}
