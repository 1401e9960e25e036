//! The scale-set record's vocabulary: what a message from GitHub's queue carries (statistics,
//! job events), the job states it moves jobs through and the pure rule that moves them, and the
//! rows the reads return. Nothing here touches SQLite but the state's column conversion.

use rm_vocab::UnixMs;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::{Deserialize, Serialize};

/// A scale set's counters as GitHub's queue reports them (`statistics` on a message or a
/// session): jobs by where they are, runners by what they do.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ScaleSetStatistics {
    /// `totalAvailableJobs`: waiting to be acquired (GHES's acquire flow).
    pub available: i64,
    /// `totalAcquiredJobs`.
    pub acquired: i64,
    /// `totalAssignedJobs`: assigned to this scale set, waiting for a runner.
    pub assigned: i64,
    /// `totalRunningJobs`.
    pub running: i64,
    /// `totalRegisteredRunners`.
    pub registered: i64,
    /// `totalBusyRunners`.
    pub busy: i64,
    /// `totalIdleRunners`.
    pub idle: i64,
}

/// One job message from a message's `body` array, as the listener decoded it. Kept as text so
/// an event kind this build does not know is journalled rather than refused.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobEvent {
    /// `messageType`: `JobAvailable`, `JobAssigned`, `JobStarted`, `JobCompleted`, or anything
    /// else GitHub sends, kept as it came.
    pub kind: String,
    /// `jobId`: the key of a job's record (GitHub's `runnerRequestId` may be 0, garm #459).
    pub job_id: String,
    /// `runnerRequestId`, kept for acquisition.
    pub runner_request_id: i64,
    /// `owner/name`; may be empty.
    pub repository: String,
    pub workflow_run_id: Option<i64>,
    /// `jobDisplayName`.
    pub display_name: String,
    /// `requestLabels`.
    pub labels: Vec<String>,
    /// On `JobStarted` and `JobCompleted`: the runner that took the job.
    pub runner_name: Option<String>,
    /// On `JobCompleted`: `succeeded`, `failed`, `canceled`, ...
    pub result: Option<String>,
}

/// One message from a scale set's queue, as the listener hands it to the journal before it
/// acknowledges it. The queue's access token never comes here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingMessage {
    /// `messageId`: with the scale set, what recognises a redelivery.
    pub message_id: i64,
    /// `None` when GitHub sent `null`: the last known statistics stay.
    pub statistics: Option<ScaleSetStatistics>,
    pub events: Vec<JobEvent>,
    /// A top-level `messageType` the listener did not understand: the message is journalled and
    /// counted, nothing in it is applied.
    pub unknown_type: Option<String>,
    pub received_at: UnixMs,
}

/// What [`crate::ScaleSets::record_message`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageRecorded {
    /// The message is new and is now committed with everything it changed.
    New,
    /// This scale set's message with this id was already committed (a redelivery after a crash
    /// or a lost acknowledgement): nothing changed; acknowledge it again.
    AlreadyJournalled,
}

/// Where a scale-set job is, by the events seen for it. Ordered by rank: a job only moves
/// forward, so events arriving out of order never move it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScaleSetJobState {
    /// `JobAvailable`: waiting to be acquired (GHES). Also where a job first seen through an
    /// event kind this build does not know is put: it exists, nothing more is known.
    Available,
    /// `JobAssigned`: assigned to this scale set, waiting for a runner.
    Assigned,
    /// `JobStarted`: a runner took it.
    Started,
    /// `JobCompleted`: finished, with a result.
    Completed,
}

