//! What one batched call may carry, and Redis's `maxmemory`: a batch at `MAX_BATCH` is served,
//! a larger one is refused at build, and each decision of a batch meets `maxmemory` as it
//! would alone (`lua/batch.lua`, `lua/sliding_log.lua`).

use super::sender::main_runtime;
use super::{
    admits, connected_store, script_calls, show, store_on, store_without_breaker, timed,
    warm_batch_script, warm_store,
};
use crate::support;
use redlimit::{Limiter, Target};
use std::time::Instant;

use std::time::Duration;

use futures::future::join_all;
use redlimit::store::{
    BuildError, CheckRequest, RedisStore, Store, StoreError, DEFAULT_MAX_BATCH, MAX_BATCH,
};
use redlimit::{Algorithm, Decision, Quota, Quotas};
use support::RedisServer;

use super::{generous, request};

#[test]
fn a_batch_larger_than_the_scripts_can_carry_is_refused_at_build() {
    for max_batch in [MAX_BATCH + 1, 9_000, usize::MAX] {
        let built = RedisStore::builder("redis://127.0.0.1:6379")
            .max_batch(max_batch)
            .build();
        match built {
            Err(error @ BuildError::BatchTooLarge(_)) => {
                assert!(
                    error.to_string().contains(&MAX_BATCH.to_string()),
                    "{error}"
                )
            }
            other => panic!("max_batch({max_batch}): {other:?}"),
        }
    }
    assert!(RedisStore::builder("redis://127.0.0.1:6379")
        .max_batch(MAX_BATCH)
        .build()
        .is_ok());
}

/// Full batches at the bound, of every algorithm (the sliding log's three keys each), queued
/// behind a call in flight: every decision is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_batches_at_the_bound_are_decided() {
    let redis = RedisServer::start();
    let store = connected_store(&redis, support::PATIENT_TIMEOUT, MAX_BATCH).await;
    let quotas = generous();
    let algorithms = [
        Algorithm::SlidingLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ];
    let count = 3 * MAX_BATCH + 7;
    let keys: Vec<String> = (0..count)
        .map(|i| format!("redlimit:{{full-{i}}}"))
        .collect();
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let lead = store.check(request("redlimit:{lead}", &quotas, Algorithm::TokenBucket));
    let queued =
        async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            join_all(keys.iter().enumerate().map(|(i, key)| {
                store.check(request(key, &quotas, algorithms[i % algorithms.len()]))
            }))
            .await
        };
    let (lead, answers) = tokio::join!(lead, queued);
    sleeping.join().unwrap();
    lead.unwrap();
    let failed: Vec<_> = answers.iter().filter(|answer| answer.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {count} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    assert!(answers
        .iter()
        .all(|answer| answer.as_ref().unwrap().allowed));
}

fn is_oom(answer: &Result<Decision, StoreError>) -> bool {
    matches!(answer, Err(error) if error.to_string().contains("OOM"))
}

/// Alone, a sliding log's admission under `maxmemory` is refused with `OOM` and writes
/// nothing (its removal of old units came first and let the new ones past it).
#[tokio::test]
async fn a_sliding_log_admission_alone_writes_nothing_past_maxmemory() {
    let redis = RedisServer::start();
    let store = connected_store(&redis, support::PATIENT_TIMEOUT, 1).await;
    let quotas: Quotas = Quota::per_hour(10).unwrap().into();
    let key = "redlimit:{log-alone}";
    // One unit on record before, so that the log exists.
    assert!(admits(&store, key, &quotas, Algorithm::SlidingLog).await);
    let before = sorted_sets(&redis);
    redis.out_of_memory();
    let answer = store
        .check(request(key, &quotas, Algorithm::SlidingLog))
        .await;
    let fresh = store
        .check(request(
            "redlimit:{log-new}",
            &quotas,
            Algorithm::SlidingLog,
        ))
        .await;
    assert!(
        is_oom(&answer),
        "a sliding log admission under maxmemory: {answer:?}"
    );
    assert!(
        is_oom(&fresh),
        "a new sliding log under maxmemory: {fresh:?}"
    );
    assert_eq!(sorted_sets(&redis), before, "units written past maxmemory");
}

