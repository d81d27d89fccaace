//! Redis failures on a real server: killed, restarted, scripts flushed, hung (`DEBUG SLEEP`),
//! down before the store exists. Every store runs with the default 100 ms timeout.
//!
//! The latency bounds are "the timeout plus a generous margin" (1 s), never a performance goal.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use redlimit::key::GlobalKey;
use redlimit::store::RedisStore;
use redlimit::{
    clock::{Clock, ManualClock},
    limiter::LimiterStats,
    Limiter, Quota, RateLimitLayer,
};
use redlimit::{
    failure_policy::{FailClosed, FailOpen, FailurePolicy, LocalFallback},
    Verdict,
};
use support::service::counting;
use support::RedisServer;
use tower::{Layer, ServiceExt};

/// The store's default timeout (100 ms), which the tests rely on.
const TIMEOUT: Duration = redlimit::store::DEFAULT_TIMEOUT;
/// What a request may take when Redis is away: the timeout plus a generous margin.
const BOUND: Duration = Duration::from_secs(1);
/// How long recovery after a restart may take before the test fails.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);

fn store(url: &str) -> RedisStore {
    let store = RedisStore::new(url).unwrap();
    assert_eq!(store.timeout(), Duration::from_millis(100));
    store
}

fn limiter(url: &str, policy: impl FailurePolicy) -> Limiter {
    Limiter::builder(store(url))
        .failure_policy(policy)
        .build()
        .unwrap()
}

fn get(grpc: bool) -> Request<Full<Bytes>> {
    let mut request = Request::get("/");
    if grpc {
        request = request.header("content-type", "application/grpc");
    }
    request.body(Full::default()).unwrap()
}

/// Latencies of a series of requests.
#[derive(Default)]
struct Latencies(Vec<Duration>);

impl Latencies {
    fn worst(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
    fn mean(&self) -> Duration {
        self.0.iter().sum::<Duration>() / self.0.len().max(1) as u32
    }
}

/// Redis killed with SIGKILL: fail-open admits (without rate-limit headers, since nothing was
/// decided), fail-closed answers 503 + Retry-After (gRPC: UNAVAILABLE), and no request waits
/// longer than the timeout plus a margin.
#[tokio::test]
async fn killed_redis_fail_open_admits_fail_closed_503_within_the_timeout() {
    let mut redis = RedisServer::start();
    let quota = Quota::per_minute(1_000).unwrap();
    let open = limiter(&redis.url(), FailOpen);
    let closed = limiter(&redis.url(), FailClosed::default());
    let open_calls = Arc::new(AtomicUsize::new(0));
    let closed_calls = Arc::new(AtomicUsize::new(0));
    let open_svc = RateLimitLayer::new(open.clone(), quota, GlobalKey::new("k"))
        .layer(counting(open_calls.clone()));
    let closed_svc = RateLimitLayer::new(closed.clone(), quota, GlobalKey::new("k"))
        .layer(counting(closed_calls.clone()));

    // Connected and deciding.
    for svc in [&open_svc, &closed_svc] {
        let response = svc.clone().oneshot(get(false)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().contains_key("ratelimit"));
    }

    redis.stop();

    let mut open_latency = Latencies::default();
    for _ in 0..50 {
        let started = Instant::now();
        let response = open_svc.clone().oneshot(get(false)).await.unwrap();
        open_latency.0.push(started.elapsed());
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!response.headers().contains_key("ratelimit"));
    }
    let mut closed_latency = Latencies::default();
    for i in 0..50 {
        let grpc = i % 10 == 9;
        let started = Instant::now();
        let response = closed_svc.clone().oneshot(get(grpc)).await.unwrap();
        closed_latency.0.push(started.elapsed());
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap());
        assert_eq!(retry_after, Some("1"));
        if grpc {
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["grpc-status"], "14");
        } else {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    println!(
        "redis killed: fail-open worst {:?} (mean {:?}), fail-closed worst {:?} (mean {:?}) over 50 requests each",
        open_latency.worst(),
        open_latency.mean(),
        closed_latency.worst(),
        closed_latency.mean()
    );
    assert!(open_latency.worst() < BOUND, "{:?}", open_latency.worst());
    assert!(
        closed_latency.worst() < BOUND,
        "{:?}",
        closed_latency.worst()
    );
    assert_eq!(open_calls.load(Ordering::SeqCst), 51);
    assert_eq!(
        closed_calls.load(Ordering::SeqCst),
        1,
        "503s reached the service"
    );
    let stats = open.stats();
    assert_eq!(
        (stats.allowed, stats.store_errors, stats.failed_open),
        (1, 50, 50)
    );
    let stats = closed.stats();
    assert_eq!(
        (stats.allowed, stats.store_errors, stats.failed_closed),
        (1, 50, 50)
    );
}

