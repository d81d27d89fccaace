//! Sliding window counter: the Rust mirror of `lua/sliding_window.lua`, step for step.

use super::{lua_mod, ttl_ms, Args, Reply, Step, Write};

/// The stored counts: units `c` admitted in the window starting at µs `w`, and `p` in the one
/// before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct State {
    pub w: f64,
    pub c: f64,
    pub p: f64,
}

pub(crate) fn step(stored: Option<State>, args: &Args) -> Step<State> {
    let Args {
        now,
        cost,
        limit,
        period,
        burst,
    } = *args;

    // 1. The current window, aligned to the Unix epoch.
    let start = now - lua_mod(now, period);
    let elapsed = now - start;

    // 2. A missing state, or one of a later window (the clock stepped back), is empty.
    let State { w, mut c, mut p } = match stored {
        Some(s) if s.w <= start => s,
        _ => State {
            w: start,
            c: 0.0,
            p: 0.0,
        },
    };
    c = c.floor().min(burst);
    p = p.floor().min(burst);

    // 3. Roll.
    if w == start - period {
        p = c;
        c = 0.0;
    } else if w != start {
        c = 0.0;
        p = 0.0;
    }

    // 4. Decide, multiplied by period (a peek always passes); a denied request consumes nothing.
    let room = burst * period - p * (period - elapsed);
    let allowed = cost == 0.0 || (c + cost) * period <= room;
    if allowed {
        c += cost;
    }

    // 5. Times: retry within this window or the next, never early; reset when both fade.
    let retry = if allowed {
        0.0
    } else if cost > burst {
        -1.0
    } else if c + cost <= burst {
        let mut e = period - ((burst - c - cost) * period / p).floor();
        if (c + cost) * period > burst * period - p * (period - e) {
            e += 1.0;
        }
        start + e - now
    } else {
        let mut e = (period - ((burst - cost) * period / c).floor()).max(0.0);
        if cost * period > burst * period - c * (period - e) {
            e += 1.0;
        }
        start + period + e - now
    };
    let reset = if c > 0.0 {
        start + 2.0 * period - now
    } else if p > 0.0 {
        start + period - now
    } else {
        0.0
    };

    // 6. Write only what changed; expire when both counts have faded out.
    let write = if allowed && cost > 0.0 {
        Write::Put {
            state: State { w: start, c, p },
            ttl_ms: ttl_ms(reset),
        }
    } else {
        Write::Keep
    };
    let remaining = ((room / period).floor() - c).max(0.0);
    Step {
        reply: Reply::new(allowed, limit, remaining, retry, reset),
        write,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::testing::{self, expect, Mirror, Seq};

    const S: f64 = 1_000_000.0;

    struct SlidingWindow;

    impl Mirror for SlidingWindow {
        type State = State;
        fn run(state: &mut Option<State>, args: &Args) -> (Reply, Option<u64>) {
            testing::run_by_value(step, state, args)
        }
    }

    fn seq() -> Seq<SlidingWindow> {
        Seq::new()
    }

    proptest! {
        #[test]
        fn invariants((quota, steps) in testing::scenario(true)) {
            testing::check_invariants::<SlidingWindow>(quota, steps)?;
        }
    }

    #[test]
    fn weighs_the_previous_window_by_its_overlap() {
        // 10 a minute; windows [0, 60 s), [60 s, 120 s)...
        let mut s = seq().quota(10.0, 60.0 * S, 10.0);
        // (allowed, remaining, retry_after_ms, reset_after_ms)
        expect(s.at(0.0).cost(5.0), (true, 5, 0, 120_000));
        expect(s.at(30.0 * S).cost(5.0), (true, 0, 0, 90_000));
        // Full in this window: at 66 s the previous 10 weigh 10 * 54/60 = 9, room for 1.
        expect(s.cost(1.0), (false, 0, 36_000, 90_000));
        expect(s.at(66.0 * S).cost(1.0), (true, 0, 0, 114_000));
        // 9 + 1 now; room for one more when the weight is 8: at 72 s.
        expect(s.cost(1.0), (false, 0, 6_000, 114_000));
        // At 90 s the previous 10 weigh 5.
        expect(s.at(90.0 * S).cost(0.0), (true, 4, 0, 90_000));
        assert!(!s.wrote());
        expect(s.cost(4.0), (true, 0, 0, 90_000));
        assert_eq!(s.ttl_ms(), Some(90_000));
        // Two windows later both counts have faded: fresh.
        expect(s.at(200.0 * S).cost(0.0), (true, 10, 0, 0));
        expect(s.cost(11.0), (false, 10, -1, 0));
    }

    #[test]
    fn retry_is_exact_to_the_microsecond() {
        let mut s = seq().quota(10.0, 60.0 * S, 10.0);
        expect(s.at(0.0).cost(10.0), (true, 0, 0, 120_000));
        expect(s.at(66.0 * S).cost(1.0), (true, 0, 0, 114_000));
        expect(s.cost(1.0), (false, 0, 6_000, 114_000));
        expect(s.at(72.0 * S - 1.0).cost(1.0), (false, 0, 1, 108_001));
        expect(s.at(72.0 * S).cost(1.0), (true, 0, 0, 108_000));
    }

    #[test]
    fn a_tightened_quota_caps_the_counts() {
        let mut s = seq().quota(10.0, 60.0 * S, 10.0);
        expect(s.at(30.0 * S).cost(10.0), (true, 0, 0, 90_000));
        // Now 5 a minute: the 10 count as 5, which fill this window; in the next one they
        // weigh 5 * (60 - e) / 60 and leave room for 1 at e = 12 s.
        let mut s = s.quota(5.0, 60.0 * S, 5.0);
        expect(s.cost(1.0), (false, 0, 42_000, 90_000));
        expect(s.at(72.0 * S).cost(1.0), (true, 0, 0, 108_000));
    }

    #[test]
    fn a_clock_stepped_back_never_locks_the_key_out() {
        let mut s = seq().quota(10.0, 60.0 * S, 10.0);
        expect(s.at(70.0 * S).cost(10.0), (true, 0, 0, 110_000));
        // Back within the window: the count stands.
        expect(s.at(65.0 * S).cost(1.0), (false, 0, 61_000, 115_000));
        // Back into an earlier window: counts of a later window do not apply.
        expect(s.at(50.0 * S).cost(1.0), (true, 9, 0, 70_000));
    }
}
