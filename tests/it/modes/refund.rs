//! `Limiter::refund`: units given back in one atomic script, never above a tier's capacity.

use std::time::Duration;

use redlimit::clock::ManualClock;
use redlimit::{Algorithm, Limiter, Quota, Quotas};

use crate::support::{Ctx, RedisCluster, RedisServer};

const START: Duration = Duration::from_secs(1_700_000_000);

async fn remaining(limiter: &Limiter, key: &str, quotas: &Quotas) -> u64 {
    limiter
        .try_check_quotas(key, quotas, 0)
        .await
        .unwrap()
        .remaining
}

/// Whether `limiter` admits `cost` of `key` under `quotas` (a store error fails the test).
async fn allowed(limiter: &Limiter, key: &str, quotas: &Quotas, cost: u64) -> bool {
    let decision = limiter.try_check_quotas(key, quotas, cost).await;
    decision.unwrap().allowed
}

/// Reserve 4 of 5, give 3 back, then far too many: 4 left, then 5, never more.
async fn gives_back_up_to_capacity(limiter: &Limiter) {
    let quotas = Quotas::from(Quota::per_minute(5).unwrap());
    let key = "refund-me";
    assert!(allowed(limiter, key, &quotas, 4).await);
    assert_eq!(remaining(limiter, key, &quotas).await, 1);
    limiter.refund(key, &quotas, 3).await.unwrap();
    assert_eq!(
        remaining(limiter, key, &quotas).await,
        4,
        "{}",
        limiter.algorithm()
    );
    limiter.refund(key, &quotas, 1_000).await.unwrap();
    assert_eq!(
        remaining(limiter, key, &quotas).await,
        5,
        "{}",
        limiter.algorithm()
    );
    // Exactly capacity: five pass, the sixth is denied.
    for i in 0..5 {
        assert!(allowed(limiter, key, &quotas, 1).await, "#{i}");
    }
    assert!(!allowed(limiter, key, &quotas, 1).await);
    // A fresh key: nothing to give back, nothing stored.
    limiter.refund("fresh", &quotas, 2).await.unwrap();
    assert!(limiter.inspect("fresh").await.unwrap().tiers.is_empty());
    // Zero units: nothing at all.
    limiter.refund(key, &quotas, 0).await.unwrap();
}

/// Two tiers: both get the units back, each capped at its own capacity.
async fn every_tier_gets_units_back(limiter: &Limiter) {
    let quotas = Quotas::new([
        Quota::per_second(3).unwrap(),
        Quota::per_minute(10).unwrap(),
    ])
    .unwrap();
    let key = "tiers";
    assert!(allowed(limiter, key, &quotas, 3).await);
    limiter.refund(key, &quotas, 2).await.unwrap();
    // The per-second tier is back to 2 of 3, the per-minute one to 9 of 10.
    if limiter.algorithm() != Algorithm::SlidingLog {
        assert_eq!(limiter.inspect(key).await.unwrap().tiers.len(), 2);
    }
    assert!(allowed(limiter, key, &quotas, 2).await);
    assert!(!allowed(limiter, key, &quotas, 1).await);
}

#[tokio::test]
async fn refunds_on_redis_for_every_algorithm() {
    let redis = RedisServer::start();
    for &algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let ctx = Ctx::new(algorithm).manual(&clock);
        let limiter = Limiter::builder(ctx.redis_store(&redis))
            .algorithm(algorithm)
            .clock(ctx.clock.clone())
            .prefix(format!("r-{}", algorithm.name()))
            .build()
            .unwrap();
        gives_back_up_to_capacity(&limiter).await;
        every_tier_gets_units_back(&limiter).await;
    }
}

#[tokio::test]
async fn refunds_in_memory_for_every_algorithm() {
    for &algorithm in Algorithm::ALL {
        let clock = ManualClock::new(START);
        let limiter = Ctx::new(algorithm).manual(&clock).memory();
        gives_back_up_to_capacity(&limiter).await;
        every_tier_gets_units_back(&limiter).await;
    }
}

#[tokio::test]
async fn refunds_on_cluster() {
    let cluster = RedisCluster::start();
    for &algorithm in Algorithm::ALL {
        let limiter = Limiter::builder(Ctx::new(algorithm).cluster_store(&cluster))
            .algorithm(algorithm)
            .prefix(format!("c-{}", algorithm.name()))
            .build()
            .unwrap();
        gives_back_up_to_capacity(&limiter).await;
    }
}

/// An override in the store decides the capacity a refund stops at, as it decides checks.
#[tokio::test]
async fn a_refund_stops_at_the_override_capacity() {
    let redis = RedisServer::start();
    let memory = Ctx::default().memory();
    let on_redis = Ctx::default().redis(&redis);
    for limiter in [&on_redis, &memory] {
        let own = Quotas::from(Quota::per_minute(100).unwrap());
        let tight = Quotas::from(Quota::per_minute(3).unwrap());
        limiter.set_quota("o", &tight).await.unwrap();
        assert!(allowed(limiter, "o", &own, 2).await);
        limiter.refund("o", &own, 50).await.unwrap();
        let status = limiter.inspect("o").await.unwrap();
        assert_eq!(status.tiers[0].fields[0], ("tokens", 3.0));
    }
}

/// Redis's time, in µs.
fn redis_now(redis: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
    secs * 1_000_000 + micros
}

