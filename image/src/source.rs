//! Reading an image from a local transport ([`open`]: an OCI layout directory, an OCI archive, a
//! Docker archive) and installing it in the [`Store`] ([`pull`]).
//!
//! Every byte is verified before it is trusted:
//! - the manifest the reference names against its pin (see [`crate::reference`] for what the
//!   pin is compared with); an image index is followed to the manifest for linux and this
//!   machine's architecture, each step by the digest the verified step before names;
//! - the config against the manifest's config digest (for a Docker archive the config's digest
//!   is the image ID, the pin);
//! - each layer blob, read whole against its digest and size before any layer is unpacked, so a
//!   flipped byte is refused before a single file is written;
//! - each layer's uncompressed stream against the config's `diff_id` while it is unpacked (and
//!   the blob once more, in case it changed since): a mismatch fails the install, and the store
//!   commits nothing.
//!
//! Layers are OCI or Docker v2 tars, uncompressed or gzip. zstd is refused with an error that
//! says so: no pure-Rust decoder is in the workspace, and images built for Docker use gzip.

mod blobs;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::reference::{Digest, ImageRef, Transport, normalise_docker_name};
use crate::store::{Store, StoredImage};
use crate::unpack::{UnpackError, UnpackReport, apply_layer};
use blobs::{Blobs, TarIndex};

/// Largest `index.json`, manifest, image index, `manifest.json` or config read: real ones are
/// kilobytes (a config with a long history some hundred), and each is held in memory whole.
pub const MAX_JSON_BYTES: u64 = 4 << 20;

/// Most image indexes followed from the one a reference names to an image manifest (an index
/// naming an index is allowed by OCI; a chain longer than this is a loop or an attack).
const MAX_INDEX_DEPTH: usize = 4;

/// The annotation an OCI layout's `index.json` names a manifest's tag with.
const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";

/// Image manifest media types (OCI, Docker v2 schema 2).
const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Image index media types (OCI, Docker manifest list).
const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// The media type of a Docker archive's layers: `docker save` writes plain tars.
const DOCKER_TAR_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";

/// The file a Docker archive lists its images in.
const DOCKER_MANIFEST: &str = "manifest.json";

/// An OCI layout's list of manifests.
const OCI_INDEX: &str = "index.json";

/// An image as its manifest and config describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// What the reference resolved to, the digest a pin must equal: the manifest or image index
    /// the tag (or the layout's only entry) names; for a Docker archive, the image ID.
    pub resolved: Digest,
    /// The image manifest used (for this machine's platform); for a Docker archive, which has
    /// none, the image ID.
    pub manifest: Digest,
    /// The config's digest, the image ID: the store's key.
    pub id: Digest,
    pub config: ImageConfig,
    /// The config as it was read (the bytes [`Image::id`] is the digest of).
    pub config_json: Vec<u8>,
    /// Bottom layer first.
    pub layers: Vec<Layer>,
}

/// One layer of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The blob as stored (compressed or not).
    pub digest: Digest,
    /// The uncompressed tar, from the config's `rootfs.diff_ids`.
    pub diff_id: Digest,
    pub media_type: String,
    /// The blob's size in bytes.
    pub size: u64,
}

/// What of an image's config a runner uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageConfig {
    /// `ENV`, in order, each `NAME=value` split at its first `=` (an entry without one is
    /// skipped: Docker never writes one).
    pub env: Vec<(String, String)>,
    /// `USER`, when set.
    pub user: Option<String>,
    /// `WORKDIR`, when set.
    pub working_dir: Option<String>,
    pub os: String,
    pub architecture: String,
}

/// An image opened from its transport: what it is, and its blobs to read.
pub struct Opened {
    pub image: Image,
    blobs: Blobs,
    /// Where each layer's blob is among [`Opened::blobs`], in [`Image::layers`]' order.
    layer_names: Vec<String>,
}

/// An image in the store.
#[derive(Debug)]
pub struct Installed {
    pub image: Image,
    pub stored: StoredImage,
    /// Whether this call unpacked it (false: the store had it already).
    pub unpacked: bool,
}

