//! Reading an upstream's `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.
//!
//! HTTP-dates are read by `httpdate` (hyper's parser) in the three formats a recipient must
//! accept (RFC 9110 §5.6.7): the IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT` and the obsolete
//! RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`, a two-digit year below 70 in 20xx) and asctime
//! (`Sun Nov  6 08:49:37 1994`) forms, from 1970 to 9999, each with a day name that matches its
//! date. The leap second RFC 9110 allows (`23:59:60`), which `httpdate` refuses, reads as the
//! next second.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

/// How long an upstream asked the whole fleet to back off: its `Retry-After` on a `429` or
/// `503`, when that is a positive duration. `None` for any other answer, a missing or
/// unreadable header, or a date that has passed.
pub(crate) fn upstream_backoff(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
        return None;
    }
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    parse_retry_after(value, now).filter(|wait| !wait.is_zero())
}

/// A `Retry-After` value as a duration from `now`: delay-seconds, or an HTTP-date (zero when
/// it has passed). `None` when it is neither.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Absurdly long numbers saturate; the caller clamps.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = http_date(value)?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An HTTP-date in any of its three formats; `None` when `value` is not one.
fn http_date(value: &str) -> Option<SystemTime> {
    if let Ok(date) = httpdate::parse_http_date(value) {
        return Some(date);
    }
    // A leap second: `:60` and a space (the seconds; the minutes are followed by `:`).
    let leap = value.find(":60 ")?;
    let mut text = value.to_owned();
    text.replace_range(leap..leap + 3, ":59");
    let date = httpdate::parse_http_date(&text).ok()?;
    Some(date + Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    /// RFC 9110's example date in its three formats.
    const EXAMPLE: u64 = 784_111_777;

    /// Seconds since the Unix epoch of an HTTP-date, `None` when it is not one.
    fn http_date_unix_secs(value: &str) -> Option<u64> {
        let date = http_date(value)?;
        Some(date.duration_since(UNIX_EPOCH).ok()?.as_secs())
    }

    #[test]
    fn the_three_http_date_formats_agree() {
        for text in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(http_date_unix_secs(text), Some(EXAMPLE), "{text}");
        }
    }

    #[test]
    fn dates_match_known_timestamps() {
        let cases = [
            ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
            ("Sat, 01 Jan 2000 00:00:00 GMT", 946_684_800),
            ("Tue, 29 Feb 2000 12:00:00 GMT", 951_825_600),
            ("Tue, 19 Jan 2038 03:14:08 GMT", 1 << 31),
            ("Thu, 29 Feb 2024 23:59:59 GMT", 1_709_251_199),
            ("Tue, 01 Dec 2026 02:16:18 GMT", 1_796_091_378),
            ("Fri, 01 Jan 2100 00:00:00 GMT", 4_102_444_800),
            ("Thursday, 01-Jan-70 00:00:00 GMT", 0),
            ("Tuesday, 31-Dec-69 23:59:59 GMT", 3_155_759_999), // 2069
            // A leap second is the next second.
            ("Wed, 31 Dec 2008 23:59:60 GMT", 1_230_768_000),
            ("Wed Dec 31 23:59:60 2008", 1_230_768_000),
        ];
        for (text, secs) in cases {
            assert_eq!(http_date_unix_secs(text), Some(secs), "{text}");
        }
    }

    #[test]
    fn a_day_name_that_is_not_the_dates_is_refused() {
        for text in [
            "Mon, 06 Nov 1994 08:49:37 GMT",
            "Monday, 06-Nov-94 08:49:37 GMT",
            "Mon Nov  6 08:49:37 1994",
            "Wednesday, 01-Jan-70 00:00:00 GMT",
            "Fri, 31 Dec 2008 23:59:60 GMT",
        ] {
            assert_eq!(http_date_unix_secs(text), None, "{text:?}");
        }
    }

    #[test]
    fn malformed_dates_are_refused() {
        for text in [
            "",
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49:37 gmt",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Wed, 29 Feb 2023 00:00:00 GMT",
            "Mon, 29 Feb 1900 00:00:00 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
            "Sunday, 06 Nov 1994 08:49:37 GMT",
            "Sun,  06 Nov 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sun Nov  6 08:49:37 94",
            "Sun Nov 006 08:49:37 1994",
            "Sun, 06 Nov 1994 08:49:3a GMT",
            "Sun, +6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:60:37 GMT",
            "Sun, 06 Nov 1994 08:49:61 GMT",
        ] {
            assert_eq!(http_date_unix_secs(text), None, "{text:?}");
        }
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_from_now() {
        let now = UNIX_EPOCH + Duration::from_secs(EXAMPLE);
        let parse = |text| parse_retry_after(text, now);
        assert_eq!(parse("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(
            parse("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:47 GMT"),
            Some(Duration::from_secs(10))
        );
        assert_eq!(parse("Sun, 06 Nov 1994 08:49:30 GMT"), Some(Duration::ZERO)); // passed
        for bad in ["", "-1", "1.5", "2s", "soon", "+3"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_429_and_503_with_a_positive_wait_back_off() {
        let now = UNIX_EPOCH + Duration::from_secs(EXAMPLE);
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::RETRY_AFTER, value.parse().unwrap());
            headers
        };
        let two = Some(Duration::from_secs(2));
        assert_eq!(
            upstream_backoff(StatusCode::TOO_MANY_REQUESTS, &with("2"), now),
            two
        );
        assert_eq!(
            upstream_backoff(StatusCode::SERVICE_UNAVAILABLE, &with("2"), now),
            two
        );
        assert_eq!(upstream_backoff(StatusCode::OK, &with("2"), now), None);
        assert_eq!(
            upstream_backoff(StatusCode::BAD_GATEWAY, &with("2"), now),
            None
        );
        let status = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(upstream_backoff(status, &HeaderMap::new(), now), None);
        assert_eq!(upstream_backoff(status, &with("0"), now), None);
        assert_eq!(upstream_backoff(status, &with("later"), now), None);
        let passed = with("Sun, 06 Nov 1994 08:00:00 GMT");
        assert_eq!(upstream_backoff(status, &passed, now), None);
    }
}
