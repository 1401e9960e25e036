//! `rm-agent check`'s judgement of the PostgreSQL journal: the pure rule, then against the test
//! server: a migrated database and its owner, a database never migrated, a role missing rights
//! (and the sequence a delivery's id comes from), a server that is not there.

use postgres::{Client, NoTls};

use super::check::{DatabaseProblem, Right, judge};
use crate::intake_tests::{Postgres, off_runtime};
use crate::{SCHEMA_VERSION, check_database};

fn right(object: &str, privilege: &str, held: bool) -> Right {
    Right {
        object: object.to_owned(),
        privilege: privilege.to_owned(),
        held,
    }
}

#[test]
fn the_judgement_names_the_version_or_every_missing_right_with_its_grant() {
    let rights = [
        right("TABLE jobs", "SELECT", true),
        right("TABLE jobs", "DELETE", false),
        right("SEQUENCE public.deliveries_id_seq", "USAGE", false),
    ];
    assert_eq!(judge("rm", SCHEMA_VERSION, &rights[..1]), []);
    let problems = judge("rm", SCHEMA_VERSION, &rights);
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "role rm may not DELETE on TABLE jobs: GRANT DELETE ON TABLE jobs TO rm",
            "role rm may not USAGE on SEQUENCE public.deliveries_id_seq: \
             GRANT USAGE ON SEQUENCE public.deliveries_id_seq TO rm",
        ]
    );
    // At another version the rights are not judged (the tables may not exist).
    assert_eq!(
        judge("rm", SCHEMA_VERSION - 1, &rights),
        [DatabaseProblem::NotMigrated {
            found: SCHEMA_VERSION - 1,
            expected: SCHEMA_VERSION
        }]
    );
    assert_eq!(
        judge("rm", SCHEMA_VERSION + 1, &rights),
        [DatabaseProblem::TooNew {
            found: SCHEMA_VERSION + 1,
            expected: SCHEMA_VERSION
        }]
    );
    assert!(
        judge("rm", 0, &[])[0]
            .to_string()
            .contains("start `rm-agent receive` or `rm-agent run` once")
    );
}

/// The database the journal migrated, checked as its owner: nothing wrong.
#[test]
fn a_migrated_database_and_its_owner_pass() {
    let Some(pg) = Postgres::new("a_migrated_database_and_its_owner_pass") else {
        return;
    };
    let url = pg.db.url();
    let report = off_runtime(|| check_database(&url));
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(report.role.as_deref(), Some(crate::pg_server::ROLE));
    assert_eq!(report.schema_version, Some(SCHEMA_VERSION));
}

/// A database nobody migrated: says so, and which version is needed.
#[test]
fn a_database_never_migrated_is_reported() {
    let Ok(server) = crate::pg_server::shared() else {
        // `Postgres::new` applies the skip policy and says why.
        let _ = Postgres::new("a_database_never_migrated_is_reported");
        return;
    };
    let db = server.database("never_migrated").unwrap();
    let url = db.url();
    let report = off_runtime(|| check_database(&url));
    assert_eq!(
        report.problems,
        [DatabaseProblem::NotMigrated {
            found: 0,
            expected: SCHEMA_VERSION
        }]
    );
}

/// A role that may read everything and write every table but `claims`, and was not given the
/// sequence behind `deliveries.id`: each missing right is reported, nothing else.
#[test]
fn a_role_missing_rights_is_told_each_grant() {
    let Some(pg) = Postgres::new("a_role_missing_rights_is_told_each_grant") else {
        return;
    };
    let url = pg.db.url();
    let role = format!("{}_limited", pg.db.name());
    off_runtime(|| {
        Client::connect(&url, NoTls)
            .unwrap()
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN;
                 GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};
                 GRANT INSERT, UPDATE, DELETE ON deliveries, jobs, installations,
                     installation_repositories, attempts, poll_cursors, redeliveries, hosts,
                     leaders TO {role};"
            ))
            .unwrap()
    });
    let limited = url.replace(
        &format!("user={}", crate::pg_server::ROLE),
        &format!("user={role}"),
    );
    let report = off_runtime(|| check_database(&limited));
    let missing: Vec<(String, String)> = report
        .problems
        .iter()
        .map(|problem| match problem {
            DatabaseProblem::MissingRight {
                role: who,
                object,
                privilege,
            } => {
                assert_eq!(who, &role);
                (object.clone(), privilege.clone())
            }
            other => panic!("{other}"),
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("TABLE claims", "INSERT"),
        ("TABLE claims", "UPDATE"),
        ("TABLE claims", "DELETE"),
        ("SEQUENCE public.deliveries_id_seq", "USAGE"),
    ]
    .iter()
    .map(|(o, p)| ((*o).to_owned(), (*p).to_owned()))
    .collect();
    assert_eq!(missing, want);
}

/// A server that is not there: unreachable, with the client's reason; no panic, no hang.
#[test]
fn an_unreachable_server_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("host={} user=rm dbname=rm", dir.path().display());
    let report = off_runtime(|| check_database(&url));
    assert!(
        matches!(&report.problems[..], [DatabaseProblem::Unreachable { reason }] if !reason.is_empty()),
        "{report:?}"
    );
    assert!(report.role.is_none());
}
