//! Holds the fake's answers and the client's requests to GitHub's own OpenAPI description
//! (`tests/fake-github/github-rest-subset.json`): every request is a documented method and path
//! with documented query parameters and the required body fields, every call gets the status
//! GitHub gives it (asserted call by call), every status is documented (or named in
//! [`UNDOCUMENTED_BUT_SENT`] with why), and every JSON answer has the fields, types and enum
//! values the schema requires. Neither side can drift from GitHub without this failing.

use std::time::Duration;

use rm_vocab::JobId;
use serde_json::Value;

use crate::common::*;

/// Statuses GitHub sends on an operation although its description does not list them, each with
/// the case and why: `(method, path template, status, why)`. Nothing else undocumented passes.
const UNDOCUMENTED_BUT_SENT: &[(&str, &str, u16, &str)] = &[
    (
        "GET",
        "/orgs/{org}/installation",
        404,
        "the App is not installed on that account: GitHub's Not Found",
    ),
    (
        "DELETE",
        "/orgs/{org}/actions/runners/{runner_id}",
        404,
        "the runner is gone (already deleted): GitHub's Not Found",
    ),
    (
        "DELETE",
        "/repos/{owner}/{repo}/actions/runners/{runner_id}",
        404,
        "the runner is gone (already deleted): GitHub's Not Found",
    ),
    (
        "POST",
        "/app/hook/deliveries/{delivery_id}/attempts",
        404,
        "no delivery with that id: GitHub's Not Found",
    ),
    (
        "GET",
        "/repos/{owner}/{repo}/releases/latest",
        404,
        "the repository has no published full release: GitHub's Not Found",
    ),
];

/// Whether GitHub may send `status` on `method tpl` for `request` though the description does
/// not list it: one of [`UNDOCUMENTED_BUT_SENT`], or a 304 to a GET that asked conditionally
/// (GitHub answers `If-None-Match` with 304 on any GET that gave an ETag).
fn sent_though_undocumented(
    method: &str,
    tpl: &str,
    status: u16,
    request: &rm_fake_github::RequestRecord,
) -> bool {
    let conditional = request
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("if-none-match"));
    (status == 304 && method == "GET" && conditional)
        || UNDOCUMENTED_BUT_SENT
            .iter()
            .any(|(m, t, s, _)| *m == method && *t == tpl && *s == status)
}

/// GitHub's OpenAPI subset, with the operations described by hand from GitHub's
/// documentation pages (`github-rest-described.json`, see its description) added to its paths.
fn spec() -> Value {
    let read = |path: &str| -> Value {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let mut spec = read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fake-github/github-rest-subset.json"
    ));
    let described = read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fake-github/github-rest-described.json"
    ));
    if let (Some(paths), Some(more)) = (
        spec["paths"].as_object_mut(),
        described["paths"].as_object(),
    ) {
        for (path, item) in more {
            paths.entry(path.clone()).or_insert_with(|| item.clone());
        }
    }
    spec
}

/// The spec path template matching a concrete path, e.g. `/orgs/{org}/installation`.
fn template_for<'a>(spec: &'a Value, method: &str, path: &str) -> Option<(&'a str, &'a Value)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let paths = spec["paths"].as_object()?;
    paths.iter().find_map(|(tpl, item)| {
        let tsegs: Vec<&str> = tpl.trim_matches('/').split('/').collect();
        let fits = tsegs.len() == segs.len()
            && tsegs
                .iter()
                .zip(&segs)
                .all(|(t, s)| t.starts_with('{') || t == s);
        let op = item.get(method.to_ascii_lowercase())?;
        fits.then_some((tpl.as_str(), op))
    })
}

