//! `docker://` images: a client of the OCI distribution API (v2) that resolves a tag to its
//! manifest digest and downloads an image into an OCI image layout directory, which
//! [`crate::source`] then reads like any `oci:` layout.
//!
//! Every byte kept is verified: a manifest against the digest it was asked by (or the
//! registry's `Docker-Content-Digest`), the platform manifest against its index entry, the
//! config and each layer against their descriptors' digest and size, streamed to a partial file
//! and renamed into `blobs/sha256/` only once it verifies. A blob already present and
//! verifying is not fetched again, so a download cut short resumes. `index.json`, written
//! last, names the one manifest of this machine's platform (`linux/<arch>`, followed from an
//! index or manifest list); the index itself is kept among the blobs too, so that a second
//! download of the same digest sends no request at all.
//!
//! Transport: HTTPS with the host's roots; plain HTTP only to a loopback registry (`localhost`,
//! 127.0.0.0/8, `::1`: Docker's default insecure registries) or to a mirror named `http://`.
//! Authentication: on a `401`, the challenge's Bearer token (fetched from its realm with the
//! basic credentials when there are some, anonymously otherwise) or, for a `Basic` challenge,
//! the credentials themselves. Credentials and tokens are held in `SecretString` and never
//! reach a message or a log. The mirror (`policy.docker_registry_mirror`) serves `docker.io`
//! only and is tried first; when it fails, Docker Hub is asked, as Docker's
//! `registry-mirrors` do. The mirror gets the same credentials as Docker Hub (Docker's rule).

mod auth;
mod client;
mod layout;
mod manifest;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::{StreamExt as _, TryStreamExt as _};
use http::Method;
use secrecy::SecretString;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::reference::{DOCKER_HUB, Digest};

use client::{Client, Endpoint};
use layout::Layout;
use manifest::{Descriptor, Manifest};

/// The largest manifest or index read (the distribution spec's registries accept 4 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// How many blobs of one image are downloaded at once (Docker's `max-concurrent-downloads`
/// default is 3).
pub const MAX_PARALLEL_BLOBS: usize = 3;

/// The other names of Docker Hub a reference may use; all three are served by
/// [`DOCKER_HUB_API`].
const DOCKER_HUB_ALIASES: [&str; 3] = [DOCKER_HUB, "index.docker.io", "registry-1.docker.io"];

/// Where Docker Hub's distribution API is.
const DOCKER_HUB_API: &str = "https://registry-1.docker.io";

/// The longest repository name accepted (the distribution spec's limit with the registry).
const MAX_REPOSITORY_LEN: usize = 255;

/// The longest tag (the distribution spec's grammar: 128 characters).
const MAX_TAG_LEN: usize = 128;

/// Credentials for a registry: a user and a password or access token.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub user: String,
    pub password: SecretString,
}

/// How a [`Registry`] reaches registries.
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// A mirror of Docker Hub (`http://` or `https://`, with an optional path prefix), asked
    /// first for `docker.io` images only; Docker Hub is asked when it fails.
    pub mirror: Option<http::Uri>,
    /// Sent when a registry asks for them (to a token realm, or as basic auth); anonymous
    /// otherwise.
    pub credentials: Option<Credentials>,
}

