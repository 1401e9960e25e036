//! `check`'s journal findings: what an inspection means (pure), and against a real PostgreSQL
//! server a role without rights, told each right it lacks with a remedy that, run as written,
//! makes every finding ok; and a database that cannot be reached.

use postgres::{Client, NoTls};
use rm_journal::{PgInspection, PgJournal, PgRight, PgSchemaState};

use super::Status;
use super::journal::{findings, journal, run_refused};
use crate::config;

fn inspection(state: PgSchemaState, missing: &[(&'static str, &str)]) -> PgInspection {
    PgInspection {
        role: "rm_recv".to_owned(),
        namespace: "public".to_owned(),
        state,
        supported: 7,
        missing: missing
            .iter()
            .map(|(privilege, object)| PgRight {
                privilege,
                object: (*object).to_owned(),
            })
            .collect(),
    }
}

#[test]
fn a_current_schema_and_every_right_is_all_ok() {
    let out = findings(&inspection(PgSchemaState::Current, &[]), "rm@db/rm");
    assert!(out.iter().all(|f| f.status == Status::Ok), "{out:?}");
    assert!(out.iter().all(|f| f.check == "journal"));
}

#[test]
fn each_failure_names_its_remedy() {
    let out = findings(
        &inspection(
            PgSchemaState::Behind { found: 0 },
            &[
                ("CREATE", "schema public"),
                ("INSERT", "table jobs"),
                ("UPDATE", "table jobs"),
            ],
        ),
        "rm@db/rm",
    );
    let failed: Vec<_> = out.iter().filter(|f| f.status == Status::Fail).collect();
    assert_eq!(failed.len(), 3, "{out:?}");
    assert!(
        failed[0].what.contains("may not migrate"),
        "{:?}",
        failed[0]
    );
    assert!(
        out.iter()
            .any(|f| f.what == "role rm_recv lacks CREATE on schema public"
                && f.remedy == "GRANT CREATE ON SCHEMA public TO rm_recv (as its owner)")
    );
    assert!(out.iter().any(
        |f| f.what == "role rm_recv lacks INSERT, UPDATE on table jobs"
            && f.remedy == "GRANT INSERT, UPDATE ON jobs TO rm_recv (as its owner)"
    ));

    let newer = findings(&inspection(PgSchemaState::Newer { found: 9 }, &[]), "x");
    assert!(
        newer
            .iter()
            .any(|f| f.status == Status::Fail && f.remedy.contains("upgrade rm-agent")),
        "{newer:?}"
    );
    // Behind with the rights to migrate: a receiver's first start migrates it.
    let behind = findings(&inspection(PgSchemaState::Behind { found: 3 }, &[]), "x");
    assert!(behind.iter().all(|f| f.status == Status::Ok), "{behind:?}");
}

/// Runs `f` on a thread of its own: the sync client runs a runtime of its own.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(f).join().unwrap())
}

#[tokio::test]
async fn a_role_without_rights_is_told_each_grant_and_the_grants_as_written_make_it_ok() {
    let test = "a_role_without_rights_is_told_each_grant";
    let server = match crate::test_pg_server::shared() {
        Ok(server) => server,
        Err(why) => {
            crate::test_skip::cannot_run(test, "postgres", &why);
            return;
        }
    };
    let db = server.database("check_rights").unwrap();
    let admin = db.url();
    off_runtime(|| {
        // Migrated by its owner, as the first receiver would.
        drop(PgJournal::connect(&admin).unwrap());
        Client::connect(&admin, NoTls)
            .unwrap()
            .batch_execute(
                "DROP ROLE IF EXISTS rm_check_bare; CREATE ROLE rm_check_bare LOGIN;
                 REVOKE CREATE ON SCHEMA public FROM PUBLIC;",
            )
            .unwrap();
    });
    let url = format!(
        "host={} user=rm_check_bare dbname={}",
        server.socket_dir().display(),
        db.name()
    );
    let config = config::from_text(&format!("[journal]\nurl = \"{url}\"\n")).unwrap();

    let out = journal(&config).await;
    assert_eq!(out[0].status, Status::Ok, "{out:?}");
    assert!(
        out[0].what.contains("reached as role rm_check_bare"),
        "{out:?}"
    );
    let failed: Vec<_> = out.iter().filter(|f| f.status == Status::Fail).collect();
    for expected in [
        "role rm_check_bare lacks SELECT, INSERT, UPDATE on table deliveries",
        "role rm_check_bare lacks SELECT, INSERT, DELETE on table installation_repositories",
        "role rm_check_bare may not read the schema's version (rm_schema_version)",
    ] {
        assert!(
            failed.iter().any(|f| f.what == expected),
            "{expected}: {out:?}"
        );
    }
    // Every remedy is a statement the tables' owner can run as written.
    let grants: Vec<String> = failed
        .iter()
        .map(|f| {
            let (statement, _) = f.remedy.split_once(" (as ").unwrap();
            assert!(statement.starts_with("GRANT "), "{f:?}");
            statement.to_owned()
        })
        .collect();
    off_runtime(|| {
        let mut client = Client::connect(&admin, NoTls).unwrap();
        for grant in &grants {
            client.batch_execute(grant).unwrap();
        }
    });
    let out = journal(&config).await;
    assert!(out.iter().all(|f| f.status == Status::Ok), "{out:?}");
}

#[tokio::test]
async fn a_database_that_cannot_be_reached_fails_naming_the_key_and_the_password_variable() {
    let dir = tempfile::tempdir().unwrap();
    let config = config::from_text(&format!(
        "[journal]\nurl = \"host={} user=rm dbname=rm\"\n",
        dir.path().display()
    ))
    .unwrap();
    let out = journal(&config).await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].status, Status::Fail);
    assert!(
        out[0]
            .what
            .starts_with("cannot reach the PostgreSQL journal rm@"),
        "{out:?}"
    );
    assert!(out[0].remedy.contains("`journal.url`"), "{out:?}");
    assert!(out[0].remedy.contains("RM_JOURNAL_PASSWORD"), "{out:?}");
}

