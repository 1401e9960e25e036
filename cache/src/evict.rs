//! Which entries go when the cache is over its bounds: one pure function, [`victims`], over the
//! index's rows. The store ([`crate::store`]) deletes what it names after every finalize and
//! every [`EVICTION_INTERVAL`].
//!
//! Order: first every entry not used for longer than `max_age` (by last use: a restore counts as
//! use); then, for each repository over `repo_quota`, that repository's least recently used
//! entries until it is under; then the least recently used entries of all until the total is at
//! most `max_size`. Sizes are entry sizes: two entries with the same bytes share one blob on
//! disk, so the disk holds at most the total counted here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How often eviction runs besides after each finalize, so entries pass `max_age` even when
/// nothing is saved.
pub const EVICTION_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// One entry as eviction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) id: i64,
    pub(crate) repository: String,
    pub(crate) size: u64,
    /// Unix milliseconds of the last save or restore.
    pub(crate) last_used_ms: i64,
}

/// The bounds eviction keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) max_size: u64,
    pub(crate) max_age: Duration,
    pub(crate) repo_quota: Option<u64>,
}

/// The ids of the entries to delete, in the order they go (module doc).
pub(crate) fn victims(entries: &[Candidate], now_ms: i64, bounds: Bounds) -> Vec<i64> {
    let max_age_ms = i64::try_from(bounds.max_age.as_millis()).unwrap_or(i64::MAX);
    let oldest_kept = now_ms.saturating_sub(max_age_ms);
    // Least recently used first; the id breaks ties so the order is total.
    let mut lru: Vec<&Candidate> = entries.iter().collect();
    lru.sort_by_key(|e| (e.last_used_ms, e.id));

    let mut gone = BTreeSet::new();
    let mut order = Vec::new();
    let mut take = |entry: &Candidate, gone: &mut BTreeSet<i64>| {
        if gone.insert(entry.id) {
            order.push(entry.id);
        }
    };
    for entry in &lru {
        if entry.last_used_ms < oldest_kept {
            take(entry, &mut gone);
        }
    }
    if let Some(quota) = bounds.repo_quota {
        let mut held: BTreeMap<&str, u64> = BTreeMap::new();
        for entry in lru.iter().filter(|e| !gone.contains(&e.id)) {
            *held.entry(entry.repository.as_str()).or_default() += entry.size;
        }
        for entry in &lru {
            if gone.contains(&entry.id) {
                continue;
            }
            let total = held.entry(entry.repository.as_str()).or_default();
            if *total > quota {
                *total -= entry.size;
                take(entry, &mut gone);
            }
        }
    }
    let mut total: u64 = lru
        .iter()
        .filter(|e| !gone.contains(&e.id))
        .map(|e| e.size)
        .sum();
    for entry in &lru {
        if total <= bounds.max_size {
            break;
        }
        if !gone.contains(&entry.id) {
            total -= entry.size;
            take(entry, &mut gone);
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR_MS: i64 = 3_600_000;
    const NOW: i64 = 1_000 * HOUR_MS;

    fn entry(id: i64, repository: &str, size: u64, hours_ago: i64) -> Candidate {
        Candidate {
            id,
            repository: repository.into(),
            size,
            last_used_ms: NOW - hours_ago * HOUR_MS,
        }
    }

    fn bounds(max_size: u64, max_age_hours: u64, repo_quota: Option<u64>) -> Bounds {
        Bounds {
            max_size,
            max_age: Duration::from_secs(max_age_hours * 3600),
            repo_quota,
        }
    }

    #[test]
    fn victims_table() {
        let table: &[(&str, Vec<Candidate>, Bounds, Vec<i64>)] = &[
            (
                "under every bound: nothing goes",
                vec![entry(1, "a/a", 10, 1), entry(2, "a/a", 10, 2)],
                bounds(100, 24, None),
                vec![],
            ),
            (
                "older than max_age goes even under max_size",
                vec![entry(1, "a/a", 10, 1), entry(2, "a/a", 10, 30)],
                bounds(100, 24, None),
                vec![2],
            ),
            (
                "over max_size: least recently used first until at most max_size",
                vec![
                    entry(1, "a/a", 40, 1),
                    entry(2, "a/a", 40, 3),
                    entry(3, "b/b", 40, 2),
                ],
                bounds(80, 24, None),
                vec![2],
            ),
            (
                "exactly max_size stays",
                vec![entry(1, "a/a", 50, 1), entry(2, "a/a", 50, 2)],
                bounds(100, 24, None),
                vec![],
            ),
            (
                "aged entries count before size: no extra LRU victim needed",
                vec![
                    entry(1, "a/a", 60, 1),
                    entry(2, "a/a", 60, 48),
                    entry(3, "a/a", 30, 5),
                ],
                bounds(100, 24, None),
                vec![2],
            ),
            (
                "a repository over its quota loses its own LRU entries, not others'",
                vec![
                    entry(1, "big/big", 30, 1),
                    entry(2, "big/big", 30, 2),
                    entry(3, "big/big", 30, 3),
                    entry(4, "small/s", 10, 10),
                ],
                bounds(1_000, 24, Some(60)),
                vec![3],
            ),
            (
                "every repository over its quota loses its LRU entries, in LRU order",
                vec![
                    entry(1, "big/big", 50, 1),
                    entry(2, "big/big", 50, 2),
                    entry(3, "small/s", 40, 10),
                    entry(4, "small/s", 40, 9),
                ],
                bounds(1_000, 24, Some(60)),
                vec![3, 2],
            ),
            (
                "quota then global size",
                vec![
                    entry(1, "big/big", 50, 1),
                    entry(2, "big/big", 50, 2),
                    entry(3, "small/s", 40, 10),
                    entry(4, "small/s", 40, 9),
                ],
                bounds(100, 24, Some(80)),
                vec![2, 3],
            ),
            (
                "ties in last use go by id",
                vec![entry(7, "a/a", 10, 1), entry(3, "a/a", 10, 1)],
                bounds(10, 24, None),
                vec![3],
            ),
            ("empty index", vec![], bounds(0, 0, Some(0)), vec![]),
        ];
        for (name, entries, bounds, expected) in table {
            assert_eq!(&victims(entries, NOW, *bounds), expected, "{name}");
        }
    }
}
