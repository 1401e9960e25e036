//! The job images as `rm-agent run` wires them (`policy.image`, issue 40): each policy's image
//! installed in the store under the data directory before any runner of it starts (a registry's
//! downloaded first), judged able to run the runner package (a policy whose image cannot is
//! refused at start, with the fix), resolved again every `image_refresh`, and the store's
//! entries no runner uses any more removed. Which image a runner ran is its attempt's, journalled
//! when it is created ([`Images::current`]); a runner is always started from its attempt's image,
//! never from what the policy names now ([`plan_of`]). The images themselves (references,
//! transports, unpacking, verification, fitness) are `rm_image`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use rm_image::reference::{Digest, ImageRef, Transport};
use rm_runner::image_root::ImagePlan;

use crate::config::Policy;
use crate::config::image::PolicyImage;

/// The store's directory under the data directory.
pub const IMAGES_DIR: &str = "images";

/// Where a registry's image is downloaded (an OCI layout per policy) before it is installed.
const DOWNLOADS_DIR: &str = ".downloads";

/// The image a policy's new runners get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The image's id (its config's digest): the store's key, journalled with each attempt.
    pub id: Digest,
    /// The manifest's digest, what an operator pins (`@sha256:...`).
    pub manifest: Digest,
    /// The reference as configured.
    pub reference: String,
}

/// The store and each policy's current image.
#[derive(Debug)]
pub struct Images {
    store: rm_image::store::Store,
    dir: PathBuf,
    current: Mutex<BTreeMap<String, Current>>,
    /// The runner uids a local image's source is judged against right before each read
    /// ([`crate::trust::image_source`]); `None`: not judged (tests of the store alone).
    judged_against: Option<rm_runner::isolate::Pool>,
}

impl Images {
    /// Opens the store under `data_dir` (what a crash left half made is removed there).
    pub fn open(data_dir: &Path) -> anyhow::Result<Images> {
        let dir = data_dir.join(IMAGES_DIR);
        let store = rm_image::store::Store::open(&dir)
            .with_context(|| format!("cannot open the image store {}", dir.display()))?;
        Ok(Images {
            store,
            dir,
            current: Mutex::new(BTreeMap::new()),
            judged_against: None,
        })
    }

    /// Judges each local image's source against `pool` right before it is read (every install
    /// and refresh), as `run` judged it at start: one a job could change since is refused.
    pub fn judging_sources_against(mut self, pool: rm_runner::isolate::Pool) -> Images {
        self.judged_against = Some(pool);
        self
    }

