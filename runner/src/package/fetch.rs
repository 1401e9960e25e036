//! The HTTP side of the runner package download: the release's metadata from GitHub's REST API
//! (a public endpoint, asked without credentials, so no App secret ever goes to the download's
//! host) and the asset's bytes, following GitHub's redirect to its object storage. Every step
//! has a timeout and every body a size cap. URLs in errors and logs lose their query: the
//! storage's URLs carry signatures.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Incoming;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use super::progress::Progress;
use crate::https::HttpsClient;

/// How long the metadata request may take, redirects and body included.
pub(crate) const METADATA_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest release metadata read (actions/runner's is tens of KiB).
pub(crate) const MAX_METADATA_BYTES: usize = 4 * 1024 * 1024;
/// How long each hop may take to answer with its headers.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a download may go without receiving a byte before it is given up.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a whole download may take (a ~200 MiB package at ~120 KiB/s).
pub(crate) const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The most redirects followed (github.com uses one, to its object storage).
pub(crate) const MAX_REDIRECTS: usize = 5;
/// The media type GitHub's REST API answers in.
const GITHUB_JSON: &str = "application/vnd.github+json";

/// Why a request failed. `url` never has its query.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url} answered 404 Not Found")]
    NotFound { url: String },
    #[error(
        "{url} answered {status}: GitHub's limit for unauthenticated requests from this address is spent{}",
        reset.map(|r| format!(" until {r} (Unix time)")).unwrap_or_default()
    )]
    RateLimited {
        url: String,
        status: u16,
        reset: Option<u64>,
    },
    #[error("{url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} did not answer within {}s", .after.as_secs())]
    Timeout { url: String, after: Duration },
    #[error("{url} sends more than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: {reason}")]
    Redirect { url: String, reason: String },
    #[error("{url} sent release metadata that cannot be read: {reason}")]
    Invalid { url: String, reason: String },
    #[error("cannot write the download: {0}")]
    Write(#[source] std::io::Error),
    #[error("cannot set up HTTPS: {0}")]
    Tls(#[source] std::io::Error),
}

/// A downloaded body: its length and SHA-256 (lower-case hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Downloaded {
    pub bytes: u64,
    pub sha256: String,
}

/// An HTTP(S) client with the host's root certificates (rustls; no OpenSSL).
pub(crate) struct Http {
    client: HttpsClient<Empty<Bytes>>,
    user_agent: String,
}

impl Http {
    pub(crate) fn new() -> Result<Self, FetchError> {
        Ok(Self {
            client: crate::https::client().map_err(FetchError::Tls)?,
            user_agent: format!("rm-agent/{}", env!("CARGO_PKG_VERSION")),
        })
    }

