use std::os::unix::fs::{PermissionsExt as _, symlink};

use super::*;
use crate::isolate::Account;

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

fn seen(path: &str, uid: u32, mode: u32) -> Seen {
    Seen {
        path: PathBuf::from(path),
        uid,
        mode,
        target: None,
    }
}

fn link(path: &str, uid: u32, target: &str) -> Seen {
    Seen {
        target: Some(PathBuf::from(target)),
        ..seen(path, uid, LINK | 0o777)
    }
}

fn owned(path: &str, uid: u32) -> Option<Untrusted> {
    Some(Untrusted::OwnedByRunner {
        path: PathBuf::from(path),
        uid,
    })
}

fn writable(path: &str, mode: u32) -> Option<Untrusted> {
    Some(Untrusted::Writable {
        path: PathBuf::from(path),
        mode,
    })
}

fn link_out(path: &str, target: &str) -> Option<Untrusted> {
    Some(Untrusted::LinkOut {
        link: PathBuf::from(path),
        target: PathBuf::from(target),
        tree: PathBuf::from(TREE),
    })
}

/// The package tree of the table's in-tree cases.
const TREE: &str = "/opt/runner";

/// One case of the rule: what it is, the object, the directory it was found in, the tree it
/// lies in, what the rule says.
type Case<'a> = (
    &'a str,
    Seen,
    Option<&'a Seen>,
    Option<&'a str>,
    Option<Untrusted>,
);

