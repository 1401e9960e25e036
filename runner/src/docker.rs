//! A rootless Docker daemon per runner (issue 30): what gives a job `docker`, `services:` and
//! `container:` without the host's root daemon. The daemon runs as the runner's uid, its
//! containers under that uid's subordinate ids, in the runner's cgroup (killing the cgroup ends
//! the whole tree, containers running under subordinate ids included: a sweep by uid misses
//! those) and, when given, the runner's network namespace; everything it keeps lies under the
//! runner's runtime.
//!
//! - [`subid`]: each pool uid's range in `/etc/subuid` and `/etc/subgid` (decided purely,
//!   appended atomically).
//! - [`launch`]: starting one daemon and waiting until it answers.
//! - `copy_up`: sizing rootlesskit's `/etc` and `/run` copies once it answers.
//! - [`mirror`]: the pull-through registry mirror as the daemon must address it.
//! - [`host`]: whether this host can, and why not.
//! - [`unbounded`]: what a runner's Docker leaves unbounded here, and whether the policy
//!   accepted it.

mod copy_up;
pub mod host;
pub(crate) mod launch;
pub mod mirror;
pub mod subid;
pub mod unbounded;

pub use host::{Facts, Lack, Tools, judge};
pub use launch::{
    Daemon, DaemonSpec, DockerError, ImageError, Layout, check_runner_root, check_runtime,
    daemon_tmpfs_dirs, load_images, start,
};
pub use mirror::{DaemonMirror, RegistryMirror, Route, daemon_mirror};

use std::path::PathBuf;

/// What a policy's runners get of Docker (`policy.docker`, `policy.docker_images`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerPolicy {
    /// Image tarballs (`docker save` output, absolute paths) loaded into each runner's daemon
    /// before the runner starts: images a job finds without a registry round trip.
    pub images: Vec<ImageFile>,
    /// `docker_registry_mirror`: the pull-through mirror the daemon pulls Docker Hub images
    /// through (as written; [`mirror`] says how the daemon reaches it).
    pub registry_mirror: Option<RegistryMirror>,
    /// `docker_unbounded`: what the policy accepts its Docker jobs may take without bound on a
    /// host that cannot bound it ([`unbounded`]); empty: nothing.
    pub unbounded: Vec<unbounded::Unbounded>,
}

/// The text that pins a `docker_images` entry to its content: `path@sha256:<64 hex digits>`.
const PIN: &str = "@sha256:";

/// One `policy.docker_images` entry: an image tarball and, when pinned (`path@sha256:<hex>`),
/// the SHA-256 of the whole file, which [`load_images`] checks as it streams the file to the
/// daemon (a file that differs is not loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFile {
    pub path: PathBuf,
    /// 64 lowercase hex digits.
    pub sha256: Option<String>,
}

impl ImageFile {
    /// An entry as written: a path, or a path and `@sha256:` and the file's SHA-256 (hex, any
    /// case). A path that itself holds `@sha256:` cannot be named unpinned; such an entry is
    /// taken as a pin and refused unless the digest is one. Pure.
    pub fn parse(written: &str) -> Result<ImageFile, String> {
        let Some((path, digest)) = written.rsplit_once(PIN) else {
            return Ok(ImageFile {
                path: PathBuf::from(written),
                sha256: None,
            });
        };
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "`{written}`: a pin is `{PIN}` and the file's SHA-256 in 64 hex digits (`sha256sum FILE`), not `{digest}`"
            ));
        }
        Ok(ImageFile {
            path: PathBuf::from(path),
            sha256: Some(digest.to_ascii_lowercase()),
        })
    }
}

impl From<PathBuf> for ImageFile {
    /// An unpinned entry.
    fn from(path: PathBuf) -> ImageFile {
        ImageFile { path, sha256: None }
    }
}

