//! The fleet features on real Redis: limits changed at run time, fleet-wide suspension, several
//! quotas in one atomic call, reset and inspect, on a single node and on a 3-master Cluster, for
//! every algorithm; and bad input to each of them.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use redlimit::store::RedisStore;
use redlimit::{
    limiter::{ControlError, MAX_SUSPENSION},
    quota::QuotaError,
    Algorithm, Limiter, Quota, Quotas, Target,
};
use support::{Ctx, RedisCluster, RedisServer};
use tokio::sync::Barrier;

/// Correctness, not latency: a generous timeout keeps a loaded machine from failing calls.
const FLEET_TIMEOUT: Duration = Duration::from_secs(10);

/// A limiter on its own connection to `redis` (each instance of a fleet has its own).
fn instance(redis: &RedisServer, algorithm: Algorithm) -> Limiter {
    Ctx::new(algorithm).timeout(FLEET_TIMEOUT).redis(redis)
}

fn cluster_instance(cluster: &RedisCluster, algorithm: Algorithm) -> Limiter {
    Ctx::new(algorithm).timeout(FLEET_TIMEOUT).cluster(cluster)
}

async fn admitted(limiter: &Limiter, key: &str, quotas: &Quotas, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        let decision = limiter.try_check_quotas(key, quotas, 1).await.unwrap();
        count += usize::from(decision.allowed);
    }
    count
}

/// An override set through one instance is obeyed by another on its very next call, tighter
/// or looser, until it is cleared; every algorithm. (A key's state is kept across a change,
/// capped to the new quota: how much that leaves depends on the algorithm, so each change here
/// lands on a fresh key, or is checked through the quota the decisions name.)
#[tokio::test]
async fn an_override_set_by_one_instance_is_obeyed_by_another() {
    let redis = RedisServer::start();
    let default = Quotas::from(Quota::per_hour(5).unwrap());
    for &algorithm in Algorithm::ALL {
        let (admin, worker) = (instance(&redis, algorithm), instance(&redis, algorithm));
        // Tighter: 3 an hour instead of 5.
        let tight = Quotas::from(Quota::per_hour(3).unwrap());
        let key = format!("tight-{algorithm}");
        let status = admin.set_quota(key.as_str(), &tight).await.unwrap();
        assert_eq!(status.quota_override, Some(tight), "{algorithm}");
        assert_eq!(admitted(&worker, &key, &default, 6).await, 3, "{algorithm}");
        let denied = worker.try_check_quotas(&key, &default, 1).await.unwrap();
        assert!(!denied.allowed && !denied.suspended, "{algorithm}");
        assert_eq!(
            (denied.limit, denied.quota),
            (3, tight[0]),
            "{algorithm}: the decision names the override"
        );
        // Looser: 20 an hour, on a key the worker already used under its own quota.
        let loose = Quotas::from(Quota::per_hour(20).unwrap());
        let key = format!("loose-{algorithm}");
        assert_eq!(admitted(&worker, &key, &default, 1).await, 1);
        admin.set_quota(key.as_str(), &loose).await.unwrap();
        let next = worker.try_check_quotas(&key, &default, 1).await.unwrap();
        assert_eq!(
            next.quota, loose[0],
            "{algorithm}: the override is in force"
        );
        let fresh = format!("fresh-{algorithm}");
        admin.set_quota(fresh.as_str(), &loose).await.unwrap();
        assert_eq!(
            admitted(&worker, &fresh, &default, 25).await,
            20,
            "{algorithm}"
        );
        // Cleared: the caller's 5 an hour again (20 are spent).
        let status = admin.clear_quota(fresh.as_str()).await.unwrap();
        assert_eq!(status.quota_override, None, "{algorithm}");
        let back = worker.try_check_quotas(&fresh, &default, 1).await.unwrap();
        assert!(!back.allowed, "{algorithm}");
        assert_eq!(back.quota, default[0], "{algorithm}");
    }
}

