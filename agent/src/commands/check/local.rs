//! `check`'s findings on this machine: the webhook secret, the relay token and the relay's
//! answer, the webhook notifications' secrets, and the runner package (a directory, or a version in the cache or at GitHub).

use std::path::Path;

use super::{Finding, Status};
use crate::config::{self, Config};
use crate::secrets;
use rm_runner::package;

/// The webhook secret, needed to verify deliveries from the receiver or the relay.
pub(super) fn webhook_secret(config: &Config) -> Finding {
    let needed_by = match (&config.receiver, &config.relay) {
        (Some(_), _) => "[receiver]",
        (None, Some(_)) => "[relay]",
        (None, None) => {
            return Finding::ok(
                "webhook_secret",
                "no [receiver] or [relay]: no webhook secret needed (jobs are found by polling)",
            );
        }
    };
    if unset(secrets::WEBHOOK_SECRET_ENV) && config.github.webhook_secret_file.is_none() {
        return Finding::fail(
            "webhook_secret",
            format!(
                "no webhook secret is configured, and {needed_by} needs one to verify deliveries"
            ),
            format!(
                "set `github.webhook_secret_file` in {} to a file holding the App's webhook secret (or set ${})",
                config::display_file(config.source.as_deref()),
                secrets::WEBHOOK_SECRET_ENV
            ),
        );
    }
    match secrets::webhook_secrets(config) {
        Ok(_) => Finding::ok(
            "webhook_secret",
            format!("webhook secret set for {needed_by}"),
        ),
        Err(exit) => Finding::from_exit(Status::Fail, "webhook_secret", &exit),
    }
}

/// With `[[notifications.webhook]]`: each endpoint's `secret_file` reads as `run` would read
/// it. Nothing is sent: a test notification would reach whoever is on call.
pub(super) fn notifications(config: &Config) -> Option<Finding> {
    if config.webhook_notifications.is_empty() {
        return None;
    }
    let mut endpoints = Vec::with_capacity(config.webhook_notifications.len());
    for (index, webhook) in config.webhook_notifications.iter().enumerate() {
        let signed = match &webhook.secret_file {
            Some(path) => {
                let key = format!("notifications.webhook[{index}].secret_file");
                if let Err(exit) = secrets::notification_secret(path, &key) {
                    return Some(Finding::from_exit(Status::Fail, "notifications", &exit));
                }
                "signed"
            }
            None => "unsigned",
        };
        endpoints.push(format!("{} ({signed})", webhook.url));
    }
    Some(Finding::ok(
        "notifications",
        format!("webhook notifications to {}", endpoints.join(", ")),
    ))
}

/// Whether an environment variable is absent or blank (the secrets readers then use the file).
/// With `[relay]`: the token is there and the relay takes it.
pub(super) async fn relay(config: &Config) -> Option<Finding> {
    let relay = config.relay.as_ref()?;
    let token = match secrets::relay_token(config) {
        Ok(token) => token,
        Err(exit) => return Some(Finding::from_exit(Status::Fail, "relay", &exit)),
    };
    Some(match crate::relay::probe(&relay.url, &token).await {
        Ok(()) => Finding::ok(
            "relay",
            format!("the relay at {} takes this host's token", relay.url),
        ),
        Err(err) => Finding::fail(
            "relay",
            format!("the relay subscription cannot open: {err:#}"),
            "check relay.url, the token (`rm-relay channel token CHANNEL HOST`) and that this host can reach the relay",
        ),
    })
}

pub(super) fn unset(name: &str) -> bool {
    std::env::var(name)
        .ok()
        .is_none_or(|value| value.trim().is_empty())
}

/// The unpacked runner package, when `runner.package_dir` names one (CONTRACT §5), or the
/// state of the one `runner.version` names: cached, to be downloaded, or not to be had.
pub(super) async fn runner_package(config: &Config) -> Option<Finding> {
    if crate::package::follows_latest(config) {
        return Some(Finding::ok(
            "runner_package",
            crate::package::describe(config),
        ));
    }
    if let Some(wanted) = crate::package::wanted(config) {
        return Some(version_finding(config, wanted).await);
    }
    let dir = config.runner.package_dir.as_deref()?;
    let listener = dir.join("bin").join("Runner.Listener");
    Some(if is_file(&listener) {
        Finding::ok(
            "runner_package",
            format!("runner package found at {}", dir.display()),
        )
    } else {
        Finding::fail(
            "runner_package",
            format!(
                "`runner.package_dir` {} has no bin/Runner.Listener",
                dir.display()
            ),
            "unpack the actions/runner release there, or set `runner.version` to download one",
        )
    })
}

/// `runner.version`: what `rm-agent run` will find or fetch. Asks GitHub for the release's
/// metadata only when the package is not cached; never downloads.
async fn version_finding(
    config: &Config,
    wanted: Result<package::Wanted, package::PackageError>,
) -> Finding {
    let inspection = match wanted {
        Ok(wanted) => package::inspect(&wanted).await,
        Err(err) => Err(err),
    };
    match inspection {
        Ok(package::Inspection::Cached(cached)) => Finding::ok(
            "runner_package",
            format!("runner package cached at {}", cached.dir.display()),
        ),
        Ok(package::Inspection::WouldDownload(chosen)) => Finding::ok(
            "runner_package",
            format!(
                "runner package not cached yet: `rm-agent run` downloads {} ({} MiB) and checks its SHA-256 from {}",
                chosen.asset.name,
                chosen.asset.size.div_ceil(1024 * 1024),
                chosen.source.describe()
            ),
        ),
        Err(err) => Finding::from_exit(
            Status::Fail,
            "runner_package",
            &crate::package::exit(config, &err),
        ),
    }
}

fn is_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}
