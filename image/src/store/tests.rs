//! Tests of [`super`]: installs that succeed, fail, panic and race; crash leftovers; removal.

use crate::skip;

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::{Arc, Barrier};

use super::*;
use crate::unpack::{UnpackError, apply_layer};

/// Whether the test runs as root; if not, it records the skip (or fails) and the caller returns.
fn as_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    skip::cannot_run(
        test,
        "root",
        "the store is root's (0700, owners of image files kept)",
    );
    false
}

/// A config and its ID.
fn config(text: &str) -> (Vec<u8>, Digest) {
    let bytes = format!(r#"{{"architecture":"amd64","os":"linux","note":"{text}"}}"#).into_bytes();
    let id = Digest::of(&bytes);
    (bytes, id)
}

/// The names in the store directory, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A fill that writes one file and reports one layer.
fn fill_with(text: &'static str) -> impl FnOnce(&Path) -> Result<UnpackReport, io::Error> {
    move |rootfs: &Path| {
        fs::write(rootfs.join("marker"), text)?;
        Ok(UnpackReport {
            layers: 1,
            entries: 1,
            ..UnpackReport::default()
        })
    }
}

#[test]
fn entry_ids_and_leftovers_are_told_from_names() {
    let hex = "a".repeat(64);
    assert!(entry_id(&hex).is_some());
    for name in [
        ".downloads",
        ".staging-x",
        "A".repeat(64).as_str(),
        &"a".repeat(63),
        "lost+found",
        &format!(".{hex}"),
    ] {
        assert_eq!(entry_id(name), None, "{name}");
    }
    for (name, leftover) in [
        (".staging-abc-1-2-3", true),
        (".removing-abc-1-2-3", true),
        (".downloads", false),
        (hex.as_str(), false),
    ] {
        assert_eq!(is_leftover(name), leftover, "{name}");
    }
    assert_ne!(unique(), unique());
}

#[test]
fn install_get_list_and_remove() {
    if !as_root("install_get_list_and_remove") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("images");
    let store = Store::open(&dir).expect("open");
    assert_eq!(lstat_mode(&dir), 0o700);
    let (bytes, id) = config("one");
    assert_eq!(store.get(&id), None);

    let installed = store
        .install(&id, &bytes, fill_with("hello"))
        .expect("install");
    assert_eq!(installed.id, id);
    assert_eq!(installed.dir, dir.join(id.hex()));
    assert_eq!(installed.rootfs, dir.join(id.hex()).join("rootfs"));
    assert_eq!(installed.config_json, bytes);
    assert_eq!(installed.report.layers, 1);
    assert_eq!(
        fs::read_to_string(installed.rootfs.join("marker")).expect("marker"),
        "hello"
    );
    assert_eq!(lstat_mode(&installed.rootfs), 0o755);
    assert_eq!(names_in(&dir), [id.hex()]);
    assert_eq!(
        names_in(&installed.dir),
        ["config.json", "rootfs", "unpack.json"]
    );
    assert_eq!(store.get(&id).as_ref(), Some(&installed));
    assert_eq!(store.list().expect("list"), [id]);

    // Present: returned as it is, the fill not called.
    let again = store
        .install(&id, &bytes, |_: &Path| -> Result<UnpackReport, io::Error> {
            panic!("an installed image was filled again")
        })
        .expect("install again");
    assert_eq!(again, installed);

    // A second store on the same directory sees it (nothing is kept in memory).
    let reopened = Store::open(&dir).expect("reopen");
    assert_eq!(reopened.get(&id).as_ref(), Some(&installed));

    assert!(store.remove(&id).expect("remove"));
    assert_eq!(store.get(&id), None);
    assert_eq!(store.list().expect("list"), Vec::<Digest>::new());
    assert_eq!(names_in(&dir), Vec::<String>::new());
    assert!(!store.remove(&id).expect("remove again"));
}

fn lstat_mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).expect("lstat").permissions().mode() & 0o7777
}

