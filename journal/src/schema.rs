//! The journal's schema as an ordered list of migrations. `PRAGMA user_version` records how many
//! have been applied; each runs in its own transaction, so a crash mid-migration leaves the file
//! at the previous version. Migrations are only ever appended, never edited.

use std::path::Path;

use rusqlite::Connection;

use crate::JournalError;

/// Migration `n` (0-based) takes the schema from version `n` to `n + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // v1: deliveries, jobs, installations and their repositories.
    r#"
    CREATE TABLE deliveries (
        id            INTEGER PRIMARY KEY,
        guid          TEXT NOT NULL UNIQUE,
        event         TEXT NOT NULL,
        action        TEXT,
        source        TEXT NOT NULL,
        received_at   INTEGER NOT NULL,          -- ms since the Unix epoch
        headers       TEXT NOT NULL,             -- JSON object of the headers kept
        body          BLOB,                      -- exact bytes; NULL once past retention
        outcome       TEXT NOT NULL CHECK (outcome IN ('applied', 'duplicate', 'ignored', 'rejected')),
        reason        TEXT,
        replayed_at   INTEGER
    );
    CREATE INDEX deliveries_received_at ON deliveries (received_at);
    -- Only rejected deliveries are looked up by outcome (status, replay); a partial index
    -- costs nothing on the hot path, where nearly every delivery is applied.
    CREATE INDEX deliveries_rejected ON deliveries (received_at) WHERE outcome = 'rejected';

    CREATE TABLE jobs (
        job_id          INTEGER PRIMARY KEY,      -- workflow_job.id
        run_id          INTEGER NOT NULL,
        run_attempt     INTEGER NOT NULL,
        repository      TEXT NOT NULL,            -- owner/name
        installation_id INTEGER,
        labels          TEXT NOT NULL,            -- JSON array, as GitHub sent them
        workflow_name   TEXT,
        job_name        TEXT,
        state           TEXT NOT NULL CHECK (state IN ('waiting', 'queued', 'in_progress', 'completed')),
        state_rank      INTEGER NOT NULL,
        conclusion      TEXT,
        runner_name     TEXT,
        runner_id       INTEGER,
        source          TEXT NOT NULL,            -- where the current state was learned
        first_seen_at   INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL
    );
    CREATE INDEX jobs_state ON jobs (state_rank, updated_at);

    CREATE TABLE installations (
        id                   INTEGER PRIMARY KEY,
        account              TEXT,
        account_type         TEXT,
        repository_selection TEXT,
        suspended            INTEGER NOT NULL DEFAULT 0,
        removed              INTEGER NOT NULL DEFAULT 0,
        updated_at           INTEGER NOT NULL
    );

    CREATE TABLE installation_repositories (
        installation_id INTEGER NOT NULL REFERENCES installations (id) ON DELETE CASCADE,
        repository_id   INTEGER NOT NULL,
        full_name       TEXT NOT NULL,
        PRIMARY KEY (installation_id, repository_id)
    );
    "#,
    // v2: runner attempts, one row per runner this host starts, written before any effect
    // outside the process (ARCHITECTURE guarantee 3). The JIT configuration is never stored.
    // `stop_intent` and `reason` are closed sets in Rust but carry no CHECK, so a new kind needs
    // no table rebuild; `state` and `outcome` are the lifecycle itself and are checked here.
    r#"
    CREATE TABLE attempts (
        attempt_id       TEXT PRIMARY KEY NOT NULL      -- 32 lowercase hex
                         CHECK (length(attempt_id) = 32 AND attempt_id NOT GLOB '*[^0-9a-f]*'),
        policy           TEXT NOT NULL,                 -- [[policy]] name when allocated
        runner_name      TEXT NOT NULL UNIQUE           -- rm-<host>-<first 12 hex of the id>
                         CHECK (runner_name GLOB ('rm-?*-' || substr(attempt_id, 1, 12))),
        workspace        TEXT NOT NULL CHECK (workspace IN ('ephemeral', 'persistent')),
        runtime_dir      TEXT NOT NULL,                 -- what cleanup removes or scrubs
        state            TEXT NOT NULL CHECK (state IN ('allocated', 'jit_received', 'starting',
                             'idle', 'busy', 'finished', 'failed', 'orphaned', 'cleaned')),
        state_changed_at INTEGER NOT NULL,              -- when `state` was entered: the timers
        outcome          TEXT CHECK (outcome IN ('completed_job', 'idle_exit', 'failed',
                             'orphaned')),
        reason           TEXT,                          -- failure kind, snake_case
        detail           TEXT,                          -- one sentence for the operator
        runner_id        INTEGER,                       -- GitHub's id, from the JIT response
        job_id           INTEGER,                       -- workflow_job.id it took
        pid              INTEGER,                       -- Runner.Listener
        pid_start_time   INTEGER,                       -- /proc stat field 22: pid reuse check
        stop_intent      TEXT,                          -- why it is being stopped
        stop_intent_at   INTEGER,
        created_at       INTEGER NOT NULL,              -- ms since the Unix epoch
        updated_at       INTEGER NOT NULL,
        CHECK ((outcome IS NULL) =
               (state IN ('allocated', 'jit_received', 'starting', 'idle', 'busy'))),
        CHECK (state != 'finished' OR outcome IN ('completed_job', 'idle_exit')),
        CHECK (state != 'failed' OR outcome = 'failed'),
        CHECK (state != 'orphaned' OR outcome = 'orphaned'),
        CHECK ((pid IS NULL) = (pid_start_time IS NULL)),
        CHECK ((stop_intent IS NULL) = (stop_intent_at IS NULL))
    );
    -- Capacity: live attempts per policy and host-wide (allocation reads it under its lock).
    CREATE INDEX attempts_live ON attempts (policy, state)
        WHERE state IN ('allocated', 'jit_received', 'starting', 'idle', 'busy');
    -- The workspace fence: two attempts never share a runtime directory (or persistent slot)
    -- until the earlier one is cleaned. Also what supervision walks (everything not cleaned).
    CREATE UNIQUE INDEX attempts_uncleaned_runtime ON attempts (runtime_dir)
        WHERE state != 'cleaned';
    CREATE INDEX attempts_created ON attempts (created_at);
    CREATE INDEX attempts_cleaned ON attempts (state_changed_at) WHERE state = 'cleaned';
    CREATE INDEX attempts_job ON attempts (job_id) WHERE job_id IS NOT NULL;
    "#,
    // v3: what the polling fallback needs. On `jobs`: when a delivery first announced the job
    // (webhook, relay or redelivery), when a poll first saw it, and when a stale-job check last
    // asked GitHub about it; jobs already journalled came from deliveries. `poll_cursors` keeps
    // named positions (the newest hook delivery examined), `redeliveries` every GUID the agent
    // asked GitHub to send again, so each is asked for once.
    r#"
    ALTER TABLE jobs ADD COLUMN announced_at INTEGER;
    ALTER TABLE jobs ADD COLUMN polled_at INTEGER;
    ALTER TABLE jobs ADD COLUMN checked_at INTEGER;
    UPDATE jobs SET announced_at = first_seen_at WHERE source != 'poll';
    CREATE INDEX jobs_queued ON jobs (updated_at) WHERE state = 'queued';

    CREATE TABLE poll_cursors (
        name       TEXT PRIMARY KEY NOT NULL,
        value      INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );

    CREATE TABLE redeliveries (
        guid         TEXT PRIMARY KEY NOT NULL,   -- X-GitHub-Delivery
        delivery_id  INTEGER NOT NULL,            -- the hook delivery asked for again
        requested_at INTEGER NOT NULL
    );
    CREATE INDEX redeliveries_requested_at ON redeliveries (requested_at);
    "#,
    // v4: the boot a runner's pid and start time belong to (`/proc/sys/kernel/random/boot_id`).
    // Start times count from boot, so after a reboot a new process could carry the same pair;
    // with the boot, the identity names one process for the host's lifetime.
    r#"
    ALTER TABLE attempts ADD COLUMN pid_boot_id TEXT;
    "#,
    // v5: the execution backend each attempt was started under (CONTRACT §7), chosen at
    // allocation and never changed, so cleanup undoes exactly what that backend did; the runner
    // uid it holds from allocation until `cleaned` (two uncleaned attempts never hold one uid:
    // the unique index is the fence), and the cgroup it runs in. Earlier attempts ran as the
    // agent's own user.
    r#"
    ALTER TABLE attempts ADD COLUMN isolation TEXT NOT NULL DEFAULT 'none'
        CHECK (isolation IN ('none', 'user'));
    ALTER TABLE attempts ADD COLUMN uid INTEGER;
    ALTER TABLE attempts ADD COLUMN cgroup TEXT;
    CREATE UNIQUE INDEX attempts_uid_held ON attempts (uid)
        WHERE state != 'cleaned' AND uid IS NOT NULL;
    "#,
    // v6: a delivery's outcome may be `stale`: authentic, but older by its own dates than
    // anything GitHub would still act on (an old body posted again under a fresh GUID). SQLite
    // cannot change a CHECK in place, so the table is rebuilt with its rows, ids and indexes.
    r#"
    CREATE TABLE deliveries_v6 (
        id            INTEGER PRIMARY KEY,
        guid          TEXT NOT NULL UNIQUE,
        event         TEXT NOT NULL,
        action        TEXT,
        source        TEXT NOT NULL,
        received_at   INTEGER NOT NULL,
        headers       TEXT NOT NULL,
        body          BLOB,
        outcome       TEXT NOT NULL
                      CHECK (outcome IN ('applied', 'duplicate', 'ignored', 'rejected', 'stale')),
        reason        TEXT,
        replayed_at   INTEGER
    );
    INSERT INTO deliveries_v6 (id, guid, event, action, source, received_at, headers, body,
                               outcome, reason, replayed_at)
        SELECT id, guid, event, action, source, received_at, headers, body, outcome, reason,
               replayed_at
        FROM deliveries;
    DROP TABLE deliveries;
    ALTER TABLE deliveries_v6 RENAME TO deliveries;
    CREATE INDEX deliveries_received_at ON deliveries (received_at);
    CREATE INDEX deliveries_rejected ON deliveries (received_at) WHERE outcome = 'rejected';
    "#,
    // v7: the ends of a job's wait (CONTRACT §8). On `jobs`: when GitHub queued it (its
    // `created_at`) and when it started (GitHub's `started_at` of a started sighting, else the
    // time the journal learned it started); on `attempts`: when the runner process was started
    // (the `starting` transition, whose `state_changed_at` later states overwrite). Rows from
    // before keep what the journal can still say: a job in progress entered that state at its
    // `updated_at`, an attempt still starting at its `state_changed_at`; the rest stay unknown
    // and are no sample. Plain columns and a plain index, nothing SQLite-only.
    r#"
    ALTER TABLE jobs ADD COLUMN queued_at INTEGER;
    ALTER TABLE jobs ADD COLUMN started_at INTEGER;
    ALTER TABLE attempts ADD COLUMN started_at INTEGER;
    UPDATE jobs SET started_at = updated_at WHERE state = 'in_progress';
    UPDATE attempts SET started_at = state_changed_at WHERE state = 'starting';
    CREATE INDEX jobs_started ON jobs (started_at) WHERE started_at IS NOT NULL;
    "#,
    // v8: the fleet (CONTRACT §9, `crate::fleet`). `hosts`: one lease per host, renewed while the
    // host lives; a host whose `expires_at` has passed is dead for the fleet. `claims`: at most
    // one row per job (the primary key is the fence), the host that claimed it under its lease
    // and, once known, the runner started for it; a claim counts while its host's lease holds
    // and its job is not completed. `leaders`: one lease per role ("the poller of a target"),
    // held by one host until it expires. Times are ms since the Unix epoch, read from the
    // database server's clock on PostgreSQL.
    r#"
    CREATE TABLE hosts (
        host          TEXT PRIMARY KEY NOT NULL,
        registered_at INTEGER NOT NULL,         -- when this lease began (a new one after expiry)
        renewed_at    INTEGER NOT NULL,
        expires_at    INTEGER NOT NULL,
        labels        TEXT NOT NULL,            -- JSON array, for status
        policies      TEXT NOT NULL             -- JSON array of [[policy]] names, for status
    );

    CREATE TABLE claims (
        job_id      INTEGER PRIMARY KEY NOT NULL,   -- workflow_job.id: one claim per job
        host        TEXT NOT NULL,
        policy      TEXT NOT NULL,                  -- [[policy]] name: the fleet max_runners
        runner_name TEXT,                           -- once the host has named the runner
        claimed_at  INTEGER NOT NULL
    );
    CREATE INDEX claims_host ON claims (host);
    CREATE INDEX claims_policy ON claims (policy);

    CREATE TABLE leaders (
        role        TEXT PRIMARY KEY NOT NULL,      -- what is led, e.g. one target's poller
        host        TEXT NOT NULL,
        acquired_at INTEGER NOT NULL,
        renewed_at  INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL
    );
    "#,
    // v9: what the fleet's hosts sent GitHub that it counts per installation, not per host
    // (`crate::fleet`, `Fleet::reserve`): one row per request reserved in a shared window, kept
    // until it has left the longest window. Times as in v8.
    r#"
    CREATE TABLE spends (
        scope   TEXT NOT NULL,                  -- what GitHub counts together, e.g. one installation's creations
        sent_at INTEGER NOT NULL,
        host    TEXT NOT NULL                   -- who reserved it, for the troubleshooter
    );
    CREATE INDEX spends_scope ON spends (scope, sent_at);
    "#,
    // v10: re-runs of jobs the infrastructure killed (issue 28, `crate::reruns`): at most one
    // row per job (the primary key is the fence), written `intended` before anything is sent,
    // moved to `sending` (compare-and-set) before the request, then to what GitHub answered. A
    // row found `sending` at start becomes `unknown` and is never sent again. `attempt_id` names
    // the attempt whose conclusion asked for it (no foreign key: retention removes attempts).
    r#"
    CREATE TABLE reruns (
        job_id      INTEGER PRIMARY KEY NOT NULL,   -- workflow_job.id re-run: one row per job
        attempt_id  TEXT NOT NULL,
        policy      TEXT NOT NULL,                  -- [[policy]] name of the attempt
        reason      TEXT NOT NULL,                  -- the attempt's failure reason, snake_case
        repository  TEXT NOT NULL,                  -- owner/name, where the request goes
        run_id      INTEGER NOT NULL,
        run_attempt INTEGER NOT NULL,               -- the job's run attempt when it was decided
        state       TEXT NOT NULL
                    CHECK (state IN ('intended', 'sending', 'sent', 'refused', 'unknown')),
        detail      TEXT,                           -- one sentence: GitHub's answer, or why unknown
        created_at  INTEGER NOT NULL,
        updated_at  INTEGER NOT NULL
    );
    CREATE INDEX reruns_attempt ON reruns (attempt_id);
    CREATE INDEX reruns_open ON reruns (state) WHERE state IN ('intended', 'sending');
    "#,
    // v11: GitHub's runner scale sets as this host's listener sees them (issue 29,
    // `crate::scale_sets`). `scale_sets`: one row per scale set, its id, the session held (written
    // before it is used, so a successor can delete a crashed agent's session), the message
    // cursor and the last statistics. `scale_set_messages`: every message journalled before it
    // is acknowledged; the primary key recognises a redelivery within a generation (a re-created
    // scale set numbers its messages anew, `reset_cursor` starts a new generation).
    // `scale_set_jobs`: one row per job, moved forward only by its events. The queue's token and
    // JIT configurations are never stored.
    r#"
    CREATE TABLE scale_sets (
        name            TEXT PRIMARY KEY NOT NULL,  -- the scale set's configured name
        scale_set_id    INTEGER,                    -- GitHub's id, new when re-created
        session_id      TEXT,                       -- the session held; NULL once closed
        session_at      INTEGER,
        generation      INTEGER NOT NULL DEFAULT 0, -- cursor resets so far
        last_message_id INTEGER NOT NULL DEFAULT 0, -- highest id journalled in this generation
        last_message_at INTEGER,
        statistics      TEXT,                       -- JSON object, the last known
        statistics_at   INTEGER,
        messages        INTEGER NOT NULL DEFAULT 0, -- journalled so far, every generation
        note            TEXT,                       -- one sentence for the operator
        note_at         INTEGER,
        updated_at      INTEGER NOT NULL
    );

    CREATE TABLE scale_set_messages (
        scale_set    TEXT NOT NULL,
        generation   INTEGER NOT NULL,
        message_id   INTEGER NOT NULL,
        received_at  INTEGER NOT NULL,
        statistics   TEXT,                          -- JSON object; NULL when GitHub sent null
        event_count  INTEGER NOT NULL,
        unhandled    INTEGER NOT NULL,              -- events that named no job
        unknown_type TEXT,                          -- a top-level type not understood
        events       TEXT NOT NULL,                 -- JSON array of the events, for audit
        PRIMARY KEY (scale_set, generation, message_id)
    );
    CREATE INDEX scale_set_messages_received ON scale_set_messages (received_at);

    CREATE TABLE scale_set_jobs (
        scale_set         TEXT NOT NULL,
        job_id            TEXT NOT NULL,            -- GitHub's jobId (a string)
        runner_request_id INTEGER NOT NULL,
        state             TEXT NOT NULL
                          CHECK (state IN ('available', 'assigned', 'started', 'completed')),
        repository        TEXT NOT NULL,            -- owner/name, may be empty
        workflow_run_id   INTEGER,
        display_name      TEXT NOT NULL,
        labels            TEXT NOT NULL,            -- JSON array
        runner_name       TEXT,
        result            TEXT,
        first_seen        INTEGER NOT NULL,
        updated_at        INTEGER NOT NULL,
        message_id        INTEGER NOT NULL,         -- the message that last moved it
        unhandled         TEXT,                     -- why an event for it was not handled
        PRIMARY KEY (scale_set, job_id)
    );
    CREATE INDEX scale_set_jobs_updated ON scale_set_jobs (updated_at);
    CREATE INDEX scale_set_jobs_job ON scale_set_jobs (job_id);
    "#,
    // v12: when a concluded attempt was released (issue 38): its processes proven gone, its
    // runtime removed (or its slot scrubbed) and its runner uid free for the next runner, while
    // its registration may still wait for GitHub to let go of it (a runner GitHub holds busy);
    // the attempt is `cleaned` once that is settled too. The uid fence counts only attempts not
    // released: a released attempt never touches its uid again.
    r#"
    ALTER TABLE attempts ADD COLUMN released_at INTEGER;
    DROP INDEX attempts_uid_held;
    CREATE UNIQUE INDEX attempts_uid_held ON attempts (uid)
        WHERE state != 'cleaned' AND released_at IS NULL AND uid IS NOT NULL;
    "#,
    // v13: the image each attempt's runner ran (issue 40): the image's id (its config digest,
    // `sha256:<64 hex>`, the key of the image store), chosen at allocation and never changed;
    // NULL for a runner on the host's own root, as every earlier attempt was.
    r#"
    ALTER TABLE attempts ADD COLUMN image TEXT
        CHECK (image IS NULL OR (length(image) = 71 AND substr(image, 1, 7) = 'sha256:'
                                 AND substr(image, 8) NOT GLOB '*[^0-9a-f]*'));
    "#,
    // v14: what each attempt's runner asked for and reached under `policy.egress` (issue 41):
    // one JSON record per attempt (`rm_egress::record::Record`, bounded there), rewritten as
    // the agent flushes its resolver's tally; gone with its attempt. A table of its own, so
    // that reading attempts never reads it.
    r#"
    CREATE TABLE attempt_egress (
        attempt_id  TEXT PRIMARY KEY NOT NULL
                    REFERENCES attempts (attempt_id) ON DELETE CASCADE,
        record      TEXT NOT NULL CHECK (json_valid(record)),
        updated_at  INTEGER NOT NULL
    );
    "#,
    // v15: what each attempt's runner takes from its host, the devices it holds, and what it
    // used (issue 42, `crate::shapes`). On `attempts`: the shape, written with the row and never
    // changed (its labels and device ids as JSON arrays of strings, CPU in thousandths, memory
    // and disk in bytes; all NULL together for an attempt of no shape, as every earlier one
    // is), and the usage recorded once at the runner's end (`usage_at`; either reading may be
    // unknown). `device_holds`: one row per device held, the primary key the fence, inserted in
    // the attempt's creating transaction and deleted in the one that releases or cleans it. The
    // file is this host's, so a hold names no host.
    r#"
    ALTER TABLE attempts ADD COLUMN shape_labels TEXT
        CHECK (shape_labels IS NULL OR json_type(shape_labels) = 'array');
    ALTER TABLE attempts ADD COLUMN shape_cpu_millis INTEGER CHECK (shape_cpu_millis >= 0);
    ALTER TABLE attempts ADD COLUMN shape_memory INTEGER CHECK (shape_memory >= 0);
    ALTER TABLE attempts ADD COLUMN shape_disk INTEGER CHECK (shape_disk >= 0);
    ALTER TABLE attempts ADD COLUMN shape_devices TEXT
        CHECK (shape_devices IS NULL OR json_type(shape_devices) = 'array')
        CHECK ((shape_labels IS NULL) = (shape_devices IS NULL)
               AND (shape_labels IS NULL) = (shape_cpu_millis IS NULL)
               AND (shape_labels IS NULL) = (shape_memory IS NULL)
               AND (shape_labels IS NULL) = (shape_disk IS NULL));
    ALTER TABLE attempts ADD COLUMN usage_peak_memory INTEGER CHECK (usage_peak_memory >= 0);
    ALTER TABLE attempts ADD COLUMN usage_cpu_usec INTEGER CHECK (usage_cpu_usec >= 0);
    ALTER TABLE attempts ADD COLUMN usage_at INTEGER
        CHECK (usage_at IS NOT NULL OR (usage_peak_memory IS NULL AND usage_cpu_usec IS NULL));

    CREATE TABLE device_holds (
        device      TEXT PRIMARY KEY NOT NULL CHECK (device != ''),   -- its first node path
        attempt_id  TEXT NOT NULL REFERENCES attempts (attempt_id) ON DELETE CASCADE,
        held_at     INTEGER NOT NULL
    );
    CREATE INDEX device_holds_attempt ON device_holds (attempt_id);
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// Applies every migration the file has not seen yet.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), JournalError> {
    migrate_to(conn, path, SCHEMA_VERSION)
}

/// Applies migrations up to `target`; tests use it to build every earlier version.
pub(crate) fn migrate_to(
    conn: &mut Connection,
    path: &Path,
    target: i64,
) -> Result<(), JournalError> {
    let found = user_version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(JournalError::TooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= found || version > target {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // Another connection (the group writer and the agent's attempt connection open the same
        // file) may have migrated between our read and our write lock.
        if user_version(&tx)? >= version {
            continue;
        }
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
        tracing::info!(version, "journal schema migrated");
    }
    Ok(())
}

/// A reader refuses a file from a newer rm, and one that was never initialised.
pub(crate) fn check_readable(conn: &Connection, path: &Path) -> Result<(), JournalError> {
    match user_version(conn)? {
        0 => Err(JournalError::Missing(path.to_owned())),
        found if found > SCHEMA_VERSION => Err(JournalError::TooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }),
        found if found < SCHEMA_VERSION => Err(JournalError::TooOld {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }),
        _ => Ok(()),
    }
}
