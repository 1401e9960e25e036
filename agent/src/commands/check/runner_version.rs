//! `check`'s `runner_version` finding: whether the configured `runner.version` is inside
//! GitHub's window (GitHub stops giving jobs to runners that have not installed a new release
//! within 30 days of it), named days ahead ([`rm_runner::package::window`]). One listing of
//! actions/runner's releases, with the first policy's installation.

use std::time::SystemTime;

use rm_github::GithubClient;

use super::Finding;
use crate::config::Config;
use crate::config::runner_version::LATEST;
use rm_runner::package::latest;
use rm_runner::package::window::{Window, judge};

/// The finding, when `runner.version` is set and a policy names an installation to ask with.
pub(super) async fn finding(client: &GithubClient, config: &Config) -> Option<Finding> {
    let version = config.runner.version.as_deref()?;
    let target = config.reading_target()?.clone();
    if version == LATEST {
        return Some(Finding::ok(
            "runner_version",
            "runner.version = \"latest\": new runners always start from actions/runner's newest release, inside GitHub's window",
        ));
    }
    let releases = match latest::list(client, &target).await {
        Ok(releases) => releases,
        Err(e) => {
            return Some(Finding::warn(
                "runner_version",
                format!(
                    "cannot list actions/runner's releases to judge runner.version {version}: {e}"
                ),
                format!(
                    "check the network path to {}; GitHub stops giving jobs to runners 30 days after a newer release",
                    config.github.api_url
                ),
            ));
        }
    };
    Some(of(version, &judge(version, &releases, SystemTime::now())))
}

/// The finding for a judgement.
fn of(version: &str, judged: &Window) -> Finding {
    let remedy = "set runner.version to a newer release, or to \"latest\" to follow releases";
    match judged {
        Window::Newest => Finding::ok(
            "runner_version",
            format!("runner.version {version} is actions/runner's newest release"),
        ),
        Window::Open { next, deadline } => Finding::ok(
            "runner_version",
            format!(
                "runner.version {version} is inside GitHub's window until {} (30 days after v{next})",
                humantime::format_rfc3339_seconds(*deadline)
            ),
        ),
        Window::Closing { .. } => Finding::warn(
            "runner_version",
            judged.warning(version).unwrap_or_default(),
            remedy,
        ),
        Window::Closed { .. } => Finding::fail(
            "runner_version",
            judged.warning(version).unwrap_or_default(),
            remedy,
        ),
        Window::Unknown => Finding::warn(
            "runner_version",
            format!("runner.version {version} is not a version GitHub's window can be judged for"),
            remedy,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::check::Status;
    use std::time::Duration;

    #[test]
    fn a_closing_window_warns_a_closed_one_fails() {
        let now = SystemTime::now();
        let closing = Window::Closing {
            next: "2.331.0".into(),
            deadline: now + Duration::from_secs(3 * 86_400),
            days_left: 3,
        };
        let f = of("2.330.0", &closing);
        assert_eq!(f.status, Status::Warn);
        assert!(f.what.contains("in 3 day(s)"), "{}", f.what);
        let closed = Window::Closed {
            next: "2.331.0".into(),
            deadline: now,
        };
        assert_eq!(of("2.330.0", &closed).status, Status::Fail);
        assert_eq!(of("2.331.0", &Window::Newest).status, Status::Ok);
    }
}
