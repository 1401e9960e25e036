//! What the journal does when the disk fails it: a failed flush poisons it and says so, with
//! why, to whoever waits for that.

use std::time::Duration;

use rm_vocab::Source;

use crate::*;

/// Generous bound for a thread to react (2 busy cores).
const REACT: Duration = Duration::from_secs(10);

fn ping(guid: &str) -> Incoming {
    Incoming {
        guid: guid.to_owned(),
        event: "ping".to_owned(),
        headers: vec![("x-github-event".to_owned(), "ping".to_owned())],
        body: br#"{"zen":"Keep it logically awesome.","hook_id":1}"#.to_vec(),
        received_at_ms: rm_vocab::UnixMs::new(1),
        source: Source::Webhook,
    }
}

/// A failed flush completes `poisoned()` with the flush's error; until then it stays pending.
#[tokio::test]
async fn a_failed_flush_tells_the_process_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    let (flushes, rx) = std::sync::mpsc::channel::<bool>();
    let flush: crate::sync::SyncFn = Box::new(move || match rx.recv() {
        Ok(true) => Ok(()),
        _ => Err(std::io::Error::other("injected EIO")),
    });
    let journal = Journal::open_with_sync(&path, Retention::default(), flush).unwrap();
    flushes.send(true).unwrap();
    journal.record(ping("ok")).await.unwrap();
    assert!(journal.poison_reason().is_none());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), journal.poisoned())
            .await
            .is_err(),
        "poisoned before any flush failed"
    );

    flushes.send(false).unwrap();
    assert!(journal.record(ping("lost")).await.is_err());
    let reason = tokio::time::timeout(REACT, journal.poisoned())
        .await
        .expect("poisoned() did not complete");
    assert!(reason.contains("injected EIO"), "{reason}");
    assert_eq!(journal.poison_reason(), Some(reason));
}

fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A journal (and its WAL and shared-memory files) that others could read, left by an older rm
/// or made under umask 022, is made private when the journal opens; a new one is private
/// whatever the umask (SQLite alone creates it 0644 less the umask).
#[tokio::test]
async fn the_journal_is_private_to_its_owner_new_or_inherited() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    let journal = Journal::open(&path, Retention::default()).unwrap();
    journal.record(ping("new")).await.unwrap();
    drop(journal);
    assert_eq!(mode_of(&path), 0o600);

    let inherited = dir.path().join("old").join(JOURNAL_FILE);
    std::fs::create_dir(inherited.parent().unwrap()).unwrap();
    {
        let conn = rusqlite::Connection::open(&inherited).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
        std::mem::forget(conn); // keeps the WAL and shared-memory files, as a crash would
    }
    let files: Vec<_> = ["", "-wal", "-shm"]
        .iter()
        .map(|s| {
            let mut f = inherited.as_os_str().to_owned();
            f.push(s);
            std::path::PathBuf::from(f)
        })
        .collect();
    for file in &files {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let journal = Journal::open(&inherited, Retention::default()).unwrap();
    journal.record(ping("after")).await.unwrap();
    for file in &files {
        assert_eq!(mode_of(file), 0o600, "{}", file.display());
    }
}
