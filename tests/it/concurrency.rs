//! Exactness under concurrency, for every algorithm in `Algorithm::ALL` (new algorithms are
//! covered as soon as they are listed there).
//!
//! 500 checks fired at once on one fresh key, spread over 4 limiters, each with its own
//! `RedisStore` and so its own connection: since each decision is one atomic script, exactly the
//! limit passes. Quota: 50 per hour, so nothing refills while the test runs.
//!
//! Also the load of many concurrent waiters (`Limiter::acquire`): a herd after a suspension asks
//! Redis a few times per admission, not once per waiter at every refill.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Decision, Limiter, Quota,
};
use support::{Ctx, RedisServer};
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
            Ctx::new(algorithm)
                .clock(clock.clone())
                .timeout(Duration::from_secs(10))
                .redis(redis)
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
                    .try_check_quotas(&key, &quota.into(), 1)
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

/// A herd after a suspension: 500 waiters in 5 processes (5 limiters, each with its own
/// connection) wait on one key of 10 a second that is suspended for 2 s; the deadline is 1 s after
/// the suspension ends. Only one waiter per key and process asks Redis while the others queue
/// behind it, and long waits are spread by a jitter proportional to them: the checks (store
/// calls, counted both by the limiters' stats and by Redis's `INFO commandstats`) per admission
/// stay small. Before, every waiter asked at every refill: ~250 checks per admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_after_a_suspension_asks_redis_a_few_times_per_admission() {
    const PROCESSES: usize = 5;
    const WAITERS: usize = 500;
    let redis = RedisServer::start();
    // `limiters` gives 4 at a time.
    let limiters: Vec<Limiter> = (0..2)
        .flat_map(|_| limiters(&redis, Algorithm::TokenBucket, &Clock::Server))
        .take(PROCESSES)
        .collect();
    let quotas = redlimit::Quotas::from(Quota::per_second(10).unwrap());
    let suspension = Duration::from_secs(2);
    // Connect every limiter first: the first call of a fresh store is not part of the herd.
    for limiter in &limiters {
        limiter
            .try_check_quotas("warm-up", &Quota::per_second(10).unwrap().into(), 0)
            .await
            .unwrap();
    }
    limiters[0].suspend("herd", suspension).await.unwrap();
    let ends = Instant::now() + suspension;
    let deadline = ends + Duration::from_secs(1);
    redis.reset_stats();
    let checks = |limiters: &[Limiter]| -> u64 {
        limiters
            .iter()
            .map(|l| l.stats().allowed + l.stats().denied)
            .sum()
    };
    let base = checks(&limiters);
    let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (limiter, admitted) = (limiters[i % PROCESSES].clone(), admitted.clone());
            tokio::spawn(async move {
                match limiter.acquire("herd", &quotas, deadline).await {
                    Ok(verdict) => {
                        assert!(verdict.decision().is_some_and(|d| d.allowed));
                        admitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(redlimit::limiter::AcquireError::DeadlineExceeded { .. }) => {}
                    Err(error) => panic!("{error}"),
                }
            })
        })
        .collect();
    let sample = |at: Instant| {
        let limiters = limiters.clone();
        let admitted = admitted.clone();
        async move {
            tokio::time::sleep_until(at.into()).await;
            (
                checks(&limiters),
                admitted.load(std::sync::atomic::Ordering::SeqCst),
            )
        }
    };
    let (at_end, _) = sample(ends).await;
    let (at_30ms, admitted_30ms) = sample(ends + Duration::from_millis(30)).await;
    for task in tasks {
        task.await.unwrap();
    }
    let (total, admissions) = sample(Instant::now()).await;
    let evalsha = redis.command_calls("evalsha");
    let during = at_end - base;
    let after = total - at_end;
    println!(
        "herd of {WAITERS} waiters in {PROCESSES} processes, 10/s, after a {suspension:?} suspension: \
         {during} checks during it; {} checks in the first 30 ms after for {admitted_30ms} admissions; \
         {after} checks in the first second for {admissions} admissions ({:.2} per admission); \
         {} checks in all ({evalsha} EVALSHA)",
        at_30ms - at_end,
        after as f64 / admissions.max(1) as f64,
        total - base,
    );
    for limiter in &limiters {
        assert_eq!(limiter.stats().store_errors, 0);
    }
    // The limiters' counts are the store calls.
    assert_eq!(total - base, evalsha);
    // The full bucket at the end of the suspension, then the rate; never more.
    assert!((10..=22).contains(&admissions), "{admissions} admissions");
    // One waiter per process asks during the suspension, the others wait in its line (before:
    // all 500); after it, about one check per process and admission (before: ~250).
    assert!(
        during <= 2 * PROCESSES as u64,
        "{during} checks during the suspension"
    );
    assert!(
        after <= 2 * PROCESSES as u64 * admissions,
        "{after} checks for {admissions} admissions"
    );
}
