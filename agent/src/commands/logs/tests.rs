//! `rm-agent logs`: which attempts an argument names (the journal's, then kept copies only),
//! a kept copy printed file by file, a job's bytes escaped for the terminal (by table), and
//! the live view of a hostile `_diag` (escape sequences, 256 sparse files) printed escaped
//! under the attempt's budget, counted by the code's own accounting and, in a child process,
//! by its peak memory. The whole path (a runner cleaned up, its logs kept and printed) is the
//! executor harness's `a_cleaned_attempts_diag_is_kept_scrubbed_once_and_printed_by_logs`.

#![allow(
    clippy::unwrap_used,
    reason = "a failed step in a test helper should fail the test loudly"
)]

use std::io::Write as _;

use rm_runner::logs::copy::{MAX_PIECE, READ_CHUNK};
use rm_runner::logs::{Attempt, Bounds, Kept, Manifest, PER_ATTEMPT_CAP, Store};

use super::*;

/// What a printer over memory printed.
fn printed(out: Printer<Vec<u8>>) -> String {
    String::from_utf8(out.into_inner()).unwrap()
}

/// What `escape` shows of `bytes`.
fn shown(bytes: &[u8], line_start: bool) -> String {
    let mut out = String::new();
    terminal::escape(bytes, line_start, &mut out);
    out
}

fn manifest(attempt_id: &str, runner: &str, job: Option<i64>, at: i64) -> Manifest {
    Manifest {
        attempt_id: attempt_id.to_owned(),
        runner_name: runner.to_owned(),
        policy: "linux".to_owned(),
        job_id: job,
        kept_at_ms: at,
        files: Vec::new(),
        left_out: Vec::new(),
    }
}

#[test]
fn a_job_a_runner_or_an_attempt_names_its_kept_attempts_oldest_first() {
    let kept = || {
        vec![
            manifest("bbbb", "rm-h-bbbb", Some(7), 20),
            manifest("aaaa", "rm-h-aaaa", Some(7), 10),
            manifest("cccc", "rm-h-cccc", None, 30),
        ]
    };
    let ids = |target: &str| -> Vec<String> {
        resolve(target, None, &[], kept())
            .into_iter()
            .map(|f| f.attempt_id)
            .collect()
    };
    // A job retried on two runners: both, oldest first.
    assert_eq!(ids("7"), ["aaaa", "bbbb"]);
    assert_eq!(ids("rm-h-cccc"), ["cccc"]);
    assert_eq!(ids("bbbb"), ["bbbb"]);
    assert!(ids("8").is_empty());
    assert!(ids("rm-h-dddd").is_empty());
    // A job whose row names its runner, where the attempt never learnt the job.
    let by_row: Vec<String> = resolve("9", Some("rm-h-cccc"), &[], kept())
        .into_iter()
        .map(|f| f.attempt_id)
        .collect();
    assert_eq!(by_row, ["cccc"]);
}

#[test]
fn a_kept_copy_prints_file_by_file_with_a_header_each() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(runtime.join("_diag")).unwrap();
    std::fs::write(runtime.join("_diag/Runner_1.log"), "listening\n").unwrap();
    std::fs::write(
        runtime.join("_diag/Worker_1.log"),
        "step one\nAuthorization: Bearer x\n",
    )
    .unwrap();
    let store = Store::new(dir.path(), Bounds::default());
    let attempt = Attempt {
        attempt_id: "0123456789ab".to_owned(),
        runner_name: "rm-h-0123456789ab".to_owned(),
        policy: "linux".to_owned(),
        job_id: Some(5),
        runtime_dir: runtime.clone(),
    };
    // Live: read from the runtime the same way.
    let mut live = Printer::new(Vec::new());
    render_live(&runtime, &mut live);
    let live = printed(live);
    assert!(live.contains("--- Worker_1.log (live"), "{live}");
    assert!(matches!(store.keep(&attempt, 1).unwrap(), Kept::Made(_)));
    std::fs::remove_dir_all(&runtime).unwrap();
    assert_eq!(
        kept_text(&store, "0123456789ab"),
        "--- Worker_1.log (33 bytes) ---\nstep one\nAuthorization: [redacted]\n\
         --- Runner_1.log (10 bytes) ---\nlistening\n"
    );
    assert!(kept_text(&store, "ffffffffffff").starts_with("(no logs kept"));
}

