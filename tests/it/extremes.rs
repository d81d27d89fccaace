//! Quota extremes, for every algorithm in `Algorithm::ALL`, on Redis and in memory: limit 1,
//! limit 10^9 per second, period 1 ms, period 1 year, burst above the limit, costs around the
//! capacity, and counts up to `MAX_COUNT` (10^15) with costs up to `u64::MAX`.
//!
//! Every scenario runs on `RedisStore` and `MemoryStore` on the same simulated clock; the two
//! must give identical decisions, none may fail, and the numbers the contract fixes (allowed,
//! `remaining`, never-allowed, and for the emission-based algorithms — token bucket and GCRA —
//! the exact times) are asserted.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redlimit::algorithm::MAX_SLIDING_LOG_BURST;
use redlimit::store::RedisStore;
use redlimit::{
    clock::ManualClock,
    quota::{QuotaError, MAX_COUNT, MAX_PERIOD},
    Algorithm, Decision, Quota,
};
use support::{Ctx, RedisServer};

/// The simulated start: half a second past 2023-11-14T22:13:20Z, so whole-second windows are
/// half-way through and millisecond windows start.
const T0_US: u64 = 1_700_000_000_500_000;
const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// One step of a scenario: move the clock forward, then check at this cost.
#[derive(Debug, Clone, Copy)]
struct Step {
    advance_us: u64,
    cost: u64,
}

fn at(advance_us: u64, cost: u64) -> Step {
    Step { advance_us, cost }
}

fn now(cost: u64) -> Step {
    at(0, cost)
}

/// Token bucket and GCRA refill continuously at `limit / period`; the window algorithms count
/// per window, so their times depend on where the window edges fall.
fn emission_based(algorithm: Algorithm) -> bool {
    matches!(algorithm.name(), "token-bucket" | "gcra")
}

/// The sliding log keeps one sorted-set entry per admitted unit, so it refuses bursts above
/// `MAX_SLIDING_LOG_BURST` with a typed error (checked here); the scenarios whose burst it holds
/// run on it like on every other algorithm.
fn holds(algorithm: Algorithm, quota: &Quota) -> bool {
    match algorithm.supports(quota) {
        Ok(()) => true,
        Err(error) => {
            assert_eq!(
                algorithm,
                Algorithm::SlidingLog,
                "{algorithm} refused {quota:?}"
            );
            assert!(quota.burst() > MAX_SLIDING_LOG_BURST);
            assert_eq!(error, QuotaError::BurstTooLargeForSlidingLog);
            println!("{algorithm}: burst {} refused: {error}", quota.burst());
            false
        }
    }
}

/// A Redis server and fresh keys.
struct Bench {
    _redis: RedisServer,
    store: RedisStore,
    keys: AtomicU64,
}

impl Bench {
    fn new() -> Self {
        let redis = RedisServer::start();
        let store = Ctx::default()
            .timeout(Duration::from_secs(10))
            .redis_store(&redis);
        Bench {
            _redis: redis,
            store,
            keys: AtomicU64::new(0),
        }
    }

