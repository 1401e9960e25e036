use std::os::unix::fs::PermissionsExt as _;

use super::*;
use crate::commands::check::Status;
use crate::image::tests::write_layout;

fn id(byte: u8) -> Digest {
    Digest::of(&[byte])
}

#[test]
fn each_sighting_is_its_finding() {
    let reference = "oci:/srv/images/ci:bookworm";
    let report = "the image cannot run the runner package: 1 piece is missing\n  - the image lacks libc.so.6, needed by bin/Runner.Listener: install libc6 in the image";
    let cases: Vec<(Seen, Status, Vec<String>)> = vec![
        (
            Seen::Stored {
                id: id(1),
                fit: Fit::Fits {
                    runner: "runner 2.336.0".into(),
                    examined: 212,
                },
            },
            Status::Ok,
            vec![
                format!("image `{reference}` ({})", id(1)),
                "in the store and can run runner 2.336.0 (212 ELF files examined)".into(),
            ],
        ),
        (
            Seen::Stored {
                id: id(1),
                fit: Fit::Unfit {
                    runner: "the runner at /opt/runner".into(),
                    report: report.into(),
                },
            },
            Status::Fail,
            vec![
                "cannot run the runner at /opt/runner".into(),
                "the image lacks libc.so.6, needed by bin/Runner.Listener: install libc6".into(),
            ],
        ),
        (
            Seen::Stored {
                id: id(1),
                fit: Fit::NoPackage("runner 2.336.0 is not downloaded yet".into()),
            },
            Status::Ok,
            vec![
                "is in the store".into(),
                "runner 2.336.0 is not downloaded yet".into(),
            ],
        ),
        (
            Seen::Verified {
                id: id(2),
                layers: 3,
            },
            Status::Ok,
            vec![
                format!("({})", id(2)),
                "reads and verifies (3 layers)".into(),
                "unpacks it at start".into(),
            ],
        ),
        (
            Seen::Verified {
                id: id(2),
                layers: 1,
            },
            Status::Ok,
            vec!["reads and verifies (1 layer)".into()],
        ),
        (
            Seen::Unreadable("cannot read index.json: No such file".into()),
            Status::Fail,
            vec!["cannot be read: cannot read index.json: No such file".into()],
        ),
        (
            Seen::Resolved {
                tag: "1".into(),
                digest: id(3),
            },
            Status::Ok,
            vec![format!("the registry names {} for tag 1", id(3))],
        ),
        (
            Seen::Pinned(id(4)),
            Status::Ok,
            vec![format!("is pinned to {}", id(4))],
        ),
        (
            Seen::Unreachable("cannot reach ghcr.io: connection refused".into()),
            Status::Warn,
            vec!["cannot resolve its tag: cannot reach ghcr.io: connection refused".into()],
        ),
        (
            Seen::Credentials(
                "policy `ci`: image_credentials_file: /etc/rm/registry is readable by every user on this host; run `chmod 600 /etc/rm/registry`".into(),
            ),
            Status::Fail,
            vec!["/etc/rm/registry is readable by every user".into()],
        ),
    ];
    for (seen, status, words) in cases {
        let finding = of(reference, &seen);
        assert_eq!(finding.check, "image");
        assert_eq!(finding.status, status, "{seen:?}");
        assert_eq!(
            finding.remedy.is_empty(),
            status == Status::Ok,
            "{finding:?}"
        );
        assert!(finding.what.contains(reference), "{}", finding.what);
        for word in words {
            assert!(finding.what.contains(&word), "{word}: {}", finding.what);
        }
    }
    let credentials = of(
        reference,
        &Seen::Credentials("k: /f is readable by every user; run `chmod 600 /f`".into()),
    );
    assert_eq!(credentials.remedy, "run `chmod 600 /f`");
}

