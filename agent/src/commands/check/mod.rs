//! `rm-agent check`: is this host ready to run? The configuration has already loaded (a mistake
//! there exits 2 before this runs); this checks the secrets and the runner package on this
//! machine, then asks GitHub whether the App's JWT is accepted, whether each policy's
//! installation exists and grants what runner registration needs, and whether each
//! organization policy's runner group exists. With `journal.url` it also checks the fleet's
//! PostgreSQL journal (reachable, schema version, the role's rights). Every finding carries the
//! remedy for it.

mod cache;
mod docker;
mod egress;
mod fitness;
mod github;
mod image;
mod isolation;
mod journal;
#[cfg(test)]
mod journal_tests;
mod local;
mod runner_version;
#[cfg(test)]
mod tests;
mod trust;

/// The trust findings alone, for `crate::trust`'s tests of what `run` and `check` both refuse.
#[cfg(test)]
pub(crate) use trust::trust as trust_findings;

use serde_json::json;

use crate::config::{self, Config, Policy};
use crate::exit::Exit;
use crate::output::{print_json, print_table};
use crate::secrets;

/// The organization permission `generate-jitconfig` and runner removal need on an organization.
pub(crate) const ORG_RUNNER_PERMISSION: &str = "organization_self_hosted_runners";
/// The repository permission the same endpoints need on a repository.
pub(crate) const REPO_RUNNER_PERMISSION: &str = "administration";
/// The permission polling needs to list queued runs and jobs.
pub(crate) const ACTIONS_PERMISSION: &str = "actions";

/// How a finding bears on running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    /// Running works, but something is missing or degraded.
    Warn,
    /// Running cannot work until this is fixed.
    Fail,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One thing checked: what was found and, unless it is fine, what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub status: Status,
    /// A stable name for scripts: `config`, `webhook_secret`, `runner_package`, `private_key`,
    /// `app`, `installation`, `permission`, `runner_group`, `host_name`, `relay`, `isolation`,
    /// `fitness`, `env_file`, `runner_version`, `journal`, `protected_links`, `docker`,
    /// `notifications`, `enterprise_token`, `cache`, `image`, `docker_images`, `egress`.
    pub check: &'static str,
    /// The policy the finding is about, if any.
    pub policy: Option<String>,
    pub what: String,
    /// Empty for an `ok` finding.
    pub remedy: String,
}

impl Finding {
    fn ok(check: &'static str, what: impl Into<String>) -> Self {
        Self::new(Status::Ok, check, what, "")
    }

    fn warn(check: &'static str, what: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self::new(Status::Warn, check, what, remedy)
    }

    fn fail(check: &'static str, what: impl Into<String>, remedy: impl Into<String>) -> Self {
        Self::new(Status::Fail, check, what, remedy)
    }

    fn new(
        status: Status,
        check: &'static str,
        what: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Finding {
            status,
            check,
            policy: None,
            what: what.into(),
            remedy: remedy.into(),
        }
    }

    fn for_policy(mut self, policy: &Policy) -> Self {
        self.policy = Some(policy.name.clone());
        self
    }

    /// A finding from one of the agent's own one-sentence errors ("problem; remedy").
    fn from_exit(status: Status, check: &'static str, exit: &Exit) -> Self {
        let (what, remedy) = split_remedy(&exit.message);
        Self::new(status, check, what, remedy)
    }
}

/// Splits "problem; remedy" at its last `; `, the shape of the secrets readers' errors once a
/// secret is configured (the "none configured" cases are worded here, before they are read).
fn split_remedy(message: &str) -> (String, String) {
    match message.rsplit_once("; ") {
        Some((what, remedy)) => (what.to_owned(), remedy.to_owned()),
        None => (message.to_owned(), String::new()),
    }
}

/// Whether nothing found blocks running.
pub(crate) fn ready(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.status != Status::Fail)
}

/// Runs every check, prints the findings, and exits 1 when one of them blocks running.
pub async fn run(config: &Config, json: bool) -> Result<(), Exit> {
    let findings = findings(config).await;
    if json {
        let list: Vec<_> = findings
            .iter()
            .map(|f| {
                json!({
                    "status": f.status.as_str(),
                    "check": f.check,
                    "policy": f.policy,
                    "what": f.what,
                    "remedy": f.remedy,
                })
            })
            .collect();
        print_json(&json!({"ready": ready(&findings), "findings": list}));
    } else {
        let rows: Vec<Vec<String>> = findings
            .iter()
            .map(|f| {
                vec![
                    f.status.as_str().to_owned(),
                    f.policy.as_deref().map_or_else(
                        || f.what.clone(),
                        |policy| format!("policy {policy}: {}", f.what),
                    ),
                    if f.remedy.is_empty() {
                        "-".to_owned()
                    } else {
                        f.remedy.clone()
                    },
                ]
            })
            .collect();
        print_table(&["STATUS", "WHAT", "REMEDY"], &rows);
    }
    if ready(&findings) {
        Ok(())
    } else {
        let blocking = findings.iter().filter(|f| f.status == Status::Fail).count();
        Err(Exit::runtime(anyhow::anyhow!(
            "{blocking} finding(s) block running; fix them as their remedy says and run `rm-agent check` again"
        )))
    }
}

/// Every finding, in the order an operator fixes them: local first, then GitHub.
pub(crate) async fn findings(config: &Config) -> Vec<Finding> {
    let mut out = vec![Finding::ok(
        "config",
        format!(
            "configuration {} is valid",
            config::display_file(config.source.as_deref())
        ),
    )];
    if config.policies.is_empty() {
        out.push(Finding::warn(
            "config",
            "no [[policy]]: the agent will not start any runner",
            "add a [[policy]] with a target and labels (docs/configuration.md)",
        ));
    }
    out.push(local::webhook_secret(config));
    out.extend(journal::journal(config).await);
    if let Some(finding) = local::relay(config).await {
        out.push(finding);
    }
    out.extend(local::notifications(config));
    if let Some(finding) = local::runner_package(config).await {
        out.push(finding);
    }
    out.push(isolation::isolation(config));
    out.push(isolation::network(config));
    out.extend(fitness::env_files(config));
    out.extend(trust::trust(config));
    out.extend(fitness::fitness(config).await);
    out.extend(docker::docker(config));
    out.extend(cache::cache(config).await);
    out.extend(image::images(config).await);
    out.extend(egress::egress(config));

    let Some(app_id) = config.github.app_id else {
        out.push(Finding::fail(
            "app",
            "`github.app_id` is not set",
            format!(
                "set `github.app_id` in {} to the App's id (the App's settings page shows it)",
                config::display_file(config.source.as_deref())
            ),
        ));
        return out;
    };
    if local::unset(secrets::PRIVATE_KEY_ENV) && config.github.private_key_file.is_none() {
        out.push(Finding::fail(
            "private_key",
            "no GitHub App private key is configured",
            format!(
                "download a private key from the App's settings and set `github.private_key_file` in {} to its path (or put the PEM text in ${})",
                config::display_file(config.source.as_deref()),
                secrets::PRIVATE_KEY_ENV
            ),
        ));
        return out;
    }
    let client_config = match crate::commands::run::client_config(config, app_id) {
        Ok(client_config) => client_config,
        Err(exit) => {
            out.push(Finding::from_exit(Status::Fail, "private_key", &exit));
            return out;
        }
    };
    out.extend(github::github(config, client_config).await);
    out
}
