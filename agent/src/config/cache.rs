//! `[cache]` as written and validated: where the host-local cache service (`rm_cache`) keeps its
//! entries, the host port runners reach it at, its bounds, where the calls it does not serve go,
//! and the actions it keeps on the host. `policy.cache = true` turns it on for a policy's runners
//! (checked in `validate`, beside the policy's other keys).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::duration::ConfigDuration;
use super::fitness::parse_size;

/// `cache.port` unless written: the host loopback port the service listens on and runners reach
/// at `127.0.0.1:PORT` through their network's host-port path.
pub const DEFAULT_PORT: u16 = 8736;

/// `cache.max_size` unless written: the whole cache's bytes on disk. Twice GitHub's 10 GB per
/// repository, so two busy repositories share a host without evicting each other at once.
pub const DEFAULT_MAX_SIZE: u64 = 20 << 30;

/// `cache.max_age` unless written: an entry not used for this long goes, as GitHub evicts an
/// entry not accessed in 7 days.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// `cache.repository_quota` unless written: GitHub's own limit per repository (10 GB).
pub const DEFAULT_REPOSITORY_QUOTA: u64 = 10 << 30;

/// The least `cache.max_size`: one 64 MiB entry and room to replace it.
pub const MIN_MAX_SIZE: u64 = 256 << 20;

/// The least `cache.max_age`: shorter would evict an entry between a job's save and the next
/// job's restore.
pub const MIN_MAX_AGE: Duration = Duration::from_secs(3600);

/// `cache.upstream` unless written: GitHub.com's results service, where the runner's own
/// `ACTIONS_RESULTS_URL` points (artifacts and every call the local service does not serve go
/// there unchanged).
pub const DEFAULT_UPSTREAM: &str = "https://results-receiver.actions.githubusercontent.com/";

/// `[cache]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    pub dir: Option<PathBuf>,
    pub port: Option<u16>,
    pub max_size: Option<String>,
    pub max_age: Option<ConfigDuration>,
    pub repository_quota: Option<String>,
    pub upstream: Option<String>,
    pub actions: Option<Vec<String>>,
}

/// `[cache]` validated, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// Entries, their index and the action archives (`<dir>/actions`).
    pub dir: PathBuf,
    pub port: u16,
    pub max_size: u64,
    pub max_age: Duration,
    pub repository_quota: u64,
    /// An `http://` or `https://` URL ending in `/`.
    pub upstream: String,
    /// `owner/repo@ref` each, kept on the host and served to runners as archives.
    pub actions: Vec<String>,
}

/// Validates `[cache]`; the error names the key and why.
pub fn validate(section: CacheSection, data_dir: &Path) -> Result<Cache, (&'static str, String)> {
    let size = |key: &'static str, text: &Option<String>, default: u64| match text {
        None => Ok(default),
        Some(text) => parse_size(text).ok_or_else(|| {
            (
                key,
                format!("`{text}` is not a size; write it like \"20GiB\" or \"500MiB\""),
            )
        }),
    };
    let max_size = size("cache.max_size", &section.max_size, DEFAULT_MAX_SIZE)?;
    if max_size < MIN_MAX_SIZE {
        return Err((
            "cache.max_size",
            "must be at least \"256MiB\"; to cache nothing, leave `cache` off every policy"
                .to_owned(),
        ));
    }
    let repository_quota = size(
        "cache.repository_quota",
        &section.repository_quota,
        DEFAULT_REPOSITORY_QUOTA.min(max_size),
    )?;
    if repository_quota == 0 || repository_quota > max_size {
        return Err((
            "cache.repository_quota",
            format!("must be more than 0 and at most `max_size` ({max_size} bytes)"),
        ));
    }
    let max_age = section.max_age.map_or(DEFAULT_MAX_AGE, |d| d.0);
    if max_age < MIN_MAX_AGE {
        return Err(("cache.max_age", "must be at least \"1h\"".to_owned()));
    }
    let port = section.port.unwrap_or(DEFAULT_PORT);
    if port == 0 {
        return Err(("cache.port", "0 is not a port".to_owned()));
    }
    let upstream = section
        .upstream
        .unwrap_or_else(|| DEFAULT_UPSTREAM.to_owned());
    if !(upstream.starts_with("https://") || upstream.starts_with("http://"))
        || !upstream.ends_with('/')
        || upstream.parse::<http::Uri>().is_err()
    {
        return Err((
            "cache.upstream",
            format!(
                "`{upstream}` is not an http(s) URL ending in `/`; GitHub.com's is \"{DEFAULT_UPSTREAM}\""
            ),
        ));
    }
    let dir = section.dir.unwrap_or_else(|| data_dir.join("cache"));
    if !dir.is_absolute() {
        return Err((
            "cache.dir",
            format!("`{}` must be an absolute directory", dir.display()),
        ));
    }
    let actions = section.actions.unwrap_or_default();
    rm_cache::actions::parse_actions(&actions)
        .map_err(|problem| ("cache.actions", problem.to_string()))?;
    Ok(Cache {
        dir,
        port,
        max_size,
        max_age,
        repository_quota,
        upstream,
        actions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> CacheSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_and_refusals() {
        let data = Path::new("/var/lib/rm-agent");
        let cache = validate(section(""), data).unwrap();
        assert_eq!(cache.dir, data.join("cache"));
        assert_eq!(cache.port, DEFAULT_PORT);
        assert_eq!(cache.max_size, DEFAULT_MAX_SIZE);
        assert_eq!(cache.repository_quota, DEFAULT_REPOSITORY_QUOTA);
        assert_eq!(cache.max_age, DEFAULT_MAX_AGE);
        assert_eq!(cache.upstream, DEFAULT_UPSTREAM);
        // A cache smaller than GitHub's quota takes its own size as the quota.
        let small = validate(section("max_size = \"1GiB\""), data).unwrap();
        assert_eq!(small.repository_quota, 1 << 30);
        for (text, key) in [
            ("max_size = \"1MiB\"", "cache.max_size"),
            ("max_size = \"lots\"", "cache.max_size"),
            (
                "max_size = \"1GiB\"\nrepository_quota = \"2GiB\"",
                "cache.repository_quota",
            ),
            ("repository_quota = \"0\"", "cache.repository_quota"),
            ("max_age = \"5m\"", "cache.max_age"),
            ("port = 0", "cache.port"),
            ("upstream = \"ftp://x/\"", "cache.upstream"),
            ("upstream = \"https://results.example\"", "cache.upstream"),
            ("dir = \"cache\"", "cache.dir"),
            ("actions = [\"checkout\"]", "cache.actions"),
        ] {
            let refused = validate(section(text), data).unwrap_err();
            assert_eq!(refused.0, key, "{text}: {refused:?}");
        }
    }
}
