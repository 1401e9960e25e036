//! Images built here with the `tar` crate, as an OCI layout, an OCI archive and a Docker
//! archive; corrupted ones; and the real peer, skopeo, converting them.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use flate2::Compression as Level;
use flate2::write::GzEncoder;
use serde_json::{Value, json};

use super::*;
use crate::skip;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const OCI_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn arch() -> &'static str {
    oci_architecture(std::env::consts::ARCH).expect("a known architecture")
}

/// An entry of a test layer.
enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
}

/// An uncompressed layer tar.
fn layer_tar(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(1_700_000_000);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            Entry::Dir(path) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, path, &[][..])
                    .expect("append a dir");
            }
            Entry::File(path, data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(data.len() as u64);
                builder
                    .append_data(&mut header, path, *data)
                    .expect("append a file");
            }
        }
    }
    builder.into_inner().expect("finish the tar")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Level::fast());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

/// The two layers of the test image: the first (gzip) has a file the second (plain) deletes
/// with a whiteout.
fn test_layers() -> Vec<Vec<u8>> {
    vec![
        layer_tar(&[
            Entry::Dir("etc"),
            Entry::File("etc/os-release", b"ID=rmtest\n"),
            Entry::Dir("usr"),
            Entry::Dir("usr/bin"),
            Entry::File("usr/bin/tool", b"#!/bin/sh\necho tool\n"),
            Entry::Dir("tmp"),
            Entry::File("tmp/gone", b"deleted by the next layer"),
        ]),
        layer_tar(&[
            Entry::File("etc/marker", b"from the second layer"),
            Entry::File("tmp/.wh.gone", b""),
        ]),
    ]
}

/// An image config for `diff_ids` (lower-case hex digests of the uncompressed layers).
fn config_json(architecture: &str, diff_ids: &[Digest]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": architecture,
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=a=b", "NOEQUALS"],
            "User": "1000:1000",
            "WorkingDir": "",
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": diff_ids.iter().map(ToString::to_string).collect::<Vec<_>>(),
        },
    }))
    .expect("serialise")
}

/// Writes an OCI layout under `dir`, one blob at a time.
struct Layout {
    dir: PathBuf,
}

/// What [`Layout::image`] wrote.
struct Built {
    manifest: Value,
    manifest_digest: Digest,
    config: Digest,
    layers: Vec<Digest>,
    diff_ids: Vec<Digest>,
}

impl Layout {
    fn new(dir: &Path) -> Self {
        fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir");
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).expect("write");
        Self {
            dir: dir.to_owned(),
        }
    }

    fn blob(&self, media_type: &str, bytes: &[u8]) -> (Value, Digest) {
        let digest = Digest::of(bytes);
        fs::write(self.dir.join(oci_blob(&digest)), bytes).expect("write a blob");
        let descriptor = json!({
            "mediaType": media_type,
            "digest": digest.to_string(),
            "size": bytes.len(),
        });
        (descriptor, digest)
    }

    /// The test image for `architecture`: its first layer gzip, its second plain. `diff_ids`
    /// replaces the config's true ones when given.
    fn image(&self, architecture: &str, diff_ids: Option<Vec<Digest>>) -> Built {
        let tars = test_layers();
        let true_ids: Vec<Digest> = tars.iter().map(|t| Digest::of(t)).collect();
        let diff_ids = diff_ids.unwrap_or(true_ids);
        let (config_descriptor, config) =
            self.blob(OCI_CONFIG, &config_json(architecture, &diff_ids));
        let (first, first_digest) = self.blob(OCI_TAR_GZIP, &gzip(&tars[0]));
        let (second, second_digest) = self.blob(OCI_TAR, &tars[1]);
        let manifest_bytes = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config_descriptor,
            "layers": [first, second],
        }))
        .expect("serialise");
        let (manifest, manifest_digest) = self.blob(OCI_MANIFEST, &manifest_bytes);
        Built {
            manifest,
            manifest_digest,
            config,
            layers: vec![first_digest, second_digest],
            diff_ids,
        }
    }

    /// An image index over `manifests`, each with its platform.
    fn index(&self, manifests: &[(Value, &str)]) -> (Value, Digest) {
        let manifests: Vec<Value> = manifests
            .iter()
            .map(|(descriptor, architecture)| {
                let mut descriptor = descriptor.clone();
                descriptor["platform"] = json!({"architecture": architecture, "os": "linux"});
                descriptor
            })
            .collect();
        let bytes = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX_TYPE,
            "manifests": manifests,
        }))
        .expect("serialise");
        self.blob(OCI_INDEX_TYPE, &bytes)
    }

    /// Writes `index.json` listing `entries`, each tagged when a tag is given.
    fn write_index(&self, entries: &[(Value, Option<&str>)]) {
        let manifests: Vec<Value> = entries
            .iter()
            .map(|(descriptor, tag)| {
                let mut descriptor = descriptor.clone();
                if let Some(tag) = tag {
                    descriptor["annotations"] = json!({ REF_NAME_ANNOTATION: tag });
                }
                descriptor
            })
            .collect();
        let index =
            json!({"schemaVersion": 2, "mediaType": OCI_INDEX_TYPE, "manifests": manifests});
        fs::write(
            self.dir.join(OCI_INDEX),
            serde_json::to_vec(&index).expect("serialise"),
        )
        .expect("write index.json");
    }
}

