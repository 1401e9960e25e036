//! Handler tests on GitHub's real example payloads (`tests/fixtures/webhooks/`), with the
//! `installation` object an App delivery carries added where the example lacks it, plus
//! arbitrary JSON thrown at every handler.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use rm_vocab::JobState;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/webhooks");
const INSTALLATION_ID: i64 = 4242;

/// A fixture's bytes, as an App delivery: with an `installation` object.
fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{FIXTURES}/{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut value: Value = serde_json::from_str(&text).unwrap();
    let object = value.as_object_mut().unwrap();
    object
        .entry("installation")
        .or_insert_with(|| json!({"id": INSTALLATION_ID, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNDI0Mg=="}));
    serde_json::to_vec(&value).unwrap()
}

/// When a delivery of `body` arrives in these tests: an hour after the job's newest timestamp
/// (GitHub's examples are years old, and a delivery is judged by its own dates), or a fixed
/// time for a body without them.
fn arrival_of(body: &[u8]) -> i64 {
    let newest = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| {
            ["created_at", "started_at", "completed_at"]
                .iter()
                .filter_map(|key| value["workflow_job"][key].as_str())
                .filter_map(rm_vocab::UnixMs::parse_rfc3339)
                .map(rm_vocab::UnixMs::get)
                .max()
        });
    newest.map_or(1_700_000_000_000, |at| at + 3_600_000)
}

fn deliver(event: &str, body: &[u8]) -> Verdict {
    deliver_at(event, body, arrival_of(body))
}

fn deliver_at(event: &str, body: &[u8], received_at_ms: i64) -> Verdict {
    handle(&Delivery {
        guid: "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        event,
        body,
        received_at_ms: UnixMs::new(received_at_ms),
        source: Source::Webhook,
    })
}

fn only_job(verdict: Verdict) -> JobObservation {
    match verdict {
        Verdict::Apply { changes, .. } => match changes.as_slice() {
            [Change::Job(job)] => job.clone(),
            other => panic!("expected one job change, got {other:?}"),
        },
        other => panic!("expected Apply, got {other:?}"),
    }
}

/// `workflow_job.queued.5` was created and started at 2021-09-13T02:21:13Z.
const QUEUED_5_AT_MS: i64 = 1_631_499_673_000;

#[test]
fn an_old_body_under_any_guid_is_stale_and_changes_nothing() {
    let body = fixture("workflow_job.queued.5");
    assert_eq!(arrival_of(&body), QUEUED_5_AT_MS + 3_600_000);
    // A day and a second after the job was queued: GitHub has cancelled it by then.
    match deliver_at(
        "workflow_job",
        &body,
        QUEUED_5_AT_MS + QUEUE_LIFETIME_MS + 1000,
    ) {
        Verdict::Stale { action, reason } => {
            assert_eq!(action.as_deref(), Some("queued"));
            assert!(reason.contains("job 289782451"), "{reason}");
            assert!(reason.contains("24 h"), "{reason}");
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    // Just inside the lifetime it is still a sighting.
    let job = only_job(deliver_at(
        "workflow_job",
        &body,
        QUEUED_5_AT_MS + QUEUE_LIFETIME_MS - 1000,
    ));
    assert_eq!(job.state, JobState::Queued);
}

#[test]
fn a_late_completion_of_an_old_job_is_judged_by_its_newest_date() {
    // Created 2021-08-05T10:33:58Z, completed 10:38:16Z: a day after creation but within a day
    // of completion, the `completed` sighting is news.
    let body = fixture("workflow_job.completed.1");
    let completed_at = rm_vocab::UnixMs::parse_rfc3339("2021-08-05T10:38:16Z")
        .unwrap()
        .get();
    let created_at = rm_vocab::UnixMs::parse_rfc3339("2021-08-05T10:33:58Z")
        .unwrap()
        .get();
    let arrives = created_at + QUEUE_LIFETIME_MS + 60_000;
    assert!(arrives - completed_at < QUEUE_LIFETIME_MS);
    assert_eq!(
        only_job(deliver_at("workflow_job", &body, arrives)).state,
        JobState::Completed
    );
    assert!(matches!(
        deliver_at("workflow_job", &body, completed_at + QUEUE_LIFETIME_MS + 1),
        Verdict::Stale { .. }
    ));
}

#[test]
fn a_body_without_readable_dates_is_not_judged_by_them() {
    let mut value: Value = serde_json::from_slice(&fixture("workflow_job.queued.5")).unwrap();
    let job = value["workflow_job"].as_object_mut().unwrap();
    job.remove("created_at");
    job.insert("started_at".into(), json!("not a date"));
    let body = serde_json::to_vec(&value).unwrap();
    let far_later = QUEUED_5_AT_MS + 365 * QUEUE_LIFETIME_MS;
    assert_eq!(
        only_job(deliver_at("workflow_job", &body, far_later)).state,
        JobState::Queued
    );
}

#[test]
fn queued_job_becomes_a_queued_observation_without_a_runner() {
    let job = only_job(deliver("workflow_job", &fixture("workflow_job.queued.5")));
    assert_eq!(job.job_id.get(), 289_782_451);
    assert_eq!(job.run_id, 2_202_229_078);
    assert_eq!(job.run_attempt, 1);
    assert_eq!(job.repository, "Codertocat/Hello-World");
    assert_eq!(
        job.installation_id,
        Some(3_456_996),
        "the example carries its own installation"
    );
    assert_eq!(job.labels, vec!["ubuntu-latest"]);
    assert_eq!(job.state, JobState::Queued);
    // The example names a runner while queued; rm must not believe it.
    assert_eq!(job.runner_name, None);
    assert_eq!(job.runner_id, None);
    assert_eq!(job.observed_at_ms.get(), QUEUED_5_AT_MS + 3_600_000);
    assert_eq!(job.source, Source::Webhook);
}

#[test]
fn the_action_decides_the_state_not_the_status_field() {
    // GitHub's example `queued` delivery carries `status: waiting`.
    let job = only_job(deliver("workflow_job", &fixture("workflow_job.queued.6")));
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.labels, vec!["self-hosted", "k8s"]);
    let job = only_job(deliver("workflow_job", &fixture("workflow_job.waiting.7")));
    assert_eq!(job.state, JobState::Waiting);
}

#[test]
fn in_progress_and_completed_name_the_runner() {
    let job = only_job(deliver(
        "workflow_job",
        &fixture("workflow_job.in_progress.0"),
    ));
    assert_eq!(job.state, JobState::InProgress);
    assert_eq!(job.runner_name.as_deref(), Some("my runner"));
    assert_eq!(job.labels, vec!["gpu", "db-app", "dc-03"]);
    let job = only_job(deliver(
        "workflow_job",
        &fixture("workflow_job.completed.1"),
    ));
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.conclusion.as_deref(), Some("failure"));
    assert_eq!(job.runner_name.as_deref(), Some("GitHub Actions 5"));
}

/// The wait's two ends (CONTRACT §8): GitHub's `created_at` is when the job was queued, its
/// `started_at` when it started, but only once it did: a queued job carries its creation time
/// there.
#[test]
fn a_sighting_carries_when_the_job_was_queued_and_when_it_started() {
    let ms = |t| rm_vocab::UnixMs::parse_rfc3339(t).unwrap();
    let queued = only_job(deliver("workflow_job", &fixture("workflow_job.queued.5")));
    assert_eq!(
        queued.queued_at_ms,
        Some(rm_vocab::UnixMs::new(QUEUED_5_AT_MS))
    );
    assert_eq!(queued.started_at_ms, None, "a queued job has not started");
    let completed = only_job(deliver(
        "workflow_job",
        &fixture("workflow_job.completed.1"),
    ));
    assert_eq!(completed.queued_at_ms, Some(ms("2021-08-05T10:33:58Z")));
    assert_eq!(completed.started_at_ms, Some(ms("2021-08-05T10:34:58Z")));
    // GitHub's example `in_progress` has no `created_at`: the journal falls back to its own.
    let started = only_job(deliver(
        "workflow_job",
        &fixture("workflow_job.in_progress.0"),
    ));
    assert_eq!(started.queued_at_ms, None);
    assert_eq!(started.started_at_ms, Some(ms("2021-06-15T19:22:27Z")));
}

#[test]
fn every_workflow_job_fixture_applies() {
    for name in [
        "workflow_job.completed.1",
        "workflow_job.completed.2",
        "workflow_job.in_progress.0",
        "workflow_job.in_progress.3",
        "workflow_job.in_progress.4",
        "workflow_job.queued.5",
        "workflow_job.queued.6",
        "workflow_job.waiting.7",
    ] {
        let job = only_job(deliver("workflow_job", &fixture(name)));
        let action = name.split('.').nth(1).unwrap();
        assert_eq!(job.state.as_str(), action, "{name}");
    }
}

#[test]
fn an_unknown_workflow_job_action_is_ignored() {
    let mut body: Value = serde_json::from_slice(&fixture("workflow_job.queued.5")).unwrap();
    body["action"] = json!("requested");
    let verdict = deliver("workflow_job", &serde_json::to_vec(&body).unwrap());
    assert!(
        matches!(verdict, Verdict::Ignore { ref action, .. } if action.as_deref() == Some("requested"))
    );
}

#[test]
fn a_workflow_job_without_an_id_is_rejected_with_the_field() {
    let mut body: Value = serde_json::from_slice(&fixture("workflow_job.queued.5")).unwrap();
    body["workflow_job"].as_object_mut().unwrap().remove("id");
    match deliver("workflow_job", &serde_json::to_vec(&body).unwrap()) {
        Verdict::Reject { action, reason } => {
            assert_eq!(action.as_deref(), Some("queued"));
            assert!(reason.contains("missing field `id`"), "{reason}");
        }
        other => panic!("expected Reject, got {other:?}"),
    }
    body["workflow_job"]["id"] = json!(-5);
    assert!(matches!(
        deliver("workflow_job", &serde_json::to_vec(&body).unwrap()),
        Verdict::Reject { .. }
    ));
}

#[test]
fn ping_notes_the_hook() {
    for n in 0..4 {
        match deliver("ping", &fixture(&format!("ping.none.{n}"))) {
            Verdict::Apply { changes, note, .. } => {
                assert!(changes.is_empty());
                assert!(note.unwrap().starts_with("ping from hook "));
            }
            other => panic!("expected Apply, got {other:?}"),
        }
    }
}

#[test]
fn installation_created_keeps_account_and_repositories() {
    match deliver("installation", &fixture("installation.created.1")) {
        Verdict::Apply {
            action, changes, ..
        } => {
            assert_eq!(action.as_deref(), Some("created"));
            let [Change::InstallationUpsert(installation)] = changes.as_slice() else {
                panic!("{changes:?}");
            };
            assert_eq!(installation.account.as_deref(), Some("Codertocat"));
            assert!(!installation.suspended);
            let repos = installation.repositories.as_ref().unwrap();
            assert_eq!(repos[0].full_name, "Codertocat/Hello-World");
        }
        other => panic!("expected Apply, got {other:?}"),
    }
}

#[test]
fn installation_lifecycle_actions() {
    let change = |name: &str| match deliver("installation", &fixture(name)) {
        Verdict::Apply { changes, .. } => changes.into_iter().next().unwrap(),
        other => panic!("{name}: expected Apply, got {other:?}"),
    };
    assert!(matches!(
        change("installation.deleted.0"),
        Change::InstallationRemoved { .. }
    ));
    assert!(matches!(
        change("installation.suspend.5"),
        Change::InstallationSuspended {
            suspended: true,
            ..
        }
    ));
    match change("installation.unsuspend.6") {
        Change::InstallationUpsert(installation) => assert!(!installation.suspended),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        change("installation.new_permissions_accepted.4"),
        Change::InstallationUpsert(_)
    ));
}

#[test]
fn installation_repositories_added_and_removed() {
    match deliver(
        "installation_repositories",
        &fixture("installation_repositories.added.0"),
    ) {
        Verdict::Apply { changes, .. } => {
            let [Change::RepositoriesAdded { repositories, .. }] = changes.as_slice() else {
                panic!("{changes:?}");
            };
            assert_eq!(repositories[0].full_name, "Codertocat/Space");
        }
        other => panic!("{other:?}"),
    }
    match deliver(
        "installation_repositories",
        &fixture("installation_repositories.removed.2"),
    ) {
        Verdict::Apply { changes, .. } => {
            assert!(
                changes
                    .iter()
                    .any(|c| matches!(c, Change::RepositoriesRemoved { .. })),
                "{changes:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn events_without_a_handler_are_ignored_with_their_action() {
    match deliver("workflow_run", &fixture("workflow_run.completed.0")) {
        Verdict::Ignore { action, reason } => {
            assert_eq!(action.as_deref(), Some("completed"));
            assert!(reason.contains("workflow_run"));
        }
        other => panic!("{other:?}"),
    }
}

/// Any JSON value, nested a few levels, with keys that the handlers look for mixed in so that
/// generated documents reach past the first field check.
fn arbitrary_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("action".to_owned()),
        Just("workflow_job".to_owned()),
        Just("installation".to_owned()),
        Just("repository".to_owned()),
        Just("id".to_owned()),
        Just("labels".to_owned()),
        Just("full_name".to_owned()),
        "[a-z_]{1,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            Just("queued".to_owned()),
            Just("created".to_owned()),
            ".{0,20}"
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A real payload with one field somewhere replaced by arbitrary JSON.
fn mutated_fixture() -> impl Strategy<Value = (String, Value)> {
    let names = prop_oneof![
        Just(("workflow_job", "workflow_job.queued.5")),
        Just(("workflow_job", "workflow_job.in_progress.0")),
        Just(("workflow_job", "workflow_job.completed.1")),
        Just(("installation", "installation.created.1")),
        Just((
            "installation_repositories",
            "installation_repositories.removed.2"
        )),
        Just(("ping", "ping.none.0")),
    ];
    (names, any::<prop::sample::Index>(), arbitrary_json()).prop_map(
        |((event, name), at, replacement)| {
            let mut value: Value = serde_json::from_slice(&fixture(name)).unwrap();
            let mut paths = Vec::new();
            collect_paths(&value, String::new(), &mut paths);
            let path = at.get(&paths).clone();
            if let Some(slot) = value.pointer_mut(&path) {
                *slot = replacement;
            }
            (event.to_owned(), value)
        },
    )
}

fn collect_paths(value: &Value, here: String, out: &mut Vec<String>) {
    out.push(here.clone());
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                collect_paths(
                    v,
                    format!("{here}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect_paths(v, format!("{here}/{i}"), out);
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_handler_panics_on_arbitrary_json(value in arbitrary_json()) {
        let body = serde_json::to_vec(&value).unwrap();
        for (event, _) in HANDLERS {
            let _ = deliver(event, &body);
        }
        let _ = deliver("check_run", &body);
    }

    #[test]
    fn no_handler_panics_on_arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..256)) {
        for (event, _) in HANDLERS {
            let _ = deliver(event, &body);
        }
    }

    #[test]
    fn a_mutated_real_payload_is_applied_ignored_or_rejected_never_a_panic(
        (event, value) in mutated_fixture()
    ) {
        let verdict = deliver(&event, &serde_json::to_vec(&value).unwrap());
        if let Verdict::Apply { changes, .. } = verdict {
            for change in changes {
                if let Change::Job(job) = change {
                    prop_assert!(job.job_id.get() > 0 && job.run_id > 0);
                }
            }
        }
    }
}

#[test]
fn a_body_that_is_not_json_is_never_applied_or_ignored() {
    for body in [
        &b"payload=%7B%7D"[..],
        b"{\"action\":\"queued\"",
        b"{} trailing",
        b"",
    ] {
        for event in [
            "workflow_job",
            "ping",
            "installation",
            "installation_repositories",
            "check_run",
        ] {
            assert!(
                matches!(deliver(event, body), Verdict::Reject { .. }),
                "{event}: {body:?}"
            );
        }
        assert!(!is_json(body));
    }
    assert!(is_json(br#"{"action": 5}"#));
    // An ignored event whose `action` is not a string is still JSON, and still ignored.
    assert!(matches!(
        deliver("check_run", br#"{"action": 5}"#),
        Verdict::Ignore { action: None, .. }
    ));
}

/// A handler that panics does not lose the delivery: its verdict is a rejection saying so (to be
/// replayed after the fix). The control: the same delivery judged by a handler that does not
/// panic keeps that handler's verdict.
#[test]
fn a_panicking_handler_is_a_rejection_not_a_lost_delivery() {
    let body = fixture("workflow_job.queued.5");
    let delivery = Delivery {
        guid: "g-panic",
        event: "workflow_job",
        body: &body,
        received_at_ms: rm_vocab::UnixMs::new(arrival_of(&body)),
        source: rm_vocab::Source::Webhook,
    };
    let panicked = judge_with(|_| panic!("a handler bug"), &delivery);
    match panicked {
        Verdict::Reject { action, reason } => {
            assert_eq!(action, None);
            assert_eq!(
                reason,
                "the `workflow_job` handler panicked; replay after upgrading"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(judge(&delivery), Verdict::Apply { .. }),
        "{:?}",
        judge(&delivery)
    );
}
