//! Every endpoint against the fake, and the error classes a caller acts on.

use std::time::Duration;

use rm_fake_github::FaultAction;
use rm_github::GithubError;
use rm_vocab::JobId;
use secrecy::ExposeSecret;

use crate::common::*;

#[tokio::test]
async fn app_endpoints_use_the_jwt_and_find_installations() {
    let h = harness().await;
    let app = h.client.app().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(app.id, APP_ID);
    let installations = h
        .client
        .list_installations()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<u64> = installations.iter().map(|i| i.id).collect();
    assert!(ids.contains(&h.org_installation) && ids.contains(&h.user_installation));
    assert_eq!(
        h.client.installation_for(&org()).await.ok(),
        Some(h.org_installation)
    );
    assert_eq!(
        h.client.installation_for(&repo()).await.ok(),
        Some(h.org_installation)
    );
    let user_repo = "alice/tool".parse().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.client.installation_for(&user_repo).await.ok(),
        Some(h.user_installation)
    );
    // Remembered: asking again costs nothing.
    let before = h.fake.requests().len();
    assert!(h.client.installation_for(&org()).await.is_ok());
    assert_eq!(h.fake.requests().len(), before);
    let unknown = rm_github::Target::Org("nobody".into());
    assert!(matches!(
        h.client.installation_for(&unknown).await,
        Err(GithubError::NotFound { .. })
    ));
    for r in h.fake.requests() {
        assert_eq!(
            r.header("authorization"),
            Some("Bearer <redacted>"),
            "{}",
            r.path
        );
        assert_eq!(r.header("x-github-api-version"), Some("2022-11-28"));
    }
}

#[tokio::test]
async fn runners_are_created_listed_fetched_and_deleted_for_both_target_kinds() {
    let h = harness().await;
    for (target, name) in [
        (org(), "rm-host-000000000001"),
        (repo(), "rm-host-000000000002"),
    ] {
        let jit = h
            .client
            .generate_jitconfig(&target, &jit_request(name))
            .await
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(jit.runner.name, name);
        assert!(!jit.encoded_jit_config.expose_secret().is_empty());
        assert!(!format!("{jit:?}").contains(jit.encoded_jit_config.expose_secret()));
        let listed = h
            .client
            .list_runners(&target)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            listed.value.iter().map(|r| r.id).collect::<Vec<_>>(),
            [jit.runner.id]
        );
        let got = h.client.get_runner(&target, jit.runner.id).await;
        assert_eq!(got.map(|r| r.status).ok().as_deref(), Some("offline"));
        h.client
            .delete_runner(&target, jit.runner.id)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            h.client.get_runner(&target, jit.runner.id).await,
            Err(GithubError::NotFound { .. })
        ));
        assert!(matches!(
            h.client.delete_runner(&target, jit.runner.id).await,
            Err(GithubError::NotFound { .. })
        ));
    }
    let sent = h.fake.requests();
    let jit_body = sent
        .iter()
        .find(|r| r.path.ends_with("generate-jitconfig"))
        .and_then(|r| r.body.clone())
        .unwrap_or_default();
    assert_eq!(jit_body["work_folder"], "_work");
    assert_eq!(jit_body["runner_group_id"], 1);
}

