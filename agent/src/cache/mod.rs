//! The host-local cache as `rm-agent run` runs it (`[cache]`, `policy.cache`): the
//! `rm_cache` service opened (and recovered) in `cache.dir`, listening on the host's loopback at
//! `cache.port`, which runners reach through their network's host-port path; callers known by
//! their runner's address ([`callers`]); what a cached runner is given
//! (`rm_runner::backend::CachePlan`); and the action archives kept on the host ([`actions`]).
//! The service, its protocols and its rules are `rm_cache`'s; this module only wires them.

pub(crate) mod actions;
pub(crate) mod callers;
pub(crate) mod report;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use rm_github::GithubClient;
use rm_runner::backend::CachePlan;

use crate::config::Config;
use crate::config::cache::Cache;

/// Whether any policy of `config` uses the cache: only then is it run.
pub(crate) fn wanted(config: &Config) -> Option<&Cache> {
    config
        .cache
        .as_ref()
        .filter(|_| config.policies.iter().any(|p| p.cache))
}

/// What a cached runner of this configuration is given. Pure.
pub(crate) fn plan(cache: &Cache) -> CachePlan {
    CachePlan {
        url: format!("http://127.0.0.1:{}/", cache.port),
        archives: (!cache.actions.is_empty())
            .then(|| cache.dir.join(rm_cache::actions::ACTIONS_DIR)),
    }
}

/// The service's settings from `[cache]`. Pure.
pub(crate) fn settings(cache: &Cache) -> anyhow::Result<rm_cache::Settings> {
    Ok(rm_cache::Settings {
        dir: cache.dir.clone(),
        max_size: cache.max_size,
        max_age: cache.max_age,
        repo_quota: Some(cache.repository_quota),
        upstream: Some(
            cache
                .upstream
                .parse()
                .with_context(|| format!("cache.upstream `{}`", cache.upstream))?,
        ),
        public_base: plan(cache).url,
    })
}

/// A running cache: the service (for `status` and `/metrics`) and its serving, which ends when
/// `shutdown` does.
pub(crate) struct Running<F> {
    pub(crate) service: rm_cache::Service,
    pub(crate) serving: F,
}

/// Opens the cache (recovering what a crash left: no half entry, no orphaned bytes) and binds
/// `127.0.0.1:cache.port`; a taken port or an unusable directory fails the start.
pub(crate) async fn start(
    cache: &Cache,
    uids: Vec<u32>,
    journal: PathBuf,
    jobs: rm_journal::JobReader,
    client: GithubClient,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Running<impl Future<Output = ()> + Send + 'static>> {
    let settings = settings(cache)?;
    let dir = cache.dir.clone();
    let service = tokio::task::spawn_blocking(move || rm_cache::Service::open(settings))
        .await
        .context("the cache's opening panicked")?
        .with_context(|| format!("cannot open the cache in {} (cache.dir)", dir.display()))?;
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, cache.port));
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .with_context(|| format!("cannot listen on {at} (cache.port)"))?;
    tracing::info!(listen = %at, dir = %cache.dir.display(), "cache service listening");
    let callers = callers::shared(callers::RunnerCallers::new(uids, journal, jobs, client));
    let serving = {
        let service = service.clone();
        async move { service.serve(listener, callers, shutdown).await }
    };
    Ok(Running { service, serving })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_runner_reaches_the_service_on_its_own_loopback() {
        let cache = crate::config::cache::validate(
            toml::from_str("port = 9911\nactions = [\"actions/checkout@v4\"]").unwrap(),
            std::path::Path::new("/var/lib/rm-agent"),
        )
        .unwrap();
        let runner = plan(&cache);
        assert_eq!(runner.url, "http://127.0.0.1:9911/");
        assert_eq!(
            runner.archives.as_deref(),
            Some(std::path::Path::new("/var/lib/rm-agent/cache/actions"))
        );
        let settings = settings(&cache).unwrap();
        assert_eq!(settings.public_base, runner.url);
        // No actions configured: no archive directory is lent.
        let bare =
            crate::config::cache::validate(toml::from_str("").unwrap(), std::path::Path::new("/d"))
                .unwrap();
        assert_eq!(plan(&bare).archives, None);
    }
}
