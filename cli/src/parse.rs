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

/// `set-quota`'s `N/DURATION` tiers, checked together.
pub fn quotas(args: &[String]) -> Result<Quotas, String> {
    if args.len() > MAX_TIERS {
        return Err(format!(
            "set-quota takes at most {MAX_TIERS} N/DURATION tiers, got {}",
            args.len()
        ));
    }
    let quotas = args
        .iter()
        .map(|arg| quota(arg))
        .collect::<Result<Vec<_>, _>>()?;
    Quotas::new(quotas).map_err(|e| format!("set-quota: {e}"))
}

/// `10/1s`: `N` requests per `DURATION`.
fn quota(arg: &str) -> Result<Quota, String> {
    let Some((count, period)) = arg.split_once('/') else {
        return Err(format!("{arg:?} is not N/DURATION, e.g. 10/1s or 500/1m"));
    };
    let what = format!("{arg:?}");
    let limit = match count.parse::<u64>() {
        Ok(0) => return Err(format!("{what}: N must be at least 1")),
        Ok(n) => n,
        Err(_) => return Err(format!("{what}: N: {count:?} is not a whole number")),
    };
    let period = duration(&what, period)?;
    Quota::new(limit, period).map_err(|e| match e {
        QuotaError::ZeroPeriod => format!("{what}: the period must be more than 0"),
        other => format!("{what}: {other}"),
    })
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
}
