//! `check`'s `image` findings, one per policy with an `image` (issue 40): whether the image can
//! be read and verified, and whether it can run the runner package. A local image already in
//! the agent's store (`<data_dir>/images`, under its id) is judged there by
//! [`rm_image::fit::check`] against the package runners would start from; one not there yet is
//! opened and every blob verified where it is, and is unpacked and judged when `run` starts. A
//! registry's image is asked for its tag's digest (a `warn` when the registry cannot be reached:
//! `run` downloads it at start). Looks only: nothing is written, the store is read without
//! being opened as `run` opens it (which makes it and removes a crash's leftovers).

use std::path::{Path, PathBuf};

use rm_image::reference::{Digest, ImageRef, Transport};

use super::Finding;
use super::cache::{Package, which_package};
use crate::config::image::PolicyImage;
use crate::config::{Config, Policy};

/// What was found about a policy's image.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// A local image the store holds already: its id, and how it fits the runner package.
    Stored { id: Digest, fit: Fit },
    /// A local image read and verified where it is (manifest, config, every layer blob); the
    /// store does not hold it yet.
    Verified { id: Digest, layers: usize },
    /// A local image that cannot be read or does not verify: why.
    Unreadable(String),
    /// A registry image's tag and the digest it names now.
    Resolved { tag: String, digest: Digest },
    /// A registry image pinned to a digest: nothing to resolve.
    Pinned(Digest),
    /// A registry that cannot be asked (unreachable, refusing, no such tag): why.
    Unreachable(String),
    /// The registry's credentials cannot be used: "problem; fix".
    Credentials(String),
}

/// How a stored image fits the runner package.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fit {
    /// It can run `runner` (how many ELF files were examined).
    Fits { runner: String, examined: usize },
    /// It cannot run `runner`: the fit report's message (what it lacks and the fix).
    Unfit { runner: String, report: String },
    /// Not judged: there is no package to judge it against yet (why).
    NoPackage(String),
}

pub(super) async fn images(config: &Config) -> Vec<Finding> {
    let policies: Vec<&Policy> = config
        .policies
        .iter()
        .filter(|p| p.image.is_some())
        .collect();
    if policies.is_empty() {
        return Vec::new();
    }
    let package = match which_package(config).await {
        Some(Package::At { runner, dir }) => Ok((runner, dir)),
        Some(Package::NotYet(what)) => Err(what),
        None => Err("the runner package cannot be read (see the runner_package finding): the image is judged when `rm-agent run` starts".to_owned()),
    };
    let store = config.data_dir.join(crate::image::IMAGES_DIR);
    let mut out = Vec::new();
    for policy in policies {
        let Some(image) = &policy.image else { continue };
        let seen = examine(policy, image, &store, &package).await;
        out.push(of(&image.reference.to_string(), &seen).for_policy(policy));
    }
    out
}

/// What is found about `image`: a registry's asked, a local one read off the runtime.
async fn examine(
    policy: &Policy,
    image: &PolicyImage,
    store: &Path,
    package: &Result<(String, PathBuf), String>,
) -> Seen {
    if let Transport::Registry {
        registry,
        repository,
        tag,
    } = &image.reference.transport
    {
        return resolve(policy, image, registry, repository, tag.as_deref()).await;
    }
    let reference = image.reference.clone();
    let store = store.to_owned();
    let package = package.clone();
    tokio::task::spawn_blocking(move || examine_local(&reference, &store, &package))
        .await
        .unwrap_or_else(|e| Seen::Unreadable(format!("the check failed: {e}")))
}

/// A registry image's tag resolved, as `run`'s download would find it.
async fn resolve(
    policy: &Policy,
    image: &PolicyImage,
    registry: &str,
    repository: &str,
    tag: Option<&str>,
) -> Seen {
    let (Some(tag), None) = (tag, image.reference.pin) else {
        return match image.reference.pin {
            Some(pin) => Seen::Pinned(pin),
            None => Seen::Unreachable("the reference names neither a tag nor a digest".into()),
        };
    };
    let credentials = match &image.credentials_file {
        Some(file) => match crate::secrets::registry_credentials(
            file,
            &format!("policy `{}`: image_credentials_file", policy.name),
        ) {
            Ok(credentials) => Some(credentials),
            Err(exit) => return Seen::Credentials(exit.message),
        },
        None => None,
    };
    let mirror = match image.mirror.as_ref().map(mirror_uri).transpose() {
        Ok(mirror) => mirror,
        Err(why) => return Seen::Unreachable(why),
    };
    let client = match rm_image::registry::Registry::new(rm_image::registry::RegistryOptions {
        mirror,
        credentials,
    }) {
        Ok(client) => client,
        Err(e) => return Seen::Unreachable(e.to_string()),
    };
    match client.resolve(registry, repository, tag).await {
        Ok(digest) => Seen::Resolved {
            tag: tag.to_owned(),
            digest,
        },
        Err(e) => Seen::Unreachable(e.to_string()),
    }
}

