//! What the journal does when the disk fails it: a failed flush poisons it and says so, with
//! why, to whoever waits for that.

use std::time::Duration;

use rm_handlers::Source;

use crate::*;

/// Generous bound for a thread to react (2 busy cores).
const REACT: Duration = Duration::from_secs(10);

fn ping(guid: &str) -> Incoming {
    Incoming {
        guid: guid.to_owned(),
        event: "ping".to_owned(),
        headers: vec![("x-github-event".to_owned(), "ping".to_owned())],
        body: br#"{"zen":"Keep it logically awesome.","hook_id":1}"#.to_vec(),
        received_at_ms: 1,
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
