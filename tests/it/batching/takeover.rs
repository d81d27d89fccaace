//! A reviewer's probes of three promises: the circuit breaker's probe taken at its first poll
//! and taken over after twice the timeout (`src/store/breaker.rs`), the deny cache learning a
//! queued denial from when its answer came (`src/core/check.rs`, `remembered_late`), and on
//! Cluster a call waiting for a `SCRIPT LOAD` under way at most a quarter of its timeout
//! (`src/store/redis/reload.rs`). The one that found a defect (a taken-over probe's late
//! outcome ending its successor's probe) runs since its fix.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{CircuitBreaker, RedisStore, Store, StoreError};
use redlimit::{Algorithm, Limiter, Quota, Verdict};

use super::{decide, generous, request, timed, verified_cluster_store, SLACK};
use crate::support::{RedisCluster, RedisServer};

/// Polls `future` once, with a waker that does nothing; whether it answered.
fn poll_once<F: Future + Unpin>(future: &mut F) -> bool {
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    std::pin::Pin::new(future).poll(&mut cx).is_ready()
}

/// A batching store on `redis` with `timeout` and a breaker opening on one failure.
async fn breaking_store(redis: &RedisServer, timeout: Duration, cool_down: Duration) -> RedisStore {
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .circuit_breaker(CircuitBreaker {
            failure_threshold: 1,
            cool_down,
        })
        .build()
        .unwrap();
    store.verify().await.expect("Redis is up");
    store
}

/// Opens `store`'s circuit: one call behind a `DEBUG SLEEP` longer than its timeout.
async fn open_circuit(redis: &RedisServer, store: &RedisStore, timeout: Duration) {
    let sleeping = redis.asleep(timeout * 2).await;
    let failed = decide(store, "redlimit:{open}").await;
    assert!(
        matches!(failed, Err(StoreError::Timeout(_))),
        "the opening call times out: {failed:?}"
    );
    RedisServer::awake(sleeping).await;
}

/// Promise 1: a probe polled once and then held is taken over after twice the timeout; when
/// the held probe is read at last (its timeout long past: a failure), its outcome must not free
/// the probe slot while the probe that took over is still in flight. A call arriving then must
/// be skipped, not let through as a second probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_probes_late_failure_lets_no_second_probe_in_while_the_new_one_is_in_flight() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let cool_down = Duration::from_millis(30);
    let store = breaking_store(&redis, timeout, cool_down).await;
    open_circuit(&redis, &store, timeout).await;
    tokio::time::sleep(cool_down * 2).await;
    // Redis hangs: every call meets its timeout.
    let sleeping = redis.asleep(Duration::from_millis(1500)).await;
    let quotas = generous();
    let mut held =
        Box::pin(store.check(request("redlimit:{held}", &quotas, Algorithm::TokenBucket)));
    assert!(
        !poll_once(&mut held),
        "the held probe waits behind the sleep"
    );
    // Past twice the timeout: the next call takes the probe over.
    tokio::time::sleep(timeout * 2 + Duration::from_millis(60)).await;
    let new_probe = tokio::spawn({
        let store = store.clone();
        async move { timed(&store, "redlimit:{new}").await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    // The held probe is read: its timeout is long past.
    let late = held.await;
    assert!(matches!(late, Err(StoreError::Timeout(_))), "{late:?}");
    // The cool-down that late failure set is over; the new probe is still in flight.
    tokio::time::sleep(cool_down + Duration::from_millis(20)).await;
    assert!(!new_probe.is_finished(), "the new probe is still in flight");
    let (third, took) = timed(&store, "redlimit:{third}").await;
    let (new_answer, new_took) = new_probe.await.unwrap();
    RedisServer::awake(sleeping).await;
    assert!(
        matches!(new_answer, Err(StoreError::Timeout(_))),
        "the new probe waited behind the sleep: {new_answer:?} after {new_took:?}"
    );
    assert!(
        matches!(third, Err(StoreError::Unavailable(_))) && took < Duration::from_millis(50),
        "a call while a probe is in flight is skipped at once, but answered {third:?} after \
         {took:?}: a second probe went to the store"
    );
}

/// Promise 1: a probe that is polled and slow (a `DEBUG SLEEP` just under the timeout) is the
/// only call that reaches Redis among many concurrent callers right at the cool-down's end
/// (through `Limiter::check`); its success closes the circuit, and no one takes it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_polled_probe_is_the_one_call_among_many_at_the_cool_downs_end() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let cool_down = Duration::from_millis(100);
    let store = breaking_store(&redis, timeout, cool_down).await;
    let limiter = Limiter::builder(store.clone())
        .algorithm(Algorithm::TokenBucket)
        .failure_policy(redlimit::failure_policy::FailClosed::default())
        .build()
        .unwrap();
    let quota = Quota::per_hour(100_000).unwrap();
    open_circuit(&redis, &store, timeout).await;
    let sleeping = redis.asleep(Duration::from_millis(250)).await;
    // The cool-down is over: callers in waves, the first the probe, to past the sleep.
    let calls = (0..64).map(|i| {
        let limiter = limiter.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(5 * i)).await;
            let key = format!("wave-{i}");
            let started = Instant::now();
            let verdict = limiter.check(&key, &quota).await;
            (verdict, started.elapsed())
        }
    });
    let answers = join_all(calls).await;
    RedisServer::awake(sleeping).await;
    let decided = answers
        .iter()
        .filter(|(verdict, _)| matches!(verdict, Verdict::Decided(_)))
        .count();
    let slowest = answers.iter().map(|(_, took)| *took).max().unwrap();
    assert!(
        slowest <= timeout + SLACK,
        "every caller answers within its timeout: the slowest took {slowest:?}"
    );
    assert!(decided >= 1, "the probe (or calls after it) decided");
    // Only the probe waits for Redis: calls skipped while it is in flight answer at once, and
    // calls after it closed the circuit meet an awake Redis.
    let slow: Vec<_> = answers
        .iter()
        .filter(|(_, took)| *took > Duration::from_millis(100))
        .collect();
    assert_eq!(slow.len(), 1, "one probe at a time: {slow:?}");
    // Calls once the circuit closed go to Redis too; only the probe may go while it is open.
    let after = limiter.check("after", &quota).await;
    assert!(
        matches!(after, Verdict::Decided(_)),
        "circuit closed: {after:?}"
    );
}

