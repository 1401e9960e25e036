//! Opening the SQLite file with the settings every guarantee rests on: WAL so readers never
//! block the writer, `synchronous=FULL` so a commit is on disk before anyone is told so.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::JournalError;
use crate::schema;

/// The journal's file name inside the data directory.
pub const JOURNAL_FILE: &str = "journal.sqlite3";

/// How long a writer waits for another process's write lock (a `deliveries replay` beside a
/// running agent) before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait between tries to switch a new file to WAL while another connection holds it.
const WAL_SWITCH_RETRY: Duration = Duration::from_millis(10);

/// Sets `journal_mode=WAL`. Switching a new file needs an exclusive lock, and SQLite answers
/// `SQLITE_BUSY` at once instead of calling the busy handler when another connection (the
/// agent's attempts, a CLI replay) is opening the same new file, so retry for as long as the
/// busy timeout would have waited.
fn switch_to_wal(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(err, _))
                if err.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(WAL_SWITCH_RETRY);
            }
            result => return result,
        }
    }
}

/// The group writer's page cache, in KiB.
const WRITER_CACHE_KIB: i64 = 64 * 1024;

/// The journal's files' mode: the owner's alone. SQLite gives its WAL and shared-memory files
/// the database file's mode, so this one mode covers all three.
const JOURNAL_MODE: u32 = 0o600;

/// Makes the journal's file private before SQLite opens it, whatever the umask: creates it with
/// [`JOURNAL_MODE`], or takes group and other bits off a file (and its WAL and shared-memory
/// files) that already has them (made by an older rm, by hand, or under umask 022), and says so
/// in the log. Every delivery's body and headers are in it.
pub(crate) fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(JOURNAL_MODE)
        .open(path)
    {
        // The umask may have narrowed the mode, never widened it.
        Ok(_) => return Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err),
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = std::path::PathBuf::from(file);
        let meta = match std::fs::symlink_metadata(&file) {
            Ok(meta) => meta,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_file() && mode & 0o077 != 0 {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode & 0o700))?;
            tracing::warn!(
                file = %file.display(),
                was = format!("{mode:04o}"),
                now = format!("{:04o}", mode & 0o700),
                "repaired the journal's mode: others could read it"
            );
        }
    }
    Ok(())
}

/// Opens (creating if needed) the journal for writing and brings its schema up to date.
pub(crate) fn open_writer(path: &Path) -> Result<Connection, JournalError> {
    let open = |source| JournalError::Open {
        path: path.to_owned(),
        source,
    };
    make_private(path).map_err(|err| {
        open(rusqlite::Error::InvalidParameterName(format!(
            "cannot make the journal private to its owner: {err}"
        )))
    })?;
    let mut conn = Connection::open(path).map_err(open)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open)?;
    let mode = switch_to_wal(&conn).map_err(open)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(open(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode is {mode}, WAL is required"
        ))));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(open)?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(open)?;
    schema::migrate(&mut conn, path)?;
    Ok(conn)
}

/// Opens the group writer's connection: a writer connection that leaves checkpoints to the
/// checkpoint thread, so no commit ever waits for one, and that commits without waiting for the
/// disk: the sync thread (`sync.rs`) flushes the WAL before any caller of the group is answered,
/// while the writer goes on with the next group.
pub(crate) fn open_group_writer(path: &Path) -> Result<Connection, JournalError> {
    let open = |source| JournalError::Open {
        path: path.to_owned(),
        source,
    };
    let conn = open_writer(path)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(open)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(open)?;
    // Delivery GUIDs are random, so each insert lands on a random page of their index; keeping
    // the index in memory spares the writer a read per delivery.
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .map_err(open)?;
    Ok(conn)
}

/// Opens the checkpoint thread's connection to an existing journal.
pub(crate) fn open_checkpointer(path: &Path) -> Result<Connection, JournalError> {
    let open = |source| JournalError::Open {
        path: path.to_owned(),
        source,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(open)?;
    Ok(conn)
}

/// Opens an existing journal read-only. A journal that does not exist is an error that names the
/// path, so a wrong `--data-dir` is noticed instead of showing an empty list.
pub(crate) fn open_reader(path: &Path) -> Result<Connection, JournalError> {
    if !path.exists() {
        return Err(JournalError::Missing(path.to_owned()));
    }
    let open = |source| JournalError::Open {
        path: path.to_owned(),
        source,
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(open)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open)?;
    schema::check_readable(&conn, path)?;
    Ok(conn)
}
