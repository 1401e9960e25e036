//! What an actions/runner release publishes, and the pure decisions on it: this host's
//! platform, the asset to download, and the SHA-256 that asset must have. The checksum comes
//! from the asset's `digest` (GitHub computes one for every asset uploaded since June 2025) or,
//! for older releases, from the release notes, where actions/runner writes one per package
//! between `<!-- BEGIN SHA linux-x64 -->` and `<!-- END SHA linux-x64 -->`.

use serde::Deserialize;

/// The repository the runner is released from.
pub(crate) const RUNNER_REPOSITORY: &str = "actions/runner";

/// A platform actions/runner publishes a `.tar.gz` package for (the `win-*` ones are `.zip`
/// and not for this agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Platform {
    /// `linux` or `osx`, as the asset names spell them.
    pub os: &'static str,
    /// `x64`, `arm64` or `arm`.
    pub arch: &'static str,
}

impl Platform {
    /// The package platform for Rust's `std::env::consts::{OS, ARCH}`, if there is one.
    pub fn of(os: &str, arch: &str) -> Option<Platform> {
        let os = match os {
            "linux" => "linux",
            "macos" => "osx",
            _ => return None,
        };
        let arch = match arch {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            "arm" => "arm",
            _ => return None,
        };
        // 32-bit arm is published for Linux only.
        if os == "osx" && arch == "arm" {
            return None;
        }
        Some(Platform { os, arch })
    }

    /// This host's platform.
    pub fn host() -> Option<Platform> {
        Self::of(std::env::consts::OS, std::env::consts::ARCH)
    }

    /// `linux-x64`: the middle of the asset name and the checksum markers' key.
    pub(crate) fn key(self) -> String {
        format!("{}-{}", self.os, self.arch)
    }
}

/// `actions-runner-linux-x64-2.330.0`: the asset's name without `.tar.gz`, and the name of the
/// package's directory in the cache.
pub(crate) fn package_name(platform: Platform, version: &str) -> String {
    format!("actions-runner-{}-{version}", platform.key())
}

/// `actions-runner-linux-x64-2.330.0.tar.gz`, as the release lists it.
pub(crate) fn asset_name(platform: Platform, version: &str) -> String {
    format!("{}.tar.gz", package_name(platform, version))
}

/// `GET /repos/{owner}/{repo}/releases/tags/{tag}`: the fields used.
#[derive(Debug, Clone, Deserialize)]
pub struct Release {
    pub tag_name: String,
    /// The release notes (Markdown); `null` when the release has none.
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub assets: Vec<Asset>,
}

/// One release asset.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Asset {
    pub name: String,
    pub size: u64,
    /// Where the bytes are; github.com answers it with a redirect to its object storage.
    pub browser_download_url: String,
    /// `sha256:<hex>`; `null` (or absent, on older GitHub Enterprise Server) when not computed.
    #[serde(default)]
    pub digest: Option<String>,
}

/// Where the expected checksum was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumSource {
    /// The asset's `digest`.
    AssetDigest,
    /// The `<!-- BEGIN SHA … -->` markers in the release notes.
    ReleaseNotes,
}

impl ChecksumSource {
    pub fn describe(self) -> &'static str {
        match self {
            ChecksumSource::AssetDigest => "the asset's digest",
            ChecksumSource::ReleaseNotes => "the release notes",
        }
    }
}

/// The asset to download and the SHA-256 (lower-case hex) it must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub asset: Asset,
    pub sha256: String,
    pub source: ChecksumSource,
}

/// Why a release cannot be used on this host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("release {tag} of actions/runner has no asset {name} (it has: {available})")]
    NoAsset {
        tag: String,
        name: String,
        available: String,
    },
    /// Never run a package that cannot be verified.
    #[error(
        "release {tag} of actions/runner publishes no SHA-256 for {name} (no asset digest, no checksum in the release notes), and an unverified package is never run"
    )]
    NoChecksum { tag: String, name: String },
    /// Two published checksums that disagree: something between GitHub and here is wrong.
    #[error(
        "release {tag} of actions/runner publishes two different SHA-256 for {name}: {digest} (asset digest) and {notes} (release notes)"
    )]
    ChecksumConflict {
        tag: String,
        name: String,
        digest: String,
        notes: String,
    },
}

/// Picks this platform's asset and its checksum. The asset's digest is preferred; the release
/// notes' marker is the fallback; when both are there they must agree.
pub fn select(release: &Release, platform: Platform, version: &str) -> Result<Chosen, SelectError> {
    let name = asset_name(platform, version);
    let tag = release.tag_name.clone();
    let Some(asset) = release.assets.iter().find(|a| a.name == name) else {
        let mut available: Vec<&str> = release
            .assets
            .iter()
            .map(|a| a.name.as_str())
            .filter(|n| n.ends_with(".tar.gz"))
            .collect();
        available.sort_unstable();
        return Err(SelectError::NoAsset {
            tag,
            name,
            available: if available.is_empty() {
                "none".to_owned()
            } else {
                available.join(", ")
            },
        });
    };
    let digest = asset.digest.as_deref().and_then(digest_sha256);
    let notes = release
        .body
        .as_deref()
        .and_then(|body| notes_sha256(body, &platform.key()));
    let (sha256, source) = match (digest, notes) {
        (Some(digest), Some(notes)) if digest != notes => {
            return Err(SelectError::ChecksumConflict {
                tag,
                name,
                digest,
                notes,
            });
        }
        (Some(digest), _) => (digest, ChecksumSource::AssetDigest),
        (None, Some(notes)) => (notes, ChecksumSource::ReleaseNotes),
        (None, None) => return Err(SelectError::NoChecksum { tag, name }),
    };
    Ok(Chosen {
        asset: asset.clone(),
        sha256,
        source,
    })
}

/// The hex of a `sha256:<hex>` digest; `None` for another algorithm or a malformed value.
pub(crate) fn digest_sha256(digest: &str) -> Option<String> {
    let (algorithm, hex) = digest.trim().split_once(':')?;
    if !algorithm.eq_ignore_ascii_case("sha256") {
        return None;
    }
    sha256_hex(hex)
}

/// The checksum between `<!-- BEGIN SHA {key} -->` and `<!-- END SHA {key} -->`. The markers
/// are matched whole, so `linux-x64` never reads `linux-x64_noexternals`'s value, and other
/// 64-digit hex strings in the notes are never taken for it.
pub(crate) fn notes_sha256(body: &str, key: &str) -> Option<String> {
    let begin = format!("<!-- BEGIN SHA {key} -->");
    let end = format!("<!-- END SHA {key} -->");
    let start = body.find(&begin)? + begin.len();
    let len = body[start..].find(&end)?;
    sha256_hex(&body[start..start + len])
}

/// Lower-case hex of exactly 32 bytes, or `None`.
fn sha256_hex(text: &str) -> Option<String> {
    let text = text.trim();
    (text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| text.to_ascii_lowercase())
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
