//! Probes (outside review) of leases under cancellation, data loss, slow Redis and controls,
//! on real Redis. Each asserts a promise of docs/leases.md with the figure in its message.

use crate::probes_review::{leasing_with, Rng};
use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::limiter::{LeaseStats, Leases};
use redlimit::{Algorithm, Limiter, Quota, Quotas, Verdict};
use support::{Ctx, RedisServer};

/// A fixed window of a day: no refill, so Redis's count is exact (the test runs far from
/// midnight UTC unless unlucky; the probes check the window did not turn).
fn daily() -> Quota {
    Quota::per_day(1_000_000).unwrap()
}

/// Units Redis counts consumed on `key` under `quota` (a peek: cost 0 is never leased).
async fn consumed(limiter: &Limiter, key: &str, quota: &Quota) -> u64 {
    let peek = limiter.try_check_quotas(key, &Quotas::from(quota), 0).await;
    quota.burst() - peek.expect("the store decides").remaining
}

/// Waits until `leased = spent + held + returned + stranded` (give-backs land in tasks) or 5 s.
async fn settled(limiter: &Limiter) -> LeaseStats {
    let started = Instant::now();
    loop {
        let s = limiter.lease_stats();
        if s.leased == s.spent + s.held + s.returned + s.stranded
            || started.elapsed() > Duration::from_secs(5)
        {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        crate::leases::assert_accounted(s);
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

/// `DEBUG SLEEP` past the store timeout under a hot key with many concurrent requests: every
/// request ends within the documented bound (three store calls of the timeout at most for one
/// that renews; the timeout from its wait for one that waited), never pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_debug_sleep_past_the_timeout_never_holds_a_request_past_its_bound() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let limiter = Limiter::builder(
        Ctx {
            timeout,
            ..Ctx::default()
        }
        .without_breaker()
        .redis_store(&redis),
    )
    .leases(Leases::new(Duration::from_millis(50)))
    .build()
    .unwrap();
    let quota = Quota::per_second(100_000).unwrap();
    // Warm up: k grows.
    for _ in 0..2_000 {
        limiter.check("hot", &quota).await;
    }
    let worst = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (limiter, worst, stop) = (limiter.clone(), worst.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let r = tokio::time::timeout(Duration::from_secs(10), limiter.check("hot", &quota))
                    .await;
                let took = started.elapsed().as_millis() as u64;
                worst.fetch_max(if r.is_err() { 10_000 } else { took }, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let sleeping = redis.debug_sleep(Duration::from_millis(1_500));
        tokio::task::spawn_blocking(move || sleeping.join().unwrap())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let worst = worst.load(Ordering::Relaxed);
    // 3 store calls × 300 ms, plus generous slack for the loaded machine.
    assert!(
        worst <= 2_000,
        "a request took {worst} ms with a {timeout:?} store timeout (bound 3 × timeout + slack)"
    );
    let s = settled(&limiter).await;
    crate::leases::assert_accounted(&s);
}
