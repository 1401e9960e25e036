//! The rules in tables, and the store on a temporary directory: installs, refusals, the modes
//! runners rely on, and what a crash leaves.

use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;

use super::*;

const SHA: &str = "11bd71901bbe5b1630ceea73d27597364c9af683";
const OLD: &str = "b4ffde65f46336ab88eb53be808477a3936bae11";

/// A gzip tar of `entries` (path, file body; a path ending in `/` is a folder), with a
/// `pax_global_header` first as GitHub's archives have.
fn targz(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let comment = format!("52 comment={SHA}\n");
    let mut global = tar::Header::new_ustar();
    global.set_entry_type(tar::EntryType::XGlobalHeader);
    global.set_size(comment.len() as u64);
    builder
        .append_data(&mut global, "pax_global_header", comment.as_bytes())
        .unwrap();
    for (path, body) in entries {
        let mut header = tar::Header::new_gnu();
        if path.ends_with('/') {
            header.set_entry_type(tar::EntryType::Directory);
        }
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, path, *body).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

fn github_like() -> Vec<u8> {
    targz(&[
        ("actions-checkout-11bd719/", b""),
        ("actions-checkout-11bd719/action.yml", b"name: checkout\n"),
        ("actions-checkout-11bd719/dist/index.js", b"// js\n"),
    ])
}

#[test]
fn action_entries_are_owner_repo_at_ref_or_a_folder_inside() {
    let ok = |s: &str| {
        s.parse::<ActionRef>()
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    };
    let a = ok("actions/checkout@v4");
    assert_eq!(
        (
            a.owner.as_str(),
            a.repo.as_str(),
            a.path.as_deref(),
            a.reference.as_str()
        ),
        ("actions", "checkout", None, "v4")
    );
    assert_eq!(a.repository(), "actions/checkout");
    assert_eq!(a.to_string(), "actions/checkout@v4");
    let sub = ok("github/codeql-action/init@v3");
    assert_eq!(sub.repository(), "github/codeql-action");
    assert_eq!(sub.path.as_deref(), Some("init"));
    assert_eq!(sub.to_string(), "github/codeql-action/init@v3");
    assert_eq!(
        ok("acme/tools/a/b@release/v1.2").path.as_deref(),
        Some("a/b")
    );
    assert_eq!(ok(&format!("actions/cache@{SHA}")).reference, SHA);
    assert_eq!(ok("my-org/my_repo.js@main").repo, "my_repo.js");

    for bad in [
        "actions/checkout",
        "actions@v4",
        "actions/checkout@",
        "@v4",
        "/checkout@v4",
        "actions/@v4",
        "./local-action",
        "./.github/actions/x@v1",
        "docker://alpine:3.19",
        "actions/checkout@v4 ",
        " actions/checkout@v4",
        "actions/checkout@v4@v5",
        "act_ions/checkout@v4",
        "-actions/checkout@v4",
        "actions/../checkout@v4",
        "actions/checkout/..@v4",
        "actions/checkout/./x@v4",
        "actions/checkout//x@v4",
        "actions/checkout@../../etc",
        "actions/checkout@a..b",
        "actions/checkout@/v4",
        "actions/checkout@v4/",
        "actions/checkout@.hidden",
        "actions/checkout@-rf",
        "actions/checkout@v4.lock",
        "actions/checkout@v4?x=1",
        "actions/checkout@v4#x",
        "actions/checkout@v%34",
        "actions/.@v4",
        "actions/..@v4",
    ] {
        assert!(bad.parse::<ActionRef>().is_err(), "{bad:?} was accepted");
    }
    let long_owner = format!("{}/x@v1", "a".repeat(40));
    assert!(long_owner.parse::<ActionRef>().is_err());
}

#[test]
fn the_list_is_bounded_and_one_archive_per_repository_and_ref() {
    let entries: Vec<String> = [
        "actions/checkout@v4",
        "github/codeql-action/init@v3",
        "github/codeql-action/analyze@v3",
        "actions/checkout@v4",
        "actions/checkout@v3",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let parsed = parse_actions(&entries).unwrap();
    let shown: Vec<String> = parsed.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "actions/checkout@v4",
            "github/codeql-action/init@v3",
            "actions/checkout@v3"
        ]
    );
    let bad = vec!["actions/checkout@v4".to_owned(), "nope".to_owned()];
    assert_eq!(
        parse_actions(&bad).unwrap_err(),
        InvalidAction("nope".into())
    );
    let many = vec!["actions/checkout@v4".to_owned(); MAX_ACTIONS + 1];
    assert!(parse_actions(&many).is_err());
}

