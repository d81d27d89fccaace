//! Reading an upstream's `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.
//!
//! The HTTP-date parser accepts the three formats a recipient must accept (RFC 9110 §5.6.7,
//! formerly RFC 7231 §7.1.1.1): the IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT` and the obsolete
//! RFC 850 (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37 1994`) forms.
//! (`httpdate` is only in the tree through optional and dev dependencies, hence these few lines.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};

const SHORT_DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

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
    let date = UNIX_EPOCH + Duration::from_secs(http_date_unix_secs(value)?);
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The seconds since the Unix epoch of an HTTP-date in any of its three formats; `None` when
/// `value` is not one (or is before 1970).
pub(crate) fn http_date_unix_secs(value: &str) -> Option<u64> {
    match value.split_once(", ") {
        Some((day, rest)) if SHORT_DAYS.contains(&day) => imf_fixdate(rest),
        Some((day, rest)) if LONG_DAYS.contains(&day) => rfc850_date(rest),
        Some(_) => None,
        None => asctime_date(value),
    }
}

/// `06 Nov 1994 08:49:37 GMT` (after the day name).
fn imf_fixdate(rest: &str) -> Option<u64> {
    let mut fields = rest.split(' ');
    let day = number(fields.next()?, 2..=2)?;
    let month = month(fields.next()?)?;
    let year = number(fields.next()?, 4..=4)?;
    let time = fields.next()?;
    (fields.next()? == "GMT" && fields.next().is_none()).then_some(())?;
    unix_secs(year, month, day, time)
}

/// `06-Nov-94 08:49:37 GMT` (after the day name). A two-digit year below 70 is in 20xx.
fn rfc850_date(rest: &str) -> Option<u64> {
    let mut fields = rest.split(' ');
    let mut date = fields.next()?.split('-');
    let time = fields.next()?;
    (fields.next()? == "GMT" && fields.next().is_none()).then_some(())?;
    let day = number(date.next()?, 2..=2)?;
    let month = month(date.next()?)?;
    let year = number(date.next()?, 2..=2)?;
    date.next().is_none().then_some(())?;
    let year = if year < 70 { 2000 + year } else { 1900 + year };
    unix_secs(year, month, day, time)
}

/// `Sun Nov  6 08:49:37 1994` (the day of the month padded with a space).
fn asctime_date(value: &str) -> Option<u64> {
    let mut fields = value.split_whitespace();
    SHORT_DAYS.contains(&fields.next()?).then_some(())?;
    let month = month(fields.next()?)?;
    let day = number(fields.next()?, 1..=2)?;
    let time = fields.next()?;
    let year = number(fields.next()?, 4..=4)?;
    fields.next().is_none().then_some(())?;
    unix_secs(year, month, day, time)
}

/// `digits` ASCII digits, as a number.
fn number(text: &str, digits: std::ops::RangeInclusive<usize>) -> Option<u64> {
    let valid = digits.contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    valid.then(|| text.parse().ok()).flatten()
}

/// `Jan` is 1.
fn month(name: &str) -> Option<u64> {
    MONTHS.iter().position(|m| *m == name).map(|i| i as u64 + 1)
}

/// Seconds since the epoch of a valid date and `HH:MM:SS` time (a leap second counts as the
/// next second).
fn unix_secs(year: u64, month: u64, day: u64, time: &str) -> Option<u64> {
    let mut hms = time.split(':');
    let hour = number(hms.next()?, 2..=2)?;
    let minute = number(hms.next()?, 2..=2)?;
    let second = number(hms.next()?, 2..=2)?;
    let valid = hms.next().is_none()
        && year >= 1970
        && (1..=days_in_month(year, month)).contains(&day)
        && hour < 24
        && minute < 60
        && second <= 60;
    valid.then(|| days_since_epoch(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date on or after it (the proleptic Gregorian calendar, counted in
/// years that start on March 1st so that the leap day ends them).
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year % 400;
    let shifted_month = (month + 9) % 12; // March is 0
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719_468 days from 0000-03-01 to 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9110's example date in its three formats.
    const EXAMPLE: u64 = 784_111_777;

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
            ("Wednesday, 01-Jan-70 00:00:00 GMT", 0),
            ("Friday, 31-Dec-69 23:59:59 GMT", 3_155_759_999), // 2069
        ];
        for (text, secs) in cases {
            assert_eq!(http_date_unix_secs(text), Some(secs), "{text}");
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