    /// Runs `steps` on a fresh key under `algorithm` and `quota`, on Redis and in memory, and
    /// returns the decisions after checking that both agree and keep the contract.
    async fn run(&self, algorithm: Algorithm, quota: Quota, steps: &[Step]) -> Vec<Decision> {
        // With periods of milliseconds the scripts write TTLs of a millisecond, and Redis
        // expires keys on its real clock, not the simulated one: if real time outran the
        // simulated time between two steps, Redis may rightly have forgotten a key the memory
        // store still holds. Only then is the scenario run again, on a new key.
        let short_lived = quota.period() < Duration::from_millis(100);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let key = format!("k{}", self.keys.fetch_add(1, Ordering::Relaxed));
            let started = Instant::now();
            let from_redis = self.sequence(algorithm, &quota, steps, &key, true).await;
            let real = started.elapsed();
            let from_memory = self.sequence(algorithm, &quota, steps, &key, false).await;
            if from_redis != from_memory && short_lived && real >= Duration::from_millis(1) {
                // Rare on an idle machine; a busy one may need a few tries.
                assert!(
                    attempts < 200,
                    "{algorithm} {quota:?}: never ran the steps within the 1 ms TTLs"
                );
                continue;
            }
            if attempts > 1 {
                println!("{algorithm} {quota:?}: {attempts} attempts (real-time expiry)");
            }
            for (i, (r, m)) in from_redis.iter().zip(&from_memory).enumerate() {
                assert_eq!(
                    r, m,
                    "{algorithm} {quota:?} step {i} {:?}: redis vs memory",
                    steps[i]
                );
                check_contract(algorithm, &quota, steps[i].cost, r);
            }
            return from_redis;
        }
    }

    async fn sequence(
        &self,
        algorithm: Algorithm,
        quota: &Quota,
        steps: &[Step],
        key: &str,
        on_redis: bool,
    ) -> Vec<Decision> {
        let clock = ManualClock::new(Duration::from_micros(T0_US));
        let ctx = Ctx::new(algorithm).manual(&clock);
        let limiter = if on_redis {
            ctx.limiter(self.store.clone())
        } else {
            ctx.memory()
        };
        let mut decisions = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            clock.advance(Duration::from_micros(step.advance_us));
            let store = if on_redis { "redis" } else { "memory" };
            let decision = limiter
                .try_check_quotas(key, &quota.into(), step.cost)
                .await
                .unwrap_or_else(|e| {
                    panic!("{algorithm} {quota:?} step {i} {step:?} on {store}: {e}")
                });
            decisions.push(decision);
        }
        decisions
    }
}

/// What every decision promises, whatever the algorithm and quota.
fn check_contract(algorithm: Algorithm, quota: &Quota, cost: u64, d: &Decision) {
    let context = format!("{algorithm} {quota:?} cost {cost}: {d:?}");
    assert_eq!(d.limit, quota.limit(), "{context}");
    assert!(d.remaining <= quota.burst(), "{context}");
    if d.allowed {
        assert_eq!(d.retry_after, Duration::ZERO, "{context}");
    } else if cost > quota.burst() {
        assert!(d.never_allowed(), "{context}");
    } else {
        assert!(
            d.retry_after > Duration::ZERO && !d.never_allowed(),
            "{context}"
        );
    }
}

