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