/// Checks `key` until `done` says so or `RECOVERY_BOUND` passes; returns the verdicts with the
/// time each was seen (since `since`).
async fn check_until(
    limiter: &Limiter,
    key: &str,
    quota: &Quota,
    since: Instant,
    mut done: impl FnMut(&Verdict) -> bool,
) -> Vec<(Duration, Verdict)> {
    let mut seen = Vec::new();
    loop {
        let verdict = limiter.check(key, quota).await;
        seen.push((since.elapsed(), verdict));
        if done(&verdict) {
            return seen;
        }
        assert!(
            since.elapsed() < RECOVERY_BOUND,
            "not recovered after {RECOVERY_BOUND:?}; last verdicts: {:?}",
            &seen[seen.len().saturating_sub(3)..]
        );
        if verdict.decision().is_none() {
            // Redis still away: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Redis killed and started again (empty): the same limiter, never rebuilt, enforces again.
#[tokio::test]
async fn restarted_redis_enforces_again_without_restarting_the_app() {
    let mut redis = RedisServer::start();
    let limiter = limiter(&redis.url(), FailOpen);
    let quota = Quota::per_hour(3).unwrap();
    assert!(limiter.check("k", &quota).await.decision().is_some());

    redis.stop();
    // Enough failures to open the circuit breaker: recovery goes through its probe.
    for _ in 0..20 {
        assert_eq!(limiter.check("k", &quota).await, Verdict::FailedOpen);
    }

    redis.restart();
    let restarted = Instant::now();
    let seen = check_until(&limiter, "k", &quota, restarted, |v| !v.is_allowed()).await;
    let first_decision = seen
        .iter()
        .find(|(_, v)| v.decision().is_some())
        .map(|(t, _)| *t)
        .unwrap();
    let (denied_at, denial) = seen.last().unwrap();
    println!(
        "redis restarted: first decision after {first_decision:?}, first denial after {denied_at:?} ({} checks)",
        seen.len()
    );
    // The restarted Redis is empty: three fresh tokens, then the denial.
    let decided: Vec<_> = seen.iter().filter_map(|(_, v)| v.decision()).collect();
    assert_eq!(decided.len(), 4, "{seen:?}");
    assert_eq!(
        decided.iter().map(|d| d.remaining).collect::<Vec<_>>(),
        [2, 1, 0, 0]
    );
    let denial = denial.decision().unwrap();
    assert!(!denial.allowed && denial.retry_after > Duration::ZERO);
}

/// `SCRIPT FLUSH`: the next call reloads the script by itself; no error reaches the policy and
/// the key's state is intact.
#[tokio::test]
async fn script_flush_next_call_succeeds() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let limiter = Limiter::builder(store(&redis.url()))
        .clock(Clock::Manual(clock))
        .build()
        .unwrap();
    let quota = Quota::per_minute(10).unwrap();

    assert_eq!(
        limiter
            .try_check_quotas("k", &quota.into(), 1)
            .await
            .unwrap()
            .remaining,
        9
    );
    let loads = redis.command_calls("script|load");
    redis.script_flush();

    let after = limiter
        .try_check_quotas("k", &quota.into(), 1)
        .await
        .expect("the call after SCRIPT FLUSH must succeed");
    assert!(after.allowed);
    assert_eq!(after.remaining, 8, "state survived, script reloaded");
    assert_eq!(
        redis.command_calls("script|load"),
        loads + 1,
        "the script was reloaded once"
    );
    // The same through the failure-policy path.
    redis.script_flush();
    let verdict = limiter.check("k", &quota).await;
    assert_eq!(verdict.decision().map(|d| d.remaining), Some(7));
    assert_eq!(limiter.stats().store_errors, 0);
    assert_eq!(limiter.stats().allowed, 3);
}

/// A hung Redis (`DEBUG SLEEP 1`): calls give up after the timeout and the policy answers, well
/// before Redis wakes; afterwards the same limiters decide again.
#[tokio::test]
async fn hung_redis_calls_return_within_the_timeout_with_the_policy_outcome() {
    let redis = RedisServer::start();
    let quota = Quota::per_minute(100).unwrap();
    let open = limiter(&redis.url(), FailOpen);
    let closed = limiter(&redis.url(), FailClosed::default());
    assert!(open.check("open", &quota).await.decision().is_some());
    assert!(closed.check("closed", &quota).await.decision().is_some());

    let sleeper = redis.debug_sleep(Duration::from_secs(1));
    let asleep = Instant::now();
    let mut latency = Latencies::default();
    for i in 0..4 {
        let (limiter, key, expected) = if i % 2 == 0 {
            (&open, "open", Verdict::FailedOpen)
        } else {
            (
                &closed,
                "closed",
                Verdict::FailedClosed {
                    retry_after: Duration::from_secs(1),
                },
            )
        };
        let started = Instant::now();
        let verdict = limiter.check(key, &quota).await;
        latency.0.push(started.elapsed());
        assert_eq!(verdict, expected);
    }
    let during = asleep.elapsed();
    println!(
        "DEBUG SLEEP 1: 4 calls answered by the policy in {during:?}, worst {:?} (timeout {TIMEOUT:?})",
        latency.worst()
    );
    // Each call waited for the timeout, not for Redis (asleep for 1 s).
    assert!(latency.worst() >= TIMEOUT, "{:?}", latency.worst());
    assert!(latency.worst() < TIMEOUT + Duration::from_millis(400));
    assert!(during < Duration::from_secs(1), "calls waited for Redis");
    assert_eq!(open.stats().failed_open, 2);
    assert_eq!(closed.stats().failed_closed, 2);

    sleeper.join().unwrap();
    let woke = Instant::now();
    let seen = check_until(&closed, "closed", &quota, woke, |v| v.decision().is_some()).await;
    let remaining = seen.last().unwrap().1.decision().unwrap().remaining;
    // Scripts sent before a timeout still run once Redis wakes, so some of the requests answered
    // 503 during the sleep may have been counted (a sent command cannot be taken back).
    println!(
        "after DEBUG SLEEP: deciding again after {:?}; {} of the 2 requests answered 503 were counted once Redis woke",
        seen.last().unwrap().0,
        98u64.saturating_sub(remaining)
    );
    assert!(open.check("open", &quota).await.decision().is_some());
}

/// The store is built while Redis is down: the app starts, the policy answers fast, and once
/// Redis is up the same limiter enforces.
#[tokio::test]
async fn store_created_while_redis_is_down() {
    let mut redis = RedisServer::start();
    redis.stop();
    let limiter = limiter(&redis.url(), FailClosed::default());
    let quota = Quota::per_hour(2).unwrap();

    let mut latency = Latencies::default();
    for _ in 0..10 {
        let started = Instant::now();
        let verdict = limiter.check("k", &quota).await;
        latency.0.push(started.elapsed());
        assert!(
            matches!(verdict, Verdict::FailedClosed { .. }),
            "{verdict:?}"
        );
    }
    assert!(latency.worst() < BOUND, "{:?}", latency.worst());

    redis.restart();
    let restarted = Instant::now();
    let seen = check_until(&limiter, "k", &quota, restarted, |v| {
        v.decision().is_some_and(|d| !d.allowed)
    })
    .await;
    let first_decision = seen.iter().find(|(_, v)| v.decision().is_some()).unwrap().0;
    println!(
        "store built with redis down: policy answered in at most {:?}; after start, first decision {first_decision:?}, first denial {:?}",
        latency.worst(),
        seen.last().unwrap().0
    );
    let allowed = seen
        .iter()
        .filter(|(_, v)| v.decision().is_some_and(|d| d.allowed))
        .count();
    assert_eq!(allowed, 2);
    assert_eq!(limiter.stats().allowed, 2);
    assert_eq!(limiter.stats().denied, 1);
}

/// `Limiter::stats` counts every failure and what the policy made of it.
#[tokio::test]
async fn stats_count_failures_per_policy() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let quota = Quota::per_minute(10).unwrap();
    let open = limiter(&url, FailOpen);
    let closed = limiter(&url, FailClosed::default());
    let local = limiter(&url, LocalFallback::new(2));

    for limiter in [&open, &closed, &local] {
        assert!(limiter.check("k", &quota).await.is_allowed());
    }
    redis.stop();
    let mut local_allowed = Vec::new();
    for limiter in [&open, &closed, &local] {
        for _ in 0..7 {
            let verdict = limiter.check("k", &quota).await;
            if let Some(decision) = verdict.decision() {
                local_allowed.push(decision.allowed);
            }
        }
    }

    let base = LimiterStats {
        allowed: 1,
        store_errors: 7,
        ..LimiterStats::default()
    };
    assert_eq!(
        open.stats(),
        LimiterStats {
            failed_open: 7,
            ..base
        }
    );
    assert_eq!(
        closed.stats(),
        LimiterStats {
            failed_closed: 7,
            ..base
        }
    );
    assert_eq!(
        local.stats(),
        LimiterStats {
            fallback_decisions: 7,
            ..base
        }
    );
    // The local fallback enforces this instance's share of the quota: half of 10.
    assert_eq!(local_allowed, [true, true, true, true, true, false, false]);
}
