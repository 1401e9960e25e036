//! `policy.rerun_on` and `policy.max_reruns` (issue 28): which failure reasons of a runner make
//! rm ask GitHub to re-run the job it was running, and how often at most. This module owns the
//! names the file may write (the re-runnable reasons, the reasons' snake_case spelling the
//! journal's `attempts.reason` holds) and the bounds; the decision is `crate::rerun`'s.

/// The failure reasons rm may re-run a job for: each says the infrastructure, not the job,
/// ended the runner. A reason not listed here (a job that failed on its own, a runner that
/// never registered) is refused in `rerun_on`.
pub const RERUNNABLE_REASONS: &[&str] = &[
    "oom_killed",
    "disk_full",
    "disk_exceeded",
    "runner_crashed",
    "ghost",
    "host_lost",
];

/// Default `policy.max_reruns`: one re-run per job, the "at most once".
pub const DEFAULT_MAX_RERUNS: u32 = 1;

/// The most `policy.max_reruns` may say: a job that takes its runner down repeatedly (a hostile
/// job can crash its own runner on purpose) is re-run a few times at most, never in a loop.
pub const MAX_RERUNS_LIMIT: u32 = 3;

/// A policy's validated re-run rule; a policy without `rerun_on` has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunPolicy {
    /// The reasons to re-run for, each one of [`RERUNNABLE_REASONS`], sorted, no repeats.
    pub rerun_on: Vec<String>,
    /// At most this many re-runs of one job (its earlier run attempts count).
    pub max_reruns: u32,
}

/// Validates `rerun_on` and `max_reruns` as written; `Ok(None)`: no re-runs (the default).
/// The error names the field and the problem.
pub fn validate(
    rerun_on: Option<Vec<String>>,
    max_reruns: Option<u32>,
) -> Result<Option<RerunPolicy>, (&'static str, String)> {
    let mut reasons = rerun_on.unwrap_or_default();
    if let Some(unknown) = reasons
        .iter()
        .find(|r| !RERUNNABLE_REASONS.contains(&r.as_str()))
    {
        return Err((
            "rerun_on",
            format!(
                "`{unknown}` is not a reason rm re-runs a job for; the reasons are {}",
                RERUNNABLE_REASONS.join(", ")
            ),
        ));
    }
    reasons.sort();
    reasons.dedup();
    let max_reruns = match max_reruns {
        None => DEFAULT_MAX_RERUNS,
        Some(n) if (1..=MAX_RERUNS_LIMIT).contains(&n) => n,
        Some(n) => {
            return Err((
                "max_reruns",
                format!(
                    "{n} is outside 1..={MAX_RERUNS_LIMIT}; to re-run nothing, leave `rerun_on` out"
                ),
            ));
        }
    };
    if reasons.is_empty() {
        return match max_reruns {
            DEFAULT_MAX_RERUNS => Ok(None),
            _ => Err((
                "max_reruns",
                "bounds the re-runs `rerun_on` asks for, and `rerun_on` lists no reason".to_owned(),
            )),
        };
    }
    Ok(Some(RerunPolicy {
        rerun_on: reasons,
        max_reruns,
    }))
}