/// A tar of the files under `dir` (names as `prefix` + the relative path), written to `file`.
fn tar_dir(dir: &Path, prefix: &str, file: &Path) {
    let mut builder = tar::Builder::new(fs::File::create(file).expect("create"));
    builder
        .append_dir_all(prefix, dir)
        .expect("append the layout");
    builder.into_inner().expect("finish");
}

/// A Docker archive of the test image: `RepoTags` `tags`, its layers as `<n>/layer.tar`. Gives
/// the image ID.
fn docker_archive(file: &Path, tags: &[&str], diff_ids: Option<Vec<Digest>>) -> Digest {
    let tars = test_layers();
    let diff_ids = diff_ids.unwrap_or_else(|| tars.iter().map(|t| Digest::of(t)).collect());
    let config = config_json(arch(), &diff_ids);
    let id = Digest::of(&config);
    let manifest = json!([{
        "Config": format!("{}.json", id.hex()),
        "RepoTags": tags,
        "Layers": ["1/layer.tar", "2/layer.tar"],
    }]);
    let mut builder = tar::Builder::new(fs::File::create(file).expect("create"));
    let mut add = |name: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        builder
            .append_data(&mut header, name, data)
            .expect("append");
    };
    add(&format!("{}.json", id.hex()), &config);
    add("1/layer.tar", &tars[0]);
    add("2/layer.tar", &tars[1]);
    add(
        DOCKER_MANIFEST,
        &serde_json::to_vec(&manifest).expect("serialise"),
    );
    builder.into_inner().expect("finish");
    id
}

