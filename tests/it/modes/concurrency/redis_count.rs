//! What Redis counts in a key's slots set (its `ZCARD`) after the set is replaced by another
//! type, after acquisitions dropped at random points, and after an acquisition made while Redis
//! sleeps past the timeout: exactly the slots held, within one renewal period.

use std::time::{Duration, Instant};

use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};

use crate::support::{Ctx, RedisServer, Rng};

async fn zcard(redis: &RedisServer, key: &str) -> u64 {
    let mut conn = redis.conn();
    redis::cmd("ZCARD").arg(key).query(&mut conn).unwrap_or(0)
}

/// Waits up to 3 s for Redis to count no slot of `k` for `slots`: the count then, and the wait.
async fn emptied_within_3s(redis: &RedisServer, slots: &ConcurrencyLimiter) -> (u64, Duration) {
    let key = slots.slots_key("k");
    let started = Instant::now();
    let mut count = zcard(redis, &key).await;
    while count > 0 && started.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        count = zcard(redis, &key).await;
    }
    (count, started.elapsed())
}

/// Hostile input: a slots sorted set replaced by a string, a list or a hash while two slots
/// are held: within one renewal period (plus a round trip) the key counts the held slots
/// again, and no acquisition beyond N is admitted after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_slots_key_replaced_by_another_type_counts_held_slots_again() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(900);
    let slots =
        ConcurrencyLimiter::with_options(Ctx::default().redis(&redis), 2, lease, "p").unwrap();
    for kind in ["string", "list", "hash"] {
        let key = format!("k-{kind}");
        let (SlotOutcome::Acquired(a), SlotOutcome::Acquired(b)) =
            (slots.acquire(&key).await, slots.acquire(&key).await)
        else {
            panic!("two slots")
        };
        let skey = slots.slots_key(&key);
        let mut conn = redis.conn();
        let _: () = redis::cmd("DEL").arg(&skey).query(&mut conn).unwrap();
        let _: () = match kind {
            "string" => redis::cmd("SET")
                .arg(&skey)
                .arg("junk")
                .query(&mut conn)
                .unwrap(),
            "list" => redis::cmd("RPUSH")
                .arg(&skey)
                .arg("a")
                .arg("b")
                .query(&mut conn)
                .unwrap(),
            _ => redis::cmd("HSET")
                .arg(&skey)
                .arg("f")
                .arg("v")
                .query(&mut conn)
                .unwrap(),
        };
        tokio::time::sleep(lease / 3 + Duration::from_millis(400)).await;
        let count = zcard(&redis, &skey).await;
        eprintln!("slots key replaced by a {kind}: ZCARD {count} one renewal period later");
        assert_eq!(
            count, 2,
            "{kind}: ZCARD {count} with 2 held, one renewal period later"
        );
        let third = slots.acquire(&key).await;
        assert!(
            matches!(third, SlotOutcome::Full { .. }),
            "{kind}: a third slot of N = 2: {third:?}"
        );
        drop((a, b));
    }
}

/// Cancellation: `acquire` futures dropped at random tiny timeouts, some during a `DEBUG SLEEP`
/// past the store timeout, N = 1 and the default 30 s lease. Afterwards no slot is held, so
/// within a bound (the release task's retries) the key is free again: no ghost slot keeps a
/// 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_acquire_dropped_at_random_points_leaves_no_ghost_slot() {
    let redis = RedisServer::start();
    let ctx = Ctx {
        timeout: Duration::from_millis(100),
        ..Ctx::default()
    };
    let slots = ConcurrencyLimiter::new(ctx.redis(&redis), 1).unwrap();
    let mut rng = Rng(0xA5A5_1234_5678_9ABC);
    let mut sleeps = Vec::new();
    let (mut acquired, mut dropped, mut failed) = (0, 0, 0);
    for i in 0..300 {
        if i % 60 == 30 {
            sleeps.push(redis.debug_sleep(Duration::from_millis(150)));
        }
        let us = rng.next() % 1_500;
        match tokio::time::timeout(Duration::from_micros(us), slots.acquire("k")).await {
            Ok(SlotOutcome::Acquired(slot)) => {
                acquired += 1;
                if rng.next().is_multiple_of(3) {
                    tokio::task::yield_now().await;
                }
                drop(slot);
            }
            Ok(SlotOutcome::Full { .. }) => {}
            Ok(_) => failed += 1,
            Err(_) => dropped += 1,
        }
    }
    for s in sleeps {
        RedisServer::awake(s).await;
    }
    let (count, took) = emptied_within_3s(&redis, &slots).await;
    eprintln!(
        "acquire drops: acquired {acquired}, dropped {dropped}, failed {failed}; ZCARD {count} after {took:?}"
    );
    assert_eq!(
        count, 0,
        "a ghost slot 3 s after the last acquire (acquired {acquired}, dropped {dropped}, failed {failed})"
    );
    assert!(matches!(slots.acquire("k").await, SlotOutcome::Acquired(_)));
}

/// Slow Redis: `acquire` while Redis sleeps past the store timeout answers within the timeout
/// (plus load), and the slots it may have taken are free again once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_acquire_during_a_debug_sleep_answers_within_the_timeout_and_frees_its_slots() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let ctx = Ctx {
        timeout,
        ..Ctx::default()
    };
    let slots = ConcurrencyLimiter::new(ctx.redis(&redis), 3).unwrap();
    assert!(matches!(
        slots.acquire("warm").await,
        SlotOutcome::Acquired(_)
    ));
    let sleeping = redis.debug_sleep(Duration::from_millis(600));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let timed = futures::future::join_all((0..20).map(|_| {
        let slots = slots.clone();
        async move {
            let s = Instant::now();
            let outcome = slots.acquire("k").await;
            (s.elapsed(), matches!(outcome, SlotOutcome::Acquired(_)))
        }
    }))
    .await;
    let slowest = timed.iter().map(|(t, _)| *t).max().unwrap();
    let acquired = timed.iter().filter(|(_, a)| *a).count();
    RedisServer::awake(sleeping).await;
    let (count, took) = emptied_within_3s(&redis, &slots).await;
    eprintln!(
        "acquire in a sleep: slowest {slowest:?}, acquired {acquired}; ZCARD {count} {took:?} after Redis answered"
    );
    assert!(
        slowest <= timeout + Duration::from_millis(400),
        "an acquire took {slowest:?}"
    );
    assert_eq!(
        count, 0,
        "slots of failed acquisitions still held 3 s after Redis answered"
    );
}