    /// The image id new runners of `policy` get; `None` for a policy without an image.
    pub fn current(&self, policy: &str) -> Option<Current> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(policy)
            .cloned()
    }

    /// Every policy's current image.
    pub fn all_current(&self) -> BTreeMap<String, Current> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The stored image `id`, as a runner is started from it.
    fn stored(&self, id: &str) -> Option<ImagePlan> {
        let stored = self.store.get(&Digest::parse(id).ok()?)?;
        // Read from the store's own copy, which was verified against the id when it was made.
        let config = match rm_image::source::ImageConfig::parse(&stored.config_json) {
            Ok(config) => config,
            Err(e) => {
                tracing::warn!(image = %id, error = %e, "the stored image's config cannot be read");
                return None;
            }
        };
        Some(ImagePlan {
            id: id.to_owned(),
            rootfs: stored.rootfs.clone(),
            env: config.env,
        })
    }

    /// Installs `policy`'s image (downloading a registry's first), checks that it can run the
    /// runner package in `package`, and makes it the policy's current image. An image that
    /// cannot run the runner is refused with what it lacks and the fix, and the policy keeps
    /// the image it had.
    pub async fn install(
        self: &Arc<Self>,
        policy: &str,
        image: &PolicyImage,
        package: Option<PathBuf>,
    ) -> anyhow::Result<Current> {
        let reference = self.local_reference(policy, image).await?;
        let images = Arc::clone(self);
        let written = image.reference.to_string();
        let source = crate::trust::image_source(&image.reference);
        let installed = tokio::task::spawn_blocking(move || {
            // Judged again right before it is read: what `run` judged at start may have changed.
            if let (Some(pool), Some((path, kind))) = (&images.judged_against, source)
                && let Some(why) = rm_runner::trust::changeable(&path, kind, pool)
            {
                anyhow::bail!("a job could change what every later runner gets: {why}");
            }
            Ok(rm_image::source::pull(&reference, &images.store)?)
        })
        .await
        .context("the image install task failed")?
        .with_context(|| format!("cannot install image `{written}`"))?;
        if let Some(package) = package {
            let rootfs = installed.stored.rootfs.clone();
            let report =
                tokio::task::spawn_blocking(move || rm_image::fit::check(&rootfs, &package))
                    .await
                    .context("the image fitness task failed")?;
            if !report.is_fit() {
                return Err(Unfit {
                    reference: written,
                    id: installed.image.id,
                    report: report.to_string(),
                }
                .into());
            }
        }
        let current = Current {
            id: installed.image.id,
            manifest: installed.image.manifest,
            reference: written,
        };
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(policy.to_owned(), current.clone());
        Ok(current)
    }

    /// The reference `source::pull` reads: the configured one for a local transport; for a
    /// registry, the OCI layout it was downloaded into (kept, so a refresh whose tag has not
    /// moved downloads nothing again).
    async fn local_reference(&self, policy: &str, image: &PolicyImage) -> anyhow::Result<ImageRef> {
        let Transport::Registry {
            registry,
            repository,
            tag,
        } = &image.reference.transport
        else {
            return Ok(image.reference.clone());
        };
        let credentials = match &image.credentials_file {
            Some(file) => Some(
                crate::secrets::registry_credentials(
                    file,
                    &format!("policy `{policy}`: image_credentials_file"),
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            ),
            None => None,
        };
        let client = rm_image::registry::Registry::new(rm_image::registry::RegistryOptions {
            mirror: image.mirror.as_ref().map(mirror_uri).transpose()?,
            credentials,
        })
        .context("cannot set up the registry client")?;
        let into = self.dir.join(DOWNLOADS_DIR).join(download_name(policy));
        let wanted = match (&image.reference.pin, tag) {
            (Some(pin), _) => pin.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => anyhow::bail!("`{}` names neither a tag nor a digest", image.reference),
        };
        // A pinned reference is fetched by its digest, which the download checks the bytes
        // against (an index's digest too, for a multi-platform image).
        client
            .download(registry, repository, &wanted, &into)
            .await
            .with_context(|| format!("cannot download `{}`", image.reference))?;
        // The download verified every blob; the pull verifies them again from the layout.
        Ok(ImageRef {
            transport: Transport::OciLayout {
                dir: into,
                tag: None,
            },
            pin: None,
        })
    }

    /// Removes every stored image that is no policy's current one and no uncleaned attempt's
    /// (`in_use`): what a refresh replaced, once its last runner is gone. Returns what went.
    pub fn collect(&self, in_use: &BTreeSet<String>) -> Vec<Digest> {
        let keep: BTreeSet<String> = self
            .all_current()
            .values()
            .map(|c| c.id.to_string())
            .chain(in_use.iter().cloned())
            .collect();
        let mut removed = Vec::new();
        let stored = match self.store.list() {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the image store; nothing removed");
                return removed;
            }
        };
        for id in stored {
            if keep.contains(&id.to_string()) {
                continue;
            }
            match self.store.remove(&id) {
                Ok(true) => removed.push(id),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(image = %id, error = %e, "cannot remove an image no runner uses")
                }
            }
        }
        removed
    }
}

/// What a runner of the image `id` (its attempt's) is started with: the stored root and the
/// image's `ENV`. An image the store does not hold (or an agent without a store) gives a plan
/// whose root is absent, which the runner's start refuses: never the host's root instead.
pub fn plan_of(images: Option<&Images>, id: &str) -> ImagePlan {
    images
        .and_then(|images| images.stored(id))
        .unwrap_or_else(|| ImagePlan {
            id: id.to_owned(),
            rootfs: PathBuf::new(),
            env: Vec::new(),
        })
}

/// `rm-agent run`'s images: the store opened and every policy's image installed and checked
/// against the runner package runners start from (`package`, the `user` backend's stored
/// tree), before any runner starts; then what no runner uses is removed. `None` when no policy
/// has an image.
pub async fn start(
    config: &crate::config::Config,
    package: Option<PathBuf>,
    journal: &rm_journal::Store,
) -> Result<Option<Arc<Images>>, crate::exit::Exit> {
    use crate::exit::Exit;
    if !config.policies.iter().any(|p| p.image.is_some()) {
        return Ok(None);
    }
    let images = Arc::new(
        Images::open(&config.data_dir)
            .map_err(Exit::runtime)?
            .judging_sources_against(crate::trust::pool_of(config)),
    );
    install_all(&images, &config.policies, package)
        .await
        .map_err(|e| match e.downcast_ref::<Unfit>() {
            Some(_) => Exit::usage(format!("{e:#}")),
            None => Exit::runtime(e),
        })?;
    collect_unused(&images, in_use(journal));
    Ok(Some(images))
}

