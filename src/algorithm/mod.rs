//! The algorithms, and their reference math in Rust.
//!
//! Each algorithm is a pure step, (stored state, now, cost, quota) -> (decision, new state),
//! written twice to be read side by side: in Lua (`lua/<algorithm>.lua`), run by the one driver
//! in `lua/common.lua` that Redis runs atomically as one script for every algorithm, and as a
//! Rust mirror here that [`MemoryStore`](crate::store::MemoryStore) runs. The driver owns the
//! argument checks, the read, the write with its expiry and the reply; the steps own the math.
//! The mirror follows the script's steps in the same order with the same `f64` arithmetic (Lua
//! numbers are doubles) over the same state strings, so both give identical decisions and store
//! identical bytes; the differential tests hold them to that.
//!
//! Each algorithm is declared once, in a `Spec` beside its Rust step: its name, tag byte, kind,
//! state fields, Lua step (with its refund step), Rust refund step, header window, largest
//! burst and how its units may be leased (`Leasing`: whenever, within their window, or not at
//! all). Everything else (the scripts assembled in `src/store/wire/`, the argument byte,
//! the split of a key's string into tiers, `inspect`, refunds, token leases, the
//! `RateLimit-Policy` window) reads the spec; `Algorithm::spec` is the one exhaustive `match`.
//!
//! # Adding an algorithm
//!
//! 1. **A Lua step file**, `lua/<algorithm>.lua`: the step, pure, reading `stored`, `now`,
//!    `cost`, `limit`, `period`, `burst` and setting `ok`, `rem`, `re`, `rs`, `state` (see
//!    `lua/common.lua`'s header); then a `-- @refund` line and its refund step, reading `state`,
//!    `units`, `start`, `period`, `burst` and setting `new` (see `lua/refund.lua`'s header). Its
//!    state is a new tag byte and doubles. Shared numbers are written by their names
//!    (`MAX_EXACT`, ...: `CONSTANTS` in `src/store/wire/scripts.rs`).
//! 2. **A Rust step file**, `src/algorithm/<algorithm>.rs`: the mirror of both Lua steps, line
//!    for line, and its `pub(crate) const SPEC: Spec` (name, tag, `Kind::Packed(step)`, field
//!    names, `include_str!` of the Lua file, `refund`, `Window`, `max_burst`, `leasing`; a
//!    missing field is a compile error).
//! 3. **The lines the compiler and `cargo test --lib` name**, all in this file:
//!    `pub(crate) mod <algorithm>;` and the variant of [`Algorithm`] (with its doc), after which
//!    the compiler names the missing arm of `Algorithm::spec` (`Algorithm::New => &new::SPEC`);
//!    `every_lua_step_is_registered_once` (in `spec.rs`) fails until [`Algorithm::ALL`] lists
//!    it; `names_parse_back` below lists the public names.
//!
//! The unit tests also hold the Lua step's tag, `#stored` length and `spack` layout to the spec
//! (`spec.rs`), its refund to its Rust twin's presence and effect, and every script to the
//! shared constants and to the two state lengths the scripts split a key's string by
//! (`src/store/wire/scripts.rs`: a state of a third length fails there, and needs the split in
//! `lua/common.lua`, `lua/control.lua` and `lua/refund.lua`). The integration test
//! `several_quotas_are_exact_under_concurrency_across_instances` (`tests/it/fleet.rs`) asks for
//! the new state's expected field. A throwaway copy of the fixed window took exactly these:
//! two new files, four lines here (module, variant, `ALL`, `spec` arm), the names list, and
//! one line in `tests/it/fleet.rs`.
//!
//! # Examples
//!
//! Every [`Algorithm`] keeps the same contract: the burst passes, the next request is denied with
//! the time to wait.
//!
//! ```
//! use std::time::Duration;
//! use redlimit::{clock::{Clock, ManualClock}, store::MemoryStore, Algorithm, Limiter, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let quota = Quota::per_minute(2)?;
//! for &algorithm in Algorithm::ALL {
//!     // A clock that stands still, so no window ends between the checks.
//!     let clock = ManualClock::new(Duration::from_secs(1_000_000));
//!     let limiter = Limiter::builder(MemoryStore::new())
//!         .algorithm(algorithm)
//!         .clock(Clock::Manual(clock))
//!         .build()?;
//!     assert!(limiter.check("k", &quota).await.is_allowed(), "{algorithm}");
//!     assert!(limiter.check("k", &quota).await.is_allowed(), "{algorithm}");
//!     let denied = *limiter.check("k", &quota).await.decision().unwrap();
//!     assert!(!denied.allowed && denied.retry_after > Duration::ZERO, "{algorithm}");
//! }
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::str::FromStr;

use crate::quota::{Quota, QuotaError};

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
mod spec;
pub(crate) mod token_bucket;

