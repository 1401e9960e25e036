//! The launch room: one task per launch, from a journalled `allocated` attempt to a running
//! runner, in the order that makes every crash recoverable:
//! 1. the runtime directory with a copy of the package (removed again by cleanup);
//! 2. the JIT registration, retried with back-off while the demand lasts (a 409 for our own
//!    name removes the stale registration first; a 403 is terminal and names the permission),
//!    each try through the installation, among every configured App's covering the target,
//!    that can take it now ([`registry::pick`]);
//! 3. the runner id journalled (`jit_received`) before the process exists;
//! 4. the process, its JIT configuration in its environment only, its identity journalled
//!    (`starting`);
//! 5. then the task waits for the process to exit.
//!
//! A failure ends the task with its reason, which it tells the loop ([`Event::Launched`]);
//! supervision, the one owner of conclusions, concludes the attempt `failed` with it at its
//! next pass. The task shares no memory with the rest of the executor: it reads the
//! [`Context`] and tells the control loop what happened ([`Event::Launched`], then
//! [`Event::Exited`]). Supervision takes over from there, and it alone removes a registration
//! the launch made (the runner id is journalled, or the failure is `jit_expired` and the
//! registration is found by its name).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rm_github::types::{JitConfig, JitRequest};
use rm_journal::AttemptRecord;
use secrecy::SecretString;
use tokio::sync::{mpsc, watch};

use super::Event;
use super::allocate::LaunchFailure;
use super::context::Context;
use super::deregister::{self, Decision, Seen, Why};
use super::registry::{self, JitRetry, WORK_FOLDER};
use crate::fault;
use crate::lifecycle::FailureReason;
use rm_runner::{RunnerChild, Runtime, Spawned};

/// A JIT configuration, whoever issued it (the REST API or a scale set's Actions service).
struct Issued {
    runner_id: rm_vocab::RunnerId,
    encoded_jit_config: SecretString,
}

/// How many times one attempt asks GitHub for a JIT configuration.
pub(super) const MAX_JIT_TRIES: u32 = 5;

/// The longest a launch waits for a rate limit to lift; beyond it the launch fails and the
/// policy's back-off takes over. A paced minute (GitHub's and the arrival margin,
/// `rm_github::pacing::PACED_MINUTE`) and a little more: the registrations of a matrix past the
/// per-minute limit wait for the first ones to leave the window rather than fail.
pub(super) const MAX_JIT_WAIT: Duration = Duration::from_secs(65);

/// Why a launch ended without a runner.
#[derive(Debug)]
struct Failure {
    reason: FailureReason,
    /// One sentence for the operator; never the JIT configuration or a token.
    detail: String,
    /// Retrying cannot help (credentials, permissions).
    terminal: bool,
}

impl Failure {
    fn new(reason: FailureReason, detail: impl Into<String>) -> Self {
        Failure {
            reason,
            detail: detail.into(),
            terminal: false,
        }
    }
}

/// How a runner's process ended, for the attribution of its end (`None`: neither a status nor a
/// signal, which `wait` never reports).
fn exit_seen(status: std::process::ExitStatus) -> Option<crate::lifecycle::ExitSeen> {
    use crate::lifecycle::ExitSeen;
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .map(ExitSeen::Code)
        .or_else(|| status.signal().map(ExitSeen::Signal))
}

/// One launch task's inputs.
pub(super) struct Launch {
    pub(super) ctx: Arc<Context>,
    pub(super) record: AttemptRecord,
    /// Where it tells the control loop what happened.
    pub(super) events: mpsc::UnboundedSender<Event>,
    /// True once the agent drains: a JIT retry gives up.
    pub(super) draining: watch::Receiver<bool>,
    /// The loop's latest allocation plan: whether the policy still wants runners.
    pub(super) plans: watch::Receiver<std::sync::Arc<super::plan::Plan>>,
}

