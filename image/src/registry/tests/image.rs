//! Small test images made here (a gzip layer built with the tar crate, an OCI config and
//! manifest, an index over two platforms), served by the fake registry or written as an OCI
//! layout for skopeo to push to the real one.

use std::io::Write as _;
use std::path::Path;

use super::super::manifest::{DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST};
use crate::reference::Digest;

/// Which media types an image is written with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Flavour {
    Oci,
    /// Docker's schema 2: a manifest list, `vnd.docker` manifests, config and layers.
    Docker,
}

impl Flavour {
    fn layer(self) -> &'static str {
        match self {
            Flavour::Oci => "application/vnd.oci.image.layer.v1.tar+gzip",
            Flavour::Docker => "application/vnd.docker.image.rootfs.diff.tar.gzip",
        }
    }
    fn config(self) -> &'static str {
        match self {
            Flavour::Oci => "application/vnd.oci.image.config.v1+json",
            Flavour::Docker => "application/vnd.docker.container.image.v1+json",
        }
    }
    fn manifest(self) -> &'static str {
        match self {
            Flavour::Oci => OCI_MANIFEST,
            Flavour::Docker => DOCKER_MANIFEST,
        }
    }
    fn index(self) -> &'static str {
        match self {
            Flavour::Oci => OCI_INDEX,
            Flavour::Docker => DOCKER_LIST,
        }
    }
}

/// Bytes and what they are.
#[derive(Clone)]
pub(crate) struct Blob {
    pub(crate) media_type: &'static str,
    pub(crate) bytes: Vec<u8>,
}

impl Blob {
    pub(crate) fn digest(&self) -> Digest {
        Digest::of(&self.bytes)
    }

    fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({
            "mediaType": self.media_type,
            "digest": self.digest().to_string(),
            "size": self.bytes.len(),
        })
    }
}

/// One platform's image.
#[derive(Clone)]
pub(crate) struct TestImage {
    pub(crate) config: Blob,
    pub(crate) layers: Vec<Blob>,
    pub(crate) manifest: Blob,
}

impl TestImage {
    /// Its config and layers.
    pub(crate) fn blobs(&self) -> Vec<&Blob> {
        std::iter::once(&self.config).chain(&self.layers).collect()
    }
}

/// Two platforms' images and the index over them.
#[derive(Clone)]
pub(crate) struct TestIndex {
    /// The image for this machine.
    pub(crate) ours: TestImage,
    /// The image for another architecture (never downloaded here).
    pub(crate) other: TestImage,
    pub(crate) index: Blob,
}

impl TestIndex {
    /// Every blob and manifest, the index included.
    pub(crate) fn all(&self) -> Vec<&Blob> {
        let mut all = vec![&self.index, &self.ours.manifest, &self.other.manifest];
        all.extend(self.ours.blobs());
        all.extend(self.other.blobs());
        all
    }

    /// Writes the images as an OCI layout whose `index.json` names the index by `tag` (what
    /// `skopeo copy --all oci:<dir>:<tag>` pushes).
    pub(crate) fn write_layout(&self, dir: &Path, tag: &str) {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).expect("layout dir");
        for blob in self.all() {
            std::fs::write(blobs.join(blob.digest().hex()), &blob.bytes).expect("blob");
        }
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
            .expect("oci-layout");
        let mut entry = self.index.descriptor();
        entry["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": tag });
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [entry],
        });
        std::fs::write(dir.join("index.json"), index.to_string()).expect("index.json");
    }
}

