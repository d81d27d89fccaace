//! A quota tightened, a clock stepped back: no lockout, no error.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redlimit::store::MemoryStore;
use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Limiter, Quota,
};

use crate::support::RedisServer;
use crate::{assert_sane, burst, first_admission, manual_limiter, shared, Probe, T0};

/// Where the no-lockout scenarios run: the Redis scripts, and their Rust mirrors in
/// `MemoryStore` (which also serves `LocalFallback`).
#[derive(Clone, Copy)]
enum Backend<'a> {
    Redis(&'a RedisServer),
    Memory,
}

impl Backend<'_> {
    fn name(self) -> &'static str {
        match self {
            Backend::Redis(_) => "redis",
            Backend::Memory => "memory",
        }
    }

    /// A limiter on a manual clock standing at `T0`.
    fn limiter(self, algorithm: Algorithm) -> (Limiter, ManualClock) {
        match self {
            Backend::Redis(redis) => manual_limiter(redis, algorithm),
            Backend::Memory => {
                let clock = ManualClock::new(T0);
                let limiter = Limiter::builder(MemoryStore::new())
                    .algorithm(algorithm)
                    .clock(Clock::Manual(clock.clone()))
                    .build()
                    .unwrap();
                (limiter, clock)
            }
        }
    }
}

/// How long a fresh key exhausted at `at` under `quota` stays locked, and its largest
/// `retry_after`: what the algorithm itself imposes, the yardstick for "no extra lockout".
async fn natural_lockout(
    backend: Backend<'_>,
    algorithm: Algorithm,
    quota: &Quota,
    at_micros: u64,
    step: Duration,
) -> (Duration, Duration) {
    let (limiter, clock) = backend.limiter(algorithm);
    clock.set(Duration::from_micros(at_micros));
    let context = format!("{algorithm} on {}: baseline", backend.name());
    // Never reused: a key's state from another scenario would be a disturbance of its own.
    static BASELINES: AtomicU64 = AtomicU64::new(0);
    let key = &format!("baseline-{}", BASELINES.fetch_add(1, Ordering::Relaxed));
    let admitted = burst(&limiter, key, quota, quota.burst() * 3, &context).await;
    assert_eq!(
        admitted,
        quota.burst(),
        "{context}: a fresh key admits its burst"
    );
    let probe = first_admission(
        &limiter,
        &clock,
        key,
        quota,
        step,
        quota.period() * 3,
        &context,
    )
    .await;
    assert_eq!(probe.broken_promise, None, "{context}");
    (
        probe.waited.expect("a fresh key is admitted again"),
        probe.max_retry,
    )
}

/// After a disturbance at the clock's current time (`at_micros`): at most the burst admitted at
/// once, admitted again no later than a fresh key exhausted at the same instant (and within two
/// periods), `retry_after` never beyond the period (or the fresh key's), and a full burst three
/// periods later. Returns a line of figures, or what went wrong.
async fn no_lockout(
    backend: Backend<'_>,
    algorithm: Algorithm,
    limiter: &Limiter,
    clock: &ManualClock,
    key: &str,
    quota: &Quota,
    context: &str,
) -> Result<String, String> {
    let at = clock.now_micros();
    let step = quota.period() / 40;
    let at_once = burst(limiter, key, quota, quota.burst() * 3, context).await;
    let within = quota.period() * 2;
    let probe = first_admission(limiter, clock, key, quota, step, within, context).await;
    let Probe {
        waited,
        max_retry,
        broken_promise,
    } = probe;
    let (natural, natural_retry) = natural_lockout(backend, algorithm, quota, at, step).await;
    let line = format!(
        "{context}: {at_once} admitted at once, admitted again after {} (fresh key exhausted \
         then: {natural:?}), max retry_after {max_retry:?} (fresh key: {natural_retry:?})",
        waited.map_or_else(|| "NEVER (2 periods)".to_owned(), |w| format!("{w:?}"))
    );
    let mut problems = Vec::new();
    if at_once > quota.burst() {
        problems.push(format!(
            "{at_once} admitted at once, capacity {}",
            quota.burst()
        ));
    }
    match waited {
        None => problems.push("LOCKED OUT for 2 periods".to_owned()),
        Some(waited) if waited > natural.max(quota.period()) + step => {
            problems.push(format!("locked {waited:?}, a fresh key only {natural:?}"))
        }
        Some(_) => {}
    }
    if let Some(broken) = broken_promise {
        problems.push(broken);
    }
    if max_retry > natural_retry.max(quota.period()) {
        problems.push(format!("retry_after {max_retry:?} beyond the period"));
    }
    // And the key keeps working.
    clock.advance(quota.period() * 3);
    let full = burst(limiter, key, quota, quota.burst() * 3, context).await;
    if full != quota.burst() {
        problems.push(format!(
            "{full} admitted 3 periods later, burst {}",
            quota.burst()
        ));
    }
    if problems.is_empty() {
        Ok(line)
    } else {
        Err(format!("{line}\n    FAILED: {}", problems.join("; ")))
    }
}

