//! `check`'s rules, and its package finding against the fake GitHub.

use std::collections::BTreeMap;

use rm_github::Target;
use rm_github::types::Installation;

use super::github::{actions_finding, host_prefix_collision, permission_finding};
use super::local::runner_package;
use super::*;
use rm_runner::package;

fn installation(permissions: &[(&str, &str)]) -> Installation {
    Installation {
        id: 7,
        account: None,
        permissions: permissions
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        suspended_at: None,
    }
}

#[test]
fn the_runner_permission_differs_by_target_kind() {
    let org = Target::Org("acme".into());
    let repo = Target::Repo {
        owner: "acme".into(),
        repo: "w".into(),
    };
    let org_only = installation(&[(ORG_RUNNER_PERMISSION, "write")]);
    assert_eq!(permission_finding(&org_only, &org).status, Status::Ok);
    let f = permission_finding(&org_only, &repo);
    assert_eq!(f.status, Status::Fail);
    assert!(f.what.contains("`administration: write`"), "{}", f.what);
    assert!(f.what.contains("has none"), "{}", f.what);
    assert!(f.remedy.contains("Administration"), "{}", f.remedy);

    let read = installation(&[(ORG_RUNNER_PERMISSION, "read")]);
    let f = permission_finding(&read, &org);
    assert_eq!(f.status, Status::Fail);
    assert!(
        f.what
            .contains("has `organization_self_hosted_runners: read`"),
        "{}",
        f.what
    );
}

#[test]
fn actions_read_is_a_warning_only() {
    assert_eq!(actions_finding(&installation(&[])).status, Status::Warn);
    assert_eq!(
        actions_finding(&installation(&[(ACTIONS_PERMISSION, "read")])).status,
        Status::Ok
    );
}

#[test]
fn only_failures_block() {
    let mut findings = vec![
        Finding::ok("config", "fine"),
        Finding::warn("config", "meh", "do x"),
    ];
    assert!(ready(&findings));
    findings.push(Finding::fail("app", "bad", "fix"));
    assert!(!ready(&findings));
}

#[tokio::test]
async fn a_runner_version_is_reported_missing_downloadable_or_cached() {
    use rm_fake_github::{FakeGithub, FakeOptions};
    let fake = FakeGithub::start(FakeOptions::new(1, String::new()))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rm-agent.toml");
    std::fs::write(
        &file,
        format!(
            "data_dir = \"{}\"\n[github]\napi_url = \"{}\"\n[runner]\nversion = \"2.330.0\"\n",
            dir.path().join("data").display(),
            fake.api_url()
        ),
    )
    .unwrap();
    let config = config::load(&config::Sources {
        explicit_file: Some(file),
        data_dir: None,
    })
    .unwrap();

    let missing = runner_package(&config).await.unwrap();
    assert_eq!(missing.status, Status::Fail);
    assert!(
        missing.what.contains("no actions/runner release v2.330.0"),
        "{}",
        missing.what
    );
    assert!(
        missing.remedy.contains("runner.package_dir"),
        "{}",
        missing.remedy
    );

    fake.publish_runner_release("2.330.0", vec![0; 3 * 1024 * 1024]);
    let downloadable = runner_package(&config).await.unwrap();
    assert_eq!(downloadable.status, Status::Ok);
    assert!(
        downloadable.what.contains("downloads actions-runner-")
            && downloadable.what.contains("(3 MiB)"),
        "{}",
        downloadable.what
    );
    assert!(
        !fake
            .requests()
            .iter()
            .any(|r| r.path.contains("/download/")),
        "check never downloads"
    );

    let wanted = crate::package::wanted(&config).unwrap().unwrap();
    let cached = dir.path().join("data/packages").join(wanted.name());
    std::fs::create_dir_all(cached.join("bin")).unwrap();
    std::fs::write(cached.join("bin/Runner.Listener"), b"").unwrap();
    std::fs::write(
        cached.join(package::cache::COMPLETE_MARKER),
        "ab".repeat(32),
    )
    .unwrap();
    fake.clear_requests();
    let found = runner_package(&config).await.unwrap();
    assert_eq!(found.status, Status::Ok);
    assert!(found.what.contains("cached at"), "{}", found.what);
    assert!(fake.requests().is_empty());
}

#[test]
fn agent_errors_split_into_problem_and_remedy() {
    assert_eq!(
        split_remedy("a: b is readable; run `chmod 600 b`"),
        (
            "a: b is readable".to_owned(),
            "run `chmod 600 b`".to_owned()
        )
    );
    assert_eq!(split_remedy("plain"), ("plain".to_owned(), String::new()));
}