fn parse(text: &str) -> ImageRef {
    ImageRef::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn oci_ref(dir: &Path, suffix: &str) -> ImageRef {
    parse(&format!("oci:{}{suffix}", dir.display()))
}

// ---- pure decisions

#[test]
fn layer_media_types_say_their_compression() {
    let cases = [
        (
            "application/vnd.oci.image.layer.v1.tar",
            Some(Compression::None),
        ),
        (
            "application/vnd.oci.image.layer.v1.tar+gzip",
            Some(Compression::Gzip),
        ),
        (
            "application/vnd.docker.image.rootfs.diff.tar",
            Some(Compression::None),
        ),
        (
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            Some(Compression::Gzip),
        ),
        (
            "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
            Some(Compression::Gzip),
        ),
        (
            "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
            Some(Compression::Gzip),
        ),
        ("application/vnd.oci.image.layer.v1.tar+zstd", None),
        ("application/vnd.oci.image.config.v1+json", None),
        ("", None),
    ];
    for (media_type, want) in cases {
        assert_eq!(compression_of(media_type).ok(), want, "{media_type}");
    }
    assert!(
        compression_of("application/vnd.oci.image.layer.v1.tar+zstd")
            .expect_err("zstd")
            .contains("gzip")
    );
}

#[test]
fn architectures_have_their_oci_names() {
    let cases = [
        ("x86_64", Some("amd64")),
        ("aarch64", Some("arm64")),
        ("x86", Some("386")),
        ("s390x", Some("s390x")),
        ("riscv64", Some("riscv64")),
        ("sparc", None),
    ];
    for (rust, want) in cases {
        assert_eq!(oci_architecture(rust), want, "{rust}");
    }
}

fn descriptor(digest_byte: u8, platform: Option<(&str, &str)>, tag: Option<&str>) -> Descriptor {
    let mut annotations = HashMap::new();
    if let Some(tag) = tag {
        annotations.insert(REF_NAME_ANNOTATION.to_owned(), tag.to_owned());
    }
    Descriptor {
        media_type: Some(OCI_MANIFEST.to_owned()),
        digest: Digest::of(&[digest_byte]),
        size: 1,
        annotations,
        platform: platform.map(|(os, architecture)| Platform {
            os: os.to_owned(),
            architecture: architecture.to_owned(),
        }),
    }
}

#[test]
fn an_index_entry_is_picked_for_linux_on_this_architecture() {
    let attestation = descriptor(0, Some(("unknown", "unknown")), None);
    let windows = descriptor(1, Some(("windows", "amd64")), None);
    let arm = descriptor(2, Some(("linux", "arm64")), None);
    let amd = descriptor(3, Some(("linux", "amd64")), None);
    let bare = descriptor(4, None, None);
    let all = [attestation, windows, arm, amd, bare];
    let pick = |arch| select_platform("i", &all, arch).map(|d| d.digest);
    assert_eq!(pick("amd64").ok(), Some(all[3].digest));
    assert_eq!(pick("arm64").ok(), Some(all[2].digest));
    match pick("s390x") {
        Err(SourceError::NoPlatform {
            architecture,
            available,
            ..
        }) => {
            assert_eq!(architecture, "s390x");
            assert_eq!(
                available,
                [
                    "unknown/unknown",
                    "windows/amd64",
                    "linux/arm64",
                    "linux/amd64"
                ]
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_layout_entry_is_picked_by_tag_pin_or_being_the_only_one() {
    let a = descriptor(1, None, Some("a"));
    let b = descriptor(2, None, Some("b"));
    let untagged = descriptor(3, None, None);
    let two = [a.clone(), b.clone()];
    let pick = |entries: &[Descriptor], tag, pin: Option<Digest>| {
        select_entry("index.json", entries, tag, pin.as_ref()).map(|d| d.digest)
    };
    assert_eq!(pick(&two, Some("b"), None).ok(), Some(b.digest));
    assert_eq!(pick(&two, None, Some(a.digest)).ok(), Some(a.digest));
    assert_eq!(
        pick(std::slice::from_ref(&untagged), None, None).ok(),
        Some(untagged.digest)
    );
    // The only entry is taken with any pin: the pin is then compared and refused.
    assert_eq!(
        pick(std::slice::from_ref(&untagged), None, Some(a.digest)).ok(),
        Some(untagged.digest)
    );
    assert!(matches!(
        pick(&two, None, None),
        Err(SourceError::Ambiguous { count: 2, available, .. }) if available == ["a", "b"]
    ));
    assert!(matches!(
        pick(&two, Some("c"), None),
        Err(SourceError::NoSuchName { name, available, .. }) if name == "c" && available == ["a", "b"]
    ));
    assert!(matches!(
        pick(&two, None, Some(untagged.digest)),
        Err(SourceError::NoSuchName { .. })
    ));
    assert!(matches!(
        pick(&[], None, None),
        Err(SourceError::Ambiguous { count: 0, .. })
    ));
}

#[test]
fn a_config_gives_env_user_and_workdir() {
    let config = ImageConfig::parse(&config_json("amd64", &[])).expect("parse");
    assert_eq!(
        config.env,
        [
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("GREETING".to_owned(), "a=b".to_owned()),
        ]
    );
    assert_eq!(config.user.as_deref(), Some("1000:1000"));
    assert_eq!(config.working_dir, None, "an empty WorkingDir is none");
    assert_eq!(
        (config.os.as_str(), config.architecture.as_str()),
        ("linux", "amd64")
    );
    // A config without a container config (`FROM scratch` with nothing set) has none of them.
    let bare = ImageConfig::parse(
        br#"{"architecture":"arm64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#,
    )
    .expect("parse");
    assert_eq!(bare.env, []);
    assert_eq!(bare.user, None);
    assert!(
        ImageConfig::parse(br#"{"os":"linux"}"#).is_err(),
        "no rootfs"
    );
}

#[test]
fn a_docker_archive_member_name_may_spell_a_digest() {
    let id = Digest::of(b"config");
    assert_eq!(digest_in_name(&format!("{}.json", id.hex())), Some(id));
    assert_eq!(
        digest_in_name(&format!("blobs/sha256/{}", id.hex())),
        Some(id)
    );
    assert_eq!(digest_in_name("config.json"), None);
    assert_eq!(digest_in_name("1/layer.tar"), None);
}

// ---- opening images built here

#[test]
fn a_tagged_layout_opens_to_its_verified_image() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(&tmp.path().join("layout"));
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), Some("v1"))]);

    let opened = open(&oci_ref(&layout.dir, ":v1")).expect("open");
    let image = &opened.image;
    assert_eq!(image.id, built.config);
    assert_eq!(image.manifest, built.manifest_digest);
    assert_eq!(image.resolved, built.manifest_digest);
    assert_eq!(Digest::of(&image.config_json), built.config);
    assert_eq!(image.config.user.as_deref(), Some("1000:1000"));
    let layers: Vec<_> = image
        .layers
        .iter()
        .map(|l| (l.digest, l.diff_id, l.media_type.as_str()))
        .collect();
    assert_eq!(
        layers,
        [
            (built.layers[0], built.diff_ids[0], OCI_TAR_GZIP),
            (built.layers[1], built.diff_ids[1], OCI_TAR),
        ]
    );
    opened.verify_layers().expect("the layers are intact");

    // One untagged image: no tag needed. With a tag the layout does not have: refused.
    layout.write_index(&[(built.manifest.clone(), None)]);
    assert_eq!(open(&oci_ref(&layout.dir, "")).expect("open").image, *image);
    assert!(matches!(
        open(&oci_ref(&layout.dir, ":v1")),
        Err(SourceError::NoSuchName { name, .. }) if name == "v1"
    ));
}

#[test]
fn a_layout_of_two_images_needs_a_tag() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path());
    let first = layout.image(arch(), None);
    let other_ids = vec![Digest::of(b"x"), Digest::of(b"y")];
    let second = layout.image(arch(), Some(other_ids));
    layout.write_index(&[
        (first.manifest.clone(), Some("one")),
        (second.manifest.clone(), Some("two")),
    ]);
    assert!(matches!(
        open(&oci_ref(&layout.dir, "")),
        Err(SourceError::Ambiguous { count: 2, .. })
    ));
    assert_eq!(
        open(&oci_ref(&layout.dir, ":two")).expect("open").image.id,
        second.config
    );
    // A pin picks among untagged entries.
    let pinned = oci_ref(&layout.dir, &format!("@{}", first.manifest_digest));
    assert_eq!(open(&pinned).expect("open").image.id, first.config);
}

