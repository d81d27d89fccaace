//! Differential property test: `RedisStore` (the Lua scripts) and `MemoryStore` (their Rust
//! mirrors) give identical decisions and store identical state, byte for byte, for every
//! algorithm in `Algorithm::ALL`.
//!
//! Each case is a random sequence of (advance the clock, cost) steps under one quota shape; both
//! stores run it on the same simulated client clock (`Clock::Manual`) and must answer with the
//! same `Decision` at every step. One Redis server serves all cases; each case uses fresh keys.
//!
//! **Simulated time and Redis expiry.** The scripts compute TTLs on the simulated clock, but
//! Redis expires keys on its own real clock. A key whose TTL is shorter than the real time
//! between two steps would vanish in Redis while the memory store, on simulated time, still holds
//! it. So the quota shapes keep one emission interval (period / limit) at 1 s or more, and the
//! clock never stops within 100 ms of the end of a period-aligned window (it jumps to the next
//! window instead): every TTL the scripts write is then far longer than a case takes in real
//! time. When the simulated clock runs ahead of real time (the usual case), the memory store
//! forgets expired keys while Redis still has them; the scripts must then decide exactly as for a
//! fresh key, and this test holds them to it.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use redlimit::limiter::BlockFor;
use redlimit::store::{MemoryStore, RedisStore, RefundRequest, ReservedAt, StoreExt};
use redlimit::{clock::ManualClock, Algorithm, Decision, Quota, Quotas, Target};
use support::{Ctx, RedisServer};

/// Quota shapes as (limit, period in seconds, burst): burst equal to, above and below the limit;
/// emission intervals that are whole (6 s, 1 s) and inexact (10/3 s, 10/7 s).
const SHAPES: &[(u64, u64, u64)] = &[
    (10, 60, 10),
    (3, 10, 8),
    (7, 10, 1),
    (1, 3_600, 1),
    (100, 100, 250),
    (2, 86_400, 40),
];

/// Simulated start: 2023-11-14T22:13:20Z plus up to a day.
const EPOCH_US: u64 = 1_700_000_000_000_000;
const DAY_US: u64 = 86_400_000_000;
/// The clock never rests this close before the end of a period-aligned window.
const EDGE_GUARD_US: u64 = 100_000;

#[derive(Debug, Clone)]
struct Scenario {
    shape: usize,
    /// A second tier, checked with the first in one call (all or none).
    second: Option<usize>,
    start_us: u64,
    /// (advance in µs, what to do)
    steps: Vec<(u64, Step)>,
}

/// One step of a scenario: a check of some cost, or a fleet control.
#[derive(Debug, Clone, Copy)]
enum Step {
    Check(u64),
    /// Override the quotas with the shape of this index.
    SetQuota(usize),
    ClearQuota,
    /// Suspend for this many µs.
    Suspend(u64),
    Resume,
    Reset,
    /// Give this many units back (`Limiter::refund`).
    Refund(u64),
    /// Give this many units back, reserved this many µs ago (`StoreExt::refund`, the client time
    /// of the reservation).
    RefundReserved(u64, u64),
}

fn quota_of(shape: usize) -> Quota {
    let (limit, period_s, burst) = SHAPES[shape];
    support::quota_with_burst(limit, Duration::from_secs(period_s), burst)
}

impl Scenario {
    fn quota(&self) -> Quota {
        quota_of(self.shape)
    }

    fn quotas(&self) -> Quotas {
        match self.second {
            None => Quotas::from(self.quota()),
            Some(second) => Quotas::new([self.quota(), quota_of(second)]).unwrap(),
        }
    }

    /// Whether a fleet control runs: then no step may outrun the override's idle time, which
    /// the memory store counts on the simulated clock and Redis on its own.
    fn controlled(&self) -> bool {
        self.steps.iter().any(|(_, s)| !matches!(s, Step::Check(_)))
    }
}

