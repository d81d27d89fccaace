//! The give-back and refund promises of docs/leases.md ("so it never lands in another window,
//! nor in the state written after a reset made anywhere since") and docs/modes.md (settlement
//! refunds): an operator's reset from a limiter of its own, under clocks ahead of or behind the
//! leasing instance's, on real Redis and on the `MemoryStore` (they must agree); a refund Redis
//! runs late; corrupt reset stamps; dropped refunds.

use super::{
    asleep_until_half_into_the_next_second, backends, early_in_a_second, leasing_on, INTERVAL,
    LEASING,
};
use crate::support;

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use redlimit::clock::{Clock, ManualClock};
use redlimit::limiter::{LeaseStats, Leases};
use redlimit::store::{MemoryStore, RefundRequest, ReservedAt, Store, StoreExt};
use redlimit::{Algorithm, Limiter, Quota, Quotas};
use support::{Ctx, RedisServer};

/// The middle of an hour: every per-hour window in these tests is far from its end.
const T0: Duration = Duration::from_secs(1_700_004_600);
const CAPACITY: u64 = 1_000;
fn quotas() -> Quotas {
    Quotas::from(Quota::per_hour(CAPACITY).unwrap())
}

fn clock_at(at: Duration) -> Clock {
    Clock::Manual(ManualClock::new(at))
}

fn plain(store: impl Store, algorithm: Algorithm, clock: Clock) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .clock(clock)
        .build()
        .unwrap()
}

async fn remaining(limiter: &Limiter, key: &str) -> u64 {
    let peek = limiter.try_check_quotas(key, &quotas(), 0).await;
    peek.expect("the store decides").remaining
}

/// Admits requests of 1 on `key` until its lease holds units; returns the units it holds.
async fn hold(limiter: &Limiter, key: &str) -> u64 {
    let quotas = quotas();
    let start = limiter.lease_stats().held;
    for _ in 0..400 {
        assert!(limiter.check_quotas(key, &quotas, 1).await.is_allowed());
        let held = limiter.lease_stats().held;
        if held > start {
            return held - start;
        }
    }
    panic!("no lease after 400 requests: {:?}", limiter.lease_stats());
}

/// Where the operator's clock stands against the leasing instance's.
#[derive(Debug, Clone, Copy)]
enum Operator {
    /// No client clocks: the store's own (Redis TIME, the MemoryStore's system clock).
    StoreClock,
    /// A client clock this many ms ahead (+) of or behind (-) the instance's.
    Offset(i64),
}

/// Instance A leases `key`; an operator's limiter of its own resets the tenant; instance B (no
/// leases) then spends 5 in the state written after the reset; A gives its lease back. Returns
/// B's remaining before and after the give-back, A's lease stats, and what the same give-back
/// did on a key nobody reset (the control: the test sees a give-back that lands).
async fn give_back_after_reset<S: Store>(
    mk: impl Fn() -> S,
    algorithm: Algorithm,
    operator: Operator,
) -> ((u64, u64), LeaseStats, (u64, u64)) {
    let (a_clock, o_clock, b_clock) = match operator {
        Operator::StoreClock => (Clock::default(), Clock::default(), Clock::default()),
        Operator::Offset(ms) => {
            let o = if ms >= 0 {
                T0 + Duration::from_millis(ms.unsigned_abs())
            } else {
                T0 - Duration::from_millis(ms.unsigned_abs())
            };
            (clock_at(T0), clock_at(o), clock_at(T0))
        }
    };
    let a = leasing_on(mk(), algorithm, a_clock);
    let o = plain(mk(), algorithm, o_clock);
    let b = plain(mk(), algorithm, b_clock);
    hold(&a, "reset-me").await;
    o.reset("reset-me").await.unwrap();
    assert!(b.check_quotas("reset-me", &quotas(), 5).await.is_allowed());
    let before = remaining(&b, "reset-me").await;
    // The control: a key nobody reset gets its lease back.
    let held = hold(&a, "kept").await;
    let kept_before = remaining(&b, "kept").await;
    a.release_leases().await;
    let after = remaining(&b, "reset-me").await;
    let kept_after = remaining(&b, "kept").await;
    assert!(held > 0);
    ((before, after), a.lease_stats(), (kept_before, kept_after))
}

