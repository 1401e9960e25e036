//! `rm-agent logs JOB_ID|RUNNER [--follow]`: the logs an attempt's runner left, found through
//! this host's journal (a job id, a runner name or an attempt id), from the kept copy
//! (`rm_runner::logs`) once it was cleaned up, or from its runtime's `_diag` while it lives (read
//! with the same safe opener, capped and scrubbed the same way). `--follow` tails the live files
//! until the attempt is cleaned, then prints the rest from the kept copy. Works with the agent
//! stopped; what is printed is what the job's uid wrote: evidence, not proof.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use rm_journal::{AttemptRecord, AttemptState};

use crate::config::Config;
use crate::exit::Exit;
use rm_runner::logs::{self, Manifest, PER_FILE_CAP, Store, scrub::Scrubber};

/// How often `--follow` looks at the live files and the journal again.
pub(crate) const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// The most bytes `--follow` reads of one file per look: a job writing fast is shown in steps,
/// never read whole into memory.
pub(crate) const FOLLOW_CHUNK: u64 = 1 << 20;

/// One attempt the argument names, from the journal or only from its kept copy (the journal
/// prunes cleaned attempts before the store may).
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub(crate) attempt_id: String,
    pub(crate) runner_name: String,
    pub(crate) job_id: Option<i64>,
    /// `None`: the journal no longer has it.
    pub(crate) record: Option<AttemptRecord>,
}

pub fn run(config: &Config, target: &str, follow: bool) -> Result<(), Exit> {
    let store = Store::new(&config.data_dir, config.logs);
    let reader = super::open_local_reader(config)?;
    let records = match &reader {
        Some(reader) => reader.attempts(usize::MAX).map_err(Exit::runtime)?,
        None => Vec::new(),
    };
    // A job's runner is named by the job's own row (an attempt learns its job only from a
    // delivery naming its runner; the job's row also from a poll).
    let job_runner = match (&reader, target.parse::<i64>()) {
        (Some(reader), Ok(job)) => reader
            .job(rm_vocab::JobId::new(job))
            .map_err(Exit::runtime)?
            .and_then(|row| row.runner_name),
        _ => None,
    };
    let kept = store.entries().map_err(Exit::runtime)?;
    let found = resolve(
        target,
        job_runner.as_deref(),
        &records,
        kept.into_iter().filter_map(|(_, m)| m),
    );
    if found.is_empty() {
        return Err(Exit::runtime(anyhow::anyhow!(
            "no attempt of this host ran job or runner `{target}` (its journal in {} and its kept logs name none); `rm-agent runners` lists the runners and their jobs",
            config.data_dir.display()
        )));
    }
    let last = found.len() - 1;
    for (i, attempt) in found.iter().enumerate() {
        crate::out!("{}", header(attempt));
        let live = attempt.record.as_ref().filter(|r| is_live(r.state));
        match live {
            Some(record) if follow && i == last => {
                return follow_attempt(reader.as_ref(), &store, record);
            }
            Some(record) => crate::out!("{}", render_live(&record.runtime_dir)),
            None => crate::out!("{}", render_kept(&store, &attempt.attempt_id)),
        }
    }
    Ok(())
}

/// Whether the attempt's runtime may still be there (not yet cleaned).
fn is_live(state: AttemptState) -> bool {
    state != AttemptState::Cleaned
}

