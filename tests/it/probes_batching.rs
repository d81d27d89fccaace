//! Probes of the Redis store's batching (`src/store/redis/batch.rs`, `lua/batch.lua`): each
//! attacks one of its promises (a decision batched is decided as it would be alone, within its
//! own timeout, at most once, and no queue waits for a call that will never end). A probe that
//! holds stays as a regression test; a probe that fails names the promise it breaks.

use crate::support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{
    CheckRequest, CircuitBreaker, RedisStore, Store, StoreError, DEFAULT_MAX_BATCH,
};
use redlimit::{Algorithm, Decision, Quota, Quotas};
use support::{RedisCluster, RedisServer};

/// A quota nothing in these probes exhausts unless it says so.
fn generous() -> Quotas {
    Quota::per_hour(1_000).unwrap().into()
}

fn request<'a>(key: &'a str, quotas: &'a Quotas, algorithm: Algorithm) -> CheckRequest<'a> {
    CheckRequest {
        key,
        algorithm,
        quotas,
        cost: 1,
        now_micros: None,
    }
}

/// `count` keys of their own, `redlimit:{<prefix>-<i>}`.
fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| format!("redlimit:{{{prefix}-{i}}}"))
        .collect()
}

/// An answer as text, to compare two stores' answers or print one.
fn text(answer: &Result<Decision, StoreError>) -> String {
    match answer {
        Ok(decision) => format!("{decision:?}"),
        Err(error) => format!("error: {error}"),
    }
}

/// Tries one decision on `key` up to `attempts` times, a moment apart, and returns the first
/// that Redis decided, or every error seen. A new runtime's first call may meet a connection
/// that an older runtime's shutdown dropped, which the store replaces by itself.
async fn decided_within(
    store: &RedisStore,
    key: &str,
    attempts: usize,
) -> Result<Decision, Vec<String>> {
    let quotas = generous();
    let mut errors = Vec::new();
    for _ in 0..attempts {
        let started = Instant::now();
        match store
            .check(request(key, &quotas, Algorithm::TokenBucket))
            .await
        {
            Ok(decision) => return Ok(decision),
            Err(error) => errors.push(format!("{error} after {:?}", started.elapsed())),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(errors)
}

/// A runtime that shuts down while a full queue's call is in flight (the sender task of that
/// call dropped with the runtime, never finishing) must not leave the group's call counted as
/// in flight for good: a store outlives a runtime (a test's, an application's that restarts its
/// runtime), and the next runtime's decisions must reach Redis.
#[test]
fn a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    assert_eq!(store.max_batch(), DEFAULT_MAX_BATCH, "batching on by default");
    let first = support::current_thread_runtime();
    let sleeping = first.block_on(async {
        store.verify().await.expect("Redis is up");
        let sleeping = redis.debug_sleep(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(30)).await;
        // One call alone on the wire, then a full queue behind it (sent at once by a task).
        for (i, key) in keys("shutdown", DEFAULT_MAX_BATCH + 1).into_iter().enumerate() {
            let store = store.clone();
            tokio::spawn(async move {
                let quotas = generous();
                let _ = store
                    .check(request(&key, &quotas, Algorithm::TokenBucket))
                    .await;
            });
            if i == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        sleeping
    });
    // Every task is dropped with the runtime, while Redis still sleeps.
    drop(first);
    sleeping.join().unwrap();
    redis.reset_stats();

    let second = support::current_thread_runtime();
    let decided = second.block_on(decided_within(&store, "redlimit:{after-shutdown}", 10));
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    assert!(
        decided.is_ok(),
        "after a runtime shut down with a full queue in flight, no decision of the next \
         runtime reached Redis ({calls} script calls): {decided:?}"
    );
}

/// A first call whose future is dropped outside any runtime (a future kept in a struct that a
/// plain thread drops) must still hand its queue on: the decisions queued behind it are then
/// decided by Redis, not failed, and the group is not left with a call in flight for good.
#[test]
fn a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(1000))
        .build()
        .unwrap();
    let runtime = support::current_thread_runtime();
    runtime.block_on(store.verify()).expect("Redis is up");
    let quotas = generous();
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(30));
    let mut first = Box::pin(store.check(request(
        "redlimit:{dropped-outside}",
        &quotas,
        Algorithm::TokenBucket,
    )));
    let queued = runtime.block_on(async {
        // The first call goes on the wire and waits behind the sleep.
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut first)
            .await
            .is_err());
        let queued: Vec<_> = keys("behind-dropped", 5)
            .into_iter()
            .map(|key| {
                let store = store.clone();
                tokio::spawn(async move {
                    let quotas = generous();
                    store
                        .check(request(&key, &quotas, Algorithm::TokenBucket))
                        .await
                })
            })
            .collect();
        // They queue behind the first call.
        tokio::time::sleep(Duration::from_millis(20)).await;
        queued
    });
    // Outside the runtime: no `Handle::try_current()`.
    drop(first);
    let answers: Vec<String> = runtime
        .block_on(join_all(queued))
        .into_iter()
        .map(|answer| text(&answer.expect("the task ran")))
        .collect();
    sleeping.join().unwrap();
    let later = runtime.block_on(decided_within(&store, "redlimit:{later}", 3));
    for answer in &answers {
        assert!(
            !answer.starts_with("error"),
            "the decisions queued behind a first call dropped outside the runtime: {answers:?}; \
             the next decisions: {later:?}"
        );
    }
    assert!(later.is_ok(), "the next decisions: {later:?}");
}

