//! A request dropped while it renews its key's lease (a client that disconnects, a timeout, a
//! `select!`) on real Redis: the later requests on its key still finish within the store
//! timeout, directly on `Limiter::check` and through `RateLimitLayer`.

use crate::support;

use std::time::Duration;

use redlimit::limiter::Leases;
use redlimit::{Limiter, Quota};
use support::{Ctx, RedisServer};

/// The store timeout of these tests: generous, the machine is loaded.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a later request may take: the store timeout, and as much again for the load.
const BOUND: Duration = Duration::from_secs(2);

/// How long Redis is held with `DEBUG SLEEP` so that a renewal is in flight when it is dropped.
const HELD: Duration = Duration::from_millis(400);

/// A slow key: every request is a renewal of one unit (k = 1), and the quota refills too
/// slowly to blur a count of units.
fn slow() -> Quota {
    Quota::per_day(1_000).unwrap()
}

/// The units Redis holds consumed on `key`, once they equal `expected` or after 5 s (a unit
/// that goes back to Redis does so in the background).
async fn consumed(limiter: &Limiter, key: &str, expected: u64) -> u64 {
    let started = std::time::Instant::now();
    loop {
        let peek = limiter.check_quotas(key, &slow().into(), 0).await;
        let consumed = 1_000 - peek.decision().unwrap().remaining;
        if consumed == expected || started.elapsed() > Duration::from_secs(5) {
            return consumed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn leasing(redis: &RedisServer) -> Limiter {
    let ctx = Ctx {
        timeout: STORE_TIMEOUT,
        ..Ctx::default()
    };
    Limiter::builder(ctx.redis_store(redis))
        .leases(Leases::new(Duration::from_millis(50)))
        .build()
        .unwrap()
}

/// Where the first request on a key is dropped.
#[derive(Debug, Clone, Copy)]
enum DropPoint {
    /// Polled once (the renewal marked, its call sent), then dropped.
    FirstPoll,
    /// Dropped while Redis holds its call (`DEBUG SLEEP`).
    InFlight,
    /// Run to its end, then dropped (nothing to hand on).
    AfterAnswer,
}

/// Starts a request on `key` and drops it at `point`.
async fn drop_a_request(redis: &RedisServer, limiter: &Limiter, key: &str, point: DropPoint) {
    let quota = slow();
    match point {
        DropPoint::FirstPoll => {
            let dropped = tokio::time::timeout(Duration::ZERO, limiter.check(key, &quota)).await;
            assert!(dropped.is_err(), "a store call is not answered in one poll");
        }
        DropPoint::InFlight => {
            let sleeping = redis.debug_sleep(HELD);
            let dropped =
                tokio::time::timeout(Duration::from_millis(50), limiter.check(key, &quota)).await;
            assert!(dropped.is_err(), "Redis sleeps: the renewal is in flight");
            RedisServer::awake(sleeping).await;
        }
        DropPoint::AfterAnswer => {
            assert!(limiter.check(key, &quota).await.is_allowed());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_during_its_renewal_never_hangs_the_later_requests_on_its_key() {
    let redis = RedisServer::start();
    let limiter = leasing(&redis);
    let quota = slow();
    let mut hung = Vec::new();
    for point in [
        DropPoint::FirstPoll,
        DropPoint::InFlight,
        DropPoint::AfterAnswer,
    ] {
        let key = format!("hot-{point:?}");
        drop_a_request(&redis, &limiter, &key, point).await;
        let mut pending = 0;
        for _ in 0..5 {
            match tokio::time::timeout(BOUND, limiter.check(&key, &quota)).await {
                Ok(verdict) => assert!(verdict.is_allowed(), "{point:?}: {verdict:?}"),
                Err(_) => pending += 1,
            }
        }
        hung.push((point, pending));
        // What the dropped request's renewal took was spent by a later request or went back:
        // Redis counts exactly the admitted requests.
        let admitted = 5 - pending + u64::from(matches!(point, DropPoint::AfterAnswer));
        assert_eq!(
            consumed(&limiter, &key, admitted).await,
            admitted,
            "{point:?}"
        );
    }
    assert!(
        hung.iter().all(|&(_, pending)| pending == 0),
        "later requests of 5 still pending after {BOUND:?}: {hung:?}"
    );
    // Each dropped renewal was finished by the store call it had sent: nothing leased is lost.
    let stats = limiter.lease_stats();
    super::basics::assert_accounted(&stats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_future_dropped_by_a_timeout_never_hangs_the_later_requests_through_the_layer() {
    use http_body_util::Full;
    use redlimit::key::GlobalKey;
    use redlimit::RateLimitLayer;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use support::service::counting;
    use tower::{Layer, ServiceExt};

    let redis = RedisServer::start();
    let limiter = leasing(&redis);
    let layer = RateLimitLayer::builder(limiter.clone(), slow(), GlobalKey::new("g"))
        .build()
        .unwrap();
    let service = layer.layer(counting(Arc::new(AtomicUsize::new(0))));
    let request = || http::Request::new(Full::default());

    let sleeping = redis.debug_sleep(HELD);
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        service.clone().oneshot(request()),
    )
    .await;
    assert!(dropped.is_err(), "Redis sleeps: the renewal is in flight");
    RedisServer::awake(sleeping).await;

    let mut hung = 0;
    for _ in 0..5 {
        match tokio::time::timeout(BOUND, service.clone().oneshot(request())).await {
            Ok(response) => assert_eq!(response.unwrap().status(), http::StatusCode::OK),
            Err(_) => hung += 1,
        }
    }
    assert_eq!(
        hung, 0,
        "{hung} of 5 later requests still pending after {BOUND:?}"
    );
}

/// A request waits for another's renewal, its key's lease ends meanwhile (`forget`), and the
/// request is dropped while the store call it then makes is in flight: whatever that call took
/// stays with the key's lease (held, then spent or given back), so Redis counts exactly the
/// admitted requests, and the counters balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_after_its_lease_ended_while_it_waited_loses_no_unit() {
    let redis = RedisServer::start();
    let limiter = leasing(&redis);
    let (key, quota) = ("hot", slow());
    // The connection is up and the script loaded: the calls below reach Redis at once.
    assert!(limiter.check("warm", &quota).await.is_allowed());
    let sleeping = redis.debug_sleep(HELD);
    // The first request's renewal waits for Redis; the second waits for that renewal.
    let first = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check(key, &quota).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check(key, &quota).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!second.is_finished(), "it waits for the renewal in flight");
    // The lease ends: the waiter wakes and makes its own store call, which Redis holds too.
    limiter.forget(key);
    tokio::time::sleep(Duration::from_millis(50)).await;
    second.abort();
    assert!(
        second.await.is_err_and(|e| e.is_cancelled()),
        "dropped while Redis sleeps"
    );
    RedisServer::awake(sleeping).await;
    assert!(first.await.unwrap().is_allowed());
    // Ends the leases (their units go back) and lets every give-back land.
    limiter.release_leases().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    limiter.release_leases().await;
    let stats = limiter.lease_stats();
    let admitted = 1;
    assert_eq!(
        consumed(&limiter, key, admitted + stats.stranded).await,
        admitted + stats.stranded,
        "Redis counts more units consumed than the {admitted} admitted and {} stranded: {stats:?}",
        stats.stranded
    );
    super::basics::assert_accounted(&stats);
}
