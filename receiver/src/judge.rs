//! Judging a verified delivery before the journal records it ([`Judged::of`]): the event's
//! handler parses the body (`rm_handlers::judge`) and the journal's columns are encoded. Both
//! are CPU work in proportion to the body, which may be up to 25 MiB: a small body (nearly all
//! of GitHub's) is judged on the async worker that received it, where a trip to the blocking
//! pool would cost more than the work; a larger one on the blocking pool, so it never holds a
//! worker, and every other connection on it, for the length of its parse.

use rm_journal::{Incoming, JournalError, Judged};

/// The largest body judged on the async worker that received it: where judging costs about
/// what a trip to the blocking pool does (measured: 22 µs for 16 KiB, 70 µs for 64 KiB, a trip
/// 41 µs; docs/performance.md, "Judging a delivery"). A `workflow_job` delivery is 6 to 12 KiB;
/// an `installation` one naming every repository of a large organisation is the largest
/// GitHub sends this receiver, megabytes.
pub const INLINE_JUDGE_BYTES: usize = 32 * 1024;

/// A delivery judged, and whether that ran on a thread other than the caller's.
pub(crate) struct Judgement {
    pub(crate) judged: Result<Judged, JournalError>,
    /// Measured, not decided: the judging thread was not the one that asked.
    pub(crate) off_worker: bool,
}

/// Judges `incoming`: here when its body is at most [`INLINE_JUDGE_BYTES`], else on the
/// blocking pool. What every intake does before the journal records a delivery (the agent's
/// relay subscription too). A body that is not JSON at all is [`JournalError::NotJson`].
pub async fn judge(incoming: Incoming) -> Result<Judged, JournalError> {
    judge_measured(incoming).await.judged
}

/// [`judge`], saying whether the judgement ran on another thread (the receiver's log line).
pub(crate) async fn judge_measured(incoming: Incoming) -> Judgement {
    let asked_on = std::thread::current().id();
    let inline = incoming.body.len() <= INLINE_JUDGE_BYTES;
    let judge = move || (Judged::of(incoming), std::thread::current().id());
    let (judged, judged_on) = if inline {
        judge()
    } else {
        match tokio::task::spawn_blocking(judge).await {
            Ok(done) => done,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // The runtime is shutting down: nothing was journalled, and the answer says so.
                Err(e) => (
                    Err(JournalError::Commit(format!("not judged: {e}"))),
                    asked_on,
                ),
            },
        }
    };
    Judgement {
        judged,
        off_worker: judged_on != asked_on,
    }
}
