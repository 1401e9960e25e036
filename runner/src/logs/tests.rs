//! The pure rules (scrub, head/tail cap, pruning) by table; the safe copier against a hostile
//! `_diag` in a temporary directory; a keep made again after a simulated crash; which files a
//! listener-log check (`any_listener_log_tail`) reads.

#![allow(
    clippy::unwrap_used,
    reason = "a failed step in a test helper should fail the test loudly"
)]

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use super::copy::{self, cap_bytes, marker};
use super::prune::{Bounds, Entry, to_prune};
use super::scrub::{MIN_BASE64_RUN, scrub};
use super::*;

fn s(bytes: &[u8]) -> String {
    String::from_utf8(scrub(bytes)).unwrap()
}

// ---- scrub ----

#[test]
fn scrub_replaces_every_secret_shape() {
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjM0NTYiLCJpYXQiOjE3MDB9.c2lnbmF0dXJlLXBhcnQ";
    let long = "QUJD".repeat(40) + "x9Z";
    for (line, secret, rule) in [
        (
            "token ghp_0123456789abcdefghijABCDEFGHIJ0123 used",
            "ghp_0123456789",
            "github token",
        ),
        (
            "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
            "ghs_16C7e42F",
            "github token",
        ),
        (
            "gho_abcdefghijklmnopqrstuvwxyz012345",
            "gho_abcdef",
            "github token",
        ),
        (
            "x=ghu_abcdefghijklmnopqrstuvwxyz012345",
            "ghu_abcdef",
            "github token",
        ),
        (
            "pat github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
            "github_pat_11",
            "github token",
        ),
        (&format!("jwt: {jwt}"), "eyJhbGciOiJSUzI1NiJ9", "jwt"),
        (&format!("JITCONFIG={long}"), "QUJDQUJD", "base64"),
    ] {
        let out = s(line.as_bytes());
        assert!(!out.contains(secret), "{line} -> {out}");
        assert!(
            out.contains(&format!("[redacted {rule}]")),
            "{line} -> {out}"
        );
    }
}

#[test]
fn scrub_takes_authorization_values_to_the_end_of_the_line() {
    for line in [
        "Authorization: Bearer abc.def",
        "authorization: token 1234",
        r#"{"Authorization": "Basic dXNlcjpwYXNz"}"#,
        "AUTHORIZATION=RemoteAuth xyz",
    ] {
        let out = s(line.as_bytes());
        for secret in ["abc.def", "1234", "dXNlcjpwYXNz", "xyz"] {
            assert!(!out.contains(secret), "{line} -> {out}");
        }
        assert!(out.ends_with("[redacted]"), "{line} -> {out}");
    }
}

#[test]
fn scrub_takes_a_private_key_block_and_keeps_the_lines() {
    let text = b"before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nabcdef\n-----END RSA PRIVATE KEY-----\nafter\n";
    let out = s(text);
    assert!(
        !out.contains("MIIEpAIBAAKCAQEA") && !out.contains("abcdef"),
        "{out}"
    );
    assert!(
        out.starts_with("before\n") && out.ends_with("after\n"),
        "{out}"
    );
    // Line counts are kept (`logs --follow` resumes by them).
    assert_eq!(out.lines().count(), 6);
    // A block that never ends takes everything after it.
    let out = s(b"-----BEGIN PRIVATE KEY-----\nsecret\nmore\n");
    assert!(!out.contains("secret") && !out.contains("more"), "{out}");
}

#[test]
fn scrub_keeps_what_is_not_a_secret() {
    let sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let path = "/home/runner/_work/widgets/widgets/target/debug/build/some-crate-0123abcd/out/generated/bindings/Module.rs";
    for line in [
        "Job completed with result: Succeeded",
        sha256,
        "commit 1f2e3d4c5b6a79881726354413f2e3d4c5b6a798",
        "ghs_path is a word, gh_foo too",
        "id 123e4567-e89b-12d3-a456-426614174000",
        path,
        &"a".repeat(MIN_BASE64_RUN * 2),
    ] {
        assert_eq!(s(line.as_bytes()), line);
    }
    // Just under the threshold stays; at it, goes.
    let under = "Ab1".repeat(MIN_BASE64_RUN / 3);
    assert_eq!(s(under.as_bytes()), under);
    let at = "Ab1".repeat(MIN_BASE64_RUN / 3 + 1);
    assert_eq!(s(at.as_bytes()), "[redacted base64]");
}

// ---- head and tail ----

