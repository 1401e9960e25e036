//! Several Apps in one client: each App's JWT speaks for it alone, each installation's token is
//! minted with its own App's JWT, JIT registrations through any App's installation land on the
//! same target, and an App not installed on a target is left out of its registrations.

use std::sync::{Arc, OnceLock};

use rm_fake_github::AppKeyPair;
use rm_github::types::JitRequest;
use rm_github::{AppKey, ClientConfig, GithubClient, GithubError, Scope};

use crate::common::*;

/// The Apps beside the primary ([`APP_ID`]): the second and third are installed on `acme`, the
/// fourth nowhere.
const SECOND: u64 = 5001;
const THIRD: u64 = 5002;
const UNINSTALLED: u64 = 5003;

fn more_keys() -> &'static [AppKeyPair; 3] {
    static KEYS: OnceLock<[AppKeyPair; 3]> = OnceLock::new();
    KEYS.get_or_init(|| {
        std::array::from_fn(|_| AppKeyPair::generate().unwrap_or_else(|e| panic!("keygen: {e}")))
    })
}

struct Apps {
    h: Harness,
    client: GithubClient,
    second: u64,
    third: u64,
}

async fn apps() -> Apps {
    let h = harness().await;
    let keys = more_keys();
    let mut more_apps = Vec::new();
    for (app_id, key) in [SECOND, THIRD, UNINSTALLED].into_iter().zip(keys) {
        h.fake.add_app(app_id, key.public_pem.clone());
        more_apps.push(AppKey {
            app_id,
            private_key_pem: key.private_pem.clone(),
        });
    }
    let second = h.fake.install_app(SECOND, "acme");
    let third = h.fake.install_app(THIRD, "acme");
    let config = ClientConfig {
        more_apps,
        ..ClientConfig::new(h.fake.api_url(), APP_ID, key().private_pem.clone())
    };
    let client = GithubClient::with_clock(config, Arc::new(h.clock.clone()))
        .unwrap_or_else(|e| panic!("client: {e:#}"));
    Apps {
        h,
        client,
        second,
        third,
    }
}

fn request(name: &str) -> JitRequest {
    JitRequest {
        name: name.into(),
        runner_group_id: 1,
        labels: vec!["self-hosted".into()],
        work_folder: "_work".into(),
    }
}

#[tokio::test]
async fn every_app_s_installation_covering_a_target_registers_runners_on_it() {
    let a = apps().await;
    let h = &a.h;
    for app_id in [APP_ID, SECOND, THIRD, UNINSTALLED] {
        let app = a.client.app_by(app_id).await;
        assert_eq!(
            app.map(|app| app.id).ok(),
            Some(app_id),
            "App {app_id}'s JWT"
        );
    }
    let covering = a
        .client
        .registration_installations(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        covering,
        [h.org_installation, a.second, a.third],
        "the primary's first; the App installed nowhere is left out"
    );
    assert_eq!(a.client.app_of(a.third), Some(THIRD));
    // The repository inside the organization is covered the same way.
    let in_repo = a.client.registration_installations(&repo()).await;
    assert_eq!(in_repo.ok().map(|c| c.len()), Some(3));

    for (n, installation) in covering.iter().enumerate() {
        let jit = a
            .client
            .generate_jitconfig_in(*installation, &org(), &request(&format!("rm-h-{n:012x}")))
            .await;
        assert!(jit.is_ok(), "through {installation}: {jit:?}");
    }
    // Each token was minted with its own App's JWT (the fake refuses another App's), and each
    // registration counted against the installation that asked.
    let counts = h.fake.registrations_by_installation();
    for installation in &covering {
        assert_eq!(counts.get(installation), Some(&1), "{counts:?}");
    }
    assert_eq!(h.fake.runners().len(), 3, "all three on acme");
    assert_eq!(
        a.client.registration_counts(),
        [
            (APP_ID, h.org_installation, 1),
            (SECOND, a.second, 1),
            (THIRD, a.third, 1)
        ]
    );
    // The budget shows each App's JWT scope by the App's id.
    let scopes: Vec<String> = a
        .client
        .budget()
        .iter()
        .map(|b| b.scope.to_string())
        .collect();
    assert!(scopes.contains(&format!("app:{SECOND}")), "{scopes:?}");
    assert!(
        scopes.contains(&format!("installation:{}", a.third)),
        "{scopes:?}"
    );
    assert!(a.client.budget().iter().all(|b| b.scope != Scope::App(0)));
}

#[tokio::test]
async fn an_app_not_installed_is_asked_once_and_only_the_primary_s_absence_is_an_error() {
    let a = apps().await;
    let h = &a.h;
    let lookups = |app_path: &str| h.seen(app_path);
    let first = a.client.registration_installations(&org()).await;
    assert_eq!(first.map(|c| c.len()).ok(), Some(3));
    let asked = lookups("/orgs/acme/installation");
    let again = a.client.registration_installations(&org()).await;
    assert_eq!(again.map(|c| c.len()).ok(), Some(3));
    assert_eq!(
        lookups("/orgs/acme/installation"),
        asked,
        "known installations and a known absence cost no request"
    );
    // After the recheck interval the absent App is asked again (and may have been installed).
    h.advance(rm_github::client::ABSENT_RECHECK);
    let installed = h.fake.install_app(UNINSTALLED, "acme");
    let later = a.client.registration_installations(&org()).await;
    assert_eq!(later.ok().and_then(|c| c.last().copied()), Some(installed));

    // Only the primary covers alice's repository; nobody covers "nobody".
    let user_repo = "alice/tool".parse().unwrap_or_else(|e| panic!("{e}"));
    let alice = a.client.registration_installations(&user_repo).await;
    assert_eq!(alice.ok(), Some(vec![h.user_installation]));
    let nobody = rm_github::Target::Org("nobody".into());
    assert!(matches!(
        a.client.registration_installations(&nobody).await,
        Err(GithubError::NotFound { .. })
    ));
}
