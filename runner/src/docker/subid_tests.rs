use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt as _;

use super::*;

const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                      nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n\
                      alice:x:1000:1000::/home/alice:/bin/bash\n\
                      ci-1:x:64201:64201::/home/ci-1:/bin/sh\n";

fn real() -> BTreeSet<u32> {
    ids_by_name(PASSWD).values().copied().collect()
}

fn run(file: &str, pool: &[u32]) -> Result<Plan, Vec<Problem>> {
    plan(file, pool, &ids_by_name(PASSWD), &real(), &[])
}

fn range(start: u32) -> SubRange {
    SubRange {
        start,
        count: RANGE_SIZE,
    }
}

#[test]
fn ranges_are_decided_for_every_kind_of_file() {
    struct Case {
        name: &'static str,
        file: &'static str,
        pool: &'static [u32],
        ranges: &'static [(u32, u32)],
        add: &'static [&'static str],
    }
    const BASE: u32 = ALLOCATION_BASE;
    let cases = [
        Case {
            name: "an empty file: one new range per uid, one after the other from the base",
            file: "",
            pool: &[64290, 64291],
            ranges: &[(64290, BASE), (64291, BASE + RANGE_SIZE)],
            add: &["64290:1000000000:65536", "64291:1000065536:65536"],
        },
        Case {
            name: "a correct numeric entry is kept, the missing uid gets the next free range",
            file: "alice:100000:65536\n64290:1000000000:65536\n",
            pool: &[64290, 64291],
            ranges: &[(64290, BASE), (64291, BASE + RANGE_SIZE)],
            add: &["64291:1000065536:65536"],
        },
        Case {
            name: "a named entry counts for its account's uid",
            file: "ci-1:200000:65536\n",
            pool: &[64201],
            ranges: &[(64201, 200_000)],
            add: &[],
        },
        Case {
            name: "a wider entry is kept as it is",
            file: "64290:300000:131072\n",
            pool: &[64290],
            ranges: &[(64290, 300_000)],
            add: &[],
        },
        Case {
            name: "new ranges skip other owners' ranges above the base",
            file: "alice:1000000000:70000\n",
            pool: &[64290],
            ranges: &[(64290, BASE + 70_000)],
            add: &["64290:1000070000:65536"],
        },
        Case {
            name: "malformed and blank lines are ignored, as shadow ignores them",
            file: "\n# comment\nbroken\nx:1:\n64290:1000000000:65536\n",
            pool: &[64290],
            ranges: &[(64290, BASE)],
            add: &[],
        },
        Case {
            name: "no pool: nothing to do",
            file: "alice:100000:65536\n",
            pool: &[],
            ranges: &[],
            add: &[],
        },
    ];
    for case in cases {
        let plan = run(case.file, case.pool).unwrap_or_else(|p| panic!("{}: {p:?}", case.name));
        let want: BTreeMap<u32, SubRange> = case
            .ranges
            .iter()
            .map(|&(uid, start)| {
                let count = if case.name.starts_with("a wider") {
                    131_072
                } else {
                    RANGE_SIZE
                };
                (uid, SubRange { start, count })
            })
            .collect();
        assert_eq!(plan.ranges, want, "{}", case.name);
        assert_eq!(plan.add, case.add, "{}", case.name);
    }
}

#[test]
fn entries_that_would_share_ids_are_refused_with_their_line() {
    let cases: [(&str, &str, &[u32], Problem); 6] = [
        (
            "the same uid twice, by name and by number",
            "ci-1:200000:65536\n64201:200000:65536\n",
            &[64201],
            Problem::Several {
                uid: 64201,
                lines: vec![1, 2],
            },
        ),
        (
            "a range too small for an image's ids",
            "64290:300000:1000\n",
            &[64290],
            Problem::TooSmall {
                uid: 64290,
                line: 1,
                count: 1000,
            },
        ),
        (
            "a range overlapping another account's",
            "alice:100000:65536\n64290:150000:65536\n",
            &[64290],
            Problem::Overlap {
                uid: 64290,
                line: 2,
                what: "the range of `alice` (line 1)".into(),
            },
        ),
        (
            "a range covering a real account (nobody)",
            "64290:65000:65536\n",
            &[64290],
            Problem::Overlap {
                uid: 64290,
                line: 1,
                what: "the real id 65534".into(),
            },
        ),
        (
            "a pool uid inside someone's range",
            "alice:60000:65536\n",
            &[64290],
            Problem::PoolInsideRange {
                uid: 64290,
                owner: "alice".into(),
                line: 1,
            },
        ),
        (
            "a range reaching the invalid id",
            "64290:4294960000:65536\n",
            &[64290],
            Problem::Overlap {
                uid: 64290,
                line: 1,
                what: "the invalid id 4294967295".into(),
            },
        ),
    ];
    for (name, file, pool, want) in cases {
        let problems = run(file, pool).expect_err(name);
        assert!(problems.contains(&want), "{name}: {problems:?}");
        // Every message names what to do.
        for p in &problems {
            let text = p.to_string();
            assert!(
                text.contains("remove") || text.contains("keep"),
                "{name}: {text}"
            );
        }
    }
}

