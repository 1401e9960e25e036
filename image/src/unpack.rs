//! Applying one image layer (an uncompressed tar) onto a root directory as the OCI image spec's
//! `layer.md` says: entries created, replaced and deleted (whiteouts `.wh.<name>`, opaque
//! directories `.wh..wh..opq`), hard links, symlinks stored as they are, owners, modes and
//! mtimes kept. It owns the rule that nothing of a layer is ever written outside the root: every
//! parent path is resolved beneath the root by the kernel (`openat2` with `RESOLVE_IN_ROOT`, so a
//! symlink a layer planted, absolute or `../`, resolves inside the image as it will at run time)
//! and the last component is created relative to that resolved directory. What a hostile layer
//! may carry is refused (`..` or absolute names: [`UnpackError::Unsafe`]) or neutralised and
//! listed in the [`UnpackReport`] (device nodes not created, setuid/setgid cleared, extended
//! attributes ignored). The digest checks are the caller's (`source`): this module sees bytes.

mod beneath;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::io::{self, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};

pub(crate) use beneath::remove_tree;
use beneath::{Beneath, Meta};

/// The most entries one layer may carry. Real layers have up to a few hundred thousand (a full
/// distribution with toolchains); the bound keeps what one layer makes us remember (the names
/// it wrote, for its whiteouts) to some hundred MiB at worst.
pub const MAX_LAYER_ENTRIES: u64 = 1_000_000;

/// The longest entry name or hard-link target, in bytes: Linux's `PATH_MAX`. Nothing longer can
/// be opened by path in the image anyway.
pub const MAX_NAME_LEN: usize = 4096;

/// How many neutralisations the report lists; past that it counts them
/// ([`UnpackReport::unlisted`]), so a layer of a million device nodes cannot bloat it.
pub const MAX_REPORTED: usize = 10_000;

/// The name prefix marking a whiteout: `.wh.<name>` deletes `<name>` of the lower layers.
const WHITEOUT_PREFIX: &[u8] = b".wh.";

/// The entry making its directory opaque: the lower layers' entries in it are deleted.
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// The prefix of AUFS's own metadata names (`.wh..wh.plnk`, ...), which the OCI spec says are
/// not part of the image: skipped, never created.
const WHITEOUT_META_PREFIX: &[u8] = b".wh..wh.";

/// What applying layers neutralised, in the order met; kept beside an unpacked image
/// (`unpack.json`) so an operator can see what an image carried that the store did not make.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnpackReport {
    /// How many layers were applied.
    pub layers: u32,
    /// How many tar entries they carried, over all layers.
    pub entries: u64,
    /// What was neutralised, at most [`MAX_REPORTED`] items.
    pub neutralised: Vec<Neutralised>,
    /// Neutralisations past [`MAX_REPORTED`], counted only.
    pub unlisted: u64,
}

/// One entry a layer carried that was not made as it asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Neutralised {
    /// The layer, counted from 0 (the base).
    pub layer: u32,
    /// The entry's name as the layer wrote it (lossy UTF-8).
    pub path: String,
    /// What was done instead.
    pub what: Neutralisation,
}

/// What was done to an entry instead of what it asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Neutralisation {
    /// A character or block device node, not created (and whatever was at its name removed):
    /// a job must never reach a host device through an image.
    DeviceSkipped {
        /// Block rather than character device.
        block: bool,
        /// The device numbers the layer gave.
        major: u32,
        /// The device numbers the layer gave.
        minor: u32,
    },
    /// A hard link to a device node that was skipped: not made either.
    LinkToSkippedDevice {
        /// The link's target as the layer wrote it.
        target: String,
    },
    /// The setuid/setgid bits were cleared: `mode` is what the layer asked (octal in the text).
    SetIdCleared {
        /// The mode bits as the layer gave them.
        mode: u32,
    },
    /// Extended attributes (pax `SCHILY.xattr.*`, `LIBARCHIVE.xattr.*`) were ignored, e.g. a
    /// `security.capability` that would give a file capabilities.
    XattrsIgnored {
        /// The attributes' names.
        names: Vec<String>,
    },
}

impl UnpackReport {
    /// Lists one neutralisation, or counts it past [`MAX_REPORTED`].
    fn push(&mut self, layer: u32, path: &[u8], what: Neutralisation) {
        if self.neutralised.len() < MAX_REPORTED {
            self.neutralised.push(Neutralised {
                layer,
                path: String::from_utf8_lossy(path).into_owned(),
                what,
            });
        } else {
            self.unlisted += 1;
        }
    }
}

