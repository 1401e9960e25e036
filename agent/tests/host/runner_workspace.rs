//! Runtime directories on a real filesystem: a runtime is a copy of the package plus `tmp/`, a
//! package with a top-level `_work` is refused, and removal takes the runtime whole without ever
//! following a link a job planted, whatever the job made read-only or however deep it nested,
//! and nothing outside the root; a slot's `_work` is handed to the next runner uid whole.

#![allow(
    clippy::unwrap_used,
    reason = "a failed step in a test helper should fail the test loudly"
)]

use crate::skip;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};

use rm_runner::workspace::{
    RunnerRoot, TMP_DIR, WORKSPACE_NAME_LEN, WorkspaceError, workspace_name,
};
use rm_runner::{Removal, Runtime};

const ATTEMPT: &str = "0123456789ab-cdef-4000-8000-000000000001";

struct Setup {
    dir: tempfile::TempDir,
    root: RunnerRoot,
    package: PathBuf,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("package");
        make_package(&package);
        let root = RunnerRoot::open(&dir.path().join("runners")).unwrap();
        Self { dir, root, package }
    }

    fn runtime(&self) -> Runtime {
        self.root.create_ephemeral(ATTEMPT, &self.package).unwrap()
    }

    /// A directory outside the runner root with a file in it: what a planted link points at.
    fn outside(&self) -> PathBuf {
        let outside = self.dir.path().join("outside");
        std::fs::create_dir_all(outside.join("nested")).unwrap();
        std::fs::write(outside.join("precious.txt"), "keep me").unwrap();
        std::fs::write(outside.join("nested/also.txt"), "keep me too").unwrap();
        outside
    }
}

/// What [`Setup::outside`] made is all still there: removal never reached it.
fn assert_untouched(outside: &Path) {
    assert_eq!(
        std::fs::read_to_string(outside.join("precious.txt")).unwrap(),
        "keep me"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("nested/also.txt")).unwrap(),
        "keep me too"
    );
}

/// A small package shaped like actions/runner: an executable listener, a script, a link, a
/// nested `_work` deep inside (allowed) and a read-only file.
fn make_package(package: &Path) {
    std::fs::create_dir_all(package.join("bin")).unwrap();
    std::fs::create_dir_all(package.join("externals/node/_work")).unwrap();
    let listener = package.join("bin/Runner.Listener");
    std::fs::write(&listener, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&listener, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(package.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::write(package.join("externals/node/_work/keep"), "nested").unwrap();
    symlink("Runner.Listener", package.join("bin/listener-link")).unwrap();
    let sealed = package.join("bin/sealed.dll");
    std::fs::write(&sealed, "read only").unwrap();
    std::fs::set_permissions(&sealed, std::fs::Permissions::from_mode(0o444)).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[test]
fn a_runtime_is_a_copy_of_the_package_with_its_tmp() {
    let s = Setup::new();
    let runtime = s.runtime();
    assert_eq!(
        runtime.dir(),
        s.root.path().join(workspace_name(ATTEMPT).unwrap())
    );
    assert_eq!(runtime.dir().file_name().unwrap().len(), WORKSPACE_NAME_LEN);
    assert_eq!(runtime.dir().file_name().unwrap(), "0123456789ab");
    assert_eq!(mode(runtime.dir()), 0o700);
    assert_eq!(mode(&runtime.dir().join("bin/Runner.Listener")), 0o755);
    assert_eq!(mode(&runtime.dir().join("bin/sealed.dll")), 0o444);
    let link = runtime.dir().join("bin/listener-link");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("Runner.Listener")
    );
    assert_eq!(
        std::fs::read_to_string(runtime.dir().join("externals/node/_work/keep")).unwrap(),
        "nested"
    );
    assert!(runtime.dir().join(TMP_DIR).is_dir());
    assert_eq!(runtime.tmp(), runtime.dir().join("tmp"));
    assert!(!runtime.dir().join("_work").exists());
}

#[test]
fn a_package_with_a_top_level_work_folder_is_refused_before_anything_is_created() {
    let s = Setup::new();
    std::fs::create_dir(s.package.join("_work")).unwrap();
    let err = s.root.create_ephemeral(ATTEMPT, &s.package).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::PackageHasWorkFolder { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("top-level `_work`"), "{err}");
    assert!(!exists(&s.root.ephemeral_path(ATTEMPT).unwrap()));

    // A link named `_work` is refused all the same.
    std::fs::remove_dir(s.package.join("_work")).unwrap();
    symlink(s.outside(), s.package.join("_work")).unwrap();
    let err = s.root.create_ephemeral(ATTEMPT, &s.package).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::PackageHasWorkFolder { .. }),
        "{err:?}"
    );
}

