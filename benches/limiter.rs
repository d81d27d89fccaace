//! Throughput and latency of `Limiter::check`, per algorithm:
//!
//! - `memory/<algorithm>`: the in-process [`MemoryStore`], one check at a time;
//! - `redis-sequential/<algorithm>`: [`RedisStore`], one check in flight (the round-trip latency);
//! - `redis-concurrent-64/<algorithm>`: [`RedisStore`], 64 checks in flight on its one
//!   connection (the throughput one instance gets);
//! - `deny-cache-full/<max_keys>`: a check on a new key that the store denies, with the limiter's
//!   deny cache already full of live denials (10 000 and 1 000 000 keys): what a client minting
//!   keys costs per request once the cache is full (the store is a stub that denies everything
//!   for an hour, so the figure is the limiter and its cache). Before it runs, the RSS growth of
//!   filling the cache is printed per entry.
//!
//! Redis is a private `redis-server` this bench starts on a free port, or the one at
//! `REDLIMIT_BENCH_REDIS` (e.g. `redis://127.0.0.1:6379/`) when set; that one gets keys under the
//! prefix `redlimit-bench`, which expire within a second. Without either, only the memory store
//! is measured.
//!
//! The quota admits every check, so each one takes the write path, the most expensive one:
//! 10^9 a second, or for the sliding log (which keeps one entry per admitted request and refuses
//! bursts above 100 000) 100 000 per 100 ms. Checks rotate over 1024 keys; a run that saw a
//! denial or a store error fails.
//!
//! ```text
//! cargo bench --bench limiter                 # full run
//! cargo bench --bench limiter -- --quick      # a few seconds per benchmark
//! cargo bench --bench limiter -- redis        # only the Redis benchmarks
//! ```

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::future::{join_all, BoxFuture};
use redlimit::store::{CheckRequest, MemoryStore, RedisStore, Store, StoreError};
use redlimit::{Algorithm, Decision, Limiter, Quota};
use tokio::runtime::Runtime;

mod support;
use support::{admitting, PrivateRedis};

/// Distinct keys the checks rotate over.
const KEYS: usize = 1024;
/// Checks in flight at once in the concurrent benchmark.
const IN_FLIGHT: usize = 64;
/// The key prefix in Redis.
const PREFIX: &str = "redlimit-bench";

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("client-{i}")).collect()
}

fn limiter(store: impl Store, algorithm: Algorithm) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .prefix(PREFIX)
        .build()
        .expect("a valid limiter")
}

fn memory(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    one_at_a_time(c, "memory", &runtime, |algorithm| {
        limiter(MemoryStore::new(), algorithm)
    });
}

/// The group `name`: per algorithm, the limiter `limiter_of` makes, one check at a time,
/// rotating over the keys, with an admitting quota.
fn one_at_a_time(
    c: &mut Criterion,
    name: &str,
    runtime: &Runtime,
    limiter_of: impl Fn(Algorithm) -> Limiter,
) {
    let keys = keys();
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    for &algorithm in Algorithm::ALL {
        let limiter = &limiter_of(algorithm);
        let quota = &admitting(algorithm);
        let mut i = 0;
        group.bench_function(BenchmarkId::from_parameter(algorithm), |b| {
            b.to_async(runtime).iter(|| {
                i = (i + 1) % KEYS;
                limiter.check(&keys[i], quota)
            })
        });
        assert_no_errors(limiter);
    }
    group.finish();
}

fn redis(c: &mut Criterion) {
    let Some(redis) = BenchRedis::find() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    one_at_a_time(c, "redis-sequential", &runtime, |algorithm| {
        redis.limiter(&runtime, algorithm)
    });

    let keys = keys();

    let mut concurrent = c.benchmark_group(format!("redis-concurrent-{IN_FLIGHT}"));
    concurrent.throughput(Throughput::Elements(IN_FLIGHT as u64));
    for &algorithm in Algorithm::ALL {
        let quota = admitting(algorithm);
        let limiter = redis.limiter(&runtime, algorithm);
        let (limiter, keys, quota) = (&limiter, &keys, &quota);
        let mut i = 0;
        concurrent.bench_function(BenchmarkId::from_parameter(algorithm), |b| {
            b.to_async(&runtime).iter(|| {
                i = (i + IN_FLIGHT) % KEYS;
                join_all((i..i + IN_FLIGHT).map(|k| limiter.check(&keys[k % KEYS], quota)))
            })
        });
        assert_no_errors(limiter);
    }
    concurrent.finish();
}

