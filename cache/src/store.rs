//! The cache on the host's disk: content-addressed blobs, the SQLite index of entries, staged
//! uploads, and the counters; and the recovery that makes a crash harmless.
//!
//! Layout under [`crate::Settings::dir`]:
//! - `blobs/<sha256 hex>`: an entry's bytes, named by their digest (entries with equal bytes share
//!   one file);
//! - `index.sqlite3` (WAL, `synchronous=FULL`): `entries` (repository, scope, key, version →
//!   digest, size, created, last used), `uploads` (reservations in progress), `job_counters` and
//!   `totals`;
//! - `uploads/<id>/`: the bytes of an upload in progress (`data`, and `blocks/<hex block id>`
//!   until a block list is committed).
//!
//! Crash safety: an entry becomes visible only when its row is committed, and its row is
//! committed only after its blob was fsynced, renamed into `blobs/` and the directory fsynced. So
//! a crash leaves at worst a staged upload or a blob without a row; [`Store::open`] removes every
//! staged upload (files and rows) and every blob no row names, and drops rows whose blob is
//! missing. Eviction deletes the row first and then the file, so it too leaves at worst an
//! unnamed blob.

use std::collections::HashSet;
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension as _, params};
use sha2::{Digest as _, Sha256};

use crate::evict::{self, Bounds, Candidate};
use crate::{CacheError, Counters, DiskReport, Totals};

/// How long SQLite waits for another connection's lock (an `explain` reading counters) before
/// failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Per-job counters older than this are dropped at eviction time: `explain` looks at recent jobs.
pub const JOB_COUNTERS_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// The read size when hashing or copying staged bytes.
const COPY_BUFFER: usize = 1 << 20;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    repository TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    version TEXT NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    last_used_ms INTEGER NOT NULL,
    UNIQUE (repository, scope, key, version)
);
CREATE INDEX IF NOT EXISTS entries_digest ON entries (digest);
CREATE TABLE IF NOT EXISTS uploads (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    repository TEXT NOT NULL,
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    version TEXT NOT NULL,
    attempt TEXT NOT NULL,
    job INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    UNIQUE (repository, scope, key, version)
);
CREATE TABLE IF NOT EXISTS job_counters (
    job INTEGER PRIMARY KEY,
    hits INTEGER NOT NULL DEFAULT 0,
    misses INTEGER NOT NULL DEFAULT 0,
    bytes_up INTEGER NOT NULL DEFAULT 0,
    bytes_down INTEGER NOT NULL DEFAULT 0,
    updated_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS totals (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    hits INTEGER NOT NULL DEFAULT 0,
    misses INTEGER NOT NULL DEFAULT 0,
    bytes_up INTEGER NOT NULL DEFAULT 0,
    bytes_down INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO totals (id) VALUES (1);
";

/// A committed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) id: i64,
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) version: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    pub(crate) created_ms: i64,
}

/// A reservation in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upload {
    pub(crate) id: i64,
    pub(crate) repository: String,
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) version: String,
    pub(crate) attempt: String,
    pub(crate) job: i64,
}

/// What a reservation request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Begin {
    /// A new upload, with its id.
    Started(i64),
    /// An entry with that key and version is already in that scope.
    Exists,
    /// Another live upload holds that key and version in that scope.
    Busy,
}

/// What one reservation names: where, and under which key and version.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot<'a> {
    pub(crate) repository: &'a str,
    pub(crate) scope: &'a str,
    pub(crate) key: &'a str,
    pub(crate) version: &'a str,
}

