//! Platform, asset and checksum selection against release metadata shaped like actions/runner's.

use super::*;

const V: &str = "2.330.0";

/// A checksum made of one repeated hex digit, easy to tell apart in a failure.
fn sha(digit: char) -> String {
    std::iter::repeat_n(digit, 64).collect()
}

/// Release notes in the layout actions/runner's release template (`releaseNote.md`) produces:
/// the install snippets, then a SHA-256 line per package with the `_noexternals` and
/// `_noruntime` variants under their own keys, plus a stray hex string elsewhere in the notes.
fn notes() -> String {
    let mut body = String::from(
        "## What's Changed\n* Bump docker version (commit 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef)\n\n\
         ## Linux x64\n\n``` bash\n# Create a folder\nmkdir actions-runner && cd actions-runner\n\
         # Download the latest runner package\ncurl -O -L https://github.com/actions/runner/releases/download/v2.330.0/actions-runner-linux-x64-2.330.0.tar.gz\n```\n\n\
         ## SHA-256 Checksums\n\nThe SHA-256 checksums for the packages included in this build are shown below:\n\n",
    );
    let lines = [
        ("win-x64", ".zip", '1'),
        ("osx-x64", ".tar.gz", '2'),
        ("osx-arm64", ".tar.gz", '3'),
        ("linux-x64", ".tar.gz", 'a'),
        ("linux-arm64", ".tar.gz", 'b'),
        ("linux-arm", ".tar.gz", 'c'),
    ];
    for (key, ext, digit) in lines {
        body.push_str(&format!(
            "- actions-runner-{key}-{V}{ext} <!-- BEGIN SHA {key} -->{}<!-- END SHA {key} -->\n",
            sha(digit)
        ));
    }
    body.push('\n');
    for (key, ext, _) in lines {
        body.push_str(&format!(
            "- actions-runner-{key}-{V}-noexternals{ext} <!-- BEGIN SHA {key}_noexternals -->{}<!-- END SHA {key}_noexternals -->\n",
            sha('e')
        ));
    }
    body
}

fn asset(name: &str, digest: Option<&str>) -> Asset {
    Asset {
        name: name.to_owned(),
        size: 123,
        browser_download_url: format!(
            "https://github.com/actions/runner/releases/download/v{V}/{name}"
        ),
        digest: digest.map(str::to_owned),
    }
}

fn release(assets: Vec<Asset>, body: Option<String>) -> Release {
    Release {
        tag_name: format!("v{V}"),
        body,
        assets,
    }
}

const LINUX_X64: Platform = Platform {
    os: "linux",
    arch: "x64",
};

#[test]
fn platforms_follow_the_published_names() {
    assert_eq!(Platform::of("linux", "x86_64"), Some(LINUX_X64));
    assert_eq!(
        Platform::of("linux", "aarch64")
            .map(Platform::key)
            .as_deref(),
        Some("linux-arm64")
    );
    assert_eq!(
        Platform::of("linux", "arm").map(Platform::key).as_deref(),
        Some("linux-arm")
    );
    assert_eq!(
        Platform::of("macos", "aarch64")
            .map(Platform::key)
            .as_deref(),
        Some("osx-arm64")
    );
    assert_eq!(
        Platform::of("macos", "x86_64")
            .map(Platform::key)
            .as_deref(),
        Some("osx-x64")
    );
    assert_eq!(Platform::of("macos", "arm"), None);
    assert_eq!(Platform::of("windows", "x86_64"), None);
    assert_eq!(Platform::of("linux", "riscv64"), None);
    assert_eq!(
        asset_name(LINUX_X64, V),
        "actions-runner-linux-x64-2.330.0.tar.gz"
    );
}

#[test]
fn the_asset_digest_is_preferred() {
    let digest = format!("sha256:{}", sha('a').to_uppercase());
    let r = release(
        vec![
            asset(
                "actions-runner-linux-arm64-2.330.0.tar.gz",
                Some("sha256:x"),
            ),
            asset("actions-runner-linux-x64-2.330.0.tar.gz", Some(&digest)),
        ],
        Some(notes()),
    );
    let chosen = select(&r, LINUX_X64, V).unwrap();
    assert_eq!(chosen.asset.name, "actions-runner-linux-x64-2.330.0.tar.gz");
    assert_eq!(chosen.sha256, sha('a'), "lower-cased");
    assert_eq!(chosen.source, ChecksumSource::AssetDigest);
}

