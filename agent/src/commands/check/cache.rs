//! `check`'s `cache` finding, only where a policy sets `cache = true` (issue 39): whether the
//! runner package runners would start from fits the cache redirect
//! ([`rm_runner::store::redirect`]), so its jobs' `actions/cache` reach the host's cache
//! service, or runs uncached, and why. Looks only: the package is read where it is (the
//! configured directory or the download cache), nothing is stored or derived.

use std::path::{Path, PathBuf};

use super::Finding;
use crate::config::Config;
use rm_runner::package::{self, Inspection, latest, release::Platform};
use rm_runner::store::redirect::{self, Unfit};

/// What was found about the package: it fits (and the store digest it will have), it does not
/// (and why), or it could not be judged (and why).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    Fits { digest: String },
    Unfit(Unfit),
    Unjudged(String),
}

/// Which package runners would start from, and how a reader names it (the `image` finding
/// judges images against it too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Package {
    /// An unpacked package: its name (`runner 2.330.0`, `the runner at DIR`) and directory.
    At { runner: String, dir: PathBuf },
    /// None on this host yet: what `run` will do.
    NotYet(String),
}

pub(super) async fn cache(config: &Config) -> Option<Finding> {
    let policies: Vec<&str> = config
        .policies
        .iter()
        .filter(|p| p.cache)
        .map(|p| p.name.as_str())
        .collect();
    if policies.is_empty() {
        return None;
    }
    let package = which_package(config).await?;
    let judged = match &package {
        Package::At { dir, .. } => {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || judge(&dir))
                .await
                .unwrap_or_else(|e| Judged::Unjudged(e.to_string()))
        }
        Package::NotYet(_) => Judged::Unjudged(String::new()),
    };
    Some(of(&policies, &package, &judged))
}

/// The package `run` would start runners from, without downloading or storing anything;
/// `None` where the `runner_package` finding already fails (there is nothing to judge).
pub(super) async fn which_package(config: &Config) -> Option<Package> {
    if crate::package::follows_latest(config) {
        let cached = Platform::host().and_then(|p| latest::newest_cached(&config.data_dir, p));
        return Some(match cached {
            Some((version, dir)) => Package::At {
                runner: format!("runner {version} (the newest cached; \"latest\" may move on)"),
                dir,
            },
            None => Package::NotYet(
                "runner.version = \"latest\" and nothing is cached yet: each release is judged when `rm-agent run` stores it".into(),
            ),
        });
    }
    if let Some(wanted) = crate::package::wanted(config) {
        let wanted = wanted.ok()?;
        return match package::inspect(&wanted).await.ok()? {
            Inspection::Cached(cached) => Some(Package::At {
                runner: format!("runner {}", wanted.version),
                dir: cached.dir,
            }),
            Inspection::WouldDownload(_) => Some(Package::NotYet(format!(
                "runner {} is not downloaded yet: it is judged when `rm-agent run` stores it",
                wanted.version
            ))),
        };
    }
    let dir = config.runner.package_dir.clone()?;
    Some(Package::At {
        runner: format!("the runner at {}", dir.display()),
        dir,
    })
}

/// The rule applied to the package at `dir`, and the digest it will be stored under.
/// Blocking: the digest hashes every file, as `run` does when it stores the package.
fn judge(dir: &Path) -> Judged {
    if let Err(unfit) = redirect::source_fits(dir) {
        return Judged::Unfit(unfit);
    }
    match rm_runner::store::redirect::source_digest(dir) {
        Ok(digest) => Judged::Fits { digest },
        Err(e) => Judged::Unjudged(e.to_string()),
    }
}