/// The mirror as the registry client takes it (as `run` gives it).
fn mirror_uri(mirror: &rm_runner::docker::RegistryMirror) -> Result<http::Uri, String> {
    let scheme = if mirror.https { "https" } else { "http" };
    format!("{scheme}://{}:{}/", mirror.host, mirror.port)
        .parse()
        .map_err(|e| format!("the registry mirror is not a URL: {e}"))
}

/// A local image opened and judged: in the store already, against the package; otherwise
/// every blob verified where it is. Blocking.
fn examine_local(
    reference: &ImageRef,
    store: &Path,
    package: &Result<(String, PathBuf), String>,
) -> Seen {
    let opened = match rm_image::source::open(reference) {
        Ok(opened) => opened,
        Err(e) => return Seen::Unreadable(e.to_string()),
    };
    let id = opened.image.id;
    if let Some(rootfs) = stored_rootfs(store, &id) {
        let fit = match package {
            Ok((runner, dir)) => {
                let report = rm_image::fit::check(&rootfs, dir);
                if report.is_fit() {
                    Fit::Fits {
                        runner: runner.clone(),
                        examined: report.examined,
                    }
                } else {
                    Fit::Unfit {
                        runner: runner.clone(),
                        report: report.to_string(),
                    }
                }
            }
            Err(why) => Fit::NoPackage(why.clone()),
        };
        return Seen::Stored { id, fit };
    }
    match opened.verify_layers() {
        Ok(()) => Seen::Verified {
            id,
            layers: opened.image.layers.len(),
        },
        Err(e) => Seen::Unreadable(e.to_string()),
    }
}

/// The store's complete entry for `id` (`rm_image::store`'s rule), read without changing the
/// store: its root, or `None` when the store does not hold it (or cannot be read).
fn stored_rootfs(store: &Path, id: &Digest) -> Option<PathBuf> {
    let store = rm_image::store::Store::existing(store).ok().flatten()?;
    store.get(id).map(|stored| stored.rootfs)
}

/// The finding for `reference` (as configured) and what was found about it. Pure.
fn of(reference: &str, seen: &Seen) -> Finding {
    let image = format!("image `{reference}`");
    match seen {
        Seen::Stored { id, fit } => match fit {
            Fit::Fits { runner, examined } => Finding::ok(
                "image",
                format!(
                    "{image} ({id}) is in the store and can run {runner} ({examined} ELF files examined)"
                ),
            ),
            Fit::Unfit { runner, report } => Finding::fail(
                "image",
                format!("{image} ({id}) cannot run {runner}: {report}"),
                "install what the image lacks (each line names it) or point `image` at one that has it; `rm-agent run` refuses to start until then",
            ),
            Fit::NoPackage(why) => {
                Finding::ok("image", format!("{image} ({id}) is in the store; {why}"))
            }
        },
        Seen::Verified { id, layers } => Finding::ok(
            "image",
            format!(
                "{image} ({id}) reads and verifies ({layers} {}); `rm-agent run` unpacks it at start and checks then that it can run the runner",
                if *layers == 1 { "layer" } else { "layers" }
            ),
        ),
        Seen::Unreadable(why) => Finding::fail(
            "image",
            format!("{image} cannot be read: {why}"),
            "fix the path, tag or pin in `image` (or write the image again: `skopeo copy ... oci:DIR:TAG`); `rm-agent run` refuses to start until it reads",
        ),
        Seen::Resolved { tag, digest } => Finding::ok(
            "image",
            format!(
                "{image}: the registry names {digest} for tag {tag}; `rm-agent run` downloads, verifies and checks it at start"
            ),
        ),
        Seen::Pinned(digest) => Finding::ok(
            "image",
            format!(
                "{image} is pinned to {digest}; `rm-agent run` downloads, verifies and checks it at start"
            ),
        ),
        Seen::Unreachable(why) => Finding::warn(
            "image",
            format!("{image}: cannot resolve its tag: {why}"),
            "check this host's access to the registry, the name and tag, and image_credentials_file; `rm-agent run` downloads the image at start and refuses to start until it can",
        ),
        Seen::Credentials(message) => {
            let (what, remedy) = super::split_remedy(message);
            Finding::fail(
                "image",
                format!("{image}: {what}"),
                if remedy.is_empty() {
                    "fix image_credentials_file; `rm-agent run` refuses to start until then"
                        .to_owned()
                } else {
                    remedy
                },
            )
        }
    }
}

#[cfg(test)]
#[path = "image_tests.rs"]
mod tests;
