use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use super::*;

/// A uid and gid no account on the test machine has: "other" to every stored entry.
const RUNNER_UID: u32 = 64991;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write(path: &Path, content: &[u8], mode: u32) {
    std::fs::write(path, content).unwrap();
    chmod(path, mode);
}

/// A small package shaped like actions/runner's: scripts at the top, `bin/`, `externals/`, a
/// relative link, an empty directory, and modes a tarball might carry (group-writable, setuid).
fn make_package(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("externals/node20/bin")).unwrap();
    std::fs::create_dir_all(dir.join("externals/node20/lib")).unwrap();
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    chmod(&dir.join("empty"), 0o700);
    write(&dir.join("config.sh"), b"#!/bin/sh\necho config\n", 0o775);
    write(&dir.join("bin/f"), b"stored content\n", 0o664);
    write(
        &dir.join("bin/Runner.Listener"),
        b"\x7fELF listener",
        0o4755,
    );
    write(&dir.join("bin/Lib.dll"), &[7u8; 70_000], 0o644);
    write(&dir.join("externals/node20/bin/node"), b"node", 0o755);
    write(&dir.join("externals/node20/lib/x.js"), b"js", 0o644);
    symlink("../lib/x.js", dir.join("externals/node20/bin/npm")).unwrap();
}

/// A runner root with its store, and a package source next to it.
struct Setup {
    dir: tempfile::TempDir,
    store: Store,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_package(&dir.path().join("package"));
        let store = Store::open(&dir.path().join("root")).unwrap();
        Self { dir, store }
    }

    fn source(&self) -> PathBuf {
        self.dir.path().join("package")
    }

    fn install(&self) -> StoredPackage {
        self.store.install(&self.source()).unwrap()
    }

    /// A fresh, empty runtime directory in the runner root.
    fn runtime(&self, name: &str) -> PathBuf {
        let runtime = self.dir.path().join("root").join(name);
        std::fs::create_dir(&runtime).unwrap();
        runtime
    }

    fn store_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

fn ino(path: &Path) -> (u64, u64) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.dev(), meta.ino())
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// Rewrites a stored (read-only) file the way a job with the agent's uid could: chmod, write,
/// chmod back, so only the content differs.
fn rewrite_stored(path: &Path, content: &[u8]) {
    let old = mode(path);
    chmod(path, 0o644);
    std::fs::write(path, content).unwrap();
    chmod(path, old);
}