#[test]
fn follow_prints_whole_lines_as_they_come_and_resumes_in_the_kept_copy() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    std::fs::create_dir_all(runtime.join("_diag")).unwrap();
    let path = runtime.join("_diag/Worker_1.log");
    let mut log = std::fs::File::create(&path).unwrap();
    let mut followed = HashMap::new();
    let mut current = None;
    let mut out = Printer::new(Vec::new());
    log.write_all(b"one\ntwo\nthr").unwrap();
    assert_eq!(
        follow_once(&runtime, &mut followed, &mut current, &mut out),
        11
    );
    let seen = &followed["Worker_1.log"];
    // A line still being written waits for its end.
    assert_eq!((seen.offset, seen.lines), (8, 2));
    log.write_all(b"ee\x1b[2K\n").unwrap();
    follow_once(&runtime, &mut followed, &mut current, &mut out);
    assert_eq!(followed["Worker_1.log"].lines, 3);
    assert_eq!(current.as_deref(), Some("Worker_1.log"));
    assert_eq!(
        printed(out),
        "--- Worker_1.log ---\none\ntwo\nthree\\x1b[2K\n"
    );
    // Cleaned up: the kept copy's lines after the three shown are the rest.
    let kept = dir.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    std::fs::write(
        kept.join("Worker_1.log"),
        b"one\ntwo\nthree\nfour\nfi\x07ve",
    )
    .unwrap();
    for (skip, rest) in [
        (3, "four\nfi\\x07ve\n"),
        (0, "one\ntwo\nthree\nfour\nfi\\x07ve\n"),
        (9, ""),
    ] {
        let mut out = Printer::new(Vec::new());
        print_kept_file(&kept, "Worker_1.log", skip, &mut out).unwrap();
        assert_eq!(printed(out), rest, "after {skip} lines");
    }
}

#[test]
fn follow_shows_whole_lines_or_a_piece_of_a_line_longer_than_a_chunk() {
    let full = vec![b'a'; FOLLOW_CHUNK as usize];
    let mut words = vec![b'w'; FOLLOW_CHUNK as usize];
    words[10] = b' ';
    let shown = |text, consumed, whole_lines| {
        Some(Shown {
            text,
            consumed,
            whole_lines,
        })
    };
    // (read, what is shown: the text, the bytes consumed, whether it is whole lines)
    let cases: [(&[u8], Option<Shown>); 5] = [
        (b"one\ntwo\nthr", shown(b"one\ntwo", 8, true)),
        (b"one\n", shown(b"one", 4, true)),
        (b"a line being written", None),
        // A chunk with no line end: a piece, cut after its last space, else whole.
        (&words, shown(&words[..11], 11, false)),
        (&full, shown(&full[..full.len() - 1], full.len() - 1, false)),
    ];
    for (read, expected) in cases {
        assert_eq!(
            split_shown(read),
            expected,
            "{:?}",
            &read[..read.len().min(20)]
        );
    }
}

#[test]
fn a_jobs_bytes_reach_the_terminal_escaped() {
    // (bytes, at a line start, shown)
    let cases: [(&[u8], bool, &str); 15] = [
        (
            b"plain text\twith a tab\n",
            true,
            "plain text\twith a tab\n",
        ),
        // OSC 52: a write to the operator's clipboard.
        (
            b"\x1b]52;c;cm0gLXJmIH4=\x07",
            true,
            "\\x1b]52;c;cm0gLXJmIH4=\\x07",
        ),
        // A carriage return and a line erase over a redaction marker.
        (
            b"key [redacted github token]\r\x1b[2Kall clean",
            true,
            "key [redacted github token]\\x0d\\x1b[2Kall clean",
        ),
        (b"\x00\x08\x0b\x0c\x7f", true, "\\x00\\x08\\x0b\\x0c\\x7f"),
        // C1 controls (CSI, OSC, ST as one character each).
        (
            "\u{9b}31m\u{9d}0;t\u{9c}".as_bytes(),
            true,
            "\\u{9b}31m\\u{9d}0;t\\u{9c}",
        ),
        // Bytes that are not UTF-8, one by one; a character cut short too.
        (b"\xff\xfe ok \xc3", true, "\\xff\\xfe ok \\xc3"),
        // A lone C1 byte is not UTF-8: shown as the byte it is.
        (b"\x9b31m", true, "\\x9b31m"),
        (
            "caf\u{e9} \u{1f600} \u{4e2d}".as_bytes(),
            true,
            "caf\u{e9} \u{1f600} \u{4e2d}",
        ),
        // What reorders or breaks a line.
        (
            "a\u{202e}exe.png\u{2028}b\u{2066}".as_bytes(),
            true,
            "a\\u{202e}exe.png\\u{2028}b\\u{2066}",
        ),
        // A line shaped like this command's own headers is marked, at any line start.
        (
            b"=== attempt ffff runner x ===\n--- Worker_1.log ---\n",
            true,
            "\\=== attempt ffff runner x ===\n\\--- Worker_1.log ---\n",
        ),
        (b"a\n=== b", false, "a\n\\=== b"),
        (
            b"=== in the middle of a line",
            false,
            "=== in the middle of a line",
        ),
        (b"== -- =", true, "== -- ="),
        // A backslash is the job's own: printed as it is.
        (
            b"\\x1b is four characters",
            true,
            "\\x1b is four characters",
        ),
        (b"", true, ""),
    ];
    for (bytes, line_start, expected) in cases {
        assert_eq!(shown(bytes, line_start), expected, "{bytes:?}");
    }
}

