use super::*;

const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn pin() -> Digest {
    Digest::parse(&format!("sha256:{HEX}")).expect("a digest")
}

#[test]
fn a_digest_is_sha256_lower_hex_only() {
    let ok = format!("sha256:{HEX}");
    assert_eq!(Digest::parse(&ok).expect("valid").to_string(), ok);
    assert_eq!(Digest::parse(&ok).expect("valid").hex(), HEX);
    let refused = [
        String::new(),
        HEX.to_owned(),
        format!("sha512:{HEX}"),
        format!("sha256:{}", HEX.to_uppercase()),
        format!("sha256:{}", &HEX[1..]),
        format!("sha256:{HEX}0"),
        format!("sha256:{}g", &HEX[1..]),
        format!("SHA256:{HEX}"),
        format!(" sha256:{HEX}"),
    ];
    for text in refused {
        assert_eq!(
            Digest::parse(&text),
            Err(RefError::Digest(text.clone())),
            "{text:?}"
        );
    }
}

#[test]
fn a_digest_of_bytes_is_their_sha256() {
    // sha256("") and sha256("abc"), from FIPS 180-2's examples.
    assert_eq!(
        Digest::of(b"").to_string(),
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        Digest::of(b"abc").hex(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn a_digest_round_trips_through_serde_as_its_text() {
    let json = serde_json::to_string(&pin()).expect("serialises");
    assert_eq!(json, format!("\"sha256:{HEX}\""));
    let back: Digest = serde_json::from_str(&json).expect("deserialises");
    assert_eq!(back, pin());
    assert!(serde_json::from_str::<Digest>("\"sha256:00\"").is_err());
}

fn oci(dir: &str, tag: Option<&str>) -> Transport {
    Transport::OciLayout {
        dir: dir.into(),
        tag: tag.map(str::to_owned),
    }
}

fn registry(registry: &str, repository: &str, tag: Option<&str>) -> Transport {
    Transport::Registry {
        registry: registry.to_owned(),
        repository: repository.to_owned(),
        tag: tag.map(str::to_owned),
    }
}

/// Each accepted form, what it parses to, and its canonical text.
#[test]
fn references_parse_to_their_transport_and_print_canonically() {
    let at = format!("@sha256:{HEX}");
    let cases: Vec<(String, Transport, bool, String)> = vec![
        (
            "oci:/srv/img".into(),
            oci("/srv/img", None),
            false,
            "oci:/srv/img".into(),
        ),
        (
            "oci:/srv/img:v1.2_3-x".into(),
            oci("/srv/img", Some("v1.2_3-x")),
            false,
            "oci:/srv/img:v1.2_3-x".into(),
        ),
        (
            format!("oci:/srv/img:v1{at}"),
            oci("/srv/img", Some("v1")),
            true,
            format!("oci:/srv/img:v1{at}"),
        ),
        (
            format!("oci:/srv/img{at}"),
            oci("/srv/img", None),
            true,
            format!("oci:/srv/img{at}"),
        ),
        (
            // An '@' inside a path is part of the path.
            "oci:/srv/a@b/img".into(),
            oci("/srv/a@b/img", None),
            false,
            "oci:/srv/a@b/img".into(),
        ),
        (
            "oci-archive:/srv/img.tar:stable".into(),
            Transport::OciArchive {
                file: "/srv/img.tar".into(),
                tag: Some("stable".into()),
            },
            false,
            "oci-archive:/srv/img.tar:stable".into(),
        ),
        (
            "docker-archive:/srv/img.tar".into(),
            Transport::DockerArchive {
                file: "/srv/img.tar".into(),
                name: None,
            },
            false,
            "docker-archive:/srv/img.tar".into(),
        ),
        (
            // Docker's normalisation, as `docker save busybox` names the image.
            "docker-archive:/srv/img.tar:busybox".into(),
            Transport::DockerArchive {
                file: "/srv/img.tar".into(),
                name: Some("docker.io/library/busybox:latest".into()),
            },
            false,
            "docker-archive:/srv/img.tar:docker.io/library/busybox:latest".into(),
        ),
        (
            format!("docker-archive:/srv/img.tar:localhost:5000/team/ci:2{at}"),
            Transport::DockerArchive {
                file: "/srv/img.tar".into(),
                name: Some("localhost:5000/team/ci:2".into()),
            },
            true,
            format!("docker-archive:/srv/img.tar:localhost:5000/team/ci:2{at}"),
        ),
        (
            "docker://busybox".into(),
            registry("docker.io", "library/busybox", Some("latest")),
            false,
            "docker://docker.io/library/busybox:latest".into(),
        ),
        (
            "docker://index.docker.io/team/ci:1.0".into(),
            registry("docker.io", "team/ci", Some("1.0")),
            false,
            "docker://docker.io/team/ci:1.0".into(),
        ),
        (
            // Pinned without a tag: no tag is invented.
            format!("docker://ubuntu{at}"),
            registry("docker.io", "library/ubuntu", None),
            true,
            format!("docker://docker.io/library/ubuntu{at}"),
        ),
        (
            "docker://ghcr.io/actions/actions-runner:2.330.0".into(),
            registry("ghcr.io", "actions/actions-runner", Some("2.330.0")),
            false,
            "docker://ghcr.io/actions/actions-runner:2.330.0".into(),
        ),
        (
            // The port is not a tag.
            "docker://localhost:5000/img".into(),
            registry("localhost:5000", "img", Some("latest")),
            false,
            "docker://localhost:5000/img:latest".into(),
        ),
        (
            "docker://registry.example:443/a/b-c__d.e/f".into(),
            registry("registry.example:443", "a/b-c__d.e/f", Some("latest")),
            false,
            "docker://registry.example:443/a/b-c__d.e/f:latest".into(),
        ),
        (
            // Not a registry (no '.', ':' or localhost): a Docker Hub namespace.
            "docker://team/img:x".into(),
            registry("docker.io", "team/img", Some("x")),
            false,
            "docker://docker.io/team/img:x".into(),
        ),
    ];
    for (text, transport, pinned, canonical) in cases {
        let parsed = ImageRef::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(parsed.transport, transport, "{text}");
        assert_eq!(parsed.pin, pinned.then(pin), "{text}");
        assert_eq!(parsed.to_string(), canonical, "{text}");
        assert_eq!(
            ImageRef::parse(&canonical).as_ref(),
            Ok(&parsed),
            "{canonical} round-trips"
        );
        assert_eq!(parsed.is_local(), !text.starts_with("docker://"));
    }
}

#[test]
fn malformed_references_are_refused_with_the_reason() {
    let cases: Vec<(String, RefError)> = vec![
        ("/srv/img".into(), RefError::Transport("/srv/img".into())),
        ("ocı:/x".into(), RefError::Transport("ocı:/x".into())),
        ("dir:/x".into(), RefError::Transport("dir:/x".into())),
        (
            "oci:srv/img".into(),
            RefError::RelativePath("srv/img".into()),
        ),
        ("oci:".into(), RefError::RelativePath(String::new())),
        (
            "oci-archive:img.tar".into(),
            RefError::RelativePath("img.tar".into()),
        ),
        (
            "docker-archive:./i.tar:x".into(),
            RefError::RelativePath("./i.tar".into()),
        ),
        ("oci:/x:".into(), RefError::Tag(String::new())),
        ("oci:/x:.hidden".into(), RefError::Tag(".hidden".into())),
        ("oci:/x:a b".into(), RefError::Tag("a b".into())),
        (
            format!("oci:/x:{}", "t".repeat(129)),
            RefError::Tag("t".repeat(129)),
        ),
        (
            "oci:/x@sha256:00".into(),
            RefError::Digest("sha256:00".into()),
        ),
        (
            format!("oci:/x@sha512:{HEX}"),
            RefError::Digest(format!("sha512:{HEX}")),
        ),
        ("docker://Busybox".into(), RefError::Name("Busybox".into())),
        ("docker://".into(), RefError::Name(String::new())),
        ("docker://a//b".into(), RefError::Name("a//b".into())),
        ("docker://a/-b".into(), RefError::Name("a/-b".into())),
        ("docker://a/b___c".into(), RefError::Name("a/b___c".into())),
        ("docker://a/b..c".into(), RefError::Name("a/b..c".into())),
        (
            "docker://host.example/".into(),
            RefError::Name("host.example/".into()),
        ),
        (
            "docker://host_x.example/a".into(),
            RefError::Registry("host_x.example".into()),
        ),
        (
            "docker://host.example:port/a".into(),
            RefError::Registry("host.example:port".into()),
        ),
        (
            "docker://host.example:99999999/a".into(),
            RefError::Registry("host.example:99999999".into()),
        ),
        (
            "docker-archive:/i.tar:UPPER".into(),
            RefError::Name("UPPER".into()),
        ),
    ];
    for (text, error) in cases {
        assert_eq!(ImageRef::parse(&text), Err(error), "{text}");
    }
}

#[test]
fn an_image_ref_round_trips_through_serde_as_its_text() {
    let text = format!("oci-archive:/srv/i.tar:v1@sha256:{HEX}");
    let parsed: ImageRef = serde_json::from_str(&format!("\"{text}\"")).expect("deserialises");
    assert_eq!(
        serde_json::to_string(&parsed).expect("serialises"),
        format!("\"{text}\"")
    );
    assert!(serde_json::from_str::<ImageRef>("\"oci:relative\"").is_err());
}
