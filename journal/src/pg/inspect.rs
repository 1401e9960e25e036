//! What `rm-agent check` asks of a PostgreSQL journal before a receiver is started on it: the
//! schema's version against this build's (current, migratable, or from a newer rm), and whether
//! the role may do what the intake does (the table rights) and, when the schema is behind, what
//! migrating takes (CREATE on the schema, ownership of rm's existing tables). Reads only:
//! nothing is created, migrated or written. The judgement is [`judge`], a pure function of what
//! the catalog said.

use std::collections::HashMap;

use postgres::Client;

use super::PgTarget;
use super::surface::{PgInspection, PgRight, PgSchemaState};
use crate::{JournalError, SCHEMA_VERSION};

/// What the server is told `check`'s connection is.
const CHECK_APPLICATION: &str = "rm-agent-check";

/// The rights the intake path uses, per table: delivery rows are inserted and their outcome
/// updated, job and installation rows upserted, an installation's repositories replaced.
pub(crate) const INTAKE_RIGHTS: &[(&str, &[&str])] = &[
    ("deliveries", &["SELECT", "INSERT", "UPDATE"]),
    ("jobs", &["SELECT", "INSERT", "UPDATE"]),
    ("installations", &["SELECT", "INSERT", "UPDATE"]),
    ("installation_repositories", &["SELECT", "INSERT", "DELETE"]),
    ("rm_schema_version", &["SELECT"]),
];

/// The rights a fleet host's `run` uses besides the intake's (CONTRACT §9): leases renewed and
/// ended, claims made, named and released, leaders taken and given up, requests reserved in the
/// shared windows.
pub(crate) const FLEET_RIGHTS: &[(&str, &[&str])] = &[
    ("hosts", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("claims", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("leaders", &["SELECT", "INSERT", "UPDATE", "DELETE"]),
    ("spends", &["SELECT", "INSERT", "DELETE"]),
];

/// Every table rm's migrations make or change: a migration alters them, which takes ownership.
const RM_TABLES: &[&str] = &[
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
    "spends",
    "rm_schema_version",
];

/// What the catalog says about one of rm's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TableFacts {
    /// The role owns it (or is a member of its owner's role).
    pub(crate) owned: bool,
    /// The privileges the role holds on it, upper case.
    pub(crate) held: Vec<String>,
}

/// What the catalog said, before judging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    pub(crate) namespace: String,
    /// The version table's value; `None` when it exists but cannot be read; `Some(0)` when
    /// there is none.
    pub(crate) version: Option<i64>,
    pub(crate) can_create: bool,
    /// rm's tables that exist, by name.
    pub(crate) tables: HashMap<String, TableFacts>,
}

impl PgInspection {
    /// Connects to `target` and reads the catalog (blocking: call it off the async runtime).
    /// `Err` when the database cannot be reached or logged in to.
    pub fn of(target: &PgTarget) -> Result<PgInspection, JournalError> {
        let mut client = target.client_config(CHECK_APPLICATION).connect()?;
        let role: String = client.query_one("SELECT current_user::text", &[])?.get(0);
        let facts = facts(&mut client)?;
        let (state, missing) = judge(&facts, SCHEMA_VERSION);
        Ok(PgInspection {
            role,
            namespace: facts.namespace,
            state,
            supported: SCHEMA_VERSION,
            missing,
        })
    }
}

fn facts(client: &mut Client) -> Result<Facts, JournalError> {
    let row = client.query_one(
        "SELECT COALESCE(current_schema()::text, ''),
             COALESCE(has_schema_privilege(current_schema(), 'CREATE'), FALSE)",
        &[],
    )?;
    let namespace: String = row.get(0);
    let can_create: bool = row.get(1);
    let names: Vec<&str> = RM_TABLES.to_vec();
    let rows = client.query(
        "SELECT c.relname::text, pg_has_role(c.relowner, 'MEMBER'),
             has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
             has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE')
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
             AND c.relname = ANY($1)",
        &[&names],
    )?;
    let mut tables = HashMap::new();
    for row in &rows {
        let held = ["SELECT", "INSERT", "UPDATE", "DELETE"]
            .iter()
            .enumerate()
            .filter(|&(i, _)| row.get::<_, bool>(i + 2))
            .map(|(_, p)| (*p).to_owned())
            .collect();
        tables.insert(
            row.get::<_, String>(0),
            TableFacts {
                owned: row.get(1),
                held,
            },
        );
    }
    let version = match tables.get("rm_schema_version") {
        None => Some(0),
        Some(t) if !t.held.iter().any(|p| p == "SELECT") => None,
        Some(_) => Some(
            client
                .query_opt("SELECT version FROM rm_schema_version", &[])?
                .map_or(0, |row| row.get(0)),
        ),
    };
    Ok(Facts {
        namespace,
        version,
        can_create,
        tables,
    })
}

