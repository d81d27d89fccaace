//! Floods of distinct keys: Redis memory bounded by expiry, a bounded `MemoryStore` never
//! above its cap, and never resetting a busy key while it holds expired ones.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use redis::aio::MultiplexedConnection;
use redlimit::store::MemoryStore;
use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Limiter, Quota, Verdict,
};

use crate::support::RedisServer;
use crate::{
    aconn, exclusive, flushall, key_type, keys_of, memory_usage, redis_limiter, shared,
    shared_blocking, used_memory,
};

async fn dbsize(conn: &mut MultiplexedConnection) -> u64 {
    redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .expect("DBSIZE")
}

/// The flood's target; it stops early (and says so) if the machine is too slow.
const FLOOD_KEYS: usize = 1_000_000;
const FLOOD_DEADLINE: Duration = Duration::from_secs(55);

/// A million checks on distinct keys with the token bucket through `Limiter::check`: every one
/// is decided by Redis and admitted, the key count never approaches the number of keys (expiry
/// keeps up during the flood), and once the keys' time is over, key count and memory are back
/// at the baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_distinct_keys_are_bounded_by_expiry() {
    let _machine = exclusive().await;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    // One check empties the bucket (limit 1), so each key lives exactly one period: 1 s.
    let quota = Quota::new(1, Duration::from_secs(1)).unwrap();
    let ttl = quota.period();

    // Warm up (script loaded, connections open), then the baseline.
    const TASKS: usize = 8;
    const IN_FLIGHT: usize = 128; // per task: enough to keep Redis busy, more only adds latency
    let limiters: Vec<Limiter> = (0..TASKS)
        .map(|_| redis_limiter(&redis, Algorithm::TokenBucket))
        .collect();
    for limiter in &limiters {
        assert!(limiter.check("warm-up", &quota).await.decision().is_some());
    }
    flushall(&mut conn).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base_keys = dbsize(&mut conn).await;
    let base_memory = used_memory(&mut conn).await;

    // Sample the key count and memory during the flood.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let mut conn = aconn(&redis).await;
        tokio::spawn(async move {
            let (mut peak_keys, mut peak_memory) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                peak_keys = peak_keys.max(dbsize(&mut conn).await);
                peak_memory = peak_memory.max(used_memory(&mut conn).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (peak_keys, peak_memory)
        })
    };

    let started = Instant::now();
    let deadline = started + FLOOD_DEADLINE;
    let next = Arc::new(AtomicUsize::new(0));
    let issued = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = limiters
        .iter()
        .cloned()
        .map(|limiter| {
            let next = next.clone();
            let issued = issued.clone();
            let admitted = admitted.clone();
            tokio::spawn(async move {
                let keys = std::iter::from_fn(|| {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    (i < FLOOD_KEYS).then(|| {
                        issued.fetch_add(1, Ordering::Relaxed);
                        i
                    })
                });
                stream::iter(keys)
                    .map(|i| {
                        let limiter = limiter.clone();
                        async move { limiter.check(&format!("flood-{i}"), &quota).await }
                    })
                    .buffer_unordered(IN_FLIGHT)
                    .for_each(|verdict| {
                        if let Verdict::Decided(d) = verdict {
                            if d.allowed {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        async {}
                    })
                    .await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("flood task");
    }
    let flood_time = started.elapsed();
    let keys_right_after = dbsize(&mut conn).await;
    let memory_right_after = used_memory(&mut conn).await;
    let done = issued.load(Ordering::Relaxed);
    // The newest keys are still alive: their exact size.
    let mut sample = 0;
    for i in (done.saturating_sub(64)..done).rev() {
        let key = limiters[0].storage_key(&format!("flood-{i}"));
        sample = memory_usage(&mut conn, key.as_bytes()).await;
        if sample > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (peak_keys, peak_memory) = sampler.await.expect("sampler");

    let admitted = admitted.load(Ordering::Relaxed);
    let errors: u64 = limiters.iter().map(|l| l.stats().store_errors).sum();

    // Let the last keys' time pass, then wait for Redis to expire them (lazily + actively).
    let drain_started = Instant::now();
    tokio::time::sleep(ttl).await;
    let (mut keys_after, mut memory_after) = (u64::MAX, u64::MAX);
    while drain_started.elapsed() < ttl + Duration::from_secs(10) {
        keys_after = dbsize(&mut conn).await;
        memory_after = used_memory(&mut conn).await;
        if keys_after <= base_keys && memory_after <= base_memory + 256 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_time = drain_started.elapsed();

    let rate = done as f64 / flood_time.as_secs_f64();
    let per_key = (memory_right_after.saturating_sub(base_memory)) / keys_right_after.max(1);
    if done < FLOOD_KEYS {
        println!(
            "flood: REDUCED to {done} keys: the {FLOOD_DEADLINE:?} deadline was reached on this machine"
        );
    }
    println!(
        "flood: {done} distinct keys via Limiter::check (token bucket, quota 1/s, {TASKS} tasks x \
         {IN_FLIGHT} in flight) in {flood_time:.2?} = {rate:.0} checks/s; admitted {admitted}, \
         store errors {errors}"
    );
    println!(
        "flood: baseline {base_keys} keys / {base_memory} B; right after {keys_right_after} keys / \
         {memory_right_after} B (~{per_key} B per key, MEMORY USAGE of one key {sample} B); \
         peak during flood {peak_keys} keys / {peak_memory} B; {drain_time:.2?} after the flood \
         {keys_after} keys / {memory_after} B"
    );

    assert!(
        done >= 100_000,
        "flood too slow to mean anything: {done} keys"
    );
    assert_eq!(errors, 0, "every check decided by Redis");
    assert_eq!(
        admitted, done as u64,
        "each distinct key's first check is admitted"
    );
    assert!(
        peak_keys < done as u64 / 4,
        "keys accumulated during the flood: peak {peak_keys} of {done}"
    );
    assert!(
        keys_after <= base_keys,
        "{keys_after} keys left after expiry (baseline {base_keys})"
    );
    assert!(
        memory_after <= base_memory + 256 * 1024,
        "used_memory {memory_after} B after expiry, baseline {base_memory} B"
    );
}

/// Every algorithm: 10 000 distinct keys on a 500 ms quota leave nothing behind once their
/// time is over. Prints each algorithm's Redis keys and memory per limiter key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_expires_its_keys() {
    let _machine = shared().await;
    const KEYS: usize = 10_000;
    let redis = RedisServer::start();
    let mut conn = aconn(&redis).await;
    let quota = Quota::new(1, Duration::from_millis(500)).unwrap();

    for &algorithm in Algorithm::ALL {
        let limiters: Vec<Limiter> = (0..4).map(|_| redis_limiter(&redis, algorithm)).collect();
        for limiter in &limiters {
            // Script loaded and connections open before the baseline.
            assert!(limiter.check("warm-up", &quota).await.decision().is_some());
        }
        flushall(&mut conn).await;
        let base_memory = used_memory(&mut conn).await;

        let started = Instant::now();
        let tasks: Vec<_> = limiters
            .iter()
            .cloned()
            .enumerate()
            .map(|(t, limiter)| {
                tokio::spawn(async move {
                    stream::iter((t..KEYS).step_by(4))
                        .map(|i| {
                            let limiter = limiter.clone();
                            async move {
                                limiter
                                    .try_check_quotas(&format!("{i}"), &quota.into(), 1)
                                    .await
                                    .map(|d| d.allowed)
                            }
                        })
                        .buffer_unordered(128)
                        .filter(|r| std::future::ready(!matches!(r, Ok(true))))
                        .count()
                        .await
                })
            })
            .collect();
        let mut failures = 0;
        for task in tasks {
            failures += task.await.expect("flood task");
        }
        let flood_time = started.elapsed();
        let keys_right_after = dbsize(&mut conn).await;
        let memory_right_after = used_memory(&mut conn).await;
        // The Redis keys of one limiter key with one request, and their exact size. A key
        // written just before its window ends may already be gone: then take another.
        let mut layout = Vec::new();
        let mut per_limiter_key = 0;
        for attempt in 0..20 {
            let key = format!("sample-{attempt}");
            assert!(limiters[0].check(&key, &quota).await.is_allowed());
            let storage = limiters[0].storage_key(&key);
            for key in keys_of(&mut conn, &storage).await {
                let usage = memory_usage(&mut conn, key.as_bytes()).await;
                per_limiter_key += usage;
                layout.push(format!(
                    "{key} ({}, {usage} B)",
                    key_type(&mut conn, &key).await
                ));
            }
            if per_limiter_key > 0 {
                break;
            }
            layout.clear();
        }

        let drain_started = Instant::now();
        let mut keys_after = u64::MAX;
        while drain_started.elapsed() < Duration::from_secs(8) {
            keys_after = dbsize(&mut conn).await;
            if keys_after == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let drain_time = drain_started.elapsed();
        let memory_after = used_memory(&mut conn).await;
        println!(
            "{algorithm}: {KEYS} keys in {flood_time:.2?}; right after: {keys_right_after} Redis \
             keys, used_memory +{} B; one limiter key = [{}] = {per_limiter_key} B; all expired \
             {drain_time:.2?} later ({keys_after} keys, used_memory {:+} B vs baseline)",
            memory_right_after.saturating_sub(base_memory),
            layout.join(", "),
            memory_after as i64 - base_memory as i64
        );
        assert_eq!(
            failures, 0,
            "{algorithm}: every first check admitted, no error"
        );
        assert!(!layout.is_empty(), "{algorithm}: the key was stored");
        assert!(
            per_limiter_key <= 1024,
            "{algorithm}: {per_limiter_key} B for one limiter key with one request"
        );
        assert_eq!(keys_after, 0, "{algorithm}: keys left after expiry");
        assert!(
            memory_after <= base_memory + 256 * 1024,
            "{algorithm}: used_memory {memory_after} B after expiry, baseline {base_memory} B"
        );
    }
}

/// A bounded `MemoryStore` under a flood of 200 000 distinct keys from 2 threads, with a monitor
/// thread polling `len()`: it never exceeds the cap (10 000, rounded up to a multiple of 64
/// shards = 10 048), holds keys up to the cap, and still enforces the newest key.
#[test]
fn memory_store_flood_never_exceeds_its_cap() {
    let _machine = shared_blocking();
    const MAX_KEYS: usize = 10_000;
    const THREADS: usize = 2;
    let cap = MAX_KEYS.div_ceil(64) * 64;
    let quota = Quota::per_hour(10).unwrap(); // nothing expires: eviction must do the work

    for &algorithm in Algorithm::ALL {
        // The cap is enforced by the store, whatever the algorithm: the full flood for the
        // default algorithm, a shorter one (still 4x the cap) for the others.
        let keys: usize = if algorithm == Algorithm::default() {
            200_000
        } else {
            40_000
        };
        let store = MemoryStore::with_max_keys(MAX_KEYS);
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let monitor = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut max_len, mut polls) = (0, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    max_len = max_len.max(store.len());
                    polls += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                (max_len, polls)
            })
        };
        let flooders: Vec<_> = (0..THREADS)
            .map(|t| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    runtime.block_on(async {
                        for i in (t..keys).step_by(THREADS) {
                            let verdict = limiter.check(&format!("mem-{i}"), &quota).await;
                            assert!(verdict.is_allowed(), "first check of a distinct key");
                        }
                    })
                })
            })
            .collect();
        for flooder in flooders {
            flooder.join().expect("flooder");
        }
        stop.store(true, Ordering::Relaxed);
        let (max_len, polls) = monitor.join().unwrap();
        let final_len = store.len();
        let elapsed = started.elapsed();

        // The newest key is still remembered and enforced.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let newest_kept = rt.block_on(async {
            let one = Quota::per_hour(1).unwrap();
            limiter.check("newest", &one).await.is_allowed()
                && !limiter.check("newest", &one).await.is_allowed()
        });
        println!(
            "{algorithm}: MemoryStore::with_max_keys({MAX_KEYS}) (cap {cap}): {keys} distinct keys \
             from {THREADS} threads in {elapsed:.2?}; len() max {max_len} over {polls} polls, \
             final {final_len}"
        );
        assert!(
            max_len <= cap,
            "{algorithm}: len() reached {max_len} > {cap}"
        );
        assert!(
            final_len <= cap,
            "{algorithm}: final len {final_len} > {cap}"
        );
        assert!(
            final_len >= cap / 2,
            "{algorithm}: only {final_len} keys held: the store should fill up to its cap"
        );
        assert!(
            newest_kept,
            "{algorithm}: the newest key must still be enforced"
        );
    }
}

