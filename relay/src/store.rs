//! The relay's SQLite file (`relay.db` in the data directory): opening it with the settings the
//! guarantees rest on, the one writer connection and a small pool of readers for the async side,
//! and every query. Nothing here caches what another process may change: `channel` commands
//! write the same file while `serve` runs, so channels and tokens are read at each use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::Connection;

use crate::schema::{self, SchemaError};

/// The database's file name inside the data directory.
pub const DB_FILE: &str = "relay.db";
/// The file `serve` holds an exclusive `flock` on for as long as it runs, so a second `serve`
/// on the same data directory (which would wake only its own streams) refuses to start. The
/// `channel` commands do not take it: they work beside a running `serve`.
pub const LOCK_FILE: &str = "serve.lock";
/// How long a connection waits for another's write lock (a `channel` command beside `serve`).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Between tries to switch a new file to WAL while another connection is opening it.
const WAL_SWITCH_RETRY: Duration = Duration::from_millis(10);
/// Idle reader connections kept open; streams beyond this open and close their own.
const READER_POOL_MAX: usize = 8;

mod queries;
pub use queries::*;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the data directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the relay database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("the relay database {path}: {source}")]
    Schema { path: PathBuf, source: SchemaError },
    #[error(
        "another rm-relay serve already uses the data directory {dir}{holder} (it holds {dir}/serve.lock): stop it, or give this one another --data-dir"
    )]
    Locked { dir: PathBuf, holder: String },
    #[error("cannot lock the data directory {dir} ({dir}/serve.lock): {source}")]
    Lock {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the relay database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("a database task stopped: {0}")]
    Task(String),
}

/// Opens a connection: WAL so readers never block the writer, `synchronous=FULL` so a commit
/// is on disk before anyone is told so.
fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Switching a new file needs an exclusive lock and SQLite answers BUSY at once instead of
    // waiting, so retry for as long as the busy timeout would have waited.
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mode: String = loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(err, _))
                if err.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(WAL_SWITCH_RETRY);
            }
            result => break result?,
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode is {mode}, WAL is required"
        )));
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// Opens (creating the directory and the file if needed) and migrates the database: what the
/// `channel` commands use directly, and what [`Store::open`] starts from.
pub fn open(data_dir: &Path) -> Result<Connection, StoreError> {
    let path = data_dir.join(DB_FILE);
    let open_err = |source| StoreError::Open {
        path: path.clone(),
        source,
    };
    create_private_dir(data_dir).map_err(|source| StoreError::Dir {
        path: data_dir.to_owned(),
        source,
    })?;
    private_files(data_dir).map_err(|source| StoreError::Dir {
        path: data_dir.to_owned(),
        source,
    })?;
    let mut conn = open_connection(&path).map_err(open_err)?;
    schema::migrate(&mut conn).map_err(|source| StoreError::Schema {
        path: path.clone(),
        source,
    })?;
    Ok(conn)
}

/// Held by a running `serve`: the exclusive lock on [`LOCK_FILE`], released when the process
/// ends however it ends (the kernel drops a `flock` with its descriptor).
#[derive(Debug)]
pub struct InstanceLock {
    _file: std::fs::File,
}

/// Takes the data directory for this `serve` (creating the directory if needed), or says which
/// process has it.
pub fn lock_instance(data_dir: &Path) -> Result<InstanceLock, StoreError> {
    use std::io::{Read, Seek, Write};
    let lock_err = |source| StoreError::Lock {
        dir: data_dir.to_owned(),
        source,
    };
    create_private_dir(data_dir).map_err(|source| StoreError::Dir {
        path: data_dir.to_owned(),
        source,
    })?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(data_dir.join(LOCK_FILE)).map_err(lock_err)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            let holder = if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
                format!(" (pid {pid})")
            } else {
                String::new()
            };
            return Err(StoreError::Locked {
                dir: data_dir.to_owned(),
                holder,
            });
        }
        Err(std::fs::TryLockError::Error(err)) => return Err(lock_err(err)),
    }
    // The holder's pid, for the message a second `serve` prints; the lock is what counts, so
    // a failure here (a full disk) only costs the message its pid.
    let pid = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    if let Err(err) = pid {
        tracing::debug!(error = %err, "cannot write the pid into the lock file");
    }
    Ok(InstanceLock { _file: file })
}

