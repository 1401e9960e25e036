//! What a test does when it cannot run here (a tool missing, not root, no cgroup v2): it FAILS,
//! unless the environment names what may be missing in `RM_TEST_ALLOW_SKIP` (comma-separated
//! needs such as `caddy,dbus`, or `all`). An allowed skip is recorded, one file per test, in
//! `<target>/<profile>/rm-skips/`, where `.ci/run` counts them and says why: `cargo test` hides
//! the output of passing tests, so a skip printed to stderr alone is a silent pass.
//!
//! One file, included by path (`#[path = ".../tests/support/skip.rs"] mod skip;`) into every
//! test target that can skip, so every crate follows the same rule without a crate of its own.

#![allow(dead_code)]

/// The environment variable naming the needs a test may be skipped for.
pub(crate) const ALLOW_SKIP_ENV: &str = "RM_TEST_ALLOW_SKIP";

/// The directory, beside the test binaries' `deps/`, where allowed skips are recorded.
pub(crate) const SKIPS_DIR: &str = "rm-skips";

/// Whether `allowed` (the value of [`ALLOW_SKIP_ENV`]) lets a test lacking `need` skip.
pub(crate) fn allowed(allowed: &str, need: &str) -> bool {
    allowed
        .split(',')
        .map(str::trim)
        .any(|a| a == "all" || a.eq_ignore_ascii_case(need))
}

/// Called by a test that cannot run: `test` is its name, `need` the short name of what it
/// lacks (the word [`ALLOW_SKIP_ENV`] takes: `root`, `cgroup`, `dbus`, `node`, `caddy`, ...),
/// `why` the reason in a sentence. Panics unless the skip is allowed; otherwise records it and
/// returns, and the caller returns.
pub(crate) fn cannot_run(test: &str, need: &str, why: &str) {
    let list = std::env::var(ALLOW_SKIP_ENV).unwrap_or_default();
    if !allowed(&list, need) {
        panic!(
            "{test} cannot run: {why}. Give it what it needs (the tool, root, cgroup v2), or set \
             {ALLOW_SKIP_ENV}={need} (or all) to skip it on purpose"
        );
    }
    eprintln!("SKIPPED ({ALLOW_SKIP_ENV} allows {need}): {test}: {why}");
    if let Err(e) = record(test, need, why) {
        eprintln!("cannot record the skip of {test}: {e}");
    }
}

/// Writes `<profile dir>/rm-skips/<test>.txt` (the profile dir holds `deps/`, where the test
/// binary runs from).
fn record(test: &str, need: &str, why: &str) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let profile = exe
        .parent()
        .and_then(std::path::Path::parent)
        .ok_or_else(|| std::io::Error::other("the test binary has no profile directory"))?;
    let dir = profile.join(SKIPS_DIR);
    std::fs::create_dir_all(&dir)?;
    let file: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    std::fs::write(
        dir.join(format!("{file}.txt")),
        format!("{test} [{need}]: {why}\n"),
    )
}

#[cfg(test)]
mod skip_rule {
    use super::allowed;

    #[test]
    fn only_a_named_need_or_all_allows_a_skip() {
        assert!(!allowed("", "caddy"));
        assert!(!allowed("dbus", "caddy"));
        assert!(!allowed("caddyx", "caddy"));
        assert!(allowed("dbus, caddy", "caddy"));
        assert!(allowed("all", "root"));
    }
}
