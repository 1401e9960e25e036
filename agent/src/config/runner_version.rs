//! `runner.version = "latest"` and `runner.release_check_interval`, validated (following the
//! releases is `rm_runner::package::latest`, which `crate::package` starts with them).

use std::time::Duration;

/// The `runner.version` that follows releases.
pub const LATEST: &str = "latest";
/// How often GitHub is asked for its latest release by default: well inside GitHub's 30 days,
/// and one request a day.
pub const DEFAULT_RELEASE_CHECK: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest `runner.release_check_interval`: an unchanged answer is a free `304`, but a
/// shorter interval helps no one (actions/runner releases every few weeks).
pub const RELEASE_CHECK_FLOOR: Duration = Duration::from_secs(5);
/// The longest `runner.release_check_interval`: a new release must be noticed with most of its
/// 30 days left.
pub const RELEASE_CHECK_CEILING: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// `runner.release_check_interval`, validated: the default when unset.
pub fn check_interval(configured: Option<Duration>) -> Result<Duration, String> {
    let interval = configured.unwrap_or(DEFAULT_RELEASE_CHECK);
    if interval < RELEASE_CHECK_FLOOR || interval > RELEASE_CHECK_CEILING {
        return Err(format!(
            "{} is outside 5s to 7d; the default, a day, is what it is for (a release must be noticed long before GitHub's 30 days run out)",
            humantime::format_duration(interval)
        ));
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_interval_defaults_to_a_day_and_is_bounded() {
        assert_eq!(check_interval(None), Ok(DEFAULT_RELEASE_CHECK));
        assert_eq!(
            check_interval(Some(Duration::from_secs(5))),
            Ok(Duration::from_secs(5))
        );
        assert!(check_interval(Some(Duration::from_secs(4))).is_err());
        assert!(check_interval(Some(Duration::from_secs(8 * 24 * 3600))).is_err());
    }
}
