//! GitHub's JSON shapes for the fake's objects, with every field GitHub's own description marks
//! required (the conformance test holds the fake to it).

use serde_json::{Value, json};

use crate::model::{Delivery, Installation, Job, Repo, Run, Runner, RunnerGroup};
use crate::time::rfc3339;

/// What rendering needs beside the object: where the fake lives and the App's identity.
pub struct Ctx<'a> {
    /// API root, e.g. `http://127.0.0.1:4711/api/v3`.
    pub api: &'a str,
    /// Web root (for `html_url`s).
    pub web: &'a str,
    pub app_id: u64,
    pub app_slug: &'a str,
}

pub fn user(ctx: &Ctx, login: &str, id: u64, kind: &str) -> Value {
    let api = ctx.api;
    json!({
        "login": login, "id": id, "node_id": format!("U_{id}"),
        "avatar_url": format!("{}/avatars/{login}", ctx.web), "gravatar_id": "",
        "url": format!("{api}/users/{login}"), "html_url": format!("{}/{login}", ctx.web),
        "followers_url": format!("{api}/users/{login}/followers"),
        "following_url": format!("{api}/users/{login}/following{{/other_user}}"),
        "gists_url": format!("{api}/users/{login}/gists{{/gist_id}}"),
        "starred_url": format!("{api}/users/{login}/starred{{/owner}}{{/repo}}"),
        "subscriptions_url": format!("{api}/users/{login}/subscriptions"),
        "organizations_url": format!("{api}/users/{login}/orgs"),
        "repos_url": format!("{api}/users/{login}/repos"),
        "events_url": format!("{api}/users/{login}/events{{/privacy}}"),
        "received_events_url": format!("{api}/users/{login}/received_events"),
        "type": kind, "site_admin": false,
    })
}

pub fn app(ctx: &Ctx, owner: Value) -> Value {
    json!({
        "id": ctx.app_id, "slug": ctx.app_slug, "node_id": format!("A_{}", ctx.app_id),
        "owner": owner, "name": format!("{} (fake)", ctx.app_slug), "description": null,
        "external_url": ctx.web, "html_url": format!("{}/apps/{}", ctx.web, ctx.app_slug),
        "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
        "permissions": crate::model::default_permissions(),
        "events": ["workflow_job"],
    })
}

pub fn installation(ctx: &Ctx, i: &Installation) -> Value {
    let target_type = i.account_type.as_str();
    // GitHub's description of `GET /app/installations` types the account as user *and*
    // enterprise (allOf), so the account carries the enterprise's required fields as well.
    let mut account = user(ctx, &i.account_login, i.account_id, target_type);
    if let Some(map) = account.as_object_mut() {
        let created = Value::String(rfc3339(i.created_at));
        map.insert("name".into(), Value::String(i.account_login.clone()));
        map.insert("slug".into(), Value::String(i.account_login.clone()));
        map.insert("created_at".into(), created.clone());
        map.insert("updated_at".into(), created);
    }
    json!({
        "id": i.id, "app_id": i.app_id, "app_slug": ctx.app_slug,
        "target_id": i.account_id, "target_type": target_type,
        "account": account,
        "single_file_name": null, "repository_selection": "all",
        "access_tokens_url": format!("{}/app/installations/{}/access_tokens", ctx.api, i.id),
        "html_url": format!("{}/organizations/{}/settings/installations/{}", ctx.web, i.account_login, i.id),
        "repositories_url": format!("{}/installation/repositories", ctx.api),
        "events": ["workflow_job"], "permissions": i.permissions,
        "created_at": rfc3339(i.created_at), "updated_at": rfc3339(i.created_at),
        "suspended_by": null, "suspended_at": null,
    })
}