/// Checks `value` against `schema`; pushes every mismatch to `errors`.
fn validate(value: &Value, schema: &Value, at: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) && schema.get("type").is_some() {
            errors.push(format!("{at}: null but not nullable"));
        }
        return;
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            validate(value, s, at, errors);
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(any) = schema.get(key).and_then(Value::as_array) {
            let fits = any.iter().any(|s| {
                let mut e = Vec::new();
                validate(value, s, at, &mut e);
                e.is_empty()
            });
            if !fits {
                errors.push(format!("{at}: matches none of {key}"));
            }
        }
    }
    let ty = schema.get("type").and_then(Value::as_str);
    let type_ok = match ty {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    };
    if !type_ok {
        errors.push(format!("{at}: expected {ty:?}, got {value}"));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        errors.push(format!("{at}: {value} not in {allowed:?}"));
    }
    if let Some(obj) = value.as_object() {
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(name) = req.as_str()
                && !obj.contains_key(name)
            {
                errors.push(format!("{at}: missing required {name}"));
            }
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                if let Some(v) = obj.get(name) {
                    validate(v, sub, &format!("{at}.{name}"), errors);
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            validate(v, items, &format!("{at}[{i}]"), errors);
        }
    }
}

/// Awaits one client call and asserts the request it ended with (the last the fake recorded: a
/// token request may come first) was `method` on a path ending in `path_end` and got `status`;
/// and that the client's result agrees (`Ok` below 400, an error from 400). Returns the result.
async fn expect<T>(
    h: &Harness,
    method: &str,
    path_end: &str,
    status: u16,
    call: impl std::future::Future<Output = Result<T, rm_github::GithubError>>,
) -> Result<T, rm_github::GithubError> {
    let before = h.fake.requests().len();
    let result = call.await;
    let requests = h.fake.requests();
    let last = requests[before..].last().unwrap_or_else(|| {
        panic!(
            "{method} ...{path_end}: the call sent no request (result ok: {})",
            result.is_ok()
        )
    });
    let seen = format!("{} {} -> {}", last.method, last.path, last.status);
    assert!(
        last.method == method && last.path.ends_with(path_end),
        "expected {method} ...{path_end}, the call ended with {seen}"
    );
    assert_eq!(last.status, status, "{seen}: expected {status}");
    match &result {
        Ok(_) => assert!(status < 400, "{seen}: the client took it for success"),
        Err(e) => assert!(status >= 400, "{seen}: the client failed: {e}"),
    }
    result
}

/// [`expect`] for a call that must succeed: its value.
async fn ok<T>(
    h: &Harness,
    method: &str,
    path_end: &str,
    status: u16,
    call: impl std::future::Future<Output = Result<T, rm_github::GithubError>>,
) -> T {
    match expect(h, method, path_end, status, call).await {
        Ok(v) => v,
        Err(e) => unreachable!("expect let an error through: {e}"),
    }
}

