//! The fake's clock: real time plus an offset a test can move forward, and GitHub's timestamp
//! format.

use std::time::{Duration, SystemTime};

/// Seconds since the epoch.
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = unix(t) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Real time shifted by `offset`.
pub fn shifted(offset: Duration) -> SystemTime {
    SystemTime::now() + offset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_github() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_468_275_250);
        assert_eq!(rfc3339(t), "2016-07-11T22:14:10Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_208_000);
        assert_eq!(rfc3339(leap), "2024-02-29T12:00:00Z");
    }
}