#[test]
fn a_new_range_never_covers_a_real_id_or_a_pool_uid() {
    // A real account and a pool uid placed right at the base: the new range goes past both.
    let real: BTreeSet<u32> = [0, ALLOCATION_BASE + 10].into();
    let pool = [64290, ALLOCATION_BASE + 70_000];
    let plan = plan("", &pool, &BTreeMap::new(), &real, &[]).unwrap();
    let mut all_real: Vec<u32> = real.iter().copied().collect();
    all_real.extend(pool);
    for (uid, range) in &plan.ranges {
        for id in &all_real {
            assert!(!range.contains(*id), "{uid}: {range} covers {id}");
        }
    }
    let ranges: Vec<SubRange> = plan.ranges.values().copied().collect();
    assert!(
        !overlaps(&ranges[0].ids(), &ranges[1].ids()),
        "{ranges:?} overlap"
    );
    assert_eq!(plan.ranges[&64290], range(ALLOCATION_BASE + 11));
}

#[test]
fn an_exhausted_id_space_is_said() {
    let file = format!("alice:{ALLOCATION_BASE}:{}\n", u32::MAX - ALLOCATION_BASE);
    let problems = run(&file, &[64290]).unwrap_err();
    assert_eq!(problems, vec![Problem::Exhausted { uid: 64290 }]);
}

#[test]
fn ensure_appends_once_and_keeps_the_other_lines_and_the_mode() {
    let dir = tempfile::tempdir().unwrap();
    let files = temp_files(dir.path());
    std::fs::write(&files.passwd, PASSWD).unwrap();
    std::fs::write(&files.group, "root:x:0:\nalice:x:1000:\n").unwrap();
    // No trailing newline: the appended line must not be glued to it.
    std::fs::write(&files.subuid, "alice:100000:65536").unwrap();
    std::fs::set_permissions(&files.subuid, std::fs::Permissions::from_mode(0o640)).unwrap();
    // No subgid at all: made 0644.

    let pool = [(64290, 64290), (64291, 64291)];
    let first = ensure(&files, &pool).unwrap();
    assert_eq!(first.added, 4);
    assert_eq!(first.uids[&64290], range(ALLOCATION_BASE));
    assert_eq!(
        std::fs::read_to_string(&files.subuid).unwrap(),
        "alice:100000:65536\n64290:1000000000:65536\n64291:1000065536:65536\n"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&files.subuid), 0o640);
    assert_eq!(mode(&files.subgid), 0o644);

    let again = ensure(&files, &pool).unwrap();
    assert_eq!(again.added, 0, "a second run writes nothing");
    assert_eq!(again.uids, first.uids);
    assert_eq!(again.gids, first.gids);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.') && n != ".pwd.lock")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // A conflicting file is refused and left as it was.
    std::fs::write(
        &files.subgid,
        "alice:1000000000:65536\n64290:1000000000:65536\n",
    )
    .unwrap();
    let err = ensure(&files, &pool).unwrap_err();
    assert!(err.to_string().contains("subgid"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&files.subgid).unwrap(),
        "alice:1000000000:65536\n64290:1000000000:65536\n"
    );
}

/// Files under `dir`, laid out as the host's: the shadow lock beside them, and a `proc` holding
/// only the agent's own user namespace (no daemon maps anything) until a test adds processes.
fn temp_files(dir: &Path) -> Files {
    let proc = dir.join("proc");
    std::fs::create_dir_all(proc.join("self/ns")).unwrap();
    std::os::unix::fs::symlink("user:[4026531837]", proc.join("self/ns/user")).unwrap();
    Files {
        passwd: dir.join("passwd"),
        group: dir.join("group"),
        subuid: dir.join("subuid"),
        subgid: dir.join("subgid"),
        lock: dir.join(".pwd.lock"),
        proc,
    }
}

/// A process `pid` under a fake `proc`, in the user namespace `namespace`, with these maps
/// (`None`: unreadable, as those of a process that has just ended).
fn fake_process(proc: &Path, pid: u32, namespace: &str, maps: Option<(&str, &str)>) {
    let dir = proc.join(pid.to_string());
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    std::os::unix::fs::symlink(namespace, dir.join("ns/user")).unwrap();
    if let Some((uid_map, gid_map)) = maps {
        std::fs::write(dir.join("uid_map"), uid_map).unwrap();
        std::fs::write(dir.join("gid_map"), gid_map).unwrap();
    }
}

