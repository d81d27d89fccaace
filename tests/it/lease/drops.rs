//! Requests, settlements and renewals of a leased key dropped at every await or at random
//! points: no request waits on work nobody finishes, no unit is lost, and the counters balance.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use redlimit::{Algorithm, Limiter, Quota, Quotas, Verdict};
use tower::ServiceExt;

use super::settle::{call, lease_held_behind_a_gate, store_left, target};
use super::settle_every_algorithm::leases_ended;
use super::{
    balanced, consumed, leasing, leasing_and_observer, leasing_with, settled, CAPACITY, LEASING,
};
use crate::modes::settle::until_entered;
use crate::support::{self, Ctx, RedisServer, Rng};

/// Requests answered from a lease, each failing with a 503 (refunded in full), are dropped at
/// each point of their life: while the service runs (no settlement: the unit stays spent), and
/// at random just as the service answers, with `flush_settlements` racing the drop. Every
/// `flush_settlements` returns, and the key's units balance: what it has left is its capacity
/// less what the leases took, plus what came back (give-backs, and one refund at most per
/// request, at least one per request whose 503 reached its caller).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_answered_settlements_dropped_at_every_await_balance_and_never_hang() {
    let redis = RedisServer::start();
    for algorithm in LEASING {
        let (limiter, other, svc, gate, entered) =
            lease_held_behind_a_gate(&redis, algorithm).await;
        let (mut refunded_at_least, mut requests) = (0u64, 0u64);
        for round in 0..60u64 {
            let n = entered.load(Ordering::SeqCst);
            let task = {
                let svc = svc.clone();
                tokio::spawn(async move { svc.oneshot(call(503, true)).await.unwrap().status() })
            };
            requests += 1;
            until_entered(&entered, n + 1).await;
            match round % 3 {
                // Dropped while the service runs: no cost learnt, the unit stays spent.
                0 => {
                    task.abort();
                    let _ = task.await;
                    gate.add_permits(1);
                }
                // The service answers as the request is dropped.
                1 => {
                    gate.add_permits(1);
                    task.abort();
                    if let Ok(status) = task.await {
                        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                        refunded_at_least += 1;
                    }
                }
                // Answered; a flush races the settlement's start.
                _ => {
                    gate.add_permits(1);
                    let flush = {
                        let limiter = limiter.clone();
                        tokio::spawn(async move { limiter.flush_settlements().await })
                    };
                    let status = task.await.unwrap();
                    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                    refunded_at_least += 1;
                    tokio::time::timeout(Duration::from_secs(2), flush)
                        .await
                        .expect("flush_settlements hung")
                        .unwrap();
                }
            }
        }
        let flushed = tokio::time::timeout(Duration::from_secs(2), limiter.flush_settlements());
        flushed.await.expect("flush_settlements hung");
        leases_ended_or_release(&limiter).await;
        let stats = limiter.lease_stats();
        let settle_failures = limiter.stats().settle_failures;
        let quotas = Quotas::from(Quota::per_day(CAPACITY).unwrap());
        let left = store_left(&other, &quotas).await;
        let back = (left + stats.leased)
            .checked_sub(CAPACITY + stats.returned)
            .unwrap_or_else(|| {
                panic!("{algorithm}: more spent than leased: left {left}, {stats:?}")
            });
        assert!(
            back >= refunded_at_least && back <= requests,
            "{algorithm}: {back} refunds landed, {refunded_at_least} to {requests} expected; \
             left {left}, {stats:?}, settle failures {settle_failures}"
        );
        assert_eq!(
            stats.leased,
            stats.spent + stats.held + stats.returned + stats.stranded,
            "{algorithm}"
        );
    }
}

/// Ends the lease (a give-back) and waits for it.
async fn leases_ended_or_release(limiter: &Limiter) {
    limiter.release_leases().await;
    leases_ended(limiter).await;
}

