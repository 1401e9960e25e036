//! The PostgreSQL journal as `rm-agent check` judges it: reachable, migrated to this build's
//! schema version, and the connecting role allowed to do what rm does to each table (read,
//! insert, update, delete; and use the sequence behind `deliveries.id`). The measurement is one
//! connection and two queries ([`check_database`]); the judgement is pure ([`judge`]), so each
//! message is tested without a server. Nothing is written.

use postgres::NoTls;
use serde::Serialize;

use crate::SCHEMA_VERSION;

/// Every table rm reads and writes (all of the schema but `rm_schema_version`, which only the
/// migrating writer changes and `check` only reads).
const TABLES: &[&str] = &[
    "deliveries",
    "jobs",
    "installations",
    "installation_repositories",
    "attempts",
    "poll_cursors",
    "redeliveries",
    "hosts",
    "claims",
    "leaders",
];

/// What rm does to each of [`TABLES`]: retention deletes, the merge updates, the intake inserts.
const PRIVILEGES: &[&str] = &["SELECT", "INSERT", "UPDATE", "DELETE"];

/// The identity column whose sequence an insert draws from: without `USAGE` on it, a role with
/// `INSERT` on `deliveries` still cannot journal a delivery.
const SEQUENCE_COLUMN: (&str, &str) = ("deliveries", "id");

/// How long `check` waits for the server before calling it unreachable.
const CHECK_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One thing wrong with the database, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum DatabaseProblem {
    #[error("cannot reach the PostgreSQL journal: {reason}")]
    Unreachable { reason: String },
    #[error(
        "the PostgreSQL journal is at schema version {found}, this rm-agent needs {expected}: start `rm-agent receive` or `rm-agent run` once, as a role that may create tables, to migrate it"
    )]
    NotMigrated { found: i64, expected: i64 },
    #[error(
        "the PostgreSQL journal is at schema version {found}, newer than this rm-agent knows ({expected}): run the newer rm-agent"
    )]
    TooNew { found: i64, expected: i64 },
    #[error("role {role} may not {privilege} on {object}: GRANT {privilege} ON {object} TO {role}")]
    MissingRight {
        role: String,
        /// `TABLE name` or `SEQUENCE name`, as a GRANT names it.
        object: String,
        privilege: String,
    },
}

/// What `check` found; no problems means rm can run on this database as this role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DatabaseCheck {
    /// The role connected as, once connected.
    pub role: Option<String>,
    pub schema_version: Option<i64>,
    pub problems: Vec<DatabaseProblem>,
}

impl DatabaseCheck {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// One right as measured: the object as a GRANT names it, the privilege, whether it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Right {
    pub(crate) object: String,
    pub(crate) privilege: String,
    pub(crate) held: bool,
}

/// The problems of a database at `found` whose role `role` holds `rights`. Rights are judged
/// only at this build's version: at another, the tables they name may not exist yet.
pub(crate) fn judge(role: &str, found: i64, rights: &[Right]) -> Vec<DatabaseProblem> {
    if found < SCHEMA_VERSION {
        return vec![DatabaseProblem::NotMigrated {
            found,
            expected: SCHEMA_VERSION,
        }];
    }
    if found > SCHEMA_VERSION {
        return vec![DatabaseProblem::TooNew {
            found,
            expected: SCHEMA_VERSION,
        }];
    }
    rights
        .iter()
        .filter(|right| !right.held)
        .map(|right| DatabaseProblem::MissingRight {
            role: role.to_owned(),
            object: right.object.clone(),
            privilege: right.privilege.clone(),
        })
        .collect()
}

/// Connects to `url` and judges the database for `rm-agent check`. Blocks: call it off the
/// async runtime. Never fails: an unreachable server is a problem in the report.
pub fn check_database(url: &str) -> DatabaseCheck {
    let unreachable = |reason: String| DatabaseCheck {
        role: None,
        schema_version: None,
        problems: vec![DatabaseProblem::Unreachable { reason }],
    };
    let mut config = match super::writer::config(url, "rm-agent-check") {
        Ok(config) => config,
        Err(err) => return unreachable(err.to_string()),
    };
    config.connect_timeout(CHECK_CONNECT_TIMEOUT);
    let mut client = match config.connect(NoTls) {
        Ok(client) => client,
        Err(err) => return unreachable(super::describe(&err)),
    };
    match measure(&mut client) {
        Ok((role, found, rights)) => DatabaseCheck {
            problems: judge(&role, found, &rights),
            role: Some(role),
            schema_version: Some(found),
        },
        Err(err) => unreachable(err.to_string()),
    }
}

/// The role, the schema version and, at this build's version, every right rm needs.
fn measure(
    client: &mut postgres::Client,
) -> Result<(String, i64, Vec<Right>), crate::JournalError> {
    let role: String = client.query_one("SELECT current_user::text", &[])?.get(0);
    let found = super::schema::version(client)?;
    if found != SCHEMA_VERSION {
        return Ok((role, found, Vec::new()));
    }
    let tables: Vec<&str> = TABLES.to_vec();
    let privileges: Vec<&str> = PRIVILEGES.to_vec();
    let mut rights: Vec<Right> = client
        .query(
            "SELECT t, p, has_table_privilege(t, p) FROM unnest($1::text[]) WITH ORDINALITY AS
                 tt (t, i)
             CROSS JOIN unnest($2::text[]) WITH ORDINALITY AS pp (p, j)
             ORDER BY i, j",
            &[&tables, &privileges],
        )?
        .iter()
        .map(|row| Right {
            object: format!("TABLE {}", row.get::<_, String>(0)),
            privilege: row.get(1),
            held: row.get(2),
        })
        .collect();
    let (table, column) = SEQUENCE_COLUMN;
    let sequence = client.query_one(
        "SELECT s, has_sequence_privilege(s, 'USAGE')
         FROM pg_get_serial_sequence($1, $2) AS s",
        &[&table, &column],
    )?;
    rights.push(Right {
        object: format!("SEQUENCE {}", sequence.get::<_, String>(0)),
        privilege: "USAGE".to_owned(),
        held: sequence.get(1),
    });
    Ok((role, found, rights))
}