fn report(results: Vec<Result<String, String>>) {
    let mut failures = Vec::new();
    for result in results {
        match result {
            Ok(line) => println!("{line}"),
            Err(line) => {
                println!("{line}");
                failures.push(line);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A quota tightened from 100 to 10 while state exists (1, 50 or all 100 consumed; also from
/// 100/s to 10/min), for every algorithm, in Redis and in the memory store, on a client clock:
/// never an error, every decision sane, the key's `remaining` within the new capacity, at most
/// the new capacity admitted at once, admitted again no later than a fresh key exhausted at the
/// same instant under the new quota (within two periods at worst), full burst later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tightened_quota_never_locks_out() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let new = Quota::per_minute(10).unwrap();
    let scenarios = [
        (Quota::per_minute(100).unwrap(), 1),
        (Quota::per_minute(100).unwrap(), 50),
        (Quota::per_minute(100).unwrap(), 100),
        (Quota::per_second(100).unwrap(), 100),
    ];
    let mut results = Vec::new();
    for backend in [Backend::Redis(&redis), Backend::Memory] {
        for &algorithm in Algorithm::ALL {
            let (limiter, clock) = backend.limiter(algorithm);
            for (n, (old, consumed)) in scenarios.iter().enumerate() {
                let key = format!("tighten-{n}");
                let context = format!(
                    "{algorithm} on {}: {}/{:?} with {consumed} consumed -> {}/{:?}",
                    backend.name(),
                    old.limit(),
                    old.period(),
                    new.limit(),
                    new.period()
                );
                let admitted_old = burst(&limiter, &key, old, *consumed, &context).await;
                assert_eq!(
                    admitted_old, *consumed,
                    "{context}: consuming under the old quota"
                );
                // Peek: what the key looks like under the new quota, consuming nothing.
                let peek = limiter
                    .try_check_quotas(&key, &new.into(), 0)
                    .await
                    .unwrap_or_else(|e| panic!("{context}: peek failed: {e}"));
                assert_sane(&peek, &new, &context);
                let result =
                    no_lockout(backend, algorithm, &limiter, &clock, &key, &new, &context).await;
                results.push(if peek.remaining > new.burst() {
                    Err(format!("{context}: peek says {} remaining", peek.remaining))
                } else {
                    result
                });
            }
        }
    }
    report(results);
}

/// The clock stepped back (30 s, 1 hour, 1 day) after a key was exhausted, for every algorithm,
/// in Redis and in the memory store: never an error, every decision sane, `retry_after` within
/// the period (or what a fresh key gets), admitted again no later than a fresh key exhausted at
/// the stepped-back time, and a full burst later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_stepped_back_never_locks_out() {
    let _machine = shared().await;
    let redis = RedisServer::start();
    let quota = Quota::per_minute(10).unwrap();
    let steps_back = [30, 3600, 86_400].map(Duration::from_secs);
    let mut results = Vec::new();
    for backend in [Backend::Redis(&redis), Backend::Memory] {
        for &algorithm in Algorithm::ALL {
            let (limiter, clock) = backend.limiter(algorithm);
            for (n, back) in steps_back.iter().enumerate() {
                let key = format!("clock-{n}");
                let context = format!(
                    "{algorithm} on {}: exhausted, clock stepped back {back:?}",
                    backend.name()
                );
                let consumed = burst(&limiter, &key, &quota, quota.burst() * 3, &context).await;
                assert_eq!(consumed, quota.burst(), "{context}: the fresh key's burst");
                clock.set(Duration::from_micros(clock.now_micros()) - *back);
                results.push(
                    no_lockout(backend, algorithm, &limiter, &clock, &key, &quota, &context).await,
                );
            }
        }
    }
    report(results);
}
