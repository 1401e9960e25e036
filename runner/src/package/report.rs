//! What the running agent last learned about its runner version, for `rm-agent status`:
//! `<data_dir>/runner-version.json`, written by the release task ([`super::latest::Follower`])
//! after each check, read by `status` (also of a stopped agent). It holds facts (the version,
//! whether it follows releases, the first newer release and when GitHub's window closes), not a
//! verdict: `status` judges the window against its own clock ([`super::window::at`]), so a
//! report written days ago still counts the days right.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::window::{self, Window};

/// The report's file in the data directory.
pub(crate) const REPORT_FILE: &str = "runner-version.json";
/// The largest report read (a few hundred bytes are written).
const MAX_REPORT_BYTES: u64 = 64 * 1024;

/// The facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionReport {
    /// The version new runners start from.
    pub version: String,
    /// `runner.version = "latest"`.
    pub follows_latest: bool,
    /// The first release newer than `version`, when GitHub has one.
    pub next_release: Option<String>,
    /// When GitHub stops giving jobs to runners of `version` (ms since the epoch).
    pub window_closes_at_ms: Option<i64>,
    /// When GitHub was last asked successfully (ms since the epoch).
    pub checked_at_ms: i64,
}

impl VersionReport {
    /// The report of a judgement made at `now`.
    pub fn of(version: &str, follows_latest: bool, judged: &Window, now: SystemTime) -> Self {
        let deadline = judged.deadline();
        VersionReport {
            version: version.to_owned(),
            follows_latest,
            next_release: deadline.map(|(next, _)| next.to_owned()),
            window_closes_at_ms: deadline.map(|(_, at)| ms(at)),
            checked_at_ms: ms(now),
        }
    }

    /// The window as of `now_ms`.
    pub fn window(&self, now_ms: i64) -> Window {
        match (&self.next_release, self.window_closes_at_ms) {
            (Some(next), Some(at)) => window::at(next.clone(), time(at), time(now_ms)),
            _ => Window::Newest,
        }
    }

    /// The warning `status` shows as of `now_ms`, if any.
    pub fn warning(&self, now_ms: i64) -> Option<String> {
        self.window(now_ms).warning(&self.version)
    }
}

fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Writes the report in one step (a temporary file renamed over the old one).
pub fn write(data_dir: &Path, report: &VersionReport) -> std::io::Result<()> {
    let path = data_dir.join(REPORT_FILE);
    let partial = data_dir.join(format!(".{REPORT_FILE}.partial"));
    let bytes = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, &path)
}

/// The report, if one was written and can be read.
pub fn read(data_dir: &Path) -> Option<VersionReport> {
    let path = data_dir.join(REPORT_FILE);
    let meta = std::fs::metadata(&path).ok()?;
    if meta.len() > MAX_REPORT_BYTES {
        return None;
    }
    serde_json::from_slice(&std::fs::read(&path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_report_counts_the_days_left_by_the_reader_s_clock() {
        let now = humantime::parse_rfc3339("2026-11-01T00:00:00Z").unwrap();
        let judged = Window::Open {
            next: "2.331.0".into(),
            deadline: now + 20 * DAY,
        };
        let report = VersionReport::of("2.330.0", false, &judged, now);
        let data = tempfile::tempdir().unwrap();
        write(data.path(), &report).unwrap();
        let read_back = read(data.path()).unwrap();
        assert_eq!(read_back, report);
        assert_eq!(read_back.warning(ms(now)), None);
        let later = read_back.warning(ms(now + 15 * DAY)).unwrap();
        assert!(later.contains("in 5 day(s)"), "{later}");
        assert!(matches!(
            read_back.window(ms(now + 21 * DAY)),
            Window::Closed { .. }
        ));
        let newest = VersionReport::of("2.331.0", true, &Window::Newest, now);
        assert_eq!(newest.window(ms(now + 99 * DAY)), Window::Newest);
    }
}