/// The shadow lock as glibc's `lckpwdf` takes it (what `useradd` holds while it writes): a
/// classic `fcntl` write lock on the whole file, owned by the process.
fn hold_as_lckpwdf(path: &Path) -> std::fs::File {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    file
}

fn host_like(dir: &Path, subids: &str) -> Files {
    let files = temp_files(dir);
    std::fs::write(&files.passwd, PASSWD).unwrap();
    std::fs::write(&files.group, "root:x:0:\nalice:x:1000:\n").unwrap();
    std::fs::write(&files.subuid, subids).unwrap();
    std::fs::write(&files.subgid, subids).unwrap();
    files
}

#[test]
#[expect(clippy::single_range_in_vec_init, reason = "maps of one range each")]
fn maps_are_read_as_the_kernel_writes_them() {
    let cases: &[(&str, &[Range<u64>])] = &[
        (
            "         0       1000          1\n         1 1000000000      65536\n",
            &[1000..1001, 1_000_000_000..1_000_065_536],
        ),
        ("0 0 4294967295\n", &[0..4_294_967_295]),
        ("", &[]),
        ("garbage\n0 1\n", &[]),
    ];
    for (text, want) in cases {
        assert_eq!(map_ranges(text), *want, "{text:?}");
    }
}

#[test]
fn only_other_namespaces_maps_are_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let files = temp_files(dir.path());
    // The agent's own namespace (the initial one maps every id): not a daemon's range.
    fake_process(
        &files.proc,
        1,
        "user:[4026531837]",
        Some(("0 0 4294967295\n", "0 0 4294967295\n")),
    );
    // A rootless daemon and a second process of its namespace: its maps, once.
    let daemon = (
        "0 1000 1\n1 1000000000 65536\n",
        "0 1000 1\n1 1000100000 65536\n",
    );
    fake_process(&files.proc, 20, "user:[4026532001]", Some(daemon));
    fake_process(&files.proc, 21, "user:[4026532001]", Some(daemon));
    // One that ended while it was read.
    fake_process(&files.proc, 30, "user:[4026532002]", None);
    assert_eq!(
        mapped(&files.proc).unwrap(),
        InUse {
            uids: vec![1000..1001, 1_000_000_000..1_000_065_536],
            gids: vec![1000..1001, 1_000_100_000..1_000_165_536],
        }
    );
    // No `proc` at all: said, not taken for "nothing is mapped".
    let err = mapped(&dir.path().join("absent")).unwrap_err();
    assert!(err.to_string().contains("absent"), "{err}");
}

#[test]
#[expect(clippy::single_range_in_vec_init, reason = "maps of one range each")]
fn a_new_range_skips_the_ids_live_namespaces_map() {
    const BASE: u64 = ALLOCATION_BASE as u64;
    const SIZE: u64 = RANGE_SIZE as u64;
    /// Its name, the file, the ids in use, and the new range's start or the problem.
    type Case<'a> = (&'a str, &'a str, &'a [Range<u64>], Result<u32, Problem>);
    let cases: &[Case] = &[
        ("nothing mapped: the base", "", &[], Ok(ALLOCATION_BASE)),
        (
            "a daemon still maps the base, its line removed: the range after it",
            "",
            &[BASE..BASE + SIZE],
            Ok(ALLOCATION_BASE + RANGE_SIZE),
        ),
        (
            "one mapped id inside the first free place: past it",
            "",
            &[BASE + 10..BASE + 11],
            Ok(ALLOCATION_BASE + 11),
        ),
        (
            "an existing line is kept even while mapped (its own daemon maps it)",
            "64290:1000000000:65536\n",
            &[BASE..BASE + SIZE],
            Ok(ALLOCATION_BASE),
        ),
        (
            "everything mapped: no range",
            "",
            &[0..ID_LIMIT],
            Err(Problem::Exhausted { uid: 64290 }),
        ),
    ];
    for (name, file, in_use, want) in cases {
        let got = plan(file, &[64290], &ids_by_name(PASSWD), &real(), in_use)
            .map(|plan| plan.ranges[&64290].start)
            .map_err(|problems| problems[0].clone());
        assert_eq!(&got, want, "{name}");
    }
}

#[test]
fn a_range_a_live_daemon_maps_is_not_handed_out_again() {
    let dir = tempfile::tempdir().unwrap();
    // Its line is gone (an operator removed it, or a concurrent writer lost it); its daemon runs.
    let files = host_like(dir.path(), "alice:100000:65536\n");
    fake_process(
        &files.proc,
        4242,
        "user:[4026532001]",
        Some((
            "0 1000 1\n1 1000000000 65536\n",
            "0 1000 1\n1 1000000000 65536\n",
        )),
    );
    let assigned = ensure(&files, &[(64290, 64290)]).unwrap();
    assert_eq!(assigned.uids[&64290], range(ALLOCATION_BASE + RANGE_SIZE));
    assert_eq!(assigned.gids[&64290], range(ALLOCATION_BASE + RANGE_SIZE));
    assert_eq!(
        std::fs::read_to_string(&files.subuid).unwrap(),
        "alice:100000:65536\n64290:1000065536:65536\n"
    );
}