/// A flood of new keys into a full `MemoryStore` (so also `LocalFallback`'s) never evicts, and so
/// resets, a busy key that is over its limit while the store holds keys whose state equals a
/// fresh key's (expired ones): those go first, for evicting them loses nothing. Every algorithm.
///
/// Per shard (64, 1 000 keys each, keys spread at random): the busy key first, then about 500
/// keys that live for hours, then about 400 that expire within 2 s; once these have expired,
/// about 300 new keys of the long kind arrive, fewer than the expired keys plus the room left.
/// The busy key, over its per-minute limit, is the live key closest to expiry: the earlier
/// sampled eviction looked at the 32 keys from the start of the shard (the busy key and long
/// keys, none expired) and evicted it, and its next request was admitted.
#[test]
fn a_flood_never_resets_an_over_limit_key_while_expired_keys_remain() {
    let _machine = shared_blocking();
    const MAX_KEYS: usize = 64 * 1_000;
    // A whole day since the epoch: every fixed window (minute, second, day) starts here.
    const T0: Duration = Duration::from_secs(1_700_006_400);
    let busy = Quota::per_minute(10).unwrap();
    let long = Quota::per_day(10).unwrap();
    let short = Quota::per_second(1).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for &algorithm in Algorithm::ALL {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::with_max_keys(MAX_KEYS);
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .clock(Clock::Manual(clock.clone()))
            .build()
            .unwrap();
        let admitted = |key: String, quota: Quota| {
            let limiter = limiter.clone();
            async move { limiter.check(&key, &quota).await.is_allowed() }
        };
        let flood_admitted = runtime.block_on(async {
            for _ in 0..10 {
                assert!(admitted("busy".into(), busy).await, "{algorithm}");
            }
            assert!(!admitted("busy".into(), busy).await, "{algorithm}: over");
            for i in 0..32_000 {
                assert!(admitted(format!("long-{i}"), long).await, "{algorithm}");
            }
            for i in 0..25_600 {
                assert!(admitted(format!("short-{i}"), short).await, "{algorithm}");
            }
            clock.advance(Duration::from_secs(5)); // every short key has expired: fresh again
            let mut flood_admitted = 0;
            for i in 0..19_200 {
                flood_admitted += usize::from(admitted(format!("flood-{i}"), long).await);
            }
            flood_admitted
        });
        let busy_after = runtime.block_on(admitted("busy".into(), busy));
        println!(
            "{algorithm}: busy key over its limit, then 32 000 long + 25 600 short keys, 5 s, \
             19 200 new keys ({flood_admitted} admitted) into MemoryStore::with_max_keys\
             ({MAX_KEYS}): len {}, busy key's next request admitted: {busy_after}",
            store.len()
        );
        assert_eq!(flood_admitted, 19_200, "{algorithm}: new keys are admitted");
        assert!(store.len() <= MAX_KEYS, "{algorithm}: {}", store.len());
        assert!(
            !busy_after,
            "{algorithm}: the busy key over its limit was evicted (reset) while expired keys remained"
        );
    }
}
