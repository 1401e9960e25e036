//! Action archives against the fake: a ref resolved to its commit (then a free `304`), the
//! tarball through GitHub's redirect to codeload with no credential on the second hop, a
//! public repository read with an installation that does not cover it, a private one only
//! with `contents` read, and the size cap.

use rm_fake_github::archives::tarball;
use rm_github::{ArchiveError, GithubError};

use crate::common::*;

const V4: &str = "11bd71901bbe5b1630ceea73d27597364c9af683";
const FILES: &[(&str, &[u8])] = &[("action.yml", b"name: checkout\nruns:\n  using: node20\n")];

#[tokio::test]
async fn a_public_action_resolves_then_downloads_through_the_redirect() {
    let h = harness().await;
    h.fake
        .publish_action("actions/checkout", true, &[("v4", V4)], FILES);

    let first = h
        .client
        .commit_sha(h.org_installation, "actions/checkout", "v4")
        .await
        .unwrap();
    assert_eq!((first.value.as_str(), first.not_modified), (V4, false));
    let again = h
        .client
        .commit_sha(h.org_installation, "actions/checkout", "v4")
        .await
        .unwrap();
    assert_eq!((again.value.as_str(), again.not_modified), (V4, true));

    let mut out = Vec::new();
    let written = h
        .client
        .download_tarball(
            h.org_installation,
            "actions/checkout",
            V4,
            1 << 20,
            &mut out,
        )
        .await
        .unwrap();
    let expected = tarball("actions", "checkout", V4, FILES);
    assert_eq!(out, expected);
    assert_eq!(written, expected.len() as u64);

    let requests = h.fake.requests();
    let commit: Vec<_> = requests
        .iter()
        .filter(|r| r.path == "/repos/actions/checkout/commits/v4")
        .collect();
    assert_eq!(
        commit.iter().map(|r| r.status).collect::<Vec<_>>(),
        [200, 304]
    );
    let header = |r: &rm_fake_github::RequestRecord, name: &str| {
        r.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header(commit[0], "accept").as_deref(),
        Some("application/vnd.github.sha")
    );
    let api = requests
        .iter()
        .find(|r| r.path == format!("/repos/actions/checkout/tarball/{V4}"))
        .expect("the API hop");
    assert_eq!(api.status, 302);
    assert_eq!(
        header(api, "authorization").as_deref(),
        Some("Bearer <redacted>")
    );
    let hop = requests
        .iter()
        .find(|r| r.path.starts_with("/_codeload/actions/checkout/"))
        .expect("the codeload hop");
    assert_eq!(hop.status, 200);
    assert_eq!(
        header(hop, "authorization"),
        None,
        "no credential leaves the API"
    );

    // Both API requests went through the budget, as every call does.
    let counts = h.client.request_counts();
    for (endpoint, status) in [
        ("repos.commits.get", 200),
        ("repos.commits.get", 304),
        ("repos.tarball", 302),
    ] {
        assert!(
            counts.contains(&(endpoint, status, 1)),
            "{endpoint} {status}: {counts:?}"
        );
    }
}

#[tokio::test]
async fn a_private_action_needs_contents_read_and_its_codeload_token_stays_out_of_errors() {
    let h = harness().await;
    h.fake
        .publish_action("acme/deploy-action", false, &[("v1", V4)], FILES);
    let denied = h
        .client
        .commit_sha(h.org_installation, "acme/deploy-action", "v1")
        .await;
    assert!(
        matches!(denied, Err(GithubError::NotFound { .. })),
        "{denied:?}"
    );
    // Another account's installation never sees it.
    let other = h
        .client
        .commit_sha(h.user_installation, "acme/deploy-action", "v1")
        .await;
    assert!(matches!(other, Err(GithubError::NotFound { .. })));

    h.fake.set_permissions(
        h.org_installation,
        &[("metadata", "read"), ("contents", "read")],
    );
    let sha = h
        .client
        .commit_sha(h.org_installation, "acme/deploy-action", "v1")
        .await
        .unwrap();
    assert_eq!(sha.value, V4);
    let mut out = Vec::new();
    h.client
        .download_tarball(
            h.org_installation,
            "acme/deploy-action",
            V4,
            1 << 20,
            &mut out,
        )
        .await
        .unwrap();
    assert_eq!(out, tarball("acme", "deploy-action", V4, FILES));

    let mut small = Vec::new();
    let err = h
        .client
        .download_tarball(h.org_installation, "acme/deploy-action", V4, 10, &mut small)
        .await
        .unwrap_err();
    assert!(matches!(err, ArchiveError::TooLarge { .. }), "{err}");
    let shown = err.to_string();
    assert!(
        !shown.contains("token") && !shown.contains('?'),
        "the URL's query stays out: {shown}"
    );
}

#[tokio::test]
async fn a_ref_that_names_no_commit_is_refused_and_a_bad_name_never_leaves() {
    let h = harness().await;
    h.fake
        .publish_action("actions/checkout", true, &[("v4", V4)], FILES);
    let missing = h
        .client
        .commit_sha(h.org_installation, "actions/checkout", "v9")
        .await;
    assert!(
        matches!(missing, Err(GithubError::Unprocessable { .. })),
        "{missing:?}"
    );
    let before = h.fake.requests().len();
    for (repository, reference) in [
        ("actions/checkout", "../../app"),
        ("actions/checkout", "v4?per_page=1"),
        ("actions/../x", "v4"),
    ] {
        let refused = h
            .client
            .commit_sha(h.org_installation, repository, reference)
            .await;
        assert!(
            matches!(refused, Err(GithubError::Unprocessable { .. })),
            "{repository}@{reference}"
        );
    }
    let mut out = Vec::new();
    let not_a_sha = h
        .client
        .download_tarball(
            h.org_installation,
            "actions/checkout",
            "v4",
            1 << 20,
            &mut out,
        )
        .await;
    assert!(not_a_sha.is_err());
    assert_eq!(h.fake.requests().len(), before, "nothing was sent");
}
