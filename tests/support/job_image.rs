//! Job images for the tests of issue 40 (`policy.image`), made from Debian packages on this
//! machine, never pulled from an image registry: a minimal Debian root ([`debian_root`]: libc,
//! libgcc, busybox and its applets, base-files, and the Docker CLI taken out of `docker.io`'s
//! package), written as an OCI image layout ([`oci_layout`], deterministic, made here with tar,
//! flate2 and sha2) and copied by skopeo into the other transports ([`oci_archive`],
//! [`docker_archive`]); the root without the Docker CLI ([`slim_root`]) with an extra layer of
//! incompressible bytes ([`padded_layout`], [`padded_image`]: the setup benchmark's small and
//! 1 GiB images); hostile layouts for the unpack tests ([`hostile_layout`]) and a corrupted blob
//! ([`corrupt_one_byte`]).
//!
//! What is made once is cached under `<target>/rm-test-images/`, keyed by its inputs (the
//! Debian suite, the packages, the host's apt sources, [`CACHE_VERSION`]): made in a temporary
//! directory and renamed into place (the one commit point), under an exclusive `flock` on a
//! lock file beside it, so the threads of one test binary and concurrent test binaries make it
//! once and never see half of it. Cached trees are shared: a test that changes an image copies
//! it first ([`corrupt_one_byte`] refuses a cached layout).
//!
//! Needs `mmdebstrap`, `apt-get`, `dpkg-deb` and `skopeo` ([`missing_tool`] says which is
//! missing, for `skip::cannot_run`); `.ci/run` installs them. Making a root needs root (or
//! mmdebstrap's unshare mode).
//!
//! One file, included by path (`#[path = ".../tests/support/job_image.rs"] mod job_image;`).

#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest as _;

/// Bumped when what [`debian_root`] or the cached layout contain changes, so a target dir made
/// by an older version of this file makes them anew.
pub(crate) const CACHE_VERSION: u32 = 3;

/// The Debian packages the root is made of (with their dependencies: `gcc-12-base`): libc and
/// libgcc for a dynamically linked Rust binary (the fake runner), busybox for `/bin/sh` and the
/// usual commands, base-files for `/etc/os-release`.
pub(crate) const PACKAGES: &[&str] = &["libc6", "libgcc-s1", "busybox", "base-files"];

/// The package the Docker CLI (`/usr/bin/docker`, linked to libc alone) is taken from: Debian
/// 12 has no `docker-cli` package, and `docker.io` with its dependencies (containerd, runc,
/// iptables, ...) is far more than a client needs.
pub(crate) const DOCKER_PACKAGE: &str = "docker.io";

/// The image's own marker file: a random token, different for every root made, that no host
/// file carries.
pub(crate) const MARKER_FILE: &str = "etc/rm-test-image";

/// A directory anyone may write in (mode 1777), so a job can write into the image's tree and a
/// test show the next job does not see it.
pub(crate) const SCRATCH_DIR: &str = "srv/scratch";

/// The image's environment: `PATH` as Debian's images set it, and a variable a job shows it got.
pub(crate) const IMAGE_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("RM_IMAGE_ENV", "from-image"),
];

/// The image's `USER`: a runner runs as its own uid, never this (tests show it is ignored).
pub(crate) const IMAGE_USER: &str = "nobody";

/// The image's `WORKDIR`, which the image does not have: a job that started there would fail,
/// so a test shows it is ignored.
pub(crate) const IMAGE_WORKDIR: &str = "/nowhere";

/// The tag [`debian_image`] gives its layout.
pub(crate) const DEBIAN_TAG: &str = "bookworm-test";

/// The directory under the target dir where the images are cached.
pub(crate) const CACHE_DIR: &str = "rm-test-images";

/// The OCI media types written.
pub(crate) const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub(crate) const MEDIA_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// The annotation of index.json naming a manifest's tag.
pub(crate) const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The chunk the padding layer is generated and written in: the 1 GiB image is streamed, never
/// held in memory.
const PAD_CHUNK: usize = 1 << 20;

/// What a written image is: digests as `sha256:<hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ImageInfo {
    /// The manifest's digest: the pin of `oci:` and `oci-archive:` references.
    pub(crate) manifest_digest: String,
    /// The config's digest: the image ID, the pin of a `docker-archive:` reference (and the
    /// store's key).
    pub(crate) config_digest: String,
    /// The layers' blob digests, base first.
    pub(crate) layers: Vec<String>,
    /// The content of the image's [`MARKER_FILE`].
    pub(crate) marker: String,
}

/// The cached Debian image: its root and its OCI layout.
#[derive(Clone, Debug)]
pub(crate) struct DebianImage {
    /// The root [`debian_root`] made (shared: never change it).
    pub(crate) root: PathBuf,
    /// Its OCI layout, tagged [`DEBIAN_TAG`] (shared: copy it before changing it).
    pub(crate) layout: PathBuf,
    pub(crate) tag: &'static str,
    pub(crate) info: ImageInfo,
}

/// The first tool [`debian_root`] and the archives need that is not installed: the skip name
/// (the tool's) and why, for `skip::cannot_run`.
pub(crate) fn missing_tool() -> Option<(&'static str, String)> {
    for (tool, package) in [
        ("mmdebstrap", "mmdebstrap"),
        ("skopeo", "skopeo"),
        ("apt-get", "apt"),
        ("dpkg-deb", "dpkg"),
    ] {
        let found = Command::new(tool).arg("--version").output();
        if !found.is_ok_and(|out| out.status.success()) {
            return Some((
                tool,
                format!("`{tool}` is not installed (apt-get install {package})"),
            ));
        }
    }
    None
}

