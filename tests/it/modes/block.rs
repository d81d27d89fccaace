//! Block on abuse: a denial suspends the key's tenant fleet-wide in the same script call,
//! repeated offences double the block up to a cap; single node, Cluster and memory.

use std::time::Duration;

use redlimit::clock::ManualClock;
use redlimit::limiter::BlockFor;
use redlimit::{Limiter, Quota, Quotas, Target};

use crate::support::{self, Ctx, RedisCluster, RedisServer};

const START: Duration = Duration::from_secs(1_700_000_000);

/// 2 a second, block 10 s doubling up to 40 s: the third request is denied and blocks; every
/// route of the tenant is suspended; after the block the next offence blocks 20 s, then 40,
/// then 40 again. `store` names the limiter `on` builds, in failure messages.
async fn blocks_and_doubles(store: &str, on: impl FnOnce(Ctx) -> Limiter) {
    let clock = ManualClock::new(START);
    let limiter = on(Ctx::default().manual(&clock));
    let quotas = Quotas::from(Quota::per_second(2).unwrap());
    let block = BlockFor::new(Duration::from_secs(10))
        .unwrap()
        .doubling_up_to(Duration::from_secs(40))
        .unwrap();
    let other = Quotas::from(Quota::per_minute(100).unwrap());
    let mut now = START;
    for (offence, expected) in [(1, 10), (2, 20), (3, 40), (4, 40)] {
        for i in 0..2 {
            let verdict = limiter.check_blocking("abuser", &quotas, 1, &block).await;
            assert!(
                verdict.is_allowed(),
                "{store}: offence {offence}, request {i}"
            );
        }
        let denied = *limiter
            .check_blocking("abuser", &quotas, 1, &block)
            .await
            .decision()
            .unwrap();
        assert!(!denied.allowed && !denied.suspended, "{store}: {denied:?}");
        assert_eq!(
            denied.retry_after,
            Duration::from_secs(expected),
            "{store}: offence {offence}"
        );
        // Fleet-wide, every route: a check on another scope is suspended too.
        let elsewhere = *limiter
            .check_quotas(redlimit::Target::scoped("search", "abuser"), &other, 1)
            .await
            .decision()
            .unwrap();
        assert!(elsewhere.suspended, "{store}: offence {offence}");
        let status = limiter.inspect("abuser").await.unwrap();
        let blocked_for = Some(Duration::from_secs(expected));
        assert_eq!(
            status.suspended_for, blocked_for,
            "{store}: offence {offence}"
        );
        // Another tenant is untouched.
        assert!(limiter
            .check_quotas("bystander", &quotas, 1)
            .await
            .is_allowed());
        // One ms before the end: still blocked; at the end: free again.
        now += Duration::from_secs(expected) - Duration::from_millis(1);
        clock.set(now);
        assert!(
            limiter
                .check_quotas("abuser", &other, 0)
                .await
                .decision()
                .unwrap()
                .suspended
        );
        now += Duration::from_millis(1);
        clock.set(now);
    }
    // Without doubling: the same block every time, and an operator's resume ends it.
    let flat = BlockFor::new(Duration::from_secs(5)).unwrap();
    for _ in 0..2 {
        limiter.check_blocking("flat", &quotas, 1, &flat).await;
    }
    let denied = *limiter
        .check_blocking("flat", &quotas, 1, &flat)
        .await
        .decision()
        .unwrap();
    assert_eq!(denied.retry_after, Duration::from_secs(5));
    limiter.resume(Target::key("flat")).await.unwrap();
    assert!(support::suspended_for(&limiter, "flat").await.is_none());
}

/// On a single node, in memory and on a Cluster alike.
#[tokio::test]
async fn a_denial_blocks_the_tenant_on_every_store() {
    let (redis, cluster) = (RedisServer::start(), RedisCluster::start());
    blocks_and_doubles("redis", |ctx| ctx.redis(&redis)).await;
    blocks_and_doubles("memory", |ctx| ctx.memory()).await;
    blocks_and_doubles("cluster", |ctx| ctx.cluster(&cluster)).await;
}

/// Redis and the memory store write the same bytes: the tenant's controls and the offences.
#[tokio::test]
async fn redis_and_memory_block_byte_for_byte() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(START);
    let memory = redlimit::store::MemoryStore::new();
    let on_redis = Ctx::default().manual(&clock).redis(&redis);
    let in_memory = Ctx::default().manual(&clock).limiter(memory.clone());
    let quotas = Quotas::from(Quota::per_second(1).unwrap());
    let block = BlockFor::new(Duration::from_millis(1_500))
        .unwrap()
        .doubling_up_to(Duration::from_secs(7))
        .unwrap();
    let mut conn = redis.conn();
    for round in 0..3 {
        for limiter in [&on_redis, &in_memory] {
            assert!(limiter
                .check_blocking("k", &quotas, 1, &block)
                .await
                .is_allowed());
            let denied = limiter.check_blocking("k", &quotas, 1, &block).await;
            assert!(!denied.is_allowed());
        }
        let now = clock.now_micros();
        for suffix in ["#t", "#b"] {
            let key = format!("redlimit:{{k}}{suffix}");
            let stored: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
            assert_eq!(
                stored,
                memory.stored_state(&key, now),
                "round {round}: {key}"
            );
        }
        // Past the block (1.5, 3, 6 s), within the offences' memory (the block plus 7 s), on
        // the simulated clock of both (Redis expires on its own, later).
        clock.advance(Duration::from_secs(8));
    }
}

/// The layer's `block_for`: the denial's Retry-After is the block, and the tenant's other
/// routes (another layer, on another instance) are blocked too.
#[tokio::test]
async fn a_layer_blocks_the_tenant_on_every_route() {
    use bytes::Bytes;
    use http::{Request, StatusCode};
    use http_body_util::Full;
    use redlimit::key::GlobalKey;
    use redlimit::RateLimitLayer;
    use tower::{Layer, ServiceExt};

    let redis = RedisServer::start();
    // The tenant's route `name` under `quota`, on an instance of its own.
    let route = |name, quota| {
        let instance = Ctx::default().redis(&redis);
        RateLimitLayer::builder(instance, quota, GlobalKey::new("mallory")).policy_name(name)
    };
    let login = route("login", Quota::per_minute(2).unwrap())
        .block_for(Duration::from_secs(120))
        .build()
        .unwrap();
    let search = route("search", Quota::per_second(100).unwrap())
        .build()
        .unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let login = login.layer(crate::support::service::counting(calls.clone()));
    let search = search.layer(crate::support::service::counting(calls.clone()));
    let request = || Request::new(Full::new(Bytes::new()));
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let response = login.clone().oneshot(request()).await.unwrap();
        statuses.push(response.status());
        last = Some(response);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(last.unwrap().headers()["retry-after"], "120");
    let elsewhere = search.clone().oneshot(request()).await.unwrap();
    assert_eq!(elsewhere.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry = crate::support::service::retry_after_secs(&elsewhere);
    assert!((118..=120).contains(&retry), "{retry}");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}
