//! The token bucket on a real Redis (`lua/token_bucket.lua`), driven by a simulated clock.
//!
//! Every test starts its own `redis-server`. Time is a `ManualClock` passed to the script, so the
//! ten simulated minutes of the slow-rate test take a few milliseconds.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Decision, Limiter, Quota,
};
use support::{Ctx, RedisServer};
use tokio::sync::Barrier;

/// 2023-11-14T22:13:20Z: a realistic epoch for the simulated clock.
const T0: Duration = Duration::from_secs(1_700_000_000);

async fn check(limiter: &Limiter, key: &str, quota: &Quota, cost: u64) -> Decision {
    limiter
        .try_check_quotas(key, &quota.into(), cost)
        .await
        .unwrap_or_else(|e| panic!("redis store failed: {e}"))
}

/// A private Redis, a manual clock at `T0`, a token-bucket limiter on both, and the quota most
/// tests use: 10 a minute.
fn ten_a_minute_on_redis() -> (RedisServer, ManualClock, Limiter, Quota) {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let limiter = Ctx::new(Algorithm::TokenBucket)
        .manual(&clock)
        .redis(&redis);
    (redis, clock, limiter, Quota::per_minute(10).unwrap())
}

/// 10 a minute, a client calling every 5 s for 10 simulated minutes. Refill keeps fractional
/// progress, so once the initial burst is spent exactly 10 calls a minute pass; an
/// implementation that dropped the partial token at each call (moving its clock to `now`) would
/// admit a token only every 10 s: 6 a minute.
#[tokio::test]
async fn slow_rate_admits_ten_a_minute_over_ten_simulated_minutes() {
    let (_redis, clock, limiter, quota) = ten_a_minute_on_redis();

    let mut per_minute = [0u32; 10];
    let mut admitted = 0u64;
    for i in 0..120u64 {
        let elapsed_s = i * 5;
        if check(&limiter, "slow", &quota, 1).await.allowed {
            admitted += 1;
            per_minute[(elapsed_s / 60) as usize] += 1;
        }
        // Never more than the burst plus what has refilled so far (one token per 6 s).
        assert!(
            admitted <= 10 + elapsed_s / 6,
            "over-admitted at {elapsed_s} s: {admitted}"
        );
        clock.advance(Duration::from_secs(5));
    }
    println!("slow rate: admitted {admitted} of 120, per minute {per_minute:?}");

    // The burst of 10 plus one token per 6 s over the 595 s after the first call.
    assert_eq!(admitted, 10 + 99);
    // 12 calls a minute: all pass while the burst lasts (it shrinks by 2 a minute: 10, 8, 6,
    // 4, 2...) and the 5th minute takes the last of it; from then on 10 a minute, not 6.
    assert_eq!(per_minute, [12, 12, 12, 12, 11, 10, 10, 10, 10, 10]);
}

/// 500 checks at once on one fresh key, spread over 4 limiters, each with its own `RedisStore`
/// (4 connections): the script is atomic, so exactly the limit passes and every allowed request
/// saw a distinct `remaining`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_concurrent_checks_through_four_connections_admit_exactly_fifty() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    // A generous timeout: this test is about atomicity, not latency (a loaded CI machine must not
    // turn a slow answer into an error).
    let limiters: Vec<Limiter> = (0..4)
        .map(|_| {
            Ctx::default()
                .manual(&clock)
                .timeout(Duration::from_secs(10))
                .redis(&redis)
        })
        .collect();
    // Per hour: a token takes 72 s, so nothing refills (the clock does not move anyway).
    let quota = Quota::per_hour(50).unwrap();

    let barrier = Arc::new(Barrier::new(500));
    let started = Instant::now();
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let limiter = limiters[i % 4].clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                check(&limiter, "exact", &quota, 1).await
            })
        })
        .collect();
    let mut decisions = Vec::with_capacity(500);
    for task in tasks {
        decisions.push(task.await.unwrap());
    }
    let took = started.elapsed();

    let mut remaining: Vec<u64> = decisions
        .iter()
        .filter(|d| d.allowed)
        .map(|d| d.remaining)
        .collect();
    let denied: Vec<&Decision> = decisions.iter().filter(|d| !d.allowed).collect();
    println!(
        "token bucket exactness: {} of 500 admitted, {} denied, 4 connections, {took:?}",
        remaining.len(),
        denied.len()
    );
    assert_eq!(remaining.len(), 50);
    // Serialized: each admitted request saw its own state, 49 down to 0.
    remaining.sort_unstable();
    assert_eq!(remaining, (0..50).collect::<Vec<_>>());
    for d in &denied {
        assert_eq!(d.remaining, 0);
        assert!(
            d.retry_after > Duration::ZERO && !d.never_allowed(),
            "{d:?}"
        );
        // One token takes 72 s and the clock stood still.
        assert_eq!(d.retry_after, Duration::from_secs(72));
    }
    let per_limiter: Vec<u64> = limiters.iter().map(|l| l.stats().allowed).collect();
    assert_eq!(per_limiter.iter().sum::<u64>(), 50, "{per_limiter:?}");
    let clients = support::info_field(&redis.info("clients"), "connected_clients")
        .unwrap()
        .parse::<u32>()
        .unwrap();
    // Our 4 stores plus the connection that asked.
    assert!(clients >= 5, "only {clients} clients connected");
}

