//! Repositories' archives, for the host's copy of the actions runners use: a ref resolved to
//! its commit SHA (`GET /repos/{owner}/{repo}/commits/{ref}` asking for the bare SHA,
//! conditional, so an unchanged ref is a free `304`), and a commit's tarball
//! (`GET /repos/{owner}/{repo}/tarball/{sha}`, which GitHub answers with a redirect to codeload)
//! streamed to a writer with a size cap. Both API requests go through an installation's token and
//! the shared budget like every other call; the second hop carries no credential (a private
//! repository's codeload URL holds its own short-lived token in its query, so URLs in errors
//! lose their query). What is kept, where and when is `rm_cache::actions`; this module only
//! talks to GitHub.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt as _, Empty};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};

use crate::client::{Auth, Call, GithubClient, Polled};
use crate::error::GithubError;

/// The media type in which `GET .../commits/{ref}` answers with the commit's SHA alone (40 or
/// 64 hex digits) instead of the commit with its files and patches.
pub const SHA_MEDIA_TYPE: &str = "application/vnd.github.sha";
/// How long the archive's host may take to answer with its headers.
pub const ARCHIVE_RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a download may go without receiving a byte before it is given up.
pub const ARCHIVE_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a whole download may take (a 256 MiB archive at ~450 KiB/s).
pub const ARCHIVE_DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Why a download failed. URLs never carry their query.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The API request (the first hop) failed: its class, as every other call's.
    #[error(transparent)]
    Github(#[from] GithubError),
    #[error("the archive download from {url} failed: {reason}")]
    Download { url: String, reason: String },
    #[error("the archive at {url} is larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error("cannot write the archive: {0}")]
    Write(#[source] std::io::Error),
}

impl GithubClient {
    /// The commit `reference` (a branch, tag or SHA) names in `repository` ("owner/repo"), asked
    /// with `installation`'s token, conditional: an unchanged ref is a `304` answered from the
    /// cache, which costs no quota. A ref that is not one is GitHub's `404` or `422`.
    pub async fn commit_sha(
        &self,
        installation: u64,
        repository: &str,
        reference: &str,
    ) -> Result<Polled<String>, GithubError> {
        let endpoint = "repos.commits.get";
        if !plain_path(repository) || !plain_path(reference) {
            return Err(GithubError::Unprocessable {
                endpoint,
                message: "not a repository and ref rm asks about".into(),
            });
        }
        let call = Call {
            conditional: true,
            accept: SHA_MEDIA_TYPE,
            ..Call::get(
                endpoint,
                Auth::Installation(installation),
                format!("/repos/{repository}/commits/{reference}"),
            )
        };
        let answer = self.run(&call).await?;
        let sha = std::str::from_utf8(&answer.body)
            .ok()
            .map(str::trim)
            .filter(|s| is_sha(s))
            .ok_or_else(|| GithubError::Unexpected {
                endpoint,
                status: 200,
                message: "the answer is not a commit SHA".into(),
            })?;
        Ok(Polled {
            value: sha.to_owned(),
            not_modified: answer.not_modified,
        })
    }

    /// Streams the tarball of commit `sha` of `repository` into `out`: the API request with
    /// `installation`'s token (charged like any read), then GitHub's redirect followed without
    /// a credential. More than `limit` bytes is [`ArchiveError::TooLarge`]. Returns the bytes
    /// written; `out` is flushed, not synced (the caller owns the file).
    pub async fn download_tarball<W: AsyncWrite + Unpin + Send>(
        &self,
        installation: u64,
        repository: &str,
        sha: &str,
        limit: u64,
        out: &mut W,
    ) -> Result<u64, ArchiveError> {
        let endpoint = "repos.tarball";
        if !plain_path(repository) || !is_sha(sha) {
            return Err(GithubError::Unprocessable {
                endpoint,
                message: "not a repository and commit SHA rm downloads".into(),
            }
            .into());
        }
        let call = Call {
            redirect: true,
            ..Call::get(
                endpoint,
                Auth::Installation(installation),
                format!("/repos/{repository}/tarball/{sha}"),
            )
        };
        let answer = self.run(&call).await?;
        let location = answer
            .headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok());
        let uri = archive_location(location).map_err(|message| GithubError::Unexpected {
            endpoint,
            status: 302,
            message,
        })?;
        let url = shown(&uri);
        let work = fetch(uri, &url, limit, out);
        tokio::time::timeout(ARCHIVE_DOWNLOAD_TIMEOUT, work)
            .await
            .map_err(|_| ArchiveError::Download {
                url,
                reason: format!("not done within {ARCHIVE_DOWNLOAD_TIMEOUT:?}"),
            })?
    }
}

