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

/// An outside review of [`parse_duration`]: hostile input gets a typed error (no panic, no
/// work beyond one pass), and the documented forms parse to what they say.
#[cfg(test)]
mod probes {
    use super::*;

    #[test]
    fn the_documented_forms_parse_to_what_they_say() {
        for (text, millis) in [
            ("500ms", 500),
            ("1s", 1_000),
            ("60s", 60_000),
            ("1m", 60_000),
            ("1h", 3_600_000),
            ("30s", 30_000),
            ("10m", 600_000),
            ("0ms", 0),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(millis)),
                "{text}"
            );
        }
        // Each unit's whole milliseconds, written back in that unit, parse back.
        for (unit, per) in [("ms", 1u64), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)] {
            for n in [0, 1, 7, 59, 60, 1_000, u64::MAX / per] {
                let text = format!("{n}{unit}");
                assert_eq!(
                    parse_duration(&text),
                    Ok(Duration::from_millis(n * per)),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn one_past_the_largest_of_each_unit_is_too_long() {
        for (unit, per) in [("s", 1_000u64), ("m", 60_000), ("h", 3_600_000)] {
            let text = format!("{}{unit}", u64::MAX / per + 1);
            assert_eq!(
                parse_duration(&text),
                Err(DurationError::TooLong(text.clone()))
            );
        }
        let text = format!("{}ms", u128::from(u64::MAX) + 1);
        assert_eq!(
            parse_duration(&text),
            Err(DurationError::TooLong(text.clone()))
        );
    }

    #[test]
    fn hostile_input_is_a_typed_error() {
        for bad in [
            "1e9999h", "1e3s", "0x10s", "1_000s", "1,000s", "\t1s", "1s\n", "1\u{a0}s", "1ｓ",
            "1ｍs", "1\u{0}s", "\u{0}", "1s1s", "1ms1", "1 h", "1hr", "1H", "1M", "1Ms", "inf",
            "NaNs", "𝟏s",
        ] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ten_megabyte_inputs_are_refused_with_a_short_message() {
        let ten_mb = 10 * 1024 * 1024;
        for (huge, too_long) in [
            (format!("{}s", "9".repeat(ten_mb)), true),
            (format!("{}s", "0".repeat(ten_mb)), false),
            ("9".repeat(ten_mb), false),
            ("é".repeat(ten_mb / 2), false),
            (format!("1{}", "s".repeat(ten_mb)), false),
        ] {
            let error = parse_duration(&huge);
            match &error {
                Err(DurationError::TooLong(shown)) => assert!(too_long && shown.len() < 300),
                Err(DurationError::Malformed(shown)) => assert!(!too_long && shown.len() < 300),
                Ok(parsed) => {
                    // Ten million zeros and a unit is zero: a whole number, as documented.
                    assert_eq!(*parsed, Duration::ZERO);
                    assert!(!too_long);
                }
            }
            if let Err(e) = error {
                assert!(e.to_string().len() < 400);
            }
        }
    }
}
