//! Output for people (aligned tables) and for scripts (one JSON document on stdout). What
//! happens when stdout goes away is [`rm_base::output`]'s: a reader that closed the pipe
//! (`rm-agent jobs | head -1`) only drops the rest of the output, it never panics the command.

pub use rm_base::output::{stdout_error, write_stdout};
// `out!` and `outln!` are rm_base's, re-exported at the crate root (lib.rs).

/// A journal timestamp (ms since the epoch) as RFC 3339 in UTC, to the millisecond: the
/// workspace's one formatter, [`rm_vocab::UnixMs::to_rfc3339`].
pub fn rfc3339(ms: i64) -> String {
    rm_vocab::UnixMs::new(ms).to_rfc3339()
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
