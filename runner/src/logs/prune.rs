//! Which kept logs go (pure): the store is bounded by count, age and total size, and it is
//! pruned oldest first. The adapter that reads the store and removes what this says is
//! [`super::Store::prune`].

use std::time::Duration;

/// Default `logs.keep`: how many attempts' logs are kept; `0` keeps none.
pub const DEFAULT_KEEP: usize = 500;

/// Default `logs.max_age`: two weeks, long enough to look into last week's failure.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);

/// Default `logs.max_total`.
pub const DEFAULT_MAX_TOTAL: u64 = 2 << 30;

/// The store's bounds (`[logs]`, CONTRACT §2; the agent's configuration validates them into
/// this type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// At most this many attempts' logs (`logs.keep`).
    pub keep: usize,
    /// Logs kept longer ago than this go (`logs.max_age`).
    pub max_age: Duration,
    /// At most this many bytes in all (`logs.max_total`).
    pub max_total: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            keep: DEFAULT_KEEP,
            max_age: DEFAULT_MAX_AGE,
            max_total: DEFAULT_MAX_TOTAL,
        }
    }
}

/// One attempt's kept logs, as the pruning sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub attempt: String,
    /// When its logs were kept (ms since the epoch).
    pub kept_at_ms: i64,
    pub bytes: u64,
}

/// The attempts whose logs go, oldest first. Entries are taken newest first (by when they were
/// kept, then by attempt id so the order is total); the first that would break a bound goes,
/// and so does every older one: nothing older outlives something newer, so the store is always
/// "the newest N" and never has holes an operator would have to explain.
pub(crate) fn to_prune(entries: &[Entry], bounds: Bounds, now_ms: i64) -> Vec<String> {
    let mut newest_first: Vec<&Entry> = entries.iter().collect();
    newest_first.sort_by(|a, b| {
        b.kept_at_ms
            .cmp(&a.kept_at_ms)
            .then_with(|| b.attempt.cmp(&a.attempt))
    });
    let oldest_kept_ms = now_ms.saturating_sub(rm_vocab::millis(bounds.max_age));
    let mut total: u64 = 0;
    let mut cut = newest_first.len();
    for (i, entry) in newest_first.iter().enumerate() {
        total = total.saturating_add(entry.bytes);
        if i >= bounds.keep || entry.kept_at_ms < oldest_kept_ms || total > bounds.max_total {
            cut = i;
            break;
        }
    }
    newest_first[cut..]
        .iter()
        .rev()
        .map(|e| e.attempt.clone())
        .collect()
}