#[test]
fn installing_twice_gives_one_tree_named_by_a_stable_digest() {
    let setup = Setup::new();
    let first = setup.install();
    let second = setup.install();
    assert_eq!(first.tree(), second.tree());
    assert_eq!(first.manifest(), second.manifest());
    let digest = first.manifest().digest();
    assert_eq!(first.tree(), setup.store.dir().join(&digest).join(TREE_DIR));
    // Verified and kept, not rebuilt: the same inode.
    assert_eq!(
        ino(&first.tree().join("bin/f")),
        ino(&second.tree().join("bin/f"))
    );
    assert_eq!(setup.store_names(), std::slice::from_ref(&digest));

    // The same content elsewhere, with other (unstored) mode bits, is the same package.
    let copy = setup.dir.path().join("copy");
    make_package(&copy);
    chmod(&copy.join("bin/Lib.dll"), 0o666);
    chmod(&copy.join("bin"), 0o775);
    assert_eq!(
        setup.store.install(&copy).unwrap().manifest().digest(),
        digest
    );

    let paths: Vec<&str> = first
        .manifest()
        .entries
        .iter()
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "bin",
            "bin/Lib.dll",
            "bin/Runner.Listener",
            "bin/f",
            "config.sh",
            "empty",
            "externals",
            "externals/node20",
            "externals/node20/bin",
            "externals/node20/bin/node",
            "externals/node20/bin/npm",
            "externals/node20/lib",
            "externals/node20/lib/x.js",
        ]
    );
    first.manifest().validate().unwrap();
    let stored: Manifest = serde_json::from_slice(
        &std::fs::read(setup.store.dir().join(&digest).join(MANIFEST_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(&stored, first.manifest());
}

#[test]
fn stored_entries_are_the_agents_and_read_only_for_everyone_else() {
    let setup = Setup::new();
    let package = setup.install();
    assert_eq!(mode(setup.store.dir()), STORE_MODE);
    let tree = package.tree();
    assert_eq!(mode(tree), 0o755);
    assert_eq!(mode(&tree.join("bin")), 0o755);
    assert_eq!(mode(&tree.join("empty")), 0o755);
    assert_eq!(mode(&tree.join("bin/f")), 0o444);
    assert_eq!(mode(&tree.join("bin/Lib.dll")), 0o444);
    // setuid dropped: a runner must not run anything as the agent.
    assert_eq!(mode(&tree.join("bin/Runner.Listener")), 0o555);
    assert_eq!(mode(&tree.join("config.sh")), 0o555);
    for entry in &package.manifest().entries {
        let meta = std::fs::symlink_metadata(tree.join(&entry.path)).unwrap();
        assert_eq!(meta.uid(), euid(), "{}", entry.path);
    }
    assert_eq!(
        std::fs::read(tree.join("bin/f")).unwrap(),
        b"stored content\n"
    );
    package.verify().unwrap();
}

#[test]
fn link_into_links_every_file_to_the_stored_inode() {
    let setup = Setup::new();
    let package = setup.install();
    let runtime = setup.runtime("0123456789ab");
    package.link_into(&runtime).unwrap();
    for entry in &package.manifest().entries {
        let linked = runtime.join(&entry.path);
        let stored = package.tree().join(&entry.path);
        match &entry.kind {
            EntryKind::File => assert_eq!(ino(&linked), ino(&stored), "{}", entry.path),
            EntryKind::Dir => {
                assert_ne!(ino(&linked), ino(&stored));
                assert_eq!(mode(&linked), entry.mode);
            }
            EntryKind::Symlink { target } => {
                assert_eq!(std::fs::read_link(&linked).unwrap(), Path::new(target));
            }
        }
    }
    assert_eq!(
        std::fs::read(runtime.join("externals/node20/bin/npm")).unwrap(),
        b"js"
    );
    package.verify_runtime(&runtime).unwrap();
    // A runtime's own removal leaves the store whole.
    std::fs::remove_dir_all(&runtime).unwrap();
    package.verify().unwrap();
}

#[test]
fn link_into_leaves_other_names_alone_and_refuses_a_package_name() {
    let setup = Setup::new();
    let package = setup.install();
    let slot = setup.runtime("s0");
    std::fs::create_dir(slot.join("_work")).unwrap();
    std::fs::write(slot.join("_work/checkout"), b"kept").unwrap();
    package.link_into(&slot).unwrap();
    assert_eq!(std::fs::read(slot.join("_work/checkout")).unwrap(), b"kept");
    package.verify_runtime(&slot).unwrap();

    let clash = setup.runtime("s1");
    std::fs::write(clash.join("config.sh"), b"planted").unwrap();
    let err = package.link_into(&clash).unwrap_err();
    assert!(
        matches!(&err, StoreError::RuntimeEntryExists { path, .. } if path == "config.sh"),
        "{err}"
    );
    assert_eq!(std::fs::read(clash.join("config.sh")).unwrap(), b"planted");
}

#[test]
fn a_tampered_stored_file_is_caught_and_rebuilt() {
    let setup = Setup::new();
    let package = setup.install();
    let stored = package.tree().join("bin/f");

    rewrite_stored(&stored, b"stored content!\n");
    let err = package.verify().unwrap_err();
    assert!(
        matches!(&err, StoreError::Tampered { path, difference: Difference::Size { .. }, .. } if path == "bin/f"),
        "{err}"
    );
    rewrite_stored(&stored, b"STORED CONTENT\n");
    let err = package.verify().unwrap_err();
    assert!(
        matches!(&err, StoreError::Tampered { path, difference: Difference::Content, .. } if path == "bin/f"),
        "{err}"
    );
    assert_eq!(err.differing_path(), Some("bin/f"));

    // The next install notices (it logs the path) and rebuilds from the package: the content is
    // the package's again. (Not compared by inode: ext4 hands a freed inode number out again.)
    let rebuilt = setup.install();
    assert_eq!(rebuilt.tree(), package.tree());
    assert_eq!(std::fs::read(&stored).unwrap(), b"stored content\n");
    rebuilt.verify().unwrap();

    // A mode made writable is caught too, and undone by the rebuild.
    chmod(&rebuilt.tree().join("bin/Lib.dll"), 0o666);
    let err = rebuilt.verify().unwrap_err();
    assert!(
        matches!(&err, StoreError::Tampered { path, difference: Difference::Mode { expected: 0o444, found: 0o666 }, .. } if path == "bin/Lib.dll"),
        "{err}"
    );
    let again = setup.install();
    assert_eq!(mode(&again.tree().join("bin/Lib.dll")), 0o444);
    again.verify().unwrap();
}

#[test]
fn verify_catches_added_removed_and_retargeted_entries() {
    let setup = Setup::new();
    let package = setup.install();
    let tree = package.tree();
    std::fs::write(tree.join("bin/extra.dll"), b"x").unwrap();
    let err = package.verify().unwrap_err();
    assert!(
        matches!(&err, StoreError::Tampered { path, difference: Difference::Extra, .. } if path == "bin/extra.dll"),
        "{err}"
    );
    std::fs::remove_file(tree.join("bin/extra.dll")).unwrap();
    package.verify().unwrap();

    std::fs::remove_file(tree.join("externals/node20/bin/npm")).unwrap();
    let err = package.verify().unwrap_err();
    assert!(
        matches!(&err, StoreError::Tampered { path, difference: Difference::Missing, .. } if path == "externals/node20/bin/npm"),
        "{err}"
    );
    symlink("/bin/sh", tree.join("externals/node20/bin/npm")).unwrap();
    let err = package.verify().unwrap_err();
    assert!(
        matches!(&err, StoreError::Tampered { difference: Difference::Target { found, .. }, .. } if found == "/bin/sh"),
        "{err}"
    );

    // A manifest that is not the package's is refused, and the tree rebuilt.
    let manifest = setup
        .store
        .dir()
        .join(package.manifest().digest())
        .join(MANIFEST_FILE);
    chmod(&manifest, 0o644);
    std::fs::write(&manifest, b"{\"entries\":[]}").unwrap();
    let rebuilt = setup.install();
    rebuilt.verify().unwrap();
    assert_eq!(
        std::fs::read(&manifest).unwrap(),
        rebuilt.manifest().canonical_bytes()
    );
}

#[test]
fn verify_runtime_catches_a_replaced_file_and_a_chmoded_dir() {
    let setup = Setup::new();
    let package = setup.install();

    let runtime = setup.runtime("replaced");
    package.link_into(&runtime).unwrap();
    // Unlinked and recreated: the runtime's name no longer reaches the stored inode.
    std::fs::remove_file(runtime.join("bin/f")).unwrap();
    write(&runtime.join("bin/f"), b"other content\n", 0o444);
    let err = package.verify_runtime(&runtime).unwrap_err();
    assert!(
        matches!(&err, StoreError::RuntimeMismatch { path, difference: Difference::Inode, .. } if path == "bin/f"),
        "{err}"
    );
    package.verify().unwrap();

    let runtime = setup.runtime("chmoded");
    package.link_into(&runtime).unwrap();
    chmod(&runtime.join("externals/node20"), 0o777);
    let err = package.verify_runtime(&runtime).unwrap_err();
    assert!(
        matches!(&err, StoreError::RuntimeMismatch { path, difference: Difference::Mode { expected: 0o755, found: 0o777 }, .. } if path == "externals/node20"),
        "{err}"
    );

    let runtime = setup.runtime("missing");
    package.link_into(&runtime).unwrap();
    std::fs::remove_file(runtime.join("externals/node20/bin/npm")).unwrap();
    symlink("/etc", runtime.join("externals/node20/bin/npm")).unwrap();
    let err = package.verify_runtime(&runtime).unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::RuntimeMismatch {
                difference: Difference::Target { .. },
                ..
            }
        ),
        "{err}"
    );
    std::fs::remove_dir_all(runtime.join("externals")).unwrap();
    let err = package.verify_runtime(&runtime).unwrap_err();
    assert!(
        matches!(&err, StoreError::RuntimeMismatch { path, difference: Difference::Missing, .. } if path == "externals"),
        "{err}"
    );
}

