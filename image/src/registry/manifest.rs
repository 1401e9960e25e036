//! What a registry's manifests say, read without I/O: which kind a manifest is (an image
//! manifest or an index / manifest list, OCI or Docker schema 2; schema 1 refused), the
//! platform entry of an index this machine runs, and the blobs an image manifest names.

use super::Digest;

/// OCI's image manifest.
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI's image index.
pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker's image manifest, schema 2.
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker's manifest list.
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker's schema 1 manifests (signed and not): long deprecated, refused.
const DOCKER_SCHEMA1: [&str; 2] = [
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
    "application/vnd.docker.distribution.manifest.v1+json",
];

/// The `Accept` header of a manifest request: every kind this client reads.
pub(crate) const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// The most layers an image manifest may name: above Docker's own limit (127 with overlayfs),
/// so no real image is refused, and a hostile manifest cannot make a download of millions.
pub(crate) const MAX_LAYERS: usize = 1024;

/// A content descriptor: what a manifest says about a blob or another manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub(crate) media_type: String,
    pub(crate) digest: Digest,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) platform: Option<Platform>,
}

/// An index entry's platform.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub(crate) os: String,
    #[serde(default)]
    pub(crate) architecture: String,
    #[serde(default)]
    pub(crate) variant: Option<String>,
}

/// The fields of a manifest or an index this client reads (one struct for both: the kind is
/// decided from `mediaType` or, where an OCI document omits it, from which fields it has).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Descriptor>>,
}

/// A manifest, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Manifest {
    /// An index or manifest list: one manifest per platform.
    Index {
        media_type: String,
        manifests: Vec<Descriptor>,
    },
    /// An image: its config and its layers, in order.
    Image {
        media_type: String,
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

/// Reads a manifest's bytes; `content_type` is the response's `Content-Type`, when it came from
/// the registry (a manifest read back from disk has none). The document's own `mediaType` wins
/// over the header.
pub(crate) fn parse(bytes: &[u8], content_type: Option<&str>) -> Result<Manifest, String> {
    let doc: Document =
        serde_json::from_slice(bytes).map_err(|e| format!("the manifest is not valid: {e}"))?;
    let header = content_type
        .map(|c| c.split(';').next().unwrap_or(c).trim())
        .filter(|c| !c.is_empty() && *c != "application/json");
    let media_type = doc.media_type.clone().or(header.map(str::to_owned));
    if doc.schema_version == Some(1)
        || media_type
            .as_deref()
            .is_some_and(|m| DOCKER_SCHEMA1.contains(&m))
    {
        return Err(
            "the image has a Docker schema 1 manifest, which is not supported: \
                    push it again with a current client"
                .to_owned(),
        );
    }
    if doc.schema_version != Some(2) {
        return Err(format!(
            "the manifest's schemaVersion is {:?}, not 2",
            doc.schema_version
        ));
    }
    match (media_type.as_deref(), doc.manifests, doc.config, doc.layers) {
        (Some(OCI_INDEX | DOCKER_LIST) | None, Some(manifests), None, None) => {
            Ok(Manifest::Index {
                media_type: media_type.unwrap_or_else(|| OCI_INDEX.to_owned()),
                manifests,
            })
        }
        (Some(OCI_MANIFEST | DOCKER_MANIFEST) | None, None, Some(config), Some(layers)) => {
            if layers.len() > MAX_LAYERS {
                return Err(format!(
                    "the manifest names {} layers, more than the {MAX_LAYERS} accepted",
                    layers.len()
                ));
            }
            Ok(Manifest::Image {
                media_type: media_type.unwrap_or_else(|| OCI_MANIFEST.to_owned()),
                config,
                layers,
            })
        }
        (Some(other), ..)
            if ![OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST].contains(&other) =>
        {
            Err(format!(
                "the manifest's media type {other:?} is not one this client reads"
            ))
        }
        _ => Err("the manifest is neither an image manifest nor an index".to_owned()),
    }
}

/// The OCI name of the architecture this program was built for (`GOARCH`'s words, which OCI
/// platforms use), and the variant an index entry should name when it names one.
pub(crate) fn this_platform() -> (&'static str, Option<&'static str>) {
    oci_arch(std::env::consts::ARCH)
}

/// Rust's architecture name in OCI's words, with the preferred variant.
pub(crate) fn oci_arch(rust_arch: &'static str) -> (&'static str, Option<&'static str>) {
    match rust_arch {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", Some("v8")),
        "arm" => ("arm", Some("v7")),
        "x86" => ("386", None),
        "powerpc64" => ("ppc64le", None),
        "s390x" => ("s390x", None),
        "riscv64" => ("riscv64", None),
        "loongarch64" => ("loong64", None),
        other => (other, None),
    }
}

/// The entry of an index for `linux` on `arch`: the one naming `variant` when several match,
/// else one naming no variant, else the first. `None` when the index has no such entry (the
/// caller names the platforms it has).
pub(crate) fn pick_platform<'a>(
    manifests: &'a [Descriptor],
    arch: &str,
    variant: Option<&str>,
) -> Option<&'a Descriptor> {
    let matching: Vec<&Descriptor> = manifests
        .iter()
        .filter(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .collect();
    let variant_of = |d: &Descriptor| d.platform.as_ref().and_then(|p| p.variant.clone());
    matching
        .iter()
        .find(|d| variant.is_some() && variant_of(d).as_deref() == variant)
        .or_else(|| matching.iter().find(|d| variant_of(d).is_none()))
        .or_else(|| matching.first())
        .copied()
}

/// The platforms an index offers, `os/arch[/variant]`, for an error message.
pub(crate) fn platforms(manifests: &[Descriptor]) -> Vec<String> {
    manifests
        .iter()
        .filter_map(|d| d.platform.as_ref())
        .map(|p| match &p.variant {
            Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
            None => format!("{}/{}", p.os, p.architecture),
        })
        .collect()
}