#[test]
fn a_file_over_its_cap_keeps_its_head_and_tail_at_line_ends() {
    // (file, cap, expected)
    let cases: [(&[u8], u64, &str); 4] = [
        (b"short\n", 100, "short\n"),
        (b"exactly10\n", 10, "exactly10\n"),
        // head window "aaa\nbb", tail window "yy\nzzz": half lines are dropped.
        (
            b"aaa\nbbbbbbbbbbbbbbbbbbbbbbb\nyyy\nzzz",
            12,
            "aaa\n{m}\nzzz",
        ),
        // No line end in either window: only the marker.
        (&[b'x'; 50], 10, "{m}\n"),
    ];
    for (file, cap, expected) in cases {
        let out = String::from_utf8(cap_bytes(file, cap)).unwrap();
        let kept = expected.replace("{m}", "").replace('\n', "").len();
        let newlines_kept = expected.matches('\n').count() - usize::from(expected.contains("{m}"));
        let left_out = file.len() - kept - newlines_kept;
        let expected = expected.replace("{m}", &marker(left_out as u64));
        assert_eq!(out, expected, "cap {cap}");
    }
}

/// What `stream_capped_in` handed on, joined as the file's text: each piece, a line end after
/// those that had one; and the pieces themselves.
fn streamed(file: &[u8], cap: u64, sizes: copy::Sizes) -> (Vec<u8>, Vec<Vec<u8>>, copy::Streamed) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.log");
    std::fs::write(&path, file).unwrap();
    let opened = std::fs::File::open(&path).unwrap();
    let (mut text, mut pieces) = (Vec::new(), Vec::new());
    let stats = copy::stream_capped_in(&opened, file.len() as u64, cap, sizes, &mut |p, ends| {
        text.extend_from_slice(p);
        pieces.push(p.to_vec());
        if ends {
            text.push(b'\n');
        }
        Ok(())
    })
    .unwrap();
    (text, pieces, stats)
}

#[test]
fn streaming_a_file_hands_on_what_the_head_and_tail_rule_keeps() {
    let lines: Vec<u8> = (0..300)
        .flat_map(|i| format!("line {i:03} of a log\n").into_bytes())
        .collect();
    let files: [&[u8]; 6] = [
        b"short\n",
        b"no line end",
        b"aaa\nbbbbbbbbbbbbbbbbbbbbbbb\nyyy\nzzz",
        &[b'x'; 50],
        b"\n\n\n\n\n\n\n\n\n\n\n\n",
        &lines,
    ];
    for file in files {
        for cap in [0, 1, 10, 12, 13, 64, 1000, 100_000] {
            // Chunks of every small size cross every line end and window edge somewhere.
            for chunk in [1, 2, 3, 7, 64, 1 << 16] {
                let sizes = copy::Sizes {
                    chunk,
                    piece: 1 << 20,
                };
                let (text, _, stats) = streamed(file, cap, sizes);
                assert_eq!(
                    String::from_utf8_lossy(&text),
                    String::from_utf8_lossy(&cap_bytes(file, cap)),
                    "cap {cap} chunk {chunk}"
                );
                // Its own count: a file under its cap once; over it, at most the cap and what
                // is read again of the chunk each line end was found in.
                let len = file.len() as u64;
                if len <= cap {
                    assert_eq!(stats.read, len, "cap {cap} chunk {chunk}");
                } else {
                    let most = cap + 2 * (chunk as u64).min(cap / 2);
                    assert!(stats.read <= most, "read {} > {most}", stats.read);
                }
            }
        }
    }
}

#[test]
fn a_line_longer_than_a_piece_is_handed_on_in_pieces_cut_between_words() {
    let sizes = copy::Sizes {
        chunk: 4,
        piece: 16,
    };
    let token = "ghp_0123456789abcdefghijABCDEFGHIJ";
    let words = format!(
        "one two {token} three \u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9} four\nend\n"
    );
    let zeros = vec![0u8; 100];
    for file in [words.as_bytes(), &zeros] {
        let (text, pieces, stats) = streamed(file, u64::MAX, sizes);
        // Nothing lost, nothing added.
        assert_eq!(text, file);
        for piece in &pieces {
            assert!(piece.len() <= sizes.piece, "{piece:?}");
            // A UTF-8 character is never cut.
            assert!(std::str::from_utf8(piece).is_ok(), "{piece:?}");
        }
        // A chunk, and a line of at most a piece and a chunk.
        assert!(
            stats.held <= sizes.chunk + sizes.piece + sizes.chunk,
            "{stats:?}"
        );
    }
    // The token is not cut: it is longer than a piece, so it has pieces of its own, each a
    // run of word characters only where no cut could fall; the scrubber sees it whole up to
    // the piece size (see `scrubbing_in_pieces_...`).
    let (_, pieces, _) = streamed(words.as_bytes(), u64::MAX, sizes);
    assert!(pieces.iter().any(|p| p.starts_with(b"ghp_")), "{pieces:?}");
}