async fn assert_give_back_stays_out_after_reset<S: Store>(
    mk: impl Fn() -> S,
    store: &str,
    operator: Operator,
) {
    for algorithm in LEASING {
        let ((before, after), stats, (kept_before, kept_after)) =
            give_back_after_reset(&mk, algorithm, operator).await;
        eprintln!("{store} {algorithm} {operator:?}: {before} -> {after}; {stats:?}");
        assert!(
            kept_after > kept_before,
            "{store} {algorithm} {operator:?}: the control key's give-back did not land \
             ({kept_before} -> {kept_after}); the probe cannot see one"
        );
        assert_eq!(
            after, before,
            "{store} {algorithm} {operator:?}: a lease taken before the operator's reset was \
             given back into the state written after it: B's remaining {before} -> {after}; \
             {stats:?}"
        );
    }
}

/// The operator's clock behind the instance's by less than `MAX_SKEW`, equal, and ahead (the
/// instance's behind), and no client clocks at all: the give-back never reaches the state
/// written after the reset, on Redis as on the MemoryStore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_give_back_never_lands_after_an_operators_reset_redis_and_memory() {
    let redis = RedisServer::start();
    let memory = MemoryStore::new();
    let operators = [
        Operator::StoreClock,
        Operator::Offset(0),
        Operator::Offset(-3_000),
        Operator::Offset(-4_999),
        Operator::Offset(10_000),
        Operator::Offset(600_000),
    ];
    for operator in operators {
        assert_give_back_stays_out_after_reset(
            || Ctx::default().redis_store(&redis),
            "redis",
            operator,
        )
        .await;
        redis.flushall();
        assert_give_back_stays_out_after_reset(|| memory.clone(), "memory", operator).await;
    }
}

/// A reset exactly at a fixed window's start, the lease taken in the same µs: the give-back
/// (reserved at the reset's time) goes nowhere, on Redis as on the MemoryStore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_reset_exactly_at_a_window_start_then_give_back() {
    let redis = RedisServer::start();
    let start = Duration::from_secs(1_700_002_800); // an hour's start
    for store in backends(&redis) {
        let at_start = || Ctx::new(Algorithm::FixedWindow).clock(clock_at(start));
        let (a, o) = store.pair(&at_start(), INTERVAL);
        let b = store.plain(&at_start());
        hold(&a, "edge").await;
        o.reset("edge").await.unwrap();
        assert!(b.check_quotas("edge", &quotas(), 5).await.is_allowed());
        let before = remaining(&b, "edge").await;
        a.release_leases().await;
        let after = remaining(&b, "edge").await;
        assert_eq!(
            after,
            before,
            "{store}: a give-back reserved at the reset's µs landed: {before} -> {after}; {:?}",
            a.lease_stats()
        );
    }
}

/// A refund after `check_reserving` that Redis runs late (`DEBUG SLEEP` across a window's end, the
/// limiter's timeout long enough to wait): reserved in window W, it must not give units to
/// window W+1, which a check queued before it on the same connection has charged in full.
/// docs/modes.md: "It gives the units back only to the window they were charged to".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_refund_run_late_by_redis_never_reaches_the_next_window() {
    let redis = RedisServer::start();
    let limiter = Ctx::new(Algorithm::FixedWindow)
        .timeout(Duration::from_secs(5))
        .redis(&redis);
    let quotas = Quotas::from(Quota::per_second(10).unwrap());
    let key = "late";
    // Reserve early in a second (window W), so the steps below end well inside it.
    early_in_a_second(&redis, 300);
    let (check, reserved) = limiter.check_reserving(key, &quotas, 8).await;
    assert!(check.is_allowed());
    // Redis sleeps until half a second into the next window.
    let sleeper = asleep_until_half_into_the_next_second(&redis).await;
    // Queued first on the limiter's connection: a check of the whole next window.
    let next = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.try_check_quotas(key, &quotas, 10).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    limiter
        .refund_reserved(key, &quotas, 5, reserved)
        .await
        .unwrap();
    let next = next.await.unwrap().unwrap();
    sleeper.join().unwrap();
    assert!(next.allowed, "the next window admits its 10: {next:?}");
    let left = limiter.try_check_quotas(key, &quotas, 0).await.unwrap();
    assert_eq!(
        left.remaining, 0,
        "units reserved in window W were given to window W+1 (it admitted its 10, then got \
         {} back)",
        left.remaining
    );
}