/// Why a layer could not be applied. The root is then half-written: the caller (the store)
/// throws it away.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The entry would write outside the root or is malformed in a way that could (a `..`
    /// component, an absolute name, a hard link whose target has either).
    #[error("layer entry {entry:?} refused: {why}")]
    Unsafe {
        /// The entry's name as the layer wrote it (lossy UTF-8).
        entry: String,
        /// Why, in a few words.
        why: String,
    },
    /// An entry type the OCI spec does not allow in a layer.
    #[error("layer entry {entry:?} has an unsupported type ({kind})")]
    Unsupported {
        /// The entry's name.
        entry: String,
        /// The tar type byte, as a character.
        kind: String,
    },
    /// More than [`MAX_LAYER_ENTRIES`] entries.
    #[error("the layer has more than {MAX_LAYER_ENTRIES} entries")]
    TooManyEntries,
    /// The tar stream itself could not be read (truncated, a bad header checksum, or the
    /// caller's reader failed, e.g. its digest check).
    // Each cause is in the message, and so not also a `source()`: a caller that prints the
    // chain (anyhow's `{:#}`, as `rm-agent run` does) would say it twice.
    #[error("reading the layer: {0}")]
    Read(io::Error),
    /// Making an entry failed.
    #[error("layer entry {entry:?}: {op}: {error}")]
    Write {
        /// The entry's name.
        entry: String,
        /// What was being done.
        op: &'static str,
        /// The system's answer.
        error: io::Error,
    },
    /// The root (or another file the caller handles) could not be used.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Applies ONE uncompressed layer tar onto `root` (the layers below already applied there),
/// adding what it neutralised to `report`. The stream is read to its end, padding after the tar
/// included, so a digest-checking reader the caller wraps it in sees every byte.
pub fn apply_layer(
    root: &Path,
    layer: impl Read,
    report: &mut UnpackReport,
) -> Result<(), UnpackError> {
    let tree = Beneath::open(root)?;
    let mut applier = Applier {
        tree,
        layer: report.layers,
        report,
        written: HashSet::new(),
        skipped_devices: HashSet::new(),
        dir_times: Vec::new(),
    };
    let mut archive = tar::Archive::new(layer);
    let mut count: u64 = 0;
    for entry in archive.entries().map_err(UnpackError::Read)? {
        let mut entry = entry.map_err(UnpackError::Read)?;
        count += 1;
        if count > MAX_LAYER_ENTRIES {
            return Err(UnpackError::TooManyEntries);
        }
        applier.report.entries += 1;
        applier.apply(&mut entry)?;
    }
    applier.finish()?;
    io::copy(&mut archive.into_inner(), &mut io::sink()).map_err(UnpackError::Read)?;
    report.layers += 1;
    Ok(())
}

