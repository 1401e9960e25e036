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
    plan(file, pool, &ids_by_name(PASSWD), &real())
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
    let plan = plan("", &pool, &BTreeMap::new(), &real).unwrap();
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
    let files = Files {
        passwd: dir.path().join("passwd"),
        group: dir.path().join("group"),
        subuid: dir.path().join("subuid"),
        subgid: dir.path().join("subgid"),
    };
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
        .filter(|n| n.to_string_lossy().starts_with('.'))
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
