//! An in-process registry on loopback (hyper) for what the real one cannot be made to do: the
//! token flow (a realm, a service, a scope, a token checked on every request), a blob answered
//! with one byte flipped, blobs redirected to another host, a failing endpoint. Every request
//! is logged with its `Authorization`, so tests can say what was sent where.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::image::{Blob, TestIndex};

/// The token the fake's realm issues.
pub(crate) const TOKEN: &str = "tok-5ecret-never-shown";

/// How the fake wants to be authenticated.
#[derive(Clone, Debug, Default)]
pub(crate) enum FakeAuth {
    /// No authentication.
    #[default]
    None,
    /// Token auth: `/token` issues [`TOKEN`], to anyone when `creds` is `None`, else only to a
    /// request with those basic credentials.
    Bearer { creds: Option<(String, String)> },
    /// Basic auth with these credentials.
    Basic { user: String, password: String },
}

/// What the fake does.
#[derive(Clone, Debug, Default)]
pub(crate) struct FakeConfig {
    pub(crate) auth: FakeAuth,
    /// Serve this blob with one byte flipped.
    pub(crate) flip: Option<String>,
    /// Answer blob requests with a redirect to `localhost:<port>/cdn/<digest>` (another host
    /// for the client: it must not send its `Authorization` there).
    pub(crate) redirect_blobs: bool,
    /// Answer every `/v2/` request with this status.
    pub(crate) fail_all: Option<u16>,
    /// Leave `Docker-Content-Digest` out of manifest answers.
    pub(crate) no_digest_header: bool,
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub(crate) struct Logged {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) authorization: Option<String>,
}

struct State {
    config: FakeConfig,
    manifests: HashMap<String, Blob>,
    blobs: HashMap<String, Vec<u8>>,
    log: Vec<Logged>,
    addr: SocketAddr,
}

/// A running fake registry; stopped on drop.
pub(crate) struct Fake {
    pub(crate) addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// Serves `images` in repository `acme/img` (any repository, in fact), the index under
    /// `tag` and every manifest under its digest.
    pub(crate) async fn start(config: FakeConfig, images: &TestIndex, tag: &str) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut manifests = HashMap::new();
        manifests.insert(tag.to_owned(), images.index.clone());
        let mut blobs = HashMap::new();
        for blob in images.all() {
            if blob.media_type.contains("manifest") || blob.media_type.contains("index") {
                manifests.insert(blob.digest().to_string(), blob.clone());
            } else {
                blobs.insert(blob.digest().to_string(), blob.bytes.clone());
            }
        }
        let state = Arc::new(Mutex::new(State {
            config,
            manifests,
            blobs,
            log: Vec::new(),
            addr,
        }));
        let served = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let answer = handle(&state, &req);
                        async move { Ok::<_, std::convert::Infallible>(answer) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Fake { addr, state, task }
    }

    /// `127.0.0.1:<port>`: the registry name that reaches it.
    pub(crate) fn registry(&self) -> String {
        self.addr.to_string()
    }

    /// Every request so far.
    pub(crate) fn log(&self) -> Vec<Logged> {
        self.state.lock().expect("state").log.clone()
    }

    /// Adds a manifest under a tag.
    pub(crate) fn tag(&self, tag: &str, manifest: Blob) {
        self.state
            .lock()
            .expect("state")
            .manifests
            .insert(tag.to_owned(), manifest);
    }
}

fn answer(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

fn handle(state: &Mutex<State>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let mut state = state.lock().expect("state");
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = req.uri().path().to_owned();
    state.log.push(Logged {
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        authorization: authorization.clone(),
    });
    let config = state.config.clone();
    let basic = |user: &str, password: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    };
    if path == "/token" {
        return match &config.auth {
            FakeAuth::Bearer { creds } => {
                let allowed = match creds {
                    None => true,
                    Some((user, password)) => {
                        authorization.as_deref() == Some(basic(user, password).as_str())
                    }
                };
                if allowed {
                    answer(
                        StatusCode::OK,
                        serde_json::json!({ "token": TOKEN, "expires_in": 300 }).to_string(),
                    )
                } else {
                    answer(StatusCode::UNAUTHORIZED, r#"{"details":"incorrect"}"#)
                }
            }
            _ => answer(StatusCode::NOT_FOUND, ""),
        };
    }
    if let Some(digest) = path.strip_prefix("/cdn/") {
        // The other host: whatever it is asked, it answers, but the test checks the log.
        return blob_answer(&state, digest);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return answer(StatusCode::NOT_FOUND, "");
    };
    if let Some(status) = config.fail_all {
        return answer(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            r#"{"errors":[{"code":"UNAVAILABLE","message":"down"}]}"#,
        );
    }
    let (authorized, challenge) = match &config.auth {
        FakeAuth::None => (true, String::new()),
        FakeAuth::Bearer { .. } => (
            authorization.as_deref() == Some(format!("Bearer {TOKEN}").as_str()),
            format!(
                "Bearer realm=\"http://{}/token\",service=\"fake\",scope=\"repository:acme/img:pull\"",
                state.addr
            ),
        ),
        FakeAuth::Basic { user, password } => (
            authorization.as_deref() == Some(basic(user, password).as_str()),
            "Basic realm=\"fake\"".to_owned(),
        ),
    };
    if !authorized {
        let mut response = answer(
            StatusCode::UNAUTHORIZED,
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
        );
        response.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            challenge.parse().expect("challenge header"),
        );
        return response;
    }
    if let Some((_, reference)) = rest.rsplit_once("/manifests/") {
        let Some(manifest) = state.manifests.get(reference) else {
            return answer(
                StatusCode::NOT_FOUND,
                r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
            );
        };
        let mut response = answer(
            StatusCode::OK,
            if req.method() == http::Method::HEAD {
                Vec::new()
            } else {
                manifest.bytes.clone()
            },
        );
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            manifest.media_type.parse().expect("media type"),
        );
        if !config.no_digest_header {
            headers.insert(
                "docker-content-digest",
                manifest.digest().to_string().parse().expect("digest"),
            );
        }
        return response;
    }
    if let Some((_, digest)) = rest.rsplit_once("/blobs/") {
        if config.redirect_blobs {
            let mut response = answer(StatusCode::TEMPORARY_REDIRECT, "");
            response.headers_mut().insert(
                http::header::LOCATION,
                format!("http://localhost:{}/cdn/{digest}", state.addr.port())
                    .parse()
                    .expect("location"),
            );
            return response;
        }
        return blob_answer(&state, digest);
    }
    answer(StatusCode::NOT_FOUND, "")
}

fn blob_answer(state: &State, digest: &str) -> Response<Full<Bytes>> {
    match state.blobs.get(digest) {
        None => answer(
            StatusCode::NOT_FOUND,
            r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#,
        ),
        Some(bytes) => {
            let mut bytes = bytes.clone();
            let middle = bytes.len() / 2;
            if state.config.flip.as_deref() == Some(digest)
                && let Some(byte) = bytes.get_mut(middle)
            {
                *byte ^= 0x01;
            }
            answer(StatusCode::OK, bytes)
        }
    }
}
