//! Batching: decisions that queue behind a call in flight share the next `EVALSHA`
//! (`src/store/redis/batch.rs`), and each is still decided on its own: its own reply, its own
//! error, its own timeout, all tiers or none. A `DEBUG SLEEP` holds the first call, so the
//! decisions behind it queue for certain.

use super::{
    admits, batched_and_alone, batched_and_unbatched, behind_a_sleep, generous, request, requests,
    store_without_breaker, text, while_asleep,
};
use crate::support;
use redlimit::store::{StoreExt, DEFAULT_MAX_BATCH};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use std::time::Duration;

use futures::future::join_all;
use redlimit::store::{CheckRequest, CircuitBreaker, RedisStore, Store, StoreError};
use redlimit::{Algorithm, Quota, Quotas};
use support::{RedisCluster, RedisServer};

#[tokio::test]
async fn decisions_queued_behind_a_call_share_the_next_and_each_is_decided_on_its_own() {
    let redis = RedisServer::start();
    let store = support::redis_store(&redis);
    let tight: Quotas = Quota::per_hour(3).unwrap().into();
    let keys: Vec<String> = (0..20).map(|i| format!("redlimit:{{batch-{i}}}")).collect();
    // Each key asked 5 times, every algorithm: 3 admitted per key, in one queue.
    for &algorithm in Algorithm::ALL {
        redis.reset_stats();
        let requests: Vec<CheckRequest<'_>> = (0..5)
            .flat_map(|_| keys.iter().map(|key| request(key, &tight, algorithm)))
            .collect();
        let extra = format!("redlimit:{{batch-first-{algorithm}}}");
        let first = request(&extra, &tight, algorithm);
        let answers =
            behind_a_sleep(&redis, &store, Duration::from_millis(300), first, &requests).await;
        let mut admitted = vec![0; keys.len()];
        for (i, answer) in answers[1..].iter().enumerate() {
            let decision = answer
                .as_ref()
                .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
            admitted[i % keys.len()] += usize::from(decision.allowed);
        }
        assert!(answers[0].as_ref().unwrap().allowed);
        assert_eq!(admitted, vec![3; keys.len()], "{algorithm}");
        let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
        println!("{algorithm}: 101 decisions in {calls} calls");
        // The first alone, a quarter of max_batch early, a full queue, the rest; and on first
        // use a NOSCRIPT of the batch script for each of the calls that overlap.
        assert!(
            calls <= 8,
            "{algorithm}: 100 queued decisions went in {calls} calls (at most 64 a call)"
        );
        // Each key's denials consumed nothing: the tier is spent, not overdrawn.
        let peek = store
            .check(CheckRequest {
                cost: 0,
                ..request(&keys[0], &tight, algorithm)
            })
            .await
            .unwrap();
        assert_eq!(peek.remaining, 0, "{algorithm}");
    }
}

#[tokio::test]
async fn a_lone_decision_goes_out_alone_on_the_decision_script() {
    let redis = RedisServer::start();
    let store = support::redis_store(&redis);
    let quotas = generous();
    store.verify().await.unwrap();
    redis.reset_stats();
    for i in 0..20 {
        let key = format!("redlimit:{{alone-{i}}}");
        assert!(admits(&store, &key, &quotas, Algorithm::TokenBucket).await);
    }
    assert_eq!(redis.command_calls("evalsha"), 20);
    // The batch script was never needed, so never loaded: the one cached script is the
    // decision script, which `verify` loaded.
    let memory = redis.info("memory");
    let cached = support::info_field(&memory, "number_of_cached_scripts");
    assert_eq!(cached, Some("1"), "{memory}");
}