/// A suspension set by one instance is seen by every other, with the time it has left; a
/// resume ends it for all; and nothing was consumed meanwhile.
#[tokio::test]
async fn a_suspension_is_seen_by_every_instance_with_its_time_left() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(100).unwrap();
    for &algorithm in Algorithm::ALL {
        let fleet: Vec<Limiter> = (0..3).map(|_| instance(&redis, algorithm)).collect();
        let key = format!("upstream-{algorithm}");
        assert!(support::admits(&fleet[1], &key, &quota).await);
        let status = fleet[0]
            .suspend(key.as_str(), Duration::from_secs(30))
            .await
            .unwrap();
        let left = status.suspended_for.unwrap();
        assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(25));
        for limiter in &fleet {
            let decision = limiter
                .try_check_quotas(&key, &quota.into(), 1)
                .await
                .unwrap();
            assert!(!decision.allowed && decision.suspended, "{algorithm}");
            assert_eq!(decision.remaining, 0);
            assert!(
                decision.retry_after <= Duration::from_secs(30)
                    && decision.retry_after > Duration::from_secs(25),
                "{algorithm}: {:?}",
                decision.retry_after
            );
            assert_eq!(limiter.stats().suspended, 1, "{algorithm}");
        }
        fleet[2].resume(key.as_str()).await.unwrap();
        // One was admitted before the suspension; the denials cost nothing.
        let after = fleet[1]
            .try_check_quotas(&key, &quota.into(), 1)
            .await
            .unwrap();
        assert!(after.allowed && !after.suspended, "{algorithm}");
        assert_eq!(after.remaining, 98, "{algorithm}");
    }
}

/// A short suspension ends by itself at its time, on Redis's clock.
#[tokio::test]
async fn a_suspension_ends_by_itself() {
    let redis = RedisServer::start();
    let limiter = instance(&redis, Algorithm::TokenBucket);
    limiter
        .suspend("k", Duration::from_millis(300))
        .await
        .unwrap();
    let quota = Quota::per_hour(10).unwrap();
    let denied = support::decision(&limiter, "k", &quota).await;
    assert!(denied.suspended);
    tokio::time::sleep(denied.retry_after).await;
    let decision = support::decision(&limiter, "k", &quota).await;
    assert!(decision.allowed, "{decision:?}");
}

/// Several quotas in one call under concurrency, across 3 instances: exactly what the
/// tightest allows passes, and a request denied by one tier consumes from none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_quotas_are_exact_under_concurrency_across_instances() {
    let redis = RedisServer::start();
    for &algorithm in Algorithm::ALL {
        let fleet: Vec<Limiter> = (0..3).map(|_| instance(&redis, algorithm)).collect();
        // 10 an hour, and 25 a day.
        let tiers = Arc::new(
            Quotas::new([Quota::per_hour(10).unwrap(), Quota::per_day(25).unwrap()]).unwrap(),
        );
        let key = format!("multi-{algorithm}");
        let barrier = Arc::new(Barrier::new(90));
        let tasks: Vec<_> = (0..90)
            .map(|i| {
                let (limiter, tiers, barrier, key) = (
                    fleet[i % 3].clone(),
                    tiers.clone(),
                    barrier.clone(),
                    key.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    limiter.try_check_quotas(&key, &tiers, 1).await.unwrap()
                })
            })
            .collect();
        let mut allowed = 0;
        for task in tasks {
            let decision = task.await.unwrap();
            if decision.allowed {
                allowed += 1;
            } else {
                // Denied by the hourly tier, which waits longer than... it is the only one out.
                assert_eq!(decision.quota, tiers[0], "{algorithm}");
            }
        }
        assert_eq!(allowed, 10, "{algorithm}");
        let peek = fleet[0].try_check_quotas(&key, &tiers, 0).await.unwrap();
        assert_eq!(peek.remaining, 0, "{algorithm}: the hourly tier is spent");
        // The daily tier paid for the 10 admissions only: denied requests consumed nothing.
        // Every tier holds what a limiter that was asked exactly 10 times holds (times aside:
        // they are µs since the epoch, and differ by the runs' moments).
        let reference = Ctx::new(algorithm).memory();
        for _ in 0..10 {
            let decision = reference.try_check_quotas(&key, &tiers, 1).await.unwrap();
            assert!(decision.allowed, "{algorithm}");
        }
        let status = fleet[0].inspect(key.as_str()).await.unwrap();
        let expected = reference.inspect(key.as_str()).await.unwrap();
        assert_eq!(status.log_entries, expected.log_entries, "{algorithm}");
        assert_eq!(status.tiers.len(), expected.tiers.len(), "{algorithm}");
        for (tier, (held, wanted)) in status.tiers.iter().zip(&expected.tiers).enumerate() {
            assert_eq!(held.algorithm, wanted.algorithm, "{algorithm} tier {tier}");
            let numbers = |fields: &[(&'static str, f64)]| -> Vec<(&'static str, f64)> {
                let not_a_time = |v: f64| v.abs() < 1e12;
                fields
                    .iter()
                    .copied()
                    .filter(|&(_, v)| not_a_time(v))
                    .collect()
            };
            let (held, wanted) = (numbers(&held.fields), numbers(&wanted.fields));
            assert_eq!(
                held.len(),
                wanted.len(),
                "{algorithm} tier {tier}: {held:?}"
            );
            for ((name, v), (_, w)) in held.iter().zip(&wanted) {
                assert!(
                    (v - w).abs() < 1e-2,
                    "{algorithm} tier {tier} {name}: {v} for {w}"
                );
            }
        }
    }
}

