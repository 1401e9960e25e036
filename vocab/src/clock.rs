//! The wall clock, behind a trait so that what depends on the time of day (token expiry, JWT
//! claims, rate-limit resets, the executor's fences and back-offs, the poller's schedule) is
//! tested without waiting. Short waits (request spacing, retry sleeps) use tokio's clock instead,
//! which tests pause.
//!
//! It answers [`UnixMs`], the instant every crate stores and passes (the journal's rows, the
//! executor's decisions, the relay's store), so a reading needs no conversion before it is
//! journalled or compared with a row. A caller doing `Duration` arithmetic against a
//! [`SystemTime`] (the GitHub client's budget windows, against GitHub's own headers) converts
//! once where it reads, with [`UnixMs::to_system_time`]; nothing rm does needs a finer grain than
//! the millisecond the journal keeps.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::UnixMs;

/// Where a component reads the time of day.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> UnixMs;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// Now, on the real clock ([`SystemClock`]): for code with no clock to inject (the relay, a
/// command's single reading).
pub fn now() -> UnixMs {
    UnixMs::from_system_time(SystemTime::now())
}

impl Clock for SystemClock {
    fn now(&self) -> UnixMs {
        now()
    }
}

/// A clock that only moves when told to; starts at the real time so that a fake GitHub checking
/// JWTs against its own clock still accepts them. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<UnixMs>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    pub fn new() -> Self {
        Self {
            now: Arc::new(Mutex::new(now())),
        }
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = *now + by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMs {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_share_it() {
        let clock = ManualClock::new();
        let copy = clock.clone();
        let start = clock.now();
        assert_eq!(clock.now(), start);
        copy.advance(Duration::from_millis(1_500));
        assert_eq!(clock.now(), start + Duration::from_millis(1_500));
    }

    #[test]
    fn the_system_clock_reads_the_time_of_day() {
        // 2023-11-14: any real clock is past it.
        assert!(now() > UnixMs::new(1_700_000_000_000));
        assert!(SystemClock.now() >= UnixMs::new(1_700_000_000_000));
    }
}