/// On Cluster, while a slot migrates, a decision on keys of which some exist and some do not is
/// refused with `TRYAGAIN` and taken in the split form. A decision queued behind a call of its
/// slot must be decided so too, whether it shares the next call with others or goes in it
/// alone.
#[tokio::test]
async fn on_cluster_a_decision_queued_in_a_migrating_slot_is_still_decided() {
    let cluster = RedisCluster::start();
    let store = support::Ctx::default().cluster_store(&cluster);
    store.verify().await.unwrap();
    let quotas = generous();
    let keys = [
        "redlimit:{mig}:lead",
        "redlimit:{mig}:a",
        "redlimit:{mig}:b",
        "redlimit:{mig}:c",
    ];
    // Each key's state exists and its tenant's key does not: while the slot migrates the
    // decision script is refused on them (TRYAGAIN, multiple keys during rehashing).
    for key in keys {
        let decision = store
            .check(request(key, &quotas, Algorithm::Gcra))
            .await
            .unwrap();
        assert!(decision.allowed);
    }
    let slot = cluster.slot_of(keys[0]);
    let from = cluster.node_for_key(keys[0]);
    let to = (from + 1) % cluster.nodes().len();
    cluster.begin_slot_migration(slot, from, to);
    // Two decisions queued (they share the next call), then one alone in it.
    for queued in [&keys[1..3], &keys[3..4]] {
        let sleeping = cluster.nodes()[from].debug_sleep(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let leader = store.check(request(keys[0], &quotas, Algorithm::Gcra));
        let followers = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            join_all(
                queued
                    .iter()
                    .map(|key| store.check(request(key, &quotas, Algorithm::Gcra))),
            )
            .await
        };
        let (leader, followers) = tokio::join!(leader, followers);
        sleeping.join().unwrap();
        assert!(leader.unwrap().allowed, "the first call, alone");
        for (key, answer) in queued.iter().zip(followers) {
            let decision = answer.unwrap_or_else(|e| {
                panic!(
                    "{key}, queued with {} other(s) in the migrating slot: {e}",
                    queued.len() - 1
                )
            });
            assert!(decision.allowed, "{key}");
        }
    }
    cluster.finish_slot_migration(slot, from, to);
}

/// Adds `count` members with old scores (1..=count µs after the epoch) to the sorted set `key`:
/// a sliding log whose next admission removes them all, which takes Redis a while.
fn fill_old_log(redis: &RedisServer, key: &str, count: u64) {
    let fill = redis::Script::new(
        "local from, to = tonumber(ARGV[1]), tonumber(ARGV[2]) \
         for i = from, to, 500 do \
           local members = {} \
           for j = i, math.min(i + 499, to) do \
             members[#members + 1] = j; members[#members + 1] = j \
           end \
           redis.call('ZADD', KEYS[1], unpack(members)) \
         end \
         return redis.call('ZCARD', KEYS[1])",
    );
    let mut conn = redis.conn();
    let chunk = 250_000;
    let mut from = 1;
    while from <= count {
        let to = (from + chunk - 1).min(count);
        let _: u64 = fill
            .key(key)
            .arg(from)
            .arg(to)
            .invoke(&mut conn)
            .expect("ZADD");
        from = to + 1;
    }
}

/// A decision's timeout counts from when it was queued: a batch refused before it ran (one
/// key's `NOPERM`) sends each decision again alone, and that second call must not restart the
/// clock. Here the batch is refused near the end of the timeout and the decision alone is slow
/// (a sliding log with a million old entries to remove): its caller must still hear within
/// about the timeout, as it would have without batching.
#[tokio::test]
async fn a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout() {
    let redis = RedisServer::start();
    let mut admin = redis.conn();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limiter")
        .arg("on")
        .arg(">pw")
        .arg("resetkeys")
        .arg("~redlimit:{ok*")
        .arg("+@all")
        .query(&mut admin)
        .unwrap();
    let timeout = Duration::from_millis(300);
    let store = RedisStore::builder(format!("redis://limiter:pw@127.0.0.1:{}/", redis.port()))
        .timeout(timeout)
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let slow = "redlimit:{ok-slow}";
    fill_old_log(&redis, slow, 1_000_000);
    let quotas = generous();
    let sleeping = redis.debug_sleep(Duration::from_millis(250));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let leader = store.check(request("redlimit:{ok-first}", &quotas, Algorithm::Gcra));
    let followers = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let timed = |request: CheckRequest<'static>| {
            let store = &store;
            async move {
                let started = Instant::now();
                let answer = store.check(request).await;
                (request.key, answer, started.elapsed())
            }
        };
        let quotas: &'static Quotas = Box::leak(Box::new(generous()));
        tokio::join!(
            timed(request("redlimit:{refused}", quotas, Algorithm::Gcra)),
            timed(request(slow, quotas, Algorithm::SlidingLog)),
        )
    };
    let (leader, (refused, slow)) = tokio::join!(leader, followers);
    sleeping.join().unwrap();
    assert!(leader.is_ok(), "the first call: {leader:?}");
    let heard: Vec<String> = [&refused, &slow]
        .iter()
        .map(|(key, answer, elapsed)| format!("{key}: {} after {elapsed:?}", text(answer)))
        .collect();
    for (key, _, elapsed) in [&refused, &slow] {
        assert!(
            *elapsed <= timeout + Duration::from_millis(150),
            "{key} was queued, its batch refused (NOPERM), then sent alone: its caller heard \
             after {elapsed:?}, past the timeout of {timeout:?}: {heard:?}"
        );
    }
}
