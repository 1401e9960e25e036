//! The endpoints rm calls, one method each, on top of the transport in [`crate::client`]: App
//! endpoints signed with the JWT, installation endpoints with the installation's token. It owns
//! the one mapping from rm's endpoint names to GitHub's path templates ([`ENDPOINTS`]), which
//! is what GitHub means by "a single REST endpoint" in its secondary limits.

use std::time::SystemTime;

use http::{Method, header};

use crate::budget::Scope;
use crate::client::{
    ABSENT_RECHECK, Auth, Call, GithubClient, PER_PAGE, Polled, decode, decode_items,
};
use crate::error::{GithubError, RerunError};
use crate::target::Target;
use crate::types::*;
use crate::wire::{next_cursor, percent_encode};
use rm_vocab::{JobId, RunnerId};

/// Every endpoint name rm sends (`Call::endpoint`), with the method and path template GitHub
/// documents it under. GitHub's points limit (900 a minute) is per template, so two names of
/// one template (`repos.runners.list` and `repos.runners.by_name`) share its window, and every
/// repository's or organization's requests to a template share it too.
pub(crate) const ENDPOINTS: &[(&str, &str)] = &[
    ("app.get", "GET /app"),
    (
        "orgs.runners.registration_token",
        "POST /orgs/{org}/actions/runners/registration-token",
    ),
    (
        "repos.runners.registration_token",
        "POST /repos/{owner}/{repo}/actions/runners/registration-token",
    ),
    ("app.installations", "GET /app/installations"),
    (
        "app.access_tokens",
        "POST /app/installations/{installation_id}/access_tokens",
    ),
    ("app.orgs.installation", "GET /orgs/{org}/installation"),
    (
        "app.repos.installation",
        "GET /repos/{owner}/{repo}/installation",
    ),
    ("app.hook_deliveries", "GET /app/hook/deliveries"),
    (
        "app.hook_redeliver",
        "POST /app/hook/deliveries/{delivery_id}/attempts",
    ),
    (
        "orgs.runners.jit",
        "POST /orgs/{org}/actions/runners/generate-jitconfig",
    ),
    (
        "repos.runners.jit",
        "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig",
    ),
    ("orgs.runners.list", "GET /orgs/{org}/actions/runners"),
    ("orgs.runners.by_name", "GET /orgs/{org}/actions/runners"),
    (
        "repos.runners.list",
        "GET /repos/{owner}/{repo}/actions/runners",
    ),
    (
        "repos.runners.by_name",
        "GET /repos/{owner}/{repo}/actions/runners",
    ),
    (
        "orgs.runners.get",
        "GET /orgs/{org}/actions/runners/{runner_id}",
    ),
    (
        "repos.runners.get",
        "GET /repos/{owner}/{repo}/actions/runners/{runner_id}",
    ),
    (
        "orgs.runners.delete",
        "DELETE /orgs/{org}/actions/runners/{runner_id}",
    ),
    (
        "repos.runners.delete",
        "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}",
    ),
    (
        "orgs.runner_groups.list",
        "GET /orgs/{org}/actions/runner-groups",
    ),
    (
        "repos.actions.runs",
        "GET /repos/{owner}/{repo}/actions/runs",
    ),
    (
        "repos.actions.jobs",
        "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
    ),
    (
        "repos.actions.run",
        "GET /repos/{owner}/{repo}/actions/runs/{run_id}",
    ),
    (
        "repos.actions.job",
        "GET /repos/{owner}/{repo}/actions/jobs/{job_id}",
    ),
    (
        "repos.actions.job_rerun",
        "POST /repos/{owner}/{repo}/actions/jobs/{job_id}/rerun",
    ),
    (
        "installation.repositories",
        "GET /installation/repositories",
    ),
    (
        "repos.releases.latest",
        "GET /repos/{owner}/{repo}/releases/latest",
    ),
    ("repos.releases.list", "GET /repos/{owner}/{repo}/releases"),
    (
        "repos.commits.get",
        "GET /repos/{owner}/{repo}/commits/{ref}",
    ),
    ("repos.tarball", "GET /repos/{owner}/{repo}/tarball/{ref}"),
    ("rate_limit", "GET /rate_limit"),
];

/// GitHub's method and path template of the endpoint rm calls `name`, if rm sends it.
pub(crate) fn template(name: &str) -> Option<&'static str> {
    ENDPOINTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, template)| *template)
}