#[cfg(test)]
pub(crate) mod sequences;
#[cfg(test)]
pub(crate) mod testing;

pub(crate) use self::spec::{
    is_one_state, packed_by_tag, state_len_of, Kind, Leasing, Spec, Window,
};

/// The byte naming `algorithm` in the script's arguments (its state strings' first byte), for
/// tests that run the script by hand.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub fn script_tag(algorithm: Algorithm) -> u8 {
    algorithm.tag()
}

/// Which rate-limiting algorithm decides.
///
/// All share the same contract: `cost` (0 peeks without consuming), a denied request consumes
/// nothing, and the same [`Decision`](crate::Decision) fields. A quota's `limit` per `period` is the rate and its
/// `burst` (the limit by default) the capacity. See the [guide](crate::guide::algorithms) for
/// what each one guarantees.
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
    /// GCRA (generic cell rate algorithm): one request every `period / limit`, with up to
    /// `burst` at once. The same admissions as a token bucket with continuous refill, in one
    /// small hash (a time and a debt).
    Gcra,
    /// Fixed window: at most `burst` per window of `period`, windows aligned to the Unix epoch.
    /// Cheapest and simplest to explain, but up to `2 * burst` can pass across a boundary.
    FixedWindow,
    /// Sliding window log: exactly at most `burst` in any `period`. Stores one sorted-set entry
    /// per admitted unit, so memory and time are O(`burst`) per key (on Redis 7.0 about 36 bytes
    /// a unit up to 128 units, 118 beyond; a request of cost k adds k entries): keep `burst`
    /// small. Quotas with a burst above [`MAX_SLIDING_LOG_BURST`] are refused.
    SlidingLog,
    /// Sliding window counter: the current and the previous fixed window, the previous one
    /// weighted by its overlap with the sliding `period` (Cloudflare's approximation). At most
    /// `burst` per `period` in the estimate, in two small counters.
    SlidingWindow,
}

/// The largest burst the sliding log accepts: it keeps one entry per admitted unit (about
/// 118 bytes each in Redis), so 100 000 units is already ~12 MB for one key.
pub const MAX_SLIDING_LOG_BURST: u64 = 100_000;

impl Algorithm {
    /// Every algorithm, in the order the README lists them.
    pub const ALL: &'static [Algorithm] = &[
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ];

    /// The name used on command lines and in logs, e.g. `token-bucket`.
    ///
    /// It parses back with [`str::parse`] and is what [`Display`](std::fmt::Display) writes.
    ///
    /// ```
    /// use redlimit::Algorithm;
    ///
    /// assert_eq!(Algorithm::SlidingWindow.name(), "sliding-window");
    /// assert_eq!(Algorithm::Gcra.to_string(), "gcra");
    /// assert_eq!("gcra".parse::<Algorithm>(), Ok(Algorithm::Gcra));
    /// ```
    pub fn name(&self) -> &'static str {
        self.spec().name
    }

    /// Its specification: the one exhaustive `match` over the algorithms, so the compiler
    /// names a new variant's missing registration here (see the module docs).
    pub(crate) const fn spec(self) -> &'static Spec {
        match self {
            Algorithm::TokenBucket => &token_bucket::SPEC,
            Algorithm::Gcra => &gcra::SPEC,
            Algorithm::FixedWindow => &fixed_window::SPEC,
            Algorithm::SlidingLog => &sliding_log::SPEC,
            Algorithm::SlidingWindow => &sliding_window::SPEC,
        }
    }

    /// The byte naming this algorithm in the script's arguments: its state strings' tag byte
    /// (`lua/common.lua` dispatches on it).
    pub(crate) fn tag(&self) -> u8 {
        self.spec().tag
    }

    /// How the driver runs this algorithm: a pure step over a packed state string
    /// (`lua/<algorithm>.lua` and its mirror here), or the sliding log's sorted set.
    pub(crate) fn kind(&self) -> Kind {
        self.spec().kind
    }

    /// Whether this algorithm can serve `quota`. Only the sliding log has a limit: its burst is
    /// at most [`MAX_SLIDING_LOG_BURST`], because it stores (and scans) one entry per unit.
    ///
    /// ```
    /// use redlimit::{quota::QuotaError, Algorithm, Quota};
    ///
    /// let huge = Quota::per_second(1_000_000).unwrap();
    /// assert!(Algorithm::TokenBucket.supports(&huge).is_ok());
    /// assert_eq!(Algorithm::SlidingLog.supports(&huge), Err(QuotaError::BurstTooLargeForSlidingLog));
    /// ```
    pub fn supports(&self, quota: &Quota) -> Result<(), QuotaError> {
        match self.spec().max_burst {
            Some(max) if quota.burst() > max => Err(QuotaError::BurstTooLargeForSlidingLog),
            _ => Ok(()),
        }
    }
}

