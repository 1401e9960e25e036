//! The disk bound's rule, and the walk against trees a job could make.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;

const MIB: u64 = 1 << 20;

fn write(path: &Path, bytes: usize) {
    // Real data, not a hole: the walk counts allocated blocks.
    fs::write(path, vec![7u8; bytes]).unwrap();
}

fn bytes(measured: Measured) -> u64 {
    match measured {
        Measured::Bytes(b) => b,
        other => panic!("not measured whole: {other:?}"),
    }
}

#[test]
fn the_rule_stops_only_a_runtime_known_to_be_past_its_bound() {
    use DiskUse::{Over, Within};
    let max = Some(10 * MIB);
    for (measured, disk_max, expected) in [
        (Some(Measured::Bytes(10 * MIB)), max, Within),
        (Some(Measured::Bytes(10 * MIB + 1)), max, Over),
        (Some(Measured::AtLeast(10 * MIB + 1)), max, Over),
        (Some(Measured::TooManyEntries), max, Over),
        (Some(Measured::TooDeep), max, Over),
        // No bound: never.
        (Some(Measured::Bytes(u64::MAX)), None, Within),
        (Some(Measured::TooManyEntries), None, Within),
        // Not measured (yet, or the walk failed): not stopped on a guess.
        (None, max, Within),
    ] {
        assert_eq!(
            judge(measured, disk_max),
            expected,
            "{measured:?} {disk_max:?}"
        );
    }
}

#[test]
fn the_walk_counts_what_the_runtime_holds() {
    let dir = tempfile::tempdir().unwrap();
    let empty = bytes(measure(dir.path(), u64::MAX).unwrap());
    fs::create_dir_all(dir.path().join("_work/a/b")).unwrap();
    write(&dir.path().join("_work/a/b/big"), 3 * MIB as usize);
    write(&dir.path().join("_work/small"), 100);
    let measured = bytes(measure(dir.path(), u64::MAX).unwrap());
    assert!(measured >= empty + 3 * MIB, "{measured}");
    // Blocks, not lengths: a hole holds nothing.
    let sparse = fs::File::create(dir.path().join("sparse")).unwrap();
    sparse.set_len(1 << 40).unwrap();
    let with_hole = bytes(measure(dir.path(), u64::MAX).unwrap());
    assert!(with_hole < measured + MIB, "{with_hole} vs {measured}");
}

#[test]
fn counting_stops_past_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write(&dir.path().join(format!("f{i}")), MIB as usize);
    }
    match measure(dir.path(), 2 * MIB).unwrap() {
        Measured::AtLeast(b) => assert!(b > 2 * MIB && b < 4 * MIB, "{b}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn links_are_never_followed_and_a_file_linked_twice_counts_once() {
    let outside = tempfile::tempdir().unwrap();
    write(&outside.path().join("host-file"), 4 * MIB as usize);
    let dir = tempfile::tempdir().unwrap();
    let empty = bytes(measure(dir.path(), u64::MAX).unwrap());
    // A link to a big file and to a big directory outside: neither counted nor entered.
    symlink(outside.path().join("host-file"), dir.path().join("to-file")).unwrap();
    symlink(outside.path(), dir.path().join("to-dir")).unwrap();
    let links = bytes(measure(dir.path(), u64::MAX).unwrap());
    assert!(links < empty + MIB, "{links}");
    // One file with three names in the runtime holds its blocks once.
    write(&dir.path().join("one"), 2 * MIB as usize);
    fs::hard_link(dir.path().join("one"), dir.path().join("two")).unwrap();
    fs::hard_link(dir.path().join("one"), dir.path().join("three")).unwrap();
    let linked = bytes(measure(dir.path(), u64::MAX).unwrap());
    assert!(
        linked >= links + 2 * MIB && linked < links + 3 * MIB,
        "{linked}"
    );
}

#[test]
fn a_tree_deeper_than_any_path_is_walked_without_recursion() {
    // 1,100 levels: deeper than the removal's old limit, its path longer than a recursive
    // walk's stack of descriptors would like. Each level holds a file.
    let dir = tempfile::tempdir().unwrap();
    let mut fd = rustix::fs::open(
        dir.path(),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    for _ in 0..1100 {
        let file = rustix::fs::openat(
            &fd,
            c"f",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        rustix::io::write(&file, &[1u8; 4096]).unwrap();
        rustix::fs::mkdirat(&fd, c"d", Mode::RWXU).unwrap();
        fd = rustix::fs::openat(&fd, c"d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .unwrap();
    }
    drop(fd);
    let measured = bytes(measure(dir.path(), u64::MAX).unwrap());
    assert!(measured >= 1100 * 4096, "{measured}");
}

#[test]
fn a_tree_that_would_hold_too_many_directories_open_is_past_its_bound() {
    // Every level has its way down and eight empty siblings: a walk would keep every level
    // open while its siblings wait, whichever order the directory lists them in (unless the
    // way down comes first, one level in nine).
    let dir = tempfile::tempdir().unwrap();
    let mut fd = rustix::fs::open(
        dir.path(),
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .unwrap();
    for _ in 0..(MAX_OPEN_DIRS * 2) {
        for sibling in [c"s1", c"s2", c"s3", c"s4", c"s5", c"s6", c"s7", c"s8"] {
            rustix::fs::mkdirat(&fd, sibling, Mode::RWXU).unwrap();
        }
        rustix::fs::mkdirat(&fd, c"d", Mode::RWXU).unwrap();
        fd = rustix::fs::openat(&fd, c"d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .unwrap();
    }
    drop(fd);
    assert_eq!(measure(dir.path(), u64::MAX).unwrap(), Measured::TooDeep);
    assert_eq!(
        judge(Some(Measured::TooDeep), Some(u64::MAX)),
        DiskUse::Over
    );
}

#[test]
fn a_mount_inside_the_runtime_is_neither_counted_nor_entered() {
    if !rustix::process::geteuid().is_root() {
        crate::test_skip::cannot_run(
            "a_mount_inside_the_runtime_is_neither_counted_nor_entered",
            "root",
            "mounting a tmpfs needs root",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let empty = bytes(measure(dir.path(), u64::MAX).unwrap());
    rustix::mount::mount(
        c"tmpfs",
        &mnt,
        c"tmpfs",
        rustix::mount::MountFlags::empty(),
        c"size=16m",
    )
    .unwrap();
    write(&mnt.join("big"), 8 * MIB as usize);
    let measured = measure(dir.path(), u64::MAX);
    rustix::mount::unmount(&mnt, rustix::mount::UnmountFlags::DETACH).unwrap();
    let measured = bytes(measured.unwrap());
    assert!(measured < empty + MIB, "{measured} vs {empty}");
}

#[test]
fn a_runtime_that_is_a_link_is_not_measured() {
    let outside = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    symlink(outside.path(), &runtime).unwrap();
    assert!(measure(&runtime, u64::MAX).is_err());
}