#[test]
fn a_receiver_beside_a_postgres_journal_and_policies_is_warned_that_run_refuses_it() {
    let policy = "[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"x\"]\n";
    let url = "[journal]\nurl = \"postgres://rm@db/rm\"\n";
    let receiver = "[receiver]\nlisten = \"127.0.0.1:8080\"\n";
    let all = config::from_text(&format!("{url}{receiver}{policy}")).unwrap();
    let warned = run_refused(&all).expect("no warning");
    assert_eq!(warned.status, Status::Warn);
    assert!(
        warned.what.contains("`rm-agent run` would refuse to start")
            && warned.what.contains("`receiver`"),
        "{warned:?}"
    );
    // A fleet host (policies, no intake of its own) is what `run` takes.
    assert!(run_refused(&config::from_text(&format!("{url}{policy}")).unwrap()).is_none());
    assert!(run_refused(&config::from_text(url).unwrap()).is_none());
    assert!(run_refused(&config::from_text(&format!("{receiver}{policy}")).unwrap()).is_none());
}

/// `check` judges the login as `run` would on a host with policies (a passwordless TCP login
/// fails, as `run` refuses it) and as `receive` would on one without (warned), before the
/// operator learns it from the service manager (crate::journal_auth).
#[tokio::test]
async fn a_run_host_s_passwordless_tcp_login_fails_and_a_receiver_s_is_warned() {
    // Nothing listens on port 1: the reachability finding fails at once, beside these.
    let url = "[journal]\nurl = \"postgres://rm@127.0.0.1:1/rm\"\n";
    let policy = "[[policy]]\nname = \"linux\"\ntarget = \"acme\"\nlabels = [\"x\"]\n";
    let run = journal(&config::from_text(&format!("{url}{policy}")).unwrap()).await;
    assert!(
        run.iter().any(|f| f.status == Status::Fail
            && f.what.contains("`rm-agent run` would refuse `journal.url`")
            && f.what.contains("without a password")),
        "{run:?}"
    );
    let receive = journal(&config::from_text(url).unwrap()).await;
    assert!(
        receive
            .iter()
            .any(|f| f.status == Status::Warn && f.what.contains("without a password")),
        "{receive:?}"
    );
    assert!(
        !receive.iter().any(|f| f.what.contains("would refuse")),
        "{receive:?}"
    );
}
