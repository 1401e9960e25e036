//! One agent per data directory: a long-running command holds an exclusive lock on
//! `<data_dir>/rm-agent.lock` for its whole life. The kernel drops the lock when the process
//! dies, however it dies, so a crash never leaves a stale lock behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use crate::exit::Exit;

const LOCK_FILE: &str = "rm-agent.lock";

/// Held for as long as the command owns the data directory.
pub struct DataDirLock {
    _file: File,
}

/// Creates the data directory if needed (readable by its owner only: it holds the journal) and
/// takes its lock, or says which process owns it.
pub fn lock_data_dir(dir: &Path) -> Result<DataDirLock, Exit> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|err| {
            Exit::runtime(anyhow::anyhow!(
                "cannot create the data directory {} ({err}); check --data-dir and its permissions",
                dir.display()
            ))
        })?;
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|err| Exit::runtime(anyhow::anyhow!("cannot open {} ({err})", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            let owner = owner.trim();
            let who = if owner.is_empty() {
                "another rm-agent".to_owned()
            } else {
                format!("another rm-agent (pid {owner})")
            };
            return Err(Exit::conflict(format!(
                "{who} owns the data directory {}; stop it first, or give this one its own --data-dir",
                dir.display()
            )));
        }
        Err(TryLockError::Error(err)) => {
            return Err(Exit::runtime(anyhow::anyhow!(
                "cannot lock {} ({err})",
                path.display()
            )));
        }
    }
    let _ = file.set_len(0);
    let _ = file.seek(SeekFrom::Start(0));
    let _ = writeln!(file, "{}", std::process::id());
    Ok(DataDirLock { _file: file })
}

/// The pid the data directory's lock file records: the last process that took the lock, which
/// may have exited since (the file is not cleared at exit). `None` when there is no lock file
/// or it names no pid. Reads only: taking the lock, even shared, could make a starting agent
/// find it held.
pub fn recorded_owner(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(LOCK_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}
