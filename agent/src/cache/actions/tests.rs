//! The refresher against the fake GitHub: public and private actions kept where the runner
//! looks, a moved ref's new archive beside the old one for the grace, a refused download
//! (an HTML page) kept out and retried on the back-off, and a crash's temporary file removed.

use std::sync::OnceLock;

use rm_cache::actions::{GRACE, RETRY_FIRST, archive_path};
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use rm_github::ClientConfig;

use super::*;

const APP_ID: u64 = 4713;
const V4: &str = "11bd71901bbe5b1630ceea73d27597364c9af683";
const V4_NEXT: &str = "b4ffde65f46336ab88eb53be808477a3936bae11";
const V1: &str = "0123456789abcdef0123456789abcdef01234567";
const FILES: &[(&str, &[u8])] = &[("action.yml", b"name: x\n")];

fn key() -> &'static AppKeyPair {
    static KEY: OnceLock<AppKeyPair> = OnceLock::new();
    KEY.get_or_init(|| AppKeyPair::generate().unwrap())
}

fn action(s: &str) -> ActionRef {
    s.parse().unwrap()
}

async fn fake() -> (FakeGithub, GithubClient) {
    let fake = FakeGithub::start(FakeOptions::new(APP_ID, key().public_pem.clone()))
        .await
        .unwrap();
    let acme = fake.add_org("acme");
    fake.add_repo("acme/widgets");
    fake.set_permissions(acme, &[("metadata", "read"), ("contents", "read")]);
    fake.publish_action("actions/checkout", true, &[("v4", V4)], FILES);
    fake.publish_action("acme/deploy", false, &[("v1", V1)], FILES);
    let config = ClientConfig::new(fake.api_url(), APP_ID, key().private_pem.clone());
    let client = GithubClient::new(config).unwrap();
    (fake, client)
}

#[test]
fn an_action_is_read_by_its_own_installation_first_then_the_public_reader() {
    let acme = Target::Org("acme".into());
    let checkout = action("actions/checkout@v4");
    let own = Target::Repo {
        owner: "actions".into(),
        repo: "checkout".into(),
    };
    assert_eq!(readers(&checkout, Some(&acme)), [own.clone(), acme.clone()]);
    assert_eq!(readers(&checkout, None), std::slice::from_ref(&own));
    // A sub-folder action is read as its repository.
    let sub = action("actions/checkout/sub@v4");
    assert_eq!(readers(&sub, Some(&own)), [own]);
}

#[tokio::test]
async fn archives_are_kept_where_the_runner_looks_and_a_moved_ref_keeps_the_old_for_the_grace() {
    let (fake, client) = fake().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("actions");
    let mut refresher = Refresher::open(
        client,
        root.clone(),
        vec![action("actions/checkout@v4"), action("acme/deploy/sub@v1")],
        Some(Target::Org("acme".into())),
    )
    .unwrap();
    refresher.refresh_due().await;
    let checkout = root.join("actions_checkout").join(format!("{V4}.tar.gz"));
    let deploy = root.join("acme_deploy").join(format!("{V1}.tar.gz"));
    assert_eq!(
        std::fs::read(&checkout).unwrap(),
        rm_fake_github::archives::tarball("actions", "checkout", V4, FILES)
    );
    assert!(
        deploy.is_file(),
        "the private action, read with contents:read"
    );
    assert_eq!(fake.action_downloads(), 2);
    let later = Instant::now() + rm_cache::actions::REFRESH_INTERVAL;
    assert!(refresher.next_due() > later - Duration::from_secs(60));

    // Unchanged refs: resolved again (a 304), nothing downloaded.
    refresher.make_due();
    refresher.refresh_due().await;
    assert_eq!(fake.action_downloads(), 2);

    // v4 moves: the new commit is kept, the old one stays for the grace, then goes.
    fake.move_action_ref("actions/checkout", "v4", V4_NEXT, FILES);
    refresher.make_due();
    refresher.refresh_due().await;
    let next = root
        .join("actions_checkout")
        .join(format!("{V4_NEXT}.tar.gz"));
    assert!(next.is_file() && checkout.is_file());
    for since in refresher.unwanted_since.values_mut() {
        *since -= GRACE;
    }
    refresher.make_due();
    refresher.refresh_due().await;
    assert!(next.is_file() && deploy.is_file());
    assert!(!checkout.exists(), "out of its grace");
}

#[tokio::test]
async fn an_html_page_is_not_kept_and_the_action_is_retried_on_the_back_off() {
    let (fake, client) = fake().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("actions");
    let mut refresher = Refresher::open(
        client,
        root.clone(),
        vec![action("actions/checkout@v4")],
        Some(Target::Org("acme".into())),
    )
    .unwrap();
    fake.serve_html_downloads(1);
    refresher.refresh_due().await;
    let key = action("actions/checkout@v4").key(V4);
    assert!(!refresher.store().contains(&key));
    let left: Vec<_> = std::fs::read_dir(root.join("actions_checkout"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "no temporary file stays: {left:?}");
    assert_eq!(refresher.tracked[0].failures, 1);
    let wait = refresher.next_due() - Instant::now();
    assert!(
        wait <= RETRY_FIRST && wait > RETRY_FIRST - Duration::from_secs(5),
        "{wait:?}"
    );

    refresher.make_due();
    refresher.refresh_due().await;
    assert!(archive_path(&root, &key).is_file());
    assert_eq!(refresher.tracked[0].failures, 0);
}

#[tokio::test]
async fn a_private_action_the_app_cannot_read_fails_alone() {
    let (fake, client) = fake().await;
    fake.publish_action("other/secret", false, &[("v1", V1)], FILES);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("actions");
    let mut refresher = Refresher::open(
        client,
        root.clone(),
        vec![action("other/secret@v1"), action("actions/checkout@v4")],
        Some(Target::Org("acme".into())),
    )
    .unwrap();
    refresher.refresh_due().await;
    // `other`'s installation has no contents permission; acme's does not cover it.
    assert_eq!(refresher.tracked[0].failures, 1);
    assert!(archive_path(&root, &action("actions/checkout@v4").key(V4)).is_file());
}

#[tokio::test]
async fn a_crash_s_temporary_file_is_removed_when_the_refresher_opens() {
    let (_fake, client) = fake().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("actions");
    let leftover = root
        .join("actions_checkout")
        .join(format!(".tmp-{V4}-0011223344556677"));
    std::fs::create_dir_all(leftover.parent().unwrap()).unwrap();
    std::fs::write(&leftover, b"half a download").unwrap();
    let refresher =
        Refresher::open(client, root, vec![action("actions/checkout@v4")], None).unwrap();
    assert!(!leftover.exists());
    drop(refresher);
}
