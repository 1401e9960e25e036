//! Tar path safety, on archives built here: some with names a well-behaved `tar` would never
//! write, set byte by byte in the header.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;

use super::*;

/// One entry of a test archive.
enum E {
    Dir(&'static str, u32),
    File(&'static str, u32, &'static [u8]),
    Symlink(&'static str, &'static str),
    Hardlink(&'static str, &'static str),
    Fifo(&'static str),
}

/// A header whose name (and link name) are written raw, so `..` and absolute names get in.
fn header(kind: EntryType, name: &str, link: &str, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_old();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    h
}

fn archive(dir: &Path, entries: &[E]) -> PathBuf {
    let path = dir.join("package.tar.gz");
    let file = File::create(&path).unwrap();
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for e in entries {
        let (h, data): (tar::Header, &[u8]) = match e {
            E::Dir(n, m) => (header(EntryType::Directory, n, "", *m, 0), &[]),
            E::File(n, m, d) => (header(EntryType::Regular, n, "", *m, d.len() as u64), d),
            E::Symlink(n, t) => (header(EntryType::Symlink, n, t, 0o777, 0), &[]),
            E::Hardlink(n, t) => (header(EntryType::Link, n, t, 0o644, 0), &[]),
            E::Fifo(n) => (header(EntryType::Fifo, n, "", 0o644, 0), &[]),
        };
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap().flush().unwrap();
    path
}

/// Unpacks `entries` into `<tmp>/root/pkg/`; returns the result and the temporary directory.
fn unpack_entries(entries: &[E]) -> (Result<(), UnpackError>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let archive = archive(tmp.path(), entries);
    let into = tmp.path().join("root").join("pkg");
    std::fs::create_dir_all(&into).unwrap();
    (unpack(&archive, &into), tmp)
}

#[test]
fn plain_relative_paths_only() {
    assert_eq!(
        safe_relative(Path::new("./bin/Runner.Listener")).unwrap(),
        PathBuf::from("bin/Runner.Listener")
    );
    assert_eq!(safe_relative(Path::new("./")).unwrap(), PathBuf::new());
    for bad in ["/etc/passwd", "../x", "bin/../../x", "bin/.."] {
        assert!(
            matches!(
                safe_relative(Path::new(bad)),
                Err(UnpackError::UnsafePath { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn links_are_resolved_from_their_own_directory() {
    let inside = [
        (
            "externals/node20/bin/npm",
            "../lib/node_modules/npm/bin/npm-cli.js",
        ),
        ("bin/x", "y"),
        ("a/b", ".."),
        ("a/b/c", "./../../d"),
    ];
    for (link, target) in inside {
        assert!(
            link_stays_inside(Path::new(link), Path::new(target)),
            "{link} -> {target}"
        );
    }
    let outside = [
        ("x", ".."),
        ("a/b", "../.."),
        ("a/b", "/etc/passwd"),
        ("a/b", "c/../../../d"),
    ];
    for (link, target) in outside {
        assert!(
            !link_stays_inside(Path::new(link), Path::new(target)),
            "{link} -> {target}"
        );
    }
}

#[test]
fn a_runner_like_package_unpacks_with_its_modes_and_links() {
    let (result, tmp) = unpack_entries(&[
        E::Dir("./", 0o755),
        E::Dir("./bin/", 0o755),
        E::File("./bin/Runner.Listener", 0o4755, b"#!/bin/sh\n"),
        E::File("./run.sh", 0o644, b"run"),
        E::Dir("./externals/node20/bin/", 0o755),
        E::File("./externals/node20/lib/npm-cli.js", 0o644, b"js"),
        E::Symlink("./externals/node20/bin/npm", "../lib/npm-cli.js"),
        E::Hardlink("./run-copy.sh", "./run.sh"),
        E::Dir("./locked/", 0o555),
        E::File("./locked/inside", 0o444, b"x"),
    ]);
    result.unwrap();
    let pkg = tmp.path().join("root").join("pkg");
    let listener = std::fs::metadata(pkg.join("bin/Runner.Listener")).unwrap();
    assert_eq!(
        listener.permissions().mode() & 0o7777,
        0o755,
        "executable, set-uid dropped"
    );
    assert_eq!(
        std::fs::read(pkg.join("externals/node20/bin/npm")).unwrap(),
        b"js"
    );
    assert_eq!(std::fs::read(pkg.join("run-copy.sh")).unwrap(), b"run");
    let locked = std::fs::metadata(pkg.join("locked")).unwrap();
    assert_eq!(
        locked.permissions().mode() & 0o700,
        0o700,
        "the owner can still remove it"
    );
    std::fs::remove_dir_all(&pkg).unwrap();
}

#[test]
fn escaping_names_are_refused_and_nothing_lands_outside() {
    for name in [
        "../evil",
        "./bin/../../evil",
        "/tmp/rm-agent-unpack-test-evil",
    ] {
        let (result, tmp) = unpack_entries(&[E::Dir("./bin/", 0o755), E::File(name, 0o644, b"x")]);
        assert!(
            matches!(result, Err(UnpackError::UnsafePath { .. })),
            "{name}: {result:?}"
        );
        assert!(!tmp.path().join("root").join("evil").exists());
    }
    assert!(!Path::new("/tmp/rm-agent-unpack-test-evil").exists());
}

#[test]
fn links_pointing_outside_are_refused() {
    for target in ["../../../etc", "/etc/passwd", ""] {
        let (result, _tmp) = unpack_entries(&[E::Symlink("./bin/escape", target)]);
        assert!(
            matches!(result, Err(UnpackError::LinkOutside { .. })),
            "{target}: {result:?}"
        );
    }
    let (result, _tmp) = unpack_entries(&[E::Hardlink("./copy", "../../etc/passwd")]);
    assert!(
        matches!(result, Err(UnpackError::LinkOutside { .. })),
        "{result:?}"
    );
}

#[test]
fn nothing_is_written_through_a_link_the_archive_made() {
    // `l` points inside, but a later entry under it could land wherever `l` leads once links
    // are chained; such archives are refused outright.
    let (result, tmp) = unpack_entries(&[
        E::Dir("./d/", 0o755),
        E::Symlink("./l", "d"),
        E::File("./l/x", 0o644, b"x"),
    ]);
    assert!(
        matches!(result, Err(UnpackError::ThroughLink { .. })),
        "{result:?}"
    );
    assert!(!tmp.path().join("root/pkg/d/x").exists());
}

#[test]
fn special_files_are_refused() {
    let (result, _tmp) = unpack_entries(&[E::Fifo("./pipe")]);
    assert!(
        matches!(result, Err(UnpackError::Unsupported { .. })),
        "{result:?}"
    );
}

#[test]
fn a_file_that_is_not_gzip_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.tar.gz");
    std::fs::write(&path, b"not gzip at all").unwrap();
    assert!(matches!(unpack(&path, tmp.path()), Err(UnpackError::Io(_))));
}