#[test]
fn another_hosts_runners_under_this_hosts_prefix_are_a_warning() {
    let names: Vec<String> = [
        "rm-ci-0123456789ab",   // this host's own
        "rm-ci-2-aaaaaaaaaaaa", // host ci-2's
        "rm-ci-2-bbbbbbbbbbbb",
        "rm-ci-runner-cccccccccccc", // host ci-runner's
        "rm-ci2-dddddddddddd",       // host ci2: another prefix, no collision
        "rm-ci-manual",              // not rm's, but under the prefix
        "self-hosted-1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let finding = host_prefix_collision("ci", &names).expect("a collision");
    assert_eq!(finding.status, Status::Warn);
    assert_eq!(finding.check, "host_name");
    assert!(
        finding
            .what
            .contains("`ci` and `ci-2`, `ci-runner`, the runner `rm-ci-manual`"),
        "{}",
        finding.what
    );
    assert!(
        finding.what.contains("rm-ci-2-aaaaaaaaaaaa"),
        "{}",
        finding.what
    );
    assert!(finding.what.contains("ambiguous"), "{}", finding.what);
    assert!(!finding.what.contains("ci2"), "{}", finding.what);
    assert!(finding.remedy.contains("[host] name"), "{}", finding.remedy);

    // Only its own runners, or only other prefixes: nothing to say.
    let own = vec![
        "rm-ci-0123456789ab".to_owned(),
        "rm-ci2-dddddddddddd".to_owned(),
    ];
    assert!(host_prefix_collision("ci", &own).is_none());
    // Host ci-2 sees no collision with ci's runners: `rm-ci-` is not its prefix.
    assert!(host_prefix_collision("ci-2", &names[..2]).is_none());
}

#[test]
fn notifications_are_checked_only_when_configured_and_their_secrets_read() {
    use std::os::unix::fs::PermissionsExt as _;
    assert!(super::local::notifications(&crate::config::from_text("").unwrap()).is_none());
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("notify-secret");
    std::fs::write(&secret, "k3y\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = crate::config::from_text(&format!(
        "[[notifications.webhook]]\nurl = \"https://a.example/T0/s3cretpath\"\nsecret_file = \"{}\"\n[[notifications.webhook]]\nurl = \"http://10.0.0.5:9000/hook\"\n",
        secret.display()
    ))
    .unwrap();
    let finding = super::local::notifications(&config).unwrap();
    assert_eq!(
        (finding.check, finding.status),
        ("notifications", Status::Ok)
    );
    assert_eq!(
        finding.what,
        "webhook notifications to https://a.example (signed), http://10.0.0.5:9000 (unsigned)"
    );
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let finding = super::local::notifications(&config).unwrap();
    assert_eq!(finding.status, Status::Fail);
    assert!(
        finding
            .what
            .contains("notifications.webhook[0].secret_file"),
        "{}",
        finding.what
    );
    assert!(finding.remedy.contains("chmod 600"), "{}", finding.remedy);
}

