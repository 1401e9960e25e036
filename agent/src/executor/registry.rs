//! The executor's view of GitHub's runner registry: JIT registration with its retry rules,
//! what GitHub lists for a target, and deregistration. A thin adapter over `rm-github`; the
//! rules it applies (what is terminal, what a 409 means) are pure functions below.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rm_github::types::{JitConfig, JitRequest, Runner};
use rm_github::{GithubClient, GithubError, Target};
use rm_journal::RunnerId;

use crate::lifecycle::GithubObservation;

/// The work folder every JIT runner gets (CONTRACT §5).
pub(crate) const WORK_FOLDER: &str = "_work";

/// How a failed JIT request is handled next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JitRetry {
    /// Never retried: credentials or permissions are wrong; the detail says which.
    Terminal,
    /// A registration with this name already exists (a crashed attempt's): remove it, retry.
    RemoveStaleName,
    /// Try again, not before this time when GitHub named one.
    Later(Option<SystemTime>),
}

/// Decides what a JIT failure leads to.
pub(crate) fn jit_retry(error: &GithubError) -> JitRetry {
    match error {
        GithubError::Unauthorized { .. }
        | GithubError::Forbidden { .. }
        | GithubError::NotFound { .. }
        | GithubError::Unprocessable { .. } => JitRetry::Terminal,
        GithubError::Conflict { .. } => JitRetry::RemoveStaleName,
        GithubError::RateLimited { retry_at, .. } => JitRetry::Later(Some(*retry_at)),
        GithubError::Server { .. }
        | GithubError::Unreachable { .. }
        | GithubError::Unexpected { .. } => JitRetry::Later(None),
    }
}

/// One runner as GitHub lists it, reduced to what supervision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub runner_id: RunnerId,
    /// The runner process connected (`online`) or has a job.
    pub registered: bool,
    pub busy: bool,
}

impl From<&Runner> for Listed {
    fn from(runner: &Runner) -> Self {
        Listed {
            runner_id: runner.id,
            registered: runner.status == "online" || runner.busy,
            busy: runner.busy,
        }
    }
}

/// A target's runners by name, or why they could not be read.
pub(crate) type Listing = Result<HashMap<String, Listed>, GithubError>;

/// What the lifecycle decision sees of one runner name in a listing. A JIT registration that
/// no process has connected to yet is listed `offline`: not registered for the decision (the
/// registration timeout still runs), but still listed for deregistration.
pub(crate) fn observation(listing: &Listing, runner_name: &str) -> GithubObservation {
    match listing {
        Err(_) => GithubObservation::Unreachable,
        Ok(runners) => match runners.get(runner_name) {
            Some(listed) if listed.registered => {
                GithubObservation::Registered { busy: listed.busy }
            }
            _ => GithubObservation::NotRegistered,
        },
    }
}

/// GitHub's runner registry, through the App's installation tokens.
#[derive(Debug, Clone)]
pub struct Registry {
    client: GithubClient,
}

impl Registry {
    pub fn new(client: GithubClient) -> Self {
        Registry { client }
    }

    pub fn client(&self) -> &GithubClient {
        &self.client
    }

    /// One `generate-jitconfig` call.
    pub async fn generate(
        &self,
        target: &Target,
        request: &JitRequest,
    ) -> Result<JitConfig, GithubError> {
        self.client.generate_jitconfig(target, request).await
    }

    /// Removes the registration called `name`, if there is one (after a 409).
    pub async fn remove_by_name(&self, target: &Target, name: &str) -> Result<(), GithubError> {
        if let Some(runner) = self.client.find_runner_by_name(target, name).await? {
            self.deregister(target, runner.id).await?;
        }
        Ok(())
    }

    /// The target's runners (a conditional request: an unchanged list costs no quota).
    pub async fn list(&self, target: &Target) -> Listing {
        let polled = self.client.list_runners(target).await?;
        Ok(polled
            .value
            .iter()
            .map(|r| (r.name.clone(), Listed::from(r)))
            .collect())
    }

