use std::os::unix::fs::{PermissionsExt as _, symlink};

use super::*;

#[test]
fn link_protections_off_or_unreadable_are_named() {
    assert!(links_unprotected([Some("1\n"), Some("1\n")]).is_empty());
    assert!(links_unprotected([Some("2\n"), Some("1")]).is_empty());
    assert_eq!(
        links_unprotected([Some("0\n"), Some("1\n")]),
        ["fs.protected_symlinks is 0"]
    );
    assert_eq!(
        links_unprotected([Some("1"), Some("0")]),
        ["fs.protected_hardlinks is 0"]
    );
    assert_eq!(
        links_unprotected([None, Some("")]),
        [
            "fs.protected_symlinks cannot be read",
            "fs.protected_hardlinks is 0"
        ]
    );
}

/// `run`'s refusal at start, in process: a package whose `bin/` is 0777, one holding a file a
/// runner uid owns, one with a link out of it, and a `docker_images` tarball every user may
/// write are each refused (exit 2) naming the key, the path and the fix; put right, nothing is.
/// The rule itself is tested case by case in `rm_runner::trust`.
#[test]
fn run_refuses_a_package_tree_or_an_image_a_job_could_change() {
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            "run_refuses_a_package_tree_or_an_image_a_job_could_change",
            "root",
            "giving a file to a runner uid takes root",
        );
        return;
    }
    let runner_uid = 64_250;
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let package = base.join("runner");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    std::fs::write(package.join("bin/Runner.Listener"), "#!/bin/sh\n").unwrap();
    for dir in [&base, &package, &package.join("bin")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let image = base.join("pg.tar");
    std::fs::write(&image, "a tarball").unwrap();
    let config = crate::config::from_text(&format!(
        "[host]\nrunner_uids = \"{runner_uid}-{}\"\n\n[runner]\npackage_dir = \"{}\"\n\n[[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"linux\"]\ndocker = true\ndocker_images = [\"{}\"]\n",
        runner_uid + 3,
        package.display(),
        image.display()
    ))
    .unwrap();
    let refused = |what: &str, names: &[&str]| {
        let exit = refuse_changeable(&config, &package).expect_err(what);
        assert_eq!(exit.code, crate::exit::USAGE, "{what}");
        for name in names {
            assert!(
                exit.message.contains(name),
                "{what}: no {name}: {}",
                exit.message
            );
        }
    };
    assert!(refuse_changeable(&config, &package).is_ok());

    let bin = package.join("bin");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(
        "a 0777 subdirectory",
        &[
            "runner.package_dir",
            &format!("chmod go-w {}", bin.display()),
        ],
    );
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();

    let listener = package.join("bin/Runner.Listener");
    std::os::unix::fs::chown(&listener, Some(runner_uid + 2), None).unwrap();
    refused(
        "a file owned by a runner uid",
        &[
            &format!("runner uid {}", runner_uid + 2),
            &format!("chown root:root {}", listener.display()),
        ],
    );
    std::os::unix::fs::chown(&listener, Some(0), None).unwrap();

    let out = package.join("bin/libcoreclr.so");
    symlink("/home/runner/libcoreclr.so", &out).unwrap();
    refused(
        "a link out of the tree",
        &[
            "/home/runner/libcoreclr.so",
            &format!("rm {}", out.display()),
        ],
    );
    std::fs::remove_file(&out).unwrap();

    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o666)).unwrap();
    refused(
        "a docker_images tarball every user may write",
        &[
            "policy[0].docker_images",
            &format!("chmod go-w {}", image.display()),
        ],
    );
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(refuse_changeable(&config, &package).is_ok());
}

/// Where each transport's image is read from, and how it is judged: a layout as a tree, an
/// archive as its file, a registry's not at all (it is downloaded into the agent's store).
#[test]
fn an_image_source_is_its_layout_tree_or_its_archive_file() {
    let cases = [
        (
            "oci:/srv/images/ci:bookworm",
            Some(("/srv/images/ci", Kind::Tree)),
        ),
        ("oci:/srv/images/ci", Some(("/srv/images/ci", Kind::Tree))),
        (
            "oci-archive:/srv/ci.tar:bookworm",
            Some(("/srv/ci.tar", Kind::File)),
        ),
        (
            "docker-archive:/srv/ci.tar:ci:1",
            Some(("/srv/ci.tar", Kind::File)),
        ),
        ("docker://ghcr.io/acme/ci:1", None),
    ];
    for (text, want) in cases {
        let reference = rm_image::reference::ImageRef::parse(text).unwrap();
        assert_eq!(
            image_source(&reference),
            want.map(|(path, kind)| (PathBuf::from(path), kind)),
            "{text}"
        );
    }
}

