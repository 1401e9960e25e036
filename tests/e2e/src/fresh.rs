//! Whether a binary the end-to-end tests run was built from the sources as they are now.
//!
//! `cargo test -p rm-e2e` does not build `rm-agent-e2e`, `rm-relay` or `rm-fake-runner` (they
//! are other packages' binaries), so a test would run whatever was built last: a change to the
//! product, tested that way, passes against the old binary. A binary is refused when one of the
//! sources it was built from changed after it was written.
//!
//! Which sources: the ones cargo itself lists for the binary in its dep-info file,
//! `<target>/debug/<name>.d` (written beside the binary by every build that puts it there):
//! every `.rs` file of every crate of this workspace the binary links, with its features (the
//! e2e agent's `demo` links `tests/fake-github` and `tests/fake-runner`), and no other. The
//! rule is then exactly cargo's own: cargo rebuilds a binary when one of these files is newer
//! than its last build, so the rebuild command always makes a refused binary fresh. A rule over
//! more files (every crate of the workspace, or the manifests) would refuse a binary after an
//! edit cargo does not rebuild for (a crate the binary does not link, a comment in a
//! `Cargo.toml`), and the rebuild could not lift the refusal.
//!
//! Files under the target directory (a build script's output) are products of the build, not
//! sources, and are left out.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The command that rebuilds every binary the end-to-end tests run.
pub const BUILD_COMMAND: &str =
    "cargo build -p rm-agent --all-features -p rm-relay -p rm-fake-runner";

/// Why a binary is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stale {
    /// This source changed after the binary was written.
    Changed(PathBuf),
    /// This source, which the binary was built from, is gone (removed or renamed): cargo
    /// rebuilds for that too.
    Gone(PathBuf),
}

/// The first reason `binary_mtime` is older than its `sources` (each with its mtime, `None` when
/// the file is gone), or `None` when it is at least as new as every one. Equal times are fresh:
/// cargo records a build's start before it reads the sources, so the binary it writes is never
/// older than a source that build read; a file system with coarse timestamps could in principle
/// hide an edit made in the same tick as the link, which cargo would miss as well.
pub fn stale<'s>(
    binary_mtime: SystemTime,
    sources: impl IntoIterator<Item = (&'s Path, Option<SystemTime>)>,
) -> Option<Stale> {
    let mut newest: Option<(&Path, SystemTime)> = None;
    for (path, mtime) in sources {
        match mtime {
            None => return Some(Stale::Gone(path.to_path_buf())),
            Some(t) if t > binary_mtime && newest.is_none_or(|(_, n)| t > n) => {
                newest = Some((path, t));
            }
            Some(_) => {}
        }
    }
    newest.map(|(path, _)| Stale::Changed(path.to_path_buf()))
}

/// The files a cargo dep-info file (`target: dep dep ...`, a space inside a path escaped as
/// `\ `) lists for its first target.
pub fn dep_info_sources(text: &str) -> Vec<PathBuf> {
    let line = text.lines().next().unwrap_or("");
    // The target ends at the first `:` followed by a space or the line's end (a path's own
    // spaces are escaped, so `: ` cannot occur inside one).
    let bytes = line.as_bytes();
    let Some(colon) =
        (0..bytes.len()).find(|&i| bytes[i] == b':' && bytes.get(i + 1).is_none_or(|&c| c == b' '))
    else {
        return Vec::new();
    };
    let mut sources = Vec::new();
    let mut current = String::new();
    let mut chars = line[colon + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                current.push(' ');
                chars.next();
            }
            ' ' => {
                if !current.is_empty() {
                    sources.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        sources.push(PathBuf::from(current));
    }
    sources
}

/// Where cargo's dep-info for `binary` is: `<binary>.d` beside it, which `cargo build` writes,
/// else (a binary `cargo test` built and linked up from `deps/`, with no `.d` beside it) the
/// `.d` of the file in `deps/` that is the same file (cargo links the binary to
/// `deps/<name>-<hash>`, `-` in the name read as `_`). Neither found: the beside path, whose
/// absence is then the error.
fn dep_info_of(binary: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt as _;
    let beside = binary.with_extension("d");
    if beside.exists() {
        return beside;
    }
    let (Some(dir), Some(name), Ok(meta)) = (
        binary.parent(),
        binary.file_name().and_then(|n| n.to_str()),
        std::fs::metadata(binary),
    ) else {
        return beside;
    };
    let prefix = format!("{}-", name.replace('-', "_"));
    let same = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
    };
    std::fs::read_dir(dir.join("deps"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && !n.contains('.'))
                && same(path)
        })
        .map_or(beside, |linked| linked.with_extension("d"))
}

