//! actions/runner releases on the fake: `GET /repos/actions/runner/releases/tags/v{version}`
//! (public, like GitHub's: no credential needed) with an asset per platform, its `digest` and
//! the release notes' `<!-- BEGIN SHA … -->` checksums, and the asset download, which answers
//! like github.com: a redirect from `/actions/runner/releases/download/…` to a signed
//! object-storage URL that serves the bytes. Options leave the digest out, leave the notes'
//! checksums out, serve corrupted bytes, or mark the release a prerelease.
//!
//! `GET /repos/actions/runner/releases/latest` and `GET .../releases` are REST endpoints like
//! the others (authenticated, counted, ETag and `304`: see [`crate::routes`]); their answers
//! come from here: the latest is, as GitHub documents it, the most recent release that is
//! neither a draft nor a prerelease, sorted by `created_at`; the list is newest first.

use std::collections::BTreeMap;
use std::time::SystemTime;

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::RequestRecord;
use crate::state::State;

/// The platforms actions/runner publishes a `.tar.gz` for; the fake serves the same bytes for
/// each.
pub const PLATFORMS: [&str; 5] = [
    "linux-x64",
    "linux-arm64",
    "linux-arm",
    "osx-x64",
    "osx-arm64",
];
/// Where the fake's "object storage" serves asset bytes (github.com redirects to
/// `release-assets.githubusercontent.com`).
pub const ASSET_STORAGE_PREFIX: &str = "/_release-assets/";
/// The download path below the server root, as on github.com.
pub const DOWNLOAD_PREFIX: &str = "/actions/runner/releases/download/";

/// How a release is published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseOptions {
    /// Assets carry `"digest": null`, as those uploaded before GitHub computed digests do.
    pub omit_digest: bool,
    /// The release notes have no checksum markers.
    pub omit_notes_checksums: bool,
    /// The download serves the bytes with one of them changed; the published checksums stay
    /// those of the real bytes.
    pub corrupt: bool,
    /// A prerelease: listed, never the latest.
    pub prerelease: bool,
}

/// One published release.
#[derive(Debug, Clone)]
pub struct FakeRelease {
    pub id: u64,
    pub version: String,
    /// The bytes the checksums are of.
    pub bytes: Bytes,
    /// The bytes the download serves.
    pub served: Bytes,
    pub sha256: String,
    pub options: ReleaseOptions,
    /// When it was published (the fake's clock); also its `created_at`.
    pub published_at: SystemTime,
}

/// Every published release by version, and the signature the storage URLs carry.
#[derive(Debug, Clone, Default)]
pub struct Releases {
    pub by_version: BTreeMap<String, FakeRelease>,
}

impl Releases {
    pub fn publish(
        &mut self,
        id: u64,
        version: &str,
        bytes: Vec<u8>,
        options: ReleaseOptions,
        published_at: SystemTime,
    ) {
        let bytes = Bytes::from(bytes);
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let served = if options.corrupt {
            let mut changed = bytes.to_vec();
            let middle = changed.len() / 2;
            if let Some(b) = changed.get_mut(middle) {
                *b ^= 0xff;
            }
            Bytes::from(changed)
        } else {
            bytes.clone()
        };
        self.by_version.insert(
            version.to_owned(),
            FakeRelease {
                id,
                version: version.to_owned(),
                bytes,
                served,
                sha256,
                options,
                published_at,
            },
        );
    }

    /// Newest first (by `created_at`, then id), as `GET .../releases` lists them.
    pub fn newest_first(&self) -> Vec<&FakeRelease> {
        let mut all: Vec<&FakeRelease> = self.by_version.values().collect();
        all.sort_by_key(|r| std::cmp::Reverse((r.published_at, r.id)));
        all
    }

    /// What `GET .../releases/latest` answers: the newest that is not a prerelease.
    pub fn latest(&self) -> Option<&FakeRelease> {
        self.newest_first()
            .into_iter()
            .find(|r| !r.options.prerelease)
    }
}