#[test]
fn an_index_of_two_platforms_opens_to_this_machines_manifest() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path());
    let other_arch = if arch() == "amd64" { "arm64" } else { "amd64" };
    let other = layout.image(other_arch, None);
    let ours = layout.image(arch(), None);
    let (index, index_digest) = layout.index(&[
        (other.manifest.clone(), other_arch),
        (ours.manifest.clone(), arch()),
    ]);
    layout.write_index(&[(index.clone(), Some("multi"))]);

    // The pin is the index's digest, as `docker pull name@sha256:` takes a multi-platform one.
    let opened = open(&oci_ref(&layout.dir, &format!(":multi@{index_digest}"))).expect("open");
    assert_eq!(opened.image.resolved, index_digest);
    assert_eq!(opened.image.manifest, ours.manifest_digest);
    assert_eq!(opened.image.id, ours.config);
    assert_eq!(opened.image.config.architecture, arch());

    // Pinned to the platform's manifest instead: not what the tag names.
    let wrong = oci_ref(&layout.dir, &format!(":multi@{}", ours.manifest_digest));
    assert!(matches!(
        open(&wrong),
        Err(SourceError::PinMismatch { pin, actual, .. })
            if pin == ours.manifest_digest && actual == index_digest
    ));

    // Only another architecture: refused, naming what there is.
    let (only_other, _) = layout.index(&[(other.manifest.clone(), other_arch)]);
    layout.write_index(&[(only_other, None)]);
    assert!(matches!(
        open(&oci_ref(&layout.dir, "")),
        Err(SourceError::NoPlatform { available, .. }) if available == [format!("linux/{other_arch}")]
    ));
    // A manifest for another architecture named directly: refused too.
    layout.write_index(&[(other.manifest.clone(), None)]);
    assert!(matches!(
        open(&oci_ref(&layout.dir, "")),
        Err(SourceError::WrongPlatform { architecture, .. }) if architecture == other_arch
    ));
}

#[test]
fn a_pin_that_does_not_match_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path());
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), Some("v1"))]);
    let good = oci_ref(&layout.dir, &format!(":v1@{}", built.manifest_digest));
    assert_eq!(open(&good).expect("open").image.id, built.config);
    // The config's digest is not the manifest's: a pin of an oci: reference is the manifest.
    let bad = oci_ref(&layout.dir, &format!(":v1@{}", built.config));
    let err = open(&bad).err().expect("refused");
    assert!(matches!(err, SourceError::PinMismatch { .. }), "{err}");
    assert!(
        err.to_string().contains(&built.manifest_digest.to_string()),
        "{err}"
    );
}