fn advance(limit: u64, period_us: u64) -> impl Strategy<Value = u64> {
    let interval = period_us / limit;
    prop_oneof![
        3 => Just(0u64),
        2 => 1..=1_000u64,
        // Whole emission intervals, give or take a microsecond: refill boundaries.
        2 => (1..=4u64, 0..=2u64).prop_map(move |(k, d)| (k * interval + d).saturating_sub(1)),
        4 => 1..=2 * period_us,
        // An hour to more than a year.
        1 => 3_600_000_000..=400 * DAY_US,
    ]
}

fn cost(burst: u64) -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0..=2u64, 2 => 0..=burst + 2]
}

fn step(burst: u64, period_us: u64) -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => cost(burst).prop_map(Step::Check),
        1 => (0..SHAPES.len()).prop_map(Step::SetQuota),
        1 => Just(Step::ClearQuota),
        1 => (1..=2 * period_us).prop_map(Step::Suspend),
        1 => Just(Step::Resume),
        1 => Just(Step::Reset),
        2 => (1..=burst + 2).prop_map(Step::Refund),
        2 => (1..=burst + 2, 0..=2 * period_us)
            .prop_map(|(units, back)| Step::RefundReserved(units, back)),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (0..SHAPES.len()).prop_flat_map(|shape| {
        let (limit, period_s, burst) = SHAPES[shape];
        let period_us = period_s * 1_000_000;
        (
            prop_oneof![2 => Just(None), 1 => (0..SHAPES.len()).prop_map(Some)],
            0..=DAY_US,
            prop::collection::vec((advance(limit, period_us), step(burst, period_us)), 1..=30),
        )
            .prop_map(move |(second, start_us, steps)| {
                let mut scenario = Scenario {
                    shape,
                    second,
                    start_us: EPOCH_US + start_us,
                    steps,
                };
                if scenario.controlled() {
                    for (advance, _) in &mut scenario.steps {
                        *advance = (*advance).min(20 * DAY_US);
                    }
                }
                scenario
            })
    })
}

/// Moves a time that rests within `EDGE_GUARD_US` before a window end to that window end.
fn off_the_edge(now: u64, period_us: u64) -> u64 {
    let to_end = period_us - now % period_us;
    if to_end < EDGE_GUARD_US {
        now + to_end
    } else {
        now
    }
}

