//! An enterprise `[[scale_set]]` end to end (issue 29), through the real binary against the
//! fake broker: registered with the enterprise's classic PAT read from `token_file`, never the
//! App (the registration token, the exchange and the service's calls all go without it, and
//! the executor lists no scale set's runners: not one App request); each job
//! served by one runner of the policy, nothing left registered, each message journalled once;
//! the PAT in no log, no journal, no `status` and no runner's argv or environment. A wrong
//! PAT: no runner, `status` shows the refusal, and the agent keeps running.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use rm_e2e::fleet::{Fleet, FleetOptions, wait_until};

use super::scale_set::{BIG, SCALE_SET, assert_served_once, jobs_done, scale_set_id, status_note};

/// The enterprise's slug at the fake.
const ENTERPRISE: &str = "octo-corp";
/// The PAT the fake's enterprise takes: distinctive, so a grep finds any copy of it.
const PAT: &str = "ghp_e2eEnterprisePAT7f3c9a";

/// A fleet whose scale set lives in the enterprise, its PAT file holding `token` (mode 0600,
/// root's: no runner uid reads it), under a base directory a runner can reach (its report).
async fn enterprise_fleet(token: &str) -> Fleet {
    let options = FleetOptions {
        policies: vec![BIG],
        base_dir: Some(super::isolation::base_dir()),
        // No webhook intake: nothing else of the agent asks the App anything.
        receiver: false,
        ..FleetOptions::default()
    };
    let mut fleet = Fleet::start(options).await;
    fleet.fake.set_enterprise_pat(ENTERPRISE, PAT);
    let token_file = fleet.setup.dir.path().join("enterprise.pat");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    fleet.options.tail = format!(
        "\n[[scale_set]]\nname = \"{SCALE_SET}\"\npolicy = \"big\"\nenterprise = \"{ENTERPRISE}\"\ntoken_file = \"{}\"\n",
        token_file.display()
    );
    fleet.configure(&fleet.options.clone());
    fleet
}

