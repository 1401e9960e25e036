//! Captures the log lines a test's own thread emits, for tests that check what a log line says
//! (its span's context, that no secret is in it). Shared by several crates' tests through
//! `#[path]`, like `skip.rs`.

use std::sync::{Arc, Mutex};

/// This thread's log lines, as text, from `start` until dropped.
pub(crate) struct LogCapture {
    buffer: Buffer,
    _second: tracing::Dispatch,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogCapture {
    /// Captures events (and spans) at `level` and above, without colour. A test that runs
    /// its server on a current-thread runtime captures the server's lines too.
    pub(crate) fn start(level: tracing::Level) -> LogCapture {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        // With a single registered dispatcher, tracing caches each callsite's interest from
        // the thread-local default of whichever test thread reaches it first (none, on another
        // test's thread: "never"). A second, idle dispatcher makes every callsite ask each one
        // at each use.
        let second = tracing::Dispatch::new(tracing_subscriber::registry());
        let guard = tracing::subscriber::set_default(subscriber);
        LogCapture {
            buffer,
            _second: second,
            _guard: guard,
        }
    }

    /// Everything captured so far.
    pub(crate) fn text(&self) -> String {
        let bytes = self
            .buffer
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
