//! Tests of [`super`]: the pure decisions as tables, then real layers (tars built here, hostile
//! ones byte by byte) applied as root onto temporary roots, with the host around them checked.

use crate::skip;

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use tar::EntryType;

use super::beneath::{parse_decimal, parse_pax_time};
use super::*;

/// The mtime the test layers give their entries.
const MTIME: u64 = 1_600_000_000;

/// A layer built entry by entry; names and link targets written byte for byte into the header
/// (the tar crate's own setters refuse `..`, which the hostile layers need).
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Layer {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn raw(
        &mut self,
        name: &str,
        ty: EntryType,
        mode: u32,
        owner: (u64, u64),
        link: &str,
        data: &[u8],
    ) -> &mut Layer {
        let mut h = tar::Header::new_gnu();
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_uid(owner.0);
        h.set_gid(owner.1);
        h.set_mtime(MTIME);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.0.append(&h, data).expect("append");
        self
    }

    fn dir(&mut self, name: &str) -> &mut Layer {
        self.raw(name, EntryType::Directory, 0o755, (0, 0), "", b"")
    }

    fn file(&mut self, name: &str, data: &str) -> &mut Layer {
        self.raw(name, EntryType::Regular, 0o644, (0, 0), "", data.as_bytes())
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Layer {
        self.raw(name, EntryType::Symlink, 0o777, (0, 0), target, b"")
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Layer {
        self.raw(name, EntryType::Link, 0o644, (0, 0), target, b"")
    }

    fn device(&mut self, name: &str, ty: EntryType, major: u32, minor: u32) -> &mut Layer {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).expect("path");
        h.set_entry_type(ty);
        h.set_mode(0o666);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h.set_size(0);
        h.set_device_major(major).expect("major");
        h.set_device_minor(minor).expect("minor");
        h.set_cksum();
        self.0.append(&h, &b""[..]).expect("append");
        self
    }

    fn pax(&mut self, ext: &[(&str, &[u8])]) -> &mut Layer {
        self.0
            .append_pax_extensions(ext.iter().copied())
            .expect("pax");
        self
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().expect("finish")
    }
}

/// Whether the test runs as root; if not, it records the skip (or fails) and the caller returns.
fn as_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    skip::cannot_run(
        test,
        "root",
        "unpacking keeps owners and makes entries of other uids, which needs root",
    );
    false
}

/// A fresh root inside a fresh temporary directory (whose other contents are "the host").
fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
    let host = tempfile::tempdir().expect("tempdir");
    let root = host.path().join("root");
    fs::create_dir(&root).expect("root");
    (host, root)
}

fn apply(root: &Path, layer: Layer, report: &mut UnpackReport) -> Result<(), UnpackError> {
    apply_layer(root, &layer.bytes()[..], report)
}