#[test]
fn a_corrupt_manifest_or_config_is_refused_naming_the_blob() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path());
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), None)]);
    for digest in [built.manifest_digest, built.config] {
        let path = layout.dir.join(oci_blob(&digest));
        let original = fs::read(&path).expect("read");
        let mut flipped = original.clone();
        flipped[5] ^= 0x01;
        fs::write(&path, &flipped).expect("write");
        let err = open(&oci_ref(&layout.dir, "")).err().expect("refused");
        assert!(
            matches!(&err, SourceError::Digest { what, expected, .. }
                if *expected == digest && what.contains(&digest.hex())),
            "{err}"
        );
        fs::write(&path, &original).expect("restore");
    }
    fs::remove_file(layout.dir.join(oci_blob(&built.config))).expect("rm");
    assert!(matches!(
        open(&oci_ref(&layout.dir, "")),
        Err(SourceError::Missing { what }) if what.contains(&built.config.hex())
    ));
    assert!(matches!(
        open(&oci_ref(&tmp.path().join("nothing"), "")),
        Err(SourceError::Missing { what }) if what.ends_with("index.json")
    ));
}

#[test]
fn a_zstd_layer_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path());
    let tars = test_layers();
    let (config, _) = layout.blob(OCI_CONFIG, &config_json(arch(), &[Digest::of(&tars[0])]));
    let (layer, _) = layout.blob("application/vnd.oci.image.layer.v1.tar+zstd", b"zstd bytes");
    let manifest =
        serde_json::to_vec(&json!({"schemaVersion": 2, "config": config, "layers": [layer]}))
            .expect("serialise");
    let (manifest, _) = layout.blob(OCI_MANIFEST, &manifest);
    layout.write_index(&[(manifest, None)]);
    let err = open(&oci_ref(&layout.dir, "")).err().expect("refused");
    assert!(matches!(err, SourceError::MediaType { .. }), "{err}");
    assert!(err.to_string().contains("zstd"), "{err}");
}

#[test]
fn an_oci_archive_reads_as_its_layout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(&tmp.path().join("layout"));
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), Some("v1"))]);
    let from_dir = open(&oci_ref(&layout.dir, ":v1")).expect("open").image;
    // `tar -C layout -cf x.tar .` names members `./index.json`: the same members.
    for prefix in [".", ""] {
        let file = tmp.path().join(format!("archive{}.tar", prefix.len()));
        tar_dir(&layout.dir, prefix, &file);
        let opened = open(&parse(&format!("oci-archive:{}:v1", file.display()))).expect("open");
        assert_eq!(opened.image, from_dir);
        opened.verify_layers().expect("the layers are intact");
    }
}

#[test]
fn a_docker_archive_is_read_by_name_or_as_its_only_image() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("saved.tar");
    let id = docker_archive(&file, &["team/ci:1", "ghcr.io/team/ci:latest"], None);
    let path = file.display();
    for reference in [
        format!("docker-archive:{path}"),
        format!("docker-archive:{path}:team/ci:1"),
        format!("docker-archive:{path}:docker.io/team/ci:1"),
        format!("docker-archive:{path}:ghcr.io/team/ci"),
        format!("docker-archive:{path}@{id}"),
    ] {
        let opened = open(&parse(&reference)).unwrap_or_else(|e| panic!("{reference}: {e}"));
        assert_eq!(opened.image.id, id, "{reference}");
        assert_eq!(opened.image.resolved, id);
        assert_eq!(opened.image.manifest, id);
        let tars = test_layers();
        let digests: Vec<_> = opened.image.layers.iter().map(|l| l.digest).collect();
        assert_eq!(digests, [Digest::of(&tars[0]), Digest::of(&tars[1])]);
        assert_eq!(opened.image.layers[1].size, tars[1].len() as u64);
        opened.verify_layers().expect("the layers are intact");
    }
    assert!(matches!(
        open(&parse(&format!("docker-archive:{path}:team/ci:2"))),
        Err(SourceError::NoSuchName { available, .. }) if available.len() == 2
    ));
    let other = Digest::of(b"another image");
    assert!(matches!(
        open(&parse(&format!("docker-archive:{path}@{other}"))),
        Err(SourceError::PinMismatch { actual, .. }) if actual == id
    ));
}

