//! A data directory and journal that already exist with modes others can read (made by hand,
//! by an older rm, under umask 022) are repaired when `rm-agent receive` starts, and the log
//! says so.

use std::os::unix::fs::PermissionsExt as _;

use rm_e2e::{Setup, delivery};

fn mode_of(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_readable_data_dir_and_journal_are_repaired_at_start() {
    let setup = Setup::new();
    let data = setup.dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    drop(rusqlite::Connection::open(setup.journal()).unwrap());
    std::fs::set_permissions(setup.journal(), std::fs::Permissions::from_mode(0o644)).unwrap();

    let agent = setup.start_receiver().await;
    assert_eq!(
        agent
            .deliver(&delivery("workflow_job.queued.6", Some(1)))
            .await,
        Ok(202)
    );
    assert_eq!(mode_of(&data), 0o711);
    let mut wal = setup.journal().into_os_string();
    wal.push("-wal");
    for file in [setup.journal(), wal.into()] {
        assert_eq!(mode_of(&file), 0o600, "{}", file.display());
    }
    let logs = setup.logs();
    assert!(
        logs.contains("repaired the data directory's mode") && logs.contains("was=\"0755\""),
        "{logs}"
    );
    assert!(logs.contains("repaired the journal's mode"), "{logs}");
}
