//! What a job's bytes look like on the operator's terminal (pure). `rm-agent logs` prints files
//! the job's uid wrote; a terminal acts on some bytes instead of showing them (an escape
//! sequence writes the clipboard with OSC 52, moves the cursor, erases a line; a carriage
//! return overwrites what the line showed, a `[redacted ...]` marker included). So every such
//! byte is shown as text, and a line of the job's that starts the way this command's own header
//! lines start is marked, so it cannot pass for one.

use std::fmt::Write as _;

/// How this command's own header lines start (`=== attempt ...`, `--- FILE ...`). A job's
/// line that starts so is printed after a `\`.
pub(crate) const HEADER_STARTS: [&str; 2] = ["===", "---"];

/// Appends `bytes` to `out` as they may be shown on a terminal; `line_start`: `bytes` starts a
/// line. Line ends and tabs are kept; every other C0 control and DEL is shown as `\xNN`; C1
/// controls (U+0080 to U+009F, which some terminals obey as ESC sequences) and the characters
/// that reorder or break what a line shows (bidirectional controls, U+2028, U+2029) as
/// `\u{N}`; a byte that is not UTF-8 as `\xNN`. A line that starts with a [`HEADER_STARTS`]
/// gets a `\` before it. A `\` the job wrote is printed as it is: `\x1b` in the output may
/// be the job's own four characters, never an escape.
pub(crate) fn escape(bytes: &[u8], mut line_start: bool, out: &mut String) {
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        for (at, c) in valid.char_indices() {
            if line_start && HEADER_STARTS.iter().any(|h| valid[at..].starts_with(h)) {
                out.push('\\');
            }
            line_start = c == '\n';
            match c {
                '\n' | '\t' => out.push(c),
                '\0'..='\u{1f}' | '\u{7f}' => push_byte(out, c as u8),
                c if shown_escaped(c) => {
                    let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            push_byte(out, *byte);
            line_start = false;
        }
    }
}

/// `\xNN` for a byte (written out by hand: a sparse file's megabytes of zeros are each one).
fn push_byte(out: &mut String, byte: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_str("\\x");
    out.push(char::from(HEX[usize::from(byte >> 4)]));
    out.push(char::from(HEX[usize::from(byte & 0xf)]));
}

/// The characters past ASCII a terminal acts on or that change how a line reads: C1 controls,
/// the bidirectional marks, embeddings, overrides and isolates, and the line and paragraph
/// separators.
fn shown_escaped(c: char) -> bool {
    matches!(
        c,
        '\u{80}'..='\u{9f}'
            | '\u{61c}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}
