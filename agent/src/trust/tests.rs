use std::os::unix::fs::{PermissionsExt as _, symlink};

use super::*;
use rm_runner::isolate::Account;

const AGENT: u32 = 0;
const RUNNER: u32 = 64_200;
const ALICE: u32 = 1000;
const DIR: u32 = 0o040_000;
const FILE: u32 = 0o100_000;
const LINK: u32 = 0o120_000;

fn pool() -> Pool {
    Pool::new(vec![
        Account {
            uid: RUNNER,
            gid: RUNNER,
        },
        Account {
            uid: RUNNER + 1,
            gid: RUNNER + 1,
        },
    ])
}

fn step(path: &str, uid: u32, mode: u32) -> Step {
    Step {
        path: PathBuf::from(path),
        uid,
        gid: uid,
        mode,
    }
}

/// `/`, `/opt` and `/opt/runner` as a package's trail; `tweak` changes one step.
fn package(tweak: impl FnOnce(&mut Vec<Step>)) -> Vec<Step> {
    let mut trail = vec![
        step("/", 0, DIR | 0o755),
        step("/opt", 0, DIR | 0o755),
        step("/opt/runner", 0, DIR | 0o755),
    ];
    tweak(&mut trail);
    trail
}

#[test]
fn who_may_change_a_trail_decides() {
    let owned = |path: &str, uid| Untrusted::OwnedByRunner {
        path: PathBuf::from(path),
        uid,
    };
    let writable = |path: &str, mode| Untrusted::Writable {
        path: PathBuf::from(path),
        mode,
    };
    let table: Vec<(&str, Vec<Step>, Option<Untrusted>)> = vec![
        ("root's all the way", package(|_| {}), None),
        (
            "another user's, not a runner's",
            package(|t| t[2].uid = ALICE),
            None,
        ),
        (
            "the package owned by a runner uid",
            package(|t| t[2].uid = RUNNER),
            Some(owned("/opt/runner", RUNNER)),
        ),
        (
            "a directory above owned by a runner uid (a runner account's home)",
            package(|t| t[1].uid = RUNNER + 1),
            Some(owned("/opt", RUNNER + 1)),
        ),
        (
            "the package mode 0777",
            package(|t| t[2].mode = DIR | 0o777),
            Some(writable("/opt/runner", DIR | 0o777)),
        ),
        (
            "group-writable above",
            package(|t| t[1].mode = DIR | 0o775),
            Some(writable("/opt", DIR | 0o775)),
        ),
        (
            "group-writable with setgid (Debian's old /usr/local)",
            package(|t| t[1].mode = DIR | 0o2775),
            Some(writable("/opt", DIR | 0o2775)),
        ),
        (
            "a sticky /tmp with root's entry in it",
            vec![
                step("/", 0, DIR | 0o755),
                step("/tmp", 0, DIR | 0o1777),
                step("/tmp/runner", 0, DIR | 0o755),
            ],
            None,
        ),
        (
            "a sticky /tmp with another user's entry in it",
            vec![
                step("/", 0, DIR | 0o755),
                step("/tmp", 0, DIR | 0o1777),
                step("/tmp/runner", ALICE, DIR | 0o755),
            ],
            Some(Untrusted::InSharedDir {
                dir: PathBuf::from("/tmp"),
                mode: DIR | 0o1777,
                entry: PathBuf::from("/tmp/runner"),
                uid: ALICE,
            }),
        ),
        (
            "a sticky directory at the end protects nothing in it",
            package(|t| t[2].mode = DIR | 0o1777),
            Some(writable("/opt/runner", DIR | 0o1777)),
        ),
        (
            "an env_file writable by others",
            vec![
                step("/", 0, DIR | 0o755),
                step("/etc", 0, DIR | 0o755),
                step("/etc/rm.env", 0, FILE | 0o666),
            ],
            Some(writable("/etc/rm.env", FILE | 0o666)),
        ),
        (
            "an env_file owned by a runner uid, mode 0600",
            vec![
                step("/", 0, DIR | 0o755),
                step("/etc/rm.env", RUNNER, FILE | 0o600),
            ],
            Some(owned("/etc/rm.env", RUNNER)),
        ),
        (
            "a link's own mode means nothing",
            vec![
                step("/", 0, DIR | 0o755),
                step("/opt", 0, DIR | 0o755),
                step("/opt/runner", 0, LINK | 0o777),
                step("/srv", 0, DIR | 0o755),
                step("/srv/runner", 0, DIR | 0o755),
            ],
            None,
        ),
        (
            "a link owned by a runner uid",
            vec![
                step("/", 0, DIR | 0o755),
                step("/opt", 0, DIR | 0o755),
                step("/opt/runner", RUNNER, LINK | 0o777),
                step("/srv", 0, DIR | 0o755),
            ],
            Some(owned("/opt/runner", RUNNER)),
        ),
        (
            "the link's target in a runner's home",
            vec![
                step("/", 0, DIR | 0o755),
                step("/opt", 0, DIR | 0o755),
                step("/opt/runner", 0, LINK | 0o777),
                step("/home", 0, DIR | 0o755),
                step("/home/runner", RUNNER, DIR | 0o750),
                step("/home/runner/pkg", 0, DIR | 0o755),
            ],
            Some(owned("/home/runner", RUNNER)),
        ),
        (
            "a writable / itself",
            package(|t| t[0].mode = DIR | 0o777),
            Some(writable("/", DIR | 0o777)),
        ),
    ];
    for (what, trail, expected) in table {
        assert_eq!(judge(&trail, &pool(), AGENT), expected, "{what}");
    }
    // An agent that is not root: its own entry in a sticky directory is as safe as root's.
    let agent = 4242;
    let in_tmp = |uid| {
        vec![
            step("/", 0, DIR | 0o755),
            step("/tmp", 0, DIR | 0o1777),
            step("/tmp/runner", uid, DIR | 0o755),
        ]
    };
    assert_eq!(judge(&in_tmp(agent), &pool(), agent), None);
    assert!(judge(&in_tmp(agent + 1), &pool(), agent).is_some());
}