#[test]
fn a_long_line_is_cut_after_the_last_byte_no_secret_holds() {
    // (line, most, cut)
    let cases: [(&[u8], usize, usize); 7] = [
        (b"abc def ghi", 9, 8),
        (b"abc\x1bdef ghi", 9, 8),
        (b"abc=def/ghi+jkl", 9, 9),
        (b"a\xc3\xa9b", 2, 1),
        (b"\xc3\xa9\xc3\xa9", 3, 2),
        (b"abcdef", 6, 6),
        (b"\x80\x80\x80\x80\x80\x80", 5, 5),
    ];
    for (line, most, cut) in cases {
        assert_eq!(copy::cut_at(line, most), cut, "{line:?} at most {most}");
    }
}

#[test]
fn scrubbing_in_pieces_takes_an_authorization_value_to_the_line_end() {
    let mut scrubber = scrub::Scrubber::default();
    let pieces: [(&[u8], bool, &[u8]); 5] = [
        (
            b"Authorization: Bearer ",
            false,
            b"Authorization: [redacted]",
        ),
        (b"s3cr3t value", false, b""),
        (b"still it", true, b""),
        (
            b"next line ghp_0123456789abcdefghijABCDEFGHIJ",
            false,
            b"next line [redacted github token]",
        ),
        (b" and more", true, b" and more"),
    ];
    for (piece, ends, expected) in pieces {
        assert_eq!(
            String::from_utf8_lossy(&scrubber.piece(piece, ends)),
            String::from_utf8_lossy(expected)
        );
    }
}

#[test]
fn an_attempts_budget_caps_each_file_and_all_of_them() {
    let mut budget = Budget::with(Caps {
        per_file: 10,
        per_attempt: 25,
    });
    let mut caps = Vec::new();
    // (size, read): a file under its cap; one read short of its cap (an odd cap's halves); one
    // read past it (a line end's chunk read again); one read short of what is left.
    for (size, read) in [(4, 4), (50, 9), (50, 12), (50, 0), (1, 1)] {
        let cap = budget.next_cap();
        caps.push(cap);
        budget.spend(size, cap.unwrap_or(0), read);
    }
    // 25 - 4 - 10 - 12 = 0: spent, and nothing after it is read.
    assert_eq!(caps, [Some(10), Some(10), Some(10), None, None]);
    assert!(budget.spent().contains("25 bytes"));
}

// ---- pruning ----

fn entry(attempt: &str, kept_at_ms: i64, bytes: u64) -> Entry {
    Entry {
        attempt: attempt.to_owned(),
        kept_at_ms,
        bytes,
    }
}

const DAY_MS: i64 = 24 * 3600 * 1000;

#[test]
fn pruning_takes_the_oldest_first_by_each_bound() {
    let bounds = Bounds {
        keep: 3,
        max_age: Duration::from_secs(10 * 24 * 3600),
        max_total: 1000,
    };
    let now = 100 * DAY_MS;
    // (entries, expected removals, oldest first)
    let cases: Vec<(Vec<Entry>, Vec<&str>)> = vec![
        (vec![], vec![]),
        (vec![entry("a", now, 10), entry("b", now - 1, 10)], vec![]),
        // Count: the fourth newest goes.
        (
            vec![
                entry("a", 1 + now - 4, 1),
                entry("b", now - 2, 1),
                entry("c", now - 1, 1),
                entry("d", now, 1),
            ],
            vec!["a"],
        ),
        // Age: older than ten days goes, whatever the count.
        (
            vec![entry("old", now - 11 * DAY_MS, 1), entry("new", now, 1)],
            vec!["old"],
        ),
        // Size: the newest that fit stay; the first that does not goes, and all older with it
        // (even the small one, so nothing older outlives something newer).
        (
            vec![
                entry("small-old", now - 3, 1),
                entry("big", now - 2, 600),
                entry("mid", now - 1, 500),
                entry("new", now, 400),
            ],
            vec!["small-old", "big"],
        ),
        // Same time: the attempt id orders them, so the decision is total.
        (
            vec![
                entry("x1", now, 1),
                entry("x2", now, 1),
                entry("x3", now, 1),
                entry("x4", now, 1),
            ],
            vec!["x1"],
        ),
    ];
    for (entries, expected) in cases {
        assert_eq!(to_prune(&entries, bounds, now), expected, "{entries:?}");
    }
}

