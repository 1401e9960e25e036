//! Tests of the in-root lookups (over a fake root in a tempdir: links resolved inside it,
//! never on the host) and of the pure parts: the loader configuration, the glob, the search
//! order.

use std::os::unix::fs::symlink;

use super::*;

const X86_64: Arch = Arch {
    class: Class::Elf64,
    endian: Endian::Little,
    machine: 62,
};

#[test]
fn the_loader_configuration_parses_as_ldconfig_reads_it() {
    let cases: &[(&str, Vec<ConfLine>)] = &[
        ("", vec![]),
        ("# only a comment\n\n   \n", vec![]),
        (
            "include /etc/ld.so.conf.d/*.conf\n",
            vec![ConfLine::Include(vec!["/etc/ld.so.conf.d/*.conf".into()])],
        ),
        (
            "/usr/local/lib # local\n\tinclude a.conf b/*.conf\nhwcap 0 nosegneg\n/opt/x/lib/\n",
            vec![
                ConfLine::Dir("/usr/local/lib".into()),
                ConfLine::Include(vec!["a.conf".into(), "b/*.conf".into()]),
                ConfLine::Dir("/opt/x/lib/".into()),
            ],
        ),
        // "includes" is a directory's name, not the keyword.
        ("includes\n", vec![ConfLine::Dir("includes".into())]),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_conf(text), want, "{text:?}");
    }
}

#[test]
fn globs_match_as_the_shell_does() {
    let cases = [
        ("*.conf", "libc.conf", true),
        ("*.conf", "libc.conf.bak", false),
        ("*.conf", ".conf", true),
        ("libicuuc.so.*", "libicuuc.so.72", true),
        ("libicuuc.so.*", "libicuuc.so.72.1", true),
        ("libicuuc.so.*", "libicuuc.so", false),
        ("libicuuc.so.*", "libicuuc.a", false),
        ("libssl.so.1.0.*", "libssl.so.1.0.2", true),
        ("libssl.so.1.0.*", "libssl.so.1.1", false),
        ("ld-linux*.so.*", "ld-linux-x86-64.so.2", true),
        ("ld-linux*.so.*", "ld-linux-aarch64.so.1", true),
        ("a?c", "abc", true),
        ("a?c", "ac", false),
        ("*a*b*", "xxaxxbxx", true),
        ("*a*b", "xxaxxbxxc", false),
        ("exact", "exact", true),
        ("exact", "exactly", false),
        ("", "", true),
        ("*", "", true),
    ];
    for (pattern, name, want) in cases {
        assert_eq!(glob_match(pattern, name), want, "{pattern} ~ {name}");
    }
}

#[test]
fn search_dirs_put_the_configuration_first_then_multiarch_then_defaults() {
    let conf = vec!["/opt/a/".to_owned(), "/usr/lib/x86_64-linux-gnu".to_owned()];
    assert_eq!(
        search_dirs(X86_64, &conf),
        [
            "/opt/a",
            "/usr/lib/x86_64-linux-gnu",
            "/lib/x86_64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            "/lib",
            "/usr/lib",
        ]
    );
    let arm64 = Arch {
        machine: 183,
        ..X86_64
    };
    assert_eq!(
        search_dirs(arm64, &[])[..2],
        ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
    );
    // An architecture Debian has no triplet for gets the defaults only.
    let odd = Arch {
        machine: 9999,
        ..X86_64
    };
    assert_eq!(search_dirs(odd, &[]), DEFAULT_DIRS);
}

