//! Batches when Redis fails under them: a `DEBUG SLEEP` past the timeout, Redis killed or
//! restarted mid-batch, `SCRIPT FLUSH` and `FLUSHALL`, a half-open circuit's probe, `READONLY`
//! after a demotion and a Sentinel failover: every queued decision is answered within its own
//! timeout, as it would be alone, and the store recovers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{
    CheckRequest, CircuitBreaker, RedisStore, Store, StoreError, DEFAULT_MAX_BATCH,
};
use redlimit::{Algorithm, Quota, Quotas};

use super::{
    admits, all_decided_within, assert_later_decisions_go_alone, batched_and_unbatched,
    behind_a_sleep, consumed, decided_within, generous, keys, lone_and_fast, new_store, none_past,
    on_shared, request, requests, shared_quota, show, text, timed, timed_owned, together_owned,
    warm_store, SLACK,
};
use crate::support::{self, RedisServer};

/// `DEBUG SLEEP` past the timeout with a leader and a queue (several full batches): every
/// decision answers within its own timeout plus the slack; what is consumed is no more than the
/// calls sent (the leader's and the sender's first); the decisions that timed out before their
/// call was sent consume nothing; and later decisions go alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_past_the_timeout_answers_each_within_its_timeout_and_consumes_only_what_was_sent()
{
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let store = warm_store(&redis, timeout, DEFAULT_MAX_BATCH).await;
    let key = "redlimit:{slept}";
    let quotas = shared_quota();
    let before = consumed(&store, key).await;
    let sleeping = redis.asleep(Duration::from_millis(900)).await;
    let one = |store: &RedisStore| {
        let store = store.clone();
        async move {
            let quotas = shared_quota();
            let started = Instant::now();
            let answer = store.check(on_shared("redlimit:{slept}", &quotas, 1)).await;
            (answer, started.elapsed())
        }
    };
    let lead = tokio::spawn(one(&store));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 200 queued, arriving over 150 ms.
    let mut queued = Vec::new();
    for i in 0..200 {
        queued.push(tokio::spawn(one(&store)));
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    let mut answers = vec![lead.await.unwrap()];
    for task in queued {
        answers.push(task.await.unwrap());
    }
    sleeping.join().unwrap();
    let _ = &quotas;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let used = consumed(&store, key).await - before;
    let worst = answers.iter().map(|(_, took)| *took).max().unwrap();
    let timed_out = answers
        .iter()
        .filter(|(a, _)| matches!(a, Err(StoreError::Timeout(_))))
        .count();
    assert!(
        none_past(&answers, timeout + SLACK),
        "worst {worst:?} (timeout {timeout:?}): {}",
        show(&answers)
    );
    // Never more than once each (a full queue goes at once, so most calls were on the wire).
    assert!(
        used <= 201,
        "consumed {used} for 201 decisions of which {timed_out} timed out"
    );
    eprintln!("consumed {used} for 201 decisions of which {timed_out} timed out; worst {worst:?}");
    let after = format!("after a sleep that consumed {used}");
    assert_later_decisions_go_alone(&redis, &store, "after-sleep", &after).await;
}

/// Redis killed (SIGKILL) with a leader and a queue in flight, then started again: every decision
/// answers within its timeout plus the slack, and after the restart decisions are decided
/// again, alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_batch_answers_each_within_its_timeout_and_the_store_recovers() {
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(400);
    let store = warm_store(&redis, timeout, DEFAULT_MAX_BATCH).await;
    let _sleeping = redis.asleep(Duration::from_millis(2_000)).await;
    let lead = tokio::spawn(timed_owned(&store, "redlimit:{killed-lead}"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let queued = tokio::spawn(together_owned(&store, "killed-queued", 100));
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.stop();
    let mut answers = vec![lead.await.unwrap()];
    answers.extend(queued.await.unwrap());
    let worst = answers.iter().map(|(_, took)| *took).max().unwrap();
    let failed = answers.iter().filter(|(a, _)| a.is_err()).count();
    eprintln!(
        "killed mid-batch: {failed} of {} failed, worst {worst:?}",
        answers.len()
    );
    assert!(none_past(&answers, timeout + SLACK), "{}", show(&answers));
    redis.restart();
    // Reconnecting takes a few calls at most (the manager backs off from 10 ms).
    let mut recovered = None;
    for attempt in 0..40 {
        let (answer, _) = timed(&store, &format!("redlimit:{{after-restart-{attempt}}}")).await;
        if answer.is_ok() {
            recovered = Some(attempt);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered.is_some(), "no decision after the restart");
    let (calls, batches, later) = lone_and_fast(&redis, &store, "after-restart-lone").await;
    eprintln!(
        "recovered after {recovered:?} attempts; later {calls} calls {batches} batches: {}",
        show(&later)
    );
    assert!(
        calls >= 3 && batches == 0 && all_decided_within(&later, Duration::from_millis(300)),
        "recovered after {recovered:?} attempts; later: {calls} calls, {batches} batches: {}",
        show(&later)
    );
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
    let store = new_store(&redis, timeout, DEFAULT_MAX_BATCH);
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
async fn readonly_inside_a_batch_replaces_the_stale_connection_as_alone_with(max_batch: usize) {
    // At debug: a failed call's stale connection is a debug line (its failure's episode warns).
    let (captured, _guard) = support::logs::capture(tracing::Level::DEBUG);
    let primary = RedisServer::start();
    let demoted = RedisServer::start();
    let tight: Quotas = Quota::per_hour(1).unwrap().into();
    let lead = "redlimit:{ro-lead}";
    // The first call's key is spent on the primary, so that on the replica its decision is a
    // denial, which writes nothing and answers.
    let on_primary = support::redis_store(&primary);
    assert!(admits(&on_primary, lead, &tight, Algorithm::Gcra).await);
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
    let store = new_store(&demoted, support::PATIENT_TIMEOUT, max_batch);
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
    let answers = behind_a_sleep(
        &demoted,
        &store,
        Duration::from_millis(300),
        request(lead, &tight, Algorithm::Gcra),
        &requests(&keys, &quotas, Algorithm::Gcra),
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

batched_and_unbatched! {
    async fn readonly_inside_a_batch_replaces_the_stale_connection_as_alone,
    readonly_inside_a_batch_replaces_the_stale_connection_as_alone_unbatched
        = readonly_inside_a_batch_replaces_the_stale_connection_as_alone_with
}

/// Through a failover asked of the sentinels, under a load that keeps queues full (32 callers
/// without pause): no caller waits past the bound, the queued decisions move to the new
/// primary and share calls there, and the last requests are all decided.
#[test]
fn through_a_sentinel_failover_queued_decisions_move_to_the_new_primary() {
    use support::sentinel::RedisSentinel;
    let runtime = support::multi_thread_runtime();
    let setup = RedisSentinel::start();
    let store = setup.verified_store(&runtime);
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
    setup.ask_failover();
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
