//! Holds the fake's answers and the client's requests to GitHub's own OpenAPI description
//! (`tests/fake-github/github-rest-subset.json`): every request is a documented method and path
//! with documented query parameters and the required body fields, every status is documented
//! (or one GitHub sends on any endpoint), and every JSON answer has the fields, types and enum
//! values the schema requires. Neither side can drift from GitHub without this failing.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

/// Statuses GitHub may send on any endpoint, documented or not.
const GENERIC_STATUSES: &[u16] = &[401, 403, 404, 429, 500, 502, 503];

fn spec() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fake-github/github-rest-subset.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
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

/// Drives every endpoint the client has, on both happy and error paths.
async fn exercise(h: &Harness) {
    let c = &h.client;
    let _ = c.app().await;
    let _ = c.list_installations().await;
    let _ = c.installation_for(&org()).await;
    let _ = c.installation_for(&repo()).await;
    let _ = c
        .installation_for(&rm_github::Target::Org("nobody".into()))
        .await;
    let job = h
        .fake
        .queue_job("acme/widgets", "build", &["self-hosted", "linux"]);
    let job = job.unwrap_or_else(|e| panic!("{e}"));
    h.fake.settle().await.unwrap_or_else(|e| panic!("{e}"));
    for target in [org(), repo()] {
        let jit = c.generate_jitconfig(&target, &jit_request("conf")).await;
        let jit = jit.unwrap_or_else(|e| panic!("{e}"));
        let _ = c.generate_jitconfig(&target, &jit_request("conf")).await; // 409
        let mut bad = jit_request("conf-2");
        bad.runner_group_id = 77;
        let _ = c.generate_jitconfig(&target, &bad).await; // 422
        let _ = c.list_runners(&target).await;
        let _ = c.list_runners(&target).await; // 304
        let _ = c.get_runner(&target, jit.runner.id).await;
        let _ = c.find_runner_by_name(&target, "conf").await;
        let _ = c.delete_runner(&target, jit.runner.id).await;
        let _ = c.delete_runner(&target, jit.runner.id).await; // 404
    }
    let _ = c.list_runner_groups("acme").await;
    let runs = c.list_workflow_runs("acme", "widgets", "queued").await;
    let run_id = runs
        .ok()
        .and_then(|r| r.value.first().map(|r| r.id))
        .unwrap_or(0);
    let _ = c.list_run_jobs("acme", "widgets", run_id).await;
    let _ = c.get_job("acme", "widgets", job).await;
    h.fake.complete_job(job, "success");
    let _ = c.get_job("acme", "widgets", job).await;
    let _ = c.list_workflow_runs("acme", "widgets", "completed").await;
    let held = h
        .fake
        .queue_waiting_job("acme/widgets", "deploy", &["self-hosted"]);
    let held = held.unwrap_or_else(|e| panic!("{e}"));
    let _ = c.get_job("acme", "widgets", held).await;
    let _ = c.list_workflow_runs("acme", "widgets", "waiting").await;
    let _ = c.list_installation_repositories(h.org_installation).await;
    let _ = c.rate_limit(h.org_installation).await;
    let page = c.list_hook_deliveries(None).await;
    if let Some(d) = page.ok().and_then(|p| p.deliveries.into_iter().next()) {
        let _ = c.redeliver(d.id).await;
    }
    let _ = c.redeliver(5).await; // 404
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
        // The status is documented, or one GitHub sends anywhere.
        let documented = op["responses"].get(r.status.to_string()).is_some();
        let generic =
            GENERIC_STATUSES.contains(&r.status) || (r.status == 304 && r.method == "GET");
        if !documented && !generic {
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
        "GET /installation/repositories",
        "GET /app/hook/deliveries",
        "POST /app/hook/deliveries/{delivery_id}/attempts",
        "GET /rate_limit",
        "POST /app/installations/{installation_id}/access_tokens",
        "GET /orgs/{org}/installation",
        "GET /repos/{owner}/{repo}/installation",
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