#[test]
fn a_refusal_names_the_path_and_the_fix() {
    let owned = Untrusted::OwnedByRunner {
        path: PathBuf::from("/home/runner"),
        uid: RUNNER,
    }
    .describe();
    assert!(
        owned.contains("/home/runner") && owned.contains("chown root:root"),
        "{owned}"
    );
    let writable = Untrusted::Writable {
        path: PathBuf::from("/opt/runner"),
        mode: DIR | 0o777,
    }
    .describe();
    assert!(writable.contains("every user (mode 777)"), "{writable}");
    assert!(writable.contains("chmod go-w /opt/runner"), "{writable}");
    let group = Untrusted::Writable {
        path: PathBuf::from("/opt"),
        mode: DIR | 0o775,
    }
    .describe();
    assert!(group.contains("its group"), "{group}");
}

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

/// The adapter reads what the kernel meets: each directory, a link and then its target's way.
#[test]
fn a_trail_follows_links_as_the_kernel_does() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    std::fs::create_dir_all(base.join("real/pkg")).unwrap();
    std::fs::create_dir_all(base.join("links")).unwrap();
    symlink("../real", base.join("links/rel")).unwrap();
    symlink(base.join("links/rel"), base.join("abs")).unwrap();
    let steps = trail(&base.join("abs/pkg")).unwrap();
    let paths: Vec<&Path> = steps.iter().map(|s| s.path.as_path()).collect();
    // The absolute link's target is looked up from `/` again, so `base` comes twice.
    let tail: Vec<&Path> = paths
        .iter()
        .copied()
        .filter(|p| p.starts_with(&base))
        .collect();
    assert_eq!(
        tail,
        [
            base.clone(),
            base.join("abs"),
            base.clone(),
            base.join("links"),
            base.join("links/rel"),
            base.join("real"),
            base.join("real/pkg"),
        ]
    );
    assert_eq!(paths[0], Path::new("/"));
    assert!(steps[paths.len() - 1].is_dir());

    // Made writable by others, the link's own directory is judged (the link could be swapped).
    std::fs::set_permissions(base.join("links"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let judged = judge(
        &trail(&base.join("abs/pkg")).unwrap(),
        &pool(),
        rustix::process::geteuid().as_raw(),
    );
    assert!(
        matches!(&judged, Some(Untrusted::Writable { path, .. }) if *path == base.join("links")),
        "{judged:?}"
    );
    // A path that is not there is left to its reader; a file in the middle is an error.
    assert_eq!(changeable(&base.join("missing"), &pool()), None);
    std::fs::write(base.join("file"), "x").unwrap();
    assert!(trail(&base.join("file/below")).is_err());
}
