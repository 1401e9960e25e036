//! Small pieces of GitHub's wire format: timestamps (RFC 3339, and the whole seconds of JWT
//! claims and rate-limit resets), query encoding, `Link` cursors.

use std::time::{Duration, SystemTime};

use rm_vocab::UnixMs;

/// Seconds since the Unix epoch, as JWT claims and `x-ratelimit-reset` count them; zero for a
/// time before it.
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The inverse of [`unix_secs`].
pub fn from_unix_secs(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// The `cursor` of the `rel="next"` link of a `Link` header.
pub fn next_cursor(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        if !params.split(';').any(|p| p.trim() == "rel=\"next\"") {
            return None;
        }
        let url = url.trim().trim_start_matches('<').trim_end_matches('>');
        let (_, query) = url.split_once('?')?;
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix("cursor="))
            .map(percent_decode)
    })
}

/// Percent-encodes a query value (everything but unreserved characters).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// GitHub's RFC 3339 timestamp (`2016-07-11T22:14:10Z`, `2017-07-08T16:18:44-04:00`) as a
/// time, read by the workspace's one parser, [`UnixMs::parse_rfc3339`]; this only converts its
/// answer for the callers that compare with a [`SystemTime`]. `None` for what it refuses, and for
/// a time before 1970 as before (a `SystemTime` here is never before the epoch), not the epoch
/// [`UnixMs::to_system_time`] would make of it.
///
/// Kept to the millisecond: the hand-written parser this replaced dropped the fraction (GitHub's
/// REST dates carry none, or `.000`), read a date without an offset as UTC, trimmed surrounding
/// space, and checked no field's range; the one parser refuses the last three.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    UnixMs::parse_rfc3339(s)
        .filter(|at| *at >= UnixMs::EPOCH)
        .map(UnixMs::to_system_time)
}

#[cfg(test)]
mod tests {
    use super::unix_secs;
    use super::*;

    #[test]
    fn rfc3339_timestamps_parse() {
        let t = |s| parse_rfc3339(s).map(unix_secs);
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(t("2016-07-11T22:14:10Z"), Some(1_468_275_250));
        assert_eq!(t("2016-07-12T00:14:10+02:00"), Some(1_468_275_250));
        assert_eq!(t("2017-07-08T16:18:44-04:00"), Some(1_499_545_124));
        assert_eq!(t("2024-02-29T12:00:00Z"), Some(1_709_208_000));
        assert_eq!(t("yesterday"), None);
        // Before the epoch: `None`, as the hand-written parser answered, not the epoch.
        assert_eq!(t("1969-12-31T23:59:59Z"), None);
    }

    /// Where the one parser answers otherwise than the hand-written one it replaced.
    #[test]
    fn rfc3339_differences_from_the_old_parser() {
        let ms = |s| parse_rfc3339(s).map(|at| UnixMs::from_system_time(at).get());
        // The fraction is kept (it was dropped: 1_468_275_250_000).
        assert_eq!(ms("2016-07-11T22:14:10.123Z"), Some(1_468_275_250_123));
        // No offset, surrounding space, a field out of range: refused (they were read).
        assert_eq!(ms("2016-07-11T22:14:10"), None);
        assert_eq!(ms(" 2016-07-11T22:14:10Z\n"), None);
        assert_eq!(ms("2016-13-11T22:14:10Z"), None);
        assert_eq!(ms("2016-7-11T22:14:10Z"), None);
    }

    #[test]
    fn next_cursor_follows_the_next_link_only() {
        let link = r#"<https://api.github.com/app/hook/deliveries?per_page=2&cursor=v1_12077215967>; rel="next", <https://api.github.com/app/hook/deliveries?per_page=2>; rel="first""#;
        assert_eq!(next_cursor(link).as_deref(), Some("v1_12077215967"));
        assert_eq!(next_cursor(r#"<https://x/?per_page=2>; rel="first""#), None);
        assert_eq!(
            next_cursor(r#"<https://x/?cursor=a%2Bb>; rel="next""#).as_deref(),
            Some("a+b")
        );
    }

    #[test]
    fn percent_encoding_round_trips() {
        assert_eq!(percent_encode("in_progress"), "in_progress");
        assert_eq!(percent_encode("a b+c/"), "a%20b%2Bc%2F");
        assert_eq!(percent_decode(&percent_encode("v1_ä=&")), "v1_ä=&");
    }
}