#[test]
fn two_attempts_never_share_a_runtime() {
    let s = Setup::new();
    let runtime = s.runtime();
    std::fs::write(runtime.dir().join("tmp/mine"), "first").unwrap();
    let err = s.root.create_ephemeral(ATTEMPT, &s.package).unwrap_err();
    assert!(
        matches!(err, WorkspaceError::RuntimeExists { .. }),
        "{err:?}"
    );
    assert_eq!(
        std::fs::read_to_string(runtime.dir().join("tmp/mine")).unwrap(),
        "first"
    );
}

#[test]
fn removal_leaves_the_targets_of_planted_links_intact() {
    let s = Setup::new();
    let runtime = s.runtime();
    let outside = s.outside();
    let work = runtime.dir().join("_work");
    std::fs::create_dir_all(work.join("repo/repo")).unwrap();
    symlink(&outside, work.join("planted-link")).unwrap();
    // Links to ancestors (the test's own sandbox, the runner root): a remover that followed
    // them would empty `outside` and the root. Deliberately no link to `/` here: tests run as
    // root in CI, and a regressed remover would take the host with it rather than fail.
    symlink(s.dir.path(), work.join("repo/repo/to-the-sandbox")).unwrap();
    symlink(outside.join("precious.txt"), work.join("to-a-file")).unwrap();
    symlink(s.root.path(), work.join("to-the-runner-root")).unwrap();
    symlink("/nonexistent/dangling", work.join("dangling")).unwrap();
    // A link in place of `tmp` too: the runner's TMPDIR.
    std::fs::remove_dir(runtime.tmp()).unwrap();
    symlink(&outside, runtime.tmp()).unwrap();

    assert_eq!(
        s.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Removed
    );

    assert!(!exists(runtime.dir()));
    assert_untouched(&outside);
    assert!(s.root.path().is_dir());
    assert!(s.package.join("bin/Runner.Listener").is_file());
}

#[test]
fn a_runtime_replaced_by_a_link_is_unlinked_not_followed() {
    let s = Setup::new();
    let runtime = s.runtime();
    let outside = s.outside();
    s.root.remove_runtime(runtime.dir()).unwrap();
    symlink(&outside, runtime.dir()).unwrap();
    assert_eq!(
        s.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert!(!exists(runtime.dir()));
    assert!(outside.join("precious.txt").is_file());
    assert!(outside.join("nested/also.txt").is_file());
}

/// Set in the unprivileged re-run of a test: where to say it got to the end.
const UNPRIVILEGED_MARKER: &str = "RUNNER_TEST_UNPRIVILEGED_MARKER";

/// Root ignores permission bits, so under root (as in CI containers) a read-only directory
/// tests nothing. Then this runs the test again as `nobody` through `setpriv` and returns
/// `false` (the caller is done; also after an allowed skip, without `setpriv`); otherwise (not
/// root, or the re-run itself) `true`.
fn run_here_or_unprivileged(test: &str) -> bool {
    if !rustix::process::geteuid().is_root() || std::env::var_os(UNPRIVILEGED_MARKER).is_some() {
        return true;
    }
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let marker = scratch.path().join("reached-the-end");
    let rerun = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env("TMPDIR", scratch.path())
        .env(UNPRIVILEGED_MARKER, &marker)
        .output();
    match rerun {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            skip::cannot_run(
                &format!("{test} (unprivileged)"),
                "setpriv",
                "setpriv is not installed (apt-get install util-linux): the test would run as \
                 root, where modes are not enforced",
            );
            false
        }
        Err(e) => panic!("cannot re-run {test} unprivileged: {e}"),
        Ok(output) => {
            assert!(
                output.status.success(),
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                marker.is_file(),
                "the unprivileged re-run did not get to the end"
            );
            false
        }
    }
}

