//! What makes a delivery acceptable, whichever way it arrived: its headers (content type, event,
//! delivery GUID, signature) and then its signature over the exact body bytes. The HTTP receiver
//! and the agent's relay subscription both use it, so a relayed delivery is held to exactly the
//! receiver's rules.

use http::{HeaderMap, HeaderValue, StatusCode};
use rm_journal::Incoming;
use rm_vocab::Source;

use crate::WebhookSecrets;
use rm_vocab::UnixMs;

/// GitHub's delivery GUIDs are 36 characters; anything much longer is not one.
const MAX_GUID_LEN: usize = 128;
/// Event names are short snake_case words.
const MAX_EVENT_LEN: usize = 64;

/// The headers journalled with each delivery: enough to verify it again and to relay it
/// byte-exact, nothing a proxy might have added.
const KEPT_HEADERS: &[&str] = &[
    "content-type",
    "user-agent",
    "x-github-event",
    "x-github-delivery",
    "x-github-hook-id",
    "x-github-hook-installation-target-type",
    "x-github-hook-installation-target-id",
    "x-github-enterprise-version",
    "x-github-enterprise-host",
    "x-hub-signature-256",
];

/// Why a delivery is not accepted: the HTTP status the receiver answers, a stable reason for
/// metrics, and a detail for the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub reason: &'static str,
    pub detail: &'static str,
}

impl Refusal {
    const fn new(status: StatusCode, reason: &'static str, detail: &'static str) -> Self {
        Self {
            status,
            reason,
            detail,
        }
    }
}

/// A delivery whose headers are in order and whose body is still to be checked.
#[derive(Debug)]
pub struct Envelope {
    pub event: String,
    pub guid: String,
    signature: HeaderValue,
    kept: Vec<(String, String)>,
}

/// Checks a delivery's headers. The receiver calls it before reading the body, so a request that
/// can never be accepted costs no body read.
pub fn envelope(headers: &HeaderMap) -> Result<Envelope, Refusal> {
    if !is_json(headers) {
        return Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content_type",
            "Content-Type must be application/json (set the App's webhook content type to JSON)",
        ));
    }
    let event = header_str(headers, "x-github-event")
        .filter(|e| {
            e.len() <= MAX_EVENT_LEN && e.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
        .ok_or(Refusal::new(
            StatusCode::BAD_REQUEST,
            "event_header",
            "X-GitHub-Event missing or malformed",
        ))?;
    let guid = header_str(headers, "x-github-delivery")
        .filter(|g| g.len() <= MAX_GUID_LEN && g.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or(Refusal::new(
            StatusCode::BAD_REQUEST,
            "delivery_header",
            "X-GitHub-Delivery missing or malformed",
        ))?;
    let signature = headers
        .get("x-hub-signature-256")
        .cloned()
        .ok_or(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "signature_missing",
            "X-Hub-Signature-256 missing",
        ))?;
    Ok(Envelope {
        event: event.to_owned(),
        guid: guid.to_owned(),
        signature,
        kept: kept_headers(headers),
    })
}

impl Envelope {
    /// The delivery ready for the journal, if `body` is signed by one of `secrets`.
    pub fn verify(
        self,
        secrets: &WebhookSecrets,
        body: Vec<u8>,
        received_at_ms: UnixMs,
        source: Source,
    ) -> Result<Incoming, Refusal> {
        if !secrets.verify(self.signature.as_bytes(), &body) {
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "signature_mismatch",
                "signature does not match",
            ));
        }
        Ok(Incoming {
            guid: self.guid,
            event: self.event,
            headers: self.kept,
            body,
            received_at_ms,
            source,
        })
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

fn is_json(headers: &HeaderMap) -> bool {
    header_str(headers, "content-type").is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
    })
}

fn kept_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    KEPT_HEADERS
        .iter()
        .filter_map(|name| header_str(headers, name).map(|v| ((*name).to_owned(), v.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use secrecy::SecretString;

    use super::*;

    fn secrets() -> WebhookSecrets {
        WebhookSecrets::new(vec![SecretString::from("s3cret")]).expect("one secret")
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("header value"));
        }
        map
    }

    fn signed(body: &[u8]) -> HeaderMap {
        headers(&[
            ("content-type", "application/json"),
            ("x-github-event", "workflow_job"),
            ("x-github-delivery", "d-1"),
            ("x-hub-signature-256", &crate::sign(b"s3cret", body)),
            ("x-forwarded-for", "10.0.0.1"),
        ])
    }

    #[test]
    fn a_signed_delivery_keeps_only_the_known_headers() {
        let body = br#"{"action":"queued"}"#.to_vec();
        let incoming = envelope(&signed(&body))
            .and_then(|e| e.verify(&secrets(), body.clone(), UnixMs::new(7), Source::Relay))
            .expect("accepted");
        assert_eq!(incoming.guid, "d-1");
        assert_eq!(incoming.event, "workflow_job");
        assert_eq!(incoming.body, body);
        assert_eq!(incoming.source, Source::Relay);
        assert!(incoming.headers.iter().all(|(n, _)| n != "x-forwarded-for"));
        assert!(
            incoming
                .headers
                .iter()
                .any(|(n, _)| n == "x-hub-signature-256")
        );
    }

    #[test]
    fn each_header_problem_has_its_own_refusal() {
        let body = b"{}";
        let mut cases = Vec::new();
        let mut wrong_type = signed(body);
        wrong_type.insert("content-type", HeaderValue::from_static("text/plain"));
        cases.push((wrong_type, "content_type"));
        let mut no_event = signed(body);
        no_event.remove("x-github-event");
        cases.push((no_event, "event_header"));
        let mut bad_event = signed(body);
        bad_event.insert("x-github-event", HeaderValue::from_static("work flow"));
        cases.push((bad_event, "event_header"));
        let mut no_guid = signed(body);
        no_guid.remove("x-github-delivery");
        cases.push((no_guid, "delivery_header"));
        let mut no_signature = signed(body);
        no_signature.remove("x-hub-signature-256");
        cases.push((no_signature, "signature_missing"));
        for (headers, reason) in cases {
            assert_eq!(envelope(&headers).map(|_| ()).unwrap_err().reason, reason);
        }
    }

    #[test]
    fn a_body_changed_by_one_byte_is_refused() {
        let refusal = envelope(&signed(b"{\"a\":1}"))
            .and_then(|e| {
                e.verify(
                    &secrets(),
                    b"{\"a\":2}".to_vec(),
                    UnixMs::new(0),
                    Source::Relay,
                )
            })
            .map(|_| ())
            .unwrap_err();
        assert_eq!(refusal.reason, "signature_mismatch");
        assert_eq!(refusal.status, StatusCode::UNAUTHORIZED);
    }
}
