//! The PostgreSQL journal's schema: the same tables, columns and versions as SQLite's
//! (`crate::schema`), in PostgreSQL's dialect, as one ordered list of migrations. Migration `n`
//! here does what SQLite's migration `n` does, so both report the same [`SCHEMA_VERSION`] for
//! the same tables. `rm_schema_version` holds the version; each migration runs in its own
//! transaction under an advisory lock, so receivers starting together migrate once.
//!
//! Dialect: INTEGER becomes BIGINT (every column is an i64 in Rust), BLOB BYTEA, the 0/1 flags
//! BOOLEAN, `GLOB` checks regular expressions or LIKE, `INTEGER PRIMARY KEY` an identity.

use postgres::Client;

use crate::JournalError;
use crate::schema::SCHEMA_VERSION;

/// Migration `n` (0-based) takes the schema from version `n` to `n + 1`. Only ever appended.
pub(crate) const MIGRATIONS: &[&str] = &[
    // v1: deliveries, jobs, installations and their repositories.
    r#"
    CREATE TABLE deliveries (
        id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        guid          TEXT NOT NULL UNIQUE,
        event         TEXT NOT NULL,
        action        TEXT,
        source        TEXT NOT NULL,
        received_at   BIGINT NOT NULL,
        headers       TEXT NOT NULL,
        body          BYTEA,
        outcome       TEXT NOT NULL CONSTRAINT deliveries_outcome_check
                      CHECK (outcome IN ('applied', 'duplicate', 'ignored', 'rejected')),
        reason        TEXT,
        replayed_at   BIGINT
    );
    CREATE INDEX deliveries_received_at ON deliveries (received_at);
    CREATE INDEX deliveries_rejected ON deliveries (received_at) WHERE outcome = 'rejected';

    CREATE TABLE jobs (
        job_id          BIGINT PRIMARY KEY,
        run_id          BIGINT NOT NULL,
        run_attempt     BIGINT NOT NULL,
        repository      TEXT NOT NULL,
        installation_id BIGINT,
        labels          TEXT NOT NULL,
        workflow_name   TEXT,
        job_name        TEXT,
        state           TEXT NOT NULL
                        CHECK (state IN ('waiting', 'queued', 'in_progress', 'completed')),
        state_rank      BIGINT NOT NULL,
        conclusion      TEXT,
        runner_name     TEXT,
        runner_id       BIGINT,
        source          TEXT NOT NULL,
        first_seen_at   BIGINT NOT NULL,
        updated_at      BIGINT NOT NULL
    );
    CREATE INDEX jobs_state ON jobs (state_rank, updated_at);

    CREATE TABLE installations (
        id                   BIGINT PRIMARY KEY,
        account              TEXT,
        account_type         TEXT,
        repository_selection TEXT,
        suspended            BOOLEAN NOT NULL DEFAULT FALSE,
        removed              BOOLEAN NOT NULL DEFAULT FALSE,
        updated_at           BIGINT NOT NULL
    );

    CREATE TABLE installation_repositories (
        installation_id BIGINT NOT NULL REFERENCES installations (id) ON DELETE CASCADE,
        repository_id   BIGINT NOT NULL,
        full_name       TEXT NOT NULL,
        PRIMARY KEY (installation_id, repository_id)
    );
    "#,
    // v2: runner attempts (see SQLite's v2 for what each column means).
    r#"
    CREATE TABLE attempts (
        attempt_id       TEXT PRIMARY KEY NOT NULL CHECK (attempt_id ~ '^[0-9a-f]{32}$'),
        policy           TEXT NOT NULL,
        runner_name      TEXT NOT NULL UNIQUE
                         CHECK (runner_name LIKE ('rm-_%-' || substr(attempt_id, 1, 12))),
        workspace        TEXT NOT NULL CHECK (workspace IN ('ephemeral', 'persistent')),
        runtime_dir      TEXT NOT NULL,
        state            TEXT NOT NULL CHECK (state IN ('allocated', 'jit_received', 'starting',
                             'idle', 'busy', 'finished', 'failed', 'orphaned', 'cleaned')),
        state_changed_at BIGINT NOT NULL,
        outcome          TEXT CHECK (outcome IN ('completed_job', 'idle_exit', 'failed',
                             'orphaned')),
        reason           TEXT,
        detail           TEXT,
        runner_id        BIGINT,
        job_id           BIGINT,
        pid              BIGINT,
        pid_start_time   BIGINT,
        stop_intent      TEXT,
        stop_intent_at   BIGINT,
        created_at       BIGINT NOT NULL,
        updated_at       BIGINT NOT NULL,
        CHECK ((outcome IS NULL) =
               (state IN ('allocated', 'jit_received', 'starting', 'idle', 'busy'))),
        CHECK (state != 'finished' OR outcome IN ('completed_job', 'idle_exit')),
        CHECK (state != 'failed' OR outcome = 'failed'),
        CHECK (state != 'orphaned' OR outcome = 'orphaned'),
        CHECK ((pid IS NULL) = (pid_start_time IS NULL)),
        CHECK ((stop_intent IS NULL) = (stop_intent_at IS NULL))
    );
    CREATE INDEX attempts_live ON attempts (policy, state)
        WHERE state IN ('allocated', 'jit_received', 'starting', 'idle', 'busy');
    CREATE UNIQUE INDEX attempts_uncleaned_runtime ON attempts (runtime_dir)
        WHERE state != 'cleaned';
    CREATE INDEX attempts_created ON attempts (created_at);
    CREATE INDEX attempts_cleaned ON attempts (state_changed_at) WHERE state = 'cleaned';
    CREATE INDEX attempts_job ON attempts (job_id) WHERE job_id IS NOT NULL;
    "#,
    // v3: what the polling fallback needs.
    r#"
    ALTER TABLE jobs ADD COLUMN announced_at BIGINT;
    ALTER TABLE jobs ADD COLUMN polled_at BIGINT;
    ALTER TABLE jobs ADD COLUMN checked_at BIGINT;
    UPDATE jobs SET announced_at = first_seen_at WHERE source != 'poll';
    CREATE INDEX jobs_queued ON jobs (updated_at) WHERE state = 'queued';

    CREATE TABLE poll_cursors (
        name       TEXT PRIMARY KEY NOT NULL,
        value      BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    );

    CREATE TABLE redeliveries (
        guid         TEXT PRIMARY KEY NOT NULL,
        delivery_id  BIGINT NOT NULL,
        requested_at BIGINT NOT NULL
    );
    CREATE INDEX redeliveries_requested_at ON redeliveries (requested_at);
    "#,
    // v4: the boot a runner's pid and start time belong to.
    r#"
    ALTER TABLE attempts ADD COLUMN pid_boot_id TEXT;
    "#,
    // v5: the execution backend, the runner uid held until `cleaned`, the cgroup.
    r#"
    ALTER TABLE attempts ADD COLUMN isolation TEXT NOT NULL DEFAULT 'none'
        CHECK (isolation IN ('none', 'user'));
    ALTER TABLE attempts ADD COLUMN uid BIGINT;
    ALTER TABLE attempts ADD COLUMN cgroup TEXT;
    CREATE UNIQUE INDEX attempts_uid_held ON attempts (uid)
        WHERE state != 'cleaned' AND uid IS NOT NULL;
    "#,
    // v6: a delivery's outcome may be `stale`. PostgreSQL changes the CHECK in place.
    r#"
    ALTER TABLE deliveries DROP CONSTRAINT deliveries_outcome_check;
    ALTER TABLE deliveries ADD CONSTRAINT deliveries_outcome_check
        CHECK (outcome IN ('applied', 'duplicate', 'ignored', 'rejected', 'stale'));
    "#,
    // v7: the ends of a job's wait, and when a runner process was started.
    r#"
    ALTER TABLE jobs ADD COLUMN queued_at BIGINT;
    ALTER TABLE jobs ADD COLUMN started_at BIGINT;
    ALTER TABLE attempts ADD COLUMN started_at BIGINT;
    UPDATE jobs SET started_at = updated_at WHERE state = 'in_progress';
    UPDATE attempts SET started_at = state_changed_at WHERE state = 'starting';
    CREATE INDEX jobs_started ON jobs (started_at) WHERE started_at IS NOT NULL;
    "#,
    // v8: the fleet: host leases, claims (one per job), leader leases (see SQLite's v8).
    r#"
    CREATE TABLE hosts (
        host          TEXT PRIMARY KEY NOT NULL,
        registered_at BIGINT NOT NULL,
        renewed_at    BIGINT NOT NULL,
        expires_at    BIGINT NOT NULL,
        labels        TEXT NOT NULL,
        policies      TEXT NOT NULL
    );

    CREATE TABLE claims (
        job_id      BIGINT PRIMARY KEY NOT NULL,
        host        TEXT NOT NULL,
        policy      TEXT NOT NULL,
        runner_name TEXT,
        claimed_at  BIGINT NOT NULL
    );
    CREATE INDEX claims_host ON claims (host);
    CREATE INDEX claims_policy ON claims (policy);

    CREATE TABLE leaders (
        role        TEXT PRIMARY KEY NOT NULL,
        host        TEXT NOT NULL,
        acquired_at BIGINT NOT NULL,
        renewed_at  BIGINT NOT NULL,
        expires_at  BIGINT NOT NULL
    );
    "#,
    // v9: the fleet's shared windows of requests GitHub counts per installation (see SQLite's v9).
    r#"
    CREATE TABLE spends (
        scope   TEXT NOT NULL,
        sent_at BIGINT NOT NULL,
        host    TEXT NOT NULL
    );
    CREATE INDEX spends_scope ON spends (scope, sent_at);
    "#,
    // v10: re-runs of jobs the infrastructure killed (see SQLite's v10).
    r#"
    CREATE TABLE reruns (
        job_id      BIGINT PRIMARY KEY NOT NULL,
        attempt_id  TEXT NOT NULL,
        policy      TEXT NOT NULL,
        reason      TEXT NOT NULL,
        repository  TEXT NOT NULL,
        run_id      BIGINT NOT NULL,
        run_attempt BIGINT NOT NULL,
        state       TEXT NOT NULL
                    CHECK (state IN ('intended', 'sending', 'sent', 'refused', 'unknown')),
        detail      TEXT,
        created_at  BIGINT NOT NULL,
        updated_at  BIGINT NOT NULL
    );
    CREATE INDEX reruns_attempt ON reruns (attempt_id);
    CREATE INDEX reruns_open ON reruns (state) WHERE state IN ('intended', 'sending');
    "#,
    // v11: runner scale sets (see SQLite's v11). Their rows live in each host's file (one
    // session per scale set per host) and nothing writes them here; the tables exist so the two
    // dialects keep one version for the same tables, as `attempts` and `reruns` do.
    r#"
    CREATE TABLE scale_sets (
        name            TEXT PRIMARY KEY NOT NULL,
        scale_set_id    BIGINT,
        session_id      TEXT,
        session_at      BIGINT,
        generation      BIGINT NOT NULL DEFAULT 0,
        last_message_id BIGINT NOT NULL DEFAULT 0,
        last_message_at BIGINT,
        statistics      TEXT,
        statistics_at   BIGINT,
        messages        BIGINT NOT NULL DEFAULT 0,
        note            TEXT,
        note_at         BIGINT,
        updated_at      BIGINT NOT NULL
    );

    CREATE TABLE scale_set_messages (
        scale_set    TEXT NOT NULL,
        generation   BIGINT NOT NULL,
        message_id   BIGINT NOT NULL,
        received_at  BIGINT NOT NULL,
        statistics   TEXT,
        event_count  BIGINT NOT NULL,
        unhandled    BIGINT NOT NULL,
        unknown_type TEXT,
        events       TEXT NOT NULL,
        PRIMARY KEY (scale_set, generation, message_id)
    );
    CREATE INDEX scale_set_messages_received ON scale_set_messages (received_at);

    CREATE TABLE scale_set_jobs (
        scale_set         TEXT NOT NULL,
        job_id            TEXT NOT NULL,
        runner_request_id BIGINT NOT NULL,
        state             TEXT NOT NULL
                          CHECK (state IN ('available', 'assigned', 'started', 'completed')),
        repository        TEXT NOT NULL,
        workflow_run_id   BIGINT,
        display_name      TEXT NOT NULL,
        labels            TEXT NOT NULL,
        runner_name       TEXT,
        result            TEXT,
        first_seen        BIGINT NOT NULL,
        updated_at        BIGINT NOT NULL,
        message_id        BIGINT NOT NULL,
        unhandled         TEXT,
        PRIMARY KEY (scale_set, job_id)
    );
    CREATE INDEX scale_set_jobs_updated ON scale_set_jobs (updated_at);
    CREATE INDEX scale_set_jobs_job ON scale_set_jobs (job_id);
    "#,
    // v12: when a concluded attempt's runtime was removed and its uid released (see SQLite's
    // v12).
    r#"
    ALTER TABLE attempts ADD COLUMN released_at BIGINT;
    DROP INDEX attempts_uid_held;
    CREATE UNIQUE INDEX attempts_uid_held ON attempts (uid)
        WHERE state != 'cleaned' AND released_at IS NULL AND uid IS NOT NULL;
    "#,
    // v13: the image each attempt's runner ran (see SQLite's v13).
    r#"
    ALTER TABLE attempts ADD COLUMN image TEXT CHECK (image ~ '^sha256:[0-9a-f]{64}$');
    "#,
    // v14: what each attempt's runner asked for and reached (see SQLite's v14).
    r#"
    CREATE TABLE attempt_egress (
        attempt_id  TEXT PRIMARY KEY NOT NULL
                    REFERENCES attempts (attempt_id) ON DELETE CASCADE,
        record      JSONB NOT NULL,
        updated_at  BIGINT NOT NULL
    );
    "#,
    // v15: each attempt's shape and usage, and the device holds (see SQLite's v15). The
    // constraints spanning columns are the table's.
    r#"
    ALTER TABLE attempts ADD COLUMN shape_labels JSONB
        CHECK (jsonb_typeof(shape_labels) = 'array');
    ALTER TABLE attempts ADD COLUMN shape_cpu_millis BIGINT CHECK (shape_cpu_millis >= 0);
    ALTER TABLE attempts ADD COLUMN shape_memory BIGINT CHECK (shape_memory >= 0);
    ALTER TABLE attempts ADD COLUMN shape_disk BIGINT CHECK (shape_disk >= 0);
    ALTER TABLE attempts ADD COLUMN shape_devices JSONB
        CHECK (jsonb_typeof(shape_devices) = 'array');
    ALTER TABLE attempts ADD CONSTRAINT attempts_shape_whole
        CHECK ((shape_labels IS NULL) = (shape_devices IS NULL)
               AND (shape_labels IS NULL) = (shape_cpu_millis IS NULL)
               AND (shape_labels IS NULL) = (shape_memory IS NULL)
               AND (shape_labels IS NULL) = (shape_disk IS NULL));
    ALTER TABLE attempts ADD COLUMN usage_peak_memory BIGINT CHECK (usage_peak_memory >= 0);
    ALTER TABLE attempts ADD COLUMN usage_cpu_usec BIGINT CHECK (usage_cpu_usec >= 0);
    ALTER TABLE attempts ADD COLUMN usage_at BIGINT;
    ALTER TABLE attempts ADD CONSTRAINT attempts_usage_at
        CHECK (usage_at IS NOT NULL OR (usage_peak_memory IS NULL AND usage_cpu_usec IS NULL));

    CREATE TABLE device_holds (
        device      TEXT PRIMARY KEY NOT NULL CHECK (device != ''),
        attempt_id  TEXT NOT NULL REFERENCES attempts (attempt_id) ON DELETE CASCADE,
        held_at     BIGINT NOT NULL
    );
    CREATE INDEX device_holds_attempt ON device_holds (attempt_id);
    "#,
];

