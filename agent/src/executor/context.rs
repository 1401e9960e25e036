//! What every room of the executor reads and none of them changes: the settings, the journal
//! seam, GitHub's runner registry, the runner root, and the seams it observes the world
//! through (clock, backends). The control loop owns one [`Context`] and hands an
//! `Arc` of it to each launch task; mutable state lives in the rooms, not here.

use std::sync::Arc;

use super::claims::Membership;
use super::journal::AttemptJournal;
use super::registry::Registry;
use super::seams::Execution;
use super::{STOP_GRACE, Settings};
use crate::config::Policy;
use crate::notify::Notifier;
use rm_runner::RunnerRoot;
use rm_runner::StopOutcome;
use rm_runner::backend::Plan;
use rm_runner::process::{self, ProcessIdentity};
use rm_vocab::UnixMs;

/// The executor's read-only surroundings.
pub(super) struct Context {
    pub(super) settings: Settings,
    pub(super) journal: AttemptJournal,
    pub(super) registry: Registry,
    pub(super) root: RunnerRoot,
    /// The backend of each attempt (the configured [`super::Backends`] in production): what
    /// runs, looks at, stops and cleans up its runner.
    pub(super) execution: Arc<dyn Execution>,
    pub(super) clock: Arc<dyn rm_vocab::Clock>,
    pub(super) notifier: Arc<Notifier>,
    /// This host's membership of a fleet, if it is in one.
    pub(super) membership: Option<Membership>,
}

impl Context {
    /// Now, on the executor's clock: every time it journals or decides by.
    pub(super) fn now(&self) -> UnixMs {
        self.clock.now()
    }

    pub(super) fn policy(&self, name: &str) -> Option<&Policy> {
        self.settings.policies.iter().find(|p| p.name == name)
    }

    /// The disk bound of `record`'s runtime: its shape's, else its policy's `disk_max`.
    pub(super) fn disk_max(&self, record: &rm_journal::AttemptRecord) -> Option<u64> {
        self.policy(&record.policy)
            .and_then(|policy| super::sizing::bounds(policy, record).disk_max)
    }

    /// The runner uid pool new runners take their uid from: `isolation = "user"`'s.
    pub(super) fn uid_pool(&self) -> Option<&rm_runner::isolate::Pool> {
        match (
            self.settings.backends.isolation,
            &self.settings.backends.user,
        ) {
            (rm_journal::IsolationKind::User, Some(user)) => Some(&user.pool),
            _ => None,
        }
    }

    /// What the attempt's backend needs to know about it.
    pub(super) fn plan(&self, record: &rm_journal::AttemptRecord) -> Plan {
        let policy = self.policy(&record.policy);
        let mut limits = policy.map(|p| p.limits).unwrap_or_default();
        // The attempt's shape (issue 42): its memory and CPUs where it writes them, else the
        // policy's. Its private tmpfs sizes follow its memory_max.
        if let Some(policy) = policy {
            let bounds = super::sizing::bounds(policy, record);
            limits.memory_max = bounds.memory_max;
            limits.cpu_max = bounds.cpu_max;
        }
        let mut plan = Plan::of(record, limits);
        // On a host with devices every isolated runner gets a `/dev` of its own, holding only
        // the nodes of the devices its attempt journalled (none for most): without it, a
        // runner would see every device of the host's `/dev`.
        if !self.settings.devices.is_empty() {
            let held = record.shape.as_ref().map_or(&[][..], |s| &s.devices[..]);
            plan.devices = Some(rm_runner::DevicePlan {
                nodes: super::sizing::device_nodes(&self.settings.devices, held),
            });
        }
        plan.network_allow = policy.and_then(|p| p.network_allow.clone());
        plan.egress = self
            .settings
            .egress
            .as_ref()
            .and_then(|egress| egress.rules(&record.policy));
        plan.egress_report = self
            .settings
            .egress
            .as_ref()
            .and_then(|egress| egress.report_dir(record));
        plan.docker = policy.and_then(|p| p.docker.clone());
        plan.cache = self
            .settings
            .cache
            .clone()
            .filter(|_| policy.is_some_and(|p| p.cache));
        // The attempt's own image, journalled when it was created, whatever the policy names
        // now; an attempt with one is never started on the host's root.
        plan.image = record
            .image
            .as_deref()
            .map(|id| crate::image::plan_of(self.settings.images.as_deref(), id));
        // The operator's variables of the policy's env_file (rm_runner::env_file).
        if let Some(env) = self.settings.operator_env.get(&record.policy) {
            plan.env = env.clone();
        }
        plan
    }
}

impl Context {
    /// Stops a runner's process group (SIGTERM, [`STOP_GRACE`], SIGKILL) through its attempt's
    /// backend (`kind`), re-checking its identity before every signal: supervision's stops, and
    /// a launch's whose start could not be journalled.
    pub(super) async fn stop(&self, kind: rm_journal::IsolationKind, identity: ProcessIdentity) {
        let processes = self.execution.processes_of(kind);
        match process::stop(processes, identity, STOP_GRACE).await {
            Ok(StopOutcome::Stopped { .. }) => {}
            Ok(StopOutcome::NotOurs) => {
                tracing::warn!(
                    pid = identity.pid,
                    "the journalled pid now belongs to another process; not signalled"
                );
            }
            Err(e) => tracing::warn!(error = %e, "cannot stop a runner"),
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
