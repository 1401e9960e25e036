//! Whether a pinned `runner.version` is still inside GitHub's window: GitHub stops giving jobs
//! to runners that have not installed a new release within 30 days of it (JIT runners cannot
//! update themselves), so a pinned version falls out 30 days after the first release newer than
//! it was published. A pure judgement of the pinned version, the releases' dates and now, for
//! `rm-agent check` and `rm-agent status` to name days ahead.

use std::time::{Duration, SystemTime};

use rm_github::types::ReleaseSummary;

use super::version::{parse_version, version_of_tag};

/// GitHub's window: a runner must install a new release within this of its publication.
pub(crate) const UPDATE_WINDOW: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// How far ahead a closing window is named.
pub(crate) const WARN_AHEAD: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The judgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// No release newer than the pinned one: nothing runs out.
    Newest,
    /// `next` (the first newer release) came out; GitHub stops giving jobs at `deadline`, more
    /// than [`WARN_AHEAD`] away.
    Open { next: String, deadline: SystemTime },
    /// As `Open`, with the deadline within [`WARN_AHEAD`]: `days_left` whole days (0: today).
    Closing {
        next: String,
        deadline: SystemTime,
        days_left: u64,
    },
    /// The deadline has passed: GitHub gives runners of this version no jobs.
    Closed { next: String, deadline: SystemTime },
    /// The pinned version is not `MAJOR.MINOR.PATCH`.
    Unknown,
}

impl Window {
    /// The first newer release and when the window closes, when there is one.
    pub(crate) fn deadline(&self) -> Option<(&str, SystemTime)> {
        match self {
            Window::Open { next, deadline }
            | Window::Closing { next, deadline, .. }
            | Window::Closed { next, deadline } => Some((next, *deadline)),
            Window::Newest | Window::Unknown => None,
        }
    }

    /// `newest`, `open`, `closing`, `closed` or `unknown`: for `status --json`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Window::Newest => "newest",
            Window::Open { .. } => "open",
            Window::Closing { .. } => "closing",
            Window::Closed { .. } => "closed",
            Window::Unknown => "unknown",
        }
    }

    /// One sentence with the remedy, for a warning; `None` when there is nothing to warn of.
    pub fn warning(&self, pinned: &str) -> Option<String> {
        match self {
            Window::Closing {
                next,
                deadline,
                days_left,
            } => Some(format!(
                "runner.version {pinned} falls out of GitHub's window in {days_left} day(s) ({}): v{next} came out more than {} days ago, and GitHub stops giving jobs to runners that have not installed a newer release within 30 days; set runner.version to a newer release or to \"latest\"",
                humantime::format_rfc3339_seconds(*deadline),
                (UPDATE_WINDOW - WARN_AHEAD).as_secs() / 86_400
            )),
            Window::Closed { next, deadline } => Some(format!(
                "runner.version {pinned} is out of GitHub's window since {}: v{next} came out more than 30 days ago, and GitHub gives runners of this version no jobs; set runner.version to a newer release or to \"latest\"",
                humantime::format_rfc3339_seconds(*deadline)
            )),
            Window::Newest | Window::Open { .. } | Window::Unknown => None,
        }
    }
}

/// Judges `pinned` against `releases` (any order; drafts, prereleases and undated ones are not
/// releases GitHub's window counts) at `now`.
pub fn judge(pinned: &str, releases: &[ReleaseSummary], now: SystemTime) -> Window {
    let Some(pinned_order) = parse_version(pinned) else {
        return Window::Unknown;
    };
    let first_newer = releases
        .iter()
        .filter(|r| !r.draft && !r.prerelease)
        .filter_map(|r| {
            let version = version_of_tag(&r.tag_name)?;
            let order = parse_version(&version)?;
            let published =
                rm_vocab::UnixMs::parse_rfc3339(r.published_at.as_deref()?)?.to_system_time();
            (order > pinned_order).then_some((published, version))
        })
        .min();
    let Some((published, next)) = first_newer else {
        return Window::Newest;
    };
    at(next, published + UPDATE_WINDOW, now)
}

