//! The intake's queue to a writer thread, the same for both dialects: a caller sends its
//! judged delivery (or a probe) with a one-shot reply, and the writer takes every request that
//! queued while its previous commit was in flight, up to [`MAX_BATCH`], as one group. What a
//! writer does with a group (SQLite's commit and flush, PostgreSQL's commit and retries) is its
//! own; the queue, the group's size and the caller's side are here, once.

use std::sync::mpsc;

use rm_handlers::Verdict;
use tokio::sync::oneshot;

use crate::judged::{Judged, Stored};
use crate::{Incoming, JournalError, Recorded};

/// The most deliveries one transaction takes. Bounds the time any one commit holds its callers.
pub(crate) const MAX_BATCH: usize = 1024;

/// Where a delivery's caller waits for its answer.
pub(crate) type Reply = oneshot::Sender<Result<Recorded, JournalError>>;

#[expect(
    clippy::large_enum_variant,
    reason = "nearly every request is a Record; boxing it would add an allocation per delivery"
)]
pub(crate) enum Request {
    Record {
        incoming: Incoming,
        verdict: Verdict,
        /// The body and headers as stored, encoded by the caller.
        stored: Stored,
        reply: Reply,
    },
    /// Proves the writer is alive and can write (`/healthz`).
    Probe(oneshot::Sender<Result<(), JournalError>>),
}

/// The callers' end of a writer's queue. Cloning shares it; the writer stops when the last
/// clone is dropped, after answering everything queued.
#[derive(Clone)]
pub(crate) struct Queue {
    tx: mpsc::Sender<Request>,
}

impl Queue {
    /// A queue and the writer's end of it.
    pub(crate) fn new() -> (Queue, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel();
        (Queue { tx }, rx)
    }

    /// Sends a judged delivery to the writer; answers after the commit that holds it.
    pub(crate) async fn record(&self, judged: Judged) -> Result<Recorded, JournalError> {
        let Judged {
            incoming,
            verdict,
            stored,
        } = judged;
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request::Record {
                incoming,
                verdict,
                stored,
                reply,
            })
            .map_err(|_| JournalError::WriterStopped)?;
        answer.await.map_err(|_| JournalError::WriterStopped)?
    }

    /// Asks the writer to prove it can write; answers after that commit.
    pub(crate) async fn probe(&self) -> Result<(), JournalError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request::Probe(reply))
            .map_err(|_| JournalError::WriterStopped)?;
        answer.await.map_err(|_| JournalError::WriterStopped)?
    }
}

/// The group that starts with `first`: it and every request already queued behind it, up to
/// [`MAX_BATCH`]. Never waits.
pub(crate) fn group(first: Request, rx: &mpsc::Receiver<Request>) -> Vec<Request> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(request) => batch.push(request),
            Err(_) => break,
        }
    }
    batch
}
