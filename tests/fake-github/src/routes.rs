//! The REST endpoints the fake serves: which path is which endpoint, who may call it, and what
//! it answers. Every answer is built from [`State`] under its lock.

use serde_json::{Value, json};

use crate::auth::Caller;
use crate::model::{Runner, RunnerScope};
use crate::render;
use crate::state::State;

/// GitHub's endpoints, parsed from method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    App,
    AppInstallations,
    AccessTokens(u64),
    OrgInstallation(String),
    RepoInstallation(String, String),
    InstallationRepos,
    Deliveries,
    Delivery(u64),
    Redeliver(u64),
    Jit(Scope),
    ListRunners(Scope),
    GetRunner(Scope, u64),
    DeleteRunner(Scope, u64),
    Runs(String, String),
    /// `GET /repos/{owner}/{repo}/actions/runs/{run_id}`: who a job is (its run's event,
    /// branch, head repository), what a cache learns a job's scope from.
    Run(String, String, u64),
    RunJobs(String, String, u64),
    Job(String, String, u64),
    /// `POST /repos/{owner}/{repo}/actions/jobs/{job_id}/rerun`.
    RerunJob(String, String, u64),
    RunnerGroups(String),
    RateLimit,
    /// `GET /repos/{owner}/{repo}/releases/latest` (only actions/runner has releases here).
    LatestRelease(String, String),
    /// `GET /repos/{owner}/{repo}/releases`.
    Releases(String, String),
}

/// An organization or a repository named in a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Org(String),
    Repo(String, String),
}

