//! Token leases for hot keys (`LimiterBuilder::leases`) on real Redis: exactness across
//! instances (single node and Cluster), the same admissions as without leases for a steady
//! client, controls reaching leasing instances within one lease interval, a Redis killed
//! mid-lease, give-backs, and the configurations refused at build time.

use crate::support;

use super::{INTERVAL, T0};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlimit::clock::{Clock, ManualClock};
use redlimit::failure_policy::FailClosed;
use redlimit::limiter::{ConfigError, LeaseError, LeaseStats, Leases};
use redlimit::store::{MemoryStore, RedisStore, Store};
use redlimit::{Algorithm, Decision, Limiter, Quota, Quotas, Target, Verdict};
use support::{Ctx, RedisCluster, RedisServer};

fn leasing(store: RedisStore, algorithm: Algorithm) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .leases(Leases::new(INTERVAL))
        .build()
        .unwrap()
}

/// 3 instances × 200 concurrent callers on one key of 40 an hour.
async fn admitted_by_three_instances(instances: [Limiter; 3]) -> (u64, Vec<LeaseStats>) {
    let quota = Quota::per_hour(40).unwrap();
    let mut tasks = Vec::new();
    for limiter in &instances {
        for _ in 0..200 {
            let limiter = limiter.clone();
            tasks.push(tokio::spawn(async move {
                limiter.check("hot-40", &quota).await.is_allowed()
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.unwrap());
    }
    let stats = instances.iter().map(Limiter::lease_stats).collect();
    (admitted, stats)
}

/// The algorithms whose leases admit exactly what they would without leases.
const EXACT_LEASING: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
];

/// Every leased unit is accounted for: spent, held, returned or stranded.
pub(crate) fn assert_accounted(s: &LeaseStats) {
    let accounted = s.spent + s.held + s.returned + s.stranded;
    assert_eq!(s.leased, accounted, "counters do not balance: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_leasing_instances_admit_exactly_forty_of_forty_an_hour() {
    let redis = RedisServer::start();
    for algorithm in EXACT_LEASING {
        redis.flushall();
        let instances = [(); 3].map(|_| leasing(support::redis_store(&redis), algorithm));
        let (admitted, stats) = admitted_by_three_instances(instances).await;
        assert_eq!(admitted, 40, "{algorithm}: {stats:?}");
        assert_eq!(stats.iter().map(|s| s.spent).sum::<u64>(), 40);
        stats.iter().for_each(assert_accounted);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_leasing_instances_admit_exactly_forty_of_forty_an_hour_on_cluster() {
    let cluster = RedisCluster::start();
    let ctx = Ctx::default();
    let instances = [(); 3].map(|_| leasing(ctx.cluster_store(&cluster), Algorithm::TokenBucket));
    let (admitted, stats) = admitted_by_three_instances(instances).await;
    assert_eq!(admitted, 40, "{stats:?}");
    stats.iter().for_each(assert_accounted);
}

/// Every decision of a client sending exactly at the rate, `steps` times, on a manual clock.
async fn steady(
    limiter: &Limiter,
    key: &str,
    quota: &Quota,
    clock: &ManualClock,
    steps: u32,
) -> Vec<Decision> {
    let gap = quota.period() / quota.limit() as u32;
    let mut decisions = Vec::new();
    for _ in 0..steps {
        decisions.push(*limiter.check(key, quota).await.decision().unwrap());
        clock.advance(gap);
    }
    decisions
}

/// [`steady`] on `plain`, then from the same instant on `leased`: (with leases, without).
async fn steady_both(
    leased: &Limiter,
    plain: &Limiter,
    key: &str,
    quota: &Quota,
    clock: &ManualClock,
    steps: u32,
) -> (Vec<Decision>, Vec<Decision>) {
    let start = clock.now_micros();
    let without = steady(plain, key, quota, clock, steps).await;
    clock.set(Duration::from_micros(start));
    let with = steady(leased, key, quota, clock, steps).await;
    (with, without)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_client_at_the_rate_sees_the_same_admissions_as_without_leases() {
    let redis = RedisServer::start();
    for algorithm in EXACT_LEASING {
        let clock = ManualClock::new(T0);
        let ctx = Ctx::new(algorithm).manual(&clock);
        let plain = ctx.redis(&redis);
        let leased = Limiter::builder(ctx.redis_store(&redis))
            .algorithm(algorithm)
            .clock(Clock::Manual(clock.clone()))
            .prefix("leased")
            .leases(Leases::new(INTERVAL))
            .build()
            .unwrap();
        // Slow: one request every 100 ms, so k stays 1: the very same decisions and headers.
        let slow = Quota::per_second(10).unwrap();
        let key = format!("slow-{algorithm}");
        let (with, without) = steady_both(&leased, &plain, &key, &slow, &clock, 60).await;
        assert_eq!(with, without, "{algorithm}");
        assert_eq!(
            leased.lease_stats().renewals,
            60,
            "k = 1: one store call each"
        );

        // Fast: 1 000 a second, so k grows: the same admissions, far fewer store calls.
        let fast = Quota::per_second(1_000).unwrap();
        let key = format!("fast-{algorithm}");
        let (with, without) = steady_both(&leased, &plain, &key, &fast, &clock, 2_000).await;
        let allowed = |d: &[Decision]| d.iter().map(|d| d.allowed).collect::<Vec<_>>();
        assert_eq!(allowed(&with), allowed(&without), "{algorithm}");
        let stats = leased.lease_stats();
        assert!(stats.renewals < 60 + 2_000 / 10, "{algorithm}: {stats:?}");
        // Never more remaining than Redis plus this instance's units: the headers' bound.
        for (w, p) in with.iter().zip(&without) {
            assert!(w.remaining <= fast.burst(), "{w:?} / {p:?}");
        }
    }
}

/// `instances` × 64 tasks checking one key until [`Burst::finish`].
struct Burst {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// Set: each task pauses 10 ms between checks, so held units would outlive their lease.
    slow: Arc<AtomicBool>,
    admitted: Arc<Mutex<Vec<Instant>>>,
    refused: Arc<AtomicU64>,
}

impl Burst {
    fn start(instances: &[Limiter], key: &'static str, quota: Quota) -> Burst {
        let stop = Arc::new(AtomicBool::new(false));
        let slow = Arc::new(AtomicBool::new(false));
        let admitted = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for limiter in instances {
            for _ in 0..64 {
                let (limiter, stop, slow) = (limiter.clone(), stop.clone(), slow.clone());
                let (admitted, refused) = (admitted.clone(), refused.clone());
                tasks.push(tokio::spawn(async move {
                    let mut mine = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        if limiter.check(key, &quota).await.is_allowed() {
                            mine.push(start);
                        } else {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        if slow.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        // A check served from a lease never waits: give the other tasks a
                        // turn, as a server's I/O would.
                        tokio::task::yield_now().await;
                    }
                    admitted.lock().unwrap().extend(mine);
                }));
            }
        }
        Burst {
            tasks,
            stop,
            slow,
            admitted,
            refused,
        }
    }

    /// From now on each task pauses between checks: units still held would last well past
    /// their lease interval, unless the lease ends them.
    fn slow_down(&self) {
        self.slow.store(true, Ordering::Relaxed);
    }

    /// Stops the tasks: the start of every admitted check, and the count of refused ones.
    async fn finish(self) -> (Vec<Instant>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let admitted = std::mem::take(&mut *self.admitted.lock().unwrap());
        (admitted, self.refused.load(Ordering::Relaxed))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspension_during_a_hot_burst_stops_every_instance_within_one_lease_interval() {
    let redis = RedisServer::start();
    let instances: Vec<Limiter> = (0..3)
        .map(|_| leasing(support::redis_store(&redis), Algorithm::TokenBucket))
        .collect();
    let operator = support::redis_limiter(&redis, Algorithm::TokenBucket);
    let quota = Quota::per_second(1_000_000).unwrap();
    let burst = Burst::start(&instances, "hot-suspend", quota);
    tokio::time::sleep(Duration::from_millis(300)).await;
    burst.slow_down();
    operator
        .suspend("hot-suspend", Duration::from_secs(30))
        .await
        .unwrap();
    let suspended_at = Instant::now();
    tokio::time::sleep(INTERVAL * 4).await;
    let (admitted, refused) = burst.finish().await;
    let before = admitted.iter().filter(|t| **t < suspended_at).count();
    let late: Vec<_> = admitted
        .iter()
        .filter(|t| **t > suspended_at + INTERVAL)
        .map(|t| t.duration_since(suspended_at))
        .collect();
    assert!(
        before > 1_000,
        "a hot burst: {before} admitted before the suspension"
    );
    assert!(
        late.is_empty(),
        "admitted after one lease interval: {late:?}"
    );
    assert!(refused > 0);
    for limiter in &instances {
        let (stats, leases) = (limiter.stats(), limiter.lease_stats());
        assert!(
            stats.suspended > 0,
            "every instance saw the suspension: {stats:?}"
        );
        assert!(
            leases.renewals * 10 < stats.allowed,
            "the burst was served from leases: {leases:?} {stats:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_lease_goes_to_the_failure_policy_admitting_only_leased_units() {
    let mut redis = RedisServer::start();
    let instances: Vec<Limiter> = (0..3)
        .map(|_| {
            let store = RedisStore::builder(redis.url())
                .timeout(Duration::from_millis(200))
                .build()
                .unwrap();
            Limiter::builder(store)
                .leases(Leases::new(INTERVAL))
                .failure_policy(FailClosed {
                    retry_after: Duration::from_secs(1),
                })
                .build()
                .unwrap()
        })
        .collect();
    let quota = Quota::per_second(1_000_000).unwrap();
    let burst = Burst::start(&instances, "hot-kill", quota);
    tokio::time::sleep(Duration::from_millis(300)).await;
    burst.slow_down();
    redis.stop();
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (admitted, _) = burst.finish().await;
    let late = admitted
        .iter()
        .filter(|t| **t > killed_at + INTERVAL)
        .count();
    assert_eq!(late, 0, "admitted after the last lease ended");
    let mut total = 0;
    for limiter in &instances {
        let (stats, leases) = (limiter.stats(), limiter.lease_stats());
        assert!(
            stats.failed_closed > 0,
            "the failure policy decided: {stats:?}"
        );
        assert_eq!(stats.failed_open, 0);
        // Every admission was paid for in Redis: spent from leased units.
        assert_eq!(stats.allowed, leases.spent, "{stats:?} {leases:?}");
        assert!(leases.spent <= leases.leased, "{leases:?}");
        total += stats.allowed;
    }
    assert_eq!(total as usize, admitted.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_denial_is_served_from_the_deny_cache_until_its_retry_after() {
    let redis = RedisServer::start();
    let limiter = leasing(support::redis_store(&redis), Algorithm::TokenBucket);
    let quota = Quota::per_hour(5).unwrap();
    let verdicts = futures::future::join_all((0..100).map(|_| limiter.check("k", &quota))).await;
    assert_eq!(verdicts.iter().filter(|v| v.is_allowed()).count(), 5);
    let before = redis.command_calls("evalsha");
    for _ in 0..100 {
        let verdict = limiter.check("k", &quota).await;
        let decision = verdict.decision().unwrap();
        assert!(!decision.allowed && decision.retry_after > Duration::from_secs(600));
    }
    assert_eq!(
        redis.command_calls("evalsha"),
        before,
        "no store call while denied"
    );
    assert!(limiter.stats().deny_cached >= 100);

    // Until its retry_after, and not longer: on a manual clock, one more unit 200 ms later.
    let clock = ManualClock::new(T0);
    let limiter = manual(MemoryStore::new(), &clock);
    let quota = Quota::per_second(5).unwrap();
    let verdicts = futures::future::join_all((0..20).map(|_| limiter.check("k", &quota))).await;
    assert_eq!(verdicts.iter().filter(|v| v.is_allowed()).count(), 5);
    let denial = *limiter.check("k", &quota).await.decision().unwrap();
    assert_eq!(denial.retry_after, Duration::from_millis(200));
    clock.advance(Duration::from_millis(199));
    assert!(!limiter.check("k", &quota).await.is_allowed());
    clock.advance(Duration::from_millis(1));
    assert!(limiter.check("k", &quota).await.is_allowed());
}

/// A limiter on `store` leasing on a manual clock.
fn manual(store: impl Store, clock: &ManualClock) -> Limiter {
    Limiter::builder(store)
        .clock(Clock::Manual(clock.clone()))
        .leases(Leases::new(INTERVAL).idle_after(INTERVAL * 2))
        .build()
        .unwrap()
}

async fn peek(limiter: &Limiter, key: &str, quota: &Quota) -> u64 {
    limiter
        .check_quotas(key, &(*quota).into(), 0)
        .await
        .decision()
        .unwrap()
        .remaining
}

/// Waits until the background give-backs have landed (`held` units returned or stranded).
async fn settled(limiter: &Limiter) -> LeaseStats {
    for _ in 0..200 {
        let s = limiter.lease_stats();
        if s.leased == s.spent + s.held + s.returned + s.stranded && s.held == 0 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("give-backs never landed: {:?}", limiter.lease_stats());
}

/// A millisecond on `clock`, then 2 ms of real time: enough for a lease's prefetch to land.
async fn next_millisecond(clock: &ManualClock) {
    clock.advance(Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(2)).await;
}

/// Asserts that `leasing` holds a lease (`what` names the case), then suspends `key` for
/// `duration` through `operator` (the same limiter, or another instance).
pub(crate) async fn suspend_once_leased(
    leasing: &Limiter,
    operator: &Limiter,
    key: &str,
    duration: Duration,
    what: &str,
) {
    let stats = leasing.lease_stats();
    assert!(stats.held > 0, "{what}: no lease held: {stats:?}");
    operator.suspend(key, duration).await.unwrap();
}

/// Builds up a lease of several units on `key` (bursts at one instant), leaving units held.
pub(crate) async fn hold_units(
    limiter: &Limiter,
    key: &str,
    quota: &Quota,
    clock: &ManualClock,
) -> u64 {
    for _ in 0..6 {
        futures::future::join_all((0..50).map(|_| limiter.check(key, quota))).await;
        next_millisecond(clock).await;
    }
    let held = limiter.lease_stats().held;
    assert!(held > 0, "{:?}", limiter.lease_stats());
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_release_and_idle_give_unspent_units_back_never_above_capacity() {
    let quota = Quota::per_second(1_000).unwrap();
    for end in ["forget", "release", "idle"] {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::new();
        let observer = Limiter::builder(store.clone())
            .clock(Clock::Manual(clock.clone()))
            .build()
            .unwrap();
        let limiter = manual(store, &clock);
        let held = hold_units(&limiter, "k", &quota, &clock).await;
        let spent = limiter.lease_stats().spent;
        let in_store = peek(&observer, "k", &quota).await;
        match end {
            "forget" => limiter.forget("k"),
            "release" => assert_eq!(limiter.release_leases().await, held),
            _ => clock.advance(INTERVAL / 5), // still valid, but idle past idle_after below
        }
        if end == "idle" {
            clock.advance(INTERVAL * 2);
        }
        let stats = settled(&limiter).await;
        assert_eq!(stats.returned, held, "{end}: {stats:?}");
        let after = peek(&observer, "k", &quota).await;
        assert!(after >= (in_store + held).min(quota.burst()), "{end}");
        assert!(after <= quota.burst(), "{end}: never above capacity");
        assert!(spent >= 300);
    }
}

#[tokio::test]
async fn bad_lease_configurations_fail_at_build_time_with_a_clear_error() {
    let build = |algorithm, leases| {
        Limiter::builder(MemoryStore::new())
            .algorithm(algorithm)
            .leases(leases)
            .build()
            .err()
    };
    let tb = Algorithm::TokenBucket;
    let cases = [
        (
            tb,
            Leases::new(Duration::ZERO),
            LeaseError::ZeroInterval,
            "above zero",
        ),
        (
            tb,
            Leases::new(Duration::from_secs(11)),
            LeaseError::IntervalTooLong,
            "at most 10 s",
        ),
        (
            tb,
            Leases::default().max_units(0),
            LeaseError::ZeroMaxUnits,
            "at least 1 unit",
        ),
        (
            tb,
            Leases::default().max_keys(15),
            LeaseError::TooFewKeys,
            "at least 16 keys",
        ),
        (
            tb,
            Leases::default().idle_after(Duration::from_millis(1)),
            LeaseError::IdleShorterThanInterval,
            "idle time",
        ),
        (
            Algorithm::SlidingLog,
            Leases::default(),
            LeaseError::Unsupported(Algorithm::SlidingLog),
            "cannot lease exactly",
        ),
        (
            Algorithm::SlidingWindow,
            Leases::default(),
            LeaseError::Unsupported(Algorithm::SlidingWindow),
            "cannot lease exactly",
        ),
    ];
    for (algorithm, leases, error, message) in cases {
        let refused = build(algorithm, leases).expect("refused");
        assert_eq!(refused, ConfigError::Lease(error));
        assert!(refused.to_string().contains(message), "{refused}");
    }
    for algorithm in EXACT_LEASING {
        assert_eq!(build(algorithm, Leases::default()), None);
    }
    // Checks that cannot lease go to the store as without leases: a peek consumes nothing.
    let limiter = Limiter::builder(MemoryStore::new())
        .leases(Leases::default())
        .build()
        .unwrap();
    let quota = Quota::per_second(10).unwrap();
    assert!(
        matches!(limiter.check_quotas("k", &quota.into(), 0).await, Verdict::Decided(d) if d.remaining == 10)
    );
    assert_eq!(limiter.lease_stats().renewals, 0);

    // The table is bounded: keys beyond `max_keys` are checked as without leases.
    let limiter = Limiter::builder(MemoryStore::new())
        .leases(Leases::default().max_keys(16))
        .build()
        .unwrap();
    for i in 0..200 {
        assert!(limiter.check(&format!("k{i}"), &quota).await.is_allowed());
    }
    assert_eq!(limiter.stats().allowed, 200);
    assert!(
        limiter.lease_stats().renewals <= 16,
        "{:?}",
        limiter.lease_stats()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_answers_from_a_lease_with_its_decision_and_headers_and_exactly_the_quota() {
    use http_body_util::Full;
    use redlimit::key::GlobalKey;
    use redlimit::RateLimitLayer;
    use std::sync::atomic::AtomicUsize;
    use support::service::{counting, SEEN};
    use tower::{Layer, ServiceExt};

    let limiter = Limiter::builder(MemoryStore::new())
        .leases(Leases::new(INTERVAL))
        .build()
        .unwrap();
    let quota = Quota::per_hour(400).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("g"))
        .build()
        .unwrap();
    let service = layer.layer(counting(calls.clone()));
    let mut admitted = 0;
    for _ in 0..1_000 {
        let request = http::Request::new(Full::default());
        let response = service.clone().oneshot(request).await.unwrap();
        if response.status() == http::StatusCode::OK {
            admitted += 1;
            // The handler saw the decision, and the header tells the client the same.
            let seen = response.headers()[SEEN].to_str().unwrap().to_owned();
            let header = response.headers()["ratelimit"].to_str().unwrap();
            assert!(header.contains(&format!(";r={seen};")), "{header} / {seen}");
        }
    }
    assert_eq!(admitted, 400);
    assert_eq!(calls.load(Ordering::SeqCst), 400);
    let stats = limiter.lease_stats();
    assert!(stats.renewals < 100, "served from the lease: {stats:?}");
}

/// 1000 a day: a leasing instance holds units when another process resets the key; the units
/// it gives back afterwards were paid for before the reset and never land in the state written
/// after it, so the fleet admits at most 1000 after the reset (on Redis and in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_leased_before_a_reset_are_never_given_back_after_it() {
    let redis = RedisServer::start();
    let quota = Quota::per_day(1_000).unwrap();
    for backend in ["redis", "memory"] {
        let clock = ManualClock::new(T0);
        let store = MemoryStore::new();
        let (leasing, other) = match backend {
            "redis" => {
                let ctx = Ctx::default().manual(&clock);
                (manual(ctx.redis_store(&redis), &clock), ctx.redis(&redis))
            }
            _ => (
                manual(store.clone(), &clock),
                Ctx::default().manual(&clock).limiter(store),
            ),
        };
        let held = hold_units(&leasing, "k", &quota, &clock).await;
        clock.advance(Duration::from_millis(1));
        other.reset("k").await.unwrap();
        // The other process admits after the reset (its state is written under the reset).
        let mut admitted = 0;
        for _ in 0..200 {
            admitted += u64::from(other.check("k", &quota).await.is_allowed());
        }
        clock.advance(Duration::from_millis(1));
        assert_eq!(leasing.release_leases().await, held, "{backend}");
        settled(&leasing).await;
        for _ in 0..1_200 {
            admitted += u64::from(other.check("k", &quota).await.is_allowed());
        }
        assert!(
            admitted <= 1_000,
            "{backend}: the fleet admitted {admitted} after a reset, of 1000 (held {held})"
        );
        assert_eq!(admitted, 1_000, "{backend}");
    }
}

/// A limiter on `store` leasing on the manual `clock` (any store).
fn leasing_on(store: impl redlimit::store::Store, clock: &ManualClock) -> Limiter {
    Limiter::builder(store)
        .clock(Clock::Manual(clock.clone()))
        .leases(Leases::new(INTERVAL))
        .build()
        .unwrap()
}

/// A control made by another process (an operator's, on the same store) reaches a leasing
/// instance whose key is denied, cached with a long `retry_after`, within one lease interval:
/// a suspension lifted early, a reset, a raised override. On Redis and on the memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_made_elsewhere_reaches_a_denied_leasing_key_within_one_interval() {
    let redis = RedisServer::start();
    let memory = MemoryStore::new();
    let clock = ManualClock::new(T0);
    let pairs = [
        (
            "redis",
            leasing_on(support::redis_store(&redis), &clock),
            Ctx::default().manual(&clock).redis(&redis),
        ),
        (
            "memory",
            leasing_on(memory.clone(), &clock),
            Ctx::default().manual(&clock).limiter(memory),
        ),
    ];
    let quota = Quota::per_hour(5).unwrap();
    let mut late = support::Denials::default();
    for (store, leasing, operator) in &pairs {
        for control in ["resume", "reset", "override"] {
            let key = format!("{store}-{control}");
            let key = key.as_str();
            if control == "resume" {
                operator
                    .suspend(key, Duration::from_secs(600))
                    .await
                    .unwrap();
            }
            let first =
                futures::future::join_all((0..20).map(|_| leasing.check(key, &quota))).await;
            let admitted = first.iter().filter(|v| v.is_allowed()).count();
            assert_eq!(
                admitted,
                if control == "resume" { 0 } else { 5 },
                "{store} {control}"
            );
            let cached = leasing.stats().deny_cached;
            assert!(!leasing.check(key, &quota).await.is_allowed());
            assert!(
                leasing.stats().deny_cached > cached,
                "{store} {control}: cached"
            );
            match control {
                "resume" => drop(operator.resume(key).await.unwrap()),
                "reset" => drop(operator.reset(key).await.unwrap()),
                _ => {
                    let raised = Quota::per_second(1_000).unwrap();
                    operator.set_quota(key, &raised.into()).await.unwrap();
                }
            }
            clock.advance(INTERVAL);
            let after = *leasing.check(key, &quota).await.decision().unwrap();
            late.note(
                format_args!("{store} {control}, one interval later"),
                &after,
            );
        }
    }
    late.assert_none("controls not seen within one interval");
}

/// A suspension through the leasing limiter itself ends its leases on every scope of the
/// tenant at once (a layer's scoped key included): nothing that starts after `suspend`
/// returns is admitted from held units. On Redis and on the memory store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspension_through_this_limiter_ends_the_leases_of_every_scope_at_once() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let quota = Quotas::from(Quota::per_second(1_000).unwrap());
    let mut admitted_after = Vec::new();
    for (store, limiter) in [
        ("redis", leasing_on(support::redis_store(&redis), &clock)),
        ("memory", leasing_on(MemoryStore::new(), &clock)),
    ] {
        let targets = [Target::scoped("api", "hot"), Target::key("hot")];
        for _ in 0..6 {
            for target in targets {
                futures::future::join_all((0..50).map(|_| limiter.check_quotas(target, &quota, 1)))
                    .await;
            }
            next_millisecond(&clock).await;
        }
        suspend_once_leased(&limiter, &limiter, "hot", Duration::from_secs(60), store).await;
        for (name, target) in ["scoped", "unscoped"].into_iter().zip(targets) {
            let mut admitted = 0;
            for _ in 0..100 {
                admitted += usize::from(limiter.check_quotas(target, &quota, 1).await.is_allowed());
            }
            if admitted > 0 {
                admitted_after.push(format!("{store} {name}: {admitted} of 100 admitted"));
            }
        }
    }
    assert!(
        admitted_after.is_empty(),
        "admitted after suspend returned: {admitted_after:#?}"
    );
}

/// A layer's lease (on its scoped key) ends when the limiter behind it suspends the tenant:
/// no request sent after `suspend` returns is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_admits_nothing_after_its_limiter_suspends_the_tenant() {
    use http_body_util::Full;
    use redlimit::key::GlobalKey;
    use redlimit::RateLimitLayer;
    use std::sync::atomic::AtomicUsize;
    use support::service::counting;
    use tower::{Layer, ServiceExt};

    let clock = ManualClock::new(T0);
    let limiter = leasing_on(MemoryStore::new(), &clock);
    let quota = Quota::per_second(1_000).unwrap();
    let layer = RateLimitLayer::builder(limiter.clone(), quota, GlobalKey::new("hot"))
        .build()
        .unwrap();
    let service = layer.layer(counting(Arc::new(AtomicUsize::new(0))));
    let send = || {
        let service = service.clone();
        async move {
            let response = service.oneshot(http::Request::new(Full::default())).await;
            response.unwrap().status() == http::StatusCode::OK
        }
    };
    for _ in 0..6 {
        futures::future::join_all((0..50).map(|_| send())).await;
        next_millisecond(&clock).await;
    }
    suspend_once_leased(&limiter, &limiter, "hot", Duration::from_secs(60), "layer").await;
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += usize::from(send().await);
    }
    assert_eq!(admitted, 0, "admitted after suspend returned, of 100");
}

/// A reset through the leasing limiter ends its lease without giving the units back: they were
/// taken before the reset and must not come back into the state after it, where another
/// instance has already spent from the full quota.
#[tokio::test(flavor = "current_thread")]
async fn units_leased_before_a_reset_never_come_back_after_it() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::new();
    let leasing = manual(store.clone(), &clock);
    let other = Ctx::default().manual(&clock).limiter(store);
    let quota = Quota::per_second(1_000).unwrap();
    let held = hold_units(&leasing, "t", &quota, &clock).await;
    leasing.reset("t").await.unwrap();
    // Before any background give-back can run (one thread, no await that yields).
    for _ in 0..500 {
        assert!(other.check("t", &quota).await.is_allowed());
    }
    let stats = settled(&leasing).await;
    assert_eq!(
        peek(&other, "t", &quota).await,
        500,
        "{held} units held at the reset; {stats:?}"
    );
}

/// After a data loss (`FLUSHALL`) the key starts fresh, and the units a leasing instance held
/// at the loss are admitted once more after it, each once: given back into the fresh state
/// when the lease ends (docs/leases.md, "After a data loss"): the fleet admits a fresh quota
/// plus exactly the units held at the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_held_at_a_data_loss_are_admitted_once_after_it() {
    let redis = RedisServer::start();
    let quota = Quota::per_day(1_000).unwrap();
    let clock = ManualClock::new(T0);
    let ctx = Ctx::default().manual(&clock);
    let leasing = manual(ctx.redis_store(&redis), &clock);
    let other = ctx.redis(&redis);
    hold_units(&leasing, "k", &quota, &clock).await;
    // A background renewal still in flight lands first: nothing is on its way at the loss.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = leasing.lease_stats().held;
    redis.flushall();
    let mut admitted = 0;
    for _ in 0..1_200 {
        admitted += u64::from(other.check("k", &quota).await.is_allowed());
    }
    assert_eq!(admitted, 1_000, "a fresh quota after the loss");
    clock.advance(Duration::from_millis(1));
    assert_eq!(leasing.release_leases().await, held);
    settled(&leasing).await;
    for _ in 0..1_200 {
        admitted += u64::from(other.check("k", &quota).await.is_allowed());
    }
    assert_eq!(
        admitted,
        1_000 + held,
        "after the loss: a fresh quota plus the {held} units held at it"
    );
}

/// The `Clock` docs: instances whose client clocks differ by at most `Clock::MAX_SKEW` admit
/// no more than one clock running as fast as the fastest would; docs/leases.md: units leased
/// before a reset are never given back after it. A leasing instance whose clock is 1 s ahead
/// of the operator's holds units when the operator resets the key; its give-back carries its
/// own (later) clock, yet those units were paid for before the reset, so the fleet still admits
/// at most the quota after it (fixed window and token bucket, on Redis and in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_leased_before_a_reset_by_a_slower_clock_are_never_given_back_after_it() {
    let redis = RedisServer::start();
    let quota = Quota::per_day(1_000).unwrap();
    let mut over = Vec::new();
    for algorithm in [Algorithm::FixedWindow, Algorithm::TokenBucket] {
        for backend in ["redis", "memory"] {
            // Both clocks at the same instant in real time; the instance's reads 1 s later.
            let operator_clock = ManualClock::new(T0);
            let clock = ManualClock::new(T0 + Duration::from_secs(1));
            let memory = MemoryStore::new();
            let builder = match backend {
                "redis" => Limiter::builder(Ctx::default().redis_store(&redis)),
                _ => Limiter::builder(memory.clone()),
            };
            let leasing = builder
                .algorithm(algorithm)
                .clock(Clock::Manual(clock.clone()))
                .leases(Leases::new(INTERVAL).idle_after(INTERVAL * 2))
                .build()
                .unwrap();
            let ctx = Ctx::new(algorithm).manual(&operator_clock);
            let other = match backend {
                "redis" => ctx.redis(&redis),
                _ => ctx.limiter(memory),
            };
            other.reset("skew").await.unwrap(); // a fresh key on the shared server
            let held = hold_units(&leasing, "skew", &quota, &clock).await;
            // After the lease in real time, both clocks move on alike.
            clock.advance(Duration::from_millis(10));
            operator_clock.advance(Duration::from_millis(10));
            other.reset("skew").await.unwrap();
            let mut admitted = 0;
            for _ in 0..200 {
                admitted += u64::from(other.check("skew", &quota).await.is_allowed());
            }
            // What it gives back may exceed `held` when a prefetch landed after it was read.
            leasing.release_leases().await;
            settled(&leasing).await;
            for _ in 0..1_200 {
                admitted += u64::from(other.check("skew", &quota).await.is_allowed());
            }
            if admitted > 1_000 {
                over.push(format!(
                    "{algorithm:?} on {backend}: {admitted} (held {held})"
                ));
            }
        }
    }
    assert!(over.is_empty(), "admitted after a reset, of 1000: {over:?}");
}