/// The cache on disk (module doc).
#[derive(Debug)]
pub(crate) struct Store {
    dir: PathBuf,
    /// One connection, and the lock that orders blob renames against eviction's unlinks.
    db: Mutex<Connection>,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CacheError {
    let what = what.into();
    move |source| CacheError::Io { what, source }
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Fsyncs a directory, so a rename or unlink in it is durable.
fn sync_dir(dir: &Path) -> Result<(), CacheError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

/// The SHA-256 (hex) and length of a file.
pub(crate) fn hash_file(path: &Path) -> Result<(String, u64), CacheError> {
    let mut file = fs::File::open(path).map_err(io(format!("opening {}", path.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; COPY_BUFFER];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), size))
}

/// Concatenates `parts` into `out` (created), returning its SHA-256 (hex) and length.
pub(crate) fn concat_files(parts: &[PathBuf], out: &Path) -> Result<(String, u64), CacheError> {
    let mut dest = fs::File::create(out).map_err(io(format!("creating {}", out.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; COPY_BUFFER];
    let mut size = 0u64;
    for part in parts {
        let mut src = fs::File::open(part).map_err(io(format!("opening {}", part.display())))?;
        loop {
            let n = src
                .read(&mut buf)
                .map_err(io(format!("reading {}", part.display())))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            dest.write_all(&buf[..n])
                .map_err(io(format!("writing {}", out.display())))?;
            size += n as u64;
        }
    }
    Ok((hex::encode(hasher.finalize()), size))
}

fn entry_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    Ok(Entry {
        id: row.get(0)?,
        scope: row.get(1)?,
        key: row.get(2)?,
        version: row.get(3)?,
        digest: row.get(4)?,
        size: to_u64(row.get(5)?),
        created_ms: row.get(6)?,
    })
}

const ENTRY_COLUMNS: &str = "id, scope, key, version, digest, size, created_ms";

impl Store {
    /// Opens (creating) the cache at `dir` and recovers it from any crash (module doc).
    pub(crate) fn open(dir: &Path) -> Result<Store, CacheError> {
        for sub in ["blobs", "uploads"] {
            fs::create_dir_all(dir.join(sub))
                .map_err(io(format!("creating {}", dir.join(sub).display())))?;
        }
        let conn = Connection::open(dir.join("index.sqlite3"))?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // A committed entry must survive a power cut: its row is the only thing that makes it
        // visible.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        let store = Store {
            dir: dir.to_owned(),
            db: Mutex::new(conn),
        };
        store.recover()?;
        Ok(store)
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes staged uploads and their rows, blobs no row names, and rows whose blob is gone.
    fn recover(&self) -> Result<(), CacheError> {
        let db = self.db();
        let uploads = self.dir.join("uploads");
        let staged =
            fs::read_dir(&uploads).map_err(io(format!("listing {}", uploads.display())))?;
        for item in staged {
            let path = item
                .map_err(io(format!("listing {}", uploads.display())))?
                .path();
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            removed.map_err(io(format!("removing {}", path.display())))?;
        }
        let dropped = db.execute("DELETE FROM uploads", [])?;
        let named: HashSet<String> = db
            .prepare("SELECT DISTINCT digest FROM entries")?
            .query_map([], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        let blobs = self.dir.join("blobs");
        let mut present = HashSet::new();
        let mut orphans = 0;
        for item in fs::read_dir(&blobs).map_err(io(format!("listing {}", blobs.display())))? {
            let item = item.map_err(io(format!("listing {}", blobs.display())))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if named.contains(&name) {
                present.insert(name);
            } else {
                fs::remove_file(item.path())
                    .map_err(io(format!("removing {}", item.path().display())))?;
                orphans += 1;
            }
        }
        let mut missing = 0;
        for digest in named.difference(&present) {
            missing += db.execute("DELETE FROM entries WHERE digest = ?1", [digest])?;
        }
        sync_dir(&blobs)?;
        if dropped + orphans + missing > 0 {
            tracing::info!(
                staged_uploads = dropped,
                orphaned_blobs = orphans,
                entries_without_blob = missing,
                "cache recovered"
            );
        }
        Ok(())
    }

    /// Where an upload's bytes are staged.
    pub(crate) fn upload_dir(&self, id: i64) -> PathBuf {
        self.dir.join("uploads").join(id.to_string())
    }

    /// Where a blob lives.
    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs").join(digest)
    }

    /// Reserves `slot` for an upload by `attempt`. A reservation older than `stale_before_ms`
    /// (its job gone without finalizing) is dropped and the slot given to the new one.
    pub(crate) fn begin_upload(
        &self,
        slot: Slot<'_>,
        attempt: &str,
        job: i64,
        now_ms: i64,
        stale_before_ms: i64,
    ) -> Result<Begin, CacheError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let exists: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM entries WHERE repository = ?1 AND scope = ?2 AND key = ?3 AND version = ?4)",
            params![slot.repository, slot.scope, slot.key, slot.version],
            |row| row.get(0),
        )?;
        if exists {
            return Ok(Begin::Exists);
        }
        let held: Option<(i64, i64)> = tx
            .query_row(
                "SELECT id, created_ms FROM uploads WHERE repository = ?1 AND scope = ?2 AND key = ?3 AND version = ?4",
                params![slot.repository, slot.scope, slot.key, slot.version],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        let mut stale = None;
        if let Some((id, created_ms)) = held {
            if created_ms >= stale_before_ms {
                return Ok(Begin::Busy);
            }
            tx.execute("DELETE FROM uploads WHERE id = ?1", [id])?;
            stale = Some(id);
        }
        tx.execute(
            "INSERT INTO uploads (repository, scope, key, version, attempt, job, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![slot.repository, slot.scope, slot.key, slot.version, attempt, job, now_ms],
        )?;
        let id = tx.last_insert_rowid();
        tx.commit()?;
        drop(db);
        if let Some(old) = stale {
            let _ = fs::remove_dir_all(self.upload_dir(old));
        }
        let dir = self.upload_dir(id);
        fs::create_dir_all(dir.join("blocks"))
            .map_err(io(format!("creating {}", dir.display())))?;
        Ok(Begin::Started(id))
    }