/// A pure step: (stored state, now, cost, quota) -> decision and the new state to store.
pub(crate) type PackedStep = fn(Option<&[u8]>, &Args) -> Outcome<Packed>;

/// A refund's step on one tier's state (of its algorithm's tag and length, as the refund
/// script checks before it): the state with the units given back, `None` when it does not
/// parse or has nothing to give back (`lua/refund.lua` splices each step's Lua twin, the part
/// of `lua/<algorithm>.lua` after its `@refund` line).
pub(crate) type RefundStep = fn(&[u8], &Refund) -> Option<Packed>;

/// What a refund gives back to one tier, as numbers (exact integers below 2^53).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Refund {
    /// The units given back.
    pub units: f64,
    /// The start (µs) of the fixed window of `period` the units were reserved in.
    pub start: f64,
    /// The tier's period, µs.
    pub period: f64,
    /// The tier's burst.
    pub burst: f64,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name that [`Algorithm::from_str`] does not know.
///
/// Its message lists the names that are known.
///
/// ```
/// use redlimit::{algorithm::UnknownAlgorithm, Algorithm};
///
/// let error = "leaky-bucket".parse::<Algorithm>().unwrap_err();
/// assert_eq!(error, UnknownAlgorithm("leaky-bucket".to_owned()));
/// assert!(error.to_string().contains("expected one of: token-bucket, gcra,"));
/// ```
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

/// `a % b` as Lua 5.1 computes it, `a - floor(a / b) * b` (exact for the non-negative integers
/// below 2^53 the scripts use).
pub(crate) fn lua_mod(a: f64, b: f64) -> f64 {
    a - (a / b).floor() * b
}

/// Microseconds to whole milliseconds, rounded up (`ceil(us / 1000)` in `lua/common.lua`).
pub(crate) fn ms_up(us: f64) -> i64 {
    (us / 1000.0).ceil() as i64
}

/// What one step decides: the values each Lua step returns (`allowed, remaining, retry_us,
/// reset_us, new_state`). `retry_us` is -1 for "never"; `state` is `None` when nothing is to be
/// written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome<S> {
    pub allowed: bool,
    pub remaining: f64,
    pub retry_us: f64,
    pub reset_us: f64,
    pub state: Option<S>,
}

/// The longest packed state: a tag byte and three doubles.
const PACKED_MAX: usize = 25;

/// A packed state string, byte for byte what the script stores with `SET`: one tag byte naming
/// the algorithm and the layout version, then little-endian doubles (Lua's
/// `struct.pack('<Bdd…', tag, …)`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Packed {
    len: u8,
    bytes: [u8; PACKED_MAX],
}

impl Packed {
    /// `struct.pack('<B' .. 'd' * N, tag, values…)`.
    pub(crate) fn new<const N: usize>(tag: u8, values: [f64; N]) -> Self {
        const { assert!(8 * N < PACKED_MAX) };
        let mut bytes = [0; PACKED_MAX];
        bytes[0] = tag;
        for (i, v) in values.iter().enumerate() {
            bytes[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        Packed {
            len: (1 + 8 * N) as u8,
            bytes,
        }
    }

    /// The stored bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for Packed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Packed({:?})", self.as_bytes())
    }
}

/// The doubles of a state string packed with `tag`, or `None` when `stored` is absent, of
/// another length or of another tag (the script's `#stored == 1 + 8 * N` and tag checks).
pub(crate) fn unpack<const N: usize>(stored: Option<&[u8]>, tag: u8) -> Option<[f64; N]> {
    let stored = stored?;
    if stored.len() != 1 + 8 * N || stored[0] != tag {
        return None;
    }
    Some(std::array::from_fn(|i| {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&stored[1 + 8 * i..9 + 8 * i]);
        f64::from_le_bytes(bytes)
    }))
}

/// `sane` in `lua/common.lua`: a stored number that is not negative, NaN, nor beyond 2^53.
pub(crate) fn sane(v: f64) -> bool {
    (0.0..MAX_EXACT).contains(&v)
}

/// 2^53: every number the scripts handle stays an exact integer below it.
pub(crate) const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// The longest time a reply carries (`MAX_REPLY_MS` in the scripts): 2^62 ms keeps its
/// integers inside an i64.
pub(crate) const MAX_REPLY_MS: i64 = 1 << 62;

/// [`Clock::MAX_SKEW`](crate::clock::Clock::MAX_SKEW) in µs: `MAX_SKEW` in every Lua step.
pub(crate) const MAX_SKEW_US: f64 = crate::clock::Clock::MAX_SKEW.as_micros() as f64;

