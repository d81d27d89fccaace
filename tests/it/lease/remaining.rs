//! What a request admitted from a lease reports as `remaining` (the `r` of `RateLimit`): never
//! more than the quota's burst (`q`), also when the instance holds units of an earlier renewal
//! while a new renewal reports Redis's remaining (the bucket refilled since, or Redis lost the
//! key), on real Redis, for every algorithm that leases.

use crate::support;

use super::{LEASING, T0};

use std::time::Duration;

use redlimit::clock::{Clock, ManualClock};
use redlimit::{Algorithm, Decision, Limiter, Quota};
use support::RedisServer;

/// An instance leasing on `redis` under `algorithm`, on `clock`.
fn leasing(redis: &RedisServer, algorithm: Algorithm, clock: &ManualClock) -> Limiter {
    super::leasing_on(
        support::redis_store(redis),
        algorithm,
        Clock::Manual(clock.clone()),
    )
}

/// Bursts of 50 requests at one instant, a millisecond apart: k grows to a tenth of the burst
/// and units stay held. Every decision.
async fn hold_units(limiter: &Limiter, quota: &Quota, clock: &ManualClock) -> Vec<Decision> {
    let mut decisions = Vec::new();
    for _ in 0..6 {
        let verdicts = futures::future::join_all((0..50).map(|_| limiter.check("hot", quota)));
        decisions.extend(verdicts.await.iter().filter_map(|v| v.decision().copied()));
        clock.advance(Duration::from_millis(1));
        // Real time for the background renewals to land.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let held = limiter.lease_stats().held;
    assert!(held >= 2, "no lease built up: {:?}", limiter.lease_stats());
    decisions
}

/// Requests one at a time at one instant, each given the real time for the background renewal
/// it may start to land, until two renewals have landed since the first of them and the lease
/// was spent from after them. Every decision.
async fn spend_across_renewals(limiter: &Limiter, quota: &Quota) -> Vec<Decision> {
    let before = limiter.lease_stats().renewals;
    let mut decisions = Vec::new();
    for _ in 0..1_000 {
        let verdict = limiter.check("hot", quota).await;
        decisions.push(*verdict.decision().expect("Redis answers"));
        tokio::time::sleep(Duration::from_millis(2)).await;
        if limiter.lease_stats().renewals >= before + 2 {
            decisions.push(*limiter.check("hot", quota).await.decision().unwrap());
            return decisions;
        }
    }
    panic!("no renewal: {:?}", limiter.lease_stats());
}

/// What went wrong, if any admission reported more `remaining` than the quota's burst.
fn above_burst(
    decisions: &[Decision],
    quota: &Quota,
    what: impl std::fmt::Display,
) -> Option<String> {
    let admitted: Vec<&Decision> = decisions.iter().filter(|d| d.allowed).collect();
    if admitted.is_empty() {
        return Some(format!("{what}: nothing admitted"));
    }
    let over: Vec<u64> = admitted
        .iter()
        .map(|d| d.remaining)
        .filter(|&r| r > quota.burst())
        .collect();
    let max = over.iter().max()?;
    Some(format!(
        "{what}: {} of {} admissions reported remaining above the burst {} (up to {max})",
        over.len(),
        admitted.len(),
        quota.burst()
    ))
}

/// The bucket refills to full within the lease's interval while the instance still holds units
/// of an earlier renewal: the next renewal finds Redis full and reports its remaining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_reports_no_more_than_the_burst_after_its_bucket_refilled() {
    let redis = RedisServer::start();
    // 100 a millisecond, 1 000 at once: what the bursts take is back within 10 ms.
    let quota = Quota::per_second(100_000)
        .unwrap()
        .with_burst(1_000)
        .unwrap();
    let mut failures = Vec::new();
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        redis.flushall();
        let clock = ManualClock::new(T0);
        let limiter = leasing(&redis, algorithm, &clock);
        let mut decisions = hold_units(&limiter, &quota, &clock).await;
        clock.advance(Duration::from_millis(12));
        decisions.extend(spend_across_renewals(&limiter, &quota).await);
        failures.extend(above_burst(&decisions, &quota, algorithm));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Redis loses the key (a restart without persistence, `FLUSHALL`) while the instance holds
/// units: the next renewal reports a fresh key's remaining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_reports_no_more_than_the_burst_after_redis_lost_the_key() {
    let redis = RedisServer::start();
    let quota = Quota::per_minute(1_000).unwrap();
    let mut failures = Vec::new();
    for algorithm in LEASING {
        redis.flushall();
        let clock = ManualClock::new(T0);
        let limiter = leasing(&redis, algorithm, &clock);
        let mut decisions = hold_units(&limiter, &quota, &clock).await;
        redis.flushall();
        decisions.extend(spend_across_renewals(&limiter, &quota).await);
        failures.extend(above_burst(&decisions, &quota, algorithm));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
