//! `[logs]`: the bounds of the kept runner logs (`crate::runner::logs`), their defaults and
//! their floors.

use std::time::Duration;

use super::duration::ConfigDuration;
use super::fitness::parse_size;

/// Default `logs.keep`: how many attempts' logs are kept; `0` keeps none.
pub const DEFAULT_KEEP: usize = 500;

/// Default `logs.max_age`: two weeks, long enough to look into last week's failure.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);

/// Default `logs.max_total`.
pub const DEFAULT_MAX_TOTAL: u64 = 2 << 30;

/// The least `logs.max_total`: one attempt's whole copy (`runner::logs::PER_ATTEMPT_CAP`), so
/// the newest attempt's logs always fit.
pub const MIN_MAX_TOTAL: u64 = 64 << 20;

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

/// The validated bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logs {
    /// `0`: no logs are kept.
    pub keep: usize,
    pub max_age: Duration,
    pub max_total: u64,
}

impl Default for Logs {
    fn default() -> Self {
        Logs {
            keep: DEFAULT_KEEP,
            max_age: DEFAULT_MAX_AGE,
            max_total: DEFAULT_MAX_TOTAL,
        }
    }
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