impl Route {
    pub fn parse(method: &str, path: &str) -> Option<Route> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let id = |s: &str| s.parse::<u64>().ok();
        let s = |x: &str| x.to_owned();
        use Route::*;
        Some(match (method, segs.as_slice()) {
            ("GET", ["app"]) => App,
            ("GET", ["app", "installations"]) => AppInstallations,
            ("POST", ["app", "installations", i, "access_tokens"]) => AccessTokens(id(i)?),
            ("GET", ["orgs", org, "installation"]) => OrgInstallation(s(org)),
            ("GET", ["repos", o, r, "installation"]) => RepoInstallation(s(o), s(r)),
            ("GET", ["installation", "repositories"]) => InstallationRepos,
            ("GET", ["app", "hook", "deliveries"]) => Deliveries,
            ("GET", ["app", "hook", "deliveries", d]) => Delivery(id(d)?),
            ("POST", ["app", "hook", "deliveries", d, "attempts"]) => Redeliver(id(d)?),
            ("POST", ["orgs", org, "actions", "runners", "generate-jitconfig"]) => {
                Jit(Scope::Org(s(org)))
            }
            ("POST", ["repos", o, r, "actions", "runners", "generate-jitconfig"]) => {
                Jit(Scope::Repo(s(o), s(r)))
            }
            ("GET", ["orgs", org, "actions", "runners"]) => ListRunners(Scope::Org(s(org))),
            ("GET", ["repos", o, r, "actions", "runners"]) => ListRunners(Scope::Repo(s(o), s(r))),
            ("GET", ["orgs", org, "actions", "runners", n]) => {
                GetRunner(Scope::Org(s(org)), id(n)?)
            }
            ("GET", ["repos", o, r, "actions", "runners", n]) => {
                GetRunner(Scope::Repo(s(o), s(r)), id(n)?)
            }
            ("DELETE", ["orgs", org, "actions", "runners", n]) => {
                DeleteRunner(Scope::Org(s(org)), id(n)?)
            }
            ("DELETE", ["repos", o, r, "actions", "runners", n]) => {
                DeleteRunner(Scope::Repo(s(o), s(r)), id(n)?)
            }
            ("GET", ["repos", o, r, "actions", "runs"]) => Runs(s(o), s(r)),
            ("GET", ["repos", o, r, "actions", "runs", run]) => Run(s(o), s(r), id(run)?),
            ("GET", ["repos", o, r, "actions", "runs", run, "jobs"]) => {
                RunJobs(s(o), s(r), id(run)?)
            }
            ("GET", ["repos", o, r, "actions", "jobs", j]) => Job(s(o), s(r), id(j)?),
            ("POST", ["repos", o, r, "actions", "jobs", j, "rerun"]) => {
                RerunJob(s(o), s(r), id(j)?)
            }
            ("GET", ["orgs", org, "actions", "runner-groups"]) => RunnerGroups(s(org)),
            ("GET", ["rate_limit"]) => RateLimit,
            ("GET", ["repos", o, r, "releases", "latest"]) => LatestRelease(s(o), s(r)),
            ("GET", ["repos", o, r, "releases"]) => Releases(s(o), s(r)),
            _ => return None,
        })
    }

    /// The endpoint as GitHub documents it (method and path template): what "a single REST
    /// endpoint" of the secondary limits' points means.
    pub fn template(&self) -> &'static str {
        use Route::*;
        match self {
            App => "GET /app",
            AppInstallations => "GET /app/installations",
            AccessTokens(_) => "POST /app/installations/{installation_id}/access_tokens",
            OrgInstallation(_) => "GET /orgs/{org}/installation",
            RepoInstallation(..) => "GET /repos/{owner}/{repo}/installation",
            InstallationRepos => "GET /installation/repositories",
            Deliveries => "GET /app/hook/deliveries",
            Delivery(_) => "GET /app/hook/deliveries/{delivery_id}",
            Redeliver(_) => "POST /app/hook/deliveries/{delivery_id}/attempts",
            Jit(Scope::Org(_)) => "POST /orgs/{org}/actions/runners/generate-jitconfig",
            Jit(Scope::Repo(..)) => "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig",
            ListRunners(Scope::Org(_)) => "GET /orgs/{org}/actions/runners",
            ListRunners(Scope::Repo(..)) => "GET /repos/{owner}/{repo}/actions/runners",
            GetRunner(Scope::Org(_), _) => "GET /orgs/{org}/actions/runners/{runner_id}",
            GetRunner(Scope::Repo(..), _) => {
                "GET /repos/{owner}/{repo}/actions/runners/{runner_id}"
            }
            DeleteRunner(Scope::Org(_), _) => "DELETE /orgs/{org}/actions/runners/{runner_id}",
            DeleteRunner(Scope::Repo(..), _) => {
                "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}"
            }
            Runs(..) => "GET /repos/{owner}/{repo}/actions/runs",
            Run(..) => "GET /repos/{owner}/{repo}/actions/runs/{run_id}",
            RunJobs(..) => "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
            Job(..) => "GET /repos/{owner}/{repo}/actions/jobs/{job_id}",
            RerunJob(..) => "POST /repos/{owner}/{repo}/actions/jobs/{job_id}/rerun",
            RunnerGroups(_) => "GET /orgs/{org}/actions/runner-groups",
            RateLimit => "GET /rate_limit",
            LatestRelease(..) => "GET /repos/{owner}/{repo}/releases/latest",
            Releases(..) => "GET /repos/{owner}/{repo}/releases",
        }
    }

    /// Whether the endpoint takes the App JWT (else an installation token).
    pub fn wants_jwt(&self) -> bool {
        matches!(
            self,
            Route::App
                | Route::AppInstallations
                | Route::AccessTokens(_)
                | Route::OrgInstallation(_)
                | Route::RepoInstallation(..)
                | Route::Deliveries
                | Route::Delivery(_)
                | Route::Redeliver(_)
        )
    }

    /// Whether GitHub leaves this request out of the primary limit.
    pub fn free(&self) -> bool {
        matches!(self, Route::RateLimit)
    }

    /// The rate-limit resource the endpoint spends (`generate-jitconfig`'s is set per fake:
    /// GitHub's own choice there is not documented).
    pub fn resource(&self) -> &'static str {
        "core"
    }

    /// The installation permission the endpoint needs, and the level.
    fn permission(&self) -> Option<(&'static str, &'static str)> {
        let write = |s: &Scope| match s {
            Scope::Org(_) => ("organization_self_hosted_runners", "write"),
            Scope::Repo(..) => ("administration", "write"),
        };
        let read = |s: &Scope| match s {
            Scope::Org(_) => ("organization_self_hosted_runners", "read"),
            Scope::Repo(..) => ("administration", "read"),
        };
        match self {
            Route::Jit(s) | Route::DeleteRunner(s, _) => Some(write(s)),
            Route::ListRunners(s) | Route::GetRunner(s, _) => Some(read(s)),
            Route::RunnerGroups(org) => Some(read(&Scope::Org(org.clone()))),
            Route::Runs(..) | Route::Run(..) | Route::RunJobs(..) | Route::Job(..) => {
                Some(("actions", "read"))
            }
            // GitHub: "GitHub Apps must have the `actions:write` permission".
            Route::RerunJob(..) => Some(("actions", "write")),
            _ => None,
        }
    }
}