/// The attempts `target` names, oldest first: a job id (or `job_runner`, the runner the
/// journal's row of that job names), a runner name or an attempt id, in the journal's records
/// and then in kept copies the journal no longer has.
pub(crate) fn resolve(
    target: &str,
    job_runner: Option<&str>,
    records: &[AttemptRecord],
    kept: impl IntoIterator<Item = Manifest>,
) -> Vec<Found> {
    let job: Option<i64> = target.parse().ok();
    let names = |attempt_id: &str, runner: &str, job_id: Option<i64>| {
        attempt_id == target
            || runner == target
            || job_runner == Some(runner)
            || (job.is_some() && job_id == job)
    };
    let mut found: Vec<(i64, Found)> = records
        .iter()
        .filter(|r| {
            names(
                r.attempt_id.as_str(),
                &r.runner_name,
                r.job_id.map(|j| j.get()),
            )
        })
        .map(|r| {
            (
                r.created_at_ms.get(),
                Found {
                    attempt_id: r.attempt_id.as_str().to_owned(),
                    runner_name: r.runner_name.clone(),
                    job_id: r.job_id.map(|j| j.get()),
                    record: Some(r.clone()),
                },
            )
        })
        .collect();
    for manifest in kept {
        if names(&manifest.attempt_id, &manifest.runner_name, manifest.job_id)
            && !found
                .iter()
                .any(|(_, f)| f.attempt_id == manifest.attempt_id)
        {
            found.push((
                manifest.kept_at_ms,
                Found {
                    attempt_id: manifest.attempt_id,
                    runner_name: manifest.runner_name,
                    job_id: manifest.job_id,
                    record: None,
                },
            ));
        }
    }
    found.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.attempt_id.cmp(&b.1.attempt_id))
    });
    found.into_iter().map(|(_, f)| f).collect()
}

fn header(attempt: &Found) -> String {
    let state = attempt
        .record
        .as_ref()
        .map_or("no longer in the journal", |r| r.state.as_str());
    let job = attempt
        .job_id
        .map_or_else(|| "no job".to_owned(), |j| format!("job {j}"));
    format!(
        "=== attempt {} runner {} ({job}, {state}) ===",
        attempt.attempt_id, attempt.runner_name
    )
}

/// The kept copy of an attempt, file by file with a header line each.
pub(crate) fn render_kept(store: &Store, attempt_id: &str) -> String {
    let entry = store.entry(attempt_id);
    let Some(manifest) = logs::read_manifest(&entry) else {
        return format!(
            "(no logs kept: pruned by the [logs] bounds, not kept (`logs.keep = 0`), or the attempt had no runtime; {} has no copy)\n",
            entry.display()
        );
    };
    let mut out = String::new();
    for file in &manifest.files {
        let note = if file.capped {
            format!(
                "kept {} of {} bytes: head and tail",
                file.kept_bytes, file.original_bytes
            )
        } else {
            format!("{} bytes", file.original_bytes)
        };
        let _ = writeln!(out, "--- {} ({note}) ---", file.name);
        match read_kept_file(&entry, &file.name) {
            Ok(text) => push_text(&mut out, &text),
            Err(e) => {
                let _ = writeln!(out, "(cannot read the kept copy: {e})");
            }
        }
    }
    for left in &manifest.left_out {
        let _ = writeln!(out, "--- {} (left out: {}) ---", left.name, left.why);
    }
    if manifest.files.is_empty() && manifest.left_out.is_empty() {
        out.push_str("(the runtime had no _diag files)\n");
    }
    out
}

/// A kept file, opened without following a link (the store is root's, but the habit costs
/// nothing).
fn read_kept_file(entry: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let dir = rm_runner::logs::copy::open_dir(entry)?;
    let (file, size) = rm_runner::logs::copy::open_regular_at(&dir, OsStr::new(name))
        .map_err(std::io::Error::other)?;
    rm_runner::logs::copy::read_capped(&file, size, u64::MAX)
}

fn push_text(out: &mut String, bytes: &[u8]) {
    out.push_str(&String::from_utf8_lossy(bytes));
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        out.push('\n');
    }
}

/// A live attempt's `_diag`, read as cleanup would keep it (capped, scrubbed).
pub(crate) fn render_live(runtime: &Path) -> String {
    let mut out = String::new();
    let diag = match logs::open_diag(runtime) {
        Ok(Some(diag)) => diag,
        Ok(None) => return "(live: its runtime has no _diag yet)\n".to_owned(),
        Err(e) => return format!("(live: cannot open its _diag: {e:#})\n"),
    };
    let mut left_out = Vec::new();
    let names = match logs::diag_names(&diag, &mut left_out) {
        Ok(names) => names,
        Err(e) => return format!("(live: cannot list its _diag: {e})\n"),
    };
    for name in names {
        match logs::read_diag_file(&diag, &name, PER_FILE_CAP) {
            Ok((bytes, size, _)) => {
                let _ = writeln!(
                    out,
                    "--- {} (live, {size} bytes) ---",
                    name.to_string_lossy()
                );
                push_text(&mut out, &bytes);
            }
            Err(why) => {
                let _ = writeln!(out, "--- {} (not read: {why}) ---", name.to_string_lossy());
            }
        }
    }
    for left in left_out {
        let _ = writeln!(out, "--- {} (left out: {}) ---", left.name, left.why);
    }
    out
}