/// Why an image could not be read. Each names the file, member or digest concerned.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{reference} is not a local image: a docker:// image is downloaded first")]
    NotLocal { reference: String },
    // Each cause is in the message, and so not also a `source()`: a caller that prints the
    // chain (anyhow's `{:#}`, as `rm-agent run` does) would say it twice.
    #[error("cannot read {what}: {error}")]
    Io { what: String, error: io::Error },
    #[error("{what} is missing")]
    Missing { what: String },
    #[error("{what} is larger than the {limit} bytes allowed")]
    TooLarge { what: String, limit: u64 },
    #[error("{what} is not valid JSON of its kind: {error}")]
    Json {
        what: String,
        error: serde_json::Error,
    },
    #[error("{what} is malformed: {why}")]
    Malformed { what: String, why: String },
    #[error("{what} has the digest {actual}, not {expected}: it is corrupt or was replaced")]
    Digest {
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("{what} is {actual} bytes, not the {expected} its descriptor says")]
    Size {
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("{reference} is pinned to {pin} but names {actual}")]
    PinMismatch {
        reference: String,
        pin: Digest,
        actual: Digest,
    },
    #[error("{what} has no image named {name:?} (it has {available:?})")]
    NoSuchName {
        what: String,
        name: String,
        available: Vec<String>,
    },
    #[error("{what} holds {count} images (named {available:?}): the reference must name one")]
    Ambiguous {
        what: String,
        count: usize,
        available: Vec<String>,
    },
    #[error("{what} has no image for linux/{architecture} (it has {available:?})")]
    NoPlatform {
        what: String,
        architecture: String,
        available: Vec<String>,
    },
    #[error("{what} is an image for {os}/{architecture}, not for linux/{want}")]
    WrongPlatform {
        what: String,
        os: String,
        architecture: String,
        want: String,
    },
    #[error("this machine's architecture {0:?} has no OCI name")]
    UnknownArchitecture(&'static str),
    #[error("{what} has the media type {media_type:?}, which is not supported{hint}")]
    MediaType {
        what: String,
        media_type: String,
        hint: &'static str,
    },
    #[error(
        "layer {layer}: its uncompressed tar has the digest {actual}, not the diff_id {expected} \
         the config names: it is corrupt or was replaced"
    )]
    DiffId {
        layer: Digest,
        expected: Digest,
        actual: Digest,
    },
}

/// Why [`pull`] failed. Its message holds every cause, none of which is also a `source()`
/// (printed as a chain, it would be said twice).
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("cannot unpack layer {layer}: {error}")]
    Unpack { layer: Digest, error: UnpackError },
    #[error("the image store: {0}")]
    Store(io::Error),
}

impl From<io::Error> for PullError {
    fn from(error: io::Error) -> Self {
        PullError::Store(error)
    }
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
}

/// The compression a layer media type says, or why it is refused.
pub(crate) fn compression_of(media_type: &str) -> Result<Compression, &'static str> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Err(
            ": zstd layers are not read yet; rebuild the image with gzip layers \
             (docker buildx --output compression=gzip, or skopeo copy --dest-compress-format gzip)",
        ),
        _ => Err(": a layer must be a tar, plain or gzip"),
    }
}

/// The OCI name of a Rust target architecture (`std::env::consts::ARCH`).
pub(crate) fn oci_architecture(rust_arch: &str) -> Option<&'static str> {
    Some(match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        "mips64" => "mips64",
        _ => return None,
    })
}

/// This machine's OCI architecture.
fn host_architecture() -> Result<&'static str, SourceError> {
    let arch = std::env::consts::ARCH;
    oci_architecture(arch).ok_or(SourceError::UnknownArchitecture(arch))
}

/// An OCI descriptor: what a manifest or index names, by digest.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: Option<String>,
    digest: Digest,
    size: u64,
    #[serde(default)]
    annotations: HashMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

/// An image index or an image manifest: which it is comes from its media type, or, when it has
/// none (OCI made it optional), from what it holds.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestOrIndex {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

/// An image config: the parts read.
#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    config: Option<RawContainerConfig>,
    rootfs: RawRootfs,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawContainerConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    working_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawRootfs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<Digest>,
}

/// One image of a Docker archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

impl ImageConfig {
    /// The parts of an image config (JSON) a runner uses.
    pub fn parse(json: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(parse_config(json)?.0)
    }
}