#[test]
fn a_package_with_a_top_level_work_or_a_fifo_is_refused() {
    let setup = Setup::new();
    std::fs::create_dir(setup.source().join("_work")).unwrap();
    let err = setup.store.install(&setup.source()).unwrap_err();
    assert!(matches!(err, StoreError::WorkFolder { .. }), "{err}");
    std::fs::remove_dir(setup.source().join("_work")).unwrap();
    // A link named `_work` is no better.
    symlink("/tmp", setup.source().join("_work")).unwrap();
    let err = setup.store.install(&setup.source()).unwrap_err();
    assert!(matches!(err, StoreError::WorkFolder { .. }), "{err}");
    std::fs::remove_file(setup.source().join("_work")).unwrap();
    // Below the top, `_work` is an ordinary name.
    std::fs::create_dir(setup.source().join("bin/_work")).unwrap();
    setup.install();

    let fifo = setup.source().join("bin/pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let err = setup.store.install(&setup.source()).unwrap_err();
    assert!(
        matches!(&err, StoreError::Unsupported { path, .. } if path == "bin/pipe"),
        "{err}"
    );
    // Nothing was stored for the refused package; the previous one is still there.
    assert_eq!(setup.store_names().len(), 1);
}

#[test]
fn a_name_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt as _;
    let setup = Setup::new();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.dll");
    std::fs::write(setup.source().join("bin").join(name), b"latin-1").unwrap();
    let err = setup.store.install(&setup.source()).unwrap_err();
    assert!(
        matches!(&err, StoreError::NotUtf8 { dir, .. } if dir == "bin"),
        "{err}"
    );
}