/// Why a registry operation failed. No variant holds a credential or a token.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry itself failed after its mirror had: both are said, the registry's first.
    #[error("{error}; before it, {mirror}")]
    AfterMirror {
        /// The mirror's failure, as it was said.
        mirror: String,
        error: Box<RegistryError>,
    },
    /// A registry, repository, tag or digest that cannot be asked for.
    #[error("{detail}")]
    Invalid { detail: String },
    /// The host's root certificates could not be loaded.
    #[error("cannot load the host's root certificates: {0}")]
    Roots(#[source] std::io::Error),
    /// Connecting, TLS or the transfer failed.
    #[error("cannot reach {registry}: {detail}")]
    Unreachable { registry: String, detail: String },
    /// A wait went past its bound.
    #[error("{registry} did not answer for {what} within {after:?}")]
    Timeout {
        registry: String,
        what: String,
        after: Duration,
    },
    /// The registry or its token service refused us.
    #[error("{registry} refused access{}: {detail}", user.as_ref().map(|u| format!(" as user {u:?}")).unwrap_or_default())]
    Unauthorized {
        registry: String,
        user: Option<String>,
        detail: String,
    },
    /// Authenticated, but not allowed.
    #[error("{registry} denies access to {what}")]
    Denied { registry: String, what: String },
    /// The registry has no such manifest or blob.
    #[error("{registry} has no {what}")]
    NotFound { registry: String, what: String },
    /// Another error status.
    #[error("{registry} answered {status} for {what}{codes}")]
    Status {
        registry: String,
        what: String,
        status: u16,
        codes: String,
    },
    /// A body larger than its bound.
    #[error("{what} from {registry} is larger than {limit} bytes")]
    TooLarge {
        registry: String,
        what: String,
        limit: u64,
    },
    /// Bytes that are not what their digest says: refused, not kept.
    #[error("{what} from {registry} does not match its digest: expected {expected}, got {actual}")]
    DigestMismatch {
        registry: String,
        what: String,
        expected: String,
        actual: String,
    },
    /// A blob of another length than its descriptor says: refused, not kept.
    #[error("{what} from {registry} is {actual} bytes, not the {expected} its descriptor says")]
    SizeMismatch {
        registry: String,
        what: String,
        expected: u64,
        actual: u64,
    },
    /// A manifest this client cannot use (schema 1, unknown media type, malformed).
    #[error("{registry}: {what}: {detail}")]
    BadManifest {
        registry: String,
        what: String,
        detail: String,
    },
    /// The index has no manifest for this machine.
    #[error("{registry}: {what} has no image for linux/{arch} (it has: {available})")]
    NoPlatform {
        registry: String,
        what: String,
        arch: String,
        available: String,
    },
    /// The registry broke the protocol (an unreadable redirect or token answer, too many
    /// redirects).
    #[error("{registry}: {detail}")]
    Protocol { registry: String, detail: String },
    /// Plain HTTP where only HTTPS is allowed (a redirect or token realm off loopback).
    #[error(
        "{registry}: refused plain HTTP to {url}: only loopback registries and an http:// mirror are reached without TLS"
    )]
    Insecure { registry: String, url: String },
    /// Writing the layout failed.
    #[error("cannot write the image layout at {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl RegistryError {
    /// Whether the error came from the registry's side (another endpoint may do better), rather
    /// than from the request or this machine.
    fn is_remote(&self) -> bool {
        !matches!(
            self,
            RegistryError::Invalid { .. } | RegistryError::Roots(_) | RegistryError::Io { .. }
        )
    }
}

/// What a download or resolve is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reference {
    Tag(String),
    Digest(Digest),
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reference::Tag(tag) => f.write_str(tag),
            Reference::Digest(digest) => write!(f, "{digest}"),
        }
    }
}

/// A client for `docker://` images.
pub struct Registry {
    client: Client,
    mirror: Option<Endpoint>,
    /// Docker Hub's endpoint (a field so that tests can stand a fake in for it).
    hub: Endpoint,
}

impl Registry {
    /// A client. Fails when the host's root certificates cannot be loaded or the mirror is not
    /// an `http://` or `https://` URL with a host.
    pub fn new(options: RegistryOptions) -> Result<Registry, RegistryError> {
        let mirror = options.mirror.as_ref().map(mirror_endpoint).transpose()?;
        let client = Client::new(options.credentials).map_err(RegistryError::Roots)?;
        let hub = Endpoint {
            name: DOCKER_HUB.to_owned(),
            base: DOCKER_HUB_API.to_owned(),
            plain_host: None,
        };
        Ok(Registry {
            client,
            mirror,
            hub,
        })
    }

    /// The digest of the manifest `tag` names in `repository` of `registry` (a `HEAD`, its
    /// `Docker-Content-Digest`; a `GET` whose bytes are hashed when the registry does not say).
    /// For a multi-platform image this is the index's digest, as Docker reports it.
    pub async fn resolve(
        &self,
        registry: &str,
        repository: &str,
        tag: &str,
    ) -> Result<Digest, RegistryError> {
        check_repository(repository)?;
        check_tag(tag)?;
        let endpoints = self.endpoints(registry)?;
        let mut last = None;
        for (i, ep) in endpoints.iter().enumerate() {
            match self.resolve_at(ep, repository, tag).await {
                Ok(digest) => return Ok(digest),
                Err(e) => last = Some(next_endpoint(e, ep, i, endpoints.len(), last.take())?),
            }
        }
        Err(no_endpoint(last))
    }