    /// GETs GitHub JSON at `url` and parses it.
    pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
    ) -> Result<T, FetchError> {
        let shown_url = shown(url);
        let work = async {
            let (final_url, response) = self.get(url, GITHUB_JSON).await?;
            let body = Limited::new(response.into_body(), MAX_METADATA_BYTES)
                .collect()
                .await
                .map_err(|e| FetchError::Unreachable {
                    url: final_url.clone(),
                    reason: chain(e.as_ref()),
                })?
                .to_bytes();
            serde_json::from_slice(&body).map_err(|e| FetchError::Invalid {
                url: final_url,
                reason: e.to_string(),
            })
        };
        tokio::time::timeout(METADATA_TIMEOUT, work)
            .await
            .map_err(|_| FetchError::Timeout {
                url: shown_url,
                after: METADATA_TIMEOUT,
            })?
    }

    /// Streams `url` into `out`, hashing as it goes, refusing more than `limit` bytes, telling
    /// `progress` (`expected` is the size the release lists, used when no `content-length`
    /// comes).
    pub(crate) async fn download(
        &self,
        url: &str,
        expected: Option<u64>,
        limit: u64,
        out: &mut tokio::fs::File,
        progress: &mut dyn Progress,
    ) -> Result<Downloaded, FetchError> {
        let shown_url = shown(url);
        let work = async {
            let (final_url, response) = self.get(url, "application/octet-stream").await?;
            let total = response
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .or(expected);
            if total.is_some_and(|t| t > limit) {
                return Err(FetchError::TooLarge {
                    url: final_url,
                    limit,
                });
            }
            progress.begin(total);
            let result = stream(response.into_body(), &final_url, limit, out, progress).await;
            progress.finish();
            result
        };
        tokio::time::timeout(DOWNLOAD_TIMEOUT, work)
            .await
            .map_err(|_| FetchError::Timeout {
                url: shown_url,
                after: DOWNLOAD_TIMEOUT,
            })?
    }

    /// GETs `url`, following redirects (never from HTTPS down to HTTP), and returns the final
    /// URL (shown form) and its successful answer.
    async fn get(
        &self,
        url: &str,
        accept: &str,
    ) -> Result<(String, hyper::Response<Incoming>), FetchError> {
        let mut uri: Uri =
            url.parse()
                .map_err(|e: http::uri::InvalidUri| FetchError::Redirect {
                    url: shown(url),
                    reason: format!("not a URL: {e}"),
                })?;
        for _ in 0..=MAX_REDIRECTS {
            let shown_url = shown_uri(&uri);
            let request = Request::builder()
                .method(Method::GET)
                .uri(uri.clone())
                .header(header::ACCEPT, accept)
                .header(header::USER_AGENT, &self.user_agent)
                .header("x-github-api-version", rm_github::client::API_VERSION)
                .body(Empty::new())
                .map_err(|e| FetchError::Redirect {
                    url: shown_url.clone(),
                    reason: e.to_string(),
                })?;
            let response = tokio::time::timeout(RESPONSE_TIMEOUT, self.client.request(request))
                .await
                .map_err(|_| FetchError::Timeout {
                    url: shown_url.clone(),
                    after: RESPONSE_TIMEOUT,
                })?
                .map_err(|e| FetchError::Unreachable {
                    url: shown_url.clone(),
                    reason: chain(&e),
                })?;
            let status = response.status();
            if status.is_redirection() {
                uri =
                    next_hop(&uri, response.headers().get(header::LOCATION)).map_err(|reason| {
                        FetchError::Redirect {
                            url: shown_url.clone(),
                            reason,
                        }
                    })?;
                continue;
            }
            return match status {
                StatusCode::OK => Ok((shown_url, response)),
                StatusCode::NOT_FOUND => Err(FetchError::NotFound { url: shown_url }),
                StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
                    if response
                        .headers()
                        .get("x-ratelimit-remaining")
                        .is_some_and(|v| v == "0") =>
                {
                    Err(FetchError::RateLimited {
                        url: shown_url,
                        status: status.as_u16(),
                        reset: response
                            .headers()
                            .get("x-ratelimit-reset")
                            .and_then(|v| v.to_str().ok()?.parse().ok()),
                    })
                }
                other => Err(FetchError::Status {
                    url: shown_url,
                    status: other.as_u16(),
                }),
            };
        }
        Err(FetchError::Redirect {
            url: shown(url),
            reason: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }
}

/// Copies the body into `out` and hashes it, giving up when no byte came for
/// [`STALL_TIMEOUT`] or more than `limit` came.
async fn stream(
    mut body: Incoming,
    url: &str,
    limit: u64,
    out: &mut tokio::fs::File,
    progress: &mut dyn Progress,
) -> Result<Downloaded, FetchError> {
    let mut hasher = Sha256::new();
    let mut done: u64 = 0;
    loop {
        let frame = tokio::time::timeout(STALL_TIMEOUT, body.frame())
            .await
            .map_err(|_| FetchError::Timeout {
                url: url.to_owned(),
                after: STALL_TIMEOUT,
            })?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| FetchError::Unreachable {
            url: url.to_owned(),
            reason: chain(&e),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        done = done.saturating_add(data.len() as u64);
        if done > limit {
            return Err(FetchError::TooLarge {
                url: url.to_owned(),
                limit,
            });
        }
        hasher.update(&data);
        out.write_all(&data).await.map_err(FetchError::Write)?;
        progress.advance(done);
    }
    out.flush().await.map_err(FetchError::Write)?;
    out.sync_all().await.map_err(FetchError::Write)?;
    Ok(Downloaded {
        bytes: done,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// Where a redirect leads: an absolute URL, or a path on the same host. HTTPS never gives way
/// to HTTP.
pub(crate) fn next_hop(from: &Uri, location: Option<&http::HeaderValue>) -> Result<Uri, String> {
    let location = location
        .and_then(|v| v.to_str().ok())
        .ok_or("a redirect without a Location")?;
    let to: Uri = location
        .parse()
        .map_err(|_| "a redirect to something that is not a URL".to_owned())?;
    let to = if to.scheme().is_some() {
        to
    } else if location.starts_with('/') && !location.starts_with("//") {
        let mut parts = from.clone().into_parts();
        parts.path_and_query = to.path_and_query().cloned();
        Uri::from_parts(parts).map_err(|e| e.to_string())?
    } else {
        return Err("a redirect to a relative URL".to_owned());
    };
    if from.scheme_str() == Some("https") && to.scheme_str() != Some("https") {
        return Err(format!(
            "refusing a redirect from HTTPS to {}",
            shown_uri(&to)
        ));
    }
    Ok(to)
}

/// `url` without its query (which may carry a signature).
pub(crate) fn shown(url: &str) -> String {
    url.split(['?', '#']).next().unwrap_or_default().to_owned()
}

fn shown_uri(uri: &Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map_or("", |a| a.as_str()),
        uri.path()
    )
}

/// An error and its sources on one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(from: &str, location: &str) -> Result<String, String> {
        let value = http::HeaderValue::from_str(location).unwrap();
        next_hop(&from.parse().unwrap(), Some(&value)).map(|u| u.to_string())
    }

    #[test]
    fn redirects_resolve_and_never_downgrade() {
        assert_eq!(
            hop(
                "https://github.com/actions/runner/releases/download/v1/a.tar.gz",
                "https://release-assets.githubusercontent.com/x?sig=abc"
            )
            .unwrap(),
            "https://release-assets.githubusercontent.com/x?sig=abc"
        );
        assert_eq!(
            hop("http://127.0.0.1:9/a", "/b?sig=1").unwrap(),
            "http://127.0.0.1:9/b?sig=1"
        );
        assert!(hop("https://github.com/a", "http://evil.example/b").is_err());
        assert!(hop("https://github.com/a", "b").is_err());
        assert!(hop("https://github.com/a", "//evil.example/b").is_err());
        assert!(next_hop(&"https://github.com/a".parse().unwrap(), None).is_err());
    }

    #[test]
    fn shown_urls_lose_their_signatures() {
        assert_eq!(
            shown("https://objects.example/a.tar.gz?X-Amz-Signature=secret"),
            "https://objects.example/a.tar.gz"
        );
        assert_eq!(
            shown_uri(&"https://objects.example/a?sig=secret".parse().unwrap()),
            "https://objects.example/a"
        );
    }
}
