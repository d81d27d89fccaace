//! The fleet example's command line: its help, which declares the flags `flags::read` reads, and
//! the checks on their values (a usage error exits 2).

use std::time::Duration;

use redlimit::{Algorithm, Quota};

use super::flags::{self, invalid, redacted, CliError};

/// The help; each `--NAME` line declares a flag.
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
pub struct Options {
    pub redis: Option<String>,
    pub workers: u64,
    pub quota: Quota,
    pub seconds: u64,
    pub upstream: Quota,
    pub announce: Option<String>,
    pub learn: bool,
}

/// The options `args` give.
pub fn parse(args: Vec<String>) -> Result<Options, CliError> {
    let given = flags::read(USAGE, args)?;
    given.no_plain()?;
    if let Some(Err(e)) = given.get("--redis").map(redis::Client::open) {
        let shown = redacted(given.get("--redis").unwrap_or_default());
        return Err(invalid(format!("--redis: invalid URL {shown}: {e}")));
    }
    let quota = given.quota(20, Duration::from_secs(1))?;
    let period = quota.period();
    if period < Duration::from_millis(1) {
        return Err(invalid("--period: at least 1ms"));
    }
    let supported = Algorithm::FixedWindow.supports(&quota);
    supported.map_err(|e| invalid(format!("--limit: {e}")))?;
    let upstream = Quota::new(given.count("--upstream-limit", quota.limit())?, period);
    let announce = given.get("--announce").map(str::to_owned);
    match announce.as_deref() {
        // Both dialects count in whole seconds.
        Some("ietf" | "x-ratelimit") if period.subsec_nanos() > 0 => {
            Err(invalid("--announce: --period must be whole seconds"))?
        }
        None | Some("ietf" | "x-ratelimit") => {}
        Some(other) => Err(invalid(format!(
            "--announce: {other:?} is neither ietf nor x-ratelimit"
        )))?,
    }
    Ok(Options {
        redis: given.get("--redis").map(str::to_owned),
        workers: given.count_at_most("--workers", 4, 64)?,
        quota,
        seconds: given.count_at_most("--seconds", 5, 3600)?,
        upstream: upstream.map_err(|e| invalid(format!("--upstream-limit: {e}")))?,
        announce,
        learn: given.has("--learn"),
    })
}
