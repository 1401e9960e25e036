//! `POST /hooks/{ingest id}`: GitHub's delivery, stored with its exact bytes and the headers a
//! subscriber needs to verify and handle it, committed before the answer. The relay does not
//! know the webhook secret: subscribers verify the signature themselves.

use std::time::Duration;

use http::{HeaderMap, Request, StatusCode, header};
use hyper::body::Incoming;
use rm_http_serve::budget::{self, BUSY_RETRY_AFTER_SECS, BodyError, Refused};
use serde_json::{Map, Value};

use crate::limits::{QUOTA_RETRY_AFTER, retry_after_secs};
use crate::state::{Relay, Reply, json, text};
use crate::store::{self, Inserted, NewDelivery};

/// GitHub gives up on a delivery after 10 s; a body that takes longer is not GitHub's.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// GitHub's delivery GUIDs are 36 characters; anything much longer is not one.
const MAX_GUID_LEN: usize = 128;
/// Event names are short snake_case words.
const MAX_EVENT_LEN: usize = 64;
/// Headers kept besides every `x-github-*` one: the signatures, and what describes the body.
const KEPT_HEADERS: &[&str] = &[
    "x-hub-signature",
    "x-hub-signature-256",
    "content-type",
    "user-agent",
];

pub(crate) async fn ingest(relay: &Relay, ingest_id: &str, req: Request<Incoming>) -> Reply {
    let received_at_ms = rm_vocab::now();
    if !crate::ids::is_channel_id_shaped(ingest_id) {
        return refuse(relay, StatusCode::NOT_FOUND, "not found");
    }
    let id = ingest_id.to_owned();
    let channel = match relay
        .store
        .read(move |conn| store::channel_by_ingest_id(conn, &id))
        .await
    {
        Ok(Some(channel)) => channel,
        Ok(None) => return refuse(relay, StatusCode::NOT_FOUND, "not found"),
        Err(err) => {
            tracing::error!(error = %err, "cannot look up an ingest id");
            return refuse(
                relay,
                StatusCode::SERVICE_UNAVAILABLE,
                "the relay cannot take deliveries now",
            );
        }
    };
    let headers = req.headers();
    if header_str(headers, "x-github-event").is_none_or(|e| {
        e.len() > MAX_EVENT_LEN || !e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    }) {
        return refuse(
            relay,
            StatusCode::BAD_REQUEST,
            "X-GitHub-Event missing or malformed",
        );
    }
    let Some(guid) = header_str(headers, "x-github-delivery")
        .filter(|g| g.len() <= MAX_GUID_LEN && g.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
    else {
        return refuse(
            relay,
            StatusCode::BAD_REQUEST,
            "X-GitHub-Delivery missing or malformed",
        );
    };
    // Before the body is read: a flood costs neither the read nor the writer.
    if let Err(wait) = relay.take_ingest_token(&channel) {
        relay.metrics.limited("rate");
        tracing::debug!(%channel, "ingest rate exceeded");
        return retry_later(
            refuse(
                relay,
                StatusCode::TOO_MANY_REQUESTS,
                "this channel is over its ingest rate",
            ),
            wait,
        );
    }
    let max_body_bytes = relay.limits.max_body_bytes;
    let declared =
        header_str(headers, header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max_body_bytes as u64) {
        return too_large(relay);
    }
    let declared = declared.and_then(|len| usize::try_from(len).ok());
    let kept = kept_headers(headers);
    // Within the body budget the receiver uses (an allowance per request, one shared pool), so
    // uploads held open cannot grow the relay's memory past it; `_hold` keeps the body's share
    // until the delivery is stored and answered.
    let read = budget::read_body(&relay.bodies, req.into_body(), declared, max_body_bytes);
    let (body, _hold) = match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Err(_) => {
            return refuse(
                relay,
                StatusCode::REQUEST_TIMEOUT,
                "the body took too long to arrive",
            );
        }
        Ok(Err(BodyError::Refused(Refused::TooLarge))) => return too_large(relay),
        Ok(Err(BodyError::Refused(Refused::Busy))) => return busy(relay),
        Ok(Err(BodyError::Read)) => {
            return refuse(relay, StatusCode::BAD_REQUEST, "the body could not be read");
        }
        Ok(Ok((bytes, hold))) => (bytes::Bytes::from(bytes), hold),
    };
    let delivery = NewDelivery {
        channel: channel.clone(),
        guid: guid.clone(),
        received_at_ms,
        headers: kept,
        body,
    };
    let quota = relay.limits.channel_quota;
    match relay
        .store
        .write(move |conn| store::insert_delivery(conn, &delivery, quota))
        .await
    {
        Ok(Inserted::New { id, dropped }) => {
            relay.metrics.ingested(false);
            if dropped > 0 {
                relay.metrics.dropped(dropped);
                tracing::info!(%channel, dropped, "dropped the oldest acknowledged deliveries to stay within the channel's quota");
            }
            // Committed: wake every stream.
            relay.notify.send_replace(id);
            tracing::debug!(%channel, %guid, id, "delivery stored");
            json(StatusCode::ACCEPTED, &serde_json::json!({ "id": id }))
        }
        Ok(Inserted::Duplicate(id)) => {
            relay.metrics.ingested(true);
            tracing::debug!(%channel, %guid, id, "delivery already stored");
            json(StatusCode::OK, &serde_json::json!({ "id": id }))
        }
        Ok(Inserted::OverQuota) => {
            // Every stored delivery is still needed by some host: refusing is the only way
            // not to lose one. GitHub records a failed delivery; redelivery brings it back.
            relay.metrics.limited("quota");
            if relay.quota_warning_due(rm_vocab::now()) {
                tracing::warn!(%channel, %guid, "delivery refused: the channel's quota holds only deliveries a host has not acknowledged (a host that is away? revoke the tokens of hosts that are gone)");
            }
            retry_later(
                refuse(
                    relay,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "this channel's storage quota is full of unacknowledged deliveries",
                ),
                QUOTA_RETRY_AFTER,
            )
        }
        Err(err) => {
            // GitHub counts the delivery as failed; it (or the agent's redelivery) sends it again.
            tracing::error!(%channel, %guid, error = %err, "delivery not stored");
            refuse(
                relay,
                StatusCode::SERVICE_UNAVAILABLE,
                "the relay cannot take deliveries now",
            )
        }
    }
}

