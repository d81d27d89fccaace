//! Rate-limiting outbound calls, without tower: every instance of a fleet shares a third-party
//! API's limit of 5 calls a second through one global key in Redis.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example outbound
//! ```
//!
//! Each call waits its turn with `Limiter::acquire` (wait mode): it sleeps the `retry_after` each
//! denial gives, plus a small random jitter so waiters across the fleet do not wake in lockstep,
//! and gives up with a typed error at its deadline. While Redis is unreachable, `LocalFallback`
//! keeps limiting in process. For a tower client, `redlimit::outbound::OutboundLayer` does the
//! same in `poll_ready`, and suspends the whole fleet when the API answers 429 + `Retry-After`
//! (see `examples/fleet.rs`).

use std::time::{Duration, Instant};

use redlimit::failure_policy::LocalFallback;
use redlimit::store::RedisStore;
use redlimit::{limiter::AcquireError, Limiter, Quota, Quotas};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let limiter = Limiter::builder(RedisStore::new(url.as_str())?)
        // If Redis goes away, this process alone keeps the whole quota (one instance).
        .failure_policy(LocalFallback::new(1))
        .build()?;
    // 5 a second, and at most 100 a minute: both in one atomic check.
    let quotas = Quotas::new([Quota::per_second(5)?, Quota::per_minute(100)?])?;
    let start = Instant::now();

    for call in 1..=12 {
        let deadline = Instant::now() + Duration::from_secs(5);
        match limiter.acquire("third-party-api", &quotas, deadline).await {
            // The third-party call would go here.
            Ok(_) => println!("{:>6.3}s  call {call}", start.elapsed().as_secs_f64()),
            Err(AcquireError::DeadlineExceeded { retry_after, .. }) => {
                println!("call {call}: no turn within 5 s (next in {retry_after:?}); skipped")
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}
