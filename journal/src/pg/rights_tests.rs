//! The rights `rm-agent check` asks for, against a real server: a role holding exactly
//! [`super::inspect::INTAKE_RIGHTS`] on a migrated database starts a writer and records (so the
//! list is enough, and a start on a current schema creates nothing), and a role holding less is
//! told each right it lacks.

use postgres::{Client, NoTls};

use super::inspect::{FLEET_RIGHTS, INTAKE_RIGHTS};
use crate::intake_tests::{Postgres, job_delivery, off_runtime};
use crate::{Outcome, PgInspection, PgJournal, PgSchemaState, PgTarget, Recorded};

/// Creates `role` (LOGIN, no rights) and grants it `grants` (`(privilege, table)`); returns the
/// database's connection string as that role.
fn role_with(pg: &Postgres, role: &str, grants: &[(&str, &str)]) -> String {
    let admin = pg.db.url();
    let grants: Vec<(String, String)> = grants
        .iter()
        .map(|(p, t)| ((*p).to_owned(), (*t).to_owned()))
        .collect();
    let name = role.to_owned();
    off_runtime(move || {
        let role = name;
        let mut client = Client::connect(&admin, NoTls).unwrap();
        client
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN;
                 REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
            ))
            .unwrap();
        for (privilege, table) in grants {
            client
                .batch_execute(&format!("GRANT {privilege} ON {table} TO {role}"))
                .unwrap();
        }
    });
    format!("{} user={role}", pg.db.url().replace("user=rm ", ""))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_exactly_the_intake_rights_records_and_check_finds_nothing_missing() {
    let Some(pg) = Postgres::new("a_role_with_exactly_the_intake_rights") else {
        return;
    };
    let grants: Vec<(&str, &str)> = INTAKE_RIGHTS
        .iter()
        .chain(FLEET_RIGHTS)
        .flat_map(|(table, rights)| rights.iter().map(move |right| (*right, *table)))
        .collect();
    let url = role_with(&pg, "rm_intake_exact", &grants);
    let target = PgTarget::parse(&url).unwrap();
    let inspection = off_runtime(|| PgInspection::of(&target).unwrap());
    assert_eq!(inspection.role, "rm_intake_exact");
    assert_eq!(inspection.state, PgSchemaState::Current);
    assert_eq!(inspection.missing, []);
    let journal = off_runtime(|| PgJournal::open(&target).unwrap());
    let recorded = journal
        .record(job_delivery("exact-1", 11, "queued", 1))
        .await;
    assert_eq!(recorded.unwrap(), Recorded::New(Outcome::Applied));
    let again = journal
        .record(job_delivery("exact-2", 11, "completed", 2))
        .await;
    assert_eq!(again.unwrap(), Recorded::New(Outcome::Applied));
}

#[test]
fn a_role_without_rights_is_told_each_one_and_cannot_migrate_an_empty_database() {
    let Some(pg) = Postgres::new("a_role_without_rights_is_told") else {
        return;
    };
    let url = role_with(&pg, "rm_reads_only", &[("SELECT", "deliveries")]);
    let target = PgTarget::parse(&url).unwrap();
    let inspection = off_runtime(|| PgInspection::of(&target).unwrap());
    // The version table is not readable to it either.
    assert_eq!(inspection.state, PgSchemaState::Unreadable);
    let named: Vec<String> = inspection
        .missing
        .iter()
        .map(|r| format!("{} {}", r.privilege, r.object))
        .collect();
    for expected in [
        "INSERT table deliveries",
        "SELECT table jobs",
        "DELETE table installation_repositories",
        "SELECT table rm_schema_version",
    ] {
        assert!(named.contains(&expected.to_owned()), "{named:?}");
    }
    assert!(!named.contains(&"SELECT table deliveries".to_owned()));

    // A fresh database: nothing to grant on tables, but no CREATE on the schema.
    let empty = crate::pg_server::shared()
        .unwrap()
        .database("rights_empty")
        .unwrap();
    let admin = empty.url();
    off_runtime(|| {
        Client::connect(&admin, NoTls)
            .unwrap()
            .batch_execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            .unwrap()
    });
    let target = PgTarget::parse(&format!(
        "{} user=rm_reads_only",
        admin.replace("user=rm ", "")
    ))
    .unwrap();
    let inspection = off_runtime(|| PgInspection::of(&target).unwrap());
    assert_eq!(inspection.state, PgSchemaState::Behind { found: 0 });
    assert_eq!(
        inspection
            .missing
            .iter()
            .map(|r| format!("{} {}", r.privilege, r.object))
            .collect::<Vec<_>>(),
        ["CREATE schema public"]
    );
    // And a writer started as it fails to migrate, as check said it would.
    assert!(off_runtime(|| PgJournal::open(&target)).is_err());
}
