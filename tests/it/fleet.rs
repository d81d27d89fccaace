//! The fleet features on real Redis: limits changed at run time, fleet-wide suspension, several
//! quotas in one atomic call, reset and inspect, on a single node and on a 3-master Cluster, for
//! every algorithm; and bad input to each of them.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use redlimit::store::RedisStore;
use redlimit::{
    Algorithm, ControlError, Limiter, Quota, QuotaError, Quotas, Target, MAX_SUSPENSION,
};
use support::{RedisCluster, RedisServer};
use tokio::sync::Barrier;

/// A limiter on its own connection to `redis` (each instance of a fleet has its own).
fn instance(redis: &RedisServer, algorithm: Algorithm) -> Limiter {
    // Correctness, not latency: a generous timeout keeps a loaded machine from failing calls.
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Limiter::builder(store)
        .algorithm(algorithm)
        .build()
        .unwrap()
}

fn cluster_instance(cluster: &RedisCluster, algorithm: Algorithm) -> Limiter {
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Limiter::builder(store)
        .algorithm(algorithm)
        .build()
        .unwrap()
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
        assert!(fleet[1].try_check(&key, &quota, 1).await.unwrap().allowed);
        let status = fleet[0]
            .suspend(key.as_str(), Duration::from_secs(30))
            .await
            .unwrap();
        let left = status.suspended_for.unwrap();
        assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(25));
        for limiter in &fleet {
            let decision = limiter.try_check(&key, &quota, 1).await.unwrap();
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
        let after = fleet[1].try_check(&key, &quota, 1).await.unwrap();
        assert!(after.allowed && !after.suspended, "{algorithm}");
        assert_eq!(after.remaining, 98, "{algorithm}");
    }
}

/// A short suspension ends by itself at its time, on Redis's clock.
#[tokio::test]
async fn a_suspension_ends_by_itself() {
    let redis = RedisServer::start();
    let limiter = instance(&redis, Algorithm::TokenBucket);
    let quota = Quota::per_hour(10).unwrap();
    limiter
        .suspend("k", Duration::from_millis(300))
        .await
        .unwrap();
    let denied = limiter.try_check("k", &quota, 1).await.unwrap();
    assert!(denied.suspended);
    tokio::time::sleep(denied.retry_after).await;
    let decision = limiter.try_check("k", &quota, 1).await.unwrap();
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
        let status = fleet[0].inspect(key.as_str()).await.unwrap();
        let field = |tier: usize, name: &str| {
            status.tiers[tier]
                .fields
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .unwrap()
        };
        match algorithm {
            Algorithm::TokenBucket => assert_eq!(field(1, "tokens"), 15.0),
            Algorithm::Gcra => assert!((field(1, "debt") - 10.0).abs() < 1e-3),
            Algorithm::FixedWindow => assert_eq!(field(1, "count"), 10.0),
            Algorithm::SlidingWindow => assert_eq!(field(1, "current"), 10.0),
            Algorithm::SlidingLog => assert_eq!(status.log_entries, Some(10)),
            other => panic!("{other}: add its state here"),
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
    let login = limiter
        .check_scoped("login", "alice", &quota, 1)
        .await
        .decision()
        .copied()
        .unwrap();
    assert!(login.suspended);
    assert!(limiter.try_check("alice", &quota, 1).await.unwrap().allowed);
    assert!(limiter
        .check_scoped("api", "alice", &quota, 1)
        .await
        .is_allowed());
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
            assert!(
                worker
                    .try_check_quotas(&key, &tiers, 1)
                    .await
                    .unwrap()
                    .allowed
            );
            assert!(
                worker
                    .try_check_quotas(&key, &tiers, 1)
                    .await
                    .unwrap()
                    .allowed
            );
            assert!(
                !worker
                    .try_check_quotas(&key, &tiers, 1)
                    .await
                    .unwrap()
                    .allowed
            );
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
    // 12 keys a algorithm, the sliding log's controls in a key of their own.
    assert_eq!(seen, 12 * Algorithm::ALL.len() + 12);
}

/// Bad input to every control is a typed error, and changes nothing.
#[tokio::test]
async fn bad_input_is_a_typed_error_and_changes_nothing() {
    let redis = RedisServer::start();
    let limiter = instance(&redis, Algorithm::TokenBucket);
    let quota = Quota::per_hour(3).unwrap();
    assert!(limiter.try_check("k", &quota, 1).await.unwrap().allowed);
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
        limiter
            .try_check(&hostile, &quota, 1)
            .await
            .unwrap()
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
/// controls in the same layout, under `<key>#m`).
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
            Algorithm::SlidingLog => format!("{}#m", limiter.storage_key(&key)),
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
