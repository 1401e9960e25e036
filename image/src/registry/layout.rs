//! The OCI image layout a download writes (`oci-layout`, `index.json`, `blobs/sha256/<hex>`):
//! where each blob goes, the temporary file it is streamed to before it is verified and renamed
//! into place (so a path under `blobs/` only ever holds verified bytes, and a download cut short
//! leaves whole blobs that the next one keeps), and `index.json`, written last. Blocking file
//! I/O: the caller runs it off the async workers.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest as _, Sha256};

use super::Digest;

/// The name prefix of a blob being downloaded, in `blobs/sha256/`. A download removes those it
/// finds (the leftovers of a crash), so two downloads must not share a layout at once.
pub(crate) const PARTIAL_PREFIX: &str = ".partial-";

/// The read size when a blob already present is hashed.
const HASH_CHUNK: usize = 256 * 1024;

/// `oci-layout`'s content: the version of the image layout spec written.
const OCI_LAYOUT: &str = "{\"imageLayoutVersion\":\"1.0.0\"}";

/// The annotation naming a manifest's tag in `index.json` (what `oci:<dir>:<tag>` looks up).
pub(crate) const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Makes the names of partial files unique within this process (the pid makes them unique
/// between processes).
static PARTIAL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An image layout directory being filled.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    dir: PathBuf,
    blobs: PathBuf,
}

impl Layout {
    /// Creates `dir` and `dir/blobs/sha256` as needed and removes partial blobs left by a
    /// download that did not finish.
    pub(crate) fn prepare(dir: &Path) -> io::Result<Layout> {
        let blobs = dir.join("blobs").join("sha256");
        fs::create_dir_all(&blobs)?;
        for entry in fs::read_dir(&blobs)? {
            let entry = entry?;
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(PARTIAL_PREFIX))
            {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(Layout {
            dir: dir.to_owned(),
            blobs,
        })
    }

    /// Where blob `digest` lives.
    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    /// A fresh partial file name for `digest`.
    pub(crate) fn partial_path(&self, digest: &Digest) -> PathBuf {
        let n = PARTIAL_COUNTER.fetch_add(1, Ordering::Relaxed);
        self.blobs.join(format!(
            "{PARTIAL_PREFIX}{}-{}-{n}",
            digest.hex(),
            std::process::id()
        ))
    }

    /// Whether blob `digest` is present with exactly those bytes (and `size` of them, when
    /// given). A blob present that does not verify is removed, so it is fetched again.
    pub(crate) fn verified(&self, digest: &Digest, size: Option<u64>) -> io::Result<bool> {
        let path = self.blob_path(digest);
        let mut file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; HASH_CHUNK];
        let mut total: u64 = 0;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            total += n as u64;
        }
        let good = size.is_none_or(|s| s == total) && Digest::from_hasher(hasher) == *digest;
        if !good {
            tracing::warn!(blob = %digest, path = %path.display(),
                "a blob in the layout does not match its digest; removed, fetched again");
            fs::remove_file(&path)?;
        }
        Ok(good)
    }

    /// Blob `digest`'s bytes when it is present, verifies and is at most `max` bytes long.
    pub(crate) fn read_verified(&self, digest: &Digest, max: u64) -> io::Result<Option<Vec<u8>>> {
        let path = self.blob_path(digest);
        match fs::metadata(&path) {
            Ok(meta) if meta.len() > max => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        let bytes = fs::read(&path)?;
        if Digest::of(&bytes) == *digest {
            Ok(Some(bytes))
        } else {
            fs::remove_file(&path)?;
            Ok(None)
        }
    }

    /// Writes blob `digest` (bytes already verified by the caller) through a partial file.
    pub(crate) fn put(&self, digest: &Digest, bytes: &[u8]) -> io::Result<()> {
        let partial = self.partial_path(digest);
        let written = write_synced(&partial, bytes)
            .and_then(|()| fs::rename(&partial, self.blob_path(digest)));
        if written.is_err() {
            let _ = fs::remove_file(&partial);
        }
        written
    }

    /// Writes `oci-layout` and then `index.json` (through a temporary file and a rename: a
    /// layout whose `index.json` exists is complete), and syncs the directories.
    pub(crate) fn finish(&self, index_json: &[u8]) -> io::Result<()> {
        let layout_file = self.dir.join("oci-layout");
        write_synced(&layout_file, OCI_LAYOUT.as_bytes())?;
        let tmp = self.dir.join(".index.json.partial");
        write_synced(&tmp, index_json)?;
        fs::rename(&tmp, self.dir.join("index.json"))?;
        fs::File::open(&self.blobs)?.sync_all()?;
        fs::File::open(&self.dir)?.sync_all()
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
