//! Rate-limiting outbound calls, without tower: every instance of a fleet shares a third-party
//! API's limit of 5 calls a second through one global key in Redis.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example outbound
//! ```
//!
//! Each call waits until the limiter admits it, sleeping for the `retry_after` the decision
//! gives. While Redis is unreachable, `LocalFallback` keeps limiting in process.

use std::time::{Duration, Instant};

use redlimit::policy::{LocalFallback, Verdict};
use redlimit::store::RedisStore;
use redlimit::{Limiter, Quota};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let limiter = Limiter::builder(RedisStore::new(url.as_str())?)
        // If Redis goes away, this process alone keeps the whole quota (one instance).
        .failure_policy(LocalFallback::new(1))
        .build()?;
    let quota = Quota::per_second(5)?;
    let start = Instant::now();

    for call in 1..=12 {
        wait_for_turn(&limiter, &quota).await;
        // The third-party call would go here.
        println!("{:>6.3}s  call {call}", start.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Waits until the limiter admits one call to the shared key.
async fn wait_for_turn(limiter: &Limiter, quota: &Quota) {
    loop {
        let wait = match limiter.check("third-party-api", quota).await {
            verdict if verdict.is_allowed() => return,
            Verdict::Decided(decision) => decision.retry_after.min(quota.period()),
            Verdict::FailedClosed { retry_after } => retry_after,
            Verdict::FailedOpen => return,
        };
        tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
    }
}
