//! Hostile input on a leased key: corrupt bytes over its state, and costs of zero, above the
//! burst and `u64::MAX`: nothing hangs or panics, and the key decides again.

use std::time::{Duration, Instant};

use redlimit::{Quota, Quotas, Verdict};

use super::{balanced, consumed, leasing_and_observer, leasing_with, settled, INTERVAL, LEASING};
use crate::support::RedisServer;

/// Hostile input: corrupt bytes written over a leased key's state, for every leasing
/// algorithm. No request may wait past its bound (three store calls), and once the key is
/// cleared it decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_corrupt_bytes_in_a_leased_key_never_hang_and_the_key_decides_again() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let bound = timeout * 3 + Duration::from_millis(700);
    for algorithm in LEASING {
        let limiter = leasing_with(&redis, algorithm, timeout);
        let quota = Quota::per_second(100_000).unwrap();
        let key = format!("hot-{algorithm:?}");
        for _ in 0..20 {
            futures::future::join_all((0..50).map(|_| limiter.check(&key, &quota))).await;
        }
        let storage = limiter.storage_key(key.as_str());
        for junk in [
            &b"\xff\x00garbage-bytes-\x01\x02"[..],
            &[0u8; 3][..],
            &[0xffu8; 64][..],
        ] {
            let _: () = redis::cmd("SET")
                .arg(&storage)
                .arg(junk)
                .query(&mut redis.conn())
                .unwrap();
            let started = Instant::now();
            let verdicts = futures::future::join_all((0..200).map(|_| {
                let (limiter, key) = (limiter.clone(), key.clone());
                async move {
                    let s = Instant::now();
                    let v =
                        tokio::time::timeout(Duration::from_secs(10), limiter.check(&key, &quota))
                            .await;
                    (v, s.elapsed())
                }
            }))
            .await;
            let slowest = verdicts.iter().map(|(_, t)| *t).max().unwrap();
            let hung = verdicts.iter().filter(|(v, _)| v.is_err()).count();
            assert_eq!(hung, 0, "{algorithm:?} {junk:?}: {hung} checks hung 10 s");
            assert!(
                slowest <= bound,
                "{algorithm:?} {junk:?}: a check took {slowest:?} (bound {bound:?}), all {:?}",
                started.elapsed()
            );
        }
        let _: () = redis::cmd("DEL")
            .arg(&storage)
            .query(&mut redis.conn())
            .unwrap();
        tokio::time::sleep(INTERVAL * 2).await;
        let mut decided = 0;
        for _ in 0..50 {
            if let Verdict::Decided(d) = limiter.check(&key, &quota).await {
                decided += u64::from(d.allowed);
            }
        }
        assert!(
            decided >= 45,
            "{algorithm:?}: after DEL only {decided} of 50 admitted by a decision"
        );
        let stats = settled(&limiter).await;
        assert!(balanced(&stats), "{algorithm:?}: {stats:?}");
    }
}

/// Hostile input: costs of 0, above the burst and u64::MAX on a leased key: nothing panics or
/// hangs, a cost above the burst is denied, a peek consumes nothing, and Redis counts exactly
/// what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_zero_and_huge_costs_on_a_leased_key() {
    let redis = RedisServer::start();
    let (limiter, observer) = leasing_and_observer(&redis, Duration::from_secs(2));
    let quota = Quota::per_day(1_000_000).unwrap();
    let quotas = Quotas::from(&quota);
    let mut admitted = 0u64;
    for _ in 0..10 {
        for v in futures::future::join_all((0..100).map(|_| limiter.check("k", &quota))).await {
            admitted += u64::from(v.is_allowed());
        }
    }
    for cost in [0, quota.burst() + 1, u64::MAX / 2, u64::MAX] {
        let v = tokio::time::timeout(
            Duration::from_secs(5),
            limiter.check_quotas("k", &quotas, cost),
        )
        .await
        .unwrap_or_else(|_| panic!("cost {cost} hung"));
        if cost > 0 {
            assert!(!v.is_allowed(), "cost {cost} admitted: {v:?}");
        }
    }
    // A cost of exactly the burst less what was used: admitted all at once, or denied.
    limiter.release_leases().await;
    let stats = settled(&limiter).await;
    let consumed = consumed(&observer, "k", &quota).await;
    eprintln!("costs: admitted {admitted}, consumed {consumed}; {stats:?}");
    assert_eq!(
        consumed,
        admitted + stats.stranded,
        "Redis consumed {consumed}, admitted {admitted}, stranded {}; {stats:?}",
        stats.stranded
    );
}