/// The data directory holds delivery bodies and token digests: only its owner reads it. A new
/// one is created `0700`; one that already exists with any group or other bit (made by hand or
/// by a tool under umask 022) is repaired to `0700`, with a warning naming it.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    repair_mode(dir, 0o700)
}

/// The files of the data directory, as `0600`. `relay.db` is created here (empty: SQLite takes
/// an empty file for a new database) so it never exists with the umask's mode, and SQLite gives
/// `-wal` and `-shm` the mode of the database file; any of them already there with a group or
/// other bit is repaired, with a warning.
fn private_files(dir: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    drop(options.open(dir.join(DB_FILE))?);
    for name in [DB_FILE, "relay.db-wal", "relay.db-shm", LOCK_FILE] {
        match repair_mode(&dir.join(name), 0o600) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

/// The mode a data-directory entry should get instead of `mode`, if it lets anyone but its
/// owner in: `private` (`0700` for the directory, `0600` for a file), else `None` (an entry
/// that is stricter than `private` is left as it is).
pub fn repaired_mode(mode: u32, private: u32) -> Option<u32> {
    (mode & 0o077 != 0).then_some(private)
}

/// chmods `path` to `private` when [`repaired_mode`] says so, and logs the repair.
fn repair_mode(path: &Path, private: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
        if let Some(repaired) = repaired_mode(mode, private) {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(repaired))?;
            tracing::warn!(
                path = %path.display(),
                was = format_args!("{mode:04o}"),
                now = format_args!("{repaired:04o}"),
                "repaired the mode of the relay's data: other users could read deliveries and token digests"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (path, private);
    Ok(())
}

/// The database for the async server: one writer (SQLite has one anyway), pooled readers, each
/// used on the blocking pool.
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    writer: Arc<Mutex<Connection>>,
    readers: Arc<Mutex<Vec<Connection>>>,
}

impl Store {
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        let writer = open(data_dir)?;
        Ok(Store {
            path: data_dir.join(DB_FILE),
            writer: Arc::new(Mutex::new(writer)),
            readers: Arc::new(Mutex::new(Vec::new())),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the writer connection, on the blocking pool.
    pub async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn).map_err(StoreError::from)
        })
        .await
        .map_err(|err| StoreError::Task(err.to_string()))?
    }

    /// `/healthz`'s check, which writes nothing: the file answers a read, and the writer
    /// connection can be taken (it is not held by a write that hangs). An ingest that waits
    /// for the writer waits as long as this does.
    pub async fn check_health(&self) -> Result<(), StoreError> {
        self.read(|conn| check_readable(conn).map(drop)).await?;
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let conn = writer.lock().unwrap_or_else(PoisonError::into_inner);
            // A write left open would hold SQLite's write lock for good.
            if conn.is_autocommit() {
                Ok(())
            } else {
                Err(StoreError::Task(
                    "the writer connection is inside a transaction".to_owned(),
                ))
            }
        })
        .await
        .map_err(|err| StoreError::Task(err.to_string()))?
    }

    /// Runs `f` on a reader connection, on the blocking pool.
    pub async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = readers.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let conn = match pooled {
                Some(conn) => conn,
                None => open_connection(&path)?,
            };
            let result = f(&conn);
            let mut idle = readers.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < READER_POOL_MAX {
                idle.push(conn);
            }
            result.map_err(StoreError::from)
        })
        .await
        .map_err(|err| StoreError::Task(err.to_string()))?
    }
}

#[cfg(test)]
mod tests;