/// Adds `Retry-After` (whole seconds) to a refusal.
fn retry_later(mut reply: Reply, wait: Duration) -> Reply {
    reply.headers_mut().insert(
        header::RETRY_AFTER,
        header::HeaderValue::from(retry_after_secs(wait)),
    );
    reply
}

/// The body budget is spent: the upload is refused now (its bytes so far released) rather
/// than held, and told when to come back.
fn busy(relay: &Relay) -> Reply {
    relay.metrics.limited("memory");
    let mut reply = retry_later(
        refuse(
            relay,
            StatusCode::SERVICE_UNAVAILABLE,
            "too many bodies in flight; retry later",
        ),
        Duration::from_secs(u64::from(BUSY_RETRY_AFTER_SECS)),
    );
    // The rest of the body is not read: close instead of draining it.
    reply.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    reply
}

fn too_large(relay: &Relay) -> Reply {
    let mut reply = refuse(relay, StatusCode::PAYLOAD_TOO_LARGE, "body over 25 MiB");
    // The rest of the body is never read: close instead of draining it.
    reply.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    reply
}

fn refuse(relay: &Relay, status: StatusCode, detail: &str) -> Reply {
    relay.metrics.refused(status.as_u16());
    tracing::debug!(status = status.as_u16(), detail, "ingest refused");
    text(status, &format!("{detail}\n"))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

/// The headers stored with a delivery, names lowercased (as `http` keeps them): every
/// `x-github-*` and the [`KEPT_HEADERS`]. Nothing a proxy adds, nothing that describes the
/// connection. A header repeated keeps its first value; one that is not text is dropped.
fn kept_headers(headers: &HeaderMap) -> Map<String, Value> {
    let mut kept = Map::new();
    for (name, value) in headers {
        let name = name.as_str();
        if !(name.starts_with("x-github-") || KEPT_HEADERS.contains(&name))
            || kept.contains_key(name)
        {
            continue;
        }
        if let Ok(value) = value.to_str() {
            kept.insert(name.to_owned(), Value::String(value.to_owned()));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_github_signature_and_body_headers_are_kept() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("X-GitHub-Event", "workflow_job"),
            ("X-GitHub-Delivery", "72d3162e"),
            ("X-GitHub-Hook-Installation-Target-Type", "integration"),
            ("X-Hub-Signature", "sha1=aa"),
            ("X-Hub-Signature-256", "sha256=bb"),
            ("Content-Type", "application/json"),
            ("User-Agent", "GitHub-Hookshot/abc"),
            ("Host", "relay.example.net"),
            ("Content-Length", "2"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("Authorization", "Bearer x"),
        ] {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        headers.append("x-github-event", "second".parse().unwrap());
        let kept = kept_headers(&headers);
        let names: Vec<&str> = kept.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "user-agent",
                "x-github-delivery",
                "x-github-event",
                "x-github-hook-installation-target-type",
                "x-hub-signature",
                "x-hub-signature-256",
            ]
        );
        assert_eq!(kept["x-github-event"], "workflow_job");
    }
}
