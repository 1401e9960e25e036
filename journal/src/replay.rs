//! `rm-agent deliveries replay GUID`: runs a journalled delivery's handler again (after a fix or
//! an upgrade) and applies what it says, through the same code as the writer. Changes only move
//! forward, so replaying a delivery that was already applied changes nothing.

use std::path::Path;

use rm_handlers::{Delivery, Verdict};
use rm_vocab::Source;
use rusqlite::{TransactionBehavior, params};

use crate::apply::apply_verdict;
use crate::read::stored_delivery;
use crate::{JournalError, Outcome, StoredDelivery, connection};
use rm_vocab::UnixMs;

/// Replays the delivery `guid` and returns its new outcome and reason.
pub fn replay(
    path: &Path,
    guid: &str,
    now_ms: UnixMs,
) -> Result<(Outcome, Option<String>), JournalError> {
    if !path.exists() {
        return Err(JournalError::Missing(path.to_owned()));
    }
    let mut conn = connection::open_writer(path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored = stored_delivery(&tx, guid)?
        .ok_or_else(|| JournalError::UnknownDelivery(guid.to_owned()))?;
    let verdict = rerun(guid, &stored, now_ms)?;
    let applied = apply_verdict(&tx, &verdict, now_ms)?;
    tx.execute(
        "UPDATE deliveries SET outcome = ?2, reason = ?3, action = COALESCE(?4, action),
             replayed_at = ?5
         WHERE guid = ?1",
        params![
            guid,
            applied.outcome.as_str(),
            applied.reason,
            verdict.action(),
            now_ms
        ],
    )?;
    tx.commit()?;
    Ok((applied.outcome, applied.reason))
}

/// The handler's verdict on a journalled delivery now, in both dialects: its body read again,
/// stamped `now_ms` (handlers have no clock: the replay is when the journal learns what the
/// body says); a handler that panics again rejects it again.
pub(crate) fn rerun(
    guid: &str,
    stored: &StoredDelivery,
    now_ms: UnixMs,
) -> Result<Verdict, JournalError> {
    let body = stored
        .body
        .as_deref()
        .ok_or_else(|| JournalError::BodyPruned(guid.to_owned()))?;
    let delivery = Delivery {
        guid,
        event: &stored.row.event,
        body,
        received_at_ms: now_ms,
        source: Source::parse(&stored.row.source).unwrap_or(Source::Webhook),
    };
    Ok(
        std::panic::catch_unwind(|| rm_handlers::handle(&delivery)).unwrap_or_else(|_| {
            Verdict::Reject {
                action: stored.row.action.clone(),
                reason: format!("the `{}` handler panicked again", stored.row.event),
            }
        }),
    )
}
