//! The PostgreSQL journal in a build without it (`rm-journal`'s `postgres` feature off, which
//! is `rm-agent` without `fleet`): a single-host build links no PostgreSQL client. The names the
//! agent's configuration and `check` use stay, so they compile the same either way, but none
//! can be made: [`PgTarget::parse`] refuses every connection string with
//! [`PgUrlError::NotBuilt`], and a [`PgTarget`] (an empty type here) is what every other way in
//! needs. So nothing below can run, and the compiler proves it (`match *self {}`).

use std::future::Future;

use secrecy::SecretString;

use super::surface::{PgInspection, PgSslMode, PgUrlError};
use crate::{Intake, JournalError, JournalMetrics, Judged, Recorded};

/// A value no build without PostgreSQL can make.
#[derive(Debug, Clone, Copy)]
enum Unbuilt {}

/// A PostgreSQL journal's connection settings, in a build without PostgreSQL: never made.
#[derive(Debug, Clone)]
pub struct PgTarget(Unbuilt);

impl PgTarget {
    /// Where a use of a target ends: it cannot be reached, as no target exists.
    pub(crate) fn unbuilt(&self) -> ! {
        match self.0 {}
    }

    /// Refuses `url`: this build has no PostgreSQL journal.
    pub fn parse(_url: &str) -> Result<PgTarget, PgUrlError> {
        Err(PgUrlError::NotBuilt)
    }

    pub fn over_tcp(&self) -> bool {
        match self.0 {}
    }

    pub fn loopback_only(&self) -> bool {
        match self.0 {}
    }

    pub fn verifies_server(&self) -> bool {
        match self.0 {}
    }

    pub fn sslmode(&self) -> PgSslMode {
        match self.0 {}
    }

    pub fn with_password(self, _password: SecretString) -> PgTarget {
        match self.0 {}
    }

    pub fn has_password(&self) -> bool {
        match self.0 {}
    }

    pub fn user(&self) -> Option<&str> {
        match self.0 {}
    }

    pub fn describe(&self) -> String {
        match self.0 {}
    }
}

#[cfg(not(feature = "postgres"))]
impl PgInspection {
    pub fn of(target: &PgTarget) -> Result<PgInspection, JournalError> {
        match target.0 {}
    }
}

/// The shared journal's intake, in a build without PostgreSQL: never made.
#[derive(Clone)]
pub struct PgJournal(Unbuilt);

impl PgJournal {
    pub fn job_counts(&self) -> Result<Vec<(String, i64)>, JournalError> {
        match self.0 {}
    }

    pub fn metrics(&self) -> &JournalMetrics {
        match self.0 {}
    }
}

impl Intake for PgJournal {
    fn record_judged(
        &self,
        _judged: Judged,
    ) -> impl Future<Output = Result<Recorded, JournalError>> + Send {
        let never = self.0;
        async move { match never {} }
    }

    fn probe(&self) -> impl Future<Output = Result<(), JournalError>> + Send {
        let never = self.0;
        async move { match never {} }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_connection_string_is_refused_naming_the_feature_that_builds_one() {
        for url in [
            "postgres://rm@db.example.net/rm?sslmode=verify-full",
            "host=/run/postgresql dbname=rm",
            "",
        ] {
            let refused = PgTarget::parse(url).unwrap_err();
            assert_eq!(refused, PgUrlError::NotBuilt, "{url}");
            let said = refused.to_string();
            assert!(said.contains("--features fleet"), "{said}");
            assert!(said.contains("remove `journal.url`"), "{said}");
        }
    }
}
