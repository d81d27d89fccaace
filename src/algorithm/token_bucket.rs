//! Token bucket: the Rust mirror of `lua/token_bucket.lua`, step for step.

use super::{ttl_ms, Args, Reply, Step, Write};

/// The stored bucket: whole tokens, and the µs time up to which refill is accounted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct State {
    pub tokens: f64,
    pub ts: f64,
}

pub(crate) fn step(stored: Option<State>, args: &Args) -> Step<State> {
    let Args {
        now,
        cost,
        limit,
        period,
        burst,
    } = *args;

    // 1. A missing bucket is a full one.
    let State { mut tokens, mut ts } = stored.unwrap_or(State {
        tokens: burst,
        ts: now,
    });

    // 2. Cap to the current quota and clock; a clock stepped back is written even on a denial.
    tokens = tokens.floor().min(burst);
    let stepped_back = ts > now;
    ts = ts.min(now);

    // 3. Refill, keeping fractional progress; past full the clock stops.
    let to_full = ((burst - tokens) * period / limit).ceil();
    if now - ts >= to_full {
        tokens = burst;
        ts = now;
    } else {
        let elapsed = now - ts;
        let mut gained = (elapsed * limit / period).floor();
        // Past 2^53 the division can land one token off: settle on the count the retry times
        // promise.
        if ((gained + 1.0) * period / limit).ceil() <= elapsed {
            gained += 1.0;
        } else if gained > 0.0 && (gained * period / limit).ceil() > elapsed {
            gained -= 1.0;
        }
        tokens += gained;
        ts = now.min(ts + (gained * period / limit).ceil());
    }

    // 4. Decide; a denied request consumes nothing.
    let allowed = cost <= tokens;
    if allowed {
        tokens -= cost;
    }

    // 5. Times.
    let retry = if allowed {
        0.0
    } else if cost > burst {
        -1.0
    } else {
        ts + ((cost - tokens) * period / limit).ceil() - now
    };
    let reset = if tokens < burst {
        ts + ((burst - tokens) * period / limit).ceil() - now
    } else {
        0.0
    };

    // 6. Write only what changed.
    let write = if cost > 0.0 && (allowed || stepped_back) {
        Write::Put {
            state: State { tokens, ts },
            ttl_ms: ttl_ms(reset),
        }
    } else {
        Write::Keep
    };
    Step {
        reply: Reply::new(allowed, limit, tokens, retry, reset),
        write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: f64 = 60_000_000.0;

    fn args(now: f64, cost: f64) -> Args {
        Args {
            now,
            cost,
            limit: 10.0,
            period: MINUTE,
            burst: 10.0,
        }
    }

    /// Runs one step and stores what it writes, like the store does.
    fn run(state: &mut Option<State>, now: f64, cost: f64) -> Reply {
        let step = step(*state, &args(now, cost));
        if let Write::Put { state: s, .. } = step.write {
            *state = Some(s);
        }
        step.reply
    }

    #[test]
    fn slow_rate_keeps_fractional_progress() {
        // 10 per minute, a client every 5 s for 10 minutes: 10 a minute after the first burst.
        let mut state = None;
        let mut admitted = 0;
        for i in 0..120 {
            if run(&mut state, i as f64 * 5_000_000.0, 1.0).allowed {
                admitted += 1;
            }
        }
        // 10 (the initial burst) + 10 per minute for the 9m55s that follow (119 calls × 5 s).
        assert_eq!(admitted, 10 + 99);
    }

    #[test]
    fn denied_request_consumes_nothing_and_says_when() {
        let mut state = None;
        for _ in 0..10 {
            assert!(run(&mut state, 0.0, 1.0).allowed);
        }
        let denied = run(&mut state, 1_000_000.0, 1.0);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 5_000); // 6 s per token, 1 s elapsed
        assert_eq!(denied.reset_after_ms, 59_000);
        let again = run(&mut state, 1_000_000.0, 1.0);
        assert_eq!(again, denied);
    }

    #[test]
    fn cost_above_capacity_is_never_allowed() {
        let mut state = None;
        let r = run(&mut state, 0.0, 11.0);
        assert!(!r.allowed);
        assert_eq!(r.retry_after_ms, -1);
        assert_eq!(r.remaining, 10);
        assert_eq!(state, None);
    }
}
