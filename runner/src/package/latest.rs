//! `runner.version = "latest"`: following actions/runner's releases. Owns which release new
//! runners start from, when GitHub is asked again, and when a superseded package is removed.
//!
//! GitHub stops giving jobs to a runner that has not installed a new release within 30 days of
//! it (and JIT runners cannot update themselves), so a host that follows releases never falls
//! out of that window. The release GitHub calls latest (`GET
//! /repos/actions/runner/releases/latest`: the newest published release that is neither a draft
//! nor a prerelease) is asked for at start and every `runner.release_check_interval` (a day by
//! default) through the shared request budget, conditionally (an unchanged answer is a `304`).
//! A newer one is downloaded and verified in the background by the same code as a pinned
//! version ([`super::resolve`]: the published SHA-256, the cache, nothing downloaded twice, also
//! across a restart), installed beside the current one and swapped in for new runners; runners
//! already running finish on the package they started from. A superseded package is removed
//! once no runtime uses it: no runtime is being made from it (an in-process hold) and no runtime
//! links its stored tree ([`crate::store::tree_in_use`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rm_github::types::ReleaseSummary;
use rm_github::{GithubClient, GithubError, Target};

use super::cache::Cache;
use super::current::CurrentPackage;
use super::release::{self, Platform};
use super::report::VersionReport;
use super::version::{parse_version, version_of_tag};
use super::window::Window;
use super::{Wanted, progress};
use crate::backend::{LinkedPackage, NoIsolation, UserIsolation};
use crate::store::{Leftovers, StoredPackage, tree_in_use};

/// After a failed check or download, how long until the next try (never longer than the
/// configured interval).
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10 * 60);
/// How often superseded packages are looked at for removal while there are any.
pub(crate) const PRUNE_INTERVAL: Duration = Duration::from_secs(10);

/// What to do with the release GitHub calls latest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Runners already start from it.
    Current,
    /// Download and verify it, then start new runners from it.
    Adopt(String),
    /// Not a release to run; why.
    Ignore(String),
}

/// The decision: only a published, non-prerelease release of a newer version is adopted. An
/// older one (a release withdrawn after this host took it) is not gone back to: the package in
/// use was verified against what GitHub published, and GitHub's window only ever moves forward.
pub fn decide(current: &str, latest: &ReleaseSummary) -> Step {
    if latest.draft || latest.prerelease {
        return Step::Ignore(format!("{} is a draft or a prerelease", latest.tag_name));
    }
    let Some(version) = version_of_tag(&latest.tag_name) else {
        return Step::Ignore(format!(
            "the tag {:?} names no runner version",
            latest.tag_name
        ));
    };
    match (parse_version(current), parse_version(&version)) {
        (_, _) if version == current => Step::Current,
        (Some(now), Some(new)) if new < now => Step::Ignore(format!(
            "v{version} is older than v{current}, which runners start from"
        )),
        _ => Step::Adopt(version),
    }
}

/// The newest complete package of this platform in the cache: what a start uses when GitHub
/// cannot be asked.
pub fn newest_cached(data_dir: &Path, platform: Platform) -> Option<(String, PathBuf)> {
    let cache = Cache::new(data_dir);
    let prefix = release::package_name(platform, "");
    let entries = std::fs::read_dir(cache.root()).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix(&prefix)?.to_owned();
            let order = parse_version(&version)?;
            let cached = cache.complete(&name)?;
            Some((order, version, cached.dir))
        })
        .max_by_key(|(order, _, _)| *order)
        .map(|(_, version, dir)| (version, dir))
}

/// Asks GitHub for the latest actions/runner release.
pub async fn ask(
    client: &GithubClient,
    target: &Target,
) -> Result<rm_github::Polled<ReleaseSummary>, GithubError> {
    let installation = client.installation_for(target).await?;
    client
        .latest_release(installation, release::RUNNER_REPOSITORY)
        .await
}

/// GitHub's releases of actions/runner (the newest page), for a pinned version's window.
pub async fn list(
    client: &GithubClient,
    target: &Target,
) -> Result<Vec<ReleaseSummary>, GithubError> {
    let installation = client.installation_for(target).await?;
    Ok(client
        .list_releases(installation, release::RUNNER_REPOSITORY)
        .await?
        .value)
}

/// A package runners no longer start from, kept until nothing uses it.
struct Retired {
    version: String,
    /// Its directory in the download cache; a runtime being copied from it holds a clone.
    dir: Arc<PathBuf>,
    /// Its tree in the isolated store, when runners are isolated.
    stored: Option<StoredPackage>,
}

