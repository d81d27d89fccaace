//! How a lease-answered request's settlement is dated, directly on the limiter (docs/leases.md "A
//! settlement is dated by the renewal", docs/modes.md): its refund reaches the window and the
//! reset epoch its renewal was charged to, or nothing (lost, stranded), never a later window nor
//! the state written after a reset made since the renewal. Every algorithm that leases, on a
//! client `ManualClock` and on the store's clock, on Redis and on the memory store.

use std::time::Duration;

use redlimit::clock::{Clock, ManualClock};
use redlimit::limiter::Reserved;
use redlimit::store::MemoryStore;
use redlimit::{Algorithm, Limiter, Quota, Quotas};

use super::settle::{store_left, target};
use super::{renewed_and_returned, Backend, INTERVAL, LEASING};
use crate::support::{Ctx, RedisServer};

/// A day's quota: leases of up to 100 units, and no refill worth a unit within a test.
const CAPACITY: u64 = 1_000;

/// The leasing limiter and a plain one (another instance, or an operator's process) on one
/// store: Redis (flushed) or a fresh memory store.
fn pair(
    backend: &str,
    redis: &RedisServer,
    algorithm: Algorithm,
    clock: &Clock,
) -> (Limiter, Limiter) {
    let ctx = Ctx::new(algorithm).clock(clock.clone());
    let backend = match backend {
        "redis" => {
            redis.flushall();
            Backend::Redis(redis)
        }
        _ => Backend::Memory(MemoryStore::new()),
    };
    backend.pair(&ctx, INTERVAL)
}

/// One case of [`assert_every_case`].
struct Case {
    /// Its name: the algorithm, the store, the clock.
    what: String,
    clock: Clock,
    /// The leasing limiter, its lease of the key holding units.
    limiter: Limiter,
    /// A plain limiter on the same store.
    other: Limiter,
    /// A day's quota of `CAPACITY`.
    quotas: Quotas,
}

