//! Small pieces of GitHub's wire format: timestamps, query encoding, `Link` cursors.

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

/// Parses GitHub's `YYYY-MM-DDTHH:MM:SSZ` (offsets and fractions accepted) as a time.
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let s = s.trim();
    let (date, rest) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time = rest.get(0..8)?;
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let tail = rest.get(8..)?;
    let tail = tail.trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    let offset = match tail {
        "Z" | "z" | "" => 0,
        o => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            let (oh, om) = o.get(1..)?.split_once(':')?;
            sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60)
        }
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss - offset;
    u64::try_from(secs).ok().map(crate::clock::from_unix_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::unix_secs;

    #[test]
    fn rfc3339_timestamps_parse() {
        let t = |s| parse_rfc3339(s).map(unix_secs);
        assert_eq!(t("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(t("2016-07-11T22:14:10Z"), Some(1_468_275_250));
        assert_eq!(t("2016-07-11T22:14:10.123Z"), Some(1_468_275_250));
        assert_eq!(t("2016-07-12T00:14:10+02:00"), Some(1_468_275_250));
        assert_eq!(t("2024-02-29T12:00:00Z"), Some(1_709_208_000));
        assert_eq!(t("yesterday"), None);
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
