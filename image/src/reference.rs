//! Image references: the text an operator writes in `policy.image`, in the transport syntax of
//! skopeo and podman, parsed into an [`ImageRef`] (where the image is, and the digest it is
//! pinned to), and the [`Digest`] every verified byte is compared with.
//!
//! The forms ([`ImageRef::parse`]; each may end in `@sha256:<64 hex>`, the pin):
//! - `oci:/path/to/layout[:tag]`: an OCI image layout directory; the tag is the
//!   `org.opencontainers.image.ref.name` annotation in its `index.json`.
//! - `oci-archive:/path/to/layout.tar[:tag]`: the same layout as a tar file.
//! - `docker-archive:/path/to/image.tar[:name[:tag]]`: what `docker save` writes; the name picks
//!   an image by its `RepoTags` (Docker's normalisation on both sides).
//! - `docker://[registry/]name[:tag]`: a registry, with Docker's normalisation (`docker.io`,
//!   `library/` for its official images, `latest` when neither tag nor pin is given).
//!
//! What the pin is compared with: for `oci:`, `oci-archive:` and `docker://`, the digest of the
//! manifest the reference names (the image index when the name is a multi-platform image, as
//! `docker pull name@sha256:...` takes it); for `docker-archive:`, which has no manifest, the
//! image ID (the digest of the image's config, what `docker images --digests` calls the ID).
//!
//! Paths must be absolute (a policy is read by an agent whose working directory is nobody's
//! business) and cannot contain `:` (the separator, as in skopeo).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// The one digest algorithm accepted: every OCI and Docker image in use is addressed by sha256,
/// and accepting only it means two spellings can never name one blob.
const SHA256_PREFIX: &str = "sha256:";

/// Length of a sha256 digest in bytes.
const SHA256_LEN: usize = 32;

/// Longest tag, as the OCI distribution spec and Docker allow.
const MAX_TAG_LEN: usize = 128;

/// Longest repository name (without the registry), as Docker allows.
const MAX_REPOSITORY_LEN: usize = 255;

/// The registry Docker means when a name has none.
pub const DOCKER_HUB: &str = "docker.io";

/// Another spelling of [`DOCKER_HUB`], normalised to it as Docker does.
const DOCKER_HUB_LEGACY: &str = "index.docker.io";

/// The namespace of Docker Hub's official images (`busybox` is `library/busybox`).
const DOCKER_HUB_OFFICIAL: &str = "library/";

/// The tag Docker means when a name has neither a tag nor a pin.
pub const DEFAULT_TAG: &str = "latest";

/// A sha256 content digest, `sha256:<64 lower-case hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; SHA256_LEN]);