/// What an entry's name asks, decided from the name alone.
#[derive(Debug, PartialEq, Eq)]
enum Planned<'a> {
    /// Make (or replace) the entry at this path; no components is the root itself.
    Entry(Vec<&'a [u8]>),
    /// Delete `name` in `dir` as the lower layers left it.
    Whiteout { dir: Vec<&'a [u8]>, name: &'a [u8] },
    /// Delete everything the lower layers left in `dir`.
    Opaque(Vec<&'a [u8]>),
    /// AUFS metadata: neither made nor obeyed.
    Ignore,
}

/// Splits an entry name into its components: `.` and empty components dropped (`./usr//bin`
/// is `usr/bin`, `./` the root), `..` and absolute names refused.
fn components(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.len() > MAX_NAME_LEN {
        return Err("the name is longer than PATH_MAX");
    }
    if raw.first() == Some(&b'/') {
        return Err("an absolute name");
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("a `..` component"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Decides what an entry name asks (a pure function of the name).
fn plan(raw: &[u8]) -> Result<Planned<'_>, &'static str> {
    let mut comps = components(raw)?;
    let Some(last) = comps.last().copied() else {
        return Ok(Planned::Entry(comps));
    };
    if last == OPAQUE_MARKER {
        comps.pop();
        return Ok(Planned::Opaque(comps));
    }
    if last.starts_with(WHITEOUT_META_PREFIX) {
        return Ok(Planned::Ignore);
    }
    if let Some(name) = last.strip_prefix(WHITEOUT_PREFIX) {
        if name.is_empty() || name == b"." || name == b".." {
            return Err("a whiteout of no name");
        }
        comps.pop();
        return Ok(Planned::Whiteout { dir: comps, name });
    }
    Ok(Planned::Entry(comps))
}

/// The mode bits kept for an entry: permissions and sticky; setuid/setgid cleared on all but
/// directories (where setgid only means "new files take this group", no privilege, and Debian
/// ships such directories: `/var/mail`, `/var/local`). Returns the mode and whether it cleared.
fn kept_mode(mode: u32, is_dir: bool) -> (u32, bool) {
    let mode = mode & 0o7777;
    if is_dir {
        // Setuid on a directory means nothing on Linux; dropped without a report.
        return (mode & !0o4000, false);
    }
    let kept = mode & !0o6000;
    (kept, kept != mode)
}

/// The path key of a set of components, as `written` remembers them.
fn key(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

/// What one entry makes, decided from its tar header.
enum Kind {
    Dir,
    File,
    Symlink(Vec<u8>),
    HardLink(Vec<u8>),
    Fifo,
    Device { block: bool, major: u32, minor: u32 },
}

/// The state of applying one layer.
struct Applier<'r> {
    tree: Beneath,
    /// This layer's index, for the report.
    layer: u32,
    report: &'r mut UnpackReport,
    /// The names this layer made: its own whiteouts and opaque markers spare them (the spec:
    /// a whiteout applies to the lower layers only).
    written: HashSet<Vec<u8>>,
    /// The device nodes this layer skipped, so a hard link to one is skipped too.
    skipped_devices: HashSet<Vec<u8>>,
    /// Directories' mtimes, set at the end: making their entries would change them.
    dir_times: Vec<(Vec<u8>, Meta)>,
}

impl Applier<'_> {
    fn apply<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), UnpackError> {
        let raw = entry.path_bytes().into_owned();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let unsafe_entry = |why: &str| UnpackError::Unsafe {
            entry: text.clone(),
            why: why.to_owned(),
        };
        let planned = plan(&raw).map_err(unsafe_entry)?;
        let write = |op: &'static str| {
            let entry = text.clone();
            move |error: io::Error| UnpackError::Write { entry, op, error }
        };
        match planned {
            Planned::Ignore => Ok(()),
            Planned::Whiteout { dir, name } => {
                let mut target = dir.clone();
                target.push(name);
                if self.written.contains(&key(&target)) {
                    return Ok(());
                }
                self.tree
                    .delete(&dir, name)
                    .map_err(write("applying the whiteout"))
            }
            Planned::Opaque(dir) => self
                .tree
                .make_opaque(&dir, &self.written)
                .map_err(write("making the directory opaque")),
            Planned::Entry(comps) => {
                let (meta, xattrs) = Meta::of(entry).map_err(unsafe_entry)?;
                if !xattrs.is_empty() {
                    self.report.push(
                        self.layer,
                        &raw,
                        Neutralisation::XattrsIgnored { names: xattrs },
                    );
                }
                let kind = self.kind(entry, &text)?;
                self.make(&raw, &comps, kind, meta, entry, &text)
            }
        }
    }

    /// What the header asks to make.
    fn kind<R: Read>(&self, entry: &tar::Entry<'_, R>, text: &str) -> Result<Kind, UnpackError> {
        use tar::EntryType as T;
        let header = entry.header();
        let ty = header.entry_type();
        let link = || {
            entry
                .link_name_bytes()
                .map(|l| l.into_owned())
                .unwrap_or_default()
        };
        let device = |block| -> Result<Kind, UnpackError> {
            let num = |v: io::Result<Option<u32>>| v.ok().flatten().unwrap_or(0);
            Ok(Kind::Device {
                block,
                major: num(header.device_major()),
                minor: num(header.device_minor()),
            })
        };
        Ok(match ty {
            T::Directory => Kind::Dir,
            T::Regular | T::Continuous | T::GNUSparse => Kind::File,
            T::Symlink => Kind::Symlink(link()),
            T::Link => Kind::HardLink(link()),
            T::Fifo => Kind::Fifo,
            T::Char => device(false)?,
            T::Block => device(true)?,
            other => {
                return Err(UnpackError::Unsupported {
                    entry: text.to_owned(),
                    kind: char::from(other.as_byte()).escape_default().to_string(),
                });
            }
        })
    }

    /// Makes one entry (its parents created as plain directories if the layer lacks them).
    fn make<R: Read>(
        &mut self,
        raw: &[u8],
        comps: &[&[u8]],
        kind: Kind,
        meta: Meta,
        data: &mut R,
        text: &str,
    ) -> Result<(), UnpackError> {
        let write = |op: &'static str| {
            let entry = text.to_owned();
            move |error: io::Error| UnpackError::Write { entry, op, error }
        };
        let Some((name, parent)) = comps.split_last() else {
            // The root itself ("./"): only a directory may name it.
            if !matches!(kind, Kind::Dir) {
                return Err(UnpackError::Unsafe {
                    entry: text.to_owned(),
                    why: "a non-directory naming the root".to_owned(),
                });
            }
            let (mode, _) = kept_mode(meta.mode, true);
            self.tree
                .set_root(&meta, mode)
                .map_err(write("setting the root's owner and mode"))?;
            self.dir_times.push((Vec::new(), meta));
            return Ok(());
        };
        let path_key = key(comps);
        let parent_fd = self
            .tree
            .parent(parent)
            .map_err(write("opening its directory"))?;
        match kind {
            Kind::HardLink(target) => {
                let target_text = String::from_utf8_lossy(&target).into_owned();
                let target_comps = components(&target).map_err(|why| UnpackError::Unsafe {
                    entry: text.to_owned(),
                    why: format!("a hard link to {target_text:?}: {why}"),
                })?;
                let Some((target_name, target_parent)) = target_comps.split_last() else {
                    return Err(UnpackError::Unsafe {
                        entry: text.to_owned(),
                        why: "a hard link to the root".to_owned(),
                    });
                };
                if self.skipped_devices.contains(&key(&target_comps)) {
                    // The target was never made: the link is not either, and whatever the
                    // lower layers had at its name goes, as for the device itself.
                    beneath::clear_slot(&parent_fd, name, false)
                        .map_err(write("removing what the link replaces"))?;
                    self.report.push(
                        self.layer,
                        raw,
                        Neutralisation::LinkToSkippedDevice {
                            target: target_text,
                        },
                    );
                    self.skipped_devices.insert(path_key.clone());
                } else if target_comps != comps {
                    let target_fd = self
                        .tree
                        .existing_dir(target_parent)
                        .map_err(write("opening the link target's directory"))?;
                    beneath::link(&parent_fd, name, &target_fd, target_name)
                        .map_err(write("making the hard link"))?;
                }
            }
            Kind::Dir => {
                let (mode, _) = kept_mode(meta.mode, true);
                beneath::dir(&parent_fd, name, &meta, mode)
                    .map_err(write("making the directory"))?;
                self.dir_times.push((path_key.clone(), meta));
            }
            Kind::File => {
                let (mode, cleared) = kept_mode(meta.mode, false);
                beneath::file(&parent_fd, name, &meta, mode, data)
                    .map_err(write("writing the file"))?;
                if cleared {
                    self.report.push(
                        self.layer,
                        raw,
                        Neutralisation::SetIdCleared {
                            mode: meta.mode & 0o7777,
                        },
                    );
                }
            }
            Kind::Symlink(target) => {
                beneath::symlink(&parent_fd, name, &target, &meta)
                    .map_err(write("making the symlink"))?;
            }
            Kind::Fifo => {
                let (mode, cleared) = kept_mode(meta.mode, false);
                beneath::fifo(&parent_fd, name, &meta, mode).map_err(write("making the fifo"))?;
                if cleared {
                    self.report.push(
                        self.layer,
                        raw,
                        Neutralisation::SetIdCleared {
                            mode: meta.mode & 0o7777,
                        },
                    );
                }
            }
            Kind::Device {
                block,
                major,
                minor,
            } => {
                // Whatever the lower layers had at this name goes, as it would under the node.
                beneath::clear_slot(&parent_fd, name, false)
                    .map_err(write("removing what the device replaces"))?;
                self.report.push(
                    self.layer,
                    raw,
                    Neutralisation::DeviceSkipped {
                        block,
                        major,
                        minor,
                    },
                );
                self.skipped_devices.insert(path_key.clone());
            }
        }
        self.written.insert(path_key);
        Ok(())
    }

    /// Sets the directories' mtimes, once their entries are made.
    fn finish(&mut self) -> Result<(), UnpackError> {
        for (path, meta) in std::mem::take(&mut self.dir_times) {
            self.tree
                .set_dir_time(&path, &meta)
                .map_err(|source| UnpackError::Write {
                    entry: String::from_utf8_lossy(&path).into_owned(),
                    op: "setting the directory's mtime",
                    error: source,
                })?;
        }
        Ok(())
    }
}
