//! The registry client's HTTP: one request to an endpoint with the authentication the registry
//! asks for (a `401`'s challenge answered once: a Bearer token fetched from its realm, or basic
//! credentials; the answer kept per endpoint and repository for the next requests), redirects
//! followed (without the `Authorization` header once they leave the endpoint's host, and never
//! to plain HTTP outside `auth::scheme_allowed`), a timeout on every wait, and bodies read
//! under a bound. Statuses are the caller's to judge, through [`check_status`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, LOCATION, USER_AGENT, WWW_AUTHENTICATE};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use secrecy::ExposeSecret as _;

use super::auth::{self, Challenge};
use super::{Credentials, RegistryError};

/// The longest wait from sending a request to its response's head (connecting and TLS
/// included).
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest wait for the next piece of a response's body: a stalled transfer fails after
/// it, however long a large layer takes in total.
pub(crate) const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The most redirects followed for one request (registries send blobs to a CDN with one).
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The largest token endpoint answer read (a JWT is a few KiB).
pub(crate) const MAX_TOKEN_BYTES: u64 = 1024 * 1024;

/// The most of an error answer's body read for its error codes.
const MAX_ERROR_BODY_BYTES: u64 = 16 * 1024;

/// Sent with every request.
const USER_AGENT_VALUE: &str = concat!("rm-image/", env!("CARGO_PKG_VERSION"));

/// HTTPS (rustls, the host's roots) and plain HTTP, HTTP/1: the stack `rm_github::https`
/// builds, built here rather than depended on so the image crate does not link the GitHub
/// client.
type Https = HyperClient<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Where a registry's API is: `base` is `scheme://authority[/prefix]`, and `/v2/...` follows.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// How messages name it: the registry, or the mirror's URL.
    pub(crate) name: String,
    /// `scheme://authority[/prefix]`, without a trailing slash.
    pub(crate) base: String,
    /// The host an operator named with `http://` (a mirror): plain HTTP is allowed to it.
    pub(crate) plain_host: Option<String>,
}

/// The HTTP side of a [`super::Registry`].
pub(crate) struct Client {
    http: Https,
    credentials: Option<Credentials>,
    /// The `Authorization` that last worked, per endpoint base and repository (a token's scope
    /// is one repository).
    auth: Mutex<HashMap<(String, String), HeaderValue>>,
    /// Every request sent (token requests and redirects included): what tests count.
    requests: AtomicU64,
}