pub fn repository(ctx: &Ctx, r: &Repo, owner_type: &str) -> Value {
    let full = r.full_name();
    let u = format!("{}/repos/{full}", ctx.api);
    let mut v = json!({
        "id": r.id, "node_id": format!("R_{}", r.id), "name": r.name, "full_name": full,
        "owner": user(ctx, &r.owner, r.owner_id, owner_type), "private": r.private,
        "html_url": format!("{}/{full}", ctx.web), "description": null, "fork": false,
        "url": u, "homepage": null, "language": null, "mirror_url": null, "license": null,
        "archived": false, "disabled": false, "default_branch": r.default_branch, "size": 1,
        "forks": 0, "forks_count": 0, "open_issues": 0, "open_issues_count": 0,
        "stargazers_count": 0, "watchers": 0, "watchers_count": 0,
        "has_downloads": true, "has_issues": true, "has_projects": false, "has_wiki": false,
        "has_pages": false, "visibility": if r.private { "private" } else { "public" },
        "pushed_at": rfc3339(r.created_at), "created_at": rfc3339(r.created_at),
        "updated_at": rfc3339(r.created_at),
        "clone_url": format!("{}/{full}.git", ctx.web), "git_url": format!("git://fake/{full}.git"),
        "ssh_url": format!("git@fake:{full}.git"), "svn_url": format!("{}/{full}", ctx.web),
    });
    let suffixes = [
        ("archive_url", "/{archive_format}{/ref}"),
        ("assignees_url", "/assignees{/user}"),
        ("blobs_url", "/git/blobs{/sha}"),
        ("branches_url", "/branches{/branch}"),
        ("collaborators_url", "/collaborators{/collaborator}"),
        ("comments_url", "/comments{/number}"),
        ("commits_url", "/commits{/sha}"),
        ("compare_url", "/compare/{base}...{head}"),
        ("contents_url", "/contents/{+path}"),
        ("contributors_url", "/contributors"),
        ("deployments_url", "/deployments"),
        ("downloads_url", "/downloads"),
        ("events_url", "/events"),
        ("forks_url", "/forks"),
        ("git_commits_url", "/git/commits{/sha}"),
        ("git_refs_url", "/git/refs{/sha}"),
        ("git_tags_url", "/git/tags{/sha}"),
        ("hooks_url", "/hooks"),
        ("issue_comment_url", "/issues/comments{/number}"),
        ("issue_events_url", "/issues/events{/number}"),
        ("issues_url", "/issues{/number}"),
        ("keys_url", "/keys{/key_id}"),
        ("labels_url", "/labels{/name}"),
        ("languages_url", "/languages"),
        ("merges_url", "/merges"),
        ("milestones_url", "/milestones{/number}"),
        (
            "notifications_url",
            "/notifications{?since,all,participating}",
        ),
        ("pulls_url", "/pulls{/number}"),
        ("releases_url", "/releases{/id}"),
        ("stargazers_url", "/stargazers"),
        ("statuses_url", "/statuses/{sha}"),
        ("subscribers_url", "/subscribers"),
        ("subscription_url", "/subscription"),
        ("tags_url", "/tags"),
        ("teams_url", "/teams"),
        ("trees_url", "/git/trees{/sha}"),
    ];
    if let Some(map) = v.as_object_mut() {
        for (key, suffix) in suffixes {
            map.insert(key.to_owned(), Value::String(format!("{u}{suffix}")));
        }
        // Fields of current deliveries (one `json!` cannot hold them all).
        for key in [
            "has_discussions",
            "allow_forking",
            "is_template",
            "web_commit_signoff_required",
        ] {
            map.insert(key.to_owned(), Value::Bool(false));
        }
        map.insert("topics".into(), json!([]));
        map.insert("custom_properties".into(), json!({}));
    }
    v
}

pub fn runner(r: &Runner) -> Value {
    let labels: Vec<Value> = r
        .labels
        .iter()
        .enumerate()
        .map(|(i, name)| json!({"id": i + 1, "name": name, "type": "custom"}))
        .collect();
    json!({
        "id": r.id, "name": r.name, "os": "Linux", "runner_group_id": r.group_id,
        "status": if r.online { "online" } else { "offline" }, "busy": r.busy,
        "ephemeral": true, "labels": labels,
    })
}

pub fn runner_group(ctx: &Ctx, org: &str, g: &RunnerGroup) -> Value {
    json!({
        "id": g.id, "name": g.name, "visibility": "all", "default": g.default,
        "runners_url": format!("{}/orgs/{org}/actions/runner-groups/{}/runners", ctx.api, g.id),
        "inherited": false, "allows_public_repositories": false,
        "restricted_to_workflows": false, "selected_workflows": [],
    })
}