/// `<target>/rm-test-images/`: beside the profile dir (`<target>/debug`) the test binary (or
/// the bench binary, `bench/src/bin/job-image.rs`) runs from, created if need be.
pub(crate) fn cache_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test binary's path: {e}"));
    // <target>/<profile>/deps/<test binary>, or <target>/<profile>/<binary> for a bench binary.
    let in_deps = exe.parent().and_then(Path::file_name) == Some("deps".as_ref());
    let target = exe
        .ancestors()
        .nth(if in_deps { 3 } else { 2 })
        .unwrap_or_else(|| panic!("{} has no target dir", exe.display()));
    let dir = target.join(CACHE_DIR);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// A minimal Debian root of the host's suite made with mmdebstrap from the host's apt sources
/// ([`PACKAGES`], a link in `/bin` for each busybox applet, `/usr/bin/docker` from
/// [`DOCKER_PACKAGE`], root and nobody in `/etc/passwd`, the [`MARKER_FILE`], the
/// [`SCRATCH_DIR`], no device nodes), made once per target dir; its path. Shared: never change
/// it.
pub(crate) fn debian_root() -> PathBuf {
    root_with(true)
}

/// [`debian_root`] without the Docker CLI (which is 45 MB of its 58): about 13 MB, the base of
/// [`padded_image`].
pub(crate) fn slim_root() -> PathBuf {
    root_with(false)
}

/// [`debian_root`], with the Docker CLI or without.
fn root_with(docker: bool) -> PathBuf {
    let codename = host_codename();
    let sources = host_sources(&codename);
    let key = cache_key(&[
        &format!("root {CACHE_VERSION}"),
        &codename,
        &PACKAGES.join(","),
        if docker { DOCKER_PACKAGE } else { "" },
        &sources.join("\n--\n"),
    ]);
    let name = format!(
        "debian-{codename}{}-{key}",
        if docker { "" } else { "-slim" }
    );
    cached(&cache_dir(), &name, |tmp| {
        make_debian_root(tmp, &codename, &sources, docker)
    })
    .unwrap_or_else(|e| panic!("making the Debian root {name}: {e:#}"))
}