impl Client {
    /// A client; fails only when the host's root certificates cannot be loaded.
    pub(crate) fn new(credentials: Option<Credentials>) -> std::io::Result<Client> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Client {
            http: HyperClient::builder(TokioExecutor::new()).build(connector),
            credentials,
            auth: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
        })
    }

    /// How many requests this client has sent.
    #[cfg(test)]
    pub(crate) fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// `method` on `<base>/v2/<repository>/<path>`, authenticated as the registry asks.
    /// `what` names the object for messages. Any status comes back: see [`check_status`].
    pub(crate) async fn request(
        &self,
        ep: &Endpoint,
        repository: &str,
        path: &str,
        method: Method,
        accept: Option<&str>,
        what: &str,
    ) -> Result<Response<Incoming>, RegistryError> {
        let url = format!("{}/v2/{repository}/{path}", ep.base);
        let key = (ep.base.clone(), repository.to_owned());
        let mut authorization = self.cached_auth(&key);
        let mut challenged = false;
        loop {
            let response = self
                .follow(
                    ep,
                    method.clone(),
                    &url,
                    accept,
                    authorization.as_ref(),
                    what,
                )
                .await?;
            if response.status() != StatusCode::UNAUTHORIZED || challenged {
                return Ok(response);
            }
            challenged = true;
            let challenge = response
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(auth::parse_challenge);
            let answer = self.answer(ep, repository, challenge).await?;
            if let Ok(mut cache) = self.auth.lock() {
                cache.insert(key.clone(), answer.clone());
            }
            authorization = Some(answer);
        }
    }

    /// The user of the credentials, for messages.
    pub(crate) fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.user.as_str())
    }

    fn cached_auth(&self, key: &(String, String)) -> Option<HeaderValue> {
        self.auth.lock().ok().and_then(|c| c.get(key).cloned())
    }

    /// Sends one request, following redirects. The `Authorization` goes only to the URL's own
    /// host: a redirect elsewhere (a CDN with a signed URL) gets none.
    async fn follow(
        &self,
        ep: &Endpoint,
        method: Method,
        url: &str,
        accept: Option<&str>,
        authorization: Option<&HeaderValue>,
        what: &str,
    ) -> Result<Response<Incoming>, RegistryError> {
        let mut uri: Uri = url.parse().map_err(|_| RegistryError::Invalid {
            detail: format!("{url:?} is not a valid URL"),
        })?;
        let origin = uri.authority().cloned();
        for _ in 0..=MAX_REDIRECTS {
            if !auth::scheme_allowed(&uri, ep.plain_host.as_deref()) {
                return Err(RegistryError::Insecure {
                    registry: ep.name.clone(),
                    url: strip_query(&uri),
                });
            }
            let mut request = Request::builder()
                .method(method.clone())
                .uri(uri.clone())
                .header(USER_AGENT, USER_AGENT_VALUE);
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            if let Some(authorization) = authorization
                && uri.authority() == origin.as_ref()
            {
                request = request.header(AUTHORIZATION, authorization.clone());
            }
            let request = request
                .body(Empty::new())
                .map_err(|e| RegistryError::Invalid {
                    detail: format!("cannot build a request for {what}: {e}"),
                })?;
            let response = self.send(ep, request, what).await?;
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok());
            match location {
                Some(location) if response.status().is_redirection() => {
                    uri = resolve_location(&uri, location).ok_or_else(|| {
                        RegistryError::Protocol {
                            registry: ep.name.clone(),
                            detail: format!("{what}: a redirect to an unreadable location"),
                        }
                    })?;
                }
                _ => return Ok(response),
            }
        }
        Err(RegistryError::Protocol {
            registry: ep.name.clone(),
            detail: format!("{what}: more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// Sends `request` and waits for the response's head under [`RESPONSE_TIMEOUT`].
    async fn send(
        &self,
        ep: &Endpoint,
        request: Request<Empty<Bytes>>,
        what: &str,
    ) -> Result<Response<Incoming>, RegistryError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(method = %request.method(), url = %strip_query(request.uri()), "registry request");
        match tokio::time::timeout(RESPONSE_TIMEOUT, self.http.request(request)).await {
            Err(_) => Err(RegistryError::Timeout {
                registry: ep.name.clone(),
                what: what.to_owned(),
                after: RESPONSE_TIMEOUT,
            }),
            Ok(Err(e)) => Err(RegistryError::Unreachable {
                registry: ep.name.clone(),
                detail: error_chain(&e),
            }),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// The `Authorization` answering `challenge`: a token from the realm, or basic credentials.
    async fn answer(
        &self,
        ep: &Endpoint,
        repository: &str,
        challenge: Option<Challenge>,
    ) -> Result<HeaderValue, RegistryError> {
        let user = self.credentials.as_ref().map(|c| c.user.clone());
        match challenge {
            None => Err(RegistryError::Unauthorized {
                registry: ep.name.clone(),
                user,
                detail: "it answered 401 without a challenge this client can answer".to_owned(),
            }),
            Some(Challenge::Basic) => match &self.credentials {
                Some(credentials) => Ok(basic(credentials)),
                None => Err(RegistryError::Unauthorized {
                    registry: ep.name.clone(),
                    user,
                    detail: "it asks for credentials and none were given".to_owned(),
                }),
            },
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let url = auth::token_url(&realm, service.as_deref(), scope.as_deref(), repository);
                self.token(ep, &url).await
            }
        }
    }

    /// Gets a token from a realm: with basic credentials when there are some, anonymously
    /// otherwise. The realm's URL is the registry's to choose, so it is held to the same
    /// plain-HTTP rule as the registry (credentials never travel in clear text off loopback).
    async fn token(&self, ep: &Endpoint, url: &str) -> Result<HeaderValue, RegistryError> {
        let user = self.credentials.as_ref().map(|c| c.user.clone());
        let what = "a token";
        let uri: Uri = url.parse().map_err(|_| RegistryError::Protocol {
            registry: ep.name.clone(),
            detail: "the token realm it names is not a valid URL".to_owned(),
        })?;
        if !auth::scheme_allowed(&uri, ep.plain_host.as_deref()) {
            return Err(RegistryError::Insecure {
                registry: ep.name.clone(),
                url: strip_query(&uri),
            });
        }
        let mut request = Request::get(uri).header(USER_AGENT, USER_AGENT_VALUE);
        if let Some(credentials) = &self.credentials {
            request = request.header(AUTHORIZATION, basic(credentials));
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| RegistryError::Invalid {
                detail: format!("cannot build the token request: {e}"),
            })?;
        let response = self.send(ep, request, what).await?;
        match response.status() {
            s if s.is_success() => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(RegistryError::Unauthorized {
                    registry: ep.name.clone(),
                    detail: match &user {
                        Some(_) => "its token service refused the credentials".to_owned(),
                        None => "its token service refused an anonymous token: \
                                 give credentials"
                            .to_owned(),
                    },
                    user,
                });
            }
            status => {
                return Err(RegistryError::Status {
                    registry: ep.name.clone(),
                    what: what.to_owned(),
                    status: status.as_u16(),
                    codes: String::new(),
                });
            }
        }
        let body = read_bounded(ep, response, MAX_TOKEN_BYTES, what).await?;
        let token = auth::read_token(&body).map_err(|detail| RegistryError::Protocol {
            registry: ep.name.clone(),
            detail: detail.to_owned(),
        })?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
            .map_err(|_| RegistryError::Protocol {
                registry: ep.name.clone(),
                detail: "the token it issued cannot be sent in a header".to_owned(),
            })?;
        value.set_sensitive(true);
        Ok(value)
    }
}

/// `Authorization: Basic`, marked sensitive (never logged by hyper).
fn basic(credentials: &Credentials) -> HeaderValue {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        credentials.user,
        credentials.password.expose_secret()
    ));
    // Base64 is always a valid header value; the fallback (a header the registry refuses)
    // cannot happen.
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))
        .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
    value.set_sensitive(true);
    value
}