/// `actions-runner-linux-x64-2.330.0.tar.gz`.
pub fn asset_name(platform: &str, version: &str) -> String {
    format!("actions-runner-{platform}-{version}.tar.gz")
}

/// Release notes laid out as actions/runner's release template makes them.
pub fn notes(release: &FakeRelease) -> String {
    let v = &release.version;
    let mut body = format!(
        "## What's Changed\n* Fake release for tests\n\n## Linux x64\n\n``` bash\nmkdir actions-runner && cd actions-runner\n\
         curl -O -L https://github.com/actions/runner/releases/download/v{v}/actions-runner-linux-x64-{v}.tar.gz\n\
         tar xzf ./actions-runner-linux-x64-{v}.tar.gz\n```\n"
    );
    if !release.options.omit_notes_checksums {
        body.push_str("\n## SHA-256 Checksums\n\nThe SHA-256 checksums for the packages included in this build are shown below:\n\n");
        for p in PLATFORMS {
            body.push_str(&format!(
                "- {} <!-- BEGIN SHA {p} -->{}<!-- END SHA {p} -->\n",
                asset_name(p, v),
                release.sha256
            ));
        }
    }
    body
}

/// The release as `GET /repos/{owner}/{repo}/releases/tags/{tag}` answers it.
pub fn release_json(state: &State, release: &FakeRelease) -> Value {
    let v = &release.version;
    let assets: Vec<Value> = PLATFORMS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = asset_name(p, v);
            json!({
                "url": format!("{}/repos/actions/runner/releases/assets/{}", state.api_url, release.id * 10 + i as u64),
                "id": release.id * 10 + i as u64,
                "name": name,
                "label": "",
                "content_type": "application/octet-stream",
                "state": "uploaded",
                "size": release.bytes.len(),
                "digest": if release.options.omit_digest { Value::Null } else { json!(format!("sha256:{}", release.sha256)) },
                "download_count": 0,
                "node_id": format!("RA_fake{}", release.id * 10 + i as u64),
                "uploader": crate::render::user(&state.ctx(), "github-actions[bot]", 41898282, "Bot"),
                "created_at": crate::time::rfc3339(release.published_at),
                "updated_at": crate::time::rfc3339(release.published_at),
                "browser_download_url": format!("{}{DOWNLOAD_PREFIX}v{v}/{name}", state.server_url),
            })
        })
        .collect();
    json!({
        "url": format!("{}/repos/actions/runner/releases/{}", state.api_url, release.id),
        "html_url": format!("{}/actions/runner/releases/tag/v{v}", state.server_url),
        "id": release.id,
        "tag_name": format!("v{v}"),
        "target_commitish": "main",
        "assets_url": format!("{}/repos/actions/runner/releases/{}/assets", state.api_url, release.id),
        "upload_url": format!("https://uploads.github.com/repos/actions/runner/releases/{}/assets{{?name,label}}", release.id),
        "tarball_url": format!("{}/repos/actions/runner/tarball/v{v}", state.api_url),
        "zipball_url": format!("{}/repos/actions/runner/zipball/v{v}", state.api_url),
        "node_id": format!("RE_fake{}", release.id),
        "author": crate::render::user(&state.ctx(), "github-actions[bot]", 41898282, "Bot"),
        "name": format!("v{v}"),
        "draft": false,
        "prerelease": release.options.prerelease,
        "created_at": crate::time::rfc3339(release.published_at),
        "published_at": crate::time::rfc3339(release.published_at),
        "body": notes(release),
        "assets": assets,
    })
}

/// A raw answer (bytes, not JSON).
#[derive(Debug, Clone)]
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Raw {
    fn json(status: u16, value: &Value) -> Raw {
        Raw {
            status,
            headers: vec![(
                "content-type".into(),
                "application/json; charset=utf-8".into(),
            )],
            body: Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
        }
    }

    fn not_found() -> Raw {
        Raw::json(
            404,
            &json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest", "status": "404"}),
        )
    }
}