/// [`debian_root`] written as an OCI layout tagged [`DEBIAN_TAG`], both made once per target
/// dir.
pub(crate) fn debian_image() -> DebianImage {
    let root = debian_root();
    let root_name = root
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_else(|| panic!("{}: no name", root.display()));
    let name = format!("layout-{CACHE_VERSION}-{root_name}");
    let layout = cached(&cache_dir(), &name, |tmp| {
        oci_layout(&root, tmp, DEBIAN_TAG);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("writing the layout {name}: {e:#}"));
    let info = read_info(&layout, DEBIAN_TAG, &root)
        .unwrap_or_else(|e| panic!("reading the layout {}: {e}", layout.display()));
    DebianImage {
        root,
        layout,
        tag: DEBIAN_TAG,
        info,
    }
}

/// Writes `root` as an OCI image layout at `out` (which must not exist or be empty): one gzip
/// layer of the root's files (directories, files, hard links and symlinks, with their modes,
/// owners and mtimes; nothing else), a config with [`IMAGE_ENV`], [`IMAGE_USER`] and
/// [`IMAGE_WORKDIR`], its manifest, and index.json naming it `tag`. The same root gives the
/// same bytes.
pub(crate) fn oci_layout(root: &Path, out: &Path, tag: &str) -> ImageInfo {
    let marker = marker(root);
    write_layout(out, tag, &marker, &mut |blobs: &Path| {
        Ok(vec![write_layer(blobs, Compress::Gzip, &mut |tar| {
            append_tree(tar, root)
        })?])
    })
    .unwrap_or_else(|e| {
        panic!(
            "writing {} as a layout at {}: {e}",
            root.display(),
            out.display()
        )
    })
}

/// [`oci_layout`] plus a second, uncompressed layer holding one file, `/rm-padding`, of `size`
/// incompressible bytes (gzip would gain nothing on them), generated and written in chunks: the
/// 10 MiB and 1 GiB images of the setup benchmark.
pub(crate) fn padded_layout(root: &Path, out: &Path, tag: &str, size: u64) -> ImageInfo {
    let marker = marker(root);
    write_layout(out, tag, &marker, &mut |blobs: &Path| {
        let base = write_layer(blobs, Compress::Gzip, &mut |tar| append_tree(tar, root))?;
        let pad = write_layer(blobs, Compress::None, &mut |tar| {
            let mut header = file_header(0o644, size);
            tar.append_data(&mut header, "rm-padding", Xorshift::new(size))
        })?;
        Ok(vec![base, pad])
    })
    .unwrap_or_else(|e| panic!("writing a padded layout at {}: {e}", out.display()))
}

/// [`padded_layout`] of [`slim_root`] with `size` bytes of padding, tagged [`DEBIAN_TAG`], made
/// once per target dir and size (the padding's bytes are the same every time): the setup
/// benchmark's small image (`padded_image(0)`, about 13 MB) and large one (`padded_image(1 <<
/// 30)`), alike but for the size of their second layer.
pub(crate) fn padded_image(size: u64) -> DebianImage {
    let root = slim_root();
    let root_name = root
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_else(|| panic!("{}: no name", root.display()));
    let name = format!("padded-{size}-{CACHE_VERSION}-{root_name}");
    let layout = cached(&cache_dir(), &name, |tmp| {
        padded_layout(&root, tmp, DEBIAN_TAG, size);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("writing the layout {name}: {e:#}"));
    let info = read_info(&layout, DEBIAN_TAG, &root)
        .unwrap_or_else(|e| panic!("reading the layout {}: {e}", layout.display()));
    DebianImage {
        root,
        layout,
        tag: DEBIAN_TAG,
        info,
    }
}

/// `skopeo copy oci:<layout>:<tag> oci-archive:<file>:<tag>`; the archive's manifest digest
/// (skopeo copies an OCI image as it is, so it is the layout's).
pub(crate) fn oci_archive(layout: &Path, tag: &str, file: &Path) -> String {
    skopeo_copy(
        &format!("oci:{}:{tag}", layout.display()),
        &format!("oci-archive:{}:{tag}", file.display()),
    );
    skopeo_digest(&format!("oci-archive:{}:{tag}", file.display()))
}

/// `skopeo copy oci:<layout>:<tag> docker-archive:<file>:<name>` (`name` such as
/// `rm-test/debian:bookworm`): `docker save`'s format, the image ID (the config digest, the pin
/// of a `docker-archive:` reference) as the manifest names it; that ID.
pub(crate) fn docker_archive(layout: &Path, tag: &str, file: &Path, name: &str) -> String {
    skopeo_copy(
        &format!("oci:{}:{tag}", layout.display()),
        &format!("docker-archive:{}:{name}", file.display()),
    );
    docker_archive_id(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// The hostile layers of the unpack tests: each a second layer over a benign base (the
/// directories `bin`, `dev`, `etc`, `tmp` and the [`MARKER_FILE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hostile {
    /// A file named `../../..(32 times)/etc/rm-escape-<token>`: where an unpacker that joins
    /// names to its root writes, on the host's `/etc` at any depth.
    PathTraversal,
    /// A file named `/etc/rm-escape-<token>`.
    AbsolutePath,
    /// `etc/evil -> /etc` (an absolute symlink), then a file `etc/evil/rm-escape-<token>`
    /// through it: lands on the host's `/etc` if the unpacker follows the link on the host.
    AbsoluteSymlinkEscape,
    /// `etc/up -> ../../..(32 times)/etc` (a relative symlink out of the root), then a file
    /// `etc/up/rm-escape-<token>` through it.
    RelativeSymlinkEscape,
    /// A hard link `etc/rm-escape-<token>` to `../../..(32 times)/etc/hostname`: a link to a host
    /// file (whose content a later entry of the same name could overwrite).
    HardLinkEscape,
    /// A character device `dev/rm-mem`, 1:1 (the host's `/dev/mem`).
    DeviceNode,
    /// A setuid root program `bin/rm-setuid` (mode 4755) and a setgid one `bin/rm-setgid`
    /// (2755), owned by root.
    Setuid,
}

impl Hostile {
    /// Every kind, for tests that try them all.
    pub(crate) const ALL: [Hostile; 7] = [
        Hostile::PathTraversal,
        Hostile::AbsolutePath,
        Hostile::AbsoluteSymlinkEscape,
        Hostile::RelativeSymlinkEscape,
        Hostile::HardLinkEscape,
        Hostile::DeviceNode,
        Hostile::Setuid,
    ];
}

/// A hostile layout [`hostile_layout`] wrote.
#[derive(Clone, Debug)]
pub(crate) struct HostileImage {
    pub(crate) info: ImageInfo,
    /// Where on the host a file escaping the unpack root would land (`/etc/rm-escape-<token>`,
    /// the token new for every layout: no stale file of an earlier run, no other test's), for
    /// the kinds that try to escape; the test asserts it does not exist afterwards.
    pub(crate) host_escape: Option<PathBuf>,
    /// The name of the hostile entry in the layer (what an error or the report should name).
    pub(crate) entry: String,
    /// For [`Hostile::HardLinkEscape`], the host file the link names (`/etc/hostname`): the
    /// test asserts no file of the unpacked image is that file (its inode).
    pub(crate) host_link_target: Option<PathBuf>,
}

/// How deep the escaping names climb: more than any unpack root's depth.
const CLIMB: usize = 32;

/// Writes an OCI layout at `out` (tagged `tag`) of two gzip layers, the benign base and the
/// `kind` of hostile layer.
pub(crate) fn hostile_layout(kind: Hostile, out: &Path, tag: &str) -> HostileImage {
    let token = random_token();
    let escape_name = format!("rm-escape-{token}");
    let climb = "../".repeat(CLIMB);
    let (entry, host_escape) = match kind {
        Hostile::PathTraversal => (format!("{climb}etc/{escape_name}"), true),
        Hostile::AbsolutePath => (format!("/etc/{escape_name}"), true),
        Hostile::AbsoluteSymlinkEscape => (format!("etc/evil/{escape_name}"), true),
        Hostile::RelativeSymlinkEscape => (format!("etc/up/{escape_name}"), true),
        Hostile::HardLinkEscape => (format!("etc/{escape_name}"), false),
        Hostile::DeviceNode => ("dev/rm-mem".to_owned(), false),
        Hostile::Setuid => ("bin/rm-setuid".to_owned(), false),
    };
    let info = write_layout(out, tag, &token, &mut |blobs: &Path| {
        let base = write_layer(blobs, Compress::Gzip, &mut |tar| {
            for dir in ["bin", "dev", "etc", "tmp"] {
                raw_entry(tar, dir, tar::EntryType::Directory, 0o755, b"", b"")?;
            }
            raw_entry(
                tar,
                MARKER_FILE,
                tar::EntryType::Regular,
                0o644,
                b"",
                token.as_bytes(),
            )
        })?;
        let hostile = write_layer(blobs, Compress::Gzip, &mut |tar| {
            let payload = format!("escaped {token}\n");
            let file = |tar: &mut Tar<'_>, name: &str| {
                raw_entry(
                    tar,
                    name,
                    tar::EntryType::Regular,
                    0o644,
                    b"",
                    payload.as_bytes(),
                )
            };
            match kind {
                Hostile::PathTraversal | Hostile::AbsolutePath => file(tar, &entry),
                Hostile::AbsoluteSymlinkEscape => {
                    raw_entry(
                        tar,
                        "etc/evil",
                        tar::EntryType::Symlink,
                        0o777,
                        b"/etc",
                        b"",
                    )?;
                    file(tar, &entry)
                }
                Hostile::RelativeSymlinkEscape => {
                    let up = format!("{climb}etc");
                    raw_entry(
                        tar,
                        "etc/up",
                        tar::EntryType::Symlink,
                        0o777,
                        up.as_bytes(),
                        b"",
                    )?;
                    file(tar, &entry)
                }
                Hostile::HardLinkEscape => {
                    let target = format!("{climb}etc/hostname");
                    raw_entry(
                        tar,
                        &entry,
                        tar::EntryType::Link,
                        0o644,
                        target.as_bytes(),
                        b"",
                    )
                }
                Hostile::DeviceNode => {
                    let mut header = tar::Header::new_gnu();
                    header.set_entry_type(tar::EntryType::Char);
                    header.set_mode(0o666);
                    // Owner and mtime written as numbers: left all NUL, the entry is refused
                    // as unreadable before the device is ever weighed.
                    header.set_uid(0);
                    header.set_gid(0);
                    header.set_mtime(0);
                    header.set_size(0);
                    header.set_device_major(1)?;
                    header.set_device_minor(1)?;
                    set_raw_name(&mut header, entry.as_bytes())?;
                    header.set_cksum();
                    tar.append(&header, io::empty())
                }
                Hostile::Setuid => {
                    let script = b"#!/bin/sh\nid\n";
                    raw_entry(tar, &entry, tar::EntryType::Regular, 0o4755, b"", script)?;
                    raw_entry(
                        tar,
                        "bin/rm-setgid",
                        tar::EntryType::Regular,
                        0o2755,
                        b"",
                        script,
                    )
                }
            }
        })?;
        Ok(vec![base, hostile])
    })
    .unwrap_or_else(|e| panic!("writing a hostile layout at {}: {e}", out.display()));
    HostileImage {
        info,
        host_escape: host_escape.then(|| Path::new("/etc").join(&escape_name)),
        entry,
        host_link_target: (kind == Hostile::HardLinkEscape).then(|| PathBuf::from("/etc/hostname")),
    }
}

/// Flips one byte (the middle one) of the blob of layer `layer_index` (0: the base) of the
/// layout's image `tag`, in place; the blob's digest (which no longer matches its bytes). Never
/// on a cached layout: copy it first.
pub(crate) fn corrupt_one_byte(layout: &Path, tag: &str, layer_index: usize) -> String {
    let cache = cache_dir();
    assert!(
        !layout.starts_with(&cache),
        "{} is a cached layout other tests share: copy it first",
        layout.display()
    );
    let (_, manifest) =
        read_manifest(layout, tag).unwrap_or_else(|e| panic!("reading {}: {e}", layout.display()));
    let digest = manifest["layers"][layer_index]["digest"]
        .as_str()
        .unwrap_or_else(|| panic!("{} has no layer {layer_index}", layout.display()))
        .to_owned();
    let blob = blob_path(layout, &digest);
    let mut bytes = std::fs::read(&blob).unwrap_or_else(|e| panic!("{}: {e}", blob.display()));
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    // A fresh file renamed over the blob: a layout copied with hard links (`cp -al`) keeps the
    // original's bytes.
    let tmp = blob.with_extension("corrupt");
    std::fs::write(&tmp, &bytes).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, &blob).unwrap_or_else(|e| panic!("{}: {e}", blob.display()));
    digest
}

/// Copies a layout (to change it: the cached one is shared).
pub(crate) fn copy_layout(layout: &Path, to: &Path) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(layout)
        .arg(to)
        .output()
        .unwrap_or_else(|e| panic!("cp: {e}"));
    assert!(
        out.status.success(),
        "cp -a {} {}: {}",
        layout.display(),
        to.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where a blob of `layout` is.
pub(crate) fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    layout.join("blobs").join("sha256").join(hex)
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)))
}