/// What `--follow` has shown of one file.
#[derive(Default)]
pub(crate) struct Followed {
    /// Bytes of the live file consumed (up to the last whole line).
    pub(crate) offset: u64,
    /// Lines printed: the kept copy's lines after these are "the rest".
    pub(crate) lines: usize,
    scrubber: Scrubber,
}

/// Tails the live `_diag` files until the attempt is cleaned, then prints from the kept copy
/// what the live files had not shown yet (lines after those printed: scrubbing keeps lines).
fn follow_attempt(
    reader: Option<&rm_journal::Reader>,
    store: &Store,
    record: &AttemptRecord,
) -> Result<(), Exit> {
    let mut followed: HashMap<String, Followed> = HashMap::new();
    let mut current: Option<String> = None;
    loop {
        follow_once(&record.runtime_dir, &mut followed, &mut current);
        let state = match reader {
            Some(reader) => reader
                .attempts(usize::MAX)
                .map_err(Exit::runtime)?
                .into_iter()
                .find(|r| r.attempt_id == record.attempt_id)
                .map(|r| r.state),
            None => None,
        };
        if !state.is_some_and(is_live) {
            break;
        }
        std::thread::sleep(FOLLOW_POLL);
    }
    let entry = store.entry(record.attempt_id.as_str());
    let Some(manifest) = logs::read_manifest(&entry) else {
        crate::out!(
            "=== the attempt was cleaned up; no kept copy at {} ===\n",
            entry.display()
        );
        return Ok(());
    };
    crate::out!("=== the attempt was cleaned up; the rest from its kept copy ===\n");
    for file in &manifest.files {
        let Ok(bytes) = read_kept_file(&entry, &file.name) else {
            continue;
        };
        let rest = lines_after(&bytes, followed.get(&file.name).map_or(0, |f| f.lines));
        if !rest.is_empty() {
            crate::out!("--- {} ---\n", file.name);
            let mut text = String::new();
            push_text(&mut text, &rest);
            crate::out!("{text}");
        }
    }
    Ok(())
}

/// What a kept file holds after its first `shown` lines (`--follow` printed those live).
pub(crate) fn lines_after(bytes: &[u8], shown: usize) -> Vec<u8> {
    let mut at = 0;
    for _ in 0..shown {
        match bytes[at..].iter().position(|b| *b == b'\n') {
            Some(end) => at += end + 1,
            None => return Vec::new(),
        }
    }
    bytes[at..].to_vec()
}

/// One look at the live files: every whole line written since the last look, scrubbed.
pub(crate) fn follow_once(
    runtime: &Path,
    followed: &mut HashMap<String, Followed>,
    current: &mut Option<String>,
) {
    let Ok(Some(diag)) = logs::open_diag(runtime) else {
        return;
    };
    let mut left_out = Vec::new();
    let Ok(names) = logs::diag_names(&diag, &mut left_out) else {
        return;
    };
    for name in names {
        let Ok((file, size)) = logs::copy::open_regular_at(&diag, &name) else {
            continue;
        };
        let key = name.to_string_lossy().into_owned();
        let state = followed.entry(key.clone()).or_default();
        if size < state.offset {
            // Truncated: start again from its beginning.
            state.offset = 0;
        }
        let want = (size - state.offset).min(FOLLOW_CHUNK);
        let Ok(bytes) = logs::copy::read_at(&file, state.offset, want) else {
            continue;
        };
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
            continue;
        };
        let whole = &bytes[..end];
        state.offset += end as u64 + 1;
        let mut text = String::new();
        for line in whole.split(|b| *b == b'\n') {
            text.push_str(&String::from_utf8_lossy(&state.scrubber.line(line)));
            text.push('\n');
            state.lines += 1;
        }
        if current.as_deref() != Some(key.as_str()) {
            crate::out!("--- {key} ---\n");
            *current = Some(key);
        }
        crate::out!("{text}");
    }
}

#[cfg(test)]
mod tests;