/// The finding for what was judged. Pure.
fn of(policies: &[&str], package: &Package, judged: &Judged) -> Finding {
    let for_policies = format!("(policy {})", policies.join(", "));
    let runner = match package {
        Package::At { runner, .. } => runner,
        Package::NotYet(what) => return Finding::ok("cache", format!("{what} {for_policies}")),
    };
    match judged {
        Judged::Fits { digest } => Finding::ok(
            "cache",
            format!(
                "caching active for {runner} (package {}) {for_policies}",
                redirect::short(digest)
            ),
        ),
        Judged::Unfit(unfit) => Finding::warn(
            "cache",
            format!(
                "{runner} does not fit the cache redirect: {unfit}; its jobs run uncached {for_policies}"
            ),
            "run a runner release the redirect fits, or set cache = false on the policy; the jobs run either way, uncached",
        ),
        Judged::Unjudged(why) => Finding::warn(
            "cache",
            format!("cannot judge {runner} for the cache redirect: {why} {for_policies}"),
            "make the runner package readable by the agent; until it is judged fit its jobs run uncached",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::check::Status;

    fn at() -> Package {
        Package::At {
            runner: "runner 2.336.0".into(),
            dir: "/var/lib/rm-agent/packages/actions-runner-linux-x64-2.336.0".into(),
        }
    }

    #[test]
    fn each_judgement_is_its_finding() {
        let digest = "0123456789abcdef".repeat(4);
        let unfit = Unfit::Count {
            file: redirect::WORKER_DLL,
            string: "ACTIONS_CACHE_URL",
            found: 2,
            expected: 1,
        };
        let cases: Vec<(Package, Judged, Status, Vec<&str>)> = vec![
            (
                at(),
                Judged::Fits { digest },
                Status::Ok,
                vec![
                    "caching active for runner 2.336.0 (package 0123456789ab)",
                    "(policy ci, big)",
                ],
            ),
            (
                at(),
                Judged::Unfit(unfit),
                Status::Warn,
                vec![
                    "runner 2.336.0 does not fit the cache redirect",
                    "bin/Runner.Worker.dll holds the string literal ACTIONS_CACHE_URL 2 time(s)",
                    "its jobs run uncached",
                ],
            ),
            (
                at(),
                Judged::Unjudged("permission denied".into()),
                Status::Warn,
                vec!["cannot judge runner 2.336.0", "permission denied"],
            ),
            (
                Package::NotYet("runner 2.336.0 is not downloaded yet".into()),
                Judged::Unjudged(String::new()),
                Status::Ok,
                vec!["runner 2.336.0 is not downloaded yet", "(policy ci, big)"],
            ),
        ];
        for (package, judged, status, words) in cases {
            let finding = of(&["ci", "big"], &package, &judged);
            assert_eq!(finding.status, status, "{judged:?}");
            assert_eq!(finding.check, "cache");
            assert_eq!(
                finding.remedy.is_empty(),
                status == Status::Ok,
                "{finding:?}"
            );
            for word in words {
                assert!(finding.what.contains(word), "{word}: {}", finding.what);
            }
        }
    }

    /// The judgement of an unpacked package on disk: one carrying the literals once fits and
    /// is named by the digest the store gives it; one without the worker does not.
    #[test]
    fn a_package_on_disk_is_judged_by_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("package");
        std::fs::create_dir_all(package.join("bin")).unwrap();
        assert_eq!(
            judge(&package),
            Judged::Unfit(Unfit::Missing {
                file: redirect::WORKER_DLL
            })
        );
        let mut dll = b"MZ".to_vec();
        for name in ["ACTIONS_RESULTS_URL", "ACTIONS_CACHE_URL"] {
            dll.push(u8::try_from(name.len() * 2 + 1).unwrap());
            dll.extend(name.encode_utf16().flat_map(u16::to_le_bytes));
            dll.push(0);
        }
        std::fs::write(package.join(redirect::WORKER_DLL), &dll).unwrap();
        let root = dir.path().join("root");
        let stored = rm_runner::store::Store::open(&root)
            .unwrap()
            .install(&package)
            .unwrap();
        assert_eq!(
            judge(&package),
            Judged::Fits {
                digest: stored.digest()
            }
        );
    }
}