// ---------------------------------------------------------------------------------------------
// The Debian root.

/// The host's Debian codename (`VERSION_CODENAME` of /etc/os-release).
fn host_codename() -> String {
    let text = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_else(|e| panic!("/etc/os-release: {e}"));
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(|v| v.trim_matches('"').to_owned())
    };
    assert_eq!(
        field("ID").as_deref(),
        Some("debian"),
        "the test images are made from the host's Debian packages: this host is not Debian"
    );
    field("VERSION_CODENAME")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| panic!("/etc/os-release names no VERSION_CODENAME"))
}

/// The host's apt sources of `codename` (and its `-updates`, `-security`, ...): deb822 stanzas
/// and one-line entries, each as its text, in the order apt reads them.
fn host_sources(codename: &str) -> Vec<String> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    let mut sources = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        match file.extension().and_then(|e| e.to_str()) {
            Some("sources") => sources.extend(deb822_of_suite(&text, codename)),
            Some("list") => sources.extend(one_line_of_suite(&text, codename)),
            _ => {}
        }
    }
    assert!(
        !sources.is_empty(),
        "no apt source of {codename} in /etc/apt/sources.list(.d)"
    );
    sources
}

/// Whether an apt suite is `codename` or one of its pockets (`bookworm-updates`).
fn of_suite(suite: &str, codename: &str) -> bool {
    suite == codename
        || suite
            .strip_prefix(codename)
            .is_some_and(|rest| rest.starts_with('-'))
}

/// The enabled `deb` stanzas of a deb822 `.sources` file with a suite of `codename`.
fn deb822_of_suite(text: &str, codename: &str) -> Vec<String> {
    text.split("\n\n")
        .map(str::trim)
        .filter(|stanza| {
            let field = |name: &str| {
                stanza.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
                })
            };
            field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"))
                && field("Suites")
                    .is_some_and(|s| s.split_whitespace().any(|s| of_suite(s, codename)))
                && !field("Enabled").is_some_and(|e| e.eq_ignore_ascii_case("no"))
        })
        .map(str::to_owned)
        .collect()
}

