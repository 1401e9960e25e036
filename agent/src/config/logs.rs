//! `[logs]` as written and its floors; the validated bounds and their defaults are the
//! runner crate's (`rm_runner::logs::Bounds`), which keeps the logs.

use std::time::Duration;

use super::duration::ConfigDuration;
use super::fitness::parse_size;

pub use rm_runner::logs::{Bounds as Logs, DEFAULT_KEEP, DEFAULT_MAX_AGE, DEFAULT_MAX_TOTAL};

/// The least `logs.max_total`: one attempt's whole copy (`rm_runner::logs::PER_ATTEMPT_CAP`),
/// so the newest attempt's logs always fit.
pub const MIN_MAX_TOTAL: u64 = 64 << 20;

// Checked when the agent is built: the newest attempt's whole copy fits the smallest store
// `logs.max_total` allows, and a file's cap is within its attempt's.
const _: () = assert!(
    MIN_MAX_TOTAL >= rm_runner::logs::PER_ATTEMPT_CAP
        && rm_runner::logs::PER_FILE_CAP <= rm_runner::logs::PER_ATTEMPT_CAP
);

/// The least `logs.max_age`: a copy younger than this is never the oldest an operator wants.
pub const MIN_MAX_AGE: Duration = Duration::from_secs(3600);

/// `[logs]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsSection {
    pub keep: Option<usize>,
    pub max_age: Option<ConfigDuration>,
    pub max_total: Option<String>,
}

/// Validates `[logs]`; the error names the key and why.
pub fn validate(section: &LogsSection) -> Result<Logs, (&'static str, String)> {
    let defaults = Logs::default();
    let max_age = section.max_age.map_or(defaults.max_age, |d| d.0);
    if max_age < MIN_MAX_AGE {
        return Err((
            "logs.max_age",
            "must be at least \"1h\"; to keep no logs, set `keep = 0`".to_owned(),
        ));
    }
    let max_total = match &section.max_total {
        None => defaults.max_total,
        Some(text) => parse_size(text).ok_or_else(|| {
            (
                "logs.max_total",
                format!("`{text}` is not a size; write it like \"2GiB\" or \"500MiB\""),
            )
        })?,
    };
    if max_total < MIN_MAX_TOTAL {
        return Err((
            "logs.max_total",
            "must be at least \"64MiB\" (one attempt's whole copy); to keep no logs, set `keep = 0`"
                .to_owned(),
        ));
    }
    Ok(Logs {
        keep: section.keep.unwrap_or(defaults.keep),
        max_age,
        max_total,
    })
}
