//! A full filesystem for the tests that need one: a small tmpfs mounted on a directory (the
//! tests run as root) and a file that fills it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `size` mounted on `dir`, unmounted when dropped.
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount -t tmpfs (these tests run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            dir: dir.to_owned(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let out = Command::new("umount").arg(&self.dir).output();
        if !out.is_ok_and(|o| o.status.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Fills the filesystem holding `dir` until the kernel says it is full; the filler's path.
pub fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    for size in [64 * 1024, 4096, 512, 1] {
        let chunk = vec![0u8; size];
        loop {
            match file.write(&chunk) {
                Ok(n) if n == size => {}
                Ok(_) => break,
                Err(err) if err.raw_os_error() == Some(28) => break, // ENOSPC
                Err(err) => panic!("filling the tmpfs: {err}"),
            }
        }
    }
    path
}
