//! A store implemented outside the crate: it decides through `check`, and runs the crate's
//! other operations (fleet controls, refunds, blocks, concurrency slots) by forwarding
//! `Store::run` to a store it wraps, on a real Redis.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};
use redlimit::store::{CheckRequest, Operation, RedisStore, Store, StoreError};
use redlimit::{Algorithm, Decision, Limiter, Quota, Quotas};

use crate::support::stores::{kind, DecideOnly};
use crate::support::{self, redis_store, RedisServer};

/// Routes each key to one of two stores by its first letter (`a`… to the first), and counts
/// what it forwards by kind: what a sharding wrapper written by a user does.
#[derive(Debug)]
struct Routed {
    stores: [RedisStore; 2],
    seen: Arc<Mutex<BTreeMap<&'static str, u64>>>,
}

impl Routed {
    fn store_of(&self, storage_key: &str) -> &RedisStore {
        // The storage key is `<prefix>:{<key>}…`: route by the key's first letter.
        let key = storage_key.split('{').nth(1).unwrap_or_default();
        &self.stores[usize::from(!key.starts_with('a'))]
    }

    fn count(&self, kind: &'static str) {
        *self.seen.lock().unwrap().entry(kind).or_default() += 1;
    }
}

impl Store for Routed {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.count("check");
        self.store_of(request.key).check(request)
    }

    fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        let request = operation.request();
        self.count(kind(&request));
        let store = self.store_of(request.key());
        store.run(operation)
    }
}

/// Every kind of operation reaches the store a user wrote, which forwards it by key: the
/// controls, a refund, a blocking check and concurrency slots all work through it, on the
/// store its key routes to and on no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_written_outside_the_crate_runs_every_operation_by_forwarding_it() {
    let (first, second) = (RedisServer::start(), RedisServer::start());
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let routed = Routed {
        stores: [redis_store(&first), redis_store(&second)],
        seen: seen.clone(),
    };
    let limiter = Limiter::builder(routed)
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let direct = [
        Limiter::new(redis_store(&first)),
        Limiter::new(redis_store(&second)),
    ];
    let quota = Quota::per_minute(10).unwrap();
    let quotas = Quotas::from(quota);

    // A control, on the store of its key alone.
    limiter
        .suspend("alpha", Duration::from_secs(60))
        .await
        .unwrap();
    let decision = *limiter.check("alpha", &quota).await.decision().unwrap();
    assert!(decision.suspended && !decision.allowed, "{decision:?}");
    assert!(support::suspended_for(&direct[0], "alpha").await.is_some());
    assert!(support::suspended_for(&direct[1], "alpha").await.is_none());
    limiter.resume("alpha").await.unwrap();

    // An override, read back through the wrapper.
    let five = Quotas::from(Quota::per_minute(5).unwrap());
    limiter.set_quota("beta", &five).await.unwrap();
    let status = limiter.inspect("beta").await.unwrap();
    assert_eq!(status.quota_override, Some(five), "{status:?}");
    assert_eq!(
        limiter
            .check("beta", &quota)
            .await
            .decision()
            .unwrap()
            .limit,
        5,
        "the override decides"
    );

    // A refund gives back what a check took.
    assert!(limiter.check_quotas("alpha", &quotas, 4).await.is_allowed());
    limiter.refund("alpha", &quotas, 4).await.unwrap();
    let left = limiter.check_quotas("alpha", &quotas, 0).await;
    assert_eq!(left.decision().unwrap().remaining, 10, "all 4 units back");

    // A blocking check blocks the tenant on its denial.
    support::denied_by_a_block(&limiter, "abuser").await;
    assert!(support::suspended_for(&direct[0], "abuser").await.is_some());

    // Concurrency slots.
    let slots = ConcurrencyLimiter::new(limiter.clone(), 1).unwrap();
    let held = slots.acquire("alpha").await;
    assert!(matches!(held, SlotOutcome::Acquired(_)), "{held:?}");
    let full = slots.acquire("alpha").await;
    assert!(
        matches!(full, SlotOutcome::Full { .. }),
        "the one slot is held: {full:?}"
    );
    drop(held);

    let seen = seen.lock().unwrap().clone();
    for kind in ["check", "control", "refund", "blocking", "slots"] {
        assert!(seen.get(kind).copied().unwrap_or(0) > 0, "{kind}: {seen:?}");
    }
}

/// A store that does not forward `run` still decides, and refuses the controls with
/// `StoreError::Unsupported` rather than ignoring them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_runs_no_operation_decides_and_refuses_the_controls() {
    let redis = RedisServer::start();
    let limiter = Limiter::new(DecideOnly(redis_store(&redis)));
    let quota = Quota::per_minute(1).unwrap();
    assert!(limiter.check("k", &quota).await.is_allowed());
    assert!(!limiter.check("k", &quota).await.is_allowed());
    let refused = limiter
        .suspend("k", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            redlimit::limiter::ControlError::Store(StoreError::Unsupported(_))
        ),
        "{refused:?}"
    );
}
