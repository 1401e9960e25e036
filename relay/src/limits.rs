//! What the relay's unauthenticated ingest may cost it: a storage quota per channel and a
//! delivery rate per channel, with the pure decisions behind both (which acknowledged
//! deliveries make room for a new one, whether a delivery may come in now) and the parsing of
//! their `serve` flags. Anyone holding a channel's ingest URL can post to it; these bound what
//! that costs in disk and in writer time, and a refusal is always a failed delivery GitHub
//! records (and rm-agent's redelivery recovers), never a delivery dropped after a 2xx.

use std::time::{Duration, Instant};

use rm_http_serve::budget::BodyLimits;

use crate::MAX_BODY_BYTES;

/// Bytes of bodies and headers one channel may keep unless `serve --channel-quota` says
/// otherwise: months of an ordinary organisation's `workflow_job` traffic.
pub const DEFAULT_CHANNEL_QUOTA: u64 = 1024 * 1024 * 1024;
/// The smallest quota `serve` accepts: room for the largest delivery GitHub sends and its
/// headers, so no delivery is refused only for its size.
pub const MIN_CHANNEL_QUOTA: u64 = MAX_BODY_BYTES as u64 + 1024 * 1024;
/// Deliveries per second one channel may bring in over time unless `serve --ingest-rate` says
/// otherwise; well above what one GitHub App sends even for large matrices.
pub const DEFAULT_INGEST_RATE: u32 = 50;
/// A channel may bring in this many seconds' worth of its rate at once (a burst of queued jobs).
pub const INGEST_BURST_SECONDS: u32 = 10;
/// The `Retry-After` of a delivery refused because its channel's quota holds only deliveries
/// some host has not acknowledged yet: about how long a connected host takes to catch up.
pub const QUOTA_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The limits `serve` applies to every channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// The largest body taken.
    pub max_body_bytes: usize,
    /// Bytes of bodies and headers a channel may keep.
    pub channel_quota: u64,
    /// Deliveries per second a channel may bring in over time (0: no limit).
    pub ingest_rate: u32,
    /// The bytes ingest bodies may hold while they stream in and until they are stored: the
    /// receiver's budget ([`rm_http_serve::budget`]), a 64 KiB allowance per request and a
    /// shared pool (`serve --body-pool`, default 192 MiB); a body the pool cannot grow is
    /// refused 503 with `Retry-After`.
    pub bodies: BodyLimits,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_body_bytes: MAX_BODY_BYTES,
            channel_quota: DEFAULT_CHANNEL_QUOTA,
            ingest_rate: DEFAULT_INGEST_RATE,
            bodies: BodyLimits::default(),
        }
    }
}

/// What storing a delivery of `incoming` bytes on a channel that keeps `used` bytes takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Room {
    /// It fits as things are.
    Fits,
    /// It fits once the acknowledged deliveries up to this id (inclusive) are dropped.
    DropThrough { last_id: i64, count: usize },
    /// It does not fit even with every acknowledged delivery dropped: refuse it.
    Full,
}

/// Decides how to make room: the oldest acknowledged deliveries go first, and only as many as
/// needed; an unacknowledged delivery is never dropped. `acknowledged` is the channel's
/// acknowledged deliveries oldest first as `(id, stored bytes)`; it is read only as far as
/// needed.
pub fn make_room(
    used: u64,
    quota: u64,
    incoming: u64,
    acknowledged: impl IntoIterator<Item = (i64, u64)>,
) -> Room {
    let needed = used.saturating_add(incoming);
    if needed <= quota {
        return Room::Fits;
    }
    if incoming > quota {
        return Room::Full;
    }
    let mut freed = 0u64;
    for (dropped, (id, bytes)) in acknowledged.into_iter().enumerate() {
        freed = freed.saturating_add(bytes);
        if needed.saturating_sub(freed) <= quota {
            return Room::DropThrough {
                last_id: id,
                count: dropped + 1,
            };
        }
    }
    Room::Full
}

/// One channel's ingest rate: a token bucket of `rate` per second holding at most
/// `rate * INGEST_BURST_SECONDS`, starting full.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(rate: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: burst(rate),
            at: now,
        }
    }

    /// Takes one delivery's token at `now`, or says how long until one is there.
    pub fn take(&mut self, rate: u32, now: Instant) -> Result<(), Duration> {
        if rate == 0 {
            return Ok(());
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(rate)).min(burst(rate));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - self.tokens) / f64::from(rate),
            ))
        }
    }
}