/// The window of a version whose first newer release is `next`, closing at `deadline`, as of
/// `now` (what `status` recomputes from a judgement made earlier).
pub fn at(next: String, deadline: SystemTime, now: SystemTime) -> Window {
    match deadline.duration_since(now) {
        Err(_) | Ok(Duration::ZERO) => Window::Closed { next, deadline },
        Ok(left) if left <= WARN_AHEAD => Window::Closing {
            next,
            deadline,
            days_left: left.as_secs() / 86_400,
        },
        Ok(_) => Window::Open { next, deadline },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn release(tag: &str, published: SystemTime) -> ReleaseSummary {
        ReleaseSummary {
            id: 1,
            tag_name: tag.to_owned(),
            draft: false,
            prerelease: false,
            published_at: Some(humantime::format_rfc3339_seconds(published).to_string()),
        }
    }

    /// 2026-11-01T00:00:00Z.
    fn t0() -> SystemTime {
        humantime::parse_rfc3339("2026-11-01T00:00:00Z").unwrap()
    }

    #[test]
    fn the_window_closes_30_days_after_the_first_newer_release() {
        let releases = vec![
            release("v2.332.0", t0() + 20 * DAY),
            release("v2.331.0", t0()),
            release("v2.330.0", t0() - 40 * DAY),
        ];
        let deadline = t0() + 30 * DAY;
        assert_eq!(
            judge("2.331.0", &releases, t0()),
            Window::Open {
                next: "2.332.0".into(),
                deadline: t0() + 50 * DAY,
            }
        );
        // The first newer release counts, not the latest.
        assert_eq!(
            judge("2.330.0", &releases, t0() + 10 * DAY),
            Window::Open {
                next: "2.331.0".into(),
                deadline,
            }
        );
        assert_eq!(
            judge("2.330.0", &releases, t0() + 23 * DAY),
            Window::Closing {
                next: "2.331.0".into(),
                deadline,
                days_left: 7
            }
        );
        assert_eq!(
            judge("2.330.0", &releases, t0() + 29 * DAY + DAY / 2),
            Window::Closing {
                next: "2.331.0".into(),
                deadline,
                days_left: 0
            }
        );
        assert_eq!(
            judge("2.330.0", &releases, deadline),
            Window::Closed {
                next: "2.331.0".into(),
                deadline,
            }
        );
        assert_eq!(judge("2.332.0", &releases, t0() + 99 * DAY), Window::Newest);
    }

    #[test]
    fn prereleases_drafts_and_odd_tags_do_not_count() {
        let mut pre = release("v2.331.0", t0());
        pre.prerelease = true;
        let mut draft = release("v2.331.1", t0());
        draft.draft = true;
        let mut undated = release("v2.331.2", t0());
        undated.published_at = None;
        let odd = release("nightly", t0());
        let releases = vec![pre, draft, undated, odd];
        assert_eq!(judge("2.330.0", &releases, t0() + 99 * DAY), Window::Newest);
        assert_eq!(judge("latest", &releases, t0()), Window::Unknown);
        // Versions are ordered as numbers.
        let releases = vec![release("v2.100.0", t0())];
        assert!(matches!(
            judge("2.99.0", &releases, t0() + 31 * DAY),
            Window::Closed { .. }
        ));
    }

    #[test]
    fn only_a_closing_or_closed_window_warns_and_names_the_remedy() {
        let releases = vec![release("v2.331.0", t0())];
        assert_eq!(judge("2.330.0", &releases, t0()).warning("2.330.0"), None);
        let closing = judge("2.330.0", &releases, t0() + 25 * DAY)
            .warning("2.330.0")
            .unwrap();
        assert!(closing.contains("in 5 day(s)"), "{closing}");
        assert!(closing.contains("\"latest\""), "{closing}");
        let closed = judge("2.330.0", &releases, t0() + 31 * DAY)
            .warning("2.330.0")
            .unwrap();
        assert!(closed.contains("no jobs"), "{closed}");
    }
}