#[test]
fn links_pointing_outside_are_recreated_never_followed() {
    let setup = Setup::new();
    let outside = setup.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"not in the package").unwrap();
    symlink(&outside, setup.source().join("bin/abs")).unwrap();
    symlink("../../outside", setup.source().join("bin/rel")).unwrap();
    symlink("/nonexistent/target", setup.source().join("dangling")).unwrap();
    let package = setup.install();
    let manifest = package.manifest();
    assert!(
        !manifest
            .entries
            .iter()
            .any(|e| e.path.starts_with("bin/abs/") || e.path.starts_with("bin/rel/")),
        "a link to a directory was walked into"
    );
    let kind = |path: &str| {
        manifest
            .entries
            .iter()
            .find(|e| e.path == path)
            .map(|e| e.kind.clone())
    };
    assert_eq!(
        kind("bin/rel"),
        Some(EntryKind::Symlink {
            target: "../../outside".into()
        })
    );
    assert_eq!(
        kind("dangling"),
        Some(EntryKind::Symlink {
            target: "/nonexistent/target".into()
        })
    );
    let runtime = setup.runtime("links");
    package.link_into(&runtime).unwrap();
    assert!(
        std::fs::symlink_metadata(runtime.join("bin/abs"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_link(runtime.join("bin/abs")).unwrap(),
        outside
    );
    package.verify_runtime(&runtime).unwrap();
    package.verify().unwrap();
}

#[test]
fn stale_trees_and_staging_leftovers_are_removed() {
    let setup = Setup::new();
    let old = setup.install();
    let leftover = setup.store.dir().join(format!("{STAGING_PREFIX}crashed"));
    std::fs::create_dir_all(leftover.join("tree/bin")).unwrap();
    std::fs::write(leftover.join("tree/bin/f"), b"half").unwrap();
    chmod(&leftover.join("tree/bin"), 0o555);

    std::fs::write(setup.source().join("bin/new.dll"), b"a new version").unwrap();
    let new = setup.install();
    assert_ne!(old.manifest().digest(), new.manifest().digest());
    assert_eq!(setup.store_names(), [new.manifest().digest()]);
    assert!(!old.tree().exists());
    new.verify().unwrap();
}

#[test]
fn a_runtime_on_another_filesystem_is_refused() {
    let setup = Setup::new();
    let package = setup.install();
    let Ok(other) = tempfile::tempdir_in("/dev/shm") else {
        crate::test_skip::cannot_run(
            "a_runtime_on_another_filesystem_is_refused",
            "shm",
            "no /dev/shm to hold a runtime on another filesystem",
        );
        return;
    };
    if ino(other.path()).0 == ino(package.tree()).0 {
        crate::test_skip::cannot_run(
            "a_runtime_on_another_filesystem_is_refused",
            "shm",
            "/dev/shm is the same filesystem as the temporary directory",
        );
        return;
    }
    let err = package.link_into(other.path()).unwrap_err();
    assert!(matches!(err, StoreError::CrossDevice { .. }), "{err}");
    assert!(err.to_string().contains("another filesystem"), "{err}");
}

#[test]
fn the_store_refuses_a_link_and_restores_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    symlink(dir.path().join("elsewhere"), root.join(STORE_DIR)).unwrap();
    let err = Store::open(&root).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err}");

    std::fs::remove_file(root.join(STORE_DIR)).unwrap();
    std::fs::create_dir(root.join(STORE_DIR)).unwrap();
    chmod(&root.join(STORE_DIR), 0o755);
    let store = Store::open(&root).unwrap();
    assert_eq!(mode(store.dir()), STORE_MODE);
}