/// The one rule, case by case: an object, the directory it was found in, in a tree or on the
/// way to a path.
#[test]
fn the_rule_decides_each_object_by_owner_mode_kind_and_link() {
    let plain = seen(TREE, 0, DIR | 0o755);
    let sticky = seen(TREE, 0, DIR | 0o1777);
    let sticky_alice = seen(TREE, ALICE, DIR | 0o1777);
    let bin = seen("/opt/runner/bin", 0, DIR | 0o755);
    let opt = seen("/opt", 0, DIR | 0o755);
    #[rustfmt::skip]
    let table: Vec<Case> = vec![
        ("root's directory", seen("/opt/runner/bin", 0, DIR | 0o755), Some(&plain), Some(TREE), None),
        ("another user's file, not a runner's", seen("/opt/runner/bin/x", ALICE, FILE | 0o755), Some(&plain), Some(TREE), None),
        ("a file owned by a runner uid, mode 0600", seen("/opt/runner/bin/Runner.Listener", RUNNER, FILE | 0o600), Some(&plain), Some(TREE), owned("/opt/runner/bin/Runner.Listener", RUNNER)),
        ("a directory owned by a runner uid", seen("/opt/runner/bin", RUNNER + 1, DIR | 0o755), Some(&plain), Some(TREE), owned("/opt/runner/bin", RUNNER + 1)),
        ("a link owned by a runner uid", link("/opt/runner/bin", RUNNER, "lib"), Some(&plain), Some(TREE), owned("/opt/runner/bin", RUNNER)),
        ("a 0777 subdirectory", seen("/opt/runner/bin", 0, DIR | 0o777), Some(&plain), Some(TREE), writable("/opt/runner/bin", DIR | 0o777)),
        ("a group-writable file", seen("/opt/runner/run.sh", 0, FILE | 0o775), Some(&plain), Some(TREE), writable("/opt/runner/run.sh", FILE | 0o775)),
        ("group-writable with setgid (Debian's old /usr/local)", seen("/usr/local", 0, DIR | 0o2775), None, None, writable("/usr/local", DIR | 0o2775)),
        ("a file every user may write", seen("/etc/rm.env", 0, FILE | 0o666), None, None, writable("/etc/rm.env", FILE | 0o666)),
        ("a sticky file is no sticky directory", seen("/opt/runner/x", 0, FILE | 0o1777), Some(&plain), Some(TREE), writable("/opt/runner/x", FILE | 0o1777)),
        ("a root-owned sticky directory", sticky.clone(), None, Some(TREE), None),
        ("a sticky directory of another user's", sticky_alice.clone(), None, Some(TREE), writable(TREE, DIR | 0o1777)),
        ("a sticky directory of a runner's", seen(TREE, RUNNER, DIR | 0o1777), None, Some(TREE), owned(TREE, RUNNER)),
        ("root's entry in a root-owned sticky directory", seen("/opt/runner/bin", 0, DIR | 0o755), Some(&sticky), Some(TREE), None),
        ("another user's entry in a sticky directory", seen("/opt/runner/bin", ALICE, DIR | 0o755), Some(&sticky), Some(TREE), Some(Untrusted::InSharedDir { dir: PathBuf::from(TREE), mode: DIR | 0o1777, entry: PathBuf::from("/opt/runner/bin"), uid: ALICE })),
        ("a link's own mode means nothing", link("/opt/runner/bin/node", 0, "../externals/node20/bin/node"), Some(&bin), Some(TREE), None),
        ("a link on the way is followed, not judged by its target", link("/opt/runner", 0, "/srv/elsewhere"), Some(&opt), None, None),
        ("a link to a name beside it", link("/opt/runner/bin/a", 0, "b"), Some(&plain), Some(TREE), None),
        ("an absolute link into the tree", link("/opt/runner/bin/a", 0, "/opt/runner/lib/a"), Some(&plain), Some(TREE), None),
        ("an absolute link out of the tree", link("/opt/runner/bin/a", 0, "/home/runner/a"), Some(&plain), Some(TREE), link_out("/opt/runner/bin/a", "/home/runner/a")),
        ("a link to the tree's parent's name that looks alike", link("/opt/runner/bin/a", 0, "/opt/runner2/a"), Some(&plain), Some(TREE), link_out("/opt/runner/bin/a", "/opt/runner2/a")),
        ("a link climbing above the tree", link("/opt/runner/bin/a", 0, "../../x"), Some(&plain), Some(TREE), link_out("/opt/runner/bin/a", "../../x")),
        ("a link at the top climbing out", link("/opt/runner/a", 0, "../x"), Some(&plain), Some(TREE), link_out("/opt/runner/a", "../x")),
        ("a link climbing back after a name (another link could take it out)", link("/opt/runner/a", 0, "bin/../../x"), Some(&plain), Some(TREE), link_out("/opt/runner/a", "bin/../../x")),
        ("a link climbing after a name, even inside", link("/opt/runner/bin/a", 0, "../lib/../a"), Some(&plain), Some(TREE), link_out("/opt/runner/bin/a", "../lib/../a")),
        ("an absolute link into the tree that climbs", link("/opt/runner/bin/a", 0, "/opt/runner/lib/../../x"), Some(&plain), Some(TREE), link_out("/opt/runner/bin/a", "/opt/runner/lib/../../x")),
        ("/ writable by every user", seen("/", 0, DIR | 0o777), None, None, writable("/", DIR | 0o777)),
    ];
    for (what, object, parent, tree, expected) in table {
        assert_eq!(
            judge(&object, parent, tree.map(Path::new), &pool(), AGENT),
            expected,
            "{what}"
        );
    }
    // An agent that is not root: its own entry in a sticky directory is as safe as root's, and
    // so is a sticky directory of its own.
    let agent = 4242;
    let tmp = seen("/tmp", 0, DIR | 0o1777);
    let entry = |uid| seen("/tmp/runner", uid, DIR | 0o755);
    assert_eq!(judge(&entry(agent), Some(&tmp), None, &pool(), agent), None);
    assert!(judge(&entry(agent + 1), Some(&tmp), None, &pool(), agent).is_some());
    let own_sticky = seen("/srv/shared", agent, DIR | 0o1777);
    assert_eq!(judge(&own_sticky, None, None, &pool(), agent), None);
}

/// `/`, `/opt` and `/opt/runner` as a package's trail; `tweak` changes one step.
fn package(tweak: impl FnOnce(&mut Vec<Seen>)) -> Vec<Seen> {
    let mut trail = vec![
        seen("/", 0, DIR | 0o755),
        seen("/opt", 0, DIR | 0o755),
        seen("/opt/runner", 0, DIR | 0o755),
    ];
    tweak(&mut trail);
    trail
}