/// An image config and its layers' diff_ids.
fn parse_config(json: &[u8]) -> Result<(ImageConfig, RawRootfs), serde_json::Error> {
    let raw: RawConfig = serde_json::from_slice(json)?;
    let inner = raw.config.unwrap_or_default();
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let env = inner
        .env
        .unwrap_or_default()
        .into_iter()
        .filter_map(|entry| {
            entry
                .split_once('=')
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
        })
        .collect();
    let config = ImageConfig {
        env,
        user: non_empty(inner.user),
        working_dir: non_empty(inner.working_dir),
        os: raw.os,
        architecture: raw.architecture,
    };
    Ok((config, raw.rootfs))
}

/// Opens a local image: reads and verifies its manifest and config (not its layers: [`pull`]
/// verifies those before and while unpacking them).
pub fn open(reference: &ImageRef) -> Result<Opened, SourceError> {
    match &reference.transport {
        Transport::OciLayout { dir, tag } => {
            open_oci(reference, Blobs::Dir(dir.clone()), tag.as_deref())
        }
        Transport::OciArchive { file, tag } => open_oci(
            reference,
            Blobs::Tar(TarIndex::build(file)?),
            tag.as_deref(),
        ),
        Transport::DockerArchive { file, name } => open_docker(
            reference,
            Blobs::Tar(TarIndex::build(file)?),
            name.as_deref(),
        ),
        Transport::Registry { .. } => Err(SourceError::NotLocal {
            reference: reference.to_string(),
        }),
    }
}

/// Opens `reference` and installs its image in `store` (nothing is read past the manifest and
/// config when the store has it already). Every layer blob is verified whole before the first
/// is unpacked; each layer's uncompressed stream is verified while it is unpacked, and any
/// failure leaves the store without the image.
pub fn pull(reference: &ImageRef, store: &Store) -> Result<Installed, PullError> {
    let opened = open(reference)?;
    if let Some(stored) = store.get(&opened.image.id) {
        return Ok(Installed {
            image: opened.image,
            stored,
            unpacked: false,
        });
    }
    opened.verify_layers()?;
    let mut unpacked = false;
    let stored = store.install(&opened.image.id, &opened.image.config_json, |rootfs| {
        unpacked = true;
        let mut report = UnpackReport::default();
        for index in 0..opened.image.layers.len() {
            opened.apply_layer(index, rootfs, &mut report)?;
        }
        Ok::<_, PullError>(report)
    })?;
    Ok(Installed {
        image: opened.image,
        stored,
        unpacked,
    })
}

impl Opened {
    /// Reads every layer blob whole and checks its size and digest: a corrupt layer is refused
    /// before anything is unpacked.
    pub fn verify_layers(&self) -> Result<(), SourceError> {
        for (layer, name) in self.image.layers.iter().zip(&self.layer_names) {
            let (reader, size) = self.blobs.open(name)?;
            let what = || self.blobs.describe(name);
            if size != layer.size {
                return Err(SourceError::Size {
                    what: what(),
                    expected: layer.size,
                    actual: size,
                });
            }
            // One byte past the size it should have: a file that grows while it is read is
            // caught by its count without being read to its (possibly no) end.
            let mut hashing = Hashing::new(reader.take(layer.size + 1));
            io::copy(&mut hashing, &mut io::sink()).map_err(|source| SourceError::Io {
                what: what(),
                error: source,
            })?;
            hashing.check(&what(), layer)?;
        }
        Ok(())
    }

    /// Applies layer `index` onto `root` with [`apply_layer`], checking its uncompressed stream
    /// against its diff_id and its blob against its digest once more.
    pub fn apply_layer(
        &self,
        index: usize,
        root: &Path,
        report: &mut UnpackReport,
    ) -> Result<(), PullError> {
        let (Some(layer), Some(name)) = (self.image.layers.get(index), self.layer_names.get(index))
        else {
            return Err(SourceError::Malformed {
                what: "the image".to_owned(),
                why: format!("it has no layer {index}"),
            }
            .into());
        };
        let what = self.blobs.describe(name);
        let compression =
            compression_of(&layer.media_type).map_err(|hint| SourceError::MediaType {
                what: what.clone(),
                media_type: layer.media_type.clone(),
                hint,
            })?;
        let (reader, _) = self.blobs.open(name)?;
        let mut blob = Hashing::new(reader);
        let diff_id = {
            let decoded: Box<dyn Read + '_> = match compression {
                Compression::None => Box::new(&mut blob),
                Compression::Gzip => Box::new(MultiGzDecoder::new(&mut blob)),
            };
            let mut tar = Hashing::new(decoded);
            apply_layer(root, &mut tar, report).map_err(|source| PullError::Unpack {
                layer: layer.digest,
                error: source,
            })?;
            drain(&mut tar, &what)?;
            Digest::from_hasher(tar.hasher)
        };
        drain(&mut blob, &what)?;
        blob.check(&what, layer)?;
        if diff_id != layer.diff_id {
            return Err(SourceError::DiffId {
                layer: layer.digest,
                expected: layer.diff_id,
                actual: diff_id,
            }
            .into());
        }
        Ok(())
    }
}