#[test]
fn without_a_digest_the_release_notes_markers_are_read() {
    let r = release(
        vec![asset("actions-runner-linux-x64-2.330.0.tar.gz", None)],
        Some(notes()),
    );
    let chosen = select(&r, LINUX_X64, V).unwrap();
    assert_eq!(chosen.sha256, sha('a'), "not the _noexternals value");
    assert_eq!(chosen.source, ChecksumSource::ReleaseNotes);

    let arm = Platform::of("linux", "arm").unwrap();
    let r = release(
        vec![asset("actions-runner-linux-arm-2.330.0.tar.gz", None)],
        Some(notes()),
    );
    assert_eq!(
        select(&r, arm, V).unwrap().sha256,
        sha('c'),
        "linux-arm is not linux-arm64"
    );
}

#[test]
fn a_digest_of_another_algorithm_falls_back_to_the_notes() {
    let r = release(
        vec![asset(
            "actions-runner-linux-x64-2.330.0.tar.gz",
            Some(&format!("sha512:{}", sha('f'))),
        )],
        Some(notes()),
    );
    let chosen = select(&r, LINUX_X64, V).unwrap();
    assert_eq!(chosen.source, ChecksumSource::ReleaseNotes);
}

#[test]
fn no_checksum_anywhere_is_refused() {
    let r = release(
        vec![asset("actions-runner-linux-x64-2.330.0.tar.gz", None)],
        Some("## What's Changed\n* nothing\n".to_owned()),
    );
    assert!(matches!(
        select(&r, LINUX_X64, V),
        Err(SelectError::NoChecksum { .. })
    ));
    let r = release(
        vec![asset("actions-runner-linux-x64-2.330.0.tar.gz", None)],
        None,
    );
    assert!(matches!(
        select(&r, LINUX_X64, V),
        Err(SelectError::NoChecksum { .. })
    ));
    // A marker with something other than 64 hex digits in it is no checksum.
    let broken = "<!-- BEGIN SHA linux-x64 -->abc<!-- END SHA linux-x64 -->";
    assert_eq!(notes_sha256(broken, "linux-x64"), None);
    assert_eq!(notes_sha256(&notes(), "linux-s390x"), None);
}

#[test]
fn disagreeing_checksums_are_refused() {
    let r = release(
        vec![asset(
            "actions-runner-linux-x64-2.330.0.tar.gz",
            Some(&format!("sha256:{}", sha('d'))),
        )],
        Some(notes()),
    );
    let err = select(&r, LINUX_X64, V).unwrap_err();
    assert!(matches!(err, SelectError::ChecksumConflict { .. }), "{err}");
}

#[test]
fn a_missing_asset_names_what_the_release_has() {
    let r = release(
        vec![
            asset("actions-runner-osx-x64-2.330.0.tar.gz", None),
            asset("actions-runner-win-x64-2.330.0.zip", None),
        ],
        Some(notes()),
    );
    let err = select(&r, LINUX_X64, V).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("actions-runner-linux-x64-2.330.0.tar.gz"),
        "{text}"
    );
    assert!(
        text.contains("actions-runner-osx-x64-2.330.0.tar.gz"),
        "{text}"
    );
    assert!(!text.contains(".zip"), "{text}");
}

#[test]
fn digests_are_parsed_strictly() {
    assert_eq!(
        digest_sha256(&format!("sha256:{}", sha('0'))),
        Some(sha('0'))
    );
    assert_eq!(digest_sha256(&sha('0')), None, "no algorithm");
    assert_eq!(digest_sha256("sha256:"), None);
    assert_eq!(digest_sha256(&format!("sha256:{}", &sha('0')[1..])), None);
    assert_eq!(digest_sha256(&format!("sha256:{}g", &sha('0')[1..])), None);
}

#[test]
fn release_metadata_parses_as_github_sends_it() {
    let json = serde_json::json!({
        "url": "https://api.github.com/repos/actions/runner/releases/1",
        "tag_name": "v2.330.0",
        "name": "v2.330.0",
        "body": notes(),
        "assets": [{
            "url": "https://api.github.com/repos/actions/runner/releases/assets/2",
            "id": 2,
            "name": "actions-runner-linux-x64-2.330.0.tar.gz",
            "label": "",
            "content_type": "application/octet-stream",
            "state": "uploaded",
            "size": 219_000_000u64,
            "digest": null,
            "download_count": 5,
            "browser_download_url": "https://github.com/actions/runner/releases/download/v2.330.0/actions-runner-linux-x64-2.330.0.tar.gz"
        }]
    });
    let r: Release = serde_json::from_value(json).unwrap();
    assert_eq!(r.assets[0].digest, None);
    assert_eq!(
        select(&r, LINUX_X64, V).unwrap().source,
        ChecksumSource::ReleaseNotes
    );
}