/// A renewal dropped mid-flight (its request under a `timeout` shorter than a Redis asleep for
/// 150 ms) while 20 other requests wait on it: every waiter is answered within the store's
/// timeout plus a margin, nothing hangs, and the counters balance once Redis wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_dropped_mid_flight_with_waiters_leaves_none_waiting() {
    let redis = RedisServer::start();
    let quota = Quota::per_day(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    let ctx = Ctx::new(Algorithm::FixedWindow).timeout(Duration::from_millis(100));
    let limiter = leasing(ctx.redis_store(&redis), Algorithm::FixedWindow);
    // A hot key whose lease runs dry: the next request renews.
    for _ in 0..300 {
        assert!(limiter
            .check_quotas(target(), &quotas, 1)
            .await
            .is_allowed());
    }
    tokio::time::sleep(Duration::from_millis(60)).await; // the lease's interval ends
    let sleeper = redis.debug_sleep(Duration::from_millis(150));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let dropped = {
        let limiter = limiter.clone();
        tokio::time::timeout(Duration::from_millis(5), async move {
            limiter.check_quotas(target(), &quotas, 1).await
        })
    };
    assert!(
        dropped.await.is_err(),
        "the renewal was answered while Redis slept"
    );
    let started = Instant::now();
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check_quotas(target(), &quotas, 1).await })
        })
        .collect();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("a waiter hung on a dropped renewal")
            .unwrap();
    }
    let waited = started.elapsed();
    sleeper.join().unwrap();
    assert!(
        waited < Duration::from_millis(1_000),
        "waiters answered after {waited:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    limiter.release_leases().await;
    let stats = limiter.lease_stats();
    assert_eq!(
        stats.leased,
        stats.spent + stats.held + stats.returned + stats.stranded,
        "{stats:?}"
    );
    // Nothing was admitted that Redis did not charge.
    let left = store_left(&limiter, &quotas).await;
    assert!(
        left + stats.spent + stats.stranded <= CAPACITY + stats.returned,
        "left {left}: more admitted than charged; {stats:?}"
    );
}

/// A fixed window of a day: no refill, so Redis's count is exact (the test runs far from
/// midnight UTC unless unlucky; the tests check the window did not turn).
fn daily() -> Quota {
    Quota::per_day(1_000_000).unwrap()
}

/// Many concurrent requests on one hot key, on two instances, each dropped at a random point
/// (a zero timeout = first poll, a short one = in flight, or run to the end), with `forget`
/// and `release_leases` now and then: afterwards every admission was paid in Redis and every
/// unit Redis consumed was admitted or counted stranded; the counters balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_hot_key_random_drops_redis_count_equals_admissions_and_counters_balance() {
    let redis = RedisServer::start();
    let instances = [
        leasing_with(&redis, Algorithm::FixedWindow, Duration::from_secs(5)),
        leasing_with(&redis, Algorithm::FixedWindow, Duration::from_secs(5)),
    ];
    let quota = daily();
    let admitted = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..24u64 {
        let limiter = instances[(t % 2) as usize].clone();
        let (admitted, dropped) = (admitted.clone(), dropped.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
            for i in 0..300u64 {
                let r = rng.next() % 100;
                let check = limiter.check("hot", &quota);
                let outcome = match r {
                    0..=9 => tokio::time::timeout(Duration::ZERO, check).await.ok(),
                    10..=19 => {
                        let us = rng.next() % 2_000;
                        tokio::time::timeout(Duration::from_micros(us), check)
                            .await
                            .ok()
                    }
                    _ => Some(check.await),
                };
                match outcome {
                    Some(verdict) => {
                        assert!(
                            matches!(verdict, Verdict::Decided(_)),
                            "the store was up: {verdict:?}"
                        );
                        if verdict.is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    None => {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if t == 0 && i % 50 == 25 {
                    limiter.forget("hot");
                }
                if t == 1 && i % 70 == 35 {
                    limiter.release_leases().await;
                }
                if i % 10 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // A renewal handed on by a dropped request may land after a release: its units are then
    // held again (docs/leases.md: "keeps the dropped request's units held"), so release until
    // nothing is held (or 5 s).
    let started = Instant::now();
    for limiter in &instances {
        limiter.release_leases().await;
        while limiter.lease_stats().held > 0 && started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            limiter.release_leases().await;
        }
    }
    let stats = [settled(&instances[0]).await, settled(&instances[1]).await];
    for s in &stats {
        super::basics::assert_accounted(s);
        assert_eq!(s.held, 0, "held after release_leases: {s:?}");
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let spent: u64 = stats.iter().map(|s| s.spent).sum();
    let stranded: u64 = stats.iter().map(|s| s.stranded).sum();
    let in_redis = consumed(&instances[0], "hot", &quota).await;
    // Admissions beyond `spent` are direct checks (a lease ended while a request waited):
    // paid in Redis, never from a lease, so only `spent <= admitted` holds.
    assert!(
        spent <= admitted,
        "spent {spent} > {admitted} admissions seen: {stats:?}"
    );
    assert_eq!(
        in_redis,
        admitted + stranded,
        "Redis counts {in_redis} consumed for {admitted} admissions + {stranded} stranded \
         (dropped {}): {stats:?}",
        dropped.load(Ordering::Relaxed)
    );
}

/// Cancellation through the layer: `oneshot` futures under random tiny timeouts on a leased
/// hot key (fixed window, a day), with `forget` and `release_leases` now and then and short
/// `DEBUG SLEEP`s so renewals are in flight when dropped. Afterwards no later request hangs,
/// the counters balance, and Redis counts exactly the units spent plus those stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_layer_requests_dropped_at_random_points_lose_no_unit_and_never_hang() {
    use http_body_util::Full;
    use redlimit::key::GlobalKey;
    use redlimit::RateLimitLayer;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use support::service::counting;
    use tower::{Layer, ServiceExt};

    let redis = RedisServer::start();
    let (limiter, observer) = leasing_and_observer(&redis, Duration::from_secs(2));
    let quota = Quota::per_day(1_000_000).unwrap();
    let layer = RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("g"))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let service = layer.layer(counting(calls.clone()));
    let request = || http::Request::new(Full::default());
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (service, limiter) = (service.clone(), limiter.clone());
        let scope = layer.scope().to_owned();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678_9ABC_DEF1 ^ (t + 1));
            let mut statuses = 0u64;
            for i in 0..250u64 {
                let us = rng.next() % 800;
                let call = service.clone().oneshot(request());
                if rng.next().is_multiple_of(3) {
                    let _ = tokio::time::timeout(Duration::from_micros(us), call).await;
                } else {
                    let Ok(r) = call.await;
                    statuses += u64::from(r.status() == http::StatusCode::OK);
                }
                if t == 0 && i % 40 == 20 {
                    limiter.forget(redlimit::Target::scoped(&scope, "g"));
                }
                if t == 1 && i % 60 == 30 {
                    limiter.release_leases().await;
                }
            }
            statuses
        }));
    }
    let sleeper = tokio::spawn({
        let port = redis.port();
        async move {
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(60)).await;
                let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let _: Result<(), _> = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.03")
                    .query_async(&mut conn)
                    .await;
            }
        }
    });
    for task in tasks {
        task.await.unwrap();
    }
    sleeper.await.unwrap();
    let mut hung = 0;
    for _ in 0..20 {
        if tokio::time::timeout(Duration::from_secs(3), service.clone().oneshot(request()))
            .await
            .is_err()
        {
            hung += 1;
        }
    }
    assert_eq!(hung, 0, "{hung} of 20 later requests pending after 3 s");
    limiter.release_leases().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    limiter.release_leases().await;
    let stats = settled(&limiter).await;
    assert!(balanced(&stats), "{stats:?}");
    let scope = layer.scope().to_owned();
    let consumed = consumed(&observer, redlimit::Target::scoped(&scope, "g"), &quota).await;
    let served = calls.load(Ordering::SeqCst) as u64;
    eprintln!("served {served}, consumed {consumed}; {stats:?}");
    assert_eq!(
        consumed,
        stats.spent + stats.stranded + stats.held,
        "Redis consumed {consumed}, spent {} + stranded {} + held {} (served {served}); {stats:?}",
        stats.spent,
        stats.stranded,
        stats.held
    );
    assert!(
        served <= stats.spent,
        "served {served} > spent {}",
        stats.spent
    );
}