#[test]
fn a_runner_uid_cannot_write_a_linked_file() {
    if euid() != 0 {
        crate::test_skip::cannot_run(
            "a_runner_uid_cannot_write_a_linked_file",
            "root",
            &format!("only root can run a shell as uid {RUNNER_UID}"),
        );
        return;
    }
    let setup = Setup::new();
    let package = setup.install();
    let runtime = setup.runtime("0123456789ab");
    package.link_into(&runtime).unwrap();
    // The runner must be able to reach its runtime (as it will in production), not the store.
    chmod(setup.dir.path(), 0o711);
    chmod(&setup.dir.path().join("root"), 0o711);
    chmod(&runtime, 0o711);
    let as_runner = |script: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .uid(RUNNER_UID)
            .gid(RUNNER_UID)
            .output()
            .unwrap()
    };
    let linked = runtime.join("bin/f");
    let linked = linked.display();

    let read = as_runner(&format!("cat '{linked}'"));
    assert!(
        read.status.success(),
        "the runner cannot read its package: {read:?}"
    );
    assert_eq!(read.stdout, b"stored content\n");
    for attempt in [
        format!("echo x >> '{linked}'"),
        format!("chmod 666 '{linked}'"),
        format!("rm -f '{linked}'"),
        format!("ls '{}'", setup.store.dir().display()),
    ] {
        let out = as_runner(&attempt);
        assert!(
            !out.status.success(),
            "{attempt} succeeded as uid {RUNNER_UID}"
        );
    }
    assert_eq!(
        std::fs::read(package.tree().join("bin/f")).unwrap(),
        b"stored content\n"
    );
    package.verify().unwrap();
    package.verify_runtime(&runtime).unwrap();
}

fn found(path: &str, kind: EntryKind, mode: u32) -> Found {
    let (size, sha256) = match kind {
        EntryKind::File => (3, Some("ab".repeat(32))),
        _ => (0, None),
    };
    Found {
        entry: Entry {
            path: path.into(),
            kind,
            mode,
            size,
            sha256,
        },
        uid: 1000,
        ino: 7,
    }
}

#[test]
fn compare_reports_the_first_difference_in_order() {
    let expected: Vec<Entry> = [
        found("bin", EntryKind::Dir, 0o755),
        found("bin/a", EntryKind::File, 0o444),
        found("bin/b", EntryKind::File, 0o555),
    ]
    .into_iter()
    .map(|f| f.entry)
    .collect();
    let same = || {
        vec![
            found("bin", EntryKind::Dir, 0o755),
            found("bin/a", EntryKind::File, 0o444),
            found("bin/b", EntryKind::File, 0o555),
        ]
    };
    assert_eq!(compare(&expected, &same(), 1000), Ok(()));
    assert_eq!(
        compare(&expected, &same(), 0),
        Err(("bin".into(), Difference::Owner { uid: 1000 }))
    );

    let mut missing = same();
    missing.remove(1);
    assert_eq!(
        compare(&expected, &missing, 1000),
        Err(("bin/a".into(), Difference::Missing))
    );
    let mut extra = same();
    extra.insert(2, found("bin/a2", EntryKind::File, 0o444));
    assert_eq!(
        compare(&expected, &extra, 1000),
        Err(("bin/a2".into(), Difference::Extra))
    );
    let mut kind = same();
    kind[2] = found("bin/b", EntryKind::Symlink { target: "a".into() }, 0o777);
    assert_eq!(
        compare(&expected, &kind, 1000),
        Err((
            "bin/b".into(),
            Difference::Kind {
                expected: "file",
                found: "link"
            }
        ))
    );
    let mut content = same();
    content[1].entry.sha256 = Some("cd".repeat(32));
    assert_eq!(
        compare(&expected, &content, 1000),
        Err(("bin/a".into(), Difference::Content))
    );
}

