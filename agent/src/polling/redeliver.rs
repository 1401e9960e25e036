//! Failed-delivery recovery: reads the App's hook deliveries (newest first) back to the newest
//! one an earlier scan judged (the journal's [`HOOK_DELIVERY_CURSOR`]), within GitHub's 3-day
//! redelivery window, and asks GitHub to send again every GUID that never succeeded: no attempt
//! answered 2xx, the journal holds no delivery with that GUID, and the agent has not asked for it
//! before (each GUID is asked for once; polling covers one whose redelivery fails too). The
//! redelivery comes in through the normal intake and is deduplicated there by its GUID.
//!
//! [`judge`] is the pure part: which GUIDs failed and how far the cursor may move.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rm_github::types::HookDelivery;
use rm_github::wire::parse_rfc3339;
use rm_github::{GithubClient, GithubError};
use rm_journal::{HOOK_DELIVERY_CURSOR, JournalError};

use super::blocking::Store;
use super::schedule::Failure;
use rm_vocab::UnixMs;

/// How often the hook log is read (and once at start).
pub(crate) const SCAN_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// Most redeliveries asked for in one scan (each is a content-creating `POST`, paced by the budget).
pub(crate) const MAX_REDELIVERIES_PER_SCAN: usize = 10;
/// Most pages (of 100) of the hook log read in one scan.
pub(crate) const MAX_PAGES_PER_SCAN: usize = 10;
/// A delivery younger than this may still be in flight: judged by a later scan.
pub(crate) const DELIVERY_SETTLE: Duration = Duration::from_secs(60);
/// GitHub redelivers deliveries up to 3 days old; an hour is left for clock skew and the scan.
pub(crate) const REDELIVERY_WINDOW: Duration = Duration::from_secs(3 * 24 * 3600 - 3600);

/// A GUID that never succeeded, and the attempt to redeliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedGuid {
    pub guid: String,
    pub delivery_id: u64,
}

/// What the hook log says, before the journal is asked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Judgement {
    /// GUIDs with only failed, settled attempts since the cursor; newest first.
    pub failed: Vec<FailedGuid>,
    /// The newest delivery id behind which everything is judged.
    pub cursor: Option<u64>,
    /// Deliveries since the cursor inside the window.
    pub examined: usize,
}

/// Judges the attempts listed (newest first) against the previous `cursor` at `now`.
#[cfg(test)]
pub(crate) fn judge(
    deliveries: &[HookDelivery],
    cursor: Option<u64>,
    now: SystemTime,
) -> Judgement {
    judge_settled(deliveries, cursor, now, DELIVERY_SETTLE)
}

/// [`judge`] with the time a delivery attempt is given to settle.
pub(crate) fn judge_settled(
    deliveries: &[HookDelivery],
    cursor: Option<u64>,
    now: SystemTime,
    settle: Duration,
) -> Judgement {
    let age = |d: &HookDelivery| {
        parse_rfc3339(&d.delivered_at)
            .and_then(|at| now.duration_since(at).ok())
            .unwrap_or(Duration::ZERO)
    };
    let fresh: Vec<&HookDelivery> = deliveries
        .iter()
        .filter(|d| cursor.is_none_or(|c| d.id > c) && age(d) <= REDELIVERY_WINDOW)
        .collect();
    let unsettled_floor = fresh.iter().filter(|d| age(d) < settle).map(|d| d.id).min();
    // Per GUID: any success, any unsettled attempt, and the newest attempt.
    let mut by_guid: BTreeMap<&str, (bool, bool, u64)> = BTreeMap::new();
    for d in &fresh {
        let entry = by_guid
            .entry(d.guid.as_str())
            .or_insert((false, false, d.id));
        entry.0 |= (200..300).contains(&d.status_code);
        entry.1 |= age(d) < settle;
        entry.2 = entry.2.max(d.id);
    }
    let mut failed: Vec<FailedGuid> = by_guid
        .into_iter()
        .filter(|(_, (ok, unsettled, _))| !ok && !unsettled)
        .map(|(guid, (_, _, id))| FailedGuid {
            guid: guid.to_owned(),
            delivery_id: id,
        })
        .collect();
    failed.sort_by_key(|f| std::cmp::Reverse(f.delivery_id));
    let judged = fresh
        .iter()
        .map(|d| d.id)
        .filter(|id| unsettled_floor.is_none_or(|floor| *id < floor))
        .max();
    Judgement {
        failed,
        cursor: judged.max(cursor),
        examined: fresh.len(),
    }
}

/// What one scan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ScanReport {
    pub examined: usize,
    /// Failed GUIDs the journal does not hold (evidence that deliveries are being lost).
    pub failed: usize,
    pub redelivered: usize,
    pub requests: u32,
    pub failure: Option<Failure>,
}

/// Errors of a scan the caller tells apart.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScanError {
    #[error("the journal: {0}")]
    Journal(#[from] JournalError),
}