/// The answer to a release request (`path` from the server root), recorded in the request log;
/// `None` when the request is not one.
pub fn answer(state: &mut State, method: &str, path: &str, query: &str) -> Option<Raw> {
    let api_path = path
        .strip_prefix(state.base_path.as_str())
        .and_then(|rel| rel.strip_prefix("/repos/actions/runner/releases/tags/v"));
    let raw = if let Some(version) = api_path {
        match state.releases.by_version.get(version) {
            Some(release) if method == "GET" => Raw::json(200, &release_json(state, release)),
            _ => Raw::not_found(),
        }
    } else if let Some(rest) = path.strip_prefix(DOWNLOAD_PREFIX) {
        download_redirect(state, rest)
    } else if let Some(rest) = path.strip_prefix(ASSET_STORAGE_PREFIX) {
        storage(state, rest, query)
    } else {
        return None;
    };
    let record_path = path
        .strip_prefix(state.base_path.as_str())
        .filter(|_| api_path.is_some())
        .unwrap_or(path)
        .to_owned();
    state.requests.push(RequestRecord {
        method: method.to_owned(),
        path: record_path,
        query: query.to_owned(),
        status: raw.status,
        headers: Vec::new(),
        body: None,
        response_body: None,
        response_headers: raw.headers.clone(),
        caller: None,
        at: state.now(),
    });
    Some(raw)
}

/// The signature a storage URL of `release` must carry.
fn signature(release: &FakeRelease, name: &str) -> String {
    hex::encode(&Sha256::digest(format!("{}/{name}/{}", release.id, release.sha256))[..8])
}

/// `v{version}/{name}` → `302` to the storage URL, as github.com answers.
fn download_redirect(state: &State, rest: &str) -> Raw {
    let Some((tag, name)) = rest.split_once('/') else {
        return Raw::not_found();
    };
    let Some(release) = tag
        .strip_prefix('v')
        .and_then(|v| state.releases.by_version.get(v))
    else {
        return Raw::not_found();
    };
    if !PLATFORMS
        .iter()
        .any(|p| asset_name(p, &release.version) == name)
    {
        return Raw::not_found();
    }
    let location = format!(
        "{}{ASSET_STORAGE_PREFIX}{}/{name}?sig={}",
        state.server_url,
        release.version,
        signature(release, name)
    );
    Raw {
        status: 302,
        headers: vec![("location".into(), location)],
        body: Bytes::new(),
    }
}