/// How many sparse files the hostile `_diag` holds, and the size of each: under the file cap
/// (each is read whole, zeros without a line end), and together far over the attempt's.
const SPARSE_FILES: usize = 256;
const SPARSE_SIZE: u64 = 4 << 20;

/// A `_diag` as a hostile job leaves it: escape sequences in the files a runner writes (a
/// clipboard write, a fake header, a line erase over a redaction marker, a colour, a C1
/// control, bytes that are not UTF-8), and [`SPARSE_FILES`] sparse files.
fn hostile_diag(runtime: &Path) {
    let diag = runtime.join("_diag");
    std::fs::create_dir_all(&diag).unwrap();
    std::fs::write(
        diag.join("Worker_1.log"),
        b"step one\n\x1b]52;c;cm0gLXJmIH4=\x07copied\n\
          === attempt ffffffffffff runner rm-h-fake (job 1, cleaned) ===\n\
          token ghp_0123456789abcdefghijABCDEFGHIJ\r\x1b[2Kall clean\n",
    )
    .unwrap();
    std::fs::write(
        diag.join("rm-output.log"),
        b"\x1b[31mred\x1b[0m \xc2\x9b\xff\n",
    )
    .unwrap();
    for i in 0..SPARSE_FILES {
        std::fs::File::create(diag.join(format!("sparse-{i:03}.log")))
            .unwrap()
            .set_len(SPARSE_SIZE)
            .unwrap();
    }
}

