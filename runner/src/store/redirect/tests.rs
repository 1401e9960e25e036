use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};

use super::*;
use crate::store::{Leftovers, tree_in_use};

/// A user string as the `#US` heap frames it: blob length, UTF-16LE, flag byte 0.
fn us(text: &str) -> Vec<u8> {
    let mut out = framed(text);
    out.push(0);
    out
}

/// Bytes shaped like a worker assembly: a PE's first bytes, other literals around the two the
/// rule rewrites (each once), and filler.
fn worker(literals: &[&str]) -> Vec<u8> {
    let mut out = b"MZ\x90\x00\x03\x00\x00\x00".to_vec();
    out.extend_from_slice(&[0xAB; 300]);
    out.push(0); // the heap's first, empty, blob
    for literal in literals {
        out.extend(us(literal));
    }
    out.extend_from_slice(&[0xCD; 200]);
    out
}

/// The literals the real worker holds around the two the rule rewrites.
const FITTING: [&str; 6] = [
    "ACTIONS_RUNTIME_URL",
    "ACTIONS_CACHE_URL",
    "ACTIONS_ID_TOKEN_REQUEST_URL",
    "ACTIONS_RESULTS_URL",
    "ACTIONS_CACHE_SERVICE_V2",
    "ACTIONS_CACHE_MODE",
];

#[test]
fn the_frame_is_the_compressed_length_then_utf16le() {
    assert_eq!(framed("AB"), [5, b'A', 0, b'B', 0]);
    // 19 units: 39 bytes with the flag, one length byte.
    assert_eq!(framed("ACTIONS_RESULTS_URL")[0], 39);
    let long = "x".repeat(100);
    assert_eq!(&framed(&long)[..2], &[0x80, 201]);
    let longer = "x".repeat(0x2000);
    assert_eq!(&framed(&longer)[..4], &[0xC0, 0, 0x40, 0x01]);
}

#[test]
fn a_fitting_worker_changes_in_the_renamed_characters_only() {
    let bytes = worker(&FITTING);
    let out = derive(WORKER_DLL, &bytes).unwrap();
    assert_eq!(out.len(), bytes.len());
    let changed: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != out[i]).collect();
    // `U` of `URL` (0x55) to `O` (0x4F), one byte in each literal: the low byte of its 17th
    // (`ACTIONS_RESULTS_URL`) and 15th (`ACTIONS_CACHE_URL`) unit.
    let results = occurrences(&bytes, "ACTIONS_RESULTS_URL")[0] + 2 * 16;
    let cache = occurrences(&bytes, "ACTIONS_CACHE_URL")[0] + 2 * 14;
    let mut want = vec![results, cache];
    want.sort_unstable();
    assert_eq!(changed, want);
    assert!(changed.iter().all(|&i| bytes[i] == b'U' && out[i] == b'O'));
    for rewrite in &REWRITES {
        assert_eq!(occurrences(&out, rewrite.from).len(), 0, "{}", rewrite.from);
        assert_eq!(occurrences(&out, rewrite.to).len(), 1, "{}", rewrite.to);
    }
    // The neighbours are untouched.
    for other in [
        "ACTIONS_RUNTIME_URL",
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        "ACTIONS_CACHE_MODE",
    ] {
        assert_eq!(occurrences(&out, other).len(), 1, "{other}");
    }
    // A file the table does not name comes back as it was.
    assert_eq!(derive("bin/Runner.Listener.dll", &bytes).unwrap(), bytes);
}

#[test]
fn the_table_renames_to_the_same_length_and_flag() {
    for rewrite in &REWRITES {
        assert_eq!(rewrite.from.len(), rewrite.to.len(), "{rewrite:?}");
        // Plain ASCII letters and `_`: the flag byte is 0 for both (ECMA-335 §II.24.2.4).
        for text in [rewrite.from, rewrite.to] {
            assert!(
                text.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{text}"
            );
        }
        assert_ne!(rewrite.from, rewrite.to);
    }
}