fn lstat(p: &Path) -> fs::Metadata {
    fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn components_drop_dots_and_refuse_parents_and_absolute_names() {
    let ok: &[(&str, &[&str])] = &[
        ("usr/bin/ls", &["usr", "bin", "ls"]),
        ("./usr//bin/./ls", &["usr", "bin", "ls"]),
        ("./", &[]),
        (".", &[]),
        ("etc/", &["etc"]),
        ("..a/b..", &["..a", "b.."]),
    ];
    for (raw, want) in ok {
        let got = components(raw.as_bytes()).expect(raw);
        let want: Vec<&[u8]> = want.iter().map(|s| s.as_bytes()).collect();
        assert_eq!(got, want, "{raw}");
    }
    let refused = ["../x", "a/../../x", "a/..", "/etc/passwd", "//x", "./../x"];
    for raw in refused {
        assert!(components(raw.as_bytes()).is_err(), "{raw} was accepted");
    }
    assert!(components("a/".repeat(MAX_NAME_LEN).as_bytes()).is_err());
}

#[test]
fn plan_tells_entries_whiteouts_and_opaque_markers_apart() {
    let e = |s: &'static str| -> Vec<&'static [u8]> {
        s.split('/')
            .filter(|c| !c.is_empty())
            .map(str::as_bytes)
            .collect()
    };
    let table: &[(&str, Planned<'static>)] = &[
        ("a/b", Planned::Entry(e("a/b"))),
        ("./", Planned::Entry(vec![])),
        (
            "a/.wh.b",
            Planned::Whiteout {
                dir: e("a"),
                name: b"b",
            },
        ),
        (
            ".wh.top",
            Planned::Whiteout {
                dir: vec![],
                name: b"top",
            },
        ),
        ("a/b/.wh..wh..opq", Planned::Opaque(e("a/b"))),
        (".wh..wh..opq", Planned::Opaque(vec![])),
        ("a/.wh..wh.plnk", Planned::Ignore),
        ("a/.wh..wh.aufs", Planned::Ignore),
        // A whiteout prefix on a directory name is just a name.
        (".wh.x/y", Planned::Entry(e(".wh.x/y"))),
    ];
    for (raw, want) in table {
        assert_eq!(plan(raw.as_bytes()).as_ref(), Ok(want), "{raw}");
    }
    for raw in ["a/.wh.", "a/.wh..", "../.wh.x", "/.wh.x"] {
        assert!(plan(raw.as_bytes()).is_err(), "{raw} was accepted");
    }
}

#[test]
fn kept_mode_clears_setid_on_files_only_and_keeps_sticky() {
    let table = [
        (0o755, false, 0o755, false),
        (0o4755, false, 0o755, true),
        (0o2755, false, 0o755, true),
        (0o6711, false, 0o711, true),
        (0o1777, true, 0o1777, false),
        (0o2775, true, 0o2775, false),
        (0o4755, true, 0o755, false),
        (0o1644, false, 0o1644, false),
        (0o100644, false, 0o644, false),
    ];
    for (mode, is_dir, want, cleared) in table {
        assert_eq!(
            kept_mode(mode, is_dir),
            (want, cleared),
            "{mode:o} dir={is_dir}"
        );
    }
}

#[test]
fn pax_numbers_and_times_parse() {
    assert_eq!(parse_decimal(b"1000"), Some(1000));
    assert_eq!(parse_decimal(b""), None);
    assert_eq!(parse_decimal(b"-1"), None);
    assert_eq!(parse_decimal(b"1e3"), None);
    let table: &[(&str, Option<(i64, u32)>)] = &[
        ("1700000000", Some((1_700_000_000, 0))),
        ("1700000000.25", Some((1_700_000_000, 250_000_000))),
        ("1.123456789123", Some((1, 123_456_789))),
        ("-1.25", Some((-2, 750_000_000))),
        ("-3", Some((-3, 0))),
        ("1.x", None),
        ("", None),
        ("abc", None),
    ];
    for (raw, want) in table {
        assert_eq!(parse_pax_time(raw.as_bytes()), *want, "{raw}");
    }
}

#[test]
fn whiteouts_and_opaque_directories_across_two_layers() {
    if !as_root("whiteouts_and_opaque_directories_across_two_layers") {
        return;
    }
    let (_host, root) = scratch();
    let mut report = UnpackReport::default();
    let mut base = Layer::new();
    base.dir("a/")
        .file("a/keep", "k")
        .file("a/gone", "g")
        .dir("a/gonedir/")
        .file("a/gonedir/inside", "i")
        .dir("o/")
        .file("o/lower", "l")
        .dir("o/sub/")
        .file("o/sub/deep", "d")
        .symlink("o/link", "/a");
    apply(&root, base, &mut report).expect("base layer");

    let mut upper = Layer::new();
    upper
        .file("a/.wh.gone", "")
        .file("a/.wh.gonedir", "")
        // A whiteout of a name that is not there is no error.
        .file("a/.wh.never", "")
        // The same layer's entry is not hidden by its own whiteout (before or after it).
        .file("a/same", "s")
        .file("a/.wh.same", "")
        .file("o/new", "n")
        .dir("o/sub/")
        .file("o/.wh..wh..opq", "")
        .file("o/sub/newdeep", "nd")
        .file("a/.wh..wh.plnk", "");
    apply(&root, upper, &mut report).expect("upper layer");

    assert_eq!(names_in(&root.join("a")), ["keep", "same"]);
    assert_eq!(names_in(&root.join("o")), ["new", "sub"]);
    assert_eq!(names_in(&root.join("o/sub")), ["newdeep"]);
    assert_eq!(report.layers, 2);
    assert_eq!(report.entries, 10 + 10);
    assert!(report.neutralised.is_empty(), "{report:?}");
}

#[test]
fn hard_links_within_and_across_layers() {
    if !as_root("hard_links_within_and_across_layers") {
        return;
    }
    let (host, root) = scratch();
    let mut report = UnpackReport::default();
    let mut base = Layer::new();
    base.dir("bin/").file("bin/busybox", "bb");
    apply(&root, base, &mut report).expect("base");
    let mut upper = Layer::new();
    upper
        .hardlink("bin/sh", "bin/busybox")
        .hardlink("./bin/ls", "./bin/busybox")
        .dir("usr/")
        .symlink("usr/bin", "../bin")
        // The target resolved through a symlinked parent, inside the root.
        .hardlink("cat", "usr/bin/busybox")
        // A link to itself leaves the file as it is.
        .hardlink("bin/busybox", "bin/busybox");
    apply(&root, upper, &mut report).expect("upper");
    let ino = lstat(&root.join("bin/busybox")).ino();
    for name in ["bin/sh", "bin/ls", "cat"] {
        assert_eq!(lstat(&root.join(name)).ino(), ino, "{name}");
    }
    assert_eq!(lstat(&root.join("bin/busybox")).nlink(), 4);
    assert_eq!(
        fs::read_to_string(root.join("bin/busybox")).expect("read"),
        "bb"
    );

    // A target with `..` is refused (even one that would stay inside), as is an absolute one.
    fs::write(host.path().join("secret"), "host").expect("secret");
    for target in ["../secret", "bin/../../secret", "/etc/passwd"] {
        let mut l = Layer::new();
        l.hardlink("stolen", target);
        match apply(&root, l, &mut report) {
            Err(UnpackError::Unsafe { entry, .. }) => assert_eq!(entry, "stolen"),
            other => panic!("a hard link to {target} gave {other:?}"),
        }
        assert!(!exists(&root.join("stolen")));
    }
    assert_eq!(lstat(&host.path().join("secret")).nlink(), 1);
}

#[test]
fn fifos_are_kept_and_devices_skipped_and_reported() {
    if !as_root("fifos_are_kept_and_devices_skipped_and_reported") {
        return;
    }
    let (_host, root) = scratch();
    let mut report = UnpackReport::default();
    let mut base = Layer::new();
    base.dir("dev/")
        .file("dev/sda", "a file the device replaces");
    apply(&root, base, &mut report).expect("base");
    let mut upper = Layer::new();
    upper
        .raw("run/initctl", EntryType::Fifo, 0o600, (0, 0), "", b"")
        .device("dev/null", EntryType::Char, 1, 3)
        .device("dev/sda", EntryType::Block, 8, 0)
        .hardlink("dev/null2", "dev/null");
    apply(&root, upper, &mut report).expect("upper");

    let fifo = lstat(&root.join("run/initctl"));
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.mode() & 0o7777, 0o600);
    assert_eq!(names_in(&root.join("dev")), Vec::<String>::new());
    let what: Vec<(u32, &str, &Neutralisation)> = report
        .neutralised
        .iter()
        .map(|n| (n.layer, n.path.as_str(), &n.what))
        .collect();
    assert_eq!(
        what,
        [
            (
                1,
                "dev/null",
                &Neutralisation::DeviceSkipped {
                    block: false,
                    major: 1,
                    minor: 3
                }
            ),
            (
                1,
                "dev/sda",
                &Neutralisation::DeviceSkipped {
                    block: true,
                    major: 8,
                    minor: 0
                }
            ),
            (
                1,
                "dev/null2",
                &Neutralisation::LinkToSkippedDevice {
                    target: "dev/null".to_owned()
                }
            ),
        ]
    );
}

#[test]
fn owners_modes_and_mtimes_are_kept_and_setid_cleared() {
    if !as_root("owners_modes_and_mtimes_are_kept_and_setid_cleared") {
        return;
    }
    let (_host, root) = scratch();
    let mut report = UnpackReport::default();
    let mut l = Layer::new();
    l.raw("./", EntryType::Directory, 0o751, (0, 0), "", b"")
        .raw("tmp/", EntryType::Directory, 0o1777, (0, 0), "", b"")
        .raw("var/mail/", EntryType::Directory, 0o2775, (0, 8), "", b"")
        .raw("bin/su", EntryType::Regular, 0o4755, (0, 0), "", b"su")
        .raw("bin/wall", EntryType::Regular, 0o2755, (0, 5), "", b"wall")
        .raw(
            "home/u/f",
            EntryType::Regular,
            0o640,
            (1234, 5678),
            "",
            b"x",
        )
        .raw(
            "home/u/l",
            EntryType::Symlink,
            0o777,
            (1234, 5678),
            "f",
            b"",
        )
        .file(
            "tmp/child",
            "makes tmp's mtime change until it is set at the end",
        )
        // Pax uid/gid win over the header's; attributes are ignored and reported.
        .pax(&[
            ("uid", b"3000000000"),
            ("gid", b"70000"),
            ("mtime", b"1500000000.5"),
            ("SCHILY.xattr.security.capability", b"\x01\x00\x00\x02"),
            ("SCHILY.xattr.user.note", b"hi"),
        ])
        .raw("bin/ping", EntryType::Regular, 0o755, (0, 0), "", b"ping");
    apply(&root, l, &mut report).expect("layer");

    let mode = |p: &str| lstat(&root.join(p)).mode() & 0o7777;
    assert_eq!(lstat(&root).mode() & 0o7777, 0o751);
    assert_eq!(mode("tmp"), 0o1777);
    assert_eq!(mode("var/mail"), 0o2775);
    assert_eq!(mode("bin/su"), 0o755);
    assert_eq!(mode("bin/wall"), 0o755);
    assert_eq!(mode("home/u/f"), 0o640);
    // Parents the layer did not list: root's, 0755.
    assert_eq!(mode("home"), 0o755);
    for (p, uid, gid) in [
        ("home/u/f", 1234, 5678),
        ("home/u/l", 1234, 5678),
        ("var/mail", 0, 8),
        ("bin/ping", 3_000_000_000, 70000),
    ] {
        let m = lstat(&root.join(p));
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
    }
    assert!(lstat(&root.join("home/u/l")).file_type().is_symlink());
    for p in ["tmp", "bin/su", "home/u/l", "tmp/child"] {
        assert_eq!(lstat(&root.join(p)).mtime(), MTIME as i64, "{p}");
    }
    let ping = lstat(&root.join("bin/ping"));
    assert_eq!(
        (ping.mtime(), ping.mtime_nsec()),
        (1_500_000_000, 500_000_000)
    );
    assert_eq!(
        report.neutralised,
        [
            Neutralised {
                layer: 0,
                path: "bin/su".to_owned(),
                what: Neutralisation::SetIdCleared { mode: 0o4755 },
            },
            Neutralised {
                layer: 0,
                path: "bin/wall".to_owned(),
                what: Neutralisation::SetIdCleared { mode: 0o2755 },
            },
            Neutralised {
                layer: 0,
                path: "bin/ping".to_owned(),
                what: Neutralisation::XattrsIgnored {
                    names: vec!["security.capability".to_owned(), "user.note".to_owned()],
                },
            },
        ]
    );
    // The report is what the store keeps as JSON: it round-trips.
    let json = serde_json::to_string(&report).expect("json");
    assert!(json.contains(r#""kind":"set_id_cleared""#), "{json}");
    assert_eq!(
        serde_json::from_str::<UnpackReport>(&json).expect("parse"),
        report
    );
}

#[test]
fn traversal_is_refused_and_the_host_untouched() {
    if !as_root("traversal_is_refused_and_the_host_untouched") {
        return;
    }
    let (host, root) = scratch();
    let absolute = host.path().join("absolute-escape");
    let absolute_name = absolute.to_str().expect("utf-8").to_owned();
    let cases: Vec<(String, EntryType)> = vec![
        ("../escape".to_owned(), EntryType::Regular),
        ("a/../../escape".to_owned(), EntryType::Regular),
        ("./../escape".to_owned(), EntryType::Directory),
        ("../escape".to_owned(), EntryType::Symlink),
        (absolute_name.clone(), EntryType::Regular),
        ("../.wh.root".to_owned(), EntryType::Regular),
    ];
    for (name, ty) in cases {
        let mut l = Layer::new();
        l.file("before", "b")
            .raw(&name, ty, 0o644, (0, 0), "x", b"data");
        let mut report = UnpackReport::default();
        match apply(&root, l, &mut report) {
            Err(UnpackError::Unsafe { entry, why }) => {
                assert_eq!(entry, name);
                assert!(!why.is_empty());
            }
            other => panic!("{name} gave {other:?}"),
        }
        assert_eq!(names_in(host.path()), ["root"], "after {name}");
    }
    assert!(!exists(&absolute));
}

#[test]
fn writes_through_planted_symlinks_land_inside_the_root() {
    if !as_root("writes_through_planted_symlinks_land_inside_the_root") {
        return;
    }
    // A real host directory the layer names by its absolute path; it must stay empty.
    let marker = tempfile::tempdir().expect("marker dir");
    let marker_path = marker.path().to_str().expect("utf-8").to_owned();
    let inside = marker_path.trim_start_matches('/').to_owned();
    let (host, root) = scratch();
    let mut report = UnpackReport::default();
    let mut base = Layer::new();
    base.dir(&format!("{inside}/"))
        .symlink("etc", &marker_path)
        .symlink("evil", "../../..")
        .symlink("slash", "/")
        .symlink("dot", ".");
    apply(&root, base, &mut report).expect("base");
    let mut upper = Layer::new();
    upper
        .file("etc/passwd", "root::0:0")
        .file("evil/up", "u")
        .file("slash/down", "d")
        .file("dot/dot/dot/x", "x")
        .dir("evil/tmp/")
        .hardlink("evil/hl", "etc/passwd")
        .file("etc/.wh.nothing", "");
    apply(&root, upper, &mut report).expect("upper");

    assert_eq!(
        fs::read_to_string(root.join(&inside).join("passwd")).expect("inside"),
        "root::0:0"
    );
    assert_eq!(
        lstat(&root.join("hl")).ino(),
        lstat(&root.join(&inside).join("passwd")).ino()
    );
    for name in ["up", "down", "x", "tmp"] {
        assert!(exists(&root.join(name)), "{name} not at the root");
    }
    assert_eq!(names_in(marker.path()), Vec::<String>::new());
    assert_eq!(names_in(host.path()), ["root"]);

    // A symlink to a host directory the image lacks: the write fails, nothing is made there.
    let absent = tempfile::tempdir().expect("absent dir");
    let mut l = Layer::new();
    l.symlink("dangling", absent.path().to_str().expect("utf-8"))
        .file("dangling/f", "f");
    match apply(&root, l, &mut report) {
        Err(UnpackError::Write { entry, .. }) => assert_eq!(entry, "dangling/f"),
        other => panic!("writing through a dangling link gave {other:?}"),
    }
    assert_eq!(names_in(absent.path()), Vec::<String>::new());

    // An entry over a symlink replaces the symlink, never writes through it.
    let mut l = Layer::new();
    l.symlink("over", &format!("{marker_path}/victim"))
        .file("over", "replaced")
        .symlink("overdir", &marker_path)
        .dir("overdir/");
    apply(&root, l, &mut report).expect("replacing links");
    assert_eq!(
        fs::read_to_string(root.join("over")).expect("over"),
        "replaced"
    );
    assert!(lstat(&root.join("overdir")).is_dir());
    assert_eq!(names_in(marker.path()), Vec::<String>::new());
}

#[test]
fn a_directory_replaced_by_a_file_and_a_file_by_a_directory() {
    if !as_root("a_directory_replaced_by_a_file_and_a_file_by_a_directory") {
        return;
    }
    let (host, root) = scratch();
    let outside = host.path().join("outside");
    fs::create_dir(&outside).expect("outside");
    fs::write(outside.join("keep"), "k").expect("keep");
    let mut report = UnpackReport::default();
    let mut base = Layer::new();
    base.dir("d/")
        .dir("d/sub/")
        .file("d/sub/x", "x")
        .symlink("d/up", "../../outside")
        .symlink("d/abs", outside.to_str().expect("utf-8"))
        .file("f", "file")
        .dir("real/")
        .file("real/keep", "k")
        .dir("victim/")
        .symlink("victim/link", "../real");
    apply(&root, base, &mut report).expect("base");
    let mut upper = Layer::new();
    upper
        .file("d", "now a file")
        .dir("f/")
        .file("f/inner", "i")
        .file("victim", "replaces the tree, not what its link points to");
    apply(&root, upper, &mut report).expect("upper");

    assert_eq!(fs::read_to_string(root.join("d")).expect("d"), "now a file");
    assert!(lstat(&root.join("f")).is_dir());
    assert_eq!(names_in(&root.join("f")), ["inner"]);
    assert!(lstat(&root.join("victim")).is_file());
    assert_eq!(names_in(&root.join("real")), ["keep"]);
    assert_eq!(names_in(&outside), ["keep"]);
    // A directory entry over an existing directory keeps its contents.
    let mut again = Layer::new();
    again.raw("real/", EntryType::Directory, 0o700, (0, 0), "", b"");
    apply(&root, again, &mut report).expect("again");
    assert_eq!(names_in(&root.join("real")), ["keep"]);
    assert_eq!(lstat(&root.join("real")).mode() & 0o7777, 0o700);
}

#[test]
fn unsupported_entries_and_broken_tars_are_errors() {
    if !as_root("unsupported_entries_and_broken_tars_are_errors") {
        return;
    }
    let (_host, root) = scratch();
    let mut report = UnpackReport::default();
    let mut l = Layer::new();
    l.raw("weird", EntryType::new(b'Z'), 0o644, (0, 0), "", b"");
    match apply(&root, l, &mut report) {
        Err(UnpackError::Unsupported { entry, kind }) => {
            assert_eq!((entry.as_str(), kind.as_str()), ("weird", "Z"));
        }
        other => panic!("{other:?}"),
    }
    // A header with a bad checksum.
    let mut l = Layer::new();
    l.file("ok", "fine");
    let mut bytes = l.bytes();
    bytes[0] ^= 0x20;
    assert!(matches!(
        apply_layer(&root, &bytes[..], &mut report),
        Err(UnpackError::Read(_))
    ));
    // Truncated in the middle of a file's data.
    let mut l = Layer::new();
    l.file("big", &"x".repeat(4000));
    let bytes = l.bytes();
    assert!(apply_layer(&root, &bytes[..1500], &mut report).is_err());
    // A uid of -1 is no owner.
    let mut l = Layer::new();
    l.raw(
        "minus",
        EntryType::Regular,
        0o644,
        (u64::from(u32::MAX), 0),
        "",
        b"",
    );
    assert!(matches!(
        apply(&root, l, &mut report),
        Err(UnpackError::Unsafe { .. })
    ));
}

/// A header whose uid, gid, mode and mtime fields are left empty (all NUL, as some image
/// builders write a device node's) reads them as 0, as GNU tar and Go's `archive/tar` do; a
/// field of garbage is refused.
#[test]
fn empty_numeric_fields_read_as_zero_and_garbage_is_refused() {
    if !as_root("empty_numeric_fields_read_as_zero_and_garbage_is_refused") {
        return;
    }
    let layer = |fill: u8| {
        let mut h = tar::Header::new_gnu();
        h.set_path("empty").expect("path");
        h.set_entry_type(EntryType::Regular);
        h.set_size(0);
        let old = h.as_old_mut();
        for field in [
            &mut old.uid[..],
            &mut old.gid[..],
            &mut old.mode[..],
            &mut old.mtime[..],
        ] {
            field.fill(fill);
        }
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&h, &b""[..]).expect("append");
        b.into_inner().expect("finish")
    };
    let (_host, root) = scratch();
    let mut report = UnpackReport::default();
    apply_layer(&root, &layer(0)[..], &mut report).expect("an empty field is 0");
    let meta = lstat(&root.join("empty"));
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777, meta.mtime()),
        (0, 0, 0, 0)
    );
    let (_host, root) = scratch();
    assert!(matches!(
        apply_layer(&root, &layer(b'x')[..], &mut report),
        Err(UnpackError::Unsafe { .. })
    ));
    assert!(!exists(&root.join("empty")));
}