/// A benchmark that measured failures (timeouts, a dead Redis) would be meaningless.
/// Every check must have been a store error-free admission, or the figures measure another path.
fn assert_no_errors(limiter: &Limiter) {
    let stats = limiter.stats();
    assert_eq!(
        (stats.store_errors, stats.denied),
        (0, 0),
        "store errors or denials during the benchmark: the figures are not valid ({stats:?})"
    );
}

/// A store that denies every check for an hour: each new key is a new entry of the deny cache.
#[derive(Debug)]
struct DenyAll;

impl Store for DenyAll {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        const HOUR: Duration = Duration::from_secs(3_600);
        let quota = request.quotas.as_slice()[0];
        Box::pin(std::future::ready(Ok(Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: 0,
            retry_after: HOUR,
            reset_after: HOUR,
            suspended: false,
            quota,
            overridden: false,
        })))
    }
}

/// This process's resident memory, in bytes (Linux), or 0 when unknown.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

fn deny_cache_full(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let quota = Quota::per_hour(1).expect("a valid quota");
    let mut group = c.benchmark_group("deny-cache-full");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    for max_keys in [10_000, 1_000_000] {
        let limiter = Limiter::builder(DenyAll)
            .prefix(PREFIX)
            .deny_cache(max_keys)
            .build()
            .expect("a valid limiter");
        // Keys spread over the cache's shards at random: 16 per sqrt(max_keys) more than the cap
        // (4 standard deviations of a shard's share at 16 shards) fill every shard.
        let fill = max_keys + 16 * (max_keys as f64).sqrt() as usize;
        let before = rss_bytes();
        runtime.block_on(async {
            for i in 0..fill {
                limiter.check(&format!("fill-{i}"), &quota).await;
            }
        });
        let grown = rss_bytes().saturating_sub(before);
        eprintln!(
            "deny cache of {max_keys} keys: RSS +{grown} B after {fill} denials = {} B per entry \
             (storage keys of {} bytes)",
            grown / max_keys as u64,
            limiter.storage_key("fill-123456").len()
        );
        let limiter = &limiter;
        let quota = &quota;
        let mut i = 0u64;
        group.bench_function(BenchmarkId::from_parameter(max_keys), |b| {
            b.to_async(&runtime).iter(|| {
                i += 1;
                let key = format!("new-{i}");
                async move { limiter.check(&key, quota).await }
            })
        });
        let stats = limiter.stats();
        assert_eq!(
            (stats.allowed, stats.deny_cached),
            (0, 0),
            "every check was a new denial from the store ({stats:?})"
        );
    }
    group.finish();
}

/// The Redis the benchmarks run against.
struct BenchRedis {
    url: String,
    /// The private server, killed on drop; `None` for `REDLIMIT_BENCH_REDIS`.
    _server: Option<PrivateRedis>,
}

impl BenchRedis {
    fn find() -> Option<BenchRedis> {
        if let Ok(url) = std::env::var("REDLIMIT_BENCH_REDIS") {
            eprintln!("redis benchmarks: REDLIMIT_BENCH_REDIS={url}");
            return Some(BenchRedis { url, _server: None });
        }
        match PrivateRedis::start() {
            Ok(server) => {
                let url = server.url();
                eprintln!("redis benchmarks: private redis-server at {url}");
                Some(BenchRedis {
                    url,
                    _server: Some(server),
                })
            }
            Err(e) => {
                eprintln!(
                    "redis benchmarks skipped: {e}; install redis-server or set REDLIMIT_BENCH_REDIS"
                );
                None
            }
        }
    }

    /// A limiter on a new connection, checked once so that a dead Redis fails loudly here.
    fn limiter(&self, runtime: &Runtime, algorithm: Algorithm) -> Limiter {
        let store = RedisStore::builder(self.url.as_str())
            .timeout(Duration::from_secs(1))
            .build()
            .expect("a valid Redis URL");
        let limiter = limiter(store, algorithm);
        runtime
            .block_on(limiter.try_check_quotas("warm-up", &admitting(algorithm).into(), 1))
            .unwrap_or_else(|e| panic!("Redis at {} does not answer: {e}", self.url));
        limiter
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = memory, redis, deny_cache_full
}
criterion_main!(benches);
