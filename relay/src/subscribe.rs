//! The reading side: `GET /subscribe/{name}` (a host's stream, bearer token), `POST
//! /subscribe/{name}/ack` and `GET /smee/{smee id}` (the smee form, whose id is its secret).
//! Every authentication failure gets the same 401, so neither a channel name nor a host can be
//! probed; a token is held as a secret only until its digest is taken.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use secrecy::SecretString;

use crate::state::{Relay, Reply, text};
use crate::stream::{self, Form};
use crate::{ids, sse, store};

/// An ack's body is `{"id": N}`; anything much bigger is not one.
const ACK_BODY_MAX: usize = 1024;

/// A bearer token from `Authorization`, if the header has that form.
fn bearer(headers: &HeaderMap) -> Option<SecretString> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty())
        .then(|| SecretString::from(token.to_owned()))
}

fn unauthorized() -> Reply {
    let mut reply = text(StatusCode::UNAUTHORIZED, "unauthorized\n");
    reply.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"rm-relay\""),
    );
    reply
}

/// Why a request is not served (the reply is built only when it is sent).
enum Refusal {
    /// 401, the same for every reason.
    Unauthorized,
    /// 503: the database could not answer.
    Unavailable,
    /// 400, with the reason.
    BadRequest(String),
}

impl Refusal {
    fn reply(self) -> Reply {
        match self {
            Refusal::Unauthorized => unauthorized(),
            Refusal::Unavailable => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the relay cannot read its database now\n",
            ),
            Refusal::BadRequest(why) => text(StatusCode::BAD_REQUEST, &format!("{why}\n")),
        }
    }
}

/// The host the request's token belongs to on `channel`, and the token's digest.
async fn authenticate(
    relay: &Relay,
    channel: &str,
    headers: &HeaderMap,
) -> Result<(String, String), Refusal> {
    let Some(token) = bearer(headers) else {
        return Err(Refusal::Unauthorized);
    };
    if !ids::is_valid_channel_name(channel) || !ids::is_token_shaped(&token) {
        return Err(Refusal::Unauthorized);
    }
    let digest = ids::token_digest(&token);
    drop(token);
    let (owned_channel, owned_digest) = (channel.to_owned(), digest.clone());
    match relay
        .store
        .read(move |conn| store::host_for_token(conn, &owned_channel, &owned_digest))
        .await
    {
        Ok(Some(host)) => Ok((host, digest)),
        Ok(None) => Err(Refusal::Unauthorized),
        Err(err) => {
            tracing::error!(error = %err, "cannot check a subscriber token");
            Err(Refusal::Unavailable)
        }
    }
}

fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, Refusal> {
    sse::parse_last_event_id(headers.get("last-event-id").map(|v| v.as_bytes()))
        .map_err(|err| Refusal::BadRequest(err.to_string()))
}

fn event_stream(body: stream::FrameBody) -> Reply {
    let mut reply = Response::new(body.boxed_unsync());
    let headers = reply.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    // nginx would otherwise buffer the stream and hold events back.
    headers.insert("x-accel-buffering", header::HeaderValue::from_static("no"));
    reply
}

/// `GET /subscribe/{name}`: from `Last-Event-ID` when given, else from the host's ack.
pub(crate) async fn subscribe(relay: Arc<Relay>, channel: &str, req: Request<Incoming>) -> Reply {
    let (host, digest) = match authenticate(&relay, channel, req.headers()).await {
        Ok(found) => found,
        Err(refusal) => return refusal.reply(),
    };
    let after = match last_event_id(req.headers()) {
        Ok(Some(id)) => id,
        Ok(None) => {
            let (owned_channel, owned_host) = (channel.to_owned(), host.clone());
            match relay
                .store
                .read(move |conn| store::acked(conn, &owned_channel, &owned_host))
                .await
            {
                Ok(id) => id,
                Err(err) => {
                    tracing::error!(error = %err, "cannot read a host's ack");
                    return Refusal::Unavailable.reply();
                }
            }
        }
        Err(refusal) => return refusal.reply(),
    };
    tracing::info!(%channel, %host, after, "subscriber connected");
    let body = stream::open(
        relay,
        channel.to_owned(),
        after,
        Form::Relay { host, digest },
    );
    event_stream(body)
}