impl Retired {
    /// Whether a runtime is being made from it (in this process) or still links it.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.dir) > 1
            || self
                .stored
                .as_ref()
                .is_some_and(|s| s.holders() > 1 || tree_in_use(s.tree()))
    }
}

/// What a [`Follower`] follows: `runner.version` and where releases are read and cached.
#[derive(Debug, Clone)]
pub struct Source {
    /// `runner.version = "latest"`; otherwise a pinned version is watched.
    pub follows: bool,
    pub client: GithubClient,
    /// The installation the releases are read with (its budget is charged).
    pub target: Target,
    /// `github.api_url`.
    pub api_url: String,
    pub data_dir: PathBuf,
    pub platform: Platform,
    /// `runner.release_check_interval`.
    pub interval: Duration,
    /// The version new runners start from.
    pub version: String,
}

/// The background task that follows releases while `rm-agent run` runs (with `"latest"`), or
/// watches a pinned version's window (GitHub's releases listed every interval, the judgement
/// [`super::window::judge`] logged when it closes and written for `status`).
pub struct Follower {
    /// `"latest"`; otherwise a pinned version is watched.
    follows: bool,
    client: GithubClient,
    target: Target,
    api_url: String,
    data_dir: PathBuf,
    platform: Platform,
    interval: Duration,
    /// The version new runners start from.
    version: String,
    none: CurrentPackage,
    linked: Option<Arc<LinkedPackage>>,
    retired: Vec<Retired>,
    /// What a new release must pass before runners start from it ([`Follower::admitting`]).
    admission: Option<Admission>,
}

/// A judgement of a downloaded, verified package directory before it is adopted: `Err` says
/// why it is not (e.g. a policy's job image cannot run it). Run on the blocking pool.
pub type Admission = Arc<dyn Fn(&std::path::Path) -> Result<(), String> + Send + Sync>;

impl Follower {
    /// The task following `source` (`rm-agent`'s `package::follower` builds it from
    /// `[runner]`), updating the packages of the backends `none` and `user`.
    pub fn new(source: Source, none: &NoIsolation, user: Option<&UserIsolation>) -> Follower {
        Follower {
            follows: source.follows,
            client: source.client,
            target: source.target,
            api_url: source.api_url,
            data_dir: source.data_dir,
            platform: source.platform,
            interval: source.interval,
            version: source.version,
            none: none.package.clone(),
            linked: user.and_then(|u| u.package.clone()),
            retired: Vec::new(),
            admission: None,
        }
    }

    /// A new release is adopted only once `admission` accepts its package; a refused one is
    /// logged and asked about again at the next check, and runners keep the current one.
    pub fn admitting(mut self, admission: Admission) -> Follower {
        self.admission = Some(admission);
        self
    }