#[test]
fn removal_copes_with_what_a_job_made_read_only() {
    if !run_here_or_unprivileged("runner_workspace::removal_copes_with_what_a_job_made_read_only") {
        return;
    }
    let s = Setup::new();
    let runtime = s.runtime();
    let work = runtime.dir().join("_work");
    // Like Go's module cache: read-only directories full of read-only files.
    let cache = work.join("go/pkg/mod/example.com/m@v1");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("go.mod"), "module m").unwrap();
    std::fs::set_permissions(cache.join("go.mod"), std::fs::Permissions::from_mode(0o444)).unwrap();
    for dir in [&cache, &work.join("go/pkg/mod/example.com")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    }
    // A directory nobody may even list, with something inside.
    let locked = work.join("locked");
    std::fs::create_dir_all(locked.join("inner")).unwrap();
    std::fs::write(locked.join("inner/file"), "x").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // And the runtime itself made read-only.
    std::fs::set_permissions(runtime.dir(), std::fs::Permissions::from_mode(0o500)).unwrap();

    assert_eq!(
        s.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert!(!exists(runtime.dir()));
    if let Some(marker) = std::env::var_os(UNPRIVILEGED_MARKER) {
        std::fs::write(marker, "ok").unwrap();
    }
}

#[test]
fn removing_an_absent_runtime_is_fine() {
    let s = Setup::new();
    let runtime = s.runtime();
    assert_eq!(
        s.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert_eq!(
        s.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Absent
    );
    let never = s.root.ephemeral_path("ffffffffffff").unwrap();
    assert_eq!(s.root.remove_runtime(&never).unwrap(), Removal::Absent);
}

#[test]
fn nothing_but_a_direct_child_of_the_runner_root_is_removed() {
    let s = Setup::new();
    let runtime = s.runtime();
    let outside = s.outside();
    let nested = runtime.dir().join("_work");
    std::fs::create_dir_all(&nested).unwrap();
    let root = s.root.path().to_path_buf();
    let refused = [
        root.clone(),
        root.join(".."),
        root.join("."),
        root.join("0123456789ab/.."),
        nested.clone(),
        outside.clone(),
        outside.join("precious.txt"),
        PathBuf::from("0123456789ab"),
        // Deliberately no "/" here: the tests run as root, and a broken guard would then wipe the
        // host instead of failing. Every refused path stays inside this test's sandbox.
        PathBuf::new(),
    ];
    for path in refused {
        let err = s.root.remove_runtime(&path).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::OutsideRoot { .. }),
            "{path:?}: {err:?}"
        );
    }
    assert!(nested.is_dir());
    assert!(outside.join("precious.txt").is_file());
    assert!(runtime.dir().join("bin/Runner.Listener").is_file());
}

#[test]
fn a_runner_root_reached_through_a_link_is_the_same_root() {
    let s = Setup::new();
    let link = s.dir.path().join("root-link");
    symlink(s.root.path(), &link).unwrap();
    let through_link = RunnerRoot::open(&link).unwrap();
    assert_eq!(through_link.path(), s.root.path());
    let runtime = s.runtime();
    let alias = link.join(runtime.dir().file_name().unwrap());
    assert_eq!(
        through_link.remove_runtime(&alias).unwrap(),
        Removal::Removed
    );
    assert!(!exists(runtime.dir()));
    assert!(s.root.path().is_dir());
}

