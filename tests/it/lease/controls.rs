//! Controls reaching a leasing instance: an operator's suspension within one lease interval,
//! and a reset by this limiter while a lease-answered request's settlement is in flight.

use std::time::Duration;

use http::StatusCode;
use redlimit::clock::ManualClock;
use redlimit::{Quota, Quotas};
use tower::ServiceExt;

use super::settle::{call, lease_held_behind_a_gate, store_left, target};
use super::settle_every_algorithm::leases_ended;
use super::{admitted_of, one_interval_later, renewed_and_returned, Backend};
use super::{CAPACITY, INTERVAL, LEASING, T0};
use crate::modes::settle::until_entered;
use crate::support::{Ctx, RedisServer};

/// Controls, with a manual clock on both the leasing instance and the operator: a suspension
/// set by the operator; one interval after it, nothing is admitted; a resume, then a reset of
/// a spent (cached-denied) key: one interval after each, the leasing instance admits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_operator_controls_reach_a_leasing_instance_within_one_interval_on_a_manual_clock() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let ctx = Ctx::default().manual(&clock);
    let leasing = Backend::Redis(&redis).leasing(&ctx, INTERVAL);
    let operator = ctx.redis(&redis);
    let quota = Quota::per_second(100_000).unwrap();
    super::basics::hold_units(&leasing, "k", &quota, &clock).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ten_minutes = Duration::from_secs(600);
    super::basics::suspend_once_leased(&leasing, &operator, "k", ten_minutes, "k").await;
    clock.advance(INTERVAL + Duration::from_micros(1));
    let admitted = admitted_of(&leasing, "k", &quota, 100).await;
    assert_eq!(admitted, 0, "admitted one interval after a suspension");
    operator.resume("k").await.unwrap();
    let v = one_interval_later(&leasing, &clock, "k", &quota).await;
    assert!(v.is_allowed(), "denied one interval after a resume: {v:?}");
    let small = Quota::per_hour(100).unwrap();
    let ok = admitted_of(&leasing, "s", &small, 150).await;
    assert_eq!(ok, 100, "quota 100");
    operator.reset("s").await.unwrap();
    let v = one_interval_later(&leasing, &clock, "s", &small).await;
    assert!(v.is_allowed(), "denied one interval after a reset: {v:?}");
}

/// A request answered from a lease is in the service when this very limiter resets the tenant
/// (which ends its leases), another instance spends 5, then the service fails with a 503: the
/// settlement's refund is dated by the renewal, before the reset, and gives nothing to the state
/// written after it (every leasing algorithm, Redis's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_in_flight_across_this_limiters_reset_gives_nothing_after_it() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_day(CAPACITY).unwrap());
    for algorithm in LEASING {
        let (limiter, other, svc, gate, entered) =
            lease_held_behind_a_gate(&redis, algorithm).await;
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
        let (renewed, returned) = renewed_and_returned(&answered, &after);
        let left = store_left(&other, &quotas).await;
        assert_eq!(
            left + renewed,
            CAPACITY - 5 + returned,
            "{algorithm}: a unit leased before the reset was refunded after it (renewed since \
             {renewed}, returned {returned}); {after:?}"
        );
    }
}
