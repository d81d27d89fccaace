//! Token leases for hot keys (`LimiterBuilder::leases`), on real Redis and on the memory store:
//! what a leasing instance admits, reports and gives back, when requests are dropped, when the
//! store fails, under controls, and how a lease-answered request's settlement is dated.

mod above_the_core;
mod basics;
mod cancel;
mod controls;
mod drops;
mod give_back;
mod hostile_input;
mod remaining;
pub(crate) mod settle;
mod settle_every_algorithm;
mod store_faults;
mod windows;

use std::fmt;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redlimit::clock::{Clock, ManualClock};
use redlimit::limiter::{LeaseStats, Leases};
use redlimit::store::{MemoryStore, Store};
use redlimit::{Algorithm, Limiter, Quota, Quotas, Target, Verdict};

use crate::support::{Ctx, RedisServer};

/// The lease interval of most tests here.
const INTERVAL: Duration = Duration::from_millis(50);
/// A client clock's start: the middle of an hour.
const T0: Duration = Duration::from_secs(1_700_003_600);

/// A limiter on `redis` leasing every 50 ms, under `algorithm`, with the store `timeout`.
pub(crate) fn leasing_with(
    redis: &RedisServer,
    algorithm: Algorithm,
    timeout: Duration,
) -> Limiter {
    let ctx = Ctx {
        algorithm,
        timeout,
        ..Ctx::default()
    };
    Limiter::builder(ctx.redis_store(redis))
        .algorithm(algorithm)
        .leases(Leases::new(INTERVAL))
        .build()
        .unwrap()
}

/// A fixed-window limiter on `redis` leasing every 50 ms with the store `timeout`, and an
/// observer beside it (a plain limiter on the same Redis) that reads what Redis counts.
fn leasing_and_observer(redis: &RedisServer, timeout: Duration) -> (Limiter, Limiter) {
    let limiter = leasing_with(redis, Algorithm::FixedWindow, timeout);
    (limiter, Ctx::new(Algorithm::FixedWindow).redis(redis))
}

/// Units the store counts consumed on `target` under `quota`: a peek through `limiter` (cost 0,
/// which `try_check` sends to the store, never to a lease).
async fn consumed<'a>(limiter: &Limiter, target: impl Into<Target<'a>>, quota: &Quota) -> u64 {
    let quotas = Quotas::from(quota);
    let peek = limiter.try_check_quotas(target, &quotas, 0).await;
    quota.burst() - peek.expect("the store decides").remaining
}

fn balanced(s: &LeaseStats) -> bool {
    s.leased == s.spent + s.held + s.returned + s.stranded
}

/// Waits until `leased = spent + held + returned + stranded` (give-backs land in tasks) or 5 s.
async fn settled(limiter: &Limiter) -> LeaseStats {
    let started = Instant::now();
    loop {
        let s = limiter.lease_stats();
        if balanced(&s) || started.elapsed() > Duration::from_secs(5) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A day's quota: leases of up to 100 units.
const CAPACITY: u64 = 1_000;

/// How many ms Redis's clock is into its current second (window, for a quota per second).
fn ms_in_second(redis: &RedisServer) -> u64 {
    u64::from(redis.time().subsec_millis())
}

/// Waits until Redis's clock is at most `ms` into a second, so that steps started now end well
/// inside that second's window.
fn early_in_a_second(redis: &RedisServer, ms: u64) {
    while ms_in_second(redis) > ms {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Puts Redis to sleep (`DEBUG SLEEP`) until half a second into its next second (window W+1),
/// and gives the command 20 ms to reach it. Join the handle to wait until Redis wakes.
async fn asleep_until_half_into_the_next_second(redis: &RedisServer) -> JoinHandle<()> {
    let sleep = Duration::from_millis(1_000 - ms_in_second(redis) + 500);
    redis.asleep(sleep).await
}

/// What renewals leased and give-backs returned between two readings of a limiter's
/// `lease_stats`: (renewed, returned).
fn renewed_and_returned(before: &LeaseStats, after: &LeaseStats) -> (u64, u64) {
    (
        after.leased - before.leased,
        after.returned - before.returned,
    )
}

/// How many of `n` checks of `key` under `quota` through `limiter`, one after another, are
/// admitted.
async fn admitted_of(limiter: &Limiter, key: &str, quota: &Quota, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(limiter.check(key, quota).await.is_allowed());
    }
    admitted
}

/// A check of `key` through `limiter` once `clock` moved one lease interval (and 1 µs) on: by
/// then a control made elsewhere has reached a leasing instance.
async fn one_interval_later(
    limiter: &Limiter,
    clock: &ManualClock,
    key: &str,
    quota: &Quota,
) -> Verdict {
    clock.advance(INTERVAL + Duration::from_micros(1));
    limiter.check(key, quota).await
}

/// The algorithms that lease.
const LEASING: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::Gcra,
    Algorithm::FixedWindow,
];

/// A limiter of `algorithm` on `store` with leases of 50 ms, on the store's clock.
fn leasing(store: impl Store, algorithm: Algorithm) -> Limiter {
    leasing_on(store, algorithm, Clock::default())
}

/// A limiter of `algorithm` on `store` with leases of 50 ms, on `clock`.
fn leasing_on(store: impl Store, algorithm: Algorithm, clock: Clock) -> Limiter {
    leasing_every(store, algorithm, clock, INTERVAL)
}

/// A limiter of `algorithm` on `store` with leases of `interval`, on `clock`.
fn leasing_every(
    store: impl Store,
    algorithm: Algorithm,
    clock: Clock,
    interval: Duration,
) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .clock(clock)
        .leases(Leases::new(interval))
        .build()
        .unwrap()
}

/// The store a scenario's limiters share: a private Redis (each limiter on a connection of its
/// own) or a memory store. It prints as its name, "redis" or "memory".
#[derive(Clone)]
enum Backend<'a> {
    Redis(&'a RedisServer),
    Memory(MemoryStore),
}

impl fmt::Display for Backend<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Redis(_) => "redis",
            Backend::Memory(_) => "memory",
        })
    }
}

impl Backend<'_> {
    /// A limiter of `ctx` on this store, leasing every `interval` (on `ctx`'s algorithm and
    /// clock).
    fn leasing(&self, ctx: &Ctx, interval: Duration) -> Limiter {
        let clock = ctx.clock.clone();
        match self {
            Backend::Redis(redis) => {
                leasing_every(ctx.redis_store(redis), ctx.algorithm, clock, interval)
            }
            Backend::Memory(memory) => {
                leasing_every(memory.clone(), ctx.algorithm, clock, interval)
            }
        }
    }

    /// A limiter of `ctx` on this store that does not lease.
    fn plain(&self, ctx: &Ctx) -> Limiter {
        match self {
            Backend::Redis(redis) => ctx.redis(redis),
            Backend::Memory(memory) => ctx.limiter(memory.clone()),
        }
    }

    /// A limiter of `ctx` leasing every `interval` and a plain one beside it (another
    /// instance, or an operator's process), on this store.
    fn pair(&self, ctx: &Ctx, interval: Duration) -> (Limiter, Limiter) {
        (self.leasing(ctx, interval), self.plain(ctx))
    }
}

/// Both stores: `redis`, then a new memory store.
fn backends(redis: &RedisServer) -> [Backend<'_>; 2] {
    [Backend::Redis(redis), Backend::Memory(MemoryStore::new())]
}