#[test]
fn a_docker_archive_whose_config_is_not_its_name_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("saved.tar");
    let id = docker_archive(&file, &["x:1"], None);
    // Rewrite the config member's bytes in place: its name still says the old ID.
    let mut bytes = fs::read(&file).expect("read");
    let needle = br#""os":"linux""#;
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the config is in the archive");
    bytes[at + 6] = b'L';
    fs::write(&file, &bytes).expect("write");
    let err = open(&parse(&format!("docker-archive:{}", file.display())))
        .err()
        .expect("refused");
    assert!(
        matches!(&err, SourceError::Digest { expected, what, .. } if *expected == id && what.contains(".json")),
        "{err}"
    );
}

#[test]
fn a_flipped_byte_in_a_layer_fails_its_verification() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(tmp.path());
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), None)]);
    let blob = layout.dir.join(oci_blob(&built.layers[1]));
    let mut bytes = fs::read(&blob).expect("read");
    bytes[515] ^= 0x20;
    fs::write(&blob, &bytes).expect("write");
    let opened = open(&oci_ref(&layout.dir, "")).expect("the manifest and config are intact");
    assert!(matches!(
        opened.verify_layers(),
        Err(SourceError::Digest { expected, .. }) if expected == built.layers[1]
    ));
}

#[test]
fn a_registry_reference_is_not_opened_here() {
    assert!(matches!(
        open(&parse("docker://busybox")),
        Err(SourceError::NotLocal { reference }) if reference == "docker://docker.io/library/busybox:latest"
    ));
}

// ---- pulling into a store

/// The names in the store's directory: what a failed install must not leave.
fn store_names(store: &Store) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(store.dir())
        .expect("read the store")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// The test image's files once both layers are applied.
fn assert_test_rootfs(rootfs: &Path) {
    assert_eq!(
        fs::read(rootfs.join("etc/os-release")).expect("os-release"),
        b"ID=rmtest\n"
    );
    assert_eq!(
        fs::read(rootfs.join("etc/marker")).expect("marker"),
        b"from the second layer"
    );
    assert!(rootfs.join("usr/bin/tool").is_file());
    assert!(rootfs.join("tmp").is_dir());
    assert!(
        !rootfs.join("tmp/gone").exists(),
        "the second layer's whiteout deleted it"
    );
    assert!(
        !rootfs.join("tmp/.wh.gone").exists(),
        "a whiteout is not a file"
    );
}

#[test]
fn pull_installs_an_image_once_from_any_of_its_transports() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(&tmp.path().join("layout"));
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), Some("v1"))]);
    let store = Store::open(&tmp.path().join("store")).expect("open the store");

    let pinned = oci_ref(&layout.dir, &format!(":v1@{}", built.manifest_digest));
    let installed = pull(&pinned, &store).expect("pull");
    assert!(installed.unpacked);
    assert_eq!(installed.stored.id, built.config);
    assert_eq!(installed.image.id, built.config);
    assert_eq!(installed.stored.config_json, installed.image.config_json);
    assert_test_rootfs(&installed.stored.rootfs);
    assert_eq!(store.list().expect("list"), [built.config]);
    assert_eq!(store_names(&store), [built.config.hex()]);

    // The same image again, from its layout, an OCI archive or a Docker archive: the entry
    // there is, nothing unpacked.
    let archive = tmp.path().join("image.tar");
    tar_dir(&layout.dir, ".", &archive);
    let docker = tmp.path().join("docker.tar");
    assert_eq!(docker_archive(&docker, &["team/ci:1"], None), built.config);
    for reference in [
        pinned.clone(),
        parse(&format!("oci-archive:{}:v1", archive.display())),
        parse(&format!(
            "docker-archive:{}@{}",
            docker.display(),
            built.config
        )),
    ] {
        let again = pull(&reference, &store).unwrap_or_else(|e| panic!("{reference}: {e}"));
        assert!(!again.unpacked, "{reference}");
        assert_eq!(again.stored, installed.stored, "{reference}");
    }

    // A Docker archive into a store of its own: its plain layers, read out of the archive.
    let other = Store::open(&tmp.path().join("other")).expect("open the store");
    let from_docker = pull(
        &parse(&format!("docker-archive:{}", docker.display())),
        &other,
    )
    .expect("pull the docker archive");
    assert!(from_docker.unpacked);
    assert_eq!(from_docker.stored.id, built.config);
    assert_test_rootfs(&from_docker.stored.rootfs);
}

