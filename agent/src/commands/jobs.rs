//! `rm-agent jobs`: the journalled `workflow_job`s and their states (with `journal.url`, the
//! fleet's, from PostgreSQL).

use serde_json::json;

use crate::config::Config;
use crate::exit::Exit;
use crate::output::{or_dash, print_json, print_table, rfc3339};

pub fn run(config: &Config, json: bool, limit: usize) -> Result<(), Exit> {
    let jobs = super::read_jobs(config, json, |reader| reader.jobs(limit))?;
    if json {
        let list: Vec<_> = jobs
            .iter()
            .map(|j| {
                json!({
                    "job_id": j.job_id,
                    "run_id": j.run_id,
                    "run_attempt": j.run_attempt,
                    "repository": j.repository,
                    "labels": j.labels,
                    "state": j.state.as_str(),
                    "conclusion": j.conclusion,
                    "runner_name": j.runner_name,
                    "runner_id": j.runner_id,
                    "installation_id": j.installation_id,
                    "workflow_name": j.workflow_name,
                    "job_name": j.job_name,
                    "source": j.source,
                    "first_seen_at": rfc3339(j.first_seen_at_ms.get()),
                    "updated_at": rfc3339(j.updated_at_ms.get()),
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.job_id.to_string(),
                format!("{}/{}", j.run_id, j.run_attempt),
                j.repository.clone(),
                j.state.as_str().to_owned(),
                or_dash(j.conclusion.as_deref()),
                or_dash(j.runner_name.as_deref()),
                j.labels.join(","),
                j.source.clone(),
                rfc3339(j.updated_at_ms.get()),
            ]
        })
        .collect();
    print_table(
        &[
            "JOB",
            "RUN/ATTEMPT",
            "REPOSITORY",
            "STATE",
            "CONCLUSION",
            "RUNNER",
            "LABELS",
            "SOURCE",
            "UPDATED",
        ],
        &rows,
    );
    Ok(())
}