    /// Downloads the image `reference` (a tag or a `sha256:` digest) names into an OCI image
    /// layout at `into` (created as needed; blobs already there and verifying are kept) and
    /// returns the digest of the manifest `index.json` names: the image manifest for
    /// `linux/<this arch>`. That is the reference's own digest unless the reference names an
    /// index (a multi-platform image, whose pin and [`Registry::resolve`] give the index's
    /// digest): a caller must not compare the two. A digest reference is verified here (the
    /// bytes fetched or kept must hash to it), so there is nothing left to compare. One
    /// download at a time per `into`.
    pub async fn download(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        into: &Path,
    ) -> Result<Digest, RegistryError> {
        check_repository(repository)?;
        let reference = parse_reference(reference)?;
        let endpoints = self.endpoints(registry)?;
        let dir = into.to_owned();
        let layout = blocking(into, move || Layout::prepare(&dir)).await?;
        let mut last = None;
        for (i, ep) in endpoints.iter().enumerate() {
            match self
                .download_at(ep, repository, &reference, &layout, into)
                .await
            {
                Ok(digest) => return Ok(digest),
                Err(e) => last = Some(next_endpoint(e, ep, i, endpoints.len(), last.take())?),
            }
        }
        Err(no_endpoint(last))
    }

    /// How many HTTP requests this registry client has sent.
    #[cfg(test)]
    fn requests_sent(&self) -> u64 {
        self.client.requests_sent()
    }

    /// The endpoints to try in order for `registry`: the mirror first for Docker Hub.
    fn endpoints(&self, registry: &str) -> Result<Vec<Endpoint>, RegistryError> {
        if DOCKER_HUB_ALIASES.contains(&registry.to_ascii_lowercase().as_str()) {
            let hub = self.hub.clone();
            return Ok(self.mirror.iter().cloned().chain([hub]).collect());
        }
        let authority: http::uri::Authority =
            registry.parse().map_err(|_| RegistryError::Invalid {
                detail: format!("{registry:?} is not a registry host[:port]"),
            })?;
        if registry.is_empty() || registry.contains('@') || authority.host().is_empty() {
            return Err(RegistryError::Invalid {
                detail: format!("{registry:?} is not a registry host[:port]"),
            });
        }
        let scheme = if auth::is_loopback_host(authority.host()) {
            "http"
        } else {
            "https"
        };
        Ok(vec![Endpoint {
            name: registry.to_owned(),
            base: format!("{scheme}://{authority}"),
            plain_host: None,
        }])
    }

    async fn resolve_at(
        &self,
        ep: &Endpoint,
        repository: &str,
        tag: &str,
    ) -> Result<Digest, RegistryError> {
        let what = format!("the manifest {repository}:{tag}");
        let path = format!("manifests/{tag}");
        let response = self
            .client
            .request(
                ep,
                repository,
                &path,
                Method::HEAD,
                Some(manifest::MANIFEST_ACCEPT),
                &what,
            )
            .await?;
        let response = client::check_status(ep, response, &what, self.user()).await?;
        if let Some(digest) = header_digest(&response) {
            return Ok(digest);
        }
        let fetched = self
            .fetch_manifest(ep, repository, &Reference::Tag(tag.to_owned()), None)
            .await?;
        Ok(fetched.digest)
    }