    /// Removes a registration; one that is already gone is fine. A `422` (still busy) is the
    /// caller's to retry: see [`deregistration`].
    pub async fn deregister(
        &self,
        target: &Target,
        runner_id: RunnerId,
    ) -> Result<(), GithubError> {
        match self.client.delete_runner(target, runner_id).await {
            Ok(()) | Err(GithubError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// How long a deregistration GitHub refused with `422` (the runner is still busy with the job
/// it just finished: GitHub lets go of a finished ephemeral runner a moment after the job's
/// `completed`) waits before it is tried again.
pub(crate) const DEREGISTER_BUSY_RETRY: Duration = Duration::from_secs(3);

/// How long a runner may stay busy on GitHub after its conclusion before cleanup stops
/// waiting for it: the workspace goes, and the registration is left to the inventory
/// reconciliation (and to GitHub, which removes a finished ephemeral runner itself).
pub(crate) const DEREGISTER_BUSY_LIMIT: Duration = Duration::from_secs(5 * 60);

/// What a DELETE of a registration came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deregistration {
    /// Removed, already gone, not listed, or failed for a reason retrying soon will not fix
    /// (the inventory reconciliation tries again later).
    Settled,
    /// GitHub answered `422`: the runner is still running a job (its last one, finishing).
    Busy,
}

/// How a DELETE's answer is taken.
pub(crate) fn deregistration(result: &Result<(), GithubError>) -> Deregistration {
    match result {
        Err(GithubError::Unprocessable { .. }) => Deregistration::Busy,
        _ => Deregistration::Settled,
    }
}

/// After a `422` on deregistration: when to try again (ms since the epoch), or `None` once
/// the runner has been busy past [`DEREGISTER_BUSY_LIMIT`] since `first_busy_ms` (give up
/// waiting; clean up anyway).
pub(crate) fn busy_retry_at(first_busy_ms: i64, now_ms: i64) -> Option<i64> {
    let limit = rm_base::clock::ms(DEREGISTER_BUSY_LIMIT);
    let retry = rm_base::clock::ms(DEREGISTER_BUSY_RETRY);
    (now_ms.saturating_sub(first_busy_ms) < limit).then(|| now_ms.saturating_add(retry))
}

/// How long to wait before JIT retry `n` (1-based): doubling from a second, capped.
pub(crate) fn jit_backoff(retry: u32) -> Duration {
    const FIRST: Duration = Duration::from_secs(1);
    const CAP: Duration = Duration::from_secs(30);
    FIRST
        .saturating_mul(1u32 << retry.saturating_sub(1).min(5))
        .min(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(entries: &[(&str, &str, bool)]) -> Listing {
        Ok(entries
            .iter()
            .enumerate()
            .map(|(i, (name, status, busy))| {
                (
                    (*name).to_owned(),
                    Listed {
                        runner_id: RunnerId::new(i as i64 + 1),
                        registered: *status == "online" || *busy,
                        busy: *busy,
                    },
                )
            })
            .collect())
    }

    #[test]
    fn an_offline_jit_registration_is_not_registered_yet() {
        let l = listing(&[
            ("a", "offline", false),
            ("b", "online", false),
            ("c", "online", true),
        ]);
        assert_eq!(observation(&l, "a"), GithubObservation::NotRegistered);
        assert_eq!(
            observation(&l, "b"),
            GithubObservation::Registered { busy: false }
        );
        assert_eq!(
            observation(&l, "c"),
            GithubObservation::Registered { busy: true }
        );
        assert_eq!(observation(&l, "zz"), GithubObservation::NotRegistered);
        let failed: Listing = Err(GithubError::Unreachable {
            endpoint: "orgs.runners.list",
            reason: "connection refused".into(),
        });
        assert_eq!(observation(&failed, "a"), GithubObservation::Unreachable);
    }

    #[test]
    fn permissions_are_terminal_conflicts_remove_the_stale_name_and_outages_retry() {
        let forbidden = GithubError::Forbidden {
            endpoint: "orgs.runners.jit",
            message: "Resource not accessible by integration".into(),
            remedy: "grant",
        };
        assert_eq!(jit_retry(&forbidden), JitRetry::Terminal);
        assert_eq!(
            jit_retry(&GithubError::Unauthorized {
                message: "bad".into()
            }),
            JitRetry::Terminal
        );
        assert_eq!(
            jit_retry(&GithubError::Conflict {
                endpoint: "orgs.runners.jit",
                message: "exists".into()
            }),
            JitRetry::RemoveStaleName
        );
        assert_eq!(
            jit_retry(&GithubError::Server {
                endpoint: "orgs.runners.jit",
                status: 502,
                message: String::new()
            }),
            JitRetry::Later(None)
        );
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(99);
        assert_eq!(
            jit_retry(&GithubError::RateLimited {
                kind: rm_github::LimitKind::Secondary,
                resource: "core".into(),
                retry_at: at
            }),
            JitRetry::Later(Some(at))
        );
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
        assert_eq!(deregistration(&server), Deregistration::Settled);
        let retry = i64::try_from(DEREGISTER_BUSY_RETRY.as_millis()).unwrap_or(0);
        let limit = i64::try_from(DEREGISTER_BUSY_LIMIT.as_millis()).unwrap_or(0);
        assert_eq!(busy_retry_at(1_000, 1_000), Some(1_000 + retry));
        assert_eq!(
            busy_retry_at(1_000, 1_000 + limit - 1),
            Some(1_000 + limit - 1 + retry)
        );
        assert_eq!(busy_retry_at(1_000, 1_000 + limit), None);
    }

    #[test]
    fn backoff_doubles_from_a_second_and_is_capped() {
        let waits: Vec<u64> = (1..=8).map(|n| jit_backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
