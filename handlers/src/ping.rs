//! `ping`: GitHub's hello when a webhook is created or the App's webhook URL changes. Nothing
//! changes; the journal notes which hook and App said hello, which is what an operator checks
//! when setting rm up.

use serde::Deserialize;

use crate::{Delivery, Verdict, parse};

#[derive(Deserialize)]
struct Payload {
    hook_id: Option<i64>,
    hook: Option<Hook>,
}

#[derive(Deserialize)]
struct Hook {
    app_id: Option<i64>,
    #[serde(default)]
    events: Vec<String>,
}

pub(crate) fn handle(delivery: &Delivery<'_>) -> Verdict {
    let payload: Payload = match parse(delivery.body) {
        Ok(payload) => payload,
        Err(rejection) => return rejection,
    };
    let hook_id = payload
        .hook_id
        .map_or_else(|| "?".to_owned(), |id| id.to_string());
    let mut note = format!("ping from hook {hook_id}");
    if let Some(hook) = payload.hook {
        if let Some(app_id) = hook.app_id {
            note.push_str(&format!(" of App {app_id}"));
        }
        if !hook.events.is_empty() && !hook.events.iter().any(|e| e == "workflow_job" || e == "*") {
            note.push_str("; warning: the hook does not subscribe to `workflow_job`");
        }
    }
    Verdict::Apply {
        action: None,
        changes: Vec::new(),
        note: Some(note),
    }
}
