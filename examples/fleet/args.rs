//! The fleet's command line: [`Options`] from the arguments, and the help text.

use std::time::Duration;

use redlimit::{Algorithm, Quota};

use crate::common::cli::{self, CliError};
use crate::common::flags::{set_once, Arg, Args};

pub const USAGE: &str = "\
usage: cargo run --example fleet -- [OPTIONS]

Worker processes share one quota through Redis against a mock upstream that enforces it too.
Ends with: upstream: T requests in S s, W max in any aligned window, X answered 429

options:
  --redis URL          the Redis the workers share [default: $REDIS_URL or
                       redis://127.0.0.1:6379 if it answers; without one, exit 2]
  --workers N          worker processes [default: 4, at most 64]
  --limit N            requests per period, for the whole fleet [default: 20]
  --period DURATION    e.g. 500ms, 1s, 1m: the upstream's fixed windows [default: 1s]
  --seconds S          how long the workers call the upstream [default: 5, at most 3600]
  --upstream-limit N   the upstream's own quota per period [default: --limit]
  --announce DIALECT   the upstream announces its quota and what is left: ietf (RateLimit-Policy,
                       RateLimit) or x-ratelimit (X-RateLimit-*) [default: it does not]
  --learn              the workers learn the announced quota fleet-wide (at most --limit); prints
                       learned quota: L/PERIOD after N responses
  -h, --help           print this help";

/// The parsed command line.
#[derive(Debug)]
pub struct Options {
    pub redis: Option<String>,
    pub workers: u64,
    pub quota: Quota,
    pub seconds: u64,
    pub provider: ProviderOptions,
}

/// What the upstream enforces and announces, and whether the workers learn from it.
#[derive(Debug, Clone, Copy)]
pub struct ProviderOptions {
    /// The upstream's own quota (`--upstream-limit` per `--period`).
    pub quota: Quota,
    pub announce: Option<Dialect>,
    pub learn: bool,
}

/// The headers the upstream announces its quota in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dialect {
    Ietf,
    XRateLimit,
}

pub fn parse_args(args: Vec<String>) -> Result<Options, CliError> {
    let (mut redis, mut workers, mut limit, mut period, mut seconds) =
        (None, None, None, None, None);
    let (mut upstream_limit, mut announce, mut learn) = (None, None, None);
    let mut args = Args::new(args);
    while let Some(arg) = args.next_arg() {
        let (name, inline) = match arg {
            Arg::Flag { name, .. } if name == "-h" || name == "--help" => {
                return Err(CliError::Help)
            }
            Arg::Flag { name, inline } => (name, inline),
            Arg::Plain(other) => {
                return Err(CliError::Invalid(format!(
                    "unexpected argument {other:?} (see --help)"
                )))
            }
        };
        let has_value = inline.is_some();
        let value = || args.value(&name, inline);
        match name.as_str() {
            "--redis" => {
                let url = value()?;
                redis::Client::open(url.as_str()).map_err(|e| {
                    CliError::Invalid(format!("--redis: invalid URL {}: {e}", cli::redacted(&url)))
                })?;
                set_once(&mut redis, &name, url)?
            }
            "--workers" => set_once(&mut workers, &name, cli::parse_count(&name, &value()?)?)?,
            "--limit" => set_once(&mut limit, &name, cli::parse_count(&name, &value()?)?)?,
            "--period" => set_once(
                &mut period,
                &name,
                cli::parse_duration_of(&name, &value()?)?,
            )?,
            "--seconds" => set_once(&mut seconds, &name, cli::parse_count(&name, &value()?)?)?,
            "--upstream-limit" => set_once(
                &mut upstream_limit,
                &name,
                cli::parse_count(&name, &value()?)?,
            )?,
            "--announce" => {
                let dialect = match value()?.as_str() {
                    "ietf" => Dialect::Ietf,
                    "x-ratelimit" => Dialect::XRateLimit,
                    other => {
                        return Err(CliError::Invalid(format!(
                            "--announce: {other:?} is neither ietf nor x-ratelimit"
                        )))
                    }
                };
                set_once(&mut announce, &name, dialect)?
            }
            "--learn" => {
                if has_value {
                    return Err(CliError::Invalid("--learn takes no value".into()));
                }
                set_once(&mut learn, &name, true)?
            }
            other => {
                return Err(CliError::Invalid(format!(
                    "unknown argument {other:?} (see --help)"
                )))
            }
        }
    }
    let workers = workers.unwrap_or(4);
    if workers > 64 {
        return Err(CliError::Invalid("--workers: at most 64".into()));
    }
    let seconds = seconds.unwrap_or(5);
    if seconds > 3600 {
        return Err(CliError::Invalid("--seconds: at most 3600".into()));
    }
    let period = period.unwrap_or(Duration::from_secs(1));
    let quota = Quota::new(limit.unwrap_or(20), period).map_err(|e| {
        let flag = if period.is_zero() || period > redlimit::quota::MAX_PERIOD {
            "--period"
        } else {
            "--limit"
        };
        CliError::Invalid(format!("{flag}: {e}"))
    })?;
    if quota.period() < Duration::from_millis(1) {
        return Err(CliError::Invalid("--period: at least 1ms".into()));
    }
    Algorithm::FixedWindow
        .supports(&quota)
        .map_err(|e| CliError::Invalid(format!("--limit: {e}")))?;
    let upstream = Quota::new(upstream_limit.unwrap_or(quota.limit()), period)
        .map_err(|e| CliError::Invalid(format!("--upstream-limit: {e}")))?;
    if announce.is_some() && period.subsec_nanos() != 0 {
        // Both dialects count in whole seconds.
        return Err(CliError::Invalid(
            "--announce: --period must be whole seconds (the headers count seconds)".into(),
        ));
    }
    Ok(Options {
        redis,
        workers,
        quota,
        seconds,
        provider: ProviderOptions {
            quota: upstream,
            announce,
            learn: learn.unwrap_or(false),
        },
    })
}