impl GithubClient {
    // ---- App endpoints (JWT) ----

    /// `GET /app`: the primary App.
    pub async fn app(&self) -> Result<App, GithubError> {
        self.app_by(self.primary_app()).await
    }

    /// `GET /app` with the JWT of App `app_id`: whether GitHub accepts that App's key.
    pub async fn app_by(&self, app_id: u64) -> Result<App, GithubError> {
        self.get_json(Call::get("app.get", Auth::App(app_id), "/app".into()))
            .await
    }

    /// `GET /app/installations` of the primary App.
    pub async fn list_installations(&self) -> Result<Vec<Installation>, GithubError> {
        let path = format!("/app/installations?per_page={PER_PAGE}");
        self.get_json(Call::get("app.installations", self.primary(), path))
            .await
    }

    /// The primary App's installation covering `target`, from `GET /orgs/{org}/installation`
    /// or `GET /repos/{owner}/{repo}/installation`, remembered for the life of the client.
    pub async fn installation_for(&self, target: &Target) -> Result<u64, GithubError> {
        let primary = self.primary_app();
        let known = self
            .known()
            .by_target
            .get(&(primary, target.clone()))
            .copied();
        if let Some(id) = known {
            return Ok(id);
        }
        Ok(self.installation(target).await?.id)
    }

    /// The primary App's installation covering `target`, asked afresh (with its permissions
    /// and whether it is suspended); its id is remembered as
    /// [`GithubClient::installation_for`] does.
    pub async fn installation(&self, target: &Target) -> Result<Installation, GithubError> {
        self.installation_of_app(self.primary_app(), target).await
    }

    /// App `app_id`'s installation covering `target`, asked afresh with that App's JWT; its id,
    /// and that it belongs to the App, are remembered.
    pub async fn installation_of_app(
        &self,
        app_id: u64,
        target: &Target,
    ) -> Result<Installation, GithubError> {
        let endpoint = match target {
            Target::Org(_) => "app.orgs.installation",
            Target::Repo { .. } => "app.repos.installation",
        };
        let installation: Installation = self
            .get_json(Call::get(
                endpoint,
                Auth::App(app_id),
                target.installation_path(),
            ))
            .await?;
        let mut known = self.known();
        known
            .by_target
            .insert((app_id, target.clone()), installation.id);
        known.app_of.insert(installation.id, app_id);
        known.absent.remove(&(app_id, target.clone()));
        Ok(installation)
    }

