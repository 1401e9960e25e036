//! The ids that cross crates: GitHub's `workflow_job` id ([`JobId`]) and self-hosted runner id
//! ([`RunnerId`]). The handlers read them from deliveries, the journal keeps them, rm-github reads
//! them from REST answers and the agent plans, launches and explains with them; one type each, so
//! a job id cannot be passed where a runner id is wanted.
//!
//! Both hold the journal's representation, a signed 64-bit integer (SQLite's `INTEGER`,
//! PostgreSQL's `BIGINT`). They print, and serialize, as that plain number: JSON output and log
//! lines are what they were before the types. GitHub documents its ids as unsigned: a `u64` becomes
//! one through `TryFrom<u64>`, which fails for an id past `i64::MAX` instead of clamping it, and
//! JSON (a delivery, a REST answer) is read as an `i64`, which fails to decode such an id the same
//! way. With the `rusqlite` feature (the journal's) they bind and read as SQLite integers; the
//! PostgreSQL code binds `id.get()` and reads `JobId::new(row.get(i))` at its edge.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(i64);

        impl $name {
            /// The id with this number (as the journal stores it).
            pub const fn new(id: i64) -> Self {
                Self(id)
            }

            /// The number, as the journal stores it.
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        /// The plain number, as `{:?}` of an `i64` printed it.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        /// GitHub's unsigned id: fails for one the journal cannot hold.
        impl TryFrom<u64> for $name {
            type Error = IdOutOfRange;

            fn try_from(id: u64) -> Result<Self, IdOutOfRange> {
                i64::try_from(id).map(Self).map_err(|_| IdOutOfRange { what: $what, id })
            }
        }

        /// GitHub's unsigned form, for its REST paths: fails for a negative id.
        impl TryFrom<$name> for u64 {
            type Error = std::num::TryFromIntError;

            fn try_from(id: $name) -> Result<u64, Self::Error> {
                u64::try_from(id.0)
            }
        }

        #[cfg(feature = "rusqlite")]
        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                self.0.to_sql()
            }
        }

        #[cfg(feature = "rusqlite")]
        impl rusqlite::types::FromSql for $name {
            fn column_result(
                value: rusqlite::types::ValueRef<'_>,
            ) -> rusqlite::types::FromSqlResult<Self> {
                i64::column_result(value).map(Self)
            }
        }
    };
}

id_type!(
    /// A `workflow_job`'s id (`workflow_job.id`, the journal's `jobs.job_id`).
    JobId,
    "job"
);

id_type!(
    /// A self-hosted runner's id as GitHub assigns it (`runner.id`, a job's `runner_id`).
    RunnerId,
    "runner"
);

/// A GitHub id too large for the journal's signed 64-bit integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdOutOfRange {
    what: &'static str,
    id: u64,
}

impl fmt::Display for IdOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GitHub {} id {} does not fit the journal's 64-bit signed integer",
            self.what, self.id
        )
    }
}

impl std::error::Error for IdOutOfRange {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_serialize_as_plain_numbers() {
        let job = JobId::new(42);
        assert_eq!(job.to_string(), "42");
        assert_eq!(format!("{job:?}"), "42");
        assert_eq!(serde_json::to_string(&job).ok().as_deref(), Some("42"));
        assert_eq!(
            serde_json::from_str::<RunnerId>("7").ok(),
            Some(RunnerId::new(7))
        );
    }

    #[test]
    fn a_github_id_past_i64_max_is_refused_not_clamped() {
        assert_eq!(RunnerId::try_from(5_u64), Ok(RunnerId::new(5)));
        let past = u64::try_from(i64::MAX).map_or(0, |max| max + 1);
        assert!(RunnerId::try_from(past).is_err());
        assert!(JobId::try_from(u64::MAX).is_err());
        assert!(u64::try_from(JobId::new(-1)).is_err());
    }
}
