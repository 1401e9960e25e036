//! What the executor counts for `/metrics` beside the journal (issue 28): runner ends by policy,
//! outcome and reason (`rm_runner_ends_total`), and re-run requests by policy, reason and
//! result (`rm_job_reruns_total`), since the agent started. Process-wide counters the
//! supervision pass and the re-run adapter bump, which the metrics collector reads; they own no
//! decision.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// `(label values)` → count.
type Tally = Mutex<BTreeMap<[String; 3], u64>>;

static ENDS: Tally = Mutex::new(BTreeMap::new());
static RERUNS: Tally = Mutex::new(BTreeMap::new());

fn bump(tally: &Tally, labels: [&str; 3]) {
    let key = labels.map(str::to_owned);
    // A poisoned lock only means a panic elsewhere mid-increment: the map is still whole.
    let mut map = tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *map.entry(key).or_insert(0) += 1;
}

fn read(tally: &Tally) -> Vec<([String; 3], u64)> {
    tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// A runner of `policy` concluded with `outcome` and `reason` (`""` without one).
pub(crate) fn runner_ended(policy: &str, outcome: &str, reason: &str) {
    bump(&ENDS, [policy, outcome, reason]);
}

/// A re-run request of `policy`'s job, for `reason`, came to `result` (`sent`, `refused`,
/// `unknown`).
pub(crate) fn rerun(policy: &str, reason: &str, result: &str) {
    bump(&RERUNS, [policy, reason, result]);
}

/// `[policy, outcome, reason]` → ends.
pub(crate) fn ends() -> Vec<([String; 3], u64)> {
    read(&ENDS)
}

/// `[policy, reason, result]` → re-run requests.
pub(crate) fn reruns() -> Vec<([String; 3], u64)> {
    read(&RERUNS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_per_label_set() {
        runner_ended("tally-test", "failed", "oom_killed");
        runner_ended("tally-test", "failed", "oom_killed");
        runner_ended("tally-test", "completed_job", "");
        let mine: Vec<_> = ends()
            .into_iter()
            .filter(|(k, _)| k[0] == "tally-test")
            .collect();
        assert_eq!(mine.len(), 2);
        assert!(mine.iter().any(|(k, n)| k[2] == "oom_killed" && *n == 2));
        rerun("tally-test", "runner_crashed", "sent");
        assert!(
            reruns()
                .iter()
                .any(|(k, n)| k[0] == "tally-test" && *n == 1)
        );
    }
}
