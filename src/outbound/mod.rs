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
//!   [`KeyExtractor`](crate::key::KeyExtractor)): `poll_ready` is the inner service's; the wait
//!   happens in the response future.
//!
//! When the store fails, the limiter's [failure policy](crate::policy) decides: `FailOpen`
//! sends the request unchecked, `FailClosed` makes it wait the policy's `retry_after` like a
//! denial, `LocalFallback` waits for the in-process share of the quota.
//!
//! # Auto-suspend
//!
//! When the upstream answers **429** or **503** with a `Retry-After` (delay-seconds or an
//! HTTP-date), the layer suspends the key with
//! [`Limiter::suspend`](crate::Limiter::suspend) for that long (at most
//! [`MAX_SUSPENSION`](crate::MAX_SUSPENSION)) before handing the answer back: every worker of
//! the fleet sharing the key stops, not just the one that got the answer, and resumes when the
//! upstream said it could. The answer itself is returned unchanged. It is logged at warn level
//! (status, duration and scope; never the key). Turn it off with
//! [`auto_suspend(false)`](OutboundLayerBuilder::auto_suspend).
//!
//! # Example
//!
//! A client limited to 10 calls a second across the fleet, one at a time; with a Redis store
//! (see the README) every worker shares the limit.
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
//! A fleet on Redis, with two tiers (the README's example):
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
//!
//! [`Service`]: tower_service::Service

mod config;
mod error;
mod future;
mod layer;
mod retry_after;
mod service;

pub use self::error::OutboundError;
pub use self::future::ResponseFuture;
pub use self::layer::{
    OutboundLayer, OutboundLayerBuilder, DEFAULT_MAX_AUTO_SUSPENSION, DEFAULT_MAX_WAIT,
};
pub use self::service::Outbound;
