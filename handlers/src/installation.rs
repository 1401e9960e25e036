//! `installation`: the App was installed, uninstalled, suspended or unsuspended, or the owner
//! accepted new permissions. Keeps the installations and their repository scope that the agent
//! polls and registers runners in.

use serde::Deserialize;

use crate::{Change, Delivery, Installation, Repository, Verdict, ignore_action, parse};

#[derive(Deserialize)]
struct Payload {
    action: String,
    installation: InstallationObject,
    repositories: Option<Vec<RepositoryObject>>,
}

#[derive(Deserialize)]
struct InstallationObject {
    id: i64,
    account: Option<Account>,
    repository_selection: Option<String>,
    suspended_at: Option<String>,
}

#[derive(Deserialize)]
struct Account {
    login: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct RepositoryObject {
    id: i64,
    full_name: String,
}

impl From<RepositoryObject> for Repository {
    fn from(repo: RepositoryObject) -> Self {
        Repository {
            id: repo.id,
            full_name: repo.full_name,
        }
    }
}

pub(crate) fn handle(delivery: &Delivery<'_>) -> Verdict {
    let payload: Payload = match parse(delivery.body) {
        Ok(payload) => payload,
        Err(rejection) => return rejection,
    };
    let id = payload.installation.id;
    let change = match payload.action.as_str() {
        "created" | "new_permissions_accepted" | "unsuspend" => {
            let account = payload.installation.account;
            Change::InstallationUpsert(Installation {
                id,
                account: account.as_ref().and_then(|a| a.login.clone()),
                account_type: account.and_then(|a| a.kind),
                repository_selection: payload.installation.repository_selection,
                // An `unsuspend` delivery still carries the old `suspended_at` in some payloads;
                // the action is what GitHub did.
                suspended: payload.action != "unsuspend"
                    && payload.installation.suspended_at.is_some(),
                repositories: payload
                    .repositories
                    .map(|repos| repos.into_iter().map(Repository::from).collect()),
            })
        }
        "suspend" => Change::InstallationSuspended {
            installation_id: id,
            suspended: true,
        },
        "deleted" => Change::InstallationRemoved {
            installation_id: id,
        },
        _ => return ignore_action(delivery.event, payload.action),
    };
    Verdict::Apply {
        action: Some(payload.action),
        changes: vec![change],
        note: None,
    }
}
