//! Probes of the Redis store's batching (`src/store/redis/batch.rs`, `lua/batch.lua`): each
//! attacks one of its promises (a decision batched is decided as it would be alone, within its
//! own timeout, at most once, and no queue waits for a call that will never end). A probe that
//! holds stays as a regression test; a probe that fails names the promise it breaks.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::batching::{generous, request};
use futures::future::join_all;
use redlimit::store::{
    CheckRequest, CircuitBreaker, RedisStore, Store, StoreError, DEFAULT_MAX_BATCH,
};
use redlimit::{Algorithm, Decision, Quota, Quotas};
use support::{RedisCluster, RedisServer};

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
    a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_with(DEFAULT_MAX_BATCH);
}

/// The same on a store that never batches (the control: it holds).
#[test]
fn a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_unbatched() {
    a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_with(1);
}

fn a_runtime_shut_down_with_a_full_queue_in_flight_leaves_the_store_usable_with(max_batch: usize) {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(500))
        .max_batch(max_batch)
        .build()
        .unwrap();
    let first = support::current_thread_runtime();
    let sleeping = first.block_on(async {
        store.verify().await.expect("Redis is up");
        let sleeping = redis.debug_sleep(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(30)).await;
        // One call alone on the wire, then a full queue behind it (sent at once by a task).
        for (i, key) in keys("shutdown", DEFAULT_MAX_BATCH + 1)
            .into_iter()
            .enumerate()
        {
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
    a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_with(DEFAULT_MAX_BATCH);
}

/// The same on a store that never batches (the control: it holds).
#[test]
fn a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_unbatched() {
    a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_with(1);
}

fn a_first_call_dropped_outside_a_runtime_still_hands_its_queue_on_with(max_batch: usize) {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(1000))
        .max_batch(max_batch)
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
    on_cluster_a_decision_queued_in_a_migrating_slot_is_still_decided_with(DEFAULT_MAX_BATCH).await;
}

/// The same on a store that never batches (the control: it holds).
#[tokio::test]
async fn on_cluster_a_decision_queued_in_a_migrating_slot_is_still_decided_unbatched() {
    on_cluster_a_decision_queued_in_a_migrating_slot_is_still_decided_with(1).await;
}

async fn on_cluster_a_decision_queued_in_a_migrating_slot_is_still_decided_with(max_batch: usize) {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(max_batch)
        .build()
        .unwrap();
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
    while cluster.migrate_keys(slot, from, to, 10) > 0 {}
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
    a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout_with(DEFAULT_MAX_BATCH)
        .await;
}

/// The same on a store that never batches (the control: it holds).
#[tokio::test]
async fn a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout_unbatched() {
    a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout_with(1).await;
}

async fn a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout_with(
    max_batch: usize,
) {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let store = support::store_limited_to(&redis, "redlimit:{ok*", timeout, max_batch);
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
    // The first call's own answer is no matter here (without batching, Redis writes it only
    // after the slow decision sent behind it on the same connection).
    println!("the first call: {}", text(&leader));
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

/// Holds Redis for `sleep`, then sends `first` (alone, behind the sleep) and, once it is on the
/// wire, every request of `rest` (queued behind it, in order); `during` runs on a thread of its
/// own while Redis sleeps. Answers in the order given, `first`'s first.
async fn behind_a_sleep(
    redis: &RedisServer,
    store: &RedisStore,
    sleep: Duration,
    first: CheckRequest<'_>,
    rest: &[CheckRequest<'_>],
) -> Vec<Result<Decision, StoreError>> {
    store.verify().await.expect("Redis is up");
    let sleeping = redis.debug_sleep(sleep);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let leader = store.check(first);
    let followers = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        join_all(rest.iter().map(|request| store.check(*request))).await
    };
    let (first, rest) = tokio::join!(leader, followers);
    let _ = sleeping.join();
    std::iter::once(first).chain(rest).collect()
}

/// One queue mixing every algorithm (the sliding log's 3 keys beside the others' 2), two
/// tiers, cost-0 peeks, a cost above any burst, the same key several times, and hostile stored
/// bytes on some keys (a string of garbage, a hash, a string where the sliding log keeps its
/// set, garbage in a tenant's key): each decision answers exactly what the same requests sent
/// one by one without batching answer, on a second server with the same data and the same
/// client clock.
#[tokio::test]
async fn a_mixed_queue_decides_each_decision_as_it_would_alone() {
    let batched_redis = RedisServer::start();
    let alone_redis = RedisServer::start();
    // The whole queue in one call, so that it runs in the order given (decisions in calls
    // that overlap have no order between them, as concurrent calls never had).
    let batched = RedisStore::builder(batched_redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(256)
        .build()
        .unwrap();
    let alone = RedisStore::builder(alone_redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(1)
        .build()
        .unwrap();
    for redis in [&batched_redis, &alone_redis] {
        let mut conn = redis.conn();
        let _: () = redis::pipe()
            .cmd("SET")
            .arg("redlimit:{garbage}")
            .arg(&b"\xff\x00\x07garbage bytes"[..])
            .ignore()
            .cmd("HSET")
            .arg("redlimit:{hash}")
            .arg("f")
            .arg("v")
            .ignore()
            .cmd("SET")
            .arg("redlimit:{log-string}")
            .arg("not a sorted set")
            .ignore()
            .cmd("SET")
            .arg("redlimit:{tenant-garbage}#t")
            .arg(&b"M\x01\x02"[..])
            .ignore()
            .query(&mut conn)
            .unwrap();
    }
    let tight: Quotas = Quota::per_hour(3).unwrap().into();
    let tiers = Quotas::new([Quota::per_hour(4).unwrap(), Quota::per_minute(2).unwrap()]).unwrap();
    let now = Some(1_700_000_000_123_456);
    let plan: Vec<(&str, Algorithm, &Quotas, u64)> = vec![
        ("redlimit:{mix-tb}", Algorithm::TokenBucket, &tight, 1),
        ("redlimit:{mix-log}", Algorithm::SlidingLog, &tight, 1),
        ("redlimit:{mix-gcra}", Algorithm::Gcra, &tiers, 1),
        ("redlimit:{mix-fw}", Algorithm::FixedWindow, &tight, 0),
        ("redlimit:{mix-sw}", Algorithm::SlidingWindow, &tight, 2),
        ("redlimit:{mix-log2}", Algorithm::SlidingLog, &tiers, 1),
        ("redlimit:{mix-huge}", Algorithm::Gcra, &tight, u64::MAX),
        (
            "redlimit:{mix-huge-log}",
            Algorithm::SlidingLog,
            &tight,
            1 << 40,
        ),
        ("redlimit:{garbage}", Algorithm::TokenBucket, &tight, 1),
        ("redlimit:{hash}", Algorithm::Gcra, &tight, 1),
        ("redlimit:{log-string}", Algorithm::SlidingLog, &tight, 1),
        (
            "redlimit:{tenant-garbage}",
            Algorithm::FixedWindow,
            &tight,
            1,
        ),
        ("redlimit:{mix-fw}", Algorithm::FixedWindow, &tight, 1),
        ("redlimit:{mix-tb}", Algorithm::TokenBucket, &tight, 0),
    ];
    let requests: Vec<CheckRequest<'_>> = (0..4)
        .flat_map(|_| plan.iter())
        .map(|&(key, algorithm, quotas, cost)| CheckRequest {
            key,
            algorithm,
            quotas,
            cost,
            now_micros: now,
        })
        .collect();
    batched_redis.reset_stats();
    let answers = behind_a_sleep(
        &batched_redis,
        &batched,
        Duration::from_millis(300),
        requests[0],
        &requests[1..],
    )
    .await;
    let calls = batched_redis.command_calls("evalsha") + batched_redis.command_calls("eval");
    assert!(
        calls < requests.len() as u64 / 2,
        "the queue shared calls: {calls} calls for {} decisions",
        requests.len()
    );
    let mut expected = Vec::new();
    for request in &requests {
        expected.push(alone.check(*request).await);
    }
    for (i, (request, (got, want))) in requests
        .iter()
        .zip(answers.iter().zip(&expected))
        .enumerate()
    {
        assert_eq!(
            text(got),
            text(want),
            "decision {i} ({} {} cost {}): batched, then alone",
            request.key,
            request.algorithm,
            request.cost
        );
    }
}

/// Callers that go away anywhere (an outer timeout, a `select!` that takes another branch, an
/// aborted task), while queued or while their call is in flight, and a Redis that sleeps past
/// the store's timeout meanwhile: each decision runs at most once (never twice), each caller
/// that stays hears within the timeout, and afterwards the queue is not stuck (a lone decision
/// goes alone, at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_dropped_anywhere_run_at_most_once_and_leave_no_queue_stuck() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(150);
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let keys = keys("drop", 400);
    let mut rng = fastrand::Rng::with_seed(31);
    let started = Instant::now();
    let sleeper = {
        let client = redis.client();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let sleeping = support::debug_sleep_via(&client, Duration::from_millis(250));
            tokio::task::spawn_blocking(move || sleeping.join())
                .await
                .unwrap()
                .unwrap();
        })
    };
    let mut tasks = Vec::new();
    for key in &keys {
        let (store, key) = (store.clone(), key.clone());
        let (kind, arrive, cut) = (rng.u8(0..4), rng.u64(0..500), rng.u64(0..200));
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(arrive)).await;
            let quotas = generous();
            let check = store.check(request(&key, &quotas, Algorithm::TokenBucket));
            let sent = Instant::now();
            let answer = match kind {
                1 => tokio::time::timeout(Duration::from_millis(cut), check)
                    .await
                    .ok(),
                2 => tokio::select! {
                    answer = check => Some(answer),
                    _ = tokio::time::sleep(Duration::from_millis(cut)) => None,
                },
                _ => Some(check.await),
            };
            answer.map(|answer| (answer, sent.elapsed()))
        });
        let abort = (kind == 3).then(|| {
            let handle = task.abort_handle();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(arrive + cut)).await;
                handle.abort();
            })
        });
        tasks.push((task, abort));
    }
    let mut answers = Vec::new();
    for (task, _) in tasks {
        answers.push(task.await.ok().flatten());
    }
    sleeper.await.unwrap();
    println!("{} decisions over {:?}", keys.len(), started.elapsed());
    let quotas = generous();
    let mut consumed = Vec::new();
    for key in &keys {
        let peek = store
            .check(CheckRequest {
                cost: 0,
                ..request(key, &quotas, Algorithm::TokenBucket)
            })
            .await
            .unwrap();
        consumed.push(1_000 - peek.remaining);
    }
    let (mut heard, mut ran) = (0, 0);
    for ((key, answer), consumed) in keys.iter().zip(&answers).zip(&consumed) {
        assert!(*consumed <= 1, "{key} ran {consumed} times");
        ran += consumed;
        if let Some((answer, elapsed)) = answer {
            heard += 1;
            assert!(
                *elapsed <= timeout + Duration::from_millis(100),
                "{key}: heard after {elapsed:?} ({})",
                text(answer)
            );
            match answer {
                Ok(decision) => {
                    assert!(decision.allowed, "{key}");
                    assert_eq!(*consumed, 1, "{key} was admitted, so it ran");
                }
                Err(StoreError::Timeout(_)) => {}
                Err(error) => panic!("{key}: only a timeout may fail a decision here: {error}"),
            }
        }
    }
    println!("{heard} callers heard, {ran} decisions ran");
    redis.reset_stats();
    let lone = Instant::now();
    let decision = store
        .check(request(
            "redlimit:{after-drops}",
            &quotas,
            Algorithm::TokenBucket,
        ))
        .await
        .unwrap();
    assert!(decision.allowed);
    assert!(
        lone.elapsed() < Duration::from_millis(100),
        "{:?}",
        lone.elapsed()
    );
    assert_eq!(
        redis.command_calls("evalsha"),
        1,
        "a lone decision goes alone"
    );
}