/// Runs `case` for every leasing algorithm, clock and store (see [`pair`]), once the leasing
/// limiter's lease of the key holds units and the clock moved on; asserts that no case failed
/// (a case returns its failure).
async fn assert_every_case(redis: &RedisServer, mut case: impl AsyncFnMut(Case) -> Option<String>) {
    let quotas = Quotas::from(Quota::per_day(CAPACITY).unwrap());
    let mut failures = Vec::new();
    for algorithm in LEASING {
        for clock in clocks() {
            for backend in ["redis", "memory"] {
                let what = format!("{algorithm} {backend} {clock:?}");
                let (limiter, other) = pair(backend, redis, algorithm, &clock);
                lease_held(&limiter, &quotas, &what).await;
                tick(&clock);
                let leased = Case {
                    what,
                    clock: clock.clone(),
                    limiter,
                    other,
                    quotas,
                };
                failures.extend(case(leased).await);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Checks of cost 1 until `limiter`'s lease of the key holds units.
async fn lease_held(limiter: &Limiter, quotas: &Quotas, what: &str) -> u64 {
    for _ in 0..400 {
        let verdict = limiter.check_quotas(target(), quotas, 1).await;
        assert!(verdict.is_allowed(), "{what}: {verdict:?}");
    }
    // The background renewals end.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let held = limiter.lease_stats().held;
    assert!(
        held > 0,
        "{what}: no lease held: {:?}",
        limiter.lease_stats()
    );
    held
}

/// Until `limiter` holds no lease units (a refund ends the lease; its give-back ends too).
pub(crate) async fn leases_ended(limiter: &Limiter) {
    for _ in 0..400 {
        if limiter.lease_stats().held == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the lease never ended: {:?}", limiter.lease_stats());
}

/// A request answered by `limiter` (from its lease), its unit reserved; `what` names the case.
async fn answered_from_the_lease(limiter: &Limiter, quotas: &Quotas, what: &str) -> Reserved {
    let (verdict, reserved) = limiter.check_reserving(target(), quotas, 1).await;
    assert!(verdict.is_allowed(), "{what}");
    reserved
}

/// Refunds the request's unit, then waits until the lease the refund ends is given back.
async fn refunded_in_full(limiter: &Limiter, quotas: &Quotas, reserved: Reserved) {
    limiter
        .refund_reserved(target(), quotas, 1, reserved)
        .await
        .unwrap();
    leases_ended(limiter).await;
}

/// Checks of cost 1 through `limiter` until one is denied; asserts after each admission that
/// at most `bound` were admitted (`past` says what more means). Returns how many were.
async fn admitted_until_denied(limiter: &Limiter, quotas: &Quotas, bound: u64, past: &str) -> u64 {
    let mut admitted = 0;
    while limiter.check_quotas(target(), quotas, 1).await.is_allowed() {
        admitted += 1;
        assert!(admitted <= bound, "{past}");
    }
    admitted
}

/// Moves a manual clock on by 1 ms (the steps of a test happen at distinct times).
fn tick(clock: &Clock) {
    if let Clock::Manual(manual) = clock {
        manual.advance(Duration::from_millis(1));
    }
}

/// The clocks tested: the store's, and a client clock in the middle of a day.
fn clocks() -> [Clock; 2] {
    let manual = ManualClock::new(Duration::from_secs(1_700_006_400 + 43_200));
    [Clock::default(), Clock::Manual(manual)]
}

/// A lease renewed; an operator's reset (another process: this instance learns of it at its
/// next renewal); another instance spends 5 after it; a request answered from the lease
/// (`check_reserving`) is refunded in full. The refund (and the give-back of the lease it ends)
/// must give nothing of what was leased before the reset to the state written after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_never_lands_after_a_reset_for_every_algorithm_and_clock() {
    let redis = RedisServer::start();
    assert_every_case(&redis, async |case| {
        let Case {
            other: operator,
            what,
            clock,
            limiter,
            quotas,
        } = case;
        operator.reset("hot").await.unwrap();
        tick(&clock);
        let after = operator.check_quotas(target(), &quotas, 5).await;
        assert!(after.is_allowed(), "{what}");
        tick(&clock);
        let before = limiter.lease_stats();
        let reserved = answered_from_the_lease(&limiter, &quotas, &what).await;
        assert_eq!(limiter.lease_stats().spent, before.spent + 1, "{what}");
        tick(&clock);
        refunded_in_full(&limiter, &quotas, reserved).await;
        let after = limiter.lease_stats();
        // What renewals took after the reset (a background one at low water) and give-backs
        // returned there are the state's own.
        let (renewed, returned) = renewed_and_returned(&before, &after);
        let left = store_left(&operator, &quotas).await;
        if left + renewed != CAPACITY - 5 + returned {
            return Some(format!(
                "{what}: left {left}, renewed since {renewed}, returned {returned}: \
                 {} unit(s) leased before the reset landed after it; {after:?}",
                (left + renewed) as i64 - (CAPACITY - 5 + returned) as i64
            ));
        }
        None
    })
    .await;
}

/// The control: without a reset, the refund of a request answered from the lease lands in the
/// renewal's state (every algorithm, both clocks, both stores); so the test above tells a
/// refund kept out from one never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_lands_in_its_renewals_state_for_every_algorithm_and_clock() {
    let redis = RedisServer::start();
    assert_every_case(&redis, async |case| {
        let Case {
            other,
            what,
            clock,
            limiter,
            quotas,
        } = case;
        let reserved = answered_from_the_lease(&limiter, &quotas, &what).await;
        tick(&clock);
        refunded_in_full(&limiter, &quotas, reserved).await;
        let stats = limiter.lease_stats();
        let left = store_left(&other, &quotas).await;
        if left + stats.leased != CAPACITY + stats.returned + 1 {
            return Some(format!("{what}: left {left}; {stats:?}"));
        }
        None
    })
    .await;
}

/// Client clock, fixed windows of 1 s: a request answered from a lease 1 ms before W's end is
/// refunded in W+1, after another instance charged W+1 in full. Its units were W's: W+1 must
/// get nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_made_in_the_next_window_gives_it_nothing_client_clock() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_second(CAPACITY).unwrap());
    let boundary = Duration::from_secs(1_700_000_000);
    for backend in ["redis", "memory"] {
        let manual = ManualClock::new(boundary - Duration::from_millis(5));
        let clock = Clock::Manual(manual.clone());
        let (limiter, other) = pair(backend, &redis, Algorithm::FixedWindow, &clock);
        lease_held(&limiter, &quotas, backend).await;
        manual.set(boundary - Duration::from_millis(1));
        let before = limiter.lease_stats();
        let reserved = answered_from_the_lease(&limiter, &quotas, backend).await;
        assert_eq!(limiter.lease_stats().spent, before.spent + 1, "{backend}");
        // A background renewal it started ends in W (one sent in W+1 would take W+1's units).
        tokio::time::sleep(Duration::from_millis(20)).await;
        manual.set(boundary + Duration::from_millis(1));
        let full = other.try_check_quotas(target(), &quotas, CAPACITY).await;
        assert!(full.unwrap().allowed, "{backend}: W+1 admits its 1 000");
        refunded_in_full(&limiter, &quotas, reserved).await;
        let left = store_left(&other, &quotas).await;
        assert_eq!(left, 0, "{backend}: W+1 got {left} back of W's units");
    }
}

/// Redis loses its data (`FLUSHALL`) between the renewal and the settlement: the key starts
/// fresh, and the docs allow at most a fresh quota plus the units held at the loss. The refund
/// of a request answered from the lease after it never raises the key above its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_after_a_flushall_never_raises_the_key_above_capacity() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_day(CAPACITY).unwrap());
    for algorithm in LEASING {
        for clock in clocks() {
            let what = format!("{algorithm} {clock:?}");
            let (limiter, other) = pair("redis", &redis, algorithm, &clock);
            let held = lease_held(&limiter, &quotas, &what).await;
            tick(&clock);
            redis.flushall();
            tick(&clock);
            let reserved = answered_from_the_lease(&limiter, &quotas, &what).await;
            tick(&clock);
            refunded_in_full(&limiter, &quotas, reserved).await;
            let left = store_left(&other, &quotas).await;
            assert!(
                left <= CAPACITY,
                "{what}: {left} left after a FLUSHALL, held {held}"
            );
            // The fresh state admits at most its quota (the units held at the loss aside).
            let past = format!("{what}: the fresh key admitted past {CAPACITY}");
            admitted_until_denied(&other, &quotas, CAPACITY, &past).await;
        }
    }
}

/// Redis is killed while a lease holds units (no persistence): a request answered from the
/// lease while Redis is down is admitted (its units were paid for); Redis restarts empty and
/// the request's refund lands in the fresh state, or fails and is counted. Either way the key
/// never has more than its capacity, and the fresh state admits at most its quota plus the
/// units held at the loss (docs/leases.md, "After a data loss").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_answered_refund_across_a_redis_restart_never_raises_the_key_above_capacity() {
    let mut redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_day(CAPACITY).unwrap());
    for algorithm in LEASING {
        let clock = Clock::default();
        let (limiter, other) = pair("redis", &redis, algorithm, &clock);
        let held = lease_held(&limiter, &quotas, &algorithm.to_string()).await;
        redis.stop();
        let (verdict, reserved) = limiter.check_reserving(target(), &quotas, 1).await;
        assert!(
            verdict.is_allowed(),
            "{algorithm}: a unit held was not spent: {verdict:?}"
        );
        redis.restart();
        let refunded = limiter
            .refund_reserved(target(), &quotas, 1, reserved)
            .await;
        limiter.release_leases().await;
        let left = store_left(&other, &quotas).await;
        assert!(
            left <= CAPACITY,
            "{algorithm}: {left} left after a restart, held {held}"
        );
        // The docs' bound after a loss: a fresh quota plus the units held at it. A give-back
        // of the lease's units (started when the refund ended the lease) may land in the fresh
        // state while the loop below runs.
        let past = format!(
            "{algorithm}: the fresh key admitted past {CAPACITY} + the {held} held at the loss"
        );
        let admitted = admitted_until_denied(&other, &quotas, CAPACITY + held, &past).await;
        assert!(
            admitted >= CAPACITY,
            "{algorithm}: the fresh key admitted only {admitted}"
        );
        println!(
            "{algorithm}: refund {refunded:?}, left {left}, {:?}",
            limiter.lease_stats()
        );
    }
}
