//! One agent per data directory: a long-running command holds an exclusive lock on
//! `<data_dir>/rm-agent.lock` for its whole life. The kernel drops the lock when the process
//! dies, however it dies, so a crash never leaves a stale lock behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt as _};
use std::path::Path;

use crate::exit::Exit;

const LOCK_FILE: &str = "rm-agent.lock";

/// Held for as long as the command owns the data directory.
pub(crate) struct DataDirLock {
    _file: File,
}

/// Creates the data directory if needed (readable by its owner only: it holds the journal),
/// repairs the mode of one that already exists (see [`private_mode`]), and takes its lock, or
/// says which process owns it.
pub(crate) fn lock_data_dir(dir: &Path) -> Result<DataDirLock, Exit> {
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
    repair_data_dir_mode(dir)?;
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

/// The mode a data directory must have instead of `mode`, if it must change: no read or write
/// bits for group or others (they could list it, or add and swap files in it). Search bits stay:
/// a runner passes through to its runtime under `isolation = "user"` (`0711`), and the files in
/// the directory keep their own modes (the journal is `0600`).
pub(crate) fn private_mode(mode: u32) -> Option<u32> {
    let perms = mode & 0o7777;
    (perms & 0o066 != 0).then_some(perms & !0o066)
}

/// Repairs a data directory that already existed with a mode others can read or write (made by
/// hand, by an older rm, under another umask), and says so in the log.
fn repair_data_dir_mode(dir: &Path) -> Result<(), Exit> {
    let fail = |err: std::io::Error| {
        Exit::runtime(anyhow::anyhow!(
            "cannot make the data directory {} private ({err}); run `chmod go-rw {}`",
            dir.display(),
            dir.display()
        ))
    };
    let mode = std::fs::metadata(dir).map_err(fail)?.permissions().mode();
    if let Some(private) = private_mode(mode) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(private)).map_err(fail)?;
        tracing::warn!(
            dir = %dir.display(),
            was = format!("{:04o}", mode & 0o7777),
            now = format!("{private:04o}"),
            "repaired the data directory's mode: others could list or change it (it holds the journal)"
        );
    }
    Ok(())
}

/// The pid the data directory's lock file records: the last process that took the lock, which
/// may have exited since (the file is not cleared at exit). `None` when there is no lock file
/// or it names no pid. Reads only: taking the lock, even shared, could make a starting agent
/// find it held.
pub(crate) fn recorded_owner(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(LOCK_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_data_dir_others_can_list_or_change_loses_those_bits() {
        assert_eq!(private_mode(0o40700), None);
        assert_eq!(private_mode(0o40711), None);
        assert_eq!(private_mode(0o40755), Some(0o711));
        assert_eq!(private_mode(0o40777), Some(0o711));
        assert_eq!(private_mode(0o40750), Some(0o710));
        assert_eq!(private_mode(0o40702), Some(0o700));
    }

    /// A data directory made by hand (or under umask 022) with mode 0755 is repaired at start:
    /// others can no longer list it.
    #[test]
    fn an_existing_readable_data_dir_is_repaired_at_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let _lock = lock_data_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o711);
    }
}
