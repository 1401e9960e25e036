//! `policy.image`, `policy.image_refresh` and `policy.image_credentials_file` as written and
//! validated (issue 40): the image a policy's runners run in, in skopeo's transport syntax
//! ([`rm_image::reference::ImageRef`]), how often a tag is resolved again, and where a
//! registry's credentials are read from (a file, as for every other secret: none in the
//! configuration). Which images are installed, checked and kept is `crate::image`'s.

use std::path::PathBuf;
use std::time::Duration;

use rm_image::reference::{ImageRef, Transport};

/// The least `image_refresh`: a registry is asked for the tag at most this often per policy.
pub const MIN_IMAGE_REFRESH: Duration = Duration::from_secs(60);

/// A policy's image, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyImage {
    pub reference: ImageRef,
    /// `image_refresh`: how often the reference is resolved again (a tag moved, an archive
    /// rewritten); `None`: only when `run` starts.
    pub refresh: Option<Duration>,
    /// `image_credentials_file`: `user:password` for the registry (read by `crate::secrets`
    /// rules: absolute, not readable by others).
    pub credentials_file: Option<PathBuf>,
    /// `docker_registry_mirror`, for a `docker://` image of Docker Hub (Docker's rule for
    /// registry mirrors); set by the policy's validation.
    pub mirror: Option<rm_runner::docker::RegistryMirror>,
}

/// Validates a policy's image keys; the error names the key and why. Pure.
pub fn validate(
    image: Option<&str>,
    refresh: Option<Duration>,
    credentials_file: Option<PathBuf>,
) -> Result<Option<PolicyImage>, (&'static str, String)> {
    let Some(text) = image else {
        if refresh.is_some() {
            return Err((
                "image_refresh",
                "is how often `image` is resolved again: set `image` too".to_owned(),
            ));
        }
        if credentials_file.is_some() {
            return Err((
                "image_credentials_file",
                "is the registry's credentials for `image`: set `image` too".to_owned(),
            ));
        }
        return Ok(None);
    };
    let reference = ImageRef::parse(text).map_err(|e| ("image", e.to_string()))?;
    if let Some(every) = refresh {
        if reference.pin.is_some() {
            return Err((
                "image_refresh",
                format!(
                    "`{text}` is pinned to a digest, which never changes: drop the pin to follow a tag, or drop image_refresh"
                ),
            ));
        }
        if every < MIN_IMAGE_REFRESH {
            return Err((
                "image_refresh",
                format!(
                    "{} is below the least, {}",
                    humantime::format_duration(every),
                    humantime::format_duration(MIN_IMAGE_REFRESH)
                ),
            ));
        }
    }
    if let Some(file) = &credentials_file {
        if !matches!(reference.transport, Transport::Registry { .. }) {
            return Err((
                "image_credentials_file",
                "is for a registry's image (`docker://...`); a local image needs none".to_owned(),
            ));
        }
        if !file.is_absolute() {
            return Err((
                "image_credentials_file",
                format!("`{}` must be an absolute path", file.display()),
            ));
        }
    }
    Ok(Some(PolicyImage {
        reference,
        refresh,
        credentials_file,
        mirror: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_validated_with_its_refresh_and_credentials() {
        let five = Some(Duration::from_secs(300));
        let creds = || Some(PathBuf::from("/etc/rm/registry"));
        type Case = (
            Option<&'static str>,
            Option<Duration>,
            Option<PathBuf>,
            Result<bool, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (None, None, None, Ok(false)),
            (Some("oci:/srv/images/ci:24.04"), None, None, Ok(true)),
            (Some("docker://ghcr.io/acme/ci:1"), five, creds(), Ok(true)),
            (Some("docker-archive:/srv/ci.tar"), five, None, Ok(true)),
            (None, five, None, Err("image_refresh")),
            (None, None, creds(), Err("image_credentials_file")),
            (Some("ci:latest"), None, None, Err("image")),
            (Some("oci:relative/dir"), None, None, Err("image")),
            (
                Some(
                    "docker://ghcr.io/acme/ci@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                ),
                five,
                None,
                Err("image_refresh"),
            ),
            (
                Some("docker://ghcr.io/acme/ci:1"),
                Some(Duration::from_secs(5)),
                None,
                Err("image_refresh"),
            ),
            (
                Some("oci:/srv/images/ci"),
                None,
                creds(),
                Err("image_credentials_file"),
            ),
            (
                Some("docker://ghcr.io/acme/ci:1"),
                None,
                Some(PathBuf::from("registry")),
                Err("image_credentials_file"),
            ),
        ];
        for (image, refresh, credentials, want) in cases {
            let got = validate(image, refresh, credentials)
                .map(|i| i.is_some())
                .map_err(|(key, _)| key);
            assert_eq!(got, want, "{image:?} {refresh:?}");
        }
    }
}