/// The second hop: GETs `uri` (no credential) and copies its body into `out`.
async fn fetch<W: AsyncWrite + Unpin + Send>(
    uri: Uri,
    url: &str,
    limit: u64,
    out: &mut W,
) -> Result<u64, ArchiveError> {
    let failed = |reason: String| ArchiveError::Download {
        url: url.to_owned(),
        reason,
    };
    let client = crate::https::client::<Empty<Bytes>>()
        .map_err(|e| failed(format!("cannot set up HTTPS: {e}")))?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header(
            header::USER_AGENT,
            concat!("rm/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::new())
        .map_err(|e| failed(e.to_string()))?;
    let response = tokio::time::timeout(ARCHIVE_RESPONSE_TIMEOUT, client.request(request))
        .await
        .map_err(|_| failed(format!("no answer within {ARCHIVE_RESPONSE_TIMEOUT:?}")))?
        .map_err(|e| failed(e.to_string()))?;
    if response.status() != StatusCode::OK {
        return Err(failed(format!("answered {}", response.status().as_u16())));
    }
    let announced = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(ArchiveError::TooLarge {
            url: url.to_owned(),
            limit,
        });
    }
    let mut body = response.into_body();
    let mut written: u64 = 0;
    loop {
        let frame = tokio::time::timeout(ARCHIVE_STALL_TIMEOUT, body.frame())
            .await
            .map_err(|_| failed(format!("no byte for {ARCHIVE_STALL_TIMEOUT:?}")))?;
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| failed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        written = written.saturating_add(data.len() as u64);
        if written > limit {
            return Err(ArchiveError::TooLarge {
                url: url.to_owned(),
                limit,
            });
        }
        out.write_all(&data).await.map_err(ArchiveError::Write)?;
    }
    out.flush().await.map_err(ArchiveError::Write)?;
    Ok(written)
}

/// Where GitHub's redirect sends the download: an absolute `https` URL, or `http` to a loopback
/// host only (a test's fake, a local mirror): an archive never travels in the clear over a
/// network.
pub(crate) fn archive_location(location: Option<&str>) -> Result<Uri, String> {
    let location = location.ok_or("a redirect without a Location")?;
    let uri: Uri = location
        .parse()
        .map_err(|_| "a redirect to something that is not a URL".to_owned())?;
    let host = uri.host().ok_or("a redirect without a host")?;
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1") => Ok(uri),
        _ => Err(format!("refusing a redirect to {}", shown(&uri))),
    }
}

/// A SHA-1 (40) or SHA-256 (64) commit id in lower-case hex, as GitHub writes them.
pub(crate) fn is_sha(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `s` can go into a request path as it is: names, `/` between them, no `..`, nothing
/// a URL would read as a query, fragment or escape.
fn plain_path(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('/')
        && !s.ends_with('/')
        && s.split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// `uri` without its query (a private repository's codeload URL carries a token there).
fn shown(uri: &Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority().map_or("", |a| a.as_str()),
        uri.path()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_redirects_are_followed_and_shown_without_their_query() {
        for (location, ok) in [
            (
                Some("https://codeload.github.com/actions/checkout/legacy.tar.gz/abc?token=SECRET"),
                true,
            ),
            (
                Some("http://127.0.0.1:8080/_codeload/a/b/legacy.tar.gz/x"),
                true,
            ),
            (Some("http://localhost/x"), true),
            (Some("http://codeload.github.com/a"), false),
            (Some("ftp://example.com/a"), false),
            (Some("/relative/path"), false),
            (Some("not a url"), false),
            (None, false),
        ] {
            assert_eq!(archive_location(location).is_ok(), ok, "{location:?}");
        }
        let err = archive_location(Some("http://evil.example/a?token=SECRET")).unwrap_err();
        assert!(!err.contains("SECRET"), "{err}");
        let uri = archive_location(Some("https://codeload.github.com/a/b?token=SECRET")).unwrap();
        assert_eq!(shown(&uri), "https://codeload.github.com/a/b");
    }

    #[test]
    fn shas_and_path_parts_are_what_github_writes() {
        let sha1 = "11bd71901bbe5b1630ceea73d27597364c9af683";
        assert!(is_sha(sha1));
        assert!(is_sha(&"a".repeat(64)));
        assert!(!is_sha(&sha1.to_uppercase()));
        assert!(!is_sha(&sha1[..39]));
        assert!(!is_sha("<html>not found</html>"));
        for (s, ok) in [
            ("actions/checkout", true),
            ("v4", true),
            ("release/v1.2", true),
            ("", false),
            ("a/../b", false),
            ("a..b", false),
            ("/abs", false),
            ("trailing/", false),
            ("a//b", false),
            ("v4?x=1", false),
            ("v4#frag", false),
            ("a%2fb", false),
            ("a b", false),
        ] {
            assert_eq!(plain_path(s), ok, "{s:?}");
        }
    }
}
