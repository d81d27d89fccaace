//! GCRA: the Rust mirror of `lua/gcra.lua`, step for step.

use super::{
    decision_time, sane, unpack, Args, Kind, Leasing, Outcome, Packed, Refund, Spec, Window,
};

/// GCRA's specification: its registration (see the module docs of `algorithm`).
pub(crate) const SPEC: Spec = Spec {
    name: "gcra",
    tag: b'g',
    kind: Kind::Packed(step),
    fields: &["at", "debt"],
    lua: include_str!("../../lua/gcra.lua"),
    refund: Some(refund),
    window: Window::Refill,
    max_burst: None,
    leasing: Leasing::Anytime,
};

/// The state tag: `g`, layout 1 (at, d).
const TAG: u8 = SPEC.tag;

/// One step over the stored state (`g` + the debt `d`, in emission intervals, i.e. requests,
/// measured at the µs time `at`; the theoretical arrival time is `at + d * period / limit`).
pub(crate) fn step(stored: Option<&[u8]>, args: &Args) -> Outcome<Packed> {
    let Args {
        now,
        cost,
        limit,
        period,
        burst,
    } = *args;

    // 1. A missing or corrupt state is a fresh key (no debt).
    let (mut at, mut d) = match unpack::<2>(stored, TAG) {
        Some([a, b]) if sane(a) && sane(b) => (a, b),
        _ => (now, 0.0),
    };

    // 2. Cap to the current quota and clock: an `at` ahead of now by at most the skew decides as
    //    of `at` (`t`), further ahead the clock stepped back, written even on a denial.
    d = d.min(burst);
    let (t, stepped_back) = decision_time(at, now);
    if stepped_back {
        at = now;
    }

    // 3. Drain the debt up to t, the elapsed time capped at the time to pay it off.
    let to_zero = (d * period / limit).ceil();
    let debt;
    if t - at >= to_zero {
        at = t;
        d = 0.0;
        debt = 0.0;
    } else {
        debt = (d - (t - at) * limit / period).max(0.0);
    }

    // 4. Decide; a denied request consumes nothing.
    let allowed = debt + cost <= burst;
    let mut used = debt;
    let mut retry = 0.0;
    if allowed {
        used = debt + cost;
        if cost > 0.0 {
            at = t;
            d = used;
        }
    } else if cost > burst {
        retry = -1.0;
    } else {
        // 5a. Retry: the smallest whole elapsed time since `at` at which steps 3 and 4 admit;
        //     the division estimates it, the same comparison settles it.
        let mut e = ((d + cost - burst) * period / limit)
            .ceil()
            .max(0.0)
            .min(to_zero);
        if e < to_zero && d - e * limit / period + cost > burst {
            e += 1.0;
        } else if e > 0.0 && d - (e - 1.0) * limit / period + cost <= burst {
            e -= 1.0;
        }
        retry = at + e - now;
    }

    // 5b. Reset: until the debt is paid off.
    let reset = if d > 0.0 {
        at + (d * period / limit).ceil() - now
    } else {
        0.0
    };

    // 6. The new state: only what changed.
    Outcome {
        allowed,
        remaining: (burst - used).floor(),
        retry_us: retry,
        reset_us: reset,
        state: (cost > 0.0 && (allowed || stepped_back)).then(|| Packed::new(TAG, [at, d])),
    }
}

