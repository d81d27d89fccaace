//! A fixed window's leased units end with their window (docs/leases.md, "Validity": per aligned
//! window, admissions never exceed the quota), and so does a leasing instance's cached denial.
//! Counts are by the window each admission happened in, on a client `ManualClock`, on Redis and
//! on the memory store.

use std::time::Duration;

use redlimit::clock::ManualClock;
use redlimit::{Algorithm, Limiter, Quota, Quotas};

use super::settle::target;
use super::{backends, Backend, INTERVAL, T0};
use crate::support::{Ctx, RedisServer};

/// How many of `n` checks of cost 1 through `limiter` are admitted.
async fn admitted(limiter: &Limiter, quotas: &Quotas, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        if limiter.check_quotas(target(), quotas, 1).await.is_allowed() {
            admitted += 1;
        }
    }
    admitted
}

/// A fixed-window limiter leasing every `interval` and a plain one (another instance) on
/// `backend`, on `clock`.
fn pair(backend: &Backend, clock: &ManualClock, interval: Duration) -> (Limiter, Limiter) {
    backend.pair(&Ctx::new(Algorithm::FixedWindow).manual(clock), interval)
}

/// A window's start: the client clock of the fleet scenarios starts there.
const BASE: Duration = Duration::from_secs(1_700_000_000);

/// A client clock at `BASE`, and `N` fixed-window instances on `redis` leasing every 50 ms on
/// it.
fn leasing_fleet<const N: usize>(redis: &RedisServer) -> (ManualClock, [Limiter; N]) {
    let clock = ManualClock::new(BASE);
    let ctx = Ctx::new(Algorithm::FixedWindow).manual(&clock);
    let fleet = std::array::from_fn(|_| Backend::Redis(redis).leasing(&ctx, INTERVAL));
    (clock, fleet)
}

/// A period that is not a whole number of µs (1 s + 0.5 µs): the scripts count it as 1 000 001
/// µs, rounded up. A renewal 1.5 ms before a window's end is told 2 ms; its units must end with
/// the window all the same. 0.1 ms into W+1, once another instance charged W+1 in full, the
/// lease must answer nothing (each unit it answers there makes W+1 admit more than 1 000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_of_a_fractional_microsecond_period_ends_with_its_window() {
    let redis = RedisServer::start();
    let quota = Quota::new(1_000, Duration::from_nanos(1_000_000_500)).unwrap();
    let quotas = Quotas::from(quota);
    // A window boundary of 1 000 001 µs windows, 999 ms into a whole second (so a 1 000 000 µs
    // reading of the period puts the window's end 1 ms later than it is).
    let boundary = Duration::from_micros(1_699_999_000 * 1_000_001);
    for backend in backends(&redis) {
        let clock = ManualClock::new(boundary - Duration::from_micros(1_500));
        let (limiter, other) = pair(&backend, &clock, Duration::from_millis(50));
        assert_eq!(admitted(&limiter, &quotas, 400).await, 400, "{backend}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let held = limiter.lease_stats().held;
        assert!(held > 0, "{backend}: no lease held");
        clock.set(boundary + Duration::from_micros(100));
        let full = other.try_check_quotas(target(), &quotas, 1_000).await;
        assert!(full.unwrap().allowed, "{backend}: W+1 admits its 1 000");
        let late = admitted(&limiter, &quotas, held + 1).await;
        assert_eq!(
            late,
            0,
            "{backend}: W+1 admitted {} of a quota of 1 000 (a lease of W answered {late} of its \
             {held} units 0.1 ms into W+1)",
            1_000 + late
        );
    }
}