/// The schema's state and every right the role lacks: the intake's table rights on the tables
/// that exist (a table a migration will make is the role's own), and when behind, CREATE on
/// the schema and ownership of rm's existing tables (a migration creates and alters them).
pub(crate) fn judge(facts: &Facts, supported: i64) -> (PgSchemaState, Vec<PgRight>) {
    let state = match facts.version {
        None => PgSchemaState::Unreadable,
        Some(v) if v == supported => PgSchemaState::Current,
        Some(v) if v > supported => PgSchemaState::Newer { found: v },
        Some(v) => PgSchemaState::Behind { found: v },
    };
    let mut missing = Vec::new();
    for (table, rights) in INTAKE_RIGHTS.iter().chain(FLEET_RIGHTS) {
        let Some(found) = facts.tables.get(*table) else {
            continue;
        };
        for right in *rights {
            if !found.owned && !found.held.iter().any(|held| held == right) {
                missing.push(PgRight {
                    privilege: right,
                    object: format!("table {table}"),
                });
            }
        }
    }
    if matches!(state, PgSchemaState::Behind { .. }) {
        if !facts.can_create {
            missing.push(PgRight {
                privilege: "CREATE",
                object: format!("schema {}", facts.namespace),
            });
        }
        for table in RM_TABLES {
            if facts.tables.get(*table).is_some_and(|t| !t.owned) {
                missing.push(PgRight {
                    privilege: "OWNER",
                    object: format!("table {table}"),
                });
            }
        }
    }
    (state, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(owned: bool, held: &[&str]) -> TableFacts {
        TableFacts {
            owned,
            held: held.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    fn migrated(held: &[&str]) -> Facts {
        Facts {
            namespace: "public".to_owned(),
            version: Some(SCHEMA_VERSION),
            can_create: false,
            tables: RM_TABLES
                .iter()
                .map(|t| ((*t).to_owned(), table(false, held)))
                .collect(),
        }
    }

    #[test]
    fn a_current_schema_with_the_intake_s_rights_needs_nothing_more() {
        let facts = migrated(&["SELECT", "INSERT", "UPDATE", "DELETE"]);
        assert_eq!(
            judge(&facts, SCHEMA_VERSION),
            (PgSchemaState::Current, vec![])
        );
    }

    #[test]
    fn every_missing_table_right_is_named() {
        let (state, missing) = judge(&migrated(&["SELECT"]), SCHEMA_VERSION);
        assert_eq!(state, PgSchemaState::Current);
        let named: Vec<String> = missing
            .iter()
            .map(|r| format!("{} {}", r.privilege, r.object))
            .collect();
        assert_eq!(
            named,
            [
                "INSERT table deliveries",
                "UPDATE table deliveries",
                "INSERT table jobs",
                "UPDATE table jobs",
                "INSERT table installations",
                "UPDATE table installations",
                "INSERT table installation_repositories",
                "DELETE table installation_repositories",
                "INSERT table hosts",
                "UPDATE table hosts",
                "DELETE table hosts",
                "INSERT table claims",
                "UPDATE table claims",
                "DELETE table claims",
                "INSERT table leaders",
                "UPDATE table leaders",
                "DELETE table leaders",
                "INSERT table spends",
                "DELETE table spends",
            ]
        );
    }

    #[test]
    fn an_empty_database_needs_create_on_the_schema_only() {
        let mut facts = Facts {
            namespace: "public".to_owned(),
            version: Some(0),
            ..Facts::default()
        };
        let (state, missing) = judge(&facts, SCHEMA_VERSION);
        assert_eq!(state, PgSchemaState::Behind { found: 0 });
        assert_eq!(
            missing,
            [PgRight {
                privilege: "CREATE",
                object: "schema public".to_owned()
            }]
        );
        facts.can_create = true;
        assert_eq!(judge(&facts, SCHEMA_VERSION).1, []);
    }

    #[test]
    fn a_schema_behind_needs_the_tables_owner_and_a_newer_one_or_unreadable_is_said() {
        let mut facts = migrated(&["SELECT", "INSERT", "UPDATE", "DELETE"]);
        facts.version = Some(SCHEMA_VERSION - 1);
        facts.can_create = true;
        let (state, missing) = judge(&facts, SCHEMA_VERSION);
        assert_eq!(
            state,
            PgSchemaState::Behind {
                found: SCHEMA_VERSION - 1
            }
        );
        assert_eq!(missing.len(), RM_TABLES.len());
        assert!(missing.iter().all(|r| r.privilege == "OWNER"));
        facts.tables.values_mut().for_each(|t| t.owned = true);
        assert_eq!(judge(&facts, SCHEMA_VERSION).1, []);

        facts.version = Some(SCHEMA_VERSION + 1);
        assert_eq!(
            judge(&facts, SCHEMA_VERSION).0,
            PgSchemaState::Newer {
                found: SCHEMA_VERSION + 1
            }
        );
        facts.version = None;
        assert_eq!(judge(&facts, SCHEMA_VERSION).0, PgSchemaState::Unreadable);
    }
}