impl ScaleSetJobState {
    pub const ALL: [ScaleSetJobState; 4] = [
        ScaleSetJobState::Available,
        ScaleSetJobState::Assigned,
        ScaleSetJobState::Started,
        ScaleSetJobState::Completed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ScaleSetJobState::Available => "available",
            ScaleSetJobState::Assigned => "assigned",
            ScaleSetJobState::Started => "started",
            ScaleSetJobState::Completed => "completed",
        }
    }

    pub fn parse(name: &str) -> Option<ScaleSetJobState> {
        ScaleSetJobState::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    /// The state an event of this `messageType` announces; `None` for a kind this build does
    /// not know.
    pub fn of_event(kind: &str) -> Option<ScaleSetJobState> {
        match kind {
            "JobAvailable" => Some(ScaleSetJobState::Available),
            "JobAssigned" => Some(ScaleSetJobState::Assigned),
            "JobStarted" => Some(ScaleSetJobState::Started),
            "JobCompleted" => Some(ScaleSetJobState::Completed),
            _ => None,
        }
    }

    /// Whether an event announcing `event` moves a job now in `current` (`None`: no record
    /// yet). Forward only: a later state wins, an earlier or equal one is kept, except that a
    /// completion always wins, so a second `JobCompleted` (a job cancelled and completed again)
    /// leaves its result and runner. `reassignable`: the job was completed `canceled` before any
    /// runner took it, which is how the service takes back a job no runner started in time;
    /// assigned or started again after that, it moves back (the service's messages come in
    /// order, so a `JobAssigned` after the cancellation is the new assignment, not the old one).
    pub fn moves(
        current: Option<ScaleSetJobState>,
        reassignable: bool,
        event: ScaleSetJobState,
    ) -> bool {
        match current {
            None => true,
            Some(ScaleSetJobState::Completed)
                if reassignable
                    && matches!(
                        event,
                        ScaleSetJobState::Assigned | ScaleSetJobState::Started
                    ) =>
            {
                true
            }
            Some(current) => event > current || event == ScaleSetJobState::Completed,
        }
    }

    /// Whether a job completed with `result` and run by `runner` may be assigned again
    /// ([`ScaleSetJobState::moves`]): cancelled before any runner took it.
    pub fn reassignable(
        state: ScaleSetJobState,
        result: Option<&str>,
        runner: Option<&str>,
    ) -> bool {
        state == ScaleSetJobState::Completed && result == Some("canceled") && runner.is_none()
    }
}

impl ToSql for ScaleSetJobState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for ScaleSetJobState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        ScaleSetJobState::parse(text).ok_or_else(|| {
            FromSqlError::Other(format!("unknown scale-set job state {text:?}").into())
        })
    }
}

/// One job as the scale set's messages described it (`scale_set_jobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSetJobRow {
    pub scale_set: String,
    pub job_id: String,
    pub runner_request_id: i64,
    pub state: ScaleSetJobState,
    pub repository: String,
    pub workflow_run_id: Option<i64>,
    pub display_name: String,
    pub labels: Vec<String>,
    pub runner_name: Option<String>,
    pub result: Option<String>,
    pub first_seen: UnixMs,
    pub updated_at: UnixMs,
    /// The message that last moved it.
    pub message_id: i64,
    /// Why the last event for it that could not be handled was not (an unknown kind).
    pub unhandled: Option<String>,
}

/// One scale set as this host's listener knows it (`scale_sets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSetRecord {
    /// The scale set's name, as configured.
    pub name: String,
    /// GitHub's id; a new one after the scale set was deleted and re-created.
    pub scale_set_id: Option<i64>,
    /// The message session the listener holds, recorded before it is used; `None` once closed.
    pub session_id: Option<String>,
    /// The highest message id journalled since the cursor was last reset: the `lastMessageId`
    /// a poll sends.
    pub last_message_id: i64,
    pub last_message_at: Option<UnixMs>,
    /// The last statistics GitHub sent (a message's `null` keeps them).
    pub statistics: Option<ScaleSetStatistics>,
    pub statistics_at: Option<UnixMs>,
    /// Messages journalled so far, all generations.
    pub messages: i64,
    /// How many times the cursor was reset (the scale set re-created): a message is recognised
    /// as a redelivery only within its generation, since a re-created set numbers anew.
    pub generation: i64,
    /// One sentence for the operator, e.g. "waiting: another listener holds the session".
    pub note: Option<String>,
    pub note_at: Option<UnixMs>,
}