/// Where a `Location` points, relative to the URL that answered it: absolute, scheme-relative
/// (`//host/...`) or absolute-path (`/...`); `None` for anything else.
pub(crate) fn resolve_location(base: &Uri, location: &str) -> Option<Uri> {
    if location.starts_with("https://") || location.starts_with("http://") {
        return location.parse().ok();
    }
    let scheme = base.scheme_str()?;
    if location.starts_with("//") {
        return format!("{scheme}:{location}").parse().ok();
    }
    if location.starts_with('/') {
        let authority = base.authority()?;
        return format!("{scheme}://{authority}{location}").parse().ok();
    }
    None
}

/// A URL for messages: without its query, where a signed URL keeps its signature.
fn strip_query(uri: &Uri) -> String {
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}{}", uri.path()),
        _ => uri.path().to_owned(),
    }
}

/// An error and its sources, `: `-joined (hyper's own message says little: the cause does).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The response when its status is a success; otherwise the error it means (the registry's
/// error codes named, read from a bounded body).
pub(crate) async fn check_status(
    ep: &Endpoint,
    response: Response<Incoming>,
    what: &str,
    user: Option<&str>,
) -> Result<Response<Incoming>, RegistryError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let registry = ep.name.clone();
    let what = what.to_owned();
    let codes = match read_bounded(ep, response, MAX_ERROR_BODY_BYTES, &what).await {
        Ok(body) => error_codes(&body),
        Err(_) => String::new(),
    };
    Err(match status {
        StatusCode::UNAUTHORIZED => RegistryError::Unauthorized {
            registry,
            user: user.map(str::to_owned),
            detail: format!("it refused access to {what}{codes}"),
        },
        StatusCode::FORBIDDEN => RegistryError::Denied { registry, what },
        StatusCode::NOT_FOUND => RegistryError::NotFound { registry, what },
        status => RegistryError::Status {
            registry,
            what,
            status: status.as_u16(),
            codes,
        },
    })
}

/// The distribution spec's error codes in an error body, as ` (CODE, CODE)`; the messages
/// beside them are left out (they are the registry's free text).
pub(crate) fn error_codes(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        code: String,
    }
    let Ok(errors) = serde_json::from_slice::<Errors>(body) else {
        return String::new();
    };
    let codes: Vec<String> = errors
        .errors
        .iter()
        .map(|e| {
            e.code
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(64)
                .collect()
        })
        .filter(|c: &String| !c.is_empty())
        .take(8)
        .collect();
    if codes.is_empty() {
        String::new()
    } else {
        format!(" ({})", codes.join(", "))
    }
}

/// The next piece of a body's data, waiting at most [`BODY_IDLE_TIMEOUT`]; `None` at its end.
pub(crate) async fn next_chunk(
    ep: &Endpoint,
    body: &mut Incoming,
    what: &str,
) -> Result<Option<Bytes>, RegistryError> {
    loop {
        match tokio::time::timeout(BODY_IDLE_TIMEOUT, body.frame()).await {
            Err(_) => {
                return Err(RegistryError::Timeout {
                    registry: ep.name.clone(),
                    what: what.to_owned(),
                    after: BODY_IDLE_TIMEOUT,
                });
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => {
                return Err(RegistryError::Unreachable {
                    registry: ep.name.clone(),
                    detail: format!("{what}: {}", error_chain(&e)),
                });
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
                // Trailers: nothing to read.
            }
        }
    }
}

/// The declared `Content-Length`, when there is one.
pub(crate) fn content_length(response: &Response<Incoming>) -> Option<u64> {
    response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A whole body of at most `limit` bytes (refused as soon as it declares or sends more).
pub(crate) async fn read_bounded(
    ep: &Endpoint,
    response: Response<Incoming>,
    limit: u64,
    what: &str,
) -> Result<Bytes, RegistryError> {
    let too_large = || RegistryError::TooLarge {
        registry: ep.name.clone(),
        what: what.to_owned(),
        limit,
    };
    if content_length(&response).is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = response.into_body();
    let mut out = BytesMut::new();
    while let Some(chunk) = next_chunk(ep, &mut body, what).await? {
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}
