//! Shared set-up for the client's tests: one App key per test binary, a fake GitHub with an
//! organization, a repository and a user, and a client on a manual clock pointed at it.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rm_fake_github::{AppKeyPair, FakeGithub, FakeOptions};
use rm_github::{ClientConfig, GithubClient};
use rm_vocab::ManualClock;

pub(crate) const APP_ID: u64 = 4242;

pub(crate) fn key() -> &'static AppKeyPair {
    static KEY: OnceLock<AppKeyPair> = OnceLock::new();
    KEY.get_or_init(|| AppKeyPair::generate().unwrap_or_else(|e| panic!("keygen: {e}")))
}

pub(crate) struct Harness {
    pub fake: FakeGithub,
    pub client: GithubClient,
    pub clock: ManualClock,
    pub org_installation: u64,
    pub user_installation: u64,
}

impl Harness {
    /// Moves the client's and the fake's clocks together.
    pub(crate) fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.fake.advance_clock(by);
    }

    /// Requests the fake has seen to paths containing `part`.
    pub(crate) fn seen(&self, part: &str) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.path.contains(part))
            .count()
    }
}

pub(crate) fn client_for(api_url: String, timeout: Duration, clock: &ManualClock) -> GithubClient {
    let config = ClientConfig {
        api_url,
        app_id: APP_ID,
        private_key_pem: key().private_pem.clone(),
        more_apps: Vec::new(),
        request_timeout: timeout,
        pacing: rm_github::pacing::Pacing::default(),
        pacing_wait_max: rm_github::budget::PACING_WAIT_MAX,
    };
    GithubClient::with_clock(config, Arc::new(clock.clone()))
        .unwrap_or_else(|e| panic!("client: {e:#}"))
}

/// A client on `clock` against `api_url` pacing by `pacing`, sleeping at most `wait_max` in
/// its budget (zero: every wait is refused with its time, for the test to move the clocks).
pub(crate) fn client_paced(
    api_url: String,
    clock: &ManualClock,
    pacing: rm_github::pacing::Pacing,
    wait_max: Duration,
) -> GithubClient {
    let config = ClientConfig {
        pacing,
        pacing_wait_max: wait_max,
        ..ClientConfig::new(api_url, APP_ID, key().private_pem.clone())
    };
    GithubClient::with_clock(config, Arc::new(clock.clone()))
        .unwrap_or_else(|e| panic!("client: {e:#}"))
}

pub(crate) async fn harness_with(base_path: &str, timeout: Duration) -> Harness {
    let mut options = FakeOptions::new(APP_ID, key().public_pem.clone());
    options.base_path = base_path.to_owned();
    let fake = FakeGithub::start(options)
        .await
        .unwrap_or_else(|e| panic!("fake: {e:#}"));
    let org_installation = fake.add_org("acme");
    fake.add_repo("acme/widgets");
    let user_installation = fake.add_user("alice");
    fake.add_repo("alice/tool");
    let clock = ManualClock::new();
    let client = client_for(fake.api_url(), timeout, &clock);
    Harness {
        fake,
        client,
        clock,
        org_installation,
        user_installation,
    }
}

pub(crate) async fn harness() -> Harness {
    harness_with("", Duration::from_secs(10)).await
}

pub(crate) fn jit_request(name: &str) -> rm_github::types::JitRequest {
    rm_github::types::JitRequest {
        name: name.to_owned(),
        runner_group_id: 1,
        labels: vec!["self-hosted".into(), "linux".into()],
        work_folder: "_work".into(),
    }
}

pub(crate) fn org() -> rm_github::Target {
    rm_github::Target::Org("acme".into())
}

pub(crate) fn repo() -> rm_github::Target {
    rm_github::Target::Repo {
        owner: "acme".into(),
        repo: "widgets".into(),
    }
}