/// Reads what is left of a layer stream: its digest covers every byte, the tar's
/// end-of-archive blocks and a writer's padding included. Not bounded: the blob was verified
/// whole before, and gzip inflates a byte at most about a thousandfold.
fn drain(reader: &mut impl Read, what: &str) -> Result<(), SourceError> {
    io::copy(reader, &mut io::sink())
        .map(drop)
        .map_err(|source| SourceError::Io {
            what: what.to_owned(),
            error: source,
        })
}

/// A reader that hashes and counts what passes through it.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Whether what was read is `layer`'s blob.
    fn check(self, what: &str, layer: &Layer) -> Result<(), SourceError> {
        if self.count != layer.size {
            return Err(SourceError::Size {
                what: what.to_owned(),
                expected: layer.size,
                actual: self.count,
            });
        }
        let actual = Digest::from_hasher(self.hasher);
        if actual != layer.digest {
            return Err(SourceError::Digest {
                what: what.to_owned(),
                expected: layer.digest,
                actual,
            });
        }
        Ok(())
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// Parses JSON read from `what`.
fn json<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, SourceError> {
    serde_json::from_slice(bytes).map_err(|source| SourceError::Json {
        what: what.to_owned(),
        error: source,
    })
}

/// A blob's name in an OCI layout.
fn oci_blob(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

/// Reads the JSON blob `descriptor` names, checking its size and digest.
fn read_verified(blobs: &Blobs, descriptor: &Descriptor) -> Result<Vec<u8>, SourceError> {
    let name = oci_blob(&descriptor.digest);
    let what = blobs.describe(&name);
    if descriptor.size > MAX_JSON_BYTES {
        return Err(SourceError::TooLarge {
            what,
            limit: MAX_JSON_BYTES,
        });
    }
    let bytes = blobs.read_bounded(&name, MAX_JSON_BYTES)?;
    if bytes.len() as u64 != descriptor.size {
        return Err(SourceError::Size {
            what,
            expected: descriptor.size,
            actual: bytes.len() as u64,
        });
    }
    let actual = Digest::of(&bytes);
    if actual != descriptor.digest {
        return Err(SourceError::Digest {
            what,
            expected: descriptor.digest,
            actual,
        });
    }
    Ok(bytes)
}

/// The tag an OCI layout's `index.json` gives a manifest, for messages.
fn ref_name(descriptor: &Descriptor) -> String {
    descriptor
        .annotations
        .get(REF_NAME_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| descriptor.digest.to_string())
}

/// Which entry of a layout's `index.json` a reference names: the one tagged `tag`; with no
/// tag, the one the pin names, or else the only one.
fn select_entry<'a>(
    what: &str,
    entries: &'a [Descriptor],
    tag: Option<&str>,
    pin: Option<&Digest>,
) -> Result<&'a Descriptor, SourceError> {
    let available = || entries.iter().map(ref_name).collect::<Vec<_>>();
    let found = match (tag, pin) {
        (Some(tag), _) => entries
            .iter()
            .find(|d| d.annotations.get(REF_NAME_ANNOTATION).map(String::as_str) == Some(tag)),
        (None, Some(pin)) if entries.len() > 1 => entries.iter().find(|d| d.digest == *pin),
        (None, _) => match entries {
            [only] => Some(only),
            _ => {
                return Err(SourceError::Ambiguous {
                    what: what.to_owned(),
                    count: entries.len(),
                    available: available(),
                });
            }
        },
    };
    found.ok_or_else(|| SourceError::NoSuchName {
        what: what.to_owned(),
        name: tag.map_or_else(
            || pin.map(ToString::to_string).unwrap_or_default(),
            str::to_owned,
        ),
        available: available(),
    })
}

/// The entry of an image index for linux on `architecture` (the first, when several: variants
/// are not told apart).
fn select_platform<'a>(
    what: &str,
    manifests: &'a [Descriptor],
    architecture: &str,
) -> Result<&'a Descriptor, SourceError> {
    manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == architecture)
        })
        .ok_or_else(|| SourceError::NoPlatform {
            what: what.to_owned(),
            architecture: architecture.to_owned(),
            available: manifests
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect(),
        })
}