/// Runs `scenario` under `algorithm` on both stores, comparing every step.
async fn run(
    redis: &RedisStore,
    conn: &mut redis::aio::MultiplexedConnection,
    algorithm: Algorithm,
    key: &str,
    scenario: &Scenario,
    tally: &Tally,
) -> Result<(), TestCaseError> {
    let quota = scenario.quota();
    let quotas = scenario.quotas();
    let clock = ManualClock::new(Duration::from_micros(scenario.start_us));
    let ctx = Ctx::new(algorithm).manual(&clock);
    let on_redis = ctx.limiter(redis.clone());
    let memory = MemoryStore::new();
    let in_memory = ctx.limiter(memory.clone());

    let period_us = quota.period().as_micros() as u64;
    let mut now = scenario.start_us;
    let mut plain = true; // one tier, never overridden: the decision's limit is the quota's
    for (i, &(advance, step)) in scenario.steps.iter().enumerate() {
        now = off_the_edge(now + advance, period_us);
        clock.set(Duration::from_micros(now));
        if scenario.controlled() {
            // Keys the memory store let expire on the simulated clock expire in Redis too: a
            // state stale under its own quota is not fresh under an override's.
            let storage_key = in_memory.storage_key(key);
            // The tenant's controls (`#t`) as well.
            let [log_controls, tenant] = redlimit::test_hooks::control_keys(&storage_key);
            for k in [storage_key.clone(), log_controls, tenant] {
                if memory.stored_state(&k, now).is_none() {
                    let _: () = redis::cmd("DEL").arg(&k).query_async(conn).await.unwrap();
                }
            }
        }
        let cost = match step {
            Step::Check(cost) => cost,
            Step::Refund(units) => {
                plain = false;
                let (a, b) = (
                    on_redis.refund(key, &quotas, units).await,
                    in_memory.refund(key, &quotas, units).await,
                );
                a.map_err(|e| TestCaseError::fail(format!("{algorithm} step {i}: redis: {e}")))?;
                b.unwrap();
                continue;
            }
            Step::RefundReserved(units, back) => {
                plain = false;
                let storage_key = in_memory.storage_key(key);
                let request = RefundRequest {
                    key: &storage_key,
                    algorithm,
                    quotas: &quotas,
                    units,
                    reserved: ReservedAt::Client(now.saturating_sub(back)),
                };
                // (What Redis still holds after the memory store forgot it is compared through
                // the decisions that follow.)
                let held = memory.stored_state(&storage_key, now).is_some();
                let (a, b) = (redis.refund(request).await, memory.refund(request).await);
                let a = a.map_err(|e| {
                    TestCaseError::fail(format!("{algorithm} step {i}: redis: {e}"))
                })?;
                if held {
                    prop_assert_eq!(a, b.unwrap(), "{} step {}: refunded", algorithm, i);
                }
                continue;
            }
            control => {
                plain = false;
                let target = Target::key(key);
                let (a, b) = match control {
                    Step::SetQuota(shape) => {
                        let q = Quotas::from(quota_of(shape));
                        (
                            on_redis.set_quota(target, &q).await,
                            in_memory.set_quota(target, &q).await,
                        )
                    }
                    Step::ClearQuota => (
                        on_redis.clear_quota(target).await,
                        in_memory.clear_quota(target).await,
                    ),
                    Step::Suspend(us) => {
                        let d = Duration::from_micros(us);
                        (
                            on_redis.suspend(target, d).await,
                            in_memory.suspend(target, d).await,
                        )
                    }
                    Step::Resume => (
                        on_redis.resume(target).await,
                        in_memory.resume(target).await,
                    ),
                    Step::Reset => (on_redis.reset(target).await, in_memory.reset(target).await),
                    Step::Check(_) | Step::Refund(_) | Step::RefundReserved(..) => {
                        unreachable!()
                    }
                };
                let (a, b) = (
                    a.map_err(|e| {
                        TestCaseError::fail(format!("{algorithm} step {i}: redis: {e}"))
                    })?,
                    b.unwrap(),
                );
                prop_assert_eq!(
                    &a.quota_override,
                    &b.quota_override,
                    "{} step {}: override",
                    algorithm,
                    i
                );
                prop_assert_eq!(
                    a.suspended_for,
                    b.suspended_for,
                    "{} step {}: suspension",
                    algorithm,
                    i
                );
                // What Redis still holds after the memory store forgot it (on the simulated clock) is
                // only compared through the decisions that follow.
                if !b.tiers.is_empty() {
                    prop_assert_eq!(&a.tiers, &b.tiers, "{} step {}: tiers", algorithm, i);
                }
                continue;
            }
        };
        if scenario.second.is_some() {
            plain = false;
        }
        let from_redis = on_redis
            .try_check_quotas(key, &quotas, cost)
            .await
            .map_err(|e| TestCaseError::fail(format!("{algorithm} step {i}: redis: {e}")))?;
        let from_memory = in_memory
            .try_check_quotas(key, &quotas, cost)
            .await
            .unwrap();
        prop_assert_eq!(
            from_redis,
            from_memory,
            "{} step {} (t = start + {} µs, cost {}): redis vs memory",
            algorithm,
            i,
            now - scenario.start_us,
            cost
        );
        // The state too: whenever the memory store holds the key, Redis holds the same bytes
        // (the sliding log: the same admission times).
        let storage_key = in_memory.storage_key(key);
        // (Controls alone in memory: Redis may still hold tier states the memory store forgot
        // on the simulated clock; those are compared through the decisions that follow.)
        let controls_alone = in_memory.inspect(key).await.unwrap().tiers.is_empty();
        if let Some(expected) = memory
            .stored_state(&storage_key, now)
            .filter(|bytes| !(bytes.first() == Some(&b'M') && controls_alone))
        {
            let stored = redis_state(conn, algorithm, &storage_key).await;
            prop_assert_eq!(
                stored,
                expected,
                "{} step {}: stored state, redis vs memory",
                algorithm,
                i
            );
        }
        if algorithm == Algorithm::SlidingLog {
            // Its controls live next to its log.
            let [controls, _] = redlimit::test_hooks::control_keys(&storage_key);
            // (Only while the memory store holds them: Redis expires on its own clock.)
            if let Some(expected) = memory.stored_state(&controls, now) {
                let stored = redis_state(conn, Algorithm::TokenBucket, &controls).await;
                prop_assert_eq!(
                    stored,
                    expected,
                    "{} step {}: controls, redis vs memory",
                    algorithm,
                    i
                );
            }
        }
        if plain {
            check_contract(&from_redis, &quota, cost)
                .map_err(|e| TestCaseError::fail(format!("{algorithm} step {i}: {e}")))?;
        }
        tally.count(&from_redis);
    }
    Ok(())
}

