//! The disk watch, part of supervision: each live runner's runtime measured every
//! [`DISK_CHECK_INTERVAL`] against its policy's `disk_max` ([`rm_runner::disk`]). A walk of a
//! runtime is blocking and may take seconds on a large (or hostile) tree, so the control loop
//! never waits for one: it starts a walk on the blocking pool and goes on, and a later pass takes
//! the result. One walk at a time, so the walks' open directories stay within
//! [`rm_runner::disk::MAX_OPEN_DIRS`] and their CPU within one thread.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use rm_journal::AttemptId;
use rm_vocab::UnixMs;
use tokio::sync::oneshot;

use crate::lifecycle::DiskUse;
use rm_runner::disk::{self, DISK_CHECK_INTERVAL, Measured};

/// One walk on the blocking pool.
struct Walking {
    attempt: AttemptId,
    started_ms: UnixMs,
    result: oneshot::Receiver<std::io::Result<Measured>>,
}

/// What the watch knows; owned by [`super::supervise::Supervisor`].
#[derive(Default)]
pub(super) struct DiskWatch {
    /// The last finished measurement of each attempt, with when its walk started.
    measured: HashMap<AttemptId, (UnixMs, Measured)>,
    /// When each watched attempt's last walk started, finished or not.
    last_walk: HashMap<AttemptId, UnixMs>,
    walking: Option<Walking>,
}

/// A live runner the watch may measure.
pub(super) struct Watched {
    pub(super) attempt: AttemptId,
    pub(super) runtime_dir: PathBuf,
    pub(super) disk_max: u64,
}

impl DiskWatch {
    /// Takes the result of a walk that finished since the last pass, without waiting.
    pub(super) fn collect(&mut self) {
        let Some(walking) = &mut self.walking else {
            return;
        };
        match walking.result.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => {}
            Err(oneshot::error::TryRecvError::Closed) => self.walking = None,
            Ok(result) => {
                match result {
                    Ok(measured) => {
                        self.measured
                            .insert(walking.attempt.clone(), (walking.started_ms, measured));
                    }
                    Err(e) => tracing::warn!(
                        attempt = %walking.attempt,
                        error = %e,
                        "cannot measure the runner's runtime; measured again later"
                    ),
                }
                self.walking = None;
            }
        }
    }

    /// What the last measurement says of `attempt` against `disk_max`.
    pub(super) fn judge(&self, attempt: &AttemptId, disk_max: Option<u64>) -> DiskUse {
        disk::judge(self.measured.get(attempt).map(|(_, m)| *m), disk_max)
    }

    /// The last measurement of `attempt`, for the log and the attempt's detail.
    pub(super) fn last(&self, attempt: &AttemptId) -> Option<Measured> {
        self.measured.get(attempt).map(|(_, m)| *m)
    }

    /// Forgets attempts no longer watched, and starts a walk of the one measured longest ago
    /// if none is running and it is due.
    pub(super) fn schedule(&mut self, live: Vec<Watched>, now_ms: UnixMs) {
        let ids: HashSet<&AttemptId> = live.iter().map(|w| &w.attempt).collect();
        self.measured.retain(|id, _| ids.contains(id));
        self.last_walk.retain(|id, _| ids.contains(id));
        if self.walking.is_some() {
            return;
        }
        let Some(next) = due(
            live.iter()
                .map(|w| (&w.attempt, self.last_walk.get(&w.attempt).copied())),
            now_ms,
        )
        .cloned() else {
            return;
        };
        let Some(watched) = live.into_iter().find(|w| w.attempt == next) else {
            return;
        };
        let (tx, rx) = oneshot::channel();
        let (dir, max) = (watched.runtime_dir, watched.disk_max);
        // Detached: a walk still running when the agent stops ends with the process.
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(disk::measure(&dir, max));
        });
        self.last_walk.insert(watched.attempt.clone(), now_ms);
        self.walking = Some(Walking {
            attempt: watched.attempt,
            started_ms: now_ms,
            result: rx,
        });
    }
}

/// Which attempt to measure next: never measured first, then the one measured longest ago, once
/// [`DISK_CHECK_INTERVAL`] has passed since its last walk. Pure.
fn due<'a>(
    candidates: impl Iterator<Item = (&'a AttemptId, Option<UnixMs>)>,
    now_ms: UnixMs,
) -> Option<&'a AttemptId> {
    let interval = rm_vocab::millis(DISK_CHECK_INTERVAL);
    candidates
        .filter(|(_, last)| last.is_none_or(|at| now_ms.saturating_sub(at) >= interval))
        .min_by_key(|(_, last)| last.unwrap_or(UnixMs::new(i64::MIN)))
        .map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_measured_longest_ago_goes_first_once_due() {
        let (a, b, c) = (
            AttemptId::generate(),
            AttemptId::generate(),
            AttemptId::generate(),
        );
        let interval = rm_vocab::millis(DISK_CHECK_INTERVAL);
        let now = 1_000_000;
        let ago = |ms: i64| Some(UnixMs::new(now - ms));
        for (candidates, expected) in [
            // Never measured beats everything.
            (vec![(&a, ago(10 * interval)), (&b, None)], Some(&b)),
            // Then the oldest walk.
            (vec![(&a, ago(interval)), (&b, ago(2 * interval))], Some(&b)),
            // Not due yet: nothing.
            (vec![(&a, ago(interval - 1))], None),
            (vec![(&a, ago(interval - 1)), (&c, ago(interval))], Some(&c)),
            (vec![], None),
        ] {
            assert_eq!(due(candidates.into_iter(), UnixMs::new(now)), expected);
        }
    }
}
