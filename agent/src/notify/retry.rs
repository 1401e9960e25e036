//! What to do after one attempt to deliver a webhook notification: done, try again after a
//! wait, or give up. Pure: the sender (`super::webhook`) reports what the attempt came to and
//! sleeps as told.

use std::time::Duration;

use http::StatusCode;

/// How long one request may take, connection and TLS included, until its status arrives: a
/// receiver that takes longer is treated as down, and the attempt is retried.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The wait after the first failed attempt; each later one doubles it.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_secs(5);

/// The longest wait between two attempts, `Retry-After` included: a receiver restarting (a
/// deploy, a reboot) is back within minutes, and waiting longer only makes the alert stale.
pub(crate) const BACKOFF_CAP: Duration = Duration::from_secs(120);

/// Attempts per delivery, the first included. With [`BACKOFF_BASE`] and [`BACKOFF_CAP`] the
/// waits are 5, 10, 20, 40 and 80 seconds: a delivery is given up about two and a half minutes
/// (plus the requests' own time) after its first attempt.
pub(crate) const MAX_ATTEMPTS: u32 = 6;

/// The timing of deliveries: the `const`s above in the agent; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    pub(crate) timeout: Duration,
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    pub(crate) max_attempts: u32,
}

impl RetryPolicy {
    /// The agent's.
    pub(crate) const DEFAULT: RetryPolicy = RetryPolicy {
        timeout: REQUEST_TIMEOUT,
        base: BACKOFF_BASE,
        cap: BACKOFF_CAP,
        max_attempts: MAX_ATTEMPTS,
    };

    /// The wait after failed attempt `attempt` (1-based): `base * 2^(attempt-1)`, at most
    /// `cap`.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.base.saturating_mul(1 << doublings).min(self.cap)
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The receiver answered with this status (and maybe a `Retry-After` in seconds).
    Answered {
        status: StatusCode,
        retry_after: Option<Duration>,
    },
    /// No status within the request timeout.
    TimedOut,
    /// No connection, or the exchange broke (refused, DNS, TLS, reset); why, without the URL.
    Failed(String),
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// The receiver took it (2xx).
    Delivered,
    /// Try again after this wait.
    Retry(Duration),
    /// Stop; why, for the one warning.
    GiveUp(String),
}

/// Whether an answer with `status` is worth another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Delivered,
    /// The receiver may take it later: 5xx, 408 (it timed out reading), 429 (it wants it later).
    Transient,
    /// The same request will be refused again: any other 4xx (a wrong URL, a wrong signature),
    /// and a 1xx or 3xx (the agent follows no redirect: a webhook URL that moved is a
    /// configuration to fix).
    Final,
}

/// The verdict on `status`.
pub(crate) fn verdict(status: StatusCode) -> Verdict {
    if status.is_success() {
        Verdict::Delivered
    } else if status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
    {
        Verdict::Transient
    } else {
        Verdict::Final
    }
}

/// The step after attempt number `attempt` (1-based) came to `outcome`. A `Retry-After` is
/// honoured when it asks for longer than the back-off, up to the policy's cap: a receiver that
/// asks for an hour gets the remaining attempts at the cap instead, and then the delivery is
/// given up rather than held back from the events behind it.
pub(crate) fn step(policy: &RetryPolicy, attempt: u32, outcome: &Attempt) -> Step {
    let (why, retry_after) = match outcome {
        Attempt::Answered {
            status,
            retry_after,
        } => match verdict(*status) {
            Verdict::Delivered => return Step::Delivered,
            Verdict::Final => return Step::GiveUp(format!("answered {status}, which is final")),
            Verdict::Transient => (format!("answered {status}"), *retry_after),
        },
        Attempt::TimedOut => (
            format!("no answer within {}s", policy.timeout.as_secs_f32()),
            None,
        ),
        Attempt::Failed(why) => (why.clone(), None),
    };
    if attempt >= policy.max_attempts {
        return Step::GiveUp(format!("{why}, after {attempt} attempts"));
    }
    let wait = policy.backoff(attempt);
    Step::Retry(retry_after.map_or(wait, |asked| asked.max(wait).min(policy.cap)))
}

/// A `Retry-After` header's delay: whole seconds. The HTTP-date form is not read (the back-off
/// applies): receivers of notifications send the seconds form, and a date would need the
/// receiver's clock to agree with ours.
pub(crate) fn retry_after(value: Option<&http::HeaderValue>) -> Option<Duration> {
    let seconds: u64 = value?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}
