use super::*;

fn release(tag: &str) -> ReleaseSummary {
    ReleaseSummary {
        id: 1,
        tag_name: tag.to_owned(),
        draft: false,
        prerelease: false,
        published_at: Some("2026-11-01T00:00:00Z".to_owned()),
    }
}

#[test]
fn only_a_newer_published_release_is_adopted() {
    assert_eq!(
        decide("2.330.0", &release("v2.331.0")),
        Step::Adopt("2.331.0".into())
    );
    assert_eq!(decide("2.330.0", &release("v2.330.0")), Step::Current);
    assert!(matches!(
        decide("2.330.0", &release("v2.329.9")),
        Step::Ignore(_)
    ));
    // Ordered as numbers, not as text.
    assert_eq!(
        decide("2.99.0", &release("v2.100.0")),
        Step::Adopt("2.100.0".into())
    );
    let mut pre = release("v2.331.0");
    pre.prerelease = true;
    assert!(matches!(decide("2.330.0", &pre), Step::Ignore(_)));
    let mut draft = release("v2.331.0");
    draft.draft = true;
    assert!(matches!(decide("2.330.0", &draft), Step::Ignore(_)));
    // A tag that would reach a URL or a directory name as anything but a version.
    for tag in [
        "v2.331.0/../x",
        "latest",
        "v2.331",
        "v2.331.0.1",
        "v2.3a1.0",
    ] {
        assert!(
            matches!(decide("2.330.0", &release(tag)), Step::Ignore(_)),
            "{tag}"
        );
    }
    // At start there is no current version: any version is adopted.
    assert_eq!(
        decide("", &release("v2.330.0")),
        Step::Adopt("2.330.0".into())
    );
}

#[test]
fn the_newest_complete_cached_package_is_found() {
    let data = tempfile::tempdir().unwrap();
    let platform = Platform::of("linux", "x86_64").unwrap();
    assert_eq!(newest_cached(data.path(), platform), None);
    let cache = Cache::new(data.path());
    let sha = "ab".repeat(32);
    for version in ["2.9.0", "2.10.0"] {
        let name = release::package_name(platform, version);
        cache.prepare(&name).unwrap();
        let dir = cache.unpack_dir(&name);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join(crate::process::LISTENER), b"x").unwrap();
        cache.commit(&name, &sha).unwrap();
    }
    // Newer, but incomplete: not a package.
    std::fs::create_dir_all(
        cache
            .root()
            .join(release::package_name(platform, "2.11.0"))
            .join("bin"),
    )
    .unwrap();
    let (version, dir) = newest_cached(data.path(), platform).unwrap();
    assert_eq!(version, "2.10.0");
    assert_eq!(
        dir,
        cache.package_dir(&release::package_name(platform, "2.10.0"))
    );
}