#[test]
fn a_flipped_byte_in_a_layer_is_refused_before_a_file_is_written() {
    for layer in [0, 1] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(&tmp.path().join("layout"));
        let built = layout.image(arch(), None);
        layout.write_index(&[(built.manifest.clone(), None)]);
        let blob = layout.dir.join(oci_blob(&built.layers[layer]));
        let mut bytes = fs::read(&blob).expect("read");
        let at = bytes.len() / 2;
        bytes[at] ^= 0x01;
        fs::write(&blob, &bytes).expect("write");
        let store = Store::open(&tmp.path().join("store")).expect("open the store");

        let err = pull(&oci_ref(&layout.dir, ""), &store).expect_err("refused");
        assert!(
            matches!(&err, PullError::Source(SourceError::Digest { expected, what, .. })
                if *expected == built.layers[layer] && what.contains(&built.layers[layer].hex())),
            "layer {layer}: {err}"
        );
        assert_eq!(store.get(&built.config), None);
        assert_eq!(store.list().expect("list"), []);
        // Refused before the store was asked: not even a staging directory was made.
        assert_eq!(store_names(&store), Vec::<String>::new(), "layer {layer}");
    }
}

#[test]
fn a_wrong_diff_id_fails_the_install_and_nothing_is_committed() {
    for layer in [0, 1] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(&tmp.path().join("layout"));
        let mut diff_ids: Vec<Digest> = test_layers().iter().map(|t| Digest::of(t)).collect();
        diff_ids[layer] = Digest::of(b"not this layer");
        let built = layout.image(arch(), Some(diff_ids.clone()));
        layout.write_index(&[(built.manifest.clone(), None)]);
        let store = Store::open(&tmp.path().join("store")).expect("open the store");

        let opened = open(&oci_ref(&layout.dir, "")).expect("open");
        opened
            .verify_layers()
            .expect("the blobs are what the manifest names");
        let err = pull(&oci_ref(&layout.dir, ""), &store).expect_err("refused");
        assert!(
            matches!(&err, PullError::Source(SourceError::DiffId { layer: l, expected, .. })
                if *l == built.layers[layer] && *expected == diff_ids[layer]),
            "layer {layer}: {err}"
        );
        assert_eq!(store.get(&built.config), None);
        assert_eq!(store.list().expect("list"), []);
        assert_eq!(store_names(&store), Vec::<String>::new(), "layer {layer}");
    }
}

// ---- skopeo, the real peer

