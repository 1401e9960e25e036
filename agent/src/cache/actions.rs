//! The action archives kept on the host (`[cache] actions`), refreshed through the App: each
//! configured `owner/repo@ref` is resolved to its commit every
//! [`rm_cache::actions::REFRESH_INTERVAL`] (an unchanged ref is a free `304`), its tarball
//! downloaded into `rm_cache::actions::ArchiveStore` when the commit is new, and archives no
//! ref names any more removed after [`rm_cache::actions::GRACE`]. A failed action is retried
//! on its own back-off ([`rm_cache::actions::next_refresh`]); the others go on.
//!
//! Which installation reads an action ([`readers`]): the App's installation covering the
//! action's repository when there is one (a private action needs `contents: read` there),
//! else the installation rm reads public repositories with (`Config::reading_target`'s, as
//! for actions/runner's releases): any installation token may read a public repository, and
//! the requests are charged to that installation's budget.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use rm_cache::actions::{
    ActionRef, ArchiveKey, ArchiveStore, MAX_ARCHIVE_BYTES, next_refresh, to_remove,
};
use rm_github::{GithubClient, GithubError, Target};
use tokio::time::Instant;

/// The installations to try for `action`, in order: the one covering its repository, then the
/// public reader's. Pure.
pub(crate) fn readers(action: &ActionRef, reader: Option<&Target>) -> Vec<Target> {
    let own = Target::Repo {
        owner: action.owner.clone(),
        repo: action.repo.clone(),
    };
    let mut out = vec![own];
    if let Some(reader) = reader
        && !out.contains(reader)
    {
        out.push(reader.clone());
    }
    out
}

/// One configured action and what is known of it.
#[derive(Debug)]
struct Tracked {
    action: ActionRef,
    /// The commit its ref named at the last successful resolution.
    sha: Option<String>,
    /// The installation that last read it.
    installation: Option<u64>,
    failures: u32,
    due: Instant,
}

/// The refresher's state between passes.
pub(crate) struct Refresher {
    client: GithubClient,
    store: ArchiveStore,
    reader: Option<Target>,
    tracked: Vec<Tracked>,
    unwanted_since: BTreeMap<ArchiveKey, SystemTime>,
}

/// Why one action's refresh failed, and the earliest GitHub allows another request.
struct Failure {
    error: anyhow::Error,
    not_before: Option<Duration>,
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure {
            error,
            not_before: None,
        }
    }
}

impl Failure {
    fn github(err: GithubError, what: &str) -> Self {
        let not_before = match &err {
            GithubError::RateLimited { retry_at, .. } => Some(
                retry_at
                    .duration_since(SystemTime::now())
                    .unwrap_or_default(),
            ),
            _ => None,
        };
        Failure {
            error: anyhow::Error::new(err).context(what.to_owned()),
            not_before,
        }
    }
}

impl Refresher {
    /// Opens the store at `root` (removing what a crash left) for `actions`, every one due now.
    pub(crate) fn open(
        client: GithubClient,
        root: PathBuf,
        actions: Vec<ActionRef>,
        reader: Option<Target>,
    ) -> anyhow::Result<Self> {
        let store = ArchiveStore::open(&root)
            .with_context(|| format!("cannot open the action archives in {}", root.display()))?;
        let now = Instant::now();
        Ok(Refresher {
            client,
            store,
            reader,
            tracked: actions
                .into_iter()
                .map(|action| Tracked {
                    action,
                    sha: None,
                    installation: None,
                    failures: 0,
                    due: now,
                })
                .collect(),
            unwanted_since: BTreeMap::new(),
        })
    }

    /// When the next action is due (an hour ahead when none is configured).
    pub(crate) fn next_due(&self) -> Instant {
        self.tracked
            .iter()
            .map(|t| t.due)
            .min()
            .unwrap_or_else(|| Instant::now() + rm_cache::actions::REFRESH_INTERVAL)
    }

    /// Refreshes every action due by now, then removes what is out of its grace.
    pub(crate) async fn refresh_due(&mut self) {
        let now = Instant::now();
        for i in 0..self.tracked.len() {
            if self.tracked[i].due > now {
                continue;
            }
            let result = self.refresh(i).await;
            let tracked = &mut self.tracked[i];
            let not_before = match result {
                Ok(()) => {
                    tracked.failures = 0;
                    None
                }
                Err(failure) => {
                    tracked.failures = tracked.failures.saturating_add(1);
                    // Asked afresh next time: the App may have been installed or removed.
                    tracked.installation = None;
                    tracing::warn!(
                        action = %tracked.action,
                        failures = tracked.failures,
                        error = format!("{:#}", failure.error),
                        "cannot refresh the action's archive; runners download it themselves meanwhile"
                    );
                    failure.not_before
                }
            };
            tracked.due = Instant::now() + next_refresh(tracked.failures, not_before);
        }
        self.prune().await;
    }

    /// Resolves action `i`'s ref and installs its archive when it is not there yet.
    async fn refresh(&mut self, i: usize) -> Result<(), Failure> {
        let action = self.tracked[i].action.clone();
        let repository = action.repository();
        let (installation, sha) = self.resolve(i).await?;
        self.tracked[i].installation = Some(installation);
        let key = action.key(&sha);
        if !self.store.contains(&key) {
            self.download(installation, &key).await?;
            tracing::info!(action = %action, sha = %sha, "action archive kept for runners");
        }
        if self.tracked[i].sha.as_deref() != Some(sha.as_str()) {
            tracing::debug!(repository = %repository, sha = %sha, "action ref resolved");
        }
        self.tracked[i].sha = Some(sha);
        Ok(())
    }