/// `{version}/{name}?sig=…` → the bytes, when the signature is the one the redirect gave.
fn storage(state: &State, rest: &str, query: &str) -> Raw {
    let found = rest
        .split_once('/')
        .and_then(|(version, name)| Some((state.releases.by_version.get(version)?, name)));
    let Some((release, name)) = found else {
        return Raw::not_found();
    };
    let signed = query
        .split('&')
        .any(|kv| kv == format!("sig={}", signature(release, name)));
    if !signed {
        return Raw {
            status: 403,
            headers: vec![("content-type".into(), "application/xml".into())],
            body: Bytes::from_static(b"<Error><Code>AuthenticationFailed</Code></Error>"),
        };
    }
    Raw {
        status: 200,
        headers: vec![
            ("content-type".into(), "application/octet-stream".into()),
            (
                "content-disposition".into(),
                format!("attachment; filename={name}"),
            ),
        ],
        body: release.served.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(options: ReleaseOptions) -> State {
        let mut state = State::new(1, String::new(), "http://127.0.0.1:9".into(), String::new());
        state.releases.publish(
            7,
            "2.330.0",
            b"package bytes".to_vec(),
            options,
            state.now(),
        );
        state
    }

    #[test]
    fn the_release_lists_every_platform_with_its_digest_and_notes() {
        let mut state = state_with(ReleaseOptions::default());
        let raw = answer(
            &mut state,
            "GET",
            "/repos/actions/runner/releases/tags/v2.330.0",
            "",
        )
        .unwrap();
        assert_eq!(raw.status, 200);
        let v: Value = serde_json::from_slice(&raw.body).unwrap();
        let sha = hex::encode(Sha256::digest(b"package bytes"));
        assert_eq!(v["assets"].as_array().unwrap().len(), PLATFORMS.len());
        assert_eq!(v["assets"][0]["digest"], json!(format!("sha256:{sha}")));
        assert_eq!(v["assets"][0]["size"], json!(13));
        assert!(v["body"].as_str().unwrap().contains(&format!(
            "<!-- BEGIN SHA linux-x64 -->{sha}<!-- END SHA linux-x64 -->"
        )));
        assert_eq!(state.requests.len(), 1);
        let missing = answer(
            &mut state,
            "GET",
            "/repos/actions/runner/releases/tags/v9.9.9",
            "",
        )
        .unwrap();
        assert_eq!(missing.status, 404);
        assert!(answer(&mut state, "GET", "/app", "").is_none());
    }

    #[test]
    fn the_latest_is_the_newest_release_that_is_not_a_prerelease() {
        let mut state = state_with(ReleaseOptions::default());
        let later = state.now() + std::time::Duration::from_secs(60);
        let pre = ReleaseOptions {
            prerelease: true,
            ..ReleaseOptions::default()
        };
        state
            .releases
            .publish(9, "2.332.0", b"pre".to_vec(), pre, later);
        assert_eq!(
            state.releases.latest().map(|r| r.version.as_str()),
            Some("2.330.0")
        );
        // Published later, though released under a lower id: `created_at` decides.
        state.releases.publish(
            3,
            "2.331.0",
            b"next".to_vec(),
            ReleaseOptions::default(),
            later,
        );
        assert_eq!(
            state.releases.latest().map(|r| r.version.as_str()),
            Some("2.331.0")
        );
        let listed: Vec<&str> = state
            .releases
            .newest_first()
            .iter()
            .map(|r| r.version.as_str())
            .collect();
        assert_eq!(listed, ["2.332.0", "2.331.0", "2.330.0"]);
        let v = release_json(&state, &state.releases.by_version["2.332.0"]);
        assert_eq!(v["prerelease"], json!(true));
        assert_eq!(v["created_at"], v["published_at"]);
    }

    #[test]
    fn options_drop_the_digest_or_the_notes_checksums() {
        let state = state_with(ReleaseOptions {
            omit_digest: true,
            omit_notes_checksums: true,
            ..ReleaseOptions::default()
        });
        let release = &state.releases.by_version["2.330.0"];
        let v = release_json(&state, release);
        assert_eq!(v["assets"][0]["digest"], Value::Null);
        assert!(!v["body"].as_str().unwrap().contains("BEGIN SHA"));
    }

    #[test]
    fn a_download_redirects_to_signed_storage_that_serves_the_bytes() {
        let mut state = state_with(ReleaseOptions {
            corrupt: true,
            ..ReleaseOptions::default()
        });
        let name = "actions-runner-linux-x64-2.330.0.tar.gz";
        let hop = answer(
            &mut state,
            "GET",
            &format!("{DOWNLOAD_PREFIX}v2.330.0/{name}"),
            "",
        )
        .unwrap();
        assert_eq!(hop.status, 302);
        let location = &hop.headers[0].1;
        let (path, query) = location
            .strip_prefix("http://127.0.0.1:9")
            .unwrap()
            .split_once('?')
            .unwrap();
        let served = answer(&mut state, "GET", path, query).unwrap();
        assert_eq!(served.status, 200);
        assert_eq!(served.body.len(), 13);
        assert_ne!(&served.body[..], b"package bytes", "corrupted");
        let unsigned = answer(&mut state, "GET", path, "sig=0000").unwrap();
        assert_eq!(unsigned.status, 403);
        let other = answer(
            &mut state,
            "GET",
            &format!("{DOWNLOAD_PREFIX}v2.330.0/x.zip"),
            "",
        )
        .unwrap();
        assert_eq!(other.status, 404);
    }
}
