//! Startup recovery: the same supervision as every pass, with the startup timers (no launch of
//! this process can own an attempt yet) and GitHub asked afresh for every target; then GitHub's
//! inventory reconciled for our exact `rm-<host>-<12 hex>` names: a registration with no live attempt is
//! removed. Anything that could not be decided keeps recovery incomplete, and no runner is
//! launched until it completes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rm_github::Target;
use rm_journal::AttemptState;

use super::registry::Listed;
use super::{Executor, targets_by_policy};

/// Why recovery could not complete.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryIncomplete {
    #[error("{0} runner attempt(s) could not be decided (GitHub unreachable?)")]
    Deferred(usize),
    #[error("GitHub's runner inventory of {target} could not be read: {reason}")]
    Inventory { target: String, reason: String },
    #[error("the journal could not be read or written: {0}")]
    Journal(String),
}

impl Executor {
    /// Recovers every journalled attempt and reconciles GitHub's inventory.
    pub(super) async fn recover(self: &Arc<Self>) -> Result<(), RecoveryIncomplete> {
        let timeouts = self.settings.timeouts.at_startup();
        let report = self
            .supervise_all(timeouts, true)
            .await
            .map_err(|e| RecoveryIncomplete::Journal(e.to_string()))?;
        if report.deferred > 0 {
            return Err(RecoveryIncomplete::Deferred(report.deferred));
        }
        self.reconcile_inventory().await?;
        *self
            .last_inventory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(self.now_ms());
        Ok(())
    }

    /// Removes every registration named `rm-<host>-<12 hex>` on our targets that no live attempt
    /// owns: left by a crash between registration and journal, or by a failed deregistration.
    /// A busy registration is left alone (GitHub refuses to remove it; it ends with its job).
    pub(super) async fn reconcile_inventory(&self) -> Result<(), RecoveryIncomplete> {
        let targets: HashSet<Target> = targets_by_policy(&self.settings.policies)
            .into_values()
            .collect();
        for target in targets {
            let runners =
                self.registry
                    .list(&target)
                    .await
                    .map_err(|e| RecoveryIncomplete::Inventory {
                        target: target.to_string(),
                        reason: e.to_string(),
                    })?;
            let owners = self.owners(&runners)?;
            for (name, listed) in &runners {
                if !self.settings.owns_runner_name(name) || listed.busy || owners.contains(name) {
                    continue;
                }
                match self.registry.deregister(&target, listed.runner_id).await {
                    Ok(()) => {
                        tracing::info!(runner = %name, target = %target, "removed a registration no live attempt owns");
                    }
                    Err(e) => {
                        tracing::warn!(runner = %name, error = %e, "cannot remove a registration no live attempt owns");
                    }
                }
            }
        }
        Ok(())
    }

    /// The names among `runners` that a live (or still launching) attempt owns.
    fn owners(
        &self,
        runners: &HashMap<String, Listed>,
    ) -> Result<HashSet<String>, RecoveryIncomplete> {
        let attempts = self.lock_attempts();
        let mut owners = HashSet::new();
        for name in runners.keys().filter(|n| self.settings.owns_runner_name(n)) {
            let record = attempts
                .by_runner_name(name)
                .map_err(|e| RecoveryIncomplete::Journal(e.to_string()))?;
            if record.is_some_and(|r| {
                r.state.counts_against_capacity() || r.state == AttemptState::Allocated
            }) {
                owners.insert(name.clone());
            }
        }
        Ok(owners)
    }
}
