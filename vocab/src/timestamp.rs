//! GitHub's timestamps (RFC 3339), read and written once for the whole workspace, on [`UnixMs`]:
//! [`UnixMs::parse_rfc3339`] is the one parser (the handlers date a payload with it, `rm-github`
//! reads GitHub's REST answers with it, the agent a release's date) and [`UnixMs::to_rfc3339`]
//! the formatter of rm's millisecond timestamps (the agent's `output::rfc3339`, a notification's
//! `at`; a few messages still print whole seconds through humantime, unchanged). Both are
//! chrono's: humantime, the workspace's duration crate, refuses the numeric offsets GitHub sends
//! (`2021-04-28T22:32:21.000-04:00` in an installation's dates, and
//! `2020-01-20T09:42:40.000-08:00` in a job's steps), and octocrab already builds chrono, so the
//! agent compiles nothing new for it. Parsing is arithmetic: it reads no clock, so the handlers,
//! which have none, use it.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::UnixMs;

impl UnixMs {
    /// The instant an RFC 3339 date-time names (`YYYY-MM-DDTHH:MM:SS`, an optional fraction, then
    /// `Z` or `±HH:MM`), to the millisecond (further digits are truncated, as a time before the
    /// epoch is negative). `None` for anything else: a timestamp that cannot be read says nothing
    /// about a payload's age or a token's expiry, and each caller decides what that means.
    ///
    /// chrono's reading of RFC 3339 (`DateTime::parse_from_rfc3339`), so what it allows beyond
    /// GitHub's forms is RFC 3339's: a lower-case `t` or `z`, a space for the `T`, a leap second
    /// (`23:59:60`, the same instant as the next minute's `:00`), and a Unicode minus sign
    /// (U+2212) in the offset, which the hand-written parser it replaced refused.
    pub fn parse_rfc3339(text: &str) -> Option<Self> {
        DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| Self::new(t.timestamp_millis()))
    }

    /// This instant as RFC 3339 in UTC, to the millisecond (`2021-08-05T10:33:58.123Z`): what
    /// [`UnixMs::parse_rfc3339`] reads back. A year past 9999 is written with its sign
    /// (`+10000-…`, ISO 8601's expanded form) rather than refused, and an instant past what chrono
    /// holds (about 262,000 years either side of 1970, far short of `i64::MAX` milliseconds) as
    /// the last one it holds: a saturated `UnixMs` is printed, never a panic.
    pub fn to_rfc3339(self) -> String {
        let at = DateTime::<Utc>::from_timestamp_millis(self.get()).unwrap_or(if self.get() < 0 {
            DateTime::<Utc>::MIN_UTC
        } else {
            DateTime::<Utc>::MAX_UTC
        });
        at.to_rfc3339_opts(SecondsFormat::Millis, true)
    }
}

#[cfg(test)]
mod tests {
    use crate::UnixMs;

    fn ms(text: &str) -> Option<i64> {
        UnixMs::parse_rfc3339(text).map(UnixMs::get)
    }

    /// Every shape of date GitHub sends: the webhook fixtures (`tests/fixtures/webhooks/`) and
    /// the REST examples (`github-rest-subset.json`), each beside `date -u -d TEXT +%s%3N`.
    #[test]
    fn reads_the_shapes_github_sends() {
        for (text, expected) in [
            // `workflow_job.*`: created_at, and the installation's and repository's dates.
            ("2021-08-05T10:33:58Z", 1_628_159_638_000),
            // `workflow_job.*`: started_at and completed_at carry milliseconds.
            ("2021-08-05T10:33:58.123Z", 1_628_159_638_123),
            ("2021-08-05T10:33:58.000Z", 1_628_159_638_000),
            // `installation.suspend`/`unsuspend`: an offset, with milliseconds.
            ("2021-04-28T22:32:21.000-04:00", 1_619_663_541_000),
            // REST: a job's steps, and the token and App examples.
            ("2020-01-20T09:42:40.000-08:00", 1_579_542_160_000),
            ("2017-07-08T16:18:44-04:00", 1_499_545_124_000),
            ("2014-08-09T08:02:04+12:00", 1_407_528_124_000),
            ("2016-07-11T22:14:10Z", 1_468_275_250_000),
        ] {
            assert_eq!(ms(text), Some(expected), "{text:?}");
        }
    }

