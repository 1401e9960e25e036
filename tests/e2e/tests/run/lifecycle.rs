//! `rm-agent run` end to end, through the real binary, the fake GitHub and the fake runner
//! package: a queued webhook becomes one JIT runner that takes its job and leaves nothing
//! behind (secrets are searched for in everything the run left behind); a drain leaves a busy
//! runner running for the next start to adopt; a persistent slot keeps its checkout. The
//! lifecycle rules themselves (the host ceiling, two policies sharing it, the idle and
//! registration timeouts and their fences, the launch back-off, recovery decisions) are tested
//! in milliseconds by the executor harness (`agent/src/executor/harness/`).

use std::path::Path;
use std::time::Duration;

use rm_e2e::SECRET;
use rm_e2e::fleet::{Fleet, FleetOptions, HOST, PolicySpec, REPO, wait_until};
use rm_fake_github::RunnerBehavior;
use rm_journal::{AttemptOutcome, AttemptState};
use secrecy::ExposeSecret as _;

const LABELS: &[&str] = &["self-hosted", "linux"];

/// A process working inside `root`: its command line and environment.
struct Seen {
    argv: Vec<String>,
    env: Vec<String>,
}

fn processes_under(root: &Path) -> Vec<Seen> {
    let Ok(root) = root.canonicalize() else {
        return Vec::new();
    };
    let mut seen = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let proc_dir = entry.path();
        let Ok(cwd) = std::fs::read_link(proc_dir.join("cwd")) else {
            continue;
        };
        if !cwd.starts_with(&root) {
            continue;
        }
        let split = |file: &str| -> Vec<String> {
            std::fs::read(proc_dir.join(file))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        };
        seen.push(Seen {
            argv: split("cmdline"),
            env: split("environ"),
        });
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_webhook_becomes_one_runner_that_takes_its_job_and_leaves_nothing() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 2_000,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "build", LABELS).unwrap();

    // While the job runs: the runner's argv is exactly `run`, the JIT is in its environment,
    // and none of the agent's variables reached it.
    let mut runner: Option<Seen> = None;
    wait_until(Duration::from_secs(30), "the runner process", || {
        runner = processes_under(&fleet.runner_root).into_iter().find(|p| {
            p.argv
                .first()
                .is_some_and(|a| a.ends_with("bin/Runner.Listener"))
        });
        runner.is_some()
    })
    .await;
    let runner = runner.unwrap();
    assert_eq!(
        runner.argv[1..],
        ["run".to_owned()],
        "argv: {:?}",
        runner.argv
    );
    let jit = runner
        .env
        .iter()
        .find_map(|v| v.strip_prefix("ACTIONS_RUNNER_INPUT_JITCONFIG="))
        .expect("the JIT configuration is in the runner's environment")
        .to_owned();
    assert!(jit.len() > 20);
    assert!(
        runner.env.iter().all(|v| !v.starts_with("RM_")),
        "agent variables reached the runner: {:?}",
        runner
            .env
            .iter()
            .filter(|v| v.starts_with("RM_"))
            .collect::<Vec<_>>()
    );
    assert!(runner.env.iter().any(|v| v.starts_with("TMPDIR=")));
    // Its stdout and stderr go to a file in its runtime, its uid's like the rest of it (no
    // pipe to the agent).
    let live = fleet.attempts();
    let output = live[0].runtime_dir.join("_diag/rm-output.log");
    let uid_of = |path: &Path| {
        std::os::unix::fs::MetadataExt::uid(
            &std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        )
    };
    // Under `none` the agent's own: /proc/self is this test's, the agent's user.
    let runner_uid = live[0]
        .uid
        .unwrap_or_else(|| uid_of(Path::new("/proc/self")));
    assert_eq!(uid_of(&output), runner_uid);

    wait_until(Duration::from_secs(30), "the job completed", || {
        fleet.completed(job)
    })
    .await;
    wait_until(Duration::from_secs(30), "the attempt cleaned", || {
        fleet.all_cleaned()
    })
    .await;

    // One JIT request, with the body CONTRACT §5 gives.
    let jits: Vec<_> = fleet
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/generate-jitconfig"))
        .collect();
    assert_eq!(jits.len(), 1, "one JIT request");
    assert_eq!(
        jits[0].path,
        "/orgs/acme/actions/runners/generate-jitconfig"
    );
    let body = jits[0].body.clone().unwrap();
    let attempts = fleet.attempts();
    assert_eq!(attempts.len(), 1);
    let attempt = &attempts[0];
    assert_eq!(
        body,
        serde_json::json!({
            "name": format!("rm-{HOST}-{}", &attempt.attempt_id.as_str()[..12]),
            "runner_group_id": 1,
            "labels": LABELS,
            "work_folder": "_work",
        })
    );
    assert_eq!(attempt.outcome, Some(AttemptOutcome::CompletedJob));
    assert_eq!(
        attempt.job_id,
        Some(rm_vocab::JobId::try_from(job).unwrap())
    );
    assert!(fleet.our_registrations().is_empty(), "registration left");
    assert!(
        fleet.runtimes().is_empty(),
        "runtime left: {:?}",
        fleet.runtimes()
    );

    // Every step of the attempt's life is logged in its span: the attempt, its runner and its
    // policy are said once per line by the span, not by each event.
    let logs = fleet.setup.logs();
    let context = format!(
        "attempt{{id={} runner={} policy={}}}",
        attempt.attempt_id.as_str(),
        attempt.runner_name,
        attempt.policy
    );
    for event in [
        "runner allocated",
        "runner started",
        "runner concluded",
        "cleaned",
    ] {
        assert!(
            logs.lines()
                .any(|l| l.contains(&context) && l.contains(event)),
            "{event} not logged in {context}"
        );
    }

    // No secret in the logs, the journal, or the listings the CLI prints.
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
    let runners_json = fleet.setup.run(&["runners", "--json"]);
    let jobs_json = fleet.setup.run(&["jobs", "--json"]);

    // The runner's `_diag` was kept before its runtime went, and `rm-agent logs <job>` prints
    // it: the fake runner's own line, under a header naming the attempt.
    let kept = fleet
        .setup
        .dir
        .path()
        .join("data/logs")
        .join(attempt.attempt_id.as_str());
    let kept_names: Vec<String> = std::fs::read_dir(&kept)
        .unwrap_or_else(|e| panic!("no kept logs at {}: {e}", kept.display()))
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept_names.iter().any(|n| n.starts_with("Runner_"))
            && kept_names.iter().any(|n| n == "rm-output.log"),
        "{kept_names:?}"
    );
    let printed = fleet.setup.run(&["logs", &job.to_string()]);
    let text = String::from_utf8_lossy(&printed.stdout).into_owned();
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert!(
        text.contains(&format!("=== attempt {}", attempt.attempt_id.as_str())),
        "{text}"
    );
    assert!(text.contains("Listening for Jobs"), "{text}");
    // An id no attempt ran: exit 1, one sentence.
    let unknown = fleet.setup.run(&["logs", "999999999"]);
    assert_eq!(unknown.status.code(), Some(1));

    let mut haystack = fleet.setup.logs().into_bytes();
    haystack.extend(fleet.journal_bytes());
    haystack.extend(runners_json.stdout);
    haystack.extend(jobs_json.stdout);
    haystack.extend(printed.stdout);
    for name in &kept_names {
        haystack.extend(std::fs::read(kept.join(name)).unwrap());
    }
    let key = fleet.key.private_pem.expose_secret().to_owned();
    let key_body: String = key.lines().nth(1).unwrap().to_owned();
    let tokens = fleet.fake.issued_tokens();
    assert!(!tokens.is_empty(), "the agent used installation tokens");
    let mut secrets = vec![
        ("the JIT configuration", jit.clone()),
        ("the App key", key_body),
        ("the webhook secret", SECRET.to_owned()),
    ];
    secrets.extend(tokens.into_iter().map(|t| ("an installation token", t)));
    // The status snapshot the agent publishes is part of what it leaves behind.
    let status =
        std::fs::read(fleet.setup.dir.path().join("data").join("status.json")).unwrap_or_default();
    haystack.extend(status);
    for (name, secret) in &secrets {
        assert!(
            !contains(&haystack, secret.as_bytes()),
            "{name} leaked into logs, journal, status, kept runner logs or CLI output"
        );
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_leaves_a_busy_runner_running_and_the_next_start_adopts_it() {
    let fleet = Fleet::start(FleetOptions::default()).await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 6_000,
        ..RunnerBehavior::default()
    });
    let agent = fleet.start_agent(&[]).await;
    let job = fleet.fake.queue_job(REPO, "long", LABELS).unwrap();
    wait_until(Duration::from_secs(30), "the runner busy", || {
        fleet.any_busy()
    })
    .await;
    let started = std::time::Instant::now();
    let status = agent.terminate();
    assert!(status.success(), "drain exit status {status}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the drain took {:?}",
        started.elapsed()
    );
    // The busy runner was not killed: it is still working on its job.
    let attempt = fleet.attempts().remove(0);
    assert_eq!(attempt.state, AttemptState::Busy);
    let pid = attempt.pid.unwrap();
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the busy runner was stopped by the drain"
    );
    assert!(!fleet.completed(job));

    // The next start adopts it; it finishes its job and is cleaned up as usual.
    let _agent = fleet.start_agent(&[]).await;
    wait_until(Duration::from_secs(30), "the job completed", || {
        fleet.completed(job)
    })
    .await;
    wait_until(
        Duration::from_secs(30),
        "the adopted runner cleaned",
        || fleet.all_cleaned(),
    )
    .await;
    let attempts = fleet.attempts();
    assert_eq!(attempts.len(), 1, "the job got a second runner");
    assert_eq!(attempts[0].outcome, Some(AttemptOutcome::CompletedJob));
    assert!(fleet.our_registrations().is_empty());
    assert!(fleet.runtimes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_slot_keeps_its_checkout_for_the_next_job_and_nothing_else() {
    let fleet = Fleet::start(FleetOptions {
        policies: vec![PolicySpec {
            name: "widgets",
            target: REPO,
            labels: &["self-hosted", "linux"],
            max_runners: 2,
            workspace: "persistent",
            extra: "",
        }],
        ..FleetOptions::default()
    })
    .await;
    fleet.fake.set_runner_behavior(RunnerBehavior {
        job_duration_ms: 1_500,
        ..RunnerBehavior::default()
    });
    let _agent = fleet.start_agent(&[]).await;
    let slots = fleet.runner_root.join("widgets");
    let checkout = |slot: &str| slots.join(slot).join("_work/widgets/widgets/job.txt");

    // Two at once take slots s0 and s1.
    let first = fleet
        .fake
        .queue_matrix(REPO, "build", LABELS, &["a", "b"])
        .unwrap();
    wait_until(
        Duration::from_secs(40),
        "the matrix completed and cleaned",
        || first.iter().all(|j| fleet.completed(*j)) && fleet.all_cleaned(),
    )
    .await;
    let mut names: Vec<String> = std::fs::read_dir(&slots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["s0", "s1"]);
    for slot in ["s0", "s1"] {
        let left: Vec<String> = std::fs::read_dir(slots.join(slot))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            left,
            ["_work"],
            "slot {slot} was not scrubbed down to _work"
        );
    }
    assert!(checkout("s0").exists() && checkout("s1").exists());
    // A cache the first job left: what a persistent workspace is for.
    std::fs::write(slots.join("s0/_work/cache.bin"), "warm").unwrap();

    // The next job reuses s0, finding the previous job's checkout there.
    let next = fleet.fake.queue_job(REPO, "test", LABELS).unwrap();
    wait_until(
        Duration::from_secs(40),
        "the next job completed and cleaned",
        || fleet.completed(next) && fleet.all_cleaned(),
    )
    .await;
    let attempts = fleet.attempts();
    let newest = attempts.first().unwrap();
    assert_eq!(newest.job_id, rm_vocab::JobId::try_from(next).ok());
    assert!(
        newest.runtime_dir.ends_with("widgets/s0"),
        "{}",
        newest.runtime_dir.display()
    );
    assert_eq!(
        std::fs::read_to_string(slots.join("s0/_work/cache.bin")).unwrap(),
        "warm",
        "the slot's _work did not survive the next runner"
    );
    assert_eq!(
        std::fs::read_to_string(checkout("s0")).unwrap(),
        format!("job {next}\n")
    );
    assert!(fleet.our_registrations().is_empty());
}