/// A cost the bucket can never hold is denied with `Decision::NEVER`, consumes nothing and
/// writes nothing.
#[tokio::test]
async fn cost_above_capacity_is_never_allowed_and_consumes_nothing() {
    let (redis, _clock, limiter, quota) = ten_a_minute_on_redis();

    let never = check(&limiter, "big", &quota, 11).await;
    assert!(!never.allowed);
    assert_eq!(never.retry_after, Decision::NEVER);
    assert!(never.never_allowed());
    assert_eq!((never.limit, never.remaining), (10, 10));
    assert_eq!(redis.dbsize(), 0, "a denial must not write");

    let next = check(&limiter, "big", &quota, 1).await;
    assert!(next.allowed);
    assert_eq!(next.remaining, 9, "the full bucket was still there");

    // Half-empty bucket: still never, still nothing consumed.
    check(&limiter, "big", &quota, 4).await;
    let never = check(&limiter, "big", &quota, u64::from(u32::MAX)).await;
    assert_eq!((never.allowed, never.remaining), (false, 5));
    assert_eq!(never.retry_after, Decision::NEVER);
    // A cost that fits the capacity but not the bucket right now: denied, with a real retry time
    // (5 tokens missing at 6 s each) and again nothing consumed.
    let later = check(&limiter, "big", &quota, 10).await;
    assert_eq!((later.allowed, later.remaining), (false, 5));
    assert_eq!(later.retry_after, Duration::from_secs(30));
    let last = check(&limiter, "big", &quota, 5).await;
    assert_eq!((last.allowed, last.remaining), (true, 0));
}

/// Cost 0 reports the state without consuming (and without writing).
#[tokio::test]
async fn peek_does_not_consume() {
    let (redis, clock, limiter, quota) = ten_a_minute_on_redis();

    let fresh = check(&limiter, "peek", &quota, 0).await;
    assert!(fresh.allowed);
    assert_eq!((fresh.remaining, fresh.reset_after), (10, Duration::ZERO));
    assert_eq!(redis.dbsize(), 0, "a peek must not write");

    assert_eq!(check(&limiter, "peek", &quota, 3).await.remaining, 7);
    for _ in 0..5 {
        let peek = check(&limiter, "peek", &quota, 0).await;
        assert!(peek.allowed);
        assert_eq!(peek.remaining, 7);
        assert_eq!(peek.reset_after, Duration::from_secs(18));
    }
    // A peek sees refill: one token per 6 s.
    clock.advance(Duration::from_secs(6));
    assert_eq!(check(&limiter, "peek", &quota, 0).await.remaining, 8);
    assert_eq!(check(&limiter, "peek", &quota, 1).await.remaining, 7);

    // On an empty bucket a peek still consumes nothing: the next real request waits for the
    // same token.
    check(&limiter, "peek", &quota, 7).await;
    let empty = check(&limiter, "peek", &quota, 0).await;
    assert_eq!(empty.remaining, 0);
    let denied = check(&limiter, "peek", &quota, 1).await;
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after, Duration::from_secs(6));
}

/// With `Clock::Server` the script reads Redis `TIME`: the bucket empties, and refills on the
/// server's clock.
#[tokio::test]
async fn server_clock_limits_and_refills() {
    let redis = RedisServer::start();
    let limiter = Ctx::default().clock(Clock::Server).redis(&redis);
    // 10 per second: a token every 100 ms.
    let quota = Quota::per_second(10).unwrap();

    let burst = check(&limiter, "server", &quota, 10).await;
    assert!(burst.allowed);
    assert_eq!(burst.remaining, 0);
    let denied = check(&limiter, "server", &quota, 1).await;
    assert!(!denied.allowed);
    assert!(
        denied.retry_after > Duration::ZERO && denied.retry_after <= Duration::from_millis(100),
        "{denied:?}"
    );
    assert!(denied.reset_after <= Duration::from_secs(1), "{denied:?}");

    // Real time passes on the server: after the announced retry time a token is back.
    tokio::time::sleep(denied.retry_after + Duration::from_millis(20)).await;
    let again = check(&limiter, "server", &quota, 1).await;
    assert!(again.allowed, "no refill on server time: {again:?}");
}
