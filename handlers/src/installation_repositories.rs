//! `installation_repositories`: repositories joined or left an installation that has selected
//! repositories. Keeps the repository scope the agent polls for an organization target.

use serde::Deserialize;

use crate::installation::RepositoryObject;
use crate::{Change, Delivery, Repository, Verdict, ignore_action, parse};

#[derive(Deserialize)]
struct Payload {
    action: String,
    installation: InstallationRef,
    #[serde(default)]
    repositories_added: Vec<RepositoryObject>,
    #[serde(default)]
    repositories_removed: Vec<RemovedRepository>,
}

#[derive(Deserialize)]
struct InstallationRef {
    id: i64,
}

#[derive(Deserialize)]
struct RemovedRepository {
    id: i64,
}

pub(crate) fn handle(delivery: &Delivery<'_>) -> Verdict {
    let payload: Payload = match parse(delivery.body) {
        Ok(payload) => payload,
        Err(rejection) => return rejection,
    };
    let installation_id = payload.installation.id;
    let mut changes = Vec::new();
    match payload.action.as_str() {
        "added" | "removed" => {
            // Both lists are applied whatever the action says: GitHub documents both on every
            // delivery, and an empty list changes nothing.
            if !payload.repositories_added.is_empty() {
                changes.push(Change::RepositoriesAdded {
                    installation_id,
                    repositories: payload
                        .repositories_added
                        .into_iter()
                        .map(Repository::from)
                        .collect(),
                });
            }
            if !payload.repositories_removed.is_empty() {
                changes.push(Change::RepositoriesRemoved {
                    installation_id,
                    repository_ids: payload.repositories_removed.iter().map(|r| r.id).collect(),
                });
            }
        }
        _ => return ignore_action(delivery.event, payload.action),
    }
    Verdict::Apply {
        action: Some(payload.action),
        changes,
        note: None,
    }
}
