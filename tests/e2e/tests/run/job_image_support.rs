//! The check of tests/support/job_image.rs, the job images of issue 40's tests: the Debian root
//! runs a shell, the Docker CLI and the fake runner (chroot into it), the layouts it writes are
//! what skopeo reads (the same digests, through oci-archive and docker-archive too), the
//! hostile layers carry the entries they are named for, and a corrupted blob fails a copy.

use std::io::Read as _;
use std::path::Path;
use std::process::Command;

use crate::job_image::{self, Hostile};
use crate::skip;

/// Whether the images can be made here; records the skip otherwise.
fn can_make_images(test: &str) -> bool {
    if let Some((need, why)) = job_image::missing_tool() {
        skip::cannot_run(test, need, &why);
        return false;
    }
    if !is_root() {
        skip::cannot_run(test, "root", "mmdebstrap and chroot need root");
        return false;
    }
    true
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn chroot(root: &Path, argv: &[&str]) -> std::process::Output {
    Command::new("chroot")
        .arg(root)
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap()
}

/// The entries of a layer blob (gzip or not): (name as written, type, mode, link name).
fn layer_entries(blob: &Path) -> Vec<(String, tar::EntryType, u32, String)> {
    let bytes = std::fs::read(blob).unwrap();
    let plain = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .unwrap();
        out
    } else {
        bytes
    };
    let mut archive = tar::Archive::new(plain.as_slice());
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let link = e
                .link_name_bytes()
                .map(|l| String::from_utf8_lossy(&l).into_owned())
                .unwrap_or_default();
            (
                String::from_utf8_lossy(&e.path_bytes()).into_owned(),
                e.header().entry_type(),
                e.header().mode().unwrap(),
                link,
            )
        })
        .collect()
}

#[test]
fn the_debian_root_runs_a_shell_the_docker_cli_and_the_fake_runner() {
    if !can_make_images("the_debian_root_runs_a_shell_the_docker_cli_and_the_fake_runner") {
        return;
    }
    let root = job_image::debian_root();
    let marker = std::fs::read_to_string(root.join(job_image::MARKER_FILE)).unwrap();
    assert_eq!(marker.len(), 32, "{marker:?}");
    // A copy of the root made of hard links (the root is shared: a chroot's writes, even a
    // directory's mtime, would change the layouts other tests make of it), the fake runner
    // added.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("root");
    let cp = Command::new("cp")
        .arg("-al")
        .arg(&root)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    std::fs::copy(
        rm_e2e::binary("rm-fake-runner"),
        copy.join("rm-fake-runner"),
    )
    .unwrap();

    let out = chroot(
        &copy,
        &[
            "/bin/sh",
            "-c",
            "cat /etc/rm-test-image; echo; docker --version; . /etc/os-release; echo \"$ID $VERSION_CODENAME\"; \
             id -un; ls /srv; readlink /var/run; mkdir /tmp/d && touch /tmp/d/f && test -f /tmp/d/f && echo ok",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], marker);
    assert!(lines[1].starts_with("Docker version "), "{stdout}");
    assert_eq!(lines[2], "debian bookworm");
    assert_eq!(lines[3], "root");
    assert_eq!(lines[4], "scratch");
    assert_eq!(lines[5], "/run");
    assert_eq!(lines[6], "ok");

    use std::os::unix::fs::PermissionsExt as _;
    let scratch = std::fs::metadata(root.join(job_image::SCRATCH_DIR)).unwrap();
    assert_eq!(scratch.permissions().mode() & 0o7777, 0o1777);
    assert!(!root.join("nowhere").exists(), "WORKDIR must not exist");
    // No device node (nor anything else) in /dev: a runner gets its own.
    assert_eq!(std::fs::read_dir(root.join("dev")).unwrap().count(), 0);

    // The fake runner, a dynamically linked Rust binary, runs in it.
    let out = chroot(&copy, &["/rm-fake-runner"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("usage: Runner.Listener"), "{stderr}");
}

#[test]
fn the_layouts_are_what_skopeo_reads() {
    if !can_make_images("the_layouts_are_what_skopeo_reads") {
        return;
    }
    let image = job_image::debian_image();
    let tag = image.tag;
    assert_eq!(
        job_image::skopeo_digest(&format!("oci:{}:{tag}", image.layout.display())),
        image.info.manifest_digest
    );
    // Every blob is what its name says.
    for entry in std::fs::read_dir(image.layout.join("blobs/sha256")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            job_image::sha256(&std::fs::read(&path).unwrap()),
            format!("sha256:{name}")
        );
    }
    // The config: the environment, USER and WORKDIR the tests show are applied or ignored, and
    // the diff_id of the layer.
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(job_image::blob_path(
            &image.layout,
            &image.info.config_digest,
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(config["config"]["User"], job_image::IMAGE_USER);
    assert_eq!(config["config"]["WorkingDir"], job_image::IMAGE_WORKDIR);
    assert!(
        config["config"]["Env"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("RM_IMAGE_ENV=from-image"))
    );
    let blob = job_image::blob_path(&image.layout, &image.info.layers[0]);
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&blob).unwrap())
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        job_image::sha256(&plain).as_str()
    );
    let entries = layer_entries(&blob);
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    for name in [
        "bin/sh",
        "usr/bin/docker",
        "etc/rm-test-image",
        "srv/scratch/",
    ] {
        assert!(names.contains(&name), "{name} missing from the layer");
    }

    // The same root gives the same image.
    let tmp = tempfile::tempdir().unwrap();
    let again = job_image::oci_layout(&image.root, &tmp.path().join("again"), tag);
    assert_eq!(again, image.info);

    // The archives: oci-archive keeps the manifest; docker-archive's image ID is the config's.
    let archive = tmp.path().join("image.oci.tar");
    assert_eq!(
        job_image::oci_archive(&image.layout, tag, &archive),
        image.info.manifest_digest
    );
    let docker = tmp.path().join("image.docker.tar");
    assert_eq!(
        job_image::docker_archive(&image.layout, tag, &docker, "rm-test/debian:bookworm"),
        image.info.config_digest
    );

    // The padded image: the same base, one more plain layer of the size asked.
    let pad_size = 3 << 20;
    let padded = job_image::padded_image(pad_size);
    assert_eq!(padded.info.layers.len(), 2);
    let base = layer_entries(&job_image::blob_path(
        &padded.layout,
        &padded.info.layers[0],
    ));
    assert!(base.iter().any(|e| e.0 == "bin/sh"));
    assert!(!base.iter().any(|e| e.0 == "usr/bin/docker"), "not slim");
    let pad = layer_entries(&job_image::blob_path(
        &padded.layout,
        &padded.info.layers[1],
    ));
    assert_eq!(pad.len(), 1);
    assert_eq!(pad[0].0, "rm-padding");
    assert_eq!(
        job_image::skopeo_digest(&format!("oci:{}:{tag}", padded.layout.display())),
        padded.info.manifest_digest
    );
    let pad_blob = job_image::blob_path(&padded.layout, &padded.info.layers[1]);
    let pad_len = std::fs::metadata(&pad_blob).unwrap().len();
    assert!(pad_len > pad_size && pad_len < pad_size + 8192, "{pad_len}");
}

