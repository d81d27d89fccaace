//! Instances whose client clocks differ (skew): the fleet admits no more than one clock running
//! as fast as the fastest instance would, plus at most `rate × skew` once.
//!
//! Two limiters share one key, each on its own `ManualClock`, one `skew` behind the other. At
//! every tick of a fixed simulated duration both call once, the fast one first, so the slow one
//! always finds state written by a clock `skew` ahead of its own. Before the fix, the slow one
//! took that state for a clock that stepped back and wrote its earlier time back (even on a
//! denial), and the fast one then counted the difference as refill, or a new window, on every
//! call. The yardstick is one limiter on the fast clock making the same calls at the same times.
//! Every scenario runs on Redis (the scripts) and on the memory store (their mirrors), which
//! must give the same decision at every call.

use std::time::Duration;

use redlimit::store::MemoryStore;
use redlimit::{
    clock::{Clock, ManualClock},
    Algorithm, Limiter, Quota,
};

use crate::support::RedisServer;
use crate::{shared, T0};

/// One scenario: `skew` between the two clocks, the quota, the time between ticks and their
/// number.
#[derive(Clone, Copy)]
struct Case {
    skew: Duration,
    quota: Quota,
    tick: Duration,
    ticks: u32,
}

/// Skews of 1 ms, 20 ms and 1 s, each with a quota that admits about one of the two calls of a
/// tick. Each call simulates 5 ms or more, several times what it takes in real time: Redis
/// expires keys on its own clock, the memory store on the simulated one, and a key must never
/// vanish from Redis before the simulated clock says it is fresh again.
fn cases() -> [Case; 3] {
    [
        Case {
            skew: Duration::from_millis(1),
            quota: Quota::per_second(100).unwrap(),
            tick: Duration::from_millis(10),
            ticks: 2_000,
        },
        Case {
            skew: Duration::from_millis(20),
            quota: Quota::per_second(100).unwrap(),
            tick: Duration::from_millis(10),
            ticks: 2_000,
        },
        // A period (10 s) longer than the skew.
        Case {
            skew: Duration::from_secs(1),
            quota: Quota::new(100, Duration::from_secs(10)).unwrap(),
            tick: Duration::from_millis(100),
            ticks: 2_000,
        },
    ]
}

impl Case {
    /// `rate × skew` in requests, rounded up: what the skew may buy, once.
    fn allowance(&self) -> u64 {
        let rate = self.quota.limit() as f64 / self.quota.period().as_secs_f64();
        (rate * self.skew.as_secs_f64()).ceil() as u64
    }
}

/// One call's decision: (allowed, remaining, retry_after, reset_after).
type Summary = (bool, u64, Duration, Duration);

/// The longest real time between two calls for which Redis, expiring keys on its own clock,
/// keeps every key as long as the simulated clock needs it (the shortest TTL a call writes is
/// one token's refill, 10 ms). A run with a longer gap (a loaded machine) proves nothing either
/// way and is made again, up to `ATTEMPTS` times.
const LONGEST_REAL_GAP: Duration = Duration::from_millis(8);
const ATTEMPTS: u32 = 5;

fn limiter(
    store: impl redlimit::store::Store,
    algorithm: Algorithm,
    clock: &ManualClock,
) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .clock(Clock::Manual(clock.clone()))
        .build()
        .expect("valid limiter")
}

/// Runs `case`: at tick `i` the clock of `limiters[n]` stands at `start + i × tick +
/// offsets[n]`, and each limiter calls once, in order. The first tick's slow clock stands half
/// the skew before a window boundary, so that every window boundary has a tick whose two clocks
/// lie on either side of it. Returns every decision, in order, and the longest real time between
/// two calls' ends.
async fn run(
    limiters: &[(Limiter, ManualClock)],
    offsets: [Duration; 2],
    case: Case,
    key: &str,
) -> (Vec<Summary>, Duration) {
    let start = T0 - case.skew / 2;
    let mut decisions = Vec::with_capacity(limiters.len() * case.ticks as usize);
    let (mut last, mut longest) = (std::time::Instant::now(), Duration::ZERO);
    for i in 0..case.ticks {
        for ((limiter, clock), offset) in limiters.iter().zip(offsets) {
            clock.set(start + case.tick * i + offset);
            let d = limiter
                .try_check_quotas(key, &case.quota.into(), 1)
                .await
                .unwrap_or_else(|e| panic!("{key}: the check failed: {e}"));
            decisions.push((d.allowed, d.remaining, d.retry_after, d.reset_after));
            longest = longest.max(last.elapsed());
            last = std::time::Instant::now();
        }
    }
    (decisions, longest)
}

