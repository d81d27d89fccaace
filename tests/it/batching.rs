//! Batching: decisions that queue behind a call in flight share the next `EVALSHA`
//! (`src/store/redis/batch.rs`), and each is still decided on its own: its own reply, its own
//! error, its own timeout, all tiers or none. A `DEBUG SLEEP` holds the first call, so the
//! decisions behind it queue for certain.

use crate::support;

use std::time::Duration;

use futures::future::join_all;
use redlimit::store::{CheckRequest, CircuitBreaker, RedisStore, Store, StoreError};
use redlimit::{Algorithm, Quota, Quotas};
use support::{RedisCluster, RedisServer};

/// A quota nothing in these tests (and the probes') exhausts unless it says so.
pub(crate) fn generous() -> Quotas {
    Quota::per_hour(1_000).unwrap().into()
}

/// A decision of cost 1 on Redis's clock.
pub(crate) fn request<'a>(
    key: &'a str,
    quotas: &'a Quotas,
    algorithm: Algorithm,
) -> CheckRequest<'a> {
    CheckRequest {
        key,
        algorithm,
        quotas,
        cost: 1,
        now_micros: None,
    }
}

/// Holds Redis for `sleep`, then sends `first` (which goes alone and waits behind the sleep)
/// and, once it is on the wire, every request of `rest` (which queue behind it). Answers in
/// the order given, `first`'s first.
async fn queued_behind_a_sleep(
    redis: &RedisServer,
    store: &RedisStore,
    sleep: Duration,
    first: CheckRequest<'_>,
    rest: &[CheckRequest<'_>],
) -> Vec<Result<redlimit::Decision, StoreError>> {
    store.verify().await.expect("Redis is up");
    let sleeping = redis.debug_sleep(sleep);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let leader = store.check(first);
    let followers = async {
        // The first call is in flight before the others arrive.
        tokio::time::sleep(Duration::from_millis(20)).await;
        join_all(rest.iter().map(|request| store.check(*request))).await
    };
    let (first, rest) = tokio::join!(leader, followers);
    sleeping.join().unwrap();
    std::iter::once(first).chain(rest).collect()
}

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
            queued_behind_a_sleep(&redis, &store, Duration::from_millis(300), first, &requests)
                .await;
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
        assert!(
            store
                .check(request(&key, &quotas, Algorithm::TokenBucket))
                .await
                .unwrap()
                .allowed
        );
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
    let requests: Vec<CheckRequest<'_>> = keys
        .iter()
        .map(|key| request(key, &quotas, Algorithm::Gcra))
        .collect();
    let answers = queued_behind_a_sleep(
        &redis,
        &store,
        Duration::from_millis(300),
        request("redlimit:{ok-first}", &quotas, Algorithm::Gcra),
        &requests,
    )
    .await;
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
    let requests: Vec<CheckRequest<'_>> = [keys[0], keys[3], keys[4]]
        .iter()
        .map(|key| request(key, &quotas, Algorithm::Gcra))
        .collect();
    redis.reset_stats();
    let answers = queued_behind_a_sleep(
        &redis,
        &store,
        Duration::from_millis(300),
        request("redlimit:{ok-first}", &quotas, Algorithm::Gcra),
        &requests,
    )
    .await;
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
    let requests: Vec<CheckRequest<'_>> = keys
        .iter()
        .map(|key| request(key, &quotas, Algorithm::TokenBucket))
        .collect();
    let answers = queued_behind_a_sleep(
        &redis,
        &store,
        Duration::from_millis(600),
        request("redlimit:{slow-first}", &quotas, Algorithm::TokenBucket),
        &requests,
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
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .unwrap();
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