/// Every key, with its sorted set's size (0 for other types).
fn sorted_sets(redis: &RedisServer) -> Vec<(String, u64)> {
    let mut conn = redis.conn();
    let mut keys = redis.keys();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let size = redis::cmd("ZCARD").arg(&key).query(&mut conn).unwrap_or(0);
            (key, size)
        })
        .collect()
}

/// In one batch, behind a decision that wrote nothing: a sliding log's admission, then a token
/// bucket's, then a denial. Each meets `maxmemory` as alone: both admissions refused with
/// `OOM` (nothing written), the denial still a denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_of_a_batch_meets_maxmemory_as_alone() {
    let redis = RedisServer::start();
    let store = connected_store(&redis, support::PATIENT_TIMEOUT, DEFAULT_MAX_BATCH).await;
    let quotas: Quotas = Quota::per_hour(1).unwrap().into();
    // A key at its limit, and the batch script loaded, before memory runs out.
    let full = "redlimit:{oom-full}";
    assert!(admits(&store, full, &quotas, Algorithm::Gcra).await);
    let warm = generous();
    let sleeping = redis.asleep(Duration::from_millis(100)).await;
    join_all((0..4).map(|i| {
        let key = format!("redlimit:{{oom-warm-{i}}}");
        let store = store.clone();
        let warm = &warm;
        async move {
            store
                .check(request(&key, warm, Algorithm::TokenBucket))
                .await
        }
    }))
    .await;
    sleeping.join().unwrap();
    let before = sorted_sets(&redis);
    redis.out_of_memory();

    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let peek = |key| CheckRequest {
        cost: 0,
        ..request(key, &quotas, Algorithm::TokenBucket)
    };
    // A call in flight, then a peek (a sender's call of its own, writing nothing), then the
    // three decisions: queued behind it, they share one call.
    let lead = store.check(peek("redlimit:{oom-lead}"));
    let first = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        store.check(peek("redlimit:{oom-peek}")).await
    };
    let batch = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        join_all(
            [
                request("redlimit:{oom-log}", &quotas, Algorithm::SlidingLog),
                request("redlimit:{oom-bucket}", &quotas, Algorithm::TokenBucket),
                request(full, &quotas, Algorithm::Gcra),
            ]
            .map(|request| store.check(request)),
        )
        .await
    };
    let (lead, first, answers) = tokio::join!(lead, first, batch);
    sleeping.join().unwrap();
    assert!(
        lead.is_ok() && first.is_ok(),
        "peeks write nothing: {lead:?} {first:?}"
    );
    assert!(is_oom(&answers[0]), "sliding log: {:?}", answers[0]);
    assert!(
        is_oom(&answers[1]),
        "token bucket after it: {:?}",
        answers[1]
    );
    assert!(
        matches!(&answers[2], Ok(decision) if !decision.allowed),
        "a denial is decided as alone: {:?}",
        answers[2]
    );
    assert_eq!(sorted_sets(&redis), before, "written past maxmemory");
}

// ---------------------------------------------------------------------------------------------
// maxmemory.
// ---------------------------------------------------------------------------------------------

/// Every key with its type and content (strings' bytes; sorted sets' members and scores), no
/// TTLs, sorted by key: what two servers that decided the same must hold alike.
fn contents(redis: &RedisServer) -> Vec<(String, String)> {
    redis.contents(|conn, key| {
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(conn)
            .unwrap();
        format!("{members:?}")
    })
}

fn outcome(answer: &Result<Decision, StoreError>) -> String {
    match answer {
        Ok(decision) => format!(
            "allowed={} remaining={} retry={:?} suspended={} overridden={}",
            decision.allowed,
            decision.remaining,
            decision.retry_after,
            decision.suspended,
            decision.overridden
        ),
        Err(error) if error.to_string().contains("OOM") => "OOM".to_owned(),
        Err(error) => format!("error: {error}"),
    }
}