/// Reset forgets the usage and keeps an override and a suspension; inspect changes nothing.
#[tokio::test]
async fn reset_forgets_usage_and_inspect_changes_nothing() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(3).unwrap();
    for &algorithm in Algorithm::ALL {
        let limiter = instance(&redis, algorithm);
        let key = format!("r-{algorithm}");
        assert_eq!(
            admitted(&limiter, &key, &Quotas::from(quota), 5).await,
            3,
            "{algorithm}"
        );
        let before = limiter.inspect(key.as_str()).await.unwrap();
        let again = limiter.inspect(key.as_str()).await.unwrap();
        assert_eq!(
            (&before.tiers, before.log_entries),
            (&again.tiers, again.log_entries)
        );
        assert!(before.expires_in.is_some() || algorithm == Algorithm::SlidingLog);
        if algorithm == Algorithm::SlidingLog {
            assert_eq!(before.log_entries, Some(3));
        } else {
            assert_eq!(before.tiers.len(), 1);
            assert_eq!(before.tiers[0].algorithm, Some(algorithm));
        }
        let override_ = Quotas::from(Quota::per_hour(4).unwrap());
        limiter.set_quota(key.as_str(), &override_).await.unwrap();
        let status = limiter.reset(key.as_str()).await.unwrap();
        assert!(status.tiers.is_empty(), "{algorithm}");
        assert_eq!(status.quota_override, Some(override_));
        assert_eq!(
            admitted(&limiter, &key, &Quotas::from(quota), 6).await,
            4,
            "{algorithm}: full again, under the override"
        );
        // A key never used: nothing stored, and looking does not create it.
        let fresh = limiter.inspect("never-seen").await.unwrap();
        assert_eq!(
            (fresh.quota_override, fresh.suspended_for, fresh.expires_in),
            (None, None, None)
        );
        assert!(fresh.tiers.is_empty());
    }
    let mut conn = redis.conn();
    let exists: bool = redis::cmd("EXISTS")
        .arg("redlimit:{never-seen}")
        .query(&mut conn)
        .unwrap();
    assert!(!exists);
}

/// Controls address a layer's scoped key as well as an unscoped one, and each only its own.
#[tokio::test]
async fn controls_address_scoped_keys() {
    let redis = RedisServer::start();
    let limiter = instance(&redis, Algorithm::TokenBucket);
    let quota = Quota::per_hour(10).unwrap();
    limiter
        .suspend(Target::scoped("login", "alice"), Duration::from_secs(60))
        .await
        .unwrap();
    let login = support::decision(&limiter, Target::scoped("login", "alice"), &quota).await;
    assert!(login.suspended);
    assert!(support::admits(&limiter, "alice", &quota).await);
    assert!(support::admits(&limiter, Target::scoped("api", "alice"), &quota).await);
}

