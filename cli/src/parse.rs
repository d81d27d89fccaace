//! The values of the arguments clap leaves as text: durations, quotas, a header's key. Each
//! error is one line, for exit status 2.

use std::time::Duration;

use redlimit::key::{HeaderKey, KeyExtractor};
use redlimit::limiter::MAX_SUSPENSION;
use redlimit::quota::{parse_duration, QuotaError, MAX_TIERS};
use redlimit::{Quota, Quotas};

/// `500ms`, `30s`, `10m`, `1h`: the library's [`parse_duration`]. `what` names the argument in
/// the error. Zero is a duration here; callers that refuse it say so.
pub fn duration(what: &str, value: &str) -> Result<Duration, String> {
    parse_duration(value).map_err(|e| format!("{what}: {e}"))
}

/// `suspend`'s duration: more than zero, at most [`MAX_SUSPENSION`].
pub fn suspension(value: &str) -> Result<Duration, String> {
    let duration = duration("suspend", value)?;
    if duration.is_zero() {
        return Err("suspend: the duration must be more than 0".to_owned());
    }
    if duration > MAX_SUSPENSION {
        return Err(format!(
            "suspend: {value:?} is longer than the longest suspension, 30 days (720h)"
        ));
    }
    Ok(duration)
}

/// `limited --watch`'s interval: more than zero.
pub fn interval(value: &str) -> Result<Duration, String> {
    let interval = duration("--watch", value)?;
    if interval.is_zero() {
        return Err("--watch: the interval must be more than 0".to_owned());
    }
    Ok(interval)
}

/// `set-quota`'s tiers, checked together: each `N/DURATION`, then `burst B` when the burst
/// differs from `N`; one an argument or several in one, apart by spaces or commas. So the
/// override `inspect` prints (`10/1s, 500/1h burst 600`, see [`show::quotas_text`]) is taken
/// back as written, quoted or not.
///
/// [`show::quotas_text`]: crate::show::quotas_text
pub fn quotas(args: &[String]) -> Result<Quotas, String> {
    // An argument with no tier in it (``, `,`) is a mistake, not a separator.
    if let Some(empty) = args
        .iter()
        .find(|arg| arg.split([',', ' ']).all(str::is_empty))
    {
        return Err(format!("{empty:?} is not N/DURATION, e.g. 10/1s or 500/1m"));
    }
    let words = args
        .iter()
        .flat_map(|arg| arg.split([',', ' ']))
        .filter(|word| !word.is_empty());
    let mut tiers: Vec<(&str, Option<&str>)> = Vec::new();
    let mut words = words.peekable();
    while let Some(word) = words.next() {
        if word == BURST {
            return Err(format!(
                "set-quota: {BURST} B follows its tier, e.g. 500/1h {BURST} 600"
            ));
        }
        let burst = match words.next_if_eq(&BURST) {
            Some(_) => Some(words.next().ok_or_else(|| {
                format!("set-quota: {word:?} {BURST} needs the burst, e.g. 500/1h {BURST} 600")
            })?),
            None => None,
        };
        tiers.push((word, burst));
    }
    if tiers.len() > MAX_TIERS {
        return Err(format!(
            "set-quota takes at most {MAX_TIERS} N/DURATION tiers, got {}",
            tiers.len()
        ));
    }
    let quotas = tiers
        .iter()
        .map(|&(tier, burst)| quota(tier, burst))
        .collect::<Result<Vec<_>, _>>()?;
    Quotas::new(quotas).map_err(|e| format!("set-quota: {e}"))
}

/// The word before a tier's burst, as [`show::quotas_text`](crate::show::quotas_text) writes it.
const BURST: &str = "burst";

/// `10/1s`: `N` requests per `DURATION`; with `burst`, at most that many at once.
fn quota(arg: &str, burst: Option<&str>) -> Result<Quota, String> {
    let Some((count, period)) = arg.split_once('/') else {
        return Err(format!("{arg:?} is not N/DURATION, e.g. 10/1s or 500/1m"));
    };
    let what = format!("{arg:?}");
    let limit = match count.parse::<u64>() {
        Ok(0) => return Err(format!("{what}: N must be at least 1")),
        Ok(n) => n,
        Err(_) => return Err(format!("{what}: N: {count:?} is not a whole number")),
    };
    let period = self::period(&what, period)?;
    let quota = Quota::new(limit, period).map_err(|e| match e {
        QuotaError::ZeroPeriod => format!("{what}: the period must be more than 0"),
        other => format!("{what}: {other}"),
    })?;
    let Some(burst) = burst else {
        return Ok(quota);
    };
    let burst = burst
        .parse::<u64>()
        .map_err(|_| format!("{what} {BURST}: {burst:?} is not a whole number"))?;
    quota
        .with_burst(burst)
        .map_err(|e| format!("{what} {BURST} {burst}: {e}"))
}

/// A quota's period: a [`duration`], or whole microseconds (`5µs`, also `5us`), the unit
/// [`show::duration_text`](crate::show::duration_text) prints a period in when no larger one
/// shows it whole.
fn period(what: &str, text: &str) -> Result<Duration, String> {
    let micros = ["\u{b5}s", "\u{3bc}s", "us"]
        .iter()
        .find_map(|unit| text.strip_suffix(unit));
    match micros {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n
            .parse::<u64>()
            .map(Duration::from_micros)
            .map_err(|_| format!("{what}: {text:?} is too long a period")),
        _ => duration(what, text),
    }
}