/// A token-bucket limiter with a deny cache on a batching store of `redis` (timeout 2 s),
/// verified.
async fn deny_caching_limiter(redis: &RedisServer) -> Limiter {
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    store.verify().await.unwrap();
    Limiter::builder(store)
        .algorithm(Algorithm::TokenBucket)
        .deny_cache(1000)
        .build()
        .unwrap()
}

/// Promise 2: a denial that queued behind a held call and was read long after its answer came
/// is cached until the store's `retry_after` from when the answer came, not from the read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_read_late_is_cached_only_until_the_stores_retry_after() {
    let redis = RedisServer::start();
    let limiter = deny_caching_limiter(&redis).await;
    let quota = Quota::per_second(1).unwrap();
    assert!(
        limiter.check("k", &quota).await.is_allowed(),
        "the one unit"
    );
    let used = Instant::now();
    let sleeping = redis.asleep(Duration::from_millis(250)).await;
    // A lead call in flight, so that the denial queues behind it.
    let mut lead = Box::pin(limiter.check("lead", &quota));
    assert!(!poll_once(&mut lead));
    let mut denial = Box::pin(limiter.check("k", &quota));
    assert!(!poll_once(&mut denial), "queued behind the sleep");
    RedisServer::awake(sleeping).await;
    assert!(lead.await.is_allowed());
    // The denial's answer came about 250 ms after the unit was used; it is read at 800 ms.
    tokio::time::sleep(Duration::from_millis(800).saturating_sub(used.elapsed())).await;
    let verdict = denial.await;
    let retry_after = verdict.decision().expect("decided").retry_after;
    assert!(!verdict.is_allowed(), "denied: {verdict:?}");
    // Past the store's retry_after (the unit back at ~1 s): the store admits again.
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(used.elapsed())).await;
    let again = limiter.check("k", &quota).await;
    assert!(
        again.is_allowed(),
        "{:?} after the unit was used (retry_after {retry_after:?}), the check answered \
         {again:?}: the late-read denial was cached from its read",
        used.elapsed()
    );
}

