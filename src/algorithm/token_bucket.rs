//! Token bucket: the Rust mirror of `lua/token_bucket.lua`, step for step.

use super::{
    decision_time, lua_mod, sane, unpack, Args, Kind, Leasing, Outcome, Packed, Refund, Spec,
    Window,
};

/// Token bucket's specification: its registration (see the module docs of `algorithm`).
pub(crate) const SPEC: Spec = Spec {
    name: "token-bucket",
    tag: b't',
    kind: Kind::Packed(step),
    fields: &["tokens", "ts"],
    lua: include_str!("../../lua/token_bucket.lua"),
    refund: Some(refund),
    window: Window::Refill,
    max_burst: None,
    leasing: Leasing::Anytime,
};

/// The state tag: `t`, layout 1 (tokens, ts).
const TAG: u8 = SPEC.tag;

/// One step over the stored state (`t` + whole tokens + the µs time up to which refill is
/// accounted).
pub(crate) fn step(stored: Option<&[u8]>, args: &Args) -> Outcome<Packed> {
    let Args {
        now,
        cost,
        limit,
        period,
        burst,
    } = *args;

    // 1. A missing or corrupt bucket is a full one.
    let (mut tokens, mut ts) = match unpack::<2>(stored, TAG) {
        Some([a, b]) if sane(a) && sane(b) => (a, b),
        _ => (burst, now),
    };

    // 2. Cap to the current quota and clock: a ts ahead of now by at most the skew decides as of
    //    ts (`t`), further ahead the clock stepped back, written even on a denial.
    tokens = tokens.floor().min(burst);
    let (t, stepped_back) = decision_time(ts, now);
    if stepped_back {
        ts = now;
    }
    // The bucket as stored (capped): a denial writes nothing, so its times count from here.
    // Counting them from the refilled bucket would round twice (ceil(a) + ceil(b) > ceil(a + b))
    // and tell a client up to 1 µs (so 1 ms) too late.
    let (tokens0, ts0) = (tokens, ts);

    // 3. Refill up to t, keeping fractional progress; past full the clock stops.
    let elapsed = t - ts;
    if elapsed >= ((burst - tokens) * period / limit).ceil() {
        tokens = burst;
        ts = t;
    } else if elapsed > 0.0 {
        let mut gained = (elapsed * limit / period).floor();
        // Past 2^53 the division can land one token off: settle on the count the retry times
        // promise.
        if ((gained + 1.0) * period / limit).ceil() <= elapsed {
            gained += 1.0;
        } else if gained > 0.0 && (gained * period / limit).ceil() > elapsed {
            gained -= 1.0;
        }
        if gained > 0.0 {
            tokens += gained;
            ts = t.min(ts + (gained * period / limit).ceil());
        }
    }

    // 4. Decide; a denied request consumes nothing. 5a. Retry: until `cost` tokens are there.
    let allowed = cost <= tokens;
    let mut retry = 0.0;
    if allowed {
        tokens -= cost;
    } else if cost > burst {
        retry = -1.0;
    } else {
        retry = ts0 + ((cost - tokens0) * period / limit).ceil() - now;
    }

    // 5b. Reset: until the bucket is full again.
    let (full_tokens, full_ts) = if allowed {
        (tokens, ts)
    } else {
        (tokens0, ts0)
    };
    let reset = if tokens < burst {
        full_ts + ((burst - full_tokens) * period / limit).ceil() - now
    } else {
        0.0
    };

    // 6. The new state: only what changed.
    Outcome {
        allowed,
        remaining: tokens,
        retry_us: retry,
        reset_us: reset,
        state: (cost > 0.0 && (allowed || stepped_back)).then(|| Packed::new(TAG, [tokens, ts])),
    }
}

/// A refund (the `@refund` part of `lua/token_bucket.lua`): whole tokens + units, at most
/// burst. Refill needs no accounting first: the next decision refills from the same `ts` and
/// caps at burst either way.
pub(crate) fn refund(state: &[u8], r: &Refund) -> Option<Packed> {
    let [tokens, ts] = unpack::<2>(Some(state), TAG)?;
    if !(sane(tokens) && sane(ts)) {
        return None;
    }
    let tokens = (tokens - lua_mod(tokens, 1.0) + r.units).min(r.burst);
    Some(Packed::new(TAG, [tokens, ts]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::{Seq, S};

    #[test]
    fn slow_rate_keeps_fractional_progress() {
        // 10 per minute, a client every 5 s for 10 minutes: 10 a minute after the first burst.
        let mut s = Seq::packed(step);
        let admitted = (0..120)
            .filter(|i| s.at(*i as f64 * 5.0 * S).cost(1.0).allowed)
            .count();
        // 10 (the initial burst) + 10 per minute for the 9m55s that follow (119 calls × 5 s).
        assert_eq!(admitted, 10 + 99);
    }

    #[test]
    fn denied_request_consumes_nothing_and_says_when() {
        let mut s = Seq::packed(step);
        for _ in 0..10 {
            assert!(s.at(0.0).cost(1.0).allowed);
        }
        let denied = s.at(1.0 * S).cost(1.0);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 5_000); // 6 s per token, 1 s elapsed
        assert_eq!(denied.reset_after_ms, 59_000);
        assert!(!s.wrote());
        let again = s.cost(1.0);
        assert_eq!(again, denied);
    }

    #[test]
    fn cost_above_capacity_is_never_allowed() {
        let mut s = Seq::packed(step);
        let r = s.at(0.0).cost(11.0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, -1);
        assert_eq!(r.remaining, 10);
        assert!(!s.wrote());
    }
}
