//! Token leases for hot keys (`LimiterBuilder::leases`), on real Redis and on the memory store:
//! what a leasing instance admits, reports and gives back, when requests are dropped, when the
//! store fails, under controls, and how a lease-answered request's settlement is dated.

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

use std::time::{Duration, Instant};

use redlimit::clock::Clock;
use redlimit::limiter::{LeaseStats, Leases};
use redlimit::store::Store;
use redlimit::{Algorithm, Limiter};

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
    Limiter::builder(store)
        .algorithm(algorithm)
        .clock(clock)
        .leases(Leases::new(INTERVAL))
        .build()
        .unwrap()
}