#[test]
fn a_failed_or_panicking_install_leaves_no_entry_and_no_staging() {
    if !as_root("a_failed_or_panicking_install_leaves_no_entry_and_no_staging") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("images");
    let store = Store::open(&dir).expect("open");
    let (bytes, id) = config("fails");

    let err = store
        .install(
            &id,
            &bytes,
            |rootfs: &Path| -> Result<UnpackReport, io::Error> {
                fs::create_dir_all(rootfs.join("half/written"))?;
                fs::write(rootfs.join("half/written/file"), "x")?;
                Err(io::Error::other("the layer's digest did not match"))
            },
        )
        .expect_err("install must fail");
    assert_eq!(err.to_string(), "the layer's digest did not match");
    assert_eq!(store.get(&id), None);
    assert_eq!(names_in(&dir), Vec::<String>::new());

    // An unpack error (a hostile layer) passes through as the caller's error type.
    let mut hostile = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..9].copy_from_slice(b"../escape");
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    hostile.append(&h, &b""[..]).expect("append");
    let layer = hostile.into_inner().expect("tar");
    let err = store
        .install(&id, &bytes, |rootfs: &Path| {
            let mut report = UnpackReport::default();
            apply_layer(rootfs, &layer[..], &mut report)?;
            Ok::<_, UnpackError>(report)
        })
        .expect_err("hostile layer");
    assert!(matches!(err, UnpackError::Unsafe { .. }), "{err:?}");
    assert_eq!(names_in(&dir), Vec::<String>::new());
    assert!(!tmp.path().join("images/escape").exists());

    let panicked = std::panic::catch_unwind(|| {
        store.install(
            &id,
            &bytes,
            |rootfs: &Path| -> Result<UnpackReport, io::Error> {
                fs::write(rootfs.join("partial"), "x")?;
                panic!("the fill panicked")
            },
        )
    });
    assert!(panicked.is_err());
    assert_eq!(names_in(&dir), Vec::<String>::new());

    // A config that is not the id's.
    let (other_bytes, _) = config("another");
    let err = store
        .install(&id, &other_bytes, fill_with("never"))
        .expect_err("mismatched config");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert_eq!(names_in(&dir), Vec::<String>::new());
}

#[test]
fn open_removes_crash_leftovers_but_not_live_ones_or_downloads() {
    if !as_root("open_removes_crash_leftovers_but_not_live_ones_or_downloads") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("images");
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).expect("outside");
    fs::write(outside.join("keep"), "k").expect("keep");
    // An existing directory with the wrong mode is made 0700.
    fs::create_dir(&dir).expect("dir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");

    // What a crash mid-install and mid-removal leaves, links to the outside included.
    let (_, id) = config("crashed");
    let staging = dir.join(format!(".staging-{}-1-2-3", id.hex()));
    fs::create_dir_all(staging.join("rootfs/usr/bin")).expect("staging");
    fs::write(staging.join("rootfs/usr/bin/half"), "x").expect("half");
    std::os::unix::fs::symlink(&outside, staging.join("rootfs/out")).expect("link");
    let removing = dir.join(format!(".removing-{}-4-5-6", id.hex()));
    fs::create_dir_all(removing.join("rootfs/etc")).expect("removing");
    std::os::unix::fs::symlink("../../../../outside", removing.join("rootfs/etc/up"))
        .expect("link");
    // A staging dir another live process holds (its flock), and the registry's downloads.
    let live = dir.join(format!(".staging-{}-7-8-9", id.hex()));
    fs::create_dir(&live).expect("live");
    let held = fs::File::open(&live).expect("open live");
    rustix::fs::flock(&held, FlockOperation::NonBlockingLockExclusive).expect("flock");
    fs::create_dir_all(dir.join(".downloads/partial")).expect("downloads");

    let store = Store::open(&dir).expect("open");
    let live_name = format!(".staging-{}-7-8-9", id.hex());
    assert_eq!(names_in(&dir), [".downloads", live_name.as_str()]);
    assert_eq!(names_in(&outside), ["keep"]);
    assert_eq!(lstat_mode(&dir), 0o700);
    let meta = fs::metadata(&dir).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    assert_eq!(store.list().expect("list"), Vec::<Digest>::new());
    assert_eq!(store.get(&id), None);

    // Once its holder is gone, it is a leftover like the others.
    drop(held);
    drop(Store::open(&dir).expect("reopen"));
    assert_eq!(names_in(&dir), [".downloads"]);
}

