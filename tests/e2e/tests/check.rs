//! `rm-agent check` through the real binary against the fake GitHub: a host that is ready, an
//! installation without the permission runner registration needs, a key GitHub refuses, and a
//! key file others can read. The private key never appears in anything the binary prints.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use rm_e2e::{SECRET, Setup};
use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use secrecy::ExposeSecret;

const APP_ID: u64 = 4711;

/// A fake GitHub with the App installed on `acme` (holding `acme/widgets`), and the key pair.
async fn github() -> (FakeGithub, AppKeyPair, u64) {
    let key = AppKeyPair::generate().unwrap();
    let fake = FakeGithub::start(FakeOptions::new(APP_ID, key.public_pem.clone()))
        .await
        .unwrap();
    let installation = fake.add_org("acme");
    fake.add_repo("acme/widgets");
    (fake, key, installation)
}

/// Writes the key (mode 600) and a configuration with an organization and a repository policy.
fn configure(setup: &Setup, fake: &FakeGithub, pem: &str, runner_group: u64) {
    let key_file = setup.dir.path().join("app.pem");
    std::fs::write(&key_file, pem).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = format!(
        r#"data_dir = "{data}"

[github]
api_url = "{api}"
app_id = {APP_ID}
private_key_file = "{key}"

[receiver]
listen = "{addr}"

[host]
{free}
[[policy]]
name = "org"
target = "acme"
labels = ["self-hosted", "linux"]
runner_group_id = {runner_group}

[[policy]]
name = "repo"
target = "acme/widgets"
labels = ["self-hosted", "linux"]
"#,
        data = setup.dir.path().join("data").display(),
        api = fake.api_url(),
        key = key_file.display(),
        addr = setup.addr,
        free = rm_e2e::HOST_FREE_SPACE,
    );
    std::fs::write(setup.config(), config).unwrap();
}

/// Whether this process's cgroup v2 directory offers the `memory` and the `pids` controller
/// (where `host.cgroup_root = "auto"` would make runner cgroups), found as the agent finds it.
fn own_limit_controllers() -> (bool, bool) {
    use rm_runner::cgroup;
    let mounts = cgroup::cgroup2_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let offered = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup::own_cgroup_path(&text))
        .and_then(|own| cgroup::cgroup_dir(&mounts, &own))
        .and_then(|dir| std::fs::read_to_string(dir.join("cgroup.controllers")).ok())
        .map(|text| cgroup::parse_controllers(&text))
        .unwrap_or_default();
    (offered.memory, offered.pids)
}

