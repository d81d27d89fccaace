//! The written-out sequences of the algorithms' unit tests: each step's time, cost and
//! exact decision, and what the Rust mirror must (not) have written. The unit tests beside each
//! mirror run them on it ([`Seq::run`](super::testing::Seq::run)), and `tests/it/algorithms.rs`
//! runs those it names on Redis and on the memory store (it includes this file): one home for
//! the numbers. Plain data: nothing here names the crate.

/// One second, in µs.
pub const S: u64 = 1_000_000;

/// `(allowed, remaining, retry_after_ms, reset_after_ms)`, with -1 for a retry of "never".
pub type Expect = (bool, u64, i64, i64);

/// One step of a sequence.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// The quota from now on: limit, period in µs, burst.
    Quota(u64, u64, u64),
    /// At this µs (from the start), a request of this cost, and the decision it must get.
    At(u64, u64, Expect),
    /// Whether the last decision wrote (the Rust mirror's; the integration tests skip it).
    Wrote(bool),
    /// The TTL in ms the last decision set (the Rust mirror's; the integration tests skip it).
    Ttl(u64),
}

use Step::{At, Quota, Ttl, Wrote};

/// Token bucket and GCRA (they admit alike): a burst, refill, costs and a peek.
pub const REFILL_BURST: &[Step] = &[
    // 10 a minute: T = 6 s, tolerance 60 s.
    Quota(10, 60 * S, 10),
    At(0, 1, (true, 9, 0, 6_000)),
    At(0, 9, (true, 0, 0, 60_000)),
    At(0, 1, (false, 0, 6_000, 60_000)),
    // A peek: the debt is 9.83 after 1 s; nothing is written.
    At(S, 0, (true, 0, 0, 59_000)),
    Wrote(false),
    At(6 * S, 1, (true, 0, 0, 60_000)),
    At(6 * S, 2, (false, 0, 12_000, 60_000)),
    // Debt 9.5 at 9 s: a cost-1 request fits at 12 s.
    At(9 * S, 1, (false, 0, 3_000, 57_000)),
    // 60 s after the last write the debt is paid off: a fresh key.
    At(66 * S, 1, (true, 9, 0, 6_000)),
    // More than the tolerance can ever hold: never, and nothing consumed.
    At(66 * S, 11, (false, 9, -1, 6_000)),
    At(66 * S, 9, (true, 0, 0, 60_000)),
];

/// Token bucket and GCRA: a quota tightened caps the stored state.
pub const REFILL_TIGHTENED: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(0, 10, (true, 0, 0, 60_000)),
    // Now 2 a minute: the debt of 10 counts as 2, paid off in 60 s, not 300 s.
    Quota(2, 60 * S, 2),
    At(0, 1, (false, 0, 30_000, 60_000)),
    At(30 * S, 1, (true, 0, 0, 60_000)),
];

/// Token bucket and GCRA: a clock stepped back moves the state's time (`ts`, `at`) to now, and a
/// denial writes that down: otherwise every call would move it again and refill would wait until
/// the clock caught up with the old time (60 s here), whatever `retry_after` said.
pub const REFILL_CLOCK_STEPPED_BACK: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(100 * S, 10, (true, 0, 0, 60_000)),
    // The clock jumps back 60 s: the state is kept but measured from now, and that is
    // written even though the request is denied...
    At(40 * S, 1, (false, 0, 6_000, 60_000)),
    Wrote(true),
    // ...so it refills from there, not from 100 s.
    At(46 * S, 1, (true, 0, 0, 60_000)),
    // A peek after another step back writes nothing.
    At(10 * S, 0, (true, 0, 0, 60_000)),
    Wrote(false),
];

