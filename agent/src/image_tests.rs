//! The images of `run` in process: small OCI layouts written here (one gzip layer), installed,
//! replaced under the same tag, collected once no attempt uses them, refreshed by the loop, and
//! refused when corrupt or when a job could change their source. [`write_layout`] is shared with
//! `check`'s `image` tests.

use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use super::*;

/// A layout written here is one image whose single layer holds `files` (each path's parent
/// directories added), tagged `tag` in `dir`'s `index.json` (replacing what it listed; blobs
/// already there are kept), its config's `ENV` `RM_IMAGE_TEST=<tag>`. Gives the image's id.
pub(crate) fn write_layout(dir: &Path, tag: &str, files: &[(&str, &[u8])]) -> Digest {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let blob = |bytes: &[u8], media_type: &str| {
        let digest = Digest::of(bytes);
        std::fs::write(dir.join("blobs/sha256").join(digest.hex()), bytes).unwrap();
        json!({"mediaType": media_type, "digest": digest.to_string(), "size": bytes.len()})
    };
    let tar = layer_tar(files);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gzip.write_all(&tar).unwrap();
    let layer = blob(
        &gzip.finish().unwrap(),
        "application/vnd.oci.image.layer.v1.tar+gzip",
    );
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config_json = serde_json::to_vec(&json!({
        "architecture": architecture,
        "os": "linux",
        "config": {"Env": [format!("RM_IMAGE_TEST={tag}")]},
        "rootfs": {"type": "layers", "diff_ids": [Digest::of(&tar).to_string()]},
    }))
    .unwrap();
    let id = Digest::of(&config_json);
    let config = blob(&config_json, "application/vnd.oci.image.config.v1+json");
    let manifest_type = "application/vnd.oci.image.manifest.v1+json";
    let mut manifest = blob(
        &serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": config,
            "layers": [layer],
        }))
        .unwrap(),
        manifest_type,
    );
    manifest["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [manifest]})).unwrap(),
    )
    .unwrap();
    id
}

/// A header owned by root, with a fixed time (the layer's digest is the same each time).
fn header() -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header
}

/// One uncompressed layer: `files` as root-owned 0644 files, their parents as 0755 directories.
fn layer_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = BTreeSet::new();
    for (path, data) in files {
        for parent in Path::new(path).ancestors().skip(1) {
            if parent.as_os_str().is_empty() || !dirs.insert(parent.to_owned()) {
                continue;
            }
            let mut header = header();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder.append_data(&mut header, parent, &[][..]).unwrap();
        }
        let mut header = header();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, path, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// A policy `ci` whose image is the layout at `layout`, tag `ci`.
fn policy(layout: &Path) -> Policy {
    let config = crate::config::from_text(&format!(
        "[[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"ci\"]\nimage = \"oci:{}:ci\"\n",
        layout.display()
    ))
    .unwrap();
    config.policies[0].clone()
}

fn image_of(policy: &Policy) -> PolicyImage {
    policy.image.clone().unwrap()
}

/// What a runner of `id` would see at `path` in its root.
fn read_in(images: &Images, id: &Digest, path: &str) -> String {
    let plan = plan_of(Some(images), &id.to_string());
    std::fs::read_to_string(plan.rootfs.join(path)).unwrap()
}

/// Install, then the same tag rewritten to other content: the policy's current image follows,
/// each is started from its own stored root and `ENV`; the old one is kept while an uncleaned
/// attempt names it and removed once none does; the current one is never removed.
#[tokio::test]
async fn a_rewritten_tag_becomes_current_and_the_old_image_goes_once_unused() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let first = write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let images = Arc::new(Images::open(&tmp.path().join("data")).unwrap());
    let policy = policy(&layout);
    assert_eq!(images.current("ci"), None);

    let installed = images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();
    assert_eq!(installed.id, first);
    assert_eq!(installed.reference, format!("oci:{}:ci", layout.display()));
    assert_eq!(images.current("ci"), Some(installed.clone()));
    assert_eq!(read_in(&images, &first, "etc/release"), "one\n");
    let plan = plan_of(Some(&images), &first.to_string());
    assert_eq!(plan.id, first.to_string());
    assert_eq!(plan.env, [("RM_IMAGE_TEST".into(), "ci".into())]);

    let second = write_layout(&layout, "ci", &[("etc/release", b"two\n")]);
    assert_ne!(first, second);
    let now = images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();
    assert_eq!(now.id, second);
    assert_ne!(now.manifest, installed.manifest);
    assert_eq!(images.current("ci").map(|c| c.id), Some(second));
    assert_eq!(read_in(&images, &second, "etc/release"), "two\n");
    // A runner of the first image still starts from it.
    assert_eq!(read_in(&images, &first, "etc/release"), "one\n");

    let in_use = BTreeSet::from([first.to_string()]);
    assert_eq!(images.collect(&in_use), []);
    assert!(images.store.get(&first).is_some());
    assert_eq!(images.collect(&BTreeSet::new()), [first]);
    assert!(images.store.get(&first).is_none());
    assert!(images.store.get(&second).is_some(), "the current one stays");
    assert_eq!(images.store.list().unwrap(), [second]);
}

