//! The local deny cache (`LimiterBuilder::deny_cache`) on a real Redis: it answers a hot
//! over-limit key without the store, lets it through again exactly when `retry_after` has passed,
//! and never changes what is admitted (exactness under concurrency, and the same decisions as a
//! limiter without it over random schedules, for every algorithm).

use crate::support;
use crate::support::stores::refused;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use redlimit::limiter::BlockFor;
use redlimit::store::{CheckRequest, MemoryStore, Operation, OperationRequest, Store, StoreError};
use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Decision, Limiter, Quota, Quotas, Target,
};
use support::{Ctx, RedisServer};
use tokio::sync::Barrier;

const T0: Duration = Duration::from_secs(1_700_001_800);

fn limiter(redis: &RedisServer, algorithm: Algorithm, clock: Clock, cache: bool) -> Limiter {
    let ctx = Ctx::new(algorithm)
        .clock(clock)
        .timeout(Duration::from_secs(10))
        .prefix(if cache { "cached" } else { "plain" });
    let ctx = if cache { ctx.deny_cache(1_000) } else { ctx };
    ctx.redis(redis)
}

/// Script calls Redis has run (EVALSHA, and EVAL should a store fall back to it).
fn script_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha") + redis.command_calls("eval")
}

async fn check(limiter: &Limiter, key: &str, quota: &Quota, cost: u64) -> Decision {
    limiter
        .try_check_quotas(key, &quota.into(), cost)
        .await
        .unwrap_or_else(|e| panic!("store failed: {e}"))
}

/// A hot key over its limit costs Redis one script call, not one per request, and passes again
/// at `retry_after` exactly (denied 1 ms before).
#[tokio::test]
async fn a_hot_over_limit_key_is_answered_without_evalsha_until_retry_after() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let quota = Quota::per_minute(5).unwrap();
    let limiter = limiter(
        &redis,
        Algorithm::TokenBucket,
        Clock::Manual(clock.clone()),
        true,
    );
    for _ in 0..5 {
        assert!(check(&limiter, "hot", &quota, 1).await.allowed);
    }
    let before = script_calls(&redis);
    let first = check(&limiter, "hot", &quota, 1).await;
    assert!(!first.allowed);
    assert_eq!(first.retry_after, Duration::from_secs(12));
    for _ in 0..1_000 {
        let denied = check(&limiter, "hot", &quota, 1).await;
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, Duration::from_secs(12));
    }
    assert_eq!(
        script_calls(&redis) - before,
        1,
        "one EVALSHA for 1001 denials"
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.denied, stats.deny_cached),
        (5, 1_001, 1_000)
    );

    clock.advance(Duration::from_millis(11_999));
    let late = check(&limiter, "hot", &quota, 1).await;
    assert!(!late.allowed);
    assert_eq!(late.retry_after, Duration::from_millis(1));
    assert_eq!(script_calls(&redis) - before, 1, "still answered locally");
    clock.advance(Duration::from_millis(1));
    assert!(check(&limiter, "hot", &quota, 1).await.allowed);
    assert_eq!(script_calls(&redis) - before, 2, "the store decided again");
}

/// On Redis server time the cache runs on a local clock started when the denial arrived: the key
/// passes again once `retry_after` has passed.
#[tokio::test]
async fn on_server_time_the_key_passes_again_after_retry_after() {
    let redis = RedisServer::start();
    let quota = Quota::new(2, Duration::from_millis(600)).unwrap();
    let limiter = limiter(&redis, Algorithm::TokenBucket, Clock::Server, true);
    assert!(check(&limiter, "k", &quota, 1).await.allowed);
    assert!(check(&limiter, "k", &quota, 1).await.allowed);
    let denied = check(&limiter, "k", &quota, 1).await;
    assert!(!denied.allowed);
    assert!(denied.retry_after <= Duration::from_millis(300));
    let before = script_calls(&redis);
    assert!(!check(&limiter, "k", &quota, 1).await.allowed);
    assert_eq!(script_calls(&redis), before, "answered locally");
    tokio::time::sleep(denied.retry_after + Duration::from_millis(20)).await;
    assert!(check(&limiter, "k", &quota, 1).await.allowed);
    assert_eq!(limiter.stats().deny_cached, 1);
}

