//! The whole resolution against the fake GitHub over real HTTP: metadata, the redirect to
//! signed storage, verification, unpacking and the cache, and each refusal.

use std::io::Write as _;

use rm_fake_github::{FakeGithub, FakeOptions, ReleaseOptions};

use super::*;

const VERSION: &str = "2.330.0";
const LINUX_X64: Platform = Platform {
    os: "linux",
    arch: "x64",
};

/// What the download loop told the sink.
#[derive(Debug, Default)]
struct Recorder {
    total: Option<Option<u64>>,
    positions: Vec<u64>,
    finished: bool,
}

impl Progress for Recorder {
    fn begin(&mut self, total: Option<u64>) {
        self.total = Some(total);
    }
    fn advance(&mut self, done: u64) {
        self.positions.push(done);
    }
    fn finish(&mut self) {
        self.finished = true;
    }
}

/// A runner-like package as a `.tar.gz`, entries under `./` as actions/runner's are, padded
/// with incompressible bytes so the download takes several chunks.
fn tarball(extra_top_level: Option<&str>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bin")).unwrap();
    std::fs::write(dir.path().join(LISTENER), b"#!/bin/sh\nexit 0\n").unwrap();
    let noise: Vec<u8> = (0..400_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.path().join("bin").join("blob"), noise).unwrap();
    if let Some(name) = extra_top_level {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    {
        let mut tar = tar::Builder::new(&mut gz);
        tar.append_dir_all(".", dir.path()).unwrap();
        tar.finish().unwrap();
    }
    gz.flush().unwrap();
    gz.finish().unwrap()
}

async fn fake() -> FakeGithub {
    // The releases endpoints take no credential, so no App key is needed.
    FakeGithub::start(FakeOptions::new(1, String::new()))
        .await
        .unwrap()
}

fn wanted(fake: &FakeGithub, data: &Path) -> Wanted {
    Wanted {
        api_url: fake.api_url(),
        data_dir: data.to_path_buf(),
        version: VERSION.to_owned(),
        platform: LINUX_X64,
    }
}

/// Names left in the cache directory.
fn cache_entries(data: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data.join(cache::PACKAGES_DIR))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn release_requests(fake: &FakeGithub) -> Vec<String> {
    fake.requests()
        .into_iter()
        .map(|r| format!("{} {}", r.status, r.path))
        .collect()
}

#[tokio::test]
async fn a_version_is_downloaded_verified_and_cached_then_served_from_the_cache() {
    let fake = fake().await;
    let archive = tarball(None);
    fake.publish_runner_release(VERSION, archive.clone());
    let data = tempfile::tempdir().unwrap();
    let wanted = wanted(&fake, data.path());
    assert!(matches!(
        inspect(&wanted).await.unwrap(),
        Inspection::WouldDownload(chosen) if chosen.source == release::ChecksumSource::AssetDigest
    ));

    let mut progress = Recorder::default();
    let dir = resolve(&wanted, &mut progress).await.unwrap();
    assert_eq!(
        dir,
        data.path()
            .join("packages")
            .join("actions-runner-linux-x64-2.330.0")
    );
    assert!(dir.join(LISTENER).is_file());
    assert_eq!(
        cache_entries(data.path()),
        vec![wanted.name()],
        "no leftovers"
    );
    let requests = release_requests(&fake);
    assert_eq!(
        requests.len(),
        4,
        "inspect's metadata, then metadata, redirect, storage: {requests:?}"
    );
    assert!(requests[2].starts_with("302 /actions/runner/releases/download/v2.330.0/"));
    assert!(requests[3].starts_with("200 /_release-assets/"));
    assert_eq!(progress.total, Some(Some(archive.len() as u64)));
    assert_eq!(progress.positions.last(), Some(&(archive.len() as u64)));
    assert!(progress.positions.windows(2).all(|w| w[0] < w[1]));
    assert!(progress.finished);

    fake.clear_requests();
    let again = resolve(&wanted, &mut Recorder::default()).await.unwrap();
    assert_eq!(again, dir);
    assert!(matches!(
        inspect(&wanted).await.unwrap(),
        Inspection::Cached(_)
    ));
    assert!(
        fake.requests().is_empty(),
        "a cached package costs no request"
    );
}

#[tokio::test]
async fn without_a_digest_the_release_notes_checksum_is_used() {
    let fake = fake().await;
    fake.publish_runner_release_with(
        VERSION,
        tarball(None),
        ReleaseOptions {
            omit_digest: true,
            ..ReleaseOptions::default()
        },
    );
    let data = tempfile::tempdir().unwrap();
    let dir = resolve(&wanted(&fake, data.path()), &mut Recorder::default())
        .await
        .unwrap();
    let marker = std::fs::read_to_string(dir.join(cache::COMPLETE_MARKER)).unwrap();
    assert_eq!(marker.trim().len(), 64);
}

#[tokio::test]
async fn a_corrupted_download_is_refused_and_nothing_is_cached() {
    let fake = fake().await;
    fake.publish_runner_release_with(
        VERSION,
        tarball(None),
        ReleaseOptions {
            corrupt: true,
            ..ReleaseOptions::default()
        },
    );
    let data = tempfile::tempdir().unwrap();
    let err = resolve(&wanted(&fake, data.path()), &mut Recorder::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PackageError::ChecksumMismatch { .. }),
        "{err}"
    );
    assert!(!err.is_configuration(), "a retry may succeed: exit 1");
    assert!(err.to_string().contains("SHA-256"), "{err}");
    assert!(cache_entries(data.path()).is_empty());
}

