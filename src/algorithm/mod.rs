//! The algorithms, and their reference math in Rust.
//!
//! Each algorithm exists twice, written to be read side by side: a Lua script in `lua/` that
//! Redis runs atomically, and a Rust mirror here that [`MemoryStore`](crate::store::MemoryStore)
//! runs. The mirror follows the script's steps in the same order with the same `f64` arithmetic
//! (Lua numbers are doubles), so both give identical decisions; the differential tests hold them
//! to that.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use crate::Decision;

pub(crate) mod token_bucket;

/// Which rate-limiting algorithm decides.
///
/// All share the same contract: `cost` (0 peeks without consuming), a denied request consumes
/// nothing, and the same [`Decision`] fields. See the README for what each one guarantees.
///
/// ```
/// use redlimit::Algorithm;
///
/// let algorithm: Algorithm = "token-bucket".parse()?;
/// assert_eq!(algorithm, Algorithm::TokenBucket);
/// assert_eq!(Algorithm::default().name(), "token-bucket");
/// # Ok::<(), redlimit::algorithm::UnknownAlgorithm>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Token bucket: capacity `burst`, refilled at `limit` per `period`, keeping fractional
    /// progress. Smooth, allows bursts after quiet spells.
    #[default]
    TokenBucket,
}

impl Algorithm {
    /// Every algorithm, in the order the README lists them.
    pub const ALL: &'static [Algorithm] = &[Algorithm::TokenBucket];

    /// The name used on command lines and in logs, e.g. `token-bucket`.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
        }
    }

    /// The Lua script (shared preamble + algorithm), loaded once per process.
    pub(crate) fn script(&self) -> &'static redis::Script {
        static TOKEN_BUCKET: LazyLock<redis::Script> = LazyLock::new(|| {
            script(concat!(
                include_str!("../../lua/common.lua"),
                include_str!("../../lua/token_bucket.lua")
            ))
        });
        match self {
            Algorithm::TokenBucket => &TOKEN_BUCKET,
        }
    }

    /// The Redis keys one limiter key uses, all sharing the hash tag of `base`.
    pub(crate) fn redis_keys(&self, base: &str) -> Vec<String> {
        match self {
            Algorithm::TokenBucket => vec![base.to_owned()],
        }
    }
}

fn script(code: &str) -> redis::Script {
    redis::Script::new(code)
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that [`Algorithm::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {0:?}; expected one of: {names}", names = names())]
pub struct UnknownAlgorithm(pub String);

fn names() -> String {
    Algorithm::ALL
        .iter()
        .map(|a| a.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// The arguments every script receives (ARGV), as numbers. All are exact integers below 2^53.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Args {
    /// Microseconds since the Unix epoch.
    pub now: f64,
    pub cost: f64,
    pub limit: f64,
    /// Microseconds.
    pub period: f64,
    pub burst: f64,
}

/// The reply every script sends: `{allowed, limit, remaining, retry_after_ms, reset_after_ms,
/// suspended}`; `retry_after_ms` is -1 for "never".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

impl Reply {
    /// Mirror of `reply()` in `lua/common.lua`: times in µs become whole ms, rounded up.
    pub(crate) fn new(
        allowed: bool,
        limit: f64,
        remaining: f64,
        retry_us: f64,
        reset_us: f64,
    ) -> Self {
        Reply {
            allowed,
            limit: limit as u64,
            remaining: remaining as u64,
            retry_after_ms: if retry_us >= 0.0 { ms_up(retry_us) } else { -1 },
            reset_after_ms: ms_up(reset_us),
        }
    }

    /// Parses a script's reply array.
    pub(crate) fn from_redis(values: &[i64]) -> Option<Self> {
        match *values {
            [allowed, limit, remaining, retry, reset, _suspended, ..] => Some(Reply {
                allowed: allowed == 1,
                limit: u64::try_from(limit).ok()?,
                remaining: u64::try_from(remaining).ok()?,
                retry_after_ms: retry,
                reset_after_ms: reset,
            }),
            _ => None,
        }
    }

    pub(crate) fn into_decision(self) -> Decision {
        Decision {
            allowed: self.allowed,
            limit: self.limit,
            remaining: self.remaining,
            retry_after: if self.retry_after_ms < 0 {
                Decision::NEVER
            } else {
                Duration::from_millis(self.retry_after_ms as u64)
            },
            reset_after: Duration::from_millis(self.reset_after_ms.max(0) as u64),
        }
    }
}

/// Microseconds to whole milliseconds, rounded up (`ms_up` in `lua/common.lua`).
pub(crate) fn ms_up(us: f64) -> i64 {
    (us / 1000.0).ceil() as i64
}

/// What one step of an algorithm writes back, mirroring the script's writes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write<S> {
    /// Nothing changed that needs storing (a denial or a peek).
    Keep,
    /// Store `state`, expiring after `ttl_ms` milliseconds (the script's PEXPIRE).
    Put { state: S, ttl_ms: u64 },
}

/// One step of an algorithm: the reply and what to store.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step<S> {
    pub reply: Reply,
    pub write: Write<S>,
}