/// A denial that can never pass (cost above the capacity) is not cached: it says nothing about
/// smaller costs, and the store answers it every time.
#[tokio::test]
async fn never_denials_and_smaller_costs_go_to_the_store() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let quota = Quota::per_minute(5).unwrap();
    let limiter = limiter(&redis, Algorithm::Gcra, Clock::Manual(clock), true);
    for _ in 0..3 {
        assert!(check(&limiter, "k", &quota, 9).await.never_allowed());
    }
    assert!(check(&limiter, "k", &quota, 3).await.allowed);
    assert!(!check(&limiter, "k", &quota, 3).await.allowed); // 2 left: cached for cost 3
    assert!(!check(&limiter, "k", &quota, 3).await.allowed); // from the cache
    let four = check(&limiter, "k", &quota, 4).await; // another cost: the store, its own wait
    assert!(!four.allowed);
    assert!(check(&limiter, "k", &quota, 2).await.allowed); // smaller: the store admits it
    assert_eq!(limiter.stats().deny_cached, 1);
}

/// A change made to the key drops its entry: after the key is deleted in Redis and forgotten,
/// the next request is the store's again.
#[tokio::test]
async fn forget_drops_the_entry() {
    let redis = RedisServer::start();
    let quota = Quota::per_minute(1).unwrap();
    let clock = ManualClock::new(T0);
    let limiter = limiter(&redis, Algorithm::TokenBucket, Clock::Manual(clock), true);
    assert!(check(&limiter, "k", &quota, 1).await.allowed);
    assert!(!check(&limiter, "k", &quota, 1).await.allowed);
    let _: () = redis::cmd("DEL")
        .arg(limiter.storage_key("k"))
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        !check(&limiter, "k", &quota, 1).await.allowed,
        "still cached"
    );
    limiter.forget("k");
    assert!(check(&limiter, "k", &quota, 1).await.allowed);
}

/// 500 checks at one instant over 4 limiters with deny caches: exactly the limit passes, for
/// every algorithm; a second round on the same key admits nothing and costs Redis at most one
/// script call per limiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactness_under_concurrency_holds_with_the_cache_on() {
    const CHECKS: usize = 500;
    const LIMIT: u64 = 50;
    let redis = RedisServer::start();
    let quota = Quota::per_hour(LIMIT).unwrap();
    let clock = Clock::Manual(ManualClock::new(T0));
    for &algorithm in Algorithm::ALL {
        let limiters: Vec<Limiter> = (0..4)
            .map(|_| limiter(&redis, algorithm, clock.clone(), true))
            .collect();
        let key = format!("exact-{algorithm}");
        let mut admitted = Vec::new();
        for round in 0..2 {
            let before = script_calls(&redis);
            let barrier = Arc::new(Barrier::new(CHECKS));
            let tasks: Vec<_> = (0..CHECKS)
                .map(|i| {
                    let limiter = limiters[i % limiters.len()].clone();
                    let (barrier, key) = (barrier.clone(), key.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        check(&limiter, &key, &quota, 1).await
                    })
                })
                .collect();
            let mut allowed = 0;
            for task in tasks {
                allowed += usize::from(task.await.unwrap().allowed);
            }
            admitted.push(allowed);
            if round == 1 {
                let calls = script_calls(&redis) - before;
                assert!(
                    calls <= 4,
                    "{algorithm}: {calls} script calls in the cached round"
                );
            }
        }
        assert_eq!(admitted, [LIMIT as usize, 0], "{algorithm}");
    }
}