fn burst(rate: u32) -> f64 {
    f64::from(rate) * f64::from(INGEST_BURST_SECONDS)
}

/// Whole seconds for a `Retry-After` header: at least 1, rounded up.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// Parses `--channel-quota`: bytes, or a number with `KiB`, `MiB`, `GiB` or `TiB` (also `K`,
/// `M`, `G`, `T`, all powers of 1024), of at least [`MIN_CHANNEL_QUOTA`].
pub fn parse_quota(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    if bytes < MIN_CHANNEL_QUOTA {
        return Err(format!(
            "{text} is below the minimum of {} MiB (the largest delivery and its headers)",
            MIN_CHANNEL_QUOTA >> 20
        ));
    }
    Ok(bytes)
}

/// Parses `--body-pool`: a size as [`parse_quota`] takes it, any amount (0: every body past
/// its allowance is refused for memory; a body of GitHub's usual size still fits its allowance).
pub fn parse_body_pool(text: &str) -> Result<usize, String> {
    let bytes = parse_size(text)?;
    usize::try_from(bytes).map_err(|_| format!("{text} is larger than this machine can address"))
}

fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return Err(format!("{text:?} is not a size: write e.g. 512MiB or 2GiB")),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a size: write e.g. 512MiB or 2GiB"))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_made_from_the_oldest_acknowledged_deliveries_and_only_as_much_as_needed() {
        let acked = [(1, 10), (2, 10), (5, 30)];
        assert_eq!(make_room(50, 100, 50, acked), Room::Fits);
        assert_eq!(
            make_room(95, 100, 10, acked),
            Room::DropThrough {
                last_id: 1,
                count: 1
            }
        );
        assert_eq!(
            make_room(100, 100, 25, acked),
            Room::DropThrough {
                last_id: 5,
                count: 3
            }
        );
        // Everything acknowledged is not enough: the rest is unacknowledged and stays.
        assert_eq!(make_room(100, 100, 51, acked), Room::Full);
        assert_eq!(make_room(100, 100, 1, []), Room::Full);
        // Larger than the whole quota: never fits.
        assert_eq!(make_room(0, 100, 101, acked), Room::Full);
        assert_eq!(make_room(u64::MAX, 100, 1, acked), Room::Full);
    }

    #[test]
    fn room_reads_no_more_acknowledged_deliveries_than_it_drops() {
        let mut read = 0;
        let acked = (1..).map(|id| {
            read += 1;
            (id, 10)
        });
        assert_eq!(
            make_room(100, 100, 20, acked),
            Room::DropThrough {
                last_id: 2,
                count: 2
            }
        );
        assert_eq!(read, 2);
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate_and_says_when_to_retry() {
        let start = Instant::now();
        let mut bucket = Bucket::new(2, start);
        for _ in 0..2 * INGEST_BURST_SECONDS {
            assert_eq!(bucket.take(2, start), Ok(()));
        }
        let wait = bucket.take(2, start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(retry_after_secs(wait), 1);
        let later = start + Duration::from_millis(500);
        assert_eq!(bucket.take(2, later), Ok(()));
        assert!(bucket.take(2, later).is_err());
        // Idle time refills only up to the burst.
        let much_later = later + Duration::from_secs(3600);
        for _ in 0..2 * INGEST_BURST_SECONDS {
            assert_eq!(bucket.take(2, much_later), Ok(()));
        }
        assert!(bucket.take(2, much_later).is_err());
        // A rate of 0 is no limit.
        assert_eq!(Bucket::new(0, start).take(0, start), Ok(()));
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(QUOTA_RETRY_AFTER), 60);
    }

    #[test]
    fn a_quota_is_a_size_of_at_least_the_largest_delivery() {
        assert_eq!(parse_quota("1GiB"), Ok(DEFAULT_CHANNEL_QUOTA));
        assert_eq!(parse_quota("512M"), Ok(512 << 20));
        assert_eq!(parse_quota("27262976"), Ok(MIN_CHANNEL_QUOTA));
        assert_eq!(parse_quota("26 MiB"), Ok(MIN_CHANNEL_QUOTA));
        for bad in ["25MiB", "1.5GiB", "lots", "", "-1G", "99999999999T"] {
            assert!(parse_quota(bad).is_err(), "{bad}");
        }
    }
}
