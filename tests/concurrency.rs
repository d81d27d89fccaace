//! Exactness under concurrency, for every algorithm in `Algorithm::ALL` (new algorithms are
//! covered as soon as they are listed there).
//!
//! 500 checks fired at once on one fresh key, spread over 4 limiters, each with its own
//! `RedisStore` and so its own connection: since each decision is one atomic script, exactly the
//! limit passes. Quota: 50 per hour, so nothing refills while the test runs.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::store::RedisStore;
use redlimit::{Algorithm, Clock, Decision, Limiter, ManualClock, Quota};
use support::RedisServer;
use tokio::sync::Barrier;

const CHECKS: usize = 500;
const LIMITERS: usize = 4;
const LIMIT: u64 = 50;

/// What one round of concurrent checks gave.
struct Round {
    decisions: Vec<Decision>,
    took: Duration,
}

impl Round {
    fn admitted(&self) -> usize {
        self.decisions.iter().filter(|d| d.allowed).count()
    }
}

/// `LIMITERS` limiters on their own connections to `redis`, under `algorithm` and `clock`.
fn limiters(redis: &RedisServer, algorithm: Algorithm, clock: &Clock) -> Vec<Limiter> {
    (0..LIMITERS)
        .map(|_| {
            // A generous timeout: this is about atomicity, not latency; a slow answer on a busy
            // machine must not turn into an error.
            let store = RedisStore::builder(redis.url())
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            Limiter::builder(store)
                .algorithm(algorithm)
                .clock(clock.clone())
                .build()
                .unwrap()
        })
        .collect()
}

/// Fires `CHECKS` checks of `key` at once, round-robin over `limiters`.
async fn round(limiters: &[Limiter], key: &str, quota: Quota) -> Round {
    let barrier = Arc::new(Barrier::new(CHECKS));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CHECKS)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            let barrier = barrier.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                barrier.wait().await;
                limiter
                    .try_check(&key, &quota, 1)
                    .await
                    .unwrap_or_else(|e| panic!("{}: store failed: {e}", limiter.algorithm()))
            })
        })
        .collect();
    let mut decisions = Vec::with_capacity(CHECKS);
    for task in tasks {
        decisions.push(task.await.unwrap());
    }
    Round {
        decisions,
        took: started.elapsed(),
    }
}

fn assert_exact(algorithm: Algorithm, round: &Round) {
    let admitted = round.admitted();
    assert_eq!(admitted, LIMIT as usize, "{algorithm}: {admitted} admitted");
    for d in &round.decisions {
        assert_eq!(d.limit, LIMIT, "{algorithm}: {d:?}");
        if !d.allowed {
            assert_eq!(d.remaining, 0, "{algorithm}: {d:?}");
            assert!(
                d.retry_after > Duration::ZERO && !d.never_allowed(),
                "{algorithm}: {d:?}"
            );
        }
    }
    // Serialized: every admitted request saw its own `remaining`, 49 down to 0.
    let mut remaining: Vec<u64> = round
        .decisions
        .iter()
        .filter(|d| d.allowed)
        .map(|d| d.remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..LIMIT).collect::<Vec<_>>(), "{algorithm}");
}

/// All 500 at the very same simulated microsecond (a `ManualClock` that does not move): the
/// hardest case, where no two requests can be told apart by time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_admits_exactly_the_limit_at_one_instant() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(LIMIT).unwrap();
    // Mid-hour, mid-day: far from any window edge.
    let clock = Clock::Manual(ManualClock::new(Duration::from_secs(1_700_001_800)));
    for &algorithm in Algorithm::ALL {
        let limiters = limiters(&redis, algorithm, &clock);
        let key = format!("exact-{algorithm}");
        let round = round(&limiters, &key, quota).await;
        println!(
            "{algorithm:>14} (one instant): {} of {CHECKS} admitted through {LIMITERS} connections in {:?}",
            round.admitted(),
            round.took
        );
        assert_exact(algorithm, &round);
        let per_limiter: Vec<u64> = limiters.iter().map(|l| l.stats().allowed).collect();
        assert_eq!(per_limiter.iter().sum::<u64>(), LIMIT, "{per_limiter:?}");
    }
}

/// The same on Redis server time (the default clock). A window algorithm whose window ends during
/// the round (an hour boundary) would rightly admit more; then the round is run again on a new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_admits_exactly_the_limit_on_server_time() {
    let redis = RedisServer::start();
    let quota = Quota::per_hour(LIMIT).unwrap();
    for &algorithm in Algorithm::ALL {
        let limiters = limiters(&redis, algorithm, &Clock::Server);
        for attempt in 0.. {
            let hour_before = server_hour(&redis);
            let key = format!("server-{algorithm}-{attempt}");
            let round = round(&limiters, &key, quota).await;
            if server_hour(&redis) != hour_before && attempt == 0 {
                continue;
            }
            println!(
                "{algorithm:>14} (server time): {} of {CHECKS} admitted through {LIMITERS} connections in {:?}",
                round.admitted(),
                round.took
            );
            assert_exact(algorithm, &round);
            break;
        }
    }
}

/// The hour of Redis `TIME`.
fn server_hour(redis: &RedisServer) -> u64 {
    let (secs, _micros): (u64, u64) = redis::cmd("TIME").query(&mut redis.conn()).unwrap();
    secs / 3600
}
