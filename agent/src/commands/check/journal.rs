//! `check`'s findings on the journal when `journal.url` names a fleet's PostgreSQL database
//! (CONTRACT §9): can it be reached and logged in to, is its schema this rm's version (or one a
//! receiver may migrate), and may the role do what the intake does. Without `journal.url` the
//! journal is the SQLite file in the data directory, which the fitness findings cover.

use std::collections::BTreeMap;

use rm_journal::{PgInspection, PgRight, PgSchemaState};

use super::Finding;
use crate::config::{self, Config};
use crate::secrets;

/// The findings on the PostgreSQL journal; none without `journal.url`.
pub(super) async fn journal(config: &Config) -> Vec<Finding> {
    let Some(target) = secrets::journal_target(config) else {
        return Vec::new();
    };
    let mut out: Vec<Finding> = run_refused(config).into_iter().collect();
    out.extend(login(config, &target));
    out.extend(database(config, target).await);
    out
}

/// Policies beside `journal.url` with what `run` refuses there (`[receiver]` or `[relay]`,
/// [`crate::commands::refuse_on_shared_journal`] decides): say it here, before the operator
/// finds out from the service manager.
pub(super) fn run_refused(config: &Config) -> Option<Finding> {
    if config.pg_journal.is_none() || config.policies.is_empty() {
        return None;
    }
    let refused = crate::commands::refuse_on_shared_journal("run", config).err()?;
    Some(Finding::warn(
        "journal",
        format!("`rm-agent run` would refuse to start: {}", refused.message),
        "take the fleet's webhooks with `rm-agent receive` (any number, on any hosts) and remove [receiver] and [relay] from the run hosts' configuration (docs/fleet.md)",
    ))
}

/// How this host logs in, judged as `run` (a host with policies runs jobs) or `receive` would
/// judge it at start (crate::journal_auth): what `run` refuses fails here.
fn login(config: &Config, target: &rm_journal::PgTarget) -> Vec<Finding> {
    use crate::journal_auth::{Facts, Role, Verdict, judge};
    let role = if config.policies.is_empty() {
        Role::Receive
    } else {
        Role::Run(config.host.isolation)
    };
    let remedy = "see docs/fleet.md, \"Logging in: the password rule\"";
    judge(role, Facts::of(target))
        .into_iter()
        .map(|verdict| match verdict {
            Verdict::Refuse(why) => Finding::fail(
                "journal",
                format!(
                    "`rm-agent run` would refuse `journal.url` ({}): it {why}",
                    target.describe()
                ),
                remedy,
            ),
            Verdict::Warn(why) => Finding::warn(
                "journal",
                format!("`journal.url` ({}) {why}", target.describe()),
                remedy,
            ),
        })
        .collect()
}

/// Reaches the database and judges what it found.
async fn database(config: &Config, target: rm_journal::PgTarget) -> Vec<Finding> {
    let server = target.describe();
    let has_password = target.has_password();
    // The sync client blocks (and runs a runtime of its own): off this one.
    let inspected = tokio::task::spawn_blocking(move || PgInspection::of(&target)).await;
    let file = config::display_file(config.source.as_deref());
    match inspected {
        Ok(Ok(inspection)) => findings(&inspection, &server),
        Ok(Err(err)) => vec![unreachable(&server, &err.to_string(), has_password, &file)],
        Err(err) => vec![unreachable(&server, &err.to_string(), has_password, &file)],
    }
}

/// The database could not be reached or logged in to.
fn unreachable(server: &str, why: &str, has_password: bool, file: &str) -> Finding {
    let password = if has_password {
        format!("check the password in ${}", secrets::JOURNAL_PASSWORD_ENV)
    } else {
        format!(
            "if the role logs in with a password, set ${} (never in the URL)",
            secrets::JOURNAL_PASSWORD_ENV
        )
    };
    Finding::fail(
        "journal",
        format!("cannot reach the PostgreSQL journal {server}: {why}"),
        format!(
            "start the database or fix `journal.url` in {file}; check that the server lets this host's role log in to the database (pg_hba.conf); {password}"
        ),
    )
}

/// What an inspection means for running `receive`: one finding for the connection, one for
/// the schema, and one per table (or schema) whose rights the role lacks.
pub(super) fn findings(inspection: &PgInspection, server: &str) -> Vec<Finding> {
    let role = &inspection.role;
    let mut out = vec![Finding::ok(
        "journal",
        format!("PostgreSQL journal {server} reached as role {role}"),
    )];
    let needs_migration_rights = inspection
        .missing
        .iter()
        .any(|r| r.privilege == "CREATE" || r.privilege == "OWNER");
    out.push(match inspection.state {
        PgSchemaState::Current => Finding::ok(
            "journal",
            format!(
                "its schema is at version {}, this rm-agent's",
                inspection.supported
            ),
        ),
        PgSchemaState::Behind { found } if !needs_migration_rights => Finding::ok(
            "journal",
            format!(
                "its schema is at version {found}; the first `rm-agent receive` migrates it to {}",
                inspection.supported
            ),
        ),
        PgSchemaState::Behind { found } => Finding::fail(
            "journal",
            format!(
                "its schema is at version {found}, and role {role} may not migrate it to {}",
                inspection.supported
            ),
            "grant the rights below, or start the first `rm-agent receive` (after an upgrade too) as the role that owns rm's tables",
        ),
        PgSchemaState::Newer { found } => Finding::fail(
            "journal",
            format!(
                "its schema is at version {found}, newer than this rm-agent knows ({})",
                inspection.supported
            ),
            "upgrade rm-agent on this host to the version the fleet runs",
        ),
        PgSchemaState::Unreadable => Finding::fail(
            "journal",
            format!("role {role} may not read the schema's version (rm_schema_version)"),
            format!("GRANT SELECT ON rm_schema_version TO {role} (as the table's owner)"),
        ),
    });
    let mut by_object: BTreeMap<&str, Vec<&'static str>> = BTreeMap::new();
    for PgRight { privilege, object } in &inspection.missing {
        by_object.entry(object).or_default().push(privilege);
    }
    for (object, privileges) in by_object {
        out.push(missing(role, object, &privileges));
    }
    if inspection.missing.is_empty() {
        out.push(Finding::ok(
            "journal",
            format!("role {role} may record deliveries (every right the intake uses)"),
        ));
    }
    out
}

/// One object's missing rights, with the statement that grants them.
fn missing(role: &str, object: &str, privileges: &[&str]) -> Finding {
    let list = privileges.join(", ");
    let (kind, name) = object.split_once(' ').unwrap_or(("", object));
    if privileges.contains(&"OWNER") {
        return Finding::fail(
            "journal",
            format!("role {role} does not own {object}, and migrating alters it"),
            format!(
                "start the first `rm-agent receive` after an upgrade as the owner of {object}, or ALTER TABLE {name} OWNER TO {role}"
            ),
        );
    }
    Finding::fail(
        "journal",
        format!("role {role} lacks {list} on {object}"),
        format!(
            "GRANT {list} ON {}{name} TO {role} (as its owner)",
            if kind == "schema" { "SCHEMA " } else { "" }
        ),
    )
}