/// The `deb` lines of a one-line `.list` file with a suite of `codename`.
fn one_line_of_suite(text: &str, codename: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| {
            let Some(rest) = line.strip_prefix("deb ") else {
                return false;
            };
            // Options in brackets come before the URI.
            let rest = match rest.trim_start().strip_prefix('[') {
                Some(options) => options.split_once(']').map_or("", |(_, r)| r),
                None => rest,
            };
            rest.split_whitespace()
                .nth(1)
                .is_some_and(|suite| of_suite(suite, codename))
        })
        .map(str::to_owned)
        .collect()
}

/// Makes the root in `dir` (which does not exist yet).
fn make_debian_root(
    dir: &Path,
    codename: &str,
    sources: &[String],
    docker: bool,
) -> io::Result<()> {
    let work = dir.with_extension("work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let (stanzas, lines): (Vec<&String>, Vec<&String>) =
        sources.iter().partition(|s| !s.starts_with("deb "));
    let mut mirrors = Vec::new();
    if !stanzas.is_empty() {
        let file = work.join("host.sources");
        let text: Vec<&str> = stanzas.iter().map(|s| s.as_str()).collect();
        std::fs::write(&file, text.join("\n\n") + "\n")?;
        mirrors.push(file);
    }
    if !lines.is_empty() {
        let file = work.join("host.list");
        let text: Vec<&str> = lines.iter().map(|s| s.as_str()).collect();
        std::fs::write(&file, text.join("\n") + "\n")?;
        mirrors.push(file);
    }
    // `extract`: the packages unpacked, no maintainer script run (`custom` would need dpkg in
    // the root to install them).
    run(Command::new("mmdebstrap")
        .args(["--variant=extract", "--quiet"])
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(codename)
        .arg(dir)
        .args(&mirrors))?;

    if docker {
        docker_cli(dir, &work)?;
    }

    // What an image has no use for, or holds of the host: apt's own state, the host's
    // resolv.conf and hostname (a runner's are mounted on these, so they stay, empty).
    for gone in [
        "etc/apt",
        "var/cache/apt",
        "var/lib/apt",
        "var/log/apt",
        "etc/dpkg",
    ] {
        let _ = std::fs::remove_dir_all(dir.join(gone));
    }
    std::fs::write(dir.join("etc/resolv.conf"), "")?;
    std::fs::write(dir.join("etc/hostname"), "rm-test-image\n")?;
    for f in ["etc/resolv.conf", "etc/hostname"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    // mmdebstrap's /dev (device nodes, links to /proc): an image carries none, a runner gets
    // its own.
    let _ = std::fs::remove_dir_all(dir.join("dev"));
    std::fs::create_dir(dir.join("dev"))?;
    std::fs::set_permissions(dir.join("dev"), std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
    )?;
    std::fs::write(dir.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    std::fs::create_dir_all(dir.join("root"))?;
    std::fs::set_permissions(dir.join("root"), std::fs::Permissions::from_mode(0o700))?;

    // A link for each busybox applet (Debian's busybox package installs none), in /bin.
    let busybox = dir.join("bin/busybox");
    let list = Command::new(&busybox).arg("--list").output()?;
    if !list.status.success() {
        return Err(io::Error::other(format!(
            "{} --list: {}",
            busybox.display(),
            String::from_utf8_lossy(&list.stderr)
        )));
    }
    for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
        if applet.contains('/') || applet == "busybox" {
            continue;
        }
        let link = dir.join("bin").join(applet);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("busybox", &link)?;
        }
    }

    // As base-files' postinst (not run by the `extract` variant) makes them, and as a runner's
    // mounts meet them: `/var/run/docker.sock` is `/run/docker.sock` in a Debian image.
    for (link, to) in [("var/run", "/run"), ("var/lock", "/run/lock")] {
        let _ = std::fs::remove_dir(dir.join(link));
        std::os::unix::fs::symlink(to, dir.join(link))?;
    }
    std::fs::create_dir_all(dir.join("run/lock"))?;
    std::fs::set_permissions(
        dir.join("run/lock"),
        std::fs::Permissions::from_mode(0o1777),
    )?;

    std::fs::create_dir_all(dir.join(SCRATCH_DIR))?;
    std::fs::set_permissions(
        dir.join(SCRATCH_DIR),
        std::fs::Permissions::from_mode(0o1777),
    )?;
    std::fs::write(dir.join(MARKER_FILE), random_token())?;
    std::fs::remove_dir_all(&work)?;
    Ok(())
}

/// Puts the Docker CLI of [`DOCKER_PACKAGE`] at `<root>/usr/bin/docker`, the package downloaded
/// into `work`.
fn docker_cli(dir: &Path, work: &Path) -> io::Result<()> {
    run(Command::new("apt-get")
        .args(["download", "--quiet", DOCKER_PACKAGE])
        .current_dir(work))?;
    let deb = std::fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| io::Error::other(format!("apt-get download {DOCKER_PACKAGE}: no .deb")))?;
    let extracted = work.join("deb");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted))?;
    std::fs::create_dir_all(dir.join("usr/bin"))?;
    std::fs::copy(extracted.join("usr/bin/docker"), dir.join("usr/bin/docker"))?;
    std::fs::set_permissions(
        dir.join("usr/bin/docker"),
        std::fs::Permissions::from_mode(0o755),
    )?;
    Ok(())
}

/// The marker of a root [`debian_root`] made: the content of its [`MARKER_FILE`].
pub(crate) fn marker(root: &Path) -> String {
    std::fs::read_to_string(root.join(MARKER_FILE))
        .unwrap_or_else(|e| panic!("{}: {e}", root.join(MARKER_FILE).display()))
}