/// A key under two suspensions, its tenant's and its route's, is denied until the later one
/// ends, whichever of the two that is: a client is never told to come back while its route is
/// still suspended. Redis and the memory store's mirror alike.
#[tokio::test]
async fn a_route_suspended_longer_than_its_tenant_answers_with_its_own_end() {
    let redis = RedisServer::start();
    let limiters = [
        ("redis", instance(&redis, Algorithm::TokenBucket)),
        ("memory", Ctx::new(Algorithm::TokenBucket).memory()),
    ];
    let quota = Quota::per_hour(10).unwrap();
    for (store, limiter) in &limiters {
        for (tenant_secs, route_secs) in [(60, 120), (120, 60)] {
            let key = format!("k-{tenant_secs}-{route_secs}");
            let route = Target::scoped("login", &key);
            limiter
                .suspend(Target::all_routes(&key), Duration::from_secs(tenant_secs))
                .await
                .unwrap();
            limiter
                .suspend(route, Duration::from_secs(route_secs))
                .await
                .unwrap();
            let decision = limiter
                .check_quotas(route, &quota.into(), 1)
                .await
                .decision()
                .copied()
                .unwrap();
            let later = Duration::from_secs(tenant_secs.max(route_secs));
            assert!(
                decision.suspended && !decision.allowed,
                "{store}: {decision:?}"
            );
            assert!(
                decision.retry_after > later - Duration::from_secs(5)
                    && decision.retry_after <= later,
                "{store}: tenant suspended {tenant_secs} s, route {route_secs} s: told to retry \
                 after {:?}",
                decision.retry_after
            );
        }
    }
}

/// On a Cluster every key of one limiter key lives in one slot, several tiers and controls
/// included, and every control works there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_every_key_of_a_limiter_key_in_one_slot() {
    let cluster = RedisCluster::start();
    let tiers = Quotas::new([Quota::per_hour(5).unwrap(), Quota::per_day(50).unwrap()]).unwrap();
    for &algorithm in Algorithm::ALL {
        let (admin, worker) = (
            cluster_instance(&cluster, algorithm),
            cluster_instance(&cluster, algorithm),
        );
        for i in 0..12 {
            let key = format!("c{i}-{algorithm}");
            admin
                .set_quota(key.as_str(), &Quotas::from(Quota::per_hour(2).unwrap()))
                .await
                .unwrap();
            // The override's 2 an hour, then a denial.
            for (n, expected) in [(1, true), (2, true), (3, false)] {
                let decision = worker.try_check_quotas(&key, &tiers, 1).await.unwrap();
                assert_eq!(decision.allowed, expected, "{key}: request {n}");
            }
            admin
                .suspend(key.as_str(), Duration::from_secs(60))
                .await
                .unwrap();
            assert!(
                worker
                    .try_check_quotas(&key, &tiers, 1)
                    .await
                    .unwrap()
                    .suspended
            );
        }
    }
    // Every key the fleet wrote, on whichever node, shares its slot with its limiter key.
    let mut seen = 0;
    for node in cluster.nodes() {
        let mut conn = node.conn();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("redlimit:*")
            .query(&mut conn)
            .unwrap();
        for key in keys {
            let tag = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&key)
                .query(&mut conn)
                .unwrap();
            let tag_slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(tag)
                .query(&mut conn)
                .unwrap();
            assert_eq!(slot, tag_slot, "{key}");
            seen += 1;
        }
    }
    // 12 keys a algorithm, the sliding log's controls in a key of their own, and each
    // suspended tenant's controls (`…#t`, in the same slot).
    assert_eq!(
        seen,
        12 * Algorithm::ALL.len() + 12 + 12 * Algorithm::ALL.len()
    );
}