    async fn download_at(
        &self,
        ep: &Endpoint,
        repository: &str,
        reference: &Reference,
        layout: &Layout,
        into: &Path,
    ) -> Result<Digest, RegistryError> {
        let top = self
            .manifest(ep, repository, reference, None, layout, into)
            .await?;
        let what = format!("the manifest {repository}@{}", top.digest);
        let parsed = manifest::parse(&top.bytes, top.content_type.as_deref())
            .map_err(|detail| bad_manifest(ep, &what, detail))?;
        let (image, media_type, config, layers) = match parsed {
            Manifest::Image {
                media_type,
                config,
                layers,
            } => (top, media_type, config, layers),
            Manifest::Index { manifests, .. } => {
                let (arch, variant) = manifest::this_platform();
                let entry =
                    manifest::pick_platform(&manifests, arch, variant).ok_or_else(|| {
                        RegistryError::NoPlatform {
                            registry: ep.name.clone(),
                            what: what.clone(),
                            arch: arch.to_owned(),
                            available: manifest::platforms(&manifests).join(", "),
                        }
                    })?;
                let reference = Reference::Digest(entry.digest);
                let image = self
                    .manifest(ep, repository, &reference, Some(entry.size), layout, into)
                    .await?;
                let what = format!("the manifest {repository}@{}", image.digest);
                match manifest::parse(&image.bytes, image.content_type.as_deref())
                    .map_err(|detail| bad_manifest(ep, &what, detail))?
                {
                    Manifest::Image {
                        media_type,
                        config,
                        layers,
                    } => (image, media_type, config, layers),
                    Manifest::Index { .. } => {
                        return Err(bad_manifest(
                            ep,
                            &what,
                            "an index inside an index is not supported".to_owned(),
                        ));
                    }
                }
            }
        };
        let mut blobs: Vec<Descriptor> = Vec::with_capacity(layers.len() + 1);
        for blob in std::iter::once(config).chain(layers) {
            if !blobs.iter().any(|b| b.digest == blob.digest) {
                blobs.push(blob);
            }
        }
        // The futures are made first: a closure making them inside the stream would leave
        // the whole download's future not `Send` (rustc's higher-ranked lifetime limits).
        let fetches: Vec<_> = blobs
            .iter()
            .map(|blob| self.fetch_blob(ep, repository, blob, layout, into))
            .collect();
        futures_util::stream::iter(fetches)
            .buffer_unordered(MAX_PARALLEL_BLOBS)
            .try_collect::<Vec<()>>()
            .await?;
        let index = index_json(&media_type, &image.digest, image.bytes.len(), reference);
        let layout = layout.clone();
        blocking(into, move || layout.finish(&index)).await?;
        Ok(image.digest)
    }

    /// A manifest by `reference`: read from the layout when it is a digest already there,
    /// fetched (and then kept in the layout) otherwise.
    async fn manifest(
        &self,
        ep: &Endpoint,
        repository: &str,
        reference: &Reference,
        size: Option<u64>,
        layout: &Layout,
        into: &Path,
    ) -> Result<Fetched, RegistryError> {
        if let Reference::Digest(digest) = reference {
            let (held, wanted) = (layout.clone(), *digest);
            let present = blocking(into, move || {
                held.read_verified(&wanted, MAX_MANIFEST_BYTES)
            })
            .await?;
            if let Some(bytes) = present
                && size.is_none_or(|s| s == bytes.len() as u64)
            {
                return Ok(Fetched {
                    digest: *digest,
                    bytes,
                    content_type: None,
                });
            }
        }
        let fetched = self.fetch_manifest(ep, repository, reference, size).await?;
        let (held, digest, bytes) = (layout.clone(), fetched.digest, fetched.bytes.clone());
        blocking(into, move || held.put(&digest, &bytes)).await?;
        Ok(fetched)
    }

    /// `GET`s a manifest, bounded by [`MAX_MANIFEST_BYTES`], and verifies it against the digest
    /// asked for, the registry's `Docker-Content-Digest` and the descriptor's `size`.
    async fn fetch_manifest(
        &self,
        ep: &Endpoint,
        repository: &str,
        reference: &Reference,
        size: Option<u64>,
    ) -> Result<Fetched, RegistryError> {
        let sep = match reference {
            Reference::Tag(_) => ':',
            Reference::Digest(_) => '@',
        };
        let what = format!("the manifest {repository}{sep}{reference}");
        let response = self
            .client
            .request(
                ep,
                repository,
                &format!("manifests/{reference}"),
                Method::GET,
                Some(manifest::MANIFEST_ACCEPT),
                &what,
            )
            .await?;
        let response = client::check_status(ep, response, &what, self.user()).await?;
        let claimed = header_digest(&response);
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = client::read_bounded(ep, response, MAX_MANIFEST_BYTES, &what).await?;
        let digest = Digest::of(&bytes);
        let expected = match reference {
            Reference::Digest(d) => Some(*d),
            Reference::Tag(_) => claimed,
        };
        if let Some(expected) = expected
            && expected != digest
        {
            return Err(RegistryError::DigestMismatch {
                registry: ep.name.clone(),
                what,
                expected: expected.to_string(),
                actual: digest.to_string(),
            });
        }
        if let Some(size) = size
            && size != bytes.len() as u64
        {
            return Err(RegistryError::SizeMismatch {
                registry: ep.name.clone(),
                what,
                expected: size,
                actual: bytes.len() as u64,
            });
        }
        Ok(Fetched {
            digest,
            bytes: bytes.to_vec(),
            content_type,
        })
    }

