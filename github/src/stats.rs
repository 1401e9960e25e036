//! What `status` and `/metrics` report about GitHub beyond the budget: whether it answered
//! lately, how many requests each endpoint got by status, and how many JIT registrations each
//! App's installation made.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

/// Status recorded for a request that got no answer (connection failure, timeout).
pub const NO_ANSWER: u16 = 0;

/// Whether GitHub answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Contact {
    /// When GitHub last answered anything (any status).
    pub last_contact_at: Option<SystemTime>,
    /// False after a request got no answer, until the next answer.
    pub reachable: bool,
}

/// Request counts keyed by endpoint name and status.
type Counts = BTreeMap<(&'static str, u16), u64>;

/// Requests by endpoint and status, and the last contact.
#[derive(Debug, Default)]
pub struct Stats {
    inner: Mutex<(Contact, Counts)>,
    /// JIT registrations GitHub issued, by (App, installation).
    registrations: Mutex<BTreeMap<(u64, u64), u64>>,
}

impl Stats {
    pub fn answered(&self, endpoint: &'static str, status: u16, now: SystemTime) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.0 = Contact {
            last_contact_at: Some(now),
            reachable: true,
        };
        *g.1.entry((endpoint, status)).or_default() += 1;
    }

    pub fn unanswered(&self, endpoint: &'static str) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.0.reachable = false;
        *g.1.entry((endpoint, NO_ANSWER)).or_default() += 1;
    }

    pub fn contact(&self) -> Contact {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// One JIT registration issued through App `app`'s `installation`.
    pub fn registered(&self, app: u64, installation: u64) {
        let mut g = self
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *g.entry((app, installation)).or_default() += 1;
    }

    /// `(app, installation, registrations)`, sorted.
    pub fn registrations(&self) -> Vec<(u64, u64, u64)> {
        let g = self
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        g.iter().map(|((a, i), n)| (*a, *i, *n)).collect()
    }

    /// `(endpoint, status, count)`, sorted; status [`NO_ANSWER`] counts requests without one.
    pub fn requests(&self) -> Vec<(&'static str, u16, u64)> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.1.iter().map(|((e, s), n)| (*e, *s, *n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contact_follows_the_latest_outcome() {
        let s = Stats::default();
        assert_eq!(s.contact(), Contact::default());
        let t = SystemTime::UNIX_EPOCH;
        s.answered("a", 200, t);
        s.answered("a", 200, t);
        s.unanswered("a");
        assert_eq!(
            s.contact(),
            Contact {
                last_contact_at: Some(t),
                reachable: false
            }
        );
        s.answered("b", 404, t);
        assert!(s.contact().reachable);
        assert_eq!(s.requests(), [("a", 0, 1), ("a", 200, 2), ("b", 404, 1)]);
    }

    #[test]
    fn registrations_are_counted_per_app_and_installation() {
        let s = Stats::default();
        s.registered(2, 20);
        s.registered(1, 10);
        s.registered(2, 20);
        assert_eq!(s.registrations(), [(1, 10, 1), (2, 20, 2)]);
    }
}
