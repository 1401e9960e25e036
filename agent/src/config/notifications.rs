//! The `[notifications]` table, validated: the kinds of operator event there are (the vocabulary
//! `events = [...]` and a webhook body's `"event"` share) and each `[[notifications.webhook]]`
//! entry. The notifier itself is `crate::notify`, which reads them; this module only says what
//! the file may hold, so that `config` stays a leaf.

use std::fmt;
use std::path::PathBuf;

/// The kind of an operator event: the unit the notifier's rate limit counts in, and the name
/// a webhook's `events` filter and its body's `"event"` use (CONTRACT §10).
///
/// A new kind of event (a job re-run, a runner's attributed failure such as `oom_killed`) is a
/// variant here, its name in [`EventKind::name`] and [`EventKind::ALL`], and the event that
/// carries it in `crate::notify::OperatorEvent`; every `match` on them says where else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    WebhooksStopped,
    CredentialsRejected,
    RunnersFailingToStart,
    DemandWaitingAtCapacity,
    HostUnfit,
    JobRerun,
    RunnerFailed,
    ScaleSetBackingOff,
}

impl EventKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [EventKind; 8] = [
        EventKind::WebhooksStopped,
        EventKind::CredentialsRejected,
        EventKind::RunnersFailingToStart,
        EventKind::DemandWaitingAtCapacity,
        EventKind::HostUnfit,
        EventKind::JobRerun,
        EventKind::RunnerFailed,
        EventKind::ScaleSetBackingOff,
    ];

    /// The kind's name in `snake_case`, as the configuration and a webhook body write it.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::WebhooksStopped => "webhooks_stopped",
            EventKind::CredentialsRejected => "credentials_rejected",
            EventKind::RunnersFailingToStart => "runners_failing_to_start",
            EventKind::DemandWaitingAtCapacity => "demand_waiting_at_capacity",
            EventKind::HostUnfit => "host_unfit",
            EventKind::JobRerun => "job_rerun",
            EventKind::RunnerFailed => "runner_failed",
            EventKind::ScaleSetBackingOff => "scale_set_backing_off",
        }
    }

    /// The kind named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `[[notifications.webhook]]` as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    pub url: String,
    pub secret_file: Option<PathBuf>,
    pub events: Option<Vec<String>>,
}

/// One validated `[[notifications.webhook]]` entry.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// Where events are posted.
    pub url: WebhookUrl,
    /// The HMAC-SHA256 key's file (read once when `run` starts, by `crate::secrets`); `None`:
    /// bodies go unsigned.
    pub secret_file: Option<PathBuf>,
    /// The kinds this endpoint wants, in [`EventKind::ALL`]'s order; every kind by default.
    pub events: Vec<EventKind>,
}

/// A webhook's URL: `http://` or `https://`, with a host and without a user. It may carry a
/// token (Slack's and Discord's incoming webhooks keep theirs in the path, others in the
/// query), so what it prints ([`fmt::Debug`], [`fmt::Display`], [`WebhookUrl::redacted`]) is
/// its scheme and authority only; [`WebhookUrl::uri`] is for the request alone.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookUrl(http::Uri);

impl WebhookUrl {
    /// The whole URL, to send to.
    pub fn uri(&self) -> &http::Uri {
        &self.0
    }

    /// `scheme://host[:port]`: what logs, metrics and errors may show of it.
    pub fn redacted(&self) -> String {
        let scheme = self.0.scheme_str().unwrap_or("http");
        let authority = self.0.authority().map_or("", |a| a.as_str());
        format!("{scheme}://{authority}")
    }

    /// The host, for a metric's label.
    pub fn host(&self) -> &str {
        self.0.host().unwrap_or_default()
    }
}

impl fmt::Debug for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WebhookUrl({}/…)", self.redacted())
    }
}

impl fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Validates one `[[notifications.webhook]]` entry; the error names the field (without the
/// table's prefix) and why. The URL is never repeated in an error: it may carry a token.
pub fn webhook(section: WebhookSection) -> Result<Webhook, (&'static str, String)> {
    let url = webhook_url(&section.url).map_err(|problem| ("url", problem))?;
    if section
        .secret_file
        .as_ref()
        .is_some_and(|p| p.as_os_str().is_empty())
    {
        return Err((
            "secret_file",
            "is empty; name the file holding the HMAC key, or leave the key out for unsigned bodies"
                .to_owned(),
        ));
    }
    let events = match section.events {
        None => EventKind::ALL.to_vec(),
        Some(names) => events(&names).map_err(|problem| ("events", problem))?,
    };
    Ok(Webhook {
        url,
        secret_file: section.secret_file,
        events,
    })
}

/// `url`: an absolute `http://` or `https://` URL with a host and no user. Plain `http://` is
/// allowed anywhere: a body carries no secret, and the signature (with a `secret_file`) shows
/// a receiver it came from this agent unchanged; docs/security.md says what it does not hide.
fn webhook_url(text: &str) -> Result<WebhookUrl, String> {
    let lower = text.to_ascii_lowercase();
    if !(lower.starts_with("https://") || lower.starts_with("http://")) {
        return Err(
            "is not an http:// or https:// URL (write it like \"https://alerts.example.net/rm\")"
                .to_owned(),
        );
    }
    let uri: http::Uri = text.parse().map_err(|_| {
        "is not a valid URL (write it like \"https://alerts.example.net/rm\")".to_owned()
    })?;
    let Some(authority) = uri.authority() else {
        return Err("names no host".to_owned());
    };
    if authority.as_str().contains('@') {
        return Err(
            "carries a user name or password before the host; rm sends none (put a token in the path or query, or sign bodies with `secret_file`)"
                .to_owned(),
        );
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("names no host".to_owned());
    }
    if uri.port_u16() == Some(0) {
        return Err("has port 0".to_owned());
    }
    Ok(WebhookUrl(uri))
}

/// `events`: kind names, each known and listed once, at least one.
fn events(names: &[String]) -> Result<Vec<EventKind>, String> {
    if names.is_empty() {
        return Err(
            "is empty, so nothing would be sent; leave the key out for every kind".to_owned(),
        );
    }
    let mut kinds = Vec::with_capacity(names.len());
    for name in names {
        let Some(kind) = EventKind::from_name(name) else {
            let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
            return Err(format!(
                "`{name}` is not a kind of event; the kinds are {}",
                known.join(", ")
            ));
        };
        if kinds.contains(&kind) {
            return Err(format!("`{name}` is listed twice"));
        }
        kinds.push(kind);
    }
    kinds.sort();
    Ok(kinds)
}
