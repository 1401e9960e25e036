//! `runners`' table and JSON: the image column and field (issue 40).

use rm_journal::{AttemptId, AttemptRecord, AttemptState, IsolationKind, WorkspaceKind};
use rm_vocab::UnixMs;

use super::*;

const IMAGE: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn attempt(image: Option<&str>) -> AttemptRecord {
    let id = AttemptId::generate();
    AttemptRecord {
        runner_name: id.runner_name("h"),
        attempt_id: id,
        policy: "linux".into(),
        workspace: WorkspaceKind::Ephemeral,
        runtime_dir: "/r/x".into(),
        state: AttemptState::Busy,
        state_changed_at_ms: UnixMs::new(1),
        outcome: None,
        reason: None,
        detail: None,
        runner_id: None,
        job_id: None,
        pid: None,
        pid_start_time: None,
        stop_intent: None,
        stop_intent_at_ms: None,
        created_at_ms: UnixMs::new(1),
        updated_at_ms: UnixMs::new(2),
        pid_boot_id: None,
        isolation: IsolationKind::User,
        uid: Some(64_200),
        cgroup: None,
        released_at_ms: None,
        image: image.map(str::to_owned),
        shape: None,
    }
}

#[test]
fn an_image_id_is_shortened_to_twelve_hex() {
    for (image, short) in [
        (IMAGE, "sha256:0123456789ab"),
        ("sha256:0123456789ab", "sha256:0123456789ab"),
        ("sha256:abc", "sha256:abc"),
        ("something else", "something else"),
    ] {
        assert_eq!(short_image(image), short, "{image}");
    }
}

#[test]
fn the_table_has_an_image_column_only_when_a_runner_ran_in_an_image() {
    let (header, rows) = table(&[attempt(None), attempt(None)]);
    assert_eq!(
        header,
        [
            "RUNNER", "POLICY", "STATE", "OUTCOME", "JOB", "UID", "UPDATED", "DETAIL"
        ]
    );
    assert!(rows.iter().all(|row| row.len() == header.len()));

    let (header, rows) = table(&[attempt(Some(IMAGE)), attempt(None)]);
    let column = header.iter().position(|h| *h == "IMAGE").unwrap();
    assert_eq!(header[column - 1], "UID");
    assert!(rows.iter().all(|row| row.len() == header.len()));
    assert_eq!(rows[0][column], "sha256:0123456789ab");
    assert_eq!(rows[1][column], "-");
}

#[test]
fn the_json_names_the_full_image_or_null() {
    let json = attempt_json(&attempt(Some(IMAGE)));
    assert_eq!(json["image"], IMAGE);
    assert_eq!(json["state"], "busy");
    assert_eq!(json["uid"], 64_200);
    let json = attempt_json(&attempt(None));
    assert!(json["image"].is_null(), "{json}");
    assert!(json.as_object().unwrap().contains_key("image"));
}
