//! The relay's store on a full filesystem (a small tmpfs the test mounts): ingest answers 503
//! and never a 2xx for what it did not store, streams keep serving what is stored, and
//! everything resumes by itself once space returns, with every 2xx still there after SIGKILL.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    _tmp: tempfile::TempDir,
    mount: PathBuf,
}

impl Tmpfs {
    /// `None` (after a loud line) only where mounting is impossible: not root.
    fn mount(size: &str) -> Option<Tmpfs> {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path().join("fs");
        std::fs::create_dir(&mount).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&mount)
            .output()
            .unwrap();
        if !out.status.success() {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let root = status
                .lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
            assert!(
                !root,
                "mount -t tmpfs failed as root: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            crate::skip::cannot_run(
                "the relay on a full disk",
                "root",
                &format!(
                    "cannot mount a tmpfs without root ({})",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            return None;
        }
        Some(Tmpfs { _tmp: tmp, mount })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let out = Command::new("umount").arg(&self.mount).output();
        if !out.is_ok_and(|o| o.status.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}

/// Fills the filesystem of `dir` with one file until the kernel says it is full.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(28) => break, // ENOSPC
            Err(err) => panic!("filling the tmpfs: {err}"),
        }
    }
    // Whatever fits of a smaller write, so not even a page is left.
    let small = [0u8; 512];
    while file.write(&small).is_ok_and(|n| n > 0) {}
    path
}

/// The status of an ingest and, for a 2xx, the id.
async fn try_ingest(url: &str, guid: &str, body: &[u8]) -> (u16, Option<i64>) {
    let (status, answer) = send(delivery(url, "workflow_job", guid, body)).await;
    let id = serde_json::from_slice::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v["id"].as_i64());
    (status, id)
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_full_disk_ingest_is_503_streams_keep_serving_and_all_resumes_when_space_returns() {
    let Some(fs) = Tmpfs::mount("8m") else {
        return;
    };
    let data = fs.mount.join("data");
    let mut relay = Relay::start(&data);
    let ch = add_channel(&data, "ci");
    let token = issue_token(&data, "ci", "h1");
    let body = |n: u8| vec![b'a' + n; 512 * 1024];
    let mut answered = Vec::new();
    let first = guid();
    let (code, id) = try_ingest(&ch.ingest_url, &first, &body(0)).await;
    assert_eq!(code, 202);
    answered.push((id.unwrap(), body(0)));
    let mut stream = Sse::open(get(&ch.subscribe_url, Some(&token), None)).await;
    assert_eq!(stream.event().await.delivery().0, answered[0].0);

    let filler = fill(&fs.mount);
    // Full: refused with 503, and whatever a 2xx says is stored (a commit that fit into space
    // SQLite already had is a real commit, checked after the SIGKILL below).
    let mut refused = Vec::new();
    for n in 1..6 {
        let g = guid();
        let (code, id) = try_ingest(&ch.ingest_url, &g, &body(n)).await;
        match code {
            503 => refused.push((g, n)),
            202 => answered.push((id.unwrap(), body(n))),
            other => panic!("ingest on a full disk answered {other}"),
        }
    }
    assert!(
        refused.len() >= 4,
        "a full disk must refuse deliveries: {} of 5 refused",
        refused.len()
    );
    // Streams keep serving what is stored: the open one and a new one replaying from 0.
    for (id, _) in &answered[1..] {
        assert_eq!(stream.event().await.delivery().0, *id);
    }
    let mut replay = Sse::open(get(&ch.subscribe_url, Some(&token), Some(0))).await;
    for (id, stored) in &answered {
        let (got, _, got_body) = replay.event().await.delivery();
        assert_eq!((got, &got_body), (*id, stored));
    }
    drop(replay);
    let (code, _) = send(get(&relay.url("/healthz"), None, None)).await;
    assert_eq!(code, 200, "the relay still serves what it has");

    // A relay (re)started while the disk is full serves what it has, too.
    drop(stream);
    relay.child.kill().unwrap();
    relay.child.wait().unwrap();
    drop(relay);
    let mut relay = Relay::start(&data);
    let ch = Channel {
        ingest_url: relay.url(
            ch.ingest_url
                .get(ch.ingest_url.find("/hooks/").unwrap()..)
                .unwrap(),
        ),
        subscribe_url: relay.url("/subscribe/ci"),
        smee_url: String::new(),
    };
    let mut stream = Sse::open(get(&ch.subscribe_url, Some(&token), Some(0))).await;
    for (id, _) in &answered {
        assert_eq!(stream.event().await.delivery().0, *id);
    }
    let (code, _) = try_ingest(&ch.ingest_url, &guid(), &body(9)).await;
    assert_eq!(code, 503, "still full");

    // Space returns: the same GUIDs (GitHub's redelivery) are taken, with no restart, and the
    // open stream gets them live.
    std::fs::remove_file(filler).unwrap();
    for (g, n) in &refused {
        let deadline = std::time::Instant::now() + PATIENCE;
        let id = loop {
            let (code, id) = try_ingest(&ch.ingest_url, g, &body(*n)).await;
            if code == 202 {
                break id.unwrap();
            }
            assert_eq!(code, 503);
            assert!(
                std::time::Instant::now() < deadline,
                "ingest did not resume after space returned"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(stream.event().await.delivery().0, id);
        answered.push((id, body(*n)));
    }
    drop(stream);

    // Every 2xx is on disk.
    relay.child.kill().unwrap();
    relay.child.wait().unwrap();
    drop(relay);
    let relay = Relay::start(&data);
    let mut replay = Sse::open(get(&relay.url("/subscribe/ci"), Some(&token), Some(0))).await;
    answered.sort_by_key(|(id, _)| *id);
    for (id, stored) in &answered {
        let (got, _, got_body) = replay.event().await.delivery();
        assert_eq!(
            (got, got_body.len(), &got_body == stored),
            (*id, stored.len(), true)
        );
    }
    replay.assert_quiet(Duration::from_millis(200)).await;
    drop(relay);
    drop(fs);
}
