//! The pass-through of results-service calls this service does not serve (artifacts, anything
//! but the cache) to [`crate::Settings::upstream`]: method, path, query, headers (the job's
//! `Authorization` included) and body go as they came, streamed both ways; only hop-by-hop
//! headers are dropped and `Host` is the upstream's. TLS is rustls with the host's roots.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, Uri};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::CacheError;
use crate::server::{BoxBody, Fail};

/// A connection to the upstream not made by then fails the call (502).
pub(crate) const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The upstream's answer head not received by then fails the call (504). The body then streams
/// without a bound, as large artifact downloads need.
pub(crate) const UPSTREAM_RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// The upstream and the client that reaches it.
pub(crate) struct Upstream {
    base: Uri,
    client: Client<HttpsConnector<HttpConnector>, Incoming>,
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    // The body is re-framed on the upstream connection (hyper chunks it or uses its length).
    headers.remove(header::TRANSFER_ENCODING);
}

/// `base`'s scheme and authority, its path (without a trailing `/`) then `path_and_query`.
pub(crate) fn join(base: &Uri, path_and_query: &str) -> Result<Uri, http::Error> {
    let prefix = base.path().trim_end_matches('/');
    let mut parts = Uri::builder();
    if let Some(scheme) = base.scheme() {
        parts = parts.scheme(scheme.clone());
    }
    if let Some(authority) = base.authority() {
        parts = parts.authority(authority.clone());
    }
    parts
        .path_and_query(format!("{prefix}{path_and_query}"))
        .build()
}

impl Upstream {
    pub(crate) fn new(base: Uri) -> Result<Upstream, CacheError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(UPSTREAM_CONNECT_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(CacheError::Tls)?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Upstream {
            base,
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends `req` upstream and gives back its answer, body streamed.
    pub(crate) async fn forward(&self, req: Request<Incoming>) -> Result<Response<BoxBody>, Fail> {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        parts.uri = join(&self.base, path_and_query)
            .map_err(|_| Fail::new(http::StatusCode::BAD_REQUEST, "malformed", "bad path"))?;
        strip_hop_by_hop(&mut parts.headers);
        // The client sets the upstream's own Host.
        parts.headers.remove(header::HOST);
        let sent = self.client.request(Request::from_parts(parts, body));
        let answer = match tokio::time::timeout(UPSTREAM_RESPONSE_TIMEOUT, sent).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "upstream call failed");
                return Err(Fail::new(
                    http::StatusCode::BAD_GATEWAY,
                    "unavailable",
                    "upstream unreachable",
                ));
            }
            Err(_) => {
                return Err(Fail::new(
                    http::StatusCode::GATEWAY_TIMEOUT,
                    "unavailable",
                    "upstream did not answer in time",
                ));
            }
        };
        let (mut parts, body) = answer.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(
            parts,
            body.map_err(Into::into).boxed_unsync(),
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn join_keeps_the_base_path_and_the_request_path_and_query() {
        let table = [
            (
                "https://r.example/",
                "/twirp/A/B?x=1",
                "https://r.example/twirp/A/B?x=1",
            ),
            (
                "http://127.0.0.1:9/base/",
                "/twirp/A/B",
                "http://127.0.0.1:9/base/twirp/A/B",
            ),
            ("http://127.0.0.1:9", "/x", "http://127.0.0.1:9/x"),
        ];
        for (base, path, expected) in table {
            let base: Uri = base.parse().unwrap();
            assert_eq!(join(&base, path).unwrap().to_string(), expected);
        }
    }
}