#[test]
fn hostile_layouts_carry_their_entry_and_a_corrupted_blob_fails_a_copy() {
    if !can_make_images("hostile_layouts_carry_their_entry_and_a_corrupted_blob_fails_a_copy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for kind in Hostile::ALL {
        let layout = tmp.path().join(format!("{kind:?}"));
        let hostile = job_image::hostile_layout(kind, &layout, "hostile");
        // A valid layout: skopeo reads it and copies every blob (it does not unpack).
        assert_eq!(
            job_image::skopeo_digest(&format!("oci:{}:hostile", layout.display())),
            hostile.info.manifest_digest,
            "{kind:?}"
        );
        let entries = layer_entries(&job_image::blob_path(&layout, &hostile.info.layers[1]));
        let entry = entries
            .iter()
            .find(|e| e.0 == hostile.entry)
            .unwrap_or_else(|| panic!("{kind:?}: no {} in {entries:?}", hostile.entry));
        match kind {
            Hostile::PathTraversal => assert!(entry.0.starts_with("../../../")),
            Hostile::AbsolutePath => assert!(entry.0.starts_with("/etc/")),
            Hostile::AbsoluteSymlinkEscape => assert!(
                entries
                    .iter()
                    .any(|e| e.0 == "etc/evil" && e.1 == tar::EntryType::Symlink && e.3 == "/etc")
            ),
            Hostile::RelativeSymlinkEscape => assert!(entries.iter().any(|e| e.0 == "etc/up"
                && e.1 == tar::EntryType::Symlink
                && e.3.starts_with("../../../"))),
            Hostile::HardLinkEscape => {
                assert_eq!(entry.1, tar::EntryType::Link);
                assert!(hostile.host_link_target.as_deref().unwrap().is_file());
                assert!(entry.3.starts_with("../../../"), "{entry:?}");
            }
            Hostile::DeviceNode => assert_eq!(entry.1, tar::EntryType::Char),
            Hostile::Setuid => assert_eq!(entry.2, 0o4755),
        }
        let escape = hostile.host_escape.as_deref();
        if let Some(path) = escape {
            assert!(path.starts_with("/etc") && !path.exists());
        }
    }

    let layout = tmp.path().join("PathTraversal");
    let copied = tmp.path().join("corrupt");
    job_image::copy_layout(&layout, &copied);
    let digest = job_image::corrupt_one_byte(&copied, "hostile", 0);
    let blob = job_image::blob_path(&copied, &digest);
    assert_ne!(
        job_image::sha256(&std::fs::read(&blob).unwrap()),
        digest,
        "the byte was not flipped"
    );
    let out = Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{}:hostile", copied.display()))
        .arg(format!("dir:{}", tmp.path().join("dir").display()))
        .output()
        .unwrap();
    assert!(!out.status.success(), "skopeo copied a corrupted layer");
    // The original is untouched.
    assert_eq!(
        job_image::sha256(&std::fs::read(job_image::blob_path(&layout, &digest)).unwrap()),
        digest
    );
}