    /// Makes blob `blob` present in the layout: kept when it is there and verifies, otherwise
    /// streamed to a partial file, verified (size and digest) and renamed into place. A blob
    /// that does not verify is removed, never kept.
    async fn fetch_blob(
        &self,
        ep: &Endpoint,
        repository: &str,
        blob: &Descriptor,
        layout: &Layout,
        into: &Path,
    ) -> Result<(), RegistryError> {
        let (held, digest, size) = (layout.clone(), blob.digest, blob.size);
        if blocking(into, move || held.verified(&digest, Some(size))).await? {
            return Ok(());
        }
        let partial = Partial(layout.partial_path(&blob.digest));
        self.stream_blob(
            ep,
            repository,
            blob,
            &partial.0,
            &layout.blob_path(&blob.digest),
        )
        .await
    }

    async fn stream_blob(
        &self,
        ep: &Endpoint,
        repository: &str,
        blob: &Descriptor,
        partial: &Path,
        target: &Path,
    ) -> Result<(), RegistryError> {
        let what = format!("blob {} of {repository}", blob.digest);
        let response = self
            .client
            .request(
                ep,
                repository,
                &format!("blobs/{}", blob.digest),
                Method::GET,
                None,
                &what,
            )
            .await?;
        let response = client::check_status(ep, response, &what, self.user()).await?;
        let size_mismatch = |actual: u64| RegistryError::SizeMismatch {
            registry: ep.name.clone(),
            what: what.clone(),
            expected: blob.size,
            actual,
        };
        if let Some(length) = client::content_length(&response)
            && length != blob.size
        {
            return Err(size_mismatch(length));
        }
        let io_error = |source| RegistryError::Io {
            path: partial.to_owned(),
            source,
        };
        let mut file = tokio::fs::File::create(partial).await.map_err(io_error)?;
        let mut hasher = Sha256::new();
        let mut total: u64 = 0;
        let mut body = response.into_body();
        while let Some(chunk) = client::next_chunk(ep, &mut body, &what).await? {
            total += chunk.len() as u64;
            if total > blob.size {
                return Err(size_mismatch(total));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(io_error)?;
        }
        if total != blob.size {
            return Err(size_mismatch(total));
        }
        let actual = Digest::from_hasher(hasher);
        if actual != blob.digest {
            return Err(RegistryError::DigestMismatch {
                registry: ep.name.clone(),
                what,
                expected: blob.digest.to_string(),
                actual: actual.to_string(),
            });
        }
        file.sync_all().await.map_err(io_error)?;
        drop(file);
        tokio::fs::rename(partial, target).await.map_err(io_error)?;
        tracing::debug!(blob = %blob.digest, size = blob.size, "blob downloaded and verified");
        Ok(())
    }

    /// The user of the credentials, for messages.
    fn user(&self) -> Option<&str> {
        self.client.user()
    }
}

/// A partial blob file, removed when the download of its blob ends, however it ends: renamed
/// into place (then there is nothing to remove), failed, or dropped unfinished because another
/// blob of the image failed. Nothing unverified stays.
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %self.0.display(), error = %e,
                "cannot remove a partial blob (the next download removes it)"),
        }
    }
}

/// After endpoint `i` of `count` failed with `e` (and the one before it with `before`, a
/// mirror's failure): the error to remember while the next one is asked, or `Err` to stop.
/// Only a remote error on an endpoint that is not the last moves on (a mirror's failure); a
/// local one (the request, the disk) would fail alike anywhere. The error that stops says the
/// mirror's too, so an operator sees why neither served.
fn next_endpoint(
    e: RegistryError,
    ep: &Endpoint,
    i: usize,
    count: usize,
    before: Option<RegistryError>,
) -> Result<RegistryError, RegistryError> {
    if e.is_remote() && i + 1 < count {
        tracing::warn!(endpoint = %ep.name, error = %e,
            "the registry mirror failed; asking the registry itself");
        Ok(e)
    } else {
        Err(match before {
            Some(mirror) => RegistryError::AfterMirror {
                mirror: mirror.to_string(),
                error: Box::new(e),
            },
            None => e,
        })
    }
}

