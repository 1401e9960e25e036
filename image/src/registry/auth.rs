//! The pure half of a registry's authentication and transport rules: reading a
//! `WWW-Authenticate` challenge (the distribution spec's token auth: `Bearer realm=...,
//! service=...,scope=...`, or `Basic`), reading a token endpoint's answer, the token request's
//! URL, and which hosts may be spoken to in plain HTTP (Docker's insecure default: loopback
//! only). No I/O: `client` does the requests.

use secrecy::SecretString;

/// What a registry asked for in a `401`'s `WWW-Authenticate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// Get a token from `realm` (with basic credentials when we have them) and send it as
    /// `Authorization: Bearer`.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    /// Send the credentials as `Authorization: Basic`.
    Basic,
}

/// The first challenge of `header` this client can answer (Bearer before Basic when a header
/// offers both), or `None` when it offers neither or cannot be read. Scheme names are
/// case-insensitive; parameter values are tokens or quoted strings (RFC 7235), and a quoted
/// value may hold commas (`scope="repository:a:pull,push"`).
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let challenges = split_challenges(header)?;
    let bearer = challenges.iter().find_map(|(scheme, params)| {
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let get = |key: &str| {
            params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v.clone())
        };
        let realm = get("realm").filter(|r| !r.is_empty())?;
        Some(Challenge::Bearer {
            realm,
            service: get("service"),
            scope: get("scope"),
        })
    });
    bearer.or_else(|| {
        challenges
            .iter()
            .any(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .then_some(Challenge::Basic)
    })
}

/// A challenge's scheme and its parameters.
type Parsed = (String, Vec<(String, String)>);

/// Splits a `WWW-Authenticate` value into challenges. A new challenge starts at a token that is
/// not followed by `=` (its scheme); everything else is a `key=value` parameter of the current
/// one. `None` when the text cannot be read.
fn split_challenges(header: &str) -> Option<Vec<Parsed>> {
    let mut out: Vec<Parsed> = Vec::new();
    let mut rest = header.trim_start();
    while !rest.is_empty() {
        let token_len = rest
            .find(|c: char| c.is_whitespace() || c == '=' || c == ',')
            .unwrap_or(rest.len());
        let token = &rest[..token_len];
        let after = rest[token_len..].trim_start();
        if token.is_empty() {
            // A stray comma between parameters or challenges.
            rest = after.strip_prefix(',')?.trim_start();
            continue;
        }
        if let Some(value_text) = after.strip_prefix('=') {
            let (value, remaining) = read_value(value_text.trim_start())?;
            out.last_mut()?.1.push((token.to_owned(), value));
            rest = remaining.trim_start();
        } else {
            out.push((token.to_owned(), Vec::new()));
            rest = after;
        }
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(out)
}

/// Reads one parameter value (a quoted string with `\` escapes, or a token) and returns it with
/// the text after it.
fn read_value(text: &str) -> Option<(String, &str)> {
    if let Some(quoted) = text.strip_prefix('"') {
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Some((value, &quoted[i + 1..])),
                '\\' => value.push(chars.next()?.1),
                c => value.push(c),
            }
        }
        None
    } else {
        let end = text
            .find(|c: char| c.is_whitespace() || c == ',')
            .unwrap_or(text.len());
        Some((text[..end].to_owned(), &text[end..]))
    }
}

/// The token endpoint's URL for a Bearer challenge: the realm with `service` and `scope` added
/// to its query (percent-encoded). A challenge without a scope gets the pull scope of
/// `repository`, as Docker asks.
pub(crate) fn token_url(
    realm: &str,
    service: Option<&str>,
    scope: Option<&str>,
    repository: &str,
) -> String {
    let own_scope = format!("repository:{repository}:pull");
    let mut params: Vec<(&str, &str)> = Vec::new();
    if let Some(service) = service {
        params.push(("service", service));
    }
    params.push(("scope", scope.unwrap_or(&own_scope)));
    let mut url = realm.to_owned();
    let mut sep = if realm.contains('?') { '&' } else { '?' };
    for (key, value) in params {
        url.push(sep);
        url.push_str(key);
        url.push('=');
        url.push_str(&percent_encode(value));
        sep = '&';
    }
    url
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A token endpoint's answer: `token`, or OAuth2's `access_token` (the spec allows either).
#[derive(serde::Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

/// The token in a token endpoint's JSON answer. The error says what was wrong, never the body
/// (which holds the token).
pub(crate) fn read_token(body: &[u8]) -> Result<SecretString, &'static str> {
    let answer: TokenAnswer =
        serde_json::from_slice(body).map_err(|_| "the token endpoint's answer is not JSON")?;
    answer
        .token
        .filter(|t| !t.is_empty())
        .or(answer.access_token.filter(|t| !t.is_empty()))
        .map(SecretString::from)
        .ok_or("the token endpoint's answer holds no token")
}

/// Whether `host` (a URI's host: a name, an IPv4 address or a bracketed IPv6 address) is this
/// machine: `localhost`, 127.0.0.0/8 or `::1`. Docker's one default exception to HTTPS.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.eq_ignore_ascii_case("localhost") {
        return true;
    }
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request may go to `uri` in plain HTTP: HTTPS always may; `http` only to a
/// loopback host, or to the host of an endpoint the operator named with `http://` (a mirror),
/// `plain_host`.
pub(crate) fn scheme_allowed(uri: &http::Uri, plain_host: Option<&str>) -> bool {
    match uri.scheme_str() {
        Some("https") => true,
        Some("http") => uri.host().is_some_and(|host| {
            is_loopback_host(host) || plain_host.is_some_and(|p| p.eq_ignore_ascii_case(host))
        }),
        _ => false,
    }
}
