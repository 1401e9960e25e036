//! `rm-agent runners`: the runner attempts this host journalled and their states.

use serde_json::json;

use crate::config::Config;
use crate::exit::Exit;
use crate::output::{or_dash, print_json, print_table, rfc3339};

pub fn run(config: &Config, json: bool, limit: usize) -> Result<(), Exit> {
    let attempts = match super::open_reader_or_empty(config, json)? {
        Some(reader) => reader.attempts(limit).map_err(Exit::runtime)?,
        None => Vec::new(),
    };
    if json {
        let list: Vec<_> = attempts
            .iter()
            .map(|a| {
                json!({
                    "attempt_id": a.attempt_id.as_str(),
                    "policy": a.policy,
                    "runner_name": a.runner_name,
                    "runner_id": a.runner_id,
                    "state": a.state.as_str(),
                    "outcome": a.outcome.map(|o| o.as_str()),
                    "reason": a.reason,
                    "job_id": a.job_id,
                    "isolation": a.isolation.as_str(),
                    "uid": a.uid,
                    "created_at": rfc3339(a.created_at_ms.get()),
                    "updated_at": rfc3339(a.updated_at_ms.get()),
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = attempts
        .iter()
        .map(|a| {
            vec![
                a.runner_name.clone(),
                a.policy.clone(),
                a.state.as_str().to_owned(),
                or_dash(a.outcome.map(|o| o.as_str())),
                a.job_id.map_or_else(|| "-".to_owned(), |j| j.to_string()),
                a.uid.map_or_else(|| "-".to_owned(), |u| u.to_string()),
                rfc3339(a.updated_at_ms.get()),
                or_dash(a.detail.as_deref().or(a.reason.as_deref())),
            ]
        })
        .collect();
    print_table(
        &[
            "RUNNER", "POLICY", "STATE", "OUTCOME", "JOB", "UID", "UPDATED", "DETAIL",
        ],
        &rows,
    );
    Ok(())
}