/// The tenant's controls string of `key` (its reset stamp from byte 10 on, with no override).
fn tenant_key(limiter: &Limiter, key: &str) -> String {
    let [_, tenant] = redlimit::test_hooks::control_keys(&limiter.storage_key(key));
    tenant
}

/// A corrupt reset stamp in the tenant's string (a NaN, a value past 2^53, random bytes):
/// refunds never raise a tier above its capacity (asserted), and a reset made afterwards
/// still resets (returned: the failures).
async fn corrupt_reset_stamp(redis: &RedisServer) -> Vec<String> {
    let corrupt: [(&str, Vec<u8>); 4] = [
        ("nan", f64::NAN.to_le_bytes().to_vec()),
        ("huge", 1e300f64.to_le_bytes().to_vec()),
        ("2^60", (2f64.powi(60)).to_le_bytes().to_vec()),
        (
            "random",
            vec![0xA7, 0x13, 0xFF, 0x00, 0x5C, 0xE1, 0x7F, 0xF0],
        ),
    ];
    let mut failures = Vec::new();
    for algorithm in LEASING {
        for (name, bytes) in &corrupt {
            let clock = ManualClock::new(T0);
            let limiter = Ctx::new(algorithm).manual(&clock).redis(redis);
            let key = format!("corrupt-{name}");
            let quotas = quotas();
            limiter.reset(key.as_str()).await.unwrap();
            let tenant = tenant_key(&limiter, &key);
            let _: () = redis::cmd("SETRANGE")
                .arg(&tenant)
                .arg(10)
                .arg(&bytes[..])
                .query(&mut redis.conn())
                .unwrap();
            clock.advance(Duration::from_millis(1));
            let reserved = limiter.mark_reservation();
            assert!(limiter
                .check_quotas(key.as_str(), &quotas, 7)
                .await
                .is_allowed());
            limiter
                .refund_reserved(key.as_str(), &quotas, 1_000, reserved)
                .await
                .unwrap();
            let after_refund = remaining(&limiter, &key).await;
            assert!(
                after_refund <= CAPACITY,
                "{algorithm} {name}: a refund raised the tier above its capacity: {after_refund}"
            );
            assert!(limiter
                .check_quotas(key.as_str(), &quotas, 7)
                .await
                .is_allowed());
            clock.advance(Duration::from_millis(1));
            limiter.reset(key.as_str()).await.unwrap();
            let after_reset = remaining(&limiter, &key).await;
            if after_reset != CAPACITY {
                failures.push(format!(
                    "{algorithm} {name}: after a reset {after_reset} of {CAPACITY} remain"
                ));
            }
        }
    }
    failures
}

/// Refunds over a corrupt reset stamp never raise a tier above its capacity.
#[tokio::test]
async fn probe_corrupt_reset_stamp_refunds_stay_within_capacity() {
    let redis = RedisServer::start();
    corrupt_reset_stamp(&redis).await;
}

/// A reset made over a corrupt reset stamp forgets the tenant's usage, as any reset does.
#[tokio::test]
async fn probe_a_reset_over_a_corrupt_reset_stamp_still_resets() {
    let redis = RedisServer::start();
    let failures = corrupt_reset_stamp(&redis).await;
    assert!(
        failures.is_empty(),
        "a reset made over a corrupt reset stamp did not reset:\n{}",
        failures.join("\n")
    );
}