/// Removes what no runner uses any more ([`Images::collect`]) and says so; with no answer from
/// the journal (`used` failed), nothing.
fn collect_unused(images: &Images, used: anyhow::Result<BTreeSet<String>>) {
    match used {
        Ok(used) => {
            for id in images.collect(&used) {
                tracing::info!(image = %id, "removed an image no runner uses any more");
            }
        }
        Err(e) => tracing::warn!(
            error = format!("{e:#}"),
            "cannot read which images runners use; none removed"
        ),
    }
}

/// The images of this host's attempts that are not cleaned (a runner may still run from one,
/// or be cleaned up after a crash).
pub fn in_use(journal: &rm_journal::Store) -> anyhow::Result<BTreeSet<String>> {
    let attempts = journal
        .attempts()
        .context("cannot open the journal's attempts")?;
    Ok(attempts
        .list(rm_journal::Scope::Uncleaned, None)
        .context("cannot list the journal's attempts")?
        .into_iter()
        .filter_map(|a| a.image)
        .collect())
}

/// An image that cannot run the runner package: the policy is refused (a usage error: the
/// operator fixes the image or the policy).
#[derive(Debug, thiserror::Error)]
#[error("image `{reference}` ({id}) cannot run the runner: {report}")]
pub struct Unfit {
    pub reference: String,
    pub id: Digest,
    pub report: String,
}

/// A download directory's name for a policy: its name's hex, so any name is one plain path
/// component.
fn download_name(policy: &str) -> String {
    hex::encode(policy.as_bytes())
}

/// The mirror as a URI for the registry client.
fn mirror_uri(mirror: &rm_runner::docker::RegistryMirror) -> anyhow::Result<http::Uri> {
    let scheme = if mirror.https { "https" } else { "http" };
    format!("{scheme}://{}:{}/", mirror.host, mirror.port)
        .parse()
        .context("the registry mirror is not a URL")
}

/// Installs every policy's image before `run` starts any runner; the first that cannot be
/// installed, or cannot run the runner, refuses the start with why.
pub async fn install_all(
    images: &Arc<Images>,
    policies: &[Policy],
    package: Option<PathBuf>,
) -> anyhow::Result<()> {
    for policy in policies {
        let Some(image) = &policy.image else { continue };
        let current = images
            .install(&policy.name, image, package.clone())
            .await
            .with_context(|| format!("policy `{}`", policy.name))?;
        tracing::info!(policy = %policy.name, image = %current.reference, id = %current.id, manifest = %current.manifest, "image installed");
    }
    Ok(())
}

/// The runner release follower's admission of a new package (`runner.version = "latest"`):
/// every policy's current image must be able to run it, or runners keep the package they have
/// (a new release that needs a library an image lacks never leaves a policy with runners that
/// die at exec).
pub fn admission(images: Arc<Images>) -> rm_runner::package::latest::Admission {
    Arc::new(move |package: &Path| {
        let mut unfit = Vec::new();
        for (policy, current) in images.all_current() {
            let Some(plan) = images.stored(&current.id.to_string()) else {
                continue;
            };
            let report = rm_image::fit::check(&plan.rootfs, package);
            if !report.is_fit() {
                unfit.push(format!(
                    "policy `{policy}`'s image `{}` ({}) cannot run it: {report}",
                    current.reference, current.id
                ));
            }
        }
        if unfit.is_empty() {
            Ok(())
        } else {
            Err(unfit.join("; "))
        }
    })
}

/// Resolves `policy`'s image again every `image_refresh` until `stop`: a new digest is
/// installed and checked, then new runners get it; the old one is removed once no attempt that
/// is not cleaned uses it (`in_use` reads the journal). A refresh that fails keeps the image the
/// policy has, and says so.
pub async fn refresh_loop<F, P>(
    images: Arc<Images>,
    policy: Policy,
    package: P,
    in_use: F,
    stop: impl std::future::Future<Output = ()>,
) where
    F: Fn() -> anyhow::Result<BTreeSet<String>> + Send + Sync + 'static,
    P: Fn() -> Option<PathBuf> + Send + Sync + 'static,
{
    let Some(image) = policy.image.clone() else {
        return;
    };
    let Some(every) = image.refresh else { return };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(every) => {}
        }
        let before = images.current(&policy.name);
        // The package runners start from now (`runner.version = "latest"` follows releases).
        match images.install(&policy.name, &image, package()).await {
            Ok(now) if before.as_ref().map(|b| &b.id) != Some(&now.id) => {
                tracing::info!(policy = %policy.name, image = %now.reference, id = %now.id, "the policy's image changed; new runners get it");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(policy = %policy.name, error = format!("{e:#}"), "cannot refresh the policy's image; its runners keep the one they have");
            }
        }
        collect_unused(&images, in_use());
    }
}

#[cfg(test)]
#[path = "image_tests.rs"]
pub(crate) mod tests;