/// On a trail each object is judged with the directory it was looked up in, a link's target
/// coming back through the directories on its way.
#[test]
fn who_may_change_a_trail_decides() {
    let table: Vec<(&str, Vec<Seen>, Option<Untrusted>)> = vec![
        ("root's all the way", package(|_| {}), None),
        (
            "a directory above owned by a runner uid (a runner account's home)",
            package(|t| t[1].uid = RUNNER + 1),
            owned("/opt", RUNNER + 1),
        ),
        (
            "the package mode 0777",
            package(|t| t[2].mode = DIR | 0o777),
            writable("/opt/runner", DIR | 0o777),
        ),
        (
            "a sticky /tmp with root's entry in it",
            vec![
                seen("/", 0, DIR | 0o755),
                seen("/tmp", 0, DIR | 0o1777),
                seen("/tmp/runner", 0, DIR | 0o755),
            ],
            None,
        ),
        (
            "a sticky /tmp with another user's entry in it",
            vec![
                seen("/", 0, DIR | 0o755),
                seen("/tmp", 0, DIR | 0o1777),
                seen("/tmp/runner", ALICE, DIR | 0o755),
            ],
            Some(Untrusted::InSharedDir {
                dir: PathBuf::from("/tmp"),
                mode: DIR | 0o1777,
                entry: PathBuf::from("/tmp/runner"),
                uid: ALICE,
            }),
        ),
        (
            "the link's target in a runner's home",
            vec![
                seen("/", 0, DIR | 0o755),
                seen("/opt", 0, DIR | 0o755),
                link("/opt/runner", 0, "/home/runner/pkg"),
                seen("/home", 0, DIR | 0o755),
                seen("/home/runner", RUNNER, DIR | 0o750),
                seen("/home/runner/pkg", 0, DIR | 0o755),
            ],
            owned("/home/runner", RUNNER),
        ),
        (
            "a target coming back through a sticky directory as another user's entry",
            vec![
                seen("/", 0, DIR | 0o755),
                seen("/tmp", 0, DIR | 0o1777),
                link("/tmp/pkg", 0, "/tmp/real"),
                seen("/", 0, DIR | 0o755),
                seen("/tmp", 0, DIR | 0o1777),
                seen("/tmp/real", ALICE, DIR | 0o755),
            ],
            Some(Untrusted::InSharedDir {
                dir: PathBuf::from("/tmp"),
                mode: DIR | 0o1777,
                entry: PathBuf::from("/tmp/real"),
                uid: ALICE,
            }),
        ),
    ];
    for (what, trail, expected) in table {
        assert_eq!(judge_trail(&trail, &pool(), AGENT), expected, "{what}");
    }
}