impl Launch {
    /// Runs the launch to its end; see the module documentation.
    pub(super) async fn run(self) {
        let id = self.record.attempt_id.clone();
        let policy = self.record.policy.clone();
        match self.bring_up().await {
            Ok(mut child) => {
                self.tell(Event::Launched {
                    attempt: id.clone(),
                    policy,
                    failed: None,
                });
                let exit = match child.wait().await {
                    Ok(status) => {
                        tracing::info!(code = status.code(), "runner process exited");
                        exit_seen(status)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot wait for the runner process");
                        None
                    }
                };
                self.tell(Event::Exited(id, exit));
            }
            Err(failure) => {
                tracing::warn!(reason = failure.reason.as_str(), detail = %failure.detail, "launch failed");
                // The loop backs the policy off and supervision concludes the attempt (the one
                // owner of conclusions), then cleans it and its registration, if one was made.
                // An agent killed before that finds the attempt unlaunched at its next start,
                // and recovery concludes it.
                self.tell(Event::Launched {
                    attempt: id,
                    policy,
                    failed: Some(LaunchFailure {
                        terminal: failure.terminal,
                        reason: failure.reason,
                        detail: failure.detail,
                    }),
                });
            }
        }
    }

    /// Tells the control loop; a loop that is gone (the agent stopped) needs no telling.
    fn tell(&self, event: Event) {
        if self.events.send(event).is_err() {
            tracing::debug!("the control loop has stopped; the next start recovers this attempt");
        }
    }

    async fn bring_up(&self) -> Result<RunnerChild, Failure> {
        let (ctx, record) = (&self.ctx, &self.record);
        let Some(policy) = ctx.policy(&record.policy) else {
            return Err(Failure::new(
                FailureReason::LaunchInterrupted,
                "the policy is no longer configured",
            ));
        };
        let runtime = self.make_runtime().await?;
        let target = policy.target.clone();
        let request = JitRequest {
            name: record.runner_name.clone(),
            runner_group_id: policy.runner_group_id,
            // The policy's labels and the job's shape labels (issue 42): GitHub routes the job
            // that asked for this shape to this runner, and no job of another shape.
            labels: policy
                .labels
                .iter()
                .chain(record.shape.iter().flat_map(|s| s.labels.iter()))
                .cloned()
                .collect(),
            work_folder: WORK_FOLDER.to_owned(),
        };
        let jit = match ctx.settings.scale_sets.of_policy(&policy.name) {
            Some(source) => {
                self.scale_set_jit(policy, source, &record.runner_name)
                    .await?
            }
            None => {
                let jit = self.request_jit(policy, &target, &request).await?;
                Issued {
                    runner_id: jit.runner.id,
                    encoded_jit_config: jit.encoded_jit_config,
                }
            }
        };
        // Registered at GitHub, and the journal does not know its id yet: found by its name.
        fault::crash_point("jit_issued");
        let runner_id = jit.runner_id;
        let (id, at) = (record.attempt_id.clone(), ctx.now());
        let recorded = ctx
            .journal
            .write(move |attempts| attempts.jit_received(&id, runner_id, at))
            .await;
        if !matches!(recorded, Ok(true)) {
            // Not journalled: supervision finds the registration by the runner's name (a
            // `jit_expired` conclusion asks GitHub afresh), else the inventory reconciliation.
            return Err(Failure::new(
                FailureReason::JitExpired,
                "the JIT configuration could not be journalled; its registration is removed by cleanup",
            ));
        }
        fault::crash_point("jit_received");
        let Spawned { identity, child } = match self.spawn(&runtime, jit.encoded_jit_config).await {
            Ok(spawned) => spawned,
            // The runner id is journalled: cleanup removes the registration.
            Err(detail) => {
                return Err(Failure::new(FailureReason::ProcessStartFailed, detail));
            }
        };
        fault::crash_point("process_spawned");
        let started = ctx
            .journal
            .started(&record.attempt_id, identity, ctx.now())
            .await;
        if !matches!(started, Ok(true)) {
            // A runner nobody journalled must not live on: stop it before giving up.
            ctx.stop(record.isolation, identity).await;
            return Err(Failure::new(
                FailureReason::ProcessStartFailed,
                "the runner's start could not be journalled; it was stopped",
            ));
        }
        tracing::info!(pid = identity.pid, "runner started");
        fault::crash_point("runner_started");
        Ok(child)
    }