/// What Redis stores for `key`: the state string, or the sliding log's scores as little-endian
/// doubles (the memory store's `stored_state` encoding).
async fn redis_state(
    conn: &mut redis::aio::MultiplexedConnection,
    algorithm: Algorithm,
    key: &str,
) -> Vec<u8> {
    if algorithm == Algorithm::SlidingLog {
        let scored: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await
            .unwrap();
        scored.iter().flat_map(|(_, t)| t.to_le_bytes()).collect()
    } else {
        let value: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
        value.unwrap_or_default()
    }
}

/// How the compared decisions came out, to show the cases are not all alike.
#[derive(Default)]
struct Tally {
    allowed: AtomicU64,
    denied: AtomicU64,
    never: AtomicU64,
    suspended: AtomicU64,
}

impl Tally {
    fn count(&self, d: &Decision) {
        let counter = match (d.allowed, d.never_allowed(), d.suspended) {
            (_, _, true) => &self.suspended,
            (true, _, _) => &self.allowed,
            (false, false, _) => &self.denied,
            (false, true, _) => &self.never,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What every decision promises, whatever the algorithm.
fn check_contract(d: &Decision, quota: &Quota, cost: u64) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{what}: {d:?} (cost {cost}, {quota:?})"));
    if d.limit != quota.limit() {
        return fail("limit is not the quota's");
    }
    if d.remaining > quota.burst() {
        return fail("more remaining than the burst");
    }
    if d.allowed && d.retry_after != Duration::ZERO {
        return fail("allowed with a retry time");
    }
    if cost > quota.burst() && (d.allowed || !d.never_allowed()) {
        return fail("a cost above the burst must be never allowed");
    }
    if !d.allowed && cost <= quota.burst() && (d.retry_after == Duration::ZERO || d.never_allowed())
    {
        return fail("a denial must say when to retry");
    }
    Ok(())
}

/// A private Redis, a store on it and a connection of the test's own (made on `runtime`), both
/// waiting up to 10 s: a slow answer on a loaded machine must not look like a divergence.
fn redis_store_and_connection(
    runtime: &tokio::runtime::Runtime,
) -> (RedisServer, RedisStore, redis::aio::MultiplexedConnection) {
    let redis = RedisServer::start();
    let store = Ctx::default()
        .timeout(Duration::from_secs(10))
        .redis_store(&redis);
    let client = redis.client();
    let mut conn = runtime
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();
    conn.set_response_timeout(Duration::from_secs(10));
    (redis, store, conn)
}

#[test]
fn redis_and_memory_stores_decide_identically() {
    let runtime = support::current_thread_runtime();
    let (_redis, store, conn) = redis_store_and_connection(&runtime);
    let cases = AtomicU64::new(0);
    let tally = Tally::default();
    let config = ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    };

    proptest!(config, |(scenario in scenario())| {
        let case = cases.fetch_add(1, Ordering::Relaxed);
        for &algorithm in Algorithm::ALL {
            let key = format!("case-{case}-{algorithm}");
            let mut conn = conn.clone();
            runtime.block_on(run(&store, &mut conn, algorithm, &key, &scenario, &tally))?;
        }
    });

    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "differential: {} cases over {} algorithms; identical decisions: {} allowed, {} denied, {} never allowed, {} suspended",
        load(&cases),
        Algorithm::ALL.len(),
        load(&tally.allowed),
        load(&tally.denied),
        load(&tally.never),
        load(&tally.suspended)
    );
    assert!(load(&tally.suspended) > 0, "no case ever suspended a key");
}

