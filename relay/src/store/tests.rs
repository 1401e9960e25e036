use serde_json::Map;

use super::*;
use rm_vocab::UnixMs;

fn db() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = open(&dir.path().join("data")).unwrap();
    (dir, conn)
}

fn channel(conn: &Connection, name: &str) {
    let ingest = crate::ids::new_channel_id().unwrap();
    let smee = crate::ids::new_channel_id().unwrap();
    assert!(
        add_channel(
            conn,
            &NewChannel {
                name,
                ingest_id: &ingest,
                smee_id: &smee,
                created_at_ms: UnixMs::new(1),
            },
        )
        .unwrap()
    );
}

fn delivery(channel: &str, guid: &str, body: &[u8]) -> NewDelivery {
    let mut headers = Map::new();
    headers.insert("x-github-delivery".into(), guid.into());
    NewDelivery {
        channel: channel.into(),
        guid: guid.into(),
        received_at_ms: UnixMs::new(5),
        headers,
        body: bytes::Bytes::copy_from_slice(body),
    }
}

#[test]
fn a_guid_is_stored_once_per_channel_and_streams_read_only_their_channel_in_order() {
    let (_dir, mut conn) = db();
    channel(&conn, "a");
    channel(&conn, "b");
    let first = insert_delivery(&mut conn, &delivery("a", "g1", b"1"), u64::MAX).unwrap();
    let Inserted::New { id: first, .. } = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        insert_delivery(&mut conn, &delivery("a", "g1", b"other"), u64::MAX).unwrap(),
        Inserted::Duplicate(first)
    );
    // The same GUID on another channel is another App's delivery.
    assert!(matches!(
        insert_delivery(&mut conn, &delivery("b", "g1", b"b"), u64::MAX).unwrap(),
        Inserted::New { .. }
    ));
    insert_delivery(&mut conn, &delivery("a", "g2", b"\x00\xff"), u64::MAX).unwrap();
    let got = deliveries_after(&conn, "a", 0).unwrap();
    let bodies: Vec<&[u8]> = got.iter().map(|d| &d.body[..]).collect();
    assert_eq!(bodies, [&b"1"[..], b"\x00\xff"]);
    assert!(got[0].id < got[1].id);
    assert_eq!(got[0].headers["x-github-delivery"], "g1");
    assert_eq!(deliveries_after(&conn, "a", got[0].id).unwrap().len(), 1);
    assert_eq!(latest_id(&conn, "a").unwrap(), got[1].id);
    assert_eq!(latest_id(&conn, "nope").unwrap(), 0);
}

#[test]
fn acks_only_move_forward_and_never_past_the_newest_id() {
    let (_dir, mut conn) = db();
    channel(&conn, "a");
    assert_eq!(acked(&conn, "a", "h").unwrap(), 0);
    for guid in ["1", "2", "3"] {
        insert_delivery(&mut conn, &delivery("a", guid, b"{}"), u64::MAX).unwrap();
    }
    assert_eq!(
        record_ack(&mut conn, "a", "h", 2, UnixMs::new(1)).unwrap(),
        2
    );
    assert_eq!(
        record_ack(&mut conn, "a", "h", 1, UnixMs::new(1)).unwrap(),
        2
    );
    assert_eq!(
        record_ack(&mut conn, "a", "h", 1_000, UnixMs::new(1)).unwrap(),
        3
    );
    assert_eq!(acked(&conn, "a", "h").unwrap(), 3);
    assert_eq!(acked(&conn, "a", "other").unwrap(), 0);
}

#[test]
fn tokens_are_replaced_per_host_and_revoked() {
    let (_dir, mut conn) = db();
    assert!(!issue_token(&mut conn, "a", "h", "d0", UnixMs::new(1)).unwrap());
    channel(&conn, "a");
    assert!(issue_token(&mut conn, "a", "h", "d1", UnixMs::new(1)).unwrap());
    assert_eq!(
        host_for_token(&conn, "a", "d1").unwrap().as_deref(),
        Some("h")
    );
    assert!(issue_token(&mut conn, "a", "h", "d2", UnixMs::new(2)).unwrap());
    assert_eq!(host_for_token(&conn, "a", "d1").unwrap(), None);
    assert_eq!(host_for_token(&conn, "b", "d2").unwrap(), None);
    assert!(revoke_token(&conn, "a", "h").unwrap());
    assert!(!revoke_token(&conn, "a", "h").unwrap());
    assert_eq!(host_for_token(&conn, "a", "d2").unwrap(), None);
}

fn ids(conn: &Connection, channel: &str) -> Vec<i64> {
    deliveries_after(conn, channel, 0)
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect()
}