#[test]
fn an_attempt_id_without_twelve_hex_digits_makes_no_runtime() {
    let s = Setup::new();
    for bad in ["../../etc", "short", ""] {
        let err = s.root.create_ephemeral(bad, &s.package).unwrap_err();
        assert!(
            matches!(err, WorkspaceError::AttemptId(_)),
            "{bad:?}: {err:?}"
        );
    }
    assert_eq!(std::fs::read_dir(s.root.path()).unwrap().count(), 0);
}

/// Where the deep trees below are made: a tmpfs where there is one. Removal works the same on
/// any filesystem, but this host's disk takes 16 s to remove a 5 000-deep chain with `rm -rf`
/// alone, and the walk is what is under test, not the disk.
fn deep_setup() -> Setup {
    let dir = match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    };
    let package = dir.path().join("package");
    make_package(&package);
    let root = RunnerRoot::open(&dir.path().join("runners")).unwrap();
    Setup { dir, root, package }
}

const DIR_FLAGS: rustix::fs::OFlags = rustix::fs::OFlags::RDONLY
    .union(rustix::fs::OFlags::DIRECTORY)
    .union(rustix::fs::OFlags::NOFOLLOW);

/// Makes `top/d/d/.../d`, `levels` deep, level by level through descriptors (a path of
/// thousands of components exceeds `PATH_MAX`), with a file at every level, a link to `outside`
/// every hundred levels and at the bottom, and every level owned by `owner` when given. Returns
/// the bottom directory.
fn deep_tree(top: &Path, levels: usize, outside: &Path, owner: Option<u32>) -> rustix::fd::OwnedFd {
    use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid};
    let give = |dir: &rustix::fd::OwnedFd, name: &str| {
        if let Some(id) = owner {
            let (uid, gid) = (Some(Uid::from_raw(id)), Some(Gid::from_raw(id)));
            rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW).unwrap();
        }
    };
    std::fs::create_dir_all(top).unwrap();
    let mut dir = rustix::fs::open(top, DIR_FLAGS, Mode::empty()).unwrap();
    for level in 0..levels {
        let file = rustix::fs::openat(
            &dir,
            "f",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        drop(file);
        give(&dir, "f");
        if level % 100 == 0 {
            rustix::fs::symlinkat(outside, &dir, "out").unwrap();
            give(&dir, "out");
        }
        rustix::fs::mkdirat(&dir, "d", Mode::RWXU).unwrap();
        give(&dir, "d");
        dir = rustix::fs::openat(&dir, "d", DIR_FLAGS, Mode::empty()).unwrap();
    }
    rustix::fs::symlinkat(outside, &dir, "out").unwrap();
    give(&dir, "out");
    dir
}

/// A job can nest directories as deep as the kernel lets it. A runtime that cannot be removed is
/// never `cleaned` and its uid never released: however deep, it goes, and no link in it is
/// followed. (Before removal walked without recursion, 1 100 levels made it give up.)
#[test]
fn a_runtime_goes_however_deep_a_job_nested_it() {
    let s = deep_setup();
    let outside = s.outside();
    for levels in [1100, 5000] {
        let runtime = s.runtime();
        deep_tree(&runtime.dir().join("_work"), levels, &outside, None);
        assert_eq!(
            s.root.remove_runtime(runtime.dir()).unwrap(),
            Removal::Removed,
            "{levels} levels"
        );
        assert!(!exists(runtime.dir()), "{levels} levels");
        assert_untouched(&outside);
    }
}

/// Set in the re-run of [`a_tree_a_hundred_thousand_deep_goes_with_a_small_descriptor_limit`].
const FEW_DESCRIPTORS_MARKER: &str = "RUNNER_TEST_FEW_DESCRIPTORS";

/// The descriptor limit that re-run runs under: far below the tree's depth, so a removal that
/// held a descriptor per level would fail with `EMFILE`.
const FEW_DESCRIPTORS: u64 = 64;

