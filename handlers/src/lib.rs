//! rm-handlers: the serverless-style handlers. Each event module is a pure function from a
//! delivery (its event name, its exact body and the time it arrived) to the changes the journal
//! applies in the same transaction that records the delivery. No I/O and no clock live here, so
//! every rule about duplicate and out-of-order deliveries is a unit test.
//!
//! [`handle`] is the only entry point: it looks the event up in [`HANDLERS`], and events without
//! a handler are `ignored`. A body a handler cannot read is `rejected` with the reason; the
//! journal keeps it so it can be replayed after a fix. A body whose own dates put it past
//! anything GitHub would still act on is `stale` and changes nothing.
//!
//! The words they speak (ids, job states, sources, the instant `UnixMs`) are `rm-vocab`'s, which
//! every other crate imports directly: this crate is only the handlers.

mod change;
mod installation;
mod installation_repositories;
mod ping;
mod workflow_job;

pub use change::{Change, Installation, JobObservation, Repository};
pub use workflow_job::QUEUE_LIFETIME_MS;

// The vocabulary the handlers speak, from its own crate (not re-exported: other crates import
// `rm_vocab` themselves).
use rm_vocab::{Source, UnixMs};

use serde::Deserialize;

/// One webhook delivery as a handler sees it.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// `X-GitHub-Delivery`.
    pub guid: &'a str,
    /// `X-GitHub-Event`.
    pub event: &'a str,
    /// The exact body bytes GitHub signed.
    pub body: &'a [u8],
    /// When the delivery arrived (handlers have no clock).
    pub received_at_ms: UnixMs,
    /// How it arrived.
    pub source: Source,
}

/// What a handler decided about one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Changes to apply (possibly none, as for `ping`), with a note for the journal.
    Apply {
        action: Option<String>,
        changes: Vec<Change>,
        note: Option<String>,
    },
    /// An event or action rm does not use. Journalled, nothing changes.
    Ignore {
        action: Option<String>,
        reason: String,
    },
    /// A body the handler could not read. Journalled with its body for a later replay.
    Reject {
        action: Option<String>,
        reason: String,
    },
    /// An authentic body whose own dates say it is older than anything GitHub would still act
    /// on (a replay under a fresh GUID, a very late re-send). Journalled, nothing changes.
    Stale {
        action: Option<String>,
        reason: String,
    },
}

impl Verdict {
    /// The delivery's `action` field, when it had one.
    pub fn action(&self) -> Option<&str> {
        match self {
            Self::Apply { action, .. }
            | Self::Ignore { action, .. }
            | Self::Reject { action, .. }
            | Self::Stale { action, .. } => action.as_deref(),
        }
    }
}

/// A handler: a pure function from a delivery to a verdict.
pub type Handler = fn(&Delivery<'_>) -> Verdict;

/// The table that maps event names to handlers. Every other event is ignored.
pub const HANDLERS: &[(&str, Handler)] = &[
    ("workflow_job", workflow_job::handle),
    ("ping", ping::handle),
    ("installation", installation::handle),
    (
        "installation_repositories",
        installation_repositories::handle,
    ),
];

/// [`handle`], where a handler that panics does not lose the delivery: the panic is its
/// verdict, a rejection saying so, so the delivery is journalled and can be replayed once the
/// handler is fixed. What every intake and every replay runs.
pub fn judge(delivery: &Delivery<'_>) -> Verdict {
    judge_with(handle, delivery)
}

/// [`judge`] with `handler` in place of the table's (the tests' panicking handler).
fn judge_with(
    handler: impl FnOnce(&Delivery<'_>) -> Verdict + std::panic::UnwindSafe,
    delivery: &Delivery<'_>,
) -> Verdict {
    std::panic::catch_unwind(|| handler(delivery)).unwrap_or_else(|_| Verdict::Reject {
        action: None,
        reason: format!(
            "the `{}` handler panicked; replay after upgrading",
            delivery.event
        ),
    })
}

/// Runs the handler for the delivery's event, or ignores an event rm has no handler for. An
/// `Apply`, `Ignore` or `Stale` verdict means the whole body was read as JSON; a `Reject` may be for a
/// body that is not JSON at all ([`is_json`] tells).
pub fn handle(delivery: &Delivery<'_>) -> Verdict {
    match HANDLERS.iter().find(|(event, _)| *event == delivery.event) {
        Some((_, handler)) => handler(delivery),
        // Ignored events are still read whole, so that what is journalled is JSON.
        None => match action_of_json(delivery.body) {
            Ok(action) => Verdict::Ignore {
                action,
                reason: format!("no handler for event `{}`", delivery.event),
            },
            Err(err) => Verdict::Reject {
                action: None,
                reason: format!("unreadable payload: {err}"),
            },
        },
    }
}

/// The top-level `action` of a body, when it is JSON that has one as a string.
fn action_of(body: &[u8]) -> Option<String> {
    action_of_json(body).ok().flatten()
}

/// Reads a whole body as JSON for its top-level `action`: an error means it is not JSON.
fn action_of_json(body: &[u8]) -> serde_json::Result<Option<String>> {
    #[derive(Deserialize)]
    struct ActionOnly {
        action: Option<serde_json::Value>,
    }
    serde_json::from_slice::<ActionOnly>(body)
        .map(|a| a.action.and_then(|v| v.as_str().map(str::to_owned)))
}

/// Whether `body` is one JSON document. Only needed when a handler rejected a body: a verdict of
/// `Apply`, `Ignore` or `Stale` means the whole body was parsed, so it is JSON.
pub fn is_json(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// Parses a body into a handler's payload type, turning a serde error into a rejection that
/// names the field that was wrong.
fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, Verdict> {
    serde_json::from_slice(body).map_err(|err| Verdict::Reject {
        action: action_of(body),
        reason: format!("unreadable payload: {err}"),
    })
}

/// The verdict for an action a handler does not act on.
fn ignore_action(event: &str, action: String) -> Verdict {
    Verdict::Ignore {
        reason: format!("`{event}` action `{action}` is not used"),
        action: Some(action),
    }
}

#[cfg(test)]
mod tests;