#[tokio::test]
async fn jit_errors_are_classified() {
    let h = harness().await;
    h.client
        .generate_jitconfig(&org(), &jit_request("taken"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let again = h
        .client
        .generate_jitconfig(&org(), &jit_request("taken"))
        .await;
    assert!(
        matches!(again, Err(GithubError::Conflict { .. })),
        "{again:?}"
    );
    // The way out of a 409: find the leftover by name and delete it.
    let leftover = h.client.find_runner_by_name(&org(), "taken").await;
    let leftover = leftover
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("not found"));
    h.client
        .delete_runner(&org(), leftover.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.client.find_runner_by_name(&org(), "taken").await.ok(),
        Some(None)
    );
    h.client
        .generate_jitconfig(&org(), &jit_request("taken"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut bad_group = jit_request("other");
    bad_group.runner_group_id = 99;
    let r = h.client.generate_jitconfig(&org(), &bad_group).await;
    // GitHub answers an unknown runner group with 404, a request it cannot take with 422.
    assert!(matches!(r, Err(GithubError::NotFound { .. })), "{r:?}");
    let mut no_labels = jit_request("other");
    no_labels.labels.clear();
    let r = h.client.generate_jitconfig(&org(), &no_labels).await;
    assert!(matches!(r, Err(GithubError::Unprocessable { .. })), "{r:?}");
    let gpu = h.fake.add_runner_group("acme", "gpu");
    let mut good_group = jit_request("other");
    good_group.runner_group_id = gpu;
    assert!(
        h.client
            .generate_jitconfig(&org(), &good_group)
            .await
            .is_ok()
    );
    let groups = h
        .client
        .list_runner_groups("acme")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(groups.iter().map(|g| g.id).collect::<Vec<_>>(), [1, gpu]);
}

#[tokio::test]
async fn a_missing_permission_is_forbidden_with_its_remedy() {
    let h = harness().await;
    h.fake
        .set_permissions(h.org_installation, &[("actions", "read")]);
    match h.client.generate_jitconfig(&org(), &jit_request("x")).await {
        Err(GithubError::Forbidden { remedy, .. }) => {
            assert!(remedy.contains("Self-hosted runners"), "{remedy}")
        }
        other => panic!("{other:?}"),
    }
    match h.client.list_runners(&repo()).await {
        Err(e @ GithubError::Forbidden { .. }) => assert!(e.to_string().contains("Administration")),
        other => panic!("{other:?}"),
    }
    // Actions: read is still there.
    assert!(
        h.client
            .list_workflow_runs("acme", "widgets", "queued")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn an_installation_shows_its_permissions() {
    let h = harness().await;
    let full = h
        .client
        .installation(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(full.id, h.org_installation);
    assert_eq!(
        full.permissions
            .get("organization_self_hosted_runners")
            .map(String::as_str),
        Some("write")
    );
    h.fake
        .set_permissions(h.org_installation, &[("actions", "read")]);
    let narrowed = h
        .client
        .installation(&repo())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(narrowed.permissions.len(), 1);
    assert_eq!(narrowed.suspended_at, None);
    // The id is remembered like `installation_for`'s.
    let before = h.fake.requests().len();
    assert_eq!(
        h.client.installation_for(&repo()).await.ok(),
        Some(h.org_installation)
    );
    assert_eq!(h.fake.requests().len(), before);
}

#[tokio::test]
async fn runs_and_jobs_are_listed_by_status() {
    let h = harness().await;
    let job_id = h
        .fake
        .queue_job("acme/widgets", "build", &["self-hosted", "linux"])
        .unwrap_or_else(|e| panic!("{e}"));
    let queued = h
        .client
        .list_workflow_runs("acme", "widgets", "queued")
        .await;
    let queued = queued.unwrap_or_else(|e| panic!("{e}")).value;
    assert_eq!(queued.len(), 1);
    let run_id = queued[0].id;
    let jobs = h.client.list_run_jobs("acme", "widgets", run_id).await;
    let jobs = jobs.unwrap_or_else(|e| panic!("{e}")).value;
    assert_eq!(
        jobs.iter().map(|j| j.id.get()).collect::<Vec<_>>(),
        [i64::try_from(job_id).unwrap()]
    );
    assert_eq!(jobs[0].labels, ["self-hosted", "linux"]);
    assert_eq!(jobs[0].runner_name, None);
    assert!(h.fake.complete_job(job_id, "cancelled"));
    let job = h
        .client
        .get_job("acme", "widgets", JobId::try_from(job_id).unwrap())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (job.status.as_str(), job.conclusion.as_deref()),
        ("completed", Some("cancelled"))
    );
    let still = h
        .client
        .list_workflow_runs("acme", "widgets", "queued")
        .await;
    assert!(still.unwrap_or_else(|e| panic!("{e}")).value.is_empty());
    assert!(matches!(
        h.client.get_job("acme", "widgets", JobId::new(1)).await,
        Err(GithubError::NotFound { .. })
    ));
}

#[tokio::test]
async fn polled_lists_reuse_etags_and_304s_cost_nothing() {
    let h = harness().await;
    let first = h
        .client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!first.not_modified);
    let second = h
        .client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(second.not_modified);
    assert_eq!(second.value, first.value);
    let polls: Vec<_> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path == "/orgs/acme/actions/runners")
        .collect();
    assert_eq!(
        polls.iter().map(|r| r.status).collect::<Vec<_>>(),
        [200, 304]
    );
    assert!(polls[0].header("if-none-match").is_none());
    assert!(polls[1].header("if-none-match").is_some());
    let core = h.client.budget().into_iter().find(|b| {
        b.scope == rm_github::Scope::Installation(h.org_installation) && b.resource == "core"
    });
    let core = core.unwrap_or_else(|| panic!("no budget line"));
    assert_eq!((core.charged, core.uncharged), (1, 1));
    // A change shows up on the next poll.
    h.client
        .generate_jitconfig(&org(), &jit_request("new"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let third = h
        .client
        .list_runners(&org())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!third.not_modified);
    assert_eq!(third.value.len(), 1);
}

#[tokio::test]
async fn installation_repositories_and_rate_limit() {
    let h = harness().await;
    let repos = h
        .client
        .list_installation_repositories(h.org_installation)
        .await;
    let names: Vec<String> = repos
        .unwrap_or_else(|e| panic!("{e}"))
        .value
        .into_iter()
        .map(|r| format!("{}/{}", r.owner.login, r.name))
        .collect();
    assert_eq!(names, ["acme/widgets"]);
    let overview = h
        .client
        .rate_limit(h.org_installation)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(overview.resources.contains_key("core"));
    assert_eq!(overview.rate.limit, 5000);
    let core = h.client.budget().into_iter().find(|b| {
        b.scope == rm_github::Scope::Installation(h.org_installation) && b.resource == "core"
    });
    let core = core.unwrap_or_else(|| panic!("no budget line"));
    assert_eq!(
        (core.charged, core.uncharged),
        (1, 1),
        "GET /rate_limit is free"
    );
    let registration = h.client.budget().into_iter().find(|b| {
        b.scope == rm_github::Scope::Installation(h.org_installation)
            && b.resource == "actions_runner_registration"
    });
    assert_eq!(
        registration.and_then(|b| b.limit),
        Some(5000),
        "seeded from /rate_limit"
    );
}

#[tokio::test]
async fn hook_deliveries_page_with_cursors_and_redeliver() {
    let h = harness().await;
    for i in 0..101 {
        h.fake
            .queue_job("acme/widgets", &format!("j{i}"), &["self-hosted"])
            .unwrap_or_else(|e| panic!("{e}"));
    }
    h.fake.settle().await.unwrap_or_else(|e| panic!("{e}"));
    let first = h
        .client
        .list_hook_deliveries(None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.deliveries.len(), 100);
    let cursor = first
        .next_cursor
        .clone()
        .unwrap_or_else(|| panic!("no next cursor"));
    let second = h.client.list_hook_deliveries(Some(&cursor)).await;
    let second = second.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second.deliveries.len(), 1);
    assert_eq!(second.next_cursor, None);
    let oldest = &second.deliveries[0];
    assert_eq!(oldest.event, "workflow_job");
    assert_ne!(oldest.status, "OK", "no webhook URL was configured");
    h.client
        .redeliver(oldest.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let newest = h
        .client
        .list_hook_deliveries(None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let again = &newest.deliveries[0];
    assert_eq!(again.guid, oldest.guid);
    assert_ne!(again.id, oldest.id, "a redelivery is a new attempt");
    assert!(matches!(
        h.client.redeliver(1).await,
        Err(GithubError::NotFound { .. })
    ));
}

#[tokio::test]
async fn server_errors_and_broken_connections_are_classified() {
    let h = harness_with("", Duration::from_millis(300)).await;
    h.fake
        .inject_fault(Some("GET"), "/app", FaultAction::Status(502), 1);
    assert!(matches!(
        h.client.app().await,
        Err(GithubError::Server { status: 502, .. })
    ));
    h.fake.inject_fault(None, "/app", FaultAction::Drop, 1);
    assert!(matches!(
        h.client.app().await,
        Err(GithubError::Unreachable { .. })
    ));
    h.fake.inject_fault(None, "/app", FaultAction::Hang, 1);
    assert!(matches!(
        h.client.app().await,
        Err(GithubError::Unreachable { .. })
    ));
    assert!(!h.client.contact().reachable);
    assert!(h.client.app().await.is_ok(), "faults are used up");
    assert!(h.client.contact().reachable);
    let counts = h.client.request_counts();
    assert!(counts.contains(&("app.get", 502, 1)), "{counts:?}");
    assert!(counts.contains(&("app.get", 0, 2)), "{counts:?}");
    // Nothing listening at all.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().map(|a| a.port()).unwrap_or(1)
    };
    let dead = client_for(
        format!("http://127.0.0.1:{port}"),
        Duration::from_secs(5),
        &h.clock,
    );
    assert!(matches!(
        dead.app().await,
        Err(GithubError::Unreachable { .. })
    ));
}

#[tokio::test]
async fn a_ghes_style_base_path_works() {
    let h = harness_with("/api/v3", Duration::from_secs(10)).await;
    assert!(h.fake.api_url().ends_with("/api/v3"));
    h.client
        .generate_jitconfig(&org(), &jit_request("ghes"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        h.client
            .list_runners(&org())
            .await
            .map(|l| l.value.len())
            .ok(),
        Some(1)
    );
    assert!(
        h.fake.requests().iter().all(|r| r.status < 400),
        "{:?}",
        h.fake.requests()
    );
    // Without the base path the fake does not answer, so the client really used it.
    let wrong = client_for(h.fake.server_url(), Duration::from_secs(5), &h.clock);
    assert!(matches!(
        wrong.app().await,
        Err(GithubError::NotFound { .. })
    ));
}