/// 32 random hex digits, from the kernel.
fn random_token() -> String {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .unwrap_or_else(|e| panic!("/dev/urandom: {e}"));
    hex(&bytes)
}

/// Runs a command, its output kept for the error.
fn run(command: &mut Command) -> io::Result<()> {
    let out = command
        .output()
        .map_err(|e| io::Error::other(format!("{:?}: {e}", command.get_program())))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{:?} {:?}: {}\n{}\n{}",
            command.get_program(),
            command.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// A short key of `parts`.
fn cache_key(parts: &[&str]) -> String {
    let mut hasher = sha2::Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hex(&hasher.finalize()[..8])
}

/// `<cache>/<name>`, made by `make` once: under an exclusive lock on `<cache>/.<name>.lock`
/// (threads and processes wait for the one making it), into `<cache>/.tmp-<name>` and renamed
/// into place; a leftover of a crashed maker is removed first.
fn cached(
    cache: &Path,
    name: &str,
    make: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<PathBuf> {
    let done = cache.join(name);
    if done.is_dir() {
        return Ok(done);
    }
    let lock = File::create(cache.join(format!(".{name}.lock")))?;
    lock.lock()?;
    if done.is_dir() {
        return Ok(done);
    }
    let tmp = cache.join(format!(".tmp-{name}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    make(&tmp)?;
    std::fs::rename(&tmp, &done)?;
    Ok(done)
}

// ---------------------------------------------------------------------------------------------
// OCI layouts.

/// Whether a layer's blob is gzip or the plain tar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compress {
    Gzip,
    None,
}

/// A layer written: its blob and its uncompressed tar.
struct LayerBlob {
    media_type: &'static str,
    digest: String,
    size: u64,
    diff_id: String,
}

/// A writer that hashes and counts what passes through it.
struct Hashing<W> {
    inner: W,
    hasher: sha2::Sha256,
    size: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            hasher: sha2::Sha256::new(),
            size: 0,
        }
    }
    fn digest(&self) -> String {
        format!("sha256:{}", hex(&self.hasher.clone().finalize()))
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The blob file, behind gzip or not.
enum Sink {
    Gzip(flate2::write::GzEncoder<Hashing<BufWriter<File>>>),
    Plain(Hashing<BufWriter<File>>),
}

impl Sink {
    fn finish(self) -> io::Result<Hashing<BufWriter<File>>> {
        match self {
            Sink::Gzip(gz) => gz.finish(),
            Sink::Plain(plain) => Ok(plain),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Gzip(gz) => gz.write(buf),
            Sink::Plain(plain) => plain.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Gzip(gz) => gz.flush(),
            Sink::Plain(plain) => plain.flush(),
        }
    }
}

/// The tar a layer is written through: the uncompressed stream hashed (the diff_id) on its way
/// to the blob.
type Tar<'a> = tar::Builder<&'a mut Hashing<Sink>>;

/// Writes a layer's blob into `blobs` (`blobs/sha256`), its entries added by `fill`.
fn write_layer(
    blobs: &Path,
    compress: Compress,
    fill: &mut dyn FnMut(&mut Tar<'_>) -> io::Result<()>,
) -> io::Result<LayerBlob> {
    let tmp = blobs.join(format!(".layer-{}", random_token()));
    let file = Hashing::new(BufWriter::new(File::create(&tmp)?));
    let sink = match compress {
        // The default header: no name, mtime 0, so the same tar gives the same bytes.
        Compress::Gzip => {
            Sink::Gzip(flate2::GzBuilder::new().write(file, flate2::Compression::fast()))
        }
        Compress::None => Sink::Plain(file),
    };
    let mut plain = Hashing::new(sink);
    {
        let mut tar = tar::Builder::new(&mut plain);
        fill(&mut tar)?;
        tar.finish()?;
    }
    let diff_id = plain.digest();
    let mut file = plain.inner.finish()?;
    file.flush()?;
    let digest = file.digest();
    let size = file.size;
    file.inner
        .into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()?;
    std::fs::rename(&tmp, blobs.join(digest.trim_start_matches("sha256:")))?;
    Ok(LayerBlob {
        media_type: match compress {
            Compress::Gzip => MEDIA_LAYER_GZIP,
            Compress::None => MEDIA_LAYER_TAR,
        },
        digest,
        size,
        diff_id,
    })
}

/// Writes a blob of `bytes` into `blobs`; its digest.
fn write_blob(blobs: &Path, bytes: &[u8]) -> io::Result<String> {
    let digest = sha256(bytes);
    std::fs::write(blobs.join(digest.trim_start_matches("sha256:")), bytes)?;
    Ok(digest)
}

/// The image architecture of this machine, as OCI names it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Writes the layout at `out`: the layers `layers` writes into the blobs dir, then the config,
/// the manifest, index.json and oci-layout.
fn write_layout(
    out: &Path,
    tag: &str,
    marker: &str,
    layers: &mut dyn FnMut(&Path) -> io::Result<Vec<LayerBlob>>,
) -> io::Result<ImageInfo> {
    let blobs = out.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs)?;
    let layers = layers(&blobs)?;
    let env: Vec<String> = IMAGE_ENV.iter().map(|(k, v)| format!("{k}={v}")).collect();
    // serde_json's map keeps its keys sorted: the same image gives the same bytes.
    let config = serde_json::json!({
        "architecture": arch(),
        "os": "linux",
        "config": {
            "Env": env,
            "User": IMAGE_USER,
            "WorkingDir": IMAGE_WORKDIR,
            "Cmd": ["/bin/sh"],
            "Labels": { "org.opencontainers.image.description": "rm's test image" },
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.as_str()).collect::<Vec<_>>(),
        },
        "history": layers.iter().map(|_| serde_json::json!({"created_by": "tests/support/job_image.rs"})).collect::<Vec<_>>(),
    });
    let config_bytes = serde_json::to_vec(&config).map_err(io::Error::other)?;
    let config_digest = write_blob(&blobs, &config_bytes)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {
            "mediaType": MEDIA_CONFIG,
            "digest": config_digest,
            "size": config_bytes.len(),
        },
        "layers": layers.iter().map(|l| serde_json::json!({
            "mediaType": l.media_type,
            "digest": l.digest,
            "size": l.size,
        })).collect::<Vec<_>>(),
    });
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(io::Error::other)?;
    let manifest_digest = write_blob(&blobs, &manifest_bytes)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST,
            "digest": manifest_digest,
            "size": manifest_bytes.len(),
            "annotations": { REF_NAME: tag },
        }],
    });
    std::fs::write(
        out.join("index.json"),
        serde_json::to_vec(&index).map_err(io::Error::other)?,
    )?;
    std::fs::write(out.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(ImageInfo {
        manifest_digest,
        config_digest,
        layers: layers.into_iter().map(|l| l.digest).collect(),
        marker: marker.to_owned(),
    })
}

