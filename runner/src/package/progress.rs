//! Download progress: a bar with bytes, total and rate when stderr is a terminal, and sparse
//! `info` lines otherwise, so a service's log shows the download moving without a line per
//! chunk. When to write a line is [`log_due`], a pure function.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

/// With a known total, a line each time the download crosses another tenth of it.
pub(crate) const LOG_STEP_PERCENT: u64 = 10;
/// With a known total, a line at least this often even when a tenth takes longer (a slow link
/// still shows it is alive).
pub(crate) const LOG_HEARTBEAT: Duration = Duration::from_secs(30);
/// Without a total, a line this often.
pub(crate) const LOG_INTERVAL_UNKNOWN_TOTAL: Duration = Duration::from_secs(5);

/// Where the download loop reports. The loop calls [`Progress::begin`] once, then
/// [`Progress::advance`] with the bytes received so far after each chunk, then
/// [`Progress::finish`] once, whether the download succeeded or not.
pub trait Progress: Send {
    fn begin(&mut self, total: Option<u64>);
    fn advance(&mut self, done: u64);
    fn finish(&mut self);
}

/// The last line written: at which step (tenths done) and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    pub step: u64,
    pub at: Duration,
}

/// How many [`LOG_STEP_PERCENT`] steps of `total` `done` is.
fn step(done: u64, total: u64) -> u64 {
    if total == 0 {
        return 100 / LOG_STEP_PERCENT;
    }
    (u128::from(done.min(total)) * 100 / u128::from(total) / u128::from(LOG_STEP_PERCENT)) as u64
}

/// Whether to write a line now, `elapsed` after the download began, with `done` of `total`
/// bytes received, given the last line written (none yet: the first chunk is not logged, the
/// start line is the caller's).
pub(crate) fn log_due(
    last: Option<Logged>,
    done: u64,
    total: Option<u64>,
    elapsed: Duration,
) -> bool {
    let last = last.unwrap_or(Logged {
        step: 0,
        at: Duration::ZERO,
    });
    let since = elapsed.saturating_sub(last.at);
    match total {
        Some(total) => step(done, total) > last.step || since >= LOG_HEARTBEAT,
        None => since >= LOG_INTERVAL_UNKNOWN_TOTAL,
    }
}

/// Log lines for a service's journal.
pub(crate) struct LogProgress {
    what: String,
    started: Instant,
    total: Option<u64>,
    last: Option<Logged>,
}

impl LogProgress {
    pub(crate) fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            started: Instant::now(),
            total: None,
            last: None,
        }
    }
}

impl Progress for LogProgress {
    fn begin(&mut self, total: Option<u64>) {
        self.started = Instant::now();
        self.total = total;
        self.last = None;
        match total {
            Some(total) => {
                tracing::info!(package = %self.what, total_bytes = total, "downloading the runner package")
            }
            None => {
                tracing::info!(package = %self.what, "downloading the runner package (size not announced)")
            }
        }
    }

    fn advance(&mut self, done: u64) {
        let elapsed = self.started.elapsed();
        if !log_due(self.last, done, self.total, elapsed) {
            return;
        }
        self.last = Some(Logged {
            step: self.total.map_or(0, |t| step(done, t)),
            at: elapsed,
        });
        let rate = done as f64 / elapsed.as_secs_f64().max(0.001) / (1024.0 * 1024.0);
        match self.total {
            Some(total) => tracing::info!(
                package = %self.what,
                done_bytes = done,
                total_bytes = total,
                percent = u128::from(done.min(total)) * 100 / u128::from(total.max(1)),
                mib_per_s = format!("{rate:.1}"),
                "downloading the runner package"
            ),
            None => tracing::info!(
                package = %self.what,
                done_bytes = done,
                mib_per_s = format!("{rate:.1}"),
                "downloading the runner package"
            ),
        }
    }

    fn finish(&mut self) {}
}

/// An indicatif bar on stderr (bytes, total, rate, time left).
pub(crate) struct BarProgress {
    bar: indicatif::ProgressBar,
    what: String,
}

impl BarProgress {
    pub(crate) fn new(what: impl Into<String>) -> Self {
        Self {
            bar: indicatif::ProgressBar::hidden(),
            what: what.into(),
        }
    }
}

/// The bar's layout; a constant template, so parsing it cannot fail at run time in practice,
/// and if it did the default bar is used.
const BAR_TEMPLATE: &str =
    "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}";

impl Progress for BarProgress {
    fn begin(&mut self, total: Option<u64>) {
        let bar = match total {
            Some(total) => indicatif::ProgressBar::new(total),
            None => indicatif::ProgressBar::no_length(),
        };
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(BAR_TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(self.what.clone());
        self.bar = bar;
    }

    fn advance(&mut self, done: u64) {
        self.bar.set_position(done);
    }

    fn finish(&mut self) {
        // The full bar stays on screen: what was fetched, how big, how fast.
        self.bar.finish();
    }
}

/// A bar when stderr is a terminal (someone is watching), log lines otherwise.
pub fn for_stderr(what: &str) -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(BarProgress::new(what))
    } else {
        Box::new(LogProgress::new(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Replays a download (bytes done at each second) through [`log_due`] the way
    /// [`LogProgress`] does and returns the seconds at which a line was written.
    fn lines(total: Option<u64>, samples: &[(u64, u64)]) -> Vec<u64> {
        let mut last = None;
        let mut at = Vec::new();
        for &(secs, done) in samples {
            let elapsed = S * u32::try_from(secs).unwrap();
            if log_due(last, done, total, elapsed) {
                last = Some(Logged {
                    step: total.map_or(0, |t| step(done, t)),
                    at: elapsed,
                });
                at.push(secs);
            }
        }
        at
    }

    #[test]
    fn a_known_total_is_logged_once_per_tenth() {
        // 1000 bytes, 10 bytes a second for 100 s, sampled every second: 10 lines, at each 10 %.
        let samples: Vec<(u64, u64)> = (1..=100).map(|s| (s, s * 10)).collect();
        assert_eq!(
            lines(Some(1000), &samples),
            vec![10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
        );
    }

    #[test]
    fn a_fast_download_never_writes_more_than_one_line_per_tenth() {
        // Many small chunks within one second: still at most one line per tenth.
        let samples: Vec<(u64, u64)> = (1..=1000).map(|i| (0, i)).collect();
        assert_eq!(lines(Some(1000), &samples).len(), 10);
    }

    #[test]
    fn a_slow_download_still_logs_every_heartbeat() {
        // 1 % a minute: a tenth takes ten minutes, a line every 30 s anyway.
        let samples: Vec<(u64, u64)> = (1..=120).map(|s| (s, s / 60)).collect();
        assert_eq!(lines(Some(100), &samples), vec![30, 60, 90, 120]);
    }

    #[test]
    fn an_unknown_total_is_logged_every_few_seconds() {
        let samples: Vec<(u64, u64)> = (1..=20).map(|s| (s, s * 1_000_000)).collect();
        assert_eq!(lines(None, &samples), vec![5, 10, 15, 20]);
    }

    #[test]
    fn steps_never_overflow_or_pass_the_end() {
        assert_eq!(step(u64::MAX, u64::MAX), 10);
        assert_eq!(step(2000, 1000), 10, "more than announced counts as done");
        assert_eq!(step(0, 0), 10);
        assert_eq!(step(99, 1000), 0);
    }
}