#[test]
fn a_staging_folder_is_removed_on_drop_unless_kept() {
    let setup = Setup::new();
    let staging = Staging::create(&setup.store).unwrap();
    // Its mode is the stored folder's after the rename: the agent's alone.
    assert_eq!(mode(staging.path()), STAGING_MODE);
    std::fs::create_dir_all(staging.path().join("tree/bin")).unwrap();
    std::fs::write(staging.path().join("tree/bin/f"), b"half").unwrap();
    chmod(&staging.path().join("tree/bin"), 0o555);
    drop(staging);
    assert!(setup.store_names().is_empty(), "{:?}", setup.store_names());

    let kept = Staging::create(&setup.store).unwrap();
    let name = kept
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with(STAGING_PREFIX), "{name}");
    kept.keep();
    assert_eq!(setup.store_names(), [name]);
}

#[test]
fn a_superseded_tree_a_runtime_still_links_is_kept_until_the_runtime_goes() {
    let setup = Setup::new();
    let old = setup.install();
    let runtime = setup.runtime("0123456789ab");
    old.link_into(&runtime).unwrap();
    assert!(tree_in_use(old.tree()));

    // A new package installed beside it leaves the old tree; so does the start-up install.
    std::fs::write(setup.source().join("bin/new.dll"), b"a new version").unwrap();
    let new = setup.store.install_beside(&setup.source()).unwrap();
    let leftover = setup.store.dir().join(format!("{STAGING_PREFIX}building"));
    std::fs::create_dir_all(&leftover).unwrap();
    let removed = setup.store.remove_unused(&[new.digest()], Leftovers::Keep);
    assert!(removed.is_empty(), "{removed:?}");
    assert!(leftover.exists(), "a build that may be under way stays");
    old.verify_runtime(&runtime).unwrap();

    // The runtime gone, the old tree is unused and goes; the new one stays.
    std::fs::remove_dir_all(&runtime).unwrap();
    assert!(!tree_in_use(old.tree()));
    assert_eq!(
        setup.store.remove_unused(&[new.digest()], Leftovers::Keep),
        [old.digest()]
    );
    assert!(!old.tree().exists());
    new.verify().unwrap();
    // At start, a crash's staging folder goes too.
    setup
        .store
        .remove_unused(&[new.digest()], Leftovers::Remove);
    assert!(!leftover.exists());
    assert_eq!(setup.store_names(), [new.digest()]);
}

/// Right before a source is read into the store it is judged by the rule `run` judged it by at
/// start (`crate::trust`): one a job could have changed since (here a group-writable file, as
/// a tarball might carry) is refused naming the entry and the fix; put right, it is accepted.
#[test]
fn a_source_a_job_could_change_is_not_stored() {
    let setup = Setup::new();
    let source = setup.source();
    let pool = crate::isolate::Pool::new(vec![crate::isolate::Account {
        uid: RUNNER_UID,
        gid: RUNNER_UID,
    }]);
    let err = refuse_changeable(&source, &pool).unwrap_err();
    let said = err.to_string();
    assert!(matches!(err, StoreError::Changeable { .. }), "{said}");
    assert!(
        said.contains(&format!("chmod go-w {}", source.join("bin/f").display())),
        "{said}"
    );
    chmod(&source.join("bin/f"), 0o644);
    chmod(&source.join("config.sh"), 0o755);
    refuse_changeable(&source, &pool).unwrap();
}