#[test]
fn a_refusal_names_the_path_and_the_fix() {
    let said = |u: Option<Untrusted>| u.unwrap().describe();
    let owned = said(owned("/home/runner", RUNNER));
    assert!(
        owned.contains("/home/runner") && owned.contains("chown root:root /home/runner"),
        "{owned}"
    );
    let everyone = said(writable("/opt/runner/bin", DIR | 0o777));
    assert!(everyone.contains("every user (mode 777)"), "{everyone}");
    assert!(
        everyone.contains("chmod go-w /opt/runner/bin"),
        "{everyone}"
    );
    let group = said(writable("/opt", DIR | 0o775));
    assert!(group.contains("its group"), "{group}");
    let out = said(link_out("/opt/runner/bin/a", "/home/runner/a"));
    assert!(
        out.contains("/home/runner/a") && out.contains("rm /opt/runner/bin/a"),
        "{out}"
    );
    // One sentence: "problem; fix", which `check` splits at the last "; ".
    for sentence in [owned, everyone, group, out] {
        assert_eq!(sentence.matches("; ").count(), 1, "{sentence}");
    }
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
    assert_eq!(
        steps[paths.len() - 3].target,
        Some(PathBuf::from("../real"))
    );

    // Made writable by others, the link's own directory is judged (the link could be swapped).
    std::fs::set_permissions(base.join("links"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let me = rustix::process::geteuid().as_raw();
    let judged = judge_trail(&trail(&base.join("abs/pkg")).unwrap(), &pool(), me);
    assert_eq!(
        judged,
        writable(base.join("links").to_str().unwrap(), DIR | 0o777)
    );
    // A path that is not there is left to its reader; a file in the middle is an error.
    assert_eq!(changeable(&base.join("missing"), Kind::File, &pool()), None);
    std::fs::write(base.join("file"), "x").unwrap();
    assert!(trail(&base.join("file/below")).is_err());
}

/// A package tree as the walker sees it: a good one passes; each way a job could change what a
/// runner gets (a 0777 subdirectory, a file owned by a runner uid, a link out) is found, named,
/// with its fix; the bounds hold.
#[test]
fn the_walker_judges_every_entry_of_a_tree() {
    let me = rustix::process::geteuid().as_raw();
    if me != 0 {
        crate::test_skip::cannot_run(
            "the_walker_judges_every_entry_of_a_tree",
            "root",
            "giving a file to a runner uid takes root",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().canonicalize().unwrap().join("runner");
    let mode = |path: &Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    std::fs::create_dir_all(top.join("bin")).unwrap();
    std::fs::create_dir_all(top.join("externals/node20/bin")).unwrap();
    std::fs::write(top.join("bin/Runner.Listener"), "#!/bin/sh\n").unwrap();
    std::fs::write(top.join("externals/node20/bin/node"), "").unwrap();
    symlink("../externals/node20/bin/node", top.join("bin/node")).unwrap();
    for dir in [&top, &top.join("bin"), &top.join("externals")] {
        mode(dir, 0o755);
    }
    let judged = || judge_tree(&top, &pool(), me).unwrap();
    assert_eq!(judged(), None, "a package of root's");
    assert_eq!(changeable(&top, Kind::Tree, &pool()), None);

    // A 0777 subdirectory: a job could replace the listener.
    mode(&top.join("bin"), 0o777);
    let found = judged();
    assert_eq!(
        found,
        writable(top.join("bin").to_str().unwrap(), DIR | 0o777)
    );
    let said = changeable(&top, Kind::Tree, &pool()).unwrap();
    assert!(
        said.contains(&format!("chmod go-w {}", top.join("bin").display())),
        "{said}"
    );
    mode(&top.join("bin"), 0o755);

    // A file deep in the tree owned by a runner uid.
    let node = top.join("externals/node20/bin/node");
    std::os::unix::fs::chown(&node, Some(RUNNER), None).unwrap();
    assert_eq!(judged(), owned(node.to_str().unwrap(), RUNNER));
    let said = changeable(&top, Kind::Tree, &pool()).unwrap();
    assert!(
        said.contains(&format!("chown root:root {}", node.display())),
        "{said}"
    );
    std::os::unix::fs::chown(&node, Some(0), None).unwrap();

    // A link out of the tree (the store would keep it pointing there).
    let out = top.join("bin/libcoreclr.so");
    symlink("/home/runner/libcoreclr.so", &out).unwrap();
    let said = changeable(&top, Kind::Tree, &pool()).unwrap();
    assert!(
        said.contains("/home/runner/libcoreclr.so")
            && said.contains(&format!("rm {}", out.display())),
        "{said}"
    );
    std::fs::remove_file(&out).unwrap();
    assert_eq!(judged(), None);

    // The top itself through a link: its way is the trail's, its entries the walker's.
    let via = tmp.path().canonicalize().unwrap().join("current");
    symlink(&top, &via).unwrap();
    assert_eq!(changeable(&via, Kind::Tree, &pool()), None);

    // Deeper than the bound: refused, not walked for ever.
    let mut deep = top.join("deep");
    for _ in 0..=MAX_TREE_DEPTH {
        deep = deep.join("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    let err = judge_tree(&top, &pool(), me).unwrap_err();
    assert!(err.to_string().contains("levels deep"), "{err}");
    let said = changeable(&top, Kind::Tree, &pool()).unwrap();
    assert!(said.starts_with("cannot tell who may change"), "{said}");
}
