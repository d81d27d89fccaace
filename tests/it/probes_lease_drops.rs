//! Break-it probes of leases under cancellation and a slow store: a lease-answered request whose
//! future (and so its settlement) is dropped at each await, `flush_settlements` racing those
//! drops, renewals dropped mid-flight while others wait on them, and Redis asleep past the
//! store's timeout during renewals and refunds. The promises: no request waits on work nobody
//! finishes, counters balance, a settlement's refund goes to its renewal's state or nowhere, and
//! no window admits more than its quota.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use redlimit::clock::Clock;
use redlimit::limiter::Leases;
use redlimit::store::Store;
use redlimit::{Algorithm, Limiter, Quota, Quotas};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::modes::settle::until_entered;
use crate::modes::settle_leases::{
    answering, call, late_refund_behind_the_next_window, lease_held, refund_5xx, store_left, target,
};
use crate::probes_lease_settle::leases_ended;
use crate::support::{Ctx, RedisServer};

/// A day's quota: leases of up to 100 units.
const CAPACITY: u64 = 1_000;

fn leasing(store: impl Store, algorithm: Algorithm) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .clock(Clock::default())
        .leases(Leases::new(Duration::from_millis(50)))
        .build()
        .unwrap()
}

/// Requests answered from a lease, each failing with a 503 (refunded in full), are dropped at
/// each point of their life: while the service runs (no settlement: the unit stays spent), and
/// at random just as the service answers, with `flush_settlements` racing the drop. Every
/// `flush_settlements` returns, and the key's units balance: what it has left is its capacity
/// less what the leases took, plus what came back (give-backs, and one refund at most per
/// request, at least one per request whose 503 reached its caller).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_answered_settlements_dropped_at_every_await_balance_and_never_hang() {
    let redis = RedisServer::start();
    let quota = Quota::per_day(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
    ] {
        redis.flushall();
        let ctx = Ctx::new(algorithm);
        let limiter = leasing(ctx.redis_store(&redis), algorithm);
        let other = ctx.redis(&redis);
        let (gate, entered) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
        let svc = refund_5xx(
            limiter.clone(),
            quota,
            answering(gate.clone(), entered.clone()),
        );
        lease_held(&limiter, &svc).await;
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

/// Which 1 s window the machine's clock (the one a local Redis's `TIME` reads) is in.
fn window_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Redis's clock, fixed windows of 1 000 a second, two leasing instances (FailClosed, a store
/// timeout of 100 ms) each with 3 tasks sending a request every 0.5 ms, while Redis sleeps
/// 150 ms (past the timeout) every 400 ms, during renewals and give-backs: over 4 s, a window
/// never admits more than 1 000. An admission is counted in a window when its call started and
/// ended in it (the local Redis reads the same clock), so the count is a lower bound of the
/// window's admissions: above 1 000 would be a proof of over-admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_during_renewals_and_give_backs_never_over_admits_a_window() {
    use redlimit::failure_policy::FailClosed;
    use std::sync::Mutex;
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_second(1_000).unwrap());
    let ctx = Ctx::new(Algorithm::FixedWindow).timeout(Duration::from_millis(100));
    let fleet: Vec<Limiter> = (0..2)
        .map(|_| {
            Limiter::builder(ctx.redis_store(&redis))
                .algorithm(Algorithm::FixedWindow)
                .failure_policy(FailClosed::default())
                .leases(Leases::new(Duration::from_millis(50)))
                .build()
                .unwrap()
        })
        .collect();
    let counts: Arc<Mutex<std::collections::BTreeMap<u64, (u64, u64)>>> = Arc::default();
    let end = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for limiter in &fleet {
        for _ in 0..3 {
            let (limiter, counts) = (limiter.clone(), counts.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let before = window_now();
                    let allowed = limiter
                        .check_quotas(target(), &quotas, 1)
                        .await
                        .is_allowed();
                    let after = window_now();
                    if allowed {
                        let mut counts = counts.lock().unwrap();
                        let entry = counts.entry(before).or_default();
                        if before == after {
                            entry.0 += 1;
                        } else {
                            entry.1 += 1;
                        }
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
            }));
        }
    }
    let mut sleeps = 0;
    while Instant::now() + Duration::from_millis(400) < end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        redis
            .debug_sleep(Duration::from_millis(150))
            .join()
            .unwrap();
        sleeps += 1;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counts = counts.lock().unwrap().clone();
    let stats: Vec<_> = fleet.iter().map(Limiter::lease_stats).collect();
    let errors: Vec<_> = fleet.iter().map(|l| l.stats().store_errors).collect();
    println!("{sleeps} sleeps; per window (certain, straddling) {counts:?}; {stats:?}; errors {errors:?}");
    for (window, (certain, _)) in &counts {
        assert!(
            *certain <= 1_000,
            "window {window} admitted at least {certain} of 1 000: {counts:?} {stats:?}"
        );
    }
}

