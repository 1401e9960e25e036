//! The time that crosses crates: [`UnixMs`], a wall-clock instant in milliseconds since the Unix
//! epoch. The handlers date observations with it, the journal keeps it (SQLite's `INTEGER`,
//! PostgreSQL's `BIGINT`) and hands it back in its rows, the clock ([`crate::Clock`]) answers it,
//! and the agent plans, explains and reports with it; one type, so an instant cannot be passed
//! where a duration or an id is wanted.
//!
//! It follows the ids ([`crate::JobId`]): a signed 64-bit integer that prints, and serializes, as
//! the plain number, so JSON output and log lines are what they were before the type. It converts
//! to and from [`SystemTime`] here and nowhere else, saturating instead of failing: a time before
//! 1970 is the epoch, one past `i64::MAX` milliseconds is `i64::MAX`; moving it by a [`Duration`]
//! saturates the same way (where `SystemTime + Duration` would panic). With the `rusqlite` feature
//! (the journal's) it binds and reads as a SQLite integer; the PostgreSQL code binds `t.get()` and
//! reads `UnixMs::new(row.get(i))` at its edge. It is read from RFC 3339 (GitHub's dates) and
//! written as it (rm's output) in `timestamp.rs`, and nowhere else.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// An instant, in milliseconds since the Unix epoch (as the journal stores it).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixMs(i64);

impl UnixMs {
    /// The Unix epoch.
    pub const EPOCH: Self = Self(0);

    /// The instant this many milliseconds after the epoch (as the journal stores it).
    pub const fn new(ms: i64) -> Self {
        Self(ms)
    }

    /// The milliseconds since the epoch, as the journal stores them.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// `t`, saturating: the epoch for a time before it, `i64::MAX` past what an `i64` holds.
    pub fn from_system_time(t: SystemTime) -> Self {
        Self(
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// The inverse of [`UnixMs::from_system_time`] (a negative time is the epoch).
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(u64::try_from(self.0).unwrap_or(0))
    }

    /// Milliseconds from `earlier` to `self` (negative when `earlier` is later), saturating.
    pub const fn saturating_sub(self, earlier: Self) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The time from `earlier` to `self`; zero when `earlier` is later.
    pub fn duration_since(self, earlier: Self) -> Duration {
        Duration::from_millis(u64::try_from(self.saturating_sub(earlier)).unwrap_or(0))
    }

    /// This instant moved by `ms` milliseconds (back when negative), saturating.
    pub const fn saturating_add_ms(self, ms: i64) -> Self {
        Self(self.0.saturating_add(ms))
    }
}

/// `d` in milliseconds, the unit of [`UnixMs`], saturating at `i64::MAX`: for arithmetic that
/// stays in milliseconds inside one crate (a deadline kept as a journal column, a table of ages).
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `d` later, saturating.
impl Add<Duration> for UnixMs {
    type Output = Self;

    fn add(self, d: Duration) -> Self {
        self.saturating_add_ms(millis(d))
    }
}

/// `d` earlier, saturating.
impl Sub<Duration> for UnixMs {
    type Output = Self;

    fn sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(millis(d)))
    }
}

impl fmt::Display for UnixMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The plain number, as `{:?}` of an `i64` printed it.
impl fmt::Debug for UnixMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<SystemTime> for UnixMs {
    fn from(t: SystemTime) -> Self {
        Self::from_system_time(t)
    }
}

impl From<UnixMs> for SystemTime {
    fn from(t: UnixMs) -> Self {
        t.to_system_time()
    }
}

#[cfg(feature = "rusqlite")]
impl rusqlite::types::ToSql for UnixMs {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

#[cfg(feature = "rusqlite")]
impl rusqlite::types::FromSql for UnixMs {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        i64::column_result(value).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_and_serializes_as_the_plain_number() {
        let t = UnixMs::new(1_700_000_000_123);
        assert_eq!(t.to_string(), "1700000000123");
        assert_eq!(format!("{t:?}"), "1700000000123");
        assert_eq!(format!("{:?}", Some(t)), "Some(1700000000123)");
        assert_eq!(
            serde_json::to_string(&t).ok().as_deref(),
            Some("1700000000123")
        );
        assert_eq!(
            serde_json::from_str::<UnixMs>("5").ok(),
            Some(UnixMs::new(5))
        );
    }

    #[test]
    fn system_time_conversions_round_trip_and_saturate() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(UnixMs::from(t), UnixMs::new(1_700_000_000_123));
        assert_eq!(SystemTime::from(UnixMs::new(1_700_000_000_123)), t);
        assert_eq!(
            UnixMs::from_system_time(UNIX_EPOCH - Duration::from_secs(1)),
            UnixMs::EPOCH
        );
        assert_eq!(UnixMs::new(-5).to_system_time(), UNIX_EPOCH);
    }

    #[test]
    fn durations_move_it_and_saturate() {
        let t = UnixMs::new(10_000);
        assert_eq!(t + Duration::from_millis(1_500), UnixMs::new(11_500));
        assert_eq!(t - Duration::from_secs(3), UnixMs::new(7_000));
        // Sub-millisecond parts are dropped, as the journal drops them.
        assert_eq!(t + Duration::from_micros(1_999), UnixMs::new(10_001));
        assert_eq!(t + Duration::MAX, UnixMs::new(i64::MAX));
        assert_eq!(
            UnixMs::new(i64::MIN + 1) - Duration::MAX,
            UnixMs::new(i64::MIN)
        );
        assert_eq!(millis(Duration::from_secs(3)), 3_000);
        assert_eq!(millis(Duration::MAX), i64::MAX);
    }

    #[test]
    fn differences_saturate() {
        let (a, b) = (UnixMs::new(1_000), UnixMs::new(4_000));
        assert_eq!(b.saturating_sub(a), 3_000);
        assert_eq!(a.saturating_sub(b), -3_000);
        assert_eq!(b.duration_since(a), Duration::from_secs(3));
        assert_eq!(a.duration_since(b), Duration::ZERO);
        assert_eq!(
            UnixMs::new(i64::MAX).saturating_add_ms(1),
            UnixMs::new(i64::MAX)
        );
        assert_eq!(
            UnixMs::new(i64::MIN).saturating_sub(UnixMs::new(1)),
            i64::MIN
        );
    }
}
