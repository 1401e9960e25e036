//! The relay's stream, pure: what one `delivery` event carries (docs/relay.md: the headers as
//! rm-relay stored them and the exact body bytes in base64), and how long to wait before
//! reconnecting after a stream ends.

use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;

/// The first wait after a stream ends or a connection fails.
pub(crate) const RECONNECT_MIN: Duration = Duration::from_secs(1);
/// Waits double up to this.
pub(crate) const RECONNECT_MAX: Duration = Duration::from_secs(60);
/// A stream that lasted this long was healthy: the next wait starts again from the minimum.
pub(super) const HEALTHY_STREAM: Duration = Duration::from_secs(30);

/// The SSE event name rm-relay gives deliveries; other events (and comments) are ignored.
pub(super) const DELIVERY_EVENT: &str = "delivery";

/// Why an event's data could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum DecodeError {
    #[error("the event data is not the relay's delivery JSON: {0}")]
    Json(String),
    #[error("the body is not base64")]
    Base64,
    #[error("header {0:?} is not a valid HTTP header")]
    Header(String),
}

#[derive(Deserialize)]
struct Wire {
    headers: std::collections::BTreeMap<String, String>,
    body: String,
}

/// One delivery as the relay sent it: its headers and its exact body bytes.
#[derive(Debug)]
pub(super) struct Relayed {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Reads one `delivery` event's data.
pub(super) fn decode(data: &str) -> Result<Relayed, DecodeError> {
    let wire: Wire = serde_json::from_str(data).map_err(|e| DecodeError::Json(e.to_string()))?;
    let body = base64::engine::general_purpose::STANDARD
        .decode(wire.body.as_bytes())
        .map_err(|_| DecodeError::Base64)?;
    let mut headers = HeaderMap::new();
    for (name, value) in wire.headers {
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .ok()
            .zip(HeaderValue::from_str(&value).ok());
        let Some((name_value, value)) = parsed else {
            return Err(DecodeError::Header(name));
        };
        headers.insert(name_value, value);
    }
    Ok(Relayed { headers, body })
}

/// Reads an SSE `id` as the relay's delivery id.
pub(super) fn event_id(id: &str) -> Option<u64> {
    id.trim().parse().ok()
}

/// The waits between reconnections: doubling from [`RECONNECT_MIN`] to [`RECONNECT_MAX`], and
/// back to the minimum after a stream that stayed up for [`HEALTHY_STREAM`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: RECONNECT_MIN,
        }
    }
}

impl Backoff {
    /// The wait after a connection that stayed up for `lasted` (zero when it never opened).
    pub(crate) fn after(&mut self, lasted: Duration) -> Duration {
        if lasted >= HEALTHY_STREAM {
            self.next = RECONNECT_MIN;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(RECONNECT_MAX);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_keeps_its_exact_bytes_and_headers() {
        let body = b"{\"action\":\"queued\",\n \"x\": \"\\u00e9\"}\r\n".to_vec();
        let data = serde_json::json!({
            "headers": {"x-github-event": "workflow_job", "x-hub-signature-256": "sha256=00"},
            "body": base64::engine::general_purpose::STANDARD.encode(&body),
        })
        .to_string();
        let relayed = decode(&data).expect("decoded");
        assert_eq!(relayed.body, body);
        assert_eq!(relayed.headers["x-github-event"], "workflow_job");
        assert_eq!(relayed.headers["x-hub-signature-256"], "sha256=00");
    }

    #[test]
    fn broken_events_say_what_is_wrong() {
        assert!(matches!(decode("not json"), Err(DecodeError::Json(_))));
        assert_eq!(
            decode(r#"{"headers":{},"body":"***"}"#).map(|_| ()),
            Err(DecodeError::Base64)
        );
        assert_eq!(
            decode(r#"{"headers":{"bad name":"x"},"body":""}"#).map(|_| ()),
            Err(DecodeError::Header("bad name".into()))
        );
    }

    #[test]
    fn event_ids_are_decimal() {
        assert_eq!(event_id("42"), Some(42));
        assert_eq!(event_id(""), None);
        assert_eq!(event_id("4x"), None);
    }

    #[test]
    fn waits_double_to_the_cap_and_reset_after_a_healthy_stream() {
        let mut backoff = Backoff::default();
        let waits: Vec<_> = (0..8).map(|_| backoff.after(Duration::ZERO)).collect();
        assert_eq!(waits[0], RECONNECT_MIN);
        assert_eq!(waits[1], RECONNECT_MIN * 2);
        assert_eq!(*waits.last().expect("eight"), RECONNECT_MAX);
        assert_eq!(backoff.after(HEALTHY_STREAM), RECONNECT_MIN);
        assert_eq!(backoff.after(Duration::from_secs(1)), RECONNECT_MIN * 2);
    }
}