/// A waiter dropped under a control (note: a control ends the leases after its store call
/// returns, so the waiter here is still waiting when dropped; a lease that ends first is covered
/// by `lease::cancel`): a request waits for another's renewal while Redis
/// sleeps, this limiter resets the tenant (ending the lease: the waiter starts again on a new
/// lease), and the waiter is dropped while its renewal is in flight. Afterwards nothing hangs,
/// the counters balance, and Redis counts after the reset only what was spent after it or
/// stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_a_waiter_dropped_after_a_reset_ended_its_lease_loses_no_unit() {
    let redis = RedisServer::start();
    let (limiter, observer) = leasing_and_observer(&redis, Duration::from_secs(1));
    let quota = Quota::per_day(1_000).unwrap();
    assert!(limiter.check("warm", &quota).await.is_allowed());
    let sleeping = redis.debug_sleep(Duration::from_millis(400));
    let first = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check("hot", &quota).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check("hot", &quota).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reset = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.reset("hot").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    second.abort();
    let _ = second.await;
    RedisServer::awake(sleeping).await;
    let first = tokio::time::timeout(Duration::from_secs(3), first)
        .await
        .expect("the first request hung")
        .unwrap();
    reset.await.unwrap().unwrap();
    let later = tokio::time::timeout(Duration::from_secs(3), limiter.check("hot", &quota))
        .await
        .expect("a later request hung");
    assert!(later.is_allowed());
    limiter.release_leases().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    limiter.release_leases().await;
    let stats = settled(&limiter).await;
    let consumed = consumed(&observer, "hot", &quota).await;
    eprintln!(
        "reset while waiting: first {first:?}; consumed after the reset {consumed}; {stats:?}"
    );
    assert!(balanced(&stats), "{stats:?}");
    // After the reset: the later request (1), plus at most what is counted stranded.
    assert!(
        consumed <= 1 + stats.stranded && consumed >= 1,
        "Redis counts {consumed} consumed after the reset; 1 admitted after it, {} stranded; {stats:?}",
        stats.stranded
    );
}
