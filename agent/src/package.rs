//! The runner package as `[runner]` configures it: what `rm-agent run` starts runners from and
//! what `rm-agent check` says about it. The package itself (the cache, the download and its
//! verification, following releases) is `rm_runner::package`; this module only reads the
//! configuration into it and turns its failures into the command's exit, naming the key.

use std::path::PathBuf;

use rm_github::{GithubClient, Target};
use rm_runner::backend::{NoIsolation, UserIsolation};
use rm_runner::package::latest::{self, Follower, Step};
use rm_runner::package::release::Platform;
use rm_runner::package::{PackageError, Wanted, progress, resolve};

use crate::config::runner_version::LATEST;
use crate::config::{Config, display_file};
use crate::exit::Exit;

/// What `config` asks for on this host; `None` without a pinned `runner.version` (unset, or
/// `"latest"`, which [`resolve_at_start`] resolves through GitHub).
pub(crate) fn wanted(config: &Config) -> Option<Result<Wanted, PackageError>> {
    let version = config.runner.version.clone().filter(|v| v != LATEST)?;
    Some(
        Platform::host()
            .ok_or(PackageError::Platform)
            .map(|platform| Wanted {
                api_url: config.github.api_url.clone(),
                data_dir: config.data_dir.clone(),
                version,
                platform,
            }),
    )
}

/// `rm-agent run`'s entry: the package `runner.version` names, with progress on stderr, or the
/// failure as an exit: `2` naming the key when the version cannot be used as configured, `1`
/// when the download failed (a retry, or the network, may fix it).
pub(crate) async fn resolve_configured(config: &Config) -> Result<PathBuf, Exit> {
    let wanted = match wanted(config) {
        Some(Ok(wanted)) => wanted,
        Some(Err(err)) => return Err(exit(config, &err)),
        None => {
            return Err(Exit::usage(format!(
                "{}: `runner.version`: not set",
                display_file(config.source.as_deref())
            )));
        }
    };
    let mut progress = progress::for_stderr(&wanted.name());
    resolve(&wanted, progress.as_mut())
        .await
        .map_err(|err| exit(config, &err))
}

/// The exit for a package failure, with its remedy.
pub(crate) fn exit(config: &Config, err: &PackageError) -> Exit {
    if err.is_configuration() {
        Exit::usage(format!(
            "{}: `runner.version`: {err}; pick a version listed at https://github.com/actions/runner/releases, or unpack a runner and set `runner.package_dir` instead",
            display_file(config.source.as_deref())
        ))
    } else {
        Exit::runtime(anyhow::anyhow!(
            "{err}; check the network path to {} (and to its downloads), or unpack a verified runner and set `runner.package_dir`",
            config.github.api_url
        ))
    }
}

/// Whether `config` follows releases.
pub(crate) fn follows_latest(config: &Config) -> bool {
    config.runner.version.as_deref() == Some(LATEST)
}

/// For `rm-agent check`: what `"latest"` does here, and the newest package already cached.
pub(crate) fn describe(config: &Config) -> String {
    let every = humantime::format_duration(config.runner.release_check_interval);
    let cached = Platform::host().and_then(|p| latest::newest_cached(&config.data_dir, p));
    match cached {
        Some((version, _)) => format!(
            "runner.version = \"latest\": follows actions/runner's releases (asked at start and every {every}); v{version} is cached"
        ),
        None => format!(
            "runner.version = \"latest\": follows actions/runner's releases (asked at start and every {every}); nothing cached yet: `rm-agent run` downloads the latest release and checks its SHA-256"
        ),
    }
}

/// The installation the releases are read with: [`Config::reading_target`]'s (any
/// installation token may read a public repository; the request is charged to that
/// installation's budget).
pub(crate) fn reader(config: &Config) -> Option<Target> {
    config.reading_target().cloned()
}

/// The package runners start from when `rm-agent run` begins: GitHub's latest release,
/// downloaded and verified unless cached; the newest cached package when GitHub cannot be
/// asked (with a warning); an exit when neither can be had. Returns its directory and
/// version.
pub(crate) async fn resolve_at_start(
    config: &Config,
    client: &GithubClient,
) -> Result<(PathBuf, String), Exit> {
    let platform = Platform::host().ok_or_else(|| exit(config, &PackageError::Platform))?;
    let asked = match reader(config) {
        Some(target) => latest::ask(client, &target)
            .await
            .map_err(|e| e.to_string()),
        None => Err("no [[policy]] names an installation to ask with".to_owned()),
    };
    let version = match asked {
        Ok(latest) => match latest::decide("", &latest.value) {
            Step::Adopt(version) => Ok(version),
            Step::Current | Step::Ignore(_) => Err(format!(
                "GitHub's latest actions/runner release {} names no runner version",
                latest.value.tag_name
            )),
        },
        Err(e) => Err(e),
    };
    let version = match version {
        Ok(version) => version,
        Err(reason) => {
            return match latest::newest_cached(&config.data_dir, platform) {
                Some((version, dir)) => {
                    tracing::warn!(%reason, version = %version, "cannot learn actions/runner's latest release; starting runners from the newest cached package, and asking again later");
                    Ok((dir, version))
                }
                None => Err(Exit::runtime(anyhow::anyhow!(
                    "`runner.version = \"latest\"`: cannot learn actions/runner's latest release ({reason}), and no package is cached; check the network path to {}, or pin a version",
                    config.github.api_url
                ))),
            };
        }
    };
    let wanted = Wanted {
        api_url: config.github.api_url.clone(),
        data_dir: config.data_dir.clone(),
        version: version.clone(),
        platform,
    };
    let mut progress = progress::for_stderr(&wanted.name());
    let dir = resolve(&wanted, progress.as_mut())
        .await
        .map_err(|err| exit(config, &err))?;
    tracing::info!(version = %version, "runners start from actions/runner's latest release");
    Ok((dir, version))
}

/// The task that follows releases (or watches a pinned version's window) for `config`, when it
/// sets `runner.version`; `version` is the one runners start from ([`resolve_at_start`] chose
/// it for `"latest"`), and `none` and `user` the backends whose packages it updates (the
/// executor's `Backends`).
pub(crate) fn follower(
    config: &Config,
    client: &GithubClient,
    none: &NoIsolation,
    user: Option<&UserIsolation>,
    version: &str,
) -> Option<Follower> {
    config.runner.version.as_ref()?;
    let source = latest::Source {
        follows: follows_latest(config),
        client: client.clone(),
        target: reader(config)?,
        api_url: config.github.api_url.clone(),
        data_dir: config.data_dir.clone(),
        platform: Platform::host()?,
        interval: config.runner.release_check_interval,
        version: version.to_owned(),
    };
    Some(Follower::new(source, none, user))
}