/// Two stores (two instances, each batching) race many tasks on one key per algorithm: the
/// admitted count is exactly the quota, never more (a decision decided twice or on stale
/// state would overshoot), never less (a denial that consumed would undershoot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batching_stores_racing_on_one_key_admit_exactly_the_quota() {
    let redis = RedisServer::start();
    let stores = [support::redis_store(&redis), support::redis_store(&redis)];
    let quota = 50;
    for &algorithm in Algorithm::ALL {
        let key = format!("redlimit:{{race-{algorithm}}}");
        let admitted = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for store in &stores {
            for _ in 0..64 {
                let (store, key, admitted) = (store.clone(), key.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    let quotas: Quotas = Quota::per_hour(quota).unwrap().into();
                    for _ in 0..3 {
                        let decision = store
                            .check(request(&key, &quotas, algorithm))
                            .await
                            .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                        admitted.fetch_add(usize::from(decision.allowed), Ordering::Relaxed);
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            quota as usize,
            "{algorithm}: 384 requests from two stores on one key"
        );
    }
}

/// A half-open circuit's probe goes alone: while it is in flight the others are skipped, none
/// joins it, and its success closes the circuit.
#[tokio::test]
async fn a_half_open_probe_goes_alone_and_closes_the_circuit() {
    let redis = RedisServer::start();
    let cool_down = Duration::from_millis(300);
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(100))
        .circuit_breaker(CircuitBreaker {
            failure_threshold: 1,
            cool_down,
        })
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let quotas = generous();
    let sleeping = redis.debug_sleep(Duration::from_millis(250));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let failed = store
        .check(request("redlimit:{open}", &quotas, Algorithm::TokenBucket))
        .await;
    assert!(matches!(failed, Err(StoreError::Timeout(_))), "{failed:?}");
    sleeping.join().unwrap();
    assert!(store.circuit_open());
    tokio::time::sleep(cool_down + Duration::from_millis(50)).await;
    redis.reset_stats();
    let keys = keys("half-open", 20);
    let answers = join_all(
        keys.iter()
            .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
    )
    .await;
    let decided = answers.iter().filter(|answer| answer.is_ok()).count();
    let skipped = answers
        .iter()
        .filter(|answer| matches!(answer, Err(StoreError::Unavailable(_))))
        .count();
    assert_eq!(
        (decided, skipped),
        (1, keys.len() - 1),
        "{:?}",
        answers.iter().map(text).collect::<Vec<_>>()
    );
    assert_eq!(redis.command_calls("evalsha"), 1, "the probe alone");
    assert!(!store.circuit_open(), "the probe's success closed it");
}

/// `SCRIPT FLUSH` (the batch script's `NOSCRIPT`), `FLUSHALL`, then a restart, each while a
/// queue waits behind a call in flight: the first two are survived with every decision decided
/// once (each key has exactly one unit spent afterwards); across the restart every caller hears
/// within the timeout, and decisions reach the new server afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_survives_script_flush_flushall_and_a_restart_mid_batch() {
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .build()
        .unwrap();
    let tight: Quotas = Quota::per_hour(3).unwrap().into();
    for (round, trouble) in ["warm", "script flush", "flushall"].into_iter().enumerate() {
        let keys = keys(&format!("survive-{round}"), 10);
        let requests: Vec<CheckRequest<'_>> = keys
            .iter()
            .flat_map(|key| {
                [Algorithm::SlidingLog, Algorithm::Gcra]
                    .map(|algorithm| request(key, &tight, algorithm))
            })
            .collect();
        let sleeping = redis.debug_sleep(Duration::from_millis(200));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let lead = format!("redlimit:{{survive-lead-{round}}}");
        let leader = store.check(request(&lead, &tight, Algorithm::TokenBucket));
        let followers = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            // Written while Redis sleeps, so it lands before the queue's call.
            match trouble {
                "script flush" => redis.script_flush(),
                "flushall" => redis.flushall(),
                _ => {}
            }
            join_all(requests.iter().map(|request| store.check(*request))).await
        };
        let (leader, answers) = tokio::join!(leader, followers);
        sleeping.join().unwrap();
        assert!(leader.is_ok(), "{trouble}: {leader:?}");
        for (request, answer) in requests.iter().zip(&answers) {
            let decision = answer.as_ref().unwrap_or_else(|e| {
                panic!("{trouble}: {} {}: {e}", request.key, request.algorithm)
            });
            assert!(decision.allowed);
            assert_eq!(
                decision.remaining, 2,
                "{trouble}: {} {}",
                request.key, request.algorithm
            );
        }
    }
    // The restart: Redis killed while the queue waits behind the first call.
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let keys = keys("restart", 10);
    let leader = store.check(request("redlimit:{restart-lead}", &tight, Algorithm::Gcra));
    let followers = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let answers = join_all(
            keys.iter()
                .map(|key| store.check(request(key, &tight, Algorithm::Gcra))),
        )
        .await;
        (answers, started.elapsed())
    };
    let restart = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::task::block_in_place(|| redis.restart());
    };
    let (_, (answers, elapsed), ()) = tokio::join!(leader, followers, restart);
    let _ = sleeping.join();
    assert!(
        elapsed <= timeout + Duration::from_millis(200),
        "the queue heard after {elapsed:?}: {:?}",
        answers.iter().map(text).collect::<Vec<_>>()
    );
    let after = decided_within(&store, "redlimit:{after-restart}", 20).await;
    assert!(after.is_ok(), "after the restart: {after:?}");
}