#[test]
fn a_thousand_attempts_stay_under_the_bounds_on_a_manual_clock() {
    let bounds = Bounds {
        keep: 200,
        max_age: Duration::from_secs(2 * 24 * 3600),
        max_total: 300_000,
    };
    let mut store: Vec<Entry> = Vec::new();
    let mut now = 1_700_000_000_000;
    let mut rng: u64 = 7;
    for i in 0..1000 {
        // One attempt every 7 minutes, of 100 B to 4 KiB, pruned after each keep.
        now += 7 * 60 * 1000;
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        store.push(entry(&format!("{i:04}"), now, 100 + (rng >> 33) % 4000));
        let gone = to_prune(&store, bounds, now);
        store.retain(|e| !gone.contains(&e.attempt));
        assert!(store.len() <= bounds.keep);
        assert!(store.iter().map(|e| e.bytes).sum::<u64>() <= bounds.max_total);
        assert!(store.iter().all(|e| now - e.kept_at_ms <= 2 * DAY_MS));
        // The newest is always kept, and the store is the newest N, without holes.
        assert_eq!(store.last().unwrap().attempt, format!("{i:04}"));
        let first: usize = store[0].attempt.parse().unwrap();
        assert_eq!(store.len(), i + 1 - first);
    }
    // The bounds were reached (the test would pass trivially otherwise).
    assert!(store.len() < 200, "{}", store.len());
}

// ---- the copier, against a hostile `_diag` ----