/// A request answered from a lease is in the service when this very limiter resets the tenant
/// (which ends its leases), another instance spends 5, then the service fails with a 503: the
/// settlement's refund is dated by the renewal, before the reset, and gives nothing to the state
/// written after it (every leasing algorithm, Redis's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_in_flight_across_this_limiters_reset_gives_nothing_after_it() {
    let redis = RedisServer::start();
    let quota = Quota::per_day(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
    ] {
        redis.flushall();
        let ctx = Ctx::new(algorithm);
        let limiter = leasing(ctx.redis_store(&redis), algorithm);
        let other = ctx.redis(&redis);
        let (gate, entered) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
        let svc = refund_5xx(
            limiter.clone(),
            quota,
            answering(gate.clone(), entered.clone()),
        );
        lease_held(&limiter, &svc).await;
        let before = limiter.lease_stats();
        let failing = {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(call(503, true)).await.unwrap().status() })
        };
        until_entered(&entered, 1).await;
        let answered = limiter.lease_stats();
        assert_eq!(
            answered.spent,
            before.spent + 1,
            "{algorithm}: not answered from the lease"
        );
        limiter.reset("hot").await.unwrap();
        assert!(other.check_quotas(target(), &quotas, 5).await.is_allowed());
        gate.add_permits(1);
        assert_eq!(failing.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
        limiter.flush_settlements().await;
        leases_ended(&limiter).await;
        let after = limiter.lease_stats();
        let renewed = after.leased - answered.leased;
        let returned = after.returned - answered.returned;
        let left = store_left(&other, &quotas).await;
        assert_eq!(
            left + renewed,
            CAPACITY - 5 + returned,
            "{algorithm}: a unit leased before the reset was refunded after it (renewed since \
             {renewed}, returned {returned}); {after:?}"
        );
    }
}

/// Redis's clock, a store timeout of 100 ms: a request answered from a lease early in window W
/// fails with a 503, and Redis sleeps from then until half a second into W+1, so the refund
/// times out (a settle failure) and Redis runs it late, in W+1, after a check (queued before it
/// on the same connection, timed out too) charged W+1 in full. Dated by the renewal, the refund gives W+1
/// nothing: lost, never misplaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_that_times_out_and_runs_late_never_reaches_the_next_window() {
    let redis = RedisServer::start();
    let quota = Quota::per_second(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    let ctx = Ctx::new(Algorithm::FixedWindow).timeout(Duration::from_millis(100));
    let limiter = leasing(ctx.redis_store(&redis), Algorithm::FixedWindow);
    let other = Ctx::new(Algorithm::FixedWindow)
        .timeout(Duration::from_secs(5))
        .redis(&redis);
    let (gate, entered) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let svc = refund_5xx(
        limiter.clone(),
        quota,
        answering(gate.clone(), entered.clone()),
    );
    // The check of W+1 queued first on the limiter's connection times out here, and Redis runs
    // it all the same, before the refund.
    let next =
        late_refund_behind_the_next_window(&redis, &limiter, &svc, (&gate, &entered), &quotas)
            .await;
    let failures = limiter.stats().settle_failures;
    assert!(
        next.is_err(),
        "the check of W+1 answered within the timeout: {next:?}"
    );
    // The late refund (and any give-back) ran by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = store_left(&other, &quotas).await;
    println!(
        "settle failures {failures}, left {left}, {:?}",
        limiter.lease_stats()
    );
    assert_eq!(
        left, 0,
        "a refund of W's unit that timed out and ran late was given to W+1 ({left} left)"
    );
}

/// A store wrapping a `RedisStore` that forwards `check` and `refund` but not `check_timed`:
/// Redis's clock then tells no time, and the lease's renewals, like the settlement of a request
/// answered from it, are dated by their age. The same late refund as above (Redis asleep until
/// half a second into W+1, behind a check that charged W+1 in full) then gives W+1 a unit of W:
/// the limit `Store::check_timed` and docs/leases.md state (a wrapper forwards `check_timed`,
/// as the trait's example does). Run it with `--ignored` to see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a documented limit: a store that tells no time (check_timed not forwarded) dates \
            refunds by age, which Redis counts back from when it runs them: run late, one lands \
            in W+1"]
async fn a_lease_answered_refund_through_a_wrapping_store_run_late_never_reaches_the_next_window() {
    use futures::future::BoxFuture;
    use redlimit::store::{CheckRequest, RedisStore, RefundRequest, StoreError};
    use redlimit::Decision;

    /// Counts nothing; forwards the checks and refunds, as a metrics wrapper does.
    #[derive(Debug)]
    struct Wrapped(RedisStore);

    impl Store for Wrapped {
        fn check<'a>(
            &'a self,
            request: CheckRequest<'a>,
        ) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.0.check(request)
        }

        fn refund<'a>(
            &'a self,
            request: RefundRequest<'a>,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            self.0.refund(request)
        }
    }

    let redis = RedisServer::start();
    let quota = Quota::per_second(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    let ctx = Ctx::new(Algorithm::FixedWindow).timeout(Duration::from_secs(5));
    let limiter = leasing(Wrapped(ctx.redis_store(&redis)), Algorithm::FixedWindow);
    let other = ctx.redis(&redis);
    let (gate, entered) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let svc = refund_5xx(
        limiter.clone(),
        quota,
        answering(gate.clone(), entered.clone()),
    );
    let next =
        late_refund_behind_the_next_window(&redis, &limiter, &svc, (&gate, &entered), &quotas)
            .await
            .unwrap();
    assert!(next.allowed, "W+1 admits its 1 000: {next:?}");
    assert_eq!(limiter.stats().settle_failures, 0);
    let left = store_left(&other, &quotas).await;
    println!(
        "left {left}, {:?}, {:?}",
        limiter.lease_stats(),
        limiter.stats()
    );
    assert_eq!(
        left, 0,
        "a unit reserved by a renewal in W (through a store that tells no time), answered from \
         the lease and refunded late, was given to W+1 ({left} left after it admitted its 1 000)"
    );
}