/// `POST /subscribe/{name}/ack` with `{"id": N}`: 204, the host's ack is now max(old, N).
pub(crate) async fn ack(relay: &Relay, channel: &str, req: Request<Incoming>) -> Reply {
    let (host, _digest) = match authenticate(relay, channel, req.headers()).await {
        Ok(found) => found,
        Err(refusal) => return refusal.reply(),
    };
    let bad = || {
        text(
            StatusCode::BAD_REQUEST,
            "the body must be {\"id\": N}, N a delivery id\n",
        )
    };
    let Ok(body) = Limited::new(req.into_body(), ACK_BODY_MAX)
        .collect()
        .await
        .map(|b| b.to_bytes())
    else {
        return bad();
    };
    let Some(id) = parse_ack(&body) else {
        return bad();
    };
    let owned_channel = channel.to_owned();
    match relay
        .store
        .write(move |conn| store::record_ack(conn, &owned_channel, &host, id, rm_vocab::now()))
        .await
    {
        Ok(_) => {
            relay.metrics.ack();
            let mut reply = Response::new(http_body_util::Empty::<Bytes>::new().boxed_unsync());
            *reply.status_mut() = StatusCode::NO_CONTENT;
            reply
        }
        Err(err) => {
            tracing::error!(error = %err, "cannot record an ack");
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the relay cannot record acks now\n",
            )
        }
    }
}

/// The id of an ack body `{"id": N}` (other keys ignored); an array or anything else is not one.
fn parse_ack(body: &[u8]) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    i64::try_from(value.as_object()?.get("id")?.as_u64()?).ok()
}

/// `GET /smee/{smee id}`: the smee form. Like smee.io, it starts with new deliveries unless the
/// client sends `Last-Event-ID` (EventSource does when it reconnects).
pub(crate) async fn smee(relay: Arc<Relay>, smee_id: &str, req: Request<Incoming>) -> Reply {
    if !ids::is_channel_id_shaped(smee_id) {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    let last = match last_event_id(req.headers()) {
        Ok(last) => last,
        Err(refusal) => return refusal.reply(),
    };
    let id = smee_id.to_owned();
    let found = relay
        .store
        .read(move |conn| {
            let Some(channel) = store::channel_by_smee_id(conn, &id)? else {
                return Ok(None);
            };
            let after = match last {
                Some(after) => after,
                None => store::latest_id(conn, &channel)?,
            };
            Ok(Some((channel, after)))
        })
        .await;
    match found {
        Ok(Some((channel, after))) => {
            tracing::info!(%channel, after, "smee client connected");
            event_stream(stream::open(relay, channel, after, Form::Smee))
        }
        Ok(None) => text(StatusCode::NOT_FOUND, "not found\n"),
        Err(err) => {
            tracing::error!(error = %err, "cannot look up a smee id");
            Refusal::Unavailable.reply()
        }
    }
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_required() {
        let token = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            bearer(&headers).map(|t| t.expose_secret().to_owned())
        };
        assert_eq!(token("Bearer rmr_ab").as_deref(), Some("rmr_ab"));
        assert_eq!(token("bearer  rmr_ab ").as_deref(), Some("rmr_ab"));
        assert_eq!(token("Basic rmr_ab"), None);
        assert_eq!(token("Bearer "), None);
        assert_eq!(token("rmr_ab"), None);
        assert!(bearer(&HeaderMap::new()).is_none());
    }

    #[test]
    fn an_ack_body_is_an_object_with_a_non_negative_id() {
        assert_eq!(parse_ack(br#"{"id": 12}"#), Some(12));
        assert_eq!(parse_ack(br#"{"id": 0, "extra": true}"#), Some(0));
        for bad in [
            &br#"{"id": -1}"#[..],
            br#"{"id": "3"}"#,
            br#"{"id": 1.5}"#,
            b"{}",
            b"3",
            b"",
            br#"{"id": 9223372036854775808}"#,
            b"[1]",
        ] {
            assert_eq!(parse_ack(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
