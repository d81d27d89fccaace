//! Reads the command line into [`Options`].

use std::collections::HashSet;
use std::time::Duration;

use redlimit::{quota::QuotaError, Algorithm, Quota};

use super::options::{invalid, Backend, CliError, KeyChoice, OnRedisError, Options, Program};
use super::values::{
    check_sentinel, parse_addr, parse_cluster_urls, parse_count, parse_duration, parse_url_list,
    read_ca, redacted,
};

/// Parses `args` (without the program name).
pub fn parse_args(
    program: &Program,
    args: impl IntoIterator<Item = String>,
) -> Result<Options, CliError> {
    let mut bind = program.default_bind.to_owned();
    let mut backend = Backend::Auto;
    let mut limit = 10;
    let mut period = Duration::from_secs(60);
    let mut burst = None;
    let mut algorithm = Algorithm::default();
    let mut policy = "open".to_owned();
    let mut instances = None;
    let mut redis_ca = None;
    let mut metrics_bind = None;
    let mut sentinel_master: Option<String> = None;
    let mut key = KeyChoice::default();
    let mut shadow = false;
    // A flag given twice is a mistake, not "the last one wins" (as in the fleet
    // example).
    let mut seen = HashSet::new();

    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Err(CliError::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.into())),
            _ => (arg, None),
        };
        if flag.starts_with("--") && !seen.insert(flag.clone()) {
            return Err(invalid(format!("give {flag} once")));
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| invalid(format!("{flag} needs a value (see --help)")))
        };
        match flag.as_str() {
            "--bind" => bind = value()?,
            "--shadow" if inline.is_none() => shadow = true,
            "--shadow" => return Err(invalid("--shadow takes no value")),
            "--redis-cluster" => backend.set(Backend::Cluster(parse_cluster_urls(&value()?)?))?,
            "--redis-sentinel" => {
                let sentinels = parse_url_list(&flag, &value()?)?;
                // The master name comes with its own flag; it is filled in after the loop.
                backend.set(Backend::Sentinel {
                    sentinels,
                    master: String::new(),
                })?;
            }
            "--sentinel-master" => {
                if sentinel_master.is_some() {
                    return Err(invalid("give --sentinel-master once"));
                }
                sentinel_master = Some(value()?);
            }
            "--redis" => {
                let url = value()?;
                redis::Client::open(url.as_str()).map_err(|e| {
                    invalid(format!("--redis: invalid URL {}: {e}", redacted(&url)))
                })?;
                backend.set(Backend::Redis(url))?;
            }
            "--redis-ca" => redis_ca = Some(read_ca(&value()?)?),
            "--metrics-bind" if program.serves_metrics => {
                metrics_bind = Some(parse_addr(&flag, &value()?)?)
            }
            "--limit" => limit = parse_count(&flag, &value()?)?,
            "--period" => period = parse_duration(&value()?)?,
            "--burst" => burst = Some(parse_count(&flag, &value()?)?),
            "--algorithm" => {
                algorithm = value()?
                    .parse()
                    .map_err(|e| invalid(format!("--algorithm: {e}")))?;
            }
            "--on-redis-error" => policy = value()?,
            "--instances" => instances = Some(parse_count(&flag, &value()?)?),
            "--key" => {
                key = match value()?.as_str() {
                    "ip" => KeyChoice::Ip,
                    "api-key" => KeyChoice::ApiKey,
                    other => {
                        return Err(invalid(format!(
                            "--key: expected ip or api-key, got {other:?}"
                        )))
                    }
                }
            }
            other => return Err(invalid(format!("unknown argument {other:?} (see --help)"))),
        }
    }

    let on_redis_error = match (policy.as_str(), instances) {
        ("local", instances) => OnRedisError::Local {
            instances: instances.unwrap_or(1),
        },
        ("open" | "closed", Some(_)) => {
            return Err(invalid(
                "--instances applies only to --on-redis-error local",
            ))
        }
        ("open", None) => OnRedisError::Open,
        ("closed", None) => OnRedisError::Closed,
        (other, _) => {
            return Err(invalid(format!(
                "--on-redis-error: expected open, closed or local, got {other:?}"
            )))
        }
    };
    let bind = parse_addr("--bind", &bind)?;
    let quota = Quota::new(limit, period).map_err(|e| match e {
        QuotaError::ZeroPeriod | QuotaError::PeriodTooLong => invalid(format!("--period: {e}")),
        _ => invalid(format!("--limit: {e}")),
    })?;
    let quota = match burst {
        Some(burst) => quota
            .with_burst(burst)
            .map_err(|e| invalid(format!("--burst: {e}")))?,
        None => quota,
    };
    // A quota the algorithm refuses would make the layer deny every request: a usage error.
    algorithm
        .supports(&quota)
        .map_err(|e| invalid(format!("--limit/--burst for --algorithm {algorithm}: {e}")))?;
    match (&mut backend, sentinel_master) {
        (Backend::Sentinel { sentinels, master }, Some(name)) => {
            check_sentinel(sentinels, &name)?;
            *master = name;
        }
        (Backend::Sentinel { .. }, None) => {
            return Err(invalid(
                "--redis-sentinel needs --sentinel-master NAME (the name the sentinels monitor \
                 the primary under)",
            ))
        }
        (_, Some(_)) => {
            return Err(invalid(
                "--sentinel-master needs --redis-sentinel URL,URL,... (the sentinels)",
            ))
        }
        (_, None) => {}
    }
    if redis_ca.is_some() && backend == Backend::Auto {
        return Err(invalid(
            "--redis-ca needs --redis rediss://..., --redis-cluster rediss://... or \
             --redis-sentinel rediss://...",
        ));
    }
    Ok(Options {
        bind,
        backend,
        redis_ca,
        metrics_bind,
        quota,
        algorithm,
        on_redis_error,
        key,
        shadow,
    })
}