/// Removal holds a bounded number of descriptors whatever the depth: a tree 100 000 levels deep
/// goes in a process limited to 64 open files. (Run again in a child process: the limit is the
/// process's, and other tests run beside this one.)
#[test]
fn a_tree_a_hundred_thousand_deep_goes_with_a_small_descriptor_limit() {
    const NAME: &str =
        "runner_workspace::a_tree_a_hundred_thousand_deep_goes_with_a_small_descriptor_limit";
    if std::env::var_os(FEW_DESCRIPTORS_MARKER).is_none() {
        let rerun = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(FEW_DESCRIPTORS_MARKER, "1")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&rerun.stdout),
            String::from_utf8_lossy(&rerun.stderr)
        );
        assert!(rerun.status.success(), "{said}");
        assert!(said.contains("1 passed"), "the re-run ran nothing: {said}");
        return;
    }
    let s = deep_setup();
    let outside = s.outside();
    let runtime = s.runtime();
    deep_tree(&runtime.dir().join("_work"), 100_000, &outside, None);
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(FEW_DESCRIPTORS),
            maximum: hard,
        },
    )
    .unwrap();
    assert_eq!(
        s.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert!(!exists(runtime.dir()));
    assert_untouched(&outside);
}

/// A persistent slot's scrub keeps `_work` and removes the rest, however deep either is.
#[test]
fn a_slot_scrub_keeps_a_deep_work_folder_and_removes_the_rest() {
    let s = deep_setup();
    let outside = s.outside();
    let slot = s.root.slot_path("widgets", 0).unwrap();
    s.root.prepare_slot(&slot, &s.package).unwrap();
    deep_tree(&slot.join("_work"), 1100, &outside, None);
    deep_tree(&slot.join("_diag"), 1100, &outside, None);
    assert_eq!(s.root.scrub_slot(&slot).unwrap(), Removal::Removed);
    let left: Vec<_> = std::fs::read_dir(&slot)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["_work"]);
    assert!(exists(&slot.join("_work/d/d/d/f")));
    assert_untouched(&outside);
    // And the whole slot, `_work` included, goes when its policy does.
    assert_eq!(
        s.root
            .remove_runtime(&s.root.path().join("widgets"))
            .unwrap(),
        Removal::Removed
    );
    assert_untouched(&outside);
}

/// Handing a persistent slot's `_work` to the next runner uid re-owns every level of a deep
/// tree, re-owns links as links (their targets keep their owner) and gives nothing of the
/// agent's away. (Before the walk, 1 100 levels made the slot unusable for good.)
#[test]
fn a_deep_work_folder_is_handed_to_the_next_runner_whole() {
    use rm_runner::isolate::{Account, chown_tree};
    use std::os::unix::fs::MetadataExt as _;
    if !rustix::process::geteuid().is_root() {
        skip::cannot_run(
            "runner_workspace::a_deep_work_folder_is_handed_to_the_next_runner_whole",
            "root",
            "only root can give files to other uids",
        );
        return;
    }
    const PREVIOUS: u32 = 64_901;
    const NEXT: u32 = 64_902;
    let s = deep_setup();
    let outside = s.outside();
    let work = s.dir.path().join("slot/_work");
    for levels in [1100, 5000] {
        let bottom = deep_tree(&work, levels, &outside, Some(PREVIOUS));
        // A file of the agent's in the tree (a hard link to the store would be one).
        rustix::fs::symlinkat("x", &bottom, "agent-link").unwrap();
        chown_tree(
            &work,
            Account {
                uid: NEXT,
                gid: NEXT,
            },
        )
        .unwrap();

        let stat = |name: &str| {
            rustix::fs::statat(&bottom, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).unwrap()
        };
        assert_eq!(rustix::fs::fstat(&bottom).unwrap().st_uid, NEXT, "{levels}");
        assert_eq!(stat("out").st_uid, NEXT, "the link itself, {levels}");
        assert_eq!(stat("agent-link").st_uid, 0, "the agent's own, {levels}");
        assert_eq!(std::fs::metadata(&work).unwrap().uid(), NEXT);
        assert_eq!(std::fs::metadata(work.join("d/d/f")).unwrap().uid(), NEXT);
        // The links' targets are not the tree's.
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
        assert_eq!(
            std::fs::metadata(outside.join("precious.txt"))
                .unwrap()
                .uid(),
            0
        );
        assert_untouched(&outside);
        std::fs::remove_dir_all(&work).unwrap();
    }
}

