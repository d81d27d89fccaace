//! One flag's value at a time: counts, durations, addresses, URLs, the CA file.

use std::net::SocketAddr;
use std::time::Duration;

use redlimit::store::RedisStore;

use super::options::{invalid, CliError};

/// `flag`'s comma-separated URLs, at least one.
pub fn parse_url_list(flag: &str, value: &str) -> Result<Vec<String>, CliError> {
    let urls: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(invalid(format!("{flag} needs at least one URL")));
    }
    Ok(urls)
}

/// `--redis-sentinel`'s URLs and `--sentinel-master`'s name, checked the way the store checks
/// them (URLs, same credentials and scheme for every sentinel, a name).
pub fn check_sentinel(sentinels: &[String], master: &str) -> Result<(), CliError> {
    RedisStore::sentinel_builder(sentinels.iter().map(String::as_str), master)
        .build()
        .map_err(|e| {
            invalid(format!(
                "--redis-sentinel {} --sentinel-master {master:?}: {e}",
                shown_urls(sentinels)
            ))
        })?;
    Ok(())
}

/// URLs without their passwords, comma-separated, for printing.
pub fn shown_urls(urls: &[String]) -> String {
    let shown: Vec<String> = urls.iter().map(|u| redacted(u)).collect();
    shown.join(",")
}

/// `--redis-cluster`'s comma-separated node URLs, checked.
pub fn parse_cluster_urls(value: &str) -> Result<Vec<String>, CliError> {
    let urls = parse_url_list("--redis-cluster", value)?;
    RedisStore::cluster_builder(urls.iter().map(String::as_str))
        .build()
        .map_err(|e| {
            invalid(format!(
                "--redis-cluster: invalid URLs {}: {e}",
                shown_urls(&urls)
            ))
        })?;
    Ok(urls)
}

/// `--redis-ca`'s file: a PEM certificate.
pub fn read_ca(path: &str) -> Result<Vec<u8>, CliError> {
    let pem =
        std::fs::read(path).map_err(|e| invalid(format!("--redis-ca: cannot read {path}: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(invalid(format!(
            "--redis-ca: {path} holds no PEM certificate"
        )));
    }
    Ok(pem)
}

/// An address like `127.0.0.1:3000`.
pub fn parse_addr(flag: &str, value: &str) -> Result<SocketAddr, CliError> {
    value.parse().map_err(|_| {
        invalid(format!(
            "{flag}: {value:?} is not an address like 127.0.0.1:3000"
        ))
    })
}

/// A count of at least 1.
pub fn parse_count(flag: &str, value: &str) -> Result<u64, CliError> {
    match value.parse::<u64>() {
        Ok(0) => Err(invalid(format!("{flag} must be at least 1"))),
        Ok(n) => Ok(n),
        Err(_) => Err(invalid(format!("{flag}: {value:?} is not a whole number"))),
    }
}

/// `500ms`, `1s`, `60s`, `1m`, `1h`: a whole number and a unit.
pub fn parse_duration(value: &str) -> Result<Duration, CliError> {
    parse_duration_of("--period", value)
}

/// [`parse_duration`]'s format for any flag or argument: `what` names it in the error.
/// Zero is a valid duration here; callers that refuse it say so.
pub fn parse_duration_of(what: &str, value: &str) -> Result<Duration, CliError> {
    let bad = || {
        invalid(format!(
            "{what}: {value:?} is not a duration like 500ms, 1s, 60s, 1m or 1h"
        ))
    };
    let digits = value.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = value.split_at(digits);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let millis_per_unit = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    let millis = number.checked_mul(millis_per_unit).ok_or_else(bad)?;
    Ok(Duration::from_millis(millis))
}

/// `url` without its password, for printing.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}
