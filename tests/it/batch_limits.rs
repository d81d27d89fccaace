//! What one batched call may carry, and Redis's `maxmemory`: a batch at `MAX_BATCH` is served,
//! a larger one is refused at build, and each decision of a batch meets `maxmemory` as it
//! would alone (`lua/batch.lua`, `lua/sliding_log.lua`).

use crate::support;

use std::time::Duration;

use futures::future::join_all;
use redlimit::store::{BuildError, CheckRequest, RedisStore, Store, StoreError, MAX_BATCH};
use redlimit::{Algorithm, Decision, Quota, Quotas};
use support::RedisServer;

use super::batching::{generous, request};

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
    let store = RedisStore::builder(redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(MAX_BATCH)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
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

/// Redis with `maxmemory` below what it uses and nothing to evict (`noeviction`).
pub(crate) fn out_of_memory(redis: &RedisServer) {
    let mut conn = redis.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut conn)
        .unwrap();
}

fn is_oom(answer: &Result<Decision, StoreError>) -> bool {
    matches!(answer, Err(error) if error.to_string().contains("OOM"))
}

/// Alone, a sliding log's admission under `maxmemory` is refused with `OOM` and writes
/// nothing (its removal of old units came first and let the new ones past it).
#[tokio::test]
async fn a_sliding_log_admission_alone_writes_nothing_past_maxmemory() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(1)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let quotas: Quotas = Quota::per_hour(10).unwrap().into();
    let key = "redlimit:{log-alone}";
    // One unit on record before, so that the log exists.
    assert!(
        store
            .check(request(key, &quotas, Algorithm::SlidingLog))
            .await
            .unwrap()
            .allowed
    );
    let before = sorted_sets(&redis);
    out_of_memory(&redis);
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
    let store = RedisStore::builder(redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let quotas: Quotas = Quota::per_hour(1).unwrap().into();
    // A key at its limit, and the batch script loaded, before memory runs out.
    let full = "redlimit:{oom-full}";
    assert!(
        store
            .check(request(full, &quotas, Algorithm::Gcra))
            .await
            .unwrap()
            .allowed
    );
    let warm = generous();
    let sleeping = redis.debug_sleep(Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(20)).await;
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
    out_of_memory(&redis);

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