/// What the live view printed, seen as it streams by: its size, the raw control bytes in it
/// (none may reach a terminal), the largest write, and its first and last bytes.
#[derive(Default)]
struct Seen {
    bytes: u64,
    controls: u64,
    largest_write: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// How much of the start and of the end of the output [`Seen`] keeps.
const SEEN_ENDS: usize = 64 << 10;

impl io::Write for Seen {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes += buf.len() as u64;
        self.largest_write = self.largest_write.max(buf.len());
        self.controls += buf
            .iter()
            .filter(|b| b.is_ascii_control() && !matches!(b, b'\n' | b'\t'))
            .count() as u64;
        let room = SEEN_ENDS.saturating_sub(self.head.len());
        self.head.extend_from_slice(&buf[..buf.len().min(room)]);
        self.tail
            .extend_from_slice(&buf[buf.len().saturating_sub(SEEN_ENDS)..]);
        let over = self.tail.len().saturating_sub(SEEN_ENDS);
        self.tail.drain(..over);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The live view of [`hostile_diag`] through the printer `logs` uses (its output buffer
/// included), into [`Seen`].
fn live_view(runtime: &Path) -> (Streamed, Seen) {
    let mut out = Printer::new(io::BufWriter::with_capacity(OUTPUT_BUFFER, Seen::default()));
    let streamed = render_live(runtime, &mut out);
    out.flush();
    let seen = out
        .into_inner()
        .into_inner()
        .map_err(|e| e.into_error())
        .unwrap();
    (streamed, seen)
}

/// The live view of [`hostile_diag`] at `runtime`, checked: escaped, read under the attempt's
/// budget, held in a chunk and a piece. Returns its line for the parent.
fn check_live_view(runtime: &Path) -> String {
    let (streamed, seen) = live_view(runtime);

    // Escaped: no control byte but line ends and tabs reached the writer.
    assert_eq!(seen.controls, 0);
    let head = String::from_utf8_lossy(&seen.head);
    assert!(
        head.starts_with(
            "--- rm-output.log (live, 17 bytes) ---\n\\x1b[31mred\\x1b[0m \\u{9b}\\xff\n"
        ),
        "{head}"
    );
    assert!(
        head.contains(
            "step one\n\\x1b]52;c;cm0gLXJmIH4=\\x07copied\n\
             \\=== attempt ffffffffffff runner rm-h-fake (job 1, cleaned) ===\n\
             token [redacted github token]\\x0d\\x1b[2Kall clean\n"
        ),
        "{head}"
    );
    assert!(!head.contains("ghp_0123"), "{head}");

    // Read under the attempt's budget, by the code's own count: the files before it was spent
    // whole (zeros, each shown as `\x00`), the rest named as left out, not read.
    assert!(
        streamed.read <= PER_ATTEMPT_CAP + 2 * READ_CHUNK as u64,
        "{streamed:?}"
    );
    let named: u64 = ["Worker_1.log", "rm-output.log"]
        .iter()
        .map(|name| {
            std::fs::metadata(runtime.join("_diag").join(name))
                .unwrap()
                .len()
        })
        .sum();
    // The files read whole, then one read to what was left of the budget (its head and tail:
    // zeros without a line end show only the marker), then the names left out.
    let read_whole = usize::try_from((PER_ATTEMPT_CAP - named) / SPARSE_SIZE).unwrap();
    let zeros = read_whole as u64 * SPARSE_SIZE;
    assert!(
        seen.bytes > 4 * zeros && seen.bytes < 4 * zeros + SEEN_ENDS as u64,
        "{} for {zeros} zeros",
        seen.bytes
    );
    let tail = String::from_utf8_lossy(&seen.tail);
    let left_out = |i: usize| {
        format!(
            "--- sparse-{i:03}.log (left out: the attempt's {PER_ATTEMPT_CAP} bytes were read already) ---\n"
        )
    };
    assert!(
        tail.contains(&format!(
            "--- sparse-{read_whole:03}.log (live, {SPARSE_SIZE} bytes, read to "
        )),
        "{tail}"
    );
    assert!(!tail.contains(&left_out(read_whole)));
    for i in [read_whole + 1, SPARSE_FILES - 1] {
        assert!(tail.contains(&left_out(i)), "{}", left_out(i));
    }
    // Memory, by the code's own count: the reader held a chunk and a piece of a line at most;
    // the writer got the output buffer's writes, never a file's.
    assert!(streamed.held <= 2 * READ_CHUNK + MAX_PIECE, "{streamed:?}");
    assert!(
        seen.largest_write <= 4 * MAX_PIECE + 1,
        "{}",
        seen.largest_write
    );
    format!(
        "read {} held {} printed {} largest write {}",
        streamed.read, streamed.held, seen.bytes, seen.largest_write
    )
}

/// Set in the child of [`the_live_view_of_a_hostile_diag_is_escaped_read_under_its_budget_and_small`]:
/// the runtime whose live view it checks.
const CHILD_RUNTIME: &str = "RM_TEST_LOGS_LIVE_VIEW_RUNTIME";

/// The most the child's peak resident memory may be: the test binary itself, the reader's chunk
/// and piece, one escaped piece, the output buffer. Far under the attempt's 64 MiB (what an
/// attempt read whole would need) and the 1.35 GB the unbounded view took on such files.
const CHILD_PEAK_MAX_KB: u64 = 32 << 10;

/// `rm-agent logs` of a running attempt whose job wrote escape sequences and 256 sparse files:
/// checked in a process of its own (this test run again as a child), so its peak memory
/// (`VmHWM`) is the view's, not other tests'.
#[test]
fn the_live_view_of_a_hostile_diag_is_escaped_read_under_its_budget_and_small() {
    const NAME: &str = "commands::logs::tests::the_live_view_of_a_hostile_diag_is_escaped_read_under_its_budget_and_small";
    if let Some(runtime) = std::env::var_os(CHILD_RUNTIME) {
        let checked = check_live_view(Path::new(&runtime));
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let peak = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        println!("child {checked} {peak}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime");
    hostile_diag(&runtime);
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_RUNTIME, &runtime)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.find("child read").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("the child said nothing: {stdout}"));
    let peak_kb: u64 = line
        .split_whitespace()
        .rev()
        .nth(1)
        .and_then(|kb| kb.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    println!("{line}");
    assert!(peak_kb <= CHILD_PEAK_MAX_KB, "{line}");
}