/// `FLUSHALL` between the lease and its give-back: the give-back lands in the state written
/// after the flush (nothing tells it the flush happened), never above the capacity, and the
/// key admits at most a fresh quota plus the units held at the loss (docs/leases.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_flushall_between_lease_and_give_back_stays_within_capacity() {
    let redis = RedisServer::start();
    for algorithm in LEASING {
        let a = leasing_on(Ctx::default().redis_store(&redis), algorithm, clock_at(T0));
        let b = plain(Ctx::default().redis_store(&redis), algorithm, clock_at(T0));
        let held = hold(&a, "flushed").await;
        redis.flushall();
        assert!(b.check_quotas("flushed", &quotas(), 5).await.is_allowed());
        a.release_leases().await;
        let after = remaining(&b, "flushed").await;
        let stats = a.lease_stats();
        eprintln!("{algorithm}: held {held}, after the flush and give-back {after}; {stats:?}");
        assert!(after <= CAPACITY, "{algorithm}: above capacity: {after}");
        // docs/leases.md, after a data loss: at most a fresh quota plus the units held at the
        // loss, each once (B's 5 are admitted, `after` more can be).
        assert!(
            5 + after <= CAPACITY + held,
            "{algorithm}: {} admissible after the loss, more than {CAPACITY} + {held} held",
            5 + after
        );
        assert_eq!(
            stats.leased,
            stats.spent + stats.held + stats.returned + stats.stranded
        );
    }
}