/// With several Apps, `check` asks every further App's JWT and its installation on every
/// policy's target: one not installed on a target is a failure naming the App and the target,
/// one without the registration permission names both too, and one installed everywhere with
/// it passes.
#[tokio::test]
async fn every_app_is_checked_on_every_target_naming_the_app_and_target_that_fails() {
    use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
    let keys: Vec<AppKeyPair> = (0..3)
        .map(|_| AppKeyPair::generate().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let fake = FakeGithub::start(FakeOptions::new(1, keys[0].public_pem.clone()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fake.add_org("acme");
    fake.add_org("other");
    fake.add_repo("other/tool");
    for (app, key) in [(2, &keys[1]), (3, &keys[2])] {
        fake.add_app(app, key.public_pem.clone());
    }
    // App 2 everywhere; App 3 on acme only, and there without the runner permission.
    fake.install_app(2, "acme");
    fake.install_app(2, "other");
    let weak = fake.install_app(3, "acme");
    fake.set_permissions(weak, &[("actions", "read")]);
    let config = crate::config::from_text(&format!(
        "[github]\napi_url = {:?}\n\
         [[policy]]\nname = \"org\"\ntarget = \"acme\"\nlabels = [\"self-hosted\"]\n\
         [[policy]]\nname = \"repo\"\ntarget = \"other/tool\"\nlabels = [\"self-hosted\"]\n",
        fake.api_url()
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let client = rm_github::GithubClient::new(rm_github::ClientConfig {
        more_apps: [(2, &keys[1]), (3, &keys[2])]
            .into_iter()
            .map(|(app_id, key)| rm_github::AppKey {
                app_id,
                private_key_pem: key.private_pem.clone(),
            })
            .collect(),
        ..rm_github::ClientConfig::new(fake.api_url(), 1, keys[0].private_pem.clone())
    })
    .unwrap_or_else(|e| panic!("{e:#}"));

    let findings = super::github::more_app_findings(&client, &config).await;
    let failed: Vec<&str> = findings
        .iter()
        .filter(|f| f.status == Status::Fail)
        .map(|f| f.what.as_str())
        .collect();
    assert_eq!(failed.len(), 2, "{findings:#?}");
    assert!(
        failed
            .iter()
            .any(|w| w.starts_with("App 3 is not installed on other/tool")),
        "{failed:?}"
    );
    assert!(
        failed
            .iter()
            .any(|w| w.starts_with("App 3: runner registration on the organization acme")),
        "{failed:?}"
    );
    let missing = findings
        .iter()
        .find(|f| f.what.starts_with("App 3 is not installed"))
        .map(|f| f.remedy.as_str())
        .unwrap_or_default();
    assert!(missing.contains("install App 3 on other/tool"), "{missing}");
    // App 2: its JWT, then installed with the permission on both targets.
    let app_2: Vec<Status> = findings
        .iter()
        .filter(|f| f.what.contains("App 2") || f.what.contains("(id 2)"))
        .map(|f| f.status)
        .collect();
    assert_eq!(app_2, [Status::Ok; 5], "{findings:#?}");
}

/// A policy serving an enterprise scale set is checked with the enterprise's PAT (a
/// registration-token request), not the App: no installation is looked up on its target; a
/// refused PAT fails `enterprise_token`, saying so and what the token needs, never its text.
#[tokio::test]
async fn an_enterprise_scale_set_is_checked_with_its_pat_not_the_app() {
    use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
    use std::os::unix::fs::PermissionsExt as _;
    let key = AppKeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
    let fake = FakeGithub::start(FakeOptions::new(1, key.public_pem.clone()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    fake.add_org("acme");
    fake.set_enterprise_pat("octo", "ghp_enterprise_pat");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pat = dir.path().join("enterprise.pat");
    let config = crate::config::from_text(&format!(
        "[github]\napi_url = {:?}\n\
         [[policy]]\nname = \"ent\"\ntarget = \"elsewhere\"\nlabels = [\"ent\"]\n\
         [[scale_set]]\nname = \"ent\"\npolicy = \"ent\"\nenterprise = \"octo\"\ntoken_file = {:?}\n",
        fake.api_url(),
        pat.display().to_string()
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let client_config = || rm_github::ClientConfig::new(fake.api_url(), 1, key.private_pem.clone());
    // (the file's text, the finding's status, words in it)
    let cases = [
        (
            "ghp_enterprise_pat\n",
            Status::Ok,
            "GitHub issued a registration token",
        ),
        ("ghp_wrong_pat\n", Status::Fail, "GitHub refused the PAT"),
    ];
    for (text, status, words) in cases {
        std::fs::write(&pat, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&pat, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        fake.clear_requests();
        let findings = super::github::github(&config, client_config()).await;
        let ours: Vec<&Finding> = findings
            .iter()
            .filter(|f| f.policy.as_deref() == Some("ent"))
            .collect();
        assert_eq!(ours.len(), 1, "{findings:#?}");
        assert_eq!(ours[0].check, "enterprise_token", "{findings:#?}");
        assert_eq!(ours[0].status, status, "{findings:#?}");
        assert!(ours[0].what.contains(words), "{}", ours[0].what);
        if status == Status::Fail {
            assert!(
                ours[0].remedy.contains("manage_runners:enterprise"),
                "{}",
                ours[0].remedy
            );
        }
        assert!(
            !format!("{findings:?}").contains("ghp_"),
            "a PAT in the findings"
        );
        let looked_up: Vec<String> = fake
            .requests()
            .into_iter()
            .map(|r| r.path)
            .filter(|p| p.contains("elsewhere") || p.contains("/access_tokens"))
            .collect();
        assert!(looked_up.is_empty(), "App requests: {looked_up:?}");
    }
}