    /// The installation that reads action `i` and the commit its ref names: the one that read
    /// it last, else each of [`readers`] in turn until one sees the repository.
    async fn resolve(&self, i: usize) -> Result<(u64, String), Failure> {
        let tracked = &self.tracked[i];
        let repository = tracked.action.repository();
        let reference = &tracked.action.reference;
        let known = tracked.installation.map(|id| vec![id]);
        let candidates = match known {
            Some(ids) => ids,
            None => {
                let mut ids = Vec::new();
                for target in readers(&tracked.action, self.reader.as_ref()) {
                    match self.client.installation_for(&target).await {
                        Ok(id) if !ids.contains(&id) => ids.push(id),
                        Ok(_) | Err(GithubError::NotFound { .. }) => {}
                        Err(e) => return Err(Failure::github(e, "finding an installation")),
                    }
                }
                ids
            }
        };
        let mut last = None;
        for installation in candidates {
            match self
                .client
                .commit_sha(installation, &repository, reference)
                .await
            {
                Ok(polled) => return Ok((installation, polled.value)),
                // Not visible to this installation (private elsewhere): try the next.
                Err(e @ (GithubError::NotFound { .. } | GithubError::Forbidden { .. })) => {
                    last = Some(e);
                }
                Err(e) => return Err(Failure::github(e, "resolving the ref")),
            }
        }
        Err(match last {
            Some(e) => Failure::github(
                e,
                "no installation of the App reads this repository (a private action needs the App installed on it with `contents: read`)",
            ),
            None => anyhow::anyhow!(
                "no installation to read it with: install the App on the action's account, or name a [[policy]] whose installation reads public repositories"
            )
            .into(),
        })
    }

    /// Downloads `key`'s tarball into the store, checked and installed atomically.
    async fn download(&self, installation: u64, key: &ArchiveKey) -> Result<(), Failure> {
        let staged = self.store.begin(key).context("cannot stage the download")?;
        let fetched = async {
            let mut writer = staged.writer()?;
            let written = self
                .client
                .download_tarball(
                    installation,
                    &key.repository,
                    &key.sha,
                    MAX_ARCHIVE_BYTES,
                    &mut writer,
                )
                .await?;
            anyhow::Ok(written)
        }
        .await;
        if let Err(error) = fetched {
            self.store.abandon(staged);
            return Err(error.context("downloading the archive").into());
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.install(staged))
            .await
            .context("the archive's check panicked")?
            .context("the download is not the archive GitHub makes; not kept")?;
        Ok(())
    }

    /// Removes archives out of their grace, once every action has been resolved (before, an
    /// unresolved action's current archive would look unwanted).
    async fn prune(&mut self) {
        if self.tracked.iter().any(|t| t.sha.is_none()) {
            return;
        }
        let wanted: BTreeSet<ArchiveKey> = self
            .tracked
            .iter()
            .filter_map(|t| t.sha.as_deref().map(|sha| t.action.key(sha)))
            .collect();
        let store = self.store.clone();
        let stored = match tokio::task::spawn_blocking(move || store.stored()).await {
            Ok(Ok(stored)) => stored,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot list the action archives");
                return;
            }
            Err(_) => return,
        };
        for key in to_remove(
            &stored,
            &wanted,
            &mut self.unwanted_since,
            SystemTime::now(),
        ) {
            match self.store.remove(&key) {
                Ok(()) => {
                    tracing::info!(repository = %key.repository, sha = %key.sha, "action archive removed: no configured ref names it")
                }
                Err(e) => tracing::warn!(error = %e, "cannot remove an action archive"),
            }
        }
    }

    #[cfg(test)]
    fn store(&self) -> &ArchiveStore {
        &self.store
    }

    #[cfg(test)]
    fn make_due(&mut self) {
        let now = Instant::now();
        for t in &mut self.tracked {
            t.due = now;
        }
    }
}

/// Keeps `actions`' archives in `root` (`<cache.dir>/actions`) until `shutdown`, reading public
/// repositories with `reader`'s installation. A store that cannot be opened is logged and the
/// task ends: runners then download actions themselves, as without the cache.
pub(crate) async fn refresh_loop(
    client: GithubClient,
    root: PathBuf,
    actions: Vec<ActionRef>,
    reader: Option<Target>,
    shutdown: impl Future<Output = ()> + Send,
) {
    if actions.is_empty() {
        return;
    }
    let opened = {
        let root = root.clone();
        tokio::task::spawn_blocking(move || Refresher::open(client, root, actions, reader)).await
    };
    let mut refresher = match opened {
        Ok(Ok(refresher)) => refresher,
        Ok(Err(e)) => {
            tracing::warn!(error = format!("{e:#}"), "action archives are not kept");
            return;
        }
        Err(_) => return,
    };
    tokio::pin!(shutdown);
    loop {
        refresher.refresh_due().await;
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep_until(refresher.next_due()) => {}
        }
    }
}

#[cfg(test)]
mod tests;