#[test]
fn concurrent_installs_of_one_id_give_one_entry() {
    if !as_root("concurrent_installs_of_one_id_give_one_entry") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("images");
    let store = Store::open(&dir).expect("open");
    let (bytes, id) = config("raced");
    // Both fills run before either commits: both find no entry, both fill, one rename wins.
    let both_filling = Arc::new(Barrier::new(2));
    let results: Vec<StoredImage> = std::thread::scope(|s| {
        let handles: Vec<_> = ["first", "second"]
            .into_iter()
            .map(|who| {
                let barrier = Arc::clone(&both_filling);
                let (store, bytes) = (&store, &bytes);
                s.spawn(move || {
                    store
                        .install(&id, bytes, |rootfs: &Path| {
                            fs::write(rootfs.join("who"), who)?;
                            barrier.wait();
                            Ok::<_, io::Error>(UnpackReport::default())
                        })
                        .expect("install")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    assert_eq!(results[0], results[1]);
    let who = fs::read_to_string(results[0].rootfs.join("who")).expect("who");
    assert!(who == "first" || who == "second", "{who}");
    assert_eq!(names_in(&dir), [id.hex()]);
    assert_eq!(names_in(&results[0].rootfs), ["who"]);
}

#[test]
fn an_entry_whose_config_was_altered_is_not_returned() {
    if !as_root("an_entry_whose_config_was_altered_is_not_returned") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("images");
    let store = Store::open(&dir).expect("open");
    let (bytes, id) = config("altered");
    let installed = store.install(&id, &bytes, fill_with("x")).expect("install");
    fs::write(installed.dir.join("config.json"), b"{}").expect("alter");
    assert_eq!(store.get(&id), None);
    // Installing it again is an error naming the fix, not a second unpack.
    let err = store
        .install(&id, &bytes, |_: &Path| -> Result<UnpackReport, io::Error> {
            panic!("an unreadable entry was filled again")
        })
        .expect_err("unreadable entry");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("(remove it)"), "{err}");
    // It is still listed (by name) and can be removed.
    assert_eq!(store.list().expect("list"), [id]);
    assert!(store.remove(&id).expect("remove"));
    assert_eq!(names_in(&dir), Vec::<String>::new());
}

#[test]
fn an_image_unpacked_from_layers_is_installed_with_its_report() {
    if !as_root("an_image_unpacked_from_layers_is_installed_with_its_report") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&tmp.path().join("images")).expect("open");
    let layer = |entries: &[(&str, tar::EntryType, u32, &[u8])]| {
        let mut b = tar::Builder::new(Vec::new());
        for (name, ty, mode, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_path(name).expect("path");
            h.set_entry_type(*ty);
            h.set_mode(*mode);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, *data).expect("append");
        }
        b.into_inner().expect("tar")
    };
    let base = layer(&[
        ("etc/", tar::EntryType::Directory, 0o755, b""),
        (
            "etc/os-release",
            tar::EntryType::Regular,
            0o644,
            b"ID=test\n",
        ),
        ("bin/su", tar::EntryType::Regular, 0o4755, b"su"),
    ]);
    let upper = layer(&[("etc/.wh.os-release", tar::EntryType::Regular, 0o644, b"")]);
    let (bytes, id) = config("layers");
    let installed = store
        .install(&id, &bytes, |rootfs: &Path| {
            let mut report = UnpackReport::default();
            for l in [&base, &upper] {
                apply_layer(rootfs, &l[..], &mut report)?;
            }
            Ok::<_, UnpackError>(report)
        })
        .expect("install");
    assert!(!installed.rootfs.join("etc/os-release").exists());
    assert_eq!(lstat_mode(&installed.rootfs.join("bin/su")), 0o755);
    assert_eq!(installed.report.layers, 2);
    assert_eq!(installed.report.neutralised.len(), 1);
    // The report read back from unpack.json is the one returned at install.
    assert_eq!(store.get(&id).expect("get").report, installed.report);
}