#[test]
fn a_worker_the_rule_does_not_fit_is_refused_saying_which_string_and_count() {
    let without_cache: Vec<&str> = FITTING
        .iter()
        .copied()
        .filter(|l| *l != "ACTIONS_CACHE_URL")
        .collect();
    let with_orl: Vec<&str> = FITTING
        .iter()
        .copied()
        .chain(["ACTIONS_RESULTS_ORL"])
        .collect();
    // Two literals that contain a name are no occurrence of it; nor is a name framed
    // by a byte that is no flag, nor one without its length byte.
    let mut contained = worker(&[
        "X_ACTIONS_CACHE_URL",
        "ACTIONS_CACHE_URL_X",
        "ACTIONS_RESULTS_URL",
    ]);
    let mut bad_flag = framed("ACTIONS_CACHE_URL");
    bad_flag.push(7);
    contained.extend(bad_flag);
    contained.extend(
        "ACTIONS_CACHE_URL"
            .encode_utf16()
            .flat_map(u16::to_le_bytes),
    );
    contained.push(0);
    let mut twice = worker(&FITTING);
    twice.extend(us("ACTIONS_RESULTS_URL"));
    let cases: Vec<(&str, Vec<u8>, Unfit)> = vec![
        (
            "count 0",
            worker(&without_cache),
            Unfit::Count {
                file: WORKER_DLL,
                string: "ACTIONS_CACHE_URL",
                found: 0,
                expected: 1,
            },
        ),
        (
            "count 2",
            twice,
            Unfit::Count {
                file: WORKER_DLL,
                string: "ACTIONS_RESULTS_URL",
                found: 2,
                expected: 1,
            },
        ),
        (
            "to already there",
            worker(&with_orl),
            Unfit::Taken {
                file: WORKER_DLL,
                string: "ACTIONS_RESULTS_ORL",
                found: 1,
            },
        ),
        (
            "only longer literals",
            contained,
            Unfit::Count {
                file: WORKER_DLL,
                string: "ACTIONS_CACHE_URL",
                found: 0,
                expected: 1,
            },
        ),
        (
            "no assembly at all",
            Vec::new(),
            Unfit::Count {
                file: WORKER_DLL,
                string: "ACTIONS_RESULTS_URL",
                found: 0,
                expected: 1,
            },
        ),
    ];
    for (name, bytes, want) in cases {
        assert_eq!(derive(WORKER_DLL, &bytes), Err(want.clone()), "{name}");
        assert!(want.to_string().contains("ACTIONS_"), "{name}: {want}");
    }
}

#[test]
fn a_longer_literal_containing_a_name_is_left_as_it_is() {
    let mut literals = FITTING.to_vec();
    literals.extend(["MY_ACTIONS_CACHE_URL", "ACTIONS_RESULTS_URL_V2"]);
    let bytes = worker(&literals);
    let out = derive(WORKER_DLL, &bytes).unwrap();
    assert_eq!(occurrences(&out, "MY_ACTIONS_CACHE_URL").len(), 1);
    assert_eq!(occurrences(&out, "ACTIONS_RESULTS_URL_V2").len(), 1);
    assert_eq!((0..bytes.len()).filter(|&i| bytes[i] != out[i]).count(), 2);
}

#[test]
fn a_package_without_the_file_or_unreadable_is_unfit() {
    assert_eq!(
        derive_package(|_| Ok(None)),
        Err(Unfit::Missing { file: WORKER_DLL })
    );
    assert_eq!(
        derive_package(|_| Err("permission denied".into())),
        Err(Unfit::Unreadable {
            file: WORKER_DLL,
            why: "permission denied".into()
        })
    );
    let derived = derive_package(|_| Ok(Some(worker(&FITTING)))).unwrap();
    assert_eq!(derived.len(), 1);
    assert_eq!(derived[0].0, WORKER_DLL);
}

#[test]
fn derived_names_belong_to_their_base() {
    let digest = "ab".repeat(32);
    assert!(is_derived_of(
        format!("{digest}+{DERIVATION}").as_bytes(),
        &digest
    ));
    assert!(!is_derived_of(
        format!("{digest}+cache-redirect-v0").as_bytes(),
        &digest
    ));
    assert!(!is_derived_of(digest.as_bytes(), &digest));
    assert_eq!(base_of(&format!("{digest}+{DERIVATION}")), digest);
    assert_eq!(base_of(&digest), digest);
    assert_eq!(short(&digest), "abababababab");
}

// The store: a derived tree made from a stored package.

fn write(path: &Path, content: &[u8], mode: u32) {
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A small package shaped like actions/runner's, its worker assembly being `dll`.
fn make_package(dir: &Path, dll: &[u8]) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("externals/node20/bin")).unwrap();
    write(&dir.join("config.sh"), b"#!/bin/sh\necho config\n", 0o755);
    write(&dir.join("bin/Runner.Listener"), b"\x7fELF listener", 0o755);
    write(&dir.join("bin/Runner.Worker.dll"), dll, 0o644);
    write(&dir.join("bin/Lib.dll"), &[7u8; 70_000], 0o644);
    write(&dir.join("externals/node20/bin/node"), b"node", 0o755);
    symlink("node", dir.join("externals/node20/bin/nodejs")).unwrap();
}

struct Setup {
    dir: tempfile::TempDir,
    store: Store,
}

impl Setup {
    fn new(dll: &[u8]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_package(&dir.path().join("package"), dll);
        let store = Store::open(&dir.path().join("root")).unwrap();
        Self { dir, store }
    }

    fn install(&self) -> StoredPackage {
        self.store
            .install(&self.dir.path().join("package"))
            .unwrap()
    }

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

fn ino(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).unwrap().ino()
}

