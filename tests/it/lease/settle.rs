//! Settlements of requests answered from a lease (`Leases`): their units were reserved by the
//! lease's renewal, before the request came, so a refund goes to the renewal's window (and
//! reset epoch) and to no other (docs/leases.md, docs/modes.md), on the client clock and on
//! Redis's, on Redis and on the memory store; and a fixed window's leased units are spent in
//! their own window only.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redlimit::clock::{Clock, ManualClock};
use redlimit::key::GlobalKey;
use redlimit::layer::RateLimit;
use redlimit::store::StoreError;
use redlimit::{Algorithm, Decision, Limiter, Quota, Quotas, RateLimitLayer, Target};
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use super::{
    asleep_until_half_into_the_next_second, backends, early_in_a_second, renewed_and_returned,
    Backend, INTERVAL,
};
use crate::modes::settle::until_entered;
use crate::support::service::{status_of, TestService};
use crate::support::{Ctx, RedisServer};

/// A window of 1 000: leases of up to 100 units (a tenth of it).
pub(crate) const CAPACITY: u64 = 1_000;

/// The key every layer here limits, under the policy "api".
pub(crate) fn target() -> Target<'static> {
    Target::scoped("api", "hot")
}

/// The service: answers the status of the request's `x-status` (200 without one); a request
/// with `x-gate` waits for a permit of `gate` (counted in `entered` first).
pub(crate) fn answering(gate: Arc<Semaphore>, entered: Arc<AtomicUsize>) -> impl TestService {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let (gate, entered) = (gate.clone(), entered.clone());
        async move {
            if req.headers().contains_key("x-gate") {
                entered.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
            }
            let status = req
                .headers()
                .get("x-status")
                .and_then(|s| s.to_str().ok()?.parse().ok())
                .unwrap_or(200);
            let response = Response::builder().status(status);
            Ok::<_, Infallible>(response.body(Full::new(Bytes::new())).unwrap())
        }
    })
}

/// The layer: 1 unit per request, given back when the service answers 5xx.
pub(crate) fn refund_5xx<S: TestService>(
    limiter: Limiter,
    quota: Quota,
    inner: S,
) -> RateLimit<S, GlobalKey> {
    RateLimitLayer::builder(limiter, quota, GlobalKey::new("hot"))
        .policy_name("api")
        .cost_from_response(|response| u64::from(!response.status().is_server_error()))
        .build()
        .unwrap()
        .layer(inner)
}

pub(crate) fn call(status: u16, gated: bool) -> Request<Full<Bytes>> {
    let mut request = Request::builder().header("x-status", status);
    if gated {
        request = request.header("x-gate", "1");
    }
    request.body(Full::new(Bytes::new())).unwrap()
}

/// `refund_5xx` over `answering`: the layer, the gate its gated requests wait at (closed), and
/// the count of those that entered it.
pub(crate) fn gated_refund_5xx(
    limiter: &Limiter,
    quota: Quota,
) -> (
    RateLimit<impl TestService, GlobalKey>,
    Arc<Semaphore>,
    Arc<AtomicUsize>,
) {
    let (gate, entered) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let svc = refund_5xx(
        limiter.clone(),
        quota,
        answering(gate.clone(), entered.clone()),
    );
    (svc, gate, entered)
}

/// `refund_5xx` over `answering` (its gate closed), once `limiter`'s lease of the key holds
/// units.
async fn refunding_with_a_lease_held(
    limiter: &Limiter,
    quota: Quota,
) -> RateLimit<impl TestService, GlobalKey> {
    let (svc, ..) = gated_refund_5xx(limiter, quota);
    lease_held(limiter, &svc).await;
    svc
}

/// Requests answered 200 through `svc` until `limiter`'s lease of the key holds units.
pub(crate) async fn lease_held<S, B>(limiter: &Limiter, svc: &S) -> u64
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible> + Clone,
{
    for _ in 0..400 {
        assert_eq!(status_of(svc, call(200, false)).await, StatusCode::OK);
    }
    // The background renewals end.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let held = limiter.lease_stats().held;
    assert!(held > 0, "no lease held: {:?}", limiter.lease_stats());
    held
}

