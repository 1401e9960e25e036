//! How long the relay keeps deliveries, and the pruning of older ones. A host that stays away
//! longer than the retention misses what was pruned; the default matches GitHub's 3-day
//! redelivery window, the other way back to a lost delivery.

use std::time::Duration;

use rm_vocab::UnixMs;
use rusqlite::{Connection, params};

/// Deliveries are kept this long unless `serve --retention` says otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// The shortest retention `serve` accepts: less would prune deliveries a host on a short
/// network outage still needs.
pub const MIN_RETENTION: Duration = Duration::from_secs(60);
/// How often a prune pass starts (the first one runs as `serve` starts).
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// The most rows one prune step deletes, so no step holds the write lock for long.
pub const PRUNE_STEP_ROWS: i64 = 1000;

/// The received-at time before which a delivery is expired at `now`.
pub fn cutoff_ms(now: UnixMs, retention: Duration) -> UnixMs {
    now - retention
}

/// Whether a delivery received at `received_at` is pruned at `now`. A delivery exactly
/// `retention` old is still kept.
pub fn is_expired(received_at: UnixMs, now: UnixMs, retention: Duration) -> bool {
    received_at < cutoff_ms(now, retention)
}

/// Deletes up to [`PRUNE_STEP_ROWS`] expired deliveries; returns how many. `is_expired`'s rule,
/// in SQL.
pub fn prune_step(conn: &Connection, now: UnixMs, retention: Duration) -> rusqlite::Result<usize> {
    conn.execute(
        "DELETE FROM deliveries WHERE id IN (
             SELECT id FROM deliveries WHERE received_at_ms < ?1 ORDER BY received_at_ms LIMIT ?2)",
        params![cutoff_ms(now, retention), PRUNE_STEP_ROWS],
    )
}

/// Parses `--retention`: a humantime duration (`72h`, `3days`) of at least [`MIN_RETENTION`].
pub fn parse_retention(text: &str) -> Result<Duration, String> {
    let retention = humantime::parse_duration(text)
        .map_err(|err| format!("{err} (write a duration such as 72h or 3days)"))?;
    if retention < MIN_RETENTION {
        return Err(format!(
            "{text} is shorter than the minimum of {}",
            humantime::format_duration(MIN_RETENTION)
        ));
    }
    Ok(retention)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_MS: i64 = 3600 * 1000;

    #[test]
    fn a_delivery_expires_only_once_older_than_the_retention() {
        let retention = Duration::from_secs(72 * 3600);
        let at = UnixMs::new;
        let now = 1_000 * HOUR_MS;
        assert!(!is_expired(at(now), at(now), retention));
        assert!(!is_expired(at(now - 72 * HOUR_MS), at(now), retention));
        assert!(is_expired(at(now - 72 * HOUR_MS - 1), at(now), retention));
        // A clock far in the past never underflows.
        assert!(!is_expired(at(0), at(5), retention));
        assert!(!is_expired(at(i64::MIN), at(i64::MIN), Duration::MAX));
    }

    #[test]
    fn a_prune_step_deletes_exactly_the_expired_rows_and_ids_are_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::store::open(dir.path()).unwrap();
        conn.execute(
            "INSERT INTO channels (name, ingest_id, smee_id, created_at) VALUES ('c', 'i', 's', 0)",
            [],
        )
        .unwrap();
        let retention = Duration::from_secs(3600);
        let now = 10 * HOUR_MS;
        for (guid, age) in [("old", HOUR_MS + 1), ("edge", HOUR_MS), ("new", 0)] {
            conn.execute(
                "INSERT INTO deliveries (channel, guid, received_at_ms, headers, body)
                 VALUES ('c', ?1, ?2, '{}', x'')",
                params![guid, now - age],
            )
            .unwrap();
        }
        assert_eq!(prune_step(&conn, UnixMs::new(now), retention).unwrap(), 1);
        assert_eq!(prune_step(&conn, UnixMs::new(now), retention).unwrap(), 0);
        let kept: Vec<String> = conn
            .prepare("SELECT guid FROM deliveries ORDER BY id")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, ["edge", "new"]);
        // Pruning the newest row must not let its id be given out again.
        assert_eq!(
            prune_step(&conn, UnixMs::new(now + 2 * HOUR_MS), retention).unwrap(),
            2
        );
        let next = crate::store::insert_delivery(
            &mut conn,
            &crate::store::NewDelivery {
                channel: "c".into(),
                guid: "later".into(),
                received_at_ms: UnixMs::new(now),
                headers: serde_json::Map::new(),
                body: bytes::Bytes::new(),
            },
            u64::MAX,
        )
        .unwrap();
        assert_eq!(next, crate::store::Inserted::New { id: 4, dropped: 0 });
    }

    #[test]
    fn retention_is_a_duration_of_at_least_a_minute() {
        assert_eq!(parse_retention("72h"), Ok(DEFAULT_RETENTION));
        assert_eq!(parse_retention("1m"), Ok(MIN_RETENTION));
        assert!(parse_retention("59s").is_err());
        assert!(parse_retention("soon").is_err());
    }
}
