//! Leases as the core's delegate, on a private Redis leasing every 50 ms: this limiter's own
//! controls (`suspend`, `reset`) and `forget` reach its leases, `release_leases` balances the
//! counters, a dropped limiter's sweeper stops, and a blocking check goes to the store.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::limiter::BlockFor;
use redlimit::{Limiter, Quota, Quotas};

use super::{balanced, consumed, leasing_and_observer, CAPACITY, INTERVAL};
use crate::support::RedisServer;

/// A day's quota of [`CAPACITY`]: nothing here runs out of it unless it says so.
fn daily() -> Quota {
    Quota::per_day(CAPACITY).unwrap()
}

/// Bursts of 50 concurrent checks of `key` until the limiter holds leased units (at most 40
/// bursts). Returns the admissions.
async fn hold_a_lease(limiter: &Limiter, key: &str, quota: &Quota) -> u64 {
    let mut admitted = 0;
    for _ in 0..40 {
        let verdicts = join_all((0..50).map(|_| limiter.check(key, quota))).await;
        admitted += verdicts.iter().filter(|v| v.is_allowed()).count() as u64;
        if limiter.lease_stats().held > 0 {
            return admitted;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no lease held: {:?}", limiter.lease_stats());
}

/// A leasing limiter and an observer on `redis` (see [`leasing_and_observer`], a 2 s timeout),
/// the limiter holding a lease on `hot` under [`daily`]: (limiter, observer, that quota, the
/// admissions [`hold_a_lease`] took).
async fn holding_hot(redis: &RedisServer) -> (Limiter, Limiter, Quota, u64) {
    let (limiter, observer) = leasing_and_observer(redis, Duration::from_secs(2));
    let quota = daily();
    let admitted = hold_a_lease(&limiter, "hot", &quota).await;
    (limiter, observer, quota, admitted)
}

/// Waits until the limiter holds no leased unit (give-backs land in tasks) or 2 s; its stats.
async fn nothing_held(limiter: &Limiter) -> redlimit::limiter::LeaseStats {
    let started = Instant::now();
    loop {
        let s = limiter.lease_stats();
        if (s.held == 0 && balanced(&s)) || started.elapsed() > Duration::from_secs(2) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits as [`nothing_held`] does, then asserts that the counters balance and nothing is held;
/// the stats.
async fn released(limiter: &Limiter) -> redlimit::limiter::LeaseStats {
    let after = nothing_held(limiter).await;
    assert!(balanced(&after), "{after:?}");
    assert_eq!(after.held, 0, "{after:?}");
    after
}

/// Waits until the limiter's lease stats stop moving for 30 ms (a renewal started by earlier
/// checks has landed), at most 2 s; its stats.
async fn quiet(limiter: &Limiter) -> redlimit::limiter::LeaseStats {
    let started = Instant::now();
    let mut last = limiter.lease_stats();
    loop {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let now = limiter.lease_stats();
        if now == last || started.elapsed() > Duration::from_secs(2) {
            return now;
        }
        last = now;
    }
}

/// Asserts that `late`, the admissions after a control took effect, is 0; `what` says what
/// they were, the limiter's lease stats follow.
fn assert_none_late(late: u64, what: &str, limiter: &Limiter) {
    assert_eq!(late, 0, "{what}; {:?}", limiter.lease_stats());
}

/// Checks of `key` by 8 tasks until `stop`, each admission stamped: those that started after
/// `cutoff` (set once) are counted apart.
struct Hammer {
    stop: Arc<AtomicBool>,
    late_admitted: Arc<AtomicU64>,
    admitted: Arc<AtomicU64>,
    cutoff: Arc<std::sync::Mutex<Option<Instant>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Hammer {
    fn start(limiter: &Limiter, key: &'static str, quota: Quota) -> Hammer {
        let stop = Arc::new(AtomicBool::new(false));
        let late_admitted = Arc::new(AtomicU64::new(0));
        let admitted = Arc::new(AtomicU64::new(0));
        let cutoff = Arc::new(std::sync::Mutex::new(None::<Instant>));
        let tasks = (0..8)
            .map(|_| {
                let (limiter, stop) = (limiter.clone(), stop.clone());
                let (late, all, cutoff) = (late_admitted.clone(), admitted.clone(), cutoff.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let allowed = limiter.check(key, &quota).await.is_allowed();
                        if allowed {
                            all.fetch_add(1, Ordering::Relaxed);
                            let after = cutoff.lock().unwrap().is_some_and(|at| started > at);
                            if after {
                                late.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        Hammer {
            stop,
            late_admitted,
            admitted,
            cutoff,
            tasks,
        }
    }

    fn cut_at(&self, at: Instant) {
        *self.cutoff.lock().unwrap() = Some(at);
    }

    /// Stops the tasks: (all admissions, admissions that started after the cutoff).
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        (
            self.admitted.load(Ordering::Relaxed),
            self.late_admitted.load(Ordering::Relaxed),
        )
    }
}

/// A leasing tenant suspended by this very limiter while 8 tasks check it: no check that starts
/// one lease interval after the suspension returned is admitted (units leased before it, or a
/// renewal answered across it, must not outlive it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspension_by_the_leasing_limiter_admits_nothing_from_earlier_leases_after_one_interval()
{
    let redis = RedisServer::start();
    let (limiter, _observer) = leasing_and_observer(&redis, Duration::from_secs(2));
    let quota = Quota::per_day(1_000_000).unwrap();
    hold_a_lease(&limiter, "hot", &quota).await;
    let hammer = Hammer::start(&limiter, "hot", quota);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(limiter.lease_stats().held > 0 || limiter.lease_stats().renewals > 1);
    limiter
        .suspend("hot", Duration::from_secs(600))
        .await
        .unwrap();
    hammer.cut_at(Instant::now() + INTERVAL);
    tokio::time::sleep(INTERVAL * 6).await;
    let (admitted, late) = hammer.stop().await;
    assert!(admitted > 0, "the hammer admitted nothing at all");
    assert_none_late(
        late,
        "admitted more than one interval after the suspension",
        &limiter,
    );
}

/// A reset by the leasing limiter strands its held units: none is returned, the stranded count
/// grows by what was held, and the store counts only what is spent after the reset (another
/// instance's 5), never a give-back of units leased before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_strands_the_units_leased_before_it_and_gives_none_back() {
    let redis = RedisServer::start();
    let (limiter, observer, quota, _) = holding_hot(&redis).await;
    let before = limiter.lease_stats();
    assert!(before.held > 0, "{before:?}");
    limiter.reset("hot").await.unwrap();
    let quotas = Quotas::from(&quota);
    assert!(observer.check_quotas("hot", &quotas, 5).await.is_allowed());
    let after = nothing_held(&limiter).await;
    assert!(balanced(&after), "{after:?}");
    assert_eq!(after.held, 0, "a lease outlived the reset: {after:?}");
    assert_eq!(
        after.returned, before.returned,
        "units given back: {after:?}"
    );
    assert!(
        after.stranded >= before.stranded + before.held,
        "held {} before the reset, stranded {} -> {}",
        before.held,
        before.stranded,
        after.stranded
    );
    assert_eq!(consumed(&observer, "hot", &quota).await, 5, "{after:?}");
}

/// `forget` ends the key's lease and gives its units back: nothing held, the store's count is
/// what was spent (the lease's unspent units are back), and the counters balance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_ends_the_keys_lease_and_gives_its_units_back() {
    let redis = RedisServer::start();
    let (limiter, observer, quota, admitted) = holding_hot(&redis).await;
    quiet(&limiter).await;
    limiter.forget("hot");
    let after = released(&limiter).await;
    assert_eq!(after.spent, admitted, "{after:?}");
    assert_eq!(
        consumed(&observer, "hot", &quota).await,
        after.spent + after.stranded,
        "{after:?}"
    );
}

/// Requests waiting for a renewal held up by Redis (`DEBUG SLEEP`) when the key is forgotten:
/// each is answered once Redis wakes, within the store's timeout, and the store counts exactly
/// the admissions (no unit lost or counted twice) once the leases are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_wakes_the_requests_waiting_for_a_renewal_and_loses_no_unit() {
    let redis = RedisServer::start();
    let (limiter, observer, quota, mut admitted) = holding_hot(&redis).await;
    // Spend what is held, then a burst that must renew: it waits behind the sleep.
    let sleeping = redis.asleep(Duration::from_millis(400)).await;
    let waiting = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let (started, quota) = (Instant::now(), daily());
            let verdicts = join_all((0..200).map(|_| limiter.check("hot", &quota))).await;
            let allowed = verdicts.iter().filter(|v| v.is_allowed()).count() as u64;
            (allowed, verdicts.len(), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    limiter.forget("hot");
    let (allowed, answered, took) = waiting.await.unwrap();
    sleeping.join().unwrap();
    admitted += allowed;
    assert_eq!(answered, 200);
    assert!(took < Duration::from_millis(2_500), "took {took:?}");
    limiter.release_leases().await;
    let after = released(&limiter).await;
    assert_eq!(
        consumed(&observer, "hot", &quota).await,
        admitted + after.stranded,
        "admitted {admitted}; {after:?}"
    );
}

/// `release_leases` after concurrent traffic on several keys: nothing is held, the counters
/// balance (`leased = spent + held + returned + stranded`), and the store counts what was
/// admitted plus what was stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_leases_then_lease_stats_balance_and_the_store_counts_the_admissions() {
    let redis = RedisServer::start();
    let (limiter, observer) = leasing_and_observer(&redis, Duration::from_secs(2));
    let quota = daily();
    let keys = ["a", "b", "c"];
    let mut admitted = 0;
    for key in keys {
        admitted += hold_a_lease(&limiter, key, &quota).await;
    }
    quiet(&limiter).await;
    let given = limiter.release_leases().await;
    let after = released(&limiter).await;
    assert_eq!(after.spent, admitted, "{after:?}");
    assert!(given <= after.returned, "gave {given}; {after:?}");
    let mut counted = 0;
    for key in keys {
        counted += consumed(&observer, key, &quota).await;
    }
    assert_eq!(counted, admitted + after.stranded, "{after:?}");
}

/// A leasing limiter dropped (every clone) while its sweeper runs, a give-back of its held by
/// Redis (`DEBUG SLEEP`): the sweeper stops (no script call reaches Redis afterwards), and the
/// store counts at least the admissions and at most the admissions and what was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_dropped_while_its_sweeper_runs_stops_sweeping() {
    let redis = RedisServer::start();
    let (limiter, observer, quota, admitted) = holding_hot(&redis).await;
    let held = limiter.lease_stats().held;
    // Idle: the sweeper's next rounds end the lease and give its units back, behind the sleep.
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    tokio::time::sleep(INTERVAL * 3).await;
    drop(limiter);
    sleeping.join().unwrap();
    tokio::time::sleep(INTERVAL * 4).await;
    redis.reset_stats();
    tokio::time::sleep(INTERVAL * 6).await;
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    assert_eq!(calls, 0, "script calls after the limiter was dropped");
    let counted = consumed(&observer, "hot", &quota).await;
    assert!(
        admitted <= counted && counted <= admitted + held,
        "admitted {admitted}, held {held}, counted {counted}"
    );
}

/// A blocking check on a leasing limiter holding a lease goes to the store: the lease's
/// counters do not move, Redis runs a script call, and the store counts its unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_check_on_a_leasing_limiter_goes_to_the_store_not_the_lease() {
    let redis = RedisServer::start();
    let (limiter, observer, quota, _) = holding_hot(&redis).await;
    let before = quiet(&limiter).await;
    assert!(before.held > 0, "{before:?}");
    let counted_before = consumed(&observer, "hot", &quota).await;
    redis.reset_stats();
    let quotas = Quotas::from(&quota);
    let block = BlockFor::new(Duration::from_secs(60)).unwrap();
    let verdict = limiter.check_blocking("hot", &quotas, 1, &block).await;
    assert!(verdict.is_allowed(), "{verdict:?}");
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    let after = limiter.lease_stats();
    assert_eq!(
        (after.spent, after.leased, after.renewals),
        (before.spent, before.leased, before.renewals),
        "answered from the lease"
    );
    assert!(calls >= 1, "no script call reached Redis");
    // The sweeper may end the idle lease meanwhile: what it gave back left the store's count.
    let returned = after.returned - before.returned;
    assert_eq!(
        consumed(&observer, "hot", &quota).await,
        counted_before + 1 - returned,
        "{after:?}"
    );
}

/// A renewal held up by Redis (`DEBUG SLEEP`) and this limiter's own control sent behind it:
/// the renewal's units are granted before the control and answered around it. Returns once
/// the control returned, with the burst's admissions.
async fn renewal_across_own_control(
    redis: &RedisServer,
    limiter: &Limiter,
    key: &'static str,
    quota: Quota,
    burst: usize,
    reset: bool,
) -> u64 {
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let checks = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let verdicts = join_all((0..burst).map(|_| limiter.check(key, &quota))).await;
            verdicts.iter().filter(|v| v.is_allowed()).count() as u64
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    if reset {
        limiter.reset(key).await.unwrap();
    } else {
        limiter
            .suspend(key, Duration::from_secs(600))
            .await
            .unwrap();
    }
    let admitted = checks.await.unwrap();
    sleeping.join().unwrap();
    admitted
}

/// A suspension by the leasing limiter sent while its renewal waits behind a `DEBUG SLEEP`
/// (Redis grants the renewal first, on a fresh key): one lease interval after the suspension returned, no
/// check is admitted from the renewal's units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_across_a_suspension_admits_nothing_one_interval_after_it() {
    let redis = RedisServer::start();
    let (limiter, _observer) = leasing_and_observer(&redis, Duration::from_secs(2));
    let quota = Quota::per_day(1_000_000).unwrap();
    for key in ["r0", "r1", "r2"] {
        // A fresh key: the burst's first check renews behind the sleep, the rest wait for it.
        // (Seen here: Redis may run the suspension first, and the burst is then refused.)
        renewal_across_own_control(&redis, &limiter, key, quota, 300, false).await;
        tokio::time::sleep(INTERVAL + Duration::from_millis(5)).await;
        let late = super::admitted_of(&limiter, key, &quota, 100).await;
        assert_none_late(
            late,
            &format!("{key}: admitted after the suspension"),
            &limiter,
        );
    }
}

/// A reset by the leasing limiter sent while its renewal waits behind a `DEBUG SLEEP` (Redis
/// grants the renewal first), then another instance spends 5: once nothing is held the store
/// counts at least those 5 (a unit leased before the reset that came back after it would take
/// the count below: renewals after the reset give back at most what they were granted) and at
/// most those 5 and what was leased since the burst began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_across_a_reset_gives_nothing_back_after_it() {
    let redis = RedisServer::start();
    let (limiter, observer, quota, _) = holding_hot(&redis).await;
    let before = quiet(&limiter).await;
    let burst = usize::try_from(before.held).unwrap() + 1;
    renewal_across_own_control(&redis, &limiter, "hot", quota, burst, true).await;
    let quotas = Quotas::from(&quota);
    assert!(observer.check_quotas("hot", &quotas, 5).await.is_allowed());
    tokio::time::sleep(INTERVAL * 4).await;
    let after = released(&limiter).await;
    let counted = consumed(&observer, "hot", &quota).await;
    let leased_since = after.leased - before.leased;
    assert!(
        (5..=5 + leased_since).contains(&counted),
        "counted {counted}, leased since {leased_since}: {before:?} -> {after:?}"
    );
}

/// The leasing limiter lowers a leasing tenant's quota (`set_quota`, 10 a day) below what Redis
/// already counts: one lease interval later, no check under the default quota is admitted (the
/// lease's units, leased under the old quota, end with it), and Redis counts no more than before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_lowered_by_the_leasing_limiter_admits_nothing_from_earlier_leases_after_one_interval(
) {
    let redis = RedisServer::start();
    let (limiter, observer, quota, admitted) = holding_hot(&redis).await;
    assert!(admitted > 10, "admitted {admitted}");
    let before = quiet(&limiter).await;
    assert!(before.held > 0, "{before:?}");
    let lowered = Quotas::from(Quota::per_day(10).unwrap());
    limiter.set_quota("hot", &lowered).await.unwrap();
    tokio::time::sleep(INTERVAL + Duration::from_millis(5)).await;
    let late = super::admitted_of(&limiter, "hot", &quota, 100).await;
    assert_none_late(late, "admitted under the lowered quota", &limiter);
    released(&limiter).await;
    // The observer, under the default quota, is refused too: the override binds.
    let refused = observer.check("hot", &quota).await;
    assert!(!refused.is_allowed(), "{refused:?}");
}
