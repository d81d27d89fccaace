//! Shrinking: the shortest prefix of a failing schedule that still breaks the same promise.
//!
//! Runs are not deterministic (real time, real Redis), so a prefix counts as failing when one
//! of [`TRIES`] runs of it fails; the search is a bisection over the prefix length, stopped
//! (with the shortest prefix found so far) at a deadline.

use std::time::Instant;

use crate::fleet::{self, Fixture};
use crate::generator::Schedule;
use crate::oracles;

/// Runs of one prefix before it is taken to pass.
const TRIES: usize = 2;

/// Whether the first `len` operations of `schedule` break `oracle`.
async fn fails(
    schedule: &Schedule,
    len: usize,
    oracle: &str,
    redis: &Fixture,
    deadline: Instant,
) -> bool {
    for _ in 0..TRIES {
        crate::clean(redis).await;
        let run = fleet::run(schedule, &schedule.ops[..len], redis, deadline).await;
        if oracles::check(schedule, &run)
            .iter()
            .any(|v| v.oracle == oracle)
        {
            return true;
        }
    }
    false
}

/// The shortest prefix of `schedule` found to break `oracle` (the whole schedule if none is
/// shorter, or none was found by `deadline`).
pub async fn shrink(
    schedule: &Schedule,
    oracle: &str,
    redis: &Fixture,
    deadline: Instant,
) -> Schedule {
    let (mut lo, mut hi) = (1, schedule.ops.len());
    while lo < hi && Instant::now() < deadline {
        let mid = (lo + hi) / 2;
        if fails(schedule, mid, oracle, redis, deadline).await {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Schedule {
        ops: schedule.ops[..hi].to_vec(),
        ..schedule.clone()
    }
}