    /// Every App's installation covering `target`, the primary's first: where a JIT
    /// registration for it may be made. An App GitHub says is not installed there (`404`) is
    /// left out, logged once, and asked again after [`ABSENT_RECHECK`]; another App's failure
    /// to answer leaves it out this time. `Err` only when no App covers the target: the
    /// primary's error (or the last one's when the primary's was a `404`).
    pub async fn registration_installations(
        &self,
        target: &Target,
    ) -> Result<Vec<u64>, GithubError> {
        let mut found = Vec::new();
        let mut first_error = None;
        for app_id in self.app_ids() {
            let key = (app_id, target.clone());
            let (known, absent) = {
                let known = self.known();
                (
                    known.by_target.get(&key).copied(),
                    known.absent.get(&key).copied(),
                )
            };
            if let Some(id) = known {
                found.push(id);
                continue;
            }
            let now = self.inner.now();
            if absent.is_some_and(|at| !absence_expired(at, now)) {
                continue;
            }
            match self.installation_of_app(app_id, target).await {
                Ok(installation) => found.push(installation.id),
                Err(e @ GithubError::NotFound { .. }) => {
                    let mut known = self.known();
                    known.absent.insert(key.clone(), now);
                    if known.absence_logged.insert(key) {
                        tracing::warn!(
                            app = app_id,
                            %target,
                            "this GitHub App is not installed on the target; its registrations go through the other Apps (`rm-agent check` names it)"
                        );
                    }
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    tracing::warn!(app = app_id, %target, error = %e, "cannot look up this App's installation; registering through the other Apps this time");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if found.is_empty() => Err(e),
            _ => Ok(found),
        }
    }

    /// When a JIT registration through `installation` for `target` could leave by the
    /// budget's account (its primary limit, any secondary limit GitHub announced, and the
    /// pacing windows: the template's points, and the content limits while they count):
    /// `None` now, else the time. Reserves nothing.
    pub fn registration_admitted(&self, installation: u64, target: &Target) -> Option<SystemTime> {
        match self.inner.budget.check(
            Scope::Installation(installation),
            jit_endpoint(target),
            crate::pacing::Cost::Creation,
            self.inner.now(),
        ) {
            Ok(()) => None,
            Err(GithubError::RateLimited { retry_at, .. }) => Some(retry_at),
            Err(_) => None,
        }
    }

    /// `GET /app/hook/deliveries`: one page, newest first, and the cursor of the next.
    pub async fn list_hook_deliveries(
        &self,
        cursor: Option<&str>,
    ) -> Result<DeliveryPage, GithubError> {
        let mut path = format!("/app/hook/deliveries?per_page={PER_PAGE}");
        if let Some(cursor) = cursor {
            path.push_str("&cursor=");
            path.push_str(&percent_encode(cursor));
        }
        let answer = self
            .run(&Call::get("app.hook_deliveries", self.primary(), path))
            .await?;
        let next_cursor = answer
            .headers
            .get(header::LINK)
            .and_then(|v| v.to_str().ok())
            .and_then(next_cursor);
        let listed: serde_json::Value = decode("app.hook_deliveries", &answer.body)?;
        Ok(DeliveryPage {
            deliveries: decode_items("app.hook_deliveries", Some(listed))?.0,
            next_cursor,
        })
    }

    /// `POST /app/hook/deliveries/{id}/attempts`: GitHub sends the delivery again, same GUID.
    pub async fn redeliver(&self, delivery_id: u64) -> Result<(), GithubError> {
        let call = Call {
            method: Method::POST,
            ..Call::get(
                "app.hook_redeliver",
                self.primary(),
                format!("/app/hook/deliveries/{delivery_id}/attempts"),
            )
        };
        self.run(&call).await.map(|_| ())
    }

    // ---- Installation endpoints ----

    /// `POST .../actions/runners/generate-jitconfig` for an organization or a repository,
    /// through the primary App's installation.
    pub async fn generate_jitconfig(
        &self,
        target: &Target,
        request: &JitRequest,
    ) -> Result<JitConfig, GithubError> {
        let installation = self.installation_for(target).await?;
        self.generate_jitconfig_in(installation, target, request)
            .await
    }

    /// `POST .../actions/runners/generate-jitconfig` through `installation` (one of
    /// [`GithubClient::registration_installations`]): the runner registers on `target` whichever
    /// App's installation asked. Counted per App for `/metrics`.
    pub async fn generate_jitconfig_in(
        &self,
        installation: u64,
        target: &Target,
        request: &JitRequest,
    ) -> Result<JitConfig, GithubError> {
        let auth = Auth::Installation(installation);
        let endpoint = jit_endpoint(target);
        let body = serde_json::to_value(request).map_err(|e| GithubError::Unexpected {
            endpoint,
            status: 0,
            message: e.to_string(),
        })?;
        let call = Call {
            method: Method::POST,
            body: Some(body),
            ..Call::get(
                endpoint,
                auth,
                format!("{}/generate-jitconfig", target.runners_path()),
            )
        };
        let jit = self.get_json(call).await?;
        let app = self
            .app_of(installation)
            .unwrap_or_else(|| self.primary_app());
        self.inner.stats.registered(app, installation);
        Ok(jit)
    }

    /// `GET .../actions/runners`: the target's self-hosted runners (conditional).
    pub async fn list_runners(&self, target: &Target) -> Result<Polled<Vec<Runner>>, GithubError> {
        let auth = self.installation_of(target).await?;
        let endpoint = match target {
            Target::Org(_) => "orgs.runners.list",
            Target::Repo { .. } => "repos.runners.list",
        };
        self.list(endpoint, auth, &target.runners_path(), "", "runners")
            .await
    }

    /// The runner called `name` on `target`, if any (`GET .../actions/runners?name=`): after a
    /// 409 from `generate-jitconfig`, this finds the registration a crashed attempt left.
    pub async fn find_runner_by_name(
        &self,
        target: &Target,
        name: &str,
    ) -> Result<Option<Runner>, GithubError> {
        let auth = self.installation_of(target).await?;
        let endpoint = match target {
            Target::Org(_) => "orgs.runners.by_name",
            Target::Repo { .. } => "repos.runners.by_name",
        };
        let path = format!("{}?name={}", target.runners_path(), percent_encode(name));
        let mut value: serde_json::Value = self.get_json(Call::get(endpoint, auth, path)).await?;
        let (runners, _): (Vec<Runner>, _) = decode_items(
            endpoint,
            value.get_mut("runners").map(serde_json::Value::take),
        )?;
        Ok(runners.into_iter().find(|r| r.name == name))
    }

    /// `GET .../actions/runners/{id}`.
    pub async fn get_runner(
        &self,
        target: &Target,
        runner_id: RunnerId,
    ) -> Result<Runner, GithubError> {
        let auth = self.installation_of(target).await?;
        let endpoint = match target {
            Target::Org(_) => "orgs.runners.get",
            Target::Repo { .. } => "repos.runners.get",
        };
        let path = format!("{}/{runner_id}", target.runners_path());
        self.get_json(Call::get(endpoint, auth, path)).await
    }

    /// `DELETE .../actions/runners/{id}`.
    pub async fn delete_runner(
        &self,
        target: &Target,
        runner_id: RunnerId,
    ) -> Result<(), GithubError> {
        let auth = self.installation_of(target).await?;
        let endpoint = match target {
            Target::Org(_) => "orgs.runners.delete",
            Target::Repo { .. } => "repos.runners.delete",
        };
        let call = Call {
            method: Method::DELETE,
            ..Call::get(
                endpoint,
                auth,
                format!("{}/{runner_id}", target.runners_path()),
            )
        };
        self.run(&call).await.map(|_| ())
    }

    /// `GET /orgs/{org}/actions/runner-groups`.
    pub async fn list_runner_groups(&self, org: &str) -> Result<Vec<RunnerGroup>, GithubError> {
        let auth = self.installation_of(&Target::Org(org.to_owned())).await?;
        let path = format!("/orgs/{org}/actions/runner-groups");
        Ok(self
            .list("orgs.runner_groups.list", auth, &path, "", "runner_groups")
            .await?
            .value)
    }

    /// `GET /repos/{owner}/{repo}/actions/runs?status=...` (conditional).
    pub async fn list_workflow_runs(
        &self,
        owner: &str,
        repo: &str,
        status: &str,
    ) -> Result<Polled<Vec<WorkflowRun>>, GithubError> {
        let target = Target::Repo {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
        };
        let auth = self.installation_of(&target).await?;
        let path = format!("/repos/{owner}/{repo}/actions/runs");
        let query = format!("status={}", percent_encode(status));
        self.list("repos.actions.runs", auth, &path, &query, "workflow_runs")
            .await
    }

    /// `GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs` (conditional).
    pub async fn list_run_jobs(
        &self,
        owner: &str,
        repo: &str,
        run_id: u64,
    ) -> Result<Polled<Vec<WorkflowJob>>, GithubError> {
        let target = Target::Repo {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
        };
        let auth = self.installation_of(&target).await?;
        let path = format!("/repos/{owner}/{repo}/actions/runs/{run_id}/jobs");
        self.list("repos.actions.jobs", auth, &path, "", "jobs")
            .await
    }

    /// `GET /repos/{owner}/{repo}/actions/runs/{run_id}`: who a run is (its event, branch and
    /// head repository), which the host-local cache scopes a job's entries by.
    pub async fn get_run(
        &self,
        owner: &str,
        repo: &str,
        run_id: u64,
    ) -> Result<RunIdentity, GithubError> {
        let target = Target::Repo {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
        };
        let auth = self.installation_of(&target).await?;
        let path = format!("/repos/{owner}/{repo}/actions/runs/{run_id}");
        self.get_json(Call::get("repos.actions.run", auth, path))
            .await
    }

    /// `GET /repos/{owner}/{repo}/actions/jobs/{job_id}`.
    pub async fn get_job(
        &self,
        owner: &str,
        repo: &str,
        job_id: JobId,
    ) -> Result<WorkflowJob, GithubError> {
        let target = Target::Repo {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
        };
        let auth = self.installation_of(&target).await?;
        let path = format!("/repos/{owner}/{repo}/actions/jobs/{job_id}");
        self.get_json(Call::get("repos.actions.job", auth, path))
            .await
    }

    /// `POST /repos/{owner}/{repo}/actions/jobs/{job_id}/rerun` (GitHub answers 201): GitHub
    /// queues the job again (and the jobs that depend on it) as a new job of the same run, one
    /// run attempt later. Needs the App's repository permission "Actions: Read and write"; a 403
    /// without it is [`RerunError::MissingActionsWrite`]. The body asks for nothing extra (no
    /// debug logging): the job runs again as it was.
    pub async fn rerun_job(
        &self,
        owner: &str,
        repo: &str,
        job_id: JobId,
    ) -> Result<(), RerunError> {
        let target = Target::Repo {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
        };
        let auth = self.installation_of(&target).await?;
        let call = Call {
            method: Method::POST,
            body: Some(serde_json::json!({})),
            ..Call::get(
                "repos.actions.job_rerun",
                auth,
                format!("/repos/{owner}/{repo}/actions/jobs/{job_id}/rerun"),
            )
        };
        match self.run(&call).await {
            Ok(_) => Ok(()),
            Err(e) => Err(RerunError::from_github(e)),
        }
    }

    /// `GET /installation/repositories` for one installation (conditional).
    pub async fn list_installation_repositories(
        &self,
        installation: u64,
    ) -> Result<Polled<Vec<Repository>>, GithubError> {
        self.list(
            "installation.repositories",
            Auth::Installation(installation),
            "/installation/repositories",
            "",
            "repositories",
        )
        .await
    }

    /// `GET /repos/{repository}/releases/latest` with an installation's token, conditional (an
    /// unchanged release is a free `304`, answered from the cache): the newest published release
    /// that is neither a draft nor a prerelease. A read, charged to the installation's quota.
    pub async fn latest_release(
        &self,
        installation: u64,
        repository: &str,
    ) -> Result<Polled<ReleaseSummary>, GithubError> {
        let call = Call {
            conditional: true,
            ..Call::get(
                "repos.releases.latest",
                Auth::Installation(installation),
                format!("/repos/{repository}/releases/latest"),
            )
        };
        let answer = self.run(&call).await?;
        Ok(Polled {
            value: decode(call.endpoint, &answer.body)?,
            not_modified: answer.not_modified,
        })
    }

    /// The first page of `GET /repos/{repository}/releases` (newest first, [`PER_PAGE`] of
    /// them), conditional: the dates a pinned version's window is judged by.
    pub async fn list_releases(
        &self,
        installation: u64,
        repository: &str,
    ) -> Result<Polled<Vec<ReleaseSummary>>, GithubError> {
        let call = Call {
            conditional: true,
            ..Call::get(
                "repos.releases.list",
                Auth::Installation(installation),
                format!("/repos/{repository}/releases?per_page={PER_PAGE}"),
            )
        };
        let answer = self.run(&call).await?;
        let value: serde_json::Value = decode(call.endpoint, &answer.body)?;
        let (releases, _) = decode_items(call.endpoint, Some(value))?;
        Ok(Polled {
            value: releases,
            not_modified: answer.not_modified,
        })
    }

    /// `GET /rate_limit` with an installation's token; costs no quota. What it says about every
    /// resource goes into the budget, so a fresh process starts from GitHub's numbers.
    pub async fn rate_limit(&self, installation: u64) -> Result<RateLimitOverview, GithubError> {
        let call = Call {
            charged: false,
            ..Call::get(
                "rate_limit",
                Auth::Installation(installation),
                "/rate_limit".into(),
            )
        };
        let overview: RateLimitOverview = self.get_json(call).await?;
        for (resource, e) in &overview.resources {
            self.inner.budget.seed(
                Scope::Installation(installation),
                resource,
                e.limit,
                e.remaining,
                e.reset,
            );
        }
        Ok(overview)
    }
}

/// The endpoint name of a JIT registration for `target`.
fn jit_endpoint(target: &Target) -> &'static str {
    match target {
        Target::Org(_) => "orgs.runners.jit",
        Target::Repo { .. } => "repos.runners.jit",
    }
}

/// Whether an App's absence, noted at `noted`, is old enough at `now` to be asked again.
fn absence_expired(noted: SystemTime, now: SystemTime) -> bool {
    now.duration_since(noted).unwrap_or_default() >= ABSENT_RECHECK
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_absent_app_is_asked_again_after_the_recheck_interval() {
        let noted = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        for (after, again) in [
            (Duration::ZERO, false),
            (ABSENT_RECHECK - Duration::from_secs(1), false),
            (ABSENT_RECHECK, true),
            (ABSENT_RECHECK * 3, true),
        ] {
            assert_eq!(absence_expired(noted, noted + after), again, "{after:?}");
        }
        // A clock that went back does not make it due.
        assert!(!absence_expired(noted, noted - Duration::from_secs(5)));
    }

    /// GitHub's own OpenAPI description of the endpoints rm calls (a subset of GitHub's file).
    const OPENAPI: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fake-github/github-rest-subset.json"
    );