/// Runs skopeo with `args`, failing the test with its output when it fails.
fn skopeo(args: &[&str]) {
    let output = std::process::Command::new("skopeo")
        .arg("--insecure-policy")
        .args(args)
        .output()
        .expect("run skopeo");
    assert!(
        output.status.success(),
        "skopeo {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn archives_skopeo_writes_read_back_to_the_same_image() {
    const TEST: &str = "source::tests::archives_skopeo_writes_read_back_to_the_same_image";
    if std::process::Command::new("skopeo")
        .arg("--version")
        .output()
        .is_err()
    {
        skip::cannot_run(
            TEST,
            "skopeo",
            "skopeo is not installed (apt-get install skopeo)",
        );
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let layout = Layout::new(&tmp.path().join("layout"));
    let built = layout.image(arch(), None);
    layout.write_index(&[(built.manifest.clone(), Some("v1"))]);
    let source = format!("oci:{}:v1", layout.dir.display());
    let oci_archive = tmp.path().join("skopeo-oci.tar");
    let docker = tmp.path().join("skopeo-docker.tar");
    skopeo(&[
        "copy",
        &source,
        &format!("oci-archive:{}:v1", oci_archive.display()),
    ]);
    skopeo(&[
        "copy",
        &source,
        &format!("docker-archive:{}:team/ci:1", docker.display()),
    ]);
    // And back: our own Docker archive, as skopeo reads it, written as an OCI layout.
    let ours = tmp.path().join("ours-docker.tar");
    docker_archive(&ours, &["team/ci:2"], None);
    let relayout = tmp.path().join("relayout");
    skopeo(&[
        "copy",
        &format!("docker-archive:{}", ours.display()),
        &format!("oci:{}:again", relayout.display()),
    ]);

    let store = Store::open(&tmp.path().join("store")).expect("open the store");
    let config = ImageConfig::parse(&config_json(arch(), &built.diff_ids)).expect("parse");
    // skopeo keeps the config's bytes when it writes an archive, so the image ID is the same;
    // converting a Docker archive to OCI it writes the config anew (its own field order, the
    // empty WorkingDir dropped): the same image under another ID.
    let references = [
        (format!("oci-archive:{}:v1", oci_archive.display()), true),
        (
            format!("docker-archive:{}:team/ci:1", docker.display()),
            true,
        ),
        (
            format!("docker-archive:{}@{}", docker.display(), built.config),
            true,
        ),
        (format!("oci:{}:again", relayout.display()), false),
    ];
    for (n, (reference, same_id)) in references.iter().enumerate() {
        let opened = open(&parse(reference)).unwrap_or_else(|e| panic!("{reference}: {e}"));
        assert_eq!(opened.image.id == built.config, *same_id, "{reference}");
        assert_eq!(opened.image.config, config, "{reference}");
        assert_eq!(
            opened
                .image
                .layers
                .iter()
                .map(|l| l.diff_id)
                .collect::<Vec<_>>(),
            built.diff_ids,
            "{reference}"
        );
        opened
            .verify_layers()
            .unwrap_or_else(|e| panic!("{reference}: {e}"));
        let installed =
            pull(&parse(reference), &store).unwrap_or_else(|e| panic!("{reference}: {e}"));
        assert_eq!(
            installed.unpacked,
            n == 0 || !same_id,
            "{reference}: installed once"
        );
        assert_eq!(installed.stored.id, opened.image.id);
        assert_test_rootfs(&installed.stored.rootfs);
    }
}

/// A layout of one image with one layer, `blob` of `media_type`, whose diff_id is `diff_id`.
fn one_layer_layout(dir: &Path, blob: &[u8], media_type: &str, diff_id: Digest) -> Layout {
    let layout = Layout::new(dir);
    let (config, _) = layout.blob(OCI_CONFIG, &config_json(arch(), &[diff_id]));
    let (layer, _) = layout.blob(media_type, blob);
    let manifest = serde_json::to_vec(
        &json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [layer]}),
    )
    .expect("serialise");
    let (manifest, _) = layout.blob(OCI_MANIFEST, &manifest);
    layout.write_index(&[(manifest, None)]);
    layout
}

#[test]
fn a_layer_changed_after_its_verification_is_caught_while_it_is_unpacked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tar = layer_tar(&[Entry::File("marker", b"the layer as verified")]);
    let layout = one_layer_layout(&tmp.path().join("layout"), &tar, OCI_TAR, Digest::of(&tar));
    let opened = open(&oci_ref(&layout.dir, "")).expect("open");
    opened.verify_layers().expect("intact");
    // Between the check and the unpack, a byte of the file's data changes (the tar still
    // parses): the stream's own digests catch it.
    let blob = layout.dir.join(oci_blob(&Digest::of(&tar)));
    let mut bytes = tar.clone();
    bytes[512] ^= 0x01;
    fs::write(&blob, &bytes).expect("write");
    let root = tmp.path().join("root");
    fs::create_dir(&root).expect("mkdir");
    let err = opened
        .apply_layer(0, &root, &mut UnpackReport::default())
        .expect_err("refused");
    assert!(
        matches!(&err, PullError::Source(SourceError::Digest { expected, .. }) if *expected == Digest::of(&tar)),
        "{err}"
    );
}

#[test]
fn a_layers_padding_after_its_tar_is_covered_by_its_diff_id() {
    // Writers pad a tar to their record size: the diff_id is of the whole stream.
    let tar = layer_tar(&[Entry::File("marker", b"x")]);
    let mut padded = tar.clone();
    padded.resize(tar.len() + 64 * 1024, 0);
    for (diff_id, accepted) in [(Digest::of(&padded), true), (Digest::of(&tar), false)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = one_layer_layout(tmp.path(), &gzip(&padded), OCI_TAR_GZIP, diff_id);
        let store = Store::open(&tmp.path().join("store")).expect("open the store");
        match pull(&oci_ref(&layout.dir, ""), &store) {
            Ok(installed) if accepted => {
                assert_eq!(
                    fs::read(installed.stored.rootfs.join("marker")).expect("read"),
                    b"x"
                );
            }
            Err(PullError::Source(SourceError::DiffId {
                expected, actual, ..
            })) if !accepted => {
                assert_eq!((expected, actual), (Digest::of(&tar), Digest::of(&padded)));
                assert_eq!(store.list().expect("list"), []);
            }
            other => panic!("diff_id {diff_id}: {other:?}"),
        }
    }
}
