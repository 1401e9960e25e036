//! The forward-only life of a `workflow_job` row, as a pure merge of what the journal holds with
//! a new sighting. GitHub sends job events out of order and more than once (an `in_progress`
//! before its `queued`, a re-sent old `completed`), so a row only ever moves to a later state.

/// A `workflow_job`'s state, in the order a job moves through them.
///
/// `waiting` (an environment's protection rules hold the job) comes before `queued`: GitHub
/// queues the job only once the environment lets it go, and only `queued` is demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JobState {
    Waiting,
    Queued,
    InProgress,
    Completed,
}

impl JobState {
    /// Every state, in order.
    pub const ALL: [JobState; 4] = [
        JobState::Waiting,
        JobState::Queued,
        JobState::InProgress,
        JobState::Completed,
    ];

    /// The name GitHub uses as the delivery's `action`, and the journal uses as the state.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Queued => "queued",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
        }
    }

    /// The inverse of [`JobState::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The state's position in a job's life; the journal compares ranks so a row never moves
    /// backwards even when two writers race.
    pub fn rank(self) -> i64 {
        self as i64
    }
}

/// What merging a sighting into the journal's row does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobMerge {
    /// The journal has no row for this job: insert it.
    Insert,
    /// The sighting is later than the row: move the row forward.
    Advance,
    /// The row is already at this state or later: nothing changes.
    Stale,
}

/// Decides what a sighting in state `seen` does to a row currently in `current`.
pub fn merge_job(current: Option<JobState>, seen: JobState) -> JobMerge {
    match current {
        None => JobMerge::Insert,
        Some(current) if seen > current => JobMerge::Advance,
        Some(_) => JobMerge::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_only_move_forward() {
        for current in JobState::ALL {
            for seen in JobState::ALL {
                let expected = if seen > current {
                    JobMerge::Advance
                } else {
                    JobMerge::Stale
                };
                assert_eq!(
                    merge_job(Some(current), seen),
                    expected,
                    "{current:?} <- {seen:?}"
                );
            }
        }
    }

    #[test]
    fn any_first_sighting_inserts() {
        for seen in JobState::ALL {
            assert_eq!(merge_job(None, seen), JobMerge::Insert);
        }
    }

    #[test]
    fn names_round_trip_and_ranks_follow_the_life_of_a_job() {
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
        }
        assert!(JobState::Waiting.rank() < JobState::Queued.rank());
        assert!(JobState::Queued.rank() < JobState::InProgress.rank());
        assert!(JobState::InProgress.rank() < JobState::Completed.rank());
        assert_eq!(JobState::parse("requested"), None);
    }
}
