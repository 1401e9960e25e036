//! actions/runner version numbers: parsing for ordering, and the version a release tag names.
//! Pure; shared by following releases (`latest`) and judging a pinned version's window
//! (`window`).

/// `MAJOR.MINOR.PATCH` as numbers, for ordering; `None` for anything else.
pub(crate) fn parse_version(version: &str) -> Option<[u64; 3]> {
    let mut parts = version.split('.');
    let mut out = [0; 3];
    for slot in &mut out {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 6 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = part.parse().ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// The version a release tag names (`v2.330.0` → `2.330.0`); `None` when it names none (it
/// becomes part of a URL and a directory name).
pub(crate) fn version_of_tag(tag: &str) -> Option<String> {
    let version = tag.strip_prefix('v').unwrap_or(tag);
    parse_version(version).map(|_| version.to_owned())
}