/// `(allowed, remaining)` of each decision.
fn outcomes(decisions: &[Decision]) -> Vec<(bool, u64)> {
    decisions.iter().map(|d| (d.allowed, d.remaining)).collect()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `denied` came right after `admitted` took the last unit of a quota over `period`: a window
/// counter may hold the next request up to the end of the following window; an emission-based
/// algorithm says exactly `retry`, and `admitted` resets after the whole period.
fn assert_denial_after_the_last_unit(
    algorithm: Algorithm,
    admitted: &Decision,
    denied: &Decision,
    period: Duration,
    retry: Duration,
) {
    assert!(denied.retry_after <= 2 * period, "{algorithm}: {denied:?}");
    if emission_based(algorithm) {
        assert_eq!(denied.retry_after, retry, "{algorithm}");
        assert_eq!(admitted.reset_after, period, "{algorithm}");
    }
}

#[tokio::test]
async fn limit_one() {
    let bench = Bench::new();
    for &algorithm in Algorithm::ALL {
        for quota in [Quota::per_second(1).unwrap(), Quota::new(1, YEAR).unwrap()] {
            let period = quota.period();
            let steps = [
                now(1),
                now(1),
                now(2),
                now(0),
                // Two periods later the key is fresh under every algorithm.
                at(2 * period.as_micros() as u64, 1),
            ];
            let d = bench.run(algorithm, quota, &steps).await;
            assert_eq!(
                outcomes(&d),
                [(true, 0), (false, 0), (false, 0), (true, 0), (true, 0)],
                "{algorithm} {quota:?}"
            );
            assert!(d[2].never_allowed());
            assert_denial_after_the_last_unit(algorithm, &d[0], &d[1], period, period);
        }
    }
}

#[tokio::test]
async fn limit_a_billion_per_second() {
    let bench = Bench::new();
    let billion = 1_000_000_000;
    let quota = Quota::per_second(billion).unwrap();
    for &algorithm in Algorithm::ALL {
        if !holds(algorithm, &quota) {
            continue;
        }
        let steps = [
            now(billion),
            now(1),
            at(MS, 0),
            at(2 * SEC, 123_456_789),
            now(billion),
            now(billion + 1),
            now(billion - 123_456_789),
        ];
        let d = bench.run(algorithm, quota, &steps).await;
        assert_eq!(
            (d[0].allowed, d[0].remaining),
            (true, 0),
            "{algorithm}: the whole burst in one cost"
        );
        assert!(!d[1].allowed, "{algorithm}");
        assert_eq!(
            outcomes(&d[3..]),
            [
                (true, 876_543_211),
                (false, 876_543_211),
                (false, 876_543_211),
                (true, 0)
            ],
            "{algorithm}"
        );
        assert!(d[5].never_allowed());
        // One unit takes 1 ns: rounded up to the millisecond.
        assert_denial_after_the_last_unit(algorithm, &d[0], &d[1], ms(1_000), ms(1));
        if emission_based(algorithm) {
            // A millisecond refills exactly a million.
            assert_eq!(d[2].remaining, 1_000_000, "{algorithm}");
            // 123 456 789 missing: 123.456789 ms, rounded up.
            assert_eq!(d[4].retry_after, ms(124), "{algorithm}");
        }
    }
}

#[tokio::test]
async fn period_one_millisecond() {
    let bench = Bench::new();
    for &algorithm in Algorithm::ALL {
        for (limit, burst) in [(1, 1), (5, 5), (5, 50)] {
            let quota = support::quota_with_burst(limit, Duration::from_millis(1), burst);
            // Long enough for every algorithm to be back to full: two periods, or twice the
            // time the burst takes to refill.
            let full_again = 2 * MS * (burst / limit).max(1);
            let steps = [
                now(burst),
                now(1),
                now(burst + 1),
                at(full_again, burst),
                at(full_again, 1),
            ];
            let d = bench.run(algorithm, quota, &steps).await;
            assert_eq!(
                outcomes(&d),
                [
                    (true, 0),
                    (false, 0),
                    (false, 0),
                    (true, 0),
                    (true, burst - 1)
                ],
                "{algorithm} {quota:?}"
            );
            assert!(d[2].never_allowed());
            assert!(d[1].retry_after <= ms(2), "{algorithm}: {:?}", d[1]);
            if emission_based(algorithm) {
                // 1/limit ms per unit, rounded up to 1 ms.
                assert_eq!(d[1].retry_after, ms(1), "{algorithm}");
                // burst/limit ms to refill.
                assert_eq!(d[0].reset_after, ms(burst / limit), "{algorithm}");
            }
        }
    }
}

#[tokio::test]
async fn period_one_year() {
    let bench = Bench::new();
    let year_us = YEAR.as_micros() as u64;
    for &algorithm in Algorithm::ALL {
        // One unit every 121.666... days.
        let quota = Quota::new(3, YEAR).unwrap();
        let d = bench
            .run(
                algorithm,
                quota,
                &[now(1), now(2), now(1), now(4), at(2 * year_us, 3)],
            )
            .await;
        assert_eq!(
            outcomes(&d),
            [(true, 2), (true, 0), (false, 0), (false, 0), (true, 0)],
            "{algorithm}"
        );
        assert!(d[3].never_allowed());
        assert_denial_after_the_last_unit(algorithm, &d[1], &d[2], YEAR, YEAR / 3);

        // A billion a year: one unit every 31 536 µs.
        let billion = 1_000_000_000;
        let quota = Quota::new(billion, YEAR).unwrap();
        if !holds(algorithm, &quota) {
            continue;
        }
        let steps = [
            now(billion),
            at(1_000 * 31_536, 0),
            at(999_000 * 31_536, 0),
            at(2 * year_us, 0),
        ];
        let d = bench.run(algorithm, quota, &steps).await;
        assert_eq!((d[0].allowed, d[0].remaining), (true, 0), "{algorithm}");
        assert_eq!(d[3].remaining, billion, "{algorithm}");
        if emission_based(algorithm) {
            assert_eq!(d[1].remaining, 1_000, "{algorithm}");
            assert_eq!(d[2].remaining, 1_000_000, "{algorithm}");
            assert_eq!(d[0].reset_after, YEAR, "{algorithm}");
        }
    }
}

#[tokio::test]
async fn burst_larger_than_limit() {
    let bench = Bench::new();
    // 10 a second, up to 100 at once.
    let quota = Quota::per_second(10).unwrap().with_burst(100).unwrap();
    for &algorithm in Algorithm::ALL {
        let d = bench
            .run(
                algorithm,
                quota,
                &[now(100), now(101), now(1), at(SEC, 0), at(20 * SEC, 100)],
            )
            .await;
        assert_eq!((d[0].allowed, d[0].remaining), (true, 0), "{algorithm}");
        assert!(d[1].never_allowed(), "{algorithm}");
        assert!(!d[2].allowed, "{algorithm}");
        assert!(d[4].allowed, "{algorithm}: 20 s refill the whole burst");
        if emission_based(algorithm) {
            assert_eq!(d[2].retry_after, ms(100), "{algorithm}");
            assert_eq!(d[0].reset_after, ms(10_000), "{algorithm}");
            assert_eq!(d[3].remaining, 10, "{algorithm}: 10 a second, not 100");
        }
    }
}

#[tokio::test]
async fn costs_around_capacity() {
    let bench = Bench::new();
    for &algorithm in Algorithm::ALL {
        for quota in [
            Quota::per_minute(10).unwrap(),
            Quota::per_second(1).unwrap().with_burst(7).unwrap(),
            Quota::per_second(MAX_COUNT).unwrap(),
            Quota::new(MAX_COUNT, MAX_PERIOD).unwrap(),
        ] {
            if !holds(algorithm, &quota) {
                continue;
            }
            let b = quota.burst();
            // Each on a fresh key.
            for (cost, expected) in [
                (b - 1, (true, 1)),
                (b, (true, 0)),
                (b + 1, (false, b)),
                (u64::MAX, (false, b)),
            ] {
                let d = bench.run(algorithm, quota, &[now(cost)]).await;
                assert_eq!(
                    outcomes(&d),
                    [expected],
                    "{algorithm} {quota:?} cost {cost}"
                );
            }
            // On one key: burst-1, then the last unit, then the full burst is denied (not never)
            // and consumes nothing, and the cost above capacity is never allowed.
            let d = bench
                .run(
                    algorithm,
                    quota,
                    &[now(b - 1), now(1), now(b), now(b + 1), now(0)],
                )
                .await;
            assert_eq!(
                outcomes(&d),
                [(true, 1), (true, 0), (false, 0), (false, 0), (true, 0)],
                "{algorithm} {quota:?}"
            );
            assert!(!d[2].never_allowed() && d[3].never_allowed(), "{algorithm}");
        }
    }
}

#[tokio::test]
async fn counts_near_max_count() {
    let bench = Bench::new();
    let max = MAX_COUNT;
    for &algorithm in Algorithm::ALL {
        if !holds(algorithm, &Quota::per_second(max).unwrap()) {
            continue;
        }
        // 10^15 a second: a unit every femtosecond.
        let quota = Quota::per_second(max).unwrap();
        let steps = [
            now(max - 1),
            now(1),
            now(1),
            at(2 * SEC, max / 3),
            now(max - max / 3),
            now(1 << 53),
        ];
        let d = bench.run(algorithm, quota, &steps).await;
        assert_eq!(
            outcomes(&d),
            [
                (true, 1),
                (true, 0),
                (false, 0),
                (true, max - max / 3),
                (true, 0),
                (false, 0)
            ],
            "{algorithm}"
        );
        assert!(d[5].never_allowed());
        assert_denial_after_the_last_unit(algorithm, &d[1], &d[2], ms(1_000), ms(1));

        // The largest limit over the longest period, and one unit over the longest period. (A
        // century and a half after T0 the clock nears 2^53 µs, the scripts' limit: the last step
        // comes 1.5 periods after T0, when every algorithm is full again.)
        for quota in [
            Quota::new(max, MAX_PERIOD).unwrap(),
            Quota::new(1, MAX_PERIOD).unwrap(),
        ] {
            let period_us = MAX_PERIOD.as_micros() as u64;
            let b = quota.burst();
            let d = bench
                .run(
                    algorithm,
                    quota,
                    &[now(b), now(1), at(period_us / 2, 0), at(period_us, b)],
                )
                .await;
            assert_eq!(
                outcomes(&d[..2]),
                [(true, 0), (false, 0)],
                "{algorithm} {quota:?}"
            );
            assert!(d[3].allowed, "{algorithm} {quota:?}");
            assert!(
                d[1].retry_after <= 2 * MAX_PERIOD,
                "{algorithm}: {:?}",
                d[1]
            );
            if emission_based(algorithm) {
                assert_eq!(d[0].reset_after, MAX_PERIOD, "{algorithm} {quota:?}");
                // Half the period refills half the units.
                assert_eq!(d[2].remaining, b / 2, "{algorithm} {quota:?}");
            }
        }
    }
}

/// A burst far above a tiny rate: it takes ages to refill, and the scripts must still answer
/// (and set a TTL Redis accepts) rather than fail.
#[tokio::test]
async fn burst_far_above_a_tiny_rate() {
    let bench = Bench::new();
    let per_second = Quota::per_second(1).unwrap();
    let per_century = Quota::new(1, MAX_PERIOD).unwrap();
    for &algorithm in Algorithm::ALL {
        for quota in [
            // 10^13 units, one a second: 317 000 years to refill.
            per_second.with_burst(10_000_000_000_000).unwrap(),
            // 10^14 and 10^15 units, one a second.
            per_second.with_burst(100_000_000_000_000).unwrap(),
            per_second.with_burst(MAX_COUNT).unwrap(),
            // 100 000 units, one every 100 years.
            per_century.with_burst(100_000).unwrap(),
            // 10^15 units, one every 100 years: longer than a Duration of milliseconds can say.
            per_century.with_burst(MAX_COUNT).unwrap(),
        ] {
            if !holds(algorithm, &quota) {
                continue;
            }
            let b = quota.burst();
            let d = bench
                .run(algorithm, quota, &[now(b), now(1), at(10 * SEC, 0)])
                .await;
            assert_eq!(
                outcomes(&d[..2]),
                [(true, 0), (false, 0)],
                "{algorithm} {quota:?}"
            );
            if emission_based(algorithm) {
                let period = quota.period();
                assert_eq!(d[1].retry_after, period, "{algorithm} {quota:?}");
                // b periods to refill: exact while the milliseconds stay below 2^53 (exact in
                // Lua's doubles); beyond that (285 000 years) a script may cap it.
                let refill_ms = u128::from(b) * period.as_millis();
                if refill_ms < 1 << 53 {
                    let expected = Duration::from_millis(refill_ms as u64);
                    assert_eq!(d[0].reset_after, expected, "{algorithm} {quota:?}");
                } else {
                    assert!(d[0].reset_after > 100 * YEAR, "{algorithm}: {:?}", d[0]);
                }
            }
        }
    }
}

/// "Never tell a client to come back too early": a request denied with `retry_after = r` is
/// admitted when it comes back exactly `r` later. With 10^9 units a year, `elapsed * limit`
/// passes 2^53, and a refill computed in doubles can fall one unit short at the very moment
/// the retry time names; the costs below are ones where it does, for a naive floor.
#[tokio::test]
async fn coming_back_after_retry_after_is_admitted() {
    let bench = Bench::new();
    let billion = 1_000_000_000;
    for &algorithm in Algorithm::ALL {
        for (quota, costs) in [
            (
                Quota::new(billion, YEAR).unwrap(),
                &[1, 125, 2_741_875, 88_892_000, 975_001_125, billion][..],
            ),
            (
                Quota::per_second(billion).unwrap(),
                &[1, 999, 1_000_001, billion][..],
            ),
            (
                support::quota_with_burst(7, Duration::from_secs(10), 9),
                &[1, 2, 8, 9][..],
            ),
        ] {
            if !holds(algorithm, &quota) {
                continue;
            }
            let b = quota.burst();
            for &cost in costs {
                let denied = bench.run(algorithm, quota, &[now(b), now(cost)]).await;
                let retry = denied[1].retry_after;
                assert!(!denied[1].allowed && retry > Duration::ZERO, "{algorithm}");
                let back = bench
                    .run(
                        algorithm,
                        quota,
                        &[now(b), now(cost), at(retry.as_micros() as u64, cost)],
                    )
                    .await;
                assert!(
                    back[2].allowed,
                    "{algorithm} {quota:?}: cost {cost} denied again after its retry_after {retry:?}: {:?}",
                    back[2]
                );
            }
        }
    }
}
