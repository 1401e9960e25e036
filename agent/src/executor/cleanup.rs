//! The order of a concluded attempt's cleanup, as one pure rule ([`next`]) that
//! [`super::effects`] carries out a step at a time: first the host's part (what is left of the
//! runner killed, its logs kept, its runtime removed, then the release journalled, which frees
//! its runner uid), then GitHub's (its registration removed, retried while GitHub holds the
//! runner busy), then `cleaned`.
//!
//! The release comes first for every concluded runner, whoever ended it (its own exit, a
//! `disk_exceeded`, idle or ghost stop, a scale-down, a failed launch): the backend's clean is
//! what proves its processes gone (the cgroup killed, every process of the uid killed), and
//! from then on nothing of the host waits on GitHub. The registration is GitHub's; holding the
//! uid or the runtime while GitHub holds the runner busy (up to
//! [`super::deregister::DEREGISTER_BUSY_LIMIT`]) protects nothing and kept a job that filled
//! the disk filling it, and its uid out of the pool, for minutes (issue 38).
//!
//! Each step is idempotent and the release is journalled only after the effect it records
//! (`released_at`), so an agent killed between any two steps finds, at its next start, either
//! an attempt not released (the whole cleanup again: killing and removing what is already gone
//! is harmless, and the uid is still its own) or a released one (its registration only: a
//! released attempt never touches its uid, which may be another runner's by then).

use rm_vocab::UnixMs;

use super::deregister;

/// Where a concluded attempt's registration stands, as far as its cleanup knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Registration {
    /// Not tried by this cleanup yet.
    Untried,
    /// Removed, already gone, or nothing this host may remove (no target: the policy is no
    /// longer configured).
    Settled,
    /// GitHub still holds the runner busy (a `422`, or a scale set's
    /// `JobStillRunningException`), since `first`.
    Busy { first: UnixMs },
    /// The removal failed otherwise. `retried_here`: nothing else removes it (a scale set's
    /// runner: no REST inventory reconciliation covers it), so this cleanup tries again later;
    /// otherwise the inventory reconciliation does.
    Failed { retried_here: bool },
}

/// What a cleanup does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Stop what is left of the runner, keep its logs, have its backend kill its cgroup and
    /// its uid's processes and remove its runtime, then journal the release (its uid free).
    Release,
    /// Remove the registration (or try again).
    Deregister,
    /// GitHub holds the runner busy (since `first`): try the registration again at `next` (the
    /// attempt stays released and uncleaned meanwhile).
    DeregisterAt { first: UnixMs, next: UnixMs },
    /// The registration could not be removed and only this cleanup will: tried again after
    /// the cleanup's back-off.
    RetryLater,
    /// Journal `cleaned`: nothing of the runner is left on the host, and its registration is
    /// removed or left to what removes it (the inventory reconciliation, GitHub itself).
    Finish,
}

/// The next step of a concluded attempt's cleanup: `released` is what the journal says (or this
/// cleanup just journalled), `registration` how its removal went so far, `now` the time.
pub(super) fn next(released: bool, registration: Registration, now: UnixMs) -> Step {
    match (released, registration) {
        // The host's part first, whatever GitHub says of the registration.
        (false, _) => Step::Release,
        (true, Registration::Untried) => Step::Deregister,
        (true, Registration::Settled) => Step::Finish,
        (true, Registration::Busy { first }) => match deregister::busy_retry_at(first, now) {
            Some(next) => Step::DeregisterAt { first, next },
            // Busy past the limit: given up on here, left to the inventory reconciliation and
            // to GitHub (which removes a finished ephemeral runner itself).
            None => Step::Finish,
        },
        (true, Registration::Failed { retried_here: true }) => Step::RetryLater,
        (
            true,
            Registration::Failed {
                retried_here: false,
            },
        ) => Step::Finish,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::deregister::{DEREGISTER_BUSY_LIMIT, DEREGISTER_BUSY_RETRY};

    #[test]
    fn a_concluded_runner_is_released_before_its_registration_is_waited_for() {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let (first, now) = (UnixMs::new(1_000), UnixMs::new(61_000));
        let past_limit = first + DEREGISTER_BUSY_LIMIT;
        use Registration::*;
        use Step::*;
        for (released, registration, at, step) in [
            // Not released: the host's part comes first, whatever GitHub said (a cleanup run
            // again after a crash, or after GitHub answered busy before this rule).
            (false, Untried, now, Release),
            (false, Busy { first }, now, Release),
            (false, Busy { first }, past_limit, Release),
            (false, Settled, now, Release),
            (false, Failed { retried_here: true }, now, Release),
            (
                false,
                Failed {
                    retried_here: false,
                },
                now,
                Release,
            ),
            // Released: only the registration is left.
            (true, Untried, now, Deregister),
            (true, Settled, now, Finish),
            (
                true,
                Busy { first },
                now,
                DeregisterAt {
                    first,
                    next: UnixMs::new(61_000 + ms(DEREGISTER_BUSY_RETRY)),
                },
            ),
            (true, Busy { first }, past_limit, Finish),
            (true, Failed { retried_here: true }, now, RetryLater),
            (
                true,
                Failed {
                    retried_here: false,
                },
                now,
                Finish,
            ),
        ] {
            assert_eq!(
                next(released, registration, at),
                step,
                "released={released} {registration:?} at {at:?}"
            );
        }
    }
}
