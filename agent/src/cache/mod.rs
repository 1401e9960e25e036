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

/// Where the job-started hook is written inside `cache.dir`.
const HOOK_FILE: &str = "hooks/job-started.sh";

/// The job-started hook cached runners get (`rm_runner::backend::HOOK_IN_RUN`): it copies the
/// service's URL into the job's own environment (`$GITHUB_ENV`), so that steps in a container,
/// which get only the job's variables (`docker exec -e NAME`), have them too; then runs the
/// operator's own hook, if the policy's `env_file` named one. The runner runs it with
/// `bash -e` (or `sh -e`) before the job's first step.
pub(crate) const HOOK_SCRIPT: &str = r#"#!/bin/sh
# Written by rm-agent (the host-local cache, docs/operating.md): every step of this job, steps
# in a container too, reaches the cache at this runner's own address.
printf 'ACTIONS_RESULTS_URL=%s\nACTIONS_CACHE_URL=%s\n' "$RM_CACHE_URL" "$RM_CACHE_URL" >> "$GITHUB_ENV"
if [ -n "${RM_OPERATOR_JOB_STARTED_HOOK:-}" ]; then
    if command -v bash >/dev/null 2>&1; then
        exec bash -e "$RM_OPERATOR_JOB_STARTED_HOOK"
    fi
    exec sh -e "$RM_OPERATOR_JOB_STARTED_HOOK"
fi
"#;

/// What a cached runner of this configuration is given. Pure.
pub(crate) fn plan(cache: &Cache) -> CachePlan {
    CachePlan {
        port: cache.port,
        archives: (!cache.actions.is_empty())
            .then(|| cache.dir.join(rm_cache::actions::ACTIONS_DIR)),
        hook: Some(cache.dir.join(HOOK_FILE)),
    }
}

/// Writes the job-started hook (root's, `0644` in a `0755` directory: runners read it, never
/// write it), replacing what is there in one rename. Blocking.
fn write_hook(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let path = dir.join(HOOK_FILE);
    let hooks = path.parent().unwrap_or(dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(hooks)
        .and_then(|()| {
            // The agent's umask (077) took the mode's group and other bits at creation.
            std::fs::set_permissions(hooks, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        })
        .with_context(|| format!("cannot create {}", hooks.display()))?;
    let staged = hooks.join(".job-started.sh.tmp");
    let _ = std::fs::remove_file(&staged);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&staged)
        .with_context(|| format!("cannot write {}", staged.display()))?;
    // Under the agent's umask the file was made 0600: runners (other uids) could not read it.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .and_then(|()| file.write_all(HOOK_SCRIPT.as_bytes()))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", staged.display()))?;
    std::fs::rename(&staged, &path)
        .with_context(|| format!("cannot install {}", path.display()))?;
    Ok(())
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
        // Callers get URLs on their own runner's address (`callers`); this is for the others.
        public_base: format!("http://127.0.0.1:{}/", cache.port),
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
    let service = tokio::task::spawn_blocking(move || {
        let service = rm_cache::Service::open(settings)
            .with_context(|| format!("cannot open the cache in {} (cache.dir)", dir.display()))?;
        write_hook(&dir)?;
        anyhow::Ok(service)
    })
    .await
    .context("the cache's opening panicked")??;
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, cache.port));
    let listener = tokio::net::TcpListener::bind(at)
        .await
        .with_context(|| format!("cannot listen on {at} (cache.port)"))?;
    tracing::info!(listen = %at, dir = %cache.dir.display(), "cache service listening");
    let callers = callers::shared(callers::RunnerCallers::new(
        uids, cache.port, journal, jobs, client,
    ));
    let serving = {
        let service = service.clone();
        async move { service.serve(listener, callers, shutdown).await }
    };
    Ok(Running { service, serving })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook as the runner runs it (`sh -e`): the job's environment file gets both URLs,
    /// and an operator's hook runs after them.
    #[test]
    fn the_hook_puts_the_urls_in_the_jobs_environment_and_runs_the_operators() {
        let dir = tempfile::tempdir().unwrap();
        write_hook(dir.path()).unwrap();
        let hook = dir.path().join(HOOK_FILE);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&hook).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let env_file = dir.path().join("github_env");
        let operator = dir.path().join("theirs.sh");
        std::fs::write(
            &operator,
            "echo \"THEIRS=$RM_CACHE_URL\" >> \"$GITHUB_ENV\"\n",
        )
        .unwrap();
        for theirs in [None, Some(&operator)] {
            std::fs::write(&env_file, "EARLIER=1\n").unwrap();
            let mut sh = std::process::Command::new("sh");
            sh.arg("-e")
                .arg(&hook)
                .env("GITHUB_ENV", &env_file)
                .env("RM_CACHE_URL", "http://10.213.0.1:8736/")
                .env_remove("RM_OPERATOR_JOB_STARTED_HOOK");
            if let Some(theirs) = theirs {
                sh.env("RM_OPERATOR_JOB_STARTED_HOOK", theirs);
            }
            let out = sh.output().unwrap();
            assert!(out.status.success(), "{out:?}");
            let mut want = String::from(
                "EARLIER=1\nACTIONS_RESULTS_URL=http://10.213.0.1:8736/\nACTIONS_CACHE_URL=http://10.213.0.1:8736/\n",
            );
            if theirs.is_some() {
                want.push_str("THEIRS=http://10.213.0.1:8736/\n");
            }
            assert_eq!(std::fs::read_to_string(&env_file).unwrap(), want);
        }
    }

    #[test]
    fn a_cached_runner_reaches_the_service_on_its_own_loopback() {
        let cache = crate::config::cache::validate(
            toml::from_str("port = 9911\nactions = [\"actions/checkout@v4\"]").unwrap(),
            std::path::Path::new("/var/lib/rm-agent"),
        )
        .unwrap();
        let runner = plan(&cache);
        assert_eq!(runner.port, 9911);
        assert_eq!(
            runner.archives.as_deref(),
            Some(std::path::Path::new("/var/lib/rm-agent/cache/actions"))
        );
        let settings = settings(&cache).unwrap();
        assert_eq!(settings.public_base, "http://127.0.0.1:9911/");
        // No actions configured: no archive directory is lent.
        let bare =
            crate::config::cache::validate(toml::from_str("").unwrap(), std::path::Path::new("/d"))
                .unwrap();
        assert_eq!(plan(&bare).archives, None);
    }
}