/// The error when every endpoint failed (the last one's), or when there was none.
fn no_endpoint(last: Option<RegistryError>) -> RegistryError {
    last.unwrap_or_else(|| RegistryError::Invalid {
        detail: "no endpoint to ask".to_owned(),
    })
}

/// A manifest's bytes, verified.
struct Fetched {
    digest: Digest,
    bytes: Vec<u8>,
    content_type: Option<String>,
}

fn bad_manifest(ep: &Endpoint, what: &str, detail: String) -> RegistryError {
    RegistryError::BadManifest {
        registry: ep.name.clone(),
        what: what.to_owned(),
        detail,
    }
}

/// The registry's `Docker-Content-Digest`, when it sends a sha256 one.
fn header_digest(response: &http::Response<hyper::body::Incoming>) -> Option<Digest> {
    response
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| Digest::parse(v.trim()).ok())
}

/// `index.json` naming the one manifest downloaded, with its tag as the ref name when it was
/// asked for by tag.
fn index_json(media_type: &str, digest: &Digest, size: usize, reference: &Reference) -> Vec<u8> {
    let mut entry = serde_json::json!({
        "mediaType": media_type,
        "digest": digest.to_string(),
        "size": size,
    });
    if let Reference::Tag(tag) = reference {
        entry["annotations"] = serde_json::json!({ layout::REF_NAME: tag });
    }
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": manifest::OCI_INDEX,
        "manifests": [entry],
    })
    .to_string()
    .into_bytes()
}

/// The mirror's endpoint: `http://` or `https://`, a host, an optional path prefix, no query.
fn mirror_endpoint(uri: &http::Uri) -> Result<Endpoint, RegistryError> {
    let invalid = || RegistryError::Invalid {
        detail: format!("the registry mirror {uri} is not an http:// or https:// URL with a host"),
    };
    let scheme = uri.scheme_str().filter(|s| matches!(*s, "http" | "https"));
    let (Some(scheme), Some(authority)) = (scheme, uri.authority()) else {
        return Err(invalid());
    };
    if uri.query().is_some() || authority.as_str().contains('@') {
        return Err(invalid());
    }
    let prefix = uri.path().trim_end_matches('/');
    Ok(Endpoint {
        name: format!("the mirror {scheme}://{authority}{prefix}"),
        base: format!("{scheme}://{authority}{prefix}"),
        plain_host: (scheme == "http").then(|| authority.host().to_owned()),
    })
}

/// A tag or a `sha256:` digest.
fn parse_reference(reference: &str) -> Result<Reference, RegistryError> {
    if reference.contains(':') {
        Digest::parse(reference)
            .map(Reference::Digest)
            .map_err(|e| RegistryError::Invalid {
                detail: format!("{reference:?} is neither a tag nor a sha256 digest: {e}"),
            })
    } else {
        check_tag(reference)?;
        Ok(Reference::Tag(reference.to_owned()))
    }
}

/// The distribution spec's tag grammar: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), RegistryError> {
    let mut chars = tag.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && tag.len() <= MAX_TAG_LEN {
        Ok(())
    } else {
        Err(RegistryError::Invalid {
            detail: format!("{tag:?} is not a valid tag"),
        })
    }
}

/// The distribution spec's repository grammar: `/`-separated components of lowercase letters
/// and digits, joined inside by `.`, `_`, `__` or dashes. Checked because it becomes part of a
/// URL path.
fn check_repository(repository: &str) -> Result<(), RegistryError> {
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes
                .iter()
                .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
            && !c.contains("..")
            && !c.contains("___")
    };
    if repository.len() <= MAX_REPOSITORY_LEN && repository.split('/').all(component_ok) {
        Ok(())
    } else {
        Err(RegistryError::Invalid {
            detail: format!("{repository:?} is not a valid repository name"),
        })
    }
}

/// Runs blocking layout I/O off the async workers; an error names the layout.
async fn blocking<T: Send + 'static>(
    into: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, RegistryError> {
    let result = tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    result.map_err(|source| RegistryError::Io {
        path: into.to_owned(),
        source,
    })
}
