//! The error classes callers act on, and the pure function that derives them from a response's
//! status and headers. Nothing secret ever reaches these values: messages come from GitHub's
//! `message` field, never from request headers or bodies.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::wire::from_unix_secs;

/// How long to wait after a secondary limit that came without `retry-after` (GitHub: "wait at
/// least one minute").
pub const SECONDARY_DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// Which of GitHub's limits was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The hourly quota of a resource is spent; it comes back at `x-ratelimit-reset`.
    Primary,
    /// Abuse protection (concurrency, points per minute, content creation); wait `retry-after`.
    Secondary,
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LimitKind::Primary => "primary",
            LimitKind::Secondary => "secondary",
        })
    }
}

/// What went wrong talking to GitHub, classified so that callers can act on it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GithubError {
    #[error("GitHub refused the credentials (401): {message}; check app_id and the private key")]
    Unauthorized { message: String },
    #[error("GitHub denied {endpoint} (403): {message}; {remedy}")]
    Forbidden {
        endpoint: &'static str,
        message: String,
        remedy: &'static str,
    },
    #[error("GitHub {kind} rate limit on {resource}: no request until {}s after the epoch", crate::wire::unix_secs(*retry_at))]
    RateLimited {
        kind: LimitKind,
        resource: String,
        retry_at: SystemTime,
    },
    #[error("not found (404) on {endpoint}: {message}")]
    NotFound {
        endpoint: &'static str,
        message: String,
    },
    #[error("conflict (409) on {endpoint}: {message}")]
    Conflict {
        endpoint: &'static str,
        message: String,
    },
    #[error("GitHub refused the request on {endpoint} (422): {message}")]
    Unprocessable {
        endpoint: &'static str,
        message: String,
    },
    #[error("GitHub server error ({status}) on {endpoint}: {message}")]
    Server {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
    #[error("GitHub unreachable on {endpoint}: {reason}")]
    Unreachable {
        endpoint: &'static str,
        reason: String,
    },
    #[error("unexpected answer from GitHub on {endpoint} ({status}): {message}")]
    Unexpected {
        endpoint: &'static str,
        status: u16,
        message: String,
    },
}

impl GithubError {
    /// When a caller may try again, for the classes that have such a time.
    pub fn retry_at(&self) -> Option<SystemTime> {
        match self {
            GithubError::RateLimited { retry_at, .. } => Some(*retry_at),
            _ => None,
        }
    }
}

/// GitHub's message on a 403 for a permission the installation was not granted.
pub const NOT_ACCESSIBLE_BY_INTEGRATION: &str = "Resource not accessible by integration";

/// GitHub's message on a 403 to a re-run while the job's workflow run is still running.
pub const RUN_IN_PROGRESS: &str = "is already running";

/// How a re-run request (`GithubClient::rerun_job`) failed, in the classes its caller acts on:
/// a refusal is final (never asked again), everything else is the request's ordinary error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RerunError {
    /// The App lacks the repository permission "Actions: Read and write" (GitHub's 403
    /// "Resource not accessible by integration"): GitHub did nothing.
    #[error(
        "GitHub refused to re-run the job: the App lacks the repository permission \"Actions: Read and write\" (actions: write); grant it and accept it on the installation ({message})"
    )]
    MissingActionsWrite { message: String },
    /// The job's workflow run is still running (another of its jobs is not finished): GitHub
    /// did nothing, and the same request may succeed once the run is done.
    #[error("GitHub will not re-run the job while its workflow run is running: {message}")]
    RunInProgress { message: String },
    /// GitHub refused this re-run for the job itself (too old to re-run, not found, ...):
    /// GitHub did nothing.
    #[error("GitHub refused to re-run the job ({status}): {message}")]
    Refused { status: u16, message: String },
    /// Any other failure: a limit (GitHub did nothing), or an error that leaves unknown whether
    /// GitHub acted (a server error, a lost connection).
    #[error(transparent)]
    Github(#[from] GithubError),
}

impl RerunError {
    /// Sorts a re-run request's failure: a 403 without a rate limit is a refusal, the missing
    /// permission and a run still running told apart by GitHub's message; a 404 or 422 is a
    /// refusal of this job.
    pub fn from_github(error: GithubError) -> RerunError {
        match error {
            GithubError::Forbidden { message, .. } => {
                if message.contains(NOT_ACCESSIBLE_BY_INTEGRATION) {
                    RerunError::MissingActionsWrite { message }
                } else if message.contains(RUN_IN_PROGRESS) {
                    RerunError::RunInProgress { message }
                } else {
                    RerunError::Refused {
                        status: 403,
                        message,
                    }
                }
            }
            GithubError::NotFound { message, .. } => RerunError::Refused {
                status: 404,
                message,
            },
            GithubError::Unprocessable { message, .. } => RerunError::Refused {
                status: 422,
                message,
            },
            other => RerunError::Github(other),
        }
    }

