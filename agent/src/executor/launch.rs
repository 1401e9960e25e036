//! One launch: from a journalled `allocated` attempt to a running runner, in the order that
//! makes every crash recoverable:
//! 1. the runtime directory with a copy of the package (removed again by cleanup);
//! 2. the JIT registration, retried with back-off while the demand lasts (a 409 for our own
//!    name removes the stale registration first; a 403 is terminal and names the permission);
//! 3. the runner id journalled (`jit_received`) before the process exists;
//! 4. the process, its JIT configuration in its environment only, its identity journalled
//!    (`starting`);
//! 5. then the task waits for the process to exit and wakes supervision, which concludes it.
//!
//! A failure concludes the attempt `failed` with its reason; supervision cleans it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rm_github::types::{JitConfig, JitRequest};
use rm_journal::{AttemptRecord, AttemptState};
use secrecy::SecretString;

use super::registry::{self, JitRetry, WORK_FOLDER};
use super::{Executor, fault};
use crate::lifecycle::{Conclusion, FailureReason};
use crate::runner::{RunnerChild, Runtime, Spawned};

/// How many times one attempt asks GitHub for a JIT configuration.
pub(super) const MAX_JIT_TRIES: u32 = 5;

/// The longest a launch waits for a rate limit to lift; beyond it the launch fails and the
/// policy's back-off takes over.
pub(super) const MAX_JIT_WAIT: Duration = Duration::from_secs(60);

/// Why a launch ended without a runner.
#[derive(Debug)]
struct Failure {
    /// The state the attempt is in (the conclusion's compare-and-set).
    from: AttemptState,
    reason: FailureReason,
    /// One sentence for the operator; never the JIT configuration or a token.
    detail: String,
    /// Retrying cannot help (credentials, permissions).
    terminal: bool,
}

impl Failure {
    fn new(from: AttemptState, reason: FailureReason, detail: impl Into<String>) -> Self {
        Failure {
            from,
            reason,
            detail: detail.into(),
            terminal: false,
        }
    }
}

impl Executor {
    /// Runs one launch to its end; see the module documentation.
    pub(super) async fn launch(self: Arc<Self>, record: AttemptRecord) {
        let id = record.attempt_id.clone();
        let result = self.bring_up(&record).await;
        self.lock_launching().remove(&id);
        match result {
            Ok(mut child) => {
                self.remember_launch(&record.policy, None);
                self.wake.notify_one();
                match child.wait().await {
                    Ok(status) => {
                        tracing::info!(code = status.code(), "runner process exited");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot wait for the runner process")
                    }
                }
                self.wake.notify_one();
            }
            Err(failure) => {
                tracing::warn!(reason = failure.reason.as_str(), detail = %failure.detail, "launch failed");
                self.remember_launch(
                    &record.policy,
                    Some((
                        failure.terminal,
                        format!("{}: {}", failure.reason.as_str(), failure.detail),
                    )),
                );
                let conclusion = Conclusion::Failed(failure.reason);
                if let Err(e) = self.lock_attempts().conclude(
                    &id,
                    failure.from,
                    conclusion.outcome(),
                    conclusion.reason(),
                    Some(&failure.detail),
                    self.now_ms(),
                ) {
                    tracing::error!(error = %e, "cannot journal the failed launch; recovery will conclude it");
                }
                self.wake.notify_one();
            }
        }
    }