/// Checks `binary` (in `<target>/<profile>/`) against the sources its dep-info file lists:
/// `Err` says why it is refused and how to rebuild it.
pub fn check(binary: &Path) -> Result<(), String> {
    let rebuild = format!("rebuild it with `{BUILD_COMMAND}` (see docs/development.md)");
    let dep_info = dep_info_of(binary);
    let text = std::fs::read_to_string(&dep_info).map_err(|e| {
        format!(
            "{} has no dep-info file {} ({e}), so whether it was built from the sources as they \
             are cannot be told; {rebuild}",
            binary.display(),
            dep_info.display()
        )
    })?;
    let built = std::fs::metadata(binary)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    // `<target>/<profile>/<name>`: the target directory is two levels up.
    let target = binary.parent().and_then(Path::parent);
    // The `.d` beside the binary names sources by absolute path; one in `deps/` relative to the
    // workspace's root.
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let sources: Vec<(PathBuf, Option<SystemTime>)> = dep_info_sources(&text)
        .into_iter()
        .map(|p| if p.is_relative() { root.join(p) } else { p })
        .filter(|p| target.is_none_or(|t| !p.starts_with(t)))
        .map(|p| {
            let mtime = std::fs::metadata(&p).and_then(|m| m.modified()).ok();
            (p, mtime)
        })
        .collect();
    if sources.is_empty() {
        return Err(format!(
            "{} lists no source of {}; {rebuild}",
            dep_info.display(),
            binary.display()
        ));
    }
    match stale(built, sources.iter().map(|(p, t)| (p.as_path(), *t))) {
        None => Ok(()),
        Some(Stale::Changed(source)) => Err(format!(
            "{} is older than {}, one of the sources it is built from: the test would run the \
             code as it was, not as it is; {rebuild}",
            binary.display(),
            source.display()
        )),
        Some(Stale::Gone(source)) => Err(format!(
            "{} was built from {}, which is gone; {rebuild}",
            binary.display(),
            source.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::path::{Path, PathBuf};
    use std::time::{Duration, SystemTime};

    use super::{Stale, dep_info_sources, stale};

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_binary_is_stale_when_a_source_is_newer_or_gone() {
        let (a, b) = (Path::new("a.rs"), Path::new("b.rs"));
        /// What, the binary's mtime, its sources' (`None`: gone), the verdict.
        type Case<'a> = (&'a str, u64, &'a [(&'a Path, Option<u64>)], Option<Stale>);
        let cases: &[Case] = &[
            ("all older", 100, &[(a, Some(50)), (b, Some(99))], None),
            ("one as old (same tick)", 100, &[(a, Some(100))], None),
            (
                "one newer",
                100,
                &[(a, Some(50)), (b, Some(101))],
                Some(Stale::Changed(b.into())),
            ),
            (
                "the newest of two newer is named",
                100,
                &[(a, Some(150)), (b, Some(120))],
                Some(Stale::Changed(a.into())),
            ),
            (
                "a source gone",
                100,
                &[(a, Some(50)), (b, None)],
                Some(Stale::Gone(b.into())),
            ),
            ("no source", 100, &[], None),
        ];
        for (what, built, sources, want) in cases {
            let got = stale(at(*built), sources.iter().map(|(p, t)| (*p, t.map(at))));
            assert_eq!(&got, want, "{what}");
        }
    }

    #[test]
    fn dep_info_lists_the_first_targets_sources_with_escaped_spaces() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "plain",
                "/t/debug/rm-relay: /w/relay/src/main.rs /w/base/src/lib.rs\n",
                &["/w/relay/src/main.rs", "/w/base/src/lib.rs"],
            ),
            (
                "spaces in the checkout's path",
                "/my\\ work/t/debug/rm-relay: /my\\ work/relay/src/main.rs /my\\ work/a\\ b.rs\n",
                &["/my work/relay/src/main.rs", "/my work/a b.rs"],
            ),
            (
                "a colon inside a path",
                "/w:x/t/debug/rm-relay: /w:x/src/main.rs",
                &["/w:x/src/main.rs"],
            ),
            ("no source", "/t/debug/rm-relay:\n", &[]),
            ("empty", "", &[]),
        ];
        for (what, text, want) in cases {
            let want: Vec<PathBuf> = want.iter().map(PathBuf::from).collect();
            assert_eq!(dep_info_sources(text), want, "{what}");
        }
    }
}
