//! The exact bytes of the Server-Sent Events the relay writes, for both forms of a channel's
//! stream: the relay form (`/subscribe/NAME`, for rm-agent: the body base64, byte-exact) and the
//! smee form (`/smee/ID`, what smee.io sends: the headers as keys and the body parsed). Pure:
//! a stored delivery in, one event's bytes out.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use rm_vocab::UnixMs;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A delivery as stored: the id is the event id on every stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDelivery {
    pub id: i64,
    pub received_at_ms: UnixMs,
    /// The kept request headers, names lowercased.
    pub headers: Map<String, Value>,
    /// The exact body bytes GitHub sent.
    pub body: Vec<u8>,
}

/// Written on a stream that has had nothing else to say for a while, so proxies and NAT
/// mappings keep the connection open; SSE clients ignore comment lines.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";

/// smee.io's first event on a new stream; it carries no id, so a client's `Last-Event-ID`
/// stays the last delivery it saw.
pub const SMEE_READY: &[u8] = b"event: ready\ndata: {}\n\n";

/// smee.io's keepalive (an event `smee-client` ignores: it only forwards `message` events).
pub const SMEE_PING: &[u8] = b"event: ping\ndata: {}\n\n";

/// One delivery on the relay form:
/// `id: N`, `event: delivery`, `data: {"headers": {...}, "body": "<standard base64>"}`.
pub fn delivery_event(delivery: &StoredDelivery) -> Bytes {
    let data = serde_json::json!({
        "headers": delivery.headers,
        "body": STANDARD.encode(&delivery.body),
    });
    // serde_json escapes CR and LF inside strings, so `data` is one line as SSE needs.
    Bytes::from(format!(
        "id: {}\nevent: delivery\ndata: {data}\n\n",
        delivery.id
    ))
}

/// One delivery on the smee form, as smee.io sends it: a `message` event (no `event:` field)
/// whose data is the headers as keys plus `body`, `query` (always `{}`: the relay's ingest takes
/// no query) and `timestamp` (ms since the epoch, when the relay received it).
///
/// `body` is the stored JSON body embedded as it came ([`smee_body`]), never parsed into a map
/// and written again: a map would reorder the keys, and smee-client's `JSON.stringify` of what
/// it parses keeps the order it was given, so only the order as sent gives its target bytes
/// that still match GitHub's signature.
pub fn smee_event(delivery: &StoredDelivery) -> Bytes {
    #[derive(serde::Serialize)]
    struct Data<'a> {
        #[serde(flatten)]
        headers: &'a Map<String, Value>,
        body: &'a RawValue,
        query: Map<String, Value>,
        timestamp: i64,
    }
    let body = smee_body(&delivery.body);
    let data = Data {
        headers: &delivery.headers,
        body: &body,
        query: Map::new(),
        timestamp: delivery.received_at_ms.get(),
    };
    // Serialising a map of strings, a checked raw value and numbers cannot fail; an empty
    // object keeps the event well-formed should it ever.
    let data = serde_json::to_string(&data).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!("id: {}\ndata: {data}\n\n", delivery.id))
}

/// The `body` of a smee event: a JSON body's own text, checked to be one JSON value, with any
/// CR or LF turned into a space so the event's `data` stays one line (in valid JSON a raw CR or
/// LF can only be whitespace between tokens: inside strings they are escaped, so the document
/// and its key order are unchanged). A body that is not JSON (or not UTF-8) is given as a JSON
/// string of its text: smee-client can only forward JSON as it was sent.
pub fn smee_body(body: &[u8]) -> Box<RawValue> {
    let text = match serde_json::from_slice::<&RawValue>(body) {
        Ok(raw) if !raw.get().contains(['\r', '\n']) => return raw.to_owned(),
        Ok(raw) => raw.get().replace(['\r', '\n'], " "),
        Err(_) => {
            // A JSON string of the text: `Value::String`'s serialisation escapes everything.
            Value::String(String::from_utf8_lossy(body).into_owned()).to_string()
        }
    };
    RawValue::from_string(text).unwrap_or_else(|_| {
        // Unreachable: both texts above are valid JSON. `null` keeps the event well-formed.
        RawValue::NULL.to_owned()
    })
}

/// A `Last-Event-ID` that is not a delivery id.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("Last-Event-ID must be a delivery id (a non-negative integer)")]
pub struct BadLastEventId;