/// Promise 2: a denial whose answer came before a `reset` (read after it) is not cached past
/// the control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_answered_before_a_reset_and_read_after_it_is_not_cached() {
    let redis = RedisServer::start();
    let limiter = deny_caching_limiter(&redis).await;
    let quota = Quota::per_hour(1).unwrap();
    assert!(limiter.check("k", &quota).await.is_allowed());
    let sleeping = redis.asleep(Duration::from_millis(200)).await;
    let mut lead = Box::pin(limiter.check("lead", &quota));
    assert!(!poll_once(&mut lead));
    let mut denial = Box::pin(limiter.check("k", &quota));
    assert!(!poll_once(&mut denial));
    RedisServer::awake(sleeping).await;
    assert!(lead.await.is_allowed());
    tokio::time::sleep(Duration::from_millis(50)).await;
    limiter.reset("k").await.expect("reset");
    let verdict = denial.await;
    assert!(!verdict.is_allowed(), "the store denied before the reset");
    let after = limiter.check("k", &quota).await;
    assert!(after.is_allowed(), "the reset holds: {after:?}");
}

/// Keys on each of the cluster's three masters: `per_node` each.
fn keys_per_node(cluster: &RedisCluster, per_node: usize) -> Vec<Vec<String>> {
    let mut keys: Vec<Vec<String>> = vec![Vec::new(); 3];
    let mut i = 0;
    while keys.iter().any(|k| k.len() < per_node) {
        let key = format!("redlimit:{{n-{i}}}");
        let node = cluster.node_for_key(&key);
        if keys[node].len() < per_node {
            keys[node].push(key);
        }
        i += 1;
    }
    keys
}

/// Promise 3: after `SCRIPT FLUSH` on every node, 256 concurrent checks with every node healthy
/// load the script on each node and run it with `EVALSHA`: no storm of `EVAL`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_script_flush_a_healthy_cluster_sees_no_eval_storm() {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let quotas = generous();
    let keys: Vec<String> = (0..256).map(|i| format!("redlimit:{{f-{i}}}")).collect();
    join_all(
        keys.iter()
            .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
    )
    .await;
    cluster.script_flush_all();
    for node in cluster.nodes() {
        node.reset_stats();
    }
    let answers = join_all(
        keys.iter()
            .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
    )
    .await;
    let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    let per_node: Vec<(u64, u64, u64)> = cluster
        .nodes()
        .iter()
        .map(|node| {
            (
                node.command_calls("script|load"),
                node.command_calls("evalsha"),
                node.command_calls("eval"),
            )
        })
        .collect();
    eprintln!("(SCRIPT LOAD, EVALSHA, EVAL) per node: {per_node:?}");
    let evals: u64 = per_node.iter().map(|(_, _, eval)| eval).sum();
    assert!(failed.is_empty(), "every check decided: {failed:?}");
    assert!(
        evals <= 3,
        "(SCRIPT LOAD, EVALSHA, EVAL) per node: {per_node:?}: an EVAL storm"
    );
}

/// Promise 3: with one master hung (`DEBUG SLEEP`) right after a `SCRIPT FLUSH`, calls on the
/// healthy masters answer within their timeout, and the hung master's keys fail within theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_master_hung_after_a_flush_each_call_answers_within_its_timeout() {
    let cluster = RedisCluster::start();
    let timeout = Duration::from_millis(400);
    let store = verified_cluster_store(&cluster, timeout).await;
    let keys = keys_per_node(&cluster, 8);
    cluster.script_flush_all();
    let sleeping = cluster.nodes()[0].asleep(Duration::from_secs(3)).await;
    let quotas = generous();
    let answers = join_all(keys.iter().enumerate().flat_map(|(node, keys)| {
        let (store, quotas) = (&store, &quotas);
        keys.iter().map(move |key| async move {
            let started = Instant::now();
            let answer = store
                .check(request(key, quotas, Algorithm::TokenBucket))
                .await;
            (node, answer, started.elapsed())
        })
    }))
    .await;
    RedisServer::awake(sleeping).await;
    let report: Vec<String> = answers
        .iter()
        .map(|(node, answer, took)| format!("node {node}: {} {took:?}", answer.is_ok()))
        .collect();
    for (node, answer, took) in &answers {
        assert!(*took <= timeout + SLACK, "within the timeout: {report:?}");
        match node {
            0 => assert!(answer.is_err(), "the hung master fails: {report:?}"),
            _ => assert!(answer.is_ok(), "healthy masters decide: {report:?}"),
        }
    }
}