/// Tiny windows (1 ms, 1 000 a window: leases of up to 100) and a cost of 7: a renewal 0.3 ms
/// before a window's end is told 1 ms. No unit leased in W may be spent in W+1: every unit
/// spent there comes from a renewal made there. (Counted on the lease's counters: with a frozen
/// client clock, Redis's real-time expiry of a 1 ms window's key would blur a count in Redis.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_of_one_millisecond_windows_and_cost_7_ends_with_its_window() {
    let redis = RedisServer::start();
    let quota = Quota::new(1_000, Duration::from_millis(1)).unwrap();
    let quotas = Quotas::from(quota);
    let boundary = Duration::from_secs(1_700_000_000);
    for backend in backends(&redis) {
        let clock = ManualClock::new(boundary - Duration::from_micros(300));
        let (limiter, _) = pair(&backend, &clock, Duration::from_millis(50));
        let mut spent = 0;
        for _ in 0..100 {
            if limiter
                .check_quotas(target(), &quotas, 7)
                .await
                .is_allowed()
            {
                spent += 7;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let w = limiter.lease_stats();
        assert!(spent <= 1_000, "{backend}: W admitted {spent}");
        assert!(
            w.renewals < 100 && w.held > 0,
            "{backend}: never leased: {w:?}"
        );
        clock.set(boundary + Duration::from_micros(1));
        admitted(&limiter, &quotas, 20).await;
        let next = limiter.lease_stats();
        assert!(
            next.spent - w.spent <= next.leased - w.leased,
            "{backend}: W+1 spent {} units, its renewals leased {}: units of W were spent in \
             W+1; {w:?} then {next:?}",
            next.spent - w.spent,
            next.leased - w.leased
        );
    }
}

/// An override of several windows on a fixed window key (which must not lease: the reply names
/// the end of the longest window only): 100 per 1.25 s, listed first, and 100 per 1 s. The
/// lease's renewal just before a 1 s window W's end (asking k units sized before it learnt of the
/// override) is told the 1.25 s window's end. Per aligned 1 s window, admissions (by the window
/// they happen in) must stay within 100: the leasing instance's admissions in W+1 before the
/// 1.25 s window turns, plus another instance's after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_of_several_windows_leases_nothing_past_its_shortest_window() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_second(1_000).unwrap());
    let long = Quota::new(100, Duration::from_millis(1_250)).unwrap();
    let short = Quota::per_second(100).unwrap();
    let tight = Quotas::new([long, short]).unwrap();
    // BASE is a multiple of 5 s: the 1 s and 1.25 s windows both start there.
    let at = |ms: u64| BASE + Duration::from_millis(ms);
    for backend in backends(&redis) {
        let clock = ManualClock::new(at(1_850));
        let (limiter, other) = pair(&backend, &clock, Duration::from_millis(500));
        // A hot key: the lease grows (its own quota, before any override).
        assert_eq!(admitted(&limiter, &quotas, 300).await, 300, "{backend}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The operator's override, made elsewhere: this instance learns of it at its renewal.
        other.set_quota(target(), &tight).await.unwrap();
        // W = [1 s, 2 s), the long window [1.25 s, 2.5 s): traffic at 1.9 s renews under the
        // override (the held units of the own quota spent first), until it renews once.
        clock.set(at(1_900));
        let renewals = limiter.lease_stats().renewals;
        let mut in_w = 0;
        while limiter.lease_stats().renewals == renewals && in_w < 1_000 {
            in_w += admitted(&limiter, &quotas, 1).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stats = limiter.lease_stats();
        // W+1 = [2 s, 3 s): this instance until the long window turns (2.5 s), then another.
        clock.set(at(2_000));
        let leased_late = admitted(&limiter, &quotas, 200).await;
        clock.set(at(2_500));
        let other_late = admitted(&other, &quotas, 200).await;
        let in_next = leased_late + other_late;
        assert!(
            in_next <= 100,
            "{backend}: the 1 s window W+1 admitted {in_next} under an override of 100 a second \
             ({leased_late} from units leased in W, {other_late} after); W admitted {in_w} at \
             1.9 s; {stats:?}"
        );
    }
}

/// A fleet on one Redis and one client clock: two leasing instances and one that does not
/// lease; every 20 ms the leasing ones send 40 requests each and the other 10 (4 500 a second
/// against 1 000 a second in fixed windows), across windows; then an operator (a process of its
/// own) sets an override of 300 a second mid-window, then suspends the tenant. Counted by the
/// window each admission happened in: a window admits at most its quota and, while Redis
/// answers, at least the quota less instances × k (k ≤ 100); the window after the override at
/// most 300; nothing is admitted more than one lease interval after the suspension. (The client
/// clock runs ahead of real time: Redis expires keys in real time, and a clock slower than it
/// would see a window's key expire before the window ends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_admits_per_window_within_the_quota_and_obeys_controls_within_an_interval() {
    let redis = RedisServer::start();
    let (clock, [a, b]) = leasing_fleet(&redis);
    let ctx = Ctx::new(Algorithm::FixedWindow).manual(&clock);
    let fleet = [a, b, ctx.redis(&redis)];
    let operator = ctx.redis(&redis);
    let quotas = Quotas::from(Quota::per_second(1_000).unwrap());
    let mut per_window = [0u64; 6];
    // Admissions that started more than one interval after the suspension.
    let mut late = 0;
    for ms in (0..5_500u64).step_by(20) {
        clock.set(BASE + Duration::from_millis(ms));
        if ms == 3_500 {
            let tight = Quotas::from(Quota::per_second(300).unwrap());
            operator.set_quota(target(), &tight).await.unwrap();
        }
        if ms == 4_500 {
            operator
                .suspend("hot", Duration::from_secs(60))
                .await
                .unwrap();
        }
        for (i, limiter) in fleet.iter().enumerate() {
            let n = admitted(limiter, &quotas, if i < 2 { 40 } else { 10 }).await;
            per_window[(ms / 1_000) as usize] += n;
            if ms > 4_550 {
                late += n;
            }
        }
    }
    let stats: Vec<_> = fleet[..2].iter().map(Limiter::lease_stats).collect();
    let lease_min = 1_000 - 2 * 100;
    println!("per window {per_window:?}, late {late}, {stats:?}");
    for (w, admitted) in per_window[..3].iter().enumerate() {
        assert!(
            (lease_min..=1_000).contains(admitted),
            "window {w} admitted {admitted} (quota 1 000, at least {lease_min}); {per_window:?} \
             {stats:?}"
        );
    }
    assert!(per_window[3] <= 1_000, "{per_window:?}");
    assert!(
        per_window[4] <= 300,
        "the window after the override: {per_window:?}"
    );
    assert_eq!(late, 0, "admitted after the suspension: {per_window:?}");
}

/// The extremes of a fixed window's period, on a client clock: 1 µs windows, and the longest
/// period (100 years: the first window ends in 2070). A lease taken just before a window's end
/// spends none of its units once the next window began: every unit spent there comes from a
/// renewal made there (counted on the lease's counters: Redis expires a 1 µs window's key in
/// real time, 1 ms, while the client clock stands still).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_lease_of_the_shortest_and_longest_periods_ends_with_its_window() {
    let redis = RedisServer::start();
    let longest = redlimit::quota::MAX_PERIOD;
    let cases = [
        // (period, the lease's time, a time in the next window)
        (
            Duration::from_micros(1),
            Duration::from_secs(1_700_000_000),
            Duration::from_secs(1_700_000_000) + Duration::from_micros(1),
        ),
        (
            longest,
            longest - Duration::from_micros(1_500),
            longest + Duration::from_micros(100),
        ),
    ];
    for (period, leased_at, next) in cases {
        let quotas = Quotas::from(Quota::new(1_000, period).unwrap());
        for backend in backends(&redis) {
            redis.flushall();
            let clock = ManualClock::new(leased_at);
            let (limiter, _) = pair(&backend, &clock, Duration::from_millis(50));
            let what = format!("{backend} {period:?}");
            assert_eq!(admitted(&limiter, &quotas, 400).await, 400, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
            let w = limiter.lease_stats();
            assert!(w.held > 0, "{what}: no lease held");
            clock.set(next);
            admitted(&limiter, &quotas, w.held + 1).await;
            let next = limiter.lease_stats();
            assert!(
                next.spent - w.spent <= next.leased - w.leased,
                "{what}: units of W were spent in W+1; {w:?} then {next:?}"
            );
        }
    }
}

/// Two leasing instances on one client clock (each 10 requests every 10 ms: 2 000 a second
/// against 1 000); 0.2 s into a window one of them resets the tenant itself
/// (which ends its own leases before it returns) while the other learns of it only at its next
/// renewal. From the reset to the window's end the key admits at most a fresh quota plus what
/// the other instance held at the reset (k ≤ 100; its units live one interval at most), and from
/// one interval after the reset at most a fresh quota. (No lower bound: the docs promise one per
/// aligned window, and a give-back mixing units leased before and after the reset is dated by
/// the oldest and lost whole, which the state after the reset pays for.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_by_one_leasing_instance_mid_window_bounds_the_rest_of_the_window() {
    let redis = RedisServer::start();
    let (clock, [a, b]) = leasing_fleet(&redis);
    let quotas = Quotas::from(Quota::per_second(1_000).unwrap());
    let (mut before, mut after, mut after_interval) = (0, 0, 0);
    let mut held_at_reset = [0; 2];
    for ms in (0..1_000u64).step_by(10) {
        clock.set(BASE + Duration::from_millis(ms));
        if ms == 200 {
            held_at_reset = [a.lease_stats().held, b.lease_stats().held];
            b.reset("hot").await.unwrap();
        }
        for limiter in [&a, &b] {
            let n = admitted(limiter, &quotas, 10).await;
            match ms {
                ..200 => before += n,
                200..250 => after += n,
                _ => after_interval += n,
            }
        }
    }
    let stats = [a.lease_stats(), b.lease_stats()];
    assert!(
        held_at_reset.iter().any(|&h| h > 0),
        "no lease held at the reset"
    );
    println!("held at the reset {held_at_reset:?}; before {before}, after {after} (+{after_interval} past one interval); {stats:?}");
    assert!(before <= 1_000, "before the reset: {before}; {stats:?}");
    assert!(
        after + after_interval <= 1_000 + 100,
        "after the reset: {after} + {after_interval}; {stats:?}"
    );
    assert!(
        after_interval <= 1_000,
        "one interval after the reset: {after_interval}"
    );
}