/// An answer: status, JSON body (none for 204/202-empty), extra headers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
    pub headers: Vec<(String, String)>,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            body: Some(body),
            headers: Vec::new(),
        }
    }

    pub fn empty(status: u16) -> Self {
        Reply {
            status,
            body: None,
            headers: Vec::new(),
        }
    }

    pub fn error(status: u16, message: &str) -> Self {
        Reply::error_documented(status, message, "https://docs.github.com/rest")
    }

    /// An error pointing at a page of GitHub's documentation, as its rate-limit answers do.
    pub fn error_documented(status: u16, message: &str, documentation_url: &str) -> Self {
        Reply::json(
            status,
            json!({
                "message": message,
                "documentation_url": documentation_url,
                "status": status.to_string(),
            }),
        )
    }
}

fn not_found() -> Reply {
    Reply::error(404, "Not Found")
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Page `page` (1-based) of `items`, `per_page` at a time (GitHub's default 30, max 100).
fn paginate<T: Clone>(items: &[T], query: &str) -> Vec<T> {
    let per_page = query_param(query, "per_page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page = query_param(query, "page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    items
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .cloned()
        .collect()
}

/// Checks that an installation may act on a scope: the account must be its own, the
/// repository reachable, the permission granted.
fn authorize(state: &State, caller: Caller, route: &Route) -> Result<(), Reply> {
    let Caller::Installation(inst_id) = caller else {
        return Ok(());
    };
    let Some(inst) = state.installations.get(&inst_id) else {
        return Err(Reply::error(401, "Bad credentials"));
    };
    let scope = match route {
        Route::Jit(s)
        | Route::ListRunners(s)
        | Route::GetRunner(s, _)
        | Route::DeleteRunner(s, _) => Some(s.clone()),
        Route::RunnerGroups(org) => Some(Scope::Org(org.clone())),
        Route::Runs(o, r)
        | Route::Run(o, r, _)
        | Route::RunJobs(o, r, _)
        | Route::Job(o, r, _)
        | Route::RerunJob(o, r, _) => Some(Scope::Repo(o.clone(), r.clone())),
        _ => None,
    };
    match scope {
        Some(Scope::Org(org)) if org != inst.account_login => {
            return Err(Reply::error(403, "Resource not accessible by integration"));
        }
        Some(Scope::Repo(o, r)) => match state.repo_by_name(&o, &r) {
            Some(repo) if state.covers(inst, repo) => {}
            _ => return Err(not_found()),
        },
        _ => {}
    }
    if let Some((perm, level)) = route.permission() {
        let granted = inst.permissions.get(perm).map(String::as_str);
        let ok = match level {
            "read" => matches!(granted, Some("read" | "write")),
            _ => granted == Some("write"),
        };
        if !ok {
            return Err(Reply::error(403, "Resource not accessible by integration"));
        }
    }
    Ok(())
}

fn runner_scope(state: &State, scope: &Scope) -> Option<RunnerScope> {
    match scope {
        Scope::Org(org) => state
            .installation_by_login(org)
            .filter(|i| i.account_type == "Organization")
            .map(|_| RunnerScope::Org(org.clone())),
        Scope::Repo(o, r) => state.repo_by_name(o, r).map(|r| RunnerScope::Repo(r.id)),
    }
}

/// Answers an authenticated request, as the primary App when it was signed by an App's JWT.
pub fn answer(
    state: &mut State,
    caller: Caller,
    route: &Route,
    query: &str,
    body: Option<&Value>,
) -> Reply {
    let app = state.app_id;
    answer_as(state, caller, app, route, query, body)
}

/// Answers an authenticated request; `app` is the App whose JWT signed it (what it may see of
/// installations: its own).
pub fn answer_as(
    state: &mut State,
    caller: Caller,
    app: u64,
    route: &Route,
    query: &str,
    body: Option<&Value>,
) -> Reply {
    if let Err(reply) = authorize(state, caller, route) {
        return reply;
    }
    match route {
        Route::App => {
            let ctx = render::Ctx {
                app_id: app,
                ..state.ctx()
            };
            Reply::json(
                200,
                render::app(&ctx, render::user(&ctx, "fake-owner", 2, "Organization")),
            )
        }
        Route::AppInstallations => {
            let all: Vec<Value> = state
                .installations
                .values()
                .filter(|i| i.app_id == app)
                .map(|i| render::installation(&state.ctx(), i))
                .collect();
            Reply::json(200, Value::Array(paginate(&all, query)))
        }
        Route::AccessTokens(id) => {
            // An App mints tokens for its own installations only.
            if state.installations.get(id).is_none_or(|i| i.app_id != app) {
                return not_found();
            }
            let (token, expires) = state.issue_token(*id);
            let perms = state.installations.get(id).map(|i| i.permissions.clone());
            Reply::json(
                201,
                json!({
                    "token": token, "expires_at": crate::time::rfc3339(expires),
                    "permissions": perms, "repository_selection": "all",
                }),
            )
        }
        Route::OrgInstallation(org) => match state.app_installation(app, org) {
            Some(i) if i.account_type == "Organization" => {
                Reply::json(200, render::installation(&state.ctx(), i))
            }
            _ => not_found(),
        },
        Route::RepoInstallation(o, r) => {
            let inst = state
                .repo_by_name(o, r)
                .and_then(|repo| state.app_installation(app, &repo.owner));
            match inst {
                Some(i) => Reply::json(200, render::installation(&state.ctx(), i)),
                None => not_found(),
            }
        }
        Route::InstallationRepos => {
            let Caller::Installation(inst) = caller else {
                return not_found();
            };
            let Some(inst) = state.installations.get(&inst).cloned() else {
                return not_found();
            };
            let repos: Vec<Value> = state
                .repos
                .values()
                .filter(|r| state.covers(&inst, r))
                .map(|r| state.repo_json(r))
                .collect();
            Reply::json(
                200,
                json!({"total_count": repos.len(), "repository_selection": "all", "repositories": paginate(&repos, query)}),
            )
        }
        Route::Deliveries => deliveries(state, query),
        Route::Delivery(id) => match state.deliveries.iter().find(|d| d.id == *id) {
            Some(d) => Reply::json(200, render::delivery_detail(d)),
            None => not_found(),
        },
        Route::Redeliver(id) => match state.redeliver(*id) {
            Some(new_id) => {
                let mut r = Reply::json(202, json!({}));
                r.headers
                    .push(("x-fake-delivery-id".into(), new_id.to_string()));
                r
            }
            None => not_found(),
        },
        Route::Jit(scope) => jit(state, scope, body),
        Route::ListRunners(scope) => {
            let Some(rs) = runner_scope(state, scope) else {
                return not_found();
            };
            let name = query_param(query, "name");
            let runners: Vec<Value> = state
                .runners
                .values()
                .filter(|r| r.scope == rs && name.is_none_or(|n| n == r.name))
                .map(render::runner)
                .collect();
            Reply::json(
                200,
                json!({"total_count": runners.len(), "runners": paginate(&runners, query)}),
            )
        }
        Route::GetRunner(scope, id) => {
            let rs = runner_scope(state, scope);
            match state
                .runners
                .get(id)
                .filter(|r| Some(&r.scope) == rs.as_ref())
            {
                Some(r) => Reply::json(200, render::runner(r)),
                None => not_found(),
            }
        }
        Route::DeleteRunner(scope, id) => {
            let rs = runner_scope(state, scope);
            match state
                .runners
                .get(id)
                .filter(|r| Some(&r.scope) == rs.as_ref())
            {
                None => not_found(),
                Some(r) if r.busy => Reply::error(
                    422,
                    &format!("Bad request - Runner \"{}\" is still running a job", r.name),
                ),
                Some(_) => {
                    state.runners.remove(id);
                    Reply::empty(204)
                }
            }
        }
        Route::Runs(o, r) => runs(state, o, r, query),
        Route::Run(o, r, run_id) => run(state, o, r, *run_id),
        Route::RunJobs(o, r, run_id) => {
            let Some(repo) = state.repo_by_name(o, r).cloned() else {
                return not_found();
            };
            let Some(run) = state
                .runs
                .get(run_id)
                .filter(|x| x.repo_id == repo.id)
                .cloned()
            else {
                return not_found();
            };
            let jobs: Vec<Value> = state
                .jobs
                .values()
                .filter(|j| j.run_id == run.id)
                .map(|j| render::job(&state.ctx(), j, &run, &repo.full_name()))
                .collect();
            Reply::json(
                200,
                json!({"total_count": jobs.len(), "jobs": paginate(&jobs, query)}),
            )
        }
        Route::Job(o, r, job_id) => {
            let Some(repo) = state.repo_by_name(o, r).cloned() else {
                return not_found();
            };
            let found = state.jobs.get(job_id).and_then(|j| {
                let run = state
                    .runs
                    .get(&j.run_id)
                    .filter(|run| run.repo_id == repo.id)?;
                Some(render::job(&state.ctx(), j, run, &repo.full_name()))
            });
            match found {
                Some(v) => Reply::json(200, v),
                None => not_found(),
            }
        }
        Route::RerunJob(o, r, job_id) => {
            let Some(repo) = state.repo_by_name(o, r).cloned() else {
                return not_found();
            };
            let in_repo = state
                .jobs
                .get(job_id)
                .and_then(|j| state.runs.get(&j.run_id))
                .is_some_and(|run| run.repo_id == repo.id);
            if !in_repo {
                return not_found();
            }
            match state.rerun(*job_id) {
                Ok(new_id) => {
                    let mut reply = Reply::json(201, json!({}));
                    reply
                        .headers
                        .push(("x-fake-rerun-job-id".into(), new_id.to_string()));
                    reply
                }
                Err("Not Found") => not_found(),
                Err(message) => Reply::error_documented(
                    403,
                    message,
                    "https://docs.github.com/rest/actions/workflow-runs#re-run-a-job-from-a-workflow-run",
                ),
            }
        }
        Route::RunnerGroups(org) => {
            let groups: Vec<Value> = state
                .runner_groups
                .get(org)
                .map(|gs| {
                    gs.iter()
                        .map(|g| render::runner_group(&state.ctx(), org, g))
                        .collect()
                })
                .unwrap_or_default();
            Reply::json(
                200,
                json!({"total_count": groups.len(), "runner_groups": paginate(&groups, query)}),
            )
        }
        Route::RateLimit => rate_limit(state, caller),
        Route::LatestRelease(o, r) => match state.releases.latest() {
            Some(release) if is_runner_repository(o, r) => {
                Reply::json(200, crate::releases::release_json(state, release))
            }
            _ => not_found(),
        },
        Route::Releases(o, r) => {
            let all: Vec<Value> = if is_runner_repository(o, r) {
                state
                    .releases
                    .newest_first()
                    .into_iter()
                    .map(|release| crate::releases::release_json(state, release))
                    .collect()
            } else {
                return not_found();
            };
            Reply::json(200, Value::Array(paginate(&all, query)))
        }
    }
}

fn deliveries(state: &State, query: &str) -> Reply {
    let per_page = query_param(query, "per_page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    // Newest first; the cursor is the id of the first delivery of the next page.
    let mut all: Vec<&crate::model::Delivery> = state.deliveries.iter().collect();
    all.reverse();
    let start = match query_param(query, "cursor") {
        Some(c) => match c.strip_prefix("v1_").and_then(|id| id.parse::<u64>().ok()) {
            Some(id) => all.iter().position(|d| d.id == id).unwrap_or(all.len()),
            None => return Reply::error(422, "Validation Failed: bad cursor"),
        },
        None => 0,
    };
    let page: Vec<Value> = all
        .iter()
        .skip(start)
        .take(per_page)
        .map(|d| render::delivery(d))
        .collect();
    let mut reply = Reply::json(200, Value::Array(page));
    if let Some(next) = all.get(start + per_page) {
        reply.headers.push((
            "link".into(),
            format!(
                "<{}/app/hook/deliveries?per_page={per_page}&cursor=v1_{}>; rel=\"next\"",
                state.api_url, next.id
            ),
        ));
    }
    reply
}

fn jit(state: &mut State, scope: &Scope, body: Option<&Value>) -> Reply {
    let Some(rs) = runner_scope(state, scope) else {
        return not_found();
    };
    let Some(body) = body else {
        return Reply::error(400, "Problems parsing JSON");
    };
    let name = body.get("name").and_then(Value::as_str).unwrap_or("");
    let group_id = body.get("runner_group_id").and_then(Value::as_u64);
    let labels: Vec<String> = body
        .get("labels")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let work_folder = body
        .get("work_folder")
        .and_then(Value::as_str)
        .unwrap_or("_work")
        .to_owned();
    if name.is_empty()
        || labels.is_empty()
        || labels.len() > 100
        || labels.iter().any(String::is_empty)
    {
        return Reply::error(
            422,
            "Validation Failed: name and 1 to 100 labels are required",
        );
    }
    let Some(group_id) = group_id else {
        return Reply::error(422, "Validation Failed: runner_group_id is required");
    };
    let org = match scope {
        Scope::Org(org) => Some(org.clone()),
        Scope::Repo(o, _) => Some(o.clone()).filter(|o| state.owner_type(o) == "Organization"),
    };
    let group_ok = match &org {
        Some(org) => state
            .runner_groups
            .get(org)
            .is_some_and(|gs| gs.iter().any(|g| g.id == group_id)),
        None => group_id == 1,
    };
    if !group_ok {
        // GitHub answers an unknown group with 404 (a missing `runner_group_id` is the 422), as
        // runner-manager-github's jit.rs found against github.com.
        return not_found();
    }
    if state
        .runners
        .values()
        .any(|r| r.scope == rs && r.name == name)
    {
        return Reply::error(
            409,
            &format!("Already exists - A runner with the name {name} already exists."),
        );
    }
    let id = state.next_id();
    let token = uuid::Uuid::new_v4().simple().to_string();
    let runner = Runner {
        id,
        name: name.to_owned(),
        scope: rs,
        labels,
        group_id,
        online: false,
        busy: false,
        job_done_at: None,
        abandoned: false,
        token: token.clone(),
        behavior: None,
        scale_set_id: None,
    };
    let encoded = crate::jit::FakeJitConfig {
        server_url: state.server_url.clone(),
        runner_id: id,
        runner_name: name.to_owned(),
        token,
        work_folder,
    }
    .encode();
    let rendered = render::runner(&runner);
    state.runners.insert(id, runner);
    Reply::json(
        201,
        json!({"runner": rendered, "encoded_jit_config": encoded}),
    )
}

fn runs(state: &State, owner: &str, name: &str, query: &str) -> Reply {
    let Some(repo) = state.repo_by_name(owner, name).cloned() else {
        return not_found();
    };
    let want = query_param(query, "status");
    let repo_json = state.repo_json(&repo);
    let mut runs: Vec<Value> = state
        .runs
        .values()
        .filter(|r| r.repo_id == repo.id)
        .filter_map(|r| {
            let (status, conclusion) = state.run_status(r.id);
            let matches = match want {
                None => true,
                Some(w) => w == status || conclusion.as_deref() == Some(w),
            };
            let head = state.head_repo_json(r);
            matches.then(|| {
                render::run(
                    &state.ctx(),
                    r,
                    &repo_json,
                    &head,
                    status,
                    conclusion.as_deref(),
                )
            })
        })
        .collect();
    runs.reverse();
    Reply::json(
        200,
        json!({"total_count": runs.len(), "workflow_runs": paginate(&runs, query)}),
    )
}

fn run(state: &State, owner: &str, name: &str, run_id: u64) -> Reply {
    let Some(repo) = state.repo_by_name(owner, name) else {
        return not_found();
    };
    let Some(run) = state.runs.get(&run_id).filter(|r| r.repo_id == repo.id) else {
        return not_found();
    };
    let (status, conclusion) = state.run_status(run.id);
    Reply::json(
        200,
        render::run(
            &state.ctx(),
            run,
            &state.repo_json(repo),
            &state.head_repo_json(run),
            status,
            conclusion.as_deref(),
        ),
    )
}

fn rate_limit(state: &mut State, caller: Caller) -> Reply {
    let scope = match caller {
        Caller::App => "app".to_owned(),
        Caller::Installation(i) => i.to_string(),
    };
    let entry = |state: &mut State, resource: &str| {
        let q = *state.quota(&scope, resource);
        json!({
            "limit": q.limit, "remaining": q.remaining, "used": q.limit - q.remaining,
            "reset": crate::time::unix(q.reset), "resource": resource,
        })
    };
    let core = entry(state, "core");
    let search = entry(state, "search");
    let registration = entry(state, "actions_runner_registration");
    Reply::json(
        200,
        json!({
            "resources": {"core": core, "search": search, "actions_runner_registration": registration},
            "rate": core,
        }),
    )
}

/// The one repository the fake publishes releases of.
fn is_runner_repository(owner: &str, repo: &str) -> bool {
    owner == "actions" && repo == "runner"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_by_method_and_path() {
        assert_eq!(Route::parse("GET", "/app"), Some(Route::App));
        assert_eq!(
            Route::parse("POST", "/orgs/acme/actions/runners/generate-jitconfig"),
            Some(Route::Jit(Scope::Org("acme".into())))
        );
        assert_eq!(
            Route::parse("DELETE", "/repos/a/b/actions/runners/7"),
            Some(Route::DeleteRunner(Scope::Repo("a".into(), "b".into()), 7))
        );
        assert_eq!(
            Route::parse("POST", "/repos/a/b/actions/jobs/9/rerun"),
            Some(Route::RerunJob("a".into(), "b".into(), 9))
        );
        assert_eq!(Route::parse("GET", "/repos/a/b/actions/jobs/9/rerun"), None);
        assert_eq!(
            Route::parse("GET", "/repos/a/b/actions/runs/12"),
            Some(Route::Run("a".into(), "b".into(), 12))
        );
        assert_eq!(Route::parse("POST", "/app"), None);
        assert_eq!(Route::parse("GET", "/orgs/acme/actions/runners/x"), None);
        assert!(
            Route::parse("POST", "/app/installations/5/access_tokens")
                .is_some_and(|r| r.wants_jwt())
        );
        assert!(Route::parse("GET", "/rate_limit").is_some_and(|r| r.free() && !r.wants_jwt()));
    }

    #[test]
    fn pages_follow_per_page_and_page() {
        let items: Vec<u32> = (0..250).collect();
        assert_eq!(paginate(&items, "").len(), 30);
        assert_eq!(
            paginate(&items, "per_page=100&page=3"),
            (200..250).collect::<Vec<_>>()
        );
        assert_eq!(paginate(&items, "per_page=1000").len(), 100);
    }
}