/// Whether a document is an image index (`Ok(true)`) or an image manifest, from the media type
/// its descriptor or itself gives, or else from what it holds.
fn is_index(
    what: &str,
    descriptor: &Descriptor,
    doc: &ManifestOrIndex,
) -> Result<bool, SourceError> {
    let media_type = descriptor
        .media_type
        .as_deref()
        .or(doc.media_type.as_deref());
    match media_type {
        Some(t) if INDEX_TYPES.contains(&t) => Ok(true),
        Some(t) if MANIFEST_TYPES.contains(&t) => Ok(false),
        Some(t) => Err(SourceError::MediaType {
            what: what.to_owned(),
            media_type: t.to_owned(),
            hint: ": an OCI or Docker v2 image manifest or index is expected",
        }),
        None => Ok(doc.manifests.is_some()),
    }
}

/// An OCI layout, a directory or an archive.
fn open_oci(reference: &ImageRef, blobs: Blobs, tag: Option<&str>) -> Result<Opened, SourceError> {
    let index_what = blobs.describe(OCI_INDEX);
    let index: ManifestOrIndex =
        json(&index_what, &blobs.read_bounded(OCI_INDEX, MAX_JSON_BYTES)?)?;
    let entries = index.manifests.unwrap_or_default();
    let entry = select_entry(&index_what, &entries, tag, reference.pin.as_ref())?;
    check_pin(reference, entry.digest)?;
    let architecture = host_architecture()?;

    let mut descriptor = entry.clone();
    for _ in 0..=MAX_INDEX_DEPTH {
        let what = blobs.describe(&oci_blob(&descriptor.digest));
        let bytes = read_verified(&blobs, &descriptor)?;
        let doc: ManifestOrIndex = json(&what, &bytes)?;
        if is_index(&what, &descriptor, &doc)? {
            let manifests = doc.manifests.unwrap_or_default();
            descriptor = select_platform(&what, &manifests, architecture)?.clone();
            continue;
        }
        let (Some(config), Some(layers)) = (doc.config, doc.layers) else {
            return Err(SourceError::Malformed {
                what,
                why: "an image manifest without config or layers".to_owned(),
            });
        };
        let config_what = blobs.describe(&oci_blob(&config.digest));
        let config_json = read_verified(&blobs, &config)?;
        let (image_config, rootfs) = json_config(&config_what, &config_json, architecture)?;
        if rootfs.diff_ids.len() != layers.len() {
            return Err(SourceError::Malformed {
                what: config_what,
                why: format!(
                    "{} diff_ids for the manifest's {} layers",
                    rootfs.diff_ids.len(),
                    layers.len()
                ),
            });
        }
        let mut image_layers = Vec::with_capacity(layers.len());
        let mut layer_names = Vec::with_capacity(layers.len());
        for (layer, diff_id) in layers.into_iter().zip(rootfs.diff_ids) {
            let media_type = layer.media_type.unwrap_or_default();
            compression_of(&media_type).map_err(|hint| SourceError::MediaType {
                what: blobs.describe(&oci_blob(&layer.digest)),
                media_type: media_type.clone(),
                hint,
            })?;
            layer_names.push(oci_blob(&layer.digest));
            image_layers.push(Layer {
                digest: layer.digest,
                diff_id,
                media_type,
                size: layer.size,
            });
        }
        return Ok(Opened {
            image: Image {
                resolved: entry.digest,
                manifest: descriptor.digest,
                id: config.digest,
                config: image_config,
                config_json,
                layers: image_layers,
            },
            blobs,
            layer_names,
        });
    }
    Err(SourceError::Malformed {
        what: index_what,
        why: format!("image indexes nested more than {MAX_INDEX_DEPTH} deep"),
    })
}

/// Parses a config and checks it is for linux on `architecture`, with layers.
fn json_config(
    what: &str,
    bytes: &[u8],
    architecture: &str,
) -> Result<(ImageConfig, RawRootfs), SourceError> {
    let (config, rootfs) = parse_config(bytes).map_err(|source| SourceError::Json {
        what: what.to_owned(),
        error: source,
    })?;
    if config.os != "linux" || config.architecture != architecture {
        return Err(SourceError::WrongPlatform {
            what: what.to_owned(),
            os: config.os,
            architecture: config.architecture,
            want: architecture.to_owned(),
        });
    }
    if rootfs.kind != "layers" {
        return Err(SourceError::Malformed {
            what: what.to_owned(),
            why: format!("rootfs type {:?}, not \"layers\"", rootfs.kind),
        });
    }
    Ok((config, rootfs))
}