/// A workflow run; `head_repo` is the repository its head commit is in (`repo` itself unless
/// the run is a fork's pull request).
pub fn run(
    ctx: &Ctx,
    run: &Run,
    repo: &Value,
    head_repo: &Value,
    status: &str,
    conclusion: Option<&str>,
) -> Value {
    let full = repo.get("full_name").cloned().unwrap_or(Value::Null);
    let base = format!(
        "{}/repos/{}/actions/runs/{}",
        ctx.api,
        full.as_str().unwrap_or(""),
        run.id
    );
    json!({
        "id": run.id, "node_id": format!("WFR_{}", run.id), "name": run.workflow_name,
        "head_branch": run.head_branch, "head_sha": run.head_sha, "path": ".github/workflows/ci.yml",
        "display_title": run.workflow_name, "run_number": run.run_number, "run_attempt": run.run_attempt,
        "event": run.event, "status": status, "conclusion": conclusion, "workflow_id": 1,
        "url": base, "html_url": format!("{}/{}/actions/runs/{}", ctx.web, full.as_str().unwrap_or(""), run.id),
        "created_at": rfc3339(run.created_at), "updated_at": rfc3339(run.updated_at),
        "run_started_at": rfc3339(run.created_at),
        "jobs_url": format!("{base}/jobs"), "logs_url": format!("{base}/logs"),
        "check_suite_url": format!("{}/check-suites/{}", ctx.api, run.id),
        "cancel_url": format!("{base}/cancel"), "rerun_url": format!("{base}/rerun"),
        "artifacts_url": format!("{base}/artifacts"),
        "workflow_url": format!("{}/repos/{}/actions/workflows/1", ctx.api, full.as_str().unwrap_or("")),
        "pull_requests": pull_requests(ctx, run, repo, head_repo),
        "head_commit": {
            "id": run.head_sha, "tree_id": run.head_sha, "message": "fake commit",
            "timestamp": rfc3339(run.created_at),
            "author": {"name": "Fake", "email": "fake@example.invalid"},
            "committer": {"name": "Fake", "email": "fake@example.invalid"},
        },
        "repository": repo, "head_repository": head_repo,
    })
}

/// A run's `pull_requests`: its pull request for a `pull_request` run from a branch of the
/// repository itself; none otherwise (GitHub leaves a fork's pull request out of this list).
fn pull_requests(ctx: &Ctx, run: &Run, repo: &Value, head_repo: &Value) -> Value {
    let (Some(number), true) = (run.pull_number, repo["full_name"] == head_repo["full_name"])
    else {
        return json!([]);
    };
    let full = repo["full_name"].as_str().unwrap_or("");
    let minimal = json!({"id": repo["id"], "url": repo["url"], "name": repo["name"]});
    json!([{
        "id": 7_000_000 + number, "number": number,
        "url": format!("{}/repos/{full}/pulls/{number}", ctx.api),
        "head": {"ref": run.head_branch, "sha": run.head_sha, "repo": minimal},
        "base": {"ref": repo["default_branch"], "sha": run.head_sha, "repo": minimal},
    }])
}

pub fn job(ctx: &Ctx, job: &Job, run: &Run, full_name: &str) -> Value {
    let api = ctx.api;
    json!({
        "id": job.id, "run_id": job.run_id, "run_attempt": job.run_attempt,
        "node_id": format!("CR_{}", job.id), "head_sha": run.head_sha, "head_branch": run.head_branch,
        "workflow_name": run.workflow_name, "name": job.name,
        "url": format!("{api}/repos/{full_name}/actions/jobs/{}", job.id),
        "html_url": format!("{}/{full_name}/actions/runs/{}/job/{}", ctx.web, run.id, job.id),
        "run_url": format!("{api}/repos/{full_name}/actions/runs/{}", run.id),
        "check_run_url": format!("{api}/repos/{full_name}/check-runs/{}", job.id),
        "status": job.status.as_str(), "conclusion": job.conclusion,
        "created_at": rfc3339(job.created_at),
        "started_at": rfc3339(job.started_at.unwrap_or(job.created_at)),
        "completed_at": job.completed_at.map(rfc3339),
        "labels": job.labels, "steps": [],
        "runner_id": job.runner_id, "runner_name": job.runner_name,
        "runner_group_id": job.runner_group_id, "runner_group_name": job.runner_group_name,
    })
}

pub fn delivery(d: &Delivery) -> Value {
    json!({
        "id": d.id, "guid": d.guid, "delivered_at": rfc3339(d.delivered_at),
        "redelivery": d.redelivery, "duration": d.duration_ms as f64 / 1000.0,
        "status": d.status, "status_code": d.status_code, "event": d.event, "action": d.action,
        "installation_id": d.installation_id, "repository_id": d.repository_id,
        "throttled_at": null,
    })
}

pub fn delivery_detail(d: &Delivery) -> Value {
    let mut v = delivery(d);
    let headers: serde_json::Map<String, Value> = d
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let payload: Value = serde_json::from_slice(&d.body).unwrap_or(Value::Null);
    if let Some(map) = v.as_object_mut() {
        map.insert("url".into(), Value::String(String::new()));
        map.insert(
            "request".into(),
            json!({"headers": headers, "payload": payload}),
        );
        map.insert(
            "response".into(),
            json!({"headers": {}, "payload": d.response_body}),
        );
    }
    v
}
