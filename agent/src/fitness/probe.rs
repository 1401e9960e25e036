//! The fitness gate's measurements: the thin adapter between the host and [`super::judge`].
//! statvfs for free space, a real create-write-sync-remove of a probe file for writability (a
//! read-only remount or a full disk answers only to a write), `/proc/meminfo` for available
//! memory, and the runners' `PATH` for tools. Blocking, and possibly for ever on a hung
//! filesystem: [`super::deadline`] runs each behind [`Probes`] on a thread of its own.

use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// The probe file written in each watched directory and removed again. A leftover (an agent
/// killed between the two) is removed by the next probe.
pub(crate) const PROBE_FILE: &str = ".rm-fitness-probe";

/// Where the kernel says how much memory is available.
pub(crate) const MEMINFO: &str = "/proc/meminfo";

/// The probes, one blocking call each: the host's ([`HostProbes`]) or a test's (one that never
/// returns, to show the gate answers by its deadline all the same).
pub(crate) trait Probes: Send + Sync + 'static {
    /// Bytes available to runners on the filesystem holding `dir`, or why not known.
    fn free_bytes(&self, dir: &Path) -> Result<u64, String>;
    /// Whether a file can be created, written, synced and removed in `dir`, or why not.
    fn write(&self, dir: &Path) -> Result<(), String>;
    /// `MemAvailable` in bytes; `None` where the kernel does not say.
    fn mem_available(&self) -> Option<u64>;
    /// Where `tool` is, looked up as a runner would on `path`.
    fn find_tool(&self, tool: &str, path: &OsStr) -> Option<PathBuf>;
}

/// The host's own probes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostProbes;

impl Probes for HostProbes {
    fn free_bytes(&self, dir: &Path) -> Result<u64, String> {
        free_bytes(dir)
    }

    fn write(&self, dir: &Path) -> Result<(), String> {
        write_probe(dir)
    }

    fn mem_available(&self) -> Option<u64> {
        std::fs::read_to_string(MEMINFO)
            .ok()
            .and_then(|text| mem_available(&text))
    }

    fn find_tool(&self, tool: &str, path: &OsStr) -> Option<PathBuf> {
        find_tool(tool, path)
    }
}

/// Bytes available to unprivileged users on the filesystem holding `dir`: runners do not run
/// as root, so the blocks reserved for root are not theirs.
pub(crate) fn free_bytes(dir: &Path) -> Result<u64, String> {
    let stat = rustix::fs::statvfs(dir).map_err(|e| e.to_string())?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Creates, writes, syncs and removes [`PROBE_FILE`] in `dir`. The sync makes a filesystem
/// that delays allocation say `ENOSPC` now rather than at writeback.
pub(crate) fn write_probe(dir: &Path) -> Result<(), String> {
    let path = dir.join(PROBE_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot remove an old probe file: {e}")),
    }
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| {
            file.write_all(b"rm-agent fitness probe\n")?;
            file.sync_data()
        });
    let removed = std::fs::remove_file(&path);
    written.map_err(|e| e.to_string())?;
    removed.map_err(|e| format!("cannot remove the probe file: {e}"))
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
pub(crate) fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemAvailable:")?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// Where `tool` is: an absolute path that is an executable file, or the first executable file
/// of that name on `path`.
pub(crate) fn find_tool(tool: &str, path: &OsStr) -> Option<PathBuf> {
    if tool.starts_with('/') {
        return is_executable(Path::new(tool)).then(|| PathBuf::from(tool));
    }
    path.as_bytes()
        .split(|b| *b == b':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(OsStr::from_bytes(dir)).join(tool))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The `PATH` runners get: the agent's, or the default a runner gets when the agent has none
/// (the launch contract's own rule, [`rm_runner::process::runner_environment`]).
pub(crate) fn runner_path() -> OsString {
    rm_runner::process::runner_environment(std::env::vars_os(), Path::new("/"))
        .into_iter()
        .find(|(key, _)| key == "PATH")
        .map(|(_, value)| value)
        .unwrap_or_else(|| rm_runner::process::DEFAULT_PATH.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_gives_mem_available_in_bytes() {
        let text = "MemTotal:       24683884 kB\nMemFree:        17082660 kB\nMemAvailable:   24083652 kB\nBuffers:  1 kB\n";
        assert_eq!(mem_available(text), Some(24_083_652 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn a_writable_directory_passes_the_probe_and_keeps_nothing_of_it() {
        let dir = tempfile::tempdir().unwrap();
        // A leftover of an agent killed mid-probe does not fail it.
        std::fs::write(dir.path().join(PROBE_FILE), "old").unwrap();
        assert_eq!(write_probe(dir.path()), Ok(()));
        assert!(!dir.path().join(PROBE_FILE).exists());
        assert!(free_bytes(dir.path()).unwrap() > 0);
        let missing = dir.path().join("missing");
        assert!(write_probe(&missing).is_err());
        assert!(free_bytes(&missing).is_err());
    }

    #[test]
    fn tools_are_found_on_the_path_or_by_absolute_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let tool = bin.join("mytool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::write(bin.join("notexec"), "").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = OsString::from(format!("/nonexistent::{}", bin.display()));
        assert_eq!(find_tool("mytool", &path), Some(tool.clone()));
        assert_eq!(find_tool("notexec", &path), None);
        assert_eq!(find_tool("absent", &path), None);
        assert_eq!(
            find_tool(tool.to_str().unwrap(), OsStr::new("")),
            Some(tool)
        );
        assert_eq!(find_tool("/nonexistent/tool", &path), None);
    }
}