    async fn bring_up(&self, record: &AttemptRecord) -> Result<RunnerChild, Failure> {
        let Some(policy) = self.policy(&record.policy) else {
            return Err(Failure::new(
                AttemptState::Allocated,
                FailureReason::LaunchInterrupted,
                "the policy is no longer configured",
            ));
        };
        let runtime = self.make_runtime(record).await?;
        let target = policy.target.clone();
        let request = JitRequest {
            name: record.runner_name.clone(),
            runner_group_id: policy.runner_group_id,
            labels: policy.labels.clone(),
            work_folder: WORK_FOLDER.to_owned(),
        };
        let jit = self.request_jit(policy, &target, &request).await?;
        let runner_id = i64::try_from(jit.runner.id).unwrap_or(i64::MAX);
        let recorded =
            self.lock_attempts()
                .jit_received(&record.attempt_id, runner_id, self.now_ms());
        if !matches!(recorded, Ok(true)) {
            // Not journalled: nobody could ever clean this registration up but us, now (or the
            // inventory reconciliation, which removes registrations no live attempt owns).
            self.remove_unowned_registration(&target, jit.runner.id)
                .await;
            return Err(Failure::new(
                AttemptState::Allocated,
                FailureReason::JitExpired,
                "the JIT configuration could not be journalled; the registration was removed",
            ));
        }
        fault::crash_point("jit_received");
        let spawned = self.spawn(record, &runtime, jit.encoded_jit_config).await;
        let Spawned { identity, child } = match spawned {
            Ok(spawned) => spawned,
            Err(detail) => {
                self.remove_unowned_registration(&target, jit.runner.id)
                    .await;
                return Err(Failure::new(
                    AttemptState::JitReceived,
                    FailureReason::ProcessStartFailed,
                    detail,
                ));
            }
        };
        fault::crash_point("process_spawned");
        let started = self.record_started(&record.attempt_id, identity, self.now_ms());
        if !matches!(started, Ok(true)) {
            // A runner nobody journalled must not live on: stop it before giving up.
            self.stop(identity).await;
            return Err(Failure::new(
                AttemptState::JitReceived,
                FailureReason::ProcessStartFailed,
                "the runner's start could not be journalled; it was stopped",
            ));
        }
        tracing::info!(pid = identity.pid, "runner started");
        fault::crash_point("runner_started");
        Ok(child)
    }

    /// Removes the registration of a launch that gave up before its runner ran. A failure is
    /// not the launch's to retry: the inventory reconciliation removes registrations no live
    /// attempt owns (`INVENTORY_INTERVAL`), so it is said and left to it.
    async fn remove_unowned_registration(&self, target: &rm_github::Target, runner_id: u64) {
        if let Err(e) = self.registry.deregister(target, runner_id).await {
            tracing::warn!(runner_id, error = %e, "cannot remove the registration of a launch that gave up; the inventory reconciliation will");
        }
    }

    /// The runtime directory, made by the attempt's backend (blocking work, off the runtime).
    async fn make_runtime(&self, record: &AttemptRecord) -> Result<Runtime, Failure> {
        let backends = Arc::clone(&self.execution);
        let (kind, plan) = (record.isolation, self.plan(record));
        let made = tokio::task::spawn_blocking(move || match backends.of(kind) {
            Some(backend) => backend.prepare(&plan).map_err(|e| e.to_string()),
            None => Err(unavailable(kind)),
        })
        .await;
        match made {
            Ok(Ok(runtime)) => Ok(runtime),
            Ok(Err(e)) => Err(Failure::new(
                AttemptState::Allocated,
                FailureReason::ProcessStartFailed,
                format!("cannot prepare the runtime: {e}"),
            )),
            Err(e) => Err(Failure::new(
                AttemptState::Allocated,
                FailureReason::ProcessStartFailed,
                format!("the runtime preparation task failed: {e}"),
            )),
        }
    }

    /// Starts the runner process through the attempt's backend; the JIT configuration moves
    /// into the blocking task and is dropped (and zeroed) there once the process has it.
    async fn spawn(
        &self,
        record: &AttemptRecord,
        runtime: &Runtime,
        jit: SecretString,
    ) -> Result<Spawned<RunnerChild>, String> {
        let backends = Arc::clone(&self.execution);
        let (kind, plan, runtime) = (record.isolation, self.plan(record), runtime.clone());
        let started = tokio::task::spawn_blocking(move || match backends.of(kind) {
            Some(backend) => backend
                .start(&plan, &runtime, &jit)
                .map_err(|e| e.to_string()),
            None => Err(unavailable(kind)),
        })
        .await;
        match started {
            Ok(result) => result,
            Err(e) => Err(format!("the spawn task failed: {e}")),
        }
    }