    /// Whether GitHub certainly did nothing and the same request may be sent later: a rate
    /// limit (GitHub's answer, or the client's budget holding the request back) or refused
    /// credentials (the request was not accepted). Every other error may have reached GitHub.
    pub fn not_acted(&self) -> bool {
        matches!(
            self,
            RerunError::RunInProgress { .. }
                | RerunError::Github(
                    GithubError::RateLimited { .. } | GithubError::Unauthorized { .. }
                )
        )
    }
}

/// The rate-limit headers of one response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub used: Option<u64>,
    /// `x-ratelimit-reset`, seconds since the epoch.
    pub reset: Option<u64>,
    pub resource: Option<String>,
    /// `retry-after`, in seconds.
    pub retry_after: Option<u64>,
}

impl RateHeaders {
    pub fn parse(headers: &HeaderMap) -> Self {
        let num = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        RateHeaders {
            limit: num("x-ratelimit-limit"),
            remaining: num("x-ratelimit-remaining"),
            used: num("x-ratelimit-used"),
            reset: num("x-ratelimit-reset"),
            resource: headers
                .get("x-ratelimit-resource")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            retry_after: num("retry-after"),
        }
    }
}

/// The permission a 403 on an endpoint most likely lacks, phrased as what to do.
pub fn remedy_for(endpoint: &'static str) -> &'static str {
    if endpoint == "repos.actions.job_rerun" {
        "grant the App the repository permission \"Actions: Read and write\" and accept it on the installation"
    } else if endpoint.starts_with("orgs.runner") {
        "grant the App the organization permission \"Self-hosted runners: Read and write\" and accept it on the installation"
    } else if endpoint.starts_with("repos.runner") {
        "grant the App the repository permission \"Administration: Read and write\" and accept it on the installation"
    } else if endpoint.starts_with("repos.actions") {
        "grant the App the repository permission \"Actions: Read\" and accept it on the installation"
    } else if endpoint.starts_with("app.") {
        "check that the JWT is signed with the App's current private key"
    } else {
        "check the App's permissions and that the installation covers this target"
    }
}

/// Classifies a non-success response. `now` dates the `retry-after` wait.
pub fn classify(
    endpoint: &'static str,
    status: StatusCode,
    headers: &HeaderMap,
    message: &str,
    now: SystemTime,
) -> GithubError {
    let rate = RateHeaders::parse(headers);
    let message = message.to_owned();
    let resource = rate.resource.clone().unwrap_or_else(|| "core".to_owned());
    match status.as_u16() {
        401 => GithubError::Unauthorized { message },
        403 | 429 => {
            if let Some(secs) = rate.retry_after {
                GithubError::RateLimited {
                    kind: LimitKind::Secondary,
                    resource,
                    retry_at: now + Duration::from_secs(secs),
                }
            } else if rate.remaining == Some(0) {
                GithubError::RateLimited {
                    kind: LimitKind::Primary,
                    resource,
                    retry_at: rate
                        .reset
                        .map(from_unix_secs)
                        .unwrap_or(now + SECONDARY_DEFAULT_WAIT),
                }
            } else if status == StatusCode::TOO_MANY_REQUESTS
                || message.to_ascii_lowercase().contains("rate limit")
            {
                GithubError::RateLimited {
                    kind: LimitKind::Secondary,
                    resource,
                    retry_at: now + SECONDARY_DEFAULT_WAIT,
                }
            } else {
                GithubError::Forbidden {
                    endpoint,
                    message,
                    remedy: remedy_for(endpoint),
                }
            }
        }
        404 => GithubError::NotFound { endpoint, message },
        409 => GithubError::Conflict { endpoint, message },
        422 => GithubError::Unprocessable { endpoint, message },
        s @ 500..=599 => GithubError::Server {
            endpoint,
            status: s,
            message,
        },
        s => GithubError::Unexpected {
            endpoint,
            status: s,
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                *k,
                HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        h
    }

    fn at(secs: u64) -> SystemTime {
        from_unix_secs(secs)
    }

    #[test]
    fn primary_limit_waits_for_the_reset() {
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "5000"),
            ("x-ratelimit-resource", "core"),
        ]);
        let e = classify(
            "x",
            StatusCode::FORBIDDEN,
            &h,
            "API rate limit exceeded",
            at(1000),
        );
        assert!(
            matches!(e, GithubError::RateLimited { kind: LimitKind::Primary, retry_at, .. } if retry_at == at(5000))
        );
    }

    #[test]
    fn retry_after_makes_a_secondary_limit_and_wins_over_reset() {
        let h = headers(&[
            ("retry-after", "30"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "5000"),
        ]);
        for status in [StatusCode::FORBIDDEN, StatusCode::TOO_MANY_REQUESTS] {
            let e = classify("x", status, &h, "", at(1000));
            assert!(
                matches!(e, GithubError::RateLimited { kind: LimitKind::Secondary, retry_at, .. } if retry_at == at(1030))
            );
        }
    }

    #[test]
    fn secondary_without_retry_after_waits_a_minute() {
        let h = headers(&[("x-ratelimit-remaining", "4000")]);
        let e = classify(
            "x",
            StatusCode::FORBIDDEN,
            &h,
            "You have exceeded a secondary rate limit",
            at(1000),
        );
        assert!(
            matches!(e, GithubError::RateLimited { kind: LimitKind::Secondary, retry_at, .. } if retry_at == at(1060))
        );
    }

    #[test]
    fn plain_403_is_a_permission_with_a_remedy() {
        let h = headers(&[("x-ratelimit-remaining", "4000")]);
        let e = classify(
            "orgs.runners.list",
            StatusCode::FORBIDDEN,
            &h,
            "Resource not accessible by integration",
            at(0),
        );
        match e {
            GithubError::Forbidden { remedy, .. } => {
                assert!(remedy.contains("Self-hosted runners"))
            }
            other => panic!("{other:?}"),
        }
        assert!(remedy_for("repos.runners.jit").contains("Administration"));
    }

    #[test]
    fn a_rerun_403_tells_the_missing_permission_from_a_refusal_and_a_limit() {
        let plenty = headers(&[("x-ratelimit-remaining", "4000")]);
        let rerun = |status: u16, h: &HeaderMap, message: &str| {
            RerunError::from_github(classify(
                "repos.actions.job_rerun",
                StatusCode::from_u16(status).unwrap_or_else(|e| panic!("{e}")),
                h,
                message,
                at(0),
            ))
        };
        let missing = rerun(403, &plenty, "Resource not accessible by integration");
        assert!(matches!(missing, RerunError::MissingActionsWrite { .. }));
        assert!(missing.to_string().contains("actions: write"));
        assert!(!missing.not_acted());
        let running = rerun(
            403,
            &plenty,
            "The workflow run containing this job is already running",
        );
        assert!(matches!(running, RerunError::RunInProgress { .. }));
        assert!(
            running.not_acted(),
            "GitHub did nothing: sent again once the run is done"
        );
        let other = rerun(403, &plenty, "This job cannot be re-run");
        assert!(matches!(other, RerunError::Refused { status: 403, .. }));
        assert!(!other.not_acted());
        assert!(matches!(
            rerun(404, &plenty, "Not Found"),
            RerunError::Refused { status: 404, .. }
        ));
        assert!(matches!(
            rerun(422, &plenty, "too old"),
            RerunError::Refused { status: 422, .. }
        ));
        // A limit is no refusal: GitHub did nothing, so it may be sent later.
        let limited = rerun(403, &headers(&[("retry-after", "30")]), "secondary");
        assert!(matches!(
            limited,
            RerunError::Github(GithubError::RateLimited { .. })
        ));
        assert!(limited.not_acted());
        // A server error may have re-run it.
        let server = rerun(502, &plenty, "bad gateway");
        assert!(matches!(
            server,
            RerunError::Github(GithubError::Server { .. })
        ));
        assert!(!server.not_acted());
        assert!(remedy_for("repos.actions.job_rerun").contains("Read and write"));
    }

    #[test]
    fn other_statuses_map_to_their_class() {
        let h = HeaderMap::new();
        let c = |s: u16| {
            classify(
                "x",
                StatusCode::from_u16(s).unwrap_or_else(|e| panic!("{e}")),
                &h,
                "m",
                at(0),
            )
        };
        assert!(matches!(c(401), GithubError::Unauthorized { .. }));
        assert!(matches!(c(404), GithubError::NotFound { .. }));
        assert!(matches!(c(409), GithubError::Conflict { .. }));
        assert!(matches!(c(422), GithubError::Unprocessable { .. }));
        assert!(matches!(c(502), GithubError::Server { status: 502, .. }));
        assert!(matches!(
            c(418),
            GithubError::Unexpected { status: 418, .. }
        ));
    }

    #[test]
    fn rate_headers_parse_and_tolerate_garbage() {
        let h = headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4999"),
            ("x-ratelimit-used", "1"),
            ("x-ratelimit-reset", "1700000000"),
            ("x-ratelimit-resource", "actions_runner_registration"),
            ("retry-after", "soon"),
        ]);
        let r = RateHeaders::parse(&h);
        assert_eq!(r.limit, Some(5000));
        assert_eq!(r.remaining, Some(4999));
        assert_eq!(r.used, Some(1));
        assert_eq!(r.reset, Some(1_700_000_000));
        assert_eq!(r.resource.as_deref(), Some("actions_runner_registration"));
        assert_eq!(r.retry_after, None);
    }
}