/// Reads the hook log since the cursor and redelivers what never succeeded (bounded).
pub(super) async fn scan(
    client: &GithubClient,
    journal: &Store,
    now: SystemTime,
    settle: Duration,
) -> Result<ScanReport, ScanError> {
    let mut report = ScanReport::default();
    let cursor = journal
        .call(|j| j.cursor(HOOK_DELIVERY_CURSOR))
        .await?
        .and_then(|c| u64::try_from(c).ok());
    let mut listed: Vec<HookDelivery> = Vec::new();
    let mut page_cursor: Option<String> = None;
    let mut truncated = false;
    for page_number in 1..=MAX_PAGES_PER_SCAN {
        report.requests += 1;
        let page = match client.list_hook_deliveries(page_cursor.as_deref()).await {
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(error = %error, "cannot read the App's hook deliveries");
                report.failure = Some(Failure::from_error(&error, now));
                return Ok(report);
            }
        };
        let reached = page.deliveries.iter().any(|d| {
            cursor.is_some_and(|c| d.id <= c)
                || parse_rfc3339(&d.delivered_at)
                    .and_then(|at| now.duration_since(at).ok())
                    .is_some_and(|age| age > REDELIVERY_WINDOW)
        });
        listed.extend(page.deliveries);
        match page.next_cursor {
            Some(next) if !reached => {
                truncated = page_number == MAX_PAGES_PER_SCAN;
                page_cursor = Some(next);
            }
            _ => break,
        }
    }
    if truncated {
        tracing::warn!(
            pages = MAX_PAGES_PER_SCAN,
            "hook deliveries: more than one scan reads since the last; older ones are left to polling"
        );
    }
    let judgement = judge_settled(&listed, cursor, now, settle);
    report.examined = judgement.examined;
    let guids: Vec<String> = judgement.failed.iter().map(|f| f.guid.clone()).collect();
    let (known, asked) = journal
        .call(move |j| {
            let guids: Vec<&str> = guids.iter().map(String::as_str).collect();
            Ok::<_, JournalError>((j.known_guids(&guids)?, j.redelivered(&guids)?))
        })
        .await?;
    let lost: Vec<&FailedGuid> = judgement
        .failed
        .iter()
        .filter(|f| !known.contains(&f.guid))
        .collect();
    report.failed = lost.len();
    let due: Vec<&FailedGuid> = lost
        .into_iter()
        .filter(|f| !asked.contains(&f.guid))
        .collect();
    let mut finished = due.len() <= MAX_REDELIVERIES_PER_SCAN;
    for failed in due.into_iter().take(MAX_REDELIVERIES_PER_SCAN) {
        report.requests += 1;
        match client.redeliver(failed.delivery_id).await {
            Ok(()) => report.redelivered += 1,
            // GitHub will not redeliver this one (too old, gone): do not ask again.
            Err(GithubError::NotFound { .. } | GithubError::Unprocessable { .. }) => {}
            Err(error) => {
                report.failure = Some(Failure::from_error(&error, now));
                finished = false;
                break;
            }
        }
        let at = UnixMs::from_system_time(now);
        let id = i64::try_from(failed.delivery_id).unwrap_or(i64::MAX);
        let guid = failed.guid.clone();
        journal
            .call(move |j| j.record_redelivery(&guid, id, at))
            .await?;
    }
    // A scan cut short by its bound starts again from the same place; what it asked for is
    // journalled, so nothing is asked for twice.
    if finished && let Some(next) = judgement.cursor.filter(|c| Some(*c) != cursor) {
        let value = i64::try_from(next).unwrap_or(i64::MAX);
        let at = UnixMs::from_system_time(now);
        journal
            .call(move |j| j.set_cursor(HOOK_DELIVERY_CURSOR, value, at))
            .await?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn attempt(id: u64, guid: &str, status_code: u16, at: SystemTime) -> HookDelivery {
        HookDelivery {
            id,
            guid: guid.to_owned(),
            delivered_at: rm_fake_github::time::rfc3339(at),
            status: if status_code == 202 { "OK" } else { "failed" }.to_owned(),
            status_code,
            event: "workflow_job".to_owned(),
        }
    }

    #[test]
    fn only_guids_that_never_succeeded_and_have_settled_are_failed() {
        let now = t(1000);
        // Newest first, as GitHub lists them.
        let log = [
            attempt(9, "pending", 0, t(990)),
            attempt(8, "retried", 202, t(900)),
            attempt(7, "lost", 0, t(800)),
            attempt(6, "retried", 502, t(700)),
            attempt(5, "ok", 202, t(600)),
            attempt(4, "lost-twice", 0, t(500)),
            attempt(3, "lost-twice", 0, t(400)),
        ];
        let j = judge(&log, None, now);
        let failed: Vec<(&str, u64)> = j
            .failed
            .iter()
            .map(|f| (f.guid.as_str(), f.delivery_id))
            .collect();
        assert_eq!(failed, [("lost", 7), ("lost-twice", 4)]);
        assert_eq!(j.cursor, Some(8), "not past the attempt still in flight");
        assert_eq!(j.examined, 7);
    }

    #[test]
    fn the_cursor_and_the_three_day_window_bound_what_is_judged() {
        let now = t(10 * 24 * 3600);
        let log = [
            attempt(30, "new", 0, now - Duration::from_secs(120)),
            attempt(20, "seen", 0, now - Duration::from_secs(600)),
            attempt(10, "ancient", 0, now - Duration::from_secs(3 * 24 * 3600)),
        ];
        let j = judge(&log, Some(20), now);
        assert_eq!(j.failed.len(), 1);
        assert_eq!(j.failed[0].guid, "new");
        assert_eq!(j.cursor, Some(30));
        let j = judge(&log, None, now);
        assert_eq!(j.examined, 2, "older than the window: left alone");
        // Nothing new: the cursor stays.
        assert_eq!(judge(&[], Some(20), now).cursor, Some(20));
    }
}