/// Bad input to every control is a typed error, and changes nothing.
#[tokio::test]
async fn bad_input_is_a_typed_error_and_changes_nothing() {
    let redis = RedisServer::start();
    let limiter = instance(&redis, Algorithm::TokenBucket);
    let quota = Quota::per_hour(3).unwrap();
    assert!(support::admits(&limiter, "k", &quota).await);
    let before = limiter.inspect("k").await.unwrap();

    assert_eq!(Quotas::new([]), Err(QuotaError::NoQuotas));
    assert_eq!(Quotas::new([quota; 9]), Err(QuotaError::TooManyQuotas));
    assert_eq!(Quotas::try_from(Vec::new()), Err(QuotaError::NoQuotas));
    for duration in [
        Duration::ZERO,
        Duration::from_nanos(999),
        MAX_SUSPENSION + Duration::from_secs(1),
        Duration::MAX,
    ] {
        let error = limiter.suspend("k", duration).await.unwrap_err();
        assert!(
            matches!(error, ControlError::InvalidDuration),
            "{duration:?}"
        );
    }
    let log = instance(&redis, Algorithm::SlidingLog);
    let huge = Quotas::from(Quota::per_second(1_000_000).unwrap());
    let error = log.set_quota("k", &huge).await.unwrap_err();
    assert!(
        matches!(
            error,
            ControlError::Quota(QuotaError::BurstTooLargeForSlidingLog)
        ),
        "{error}"
    );
    let after = limiter.inspect("k").await.unwrap();
    assert_eq!(
        (after.quota_override, after.suspended_for, &after.tiers),
        (before.quota_override, before.suspended_for, &before.tiers),
        "nothing changed"
    );
    // Unknown keys: every control works on them, and a resume or clear leaves nothing behind.
    for key in ["unknown-1", "unknown-2"] {
        limiter.resume(key).await.unwrap();
        limiter.clear_quota(key).await.unwrap();
        limiter.reset(key).await.unwrap();
        assert_eq!(limiter.inspect(key).await.unwrap().expires_in, None);
    }
    // Hostile keys are bounded and hashed like any key.
    let hostile = "{x}".repeat(10_000);
    limiter
        .suspend(hostile.as_str(), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        support::decision(&limiter, hostile.as_str(), &quota)
            .await
            .suspended
    );
    // A store that cannot answer: a typed store error, the policy is not involved.
    let dead = Limiter::new(
        RedisStore::builder(support::example::dead_redis_url())
            .timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    let error = dead.suspend("k", Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(error, ControlError::Store(_)), "{error}");
}

/// The tiers of a stored override are checked like the caller's, the first one too: an
/// override whose first tier was corrupted in Redis (a limit of 0) is refused with a typed
/// error, and the stored string is left as it was; every algorithm (the sliding log keeps its
/// controls in the same layout, in a key beside its log).
#[tokio::test]
async fn a_corrupted_first_tier_of_a_stored_override_is_refused() {
    let redis = RedisServer::start();
    let default = Quotas::from(Quota::per_hour(5).unwrap());
    for &algorithm in Algorithm::ALL {
        let limiter = instance(&redis, algorithm);
        let key = format!("forged-{algorithm}");
        let tight = Quotas::from(Quota::per_hour(3).unwrap());
        limiter.set_quota(key.as_str(), &tight).await.unwrap();
        assert!(limiter.try_check_quotas(&key, &default, 1).await.is_ok());
        // Controls: 'M', suspended-until (8 bytes), the tier count, then per tier limit,
        // period_us and burst as little-endian doubles: the first limit is at byte 11.
        let storage_key = match algorithm {
            // The sliding log keeps its sorted set under the key, its controls beside it.
            Algorithm::SlidingLog => {
                redlimit::test_hooks::control_keys(&limiter.storage_key(&key))[0].clone()
            }
            _ => limiter.storage_key(&key),
        };
        let mut conn = redis.conn();
        let _: () = redis::cmd("SETRANGE")
            .arg(&storage_key)
            .arg(10)
            .arg(&0f64.to_le_bytes()[..])
            .query(&mut conn)
            .unwrap();
        let before: Vec<u8> = redis::cmd("GET")
            .arg(&storage_key)
            .query(&mut conn)
            .unwrap();
        let error = limiter
            .try_check_quotas(&key, &default, 1)
            .await
            .expect_err("a forged tier must not be decided against");
        assert!(
            error.to_string().contains("limit, period_us and burst"),
            "{algorithm}: {error}"
        );
        let after: Vec<u8> = redis::cmd("GET")
            .arg(&storage_key)
            .query(&mut conn)
            .unwrap();
        assert_eq!(after, before, "{algorithm}: nothing written");
    }
}

/// The tenant's controls, for `make`'s limiters (one Redis, single node or Cluster): a
/// suspension and a reset of the tenant reach every route (two scopes and the unscoped key);
/// an override reaches the route it names, or with `Target::all_routes` every route that has
/// none of its own; other tenants are untouched. Every algorithm.
async fn tenant_controls_reach_every_route(make: impl Fn(Algorithm) -> Limiter) {
    let quota = Quota::per_hour(3).unwrap();
    for &algorithm in Algorithm::ALL {
        let (admin, worker) = (make(algorithm), make(algorithm));
        let key = format!("tenant-{algorithm}");
        let other = format!("other-{algorithm}");
        let allowed = |route: &'static str, key: String| {
            let worker = worker.clone();
            async move {
                let decision = match route {
                    "" => worker.try_check_quotas(&key, &quota.into(), 1).await,
                    scope => {
                        let verdict = worker
                            .check_quotas(Target::scoped(scope, &key), &quota.into(), 1)
                            .await;
                        Ok(*verdict.decision().expect("decided"))
                    }
                };
                decision.unwrap()
            }
        };
        for route in ["api", "login", ""] {
            assert!(
                allowed(route, key.clone()).await.allowed,
                "{algorithm} {route}"
            );
        }
        // A suspension of the tenant: every route.
        admin
            .suspend(key.as_str(), Duration::from_secs(60))
            .await
            .unwrap();
        for route in ["api", "login", ""] {
            let denied = allowed(route, key.clone()).await;
            assert!(denied.suspended && !denied.allowed, "{algorithm} {route}");
            assert!(denied.retry_after > Duration::from_secs(50), "{denied:?}");
            assert!(allowed(route, other.clone()).await.allowed, "{algorithm}");
        }
        admin.resume(key.as_str()).await.unwrap();
        // Spend every route (1 of 3 used above), then reset the tenant: all 3 are back.
        for (left, when) in [(2, "before the reset"), (3, "after the reset")] {
            for route in ["api", "login", ""] {
                for _ in 0..left {
                    assert!(
                        allowed(route, key.clone()).await.allowed,
                        "{algorithm} {route} {when}"
                    );
                }
                assert!(
                    !allowed(route, key.clone()).await.allowed,
                    "{algorithm} {route} {when}"
                );
            }
            if left == 2 {
                let status = admin.reset(key.as_str()).await.unwrap();
                assert!(status.tiers.is_empty(), "{algorithm}: {status:?}");
            }
        }
        // A second reset works as the first.
        admin.reset(key.as_str()).await.unwrap();
        assert!(allowed("api", key.clone()).await.allowed, "{algorithm}");
        admin.reset(key.as_str()).await.unwrap();

        // An override of one route: only that route.
        let one = Quotas::from(Quota::per_hour(1).unwrap());
        admin
            .set_quota(Target::scoped("api", &key), &one)
            .await
            .unwrap();
        assert_eq!(allowed("api", key.clone()).await.limit, 1, "{algorithm}");
        assert_eq!(allowed("login", key.clone()).await.limit, 3, "{algorithm}");
        // Of every route: the others too; the route's own stays first.
        let two = Quotas::from(Quota::per_hour(2).unwrap());
        let status = admin
            .set_quota(Target::all_routes(&key), &two)
            .await
            .unwrap();
        assert_eq!(status.all_routes_override, Some(two));
        assert_eq!(allowed("login", key.clone()).await.limit, 2, "{algorithm}");
        assert_eq!(allowed("", key.clone()).await.limit, 2, "{algorithm}");
        assert_eq!(allowed("api", key.clone()).await.limit, 1, "{algorithm}");
        assert_eq!(
            allowed("login", other.clone()).await.limit,
            3,
            "{algorithm}"
        );
        admin.clear_quota(Target::all_routes(&key)).await.unwrap();
        assert_eq!(allowed("login", key.clone()).await.limit, 3, "{algorithm}");
    }
}