/// Over random schedules (whole milliseconds, mixed costs) a limiter with the cache decides
/// exactly as one without it, for every algorithm: the cache only ever repeats a denial the
/// store would give.
#[tokio::test]
async fn the_cache_never_changes_a_decision() {
    let redis = RedisServer::start();
    let quota = support::quota_with_burst(5, Duration::from_secs(10), 5);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    for &algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let cached = limiter(&redis, algorithm, Clock::Manual(clock.clone()), true);
        let plain = limiter(&redis, algorithm, Clock::Manual(clock.clone()), false);
        let mut denied = 0;
        for step in 0..600 {
            clock.advance(Duration::from_millis(next(1_500)));
            let cost = [1, 1, 1, 2, 3][next(5) as usize];
            let with = check(&cached, "k", &quota, cost).await;
            let without = check(&plain, "k", &quota, cost).await;
            assert_eq!(
                with.allowed, without.allowed,
                "{algorithm} step {step} cost {cost}: cached {with:?}, store {without:?}"
            );
            if !with.allowed {
                denied += 1;
                assert!(
                    with.retry_after >= without.retry_after,
                    "{with:?} {without:?}"
                );
            }
        }
        assert!(
            denied > 50,
            "{algorithm}: the schedule must hit the limit ({denied})"
        );
        assert!(
            cached.stats().deny_cached > 0,
            "{algorithm}: the cache answered"
        );
    }
}

/// A cached denial repeats the store's decision field for field, also when the request has
/// several quotas and the second denies, and when an override decides (its quota is none of the
/// request's): the entry keeps them compactly, not as a whole `Quotas`.
#[tokio::test]
async fn a_cached_denial_repeats_the_stores_decision_with_tiers_and_overrides() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let limiter = limiter(&redis, Algorithm::TokenBucket, Clock::Manual(clock), true);
    let tiers =
        Quotas::new([Quota::per_second(5).unwrap(), Quota::per_minute(3).unwrap()]).unwrap();
    let override_quota = Quota::per_hour(1).unwrap();
    limiter
        .set_quota("o", &Quotas::from(override_quota))
        .await
        .unwrap();
    for (key, spend, binding) in [("t", 3, tiers[1]), ("o", 1, override_quota)] {
        for _ in 0..spend {
            assert!(
                limiter
                    .try_check_quotas(key, &tiers, 1)
                    .await
                    .unwrap()
                    .allowed
            );
        }
        let cached_before = limiter.stats().deny_cached;
        let from_store = limiter.try_check_quotas(key, &tiers, 1).await.unwrap();
        let from_cache = limiter.try_check_quotas(key, &tiers, 1).await.unwrap();
        assert!(!from_store.allowed, "{key}");
        assert_eq!(from_store.quota, binding, "{key}");
        assert_eq!(
            limiter.stats().deny_cached,
            cached_before + 1,
            "{key}: answered locally"
        );
        assert_eq!(from_cache, from_store, "{key}");
        // Another list of quotas is the store's.
        let one = Quotas::from(tiers[1]);
        limiter.try_check_quotas(key, &one, 1).await.unwrap();
        assert_eq!(limiter.stats().deny_cached, cached_before + 1, "{key}");
    }
}

/// The limiters the control tests run on: one with a deny cache on each store, on `clock`.
fn cached_on_each_store(redis: &RedisServer, clock: &ManualClock) -> Vec<(&'static str, Limiter)> {
    let ctx = Ctx::new(Algorithm::TokenBucket)
        .manual(clock)
        .timeout(Duration::from_secs(10))
        .deny_cache(1_000);
    vec![("redis", ctx.redis(redis)), ("memory", ctx.memory())]
}

