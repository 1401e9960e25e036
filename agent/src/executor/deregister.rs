//! The one owner of "does this registration go, and how did its removal go?". Three rooms ask
//! it: a cleanup (an attempt's own runner, ended: [`super::effects`]), a launch whose runner
//! name GitHub already holds (a `409`: an earlier try of the same attempt registered it and its
//! answer was lost: [`super::launch`]), and the recovery's inventory reconciliation (a
//! registration named like ours that no live attempt owns: [`super::recovery`]). [`decide`] is
//! the pure rule (a table test below), [`remove`] carries a decision out through
//! [`Registry::deregister`] ([`remove_from_scale_set`] through a scale set's Actions service),
//! and [`busy_retry_at`] says when a removal GitHub refused because the runner is still busy is
//! tried again.

use std::time::Duration;

use rm_github::{GithubError, Target};
use rm_vocab::{RunnerId, UnixMs};

use super::registry::{Listed, Registry};

/// How long a deregistration GitHub refused with `422` (the runner is still busy with the job
/// it just finished: GitHub lets go of a finished ephemeral runner a moment after the job's
/// `completed`) waits before it is tried again.
pub(crate) const DEREGISTER_BUSY_RETRY: Duration = Duration::from_secs(3);

/// How long a runner may stay busy on GitHub after its conclusion before cleanup stops
/// waiting for it: the attempt is `cleaned` (its runtime and uid went before the first try:
/// [`super::cleanup`]), and the registration is left to the inventory reconciliation (and to
/// GitHub, which removes a finished ephemeral runner itself).
pub(crate) const DEREGISTER_BUSY_LIMIT: Duration = Duration::from_secs(5 * 60);

/// Why a registration is considered for removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// Its attempt ended and is being cleaned; `journalled` is the runner id the journal holds
    /// for it, tried when GitHub's listing could not be read.
    Ended { journalled: Option<RunnerId> },
    /// A launch's JIT request met a registration of its own name (a `409`).
    NameTaken,
    /// Named like this host's runners; `owned`: a live (or still launching) attempt owns it.
    Orphan { owned: bool },
}

/// What GitHub says of the registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Listed(Listed),
    NotListed,
    /// The listing could not be read.
    Unknown,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    Remove(RunnerId),
    Keep(Kept),
}

/// Why a registration stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// GitHub does not list it: nothing to remove.
    Gone,
    /// Neither GitHub's listing nor the journal says which registration it is.
    Unknown,
    /// A live attempt owns it.
    Owned,
    /// An orphan that is running a job: GitHub refuses to remove it, and it ends with its job.
    Busy,
}

/// Whether the registration goes. An ended attempt's own runner goes even while GitHub still
/// holds it busy (the `422` that answers is retried: [`busy_retry_at`]); an orphan that is busy
/// stays (it ends with its job); a registration a live attempt owns is never removed.
pub(super) fn decide(why: Why, seen: Seen) -> Decision {
    match (why, seen) {
        (Why::Orphan { owned: true }, _) => Decision::Keep(Kept::Owned),
        (Why::Orphan { owned: false }, Seen::Listed(listed)) if listed.busy => {
            Decision::Keep(Kept::Busy)
        }
        (_, Seen::Listed(listed)) => Decision::Remove(listed.runner_id),
        (_, Seen::NotListed) => Decision::Keep(Kept::Gone),
        (
            Why::Ended {
                journalled: Some(id),
            },
            Seen::Unknown,
        ) => Decision::Remove(id),
        (_, Seen::Unknown) => Decision::Keep(Kept::Unknown),
    }
}

/// What a DELETE of a registration came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deregistration {
    /// Removed, already gone, or nothing to remove.
    Settled,
    /// GitHub answered `422`: the runner is still running a job (its last one, finishing).
    Busy,
    /// Failed for a reason retrying soon will not fix (the inventory reconciliation tries again
    /// later).
    Failed,
}

/// How a DELETE's answer is taken.
pub(crate) fn deregistration(result: &Result<(), GithubError>) -> Deregistration {
    match result {
        Ok(()) => Deregistration::Settled,
        Err(GithubError::Unprocessable { .. }) => Deregistration::Busy,
        Err(_) => Deregistration::Failed,
    }
}

