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
    use crate::algorithm::sequences;
    use crate::algorithm::testing::Seq;

    #[test]
    fn counts_per_window_and_rolls_over() {
        Seq::packed(step).run(sequences::FIXED_WINDOWS);
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        Seq::packed(step).run(sequences::FIXED_ALIGNED);
    }

    #[test]
    fn the_capacity_is_the_burst_and_the_reply_shows_the_limit() {
        Seq::packed(step).run(sequences::FIXED_BURST_BELOW_LIMIT);
    }

    #[test]
    fn a_tightened_quota_caps_the_count() {
        Seq::packed(step).run(sequences::FIXED_TIGHTENED);
    }

    #[test]
    fn a_clock_stepped_back_never_locks_the_key_out() {
        Seq::packed(step).run(sequences::FIXED_CLOCK_STEPPED_BACK);
    }

    #[test]
    fn a_clock_behind_by_the_skew_decides_in_the_stored_window() {
        Seq::packed(step).run(sequences::FIXED_CLOCK_BEHIND);
    }
}