/// How many times the store has logged that it replaces a stale connection.
fn stale_logs(captured: &support::logs::Captured) -> usize {
    captured.text().matches("connection is stale").count()
}

/// A failover that demotes the server a store talks to: a decision's `READONLY` makes the
/// store replace its connection (the address may lead to the new primary now). Decisions
/// batched together hear `READONLY` each in their own reply, inside the batch's array: that
/// must tell the connection the same, or under load (every call a batch) the store keeps
/// writing to the demoted server.
#[tokio::test]
async fn readonly_inside_a_batch_replaces_the_stale_connection_as_alone() {
    readonly_inside_a_batch_replaces_the_stale_connection_as_alone_with(DEFAULT_MAX_BATCH).await;
}

/// The same on a store that never batches (the control: it holds).
#[tokio::test]
async fn readonly_inside_a_batch_replaces_the_stale_connection_as_alone_unbatched() {
    readonly_inside_a_batch_replaces_the_stale_connection_as_alone_with(1).await;
}

async fn readonly_inside_a_batch_replaces_the_stale_connection_as_alone_with(max_batch: usize) {
    let (captured, _guard) = support::logs::capture(tracing::Level::WARN);
    let primary = RedisServer::start();
    let demoted = RedisServer::start();
    let tight: Quotas = Quota::per_hour(1).unwrap().into();
    let lead = "redlimit:{ro-lead}";
    // The first call's key is spent on the primary, so that on the replica its decision is a
    // denial, which writes nothing and answers.
    let on_primary = support::redis_store(&primary);
    assert!(
        on_primary
            .check(request(lead, &tight, Algorithm::Gcra))
            .await
            .unwrap()
            .allowed
    );
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .query(&mut demoted.conn())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while support::info_field(&demoted.info("replication"), "master_link_status") != Some("up") {
        assert!(Instant::now() < deadline, "the replica never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = RedisStore::builder(demoted.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(max_batch)
        .build()
        .unwrap();
    let quotas = generous();
    // Alone: an admission's READONLY replaces the connection.
    let denied = store
        .check(request(lead, &tight, Algorithm::Gcra))
        .await
        .unwrap();
    assert!(!denied.allowed);
    let alone = store
        .check(request("redlimit:{ro-alone}", &quotas, Algorithm::Gcra))
        .await;
    assert!(
        format!("{alone:?}").contains("read only replica"),
        "{alone:?}"
    );
    let before = stale_logs(&captured);
    assert_eq!(
        before,
        1,
        "alone, READONLY replaced the connection:\n{}",
        captured.text()
    );
    // The new connection answers (a denial), then a queue of admissions in one batch.
    let keys = keys("ro-batch", 5);
    let queued: Vec<CheckRequest<'_>> = keys
        .iter()
        .map(|key| request(key, &quotas, Algorithm::Gcra))
        .collect();
    let answers = behind_a_sleep(
        &demoted,
        &store,
        Duration::from_millis(300),
        request(lead, &tight, Algorithm::Gcra),
        &queued,
    )
    .await;
    assert!(
        !answers[0].as_ref().unwrap().allowed,
        "the first call, a denial"
    );
    for answer in &answers[1..] {
        assert!(
            format!("{answer:?}").contains("read only replica"),
            "{answer:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        stale_logs(&captured) > before,
        "5 queued decisions heard READONLY, and the store kept its connection to the demoted \
         server:\n{}",
        captured.text()
    );
}

/// A first call whose caller polls it onto the wire and then leaves it unpolled for a while
/// (kept, not dropped: a `select!` loop busy elsewhere, a future polled once by hand) must not
/// hold up other callers' decisions: Redis answers them at once, as it would without
/// batching, within their timeout.
#[tokio::test]
async fn a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others() {
    a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_with(DEFAULT_MAX_BATCH)
        .await;
}

/// The same on a store that never batches (the control: it holds).
#[tokio::test]
async fn a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_unbatched() {
    a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_with(1).await;
}

async fn a_first_call_whose_caller_stops_polling_does_not_hold_up_the_others_with(
    max_batch: usize,
) {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .max_batch(max_batch)
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let quotas = generous();
    let sleeping = redis.debug_sleep(Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut parked = Box::pin(store.check(request(
        "redlimit:{parked}",
        &quotas,
        Algorithm::TokenBucket,
    )));
    assert!(tokio::time::timeout(Duration::from_millis(20), &mut parked)
        .await
        .is_err());
    let keys = keys("behind-parked", 5);
    let started = Instant::now();
    let answers = join_all(
        keys.iter()
            .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
    )
    .await;
    let elapsed = started.elapsed();
    sleeping.join().unwrap();
    let parked = parked.await;
    let texts: Vec<String> = answers.iter().map(text).collect();
    assert!(
        answers.iter().all(Result::is_ok),
        "5 decisions behind a first call whose caller stopped polling it, Redis healthy: \
         {texts:?} after {elapsed:?} (the parked one, polled again: {})",
        text(&parked)
    );
}

/// Two batching stores race many tasks on one key per algorithm under a per-second quota for
/// more than a second (across window boundaries, on the server's clock): the admissions stay
/// within what the algorithm allows over the run, and at least one full burst is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batching_stores_racing_across_windows_stay_within_the_rate() {
    let redis = RedisServer::start();
    let stores = [support::redis_store(&redis), support::redis_store(&redis)];
    let rate = 20u64;
    for &algorithm in Algorithm::ALL {
        let key = format!("redlimit:{{window-race-{algorithm}}}");
        let admitted = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let until = started + Duration::from_millis(1200);
        let mut tasks = Vec::new();
        for store in &stores {
            for _ in 0..64 {
                let (store, key, admitted) = (store.clone(), key.clone(), admitted.clone());
                tasks.push(tokio::spawn(async move {
                    let quotas: Quotas = Quota::per_second(rate).unwrap().into();
                    while Instant::now() < until {
                        let decision = store
                            .check(request(&key, &quotas, algorithm))
                            .await
                            .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                        admitted.fetch_add(usize::from(decision.allowed), Ordering::Relaxed);
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let seconds = started.elapsed().as_secs_f64();
        let admitted = admitted.load(Ordering::Relaxed) as f64;
        let rate = rate as f64;
        let most = match algorithm {
            // A burst, then the refill over the run.
            Algorithm::TokenBucket | Algorithm::Gcra => rate + rate * seconds + 1.0,
            // Any period holds at most a burst.
            Algorithm::SlidingLog => rate * seconds.ceil(),
            // Every window the run touches holds at most a burst.
            _ => rate * (seconds.ceil() + 1.0),
        };
        println!("{algorithm}: {admitted} admitted in {seconds:.2} s (at most {most})");
        assert!(
            admitted <= most && admitted >= rate,
            "{algorithm}: {admitted} admitted in {seconds:.2} s, at most {most} allowed"
        );
    }
}

/// What the probe below sends: decisions (batched), blocking decisions and concurrency slot
/// calls (never batched), on keys of their own per kind.
#[derive(Clone, Copy)]
enum Op<'a> {
    Check(CheckRequest<'a>),
    Blocking(CheckRequest<'a>, redlimit::store::Block),
    Slot(redlimit::store::SlotRequest<'a>),
}

async fn run(store: &RedisStore, op: Op<'_>) -> String {
    match op {
        Op::Check(request) => text(&store.check(request).await),
        Op::Blocking(request, block) => text(&store.check_blocking(request, block).await),
        // A full set's wait counts down from its oldest lease: the same call made a moment
        // later (the comparison runs the calls again, alone) waits that much less, so it is
        // compared in whole seconds.
        Op::Slot(request) => match store.slots(request).await {
            Ok(reply) => format!(
                "ok {} remaining {} wait {}s restored {}",
                reply.ok,
                reply.remaining,
                (reply.wait.as_millis() + 500) / 1000,
                reply.restored
            ),
            Err(error) => format!("error: {error}"),
        },
    }
}

/// Blocking decisions and concurrency slots arrive among queued decisions: they go alone as
/// always, the queued decisions still share a call, and every answer is what the same calls
/// give one by one on a store that never batches.
#[tokio::test]
async fn blocking_checks_and_slots_among_queued_decisions_answer_as_alone() {
    let batched_redis = RedisServer::start();
    let alone_redis = RedisServer::start();
    // The whole queue in one call, so that it runs in the order given (decisions in calls
    // that overlap have no order between them, as concurrent calls never had).
    let batched = RedisStore::builder(batched_redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(256)
        .build()
        .unwrap();
    let alone = RedisStore::builder(alone_redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(1)
        .build()
        .unwrap();
    let tight: Quotas = Quota::per_hour(2).unwrap().into();
    let block = redlimit::store::Block {
        duration: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    let now = Some(1_700_000_000_000_000);
    let at = |key, algorithm| CheckRequest {
        now_micros: now,
        ..request(key, &tight, algorithm)
    };
    let slot = |id: &'static [&'static str], op| {
        Op::Slot(redlimit::store::SlotRequest {
            key: "redlimit:{mix-slots}:s#c",
            op,
            ids: id,
            lease: Duration::from_secs(30),
            now_micros: None,
        })
    };
    let acquire = redlimit::store::SlotOp::Acquire { limit: 2 };
    let mut ops = Vec::new();
    for _ in 0..3 {
        ops.extend([
            Op::Check(at("redlimit:{mix-a}", Algorithm::Gcra)),
            Op::Blocking(at("redlimit:{mix-block}", Algorithm::TokenBucket), block),
            Op::Check(at("redlimit:{mix-b}", Algorithm::SlidingLog)),
        ]);
    }
    ops.extend([
        slot(&["one"], acquire),
        slot(&["two"], acquire),
        Op::Check(at("redlimit:{mix-c}", Algorithm::FixedWindow)),
        slot(&["three"], acquire),
        slot(&["one"], redlimit::store::SlotOp::Release),
        slot(&["four"], acquire),
    ]);
    batched.verify().await.unwrap();
    // Each script loaded once, so that the counts below see no NOSCRIPT resend.
    for warm in [
        Op::Blocking(at("redlimit:{warm-block}", Algorithm::Gcra), block),
        slot(&["warm"], redlimit::store::SlotOp::Release),
    ] {
        run(&batched, warm).await;
    }
    batched_redis.reset_stats();
    let sleeping = batched_redis.debug_sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let leader = batched.check(request(
        "redlimit:{mix-lead}",
        &tight,
        Algorithm::TokenBucket,
    ));
    let followers = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        join_all(ops.iter().map(|op| run(&batched, *op))).await
    };
    let (leader, answers) = tokio::join!(leader, followers);
    sleeping.join().unwrap();
    assert!(leader.unwrap().allowed);
    let checks = ops.iter().filter(|op| matches!(op, Op::Check(_))).count() as u64;
    let batch_calls = batched_redis.command_calls("evalsha") + batched_redis.command_calls("eval");
    let others = (ops.len() as u64) - checks;
    // The queued decisions' calls: the first to queue goes at once in a call of its own (no
    // queued decision waits for a caller's call), the others in one more behind it; and a
    // resend after the batch script's first NOSCRIPT.
    assert!(
        batch_calls <= 1 + others + 3,
        "{batch_calls} script calls for the first call, {others} blocking checks and slot \
         calls, and {checks} queued decisions"
    );
    for (i, op) in ops.iter().enumerate() {
        let want = run(&alone, *op).await;
        assert_eq!(answers[i], want, "call {i}: batched, then alone");
    }
}

/// On Cluster, queues of one slot through a whole migration: some keys moved and some not
/// (`TRYAGAIN` on the source), all moved with the slot still open (`ASK`, then `TRYAGAIN` on
/// the target), and the move finished while the store's slot map is stale (`MOVED`). Every
/// queued decision is decided, never `CROSSSLOT`, and each key admits exactly its quota over
/// the run (nothing decided twice, nothing lost).
#[tokio::test]
async fn on_cluster_queues_of_one_slot_are_decided_through_a_whole_migration() {
    through_a_whole_migration(DEFAULT_MAX_BATCH).await;
}

/// The same requests on a store that never batches.
#[tokio::test]
async fn on_cluster_unbatched_decisions_are_decided_through_a_whole_migration() {
    through_a_whole_migration(1).await;
}

async fn through_a_whole_migration(max_batch: usize) {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(max_batch)
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let tight: Quotas = Quota::per_hour(4).unwrap().into();
    // Six keys of one slot, half under GCRA and half under the sliding log (3 keys a decision).
    let keys: Vec<String> = (0..6).map(|i| format!("redlimit:{{mv}}:k{i}")).collect();
    let mut admitted = vec![0; keys.len()];
    let requests: Vec<CheckRequest<'_>> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let algorithm = [Algorithm::Gcra, Algorithm::SlidingLog][i % 2];
            request(key, &tight, algorithm)
        })
        .collect();
    for (i, request) in requests.iter().enumerate() {
        admitted[i] += usize::from(store.check(*request).await.unwrap().allowed);
    }
    let slot = cluster.slot_of(&keys[0]);
    let from = cluster.node_for_key(&keys[0]);
    let to = (from + 1) % cluster.nodes().len();
    cluster.begin_slot_migration(slot, from, to);
    for phase in ["half moved", "all moved, slot open", "move finished"] {
        match phase {
            "half moved" => {
                cluster.migrate_keys(slot, from, to, 7);
            }
            "all moved, slot open" => while cluster.migrate_keys(slot, from, to, 10) > 0 {},
            _ => cluster.finish_slot_migration(slot, from, to),
        }
        for _ in 0..2 {
            let sleeping = cluster.nodes()[from].debug_sleep(Duration::from_millis(200));
            tokio::time::sleep(Duration::from_millis(30)).await;
            let lead = format!("redlimit:{{mv}}:lead-{phase}");
            let leader = store.check(request(&lead, &tight, Algorithm::Gcra));
            let followers = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                join_all(requests.iter().map(|request| store.check(*request))).await
            };
            let (leader, answers) = tokio::join!(leader, followers);
            sleeping.join().unwrap();
            leader.unwrap_or_else(|e| panic!("{phase}: the first call: {e}"));
            for (i, (request, answer)) in requests.iter().zip(answers).enumerate() {
                let decision = answer.unwrap_or_else(|e| {
                    panic!("{phase}: {} {}: {e}", request.key, request.algorithm)
                });
                admitted[i] += usize::from(decision.allowed);
            }
            println!("max_batch {max_batch}, {phase}: admitted so far {admitted:?}");
        }
    }
    for (request, admitted) in requests.iter().zip(&admitted) {
        assert_eq!(
            *admitted, 4,
            "{} {}: 7 requests through the migration, quota 4",
            request.key, request.algorithm
        );
    }
}

/// Through a failover asked of the sentinels, under a load that keeps queues full (32 callers
/// without pause): no caller waits past the bound, the queued decisions move to the new
/// primary and share calls there, and the last requests are all decided.
#[test]
fn through_a_sentinel_failover_queued_decisions_move_to_the_new_primary() {
    use support::sentinel::{RedisSentinel, MASTER_NAME};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = RedisSentinel::start();
    let urls = setup.sentinel_urls();
    let store = RedisStore::sentinel(urls.iter().map(String::as_str), MASTER_NAME).unwrap();
    runtime
        .block_on(store.verify())
        .expect("verify via Sentinel");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (store, stop, log) = (store.clone(), stop.clone(), log.clone());
            runtime.spawn(async move {
                let key = format!("redlimit:{{failover-{i}}}");
                let quotas: Quotas = Quota::per_second(1_000_000).unwrap().into();
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let answer = store
                        .check(request(&key, &quotas, Algorithm::TokenBucket))
                        .await;
                    let ok = answer.is_ok();
                    log.lock().unwrap().push((at, at.elapsed(), ok));
                    if !ok {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut sentinel = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(1))
        .unwrap();
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER_NAME)
        .query(&mut sentinel)
        .expect("SENTINEL FAILOVER");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !setup.replica_promoted() {
        assert!(Instant::now() < deadline, "{}", setup.sentinel_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while setup.replica.command_calls("evalsha") == 0 {
        assert!(
            Instant::now() < deadline,
            "the store never moved to the new primary"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let moved = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let calls = setup.replica.command_calls("evalsha") + setup.replica.command_calls("eval");
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        runtime.block_on(task).unwrap();
    }
    let log = log.lock().unwrap().clone();
    let worst = log.iter().map(|(_, latency, _)| *latency).max().unwrap();
    let after = log.iter().filter(|(at, _, _)| *at >= moved).count();
    let failed = log.iter().filter(|(_, _, ok)| !ok).count();
    println!(
        "{} requests, {failed} failed, worst {worst:?}; {after} after the move in {calls} calls",
        log.len()
    );
    assert!(
        worst <= store.timeout() + Duration::from_millis(400),
        "a request took {worst:?}"
    );
    assert!(
        log.iter().rev().take(64).all(|(_, _, ok)| *ok),
        "the last requests were not all decided"
    );
    assert!(
        (calls as usize) < after,
        "on the new primary, {after} decisions in {calls} calls: the queues shared calls"
    );
}
