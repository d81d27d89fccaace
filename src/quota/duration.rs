//! [`parse_duration`]: the duration format of the examples' flags and the `redlimit` command.

use std::time::Duration;

/// The longest input an error repeats: hostile input stays out of messages and logs.
const SHOWN_INPUT: usize = 64;

/// Why [`parse_duration`] refused its input. The message repeats the input (at most its first 64
/// characters), so a caller only prefixes what it was for: `--period: "10x" is not a duration...`.
///
/// ```
/// use redlimit::quota::{parse_duration, DurationError};
///
/// let error = parse_duration("1.5s").unwrap_err();
/// assert!(matches!(error, DurationError::Malformed(_)));
/// assert_eq!(error.to_string(), r#""1.5s" is not a duration like 500ms, 1s, 60s, 1m or 1h"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a whole number followed by one of the units `ms`, `s`, `m`, `h`.
    #[error("{0:?} is not a duration like 500ms, 1s, 60s, 1m or 1h")]
    Malformed(String),
    /// A whole number and a unit, but more milliseconds than a `u64` holds.
    #[error("{0:?} is not a duration like 500ms, 1s, 60s, 1m or 1h: too long")]
    TooLong(String),
}

/// Parses a whole number followed by a unit: `500ms`, `30s`, `10m`, `1h`.
///
/// Nothing else is accepted: no sign, no fraction, no space, no other unit, no digits but ASCII
/// ones. Zero is a duration (`0s`): a caller that needs more than zero says so, as
/// [`Quota::new`](crate::Quota::new) does. A quota string `N/DURATION` uses this format for its
/// period.
///
/// ```
/// use std::time::Duration;
/// use redlimit::quota::parse_duration;
///
/// assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
/// assert!(parse_duration("10").is_err()); // no unit
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    // `digits` counts ASCII bytes only, so the split falls on a character boundary.
    let (number, unit) = text.split_at(digits);
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(DurationError::Malformed(shown(text))),
    };
    if number.is_empty() {
        return Err(DurationError::Malformed(shown(text)));
    }
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| DurationError::TooLong(shown(text)))
}

/// `text`, cut to [`SHOWN_INPUT`] characters.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_INPUT) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_number_and_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("007s"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn anything_else_is_malformed() {
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "+1s",
            " 1s",
            "1s ",
            "1 s",
            "1d",
            "1S",
            "1sec",
            "ms",
            "1µs",
            "١s",
            "１s",
            "1s\u{0}",
            "\u{202e}1s",
        ] {
            assert_eq!(
                parse_duration(bad),
                Err(DurationError::Malformed(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn numbers_beyond_a_u64_of_milliseconds_are_too_long() {
        let max = u64::MAX;
        assert_eq!(
            parse_duration(&format!("{max}ms")),
            Ok(Duration::from_millis(max))
        );
        for bad in [
            format!("{max}s"),
            format!("{}h", max / 3_600_000 + 1),
            "99999999999999999999h".to_owned(),
            format!("{}s", "9".repeat(10_000)),
        ] {
            assert!(
                matches!(parse_duration(&bad), Err(DurationError::TooLong(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_repeat_at_most_64_characters_of_the_input() {
        let long = "é".repeat(1_000);
        let Err(DurationError::Malformed(shown)) = parse_duration(&long) else {
            panic!("{long} parsed");
        };
        assert_eq!(shown, format!("{}...", "é".repeat(64)));
        let message = parse_duration(&long).unwrap_err().to_string();
        assert!(message.len() < 200, "{message}");
    }
}