/// Every App request (with its JWT or an installation token, or an installation lookup) the
/// fake answered since `since`: `"METHOD path"`.
fn app_requests(fleet: &Fleet, since: SystemTime) -> Vec<String> {
    fleet
        .fake
        .requests_since(since)
        .into_iter()
        .filter(|r| !r.path.starts_with("/enterprises/"))
        .filter(|r| {
            r.path.starts_with("/app")
                || r.path.ends_with("/installation")
                || r.path.starts_with("/orgs/")
                || r.path.starts_with("/repos/")
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// The script put in front of the runner: it writes its argv and environment to a report of
/// its own, then becomes the real listener.
const ARGV_SCRIPT: &str = r#"#!/bin/sh
HERE=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd -P)
{ printf 'argv: %s\n' "$0 $*"; env; } >>'@REPORT@/runner-'"${HERE##*/}"'.txt' 2>/dev/null
exec "$HERE/bin/Runner.Listener.real" "$@"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enterprise_scale_set_serves_its_jobs_with_its_pat_and_never_the_app() {
    let fleet = enterprise_fleet(PAT).await;
    let reports = fleet.reports_dir();
    fleet.wrap_listener(&ARGV_SCRIPT.replace("@REPORT@", &reports.display().to_string()));
    let started = fleet.fake.now();
    let _agent = fleet.start_agent(&[]).await;
    let id = scale_set_id(&fleet).await;
    let jobs = fleet
        .fake
        .queue_scale_set_jobs(id, &["ent 1", "ent 2", "ent 3"])
        .unwrap();
    wait_until(
        Duration::from_secs(120),
        "the enterprise's jobs done",
        || jobs_done(&fleet, &jobs),
    )
    .await;
    assert_served_once(&fleet, id, &jobs, false, 0).await;

    // The scale set lives in the enterprise: every registration token is the enterprise's,
    // asked with the PAT; no App request at all.
    let requests = fleet.fake.requests_since(started);
    let tokens: Vec<(&str, u16)> = requests
        .iter()
        .filter(|r| r.path.ends_with("/registration-token"))
        .map(|r| (r.path.as_str(), r.status))
        .collect();
    assert!(!tokens.is_empty(), "no registration token asked");
    let enterprise_path = format!("/enterprises/{ENTERPRISE}/actions/runners/registration-token");
    assert!(
        tokens
            .iter()
            .all(|(p, s)| *p == enterprise_path && *s == 201),
        "{tokens:?}"
    );
    let app = app_requests(&fleet, started);
    assert!(app.is_empty(), "App requests for the enterprise: {app:?}");

    // The PAT nowhere but its file and the agent's memory.
    let logs = fleet.setup.logs();
    assert!(logs.contains("listening to the scale set"), "no agent log?");
    assert!(!logs.contains(PAT), "the PAT in the agent's log");
    let journal = String::from_utf8_lossy(&fleet.journal_bytes()).into_owned();
    assert!(!journal.contains(PAT), "the PAT in the journal");
    let status = fleet.setup.run(&["status", "--json"]);
    assert!(status.status.success(), "{status:?}");
    assert!(!String::from_utf8_lossy(&status.stdout).contains(PAT));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        status["scale_sets"][0]["enterprise"], ENTERPRISE,
        "{status}"
    );
    let runner_reports: Vec<PathBuf> = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("runner-"))
        })
        .collect();
    assert_eq!(runner_reports.len(), jobs.len(), "{runner_reports:?}");
    for report in &runner_reports {
        let text = std::fs::read_to_string(report).unwrap();
        assert!(text.contains("argv: "), "{}: {text}", report.display());
        assert!(
            !text.contains(PAT),
            "the PAT reached a runner: {}",
            report.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_pat_starts_no_runner_shows_the_refusal_and_the_agent_keeps_running() {
    const WRONG: &str = "ghp_e2eWrongPAT0d9e1b";
    let fleet = enterprise_fleet(WRONG).await;
    let started = fleet.fake.now();
    let mut agent = fleet.start_agent(&[]).await;
    let note = status_note(&fleet, "refused: ").await;
    assert!(
        note.contains("personal access token") && note.contains("401"),
        "{note}"
    );
    let text = fleet.setup.run(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("refused: "), "{text}");
    // Refused once, not retried in a loop (the next try is minutes away); still running,
    // still healthy; no scale set, no runner, no App request for it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!agent.exited(), "the agent stopped");
    let refusals: Vec<u16> = fleet
        .fake
        .requests_since(started)
        .iter()
        .filter(|r| r.path.ends_with("/registration-token"))
        .map(|r| r.status)
        .collect();
    assert_eq!(refusals, [401], "refused once, not in a loop");
    assert!(fleet.attempts().is_empty(), "{:?}", fleet.attempts());
    assert!(fleet.fake.runners().is_empty());
    let app = app_requests(&fleet, started);
    assert!(app.is_empty(), "App requests for the enterprise: {app:?}");
    for secret in [WRONG, PAT] {
        assert!(!fleet.setup.logs().contains(secret), "a PAT in the log");
        assert!(!text.contains(secret), "a PAT in status");
        assert!(!note.contains(secret), "a PAT in the note");
    }
}

/// A PAT file open to its group refuses the start (exit 2), naming the key and the fix, never
/// the token; nothing is asked of GitHub for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_open_to_its_group_refuses_the_start() {
    let fleet = enterprise_fleet(PAT).await;
    let token_file = fleet.setup.dir.path().join("enterprise.pat");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let started = fleet.fake.now();
    let (status, stderr) = fleet.run_agent_until_exit(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("scale_set[0].token_file") && stderr.contains("open to its group"),
        "{stderr}"
    );
    assert!(stderr.contains("chmod 600"), "{stderr}");
    assert!(!stderr.contains(PAT), "the PAT in the refusal");
    let asked: Vec<String> = fleet
        .fake
        .requests_since(started)
        .into_iter()
        .filter(|r| r.path.starts_with("/enterprises/"))
        .map(|r| r.path)
        .collect();
    assert!(asked.is_empty(), "{asked:?}");
}