/// The manifest of `tag` in a layout: its digest and its JSON.
fn read_manifest(layout: &Path, tag: &str) -> io::Result<(String, serde_json::Value)> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)
            .map_err(io::Error::other)?;
    let digest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"][REF_NAME] == tag)
        .and_then(|m| m["digest"].as_str())
        .ok_or_else(|| io::Error::other(format!("index.json names no {tag}")))?
        .to_owned();
    let manifest = serde_json::from_slice(&std::fs::read(blob_path(layout, &digest))?)
        .map_err(io::Error::other)?;
    Ok((digest, manifest))
}

/// The [`ImageInfo`] of a layout written by [`oci_layout`] from `root`.
fn read_info(layout: &Path, tag: &str, root: &Path) -> io::Result<ImageInfo> {
    let (manifest_digest, manifest) = read_manifest(layout, tag)?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or_else(|| io::Error::other("the manifest names no config"))?
        .to_owned();
    let layers = manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["digest"].as_str().map(str::to_owned))
        .collect();
    Ok(ImageInfo {
        manifest_digest,
        config_digest,
        layers,
        marker: marker(root),
    })
}

/// A tar header of a regular file.
fn file_header(mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(mode);
    // Root's, written out: a header left zeroed has empty owner fields, which rm-image refuses
    // as unreadable.
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(size);
    header.set_mtime(0);
    header
}

/// Adds `root`'s tree to `tar`, entries sorted by name: directories, regular files (the second
/// name of a file with several as a hard link to the first), symlinks, each with its mode
/// (setuid, setgid and sticky bits included), owner and mtime. Other file types are left out
/// (the roots made here have none).
fn append_tree(tar: &mut Tar<'_>, root: &Path) -> io::Result<()> {
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort();
        let mut dirs = Vec::new();
        for name in names {
            let path = rel.join(&name);
            let full = root.join(&path);
            let meta = std::fs::symlink_metadata(&full)?;
            let mut header = tar::Header::new_gnu();
            header.set_mode(meta.mode() & 0o7777);
            header.set_uid(u64::from(meta.uid()));
            header.set_gid(u64::from(meta.gid()));
            header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
            header.set_size(0);
            let kind = meta.file_type();
            if kind.is_dir() {
                header.set_entry_type(tar::EntryType::Directory);
                // `name/`, as tar writes a directory.
                let mut name = path.clone().into_os_string();
                name.push("/");
                tar.append_data(&mut header, name, io::empty())?;
                dirs.push(path);
            } else if kind.is_symlink() {
                header.set_entry_type(tar::EntryType::Symlink);
                tar.append_link(&mut header, &path, std::fs::read_link(&full)?)?;
            } else if kind.is_file() {
                let id = (meta.dev(), meta.ino());
                if meta.nlink() > 1 {
                    if let Some(first) = links.get(&id) {
                        header.set_entry_type(tar::EntryType::Link);
                        tar.append_link(&mut header, &path, first)?;
                        continue;
                    }
                    links.insert(id, path.clone());
                }
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(meta.len());
                tar.append_data(&mut header, &path, File::open(&full)?)?;
            }
        }
        // Depth first, in name order: pushed reversed, popped in order.
        stack.extend(dirs.into_iter().rev());
    }
    Ok(())
}

/// Puts `name` into the header's name field as it is (the tar crate refuses `..` and absolute
/// names, which the hostile layers need).
fn set_raw_name(header: &mut tar::Header, name: &[u8]) -> io::Result<()> {
    let field = &mut header.as_old_mut().name;
    if name.len() > field.len() {
        return Err(io::Error::other(format!(
            "{} is longer than a tar name",
            String::from_utf8_lossy(name)
        )));
    }
    field.fill(0);
    field[..name.len()].copy_from_slice(name);
    Ok(())
}

