//! GitHub's timestamps (`2021-08-05T10:33:58Z`, RFC 3339) as milliseconds since the Unix epoch,
//! parsed here because handlers have no clock and no date library: the only question they ask of
//! a timestamp is how old a payload says it is.

/// Milliseconds since the Unix epoch of an RFC 3339 date-time (`YYYY-MM-DDTHH:MM:SS`, an
/// optional fraction, then `Z` or `±HH:MM`). `None` for anything else: a timestamp that cannot
/// be read says nothing about the payload's age.
pub(crate) fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !bytes.is_ascii() {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = &text[range];
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let separators_ok = bytes[4] == b'-'
        && bytes[7] == b'-'
        && matches!(bytes[10], b'T' | b't' | b' ')
        && bytes[13] == b':'
        && bytes[16] == b':';
    if !separators_ok {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        // 60: a leap second, which GitHub does not send but RFC 3339 allows.
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        // Only the first three digits matter for milliseconds.
        let kept = &fraction[..digits.min(3)];
        millis = kept.parse::<i64>().ok()? * 10_i64.pow(3 - kept.len() as u32);
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let value = |a: u8, b: u8| i64::from(a - b'0') * 10 + i64::from(b - b'0');
            let (hours, minutes) = (value(*h1, *h2), value(*m1, *m2));
            if hours > 23 || minutes > 59 {
                return None;
            }
            let total = hours * 60 + minutes;
            if *sign == b'+' { total } else { -total }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339_ms;

    #[test]
    fn reads_githubs_forms() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        // `date -u -d 2021-08-05T10:33:58Z +%s` = 1628159638
        assert_eq!(
            parse_rfc3339_ms("2021-08-05T10:33:58Z"),
            Some(1_628_159_638_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2021-08-05T10:33:58.123456Z"),
            Some(1_628_159_638_123)
        );
        assert_eq!(
            parse_rfc3339_ms("2021-08-05T12:33:58+02:00"),
            Some(1_628_159_638_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2021-08-05T05:33:58-05:00"),
            Some(1_628_159_638_000)
        );
        // A leap day: `date -u -d 2024-02-29T23:59:59Z +%s` = 1709251199
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T23:59:59Z"),
            Some(1_709_251_199_000)
        );
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59Z"), Some(-1000));
    }

    #[test]
    fn refuses_what_is_not_a_date_time() {
        for text in [
            "",
            "2021-08-05",
            "2021-08-05T10:33:58",
            "2021-08-05T10:33:58+0200",
            "2021-13-05T10:33:58Z",
            "2021-02-29T10:33:58Z",
            "2021-08-05T24:00:00Z",
            "2021-08-05T10:33:58.Z",
            "2021-08-05T10:33:58Zjunk",
            "+021-08-05T10:33:58Z",
            "2021-08-05T10:33:58\u{e9}Z",
            "yesterday at noon, more or less",
        ] {
            assert_eq!(parse_rfc3339_ms(text), None, "{text:?}");
        }
    }
}