    /// Asks GitHub for a JIT configuration, retrying with back-off while the demand lasts.
    async fn request_jit(
        &self,
        policy: &crate::config::Policy,
        target: &rm_github::Target,
        request: &JitRequest,
    ) -> Result<JitConfig, Failure> {
        let fail = |detail: String| {
            Failure::new(
                AttemptState::Allocated,
                FailureReason::JitRequestFailed,
                detail,
            )
        };
        let mut tries = 0;
        loop {
            tries += 1;
            let error = match self.registry.generate(target, request).await {
                Ok(jit) => return Ok(jit),
                Err(e) => e,
            };
            let mut not_before = None;
            match registry::jit_retry(&error) {
                JitRetry::Terminal => {
                    if matches!(error, rm_github::GithubError::Unauthorized { .. }) {
                        self.notifier
                            .notify(crate::notify::OperatorEvent::CredentialsRejected);
                    }
                    return Err(Failure {
                        terminal: true,
                        ..fail(format!("GitHub refused to register the runner: {error}"))
                    });
                }
                JitRetry::RemoveStaleName => {
                    tracing::warn!(
                        "a registration with this runner's name exists; removing it and retrying"
                    );
                    if let Err(e) = self.registry.remove_by_name(target, &request.name).await {
                        tracing::warn!(error = %e, "cannot remove the stale registration");
                    }
                }
                JitRetry::Later(at) => not_before = at,
            }
            if tries >= MAX_JIT_TRIES {
                return Err(fail(format!(
                    "GitHub did not issue a JIT configuration after {tries} tries; the last answer: {error}"
                )));
            }
            let wait = retry_wait(tries, not_before, self.clock.now());
            if wait > MAX_JIT_WAIT {
                return Err(fail(format!(
                    "GitHub asked to wait {} s, longer than a launch waits: {error}",
                    wait.as_secs()
                )));
            }
            tracing::info!(tries, wait_ms = wait.as_millis() as u64, error = %error, "JIT request failed; retrying");
            tokio::time::sleep(wait).await;
            if self.draining.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Failure::new(
                    AttemptState::Allocated,
                    FailureReason::LaunchInterrupted,
                    "the agent is draining",
                ));
            }
            if !self.still_wanted(policy) {
                return Err(fail(
                    "the queued jobs were served or cancelled before GitHub issued a JIT configuration"
                        .to_owned(),
                ));
            }
        }
    }
}

/// Why an attempt's backend cannot be driven by this agent.
pub(super) fn unavailable(kind: rm_journal::IsolationKind) -> String {
    format!(
        "this agent cannot drive `isolation = \"{}\"` runners (it may not switch users)",
        kind.as_str()
    )
}

/// The wait before JIT try `tries + 1`: the back-off, or longer if GitHub named a time.
fn retry_wait(tries: u32, not_before: Option<SystemTime>, now: SystemTime) -> Duration {
    let backoff = registry::jit_backoff(tries);
    let until = not_before
        .and_then(|at| at.duration_since(now).ok())
        .unwrap_or_default();
    backoff.max(until)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_retry_time_is_a_floor_never_added() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(retry_wait(1, None, now), Duration::from_secs(1));
        assert_eq!(
            retry_wait(1, Some(now + Duration::from_secs(7)), now),
            Duration::from_secs(7)
        );
        assert_eq!(
            retry_wait(3, Some(now + Duration::from_secs(2)), now),
            Duration::from_secs(4)
        );
        // A time already past does not shorten the back-off.
        assert_eq!(
            retry_wait(2, Some(now - Duration::from_secs(5)), now),
            Duration::from_secs(2)
        );
    }
}