/// On `redis` (flushed first), a limiter leasing under `algorithm` whose lease of the key holds
/// units, behind `gated_refund_5xx` (the layer, its gate and count) under a day's quota of
/// `CAPACITY`, and another instance.
pub(crate) async fn lease_held_behind_a_gate(
    redis: &RedisServer,
    algorithm: Algorithm,
) -> (
    Limiter,
    Limiter,
    RateLimit<impl TestService, GlobalKey>,
    Arc<Semaphore>,
    Arc<AtomicUsize>,
) {
    redis.flushall();
    let ctx = Ctx::new(algorithm);
    let limiter = super::leasing(ctx.redis_store(redis), algorithm);
    let other = ctx.redis(redis);
    let quota = Quota::per_day(CAPACITY).unwrap();
    let (svc, gate, entered) = gated_refund_5xx(&limiter, quota);
    lease_held(&limiter, &svc).await;
    (limiter, other, svc, gate, entered)
}

/// What the key has left under `quotas`, by a check of `limiter` (which `try_check` sends to the
/// store, never to a lease).
pub(crate) async fn store_left(limiter: &Limiter, quotas: &Quotas) -> u64 {
    let peek = limiter.try_check_quotas(target(), quotas, 0).await;
    peek.expect("the store decides").remaining
}

/// Client clock, at a fixed window's end W: a renewal 1.5 ms before it is told 2 ms (the store
/// rounds its times up to the ms), yet its units are W's and end with it. 0.1 ms into W+1, once
/// another instance charged W+1 in full, a request is denied: the lease answers none there
/// (a unit W paid for, spent in W+1, would make W+1 admit 1 001), and W+1 admits exactly 1 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_answers_nothing_past_its_window_client_clock() {
    let redis = RedisServer::start();
    let quota = Quota::per_second(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    // A window boundary (1 s windows).
    let boundary = Duration::from_secs(1_700_000_000);
    for backend in backends(&redis) {
        let clock = ManualClock::new(boundary - Duration::from_micros(1_500));
        let ctx = Ctx::new(Algorithm::FixedWindow).manual(&clock);
        let (limiter, other) = backend.pair(&ctx, INTERVAL);
        let svc = refunding_with_a_lease_held(&limiter, quota).await;
        // W+1, 0.1 ms in: another instance takes all of it.
        clock.set(boundary + Duration::from_micros(100));
        let full = other.try_check_quotas(target(), &quotas, CAPACITY).await;
        assert!(full.unwrap().allowed, "{backend}: W+1 admits its 1 000");
        let spent = limiter.lease_stats().spent;
        let status = status_of(&svc, call(200, false)).await;
        assert_eq!(
            (status, limiter.lease_stats().spent),
            (StatusCode::TOO_MANY_REQUESTS, spent),
            "{backend}: a unit W's renewal reserved was spent in W+1"
        );
        assert!(
            !other.check_quotas(target(), &quotas, 1).await.is_allowed(),
            "{backend}: W+1 admitted 1 001"
        );
    }
}