/// How a step reads a stored time (its state's reference: a token bucket's `ts`, GCRA's `at`, a
/// window's start, the sliding log's newest entry) against `now`, as every Lua step does: the
/// time the step decides at, and whether the clock stepped back.
///
/// - Not ahead of `now`: the step decides at `now`.
/// - Ahead by at most [`MAX_SKEW_US`]: another instance's clock runs ahead of this one (skew). The
///   step decides at the stored time: no refill, no new window, nothing written backwards; its
///   times still count from `now`, the caller's clock.
/// - Further ahead: this clock stepped back. The step decides at `now` and repairs the state
///   (see each step), so the key is never locked out until the clock catches up.
pub(crate) fn decision_time(stored: f64, now: f64) -> (f64, bool) {
    if stored - now > MAX_SKEW_US {
        (now, true)
    } else if stored > now {
        (stored, false)
    } else {
        (now, false)
    }
}

/// [`decision_time`] for the window algorithms, whose stored time is the start `w` of a window:
/// the stored window when it starts after `now` by at most the skew (and is one of `period`'s
/// windows), else `now`. A window further ahead is one of a clock that stepped back, which those
/// algorithms read as empty: nothing to repair.
pub(crate) fn window_time(w: Option<f64>, now: f64, period: f64) -> f64 {
    match w {
        Some(w) if w > now && w - now <= MAX_SKEW_US && lua_mod(w, period) == 0.0 => w,
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::sequences;
    use super::testing::{self, Seq, SlidingLog};
    use super::{gcra, lua_mod, sliding_window, token_bucket, Algorithm, Kind, MAX_SKEW_US};

    proptest! {
        /// Every algorithm keeps the shared invariants (`testing::check_invariants`).
        #[test]
        fn every_algorithm_keeps_the_invariants((quota, steps) in testing::scenario(true)) {
            for algorithm in Algorithm::ALL {
                let checked = match algorithm.kind() {
                    Kind::Packed(step) => testing::check_invariants(step, quota, &steps),
                    Kind::Log => testing::check_invariants(SlidingLog, quota, &steps),
                };
                checked.map_err(|e| TestCaseError::fail(format!("{algorithm}: {e}")))?;
            }
        }
    }

    proptest! {
        /// The bounds the docs state on what the window algorithms admit: the sliding log never
        /// more than `burst` in any interval of one period (exact); the sliding window at most
        /// `burst` per fixed window, and at most `2 * burst` in any interval of one period.
        #[test]
        fn the_window_algorithms_keep_their_documented_bounds(
            (quota, steps) in testing::scenario(false),
        ) {
            let (limit, period, burst) = quota;
            let log = Seq::new(SlidingLog).quota(limit, period, burst);
            testing::check_admitted(log, 0.0, &steps, |now, admitted_after| {
                prop_assert!(admitted_after(now - period) <= burst, "sliding log");
                Ok(())
            })?;
            let window = Seq::packed(sliding_window::step).quota(limit, period, burst);
            let now = 1_700_000_000_000_000.0;
            testing::check_admitted(window, now, &steps, |now, admitted_after| {
                prop_assert!(admitted_after(now - period) <= 2.0 * burst, "sliding window");
                let start = now - lua_mod(now, period);
                prop_assert!(admitted_after(start - 1.0) <= burst, "sliding window");
                Ok(())
            })?;
        }
    }

    // The token bucket and GCRA admit alike (GCRA is a token bucket with continuous refill), so
    // each refill scenario below runs on both.

    #[test]
    fn a_clock_stepped_back_never_locks_a_refill_key_out() {
        Seq::packed(token_bucket::step).run(sequences::REFILL_CLOCK_STEPPED_BACK);
        Seq::packed(gcra::step).run(sequences::REFILL_CLOCK_STEPPED_BACK);
    }

    #[test]
    fn a_refill_clock_behind_by_the_skew_decides_as_of_the_stored_time() {
        Seq::packed(token_bucket::step).run(sequences::REFILL_CLOCK_BEHIND);
        Seq::packed(gcra::step).run(sequences::REFILL_CLOCK_BEHIND);
    }

    /// One fact, one home: every Lua step tells skew from a clock stepped back by
    /// `Clock::MAX_SKEW`, as its mirror does.
    #[test]
    fn every_step_uses_the_clocks_max_skew() {
        let line = format!("local MAX_SKEW, t = {}, now", MAX_SKEW_US as u64);
        for algorithm in Algorithm::ALL {
            let step = algorithm.spec().lua;
            assert!(step.contains(&line), "{algorithm} lacks {line:?}");
        }
    }

    #[test]
    fn names_parse_back() {
        for &algorithm in Algorithm::ALL {
            assert_eq!(algorithm.name().parse::<Algorithm>(), Ok(algorithm));
        }
        let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            [
                "token-bucket",
                "gcra",
                "fixed-window",
                "sliding-log",
                "sliding-window"
            ]
        );
        assert!("leaky".parse::<Algorithm>().is_err());
    }
}
