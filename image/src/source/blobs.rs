//! The files of an image as a transport holds them: a directory (an OCI layout) or a tar file (an
//! OCI or Docker archive). A tar is read once to index where each member's bytes start; a member
//! is then read by seeking to it, so an archive is never extracted and a layer is read straight
//! out of it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::SourceError;

/// Most members an archive's index holds: an OCI archive has three files and one per blob, an
/// old `docker save` four per layer, so this bounds the index's memory without refusing any
/// real image.
pub(crate) const MAX_ARCHIVE_ENTRIES: usize = 100_000;

/// Most links followed to reach a member (old `docker save` archives link a layer that appears
/// twice to its first copy: one hop).
const MAX_LINK_HOPS: usize = 8;

/// Where an image's files are.
pub(crate) enum Blobs {
    /// Relative names under a directory.
    Dir(PathBuf),
    /// Members of a tar file.
    Tar(TarIndex),
}

/// The members of a tar file by normalised name.
pub(crate) struct TarIndex {
    file: PathBuf,
    members: HashMap<String, Member>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    /// A regular file's bytes: `size` bytes from `offset`.
    File { offset: u64, size: u64 },
    /// A symbolic or hard link to another member, its target already made a normalised
    /// member name.
    Link(String),
}

impl Blobs {
    /// How `name` is named in an error: the file, or the archive and its member.
    pub(crate) fn describe(&self, name: &str) -> String {
        match self {
            Self::Dir(dir) => dir.join(name).display().to_string(),
            Self::Tar(index) => format!("{} (member {name})", index.file.display()),
        }
    }

    /// Opens `name` (a relative name with no `..`, made by the caller from a digest or read
    /// from the archive's own manifest) and gives its size.
    pub(crate) fn open(&self, name: &str) -> Result<(Box<dyn Read + Send>, u64), SourceError> {
        let io_error = |source| SourceError::Io {
            what: self.describe(name),
            error: source,
        };
        match self {
            Self::Dir(dir) => {
                let file = File::open(dir.join(name)).map_err(|source| {
                    if source.kind() == io::ErrorKind::NotFound {
                        SourceError::Missing {
                            what: self.describe(name),
                        }
                    } else {
                        io_error(source)
                    }
                })?;
                let size = file.metadata().map_err(io_error)?.len();
                Ok((Box::new(file), size))
            }
            Self::Tar(index) => {
                let (offset, size) = index.find(name).ok_or_else(|| SourceError::Missing {
                    what: self.describe(name),
                })?;
                let mut file = File::open(&index.file).map_err(io_error)?;
                file.seek(SeekFrom::Start(offset)).map_err(io_error)?;
                Ok((Box::new(file.take(size)), size))
            }
        }
    }

    /// Reads all of `name` when it is at most `limit` bytes.
    pub(crate) fn read_bounded(&self, name: &str, limit: u64) -> Result<Vec<u8>, SourceError> {
        let (reader, size) = self.open(name)?;
        if size > limit {
            return Err(SourceError::TooLarge {
                what: self.describe(name),
                limit,
            });
        }
        let mut bytes = Vec::new();
        reader
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| SourceError::Io {
                what: self.describe(name),
                error: source,
            })?;
        if bytes.len() as u64 > limit {
            return Err(SourceError::TooLarge {
                what: self.describe(name),
                limit,
            });
        }
        Ok(bytes)
    }
}

impl TarIndex {
    /// Reads the headers of the tar `file`, seeking over the members' bytes.
    pub(crate) fn build(file: &Path) -> Result<Self, SourceError> {
        let what = || file.display().to_string();
        let io_error = |source| SourceError::Io {
            what: what(),
            error: source,
        };
        let mut archive = tar::Archive::new(File::open(file).map_err(io_error)?);
        let mut members = HashMap::new();
        for entry in archive.entries_with_seek().map_err(io_error)? {
            let entry = entry.map_err(io_error)?;
            if members.len() >= MAX_ARCHIVE_ENTRIES {
                return Err(SourceError::Malformed {
                    what: what(),
                    why: format!("more than {MAX_ARCHIVE_ENTRIES} members"),
                });
            }
            let path = entry.path().map_err(io_error)?;
            let Some(name) = path.to_str().and_then(normalise) else {
                continue;
            };
            let member = match entry.header().entry_type() {
                EntryType::Regular | EntryType::Continuous => Member::File {
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                },
                kind @ (EntryType::Symlink | EntryType::Link) => {
                    let target = entry.link_name().map_err(io_error)?;
                    let Some(target) = target.as_deref().and_then(Path::to_str) else {
                        continue;
                    };
                    // A symbolic link is relative to its own directory, a hard link names a
                    // member from the archive's root.
                    let joined = match (kind, name.rsplit_once('/')) {
                        (EntryType::Symlink, _) if target.starts_with('/') => target.to_owned(),
                        (EntryType::Symlink, Some((dir, _))) => format!("{dir}/{target}"),
                        _ => target.to_owned(),
                    };
                    match normalise(&joined) {
                        Some(target) => Member::Link(target),
                        None => continue,
                    }
                }
                // Directories, devices, sparse files: nothing an image's file can be.
                _ => continue,
            };
            members.insert(name, member);
        }
        Ok(Self {
            file: file.to_owned(),
            members,
        })
    }

    /// Where `name`'s bytes are, following links.
    fn find(&self, name: &str) -> Option<(u64, u64)> {
        let mut name = normalise(name)?;
        for _ in 0..=MAX_LINK_HOPS {
            match self.members.get(&name)? {
                Member::File { offset, size } => return Some((*offset, *size)),
                Member::Link(target) => name = target.clone(),
            }
        }
        None
    }
}

/// A member name without `.`, empty components or a leading `/` (`./index.json` and
/// `index.json` are one member); `None` when a `..` would leave the archive's root.
fn normalise(name: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

#[cfg(test)]
mod tests;