/// Polls `fut` `n` times (yielding between polls so its I/O can move), then drops it.
async fn poll_then_drop<F: Future + Unpin>(mut fut: F, n: usize) -> bool {
    for _ in 0..n {
        if (&mut fut).now_or_never().is_some() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

/// A settlement's refund dropped after 0, 1, 2, … polls, then the clock moves to the next
/// window and a check takes it all: whatever of the refund reached the store, nothing of it
/// lands in the next window, on Redis as on the MemoryStore.
#[tokio::test]
async fn probe_refund_dropped_at_every_poll_never_reaches_the_next_window() {
    let redis = RedisServer::start();
    for store in ["redis", "memory"] {
        for n in 0..8 {
            let clock = ManualClock::new(T0);
            let ctx = Ctx::new(Algorithm::FixedWindow).manual(&clock);
            let limiter = match store {
                "redis" => ctx.redis(&redis),
                _ => ctx.memory(),
            };
            let quotas = Quotas::from(Quota::per_hour(10).unwrap());
            let key = format!("dropped-{n}");
            let reserved = limiter.mark_reservation();
            assert!(limiter
                .check_quotas(key.as_str(), &quotas, 8)
                .await
                .is_allowed());
            let refund = Box::pin(limiter.refund_reserved(key.as_str(), &quotas, 5, reserved));
            let done = poll_then_drop(refund, n).await;
            clock.advance(Duration::from_secs(3_600));
            assert!(limiter
                .check_quotas(key.as_str(), &quotas, 10)
                .await
                .is_allowed());
            tokio::time::sleep(Duration::from_millis(30)).await;
            let left = limiter.try_check_quotas(key.as_str(), &quotas, 0).await;
            assert_eq!(
                left.unwrap().remaining,
                0,
                "{store}: a refund dropped after {n} polls (done: {done}) reached the next window"
            );
        }
    }
}

/// A refund whose reservation time is in the future of every clock (hostile or corrupt): the
/// fixed window's goes nowhere (no window holds that time), the others never above capacity,
/// and Redis and the MemoryStore agree.
#[tokio::test]
#[ignore = "defect: the MemoryStore looks the key up at the refund's claimed time (expired a \
            year on) and gives nothing; Redis gives the token bucket and GCRA their units"]
async fn probe_refund_reserved_in_the_future_redis_and_memory_agree() {
    let redis = RedisServer::start();
    let memory = MemoryStore::new();
    let redis_store = Ctx::default().redis_store(&redis);
    for algorithm in LEASING {
        let mut seen = Vec::new();
        for store in ["redis", "memory"] {
            let clock = ManualClock::new(T0);
            let ctx = Ctx::new(algorithm).manual(&clock);
            let (limiter, raw): (Limiter, &dyn Store) = match store {
                "redis" => (ctx.limiter(redis_store.clone()), &redis_store),
                _ => (ctx.limiter(memory.clone()), &memory),
            };
            let quotas = quotas();
            let key = format!("future-{algorithm}");
            limiter.reset(key.as_str()).await.unwrap();
            clock.advance(Duration::from_millis(1));
            assert!(limiter
                .check_quotas(key.as_str(), &quotas, 600)
                .await
                .is_allowed());
            let storage_key = limiter.storage_key(key.as_str());
            let future_us = (T0 + Duration::from_secs(86_400 * 365)).as_micros() as u64;
            raw.refund(RefundRequest {
                key: &storage_key,
                algorithm,
                quotas: &quotas,
                units: 400,
                reserved: ReservedAt::Client(future_us),
            })
            .await
            .unwrap();
            let left = remaining(&limiter, &key).await;
            assert!(left <= CAPACITY, "{store} {algorithm}: {left}");
            if algorithm == Algorithm::FixedWindow {
                assert_eq!(left, CAPACITY - 600, "{store}: a future window got units");
            }
            seen.push(left);
        }
        assert_eq!(seen[0], seen[1], "{algorithm}: redis and memory disagree");
    }
}

/// The same for a lease's give-back: a fixed window's lease taken early in window W, given
/// back while Redis sleeps past W's end, behind a check that charges window W+1 in full on the
/// same connection. docs/leases.md: the give-back "never lands in another window".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "defect: a give-back Redis runs late lands in the next fixed window (age measured at send)"]
async fn probe_give_back_run_late_by_redis_never_reaches_the_next_window() {
    let redis = RedisServer::start();
    let limiter = Limiter::builder(Ctx::default().redis_store(&redis))
        .algorithm(Algorithm::FixedWindow)
        .leases(Leases::new(Duration::from_millis(50)))
        .build()
        .unwrap();
    let quotas = Quotas::from(Quota::per_second(1_000).unwrap());
    let key = "late-lease";
    early_in_a_second(&redis, 200);
    let mut held = 0;
    for _ in 0..400 {
        assert!(limiter.check_quotas(key, &quotas, 1).await.is_allowed());
        held = limiter.lease_stats().held;
        if held > 0 {
            break;
        }
    }
    assert!(held > 0, "{:?}", limiter.lease_stats());
    let sleeper = asleep_until_half_into_the_next_second(&redis).await;
    // Not leased (`try_check_quotas`): queued first on the limiter's connection.
    let next = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.try_check_quotas(key, &quotas, 1_000).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    limiter.release_leases().await;
    let next = next.await.unwrap().unwrap();
    sleeper.join().unwrap();
    assert!(next.allowed, "window W+1 admits its 1000: {next:?}");
    let left = limiter.try_check_quotas(key, &quotas, 0).await.unwrap();
    assert_eq!(
        left.remaining,
        0,
        "{held} units leased in window W went back to window W+1 (it admitted its 1000, then \
         got {} back); {:?}",
        left.remaining,
        limiter.lease_stats()
    );
}

/// A lease that an operator's reset (another limiter's) made unreturnable: its give-back goes
/// nowhere, so its units are stranded, not returned. docs/leases.md: "Units that cannot go
/// back are counted in `LeaseStats::stranded`".
#[tokio::test]
async fn probe_units_refused_after_an_operators_reset_count_as_stranded() {
    let redis = RedisServer::start();
    for store in backends(&redis) {
        let at_t0 = || Ctx::new(Algorithm::TokenBucket).clock(clock_at(T0));
        let (a, o) = (store.leasing(&at_t0(), INTERVAL), store.plain(&at_t0()));
        let held = hold(&a, "refused").await;
        o.reset("refused").await.unwrap();
        a.release_leases().await;
        let stats = a.lease_stats();
        assert!(
            stats.stranded >= held && stats.returned == 0,
            "{store}: {held} units held at the reset, none went back: {stats:?}"
        );
    }
}

/// How units reserved on Redis's clock come to be given back.
#[derive(Debug, Clone, Copy)]
enum Reserver {
    /// A settling layer's request (cost 200, settled to 0 after its response).
    Settlement,
    /// A lease, given back by `release_leases`.
    Lease,
    /// `Limiter::check_reserving` (cost 200), then `refund_reserved` of all of it.
    Direct,
}

/// Redis sleeps this long with the give-back queued behind it.
const STALL: Duration = Duration::from_millis(400);

/// A reservation on Redis's clock on `key` (by `reserver`), then an operator's reset of the
/// tenant and B's 5 in the state written after it; then the give-back reaches Redis late, queued
/// behind `DEBUG SLEEP`. Returns B's remaining before and after the give-back.
async fn late_give_back_after_reset(
    redis: &RedisServer,
    algorithm: Algorithm,
    reserver: Reserver,
    key: &'static str,
) -> (u64, u64) {
    let operator = Ctx::new(algorithm).redis(redis);
    let b = Ctx::new(algorithm).redis(redis);
    // The route the units went to (the layer's is scoped by its policy).
    let target = || match reserver {
        Reserver::Settlement => redlimit::Target::scoped("api", key),
        _ => redlimit::Target::from(key),
    };
    let spent = Quotas::from(Quota::per_hour(CAPACITY).unwrap());
    let left = || async {
        let peek = b.try_check_quotas(target(), &spent, 0).await;
        peek.expect("the store decides").remaining
    };
    // B's 5 after the reset, and what B sees left.
    let after_reset = || async {
        operator.reset(key).await.unwrap();
        assert!(b.check_quotas(target(), &spent, 5).await.is_allowed());
        left().await
    };
    let stall = || {
        let sleeper = redis.debug_sleep(STALL);
        std::thread::sleep(Duration::from_millis(30));
        sleeper
    };
    match reserver {
        Reserver::Settlement => {
            use http::{Request, Response};
            use tower::{Layer, ServiceExt};
            let a = Ctx::new(algorithm).redis(redis);
            let (entered, entered_rx) = tokio::sync::oneshot::channel::<()>();
            let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
            let channels = std::sync::Arc::new(std::sync::Mutex::new(Some((entered, go_rx))));
            let layer = redlimit::RateLimitLayer::builder(
                a.clone(),
                Quota::per_hour(CAPACITY).unwrap(),
                redlimit::key::GlobalKey::new(key),
            )
            .policy_name("api")
            .cost(|_| 200)
            .cost_from_response(|_| 0)
            .build()
            .unwrap();
            let svc = layer.layer(tower::service_fn(move |_: Request<()>| {
                let (entered, go) = channels.lock().unwrap().take().expect("one request");
                async move {
                    entered.send(()).unwrap();
                    go.await.unwrap();
                    Ok::<_, std::convert::Infallible>(Response::new(()))
                }
            }));
            let response = tokio::spawn(svc.oneshot(Request::new(())));
            entered_rx.await.unwrap();
            let before = after_reset().await;
            let sleeper = stall();
            go.send(()).unwrap();
            assert!(response.await.unwrap().unwrap().status().is_success());
            a.flush_settlements().await;
            sleeper.join().unwrap();
            assert_eq!(a.stats().settle_failures, 0);
            (before, left().await)
        }
        Reserver::Lease => {
            let a = Limiter::builder(Ctx::default().redis_store(redis))
                .algorithm(algorithm)
                .leases(Leases::new(Duration::from_secs(5)))
                .build()
                .unwrap();
            hold(&a, key).await;
            let before = after_reset().await;
            let sleeper = stall();
            a.release_leases().await;
            sleeper.join().unwrap();
            (before, left().await)
        }
        Reserver::Direct => {
            let a = Ctx::new(algorithm).redis(redis);
            let (verdict, reserved) = a.check_reserving(key, &spent, 200).await;
            assert!(verdict.is_allowed());
            let before = after_reset().await;
            let sleeper = stall();
            a.refund_reserved(key, &spent, 200, reserved).await.unwrap();
            sleeper.join().unwrap();
            (before, left().await)
        }
    }
}

/// On Redis's clock, units reserved before an operator's reset never come back after it, however
/// late Redis runs their give-back: a settlement's refund, a lease's give-back and
/// `refund_reserved` after `check_reserving` each carry the time Redis admitted them, not an
/// age that a stalled Redis would turn into a time after the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_redis_runs_late_never_lands_after_a_reset() {
    let redis = RedisServer::start();
    for algorithm in LEASING {
        for (reserver, key) in [
            (Reserver::Settlement, "late-settled"),
            (Reserver::Lease, "late-leased"),
            (Reserver::Direct, "late-direct"),
        ] {
            let (before, after) =
                late_give_back_after_reset(&redis, algorithm, reserver, key).await;
            assert_eq!(
                after, before,
                "{algorithm} {reserver:?}: units reserved before the reset were given back after \
                 it: B's remaining {before} -> {after}"
            );
            redis.flushall();
        }
    }
}
