//! What the agent takes from disk and hands to every later runner, and who may change it
//! (CONTRACT §7): the runner package (`runner.package_dir`, or the package `runner.version`
//! downloaded), each policy's `env_file`, each `docker_images` tarball, and each policy's local
//! `image` source (an OCI layout directory, every entry in it, or an archive file: the root
//! every runner of the policy gets). A job that can change one of them (the classic layout puts the package in a runner account's home) backdoors every
//! runner that reads it next, so `run` refuses to start (exit 2) and `check` fails while any of
//! them, the way to it, or (for the package) anything in it is something a job could change.
//! Also the kernel's link protections (`fs.protected_symlinks`, `fs.protected_hardlinks`) the
//! isolation relies on, which `check` requires.
//!
//! The rule and its adapters are [`rm_runner::trust`] (one rule, also applied where the runner
//! crate reads these: the package right before it is stored, an image right before it is
//! loaded); this module names what the configuration hands over ([`trusted_paths`]) and turns a
//! finding into `run`'s refusal ([`refuse_changeable`]). A policy image's source is judged again
//! each time it is read ([`image_source`], by `crate::image` before every install and refresh).

use std::path::{Path, PathBuf};

use rm_image::reference::{ImageRef, Transport};

use crate::config::{Config, display_file};
use crate::exit::Exit;
use rm_runner::isolate::Pool;
pub(crate) use rm_runner::trust::Kind;

/// The two link protections and the fix for each, as `check` names them.
const PROTECTED_LINKS: [(&str, &str); 2] = [
    ("fs.protected_symlinks", "/proc/sys/fs/protected_symlinks"),
    ("fs.protected_hardlinks", "/proc/sys/fs/protected_hardlinks"),
];

/// One thing the configuration hands every later runner from disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trusted {
    /// The configuration key that names it (`runner.package_dir`, `policy[0].env_file`, ...).
    pub key: String,
    /// The policy it belongs to (`None`: the package).
    pub policy: Option<String>,
    pub path: PathBuf,
    /// A tree (the package: every entry judged) or one file.
    pub kind: Kind,
}

/// What `run` and `check` judge: `package` (the package directory runners start from:
/// `runner.package_dir`, or the one `runner.version` resolved to; `None` where it is not known
/// yet), and each policy's `env_file`, `docker_images` and local `image` source.
pub(crate) fn trusted_paths(config: &Config, package: Option<&Path>) -> Vec<Trusted> {
    let mut paths = Vec::new();
    if let Some(dir) = package.or(config.runner.package_dir.as_deref()) {
        let key = if config.runner.package_dir.is_some() {
            "runner.package_dir"
        } else {
            "runner.version"
        };
        paths.push(Trusted {
            key: key.to_owned(),
            policy: None,
            path: dir.to_owned(),
            kind: Kind::Tree,
        });
    }
    for (index, policy) in config.policies.iter().enumerate() {
        let file = |key: String, path: &Path| Trusted {
            key,
            policy: Some(policy.name.clone()),
            path: path.to_owned(),
            kind: Kind::File,
        };
        if let Some(env_file) = &policy.env_file {
            paths.push(file(format!("policy[{index}].env_file"), env_file));
        }
        for image in policy.docker.iter().flat_map(|d| &d.images) {
            paths.push(file(format!("policy[{index}].docker_images"), &image.path));
        }
        if let Some((path, kind)) = policy
            .image
            .as_ref()
            .and_then(|image| image_source(&image.reference))
        {
            paths.push(Trusted {
                key: format!("policy[{index}].image"),
                policy: Some(policy.name.clone()),
                path,
                kind,
            });
        }
    }
    paths
}

/// Where a local image is read from, and how it is judged: an OCI layout's directory as a tree
/// (its `index.json` names what the tag is, its `blobs/` what the image holds: a job that could
/// swap either, or add a link out, chooses every later runner's root), an archive as one file.
/// `None` for a registry's image, which is downloaded into the agent's own store. Pure.
pub(crate) fn image_source(reference: &ImageRef) -> Option<(PathBuf, Kind)> {
    match &reference.transport {
        Transport::OciLayout { dir, .. } => Some((dir.clone(), Kind::Tree)),
        Transport::OciArchive { file, .. } | Transport::DockerArchive { file, .. } => {
            Some((file.clone(), Kind::File))
        }
        Transport::Registry { .. } => None,
    }
}

/// The runner uid pool for judging ownership: the configured one, or none where it does not
/// resolve (the isolation checks report that).
pub(crate) fn pool_of(config: &Config) -> Pool {
    Pool::resolve(&config.host.runner_uids).unwrap_or_else(|_| Pool::new(Vec::new()))
}

/// Why a job could change `trusted`, if it could, as "problem; fix" ([`rm_runner::trust`]). A
/// path that is not there is not judged (its reader says it is missing).
pub(crate) fn changeable(trusted: &Trusted, pool: &Pool) -> Option<String> {
    rm_runner::trust::changeable(&trusted.path, trusted.kind, pool)
}

/// `run`'s refusal (exit 2) of a package, `env_file`, image tarball or image source a job could
/// change, naming the key, the path and the fix. `package`: the package directory runners start from.
pub(crate) fn refuse_changeable(config: &Config, package: &Path) -> Result<(), Exit> {
    let pool = pool_of(config);
    for trusted in trusted_paths(config, Some(package)) {
        if let Some(why) = changeable(&trusted, &pool) {
            return Err(Exit::usage(format!(
                "{}: `{}`: {}: a job could change what every later runner gets: {why}",
                display_file(config.source.as_deref()),
                trusted.key,
                trusted.path.display()
            )));
        }
    }
    Ok(())
}

/// Which link protections are off, given each setting's value as read (`None`: unreadable),
/// with the fix. Pure: [`protected_links_off`] reads the values.
pub(crate) fn links_unprotected(values: [Option<&str>; 2]) -> Vec<String> {
    PROTECTED_LINKS
        .iter()
        .zip(values)
        .filter_map(|((name, _), value)| match value.map(str::trim) {
            Some(v) if v != "0" && !v.is_empty() => None,
            Some(_) => Some(format!("{name} is 0")),
            None => Some(format!("{name} cannot be read")),
        })
        .collect()
}

/// [`links_unprotected`] of this host's `/proc/sys/fs` settings.
pub(crate) fn protected_links_off() -> Vec<String> {
    let values = PROTECTED_LINKS.map(|(_, file)| std::fs::read_to_string(file).ok());
    links_unprotected([values[0].as_deref(), values[1].as_deref()])
}

/// The fix for link protections that are off, for `check`'s remedy.
pub(crate) const PROTECTED_LINKS_FIX: &str = "run `sysctl -w fs.protected_symlinks=1 fs.protected_hardlinks=1` and keep it across reboots with `printf 'fs.protected_symlinks = 1\\nfs.protected_hardlinks = 1\\n' > /etc/sysctl.d/50-rm-agent.conf` (systemd sets both by default; without them a job can plant a link or a hard link the agent or another user then follows)";

#[cfg(test)]
mod tests;
