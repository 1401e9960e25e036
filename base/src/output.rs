//! Standard output that a reader may close: a reader that closed the pipe (`rm-agent jobs |
//! head -1`) only drops the rest of the output, it never panics the command (`println!` would),
//! and any other write error is remembered for `main` to report once the command is done.

use std::fmt;
use std::io::Write as _;
use std::sync::{Mutex, PoisonError};

/// Set once stdout cannot be written: every later write is dropped. `None` inside: the reader
/// closed the pipe (nothing to report); `Some`: another error, reported at exit.
static STDOUT_LOST: Mutex<Option<Option<String>>> = Mutex::new(None);

/// Writes to stdout (the `out!`/`outln!` macros call this). After the first failed write,
/// nothing more is written.
pub fn write_stdout(args: fmt::Arguments<'_>) {
    let mut lost = STDOUT_LOST.lock().unwrap_or_else(PoisonError::into_inner);
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
        .unwrap_or_else(PoisonError::into_inner)
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