#[tokio::test]
async fn one_decisions_error_is_its_own() {
    let redis = RedisServer::start();
    // A user that may touch only the keys of tenants whose name starts with "ok".
    let store = support::store_limited_to(
        &redis,
        "redlimit:{ok*",
        Duration::from_secs(5),
        redlimit::store::DEFAULT_MAX_BATCH,
    );
    let quotas = generous();
    // A key whose stored override is corrupt: the script refuses every decision on it.
    let limiter = redlimit::Limiter::builder(store.clone())
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    support::poison_key(&redis, &limiter, "ok-poisoned").await;
    let poisoned = limiter.storage_key("ok-poisoned");
    assert!(poisoned.starts_with("redlimit:{ok"), "{poisoned}");
    let keys = [
        "redlimit:{ok-1}",
        "redlimit:{refused}",
        "redlimit:{ok-2}",
        poisoned.as_str(),
        "redlimit:{ok-3}",
    ];
    let first = request("redlimit:{ok-first}", &quotas, Algorithm::Gcra);
    let sleep = Duration::from_millis(300);
    let queue = requests(&keys, &quotas, Algorithm::Gcra);
    let answers = behind_a_sleep(&redis, &store, sleep, first, &queue).await;
    for i in [0, 1, 3, 5] {
        assert!(answers[i].as_ref().unwrap().allowed, "{:?}", answers[i]);
    }
    match &answers[2] {
        Err(StoreError::Redis(failure)) => assert_eq!(failure.code(), Some("NOPERM")),
        other => panic!("the refused key's own error, got {other:?}"),
    }
    match &answers[4] {
        Err(StoreError::Redis(failure)) => {
            assert_eq!(failure.code(), Some("ERR"));
            assert!(failure.to_string().contains("redlimit: invalid arguments"));
        }
        other => panic!("the poisoned key's own error, got {other:?}"),
    }
    // Neither failed the others, nor told the breaker of transport trouble.
    assert!(!store.circuit_open());
    // Without the refused key, one call carries the queue and the poisoned key's error is
    // its own reply in it: nothing is sent twice (each other key admitted twice in all).
    let again = [keys[0], keys[3], keys[4]];
    redis.reset_stats();
    let queue = requests(&again, &quotas, Algorithm::Gcra);
    let answers = behind_a_sleep(&redis, &store, sleep, first, &queue).await;
    assert!(answers[2].is_err(), "{:?}", answers[2]);
    for i in [0, 1, 3] {
        assert!(answers[i].as_ref().unwrap().allowed, "{:?}", answers[i]);
    }
    for i in [1, 3] {
        assert_eq!(
            answers[i].as_ref().unwrap().remaining,
            998,
            "{:?}",
            answers[i]
        );
    }
}

#[tokio::test]
async fn a_batch_that_times_out_counts_once_toward_the_breaker() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(100))
        .circuit_breaker(CircuitBreaker {
            failure_threshold: 3,
            cool_down: Duration::from_secs(30),
        })
        .build()
        .unwrap();
    let quotas = generous();
    let keys: Vec<String> = (0..30).map(|i| format!("redlimit:{{slow-{i}}}")).collect();
    let answers = behind_a_sleep(
        &redis,
        &store,
        Duration::from_millis(600),
        request("redlimit:{slow-first}", &quotas, Algorithm::TokenBucket),
        &requests(&keys, &quotas, Algorithm::TokenBucket),
    )
    .await;
    for answer in &answers {
        assert!(
            matches!(answer, Err(StoreError::Timeout(_))),
            "every decision behind the sleep times out: {answer:?}"
        );
    }
    // Two calls failed (the first alone, then the queue's), under the threshold of 3: 31
    // decisions sent alone would have opened the circuit.
    assert!(
        !store.circuit_open(),
        "the breaker counted decisions, not calls"
    );
}

