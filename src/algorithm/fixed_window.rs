//! Fixed window: the Rust mirror of `lua/fixed_window.lua`, step for step.

use super::{
    lua_mod, sane, unpack, window_time, Args, Kind, Leasing, Outcome, Packed, Refund, Spec, Window,
};

/// Fixed window's specification: its registration (see the module docs of `algorithm`).
pub(crate) const SPEC: Spec = Spec {
    name: "fixed-window",
    tag: b'f',
    kind: Kind::Packed(step),
    fields: &["window", "count"],
    lua: include_str!("../../lua/fixed_window.lua"),
    refund: Some(refund),
    window: Window::Period,
    max_burst: None,
    leasing: Leasing::WithinWindow,
};

/// The state tag: `f`, layout 1 (w, n).
const TAG: u8 = SPEC.tag;

/// One step over the stored state (`f` + the window's µs start `w` + the units `n` admitted in
/// it).
pub(crate) fn step(stored: Option<&[u8]>, args: &Args) -> Outcome<Packed> {
    let Args {
        now,
        cost,
        limit: _,
        period,
        burst,
    } = *args;

    // 1. The current window, aligned to the Unix epoch: the one of now, or the stored one when
    //    it starts after now by at most the skew.
    let state = unpack::<2>(stored, TAG);
    let t = window_time(state.map(|[w, _]| w), now, period);
    let start = t - lua_mod(t, period);
    let stop = start + period;

    // 2. A missing or corrupt state, or one of another window, is an empty window; capped.
    let mut n = match state {
        Some([w, c]) if w == start && sane(c) => c.floor().min(burst),
        _ => 0.0,
    };

    // 3. Decide; a denied request consumes nothing and fits in the next window.
    let allowed = n + cost <= burst;
    let mut retry = 0.0;
    if allowed {
        n += cost;
    } else if cost > burst {
        retry = -1.0;
    } else {
        retry = stop - now;
    }

    // 4. Reset: the window's end, unless it is empty.
    let reset = if n > 0.0 { stop - now } else { 0.0 };

    // 5. The new state: only an admission that costs changes it.
    Outcome {
        allowed,
        remaining: burst - n,
        retry_us: retry,
        reset_us: reset,
        state: (allowed && cost > 0.0).then(|| Packed::new(TAG, [start, n])),
    }
}

/// A refund (the `@refund` part of `lua/fixed_window.lua`): count - units, at least 0, only
/// when the stored window is the one the units were reserved in (another never got them).
pub(crate) fn refund(state: &[u8], r: &Refund) -> Option<Packed> {
    let [w, count] = unpack::<2>(Some(state), TAG)?;
    if !(sane(w) && sane(count)) || w != r.start {
        return None;
    }
    Some(Packed::new(TAG, [w, (count - r.units).max(0.0)]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{expect, Seq, S};

    #[test]
    fn counts_per_window_and_rolls_over() {
        // 10 a minute; the windows are [0, 60 s), [60 s, 120 s)...
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
        // (allowed, remaining, retry_after_ms, reset_after_ms)
        expect(s.at(10.0 * S).cost(1.0), (true, 9, 0, 50_000));
        expect(s.cost(8.0), (true, 1, 0, 50_000));
        expect(s.at(20.0 * S).cost(2.0), (false, 1, 40_000, 40_000));
        expect(s.cost(0.0), (true, 1, 0, 40_000));
        assert!(!s.wrote());
        expect(s.cost(1.0), (true, 0, 0, 40_000));
        assert_eq!(s.ttl_ms(), Some(40_000));
        // 1 µs before the window ends: come back in 1 µs, rounded up to 1 ms.
        expect(s.at(60.0 * S - 1.0).cost(1.0), (false, 0, 1, 1));
        // A new window: the whole capacity at once.
        expect(s.at(60.0 * S).cost(10.0), (true, 0, 0, 60_000));
        expect(s.cost(11.0), (false, 0, -1, 60_000));
        // Two windows later the key is fresh.
        expect(s.at(130.0 * S).cost(0.0), (true, 10, 0, 0));
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        // 1_700_000_000 s is 20 s into a minute.
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
        expect(s.at(1_700_000_000.0 * S).cost(1.0), (true, 9, 0, 40_000));
        expect(s.cost(9.0), (true, 0, 0, 40_000));
        expect(s.at(1_700_000_039.5 * S).cost(1.0), (false, 0, 500, 500));
        expect(s.at(1_700_000_040.0 * S).cost(1.0), (true, 9, 0, 60_000));
    }

    #[test]
    fn the_capacity_is_the_burst_and_the_reply_shows_the_limit() {
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 3.0);
        let r = s.at(0.0).cost(3.0);
        expect(r, (true, 0, 0, 60_000));
        expect(s.cost(1.0), (false, 0, 60_000, 60_000));
        expect(s.cost(4.0), (false, 0, -1, 60_000));
    }

    #[test]
    fn a_tightened_quota_caps_the_count() {
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
        expect(s.at(0.0).cost(10.0), (true, 0, 0, 60_000));
        let mut s = s.quota(5.0, 60.0 * S, 5.0);
        expect(s.at(1.0 * S).cost(1.0), (false, 0, 59_000, 59_000));
        expect(s.at(60.0 * S).cost(1.0), (true, 4, 0, 60_000));
    }

    #[test]
    fn a_clock_stepped_back_never_locks_the_key_out() {
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
        expect(s.at(70.0 * S).cost(10.0), (true, 0, 0, 50_000));
        // Back within the window: the count stands, until the window ends.
        expect(s.at(65.0 * S).cost(1.0), (false, 0, 55_000, 55_000));
        // Back into an earlier window: the count of a later window does not apply.
        expect(s.at(50.0 * S).cost(1.0), (true, 9, 0, 10_000));
        expect(s.at(70.0 * S).cost(1.0), (true, 9, 0, 50_000));
    }

    /// A clock up to `MAX_SKEW` before the stored window's start (another instance's, skewed)
    /// decides in that window, not in an empty earlier one; its times count from its own clock.
    /// Further before, the clock stepped back: the earlier window is empty, as above.
    #[test]
    fn a_clock_behind_by_the_skew_decides_in_the_stored_window() {
        let mut s = Seq::packed(step).quota(10.0, 60.0 * S, 10.0);
        expect(s.at(120.0 * S).cost(9.0), (true, 1, 0, 60_000));
        expect(s.at(115.0 * S).cost(1.0), (true, 0, 0, 65_000));
        expect(s.cost(1.0), (false, 0, 65_000, 65_000));
        assert!(!s.wrote());
        expect(s.at(115.0 * S - 1.0).cost(1.0), (true, 9, 0, 5_001));
    }
}
