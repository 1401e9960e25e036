//! The wall clock as rm stores it: milliseconds since the Unix epoch in an `i64` (what SQLite's
//! INTEGER holds), and durations in the same unit. Conversions saturate instead of failing: a
//! time before 1970 is 0 and a duration too long for an `i64` is `i64::MAX`, which every caller
//! compares safely.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// `t` as milliseconds since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The inverse of [`unix_ms`] (a negative time is the epoch).
pub fn from_unix_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `d` in milliseconds, saturating at `i64::MAX`.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip_and_saturate() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(unix_ms(t), 1_700_000_000_123);
        assert_eq!(from_unix_ms(1_700_000_000_123), t);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(from_unix_ms(-5), UNIX_EPOCH);
        assert_eq!(ms(Duration::from_secs(3)), 3_000);
        assert_eq!(ms(Duration::MAX), i64::MAX);
        assert!(now_ms() > 1_700_000_000_000);
    }
}