/// Why a digest or a reference was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("{0:?} is not a digest: expected sha256:<64 lower-case hex digits>")]
    Digest(String),
    #[error("{0:?} names no transport: expected oci:, oci-archive:, docker-archive: or docker://")]
    Transport(String),
    #[error("the path {0:?} is not absolute")]
    RelativePath(String),
    #[error("the tag {0:?} is not a tag: 1 to 128 of A-Z a-z 0-9 _ . - not starting with . or -")]
    Tag(String),
    #[error("the image name {0:?} is not a repository name: lower-case a-z 0-9 and separators")]
    Name(String),
    #[error("the registry {0:?} is not a host name with an optional port")]
    Registry(String),
}

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`; anything else (another algorithm, upper case, a
    /// short digest) is refused.
    pub fn parse(text: &str) -> Result<Self, RefError> {
        let bad = || RefError::Digest(text.to_owned());
        let hex_part = text.strip_prefix(SHA256_PREFIX).ok_or_else(bad)?;
        if hex_part.len() != 2 * SHA256_LEN
            || !hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        let mut bytes = [0; SHA256_LEN];
        hex::decode_to_slice(hex_part, &mut bytes).map_err(|_| bad())?;
        Ok(Self(bytes))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a hasher has computed (for streams hashed while they are read).
    pub fn from_hasher(hasher: Sha256) -> Self {
        Self(hasher.finalize().into())
    }

    /// The 64 lower-case hex digits, without the algorithm (a file name in a layout's
    /// `blobs/sha256/` or in the store).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SHA256_PREFIX}{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = RefError;
    fn from_str(s: &str) -> Result<Self, RefError> {
        Self::parse(s)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Where an image is read from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Transport {
    /// An OCI image layout directory; `tag` is matched against the
    /// `org.opencontainers.image.ref.name` annotation (none: the layout's only manifest).
    OciLayout { dir: PathBuf, tag: Option<String> },
    /// A tar file of an OCI image layout.
    OciArchive { file: PathBuf, tag: Option<String> },
    /// What `docker save` writes; `name` is the normalised `registry/repository:tag` matched
    /// against the archive's `RepoTags` (none: the archive's only image).
    DockerArchive { file: PathBuf, name: Option<String> },
    /// A registry; `tag` is `None` only when the reference is pinned and names no tag.
    Registry {
        registry: String,
        repository: String,
        tag: Option<String>,
    },
}

/// An image reference: where the image is and, optionally, the digest it must have (see the
/// module's doc for what the pin is compared with).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    pub transport: Transport,
    pub pin: Option<Digest>,
}

impl ImageRef {
    /// Parses one of the forms in the module's doc.
    pub fn parse(text: &str) -> Result<Self, RefError> {
        let (rest, pin) = split_pin(text)?;
        let transport = if let Some(body) = rest.strip_prefix("oci:") {
            let (dir, tag) = path_and_tag(body)?;
            Transport::OciLayout { dir, tag }
        } else if let Some(body) = rest.strip_prefix("oci-archive:") {
            let (file, tag) = path_and_tag(body)?;
            Transport::OciArchive { file, tag }
        } else if let Some(body) = rest.strip_prefix("docker-archive:") {
            let (file, name) = match body.split_once(':') {
                Some((path, name)) => (path, Some(normalise_docker_name(name)?)),
                None => (body, None),
            };
            Transport::DockerArchive {
                file: absolute(file)?,
                name,
            }
        } else if let Some(body) = rest.strip_prefix("docker://") {
            let (registry, repository, tag) = docker_name(body, pin.is_some())?;
            Transport::Registry {
                registry,
                repository,
                tag,
            }
        } else {
            return Err(RefError::Transport(text.to_owned()));
        };
        Ok(Self { transport, pin })
    }

    /// Whether the image is read from a file or directory on this machine (not a registry).
    pub fn is_local(&self) -> bool {
        !matches!(self.transport, Transport::Registry { .. })
    }
}

impl fmt::Display for ImageRef {
    /// The canonical text: [`ImageRef::parse`] gives back an equal reference.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = |f: &mut fmt::Formatter<'_>, sep: char, part: &Option<String>| match part {
            Some(part) => write!(f, "{sep}{part}"),
            None => Ok(()),
        };
        match &self.transport {
            Transport::OciLayout { dir, tag } => {
                write!(f, "oci:{}", dir.display())?;
                suffix(f, ':', tag)?;
            }
            Transport::OciArchive { file, tag } => {
                write!(f, "oci-archive:{}", file.display())?;
                suffix(f, ':', tag)?;
            }
            Transport::DockerArchive { file, name } => {
                write!(f, "docker-archive:{}", file.display())?;
                suffix(f, ':', name)?;
            }
            Transport::Registry {
                registry,
                repository,
                tag,
            } => {
                write!(f, "docker://{registry}/{repository}")?;
                suffix(f, ':', tag)?;
            }
        }
        match &self.pin {
            Some(pin) => write!(f, "@{pin}"),
            None => Ok(()),
        }
    }
}

impl FromStr for ImageRef {
    type Err = RefError;
    fn from_str(s: &str) -> Result<Self, RefError> {
        Self::parse(s)
    }
}

impl serde::Serialize for ImageRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ImageRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Splits a trailing `@<digest>` off. The part after the last `@` is a pin unless it holds a
/// `/` (then the `@` is part of a path); a pin that is not a sha256 digest is refused rather
/// than read as part of the name.
fn split_pin(text: &str) -> Result<(&str, Option<Digest>), RefError> {
    match text.rsplit_once('@') {
        Some((rest, pin)) if !pin.contains('/') => Ok((rest, Some(Digest::parse(pin)?))),
        _ => Ok((text, None)),
    }
}

/// `/path[:tag]` of the OCI transports.
fn path_and_tag(body: &str) -> Result<(PathBuf, Option<String>), RefError> {
    let (path, tag) = match body.split_once(':') {
        Some((path, tag)) => (path, Some(valid_tag(tag)?)),
        None => (body, None),
    };
    Ok((absolute(path)?, tag))
}

fn absolute(path: &str) -> Result<PathBuf, RefError> {
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(RefError::RelativePath(path.to_owned()))
    }
}

/// A tag as Docker and the OCI distribution spec define it: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn valid_tag(tag: &str) -> Result<String, RefError> {
    let mut bytes = tag.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    if first_ok
        && tag.len() <= MAX_TAG_LEN
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        Ok(tag.to_owned())
    } else {
        Err(RefError::Tag(tag.to_owned()))
    }
}

/// A Docker image name `[registry/]repository[:tag]` with Docker's normalisation: the first
/// component is a registry when it holds a `.` or a `:` or is `localhost`, else the name is on
/// [`DOCKER_HUB`], where a one-component name is an official image under `library/`. With no
/// tag, [`DEFAULT_TAG`] unless `pinned` (a pinned name needs no tag).
fn docker_name(name: &str, pinned: bool) -> Result<(String, String, Option<String>), RefError> {
    // A tag follows the last ':' after the last '/' (a ':' before it is a registry's port).
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let (name_part, tag) = match name[last_slash..].rfind(':') {
        Some(i) => {
            let at = last_slash + i;
            (&name[..at], Some(valid_tag(&name[at + 1..])?))
        }
        None => (name, None),
    };
    let (registry, repository) = match name_part.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_owned(), rest.to_owned())
        }
        _ => (DOCKER_HUB.to_owned(), name_part.to_owned()),
    };
    let registry = if registry == DOCKER_HUB_LEGACY {
        DOCKER_HUB.to_owned()
    } else {
        registry
    };
    if !valid_registry(&registry) {
        return Err(RefError::Registry(registry));
    }
    if !valid_repository(&repository) {
        return Err(RefError::Name(name.to_owned()));
    }
    let repository = if registry == DOCKER_HUB && !repository.contains('/') {
        format!("{DOCKER_HUB_OFFICIAL}{repository}")
    } else {
        repository
    };
    let tag = match tag {
        None if !pinned => Some(DEFAULT_TAG.to_owned()),
        tag => tag,
    };
    Ok((registry, repository, tag))
}

/// A Docker image name (as in a Docker archive's `RepoTags`) normalised as Docker does:
/// `registry/repository:tag`, [`DEFAULT_TAG`] when it has no tag.
pub(crate) fn normalise_docker_name(name: &str) -> Result<String, RefError> {
    let (registry, repository, tag) = docker_name(name, false)?;
    let tag = tag.unwrap_or_else(|| DEFAULT_TAG.to_owned());
    Ok(format!("{registry}/{repository}:{tag}"))
}

/// A host name (letters, digits, `.` and `-`) with an optional numeric port.
fn valid_registry(registry: &str) -> bool {
    let (host, port) = match registry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        && !host.starts_with(['.', '-'])
        && port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Docker's repository grammar: `/`-separated components of lower-case letters and digits,
/// joined within a component by `.`, `_`, `__` or runs of `-`.
fn valid_repository(repository: &str) -> bool {
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if bytes.first().is_none_or(|b| !alnum(b)) || bytes.last().is_none_or(|b| !alnum(b)) {
            return false;
        }
        // Separators: a single '.', one or two '_', or any run of '-'.
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b if alnum(&b) => i += 1,
                b'.' => {
                    if !bytes.get(i + 1).is_some_and(alnum) {
                        return false;
                    }
                    i += 1;
                }
                b'_' => {
                    let run = bytes[i..].iter().take_while(|&&b| b == b'_').count();
                    if run > 2 || !bytes.get(i + run).is_some_and(alnum) {
                        return false;
                    }
                    i += run;
                }
                b'-' => {
                    let run = bytes[i..].iter().take_while(|&&b| b == b'-').count();
                    if !bytes.get(i + run).is_some_and(alnum) {
                        return false;
                    }
                    i += run;
                }
                _ => return false,
            }
        }
        true
    };
    !repository.is_empty()
        && repository.len() <= MAX_REPOSITORY_LEN
        && repository.split('/').all(component_ok)
}

#[cfg(test)]
mod tests;