/// A tenant's control through a limiter drops its cached denials on every scope, the layer's
/// scoped keys included: a suspension lifted early, a reset and a raised override of every
/// route are each seen by the very next check, on Redis and on the memory store.
#[tokio::test]
async fn a_tenant_control_drops_the_cached_denials_of_every_scope() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let quota = Quotas::from(Quota::per_minute(1).unwrap());
    let mut stale = support::Denials::default();
    for (store, limiter) in cached_on_each_store(&redis, &clock) {
        for control in ["resume", "reset", "all-routes override"] {
            let tenant = format!("{store}-{control}");
            let targets = [Target::scoped("api", &tenant), Target::key(&tenant)];
            if control == "resume" {
                limiter
                    .suspend(tenant.as_str(), Duration::from_secs(600))
                    .await
                    .unwrap();
            }
            for target in targets {
                let first = limiter.try_check_quotas(target, &quota, 1).await.unwrap();
                assert_eq!(first.allowed, control != "resume", "{store} {control}");
                let cached = limiter.stats().deny_cached;
                for _ in 0..2 {
                    assert!(
                        !limiter
                            .try_check_quotas(target, &quota, 1)
                            .await
                            .unwrap()
                            .allowed
                    );
                }
                assert!(
                    limiter.stats().deny_cached > cached,
                    "{store} {control}: cached"
                );
            }
            match control {
                "resume" => drop(limiter.resume(tenant.as_str()).await.unwrap()),
                "reset" => drop(limiter.reset(tenant.as_str()).await.unwrap()),
                _ => {
                    let raised = Quotas::from(Quota::per_minute(1_000).unwrap());
                    limiter
                        .set_quota(Target::all_routes(&tenant), &raised)
                        .await
                        .unwrap();
                    // A few tokens under the raised quota, well within the cached 60 s.
                    clock.advance(Duration::from_millis(100));
                }
            }
            for (name, target) in ["scoped", "unscoped"].into_iter().zip(targets) {
                let after = limiter.try_check_quotas(target, &quota, 1).await.unwrap();
                stale.note(format_args!("{store} {control} {name}"), &after);
            }
        }
    }
    stale.assert_none("cached denials outlived a control");
}

/// A layer's block on abuse (`block_for`) suspends the tenant; `resume` then `reset` through
/// the same limiter lift it at once, though the block's denial (600 s) was cached on the scope.
#[tokio::test]
async fn a_block_lifted_by_resume_and_reset_is_not_answered_from_the_cache() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let quota = Quotas::from(Quota::per_minute(1).unwrap());
    let block = BlockFor::new(Duration::from_secs(600)).unwrap();
    let mut stale = support::Denials::default();
    for (store, limiter) in cached_on_each_store(&redis, &clock) {
        let target = Target::scoped("api", "abuser");
        let mut verdicts = Vec::new();
        for _ in 0..4 {
            let verdict = limiter.check_blocking(target, &quota, 1, &block).await;
            verdicts.push(*verdict.decision().unwrap());
        }
        assert!(verdicts[0].allowed, "{store}");
        assert!(verdicts[1..]
            .iter()
            .all(|d| !d.allowed && d.retry_after >= block.duration()));
        assert!(limiter.stats().deny_cached >= 2, "{store}: cached");
        limiter.resume("abuser").await.unwrap();
        limiter.reset("abuser").await.unwrap();
        let after = *limiter
            .check_blocking(target, &quota, 1, &block)
            .await
            .decision()
            .unwrap();
        stale.note(store, &after);
    }
    stale.assert_none("a lifted block still answered");
}

/// A store whose check replies wait at a gate once armed: the decision is made (and counted)
/// at once, its reply delivered only when the gate opens. The test orders events with it, not
/// with sleeps.
#[derive(Debug)]
struct Gated<S> {
    inner: S,
    armed: std::sync::atomic::AtomicBool,
    decided: tokio::sync::Semaphore,
    gate: tokio::sync::watch::Sender<bool>,
}