/// Token bucket and GCRA: a clock behind the stored time (`ts`, `at`) by at most `MAX_SKEW`
/// (another instance's, skewed) decides as of that time: no refill, nothing written backwards, an
/// admission keeps it, and its times count from its own clock. Further behind, the clock stepped
/// back: repaired as above.
pub const REFILL_CLOCK_BEHIND: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(100 * S, 9, (true, 1, 0, 54_000)),
    // 3 s behind: the last unit, as of 100 s (not refilled back to 97 s).
    At(97 * S, 1, (true, 0, 0, 63_000)),
    // Denied, written nothing: the unit due at 106 s is 9 s away on this clock.
    At(97 * S, 1, (false, 0, 9_000, 63_000)),
    Wrote(false),
    At(106 * S, 1, (true, 0, 0, 60_000)),
    // Exactly MAX_SKEW behind is still skew; 1 µs more is a clock that stepped back.
    At(101 * S, 1, (false, 0, 11_000, 65_000)),
    Wrote(false),
    At(101 * S - 1, 1, (false, 0, 6_000, 60_000)),
    Wrote(true),
];

/// GCRA keeps a fractional debt.
pub const GCRA_FRACTIONAL_DEBT: &[Step] = &[
    // 10 per 64 s: T = 6.4 s, and 1 s drains 0.15625 requests (exact in binary).
    Quota(10, 64 * S, 10),
    At(0, 5, (true, 5, 0, 32_000)),
    At(S, 1, (true, 4, 0, 37_400)),
    At(S, 4, (true, 0, 0, 63_000)),
    // Debt 9.84375: room for 1 once 0.84375 has drained, 5.4 s later.
    At(S, 1, (false, 0, 5_400, 63_000)),
    At(6 * S + 400_000, 1, (true, 0, 0, 64_000)),
];

/// Fixed window: counts per window, and rolls over.
pub const FIXED_WINDOWS: &[Step] = &[
    // 10 a minute; the windows are [0, 60 s), [60 s, 120 s)...
    Quota(10, 60 * S, 10),
    At(10 * S, 1, (true, 9, 0, 50_000)),
    At(10 * S, 8, (true, 1, 0, 50_000)),
    At(20 * S, 2, (false, 1, 40_000, 40_000)),
    At(20 * S, 0, (true, 1, 0, 40_000)),
    Wrote(false),
    At(20 * S, 1, (true, 0, 0, 40_000)),
    Ttl(40_000),
    // 1 µs before the window ends: come back in 1 µs, rounded up to 1 ms.
    At(60 * S - 1, 1, (false, 0, 1, 1)),
    // A new window: the whole capacity at once.
    At(60 * S, 10, (true, 0, 0, 60_000)),
    At(60 * S, 11, (false, 0, -1, 60_000)),
    // Two windows later the key is fresh.
    At(130 * S, 0, (true, 10, 0, 0)),
];

/// Fixed window: windows are aligned to the epoch.
pub const FIXED_ALIGNED: &[Step] = &[
    // 1_700_000_000 s is 20 s into a minute.
    Quota(10, 60 * S, 10),
    At(1_700_000_000 * S, 1, (true, 9, 0, 40_000)),
    At(1_700_000_000 * S, 9, (true, 0, 0, 40_000)),
    At(1_700_000_039 * S + 500_000, 1, (false, 0, 500, 500)),
    At(1_700_000_040 * S, 1, (true, 9, 0, 60_000)),
];

/// Fixed window: the capacity is the burst (the reply shows the limit).
pub const FIXED_BURST_BELOW_LIMIT: &[Step] = &[
    Quota(10, 60 * S, 3),
    At(0, 3, (true, 0, 0, 60_000)),
    At(0, 1, (false, 0, 60_000, 60_000)),
    At(0, 4, (false, 0, -1, 60_000)),
];

/// Fixed window: a quota tightened caps the count.
pub const FIXED_TIGHTENED: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(0, 10, (true, 0, 0, 60_000)),
    Quota(5, 60 * S, 5),
    At(S, 1, (false, 0, 59_000, 59_000)),
    At(60 * S, 1, (true, 4, 0, 60_000)),
];

/// Fixed window: a clock stepped back never locks the key out.
pub const FIXED_CLOCK_STEPPED_BACK: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(70 * S, 10, (true, 0, 0, 50_000)),
    // Back within the window: the count stands, until the window ends.
    At(65 * S, 1, (false, 0, 55_000, 55_000)),
    // Back into an earlier window: the count of a later window does not apply.
    At(50 * S, 1, (true, 9, 0, 10_000)),
    At(70 * S, 1, (true, 9, 0, 50_000)),
];