#[test]
fn the_file_name_is_the_runner_s() {
    // actions/runner: Path.Combine(cacheDir, ResolvedNameWithOwner with '/' and '\' made '_',
    // $"{ResolvedSha}.tar.gz").
    let key = "actions/checkout@v4".parse::<ActionRef>().unwrap().key(SHA);
    assert_eq!(
        archive_path(Path::new("/c/actions"), &key),
        Path::new("/c/actions/actions_checkout/11bd71901bbe5b1630ceea73d27597364c9af683.tar.gz")
    );
    let sub = "github/codeql-action/init@v3"
        .parse::<ActionRef>()
        .unwrap()
        .key(SHA);
    assert_eq!(
        archive_path(Path::new("/r"), &sub),
        Path::new("/r/github_codeql-action").join(format!("{SHA}.tar.gz"))
    );
    // Back from the disk: a repository name may hold '_', a login never does.
    assert_eq!(
        key_of("my-org_my_repo", &format!("{SHA}.tar.gz")),
        Some(ArchiveKey {
            repository: "my-org/my_repo".into(),
            sha: SHA.into()
        })
    );
    for (dir, file) in [
        ("actions_checkout", ".tmp-abc"),
        ("actions_checkout", &format!("{SHA}.zip")),
        ("actions_checkout", "v4.tar.gz"),
        ("actionscheckout", &format!("{SHA}.tar.gz")),
        ("actions_..", &format!("{SHA}.tar.gz")),
    ] {
        assert_eq!(key_of(dir, file), None, "{dir}/{file}");
    }
}

#[test]
fn an_unwanted_archive_stays_for_the_grace_then_goes() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let key = |repo: &str, sha: &str| ArchiveKey {
        repository: repo.into(),
        sha: sha.into(),
    };
    let current = key("actions/checkout", SHA);
    let previous = key("actions/checkout", OLD);
    let dropped = key("actions/setup-node", OLD);
    let stored: BTreeSet<_> = [current.clone(), previous.clone(), dropped.clone()].into();
    let wanted: BTreeSet<_> = [current.clone()].into();
    let mut since = BTreeMap::new();
    // (when, removed): the grace starts when rm first sees them unwanted.
    for (at, removed) in [
        (Duration::ZERO, vec![]),
        (GRACE - Duration::from_secs(1), vec![]),
        (GRACE, vec![previous.clone(), dropped.clone()]),
    ] {
        assert_eq!(
            to_remove(&stored, &wanted, &mut since, t0 + at),
            removed,
            "{at:?}"
        );
    }
    // Wanted again (the ref moved back): forgotten, its grace starts over when unwanted.
    // (The caller removed what it was told to; `previous` is on disk again.)
    let stored: BTreeSet<_> = [current.clone(), previous.clone()].into();
    let wanted_again: BTreeSet<_> = [current.clone(), previous.clone()].into();
    assert!(to_remove(&stored, &wanted_again, &mut since, t0 + GRACE).is_empty());
    assert!(
        since.is_empty(),
        "dropped is gone from the disk, previous is wanted"
    );
    assert!(to_remove(&stored, &wanted, &mut since, t0 + GRACE * 2).is_empty());
    assert_eq!(
        to_remove(&stored, &wanted, &mut since, t0 + GRACE * 3),
        std::slice::from_ref(&previous)
    );
    // The current archive is never removed; a clock gone back removes nothing.
    let mut fresh = BTreeMap::new();
    assert!(to_remove(&stored, &wanted, &mut fresh, t0 + GRACE * 3).is_empty());
    assert!(to_remove(&stored, &wanted, &mut fresh, t0).is_empty());
    // Gone from the disk: forgotten.
    let only_current: BTreeSet<_> = [current.clone()].into();
    to_remove(&only_current, &wanted, &mut fresh, t0);
    assert!(fresh.is_empty());
}

#[test]
fn refreshes_come_every_interval_and_back_off_after_failures() {
    let min = Duration::from_secs(60);
    for (failures, not_before, want) in [
        (0, None, REFRESH_INTERVAL),
        (1, None, RETRY_FIRST),
        (2, None, RETRY_FIRST * 2),
        (3, None, RETRY_FIRST * 4),
        (6, None, RETRY_FIRST * 32),
        (7, None, REFRESH_INTERVAL),
        (40, None, REFRESH_INTERVAL),
        (u32::MAX, None, REFRESH_INTERVAL),
        (1, Some(min * 30), min * 30),
        (3, Some(min), RETRY_FIRST * 4),
    ] {
        assert_eq!(
            next_refresh(failures, not_before),
            want,
            "{failures} {not_before:?}"
        );
    }
}

#[test]
fn only_a_gzip_tar_with_one_top_folder_is_an_archive() {
    assert_eq!(
        check_archive(&github_like()[..]).unwrap(),
        "actions-checkout-11bd719"
    );
    // Files only, the folder implied.
    assert!(check_archive(&targz(&[("top/a.yml", b"x")])[..]).is_ok());
    let html = b"<!DOCTYPE html><html><body>Sign in</body></html>";
    assert!(matches!(
        check_archive(&html[..]),
        Err(ArchiveError::NotGzip(_))
    ));
    assert!(matches!(
        check_archive(&b""[..]),
        Err(ArchiveError::NotGzip(_))
    ));
    let mut gz_html = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz_html.write_all(html).unwrap();
    let gz_html = gz_html.finish().unwrap();
    assert!(check_archive(&gz_html[..]).is_err(), "gzip of an HTML page");
    let mut truncated = github_like();
    truncated.truncate(truncated.len() / 2);
    assert!(check_archive(&truncated[..]).is_err());
    for (entries, why) in [
        (&[("a/x", &b"1"[..]), ("b/y", b"2")][..], "two folders"),
        (
            &[("a/x", &b"1"[..]), ("README", b"2")][..],
            "a file beside the folder",
        ),
        (&[("README", &b"2"[..])][..], "only a file"),
        (&[][..], "empty"),
    ] {
        assert!(check_archive(&targz(entries)[..]).is_err(), "{why}");
    }
}

