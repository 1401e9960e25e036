//! `rm-agent deliveries replay GUID` on a fleet's PostgreSQL journal: the delivery's handler run
//! again (`crate::replay::rerun`, as on SQLite) and its verdict applied with the writer's SQL
//! (`super::apply`, the same forward-only rule), in one transaction that holds the delivery row
//! (`FOR UPDATE`): two replays of one GUID apply one after the other, and the second finds
//! everything there. The receivers' writers keep running meanwhile; a job row they touch is
//! locked in the same order they lock it (the delivery row first, then the job).

use super::apply::{ApplyError, Sql, StatementCache, apply_verdict};
use super::read::stored_delivery;
use crate::{JournalError, Outcome};
use rm_vocab::UnixMs;

/// The application name a replay's connection shows in `pg_stat_activity`.
const REPLAY_APPLICATION: &str = "rm-journal-replay";

/// Replays the delivery `guid` in the fleet's journal at `target` and returns its new outcome
/// and reason, as [`crate::replay`] does on SQLite. Blocking: call it off an async runtime.
pub fn replay_pg(
    target: &super::PgTarget,
    guid: &str,
    now_ms: UnixMs,
) -> Result<(Outcome, Option<String>), JournalError> {
    let mut client = target.client_config(REPLAY_APPLICATION).connect()?;
    super::schema::require_current(&mut client)?;
    let mut tx = client.transaction()?;
    let stored = stored_delivery(&mut tx, guid, true)?
        .ok_or_else(|| JournalError::UnknownDelivery(guid.to_owned()))?;
    let verdict = crate::replay::rerun(guid, &stored, now_ms)?;
    let mut cache = StatementCache::default();
    let mut sql = Sql {
        tx: &mut tx,
        cache: &mut cache,
    };
    let applied = apply_verdict(&mut sql, &verdict, now_ms).map_err(|err| match err {
        ApplyError::Postgres(err) => JournalError::from(err),
        other => JournalError::Commit(format!("the journal could not apply {guid}: {other}")),
    })?;
    sql.execute(
        "UPDATE deliveries SET outcome = $2, reason = $3, action = COALESCE($4, action),
             replayed_at = $5
         WHERE guid = $1",
        &[
            &guid,
            &applied.outcome.as_str(),
            &applied.reason,
            &verdict.action(),
            &now_ms.get(),
        ],
    )?;
    tx.commit()?;
    Ok((applied.outcome, applied.reason))
}