/// Fixed window: a clock up to `MAX_SKEW` before the stored window's start (another instance's,
/// skewed) decides in that window, not in an empty earlier one; its times count from its own clock.
/// Further before, the clock stepped back: the earlier window is empty, as above.
pub const FIXED_CLOCK_BEHIND: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(120 * S, 9, (true, 1, 0, 60_000)),
    At(115 * S, 1, (true, 0, 0, 65_000)),
    At(115 * S, 1, (false, 0, 65_000, 65_000)),
    Wrote(false),
    At(115 * S - 1, 1, (true, 9, 0, 5_001)),
];

/// Sliding log: every unit counts for exactly one period.
pub const LOG_EXACT_WINDOW: &[Step] = &[
    // 3 per 10 s.
    Quota(3, 10 * S, 3),
    At(0, 1, (true, 2, 0, 10_000)),
    At(2 * S, 1, (true, 1, 0, 10_000)),
    At(4 * S, 1, (true, 0, 0, 10_000)),
    // Full: one unit fits when the one of 0 s leaves, two when the one of 2 s does.
    At(5 * S, 1, (false, 0, 5_000, 9_000)),
    At(5 * S, 2, (false, 0, 7_000, 9_000)),
    Wrote(false),
    At(10 * S, 1, (true, 0, 0, 10_000)),
    At(10 * S, 0, (true, 0, 0, 10_000)),
    Wrote(false),
    At(10 * S, 4, (false, 0, -1, 10_000)),
    // In the window at 13 s: the units of 4 s and 10 s.
    At(13 * S, 2, (false, 1, 1_000, 7_000)),
    At(14 * S, 2, (true, 0, 0, 10_000)),
    // A unit of 14 s counts until 24 s, excluded.
    At(24 * S - 1, 0, (true, 1, 0, 1)),
    At(24 * S, 0, (true, 3, 0, 0)),
];

/// Sliding log: a quota tightened waits at most one period.
pub const LOG_TIGHTENED: &[Step] = &[
    Quota(3, 10 * S, 3),
    At(0, 3, (true, 0, 0, 10_000)),
    Quota(1, 10 * S, 1),
    At(S, 1, (false, 0, 9_000, 9_000)),
    At(10 * S, 1, (true, 0, 0, 10_000)),
];

/// Sliding log: a clock stepped back never locks the key out.
pub const LOG_CLOCK_STEPPED_BACK: &[Step] = &[
    Quota(3, 10 * S, 3),
    At(100 * S, 3, (true, 0, 0, 10_000)),
    // Back 60 s: a peek sees the units as admitted now and writes nothing...
    At(40 * S, 0, (true, 0, 0, 10_000)),
    Wrote(false),
    // ...a denied request writes that down...
    At(40 * S, 1, (false, 0, 10_000, 10_000)),
    Ttl(10_000),
    // ...so they leave the window 10 s later, not 70 s.
    At(50 * S, 1, (true, 2, 0, 10_000)),
];

/// Sliding log: a clock behind the newest entry by at most `MAX_SKEW` (another instance's, skewed)
/// decides as of that entry and adds its units there, never before it (they would leave the window
/// early); its times count from its own clock. Further behind, the clock stepped back: repaired as
/// above.
pub const LOG_CLOCK_BEHIND: &[Step] = &[
    Quota(3, 10 * S, 3),
    At(100 * S, 2, (true, 1, 0, 10_000)),
    At(97 * S, 1, (true, 0, 0, 13_000)),
    // All three units stay until 110 s: 13 s on this clock.
    At(97 * S, 1, (false, 0, 13_000, 13_000)),
    Wrote(false),
    At(110 * S, 1, (true, 2, 0, 10_000)),
    // 6 s behind the newest: a clock stepped back, whose entries count as admitted now.
    At(104 * S, 1, (true, 1, 0, 10_000)),
];