#[tokio::test]
async fn tenant_controls_reach_every_route_on_a_single_node() {
    let redis = RedisServer::start();
    tenant_controls_reach_every_route(|algorithm| instance(&redis, algorithm)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_controls_reach_every_route_on_a_cluster() {
    let cluster = RedisCluster::start();
    tenant_controls_reach_every_route(|algorithm| cluster_instance(&cluster, algorithm)).await;
}

/// A deploy keeps what the operator did: a layer named by its policy counts in that name, so a
/// changed quota keeps the usage (capped) and the route's override; a suspension of the tenant
/// holds whatever the quota or the algorithm.
#[tokio::test]
async fn a_deploy_keeps_the_usage_override_and_suspension() {
    use redlimit::key::GlobalKey;
    use redlimit::RateLimitLayer;
    let redis = RedisServer::start();
    let limiter = instance(&redis, Algorithm::TokenBucket);
    let layer = |limiter: &Limiter, quota| {
        RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("k1"))
            .policy_name("api")
            .build()
            .unwrap()
    };
    let (old_quota, new_quota) = (Quota::per_hour(100).unwrap(), Quota::per_hour(50).unwrap());
    let before = layer(&limiter, old_quota);
    let after = layer(&limiter, new_quota);
    assert_eq!((before.scope(), after.scope()), ("api", "api"));
    // 60 used under 100 an hour: 40 left, which 50 an hour keeps (capped at 50).
    for _ in 0..60 {
        assert!(limiter
            .check_quotas(Target::scoped(before.scope(), "k1"), &old_quota.into(), 1)
            .await
            .is_allowed());
    }
    let peek = limiter
        .check_quotas(Target::scoped(after.scope(), "k1"), &new_quota.into(), 0)
        .await;
    assert_eq!(peek.decision().unwrap().remaining, 40, "kept and capped");
    // The route's override and the tenant's suspension survive the quota, and the algorithm.
    let tight = Quotas::from(Quota::per_minute(7).unwrap());
    limiter
        .set_quota(Target::scoped("api", "k1"), &tight)
        .await
        .unwrap();
    limiter
        .suspend("k1", Duration::from_secs(30))
        .await
        .unwrap();
    let gcra = instance(&redis, Algorithm::Gcra);
    for limiter in [&limiter, &gcra] {
        let decision = limiter
            .check_quotas(
                Target::scoped("api", "k1"),
                &Quota::per_minute(50).unwrap().into(),
                1,
            )
            .await;
        let decision = decision.decision().unwrap();
        assert!(decision.suspended, "{decision:?}");
    }
    limiter.resume("k1").await.unwrap();
    let decision = limiter
        .check_quotas(
            Target::scoped("api", "k1"),
            &Quota::per_minute(50).unwrap().into(),
            1,
        )
        .await;
    assert_eq!(decision.decision().unwrap().limit, 7);
}

/// Controls never destroy another algorithm's state: a control aimed at a key with the wrong
/// algorithm is refused with a typed error naming what the key holds, and changes nothing; a
/// peek never writes or deletes, a sliding-log peek at a key of another type included.
#[tokio::test]
async fn a_control_or_a_peek_never_destroys_state_of_another_type() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let quota = Quota::per_hour(5).unwrap();
    let dump = |conn: &mut redis::Connection, key: &str| -> Option<Vec<u8>> {
        redis::cmd("DUMP").arg(key).query(conn).unwrap()
    };
    // A sliding log's key, and a token-bucket admin pointed at it.
    let log = instance(&redis, Algorithm::SlidingLog);
    for _ in 0..3 {
        assert!(
            log.try_check_quotas("k", &quota.into(), 1)
                .await
                .unwrap()
                .allowed
        );
    }
    let before = dump(&mut conn, "redlimit:{k}");
    assert!(before.is_some());
    let admin = instance(&redis, Algorithm::TokenBucket);
    let tight = Quotas::from(Quota::per_hour(1).unwrap());
    let refusal = admin.set_quota("k", &tight).await.unwrap_err();
    match &refusal {
        ControlError::WrongKind(what) => assert!(what.contains("zset"), "{what}"),
        other => panic!("not refused: {other}"),
    }
    assert!(refusal.to_string().contains("token-bucket"), "{refusal}");
    assert_eq!(dump(&mut conn, "redlimit:{k}"), before, "nothing changed");
    // The log still counts its 3 of 5.
    assert_eq!(
        log.try_check_quotas("k", &quota.into(), 0)
            .await
            .unwrap()
            .remaining,
        2
    );

    // A token bucket's key and a sliding-log admin; a GCRA admin.
    let bucket = instance(&redis, Algorithm::TokenBucket);
    assert!(support::admits(&bucket, "b", &quota).await);
    let state = dump(&mut conn, "redlimit:{b}");
    for algorithm in [Algorithm::SlidingLog, Algorithm::Gcra] {
        let error = instance(&redis, algorithm)
            .set_quota("b", &tight)
            .await
            .unwrap_err();
        match &error {
            ControlError::WrongKind(what) => {
                assert!(what.contains("token-bucket state"), "{what}")
            }
            other => panic!("{algorithm}: not refused: {other}"),
        }
        assert_eq!(dump(&mut conn, "redlimit:{b}"), state, "{algorithm}");
    }
    // A sliding-log peek at the token bucket's key: the key is left as it is.
    let peek = log.try_check_quotas("b", &quota.into(), 0).await.unwrap();
    assert!(peek.allowed);
    assert_eq!(dump(&mut conn, "redlimit:{b}"), state, "a peek deleted it");
    // An admission may replace it (self-healing).
    assert!(
        log.try_check_quotas("b", &quota.into(), 1)
            .await
            .unwrap()
            .allowed
    );
    assert_ne!(dump(&mut conn, "redlimit:{b}"), state);
}