#[cfg(test)]
mod image_file_tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::net::UnixListener;

    /// A daemon's `/images/load` for one request: the body's bytes it got before the client's
    /// end, and the `Content-Length` it was announced (nothing is unpacked); then a `Loaded
    /// image` answer.
    fn fake_daemon(socket: &std::path::Path) -> std::thread::JoinHandle<(u64, u64)> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            // The body's offset and its announced length, once the head is in.
            let head_of = |got: &[u8]| -> Option<(usize, u64)> {
                let text = String::from_utf8_lossy(got);
                let end = text.find("\r\n\r\n")?;
                let length = text[..end]
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))?
                    .parse()
                    .ok()?;
                Some((end + 4, length))
            };
            let mut got = Vec::new();
            let mut buf = [0; 64 * 1024];
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
                if head_of(&got).is_some_and(|(body, length)| (got.len() - body) as u64 >= length) {
                    break;
                }
            }
            let (body, length) = head_of(&got).unwrap();
            let _ = stream
                .write_all(b"HTTP/1.0 200 OK\r\n\r\n{\"stream\":\"Loaded image: pg:15\\n\"}\n");
            ((got.len() - body) as u64, length)
        })
    }

    /// `load_images` as each runner's start calls it: a tarball a job could change is refused
    /// before the daemon is even reached; a pinned one that is not the pinned file never reaches
    /// the daemon whole (its last `HELD_BACK` bytes kept back) and is refused naming both
    /// digests; the pinned file itself is sent whole and loaded.
    #[test]
    fn an_image_is_judged_and_its_pin_checked_as_it_is_streamed() {
        use sha2::Digest as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let file = dir.join("pg.tar");
        let bytes: Vec<u8> = (0..launch::HELD_BACK * 2 + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&file, &bytes).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
        let pinned = |digest: &str| ImageFile {
            path: file.clone(),
            sha256: Some(digest.to_owned()),
        };
        let pool = crate::isolate::Pool::new(Vec::new());

        // Every user may write it: refused right before the load, no daemon asked (there is
        // none at this socket).
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = load_images(&dir.join("none.sock"), &[pinned(&sha256)], &pool).unwrap_err();
        assert!(matches!(err, ImageError::Changeable { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("chmod go-w {}", file.display())),
            "{err}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();

        // Pinned to another digest: the body stops short of the tarball's end.
        let socket = dir.join("wrong.sock");
        let daemon = fake_daemon(&socket);
        let other = "0".repeat(64);
        let err = load_images(&socket, &[pinned(&other)], &pool).unwrap_err();
        let (got, length) = daemon.join().unwrap();
        assert_eq!(length, bytes.len() as u64);
        assert_eq!(got, length - launch::HELD_BACK, "what the daemon got");
        assert!(
            matches!(&err, ImageError::Digest { found, pinned, .. } if *found == sha256 && *pinned == other),
            "{err}"
        );
        assert!(err.to_string().contains("sha256sum"), "{err}");

        // The pinned file: sent whole, loaded.
        let socket = dir.join("right.sock");
        let daemon = fake_daemon(&socket);
        let loaded = load_images(&socket, &[pinned(&sha256)], &pool).unwrap();
        assert_eq!(daemon.join().unwrap(), (length, length));
        assert_eq!(loaded, ["Loaded image: pg:15"]);
    }

    #[test]
    fn an_entry_is_a_path_or_a_path_pinned_by_its_sha256() {
        let hex = "ab".repeat(32);
        assert_eq!(
            ImageFile::parse("/srv/images/pg.tar").unwrap(),
            ImageFile::from(PathBuf::from("/srv/images/pg.tar"))
        );
        assert_eq!(
            ImageFile::parse(&format!("/srv/images/pg.tar@sha256:{}", hex.to_uppercase())).unwrap(),
            ImageFile {
                path: "/srv/images/pg.tar".into(),
                sha256: Some(hex.clone()),
            }
        );
        // An `@` elsewhere is part of the path.
        assert_eq!(
            ImageFile::parse("/srv/pg@15.tar").unwrap().path,
            PathBuf::from("/srv/pg@15.tar")
        );
        for bad in [
            "/srv/pg.tar@sha256:".to_owned(),
            "/srv/pg.tar@sha256:abc".to_owned(),
            format!("/srv/pg.tar@sha256:{}", "g".repeat(64)),
            format!("/srv/pg.tar@sha256:{hex}0"),
        ] {
            let err = ImageFile::parse(&bad).unwrap_err();
            assert!(err.contains("64 hex digits"), "{bad}: {err}");
        }
    }
}