/// Sliding window: Cloudflare's worked example: limit 50 per minute, 42 in the previous window, 18
/// in the current one, 15 s in: 42 * 0.75 + 18 = 49.5 < 50, admitted; the next one is not.
pub const WINDOW_CLOUDFLARE: &[Step] = &[
    Quota(50, 60 * S, 50),
    At(10 * S, 42, (true, 8, 0, 108_572)),
    // At 13 s into the next window the 42 weigh floor(42 * 47/60) = 32: room for 18.
    At(73 * S, 18, (true, 0, 0, 103_667)),
    At(75 * S, 1, (true, 0, 0, 101_843)),
    // The next one waits until the 42 weigh 30: 15.714285 s in.
    At(75 * S, 1, (false, 0, 715, 101_843)),
];

/// Sliding window: the previous window weighs by its overlap.
pub const WINDOW_WEIGHTED: &[Step] = &[
    // 10 a minute; windows [0, 60 s), [60 s, 120 s)...
    Quota(10, 60 * S, 10),
    At(0, 5, (true, 5, 0, 108_000)),
    At(30 * S, 5, (true, 0, 0, 84_000)),
    // Full in this window; on the next window's first µs the 10 weigh 9.99..., rounded
    // down to 9: room for 1.
    At(30 * S, 1, (false, 0, 30_000, 84_000)),
    At(60 * S, 1, (true, 0, 0, 60_000)),
    // 9 + 1 now; room for one more when the share is 8: at 66 s.
    At(60 * S, 1, (false, 0, 6_000, 60_000)),
    // At 90 s the previous 10 weigh 4.99..., rounded down to 4.
    At(90 * S, 0, (true, 5, 0, 30_000)),
    Wrote(false),
    At(90 * S, 5, (true, 0, 0, 80_000)),
    Ttl(80_000),
    // Two windows later both counts have faded: fresh.
    At(200 * S, 0, (true, 10, 0, 0)),
    At(200 * S, 11, (false, 10, -1, 0)),
];

/// Sliding window: `retry_after` is exact to the microsecond.
pub const WINDOW_RETRY: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(0, 10, (true, 0, 0, 114_000)),
    // At 66 s the 10 weigh floor(8.99...) = 8.
    At(66 * S, 2, (true, 0, 0, 84_000)),
    At(66 * S, 1, (false, 0, 6_000, 84_000)),
    At(72 * S - 1, 1, (false, 0, 1, 78_001)),
    At(72 * S, 1, (true, 0, 0, 88_000)),
];

/// Sliding window: a quota tightened caps the counts.
pub const WINDOW_TIGHTENED: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(30 * S, 10, (true, 0, 0, 84_000)),
    // Now 5 a minute: the 10 count as 5, which fill this window; in the next one they
    // weigh less than 5 from its first µs on.
    Quota(5, 60 * S, 5),
    At(30 * S, 1, (false, 0, 30_000, 78_000)),
    At(60 * S, 1, (true, 0, 0, 60_000)),
];

/// Sliding window: a clock stepped back never locks the key out.
pub const WINDOW_CLOCK_STEPPED_BACK: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(70 * S, 10, (true, 0, 0, 104_000)),
    // Back within the window: the count stands.
    At(65 * S, 1, (false, 0, 55_000, 109_000)),
    // Back into an earlier window: counts of a later window do not apply.
    At(50 * S, 1, (true, 9, 0, 10_000)),
];

/// Sliding window: a clock up to `MAX_SKEW` before the stored window's start (another instance's,
/// skewed) decides as of that window's first µs, not in an empty earlier one; its times count from
/// its own clock. Further before, the clock stepped back: empty, as above.
pub const WINDOW_CLOCK_BEHIND: &[Step] = &[
    Quota(10, 60 * S, 10),
    At(120 * S, 10, (true, 0, 0, 114_000)),
    At(118 * S, 1, (false, 0, 62_000, 116_000)),
    Wrote(false),
    At(114 * S, 1, (true, 9, 0, 6_000)),
];