/// A suspension whose end lies very far ahead (a tenant's or a route's, however it got there)
/// still denies, with a readable reply: never an unparsable one that fails open.
#[tokio::test]
async fn a_suspension_far_ahead_denies_with_a_readable_reply() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let quota = Quota::per_second(100).unwrap();
    let mut far = vec![b'M'];
    far.extend_from_slice(&1e300f64.to_le_bytes());
    far.push(0);
    // The route's controls: in its string, for the sliding log beside its sorted set.
    let [_, tenant] = redlimit::test_hooks::control_keys("redlimit:{t}");
    let [log_controls, _] = redlimit::test_hooks::control_keys("redlimit:{r}");
    for key in [tenant.as_str(), "redlimit:{r}", log_controls.as_str()] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(&far)
            .query(&mut conn)
            .unwrap();
    }
    for &algorithm in Algorithm::ALL {
        let limiter = instance(&redis, algorithm);
        for key in ["t", "r"] {
            let decision = limiter.try_check_quotas(key, &quota.into(), 1).await;
            let decision = decision.unwrap_or_else(|e| panic!("{algorithm} {key}: {e}"));
            assert!(decision.suspended && !decision.allowed, "{decision:?}");
            assert!(decision.retry_after > MAX_SUSPENSION, "{decision:?}");
            // Through the failure policy too: denied, not failed open.
            assert!(!limiter.check(key, &quota).await.is_allowed());
        }
    }
}