#[test]
fn the_quota_drops_only_acknowledged_deliveries_oldest_first_then_refuses() {
    let (_dir, mut conn) = db();
    channel(&conn, "a");
    channel(&conn, "b");
    let body = [b'x'; 100];
    let size = delivery("a", "g00", &body).body.len() as u64 + 27; // {"x-github-delivery":"g00"}
    let quota = 3 * size;
    assert!(issue_token(&mut conn, "a", "h1", "d1", UnixMs::new(1)).unwrap());
    assert!(issue_token(&mut conn, "a", "h2", "d2", UnixMs::new(1)).unwrap());
    let mut stored = Vec::new();
    for n in 0..3 {
        let got =
            insert_delivery(&mut conn, &delivery("a", &format!("g0{n}"), &body), quota).unwrap();
        let Inserted::New { id, dropped: 0 } = got else {
            panic!("{got:?}")
        };
        stored.push(id);
    }
    assert_eq!(channel_usage(&conn, "a").unwrap(), quota);
    // Full, and nothing acknowledged by both hosts: refused, nothing dropped or stored.
    assert_eq!(
        insert_delivery(&mut conn, &delivery("a", "g10", &body), quota).unwrap(),
        Inserted::OverQuota
    );
    record_ack(&mut conn, "a", "h1", stored[2], UnixMs::new(1)).unwrap();
    assert_eq!(
        insert_delivery(&mut conn, &delivery("a", "g10", &body), quota).unwrap(),
        Inserted::OverQuota,
        "h2 has acknowledged nothing"
    );
    assert_eq!(ids(&conn, "a"), stored);
    // A redelivery of a stored GUID is still answered, full or not.
    assert_eq!(
        insert_delivery(&mut conn, &delivery("a", "g01", &body), quota).unwrap(),
        Inserted::Duplicate(stored[1])
    );
    // Both hosts past the first two: the oldest goes, and only as many as needed.
    record_ack(&mut conn, "a", "h2", stored[1], UnixMs::new(1)).unwrap();
    let got = insert_delivery(&mut conn, &delivery("a", "g10", &body), quota).unwrap();
    let Inserted::New {
        id: fourth,
        dropped: 1,
    } = got
    else {
        panic!("{got:?}")
    };
    assert_eq!(ids(&conn, "a"), [stored[1], stored[2], fourth]);
    let got = insert_delivery(&mut conn, &delivery("a", "g11", &[b'y'; 150]), quota).unwrap();
    assert_eq!(
        got,
        Inserted::OverQuota,
        "only stored[1] is acknowledged by both"
    );
    // A revoked host no longer holds deliveries back.
    assert!(revoke_token(&conn, "a", "h2").unwrap());
    assert_eq!(acknowledged_through(&conn, "a").unwrap(), stored[2]);
    let got = insert_delivery(&mut conn, &delivery("a", "g11", &[b'y'; 150]), quota).unwrap();
    assert!(matches!(got, Inserted::New { dropped: 2, .. }), "{got:?}");
    assert_eq!(ids(&conn, "a").len(), 2);
    // Another channel has its own quota; a channel without hosts acknowledges nothing.
    for n in 0..3 {
        let got = insert_delivery(&mut conn, &delivery("b", &format!("b{n}"), &body), quota);
        assert!(matches!(got.unwrap(), Inserted::New { .. }));
    }
    assert_eq!(acknowledged_through(&conn, "b").unwrap(), 0);
    assert_eq!(
        insert_delivery(&mut conn, &delivery("b", "b3", &body), quota).unwrap(),
        Inserted::OverQuota
    );
    // The usage follows every delete, retention's included.
    let used: i64 = conn
        .query_row(
            "SELECT SUM(length(body) + octet_length(headers)) FROM deliveries WHERE channel = 'a'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(channel_usage(&conn, "a").unwrap(), used as u64);
    crate::retention::prune_step(
        &conn,
        UnixMs::new(10_000),
        std::time::Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(channel_usage(&conn, "a").unwrap(), 0);
    assert_eq!(channel_usage(&conn, "b").unwrap(), 0);
}

#[test]
fn only_group_or_other_bits_call_for_a_repair() {
    assert_eq!(repaired_mode(0o755, 0o700), Some(0o700));
    assert_eq!(repaired_mode(0o701, 0o700), Some(0o700));
    assert_eq!(repaired_mode(0o644, 0o600), Some(0o600));
    assert_eq!(repaired_mode(0o660, 0o600), Some(0o600));
    assert_eq!(repaired_mode(0o700, 0o700), None);
    assert_eq!(repaired_mode(0o600, 0o600), None);
    assert_eq!(repaired_mode(0o400, 0o600), None);
}

#[test]
fn a_data_directory_others_can_read_is_repaired_with_its_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let chmod = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    // A store made before, then opened up as a careless `mkdir`/`cp` under umask 022 would.
    drop(open(&data).unwrap());
    chmod(&data, 0o755);
    chmod(&data.join(DB_FILE), 0o644);
    std::fs::write(data.join("relay.db-shm"), b"").unwrap();
    chmod(&data.join("relay.db-shm"), 0o644);
    std::fs::write(data.join(LOCK_FILE), b"").unwrap();
    chmod(&data.join(LOCK_FILE), 0o666);
    let conn = open(&data).unwrap();
    assert_eq!(mode(&data), 0o700);
    for name in [DB_FILE, "relay.db-wal", "relay.db-shm", LOCK_FILE] {
        assert_eq!(mode(&data.join(name)), 0o600, "{name}");
    }
    drop(conn);
    // A directory that exists, empty and 0755 (made by a package or by hand): the new store in
    // it is private whatever the umask (SQLite's own files copy relay.db's mode).
    let fresh = dir.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    chmod(&fresh, 0o755);
    let _conn = open(&fresh).unwrap();
    assert_eq!(mode(&fresh), 0o700);
    for name in [DB_FILE, "relay.db-wal", "relay.db-shm"] {
        assert_eq!(mode(&fresh.join(name)), 0o600, "{name}");
    }
    let _lock = lock_instance(&fresh).unwrap();
    assert_eq!(mode(&fresh.join(LOCK_FILE)), 0o600);
}