/// Appends an entry whose name and link name are written as they are.
fn raw_entry(
    tar: &mut Tar<'_>,
    name: &str,
    kind: tar::EntryType,
    mode: u32,
    link: &[u8],
    data: &[u8],
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(data.len() as u64);
    let name = if kind == tar::EntryType::Directory {
        format!("{name}/")
    } else {
        name.to_owned()
    };
    if name.len() > 100 {
        // A GNU long name entry (`././@LongLink`) carries it, as GNU tar writes one.
        let mut long = tar::Header::new_gnu();
        long.set_entry_type(tar::EntryType::GNULongName);
        set_raw_name(&mut long, b"././@LongLink")?;
        long.set_mode(0o644);
        long.set_size(name.len() as u64 + 1);
        long.set_cksum();
        let mut bytes = name.as_bytes().to_vec();
        bytes.push(0);
        tar.append(&long, bytes.as_slice())?;
        set_raw_name(&mut header, &name.as_bytes()[..100])?;
    } else {
        set_raw_name(&mut header, name.as_bytes())?;
    }
    if !link.is_empty() {
        if link.len() > 100 {
            let mut long = tar::Header::new_gnu();
            long.set_entry_type(tar::EntryType::GNULongLink);
            set_raw_name(&mut long, b"././@LongLink")?;
            long.set_mode(0o644);
            long.set_size(link.len() as u64 + 1);
            long.set_cksum();
            let mut bytes = link.to_vec();
            bytes.push(0);
            tar.append(&long, bytes.as_slice())?;
        }
        let field = &mut header.as_old_mut().linkname;
        let n = link.len().min(field.len());
        field.fill(0);
        field[..n].copy_from_slice(&link[..n]);
    }
    header.set_cksum();
    tar.append(&header, data)
}

/// `size` incompressible bytes (xorshift), produced as they are read.
struct Xorshift {
    state: u64,
    left: u64,
}

impl Xorshift {
    fn new(size: u64) -> Self {
        Xorshift {
            state: 0x9e37_79b9_7f4a_7c15,
            left: size,
        }
    }
}

impl Read for Xorshift {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(PAD_CHUNK);
        let n = usize::try_from(self.left).map_or(want, |left| left.min(want));
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            chunk.copy_from_slice(&self.state.to_le_bytes()[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------------
// skopeo.

fn skopeo_copy(from: &str, to: &str) {
    // A destination archive that exists is added to, not replaced.
    if let Some(file) = to
        .split_once(':')
        .map(|(_, f)| f.rsplit_once(':').map_or(f, |(f, _)| f))
    {
        let _ = std::fs::remove_file(file);
    }
    run(Command::new("skopeo").args(["copy", "--quiet", from, to]))
        .unwrap_or_else(|e| panic!("skopeo copy {from} {to}: {e}"));
}

/// The manifest digest `skopeo inspect` reports for `reference`.
pub(crate) fn skopeo_digest(reference: &str) -> String {
    let out = Command::new("skopeo")
        .args(["inspect", reference])
        .output()
        .unwrap_or_else(|e| panic!("skopeo inspect {reference}: {e}"));
    assert!(
        out.status.success(),
        "skopeo inspect {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("skopeo inspect {reference}: {e}"));
    json["Digest"]
        .as_str()
        .unwrap_or_else(|| panic!("skopeo inspect {reference} gave no Digest"))
        .to_owned()
}

/// The image ID of a one-image `docker save` archive: its manifest.json's `Config`, the config
/// blob's file name (`<hex>.json`, or `blobs/sha256/<hex>`), checked against its bytes.
fn docker_archive_id(file: &Path) -> io::Result<String> {
    let mut manifest = None;
    let mut blobs: HashMap<String, String> = HashMap::new();
    let mut archive = tar::Archive::new(File::open(file)?);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.to_string_lossy().into_owned();
        if name == "manifest.json" {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            manifest = Some(bytes);
        } else if name.ends_with(".json") || name.starts_with("blobs/") {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            blobs.insert(name, sha256(&bytes));
        }
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&manifest.ok_or_else(|| io::Error::other("no manifest.json"))?)
            .map_err(io::Error::other)?;
    let config = manifest[0]["Config"]
        .as_str()
        .ok_or_else(|| io::Error::other("manifest.json names no Config"))?;
    blobs
        .get(config)
        .cloned()
        .ok_or_else(|| io::Error::other(format!("the archive has no {config}")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod pure {
    use super::*;

    #[test]
    fn sources_of_the_suite_and_its_pockets_only() {
        let deb822 = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
                      Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\n\n\
                      Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nEnabled: no\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\n";
        let picked = deb822_of_suite(deb822, "bookworm");
        assert_eq!(picked.len(), 2, "{picked:?}");
        assert!(picked[0].contains("bookworm-updates"));
        assert!(picked[1].contains("bookworm-security"));

        let list = "# deb http://deb.debian.org/debian bookworm main\n\
                    deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n\
                    deb [signed-by=/usr/share/keyrings/k.gpg arch=amd64] http://mirror/debian bookworm main\n\
                    deb http://mirror/debian bookworm-updates main\n\
                    deb-src http://mirror/debian bookworm main\n\
                    deb http://mirror/debian bookworm_x main\n";
        assert_eq!(
            one_line_of_suite(list, "bookworm"),
            [
                "deb [signed-by=/usr/share/keyrings/k.gpg arch=amd64] http://mirror/debian bookworm main",
                "deb http://mirror/debian bookworm-updates main",
            ]
        );
    }

    #[test]
    fn the_padding_is_the_size_asked_and_does_not_compress() {
        for size in [0u64, 1, 7, 8, 9, PAD_CHUNK as u64 + 3] {
            let mut bytes = Vec::new();
            Xorshift::new(size).read_to_end(&mut bytes).unwrap();
            assert_eq!(bytes.len() as u64, size);
        }
        let mut bytes = Vec::new();
        Xorshift::new(1 << 16).read_to_end(&mut bytes).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&bytes).unwrap();
        assert!(gz.finish().unwrap().len() >= bytes.len());
    }

    #[test]
    fn cache_keys_differ_with_their_inputs() {
        assert_eq!(cache_key(&["a", "b"]), cache_key(&["a", "b"]));
        assert_ne!(cache_key(&["a", "b"]), cache_key(&["ab", ""]));
        assert_ne!(cache_key(&["a", "b"]), cache_key(&["a", "c"]));
        assert_eq!(cache_key(&["a"]).len(), 16);
    }
}