fn derived_name(package: &StoredPackage) -> String {
    format!("{}+{DERIVATION}", package.digest())
}

#[test]
fn a_fitting_package_is_derived_once_and_runtimes_link_from_it() {
    let setup = Setup::new(&worker(&FITTING));
    let base = setup.install();
    assert_eq!(base.redirect_fits(), Ok(()));
    let derived = base.redirected().unwrap();
    assert!(derived.is_redirected());
    assert!(!base.is_redirected());
    assert_eq!(derived.digest(), derived_name(&base));
    assert_eq!(setup.store_names(), [base.digest(), derived_name(&base)]);
    // Its own manifest on disk, the base's but for the worker's hash.
    let on_disk: Manifest = serde_json::from_slice(
        &std::fs::read(
            setup
                .store
                .dir()
                .join(derived_name(&base))
                .join(MANIFEST_FILE),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(on_disk, *derived.manifest());
    for (b, d) in base
        .manifest()
        .entries
        .iter()
        .zip(&derived.manifest().entries)
    {
        assert_eq!((&b.path, b.size, b.mode), (&d.path, d.size, d.mode));
        assert_eq!(b.sha256 == d.sha256, b.path != WORKER_DLL, "{}", b.path);
    }
    derived.verify().unwrap();

    let runtime = setup.runtime("0123456789ab");
    derived.link_into(&runtime).unwrap();
    derived.verify_runtime(&runtime).unwrap();
    // The runtime's worker has the renamed literals; the stored one is as GitHub shipped it.
    let linked = std::fs::read(runtime.join(WORKER_DLL)).unwrap();
    let stored = std::fs::read(base.tree().join(WORKER_DLL)).unwrap();
    for rewrite in &REWRITES {
        assert_eq!(occurrences(&linked, rewrite.to).len(), 1);
        assert_eq!(occurrences(&linked, rewrite.from).len(), 0);
        assert_eq!(occurrences(&stored, rewrite.from).len(), 1);
    }
    let meta = std::fs::symlink_metadata(derived.tree().join(WORKER_DLL)).unwrap();
    assert_eq!(meta.mode() & 0o7777, manifest::FILE_MODE);
    assert_ne!(meta.ino(), ino(&base.tree().join(WORKER_DLL)));
    // Every other file is the stored inode: no byte copied.
    for entry in &base.manifest().entries {
        if entry.kind == EntryKind::File && entry.path != WORKER_DLL {
            assert_eq!(
                ino(&runtime.join(&entry.path)),
                ino(&base.tree().join(&entry.path)),
                "{}",
                entry.path
            );
        }
    }
    // A runtime of the base is not one of the derived package.
    assert!(base.verify_runtime(&runtime).is_err());

    // Asked again: the same tree, not rebuilt; also by a fresh handle (a restarted agent),
    // which verifies it from disk.
    let again = base.redirected().unwrap();
    assert_eq!(ino(&again.tree().join(WORKER_DLL)), meta.ino());
    let fresh = setup.install().redirected().unwrap();
    assert_eq!(ino(&fresh.tree().join(WORKER_DLL)), meta.ino());
    fresh.verify_runtime(&runtime).unwrap();
    // The derived package of a derived package is itself.
    assert_eq!(derived.redirected().unwrap().tree(), derived.tree());
}

#[test]
fn a_package_whose_count_differs_is_refused_and_nothing_is_derived() {
    let mut dll = worker(&FITTING);
    dll.extend(us("ACTIONS_CACHE_URL"));
    let setup = Setup::new(&dll);
    let base = setup.install();
    let unfit = Unfit::Count {
        file: WORKER_DLL,
        string: "ACTIONS_CACHE_URL",
        found: 2,
        expected: 1,
    };
    assert_eq!(base.redirect_fits(), Err(unfit.clone()));
    match base.redirected() {
        Err(RedirectError::Unfit {
            package,
            unfit: got,
        }) => {
            assert_eq!(got, unfit);
            assert_eq!(package, short(&base.digest()));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(setup.store_names(), [base.digest()]);
    assert_eq!(source_fits(&setup.dir.path().join("package")), Err(unfit));
}

#[test]
fn a_package_without_a_worker_is_refused() {
    let setup = Setup::new(b"");
    std::fs::remove_file(setup.dir.path().join("package").join(WORKER_DLL)).unwrap();
    let base = setup.install();
    assert_eq!(
        base.redirect_fits(),
        Err(Unfit::Missing { file: WORKER_DLL })
    );
    assert!(matches!(
        base.redirected(),
        Err(RedirectError::Unfit {
            unfit: Unfit::Missing { .. },
            ..
        })
    ));
    assert_eq!(setup.store_names(), [base.digest()]);
    // A link in its place is not followed.
    symlink("Lib.dll", setup.dir.path().join("package").join(WORKER_DLL)).unwrap();
    assert_eq!(
        source_fits(&setup.dir.path().join("package")),
        Err(Unfit::Missing { file: WORKER_DLL })
    );
}

#[test]
fn a_derivation_a_crash_left_in_staging_is_cleaned_and_built() {
    let setup = Setup::new(&worker(&FITTING));
    let base = setup.install();
    let staging = setup
        .store
        .dir()
        .join(format!("{STAGING_PREFIX}{}", derived_name(&base)));
    std::fs::create_dir_all(staging.join("tree/bin")).unwrap();
    std::fs::write(staging.join("tree/bin/Runner.Worker.dll"), b"half").unwrap();
    let derived = base.redirected().unwrap();
    assert!(!staging.exists());
    assert_eq!(setup.store_names(), [base.digest(), derived_name(&base)]);
    derived.verify().unwrap();
}

#[test]
fn a_changed_derived_tree_is_built_again() {
    let setup = Setup::new(&worker(&FITTING));
    let base = setup.install();
    let derived = base.redirected().unwrap();
    let dll = derived.tree().join(WORKER_DLL);
    let old = ino(&dll);
    // Rewritten in place as a job with the agent's uid could: the same inode, other bytes.
    std::fs::set_permissions(&dll, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&dll).unwrap();
    bytes[0] = b'X';
    std::fs::write(&dll, &bytes).unwrap();
    std::fs::set_permissions(&dll, std::fs::Permissions::from_mode(0o444)).unwrap();
    // Held open, so the file system cannot give its inode number to the rebuilt file.
    let _tampered = std::fs::File::open(&dll).unwrap();
    // The handle that made it notices (the rewritten file is hashed on every call) ...
    let rebuilt = base.redirected().unwrap();
    assert_ne!(ino(&rebuilt.tree().join(WORKER_DLL)), old);
    assert_ne!(
        std::fs::read(rebuilt.tree().join(WORKER_DLL)).unwrap(),
        bytes
    );
    rebuilt.verify().unwrap();
    // ... and so does a fresh one, for a linked file replaced by a copy.
    let lib = rebuilt.tree().join("bin/Lib.dll");
    let dir = rebuilt.tree().join("bin");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(&lib).unwrap();
    write(&lib, &[7u8; 70_000], 0o444);
    let fresh = setup.install().redirected().unwrap();
    assert_eq!(
        ino(&fresh.tree().join("bin/Lib.dll")),
        ino(&base.tree().join("bin/Lib.dll"))
    );
    fresh.verify().unwrap();
}

#[test]
fn cleanup_keeps_a_derived_tree_with_its_base_and_removes_them_together() {
    let setup = Setup::new(&worker(&FITTING));
    let old = setup.install();
    let derived = old.redirected().unwrap();
    // Its base kept: the derived tree stays, also at start; an older derivation goes.
    let stale = setup
        .store
        .dir()
        .join(format!("{}+cache-redirect-v0", old.digest()));
    std::fs::create_dir_all(stale.join("tree")).unwrap();
    let removed = setup
        .store
        .remove_unused(&[old.digest()], Leftovers::Remove);
    assert_eq!(removed, [format!("{}+cache-redirect-v0", old.digest())]);
    assert_eq!(setup.store_names(), [old.digest(), derived_name(&old)]);
    // The base and its derivation link each other's files, but no runtime does.
    assert!(!tree_in_use(old.tree()));
    assert!(!tree_in_use(derived.tree()));

    // A runtime linked from the derived tree keeps both while a new package is current.
    let runtime = setup.runtime("0123456789ab");
    derived.link_into(&runtime).unwrap();
    assert!(tree_in_use(old.tree()));
    assert!(tree_in_use(derived.tree()));
    std::fs::write(setup.dir.path().join("package/bin/new.dll"), b"new").unwrap();
    let new = setup
        .store
        .install_beside(&setup.dir.path().join("package"))
        .unwrap();
    assert!(
        setup
            .store
            .remove_unused(&[new.digest()], Leftovers::Keep)
            .is_empty()
    );
    derived.verify_runtime(&runtime).unwrap();

    // The runtime gone, both go.
    std::fs::remove_dir_all(&runtime).unwrap();
    let mut removed = setup.store.remove_unused(&[new.digest()], Leftovers::Keep);
    removed.sort();
    assert_eq!(removed, [old.digest(), derived_name(&old)]);
    assert_eq!(setup.store_names(), [new.digest()]);
}

#[test]
fn a_runtime_being_made_from_the_derived_package_holds_its_base() {
    let setup = Setup::new(&worker(&FITTING));
    let base = setup.install();
    let before = base.holders();
    let derived = base.redirected().unwrap();
    assert_eq!(base.holders(), before + 1);
    drop(derived);
    assert_eq!(base.holders(), before);
}