/// A fake root: merged-usr (`/lib -> usr/lib`), a library behind a chain of links, links
/// that aim out of the root.
fn fake_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    std::fs::create_dir_all(r.join("usr/lib/x86_64-linux-gnu")).unwrap();
    std::fs::create_dir_all(r.join("opt/real")).unwrap();
    std::fs::create_dir_all(r.join("etc/ld.so.conf.d")).unwrap();
    symlink("usr/lib", r.join("lib")).unwrap();
    std::fs::write(r.join("opt/real/libfoo.so.1.2.3"), b"the real foo").unwrap();
    // libfoo.so.1 -> libfoo.so.1.2 (relative) -> /opt/real/libfoo.so.1.2.3 (absolute: in the
    // root, not on the host).
    symlink(
        "libfoo.so.1.2",
        r.join("usr/lib/x86_64-linux-gnu/libfoo.so.1"),
    )
    .unwrap();
    symlink(
        "/opt/real/libfoo.so.1.2.3",
        r.join("usr/lib/x86_64-linux-gnu/libfoo.so.1.2"),
    )
    .unwrap();
    // Links at files the host has and the root lacks.
    symlink("/etc/passwd", r.join("usr/lib/passwd-abs")).unwrap();
    symlink(
        "../../../../../../../../etc/passwd",
        r.join("usr/lib/passwd-dotdot"),
    )
    .unwrap();
    symlink("/proc/self/root/etc/passwd", r.join("usr/lib/passwd-magic")).unwrap();
    symlink("nowhere", r.join("usr/lib/dangling")).unwrap();
    symlink("loop-b", r.join("usr/lib/loop-a")).unwrap();
    symlink("loop-a", r.join("usr/lib/loop-b")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        r.join("usr/lib/fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    dir
}

fn read(root: &Root, path: &str) -> Option<Vec<u8>> {
    root.read_small(path, 1024).unwrap()
}

#[test]
fn lookups_follow_links_inside_the_root_only() {
    assert!(
        Path::new("/etc/passwd").is_file(),
        "the host has /etc/passwd (else this proves nothing)"
    );
    let dir = fake_root();
    let root = Root::open(dir.path()).unwrap();
    let cases: &[(&str, Option<&[u8]>)] = &[
        // Through /lib -> usr/lib and two links, the second absolute.
        ("/lib/x86_64-linux-gnu/libfoo.so.1", Some(b"the real foo")),
        (
            "/usr/lib/x86_64-linux-gnu/libfoo.so.1",
            Some(b"the real foo"),
        ),
        (
            "usr/lib/x86_64-linux-gnu/../x86_64-linux-gnu/libfoo.so.1",
            Some(b"the real foo"),
        ),
        // Would be the host's /etc/passwd if resolved on the host.
        ("/usr/lib/passwd-abs", None),
        ("/usr/lib/passwd-dotdot", None),
        ("/../../../etc/passwd", None),
        ("/usr/lib/passwd-magic", None),
        ("/usr/lib/dangling", None),
        ("/usr/lib/loop-a", None),
        // Not regular files: no answer, and the FIFO is never opened to read (no hang).
        ("/usr/lib", None),
        ("/usr/lib/fifo", None),
        ("/usr/lib/x86_64-linux-gnu/libfoo.so.1/x", None),
    ];
    for (path, want) in cases {
        assert_eq!(read(&root, path).as_deref(), *want, "{path}");
    }
    // Planting the file in the root makes the escaping links resolve to it.
    std::fs::create_dir_all(dir.path().join("etc")).unwrap();
    std::fs::write(dir.path().join("etc/passwd"), b"the image's").unwrap();
    assert_eq!(
        read(&root, "/usr/lib/passwd-abs").as_deref(),
        Some(&b"the image's"[..])
    );
    assert_eq!(
        read(&root, "/usr/lib/passwd-dotdot").as_deref(),
        Some(&b"the image's"[..])
    );
}

#[test]
fn listing_a_directory_inside_the_root() {
    let dir = fake_root();
    let root = Root::open(dir.path()).unwrap();
    assert_eq!(
        root.list_dir("/lib/x86_64-linux-gnu").unwrap(),
        ["libfoo.so.1", "libfoo.so.1.2"]
    );
    assert!(root.list_dir("/nonexistent").unwrap().is_empty());
    // A link to the host's /etc lists the root's /etc.
    symlink("/etc", dir.path().join("hostetc")).unwrap();
    assert_eq!(root.list_dir("/hostetc").unwrap(), ["ld.so.conf.d"]);
}

#[test]
fn the_loader_configuration_is_read_with_its_includes_inside_the_root() {
    let dir = fake_root();
    let r = dir.path();
    std::fs::write(
        r.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n/opt/top\n",
    )
    .unwrap();
    std::fs::write(
        r.join("etc/ld.so.conf.d/b.conf"),
        "/opt/b\ninclude more/*.conf\n",
    )
    .unwrap();
    std::fs::write(r.join("etc/ld.so.conf.d/a.conf"), "# a\n/opt/a\n").unwrap();
    std::fs::write(r.join("etc/ld.so.conf.d/a.conf.dpkg-old"), "/opt/old\n").unwrap();
    std::fs::create_dir_all(r.join("etc/ld.so.conf.d/more")).unwrap();
    std::fs::write(r.join("etc/ld.so.conf.d/more/c.conf"), "/opt/c\n").unwrap();
    // A link to the host's own configuration reads the root's.
    symlink(
        "/etc/ld.so.conf.d/a.conf",
        r.join("etc/ld.so.conf.d/z.conf"),
    )
    .unwrap();
    let root = Root::open(r).unwrap();
    let (dirs, notes) = root.conf_dirs();
    assert_eq!(dirs, ["/opt/a", "/opt/b", "/opt/c", "/opt/a", "/opt/top"]);
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn an_include_loop_is_bounded_and_noted() {
    let dir = fake_root();
    let r = dir.path();
    std::fs::write(r.join("etc/ld.so.conf"), "/opt/top\ninclude ld.so.conf\n").unwrap();
    let (dirs, notes) = Root::open(r).unwrap().conf_dirs();
    assert_eq!(dirs.len(), MAX_CONF_DEPTH + 1);
    assert!(dirs.iter().all(|d| d == "/opt/top"));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("nests deeper"), "{notes:?}");
}

#[test]
fn an_image_without_loader_configuration_has_no_configured_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let (dirs, notes) = Root::open(dir.path()).unwrap().conf_dirs();
    assert!(dirs.is_empty() && notes.is_empty(), "{dirs:?} {notes:?}");
}