/// A refresh that fails (the layout's index unreadable, then a layer blob altered) is an error
/// and the policy keeps the image it had, still stored and startable.
#[tokio::test]
async fn a_failing_refresh_keeps_the_current_image() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let first = write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let images = Arc::new(Images::open(&tmp.path().join("data")).unwrap());
    let policy = policy(&layout);
    images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();

    std::fs::write(layout.join("index.json"), b"{ not json").unwrap();
    let refused = images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("cannot install image"),
        "{refused:#}"
    );
    assert_eq!(images.current("ci").map(|c| c.id), Some(first));

    // A new image under the tag whose layer blob is altered after it was written.
    let second = write_layout(&layout, "ci", &[("etc/release", b"two\n")]);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest_digest = Digest::parse(index["manifests"][0]["digest"].as_str().unwrap()).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(layout.join("blobs/sha256").join(manifest_digest.hex())).unwrap(),
    )
    .unwrap();
    let layer = Digest::parse(manifest["layers"][0]["digest"].as_str().unwrap()).unwrap();
    let blob = layout.join("blobs/sha256").join(layer.hex());
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let refused = images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains(&layer.to_string()),
        "names the blob: {refused:#}"
    );
    assert_eq!(images.current("ci").map(|c| c.id), Some(first));
    assert!(images.store.get(&second).is_none(), "nothing of it stored");
    assert_eq!(read_in(&images, &first, "etc/release"), "one\n");
}

/// With the runner uids given, an image source a job could change since `run` started (the
/// layout made writable by every user) is refused at the next install; the policy keeps its
/// image. Put right, it installs again.
#[tokio::test]
async fn a_source_a_job_could_change_is_refused_at_the_next_install() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let layout = base.join("layout");
    let first = write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let pool = rm_runner::isolate::Pool::resolve(&rm_runner::isolate::RunnerUids::Range {
        first: 4_200_000,
        last: 4_200_003,
    })
    .unwrap();
    let images = Arc::new(
        Images::open(&base.join("data"))
            .unwrap()
            .judging_sources_against(pool),
    );
    let policy = policy(&layout);
    images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();

    write_layout(&layout, "ci", &[("etc/release", b"two\n")]);
    let blobs = layout.join("blobs/sha256");
    std::fs::set_permissions(&blobs, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap_err();
    let message = format!("{refused:#}");
    assert!(
        message.contains("a job could change what every later runner gets")
            && message.contains(&format!("chmod go-w {}", blobs.display())),
        "{message}"
    );
    assert_eq!(images.current("ci").map(|c| c.id), Some(first));

    std::fs::set_permissions(&blobs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let now = images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();
    assert_ne!(now.id, first);
}

/// An attempt whose image the store does not hold (removed, or an agent without a store) gets a
/// plan whose root is no directory: the runner's start refuses it rather than using the host's.
#[test]
fn an_unknown_image_gives_a_plan_the_runner_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let images = Images::open(&tmp.path().join("data")).unwrap();
    let unknown = Digest::of(b"no such image").to_string();
    for plan in [
        plan_of(Some(&images), &unknown),
        plan_of(None, &unknown),
        plan_of(Some(&images), "not a digest"),
    ] {
        assert!(
            !plan.rootfs.is_absolute() || !plan.rootfs.is_dir(),
            "{plan:?}"
        );
        assert!(plan.env.is_empty());
    }
    assert_eq!(plan_of(None, &unknown).id, unknown);
}