/// A policy's local image source is refused at start (exit 2, naming `policy[i].image`, the
/// path and the fix) and by `check` (the `image` finding) when a job could change it: the
/// layout's `blobs/` writable by every user, its `index.json` owned by a runner uid, a
/// directory on the way to it group-writable, an archive every user may write; put right, it
/// is not. A registry's image has no source on this host to judge.
#[test]
fn run_and_check_refuse_an_image_source_a_job_could_change() {
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            "run_and_check_refuse_an_image_source_a_job_could_change",
            "root",
            "giving a file to a runner uid takes root",
        );
        return;
    }
    let runner_uid = 64_270;
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let package = base.join("runner");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    let images = base.join("images");
    let layout = images.join("ci");
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(layout.join("index.json"), "{}").unwrap();
    std::fs::write(layout.join("oci-layout"), "{}").unwrap();
    std::fs::write(layout.join("blobs/sha256").join("ab".repeat(32)), "a blob").unwrap();
    let archive = base.join("ci.tar");
    std::fs::write(&archive, "an archive").unwrap();
    for dir in [
        &base,
        &package,
        &package.join("bin"),
        &images,
        &layout,
        &layout.join("blobs"),
        &layout.join("blobs/sha256"),
    ] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = crate::config::from_text(&format!(
        "[host]\nrunner_uids = \"{runner_uid}-{}\"\n\n[runner]\npackage_dir = \"{}\"\n\n\
         [[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"linux\"]\nimage = \"oci:{}:bookworm\"\n\n\
         [[policy]]\nname = \"arc\"\ntarget = \"acme\"\nlabels = [\"arc\"]\nimage = \"docker-archive:{}\"\n\n\
         [[policy]]\nname = \"hub\"\ntarget = \"acme\"\nlabels = [\"hub\"]\nimage = \"docker://ghcr.io/acme/ci:1\"\n",
        runner_uid + 3,
        package.display(),
        layout.display(),
        archive.display()
    ))
    .unwrap();
    let judged: Vec<(String, Kind)> = trusted_paths(&config, Some(&package))
        .into_iter()
        .filter(|t| t.key.ends_with(".image"))
        .map(|t| (format!("{} {}", t.key, t.path.display()), t.kind))
        .collect();
    assert_eq!(
        judged,
        [
            (format!("policy[0].image {}", layout.display()), Kind::Tree),
            (format!("policy[1].image {}", archive.display()), Kind::File),
        ]
    );
    let refused = |what: &str, names: &[&str]| {
        let exit = refuse_changeable(&config, &package).expect_err(what);
        assert_eq!(exit.code, crate::exit::USAGE, "{what}");
        for name in names {
            assert!(
                exit.message.contains(name),
                "{what}: no {name}: {}",
                exit.message
            );
        }
        let findings = crate::commands::check::trust_findings(&config);
        let failed: Vec<_> = findings
            .iter()
            .filter(|f| f.check == "image" && f.status == crate::commands::check::Status::Fail)
            .collect();
        assert_eq!(failed.len(), 1, "{what}: {findings:?}");
        for name in names {
            assert!(
                failed[0].what.contains(name) || failed[0].remedy.contains(name),
                "{what}: check names no {name}: {:?}",
                failed[0]
            );
        }
    };
    assert!(refuse_changeable(&config, &package).is_ok());

    let blobs = layout.join("blobs");
    std::fs::set_permissions(&blobs, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(
        "the layout's blobs/ every user may write",
        &[
            "policy[0].image",
            &format!("chmod go-w {}", blobs.display()),
        ],
    );
    std::fs::set_permissions(&blobs, std::fs::Permissions::from_mode(0o755)).unwrap();

    let index = layout.join("index.json");
    std::os::unix::fs::chown(&index, Some(runner_uid + 1), None).unwrap();
    refused(
        "the layout's index.json owned by a runner uid",
        &[
            &format!("runner uid {}", runner_uid + 1),
            &format!("chown root:root {}", index.display()),
        ],
    );
    std::os::unix::fs::chown(&index, Some(0), None).unwrap();

    std::fs::set_permissions(&images, std::fs::Permissions::from_mode(0o775)).unwrap();
    refused(
        "a group-writable directory on the way to the layout",
        &[
            "policy[0].image",
            &format!("chmod go-w {}", images.display()),
        ],
    );
    std::fs::set_permissions(&images, std::fs::Permissions::from_mode(0o755)).unwrap();

    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o666)).unwrap();
    refused(
        "an archive every user may write",
        &[
            "policy[1].image",
            &format!("chmod go-w {}", archive.display()),
        ],
    );
    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(refuse_changeable(&config, &package).is_ok());
}