/// An upstream's `Retry-After` (the outbound layer's auto-suspend) only ever extends a
/// suspension, and is capped: a late `Retry-After: 1` from a request already in flight leaves
/// an operator's hour as it is, and `Retry-After: 99999999999` suspends for the layer's cap
/// (5 minutes by default), not for 30 days.
#[tokio::test]
async fn an_upstream_retry_after_only_extends_a_suspension_and_is_capped() {
    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use redlimit::outbound::OutboundLayer;
    use tower::{Service, ServiceBuilder, ServiceExt};

    let redis = RedisServer::start();
    let quota = Quota::per_second(100).unwrap();
    // One call through the layer; `during` runs while the request is with the upstream, which
    // then answers 429 with `retry_after`.
    async fn call_once(
        layer: OutboundLayer,
        retry_after: &'static str,
        during: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let during = std::sync::Mutex::new(Some(Box::pin(during)));
        let during = Arc::new(during);
        let upstream = tower::service_fn(move |_: Request<Full<Bytes>>| {
            let during = during.lock().unwrap().take();
            async move {
                if let Some(during) = during {
                    during.await;
                }
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(StatusCode::TOO_MANY_REQUESTS)
                        .header("retry-after", retry_after)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
            }
        });
        let mut client = ServiceBuilder::new().layer(layer.clone()).service(upstream);
        let request = Request::new(Full::new(Bytes::new()));
        let response = client.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        // The suspension is written after the response.
        layer.settled().await;
    }
    let hour = Duration::from_secs(3600);

    // The operator suspends for an hour while the request is in flight; its late answer says 1 s.
    let limiter = instance(&redis, Algorithm::TokenBucket);
    let operator = limiter.clone();
    let layer = OutboundLayer::new(limiter.clone(), quota, "partner");
    call_once(layer, "1", async move {
        operator.suspend("partner", hour).await.unwrap();
    })
    .await;
    let left = support::suspended_for(&limiter, "partner").await.unwrap();
    assert!(left > hour - Duration::from_secs(60), "cut to {left:?}");

    // A huge Retry-After: the default cap, 5 minutes.
    let layer = OutboundLayer::new(limiter.clone(), quota, "cdn");
    call_once(layer, "99999999999", async {}).await;
    let left = limiter.inspect("cdn").await.unwrap().suspended_for.unwrap();
    assert!(
        left <= Duration::from_secs(300) && left > Duration::from_secs(290),
        "{left:?}"
    );
    // A cap of the layer's own.
    let layer = OutboundLayer::builder(limiter.clone(), quota, "edge")
        .max_auto_suspension(Duration::from_secs(20))
        .build()
        .unwrap();
    call_once(layer, "99999999999", async {}).await;
    let left = support::suspended_for(&limiter, "edge").await.unwrap();
    assert!(left <= Duration::from_secs(20), "{left:?}");
}