/// Drives every endpoint the client has, on both happy and error paths, each call asserting
/// the status GitHub gives it.
async fn exercise(h: &Harness) {
    use rm_github::GithubError as E;
    let c = &h.client;
    ok(h, "GET", "/app", 200, c.app()).await;
    ok(h, "GET", "/app/installations", 200, c.list_installations()).await;
    let org_inst = ok(
        h,
        "GET",
        "/orgs/acme/installation",
        200,
        c.installation_for(&org()),
    )
    .await;
    assert_eq!(org_inst, h.org_installation);
    let widgets = repo();
    let repo_inst = c.installation_for(&widgets);
    ok(h, "GET", "/repos/acme/widgets/installation", 200, repo_inst).await;
    let nobody = rm_github::Target::Org("nobody".into());
    let e = expect(
        h,
        "GET",
        "/orgs/nobody/installation",
        404,
        c.installation_for(&nobody),
    )
    .await;
    assert!(matches!(e, Err(E::NotFound { .. })), "{e:?}");
    let job = h
        .fake
        .queue_job("acme/widgets", "build", &["self-hosted", "linux"]);
    let job = job.unwrap_or_else(|e| panic!("{e}"));
    h.fake.settle().await.unwrap_or_else(|e| panic!("{e}"));
    for target in [org(), repo()] {
        let jit_path = "/actions/runners/generate-jitconfig";
        let conf = jit_request("conf");
        let jit = c.generate_jitconfig(&target, &conf);
        let jit = ok(h, "POST", jit_path, 201, jit).await;
        let again = c.generate_jitconfig(&target, &conf);
        let e = expect(h, "POST", jit_path, 409, again).await;
        assert!(matches!(e, Err(E::Conflict { .. })), "{e:?}");
        let mut no_labels = jit_request("conf-2");
        no_labels.labels.clear();
        let e = expect(
            h,
            "POST",
            jit_path,
            422,
            c.generate_jitconfig(&target, &no_labels),
        )
        .await;
        assert!(matches!(e, Err(E::Unprocessable { .. })), "{e:?}");
        let mut unknown_group = jit_request("conf-3");
        unknown_group.runner_group_id = 77;
        let e = c.generate_jitconfig(&target, &unknown_group);
        let e = expect(h, "POST", jit_path, 404, e).await;
        assert!(matches!(e, Err(E::NotFound { .. })), "{e:?}");
        let list = ok(h, "GET", "/actions/runners", 200, c.list_runners(&target)).await;
        assert!(!list.not_modified);
        assert!(
            list.value.iter().any(|r| r.id == jit.runner.id),
            "{:?}",
            list.value
        );
        let list = ok(h, "GET", "/actions/runners", 304, c.list_runners(&target)).await;
        assert!(
            list.not_modified,
            "a 304 the client did not take as unchanged"
        );
        let id = jit.runner.id;
        let runner_path = format!("/actions/runners/{id}");
        ok(h, "GET", &runner_path, 200, c.get_runner(&target, id)).await;
        let found = c.find_runner_by_name(&target, "conf");
        let found = ok(h, "GET", "/actions/runners", 200, found).await;
        assert_eq!(found.map(|r| r.id), Some(id));
        ok(h, "DELETE", &runner_path, 204, c.delete_runner(&target, id)).await;
        let e = expect(h, "DELETE", &runner_path, 404, c.delete_runner(&target, id)).await;
        assert!(matches!(e, Err(E::NotFound { .. })), "{e:?}");
    }
    let groups = c.list_runner_groups("acme");
    ok(h, "GET", "/orgs/acme/actions/runner-groups", 200, groups).await;
    let runs_path = "/repos/acme/widgets/actions/runs";
    let runs = c.list_workflow_runs("acme", "widgets", "queued");
    let runs = ok(h, "GET", runs_path, 200, runs).await;
    let run_id = match runs.value.as_slice() {
        [run] => run.id,
        other => panic!("one queued run expected, GitHub listed {other:?}"),
    };
    let jobs = c.list_run_jobs("acme", "widgets", run_id);
    let jobs = ok(h, "GET", &format!("/runs/{run_id}/jobs"), 200, jobs).await;
    let job_id = JobId::try_from(job).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        jobs.value.iter().map(|j| j.id).collect::<Vec<_>>(),
        [job_id]
    );
    let job_path = format!("/actions/jobs/{job}");
    ok(
        h,
        "GET",
        &job_path,
        200,
        c.get_job("acme", "widgets", job_id),
    )
    .await;
    assert!(h.fake.complete_job(job, "success"));
    ok(
        h,
        "GET",
        &job_path,
        200,
        c.get_job("acme", "widgets", job_id),
    )
    .await;
    let done = c.list_workflow_runs("acme", "widgets", "completed");
    let done = ok(h, "GET", runs_path, 200, done).await;
    assert!(
        done.value.iter().any(|r| r.id == run_id),
        "{:?}",
        done.value
    );
    // Re-running the finished job: refused without "Actions: write", then a new job of its run;
    // then refused while that new job's run is running.
    let rerun_path = format!("/actions/jobs/{job}/rerun");
    for (write, status) in [(false, 403), (true, 201), (true, 403)] {
        h.fake.set_actions_write(h.org_installation, write);
        let before = h.fake.requests().len();
        let result = c.rerun_job("acme", "widgets", job_id).await;
        let requests = h.fake.requests();
        let last = requests[before..]
            .last()
            .unwrap_or_else(|| panic!("the re-run sent no request: {result:?}"));
        assert!(
            last.method == "POST" && last.path.ends_with(&rerun_path),
            "{last:?}"
        );
        assert_eq!(last.status, status, "{result:?}");
        match (write, status, &result) {
            (false, 403, Err(rm_github::RerunError::MissingActionsWrite { .. })) => {}
            (true, 201, Ok(())) => {}
            (true, 403, Err(rm_github::RerunError::RunInProgress { .. })) => {}
            other => panic!("re-run: {other:?}"),
        }
    }
    assert_eq!(h.fake.reruns().len(), 1);
    let held = h
        .fake
        .queue_waiting_job("acme/widgets", "deploy", &["self-hosted"]);
    let held = held.unwrap_or_else(|e| panic!("{e}"));
    let held_path = format!("/actions/jobs/{held}");
    ok(
        h,
        "GET",
        &held_path,
        200,
        c.get_job(
            "acme",
            "widgets",
            JobId::try_from(held).unwrap_or_else(|e| panic!("{e}")),
        ),
    )
    .await;
    let waiting = c.list_workflow_runs("acme", "widgets", "waiting");
    let waiting = ok(h, "GET", runs_path, 200, waiting).await;
    assert_eq!(waiting.value.len(), 1, "{:?}", waiting.value);
    // actions/runner's releases: the latest is the newest that is not a prerelease.
    h.fake
        .publish_runner_release("2.330.0", b"package".to_vec());
    h.fake.publish_runner_release_with(
        "2.331.0",
        b"next package".to_vec(),
        rm_fake_github::ReleaseOptions {
            prerelease: true,
            ..Default::default()
        },
    );
    let inst = h.org_installation;
    let latest_path = "/repos/actions/runner/releases/latest";
    let latest = c.latest_release(inst, "actions/runner");
    let latest = ok(h, "GET", latest_path, 200, latest).await;
    assert_eq!(latest.value.tag_name, "v2.330.0");
    assert!(!latest.not_modified);
    let again = ok(
        h,
        "GET",
        latest_path,
        304,
        c.latest_release(inst, "actions/runner"),
    )
    .await;
    assert!(
        again.not_modified,
        "a 304 the client did not take as unchanged"
    );
    assert_eq!(again.value, latest.value);
    let releases = c.list_releases(inst, "actions/runner");
    let releases = ok(h, "GET", "/repos/actions/runner/releases", 200, releases).await;
    let tags: Vec<&str> = releases.value.iter().map(|r| r.tag_name.as_str()).collect();
    assert_eq!(tags, ["v2.331.0", "v2.330.0"], "newest first");
    assert!(releases.value[0].prerelease && releases.value[0].published_at.is_some());
    let none = c.latest_release(inst, "acme/widgets");
    let e = expect(h, "GET", "/repos/acme/widgets/releases/latest", 404, none).await;
    assert!(matches!(e, Err(E::NotFound { .. })), "{e:?}");
    let repos = c.list_installation_repositories(h.org_installation);
    ok(h, "GET", "/installation/repositories", 200, repos).await;
    ok(
        h,
        "GET",
        "/rate_limit",
        200,
        c.rate_limit(h.org_installation),
    )
    .await;
    h.fake.settle().await.unwrap_or_else(|e| panic!("{e}"));
    let page = c.list_hook_deliveries(None);
    let page = ok(h, "GET", "/app/hook/deliveries", 200, page).await;
    let Some(d) = page.deliveries.first() else {
        panic!("GitHub listed no delivery after queuing and completing jobs");
    };
    let attempts = format!("/app/hook/deliveries/{}/attempts", d.id);
    ok(h, "POST", &attempts, 202, c.redeliver(d.id)).await;
    let unknown = page.deliveries.iter().map(|d| d.id).max().unwrap_or(0) + 1_000_000;
    let attempts = format!("/app/hook/deliveries/{unknown}/attempts");
    let e = expect(h, "POST", &attempts, 404, c.redeliver(unknown)).await;
    assert!(matches!(e, Err(E::NotFound { .. })), "{e:?}");
}

