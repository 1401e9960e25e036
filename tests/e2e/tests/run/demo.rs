//! `rm-agent demo` through the real binary: it plays its whole scenario against the embedded
//! simulated GitHub, prints the timeline and the summary, exits 0, and leaves nothing behind in
//! the temporary directory it was given.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::Command;
use std::time::{Duration, Instant};

use rm_e2e::agent_with;

/// Above the demo's own hang guard (it fails by itself after 120 s of scenario,
/// `SCENARIO_DEADLINE`): only a hang trips this. Neither is a speed check; the outcome is.
const HANG_GUARD: Duration = Duration::from_secs(180);

#[test]
fn demo_plays_every_scenario_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = rm_e2e::ends_with_its_test(&mut Command::new(agent_with("demo")))
        .arg("demo")
        .current_dir(cwd.path())
        .env("TMPDIR", tmp.path())
        .env_remove("RM_CONFIG")
        .env_remove("RM_DATA_DIR")
        .env_remove("RM_WEBHOOK_SECRET")
        .env_remove("RM_GITHUB_PRIVATE_KEY")
        .env_remove("RM_LOG")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo failed ({:?}) after {elapsed:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(elapsed < HANG_GUARD, "the demo took {elapsed:?}");

    // The summary: seven jobs by seven runners, one idle runner not replaced, nothing left.
    for line in [
        "jobs served       7 of 7, each by exactly one runner",
        "runners started   8 (7 ran a job, 1 exited idle)",
        "idle exits        1, replaced: 0",
        "2 lost, 2 job(s) recovered",
        "left behind       nothing (runner root empty, no registration at GitHub)",
        "time taken",
        "demo: every scenario ended as expected.",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    // Both lost webhooks (one before the agent started, one while it ran) were recovered, by
    // the start-up poll or by GitHub's redelivery, whichever came first.
    assert_eq!(
        stdout.matches("the lost webhook is recovered").count(),
        2,
        "{stdout}"
    );
    let api = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("API requests"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        api.is_some_and(|n| n > 0),
        "no API request count:\n{stdout}"
    );

    // The timeline shows each part of the scenario.
    for event in [
        "its webhook is lost",
        "webhook workflow_job.queued for job",
        "allocated for policy gpu",
        "got no job within runner.idle_timeout",
        "concluded: idle_exit",
        "concluded: completed_job",
        "cleaned: deregistered, runtime removed",
        "completed: success",
    ] {
        assert!(
            stdout.contains(event),
            "no {event:?} in the timeline:\n{stdout}"
        );
    }

    // The demo's temporary directory (under $TMPDIR) is gone.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}
