//! Sliding window log: the Rust mirror of `lua/sliding_log.lua`, step for step.
//!
//! The log is O(burst): it is changed in place (as Redis changes its sorted set) instead of
//! being copied on every step.

use std::collections::VecDeque;

use super::Outcome;
use super::{decision_time, Args, Kind, Leasing, Spec, Window, MAX_SLIDING_LOG_BURST};

/// The sliding log's specification: its registration (see the module docs of `algorithm`).
pub(crate) const SPEC: Spec = Spec {
    name: "sliding-log",
    tag: b'l',
    kind: Kind::Log,
    fields: &[],
    lua: include_str!("../../lua/sliding_log.lua"),
    refund: None,
    window: Window::Period,
    max_burst: Some(MAX_SLIDING_LOG_BURST),
    leasing: Leasing::Refused,
};

/// The log: the µs time each admitted unit was admitted, oldest first (the sorted set's
/// scores; its member names never affect a decision).
pub(crate) type Log = VecDeque<f64>;

/// Runs one step on `log` for one tier: [`decide`], then [`apply`] when it writes.
#[cfg(test)]
pub(crate) fn step(log: &mut Log, args: &Args) -> Outcome<()> {
    let (outcome, stepped_back) = decide(log, args);
    if outcome.state.is_some() {
        apply(
            log,
            args.now,
            args.period,
            args.cost,
            outcome.allowed,
            stepped_back,
        );
    }
    outcome
}

/// One tier's decision over `log`, which it leaves as it is; also whether the clock stepped back
/// (entries from the future). The outcome has a state when the step would write: a request that
/// costs, admitted or with a clock to repair. Every tier of a call reads the same log, each
/// counting its own window.
pub(crate) fn decide(log: &Log, args: &Args) -> (Outcome<()>, bool) {
    let Args {
        now,
        cost,
        limit: _,
        period,
        burst,
    } = *args;
    // 1. The newest entry; 2. capped to the clock: a newest entry ahead of now by at most the
    //    skew decides as of that entry (`t`); further ahead, the clock stepped back: entries from
    //    the future count as admitted now (and are moved to now by a request that costs, even a
    //    denied one: see `apply`).
    let (t, stepped_back) = time_of(log, now);
    let newest = log.back().map(|&newest| newest.min(t));
    let window = t - period; // scores strictly above it are in the window

    // 3. Count the units in the window (entries from the future are in it either way).
    let first = log.partition_point(|&s| s <= window);
    let count = (log.len() - first) as f64;

    // 4. Decide (a peek always passes); a denied request consumes nothing.
    let allowed = cost == 0.0 || count + cost <= burst;
    let used = if allowed { count + cost } else { count };

    // 5. Times: retry when the (count + cost - burst)-th oldest unit leaves the window, reset
    //    when the newest does.
    let retry = if allowed {
        0.0
    } else if cost > burst {
        -1.0
    } else {
        let oldest = log[first + (count + cost - burst - 1.0) as usize];
        oldest.min(t) + period - now
    };
    let reset = if allowed && cost > 0.0 {
        t + period - now
    } else if count > 0.0 {
        newest.unwrap_or(now) + period - now
    } else {
        0.0
    };
    let outcome = Outcome {
        allowed,
        remaining: (burst - used).max(0.0),
        retry_us: retry,
        reset_us: reset,
        state: (cost > 0.0 && (allowed || stepped_back)).then_some(()),
    };
    (outcome, stepped_back)
}

/// The time a step on `log` decides at, and whether the clock stepped back
/// ([`decision_time`] of the newest entry).
fn time_of(log: &Log, now: f64) -> (f64, bool) {
    log.back()
        .map_or((now, false), |&newest| decision_time(newest, now))
}

/// The write of a call (the state function of `lua/sliding_log.lua`, run for the tier with the
/// longest `period`): entries from the future move to now when the clock `stepped_back`; when
/// the call `admit`s, the units that left that window are dropped and one entry per unit of
/// `cost` is added, at the time the step decided at (never before the newest entry).
pub(crate) fn apply(
    log: &mut Log,
    now: f64,
    period: f64,
    cost: f64,
    admit: bool,
    stepped_back: bool,
) {
    // The time `decide` decided at, read again from the log as it was (the driver passes the
    // caller's now).
    let (now, _) = time_of(log, now);
    if stepped_back {
        for t in log.iter_mut().rev() {
            if *t <= now {
                break;
            }
            *t = now;
        }
    }
    if admit {
        let window = now - period;
        let first = log.partition_point(|&s| s <= window);
        log.drain(..first);
        log.extend(std::iter::repeat_n(now, cost as usize));
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::sequences;
    use crate::algorithm::testing::{Seq, SlidingLog};

    #[test]
    fn counts_every_unit_in_the_last_period() {
        Seq::new(SlidingLog).run(sequences::LOG_EXACT_WINDOW);
    }

    #[test]
    fn a_tightened_quota_waits_at_most_one_period() {
        Seq::new(SlidingLog).run(sequences::LOG_TIGHTENED);
    }

    #[test]
    fn a_clock_stepped_back_never_locks_the_key_out() {
        Seq::new(SlidingLog).run(sequences::LOG_CLOCK_STEPPED_BACK);
    }

    #[test]
    fn a_clock_behind_by_the_skew_decides_as_of_the_newest_entry() {
        Seq::new(SlidingLog).run(sequences::LOG_CLOCK_BEHIND);
    }
}
