//! Unpacking a verified `.tar.gz` into a fresh directory, refusing anything that could write
//! outside it: absolute paths, `..`, links whose target leaves the directory, entries reached
//! through a link the archive made, and special files. Blocking: call it from
//! `tokio::task::spawn_blocking`.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

/// The most a package may unpack to. actions/runner unpacks to well under a gigabyte; the cap
/// stops a hostile archive (a gzip bomb) from filling the data directory's disk.
pub(crate) const MAX_UNPACKED_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// The most entries a package may hold (actions/runner has a few thousand).
pub(crate) const MAX_ENTRIES: usize = 200_000;

/// Why an archive was not unpacked. Paths are the archive's own, as it names them.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the archive entry {path:?} is not a plain relative path (absolute, or with `..`)")]
    UnsafePath { path: PathBuf },
    #[error("the archive's link {path:?} points outside the package (to {target:?})")]
    LinkOutside { path: PathBuf, target: PathBuf },
    #[error("the archive entry {path:?} lies under the link {link:?} the archive made")]
    ThroughLink { path: PathBuf, link: PathBuf },
    #[error("the archive entry {path:?} is a {kind}, which a runner package never holds")]
    Unsupported { path: PathBuf, kind: String },
    #[error("the archive unpacks to more than {} MiB", MAX_UNPACKED_BYTES / (1024 * 1024))]
    TooLarge,
    #[error("the archive holds more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    #[error("cannot unpack the archive: {0}")]
    Io(#[from] io::Error),
}

/// `path` as a relative path of plain names (a leading `./` dropped); an empty result is the
/// archive's root itself. Anything absolute or with `..` is refused.
pub(crate) fn safe_relative(path: &Path) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(UnpackError::UnsafePath {
                    path: path.to_path_buf(),
                });
            }
        }
    }
    Ok(out)
}

/// Whether a symbolic link at `link` (relative to the package root) pointing at `target` stays
/// inside the package, resolved by its names alone: the link's own directory, then each
/// component of the target. An absolute target never does.
pub(crate) fn link_stays_inside(link: &Path, target: &Path) -> bool {
    let mut depth: usize = link.components().count().saturating_sub(1);
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Unpacks the gzip-compressed tar `archive` into the existing, empty directory `into`.
/// Directories are made owner-writable whatever the archive says, so the package can be
/// removed again; set-id bits are dropped; ownership is not restored.
pub(crate) fn unpack(archive: &Path, into: &Path) -> Result<(), UnpackError> {
    let file = File::open(archive)?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(BufReader::new(file)));
    tar.set_preserve_permissions(false);
    tar.set_preserve_ownerships(false);
    tar.set_overwrite(true);
    let mut links: HashSet<PathBuf> = HashSet::new();
    let mut total: u64 = 0;
    for (count, entry) in tar.entries()?.enumerate() {
        if count >= MAX_ENTRIES {
            return Err(UnpackError::TooManyEntries);
        }
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let path = safe_relative(&raw)?;
        if path.as_os_str().is_empty() {
            continue;
        }
        if let Some(link) = path.ancestors().skip(1).find(|a| links.contains(*a)) {
            return Err(UnpackError::ThroughLink {
                path: raw,
                link: link.to_path_buf(),
            });
        }
        total = total.saturating_add(entry.size());
        if total > MAX_UNPACKED_BYTES {
            return Err(UnpackError::TooLarge);
        }
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Directory => {
                let dir = into.join(&path);
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&dir)?;
                let mode = (entry.header().mode()? & 0o755) | 0o700;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
                continue;
            }
            EntryType::Regular | EntryType::Continuous => {}
            EntryType::Symlink => {
                let target = entry
                    .link_name()?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.as_os_str().is_empty() || !link_stays_inside(&path, &target) {
                    return Err(UnpackError::LinkOutside { path: raw, target });
                }
                links.insert(path.clone());
            }
            EntryType::Link => {
                let target = entry
                    .link_name()?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let inside = safe_relative(&target).map_err(|_| UnpackError::LinkOutside {
                    path: raw.clone(),
                    target: target.clone(),
                })?;
                if inside.as_os_str().is_empty() || inside.ancestors().any(|a| links.contains(a)) {
                    return Err(UnpackError::LinkOutside { path: raw, target });
                }
            }
            // Metadata for the archive as a whole (bsdtar, `git archive`): nothing to unpack.
            EntryType::XGlobalHeader => continue,
            other => {
                return Err(UnpackError::Unsupported {
                    path: raw,
                    kind: format!("{other:?}").to_lowercase(),
                });
            }
        }
        // tar's own check (it also resolves the parent directory and refuses one outside
        // `into`) backs ours up; a `false` is an entry it found unsafe.
        if !entry.unpack_in(into)? {
            return Err(UnpackError::UnsafePath { path: raw });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