/// On Redis's clock a refund sends its reservation's age: a fixed window of 5 a second gets a
/// refund made in the reservation's window, and none made in the next window (which it would
/// empty). Each case is retried when Redis's clock crossed a window it must not cross.
#[tokio::test]
async fn on_redis_time_a_refund_reaches_only_its_reservations_window() {
    use redlimit::store::{RefundRequest, ReservedAt, StoreExt};
    use std::time::Instant;
    let redis = RedisServer::start();
    let period = 1_000_000;
    let quotas = Quotas::from(Quota::new(5, Duration::from_micros(period)).unwrap());
    let algorithm = Algorithm::FixedWindow;
    let store = Ctx::new(algorithm).redis_store(&redis);
    let limiter = Limiter::builder(store.clone())
        .algorithm(algorithm)
        .build()
        .unwrap();
    let reserve = |key: String| {
        let limiter = limiter.clone();
        async move {
            let sent = Instant::now();
            let decision = limiter.try_check_quotas(key.as_str(), &quotas, 5).await;
            assert!(decision.unwrap().allowed);
            sent
        }
    };
    let refund = |key: String, sent: Instant| {
        let (store, storage_key) = (store.clone(), limiter.storage_key(key.as_str()));
        async move {
            let request = RefundRequest {
                key: &storage_key,
                algorithm,
                quotas: &quotas,
                units: 5,
                reserved: ReservedAt::Ago(sent.elapsed().as_micros() as u64),
            };
            store.refund(request).await.unwrap()
        }
    };
    let mut same = None;
    for attempt in 0..5 {
        let key = format!("same-{attempt}");
        let before = redis_now(&redis);
        let sent = reserve(key.clone()).await;
        let given = refund(key.clone(), sent).await;
        if before / period == redis_now(&redis) / period {
            same = Some((given, remaining(&limiter, &key, &quotas).await));
            break;
        }
    }
    assert_eq!(
        same,
        Some((1, 5)),
        "a refund in its reservation's window lands"
    );
    let mut next = None;
    for attempt in 0..5 {
        let key = format!("next-{attempt}");
        let sent = reserve(key.clone()).await;
        let reserved_in = redis_now(&redis) / period; // the reservation's window, or later
        while redis_now(&redis) / period == reserved_in {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = redis_now(&redis);
        reserve(key.clone()).await; // the next window's own 5
        let given = refund(key.clone(), sent).await;
        let left = remaining(&limiter, &key, &quotas).await;
        if before / period == redis_now(&redis) / period {
            next = Some((given, left));
            break;
        }
    }
    assert_eq!(next, Some((0, 0)), "a refund never reaches the next window");
}

/// `StoreExt::check_timed` tells, for an admission on the store's own clock, the µs of that clock
/// at which the store decided: on Redis a lone call, calls batched together, a blocking check
/// and an override's admission; in memory the system clock. Denials and client clocks tell
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_timed_tells_when_the_store_admitted() {
    use redlimit::store::{Block, CheckRequest, MemoryStore, StoreExt};
    let redis = RedisServer::start();
    let algorithm = Algorithm::TokenBucket;
    let quotas = Quotas::from(Quota::per_hour(10).unwrap());
    let store = Ctx::new(algorithm).redis_store(&redis);
    let limiter = Ctx::new(algorithm).limiter(store.clone());
    let keys: Vec<String> = (0..64)
        .map(|i| limiter.storage_key(format!("timed-{i}").as_str()))
        .collect();
    let request = |key: &'static str, cost, now_micros| CheckRequest {
        key,
        algorithm,
        quotas: &quotas,
        cost,
        now_micros,
    };
    let leak = |key: &str| -> &'static str { Box::leak(key.to_owned().into_boxed_str()) };
    let within = |at: Option<u64>, from: u64, to: u64| {
        let at = at.expect("an admission on the store's clock tells its time");
        assert!((from..=to).contains(&at), "{from} <= {at} <= {to}");
    };
    let from = redis_now(&redis);
    // Several at once: the first alone, the rest batched behind it.
    let answers = futures::future::join_all(
        keys.iter()
            .map(|key| store.check_timed(request(leak(key), 1, None), None)),
    )
    .await;
    let to = redis_now(&redis);
    for answer in answers {
        let (decision, at) = answer.unwrap();
        assert!(decision.allowed);
        within(at, from, to);
    }
    let key = leak(&keys[0]);
    // A denial, and a client clock's admission: nothing to tell.
    let (denied, at) = store
        .check_timed(request(key, 100, None), None)
        .await
        .unwrap();
    assert!(!denied.allowed);
    assert_eq!(at, None);
    let (client, at) = (store.check_timed(request(key, 1, Some(from)), None))
        .await
        .unwrap();
    assert!(client.allowed);
    assert_eq!(at, None);
    // A blocking check's admission, and an override's.
    let block = Block {
        duration: Duration::from_secs(1),
        max: Duration::from_secs(1),
    };
    let from = redis_now(&redis);
    let (blocking, at) = (store.check_timed(request(key, 1, None), Some(block)))
        .await
        .unwrap();
    assert!(blocking.allowed);
    within(at, from, redis_now(&redis));
    limiter
        .set_quota("timed-1", &Quota::per_hour(20).unwrap().into())
        .await
        .unwrap();
    let from = redis_now(&redis);
    let (overridden, at) = (store.check_timed(request(leak(&keys[1]), 1, None), None))
        .await
        .unwrap();
    assert!(overridden.allowed && overridden.overridden);
    within(at, from, redis_now(&redis));
    // In memory: the system clock it decided with.
    let memory = MemoryStore::new();
    let now = || redlimit::clock::Clock::System.now_micros().unwrap();
    let from = now();
    let (admitted, at) = memory
        .check_timed(request(key, 1, None), None)
        .await
        .unwrap();
    assert!(admitted.allowed);
    within(at, from, now());
    let (_, at) = (memory.check_timed(request(key, 1, Some(from)), None))
        .await
        .unwrap();
    assert_eq!(at, None);
}