fn check_pin(reference: &ImageRef, actual: Digest) -> Result<(), SourceError> {
    match reference.pin {
        Some(pin) if pin != actual => Err(SourceError::PinMismatch {
            reference: reference.to_string(),
            pin,
            actual,
        }),
        _ => Ok(()),
    }
}

/// A Docker archive (`docker save`): its `manifest.json` lists images by `RepoTags`, each with
/// its config file (whose digest is the image ID) and its layers, plain tars whose digests are
/// the config's diff_ids.
fn open_docker(
    reference: &ImageRef,
    blobs: Blobs,
    name: Option<&str>,
) -> Result<Opened, SourceError> {
    let what = blobs.describe(DOCKER_MANIFEST);
    let entries: Vec<DockerEntry> =
        json(&what, &blobs.read_bounded(DOCKER_MANIFEST, MAX_JSON_BYTES)?)?;
    let entry = select_docker_entry(&what, &entries, name)?;

    let config_what = blobs.describe(&entry.config);
    let config_json = blobs.read_bounded(&entry.config, MAX_JSON_BYTES)?;
    let id = Digest::of(&config_json);
    // `docker save` names the config by the image ID (`<hex>.json`, or `blobs/sha256/<hex>`
    // since Docker 25): a name that says a digest must be it.
    if let Some(named) = digest_in_name(&entry.config)
        && named != id
    {
        return Err(SourceError::Digest {
            what: config_what,
            expected: named,
            actual: id,
        });
    }
    check_pin(reference, id)?;
    let (image_config, rootfs) = json_config(&config_what, &config_json, host_architecture()?)?;
    if rootfs.diff_ids.len() != entry.layers.len() {
        return Err(SourceError::Malformed {
            what: config_what,
            why: format!(
                "{} diff_ids for the {} layers {DOCKER_MANIFEST} lists",
                rootfs.diff_ids.len(),
                entry.layers.len()
            ),
        });
    }
    let mut layers = Vec::with_capacity(entry.layers.len());
    for (name, diff_id) in entry.layers.iter().zip(&rootfs.diff_ids) {
        let (_, size) = blobs.open(name)?;
        layers.push(Layer {
            // A plain tar: the blob is the uncompressed stream.
            digest: *diff_id,
            diff_id: *diff_id,
            media_type: DOCKER_TAR_LAYER.to_owned(),
            size,
        });
    }
    Ok(Opened {
        image: Image {
            resolved: id,
            manifest: id,
            id,
            config: image_config,
            config_json,
            layers,
        },
        blobs,
        layer_names: entry.layers.clone(),
    })
}

/// The image of a Docker archive a reference names: the one whose `RepoTags` hold `name`
/// (both normalised as Docker does), or with no name the only one.
fn select_docker_entry<'a>(
    what: &str,
    entries: &'a [DockerEntry],
    name: Option<&str>,
) -> Result<&'a DockerEntry, SourceError> {
    let tags = |e: &'a DockerEntry| e.repo_tags.iter().flatten();
    let available = || entries.iter().flat_map(tags).cloned().collect::<Vec<_>>();
    match (name, entries) {
        (None, [only]) => Ok(only),
        (None, _) => Err(SourceError::Ambiguous {
            what: what.to_owned(),
            count: entries.len(),
            available: available(),
        }),
        (Some(name), _) => entries
            .iter()
            .find(|e| tags(e).any(|t| normalise_docker_name(t).is_ok_and(|t| t == name)))
            .ok_or_else(|| SourceError::NoSuchName {
                what: what.to_owned(),
                name: name.to_owned(),
                available: available(),
            }),
    }
}

/// The digest a Docker archive's member name spells, if it spells one: `<hex>.json` or
/// `blobs/sha256/<hex>`.
fn digest_in_name(name: &str) -> Option<Digest> {
    let file = name.rsplit('/').next()?;
    let hex = file.strip_suffix(".json").unwrap_or(file);
    Digest::parse(&format!("sha256:{hex}")).ok()
}