    #[test]
    fn offsets_fractions_and_the_calendar_s_edges() {
        for (text, expected) in [
            ("1970-01-01T00:00:00Z", 0),
            ("1970-01-01T00:00:00+00:00", 0),
            ("1970-01-01T00:00:00-00:00", 0),
            ("2021-08-05T12:33:58+02:00", 1_628_159_638_000),
            ("2021-08-05T05:33:58-05:00", 1_628_159_638_000),
            // The widest offsets RFC 3339 allows.
            ("2021-08-06T10:32:58+23:59", 1_628_159_638_000),
            ("2021-08-04T10:34:58-23:59", 1_628_159_638_000),
            // An offset that moves the date across a year.
            ("2020-12-31T23:30:00-01:00", 1_609_461_000_000),
            // A fraction of any length: the milliseconds are its first three digits, truncated.
            ("2021-08-05T10:33:58.1Z", 1_628_159_638_100),
            ("2021-08-05T10:33:58.12Z", 1_628_159_638_120),
            ("2021-08-05T10:33:58.123456Z", 1_628_159_638_123),
            ("2021-08-05T10:33:58.999999999999Z", 1_628_159_638_999),
            // Leap days, and 2000 (a leap year though divisible by 100).
            ("2024-02-29T23:59:59Z", 1_709_251_199_000),
            ("2000-02-29T00:00:00Z", 951_782_400_000),
            // A leap second is the next minute's first instant (as the old parser counted it).
            ("2016-12-31T23:59:60Z", 1_483_228_800_000),
            ("2016-12-31T23:59:60.500Z", 1_483_228_800_500),
            // Before the epoch: negative, the fraction still counted forward.
            ("1969-12-31T23:59:59Z", -1_000),
            ("1969-12-31T23:59:59.500Z", -500),
            // RFC 3339's other spellings: lower case, a space for the `T`.
            ("2021-08-05t10:33:58z", 1_628_159_638_000),
            ("2021-08-05 10:33:58Z", 1_628_159_638_000),
            ("9999-12-31T23:59:59.999Z", 253_402_300_799_999),
            ("0000-01-01T00:00:00Z", -62_167_219_200_000),
        ] {
            assert_eq!(ms(text), Some(expected), "{text:?}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_date_time() {
        for text in [
            "",
            "yesterday at noon, more or less",
            "2021-08-05",
            // No offset: a local time, which names no instant. The `rm-github` parser this
            // replaced read it as UTC; GitHub always sends one.
            "2021-08-05T10:33:58",
            "2021-08-05T10:33:58+0200",
            "2021-08-05T10:33:58+02",
            "2021-08-05T10:33:58+24:00",
            "2021-08-05T10:33:58+02:60",
            "2021-13-05T10:33:58Z",
            "2021-00-05T10:33:58Z",
            "2021-02-29T10:33:58Z",
            "2100-02-29T10:33:58Z",
            "2021-04-31T10:33:58Z",
            "2021-08-05T24:00:00Z",
            "2021-08-05T10:60:00Z",
            "2021-08-05T10:33:61Z",
            "2021-08-05T10:33:58.Z",
            "2021-08-05T10:33:58Zjunk",
            "2021-08-05T10:33:58Z ",
            // Surrounding space: the `rm-github` parser trimmed it; nothing GitHub sends has it.
            " 2021-08-05T10:33:58Z",
            "2021-08-05T10:33:58 Z",
            "+021-08-05T10:33:58Z",
            "+2021-08-05T10:33:58Z",
            "2021-8-5T10:33:58Z",
            "2021-08-05T10:33:58\u{e9}Z",
            "2021-08-05X10:33:58Z",
            "2021-08-05T10-33-58Z",
        ] {
            assert_eq!(ms(text), None, "{text:?}");
        }
    }

    /// The one place the parser reads more than the hand-written one it replaced: RFC 3339's
    /// minus sign may be U+2212 for chrono. Said here so that a change is a decision.
    #[test]
    fn a_unicode_minus_in_the_offset_is_read_as_a_minus() {
        assert_eq!(
            ms("2021-08-05T05:33:58\u{2212}05:00"),
            Some(1_628_159_638_000)
        );
    }

    #[test]
    fn formats_utc_to_the_millisecond_and_reads_back() {
        for (at, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_628_159_638_000, "2021-08-05T10:33:58.000Z"),
            (1_628_159_638_123, "2021-08-05T10:33:58.123Z"),
            (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
            (-500, "1969-12-31T23:59:59.500Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(UnixMs::new(at).to_rfc3339(), text);
            assert_eq!(ms(text), Some(at), "{text:?}");
        }
    }

    /// A saturated instant prints (humantime's formatter, which this replaced in the agent's
    /// output, panicked past the year 9999).
    #[test]
    fn formats_what_no_calendar_holds_without_panicking() {
        assert_eq!(
            UnixMs::new(253_402_300_800_000).to_rfc3339(),
            "+10000-01-01T00:00:00.000Z"
        );
        assert!(UnixMs::new(i64::MAX).to_rfc3339().starts_with("+262"));
        assert!(UnixMs::new(i64::MIN).to_rfc3339().starts_with("-262"));
    }

    proptest::proptest! {
        /// Every instant chrono's calendar holds within RFC 3339's years formats and reads back.
        #[test]
        fn every_instant_round_trips(at in -62_167_219_200_000_i64..=253_402_300_799_999) {
            proptest::prop_assert_eq!(ms(&UnixMs::new(at).to_rfc3339()), Some(at));
        }
    }
}