/// Sets up the same data on a server: keys at their limit, overrides (route and tenant-wide), a
/// tenant reset, a suspension, a log of another type, a clock that stepped back.
async fn mixed_fixture(redis: &RedisServer, now: u64) {
    let store = store_without_breaker(redis, support::PATIENT_TIMEOUT, 1);
    let one: Quotas = Quota::per_hour(1).unwrap().into();
    let at = |key, algorithm, cost| CheckRequest {
        key,
        algorithm,
        quotas: &one,
        cost,
        now_micros: Some(now - 1_000_000),
    };
    for (key, algorithm) in [
        ("redlimit:{full-gcra}", Algorithm::Gcra),
        ("redlimit:{full-log}", Algorithm::SlidingLog),
        ("redlimit:{full-sw}", Algorithm::SlidingWindow),
        ("redlimit:{known-tb}", Algorithm::TokenBucket),
    ] {
        store.check(at(key, algorithm, 1)).await.unwrap();
    }
    // A log from a clock 10 s ahead: a later decision steps back (and repairs on a denial).
    let ahead = CheckRequest {
        now_micros: Some(now + 10_000_000),
        ..at("redlimit:{ahead-log}", Algorithm::SlidingLog, 1)
    };
    store.check(ahead).await.unwrap();
    let tight = Quotas::from(Quota::per_hour(2).unwrap());
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingLog] {
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        let name = format!(
            "over-{}",
            if algorithm == Algorithm::SlidingLog {
                "log"
            } else {
                "tb"
            }
        );
        limiter.set_quota(name.as_str(), &tight).await.unwrap();
        let tenant = format!(
            "tenant-{}",
            if algorithm == Algorithm::SlidingLog {
                "log"
            } else {
                "tb"
            }
        );
        // A used route, then a tenant-wide override and a tenant reset.
        let route = Target::scoped("api", &tenant);
        let key = limiter.storage_key(route);
        store
            .check(CheckRequest {
                key: &key,
                algorithm,
                quotas: &one,
                cost: 1,
                now_micros: Some(now - 1_000_000),
            })
            .await
            .unwrap();
        limiter
            .set_quota(Target::all_routes(&tenant), &tight)
            .await
            .unwrap();
        limiter.reset(tenant.as_str()).await.unwrap();
        let suspended = format!(
            "susp-{}",
            if algorithm == Algorithm::SlidingLog {
                "log"
            } else {
                "tb"
            }
        );
        limiter
            .suspend(suspended.as_str(), Duration::from_secs(3600))
            .await
            .unwrap();
    }
    let mut conn = redis.conn();
    let _: () = redis::cmd("SET")
        .arg("redlimit:{string-log}")
        .arg("not a set")
        .query(&mut conn)
        .unwrap();
}

/// Copies every key of `from` (its bytes and its TTL) to `to`: twins with the same data.
fn copy_data(from: &RedisServer, to: &RedisServer) {
    let (mut source, mut target) = (from.conn(), to.conn());
    for key in from.keys() {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut source).unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut source).unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(&key)
            .arg(ttl.max(0))
            .arg(dump)
            .arg("REPLACE")
            .query(&mut target)
            .unwrap();
    }
}