/// A gzip layer holding `etc/marker` with `marker` (and a blob of `filler` bytes, to make a
/// layer big enough to stream in several pieces); returns the layer and its diff id.
fn layer(flavour: Flavour, marker: &str, filler: usize) -> (Blob, Digest) {
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        tar.append_data(&mut header, name, data).expect("tar entry");
    };
    add("etc/marker", marker.as_bytes());
    // Pseudo-random, so gzip cannot shrink it to nothing.
    let mut x: u32 = 0x9e37_79b9;
    let filler: Vec<u8> = (0..filler)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x & 0xff) as u8
        })
        .collect();
    add("opt/filler.bin", &filler);
    let tar = tar.into_inner().expect("tar");
    let diff_id = Digest::of(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    let bytes = gz.finish().expect("gzip");
    (
        Blob {
            media_type: flavour.layer(),
            bytes,
        },
        diff_id,
    )
}

/// An image for `arch` with two layers (the second one of about 300 KiB).
pub(crate) fn image(flavour: Flavour, arch: &str, marker: &str) -> TestImage {
    let (first, first_id) = layer(flavour, marker, 10);
    let (second, second_id) = layer(flavour, &format!("{marker} again"), 300 * 1024);
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": { "Env": ["PATH=/usr/bin:/bin"] },
        "rootfs": { "type": "layers", "diff_ids": [first_id.to_string(), second_id.to_string()] },
    });
    let config = Blob {
        media_type: flavour.config(),
        bytes: config.to_string().into_bytes(),
    };
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": flavour.manifest(),
        "config": config.descriptor(),
        "layers": [first.descriptor(), second.descriptor()],
    });
    TestImage {
        config,
        layers: vec![first, second],
        manifest: Blob {
            media_type: flavour.manifest(),
            bytes: manifest.to_string().into_bytes(),
        },
    }
}

/// The index (OCI) over an image for this machine and one for another architecture.
pub(crate) fn multi_arch(marker: &str) -> TestIndex {
    multi_arch_as(Flavour::Oci, marker)
}

/// The index over an image for this machine and one for another architecture.
pub(crate) fn multi_arch_as(flavour: Flavour, marker: &str) -> TestIndex {
    let (ours_arch, _) = super::super::manifest::this_platform();
    let other_arch = if ours_arch == "s390x" {
        "amd64"
    } else {
        "s390x"
    };
    let ours = image(flavour, ours_arch, marker);
    let other = image(flavour, other_arch, &format!("{marker} elsewhere"));
    let entry = |img: &TestImage, arch: &str| {
        let mut d = img.manifest.descriptor();
        d["platform"] = serde_json::json!({ "os": "linux", "architecture": arch });
        d
    };
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": flavour.index(),
        "manifests": [entry(&other, other_arch), entry(&ours, ours_arch)],
    });
    TestIndex {
        ours,
        other,
        index: Blob {
            media_type: flavour.index(),
            bytes: index.to_string().into_bytes(),
        },
    }
}

/// Checks that `dir` is a complete layout of `image` (named by `index.json`), each blob
/// verifying, and nothing partial left.
pub(crate) fn assert_layout(dir: &Path, image: &TestImage) {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("index.json"))
            .expect("index.json is JSON");
    let manifests = index["manifests"].as_array().expect("manifests");
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(
        manifests[0]["digest"],
        image.manifest.digest().to_string(),
        "index.json names this platform's manifest"
    );
    assert_eq!(manifests[0]["size"], image.manifest.bytes.len());
    assert_eq!(
        std::fs::read_to_string(dir.join("oci-layout")).expect("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#
    );
    for blob in std::iter::once(&image.manifest).chain(image.blobs()) {
        let path = dir.join("blobs/sha256").join(blob.digest().hex());
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            Digest::of(&bytes),
            blob.digest(),
            "{} verifies",
            path.display()
        );
    }
    assert_no_partials(dir);
}

/// Nothing partial in the layout's blobs.
pub(crate) fn assert_no_partials(dir: &Path) {
    for entry in std::fs::read_dir(dir.join("blobs/sha256")).expect("blobs dir") {
        let name = entry.expect("entry").file_name();
        assert!(
            !name.to_string_lossy().starts_with('.'),
            "a partial file was left: {name:?}"
        );
    }
}