#[tokio::test]
async fn an_unknown_version_is_a_configuration_error_without_a_download() {
    let fake = fake().await;
    let data = tempfile::tempdir().unwrap();
    let err = resolve(&wanted(&fake, data.path()), &mut Recorder::default())
        .await
        .unwrap_err();
    assert!(matches!(err, PackageError::VersionNotFound { .. }), "{err}");
    assert!(err.is_configuration());
    assert!(err.to_string().contains("v2.330.0"), "{err}");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_release_without_any_checksum_is_refused_before_downloading() {
    let fake = fake().await;
    fake.publish_runner_release_with(
        VERSION,
        tarball(None),
        ReleaseOptions {
            omit_digest: true,
            omit_notes_checksums: true,
            ..ReleaseOptions::default()
        },
    );
    let data = tempfile::tempdir().unwrap();
    let err = resolve(&wanted(&fake, data.path()), &mut Recorder::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PackageError::Select(SelectError::NoChecksum { .. })),
        "{err}"
    );
    assert!(err.is_configuration());
    assert_eq!(fake.requests().len(), 1, "only the metadata was asked for");
    assert!(cache_entries(data.path()).is_empty());
}

#[tokio::test]
async fn a_package_with_a_top_level_work_folder_is_refused() {
    let fake = fake().await;
    fake.publish_runner_release(VERSION, tarball(Some("_work")));
    let data = tempfile::tempdir().unwrap();
    let err = resolve(&wanted(&fake, data.path()), &mut Recorder::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PackageError::Package(WorkspaceError::PackageHasWorkFolder { .. })
        ),
        "{err}"
    );
    assert!(cache_entries(data.path()).is_empty());
}

#[tokio::test]
async fn what_a_crash_left_is_removed_by_the_next_attempt() {
    let fake = fake().await;
    fake.publish_runner_release(VERSION, tarball(None));
    let data = tempfile::tempdir().unwrap();
    let wanted = wanted(&fake, data.path());
    let cache = Cache::new(data.path());
    std::fs::create_dir_all(cache.unpack_dir(&wanted.name()).join("bin")).unwrap();
    std::fs::write(cache.partial_file(&wanted.name()), b"half an archive").unwrap();
    std::fs::write(
        cache.partial_file("actions-runner-linux-x64-2.1.0"),
        b"older",
    )
    .unwrap();
    resolve(&wanted, &mut Recorder::default()).await.unwrap();
    assert_eq!(cache_entries(data.path()), vec![wanted.name()]);
}
