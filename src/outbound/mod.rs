//! Wait mode for outbound calls: [`OutboundLayer`] makes a client [`Service`] (an HTTP client)
//! wait for a quota the whole fleet shares, instead of failing, and stops the whole fleet when
//! the upstream says it is overloaded.
//!
//! A fleet of workers calling a third-party API must stay under the API's limit together. Wrap
//! the client in an `OutboundLayer`: each request waits until the [`Limiter`](crate::Limiter)
//! admits it ([`Limiter::acquire`](crate::Limiter::acquire): sleep the `retry_after`, plus a
//! small jitter, and try again), at most `max_wait`; past that it fails with
//! [`OutboundError::Acquire`] and consumes nothing.
//!
//! - **Fixed key** ([`OutboundLayer::builder`]): the wait happens in `poll_ready`, so it is real
//!   tower backpressure: `tower::buffer::Buffer`, `Balance` or a `ServiceBuilder` stack in
//!   front see a service that is not ready until the quota admits the next request.
//! - **Per-request key** ([`OutboundLayer::builder_with_extractor`], any
//!   [`KeyExtractor`](crate::key::KeyExtractor)): `poll_ready` is always ready; the response
//!   future waits for its key's quota first, then for a clone of the inner service to be ready,
//!   so a key waiting for quota holds no connection or concurrency slot of the inner service.
//!
//! When the store fails, the limiter's [failure policy](crate::failure_policy) decides: `FailOpen`
//! sends the request unchecked, `FailClosed` makes it wait the policy's `retry_after` like a
//! denial, `LocalFallback` waits for the in-process share of the quota.
//!
//! # Auto-suspend
//!
//! When the upstream answers **429** or **503** with a `Retry-After` (delay-seconds or an
//! HTTP-date), the layer suspends the key with
//! [`Limiter::extend_suspension`](crate::Limiter::extend_suspension) for that long: every
//! worker of the fleet sharing the key stops, not just the one that got the answer, and resumes
//! when the upstream said it could. It only ever extends a suspension (the end becomes the
//! later of the one in force and now + `Retry-After`), so a late `Retry-After: 1` never cuts an
//! operator's hour, and it lasts at most
//! [`max_auto_suspension`](OutboundLayerBuilder::max_auto_suspension)
//! ([`DEFAULT_MAX_AUTO_SUSPENSION`], 5 minutes), so one CDN error page with
//! `Retry-After: 99999999999` cannot stop the fleet for 30 days. The answer itself is returned
//! unchanged. It is logged at warn level (status, duration and scope; never the key). Turn it
//! off with [`auto_suspend(false)`](OutboundLayerBuilder::auto_suspend).
//!
//! ## After the response
//!
//! The pacing writes (this suspension, and pacing's below) run after the response, in a task
//! of their own, spawned before the answer is handed back: the caller gets the upstream's
//! answer without waiting for the store, and dropping the response future loses no write.
//! What the next calls are guaranteed:
//! - **this instance**: an acquisition for the key through this layer (any clone or service
//!   built from it) that starts after the answer was handed back waits for the write in flight,
//!   so it decides under the suspension. It waits at most the store's call timeout
//!   ([`Store::call_timeout`](crate::store::Store::call_timeout); 1 s for a store that does not
//!   say): a write the store has not answered by then holds it back no longer, and it may decide
//!   before the write lands.
//! - **other instances**: obey from their first call after the write has landed.
//!   [`OutboundLayer::settled`] waits for every write in flight (a graceful shutdown, a test
//!   reading the store).
//! - a write that fails is logged (warn) and paces nothing.
//!
//! Controls made through the layer's [`Limiter`](crate::Limiter) (or any clone of it) after the
//! answer was handed back win over the writes that answer started: a `suspend` or `resume`
//! over its pacing write, a `set_quota` or `clear_quota` over its learning round's write. A
//! write being sent is waited for (at most the store's call timeout), so the control lands
//! after it; a write not sent yet is never sent. The write never waits for a caller. A control
//! made on another instance is not ordered with this instance's writes in flight: a `resume`
//! there that lands first is undone by the pacing write (for what the upstream asked, at most
//! `max_auto_suspension`); one made once [`OutboundLayer::settled`] returned holds.
//!
//! # Provider announcements
//!
//! Many providers say in every response what their limit is and what is left. The layer reads
//! the IETF fields (`RateLimit-Policy: "p";q=100;w=60` and `RateLimit: "p";r=0;t=5`,
//! draft-ietf-httpapi-ratelimit-headers-11, and the later Token names with `a`/`w`) or, when a
//! response has neither, `X-RateLimit-Limit` / `-Remaining` / `-Reset` (the reset in delta
//! seconds, or Unix epoch seconds as GitHub sends it: a value of 10^9 or more is a date). Parsing
//! follows the Structured Field rules with bounded work: a huge, repeated or malformed field is
//! ignored, never a panic.
//!
//! - **Pacing** (with auto-suspend): a response saying nothing is left (`r=0`,
//!   `X-RateLimit-Remaining: 0`) with a reset suspends the key fleet-wide until the reset, before
//!   any request draws a `429`. Such a suspension only ever extends one in force, and lasts at
//!   most [`max_auto_suspension`](OutboundLayerBuilder::max_auto_suspension) (5 minutes by
//!   default): a provider that says "come back in a year" pauses the fleet that long, then the
//!   fleet asks again. A `Retry-After` on the same response takes precedence.
//! - **Learning** ([`learn_quota(ceiling)`](OutboundLayerBuilder::learn_quota), opt-in): the
//!   layer sets the announced quota as the key's fleet-wide override
//!   ([`Limiter::set_quota`](crate::Limiter::set_quota)), so every worker obeys it on its next
//!   call. The headers are untrusted input, so what learning may set is bounded:
//!   - **window**: an announced quota over a window longer than
//!     [`max_learned_window`](OutboundLayerBuilder::max_learned_window)
//!     ([`DEFAULT_MAX_LEARNED_WINDOW`], 5 minutes, never more than `max_auto_suspension`) is
//!     not learned, so a learned quota stops a key for at most that long before the next
//!     request goes out and its answer is read again. A policy without a window
//!     (`X-RateLimit-Limit`, or no `w`) counts per the ceiling's period.
//!   - **rate and burst**: at most the ceiling's rate, with the ceiling's burst-to-limit ratio,
//!     and the override always holds the ceiling and every configured tier as caps (per
//!     period, the tightest limit and burst), so in any of the ceiling's windows a learned
//!     quota admits no more than the ceiling itself would, and no configured tier is lost.
//!   - **expiry**: a learned quota lasts [`learned_ttl`](OutboundLayerBuilder::learned_ttl)
//!     ([`DEFAULT_LEARNED_TTL`], 10 minutes; at most 30 days) from the last answer that
//!     confirmed it; the first round after that without a confirming answer clears it, and the
//!     key is back to its own tiers. An announcement equal to the layer's own tiers clears it
//!     at once. The time left is read back bounded, whoever wrote it: an end that is no time,
//!     or more than 30 days ahead, reads as over, and so does, for this layer, a time left
//!     longer than its own `learned_ttl`; a corrupt or far record never freezes the quota.
//!   - **writes**: each instance runs at most one learning round per key per
//!     [`learn_period`](OutboundLayerBuilder::learn_period) ([`DEFAULT_LEARN_PERIOD`], 30 s):
//!     one read, and a write only on a change or to renew a confirmed quota; a round that
//!     finds the learned quota set less than a period ago (by any instance) changes nothing.
//!     A change is logged (info) by the round that made it, so at most once per key per period
//!     per instance. This process remembers at most 4 096 keys (the longest idle is forgotten
//!     first, and read again at its next response).
//!   - **operator first**: an override learning did not set (an operator's, or one of every
//!     route) is never changed, tightened or loosened.
//!
//!   Learning runs in a task of its own, as the pacing writes do (see
//!   [above](self#after-the-response)): this instance's next acquisition for the key waits for
//!   the round in flight (at most the store's call timeout), so it decides under what the round
//!   set; other instances obey from their first call after the write. A learned override is
//!   told apart from an operator's in the store: each learning write is one atomic call that
//!   sets the override and its learning record (the key's storage key and `#l`, which no
//!   route has, whose override is what learning set and whose suspension the time it has
//!   left), and refuses to replace an override the record does not hold, or to set one under
//!   an operator's override of every route (it clears the learned one then);
//!   [`Limiter::set_quota`](crate::Limiter::set_quota) and
//!   [`clear_quota`](crate::Limiter::clear_quota) on the key remove the record's override in
//!   their own call. [`Limiter::inspect`](crate::Limiter::inspect) says which it is
//!   ([`KeyStatus::override_source`](crate::limiter::KeyStatus::override_source)).
//!
//! [`OutboundLayer::stats`] counts announcements, learned quotas and pauses; with the `metrics`
//! feature two counters count learned quotas and pauses too (the guide's
//! [metrics table](crate::guide::using#metrics-and-logs)).
//!
//! # Example
//!
//! A client limited to 10 calls a second across the fleet, one at a time; with a Redis store
//! (see the [guide](crate::guide::outbound)) every worker shares the limit.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::{Duration, Instant};
//! use http::{Request, Response, StatusCode};
//! use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::new(MemoryStore::new());
//! let quota = Quota::per_second(10)?.with_burst(1)?;
//! let layer = OutboundLayer::builder(limiter, quota, "maps-api")
//!     .max_wait(Duration::from_secs(5))
//!     .build()?;
//! // Stands in for an HTTP client (hyper-util's, reqwest's tower service, ...).
//! let mut client = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
//!
//! let started = Instant::now();
//! for _ in 0..3 {
//!     // `ready()` waits for the quota; `call` goes straight out.
//!     let response = client.ready().await?.call(Request::new(String::new())).await?;
//!     assert_eq!(response.status(), StatusCode::OK);
//! }
//! // One call every 100 ms: the third went out 200 ms after the first.
//! assert!(started.elapsed() >= Duration::from_millis(200));
//! # Ok(())
//! # }
//! ```
//!
//! A fleet on Redis, with two tiers (the [guide](crate::guide::outbound)'s example):
//!
//! ```no_run
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use redlimit::{outbound::OutboundLayer, store::RedisStore, Limiter, Quota, Quotas};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let limiter = Limiter::new(RedisStore::new("redis://127.0.0.1:6379")?);
//!     // The partner allows 10 calls a second and 500 a minute, for the whole fleet.
//!     let quotas = Quotas::new([Quota::per_second(10)?, Quota::per_minute(500)?])?;
//!     let layer = OutboundLayer::builder(limiter, quotas, "partner-api")
//!         .max_wait(Duration::from_secs(5))
//!         .build()?;
//!     // Stands in for an HTTP client (hyper-util's `Client`, or any tower HTTP service).
//!     let http_client = tower::service_fn(|_: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::new()))
//!     });
//!     let mut client = ServiceBuilder::new().layer(layer).service(http_client);
//!
//!     for _ in 0..100 {
//!         // `ready()` waits for the fleet's quota; `call` goes straight out.
//!         let response = client.ready().await?.call(Request::new(String::new())).await?;
//!         println!("{}", response.status());
//!     }
//!     Ok(())
//! }
//! ```
//!
//! | file | holds |
//! |---|---|
//! | `layer.rs` | [`OutboundLayer`], [`OutboundLayerBuilder`] |
//! | `service.rs` | [`Outbound`], the service (the `poll_ready` acquisition) |
//! | `future.rs` | [`ResponseFuture`] (the per-request acquisition, auto-suspend) |
//! | `error.rs` | [`OutboundError`] |
//! | `retry_after.rs` | `Retry-After` and HTTP-date parsing |
//! | `announce.rs` | `RateLimit-Policy`, `RateLimit`, `X-RateLimit-*` parsing (bounded) |
//! | `learn.rs` | learning the quota and pacing from an announcement; [`OutboundStats`] |
//!
//! [`Service`]: tower_service::Service

mod announce;
mod config;
mod error;
mod future;
mod layer;
mod learn;
mod react;
mod retry_after;
mod service;

pub use self::error::OutboundError;
pub use self::future::ResponseFuture;
pub use self::layer::{
    OutboundLayer, OutboundLayerBuilder, DEFAULT_MAX_AUTO_SUSPENSION, DEFAULT_MAX_WAIT,
};
pub use self::learn::{
    OutboundStats, DEFAULT_LEARNED_TTL, DEFAULT_LEARN_PERIOD, DEFAULT_MAX_LEARNED_WINDOW,
};
pub use self::service::Outbound;