/// Reads a `Last-Event-ID` header: absent or empty means "none" (EventSource sends an empty one
/// before it has seen an id), otherwise a non-negative integer.
pub fn parse_last_event_id(value: Option<&[u8]>) -> Result<Option<i64>, BadLastEventId> {
    let Some(value) = value else {
        return Ok(None);
    };
    let text = std::str::from_utf8(value)
        .map_err(|_| BadLastEventId)?
        .trim();
    if text.is_empty() {
        return Ok(None);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadLastEventId);
    }
    text.parse::<i64>().map(Some).map_err(|_| BadLastEventId)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(body: &[u8]) -> StoredDelivery {
        let mut headers = Map::new();
        headers.insert("x-github-event".into(), "ping".into());
        headers.insert("x-hub-signature-256".into(), "sha256=ab".into());
        StoredDelivery {
            id: 7,
            received_at_ms: UnixMs::new(1_700_000_000_123),
            headers,
            body: body.to_vec(),
        }
    }

    #[test]
    fn the_relay_form_carries_the_exact_bytes_in_base64_on_one_data_line() {
        let body = b"{\"zen\":\"a\\nb\"}\n\xff";
        let event = delivery_event(&delivery(body));
        assert_eq!(
            std::str::from_utf8(&event).unwrap(),
            concat!(
                "id: 7\nevent: delivery\n",
                "data: {\"body\":\"eyJ6ZW4iOiJhXG5iIn0K/w==\",\"headers\":{\"x-github-event\":\"ping\",",
                "\"x-hub-signature-256\":\"sha256=ab\"}}\n\n"
            )
        );
        let data: Value = serde_json::from_str(
            std::str::from_utf8(&event).unwrap().lines().nth(2).unwrap()[6..].trim(),
        )
        .unwrap();
        let decoded = STANDARD.decode(data["body"].as_str().unwrap()).unwrap();
        assert_eq!(decoded, body);
    }

    #[test]
    fn the_smee_form_has_headers_as_keys_the_parsed_body_query_and_timestamp() {
        let event = delivery_event_text(smee_event(&delivery(b"{\"zen\": \"x\"}")));
        assert!(event.starts_with("id: 7\ndata: {"), "{event}");
        assert!(
            !event.contains("event:"),
            "a message event has no event field"
        );
        assert!(event.ends_with("}\n\n"));
        let data: Value = serde_json::from_str(&event["id: 7\ndata: ".len()..]).unwrap();
        assert_eq!(
            data,
            serde_json::json!({
                "x-github-event": "ping",
                "x-hub-signature-256": "sha256=ab",
                "body": {"zen": "x"},
                "query": {},
                "timestamp": 1_700_000_000_123i64,
            })
        );
        let text = delivery_event_text(smee_event(&delivery(b"payload=%7B%7D")));
        assert!(text.contains("\"body\":\"payload=%7B%7D\""), "{text}");
    }

    #[test]
    fn the_smee_form_embeds_a_json_body_as_it_came_keys_in_their_order() {
        // Compact, raw UTF-8 and keys out of alphabetical order, as GitHub sends.
        let body = r#"{"action":"queued","workflow_job":{"name":"bäu ✓","id":1.50,"labels":["z","a"]},"repository":{},"installation":{"id":7}}"#;
        let event = delivery_event_text(smee_event(&delivery(body.as_bytes())));
        assert!(
            event.contains(&format!(r#","body":{body},"query":{{}},"#)),
            "{event}"
        );
        // Line breaks between tokens become spaces: `data` stays one line, the document and
        // its key order unchanged.
        let pretty = b"{\r\n  \"z\": \"a\\nb\",\n  \"a\": [1,\n2]\n}\n";
        let event = delivery_event_text(smee_event(&delivery(pretty)));
        assert_eq!(event.matches('\n').count(), 3, "{event:?}");
        assert!(
            event.contains(r#""body":{    "z": "a\nb",   "a": [1, 2] },"#),
            "{event:?}"
        );
        // Not JSON, or not UTF-8: a JSON string of the text.
        assert_eq!(smee_body(br#"{"a":"#).get(), r#""{\"a\":""#);
        assert_eq!(smee_body(b"a\nb\xff").get(), "\"a\\nb\u{fffd}\"");
    }

    fn delivery_event_text(bytes: Bytes) -> String {
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn last_event_id_is_absent_empty_or_a_non_negative_integer() {
        assert_eq!(parse_last_event_id(None), Ok(None));
        assert_eq!(parse_last_event_id(Some(b"")), Ok(None));
        assert_eq!(parse_last_event_id(Some(b"0")), Ok(Some(0)));
        assert_eq!(parse_last_event_id(Some(b" 42 ")), Ok(Some(42)));
        for bad in [
            &b"-1"[..],
            b"+1",
            b"1.5",
            b"x",
            b"99999999999999999999",
            b"\xff",
        ] {
            assert_eq!(
                parse_last_event_id(Some(bad)),
                Err(BadLastEventId),
                "{bad:?}"
            );
        }
    }
}