    /// The runtime directory, made by the attempt's backend (blocking work, off the runtime).
    async fn make_runtime(&self) -> Result<Runtime, Failure> {
        let backends = Arc::clone(&self.ctx.execution);
        let (kind, plan) = (self.record.isolation, self.ctx.plan(&self.record));
        let made = tokio::task::spawn_blocking(move || match backends.of(kind) {
            Some(backend) => backend.prepare(&plan).map_err(|e| e.to_string()),
            None => Err(super::context::unavailable(kind)),
        })
        .await;
        match made {
            Ok(Ok(runtime)) => Ok(runtime),
            Ok(Err(e)) => Err(Failure::new(
                FailureReason::ProcessStartFailed,
                format!("cannot prepare the runtime: {e}"),
            )),
            Err(e) => Err(Failure::new(
                FailureReason::ProcessStartFailed,
                format!("the runtime preparation task failed: {e}"),
            )),
        }
    }

    /// Starts the runner process through the attempt's backend; the JIT configuration moves
    /// into the blocking task and is dropped (and zeroed) there once the process has it.
    async fn spawn(
        &self,
        runtime: &Runtime,
        jit: SecretString,
    ) -> Result<Spawned<RunnerChild>, String> {
        // Before its first query: the resolver answers the runner from its first instruction.
        if let Some(egress) = &self.ctx.settings.egress {
            egress.register(&self.record, None);
        }
        let backends = Arc::clone(&self.ctx.execution);
        let (kind, plan, runtime) = (
            self.record.isolation,
            self.ctx.plan(&self.record),
            runtime.clone(),
        );
        let started = tokio::task::spawn_blocking(move || match backends.of(kind) {
            Some(backend) => backend
                .start(&plan, &runtime, &jit)
                .map_err(|e| e.to_string()),
            None => Err(super::context::unavailable(kind)),
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
        let ctx = &self.ctx;
        let fail = |detail: String| Failure::new(FailureReason::JitRequestFailed, detail);
        let mut tries = 0;
        loop {
            tries += 1;
            let (error, set_aside) = match self.try_jit(target, request).await {
                Ok(jit) => return Ok(jit),
                Err(refused) => refused,
            };
            let not_before = self
                .after_refusal(target, request, &error, set_aside)
                .await
                .map_err(|detail| Failure {
                    terminal: true,
                    ..fail(detail)
                })?;
            if tries >= MAX_JIT_TRIES {
                return Err(fail(format!(
                    "GitHub did not issue a JIT configuration after {tries} tries; the last answer: {error}"
                )));
            }
            let wait = retry_wait(tries, not_before, ctx.clock.now().to_system_time());
            if wait > MAX_JIT_WAIT {
                return Err(fail(format!(
                    "the registration would wait {} s, longer than a launch waits: {error}",
                    wait.as_secs()
                )));
            }
            tracing::info!(tries, wait_ms = wait.as_millis() as u64, error = %error, "JIT request failed; retrying");
            tokio::time::sleep(wait).await;
            self.still_worth_a_try(policy).await?;
        }
    }

    /// Asks the scale set's Actions service for a JIT configuration (no REST request: the
    /// scale set's own endpoint, with its admin token), retrying what passes while the demand
    /// lasts. A name already registered is an earlier try's whose answer was lost: removed,
    /// then asked again.
    async fn scale_set_jit(
        &self,
        policy: &crate::config::Policy,
        source: &crate::scaleset::Source,
        name: &str,
    ) -> Result<Issued, Failure> {
        use rm_github::scaleset::ScaleSetError;
        use rm_github::scaleset::listener::Outcome;
        let fail = |detail: String| Failure::new(FailureReason::JitRequestFailed, detail);
        let mut tries = 0;
        loop {
            tries += 1;
            let error = match source.id() {
                None => "the scale set is not found or created yet".to_owned(),
                Some(id) => match source
                    .client
                    .generate_jit_config(id, name, WORK_FOLDER)
                    .await
                {
                    Ok(jit) => {
                        let runner_id =
                            rm_vocab::RunnerId::try_from(jit.runner_id).map_err(|e| {
                                fail(format!(
                                    "the service answered runner id {}: {e}",
                                    jit.runner_id
                                ))
                            })?;
                        return Ok(Issued {
                            runner_id,
                            encoded_jit_config: jit.encoded_jit_config,
                        });
                    }
                    Err(ScaleSetError::AgentExists { message }) => {
                        tracing::warn!(%message, "a runner with this name exists in the scale set; removing it and retrying");
                        crate::scaleset::remove_by_name(source, name).await;
                        message
                    }
                    Err(e) if Outcome::of(&e) == Outcome::Transient => e.to_string(),
                    Err(e) => {
                        return Err(Failure {
                            terminal: true,
                            ..fail(format!(
                                "the scale set's Actions service refused to register the runner: {e}"
                            ))
                        });
                    }
                },
            };
            if tries >= MAX_JIT_TRIES {
                return Err(fail(format!(
                    "the scale set did not issue a JIT configuration after {tries} tries; the last answer: {error}"
                )));
            }
            let wait = registry::jit_backoff(tries);
            tracing::info!(tries, wait_ms = wait.as_millis() as u64, error = %error, "scale-set JIT request failed; retrying");
            tokio::time::sleep(wait).await;
            self.still_worth_a_try(policy).await?;
        }
    }

    /// One JIT request through the installation [`Launch::choose_installation`] picks; a
    /// refusal comes with whether that installation was set aside for it.
    async fn try_jit(
        &self,
        target: &rm_github::Target,
        request: &JitRequest,
    ) -> Result<JitConfig, (rm_github::GithubError, bool)> {
        let ctx = &self.ctx;
        let installation = self
            .choose_installation(target)
            .await
            .map_err(|refused| (refused, false))?;
        match ctx
            .registry
            .generate_in(installation, target, request)
            .await
        {
            Ok(jit) => Ok(jit),
            Err(e) => {
                let aside =
                    ctx.registry
                        .set_aside(installation, &e, ctx.clock.now().to_system_time());
                Err((e, aside))
            }
        }
    }

    /// What a refused JIT request means for the next try: `Ok` with the earliest time GitHub
    /// allows it (if it said), after removing a stale registration of our own name; `Err`
    /// with the detail when GitHub refused for good.
    async fn after_refusal(
        &self,
        target: &rm_github::Target,
        request: &JitRequest,
        error: &rm_github::GithubError,
        set_aside: bool,
    ) -> Result<Option<std::time::SystemTime>, String> {
        let ctx = &self.ctx;
        // A further App's installation refused for good: the next try goes through another.
        let retry = if set_aside {
            JitRetry::Later(None)
        } else {
            registry::jit_retry(error)
        };
        match retry {
            JitRetry::Terminal => {
                if matches!(error, rm_github::GithubError::Unauthorized { .. }) {
                    ctx.notifier
                        .notify(crate::notify::OperatorEvent::CredentialsRejected);
                }
                Err(format!("GitHub refused to register the runner: {error}"))
            }
            JitRetry::RemoveStaleName => {
                // Our own name, registered by an earlier try whose answer was lost.
                tracing::warn!(
                    "a registration with this runner's name exists; removing it and retrying"
                );
                let seen = match ctx.registry.find(target, &request.name).await {
                    Ok(Some(listed)) => Seen::Listed(listed),
                    Ok(None) => Seen::NotListed,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot find the stale registration");
                        Seen::Unknown
                    }
                };
                if let Decision::Remove(id) = deregister::decide(Why::NameTaken, seen) {
                    deregister::remove(&ctx.registry, target, id, Why::NameTaken).await;
                }
                Ok(None)
            }
            JitRetry::Later(at) => Ok(at),
        }
    }

    /// After a wait between two JIT tries: whether the launch goes on (not draining, and the
    /// policy's jobs still want a runner).
    async fn still_worth_a_try(&self, policy: &crate::config::Policy) -> Result<(), Failure> {
        if *self.draining.borrow() {
            return Err(Failure::new(
                FailureReason::LaunchInterrupted,
                "the agent is draining",
            ));
        }
        // The plan's word: demand this host serves (fences, claims and completions the journal
        // has not named all counted), or a min_runners to keep.
        if !self.plans.borrow().wants(policy) {
            return Err(Failure::new(
                FailureReason::JitRequestFailed,
                "the queued jobs were served or cancelled before GitHub issued a JIT configuration",
            ));
        }
        Ok(())
    }
}

impl Launch {
    /// The installation this try goes through: [`registry::pick`] over every App's
    /// installation covering the target, then its place in the fleet's shared window. A full
    /// window takes that installation out of this choice and the next is tried; when none can
    /// leave now, the earliest is sent through the client, whose budget refuses it at once
    /// with its own time (nothing leaves early), unless the fleet's window refused it.
    async fn choose_installation(
        &self,
        target: &rm_github::Target,
    ) -> Result<u64, rm_github::GithubError> {
        let registry = &self.ctx.registry;
        let now = self.ctx.clock.now().to_system_time();
        let (mut candidates, turn) = registry.candidates(target, now).await?;
        // Each refusal takes one candidate out of the ready ones: the loop ends.
        for _ in 0..=candidates.len() {
            let Some(choice) = registry::pick(&candidates, now, turn) else {
                break;
            };
            let app = registry.app_of(choice.installation);
            let Some(until) = self.reserve_registration(app, choice.installation).await else {
                tracing::debug!(
                    app,
                    installation = choice.installation,
                    "registering through this installation"
                );
                return Ok(choice.installation);
            };
            if !choice.ready {
                return Err(fleet_window_full(until));
            }
            if let Some(c) = candidates
                .iter_mut()
                .find(|c| c.installation == choice.installation)
            {
                // Never `now` itself: a window that says "now" after refusing is not ready.
                c.free_at = Some(until.max(now + Duration::from_millis(1)));
            }
        }
        let earliest = candidates.iter().filter_map(|c| c.free_at).min();
        Err(fleet_window_full(earliest.unwrap_or(now)))
    }

