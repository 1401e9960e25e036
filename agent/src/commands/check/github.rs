//! `check`'s findings at GitHub: the App's JWT accepted, each policy's installation found and
//! granting what runner registration and polling need, each organization policy's runner group;
//! with several Apps (`[[github.app]]`), every further App's JWT and its installation on every
//! policy's target with the registration permission, each failure naming the App and target.
//! A policy serving an enterprise scale set is checked with the enterprise's PAT instead (a
//! registration-token request), never the App: the App is not what registers its runners.

use rm_github::auth::AuthError;
use rm_github::types::Installation;
use rm_github::{ClientConfig, GithubClient, GithubError, Target};

use super::{ACTIONS_PERMISSION, Finding, ORG_RUNNER_PERMISSION, REPO_RUNNER_PERMISSION, Status};
use crate::config::scale_sets::Enterprise;
use crate::config::{Config, Policy};

/// The GitHub side: the JWT, then per policy the installation, its permissions and the group;
/// then every further App's JWT and installations ([`more_app_findings`]).
pub(super) async fn github(config: &Config, client_config: ClientConfig) -> Vec<Finding> {
    let api_url = &config.github.api_url;
    let app_id = client_config.app_id;
    let client = match GithubClient::new(client_config) {
        Ok(client) => client,
        Err(err) if err.chain().any(|e| e.downcast_ref::<AuthError>().is_some()) => {
            return vec![Finding::fail(
                "private_key",
                format!("cannot use the App's private key: {err:#}"),
                "download a new private key (PEM) from that App's settings and point its key file (`github.private_key_file`, the `[[github.app]]` entry's `private_key_file`, or $RM_GITHUB_PRIVATE_KEY) at it",
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
        let findings = match enterprise_of(config, policy) {
            Some((index, enterprise)) => {
                vec![enterprise_finding(&client, config, index, enterprise).await]
            }
            None => policy_findings(&client, policy).await,
        };
        out.extend(findings.into_iter().map(|f| f.for_policy(policy)));
    }
    out.extend(more_app_findings(&client, config).await);
    out.extend(host_name_findings(&client, config).await);
    out.extend(super::runner_version::finding(&client, config).await);
    out
}

/// Every App after the primary: GitHub accepts its JWT, and it is installed on every policy's
/// target with the permission registrations need (the primary's are checked per policy above).
/// An App missing on a target still leaves the others registering there, but its share of
/// the registrations is lost: a failure naming both.
pub(super) async fn more_app_findings(client: &GithubClient, config: &Config) -> Vec<Finding> {
    let mut targets: Vec<Target> = Vec::new();
    for policy in app_policies(config) {
        if !targets.contains(&policy.target) {
            targets.push(policy.target.clone());
        }
    }
    let mut out = Vec::new();
    for app_id in client.app_ids().into_iter().skip(1) {
        match client.app_by(app_id).await {
            Ok(app) => out.push(Finding::ok(
                "app",
                format!(
                    "GitHub accepted the JWT of App \"{}\" (id {app_id})",
                    app.name
                ),
            )),
            Err(err) => {
                let mut finding = app_failure(&err, app_id, &config.github.api_url);
                finding.what = format!("App {app_id}: {}", finding.what);
                out.push(finding);
                continue;
            }
        }
        for target in &targets {
            out.extend(app_installation_findings(client, app_id, target).await);
        }
    }
    out
}

/// App `app_id`'s installation on `target`, and its registration permission.
async fn app_installation_findings(
    client: &GithubClient,
    app_id: u64,
    target: &Target,
) -> Vec<Finding> {
    match client.installation_of_app(app_id, target).await {
        Ok(installation) if installation.suspended_at.is_some() => {
            let mut finding = installation_finding(&installation, target);
            finding.what = format!("App {app_id}: {}", finding.what);
            vec![finding]
        }
        Ok(installation) => {
            let mut permission = permission_finding(&installation, target);
            permission.what = format!("App {app_id}: {}", permission.what);
            vec![
                Finding::ok(
                    "installation",
                    format!(
                        "App {app_id} is installed on {target} (installation {}): it takes a share of the registrations there",
                        installation.id
                    ),
                ),
                permission,
            ]
        }
        Err(GithubError::NotFound { .. }) => vec![Finding::fail(
            "installation",
            format!(
                "App {app_id} is not installed on {target}: registrations there go through the other Apps only, at their rate"
            ),
            format!(
                "install App {app_id} on {target} (the App's page on GitHub, \"Install App\"), or remove its `[[github.app]]` entry"
            ),
        )],
        Err(err) => vec![Finding::fail(
            "installation",
            format!("cannot look up App {app_id}'s installation on {target}: {err}"),
            "retry later if GitHub reports an outage or a rate limit",
        )],
    }
}

/// Lists the runners of each distinct policy target and warns when another host's names start
/// with this host's `rm-<host>-`. Only a finding when it finds something: a target whose runners
/// cannot be listed is already named by the permission findings above.
async fn host_name_findings(client: &GithubClient, config: &Config) -> Vec<Finding> {
    let mut targets: Vec<Target> = Vec::new();
    for policy in app_policies(config) {
        let target = policy.target.clone();
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    let mut names = Vec::new();
    for target in &targets {
        match client.list_runners(target).await {
            Ok(runners) => names.extend(runners.value.into_iter().map(|r| r.name)),
            Err(err) => tracing::debug!(%target, error = %err, "check: runners not listed"),
        }
    }
    host_prefix_collision(&config.host.name, &names)
        .into_iter()
        .collect()
}

/// The warning for runner names GitHub lists that start with this host's `rm-<host>-` but are
/// not this host's own `rm-<host>-<12 hex>` ([`crate::executor::owns_runner_name`]): host `ci`
/// seeing `rm-ci-2-0123456789ab` (host `ci-2`'s). Each host still only ever touches its own
/// runners, but `rm-ci-*` in a log search, a dashboard filter or GitHub's runner list means
/// two hosts, so the names should differ.
pub(super) fn host_prefix_collision(host: &str, names: &[String]) -> Option<Finding> {
    let prefix = format!("rm-{host}-");
    let mut others = std::collections::BTreeSet::new();
    let mut example = None;
    for name in names {
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        if crate::executor::owns_runner_name(host, name) {
            continue;
        }
        // `rm-<other host>-<12 hex>`: name the other host; anything else by its own name.
        let other = match rest.rsplit_once('-') {
            Some((tail, short))
                if crate::executor::owns_runner_name(&format!("{host}-{tail}"), name) =>
            {
                debug_assert_eq!(short.len(), rm_journal::ATTEMPT_SHORT_LEN);
                format!("`{host}-{tail}`")
            }
            _ => format!("the runner `{name}`"),
        };
        others.insert(other);
        example.get_or_insert_with(|| name.clone());
    }
    let example = example?;
    let others: Vec<String> = others.into_iter().collect();
    Some(Finding::warn(
        "host_name",
        format!(
            "GitHub lists runners whose names start with this host's prefix `{prefix}` but that are not this host's (e.g. {example}): host names `{host}` and {} share a prefix, so logs and name filters such as `{prefix}*` are ambiguous (each host still only touches its own `{prefix}<12 hex>` runners)",
            others.join(", ")
        ),
        format!(
            "give each host a distinct `[host] name` that is not another host's name followed by `-` (e.g. `{host}-a` and `{host}-b` instead of `{host}` and `{host}-2`)"
        ),
    ))
}

/// The enterprise scale set `policy` serves, with the scale set's index in the file (for its
/// key); `None` for a policy whose runners register through the App.
fn enterprise_of<'a>(config: &'a Config, policy: &Policy) -> Option<(usize, &'a Enterprise)> {
    config
        .scale_sets
        .iter()
        .enumerate()
        .find(|(_, set)| set.policy == policy.name)
        .and_then(|(index, set)| Some((index, set.enterprise.as_ref()?)))
}

/// The policies whose runners register through the App (every one but an enterprise scale
/// set's): the ones whose targets the App's findings look at.
fn app_policies(config: &Config) -> impl Iterator<Item = &Policy> {
    config.policies.iter().filter(|p| p.registers_through_app())
}

/// An enterprise scale set's PAT: read as `run` reads it (refused when missing, empty or open
/// to others), then a registration token asked with it, as the listener's first request is.
async fn enterprise_finding(
    client: &GithubClient,
    config: &Config,
    index: usize,
    enterprise: &Enterprise,
) -> Finding {
    use rm_github::scaleset::{Credential, ScaleSetClient, ScaleSetError};
    let key = format!("scale_set[{index}].token_file");
    let token = match crate::secrets::enterprise_token(&enterprise.token_file, &key) {
        Ok(token) => token,
        Err(exit) => return Finding::from_exit(Status::Fail, "enterprise_token", &exit),
    };
    let slug = &enterprise.slug;
    let scale_sets = ScaleSetClient::with_credential(
        client.clone(),
        Credential::EnterprisePat {
            slug: slug.clone(),
            token,
        },
        crate::scaleset::enterprise_config_url(&config.github.api_url, slug),
    );
    let verified = match scale_sets {
        Ok(scale_sets) => scale_sets.verify_credential().await,
        Err(err) => {
            return Finding::fail(
                "enterprise_token",
                format!("cannot make the enterprise's client: {err:#}"),
                "check `github.api_url`",
            );
        }
    };
    match verified {
        Ok(()) => Finding::ok(
            "enterprise_token",
            format!(
                "GitHub issued a registration token of the enterprise {slug} to the PAT in {}",
                enterprise.token_file.display()
            ),
        ),
        Err(ScaleSetError::TokenRefused {
            status, message, ..
        }) => Finding::fail(
            "enterprise_token",
            format!(
                "GitHub refused the PAT in {} for the enterprise {slug} ({status}: {message})",
                enterprise.token_file.display()
            ),
            format!(
                "put a valid classic personal access token with the scope `manage_runners:enterprise`, of an owner of the enterprise {slug}, in `{key}` (mode 0600)"
            ),
        ),
        Err(err) => Finding::fail(
            "enterprise_token",
            format!("cannot ask the enterprise {slug}'s registration token: {err}"),
            "check the enterprise's slug (`enterprise`, as in https://github.com/enterprises/<slug>); retry later if GitHub reports an outage or a rate limit",
        ),
    }
}

fn app_failure(err: &GithubError, app_id: u64, api_url: &str) -> Finding {
    match err {
        GithubError::Unauthorized { message } => Finding::fail(
            "app",
            format!("GitHub refused the App's JWT (401: {message})"),
            format!(
                "check that `github.app_id` (or the `[[github.app]]` entry's `id`, {app_id}) is the App's id and that the private key is the App's current one; a host clock more than a minute off also fails (check NTP)"
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

async fn policy_findings(client: &GithubClient, policy: &Policy) -> Vec<Finding> {
    let target = policy.target.clone();
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
pub(super) fn permission_finding(installation: &Installation, target: &Target) -> Finding {
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
pub(super) fn actions_finding(installation: &Installation) -> Finding {
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