    /// Checks every interval (the first right away: the start's answer is a free `304` then)
    /// and removes superseded packages once unused, until `stop` completes.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        // Right away: a pinned version is judged, and "latest" learns whether the start's answer
        // still holds (asked conditionally with the start's ETag: a free `304`), which also
        // retries soon a start that fell back to the cache.
        let mut next_check = tokio::time::Instant::now();
        // Packages of earlier versions a previous run left: removed once unused.
        self.prune().await;
        loop {
            let prune_at = tokio::time::Instant::now() + PRUNE_INTERVAL;
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep_until(next_check) => {
                    let wait = match self.check().await {
                        Ok(()) => self.interval,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot follow actions/runner's latest release; runners keep starting from v{}, and it is tried again", self.version);
                            RETRY_AFTER_FAILURE.min(self.interval)
                        }
                    };
                    next_check = tokio::time::Instant::now() + wait;
                    self.prune().await;
                }
                () = tokio::time::sleep_until(prune_at), if !self.retired.is_empty() => {
                    self.prune().await;
                }
            }
        }
    }

    /// Writes what was learned for `rm-agent status`; a failure costs only the report.
    fn report(&self, judged: &Window) {
        let report = VersionReport::of(&self.version, self.follows, judged, SystemTime::now());
        if let Err(e) = super::report::write(&self.data_dir, &report) {
            tracing::warn!(error = %e, "cannot write the runner version report for `rm-agent status`");
        }
    }

    /// One check: adopt a newer release, or judge the pinned version's window.
    async fn check(&mut self) -> anyhow::Result<()> {
        if !self.follows {
            return self.judge_pinned().await;
        }
        let latest = ask(&self.client, &self.target).await?;
        let version = match decide(&self.version, &latest.value) {
            Step::Current => {
                self.report(&Window::Newest);
                return Ok(());
            }
            Step::Ignore(why) => {
                tracing::debug!(%why, "GitHub's latest actions/runner release is not adopted");
                return Ok(());
            }
            Step::Adopt(version) => version,
        };
        tracing::info!(from = %self.version, to = %version, "actions/runner has a new release; downloading and verifying it in the background");
        let wanted = Wanted {
            api_url: self.api_url.clone(),
            data_dir: self.data_dir.clone(),
            version: version.clone(),
            platform: self.platform,
        };
        // In the background: log lines, never a bar over the agent's output.
        let mut progress = progress::LogProgress::new(wanted.name());
        let dir = super::resolve(&wanted, &mut progress).await?;
        if let Some(admission) = &self.admission {
            let (admission, source) = (Arc::clone(admission), dir.clone());
            if let Err(why) = tokio::task::spawn_blocking(move || admission(&source)).await? {
                tracing::warn!(version = %version, why = %why, "actions/runner's new release is not adopted; runners keep starting from v{}", self.version);
                return Ok(());
            }
        }
        let stored = match &self.linked {
            Some(linked) => {
                let (linked, source) = (Arc::clone(linked), dir.clone());
                Some(tokio::task::spawn_blocking(move || linked.switch(&source)).await??)
            }
            None => None,
        };
        let old_dir = self.none.set(&dir);
        self.retired.push(Retired {
            version: std::mem::replace(&mut self.version, version),
            dir: old_dir,
            stored,
        });
        tracing::info!(version = %self.version, "new runners start from the new actions/runner release; running ones finish on theirs");
        self.report(&Window::Newest);
        Ok(())
    }

    /// A pinned version: GitHub's releases listed, its window judged, a closing one logged.
    async fn judge_pinned(&mut self) -> anyhow::Result<()> {
        let releases = list(&self.client, &self.target).await?;
        let judged = super::window::judge(&self.version, &releases, SystemTime::now());
        if let Some(warning) = judged.warning(&self.version) {
            tracing::warn!("{warning}");
        }
        self.report(&judged);
        Ok(())
    }

    /// Removes every superseded package nothing uses any more: its stored tree and its
    /// directory in the download cache, and packages of other versions an earlier run left.
    async fn prune(&mut self) {
        if !self.follows {
            // A pinned version's cache is the operator's: every version stays.
            return;
        }
        let retired = std::mem::take(&mut self.retired);
        let current_dir = self.none.get();
        let current_digest = self.linked.as_ref().map(|l| l.current().digest());
        let linked = self.linked.clone();
        let cache = Cache::new(&self.data_dir);
        let prefix = release::package_name(self.platform, "");
        let work = move || {
            let (held, free): (Vec<Retired>, Vec<Retired>) =
                retired.into_iter().partition(Retired::in_use);
            if let Some(linked) = &linked {
                let mut keep: Vec<String> = current_digest.into_iter().collect();
                keep.extend(
                    held.iter()
                        .filter_map(|r| r.stored.as_ref().map(StoredPackage::digest)),
                );
                // A repair may be building a staging folder meanwhile: those stay.
                linked.store().remove_unused(&keep, Leftovers::Keep);
            }
            for gone in &free {
                tracing::info!(version = %gone.version, "removed a superseded runner package nothing uses any more");
            }
            drop(free);
            // The download cache: every complete package but the current one and those still
            // held (runtimes link the store, or are copies; none reads the cache).
            let keep: Vec<PathBuf> = std::iter::once(current_dir.as_ref().clone())
                .chain(held.iter().map(|r| r.dir.as_ref().clone()))
                .collect();
            if let Ok(entries) = std::fs::read_dir(cache.root()) {
                for entry in entries.filter_map(Result::ok) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with(&prefix)
                        && !keep.contains(&entry.path())
                        && let Err(e) = cache.remove_package(&name)
                    {
                        tracing::warn!(package = %name, error = %e, "cannot remove a superseded runner package; tried again later");
                    }
                }
            }
            held
        };
        match tokio::task::spawn_blocking(work).await {
            Ok(held) => self.retired = held,
            Err(e) => tracing::warn!(error = %e, "the superseded runner package sweep failed"),
        }
    }
}

#[cfg(test)]
#[path = "latest_tests.rs"]
mod tests;