/// Removes registration `runner_id` of `target` and says how it went (logged here, once).
pub(super) async fn remove(
    registry: &Registry,
    target: &Target,
    runner_id: RunnerId,
    why: Why,
) -> Deregistration {
    let result = registry.deregister(target, runner_id).await;
    let outcome = deregistration(&result);
    let runner_id = runner_id.get();
    match (&result, why) {
        (Ok(()), Why::Orphan { .. }) => {
            tracing::info!(runner_id, target = %target, "removed a registration no live attempt owns");
        }
        (Ok(()), _) => tracing::info!(runner_id, "registration removed"),
        (Err(_), _) if outcome == Deregistration::Busy => tracing::info!(
            runner_id,
            "GitHub still holds the runner busy; removing its registration again shortly"
        ),
        (Err(e), _) => tracing::warn!(
            runner_id,
            error = %e,
            "cannot remove the registration; the inventory reconciliation retries"
        ),
    }
    outcome
}

/// How a removal through a scale set's Actions service went: a runner still busy with its job
/// (`JobStillRunningException`, by its name whatever the status code) is [`Deregistration::Busy`]
/// as a `422` is on the REST path; the client counts one already gone as removed.
pub(crate) fn scale_set_deregistration(
    result: &Result<(), rm_github::scaleset::ScaleSetError>,
) -> Deregistration {
    match result {
        Ok(()) => Deregistration::Settled,
        Err(rm_github::scaleset::ScaleSetError::JobStillRunning { .. }) => Deregistration::Busy,
        Err(_) => Deregistration::Failed,
    }
}

/// Removes a scale set's runner through its Actions service, by its journalled id.
pub(super) async fn remove_from_scale_set(
    source: &crate::scaleset::Source,
    runner_id: RunnerId,
) -> Deregistration {
    let id = u64::try_from(runner_id.get()).unwrap_or_default();
    let result = source.client.remove_runner(id).await;
    let outcome = scale_set_deregistration(&result);
    match (&result, outcome) {
        (Ok(()), _) => {
            tracing::info!(runner_id = id, scale_set = %source.set.name, "scale-set runner removed");
        }
        (_, Deregistration::Busy) => tracing::info!(
            runner_id = id,
            "the scale set still holds the runner busy; removing it again shortly"
        ),
        (Err(e), _) => tracing::warn!(
            runner_id = id,
            error = %e,
            "cannot remove the scale-set runner; its cleanup tries again"
        ),
    }
    outcome
}

/// Removes an ended attempt's scale-set runner through the scale set's Actions service: by its
/// journalled id, or, with none journalled (a launch that gave up after the JIT request, its
/// answer lost or not yet journalled), by its name looked up through the service. Which one
/// goes is [`decide`]'s, as for a REST registration; no REST request is made.
pub(super) async fn remove_ended_from_scale_set(
    source: &crate::scaleset::Source,
    runner_name: &str,
    journalled: Option<RunnerId>,
) -> Deregistration {
    let seen = match journalled {
        // The service removes by id, and counts one already gone as removed.
        Some(_) => Seen::Unknown,
        None => match source.client.find_runner(runner_name).await {
            Ok(Some(found)) => Seen::Listed(Listed {
                runner_id: RunnerId::try_from(found.id).unwrap_or(RunnerId::new(0)),
                registered: true,
                busy: false,
            }),
            Ok(None) => Seen::NotListed,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look the scale-set runner up by name; trying again");
                return Deregistration::Failed;
            }
        },
    };
    match decide(Why::Ended { journalled }, seen) {
        Decision::Remove(runner_id) => remove_from_scale_set(source, runner_id).await,
        Decision::Keep(_) => Deregistration::Settled,
    }
}

