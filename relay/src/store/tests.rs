use serde_json::Map;

use super::*;

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
                created_at_ms: 1,
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
        received_at_ms: 5,
        headers,
        body: bytes::Bytes::copy_from_slice(body),
    }
}

#[test]
fn a_guid_is_stored_once_per_channel_and_streams_read_only_their_channel_in_order() {
    let (_dir, mut conn) = db();
    channel(&conn, "a");
    channel(&conn, "b");
    let first = insert_delivery(&mut conn, &delivery("a", "g1", b"1")).unwrap();
    let Inserted::New(first) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        insert_delivery(&mut conn, &delivery("a", "g1", b"other")).unwrap(),
        Inserted::Duplicate(first)
    );
    // The same GUID on another channel is another App's delivery.
    assert!(matches!(
        insert_delivery(&mut conn, &delivery("b", "g1", b"b")).unwrap(),
        Inserted::New(_)
    ));
    insert_delivery(&mut conn, &delivery("a", "g2", b"\x00\xff")).unwrap();
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
        insert_delivery(&mut conn, &delivery("a", guid, b"{}")).unwrap();
    }
    assert_eq!(record_ack(&mut conn, "a", "h", 2, 1).unwrap(), 2);
    assert_eq!(record_ack(&mut conn, "a", "h", 1, 1).unwrap(), 2);
    assert_eq!(record_ack(&mut conn, "a", "h", 1_000, 1).unwrap(), 3);
    assert_eq!(acked(&conn, "a", "h").unwrap(), 3);
    assert_eq!(acked(&conn, "a", "other").unwrap(), 0);
}

#[test]
fn tokens_are_replaced_per_host_and_revoked() {
    let (_dir, mut conn) = db();
    assert!(!issue_token(&mut conn, "a", "h", "d0", 1).unwrap());
    channel(&conn, "a");
    assert!(issue_token(&mut conn, "a", "h", "d1", 1).unwrap());
    assert_eq!(
        host_for_token(&conn, "a", "d1").unwrap().as_deref(),
        Some("h")
    );
    assert!(issue_token(&mut conn, "a", "h", "d2", 2).unwrap());
    assert_eq!(host_for_token(&conn, "a", "d1").unwrap(), None);
    assert_eq!(host_for_token(&conn, "b", "d2").unwrap(), None);
    assert!(revoke_token(&conn, "a", "h").unwrap());
    assert!(!revoke_token(&conn, "a", "h").unwrap());
    assert_eq!(host_for_token(&conn, "a", "d2").unwrap(), None);
}
