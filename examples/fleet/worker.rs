//! A worker process: calls the upstream through an `OutboundLayer` on the fleet's shared
//! limiter, as fast as it admits.
//!
//! # Why the upstream is never tripped
//!
//! The upstream counts in fixed windows of `period` aligned to the Unix epoch (window `k` is
//! `[k × period, (k + 1) × period)` of its system clock), as many real APIs do. A token bucket (or
//! GCRA) with a burst of `limit` would not do: it admits `limit` at the end of one window and,
//! refilled, `limit` more at the start of the next, up to `2 × limit` in one upstream window
//! whenever the boundaries do not line up. GCRA with a burst of 1 admits at most `limit` in any
//! `period` at the admission times, but spaces requests evenly, so every upstream boundary has
//! requests right next to it, and a millisecond of network jitter moves one across.
//!
//! So the workers use the **fixed-window** algorithm on the **same windows**: the same epoch
//! alignment, on Redis's clock (the default, [`Clock::Server`](redlimit::clock::Clock::Server)): one
//! clock for every worker, so no skew between them, and the upstream's clock too when Redis runs
//! on this machine, as the mock upstream does (a Redis elsewhere may be a little off: leave the
//! margin below). The limiter admits at most `limit` per window, and a saturated fleet spends
//! each window's quota in its first few
//! tens of milliseconds: a denial's `retry_after` is the time to the window's end, so waiters
//! wake just after a boundary (plus `acquire`'s jitter, at most 5 % of the wait). Requests are
//! then almost a whole window away from the next boundary. A fleet that
//! does not saturate the quota could be admitted just before a boundary and arrive just after
//! it: a worker never starts a call in the last [`guard`] of a window (5 % of the period, at most
//! 50 ms), so a request would have to take longer than that between admission and arrival to be
//! counted in the wrong window. Against a real API, whose clock is not yours, leave a margin
//! (a limit a little under the provider's).
//!
//! The workers start together at a window boundary (when the run covers whole windows, i.e.
//! `period` ≤ `seconds`), so `T` is `limit × seconds / period` when the fleet keeps up.
//! A store error never admits: the limiter fails closed, so a Redis outage pauses the fleet
//! rather than flooding the upstream.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::store::RedisStore;
use redlimit::{failure_policy::FailClosed, Algorithm, Limiter, Quota};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::client::UpstreamClient;
use crate::clock::{micros, unix_micros, until_unix};
use crate::common::cli;
use crate::WORKER_MODE;

/// A worker process: `ID UPSTREAM REDIS_URL KEY LIMIT PERIOD_US START_US STOP_US LEARN`.
pub async fn worker(args: &[String]) -> Result<(), String> {
    let [id, upstream, url, key, limit, period, start, stop, learn] = args else {
        return Err(format!("{WORKER_MODE}: expected 9 arguments, got {args:?}"));
    };
    let number = |s: &str| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let (limit, period, start, stop) = (
        number(limit)?,
        Duration::from_micros(number(period)?),
        number(start)?,
        number(stop)?,
    );
    let quota = Quota::new(limit, period).map_err(|e| e.to_string())?;
    let store = RedisStore::new(url.as_str()).map_err(|e| e.to_string())?;
    store
        .verify()
        .await
        .map_err(|e| format!("worker {id}: Redis at {}: {e}", cli::redacted(url)))?;
    // The upstream's windows, on Redis's clock: one clock for the whole fleet (see the module
    // docs); and never an admission the store did not make.
    let limiter = Limiter::builder(store)
        .algorithm(Algorithm::FixedWindow)
        .failure_policy(FailClosed::default())
        .build()
        .map_err(|e| e.to_string())?;
    // One fixed key for the whole fleet: the layer waits in `poll_ready` (backpressure), and an
    // upstream 429 or 503 with `Retry-After` would suspend the key for every worker.
    let inspector = limiter.clone();
    let layer = OutboundLayer::builder(limiter, quota, key.as_str())
        // Waits are cut at `stop` below; one that would end after the run (a long suspension)
        // fails at once, and the worker is done.
        .max_wait(until_unix(stop) + period);
    // `--learn`: the upstream's announced quota becomes the fleet's, never faster than ours.
    let layer = if learn == "1" {
        layer.learn_quota(quota)
    } else {
        layer
    };
    let layer = layer.build().map_err(|e| e.to_string())?;
    let stats = layer.clone();
    let mut learned = 0;
    let upstream: SocketAddr = upstream.parse().map_err(|e| format!("{upstream}: {e}"))?;
    let connection = UpstreamClient::connect(upstream)
        .await
        .map_err(|e| format!("worker {id}: cannot connect to the upstream: {e}"))?;
    let mut client = ServiceBuilder::new().layer(layer).service(connection);

    tokio::time::sleep(until_unix(start)).await;
    let stop_at = Instant::now() + until_unix(stop);
    let (mut sent, mut refused) = (0u64, 0u64);
    loop {
        let now = unix_micros();
        if now >= stop {
            break;
        }
        let left_in_window = micros(period) - now % micros(period);
        if left_in_window < micros(guard(period)) {
            tokio::time::sleep(Duration::from_micros(left_in_window)).await;
            continue;
        }
        // `ready()` waits until the fleet's quota admits this worker's next call; at `stop` the
        // worker gives up waiting rather than call after the run.
        let Ok(ready) = tokio::time::timeout_at(stop_at, client.ready()).await else {
            break;
        };
        let ready = ready.map_err(|e| format!("worker {id}: {e}"))?;
        let request = Request::get("/")
            .header("host", upstream.to_string())
            .body(Empty::new())
            .expect("a valid request");
        let response = match ready.call(request).await {
            Ok(response) => response,
            // The next admission comes after the run: nothing was sent.
            Err(OutboundError::Acquire(_)) => break,
            Err(error) => return Err(format!("worker {id}: upstream: {error}")),
        };
        let status = response.status();
        // Read the body to the end: the connection is kept alive for the next request.
        let _ = response.into_body().collect().await;
        sent += 1;
        if status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
        // This worker set a learned quota: tell the parent (its `watch_learning`).
        if stats.stats().learned > learned {
            learned = stats.stats().learned;
            // What is in force now, as the store holds it.
            if let Ok(status) = inspector.inspect(key.as_str()).await {
                if let Some(quotas) = status.quota_override {
                    let quota = quotas[0];
                    println!("learned {} {}", quota.limit(), micros(quota.period()));
                }
            }
        }
    }
    // One write for the whole line: the workers share the parent's stderr, and `eprintln!` may
    // write a line in pieces that another worker's line would split.
    let line = format!("worker {id}: {sent} requests, {refused} answered 429\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    Ok(())
}

/// A call never starts this close to a window's end: a request admitted in one window must reach
/// the upstream before the next begins (see the module docs).
fn guard(period: Duration) -> Duration {
    (period / 20).min(Duration::from_millis(50))
}