fn admitted(decisions: &[Summary]) -> u64 {
    decisions.iter().filter(|d| d.0).count() as u64
}

/// What one algorithm admitted under one case: skewed on Redis and in memory, and the yardstick.
struct Counts {
    redis: Vec<Summary>,
    /// The longest real gap between two calls of the Redis run kept.
    redis_gap: Duration,
    memory: Vec<Summary>,
    one_clock: u64,
}

async fn counts(redis_url: String, algorithm: Algorithm, case: Case) -> Counts {
    let key = format!("skew-{algorithm}-{:?}", case.skew);
    let two_clocks = || (ManualClock::new(T0 + case.skew), ManualClock::new(T0));
    let (fast, slow) = two_clocks();
    let on_redis = [
        (limiter(redis_store_at(&redis_url), algorithm, &fast), fast),
        (limiter(redis_store_at(&redis_url), algorithm, &slow), slow),
    ];
    // Connected, and the script loaded, before the first call: a first call that waits for
    // those would outlast the short TTL of the call before it.
    for (limiter, _) in &on_redis {
        limiter
            .try_check_quotas("skew-warm-up", &case.quota.into(), 0)
            .await
            .expect("Redis answers");
    }
    let skewed = [case.skew, Duration::ZERO];
    let (mut redis, mut redis_gap) = run(&on_redis, skewed, case, &key).await;
    for attempt in 1..ATTEMPTS {
        if redis_gap <= LONGEST_REAL_GAP {
            break;
        }
        (redis, redis_gap) = run(&on_redis, skewed, case, &format!("{key}-{attempt}")).await;
    }
    let memory_store = MemoryStore::new();
    let (fast, slow) = two_clocks();
    let in_memory = [
        (limiter(memory_store.clone(), algorithm, &fast), fast),
        (limiter(memory_store, algorithm, &slow), slow),
    ];
    let (memory, _) = run(&in_memory, skewed, case, &key).await;
    // The yardstick: one limiter on the fast clock, two calls a tick at the fast clock's time.
    let clock = ManualClock::new(T0);
    let one = limiter(MemoryStore::new(), algorithm, &clock);
    let alone = [(one.clone(), clock.clone()), (one, clock)];
    let one_clock = admitted(&run(&alone, [case.skew, case.skew], case, &key).await.0);
    Counts {
        redis,
        redis_gap,
        memory,
        one_clock,
    }
}

/// `crate::redis_store` by URL, so that a scenario can run on a task of its own.
fn redis_store_at(url: &str) -> redlimit::store::RedisStore {
    redlimit::store::RedisStore::builder(url)
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .expect("valid url")
}

/// For every algorithm and a skew of 1 ms, 20 ms and 1 s: two instances on skewed clocks admit
/// no more than one clock at the fast instance's time would, plus `rate × skew`; Redis and the
/// memory store decide every call alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_instances_admit_no_more_than_the_fastest_clock() {
    let _machine = shared().await;
    let server = RedisServer::start();
    let mut failures = Vec::new();
    for case in cases() {
        // One scenario at a time: side by side, each call would take longer in real time.
        for &algorithm in Algorithm::ALL {
            let Counts {
                redis,
                redis_gap,
                memory,
                one_clock,
            } = counts(server.url(), algorithm, case).await;
            let (on_redis, in_memory) = (admitted(&redis), admitted(&memory));
            let bound = one_clock + case.allowance();
            let line = format!(
                "{algorithm}, skew {:?}, {}/{:?}, {} calls: {on_redis} admitted on Redis, \
                 {in_memory} in memory; one clock {one_clock}, bound {bound}; longest real gap \
                 between Redis calls {redis_gap:?} (the scenario holds below {LONGEST_REAL_GAP:?})",
                case.skew,
                case.quota.limit(),
                case.quota.period(),
                redis.len()
            );
            println!("{line}");
            if on_redis > bound || in_memory > bound {
                failures.push(format!("{line}: above the bound"));
            }
            if let Some(i) = (0..redis.len()).find(|&i| redis[i] != memory[i]) {
                failures.push(format!(
                    "{line}: call {i} differs: Redis {:?}, memory {:?}",
                    redis[i], memory[i]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