struct Fixture {
    dir: tempfile::TempDir,
    store: Store,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(&dir.path().join("data"), Bounds::default());
        std::fs::create_dir_all(dir.path().join("runtime/_diag")).unwrap();
        Fixture { dir, store }
    }

    fn diag(&self) -> std::path::PathBuf {
        self.dir.path().join("runtime/_diag")
    }

    fn attempt(&self, id: &str) -> Attempt {
        Attempt {
            attempt_id: id.to_owned(),
            runner_name: format!("rm-test-{id}"),
            policy: "linux".to_owned(),
            job_id: Some(42),
            runtime_dir: self.dir.path().join("runtime"),
        }
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

fn kept_text(store: &Store, id: &str) -> String {
    let mut all = String::new();
    for f in std::fs::read_dir(store.entry(id)).unwrap() {
        all.push_str(&String::from_utf8_lossy(
            &std::fs::read(f.unwrap().path()).unwrap(),
        ));
    }
    all
}

#[test]
fn a_hostile_diag_keeps_only_its_regular_files_capped_and_root_only() {
    let f = Fixture::new();
    let diag = f.diag();
    std::fs::write(
        diag.join("Runner_20260101-000000-utc.log"),
        "listener line\n",
    )
    .unwrap();
    std::fs::write(
        diag.join(OUTPUT_FILE),
        "stdout line ghp_0123456789abcdefghijABCDEFGHIJ\n",
    )
    .unwrap();
    // A link to a file only root may read, a FIFO that would hang a reader, a directory loop,
    // a file far over its cap, a name no terminal should print, a link for `_diag` below.
    let secret = f.dir.path().join("root-only");
    std::fs::write(&secret, "ROOT ONLY CONTENT\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&secret, diag.join("Worker_link.log")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        diag.join("fifo.log"),
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    std::fs::create_dir(diag.join("loop")).unwrap();
    std::os::unix::fs::symlink("..", diag.join("loop/up")).unwrap();
    let huge: String = (0..400)
        .map(|i| format!("line {i:04} of a long log\n"))
        .collect();
    std::fs::write(diag.join("huge.log"), &huge).unwrap();
    std::fs::write(diag.join("bad\nname"), "x\n").unwrap();
    std::fs::write(diag.join(MANIFEST), "{}").unwrap();
    // A second name for the root-only file (what `fs.protected_hardlinks = 0` would allow).
    std::fs::hard_link(&secret, diag.join("Worker_hard.log")).unwrap();

    // The attempt's budget is spent by what is read: the capped `huge.log` takes its cap and
    // what is read again of its line ends' chunks, and `loop` after it is still looked at.
    let caps = Caps {
        per_file: 1000,
        per_attempt: 2500,
    };
    let Kept::Made(manifest) = f.store.keep_with(&f.attempt("a1"), 1, caps).unwrap() else {
        panic!("a copy is made");
    };
    let kept: Vec<&str> = manifest.files.iter().map(|k| k.name.as_str()).collect();
    // The output first, then the listener's log, then the rest by name, until the budget.
    assert_eq!(
        kept,
        [OUTPUT_FILE, "Runner_20260101-000000-utc.log", "huge.log"]
    );
    let why = |name: &str| {
        manifest
            .left_out
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.why.clone())
            .unwrap_or_default()
    };
    assert!(
        why("Worker_link.log").contains("symbolic link"),
        "{manifest:?}"
    );
    assert!(why("Worker_hard.log").contains("hard link"), "{manifest:?}");
    assert!(
        why("fifo.log").contains("not a regular file"),
        "{manifest:?}"
    );
    assert!(why("loop").contains("not a regular file"), "{manifest:?}");
    assert!(why("(a name of 8 bytes)").contains("name"), "{manifest:?}");
    assert!(why(MANIFEST).contains("name"), "{manifest:?}");

    let huge_kept = manifest
        .files
        .iter()
        .find(|k| k.name == "huge.log")
        .unwrap();
    assert!(huge_kept.capped && huge_kept.original_bytes == huge.len() as u64);
    let total: u64 = manifest.files.iter().map(|k| k.kept_bytes).sum();
    assert!(total <= caps.per_attempt, "{total}");

    let entry = f.store.entry("a1");
    let text = kept_text(&f.store, "a1");
    assert!(
        text.contains("listener line") && text.contains("stdout line"),
        "{text}"
    );
    assert!(
        !text.contains("ROOT ONLY") && !text.contains("ghp_0123"),
        "{text}"
    );
    assert!(text.contains("bytes left out here"), "{text}");
    assert!(
        text.contains("line 0000") && !text.contains("line 0200"),
        "{text}"
    );
    assert_eq!(mode(f.store.dir()), 0o700);
    assert_eq!(mode(&entry), 0o700);
    for file in std::fs::read_dir(&entry).unwrap() {
        assert_eq!(mode(&file.unwrap().path()), 0o600);
    }
}

#[test]
fn a_diag_that_is_a_link_is_not_followed() {
    let f = Fixture::new();
    let elsewhere = f.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("Runner_x.log"), "NOT THE RUNNER'S\n").unwrap();
    std::fs::remove_dir(f.diag()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, f.diag()).unwrap();
    let Kept::Made(manifest) = f.store.keep(&f.attempt("a2"), 1).unwrap() else {
        panic!("an entry is made");
    };
    assert!(manifest.files.is_empty(), "{manifest:?}");
    assert_eq!(manifest.left_out[0].name, DIAG_DIR);
    assert!(manifest.left_out[0].why.contains("a link"), "{manifest:?}");
    assert!(!kept_text(&f.store, "a2").contains("NOT THE RUNNER'S"));
}

#[test]
fn keeping_again_after_a_crash_makes_one_whole_copy() {
    let f = Fixture::new();
    std::fs::write(f.diag().join("Runner_1.log"), "first words\n").unwrap();
    // A crash mid-copy left a partial temporary copy: it is replaced, never shown.
    let temp = f.store.dir().join(".tmp-a3");
    std::fs::create_dir_all(&temp).unwrap();
    std::fs::write(temp.join("Runner_1.log"), "partial").unwrap();
    assert!(
        f.store.entries().unwrap().is_empty(),
        "a temporary copy is no entry"
    );
    assert!(matches!(
        f.store.keep(&f.attempt("a3"), 5).unwrap(),
        Kept::Made(_)
    ));
    assert!(!temp.exists());
    // A crash after the copy, mid-removal: the runtime is half gone when cleanup runs again.
    // The whole copy stays; the half runtime is not copied over it.
    std::fs::remove_file(f.diag().join("Runner_1.log")).unwrap();
    assert_eq!(f.store.keep(&f.attempt("a3"), 6).unwrap(), Kept::Already);
    assert!(kept_text(&f.store, "a3").contains("first words"));
    // A runtime already gone: the attempt still gets an entry (saying it had nothing).
    std::fs::remove_dir_all(f.dir.path().join("runtime")).unwrap();
    let Kept::Made(manifest) = f.store.keep(&f.attempt("a4"), 7).unwrap() else {
        panic!("an entry is made");
    };
    assert!(manifest.files.is_empty() && manifest.left_out.is_empty());
}