#[tokio::test]
async fn decisions_dropped_before_their_call_are_left_out_and_a_dropped_first_call_hands_on_the_queue(
) {
    let redis = RedisServer::start();
    let store = support::redis_store(&redis);
    let quotas = generous();
    store.verify().await.unwrap();
    let sleeping = redis.debug_sleep(Duration::from_millis(400));
    tokio::time::sleep(Duration::from_millis(30)).await;
    // The first call, dropped while Redis sleeps: the queue behind it must still be sent.
    let first = tokio::time::timeout(
        Duration::from_millis(100),
        store.check(request(
            "redlimit:{dropped-first}",
            &quotas,
            Algorithm::TokenBucket,
        )),
    );
    // A decision queued behind it: the store's sender takes it at once, and its call waits
    // behind the sleep too. Then fewer than a quarter of max_batch: they wait for that call.
    let ahead = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        store
            .check(request("redlimit:{ahead}", &quotas, Algorithm::TokenBucket))
            .await
    };
    let kept_keys: Vec<String> = (0..7).map(|i| format!("redlimit:{{kept-{i}}}")).collect();
    let dropped_keys: Vec<String> = (0..7)
        .map(|i| format!("redlimit:{{dropped-{i}}}"))
        .collect();
    let queued = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let kept = join_all(
            kept_keys
                .iter()
                .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
        );
        // Dropped while queued: long before Redis wakes up.
        let dropped = tokio::time::timeout(
            Duration::from_millis(30),
            join_all(
                dropped_keys
                    .iter()
                    .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
            ),
        );
        tokio::join!(kept, dropped)
    };
    let (first, ahead, (kept, dropped)) = tokio::join!(first, ahead, queued);
    sleeping.join().unwrap();
    assert!(first.is_err(), "the first call was dropped");
    assert!(
        ahead.unwrap().allowed,
        "the sender's first call is answered"
    );
    assert!(dropped.is_err(), "the dropped decisions were dropped");
    for answer in kept {
        assert!(answer.unwrap().allowed, "a kept decision is answered");
    }
    let stored = redis.keys();
    for key in &kept_keys {
        assert!(stored.contains(key), "{key} was decided: {stored:?}");
    }
    for key in &dropped_keys {
        assert!(
            !stored.contains(key),
            "{key} was dropped before its call: {stored:?}"
        );
    }
}

#[tokio::test]
async fn on_cluster_only_decisions_of_one_slot_share_a_call() {
    let cluster = RedisCluster::start();
    let store = support::Ctx::default().cluster_store(&cluster);
    let tight: Quotas = Quota::per_hour(4).unwrap().into();
    store.verify().await.unwrap();
    // Keys over every node, each asked 6 times at once, and one hot key asked 60 times.
    let keys: Vec<String> = (0..30)
        .map(|i| format!("redlimit:{{spread-{i}}}"))
        .collect();
    let hot = "redlimit:{hot}".to_owned();
    let mut requests: Vec<CheckRequest<'_>> = (0..6)
        .flat_map(|_| keys.iter().map(|key| request(key, &tight, Algorithm::Gcra)))
        .collect();
    let hot_quota: Quotas = Quota::per_hour(25).unwrap().into();
    requests.extend((0..60).map(|_| request(&hot, &hot_quota, Algorithm::Gcra)));
    for node in cluster.nodes() {
        node.reset_stats();
    }
    let answers = join_all(requests.iter().map(|r| store.check(*r))).await;
    let mut admitted = vec![0; keys.len()];
    let mut hot_admitted = 0;
    for (request, answer) in requests.iter().zip(&answers) {
        let decision = answer
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: never CROSSSLOT, never an error: {e}", request.key));
        match keys.iter().position(|key| key == request.key) {
            Some(i) => admitted[i] += usize::from(decision.allowed),
            None => hot_admitted += usize::from(decision.allowed),
        }
    }
    assert_eq!(admitted, vec![4; keys.len()]);
    assert_eq!(hot_admitted, 25);
    let calls: u64 = cluster
        .nodes()
        .iter()
        .map(|node| node.command_calls("evalsha") + node.command_calls("eval"))
        .sum();
    println!("{} decisions in {calls} calls", requests.len());
    assert!(
        calls < requests.len() as u64,
        "decisions of one slot shared calls: {calls} calls for {}",
        requests.len()
    );
}