/// A reader that counts what was read from it.
struct Counting<'a>(&'a [u8], usize);

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1 += n;
        Ok(n)
    }
}

#[test]
fn the_layer_stream_is_read_to_its_end() {
    if !as_root("the_layer_stream_is_read_to_its_end") {
        return;
    }
    let (_host, root) = scratch();
    let mut l = Layer::new();
    l.file("a", "a");
    let mut bytes = l.bytes();
    // What tar writers pad a layer with after the end-of-archive blocks.
    bytes.extend_from_slice(&[0; 8192]);
    let mut counting = Counting(&bytes, 0);
    let mut report = UnpackReport::default();
    apply_layer(&root, &mut counting, &mut report).expect("apply");
    assert_eq!(counting.1, bytes.len());
    assert_eq!(report.entries, 1);
}

#[test]
fn remove_tree_handles_deep_trees_without_following_links() {
    if !as_root("remove_tree_handles_deep_trees_without_following_links") {
        return;
    }
    let (host, root) = scratch();
    let outside = host.path().join("outside");
    fs::create_dir(&outside).expect("outside");
    fs::write(outside.join("keep"), "k").expect("keep");
    // Deeper than PATH_MAX allows by name: made one level at a time relative to the last.
    let mut dir = rustix::fs::open(
        &root,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .expect("open");
    for i in 0..1500 {
        let name = format!("level-{i:04}");
        rustix::fs::mkdirat(&dir, name.as_str(), rustix::fs::Mode::from_raw_mode(0o555))
            .expect("mkdir");
        rustix::fs::symlinkat(outside.as_path(), &dir, "out").expect("symlink");
        dir = rustix::fs::openat(
            &dir,
            name.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .expect("open level");
    }
    drop(dir);
    let parent = rustix::fs::open(
        host.path(),
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .expect("host");
    remove_tree(&parent, b"root").expect("remove");
    assert_eq!(names_in(host.path()), ["outside"]);
    assert_eq!(names_in(&outside), ["keep"]);
    // Gone already is no error.
    remove_tree(&parent, b"root").expect("remove again");
}