/// Runs `rm-agent check ARGS` off the runtime that serves the fake.
async fn check(setup: &Setup, args: &[&str]) -> Output {
    let mut command = setup.command(&["check"]);
    command.args(args).env_remove("RM_GITHUB_PRIVATE_KEY");
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The key's base64 lines: none of them may be printed.
fn assert_key_not_shown(output: &Output, key: &AppKeyPair) {
    let all = text(output);
    for line in key.private_pem.expose_secret().lines() {
        if !line.starts_with("-----") && !line.is_empty() {
            assert!(!all.contains(line), "the private key was printed:\n{all}");
        }
    }
    assert!(!all.contains(SECRET), "the webhook secret was printed");
}

fn findings(output: &Output) -> Vec<serde_json::Value> {
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    assert_eq!(doc["ready"], output.status.success(), "{doc}");
    doc["findings"].as_array().unwrap().clone()
}

fn find<'a>(
    findings: &'a [serde_json::Value],
    check: &str,
    policy: Option<&str>,
) -> Vec<&'a serde_json::Value> {
    findings
        .iter()
        .filter(|f| f["check"] == check && f["policy"].as_str() == policy)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_host_passes_every_check() {
    let (fake, key, _) = github().await;
    let group = fake.add_runner_group("acme", "gpu");
    let setup = Setup::new();
    configure(&setup, &fake, key.private_pem.expose_secret(), group);

    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let all = findings(&out);
    // Every policy is bounded in memory and processes by default: where runner cgroups would
    // get no memory or pids controller (this test's own cgroup v2 directory says), the isolation
    // finding warns and names what is missing; everything else is ok.
    let (memory, pids) = own_limit_controllers();
    for f in &all {
        if f["check"] == "isolation" && !(memory && pids) {
            assert_eq!(f["status"], "warn", "{f}");
            let what = f["what"].as_str().unwrap();
            assert_eq!(what.contains("no memory controller"), !memory, "{what}");
            assert_eq!(what.contains("no pids controller"), !pids, "{what}");
            continue;
        }
        assert_eq!(f["status"], "ok", "{f}");
        assert_eq!(f["remedy"], "", "{f}");
    }
    for (check, policy) in [
        ("config", None),
        ("webhook_secret", None),
        ("app", None),
        ("installation", Some("org")),
        ("permission", Some("org")),
        ("runner_group", Some("org")),
        ("installation", Some("repo")),
        ("permission", Some("repo")),
        // The kernel's link protections (on where the suite runs: `.ci/run` turns them on).
        ("protected_links", None),
    ] {
        assert!(
            !find(&all, check, policy).is_empty(),
            "no {check} finding for {policy:?}: {all:?}"
        );
    }
    assert!(
        find(&all, "runner_group", Some("repo")).is_empty(),
        "repositories have no runner groups"
    );
    // Isolated by default, with the evidence (CONTRACT §7).
    let isolation = find(&all, "isolation", None);
    let what = isolation[0]["what"].as_str().unwrap();
    for evidence in [
        "isolation user",
        "runner uids 64200-64263 (64 uids)",
        "no secret file is readable",
    ] {
        assert!(what.contains(evidence), "{what}");
    }
    assert!(
        find(&all, "runner_group", Some("org"))[0]["what"]
            .as_str()
            .unwrap()
            .contains("\"gpu\"")
    );
    assert_key_not_shown(&out, &key);

    // The table for people says the same.
    let out = check(&setup, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let table = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(table.starts_with("STATUS"), "{table}");
    assert!(table.contains("GitHub accepted the App's JWT"), "{table}");
    assert_key_not_shown(&out, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_runner_permission_blocks_and_names_the_permission() {
    let (fake, key, installation) = github().await;
    fake.set_permissions(installation, &[("actions", "read"), ("metadata", "read")]);
    let setup = Setup::new();
    configure(&setup, &fake, key.private_pem.expose_secret(), 1);

    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let all = findings(&out);
    let org = find(&all, "permission", Some("org"));
    assert_eq!(org[0]["status"], "fail", "{all:?}");
    let what = org[0]["what"].as_str().unwrap();
    assert!(
        what.contains("`organization_self_hosted_runners: write`"),
        "{what}"
    );
    assert!(
        org[0]["remedy"]
            .as_str()
            .unwrap()
            .contains("Self-hosted runners")
    );
    let repo = find(&all, "permission", Some("repo"));
    assert_eq!(repo[0]["status"], "fail");
    assert!(
        repo[0]["what"]
            .as_str()
            .unwrap()
            .contains("`administration: write`")
    );
    // The group cannot be read without the permission: said, not guessed.
    assert_eq!(find(&all, "runner_group", Some("org"))[0]["status"], "warn");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("block running"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one sentence: {stderr}");

    // The table names the permission too.
    let out = check(&setup, &[]).await;
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        table.contains("organization_self_hosted_runners: write"),
        "{table}"
    );
    assert_key_not_shown(&out, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_github_refuses_is_a_401_with_its_remedy() {
    let (fake, key, _) = github().await;
    let other = AppKeyPair::generate().unwrap();
    let setup = Setup::new();
    configure(&setup, &fake, other.private_pem.expose_secret(), 1);

    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let all = findings(&out);
    let app = find(&all, "app", None);
    assert_eq!(app[0]["status"], "fail");
    assert!(app[0]["what"].as_str().unwrap().contains("401"), "{all:?}");
    assert!(
        app[0]["remedy"].as_str().unwrap().contains("github.app_id"),
        "{all:?}"
    );
    assert!(
        find(&all, "installation", Some("org")).is_empty(),
        "nothing is asked of GitHub past a refused JWT"
    );
    assert_key_not_shown(&out, &other);
    assert_key_not_shown(&out, &key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_others_can_read_and_an_unknown_target_are_reported() {
    let (fake, key, _) = github().await;
    let setup = Setup::new();
    configure(&setup, &fake, key.private_pem.expose_secret(), 1);
    let key_file = setup.dir.path().join("app.pem");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();

    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let all = findings(&out);
    let finding = find(&all, "private_key", None);
    assert_eq!(finding[0]["status"], "fail");
    assert!(
        finding[0]["remedy"].as_str().unwrap().contains("chmod 600"),
        "{all:?}"
    );
    assert_key_not_shown(&out, &key);

    // Back to 600, with a policy on an organization the App is not installed on.
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = std::fs::read_to_string(setup.config()).unwrap();
    std::fs::write(
        setup.config(),
        config.replace("target = \"acme\"", "target = \"elsewhere\""),
    )
    .unwrap();
    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let all = findings(&out);
    let missing = find(&all, "installation", Some("org"));
    assert_eq!(missing[0]["status"], "fail");
    assert!(
        missing[0]["remedy"]
            .as_str()
            .unwrap()
            .contains("install the App")
    );
    assert_eq!(find(&all, "installation", Some("repo"))[0]["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_may_come_from_the_environment_instead() {
    let (fake, key, _) = github().await;
    let setup = Setup::new();
    configure(&setup, &fake, "unused", 1);
    let config = std::fs::read_to_string(setup.config()).unwrap();
    let without_file: String = config
        .lines()
        .filter(|l| !l.starts_with("private_key_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(setup.config(), without_file).unwrap();

    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(1), "no key at all: {}", text(&out));
    let all = findings(&out);
    assert!(
        find(&all, "private_key", None)[0]["remedy"]
            .as_str()
            .unwrap()
            .contains("RM_GITHUB_PRIVATE_KEY")
    );

    let mut command = setup.command(&["check", "--json"]);
    command.env("RM_GITHUB_PRIVATE_KEY", key.private_pem.expose_secret());
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(find(&findings(&out), "app", None)[0]["status"], "ok");
    assert_key_not_shown(&out, &key);
}

#[test]
fn a_bad_configuration_exits_2_before_reaching_github() {
    let setup = Setup::new();
    std::fs::write(setup.config(), "[github]\napp_idd = 1\n").unwrap();
    let out = setup.run(&["check"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("unknown field `app_idd`"), "{stderr}");
    assert!(Path::new(&setup.config()).exists());
}

/// `isolation = "none"` passes, but as a warning that says what a job can reach; a key file a
/// runner uid could read fails the isolation finding with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_none_is_a_warning_and_a_key_runners_could_read_fails() {
    let (fake, key, _) = github().await;
    let group = fake.add_runner_group("acme", "gpu");
    let setup = Setup::new();
    configure(&setup, &fake, key.private_pem.expose_secret(), group);
    let config = std::fs::read_to_string(setup.config()).unwrap();
    std::fs::write(
        setup.config(),
        config.replacen("[host]\n", "[host]\nisolation = \"none\"\n", 1),
    )
    .unwrap();
    let out = check(&setup, &["--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let all = findings(&out);
    let isolation = find(&all, "isolation", None);
    assert_eq!(isolation[0]["status"], "warn", "{all:?}");
    let what = isolation[0]["what"].as_str().unwrap();
    assert!(what.contains("private key"), "{what}");

    // Back to the default, with the key file owned by a runner uid of the pool.
    std::fs::write(setup.config(), config).unwrap();
    let key_file = setup.dir.path().join("app.pem");
    std::os::unix::fs::chown(&key_file, Some(64201), None).unwrap();
    let out = check(&setup, &["--json"]).await;
    let all = findings(&out);
    let isolation = find(&all, "isolation", None);
    assert_eq!(isolation[0]["status"], "fail", "{all:?}");
    let what = isolation[0]["what"].as_str().unwrap();
    assert!(what.contains("runner uid 64201"), "{what}");
    assert!(
        isolation[0]["remedy"]
            .as_str()
            .unwrap()
            .contains("chmod 600"),
        "{all:?}"
    );
}