/// On Redis's clock, the late refund of a request answered from `limiter`'s lease: early in a
/// window W, with a lease held, a request through [`gated_refund_5xx`] under `quota` fails with
/// a 503 while Redis sleeps until half a second into W+1, behind a check of the whole of W+1
/// queued first on the limiter's connection. Returns that check's answer, once the settlement
/// was flushed (the refund ran, or failed).
pub(crate) async fn late_refund_in_the_next_window(
    redis: &RedisServer,
    limiter: &Limiter,
    quota: Quota,
) -> Result<Decision, StoreError> {
    let (svc, gate, entered) = gated_refund_5xx(limiter, quota);
    let quotas = Quotas::from(quota);
    // Early in a second (window W), so the steps below end well inside it.
    early_in_a_second(redis, 300);
    lease_held(limiter, &svc).await;
    let spent = limiter.lease_stats().spent;
    let failing = {
        let svc = svc.clone();
        tokio::spawn(async move { status_of(&svc, call(503, true)).await })
    };
    until_entered(&entered, 1).await;
    assert_eq!(
        limiter.lease_stats().spent,
        spent + 1,
        "answered from the lease"
    );
    // A background renewal the request started ends.
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Redis sleeps until half a second into the next window.
    let sleeper = asleep_until_half_into_the_next_second(redis).await;
    // Queued first on the limiter's connection (Redis serves one connection in order): a check
    // of the whole next window.
    let next = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.try_check_quotas(target(), &quotas, CAPACITY).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    gate.add_permits(1);
    assert_eq!(failing.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    limiter.flush_settlements().await;
    let next = next.await.unwrap();
    sleeper.join().unwrap();
    next
}

/// Redis's clock: a request answered from a lease early in window W fails with a 503, and its
/// refund reaches Redis only in W+1 (`DEBUG SLEEP` across the boundary), behind a check that
/// charged W+1 in full. Dated by the renewal (Redis's time of its admission) it goes to W; dated
/// by the request's own age it would land in W+1, which must admit exactly 1 000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_run_late_by_redis_never_reaches_the_next_window() {
    let redis = RedisServer::start();
    let quota = Quota::per_second(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    let limiter = Backend::Redis(&redis).leasing(&Ctx::new(Algorithm::FixedWindow), INTERVAL);
    let next = late_refund_in_the_next_window(&redis, &limiter, quota)
        .await
        .unwrap();
    assert!(next.allowed, "the next window admits its 1 000: {next:?}");
    assert_eq!(limiter.stats().settle_failures, 0);
    let left = store_left(&limiter, &quotas).await;
    assert_eq!(
        left, 0,
        "a unit reserved by a renewal in window W, answered from the lease and refunded late, \
         was given to window W+1 (it admitted its 1 000, then got {left} back)"
    );
}

/// Redis's clock (and the memory store's own): a lease renewed before an operator's reset (made
/// by a process of its own, which this instance's lease learns of only at its next renewal)
/// answers a request after it, which fails with a 503. Its units were paid for in the state the
/// reset forgot: the refund must give nothing to the state written after the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_never_lands_after_a_reset_made_since_the_renewal() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    for backend in backends(&redis) {
        let (limiter, operator) = backend.pair(&Ctx::new(Algorithm::FixedWindow), INTERVAL);
        // Leased in a burst; the operator resets the tenant, and another instance spends 5 in
        // the state written after it.
        let svc = refunding_with_a_lease_held(&limiter, quota).await;
        operator.reset("hot").await.unwrap();
        let after = operator.check_quotas(target(), &quotas, 5).await;
        assert!(after.is_allowed(), "{backend}");
        let before = limiter.lease_stats();
        assert!(before.held > 0, "{backend}: no lease held: {before:?}");
        let status = status_of(&svc, call(503, false)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{backend}");
        limiter.flush_settlements().await;
        assert_eq!(limiter.stats().settle_failures, 0, "{backend}");
        // The refund ends the lease: its give-back ends too.
        while limiter.lease_stats().held > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let after = limiter.lease_stats();
        assert_eq!(after.spent, before.spent + 1, "{backend}: {after:?}");
        // What renewals took after the reset (a background one at low water) and give-backs
        // returned there are the state's own.
        let (renewed, returned) = renewed_and_returned(&before, &after);
        let left = store_left(&operator, &quotas).await;
        assert_eq!(
            left + renewed,
            CAPACITY - 5 + returned,
            "{backend}: a unit leased before the reset was refunded into the state after it \
             (renewed since {renewed}, returned {returned}); {after:?}"
        );
    }
}

/// The control: a request answered from a lease and refunded within the renewal's window gives
/// its unit back there, on Redis's clock and on a client clock, on Redis and in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_lands_in_the_renewals_window() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(CAPACITY).unwrap();
    let quotas = Quotas::from(quota);
    // The middle of an hour.
    let manual = ManualClock::new(Duration::from_secs(1_700_004_600));
    for clock in [Clock::default(), Clock::Manual(manual)] {
        for backend in backends(&redis) {
            let ctx = Ctx::new(Algorithm::FixedWindow).clock(clock.clone());
            redis.flushall();
            let (limiter, other) = backend.pair(&ctx, INTERVAL);
            let svc = refunding_with_a_lease_held(&limiter, quota).await;
            let status = status_of(&svc, call(503, false)).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{backend}");
            limiter.flush_settlements().await;
            while limiter.lease_stats().held > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let stats = limiter.lease_stats();
            let left = store_left(&other, &quotas).await;
            assert_eq!(
                left + stats.leased,
                CAPACITY + stats.returned + 1,
                "{backend} {clock:?}: the refund of a unit answered from the lease did not land \
                 in its renewal's window; {stats:?}"
            );
        }
    }
}