    /// The upload with that id, if it is still reserved.
    pub(crate) fn upload(&self, id: i64) -> Result<Option<Upload>, CacheError> {
        Ok(self
            .db()
            .query_row(
                "SELECT id, repository, scope, key, version, attempt, job FROM uploads WHERE id = ?1",
                [id],
                |row| {
                    Ok(Upload {
                        id: row.get(0)?,
                        repository: row.get(1)?,
                        scope: row.get(2)?,
                        key: row.get(3)?,
                        version: row.get(4)?,
                        attempt: row.get(5)?,
                        job: row.get(6)?,
                    })
                },
            )
            .optional()?)
    }

    /// The upload reserving `slot`, if any.
    pub(crate) fn find_upload(&self, slot: Slot<'_>) -> Result<Option<Upload>, CacheError> {
        let id: Option<i64> = self
            .db()
            .query_row(
                "SELECT id FROM uploads WHERE repository = ?1 AND scope = ?2 AND key = ?3 AND version = ?4",
                params![slot.repository, slot.scope, slot.key, slot.version],
                |row| row.get(0),
            )
            .optional()?;
        match id {
            Some(id) => self.upload(id),
            None => Ok(None),
        }
    }

    /// Commits upload `id` whose bytes are the file `staged` (digest and size already computed):
    /// fsyncs it, moves it to `blobs/` (or drops it when that blob already exists), fsyncs the
    /// directory, then inserts the entry and deletes the reservation in one transaction. Blocking.
    pub(crate) fn finalize(
        &self,
        id: i64,
        staged: &Path,
        digest: &str,
        size: u64,
        now_ms: i64,
    ) -> Result<i64, CacheError> {
        fs::File::open(staged)
            .and_then(|f| f.sync_all())
            .map_err(io(format!("syncing {}", staged.display())))?;
        let blob = self.blob_path(digest);
        // Under the index lock: eviction unlinks blobs under it too, so a blob found here is not
        // removed before this entry's row names it.
        let mut db = self.db();
        let upload: Option<(String, String, String, String)> = db
            .query_row(
                "SELECT repository, scope, key, version FROM uploads WHERE id = ?1",
                [id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .optional()?;
        let Some((repository, scope, key, version)) = upload else {
            return Err(CacheError::NoUpload(id));
        };
        if blob.exists() {
            fs::remove_file(staged).map_err(io(format!("removing {}", staged.display())))?;
        } else {
            fs::rename(staged, &blob).map_err(io(format!("moving {}", staged.display())))?;
            sync_dir(&self.dir.join("blobs"))?;
        }
        let tx = db.transaction()?;
        tx.execute("DELETE FROM uploads WHERE id = ?1", [id])?;
        tx.execute(
            "INSERT INTO entries (repository, scope, key, version, digest, size, created_ms, last_used_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
            params![repository, scope, key, version, digest, to_i64(size), now_ms],
        )?;
        let entry = tx.last_insert_rowid();
        tx.commit()?;
        drop(db);
        let _ = fs::remove_dir_all(self.upload_dir(id));
        Ok(entry)
    }

    /// GitHub's cache matching: in each read scope in order, the exact `key`, else the newest
    /// entry whose key starts with `key`, else with each restore key in order; all with
    /// `version`. A hit's last use becomes `now_ms`.
    pub(crate) fn lookup(
        &self,
        repository: &str,
        read: &[String],
        key: &str,
        restore_keys: &[String],
        version: &str,
        now_ms: i64,
    ) -> Result<Option<Entry>, CacheError> {
        let db = self.db();
        let exact_sql = format!(
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE repository = ?1 AND scope = ?2 AND version = ?3 AND key = ?4"
        );
        let prefix_sql = format!(
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE repository = ?1 AND scope = ?2 AND version = ?3 \
             AND substr(key, 1, length(?4)) = ?4 ORDER BY created_ms DESC, id DESC LIMIT 1"
        );
        for scope in read {
            let mut found = db
                .query_row(
                    &exact_sql,
                    params![repository, scope, version, key],
                    entry_row,
                )
                .optional()?;
            for prefix in std::iter::once(key).chain(restore_keys.iter().map(String::as_str)) {
                if found.is_some() {
                    break;
                }
                found = db
                    .query_row(
                        &prefix_sql,
                        params![repository, scope, version, prefix],
                        entry_row,
                    )
                    .optional()?;
            }
            if let Some(entry) = found {
                db.execute(
                    "UPDATE entries SET last_used_ms = ?2 WHERE id = ?1",
                    params![entry.id, now_ms],
                )?;
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// The entries of `repository` in the `read` scopes whose key is exactly `key`, newest first.
    pub(crate) fn list(
        &self,
        repository: &str,
        read: &[String],
        key: &str,
    ) -> Result<Vec<Entry>, CacheError> {
        let db = self.db();
        let mut stmt = db.prepare(&format!(
            "SELECT {ENTRY_COLUMNS} FROM entries WHERE repository = ?1 AND scope = ?2 AND key = ?3 ORDER BY created_ms DESC, id DESC"
        ))?;
        let mut all = Vec::new();
        for scope in read {
            for entry in stmt.query_map(params![repository, scope, key], entry_row)? {
                all.push(entry?);
            }
        }
        Ok(all)
    }

    /// The entry with that id, if it still exists.
    pub(crate) fn entry(&self, id: i64) -> Result<Option<Entry>, CacheError> {
        Ok(self
            .db()
            .query_row(
                &format!("SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?1"),
                [id],
                entry_row,
            )
            .optional()?)
    }

    /// Deletes the entries [`evict::victims`] names and the blobs no entry names any more, and
    /// old per-job counters. Returns how many entries went.
    pub(crate) fn evict(&self, bounds: Bounds, now_ms: i64) -> Result<usize, CacheError> {
        let mut db = self.db();
        let candidates: Vec<Candidate> = db
            .prepare("SELECT id, repository, size, last_used_ms FROM entries")?
            .query_map([], |row| {
                Ok(Candidate {
                    id: row.get(0)?,
                    repository: row.get(1)?,
                    size: to_u64(row.get(2)?),
                    last_used_ms: row.get(3)?,
                })
            })?
            .collect::<Result<_, _>>()?;
        let victims = evict::victims(&candidates, now_ms, bounds);
        let keep_ms = i64::try_from(JOB_COUNTERS_KEEP.as_millis()).unwrap_or(i64::MAX);
        let tx = db.transaction()?;
        let mut digests = Vec::new();
        for id in &victims {
            let digest: Option<String> = tx
                .query_row(
                    "DELETE FROM entries WHERE id = ?1 RETURNING digest",
                    [id],
                    |row| row.get(0),
                )
                .optional()?;
            digests.extend(digest);
        }
        tx.execute(
            "DELETE FROM job_counters WHERE updated_ms < ?1",
            [now_ms.saturating_sub(keep_ms)],
        )?;
        tx.commit()?;
        for digest in digests {
            let named: bool = db.query_row(
                "SELECT EXISTS (SELECT 1 FROM entries WHERE digest = ?1)",
                [&digest],
                |row| row.get(0),
            )?;
            if !named {
                let path = self.blob_path(&digest);
                if let Err(err) = fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %err, "could not remove an evicted blob");
                }
            }
        }
        if !victims.is_empty() {
            tracing::info!(entries = victims.len(), "cache entries evicted");
        }
        Ok(victims.len())
    }

    /// Adds `delta` to the totals and to `job`'s counters.
    pub(crate) fn count(&self, job: i64, delta: Counters, now_ms: i64) -> Result<(), CacheError> {
        let mut db = self.db();
        let tx = db.transaction()?;
        let values = params![
            to_i64(delta.hits),
            to_i64(delta.misses),
            to_i64(delta.bytes_up),
            to_i64(delta.bytes_down)
        ];
        tx.execute(
            "UPDATE totals SET hits = hits + ?1, misses = misses + ?2, bytes_up = bytes_up + ?3, bytes_down = bytes_down + ?4 WHERE id = 1",
            values,
        )?;
        tx.execute(
            "INSERT INTO job_counters (job, hits, misses, bytes_up, bytes_down, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (job) DO UPDATE SET hits = hits + ?2, misses = misses + ?3, bytes_up = bytes_up + ?4,
             bytes_down = bytes_down + ?5, updated_ms = ?6",
            params![
                job,
                to_i64(delta.hits),
                to_i64(delta.misses),
                to_i64(delta.bytes_up),
                to_i64(delta.bytes_down),
                now_ms
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The totals: counters, entries, and their bytes.
    pub(crate) fn totals(&self) -> Result<Totals, CacheError> {
        let db = self.db();
        let counters = db.query_row(
            "SELECT hits, misses, bytes_up, bytes_down FROM totals WHERE id = 1",
            [],
            counters_row,
        )?;
        let (entries, bytes): (i64, i64) = db.query_row(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        Ok(Totals {
            counters,
            entries: to_u64(entries),
            bytes_stored: to_u64(bytes),
        })
    }
}

fn counters_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Counters> {
    Ok(Counters {
        hits: to_u64(row.get(0)?),
        misses: to_u64(row.get(1)?),
        bytes_up: to_u64(row.get(2)?),
        bytes_down: to_u64(row.get(3)?),
    })
}

/// A job's counters from the index at `dir`, opened read-only (another process, `rm-agent
/// explain`, may read while the service writes). `None` when the job used no cache, or there is
/// no index yet.
pub fn job_counters(dir: &Path, job: i64) -> Result<Option<Counters>, CacheError> {
    let path = dir.join("index.sqlite3");
    if !path.exists() {
        return Ok(None);
    }
    let db = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    Ok(db
        .query_row(
            "SELECT hits, misses, bytes_up, bytes_down FROM job_counters WHERE job = ?1",
            [job],
            counters_row,
        )
        .optional()?)
}

fn count_files(dir: &Path) -> Result<u64, CacheError> {
    let mut count = 0;
    let items = match fs::read_dir(dir) {
        Ok(items) => items,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(io(format!("listing {}", dir.display()))(err)),
    };
    for item in items {
        let item = item.map_err(io(format!("listing {}", dir.display())))?;
        let kind = item
            .file_type()
            .map_err(io(format!("inspecting {}", item.path().display())))?;
        count += if kind.is_dir() {
            count_files(&item.path())?
        } else {
            1
        };
    }
    Ok(count)
}

/// What is on disk at `dir`, read without changing it (the index read-only): for tests and checks
/// that a crash left no visible entry and no orphaned bytes.
pub fn disk_report(dir: &Path) -> Result<DiskReport, CacheError> {
    let path = dir.join("index.sqlite3");
    let (entries, named) = if path.exists() {
        let db = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        db.busy_timeout(BUSY_TIMEOUT)?;
        let entries: i64 = db.query_row("SELECT COUNT(*) FROM entries", [], |row| row.get(0))?;
        let named: HashSet<String> = db
            .prepare("SELECT DISTINCT digest FROM entries")?
            .query_map([], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        (to_u64(entries), named)
    } else {
        (0, HashSet::new())
    };
    let blobs = dir.join("blobs");
    let mut blob_files = 0;
    let mut orphaned_blobs = 0;
    if blobs.exists() {
        for item in fs::read_dir(&blobs).map_err(io(format!("listing {}", blobs.display())))? {
            let item = item.map_err(io(format!("listing {}", blobs.display())))?;
            blob_files += 1;
            if !named.contains(item.file_name().to_string_lossy().as_ref()) {
                orphaned_blobs += 1;
            }
        }
    }
    Ok(DiskReport {
        entries,
        blob_files,
        orphaned_blobs,
        staged_files: count_files(&dir.join("uploads"))?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn slot<'a>(key: &'a str, scope: &'a str) -> Slot<'a> {
        Slot {
            repository: "acme/app",
            scope,
            key,
            version: "v1",
        }
    }

    /// Stages `bytes` for a new upload of `key` and commits it.
    fn save(store: &Store, key: &str, scope: &str, bytes: &[u8], now: i64) -> i64 {
        let Begin::Started(id) = store
            .begin_upload(slot(key, scope), "att", 1, now, 0)
            .unwrap()
        else {
            panic!("not started")
        };
        let staged = store.upload_dir(id).join("data");
        fs::write(&staged, bytes).unwrap();
        let (digest, size) = hash_file(&staged).unwrap();
        store.finalize(id, &staged, &digest, size, now).unwrap()
    }

    #[test]
    fn recovery_removes_staged_uploads_and_unnamed_blobs() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            save(&store, "kept", "refs/heads/main", b"kept bytes", 1);
            // A half upload: reserved, some bytes staged, never finalized.
            let Begin::Started(id) = store
                .begin_upload(slot("half", "refs/heads/main"), "att", 1, 2, 0)
                .unwrap()
            else {
                panic!("not started")
            };
            fs::write(store.upload_dir(id).join("data"), b"half").unwrap();
            fs::write(store.upload_dir(id).join("blocks").join("00"), b"blk").unwrap();
            // A blob renamed into place whose row was never committed.
            fs::write(store.blob_path(&"ab".repeat(32)), b"orphan").unwrap();
            let report = disk_report(dir.path()).unwrap();
            assert_eq!(report.staged_files, 2);
            assert_eq!(report.orphaned_blobs, 1);
            // Dropped without any shutdown: as a SIGKILL leaves it.
        }
        let store = Store::open(dir.path()).unwrap();
        let report = disk_report(dir.path()).unwrap();
        assert_eq!(
            report,
            DiskReport {
                entries: 1,
                blob_files: 1,
                orphaned_blobs: 0,
                staged_files: 0
            }
        );
        let main = vec!["refs/heads/main".to_owned()];
        assert!(
            store
                .lookup("acme/app", &main, "half", &[], "v1", 3)
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .lookup("acme/app", &main, "kept", &[], "v1", 3)
                .unwrap()
                .is_some()
        );
        // The half upload's reservation is gone too: the key can be saved again.
        assert!(matches!(
            store
                .begin_upload(slot("half", "refs/heads/main"), "att2", 2, 4, 0)
                .unwrap(),
            Begin::Started(_)
        ));
    }

    #[test]
    fn recovery_drops_rows_whose_blob_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        save(&store, "k", "refs/heads/main", b"bytes", 1);
        let digest = hex::encode(Sha256::digest(b"bytes"));
        fs::remove_file(store.blob_path(&digest)).unwrap();
        drop(store);
        Store::open(dir.path()).unwrap();
        assert_eq!(disk_report(dir.path()).unwrap().entries, 0);
    }

    #[test]
    fn lookup_matches_exact_then_prefix_then_restore_keys_scope_by_scope() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let main = "refs/heads/main";
        let feature = "refs/heads/feature";
        save(&store, "deps-aaa", main, b"1", 10);
        save(&store, "deps-bbb", main, b"2", 20);
        save(&store, "deps-", main, b"3", 5);
        save(&store, "build-x", feature, b"4", 30);
        let read = vec![feature.to_owned(), main.to_owned()];
        let hit = |key: &str, restore: &[&str]| {
            let restore: Vec<String> = restore.iter().map(|s| (*s).to_owned()).collect();
            store
                .lookup("acme/app", &read, key, &restore, "v1", 100)
                .unwrap()
                .map(|e| e.key)
        };
        // Exact wins over a newer prefix match.
        assert_eq!(hit("deps-", &[]).as_deref(), Some("deps-"));
        // A restore key: the newest prefix match.
        assert_eq!(hit("deps-zzz", &["deps-"]).as_deref(), Some("deps-bbb"));
        // The key itself is a prefix too.
        assert_eq!(hit("deps-a", &[]).as_deref(), Some("deps-aaa"));
        // Own scope first, then the default branch's.
        assert_eq!(
            hit("nope", &["build-", "deps-"]).as_deref(),
            Some("build-x")
        );
        assert_eq!(hit("nope", &[]), None);
        // Another repository sees nothing.
        assert!(
            store
                .lookup("other/app", &read, "deps-", &[], "v1", 100)
                .unwrap()
                .is_none()
        );
        // Another version sees nothing.
        assert!(
            store
                .lookup("acme/app", &read, "deps-", &[], "v2", 100)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn reservations_exist_busy_and_stale() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        save(&store, "done", "s", b"x", 1);
        assert_eq!(
            store.begin_upload(slot("done", "s"), "a", 1, 2, 0).unwrap(),
            Begin::Exists
        );
        // The same key in another scope is another slot.
        assert!(matches!(
            store.begin_upload(slot("done", "t"), "a", 1, 2, 0).unwrap(),
            Begin::Started(_)
        ));
        let Begin::Started(first) = store.begin_upload(slot("k", "s"), "a", 1, 100, 0).unwrap()
        else {
            panic!("not started")
        };
        assert_eq!(
            store.begin_upload(slot("k", "s"), "b", 2, 150, 50).unwrap(),
            Begin::Busy
        );
        // Once the first reservation is stale, a new one takes the slot and its files go.
        let Begin::Started(second) = store
            .begin_upload(slot("k", "s"), "b", 2, 300, 200)
            .unwrap()
        else {
            panic!("not started")
        };
        assert_ne!(first, second);
        assert!(!store.upload_dir(first).exists());
        assert!(store.upload(first).unwrap().is_none());
    }

    #[test]
    fn eviction_removes_rows_then_unshared_blobs_and_equal_bytes_share_a_blob() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let old = save(&store, "old", "s", b"same", 1);
        save(&store, "new", "s", b"same", 2);
        save(&store, "other", "s", b"different", 3);
        assert_eq!(disk_report(dir.path()).unwrap().blob_files, 2);
        let bounds = Bounds {
            max_size: 13,
            max_age: Duration::from_secs(3600),
            repo_quota: None,
        };
        // 4 + 4 + 9 = 17 > 13: the least recently used ("old") goes; its blob stays for "new".
        assert_eq!(store.evict(bounds, 10).unwrap(), 1);
        assert!(store.entry(old).unwrap().is_none());
        let report = disk_report(dir.path()).unwrap();
        assert_eq!((report.entries, report.blob_files), (2, 2));
        // A hit makes "new" recently used; then "other" goes, with its blob.
        let read = vec!["s".to_owned()];
        store
            .lookup("acme/app", &read, "new", &[], "v1", 20)
            .unwrap();
        let bounds = Bounds {
            max_size: 4,
            ..bounds
        };
        assert_eq!(store.evict(bounds, 21).unwrap(), 1);
        let report = disk_report(dir.path()).unwrap();
        assert_eq!(
            (report.entries, report.blob_files, report.orphaned_blobs),
            (1, 1, 0)
        );
    }

    #[test]
    fn counters_per_job_are_readable_from_another_connection() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let delta = Counters {
            hits: 1,
            misses: 2,
            bytes_up: 3,
            bytes_down: 4,
        };
        store.count(7, delta, 1).unwrap();
        store.count(7, delta, 2).unwrap();
        store.count(8, delta, 2).unwrap();
        let twice = Counters {
            hits: 2,
            misses: 4,
            bytes_up: 6,
            bytes_down: 8,
        };
        assert_eq!(job_counters(dir.path(), 7).unwrap(), Some(twice));
        assert_eq!(job_counters(dir.path(), 9).unwrap(), None);
        assert_eq!(
            store.totals().unwrap().counters,
            Counters {
                hits: 3,
                misses: 6,
                bytes_up: 9,
                bytes_down: 12
            }
        );
        assert_eq!(job_counters(&dir.path().join("absent"), 7).unwrap(), None);
    }
}