/// A refund (the `@refund` part of `lua/gcra.lua`): debt - units, at least 0. Draining
/// commutes with the subtraction, so `at` stays.
pub(crate) fn refund(state: &[u8], r: &Refund) -> Option<Packed> {
    let [at, debt] = unpack::<2>(Some(state), TAG)?;
    if !(sane(at) && sane(debt)) {
        return None;
    }
    Some(Packed::new(TAG, [at, (debt - r.units).max(0.0)]))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::sequences;
    use crate::algorithm::testing::{expect, Seq, S};

    proptest! {
        /// Exact both ways over random quotas, emission intervals that are not whole µs
        /// included, with clients on whole milliseconds: a denied request is admitted at
        /// now + retry_after and denied 1 ms before (3 per 10 s with a burst of 5: admitted at
        /// 3333 ms, so told 3333, where an estimate only ever rounded up says 3334).
        #[test]
        fn retry_is_exact_both_ways_on_whole_milliseconds(
            limit in 1u32..=50,
            period_ms in prop_oneof![Just(10_000u64), 1u64..=100_000],
            burst in 1u32..=10,
            steps in prop::collection::vec(0u64..=4_000, 1..40),
        ) {
            let mut s = Seq::packed(step).quota(limit as f64, period_ms as f64 * 1000.0, burst as f64);
            let mut now = 1_700_000_000_000_000.0;
            for ms in steps {
                now += ms as f64 * 1000.0;
                let reply = s.at(now).cost(1.0);
                if !reply.allowed {
                    let retry = reply.retry_after_ms as f64 * 1000.0;
                    prop_assert!(s.clone().at(now + retry).cost(1.0).allowed, "{:?}", reply);
                    prop_assert!(
                        !s.clone().at(now + retry - 1000.0).cost(1.0).allowed,
                        "allowed 1 ms before {:?}",
                        reply
                    );
                }
            }
        }
    }

    #[test]
    fn burst_drain_cost_and_peek() {
        Seq::packed(step).run(sequences::REFILL_BURST);
    }

    #[test]
    fn keeps_a_fractional_debt() {
        Seq::packed(step).run(sequences::GCRA_FRACTIONAL_DEBT);
    }

    #[test]
    fn a_tightened_quota_caps_the_debt() {
        Seq::packed(step).run(sequences::REFILL_TIGHTENED);
    }

    #[test]
    fn a_full_burst_passes_even_when_t_is_inexact() {
        // 11 per second: T = 90909.09 µs. Summing T eleven times exceeds 11 * T in doubles; the
        // debt counted in requests does not.
        let mut s = Seq::packed(step).quota(11.0, S, 11.0);
        let reset_ms = [91, 182, 273, 364, 455, 546, 637, 728, 819, 910, 1_000];
        for (i, reset) in reset_ms.into_iter().enumerate() {
            expect(s.at(0.0).cost(1.0), (true, 10 - i as u64, 0, reset));
        }
        expect(s.cost(1.0), (false, 0, 91, 1_000));
    }

    #[test]
    fn a_billion_per_second_keeps_sub_microsecond_increments() {
        // T = 0.001 µs: near 1.8e15 µs an absolute tat could not tell tat from tat + T.
        let now = 1_800_000_000.0 * S;
        let mut s = Seq::packed(step).quota(1e9, S, 1e9);
        expect(s.at(now).cost(1.0), (true, 999_999_999, 0, 1));
        expect(s.cost(1.0), (true, 999_999_998, 0, 1));
        expect(s.cost(999_999_998.0), (true, 0, 0, 1_000));
        expect(s.cost(1.0), (false, 0, 1, 1_000));
        // 1 µs later 1000 requests have drained.
        expect(s.at(now + 1.0).cost(1.0), (true, 999, 0, 1_000));
    }

    #[test]
    fn absurd_quotas_cap_times() {
        // 10^13 at once, one a second: paid off in 10^16 ms, which the reply says exactly; the
        // TTL stops at 2^53 ms (285 000 years).
        let mut s = Seq::packed(step).quota(1.0, S, 1e13);
        expect(s.at(0.0).cost(1e13), (true, 0, 0, 10_000_000_000_000_000));
        assert_eq!(s.ttl_ms(), Some(1 << 53));
        // 10^15 at once, one a century: 10^17 years, capped at 2^62 ms.
        let century = 100.0 * 365.0 * 86_400.0 * S;
        let mut s = Seq::packed(step).quota(1.0, century, 1e15);
        let max = 1 << 62;
        expect(s.at(0.0).cost(1e15), (true, 0, 0, max));
        // One more fits after one emission interval: a century.
        expect(s.cost(1.0), (false, 0, 3_153_600_000_000, max));
    }

    #[test]
    fn the_key_expires_exactly_when_it_is_fresh_again() {
        let mut s = Seq::packed(step).quota(3.0, S, 3.0);
        expect(s.at(0.0).cost(2.0), (true, 1, 0, 667));
        assert_eq!(s.ttl_ms(), Some(667));
    }
}