/// Removal while a job (a process that escaped the stop, say) keeps moving a directory of the
/// tree out to a place of its own and back: removal may fail and be tried again, but it never
/// touches anything outside the runtime, even where it reopens a directory it had closed (a
/// directory moved away under the walk is no longer where the walk left it).
#[test]
fn removal_under_a_job_moving_its_tree_about_never_leaves_the_tree() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = deep_setup();
    let outside = s.outside();
    // The job's own place outside the runtime, with what must survive in it.
    let den = s.dir.path().join("den");
    std::fs::create_dir(&den).unwrap();
    std::fs::write(den.join("f"), "the job's, outside").unwrap();
    std::fs::write(den.join("precious.txt"), "keep me").unwrap();
    let rounds = 30;
    for round in 0..rounds {
        let runtime = s.runtime();
        let work = runtime.dir().join("_work");
        deep_tree(&work, 200, &outside, None);
        // Level 3 of the chain goes out to the den and back, again and again.
        let inside = work.join("d/d/d");
        let out = den.join("moved");
        let stop = Arc::new(AtomicBool::new(false));
        let mover = {
            let (stop, inside, out) = (stop.clone(), inside.clone(), out.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::rename(&inside, &out);
                    std::thread::yield_now();
                    let _ = std::fs::rename(&out, &inside);
                }
            })
        };
        let mut result = s.root.remove_runtime(runtime.dir());
        for _ in 0..20 {
            if result.is_ok() {
                break;
            }
            result = s.root.remove_runtime(runtime.dir());
        }
        stop.store(true, Ordering::Relaxed);
        mover.join().unwrap();
        // What the mover left in its den is the job's; the test takes it back and removes the
        // runtime for good.
        if exists(&out) {
            std::fs::remove_dir_all(&out).unwrap();
        }
        s.root.remove_runtime(runtime.dir()).unwrap();
        assert!(!exists(runtime.dir()), "round {round}");
        assert_untouched(&outside);
        assert_eq!(
            std::fs::read_to_string(den.join("f")).unwrap(),
            "the job's, outside",
            "round {round}: removal reached a directory outside the runtime"
        );
        assert!(den.join("precious.txt").is_file(), "round {round}");
    }
}

/// A bind mount of the same filesystem inside a runtime (a privileged job could make one of
/// `/etc`) has the runtime's device: only its mount id tells it apart. Removal stops there and
/// leaves what the mount shows alone.
#[test]
fn removal_stops_at_a_bind_mount_of_the_same_filesystem() {
    if !rustix::process::geteuid().is_root() {
        skip::cannot_run(
            "removal_stops_at_a_bind_mount_of_the_same_filesystem",
            "root",
            "only root can make a bind mount",
        );
        return;
    }
    let setup = Setup::new();
    let outside = setup.outside();
    let runtime = setup.runtime();
    let target = runtime.dir().join("_work/mounted");
    std::fs::create_dir_all(&target).unwrap();
    let mounted = std::process::Command::new("mount")
        .arg("--bind")
        .arg(&outside)
        .arg(&target)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount --bind failed");
    let same_device = std::fs::metadata(&target).unwrap().dev()
        == std::fs::metadata(runtime.dir()).unwrap().dev();
    assert!(
        same_device,
        "the bind mount shows the runtime's own filesystem"
    );
    let removal = setup.root.remove_runtime(runtime.dir());
    let unmounted = std::process::Command::new("umount")
        .arg(&target)
        .status()
        .unwrap();
    assert!(unmounted.success());
    assert!(
        matches!(removal, Err(WorkspaceError::Remove { .. })),
        "removal must stop at the mount point: {removal:?}"
    );
    assert_untouched(&outside);
    // Unmounted, the runtime goes.
    assert_eq!(
        setup.root.remove_runtime(runtime.dir()).unwrap(),
        Removal::Removed
    );
    assert_untouched(&outside);
}