/// After a `422` on deregistration: when to try again, or `None` once
/// the runner has been busy past [`DEREGISTER_BUSY_LIMIT`] since `first_busy_ms` (give up
/// waiting; the attempt is `cleaned` anyway).
pub(crate) fn busy_retry_at(first_busy_ms: UnixMs, now_ms: UnixMs) -> Option<UnixMs> {
    let limit = rm_vocab::millis(DEREGISTER_BUSY_LIMIT);
    (now_ms.saturating_sub(first_busy_ms) < limit).then(|| now_ms + DEREGISTER_BUSY_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(id: i64, busy: bool) -> Seen {
        Seen::Listed(Listed {
            runner_id: RunnerId::new(id),
            registered: true,
            busy,
        })
    }

    #[test]
    fn which_registration_goes() {
        let ended = Why::Ended {
            journalled: Some(RunnerId::new(9)),
        };
        let ended_unjournalled = Why::Ended { journalled: None };
        let orphan = Why::Orphan { owned: false };
        let owned = Why::Orphan { owned: true };
        let remove = |id| Decision::Remove(RunnerId::new(id));
        for (why, seen, decision) in [
            // An ended attempt's runner goes, busy or not (a 422 is retried), by the listed id.
            (ended, listed(1, false), remove(1)),
            (ended, listed(1, true), remove(1)),
            (ended, Seen::NotListed, Decision::Keep(Kept::Gone)),
            // The listing unknown: by the journalled id (a 404 is fine), else not at all.
            (ended, Seen::Unknown, remove(9)),
            (
                ended_unjournalled,
                Seen::Unknown,
                Decision::Keep(Kept::Unknown),
            ),
            // A name a launch met goes (it is its own, from a try whose answer was lost).
            (Why::NameTaken, listed(2, false), remove(2)),
            (Why::NameTaken, listed(2, true), remove(2)),
            (Why::NameTaken, Seen::NotListed, Decision::Keep(Kept::Gone)),
            (Why::NameTaken, Seen::Unknown, Decision::Keep(Kept::Unknown)),
            // An orphan goes unless it runs a job; what a live attempt owns never goes.
            (orphan, listed(3, false), remove(3)),
            (orphan, listed(3, true), Decision::Keep(Kept::Busy)),
            (owned, listed(4, false), Decision::Keep(Kept::Owned)),
            (owned, listed(4, true), Decision::Keep(Kept::Owned)),
            (orphan, Seen::Unknown, Decision::Keep(Kept::Unknown)),
        ] {
            assert_eq!(decide(why, seen), decision, "{why:?} {seen:?}");
        }
    }

    #[test]
    fn a_scale_set_s_busy_runner_is_named_by_its_exception_whatever_the_status() {
        use rm_github::scaleset::ScaleSetError;
        let busy = ScaleSetError::JobStillRunning {
            message: "JobStillRunningException".into(),
        };
        let refused = ScaleSetError::Service {
            endpoint: "agents.remove",
            status: 400,
            type_name: "SomethingElseException".into(),
            message: String::new(),
        };
        for (result, outcome) in [
            (Ok(()), Deregistration::Settled),
            (Err(busy), Deregistration::Busy),
            (Err(refused), Deregistration::Failed),
        ] {
            assert_eq!(scale_set_deregistration(&result), outcome, "{result:?}");
        }
    }

    #[test]
    fn a_busy_runner_is_deregistered_again_soon_until_the_limit() {
        let busy: Result<(), GithubError> = Err(GithubError::Unprocessable {
            endpoint: "orgs.runners.delete",
            message: "Bad request - Runner \"x\" is still running a job".into(),
        });
        assert_eq!(deregistration(&busy), Deregistration::Busy);
        assert_eq!(deregistration(&Ok(())), Deregistration::Settled);
        let server: Result<(), GithubError> = Err(GithubError::Server {
            endpoint: "orgs.runners.delete",
            status: 502,
            message: String::new(),
        });
        assert_eq!(deregistration(&server), Deregistration::Failed);
        let retry = i64::try_from(DEREGISTER_BUSY_RETRY.as_millis()).unwrap_or(0);
        let limit = i64::try_from(DEREGISTER_BUSY_LIMIT.as_millis()).unwrap_or(0);
        let at = UnixMs::new;
        assert_eq!(busy_retry_at(at(1_000), at(1_000)), Some(at(1_000 + retry)));
        assert_eq!(
            busy_retry_at(at(1_000), at(1_000 + limit - 1)),
            Some(at(1_000 + limit - 1 + retry))
        );
        assert_eq!(busy_retry_at(at(1_000), at(1_000 + limit)), None);
    }
}