#[test]
fn the_store_prunes_on_disk_by_its_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(
        dir.path(),
        Bounds {
            keep: 3,
            max_age: Duration::from_secs(3600),
            max_total: u64::MAX,
        },
    );
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(runtime.join("_diag")).unwrap();
    std::fs::write(runtime.join("_diag/Runner_1.log"), "x\n").unwrap();
    for i in 0..5 {
        let attempt = Attempt {
            attempt_id: format!("a{i}"),
            runner_name: "r".to_owned(),
            policy: "p".to_owned(),
            job_id: None,
            runtime_dir: runtime.clone(),
        };
        store.keep_and_prune(&attempt, i * 1000);
    }
    let mut left: Vec<String> = store
        .entries()
        .unwrap()
        .into_iter()
        .map(|(e, _)| e.attempt)
        .collect();
    left.sort();
    assert_eq!(left, ["a2", "a3", "a4"]);
    // An hour later and one more: only it is young enough.
    assert_eq!(store.prune(4000 + 3_600_001).unwrap().len(), 3);
}

#[test]
fn the_output_file_is_made_in_diag_for_appending() {
    let f = Fixture::new();
    std::fs::remove_dir(f.diag()).unwrap();
    let runtime = f.dir.path().join("runtime");
    let mut out = open_output(&runtime, None).unwrap();
    out.write_all(b"one\n").unwrap();
    let mut again = open_output(&runtime, None).unwrap();
    again.write_all(b"two\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.diag().join(OUTPUT_FILE)).unwrap(),
        "one\ntwo\n"
    );
    // A link planted where the file goes is refused, not followed.
    std::fs::remove_file(f.diag().join(OUTPUT_FILE)).unwrap();
    let target = f.dir.path().join("target");
    std::os::unix::fs::symlink(&target, f.diag().join(OUTPUT_FILE)).unwrap();
    assert!(open_output(&runtime, None).is_err());
    assert!(!target.exists());
    // Nor a hard link to another file (its owner would become the runner's uid).
    std::fs::remove_file(f.diag().join(OUTPUT_FILE)).unwrap();
    std::fs::write(&target, "root's\n").unwrap();
    std::fs::hard_link(&target, f.diag().join(OUTPUT_FILE)).unwrap();
    assert!(open_output(&runtime, Some((64_999, 64_999))).is_err());
    assert_eq!(
        std::fs::metadata(&target).unwrap().uid(),
        rustix::process::geteuid().as_raw()
    );
}

// ---- any_listener_log_tail: which files a listener-log check reads ----

/// The words every check below looks for.
const WORDS: &str = "the runner's own words\n";

fn says_words(diag: &Path) -> bool {
    copy::any_listener_log_tail(diag, 1024, |text| text.contains(WORDS))
}

#[test]
fn only_the_tail_of_a_listener_log_is_read() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!says_words(dir.path()));
    assert!(!says_words(&dir.path().join("missing")));
    // In a file that is not the listener's: not the runner's word.
    std::fs::write(dir.path().join("Worker_1-utc.log"), WORDS).unwrap();
    std::fs::write(dir.path().join("notes.txt"), WORDS).unwrap();
    assert!(!says_words(dir.path()));
    // Before the tail: not read.
    let early = format!("{WORDS}{}", "x".repeat(2048));
    std::fs::write(dir.path().join("Runner_1-utc.log"), early).unwrap();
    assert!(!says_words(dir.path()));
    std::fs::write(dir.path().join("Runner_2-utc.log"), WORDS).unwrap();
    assert!(says_words(dir.path()));
}

#[test]
fn a_link_named_like_a_listener_log_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere.txt");
    std::fs::write(&elsewhere, WORDS).unwrap();
    let diag = dir.path().join("_diag");
    std::fs::create_dir(&diag).unwrap();
    std::os::unix::fs::symlink(&elsewhere, diag.join("Runner_1-utc.log")).unwrap();
    assert!(!says_words(&diag));
}

#[test]
fn a_fifo_named_like_a_listener_log_is_never_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let diag = dir.path().join("_diag");
    std::fs::create_dir(&diag).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        diag.join("Runner_1-utc.log"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    std::fs::write(diag.join("Runner_2-utc.log"), WORDS).unwrap();
    // Returns (no writer ever opens the FIFO) and still reads the real log beside it.
    assert!(says_words(&diag));
}
