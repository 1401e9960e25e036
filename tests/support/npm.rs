//! npm packages for tests that run a real Node client (the e2e cache test's `@actions/cache`,
//! rm-relay's smee-client and `@octokit/webhooks`): installed once per version under a
//! directory the test names (where a runner uid can read it, for the cache test), reused
//! afterwards.
//!
//! One file, included by path (`#[path = ".../tests/support/npm.rs"] mod npm;`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Held while a package is looked for and installed: the tests of one binary run at once, and
/// two `npm install`s into one prefix race (`ENOTEMPTY` on rmdir).
static NPM_INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether `node` and `npm` run here.
pub(crate) fn node_and_npm() -> Result<(), String> {
    for tool in ["node", "npm"] {
        let found = std::process::Command::new(tool).arg("--version").output();
        if !found.is_ok_and(|out| out.status.success()) {
            return Err(format!(
                "`{tool}` is not installed (apt-get install nodejs npm)"
            ));
        }
    }
    Ok(())
}

/// Installs `package@version` with npm under `base` once (the prefix
/// `<base>/<package>-<version>`) and reuses it; the prefix.
pub(crate) fn npm_package(base: &Path, package: &str, version: &str) -> PathBuf {
    let _one_at_a_time = NPM_INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let prefix = base.join(format!(
        "{}-{version}",
        package.trim_start_matches('@').replace('/', "-")
    ));
    let installed = std::fs::read_to_string(
        prefix
            .join("node_modules")
            .join(package)
            .join("package.json"),
    )
    .is_ok_and(|p| p.contains(&format!("\"version\": \"{version}\"")));
    if !installed {
        let out = std::process::Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&prefix)
            .arg(format!("{package}@{version}"))
            .output()
            .unwrap_or_else(|e| panic!("npm install {package}@{version}: {e}"));
        assert!(
            out.status.success(),
            "npm install {package}@{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    prefix
}
