//! A webhook notification's bytes (CONTRACT §10): one JSON object per event, the same bytes to
//! every endpoint, and the signature over them GitHub's way (`sha256=` + hex HMAC-SHA256 of the
//! exact body), so a receiver's `X-Hub-Signature-256` verifier checks `X-Rm-Signature-256` as
//! it is. Pure: the time and the host are given.

use std::time::SystemTime;

use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use super::OperatorEvent;

/// The prefix of `X-Rm-Signature-256`, as GitHub writes its own.
const SIGNATURE_PREFIX: &str = "sha256=";

/// A body's common keys, in this order, then the event's own fields (by name: a JSON map).
#[derive(serde::Serialize)]
struct Body<'a> {
    event: &'static str,
    host: &'a str,
    at: String,
    summary: String,
    detail: String,
    #[serde(flatten)]
    fields: Map<String, Value>,
}

/// The body for `event`, which happened on `host` at `at`: `event` (the kind's name), `host`,
/// `at` (RFC 3339, UTC, milliseconds), `summary` and `detail` (the desktop notification's two
/// lines), then the event's own fields ([`fields`]), which never take one of those names.
pub(crate) fn body(event: &OperatorEvent, host: &str, at: SystemTime) -> Vec<u8> {
    let (summary, detail) = event.message();
    let body = Body {
        event: event.kind().name(),
        host,
        at: rm_vocab::UnixMs::from_system_time(at).to_rfc3339(),
        summary,
        detail,
        fields: fields(event),
    };
    // Serializing strings, numbers and a map of them cannot fail; an empty body would be
    // refused by any receiver rather than pass for an event.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// What an event says beyond its kind, under the names the contract gives them. A new event's
/// fields are added here, and to CONTRACT §10.
fn fields(event: &OperatorEvent) -> Map<String, Value> {
    let pairs = match event {
        OperatorEvent::WebhooksStopped | OperatorEvent::CredentialsRejected => Vec::new(),
        OperatorEvent::RunnersFailingToStart { policy, failures } => {
            vec![("policy", json!(policy)), ("failures", json!(failures))]
        }
        OperatorEvent::DemandWaitingAtCapacity { policy, waiting } => {
            vec![("policy", json!(policy)), ("waiting", json!(waiting))]
        }
        OperatorEvent::HostUnfit { problems } => vec![("problems", json!(problems))],
        // GitHub's refusal, if any, is in the common `detail` (the message's second line).
        OperatorEvent::JobRerun {
            policy,
            job_id,
            reason,
            result,
            ..
        } => vec![
            ("policy", json!(policy)),
            ("job_id", json!(job_id)),
            ("reason", json!(reason)),
            ("result", json!(result)),
        ],
        OperatorEvent::RunnerFailed {
            policy,
            runner_name,
            job_id,
            reason,
            ..
        } => vec![
            ("policy", json!(policy)),
            ("runner_name", json!(runner_name)),
            ("job_id", json!(job_id)),
            ("reason", json!(reason)),
        ],
        OperatorEvent::ScaleSetBackingOff { scale_set, reason } => {
            vec![("scale_set", json!(scale_set)), ("reason", json!(reason))]
        }
    };
    pairs
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

/// `X-Rm-Signature-256` for `body` under `secret`.
pub(crate) fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it, and an empty
    // signature would be refused by any verifier rather than pass.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return String::new();
    };
    mac.update(body);
    format!(
        "{SIGNATURE_PREFIX}{}",
        hex::encode(mac.finalize().into_bytes())
    )
}
