//! Sliding window counter: the Rust mirror of `lua/sliding_window.lua`, step for step.
//!
//! The estimate of the units in the sliding window `(now - period, now]` is
//! `p * (period - elapsed - 1) / period + c`: the previous fixed window's count `p` weighted by
//! the µs of it still inside the sliding window, plus the current window's count `c`. A request
//! of cost `k` is admitted when `floor(estimate) + k <= burst`, so a client at or below the rate
//! is never denied in steady state (Cloudflare's "admitted while the estimate is below the
//! limit", for `k = 1`). At most `2 * burst` pass in any interval of one period, and at most
//! `burst` in one fixed window.

use super::{
    lua_mod, sane, unpack, window_time, Args, Kind, Leasing, Outcome, Packed, Refund, Spec, Window,
};

/// Sliding window counter's specification: its registration (see the module docs of `algorithm`).
pub(crate) const SPEC: Spec = Spec {
    name: "sliding-window",
    tag: b'w',
    kind: Kind::Packed(step),
    fields: &["window", "current", "previous"],
    lua: include_str!("../../lua/sliding_window.lua"),
    refund: Some(refund),
    window: Window::TwoPeriods,
    max_burst: None,
    leasing: Leasing::Refused,
};

/// The state tag: `w`, layout 1 (w, c, p).
const TAG: u8 = SPEC.tag;

/// The fade of the script (step 4d, inlined there so that no closure is built per call): the
/// first elapsed µs of a window at which `count` units of the previous window weigh at most
/// `room`, within `[0, period - 1]`.
fn fade(count: f64, room: f64, period: f64) -> f64 {
    let mut e = ((period - 1.0 - (room + 1.0) * period / count).floor() + 1.0).max(0.0);
    if e >= period {
        e = period - 1.0;
    }
    if (count * (period - e - 1.0) / period).floor() > room {
        e += 1.0;
    } else if e > 0.0 && (count * (period - e) / period).floor() <= room {
        e -= 1.0;
    }
    e
}

/// One step over the stored state (`w` + the µs start `w` of the current window, the units `c`
/// admitted in it and `p` in the one before).
pub(crate) fn step(stored: Option<&[u8]>, args: &Args) -> Outcome<Packed> {
    let Args {
        now,
        cost,
        limit: _,
        period,
        burst,
    } = *args;

    // 1. The current window, aligned to the Unix epoch: the one of now, or the stored one when
    //    it starts after now by at most the skew (decided as of its first µs).
    let state = unpack::<3>(stored, TAG);
    let t = window_time(state.map(|[w, _, _]| w), now, period);
    let start = t - lua_mod(t, period);
    let elapsed = t - start;

    // 2. Read, cap and roll the counts: a missing or corrupt state, or one of a later window, is
    //    empty.
    let (mut c, p) = match state {
        Some([w, sc, sp]) if sane(sc) && sane(sp) => {
            if w == start {
                (sc.floor().min(burst), sp.floor().min(burst))
            } else if w == start - period {
                (0.0, sc.floor().min(burst))
            } else {
                (0.0, 0.0)
            }
        }
        _ => (0.0, 0.0),
    };

    // 3. Decide (a peek always passes); a denied request consumes nothing.
    let share = (p * (period - elapsed - 1.0) / period).floor();
    let allowed = cost == 0.0 || c + share + cost <= burst;
    let mut retry = 0.0;
    if allowed {
        c += cost;
    } else if cost > burst {
        retry = -1.0;
    } else if c + cost <= burst {
        // 4a. Within this window.
        retry = start + fade(p, burst - c - cost, period) - now;
    } else {
        // 4b. In the next window.
        retry = start + period + fade(c, burst - cost, period) - now;
    }

    // 4c. Reset: until both counts have faded out.
    let reset = if c > 0.0 {
        start + period + fade(c, 0.0, period) - now
    } else if share > 0.0 {
        start + fade(p, 0.0, period) - now
    } else {
        0.0
    };

    // 5. The new state: only an admission that costs changes it.
    Outcome {
        allowed,
        remaining: (burst - share - c).max(0.0),
        retry_us: retry,
        reset_us: reset,
        // A previous count that weighs nothing now weighs nothing for the rest of the window:
        // stored as 0, the state an expired key would have.
        state: (allowed && cost > 0.0)
            .then(|| Packed::new(TAG, [start, c, if share > 0.0 { p } else { 0.0 }])),
    }
}

/// A refund (the `@refund` part of `lua/sliding_window.lua`): the count of the window the units
/// were reserved in, at least 0: the current one's when the stored window is it, the previous
/// one's when the stored window is the next; nothing otherwise.
pub(crate) fn refund(state: &[u8], r: &Refund) -> Option<Packed> {
    let [w, c, p] = unpack::<3>(Some(state), TAG)?;
    if !(sane(c) && sane(p)) {
        return None;
    }
    if w == r.start {
        Some(Packed::new(TAG, [w, (c - r.units).max(0.0), p]))
    } else if w == r.start + r.period {
        Some(Packed::new(TAG, [w, c, (p - r.units).max(0.0)]))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::sequences;
    use crate::algorithm::testing::{Seq, S};

    /// A client at exactly the rate (10 a minute, one every 6 s) is never denied, whatever the
    /// phase of its requests against the windows, including requests on a window's first µs
    /// (where the previous window's full count still weighs (period - 1 µs) / period); an
    /// estimate + cost <= burst rule would admit only 9 a minute.
    #[test]
    fn a_client_at_the_rate_is_never_denied() {
        for phase in [0.0, 1.0, 2.5 * S, 6.0 * S - 1.0] {
            let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
            for i in 0..200 {
                let now = 1_700_000_040.0 * S + phase + i as f64 * 6.0 * S;
                let reply = s.at(now).cost(1.0);
                assert!(reply.allowed, "phase {phase} µs, request {i}: {reply:?}");
            }
        }
        // One every 5 s: 12 a minute asked, 10 a minute admitted in the long run.
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
        let admitted = (0..240)
            .filter(|i| s.at(60.0 * S + *i as f64 * 5.0 * S).cost(1.0).allowed)
            .count();
        assert!((200..=210).contains(&admitted), "{admitted} in 20 minutes");
    }

    #[test]
    fn cloudflares_worked_example() {
        Seq::packed(step).run(sequences::WINDOW_CLOUDFLARE);
    }

    #[test]
    fn weighs_the_previous_window_by_its_overlap() {
        Seq::packed(step).run(sequences::WINDOW_WEIGHTED);
    }

    #[test]
    fn retry_is_exact_to_the_microsecond() {
        Seq::packed(step).run(sequences::WINDOW_RETRY);
    }

    #[test]
    fn a_tightened_quota_caps_the_counts() {
        Seq::packed(step).run(sequences::WINDOW_TIGHTENED);
    }

    #[test]
    fn a_clock_stepped_back_never_locks_the_key_out() {
        Seq::packed(step).run(sequences::WINDOW_CLOCK_STEPPED_BACK);
    }

    #[test]
    fn a_clock_behind_by_the_skew_decides_in_the_stored_window() {
        Seq::packed(step).run(sequences::WINDOW_CLOCK_BEHIND);
    }
}