/// Decisions of every kind in one batch under `maxmemory` with `noeviction`, in several orders,
/// each compared with the same decision alone (`max_batch(1)`) on a twin server with the same
/// data and clock: the same outcome each, and the same data after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_maxmemory_a_mixed_batch_decides_each_as_alone_on_a_twin() {
    let now = 1_900_000_000_000_000u64;
    let one: Quotas = Quota::per_hour(1).unwrap().into();
    let eight = Quotas::new((0..8).map(|i| Quota::per_hour(1_000 + i).unwrap())).unwrap();
    let plenty = generous();
    // Whatever the key layout, ask a limiter: the route of a scoped target.
    let probe = Limiter::new(redlimit::store::MemoryStore::new());
    let log_tenant = probe.storage_key(Target::scoped("api", "tenant-log"));
    let tb_tenant = probe.storage_key(Target::scoped("api", "tenant-tb"));
    let plan: Vec<(String, Algorithm, &Quotas, u64)> = vec![
        (
            "redlimit:{known-tb}".into(),
            Algorithm::TokenBucket,
            &one,
            0,
        ), // peek
        ("redlimit:{full-gcra}".into(), Algorithm::Gcra, &one, 1), // denial
        ("redlimit:{full-log}".into(), Algorithm::SlidingLog, &one, 1), // denial
        (
            "redlimit:{full-sw}".into(),
            Algorithm::SlidingWindow,
            &one,
            0,
        ), // peek
        (
            "redlimit:{string-log}".into(),
            Algorithm::SlidingLog,
            &one,
            0,
        ), // peek, foreign
        ("redlimit:{susp-tb}".into(), Algorithm::TokenBucket, &one, 1), // suspended
        ("redlimit:{susp-log}".into(), Algorithm::SlidingLog, &one, 1), // suspended
        (
            "redlimit:{ahead-log}".into(),
            Algorithm::SlidingLog,
            &one,
            5,
        ), // stepped back, denied
        ("redlimit:{new-log}".into(), Algorithm::SlidingLog, &one, 1), // admission
        (
            "redlimit:{known-tb}".into(),
            Algorithm::TokenBucket,
            &plenty,
            1,
        ), // admission
        ("redlimit:{eight}".into(), Algorithm::FixedWindow, &eight, 3), // 8 tiers
        ("redlimit:{over-tb}".into(), Algorithm::TokenBucket, &one, 1), // override admits
        ("redlimit:{over-log}".into(), Algorithm::SlidingLog, &one, 1), // override admits
        (tb_tenant.clone(), Algorithm::TokenBucket, &one, 1),      // tenant reset + override
        (log_tenant.clone(), Algorithm::SlidingLog, &one, 1),      // tenant reset (DEL)
        (
            "redlimit:{string-log}".into(),
            Algorithm::SlidingLog,
            &one,
            1,
        ), // foreign: DEL
        ("redlimit:{new-gcra}".into(), Algorithm::Gcra, &one, 1),  // admission
    ];
    // Several orders: as written, reversed, denials and peeks last, writers first.
    let mut orders: Vec<Vec<usize>> =
        vec![(0..plan.len()).collect(), (0..plan.len()).rev().collect()];
    let mut rotated: Vec<usize> = (0..plan.len()).collect();
    rotated.rotate_left(8);
    orders.push(rotated);
    let mut shuffled: Vec<usize> = (0..plan.len()).collect();
    // A fixed permutation (multiplicative, 17 entries).
    shuffled.sort_by_key(|i| (i * 7) % plan.len());
    orders.push(shuffled);
    let mut failures = Vec::new();
    for (o, order) in orders.iter().enumerate() {
        let batched_redis = RedisServer::start();
        let alone_redis = RedisServer::start();
        mixed_fixture(&batched_redis, now).await;
        copy_data(&batched_redis, &alone_redis);
        let batched = store_without_breaker(&batched_redis, support::PATIENT_TIMEOUT, MAX_BATCH);
        let alone = store_without_breaker(&alone_redis, support::PATIENT_TIMEOUT, 1);
        batched.verify().await.unwrap();
        alone.verify().await.unwrap();
        // The batch script loaded (its warm-up keys then deleted on both twins alike).
        warm_batch_script(&batched_redis, &batched).await;
        let mut conn = batched_redis.conn();
        for i in 0..4 {
            let _: () = redis::cmd("DEL")
                .arg(format!("redlimit:{{warm-{i}}}"))
                .query(&mut conn)
                .unwrap();
        }
        for redis in [&batched_redis, &alone_redis] {
            redis.out_of_memory();
        }
        let requests: Vec<CheckRequest<'_>> = order
            .iter()
            .map(|&i| {
                let (key, algorithm, quotas, cost) = &plan[i];
                CheckRequest {
                    key,
                    algorithm: *algorithm,
                    quotas,
                    cost: *cost,
                    now_micros: Some(now),
                }
            })
            .collect();
        let before_batched = contents(&batched_redis);
        assert_eq!(before_batched, contents(&alone_redis), "twins start alike");
        // Batched: a peek in flight, then the whole plan queued behind it in one call.
        batched_redis.reset_stats();
        let sleeping = batched_redis.asleep(Duration::from_millis(250)).await;
        let lead_key = "redlimit:{lead-peek}";
        let lead = batched.check(CheckRequest {
            cost: 0,
            ..request(lead_key, &one, Algorithm::Gcra)
        });
        let queued = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            // A sender's first call carries the first queued decision alone: a peek first.
            let first = batched.check(CheckRequest {
                cost: 0,
                ..request("redlimit:{first-peek}", &one, Algorithm::Gcra)
            });
            let rest = async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                join_all(requests.iter().map(|r| batched.check(*r))).await
            };
            tokio::join!(first, rest).1
        };
        let (_, batched_answers) = tokio::join!(lead, queued);
        sleeping.join().unwrap();
        let (calls, batches) = script_calls(&batched_redis);
        let refused = batched_answers
            .iter()
            .filter(|a| outcome(a) == "OOM")
            .count();
        eprintln!(
            "order {o}: {calls} script calls, {batches} batch calls; {refused} of {} refused \
             with OOM",
            batched_answers.len()
        );
        let stats = batched_redis.info("commandstats");
        assert!(
            batches == 1 && calls <= 4,
            "the plan went in one batch call: {calls} calls: {stats}"
        );
        assert!(refused >= 5, "writers refused under maxmemory: {refused}");
        let mut alone_answers = Vec::new();
        for r in &requests {
            alone_answers.push(alone.check(*r).await);
        }
        for (k, (b, a)) in batched_answers.iter().zip(&alone_answers).enumerate() {
            let (b, a) = (outcome(b), outcome(a));
            if b != a {
                failures.push(format!(
                    "order {o}, #{k} {}: batched {b} / alone {a}",
                    plan[order[k]].0
                ));
            }
        }
        let (after_b, after_a) = (contents(&batched_redis), contents(&alone_redis));
        if after_b != after_a {
            let differ: Vec<_> = after_b
                .iter()
                .zip(&after_a)
                .filter(|(b, a)| b != a)
                .collect();
            failures.push(format!(
                "order {o}: data differ: {differ:?} ({} / {} keys)",
                after_b.len(),
                after_a.len()
            ));
        }
        if after_b != before_batched {
            failures.push(format!("order {o}: written past maxmemory"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ---------------------------------------------------------------------------------------------
// The size bound.
// ---------------------------------------------------------------------------------------------

/// Full batches at MAX_BATCH of sliding logs with eight tiers, a high cost (1 000 units each)
/// and long keys (2 000 bytes), behind a call in flight: every decision decided, each admitted
/// with what it would be alone, and (reported) how long Redis ran one such call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_batches_of_costly_eight_tier_sliding_logs_with_long_keys_are_decided() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, Duration::from_secs(30), MAX_BATCH).await;
    let eight = Quotas::new((0..8).map(|i| Quota::per_hour(5_000 + i).unwrap())).unwrap();
    let count = MAX_BATCH + MAX_BATCH / 2;
    let pad = "x".repeat(2_000);
    let keys: Vec<String> = (0..count)
        .map(|i| format!("redlimit:{{big-{i}-{pad}}}"))
        .collect();
    redis.reset_stats();
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let lead = store.check(request(
        "redlimit:{big-lead}",
        &eight,
        Algorithm::SlidingLog,
    ));
    let started = Instant::now();
    let queued = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        join_all(keys.iter().map(|key| {
            store.check(CheckRequest {
                cost: 1_000,
                ..request(key, &eight, Algorithm::SlidingLog)
            })
        }))
        .await
    };
    let (lead, answers) = tokio::join!(lead, queued);
    let took = started.elapsed();
    sleeping.join().unwrap();
    lead.unwrap();
    let stats = redis.info("commandstats");
    let evalsha = support::info_field(&stats, "cmdstat_evalsha")
        .unwrap_or("")
        .to_owned();
    let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    eprintln!("{count} costly decisions in {took:?}; {evalsha}");
    assert!(
        failed.is_empty(),
        "{} of {count} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    for answer in &answers {
        let decision = answer.as_ref().unwrap();
        assert!(
            decision.allowed && decision.remaining == 4_000,
            "{decision:?}"
        );
    }
}

/// Guards against: one batch call carries the Redis work of up to MAX_BATCH decisions, and Redis runs it
/// as one script: 1 024 sliding-log admissions of 4 000 units each (burst 5 000, the log's
/// O(burst) work per decision) make one `EVALSHA` that runs for seconds, past Redis's
/// `busy-reply-threshold` (5 s): meanwhile Redis answers `BUSY` to every other client (here a
/// second store, another instance of the fleet), and the script cannot be killed (it wrote).
/// Sent alone (`max_batch(1)`), the same decisions are separate scripts of ~10 ms each: the
/// other instance waits (Redis reads one client's pipelined commands together) but is never
/// refused with `BUSY`. Promise (src/store/mod.rs, "Batching"): "Nothing
/// else changes for a user ... What changes is the cost"; docs/production.md: "only Redis's
/// cost per decision drops".
#[test]
fn a_full_batch_of_costly_decisions_keeps_other_clients_decided_as_alone() {
    let mut figures = Vec::new();
    let mut busies = Vec::new();
    for max_batch in [MAX_BATCH, 1] {
        let redis = RedisServer::start();
        let main = main_runtime();
        let store = store_on(&main, &redis, Duration::from_secs(60), max_batch);
        let other = store_on(&main, &redis, Duration::from_secs(1), 1);
        let quotas: Quotas = Quota::per_hour(5_000).unwrap().into();
        let keys: Vec<String> = (0..MAX_BATCH + 1)
            .map(|i| format!("redlimit:{{costly-{i}}}"))
            .collect();
        let (admitted, other_answers, took) = main.block_on(async {
            let started = Instant::now();
            let costly = async {
                join_all(keys.iter().map(|key| {
                    store.check(CheckRequest {
                        cost: 4_000,
                        ..request(key, &quotas, Algorithm::SlidingLog)
                    })
                }))
                .await
            };
            let beside = async {
                let mut answers = Vec::new();
                tokio::time::sleep(Duration::from_millis(200)).await;
                while started.elapsed() < Duration::from_secs(8) {
                    answers.push(
                        timed(&other, &format!("redlimit:{{other-{}}}", answers.len())).await,
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answers
            };
            let (costly, beside) = tokio::join!(costly, beside);
            let admitted = costly
                .iter()
                .filter(|a| matches!(a, Ok(d) if d.allowed))
                .count();
            (admitted, beside, started.elapsed())
        });
        let stats = redis.info("commandstats");
        let evalsha = support::info_field(&stats, "cmdstat_evalsha")
            .unwrap_or("")
            .to_owned();
        let busy = other_answers
            .iter()
            .filter(|(a, _)| matches!(a, Err(e) if e.to_string().contains("BUSY")))
            .count();
        let failed = other_answers.iter().filter(|(a, _)| a.is_err()).count();
        figures.push(format!(
            "max_batch {max_batch}: {admitted} of {} admitted in {took:.1?} ({evalsha}); the other \
             instance: {failed} of {} failed ({busy} BUSY)",
            keys.len(),
            other_answers.len()
        ));
        figures.push(show(&other_answers));
        busies.push(busy);
    }
    eprintln!("{figures:#?}");
    // The control: alone, Redis never refuses the other instance with BUSY (it may make it
    // wait: Redis reads a client's pipelined commands together).
    assert_eq!(busies[1], 0, "{figures:#?}");
    assert_eq!(
        busies[0], 0,
        "BUSY answers to the other instance: {figures:#?}"
    );
}
