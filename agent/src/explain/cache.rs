//! What `explain JOB` says about the host-local cache for a job this host ran: whether the
//! job's policy uses it, whether the runner package takes the redirect (the running agent's
//! last status: `crate::cache::report`), and the job's own use of it (hits, misses, bytes each
//! way, from the cache's index: `rm_cache::job_counters`). Pure: the command reads the facts.

use rm_cache::Counters;

use super::{Reason, reason};
use crate::cache::report::Redirect;

/// The facts about one job's cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobCache<'a> {
    /// The policy of the attempt that ran the job, and whether it sets `cache = true`; `None`
    /// when no runner of this host ran it.
    pub policy: Option<(&'a str, bool)>,
    /// The redirect's verdict in the agent's last status; `None` when there is none.
    pub redirect: Option<&'a Redirect>,
    /// The job's counters in the cache's index; `None` when it made no request.
    pub counters: Option<Counters>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// The reasons to add; none for a job no cached policy ran.
pub(crate) fn reasons(facts: &JobCache<'_>) -> Vec<Reason> {
    let Some((policy, true)) = facts.policy else {
        return Vec::new();
    };
    let used = match facts.counters {
        Some(c) => format!(
            "{} hit(s), {} miss(es), {} saved, {} restored",
            c.hits,
            c.misses,
            mib(c.bytes_up),
            mib(c.bytes_down)
        ),
        None => "no cache request from it".to_owned(),
    };
    match facts.redirect {
        Some(redirect) if redirect.active => vec![reason(
            "cache_active",
            format!(
                "Policy {policy} uses the host-local cache and runner package {} takes its redirect: the job's cache calls go to this host ({used}).",
                redirect.package
            ),
        )],
        Some(redirect) => vec![reason(
            "cache_inactive",
            format!(
                "Policy {policy} uses the host-local cache, but {}; the job's cache calls went to GitHub ({used}).",
                redirect
                    .why
                    .as_deref()
                    .unwrap_or("the runner package does not take the redirect")
            ),
        )],
        None => vec![reason(
            "cache_unknown",
            format!(
                "Policy {policy} uses the host-local cache; whether the runner package takes its redirect is known only from a running agent's status ({used})."
            ),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_job_says_whether_it_was_redirected_and_what_it_used() {
        let active = Redirect {
            package: "abc123".to_owned(),
            active: true,
            why: None,
        };
        let inactive = Redirect {
            package: "def456".to_owned(),
            active: false,
            why: Some("runner package def456 does not fit the cache redirect: x".to_owned()),
        };
        let used = Counters {
            hits: 1,
            misses: 2,
            bytes_up: 64 << 20,
            bytes_down: 0,
        };
        let table: &[(JobCache<'_>, &[&str])] = &[
            (JobCache::default(), &[]),
            (
                JobCache {
                    policy: Some(("plain", false)),
                    redirect: Some(&active),
                    counters: None,
                },
                &[],
            ),
            (
                JobCache {
                    policy: Some(("ci", true)),
                    redirect: Some(&active),
                    counters: Some(used),
                },
                &[
                    "cache_active",
                    "abc123",
                    "1 hit(s), 2 miss(es), 64.0 MiB saved",
                ],
            ),
            (
                JobCache {
                    policy: Some(("ci", true)),
                    redirect: Some(&inactive),
                    counters: None,
                },
                &["cache_inactive", "does not fit", "went to GitHub"],
            ),
            (
                JobCache {
                    policy: Some(("ci", true)),
                    redirect: None,
                    counters: None,
                },
                &["cache_unknown", "no cache request"],
            ),
        ];
        for (facts, words) in table {
            let said = reasons(facts);
            let text: String = said
                .iter()
                .map(|r| format!("{} {}", r.code, r.message))
                .collect();
            assert_eq!(said.is_empty(), words.is_empty(), "{facts:?}: {text}");
            for word in *words {
                assert!(text.contains(word), "{word} missing from {text}");
            }
        }
    }
}