#[test]
fn a_writer_waits_for_the_shadow_lock_and_reads_the_files_again_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let files = host_like(dir.path(), "alice:100000:65536\n");
    let useradd = hold_as_lckpwdf(&files.lock);
    let writer = std::thread::spawn({
        let files = files.clone();
        move || ensure_waiting(&files, &[(64290, 64290)], Duration::from_secs(20))
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !writer.is_finished(),
        "the writer waits while the lock is held"
    );
    assert_eq!(
        std::fs::read_to_string(&files.subuid).unwrap(),
        "alice:100000:65536\n"
    );
    // What `useradd` writes meanwhile: a range at the base, the one rm read as free.
    for path in [&files.subuid, &files.subgid] {
        let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        file.write_all(b"bob:1000000000:65536\n").unwrap();
    }
    drop(useradd);
    let assigned = writer.join().unwrap().unwrap();
    assert_eq!(assigned.added, 2);
    assert_eq!(assigned.uids[&64290], range(ALLOCATION_BASE + RANGE_SIZE));
    for path in [&files.subuid, &files.subgid] {
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            "alice:100000:65536\nbob:1000000000:65536\n64290:1000065536:65536\n",
            "bob's line kept, his range not handed out twice"
        );
    }
}

#[test]
fn a_writer_gives_up_when_the_shadow_lock_stays_held() {
    let dir = tempfile::tempdir().unwrap();
    let files = host_like(dir.path(), "alice:100000:65536\n");
    let _useradd = hold_as_lckpwdf(&files.lock);
    let started = Instant::now();
    let err = ensure_waiting(&files, &[(64290, 64290)], Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(err, SubIdError::Locked { .. }),
        "{err}: refused as locked"
    );
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited");
    assert!(err.to_string().contains(".pwd.lock"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&files.subuid).unwrap(),
        "alice:100000:65536\n",
        "nothing written"
    );
    // Nothing to add: no lock needed (an agent with a read-only /etc finds its lines).
    std::fs::write(&files.subuid, "64290:1000000000:65536\n").unwrap();
    std::fs::write(&files.subgid, "64290:1000000000:65536\n").unwrap();
    let assigned = ensure_waiting(&files, &[(64290, 64290)], Duration::ZERO).unwrap();
    assert_eq!(assigned.added, 0);
}

/// The real `/proc`: a user namespace made here, its maps written as a daemon's are
/// (`newuidmap` writes `/proc/<pid>/uid_map`), is found in use.
#[test]
fn a_live_namespace_map_is_read_from_the_real_proc() {
    const TEST: &str = "a_live_namespace_map_is_read_from_the_real_proc";
    if rustix::process::geteuid().as_raw() != 0 {
        crate::test_skip::cannot_run(
            TEST,
            "root",
            "writing another namespace's uid_map needs CAP_SETUID",
        );
        return;
    }
    /// Ends the namespace's process however the test ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = match std::process::Command::new("unshare")
        .args(["--user", "sleep", "60"])
        .spawn()
    {
        Ok(child) => Killed(child),
        Err(e) => {
            crate::test_skip::cannot_run(TEST, "util-linux", &format!("unshare: {e}"));
            return;
        }
    };
    let proc = Path::new("/proc").join(child.0.id().to_string());
    let own = std::fs::read_link("/proc/self/ns/user").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(proc.join("ns/user")).ok().as_ref() == Some(&own) {
        assert!(Instant::now() < deadline, "unshare made no namespace");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A range of this test's own, high above the ones rm hands out.
    let start = 3_900_000_000u64 + u64::from(std::process::id() % 1000) * u64::from(RANGE_SIZE);
    let map = format!("0 {start} {RANGE_SIZE}\n");
    std::fs::write(proc.join("uid_map"), &map).unwrap();
    std::fs::write(proc.join("gid_map"), &map).unwrap();
    let in_use = mapped(Path::new("/proc")).unwrap();
    let ours = start..start + u64::from(RANGE_SIZE);
    assert!(in_use.uids.contains(&ours), "{ours:?} not in {in_use:?}");
    assert!(in_use.gids.contains(&ours), "{ours:?} not in {in_use:?}");
    drop(child);
    let in_use = mapped(Path::new("/proc")).unwrap();
    assert!(
        !in_use.uids.contains(&ours),
        "gone with its process: {in_use:?}"
    );
}