// The two dialects move together: a migration added to one is added to the other.
const _: () = assert!(MIGRATIONS.len() as i64 == SCHEMA_VERSION);

/// The advisory lock every migrating process takes (any fixed number; "rm" in ASCII).
const MIGRATION_LOCK: i64 = 0x726d;

/// The version the database is at (0: never migrated).
pub(crate) fn version(client: &mut Client) -> Result<i64, JournalError> {
    let exists: bool = client
        .query_one("SELECT to_regclass('rm_schema_version') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let row = client.query_opt("SELECT version FROM rm_schema_version", &[])?;
    Ok(row.map_or(0, |row| row.get(0)))
}

/// Refuses a database not at this build's version: a newer one with [`JournalError::PgTooNew`],
/// an older (or empty) one with what to run. For the connections that only read and write rows
/// (readers, the fleet); the writer migrates.
pub(crate) fn require_current(client: &mut Client) -> Result<(), JournalError> {
    match version(client)? {
        found if found > SCHEMA_VERSION => Err(JournalError::PgTooNew {
            found,
            supported: SCHEMA_VERSION,
        }),
        found if found < SCHEMA_VERSION => Err(JournalError::Commit(format!(
            "the PostgreSQL journal is at schema version {found}, this rm-agent reads \
             {SCHEMA_VERSION}; start `rm-agent receive` once to migrate it"
        ))),
        _ => Ok(()),
    }
}

/// Applies every migration the database has not seen yet.
pub(crate) fn migrate(client: &mut Client) -> Result<(), JournalError> {
    // A database already at this version needs nothing, not even the version table's
    // `CREATE ... IF NOT EXISTS` (which PostgreSQL checks against the schema's CREATE right):
    // a role with rights on the tables alone may start a receiver on it.
    if version(client)? == SCHEMA_VERSION {
        return Ok(());
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let target = index as i64 + 1;
        let mut tx = client.transaction()?;
        // Another receiver may be migrating: wait for it, then read the version again. The
        // version table is made under the lock too (IF NOT EXISTS alone races).
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS rm_schema_version (
                 one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
                 version BIGINT NOT NULL
             )",
        )?;
        let found: i64 = tx
            .query_opt("SELECT version FROM rm_schema_version", &[])?
            .map_or(0, |row| row.get(0));
        if found > SCHEMA_VERSION {
            return Err(JournalError::PgTooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        if found >= target {
            continue;
        }
        tx.batch_execute(sql)?;
        tx.execute(
            "INSERT INTO rm_schema_version (one, version) VALUES (TRUE, $1)
             ON CONFLICT (one) DO UPDATE SET version = excluded.version",
            &[&target],
        )?;
        tx.commit()?;
        tracing::info!(version = target, "PostgreSQL journal schema migrated");
    }
    Ok(())
}