impl<S: Store> Gated<S> {
    fn new(inner: S) -> Arc<Self> {
        Arc::new(Gated {
            inner,
            armed: false.into(),
            decided: tokio::sync::Semaphore::new(0),
            gate: tokio::sync::watch::channel(false).0,
        })
    }
}

/// The limiter's store is an `Arc` of the gated one, so the test keeps a handle on it.
#[derive(Debug)]
struct Shared<S>(Arc<Gated<S>>);

impl<S: Store> Store for Shared<S> {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let gated = &self.0;
            let decision = gated.inner.check(request).await;
            if gated.armed.load(std::sync::atomic::Ordering::SeqCst) {
                gated.decided.add_permits(1);
                let mut open = gated.gate.subscribe();
                let _ = open.wait_for(|open| *open).await;
            }
            decision
        })
    }

    /// The controls alone.
    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        match operation.request() {
            OperationRequest::Control(_) => self.0.inner.run(operation),
            _ => refused("controls only"),
        }
    }
}

/// A denial the store decided before a control, whose reply comes back after the control
/// returned, is never cached: 200 keys at 1/min, each with a check decided (denied, 60 s) before
/// `set_quota(key, 1 000 000/min)` through the same limiter and answered after it; the next check
/// of every key is the store's, under the new quota. On Redis and on the memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_decided_before_a_control_is_not_cached_after_it() {
    let redis = RedisServer::start();
    let ctx = Ctx::new(Algorithm::TokenBucket)
        .timeout(Duration::from_secs(10))
        .deny_cache(2_000);
    let mut stale = race_a_control(&ctx, "redis", ctx.redis_store(&redis)).await;
    stale.extend(race_a_control(&ctx, "memory", MemoryStore::new()).await);
    assert!(
        stale.is_empty(),
        "denials from before the control: {stale:#?}"
    );
}

/// [`a_denial_decided_before_a_control_is_not_cached_after_it`] on `inner`: what went wrong.
async fn race_a_control(ctx: &Ctx, store: &str, inner: impl Store) -> Vec<String> {
    const KEYS: usize = 200;
    let quota = Quotas::from(Quota::per_minute(1).unwrap());
    let raised = Quotas::from(Quota::per_minute(1_000_000).unwrap());
    let gated = Gated::new(inner);
    let clock = ManualClock::new(T0);
    let limiter = ctx.clone().manual(&clock).limiter(Shared(gated.clone()));
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{store}-race-{i}")).collect();
    for key in &keys {
        assert!(support::admits_quotas(&limiter, key.as_str(), &quota).await);
    }
    gated.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let in_flight: Vec<_> = keys
        .iter()
        .map(|key| {
            let (limiter, key) = (limiter.clone(), key.clone());
            tokio::spawn(async move { limiter.try_check_quotas(key.as_str(), &quota, 1).await })
        })
        .collect();
    // Every check decided by the store (denied), none answered yet.
    gated
        .decided
        .acquire_many(KEYS as u32)
        .await
        .unwrap()
        .forget();
    gated
        .armed
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let controls = keys
        .iter()
        .map(|key| limiter.set_quota(key.as_str(), &raised));
    for status in futures::future::join_all(controls).await {
        status.unwrap();
    }
    gated.gate.send_replace(true);
    for check in in_flight {
        let decision = check.await.unwrap().unwrap();
        assert!(!decision.allowed, "{store}: decided under the old quota");
    }
    // A few tokens under the new quota; the old denial had 60 s left.
    clock.advance(Duration::from_millis(1));
    let mut denied = Vec::new();
    for key in &keys {
        let after = limiter
            .try_check_quotas(key.as_str(), &quota, 1)
            .await
            .unwrap();
        if !after.allowed {
            denied.push(after.retry_after);
        }
    }
    match denied.first() {
        None => Vec::new(),
        Some(retry_after) => vec![format!(
            "{store}: {} of {KEYS} keys still denied, the first with retry_after {retry_after:?}",
            denied.len()
        )],
    }
}
