//! `rm-agent logs JOB_ID|RUNNER [--follow]`: the logs an attempt's runner left, found through
//! this host's journal (a job id, a runner name or an attempt id), from the kept copy
//! (`rm_runner::logs`) once it was cleaned up, or from its runtime's `_diag` while it lives (read
//! with the same safe opener, capped and scrubbed the same way). `--follow` tails the live files
//! until the attempt is cleaned, then prints the rest from the kept copy. Works with the agent
//! stopped; what is printed is what the job's uid wrote: evidence, not proof. Every byte of a
//! job's files reaches the terminal escaped ([`terminal::escape`]) and streamed: files are read
//! a chunk at a time and printed piece by piece through one bounded buffer, and the live view
//! reads no more of an attempt than its kept copy would ([`Budget`]).

mod terminal;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::time::Duration;

use rm_journal::{AttemptRecord, AttemptState};

use crate::config::Config;
use crate::exit::Exit;
use rm_runner::logs::copy::{self, Streamed};
use rm_runner::logs::{self, Budget, Manifest, Store, scrub::Scrubber};

/// How often `--follow` looks at the live files and the journal again.
pub(crate) const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// The most bytes `--follow` reads of one file per look: a job writing fast is shown in steps,
/// never read whole into memory. A line longer than this is shown in pieces of it.
pub(crate) const FOLLOW_CHUNK: u64 = copy::MAX_PIECE as u64;

/// The buffer between the escaped text and standard output: what is printed is written out
/// in writes of this size, never gathered whole.
pub(crate) const OUTPUT_BUFFER: usize = 64 << 10;

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
    let mut out = Printer::new(io::BufWriter::with_capacity(OUTPUT_BUFFER, Stdout));
    for (i, attempt) in found.iter().enumerate() {
        out.own(&header(attempt));
        let live = attempt.record.as_ref().filter(|r| is_live(r.state));
        match live {
            Some(record) if follow && i == last => {
                return follow_attempt(reader.as_ref(), &store, record, &mut out);
            }
            Some(record) => {
                render_live(&record.runtime_dir, &mut out);
            }
            None => {
                render_kept(&store, &attempt.attempt_id, &mut out);
            }
        }
    }
    out.flush();
    Ok(())
}

/// Standard output through `crate::output::write_stdout` (a reader that closed the pipe only
/// drops the rest). Written only whole pieces of escaped text, so always UTF-8.
struct Stdout;

impl io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        crate::output::write_stdout(format_args!("{}", String::from_utf8_lossy(buf)));
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where `logs` prints: rm's own lines as they are, a job's bytes escaped
/// ([`terminal::escape`]), piece by piece.
pub(crate) struct Printer<W: io::Write> {
    out: W,
    /// The next byte printed starts a line.
    line_start: bool,
    /// One piece, escaped (reused: at most a piece's escaped size).
    text: String,
}

impl<W: io::Write> Printer<W> {
    pub(crate) fn new(out: W) -> Printer<W> {
        Printer {
            out,
            line_start: true,
            text: String::new(),
        }
    }

    /// One of rm's own lines (a header, a note), on a line of its own: a job's file that did not
    /// end its last line gets a line end first.
    pub(crate) fn own(&mut self, line: &str) {
        self.end_line();
        self.write(line.as_bytes());
        self.write(b"\n");
        self.line_start = true;
    }

    /// A piece of a job's file; `ends`: a line end followed it.
    pub(crate) fn job(&mut self, piece: &[u8], ends: bool) {
        let mut text = std::mem::take(&mut self.text);
        text.clear();
        terminal::escape(piece, self.line_start, &mut text);
        if ends {
            text.push('\n');
        }
        self.write(text.as_bytes());
        self.line_start = ends || (self.line_start && piece.is_empty());
        self.text = text;
    }

    /// Ends a job's line left open (its file ended without a line end).
    pub(crate) fn end_line(&mut self) {
        if !self.line_start {
            self.write(b"\n");
            self.line_start = true;
        }
    }

    /// Writes out what is buffered (between looks of `--follow`, and at the end).
    pub(crate) fn flush(&mut self) {
        let _ = self.out.flush();
    }

    /// The printer's writer (tests read what was printed).
    #[cfg(test)]
    pub(crate) fn into_inner(self) -> W {
        self.out
    }