/// A local image judged where it is: not in the store, it is read and verified without the
/// store being made; once `run` has stored it, it is judged against the package: a package of
/// scripts fits, one holding a dynamically linked program the image has no loader or libc for
/// does not, naming what it lacks. A layer altered in the source is found unreadable, and so is
/// a tag the layout does not have.
#[test]
fn a_local_image_is_verified_where_it_is_then_judged_in_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let id = write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let reference = ImageRef::parse(&format!("oci:{}:ci", layout.display())).unwrap();
    let store = tmp.path().join("data").join(crate::image::IMAGES_DIR);
    let scripts = tmp.path().join("scripts");
    std::fs::create_dir_all(scripts.join("bin")).unwrap();
    std::fs::write(scripts.join("bin/run.sh"), "#!/bin/sh\n").unwrap();
    let package = Ok(("the runner at scripts".to_owned(), scripts.clone()));

    assert_eq!(
        examine_local(&reference, &store, &package),
        Seen::Verified { id, layers: 1 }
    );
    assert!(!store.exists(), "check writes no store");

    rm_image::source::pull(&reference, &rm_image::store::Store::open(&store).unwrap()).unwrap();
    assert!(matches!(
        examine_local(&reference, &store, &package),
        Seen::Stored { id: found, fit: Fit::Fits { .. } } if found == id
    ));
    assert_eq!(
        examine_local(&reference, &store, &Err("not downloaded yet".into())),
        Seen::Stored {
            id,
            fit: Fit::NoPackage("not downloaded yet".into())
        }
    );

    let programs = tmp.path().join("programs");
    std::fs::create_dir_all(programs.join("bin")).unwrap();
    std::fs::copy("/bin/ls", programs.join("bin/Runner.Listener")).unwrap();
    std::fs::set_permissions(
        programs.join("bin/Runner.Listener"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let unfit = examine_local(
        &reference,
        &store,
        &Ok(("the runner at programs".to_owned(), programs)),
    );
    let Seen::Stored {
        fit: Fit::Unfit { report, .. },
        ..
    } = &unfit
    else {
        panic!("{unfit:?}");
    };
    assert!(
        report.contains("the image cannot run the runner package")
            && report.contains("bin/Runner.Listener"),
        "{report}"
    );
    let finding = of(&reference.to_string(), &unfit);
    assert_eq!(finding.status, Status::Fail);
    assert!(finding.what.contains(report.as_str()), "{}", finding.what);

    // Not stored, and a layer blob altered: unreadable, naming the blob.
    let other = tmp.path().join("other");
    write_layout(&other, "ci", &[("etc/release", b"two\n")]);
    let blobs = other.join("blobs/sha256");
    let gzip = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read(p).unwrap().starts_with(&[0x1f, 0x8b]))
        .unwrap();
    let mut bytes = std::fs::read(&gzip).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&gzip, &bytes).unwrap();
    let other_ref = ImageRef::parse(&format!("oci:{}:ci", other.display())).unwrap();
    match examine_local(&other_ref, &store, &package) {
        Seen::Unreadable(why) => assert!(
            why.contains(&gzip.file_name().unwrap().to_string_lossy().to_string()),
            "{why}"
        ),
        seen => panic!("{seen:?}"),
    }
    let untagged = ImageRef::parse(&format!("oci:{}:nosuchtag", layout.display())).unwrap();
    assert!(matches!(
        examine_local(&untagged, &store, &package),
        Seen::Unreadable(_)
    ));
}

/// A stored entry is the store's only when its config is the id's and its root a directory.
#[test]
fn a_stored_entry_is_recognised_only_when_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let config = br#"{"os":"linux"}"#;
    let id = Digest::of(config);
    let entry = tmp.path().join(id.hex());
    assert_eq!(stored_rootfs(tmp.path(), &id), None);
    std::fs::create_dir_all(&entry).unwrap();
    std::fs::write(entry.join("config.json"), config).unwrap();
    std::fs::write(
        entry.join("unpack.json"),
        serde_json::to_vec(&rm_image::unpack::UnpackReport::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(stored_rootfs(tmp.path(), &id), None, "no rootfs");
    std::fs::write(entry.join("rootfs"), "a file").unwrap();
    assert_eq!(
        stored_rootfs(tmp.path(), &id),
        None,
        "rootfs not a directory"
    );
    std::fs::remove_file(entry.join("rootfs")).unwrap();
    std::fs::create_dir(entry.join("rootfs")).unwrap();
    assert_eq!(stored_rootfs(tmp.path(), &id), Some(entry.join("rootfs")));
    std::fs::write(entry.join("config.json"), br#"{"os":"other"}"#).unwrap();
    assert_eq!(stored_rootfs(tmp.path(), &id), None, "config not the id's");
}

/// Through `check`'s own entry: one finding per policy with an image, named by policy; a
/// registry on a loopback port nothing listens on is a warning, not a failure.
#[tokio::test]
async fn each_policy_with_an_image_has_its_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    write_layout(&layout, "ci", &[("etc/release", b"one\n")]);
    let package = tmp.path().join("runner");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let config = crate::config::from_text(&format!(
        "data_dir = \"{}\"\n\n[runner]\npackage_dir = \"{}\"\n\n\
         [[policy]]\nname = \"plain\"\ntarget = \"acme\"\nlabels = [\"plain\"]\n\n\
         [[policy]]\nname = \"ci\"\ntarget = \"acme\"\nlabels = [\"ci\"]\nimage = \"oci:{}:ci\"\n\n\
         [[policy]]\nname = \"hub\"\ntarget = \"acme\"\nlabels = [\"hub\"]\nimage = \"docker://127.0.0.1:{port}/acme/ci:1\"\n",
        tmp.path().join("data").display(),
        package.display(),
        layout.display(),
    ))
    .unwrap();
    let found = images(&config).await;
    let summary: Vec<(Option<&str>, Status)> = found
        .iter()
        .map(|f| (f.policy.as_deref(), f.status))
        .collect();
    assert_eq!(
        summary,
        [(Some("ci"), Status::Ok), (Some("hub"), Status::Warn)],
        "{found:?}"
    );
    assert!(found[0].what.contains("reads and verifies"), "{found:?}");
    assert!(
        found[1].what.contains("cannot resolve its tag"),
        "{found:?}"
    );
}