/// The key [`HeaderKey`] makes of header `name` carrying `value`, in the layer.
pub fn header_key(name: &str, value: &str, secret: Option<Vec<u8>>) -> Result<String, String> {
    let extractor =
        HeaderKey::named(name).map_err(|_| format!("--header: {name:?} is not a header name"))?;
    let extractor = match secret {
        Some(secret) => extractor.with_secret(secret),
        None => extractor,
    };
    let (parts, ()) = http::Request::builder()
        .header(name, value)
        .body(())
        .map_err(|_| format!("KEY {value:?} is not a valid {name} header value"))?
        .into_parts();
    extractor
        .extract(&parts)
        .map(|key| key.into_owned())
        .ok_or_else(|| format!("KEY {value:?} gives no {name} key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_a_whole_number_and_a_unit() {
        assert_eq!(duration("x", "500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("x", "10m"), Ok(Duration::from_secs(600)));
        assert_eq!(duration("x", "0s"), Ok(Duration::ZERO));
        for bad in ["1.5s", "s", "10", "-1s", "1d", "99999999999999999999h"] {
            let error = duration("x", bad).unwrap_err();
            assert!(error.contains("is not a duration"), "{bad}: {error}");
        }
    }

    #[test]
    fn suspensions_are_more_than_zero_and_at_most_30_days() {
        assert_eq!(suspension("720h"), Ok(MAX_SUSPENSION));
        assert!(suspension("0ms").unwrap_err().contains("more than 0"));
        assert!(suspension("721h").unwrap_err().contains("30 days"));
    }

    #[test]
    fn quotas_are_tiers_of_n_per_duration() {
        let tiers = ["10/1s".to_owned(), "500/1m".to_owned()];
        let quotas = quotas(&tiers).unwrap();
        assert_eq!(
            quotas.as_slice(),
            [
                Quota::per_second(10).unwrap(),
                Quota::per_minute(500).unwrap()
            ]
        );
        for (bad, message) in [
            ("10", "is not N/DURATION"),
            ("0/1s", "at least 1"),
            ("x/1s", "whole number"),
            ("10/0s", "more than 0"),
            ("10/s", "is not a duration"),
        ] {
            let error = super::quotas(&[bad.to_owned()]).unwrap_err();
            assert!(error.contains(message), "{bad}: {error}");
        }
        let nine: Vec<String> = (1..=9).map(|s| format!("1/{s}s")).collect();
        assert!(super::quotas(&nine).unwrap_err().contains("at most 8"));
    }

    /// Every form `inspect` prints an override in (each unit of `duration_text`, a burst that
    /// differs, tiers apart by `, `) is what `set-quota` takes back, as one argument or split
    /// at spaces as a shell splits it unquoted.
    #[test]
    fn set_quota_takes_back_what_inspect_prints() {
        use crate::show::{duration_text, quotas_text};
        let periods = [
            Duration::from_secs(7200),
            Duration::from_secs(600),
            Duration::from_secs(90),
            Duration::from_millis(1500),
            Duration::from_micros(5),
            Duration::from_micros(1_000_001),
            Duration::from_micros(1),
        ];
        let printed: Vec<String> = periods.iter().map(|&p| duration_text(p)).collect();
        assert_eq!(
            printed,
            [
                "2h",
                "10m",
                "90s",
                "1500ms",
                "5\u{b5}s",
                "1000001\u{b5}s",
                "1\u{b5}s"
            ]
        );
        let mut tiers: Vec<Quota> = periods
            .iter()
            .map(|&period| Quota::new(3, period).unwrap())
            .collect();
        tiers[1] = tiers[1].with_burst(40).unwrap();
        tiers[4] = tiers[4].with_burst(1).unwrap();
        let quotas = Quotas::new(tiers).unwrap();
        let text = quotas_text(&quotas);
        assert_eq!(
            text,
            "3/2h, 3/10m burst 40, 3/90s, 3/1500ms, 3/5\u{b5}s burst 1, 3/1000001\u{b5}s, 3/1\u{b5}s"
        );
        let whole = super::quotas(std::slice::from_ref(&text)).unwrap();
        assert_eq!(whole.as_slice(), quotas.as_slice(), "{text}");
        let words: Vec<String> = text.split(' ').map(str::to_owned).collect();
        let split = super::quotas(&words).unwrap();
        assert_eq!(split.as_slice(), quotas.as_slice(), "{words:?}");
        for one in quotas.iter() {
            let one = Quotas::from(*one);
            let text = quotas_text(&one);
            let back = super::quotas(std::slice::from_ref(&text)).unwrap();
            assert_eq!(back.as_slice(), one.as_slice(), "{text}");
        }
        assert_eq!(
            super::quotas(&["5/7us".to_owned(), "5/7\u{3bc}s".to_owned()])
                .unwrap()
                .as_slice(),
            [Quota::new(5, Duration::from_micros(7)).unwrap(); 2]
        );
    }

    #[test]
    fn a_burst_follows_its_tier() {
        for (bad, message) in [
            (&["burst", "5"][..], "follows its tier"),
            (&["10/1s", "burst"], "needs the burst"),
            (&["10/1s", "burst", "x"], "not a whole number"),
            (&["10/1s", "burst", "0"], "burst must be at least 1"),
            (&["10/0\u{b5}s"], "more than 0"),
            (&["10/\u{b5}s"], "is not a duration"),
            (&["10/1s", ""], "\"\" is not N/DURATION"),
            (&["10/1s", ","], "\",\" is not N/DURATION"),
        ] {
            let args: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            let error = super::quotas(&args).unwrap_err();
            assert!(error.contains(message), "{bad:?}: {error}");
        }
    }
}