    fn write(&mut self, bytes: &[u8]) {
        // Standard output never fails here (a lost stdout drops the rest and is reported at
        // exit); a test's writer is memory.
        let _ = self.out.write_all(bytes);
    }
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

/// The kept copy of an attempt, file by file with a header line each, streamed to `out`;
/// returns what reading it took.
pub(crate) fn render_kept<W: io::Write>(
    store: &Store,
    attempt_id: &str,
    out: &mut Printer<W>,
) -> Streamed {
    let mut streamed = Streamed::default();
    let entry = store.entry(attempt_id);
    let Some(manifest) = logs::read_manifest(&entry) else {
        out.own(&format!(
            "(no logs kept: pruned by the [logs] bounds, not kept (`logs.keep = 0`), or the attempt had no runtime; {} has no copy)",
            entry.display()
        ));
        return streamed;
    };
    for file in &manifest.files {
        let note = if file.capped {
            format!(
                "kept {} of {} bytes: head and tail",
                file.kept_bytes, file.original_bytes
            )
        } else {
            format!("{} bytes", file.original_bytes)
        };
        out.own(&format!("--- {} ({note}) ---", file.name));
        match print_kept_file(&entry, &file.name, 0, out) {
            Ok(read) => streamed.add(read),
            Err(e) => out.own(&format!("(cannot read the kept copy: {e})")),
        }
    }
    for left in &manifest.left_out {
        out.own(&format!("--- {} (left out: {}) ---", left.name, left.why));
    }
    if manifest.files.is_empty() && manifest.left_out.is_empty() {
        out.own("(the runtime had no _diag files)");
    }
    streamed
}

/// What [`render_kept`] prints of an attempt, as text (tests).
#[cfg(test)]
pub(crate) fn kept_text(store: &Store, attempt_id: &str) -> String {
    let mut out = Printer::new(Vec::new());
    render_kept(store, attempt_id, &mut out);
    String::from_utf8(out.into_inner()).unwrap_or_default()
}

/// Prints a kept file after its first `skip` lines (`--follow` printed those live), opened
/// without following a link (the store is root's, but the habit costs nothing) and streamed.
fn print_kept_file<W: io::Write>(
    entry: &Path,
    name: &str,
    skip: usize,
    out: &mut Printer<W>,
) -> io::Result<Streamed> {
    let dir = copy::open_dir(entry)?;
    let (file, _) = copy::open_regular_at(&dir, OsStr::new(name)).map_err(io::Error::other)?;
    let mut lines = 0;
    let read = copy::stream_all(&file, &mut |piece, ends| {
        if lines >= skip {
            out.job(piece, ends);
        }
        if ends {
            lines += 1;
        }
        Ok(())
    })?;
    out.end_line();
    Ok(read)
}

/// A live attempt's `_diag`, read as cleanup would keep it (capped under the attempt's
/// [`Budget`], scrubbed) and streamed to `out`; returns what reading it took.
pub(crate) fn render_live<W: io::Write>(runtime: &Path, out: &mut Printer<W>) -> Streamed {
    let mut streamed = Streamed::default();
    let diag = match logs::open_diag(runtime) {
        Ok(Some(diag)) => diag,
        Ok(None) => {
            out.own("(live: its runtime has no _diag yet)");
            return streamed;
        }
        Err(e) => {
            out.own(&format!("(live: cannot open its _diag: {e:#})"));
            return streamed;
        }
    };
    let mut left_out = Vec::new();
    let names = match logs::diag_names(&diag, &mut left_out) {
        Ok(names) => names,
        Err(e) => {
            out.own(&format!("(live: cannot list its _diag: {e})"));
            return streamed;
        }
    };
    let mut budget = Budget::attempt();
    for name in names {
        let shown = name.to_string_lossy();
        let Some(cap) = budget.next_cap() else {
            out.own(&format!("--- {shown} (left out: {}) ---", budget.spent()));
            continue;
        };
        let (file, size) = match copy::open_regular_at(&diag, &name) {
            Ok(opened) => opened,
            Err(why) => {
                out.own(&format!("--- {shown} (not read: {why}) ---"));
                continue;
            }
        };
        let note = if size > cap {
            format!("live, {size} bytes, read to {cap}: head and tail")
        } else {
            format!("live, {size} bytes")
        };
        out.own(&format!("--- {shown} ({note}) ---"));
        let read = logs::stream_scrubbed(&file, size, cap, &mut |piece, ends| {
            out.job(piece, ends);
            Ok(())
        });
        match read {
            Ok(read) => {
                budget.spend(size, cap, read.read);
                streamed.add(read);
                out.end_line();
            }
            Err(e) => out.own(&format!("(cannot read it: {e})")),
        }
    }
    for left in left_out {
        out.own(&format!("--- {} (left out: {}) ---", left.name, left.why));
    }
    streamed
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
fn follow_attempt<W: io::Write>(
    reader: Option<&rm_journal::Reader>,
    store: &Store,
    record: &AttemptRecord,
    out: &mut Printer<W>,
) -> Result<(), Exit> {
    let mut followed: HashMap<String, Followed> = HashMap::new();
    let mut current: Option<String> = None;
    loop {
        follow_once(&record.runtime_dir, &mut followed, &mut current, out);
        out.flush();
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
        out.own(&format!(
            "=== the attempt was cleaned up; no kept copy at {} ===",
            entry.display()
        ));
        out.flush();
        return Ok(());
    };
    out.own("=== the attempt was cleaned up; the rest from its kept copy ===");
    for file in &manifest.files {
        let shown = followed.get(&file.name).map_or(0, |f| f.lines);
        out.own(&format!("--- {} (after line {shown}) ---", file.name));
        if let Err(e) = print_kept_file(&entry, &file.name, shown, out) {
            out.own(&format!("(cannot read the kept copy: {e})"));
        }
    }
    out.flush();
    Ok(())
}

/// One look at the live files: every whole line written since the last look, scrubbed, at most
/// [`FOLLOW_CHUNK`] of each file and the attempt's [`Budget`] in all; a line longer than a
/// chunk is shown in pieces. Returns what the look read.
pub(crate) fn follow_once<W: io::Write>(
    runtime: &Path,
    followed: &mut HashMap<String, Followed>,
    current: &mut Option<String>,
    out: &mut Printer<W>,
) -> u64 {
    let mut read = 0;
    let Ok(Some(diag)) = logs::open_diag(runtime) else {
        return read;
    };
    let mut left_out = Vec::new();
    let Ok(names) = logs::diag_names(&diag, &mut left_out) else {
        return read;
    };
    let mut budget = Budget::attempt();
    for name in names {
        let Some(cap) = budget.next_cap() else {
            break;
        };
        let Ok((file, size)) = copy::open_regular_at(&diag, &name) else {
            continue;
        };
        let key = name.to_string_lossy().into_owned();
        let state = followed.entry(key.clone()).or_default();
        if size < state.offset {
            // Truncated: start again from its beginning.
            state.offset = 0;
        }
        let want = (size - state.offset).min(FOLLOW_CHUNK).min(cap);
        let Ok(bytes) = copy::read_at(&file, state.offset, want) else {
            continue;
        };
        budget.spend(want, cap, bytes.len() as u64);
        read += bytes.len() as u64;
        let Some(shown) = split_shown(&bytes) else {
            continue;
        };
        if current.as_deref() != Some(key.as_str()) {
            out.own(&format!("--- {key} ---"));
            *current = Some(key);
        }
        if shown.whole_lines {
            for line in shown.text.split(|b| *b == b'\n') {
                out.job(&state.scrubber.piece(line, true), true);
                state.lines += 1;
            }
        } else {
            out.job(&state.scrubber.piece(shown.text, false), false);
        }
        state.offset += shown.consumed as u64;
    }
    read
}

/// What one look of `--follow` shows of the bytes it read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Shown<'a> {
    /// The text shown: whole lines without the last line end, or a piece of one long line.
    pub(crate) text: &'a [u8],
    /// How many of the bytes read it consumed.
    pub(crate) consumed: usize,
    /// Whether `text` is whole lines.
    pub(crate) whole_lines: bool,
}

/// What one look of `--follow` shows of the bytes it read (pure): the whole lines; or, when a
/// full chunk has no line end, a piece of its one long line, cut as [`copy::cut_at`] cuts;
/// `None`: nothing yet (a line still being written).
pub(crate) fn split_shown(bytes: &[u8]) -> Option<Shown<'_>> {
    match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => Some(Shown {
            text: &bytes[..end],
            consumed: end + 1,
            whole_lines: true,
        }),
        None if bytes.len() as u64 >= FOLLOW_CHUNK => {
            let cut = copy::cut_at(bytes, bytes.len() - 1);
            Some(Shown {
                text: &bytes[..cut],
                consumed: cut,
                whole_lines: false,
            })
        }
        None => None,
    }
}

#[cfg(test)]
mod tests;
