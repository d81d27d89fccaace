//! Concurrency slots when Redis misbehaves: it loses them (`FLUSHALL`), it stalls past the
//! timeout (`DEBUG SLEEP`) while a slot is being taken or given back, an acquisition is dropped
//! in the middle of its call, or an instance's client clock runs ahead. In each case the key
//! must be back to counting exactly the slots held, within the documented bound.

use std::time::{Duration, Instant};

use redlimit::clock::ManualClock;
use redlimit::concurrency::{ConcurrencyLimiter, Slot, SlotOutcome};
use redlimit::store::CircuitBreaker;

use crate::support::{Ctx, RedisServer};

/// The members of `slots`'s sorted set for `key`, as Redis counts them.
fn zcard(redis: &RedisServer, slots: &ConcurrencyLimiter, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(slots.slots_key(key))
        .query(&mut redis.conn())
        .unwrap()
}

/// Waits for `sleeper` (a `DEBUG SLEEP`) without blocking the runtime.
async fn join(sleeper: std::thread::JoinHandle<()>) {
    tokio::task::spawn_blocking(move || sleeper.join())
        .await
        .unwrap()
        .unwrap();
}

/// Acquires `key` on `slots` until a slot is taken or `within` has passed: how long it took, or
/// the last refusal.
async fn acquired_within(
    slots: &ConcurrencyLimiter,
    key: &str,
    within: Duration,
) -> Result<Duration, SlotOutcome> {
    let started = Instant::now();
    loop {
        match slots.acquire(key).await {
            SlotOutcome::Acquired(_) => return Ok(started.elapsed()),
            outcome if started.elapsed() >= within => return Err(outcome),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The lease of [`both_slots_lost`]'s instances.
const LEASE: Duration = Duration::from_millis(600);

/// Two instances of 2 slots a key in `scope` on a private Redis, with leases of [`LEASE`]; the
/// first takes both slots of `k`, then Redis loses every slot (`FLUSHALL`). The slots, still
/// held.
async fn both_slots_lost(scope: &str) -> (RedisServer, [ConcurrencyLimiter; 2], [Slot; 2]) {
    let redis = RedisServer::start();
    let [holder, other] = super::two_instances(&redis, 2, LEASE, scope);
    let (SlotOutcome::Acquired(a), SlotOutcome::Acquired(b)) =
        (holder.acquire("k").await, holder.acquire("k").await)
    else {
        panic!("two slots")
    };
    redis.flushall();
    (redis, [holder, other], [a, b])
}

/// Redis loses every slot (`FLUSHALL`) while 2 of N = 2 are held: the holder puts them back at
/// its next renewal (a third of the 600 ms lease), so the key counts 2 again and a new
/// acquisition is refused instead of running 4 at once.
#[tokio::test]
async fn slots_lost_by_redis_are_put_back_at_the_next_renewal() {
    let (redis, [holder, other], [_a, _b]) = both_slots_lost("lost").await;
    let lost = Instant::now();
    // Generous: 5 renewal periods on a loaded machine.
    let counted = counted(&redis, &holder, "k", 2, LEASE * 5 / 3).await;
    eprintln!(
        "slots lost by FLUSHALL: ZCARD {counted} after {:?} (2 held, renewal every {:?})",
        lost.elapsed(),
        LEASE / 3
    );
    assert_eq!(counted, 2, "ZCARD {counted} with 2 slots held");
    match other.acquire("k").await {
        SlotOutcome::Full { wait } => assert!(wait <= LEASE, "{wait:?}"),
        outcome => panic!("3 in flight with a limit of 2: {outcome:?}"),
    }
}

/// Waits until `slots` counts `n` for `key`, or `within` has passed: what it counts then.
async fn counted(
    redis: &RedisServer,
    slots: &ConcurrencyLimiter,
    key: &str,
    n: u64,
    within: Duration,
) -> u64 {
    let started = Instant::now();
    loop {
        let counted = zcard(redis, slots, key);
        if counted == n || started.elapsed() >= within {
            return counted;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The transient bound after a loss: slots taken while the key counted nothing stay, the lost
/// ones are put back beside them (the key over N), nobody is admitted until requests end, and
/// the key then counts exactly the slots held.
#[tokio::test]
async fn a_slot_put_back_over_the_limit_stays_until_requests_end() {
    let (redis, [holder, other], [a, _b]) = both_slots_lost("over").await;
    // Before the next renewal (usually): the key counts nothing, the other instance takes 2.
    let mut taken = Vec::new();
    while let SlotOutcome::Acquired(slot) = other.acquire("k").await {
        taken.push(slot);
    }
    let over = 2 + taken.len() as u64;
    let after_renewal = counted(&redis, &holder, "k", over, LEASE * 5 / 3).await;
    eprintln!(
        "after FLUSHALL: {} taken meanwhile, then ZCARD {after_renewal} (limit 2)",
        taken.len()
    );
    assert_eq!(after_renewal, over);
    assert!(matches!(other.acquire("k").await, SlotOutcome::Full { .. }));
    drop(taken);
    assert_eq!(counted(&redis, &holder, "k", 2, LEASE).await, 2);
    assert!(matches!(other.acquire("k").await, SlotOutcome::Full { .. }));
    drop(a);
    assert_eq!(counted(&redis, &holder, "k", 1, LEASE).await, 1);
    assert!(matches!(other.acquire("k").await, SlotOutcome::Acquired(_)));
}

/// Once Redis wakes from `sleeper`'s sleep, the slot of `k` that `what` (an acquire that never
/// answered) may have taken is given back within 5 s, not one 30 s lease later.
async fn given_back_once_redis_answers(
    sleeper: std::thread::JoinHandle<()>,
    slots: &ConcurrencyLimiter,
    what: &str,
) {
    join(sleeper).await;
    let freed = acquired_within(slots, "k", Duration::from_secs(5)).await;
    eprintln!("the slot of {what}: {freed:?} after Redis answered (lease 30 s)");
    freed.unwrap_or_else(|outcome| panic!("the slot of {what} is still taken: {outcome:?}"));
}

/// An acquisition that times out (Redis in `DEBUG SLEEP` past the 100 ms timeout) may have taken
/// its slot: it is given back as soon as Redis answers again, not one 30 s lease later.
#[tokio::test]
async fn a_timed_out_acquire_gives_its_slot_back_once_redis_answers() {
    let redis = RedisServer::start();
    let ctx = Ctx::default().timeout(Duration::from_millis(100));
    let slots = ConcurrencyLimiter::new(ctx.redis(&redis), 1).unwrap();
    // Connected first: the timed-out call reaches Redis.
    drop(slots.acquire("warm-up").await);
    let sleeper = redis.debug_sleep(Duration::from_millis(400));
    let outcome = slots.acquire("k").await;
    assert!(
        matches!(
            outcome,
            SlotOutcome::FailedOpen | SlotOutcome::FailedClosed { .. }
        ),
        "{outcome:?}"
    );
    given_back_once_redis_answers(sleeper, &slots, "a timed-out acquire").await;
}

/// An acquisition dropped while its call is in flight (Redis asleep, the timeout not reached,
/// as `tower::timeout` or a client disconnect drops it): its slot, taken once Redis runs the
/// call, is given back.
#[tokio::test]
async fn a_dropped_acquire_gives_its_slot_back() {
    let redis = RedisServer::start();
    let slots = ConcurrencyLimiter::new(Ctx::default().redis(&redis), 1).unwrap();
    drop(slots.acquire("warm-up").await);
    let sleeper = redis.debug_sleep(Duration::from_millis(500));
    let dropped = tokio::time::timeout(Duration::from_millis(100), slots.acquire("k")).await;
    assert!(dropped.is_err(), "the acquire finished during the sleep");
    given_back_once_redis_answers(sleeper, &slots, "a dropped acquire").await;
}

/// A slot dropped while its release cannot reach Redis (the circuit breaker open after a
/// timeout) is still given back, once Redis can be reached again.
#[tokio::test]
async fn a_slot_dropped_while_redis_is_unreachable_is_given_back_later() {
    let redis = RedisServer::start();
    let ctx = Ctx::default()
        .timeout(Duration::from_millis(100))
        .breaker(CircuitBreaker {
            failure_threshold: 1,
            cool_down: Duration::from_secs(1),
        });
    let slots = ConcurrencyLimiter::new(ctx.redis(&redis), 1).unwrap();
    let SlotOutcome::Acquired(slot) = slots.acquire("k").await else {
        panic!("a slot")
    };
    // One timed-out call opens the circuit for 1 s.
    let sleeper = redis.debug_sleep(Duration::from_millis(300));
    drop(slots.acquire("trip").await);
    join(sleeper).await;
    drop(slot);
    let other = ConcurrencyLimiter::new(Ctx::default().redis(&redis), 1).unwrap();
    let freed = acquired_within(&other, "k", Duration::from_secs(6)).await;
    eprintln!("a slot dropped behind an open circuit: freed {freed:?} later (lease 30 s)");
    freed.expect("the dropped slot is still taken");
}

/// An instance whose client clock runs a minute ahead (more than the 5 s lease) does not evict
/// another instance's live slot: slots are timed by Redis's clock.
#[tokio::test]
async fn a_client_clock_ahead_does_not_evict_live_slots() {
    let redis = RedisServer::start();
    let lease = Duration::from_secs(5);
    let on_time =
        ConcurrencyLimiter::with_options(Ctx::default().redis(&redis), 1, lease, "skew").unwrap();
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let ahead = ManualClock::new(since_epoch + Duration::from_secs(60));
    let skewed = ConcurrencyLimiter::with_options(
        Ctx::default().manual(&ahead).redis(&redis),
        1,
        lease,
        "skew",
    )
    .unwrap();
    let SlotOutcome::Acquired(_held) = on_time.acquire("k").await else {
        panic!("a slot")
    };
    let outcome = skewed.acquire("k").await;
    eprintln!(
        "a clock 60 s ahead: {outcome:?}, ZCARD {}",
        zcard(&redis, &on_time, "k")
    );
    assert!(
        matches!(outcome, SlotOutcome::Full { .. }),
        "2 in flight with a limit of 1: {outcome:?}"
    );
}

/// 300 slots held on one key renew in one call per key and round, not one call per slot: over
/// a second (5 rounds at most, a third of the 600 ms lease apart) Redis sees a few calls.
#[tokio::test]
async fn slots_of_a_key_renew_in_one_call() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(600);
    let slots = ConcurrencyLimiter::with_options(Ctx::default().redis(&redis), 1000, lease, "bulk")
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..300 {
        let SlotOutcome::Acquired(slot) = slots.acquire("k").await else {
            panic!("a slot")
        };
        held.push(slot);
    }
    redis.reset_stats();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    eprintln!("300 slots on one key: {calls} script calls in 1 s of renewals");
    assert!(calls <= 10, "{calls} script calls in 1 s");
    assert_eq!(zcard(&redis, &slots, "k"), 300);
}

/// A restart without persistence loses the slots and the connection: the holder's renewals
/// reconnect and put its slots back within one renewal period of Redis answering again (a
/// third of the lease, plus that round's call), not a period later.
#[tokio::test]
async fn slots_lost_by_a_restart_are_put_back_within_one_renewal_period() {
    let mut redis = RedisServer::start();
    let lease = Duration::from_millis(1_500);
    let holder =
        ConcurrencyLimiter::with_options(Ctx::default().redis(&redis), 2, lease, "restart")
            .unwrap();
    let (SlotOutcome::Acquired(_a), SlotOutcome::Acquired(_b)) =
        (holder.acquire("k").await, holder.acquire("k").await)
    else {
        panic!("two slots")
    };
    redis.restart();
    let back = Instant::now();
    let count = counted(&redis, &holder, "k", 2, lease * 2).await;
    let took = back.elapsed();
    eprintln!(
        "slots lost by a restart: ZCARD {count} after {took:?} (renewal every {:?})",
        lease / 3
    );
    assert_eq!(
        count, 2,
        "ZCARD {count} with 2 slots held, {took:?} after the restart"
    );
    // One renewal period, plus a generous round trip on a loaded machine (a reconnection).
    assert!(
        took <= lease / 3 + Duration::from_millis(400),
        "the slots came back {took:?} after Redis answered again, renewal every {:?}",
        lease / 3
    );
}
