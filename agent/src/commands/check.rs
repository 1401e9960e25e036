//! `rm-agent check`: is this host ready to run? The configuration has already loaded (a mistake
//! there exits 2 before this runs); this checks the secrets and the runner package on this
//! machine, then asks GitHub whether the App's JWT is accepted, whether each policy's
//! installation exists and grants what runner registration needs, and whether each
//! organization policy's runner group exists. Every finding carries the remedy for it.

use std::path::Path;

use rm_github::auth::AuthError;
use rm_github::types::Installation;
use rm_github::{ClientConfig, GithubClient, GithubError, Target};
use secrecy::SecretString;
use serde_json::json;

use crate::config::{self, Config, Policy};
use crate::exit::Exit;
use crate::output::{print_json, print_table};
use crate::runner::package;
use crate::secrets;

/// The organization permission `generate-jitconfig` and runner removal need on an organization.
pub const ORG_RUNNER_PERMISSION: &str = "organization_self_hosted_runners";
/// The repository permission the same endpoints need on a repository.
pub const REPO_RUNNER_PERMISSION: &str = "administration";
/// The permission polling needs to list queued runs and jobs.
pub const ACTIONS_PERMISSION: &str = "actions";

/// How a finding bears on running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Running works, but something is missing or degraded.
    Warn,
    /// Running cannot work until this is fixed.
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One thing checked: what was found and, unless it is fine, what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub status: Status,
    /// A stable name for scripts: `config`, `webhook_secret`, `runner_package`, `private_key`,
    /// `app`, `installation`, `permission`, `runner_group`, `relay`.
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
pub fn ready(findings: &[Finding]) -> bool {
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
pub async fn findings(config: &Config) -> Vec<Finding> {
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
    out.push(webhook_secret(config));
    if let Some(finding) = relay(config).await {
        out.push(finding);
    }
    if let Some(finding) = runner_package(config).await {
        out.push(finding);
    }

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
    if unset(secrets::PRIVATE_KEY_ENV) && config.github.private_key_file.is_none() {
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
    let key = match secrets::private_key(config) {
        Ok(key) => key,
        Err(exit) => {
            out.push(Finding::from_exit(Status::Fail, "private_key", &exit));
            return out;
        }
    };
    out.extend(github(config, app_id, key).await);
    out
}

/// The webhook secret, needed to verify deliveries from the receiver or the relay.
fn webhook_secret(config: &Config) -> Finding {
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

/// Whether an environment variable is absent or blank (the secrets readers then use the file).
/// With `[relay]`: the token is there and the relay takes it.
async fn relay(config: &Config) -> Option<Finding> {
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

fn unset(name: &str) -> bool {
    std::env::var(name)
        .ok()
        .is_none_or(|value| value.trim().is_empty())
}

/// The unpacked runner package, when `runner.package_dir` names one (CONTRACT §5), or the
/// state of the one `runner.version` names: cached, to be downloaded, or not to be had.
async fn runner_package(config: &Config) -> Option<Finding> {
    if let Some(wanted) = package::Wanted::from_config(config) {
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
        Err(err) => {
            Finding::from_exit(Status::Fail, "runner_package", &package::exit(config, &err))
        }
    }
}

fn is_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// The GitHub side: the JWT, then per policy the installation, its permissions and the group.
async fn github(config: &Config, app_id: u64, key: SecretString) -> Vec<Finding> {
    let api_url = &config.github.api_url;
    let client = match GithubClient::new(ClientConfig::new(api_url.clone(), app_id, key)) {
        Ok(client) => client,
        Err(err) if err.downcast_ref::<AuthError>().is_some() => {
            return vec![Finding::fail(
                "private_key",
                format!("cannot use the App's private key: {err:#}"),
                "download a new private key (PEM) from the App's settings and point `github.private_key_file` or $RM_GITHUB_PRIVATE_KEY at it",
            )];
        }
        Err(err) => {
            return vec![Finding::fail(
                "app",
                format!("cannot make a GitHub client: {err:#}"),
                "check `github.api_url`",
            )];
        }
    };
    let mut out = Vec::new();
    match client.app().await {
        Ok(app) => out.push(Finding::ok(
            "app",
            format!(
                "GitHub accepted the App's JWT: App \"{}\" (id {app_id}) at {api_url}",
                app.name
            ),
        )),
        Err(err) => {
            out.push(app_failure(&err, app_id, api_url));
            return out;
        }
    }
    for policy in &config.policies {
        out.extend(
            policy_findings(&client, policy)
                .await
                .into_iter()
                .map(|f| f.for_policy(policy)),
        );
    }
    out
}

fn app_failure(err: &GithubError, app_id: u64, api_url: &str) -> Finding {
    match err {
        GithubError::Unauthorized { message } => Finding::fail(
            "app",
            format!("GitHub refused the App's JWT (401: {message})"),
            format!(
                "check that `github.app_id` ({app_id}) is the App's id and that the private key is the App's current one; a host clock more than a minute off also fails (check NTP)"
            ),
        ),
        GithubError::Unreachable { reason, .. } => Finding::fail(
            "app",
            format!("cannot reach GitHub at {api_url}: {reason}"),
            "check `github.api_url`, DNS and any proxy or firewall between this host and GitHub",
        ),
        other => Finding::fail(
            "app",
            format!("GET /app failed: {other}"),
            "check `github.api_url`; retry later if GitHub reports an outage or a rate limit",
        ),
    }
}

fn github_target(policy: &Policy) -> Target {
    match &policy.target {
        config::Target::Organization(org) => Target::Org(org.clone()),
        config::Target::Repository { owner, name } => Target::Repo {
            owner: owner.clone(),
            repo: name.clone(),
        },
    }
}

async fn policy_findings(client: &GithubClient, policy: &Policy) -> Vec<Finding> {
    let target = github_target(policy);
    let installation = match client.installation(&target).await {
        Ok(installation) => installation,
        Err(GithubError::NotFound { .. }) => {
            let (kind, place) = match &target {
                Target::Org(_) => ("organization", "the organization"),
                Target::Repo { .. } => (
                    "repository",
                    "the repository (or its owner, with access to it)",
                ),
            };
            return vec![Finding::fail(
                "installation",
                format!("the App is not installed on the {kind} {target}"),
                format!("install the App on {place}: the App's page on GitHub, \"Install App\""),
            )];
        }
        Err(err) => {
            return vec![Finding::fail(
                "installation",
                format!("cannot look up the App's installation on {target}: {err}"),
                "check the target's spelling; retry later if GitHub reports an outage or a rate limit",
            )];
        }
    };
    let mut out = vec![installation_finding(&installation, &target)];
    if installation.suspended_at.is_some() {
        return out;
    }
    let permission = permission_finding(&installation, &target);
    let can_read_runners = permission.status == Status::Ok
        || granted(&installation, ORG_RUNNER_PERMISSION) == Some("read");
    out.push(permission);
    out.push(actions_finding(&installation));
    if let Target::Org(org) = &target {
        if can_read_runners {
            out.push(runner_group_finding(client, org, policy.runner_group_id).await);
        } else {
            out.push(Finding::warn(
                "runner_group",
                format!(
                    "runner group {} not checked: the installation cannot read runner groups",
                    policy.runner_group_id
                ),
                "grant the permission above, then run `rm-agent check` again",
            ));
        }
    }
    out
}

fn installation_finding(installation: &Installation, target: &Target) -> Finding {
    match &installation.suspended_at {
        Some(since) => Finding::fail(
            "installation",
            format!(
                "the App's installation {} on {target} is suspended (since {since})",
                installation.id
            ),
            "unsuspend it in the account's settings, under GitHub Apps",
        ),
        None => Finding::ok(
            "installation",
            format!(
                "the App is installed on {target} (installation {})",
                installation.id
            ),
        ),
    }
}

fn granted<'a>(installation: &'a Installation, permission: &str) -> Option<&'a str> {
    installation.permissions.get(permission).map(String::as_str)
}

/// The permission `generate-jitconfig` needs: it differs for organization and repository
/// targets.
fn permission_finding(installation: &Installation, target: &Target) -> Finding {
    let (permission, label, kind) = match target {
        Target::Org(_) => (
            ORG_RUNNER_PERMISSION,
            "Organization permissions > Self-hosted runners",
            "organization",
        ),
        Target::Repo { .. } => (
            REPO_RUNNER_PERMISSION,
            "Repository permissions > Administration",
            "repository",
        ),
    };
    match granted(installation, permission) {
        Some("write") => Finding::ok(
            "permission",
            format!("`{permission}: write` granted for runner registration on {target}"),
        ),
        has => Finding::fail(
            "permission",
            format!(
                "runner registration on the {kind} {target} needs `{permission}: write`; the installation has {}",
                has.map_or_else(
                    || "none".to_owned(),
                    |level| format!("`{permission}: {level}`")
                )
            ),
            format!(
                "in the App's settings set \"{label}\" to \"Read and write\", then accept the new permission on the installation"
            ),
        ),
    }
}

/// `actions: read` lets polling find queued jobs when webhooks are lost; not needed to run.
fn actions_finding(installation: &Installation) -> Finding {
    match granted(installation, ACTIONS_PERMISSION) {
        Some("read" | "write") => Finding::ok(
            "permission",
            "`actions: read` granted for polling queued jobs",
        ),
        _ => Finding::warn(
            "permission",
            "no `actions: read`: polling cannot find jobs whose webhook was lost",
            "in the App's settings set \"Repository permissions > Actions\" to \"Read-only\", then accept it on the installation",
        ),
    }
}

async fn runner_group_finding(client: &GithubClient, org: &str, group_id: u64) -> Finding {
    match client.list_runner_groups(org).await {
        Ok(groups) => match groups.iter().find(|g| g.id == group_id) {
            Some(group) => Finding::ok(
                "runner_group",
                format!(
                    "runner group {group_id} (\"{}\") exists in {org}",
                    group.name
                ),
            ),
            None => {
                let known: Vec<String> = groups
                    .iter()
                    .map(|g| format!("{} \"{}\"", g.id, g.name))
                    .collect();
                Finding::fail(
                    "runner_group",
                    format!(
                        "runner group {group_id} does not exist in {org} (it has: {})",
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    ),
                    "set the policy's `runner_group_id` to one of those, or create the group in the organization's settings under Actions > Runner groups",
                )
            }
        },
        Err(err) => Finding::warn(
            "runner_group",
            format!("cannot list the runner groups of {org}: {err}"),
            "check the App's permissions; retry later if GitHub reports an outage or a rate limit",
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn installation(permissions: &[(&str, &str)]) -> Installation {
        Installation {
            id: 7,
            app_id: 1,
            target_type: "Organization".into(),
            account: None,
            permissions: permissions
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            suspended_at: None,
        }
    }

    #[test]
    fn the_runner_permission_differs_by_target_kind() {
        let org = Target::Org("acme".into());
        let repo = Target::Repo {
            owner: "acme".into(),
            repo: "w".into(),
        };
        let org_only = installation(&[(ORG_RUNNER_PERMISSION, "write")]);
        assert_eq!(permission_finding(&org_only, &org).status, Status::Ok);
        let f = permission_finding(&org_only, &repo);
        assert_eq!(f.status, Status::Fail);
        assert!(f.what.contains("`administration: write`"), "{}", f.what);
        assert!(f.what.contains("has none"), "{}", f.what);
        assert!(f.remedy.contains("Administration"), "{}", f.remedy);

        let read = installation(&[(ORG_RUNNER_PERMISSION, "read")]);
        let f = permission_finding(&read, &org);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.what
                .contains("has `organization_self_hosted_runners: read`"),
            "{}",
            f.what
        );
    }

    #[test]
    fn actions_read_is_a_warning_only() {
        assert_eq!(actions_finding(&installation(&[])).status, Status::Warn);
        assert_eq!(
            actions_finding(&installation(&[(ACTIONS_PERMISSION, "read")])).status,
            Status::Ok
        );
    }

    #[test]
    fn only_failures_block() {
        let mut findings = vec![
            Finding::ok("config", "fine"),
            Finding::warn("config", "meh", "do x"),
        ];
        assert!(ready(&findings));
        findings.push(Finding::fail("app", "bad", "fix"));
        assert!(!ready(&findings));
    }

    #[tokio::test]
    async fn a_runner_version_is_reported_missing_downloadable_or_cached() {
        use rm_fake_github::{FakeGithub, FakeOptions};
        let fake = FakeGithub::start(FakeOptions::new(1, String::new()))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rm-agent.toml");
        std::fs::write(
            &file,
            format!(
                "data_dir = \"{}\"\n[github]\napi_url = \"{}\"\n[runner]\nversion = \"2.330.0\"\n",
                dir.path().join("data").display(),
                fake.api_url()
            ),
        )
        .unwrap();
        let config = config::load(&config::Sources {
            explicit_file: Some(file),
            data_dir: None,
        })
        .unwrap();

        let missing = runner_package(&config).await.unwrap();
        assert_eq!(missing.status, Status::Fail);
        assert!(
            missing.what.contains("no actions/runner release v2.330.0"),
            "{}",
            missing.what
        );
        assert!(
            missing.remedy.contains("runner.package_dir"),
            "{}",
            missing.remedy
        );

        fake.publish_runner_release("2.330.0", vec![0; 3 * 1024 * 1024]);
        let downloadable = runner_package(&config).await.unwrap();
        assert_eq!(downloadable.status, Status::Ok);
        assert!(
            downloadable.what.contains("downloads actions-runner-")
                && downloadable.what.contains("(3 MiB)"),
            "{}",
            downloadable.what
        );
        assert!(
            !fake
                .requests()
                .iter()
                .any(|r| r.path.contains("/download/")),
            "check never downloads"
        );

        let wanted = package::Wanted::from_config(&config).unwrap().unwrap();
        let cached = dir.path().join("data/packages").join(wanted.name());
        std::fs::create_dir_all(cached.join("bin")).unwrap();
        std::fs::write(cached.join("bin/Runner.Listener"), b"").unwrap();
        std::fs::write(
            cached.join(package::cache::COMPLETE_MARKER),
            "ab".repeat(32),
        )
        .unwrap();
        fake.clear_requests();
        let found = runner_package(&config).await.unwrap();
        assert_eq!(found.status, Status::Ok);
        assert!(found.what.contains("cached at"), "{}", found.what);
        assert!(fake.requests().is_empty());
    }

    #[test]
    fn agent_errors_split_into_problem_and_remedy() {
        assert_eq!(
            split_remedy("a: b is readable; run `chmod 600 b`"),
            (
                "a: b is readable".to_owned(),
                "run `chmod 600 b`".to_owned()
            )
        );
        assert_eq!(split_remedy("plain"), ("plain".to_owned(), String::new()));
    }
}