#[test]
fn an_entry_leaving_the_folder_is_refused() {
    // tar::Builder refuses to write `..`; write the header's name by hand, as an attacker would.
    for name in ["top/../../etc/passwd", "/etc/passwd"] {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        let mut ok = tar::Header::new_gnu();
        ok.set_size(1);
        builder.append_data(&mut ok, "top/a", &b"1"[..]).unwrap();
        let mut header = tar::Header::new_old();
        header.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(1);
        header.set_cksum();
        builder.append(&header, &b"x"[..]).unwrap();
        let bytes = builder.into_inner().unwrap().finish().unwrap();
        assert!(
            matches!(check_archive(&bytes[..]), Err(ArchiveError::Escapes(_))),
            "{name}"
        );
    }
}

fn write_download(store: &ArchiveStore, key: &ArchiveKey, bytes: &[u8]) -> Staged {
    let staged = store.begin(key).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(staged.temp_path())
        .unwrap();
    file.write_all(bytes).unwrap();
    staged
}

#[test]
fn an_archive_is_installed_where_the_runner_looks_readable_by_all_writable_by_none_else() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cache").join(ACTIONS_DIR);
    let store = ArchiveStore::open(&root).unwrap();
    let key = "actions/checkout@v4".parse::<ActionRef>().unwrap().key(SHA);
    assert!(!store.contains(&key));
    let staged = write_download(&store, &key, &github_like());
    let temp = staged.temp_path().to_owned();
    assert!(
        !store.contains(&key),
        "nothing at the runner's path before the rename"
    );
    let path = store.install(staged).unwrap();
    assert_eq!(
        path,
        root.join("actions_checkout").join(format!("{SHA}.tar.gz"))
    );
    assert!(store.contains(&key) && !temp.exists());
    assert_eq!(std::fs::read(&path).unwrap(), github_like());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&path), 0o644);
    assert_eq!(mode(path.parent().unwrap()), 0o755);
    assert_eq!(mode(&root), 0o755);
    let uid = |p: &Path| std::fs::metadata(p).unwrap().uid();
    // Owned by whoever runs the agent: root in production (runner uids are others).
    assert_eq!(uid(&path), uid(tmp.path()));
    assert_eq!(store.stored().unwrap(), [key.clone()].into());
    assert_eq!(store.bytes().unwrap(), github_like().len() as u64);

    store.remove(&key).unwrap();
    assert!(!store.contains(&key));
    assert!(
        !root.join("actions_checkout").exists(),
        "the empty directory goes too"
    );
    store.remove(&key).unwrap();
}

#[test]
fn a_refused_download_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ArchiveStore::open(tmp.path()).unwrap();
    let key = "actions/checkout@v4".parse::<ActionRef>().unwrap().key(SHA);
    let staged = write_download(&store, &key, b"<html>rate limited</html>");
    let temp = staged.temp_path().to_owned();
    assert!(matches!(
        store.install(staged),
        Err(ArchiveError::NotGzip(_))
    ));
    assert!(!temp.exists() && !store.contains(&key));
    assert!(store.stored().unwrap().is_empty());
}

#[test]
fn a_crash_between_download_and_rename_leaves_a_temporary_file_the_next_open_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ArchiveStore::open(tmp.path()).unwrap();
    let key = "actions/checkout@v4".parse::<ActionRef>().unwrap().key(SHA);
    let installed = write_download(&store, &key, &github_like());
    store.install(installed).unwrap();
    let other = "actions/setup-node@v4"
        .parse::<ActionRef>()
        .unwrap()
        .key(OLD);
    // The process dies here: the staged download is never installed nor removed.
    let crashed = write_download(&store, &other, &github_like());
    let temp = crashed.temp_path().to_owned();
    std::mem::forget(crashed);
    assert!(temp.exists());
    assert!(!store.contains(&other), "the runner finds nothing for it");
    assert_eq!(store.stored().unwrap(), [key.clone()].into(), "not listed");
    // Not rm's: left alone.
    std::fs::write(tmp.path().join("README"), b"x").unwrap();

    let reopened = ArchiveStore::open(tmp.path()).unwrap();
    assert!(!temp.exists(), "the next open removes it");
    assert!(reopened.contains(&key), "the installed archive stays");
    assert!(tmp.path().join("README").exists());
}
