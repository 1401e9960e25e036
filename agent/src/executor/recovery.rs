//! The recovery room. Startup recovery is the same supervision as every pass, with the startup
//! timers (no launch of this process can own an attempt yet) and GitHub asked afresh for every
//! target (the control loop runs it: [`super::Executor::recover`]); then GitHub's inventory
//! reconciled for our exact `rm-<host>-<12 hex>` names ([`reconcile_inventory`], also run every
//! [`super::INVENTORY_INTERVAL`]): a registration with no live attempt is removed (a scale set's
//! runners are left to their cleanup through the Actions service: its policies' targets are
//! not listed). Anything that
//! could not be decided keeps recovery incomplete, and no runner is launched until it completes.

use rm_github::Target;
use rm_journal::AttemptState;
use std::collections::{HashMap, HashSet};
use tracing::Instrument as _;

use super::context::Context;
use super::deregister::{self, Decision, Seen, Why};
use super::registry::Listed;
use super::targets_by_policy;

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

/// Removes every registration named `rm-<host>-<12 hex>` on our targets that no live attempt
/// owns: left by a crash between registration and journal, or by a deregistration that failed.
/// Which go is [`deregister::decide`]'s (a busy one stays: GitHub refuses to remove it, and it
/// ends with its job).
pub(super) async fn reconcile_inventory(ctx: &Context) -> Result<(), RecoveryIncomplete> {
    // A scale set's runners are not listed by REST (issue 29: no REST request after the
    // token); their registrations are removed by their cleanup through the Actions service. A
    // target is listed here only for the webhook policies on it.
    let targets: HashSet<Target> = targets_by_policy(&ctx.settings.policies)
        .into_iter()
        .filter(|(policy, _)| ctx.settings.scale_sets.of_policy(policy).is_none())
        .map(|(_, target)| target)
        .collect();
    for target in targets {
        let runners =
            ctx.registry
                .list(&target)
                .await
                .map_err(|e| RecoveryIncomplete::Inventory {
                    target: target.to_string(),
                    reason: e.to_string(),
                })?;
        let owners = owners(ctx, &runners).await?;
        for (name, listed) in runners
            .iter()
            .filter(|(name, _)| ctx.settings.owns_runner_name(name))
        {
            let why = Why::Orphan {
                owned: owners.contains(name),
            };
            if let Decision::Remove(id) = deregister::decide(why, Seen::Listed(*listed)) {
                let span = tracing::info_span!("orphan", runner = %name);
                deregister::remove(&ctx.registry, &target, id, why)
                    .instrument(span)
                    .await;
            }
        }
    }
    Ok(())
}

/// The names among `runners` that a live (or still launching) attempt owns.
async fn owners(
    ctx: &Context,
    runners: &HashMap<String, Listed>,
) -> Result<HashSet<String>, RecoveryIncomplete> {
    let ours: Vec<String> = runners
        .keys()
        .filter(|n| ctx.settings.owns_runner_name(n))
        .cloned()
        .collect();
    ctx.journal
        .write(move |attempts| {
            let mut owners = HashSet::new();
            for name in ours {
                let record = attempts.by_runner_name(&name)?;
                if record.is_some_and(|r| {
                    r.state.counts_against_capacity() || r.state == AttemptState::Allocated
                }) {
                    owners.insert(name);
                }
            }
            Ok(owners)
        })
        .await
        .map_err(|e| RecoveryIncomplete::Journal(e.to_string()))
}