    /// In a fleet: reserves this registration in the installation's windows that the fleet's
    /// hosts share (`claims::shared_windows`); a full window refuses it as GitHub's secondary
    /// limit would: `Some` with the time there is room, and the caller's retry rules wait for
    /// it. A database that cannot be asked does not hold the launch up: the host's own pacing
    /// still holds, and the claim it starts for was made moments ago.
    async fn reserve_registration(&self, app: u64, installation: u64) -> Option<SystemTime> {
        let membership = self.ctx.membership.as_ref()?;
        match membership.reserve_registration(app, installation).await {
            Ok(None) => None,
            Ok(Some(wait)) => Some(self.ctx.clock.now().to_system_time() + wait),
            Err(e) => {
                tracing::warn!(error = %e, "cannot reserve the registration in the fleet's shared window; sending it paced by this host alone");
                None
            }
        }
    }
}

/// A registration the fleet's shared window refused until `retry_at`, as GitHub's secondary
/// limit would.
fn fleet_window_full(retry_at: SystemTime) -> rm_github::GithubError {
    rm_github::GithubError::RateLimited {
        kind: rm_github::LimitKind::Secondary,
        resource: FLEET_WINDOW.to_owned(),
        retry_at,
    }
}

/// What a registration refused by the fleet's shared window names as its resource.
const FLEET_WINDOW: &str = "the fleet's shared registration window";

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