/// Two leasing instances alone on one client clock, each 10 requests every 10 ms (2 000 a
/// second against 1 000 a second in fixed windows), over 4 windows: each aligned window admits
/// at most its quota and, Redis answering every call, at least the quota less instances × k
/// (k ≤ 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_instances_alone_admit_per_window_between_the_quota_less_instances_k_and_it() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_second(1_000).unwrap());
    let (clock, fleet) = leasing_fleet::<2>(&redis);
    let mut per_window = [0u64; 4];
    for ms in (0..4_000u64).step_by(10) {
        clock.set(BASE + Duration::from_millis(ms));
        for limiter in &fleet {
            per_window[(ms / 1_000) as usize] += admitted(limiter, &quotas, 10).await;
        }
    }
    let stats = [fleet[0].lease_stats(), fleet[1].lease_stats()];
    println!("per window {per_window:?}; {stats:?}");
    for (w, admitted) in per_window.iter().enumerate() {
        assert!(
            (800..=1_000).contains(admitted),
            "window {w} admitted {admitted} (quota 1 000, at least 800): {per_window:?}; {stats:?}"
        );
    }
}

/// Deny cache at a fixed window's turn (manual clock): a leasing instance that spent its
/// window is denied from the cache; once the window turns it admits at once (the cached
/// denial ends with the window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_a_cached_denial_ends_with_its_fixed_window() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let ctx = Ctx::new(Algorithm::FixedWindow).manual(&clock);
    let leasing = Backend::Redis(&redis).leasing(&ctx, INTERVAL);
    let quota = Quota::per_minute(100).unwrap();
    let mut ok = 0;
    for _ in 0..150 {
        ok += u64::from(leasing.check("w", &quota).await.is_allowed());
    }
    assert_eq!(ok, 100);
    let denied = *leasing.check("w", &quota).await.decision().unwrap();
    assert!(!denied.allowed);
    clock.advance(denied.retry_after + Duration::from_micros(1));
    let v = leasing.check("w", &quota).await;
    assert!(
        v.is_allowed(),
        "denied after its retry_after {:?}: {v:?}",
        denied.retry_after
    );
    let mut second = 1;
    for _ in 0..150 {
        second += u64::from(leasing.check("w", &quota).await.is_allowed());
    }
    assert_eq!(second, 100, "admitted in the second window");
}