/// GCRA at 54/s, 27 units at one instant (checks, blocking checks, an acquire), then an
/// override to 5/s: the usage is kept, capped to the new quota (docs/fleet.md), while the old
/// regime's debt lasts; once the old regime has paid it off (27 / 54 s, when the key expires),
/// the override meets a fresh key. Both stores on the same clock, with Redis dropping what the
/// memory store let expire on it (the clock runs ahead of Redis's real time).
#[test]
fn gcra_override_keeps_the_capped_debt_only_while_the_old_one_lasts() {
    let runtime = support::current_thread_runtime();
    let (_redis, store, mut conn) = redis_store_and_connection(&runtime);
    let clock = ManualClock::new(Duration::from_micros(EPOCH_US));
    let ctx = Ctx::new(Algorithm::Gcra).manual(&clock);
    let memory = MemoryStore::new();
    let pair = [ctx.limiter(store), ctx.limiter(memory.clone())];
    let old = Quotas::from(Quota::new(54, Duration::from_secs(1)).unwrap());
    let new = Quotas::from(Quota::new(5, Duration::from_secs(1)).unwrap());
    let block = BlockFor::new(Duration::from_millis(1177)).unwrap();

    // (key, ms after the burst that the override comes, the check's decision after it)
    let cases = [
        ("within", 100, (false, 0, Duration::from_millis(100))),
        ("after", 600, (true, 4, Duration::ZERO)),
    ];
    for (key, after_ms, (allowed, remaining, retry_after)) in cases {
        clock.set(Duration::from_micros(EPOCH_US));
        let mut answers = Vec::new();
        for limiter in &pair {
            runtime.block_on(async {
                limiter.reset(key).await.unwrap();
                for _ in 0..12 {
                    assert!(limiter.check_quotas(key, &old, 1).await.is_allowed());
                }
                for _ in 0..12 {
                    let verdict = limiter.check_blocking(key, &old, 1, &block).await;
                    assert!(verdict.is_allowed());
                }
                limiter.resume(key).await.unwrap();
                let deadline = Instant::now() + Duration::from_secs(1);
                let acquired = limiter.acquire_cost(key, &old, 3, deadline).await;
                assert!(acquired.unwrap().is_allowed());
            });
        }
        clock.advance(Duration::from_millis(after_ms));
        let now = clock.now_micros();
        let storage_key = pair[1].storage_key(key);
        let held = memory.stored_state(&storage_key, now).is_some();
        assert_eq!(held, after_ms < 500, "{key}: the memory store's expiry");
        if !held {
            let _: () = runtime
                .block_on(redis::cmd("DEL").arg(&storage_key).query_async(&mut conn))
                .unwrap();
        }
        for limiter in &pair {
            let decision = runtime.block_on(async {
                limiter.set_quota(key, &new).await.unwrap();
                limiter.check_quotas(key, &old, 1).await
            });
            let decision = *decision.decision().expect("decided");
            answers.push(decision);
        }
        assert_eq!(answers[0], answers[1], "{key}: Redis / memory");
        let d = answers[1];
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after, d.limit),
            (allowed, remaining, retry_after, 5),
            "{key}: {d:?}"
        );
    }
}