#[test]
fn a_runtime_shut_down_with_decisions_in_flight_leaves_the_store_working_on_another() {
    let redis = RedisServer::start();
    let store = store_without_breaker(&redis, Duration::from_secs(2), DEFAULT_MAX_BATCH);
    let quotas = generous();
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    first.block_on(store.verify()).unwrap();
    // A call in flight behind a sleep, decisions queued behind it, then the runtime goes away.
    let sleeping = redis.debug_sleep(Duration::from_millis(500));
    std::thread::sleep(Duration::from_millis(30));
    for i in 0..10 {
        let store = store.clone();
        first.spawn(async move {
            let key = format!("redlimit:{{gone-{i}}}");
            let _ = store
                .check(request(&key, &quotas, Algorithm::TokenBucket))
                .await;
        });
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    first.shutdown_timeout(Duration::ZERO);
    sleeping.join().unwrap();
    // Another runtime: its decisions go out and are answered. (The connection's own task died
    // with the first runtime, so the first call may fail on it, and the store reconnects.) A
    // group left with a call in flight that nothing sends would queue each of them until its
    // timeout.
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let mut answers = Vec::new();
        for i in 0..20 {
            let key = format!("redlimit:{{after-{i}}}");
            let answer = store
                .check(request(&key, &quotas, Algorithm::TokenBucket))
                .await;
            assert!(
                !matches!(answer, Err(StoreError::Timeout(_))),
                "decision {i} after the shutdown waited out its timeout: {answers:?}"
            );
            let allowed = answer.as_ref().is_ok_and(|d| d.allowed);
            answers.push(answer);
            if allowed {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no decision answered after the shutdown: {answers:?}");
    });
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
    let leader = || store.check(request("redlimit:{ok-first}", &quotas, Algorithm::Gcra));
    let followers = || async {
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
    let (leader, (refused, slow)) =
        while_asleep(&redis, Duration::from_millis(250), leader, followers).await;
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

batched_and_unbatched! {
    async fn a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout,
    a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout_unbatched
        = a_decision_sent_again_alone_after_a_refused_batch_keeps_its_timeout_with
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
    let (batched, alone) = batched_and_alone(&batched_redis, &alone_redis);
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

/// Runs 64 tasks on each of `stores`, each deciding on `key` round after round while `go_on`
/// says so for the round about to start; the count admitted in all.
async fn race(
    stores: &[RedisStore],
    key: &str,
    quotas: Quotas,
    algorithm: Algorithm,
    go_on: impl Fn(usize) -> bool + Copy + Send + 'static,
) -> usize {
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..64 {
            let (store, key, admitted) = (store.clone(), key.to_owned(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let mut round = 0;
                while go_on(round) {
                    let decision = store
                        .check(request(&key, &quotas, algorithm))
                        .await
                        .unwrap_or_else(|e| panic!("{algorithm}: {e}"));
                    admitted.fetch_add(usize::from(decision.allowed), Ordering::Relaxed);
                    round += 1;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
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
        let quotas: Quotas = Quota::per_hour(quota).unwrap().into();
        let admitted = race(&stores, &key, quotas, algorithm, |round| round < 3).await;
        assert_eq!(
            admitted, quota as usize,
            "{algorithm}: 384 requests from two stores on one key"
        );
    }
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
        let started = Instant::now();
        let until = started + Duration::from_millis(1200);
        let quotas: Quotas = Quota::per_second(rate).unwrap().into();
        let admitted = race(&stores, &key, quotas, algorithm, move |_| {
            Instant::now() < until
        })
        .await;
        let seconds = started.elapsed().as_secs_f64();
        let admitted = admitted as f64;
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

/// What the test below sends: decisions (batched), blocking decisions and concurrency slot
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
    let (batched, alone) = batched_and_alone(&batched_redis, &alone_redis);
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
    let (leader, answers) = while_asleep(
        &batched_redis,
        Duration::from_millis(300),
        || {
            batched.check(request(
                "redlimit:{mix-lead}",
                &tight,
                Algorithm::TokenBucket,
            ))
        },
        || join_all(ops.iter().map(|op| run(&batched, *op))),
    )
    .await;
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