#[tokio::test]
async fn fake_answers_and_client_requests_follow_githubs_description() {
    let spec = spec();
    let h = harness_with("", Duration::from_secs(10)).await;
    exercise(&h).await;
    let requests = h.fake.requests();
    assert!(requests.len() > 30, "only {} requests", requests.len());
    let mut errors = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for r in &requests {
        let Some((tpl, op)) = template_for(&spec, &r.method, &r.path) else {
            errors.push(format!(
                "{} {}: not in GitHub's description",
                r.method, r.path
            ));
            continue;
        };
        covered.insert(format!("{} {tpl}", r.method));
        let where_ = format!("{} {tpl} -> {}", r.method, r.status);
        // Query parameters are declared ones.
        let declared: Vec<&str> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str())
            .collect();
        for kv in r.query.split('&').filter(|kv| !kv.is_empty()) {
            let key = kv.split('=').next().unwrap_or("");
            if !declared.contains(&key) {
                errors.push(format!("{where_}: undeclared query parameter {key}"));
            }
        }
        // The request body has what the operation requires.
        if let Some(schema) = op.pointer("/requestBody/content/application~1json/schema") {
            match &r.body {
                Some(body) => validate(body, schema, &format!("{where_} request"), &mut errors),
                None if op["requestBody"]["required"] == true => {
                    errors.push(format!("{where_}: body required"))
                }
                None => {}
            }
        }
        // The status is documented, or one GitHub is known to send there (named, with why).
        let documented = op["responses"].get(r.status.to_string()).is_some();
        if !documented && !sent_though_undocumented(&r.method, tpl, r.status, r) {
            errors.push(format!("{where_}: undocumented status"));
        }
        // A documented JSON answer has the documented shape.
        let schema = op.pointer(&format!(
            "/responses/{}/content/application~1json/schema",
            r.status
        ));
        if let (Some(schema), Some(body)) = (schema, &r.response_body)
            && r.status < 300
        {
            validate(body, schema, &format!("{where_} answer"), &mut errors);
        }
    }
    assert!(
        errors.is_empty(),
        "{} mismatches:\n{}",
        errors.len(),
        errors.join("\n")
    );
    // Every endpoint the issue lists was exercised.
    for must in [
        "POST /orgs/{org}/actions/runners/generate-jitconfig",
        "POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig",
        "GET /orgs/{org}/actions/runners",
        "DELETE /repos/{owner}/{repo}/actions/runners/{runner_id}",
        "GET /repos/{owner}/{repo}/actions/runs",
        "GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
        "GET /repos/{owner}/{repo}/actions/jobs/{job_id}",
        "POST /repos/{owner}/{repo}/actions/jobs/{job_id}/rerun",
        "GET /installation/repositories",
        "GET /app/hook/deliveries",
        "POST /app/hook/deliveries/{delivery_id}/attempts",
        "GET /rate_limit",
        "POST /app/installations/{installation_id}/access_tokens",
        "GET /orgs/{org}/installation",
        "GET /repos/{owner}/{repo}/installation",
        "GET /repos/{owner}/{repo}/releases/latest",
        "GET /repos/{owner}/{repo}/releases",
    ] {
        assert!(
            covered.contains(must),
            "{must} not exercised; covered: {covered:?}"
        );
    }
}

#[test]
fn the_validator_catches_missing_fields_wrong_types_and_enums() {
    let schema: Value = serde_json::json!({
        "type": "object", "required": ["id", "status"],
        "properties": {
            "id": {"type": "integer"},
            "status": {"type": "string", "enum": ["queued", "completed"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"type": "string", "nullable": true},
        }
    });
    let check = |v: Value| {
        let mut e = Vec::new();
        validate(&v, &schema, "$", &mut e);
        e.len()
    };
    assert_eq!(
        check(serde_json::json!({"id": 1, "status": "queued", "note": null})),
        0
    );
    assert_eq!(check(serde_json::json!({"status": "queued"})), 1);
    assert_eq!(check(serde_json::json!({"id": "1", "status": "queued"})), 1);
    assert_eq!(check(serde_json::json!({"id": 1, "status": "lost"})), 1);
    assert_eq!(
        check(serde_json::json!({"id": 1, "status": "queued", "tags": [1]})),
        1
    );
}