    /// The operations rm calls that the subset above does not hold yet, described by hand from
    /// GitHub's documentation page each names (the file says so); kept apart so the subset stays
    /// GitHub's own text.
    const DESCRIBED: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fake-github/github-rest-described.json"
    );

    fn load(path: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Every name in the table is a method and path GitHub documents (in its OpenAPI subset,
    /// or described from its documentation page, never both), and every name the client
    /// sends (each endpoint-name literal in this file and in the transport's) is in the table.
    #[test]
    fn every_endpoint_name_maps_to_a_documented_template() {
        let spec = load(OPENAPI);
        let described = load(DESCRIBED);
        let operation = |spec: &serde_json::Value, method: &str, path: &str| {
            spec["paths"][path]
                .get(method.to_ascii_lowercase())
                .is_some()
        };
        for (name, template) in ENDPOINTS {
            let (method, path) = template
                .split_once(' ')
                .unwrap_or_else(|| panic!("{name}: {template:?} is not METHOD PATH"));
            let upstream = operation(&spec, method, path);
            let by_hand = operation(&described, method, path);
            assert!(
                upstream || by_hand,
                "{name}: {template} is not in GitHub's OpenAPI"
            );
            assert!(
                !(upstream && by_hand),
                "{name}: {template} is in GitHub's OpenAPI subset now: delete it from {DESCRIBED}"
            );
            if by_hand {
                let docs =
                    described["paths"][path][method.to_ascii_lowercase()]["externalDocs"]["url"]
                        .as_str()
                        .unwrap_or("");
                assert!(
                    docs.starts_with("https://docs.github.com/rest/"),
                    "{name}: a described operation names GitHub's page it was described from"
                );
            }
        }
        // Nothing is described that rm does not call.
        let described_paths = described["paths"]
            .as_object()
            .map(|p| p.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        assert!(!described_paths.is_empty());
        for path in described_paths {
            assert!(
                ENDPOINTS
                    .iter()
                    .any(|(_, t)| t.split_once(' ').map(|(_, p)| p) == Some(path.as_str())),
                "{path} is described but rm never calls it"
            );
        }
        let mut names: Vec<&str> = ENDPOINTS.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name is in the table twice");

        // The literals the calls are built with: `"word.word"` strings and `"rate_limit"`, in
        // the code of this file (not the table, not the tests) and of the transport.
        let own = include_str!("endpoints.rs");
        let (before_table, rest) = own
            .split_once("pub(crate) const ENDPOINTS")
            .unwrap_or((own, ""));
        let after_table = rest
            .split_once("impl GithubClient {")
            .map_or("", |(_, c)| c);
        let sources = [before_table, after_table, include_str!("client.rs")];
        let mut sent = std::collections::BTreeSet::new();
        for source in sources {
            let code = source.split("#[cfg(test)]").next().unwrap_or(source);
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for literal in line.split('"').skip(1).step_by(2) {
                    let is_name = literal == "rate_limit"
                        || (literal.contains('.')
                            && !literal.starts_with('.')
                            && !literal.ends_with('.')
                            && literal
                                .chars()
                                .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_'));
                    if is_name {
                        sent.insert(literal.to_owned());
                    }
                }
            }
        }
        assert!(sent.contains("repos.runners.jit") && sent.contains("app.access_tokens"));
        for name in &sent {
            assert!(
                template(name).is_some(),
                "{name} has no template in ENDPOINTS"
            );
        }
        // Two names of one template share it; the two JIT templates are apart.
        assert_eq!(
            template("repos.runners.list"),
            template("repos.runners.by_name")
        );
        assert_ne!(template("orgs.runners.jit"), template("repos.runners.jit"));
        assert_eq!(template("jit"), None);
    }
}
