//! rm-fake-runner: a fake actions/runner package. [`listener_main`] is the package's
//! `bin/Runner.Listener` (the crate's binary is nothing else); [`assemble_package`] lays out a
//! package directory around a binary for tests and `rm-agent demo`.

mod listener;
mod steps;
mod worker;

use std::path::{Path, PathBuf};

pub use listener::{CHECKOUT_DONE_FILE, FINISH_FILE, VERSION, listener_main};
pub use steps::{
    CONTAINER_IMAGE_FILE, CONTAINER_REPORTS_FILE, CONTAINER_STEP_SCRIPT, JOB_COMPLETED_HOOK_ENV,
    JOB_STARTED_HOOK_ENV,
};
pub use worker::{
    ARCHIVE_CACHE_ENV, REDIRECTABLE, SETUP_DONE_FILE, STEP_SCRIPT, WORKER_DLL, synthetic_worker_dll,
};

use anyhow::Context as _;

/// The name cargo gives the compiled fake runner.
pub const BINARY_NAME: &str = "rm-fake-runner";

/// Finds the compiled fake runner next to the running executable: in the same directory (a
/// binary in `target/<profile>/`) or one up (a test in `target/<profile>/deps/`).
pub fn locate_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(BINARY_NAME))
        .find(|p| p.is_file())
}

/// Lays out a runner package in `dir`: `bin/Runner.Listener` (a copy of `binary`, executable),
/// `bin/Runner.Worker.dll` (synthetic, holding the literals the real worker sets
/// `ACTIONS_RESULTS_URL` and `ACTIONS_CACHE_URL` by, once each: [`synthetic_worker_dll`]) and
/// the files a real package has at its top (`run.sh`, `config.sh`). Returns `dir`.
pub fn assemble_package(binary: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
    let listener = bin.join("Runner.Listener");
    std::fs::copy(binary, &listener)
        .with_context(|| format!("cannot copy {} to {}", binary.display(), listener.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::write(bin.join(WORKER_DLL), synthetic_worker_dll(&REDIRECTABLE))?;
    let script = "#!/bin/sh\n# Fake runner package: rm starts bin/Runner.Listener directly.\nexec \"$(dirname \"$0\")/bin/Runner.Listener\" run \"$@\"\n";
    std::fs::write(dir.join("run.sh"), script)?;
    std::fs::write(
        dir.join("config.sh"),
        "#!/bin/sh\necho 'fake package: JIT only' >&2\nexit 1\n",
    )?;
    Ok(dir.to_path_buf())
}
