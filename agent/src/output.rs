//! Output for people (aligned tables) and for scripts (one JSON document on stdout), and what
//! happens when stdout goes away: a reader that closed the pipe (`rm-agent jobs | head -1`)
//! only drops the rest of the output, it never panics the command (`println!` would), and any
//! other write error is remembered for `main` to report once the command is done.

use std::fmt;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

/// Set once stdout cannot be written: every later write is dropped. `None` inside: the reader
/// closed the pipe (nothing to report); `Some`: another error, reported at exit.
static STDOUT_LOST: Mutex<Option<Option<String>>> = Mutex::new(None);

/// Writes to stdout (the `out!`/`outln!` macros call this). After the first failed write,
/// nothing more is written.
pub fn write_stdout(args: fmt::Arguments<'_>) {
    let mut lost = STDOUT_LOST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if lost.is_some() {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(err) = out.write_fmt(args).and_then(|()| out.flush()) {
        *lost = Some(
            (err.kind() != std::io::ErrorKind::BrokenPipe)
                .then(|| format!("cannot write to standard output: {err}")),
        );
    }
}

/// Why output was lost, if it was for a reason other than the reader closing the pipe.
pub fn stdout_error() -> Option<String> {
    STDOUT_LOST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .flatten()
}

/// `print!` that survives a closed stdout (see [`write_stdout`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write_stdout(format_args!($($arg)*)) };
}

/// `println!` that survives a closed stdout (see [`write_stdout`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::output::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// A journal timestamp (ms since the epoch) as RFC 3339 in UTC.
pub fn rfc3339(ms: i64) -> String {
    let since_epoch = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(UNIX_EPOCH + since_epoch).to_string()
}

/// Prints `rows` under `header` with columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        crate::outln!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Prints a value as one JSON document.
pub fn print_json(value: &serde_json::Value) {
    crate::outln!("{value}");
}

/// `-` for an absent value in a table.
pub fn or_dash(value: Option<&str>) -> String {
    value.unwrap_or("-").to_owned()
}
