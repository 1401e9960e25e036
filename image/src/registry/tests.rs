//! The registry client's tests: its pure rules as tables; the token flow, a corrupted blob, a
//! redirect to another host and the mirror against the in-process fake (`fake`); and pushes
//! and pulls against Docker's own registry (`real`).

mod fake;
mod image;
mod real;

use http::Uri;
use secrecy::SecretString;

use super::auth::{self, Challenge};
use super::client::{self, Endpoint};
use super::manifest::{self, Descriptor, Manifest, Platform};
use super::*;
use fake::{Fake, FakeAuth, FakeConfig, TOKEN};

// ---------------------------------------------------------------- pure rules

#[test]
fn challenges_are_read_as_the_token_spec_writes_them() {
    let bearer = |realm: &str, service: Option<&str>, scope: Option<&str>| {
        Some(Challenge::Bearer {
            realm: realm.to_owned(),
            service: service.map(str::to_owned),
            scope: scope.map(str::to_owned),
        })
    };
    let cases: &[(&str, Option<Challenge>)] = &[
        (
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
            bearer(
                "https://auth.docker.io/token",
                Some("registry.docker.io"),
                Some("repository:library/debian:pull"),
            ),
        ),
        // A comma inside a quoted scope, spaces, an unquoted token, a case-folded scheme.
        (
            r#"bearer realm = "https://r.example/t" , scope="repository:a/b:pull,push", service=reg"#,
            bearer(
                "https://r.example/t",
                Some("reg"),
                Some("repository:a/b:pull,push"),
            ),
        ),
        // An escaped quote.
        (
            r#"Bearer realm="https://r.example/t\"x""#,
            bearer("https://r.example/t\"x", None, None),
        ),
        (r#"Basic realm="basic-realm""#, Some(Challenge::Basic)),
        ("Basic", Some(Challenge::Basic)),
        // Bearer is preferred when both are offered.
        (
            r#"Basic realm="x", Bearer realm="https://r.example/t""#,
            bearer("https://r.example/t", None, None),
        ),
        // A Bearer without a realm cannot be answered: Basic, or nothing.
        (r#"Bearer service="x""#, None),
        ("Negotiate abc", None),
        (r#"Bearer realm="unterminated"#, None),
        ("", None),
    ];
    for (header, want) in cases {
        assert_eq!(&auth::parse_challenge(header), want, "{header}");
    }
}

#[test]
fn token_urls_carry_service_and_scope_encoded() {
    let cases = [
        (
            (
                "https://auth.docker.io/token",
                Some("registry.docker.io"),
                Some("repository:library/debian:pull"),
            ),
            "https://auth.docker.io/token?service=registry.docker.io&scope=repository%3Alibrary%2Fdebian%3Apull",
        ),
        // No scope in the challenge: this repository's pull scope.
        (
            ("https://r.example/t?x=1", None, None),
            "https://r.example/t?x=1&scope=repository%3Aacme%2Fimg%3Apull",
        ),
    ];
    for ((realm, service, scope), want) in cases {
        assert_eq!(auth::token_url(realm, service, scope, "acme/img"), want);
    }
}

#[test]
fn token_answers_give_token_or_access_token() {
    use secrecy::ExposeSecret as _;
    let read = |body: &str| auth::read_token(body.as_bytes()).map(|t| t.expose_secret().to_owned());
    assert_eq!(
        read(r#"{"token":"a","access_token":"b"}"#),
        Ok("a".to_owned())
    );
    assert_eq!(read(r#"{"access_token":"b"}"#), Ok("b".to_owned()));
    assert_eq!(
        read(r#"{"token":"","access_token":"b"}"#),
        Ok("b".to_owned())
    );
    assert!(read(r#"{"expires_in":3}"#).is_err());
    let err = read("not json with secret-stuff").expect_err("refused");
    assert!(!err.contains("secret"), "{err}");
}

#[test]
fn plain_http_only_to_loopback_or_the_named_mirror() {
    let cases = [
        ("https://registry.example/v2/", None, true),
        ("http://registry.example/v2/", None, false),
        ("http://127.0.0.1:5000/v2/", None, true),
        ("http://127.8.9.1:5000/v2/", None, true),
        ("http://[::1]:5000/v2/", None, true),
        ("http://localhost:5000/v2/", None, true),
        ("http://LOCALHOST/v2/", None, true),
        ("http://10.0.0.1/v2/", None, false),
        ("http://mirror.lan:5000/v2/", Some("mirror.lan"), true),
        ("http://other.lan:5000/v2/", Some("mirror.lan"), false),
        ("ftp://127.0.0.1/x", None, false),
    ];
    for (url, plain, want) in cases {
        let uri: Uri = url.parse().expect("uri");
        assert_eq!(
            auth::scheme_allowed(&uri, plain),
            want,
            "{url} with {plain:?}"
        );
    }
}

#[test]
fn redirect_locations_resolve_against_the_answering_url() {
    let base: Uri = "https://reg.example:5000/v2/a/blobs/x"
        .parse()
        .expect("uri");
    let cases = [
        (
            "https://cdn.example/b?sig=1",
            Some("https://cdn.example/b?sig=1"),
        ),
        ("//cdn.example/b", Some("https://cdn.example/b")),
        ("/other/path", Some("https://reg.example:5000/other/path")),
        ("relative/path", None),
    ];
    for (location, want) in cases {
        let got = client::resolve_location(&base, location).map(|u| u.to_string());
        assert_eq!(got.as_deref(), want, "{location}");
    }
}

#[test]
fn error_bodies_give_their_codes_only() {
    let cases = [
        (
            r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}}]}"#,
            " (MANIFEST_UNKNOWN)",
        ),
        (
            r#"{"errors":[{"code":"DENIED","message":"x"},{"code":"UNAUTHORIZED <script>"}]}"#,
            " (DENIED, UNAUTHORIZEDscript)",
        ),
        ("<html>oops</html>", ""),
        (r#"{"errors":[]}"#, ""),
    ];
    for (body, want) in cases {
        assert_eq!(client::error_codes(body.as_bytes()), want, "{body}");
    }
}

fn desc(arch: &str, variant: Option<&str>, n: u8) -> Descriptor {
    Descriptor {
        media_type: manifest::OCI_MANIFEST.to_owned(),
        digest: Digest::of(&[n]),
        size: 1,
        platform: Some(Platform {
            os: "linux".to_owned(),
            architecture: arch.to_owned(),
            variant: variant.map(str::to_owned),
        }),
    }
}

#[test]
fn the_platform_entry_is_linux_on_this_arch_preferring_the_variant() {
    let mut windows = desc("amd64", None, 9);
    if let Some(p) = windows.platform.as_mut() {
        p.os = "windows".to_owned();
    }
    let mut attestation = desc("unknown", None, 8);
    if let Some(p) = attestation.platform.as_mut() {
        p.os = "unknown".to_owned();
    }
    let index = vec![
        windows,
        attestation,
        desc("arm", Some("v6"), 1),
        desc("arm", Some("v7"), 2),
        desc("arm64", None, 3),
        desc("arm64", Some("v8"), 4),
        desc("amd64", None, 5),
    ];
    let cases = [
        ("amd64", None, Some(5u8)),
        ("arm64", Some("v8"), Some(4)),
        ("arm", Some("v7"), Some(2)),
        ("arm", Some("v5"), Some(1)),
        ("riscv64", None, None),
    ];
    for (arch, variant, want) in cases {
        let got = manifest::pick_platform(&index, arch, variant).map(|d| d.digest);
        assert_eq!(got, want.map(|n| Digest::of(&[n])), "{arch} {variant:?}");
    }
    assert_eq!(
        manifest::platforms(&index[2..4]),
        vec!["linux/arm/v6".to_owned(), "linux/arm/v7".to_owned()]
    );
    assert_eq!(manifest::oci_arch("x86_64"), ("amd64", None));
    assert_eq!(manifest::oci_arch("aarch64"), ("arm64", Some("v8")));
}

#[test]
fn manifests_are_read_by_their_media_type_or_shape() {
    let d = format!(
        r#"{{"mediaType":"x","digest":"{}","size":1}}"#,
        Digest::of(b"c")
    );
    let image_body =
        |mt: &str| format!(r#"{{"schemaVersion":2,{mt}"config":{d},"layers":[{d},{d}]}}"#);
    let index_body = |mt: &str| format!(r#"{{"schemaVersion":2,{mt}"manifests":[{d}]}}"#);
    let is_image = |r: Result<Manifest, String>, want_mt: &str| match r {
        Ok(Manifest::Image {
            media_type, layers, ..
        }) => media_type == want_mt && layers.len() == 2,
        _ => false,
    };
    let is_index = |r: Result<Manifest, String>, want_mt: &str| matches!(r, Ok(Manifest::Index { media_type, .. }) if media_type == want_mt);
    let oci_mt = format!(r#""mediaType":"{}","#, manifest::OCI_MANIFEST);
    let docker_mt = format!(r#""mediaType":"{}","#, manifest::DOCKER_MANIFEST);
    let list_mt = format!(r#""mediaType":"{}","#, manifest::DOCKER_LIST);
    assert!(is_image(
        manifest::parse(image_body(&oci_mt).as_bytes(), None),
        manifest::OCI_MANIFEST
    ));
    assert!(is_image(
        manifest::parse(image_body(&docker_mt).as_bytes(), None),
        manifest::DOCKER_MANIFEST
    ));
    // No mediaType in the body: the header's, else the OCI kind its shape says.
    assert!(is_image(
        manifest::parse(
            image_body("").as_bytes(),
            Some(&format!("{}; charset=utf-8", manifest::DOCKER_MANIFEST))
        ),
        manifest::DOCKER_MANIFEST
    ));
    assert!(is_image(
        manifest::parse(image_body("").as_bytes(), Some("application/json")),
        manifest::OCI_MANIFEST
    ));
    assert!(is_index(
        manifest::parse(index_body(&list_mt).as_bytes(), None),
        manifest::DOCKER_LIST
    ));
    assert!(is_index(
        manifest::parse(index_body("").as_bytes(), None),
        manifest::OCI_INDEX
    ));

    let refused = [
        (r#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#.to_owned(), "schema 1"),
        (
            r#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v1+prettyjws"}"#.to_owned(),
            "schema 1",
        ),
        (image_body(r#""mediaType":"application/vnd.example+json","#), "not one this client reads"),
        // An index's media type on an image's shape.
        (image_body(&list_mt), "neither"),
        (r#"{"schemaVersion":2}"#.to_owned(), "neither"),
        (r#"{"schemaVersion":3,"manifests":[]}"#.to_owned(), "not 2"),
        ("{".to_owned(), "not valid"),
        (
            format!(
                r#"{{"schemaVersion":2,"config":{d},"layers":[{}]}}"#,
                vec![d.as_str(); manifest::MAX_LAYERS + 1].join(",")
            ),
            "layers, more than",
        ),
    ];
    for (body, want) in refused {
        let err = manifest::parse(body.as_bytes(), None).expect_err(&body[..body.len().min(80)]);
        assert!(err.contains(want), "{err:?} should say {want:?}");
    }
}

#[test]
fn names_tags_and_references_are_checked_before_they_reach_a_url() {
    for good in ["acme/img", "library/debian", "a", "a-b/c__d/e.f", "x9/y_z"] {
        assert!(check_repository(good).is_ok(), "{good}");
    }
    for bad in [
        "", "Acme/img", "a//b", "../etc", "a/..", "a/b?x", "a/b#c", "-a", "a-", "a___b", "a/%2e",
    ] {
        assert!(check_repository(bad).is_err(), "{bad}");
    }
    for good in ["latest", "v1.2.3", "_x", "A-b.c_d"] {
        assert!(check_tag(good).is_ok(), "{good}");
    }
    let long = "a".repeat(MAX_TAG_LEN + 1);
    for bad in ["", ".x", "-x", "a/b", "a:b", long.as_str()] {
        assert!(check_tag(bad).is_err(), "{bad}");
    }
    let digest = Digest::of(b"x");
    assert_eq!(
        parse_reference(&digest.to_string()).expect("digest"),
        Reference::Digest(digest)
    );
    assert_eq!(
        parse_reference("v1").expect("tag"),
        Reference::Tag("v1".to_owned())
    );
    assert!(parse_reference("sha512:abcd").is_err());
    assert!(parse_reference("sha256:ABCD").is_err());
}

fn registry_with(mirror: Option<&str>, credentials: Option<Credentials>) -> Registry {
    Registry::new(RegistryOptions {
        mirror: mirror.map(|m| m.parse().expect("mirror uri")),
        credentials,
    })
    .expect("registry client")
}

#[test]
fn endpoints_put_the_mirror_first_for_docker_hub_only() {
    let plain = registry_with(None, None);
    let mirrored = registry_with(Some("http://mirror.lan:5000/prefix/"), None);
    let bases = |r: &Registry, name: &str| {
        r.endpoints(name)
            .map(|eps| eps.iter().map(|e| e.base.clone()).collect::<Vec<_>>())
            .map_err(|e| e.to_string())
    };
    let hub = "https://registry-1.docker.io".to_owned();
    assert_eq!(bases(&plain, "docker.io"), Ok(vec![hub.clone()]));
    assert_eq!(
        bases(&mirrored, "docker.io"),
        Ok(vec![
            "http://mirror.lan:5000/prefix".to_owned(),
            hub.clone()
        ])
    );
    assert_eq!(
        bases(&mirrored, "index.docker.io"),
        Ok(vec!["http://mirror.lan:5000/prefix".to_owned(), hub])
    );
    assert_eq!(
        bases(&mirrored, "ghcr.io"),
        Ok(vec!["https://ghcr.io".to_owned()])
    );
    assert_eq!(
        bases(&plain, "127.0.0.1:5000"),
        Ok(vec!["http://127.0.0.1:5000".to_owned()])
    );
    assert_eq!(
        bases(&plain, "localhost:5000"),
        Ok(vec!["http://localhost:5000".to_owned()])
    );
    assert_eq!(
        bases(&plain, "[::1]:5000"),
        Ok(vec!["http://[::1]:5000".to_owned()])
    );
    assert_eq!(
        bases(&plain, "registry.lan:5000"),
        Ok(vec!["https://registry.lan:5000".to_owned()])
    );
    for bad in ["", "user:pw@host", "host/path", "a b"] {
        assert!(bases(&plain, bad).is_err(), "{bad:?}");
    }
    let ep = mirrored.endpoints("docker.io").expect("endpoints");
    assert_eq!(ep[0].plain_host.as_deref(), Some("mirror.lan"));
    for bad in [
        "ftp://m.lan",
        "http://m.lan/?q=1",
        "http://u:p@m.lan",
        "/relative",
    ] {
        let options = RegistryOptions {
            mirror: Some(bad.parse().expect("uri")),
            credentials: None,
        };
        assert!(Registry::new(options).is_err(), "{bad}");
    }
}

#[test]
fn only_a_remote_failure_of_the_mirror_moves_on_to_the_next_endpoint() {
    let ep = Endpoint {
        name: "m".to_owned(),
        base: "http://127.0.0.1:1".to_owned(),
        plain_host: None,
    };
    let remote = || RegistryError::Status {
        registry: "m".to_owned(),
        what: "x".to_owned(),
        status: 503,
        codes: String::new(),
    };
    let local = || RegistryError::Io {
        path: "/x".into(),
        source: std::io::Error::other("disk full"),
    };
    let invalid = || RegistryError::Invalid {
        detail: "bad".to_owned(),
    };
    let cases: [(RegistryError, usize, usize, bool); 5] = [
        (remote(), 0, 2, true),
        (remote(), 1, 2, false),
        (remote(), 0, 1, false),
        (local(), 0, 2, false),
        (invalid(), 0, 2, false),
    ];
    for (e, i, count, moves_on) in cases {
        let text = e.to_string();
        assert_eq!(
            next_endpoint(e, &ep, i, count, None).is_ok(),
            moves_on,
            "{text} at {i}/{count}"
        );
    }
    // The registry failing after its mirror: the error that stops says both.
    let unreachable = |registry: &str| RegistryError::Unreachable {
        registry: registry.to_owned(),
        detail: "connection refused".to_owned(),
    };
    let both = next_endpoint(
        unreachable("docker.io"),
        &ep,
        1,
        2,
        Some(unreachable("the mirror http://127.0.0.1:1")),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        both,
        "cannot reach docker.io: connection refused; before it, cannot reach the mirror http://127.0.0.1:1: connection refused"
    );
}

/// The agent runs downloads in spawned tasks: the futures must be `Send`, the client shared.
#[test]
fn the_client_and_its_futures_can_cross_threads() {
    fn send<T: Send>(_: &T) {}
    fn shared<T: Send + Sync>() {}
    shared::<Registry>();
    let registry = registry_with(None, None);
    let dir = std::path::PathBuf::from("/nonexistent");
    send(&registry.download("r.example", "a/b", "t", &dir));
    send(&registry.resolve("r.example", "a/b", "t"));
}

#[test]
fn index_json_names_the_manifest_and_its_tag() {
    let digest = Digest::of(b"m");
    let by_tag: serde_json::Value = serde_json::from_slice(&index_json(
        manifest::DOCKER_MANIFEST,
        &digest,
        7,
        &Reference::Tag("v1".to_owned()),
    ))
    .expect("json");
    assert_eq!(
        by_tag,
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": manifest::OCI_INDEX,
            "manifests": [{
                "mediaType": manifest::DOCKER_MANIFEST,
                "digest": digest.to_string(),
                "size": 7,
                "annotations": { "org.opencontainers.image.ref.name": "v1" },
            }],
        })
    );
    let by_digest: serde_json::Value = serde_json::from_slice(&index_json(
        manifest::OCI_MANIFEST,
        &digest,
        7,
        &Reference::Digest(digest),
    ))
    .expect("json");
    assert!(by_digest["manifests"][0].get("annotations").is_none());
}

// ---------------------------------------------------------------- against the fake

const PASSWORD: &str = "pa55-w0rd-never-shown";

fn credentials(user: &str, password: &str) -> Option<Credentials> {
    Some(Credentials {
        user: user.to_owned(),
        password: SecretString::from(password.to_owned()),
    })
}

/// What an error says, checked free of every secret the tests use.
fn clean_message(e: &RegistryError) -> String {
    let text = format!("{e} / {e:?}");
    for secret in [PASSWORD, "wrong-password", TOKEN] {
        assert!(!text.contains(secret), "a secret in the error: {text}");
    }
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_flow_gets_one_token_and_sends_it_to_the_registry_only() {
    let images = image::multi_arch("token flow");
    for creds in [None, Some(("alice", PASSWORD))] {
        let fake = Fake::start(
            FakeConfig {
                auth: FakeAuth::Bearer {
                    creds: creds.map(|(u, p)| (u.to_owned(), p.to_owned())),
                },
                redirect_blobs: true,
                ..FakeConfig::default()
            },
            &images,
            "t",
        )
        .await;
        let registry = registry_with(None, creds.and_then(|(u, p)| credentials(u, p)));
        let resolved = registry
            .resolve(&fake.registry(), "acme/img", "t")
            .await
            .expect("resolve");
        assert_eq!(resolved, images.index.digest(), "the tag names the index");
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = registry
            .download(&fake.registry(), "acme/img", "t", dir.path())
            .await
            .expect("download");
        assert_eq!(manifest, images.ours.manifest.digest());
        image::assert_layout(dir.path(), &images.ours);
        // The other platform's blobs were not fetched.
        for blob in images.other.blobs() {
            assert!(
                !dir.path()
                    .join("blobs/sha256")
                    .join(blob.digest().hex())
                    .exists()
            );
        }

        let log = fake.log();
        let tokens: Vec<_> = log
            .iter()
            .filter(|l| l.path.starts_with("/token"))
            .collect();
        assert_eq!(
            tokens.len(),
            1,
            "one token, kept for every later request: {log:#?}"
        );
        assert!(
            tokens[0].path.contains("service=fake")
                && tokens[0]
                    .path
                    .contains("scope=repository%3Aacme%2Fimg%3Apull"),
            "{:?}",
            tokens[0].path
        );
        match creds {
            None => assert_eq!(tokens[0].authorization, None, "anonymous"),
            Some(_) => assert!(
                tokens[0]
                    .authorization
                    .as_deref()
                    .is_some_and(|a| a.starts_with("Basic ")),
                "the credentials go to the realm"
            ),
        }
        let bearer = format!("Bearer {TOKEN}");
        for l in &log {
            if l.path.starts_with("/cdn/") {
                assert_eq!(
                    l.authorization, None,
                    "no Authorization off the registry's host"
                );
            } else if l.path.starts_with("/v2/") && l.authorization.is_some() {
                assert_eq!(l.authorization.as_deref(), Some(bearer.as_str()), "{l:?}");
            }
        }
        assert_eq!(
            log.iter().filter(|l| l.path.starts_with("/cdn/")).count(),
            images.ours.blobs().len(),
            "each blob came through the redirect"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_schema2_lists_and_manifests_download_like_oci_ones() {
    let images = image::multi_arch_as(image::Flavour::Docker, "docker types");
    let fake = Fake::start(FakeConfig::default(), &images, "t").await;
    let registry = registry_with(None, None);
    let dir = tempfile::tempdir().expect("tempdir");
    let digest = registry
        .download(&fake.registry(), "acme/img", "t", dir.path())
        .await
        .expect("download");
    assert_eq!(digest, images.ours.manifest.digest());
    image::assert_layout(dir.path(), &images.ours);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).expect("index.json"))
            .expect("json");
    assert_eq!(
        index["manifests"][0]["mediaType"],
        manifest::DOCKER_MANIFEST
    );
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        "t"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_or_missing_credentials_are_refused_clearly_without_secrets() {
    let images = image::multi_arch("refused");
    let bearer = Fake::start(
        FakeConfig {
            auth: FakeAuth::Bearer {
                creds: Some(("alice".to_owned(), PASSWORD.to_owned())),
            },
            ..FakeConfig::default()
        },
        &images,
        "t",
    )
    .await;
    let basic = Fake::start(
        FakeConfig {
            auth: FakeAuth::Basic {
                user: "alice".to_owned(),
                password: PASSWORD.to_owned(),
            },
            ..FakeConfig::default()
        },
        &images,
        "t",
    )
    .await;
    let wrong = registry_with(None, credentials("alice", "wrong-password"));
    let none = registry_with(None, None);
    let right = registry_with(None, credentials("alice", PASSWORD));
    let dir = tempfile::tempdir().expect("tempdir");

    let e = wrong
        .download(&bearer.registry(), "acme/img", "t", dir.path())
        .await
        .expect_err("wrong credentials");
    let text = clean_message(&e);
    assert!(matches!(e, RegistryError::Unauthorized { .. }), "{text}");
    assert!(
        text.contains("\"alice\"") && text.contains("refused the credentials"),
        "{text}"
    );

    let e = none
        .resolve(&bearer.registry(), "acme/img", "t")
        .await
        .expect_err("anonymous");
    let text = clean_message(&e);
    assert!(text.contains("refused an anonymous token"), "{text}");

    let e = wrong
        .resolve(&basic.registry(), "acme/img", "t")
        .await
        .expect_err("wrong basic");
    let text = clean_message(&e);
    assert!(matches!(e, RegistryError::Unauthorized { .. }), "{text}");
    assert!(text.contains("\"alice\""), "{text}");

    let e = none
        .resolve(&basic.registry(), "acme/img", "t")
        .await
        .expect_err("no basic");
    let text = clean_message(&e);
    assert!(
        text.contains("asks for credentials and none were given"),
        "{text}"
    );

    let digest = right
        .resolve(&basic.registry(), "acme/img", "t")
        .await
        .expect("right basic credentials");
    assert_eq!(digest, images.index.digest());
    assert!(!dir.path().join("index.json").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_with_a_flipped_byte_is_refused_and_not_kept() {
    let images = image::multi_arch("flipped");
    let layer = images.ours.layers[1].digest();
    let fake = Fake::start(
        FakeConfig {
            flip: Some(layer.to_string()),
            ..FakeConfig::default()
        },
        &images,
        "t",
    )
    .await;
    let registry = registry_with(None, None);
    let dir = tempfile::tempdir().expect("tempdir");
    let e = registry
        .download(&fake.registry(), "acme/img", "t", dir.path())
        .await
        .expect_err("a corrupted layer");
    let text = clean_message(&e);
    assert!(
        matches!(&e, RegistryError::DigestMismatch { expected, .. } if *expected == layer.to_string()),
        "{text}"
    );
    assert!(text.contains(&format!("blob {layer}")), "{text}");
    assert!(
        !dir.path().join("blobs/sha256").join(layer.hex()).exists(),
        "not kept"
    );
    assert!(
        !dir.path().join("index.json").exists(),
        "the layout is not complete"
    );
    image::assert_no_partials(dir.path());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_that_is_not_what_the_registry_says_is_refused() {
    let images = image::multi_arch("lying");
    let fake = Fake::start(FakeConfig::default(), &images, "t").await;
    // The tag answers another manifest than the digest the client asks for.
    fake.tag(
        &images.ours.manifest.digest().to_string(),
        images.other.manifest.clone(),
    );
    let registry = registry_with(None, None);
    let dir = tempfile::tempdir().expect("tempdir");
    let e = registry
        .download(
            &fake.registry(),
            "acme/img",
            &images.ours.manifest.digest().to_string(),
            dir.path(),
        )
        .await
        .expect_err("a manifest under the wrong digest");
    assert!(matches!(e, RegistryError::DigestMismatch { .. }), "{e}");

    // A manifest larger than the bound is refused before it is read whole.
    fake.tag(
        "huge",
        image::Blob {
            media_type: manifest::OCI_MANIFEST,
            bytes: vec![b' '; usize::try_from(MAX_MANIFEST_BYTES).expect("usize") + 1],
        },
    );
    let e = registry
        .download(&fake.registry(), "acme/img", "huge", dir.path())
        .await
        .expect_err("too large");
    assert!(matches!(e, RegistryError::TooLarge { .. }), "{e}");

    let e = registry
        .download(&fake.registry(), "acme/img", "absent", dir.path())
        .await
        .expect_err("absent");
    assert!(matches!(e, RegistryError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("acme/img:absent"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resolve_hashes_the_manifest_when_the_registry_names_no_digest() {
    let images = image::multi_arch("no header");
    let fake = Fake::start(
        FakeConfig {
            no_digest_header: true,
            ..FakeConfig::default()
        },
        &images,
        "t",
    )
    .await;
    let registry = registry_with(None, None);
    let digest = registry
        .resolve(&fake.registry(), "acme/img", "t")
        .await
        .expect("resolve");
    assert_eq!(digest, images.index.digest());
    let methods: Vec<_> = fake.log().iter().map(|l| l.method.clone()).collect();
    assert_eq!(methods, ["HEAD", "GET"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_resumes_and_a_second_one_fetches_nothing() {
    let images = image::multi_arch("resume");
    let fake = Fake::start(FakeConfig::default(), &images, "t").await;
    let registry = registry_with(None, None);
    let dir = tempfile::tempdir().expect("tempdir");
    let blobs = dir.path().join("blobs/sha256");
    // What a crash leaves: the config whole, a layer whose bytes are wrong, a partial file.
    std::fs::create_dir_all(&blobs).expect("blobs");
    let config = &images.ours.config;
    std::fs::write(blobs.join(config.digest().hex()), &config.bytes).expect("config");
    let first = &images.ours.layers[0];
    std::fs::write(blobs.join(first.digest().hex()), b"torn").expect("torn layer");
    std::fs::write(
        blobs.join(format!(".partial-{}-1-1", first.digest().hex())),
        b"x",
    )
    .expect("partial");

    registry
        .download(&fake.registry(), "acme/img", "t", dir.path())
        .await
        .expect("download");
    image::assert_layout(dir.path(), &images.ours);
    let fetched: Vec<String> = fake
        .log()
        .iter()
        .filter_map(|l| l.path.rsplit_once("/blobs/").map(|(_, d)| d.to_owned()))
        .collect();
    assert!(
        !fetched.contains(&config.digest().to_string()),
        "the config was kept"
    );
    assert!(
        fetched.contains(&first.digest().to_string()),
        "the torn layer was fetched again"
    );

    let before = registry.requests_sent();
    let again = registry
        .download(
            &fake.registry(),
            "acme/img",
            &images.index.digest().to_string(),
            dir.path(),
        )
        .await
        .expect("second download");
    assert_eq!(again, images.ours.manifest.digest());
    assert_eq!(
        registry.requests_sent(),
        before,
        "nothing fetched again by digest"
    );
    image::assert_layout(dir.path(), &images.ours);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mirror_serves_docker_hub_and_the_hub_is_asked_when_it_fails() {
    let images = image::multi_arch("mirror");
    let hub = Fake::start(FakeConfig::default(), &images, "t").await;
    let good_mirror = Fake::start(FakeConfig::default(), &images, "t").await;
    let down_mirror = Fake::start(
        FakeConfig {
            fail_all: Some(503),
            ..FakeConfig::default()
        },
        &images,
        "t",
    )
    .await;
    let lying_mirror = Fake::start(
        FakeConfig {
            flip: Some(images.ours.layers[0].digest().to_string()),
            ..FakeConfig::default()
        },
        &images,
        "t",
    )
    .await;
    let hub_endpoint = Endpoint {
        name: DOCKER_HUB.to_owned(),
        base: format!("http://{}", hub.registry()),
        plain_host: None,
    };
    for (mirror, served_by_mirror) in [
        (&good_mirror, true),
        (&down_mirror, false),
        (&lying_mirror, false),
    ] {
        let mut registry = registry_with(Some(&format!("http://{}", mirror.registry())), None);
        registry.hub = hub_endpoint.clone();
        let dir = tempfile::tempdir().expect("tempdir");
        let digest = registry
            .download(DOCKER_HUB, "library/img", "t", dir.path())
            .await
            .expect("download");
        assert_eq!(digest, images.ours.manifest.digest());
        image::assert_layout(dir.path(), &images.ours);
        assert!(!mirror.log().is_empty(), "the mirror is asked first");
        let hub_asked = hub
            .log()
            .iter()
            .any(|l| l.path.contains(&images.ours.layers[0].digest().to_string()));
        assert_eq!(hub_asked, !served_by_mirror);
        // Another registry never goes to the mirror.
        let before = mirror.log().len();
        let _ = registry.resolve(&hub.registry(), "acme/img", "t").await;
        assert_eq!(mirror.log().len(), before);
    }
}

#[test]
fn unreachable_registries_say_where_without_secrets() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A loopback port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let registry = registry_with(None, credentials("alice", PASSWORD));
    let e = rt
        .block_on(registry.resolve(&format!("127.0.0.1:{port}"), "acme/img", "t"))
        .expect_err("nobody there");
    let text = clean_message(&e);
    assert!(matches!(e, RegistryError::Unreachable { .. }), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
}