/// How long a test waits for the refresh loop to do what it should at all (never a measured
/// duration: a loop that never does it fails here).
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `done`, failing the test with `what` the loop did not do.
async fn until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the loop did not {what}"));
}

/// The refresh loop, with an interval shorter than the configuration allows: the rewritten tag
/// becomes current and the image it replaced is collected (no attempt uses it); a refresh that
/// fails keeps the image; the loop ends when told to stop.
#[tokio::test]
async fn the_refresh_loop_follows_the_tag_collects_and_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let first = write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let images = Arc::new(Images::open(&tmp.path().join("data")).unwrap());
    let mut policy = policy(&layout);
    images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();
    if let Some(image) = policy.image.as_mut() {
        image.refresh = Some(Duration::from_millis(10));
    }
    let passes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&passes);
    let in_use = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(BTreeSet::new())
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let looping = tokio::spawn(refresh_loop(
        Arc::clone(&images),
        policy,
        || None,
        in_use,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let second = write_layout(&layout, "ci", &[("etc/release", b"two\n")]);
    until("follow the tag", || {
        images.current("ci").map(|c| c.id) == Some(second)
    })
    .await;
    until("collect the replaced image", || {
        images.store.get(&first).is_none()
    })
    .await;

    std::fs::write(layout.join("index.json"), b"{ not json").unwrap();
    let seen = passes.load(Ordering::SeqCst);
    until("go on refreshing", || {
        passes.load(Ordering::SeqCst) >= seen + 2
    })
    .await;
    assert_eq!(images.current("ci").map(|c| c.id), Some(second));
    assert!(images.store.get(&second).is_some());

    stop_tx.send(()).unwrap();
    tokio::time::timeout(PATIENCE, looping)
        .await
        .expect("the loop ends when told to stop")
        .unwrap();
}

/// A policy without `image_refresh` (or without an image) has no loop: it returns at once.
#[tokio::test]
async fn no_refresh_configured_is_no_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let images = Arc::new(Images::open(&tmp.path().join("data")).unwrap());
    let policy = policy(&tmp.path().join("layout"));
    tokio::time::timeout(
        PATIENCE,
        refresh_loop(
            images,
            policy,
            || None,
            || Ok(BTreeSet::new()),
            std::future::pending(),
        ),
    )
    .await
    .expect("returns without waiting for a stop");
}

/// A new runner release is adopted only when every policy's image can run it: a package whose
/// program needs libraries the image lacks is refused, naming the policy and the library; a
/// package of scripts is admitted.
#[tokio::test]
async fn a_release_no_image_can_run_is_not_admitted() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let images = Arc::new(Images::open(&tmp.path().join("data")).unwrap());
    let policy = policy(&layout);
    images
        .install("ci", &image_of(&policy), None)
        .await
        .unwrap();
    let admit = admission(Arc::clone(&images));
    let scripts = tmp.path().join("scripts");
    std::fs::create_dir_all(scripts.join("bin")).unwrap();
    std::fs::write(scripts.join("bin/Runner.Listener"), "#!/bin/sh\n").unwrap();
    assert_eq!(admit(&scripts), Ok(()));
    let native = tmp.path().join("native");
    std::fs::create_dir_all(native.join("bin")).unwrap();
    std::fs::copy("/bin/ls", native.join("bin/Runner.Listener")).unwrap();
    let refused = admit(&native).unwrap_err();
    assert!(refused.contains("policy `ci`"), "{refused}");
    assert!(refused.contains("libc.so.6"), "{refused}");
}
