//! The values that cross the journal's boundary: a delivery coming in, and rows going out.

use rm_vocab::{JobId, JobState, RunnerId, Source, UnixMs};
use serde::Serialize;

/// A verified delivery on its way into the journal.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// `X-GitHub-Delivery`.
    pub guid: String,
    /// `X-GitHub-Event`.
    pub event: String,
    /// The headers worth keeping (event, delivery, hook ids, signature, user agent), by name.
    pub headers: Vec<(String, String)>,
    /// The exact body bytes.
    pub body: Vec<u8>,
    pub received_at_ms: UnixMs,
    pub source: Source,
}

impl Incoming {
    /// The delivery as its event's handler reads it ([`rm_handlers::judge`]).
    pub fn delivery(&self) -> rm_handlers::Delivery<'_> {
        rm_handlers::Delivery {
            guid: &self.guid,
            event: &self.event,
            body: &self.body,
            received_at_ms: self.received_at_ms,
            source: self.source,
        }
    }
}

/// What became of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Its changes were applied (or it needed none, as a `ping`).
    Applied,
    /// It was authentic and new, but the journal already held everything it said (a re-sent old
    /// `completed`, a `queued` after the job started).
    Duplicate,
    /// An event or action rm does not use.
    Ignored,
    /// A handler could not read it; its body is kept so `deliveries replay` can apply it later.
    Rejected,
    /// Authentic, but its own dates put it past GitHub's queue lifetime (an old body posted
    /// again under a fresh GUID): it changed nothing and is never demand.
    Stale,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::Ignored => "ignored",
            Self::Rejected => "rejected",
            Self::Stale => "stale",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        [
            Self::Applied,
            Self::Duplicate,
            Self::Ignored,
            Self::Rejected,
            Self::Stale,
        ]
        .into_iter()
        .find(|o| o.as_str() == name)
    }
}

/// The answer to recording a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The delivery is new and is now committed with this outcome.
    New(Outcome),
    /// A delivery with this GUID was already committed (GitHub's redeliveries reuse it).
    AlreadyJournalled,
}

/// A journalled `workflow_job`, as `rm-agent jobs --json` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub job_id: JobId,
    pub run_id: i64,
    pub run_attempt: i64,
    pub repository: String,
    pub installation_id: Option<i64>,
    pub labels: Vec<String>,
    pub state: JobState,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
    pub runner_id: Option<RunnerId>,
    pub workflow_name: Option<String>,
    pub job_name: Option<String>,
    pub source: String,
    pub first_seen_at_ms: UnixMs,
    pub updated_at_ms: UnixMs,
}

/// A job state as stored. The schema's CHECK constraint admits only the four states; anything
/// else reads as `completed`, which is never demand and is never revived.
pub(crate) fn stored_job_state(name: &str) -> JobState {
    JobState::parse(name).unwrap_or(JobState::Completed)
}

/// A journalled delivery without its body, as `rm-agent deliveries --json` prints it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRow {
    pub guid: String,
    pub event: String,
    pub action: Option<String>,
    pub source: String,
    pub received_at_ms: UnixMs,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub replayed_at_ms: Option<UnixMs>,
    pub body_kept: bool,
}

/// A delivery with its headers and body, for a replay.
#[derive(Debug, Clone)]
pub struct StoredDelivery {
    pub row: DeliveryRow,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

/// An App installation and the repositories in its scope.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallationRow {
    pub id: i64,
    pub account: Option<String>,
    pub account_type: Option<String>,
    pub repository_selection: Option<String>,
    pub suspended: bool,
    pub removed: bool,
    pub repositories: Vec<String>,
}
