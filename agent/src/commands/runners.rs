//! `rm-agent runners`: the runner attempts this host journalled and their states, and the image
//! each ran (issue 40).

use rm_journal::AttemptRecord;
use serde_json::{Value, json};

use crate::config::Config;
use crate::exit::Exit;
use crate::output::{or_dash, print_json, print_table, rfc3339};

/// Hex characters of an image id the table shows after `sha256:`, as `docker images` shortens
/// an id: enough to tell a host's images apart, the full id is in `--json` and `explain`.
const SHORT_IMAGE_HEX: usize = 12;

pub fn run(config: &Config, json: bool, limit: usize) -> Result<(), Exit> {
    let attempts = match super::open_reader_or_empty(config, json)? {
        Some(reader) => reader.attempts(limit).map_err(Exit::runtime)?,
        None => Vec::new(),
    };
    if json {
        print_json(&Value::Array(attempts.iter().map(attempt_json).collect()));
        return Ok(());
    }
    let (header, rows) = table(&attempts);
    print_table(&header, &rows);
    Ok(())
}

/// An image id as a table shows it: `sha256:` and its first [`SHORT_IMAGE_HEX`] hex characters.
/// Anything that is not a `sha256:` id is shown whole.
pub(crate) fn short_image(image: &str) -> &str {
    match image.strip_prefix("sha256:") {
        Some(hex) if hex.len() > SHORT_IMAGE_HEX && hex.is_char_boundary(SHORT_IMAGE_HEX) => {
            &image[.."sha256:".len() + SHORT_IMAGE_HEX]
        }
        _ => image,
    }
}

/// One attempt of `runners --json` (CONTRACT §3, with `isolation`, `uid` and `image` beside).
fn attempt_json(a: &AttemptRecord) -> Value {
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
        "image": a.image,
        "created_at": rfc3339(a.created_at_ms.get()),
        "updated_at": rfc3339(a.updated_at_ms.get()),
    })
}

/// The table's header and rows. The IMAGE column is there only when an attempt listed ran in an
/// image: a host whose runners all run on its own root shows the table it always did.
fn table(attempts: &[AttemptRecord]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let images = attempts.iter().any(|a| a.image.is_some());
    let mut header = vec!["RUNNER", "POLICY", "STATE", "OUTCOME", "JOB", "UID"];
    if images {
        header.push("IMAGE");
    }
    header.extend(["UPDATED", "DETAIL"]);
    let rows = attempts
        .iter()
        .map(|a| {
            let mut row = vec![
                a.runner_name.clone(),
                a.policy.clone(),
                a.state.as_str().to_owned(),
                or_dash(a.outcome.map(|o| o.as_str())),
                a.job_id.map_or_else(|| "-".to_owned(), |j| j.to_string()),
                a.uid.map_or_else(|| "-".to_owned(), |u| u.to_string()),
            ];
            if images {
                row.push(or_dash(a.image.as_deref().map(short_image)));
            }
            row.extend([
                rfc3339(a.updated_at_ms.get()),
                or_dash(a.detail.as_deref().or(a.reason.as_deref())),
            ]);
            row
        })
        .collect();
    (header, rows)
}

#[cfg(test)]
mod tests;
