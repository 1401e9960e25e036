//! Where tests that start isolated runners (or a runner's Docker daemon) make their setups:
//! outside every place a runner, or a runner's daemon, gets an empty tmpfs of its own
//! (`rm_runner::isolate::PRIVATE_DIRS`), and below directories every uid may search. Shared by
//! the end-to-end tests and the agent's host tests (a checkout under `/tmp` must pass both).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// The places an isolated runner gets a fresh tmpfs for (`rm_runner::isolate::
/// PRIVATE_DIRS`): a setup below one of them would be hidden from the job.
const PRIVATE_DIRS: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", "/run"];

/// Where the setups go when `CARGO_TARGET_TMPDIR` cannot serve (a checkout under `/tmp`, or
/// below a directory other uids may not pass).
const FALLBACK_BASE: &str = "/var/lib/rm-e2e-isolation";

/// The directory the setups are made in: outside every place a runner gets privately, and
/// passable by any uid all the way down (a runner uid must reach its runtime below it).
/// `CARGO_TARGET_TMPDIR` where it qualifies, else [`FALLBACK_BASE`].
pub(crate) fn base_dir() -> PathBuf {
    let qualifies = |base: &Path| {
        !PRIVATE_DIRS.iter().any(|p| base.starts_with(p))
            && base.ancestors().all(|dir| {
                std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
            })
    };
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(target).unwrap();
    let target = target.canonicalize().unwrap();
    if qualifies(&target) {
        return target;
    }
    let fallback = Path::new(FALLBACK_BASE);
    std::fs::create_dir_all(fallback).unwrap();
    std::fs::set_permissions(fallback, std::fs::Permissions::from_mode(0o711)).unwrap();
    let fallback = fallback.canonicalize().unwrap();
    assert!(
        qualifies(&fallback),
        "neither {} nor {} can hold the tests' runner setups: they must lie outside {PRIVATE_DIRS:?} \
         below directories every uid may search",
        target.display(),
        fallback.display()
    );
    fallback
}
